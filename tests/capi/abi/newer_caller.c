// SPDX-License-Identifier: Apache-2.0
/* Callers built against another version of kdn.h than the library's.
 *
 * A NEWER caller: its structs embed today's fields and append fields this
 * library does not know (`typedef struct { kdn_x v1; uint64_t future; }`,
 * struct_size = the larger size). Inputs are accepted while the unknown tail
 * is zero and refused with KDN_ERR_VERSION, naming the struct, once it is
 * not; outputs come back filled to the library's size (filled_size) with
 * the tail zeroed; arrays are read and written at the caller's stride.
 * An OLDER caller: a struct_size below the struct's first published size
 * is KDN_ERR_VERSION, and kdn_x_init(p, size) never writes past `size`.
 *
 * One case per ctest test: `capi_abi_newer_caller <case>` (see check.h). */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */

#include <kdn/kdn.h>

#include <ftw.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "../reference.h"

enum { CHUNK = 16 };
static const uint64_t kFuture = 0x1234; /* a later version's field, set */

/* ---- The newer caller's structs ------------------------------------------- */

typedef struct opts_v2 {
  kdn_runtime_options v1;
  uint64_t future;
} opts_v2;
typedef struct spec_v2 {
  kdn_model_spec v1;
  uint64_t future;
} spec_v2;
typedef struct tier_v2 {
  kdn_tier_config v1;
  uint64_t future;
} tier_v2;
typedef struct request_v2 {
  kdn_request v1;
  uint64_t future;
} request_v2;
typedef struct view_v2 {
  kdn_kv_view v1;
  uint64_t future[3];
} view_v2;
typedef struct result_v2 {
  kdn_lookup_result v1;
  uint64_t future[2];
} result_v2;
typedef struct doc_v2 {
  kdn_document_info v1;
  uint64_t future[5];
} doc_v2;
typedef struct stats_v2 {
  kdn_stats v1;
  uint64_t future[4];
} stats_v2;
typedef struct latency_v2 {
  kdn_latency v1;
  uint64_t future;
} latency_v2;
typedef struct tier_stats_v2 {
  kdn_tier_stats v1;
  uint64_t future[2];
} tier_stats_v2;
typedef struct kv_result_v2 {
  kdn_kv_result v1;
  uint64_t future;
} kv_result_v2;

static const unsigned char kFill = 0xEE;

static int all_bytes(const void *p, size_t n, unsigned char value) {
  const unsigned char *b = p;
  size_t i;
  for (i = 0; i < n; ++i) {
    if (b[i] != value) return 0;
  }
  return 1;
}

/* ---- Helpers -------------------------------------------------------------------- */

static kdn_runtime *g_rt;
static kdn_model *g_model;

static int open_runtime(void) {
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.chunk_tokens = CHUNK;
  CHECK_OK(kdn_runtime_create(&o, &g_rt));
  if (g_rt != NULL) g_model = new_model(g_rt, FINGERPRINT);
  return g_model != NULL;
}

static void after_case(void) {
  kdn_model_destroy(g_model);
  kdn_runtime_destroy(g_rt);
  g_model = NULL;
  g_rt = NULL;
}

/* The reference KV in the canonical layout, `filled` of `tokens` tokens set. */
static float *canonical(size_t tokens, size_t filled) {
  const size_t bytes = tokens * BYTES_PER_TOKEN;
  float *b = malloc(bytes);
  size_t l, k, t, e;
  if (b == NULL) exit(1);
  memset(b, 0xA5, bytes);
  for (l = 0; l < LAYERS; ++l)
    for (k = 0; k < 2; ++k)
      for (t = 0; t < filled; ++t)
        for (e = 0; e < TOKEN_ELEMS; ++e)
          b[((l * 2 + k) * tokens + t) * TOKEN_ELEMS + e] =
              ref_at((int)l, (int)k, (int)t, (int)(e / HEAD_DIM), (int)(e % HEAD_DIM));
  return b;
}

static kdn_kv_view canonical_view(float *data, size_t tokens) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.data = data;
  v.size_bytes = tokens * BYTES_PER_TOKEN;
  v.num_tokens = tokens;
  return v;
}

static uint64_t store_canonical(const char *ns, size_t n) {
  float *in = canonical(POSITIONS, POSITIONS);
  const kdn_kv_view v = canonical_view(in, POSITIONS);
  kdn_request req = KDN_REQUEST_INIT;
  kdn_kv_result stored = KDN_KV_RESULT_INIT;
  req.tokens = kTokens;
  req.num_tokens = n;
  CHECK_OK(kdn_kv_store(g_model, ns, strlen(ns), &req, &v, 1, &stored));
  free(in);
  return stored.tokens;
}

/* ---- Newer callers: inputs ------------------------------------------------------- */

static void test_runtime_options_larger(void) {
  opts_v2 o;
  kdn_runtime *rt = NULL;
  group_begin("a larger kdn_runtime_options");
  memset(&o, kFill, sizeof o);
  CHECK_OK(kdn_runtime_options_init(&o.v1, sizeof o));
  CHECK_EQ(o.v1.struct_size, sizeof o);
  CHECK_EQ(o.future, 0); /* init zeroes what it does not know */
  o.v1.chunk_tokens = CHUNK;
  o.v1.host_capacity_bytes = (uint64_t)3 << 20;
  CHECK_OK(kdn_runtime_create(&o.v1, &rt));
  if (rt != NULL) {
    /* The known fields were read. */
    kdn_stats s = KDN_STATS_INIT;
    CHECK_OK(kdn_runtime_get_stats(rt, &s));
    CHECK_EQ(s.capacity_bytes, (uint64_t)3 << 20);
    kdn_runtime_destroy(rt);
  }
  o.future = kFuture;
  rt = (kdn_runtime *)&o;
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_runtime_options", kdn_runtime_create(&o.v1, &rt));
  CHECK(rt == NULL);
  /* Any unknown byte set counts, the last one too. */
  o.future = (uint64_t)1 << 63;
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_runtime_options", kdn_runtime_create(&o.v1, &rt));
  group_end();
}

static void test_model_spec_larger(void) {
  spec_v2 s;
  kdn_runtime *rt = NULL;
  kdn_model *m = NULL;
  group_begin("a larger kdn_model_spec");
  CHECK_OK(kdn_runtime_create(NULL, &rt));
  memset(&s, kFill, sizeof s);
  CHECK_OK(kdn_model_spec_init(&s.v1, sizeof s));
  CHECK_EQ(s.future, 0);
  s.v1 = stories260k_spec(FINGERPRINT);
  s.v1.struct_size = sizeof s;
  CHECK_OK(kdn_model_create(rt, &s.v1, &m));
  if (m != NULL) {
    uint64_t bytes = 0;
    CHECK_OK(kdn_model_get_kv_bytes_per_token(m, &bytes));
    CHECK_EQ(bytes, BYTES_PER_TOKEN);
    kdn_model_destroy(m);
  }
  s.future = kFuture;
  m = (kdn_model *)&s;
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_model_spec", kdn_model_create(rt, &s.v1, &m));
  CHECK(m == NULL);
  kdn_runtime_destroy(rt);
  group_end();
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void test_tier_config_array_larger(void) {
  tier_v2 tiers[2];
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  char dir[] = "/tmp/kdn_newer_caller_XXXXXX";
  group_begin("an array of larger kdn_tier_config");
  if (mkdtemp(dir) == NULL) {
    check_at(0, "mkdtemp", __LINE__);
    group_end();
    return;
  }
  memset(tiers, kFill, sizeof tiers);
  CHECK_OK(kdn_tier_config_init(&tiers[0].v1, sizeof tiers[0]));
  CHECK_OK(kdn_tier_config_init(&tiers[1].v1, sizeof tiers[1]));
  tiers[0].v1.capacity_bytes = (uint64_t)1 << 20;
  tiers[1].v1.kind = KDN_TIER_DISK;
  tiers[1].v1.capacity_bytes = (uint64_t)5 << 20;
  tiers[1].v1.path = dir;
  tiers[1].v1.path_len = strlen(dir);
  o.tiers = &tiers[0].v1; /* element i at i * sizeof(tier_v2) */
  o.num_tiers = 2;
  CHECK_OK(kdn_runtime_create(&o, &rt));
  if (rt != NULL) {
    uint32_t count = 0;
    kdn_tier_stats host = KDN_TIER_STATS_INIT, disk = KDN_TIER_STATS_INIT;
    CHECK_OK(kdn_runtime_get_tier_count(rt, &count));
    CHECK_EQ(count, 2);
    CHECK_OK(kdn_runtime_get_tier_stats(rt, 0, &host));
    CHECK_OK(kdn_runtime_get_tier_stats(rt, 1, &disk));
    CHECK(host.kind == KDN_TIER_HOST && host.capacity_bytes == (uint64_t)1 << 20);
    CHECK(disk.kind == KDN_TIER_DISK && disk.capacity_bytes == (uint64_t)5 << 20);
    kdn_runtime_destroy(rt);
    rt = NULL;
  }
  tiers[1].future = kFuture; /* the second element's unknown field */
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_tier_config", kdn_runtime_create(&o, &rt));
  CHECK(rt == NULL);
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); /* the directory the disk tier made */
  group_end();
}

static void test_request_larger(void) {
  request_v2 r;
  float *out;
  kdn_kv_view v;
  kdn_kv_result n = KDN_KV_RESULT_INIT;
  group_begin("a larger kdn_request");
  if (!open_runtime()) {
    group_end();
    return;
  }
  CHECK_EQ(store_canonical("ns", POSITIONS), POSITIONS);
  out = canonical(POSITIONS, 0);
  v = canonical_view(out, POSITIONS);
  memset(&r, kFill, sizeof r);
  CHECK_OK(kdn_request_init(&r.v1, sizeof r));
  CHECK_EQ(r.future, 0);
  r.v1.tokens = kTokens;
  r.v1.num_tokens = POSITIONS;
  CHECK_OK(kdn_kv_retrieve(g_model, "ns", 2, &r.v1, &v, 1, &n));
  CHECK_EQ(n.tokens, POSITIONS);
  {
    float *want = canonical(POSITIONS, POSITIONS);
    CHECK(memcmp(out, want, (size_t)KV_BYTES) == 0);
    free(want);
  }
  r.future = kFuture;
  n.tokens = 12345;
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_request", kdn_kv_retrieve(g_model, "ns", 2, &r.v1, &v, 1, &n));
  CHECK_EQ(n.tokens, 0);
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_request", kdn_kv_store(g_model, "ns2", 3, &r.v1, &v, 1, &n));
  free(out);
  group_end();
}

static void test_lookup_arrays_larger(void) {
  request_v2 reqs[3];
  result_v2 res[3];
  int i;
  group_begin("arrays of larger kdn_request and kdn_lookup_result");
  if (!open_runtime()) {
    group_end();
    return;
  }
  CHECK_EQ(store_canonical("ns", POSITIONS), POSITIONS);
  memset(reqs, kFill, sizeof reqs);
  memset(res, kFill, sizeof res);
  for (i = 0; i < 3; ++i) {
    CHECK_OK(kdn_request_init(&reqs[i].v1, sizeof reqs[i]));
    CHECK_OK(kdn_lookup_result_init(&res[i].v1, sizeof res[i]));
    res[i].future[0] = 0xEEEEEEEEEEEEEEEEull; /* the library must zero what it does not know */
    res[i].future[1] = 0xEEEEEEEEEEEEEEEEull;
    reqs[i].v1.tokens = kTokens;
  }
  reqs[0].v1.num_tokens = POSITIONS; /* 48 cached */
  reqs[1].v1.num_tokens = 20;        /* 16: one whole chunk */
  reqs[2].v1.num_tokens = 0;         /* a bad request: its own status */
  CHECK_OK(kdn_kv_lookup(g_model, "ns", 2, &reqs[0].v1, 3, &res[0].v1));
  CHECK(res[0].v1.status == KDN_OK && res[0].v1.cached_tokens == POSITIONS);
  CHECK(res[1].v1.status == KDN_OK && res[1].v1.cached_tokens == CHUNK);
  CHECK(res[2].v1.status == KDN_ERR_INVALID_ARGUMENT && res[2].v1.cached_tokens == 0);
  for (i = 0; i < 3; ++i) {
    check_eq_at(res[i].v1.struct_size, sizeof res[i], "the caller's struct_size, kept", __LINE__);
    check_eq_at(res[i].v1.filled_size, sizeof(kdn_lookup_result), "filled_size: the library's size", __LINE__);
    check_at(res[i].future[0] == 0 && res[i].future[1] == 0, "the tail it does not know, zeroed", __LINE__);
  }
  CHECK(res[0].v1.num_tiers == 1 && res[0].v1.tier_tokens[0] == POSITIONS);
  /* An element's unknown field set: that request is refused alone, with
   * KDN_ERR_VERSION (a batch's bad request fails alone). */
  reqs[2].v1.num_tokens = 20;
  reqs[1].future = kFuture;
  CHECK_OK(kdn_kv_lookup(g_model, "ns", 2, &reqs[0].v1, 3, &res[0].v1));
  CHECK(res[0].v1.status == KDN_OK && res[0].v1.cached_tokens == POSITIONS);
  CHECK(res[1].v1.status == KDN_ERR_VERSION && res[1].v1.cached_tokens == 0);
  CHECK(res[2].v1.status == KDN_OK && res[2].v1.cached_tokens == CHUNK);
  /* The first one's: the array's own size is at stake; still alone. */
  reqs[1].future = 0;
  reqs[0].future = kFuture;
  CHECK_OK(kdn_kv_lookup(g_model, "ns", 2, &reqs[0].v1, 3, &res[0].v1));
  CHECK(res[0].v1.status == KDN_ERR_VERSION && res[1].v1.status == KDN_OK && res[1].v1.cached_tokens == CHUNK);
  group_end();
}

static void test_view_array_larger(void) {
  /* The reference files' own layout ([k|v][layer][token][head][dim]) as two
   * views of one allocation: layers {0, 2, 4} and {1, 3}, in an array of a
   * newer caller's larger views. */
  static const uint32_t even[3] = {0, 2, 4}, odd[2] = {1, 3};
  view_v2 views[2];
  float *out = malloc((size_t)KV_BYTES);
  kdn_request req = KDN_REQUEST_INIT;
  kdn_kv_result n = KDN_KV_RESULT_INIT;
  const int64_t layer_stride = (int64_t)POSITIONS * TOKEN_ELEMS;
  int i;
  group_begin("an array of larger kdn_kv_view");
  if (out == NULL || !open_runtime()) {
    free(out);
    group_end();
    return;
  }
  memset(views, kFill, sizeof views);
  for (i = 0; i < 2; ++i) {
    CHECK_OK(kdn_kv_view_init(&views[i].v1, sizeof views[i]));
    CHECK(views[i].future[0] == 0 && views[i].future[2] == 0);
    views[i].v1.data = i == 0 ? g_ref : g_ref + layer_stride;
    views[i].v1.layers = i == 0 ? even : odd;
    views[i].v1.num_layers = i == 0 ? 3 : 2;
    views[i].v1.num_tokens = POSITIONS;
    views[i].v1.size_bytes = KV_BYTES - (uint64_t)(i * layer_stride) * sizeof(float);
    views[i].v1.stride_layer = 2 * layer_stride;
    views[i].v1.stride_kv = (int64_t)REF_FILE_ELEMS;
    views[i].v1.stride_token = TOKEN_ELEMS;
    views[i].v1.stride_head = HEAD_DIM;
    views[i].v1.stride_dim = 1;
  }
  req.tokens = kTokens;
  req.num_tokens = POSITIONS;
  CHECK_OK(kdn_kv_store(g_model, "views", 5, &req, &views[0].v1, 2, &n));
  CHECK_EQ(n.tokens, POSITIONS);
  /* Read back into the same layout elsewhere: the files' bytes. */
  memset(out, 0xA5, (size_t)KV_BYTES);
  views[0].v1.data = out;
  views[1].v1.data = out + layer_stride;
  CHECK_OK(kdn_kv_retrieve(g_model, "views", 5, &req, &views[0].v1, 2, &n));
  CHECK_EQ(n.tokens, POSITIONS);
  CHECK(memcmp(out, g_ref, (size_t)KV_BYTES) == 0);
  /* The second view's unknown field set. */
  views[1].future[2] = kFuture;
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_kv_view", kdn_kv_retrieve(g_model, "views", 5, &req, &views[0].v1, 2, &n));
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "kdn_kv_view", kdn_kv_store(g_model, "views2", 6, &req, &views[0].v1, 2, &n));
  free(out);
  group_end();
}

/* ---- Newer callers: outputs -------------------------------------------------------- */

static void test_document_info_array_larger(void) {
  float *in = NULL;
  kdn_kv_view v;
  doc_v2 docs[3];
  size_t count = 0;
  int i;
  group_begin("arrays of larger kdn_document_info");
  if (!open_runtime()) {
    group_end();
    return;
  }
  in = canonical(POSITIONS, POSITIONS);
  v = canonical_view(in, POSITIONS);
  CHECK_OK(kdn_knowledge_put(g_model, "kb", 2, "alpha", 5, 11, NULL, 0, kTokens, POSITIONS, &v, 1));
  CHECK_OK(kdn_knowledge_put(g_model, "kb", 2, "beta", 4, 22, NULL, 0, kTokens, 20, &v, 1));
  memset(docs, kFill, sizeof docs);
  for (i = 0; i < 3; ++i) CHECK_OK(kdn_document_info_init(&docs[i].v1, sizeof docs[i]));
  for (i = 0; i < 3; ++i) memset(docs[i].future, kFill, sizeof docs[i].future);
  CHECK_OK(kdn_knowledge_list(g_model, "kb", 2, &docs[0].v1, 3, &count));
  CHECK_EQ(count, 2);
  /* Each at the caller's stride, in doc_id order. */
  CHECK(strcmp(docs[0].v1.doc_id, "alpha") == 0 && docs[0].v1.version == 11 && docs[0].v1.num_tokens == POSITIONS);
  CHECK(strcmp(docs[1].v1.doc_id, "beta") == 0 && docs[1].v1.version == 22 && docs[1].v1.num_tokens == 20);
  for (i = 0; i < 2; ++i) {
    check_eq_at(docs[i].v1.struct_size, sizeof docs[i], "the caller's struct_size, kept", __LINE__);
    check_eq_at(docs[i].v1.filled_size, sizeof(kdn_document_info), "filled_size: the library's size", __LINE__);
    check_at(all_bytes(docs[i].future, sizeof docs[i].future, 0), "the tail it does not know, zeroed", __LINE__);
  }
  {
    /* One document's information into a larger struct. */
    doc_v2 one;
    memset(&one, kFill, sizeof one);
    CHECK_OK(kdn_document_info_init(&one.v1, sizeof one));
    memset(one.future, kFill, sizeof one.future);
    CHECK_OK(kdn_knowledge_get_info(g_model, "kb", 2, "beta", 4, &one.v1));
    CHECK(one.v1.version == 22 && one.v1.filled_size == sizeof(kdn_document_info));
    CHECK(all_bytes(one.future, sizeof one.future, 0));
  }
  free(in);
  group_end();
}

static void test_stats_larger(void) {
  stats_v2 s;
  latency_v2 l;
  tier_stats_v2 t;
  group_begin("larger kdn_stats, kdn_latency, kdn_tier_stats");
  if (!open_runtime()) {
    group_end();
    return;
  }
  CHECK_EQ(store_canonical("ns", POSITIONS), POSITIONS);
  memset(&s, kFill, sizeof s);
  s.v1.struct_size = sizeof s;
  CHECK_OK(kdn_runtime_get_stats(g_rt, &s.v1));
  CHECK_EQ(s.v1.struct_size, sizeof s);
  CHECK_EQ(s.v1.filled_size, sizeof(kdn_stats));
  CHECK(s.v1.stores == 1 && s.v1.chunks == 3 && s.v1.tokens_stored == POSITIONS && s.v1.lookups == 0);
  CHECK(all_bytes(s.future, sizeof s.future, 0));
  memset(&l, kFill, sizeof l);
  l.v1.struct_size = sizeof l;
  CHECK_OK(kdn_runtime_get_latency(g_rt, KDN_LATENCY_STORE, &l.v1));
  CHECK(l.v1.filled_size == sizeof(kdn_latency) && l.v1.count == 1 && l.future == 0);
  memset(&t, kFill, sizeof t);
  t.v1.struct_size = sizeof t;
  CHECK_OK(kdn_runtime_get_tier_stats(g_rt, 0, &t.v1));
  CHECK(t.v1.filled_size == sizeof(kdn_tier_stats) && t.v1.objects == 3 && strcmp(t.v1.name, "host") == 0);
  CHECK(all_bytes(t.future, sizeof t.future, 0));
  group_end();
}

static void test_kv_result_larger(void) {
  float *in = NULL;
  kdn_kv_view v;
  kdn_request req = KDN_REQUEST_INIT;
  kdn_op *op = NULL;
  kv_result_v2 r;
  uint32_t layer;
  group_begin("a larger kdn_kv_result (store, retrieve, fetch, ops)");
  if (!open_runtime()) {
    group_end();
    return;
  }
  in = canonical(POSITIONS, POSITIONS);
  v = canonical_view(in, POSITIONS);
  req.tokens = kTokens;
  req.num_tokens = POSITIONS;
#define FRESH_RESULT()                  \
  do {                                  \
    memset(&r, kFill, sizeof r);        \
    r.v1.struct_size = sizeof r;        \
  } while (0)
#define RESULT_FILLED()                                                                     \
  check_at(r.v1.filled_size == sizeof(kdn_kv_result) && r.v1.struct_size == sizeof r &&  \
               r.future == 0,                                                               \
           "filled to the library's size, the tail zeroed", __LINE__)
  FRESH_RESULT();
  CHECK_OK(kdn_kv_store(g_model, "ns", 2, &req, &v, 1, &r.v1));
  CHECK(r.v1.state == KDN_OP_DONE && r.v1.tokens == POSITIONS);
  RESULT_FILLED();
  FRESH_RESULT();
  CHECK_OK(kdn_kv_retrieve(g_model, "ns", 2, &req, &v, 1, &r.v1));
  CHECK(r.v1.state == KDN_OP_DONE && r.v1.tokens == POSITIONS && r.v1.covered == POSITIONS && r.v1.flags == 0);
  RESULT_FILLED();
  CHECK_OK(kdn_knowledge_put(g_model, "kb", 2, "doc", 3, 1, NULL, 0, kTokens, 20, &v, 1));
  FRESH_RESULT();
  CHECK_OK(kdn_knowledge_fetch(g_model, "kb", 2, "doc", 3, NULL, 0, NULL, 0, &r.v1));
  CHECK_EQ(r.v1.tokens, 20);
  RESULT_FILLED();
  CHECK_OK(kdn_kv_save_async(g_model, "ops", 3, &req, &v, 1, &op));
  if (op != NULL) {
    for (layer = 0; layer < LAYERS; ++layer) CHECK_OK(kdn_op_layer_ready(op, layer));
    CHECK_OK(kdn_op_wait(op, -1));
    FRESH_RESULT();
    CHECK_OK(kdn_op_get_result(op, &r.v1));
    CHECK(r.v1.state == KDN_OP_DONE && r.v1.status == KDN_OK && r.v1.tokens == POSITIONS);
    RESULT_FILLED();
    kdn_op_destroy(op);
  }
#undef FRESH_RESULT
#undef RESULT_FILLED
  free(in);
  group_end();
}

/* ---- Older callers ------------------------------------------------------------------- */

static void test_older_struct_sizes(void) {
  /* A struct_size below the first published size: KDN_ERR_VERSION, and
   * nothing written past it. */
  group_begin("struct sizes below the first published ones");
  if (!open_runtime()) {
    group_end();
    return;
  }
  {
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    kdn_runtime *rt = NULL;
    o.struct_size = KDN_RUNTIME_OPTIONS_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&o, &rt));
  }
  {
    kdn_model_spec s = stories260k_spec(FINGERPRINT);
    kdn_model *m = NULL;
    s.struct_size = KDN_MODEL_SPEC_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_model_create(g_rt, &s, &m));
  }
  {
    kdn_tier_config t = KDN_TIER_CONFIG_INIT;
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    kdn_runtime *rt = NULL;
    t.struct_size = KDN_TIER_CONFIG_SIZE_V1 - 8;
    o.tiers = &t;
    o.num_tiers = 1;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_create(&o, &rt));
  }
  {
    float *data = canonical(POSITIONS, POSITIONS);
    kdn_kv_view v = canonical_view(data, POSITIONS);
    kdn_request r = KDN_REQUEST_INIT;
    kdn_kv_result n = KDN_KV_RESULT_INIT;
    r.tokens = kTokens;
    r.num_tokens = POSITIONS;
    r.struct_size = KDN_REQUEST_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_store(g_model, "ns", 2, &r, &v, 1, &n));
    r.struct_size = sizeof r;
    v.struct_size = KDN_KV_VIEW_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_store(g_model, "ns", 2, &r, &v, 1, &n));
    free(data);
  }
  {
    kdn_stats s;
    kdn_latency l;
    kdn_tier_stats t;
    memset(&s, kFill, sizeof s);
    s.struct_size = KDN_STATS_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_stats(g_rt, &s));
    CHECK_EQ(s.edits, 0xEEEEEEEEEEEEEEEEull); /* past its struct_size: untouched */
    memset(&l, kFill, sizeof l);
    l.struct_size = KDN_LATENCY_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_latency(g_rt, KDN_LATENCY_LOAD, &l));
    CHECK(all_bytes(&l.max_us, sizeof l.max_us, kFill));
    memset(&t, kFill, sizeof t);
    t.struct_size = KDN_TIER_STATS_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_runtime_get_tier_stats(g_rt, 0, &t));
    CHECK_EQ(t.decode_failures, 0xEEEEEEEEEEEEEEEEull);
  }
  {
    kdn_request r = KDN_REQUEST_INIT;
    kdn_lookup_result res;
    kdn_document_info d[2];
    size_t count = 0;
    r.tokens = kTokens;
    r.num_tokens = POSITIONS;
    memset(&res, kFill, sizeof res);
    res.struct_size = KDN_LOOKUP_RESULT_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_lookup(g_model, "ns", 2, &r, 1, &res));
    CHECK_EQ(res.tier_tokens[KDN_MAX_TIERS - 1], 0xEEEEEEEEEEEEEEEEull);
    memset(d, kFill, sizeof d);
    d[0].struct_size = KDN_DOCUMENT_INFO_SIZE_V1 - 8;
    CHECK(store_canonical("ns", POSITIONS) == POSITIONS);
    {
      float *data = canonical(POSITIONS, POSITIONS);
      const kdn_kv_view v = canonical_view(data, POSITIONS);
      CHECK_OK(kdn_knowledge_put(g_model, "kb", 2, "doc", 3, 1, NULL, 0, kTokens, POSITIONS, &v, 1));
      free(data);
    }
    CHECK_ERROR(KDN_ERR_VERSION, kdn_knowledge_list(g_model, "kb", 2, d, 2, &count));
    CHECK(all_bytes(&d[1], sizeof d[1], kFill));
    CHECK_ERROR(KDN_ERR_VERSION, kdn_knowledge_get_info(g_model, "kb", 2, "doc", 3, d));
  }
  {
    float *data = canonical(POSITIONS, POSITIONS);
    const kdn_kv_view v = canonical_view(data, POSITIONS);
    kdn_request r = KDN_REQUEST_INIT;
    kdn_op *op = NULL;
    kdn_kv_result res;
    r.tokens = kTokens;
    r.num_tokens = POSITIONS;
    CHECK_OK(kdn_kv_load_async(g_model, "ns", 2, &r, &v, 1, &op));
    if (op != NULL) {
      CHECK_OK(kdn_op_wait(op, -1));
      memset(&res, kFill, sizeof res);
      res.struct_size = KDN_KV_RESULT_SIZE_V1 - 8;
      CHECK_ERROR(KDN_ERR_VERSION, kdn_op_get_result(op, &res));
      CHECK(res.flags == 0xEEEEEEEEu && res.reserved0 == 0xEEEEEEEEu);
      kdn_op_destroy(op);
    }
    /* The synchronous calls' result too. */
    memset(&res, kFill, sizeof res);
    res.struct_size = KDN_KV_RESULT_SIZE_V1 - 8;
    CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_retrieve(g_model, "ns", 2, &r, &v, 1, &res));
    CHECK_ERROR(KDN_ERR_VERSION, kdn_kv_store(g_model, "ns-old", 6, &r, &v, 1, &res));
    CHECK_ERROR(KDN_ERR_VERSION, kdn_knowledge_fetch(g_model, "kb", 2, "doc", 3, NULL, 0, NULL, 0, &res));
    CHECK(res.flags == 0xEEEEEEEEu && res.reserved0 == 0xEEEEEEEEu);
    free(data);
  }
  group_end();
}

/* kdn_x_init(p, size): below the first published size, KDN_ERR_VERSION
 * and nothing written; from it on, never a byte past `size`, struct_size =
 * size, the known fields as the macro has them, and a known-size-to-size
 * tail (a newer caller's fields) zeroed. */
typedef union init_buffer {
  unsigned char bytes[1024];
  uint64_t align_u64;
  double align_double;
  void *align_pointer;
} init_buffer;

typedef kdn_status (*any_init_fn)(void *, size_t);

static void check_init_at(const char *name, any_init_fn init, size_t size_v1, size_t known, const void *macro,
                          int line) {
  static init_buffer buf;
  const size_t older[4] = {0, 4, size_v1 - 8, size_v1 - 1};
  const size_t sizes[4] = {size_v1, known, known + 8, known + 72};
  size_t i;
  for (i = 0; i < 4; ++i) {
    memset(buf.bytes, kFill, sizeof buf.bytes);
    check_eq_at((unsigned long long)init(buf.bytes, older[i]), (unsigned long long)KDN_ERR_VERSION, name, line);
    check_at(all_bytes(buf.bytes, sizeof buf.bytes, kFill), "an init below the first size writes nothing", line);
  }
  check_eq_at((unsigned long long)init(NULL, known), (unsigned long long)KDN_ERR_INVALID_ARGUMENT, name, line);
  for (i = 0; i < 4; ++i) {
    const size_t size = sizes[i];
    uint32_t struct_size = 0;
    memset(buf.bytes, kFill, sizeof buf.bytes);
    check_eq_at((unsigned long long)init(buf.bytes, size), KDN_OK, name, line);
    memcpy(&struct_size, buf.bytes, sizeof struct_size);
    check_eq_at(struct_size, size, "init sets struct_size to the caller's size", line);
    check_at(all_bytes(buf.bytes + size, sizeof buf.bytes - size, kFill), "init writes nothing past the caller's size",
             line);
    check_at(memcmp(buf.bytes + 4, (const unsigned char *)macro + 4, (size < known ? size : known) - 4) == 0,
             "init writes the macro's defaults", line);
    if (size > known) {
      check_at(all_bytes(buf.bytes + known, size - known, 0), "init zeroes a newer caller's tail", line);
    }
  }
}

/* Each init function behind one signature (called through its own type). */
#define INIT_AS_VOID(type, fn) \
  static kdn_status fn##_void(void *p, size_t n) { return fn((type *)p, n); }
INIT_AS_VOID(kdn_tier_config, kdn_tier_config_init)
INIT_AS_VOID(kdn_runtime_options, kdn_runtime_options_init)
INIT_AS_VOID(kdn_model_spec, kdn_model_spec_init)
INIT_AS_VOID(kdn_request, kdn_request_init)
INIT_AS_VOID(kdn_kv_view, kdn_kv_view_init)
INIT_AS_VOID(kdn_lookup_result, kdn_lookup_result_init)
INIT_AS_VOID(kdn_kv_result, kdn_kv_result_init)
INIT_AS_VOID(kdn_document_info, kdn_document_info_init)
INIT_AS_VOID(kdn_stats, kdn_stats_init)
INIT_AS_VOID(kdn_latency, kdn_latency_init)
INIT_AS_VOID(kdn_tier_stats, kdn_tier_stats_init)

#define CHECK_INIT(type, MACRO, fn, size_v1)                                                  \
  do {                                                                                        \
    const type macro_value = MACRO;                                                           \
    check_init_at(#fn, fn##_void, (size_v1), sizeof(type), &macro_value, __LINE__);           \
  } while (0)

static void test_init_sizes(void) {
  group_begin("kdn_x_init with older, exact and newer sizes");
  CHECK_INIT(kdn_tier_config, KDN_TIER_CONFIG_INIT, kdn_tier_config_init, KDN_TIER_CONFIG_SIZE_V1);
  CHECK_INIT(kdn_runtime_options, KDN_RUNTIME_OPTIONS_INIT, kdn_runtime_options_init, KDN_RUNTIME_OPTIONS_SIZE_V1);
  CHECK_INIT(kdn_model_spec, KDN_MODEL_SPEC_INIT, kdn_model_spec_init, KDN_MODEL_SPEC_SIZE_V1);
  CHECK_INIT(kdn_request, KDN_REQUEST_INIT, kdn_request_init, KDN_REQUEST_SIZE_V1);
  CHECK_INIT(kdn_kv_view, KDN_KV_VIEW_INIT, kdn_kv_view_init, KDN_KV_VIEW_SIZE_V1);
  CHECK_INIT(kdn_lookup_result, KDN_LOOKUP_RESULT_INIT, kdn_lookup_result_init, KDN_LOOKUP_RESULT_SIZE_V1);
  CHECK_INIT(kdn_kv_result, KDN_KV_RESULT_INIT, kdn_kv_result_init, KDN_KV_RESULT_SIZE_V1);
  CHECK_INIT(kdn_document_info, KDN_DOCUMENT_INFO_INIT, kdn_document_info_init, KDN_DOCUMENT_INFO_SIZE_V1);
  CHECK_INIT(kdn_stats, KDN_STATS_INIT, kdn_stats_init, KDN_STATS_SIZE_V1);
  CHECK_INIT(kdn_latency, KDN_LATENCY_INIT, kdn_latency_init, KDN_LATENCY_SIZE_V1);
  CHECK_INIT(kdn_tier_stats, KDN_TIER_STATS_INIT, kdn_tier_stats_init, KDN_TIER_STATS_SIZE_V1);
  group_end();
}

/* ---- main ------------------------------------------------------------------------------- */

static const test_case kCases[] = {
  CASE(runtime_options_larger),
  CASE(model_spec_larger),
  CASE(tier_config_array_larger),
  CASE(request_larger),
  CASE(lookup_arrays_larger),
  CASE(view_array_larger),
  CASE(document_info_array_larger),
  CASE(stats_larger),
  CASE(kv_result_larger),
  CASE(older_struct_sizes),
  CASE(init_sizes),
};

int main(int argc, char **argv) {
  test_program p;
  p.cases = kCases;
  p.num_cases = sizeof kCases / sizeof kCases[0];
  p.setup = reference_setup;
  p.after_case = after_case;
  p.teardown = reference_free;
  return run_cases(&p, argc, argv);
}
