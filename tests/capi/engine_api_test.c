/* The engine API of the C ABI (0.2) from a plain C99 program, with the real
 * KV of the reference model (stories260K): tiers (host over disk), batched
 * lookups, asynchronous layer-by-layer saves and loads through vLLM-like
 * paged views and llama.cpp's contiguous layout, KV groups, engine block
 * hashes, the op life cycle, knowledge items, the editor callback, the
 * appended statistics, and every bad argument of the new functions.
 *
 * Prints a line per group of checks and ends with "N passed, M failed".
 * Exit status: 0 all passed, 1 a check failed, 77 the reference model is
 * missing (skipped; a failure instead when KDN_REQUIRE_MODELS=1). */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw, nanosleep, fork */

#include <kdn/kdn.h>

#include <fcntl.h>
#include <ftw.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


#include "check.h"

/* ---- The reference KV ---------------------------------------------------- */

#include "reference.h"

enum {
  CHUNK = 16,         /* 48 tokens = 3 full chunks */
  BLOCK = 8,          /* the engines' block size (tokens) */
  SEQ_BLOCKS = POSITIONS / BLOCK, /* 6 */
  HASH_BYTES = 16,
  MAX_TABLE = 16
};
#define CHUNK_BYTES ((uint64_t)CHUNK * BYTES_PER_TOKEN) /* 20,480: exactly 5 pages */
#define CHUNK_HELD HELD(CHUNK_BYTES) /* 20,480 */
#define HOST_CAPACITY (2 * CHUNK_HELD)
#define DISK_CAPACITY ((uint64_t)64 << 20)

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes);
  if (p == NULL) {
    printf("out of memory\n");
    exit(1);
  }
  return p;
}

static const unsigned char kSentinel = 0xA5; /* every byte of a fresh buffer */

/* ---- Time, temporary directories ----------------------------------------- */

static void sleep_ms(long ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (ms % 1000) * 1000000L;
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Background work (demotions, write-through copies, edits) lands on the
 * store's mover thread: poll for it, a bounded number of times. */
enum { POLL_MS = 2, POLL_LIMIT_MS = 5000 };

static char g_tmpdir[256];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void remove_tree(const char *dir) {
  if (dir[0] != '\0') nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static size_t g_kdn_files;

static int count_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  const size_t n = strlen(path);
  (void)st;
  (void)ftw;
  if (flag == FTW_F && n > 4 && strcmp(path + n - 4, ".kdn") == 0) ++g_kdn_files;
  return 0;
}

/* The object files (*.kdn) under a disk tier's directory. */
static size_t count_kdn_files(const char *dir) {
  g_kdn_files = 0;
  nftw(dir, count_entry, 16, FTW_PHYS);
  return g_kdn_files;
}

static void subdir(char *out, size_t size, const char *name) { snprintf(out, size, "%s/%s", g_tmpdir, name); }

/* ---- Engines' KV layouts ----------------------------------------------------
 * Per layer, separate K and V allocations, as the engines keep them:
 *   NHD    vLLM's [num_blocks][block_size][kv_heads][head_dim], with a block table
 *   HND    [num_blocks][kv_heads][block_size][head_dim], with a block table
 *   LLAMA  llama.cpp's K [n_ctx][kv_heads*head_dim], V transposed [kv_heads*head_dim][n_ctx] */

typedef enum ekv_kind { EKV_NHD, EKV_HND, EKV_LLAMA } ekv_kind;

typedef struct engine_kv {
  ekv_kind kind;
  size_t layer_elems;   /* floats per layer allocation (K and V alike) */
  int n_ctx;            /* LLAMA */
  uint64_t num_blocks;  /* paged */
  int32_t table[MAX_TABLE];
  size_t table_len;
  float *k[LAYERS], *v[LAYERS];
  void *kp[LAYERS], *vp[LAYERS]; /* the same, as a view's arrays */
} engine_kv;

static engine_kv *ekv_alloc(ekv_kind kind, size_t layer_elems) {
  engine_kv *e = xmalloc(sizeof *e);
  int l;
  memset(e, 0, sizeof *e);
  e->kind = kind;
  e->layer_elems = layer_elems;
  for (l = 0; l < LAYERS; ++l) {
    e->k[l] = xmalloc(layer_elems * sizeof(float));
    e->v[l] = xmalloc(layer_elems * sizeof(float));
    memset(e->k[l], kSentinel, layer_elems * sizeof(float));
    memset(e->v[l], kSentinel, layer_elems * sizeof(float));
    e->kp[l] = e->k[l];
    e->vp[l] = e->v[l];
  }
  return e;
}

/* A paged cache of num_blocks blocks per layer; the sequence's logical block
 * i is physical block table[i]. Every byte kSentinel. */
static engine_kv *ekv_paged(ekv_kind kind, uint64_t num_blocks, const int32_t *table, size_t table_len) {
  engine_kv *e = ekv_alloc(kind, (size_t)num_blocks * BLOCK * TOKEN_ELEMS);
  e->num_blocks = num_blocks;
  memcpy(e->table, table, table_len * sizeof *table);
  e->table_len = table_len;
  return e;
}

/* A llama.cpp cache of n_ctx cells. Every byte kSentinel. */
static engine_kv *ekv_llama(int n_ctx) {
  engine_kv *e = ekv_alloc(EKV_LLAMA, (size_t)n_ctx * TOKEN_ELEMS);
  e->n_ctx = n_ctx;
  return e;
}

static void ekv_free(engine_kv *e) {
  int l;
  if (e == NULL) return;
  for (l = 0; l < LAYERS; ++l) {
    free(e->k[l]);
    free(e->v[l]);
  }
  free(e);
}

/* Element offset of (token, head, dim) in a layer's K (kv 0) or V (kv 1). */
static size_t ekv_offset(const engine_kv *e, int kv, int t, int h, int d) {
  const size_t block = e->kind == EKV_LLAMA ? 0 : (size_t)e->table[t / BLOCK];
  const size_t slot = (size_t)(t % BLOCK);
  switch (e->kind) {
    case EKV_NHD:
      return ((block * BLOCK + slot) * HEADS + (size_t)h) * HEAD_DIM + (size_t)d;
    case EKV_HND:
      return ((block * HEADS + (size_t)h) * BLOCK + slot) * HEAD_DIM + (size_t)d;
    case EKV_LLAMA:
    default:
      return kv == 0 ? (size_t)t * TOKEN_ELEMS + (size_t)h * HEAD_DIM + (size_t)d
                     : ((size_t)h * HEAD_DIM + (size_t)d) * (size_t)e->n_ctx + (size_t)t;
  }
}

/* What a layer's K or V allocation holds when tokens [0, count) hold the
 * reference KV plus `add`, and every other byte is kSentinel. */
static void ekv_expected(const engine_kv *e, int layer, int kv, int count, float add, float *out) {
  int t, h, d;
  memset(out, kSentinel, e->layer_elems * sizeof(float));
  for (t = 0; t < count; ++t)
    for (h = 0; h < HEADS; ++h)
      for (d = 0; d < HEAD_DIM; ++d) out[ekv_offset(e, kv, t, h, d)] = ref_at(layer, kv, t, h, d) + add;
}

/* Writes the reference KV of tokens [0, count) into every layer (and
 * kSentinel everywhere else). */
static void ekv_write_ref(engine_kv *e, int count) {
  int l;
  for (l = 0; l < LAYERS; ++l) {
    ekv_expected(e, l, 0, count, 0.0f, e->k[l]);
    ekv_expected(e, l, 1, count, 0.0f, e->v[l]);
  }
}

/* Whether one layer's K or V holds exactly the reference KV (+ add) of its
 * first `count` tokens and kSentinel bytes everywhere else. */
static int ekv_layer_holds(const engine_kv *e, int layer, int kv, int count, float add) {
  float *want = xmalloc(e->layer_elems * sizeof(float));
  int same;
  ekv_expected(e, layer, kv, count, add, want);
  same = memcmp(kv == 0 ? e->k[layer] : e->v[layer], want, e->layer_elems * sizeof(float)) == 0;
  free(want);
  return same;
}

/* Both K and V of a layer hold the reference KV of `count` tokens. */
static int ekv_layer_ref(const engine_kv *e, int layer, int count) {
  return ekv_layer_holds(e, layer, 0, count, 0.0f) && ekv_layer_holds(e, layer, 1, count, 0.0f);
}

static int ekv_holds_ref(const engine_kv *e, int count) {
  int l, ok = 1;
  for (l = 0; l < LAYERS; ++l) ok = ok && ekv_layer_ref(e, l, count);
  return ok;
}

static int ekv_untouched(const engine_kv *e) { return ekv_holds_ref(e, 0); }

/* A view over n of the engine's layers, whose K and V base pointers the
 * caller put in k[] and v[]. */
static kdn_kv_view ekv_view(const engine_kv *e, void **k, void **v, uint32_t n) {
  kdn_kv_view view = KDN_KV_VIEW_INIT;
  view.num_layers = n;
  view.k_layers = k;
  view.v_layers = v;
  if (e->kind == EKV_LLAMA) {
    view.layout = KDN_LAYOUT_CONTIGUOUS;
    view.stride_token = TOKEN_ELEMS;
    view.stride_head = HEAD_DIM;
    view.stride_dim = 1;
    view.v_stride_token = 1;
    view.v_stride_head = (int64_t)HEAD_DIM * e->n_ctx;
    view.v_stride_dim = e->n_ctx;
    view.layer_elements = e->layer_elems;
  } else {
    view.layout = e->kind == EKV_NHD ? KDN_LAYOUT_PAGED_NHD : KDN_LAYOUT_PAGED_HND;
    view.block_size = BLOCK;
    view.block_table = e->table;
    view.block_table_len = e->table_len;
    view.num_blocks = e->num_blocks;
  }
  return view;
}

/* A KV group and the arrays it points to (so: never copy a group_buf). */
typedef struct group_buf {
  uint32_t layers[LAYERS];
  void *k[LAYERS], *v[LAYERS];
  kdn_kv_group g;
} group_buf;

/* The group of the given model layers of an engine (view layer j = model
 * layer layers[j]). */
static const kdn_kv_group *make_group(group_buf *gb, const engine_kv *e, const uint32_t *layers, size_t n) {
  size_t j;
  kdn_kv_group g = KDN_KV_GROUP_INIT;
  for (j = 0; j < n; ++j) {
    const uint32_t l = layers[j] < LAYERS ? layers[j] : 0; /* a layer beyond the model: any memory */
    gb->layers[j] = layers[j];
    gb->k[j] = e->kp[l];
    gb->v[j] = e->vp[l];
  }
  g.layers = gb->layers;
  g.num_layers = n;
  g.view = ekv_view(e, gb->k, gb->v, (uint32_t)n);
  gb->g = g;
  return &gb->g;
}

static const uint32_t kAllLayers[LAYERS] = {0, 1, 2, 3, 4};

static const kdn_kv_group *whole_group(group_buf *gb, const engine_kv *e) {
  return make_group(gb, e, kAllLayers, LAYERS);
}

/* ---- Requests ------------------------------------------------------------ */

static kdn_request token_request(const int32_t *tokens, size_t n) {
  kdn_request r = KDN_REQUEST_INIT;
  r.tokens = tokens;
  r.num_tokens = n;
  return r;
}

static kdn_request hash_request(const uint8_t *hashes, size_t num_blocks) {
  kdn_request r = KDN_REQUEST_INIT;
  r.hash_bytes = HASH_BYTES;
  r.block_hashes = hashes;
  r.num_blocks = num_blocks;
  r.block_tokens = BLOCK;
  return r;
}

/* An engine's chained block hashes (any bytes will do: kdn only chains them). */
static void make_hashes(uint8_t *out, size_t num_blocks, unsigned seed) {
  size_t b, i;
  for (b = 0; b < num_blocks; ++b)
    for (i = 0; i < HASH_BYTES; ++i) out[b * HASH_BYTES + i] = (uint8_t)(seed * 131u + b * 37u + i * 11u + 1u);
}

/* ---- Runtimes ------------------------------------------------------------ */

/* One host tier of 1 GiB (nothing is ever evicted). */
static kdn_runtime *new_big_runtime(uint32_t chunk_tokens) {
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *runtime = NULL;
  options.chunk_tokens = chunk_tokens;
  CHECK_OK(kdn_runtime_create(&options, &runtime));
  return runtime;
}

/* A disk tier storing raw KV: the groups using it compare loaded KV bit for
 * bit (a disk tier's default codec is lossy; group 1 tests the codecs). */
static kdn_tier_config disk_tier(const char *path) {
  kdn_tier_config c = KDN_TIER_CONFIG_INIT;
  c.kind = KDN_TIER_DISK;
  c.capacity_bytes = DISK_CAPACITY;
  c.path = path;
  c.path_len = strlen(path);
  c.codec = "raw";
  c.codec_len = 3;
  return c;
}

static kdn_stats get_stats(kdn_runtime *runtime) {
  kdn_stats stats = KDN_STATS_INIT;
  CHECK_OK(kdn_runtime_stats(runtime, &stats));
  return stats;
}

static kdn_tier_stats tier_stats(kdn_runtime *runtime, uint32_t index) {
  kdn_tier_stats s = KDN_TIER_STATS_INIT;
  CHECK_OK(kdn_runtime_tier_stats(runtime, index, &s));
  return s;
}

/* Polls until tier `index` holds `objects` objects; 1 when it did in time. */
static int wait_tier_objects(kdn_runtime *rt, uint32_t index, uint64_t objects) {
  int waited;
  for (waited = 0; waited <= POLL_LIMIT_MS; waited += POLL_MS) {
    kdn_tier_stats s = KDN_TIER_STATS_INIT;
    if (kdn_runtime_tier_stats(rt, index, &s) == KDN_OK && s.objects == objects) return 1;
    sleep_ms(POLL_MS);
  }
  return 0;
}

/* Polls until no load holds a lease any more; 1 when so in time. */
static int wait_no_leases(kdn_runtime *rt) {
  int waited;
  for (waited = 0; waited <= POLL_LIMIT_MS; waited += POLL_MS) {
    kdn_stats s = KDN_STATS_INIT;
    if (kdn_runtime_stats(rt, &s) == KDN_OK && s.leases_active == 0) return 1;
    sleep_ms(POLL_MS);
  }
  return 0;
}

static uint64_t lookup_one(kdn_runtime *rt, const kdn_model *m, const char *ns, const kdn_request *req) {
  kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
  r.cached_tokens = 12345;
  CHECK_OK(kdn_lookup_batch(rt, m, ns, strlen(ns), req, 1, &r));
  CHECK_EQ(r.status, KDN_OK);
  return r.cached_tokens;
}

/* ---- Synchronous wrappers of the asynchronous ops ------------------------ */

/* Saves with save_begin + save_layer for every layer (in `order`, or 0..4)
 * + wait; returns the op's result (state FAILED if it did not start). */
static kdn_op_result save_at(kdn_runtime *rt, const kdn_model *m, const char *ns, const kdn_request *req,
                             const kdn_kv_group *groups, size_t num_groups, const uint32_t *order, int line) {
  kdn_op_result res = KDN_OP_RESULT_INIT;
  kdn_op *op = NULL;
  int l;
  res.state = KDN_OP_FAILED;
  check_status_at(kdn_save_begin(rt, m, ns, strlen(ns), req, groups, num_groups, &op), KDN_OK, "kdn_save_begin",
                  line);
  if (op == NULL) return res;
  for (l = 0; l < LAYERS; ++l) {
    check_status_at(kdn_save_layer(op, order != NULL ? order[l] : (uint32_t)l), KDN_OK, "kdn_save_layer", line);
  }
  check_status_at(kdn_op_wait(op, -1), KDN_OK, "kdn_op_wait (save)", line);
  check_status_at(kdn_op_result_get(op, &res), KDN_OK, "kdn_op_result_get (save)", line);
  check_eq_at(res.state, KDN_OP_DONE, "save state", line);
  check_eq_at((unsigned long long)res.status, KDN_OK, "save status", line);
  kdn_op_destroy(op);
  return res;
}
#define SAVE(rt, m, ns, req, groups, n) save_at(rt, m, ns, req, groups, n, NULL, __LINE__)

/* Loads with load_begin + wait_layer for every layer in order + wait;
 * returns the op's result and checks kdn_op_failed_ranges agrees. */
static kdn_op_result load_at(kdn_runtime *rt, const kdn_model *m, const char *ns, const kdn_request *req,
                             const kdn_kv_group *groups, size_t num_groups, int line) {
  kdn_op_result res = KDN_OP_RESULT_INIT;
  kdn_op *op = NULL;
  kdn_op_state state = KDN_OP_FAILED;
  size_t failed = 12345;
  uint32_t l;
  res.state = KDN_OP_FAILED;
  check_status_at(kdn_load_begin(rt, m, ns, strlen(ns), req, groups, num_groups, &op), KDN_OK, "kdn_load_begin",
                  line);
  if (op == NULL) return res;
  for (l = 0; l < LAYERS; ++l) check_status_at(kdn_op_wait_layer(op, l, -1), KDN_OK, "kdn_op_wait_layer", line);
  check_status_at(kdn_op_wait(op, -1), KDN_OK, "kdn_op_wait (load)", line);
  check_status_at(kdn_op_poll(op, &state), KDN_OK, "kdn_op_poll (load)", line);
  check_eq_at(state, KDN_OP_DONE, "load state after wait", line);
  check_status_at(kdn_op_result_get(op, &res), KDN_OK, "kdn_op_result_get (load)", line);
  check_status_at(kdn_op_failed_ranges(op, NULL, 0, &failed), KDN_OK, "kdn_op_failed_ranges", line);
  check_eq_at(failed, res.num_failed, "kdn_op_failed_ranges count == num_failed", line);
  kdn_op_destroy(op);
  return res;
}
#define LOAD(rt, m, ns, req, groups, n) load_at(rt, m, ns, req, groups, n, __LINE__)

/* ---- 1. Tiers ------------------------------------------------------------ */

/* The runtime of groups 1, 2 and 8: a host tier with room for two 16-token
 * chunks, evicting exactly at its capacity (watermarks 1.0), over a disk tier. */
static kdn_runtime *g_tiered;
static kdn_model *g_tiered_model;
static char g_tiered_dir[300];

static void test_tiers(void) {
  kdn_tier_config tiers[2];
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_tier_stats host, disk, bad;
  kdn_stats s;
  uint32_t count = 0;

  group_begin("1. tiers: host over disk");
  subdir(g_tiered_dir, sizeof g_tiered_dir, "tiered");
  tiers[0] = (kdn_tier_config)KDN_TIER_CONFIG_INIT;
  tiers[0].kind = KDN_TIER_HOST;
  tiers[0].capacity_bytes = HOST_CAPACITY;
  tiers[0].high_watermark = 1.0f;
  tiers[0].low_watermark = 1.0f;
  tiers[1] = disk_tier(g_tiered_dir);
  options.chunk_tokens = CHUNK;
  options.tiers = tiers;
  options.num_tiers = 2;
  CHECK_OK(kdn_runtime_create(&options, &g_tiered));
  if (g_tiered == NULL) {
    group_end();
    return;
  }
  g_tiered_model = new_model(g_tiered, FINGERPRINT);

  CHECK_OK(kdn_runtime_tier_count(g_tiered, &count));
  CHECK_EQ(count, 2);
  host = tier_stats(g_tiered, 0);
  disk = tier_stats(g_tiered, 1);
  CHECK_EQ(host.struct_size, sizeof(kdn_tier_stats));
  CHECK_EQ(host.kind, KDN_TIER_HOST);
  CHECK(strcmp(host.name, "host") == 0);
  CHECK_EQ(host.capacity_bytes, HOST_CAPACITY);
  CHECK(host.objects == 0 && host.used_bytes == 0 && host.puts == 0 && host.evictions == 0);
  CHECK_EQ(disk.kind, KDN_TIER_DISK);
  CHECK(strcmp(disk.name, "disk") == 0);
  CHECK_EQ(disk.capacity_bytes, DISK_CAPACITY);
  CHECK(disk.objects == 0 && disk.used_bytes == 0 && disk.corrupt_detected == 0);
  s = get_stats(g_tiered);
  CHECK_EQ(s.capacity_bytes, HOST_CAPACITY + DISK_CAPACITY);
  CHECK(s.chunks == 0 && s.used_bytes == 0);

  /* Out of range: the message names the tier count; *out is left alone. */
  memset(&bad, 0xEE, sizeof bad);
  bad.struct_size = sizeof bad;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(g_tiered, 2, &bad));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(g_tiered, 0xFFFFFFFFu, &bad));
  CHECK_EQ(bad.objects, 0xEEEEEEEEEEEEEEEEull);
  {
    /* An older caller's kdn_tier_stats ending after `name`: nothing beyond
     * it is written, and its struct_size is kept. */
    kdn_tier_stats old;
    memset(&old, 0xEE, sizeof old);
    old.struct_size = (uint32_t)offsetof(kdn_tier_stats, hits);
    CHECK_OK(kdn_runtime_tier_stats(g_tiered, 1, &old));
    CHECK_EQ(old.struct_size, offsetof(kdn_tier_stats, hits));
    CHECK(old.kind == KDN_TIER_DISK && strcmp(old.name, "disk") == 0);
    CHECK_EQ(old.hits, 0xEEEEEEEEEEEEEEEEull);
    CHECK_EQ(old.capacity_bytes, 0xEEEEEEEEEEEEEEEEull);
  }
  group_end();

  group_begin("1. tiers: defaults, a device tier, one directory");
  {
    /* Without tiers: one host tier of host_capacity_bytes. */
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    kdn_runtime *rt = NULL;
    o.host_capacity_bytes = (uint64_t)3 << 20;
    CHECK_OK(kdn_runtime_create(&o, &rt));
    CHECK_OK(kdn_runtime_tier_count(rt, &count));
    CHECK_EQ(count, 1);
    host = tier_stats(rt, 0);
    CHECK(host.kind == KDN_TIER_HOST && strcmp(host.name, "host") == 0);
    CHECK_EQ(host.capacity_bytes, (uint64_t)3 << 20);
    kdn_runtime_destroy(rt);
  }
  {
    /* A device tier: GPU memory, or host memory standing in for it. */
    kdn_tier_config t = KDN_TIER_CONFIG_INIT;
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    kdn_runtime *rt = NULL;
    t.kind = KDN_TIER_DEVICE;
    t.capacity_bytes = (uint64_t)1 << 20;
    o.tiers = &t;
    o.num_tiers = 1;
    CHECK_OK(kdn_runtime_create(&o, &rt));
    CHECK_OK(kdn_runtime_tier_count(rt, &count));
    CHECK_EQ(count, 1);
    host = tier_stats(rt, 0);
    CHECK(host.kind == KDN_TIER_DEVICE && strcmp(host.name, "device") == 0);
    kdn_runtime_destroy(rt);
  }
  {
    /* kdn_tier_config_init matches the macro. */
    kdn_tier_config a = KDN_TIER_CONFIG_INIT, b;
    memset(&b, 0x5A, sizeof b);
    kdn_tier_config_init(&b);
    CHECK(a.struct_size == b.struct_size && a.kind == b.kind && a.capacity_bytes == b.capacity_bytes &&
          b.path == NULL && b.path_len == 0 && b.policy == KDN_EVICT_LRU && b.high_watermark == 0.0f &&
          b.low_watermark == 0.0f && b.write_through == 0 && b.codec == NULL && b.codec_len == 0);
    kdn_tier_config_init(NULL);
  }
  {
    /* One process, one runtime per disk directory: a second runtime on the
     * directory the first holds fails (the header names no status). */
    kdn_tier_config t = disk_tier(g_tiered_dir);
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    kdn_runtime *rt = NULL;
    kdn_status st;
    o.tiers = &t;
    o.num_tiers = 1;
    st = kdn_runtime_create(&o, &rt);
    CHECK(st != KDN_OK && rt == NULL);
    CHECK(kdn_last_error_message()[0] != '\0');
    kdn_runtime_destroy(rt);
  }
  group_end();
}

/* ---- 2. Paged views, batched lookups, llama.cpp's layout ----------------- */

/* A load in the tiered runtime, retried while a chunk is between tiers. A
 * load promotes what it reads from disk to the host tier, in the background;
 * that evicts another chunk from the full host tier, and an evicted chunk is
 * in no tier until its demotion to disk lands. A load that plans in that
 * window covers a shorter prefix; one that reads in it reports a failed
 * range ("ranges of the prefix that could not be read"). Known limitation,
 * reported: chunks being demoted are invisible (store/tiered_store.cc,
 * MakeRoom erases before the mover puts the copy below). Returns the first
 * whole load, and prints a note per retry. */
static kdn_op_result load_whole_at(kdn_runtime *rt, const kdn_model *m, const char *ns, const kdn_request *req,
                                   const kdn_kv_group *groups, size_t n, engine_kv *dst, int line) {
  kdn_op_result res = KDN_OP_RESULT_INIT;
  int attempt;
  for (attempt = 0; attempt < 20; ++attempt) {
    int l;
    res = load_at(rt, m, ns, req, groups, n, line);
    if (res.num_failed == 0 && res.covered == POSITIONS) break;
    printf("  note (line %d): load attempt %d covered %llu tokens with %lu failed ranges; retrying\n", line,
           attempt + 1, (unsigned long long)res.covered, (unsigned long)res.num_failed);
    for (l = 0; l < LAYERS; ++l) {
      memset(dst->k[l], kSentinel, dst->layer_elems * sizeof(float));
      memset(dst->v[l], kSentinel, dst->layer_elems * sizeof(float));
    }
    sleep_ms(20);
  }
  return res;
}

/* Whether every layer holds the reference KV of its first `count` tokens
 * within int8's error bound (half a quantization step, absmax / 127 / 2 of
 * the (layer, k|v, token) block, plus float rounding) and no element is
 * off by nothing at all everywhere (it was encoded, not copied). */
static int ekv_near_ref_int8(const engine_kv *e, int count, int *exact_everywhere) {
  int l, kv, t, h, d, ok = 1, exact = 1;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < count; ++t) {
        float absmax = 0.0f;
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float x = ref_at(l, kv, t, h, d);
            absmax = x > absmax ? x : (-x > absmax ? -x : absmax);
          }
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float want = ref_at(l, kv, t, h, d);
            const float got = (kv == 0 ? e->k[l] : e->v[l])[ekv_offset(e, kv, t, h, d)];
            const float err = got > want ? got - want : want - got;
            if (!(err <= absmax / 127.0f / 2.0f + absmax * 1e-6f)) ok = 0;
            if (got != want) exact = 0;
          }
      }
  *exact_everywhere = exact;
  return ok;
}

static void test_tier_codecs(void) {
  static const char ns[] = "codecs";
  static const int32_t table[SEQ_BLOCKS] = {0, 1, 2, 3, 4, 5};
  kdn_tier_config tiers[2];
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  kdn_model *m;
  char dir[300];
  kdn_tier_stats host, disk;

  group_begin("1. tiers: codecs (defaults, an older caller's config)");
  subdir(dir, sizeof dir, "codec-default");
  tiers[0] = (kdn_tier_config)KDN_TIER_CONFIG_INIT;
  tiers[1] = disk_tier(dir);
  tiers[1].codec = NULL; /* the kind's default */
  tiers[1].codec_len = 0;
  options.tiers = tiers;
  options.num_tiers = 2;
  CHECK_OK(kdn_runtime_create(&options, &rt));
  if (rt != NULL) {
    host = tier_stats(rt, 0);
    disk = tier_stats(rt, 1);
    CHECK(strcmp(host.codec, "raw") == 0);
    /* kdn's codec, or int8 standing in for it until that codec is built. */
    CHECK(strncmp(disk.codec, "kdn", 3) == 0 || strcmp(disk.codec, "int8") == 0);
    CHECK(disk.encoded_chunks == 0 && disk.bytes_before_encoding == 0 && disk.decode_failures == 0);
    kdn_runtime_destroy(rt);
    rt = NULL;
  }
  /* A caller built before the codec was appended: its struct ends at
   * write_through, and its disk tier gets the default codec. */
  tiers[1].struct_size = (uint32_t)offsetof(kdn_tier_config, codec);
  tiers[1].codec = "raw"; /* beyond its struct_size: never read */
  tiers[1].codec_len = 3;
  CHECK_OK(kdn_runtime_create(&options, &rt));
  if (rt != NULL) {
    disk = tier_stats(rt, 1);
    CHECK(strcmp(disk.codec, "raw") != 0);
    kdn_runtime_destroy(rt);
    rt = NULL;
  }
  {
    /* An older caller's kdn_tier_stats ending before `codec`: nothing of
     * the appended fields is written. */
    kdn_tier_stats old;
    CHECK_OK(kdn_runtime_create(&options, &rt));
    memset(&old, 0xEE, sizeof old);
    old.struct_size = (uint32_t)offsetof(kdn_tier_stats, codec);
    if (rt != NULL) CHECK_OK(kdn_runtime_tier_stats(rt, 1, &old));
    CHECK_EQ(old.capacity_bytes, DISK_CAPACITY);
    CHECK_EQ((unsigned char)old.codec[0], 0xEE);
    CHECK_EQ(old.encoded_chunks, 0xEEEEEEEEEEEEEEEEull);
    kdn_runtime_destroy(rt);
    rt = NULL;
  }
  group_end();

  group_begin("1. tiers: an int8 disk tier encodes on demotion, decodes on load");
  subdir(dir, sizeof dir, "codec-int8");
  tiers[0] = (kdn_tier_config)KDN_TIER_CONFIG_INIT;
  tiers[0].capacity_bytes = HOST_CAPACITY; /* two chunks */
  tiers[0].high_watermark = 1.0f;
  tiers[0].low_watermark = 1.0f;
  tiers[1] = disk_tier(dir);
  tiers[1].codec = "int8";
  tiers[1].codec_len = 4;
  options.chunk_tokens = CHUNK;
  CHECK_OK(kdn_runtime_create(&options, &rt));
  if (rt == NULL) {
    group_end();
    return;
  }
  m = new_model(rt, FINGERPRINT);
  {
    engine_kv *src = ekv_paged(EKV_NHD, SEQ_BLOCKS, table, SEQ_BLOCKS);
    engine_kv *dst = ekv_paged(EKV_NHD, SEQ_BLOCKS, table, SEQ_BLOCKS);
    group_buf gsrc, gdst;
    kdn_request req = token_request(kTokens, POSITIONS);
    kdn_op_result res;
    int exact = 1;
    ekv_write_ref(src, POSITIONS);
    res = SAVE(rt, m, ns, &req, whole_group(&gsrc, src), 1);
    CHECK_EQ(res.tokens, POSITIONS);
    /* Three chunks, room for two: the first goes down to disk, encoded. */
    CHECK(wait_tier_objects(rt, 1, 1));
    host = tier_stats(rt, 0);
    disk = tier_stats(rt, 1);
    CHECK(strcmp(host.codec, "raw") == 0 && host.encoded_chunks == 0);
    CHECK(strcmp(disk.codec, "int8") == 0);
    CHECK_EQ(disk.encoded_chunks, 1);
    CHECK_EQ(disk.bytes_before_encoding, CHUNK_BYTES);
    /* f32 to int8 codes plus one f32 scale per (layer, k|v, token). */
    CHECK(disk.bytes_after_encoding > CHUNK_BYTES / 4 && disk.bytes_after_encoding < CHUNK_BYTES / 3);
    CHECK(disk.used_bytes < CHUNK_BYTES / 2); /* capacity counts encoded bytes */
    CHECK_EQ(disk.encode_failures, 0);
    res = load_whole_at(rt, m, ns, &req, whole_group(&gdst, dst), 1, dst, __LINE__);
    CHECK_EQ(res.tokens, POSITIONS);
    CHECK(ekv_near_ref_int8(dst, POSITIONS, &exact));
    CHECK(!exact); /* the first chunk came back decoded, not copied */
    disk = tier_stats(rt, 1);
    CHECK_EQ(disk.decode_failures, 0);
    ekv_free(src);
    ekv_free(dst);
  }
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();
}

static void test_paged_and_lookup_batch(void) {
  static const char ns[] = "paged";
  static const int32_t src_table[SEQ_BLOCKS] = {5, 2, 7, 0, 3, 6};
  static const int32_t dst_table[SEQ_BLOCKS] = {1, 6, 4, 0, 7, 2};
  kdn_runtime *rt = g_tiered;
  kdn_model *m = g_tiered_model;
  engine_kv *src;
  group_buf gsrc;
  kdn_request req = token_request(kTokens, POSITIONS);
  kdn_op_result res;
  int32_t other_start[POSITIONS];
  int32_t longer[POSITIONS + 8];

  if (rt == NULL || m == NULL) return;
  memcpy(other_start, kTokens, sizeof kTokens);
  other_start[0] = 2;
  memcpy(longer, kTokens, sizeof kTokens);
  memcpy(longer + POSITIONS, kTokens, 8 * sizeof *longer);

  group_begin("2. save from a vLLM paged view (NHD)");
  src = ekv_paged(EKV_NHD, 8, src_table, SEQ_BLOCKS);
  ekv_write_ref(src, POSITIONS);
  res = SAVE(rt, m, ns, &req, whole_group(&gsrc, src), 1);
  CHECK_EQ(res.tokens, POSITIONS);
  CHECK(ekv_holds_ref(src, POSITIONS)); /* the save only reads */
  /* Three chunks into a host tier with room for two: the least recently
   * used (the first) is demoted to disk, in the background. */
  CHECK(wait_tier_objects(rt, 1, 1));
  {
    const kdn_tier_stats host = tier_stats(rt, 0), disk = tier_stats(rt, 1);
    const kdn_stats s = get_stats(rt);
    CHECK_EQ(host.objects, 2);
    CHECK_EQ(host.used_bytes, 2 * CHUNK_HELD);
    CHECK_EQ(host.puts, 3);
    CHECK_EQ(host.evictions, 1);
    CHECK_EQ(disk.objects, 1);
    CHECK_EQ(disk.demotions_in, 1);
    CHECK(disk.used_bytes >= CHUNK_BYTES); /* the chunk, in its envelope */
    CHECK_EQ(count_kdn_files(g_tiered_dir), 1);
    CHECK_EQ(s.chunks, 3);
    CHECK_EQ(s.evictions, 1);
    CHECK_EQ(s.stores, 1);
    CHECK_EQ(s.tokens_stored, POSITIONS);
    CHECK_EQ(s.bytes_stored, KV_BYTES);
  }
  group_end();

  group_begin("2. kdn_lookup_batch: per request, per tier");
  {
    /* Chunks: c0 [0,16) on disk, c1 [16,32) and c2 [32,48) in the host tier.
     * tier_tokens[i] counts the leading tokens tier i alone holds: the host
     * misses c0, so 0; the disk holds c0 only, so 16. */
    enum { N = 9 };
    kdn_request r[N];
    kdn_lookup_result out[N];
    uint8_t hashes[SEQ_BLOCKS * HASH_BYTES];
    int i;
    make_hashes(hashes, SEQ_BLOCKS, 1);
    r[0] = token_request(kTokens, POSITIONS);    /* the stored one */
    r[1] = token_request(kTokens, 32);           /* a prefix of whole chunks */
    r[2] = token_request(kTokens, 40);           /* ends inside c2: c2 does not count */
    r[3] = token_request(other_start, POSITIONS);/* another first token */
    r[4] = token_request(kTokens, 0);            /* invalid: no tokens */
    r[5] = token_request(longer, POSITIONS + 8); /* 8 more tokens than stored */
    r[6] = hash_request(hashes, SEQ_BLOCKS);     /* invalid here: 16 % 5 != 0 */
    r[6].block_tokens = 5;
    r[7] = token_request(kTokens, POSITIONS);    /* invalid: struct_size too small */
    r[7].struct_size = (uint32_t)offsetof(kdn_request, reserved_);
    r[8] = token_request(kTokens, 16);           /* just c0 */
    for (i = 0; i < N; ++i) {
      out[i] = (kdn_lookup_result)KDN_LOOKUP_RESULT_INIT;
      out[i].cached_tokens = 12345;
    }
    {
      const kdn_stats before = get_stats(rt);
      CHECK_OK(kdn_lookup_batch(rt, m, ns, sizeof ns - 1, r, N, out));
      CHECK(strcmp(kdn_last_error_message(), "") == 0); /* the call succeeded */
      /* Each valid request counts as a lookup. */
      CHECK_EQ(get_stats(rt).lookups - before.lookups, 6);
    }
    CHECK_EQ(out[0].status, KDN_OK);
    CHECK_EQ(out[0].cached_tokens, POSITIONS);
    CHECK_EQ(out[0].num_tiers, 2);
    CHECK_EQ(out[0].tier_tokens[0], 0);
    CHECK_EQ(out[0].tier_tokens[1], CHUNK);
    CHECK(out[0].tier_tokens[0] < out[0].cached_tokens); /* the host overflowed to disk */
    CHECK_EQ(out[1].status, KDN_OK);
    CHECK_EQ(out[1].cached_tokens, 32);
    CHECK(out[1].num_tiers == 2 && out[1].tier_tokens[0] == 0 && out[1].tier_tokens[1] == CHUNK);
    CHECK_EQ(out[2].status, KDN_OK);
    CHECK_EQ(out[2].cached_tokens, 32);
    CHECK_EQ(out[3].status, KDN_OK);
    CHECK_EQ(out[3].cached_tokens, 0);
    CHECK(out[3].num_tiers == 2 && out[3].tier_tokens[0] == 0 && out[3].tier_tokens[1] == 0);
    CHECK_EQ(out[4].status, KDN_ERR_INVALID_ARGUMENT);
    CHECK_EQ(out[4].cached_tokens, 0);
    CHECK_EQ(out[5].status, KDN_OK);
    CHECK_EQ(out[5].cached_tokens, POSITIONS);
    CHECK_EQ(out[6].status, KDN_ERR_INVALID_ARGUMENT);
    CHECK_EQ(out[7].status, KDN_ERR_INVALID_ARGUMENT);
    CHECK_EQ(out[8].status, KDN_OK);
    CHECK_EQ(out[8].cached_tokens, CHUNK);
    CHECK(out[8].tier_tokens[0] == 0 && out[8].tier_tokens[1] == CHUNK);
    for (i = 0; i < N; ++i) CHECK_EQ(out[i].struct_size, sizeof(kdn_lookup_result));
  }
  {
    /* An older caller's result ending before num_tiers: nothing beyond it is
     * written; and a lookup has no side effects on the tiers. */
    kdn_lookup_result old;
    const kdn_tier_stats host = tier_stats(rt, 0), disk = tier_stats(rt, 1);
    memset(&old, 0xEE, sizeof old);
    old.struct_size = (uint32_t)offsetof(kdn_lookup_result, num_tiers);
    CHECK_OK(kdn_lookup_batch(rt, m, ns, sizeof ns - 1, &req, 1, &old));
    CHECK_EQ(old.struct_size, offsetof(kdn_lookup_result, num_tiers));
    CHECK_EQ(old.status, KDN_OK);
    CHECK_EQ(old.cached_tokens, POSITIONS);
    CHECK_EQ(old.num_tiers, 0xEEEEEEEEu);
    CHECK_EQ(old.tier_tokens[0], 0xEEEEEEEEEEEEEEEEull);
    {
      const kdn_tier_stats host2 = tier_stats(rt, 0), disk2 = tier_stats(rt, 1);
      CHECK(host2.hits == host.hits && host2.misses == host.misses && host2.objects == host.objects);
      CHECK(disk2.hits == disk.hits && disk2.misses == disk.misses && disk2.objects == disk.objects);
    }
  }
  {
    /* The batch agrees with kdn_lookup. */
    uint64_t cached = 12345;
    CHECK_OK(kdn_lookup(rt, m, ns, sizeof ns - 1, kTokens, POSITIONS, &cached));
    CHECK_EQ(cached, POSITIONS);
    CHECK_EQ(lookup_one(rt, m, "another-tenant", &req), 0);
  }
  group_end();

  group_begin("2. load into another paged layout (HND)");
  {
    engine_kv *dst = ekv_paged(EKV_HND, 8, dst_table, SEQ_BLOCKS);
    group_buf g;
    const kdn_tier_stats disk = tier_stats(rt, 1);
    res = load_whole_at(rt, m, ns, &req, whole_group(&g, dst), 1, dst, __LINE__);
    CHECK_EQ(res.struct_size, sizeof(kdn_op_result));
    CHECK_EQ(res.state, KDN_OP_DONE);
    CHECK_EQ(res.status, KDN_OK);
    CHECK_EQ(res.tokens, POSITIONS);
    CHECK_EQ(res.covered, POSITIONS);
    CHECK_EQ(res.num_failed, 0);
    /* Every element of the six blocks; blocks 3 and 5 are in no table entry. */
    CHECK(ekv_holds_ref(dst, POSITIONS));
    CHECK(tier_stats(rt, 1).hits > disk.hits); /* c0 was read from disk */
    ekv_free(dst);
  }
  group_end();

  group_begin("2. load into llama.cpp's layout (V transposed)");
  {
    engine_kv *dst = ekv_llama(64);
    group_buf g;
    res = load_whole_at(rt, m, ns, &req, whole_group(&g, dst), 1, dst, __LINE__);
    CHECK(res.state == KDN_OP_DONE && res.status == KDN_OK);
    CHECK_EQ(res.tokens, POSITIONS);
    CHECK_EQ(res.covered, POSITIONS);
    CHECK_EQ(res.num_failed, 0);
    CHECK(ekv_holds_ref(dst, POSITIONS)); /* cells 48..63 untouched */
    ekv_free(dst);
  }
  {
    /* A request 8 tokens longer than what is cached: the cached 48 load, the
     * cells of the 8 others stay untouched. */
    engine_kv *dst = ekv_llama(64);
    group_buf g;
    kdn_request longer_req = token_request(longer, POSITIONS + 8);
    res = load_whole_at(rt, m, ns, &longer_req, whole_group(&g, dst), 1, dst, __LINE__);
    CHECK_EQ(res.state, KDN_OP_DONE);
    CHECK_EQ(res.tokens, POSITIONS);
    CHECK_EQ(res.covered, POSITIONS);
    CHECK(ekv_holds_ref(dst, POSITIONS));
    ekv_free(dst);
  }
  {
    /* Nothing cached: the load ends DONE with nothing written. */
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf g;
    kdn_request miss = token_request(other_start, POSITIONS);
    res = LOAD(rt, m, ns, &miss, whole_group(&g, dst), 1);
    CHECK(res.state == KDN_OP_DONE && res.status == KDN_OK);
    CHECK(res.tokens == 0 && res.covered == 0 && res.num_failed == 0);
    CHECK(ekv_untouched(dst));
    ekv_free(dst);
  }
  group_end();
  ekv_free(src);
}

/* ---- 3. KV groups -------------------------------------------------------- */

static kdn_runtime *g_big;   /* one 1 GiB host tier: nothing is ever evicted */
static kdn_model *g_big_model;

/* Overwrites layer l of an engine with bytes that are not KV. */
static void scramble_layer(engine_kv *e, int l) {
  memset(e->k[l], 0x3C, e->layer_elems * sizeof(float));
  memset(e->v[l], 0x3C, e->layer_elems * sizeof(float));
}

static void test_groups(void) {
  static const char ns[] = "groups";
  static const int32_t table_a[SEQ_BLOCKS] = {3, 0, 5, 1, 4, 2};
  static const int32_t table_b[SEQ_BLOCKS] = {9, 8, 7, 6, 5, 4};
  static const uint32_t even[3] = {0, 2, 4}, odd[2] = {1, 3};
  static const uint32_t save_order[LAYERS] = {4, 3, 2, 1, 0};
  kdn_runtime *rt = g_big;
  kdn_model *m = g_big_model;
  kdn_request req = token_request(kTokens, POSITIONS);
  engine_kv *a = ekv_paged(EKV_NHD, 6, table_a, SEQ_BLOCKS);  /* full attention: layers 0, 2, 4 */
  engine_kv *b = ekv_paged(EKV_HND, 10, table_b, SEQ_BLOCKS); /* sliding window: layers 1, 3 */
  group_buf ga, gb;
  kdn_kv_group two[2];
  kdn_op_result res;
  kdn_op *op = NULL;

  /* Each engine holds the real KV of its group's layers only: the others
   * are garbage, so a group mapped to the wrong layers shows. */
  ekv_write_ref(a, POSITIONS);
  ekv_write_ref(b, POSITIONS);
  scramble_layer(a, 1);
  scramble_layer(a, 3);
  scramble_layer(b, 0);
  scramble_layer(b, 2);
  scramble_layer(b, 4);
  two[0] = *make_group(&ga, a, even, 3);
  two[1] = *make_group(&gb, b, odd, 2);

  group_begin("3. save two groups ({0,2,4} NHD, {1,3} HND)");
  res = save_at(rt, m, ns, &req, two, 2, save_order, __LINE__); /* layers saved last to first */
  CHECK_EQ(res.tokens, POSITIONS);
  CHECK_EQ(lookup_one(rt, m, ns, &req), POSITIONS);
  group_end();

  group_begin("3. load with one group, and with groups out of order");
  {
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf g;
    res = LOAD(rt, m, ns, &req, whole_group(&g, dst), 1);
    CHECK(res.state == KDN_OP_DONE && res.tokens == POSITIONS && res.covered == POSITIONS && res.num_failed == 0);
    CHECK(ekv_holds_ref(dst, POSITIONS));
    ekv_free(dst);
  }
  {
    /* Two groups listing their layers out of order: view layer j is model
     * layer layers[j], whatever the order. */
    static const uint32_t g0[2] = {3, 0}, g1[3] = {4, 1, 2};
    static const int32_t t0[SEQ_BLOCKS] = {0, 1, 2, 3, 4, 5};
    engine_kv *d0 = ekv_paged(EKV_NHD, 6, t0, SEQ_BLOCKS);
    engine_kv *d1 = ekv_llama(POSITIONS);
    group_buf h0, h1;
    kdn_kv_group gs[2];
    int l;
    gs[0] = *make_group(&h0, d0, g0, 2);
    gs[1] = *make_group(&h1, d1, g1, 3);
    res = LOAD(rt, m, ns, &req, gs, 2);
    CHECK(res.state == KDN_OP_DONE && res.tokens == POSITIONS);
    for (l = 0; l < LAYERS; ++l) {
      const int in0 = l == 0 || l == 3;
      CHECK(ekv_layer_ref(d0, l, in0 ? POSITIONS : 0)); /* each layer in its own group's view only */
      CHECK(ekv_layer_ref(d1, l, in0 ? 0 : POSITIONS));
    }
    ekv_free(d0);
    ekv_free(d1);
  }
  group_end();

  group_begin("3. groups that miss or repeat a layer");
  {
    static const uint32_t repeat[2] = {1, 2}, beyond[2] = {1, 5}, twice[3] = {1, 3, 3};
    group_buf x;
    kdn_kv_group bad[2];
    bad[0] = two[0];
    /* Layers 1 and 3 in no group. */
    op = (kdn_op *)&x; /* not NULL: a failure must set it to NULL */
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, ns, sizeof ns - 1, &req, bad, 1, &op));
    CHECK(op == NULL);
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, bad, 1, &op));
    CHECK(op == NULL);
    /* Layer 2 in both groups. */
    bad[1] = *make_group(&x, b, repeat, 2);
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    /* Layer 3 twice in one group (and 0, 2, 4 in the other: all covered). */
    bad[1] = *make_group(&x, b, twice, 3);
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    /* A layer beyond the model's five. */
    bad[1] = *make_group(&x, b, beyond, 2);
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    /* The whole model twice. */
    bad[0] = *whole_group(&x, a);
    bad[1] = bad[0];
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, ns, sizeof ns - 1, &req, bad, 2, &op));
    CHECK(op == NULL);
  }
  group_end();
  ekv_free(a);
  ekv_free(b);
}

/* ---- 4. Engine block hashes ---------------------------------------------- */

static void test_block_hashes(void) {
  static const char ns[] = "hashes";
  static const int32_t table[SEQ_BLOCKS + 1] = {6, 4, 2, 0, 1, 3, 5};
  kdn_runtime *rt = g_big;
  kdn_model *m = g_big_model;
  uint8_t hashes[(SEQ_BLOCKS + 1) * HASH_BYTES];
  uint8_t changed[SEQ_BLOCKS * HASH_BYTES];
  engine_kv *src = ekv_paged(EKV_NHD, 7, table, SEQ_BLOCKS);
  group_buf g;
  kdn_request req;
  kdn_op_result res;

  make_hashes(hashes, SEQ_BLOCKS + 1, 7);
  req = hash_request(hashes, SEQ_BLOCKS); /* 6 blocks of 8 tokens: 48 tokens, 3 chunks of 16 */
  ekv_write_ref(src, POSITIONS);

  group_begin("4. block hashes: save, lookup, load");
  res = SAVE(rt, m, ns, &req, whole_group(&g, src), 1);
  CHECK_EQ(res.tokens, POSITIONS);
  CHECK_EQ(lookup_one(rt, m, ns, &req), POSITIONS);
  {
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf gd;
    res = LOAD(rt, m, ns, &req, whole_group(&gd, dst), 1);
    CHECK(res.state == KDN_OP_DONE && res.tokens == POSITIONS && res.covered == POSITIONS && res.num_failed == 0);
    CHECK(ekv_holds_ref(dst, POSITIONS));
    ekv_free(dst);
  }
  {
    /* One block more than stored (7 blocks = 56 tokens): the 48 load. */
    engine_kv *dst = ekv_paged(EKV_HND, 7, table, SEQ_BLOCKS + 1);
    group_buf gd;
    kdn_request longer = hash_request(hashes, SEQ_BLOCKS + 1);
    const uint64_t misses = get_stats(rt).misses;
    res = LOAD(rt, m, ns, &longer, whole_group(&gd, dst), 1);
    CHECK(res.state == KDN_OP_DONE && res.tokens == POSITIONS && res.covered == POSITIONS);
    CHECK(ekv_holds_ref(dst, POSITIONS));
    /* kdn_stats.misses: "loads that stopped short of the request". This one
     * did (48 of 56 tokens), as a kdn_retrieve of 56 tokens counts. */
    CHECK_EQ(get_stats(rt).misses - misses, 1);
    ekv_free(dst);
  }
  group_end();

  group_begin("4. block hashes: a changed hash cuts the prefix");
  {
    kdn_request r;
    int b;
    /* A chunk is 2 blocks: changing block b cuts the prefix at b's chunk. */
    static const uint64_t want[SEQ_BLOCKS] = {0, 0, 16, 16, 32, 32};
    for (b = 0; b < SEQ_BLOCKS; ++b) {
      memcpy(changed, hashes, sizeof changed);
      changed[b * HASH_BYTES + 5] ^= 0x40;
      r = hash_request(changed, SEQ_BLOCKS);
      check_eq_at(lookup_one(rt, m, ns, &r), want[b], "cached tokens with block b's hash changed", __LINE__);
    }
    /* Fewer blocks: whole chunks only. */
    r = hash_request(hashes, 5);
    CHECK_EQ(lookup_one(rt, m, ns, &r), 32);
    r = hash_request(hashes, 4);
    CHECK_EQ(lookup_one(rt, m, ns, &r), 32);
    r = hash_request(hashes, 1);
    CHECK_EQ(lookup_one(rt, m, ns, &r), 0);
    /* A hash of other bytes per block (hash_bytes 8: the first halves of
     * the same bytes) is another key. */
    r = hash_request(hashes, SEQ_BLOCKS);
    r.hash_bytes = 8;
    r.num_blocks = SEQ_BLOCKS;
    CHECK_EQ(lookup_one(rt, m, ns, &r), 0);
    /* Another namespace. */
    r = hash_request(hashes, SEQ_BLOCKS);
    CHECK_EQ(lookup_one(rt, m, "hashes-other", &r), 0);
  }
  {
    /* A load of a request whose second chunk changed: only the first loads. */
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf gd;
    kdn_request r;
    uint64_t misses;
    memcpy(changed, hashes, sizeof changed);
    changed[2 * HASH_BYTES] ^= 1;
    r = hash_request(changed, SEQ_BLOCKS);
    misses = get_stats(rt).misses;
    res = LOAD(rt, m, ns, &r, whole_group(&gd, dst), 1);
    CHECK(res.state == KDN_OP_DONE && res.tokens == CHUNK && res.covered == CHUNK && res.num_failed == 0);
    CHECK(ekv_holds_ref(dst, CHUNK));
    CHECK_EQ(get_stats(rt).misses - misses, 1); /* stopped short: 16 of 48 */
    ekv_free(dst);
  }
  group_end();

  group_begin("4. block hashes: a trailing partial chunk");
  {
    /* 5 blocks = 40 tokens: chunks [0,16) [16,32) and a partial [32,40). */
    static const char ns2[] = "hashes-partial";
    kdn_request r5 = hash_request(hashes, 5), r6 = hash_request(hashes, SEQ_BLOCKS);
    res = SAVE(rt, m, ns2, &r5, whole_group(&g, src), 1);
    CHECK_EQ(res.tokens, 40);
    CHECK_EQ(lookup_one(rt, m, ns2, &r5), 40);
    CHECK_EQ(lookup_one(rt, m, ns2, &r6), 40); /* a longer request reuses the partial chunk */
    {
      engine_kv *dst = ekv_llama(POSITIONS);
      group_buf gd;
      res = LOAD(rt, m, ns2, &r6, whole_group(&gd, dst), 1);
      CHECK(res.state == KDN_OP_DONE && res.tokens == 40 && res.covered == 40);
      CHECK(ekv_holds_ref(dst, 40));
      ekv_free(dst);
    }
  }
  group_end();
  ekv_free(src);
}

/* ---- 5. Ops -------------------------------------------------------------- */

static void test_ops(void) {
  static const char ns[] = "ops";
  static const int32_t table[SEQ_BLOCKS] = {0, 1, 2, 3, 4, 5};
  kdn_runtime *rt = g_big;
  kdn_model *m = g_big_model;
  kdn_request req = token_request(kTokens, POSITIONS);
  engine_kv *src = ekv_paged(EKV_NHD, 6, table, SEQ_BLOCKS);
  group_buf g;
  kdn_op *op = NULL;
  kdn_op_state state = KDN_OP_FAILED;
  kdn_op_result res;
  uint32_t l;

  ekv_write_ref(src, POSITIONS);
  whole_group(&g, src);

  group_begin("5. a save, step by step");
  kdn_op_destroy(NULL); /* a no-op */
  CHECK_OK(kdn_save_begin(rt, m, ns, sizeof ns - 1, &req, &g.g, 1, &op));
  if (op != NULL) {
    CHECK_OK(kdn_op_poll(op, &state));
    CHECK_EQ(state, KDN_OP_PENDING); /* no layer yet: nothing can run */
    res = (kdn_op_result)KDN_OP_RESULT_INIT;
    CHECK_OK(kdn_op_result_get(op, &res));
    CHECK(res.state == KDN_OP_PENDING && res.tokens == 0);
    CHECK_ERROR(KDN_ERR_RETRY_LATER, kdn_op_wait(op, 20));
    CHECK_ERROR(KDN_ERR_RETRY_LATER, kdn_op_wait(op, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait_layer(op, 0, 0)); /* not a load */
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_layer(op, LAYERS));  /* beyond the model */
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_layer(op, 0xFFFFFFFFu));
    CHECK_OK(kdn_save_layer(op, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_layer(op, 0)); /* twice */
    CHECK_EQ(lookup_one(rt, m, ns, &req), 0);                      /* not committed before the last layer */
    for (l = 1; l < LAYERS; ++l) CHECK_OK(kdn_save_layer(op, l));
    CHECK_OK(kdn_op_wait(op, 10000));
    CHECK_OK(kdn_op_poll(op, &state));
    CHECK_EQ(state, KDN_OP_DONE);
    CHECK_OK(kdn_op_result_get(op, &res));
    CHECK(res.state == KDN_OP_DONE && res.status == KDN_OK && res.tokens == POSITIONS && res.num_failed == 0);
    {
      size_t count = 12345;
      kdn_token_range ranges[2];
      CHECK_OK(kdn_op_failed_ranges(op, ranges, 2, &count));
      CHECK_EQ(count, 0);
    }
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_layer(op, 1)); /* the save is over */
    CHECK_OK(kdn_op_wait(op, 0));                                 /* ended: no waiting, its status */
    CHECK_OK(kdn_op_cancel(op));                                  /* too late: changes nothing */
    CHECK_OK(kdn_op_poll(op, &state));
    CHECK_EQ(state, KDN_OP_DONE);
    kdn_op_destroy(op);
  }
  CHECK_EQ(lookup_one(rt, m, ns, &req), POSITIONS);
  {
    /* Saving it again: every chunk is there, the save still reports them. */
    res = SAVE(rt, m, ns, &req, &g.g, 1);
    CHECK_EQ(res.tokens, POSITIONS);
  }
  group_end();

  group_begin("5. a load, step by step");
  {
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf gd;
    kdn_op_result r2 = KDN_OP_RESULT_INIT;
    op = NULL;
    CHECK_OK(kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, whole_group(&gd, dst), 1, &op));
    if (op != NULL) {
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_layer(op, 0)); /* not a save */
      CHECK_OK(kdn_op_wait_layer(op, 0, 10000));
      CHECK(ekv_layer_ref(dst, 0, POSITIONS));
      CHECK_OK(kdn_op_wait_layer(op, LAYERS - 1, -1));
      CHECK(ekv_holds_ref(dst, POSITIONS)); /* the last layer written: all are */
      CHECK_OK(kdn_op_wait(op, -1));
      CHECK_OK(kdn_op_poll(op, &state));
      CHECK_EQ(state, KDN_OP_DONE);
      CHECK_OK(kdn_op_wait_layer(op, 2, 0)); /* written long ago */
      {
        /* A layer the model does not have. The header does not say which
         * status this is; the library waits for the op to end, then
         * returns KDN_ERR_NOT_FOUND. It must not be KDN_OK. */
        const kdn_status st = kdn_op_wait_layer(op, LAYERS, 1000);
        CHECK(st != KDN_OK && st != KDN_ERR_RETRY_LATER);
        CHECK(kdn_last_error_message()[0] != '\0');
      }
      CHECK_OK(kdn_op_result_get(op, &r2));
      CHECK(r2.state == KDN_OP_DONE && r2.tokens == POSITIONS && r2.covered == POSITIONS);
      CHECK_OK(kdn_op_cancel(op)); /* ended: changes nothing */
      CHECK_OK(kdn_op_poll(op, &state));
      CHECK_EQ(state, KDN_OP_DONE);
      kdn_op_destroy(op);
    }
    ekv_free(dst);
  }
  {
    /* An older caller's kdn_op_result ending before `tokens`. */
    kdn_op_result old;
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf gd;
    op = NULL;
    CHECK_OK(kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, whole_group(&gd, dst), 1, &op));
    CHECK_OK(kdn_op_wait(op, -1));
    memset(&old, 0xEE, sizeof old);
    old.struct_size = (uint32_t)offsetof(kdn_op_result, tokens);
    CHECK_OK(kdn_op_result_get(op, &old));
    CHECK_EQ(old.struct_size, offsetof(kdn_op_result, tokens));
    CHECK(old.state == KDN_OP_DONE && old.status == KDN_OK);
    CHECK_EQ(old.tokens, 0xEEEEEEEEEEEEEEEEull);
    kdn_op_destroy(op);
    ekv_free(dst);
  }
  group_end();

  group_begin("5. cancel and destroy");
  {
    /* A save cancelled before its last layer ends CANCELLED, storing nothing. */
    static const char ns2[] = "ops-cancel";
    op = NULL;
    CHECK_OK(kdn_save_begin(rt, m, ns2, sizeof ns2 - 1, &req, &g.g, 1, &op));
    if (op != NULL) {
      for (l = 0; l + 1 < LAYERS; ++l) CHECK_OK(kdn_save_layer(op, l));
      CHECK_OK(kdn_op_cancel(op));
      CHECK_OK(kdn_op_cancel(op)); /* twice is fine */
      CHECK_OK(kdn_save_layer(op, LAYERS - 1));
      CHECK_ERROR(KDN_ERR_RETRY_LATER, kdn_op_wait(op, 10000)); /* the op's own status: cancelled */
      CHECK_OK(kdn_op_poll(op, &state));
      CHECK_EQ(state, KDN_OP_CANCELLED);
      res = (kdn_op_result)KDN_OP_RESULT_INIT;
      CHECK_OK(kdn_op_result_get(op, &res));
      CHECK_EQ(res.state, KDN_OP_CANCELLED);
      CHECK_EQ(res.status, KDN_ERR_RETRY_LATER);
      CHECK_EQ(res.tokens, 0);
      kdn_op_destroy(op);
    }
    CHECK_EQ(lookup_one(rt, m, ns2, &req), 0);
  }
  {
    /* A save destroyed before any layer (or after some): nothing stored. */
    static const char ns3[] = "ops-destroyed";
    op = NULL;
    CHECK_OK(kdn_save_begin(rt, m, ns3, sizeof ns3 - 1, &req, &g.g, 1, &op));
    kdn_op_destroy(op);
    op = NULL;
    CHECK_OK(kdn_save_begin(rt, m, ns3, sizeof ns3 - 1, &req, &g.g, 1, &op));
    CHECK_OK(kdn_save_layer(op, 0));
    CHECK_OK(kdn_save_layer(op, 3));
    kdn_op_destroy(op);
    CHECK_EQ(lookup_one(rt, m, ns3, &req), 0);
  }
  {
    /* A load cancelled at once ends CANCELLED (or DONE, when it finished
     * first); a cancelled load's wait returns its status, RETRY_LATER. */
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf gd;
    kdn_status wait_status;
    op = NULL;
    CHECK_OK(kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, whole_group(&gd, dst), 1, &op));
    CHECK_OK(kdn_op_cancel(op));
    wait_status = kdn_op_wait(op, -1);
    CHECK_OK(kdn_op_poll(op, &state));
    CHECK(state == KDN_OP_CANCELLED || state == KDN_OP_DONE);
    CHECK(state == KDN_OP_CANCELLED ? wait_status == KDN_ERR_RETRY_LATER : wait_status == KDN_OK);
    if (state == KDN_OP_CANCELLED) {
      CHECK(kdn_op_wait_layer(op, LAYERS - 1, -1) != KDN_OK || ekv_layer_holds(dst, LAYERS - 1, 0, POSITIONS, 0.0f));
    } else {
      CHECK(ekv_holds_ref(dst, POSITIONS));
    }
    kdn_op_destroy(op);
    ekv_free(dst);
  }
  {
    /* destroy "cancels the op if still running, waits for it": a load
     * destroyed at once, its buffers freed right after. */
    int i;
    for (i = 0; i < 8; ++i) {
      engine_kv *dst = ekv_llama(POSITIONS);
      group_buf gd;
      op = NULL;
      CHECK_OK(kdn_load_begin(rt, m, ns, sizeof ns - 1, &req, whole_group(&gd, dst), 1, &op));
      kdn_op_destroy(op);
      ekv_free(dst);
    }
  }
  group_end();
  ekv_free(src);
}

/* kdn_op_destroy "cancels the op if still running, waits for it, and frees
 * it": once it returns, the save no longer reads the caller's KV, which the
 * caller may then unmap. Run in a child process (a late read faults),
 * forked before this process starts any runtime thread; the child's cache
 * is mapped (from /dev/zero) and unmapped, so that any read after
 * kdn_op_destroy returned is a SIGSEGV. */
static void test_destroy_waits_for_save(void) {
  enum { N_CTX = 4096, ROUNDS = 5 };
  pid_t pid;
  int status = 0;
  group_begin("5. kdn_op_destroy waits for a save (forked, first)");
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    const size_t layer_bytes = (size_t)N_CTX * TOKEN_ELEMS * sizeof(float);
    const size_t bytes = 2 * LAYERS * layer_bytes;
    const kdn_model_spec spec = stories260k_spec(FINGERPRINT);
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    kdn_runtime *rt = NULL;
    kdn_model *m = NULL;
    int32_t *tokens = xmalloc(N_CTX * sizeof *tokens);
    const int zero = open("/dev/zero", O_RDWR);
    int i, round, failures = 0;
    for (i = 0; i < N_CTX; ++i) tokens[i] = kTokens[i % POSITIONS] + i / POSITIONS;
    o.chunk_tokens = CHUNK;
    if (zero < 0 || kdn_runtime_create(&o, &rt) != KDN_OK || kdn_model_create(rt, &spec, &m) != KDN_OK) _exit(3);
    for (round = 0; round < ROUNDS; ++round) {
      unsigned char *kv = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, zero, 0);
      engine_kv view; /* llama.cpp's layout over the mapping */
      group_buf g;
      kdn_request req = token_request(tokens, N_CTX);
      kdn_op *op = NULL;
      char ns[32];
      uint32_t l;
      if (kv == MAP_FAILED) _exit(3);
      memset(&view, 0, sizeof view);
      view.kind = EKV_LLAMA;
      view.n_ctx = N_CTX;
      view.layer_elems = (size_t)N_CTX * TOKEN_ELEMS;
      for (l = 0; l < LAYERS; ++l) {
        view.kp[l] = kv + (2 * l) * layer_bytes;
        view.vp[l] = kv + (2 * l + 1) * layer_bytes;
      }
      snprintf(ns, sizeof ns, "destroyed-%d", round);
      if (kdn_save_begin(rt, m, ns, strlen(ns), &req, whole_group(&g, &view), 1, &op) != KDN_OK) _exit(4);
      for (l = 0; l < LAYERS; ++l) failures += kdn_save_layer(op, l) != KDN_OK;
      kdn_op_destroy(op);
      munmap(kv, bytes); /* the op has ended: its KV is the caller's again */
    }
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
    close(zero);
    free(tokens);
    _exit(failures == 0 ? 0 : 4);
  }
  CHECK(pid > 0);
  if (pid > 0) {
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status)) {
      printf("  the child died of signal %d: the save read its KV after kdn_op_destroy returned\n", WTERMSIG(status));
    }
    /* Known bug: kdn_op_destroy does not wait for a save's background
     * gathers (capi/src/kdn.cc, kdn_op_destroy). */
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  group_end();
}

/* ---- 6. Knowledge items -------------------------------------------------- */

/* A canonical KV buffer of `tokens` tokens ([layer][k|v][token][head][dim],
 * all strides 0) holding the reference KV of its first `filled` tokens. */
typedef struct canon_buf {
  float *data;
  size_t elems;
  kdn_kv_buffer kv;
} canon_buf;

static canon_buf canon_new(uint64_t tokens, int filled) {
  canon_buf b;
  kdn_kv_buffer kv = KDN_KV_BUFFER_INIT;
  int l, k, t, h, d;
  b.elems = (size_t)tokens * ELEMS_PER_TOKEN;
  b.data = xmalloc(b.elems * sizeof(float));
  memset(b.data, kSentinel, b.elems * sizeof(float));
  for (l = 0; l < LAYERS; ++l)
    for (k = 0; k < 2; ++k)
      for (t = 0; t < filled; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d)
            b.data[(((size_t)l * 2 + k) * tokens + t) * TOKEN_ELEMS + h * HEAD_DIM + d] = ref_at(l, k, t, h, d);
  kv.data = b.data;
  kv.size_bytes = b.elems * sizeof(float);
  kv.num_tokens = tokens;
  b.kv = kv;
  return b;
}

/* Whether a canonical buffer holds what canon_new(tokens, filled) would. */
static int canon_holds(const canon_buf *b, int filled) {
  canon_buf want = canon_new(b->kv.num_tokens, filled);
  const int same = memcmp(b->data, want.data, b->elems * sizeof(float)) == 0;
  free(want.data);
  return same;
}

static void canon_free(canon_buf *b) {
  free(b->data);
  b->data = NULL;
}

/* The document named `id` in a list, or NULL. */
static const kdn_document_info *find_doc(const kdn_document_info *docs, size_t n, const char *id) {
  size_t i;
  for (i = 0; i < n; ++i) {
    if (docs[i].doc_id_len == strlen(id) && strcmp(docs[i].doc_id, id) == 0) return &docs[i];
  }
  return NULL;
}

static size_t list_docs(kdn_runtime *rt, const kdn_model *m, const char *ns, kdn_document_info *out, size_t cap) {
  size_t i, count = 12345;
  for (i = 0; i < cap; ++i) out[i] = (kdn_document_info)KDN_DOCUMENT_INFO_INIT;
  CHECK_OK(kdn_knowledge_list(rt, m, ns, strlen(ns), out, cap, &count));
  return count;
}

static void test_knowledge(void) {
  static const char ns[] = "knowledge";
  static const char meta_a[] = "{\"title\":\"doc a\"}";
  char dir[300];
  kdn_tier_config tiers[2];
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  kdn_model *m;
  canon_buf kv48 = canon_new(POSITIONS, POSITIONS);
  canon_buf kv24 = canon_new(24, 24);
  canon_buf kv32 = canon_new(32, 32);
  kdn_document_info docs[4];
  const kdn_document_info *d;
  size_t n;

  /* A host tier that copies every new chunk to the disk tier below
   * (write-through): each chunk ends up in both. */
  subdir(dir, sizeof dir, "knowledge");
  tiers[0] = (kdn_tier_config)KDN_TIER_CONFIG_INIT;
  tiers[0].capacity_bytes = (uint64_t)1 << 20;
  tiers[0].write_through = 1;
  tiers[1] = disk_tier(dir);
  options.chunk_tokens = CHUNK;
  options.tiers = tiers;
  options.num_tiers = 2;

  group_begin("6. knowledge: put, list, fetch");
  CHECK_OK(kdn_runtime_create(&options, &rt));
  if (rt == NULL) {
    group_end();
    canon_free(&kv48);
    canon_free(&kv24);
    canon_free(&kv32);
    return;
  }
  m = new_model(rt, FINGERPRINT);
  /* doc-a: the 48 tokens (chunks a0 a1 a2); doc-b: the first 24 (a0, shared
   * by content, and a partial chunk b1 of 8 tokens). */
  CHECK_OK(kdn_knowledge_put(rt, m, ns, sizeof ns - 1, "doc-a", 5, 1, meta_a, sizeof meta_a - 1, kTokens, POSITIONS,
                             &kv48.kv));
  CHECK_OK(kdn_knowledge_put(rt, m, ns, sizeof ns - 1, "doc-b", 5, 7, NULL, 0, kTokens, 24, &kv24.kv));
  CHECK(canon_holds(&kv48, POSITIONS) && canon_holds(&kv24, 24)); /* inputs untouched */
  n = list_docs(rt, m, ns, docs, 4);
  CHECK_EQ(n, 2);
  d = find_doc(docs, n < 4 ? n : 4, "doc-a");
  CHECK(d != NULL);
  if (d != NULL) {
    CHECK_EQ(d->struct_size, sizeof(kdn_document_info));
    CHECK_EQ(d->version, 1);
    CHECK_EQ(d->num_tokens, POSITIONS);
    CHECK_EQ(d->chunks, 3);
    CHECK_EQ(d->chunks_present, 3);
    CHECK_EQ(d->pinned, 0);
    CHECK_EQ((unsigned long long)d->expires_in_ms, (unsigned long long)-1);
  }
  d = find_doc(docs, n < 4 ? n : 4, "doc-b");
  CHECK(d != NULL);
  if (d != NULL) {
    CHECK_EQ(d->version, 7);
    CHECK_EQ(d->num_tokens, 24);
    CHECK_EQ(d->chunks, 2);
    CHECK_EQ(d->chunks_present, 2);
  }
  {
    /* Capacity 1: one document written, the count of all. */
    size_t count = 0;
    kdn_document_info one[2];
    one[0] = (kdn_document_info)KDN_DOCUMENT_INFO_INIT;
    memset(&one[1], 0xEE, sizeof one[1]);
    CHECK_OK(kdn_knowledge_list(rt, m, ns, sizeof ns - 1, one, 1, &count));
    CHECK_EQ(count, 2);
    CHECK(one[0].doc_id_len == 5 && strlen(one[0].doc_id) == 5);
    CHECK_EQ(one[1].version, 0xEEEEEEEEEEEEEEEEull);
    /* Capacity 0, out NULL: just the count. */
    count = 0;
    CHECK_OK(kdn_knowledge_list(rt, m, ns, sizeof ns - 1, NULL, 0, &count));
    CHECK_EQ(count, 2);
  }
  /* Four distinct chunks (a0 is shared), all in the host tier (1 MiB, 69,632
   * bytes used); write-through copies them to disk. Known bug: the host
   * tier's pool gives its first size class (20,480-byte blocks) a slab of
   * the whole pool, so b1 (8 tokens: a 12,288-byte block) is refused and
   * lands on disk only (store/host_pool.cc, HostPool::Allocate). */
  CHECK_EQ(tier_stats(rt, 0).objects, 4);
  CHECK(wait_tier_objects(rt, 1, 4));
  CHECK_EQ(count_kdn_files(dir), 4);
  {
    canon_buf out = canon_new(POSITIONS, 0);
    int32_t tokens[POSITIONS + 4];
    uint64_t num = 0;
    memset(tokens, 0x7F, sizeof tokens);
    CHECK_OK(kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-a", 5, &out.kv, tokens, POSITIONS + 4, &num));
    CHECK_EQ(num, POSITIONS);
    CHECK(memcmp(tokens, kTokens, sizeof kTokens) == 0);
    CHECK_EQ(tokens[POSITIONS], 0x7F7F7F7F); /* beyond the document: untouched */
    CHECK(canon_holds(&out, POSITIONS));
    canon_free(&out);
  }
  {
    /* doc-b into a 32-token buffer: its 24 tokens, the rest untouched. */
    canon_buf out = canon_new(32, 0);
    uint64_t num = 0;
    CHECK_OK(kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-b", 5, &out.kv, NULL, 0, &num));
    CHECK_EQ(num, 24);
    CHECK(canon_holds(&out, 24));
    canon_free(&out);
  }
  {
    /* kv NULL: the length, and as many tokens as there is room for. */
    int32_t tokens[10];
    uint64_t num = 0;
    CHECK_OK(kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-a", 5, NULL, tokens, 10, &num));
    CHECK_EQ(num, POSITIONS);
    CHECK(memcmp(tokens, kTokens, sizeof tokens) == 0);
    CHECK_OK(kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-a", 5, NULL, NULL, 0, &num));
    CHECK_EQ(num, POSITIONS);
  }
  {
    /* A buffer too small for the document. */
    canon_buf small = canon_new(24, 0);
    uint64_t num = 12345;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT,
                kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-a", 5, &small.kv, NULL, 0, &num));
    CHECK(canon_holds(&small, 0));
    canon_free(&small);
  }
  group_end();

  group_begin("6. knowledge: versions, pins, expiry");
  /* doc-b version 8: the first 32 tokens (a0 a1, both shared with doc-a).
   * The old version's own chunk b1 goes, from both tiers. */
  CHECK_OK(kdn_knowledge_put(rt, m, ns, sizeof ns - 1, "doc-b", 5, 8, "v8", 2, kTokens, 32, &kv32.kv));
  n = list_docs(rt, m, ns, docs, 4);
  CHECK_EQ(n, 2);
  d = find_doc(docs, n < 4 ? n : 4, "doc-b");
  CHECK(d != NULL && d->version == 8 && d->num_tokens == 32 && d->chunks == 2 && d->chunks_present == 2);
  CHECK_EQ(tier_stats(rt, 0).objects, 3);
  CHECK_EQ(tier_stats(rt, 1).objects, 3);
  CHECK_EQ(count_kdn_files(dir), 3);
  {
    canon_buf out = canon_new(32, 0);
    uint64_t num = 0;
    CHECK_OK(kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-b", 5, &out.kv, NULL, 0, &num));
    CHECK_EQ(num, 32);
    CHECK(canon_holds(&out, 32));
    canon_free(&out);
  }
  /* Pins: every chunk of doc-a, until unpinned. */
  CHECK_OK(kdn_knowledge_pin(rt, m, ns, sizeof ns - 1, "doc-a", 5, 1, 0));
  n = list_docs(rt, m, ns, docs, 4);
  d = find_doc(docs, n < 4 ? n : 4, "doc-a");
  CHECK(d != NULL && d->pinned == 1);
  CHECK_EQ(get_stats(rt).pins_active, 3);
  CHECK_OK(kdn_knowledge_pin(rt, m, ns, sizeof ns - 1, "doc-a", 5, 0, 0));
  n = list_docs(rt, m, ns, docs, 4);
  d = find_doc(docs, n < 4 ? n : 4, "doc-a");
  CHECK(d != NULL && d->pinned == 0);
  CHECK_EQ(get_stats(rt).pins_active, 0);
  CHECK_OK(kdn_knowledge_pin(rt, m, ns, sizeof ns - 1, "doc-a", 5, 1, 60000)); /* for a minute */
  CHECK_EQ(get_stats(rt).pins_active, 3);
  CHECK_OK(kdn_knowledge_pin(rt, m, ns, sizeof ns - 1, "doc-a", 5, 0, 0));
  CHECK_EQ(get_stats(rt).pins_active, 0);
  CHECK_EQ(get_stats(rt).pins_forced_unpin, 0);
  /* Expiry: in a minute (listed with its time left), then now (deleted). */
  CHECK_OK(kdn_knowledge_expire(rt, m, ns, sizeof ns - 1, "doc-b", 5, 60000));
  n = list_docs(rt, m, ns, docs, 4);
  d = find_doc(docs, n < 4 ? n : 4, "doc-b");
  CHECK(d != NULL && d->expires_in_ms > 50000 && d->expires_in_ms <= 60000);
  CHECK_OK(kdn_knowledge_expire(rt, m, ns, sizeof ns - 1, "doc-b", 5, 0));
  n = list_docs(rt, m, ns, docs, 4);
  CHECK_EQ(n, 1);
  CHECK(find_doc(docs, 1, "doc-a") != NULL && find_doc(docs, 1, "doc-b") == NULL);
  {
    uint64_t num = 12345;
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-b", 5, NULL, NULL, 0, &num));
    CHECK_EQ(num, 0);
  }
  /* doc-b's chunks were doc-a's too: they stay. */
  CHECK_EQ(tier_stats(rt, 0).objects, 3);
  group_end();

  group_begin("6. knowledge: tenants, delete from every tier");
  {
    uint64_t num = 12345;
    kdn_model *other = new_model(rt, "another model");
    CHECK_EQ(list_docs(rt, m, "another-tenant", docs, 4), 0);
    CHECK_EQ(list_docs(rt, other, ns, docs, 4), 0);
    CHECK_ERROR(KDN_ERR_NOT_FOUND,
                kdn_knowledge_fetch(rt, m, "another-tenant", 14, "doc-a", 5, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_fetch(rt, other, ns, sizeof ns - 1, "doc-a", 5, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_delete(rt, m, "another-tenant", 14, "doc-a", 5));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_pin(rt, m, "another-tenant", 14, "doc-a", 5, 1, 0));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_expire(rt, m, "another-tenant", 14, "doc-a", 5, 0));
    CHECK_EQ(list_docs(rt, m, ns, docs, 4), 1); /* none of that touched doc-a */
    kdn_model_destroy(other);
  }
  {
    const size_t files_before = count_kdn_files(dir);
    const kdn_tier_stats host = tier_stats(rt, 0), disk = tier_stats(rt, 1);
    uint64_t num = 12345;
    CHECK_EQ(files_before, 3);
    CHECK_EQ(host.objects, 3);
    CHECK_EQ(disk.objects, 3);
    CHECK_OK(kdn_knowledge_delete(rt, m, ns, sizeof ns - 1, "doc-a", 5));
    CHECK_EQ(tier_stats(rt, 0).objects, 0);
    CHECK_EQ(tier_stats(rt, 0).used_bytes, 0);
    CHECK_EQ(tier_stats(rt, 1).objects, 0);
    CHECK_EQ(count_kdn_files(dir), 0);
    CHECK_EQ(list_docs(rt, m, ns, docs, 4), 0);
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, "doc-a", 5, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_delete(rt, m, ns, sizeof ns - 1, "doc-a", 5)); /* gone already */
  }
  group_end();

  group_begin("6. knowledge: doc ids");
  {
    char id[257];
    uint64_t num = 0;
    memset(id, 'd', sizeof id);
    /* 255 bytes is the longest id; (pointer, length): no NUL needed. */
    CHECK_OK(kdn_knowledge_put(rt, m, ns, sizeof ns - 1, id, 255, 1, NULL, 0, kTokens, CHUNK, &kv48.kv));
    n = list_docs(rt, m, ns, docs, 4);
    CHECK_EQ(n, 1);
    CHECK_EQ(docs[0].doc_id_len, 255);
    CHECK(strlen(docs[0].doc_id) == 255 && memcmp(docs[0].doc_id, id, 255) == 0);
    CHECK_OK(kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, id, 255, NULL, NULL, 0, &num));
    CHECK_EQ(num, CHUNK);
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT,
                kdn_knowledge_put(rt, m, ns, sizeof ns - 1, id, 256, 1, NULL, 0, kTokens, CHUNK, &kv48.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT,
                kdn_knowledge_put(rt, m, ns, sizeof ns - 1, id, 0, 1, NULL, 0, kTokens, CHUNK, &kv48.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT,
                kdn_knowledge_put(rt, m, ns, sizeof ns - 1, NULL, 5, 1, NULL, 0, kTokens, CHUNK, &kv48.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, id, 256, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, m, ns, sizeof ns - 1, id, 0, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(rt, m, ns, sizeof ns - 1, id, 256, 1, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(rt, m, ns, sizeof ns - 1, "", 0, 1, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(rt, m, ns, sizeof ns - 1, id, 256, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(rt, m, ns, sizeof ns - 1, NULL, 0, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(rt, m, ns, sizeof ns - 1, id, 256));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(rt, m, ns, sizeof ns - 1, id, 0));
    CHECK_EQ(list_docs(rt, m, ns, docs, 4), 1);
    CHECK_OK(kdn_knowledge_delete(rt, m, ns, sizeof ns - 1, id, 255));
    CHECK_EQ(list_docs(rt, m, ns, docs, 4), 0);
  }
  group_end();

  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  canon_free(&kv48);
  canon_free(&kv24);
  canon_free(&kv32);
}

/* ---- 7. The editor callback ---------------------------------------------- */

typedef enum edit_mode { EDIT_ADD_ONE, EDIT_FAIL, EDIT_UNCHANGED } edit_mode;

/* What an editor saw. Written on the runtime's background thread: `calls`
 * is published with a release store after the rest. */
typedef struct edit_state {
  edit_mode mode;
  int calls;
  kdn_chunk_info info;
  size_t kv_bytes;
} edit_state;

static int load_acquire(const int *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

/* Adds 1.0f to every element of V in layer 0 (EDIT_ADD_ONE); scribbles on
 * the KV and fails (EDIT_FAIL); scribbles and says it changed nothing
 * (EDIT_UNCHANGED). */
static kdn_status test_editor(void *user, const kdn_chunk_info *info, void *kv, size_t kv_bytes, int *out_changed) {
  edit_state *st = user;
  float *f = kv;
  const size_t row = (size_t)info->num_kv_heads * info->head_dim;
  const size_t v0 = (size_t)info->num_tokens * row; /* canonical: layer 0 K, then layer 0 V */
  size_t i;
  st->info = *info;
  st->kv_bytes = kv_bytes;
  switch (st->mode) {
    case EDIT_ADD_ONE:
      for (i = 0; i < (size_t)info->num_tokens * row; ++i) f[v0 + i] += 1.0f;
      *out_changed = 1;
      __atomic_add_fetch(&st->calls, 1, __ATOMIC_RELEASE);
      return KDN_OK;
    case EDIT_FAIL:
      memset(kv, 0, kv_bytes);
      *out_changed = 1;
      __atomic_add_fetch(&st->calls, 1, __ATOMIC_RELEASE);
      return KDN_ERR_INTERNAL;
    case EDIT_UNCHANGED:
    default:
      memset(kv, 0, kv_bytes);
      *out_changed = 0;
      __atomic_add_fetch(&st->calls, 1, __ATOMIC_RELEASE);
      return KDN_OK;
  }
}

/* A runtime whose chunks are 48 tokens, with the editor in `mode`. */
static kdn_runtime *editor_runtime(edit_state *st, edit_mode mode) {
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  memset(st, 0, sizeof *st);
  st->mode = mode;
  o.chunk_tokens = POSITIONS; /* one chunk: one edit */
  o.editor = test_editor;
  o.editor_user = st;
  CHECK_OK(kdn_runtime_create(&o, &rt));
  return rt;
}

static int wait_calls(const edit_state *st, int calls) {
  int waited;
  for (waited = 0; waited <= POLL_LIMIT_MS; waited += POLL_MS) {
    if (load_acquire(&st->calls) >= calls) return 1;
    sleep_ms(POLL_MS);
  }
  return 0;
}

/* Whether a canonical 48-token buffer holds the reference KV, with V of
 * layer 0 plus `v0_add`. */
static int canon_holds_edited(const canon_buf *b, float v0_add) {
  canon_buf want = canon_new(POSITIONS, POSITIONS);
  size_t i;
  int same;
  for (i = 0; i < (size_t)POSITIONS * TOKEN_ELEMS; ++i) want.data[(size_t)POSITIONS * TOKEN_ELEMS + i] += v0_add;
  same = memcmp(b->data, want.data, b->elems * sizeof(float)) == 0;
  free(want.data);
  return same;
}

static void test_editor_callback(void) {
  static const char ns[] = "edited";
  canon_buf in = canon_new(POSITIONS, POSITIONS);
  edit_state st;
  kdn_runtime *rt;
  kdn_model *m;

  group_begin("7. editor: V of layer 0 plus one");
  rt = editor_runtime(&st, EDIT_ADD_ONE);
  m = rt != NULL ? new_model(rt, FINGERPRINT) : NULL;
  if (m != NULL) {
    uint64_t stored = 0, filled = 0;
    uint8_t fp[32];
    int waited;
    kdn_stats s;
    CHECK_OK(kdn_store(rt, m, ns, sizeof ns - 1, kTokens, POSITIONS, &in.kv, NULL, &stored));
    CHECK_EQ(stored, POSITIONS);
    for (waited = 0; waited <= POLL_LIMIT_MS && get_stats(rt).edits < 1; waited += POLL_MS) sleep_ms(POLL_MS);
    s = get_stats(rt);
    CHECK_EQ(s.edits, 1);
    CHECK(wait_calls(&st, 1));
    CHECK_EQ(load_acquire(&st.calls), 1);
    CHECK_EQ(st.info.struct_size, sizeof(kdn_chunk_info));
    CHECK(st.info.num_layers == LAYERS && st.info.num_kv_heads == HEADS && st.info.head_dim == HEAD_DIM);
    CHECK_EQ(st.info.num_tokens, POSITIONS);
    CHECK_EQ(st.info.dtype, KDN_DTYPE_F32);
    CHECK_EQ(st.info.first_position, 0);
    CHECK_EQ(st.kv_bytes, KV_BYTES);
    CHECK_OK(kdn_model_fingerprint(m, fp));
    CHECK(memcmp(st.info.model_fingerprint, fp, 32) == 0);
    CHECK(canon_holds(&in, POSITIONS)); /* the caller's buffer is not edited */
    {
      /* kdn_stats.edits counts the edit as soon as the callback returned;
       * the edited chunk replaces the stored one a moment later, on the same
       * background thread. Retrieve until it has (an unedited chunk served
       * does not count in edited_served). */
      canon_buf out = canon_new(POSITIONS, 0);
      int attempt;
      for (attempt = 1; attempt <= 100; ++attempt) {
        CHECK_OK(kdn_retrieve(rt, m, ns, sizeof ns - 1, kTokens, POSITIONS, &out.kv, &filled));
        if (canon_holds_edited(&out, 1.0f)) break;
        sleep_ms(10);
      }
      if (attempt > 1) printf("  note: the edited chunk was served from retrieve %d on\n", attempt);
      CHECK_EQ(filled, POSITIONS);
      CHECK(canon_holds_edited(&out, 1.0f));
      canon_free(&out);
    }
    CHECK_EQ(get_stats(rt).edited_served, 1);
    {
      /* An asynchronous load serves the edited chunk too. */
      engine_kv *dst = ekv_llama(POSITIONS);
      group_buf g;
      kdn_request req = token_request(kTokens, POSITIONS);
      const kdn_op_result res = LOAD(rt, m, ns, &req, whole_group(&g, dst), 1);
      int l;
      CHECK(res.state == KDN_OP_DONE && res.tokens == POSITIONS);
      CHECK(ekv_layer_holds(dst, 0, 0, POSITIONS, 0.0f) && ekv_layer_holds(dst, 0, 1, POSITIONS, 1.0f));
      for (l = 1; l < LAYERS; ++l) CHECK(ekv_layer_ref(dst, l, POSITIONS));
      ekv_free(dst);
    }
    s = get_stats(rt);
    CHECK_EQ(s.edited_served, 2);
    CHECK_EQ(s.edits, 1); /* served twice, edited once */
    CHECK_EQ(load_acquire(&st.calls), 1);
  }
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();

  group_begin("7. editor: a failure, or no change, keeps the KV");
  {
    static const edit_mode modes[2] = {EDIT_FAIL, EDIT_UNCHANGED};
    int i;
    for (i = 0; i < 2; ++i) {
      rt = editor_runtime(&st, modes[i]);
      m = rt != NULL ? new_model(rt, FINGERPRINT) : NULL;
      if (m != NULL) {
        uint64_t stored = 0, filled = 0;
        canon_buf out = canon_new(POSITIONS, 0);
        kdn_stats s;
        CHECK_OK(kdn_store(rt, m, ns, sizeof ns - 1, kTokens, POSITIONS, &in.kv, NULL, &stored));
        CHECK_EQ(stored, POSITIONS);
        CHECK(wait_calls(&st, 1));
        sleep_ms(20);
        CHECK_OK(kdn_retrieve(rt, m, ns, sizeof ns - 1, kTokens, POSITIONS, &out.kv, &filled));
        CHECK_EQ(filled, POSITIONS);
        CHECK(canon_holds(&out, POSITIONS));
        s = get_stats(rt);
        CHECK_EQ(s.edits, 0);
        CHECK_EQ(s.edited_served, 0);
        CHECK_EQ(load_acquire(&st.calls), 1);
        canon_free(&out);
      }
      kdn_model_destroy(m);
      kdn_runtime_destroy(rt);
    }
  }
  group_end();
  canon_free(&in);
}

/* ---- 8. Statistics ------------------------------------------------------- */

static int latency_sane(const kdn_latency *l) {
  return l->count > 0 && l->mean_us > 0.0 && l->p50_us <= l->p90_us && l->p90_us <= l->p99_us &&
         l->p99_us <= l->max_us && l->mean_us <= l->max_us;
}

static void test_statistics(void) {
  group_begin("8. statistics: latencies, leases, older callers");
  {
    kdn_runtime *rts[2];
    int i;
    rts[0] = g_tiered;
    rts[1] = g_big;
    for (i = 0; i < 2; ++i) {
      kdn_stats s;
      if (rts[i] == NULL) continue;
      /* "chunks held by loads in progress": none once every load ended. */
      CHECK(wait_no_leases(rts[i]));
      s = get_stats(rts[i]);
      CHECK_EQ(s.leases_active, 0);
      CHECK_EQ(s.pins_active, 0);
      CHECK_EQ(s.pins_forced_unpin, 0);
      CHECK_EQ(s.corrupt_detected, 0);
      CHECK_EQ(s.edits, 0);
      CHECK_EQ(s.edited_served, 0);
      CHECK(latency_sane(&s.lookup));
      CHECK(latency_sane(&s.load));
      CHECK(latency_sane(&s.store));
      /* One sample per lookup (each request of a batch), per load and per
       * save or store. */
      CHECK_EQ(s.lookup.count, s.lookups);
      CHECK_EQ(s.load.count, s.retrieves);
      CHECK_EQ(s.store.count, s.stores);
      CHECK(s.retrieves > 0 && s.stores > 0 && s.lookups > 0);
      CHECK(s.hits > 0 && s.tokens_served > 0 && s.bytes_served == s.tokens_served * BYTES_PER_TOKEN);
    }
  }
  if (g_big != NULL) {
    /* Leases end with their loads: right after kdn_op_wait returned, the
     * load is over and holds no chunk ("chunks held by loads in progress").
     * Known bug: the load's leases are released after it reports DONE
     * (store/engine_ops.cc, LoadOp::Run: Finish() before the Fetch goes). */
    enum { LOADS = 1000 };
    engine_kv *dst = ekv_llama(POSITIONS);
    group_buf g;
    kdn_request req = token_request(kTokens, POSITIONS);
    int i, held = 0, done = 0;
    whole_group(&g, dst);
    for (i = 0; i < LOADS; ++i) {
      kdn_op *op = NULL;
      kdn_stats s = KDN_STATS_INIT;
      if (kdn_load_begin(g_big, g_big_model, "ops", 3, &req, &g.g, 1, &op) != KDN_OK) break;
      done += kdn_op_wait(op, -1) == KDN_OK;
      if (kdn_runtime_stats(g_big, &s) == KDN_OK && s.leases_active != 0) ++held;
      kdn_op_destroy(op);
    }
    CHECK_EQ(done, LOADS);
    check_eq_at((unsigned long long)held, 0, "loads still holding leases right after kdn_op_wait", __LINE__);
    CHECK(ekv_holds_ref(dst, POSITIONS));
    ekv_free(dst);
  }
  {
    /* A 0.1 caller's kdn_stats (ends at evictions): nothing appended is
     * written. */
    kdn_stats old;
    memset(&old, 0xEE, sizeof old);
    old.struct_size = (uint32_t)offsetof(kdn_stats, edited_served);
    CHECK_OK(kdn_runtime_stats(g_big, &old));
    CHECK_EQ(old.struct_size, offsetof(kdn_stats, edited_served));
    CHECK(old.lookups > 0 && old.lookups != 0xEEEEEEEEEEEEEEEEull);
    CHECK_EQ(old.edited_served, 0xEEEEEEEEEEEEEEEEull);
    CHECK_EQ(old.store.count, 0xEEEEEEEEEEEEEEEEull);
  }
  {
    /* A fresh runtime: every latency is empty. */
    kdn_runtime *rt = new_big_runtime(CHUNK);
    const kdn_stats s = get_stats(rt);
    CHECK(s.lookup.count == 0 && s.load.count == 0 && s.store.count == 0);
    CHECK(s.lookup.p99_us == 0.0 && s.load.max_us == 0.0);
    CHECK(s.leases_active == 0 && s.pins_active == 0 && s.edits == 0);
    kdn_runtime_destroy(rt);
  }
  group_end();
}

/* ---- 9. Bad arguments ---------------------------------------------------- */

static void test_bad_runtime_options(void) {
  kdn_runtime_options o;
  kdn_tier_config t[KDN_MAX_TIERS + 1];
  kdn_runtime *rt;
  char path[300];
  size_t i;

  group_begin("9. bad arguments: tiers of kdn_runtime_options");
  subdir(path, sizeof path, "bad-tier");
#define RESET_TIERS()                                               \
  do {                                                              \
    for (i = 0; i < KDN_MAX_TIERS + 1; ++i) t[i] = disk_tier(path); \
    t[0] = (kdn_tier_config)KDN_TIER_CONFIG_INIT;                   \
    o = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;              \
    o.tiers = t;                                                    \
    o.num_tiers = 2;                                                \
    rt = (kdn_runtime *)&o; /* not NULL: a failure sets it to NULL */ \
  } while (0)
  RESET_TIERS();
  t[1].path = NULL; /* a disk tier with no path */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  CHECK(rt == NULL);
  RESET_TIERS();
  t[1].path_len = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[1].kind = (kdn_tier_kind)9; /* unknown kind */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[0].high_watermark = 0.5f; /* low > high */
  t[0].low_watermark = 0.9f;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[0].high_watermark = 1.5f; /* high > 1 */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[0].low_watermark = -0.5f;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[0].high_watermark = 0.5f; /* low defaults to min(0.85, high): fine */
  CHECK_OK(kdn_runtime_create(&o, &rt));
  kdn_runtime_destroy(rt);
  RESET_TIERS();
  t[0].capacity_bytes = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[0].policy = (kdn_eviction_policy)5;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[1].struct_size = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[0].struct_size = (uint32_t)offsetof(kdn_tier_config, write_through); /* too small */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[1].codec = "zip"; /* an unknown codec */
  t[1].codec_len = 3;
  /* The message names the spec. */
  CHECK(kdn_runtime_create(&o, &rt) == KDN_ERR_INVALID_ARGUMENT && strstr(kdn_last_error_message(), "zip") != NULL);
  CHECK(rt == NULL);
  RESET_TIERS();
  t[0].codec = "cachegen:bins=1"; /* a parameter out of range */
  t[0].codec_len = strlen(t[0].codec);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[1].codec = "int8:"; /* does not parse */
  t[1].codec_len = 5;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  t[1].codec = NULL; /* with a length */
  t[1].codec_len = 4;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  o.tiers = NULL; /* with num_tiers 2 */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  RESET_TIERS();
  o.num_tiers = KDN_MAX_TIERS + 1;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  CHECK(rt == NULL);
  {
    /* A disk tier whose directory cannot be made: under a regular file. */
    char file_path[320];
    FILE *f;
    snprintf(file_path, sizeof file_path, "%s/a-file", g_tmpdir);
    f = fopen(file_path, "w");
    if (f != NULL) fclose(f);
    RESET_TIERS();
    snprintf(path, sizeof path, "%s/a-file/tier", g_tmpdir);
    t[1] = disk_tier(path);
    CHECK(kdn_runtime_create(&o, &rt) != KDN_OK && rt == NULL);
    CHECK(kdn_last_error_message()[0] != '\0');
    subdir(path, sizeof path, "bad-tier");
  }
  {
    /* A 0.1 caller's options (ending before `tiers`) still work; S3-FIFO
     * and write-through are accepted. */
    RESET_TIERS();
    o.struct_size = (uint32_t)offsetof(kdn_runtime_options, tiers);
    CHECK_OK(kdn_runtime_create(&o, &rt));
    if (rt != NULL) {
      uint32_t count = 0;
      CHECK_OK(kdn_runtime_tier_count(rt, &count));
      CHECK_EQ(count, 1); /* tiers unread: one host tier */
    }
    kdn_runtime_destroy(rt);
    RESET_TIERS();
    t[0].policy = KDN_EVICT_S3FIFO;
    t[0].write_through = 1;
    o.worker_threads = 1;
    CHECK_OK(kdn_runtime_create(&o, &rt));
    kdn_runtime_destroy(rt);
  }
#undef RESET_TIERS
  group_end();
}

static void test_bad_call_arguments(void) {
  static const char ns[] = "bad";
  const size_t ns_len = sizeof ns - 1;
  static const int32_t table[SEQ_BLOCKS] = {0, 1, 2, 3, 4, 5};
  kdn_runtime *rt = g_big;
  kdn_model *m = g_big_model;
  kdn_runtime *rt_b = new_big_runtime(CHUNK);
  kdn_model *m_b = new_model(rt_b, FINGERPRINT); /* registered with rt_b */
  engine_kv *paged = ekv_paged(EKV_NHD, 6, table, SEQ_BLOCKS);
  engine_kv *llama = ekv_llama(POSITIONS);
  group_buf gp, gl;
  kdn_kv_group g, gv;
  kdn_request req = token_request(kTokens, POSITIONS), r;
  kdn_lookup_result res[2];
  int32_t negative[POSITIONS];
  uint8_t hashes[SEQ_BLOCKS * HASH_BYTES];
  kdn_op *op;
  kdn_op *done_op = NULL;
  uint32_t count = 0;
  kdn_tier_stats ts = KDN_TIER_STATS_INIT;
  kdn_status st;

  memcpy(negative, kTokens, sizeof kTokens);
  negative[7] = -3;
  make_hashes(hashes, SEQ_BLOCKS, 3);
  ekv_write_ref(paged, POSITIONS);
  whole_group(&gp, paged);
  whole_group(&gl, llama);

  group_begin("9. bad arguments: tier count and stats");
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_count(NULL, &count));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_count(rt, NULL));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(NULL, 0, &ts));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(rt, 0, NULL));
  ts.struct_size = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(rt, 0, &ts));
  ts.struct_size = 4; /* not even the header */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(rt, 0, &ts));
  ts.struct_size = sizeof ts;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_tier_stats(rt, 1, &ts)); /* one tier only */
  group_end();

  group_begin("9. bad arguments: kdn_lookup_batch");
  res[0] = (kdn_lookup_result)KDN_LOOKUP_RESULT_INIT;
  res[1] = (kdn_lookup_result)KDN_LOOKUP_RESULT_INIT;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(NULL, m, ns, ns_len, &req, 1, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, NULL, ns, ns_len, &req, 1, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m_b, ns, ns_len, &req, 1, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, NULL, ns_len, &req, 1, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, ns, 0, &req, 1, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, ns, ns_len, NULL, 1, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, ns, ns_len, &req, 0, res));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, ns, ns_len, &req, 1, NULL));
  res[1].struct_size = 0; /* one result without its struct_size: the whole call fails */
  {
    kdn_request two[2];
    two[0] = req;
    two[1] = req;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, ns, ns_len, two, 2, res));
    res[1].struct_size = 4;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup_batch(rt, m, ns, ns_len, two, 2, res));
  }
  {
    /* Bad requests fail alone, each with its status. */
    kdn_request bad[8];
    kdn_lookup_result out[8];
    static const kdn_status want[8] = {KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT,
                                       KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT,
                                       KDN_ERR_INVALID_ARGUMENT, KDN_OK};
    int i;
    bad[0] = token_request(NULL, POSITIONS);      /* tokens NULL */
    bad[1] = token_request(negative, POSITIONS);  /* a negative token */
    bad[2] = hash_request(hashes, SEQ_BLOCKS);
    bad[2].hash_bytes = 65;                       /* 1..64 */
    bad[3] = hash_request(hashes, 0);             /* no blocks */
    bad[4] = hash_request(NULL, SEQ_BLOCKS);      /* block_hashes NULL */
    bad[5] = hash_request(hashes, SEQ_BLOCKS);
    bad[5].block_tokens = 0;
    bad[6] = req;
    bad[6].struct_size = 0;
    bad[7] = hash_request(hashes, SEQ_BLOCKS);    /* fine: block_tokens 16 divides chunk_tokens 16 */
    bad[7].block_tokens = 16;
    for (i = 0; i < 8; ++i) out[i] = (kdn_lookup_result)KDN_LOOKUP_RESULT_INIT;
    CHECK_OK(kdn_lookup_batch(rt, m, ns, ns_len, bad, 8, out));
    for (i = 0; i < 8; ++i) {
      check_eq_at((unsigned long long)out[i].status, (unsigned long long)want[i], "request status", __LINE__);
    }
  }
  group_end();

  group_begin("9. bad arguments: load_begin, save_begin (calls)");
  /* Each call: the documented status, a message, *out set to NULL. */
#define CHECK_BOTH(want, request, groups, n)                                                             \
  do {                                                                                                 \
    op = (kdn_op *)&st;                                                                                \
    CHECK_ERROR(want, kdn_save_begin(rt, m, ns, ns_len, (request), (groups), (n), &op));              \
    CHECK(op == NULL);                                                                                 \
    op = (kdn_op *)&st;                                                                                \
    CHECK_ERROR(want, kdn_load_begin(rt, m, ns, ns_len, (request), (groups), (n), &op));              \
    CHECK(op == NULL);                                                                                 \
  } while (0)
  op = NULL;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, ns, ns_len, &req, &gp.g, 1, NULL));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m, ns, ns_len, &req, &gp.g, 1, NULL));
  op = (kdn_op *)&st;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(NULL, m, ns, ns_len, &req, &gp.g, 1, &op));
  CHECK(op == NULL);
  op = (kdn_op *)&st;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(NULL, m, ns, ns_len, &req, &gp.g, 1, &op));
  CHECK(op == NULL);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, NULL, ns, ns_len, &req, &gp.g, 1, &op));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, NULL, ns, ns_len, &req, &gp.g, 1, &op));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m_b, ns, ns_len, &req, &gp.g, 1, &op));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m_b, ns, ns_len, &req, &gp.g, 1, &op));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_begin(rt, m, NULL, ns_len, &req, &gp.g, 1, &op));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_load_begin(rt, m, ns, 0, &req, &gp.g, 1, &op));
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, NULL, &gp.g, 1);       /* request NULL */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, NULL, 1);        /* groups NULL */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &gp.g, 0);       /* no groups */
  group_end();

  group_begin("9. bad arguments: load_begin, save_begin (requests)");
  r = req;
  r.struct_size = 0;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r.struct_size = (uint32_t)offsetof(kdn_request, block_tokens); /* too small */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = token_request(kTokens, 0);
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = token_request(NULL, POSITIONS);
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = token_request(negative, POSITIONS);
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = hash_request(hashes, SEQ_BLOCKS);
  r.hash_bytes = 65;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = hash_request(hashes, 0);
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = hash_request(NULL, SEQ_BLOCKS);
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = hash_request(hashes, SEQ_BLOCKS);
  r.block_tokens = 0;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  r = hash_request(hashes, SEQ_BLOCKS);
  r.block_tokens = 6; /* chunk_tokens 16 is not a multiple of 6 */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gp.g, 1);
  {
    int32_t longer[POSITIONS + 1];
    memcpy(longer, kTokens, sizeof kTokens);
    longer[POSITIONS] = 5;
    r = token_request(longer, POSITIONS + 1); /* the views hold 48 tokens */
    CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &r, &gl.g, 1);
  }
  group_end();

  group_begin("9. bad arguments: load_begin, save_begin (groups, views)");
  g = gp.g;
  g.struct_size = 0;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g.struct_size = (uint32_t)offsetof(kdn_kv_group, view); /* too small */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.layers = NULL;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.num_layers = 0;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.num_layers = 4; /* the group has 5 */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.struct_size = 0;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g.view.struct_size = (uint32_t)offsetof(kdn_kv_view, block_stride); /* too small */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.layout = (kdn_kv_layout)7; /* unknown layout */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.dtype = KDN_DTYPE_F16; /* the model is F32 */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.memory = KDN_MEMORY_DEVICE;
  CHECK_BOTH(KDN_ERR_UNSUPPORTED, &req, &g, 1);
  g.view.memory = (kdn_memory_kind)7;
  CHECK_BOTH(KDN_ERR_UNSUPPORTED, &req, &g, 1);
  g = gp.g;
  g.view.k_layers = NULL;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.v_layers = NULL;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  {
    /* One layer's V base pointer NULL. */
    void *v[LAYERS];
    memcpy(v, paged->vp, sizeof v);
    v[3] = NULL;
    g = gp.g;
    g.view.v_layers = v;
    CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  }
  /* Paged views. */
  g = gp.g;
  g.view.block_table = NULL;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.block_table_len = SEQ_BLOCKS - 1; /* 48 tokens need 6 blocks of 8 */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.block_size = 0;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  g = gp.g;
  g.view.block_stride = BLOCK * TOKEN_ELEMS - 1; /* smaller than a block */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  {
    /* A block id at num_blocks, and a negative one. */
    int32_t t[SEQ_BLOCKS];
    memcpy(t, table, sizeof t);
    t[4] = 6; /* the allocation has blocks 0..5 */
    g = gp.g;
    g.view.block_table = t;
    CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
    t[4] = -1;
    CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  }
  g = gp.g;
  g.view.num_blocks = 5; /* the table uses block 5 */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &g, 1);
  /* Contiguous views. */
  gv = gl.g;
  gv.view.layer_elements = (uint64_t)POSITIONS * TOKEN_ELEMS - 1; /* one element short */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &gv, 1);
  gv = gl.g;
  gv.view.stride_token = -TOKEN_ELEMS;
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &gv, 1);
  gv = gl.g;
  gv.view.stride_token = 0; /* every token on the same elements */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &gv, 1);
  gv = gl.g;
  gv.view.v_stride_dim = 1; /* V's dims overlap its tokens */
  CHECK_BOTH(KDN_ERR_INVALID_ARGUMENT, &req, &gv, 1);
#undef CHECK_BOTH
  {
    /* No failed call stored anything or counted. */
    CHECK_EQ(lookup_one(rt, m, ns, &req), 0);
  }
  group_end();

  group_begin("9. bad arguments: ops");
  {
    kdn_op_state state;
    kdn_op_result result = KDN_OP_RESULT_INIT;
    kdn_token_range ranges[2];
    size_t n = 0;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait_layer(NULL, 0, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_save_layer(NULL, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait(NULL, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait(NULL, -1));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_poll(NULL, &state));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_cancel(NULL));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_result_get(NULL, &result));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_failed_ranges(NULL, ranges, 2, &n));
    CHECK_OK(kdn_load_begin(rt, m, ns, ns_len, &req, &gl.g, 1, &done_op));
    if (done_op != NULL) {
      CHECK_OK(kdn_op_wait(done_op, -1));
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_poll(done_op, NULL));
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_result_get(done_op, NULL));
      result.struct_size = 0;
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_result_get(done_op, &result));
      result.struct_size = 4;
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_result_get(done_op, &result));
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_failed_ranges(done_op, ranges, 2, NULL));
      CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_op_failed_ranges(done_op, NULL, 2, &n));
      CHECK_OK(kdn_op_failed_ranges(done_op, NULL, 0, &n));
      CHECK_EQ(n, 0);
      kdn_op_destroy(done_op);
    }
  }
  group_end();

  group_begin("9. bad arguments: knowledge");
  {
    canon_buf kv = canon_new(POSITIONS, POSITIONS);
    kdn_kv_buffer b;
    kdn_document_info info[2];
    size_t n = 0;
    uint64_t num = 0;
    int32_t toks[4];
    static const char id[] = "doc";
#define PUT(rt_, m_, ns_, nl_, tokens_, n_, kv_) \
  kdn_knowledge_put(rt_, m_, ns_, nl_, id, 3, 1, NULL, 0, tokens_, n_, kv_)
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(NULL, m, ns, ns_len, kTokens, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, NULL, ns, ns_len, kTokens, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m_b, ns, ns_len, kTokens, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, NULL, ns_len, kTokens, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, 0, kTokens, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, NULL, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, kTokens, 0, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, negative, POSITIONS, &kv.kv));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, kTokens, POSITIONS, NULL));
    b = kv.kv;
    b.num_tokens = POSITIONS - 1;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, kTokens, POSITIONS, &b));
    b = kv.kv;
    b.size_bytes = KV_BYTES - 1;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, kTokens, POSITIONS, &b));
    b = kv.kv;
    b.dtype = KDN_DTYPE_BF16;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, kTokens, POSITIONS, &b));
    b = kv.kv;
    b.memory = KDN_MEMORY_DEVICE;
    CHECK_ERROR(KDN_ERR_UNSUPPORTED, PUT(rt, m, ns, ns_len, kTokens, POSITIONS, &b));
    b = kv.kv;
    b.struct_size = 0;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, PUT(rt, m, ns, ns_len, kTokens, POSITIONS, &b));
    /* metadata NULL with a length */
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT,
                kdn_knowledge_put(rt, m, ns, ns_len, id, 3, 1, NULL, 4, kTokens, POSITIONS, &kv.kv));
#undef PUT
    /* Nothing was stored by a failed put. */
    CHECK_OK(kdn_knowledge_list(rt, m, ns, ns_len, NULL, 0, &n));
    CHECK_EQ(n, 0);

    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(NULL, m, ns, ns_len, info, 2, &n));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(rt, NULL, ns, ns_len, info, 2, &n));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(rt, m_b, ns, ns_len, info, 2, &n));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(rt, m, ns, 0, info, 2, &n));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(rt, m, ns, ns_len, info, 2, NULL));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(rt, m, ns, ns_len, NULL, 2, &n));
    CHECK_OK(kdn_knowledge_put(rt, m, ns, ns_len, id, 3, 1, NULL, 0, kTokens, POSITIONS, &kv.kv));
    info[0] = (kdn_document_info)KDN_DOCUMENT_INFO_INIT;
    info[0].struct_size = 0; /* a document to write, no struct_size */
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(rt, m, ns, ns_len, info, 2, &n));

    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(NULL, m, ns, ns_len, id, 3, 1, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(rt, NULL, ns, ns_len, id, 3, 1, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(rt, m, ns, 0, id, 3, 1, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(rt, m, ns, ns_len, id, 3, 1, -1));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_pin(rt, m, ns, ns_len, "nope", 4, 1, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(NULL, m, ns, ns_len, id, 3, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(rt, NULL, ns, ns_len, id, 3, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(rt, m, NULL, 0, id, 3, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(rt, m, ns, ns_len, id, 3, -5));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_expire(rt, m, ns, ns_len, "nope", 4, 0));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(NULL, m, ns, ns_len, id, 3));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(rt, NULL, ns, ns_len, id, 3));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(rt, m_b, ns, ns_len, id, 3));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(rt, m, ns, 0, id, 3));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_delete(rt, m, ns, ns_len, "nope", 4));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(NULL, m, ns, ns_len, id, 3, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, NULL, ns, ns_len, id, 3, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, m, ns, 0, id, 3, NULL, NULL, 0, &num));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, m, ns, ns_len, id, 3, NULL, NULL, 0, NULL));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, m, ns, ns_len, id, 3, NULL, NULL, 4, &num));
    CHECK_ERROR(KDN_ERR_NOT_FOUND, kdn_knowledge_fetch(rt, m, ns, ns_len, "nope", 4, NULL, toks, 4, &num));
    b = kv.kv;
    b.dtype = KDN_DTYPE_F16;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(rt, m, ns, ns_len, id, 3, &b, NULL, 0, &num));
    b = kv.kv;
    b.memory = KDN_MEMORY_DEVICE;
    CHECK_ERROR(KDN_ERR_UNSUPPORTED, kdn_knowledge_fetch(rt, m, ns, ns_len, id, 3, &b, NULL, 0, &num));
    CHECK_OK(kdn_knowledge_delete(rt, m, ns, ns_len, id, 3));
    canon_free(&kv);
  }
  group_end();

  ekv_free(paged);
  ekv_free(llama);
  kdn_model_destroy(m_b);
  kdn_runtime_destroy(rt_b);
}

/* ---- main ---------------------------------------------------------------- */

int main(void) {
  const kdn_model_spec probe_spec = stories260k_spec("probe");
  const double t0 = now_s();
  int loaded;
  setvbuf(stdout, NULL, _IOLBF, 0); /* every line out, even before a crash */
  loaded = load_reference();
  if (loaded != 1) {
    const char *require = getenv("KDN_REQUIRE_MODELS");
    free(g_ref);
    if (loaded == 0 && (require == NULL || strcmp(require, "1") != 0)) {
      printf("skipped: the reference model is missing (set KDN_MODELS, or KDN_REQUIRE_MODELS=1 to fail)\n");
      return 77;
    }
    printf("FAILED: the reference KV is %s\n", loaded == 0 ? "missing and KDN_REQUIRE_MODELS=1" : "unreadable");
    return 1;
  }

  snprintf(g_tmpdir, sizeof g_tmpdir, "/tmp/kdn_engine_api_XXXXXX");
  if (mkdtemp(g_tmpdir) == NULL) {
    printf("FAILED: cannot create a temporary directory under /tmp\n");
    free(g_ref);
    return 1;
  }
  /* First: it forks, before this process has started any runtime thread. */
  test_destroy_waits_for_save();
  if (kdn_runtime_create(NULL, &g_probe_runtime) != KDN_OK ||
      kdn_model_create(g_probe_runtime, &probe_spec, &g_probe_model) != KDN_OK) {
    printf("FAILED: cannot create a runtime and a model: %s\n", kdn_last_error_message());
    remove_tree(g_tmpdir);
    return 1;
  }
  g_big = new_big_runtime(CHUNK);
  g_big_model = g_big != NULL ? new_model(g_big, FINGERPRINT) : NULL;

  test_tiers();
  test_tier_codecs();
  test_paged_and_lookup_batch();
  if (g_big_model != NULL) {
    test_groups();
    test_block_hashes();
    test_ops();
  }
  test_knowledge();
  test_editor_callback();
  test_statistics();
  test_bad_runtime_options();
  if (g_big_model != NULL) test_bad_call_arguments();

  kdn_model_destroy(g_big_model);
  kdn_runtime_destroy(g_big);
  kdn_model_destroy(g_tiered_model);
  kdn_runtime_destroy(g_tiered);
  kdn_model_destroy(g_probe_model);
  kdn_runtime_destroy(g_probe_runtime);
  remove_tree(g_tmpdir);
  free(g_ref);
  printf("run time %.2f s\n", now_s() - t0);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
