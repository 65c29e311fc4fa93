/* FROZEN: tests/capi/abi/kdn_v1.h is a copy of the stable part of
 * capi/include/kdn/kdn.h as published in version 1.0 (its experimental
 * section left out). It must NEVER change again: it is what a caller built
 * against 1.0 was compiled with, and compat_v1.c and sizes_v1.c keep every
 * later libkdn.so 1.x working for that caller. To change the ABI, change
 * kdn.h (appending only, as its top says), never this file.
 * ------------------------------------------------------------------------- */
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
#define KDN_VERSION_MINOR 0
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
  KDN_TIER_KIND_FORCE32_ = 0x7FFFFFFF
} kdn_tier_kind;

typedef enum kdn_eviction_policy {
  KDN_EVICT_LRU = 0,
  KDN_EVICT_S3FIFO = 1, /* scan-resistant (S3-FIFO) */
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
  /* How the tier stores chunks: a codec spec ("raw", "fp8", "int8", "kivi2",
   * "cachegen", "kdn", "kdn:hifi", ...). Empty: raw for host and device
   * tiers, kdn's compressing codec for disk tiers. An unknown codec or
   * parameter is KDN_ERR_INVALID_ARGUMENT. */
  const char *codec;
  size_t codec_len;
} kdn_tier_config;
#define KDN_TIER_CONFIG_SIZE_V1 64u
#define KDN_TIER_CONFIG_INIT \
  { sizeof(kdn_tier_config), KDN_TIER_HOST, 1073741824u, NULL, 0u, KDN_EVICT_LRU, 0.0f, 0.0f, 0u, NULL, 0u }
KDN_API kdn_status kdn_tier_config_init(kdn_tier_config *config, size_t struct_size);

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
} kdn_runtime_options;
#define KDN_RUNTIME_OPTIONS_SIZE_V1 48u
#define KDN_RUNTIME_OPTIONS_INIT { sizeof(kdn_runtime_options), 256u, 1073741824u, 0u, NULL, 0u, 0u, 0u }
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
} kdn_model_spec;
#define KDN_MODEL_SPEC_SIZE_V1 48u
#define KDN_MODEL_SPEC_INIT \
  { sizeof(kdn_model_spec), 0u, 0u, 0u, KDN_DTYPE_F32, 10000.0f, KDN_ROPE_INTERLEAVED, 0u, NULL, 0u }
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
/* Bytes of KV per token: layers x 2 x kv_heads x head_dim x dtype size. */
KDN_API kdn_status kdn_model_get_kv_bytes_per_token(const kdn_model *model, uint64_t *out);

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
} kdn_request;
#define KDN_REQUEST_SIZE_V1 48u
#define KDN_REQUEST_INIT { sizeof(kdn_request), 0u, NULL, 0u, NULL, 0u, 0u, 0u }
KDN_API kdn_status kdn_request_init(kdn_request *request, size_t struct_size);

/* ---- KV views ------------------------------------------------------------- */

typedef enum kdn_memory_kind {
  KDN_MEMORY_HOST = 0, /* host memory; the only kind in 1.0 */
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
} kdn_kv_view;
#define KDN_KV_VIEW_SIZE_V1 184u
#define KDN_KV_VIEW_INIT                                                                       \
  { sizeof(kdn_kv_view), KDN_MEMORY_HOST, KDN_DTYPE_F32, KDN_LAYOUT_CONTIGUOUS, NULL, 0u, NULL, \
    NULL, NULL, 0u, 0, 0, 0, 0, 0, 0, 0, 0, 0u, 0u, 0u, 0u, NULL, 0u, 0u, 0 }
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
  uint64_t num_failed;   /* load: ranges of the prefix that could not be read */
  uint32_t flags;        /* KDN_RESULT_* bits */
  uint32_t reserved0;
} kdn_kv_result;
#define KDN_KV_RESULT_SIZE_V1 48u
#define KDN_KV_RESULT_INIT { sizeof(kdn_kv_result), 0u, KDN_OP_PENDING, KDN_OK, 0u, 0u, 0u, 0u, 0u }
KDN_API kdn_status kdn_kv_result_init(kdn_kv_result *result, size_t struct_size);

/* kdn_kv_result.flags: */
/* Some of the KV written was decoded from a lossy codec (a tier whose codec
 * is not "raw"): it is close to, not equal to, the KV stored. */
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
 * runtime's chunk_tokens (a trailing partial chunk too); chunks already
 * cached are skipped. When not all fit, the longest prefix that fits is kept
 * and the call still succeeds. out (optional): tokens = the leading tokens
 * cached after the call. */
KDN_API kdn_status kdn_kv_store(const kdn_model *model, const char *ns, size_t ns_len, const kdn_request *request,
                                const kdn_kv_view *views, size_t num_views, kdn_kv_result *out);

/* Writes the KV of the longest cached prefix of the request into the views.
 * out (required): tokens = its length, 0 on a miss (which is KDN_OK);
 * covered = the cached prefix found (tokens is shorter when a chunk of it
 * could not be read: evicted meanwhile, or corrupt); flags. */
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
 * has ended already. */
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
 * views any more, and frees it. NULL is fine. */
KDN_API void kdn_op_destroy(kdn_op *op);

/* ---- Knowledge items ------------------------------------------------------ */

/* Named documents whose KV is kept under position-free content keys. */

/* Stores a document (doc_id of 1..255 bytes, version, metadata, tokens and
 * their KV computed from position 0); replaces an older version of the same
 * doc_id. */
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
} kdn_document_info;
#define KDN_DOCUMENT_INFO_SIZE_V1 304u
#define KDN_DOCUMENT_INFO_INIT { sizeof(kdn_document_info), 0u, 0u, 0u, {0}, 0u, 0u, 0u, 0u, -1 }
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
} kdn_stats;
#define KDN_STATS_SIZE_V1 160u
#define KDN_STATS_INIT \
  { sizeof(kdn_stats), 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u }
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
} kdn_tier_stats;
#define KDN_TIER_STATS_SIZE_V1 208u
#define KDN_TIER_STATS_INIT                                                                          \
  { sizeof(kdn_tier_stats), 0u, KDN_TIER_HOST, 0u, {0}, {0}, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u, \
    0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u }
KDN_API kdn_status kdn_tier_stats_init(kdn_tier_stats *stats, size_t struct_size);

KDN_API kdn_status kdn_runtime_get_tier_count(kdn_runtime *runtime, uint32_t *out);
/* Tier `index` (0 = highest). */
KDN_API kdn_status kdn_runtime_get_tier_stats(kdn_runtime *runtime, uint32_t index, kdn_tier_stats *out);

/* ---- Experimental ---------------------------------------------------------
 * (kdn.h's KDN_EXPERIMENTAL section is not part of the stable ABI and is
 * left out of this frozen copy.) */


#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KDN_KDN_H */
