/* kdn: Knowledge Delivery Network runtime, C ABI.
 *
 * This is the only installed header. It is C99 and C++ clean. Conventions:
 * - Every fallible call returns a kdn_status (KDN_OK = 0, errors negative; the
 *   values are pinned forever). On error, kdn_last_error_message() says why.
 * - Results come back through out-parameters, placed last.
 * - Options structs start with `struct_size`; initialise them with their
 *   _INIT macro or _init() function. The library reads only the fields below
 *   struct_size and defaults the rest, so an older caller keeps working. A
 *   NULL options pointer means defaults.
 * - Strings are (pointer, length) pairs and need not be NUL-terminated.
 * - Handles are opaque: kdn_x_create(..., kdn_x **out) / kdn_x_destroy(x);
 *   destroying NULL is a no-op.
 * - No C++ exception ever crosses this boundary.
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

#define KDN_VERSION_MAJOR 0
#define KDN_VERSION_MINOR 1
#define KDN_VERSION_PATCH 0
#define KDN_VERSION_NUMBER \
  (KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH)

/* The library's version number (as KDN_VERSION_NUMBER) at run time. */
KDN_API uint32_t kdn_version_number(void);
/* The library's version as "MAJOR.MINOR.PATCH". Static storage. */
KDN_API const char *kdn_version(void);

/* ---- Status ------------------------------------------------------------- */

/* What the caller can do about a failure. Values are pinned forever. */
typedef enum kdn_status {
  KDN_OK = 0,
  /* A NULL handle or pointer, a bad size or count, a wrong struct_size, a
   * buffer too small, a handle of another runtime: fix the call. */
  KDN_ERR_INVALID_ARGUMENT = -1,
  /* Nothing is cached for these tokens under this model and namespace. */
  KDN_ERR_NOT_FOUND = -2,
  /* Temporarily unable (overloaded, full, timed out): retry later. */
  KDN_ERR_RETRY_LATER = -3,
  /* A remote peer is unreachable: reconnect. */
  KDN_ERR_UNAVAILABLE = -4,
  /* Stored or received bytes failed a check: treat as a miss. */
  KDN_ERR_CORRUPT = -5,
  /* Valid, but not supported by this build or version. */
  KDN_ERR_UNSUPPORTED = -6,
  /* Out of memory. */
  KDN_ERR_NO_MEMORY = -7,
  /* A bug in kdn: please report it with the message. */
  KDN_ERR_INTERNAL = -8,
  KDN_STATUS_FORCE32_ = 0x7FFFFFFF
} kdn_status;

/* A static, human-readable name for a status ("KDN_ERR_NOT_FOUND"). Never NULL. */
KDN_API const char *kdn_status_str(kdn_status status);

/* The message of the last failed call on this thread, or "" when the last
 * call succeeded. Never NULL; valid until the next kdn call on this thread.
 * For humans only: never parse it. */
KDN_API const char *kdn_last_error_message(void);

/* ---- Element types ------------------------------------------------------ */

typedef enum kdn_dtype {
  KDN_DTYPE_F32 = 0,
  KDN_DTYPE_F16 = 1,
  KDN_DTYPE_BF16 = 2,
  KDN_DTYPE_FORCE32_ = 0x7FFFFFFF
} kdn_dtype;

/* ---- Runtime ------------------------------------------------------------ */

/* A runtime: the store and its tiers. Everything else hangs off it.
 * Thread-safety: all functions taking a kdn_runtime may be called from any
 * number of threads at once, except kdn_runtime_destroy, which must be the
 * last call on it (and on its models). */
typedef struct kdn_runtime kdn_runtime;

/* The tiers of a runtime's store, highest (fastest) first. */
typedef enum kdn_tier_kind {
  KDN_TIER_HOST = 0,   /* host memory: pinned when a GPU is present */
  KDN_TIER_DEVICE = 1, /* GPU memory; host memory standing in for it without a GPU */
  KDN_TIER_DISK = 2,   /* one file per chunk, checksummed, crash-safe */
  KDN_TIER_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_tier_kind;

typedef enum kdn_eviction_policy {
  KDN_EVICT_LRU = 0,
  KDN_EVICT_S3FIFO = 1, /* scan-resistant (S3-FIFO) */
  KDN_EVICT_FORCE32_ = 0x7FFFFFFF
} kdn_eviction_policy;

typedef struct kdn_tier_config {
  uint32_t struct_size;
  kdn_tier_kind kind;
  uint64_t capacity_bytes;
  const char *path;          /* disk: the directory (created if absent) */
  size_t path_len;
  kdn_eviction_policy policy;
  float high_watermark;      /* a put that would cross it evicts first; 0 = 0.95 */
  float low_watermark;       /* ...down to this fraction of capacity; 0 = 0.85 */
  uint32_t write_through;    /* 1: new chunks are copied to the next tier too */
  /* --- appended in 0.2 (tier codecs) --- */
  /* How the tier stores chunks: a codec spec, e.g. "raw", "fp8", "int8",
   * "kivi2", "cachegen", "cachegen:bins=16", "kdn", "kdn:hifi". NULL or
   * empty (and older callers): raw for host and device tiers, kdn's
   * compressing codec for disk tiers. Chunks are encoded off the engine's
   * threads (on demotion, or by the worker that runs a save; a synchronous
   * kdn_store that lands in such a tier encodes in the call) and decoded
   * on load; the tier's capacity counts encoded bytes. An unknown codec or
   * parameter is KDN_ERR_INVALID_ARGUMENT. */
  const char *codec;
  size_t codec_len;
} kdn_tier_config;

#define KDN_TIER_CONFIG_INIT \
  { sizeof(kdn_tier_config), KDN_TIER_HOST, 1073741824u, NULL, 0u, KDN_EVICT_LRU, 0.0f, 0.0f, 0u, NULL, 0u }
KDN_API void kdn_tier_config_init(kdn_tier_config *config);

/* Information about a stored chunk, for editor callbacks. */
typedef struct kdn_chunk_info {
  uint32_t struct_size;
  uint32_t num_layers, num_kv_heads, head_dim, num_tokens;
  kdn_dtype dtype;           /* the model's dtype */
  int64_t first_position;    /* position of the chunk's first token; -1 = position-free */
  uint8_t model_fingerprint[32];
} kdn_chunk_info;

/* An editor rewrites a chunk's KV after it is stored, before it reaches the
 * lower tiers (offline KV editing). kv holds the canonical layout
 * [layer][k|v][token][kv_head][head_dim]; write the new KV in place and set
 * *out_changed to 1. Called on the runtime's background thread, one chunk at
 * a time; every argument is borrowed for the call. A failure leaves the
 * chunk as it was. */
typedef kdn_status (*kdn_edit_fn)(void *user, const kdn_chunk_info *info, void *kv, size_t kv_bytes,
                                  int *out_changed);

typedef struct kdn_runtime_options {
  uint32_t struct_size;
  uint32_t chunk_tokens;        /* tokens per stored chunk; default 256 */
  uint64_t host_capacity_bytes; /* host tier capacity when tiers is NULL; default 1 GiB */
  uint64_t hash_seed;           /* seed of every key hash; default 0. Runtimes
                                   that share KV must share the seed. */
  /* --- appended in 0.2 --- */
  const kdn_tier_config *tiers; /* NULL: one host tier of host_capacity_bytes,
                                   evicting exactly at capacity */
  size_t num_tiers;
  kdn_edit_fn editor;           /* NULL: no editing */
  void *editor_user;
  uint32_t worker_threads;      /* background loads and saves; 0 = 2 */
  uint32_t reserved_;
} kdn_runtime_options;

#define KDN_RUNTIME_OPTIONS_INIT \
  { sizeof(kdn_runtime_options), 256u, 1073741824u, 0u, NULL, 0u, NULL, NULL, 0u, 0u }
KDN_API void kdn_runtime_options_init(kdn_runtime_options *options);

/* Creates a runtime. options may be NULL (defaults). */
KDN_API kdn_status kdn_runtime_create(const kdn_runtime_options *options,
                                      kdn_runtime **out);
KDN_API void kdn_runtime_destroy(kdn_runtime *runtime);

/* ---- Models ------------------------------------------------------------- */


typedef enum kdn_rope_style {
  KDN_ROPE_INTERLEAVED = 0, /* pairs (2j, 2j+1): llama2.c, GPT-J, Meta Llama */
  KDN_ROPE_NEOX = 1,        /* pairs (j, j + rotary_dim/2): HF Llama, NeoX */
  KDN_ROPE_STYLE_FORCE32_ = 0x7FFFFFFF
} kdn_rope_style;

/* The shape of a model's KV and what identifies its weights. KV is only ever
 * returned to a model with the same spec and fingerprint. */
typedef struct kdn_model_spec {
  uint32_t struct_size;
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  kdn_dtype dtype;
  float rope_theta;            /* default 10000 */
  kdn_rope_style rope_style;   /* default interleaved */
  uint32_t rotary_dim;         /* 0 = head_dim */
  /* Identifies weights, tokenizer, layout, TP rank/size, adapters: anything
   * that changes the KV. Opaque bytes, hashed; must not be empty. */
  const char *fingerprint;
  size_t fingerprint_len;
} kdn_model_spec;

#define KDN_MODEL_SPEC_INIT                                                  \
  { sizeof(kdn_model_spec), 0u, 0u, 0u, KDN_DTYPE_F32, 10000.0f,           \
    KDN_ROPE_INTERLEAVED, 0u, NULL, 0u }
KDN_API void kdn_model_spec_init(kdn_model_spec *spec);

/* A registered model.
 * Thread-safety: immutable once created; usable from any thread. Destroy it
 * after its last use and before its runtime. */
typedef struct kdn_model kdn_model;

/* Registers a model with a runtime. The spec and its strings are copied. */
KDN_API kdn_status kdn_model_create(kdn_runtime *runtime,
                                    const kdn_model_spec *spec,
                                    kdn_model **out);
KDN_API void kdn_model_destroy(kdn_model *model);

/* The 32-byte identity kdn derived from the spec (shape + fingerprint). */
KDN_API kdn_status kdn_model_fingerprint(const kdn_model *model,
                                         uint8_t out[32]);

/* ---- KV buffers --------------------------------------------------------- */

typedef enum kdn_memory_kind {
  KDN_MEMORY_HOST = 0,
  KDN_MEMORY_DEVICE = 1, /* CUDA device memory (builds with CUDA, on a machine with a GPU) */
  KDN_MEMORY_FORCE32_ = 0x7FFFFFFF
} kdn_memory_kind;

/* Where a caller's KV lives: one base pointer, and the stride in ELEMENTS of
 * each index of the element (layer, kv: 0 = K / 1 = V, token, kv_head, dim).
 * All strides 0 means the canonical layout for num_tokens tokens:
 * [layer][k|v][token][kv_head][head_dim], contiguous. Token index 0 is the
 * first token of the call's token list. Strides must be non-negative.
 * The buffer is borrowed for the duration of the call only. */
typedef struct kdn_kv_buffer {
  uint32_t struct_size;
  kdn_memory_kind memory;
  void *data;
  size_t size_bytes;    /* bytes reachable from data: checked against strides */
  uint64_t num_tokens;  /* tokens the buffer holds */
  kdn_dtype dtype;      /* must equal the model's dtype */
  int64_t stride_layer;
  int64_t stride_kv;
  int64_t stride_token;
  int64_t stride_head;
  int64_t stride_dim;
} kdn_kv_buffer;

#define KDN_KV_BUFFER_INIT                                                    \
  { sizeof(kdn_kv_buffer), KDN_MEMORY_HOST, NULL, 0u, 0u,                    \
    KDN_DTYPE_F32, 0, 0, 0, 0, 0 }
KDN_API void kdn_kv_buffer_init(kdn_kv_buffer *buffer);

/* Bytes of KV per token for a model: layers x 2 x kv_heads x head_dim x dtype. */
KDN_API kdn_status kdn_model_kv_bytes_per_token(const kdn_model *model,
                                                uint64_t *out);

/* ---- Store, lookup, retrieve ------------------------------------------- */

/* Every call names a tenant namespace (non-empty bytes): KV stored under one
 * namespace is never visible under another. Tokens are the ids the model
 * read, in order, from the start of its context. */

/* How many leading tokens of `tokens` have KV cached, without side effects
 * (no statistics of hits, no promotion, no change of eviction order). KV is
 * kept in whole stored chunks: a stored chunk counts only when the request
 * contains all of its tokens (the first 16 tokens of a stored 20-token chunk
 * count as 0). */
KDN_API kdn_status kdn_lookup(kdn_runtime *runtime, const kdn_model *model,
                              const char *ns, size_t ns_len,
                              const int32_t *tokens, size_t num_tokens,
                              uint64_t *out_cached_tokens);

typedef struct kdn_store_options {
  uint32_t struct_size;
  uint32_t reserved_;   /* 0 */
} kdn_store_options;
#define KDN_STORE_OPTIONS_INIT { sizeof(kdn_store_options), 0u }
KDN_API void kdn_store_options_init(kdn_store_options *options);

/* Stores the KV of `tokens` (buffer token i = tokens[i]), split into chunks
 * of the runtime's chunk_tokens; a trailing partial chunk is stored too.
 * Chunks already cached are skipped. When the tokens do not all fit the
 * store, the longest prefix that fits is kept (a store never evicts its own
 * earlier chunks) and the call still succeeds. *out_stored_tokens (optional)
 * gets the number of leading tokens whose KV is cached after the call.
 * options may be NULL. */
KDN_API kdn_status kdn_store(kdn_runtime *runtime, const kdn_model *model,
                             const char *ns, size_t ns_len,
                             const int32_t *tokens, size_t num_tokens,
                             const kdn_kv_buffer *kv,
                             const kdn_store_options *options,
                             uint64_t *out_stored_tokens);

/* Writes the cached KV of the longest cached prefix of `tokens` into `kv`
 * (buffer token i = tokens[i]); *out_filled_tokens gets its length. The
 * buffer must hold num_tokens tokens. Returns KDN_ERR_NOT_FOUND, with
 * *out_filled_tokens = 0, when no leading token is cached. */
KDN_API kdn_status kdn_retrieve(kdn_runtime *runtime, const kdn_model *model,
                                const char *ns, size_t ns_len,
                                const int32_t *tokens, size_t num_tokens,
                                const kdn_kv_buffer *kv,
                                uint64_t *out_filled_tokens);

/* ---- Statistics --------------------------------------------------------- */

/* A latency distribution in microseconds. */
typedef struct kdn_latency {
  uint64_t count;
  double mean_us, p50_us, p90_us, p99_us, max_us;
} kdn_latency;

typedef struct kdn_stats {
  uint32_t struct_size;
  uint32_t reserved_;
  uint64_t lookups;          /* lookup calls (each request of a batch counts) */
  uint64_t retrieves;        /* loads: kdn_retrieve calls and finished load ops */
  uint64_t stores;           /* stores: kdn_store calls and finished save ops */
  uint64_t hits;             /* chunks served by loads */
  uint64_t misses;           /* loads that stopped short of the request */
  uint64_t tokens_served;    /* tokens written by loads */
  uint64_t tokens_stored;    /* tokens newly stored */
  uint64_t bytes_served;     /* KV bytes written by loads */
  uint64_t bytes_stored;     /* KV bytes newly stored */
  uint64_t chunks;           /* chunks held now, all tiers */
  uint64_t used_bytes;       /* bytes held now, all tiers (memory tiers count
                                whole blocks: chunks rounded up to 4 KiB pages) */
  uint64_t capacity_bytes;   /* capacity, all tiers */
  uint64_t evictions;        /* chunks evicted from a tier (demoted or dropped) */
  /* --- appended in 0.2 --- */
  uint64_t edited_served;    /* chunks served that an editor had rewritten */
  uint64_t leases_active;    /* chunks held by loads in progress */
  uint64_t pins_active;
  uint64_t pins_forced_unpin; /* pins that ran out of TTL and were dropped by force */
  uint64_t corrupt_detected; /* objects that failed a check on read (and were dropped) */
  uint64_t edits;            /* chunks rewritten by the editor */
  kdn_latency lookup;
  kdn_latency load;
  kdn_latency store;
} kdn_stats;

#define KDN_LATENCY_ZERO_ { 0u, 0.0, 0.0, 0.0, 0.0, 0.0 }
#define KDN_STATS_INIT                                                                     \
  { sizeof(kdn_stats), 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, \
    0u, 0u, 0u, KDN_LATENCY_ZERO_, KDN_LATENCY_ZERO_, KDN_LATENCY_ZERO_ }
KDN_API void kdn_stats_init(kdn_stats *stats);

/* Fills the fields of *out below out->struct_size (set it first). */
KDN_API kdn_status kdn_runtime_stats(kdn_runtime *runtime, kdn_stats *out);

/* ---- Tier statistics ---------------------------------------------------- */

typedef struct kdn_tier_stats {
  uint32_t struct_size;
  kdn_tier_kind kind;
  char name[16];             /* NUL-terminated */
  uint64_t hits, misses, puts, put_refusals, evictions;
  uint64_t demotions_in, promotions_in, bytes_in, bytes_out;
  uint64_t objects, used_bytes, capacity_bytes;
  uint64_t corrupt_detected; /* objects that failed a check or did not decode (removed) */
  /* --- appended in 0.2 (tier codecs) --- */
  char codec[32];            /* the tier's codec spec, NUL-terminated (cut if longer) */
  uint64_t encoded_chunks;   /* chunks encoded for this tier */
  uint64_t bytes_before_encoding, bytes_after_encoding; /* their KV bytes, and encoded:
                                the compression ratio is before / after */
  uint64_t encode_failures;  /* chunks that did not encode (stored raw) */
  uint64_t decode_failures;  /* chunks read back that did not decode (misses, removed) */
} kdn_tier_stats;
#define KDN_TIER_STATS_INIT                                                                  \
  { sizeof(kdn_tier_stats), KDN_TIER_HOST, {0}, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, \
    {0}, 0u, 0u, 0u, 0u, 0u }

KDN_API kdn_status kdn_runtime_tier_count(kdn_runtime *runtime, uint32_t *out);
/* Fills the fields of *out below out->struct_size for tier `index` (0 = highest). */
KDN_API kdn_status kdn_runtime_tier_stats(kdn_runtime *runtime, uint32_t index, kdn_tier_stats *out);

/* ---- Requests and batched lookups ---------------------------------------- */

/* What identifies a request's tokens: their ids, or the engine's own chained
 * block hashes (engines that already hash their blocks). With hashes, a chunk
 * is chunk_tokens / block_tokens engine blocks and the request covers
 * num_blocks * block_tokens tokens. Arrays are borrowed for the call (for an
 * asynchronous op: they are copied when it starts). */
typedef struct kdn_request {
  uint32_t struct_size;
  uint32_t hash_bytes;          /* 0: token ids; else bytes per block hash (1..64) */
  const int32_t *tokens;
  size_t num_tokens;
  const uint8_t *block_hashes;  /* num_blocks * hash_bytes bytes */
  size_t num_blocks;
  uint32_t block_tokens;        /* tokens per engine block */
  uint32_t reserved_;
} kdn_request;
#define KDN_REQUEST_INIT { sizeof(kdn_request), 0u, NULL, 0u, NULL, 0u, 0u, 0u }

#define KDN_MAX_TIERS 8
typedef struct kdn_lookup_result {
  uint32_t struct_size;
  kdn_status status;               /* this request's own status */
  uint64_t cached_tokens;          /* leading tokens cached in some tier */
  uint32_t num_tiers;
  uint32_t reserved_;
  uint64_t tier_tokens[KDN_MAX_TIERS]; /* per tier: leading tokens that tier alone holds */
} kdn_lookup_result;
#define KDN_LOOKUP_RESULT_INIT { sizeof(kdn_lookup_result), KDN_OK, 0u, 0u, 0u, {0} }

/* Looks up many requests at once, without side effects. results[i] gets
 * request i's outcome (its struct_size must be set): one bad request fails
 * alone. Returns KDN_OK when the call itself was well formed. */
KDN_API kdn_status kdn_lookup_batch(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                                    const kdn_request *requests, size_t num_requests,
                                    kdn_lookup_result *results);

/* ---- KV views and groups -------------------------------------------------- */

typedef enum kdn_kv_layout {
  KDN_LAYOUT_CONTIGUOUS = 0, /* per layer: element (token, head, dim) at the strides below (llama.cpp) */
  KDN_LAYOUT_PAGED_NHD = 1,  /* per layer: [num_blocks][block_size][kv_heads][head_dim] (vLLM) */
  KDN_LAYOUT_PAGED_HND = 2,  /* per layer: [num_blocks][kv_heads][block_size][head_dim] */
  KDN_LAYOUT_FORCE32_ = 0x7FFFFFFF
} kdn_kv_layout;

/* Where an engine's KV lives, for the layers of one group: per-layer base
 * pointers of K and V, and either strides (contiguous) or a block table
 * (paged: logical block i of the request is physical block block_table[i]).
 * Token i of the view is token i of the request. All counts in elements. */
typedef struct kdn_kv_view {
  uint32_t struct_size;
  kdn_memory_kind memory;
  kdn_dtype dtype;
  kdn_kv_layout layout;
  uint32_t num_layers;              /* entries of k_layers and v_layers */
  uint32_t block_size;              /* paged */
  void *const *k_layers;
  void *const *v_layers;
  int64_t stride_token, stride_head, stride_dim;        /* contiguous */
  int64_t v_stride_token, v_stride_head, v_stride_dim;  /* contiguous V when unlike K; 0 = K's */
  uint64_t layer_elements;          /* contiguous: elements per layer allocation; 0 = unchecked */
  const int32_t *block_table;       /* paged */
  size_t block_table_len;
  uint64_t num_blocks;              /* paged: blocks per layer allocation; 0 = unchecked */
  int64_t block_stride;             /* paged: elements between blocks; 0 = dense */
} kdn_kv_view;
#define KDN_KV_VIEW_INIT \
  { sizeof(kdn_kv_view), KDN_MEMORY_HOST, KDN_DTYPE_F32, KDN_LAYOUT_CONTIGUOUS, 0u, 0u, NULL, NULL, \
    0, 0, 0, 0, 0, 0, 0u, NULL, 0u, 0u, 0 }
KDN_API void kdn_kv_view_init(kdn_kv_view *view);

/* A KV group: the model layers it holds (view layer j = model layer
 * layers[j]) and their view. Groups of one request cover every layer once
 * (for example full-attention and sliding-window layers, each with its own
 * block table). */
typedef struct kdn_kv_group {
  uint32_t struct_size;
  uint32_t reserved_;
  const uint32_t *layers;
  size_t num_layers;
  kdn_kv_view view;
} kdn_kv_group;
#define KDN_KV_GROUP_INIT { sizeof(kdn_kv_group), 0u, NULL, 0u, KDN_KV_VIEW_INIT }

/* ---- Asynchronous, layer-by-layer loads and saves ------------------------- */

/* A load or save in progress.
 * Thread-safety: every function taking a kdn_op may be called from any
 * thread, except kdn_op_destroy, which must be the last call on it. */
typedef struct kdn_op kdn_op;

typedef enum kdn_op_state {
  KDN_OP_PENDING = 0,
  KDN_OP_DONE = 1,
  KDN_OP_FAILED = 2,
  KDN_OP_CANCELLED = 3,
  KDN_OP_STATE_FORCE32_ = 0x7FFFFFFF
} kdn_op_state;

/* Starts loading the cached prefix of `request` into the groups' views, layer
 * by layer in the background. The KV memory must stay valid until the op
 * ends; the views' arrays are copied. */
KDN_API kdn_status kdn_load_begin(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                                  const kdn_request *request, const kdn_kv_group *groups, size_t num_groups,
                                  kdn_op **out);
/* Until model layer `layer` is written (timeout_ms < 0: no limit).
 * KDN_ERR_RETRY_LATER on timeout. */
KDN_API kdn_status kdn_op_wait_layer(kdn_op *op, uint32_t layer, int64_t timeout_ms);

/* Starts a save of `request`'s KV from the groups' views. Call
 * kdn_save_layer once per layer as it becomes ready, then kdn_op_wait. */
KDN_API kdn_status kdn_save_begin(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                                  const kdn_request *request, const kdn_kv_group *groups, size_t num_groups,
                                  kdn_op **out);
/* Model layer `layer` is final in the views: it is copied in the background.
 * The caller never waits for disk or encoding work. */
KDN_API kdn_status kdn_save_layer(kdn_op *op, uint32_t layer);

/* Until the op ends (timeout_ms < 0: no limit); the op's own status after.
 * KDN_ERR_RETRY_LATER on timeout. */
KDN_API kdn_status kdn_op_wait(kdn_op *op, int64_t timeout_ms);
KDN_API kdn_status kdn_op_poll(kdn_op *op, kdn_op_state *out);
/* Asks the op to stop; it ends KDN_OP_CANCELLED at its next layer. */
KDN_API kdn_status kdn_op_cancel(kdn_op *op);

typedef struct kdn_token_range {
  uint64_t begin, end;   /* tokens [begin, end) */
} kdn_token_range;

typedef struct kdn_op_result {
  uint32_t struct_size;
  kdn_op_state state;
  kdn_status status;
  uint32_t reserved_;
  uint64_t tokens;       /* load: tokens written; save: leading tokens cached after it */
  uint64_t covered;      /* load: the cached prefix found at the start */
  size_t num_failed;     /* load: ranges of the prefix that could not be read */
} kdn_op_result;
#define KDN_OP_RESULT_INIT { sizeof(kdn_op_result), KDN_OP_PENDING, KDN_OK, 0u, 0u, 0u, 0u }

KDN_API kdn_status kdn_op_result_get(kdn_op *op, kdn_op_result *out);
/* The failed ranges of a load (recompute only those): up to `capacity`
 * into out; *out_count gets how many there are. */
KDN_API kdn_status kdn_op_failed_ranges(kdn_op *op, kdn_token_range *out, size_t capacity, size_t *out_count);
/* Cancels the op if still running, waits for it, and frees it. NULL is fine. */
KDN_API void kdn_op_destroy(kdn_op *op);

/* ---- Knowledge items ------------------------------------------------------ */

/* Named documents whose KV is kept under position-free content keys. */

/* Stores a document (doc_id, version, metadata, tokens and their KV computed
 * from position 0); replaces an older version of the same doc_id. */
KDN_API kdn_status kdn_knowledge_put(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                                     const char *doc_id, size_t doc_id_len, uint64_t version,
                                     const char *metadata, size_t metadata_len, const int32_t *tokens,
                                     size_t num_tokens, const kdn_kv_buffer *kv);

typedef struct kdn_document_info {
  uint32_t struct_size;
  uint32_t doc_id_len;
  char doc_id[256];          /* NUL-terminated; doc ids are at most 255 bytes */
  uint64_t version;
  uint64_t num_tokens;
  uint32_t chunks;
  uint32_t chunks_present;   /* chunks some tier holds now */
  uint32_t pinned;
  uint32_t reserved_;
  int64_t expires_in_ms;     /* -1: never */
} kdn_document_info;
#define KDN_DOCUMENT_INFO_INIT { sizeof(kdn_document_info), 0u, {0}, 0u, 0u, 0u, 0u, 0u, 0u, -1 }

/* Up to `capacity` documents of this model and namespace (out[i].struct_size
 * must be set); *out_count gets how many there are. */
KDN_API kdn_status kdn_knowledge_list(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                                      kdn_document_info *out, size_t capacity, size_t *out_count);
/* pin 1 pins every chunk for ttl_ms (0: until unpinned); pin 0 unpins. */
KDN_API kdn_status kdn_knowledge_pin(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                                     const char *doc_id, size_t doc_id_len, int pin, int64_t ttl_ms);
/* The document is deleted ttl_ms from now (0: now). */
KDN_API kdn_status kdn_knowledge_expire(kdn_runtime *runtime, const kdn_model *model, const char *ns,
                                        size_t ns_len, const char *doc_id, size_t doc_id_len, int64_t ttl_ms);
/* Removes the document's chunks from every tier. */
KDN_API kdn_status kdn_knowledge_delete(kdn_runtime *runtime, const kdn_model *model, const char *ns,
                                        size_t ns_len, const char *doc_id, size_t doc_id_len);
/* The document's KV, at its own positions (token i of kv = its token i), and
 * optionally its tokens (up to tokens_capacity). *out_num_tokens gets its
 * length. kv may be NULL to ask for the length and tokens only. */
KDN_API kdn_status kdn_knowledge_fetch(kdn_runtime *runtime, const kdn_model *model, const char *ns,
                                       size_t ns_len, const char *doc_id, size_t doc_id_len,
                                       const kdn_kv_buffer *kv, int32_t *tokens, size_t tokens_capacity,
                                       uint64_t *out_num_tokens);

/* ---- Blending ------------------------------------------------------------- */

/* Composes a context from pieces whose KV was computed alone (RAG chunks in
 * any order, CacheBlend): cached documents are placed and their keys rotated
 * to their new positions; at the check layers the cached tokens whose keys
 * deviate most from a fresh computation are selected, and only those (and
 * the tokens computed now) are recomputed in the later layers, by the
 * engine, through a callback. */

typedef enum kdn_segment_kind {
  KDN_SEGMENT_DOCUMENT = 0, /* a knowledge item by doc_id (kdn_knowledge_put) */
  KDN_SEGMENT_TOKENS = 1,   /* tokens computed now (the query, anything not cached) */
  KDN_SEGMENT_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_segment_kind;

typedef struct kdn_blend_segment {
  uint32_t struct_size;
  kdn_segment_kind kind;
  const char *doc_id;      /* DOCUMENT */
  size_t doc_id_len;
  const int32_t *tokens;   /* TOKENS */
  size_t num_tokens;
} kdn_blend_segment;
#define KDN_BLEND_SEGMENT_INIT { sizeof(kdn_blend_segment), KDN_SEGMENT_TOKENS, NULL, 0u, NULL, 0u }

/* The engine's recompute of layer `layer` for `count` positions (ascending)
 * of the composed context. hidden holds count rows of hidden_dim floats: the
 * layer's input (at layer 0 unset: the engine embeds tokens[i]) and, on
 * return, the layer's output. k and v hold this layer's float32 KV of all
 * `total` positions ([position][num_kv_heads * head_dim]): the engine writes
 * the positions' K (after RoPE at their positions) and V there, and attends
 * each position causally over positions [0, its own] of k and v.
 * Return KDN_OK, or an error status: kdn_blend then stops and returns it.
 * Called on the thread that called kdn_blend, layer by layer, in order. */
typedef kdn_status (*kdn_blend_layer_fn)(void *user, uint32_t layer, const int32_t *positions,
                                         const int32_t *tokens, size_t count, float *hidden, uint32_t hidden_dim,
                                         float *k, float *v, size_t total);

typedef enum kdn_rope_scaling {
  KDN_ROPE_SCALING_NONE = 0,
  KDN_ROPE_SCALING_LINEAR = 1, /* positions divided by rope_factor */
  KDN_ROPE_SCALING_NTK = 2,    /* theta * rope_factor^(r / (r - 2)) */
  KDN_ROPE_SCALING_FORCE32_ = 0x7FFFFFFF
} kdn_rope_scaling;

typedef struct kdn_blend_options {
  uint32_t struct_size;
  float ratio;                    /* fraction of cached tokens recomputed, in [0, 1]; default 0.15 */
  float threshold;                /* >= 0: select by key deviation >= threshold instead; default -1 */
  const uint32_t *check_layers;   /* ascending; NULL: { 1 } (or { 0 } for a 1-layer model) */
  size_t num_check_layers;
  uint32_t hidden_dim;            /* the engine's hidden width (rows of `hidden`) */
  kdn_rope_scaling rope_scaling;  /* the model spec gives theta, style and rotary_dim */
  float rope_factor;              /* default 1 */
  kdn_blend_layer_fn layer_fn;
  void *user;
} kdn_blend_options;
#define KDN_BLEND_OPTIONS_INIT \
  { sizeof(kdn_blend_options), 0.15f, -1.0f, NULL, 0u, 0u, KDN_ROPE_SCALING_NONE, 1.0f, NULL, NULL }
KDN_API void kdn_blend_options_init(kdn_blend_options *options);

typedef struct kdn_blend_report {
  uint32_t struct_size;
  uint32_t positions;           /* of the composed context */
  uint32_t cached_positions;    /* placed from documents */
  uint32_t fresh_positions;     /* computed now */
  uint32_t selected;            /* cached positions recomputed past the last check layer */
  uint32_t reserved_;
  double recompute_fraction;    /* layer x position work recomputed / a full prefill's */
} kdn_blend_report;
#define KDN_BLEND_REPORT_INIT { sizeof(kdn_blend_report), 0u, 0u, 0u, 0u, 0u, 0.0 }

/* Blends the segments, in order, into `kv` (the whole context: the sum of
 * the segments' tokens, in the model's dtype; canonical or strided). Fills
 * the fields of *report below its struct_size (report may be NULL).
 * KDN_ERR_NOT_FOUND when a document is unknown or a chunk of it is gone
 * from every tier (put it again); the callback's status when it fails. */
KDN_API kdn_status kdn_blend(kdn_runtime *runtime, const kdn_model *model, const char *ns, size_t ns_len,
                             const kdn_blend_segment *segments, size_t num_segments,
                             const kdn_blend_options *options, const kdn_kv_buffer *kv,
                             kdn_blend_report *report);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KDN_KDN_H */
