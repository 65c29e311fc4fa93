// SPDX-License-Identifier: Apache-2.0
//! Models, requests, and the synchronous KV calls: store, retrieve, lookup.

use crate::error::{check, Error, Result, Status};
use crate::op::{Op, OpKind};
use crate::runtime::Keep;
use crate::types::{bytes, init, micros_ceil, CacheKind, DType, OpState, RopeStyle};
use crate::view::{KvBuffer, KvView, KvViewMut, ViewSpec};
use kdn_sys as sys;
use std::ptr::{self, NonNull};
use std::time::Duration;

/// The shape of a model's KV and what identifies its weights
/// (`kdn_model_spec`). KV is only ever returned to a model with the same
/// spec and fingerprint.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// Layers, 1..4096.
    pub num_layers: u32,
    /// KV heads, 1..4096.
    pub num_kv_heads: u32,
    /// Dimensions per head, 1..65536.
    pub head_dim: u32,
    /// Element type of the KV.
    pub dtype: DType,
    /// RoPE base; default 10000.
    pub rope_theta: f32,
    /// RoPE pairing; default interleaved.
    pub rope_style: RopeStyle,
    /// Rotary dimensions; 0 = head_dim.
    pub rotary_dim: u32,
    /// Identifies weights, tokenizer, layout, TP rank, adapters: anything
    /// that changes the KV. Opaque bytes; must not be empty.
    pub fingerprint: Vec<u8>,
    /// What each layer caches per token (since 1.11): K and V heads, or one
    /// latent vector ([`ModelSpec::latent`]).
    pub cache_kind: CacheKind,
    /// A latent model's vector length (even); 0 for K and V heads.
    pub latent_dim: u32,
    /// How many of the latent's last dims carry RoPE.
    pub latent_rope_dim: u32,
    /// Layer groups (since 1.12, docs/model-kinds.md): each layer's sliding
    /// window in tokens, 0 for full attention; empty: every layer full. A
    /// load then writes a sliding layer's window only, and a lookup reports
    /// the prefix every group serves.
    pub layer_windows: Vec<u32>,
    /// Recurrent layers (not in `num_layers`), each with a state of
    /// `state_bytes` (a multiple of 4). Their state travels with the views
    /// (`kdn_kv_view.state_layers`, since 1.12): [`KvView::with_state`] for a
    /// store, [`KvViewMut::with_state`] for a retrieve (required), and the
    /// `_with_state` async ops ([`Model::load_async_with_state`],
    /// [`Model::save_async_with_state`]). A prefix of b tokens is a hit only
    /// where a store left the state at b.
    pub num_state_layers: u32,
    /// Bytes of one recurrent layer's state; 0 without recurrent layers.
    pub state_bytes: u64,
}

impl ModelSpec {
    /// A spec with the library's defaults for RoPE.
    pub fn new(
        num_layers: u32,
        num_kv_heads: u32,
        head_dim: u32,
        dtype: DType,
        fingerprint: impl Into<Vec<u8>>,
    ) -> Self {
        ModelSpec {
            num_layers,
            num_kv_heads,
            head_dim,
            dtype,
            rope_theta: 10000.0,
            rope_style: RopeStyle::Interleaved,
            rotary_dim: 0,
            fingerprint: fingerprint.into(),
            cache_kind: CacheKind::Kv,
            latent_dim: 0,
            latent_rope_dim: 0,
            layer_windows: Vec::new(),
            num_state_layers: 0,
            state_bytes: 0,
        }
    }

    /// A latent (MLA) model: each layer caches one vector of `latent_dim`
    /// per token, its last `latent_rope_dim` carrying RoPE; a canonical
    /// buffer holds `[layer][token][latent]`.
    pub fn latent(
        num_layers: u32,
        latent_dim: u32,
        latent_rope_dim: u32,
        dtype: DType,
        fingerprint: impl Into<Vec<u8>>,
    ) -> Self {
        ModelSpec {
            cache_kind: CacheKind::Latent,
            latent_dim,
            latent_rope_dim,
            ..ModelSpec::new(num_layers, 0, 0, dtype, fingerprint)
        }
    }
}

/// A type of token ids the API takes: `i32`, the C ABI's, or `u32`, what
/// tokenizers give (the `tokenizers` crate's `Encoding::get_ids`, tiktoken's
/// ranks). Sealed. kdn takes ids 0..=`i32::MAX`: a `u32` id above
/// `i32::MAX` is [`Status::InvalidArgument`], before any C call; so is a
/// negative `i32` (from the library). Ids pass to C without a copy.
pub trait TokenId: Copy + private::Sealed {}
impl TokenId for i32 {}
impl TokenId for u32 {}

/// The ids as the C ABI's `int32_t`s, without a copy (see [`TokenId`]).
pub(crate) fn c_ids<T: TokenId>(ids: &[T]) -> Result<&[i32]> {
    T::as_c(ids)
}

mod private {
    use super::Request;
    use crate::error::{Error, Result};

    /// What the crate does with a [`TokenId`](super::TokenId) slice; not
    /// nameable outside the crate, so no other type can be a `TokenId`.
    pub trait Sealed: Sized {
        /// The request for these ids.
        fn request(ids: &[Self]) -> Request<'_>;
        /// The ids as the C ABI's `int32_t`s.
        fn as_c(ids: &[Self]) -> Result<&[i32]>;
    }

    impl Sealed for i32 {
        fn request(ids: &[i32]) -> Request<'_> {
            Request::Tokens(ids)
        }
        fn as_c(ids: &[i32]) -> Result<&[i32]> {
            Ok(ids) // a negative id: the library says InvalidArgument
        }
    }

    impl Sealed for u32 {
        fn request(ids: &[u32]) -> Request<'_> {
            Request::TokensU32(ids)
        }
        fn as_c(ids: &[u32]) -> Result<&[i32]> {
            if let Some(at) = ids.iter().position(|&id| id > i32::MAX as u32) {
                return Err(Error::invalid(format!(
                    "token id {} (at {at}) is above i32::MAX, the largest id kdn takes",
                    ids[at]
                )));
            }
            // SAFETY: u32 and i32 have the same size and alignment and every
            // bit pattern is valid in both; each id is <= i32::MAX, so it
            // reads as the same number.
            Ok(unsafe { std::slice::from_raw_parts(ids.as_ptr().cast::<i32>(), ids.len()) })
        }
    }
}

/// The tokens a KV call is about: their ids from the start of the context,
/// or the engine's own chained block hashes, and (since 1.13) an optional
/// salt ([`Request::with_salt`]). Made from token slices with
/// `into()`, so `&[i32]`, `&[u32]`, `&Vec<_>` and `&[_; N]` of either can be
/// passed directly (see [`TokenId`]).
///
/// ```
/// # use kdn::{DType, ModelSpec, Runtime, RuntimeOptions, Status};
/// # let rt = Runtime::new(&RuntimeOptions::default())?;
/// # let model = rt.model(&ModelSpec::new(1, 1, 8, DType::F16, "m"))?;
/// let ids: Vec<u32> = vec![101, 2023, 102]; // as a tokenizer gives them
/// assert_eq!(model.lookup("ns", &ids)?.cached_tokens, 0);
/// let err = model.lookup("ns", &[101, u32::MAX]).unwrap_err();
/// assert_eq!(err.status(), Status::InvalidArgument); // kdn takes ids up to i32::MAX
/// # Ok::<(), kdn::Error>(())
/// ```
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// Token ids, each >= 0.
    Tokens(&'a [i32]),
    /// Token ids as tokenizers give them, each <= `i32::MAX` (since 1.5).
    TokensU32(&'a [u32]),
    /// Block hashes: `hashes.len() / hash_bytes` blocks of `block_tokens`
    /// tokens (chunk_tokens must be a multiple of block_tokens; a length
    /// that is not a whole number of hashes is refused).
    BlockHashes {
        /// The hashes, back to back.
        hashes: &'a [u8],
        /// Bytes per hash, 1..64.
        hash_bytes: u32,
        /// Tokens per engine block.
        block_tokens: u32,
    },
    /// One of the requests above with a salt (since 1.13), made by
    /// [`Request::with_salt`]: its keys are not the unsalted request's.
    Salted(SaltedRequest<'a>),
}

/// A [`Request`] with a salt (`kdn_request.salt`, since 1.13), held by
/// [`Request::Salted`] and made by [`Request::with_salt`]. It borrows the
/// salt as it borrows the tokens. Its `Debug` shows the salt's length only
/// (a salt is often a per-user secret, and logs are not).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SaltedRequest<'a> {
    request: Unsalted<'a>,
    /// Never empty (an empty salt is no salt).
    salt: &'a [u8],
}

impl<'a> SaltedRequest<'a> {
    /// The request without its salt.
    pub fn request(&self) -> Request<'a> {
        match self.request {
            Unsalted::Tokens(t) => Request::Tokens(t),
            Unsalted::TokensU32(t) => Request::TokensU32(t),
            Unsalted::BlockHashes { hashes, hash_bytes, block_tokens } => {
                Request::BlockHashes { hashes, hash_bytes, block_tokens }
            }
        }
    }

    /// The salt (1 byte or more).
    pub fn salt(&self) -> &'a [u8] {
        self.salt
    }
}

impl std::fmt::Debug for SaltedRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaltedRequest").field("request", &self.request()).field("salt_len", &self.salt.len()).finish()
    }
}

/// The requests a salt goes with: [`Request`] but [`Request::Salted`]
/// (which a [`SaltedRequest`] cannot hold: it would hold itself).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unsalted<'a> {
    Tokens(&'a [i32]),
    TokensU32(&'a [u32]),
    BlockHashes { hashes: &'a [u8], hash_bytes: u32, block_tokens: u32 },
}

impl<'a, T: TokenId> From<&'a [T]> for Request<'a> {
    fn from(ids: &'a [T]) -> Self {
        T::request(ids)
    }
}
impl<'a, T: TokenId> From<&'a Vec<T>> for Request<'a> {
    fn from(ids: &'a Vec<T>) -> Self {
        T::request(ids)
    }
}
impl<'a, T: TokenId, const N: usize> From<&'a [T; N]> for Request<'a> {
    fn from(ids: &'a [T; N]) -> Self {
        T::request(ids)
    }
}

impl Request<'_> {
    /// The C request; it borrows what `self` borrows. `InvalidArgument`
    /// for a `u32` id the C ABI cannot take.
    pub(crate) fn raw(&self) -> Result<sys::kdn_request> {
        let mut r: sys::kdn_request = init(sys::kdn_request_init);
        match *self {
            Request::Salted(s) => {
                r = s.request().raw()?;
                // Never empty, so never a dangling pointer with length 0. The
                // library checks the length (at most 4096: InvalidArgument).
                (r.salt, r.salt_len) = (s.salt.as_ptr(), s.salt.len());
            }
            Request::Tokens(t) => {
                r.tokens = t.as_ptr();
                r.num_tokens = t.len();
            }
            Request::TokensU32(t) => {
                let t = c_ids(t)?;
                r.tokens = t.as_ptr();
                r.num_tokens = t.len();
            }
            Request::BlockHashes { hashes, hash_bytes, block_tokens } => {
                r.hash_bytes = hash_bytes;
                r.block_hashes = hashes.as_ptr();
                // A partial last hash: 0 blocks, which the library refuses.
                let whole = hash_bytes != 0 && hashes.len() % hash_bytes as usize == 0;
                r.num_blocks = if whole { hashes.len() / hash_bytes as usize } else { 0 };
                r.block_tokens = block_tokens;
            }
        }
        Ok(r)
    }
}

impl<'a> Request<'a> {
    /// This request, for a retrieve or a load, with a TTFT target: the time
    /// from the call within which the cached prefix's KV should be in place
    /// (`kdn_request.ttft_target_us`, since 1.6; passed in whole
    /// microseconds, rounded up). Remote and redis tiers with quality levels
    /// ([`TierConfig::levels`](crate::TierConfig::levels)) choose each chunk's
    /// level by it, and leave a chunk to recompute when none arrives in time;
    /// other tiers ignore it. Over an hour is `InvalidArgument` (a unit mistake).
    ///
    /// ```
    /// # use kdn::{DType, KvView, KvViewMut, ModelSpec, Request, Runtime, RuntimeOptions};
    /// # use std::time::Duration;
    /// # let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(2))?;
    /// # let model = rt.model(&ModelSpec::new(1, 1, 2, DType::F32, "m"))?;
    /// let tokens = [5, 6, 7, 8];
    /// # model.store("ns", &tokens, &KvView::canonical(&[1.0f32; 16], DType::F32))?;
    /// let mut out = vec![0f32; 16];
    /// let request = Request::from(&tokens).with_ttft_target(Duration::from_millis(40));
    /// assert_eq!(model.retrieve("ns", request, &mut KvViewMut::canonical(&mut out, DType::F32))?.tokens, 4);
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn with_ttft_target(self, ttft_target: Duration) -> LoadRequest<'a> {
        LoadRequest { request: self, ttft_target }
    }

    /// This request with a salt (`kdn_request.salt`, since 1.13): `salt`
    /// enters every chunk key of the request, as vLLM's `cache_salt` enters
    /// its prefix hashes. A salted request hits only KV stored with the same
    /// salt; KV stored without one never answers it, nor does salted KV
    /// answer an unsalted request, so one user's cached prefix gives another
    /// no hit and no timing signal. Lookups, stores, retrieves and the async
    /// loads and saves take it; knowledge items and blending have none (they
    /// are per namespace). kdn hashes the salt into the keys and never
    /// stores it; it is borrowed for the call (an async op does not keep
    /// it: kdn copies the request when the op starts).
    ///
    /// A salt replaces the request's salt, if it had one; an empty salt is
    /// no salt (the request unsalted). Over 4096 bytes is `InvalidArgument`
    /// (from the library, at the call; a libkdn older than 1.13 refuses
    /// any salted request with `Version`).
    ///
    /// ```
    /// # use kdn::{DType, KvView, KvViewMut, ModelSpec, Request, Runtime, RuntimeOptions};
    /// # let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(2))?;
    /// # let model = rt.model(&ModelSpec::new(1, 1, 2, DType::F32, "m"))?;
    /// let tokens = [5, 6, 7, 8];
    /// let alice = Request::from(&tokens).with_salt(b"user:alice");
    /// model.store("ns", alice, &KvView::canonical(&[1.0f32; 16], DType::F32))?;
    /// assert_eq!(model.lookup("ns", alice)?.cached_tokens, 4);
    /// assert_eq!(model.lookup("ns", &tokens)?.cached_tokens, 0); // unsalted: no hit
    /// assert_eq!(model.lookup("ns", Request::from(&tokens).with_salt(b"user:bob"))?.cached_tokens, 0);
    /// let mut out = vec![0f32; 16];
    /// assert_eq!(model.retrieve("ns", alice, &mut KvViewMut::canonical(&mut out, DType::F32))?.tokens, 4);
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn with_salt(self, salt: &'a [u8]) -> Request<'a> {
        let request = match self {
            Request::Tokens(t) => Unsalted::Tokens(t),
            Request::TokensU32(t) => Unsalted::TokensU32(t),
            Request::BlockHashes { hashes, hash_bytes, block_tokens } => {
                Unsalted::BlockHashes { hashes, hash_bytes, block_tokens }
            }
            Request::Salted(s) => s.request,
        };
        let salted = SaltedRequest { request, salt };
        if salt.is_empty() {
            salted.request()
        } else {
            Request::Salted(salted)
        }
    }

    /// The request's salt ([`with_salt`](Self::with_salt)); `None` without one.
    pub fn salt(&self) -> Option<&'a [u8]> {
        match *self {
            Request::Salted(s) => Some(s.salt),
            _ => None,
        }
    }
}

/// The request of a load ([`Model::retrieve`], [`Model::load_async`]): its
/// tokens (and salt) and a TTFT target ([`Request::with_ttft_target`]). Anything that
/// makes a [`Request`] makes one, with no target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadRequest<'a> {
    /// The tokens.
    pub request: Request<'a>,
    /// The time from the call within which the cached prefix's KV should be
    /// in place (since 1.6); zero: no target (the finest quality level).
    pub ttft_target: Duration,
}

impl<'a> LoadRequest<'a> {
    /// This load's request with a salt (since 1.13; [`Request::with_salt`]).
    pub fn with_salt(self, salt: &'a [u8]) -> LoadRequest<'a> {
        LoadRequest { request: self.request.with_salt(salt), ..self }
    }

    pub(crate) fn raw(&self) -> Result<sys::kdn_request> {
        let mut r = self.request.raw()?;
        r.ttft_target_us = micros_ceil(self.ttft_target);
        Ok(r)
    }
}

impl<'a> From<Request<'a>> for LoadRequest<'a> {
    fn from(request: Request<'a>) -> Self {
        LoadRequest { request, ttft_target: Duration::ZERO }
    }
}
impl<'a, T: TokenId> From<&'a [T]> for LoadRequest<'a> {
    fn from(ids: &'a [T]) -> Self {
        T::request(ids).into()
    }
}
impl<'a, T: TokenId> From<&'a Vec<T>> for LoadRequest<'a> {
    fn from(ids: &'a Vec<T>) -> Self {
        T::request(ids).into()
    }
}
impl<'a, T: TokenId, const N: usize> From<&'a [T; N]> for LoadRequest<'a> {
    fn from(ids: &'a [T; N]) -> Self {
        T::request(ids).into()
    }
}

/// What a KV call did (`kdn_kv_result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvResult {
    /// `Done` after a synchronous call; an op's state otherwise.
    pub state: OpState,
    /// `None` when it went well, else why it failed (an op's result).
    pub status: Option<Status>,
    /// Store/save: leading tokens cached after it; retrieve/load: tokens
    /// written (0 on a miss); fetch: the document's length.
    pub tokens: u64,
    /// Retrieve/load: the cached prefix found at the start.
    pub covered: u64,
    /// Load: ranges of the prefix that could not be read (or, since 1.7,
    /// were left to recompute as slower than prefill).
    pub num_failed: u64,
    /// `KDN_RESULT_*` bits.
    pub flags: u32,
}

impl KvResult {
    pub(crate) fn from_raw(r: &sys::kdn_kv_result) -> Self {
        KvResult {
            state: OpState::from_raw(r.state),
            status: Status::from_code(r.status),
            tokens: r.tokens,
            covered: r.covered,
            num_failed: r.num_failed,
            flags: r.flags,
        }
    }
    /// Whether some KV came from a lossy codec (close to, not equal to, the KV stored).
    pub fn lossy(&self) -> bool {
        self.flags & sys::KDN_RESULT_LOSSY != 0
    }
}

/// One request's lookup (`kdn_lookup_result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// Leading tokens cached in some tier.
    pub cached_tokens: u64,
    num_tiers: u32,
    tier_tokens: [u64; sys::KDN_MAX_TIERS as usize],
}

impl Lookup {
    const EMPTY: Lookup = Lookup { cached_tokens: 0, num_tiers: 0, tier_tokens: [0; sys::KDN_MAX_TIERS as usize] };

    /// Per tier, highest first: the leading tokens that tier alone holds.
    pub fn tier_tokens(&self) -> &[u64] {
        &self.tier_tokens[..(self.num_tiers as usize).min(self.tier_tokens.len())]
    }
    fn from_raw(r: &sys::kdn_lookup_result) -> Result<Self> {
        match Status::from_code(r.status) {
            Some(status) => Err(Error::new(status, format!("this request failed: {}", status.name()))),
            None => Ok(Lookup { cached_tokens: r.cached_tokens, num_tiers: r.num_tiers, tier_tokens: r.tier_tokens }),
        }
    }
}

/// A model registered with a runtime (`kdn_model`); every KV call goes
/// through one. It keeps its runtime alive.
///
/// Thread-safety (kdn.h): immutable once created and usable from any thread
/// at once, so `Send` and `Sync`.
///
/// Memory goes to the library without copies: a store reads the caller's
/// slice, a retrieve writes into the caller's slice.
///
/// ```
/// use kdn::{DType, KvView, KvViewMut, ModelSpec, Runtime, RuntimeOptions};
/// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(4))?;
/// let model = rt.model(&ModelSpec::new(2, 2, 4, DType::F32, "my-model"))?;
/// let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
/// let kv: Vec<f32> = (0..8 * 2 * 2 * 2 * 4).map(|i| i as f32).collect(); // canonical layout
/// assert_eq!(model.store("tenant", &tokens, &KvView::canonical(&kv, DType::F32))?.tokens, 8);
/// assert_eq!(model.lookup("tenant", &tokens[..6])?.cached_tokens, 4); // whole chunks only
/// let mut out = vec![0f32; kv.len()];
/// let got = model.retrieve("tenant", &tokens, &mut KvViewMut::canonical(&mut out, DType::F32))?;
/// assert_eq!((got.tokens, &out), (8, &kv));
/// // a miss is not an error
/// assert_eq!(model.retrieve("other", &tokens, &mut KvViewMut::canonical(&mut out, DType::F32))?.tokens, 0);
/// # Ok::<(), kdn::Error>(())
/// ```
pub struct Model {
    raw: NonNull<sys::kdn_model>,
    keep: Keep,
    kv_bytes_per_token: u64,
    /// kv_heads x head_dim: elements per token and layer.
    row: u64,
    num_layers: u32,
    dtype: DType,
    num_state_layers: u32,
    state_bytes: u64,
}

// SAFETY: kdn.h: "immutable once created; usable from any thread at once";
// destroy only from Drop.
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("raw", &self.raw).field("kv_bytes_per_token", &self.kv_bytes_per_token).finish()
    }
}

/// A namespace argument as (pointer, length).
fn ns_arg(ns: &[u8]) -> (*const std::os::raw::c_char, usize) {
    bytes(ns)
}

impl Model {
    pub(crate) fn create(rt: *mut sys::kdn_runtime, spec: &ModelSpec, keep: Keep) -> Result<Model> {
        let mut s: sys::kdn_model_spec = init(sys::kdn_model_spec_init);
        s.num_layers = spec.num_layers;
        s.num_kv_heads = spec.num_kv_heads;
        s.head_dim = spec.head_dim;
        s.dtype = spec.dtype.raw();
        s.rope_theta = spec.rope_theta;
        s.rope_style = spec.rope_style.raw();
        s.rotary_dim = spec.rotary_dim;
        s.cache_kind = spec.cache_kind.raw();
        s.latent_dim = spec.latent_dim;
        s.latent_rope_dim = spec.latent_rope_dim;
        if !spec.layer_windows.is_empty() {
            if spec.layer_windows.len() != spec.num_layers as usize {
                return Err(Error::new(
                    Status::InvalidArgument,
                    "model spec: layer_windows needs one entry per layer (num_layers)",
                ));
            }
            s.layer_windows = spec.layer_windows.as_ptr();
        }
        s.num_state_layers = spec.num_state_layers;
        s.state_bytes = spec.state_bytes;
        (s.fingerprint, s.fingerprint_len) = bytes(&spec.fingerprint);
        let mut raw = ptr::null_mut();
        // SAFETY: a live runtime; the spec and its string live across the call (copied).
        check(unsafe { sys::kdn_model_create(rt, &s, &mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "kdn_model_create gave NULL"))?;
        let mut model = Model {
            raw,
            keep,
            kv_bytes_per_token: 0,
            // Elements of one token's row in a paged block (a latent's whole vector).
            row: if spec.cache_kind == CacheKind::Latent {
                u64::from(spec.latent_dim)
            } else {
                u64::from(spec.num_kv_heads) * u64::from(spec.head_dim)
            },
            num_layers: spec.num_layers,
            dtype: spec.dtype,
            num_state_layers: spec.num_state_layers,
            state_bytes: spec.state_bytes,
        };
        // SAFETY: a live model.
        check(unsafe { sys::kdn_model_get_kv_bytes_per_token(raw.as_ptr(), &mut model.kv_bytes_per_token) })?;
        Ok(model)
    }

    /// Bytes of KV per token: layers x 2 x kv_heads x head_dim x dtype size.
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.kv_bytes_per_token
    }

    /// Layers of the model.
    pub fn num_layers(&self) -> u32 {
        self.num_layers
    }

    /// The model's dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Recurrent layers of the model (since 1.12; 0 for most models): how
    /// many states a view carries ([`KvView::with_state`]).
    pub fn num_state_layers(&self) -> u32 {
        self.num_state_layers
    }

    /// Bytes of one recurrent layer's state (since 1.12; 0 without recurrent layers).
    pub fn state_bytes(&self) -> u64 {
        self.state_bytes
    }

    /// The 32-byte identity kdn derived from the spec (shape + fingerprint).
    pub fn fingerprint(&self) -> Result<[u8; 32]> {
        let mut out = [0u8; 32];
        // SAFETY: 32 bytes of room.
        check(unsafe { sys::kdn_model_get_fingerprint(self.raw.as_ptr(), out.as_mut_ptr()) })?;
        Ok(out)
    }

    /// Tells the runtime that the engine prefilled `tokens` tokens of this
    /// model in `elapsed` (wall time of the forward pass, as the engine
    /// measured it; since 1.4). Later loads price the tokens they serve at
    /// the model's mean prefill time per token ([`Stats::ttft_saved_ns`](crate::Stats::ttft_saved_ns)).
    /// Report the prefills of the tokens a load did not serve, and full
    /// prefills, as they happen. `InvalidArgument` when `tokens` or
    /// `elapsed` is 0, or the time is over an hour per token.
    pub fn report_prefill(&self, tokens: u64, elapsed: Duration) -> Result<()> {
        let ns = u64::try_from(elapsed.as_nanos())
            .map_err(|_| Error::invalid(format!("report_prefill: {elapsed:?} does not fit in u64 nanoseconds")))?;
        // SAFETY: a live model; the call is thread-safe.
        check(unsafe { sys::kdn_model_report_prefill(self.raw(), tokens, ns) })
    }

    pub(crate) fn raw(&self) -> *mut sys::kdn_model {
        self.raw.as_ptr()
    }

    pub(crate) fn keep(&self) -> Keep {
        self.keep.clone()
    }

    /// Stores the request's KV from `view`, in chunks of the runtime's
    /// chunk_tokens (chunks already cached are skipped). When not all fit,
    /// the longest prefix that fits is kept. `tokens` of the result: the
    /// leading tokens cached after the call. A model with recurrent layers
    /// also keeps the state the view carries ([`KvView::with_state`]) as
    /// the snapshot at the request's end.
    pub fn store<'r>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        view: &KvView<'_>,
    ) -> Result<KvResult> {
        self.store_views(ns, request, std::slice::from_ref(view))
    }

    /// [`store`](Self::store) from several views that together hold every layer once.
    pub fn store_views<'r>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        views: &[KvView<'_>],
    ) -> Result<KvResult> {
        let raw_views: Vec<sys::kdn_kv_view> = views.iter().map(|v| v.parts.resolve(self)).collect::<Result<_>>()?;
        let req = request.into().raw()?;
        let (ns, ns_len) = ns_arg(ns.as_ref());
        let mut out: sys::kdn_kv_result = init(sys::kdn_kv_result_init);
        // SAFETY: every pointer is valid for the call; the views' memory is
        // borrowed by `views` and only read.
        check(unsafe {
            sys::kdn_kv_store(self.raw(), ns, ns_len, &req, raw_views.as_ptr(), raw_views.len(), &mut out)
        })?;
        Ok(KvResult::from_raw(&out))
    }

    /// Writes the KV of the longest cached prefix of the request into
    /// `view`. `tokens` of the result: its length, 0 on a miss (which is
    /// `Ok`); `covered`: the cached prefix found. A model with recurrent
    /// layers needs the state's memory in the view
    /// ([`KvViewMut::with_state`]; `InvalidArgument` without), and gets the
    /// snapshot at that prefix there.
    pub fn retrieve<'r>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        view: &mut KvViewMut<'_>,
    ) -> Result<KvResult> {
        let raw_view = view.parts.resolve(self)?;
        self.retrieve_raw(ns.as_ref(), &request.into(), std::slice::from_ref(&raw_view))
    }

    /// [`retrieve`](Self::retrieve) into several views that together hold every layer once.
    pub fn retrieve_views<'r>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        views: &mut [KvViewMut<'_>],
    ) -> Result<KvResult> {
        let raw_views: Vec<sys::kdn_kv_view> = views.iter().map(|v| v.parts.resolve(self)).collect::<Result<_>>()?;
        self.retrieve_raw(ns.as_ref(), &request.into(), &raw_views)
    }

    fn retrieve_raw(&self, ns: &[u8], request: &LoadRequest<'_>, views: &[sys::kdn_kv_view]) -> Result<KvResult> {
        let req = request.raw()?;
        let (ns, ns_len) = ns_arg(ns);
        let mut out: sys::kdn_kv_result = init(sys::kdn_kv_result_init);
        // SAFETY: every pointer is valid for the call; the views' memory is
        // exclusively borrowed by the caller's KvViewMuts.
        check(unsafe { sys::kdn_kv_retrieve(self.raw(), ns, ns_len, &req, views.as_ptr(), views.len(), &mut out) })?;
        Ok(KvResult::from_raw(&out))
    }

    /// How many leading tokens of the request are cached, without side
    /// effects (no statistics of hits, no promotion, no change of eviction order).
    pub fn lookup<'r>(&self, ns: impl AsRef<[u8]>, request: impl Into<Request<'r>>) -> Result<Lookup> {
        let req = request.into().raw()?;
        let (ns, ns_len) = ns_arg(ns.as_ref());
        let mut out: sys::kdn_lookup_result = init(sys::kdn_lookup_result_init);
        // SAFETY: one request, one result.
        check(unsafe { sys::kdn_kv_lookup(self.raw(), ns, ns_len, &req, 1, &mut out) })?;
        Lookup::from_raw(&out)
    }

    /// Looks up several requests at once. Each gets its own result: one bad
    /// request fails alone (its `Err`), the others are answered.
    ///
    /// ```
    /// # use kdn::{DType, ModelSpec, Request, Runtime, RuntimeOptions, Status};
    /// # let rt = Runtime::new(&RuntimeOptions::default())?;
    /// # let model = rt.model(&ModelSpec::new(1, 1, 8, DType::F16, "m"))?;
    /// let found = model.lookup_batch("ns", &[Request::from(&[1, 2, 3]), Request::from(&[4, -5])])?;
    /// assert_eq!(found[0].as_ref().unwrap().cached_tokens, 0);
    /// assert_eq!(found[1].as_ref().unwrap_err().status(), Status::InvalidArgument); // a negative id
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn lookup_batch(&self, ns: impl AsRef<[u8]>, requests: &[Request<'_>]) -> Result<Vec<Result<Lookup>>> {
        // A request the binding refuses (a u32 id above i32::MAX) fails
        // alone too: the others go to C, their results come back in place.
        let mut answers: Vec<Result<Lookup>> = Vec::with_capacity(requests.len());
        let mut reqs: Vec<sys::kdn_request> = Vec::with_capacity(requests.len());
        for request in requests {
            match request.raw() {
                Ok(r) => {
                    reqs.push(r);
                    answers.push(Ok(Lookup::EMPTY)); // replaced below
                }
                Err(e) => answers.push(Err(e)),
            }
        }
        if reqs.is_empty() {
            return Ok(answers); // (the C call refuses an empty batch)
        }
        let mut out: Vec<sys::kdn_lookup_result> = (0..reqs.len()).map(|_| init(sys::kdn_lookup_result_init)).collect();
        let (ns, ns_len) = ns_arg(ns.as_ref());
        // SAFETY: as many results as requests.
        check(unsafe { sys::kdn_kv_lookup(self.raw(), ns, ns_len, reqs.as_ptr(), reqs.len(), out.as_mut_ptr()) })?;
        let mut results = out.iter().map(Lookup::from_raw);
        for answer in answers.iter_mut().filter(|a| a.is_ok()) {
            *answer = results.next().expect("one result per request sent");
        }
        Ok(answers)
    }

    /// Starts loading the cached prefix of the request into `buffer`, laid
    /// out as `spec` says, layer by layer in the background. The op owns the
    /// buffer until it ends and gives it back ([`Op::into_buffer`],
    /// [`Op::finish`]). A miss is a load of 0 tokens. The request (its
    /// tokens and salt) is borrowed for the call only: kdn copies it.
    ///
    /// ```
    /// # use kdn::{DType, KvView, ModelSpec, Runtime, RuntimeOptions, ViewSpec};
    /// # let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(2))?;
    /// # let model = rt.model(&ModelSpec::new(3, 1, 2, DType::F32, "m"))?;
    /// let tokens = [5, 6, 7, 8];
    /// let kv: Vec<f32> = (0..4 * 3 * 2 * 2).map(|i| i as f32).collect();
    /// model.store("ns", &tokens, &KvView::canonical(&kv, DType::F32))?;
    /// let op = model.load_async("ns", &tokens, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32))?;
    /// op.wait_layer(0, None)?; // layer 0 is there; the others may still be coming
    /// let (result, loaded) = op.finish()?;
    /// assert_eq!((result.tokens, loaded), (4, kv));
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn load_async<'r, B: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        buffer: B,
        spec: &ViewSpec,
    ) -> Result<Op<B>> {
        Op::start(self, OpKind::Load, ns.as_ref(), &request.into(), buffer, std::slice::from_ref(spec))
    }

    /// [`load_async`](Self::load_async) into several views over the one buffer.
    pub fn load_async_views<'r, B: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        buffer: B,
        specs: &[ViewSpec],
    ) -> Result<Op<B>> {
        Op::start(self, OpKind::Load, ns.as_ref(), &request.into(), buffer, specs)
    }

    /// Starts a save of the request's KV from `buffer` (laid out as `spec`
    /// says): call [`Op::layer_ready`] for each model layer as it becomes
    /// final (the buffer is then read in the background), then wait.
    pub fn save_async<'r, B: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        buffer: B,
        spec: &ViewSpec,
    ) -> Result<Op<B>> {
        Op::start(
            self,
            OpKind::Save,
            ns.as_ref(),
            &LoadRequest::from(request.into()),
            buffer,
            std::slice::from_ref(spec),
        )
    }

    /// [`save_async`](Self::save_async) from several views over the one buffer.
    pub fn save_async_views<'r, B: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        buffer: B,
        specs: &[ViewSpec],
    ) -> Result<Op<B>> {
        Op::start(self, OpKind::Save, ns.as_ref(), &LoadRequest::from(request.into()), buffer, specs)
    }

    /// [`load_async`](Self::load_async) of a model with recurrent layers
    /// (since 1.12): the op also owns `state`, one buffer per recurrent
    /// layer (each at least [`state_bytes`](Self::state_bytes) long;
    /// `InvalidArgument` otherwise, before the load starts), and writes the
    /// snapshot at the prefix it loads into each one's first `state_bytes`
    /// bytes. [`Op::finish_with_state`] and [`Op::into_buffers`] give both back.
    ///
    /// ```
    /// # use kdn::{DType, KvView, ModelSpec, Runtime, RuntimeOptions, ViewSpec};
    /// # let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(2))?;
    /// let mut spec = ModelSpec::new(1, 1, 2, DType::F32, "hybrid");
    /// (spec.num_state_layers, spec.state_bytes) = (2, 4); // two recurrent layers of 4 bytes
    /// let model = rt.model(&spec)?;
    /// let tokens = [5, 6, 7, 8];
    /// let kv: Vec<f32> = (0..16).map(|i| i as f32).collect();
    /// let (s0, s1) = ([1u8, 2, 3, 4], [5u8, 6, 7, 8]);
    /// model.store("ns", &tokens, &KvView::canonical(&kv, DType::F32).with_state(&[&s0[..], &s1[..]]))?;
    /// let state = vec![vec![0u8; 4], vec![0u8; 4]];
    /// let op = model.load_async_with_state("ns", &tokens, vec![0f32; 16], &ViewSpec::canonical(DType::F32), state)?;
    /// let (result, loaded, state) = op.finish_with_state()?;
    /// assert_eq!((result.tokens, loaded, state), (4, kv, vec![s0.to_vec(), s1.to_vec()]));
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn load_async_with_state<'r, B: KvBuffer, S: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        buffer: B,
        spec: &ViewSpec,
        state: Vec<S>,
    ) -> Result<Op<B, S>> {
        Op::start_with_state(
            self,
            OpKind::Load,
            ns.as_ref(),
            &request.into(),
            buffer,
            std::slice::from_ref(spec),
            state,
        )
    }

    /// [`load_async_with_state`](Self::load_async_with_state) into several
    /// views over the one buffer (the state goes with the first).
    pub fn load_async_views_with_state<'r, B: KvBuffer, S: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        buffer: B,
        specs: &[ViewSpec],
        state: Vec<S>,
    ) -> Result<Op<B, S>> {
        Op::start_with_state(self, OpKind::Load, ns.as_ref(), &request.into(), buffer, specs, state)
    }

    /// [`save_async`](Self::save_async) of a model with recurrent layers
    /// (since 1.12): the op also owns `state`, the recurrent layers' state
    /// after the request's last token (one buffer per recurrent layer, each
    /// at least [`state_bytes`](Self::state_bytes) long; `InvalidArgument`
    /// otherwise, before the save starts), stored as the snapshot at the
    /// request's end once every layer is ready.
    pub fn save_async_with_state<'r, B: KvBuffer, S: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        buffer: B,
        spec: &ViewSpec,
        state: Vec<S>,
    ) -> Result<Op<B, S>> {
        let request = LoadRequest::from(request.into());
        Op::start_with_state(self, OpKind::Save, ns.as_ref(), &request, buffer, std::slice::from_ref(spec), state)
    }

    /// [`save_async_with_state`](Self::save_async_with_state) from several
    /// views over the one buffer (the state goes with the first).
    pub fn save_async_views_with_state<'r, B: KvBuffer, S: KvBuffer>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        buffer: B,
        specs: &[ViewSpec],
        state: Vec<S>,
    ) -> Result<Op<B, S>> {
        Op::start_with_state(self, OpKind::Save, ns.as_ref(), &LoadRequest::from(request.into()), buffer, specs, state)
    }

    /// [`load_async`](Self::load_async) into memory the op does not own:
    /// any views (per-layer allocations, paged block tables), for engines
    /// that manage their KV memory themselves. A model with recurrent layers
    /// needs the state's memory in one view ([`KvViewMut::with_state`]).
    ///
    /// # Safety
    /// The views' memory (their recurrent state's too) must stay valid, and must not be read or written
    /// otherwise, until the returned op is dropped (or consumed by
    /// [`Op::into_buffer`] or [`Op::finish`]). Leaking the op
    /// (`std::mem::forget`) leaves the library writing into the memory at
    /// any time later: the memory must then never be freed.
    pub unsafe fn load_async_unchecked<'r>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<LoadRequest<'r>>,
        views: &[KvViewMut<'_>],
    ) -> Result<Op<()>> {
        let raw: Vec<sys::kdn_kv_view> = views.iter().map(|v| v.parts.resolve(self)).collect::<Result<_>>()?;
        // SAFETY: as the caller promised.
        let op = unsafe { crate::op::start_raw(self, OpKind::Load, ns.as_ref(), &request.into(), &raw)? };
        Ok(Op::borrowed(op, self))
    }

    /// [`save_async`](Self::save_async) from memory the op does not own
    /// (a model with recurrent layers: the state in one view, [`KvView::with_state`]).
    ///
    /// # Safety
    /// The views' memory must stay valid, and each layer unchanged from its
    /// [`Op::layer_ready`] on (the recurrent state: from the call on),
    /// until the returned op is dropped or consumed
    /// (see [`load_async_unchecked`](Self::load_async_unchecked)).
    pub unsafe fn save_async_unchecked<'r>(
        &self,
        ns: impl AsRef<[u8]>,
        request: impl Into<Request<'r>>,
        views: &[KvView<'_>],
    ) -> Result<Op<()>> {
        let raw: Vec<sys::kdn_kv_view> = views.iter().map(|v| v.parts.resolve(self)).collect::<Result<_>>()?;
        // SAFETY: as the caller promised.
        let request = LoadRequest::from(request.into());
        let op = unsafe { crate::op::start_raw(self, OpKind::Save, ns.as_ref(), &request, &raw)? };
        Ok(Op::borrowed(op, self))
    }

    /// The knowledge items (named documents) of namespace `ns`.
    pub fn knowledge<'m>(&'m self, ns: &'m str) -> crate::Knowledge<'m> {
        crate::Knowledge::new(self, ns.as_bytes())
    }

    /// Releases the model now (the same as dropping it).
    pub fn close(self) {}

    /// The C handle, for calls this crate does not wrap (kdn-sys). Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::kdn_model {
        self.raw.as_ptr()
    }

    pub(crate) fn row(&self) -> u64 {
        self.row
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the last call on the handle; `keep` drops after it.
        unsafe { sys::kdn_model_destroy(self.raw.as_ptr()) }
    }
}
