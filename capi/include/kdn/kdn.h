/* SPDX-License-Identifier: Apache-2.0 */
/* kdn: Knowledge Delivery Network runtime, C ABI, version 1.
 *
 * This is the only installed header. It is C99 and C++ clean.
 *
 * ---- Stability --------------------------------------------------------------
 * Everything outside the KDN_EXPERIMENTAL section is stable from 1.0 on: no
 * function, type, field, constant or value is removed, renamed, reordered or
 * given another meaning before version 2 (a new SONAME, libkdn.so.2). The
 * experimental section is compiled only with KDN_EXPERIMENTAL defined; it may
 * change in any minor release, and its symbols are left out of the ABI check.
 *
 * ---- How structs grow -------------------------------------------------------
 * - Every struct that may grow starts with `uint32_t struct_size`: the size
 *   of the struct as the CALLER was compiled. New fields are only appended;
 *   no struct has implicit padding (every size is a multiple of 8), and no
 *   versioned struct is ever embedded in another by value (pointers only).
 * - KDN_<STRUCT>_SIZE_V1 is the size each struct had when first published
 *   (1.0); the library refuses a struct_size below it (KDN_ERR_VERSION).
 * - Input structs: the library reads the fields below struct_size and takes
 *   defaults for the rest, so an older caller keeps working. A NEWER caller
 *   (struct_size above what this library knows) is accepted only when every
 *   byte the library does not know is zero; otherwise the call fails with
 *   KDN_ERR_VERSION and a message naming the struct, so a feature the caller
 *   asked for is never silently ignored. A `reserved0` field that is not 0
 *   is refused the same way (KDN_ERR_VERSION): a later version may use it.
 *   In a batched call (kdn_kv_lookup) such a request fails alone, in its
 *   own result's status.
 * - Output structs: the caller sets struct_size; the library writes the
 *   fields below it, zeroes any tail it does not know, and sets
 *   `filled_size` (the second field) to the bytes it filled.
 * - Initialise a struct with kdn_<struct>_init(&s, sizeof s): it writes the
 *   defaults into exactly sizeof s bytes (zeroing any tail it does not know)
 *   and sets struct_size. C callers may use the KDN_<STRUCT>_INIT macro
 *   instead (same result).
 * - Arrays of structs: element i is at byte offset i * array[0].struct_size,
 *   and every element must carry the same struct_size. So a caller built
 *   with an older or newer header is indexed by its own layout.
 * - Detecting a feature at run time: kdn_version_number() (a feature added
 *   in 1.N is there when it is >= 10000 + 100 * N), and, for struct fields,
 *   an output's filled_size.
 *
 * ---- Errors -----------------------------------------------------------------
 * - Every fallible call returns a kdn_status: 0 (KDN_OK) or a negative code.
 *   The list of codes is OPEN: a newer library may return codes this header
 *   does not name; treat any unknown negative code as an error.
 * - On failure, kdn_last_error_message() says why (for humans, never parse
 *   it). Out-parameters are set to a neutral value on failure: NULL, 0, and
 *   an output struct its defaults (as its _init writes them), once the
 *   struct itself is valid. Output arrays are written only by a call that
 *   succeeds.
 * - An enum value this library does not know (a newer caller's, or garbage)
 *   is KDN_ERR_INVALID_ARGUMENT, like any other bad value.
 * - A cache miss is not an error: lookups, retrieves and loads succeed with
 *   zero tokens. KDN_ERR_NOT_FOUND is only for a named object (a document)
 *   that does not exist, or whose KV is gone from every tier.
 * - No C++ exception ever crosses this boundary.
 *
 * ---- Conventions ------------------------------------------------------------
 * - Names are kdn_<object>_<verb>. Handles are opaque: kdn_x_create(...,
 *   kdn_x **out) / kdn_x_destroy(x); destroying NULL is a no-op; destroying a
 *   handle twice, or using it after destroy, is undefined behaviour.
 * - Strings are (pointer, length) pairs and need not be NUL-terminated.
 * - Every pointer argument is borrowed for the call only, unless its
 *   comment says otherwise.
 * - Lifetimes: a runtime is reference-counted by its models and ops. After
 *   kdn_runtime_destroy, models and ops made from it stay usable; the
 *   store, its tiers and threads are freed when the last of them goes.
 * - Callbacks name the thread that calls them and whether they may call
 *   back into kdn; a call into kdn that would deadlock there is refused with
 *   KDN_ERR_INVALID_ARGUMENT, never hung.
 * - Each handle's comment has a Thread-safety line.
 */
#ifndef KDN_KDN_H
#define KDN_KDN_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  if defined(KDN_BUILDING)
#    define KDN_API __declspec(dllexport)
#  else
#    define KDN_API __declspec(dllimport)
#  endif
#elif defined(__GNUC__) || defined(__clang__)
#  define KDN_API __attribute__((visibility("default")))
#else
#  define KDN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions ----------------------------------------------------------- */

/* The CMake project version is read from these three lines. */
#define KDN_VERSION_MAJOR 1
#define KDN_VERSION_MINOR 14
#define KDN_VERSION_PATCH 0
#define KDN_VERSION_NUMBER \
  (KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH)

/* The library's version number (as KDN_VERSION_NUMBER) at run time. */
KDN_API uint32_t kdn_version_number(void);
/* The library's version as "MAJOR.MINOR.PATCH". Static storage. */
KDN_API const char *kdn_version(void);

/* ---- Status ------------------------------------------------------------- */

/* A status: KDN_OK or one of the negative codes below. Open: new codes may
 * appear in later versions; treat unknown negative values as errors. */
typedef int32_t kdn_status;

/* The codes, and what the caller can do. Values are pinned forever. */
enum kdn_status_code {
  KDN_OK = 0,
  /* A NULL handle or pointer, a bad size, count or value: fix the call. */
  KDN_ERR_INVALID_ARGUMENT = -1,
  /* A named object (a document) does not exist, or its KV is gone from
   * every tier: put it again. Never used for a cache miss. */
  KDN_ERR_NOT_FOUND = -2,
  /* Overloaded or full for now: retry later. */
  KDN_ERR_BUSY = -3,
  /* A remote peer is unreachable: reconnect. */
  KDN_ERR_UNAVAILABLE = -4,
  /* Stored or received bytes failed a check. */
  KDN_ERR_CORRUPT = -5,
  /* Valid, but not supported by this build or version. */
  KDN_ERR_UNSUPPORTED = -6,
  /* Out of memory. */
  KDN_ERR_NO_MEMORY = -7,
  /* A bug in kdn: please report it with the message. */
  KDN_ERR_INTERNAL = -8,
  /* A wait ran out of time; the operation goes on: wait again or cancel. */
  KDN_ERR_TIMEOUT = -9,
  /* The operation was cancelled (kdn_op_cancel): do not retry it. */
  KDN_ERR_CANCELLED = -10,
  /* A struct_size this library cannot accept: below the struct's first
   * published size, or larger with fields set that this library does not
   * know (the caller needs a newer library). */
  KDN_ERR_VERSION = -11,
  /* An output buffer is too small: the call says how much is needed (for
   * example kdn_kv_result.tokens); call again with a larger one. */
  KDN_ERR_BUFFER_TOO_SMALL = -12
};

/* A static name for a status ("KDN_ERR_NOT_FOUND"; "KDN_ERR_UNKNOWN" for a
 * code this library does not know). Never NULL. */
KDN_API const char *kdn_status_string(kdn_status status);

/* The message of the last failed call on this thread, or "" when the last
 * call succeeded. Never NULL; valid until the next kdn call on this thread. */
KDN_API const char *kdn_last_error_message(void);

/* ---- Element types ------------------------------------------------------ */

typedef enum kdn_dtype {
  KDN_DTYPE_F32 = 0,
  KDN_DTYPE_F16 = 1,
  KDN_DTYPE_BF16 = 2,
  KDN_DTYPE_FORCE32_ = 0x7FFFFFFF
} kdn_dtype;

/* ---- Runtime ------------------------------------------------------------ */

/* A runtime: the store and its tiers. Models and ops hang off it.
 * Thread-safety: every function taking a kdn_runtime may be called from any
 * number of threads at once; kdn_runtime_destroy must be the last call on
 * the handle (models and ops made from it remain usable). */
typedef struct kdn_runtime kdn_runtime;

/* The tiers of a runtime's store, highest (fastest) first. */
typedef enum kdn_tier_kind {
  KDN_TIER_HOST = 0,   /* host memory: pinned when a GPU is present */
  KDN_TIER_DEVICE = 1, /* GPU memory; host memory standing in for it without a GPU */
  KDN_TIER_DISK = 2,   /* one file per chunk, checksummed, crash-safe */
  KDN_TIER_REMOTE = 3, /* since 1.1: a kdnd node shared with other engines (address, token) */
  KDN_TIER_REDIS = 4,  /* since 1.3: Redis, Redis Cluster or Valkey shared with other engines
                          (address, token, user, ttl_ms) */
  KDN_TIER_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_tier_kind;

typedef enum kdn_eviction_policy {
  KDN_EVICT_LRU = 0,
  KDN_EVICT_S3FIFO = 1, /* scan-resistant (S3-FIFO) */
  /* Since 1.5: cost-aware (GreedyDual-Size-Frequency): keeps what saves the
   * most prefill time per byte held, times how often it is reused, aged. A
   * chunk is worth its tokens at its request's mean prefill cost per token
   * (attention makes long contexts cost more per token); a request's later
   * chunks go before its first ones. */
  KDN_EVICT_COST = 2,
  KDN_EVICT_FORCE32_ = 0x7FFFFFFF
} kdn_eviction_policy;

/* One tier of a runtime (input). */
typedef struct kdn_tier_config {
  uint32_t struct_size;
  kdn_tier_kind kind;        /* default KDN_TIER_HOST */
  uint64_t capacity_bytes;   /* default 1 GiB; must not be 0 */
  const char *path;          /* disk: the directory (created if absent) */
  size_t path_len;
  kdn_eviction_policy policy;
  float high_watermark;      /* a put that would cross it evicts first; 0 = 0.95 */
  float low_watermark;       /* ...down to this fraction of capacity; 0 = 0.85 */
  uint32_t write_through;    /* 1: new chunks are copied to the next tier too */
  /* How the tier stores chunks: a codec spec ("raw", "zstd", "fp8", "int8",
   * "kivi2", "cachegen", "kdn", "kdn:hifi", ...). Empty: raw for host and
   * device tiers, lossless "zstd" for disk and remote tiers (since 1.7:
   * "raw" where the runtime has a CUDA device, whose loads zstd's CPU decode
   * would slow down), "kdn:balanced" (compressed, lossy) for redis tiers.
   * kdn_runtime_get_tier_stats names the codec in use. "raw" and "zstd" are
   * lossless; the others are lossy, used only where named, and loads of KV
   * they served say so (KDN_RESULT_LOSSY). An unknown codec or parameter is
   * KDN_ERR_INVALID_ARGUMENT. "tc:balanced,profile=FILE" (the transform
   * codec) needs the model's profile (kdn codec calibrate --transform);
   * chunks of another model are kept uncoded, and a runtime reading tc
   * chunks must have loaded the same profile (else they are misses). */
  const char *codec;
  size_t codec_len;
  /* Since 1.1, for KDN_TIER_REMOTE: the kdnd to use, "host:port" or
   * "unix:/path", and a bearer token it takes (its [[token]]), which must
   * grant the namespaces the runtime's requests use. Reads that the node
   * cannot answer within timeout_ms are misses, never errors; writes are
   * queued and sent in the background. The codec applies on the wire: with
   * "kdn" chunks travel compressed and the receiving runtime decodes them.
   * capacity_bytes is not used (the node has its own). */
  const char *address;
  size_t address_len;
  const char *token;
  size_t token_len;
  uint32_t timeout_ms;       /* deadline of each call to the node; 0 = 2000 */
  uint32_t reserved1;        /* must be 0 */
  /* Since 1.1, for KDN_TIER_REMOTE over TLS (a kdnd with [server.tls]): a
   * PEM file of the certificate(s) to trust, and the name the node's
   * certificate must carry (empty: the host part of address). No file:
   * plain TCP. */
  const char *tls_ca_file;
  size_t tls_ca_file_len;
  const char *tls_server_name;
  size_t tls_server_name_len;
  /* Since 1.3, for KDN_TIER_REDIS (which also reads address, token and
   * timeout_ms): address is one node or more, "host:port" comma-separated
   * (of a cluster: any of its nodes; the others are learned); token is the
   * password (empty: no AUTH); timeout_ms the deadline of each command (0 =
   * 2000). One key per chunk, "kdn:" + its key's hex -> the chunk, written
   * in one SET. Reads that the server cannot answer within timeout_ms (down,
   * failing over, refusing) are misses, never errors; a server that is not
   * there at creation is missed until it answers. A malformed address or a
   * refused AUTH fails kdn_runtime_create (KDN_ERR_INVALID_ARGUMENT).
   * capacity_bytes is not used (the server's maxmemory and policy apply). */
  const char *user;          /* the ACL user of AUTH; empty: the password alone */
  size_t user_len;
  uint64_t ttl_ms;           /* the keys expire after this; 0: never */
  /* Since 1.6, for KDN_TIER_REMOTE and KDN_TIER_REDIS: quality levels, codec
   * specs finest first separated by ';' (say "zstd;kdn:hifi;kdn:balanced"),
   * at most 8; codec must then be empty. Every chunk is kept at each level
   * side by side; a load whose request sets ttft_target_us fetches each
   * chunk at the finest level that arrives in time at the link rate the
   * runtime measures, and leaves a chunk to recompute (a failed range of a
   * load op; the end of a retrieve's prefix) when no level would. Loads
   * without a target get the finest level. Empty: one level, `codec`. */
  const char *levels;
  size_t levels_len;
  /* Since 1.13: namespaces' quotas in this tier (docs/security.md,
   * "Quotas"), num_quotas of them (at most 4096), one per namespace: a
   * namespace's chunks take at most `bytes` of the tier (as it counts its
   * capacity). Over it, a put of that namespace evicts the namespace's own
   * coldest chunks first (by the tier's policy), never another's; a chunk
   * larger than its quota goes to the next tier. When the tier itself is
   * full, chunks of namespaces without a quota go first, so each namespace
   * keeps up to its quota while the quotas add up to no more than the tier,
   * and the others share what is left. Use and evictions per namespace:
   * kdn_runtime_get_quota_stats. Not for KDN_TIER_REMOTE (a kdnd has its
   * own quotas, in its config). NULL and 0: none. */
  const struct kdn_quota *quotas;
  size_t num_quotas;
} kdn_tier_config;
#define KDN_TIER_CONFIG_SIZE_V1 64u
#define KDN_TIER_CONFIG_INIT                                                                   \
  { sizeof(kdn_tier_config), KDN_TIER_HOST, 1073741824u, NULL, 0u, KDN_EVICT_LRU, 0.0f, 0.0f, 0u, \
    NULL, 0u, NULL, 0u, NULL, 0u, 0u, 0u, NULL, 0u, NULL, 0u, NULL, 0u, 0u, NULL, 0u, NULL, 0u }

/* Since 1.13: one namespace's quota in a tier (input; kdn_tier_config.quotas). */
typedef struct kdn_quota {
  uint32_t struct_size;
  uint32_t reserved0;  /* must be 0 */
  const char *ns;      /* the namespace, as the KV calls name it (ns_len bytes, at most 4096) */
  size_t ns_len;
  uint64_t bytes;      /* the most bytes of the tier its chunks may take (0: none: its chunks skip the tier) */
} kdn_quota;
#define KDN_QUOTA_SIZE_V1 32u
#define KDN_QUOTA_INIT { sizeof(kdn_quota), 0u, NULL, 0u, 0u }
KDN_API kdn_status kdn_quota_init(kdn_quota *quota, size_t struct_size);
KDN_API kdn_status kdn_tier_config_init(kdn_tier_config *config, size_t struct_size);

/* Since 1.5: the GPU a runtime delivers KV to (kdn_runtime_options.device),
 * for KV views in device memory (KDN_MEMORY_DEVICE) and device tiers. */
typedef enum kdn_device_mode {
  /* The CUDA device device_ordinal when this build has CUDA and the machine
   * a usable GPU; otherwise none (device views are KDN_ERR_UNSUPPORTED, a
   * device tier is emulated in host memory). */
  KDN_DEVICE_AUTO = 0,
  KDN_DEVICE_NONE = 1, /* no device: device views are KDN_ERR_UNSUPPORTED */
  /* Host memory stands in for the GPU's: KDN_MEMORY_DEVICE views are host
   * memory, and every device path (device tier to view without a host copy,
   * decode of encoded chunks into the view, gathers for saves) runs the CPU
   * path of its kernel, byte for byte. For developing and testing an
   * engine's GPU integration on a machine without one. */
  KDN_DEVICE_EMULATED = 2,
  /* The CUDA device device_ordinal; kdn_runtime_create fails with
   * KDN_ERR_UNSUPPORTED when there is none. */
  KDN_DEVICE_CUDA = 3,
  KDN_DEVICE_FORCE32_ = 0x7FFFFFFF
} kdn_device_mode;

/* How to create a runtime (input). */
typedef struct kdn_runtime_options {
  uint32_t struct_size;
  uint32_t chunk_tokens;        /* tokens per stored chunk; default 256 */
  uint64_t host_capacity_bytes; /* host tier capacity when num_tiers is 0; default 1 GiB */
  uint64_t hash_seed;           /* seed of every key hash; default 0. Runtimes
                                   that share KV must share the seed. */
  const kdn_tier_config *tiers; /* num_tiers configs, highest first (an array of
                                   versioned structs: see the header's top) */
  size_t num_tiers;             /* 0: one host tier of host_capacity_bytes */
  uint32_t worker_threads;      /* background loads and saves; 0 = 2, at most 64 */
  uint32_t reserved0;           /* must be 0 */
  /* Since 1.5. */
  kdn_device_mode device;       /* default KDN_DEVICE_AUTO */
  int32_t device_ordinal;       /* the CUDA device; default 0 */
  /* Since 1.7. Never slower than prefill: once the engine has reported its
   * prefill time (kdn_model_report_prefill), a load leaves to recompute the
   * cached chunks whose delivery, at the rate measured for their tier and
   * kind of view (kdn_tier_stats.delivery_ns_per_token), would take longer
   * than prefilling them: the prefix it writes ends before them (a load op
   * reports them in `failed`), counted in kdn_stats.recompute_tokens. Once
   * in 8 such loads the tier is read anyway, to measure it again. 0 (the
   * default): so; 1: load every cached chunk, however slow its tier. */
  uint32_t load_slower_than_prefill;
  uint32_t reserved1;           /* must be 0 */
  /* Since 1.8. A file holding the deployment's secret (at least 32 bytes,
   * e.g. `head -c 32 /dev/urandom`; readable by the service only): every
   * chunk a redis or disk tier stores is sealed with it (a MAC over the
   * whole envelope: header, key, model, namespace and payload), and a chunk
   * read back counts only if sealed with it; any other is a miss, counted in
   * kdn_tier_stats.auth_failures and deleted. Runtimes that share such a
   * tier share the secret. NULL: none: a tier serves whatever its server or
   * directory holds (whoever can write to it decides the KV;
   * docs/security.md; for a redis tier kdn says so once on stderr). A file that cannot be read, is open to
   * others or is too short: KDN_ERR_INVALID_ARGUMENT. */
  const char *secret_file;
  size_t secret_file_len;
  /* Since 1.14. Encryption at rest (docs/security.md): master keys, from a
   * file (encryption_key_file: readable by the service only) or from an
   * environment variable (encryption_key_env: its name, not the keys), at
   * most one of the two; one key per line as 64 hex digits (`openssl rand
   * -hex 32`), the first encrypts, every one decrypts (rotation: put the new
   * key first, keep the old ones while their chunks matter). With them,
   * every chunk a disk, redis or remote tier sends out of the process is
   * encrypted with AES-256-GCM under its namespace's key (HKDF-SHA256 of the
   * master key) and decrypted when read back; one that does not open
   * (another key, damaged or forged bytes) is a miss, counted in
   * kdn_tier_stats.auth_failures. Runtimes that share such a tier share the
   * keys. NULL: none (an encrypted chunk read back is such a miss). A source
   * that cannot be read, is open to others, or holds a line that is not a
   * key: KDN_ERR_INVALID_ARGUMENT (the message never holds a key). */
  const char *encryption_key_file;
  size_t encryption_key_file_len;
  const char *encryption_key_env;
  size_t encryption_key_env_len;
} kdn_runtime_options;
#define KDN_RUNTIME_OPTIONS_SIZE_V1 48u
#define KDN_RUNTIME_OPTIONS_INIT \
  { sizeof(kdn_runtime_options), 256u, 1073741824u, 0u, NULL, 0u, 0u, 0u, KDN_DEVICE_AUTO, 0, 0u, 0u, NULL, 0u, NULL, 0u, NULL, 0u }
KDN_API kdn_status kdn_runtime_options_init(kdn_runtime_options *options, size_t struct_size);

/* Creates a runtime. options may be NULL (defaults). */
KDN_API kdn_status kdn_runtime_create(const kdn_runtime_options *options, kdn_runtime **out);
/* Releases the caller's reference: the runtime lives on while models or ops
 * made from it do, and is freed (its threads joined, queued saves finished)
 * when the last of them is destroyed. */
KDN_API void kdn_runtime_destroy(kdn_runtime *runtime);

/* ---- Models ------------------------------------------------------------- */

typedef enum kdn_rope_style {
  KDN_ROPE_INTERLEAVED = 0, /* pairs (2j, 2j+1): llama2.c, GPT-J, Meta Llama */
  KDN_ROPE_NEOX = 1,        /* pairs (j, j + rotary_dim/2): HF Llama, NeoX */
  KDN_ROPE_STYLE_FORCE32_ = 0x7FFFFFFF
} kdn_rope_style;

/* Since 1.11: what each layer of a model caches per token
 * (kdn_model_spec.cache_kind; docs/model-kinds.md). */
typedef enum kdn_cache_kind {
  KDN_CACHE_KV = 0,     /* K and V, num_kv_heads x head_dim each (MHA, GQA, MQA) */
  KDN_CACHE_LATENT = 1, /* one latent vector of latent_dim (multi-head latent attention: DeepSeek-V2/V3,
                           Kimi): no separate V; its last latent_rope_dim dims carry RoPE */
  KDN_CACHE_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_cache_kind;

/* The shape of a model's KV and what identifies its weights (input). KV is
 * only ever returned to a model with the same spec and fingerprint. */
typedef struct kdn_model_spec {
  uint32_t struct_size;
  uint32_t num_layers;         /* 1..4096 */
  uint32_t num_kv_heads;       /* 1..4096 */
  uint32_t head_dim;           /* 1..65536 */
  kdn_dtype dtype;
  float rope_theta;            /* default 10000 */
  kdn_rope_style rope_style;   /* default interleaved */
  uint32_t rotary_dim;         /* 0 = head_dim */
  /* Identifies weights, tokenizer, layout, TP rank/size, adapters: anything
   * that changes the KV. Opaque bytes, hashed; must not be empty. */
  const char *fingerprint;
  size_t fingerprint_len;
  /* Since 1.11. KDN_CACHE_LATENT: each layer caches one latent vector of
   * latent_dim per token (even, 2..65536; DeepSeek-V3: 512 + 64 = 576), of
   * which the last latent_rope_dim (even, at most latent_dim; DeepSeek-V3:
   * 64) carry RoPE at rope_theta / rope_style; num_kv_heads, head_dim and
   * rotary_dim must then be 0. A view of such a model describes the latent:
   * k_layers (or data, layers stride_layer apart; 0: dense [layer][token]
   * [latent] for num_tokens, else the request's tokens) address each token's
   * vector, with stride_token and stride_dim (0, 0: dense) and the paged
   * layouts as for K; v_layers, stride_kv, stride_head and v_stride_* must be 0 (vLLM's
   * MLA cache, per layer [num_blocks][block_size][latent_dim], is a paged
   * NHD view of k_layers). Since 1.12 blending takes a latent model: only
   * its RoPE dims are re-positioned, and the callback sees whole latents
   * (kdn_blend_layer_fn); refused (KDN_ERR_UNSUPPORTED) where
   * latent_rope_dim exceeds latent_dim / 2, or with an engine on a device
   * (KDN_BLEND_ENGINE_ON_DEVICE). The kind is part of the model's identity:
   * a latent model's chunks never reach a K/V model. */
  kdn_cache_kind cache_kind;
  uint32_t latent_dim;
  uint32_t latent_rope_dim;
  uint32_t reserved1;          /* must be 0 */
  /* Since 1.12: layer groups (docs/model-kinds.md). num_layers counts the
   * layers that cache per-token KV (or a latent). layer_windows: one entry
   * per such layer (num_layers of them, copied): 0 = full attention, W > 0 =
   * the layer attends to the last W tokens only (sliding window: Gemma 3,
   * gpt-oss); NULL = every layer full. num_state_layers: recurrent layers
   * (Mamba, linear attention: Jamba, Nemotron-H, Qwen3-Next), not counted in
   * num_layers, each with a state of state_bytes (a positive multiple of 4)
   * instead of per-token KV; the state is opaque to kdn and kept exact.
   * A model with a window or a recurrent layer is kept in groups, each
   * stored apart, and has one rule for hits: a prefix of b tokens counts
   * only when the full layers have every chunk of it, each window's layers
   * the chunks overlapping its last W tokens, and the recurrent layers the
   * state at b, stored by a kdn_kv_store whose request ended at b (a view's
   * state_layers). A store of n tokens reads a sliding layer's KV only in
   * its window [n - W, n) (llama.cpp's SWA cache and vLLM's sliding-window
   * blocks drop older tokens): the view need hold no older ones, and a
   * shorter prefix of the request is a hit only where a store ended there
   * (an engine that stores at each chunk boundary of its prefill keeps them
   * all). A retrieve or load writes a sliding layer's window's tokens only.
   * Lookups, retrieves and loads report that prefix and
   * write nothing past it. Such a model takes host views only, and not
   * blending or knowledge items (KDN_ERR_UNSUPPORTED). The groups are part
   * of the model's identity. */
  const uint32_t *layer_windows;
  uint32_t num_state_layers;   /* 0..4096 */
  uint32_t reserved2;          /* must be 0 */
  uint64_t state_bytes;        /* one recurrent layer's state; 0 without recurrent layers */
} kdn_model_spec;
#define KDN_MODEL_SPEC_SIZE_V1 48u
#define KDN_MODEL_SPEC_INIT \
  { sizeof(kdn_model_spec), 0u, 0u, 0u, KDN_DTYPE_F32, 10000.0f, KDN_ROPE_INTERLEAVED, 0u, NULL, 0u, KDN_CACHE_KV, \
    0u, 0u, 0u, NULL, 0u, 0u, 0u }
KDN_API kdn_status kdn_model_spec_init(kdn_model_spec *spec, size_t struct_size);

/* A model registered with a runtime; every KV call goes through one.
 * Thread-safety: immutable once created; usable from any thread at once.
 * kdn_model_destroy must be the last call on it. It holds a reference on its
 * runtime. */
typedef struct kdn_model kdn_model;

/* Registers a model. The spec and its strings are copied. */
KDN_API kdn_status kdn_model_create(kdn_runtime *runtime, const kdn_model_spec *spec, kdn_model **out);
KDN_API void kdn_model_destroy(kdn_model *model);

/* The 32-byte identity kdn derived from the spec (shape + fingerprint). */
KDN_API kdn_status kdn_model_get_fingerprint(const kdn_model *model, uint8_t out[32]);
/* Bytes of KV per token: layers x 2 x kv_heads x head_dim x dtype size
 * (a latent model: layers x latent_dim x dtype size). */
KDN_API kdn_status kdn_model_get_kv_bytes_per_token(const kdn_model *model, uint64_t *out);

/* Since 1.4. Tells the runtime that the engine prefilled `tokens` tokens of
 * this model in `elapsed_ns` nanoseconds (wall time of the forward pass, as
 * the engine measured it): what a cache hit on them would have saved. The
 * model's prefill time per token is the mean over its reports (total time /
 * total tokens, per model fingerprint), and every later load prices the
 * tokens it serves at that mean: kdn_stats.ttft_saved_ns. Report the
 * prefills of the tokens a load did NOT serve (the rest of the prompt), and
 * full prefills, as they happen. KDN_ERR_INVALID_ARGUMENT when tokens or
 * elapsed_ns is 0, or the time is over an hour per token (not nanoseconds);
 * KDN_ERR_BUSY for a model whose fingerprint is new to a runtime that has
 * meters for 4096 models already (they are kept for the runtime's life).
 * Thread-safe. */
KDN_API kdn_status kdn_model_report_prefill(const kdn_model *model, uint64_t tokens, uint64_t elapsed_ns);

/* ---- Requests ------------------------------------------------------------ */

/* The tokens a KV call is about: their ids (from the start of the context,
 * in order), or the engine's own chained block hashes (engines that hash
 * their blocks, as vLLM does). With hashes, a chunk is chunk_tokens /
 * block_tokens engine blocks, and the request covers num_blocks *
 * block_tokens tokens. Input; its arrays are borrowed for the call (an
 * asynchronous op copies them before it returns). */
typedef struct kdn_request {
  uint32_t struct_size;
  uint32_t hash_bytes;          /* 0: token ids; else bytes per block hash (1..64) */
  const int32_t *tokens;        /* num_tokens ids, each >= 0 */
  size_t num_tokens;
  const uint8_t *block_hashes;  /* num_blocks * hash_bytes bytes */
  size_t num_blocks;
  uint32_t block_tokens;        /* tokens per engine block; chunk_tokens must be a multiple */
  uint32_t reserved0;           /* must be 0 */
  /* Since 1.6: for kdn_kv_retrieve and kdn_kv_load_async, the time from the
   * call within which the cached prefix's KV should be in place (the part of
   * the TTFT kdn answers for). Remote tiers with quality levels
   * (kdn_tier_config.levels) then choose each chunk's level by it, and leave
   * a chunk to recompute when none arrives in time (the recompute priced at
   * the model's mean reported prefill time: kdn_model_report_prefill).
   * 0: no target (the finest level). Other calls ignore it. */
  uint64_t ttft_target_us;
  /* Since 1.13: a salt (salt_len bytes, at most 4096; NULL and 0: none)
   * that enters every chunk key of the request, as vLLM's `cache_salt`
   * enters its prefix hashes: a salted request hits only KV stored with the
   * same salt, and unsalted KV never answers it (nor it an unsalted one), so
   * one user's cached prefix gives another no hit and no timing signal.
   * The salt is hashed into the keys, never stored. Lookups, stores,
   * retrieves and ops take it; knowledge items and blending are
   * per-namespace and ignore it (docs/security.md). */
  const uint8_t *salt;
  size_t salt_len;
} kdn_request;
#define KDN_REQUEST_SIZE_V1 48u
#define KDN_REQUEST_INIT { sizeof(kdn_request), 0u, NULL, 0u, NULL, 0u, 0u, 0u, 0u, NULL, 0u }
KDN_API kdn_status kdn_request_init(kdn_request *request, size_t struct_size);

/* ---- KV views ------------------------------------------------------------- */

typedef enum kdn_memory_kind {
  KDN_MEMORY_HOST = 0, /* host memory */
  /* Since 1.5: GPU memory of the runtime's device (kdn_runtime_options.device;
   * with KDN_DEVICE_EMULATED, host memory standing in for it). Taken by
   * kdn_kv_store, kdn_kv_retrieve, kdn_kv_load_async and kdn_kv_save_async
   * (every view of a call in the same kind of memory); the knowledge calls
   * refuse it (KDN_ERR_UNSUPPORTED), as does a runtime without a device. Loads write the views on the device: a device tier's chunks
   * device to device, encoded chunks of lower tiers decoded on the GPU
   * (codecs kdn, tc, cachegen; others on the CPU, then copied). The KV is in
   * place when the call returns (a load op: layer by layer, in up to 8
   * steps of consecutive layers, each in place when kdn_op_wait_layer
   * returns for it; cachegen and tc chunks make it one step). The views' arrays (k_layers, v_layers, block_table) are host
   * memory as always. kdn_kv_blend (experimental) takes them too: it
   * composes on the host, then writes the views through the device. */
  KDN_MEMORY_DEVICE = 1,
  KDN_MEMORY_FORCE32_ = 0x7FFFFFFF
} kdn_memory_kind;

typedef enum kdn_kv_layout {
  KDN_LAYOUT_CONTIGUOUS = 0, /* element (token, head, dim) at the strides below (llama.cpp, canonical) */
  KDN_LAYOUT_PAGED_NHD = 1,  /* per layer: [num_blocks][block_size][kv_heads][head_dim] (vLLM) */
  KDN_LAYOUT_PAGED_HND = 2,  /* per layer: [num_blocks][kv_heads][block_size][head_dim] */
  KDN_LAYOUT_FORCE32_ = 0x7FFFFFFF
} kdn_kv_layout;

/* Where a caller's KV lives: the one KV descriptor of every KV call (input).
 * A call takes an array of views that together hold every model layer once
 * (one view for most engines; several for, e.g., full-attention and
 * sliding-window layers with their own block tables).
 *
 * Layers: view layer j is model layer layers[j]; layers NULL means every
 * model layer in order (num_layers then 0 or the model's layer count).
 *
 * Where each layer's K and V start, one of:
 * - per layer: k_layers[j] / v_layers[j] (arrays of num_layers pointers);
 * - one allocation (k_layers and v_layers NULL, CONTIGUOUS only): layer j's
 *   K at data + j * stride_layer, its V stride_kv further (elements).
 * Within a layer (all counts in ELEMENTS, never negative):
 * - CONTIGUOUS: element (token, head, dim) at token * stride_token + head *
 *   stride_head + dim * stride_dim; V uses v_stride_* where they are not
 *   all 0 (llama.cpp's transposed V). With `data` and all five strides 0,
 *   the canonical layout [layer][k|v][token][kv_head][head_dim] for
 *   num_tokens tokens.
 * - PAGED_*: token t lives in block block_table[t / block_size], at slot
 *   t % block_size; blocks are block_stride elements apart (0 = dense).
 * Token i of the view is token i of the request.
 * Bounds, checked before anything is touched: num_tokens is the room the
 * view has (0: exactly the request's tokens; calls that write a length the
 * caller does not know yet, kdn_knowledge_fetch, need it set); size_bytes
 * (one allocation) bounds the memory; layer_elements / num_blocks (per
 * layer) bound it when not 0.
 * The memory is borrowed for the call (an asynchronous op: until it ends);
 * the arrays (layers, k_layers, v_layers, block_table) for the call only. */
typedef struct kdn_kv_view {
  uint32_t struct_size;
  kdn_memory_kind memory;
  kdn_dtype dtype;                  /* must equal the model's */
  kdn_kv_layout layout;
  const uint32_t *layers;           /* NULL: all model layers */
  size_t num_layers;
  void *const *k_layers;            /* per layer, or NULL with data */
  void *const *v_layers;
  void *data;                       /* one allocation */
  uint64_t size_bytes;              /* one allocation: bytes reachable from data (required, checked) */
  int64_t stride_layer, stride_kv;  /* one allocation */
  int64_t stride_token, stride_head, stride_dim;
  int64_t v_stride_token, v_stride_head, v_stride_dim;  /* 0, 0, 0: as K */
  uint64_t num_tokens;              /* room, in tokens; 0 = the request's */
  uint64_t layer_elements;          /* per layer, contiguous: elements per layer allocation; 0 = unchecked */
  uint32_t block_size;              /* paged */
  uint32_t reserved0;               /* must be 0 */
  const int32_t *block_table;       /* paged */
  size_t block_table_len;
  uint64_t num_blocks;              /* paged: blocks per layer allocation; 0 = unchecked */
  int64_t block_stride;             /* paged: elements between blocks; 0 = dense */
  /* Since 1.8. The engine's CUDA stream (a cudaStream_t) for a view in
   * device memory; NULL: none. kdn's work on the view (its copies and
   * kernels, on its own stream) starts after the work this stream held when
   * the call was made (an event recorded on it then), so KV the engine is
   * still writing is not read early and KV the engine is still reading is
   * not overwritten; and what the engine queues on this stream after the
   * call returns (an op: after it ends) runs after kdn's writes. kdn still
   * waits for its own work before a call returns and before an op reports
   * a layer. Every view of a call names the same stream; a view in host
   * memory names none (KDN_ERR_INVALID_ARGUMENT). With KDN_DEVICE_EMULATED
   * any non-NULL value is accepted and never dereferenced (there is no
   * stream to wait for). */
  void *cuda_stream;
  /* Since 1.12. A model with recurrent layers (kdn_model_spec.
   * num_state_layers): per recurrent layer, its state's memory
   * (state_bytes each, host memory); one view of a call at most carries
   * it. kdn_kv_store / kdn_kv_save_async: the state after the request's
   * last token, stored as the snapshot there (NULL: none; the KV is stored
   * all the same, but a prefix counts only where a snapshot is). An engine
   * that stores once per chunk of its prefill (chunk_tokens apart) makes
   * every chunk boundary a possible hit. kdn_kv_retrieve /
   * kdn_kv_load_async: required; kdn writes the snapshot at the prefix it
   * returns (nothing for 0). Must be NULL for other models. */
  void *const *state_layers;
} kdn_kv_view;
#define KDN_KV_VIEW_SIZE_V1 184u
#define KDN_KV_VIEW_INIT                                                                       \
  { sizeof(kdn_kv_view), KDN_MEMORY_HOST, KDN_DTYPE_F32, KDN_LAYOUT_CONTIGUOUS, NULL, 0u, NULL, \
    NULL, NULL, 0u, 0, 0, 0, 0, 0, 0, 0, 0, 0u, 0u, 0u, 0u, NULL, 0u, 0u, 0, NULL, NULL }
KDN_API kdn_status kdn_kv_view_init(kdn_kv_view *view, size_t struct_size);

/* ---- Lookup, store, retrieve ------------------------------------------- */

/* Every KV call names a tenant namespace (1..4096 bytes): KV stored under
 * one namespace is never visible under another. KV is kept in whole chunks:
 * a stored chunk counts only when the request contains all of its tokens. */

/* Where an operation is (kdn_kv_result.state, kdn_op_poll). */
typedef enum kdn_op_state {
  KDN_OP_PENDING = 0,
  KDN_OP_DONE = 1,
  KDN_OP_FAILED = 2,
  KDN_OP_CANCELLED = 3,
  KDN_OP_STATE_FORCE32_ = 0x7FFFFFFF
} kdn_op_state;

/* What a KV call did (output): kdn_kv_store, kdn_kv_retrieve,
 * kdn_knowledge_fetch, and an op's kdn_op_get_result. */
typedef struct kdn_kv_result {
  uint32_t struct_size;
  uint32_t filled_size;
  kdn_op_state state;    /* KDN_OP_DONE after a synchronous call that succeeded */
  kdn_status status;     /* KDN_OK, KDN_ERR_CANCELLED, or why it failed */
  uint64_t tokens;       /* store/save: leading tokens cached after it; retrieve/load: tokens
                            written (retrieve: the prefix); fetch: the document's length */
  uint64_t covered;      /* retrieve/load: the cached prefix found at the start */
  uint64_t num_failed;   /* load: ranges of the prefix that could not be read (or, 1.7, were
                            left to recompute as slower than prefill) */
  uint32_t flags;        /* KDN_RESULT_* bits */
  uint32_t reserved0;
} kdn_kv_result;
#define KDN_KV_RESULT_SIZE_V1 48u
#define KDN_KV_RESULT_INIT { sizeof(kdn_kv_result), 0u, KDN_OP_PENDING, KDN_OK, 0u, 0u, 0u, 0u, 0u }
KDN_API kdn_status kdn_kv_result_init(kdn_kv_result *result, size_t struct_size);

/* kdn_kv_result.flags: */
/* Some of the KV written was decoded from a lossy codec (a tier whose codec
 * is neither "raw" nor "zstd"): it is close to, not equal to, the KV stored. */
#define KDN_RESULT_LOSSY 0x1u

#define KDN_MAX_TIERS 8

/* One request's lookup (output). */
typedef struct kdn_lookup_result {
  uint32_t struct_size;
  uint32_t filled_size;
  kdn_status status;                   /* this request's own status */
  uint32_t num_tiers;                  /* entries of tier_tokens in use */
  uint64_t cached_tokens;              /* leading tokens cached in some tier */
  uint64_t tier_tokens[KDN_MAX_TIERS]; /* per tier: leading tokens that tier alone holds */
} kdn_lookup_result;
#define KDN_LOOKUP_RESULT_SIZE_V1 88u
#define KDN_LOOKUP_RESULT_INIT { sizeof(kdn_lookup_result), 0u, KDN_OK, 0u, 0u, {0} }
KDN_API kdn_status kdn_lookup_result_init(kdn_lookup_result *result, size_t struct_size);

/* How many leading tokens of each request are cached, without side effects
 * (no hit statistics, no promotion, no change of eviction order). results[i]
 * gets request i's outcome; one bad request fails alone (its status), and
 * the call returns KDN_OK when it was well formed. Both are arrays of
 * versioned structs. */
KDN_API kdn_status kdn_kv_lookup(const kdn_model *model, const char *ns, size_t ns_len,
                                 const kdn_request *requests, size_t num_requests, kdn_lookup_result *results);

/* Stores the request's KV from the views, split into chunks of the
 * runtime's chunk_tokens (the tokens after the last whole chunk as pieces of
 * decreasing powers of two, found again by any longer request); chunks already
 * cached are skipped. When not all fit, the longest prefix that fits is kept
 * and the call still succeeds. out (optional): tokens = the leading tokens
 * cached after the call. */
KDN_API kdn_status kdn_kv_store(const kdn_model *model, const char *ns, size_t ns_len, const kdn_request *request,
                                const kdn_kv_view *views, size_t num_views, kdn_kv_result *out);

/* Writes the KV of the longest cached prefix of the request into the views.
 * out (required): tokens = its length, 0 on a miss (which is KDN_OK);
 * covered = the cached prefix found (tokens is shorter when a chunk of it
 * could not be read: evicted meanwhile, or corrupt; or, since 1.7, when its
 * tier delivers slower than the engine prefills: load_slower_than_prefill
 * in kdn_runtime_options); flags. Positions past
 * `tokens` are the engine's to recompute: into device views laid out as
 * kdn's chunks (contiguous, token-major), a chunk after one that did not
 * decode may have been written there too. */
KDN_API kdn_status kdn_kv_retrieve(const kdn_model *model, const char *ns, size_t ns_len, const kdn_request *request,
                                   const kdn_kv_view *views, size_t num_views, kdn_kv_result *out);

/* ---- Asynchronous, layer-by-layer loads and saves ------------------------- */

/* A load or save in progress (vLLM's start_load_kv / wait_for_layer_load and
 * save_kv_layer / wait_for_save). It holds a reference on its runtime.
 * Thread-safety: every function taking a kdn_op may be called from any
 * thread at once, except kdn_op_destroy, which must be the last call on it. */
typedef struct kdn_op kdn_op;


/* Starts loading the cached prefix of the request into the views, layer by
 * layer in the background. The views' memory must stay valid until the op
 * ends (kdn_op_wait, or kdn_op_destroy). A miss is a load of 0 tokens. */
KDN_API kdn_status kdn_kv_load_async(const kdn_model *model, const char *ns, size_t ns_len,
                                     const kdn_request *request, const kdn_kv_view *views, size_t num_views,
                                     kdn_op **out);
/* Starts a save of the request's KV from the views: call kdn_op_layer_ready
 * once per model layer as it becomes final, then kdn_op_wait. */
KDN_API kdn_status kdn_kv_save_async(const kdn_model *model, const char *ns, size_t ns_len,
                                     const kdn_request *request, const kdn_kv_view *views, size_t num_views,
                                     kdn_op **out);

/* Save: model layer `layer` is final in the views; it is copied in the
 * background (the caller never waits for disk or encoding work). */
KDN_API kdn_status kdn_op_layer_ready(kdn_op *op, uint32_t layer);
/* Load: until model layer `layer` is written. timeout_ms < 0: no limit.
 * KDN_ERR_TIMEOUT when the time ran out (the load goes on);
 * KDN_ERR_CANCELLED, or the op's error, when it ended without the layer. */
KDN_API kdn_status kdn_op_wait_layer(kdn_op *op, uint32_t layer, int64_t timeout_ms);
/* Until the op ends; then its own status (KDN_ERR_CANCELLED if cancelled).
 * KDN_ERR_TIMEOUT when the time ran out first (the op goes on). */
KDN_API kdn_status kdn_op_wait(kdn_op *op, int64_t timeout_ms);
KDN_API kdn_status kdn_op_poll(kdn_op *op, kdn_op_state *out);
/* Asks the op to stop; it ends KDN_OP_CANCELLED at its next layer, unless it
 * has ended already. A save ends as soon as the layers already given are
 * copied, without waiting for the others; kdn_op_layer_ready on it is then
 * KDN_OK and does nothing. */
KDN_API kdn_status kdn_op_cancel(kdn_op *op);

/* A range of tokens [begin, end). A plain struct, frozen as it is. */
typedef struct kdn_token_range {
  uint64_t begin, end;
} kdn_token_range;

/* The op's outcome so far (state KDN_OP_PENDING while it runs). */
KDN_API kdn_status kdn_op_get_result(kdn_op *op, kdn_kv_result *out);
/* The failed ranges of a load (recompute only those): up to `capacity` into
 * out; *out_count gets how many there are. */
KDN_API kdn_status kdn_op_get_failed_ranges(kdn_op *op, kdn_token_range *out, size_t capacity, size_t *out_count);
/* Cancels the op if it still runs, waits until nothing reads or writes the
 * views any more, and frees it. NULL is fine. Inside an editor callback it
 * only cancels: the wait and the free run on another thread once the
 * callback returned, so the views must then stay valid until the runtime is
 * freed. */
KDN_API void kdn_op_destroy(kdn_op *op);

/* ---- Knowledge items ------------------------------------------------------ */

/* Named documents whose KV is kept under position-free content keys. A
 * runtime with a disk tier keeps its index of documents in the first disk
 * tier's directory (knowledge.kdnidx, saved 200 ms after a change and when
 * the runtime is freed): a runtime opened on that directory again has the
 * documents, with the chunks the disk tier kept. Without a disk tier the
 * index lives in memory only. */

/* Stores a document (doc_id of 1..255 bytes, version, metadata, tokens and
 * their KV computed from position 0); replaces an older version of the same
 * doc_id. The runtime's index of documents is bounded (64 MiB, charged 4
 * bytes per token, 320 per chunk and ~460 per document): a put that would exceed it
 * first drops documents whose KV left every tier (their fetch is
 * KDN_ERR_NOT_FOUND anyway), oldest first; if there is still no room it
 * stores nothing and returns KDN_ERR_BUSY. Live, pinned and expiring
 * documents are never dropped to make room: delete or expire documents. */
KDN_API kdn_status kdn_knowledge_put(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                     size_t doc_id_len, uint64_t version, const char *metadata, size_t metadata_len,
                                     const int32_t *tokens, size_t num_tokens, const kdn_kv_view *views,
                                     size_t num_views);

/* A document (output). */
typedef struct kdn_document_info {
  uint32_t struct_size;
  uint32_t filled_size;
  uint32_t doc_id_len;
  uint32_t pinned;           /* 1: pinned */
  char doc_id[256];          /* NUL-terminated */
  uint64_t version;
  uint64_t num_tokens;
  uint32_t chunks;
  uint32_t chunks_present;   /* chunks some tier holds now */
  int64_t expires_in_ms;     /* -1: never */
  /* Since 1.4 (filled_size says whether the library filled it). */
  uint64_t hits;             /* chunks of it served (kdn_knowledge_fetch, kdn_kv_blend) since this version was put */
  int64_t pin_expires_in_ms; /* pinned with a TTL: ms until the pin ends; -1: not pinned, or pinned until unpinned */
} kdn_document_info;
#define KDN_DOCUMENT_INFO_SIZE_V1 304u
#define KDN_DOCUMENT_INFO_INIT { sizeof(kdn_document_info), 0u, 0u, 0u, {0}, 0u, 0u, 0u, 0u, -1, 0u, -1 }
KDN_API kdn_status kdn_document_info_init(kdn_document_info *info, size_t struct_size);

/* One document's information. KDN_ERR_NOT_FOUND: no such document. */
KDN_API kdn_status kdn_knowledge_get_info(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                          size_t doc_id_len, kdn_document_info *out);
/* Up to `capacity` documents of this model and namespace, in doc_id order
 * (out is an array of versioned structs); *out_count gets how many there are. */
KDN_API kdn_status kdn_knowledge_list(const kdn_model *model, const char *ns, size_t ns_len, kdn_document_info *out,
                                      size_t capacity, size_t *out_count);
/* Pins every chunk of the document for ttl_ms (0: until unpinned). */
KDN_API kdn_status kdn_knowledge_pin(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                     size_t doc_id_len, int64_t ttl_ms);
KDN_API kdn_status kdn_knowledge_unpin(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                       size_t doc_id_len);
/* The document is deleted ttl_ms from now (0: now). */
KDN_API kdn_status kdn_knowledge_expire(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                        size_t doc_id_len, int64_t ttl_ms);
/* Removes the document's chunks from every tier (chunks another document
 * shares stay). */
KDN_API kdn_status kdn_knowledge_delete(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                        size_t doc_id_len);
/* The document's tokens and KV, read under one snapshot of the document:
 * its KV at its own positions into the views (token i = its token i;
 * num_views 0: none), its tokens into `tokens` (NULL: none). out
 * (required): tokens = the document's length, also on
 * KDN_ERR_BUFFER_TOO_SMALL, which is returned, with nothing written, when
 * the views' num_tokens or tokens_capacity is smaller than the document (a
 * concurrent put may have made it longer: then state is KDN_OP_FAILED and
 * status KDN_ERR_BUFFER_TOO_SMALL); flags. */
KDN_API kdn_status kdn_knowledge_fetch(const kdn_model *model, const char *ns, size_t ns_len, const char *doc_id,
                                       size_t doc_id_len, const kdn_kv_view *views, size_t num_views, int32_t *tokens,
                                       size_t tokens_capacity, kdn_kv_result *out);

/* ---- Statistics ----------------------------------------------------------- */

/* A runtime's counters (output). */
typedef struct kdn_stats {
  uint32_t struct_size;
  uint32_t filled_size;
  uint64_t lookups;          /* requests looked up */
  uint64_t retrieves;        /* loads: kdn_kv_retrieve calls and finished load ops */
  uint64_t stores;           /* stores: kdn_kv_store calls and finished save ops */
  uint64_t hits;             /* chunks served by loads */
  uint64_t misses;           /* loads that stopped short of the request */
  uint64_t tokens_served;    /* tokens written by loads */
  uint64_t tokens_stored;    /* tokens newly stored */
  uint64_t bytes_served;     /* KV bytes written by loads */
  uint64_t bytes_stored;     /* KV bytes newly stored */
  uint64_t chunks;           /* chunks held now, all tiers */
  uint64_t used_bytes;       /* bytes held now, all tiers (memory tiers count whole 4 KiB pages) */
  uint64_t capacity_bytes;   /* capacity, all tiers */
  uint64_t evictions;        /* chunks evicted from a tier (demoted or dropped) */
  uint64_t edited_served;    /* chunks served that an editor had rewritten */
  uint64_t leases_active;    /* chunks held by loads in progress */
  uint64_t pins_active;
  uint64_t pins_forced_unpin; /* pins that ran out of TTL and were dropped */
  uint64_t corrupt_detected; /* objects that failed a check on read (and were dropped) */
  uint64_t edits;            /* chunks rewritten by an editor */
  /* Since 1.4 (filled_size says whether the library filled them). */
  uint64_t tokens_requested; /* tokens loads asked for: the hit rate is tokens_served / this */
  uint64_t prefill_tokens;   /* tokens whose prefill engines reported (kdn_model_report_prefill) */
  uint64_t prefill_ns;       /* the time those prefills took */
  uint64_t ttft_saved_ns;    /* prefill time the loads saved: each load's tokens served x its model's
                                mean reported prefill time per token at that moment; and the blends'
                                (kdn_kv_blend): positions x (1 - recompute_fraction) x that mean */
  uint64_t tokens_served_unpriced; /* tokens served while their model had no report (not in ttft_saved_ns) */
  uint64_t delivery_ns;      /* time spent in loads (retrieves and load ops), hits and misses */
  uint64_t lookup_tokens;    /* tokens the looked-up requests covered */
  uint64_t lookup_hit_tokens; /* of them, the leading tokens found cached (kdn_lookup_result.cached_tokens) */
  /* Since 1.7. */
  uint64_t recompute_tokens; /* cached tokens loads left to recompute: their tiers deliver slower than
                                the engine prefills (kdn_runtime_options.load_slower_than_prefill) */
} kdn_stats;
#define KDN_STATS_SIZE_V1 160u
#define KDN_STATS_INIT \
  { sizeof(kdn_stats), 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, \
    0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u }
KDN_API kdn_status kdn_stats_init(kdn_stats *stats, size_t struct_size);
KDN_API kdn_status kdn_runtime_get_stats(kdn_runtime *runtime, kdn_stats *out);

typedef enum kdn_latency_kind {
  KDN_LATENCY_LOOKUP = 0, /* per looked-up request */
  KDN_LATENCY_LOAD = 1,   /* retrieves and load ops */
  KDN_LATENCY_STORE = 2,  /* stores and save ops */
  KDN_LATENCY_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_latency_kind;

/* A latency distribution in microseconds (output). */
typedef struct kdn_latency {
  uint32_t struct_size;
  uint32_t filled_size;
  uint64_t count;
  double mean_us, p50_us, p90_us, p99_us, max_us;
} kdn_latency;
#define KDN_LATENCY_SIZE_V1 56u
#define KDN_LATENCY_INIT { sizeof(kdn_latency), 0u, 0u, 0.0, 0.0, 0.0, 0.0, 0.0 }
KDN_API kdn_status kdn_latency_init(kdn_latency *latency, size_t struct_size);
KDN_API kdn_status kdn_runtime_get_latency(kdn_runtime *runtime, kdn_latency_kind kind, kdn_latency *out);

/* One tier's counters (output). */
typedef struct kdn_tier_stats {
  uint32_t struct_size;
  uint32_t filled_size;
  kdn_tier_kind kind;
  uint32_t reserved0;
  char name[16];             /* NUL-terminated */
  char codec[32];            /* the tier's codec spec, NUL-terminated (cut if longer) */
  uint64_t hits, misses, puts, put_refusals, evictions;
  uint64_t demotions_in, promotions_in, bytes_in, bytes_out;
  uint64_t objects, used_bytes, capacity_bytes;
  uint64_t corrupt_detected; /* objects that failed a check or did not decode (removed) */
  uint64_t encoded_chunks;   /* chunks encoded for this tier */
  uint64_t bytes_before_encoding, bytes_after_encoding; /* compression ratio: before / after */
  uint64_t encode_failures;  /* chunks that did not encode (stored raw) */
  uint64_t decode_failures;  /* chunks read back that did not decode (misses, removed) */
  /* Since 1.2 (filled_size says whether the library filled them). */
  uint64_t io_errors;        /* reads and writes that failed: for a remote tier, the misses its node cost */
  uint64_t remote_calls, remote_failed_calls, remote_timeouts; /* KDN_TIER_REMOTE: calls to the node;
                                                                  KDN_TIER_REDIS (1.3): commands sent,
                                                                  commands that failed, pipelines that
                                                                  timed out */
  uint64_t write_queue_full;   /* KDN_TIER_REMOTE: puts refused with the write-back queue full */
  uint64_t write_queued_bytes; /* KDN_TIER_REMOTE: bytes waiting in the write-back queue now */
  /* Since 1.4: fractions of capacity; a put that would cross high evicts
   * first, down to low. 0 and 0: the tier has none (remote, redis). */
  double high_watermark, low_watermark;
  /* Since 1.7: how fast this tier delivers, measured on the loads it
   * served (read, decode and copy into the views, per token of KV; a moving
   * average), into host views and into device views; 0 until measured. A
   * load compares them with the engine's prefill time per token
   * (kdn_runtime_options.load_slower_than_prefill). */
  double delivery_ns_per_token, device_delivery_ns_per_token;
  uint64_t recompute_chunks; /* its chunks loads left to recompute as slower than prefill */
  /* Since 1.8: of corrupt_detected, the chunks whose seal failed (a runtime
   * with a secret: none, another secret's, or a MAC that does not match). */
  uint64_t auth_failures;
} kdn_tier_stats;
#define KDN_TIER_STATS_SIZE_V1 208u
#define KDN_TIER_STATS_INIT                                                                          \
  { sizeof(kdn_tier_stats), 0u, KDN_TIER_HOST, 0u, {0}, {0}, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, \
    0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0.0, 0.0, 0.0, 0.0, 0u, 0u }
KDN_API kdn_status kdn_tier_stats_init(kdn_tier_stats *stats, size_t struct_size);

KDN_API kdn_status kdn_runtime_get_tier_count(kdn_runtime *runtime, uint32_t *out);
/* Tier `index` (0 = highest). */
KDN_API kdn_status kdn_runtime_get_tier_stats(kdn_runtime *runtime, uint32_t index, kdn_tier_stats *out);

/* Since 1.13: a namespace with a quota in a tier, now (output). */
typedef struct kdn_quota_stats {
  uint32_t struct_size;
  uint32_t filled_size;
  uint8_t ns_hash[32];       /* kdn's hash of the namespace, as chunk envelopes record it:
                                SHA-256 of "kdn-namespace-v1" then the namespace, each as a
                                u64 little-endian length and its bytes (docs/storage.md) */
  uint64_t quota_bytes;
  uint64_t used_bytes;       /* its chunks' bytes the tier holds */
  uint64_t objects;
  uint64_t quota_evictions;  /* its chunks evicted to keep it within its quota (its own puts) */
  uint64_t room_evictions;   /* its chunks evicted for the tier's room (the tier full of quota'd chunks) */
  uint64_t refused;          /* its puts refused here: one chunk larger than its quota */
} kdn_quota_stats;
#define KDN_QUOTA_STATS_SIZE_V1 88u
#define KDN_QUOTA_STATS_INIT { sizeof(kdn_quota_stats), 0u, {0}, 0u, 0u, 0u, 0u, 0u, 0u }
KDN_API kdn_status kdn_quota_stats_init(kdn_quota_stats *stats, size_t struct_size);
/* The quotas of tier `index` in the order kdn_tier_config.quotas gave them:
 * *out_count is their number, of which the first `capacity` are written to
 * `out` (an array of kdn_quota_stats, each with its struct_size set; the
 * first one's size is the array's stride). A chunk a disk tier held at
 * start counts toward no quota until it is stored again. */
KDN_API kdn_status kdn_runtime_get_quota_stats(kdn_runtime *runtime, uint32_t index, kdn_quota_stats *out,
                                               size_t capacity, size_t *out_count);

/* ========================================================================== */
/* ---- Experimental ---------------------------------------------------------
 * Not frozen: may change in any minor release; not covered by the ABI check.
 * Define KDN_EXPERIMENTAL before including this header to use it. Why each
 * part is here: the editor's contract (what it may change, when it runs) and
 * the blender's callback (how an engine exposes one layer's recompute) have
 * one user each so far; both will change once llama.cpp and a second engine
 * use them. */
#ifdef KDN_EXPERIMENTAL

/* A stored chunk, as an editor sees it (output). */
typedef struct kdn_chunk_info {
  uint32_t struct_size;
  uint32_t filled_size;
  uint32_t num_layers, num_kv_heads, head_dim, num_tokens;
  kdn_dtype dtype;           /* the model's dtype */
  uint32_t reserved0;
  int64_t first_position;    /* position of the chunk's first token; -1 = position-free */
  uint8_t model_fingerprint[32];
} kdn_chunk_info;
#define KDN_CHUNK_INFO_INIT { sizeof(kdn_chunk_info), 0u, 0u, 0u, 0u, 0u, KDN_DTYPE_F32, 0u, 0, {0} }
KDN_API kdn_status kdn_chunk_info_init(kdn_chunk_info *info, size_t struct_size);

/* An editor rewrites a chunk's KV after it is stored, before it reaches the
 * lower tiers (offline KV editing). kv holds kv_bytes bytes in the canonical
 * layout [layer][k|v][token][kv_head][head_dim]: write the new KV in place
 * and set *out_changed to 1. A non-OK return leaves the chunk as it was.
 * Thread: the runtime's background mover thread, one chunk at a time; every
 * argument is borrowed for the call. It must not call kdn functions that
 * take a runtime, model or op: they fail with KDN_ERR_INVALID_ARGUMENT
 * there (they could wait for the thread that runs the editor). The destroy
 * functions are the exception: see kdn_runtime_create_with_editor. */
typedef kdn_status (*kdn_edit_fn)(void *user, const kdn_chunk_info *info, void *kv, size_t kv_bytes,
                                  int *out_changed);

/* kdn_runtime_create with an editor. `user` must stay valid until the
 * runtime is freed (the last of the runtime, its models and ops destroyed).
 * The destroy functions may be called from inside the editor: the handle is
 * then freed on another thread once the callback has returned. */
KDN_API kdn_status kdn_runtime_create_with_editor(const kdn_runtime_options *options, kdn_edit_fn editor,
                                                  void *user, kdn_runtime **out);

/* Blending (CacheBlend): composes a context from pieces whose KV was
 * computed alone (RAG chunks in any order): cached documents are placed and
 * their keys rotated to their new positions; at the check layers the cached
 * tokens whose keys deviate most from a fresh computation are selected, and
 * only those (and the tokens computed now) are recomputed in the later
 * layers, by the engine, through a callback. */

typedef enum kdn_segment_kind {
  KDN_SEGMENT_DOCUMENT = 0, /* a knowledge item by doc_id (kdn_knowledge_put) */
  KDN_SEGMENT_TOKENS = 1,   /* tokens computed now (the query, anything not cached) */
  KDN_SEGMENT_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_segment_kind;

/* One piece of the context (input). */
typedef struct kdn_blend_segment {
  uint32_t struct_size;
  kdn_segment_kind kind;
  const char *doc_id;      /* DOCUMENT */
  size_t doc_id_len;
  const int32_t *tokens;   /* TOKENS */
  size_t num_tokens;
} kdn_blend_segment;
#define KDN_BLEND_SEGMENT_INIT { sizeof(kdn_blend_segment), KDN_SEGMENT_TOKENS, NULL, 0u, NULL, 0u }
KDN_API kdn_status kdn_blend_segment_init(kdn_blend_segment *segment, size_t struct_size);

/* The engine's recompute of layer `layer` for `count` positions (ascending)
 * of the composed context of `total` positions.
 * - tokens: count ids at layer 0 (the engine embeds them); NULL after.
 * - hidden: count * hidden_dim floats (hidden_len): the layer's input (unset
 *   at layer 0) and, on return, the layer's output.
 * - k, v: this layer's float32 KV of all positions, [position][kv_heads *
 *   head_dim], kv_len floats each: write the positions' K (after RoPE at
 *   their positions) and V, and attend each position causally over [0, its
 *   own] of k and v. A latent model's (KDN_CACHE_LATENT, since 1.12): k is
 *   each position's latent vector, [position][latent_dim] (its RoPE dims
 *   after RoPE at the position), and v is NULL.
 * Return KDN_OK, or an error status: kdn_kv_blend then stops and returns it.
 * Thread: the one that called kdn_kv_blend, layer by layer in order; every
 * buffer is borrowed for the call. It may call kdn functions (no kdn lock is
 * held while it runs). */
typedef kdn_status (*kdn_blend_layer_fn)(void *user, uint32_t layer, const int32_t *positions, const int32_t *tokens,
                                         size_t count, float *hidden, size_t hidden_len, uint32_t hidden_dim,
                                         float *k, float *v, size_t kv_len, size_t total);

typedef enum kdn_rope_scaling {
  KDN_ROPE_SCALING_NONE = 0,
  KDN_ROPE_SCALING_LINEAR = 1, /* positions divided by rope_factor */
  KDN_ROPE_SCALING_NTK = 2,    /* theta * rope_factor^(r / (r - 2)) */
  KDN_ROPE_SCALING_FORCE32_ = 0x7FFFFFFF
} kdn_rope_scaling;

/* How to blend (input). The defaults (ratio -1, check_layers NULL) were
 * chosen on a tuning text and reported on held-out ones (docs/blending.md):
 * - with kv_fn: ratio 0.28, check layers { 1, 2 } (a 2-layer model { 1 }, a
 *   1-layer one { 0 }): about the work of CacheBlend's 15% at one whole
 *   check layer, for a third of its KL on the reference model;
 * - without: ratio 0.15, check layer { 1 } ({ 0 }): CacheBlend's setting. */
typedef struct kdn_blend_options {
  uint32_t struct_size;
  float ratio;                    /* fraction of cached tokens recomputed, in [0, 1]; -1 (default): see above */
  float threshold;                /* >= 0: select by key deviation >= threshold instead; default -1 */
  uint32_t hidden_dim;            /* the engine's hidden width (rows of `hidden`); must be set */
  const uint32_t *check_layers;   /* ascending; NULL: see above */
  size_t num_check_layers;
  kdn_rope_scaling rope_scaling;  /* the model spec gives theta, style and rotary_dim */
  float rope_factor;              /* default 1 */
  kdn_blend_layer_fn layer_fn;    /* must be set */
  void *user;                     /* passed to layer_fn and kv_fn; borrowed for the call */
  /* Since 1.9. A KV pass: layer `layer`'s K and V alone for `positions`
   * (the same arguments as layer_fn; write their K and V as layer_fn does,
   * bit for bit, and nothing else: no attention; `hidden` is the layer's
   * input, scratch after the call). With it a check layer costs, for the
   * tokens it drops, only their K and V: each candidate gets a KV pass, the
   * selection is made on those keys, and only the selected and fresh tokens
   * run the whole layer. The KV is the same as without it; the work less.
   * NULL: check layers run whole. */
  kdn_blend_layer_fn kv_fn;
  float kv_cost;                  /* with kv_fn, must be set: its work per position over a whole layer's, in (0, 1]
                                     (counted into recompute_fraction; e.g. 2 x kv_dim x hidden_dim over the
                                     layer's multiply-adds per token) */
  uint32_t first_tokens;          /* leading tokens of each document recomputed at every layer (EPIC,
                                     LegoLink: a document computed alone puts its attention sink there); default 0 */
  /* Since 1.9. The accuracy gate: a file `kdn blend calibrate` wrote (one
   * line per model fingerprint and method: the KL(blend) / KL(naive reuse)
   * measured on a calibration text). With it, the blend runs only when the
   * file holds this model's measurement for the method these options
   * resolve to (ratio, check layers, kv_fn or not, first_tokens) at or below
   * max_kl_ratio; otherwise every position is recomputed (the context is
   * full prefill, exact) and report->gated says so. NULL: no gate. */
  const char *gate_file;
  size_t gate_file_len;
  float max_kl_ratio;             /* with gate_file; default 0.2 */
  /* Since 1.10 (1.9: reserved, 0). KDN_BLEND_* flags below; other bits are
   * refused. */
  uint32_t flags;
} kdn_blend_options;
/* The engine computes on the device (a GPU): the views must be in device
 * memory (KDN_MEMORY_DEVICE, a runtime with a device), and the blend is
 * composed there. layer_fn and kv_fn then get device pointers for hidden,
 * k and v (float32, the lengths and layouts above; positions and tokens
 * stay host arrays). kdn's device work is complete when a callback is
 * called, and the callback's must be complete when it returns (synchronize
 * the stream it used). The pieces' KV crosses to the device once; the keys
 * are re-positioned and the check layers' keys compared there; only one
 * double per candidate and check layer comes back to the host, where the
 * selection is made; the composed KV is converted to the model's dtype and
 * written into the views by the device. Without it (0) the engine is on
 * the host: the blend is composed in host memory and copied to device
 * views. */
#define KDN_BLEND_ENGINE_ON_DEVICE 1u
#define KDN_BLEND_OPTIONS_SIZE_V1 56u
#define KDN_BLEND_OPTIONS_INIT \
  { sizeof(kdn_blend_options), -1.0f, -1.0f, 0u, NULL, 0u, KDN_ROPE_SCALING_NONE, 1.0f, NULL, NULL, NULL, 0.0f, 0u, \
    NULL, 0u, 0.2f, 0u }
KDN_API kdn_status kdn_blend_options_init(kdn_blend_options *options, size_t struct_size);

/* What a blend did (output). */
typedef struct kdn_blend_report {
  uint32_t struct_size;
  uint32_t filled_size;
  uint32_t positions;           /* of the composed context */
  uint32_t cached_positions;    /* placed from documents */
  uint32_t fresh_positions;     /* computed now */
  uint32_t selected;            /* cached positions recomputed past the last check layer */
  double recompute_fraction;    /* layer x position work recomputed / a full prefill's (KV passes at kv_cost) */
  /* Since 1.9 (filled_size says whether the library filled them). */
  uint32_t anchored;            /* cached positions recomputed at every layer (first_tokens) */
  uint32_t kv_passes;           /* positions x layers given only a KV pass */
  float ratio;                  /* the ratio used (the default resolved) */
  uint32_t num_check_layers;    /* the check layers used */
  uint32_t gated;               /* 1: the gate refused the method: every position was recomputed */
  float gate_kl_ratio;          /* the gate file's KL ratio for the method; -1: none (or no gate) */
} kdn_blend_report;
#define KDN_BLEND_REPORT_SIZE_V1 32u
#define KDN_BLEND_REPORT_INIT { sizeof(kdn_blend_report), 0u, 0u, 0u, 0u, 0u, 0.0, 0u, 0u, 0.0f, 0u, 0u, -1.0f }
KDN_API kdn_status kdn_blend_report_init(kdn_blend_report *report, size_t struct_size);

/* Blends the segments (an array of versioned structs), in order, into the
 * views (the whole context: the sum of the segments' tokens, in the model's
 * dtype). Each document is read under one snapshot, and its length is
 * known only then (a put may replace it meanwhile): when a segment is a
 * document, the views must state their room (num_tokens), and a context
 * longer than it is KDN_ERR_BUFFER_TOO_SMALL with nothing written
 * (report->positions is not filled: get_info tells the document's length).
 * Fills *report (may be NULL). KDN_ERR_NOT_FOUND when a document is unknown
 * or a chunk of it is gone from every tier (put it again); the callback's
 * status when it fails. */
KDN_API kdn_status kdn_kv_blend(const kdn_model *model, const char *ns, size_t ns_len,
                                const kdn_blend_segment *segments, size_t num_segments,
                                const kdn_blend_options *options, const kdn_kv_view *views, size_t num_views,
                                kdn_blend_report *report);

/* Since 1.9. Blending by text, as the KDN paper's API has it: the engine
 * hands kdn its whole context's tokens. kdn_kv_match finds where the chunks
 * of this namespace's knowledge items (kdn_knowledge_put) occur in them, at
 * any offset (a rolling hash over 16-token windows, each hit confirmed by the
 * chunk's content key, so a collision never matches), and writes up to
 * `capacity` of those ranges [begin, end) into `cached`, ascending and not
 * overlapping (consecutive chunks of one document that follow each other
 * are one range); *out_count gets how many there are. The positions outside
 * them are the ones the engine must compute. A chunk shorter than 16 tokens
 * (a document's short last chunk; with shorter chunk_tokens, shorter than a
 * chunk) counts only right after its document's previous chunk: alone, a
 * few tokens recur by chance. Matching reads the index, not
 * the tiers: a range whose chunks were evicted since is computed by
 * kdn_kv_blend_tokens. */
KDN_API kdn_status kdn_kv_match(const kdn_model *model, const char *ns, size_t ns_len, const int32_t *tokens,
                                size_t num_tokens, kdn_token_range *cached, size_t capacity, size_t *out_count);

/* Since 1.9. kdn_kv_blend with the context given as its tokens: the ranges
 * kdn_kv_match finds are placed from their documents' cached KV (each
 * document read once, under one snapshot; a range whose document no longer
 * holds those tokens there is computed instead), every other token is
 * computed through layer_fn, and the blend recomputes what `options` select.
 * The views hold num_tokens positions (their num_tokens 0 or at least
 * that). report->cached_positions says how much was placed. */
KDN_API kdn_status kdn_kv_blend_tokens(const kdn_model *model, const char *ns, size_t ns_len, const int32_t *tokens,
                                       size_t num_tokens, const kdn_blend_options *options, const kdn_kv_view *views,
                                       size_t num_views, kdn_blend_report *report);

#endif /* KDN_EXPERIMENTAL */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KDN_KDN_H */
