// SPDX-License-Identifier: Apache-2.0
/* Model kinds other than K/V heads through the C ABI (docs/model-kinds.md),
 * from a plain C99 program: a latent (MLA) model (KDN_CACHE_LATENT) stored
 * from and retrieved into vLLM's MLA cache layout (per layer
 * [num_blocks][block_size][latent_dim], a paged view of k_layers), a dense
 * per-layer layout and one allocation, bit for bit, through a host tier over
 * a disk tier and after a restart from the disk tier alone; its identity
 * apart from any K/V model of the same bytes; its bad specs and views;
 * blending's limits. The latent vectors are synthetic (a seeded generator):
 * exact reuse is a matter of bytes, and no real MLA model is at hand.
 *
 * One case per ctest test: `capi_model_kinds_test <case>` (check.h). */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#define KDN_EXPERIMENTAL  /* kdn_kv_blend */

#include <kdn/kdn.h>

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

enum {
  LAYERS = 3,
  LATENT = 80,      /* 64 + 16, DeepSeek's 512 + 64 scaled down */
  ROPE = 16,
  TOKENS = 48,      /* 3 chunks of 16 */
  CHUNK = 16,
  BLOCK = 4,        /* the engine's block size */
  NUM_BLOCKS = 16,  /* per layer: room for 64 tokens */
  SEQ_BLOCKS = TOKENS / BLOCK
};
static const char kFingerprint[] = "model-kinds-test: an MLA model, synthetic";
static const char kNs[] = "tenant";

static char g_tmpdir[256];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}
static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* The latent vector of token t, layer l, dim d (float32, exact in bytes). */
static float latent_value(int l, int t, int d) {
  uint32_t x = (uint32_t)(l * 1000003 + t * 7919 + d * 104729) * 2654435761u;
  x ^= x >> 15;
  return (float)(x % 20001u) / 1000.0f - 10.0f;
}

static kdn_model_spec latent_spec(void) {
  kdn_model_spec s = KDN_MODEL_SPEC_INIT;
  s.num_layers = LAYERS;
  s.dtype = KDN_DTYPE_F32;
  s.cache_kind = KDN_CACHE_LATENT;
  s.latent_dim = LATENT;
  s.latent_rope_dim = ROPE;
  s.rope_style = KDN_ROPE_NEOX;
  s.fingerprint = kFingerprint;
  s.fingerprint_len = sizeof kFingerprint - 1;
  return s;
}

/* A host tier written through to a disk tier in g_tmpdir (or the disk tier alone). */
static kdn_runtime *open_runtime(int with_host) {
  kdn_tier_config tiers[2] = {KDN_TIER_CONFIG_INIT, KDN_TIER_CONFIG_INIT};
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  size_t n = 0;
  if (with_host) {
    tiers[n].kind = KDN_TIER_HOST;
    tiers[n].capacity_bytes = (uint64_t)16 << 20;
    tiers[n].write_through = 1;
    ++n;
  }
  tiers[n].kind = KDN_TIER_DISK;
  tiers[n].capacity_bytes = (uint64_t)64 << 20;
  tiers[n].path = g_tmpdir;
  tiers[n].path_len = strlen(g_tmpdir);
  ++n;
  o.chunk_tokens = CHUNK;
  o.tiers = tiers;
  o.num_tiers = n;
  o.device = KDN_DEVICE_NONE;
  CHECK_OK(kdn_runtime_create(&o, &rt));
  return rt;
}

static kdn_request request_of(const int32_t *tokens, size_t n) {
  kdn_request r = KDN_REQUEST_INIT;
  r.tokens = tokens;
  r.num_tokens = n;
  return r;
}

static void fill_tokens(int32_t *tokens) {
  int t;
  for (t = 0; t < TOKENS; ++t) tokens[t] = 3 + (t * 37) % 500;
}

/* vLLM's MLA cache: per layer [NUM_BLOCKS][BLOCK][LATENT], the sequence's
 * token t in block table[t / BLOCK], slot t % BLOCK. */
typedef struct paged_cache {
  float *layers[LAYERS];
  int32_t table[SEQ_BLOCKS];
} paged_cache;

static void paged_init(paged_cache *c, const int32_t *table) {
  int l;
  for (l = 0; l < LAYERS; ++l) {
    size_t i;
    c->layers[l] = (float *)malloc(sizeof(float) * NUM_BLOCKS * BLOCK * LATENT);
    for (i = 0; i < (size_t)NUM_BLOCKS * BLOCK * LATENT; ++i) c->layers[l][i] = -12345.0f; /* a sentinel */
  }
  memcpy(c->table, table, sizeof c->table);
}
static void paged_free(paged_cache *c) {
  int l;
  for (l = 0; l < LAYERS; ++l) free(c->layers[l]);
}
static float *paged_at(paged_cache *c, int l, int t) {
  return c->layers[l] + ((size_t)c->table[t / BLOCK] * BLOCK + (size_t)(t % BLOCK)) * LATENT;
}
/* The synthetic latents of the sequence in blocks `table`. */
static void paged_fill(paged_cache *c, const int32_t *table) {
  int l, t, d;
  paged_init(c, table);
  for (l = 0; l < LAYERS; ++l) {
    for (t = 0; t < TOKENS; ++t) {
      float *p = paged_at(c, l, t);
      for (d = 0; d < LATENT; ++d) p[d] = latent_value(l, t, d);
    }
  }
}
static kdn_kv_view paged_view(paged_cache *c) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.layout = KDN_LAYOUT_PAGED_NHD;
  v.k_layers = (void *const *)c->layers;
  v.block_size = BLOCK;
  v.block_table = c->table;
  v.block_table_len = SEQ_BLOCKS;
  v.num_blocks = NUM_BLOCKS;
  return v;
}
/* Every latent vector of tokens [0, n) is the synthetic one. */
static int paged_holds(paged_cache *c, int n) {
  int l, t, d;
  for (l = 0; l < LAYERS; ++l) {
    for (t = 0; t < n; ++t) {
      const float *p = paged_at(c, l, t);
      for (d = 0; d < LATENT; ++d) {
        const float want = latent_value(l, t, d);
        if (memcmp(&p[d], &want, sizeof want) != 0) return 0;
      }
    }
  }
  return 1;
}
/* Blocks the sequence does not use are untouched. */
static int paged_rest_untouched(paged_cache *c) {
  int l, b, i;
  for (l = 0; l < LAYERS; ++l) {
    for (b = 0; b < NUM_BLOCKS; ++b) {
      int used = 0;
      for (i = 0; i < SEQ_BLOCKS; ++i) used |= c->table[i] == b;
      if (used) continue;
      for (i = 0; i < BLOCK * LATENT; ++i) {
        if (c->layers[l][(size_t)b * BLOCK * LATENT + (size_t)i] != -12345.0f) return 0;
      }
    }
  }
  return 1;
}

static const int32_t kTableA[SEQ_BLOCKS] = {7, 2, 11, 0, 5, 14, 9, 3, 12, 1, 15, 6};
static const int32_t kTableB[SEQ_BLOCKS] = {4, 13, 8, 10, 2, 0, 15, 7, 1, 11, 3, 9};

/* vLLM's MLA layout in, another block table out, bit for bit; the blocks
 * the sequence does not use are left alone. Also through an op. */
static void test_latent_paged_round_trip(void) {
  kdn_runtime *rt;
  kdn_model *m = NULL;
  kdn_model_spec spec = latent_spec();
  paged_cache in, out, op_out;
  kdn_kv_view vin, vout;
  int32_t tokens[TOKENS];
  kdn_request req;
  kdn_kv_result res = KDN_KV_RESULT_INIT;
  kdn_lookup_result looked = KDN_LOOKUP_RESULT_INIT;
  kdn_op *op = NULL;
  uint64_t bytes = 0;
  group_begin("a latent model: vLLM's MLA layout, stored and retrieved bit for bit");
  fill_tokens(tokens);
  req = request_of(tokens, TOKENS);
  rt = open_runtime(1);
  CHECK_OK(kdn_model_create(rt, &spec, &m));
  CHECK_OK(kdn_model_get_kv_bytes_per_token(m, &bytes));
  CHECK_EQ(bytes, (uint64_t)LAYERS * LATENT * sizeof(float));
  paged_fill(&in, kTableA);
  vin = paged_view(&in);
  CHECK_OK(kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &vin, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  CHECK_OK(kdn_kv_lookup(m, kNs, sizeof kNs - 1, &req, 1, &looked));
  CHECK_EQ(looked.cached_tokens, TOKENS);
  paged_init(&out, kTableB);
  vout = paged_view(&out);
  res = (kdn_kv_result)KDN_KV_RESULT_INIT;
  CHECK_OK(kdn_kv_retrieve(m, kNs, sizeof kNs - 1, &req, &vout, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  CHECK(paged_holds(&out, TOKENS));
  CHECK(paged_rest_untouched(&out));
  /* The layer-by-layer load op takes the same view. */
  paged_init(&op_out, kTableB);
  vout = paged_view(&op_out);
  CHECK_OK(kdn_kv_load_async(m, kNs, sizeof kNs - 1, &req, &vout, 1, &op));
  if (op != NULL) {
    CHECK_OK(kdn_op_wait(op, 10000));
    kdn_op_destroy(op);
  }
  CHECK(paged_holds(&op_out, TOKENS));
  CHECK(paged_rest_untouched(&op_out));
  paged_free(&in);
  paged_free(&out);
  paged_free(&op_out);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();
}

/* Dense per-layer buffers in; after a restart, the disk tier alone serves
 * them into one allocation [layer][token][latent]. */
static void test_latent_restart_from_disk(void) {
  kdn_runtime *rt;
  kdn_model *m = NULL;
  kdn_model_spec spec = latent_spec();
  float *layers[LAYERS];
  float *all;
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  int32_t tokens[TOKENS];
  kdn_request req;
  kdn_kv_result res = KDN_KV_RESULT_INIT;
  int l, t, d, same = 1;
  group_begin("a latent model: dense per-layer views in, one allocation out after a restart from disk");
  fill_tokens(tokens);
  req = request_of(tokens, TOKENS);
  rt = open_runtime(1);
  CHECK_OK(kdn_model_create(rt, &spec, &m));
  for (l = 0; l < LAYERS; ++l) {
    layers[l] = (float *)malloc(sizeof(float) * TOKENS * LATENT);
    for (t = 0; t < TOKENS; ++t) {
      for (d = 0; d < LATENT; ++d) layers[l][t * LATENT + d] = latent_value(l, t, d);
    }
  }
  v.k_layers = (void *const *)layers;
  v.layer_elements = (uint64_t)TOKENS * LATENT;
  CHECK_OK(kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt); /* waits for the disk writes */
  rt = open_runtime(0);
  m = NULL;
  CHECK_OK(kdn_model_create(rt, &spec, &m));
  all = (float *)calloc((size_t)LAYERS * TOKENS * LATENT, sizeof(float));
  v = (kdn_kv_view)KDN_KV_VIEW_INIT;
  v.data = all;
  v.size_bytes = sizeof(float) * LAYERS * TOKENS * LATENT;
  v.num_tokens = TOKENS; /* with stride_layer 0: layers TOKENS vectors apart */
  res = (kdn_kv_result)KDN_KV_RESULT_INIT;
  CHECK_OK(kdn_kv_retrieve(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  for (l = 0; l < LAYERS; ++l) {
    for (t = 0; t < TOKENS; ++t) {
      for (d = 0; d < LATENT; ++d) {
        const float want = latent_value(l, t, d);
        same = same && memcmp(&all[((size_t)l * TOKENS + (size_t)t) * LATENT + (size_t)d], &want, sizeof want) == 0;
      }
    }
  }
  CHECK(same);
  /* A view one vector too small is refused before anything is written. */
  v.size_bytes -= sizeof(float);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  free(all);
  for (l = 0; l < LAYERS; ++l) free(layers[l]);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();
}

/* A K/V model of the very same bytes per token (one head of LATENT / 2, the
 * same fingerprint string) is another model: neither sees the other's KV. */
static void test_latent_identity(void) {
  kdn_runtime *rt;
  kdn_model *latent = NULL, *kv = NULL, *other_rope = NULL;
  kdn_model_spec s = latent_spec(), k = latent_spec();
  uint8_t f1[32], f2[32], f3[32];
  float *layers[LAYERS];
  float *v_layers[LAYERS];
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  int32_t tokens[TOKENS];
  kdn_request req;
  kdn_kv_result res = KDN_KV_RESULT_INIT;
  kdn_lookup_result looked = KDN_LOOKUP_RESULT_INIT;
  int l;
  group_begin("a latent model's identity: apart from a K/V model of the same bytes, and from another RoPE split");
  fill_tokens(tokens);
  req = request_of(tokens, TOKENS);
  rt = open_runtime(1);
  CHECK_OK(kdn_model_create(rt, &s, &latent));
  k.cache_kind = KDN_CACHE_KV;
  k.latent_dim = 0;
  k.latent_rope_dim = 0;
  k.num_kv_heads = 1;
  k.head_dim = LATENT / 2;
  CHECK_OK(kdn_model_create(rt, &k, &kv));
  s.latent_rope_dim = ROPE + 16;
  CHECK_OK(kdn_model_create(rt, &s, &other_rope));
  CHECK_OK(kdn_model_get_fingerprint(latent, f1));
  CHECK_OK(kdn_model_get_fingerprint(kv, f2));
  CHECK_OK(kdn_model_get_fingerprint(other_rope, f3));
  CHECK(memcmp(f1, f2, 32) != 0);
  CHECK(memcmp(f1, f3, 32) != 0);
  for (l = 0; l < LAYERS; ++l) {
    layers[l] = (float *)calloc((size_t)TOKENS * LATENT, sizeof(float));
    v_layers[l] = layers[l] + LATENT / 2;
  }
  v.k_layers = (void *const *)layers;
  CHECK_OK(kdn_kv_store(latent, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  CHECK_OK(kdn_kv_lookup(kv, kNs, sizeof kNs - 1, &req, 1, &looked));
  CHECK_EQ(looked.cached_tokens, 0);
  CHECK_OK(kdn_kv_lookup(other_rope, kNs, sizeof kNs - 1, &req, 1, &looked));
  CHECK_EQ(looked.cached_tokens, 0);
  /* The K/V model's own store, of the same memory as K and V halves. */
  v.v_layers = (void *const *)v_layers;
  v.stride_token = LATENT;
  v.stride_head = LATENT / 2;
  v.stride_dim = 1;
  CHECK_OK(kdn_kv_store(kv, "other", 5, &req, &v, 1, &res));
  CHECK_OK(kdn_kv_lookup(latent, "other", 5, &req, 1, &looked));
  CHECK_EQ(looked.cached_tokens, 0);
  for (l = 0; l < LAYERS; ++l) free(layers[l]);
  kdn_model_destroy(latent);
  kdn_model_destroy(kv);
  kdn_model_destroy(other_rope);
  kdn_runtime_destroy(rt);
  group_end();
}

static void test_latent_bad_specs(void) {
  kdn_runtime *rt = NULL;
  kdn_model *m = NULL;
  kdn_model_spec s;
  group_begin("a latent model's bad specs: each refused with its reason");
  CHECK_OK(kdn_runtime_create(NULL, &rt));
  s = latent_spec();
  s.num_kv_heads = 1;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "num_kv_heads", kdn_model_create(rt, &s, &m));
  s = latent_spec();
  s.head_dim = LATENT / 2;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &s, &m));
  s = latent_spec();
  s.latent_dim = 81;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "latent_dim 81", kdn_model_create(rt, &s, &m));
  s = latent_spec();
  s.latent_dim = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &s, &m));
  s = latent_spec();
  s.latent_rope_dim = LATENT + 2;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &s, &m));
  s = latent_spec();
  s.latent_rope_dim = 15;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &s, &m));
  s = latent_spec();
  s.cache_kind = (kdn_cache_kind)7;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "cache_kind 7", kdn_model_create(rt, &s, &m));
  /* A reserved field set: a newer caller's meaning this library lacks. */
  s = latent_spec();
  s.reserved1 = 1;
  CHECK_ERROR_NAMING(KDN_ERR_VERSION, "reserved1", kdn_model_create(rt, &s, &m));
  /* A K/V model with latent fields set. */
  s = latent_spec();
  s.cache_kind = KDN_CACHE_KV;
  s.num_kv_heads = 1;
  s.head_dim = 8;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &s, &m));
  CHECK(m == NULL);
  kdn_runtime_destroy(rt);
  group_end();
}

static void test_latent_bad_views(void) {
  kdn_runtime *rt;
  kdn_model *m = NULL;
  kdn_model_spec spec = latent_spec();
  paged_cache c;
  kdn_kv_view v;
  int32_t tokens[TOKENS];
  kdn_request req;
  kdn_kv_result res = KDN_KV_RESULT_INIT;
  float *layers[LAYERS];
  int l;
  group_begin("a latent model's bad views: no V, no heads, dense pages");
  fill_tokens(tokens);
  req = request_of(tokens, TOKENS);
  rt = open_runtime(1);
  CHECK_OK(kdn_model_create(rt, &spec, &m));
  paged_init(&c, kTableA);
  v = paged_view(&c);
  v.v_layers = (void *const *)c.layers;
  CHECK_ERROR_NAMING(KDN_ERR_INVALID_ARGUMENT, "v_layers", kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  v = paged_view(&c);
  v.stride_token = LATENT;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  v = paged_view(&c);
  v.num_blocks = 2; /* the table names blocks beyond it */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  for (l = 0; l < LAYERS; ++l) layers[l] = (float *)calloc((size_t)TOKENS * LATENT, sizeof(float));
  v = (kdn_kv_view)KDN_KV_VIEW_INIT;
  v.k_layers = (void *const *)layers;
  v.stride_head = 8;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  v.stride_head = 0;
  v.stride_kv = LATENT / 2;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  v.stride_kv = 0;
  v.layer_elements = (uint64_t)TOKENS * LATENT - 1; /* one element short of the last vector */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  v.layer_elements = (uint64_t)TOKENS * LATENT;
  CHECK_OK(kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &v, 1, &res));
  for (l = 0; l < LAYERS; ++l) free(layers[l]);
  paged_free(&c);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();
}

/* Views in device memory take the same translation (the emulated device:
 * host memory standing in for a GPU's, the kernels' CPU paths). */
static void test_latent_device_views(void) {
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *rt = NULL;
  kdn_model *m = NULL;
  kdn_model_spec spec = latent_spec();
  paged_cache in, out;
  kdn_kv_view vin, vout;
  int32_t tokens[TOKENS];
  kdn_request req;
  kdn_kv_result res = KDN_KV_RESULT_INIT;
  group_begin("a latent model: paged views in (emulated) device memory, bit for bit");
  fill_tokens(tokens);
  req = request_of(tokens, TOKENS);
  host.kind = KDN_TIER_HOST;
  host.capacity_bytes = (uint64_t)16 << 20;
  o.chunk_tokens = CHUNK;
  o.tiers = &host;
  o.num_tiers = 1;
  o.device = KDN_DEVICE_EMULATED;
  CHECK_OK(kdn_runtime_create(&o, &rt));
  CHECK_OK(kdn_model_create(rt, &spec, &m));
  paged_fill(&in, kTableA);
  vin = paged_view(&in);
  vin.memory = KDN_MEMORY_DEVICE;
  CHECK_OK(kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &vin, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  paged_init(&out, kTableB);
  vout = paged_view(&out);
  vout.memory = KDN_MEMORY_DEVICE;
  res = (kdn_kv_result)KDN_KV_RESULT_INIT;
  CHECK_OK(kdn_kv_retrieve(m, kNs, sizeof kNs - 1, &req, &vout, 1, &res));
  CHECK_EQ(res.tokens, TOKENS);
  CHECK(paged_holds(&out, TOKENS));
  CHECK(paged_rest_untouched(&out));
  paged_free(&in);
  paged_free(&out);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();
}

/* Blending a latent model (tests/refengine/variants_test.cc blends one for
 * real) has two limits, each refused with its reason: RoPE dims beyond the
 * latent's second half, and an engine on a device. */
static kdn_status no_layer(void *user, uint32_t layer, const int32_t *positions, const int32_t *tokens, size_t count,
                           float *hidden, size_t hidden_len, uint32_t hidden_dim, float *k, float *v, size_t kv_len,
                           size_t total) {
  (void)user, (void)layer, (void)positions, (void)tokens, (void)count, (void)hidden, (void)hidden_len;
  (void)hidden_dim, (void)k, (void)v, (void)kv_len, (void)total;
  return KDN_ERR_INTERNAL;
}

static void test_latent_blend_limits(void) {
  kdn_runtime *rt;
  kdn_model *m = NULL, *wide = NULL;
  kdn_model_spec spec = latent_spec(), wide_spec = latent_spec();
  kdn_blend_segment seg = KDN_BLEND_SEGMENT_INIT;
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  const int32_t tokens[2] = {1, 5};
  group_begin("a latent model's blending limits, refused with their reasons");
  rt = open_runtime(1);
  CHECK_OK(kdn_model_create(rt, &spec, &m));
  wide_spec.latent_rope_dim = LATENT / 2 + 2; /* RoPE dims reaching into the first half */
  CHECK_OK(kdn_model_create(rt, &wide_spec, &wide));
  seg.tokens = tokens;
  seg.num_tokens = 2;
  o.layer_fn = no_layer;
  o.hidden_dim = 8;
  CHECK_ERROR_NAMING(KDN_ERR_UNSUPPORTED, "latent_rope_dim",
                     kdn_kv_blend(wide, kNs, sizeof kNs - 1, &seg, 1, &o, &v, 1, NULL));
  o.flags = KDN_BLEND_ENGINE_ON_DEVICE;
  CHECK_ERROR_NAMING(KDN_ERR_UNSUPPORTED, "latent", kdn_kv_blend(m, kNs, sizeof kNs - 1, &seg, 1, &o, &v, 1, NULL));
  kdn_model_destroy(wide);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  group_end();
}

static void after_case(void) {
  remove_tree(g_tmpdir);
  mkdir(g_tmpdir, 0700);
}

static int setup(void) {
  strcpy(g_tmpdir, "/tmp/kdn_model_kinds_XXXXXX");
  return mkdtemp(g_tmpdir) == NULL ? 1 : 0;
}

static void teardown(void) { remove_tree(g_tmpdir); }

static const test_case kCases[] = {
  CASE(latent_paged_round_trip),
  CASE(latent_restart_from_disk),
  CASE(latent_identity),
  CASE(latent_bad_specs),
  CASE(latent_bad_views),
  CASE(latent_device_views),
  CASE(latent_blend_limits),
};

int main(int argc, char **argv) {
  test_program p;
  p.cases = kCases;
  p.num_cases = sizeof kCases / sizeof kCases[0];
  p.setup = setup;
  p.after_case = after_case;
  p.teardown = teardown;
  return run_cases(&p, argc, argv);
}
