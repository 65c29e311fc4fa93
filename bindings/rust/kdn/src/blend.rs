// SPDX-License-Identifier: Apache-2.0
//! Blending (CacheBlend, `kdn_kv_blend`; experimental in kdn.h): composes a
//! context from pieces whose KV was computed alone (RAG documents in any
//! order) and the tokens computed now; the engine recomputes the layers of
//! the positions kdn selects, through a Rust closure.

use crate::error::{Error, Result, Status};
use crate::model::{c_ids, Model, Request, TokenId};
use crate::types::{bytes, init, RopeScaling};
use crate::view::KvViewMut;
use kdn_sys as sys;
use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

/// One piece of a blended context (`kdn_blend_segment`), in order.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment<'a> {
    /// A knowledge item by its id ([`Knowledge::put`](crate::Knowledge::put)):
    /// its KV, computed alone, placed here and its keys rotated to their
    /// new positions.
    Document(&'a str),
    /// Tokens computed now (the query, anything not cached).
    Tokens(&'a [i32]),
    /// The same, as tokenizers give them (each <= `i32::MAX`).
    TokensU32(&'a [u32]),
}

impl<'a> Segment<'a> {
    /// A document by id.
    pub fn document(doc_id: &'a str) -> Self {
        Segment::Document(doc_id)
    }

    /// Tokens computed now: `i32` or `u32` ids ([`TokenId`]).
    pub fn tokens<T: TokenId>(ids: &'a [T]) -> Self {
        match Request::from(ids) {
            Request::TokensU32(ids) => Segment::TokensU32(ids),
            Request::Tokens(ids) => Segment::Tokens(ids),
            _ => unreachable!("token ids make a token request"),
        }
    }

    /// The C segment; it borrows what `self` borrows.
    fn raw(&self) -> Result<sys::kdn_blend_segment> {
        let mut s: sys::kdn_blend_segment = init(sys::kdn_blend_segment_init);
        match *self {
            Segment::Document(id) => {
                s.kind = sys::kdn_segment_kind_KDN_SEGMENT_DOCUMENT;
                (s.doc_id, s.doc_id_len) = bytes(id.as_bytes());
            }
            Segment::Tokens(ids) => (s.tokens, s.num_tokens) = (ids.as_ptr(), ids.len()),
            Segment::TokensU32(ids) => {
                let ids = c_ids(ids)?;
                (s.tokens, s.num_tokens) = (ids.as_ptr(), ids.len());
            }
        }
        Ok(s)
    }
}

/// How to blend (`kdn_blend_options`, without the callback, which
/// [`Model::blend`] takes).
///
/// ```
/// use kdn::BlendOptions;
/// let options = BlendOptions::new(64).with_ratio(0.25).with_check_layers(vec![1, 2]);
/// assert_eq!((options.hidden_dim, options.threshold), (64, None));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BlendOptions {
    /// Fraction of the cached tokens recomputed past the check layers, in
    /// [0, 1]; default 0.15. 0 (and no threshold): only the fresh tokens
    /// are computed, the cached ones keep their placed KV.
    pub ratio: f32,
    /// Select the cached tokens whose key deviation is at least this
    /// instead of by `ratio`; `None` (the default): by ratio.
    pub threshold: Option<f32>,
    /// The engine's hidden width: the length of each row of
    /// [`BlendLayer::hidden`]. Must be set (1..2^20).
    pub hidden_dim: u32,
    /// The layers where tokens are selected, ascending; `None`: layer 1
    /// (layer 0 for a 1-layer model).
    pub check_layers: Option<Vec<u32>>,
    /// RoPE scaling beyond the model spec's theta, style and rotary dims.
    pub rope_scaling: RopeScaling,
    /// The scaling's factor; default 1.
    pub rope_factor: f32,
}

impl BlendOptions {
    /// The library's defaults, for an engine of hidden width `hidden_dim`.
    pub fn new(hidden_dim: u32) -> Self {
        BlendOptions {
            ratio: 0.15,
            threshold: None,
            hidden_dim,
            check_layers: None,
            rope_scaling: RopeScaling::None,
            rope_factor: 1.0,
        }
    }
    /// With a recompute ratio.
    pub fn with_ratio(mut self, ratio: f32) -> Self {
        self.ratio = ratio;
        self
    }
    /// Selecting by a deviation threshold instead.
    pub fn with_threshold(mut self, threshold: f32) -> Self {
        self.threshold = Some(threshold);
        self
    }
    /// With these check layers.
    pub fn with_check_layers(mut self, layers: Vec<u32>) -> Self {
        self.check_layers = Some(layers);
        self
    }
    /// With RoPE scaling.
    pub fn with_rope_scaling(mut self, scaling: RopeScaling, factor: f32) -> Self {
        self.rope_scaling = scaling;
        self.rope_factor = factor;
        self
    }
}

/// One call of the engine's layer recompute ([`Model::blend`]): layer
/// `layer` for `positions` (ascending) of the composed context of `total`
/// positions. Every slice is borrowed for the call.
#[derive(Debug)]
pub struct BlendLayer<'b> {
    /// The model layer.
    pub layer: u32,
    /// The positions to compute, ascending, each in `0..total`.
    pub positions: &'b [i32],
    /// At layer 0, their token ids (the engine embeds them); `None` after.
    pub tokens: Option<&'b [i32]>,
    /// `positions.len()` rows of `hidden_dim` floats: the layer's input
    /// (unset at layer 0) and, on return, its output.
    pub hidden: &'b mut [f32],
    /// The row width of `hidden` ([`BlendOptions::hidden_dim`]).
    pub hidden_dim: usize,
    /// This layer's K of every position of the context, float32,
    /// `[position][kv_heads * head_dim]`: write the positions' K (after
    /// RoPE at their positions), and attend each position causally over
    /// `[0, its own]` of `k` and `v`.
    pub k: &'b mut [f32],
    /// This layer's V, as `k`: write the positions' V.
    pub v: &'b mut [f32],
    /// Positions of the composed context.
    pub total: usize,
}

/// What a blend did (`kdn_blend_report`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlendReport {
    /// Positions of the composed context.
    pub positions: u32,
    /// Of them, placed from documents.
    pub cached_positions: u32,
    /// Computed now (the token segments).
    pub fresh_positions: u32,
    /// Cached positions recomputed past the last check layer.
    pub selected: u32,
    /// The layer x position work recomputed, over a full prefill's.
    pub recompute_fraction: f64,
}

type LayerFn<'f> = dyn FnMut(BlendLayer<'_>) -> Result<()> + 'f;

/// The closure behind the C `user` pointer, and how it failed.
struct Call<'f> {
    layer_fn: &'f mut LayerFn<'f>,
    failed: Option<(u32, Failure)>,
}

enum Failure {
    Returned(Error),
    Panicked(Box<dyn Any + Send>),
}

/// The `kdn_blend_layer_fn` of every Rust closure. A panic is caught here
/// (unwinding into C is undefined behaviour, or an abort) and kept for
/// [`Model::blend`] to report; kdn gets `KDN_ERR_INTERNAL` and stops.
unsafe extern "C" fn layer_shim(
    user: *mut c_void,
    layer: u32,
    positions: *const i32,
    tokens: *const i32,
    count: usize,
    hidden: *mut f32,
    hidden_len: usize,
    hidden_dim: u32,
    k: *mut f32,
    v: *mut f32,
    kv_len: usize,
    total: usize,
) -> sys::kdn_status {
    // SAFETY: `user` is the Call that Model::blend keeps on its stack for
    // the C call, which runs this callback on the calling thread only.
    let call = unsafe { &mut *(user as *mut Call<'_>) };
    // SAFETY (the slices): kdn.h: positions and (at layer 0) tokens hold
    // `count` ids, hidden `hidden_len` floats, k and v `kv_len` floats each,
    // all distinct buffers borrowed for the call. A NULL is only ever
    // paired with a length of 0 here (tokens after layer 0 are None).
    unsafe fn slice<'b, T>(p: *const T, n: usize) -> &'b [T] {
        if n == 0 || p.is_null() {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(p, n) }
        }
    }
    unsafe fn slice_mut<'b, T>(p: *mut T, n: usize) -> &'b mut [T] {
        if n == 0 || p.is_null() {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(p, n) }
        }
    }
    let args = unsafe {
        BlendLayer {
            layer,
            positions: slice(positions, count),
            tokens: (!tokens.is_null()).then(|| slice(tokens, count)),
            hidden: slice_mut(hidden, hidden_len),
            hidden_dim: hidden_dim as usize,
            k: slice_mut(k, kv_len),
            v: slice_mut(v, kv_len),
            total,
        }
    };
    let layer_fn = &mut call.layer_fn;
    match catch_unwind(AssertUnwindSafe(|| layer_fn(args))) {
        Ok(Ok(())) => sys::kdn_status_code_KDN_OK,
        Ok(Err(e)) => {
            let code = if e.code() < 0 { e.code() } else { sys::kdn_status_code_KDN_ERR_INTERNAL };
            call.failed = Some((layer, Failure::Returned(e)));
            code
        }
        Err(panic) => {
            call.failed = Some((layer, Failure::Panicked(panic)));
            sys::kdn_status_code_KDN_ERR_INTERNAL
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(a panic without a message)"
    }
}

impl Model {
    /// Blends `segments`, in order, into `view` (the whole context: the sum
    /// of the segments' tokens, in the model's dtype; experimental in
    /// kdn.h, and so is this). Documents are placed and their keys rotated
    /// to their new positions; at the check layers the cached tokens whose
    /// keys deviate most from a fresh computation are selected, and only
    /// those and the fresh tokens are recomputed in the later layers, by
    /// `layer_fn`, the engine's forward pass of one layer ([`BlendLayer`]).
    ///
    /// `layer_fn` runs on this thread, layer by layer in order, during the
    /// call. An `Err` it returns stops the blend, which returns that status;
    /// a panic in it is caught (it never unwinds into C), stops the blend,
    /// and comes back as [`Status::Internal`] with the panic's message.
    ///
    /// A context with a document has a length known only during the call:
    /// the view states its room ([`ViewSpec::with_num_tokens`](crate::ViewSpec::with_num_tokens);
    /// a canonical view without it has room for as many tokens as its memory
    /// holds, and is laid out for that many). Longer than the room is
    /// `BufferTooSmall` with nothing written; an unknown document, or one
    /// whose chunks left every tier, is `NotFound`. Views in device memory
    /// are written through the device.
    ///
    /// ```
    /// use kdn::{BlendOptions, DType, KvView, KvViewMut, ModelSpec, Runtime, RuntimeOptions, Segment};
    /// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(4))?;
    /// let model = rt.model(&ModelSpec::new(2, 1, 2, DType::F32, "m"))?; // 2 layers, 1 KV head of 2
    /// // A document: its tokens and their KV computed alone, canonical.
    /// let kv: Vec<f32> = (0..2 * 2 * 4 * 2).map(|i| i as f32).collect();
    /// model.knowledge("ns").put("doc", 1, b"", &[7, 8, 9, 10], &KvView::canonical(&kv, DType::F32))?;
    /// let query = [11, 12];
    /// let mut out = vec![0f32; 2 * 2 * 6 * 2]; // room for the 6 positions
    /// let report = model.blend(
    ///     "ns",
    ///     &[Segment::document("doc"), Segment::tokens(&query)],
    ///     &BlendOptions::new(16).with_ratio(0.0), // place the document; compute only the query
    ///     &mut KvViewMut::canonical(&mut out, DType::F32),
    ///     |layer| {
    ///         // The engine's forward pass of one layer; here: K and V of each position = 0.5.
    ///         assert_eq!(layer.positions, &[4, 5]);
    ///         for &p in layer.positions {
    ///             layer.k[p as usize * 2..][..2].fill(0.5);
    ///             layer.v[p as usize * 2..][..2].fill(0.5);
    ///         }
    ///         Ok(())
    ///     },
    /// )?;
    /// assert_eq!((report.positions, report.cached_positions, report.fresh_positions), (6, 4, 2));
    /// assert_eq!(&out[8..12], &[0.5; 4]); // layer 0's K of positions 4 and 5
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn blend<F>(
        &self,
        ns: impl AsRef<[u8]>,
        segments: &[Segment<'_>],
        options: &BlendOptions,
        view: &mut KvViewMut<'_>,
        layer_fn: F,
    ) -> Result<BlendReport>
    where
        F: FnMut(BlendLayer<'_>) -> Result<()>,
    {
        self.blend_views(ns, segments, options, std::slice::from_mut(view), layer_fn)
    }

    /// [`blend`](Self::blend) into several views that together hold every layer once.
    pub fn blend_views<F>(
        &self,
        ns: impl AsRef<[u8]>,
        segments: &[Segment<'_>],
        options: &BlendOptions,
        views: &mut [KvViewMut<'_>],
        mut layer_fn: F,
    ) -> Result<BlendReport>
    where
        F: FnMut(BlendLayer<'_>) -> Result<()>,
    {
        let raw_views: Vec<sys::kdn_kv_view> =
            views.iter().map(|v| v.parts.resolve_room(self.row(), self.kv_bytes_per_token())).collect::<Result<_>>()?;
        let segs: Vec<sys::kdn_blend_segment> = segments.iter().map(Segment::raw).collect::<Result<_>>()?;
        let mut call = Call { layer_fn: &mut layer_fn, failed: None };
        let mut o: sys::kdn_blend_options = init(sys::kdn_blend_options_init);
        o.ratio = options.ratio;
        o.threshold = options.threshold.unwrap_or(-1.0);
        o.hidden_dim = options.hidden_dim;
        if let Some(layers) = &options.check_layers {
            (o.check_layers, o.num_check_layers) = (layers.as_ptr(), layers.len());
        }
        o.rope_scaling = options.rope_scaling.raw();
        o.rope_factor = options.rope_factor;
        o.layer_fn = Some(layer_shim);
        o.user = &mut call as *mut Call<'_> as *mut c_void;
        let (ns, ns_len) = bytes(ns.as_ref());
        let mut report: sys::kdn_blend_report = init(sys::kdn_blend_report_init);
        // SAFETY: every pointer is valid for the call; the views' memory is
        // exclusively borrowed by the caller's KvViewMuts; `call` outlives
        // the call, which is the only time kdn uses `user`.
        let status = unsafe {
            sys::kdn_kv_blend(
                self.raw(),
                ns,
                ns_len,
                if segs.is_empty() { ptr::null() } else { segs.as_ptr() },
                segs.len(),
                &o,
                if raw_views.is_empty() { ptr::null() } else { raw_views.as_ptr() },
                raw_views.len(),
                &mut report,
            )
        };
        if status >= 0 {
            return Ok(BlendReport {
                positions: report.positions,
                cached_positions: report.cached_positions,
                fresh_positions: report.fresh_positions,
                selected: report.selected,
                recompute_fraction: report.recompute_fraction,
            });
        }
        let error = Error::last(status);
        Err(match call.failed.take() {
            None => error,
            // The library's status and message ("failed at layer N"), then the closure's own message.
            Some((_, Failure::Returned(e))) => {
                Error::new(error.status(), format!("{}: {}", error.message(), e.message()))
            }
            Some((layer, Failure::Panicked(panic))) => Error::new(
                Status::Internal,
                format!("the blend's layer callback panicked at layer {layer}: {}", panic_message(&*panic)),
            ),
        })
    }
}
