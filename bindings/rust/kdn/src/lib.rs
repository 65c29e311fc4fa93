// SPDX-License-Identifier: Apache-2.0
//! # kdn: the KV-cache runtime, from Rust
//!
//! A safe API over kdn's C ABI (`kdn.h`, through the [`kdn_sys`] crate):
//! a [`Runtime`] holds the store and its tiers (host, device, disk, remote,
//! redis;
//! codecs; eviction); a [`Model`] names the shape of a model's KV; KV moves
//! between the caller's memory and the store without copies, described by
//! [`KvView`]s (read) and [`KvViewMut`]s (write) over the caller's slices.
//!
//! ```
//! use kdn::{DType, KvView, KvViewMut, ModelSpec, Runtime, RuntimeOptions, TierConfig};
//!
//! let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(16).with_tier(TierConfig::host(64 << 20)))?;
//! let model = rt.model(&ModelSpec::new(4, 2, 8, DType::F32, "my-model-v1"))?;
//! let tokens: Vec<u32> = (100..132).collect(); // token ids, as a tokenizer gives them (or i32)
//! let kv = vec![1.5f32; tokens.len() * 4 * 2 * 2 * 8]; // [layer][k|v][token][head][dim]
//! model.store("tenant-a", &tokens, &KvView::canonical(&kv, DType::F32))?;
//!
//! assert_eq!(model.lookup("tenant-a", &tokens)?.cached_tokens, 32);
//! let mut out = vec![0f32; kv.len()];
//! let result = model.retrieve("tenant-a", &tokens, &mut KvViewMut::canonical(&mut out, DType::F32))?;
//! assert_eq!(result.tokens, 32);
//! assert_eq!(out, kv);
//! # Ok::<(), kdn::Error>(())
//! ```
//!
//! ## Errors
//! Every fallible call returns [`Result<T>`](Result); an [`Error`] has a
//! [`Status`] (open: [`Status::Unknown`] for codes from a newer library),
//! the library's message, and a [`Family`]: fix the call, retry, or other.
//! A cache miss is never an error: it is `Ok` with 0 tokens.
//!
//! ## Resources and threads
//! Handles are released by `Drop` (or a consuming `close`). [`Runtime`],
//! [`Model`] and [`Op`] are `Send + Sync`, as `kdn.h` says each handle is
//! thread-safe; models and ops keep their runtime alive, so any drop order
//! is fine. An asynchronous [`Op`] owns its KV buffer until it ends
//! ([`Model::load_async`]); engines that manage their own KV memory use the
//! `unsafe` [`Model::load_async_unchecked`] and [`Model::save_async_unchecked`].
//!
//! ## Salts
//! A request may carry a salt ([`Request::with_salt`], since 1.13), as
//! vLLM's `cache_salt`: it enters every chunk key, so a salted request hits
//! only KV stored with the same salt, and unsalted KV never answers it (nor
//! salted KV an unsalted one). Lookups, stores, retrieves and the async
//! loads and saves take it; knowledge items and blending have none.
//!
//! ## Quotas
//! A tier may give namespaces quotas ([`TierConfig::quota`], since 1.13):
//! a namespace over its quota in that tier evicts only its own coldest
//! chunks, never another tenant's. [`Runtime::quota_stats`] gives each
//! quota's use and evictions. Remote tiers take none (a kdnd has its own).
//!
//! ## Encryption at rest
//! With master keys ([`RuntimeOptions::encryption_key_file`] or
//! [`RuntimeOptions::encryption_key_env`], since 1.14), every chunk a disk,
//! redis or remote tier sends out of the process is AES-256-GCM encrypted;
//! one that does not decrypt is a miss, counted in
//! [`TierStats::auth_failures`].
//!
//! ## Recurrent layers
//! A model with recurrent layers ([`ModelSpec::num_state_layers`], since
//! 1.12) has a state per recurrent layer: its views carry it
//! ([`KvView::with_state`], [`KvViewMut::with_state`]), borrowed like the
//! KV, and the owned async ops own it ([`Model::load_async_with_state`],
//! [`Model::save_async_with_state`]). A prefix counts only where a store
//! left the state.
//!
//! ## Device memory
//! With a device ([`RuntimeOptions::device`]: a CUDA GPU, or
//! [`DeviceMode::Emulated`], host memory standing in for one), KV views may
//! be in device memory: [`KvViewMut::from_device`] and [`KvView::from_device`]
//! take the engine's raw device pointers (and its [`CudaStream`]), and are
//! `unsafe`, as kdn reads and writes through pointers Rust cannot check.
//!
//! ## Experimental
//! [`Runtime::with_editor`], [`Model::blend`] and (since 1.9)
//! [`Model::match_tokens`] and [`Model::blend_tokens`] wrap the experimental
//! editor, blending and matching calls of `kdn.h` (`KDN_EXPERIMENTAL`): they
//! may change in a minor release.
#![deny(missing_docs)]

mod blend;
mod error;
mod knowledge;
mod model;
mod op;
mod runtime;
mod types;
mod view;

pub use blend::{BlendLayer, BlendOptions, BlendReport, Segment};
pub use error::{Error, Family, Result, Status};
pub use knowledge::{DocumentInfo, Knowledge};
pub use model::{KvResult, LoadRequest, Lookup, Model, ModelSpec, Request, SaltedRequest, TokenId};
pub use op::Op;
pub use runtime::{ChunkInfo, Latency, Quota, QuotaStats, Runtime, RuntimeOptions, Stats, TierConfig, TierStats};
pub use types::{
    version, version_number, CacheKind, DType, DeviceMode, Element, EvictionPolicy, LatencyKind, Layout, MemoryKind,
    OpState, RopeScaling, RopeStyle, TierKind, ABI_VERSION_NUMBER, HEADER_VERSION_NUMBER,
};
pub use view::{as_bytes, as_f32_mut, CudaStream, KvBuffer, KvView, KvViewMut, LayerOffsets, ViewSpec};

/// The raw C ABI, for calls this crate does not wrap.
pub use kdn_sys;

// The handles are Send + Sync exactly as kdn.h's Thread-safety lines say
// (checked at compile time); the views borrow caller memory through raw
// pointers and are neither.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Runtime>();
    send_sync::<Model>();
    send_sync::<Op<Vec<u8>>>();
    send_sync::<Op<Vec<f32>>>();
    send_sync::<Op<Vec<f32>, Vec<u32>>>();
    send_sync::<Error>();
};
