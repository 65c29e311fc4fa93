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

/* ---- Runtime ------------------------------------------------------------ */

/* A runtime: the store and its tiers. Everything else hangs off it.
 * Thread-safety: all functions taking a kdn_runtime may be called from any
 * number of threads at once, except kdn_runtime_destroy, which must be the
 * last call on it (and on its models). */
typedef struct kdn_runtime kdn_runtime;

typedef struct kdn_runtime_options {
  uint32_t struct_size;
  uint32_t chunk_tokens;        /* tokens per stored chunk; default 256 */
  uint64_t host_capacity_bytes; /* host tier capacity; default 1 GiB */
  uint64_t hash_seed;           /* seed of every key hash; default 0. Runtimes
                                   that share KV must share the seed. */
} kdn_runtime_options;

#define KDN_RUNTIME_OPTIONS_INIT \
  { sizeof(kdn_runtime_options), 256u, 1073741824u, 0u }
KDN_API void kdn_runtime_options_init(kdn_runtime_options *options);

/* Creates a runtime. options may be NULL (defaults). */
KDN_API kdn_status kdn_runtime_create(const kdn_runtime_options *options,
                                      kdn_runtime **out);
KDN_API void kdn_runtime_destroy(kdn_runtime *runtime);

/* ---- Models ------------------------------------------------------------- */

typedef enum kdn_dtype {
  KDN_DTYPE_F32 = 0,
  KDN_DTYPE_F16 = 1,
  KDN_DTYPE_BF16 = 2,
  KDN_DTYPE_FORCE32_ = 0x7FFFFFFF
} kdn_dtype;

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

typedef struct kdn_stats {
  uint32_t struct_size;
  uint32_t reserved_;
  uint64_t lookups;          /* kdn_lookup calls */
  uint64_t retrieves;        /* kdn_retrieve calls */
  uint64_t stores;           /* kdn_store calls */
  uint64_t hits;             /* chunks served by kdn_retrieve */
  uint64_t misses;           /* retrieves that stopped at a missing chunk */
  uint64_t tokens_served;    /* tokens written by kdn_retrieve */
  uint64_t tokens_stored;    /* tokens newly stored by kdn_store */
  uint64_t bytes_served;     /* KV bytes written by kdn_retrieve */
  uint64_t bytes_stored;     /* KV bytes newly stored by kdn_store */
  uint64_t chunks;           /* chunks held now */
  uint64_t used_bytes;       /* bytes held now */
  uint64_t capacity_bytes;   /* capacity */
  uint64_t evictions;        /* chunks evicted to make room */
} kdn_stats;

#define KDN_STATS_INIT { sizeof(kdn_stats), 0u, 0u, 0u, 0u, 0u, 0u,           \
                         0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u }
KDN_API void kdn_stats_init(kdn_stats *stats);

/* Fills the fields of *out below out->struct_size (set it first). */
KDN_API kdn_status kdn_runtime_stats(kdn_runtime *runtime, kdn_stats *out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KDN_KDN_H */
