// SPDX-License-Identifier: Apache-2.0
//! Asynchronous, layer-by-layer loads and saves (`kdn_op`).

use crate::error::{check, Error, Result, Status};
use crate::model::{KvResult, LoadRequest, Model};
use crate::runtime::Keep;
use crate::types::{bytes, init, millis_ceil, OpState};
use crate::view::{owned_parts, KvBuffer, ViewSpec};
use kdn_sys as sys;
use std::ops::Range;
use std::ptr::{self, NonNull};
use std::time::Duration;

pub(crate) enum OpKind {
    Load,
    Save,
}

/// A load or save in progress. It OWNS the KV buffer the library reads or
/// writes in the background, and gives it back when it ends
/// ([`into_buffer`](Op::into_buffer), [`finish`](Op::finish)); dropping it
/// cancels the op, waits until the library no longer touches the buffer,
/// then frees it. (An op that only borrowed the buffer would be unsound: a
/// safe `std::mem::forget(op)` would let the buffer be freed while the
/// library still writes into it.)
///
/// Thread-safety (kdn.h): every call may come from any thread at once, so
/// `Send` and `Sync` (the buffer is not reachable through `&Op`).
///
/// A model with recurrent layers (since 1.12): an op of
/// [`Model::load_async_with_state`] or [`Model::save_async_with_state`] owns
/// the recurrent layers' state buffers too (`S`, one per layer), and gives
/// them back with the KV buffer ([`into_buffers`](Op::into_buffers),
/// [`finish_with_state`](Op::finish_with_state)). Other ops hold none.
///
/// A finished op cannot be waited on: [`into_buffer`](Op::into_buffer) takes it by value.
///
/// ```compile_fail,E0382
/// # use kdn::{DType, ModelSpec, Runtime, RuntimeOptions, ViewSpec};
/// # let rt = Runtime::new(&RuntimeOptions::default()).unwrap();
/// # let model = rt.model(&ModelSpec::new(1, 1, 1, DType::F32, "m")).unwrap();
/// let op = model.load_async("ns", &[1, 2], vec![0f32; 4], &ViewSpec::canonical(DType::F32)).unwrap();
/// let buffer = op.into_buffer();
/// op.wait(None); // error[E0382]: borrow of moved value: `op`
/// ```
pub struct Op<B: KvBuffer = Vec<u8>, S: KvBuffer = Vec<u8>> {
    raw: Option<NonNull<sys::kdn_op>>,
    buffer: Option<B>,
    /// The recurrent layers' state buffers (empty for most models).
    state: Vec<S>,
    _keep: Keep,
}

// SAFETY: kdn.h: "every function taking a kdn_op may be called from any
// thread at once, except kdn_op_destroy" (only from Drop / by value). The
// buffers are B, S: Send, and not reachable through &Op.
unsafe impl<B: KvBuffer, S: KvBuffer> Send for Op<B, S> {}
unsafe impl<B: KvBuffer, S: KvBuffer> Sync for Op<B, S> {}

/// A wait's timeout for C: -1 for none, else whole milliseconds rounded up
/// (a non-zero wait never becomes a poll), at most `i64::MAX`.
fn timeout_ms(timeout: Option<Duration>) -> i64 {
    timeout.map_or(-1, |d| millis_ceil(d, i64::MAX as u64) as i64)
}

impl<B: KvBuffer> Op<B> {
    pub(crate) fn start(
        model: &Model,
        kind: OpKind,
        ns: &[u8],
        request: &LoadRequest<'_>,
        buffer: B,
        specs: &[ViewSpec],
    ) -> Result<Op<B>> {
        Self::start_state(model, kind, ns, request, buffer, specs, None)
    }
}

impl<B: KvBuffer, S: KvBuffer> Op<B, S> {
    /// An op that also owns the recurrent layers' state (carried by the first view).
    pub(crate) fn start_with_state(
        model: &Model,
        kind: OpKind,
        ns: &[u8],
        request: &LoadRequest<'_>,
        buffer: B,
        specs: &[ViewSpec],
        state: Vec<S>,
    ) -> Result<Op<B, S>> {
        Self::start_state(model, kind, ns, request, buffer, specs, Some(state))
    }

    fn start_state(
        model: &Model,
        kind: OpKind,
        ns: &[u8],
        request: &LoadRequest<'_>,
        mut buffer: B,
        specs: &[ViewSpec],
        state: Option<Vec<S>>,
    ) -> Result<Op<B, S>> {
        let (base, len) = (buffer.as_mut_ptr(), buffer.byte_len());
        let mut parts = specs.iter().map(|s| owned_parts(s, base, len)).collect::<Result<Vec<_>>>()?;
        let with_state = state.is_some();
        let mut state = state.unwrap_or_default();
        if let (true, Some(first)) = (with_state, parts.first_mut()) {
            // (No view at all: the library refuses the call.)
            first.set_state(state.iter_mut().map(|s| (s.as_mut_ptr(), s.byte_len())));
        }
        let views = parts.iter().map(|p| p.resolve(model)).collect::<Result<Vec<_>>>()?;
        // SAFETY: the buffers are owned by the op from here on and freed
        // only after kdn_op_destroy (moving the Vec of state buffers moves
        // none of their memory).
        let raw = unsafe { start_raw(model, kind, ns, request, &views)? };
        Ok(Op { raw: Some(raw), buffer: Some(buffer), state, _keep: model.keep() })
    }

    fn raw(&self) -> *mut sys::kdn_op {
        self.raw.expect("a live op").as_ptr()
    }

    /// Save: model layer `layer` is final in the buffer; it is copied in the background.
    pub fn layer_ready(&self, layer: u32) -> Result<()> {
        // SAFETY: a live op.
        check(unsafe { sys::kdn_op_layer_ready(self.raw(), layer) })
    }

    /// Load: waits until model layer `layer` is written (`None`: no limit;
    /// a timeout is rounded up to whole milliseconds).
    /// `Timeout` when the time ran out (the load goes on); `Cancelled`, or
    /// the op's error, when it ended without the layer.
    pub fn wait_layer(&self, layer: u32, timeout: Option<Duration>) -> Result<()> {
        // SAFETY: a live op.
        check(unsafe { sys::kdn_op_wait_layer(self.raw(), layer, timeout_ms(timeout)) })
    }

    /// Waits until the op ends (`None`: no limit; a timeout is rounded up to
    /// whole milliseconds) and gives its result; the
    /// op's own error if it failed (`Cancelled` if cancelled); `Timeout`
    /// when the time ran out first (the op goes on).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<KvResult> {
        // SAFETY: a live op.
        check(unsafe { sys::kdn_op_wait(self.raw(), timeout_ms(timeout)) })?;
        self.result()
    }

    /// Where the op is, without waiting.
    pub fn poll(&self) -> Result<OpState> {
        let mut state: sys::kdn_op_state = 0;
        // SAFETY: a live op.
        check(unsafe { sys::kdn_op_poll(self.raw(), &mut state) })?;
        Ok(OpState::from_raw(state))
    }

    /// Asks the op to stop; it ends `Cancelled` at its next layer, unless it
    /// ended already. A save ends once the layers already given are copied;
    /// [`layer_ready`](Op::layer_ready) on it then does nothing.
    pub fn cancel(&self) -> Result<()> {
        // SAFETY: a live op.
        check(unsafe { sys::kdn_op_cancel(self.raw()) })
    }

    /// The outcome so far (state `Pending` while it runs).
    pub fn result(&self) -> Result<KvResult> {
        let mut out: sys::kdn_kv_result = init(sys::kdn_kv_result_init);
        // SAFETY: a live op.
        check(unsafe { sys::kdn_op_get_result(self.raw(), &mut out) })?;
        Ok(KvResult::from_raw(&out))
    }

    /// A load's token ranges that could not be read (recompute only those).
    pub fn failed_ranges(&self) -> Result<Vec<Range<u64>>> {
        let mut count = 0usize;
        // SAFETY: capacity 0 with no array: only the count.
        check(unsafe { sys::kdn_op_get_failed_ranges(self.raw(), ptr::null_mut(), 0, &mut count) })?;
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut out = vec![sys::kdn_token_range { begin: 0, end: 0 }; count];
        // SAFETY: room for `count` ranges.
        check(unsafe { sys::kdn_op_get_failed_ranges(self.raw(), out.as_mut_ptr(), out.len(), &mut count) })?;
        out.truncate(count);
        Ok(out.iter().map(|r| r.begin..r.end).collect())
    }

    /// Ends the op (cancelling it if it still runs, then waiting until the
    /// library no longer touches the buffer) and gives the buffer back.
    pub fn into_buffer(mut self) -> B {
        self.destroy();
        self.buffer.take().expect("the op's buffer")
    }

    /// Waits for the op to end, then gives its result and the buffer.
    pub fn finish(self) -> Result<(KvResult, B)> {
        let result = self.wait(None)?;
        Ok((result, self.into_buffer()))
    }

    /// [`into_buffer`](Op::into_buffer), with the recurrent layers' state
    /// buffers the op owned (since 1.12; empty for an op without them): a
    /// load's holds the snapshot at the prefix it loaded.
    pub fn into_buffers(mut self) -> (B, Vec<S>) {
        self.destroy();
        (self.buffer.take().expect("the op's buffer"), std::mem::take(&mut self.state))
    }

    /// Waits for the op to end, then gives its result, the buffer and the
    /// recurrent layers' state buffers ([`into_buffers`](Op::into_buffers)).
    pub fn finish_with_state(self) -> Result<(KvResult, B, Vec<S>)> {
        let result = self.wait(None)?;
        let (buffer, state) = self.into_buffers();
        Ok((result, buffer, state))
    }

    fn destroy(&mut self) {
        if let Some(raw) = self.raw.take() {
            // SAFETY: the last call on the op; it returns once nothing reads
            // or writes the buffer any more.
            unsafe { sys::kdn_op_destroy(raw.as_ptr()) }
        }
    }
}

/// Starts an op over `views`.
///
/// # Safety
/// The views' memory must stay valid (and, for a load, not be read or
/// written otherwise) until the op is destroyed.
pub(crate) unsafe fn start_raw(
    model: &Model,
    kind: OpKind,
    ns: &[u8],
    request: &LoadRequest<'_>,
    views: &[sys::kdn_kv_view],
) -> Result<NonNull<sys::kdn_op>> {
    let req = request.raw()?;
    let (ns, ns_len) = bytes(ns);
    let mut raw = ptr::null_mut();
    // SAFETY: the arrays are read during the call only; the memory as the caller promised.
    let status = unsafe {
        match kind {
            OpKind::Load => {
                sys::kdn_kv_load_async(model.raw(), ns, ns_len, &req, views.as_ptr(), views.len(), &mut raw)
            }
            OpKind::Save => {
                sys::kdn_kv_save_async(model.raw(), ns, ns_len, &req, views.as_ptr(), views.len(), &mut raw)
            }
        }
    };
    check(status)?;
    NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "no op"))
}

impl Op<()> {
    pub(crate) fn borrowed(raw: NonNull<sys::kdn_op>, model: &Model) -> Op<()> {
        Op { raw: Some(raw), buffer: Some(()), state: Vec::new(), _keep: model.keep() }
    }
}

impl<B: KvBuffer, S: KvBuffer> Drop for Op<B, S> {
    fn drop(&mut self) {
        // The op ends before the buffers (dropped after this) are freed.
        self.destroy();
    }
}

impl<B: KvBuffer, S: KvBuffer> std::fmt::Debug for Op<B, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Op").field("raw", &self.raw).finish()
    }
}
