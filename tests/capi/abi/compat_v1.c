// SPDX-License-Identifier: Apache-2.0
/* A caller built against kdn 1.0: compiled against the frozen kdn_v1.h only
 * (no other kdn header is on its include path), linked against today's
 * libkdn.so. It runs the stable API end to end with the reference model's
 * real KV and checks every byte, so a later 1.x library that breaks a 1.0
 * caller fails here. Like kdn_v1.h it stands alone (its own checks and
 * reference loader: the shared test helpers follow today's header) and
 * should not need to change.
 *
 * `compat_v1 <case>` runs one case, no argument runs all, `--list` prints
 * them, `--check-list names...` compares them with the registered tests.
 * Exit status: 0 passed, 1 a check failed, 2 an unknown case, 77 the
 * reference model is missing (a failure when KDN_REQUIRE_MODELS=1). */
#include "kdn_v1.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if KDN_VERSION_MAJOR != 1 || KDN_VERSION_MINOR != 0 || defined(KDN_EXPERIMENTAL)
#error "compat_v1.c is built against the frozen 1.0 header alone"
#endif

/* ---- Checks ----------------------------------------------------------------- */

static int g_passed, g_failed;

static void check_at(int ok, const char *what, int line) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    printf("  FAILED (line %d): %s (last message: \"%s\")\n", line, what, kdn_last_error_message());
  }
}

#define CHECK(cond) check_at((cond) != 0, #cond, __LINE__)
#define CHECK_OK(call) check_at((call) == KDN_OK, #call " == KDN_OK", __LINE__)
#define CHECK_STATUS(want, call) check_at((call) == (want), #call " == " #want, __LINE__)
#define CHECK_EQ(got, want) check_at((unsigned long long)(got) == (unsigned long long)(want), #got " == " #want, __LINE__)

/* ---- The reference KV: stories260K, 5 layers, 4 KV heads of 8 dims, 48 positions -- */

enum { LAYERS = 5, HEADS = 4, HEAD_DIM = 8, POSITIONS = 48, CHUNK = 16, TOKEN_ELEMS = HEADS * HEAD_DIM };
#define FILE_ELEMS ((size_t)LAYERS * POSITIONS * TOKEN_ELEMS)
#define KV_BYTES ((size_t)2 * FILE_ELEMS * sizeof(float))
#define BYTES_PER_TOKEN ((uint64_t)LAYERS * 2 * TOKEN_ELEMS * sizeof(float))
#ifndef KDN_MODELS_DIR
#define KDN_MODELS_DIR "models"
#endif

static const int32_t kTokens[POSITIONS] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                           421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
                                           292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358,
                                           394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266};

/* The reference files back to back: [k|v][layer][token][head][dim]. */
static float *g_ref;

static int load_reference(void) {
  const char *env = getenv("KDN_MODELS");
  const char *dir = env != NULL && env[0] != '\0' ? env : KDN_MODELS_DIR;
  static const char *const suffix[2] = {"k", "v"};
  char path[4096];
  int i;
  g_ref = malloc(KV_BYTES);
  if (g_ref == NULL) return -1;
  for (i = 0; i < 2; ++i) {
    FILE *f;
    char extra;
    int ok;
    snprintf(path, sizeof path, "%s/reference/kv260k.%s.f32", dir, suffix[i]);
    f = fopen(path, "rb");
    if (f == NULL) {
      printf("reference model missing: cannot open %s (set KDN_MODELS)\n", path);
      return 0;
    }
    ok = fread(g_ref + i * FILE_ELEMS, sizeof(float), FILE_ELEMS, f) == FILE_ELEMS && fread(&extra, 1, 1, f) == 0;
    fclose(f);
    if (!ok) {
      printf("%s is not float32 KV of the expected size\n", path);
      return -1;
    }
  }
  return 1;
}

/* The reference KV in the canonical layout [layer][k|v][token][head][dim]
 * for `tokens` tokens, first `filled` of them set, the rest 0xA5 bytes. */
static float *canonical(size_t tokens, size_t filled) {
  float *b = malloc(tokens * LAYERS * 2 * TOKEN_ELEMS * sizeof(float));
  size_t l, k, t;
  if (b == NULL) exit(1);
  memset(b, 0xA5, tokens * LAYERS * 2 * TOKEN_ELEMS * sizeof(float));
  for (l = 0; l < LAYERS; ++l)
    for (k = 0; k < 2; ++k)
      for (t = 0; t < filled; ++t)
        memcpy(b + ((l * 2 + k) * tokens + t) * TOKEN_ELEMS, g_ref + k * FILE_ELEMS + (l * POSITIONS + t) * TOKEN_ELEMS,
               TOKEN_ELEMS * sizeof(float));
  return b;
}

static kdn_kv_view canonical_view(float *data, size_t tokens) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.data = data;
  v.size_bytes = tokens * BYTES_PER_TOKEN;
  v.num_tokens = tokens;
  return v;
}

/* The reference files' own layout as a strided view: [k|v][layer][token]... */
static kdn_kv_view file_view(float *data) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.data = data;
  v.size_bytes = KV_BYTES;
  v.num_tokens = POSITIONS;
  v.stride_dim = 1;
  v.stride_head = HEAD_DIM;
  v.stride_token = TOKEN_ELEMS;
  v.stride_layer = (int64_t)POSITIONS * TOKEN_ELEMS;
  v.stride_kv = (int64_t)FILE_ELEMS;
  return v;
}

static kdn_request request(size_t n) {
  kdn_request r = KDN_REQUEST_INIT;
  r.tokens = kTokens;
  r.num_tokens = n;
  return r;
}

static kdn_runtime *g_rt;
static kdn_model *g_model;

static int open_runtime(void) {
  kdn_runtime_options o;
  kdn_model_spec spec;
  CHECK_OK(kdn_runtime_options_init(&o, sizeof o));
  CHECK_OK(kdn_model_spec_init(&spec, sizeof spec));
  o.chunk_tokens = CHUNK;
  spec.num_layers = LAYERS;
  spec.num_kv_heads = HEADS;
  spec.head_dim = HEAD_DIM;
  spec.fingerprint = "stories260K";
  spec.fingerprint_len = 11;
  CHECK_OK(kdn_runtime_create(&o, &g_rt));
  if (g_rt != NULL) CHECK_OK(kdn_model_create(g_rt, &spec, &g_model));
  return g_model != NULL;
}

static void close_runtime(void) {
  kdn_model_destroy(g_model);
  kdn_runtime_destroy(g_rt);
  g_model = NULL;
  g_rt = NULL;
}

/* ---- Cases -------------------------------------------------------------------- */

static void test_versions(void) {
  const uint32_t v = kdn_version_number();
  CHECK(v >= KDN_VERSION_NUMBER && v < 20000); /* 1.x, no older than 1.0 */
  CHECK(kdn_version() != NULL && kdn_version()[0] == '1' && kdn_version()[1] == '.');
  CHECK(strcmp(kdn_status_string(KDN_ERR_VERSION), "KDN_ERR_VERSION") == 0);
  CHECK(strcmp(kdn_status_string(KDN_ERR_BUFFER_TOO_SMALL), "KDN_ERR_BUFFER_TOO_SMALL") == 0);
  CHECK(kdn_status_string(-1000) != NULL);
  CHECK(kdn_last_error_message() != NULL);
}

static void test_init_functions(void) {
  /* The library writes no more than a 1.0 caller's sizes, and the macros'
   * values. */
  unsigned char buf[512];
  kdn_stats s = KDN_STATS_INIT;
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  memset(buf, 0x3C, sizeof buf);
  CHECK_OK(kdn_kv_view_init((kdn_kv_view *)(void *)buf, sizeof(kdn_kv_view)));
  CHECK(memcmp(buf, &v, sizeof v) == 0);
  CHECK(buf[sizeof v] == 0x3C && buf[sizeof buf - 1] == 0x3C);
  memset(buf, 0x3C, sizeof buf);
  CHECK_OK(kdn_stats_init((kdn_stats *)(void *)buf, sizeof(kdn_stats)));
  CHECK(memcmp(buf, &s, sizeof s) == 0);
  CHECK(buf[sizeof s] == 0x3C);
}

static void test_store_lookup_retrieve(void) {
  float *in, *out;
  kdn_kv_view vin, vout;
  kdn_request req = request(POSITIONS);
  kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
  kdn_kv_result n = KDN_KV_RESULT_INIT;
  if (!open_runtime()) return;
  in = canonical(POSITIONS, POSITIONS);
  out = malloc(KV_BYTES);
  if (out == NULL) exit(1);
  memset(out, 0xA5, KV_BYTES);
  vin = canonical_view(in, POSITIONS);
  vout = file_view(out);
  /* A miss: OK, 0 tokens, nothing written. */
  n.tokens = 12345;
  CHECK_OK(kdn_kv_retrieve(g_model, "compat", 6, &req, &vout, 1, &n));
  CHECK(n.tokens == 0 && n.covered == 0 && n.state == KDN_OP_DONE && n.filled_size == sizeof n);
  CHECK_OK(kdn_kv_lookup(g_model, "compat", 6, &req, 1, &r));
  CHECK(r.status == KDN_OK && r.cached_tokens == 0 && r.filled_size == sizeof r);
  CHECK_OK(kdn_kv_store(g_model, "compat", 6, &req, &vin, 1, &n));
  CHECK_EQ(n.tokens, POSITIONS);
  CHECK_OK(kdn_kv_lookup(g_model, "compat", 6, &req, 1, &r));
  CHECK(r.status == KDN_OK && r.cached_tokens == POSITIONS && r.num_tiers == 1 && r.tier_tokens[0] == POSITIONS);
  /* Back in the files' own layout: the files' bytes, exactly. */
  CHECK_OK(kdn_kv_retrieve(g_model, "compat", 6, &req, &vout, 1, &n));
  CHECK(n.tokens == POSITIONS && n.covered == POSITIONS && n.flags == 0);
  CHECK(memcmp(out, g_ref, KV_BYTES) == 0);
  /* A prefix of 20: the first whole chunk only. */
  req.num_tokens = 20;
  memset(out, 0xA5, KV_BYTES);
  CHECK_OK(kdn_kv_retrieve(g_model, "compat", 6, &req, &vout, 1, &n));
  CHECK_EQ(n.tokens, CHUNK);
  {
    float *want = canonical(POSITIONS, CHUNK);
    float *got = canonical(POSITIONS, 0);
    kdn_kv_view vgot = canonical_view(got, POSITIONS);
    CHECK_OK(kdn_kv_retrieve(g_model, "compat", 6, &req, &vgot, 1, &n));
    CHECK(memcmp(got, want, KV_BYTES) == 0);
    free(want);
    free(got);
  }
  free(in);
  free(out);
  close_runtime();
}

static void test_async_ops(void) {
  /* A save from llama.cpp-like per-layer buffers, made final layer by
   * layer, and a load back into others. */
  float *k[LAYERS], *v[LAYERS], *k2[LAYERS], *v2[LAYERS];
  void *kp[LAYERS], *vp[LAYERS], *kp2[LAYERS], *vp2[LAYERS];
  kdn_kv_view view = KDN_KV_VIEW_INIT, view2;
  kdn_request req = request(POSITIONS);
  kdn_op *op = NULL;
  kdn_kv_result res = KDN_KV_RESULT_INIT;
  const size_t layer_bytes = (size_t)POSITIONS * TOKEN_ELEMS * sizeof(float);
  uint32_t l;
  if (!open_runtime()) return;
  for (l = 0; l < LAYERS; ++l) {
    k[l] = g_ref + (size_t)l * POSITIONS * TOKEN_ELEMS; /* the files: [layer][token][head][dim] per K and V */
    v[l] = g_ref + FILE_ELEMS + (size_t)l * POSITIONS * TOKEN_ELEMS;
    k2[l] = malloc(layer_bytes);
    v2[l] = malloc(layer_bytes);
    if (k2[l] == NULL || v2[l] == NULL) exit(1);
    memset(k2[l], 0xA5, layer_bytes);
    memset(v2[l], 0xA5, layer_bytes);
    kp[l] = k[l], vp[l] = v[l], kp2[l] = k2[l], vp2[l] = v2[l];
  }
  view.num_layers = LAYERS;
  view.k_layers = kp;
  view.v_layers = vp;
  view.stride_token = TOKEN_ELEMS;
  view.stride_head = HEAD_DIM;
  view.stride_dim = 1;
  view.layer_elements = (uint64_t)POSITIONS * TOKEN_ELEMS;
  view2 = view;
  view2.k_layers = kp2;
  view2.v_layers = vp2;
  CHECK_OK(kdn_kv_save_async(g_model, "ops", 3, &req, &view, 1, &op));
  if (op != NULL) {
    for (l = 0; l < LAYERS; ++l) CHECK_OK(kdn_op_layer_ready(op, l));
    CHECK_OK(kdn_op_wait(op, -1));
    CHECK_OK(kdn_op_get_result(op, &res));
    CHECK(res.state == KDN_OP_DONE && res.tokens == POSITIONS && res.filled_size == sizeof res);
    kdn_op_destroy(op);
    op = NULL;
  }
  CHECK_OK(kdn_kv_load_async(g_model, "ops", 3, &req, &view2, 1, &op));
  if (op != NULL) {
    size_t failed = 12345;
    for (l = 0; l < LAYERS; ++l) CHECK_OK(kdn_op_wait_layer(op, l, -1));
    CHECK_OK(kdn_op_wait(op, -1));
    CHECK_OK(kdn_op_get_result(op, &res));
    CHECK(res.state == KDN_OP_DONE && res.status == KDN_OK && res.tokens == POSITIONS && res.covered == POSITIONS);
    CHECK_OK(kdn_op_get_failed_ranges(op, NULL, 0, &failed));
    CHECK_EQ(failed, 0);
    kdn_op_destroy(op);
  }
  for (l = 0; l < LAYERS; ++l) {
    CHECK(memcmp(k2[l], k[l], layer_bytes) == 0 && memcmp(v2[l], v[l], layer_bytes) == 0);
    free(k2[l]);
    free(v2[l]);
  }
  close_runtime();
}

static void test_statistics(void) {
  float *in;
  kdn_kv_view vin;
  kdn_request req = request(POSITIONS);
  kdn_stats s = KDN_STATS_INIT;
  kdn_latency lat = KDN_LATENCY_INIT;
  kdn_tier_stats ts = KDN_TIER_STATS_INIT;
  kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
  uint32_t count = 0;
  kdn_kv_result n = KDN_KV_RESULT_INIT;
  if (!open_runtime()) return;
  in = canonical(POSITIONS, POSITIONS);
  vin = canonical_view(in, POSITIONS);
  CHECK_OK(kdn_kv_store(g_model, "stats", 5, &req, &vin, 1, &n));
  CHECK_OK(kdn_kv_lookup(g_model, "stats", 5, &req, 1, &r));
  CHECK_OK(kdn_kv_retrieve(g_model, "stats", 5, &req, &vin, 1, &n));
  CHECK_OK(kdn_runtime_get_stats(g_rt, &s));
  /* A 1.0 caller's struct: filled to its size, no further. */
  CHECK_EQ(s.struct_size, sizeof s);
  CHECK_EQ(s.filled_size, sizeof s);
  CHECK(s.lookups == 1 && s.retrieves == 1 && s.stores == 1 && s.hits == 3 && s.chunks == 3);
  CHECK(s.tokens_stored == POSITIONS && s.tokens_served == POSITIONS && s.bytes_served == POSITIONS * BYTES_PER_TOKEN);
  CHECK_OK(kdn_runtime_get_latency(g_rt, KDN_LATENCY_STORE, &lat));
  CHECK(lat.filled_size == sizeof lat && lat.count == 1 && lat.max_us > 0.0);
  CHECK_OK(kdn_runtime_get_tier_count(g_rt, &count));
  CHECK_EQ(count, 1);
  CHECK_OK(kdn_runtime_get_tier_stats(g_rt, 0, &ts));
  CHECK(ts.filled_size == sizeof ts && ts.kind == KDN_TIER_HOST && strcmp(ts.name, "host") == 0 && ts.objects == 3);
  free(in);
  close_runtime();
}

static void test_knowledge(void) {
  float *in, *out;
  kdn_kv_view vin, vout;
  kdn_document_info docs[2], info = KDN_DOCUMENT_INFO_INIT;
  int32_t tokens[POSITIONS];
  size_t count = 0;
  kdn_kv_result n = KDN_KV_RESULT_INIT;
  if (!open_runtime()) return;
  in = canonical(POSITIONS, POSITIONS);
  out = canonical(POSITIONS, 0);
  vin = canonical_view(in, POSITIONS);
  vout = canonical_view(out, POSITIONS);
  CHECK_OK(kdn_knowledge_put(g_model, "kb", 2, "doc", 3, 3, "m", 1, kTokens, POSITIONS, &vin, 1));
  docs[0] = (kdn_document_info)KDN_DOCUMENT_INFO_INIT;
  docs[1] = (kdn_document_info)KDN_DOCUMENT_INFO_INIT;
  CHECK_OK(kdn_knowledge_list(g_model, "kb", 2, docs, 2, &count));
  CHECK_EQ(count, 1);
  CHECK(docs[0].filled_size == sizeof docs[0] && strcmp(docs[0].doc_id, "doc") == 0 && docs[0].version == 3 &&
        docs[0].num_tokens == POSITIONS && docs[0].chunks == 3);
  CHECK_OK(kdn_knowledge_get_info(g_model, "kb", 2, "doc", 3, &info));
  CHECK(info.version == 3 && info.expires_in_ms == -1);
  /* Too small: the length, nothing written. */
  CHECK_STATUS(KDN_ERR_BUFFER_TOO_SMALL, kdn_knowledge_fetch(g_model, "kb", 2, "doc", 3, NULL, 0, tokens, 8, &n));
  CHECK_EQ(n.tokens, POSITIONS);
  CHECK_OK(kdn_knowledge_fetch(g_model, "kb", 2, "doc", 3, &vout, 1, tokens, POSITIONS, &n));
  CHECK_EQ(n.tokens, POSITIONS);
  CHECK(memcmp(tokens, kTokens, sizeof tokens) == 0);
  CHECK(memcmp(out, in, KV_BYTES) == 0);
  CHECK_OK(kdn_knowledge_pin(g_model, "kb", 2, "doc", 3, 0));
  CHECK_OK(kdn_knowledge_unpin(g_model, "kb", 2, "doc", 3));
  CHECK_OK(kdn_knowledge_expire(g_model, "kb", 2, "doc", 3, 60000));
  CHECK_OK(kdn_knowledge_delete(g_model, "kb", 2, "doc", 3));
  CHECK_STATUS(KDN_ERR_NOT_FOUND, kdn_knowledge_get_info(g_model, "kb", 2, "doc", 3, &info));
  free(in);
  free(out);
  close_runtime();
}

static void test_errors(void) {
  kdn_runtime *rt = (kdn_runtime *)&g_passed;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  kdn_stats s = KDN_STATS_INIT;
  CHECK_STATUS(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(NULL, NULL));
  CHECK(kdn_last_error_message()[0] != '\0');
  o.chunk_tokens = 0;
  CHECK_STATUS(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&o, &rt));
  CHECK(rt == NULL);
  o = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  o.struct_size = 8;
  CHECK_STATUS(KDN_ERR_VERSION, kdn_runtime_create(&o, &rt));
  CHECK(strstr(kdn_last_error_message(), "kdn_runtime_options") != NULL);
  CHECK_STATUS(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_stats(NULL, &s));
  CHECK_OK(kdn_runtime_create(NULL, &rt));
  CHECK(strcmp(kdn_last_error_message(), "") == 0);
  kdn_runtime_destroy(rt);
}

/* One line each: CMake registers a test per CASE line. */
typedef struct test_case {
  const char *name;
  void (*run)(void);
} test_case;
#define CASE(name) { #name, test_##name }

static const test_case kCases[] = {
  CASE(versions),
  CASE(init_functions),
  CASE(store_lookup_retrieve),
  CASE(async_ops),
  CASE(statistics),
  CASE(knowledge),
  CASE(errors),
};
#define NUM_CASES (sizeof kCases / sizeof kCases[0])

int main(int argc, char **argv) {
  size_t i;
  int loaded, ran = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (i = 0; i < NUM_CASES; ++i) printf("%s\n", kCases[i].name);
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "--check-list") == 0) {
    int same = (size_t)(argc - 2) == NUM_CASES;
    for (i = 0; same && i < NUM_CASES; ++i) same = strcmp(argv[2 + i], kCases[i].name) == 0;
    printf(same ? "the registered tests are the program's cases\n" : "the registered tests and the cases differ\n");
    return same ? 0 : 1;
  }
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    printf("usage: %s [case | --list | --check-list names...]\n", argv[0]);
    return 2;
  }
  if (argc == 2) {
    for (i = 0; i < NUM_CASES && strcmp(argv[1], kCases[i].name) != 0; ++i) {
    }
    if (i == NUM_CASES) {
      printf("unknown case \"%s\"\n", argv[1]);
      return 2;
    }
  }
  loaded = load_reference();
  if (loaded != 1) {
    const char *require = getenv("KDN_REQUIRE_MODELS");
    free(g_ref);
    if (loaded == 0 && (require == NULL || strcmp(require, "1") != 0)) return 77;
    return 1;
  }
  for (i = 0; i < NUM_CASES; ++i) {
    int failed_before = g_failed;
    if (argc == 2 && strcmp(argv[1], kCases[i].name) != 0) continue;
    kCases[i].run();
    ++ran;
    printf("%s %s\n", g_failed == failed_before ? "ok  " : "FAIL", kCases[i].name);
  }
  free(g_ref);
  printf("%d cases, %d checks passed, %d failed\n", ran, g_passed, g_failed);
  return g_failed == 0 && g_passed > 0 ? 0 : 1;
}
