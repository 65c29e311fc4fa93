// SPDX-License-Identifier: Apache-2.0
//! The runtime: the store and its tiers, statistics, and the editor.

use crate::error::{check, Error, Result, Status};
use crate::model::{Model, ModelSpec};
use crate::types::{
    check_library_feature, check_library_version, init, millis_ceil, version_number, DType, DeviceMode, EvictionPolicy,
    LatencyKind, TierKind,
};
use kdn_sys as sys;
use std::ffi::{c_char, c_int, c_void, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One tier of a runtime's store (`kdn_tier_config`). Build one with
/// [`TierConfig::host`], [`disk`](TierConfig::disk), [`device`](TierConfig::device),
/// [`remote`](TierConfig::remote) or [`redis`](TierConfig::redis) and adjust it
/// with the `with_*` methods:
///
/// ```
/// use kdn::{EvictionPolicy, TierConfig};
/// let disk = TierConfig::disk("/tmp/kdn-doc-cache", 1 << 30)
///     .with_codec("zstd")
///     .with_policy(EvictionPolicy::S3Fifo)
///     .with_watermarks(0.9, 0.8);
/// assert_eq!(disk.capacity_bytes, 1 << 30);
/// ```
///
/// With namespace quotas (since 1.13; see [`quota`](TierConfig::quota)):
///
/// ```
/// use kdn::{RuntimeOptions, Runtime, TierConfig};
/// let host = TierConfig::host(1 << 30).quota("tenant-a", 256 << 20).quota("tenant-b", 512 << 20);
/// let rt = Runtime::new(&RuntimeOptions::default().with_tier(host))?;
/// let stats = rt.quota_stats(0)?; // in the order the quotas were given
/// assert_eq!((stats.len(), stats[1].quota_bytes, stats[1].objects), (2, 512 << 20, 0));
/// # Ok::<(), kdn::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    /// What the tier is. Default: host memory.
    pub kind: TierKind,
    /// Capacity in bytes (not 0). Default 1 GiB. Not used by a remote or
    /// redis tier (a redis server's own maxmemory and policy apply).
    pub capacity_bytes: u64,
    /// Disk: the directory (created if absent).
    pub path: Option<PathBuf>,
    /// Eviction policy. Default LRU.
    pub policy: EvictionPolicy,
    /// A put that would cross this fraction of capacity evicts first; 0 = 0.95.
    pub high_watermark: f32,
    /// Eviction goes down to this fraction; 0 = 0.85.
    pub low_watermark: f32,
    /// New chunks are copied to the next tier too.
    pub write_through: bool,
    /// Codec spec ("raw", "zstd", "fp8", "int8", "kivi2", "cachegen", "kdn", ...);
    /// empty: raw for memory tiers, zstd for disk and remote (raw where the
    /// runtime has a CUDA device, since 1.7), kdn:balanced (lossy) for redis.
    pub codec: String,
    /// Remote, redis (since 1.6): quality levels, codec specs finest first
    /// (say `["zstd", "kdn:hifi", "kdn:balanced"]`), at most 8; `codec` must
    /// then be empty. Every chunk is kept at each level; a load whose request
    /// has a TTFT target ([`Request::with_ttft_target`](crate::Request::with_ttft_target))
    /// fetches each chunk at the finest level that arrives in time, and
    /// leaves a chunk to recompute when none would. Empty: one level, `codec`.
    /// Other kinds refuse it ([`Runtime::new`]: `InvalidArgument`).
    pub levels: Vec<String>,
    /// Remote: the kdnd, `"host:port"` or `"unix:/path"`. Redis: one node or
    /// more, `"host:port"` comma-separated (of a cluster, any of its nodes).
    pub address: String,
    /// Remote: a bearer token the node takes. Redis: the password (empty: no AUTH).
    pub token: String,
    /// Remote, redis: deadline of each call to the node; zero: 2 s. Passed
    /// to C in whole milliseconds, rounded up, at most `u32::MAX` ms (since
    /// 1.5; was `timeout_ms: u32`).
    pub timeout: Duration,
    /// Remote over TLS: a PEM file of the certificates to trust.
    pub tls_ca_file: Option<PathBuf>,
    /// Remote over TLS: the name the node's certificate must carry.
    pub tls_server_name: String,
    /// Redis (since 1.3): the ACL user of AUTH; empty: the password alone.
    /// Other kinds refuse it.
    pub user: String,
    /// Redis (since 1.3): the keys expire this long after they are written;
    /// zero: never. Other kinds refuse it. Passed to C in whole milliseconds,
    /// rounded up (since 1.5; was `ttl_ms: u64`).
    pub ttl: Duration,
    /// Namespaces' quotas in this tier (since 1.13), at most 4096, one per
    /// namespace (a second one for the same namespace, an empty namespace:
    /// [`Runtime::new`] fails with `InvalidArgument`). Not for a remote tier
    /// (a kdnd has its own quotas, in its config): `InvalidArgument`. Empty:
    /// none. See [`quota`](Self::quota).
    pub quotas: Vec<Quota>,
}

/// One namespace's quota in a tier (`kdn_quota`, since 1.13):
/// [`TierConfig::quota`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quota {
    /// The namespace, as the KV calls name it (1 to 4096 bytes).
    pub namespace: Vec<u8>,
    /// The most bytes of the tier its chunks may take, counted as the tier
    /// counts its capacity (a memory tier's whole 4 KiB pages per chunk, a
    /// disk tier's encoded bytes). 0: its chunks skip the tier.
    pub bytes: u64,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            kind: TierKind::Host,
            capacity_bytes: 1 << 30,
            path: None,
            policy: EvictionPolicy::Lru,
            high_watermark: 0.0,
            low_watermark: 0.0,
            write_through: false,
            codec: String::new(),
            levels: Vec::new(),
            address: String::new(),
            token: String::new(),
            timeout: Duration::ZERO,
            tls_ca_file: None,
            tls_server_name: String::new(),
            user: String::new(),
            ttl: Duration::ZERO,
            quotas: Vec::new(),
        }
    }
}

impl TierConfig {
    /// A host-memory tier.
    pub fn host(capacity_bytes: u64) -> Self {
        TierConfig { capacity_bytes, ..Default::default() }
    }
    /// A device (GPU) tier; host memory stands in for it without a GPU.
    pub fn device(capacity_bytes: u64) -> Self {
        TierConfig { kind: TierKind::Device, capacity_bytes, ..Default::default() }
    }
    /// A disk tier in `path` (one checksummed file per chunk).
    pub fn disk(path: impl Into<PathBuf>, capacity_bytes: u64) -> Self {
        TierConfig { kind: TierKind::Disk, capacity_bytes, path: Some(path.into()), ..Default::default() }
    }
    /// A remote tier: a kdnd node at `address` with a bearer `token`. Reads the
    /// node cannot answer in time are misses; writes are queued.
    pub fn remote(address: impl Into<String>, token: impl Into<String>) -> Self {
        TierConfig { kind: TierKind::Remote, address: address.into(), token: token.into(), ..Default::default() }
    }
    /// A redis tier (since 1.3): Redis, Redis Cluster or Valkey at `address`
    /// (`"host:port"`, comma-separated seeds) with a `password` (empty: no
    /// AUTH). Reads the server cannot answer in time are misses; a malformed
    /// address or a refused AUTH fails [`Runtime::new`].
    pub fn redis(address: impl Into<String>, password: impl Into<String>) -> Self {
        TierConfig { kind: TierKind::Redis, address: address.into(), token: password.into(), ..Default::default() }
    }
    /// With a codec spec.
    pub fn with_codec(mut self, codec: impl Into<String>) -> Self {
        self.codec = codec.into();
        self
    }
    /// With an eviction policy.
    pub fn with_policy(mut self, policy: EvictionPolicy) -> Self {
        self.policy = policy;
        self
    }
    /// With watermarks (fractions of capacity).
    pub fn with_watermarks(mut self, high: f32, low: f32) -> Self {
        self.high_watermark = high;
        self.low_watermark = low;
        self
    }
    /// Copy new chunks to the next tier too.
    pub fn with_write_through(mut self, on: bool) -> Self {
        self.write_through = on;
        self
    }
    /// Remote, redis: quality levels, finest first (see [`levels`](Self::levels)).
    pub fn with_levels<S: Into<String>>(mut self, levels: impl IntoIterator<Item = S>) -> Self {
        self.levels = levels.into_iter().map(Into::into).collect();
        self
    }
    /// Remote, redis: the per-call deadline (see [`timeout`](Self::timeout)).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// Redis: the ACL user of AUTH (needs a password).
    pub fn with_user(mut self, user: impl Into<String>) -> Self {
        self.user = user.into();
        self
    }
    /// Redis: the keys expire `ttl` after they are written; zero: never
    /// (see [`ttl`](Self::ttl)).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// With a quota for namespace `ns` (since 1.13; `kdn_tier_config.quotas`,
    /// docs/security.md, "Quotas"): its chunks take at most `bytes` of this
    /// tier, counted as the tier counts its capacity (a memory tier: whole
    /// 4 KiB pages per chunk). Over it, a put of `ns` evicts `ns`'s own
    /// coldest chunks (by the tier's policy, demoted to the next tier as any
    /// victim), never another namespace's; a chunk larger than the quota
    /// skips the tier. When the tier itself is full, chunks of namespaces
    /// without a quota go first: while the quotas add up to no more than the
    /// tier, each quota'd namespace keeps up to its quota whatever the others
    /// do. Use and evictions: [`Runtime::quota_stats`], in the order of the
    /// calls. Refused by [`Runtime::new`] (`InvalidArgument`): a namespace
    /// given twice or empty, a remote tier. A libkdn older than 1.13 refuses
    /// a tier with quotas (`Version`).
    pub fn quota(mut self, ns: impl AsRef<[u8]>, bytes: u64) -> Self {
        self.quotas.push(Quota { namespace: ns.as_ref().to_vec(), bytes });
        self
    }
    /// Remote: TLS with a CA file and (empty: the address's host) a server name.
    pub fn with_tls(mut self, ca_file: impl Into<PathBuf>, server_name: impl Into<String>) -> Self {
        self.tls_ca_file = Some(ca_file.into());
        self.tls_server_name = server_name.into();
        self
    }

    /// The C struct; its strings borrow from `self` and from `parts` (the
    /// levels joined as C takes them, the quotas' array), which must outlive
    /// it.
    fn raw(&self, parts: &mut RawTierParts) -> Result<sys::kdn_tier_config> {
        let mut c: sys::kdn_tier_config = init(sys::kdn_tier_config_init);
        let levels = &mut parts.levels;
        // ';' separates the levels in C: one inside a level would split it,
        // and a lone empty level would join to "", which C reads as none.
        if let Some(level) = self.levels.iter().find(|l| l.contains(';') || l.is_empty()) {
            return Err(Error::invalid(format!(
                "tier levels: {level:?} is empty or contains ';', which separates levels"
            )));
        }
        *levels = self.levels.join(";");
        (c.levels, c.levels_len) = c_str(levels.as_bytes());
        c.kind = self.kind.raw();
        c.capacity_bytes = self.capacity_bytes;
        (c.path, c.path_len) = c_str(self.path.as_deref().map(|p| p.as_os_str().as_bytes()).unwrap_or_default());
        c.policy = self.policy.raw();
        c.high_watermark = self.high_watermark;
        c.low_watermark = self.low_watermark;
        c.write_through = self.write_through as u32;
        (c.codec, c.codec_len) = c_str(self.codec.as_bytes());
        (c.address, c.address_len) = c_str(self.address.as_bytes());
        (c.token, c.token_len) = c_str(self.token.as_bytes());
        c.timeout_ms = millis_ceil(self.timeout, u32::MAX.into()) as u32;
        (c.tls_ca_file, c.tls_ca_file_len) =
            c_str(self.tls_ca_file.as_deref().map(|p| p.as_os_str().as_bytes()).unwrap_or_default());
        (c.tls_server_name, c.tls_server_name_len) = c_str(self.tls_server_name.as_bytes());
        (c.user, c.user_len) = c_str(self.user.as_bytes());
        c.ttl_ms = millis_ceil(self.ttl, u64::MAX);
        // Each quota's namespace borrows from `self`; the array is `parts`'s
        // (its heap buffer stays put when `parts` moves).
        parts.quotas = self
            .quotas
            .iter()
            .map(|q| {
                let mut raw: sys::kdn_quota = init(sys::kdn_quota_init);
                (raw.ns, raw.ns_len) = c_str(&q.namespace);
                raw.bytes = q.bytes;
                raw
            })
            .collect();
        if !parts.quotas.is_empty() {
            (c.quotas, c.num_quotas) = (parts.quotas.as_ptr(), parts.quotas.len());
        }
        Ok(c)
    }
}

/// What a tier's C struct points into besides the [`TierConfig`]: kept
/// alive across `kdn_runtime_create`.
#[derive(Default)]
struct RawTierParts {
    levels: String,
    quotas: Vec<sys::kdn_quota>,
}

/// A string or path for C: (NULL, 0) when empty.
fn c_str(b: &[u8]) -> (*const c_char, usize) {
    if b.is_empty() {
        (ptr::null(), 0)
    } else {
        (b.as_ptr() as *const c_char, b.len())
    }
}

/// A path or a variable's name for C, which takes it up to a NUL: refused
/// (`InvalidArgument`) when empty (it would reach C as NULL, none at all) or
/// holding a NUL (C would read another name) or one of `also_bad`.
fn c_name(field: &str, what: &str, s: &OsStr, also_bad: &[u8]) -> Result<(*const c_char, usize)> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(Error::invalid(format!("{field} is an empty {what}")));
    }
    if let Some(&c) = b.iter().find(|&&c| c == 0 || also_bad.contains(&c)) {
        return Err(Error::invalid(format!("{field}: the {what} {s:?} holds {:?}", c as char)));
    }
    Ok(c_str(b))
}

/// How to create a runtime (`kdn_runtime_options`). The default is the
/// library's: chunks of 256 tokens, one host tier of 1 GiB.
///
/// ```
/// use kdn::{RuntimeOptions, TierConfig};
/// let options = RuntimeOptions::default().with_chunk_tokens(16).with_tier(TierConfig::host(16 << 20));
/// assert_eq!(options.tiers.len(), 1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeOptions {
    /// Tokens per stored chunk. Default 256.
    pub chunk_tokens: u32,
    /// Host tier capacity when `tiers` is empty. Default 1 GiB.
    pub host_capacity_bytes: u64,
    /// Seed of every key hash; runtimes that share KV must share it.
    pub hash_seed: u64,
    /// The tiers, highest (fastest) first; empty: one host tier.
    pub tiers: Vec<TierConfig>,
    /// Background load and save threads; 0 = 2, at most 64.
    pub worker_threads: u32,
    /// The GPU KV is delivered to (since 1.5): for KV views in device memory
    /// and device tiers. Default [`DeviceMode::Auto`].
    pub device: DeviceMode,
    /// The CUDA device of [`DeviceMode::Auto`] and [`DeviceMode::Cuda`]
    /// (since 1.5); default 0.
    pub device_ordinal: i32,
    /// Since 1.7. `false` (the default): once the engine has reported its
    /// prefill time ([`Model::report_prefill`]), a load leaves to recompute
    /// the cached chunks whose tier delivers them slower than prefill would
    /// compute them ([`TierStats::delivery_ns_per_token`]): its prefix ends
    /// before them, counted in [`Stats::recompute_tokens`]. `true`: load
    /// every cached chunk, however slow its tier.
    pub load_slower_than_prefill: bool,
    /// Since 1.8: a file holding the deployment's secret (at least 32
    /// bytes, readable by its owner only, e.g. `head -c 32 /dev/urandom`):
    /// every chunk a disk or redis tier stores is sealed with it, and a chunk
    /// read back counts only if sealed with it (any other is a miss, counted
    /// in [`TierStats::auth_failures`], and deleted). Runtimes sharing such a
    /// tier share the secret. A file that cannot be read, is open to others
    /// or is too short: `InvalidArgument`. `None`: tiers serve whatever they
    /// hold.
    pub secret_file: Option<PathBuf>,
    /// Since 1.14: encryption at rest (docs/security.md), with master keys
    /// from this file: one key per line as 64 hex digits (`openssl rand -hex
    /// 32`), readable by the service only (mode 600, or 640); the first key
    /// encrypts, every one decrypts (rotation: put the new key first, keep
    /// the old ones while their chunks matter). Every chunk a disk, redis or
    /// remote tier sends out of the process is then encrypted with
    /// AES-256-GCM under its namespace's key (HKDF-SHA256 of the master key)
    /// and decrypted when read back; one that does not decrypt (another key,
    /// damaged or forged bytes) is a miss, counted in
    /// [`TierStats::auth_failures`]. Runtimes sharing such a tier share the
    /// keys. At most one of this and
    /// [`encryption_key_env`](Self::encryption_key_env). [`Runtime::new`]
    /// refuses with `InvalidArgument` (its message never holds a key) a file
    /// that cannot be read, is open to others or holds a line that is not a
    /// key, an empty path, a path with a NUL and both sources at once; a
    /// libkdn older than 1.14 with `Version`. `None` (and no
    /// `encryption_key_env`): no encryption, and an encrypted chunk read back
    /// is such a miss.
    pub encryption_key_file: Option<PathBuf>,
    /// Since 1.14: the same master keys from the environment variable of this
    /// name (the variable's NAME, not the keys; its value as the file's
    /// text: one key per line), read when [`Runtime::new`] runs. A variable
    /// that is not set or holds a line that is not a key, an empty name, a
    /// name with a NUL or '=': `InvalidArgument`; with
    /// [`encryption_key_file`](Self::encryption_key_file) too:
    /// `InvalidArgument`; a libkdn older than 1.14: `Version`.
    pub encryption_key_env: Option<OsString>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            chunk_tokens: 256,
            host_capacity_bytes: 1 << 30,
            hash_seed: 0,
            tiers: Vec::new(),
            worker_threads: 0,
            device: DeviceMode::Auto,
            device_ordinal: 0,
            load_slower_than_prefill: false,
            secret_file: None,
            encryption_key_file: None,
            encryption_key_env: None,
        }
    }
}

impl RuntimeOptions {
    /// With chunks of `n` tokens.
    pub fn with_chunk_tokens(mut self, n: u32) -> Self {
        self.chunk_tokens = n;
        self
    }
    /// With one more tier (below those already given).
    pub fn with_tier(mut self, tier: TierConfig) -> Self {
        self.tiers.push(tier);
        self
    }
    /// With a hash seed.
    pub fn with_hash_seed(mut self, seed: u64) -> Self {
        self.hash_seed = seed;
        self
    }
    /// With `n` background threads.
    pub fn with_worker_threads(mut self, n: u32) -> Self {
        self.worker_threads = n;
        self
    }
    /// With a device mode (see [`device`](Self::device)).
    pub fn with_device(mut self, device: DeviceMode) -> Self {
        self.device = device;
        self
    }
    /// With a CUDA device ordinal (see [`device_ordinal`](Self::device_ordinal)).
    pub fn with_device_ordinal(mut self, ordinal: i32) -> Self {
        self.device_ordinal = ordinal;
        self
    }
    /// Whether loads take chunks slower than prefill (see
    /// [`load_slower_than_prefill`](Self::load_slower_than_prefill)).
    pub fn with_load_slower_than_prefill(mut self, on: bool) -> Self {
        self.load_slower_than_prefill = on;
        self
    }
    /// With the deployment's secret in `path` (see [`secret_file`](Self::secret_file)).
    pub fn with_secret_file(mut self, path: impl AsRef<Path>) -> Self {
        self.secret_file = Some(path.as_ref().to_path_buf());
        self
    }
    /// With encryption at rest, the master keys in the file at `path` (see
    /// [`encryption_key_file`](Self::encryption_key_file); since 1.14).
    ///
    /// ```no_run
    /// use kdn::{Runtime, RuntimeOptions, TierConfig};
    /// // keys: `openssl rand -hex 32 > /etc/kdn/keys && chmod 600 /etc/kdn/keys`
    /// let options = RuntimeOptions::default()
    ///     .with_tier(TierConfig::disk("/var/cache/kdn", 64 << 30))
    ///     .with_encryption_key_file("/etc/kdn/keys");
    /// let rt = Runtime::new(&options)?; // the disk tier's chunks are AES-256-GCM encrypted
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn with_encryption_key_file(mut self, path: impl AsRef<Path>) -> Self {
        self.encryption_key_file = Some(path.as_ref().to_path_buf());
        self
    }
    /// With encryption at rest, the master keys in the environment variable
    /// named `name` (see [`encryption_key_env`](Self::encryption_key_env);
    /// since 1.14).
    pub fn with_encryption_key_env(mut self, name: impl AsRef<OsStr>) -> Self {
        self.encryption_key_env = Some(name.as_ref().to_os_string());
        self
    }
}

/// A stored chunk, as an editor sees it (`kdn_chunk_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkInfo {
    /// The model's layers.
    pub num_layers: u32,
    /// KV heads.
    pub num_kv_heads: u32,
    /// Dimensions per head.
    pub head_dim: u32,
    /// Tokens in the chunk.
    pub num_tokens: u32,
    /// The model's dtype.
    pub dtype: DType,
    /// Position of the chunk's first token; `None`: position-free (a knowledge item's).
    pub first_position: Option<u64>,
    /// The model's 32-byte identity ([`Model::fingerprint`]).
    pub model_fingerprint: [u8; 32],
}

type EditFn = dyn FnMut(&ChunkInfo, &mut [u8]) -> Result<bool> + Send;

/// What an editor callback is kept in; its address is the C `user` pointer.
pub(crate) struct EditorSlot {
    edit: Mutex<Box<EditFn>>,
}

/// Keeps an editor alive while any handle of its runtime is.
pub(crate) type Keep = Option<Arc<EditorSlot>>;

/// The `kdn_edit_fn` of every Rust editor: runs the closure behind `user`.
/// A panic is caught here (unwinding into C would abort) and becomes
/// `KDN_ERR_INTERNAL`; the library then keeps the chunk as it was.
unsafe extern "C" fn edit_shim(
    user: *mut c_void,
    info: *const sys::kdn_chunk_info,
    kv: *mut c_void,
    kv_bytes: usize,
    out_changed: *mut c_int,
) -> sys::kdn_status {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `user` is the EditorSlot the runtime's handles keep alive;
        // info and kv are valid for the call (kdn.h).
        let slot = unsafe { &*(user as *const EditorSlot) };
        // Only the bytes the library filled (an older library's struct may
        // be shorter than this crate's); the rest stay zero.
        let info = unsafe {
            let mut copy: sys::kdn_chunk_info = std::mem::zeroed();
            let n = ((*info).filled_size as usize).min(std::mem::size_of::<sys::kdn_chunk_info>());
            std::ptr::copy_nonoverlapping(info as *const u8, &mut copy as *mut _ as *mut u8, n);
            copy
        };
        let kv: &mut [u8] =
            if kv_bytes == 0 { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(kv as *mut u8, kv_bytes) } };
        let info = ChunkInfo {
            num_layers: info.num_layers,
            num_kv_heads: info.num_kv_heads,
            head_dim: info.head_dim,
            num_tokens: info.num_tokens,
            dtype: DType::from_raw(info.dtype),
            first_position: u64::try_from(info.first_position).ok(),
            model_fingerprint: info.model_fingerprint,
        };
        // A closure that panicked before is still called: the lock's poison
        // only says it did.
        let mut edit = slot.edit.lock().unwrap_or_else(|e| e.into_inner());
        (edit)(&info, kv)
    }));
    match outcome {
        Ok(Ok(changed)) => {
            // SAFETY: out_changed is valid for the call.
            unsafe { *out_changed = changed as c_int };
            sys::kdn_status_code_KDN_OK
        }
        Ok(Err(e)) if e.code() < 0 => e.code(),
        _ => sys::kdn_status_code_KDN_ERR_INTERNAL,
    }
}

/// A runtime: the store and its tiers (`kdn_runtime`). Models and ops made
/// from it keep it alive, so it may be dropped before them.
///
/// Thread-safety (kdn.h): every call may come from any thread at once, so a
/// `Runtime` is `Send` and `Sync`; share it with `Arc`.
///
/// ```
/// use kdn::{DType, ModelSpec, Runtime, RuntimeOptions, TierConfig};
/// let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(16).with_tier(TierConfig::host(16 << 20)))?;
/// let model = rt.model(&ModelSpec::new(2, 1, 4, DType::F32, "doc-model"))?;
/// assert_eq!(model.kv_bytes_per_token(), 2 * 2 * 4 * 4);
/// assert_eq!(rt.stats()?.capacity_bytes, 16 << 20);
/// # Ok::<(), kdn::Error>(())
/// ```
///
/// A closed runtime cannot be used: [`close`](Runtime::close) takes it by value.
///
/// ```compile_fail,E0382
/// let rt = kdn::Runtime::new(&kdn::RuntimeOptions::default()).unwrap();
/// rt.close();
/// rt.stats(); // error[E0382]: borrow of moved value: `rt`
/// ```
pub struct Runtime {
    raw: NonNull<sys::kdn_runtime>,
    keep: Keep,
}

// SAFETY: kdn.h: "every function taking a kdn_runtime may be called from any
// number of threads at once"; destroy is only called from Drop (by value).
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

impl Runtime {
    /// Creates a runtime.
    pub fn new(options: &RuntimeOptions) -> Result<Runtime> {
        Self::create(options, None)
    }

    /// Creates a runtime whose chunks pass through `edit` after they are
    /// stored, before they reach the lower tiers (offline KV editing;
    /// experimental in kdn.h).
    ///
    /// `edit(info, kv)` gets the chunk's KV in the canonical layout
    /// `[layer][k|v][token][kv_head][head_dim]` (`kv` in the model's dtype),
    /// rewrites it in place and returns `Ok(true)`; `Ok(false)` keeps it as
    /// it was, and so does an error (its status goes back to kdn) or a panic
    /// (caught, reported as [`Status::Internal`]). It runs on the runtime's
    /// own mover thread, one chunk at a time, and must not call kdn
    /// (those calls fail with `InvalidArgument` there).
    ///
    /// ```
    /// use kdn::{DType, KvView, ModelSpec, Runtime, RuntimeOptions};
    /// let rt = Runtime::with_editor(&RuntimeOptions::default().with_chunk_tokens(4), |info, kv| {
    ///     // 1 layer, K and V, 1 head of 2 dims, f32
    ///     assert_eq!(kv.len(), info.num_tokens as usize * 2 * 2 * 4);
    ///     kv.fill(0);
    ///     Ok(true)
    /// })?;
    /// let model = rt.model(&ModelSpec::new(1, 1, 2, DType::F32, "edited"))?;
    /// model.store("ns", &[1, 2, 3, 4], &KvView::canonical(&[1.0f32; 16], DType::F32))?;
    /// # Ok::<(), kdn::Error>(())
    /// ```
    pub fn with_editor<F>(options: &RuntimeOptions, edit: F) -> Result<Runtime>
    where
        F: FnMut(&ChunkInfo, &mut [u8]) -> Result<bool> + Send + 'static,
    {
        Self::create(options, Some(Arc::new(EditorSlot { edit: Mutex::new(Box::new(edit)) })))
    }

    fn create(options: &RuntimeOptions, keep: Keep) -> Result<Runtime> {
        check_library_version(version_number())?;
        let mut parts: Vec<RawTierParts> = options.tiers.iter().map(|_| RawTierParts::default()).collect();
        let tiers: Vec<sys::kdn_tier_config> =
            options.tiers.iter().zip(&mut parts).map(|(t, p)| t.raw(p)).collect::<Result<_>>()?;
        let mut o: sys::kdn_runtime_options = init(sys::kdn_runtime_options_init);
        o.chunk_tokens = options.chunk_tokens;
        o.host_capacity_bytes = options.host_capacity_bytes;
        o.hash_seed = options.hash_seed;
        o.tiers = if tiers.is_empty() { ptr::null() } else { tiers.as_ptr() };
        o.num_tiers = tiers.len();
        o.worker_threads = options.worker_threads;
        o.device = options.device.raw();
        o.device_ordinal = options.device_ordinal;
        o.load_slower_than_prefill = options.load_slower_than_prefill as u32;
        if let Some(path) = &options.secret_file {
            // (an empty path would reach C as NULL: no secret at all)
            if path.as_os_str().is_empty() {
                return Err(Error::invalid("secret_file is an empty path"));
            }
            (o.secret_file, o.secret_file_len) = c_str(path.as_os_str().as_bytes());
        }
        // Since 1.14. An older libkdn would refuse the fields too (unknown
        // bytes set), but without naming the feature.
        if options.encryption_key_file.is_some() || options.encryption_key_env.is_some() {
            check_library_feature(
                version_number(),
                11400,
                "encryption at rest (RuntimeOptions::encryption_key_file, encryption_key_env)",
            )?;
        }
        if let Some(path) = &options.encryption_key_file {
            (o.encryption_key_file, o.encryption_key_file_len) =
                c_name("encryption_key_file", "path", path.as_os_str(), b"")?;
        }
        if let Some(name) = &options.encryption_key_env {
            (o.encryption_key_env, o.encryption_key_env_len) = c_name("encryption_key_env", "name", name, b"=")?;
        }
        let mut raw = ptr::null_mut();
        // SAFETY: o and its arrays (tiers, parts and what they borrow from
        // `options`) live across the call; the editor slot (if
        // any) lives as long as the runtime's handles (each holds `keep`).
        let status = unsafe {
            match &keep {
                None => sys::kdn_runtime_create(&o, &mut raw),
                Some(slot) => {
                    sys::kdn_runtime_create_with_editor(&o, Some(edit_shim), Arc::as_ptr(slot) as *mut c_void, &mut raw)
                }
            }
        };
        check(status)?;
        let raw = NonNull::new(raw).ok_or_else(|| Error::new(Status::Internal, "kdn_runtime_create gave NULL"))?;
        Ok(Runtime { raw, keep })
    }

    /// Registers a model: every KV call goes through one.
    pub fn model(&self, spec: &ModelSpec) -> Result<Model> {
        Model::create(self.raw.as_ptr(), spec, self.keep.clone())
    }

    /// The runtime's counters.
    pub fn stats(&self) -> Result<Stats> {
        let mut s: sys::kdn_stats = init(sys::kdn_stats_init);
        // SAFETY: a live handle and an initialised output.
        check(unsafe { sys::kdn_runtime_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(Stats::from(&s))
    }

    /// A latency distribution.
    pub fn latency(&self, kind: LatencyKind) -> Result<Latency> {
        let mut l: sys::kdn_latency = init(sys::kdn_latency_init);
        // SAFETY: as above.
        check(unsafe { sys::kdn_runtime_get_latency(self.raw.as_ptr(), kind.raw(), &mut l) })?;
        Ok(Latency {
            count: l.count,
            mean_us: l.mean_us,
            p50_us: l.p50_us,
            p90_us: l.p90_us,
            p99_us: l.p99_us,
            max_us: l.max_us,
        })
    }

    /// How many tiers the store has.
    pub fn tier_count(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: as above.
        check(unsafe { sys::kdn_runtime_get_tier_count(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// Tier `index`'s counters (0 = highest).
    pub fn tier_stats(&self, index: u32) -> Result<TierStats> {
        let mut t: sys::kdn_tier_stats = init(sys::kdn_tier_stats_init);
        // SAFETY: as above.
        check(unsafe { sys::kdn_runtime_get_tier_stats(self.raw.as_ptr(), index, &mut t) })?;
        Ok(TierStats::from(&t))
    }

    /// Every tier's counters, highest first.
    pub fn all_tier_stats(&self) -> Result<Vec<TierStats>> {
        (0..self.tier_count()?).map(|i| self.tier_stats(i)).collect()
    }

    /// The namespace quotas of tier `index` (0 = highest), now (since 1.13;
    /// `kdn_runtime_get_quota_stats`): one per [`TierConfig::quota`], in the
    /// order they were given; empty for a tier without quotas. An index past
    /// the last tier: `InvalidArgument`.
    pub fn quota_stats(&self, tier: u32) -> Result<Vec<QuotaStats>> {
        let mut count = 0usize;
        // SAFETY: a live handle; no array (capacity 0), one count.
        check(unsafe { sys::kdn_runtime_get_quota_stats(self.raw.as_ptr(), tier, ptr::null_mut(), 0, &mut count) })?;
        if count == 0 {
            return Ok(Vec::new());
        }
        // A tier's quotas are fixed at creation, so the count does not change.
        let mut out: Vec<sys::kdn_quota_stats> = (0..count).map(|_| init(sys::kdn_quota_stats_init)).collect();
        // SAFETY: `out` holds `out.len()` initialised structs of this crate's size.
        check(unsafe {
            sys::kdn_runtime_get_quota_stats(self.raw.as_ptr(), tier, out.as_mut_ptr(), out.len(), &mut count)
        })?;
        out.truncate(count);
        Ok(out.iter().map(QuotaStats::from).collect())
    }

    /// Releases this handle now (the same as dropping it). Models and ops
    /// made from it stay usable.
    pub fn close(self) {}

    /// The C handle, for calls this crate does not wrap (kdn-sys). It stays
    /// valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::kdn_runtime {
        self.raw.as_ptr()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // SAFETY: the last use of the handle. `keep` is dropped after this,
        // and models and ops hold their own.
        unsafe { sys::kdn_runtime_destroy(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("raw", &self.raw).field("editor", &self.keep.is_some()).finish()
    }
}

/// A runtime's counters (`kdn_stats`). Counters a library older than this
/// crate does not know are 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests looked up.
    pub lookups: u64,
    /// Retrieves and finished load ops.
    pub retrieves: u64,
    /// Stores and finished save ops.
    pub stores: u64,
    /// Chunks served by loads.
    pub hits: u64,
    /// Loads that stopped short of the request.
    pub misses: u64,
    /// Tokens written by loads.
    pub tokens_served: u64,
    /// Tokens newly stored.
    pub tokens_stored: u64,
    /// KV bytes written by loads.
    pub bytes_served: u64,
    /// KV bytes newly stored.
    pub bytes_stored: u64,
    /// Chunks held now, all tiers.
    pub chunks: u64,
    /// Bytes held now, all tiers.
    pub used_bytes: u64,
    /// Capacity, all tiers.
    pub capacity_bytes: u64,
    /// Chunks evicted from a tier.
    pub evictions: u64,
    /// Chunks served that an editor had rewritten.
    pub edited_served: u64,
    /// Chunks held by loads in progress.
    pub leases_active: u64,
    /// Pins held.
    pub pins_active: u64,
    /// Pins dropped when their TTL ran out.
    pub pins_forced_unpin: u64,
    /// Objects that failed a check on read.
    pub corrupt_detected: u64,
    /// Chunks rewritten by an editor.
    pub edits: u64,
    /// Tokens loads asked for: the hit rate is `tokens_served` / this (since 1.4).
    pub tokens_requested: u64,
    /// Tokens whose prefills engines reported ([`Model::report_prefill`]; since 1.4).
    pub prefill_tokens: u64,
    /// The time those prefills took, ns (since 1.4).
    pub prefill_ns: u64,
    /// Prefill time the loads saved, ns: each load's tokens served x its
    /// model's mean reported prefill time per token then (since 1.4).
    pub ttft_saved_ns: u64,
    /// Tokens served while their model had no report (not in `ttft_saved_ns`; since 1.4).
    pub tokens_served_unpriced: u64,
    /// Time spent in loads (retrieves and load ops), hits and misses, ns (since 1.4).
    pub delivery_ns: u64,
    /// Tokens the looked-up requests covered (since 1.4).
    pub lookup_tokens: u64,
    /// Of them, the leading tokens found cached ([`Lookup::cached_tokens`](crate::Lookup::cached_tokens); since 1.4).
    pub lookup_hit_tokens: u64,
    /// Cached tokens loads left to recompute, their tiers delivering slower
    /// than the engine prefills (since 1.7;
    /// [`RuntimeOptions::load_slower_than_prefill`]).
    pub recompute_tokens: u64,
}

impl From<&sys::kdn_stats> for Stats {
    fn from(s: &sys::kdn_stats) -> Self {
        Stats {
            lookups: s.lookups,
            retrieves: s.retrieves,
            stores: s.stores,
            hits: s.hits,
            misses: s.misses,
            tokens_served: s.tokens_served,
            tokens_stored: s.tokens_stored,
            bytes_served: s.bytes_served,
            bytes_stored: s.bytes_stored,
            chunks: s.chunks,
            used_bytes: s.used_bytes,
            capacity_bytes: s.capacity_bytes,
            evictions: s.evictions,
            edited_served: s.edited_served,
            leases_active: s.leases_active,
            pins_active: s.pins_active,
            pins_forced_unpin: s.pins_forced_unpin,
            corrupt_detected: s.corrupt_detected,
            edits: s.edits,
            tokens_requested: s.tokens_requested,
            prefill_tokens: s.prefill_tokens,
            prefill_ns: s.prefill_ns,
            ttft_saved_ns: s.ttft_saved_ns,
            tokens_served_unpriced: s.tokens_served_unpriced,
            delivery_ns: s.delivery_ns,
            lookup_tokens: s.lookup_tokens,
            lookup_hit_tokens: s.lookup_hit_tokens,
            recompute_tokens: s.recompute_tokens,
        }
    }
}

/// A latency distribution in microseconds (`kdn_latency`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Maximum.
    pub max_us: f64,
}

/// One tier's counters (`kdn_tier_stats`).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TierStats {
    /// The tier's kind.
    pub kind: TierKind,
    /// Its name.
    pub name: String,
    /// Its codec spec.
    pub codec: String,
    /// Gets it answered.
    pub hits: u64,
    /// Gets it did not.
    pub misses: u64,
    /// Puts.
    pub puts: u64,
    /// Puts refused (no room).
    pub put_refusals: u64,
    /// Objects evicted.
    pub evictions: u64,
    /// Objects demoted into it.
    pub demotions_in: u64,
    /// Objects promoted into it.
    pub promotions_in: u64,
    /// Bytes written into it.
    pub bytes_in: u64,
    /// Bytes read from it.
    pub bytes_out: u64,
    /// Objects held.
    pub objects: u64,
    /// Bytes held.
    pub used_bytes: u64,
    /// Capacity.
    pub capacity_bytes: u64,
    /// Objects that failed a check or did not decode.
    pub corrupt_detected: u64,
    /// Chunks encoded for it.
    pub encoded_chunks: u64,
    /// Bytes before encoding.
    pub bytes_before_encoding: u64,
    /// Bytes after encoding.
    pub bytes_after_encoding: u64,
    /// Chunks that did not encode (stored raw).
    pub encode_failures: u64,
    /// Chunks read back that did not decode.
    pub decode_failures: u64,
    /// Reads and writes that failed (since 1.2).
    pub io_errors: u64,
    /// Remote: calls to the node (since 1.2); redis: commands sent (since 1.3).
    pub remote_calls: u64,
    /// Remote: failed calls (since 1.2); redis: commands that failed (since 1.3).
    pub remote_failed_calls: u64,
    /// Remote: calls that timed out (since 1.2); redis: pipelines that timed out (since 1.3).
    pub remote_timeouts: u64,
    /// Remote: puts refused with the write-back queue full (since 1.2).
    pub write_queue_full: u64,
    /// Remote: bytes waiting in the write-back queue (since 1.2).
    pub write_queued_bytes: u64,
    /// Fraction of capacity a put may not cross without evicting first
    /// (since 1.4); 0: the tier has none (remote, redis).
    pub high_watermark: f64,
    /// Fraction of capacity eviction goes down to (since 1.4); 0: none.
    pub low_watermark: f64,
    /// How fast the tier delivers into host views, ns per token of KV
    /// (read, decode, copy; a moving average over the loads it served;
    /// since 1.7); 0 until measured.
    pub delivery_ns_per_token: f64,
    /// The same into views in device memory (since 1.7); 0 until measured.
    pub device_delivery_ns_per_token: f64,
    /// Its chunks loads left to recompute as slower than prefill (since 1.7).
    pub recompute_chunks: u64,
    /// Of `corrupt_detected`, the chunks whose seal failed (since 1.8; a
    /// runtime with a [`secret_file`](RuntimeOptions::secret_file)) or
    /// that did not decrypt (since 1.14: encrypted under a key this runtime
    /// lacks, see [`encryption_key_file`](RuntimeOptions::encryption_key_file),
    /// or damaged).
    pub auth_failures: u64,
}

/// One namespace's quota in a tier, now (`kdn_quota_stats`, since 1.13):
/// [`Runtime::quota_stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaStats {
    /// The namespace's hash, as chunk envelopes record it (a SHA-256 of the
    /// namespace, domain-separated: not `sha256(ns)` itself).
    pub ns_hash: [u8; 32],
    /// The quota, bytes.
    pub quota_bytes: u64,
    /// Its chunks' bytes the tier holds (counted as the quota is).
    pub used_bytes: u64,
    /// Its chunks the tier holds.
    pub objects: u64,
    /// Its chunks evicted to keep it within its quota (by its own puts).
    pub quota_evictions: u64,
    /// Its chunks evicted for the tier's room (the tier full of quota'd chunks).
    pub room_evictions: u64,
    /// Its puts refused here: a chunk larger than its quota.
    pub refused: u64,
}

impl From<&sys::kdn_quota_stats> for QuotaStats {
    fn from(q: &sys::kdn_quota_stats) -> Self {
        QuotaStats {
            ns_hash: q.ns_hash,
            quota_bytes: q.quota_bytes,
            used_bytes: q.used_bytes,
            objects: q.objects,
            quota_evictions: q.quota_evictions,
            room_evictions: q.room_evictions,
            refused: q.refused,
        }
    }
}

pub(crate) fn c_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

impl From<&sys::kdn_tier_stats> for TierStats {
    fn from(t: &sys::kdn_tier_stats) -> Self {
        TierStats {
            kind: TierKind::from_raw(t.kind),
            name: c_string(&t.name),
            codec: c_string(&t.codec),
            hits: t.hits,
            misses: t.misses,
            puts: t.puts,
            put_refusals: t.put_refusals,
            evictions: t.evictions,
            demotions_in: t.demotions_in,
            promotions_in: t.promotions_in,
            bytes_in: t.bytes_in,
            bytes_out: t.bytes_out,
            objects: t.objects,
            used_bytes: t.used_bytes,
            capacity_bytes: t.capacity_bytes,
            corrupt_detected: t.corrupt_detected,
            encoded_chunks: t.encoded_chunks,
            bytes_before_encoding: t.bytes_before_encoding,
            bytes_after_encoding: t.bytes_after_encoding,
            encode_failures: t.encode_failures,
            decode_failures: t.decode_failures,
            io_errors: t.io_errors,
            remote_calls: t.remote_calls,
            remote_failed_calls: t.remote_failed_calls,
            remote_timeouts: t.remote_timeouts,
            write_queue_full: t.write_queue_full,
            write_queued_bytes: t.write_queued_bytes,
            high_watermark: t.high_watermark,
            low_watermark: t.low_watermark,
            delivery_ns_per_token: t.delivery_ns_per_token,
            device_delivery_ns_per_token: t.device_delivery_ns_per_token,
            recompute_chunks: t.recompute_chunks,
            auth_failures: t.auth_failures,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{c_name, RawTierParts, TierConfig};
    use crate::Status;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::time::Duration;

    fn raw(tier: &TierConfig) -> kdn_sys::kdn_tier_config {
        tier.raw(&mut RawTierParts::default()).unwrap()
    }

    #[test]
    fn tier_durations_reach_c_in_whole_milliseconds_rounded_up() {
        let tier = TierConfig::redis("localhost:6379", "");
        let c = raw(&tier);
        assert_eq!((c.timeout_ms, c.ttl_ms), (0, 0), "zero: the default deadline, no expiry");
        let c = raw(&tier.clone().with_timeout(Duration::from_micros(1)).with_ttl(Duration::from_micros(1500)));
        assert_eq!((c.timeout_ms, c.ttl_ms), (1, 2));
        let c = raw(&tier.clone().with_timeout(Duration::from_secs(3)).with_ttl(Duration::from_secs(86_400)));
        assert_eq!((c.timeout_ms, c.ttl_ms), (3000, 86_400_000));
        let c = raw(&tier.with_timeout(Duration::from_secs(50 * 86_400)).with_ttl(Duration::MAX));
        assert_eq!((c.timeout_ms, c.ttl_ms), (u32::MAX, u64::MAX), "saturated");
    }

    #[test]
    fn tier_levels_reach_c_joined_by_semicolons() {
        let mut parts = RawTierParts::default();
        let tier = TierConfig::remote("127.0.0.1:1", "t");
        let c = tier.raw(&mut parts).unwrap();
        assert_eq!((c.levels, c.levels_len), (std::ptr::null(), 0), "no levels: NULL, as C's default");
        let c = tier.clone().with_levels(["zstd", "kdn:hifi", "kdn:balanced"]).raw(&mut parts).unwrap();
        assert_eq!(parts.levels, "zstd;kdn:hifi;kdn:balanced");
        let got = unsafe { std::slice::from_raw_parts(c.levels as *const u8, c.levels_len) };
        assert_eq!(got, parts.levels.as_bytes());
        for bad in [&["zstd;kdn"][..], &[""], &["zstd", ""]] {
            let e = tier.clone().with_levels(bad.iter().copied()).raw(&mut parts).unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument);
            assert!(e.message().contains("';'"), "{e}");
        }
    }

    #[test]
    fn key_sources_reach_c_whole_or_not_at_all() {
        let name = OsStr::new("KDN_KEYS");
        let (p, n) = c_name("encryption_key_env", "name", name, b"=").unwrap();
        assert_eq!(unsafe { std::slice::from_raw_parts(p as *const u8, n) }, b"KDN_KEYS");
        let path = OsStr::from_bytes(b"/etc/kdn/keys-\xff"); // not UTF-8: passed as it is
        let (p, n) = c_name("encryption_key_file", "path", path, b"").unwrap();
        assert_eq!(unsafe { std::slice::from_raw_parts(p as *const u8, n) }, path.as_bytes());
        for (bad, also, why) in [
            (&b""[..], &b"="[..], "is an empty name"),
            (b"KDN\0KEYS", b"=", "holds '\\0'"),
            (b"KDN=KEYS", b"=", "holds '='"),
        ] {
            let e = c_name("encryption_key_env", "name", OsStr::from_bytes(bad), also).unwrap_err();
            assert_eq!(e.status(), Status::InvalidArgument);
            assert!(e.message().starts_with("encryption_key_env") && e.message().contains(why), "{e}");
        }
        let e = c_name("encryption_key_file", "path", OsStr::new("/etc/keys\0x"), b"").unwrap_err();
        assert!(e.message().contains("holds '\\0'"), "{e}");
    }

    #[test]
    fn tier_quotas_reach_c_as_an_array_in_their_order() {
        let mut parts = RawTierParts::default();
        let c = TierConfig::host(1 << 20).raw(&mut parts).unwrap();
        assert_eq!((c.quotas, c.num_quotas), (std::ptr::null(), 0), "no quotas: NULL, as C's default");
        let tier = TierConfig::host(1 << 20).quota("tenant-a", 4096).quota(b"tenant-b".as_slice(), 0);
        let c = tier.raw(&mut parts).unwrap();
        assert_eq!(c.num_quotas, 2);
        let quotas = unsafe { std::slice::from_raw_parts(c.quotas, c.num_quotas) };
        for (q, (ns, bytes)) in quotas.iter().zip([("tenant-a", 4096), ("tenant-b", 0)]) {
            assert_eq!(q.struct_size as usize, std::mem::size_of::<kdn_sys::kdn_quota>());
            assert_eq!(q.reserved0, 0);
            assert_eq!(unsafe { std::slice::from_raw_parts(q.ns as *const u8, q.ns_len) }, ns.as_bytes());
            assert_eq!(q.bytes, bytes);
        }
    }
}
