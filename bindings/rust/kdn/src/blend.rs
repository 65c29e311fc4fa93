// SPDX-License-Identifier: Apache-2.0
//! Blending (CacheBlend, `kdn_kv_blend`; experimental in kdn.h): composes a
//! context from pieces whose KV was computed alone (RAG documents in any
//! order) and the tokens computed now; the engine recomputes the layers of
//! the positions kdn selects, through a Rust closure (since 1.9 also its KV
//! passes). Since 1.9 also by text: `kdn_kv_match` finds the documents in a
//! context's tokens, `kdn_kv_blend_tokens` blends them.

use crate::error::{check, Error, Result, Status};
use crate::model::{c_ids, Model, Request, TokenId};
use crate::types::{bytes, init, RopeScaling};
use crate::view::KvViewMut;
use kdn_sys as sys;
use std::any::Any;
use std::ffi::c_void;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
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
/// The defaults (`ratio` and `check_layers` `None`) are the library's, by
/// method (kdn.h, docs/blending.md): with a KV pass ([`with_kv_pass`](Self::with_kv_pass)),
/// ratio 0.28 over check layers 1 and 2; without, CacheBlend's 0.15 at
/// check layer 1. [`BlendReport::ratio`] and
/// [`num_check_layers`](BlendReport::num_check_layers) say what a blend used.
///
/// ```
/// use kdn::BlendOptions;
/// let options = BlendOptions::new(64).with_ratio(0.25).with_check_layers(vec![1, 2]);
/// assert_eq!((options.hidden_dim, options.ratio, options.threshold), (64, Some(0.25), None));
/// let pass = BlendOptions::new(64).with_kv_pass(0.05).with_first_tokens(4);
/// assert_eq!((pass.ratio, pass.kv_pass, pass.first_tokens), (None, Some(0.05), 4));
/// let gated = BlendOptions::new(64).with_gate("blend-gate.txt", 0.25);
/// assert_eq!((gated.gate_file.as_deref(), gated.max_kl_ratio), (Some("blend-gate.txt".as_ref()), 0.25));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct BlendOptions {
    /// Fraction of the cached tokens recomputed past the check layers, in
    /// [0, 1]; `None` (the default): the method's default (above). 0 (and
    /// no threshold): only the fresh tokens are computed, the cached ones
    /// keep their placed KV.
    pub ratio: Option<f32>,
    /// Select the cached tokens whose key deviation is at least this
    /// instead of by `ratio`; `None` (the default): by ratio.
    pub threshold: Option<f32>,
    /// The engine's hidden width: the length of each row of
    /// [`BlendLayer::hidden`]. Must be set (1..2^20).
    pub hidden_dim: u32,
    /// The layers where tokens are selected, ascending; `None`: the
    /// method's default (above; layer 0 for a 1-layer model).
    pub check_layers: Option<Vec<u32>>,
    /// RoPE scaling beyond the model spec's theta, style and rotary dims.
    pub rope_scaling: RopeScaling,
    /// The scaling's factor; default 1.
    pub rope_factor: f32,
    /// Since 1.9: KV passes (`kdn_blend_options.kv_fn`), and their cost. `Some(cost)`: the
    /// blend's closure is also called for KV passes ([`BlendLayer::kv_only`]):
    /// a check layer then computes, for the cached tokens it drops, only
    /// their K and V, selects on those keys, and runs the whole layer for
    /// the selected and fresh tokens only: the same KV for less work.
    /// `cost` is a KV pass's work per position over a whole layer's, in
    /// (0, 1] (`kv_cost`, counted into [`BlendReport::recompute_fraction`];
    /// e.g. 2 x kv_dim x hidden over the layer's multiply-adds per token).
    /// `None` (the default): check layers run whole.
    pub kv_pass: Option<f32>,
    /// Since 1.9: the leading tokens of each document recomputed at every
    /// layer (where a document computed alone puts its attention sink);
    /// default 0.
    pub first_tokens: u32,
    /// Since 1.9: the accuracy gate (`kdn_blend_options.gate_file`), a file
    /// `kdn blend calibrate` wrote: one line per model fingerprint and
    /// method, the KL(blend) / KL(naive reuse) measured on a calibration
    /// text. With it, the blend runs only when the file holds this model's
    /// record for the method these options resolve to (ratio, check layers,
    /// KV pass or not, first tokens) at or below
    /// [`max_kl_ratio`](Self::max_kl_ratio); otherwise every position is
    /// recomputed (the KV is the full prefill's) and
    /// [`BlendReport::gated`] says so. A file that cannot be read or parsed
    /// is `InvalidArgument`. `None` (the default): no gate.
    pub gate_file: Option<PathBuf>,
    /// Since 1.9: the gate's bound on the recorded KL ratio (finite, >= 0);
    /// default 0.2. Used only with [`gate_file`](Self::gate_file).
    pub max_kl_ratio: f32,
}

impl BlendOptions {
    /// The library's defaults, for an engine of hidden width `hidden_dim`.
    pub fn new(hidden_dim: u32) -> Self {
        BlendOptions {
            ratio: None,
            threshold: None,
            hidden_dim,
            check_layers: None,
            rope_scaling: RopeScaling::None,
            rope_factor: 1.0,
            kv_pass: None,
            first_tokens: 0,
            gate_file: None,
            max_kl_ratio: 0.2,
        }
    }
    /// With a recompute ratio.
    pub fn with_ratio(mut self, ratio: f32) -> Self {
        self.ratio = Some(ratio);
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
    /// With KV passes of this cost (see [`kv_pass`](Self::kv_pass)): the
    /// blend's closure must then handle [`BlendLayer::kv_only`] calls.
    pub fn with_kv_pass(mut self, cost: f32) -> Self {
        self.kv_pass = Some(cost);
        self
    }
    /// Recomputing each document's first `n` tokens at every layer.
    pub fn with_first_tokens(mut self, n: u32) -> Self {
        self.first_tokens = n;
        self
    }
    /// Gated by the calibration file `path`: blending only where it records
    /// this model and method at a KL ratio of at most `max_kl_ratio` (see
    /// [`gate_file`](Self::gate_file)).
    pub fn with_gate(mut self, path: impl AsRef<Path>, max_kl_ratio: f32) -> Self {
        self.gate_file = Some(path.as_ref().to_path_buf());
        self.max_kl_ratio = max_kl_ratio;
        self
    }
}

/// One call of the engine's layer recompute ([`Model::blend`]): layer
/// `layer` for `positions` (ascending) of the composed context of `total`
/// positions; with `kv_only`, their K and V alone. Every slice is borrowed
/// for the call.
#[derive(Debug)]
pub struct BlendLayer<'b> {
    /// The model layer.
    pub layer: u32,
    /// The positions to compute, ascending, each in `0..total`.
    pub positions: &'b [i32],
    /// At layer 0, their token ids (the engine embeds them); `None` after.
    pub tokens: Option<&'b [i32]>,
    /// `positions.len()` rows of `hidden_dim` floats: the layer's input
    /// (unset at layer 0) and, on return, its output (after a KV pass:
    /// scratch, whatever the closure left).
    pub hidden: &'b mut [f32],
    /// The row width of `hidden` ([`BlendOptions::hidden_dim`]).
    pub hidden_dim: usize,
    /// This layer's K of every position of the context, float32,
    /// `[position][kv_heads * head_dim]`: write the positions' K (after
    /// RoPE at their positions), and attend each position causally over
    /// `[0, its own]` of `k` and `v`.
    pub k: &'b mut [f32],
    /// This layer's V, as `k`: write the positions' V. A latent (MLA)
    /// model's `k` holds each position's latent vector
    /// (`[position][latent_dim]`: write the positions' latents) and `v` is
    /// empty.
    pub v: &'b mut [f32],
    /// Positions of the composed context.
    pub total: usize,
    /// Since 1.9: a KV pass (only with [`BlendOptions::with_kv_pass`];
    /// `kdn_blend_options.kv_fn`): write the positions' K and V exactly as
    /// the whole layer would, bit for bit, and nothing else (no attention).
    /// One closure takes both kinds of call, as both usually need the same
    /// engine state; they never overlap.
    pub kv_only: bool,
}

/// What a blend did (`kdn_blend_report`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlendReport {
    /// Positions of the composed context.
    pub positions: u32,
    /// Of them, placed from documents.
    pub cached_positions: u32,
    /// Computed now (the token segments; by text, what no document held).
    pub fresh_positions: u32,
    /// Cached positions recomputed past the last check layer.
    pub selected: u32,
    /// The layer x position work recomputed, over a full prefill's (KV
    /// passes counted at their cost).
    pub recompute_fraction: f64,
    /// Since 1.9: cached positions recomputed at every layer
    /// ([`BlendOptions::first_tokens`]).
    pub anchored: u32,
    /// Since 1.9: positions x layers given only a KV pass.
    pub kv_passes: u32,
    /// Since 1.9: the ratio used (the default resolved).
    pub ratio: f32,
    /// Since 1.9: how many check layers were used.
    pub num_check_layers: u32,
    /// Since 1.9: the gate ([`BlendOptions::gate_file`]) refused the method:
    /// every position was recomputed, the KV is the full prefill's.
    pub gated: bool,
    /// Since 1.9: the gate file's KL ratio for the method; -1: none (or no gate).
    pub gate_kl_ratio: f32,
}

impl BlendReport {
    fn from_raw(r: &sys::kdn_blend_report) -> Self {
        BlendReport {
            positions: r.positions,
            cached_positions: r.cached_positions,
            fresh_positions: r.fresh_positions,
            selected: r.selected,
            recompute_fraction: r.recompute_fraction,
            anchored: r.anchored,
            kv_passes: r.kv_passes,
            ratio: r.ratio,
            num_check_layers: r.num_check_layers,
            gated: r.gated != 0,
            gate_kl_ratio: r.gate_kl_ratio,
        }
    }
}

type LayerFn<'f> = dyn FnMut(BlendLayer<'_>) -> Result<()> + 'f;

/// The closure behind the C `user` pointer, and how it failed.
struct Call<'f> {
    layer_fn: &'f mut LayerFn<'f>,
    /// The layer, whether a KV pass, and what went wrong.
    failed: Option<(u32, bool, Failure)>,
}

enum Failure {
    Returned(Error),
    Panicked(Box<dyn Any + Send>),
}

/// The `kdn_blend_layer_fn` (`layer_fn`) of every Rust closure.
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
    // SAFETY: kdn's arguments, passed on as they came (see `dispatch`).
    unsafe {
        dispatch(false, user, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total)
    }
}

/// The `kdn_blend_layer_fn` of a KV pass (`kv_fn`): the same closure, told.
unsafe extern "C" fn kv_shim(
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
    // SAFETY: as layer_shim.
    unsafe {
        dispatch(true, user, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total)
    }
}

/// Calls the closure. A panic is caught here (unwinding into C is undefined
/// behaviour, or an abort) and kept for the blend to report; kdn gets
/// `KDN_ERR_INTERNAL` and stops.
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch(
    kv_only: bool,
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
    // the C call, which runs the callbacks on the calling thread only, one
    // at a time.
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
            kv_only,
        }
    };
    let layer_fn = &mut call.layer_fn;
    match catch_unwind(AssertUnwindSafe(|| layer_fn(args))) {
        Ok(Ok(())) => sys::kdn_status_code_KDN_OK,
        Ok(Err(e)) => {
            let code = if e.code() < 0 { e.code() } else { sys::kdn_status_code_KDN_ERR_INTERNAL };
            call.failed = Some((layer, kv_only, Failure::Returned(e)));
            code
        }
        Err(panic) => {
            call.failed = Some((layer, kv_only, Failure::Panicked(panic)));
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

/// What is blended: segments, or (1.9) a context's tokens.
enum Context<'s> {
    Segments(Vec<sys::kdn_blend_segment>),
    Tokens(&'s [i32]),
}

impl Model {
    /// Blends `segments`, in order, into `view` (the whole context: the sum
    /// of the segments' tokens, in the model's dtype; experimental in
    /// kdn.h, and so is this). Documents are placed and their keys rotated
    /// to their new positions; at the check layers the cached tokens whose
    /// keys deviate most from a fresh computation are selected, and only
    /// those and the fresh tokens are recomputed in the later layers, by
    /// `layer_fn`, the engine's forward pass of one layer ([`BlendLayer`];
    /// with [`BlendOptions::with_kv_pass`], also its KV pass).
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
            views.iter().map(|v| v.parts.resolve_room(self)).collect::<Result<_>>()?;
        let segs: Vec<sys::kdn_blend_segment> = segments.iter().map(Segment::raw).collect::<Result<_>>()?;
        self.run_blend(ns.as_ref(), Context::Segments(segs), options, &raw_views, &mut layer_fn)
    }

    /// Since 1.9: blending by text, as an engine holds its context: the
    /// ranges [`match_tokens`](Self::match_tokens) finds are placed from
    /// their documents' cached KV (each document read under one snapshot; a
    /// range whose document no longer holds those tokens is computed
    /// instead), every other token is computed through `layer_fn`, and the
    /// blend recomputes what `options` select, as [`blend`](Self::blend)
    /// given those documents as segments does. The view holds the
    /// context's `tokens.len()` positions (a canonical view without
    /// `num_tokens` is laid out for that many).
    /// [`BlendReport::cached_positions`] says how much was placed.
    pub fn blend_tokens<T, F>(
        &self,
        ns: impl AsRef<[u8]>,
        tokens: &[T],
        options: &BlendOptions,
        view: &mut KvViewMut<'_>,
        layer_fn: F,
    ) -> Result<BlendReport>
    where
        T: TokenId,
        F: FnMut(BlendLayer<'_>) -> Result<()>,
    {
        self.blend_tokens_views(ns, tokens, options, std::slice::from_mut(view), layer_fn)
    }

    /// [`blend_tokens`](Self::blend_tokens) into several views that together hold every layer once.
    pub fn blend_tokens_views<T, F>(
        &self,
        ns: impl AsRef<[u8]>,
        tokens: &[T],
        options: &BlendOptions,
        views: &mut [KvViewMut<'_>],
        mut layer_fn: F,
    ) -> Result<BlendReport>
    where
        T: TokenId,
        F: FnMut(BlendLayer<'_>) -> Result<()>,
    {
        let raw_views: Vec<sys::kdn_kv_view> = views.iter().map(|v| v.parts.resolve(self)).collect::<Result<_>>()?;
        let ids = c_ids(tokens)?;
        self.run_blend(ns.as_ref(), Context::Tokens(ids), options, &raw_views, &mut layer_fn)
    }

    /// Since 1.9: where the chunks of this namespace's knowledge items
    /// ([`Knowledge::put`](crate::Knowledge::put)) occur in a context's
    /// `tokens`, at any offset (`kdn_kv_match`): the ranges `begin..end`,
    /// ascending and not overlapping (consecutive chunks of one document
    /// that follow each other are one range). The positions outside them
    /// are the ones the engine must compute. It reads the index, not the
    /// tiers: [`blend_tokens`](Self::blend_tokens) computes a range whose
    /// chunks were evicted since. Empty `tokens` are `InvalidArgument`.
    ///
    /// ```
    /// use kdn::{DType, KvView, ModelSpec, Runtime, RuntimeOptions};
    /// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(4))?;
    /// let model = rt.model(&ModelSpec::new(1, 1, 2, DType::F32, "m"))?;
    /// let doc: Vec<i32> = (100..116).collect();
    /// model.knowledge("ns").put("doc", 1, b"", &doc, &KvView::canonical(&vec![0.5f32; 2 * 16 * 2], DType::F32))?;
    /// let context: Vec<i32> = [&[1, 2, 3][..], &doc, &[4, 5]].concat();
    /// assert_eq!(model.match_tokens("ns", &context)?, vec![3..19]);
    /// assert_eq!(model.match_tokens("another-ns", &context)?, vec![]);
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn match_tokens<T: TokenId>(&self, ns: impl AsRef<[u8]>, tokens: &[T]) -> Result<Vec<Range<u64>>> {
        let ids = c_ids(tokens)?;
        let (ns, ns_len) = bytes(ns.as_ref());
        let mut out: Vec<sys::kdn_token_range> = Vec::new();
        loop {
            let mut count = 0usize;
            // SAFETY: room for out.len() ranges (none: NULL with capacity 0);
            // the tokens and the namespace are borrowed for the call.
            check(unsafe {
                sys::kdn_kv_match(
                    self.raw(),
                    ns,
                    ns_len,
                    ids.as_ptr(),
                    ids.len(),
                    if out.is_empty() { ptr::null_mut() } else { out.as_mut_ptr() },
                    out.len(),
                    &mut count,
                )
            })?;
            // More ranges than room (a put may add some between two calls): again, with room for all.
            if count <= out.len() {
                out.truncate(count);
                return Ok(out.iter().map(|r| r.begin..r.end).collect());
            }
            out = vec![sys::kdn_token_range { begin: 0, end: 0 }; count];
        }
    }

    fn run_blend(
        &self,
        ns: &[u8],
        context: Context<'_>,
        options: &BlendOptions,
        raw_views: &[sys::kdn_kv_view],
        layer_fn: &mut LayerFn<'_>,
    ) -> Result<BlendReport> {
        let mut call = Call { layer_fn, failed: None };
        let mut o: sys::kdn_blend_options = init(sys::kdn_blend_options_init);
        if let Some(ratio) = options.ratio {
            o.ratio = ratio;
        } // else kdn.h's -1: the method's default
        o.threshold = options.threshold.unwrap_or(-1.0);
        o.hidden_dim = options.hidden_dim;
        if let Some(layers) = &options.check_layers {
            (o.check_layers, o.num_check_layers) = (layers.as_ptr(), layers.len());
        }
        o.rope_scaling = options.rope_scaling.raw();
        o.rope_factor = options.rope_factor;
        o.layer_fn = Some(layer_shim);
        if let Some(cost) = options.kv_pass {
            o.kv_fn = Some(kv_shim);
            o.kv_cost = cost;
        }
        o.first_tokens = options.first_tokens;
        if let Some(path) = &options.gate_file {
            // Borrowed from `options` for the call; kdn takes the length, not a NUL.
            let path = path.as_os_str().as_bytes();
            (o.gate_file, o.gate_file_len) = (path.as_ptr().cast(), path.len());
            o.max_kl_ratio = options.max_kl_ratio;
        }
        o.user = &mut call as *mut Call<'_> as *mut c_void;
        let (ns, ns_len) = bytes(ns);
        let views = if raw_views.is_empty() { ptr::null() } else { raw_views.as_ptr() };
        let mut report: sys::kdn_blend_report = init(sys::kdn_blend_report_init);
        // SAFETY: every pointer is valid for the call; the views' memory is
        // exclusively borrowed by the caller's KvViewMuts; `call` outlives
        // the call, which is the only time kdn uses `user`.
        let status = unsafe {
            match context {
                Context::Segments(segs) => sys::kdn_kv_blend(
                    self.raw(),
                    ns,
                    ns_len,
                    if segs.is_empty() { ptr::null() } else { segs.as_ptr() },
                    segs.len(),
                    &o,
                    views,
                    raw_views.len(),
                    &mut report,
                ),
                Context::Tokens(ids) => sys::kdn_kv_blend_tokens(
                    self.raw(),
                    ns,
                    ns_len,
                    ids.as_ptr(),
                    ids.len(),
                    &o,
                    views,
                    raw_views.len(),
                    &mut report,
                ),
            }
        };
        if status >= 0 {
            return Ok(BlendReport::from_raw(&report));
        }
        let error = Error::last(status);
        Err(match call.failed.take() {
            None => error,
            // The library's status and message ("failed at layer N"), then the closure's own message.
            Some((_, _, Failure::Returned(e))) => {
                Error::new(error.status(), format!("{}: {}", error.message(), e.message()))
            }
            Some((layer, kv_only, Failure::Panicked(panic))) => Error::new(
                Status::Internal,
                format!(
                    "the blend's {} panicked at layer {layer}: {}",
                    if kv_only { "KV pass" } else { "layer callback" },
                    panic_message(&*panic)
                ),
            ),
        })
    }
}
