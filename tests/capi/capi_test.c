// SPDX-License-Identifier: Apache-2.0
/* The C ABI from a plain C99 program (after leveldb's db/c_test.c): real KV
 * of the reference model (stories260K) goes through libkdn.so in several
 * layouts and comes back bit for bit; prefixes, tenants, fingerprints,
 * capacity, statistics and the runtime's lifetime behave as documented;
 * every bad argument gets its documented status and a message, which the
 * next successful call clears.
 *
 * One case per ctest test: `capi_test <case>` (see check.h; no argument
 * runs them all). Exit status: 0 passed, 1 a check failed, 2 an unknown
 * case, 77 the reference model is missing (skipped; a failure instead when
 * KDN_REQUIRE_MODELS=1). */
#include <kdn/kdn.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- The reference KV --------------------------------------------------- */

#include "reference.h"

enum { CHUNK = 20 }; /* 48 tokens = full chunks [0,20) [20,40) + a partial chunk [40,48) */
#define CHUNK_BYTES ((uint64_t)CHUNK * BYTES_PER_TOKEN)     /* 25,600 */
#define PARTIAL_BYTES ((uint64_t)8 * BYTES_PER_TOKEN)       /* 10,240 */
#define CHUNK_HELD HELD(CHUNK_BYTES)                          /* 28,672 */
#define KV_HELD (2 * CHUNK_HELD + HELD(PARTIAL_BYTES))        /* 69,632 */

/* ---- Test buffers in several layouts ------------------------------------ */

typedef enum layout_kind {
  LAYOUT_CANONICAL,  /* [layer][k|v][token][head][dim], passed as all strides 0 */
  LAYOUT_FILE,       /* [k|v][layer][token][head][dim]: the reference files' own */
  LAYOUT_TRANSPOSED  /* [dim][head][token][k|v][layer]: nothing contiguous */
} layout_kind;

typedef struct strides {
  int64_t layer, kv, token, head, dim;
} strides;

/* A caller's KV buffer: the floats, their layout, and the kdn view of them
 * (one allocation: `data` and the five strides). */
typedef struct test_buf {
  float *data;
  size_t elems;
  uint64_t tokens;
  strides st;
  kdn_kv_view view;
} test_buf;

static const unsigned char kSentinel = 0xA5; /* every byte of a fresh buffer */

static strides layout_strides(layout_kind kind, int64_t n) {
  strides s;
  switch (kind) {
    case LAYOUT_FILE:
      s.dim = 1, s.head = HEAD_DIM, s.token = TOKEN_ELEMS, s.layer = n * TOKEN_ELEMS, s.kv = LAYERS * s.layer;
      break;
    case LAYOUT_TRANSPOSED:
      s.layer = 1, s.kv = LAYERS, s.token = 2 * LAYERS, s.head = n * s.token, s.dim = HEADS * s.head;
      break;
    case LAYOUT_CANONICAL:
    default:
      s.dim = 1, s.head = HEAD_DIM, s.token = TOKEN_ELEMS, s.kv = n * TOKEN_ELEMS, s.layer = 2 * s.kv;
      break;
  }
  return s;
}

static size_t offset_of(const strides *s, int layer, int kv, int token, int head, int dim) {
  return (size_t)(layer * s->layer + kv * s->kv + token * s->token + head * s->head + dim * s->dim);
}

/* A buffer of `tokens` tokens, every byte kSentinel. All three layouts are
 * dense, so each spans exactly tokens x 320 floats. */
static test_buf buf_new(layout_kind kind, uint64_t tokens) {
  test_buf b;
  kdn_kv_view view = KDN_KV_VIEW_INIT;
  b.tokens = tokens;
  b.elems = (size_t)tokens * ELEMS_PER_TOKEN;
  b.st = layout_strides(kind, (int64_t)tokens);
  b.data = malloc(b.elems * sizeof(float));
  if (b.data == NULL) {
    printf("out of memory\n");
    exit(1);
  }
  memset(b.data, kSentinel, b.elems * sizeof(float));
  view.data = b.data;
  view.size_bytes = b.elems * sizeof(float);
  view.num_tokens = tokens;
  view.dtype = KDN_DTYPE_F32;
  if (kind != LAYOUT_CANONICAL) {
    view.stride_layer = b.st.layer;
    view.stride_kv = b.st.kv;
    view.stride_token = b.st.token;
    view.stride_head = b.st.head;
    view.stride_dim = b.st.dim;
  }
  b.view = view;
  return b;
}

static void buf_free(test_buf *b) {
  free(b->data);
  b->data = NULL;
}

/* Writes the reference KV of positions [0, count) to buffer tokens [0, count). */
static void write_ref(float *data, const strides *st, int count) {
  int l, kv, t, h, d;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < count; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float x = ref_at(l, kv, t, h, d);
            memcpy(&data[offset_of(st, l, kv, t, h, d)], &x, sizeof x);
          }
}

/* Whether the buffer holds exactly the reference KV of its first `filled`
 * tokens and kSentinel bytes everywhere else (compared byte for byte). */
static int buf_holds_ref(const test_buf *b, int filled) {
  float *want = malloc(b->elems * sizeof(float));
  int same;
  if (want == NULL) return 0;
  memset(want, kSentinel, b->elems * sizeof(float));
  write_ref(want, &b->st, filled);
  same = memcmp(b->data, want, b->elems * sizeof(float)) == 0;
  free(want);
  return same;
}

/* ---- Helpers ------------------------------------------------------------ */

static kdn_runtime *new_runtime(uint32_t chunk_tokens, uint64_t capacity) {
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *runtime = NULL;
  options.chunk_tokens = chunk_tokens;
  options.host_capacity_bytes = capacity;
  CHECK_OK(kdn_runtime_create(&options, &runtime));
  return runtime;
}

static kdn_stats get_stats(kdn_runtime *runtime) {
  kdn_stats stats = KDN_STATS_INIT;
  CHECK_OK(kdn_runtime_get_stats(runtime, &stats));
  return stats;
}

static kdn_latency get_latency(kdn_runtime *runtime, kdn_latency_kind kind) {
  kdn_latency latency = KDN_LATENCY_INIT;
  CHECK_OK(kdn_runtime_get_latency(runtime, kind, &latency));
  return latency;
}

static kdn_request req_of(const int32_t *tokens, size_t n) {
  kdn_request r = KDN_REQUEST_INIT;
  r.tokens = tokens;
  r.num_tokens = n;
  return r;
}

static uint64_t lookup(const kdn_model *m, const char *ns, const int32_t *tokens, size_t n) {
  const kdn_request req = req_of(tokens, n);
  kdn_lookup_result result = KDN_LOOKUP_RESULT_INIT;
  result.cached_tokens = 12345;
  CHECK_OK(kdn_kv_lookup(m, ns, strlen(ns), &req, 1, &result));
  CHECK_EQ(result.status, KDN_OK);
  return result.cached_tokens;
}

static uint64_t store(const kdn_model *m, const char *ns, const int32_t *tokens, size_t n, const test_buf *b) {
  const kdn_request req = req_of(tokens, n);
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  r.tokens = 12345;
  CHECK_OK(kdn_kv_store(m, ns, strlen(ns), &req, &b->view, 1, &r));
  CHECK(r.state == KDN_OP_DONE && r.status == KDN_OK && r.filled_size == sizeof r);
  return r.tokens;
}

/* kdn_kv_retrieve expecting KDN_OK; returns the tokens written (a host
 * tier is raw: nothing was lossy, and every chunk of the prefix found was
 * read). */
static uint64_t retrieve(const kdn_model *m, const char *ns, const int32_t *tokens, size_t n, const test_buf *b) {
  const kdn_request req = req_of(tokens, n);
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  r.tokens = 12345;
  CHECK_OK(kdn_kv_retrieve(m, ns, strlen(ns), &req, &b->view, 1, &r));
  CHECK(r.state == KDN_OP_DONE && r.status == KDN_OK && r.filled_size == sizeof r);
  CHECK(r.covered == r.tokens && r.num_failed == 0 && r.flags == 0);
  return r.tokens;
}

/* A miss: kdn_kv_retrieve returns KDN_OK with 0 tokens, an empty message,
 * and an untouched buffer. */
static void check_retrieve_misses(const kdn_model *m, const char *ns, const int32_t *tokens, size_t n, int line) {
  test_buf b = buf_new(LAYOUT_CANONICAL, n);
  const kdn_request req = req_of(tokens, n);
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  r.tokens = 12345;
  r.covered = 12345;
  check_status_at(kdn_kv_retrieve(m, ns, strlen(ns), &req, &b.view, 1, &r), KDN_OK, "kdn_kv_retrieve (a miss)", line);
  check_at(strcmp(kdn_last_error_message(), "") == 0, "a miss is no error: the message is empty", line);
  check_eq_at(r.tokens, 0, "tokens of a miss", line);
  check_eq_at(r.covered, 0, "prefix found by a miss", line);
  check_at(r.state == KDN_OP_DONE && r.status == KDN_OK, "a miss is done and OK", line);
  check_at(buf_holds_ref(&b, 0), "a miss writes nothing to the buffer", line);
  buf_free(&b);
}
#define CHECK_RETRIEVE_MISSES(m, ns, tokens, n) check_retrieve_misses(m, ns, tokens, n, __LINE__)

static int latency_sane(const kdn_latency *l) {
  return l->count > 0 && l->mean_us > 0.0 && l->p50_us <= l->p90_us && l->p90_us <= l->p99_us &&
         l->p99_us <= l->max_us && l->mean_us <= l->max_us;
}

/* ---- Versions and statuses ----------------------------------------------- */

static void test_versions(void) {
  char version[64];
  group_begin("versions");
  CHECK_EQ(kdn_version_number(), KDN_VERSION_NUMBER);
  CHECK_EQ(KDN_VERSION_NUMBER, KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH);
  CHECK_EQ(KDN_VERSION_MAJOR, 1);
  snprintf(version, sizeof version, "%d.%d.%d", KDN_VERSION_MAJOR, KDN_VERSION_MINOR, KDN_VERSION_PATCH);
  CHECK(kdn_version() != NULL && strcmp(kdn_version(), version) == 0);
  group_end();
}

static void test_statuses(void) {
  static const struct {
    kdn_status code;
    int value;
    const char *name;
  } codes[] = {{KDN_OK, 0, "KDN_OK"},
               {KDN_ERR_INVALID_ARGUMENT, -1, "KDN_ERR_INVALID_ARGUMENT"},
               {KDN_ERR_NOT_FOUND, -2, "KDN_ERR_NOT_FOUND"},
               {KDN_ERR_BUSY, -3, "KDN_ERR_BUSY"},
               {KDN_ERR_UNAVAILABLE, -4, "KDN_ERR_UNAVAILABLE"},
               {KDN_ERR_CORRUPT, -5, "KDN_ERR_CORRUPT"},
               {KDN_ERR_UNSUPPORTED, -6, "KDN_ERR_UNSUPPORTED"},
               {KDN_ERR_NO_MEMORY, -7, "KDN_ERR_NO_MEMORY"},
               {KDN_ERR_INTERNAL, -8, "KDN_ERR_INTERNAL"},
               {KDN_ERR_TIMEOUT, -9, "KDN_ERR_TIMEOUT"},
               {KDN_ERR_CANCELLED, -10, "KDN_ERR_CANCELLED"},
               {KDN_ERR_VERSION, -11, "KDN_ERR_VERSION"},
               {KDN_ERR_BUFFER_TOO_SMALL, -12, "KDN_ERR_BUFFER_TOO_SMALL"}};
  size_t i;
  group_begin("status codes: values pinned, names static");
  CHECK_EQ(sizeof(kdn_status), 4);
  CHECK((kdn_status)-1 < 0); /* a signed type */
  for (i = 0; i < sizeof codes / sizeof codes[0]; ++i) {
    const char *name = kdn_status_string(codes[i].code);
    check_at(codes[i].code == codes[i].value, codes[i].name, __LINE__);
    check_at(name != NULL && strcmp(name, codes[i].name) == 0, codes[i].name, __LINE__);
  }
  /* The list is open: codes this library does not know get a name too. */
  CHECK(kdn_status_string(-13) != NULL && strcmp(kdn_status_string(-13), "KDN_ERR_UNKNOWN") == 0);
  CHECK(strcmp(kdn_status_string(-99), "KDN_ERR_UNKNOWN") == 0);
  CHECK(strcmp(kdn_status_string(1), "KDN_ERR_UNKNOWN") == 0);
  CHECK(strcmp(kdn_status_string((kdn_status)INT32_MIN), "KDN_ERR_UNKNOWN") == 0);
  CHECK(kdn_status_string(KDN_ERR_TIMEOUT) == kdn_status_string(KDN_ERR_TIMEOUT)); /* static storage */
  /* Before any failure the message is "", never NULL. */
  CHECK(kdn_last_error_message() != NULL && strcmp(kdn_last_error_message(), "") == 0);
  group_end();
}

static void test_init_functions(void) {
  kdn_runtime_options ro, ro_macro = KDN_RUNTIME_OPTIONS_INIT;
  kdn_model_spec spec, spec_macro = KDN_MODEL_SPEC_INIT;
  kdn_request req, req_macro = KDN_REQUEST_INIT;
  kdn_kv_view view, view_macro = KDN_KV_VIEW_INIT;
  kdn_stats stats, stats_macro = KDN_STATS_INIT;
  kdn_latency lat, lat_macro = KDN_LATENCY_INIT;
  kdn_kv_result res, res_macro = KDN_KV_RESULT_INIT;

  group_begin("init functions agree with the macros; destroy(NULL)");
  memset(&ro, 0x5A, sizeof ro);
  memset(&spec, 0x5A, sizeof spec);
  memset(&req, 0x5A, sizeof req);
  memset(&view, 0x5A, sizeof view);
  memset(&stats, 0x5A, sizeof stats);
  memset(&lat, 0x5A, sizeof lat);
  memset(&res, 0x5A, sizeof res);
  CHECK_OK(kdn_runtime_options_init(&ro, sizeof ro));
  CHECK_OK(kdn_model_spec_init(&spec, sizeof spec));
  CHECK_OK(kdn_request_init(&req, sizeof req));
  CHECK_OK(kdn_kv_view_init(&view, sizeof view));
  CHECK_OK(kdn_stats_init(&stats, sizeof stats));
  CHECK_OK(kdn_latency_init(&lat, sizeof lat));
  CHECK_OK(kdn_kv_result_init(&res, sizeof res));
  /* Every struct is padding-free, so the bytes compare. */
  CHECK(memcmp(&ro, &ro_macro, sizeof ro) == 0);
  CHECK(memcmp(&spec, &spec_macro, sizeof spec) == 0);
  CHECK(memcmp(&req, &req_macro, sizeof req) == 0);
  CHECK(memcmp(&view, &view_macro, sizeof view) == 0);
  CHECK(memcmp(&stats, &stats_macro, sizeof stats) == 0);
  CHECK(memcmp(&lat, &lat_macro, sizeof lat) == 0);
  CHECK(memcmp(&res, &res_macro, sizeof res) == 0);
  CHECK_EQ(ro.struct_size, sizeof ro);
  CHECK_EQ(ro.chunk_tokens, 256);
  CHECK_EQ(ro.host_capacity_bytes, (uint64_t)1 << 30);
  CHECK(spec.rope_theta == 10000.0f && spec.rope_style == KDN_ROPE_INTERLEAVED && spec.fingerprint == NULL);
  CHECK(view.memory == KDN_MEMORY_HOST && view.layout == KDN_LAYOUT_CONTIGUOUS && view.data == NULL);
  /* A NULL struct is a bad argument. */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_options_init(NULL, sizeof ro));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_spec_init(NULL, sizeof spec));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_stats_init(NULL, sizeof stats));
  kdn_runtime_destroy(NULL);
  kdn_model_destroy(NULL);
  check_at(1, "destroy(NULL) is a no-op", __LINE__);
  group_end();
}

/* ---- The data path ------------------------------------------------------- */

/* One runtime (chunks of 20) and the reference KV in two layouts; the cases
 * below run the steps they need in order. */
typedef struct data_path {
  kdn_runtime *rt;
  kdn_model *m;
  test_buf canonical;
  test_buf file;
  int32_t longer[POSITIONS + 12]; /* the 48 positions followed by 12 tokens never stored */
  int32_t other_start[POSITIONS]; /* another first token */
} data_path;

static void dp_open(data_path *dp) {
  static const int32_t extra[12] = {267, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  dp->rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  dp->m = new_model(dp->rt, FINGERPRINT);
  dp->canonical = buf_new(LAYOUT_CANONICAL, POSITIONS);
  dp->file = buf_new(LAYOUT_FILE, POSITIONS);
  memcpy(dp->longer, kTokens, sizeof kTokens);
  memcpy(dp->longer + POSITIONS, extra, sizeof extra);
  memcpy(dp->other_start, kTokens, sizeof kTokens);
  dp->other_start[0] = 2;
  write_ref(dp->canonical.data, &dp->canonical.st, POSITIONS);
  memcpy(dp->file.data, g_ref, KV_BYTES); /* the files' bytes, as they are */
}

static void dp_close(data_path *dp) {
  buf_free(&dp->canonical);
  buf_free(&dp->file);
  kdn_model_destroy(dp->m);
  kdn_runtime_destroy(dp->rt);
}

/* lookups 3, retrieves 1 (a miss), stores 3. */
static void dp_store(data_path *dp) {
  kdn_model *m = dp->m;
  kdn_stats s;
  uint64_t bytes_per_token = 0;
  group_begin("store: canonical and strided (file) layouts");
  CHECK_OK(kdn_model_get_kv_bytes_per_token(m, &bytes_per_token));
  CHECK_EQ(bytes_per_token, BYTES_PER_TOKEN);
  s = get_stats(dp->rt);
  CHECK(s.lookups == 0 && s.retrieves == 0 && s.stores == 0 && s.chunks == 0 && s.used_bytes == 0);
  CHECK_EQ(s.capacity_bytes, (uint64_t)1 << 30);

  CHECK_EQ(lookup(m, "canonical", kTokens, POSITIONS), 0);                 /* lookups 1 */
  CHECK_RETRIEVE_MISSES(m, "canonical", kTokens, POSITIONS);               /* retrieves 1, misses 1 */
  CHECK_EQ(store(m, "canonical", kTokens, POSITIONS, &dp->canonical), POSITIONS); /* stores 1: 3 chunks */
  s = get_stats(dp->rt);
  CHECK_EQ(s.chunks, 3);
  CHECK_EQ(s.used_bytes, KV_HELD);
  CHECK_EQ(s.tokens_stored, POSITIONS);
  /* Again: every chunk is there already; out_stored_tokens is optional. */
  {
    const kdn_request req = req_of(kTokens, POSITIONS);
    CHECK_OK(kdn_kv_store(m, "canonical", 9, &req, &dp->canonical.view, 1, NULL)); /* stores 2 */
  }
  s = get_stats(dp->rt);
  CHECK_EQ(s.chunks, 3);
  CHECK_EQ(s.tokens_stored, POSITIONS);
  CHECK_EQ(lookup(m, "canonical", kTokens, POSITIONS), POSITIONS);        /* lookups 2 */
  CHECK_EQ(store(m, "strided", kTokens, POSITIONS, &dp->file), POSITIONS); /* stores 3: 3 more chunks */
  CHECK_EQ(lookup(m, "strided", kTokens, POSITIONS), POSITIONS);          /* lookups 3 */
  CHECK(buf_holds_ref(&dp->canonical, POSITIONS) && memcmp(dp->file.data, g_ref, KV_BYTES) == 0); /* inputs untouched */
  group_end();
}

/* retrieves 4 more (hits 12). */
static void dp_retrieve(data_path *dp) {
  kdn_model *m = dp->m;
  group_begin("retrieve: every layout, bit for bit");
  {
    test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS);
    CHECK_EQ(retrieve(m, "canonical", kTokens, POSITIONS, &out), POSITIONS); /* retrieves 2, hits 3 */
    CHECK(buf_holds_ref(&out, POSITIONS));
    CHECK(memcmp(out.data, dp->canonical.data, KV_BYTES) == 0);
    buf_free(&out);
  }
  {
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    CHECK_EQ(retrieve(m, "strided", kTokens, POSITIONS, &out), POSITIONS);   /* retrieves 3, hits 6 */
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    buf_free(&out);
  }
  {
    /* Stored canonical, read strided: the layouts are only the caller's. */
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    CHECK_EQ(retrieve(m, "canonical", kTokens, POSITIONS, &out), POSITIONS); /* retrieves 4, hits 9 */
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    buf_free(&out);
  }
  {
    test_buf out = buf_new(LAYOUT_TRANSPOSED, POSITIONS);
    CHECK_EQ(retrieve(m, "strided", kTokens, POSITIONS, &out), POSITIONS);   /* retrieves 5, hits 12 */
    CHECK(buf_holds_ref(&out, POSITIONS));
    buf_free(&out);
  }
  group_end();
}

/* lookups 7 more, retrieves 4 more (hits 5, misses 3). */
static void dp_prefixes(data_path *dp) {
  kdn_model *m = dp->m;
  /* Chunks of 20: [0,20) and [20,40) chain; the partial [40,48) is indexed
   * under [20,40) and matches a request holding at least its 8 tokens. Only
   * whole stored chunks count, so a request ending inside one stops before it. */
  group_begin("prefixes, longer and different requests");
  CHECK_EQ(lookup(m, "canonical", kTokens, 16), 0);                 /* inside the first chunk */
  CHECK_EQ(lookup(m, "canonical", kTokens, 20), 20);
  CHECK_EQ(lookup(m, "canonical", kTokens, 30), 20);
  CHECK_EQ(lookup(m, "canonical", kTokens, 44), 40);                /* the partial needs 8 */
  CHECK_EQ(lookup(m, "canonical", dp->longer, POSITIONS + 5), POSITIONS);  /* 13 left < a chunk */
  CHECK_EQ(lookup(m, "canonical", dp->longer, POSITIONS + 12), POSITIONS); /* 20 left, no such chunk */
  {
    /* The first 20 tokens into a 48-token buffer: tokens 20.. stay untouched. */
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    CHECK_EQ(retrieve(m, "canonical", kTokens, 20, &out), 20);      /* hits 1 */
    CHECK(buf_holds_ref(&out, 20));
    memset(out.data, kSentinel, out.elems * sizeof(float));
    CHECK_EQ(retrieve(m, "canonical", kTokens, 30, &out), 20);      /* hits 1, misses 1 */
    CHECK(buf_holds_ref(&out, 20));
    buf_free(&out);
  }
  {
    test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS + 12);
    CHECK_EQ(retrieve(m, "strided", dp->longer, POSITIONS + 12, &out), POSITIONS); /* hits 3, misses 1 */
    CHECK(buf_holds_ref(&out, POSITIONS));
    buf_free(&out);
  }
  CHECK_EQ(lookup(m, "canonical", dp->other_start, POSITIONS), 0);
  CHECK_RETRIEVE_MISSES(m, "canonical", dp->other_start, POSITIONS); /* misses 1 */
  group_end();
}

static void test_store_layouts(void) {
  data_path dp;
  dp_open(&dp);
  dp_store(&dp);
  dp_close(&dp);
}

static void test_retrieve_layouts(void) {
  data_path dp;
  dp_open(&dp);
  dp_store(&dp);
  dp_retrieve(&dp);
  group_begin("retrieve: several views of one allocation, with layers");
  {
    /* The file layout cut into two views: layers {0, 2, 4} and {1, 3}.
     * View layer j of the first is model layer 2j: twice the stride. */
    static const uint32_t even[3] = {0, 2, 4}, odd[2] = {1, 3};
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    kdn_kv_view views[2];
    const kdn_request req = req_of(kTokens, POSITIONS);
    kdn_kv_result filled = KDN_KV_RESULT_INIT;
    views[0] = out.view;
    views[0].layers = even;
    views[0].num_layers = 3;
    views[0].stride_layer = 2 * out.st.layer;
    views[1] = views[0];
    views[1].layers = odd;
    views[1].num_layers = 2;
    views[1].data = out.data + out.st.layer;
    views[1].size_bytes = KV_BYTES - (uint64_t)out.st.layer * sizeof(float);
    CHECK_OK(kdn_kv_retrieve(dp.m, "canonical", 9, &req, views, 2, &filled));
    CHECK_EQ(filled.tokens, POSITIONS);
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    /* Stored through them too: the same chunks. */
    CHECK_OK(kdn_kv_store(dp.m, "two-views", 9, &req, views, 2, &filled));
    CHECK_EQ(filled.tokens, POSITIONS);
    {
      test_buf back = buf_new(LAYOUT_TRANSPOSED, POSITIONS);
      CHECK_EQ(retrieve(dp.m, "two-views", kTokens, POSITIONS, &back), POSITIONS);
      CHECK(buf_holds_ref(&back, POSITIONS));
      buf_free(&back);
    }
    buf_free(&out);
  }
  group_end();
  dp_close(&dp);
}

static void test_prefixes(void) {
  data_path dp;
  dp_open(&dp);
  dp_store(&dp);
  dp_prefixes(&dp);
  dp_close(&dp);
}

static void test_statistics(void) {
  data_path dp;
  kdn_stats s;
  kdn_latency lat;
  dp_open(&dp);
  dp_store(&dp);
  dp_retrieve(&dp);
  dp_prefixes(&dp);
  group_begin("statistics: counters and latencies");
  s = get_stats(dp.rt);
  CHECK_EQ(s.struct_size, sizeof(kdn_stats));
  CHECK_EQ(s.filled_size, sizeof(kdn_stats));
  CHECK_EQ(s.lookups, 10);
  CHECK_EQ(s.retrieves, 9);
  CHECK_EQ(s.stores, 3);
  CHECK_EQ(s.hits, 17);  /* 3 + 3 + 3 + 3 + 1 + 1 + 3 chunks */
  CHECK_EQ(s.misses, 4); /* the first retrieve, 30 tokens, 60 tokens, another first token */
  CHECK_EQ(s.tokens_served, 5 * POSITIONS + 20 + 20);  /* 280 */
  CHECK_EQ(s.bytes_served, (5 * POSITIONS + 20 + 20) * BYTES_PER_TOKEN);
  CHECK_EQ(s.tokens_stored, 2 * POSITIONS);            /* the repeated store added nothing */
  CHECK_EQ(s.bytes_stored, 2 * KV_BYTES);
  CHECK_EQ(s.chunks, 6);
  CHECK_EQ(s.used_bytes, 2 * KV_HELD);
  CHECK_EQ(s.capacity_bytes, (uint64_t)1 << 30);
  CHECK_EQ(s.evictions, 0);
  CHECK(s.leases_active == 0 && s.pins_active == 0 && s.edits == 0 && s.edited_served == 0);
  /* 1.4: the tokens the loads asked for (48, 4 x 48, then 20, 30, 60, 48);
   * no prefill was reported, so every token served is unpriced. */
  CHECK_EQ(s.tokens_requested, 48 + 4 * 48 + 20 + 30 + 60 + 48);
  CHECK(s.prefill_tokens == 0 && s.prefill_ns == 0 && s.ttft_saved_ns == 0);
  CHECK_EQ(s.tokens_served_unpriced, s.tokens_served);
  CHECK(s.delivery_ns > 0);
  /* The lookups' tokens: 48 x 3, then 16, 20, 30, 44, 53, 60, 48; found
   * 0, 48, 48, then 0, 20, 20, 40, 48, 48, 0. */
  CHECK_EQ(s.lookup_tokens, 3 * 48 + 16 + 20 + 30 + 44 + 53 + 60 + 48);
  CHECK_EQ(s.lookup_hit_tokens, 2 * 48 + 20 + 20 + 40 + 48 + 48);
  /* One latency sample per looked-up request, per retrieve, per store. */
  lat = get_latency(dp.rt, KDN_LATENCY_LOOKUP);
  CHECK_EQ(lat.filled_size, sizeof(kdn_latency));
  CHECK_EQ(lat.count, 10);
  CHECK(latency_sane(&lat));
  lat = get_latency(dp.rt, KDN_LATENCY_LOAD);
  CHECK_EQ(lat.count, 9);
  CHECK(latency_sane(&lat));
  lat = get_latency(dp.rt, KDN_LATENCY_STORE);
  CHECK_EQ(lat.count, 3);
  CHECK(latency_sane(&lat));
  {
    /* A struct_size below the first published size: KDN_ERR_VERSION, and
     * nothing written beyond it. */
    kdn_stats old;
    memset(&old, 0xEE, sizeof old);
    old.struct_size = KDN_STATS_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_stats(dp.rt, &old));
    CHECK_EQ(old.edits, 0xEEEEEEEEEEEEEEEEull);
  }
  {
    /* A fresh runtime: every counter and latency is empty. */
    kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 20);
    s = get_stats(rt);
    CHECK(s.lookups == 0 && s.retrieves == 0 && s.stores == 0 && s.chunks == 0);
    lat = get_latency(rt, KDN_LATENCY_LOOKUP);
    CHECK(lat.count == 0 && lat.p99_us == 0.0 && lat.max_us == 0.0);
    lat = get_latency(rt, KDN_LATENCY_STORE);
    CHECK(lat.count == 0 && lat.mean_us == 0.0);
    kdn_runtime_destroy(rt);
  }
  group_end();
  dp_close(&dp);
}

/* 1.4: a runtime keeps prefill meters for at most 4096 models: a new
 * model's report is then KDN_ERR_BUSY, the models that have meters go on. */
static void test_prefill_models_bounded(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *first = new_model(rt, "model 0");
  kdn_stats s;
  char name[32];
  int i;
  group_begin("prefill reports: at most 4096 models");
  CHECK_OK(kdn_model_report_prefill(first, 10, 10000));
  for (i = 1; i < 4096; ++i) {
    kdn_model *m;
    snprintf(name, sizeof name, "model %d", i);
    m = new_model(rt, name);
    if (kdn_model_report_prefill(m, 1, 1000) != KDN_OK) {
      CHECK(0 && "a report of one of the first 4096 models was refused");
      kdn_model_destroy(m);
      break;
    }
    kdn_model_destroy(m);
  }
  {
    kdn_model *extra = new_model(rt, "model 4096");
    CHECK_ERROR_NAMING(KDN_ERR_BUSY, "4096", kdn_model_report_prefill(extra, 1, 1000));
    kdn_model_destroy(extra);
  }
  CHECK_OK(kdn_model_report_prefill(first, 10, 10000)); /* a model with a meter goes on */
  s = get_stats(rt);
  CHECK_EQ(s.prefill_tokens, 20 + 4095);
  group_end();
  kdn_model_destroy(first);
  kdn_runtime_destroy(rt);
}

/* 1.4: prefills reported by the engine price the tokens later loads serve. */
static void test_prefill_reports(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  kdn_model *other = new_model(rt, "another model");
  test_buf in = buf_new(LAYOUT_CANONICAL, POSITIONS);
  test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS);
  kdn_stats s;
  group_begin("prefill reports: TTFT saved per load");
  CHECK(kdn_version_number() >= 10400);
  write_ref(in.data, &in.st, POSITIONS);
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "NULL", kdn_model_report_prefill(NULL, 10, 1000));
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "tokens", kdn_model_report_prefill(m, 0, 1000));
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "time", kdn_model_report_prefill(m, 10, 0));
  /* 4e12 ns (over an hour) for one token: seconds or ms mistaken for ns. */
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "nanoseconds", kdn_model_report_prefill(m, 1, 4000000000000ull));
  s = get_stats(rt);
  CHECK(s.prefill_tokens == 0 && s.prefill_ns == 0); /* refused reports count nothing */

  CHECK_EQ(store(m, "t", kTokens, POSITIONS, &in), POSITIONS);
  CHECK_EQ(store(other, "t", kTokens, POSITIONS, &in), POSITIONS);
  /* Before any report: served, not priced. */
  CHECK_EQ(retrieve(m, "t", kTokens, POSITIONS, &out), POSITIONS);
  s = get_stats(rt);
  CHECK_EQ(s.tokens_served_unpriced, POSITIONS);
  CHECK_EQ(s.ttft_saved_ns, 0);
  /* Two reports: 100 tokens in 250 us, 300 in 550 us: a mean of 2000 ns. */
  CHECK_OK(kdn_model_report_prefill(m, 100, 250000));
  CHECK_OK(kdn_model_report_prefill(m, 300, 550000));
  CHECK_EQ(retrieve(m, "t", kTokens, POSITIONS, &out), POSITIONS);
  CHECK_EQ(retrieve(m, "t", kTokens, 20, &out), 20);
  s = get_stats(rt);
  CHECK_EQ(s.prefill_tokens, 400);
  CHECK_EQ(s.prefill_ns, 800000);
  CHECK_EQ(s.ttft_saved_ns, (uint64_t)(POSITIONS + 20) * 2000);
  CHECK_EQ(s.tokens_served_unpriced, POSITIONS);
  /* A miss saves nothing but its time is delivery time. */
  CHECK_RETRIEVE_MISSES(m, "u", kTokens, POSITIONS);
  s = get_stats(rt);
  CHECK_EQ(s.ttft_saved_ns, (uint64_t)(POSITIONS + 20) * 2000);
  CHECK_EQ(s.tokens_requested, 3 * POSITIONS + 20);
  CHECK(s.delivery_ns > 0);
  /* Another model has its own rate: none yet, so its loads are unpriced. */
  CHECK_EQ(retrieve(other, "t", kTokens, POSITIONS, &out), POSITIONS);
  s = get_stats(rt);
  CHECK_EQ(s.tokens_served_unpriced, 2 * POSITIONS);
  CHECK_OK(kdn_model_report_prefill(other, 10, 10000)); /* 1000 ns per token */
  CHECK_EQ(retrieve(other, "t", kTokens, POSITIONS, &out), POSITIONS);
  s = get_stats(rt);
  CHECK_EQ(s.ttft_saved_ns, (uint64_t)(POSITIONS + 20) * 2000 + POSITIONS * 1000);
  CHECK_EQ(s.prefill_tokens, 410);
  {
    /* A caller built against 1.0-1.3: the fields it knows, nothing past them. */
    unsigned char raw[sizeof(kdn_stats)];
    kdn_stats *old = (kdn_stats *)raw;
    memset(raw, 0xEE, sizeof raw);
    old->struct_size = KDN_STATS_SIZE_V1;
    CHECK_OK(kdn_runtime_get_stats(rt, old));
    CHECK_EQ(old->filled_size, KDN_STATS_SIZE_V1);
    CHECK_EQ(old->tokens_served, 4 * POSITIONS + 20);
    CHECK_EQ(raw[KDN_STATS_SIZE_V1], 0xEE);
  }
  group_end();
  buf_free(&in);
  buf_free(&out);
  kdn_model_destroy(other);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

/* ---- Tenants and fingerprints -------------------------------------------- */

static void test_tenants(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  write_ref(kv.data, &kv.st, POSITIONS);

  group_begin("tenant isolation");
  CHECK_EQ(store(m, "tenant-a", kTokens, POSITIONS, &kv), POSITIONS);
  CHECK_EQ(lookup(m, "tenant-a", kTokens, POSITIONS), POSITIONS);
  CHECK_EQ(lookup(m, "tenant-b", kTokens, POSITIONS), 0);
  CHECK_RETRIEVE_MISSES(m, "tenant-b", kTokens, POSITIONS);
  {
    /* Namespaces are (pointer, length): "tenant-a" cut to 7 bytes is another
     * tenant, and a longer string cut to 8 bytes is tenant-a. */
    const kdn_request req = req_of(kTokens, POSITIONS);
    kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
    CHECK_OK(kdn_kv_lookup(m, "tenant-a", 7, &req, 1, &r));
    CHECK_EQ(r.cached_tokens, 0);
    CHECK_OK(kdn_kv_lookup(m, "tenant-a/other", 8, &req, 1, &r));
    CHECK_EQ(r.cached_tokens, POSITIONS);
  }
  {
    /* A namespace of 4096 bytes (the longest) is one more tenant. */
    char *long_ns = malloc(4096);
    const kdn_request req = req_of(kTokens, POSITIONS);
    kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
    kdn_kv_result stored = KDN_KV_RESULT_INIT;
    if (long_ns != NULL) {
      memset(long_ns, 't', 4096);
      CHECK_OK(kdn_kv_store(m, long_ns, 4096, &req, &kv.view, 1, &stored));
      CHECK_EQ(stored.tokens, POSITIONS);
      CHECK_OK(kdn_kv_lookup(m, long_ns, 4096, &req, 1, &r));
      CHECK_EQ(r.cached_tokens, POSITIONS);
      CHECK_OK(kdn_kv_lookup(m, long_ns, 4095, &req, 1, &r));
      CHECK_EQ(r.cached_tokens, 0);
      free(long_ns);
    }
  }
  group_end();

  buf_free(&kv);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

/* A request's salt (since 1.13; vLLM's cache_salt) enters every chunk key:
 * salted KV answers only requests with the same salt, never an unsalted
 * request, and unsalted KV never a salted one, in lookups, retrieves and
 * load ops. A caller built against an older kdn.h (a struct that ends
 * before the salt) is unsalted whatever its memory holds after it. */
static kdn_request salted(const int32_t *tokens, size_t n, const char *salt) {
  kdn_request r = req_of(tokens, n);
  r.salt = (const uint8_t *)salt;
  r.salt_len = strlen(salt);
  return r;
}

static uint64_t lookup_request(const kdn_model *m, const kdn_request *req) {
  kdn_lookup_result result = KDN_LOOKUP_RESULT_INIT;
  CHECK_OK(kdn_kv_lookup(m, "t", 1, req, 1, &result));
  CHECK_EQ(result.status, KDN_OK);
  return result.cached_tokens;
}

static void test_salts(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS), other = buf_new(LAYOUT_CANONICAL, POSITIONS);
  test_buf loaded = buf_new(LAYOUT_CANONICAL, POSITIONS);
  const kdn_request plain = req_of(kTokens, POSITIONS);
  const kdn_request a = salted(kTokens, POSITIONS, "user-a"), b = salted(kTokens, POSITIONS, "user-b");
  const kdn_request prefix_a = salted(kTokens, 30, "user-a");
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  kdn_request old = b, bad = a;
  kdn_op *op = NULL;
  write_ref(kv.data, &kv.st, POSITIONS);

  group_begin("salted requests hit only KV stored with their salt");
  CHECK_OK(kdn_kv_store(m, "t", 1, &a, &kv.view, 1, &r));
  CHECK_EQ(r.tokens, POSITIONS);
  CHECK_EQ(lookup_request(m, &a), POSITIONS);
  CHECK_EQ(lookup_request(m, &prefix_a), CHUNK); /* a salted prefix: its whole chunk */
  CHECK_EQ(lookup_request(m, &plain), 0);
  CHECK_EQ(lookup_request(m, &b), 0);
  CHECK_OK(kdn_kv_retrieve(m, "t", 1, &a, &out.view, 1, &r));
  CHECK_EQ(r.tokens, POSITIONS);
  CHECK(buf_holds_ref(&out, POSITIONS));
  CHECK_OK(kdn_kv_retrieve(m, "t", 1, &b, &other.view, 1, &r));
  CHECK_EQ(r.tokens, 0);
  CHECK(buf_holds_ref(&other, 0)); /* nothing written */
  CHECK_OK(kdn_kv_load_async(m, "t", 1, &a, &loaded.view, 1, &op));
  CHECK_OK(kdn_op_wait(op, -1));
  CHECK_OK(kdn_op_get_result(op, &r));
  CHECK_EQ(r.tokens, POSITIONS);
  CHECK(buf_holds_ref(&loaded, POSITIONS));
  kdn_op_destroy(op);
  /* Unsalted KV answers unsalted requests only. */
  CHECK_EQ(store(m, "t", kTokens, POSITIONS, &kv), POSITIONS);
  CHECK_EQ(lookup_request(m, &plain), POSITIONS);
  CHECK_EQ(lookup_request(m, &b), 0);
  /* A 1.12 caller's request ends before the salt: unsalted. */
  old.struct_size = (uint32_t)offsetof(kdn_request, salt);
  CHECK_EQ(lookup_request(m, &old), POSITIONS);
  group_end();

  group_begin("bad salts");
  bad.salt = NULL;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "salt", kdn_kv_store(m, "t", 1, &bad, &kv.view, 1, NULL));
  bad = a;
  bad.salt_len = 4097;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "salt_len", kdn_kv_retrieve(m, "t", 1, &bad, &out.view, 1, &r));
  group_end();

  buf_free(&kv);
  buf_free(&out);
  buf_free(&other);
  buf_free(&loaded);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

static void test_fingerprints(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  kdn_model *other = new_model(rt, "stories260K-finetuned"); /* same shape, other weights */
  kdn_model *same = new_model(rt, FINGERPRINT);              /* registered again */
  kdn_model_spec spec = stories260k_spec("stories260K and more");
  kdn_model *cut = NULL;
  kdn_model *theta = NULL;
  uint8_t fp[4][32];
  static const uint8_t zeros[32];
  write_ref(kv.data, &kv.st, POSITIONS);

  group_begin("model fingerprints");
  CHECK_EQ(store(m, "tenant-a", kTokens, POSITIONS, &kv), POSITIONS);
  spec.fingerprint_len = strlen(FINGERPRINT); /* (pointer, length): "stories260K" */
  CHECK_OK(kdn_model_create(rt, &spec, &cut));
  spec = stories260k_spec(FINGERPRINT);
  spec.rope_theta = 500000.0f; /* the KV of another RoPE base is not this KV */
  CHECK_OK(kdn_model_create(rt, &spec, &theta));

  CHECK_EQ(lookup(other, "tenant-a", kTokens, POSITIONS), 0);
  CHECK_RETRIEVE_MISSES(other, "tenant-a", kTokens, POSITIONS);
  CHECK_EQ(lookup(theta, "tenant-a", kTokens, POSITIONS), 0);
  CHECK_EQ(lookup(same, "tenant-a", kTokens, POSITIONS), POSITIONS);
  CHECK_EQ(lookup(cut, "tenant-a", kTokens, POSITIONS), POSITIONS);
  {
    test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS);
    CHECK_EQ(retrieve(same, "tenant-a", kTokens, POSITIONS, &out), POSITIONS);
    CHECK(buf_holds_ref(&out, POSITIONS));
    buf_free(&out);
  }

  CHECK_OK(kdn_model_get_fingerprint(m, fp[0]));
  CHECK_OK(kdn_model_get_fingerprint(same, fp[1]));
  CHECK_OK(kdn_model_get_fingerprint(other, fp[2]));
  CHECK_OK(kdn_model_get_fingerprint(theta, fp[3]));
  CHECK(memcmp(fp[0], zeros, 32) != 0);
  CHECK(memcmp(fp[0], fp[1], 32) == 0);
  CHECK(memcmp(fp[0], fp[2], 32) != 0);
  CHECK(memcmp(fp[0], fp[3], 32) != 0);
  group_end();

  kdn_model_destroy(theta);
  kdn_model_destroy(cut);
  kdn_model_destroy(same);
  kdn_model_destroy(other);
  buf_free(&kv);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

/* ---- Capacity ------------------------------------------------------------ */

/* Namespace quotas in a tier (since 1.13): a tenant over its quota evicts
 * its own coldest chunks, never another's; one without a quota uses what
 * is left; stats per quota; bad quota configs refused with their reason. */
static kdn_runtime *quota_runtime(const kdn_quota *quotas, size_t n, kdn_tier_kind kind) {
  kdn_tier_config tier = KDN_TIER_CONFIG_INIT;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  tier.kind = kind;
  tier.capacity_bytes = 20 * CHUNK_HELD;
  tier.high_watermark = tier.low_watermark = 1.0f;
  tier.quotas = quotas;
  tier.num_quotas = n;
  if (kind == KDN_TIER_REMOTE) {
    tier.address = "127.0.0.1:1";
    tier.address_len = strlen(tier.address);
    tier.token = "t";
    tier.token_len = 1;
  }
  o.chunk_tokens = CHUNK;
  o.tiers = &tier;
  o.num_tiers = 1;
  if (kdn_runtime_create(&o, &rt) != KDN_OK) return NULL;
  return rt;
}

static void test_quotas(void) {
  kdn_quota quotas[2] = {KDN_QUOTA_INIT, KDN_QUOTA_INIT};
  kdn_runtime *rt;
  kdn_model *m;
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  kdn_quota_stats qs[2] = {KDN_QUOTA_STATS_INIT, KDN_QUOTA_STATS_INIT};
  size_t count = 0;
  int32_t tokens[CHUNK];
  int i;
  write_ref(kv.data, &kv.st, POSITIONS);
  quotas[0].ns = "tenant-a";
  quotas[0].ns_len = 8;
  quotas[0].bytes = 4 * CHUNK_HELD;
  rt = quota_runtime(quotas, 1, KDN_TIER_HOST);
  CHECK(rt != NULL);
  if (rt == NULL) return;
  m = new_model(rt, FINGERPRINT);

  group_begin("a tenant over its quota evicts only its own chunks");
  memcpy(tokens, kTokens, sizeof tokens);
  for (i = 0; i < 10; ++i) { /* ten one-chunk prompts each */
    tokens[1] = 1000 + i;
    CHECK_EQ(store(m, "tenant-a", tokens, CHUNK, &kv), CHUNK);
    CHECK_EQ(store(m, "tenant-b", tokens, CHUNK, &kv), CHUNK);
  }
  for (i = 0; i < 10; ++i) {
    tokens[1] = 1000 + i;
    CHECK_EQ(lookup(m, "tenant-a", tokens, CHUNK), i >= 6 ? CHUNK : 0);
    CHECK_EQ(lookup(m, "tenant-b", tokens, CHUNK), CHUNK); /* none of b's went */
  }
  CHECK_OK(kdn_runtime_get_quota_stats(rt, 0, qs, 2, &count));
  CHECK_EQ(count, 1);
  CHECK_EQ(qs[0].filled_size, sizeof qs[0]);
  CHECK_EQ(qs[0].quota_bytes, 4 * CHUNK_HELD);
  CHECK_EQ(qs[0].used_bytes, 4 * CHUNK_HELD);
  CHECK_EQ(qs[0].objects, 4);
  CHECK_EQ(qs[0].quota_evictions, 6);
  CHECK_EQ(qs[0].room_evictions, 0);
  CHECK_EQ(qs[1].filled_size, 0); /* beyond the count: untouched */
  CHECK_OK(kdn_runtime_get_quota_stats(rt, 0, NULL, 0, &count));
  CHECK_EQ(count, 1);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_quota_stats(rt, 1, qs, 2, &count));
  group_end();
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);

  group_begin("bad quotas refused with their reason");
  quotas[1] = quotas[0];
  rt = quota_runtime(quotas, 2, KDN_TIER_HOST);
  CHECK(rt == NULL && strstr(kdn_last_error_message(), "two quotas") != NULL);
  quotas[1].ns_len = 0;
  CHECK(quota_runtime(quotas, 2, KDN_TIER_HOST) == NULL && strstr(kdn_last_error_message(), "quotas[1]") != NULL);
  CHECK(quota_runtime(NULL, 1, KDN_TIER_HOST) == NULL && strstr(kdn_last_error_message(), "quotas") != NULL);
  CHECK(quota_runtime(quotas, 1, KDN_TIER_REMOTE) == NULL && strstr(kdn_last_error_message(), "kdnd") != NULL);
  quotas[0].reserved0 = 1;
  CHECK(quota_runtime(quotas, 1, KDN_TIER_HOST) == NULL && strstr(kdn_last_error_message(), "reserved0") != NULL);
  group_end();
  buf_free(&kv);
}

static void test_capacity_too_small(void) {
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  /* Smaller than one chunk: nothing fits, nothing fails. */
  kdn_runtime *rt = new_runtime(CHUNK, CHUNK_BYTES - 1);
  kdn_model *m = new_model(rt, FINGERPRINT);
  kdn_stats s;
  write_ref(kv.data, &kv.st, POSITIONS);
  group_begin("capacity below a chunk: stores nothing, fails nothing");
  CHECK_EQ(store(m, "ns", kTokens, POSITIONS, &kv), 0);
  s = get_stats(rt);
  CHECK(s.chunks == 0 && s.used_bytes == 0 && s.tokens_stored == 0 && s.evictions == 0);
  CHECK_EQ(lookup(m, "ns", kTokens, POSITIONS), 0);
  CHECK_RETRIEVE_MISSES(m, "ns", kTokens, POSITIONS);
  group_end();
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  buf_free(&kv);
}

static void test_capacity_evicts(void) {
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  /* Room for exactly one sequence: a second one evicts the first (least
   * recently used), chunk by chunk, and is served whole. */
  kdn_runtime *rt = new_runtime(CHUNK, KV_HELD);
  kdn_model *m = new_model(rt, FINGERPRINT);
  test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
  kdn_stats s;
  write_ref(kv.data, &kv.st, POSITIONS);
  group_begin("capacity of one sequence: the next evicts it");
  CHECK_EQ(store(m, "first", kTokens, POSITIONS, &kv), POSITIONS);
  CHECK_EQ(get_stats(rt).evictions, 0);
  CHECK_EQ(store(m, "second", kTokens, POSITIONS, &kv), POSITIONS);
  s = get_stats(rt);
  CHECK_EQ(s.evictions, 3);
  CHECK_EQ(s.chunks, 3);
  CHECK_EQ(s.used_bytes, KV_HELD);
  CHECK_EQ(s.tokens_stored, 2 * POSITIONS);
  CHECK_EQ(lookup(m, "first", kTokens, POSITIONS), 0);
  CHECK_EQ(retrieve(m, "second", kTokens, POSITIONS, &out), POSITIONS);
  CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
  group_end();
  buf_free(&out);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  buf_free(&kv);
}

static void test_capacity_prefix_fits(void) {
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  /* Room for two chunks of a three-chunk sequence: the store keeps the
   * longest prefix that fits and never evicts its own chunks, so what it
   * reports is what a lookup then finds. */
  kdn_runtime *rt = new_runtime(CHUNK, 2 * CHUNK_HELD);
  kdn_model *m = new_model(rt, FINGERPRINT);
  kdn_stats s;
  write_ref(kv.data, &kv.st, POSITIONS);
  group_begin("capacity of two chunks: the longest prefix that fits");
  CHECK_EQ(store(m, "ns", kTokens, POSITIONS, &kv), 2 * CHUNK);
  s = get_stats(rt);
  CHECK_EQ(s.evictions, 0);
  CHECK_EQ(s.chunks, 2);
  CHECK_EQ(s.used_bytes, 2 * CHUNK_HELD);
  CHECK(s.used_bytes <= s.capacity_bytes);
  CHECK_EQ(s.tokens_stored, 2 * CHUNK);
  CHECK_EQ(lookup(m, "ns", kTokens, POSITIONS), 2 * CHUNK);
  group_end();
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  buf_free(&kv);
}

/* ---- Lifetimes ----------------------------------------------------------- */

/* The runtime is reference-counted by its models: destroying it first is
 * allowed, and its models keep working on its store until the last goes. */
static void test_runtime_destroyed_first(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  kdn_model *m2 = new_model(rt, FINGERPRINT);
  test_buf in = buf_new(LAYOUT_CANONICAL, POSITIONS);
  test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
  uint64_t bytes = 0;
  uint8_t fp[32];
  write_ref(in.data, &in.st, POSITIONS);

  group_begin("runtime destroyed before its models");
  CHECK_EQ(store(m, "ns", kTokens, POSITIONS, &in), POSITIONS);
  kdn_runtime_destroy(rt);
  rt = NULL;
  /* The store lives on: what was stored is there, bit for bit. */
  CHECK_EQ(lookup(m, "ns", kTokens, POSITIONS), POSITIONS);
  CHECK_EQ(retrieve(m, "ns", kTokens, POSITIONS, &out), POSITIONS);
  CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
  CHECK_OK(kdn_model_get_fingerprint(m, fp));
  CHECK_OK(kdn_model_get_kv_bytes_per_token(m, &bytes));
  CHECK_EQ(bytes, BYTES_PER_TOKEN);
  /* One model gone, the other still holds the store; it stores too. */
  kdn_model_destroy(m);
  CHECK_EQ(lookup(m2, "ns", kTokens, POSITIONS), POSITIONS);
  CHECK_EQ(store(m2, "later", kTokens, 20, &in), 20);
  memset(out.data, kSentinel, out.elems * sizeof(float));
  CHECK_EQ(retrieve(m2, "later", kTokens, POSITIONS, &out), 20);
  CHECK(buf_holds_ref(&out, 20));
  kdn_model_destroy(m2); /* the last reference: the store goes now */
  group_end();
  buf_free(&in);
  buf_free(&out);
}

/* ---- Bad arguments -------------------------------------------------------- */

static void test_bad_runtime_options(void) {
  kdn_runtime *out_rt;
  kdn_runtime_options ro;

  group_begin("bad arguments: runtime options");
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(NULL, NULL));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.struct_size = 0;
  out_rt = (kdn_runtime *)&ro; /* not NULL: a failure must set it to NULL */
  CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&ro, &out_rt));
  CHECK(out_rt == NULL);
  ro.struct_size = KDN_RUNTIME_OPTIONS_SIZE_V1 - 8; /* older than any published version */
  CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro.chunk_tokens = 65537;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.host_capacity_bytes = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.worker_threads = 65; /* at most 64 */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.reserved0 = 1; /* must be 0: a later version's field, set */
  CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&ro, &out_rt));
  CHECK(out_rt == NULL);
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.reserved1 = 1; /* 1.7's padding */
  CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.load_slower_than_prefill = 2; /* 0 or 1 */
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "load_slower_than_prefill", kdn_runtime_create(&ro, &out_rt));
  CHECK(out_rt == NULL);
  {
    /* A newer caller's larger struct with a field this library does not
     * know set: refused, naming the struct (abi/newer_caller.c has more). */
    struct {
      kdn_runtime_options base;
      uint64_t field_of_a_later_version;
    } newer;
    CHECK_OK(kdn_runtime_options_init(&newer.base, sizeof newer));
    newer.field_of_a_later_version = 42;
    CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_runtime_options", kdn_runtime_create(&newer.base, &out_rt));
    CHECK(out_rt == NULL);
    newer.field_of_a_later_version = 0;
    CHECK_OK(kdn_runtime_create(&newer.base, &out_rt));
    kdn_runtime_destroy(out_rt);
  }
  {
    /* NULL options mean defaults; 64 workers is the most. */
    kdn_stats s;
    CHECK_OK(kdn_runtime_create(NULL, &out_rt));
    s = get_stats(out_rt);
    CHECK_EQ(s.capacity_bytes, (uint64_t)1 << 30);
    kdn_runtime_destroy(out_rt);
    ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
    ro.worker_threads = 64;
    CHECK_OK(kdn_runtime_create(&ro, &out_rt));
    CHECK(out_rt != NULL);
    kdn_runtime_destroy(out_rt);
  }
  group_end();
}

/* A remote tier (1.1): checked like every tier; a node that is not there
 * costs misses, never an error (tests/server has the node itself). */
static void test_remote_tier(void) {
  kdn_runtime *rt;
  kdn_runtime_options ro;
  kdn_tier_config tiers[2];
  kdn_tier_stats ts;
  static const char kAddress[] = "unix:/nonexistent/kdn-test/kdnd.sock";
  static const char kToken[] = "token-for-tenant-a-0001";

  group_begin("remote tier");
  CHECK(kdn_version_number() >= 10200);
  CHECK_OK(kdn_tier_config_init(&tiers[0], sizeof tiers[0]));
  CHECK_OK(kdn_tier_config_init(&tiers[1], sizeof tiers[1]));
  tiers[1].kind = KDN_TIER_REMOTE;
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.tiers = tiers;
  ro.num_tiers = 2;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "address", kdn_runtime_create(&ro, &rt));
  tiers[1].address = kAddress;
  tiers[1].address_len = sizeof kAddress - 1;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "token", kdn_runtime_create(&ro, &rt));
  tiers[1].token = kToken;
  tiers[1].token_len = sizeof kToken - 1;
  tiers[1].reserved1 = 1;
  CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&ro, &rt));
  tiers[1].reserved1 = 0;
  tiers[1].address = NULL;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &rt));
  tiers[1].address = kAddress;
  tiers[1].tls_ca_file_len = 5; /* a length without a file */
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "tls_ca_file", kdn_runtime_create(&ro, &rt));
  tiers[1].tls_ca_file = "/nonexistent/kdn-test/ca.pem";
  tiers[1].tls_ca_file_len = strlen(tiers[1].tls_ca_file);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &rt)); /* cannot read it */
  tiers[1].tls_ca_file = NULL;
  tiers[1].tls_ca_file_len = 0;
  tiers[1].timeout_ms = 200;
  CHECK_OK(kdn_runtime_create(&ro, &rt));
  CHECK_OK(kdn_tier_stats_init(&ts, sizeof ts));
  CHECK_OK(kdn_runtime_get_tier_stats(rt, 1, &ts));
  CHECK_EQ(ts.kind, KDN_TIER_REMOTE);
  CHECK_EQ(ts.filled_size, sizeof ts);
  CHECK_EQ(ts.remote_calls, 0);
  {
    /* A lookup of two whole chunks asks the node, which is not there: a
     * miss, counted as the node's (1.2's fields). */
    kdn_model *m = new_model(rt, FINGERPRINT);
    int32_t tokens[2 * CHUNK];
    size_t i;
    for (i = 0; i < 2 * CHUNK; ++i) tokens[i] = (int32_t)(i % 500) + 1;
    CHECK_EQ(lookup(m, "tenant-a", tokens, 2 * CHUNK), 0);
    CHECK_OK(kdn_runtime_get_tier_stats(rt, 1, &ts));
    CHECK(ts.remote_calls >= 1);
    CHECK(ts.remote_failed_calls >= 1);
    CHECK(ts.io_errors >= 1);
    CHECK_EQ(ts.write_queued_bytes, 0);
    kdn_model_destroy(m);
  }
  kdn_runtime_destroy(rt);
  group_end();
}

/* A redis tier (1.3): checked at create like a remote tier; a server that
 * is not there costs misses and counters, never an error (tests/store's
 * redis_tier_test has real servers). */
static void test_redis_tier(void) {
  kdn_runtime *rt;
  kdn_runtime_options ro;
  kdn_tier_config tiers[2];
  kdn_tier_stats ts;
  /* Port 1 on loopback: nothing listens there (connection refused at once). */
  static const char kAddress[] = "127.0.0.1:1, 127.0.0.1:2";
  static const char kUser[] = "kdn";
  static const char kPassword[] = "secret-for-redis-0001";

  group_begin("redis tier");
  CHECK(kdn_version_number() >= 10300);
  CHECK_EQ(KDN_TIER_REDIS, 4);
  CHECK_OK(kdn_tier_config_init(&tiers[0], sizeof tiers[0]));
  CHECK_OK(kdn_tier_config_init(&tiers[1], sizeof tiers[1]));
  CHECK(tiers[1].user == NULL && tiers[1].user_len == 0 && tiers[1].ttl_ms == 0);
  tiers[1].kind = KDN_TIER_REDIS;
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.tiers = tiers;
  ro.num_tiers = 2;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "address", kdn_runtime_create(&ro, &rt));
  tiers[1].address = "localhost";
  tiers[1].address_len = strlen(tiers[1].address);
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "host:port", kdn_runtime_create(&ro, &rt));
  tiers[1].address = "localhost:99999";
  tiers[1].address_len = strlen(tiers[1].address);
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "port", kdn_runtime_create(&ro, &rt));
  tiers[1].address = kAddress;
  tiers[1].address_len = sizeof kAddress - 1;
  tiers[1].user_len = 3; /* a length without a user */
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "user", kdn_runtime_create(&ro, &rt));
  tiers[1].user = kUser;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "password", kdn_runtime_create(&ro, &rt)); /* a user alone */
  tiers[1].token = kPassword;
  tiers[1].token_len = sizeof kPassword - 1;
  tiers[1].tls_server_name = "redis";
  tiers[1].tls_server_name_len = 5;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "TLS", kdn_runtime_create(&ro, &rt));
  tiers[1].tls_server_name = NULL;
  tiers[1].tls_server_name_len = 0;
  /* user and ttl_ms mean nothing on another kind: refused, not ignored. */
  tiers[0].ttl_ms = 1000;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "ttl_ms", kdn_runtime_create(&ro, &rt));
  tiers[0].ttl_ms = 0;
  tiers[1].kind = (kdn_tier_kind)5; /* a kind this library does not know */
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "kind", kdn_runtime_create(&ro, &rt));
  tiers[1].kind = KDN_TIER_REDIS;
  tiers[1].ttl_ms = 60000;
  tiers[1].timeout_ms = 200;
  tiers[1].write_through = 1;
  tiers[0].write_through = 1;
  /* No server there: the runtime is made, and misses until one answers. */
  CHECK_OK(kdn_runtime_create(&ro, &rt));
  CHECK_OK(kdn_tier_stats_init(&ts, sizeof ts));
  CHECK_OK(kdn_runtime_get_tier_stats(rt, 1, &ts));
  CHECK_EQ(ts.kind, KDN_TIER_REDIS);
  CHECK(strcmp(ts.codec, "kdn:balanced") == 0 || strncmp(ts.codec, "kdn", 3) == 0);
  CHECK_EQ(ts.used_bytes, 0);
  {
    kdn_model *m = new_model(rt, FINGERPRINT);
    int32_t tokens[2 * CHUNK];
    size_t i;
    for (i = 0; i < 2 * CHUNK; ++i) tokens[i] = (int32_t)(i % 500) + 1;
    CHECK_EQ(lookup(m, "tenant-a", tokens, 2 * CHUNK), 0);
    CHECK_OK(kdn_runtime_get_tier_stats(rt, 1, &ts));
    CHECK(ts.io_errors >= 1);
    CHECK_EQ(ts.hits, 0);
    kdn_model_destroy(m);
  }
  kdn_runtime_destroy(rt);
  /* A 1.2 caller's struct (without user and ttl_ms) names no redis tier,
   * but is read as before: its host tier gets the defaults. */
  CHECK_OK(kdn_tier_config_init(&tiers[0], sizeof tiers[0]));
  tiers[0].struct_size = (uint32_t)offsetof(kdn_tier_config, user);
  ro.tiers = tiers;
  ro.num_tiers = 1;
  CHECK_OK(kdn_runtime_create(&ro, &rt));
  kdn_runtime_destroy(rt);
  group_end();
}

static void test_bad_model_specs(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *out_m;
  kdn_model_spec spec;

  group_begin("bad arguments: model specs");
  out_m = (kdn_model *)&spec;
  spec = stories260k_spec(FINGERPRINT);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, NULL));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(NULL, &spec, &out_m));
  CHECK(out_m == NULL);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, NULL, &out_m));
  spec.struct_size = 0;
  CHECK_ERROR(KDN_ERR_VERSION, kdn_model_create(rt, &spec, &out_m));
  spec.struct_size = (uint32_t)offsetof(kdn_model_spec, fingerprint); /* older than any version */
  CHECK_ERROR(KDN_ERR_VERSION, kdn_model_create(rt, &spec, &out_m));
#define BAD_SPEC(field, value)                                                \
  do {                                                                        \
    spec = stories260k_spec(FINGERPRINT);                                     \
    spec.field = value;                                                       \
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m)); \
  } while (0)
  BAD_SPEC(num_layers, 0);
  BAD_SPEC(num_layers, 4097);
  BAD_SPEC(num_kv_heads, 0);
  BAD_SPEC(num_kv_heads, 4097);
  BAD_SPEC(head_dim, 0);
  BAD_SPEC(head_dim, 65537);
  BAD_SPEC(rotary_dim, 7);            /* odd */
  BAD_SPEC(rotary_dim, HEAD_DIM + 2); /* beyond the head */
  BAD_SPEC(head_dim, 7);              /* rotary_dim 0 means head_dim: odd */
  BAD_SPEC(dtype, (kdn_dtype)3);
  BAD_SPEC(rope_style, (kdn_rope_style)2);
  BAD_SPEC(fingerprint_len, 0);
  BAD_SPEC(rope_theta, 0.0f);
  BAD_SPEC(rope_theta, -10000.0f);
  BAD_SPEC(rope_theta, (float)NAN);
  BAD_SPEC(rope_theta, (float)INFINITY);
#undef BAD_SPEC
  spec = stories260k_spec(FINGERPRINT);
  spec.fingerprint = NULL;
  spec.fingerprint_len = 5;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  CHECK(out_m == NULL);
  {
    /* The limits themselves are fine. */
    kdn_model *ok = NULL;
    spec = stories260k_spec(FINGERPRINT);
    spec.num_layers = 4096;
    spec.num_kv_heads = 1;
    CHECK_OK(kdn_model_create(rt, &spec, &ok));
    kdn_model_destroy(ok);
  }
  group_end();
  kdn_runtime_destroy(rt);
}

static void test_bad_queries(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  uint64_t bytes = 12345;
  uint8_t fp[32];

  group_begin("bad arguments: model queries, statistics, latencies");
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_fingerprint(NULL, fp));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_fingerprint(m, NULL));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_kv_bytes_per_token(NULL, &bytes));
  CHECK_EQ(bytes, 0); /* out-parameters are neutral on failure */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_kv_bytes_per_token(m, NULL));
  {
    kdn_stats s = KDN_STATS_INIT;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_stats(NULL, &s));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_stats(rt, NULL));
    s.struct_size = 0;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_stats(rt, &s));
    s.struct_size = 4; /* not even the header */
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_stats(rt, &s));
  }
  {
    kdn_latency l = KDN_LATENCY_INIT;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(NULL, KDN_LATENCY_LOOKUP, &l));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(rt, KDN_LATENCY_LOOKUP, NULL));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(rt, (kdn_latency_kind)3, &l));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(rt, (kdn_latency_kind)-1, &l));
    l.struct_size = KDN_LATENCY_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_latency(rt, KDN_LATENCY_STORE, &l));
  }
  group_end();
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

/* The fixture of the bad-call cases: a runtime, a model, the reference KV
 * in a canonical and a file-layout buffer. */
typedef struct bad_fixture {
  kdn_runtime *rt;
  kdn_model *m;
  test_buf in;
  test_buf out;
  int32_t negative[POSITIONS];
  char long_ns[4097];
  kdn_request req;
} bad_fixture;

static const char kBadNs[] = "bad-args";
#define BAD_NS_LEN (sizeof kBadNs - 1)

static void bad_open(bad_fixture *f) {
  f->rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  f->m = new_model(f->rt, FINGERPRINT);
  f->in = buf_new(LAYOUT_CANONICAL, POSITIONS);
  f->out = buf_new(LAYOUT_FILE, POSITIONS);
  write_ref(f->in.data, &f->in.st, POSITIONS);
  memcpy(f->negative, kTokens, sizeof kTokens);
  f->negative[3] = -1;
  memset(f->long_ns, 'n', sizeof f->long_ns);
  f->req = req_of(kTokens, POSITIONS);
}

/* No failed call stored, retrieved or looked anything up; the corrected
 * calls work. */
static void bad_close(bad_fixture *f) {
  kdn_stats s = get_stats(f->rt);
  CHECK(s.stores == 0 && s.retrieves == 0 && s.lookups == 0 && s.chunks == 0);
  CHECK(buf_holds_ref(&f->out, 0)); /* no failed call wrote to it */
  CHECK_OK(kdn_kv_store(f->m, kBadNs, BAD_NS_LEN, &f->req, &f->in.view, 1, NULL));
  CHECK_EQ(retrieve(f->m, kBadNs, kTokens, POSITIONS, &f->out), POSITIONS);
  CHECK(memcmp(f->out.data, g_ref, KV_BYTES) == 0);
  buf_free(&f->in);
  buf_free(&f->out);
  kdn_model_destroy(f->m);
  kdn_runtime_destroy(f->rt);
}

static void test_bad_lookup(void) {
  bad_fixture f;
  kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
  kdn_request q;
  bad_open(&f);
  group_begin("bad arguments: kdn_kv_lookup");
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(NULL, kBadNs, BAD_NS_LEN, &f.req, 1, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, NULL, BAD_NS_LEN, &f.req, 1, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, NULL, 0, &f.req, 1, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, kBadNs, 0, &f.req, 1, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, f.long_ns, sizeof f.long_ns, &f.req, 1, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, kBadNs, BAD_NS_LEN, NULL, 1, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, kBadNs, BAD_NS_LEN, &f.req, 0, &r));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(f.m, kBadNs, BAD_NS_LEN, &f.req, 1, NULL));
  q = f.req;
  q.struct_size = 0;
  CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_lookup(f.m, kBadNs, BAD_NS_LEN, &q, 1, &r));
  r.struct_size = KDN_LOOKUP_RESULT_SIZE_V1 - 8;
  CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_lookup(f.m, kBadNs, BAD_NS_LEN, &f.req, 1, &r));
  group_end();

  group_begin("bad arguments: kdn_kv_lookup, a bad request fails alone");
  {
    /* The call is well formed: KDN_OK, and the request's own status. */
    static const struct {
      int what;
      kdn_status want;
      const char *name;
    } bad[4] = {{0, KDN_ERR_INVALID_ARGUMENT, "tokens NULL"},
                {1, KDN_ERR_INVALID_ARGUMENT, "no tokens"},
                {2, KDN_ERR_INVALID_ARGUMENT, "a negative token"},
                {3, KDN_ERR_VERSION, "reserved0 set"}};
    int i;
    for (i = 0; i < 4; ++i) {
      q = f.req;
      if (bad[i].what == 0) q.tokens = NULL;
      if (bad[i].what == 1) q.num_tokens = 0;
      if (bad[i].what == 2) q.tokens = f.negative;
      if (bad[i].what == 3) q.reserved0 = 1;
      r = (kdn_lookup_result)KDN_LOOKUP_RESULT_INIT;
      r.cached_tokens = 12345;
      check_status_at(kdn_kv_lookup(f.m, kBadNs, BAD_NS_LEN, &q, 1, &r), KDN_OK, bad[i].name, __LINE__);
      check_eq_at((unsigned long long)r.status, (unsigned long long)bad[i].want, bad[i].name, __LINE__);
      check_eq_at(r.cached_tokens, 0, bad[i].name, __LINE__);
    }
  }
  group_end();
  bad_close(&f);
}

static void test_bad_store(void) {
  bad_fixture f;
  kdn_kv_result result = KDN_KV_RESULT_INIT;
  kdn_request q;
  bad_open(&f);
  group_begin("bad arguments: kdn_kv_store");
  result.tokens = 12345;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(NULL, kBadNs, BAD_NS_LEN, &f.req, &f.in.view, 1, &result));
  CHECK_EQ(result.tokens, 0);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, NULL, BAD_NS_LEN, &f.req, &f.in.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, kBadNs, 0, &f.req, &f.in.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, f.long_ns, sizeof f.long_ns, &f.req, &f.in.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, NULL, &f.in.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, &f.req, NULL, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, &f.req, &f.in.view, 0, &result));
#define BAD_REQ(want, change)                                                                         \
  do {                                                                                                \
    q = f.req;                                                                                        \
    change;                                                                                           \
    result.tokens = 12345;                                                                                   \
    CHECK_ERROR(want, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, &q, &f.in.view, 1, &result));             \
    CHECK_EQ(result.tokens, 0);                                                                              \
  } while (0)
  BAD_REQ(KDN_ERR_INVALID_ARGUMENT, q.tokens = NULL);
  BAD_REQ(KDN_ERR_INVALID_ARGUMENT, q.num_tokens = 0);
  BAD_REQ(KDN_ERR_INVALID_ARGUMENT, q.tokens = f.negative);
  BAD_REQ(KDN_ERR_VERSION, q.reserved0 = 1); /* a later version's field, set */
  BAD_REQ(KDN_ERR_INVALID_ARGUMENT, q.hash_bytes = 65);
  BAD_REQ(KDN_ERR_VERSION, q.struct_size = 0);
  BAD_REQ(KDN_ERR_VERSION, q.struct_size = KDN_REQUEST_SIZE_V1 - 8);
#undef BAD_REQ
  group_end();
  bad_close(&f);
}

/* The same view checks apply to store and retrieve. */
static void test_bad_views(void) {
  bad_fixture f;
  kdn_kv_result result = KDN_KV_RESULT_INIT;
  kdn_kv_view v;
  bad_open(&f);
  group_begin("bad arguments: KV views (store, retrieve)");
#define CHECK_BAD_VIEW(want, view)                                                               \
  do {                                                                                           \
    CHECK_ERROR(want, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, &f.req, (view), 1, &result));        \
    CHECK_ERROR(want, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &f.req, (view), 1, &result));     \
  } while (0)
  v = f.in.view;
  v.data = NULL; /* neither data nor per-layer pointers */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.num_tokens = POSITIONS - 1; /* less room than the request */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.size_bytes = KV_BYTES - 1; /* the canonical layout reaches one byte further */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.out.view;
  v.size_bytes = KV_BYTES - 1; /* so does the strided one */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.out.view;
  v.stride_token = -TOKEN_ELEMS;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.stride_layer = -1; /* one negative stride, the rest 0: not canonical */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.out.view;
  v.stride_head = (int64_t)1 << 41;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.dtype = KDN_DTYPE_F16; /* the model is F32 */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.layout = KDN_LAYOUT_PAGED_NHD; /* one allocation is CONTIGUOUS only */
  v.block_size = 8;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.layout = (kdn_kv_layout)7;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.reserved0 = 1; /* a later version's field, set */
  CHECK_BAD_VIEW(KDN_ERR_VERSION, &v);
  v = f.in.view;
  v.memory = (kdn_memory_kind)2; /* host (0) and device (1, since 1.5) only: an unknown value */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v.memory = (kdn_memory_kind)7;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.dtype = (kdn_dtype)9;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.size_bytes = 0; /* one allocation: required */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.out.view;
  v.size_bytes = 0;
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.num_layers = 3; /* layers NULL: 0 or the model's 5 */
  CHECK_BAD_VIEW(KDN_ERR_INVALID_ARGUMENT, &v);
  v = f.in.view;
  v.struct_size = 0;
  CHECK_BAD_VIEW(KDN_ERR_VERSION, &v);
  v.struct_size = (uint32_t)offsetof(kdn_kv_view, block_stride); /* older than any version */
  CHECK_BAD_VIEW(KDN_ERR_VERSION, &v);
  {
    /* Two views that both hold every layer. */
    kdn_kv_view two[2];
    two[0] = f.in.view;
    two[1] = f.in.view;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, &f.req, two, 2, &result));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &f.req, two, 2, &result));
  }
#undef CHECK_BAD_VIEW
  group_end();
  bad_close(&f);
}

static void test_bad_retrieve(void) {
  bad_fixture f;
  kdn_kv_result result = KDN_KV_RESULT_INIT;
  kdn_request q;
  bad_open(&f);
  group_begin("bad arguments: kdn_kv_retrieve");
  result.tokens = 12345;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(NULL, kBadNs, BAD_NS_LEN, &f.req, &f.out.view, 1, &result));
  CHECK_EQ(result.tokens, 0);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, NULL, BAD_NS_LEN, &f.req, &f.out.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, 0, &f.req, &f.out.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT,
              kdn_kv_retrieve(f.m, f.long_ns, sizeof f.long_ns, &f.req, &f.out.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, NULL, &f.out.view, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &f.req, NULL, 1, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &f.req, &f.out.view, 0, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &f.req, &f.out.view, 1, NULL));
  result.struct_size = KDN_KV_RESULT_SIZE_V1 - 8; /* older than any version */
  CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &f.req, &f.out.view, 1, &result));
  CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_store(f.m, kBadNs, BAD_NS_LEN, &f.req, &f.in.view, 1, &result));
  result = (kdn_kv_result)KDN_KV_RESULT_INIT;
  q = f.req;
  q.tokens = NULL;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &q, &f.out.view, 1, &result));
  q = f.req;
  q.num_tokens = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &q, &f.out.view, 1, &result));
  q = f.req;
  q.tokens = f.negative;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &q, &f.out.view, 1, &result));
  q = f.req;
  q.struct_size = 0;
  CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_retrieve(f.m, kBadNs, BAD_NS_LEN, &q, &f.out.view, 1, &result));
  group_end();
  bad_close(&f);
}

/* ---- main ---------------------------------------------------------------- */

static const test_case kCases[] = {
  CASE(versions),
  CASE(statuses),
  CASE(init_functions),
  CASE(store_layouts),
  CASE(retrieve_layouts),
  CASE(prefixes),
  CASE(statistics),
  CASE(prefill_reports),
  CASE(prefill_models_bounded),
  CASE(tenants),
  CASE(salts),
  CASE(fingerprints),
  CASE(capacity_too_small),
  CASE(capacity_evicts),
  CASE(capacity_prefix_fits),
  CASE(quotas),
  CASE(runtime_destroyed_first),
  CASE(bad_runtime_options),
  CASE(remote_tier),
  CASE(redis_tier),
  CASE(bad_model_specs),
  CASE(bad_queries),
  CASE(bad_lookup),
  CASE(bad_store),
  CASE(bad_views),
  CASE(bad_retrieve),
};

int main(int argc, char **argv) {
  test_program p;
  p.cases = kCases;
  p.num_cases = sizeof kCases / sizeof kCases[0];
  p.setup = reference_setup;
  p.after_case = NULL;
  p.teardown = reference_free;
  return run_cases(&p, argc, argv);
}
