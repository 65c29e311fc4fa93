// SPDX-License-Identifier: Apache-2.0
//! KV views: where a caller's KV lives (`kdn_kv_view`), over memory the view
//! borrows: [`KvView`] for reading (store, put), [`KvViewMut`] for writing
//! (retrieve, fetch). Every layout the ABI has is here: canonical, strided
//! (llama.cpp, transposed V), per-layer allocations, and paged NHD/HND with
//! block tables (vLLM). The binding fills every bound the library checks
//! (`size_bytes`, `layer_elements`, `num_blocks`) from the slices it is
//! given, so no view can reach outside them.
//!
//! Views in device memory (GPU memory of the runtime's device, since 1.5)
//! are made from raw pointers by the `unsafe` constructors
//! [`KvView::from_device`] and [`KvViewMut::from_device`] (and their
//! `_per_layer` forms), with an optional [`CudaStream`] (since 1.8): Rust
//! cannot see GPU memory, so the caller vouches for it.
//!
//! A model with recurrent layers ([`ModelSpec::num_state_layers`](crate::ModelSpec::num_state_layers),
//! since 1.12) has a state per recurrent layer besides its KV: a view
//! carries it with [`KvView::with_state`] (a store) or
//! [`KvViewMut::with_state`] (a retrieve), borrowing the state's memory as
//! the view borrows the KV's (`kdn_kv_view.state_layers`).

use crate::error::{Error, Result};
use crate::model::Model;
use crate::types::{init, DType, Element, Layout, MemoryKind};
use kdn_sys as sys;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::{self, NonNull};

/// A view's shape without its memory: dtype, layout, strides, layers, block
/// table. All counts are in elements of the dtype, as in `kdn.h`.
///
/// ```
/// use kdn::{DType, Layout, ViewSpec};
/// // llama.cpp-like: layer l's K at l * 48 * 32 elements, V one whole K file further.
/// let spec = ViewSpec::canonical(DType::F32).with_strides(48 * 32, 5 * 48 * 32, 32, 8, 1);
/// assert_eq!(spec.stride_kv, 5 * 48 * 32);
/// // vLLM-like: blocks of 16 tokens, per-layer allocations.
/// let paged = ViewSpec::paged(DType::BF16, Layout::PagedNhd, 16, vec![3, 0, 7]);
/// assert_eq!(paged.block_table.len(), 3);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ViewSpec {
    /// Must be the model's.
    pub dtype: DType,
    /// Contiguous or paged.
    pub layout: Layout,
    /// View layer j is model layer `layers[j]`; `None`: every model layer in order.
    pub layers: Option<Vec<u32>>,
    /// One allocation: elements between layers.
    pub stride_layer: i64,
    /// One allocation: elements from a layer's K to its V.
    pub stride_kv: i64,
    /// Elements between tokens.
    pub stride_token: i64,
    /// Elements between heads.
    pub stride_head: i64,
    /// Elements between dims.
    pub stride_dim: i64,
    /// V's strides where not all 0 (llama.cpp's transposed V).
    pub v_stride_token: i64,
    /// See `v_stride_token`.
    pub v_stride_head: i64,
    /// See `v_stride_token`.
    pub v_stride_dim: i64,
    /// Room in tokens; 0: exactly the request's (a knowledge fetch needs it set).
    pub num_tokens: u64,
    /// Paged: tokens per block.
    pub block_size: u32,
    /// Paged: token t is in block `block_table[t / block_size]`.
    pub block_table: Vec<i32>,
    /// Paged: elements between blocks; 0: dense.
    pub block_stride: i64,
    /// Per-layer allocations inside one buffer: byte offsets of each view
    /// layer's K and V, each allocation `layer_bytes` long. Required for a
    /// paged view over one buffer ([`KvView::new`], async ops).
    pub layer_offsets: Option<LayerOffsets>,
}

/// Where each layer's K and V start inside one buffer (bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerOffsets {
    /// K of view layer j at `k[j]`.
    pub k: Vec<usize>,
    /// V of view layer j at `v[j]`.
    pub v: Vec<usize>,
    /// Bytes of each layer allocation.
    pub layer_bytes: usize,
}

impl ViewSpec {
    /// The canonical layout `[layer][k|v][token][kv_head][head_dim]`: one
    /// buffer, all strides 0.
    pub fn canonical(dtype: DType) -> Self {
        ViewSpec {
            dtype,
            layout: Layout::Contiguous,
            layers: None,
            stride_layer: 0,
            stride_kv: 0,
            stride_token: 0,
            stride_head: 0,
            stride_dim: 0,
            v_stride_token: 0,
            v_stride_head: 0,
            v_stride_dim: 0,
            num_tokens: 0,
            block_size: 0,
            block_table: Vec::new(),
            block_stride: 0,
            layer_offsets: None,
        }
    }

    /// A paged layout (`Layout::PagedNhd` or `PagedHnd`), over per-layer
    /// allocations ([`KvView::per_layer`], or [`with_layer_offsets`](Self::with_layer_offsets)).
    pub fn paged(dtype: DType, layout: Layout, block_size: u32, block_table: Vec<i32>) -> Self {
        ViewSpec { layout, block_size, block_table, ..Self::canonical(dtype) }
    }

    /// With the five strides of one allocation, in elements: between layers,
    /// from K to V, between tokens, heads and dims.
    pub fn with_strides(mut self, layer: i64, kv: i64, token: i64, head: i64, dim: i64) -> Self {
        (self.stride_layer, self.stride_kv, self.stride_token, self.stride_head, self.stride_dim) =
            (layer, kv, token, head, dim);
        self
    }
    /// With the strides inside a layer (per-layer allocations).
    pub fn with_token_strides(mut self, token: i64, head: i64, dim: i64) -> Self {
        (self.stride_token, self.stride_head, self.stride_dim) = (token, head, dim);
        self
    }
    /// With V's own strides inside a layer.
    pub fn with_v_strides(mut self, token: i64, head: i64, dim: i64) -> Self {
        (self.v_stride_token, self.v_stride_head, self.v_stride_dim) = (token, head, dim);
        self
    }
    /// Holding only these model layers (several views then make up the model).
    pub fn with_layers(mut self, layers: Vec<u32>) -> Self {
        self.layers = Some(layers);
        self
    }
    /// With room for `n` tokens.
    pub fn with_num_tokens(mut self, n: u64) -> Self {
        self.num_tokens = n;
        self
    }
    /// Paged: elements between blocks.
    pub fn with_block_stride(mut self, elements: i64) -> Self {
        self.block_stride = elements;
        self
    }
    /// Per-layer allocations inside one buffer.
    pub fn with_layer_offsets(mut self, k: Vec<usize>, v: Vec<usize>, layer_bytes: usize) -> Self {
        self.layer_offsets = Some(LayerOffsets { k, v, layer_bytes });
        self
    }

    fn paged_layout(&self) -> bool {
        self.layout != Layout::Contiguous
    }
}

/// A built `kdn_kv_view` and the arrays it points into.
pub(crate) struct Parts {
    raw: sys::kdn_kv_view,
    layers: Vec<u32>,
    k: Vec<*mut c_void>,
    v: Vec<*mut c_void>,
    table: Vec<i32>,
    /// Paged: bytes of the smallest layer allocation, for num_blocks.
    paged_layer_bytes: usize,
    /// The recurrent layers' state (`state_layers`), when the view carries it.
    state: Option<StateParts>,
}

/// One pointer per recurrent layer and the bytes each reaches.
struct StateParts {
    ptrs: Vec<*mut c_void>,
    bytes: Vec<usize>,
}

/// Elements of `bytes` bytes, never more than there are (an unknown dtype
/// counts as 4 bytes, the largest).
fn elements(bytes: usize, dtype: DType) -> u64 {
    (bytes / dtype.size().unwrap_or(4)) as u64
}

impl Parts {
    /// From one buffer (`base`, `len` bytes).
    fn slab(spec: &ViewSpec, base: *mut u8, len: usize) -> Result<Parts> {
        match &spec.layer_offsets {
            None => {
                if spec.paged_layout() {
                    return Err(Error::invalid(
                        "a paged view needs per-layer allocations: KvView::per_layer or ViewSpec::with_layer_offsets",
                    ));
                }
                let mut p = Parts::empty(spec);
                p.raw.data = base as *mut c_void;
                p.raw.size_bytes = len as u64;
                p.finish(spec);
                Ok(p)
            }
            Some(o) => {
                if o.k.len() != o.v.len() {
                    return Err(Error::invalid("layer_offsets: k and v differ in length"));
                }
                let at = |off: usize| -> Result<*mut u8> {
                    match off.checked_add(o.layer_bytes) {
                        Some(end) if end <= len => Ok(base.wrapping_add(off)),
                        _ => Err(Error::invalid(format!(
                            "layer_offsets: {off} + {} is beyond the buffer's {len} bytes",
                            o.layer_bytes
                        ))),
                    }
                };
                let k = o.k.iter().map(|&off| at(off)).collect::<Result<Vec<_>>>()?;
                let v = o.v.iter().map(|&off| at(off)).collect::<Result<Vec<_>>>()?;
                Parts::layered(spec, k, v, o.layer_bytes)
            }
        }
    }

    /// From per-layer allocations; `min_bytes`: the smallest one.
    fn layered(spec: &ViewSpec, k: Vec<*mut u8>, v: Vec<*mut u8>, min_bytes: usize) -> Result<Parts> {
        if k.is_empty() || k.len() != v.len() {
            return Err(Error::invalid(format!("per-layer view: {} K and {} V layers", k.len(), v.len())));
        }
        if let Some(layers) = &spec.layers {
            if layers.len() != k.len() {
                return Err(Error::invalid(format!("{} layers named, {} allocations given", layers.len(), k.len())));
            }
        }
        let mut p = Parts::empty(spec);
        p.k = k.into_iter().map(|x| x as *mut c_void).collect();
        p.v = v.into_iter().map(|x| x as *mut c_void).collect();
        // The library reads one pointer per view layer: with `layers` None
        // that is the model's count, so say how many there are.
        p.raw.num_layers = p.k.len();
        if spec.paged_layout() {
            p.paged_layer_bytes = min_bytes;
        } else {
            let elems = elements(min_bytes, spec.dtype);
            if elems == 0 {
                return Err(Error::invalid("a layer allocation is smaller than one element"));
            }
            p.raw.layer_elements = elems;
        }
        p.finish(spec);
        Ok(p)
    }

    fn empty(spec: &ViewSpec) -> Parts {
        let mut raw: sys::kdn_kv_view = init(sys::kdn_kv_view_init);
        raw.dtype = spec.dtype.raw();
        raw.layout = spec.layout.raw();
        raw.stride_layer = spec.stride_layer;
        raw.stride_kv = spec.stride_kv;
        raw.stride_token = spec.stride_token;
        raw.stride_head = spec.stride_head;
        raw.stride_dim = spec.stride_dim;
        raw.v_stride_token = spec.v_stride_token;
        raw.v_stride_head = spec.v_stride_head;
        raw.v_stride_dim = spec.v_stride_dim;
        raw.num_tokens = spec.num_tokens;
        raw.block_size = spec.block_size;
        raw.block_stride = spec.block_stride;
        Parts {
            raw,
            layers: spec.layers.clone().unwrap_or_default(),
            k: Vec::new(),
            v: Vec::new(),
            table: spec.block_table.clone(),
            paged_layer_bytes: 0,
            state: None,
        }
    }

    /// Carries the recurrent layers' state: `bytes` bytes at each pointer.
    pub(crate) fn set_state(&mut self, state: impl IntoIterator<Item = (*mut u8, usize)>) {
        let (ptrs, bytes) = state.into_iter().map(|(p, n)| (p as *mut c_void, n)).unzip();
        self.state = Some(StateParts { ptrs, bytes });
    }

    /// Points the struct at the arrays (their heap buffers do not move with `self`).
    fn finish(&mut self, spec: &ViewSpec) {
        if spec.layers.is_some() {
            self.raw.layers = self.layers.as_ptr();
            self.raw.num_layers = self.layers.len();
        }
        if !self.k.is_empty() {
            self.raw.k_layers = self.k.as_ptr();
            self.raw.v_layers = self.v.as_ptr();
        }
        if spec.paged_layout() {
            self.raw.block_table = if self.table.is_empty() { ptr::null() } else { self.table.as_ptr() };
            self.raw.block_table_len = self.table.len();
        }
    }

    /// Marks the view as device memory, ordered after `stream` (if any).
    fn on_device(mut self, stream: Option<CudaStream>) -> Parts {
        self.raw.memory = sys::kdn_memory_kind_KDN_MEMORY_DEVICE;
        self.raw.cuda_stream = stream.map_or(ptr::null_mut(), CudaStream::as_raw);
        self
    }

    /// [`resolve`](Self::resolve) for calls that write a length the caller
    /// may not know yet (a knowledge fetch, a blend), which need the view's
    /// room stated: a canonical view of one allocation with `num_tokens` 0
    /// has room for as many whole tokens as its memory holds (and is laid
    /// out for that many); other views state it themselves.
    pub(crate) fn resolve_room(&self, model: &Model) -> Result<sys::kdn_kv_view> {
        let kv_bytes_per_token = model.kv_bytes_per_token();
        let mut raw = self.resolve(model)?;
        let canonical = raw.k_layers.is_null()
            && [raw.stride_layer, raw.stride_kv, raw.stride_token, raw.stride_head, raw.stride_dim]
                .iter()
                .all(|&s| s == 0);
        if raw.num_tokens == 0 && canonical && kv_bytes_per_token > 0 {
            raw.num_tokens = raw.size_bytes / kv_bytes_per_token;
            if raw.num_tokens == 0 {
                return Err(Error::new(crate::Status::BufferTooSmall, "the view has room for no token"));
            }
        }
        Ok(raw)
    }

    /// The struct for a call on `model`: a paged view's num_blocks is its
    /// smallest layer allocation in blocks (of the model's kv_heads x
    /// head_dim elements per token and layer), so the library checks every
    /// table entry; a recurrent state, when the view carries one, must have
    /// one allocation of at least `state_bytes` per recurrent layer of the
    /// model (the library reads that many pointers and bytes, unchecked).
    pub(crate) fn resolve(&self, model: &Model) -> Result<sys::kdn_kv_view> {
        let row = model.row();
        let mut raw = self.raw;
        if let Some(state) = &self.state {
            let layers = model.num_state_layers() as usize;
            if state.ptrs.len() != layers {
                return Err(Error::invalid(format!(
                    "the view carries {} recurrent states; the model has {layers} recurrent layers (num_state_layers)",
                    state.ptrs.len()
                )));
            }
            let want = model.state_bytes();
            if let Some((i, &n)) = state.bytes.iter().enumerate().find(|&(_, &n)| (n as u64) < want) {
                return Err(Error::invalid(format!(
                    "recurrent state {i} is {n} bytes, shorter than the model's state_bytes ({want})"
                )));
            }
            raw.state_layers = state.ptrs.as_ptr();
        }
        if self.raw.layout != sys::kdn_kv_layout_KDN_LAYOUT_CONTIGUOUS && !self.k.is_empty() {
            let dense = u64::from(raw.block_size).saturating_mul(row);
            let block = if raw.block_stride > 0 { raw.block_stride as u64 } else { dense };
            let blocks = elements(self.paged_layer_bytes, DType::from_raw(raw.dtype)).checked_div(block).unwrap_or(0);
            if blocks == 0 {
                return Err(Error::invalid("paged view: a layer allocation is smaller than one block"));
            }
            raw.num_blocks = blocks;
        }
        Ok(raw)
    }
}

fn byte_range<T>(s: &[T]) -> (*mut u8, usize) {
    (s.as_ptr() as *mut u8, std::mem::size_of_val(s))
}

/// KV the library may read: the memory of a store or a knowledge put. It
/// borrows the memory for `'a`.
///
/// ```
/// use kdn::{DType, KvView, ViewSpec};
/// let kv = vec![0.5f32; 2 * 2 * 3 * 4]; // 2 layers, K and V, 3 tokens, 4 elements per token
/// let view = KvView::canonical(&kv, DType::F32);
/// // the same memory with explicit strides: layer, K to V, token, head, dim
/// let strided = KvView::new(&kv, &ViewSpec::canonical(DType::F32).with_strides(24, 12, 4, 4, 1))?;
/// # let _ = (view, strided);
/// # Ok::<(), kdn::Error>(())
/// ```
pub struct KvView<'a> {
    pub(crate) parts: Parts,
    _memory: PhantomData<&'a [u8]>,
}

impl<'a> KvView<'a> {
    /// `data` in the canonical layout.
    pub fn canonical<T: Element>(data: &'a [T], dtype: DType) -> KvView<'a> {
        let (base, len) = byte_range(data);
        let parts = Parts::slab(&ViewSpec::canonical(dtype), base, len).expect("a canonical view is always valid");
        KvView { parts, _memory: PhantomData }
    }

    /// `data` as `spec` describes it (one allocation, or per-layer
    /// allocations at `spec.layer_offsets`).
    pub fn new<T: Element>(data: &'a [T], spec: &ViewSpec) -> Result<KvView<'a>> {
        let (base, len) = byte_range(data);
        Ok(KvView { parts: Parts::slab(spec, base, len)?, _memory: PhantomData })
    }

    /// One allocation per layer: view layer j's K in `k[j]`, V in `v[j]`,
    /// laid out by `spec`'s token strides or its paged layout.
    pub fn per_layer<T: Element>(k: &[&'a [T]], v: &[&'a [T]], spec: &ViewSpec) -> Result<KvView<'a>> {
        let min = k.iter().chain(v).map(|s| std::mem::size_of_val(*s)).min().unwrap_or(0);
        let k = k.iter().map(|s| byte_range(s).0).collect();
        let v = v.iter().map(|s| byte_range(s).0).collect();
        Ok(KvView { parts: Parts::layered(spec, k, v, min)?, _memory: PhantomData })
    }

    /// With the recurrent layers' state after the request's last token
    /// (since 1.12; `kdn_kv_view.state_layers`): `state[i]` is recurrent
    /// layer i's, at least the model's
    /// [`state_bytes`](crate::ModelSpec::state_bytes) long (its first
    /// `state_bytes` bytes are the state, opaque to kdn), one per recurrent
    /// layer ([`num_state_layers`](crate::ModelSpec::num_state_layers)). A
    /// store keeps it as the snapshot at the request's end: a prefix counts
    /// as a hit only where a snapshot is, so an engine that stores at each
    /// chunk boundary of its prefill (the state there) makes each a
    /// possible hit. Without it a recurrent model's KV is stored but is no
    /// hit. Host memory, borrowed for `'a` like the KV; one view of a call
    /// at most carries it. Checked at the call: another count, a state
    /// shorter than `state_bytes`, or a model without recurrent layers is
    /// `InvalidArgument`.
    ///
    /// ```
    /// use kdn::{DType, KvView, KvViewMut, ModelSpec, Runtime, RuntimeOptions};
    /// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(2))?;
    /// let mut spec = ModelSpec::new(1, 1, 2, DType::F32, "hybrid");
    /// (spec.num_state_layers, spec.state_bytes) = (1, 8); // one recurrent layer, 8 bytes of state
    /// let model = rt.model(&spec)?;
    /// let tokens = [5, 6, 7, 8];
    /// let kv: Vec<f32> = (0..16).map(|i| i as f32).collect(); // 4 tokens, canonical
    /// let at_4 = [0.25f32, -1.5]; // the state after token 8
    /// model.store("ns", &tokens, &KvView::canonical(&kv, DType::F32).with_state(&[&at_4[..]]))?;
    /// assert_eq!(model.lookup("ns", &tokens)?.cached_tokens, 4);
    /// let (mut out, mut state) = (vec![0f32; 16], [0f32; 2]);
    /// let mut view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut state[..]]);
    /// assert_eq!(model.retrieve("ns", &tokens, &mut view)?.tokens, 4);
    /// assert_eq!((out, state), (kv, at_4)); // the KV and the state at 4
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn with_state<T: Element>(mut self, state: &[&'a [T]]) -> KvView<'a> {
        self.parts.set_state(state.iter().map(|s| byte_range(s)));
        self
    }

    /// KV in device memory (since 1.5) that kdn may read (a store, a save):
    /// `size_bytes` bytes at `data` on the runtime's device, laid out as
    /// `spec` says (one allocation, or per-layer allocations at
    /// `spec.layer_offsets`), and the engine's CUDA stream that orders them
    /// (since 1.8; see [`CudaStream`]). A runtime without a device refuses
    /// the view (`Unsupported`); with [`DeviceMode::Emulated`](crate::DeviceMode::Emulated)
    /// the "device" memory is host memory.
    ///
    /// # Safety
    /// kdn reads this memory through the device and cannot check it: `data`
    /// must be the start of at least `size_bytes` bytes of memory the
    /// runtime's device can read (with the emulated device: host memory),
    /// valid and not freed for `'a`, not written while a call or op uses
    /// the view unless `stream` orders the writes (kdn waits for the work the
    /// stream held when the call was made). `stream`, when given, must be a
    /// live CUDA stream of the runtime's device for as long as the view is
    /// used (with the emulated device any value: it is never dereferenced).
    pub unsafe fn from_device(
        data: *const c_void,
        size_bytes: usize,
        spec: &ViewSpec,
        stream: Option<CudaStream>,
    ) -> Result<KvView<'a>> {
        let parts = Parts::slab(spec, data as *mut u8, size_bytes)?;
        Ok(KvView { parts: parts.on_device(stream), _memory: PhantomData })
    }

    /// KV in device memory, one allocation per layer of `layer_bytes`
    /// bytes each: view layer j's K at `k[j]`, V at `v[j]` (see
    /// [`from_device`](Self::from_device)).
    ///
    /// # Safety
    /// As [`from_device`](Self::from_device), for each of the `k` and `v`
    /// allocations with `layer_bytes` bytes.
    pub unsafe fn from_device_per_layer(
        k: &[*const c_void],
        v: &[*const c_void],
        layer_bytes: usize,
        spec: &ViewSpec,
        stream: Option<CudaStream>,
    ) -> Result<KvView<'a>> {
        let k = k.iter().map(|&p| p as *mut u8).collect();
        let v = v.iter().map(|&p| p as *mut u8).collect();
        let parts = Parts::layered(spec, k, v, layer_bytes)?;
        Ok(KvView { parts: parts.on_device(stream), _memory: PhantomData })
    }

    /// Where the view's memory is.
    pub fn memory(&self) -> MemoryKind {
        MemoryKind::from_raw(self.parts.raw.memory)
    }

    /// The CUDA stream the view names, if any.
    pub fn cuda_stream(&self) -> Option<CudaStream> {
        NonNull::new(self.parts.raw.cuda_stream).map(CudaStream)
    }
}

/// An engine's CUDA stream (a `cudaStream_t`), opaque to Rust, for views in
/// device memory (`kdn_kv_view.cuda_stream`, since 1.8). kdn's work on such
/// a view (its copies and kernels, on its own stream) starts after the work
/// this stream held when the call was made, so KV the engine is still
/// writing is not read early, and KV it is still reading is not
/// overwritten; what the engine queues on the stream after the call returns
/// (an op: after it ends) runs after kdn's writes. kdn still waits for its
/// own work before a call returns and before an op reports a layer. Every
/// view of a call names the same stream.
///
/// Making one is safe: it is only a value. Using it in a view is the
/// `unsafe` part ([`KvView::from_device`], [`KvViewMut::from_device`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CudaStream(NonNull<c_void>);

impl CudaStream {
    /// The stream handle (a `cudaStream_t`, as the CUDA runtime or the
    /// engine gives it); `None` for NULL, which names no stream. (CUDA's
    /// legacy default stream is NULL too: name no stream for it.)
    pub fn from_raw(stream: *mut c_void) -> Option<CudaStream> {
        NonNull::new(stream).map(CudaStream)
    }

    /// The handle.
    pub fn as_raw(self) -> *mut c_void {
        self.0.as_ptr()
    }
}

/// KV the library may write: the memory of a retrieve or a knowledge fetch.
/// It borrows the memory exclusively for `'a`, and can be used wherever a
/// [`KvView`] can (it derefs to one).
///
/// ```
/// use kdn::{DType, KvViewMut, ViewSpec};
/// const LAYER: usize = 2 * 16 * 8 * 64; // 2 blocks of 16 tokens, 8 heads of 64 (bf16 in u16)
/// let mut k = vec![0u16; 2 * LAYER]; // 2 layers
/// let mut v = vec![0u16; 2 * LAYER];
/// // tokens 0..16 in block 1, 16..32 in block 0
/// let spec = ViewSpec::paged(DType::BF16, kdn::Layout::PagedNhd, 16, vec![1, 0]);
/// let view = KvViewMut::per_layer(k.chunks_mut(LAYER).collect(), v.chunks_mut(LAYER).collect(), &spec)?;
/// # let _ = view;
/// # Ok::<(), kdn::Error>(())
/// ```
///
/// Read-only memory cannot be written into: a `KvViewMut` needs `&mut`,
///
/// ```compile_fail,E0308
/// let kv = vec![0f32; 64];
/// let view = kdn::KvViewMut::canonical(&kv, kdn::DType::F32); // error[E0308]: expected `&mut [_]`
/// ```
///
/// and a retrieve needs a `KvViewMut`:
///
/// ```compile_fail,E0308
/// # use kdn::{DType, KvView, ModelSpec, Runtime, RuntimeOptions};
/// # let rt = Runtime::new(&RuntimeOptions::default()).unwrap();
/// # let model = rt.model(&ModelSpec::new(1, 1, 8, DType::F32, "m")).unwrap();
/// let kv = vec![0f32; 64];
/// model.retrieve("ns", &[1, 2, 3, 4], &mut KvView::canonical(&kv, DType::F32)); // error[E0308]: mismatched types
/// ```
pub struct KvViewMut<'a> {
    view: KvView<'a>,
    _memory: PhantomData<&'a mut [u8]>,
}

impl<'a> KvViewMut<'a> {
    /// `data` in the canonical layout.
    pub fn canonical<T: Element>(data: &'a mut [T], dtype: DType) -> KvViewMut<'a> {
        KvViewMut { view: KvView::canonical(data, dtype), _memory: PhantomData }
    }

    /// `data` as `spec` describes it.
    pub fn new<T: Element>(data: &'a mut [T], spec: &ViewSpec) -> Result<KvViewMut<'a>> {
        Ok(KvViewMut { view: KvView::new(data, spec)?, _memory: PhantomData })
    }

    /// One allocation per layer (see [`KvView::per_layer`]).
    pub fn per_layer<T: Element>(k: Vec<&'a mut [T]>, v: Vec<&'a mut [T]>, spec: &ViewSpec) -> Result<KvViewMut<'a>> {
        let min = k.iter().chain(&v).map(|s| std::mem::size_of_val(&**s)).min().unwrap_or(0);
        let k = k.into_iter().map(|s| s.as_mut_ptr() as *mut u8).collect();
        let v = v.into_iter().map(|s| s.as_mut_ptr() as *mut u8).collect();
        Ok(KvViewMut {
            view: KvView { parts: Parts::layered(spec, k, v, min)?, _memory: PhantomData },
            _memory: PhantomData,
        })
    }

    /// With the memory the recurrent layers' state is written to (since
    /// 1.12): a retrieve or load of a model with recurrent layers needs it
    /// (`InvalidArgument` without), and writes the snapshot at the prefix it
    /// returns into `state[i]`'s first `state_bytes` bytes (nothing on a
    /// miss). One slice per recurrent layer, each at least `state_bytes`
    /// long, borrowed exclusively for `'a` like the KV (see
    /// [`KvView::with_state`], which has an example).
    ///
    /// The state cannot be touched while the view may write it:
    ///
    /// ```compile_fail,E0502
    /// # use kdn::{DType, KvViewMut};
    /// let (mut out, mut state) = (vec![0f32; 16], vec![0u8; 8]);
    /// let view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut state[..]]);
    /// println!("{}", state[0]); // error[E0502]: cannot borrow `state` as immutable
    /// drop(view);
    /// ```
    pub fn with_state<T: Element>(mut self, state: Vec<&'a mut [T]>) -> KvViewMut<'a> {
        self.view.parts.set_state(state.into_iter().map(|s| (s.as_mut_ptr() as *mut u8, std::mem::size_of_val(&*s))));
        self
    }

    /// KV in device memory (since 1.5) that kdn may write (a retrieve, a
    /// load, a blend): `size_bytes` bytes at `data` on the runtime's device,
    /// laid out as `spec` says, ordered by the engine's `stream` (since 1.8;
    /// see [`CudaStream`]). Loads write it on the device: a device tier's
    /// chunks device to device, encoded chunks of lower tiers decoded on the
    /// GPU where their codec can; the KV is in place when the call returns.
    ///
    /// ```
    /// use kdn::{DType, DeviceMode, KvView, KvViewMut, MemoryKind, ModelSpec, Runtime, RuntimeOptions, ViewSpec};
    /// // The emulated device: host memory stands in for the GPU's.
    /// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(2).with_device(DeviceMode::Emulated))?;
    /// let model = rt.model(&ModelSpec::new(1, 1, 2, DType::F32, "m"))?;
    /// let kv: Vec<f32> = (0..16).map(|i| i as f32).collect(); // 4 tokens, canonical
    /// let mut gpu = vec![0f32; 16]; // a cudaMalloc'd buffer on a real device
    /// // SAFETY: `gpu` is the device's memory here, 64 bytes, alive and
    /// // untouched while the view is used; no stream.
    /// let mut view = unsafe {
    ///     KvViewMut::from_device(gpu.as_mut_ptr().cast(), 64, &ViewSpec::canonical(DType::F32), None)?
    /// };
    /// assert_eq!(view.memory(), MemoryKind::Device);
    /// model.store("ns", &[1, 2, 3, 4], &KvView::canonical(&kv, DType::F32))?;
    /// assert_eq!(model.retrieve("ns", &[1, 2, 3, 4], &mut view)?.tokens, 4);
    /// drop(view);
    /// assert_eq!(gpu, kv);
    /// # Ok::<(), kdn::Error>(())
    /// ```
    ///
    /// # Safety
    /// kdn writes this memory through the device and cannot check it:
    /// `data` must be the start of at least `size_bytes` bytes of memory the
    /// runtime's device can write (with the emulated device: host memory),
    /// valid and not freed for `'a`, and neither read nor written otherwise
    /// while a call or op uses the view, unless `stream` orders that work
    /// (kdn's writes run after the work the stream held at the call, and the
    /// stream's later work after kdn's writes). `stream`, when given, must be
    /// a live CUDA stream of the runtime's device for as long as the view is
    /// used (with the emulated device any value: it is never dereferenced).
    pub unsafe fn from_device(
        data: *mut c_void,
        size_bytes: usize,
        spec: &ViewSpec,
        stream: Option<CudaStream>,
    ) -> Result<KvViewMut<'a>> {
        // SAFETY: the caller's promise, which covers writes too.
        let view = unsafe { KvView::from_device(data, size_bytes, spec, stream)? };
        Ok(KvViewMut { view, _memory: PhantomData })
    }

    /// KV in device memory that kdn may write, one allocation per layer of
    /// `layer_bytes` bytes each (see [`from_device`](Self::from_device)).
    ///
    /// # Safety
    /// As [`from_device`](Self::from_device), for each of the `k` and `v`
    /// allocations with `layer_bytes` bytes.
    pub unsafe fn from_device_per_layer(
        k: &[*mut c_void],
        v: &[*mut c_void],
        layer_bytes: usize,
        spec: &ViewSpec,
        stream: Option<CudaStream>,
    ) -> Result<KvViewMut<'a>> {
        let k: Vec<*const c_void> = k.iter().map(|&p| p as *const c_void).collect();
        let v: Vec<*const c_void> = v.iter().map(|&p| p as *const c_void).collect();
        // SAFETY: the caller's promise, which covers writes too.
        let view = unsafe { KvView::from_device_per_layer(&k, &v, layer_bytes, spec, stream)? };
        Ok(KvViewMut { view, _memory: PhantomData })
    }
}

impl<'a> Deref for KvViewMut<'a> {
    type Target = KvView<'a>;
    fn deref(&self) -> &KvView<'a> {
        &self.view
    }
}

/// Memory an asynchronous op owns while the library reads or writes it: a
/// `Vec<T>` of an [`Element`] (a `Box<[T]>` converts with `into_vec`, no
/// copy; `Box` itself is not implemented, as moving a `Box` asserts unique
/// access to its memory while the library may be writing it). The op gives it back when it
/// ends ([`Op::into_buffer`](crate::Op::into_buffer)).
///
/// # Safety
/// `as_mut_ptr` must return the same pointer to `byte_len` bytes every time
/// while the value is not touched otherwise, also after the value moves, and
/// moving the value must not assert unique access to that memory (as moving
/// a `Box` does).
pub unsafe trait KvBuffer: Send + 'static {
    /// The first byte.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// How many bytes.
    fn byte_len(&self) -> usize;
}

unsafe impl<T: Element> KvBuffer for Vec<T> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_slice().as_mut_ptr() as *mut u8
    }
    fn byte_len(&self) -> usize {
        std::mem::size_of_val(self.as_slice())
    }
}

/// No buffer: the `B` of an op over borrowed memory
/// ([`Model::load_async_unchecked`](crate::Model::load_async_unchecked)).
unsafe impl KvBuffer for () {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        ptr::null_mut()
    }
    fn byte_len(&self) -> usize {
        0
    }
}

pub(crate) fn owned_parts(spec: &ViewSpec, base: *mut u8, len: usize) -> Result<Parts> {
    Parts::slab(spec, base, len)
}

/// `bytes` as `f32`s, when aligned and a whole number of them (an editor's
/// KV of an F32 model is).
pub fn as_f32_mut(bytes: &mut [u8]) -> Option<&mut [f32]> {
    // SAFETY: every bit pattern is an f32; align_to_mut gives only aligned middles.
    let (head, mid, tail) = unsafe { bytes.align_to_mut::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// `data`'s bytes (zero-copy), for comparing KV byte by byte.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: Element types have no padding.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) }
}
