// SPDX-License-Identifier: Apache-2.0
/* The reference model's real KV for the C ABI test programs: stories260K
 * (5 layers, 4 KV heads of 8 dims, float32), 48 positions: BOS and the first
 * 47 greedily generated tokens, read from <models>/reference/kv260k.{k,v}.f32.
 * Each program includes it once. */
#ifndef KDN_TESTS_CAPI_REFERENCE_H
#define KDN_TESTS_CAPI_REFERENCE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kdn/kdn.h>

#ifndef KDN_MODELS_DIR
#define KDN_MODELS_DIR "models"
#endif

enum {
  LAYERS = 5,
  HEADS = 4,
  HEAD_DIM = 8,
  POSITIONS = 48,
  TOKEN_ELEMS = HEADS * HEAD_DIM,                    /* one token of K (or V) in one layer: 32 */
  ELEMS_PER_TOKEN = LAYERS * 2 * TOKEN_ELEMS,        /* 320 */
  BYTES_PER_TOKEN = ELEMS_PER_TOKEN * 4,             /* 1,280 */
  REF_FILE_ELEMS = LAYERS * POSITIONS * TOKEN_ELEMS  /* one of the .k/.v files */
};
#define KV_BYTES ((uint64_t)POSITIONS * BYTES_PER_TOKEN)    /* 61,440 */
/* Memory tiers keep each chunk in a block of whole 4 KiB pages (below 64
 * KiB), and account the block. */
#define HELD(bytes) (((uint64_t)(bytes) + 4095u) / 4096u * 4096u)
#define FINGERPRINT "stories260K"

static const int32_t kTokens[] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                  421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
                                  292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358,
                                  394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266};
typedef char kTokens_holds_48_positions[sizeof kTokens / sizeof kTokens[0] == POSITIONS ? 1 : -1];

/* The reference files back to back, K then V: [k|v][layer][pos][head][dim].
 * This allocation is itself a strided buffer (the "file" layout). */
static float *g_ref;

static float ref_at(int layer, int kv, int token, int head, int dim) {
  return g_ref[(size_t)kv * REF_FILE_ELEMS + ((size_t)layer * POSITIONS + token) * TOKEN_ELEMS + head * HEAD_DIM + dim];
}

static const char *models_dir(void) {
  const char *env = getenv("KDN_MODELS");
  return env != NULL && env[0] != '\0' ? env : KDN_MODELS_DIR;
}

/* Reads a whole file of exactly `bytes` bytes. 1: read; 0: missing; -1: wrong. */
static int read_exact(const char *path, void *out, size_t bytes) {
  FILE *f = fopen(path, "rb");
  int result = 1;
  char extra;
  if (f == NULL) return 0;
  if (fread(out, 1, bytes, f) != bytes || fread(&extra, 1, 1, f) != 0) result = -1;
  fclose(f);
  return result;
}

/* 1: loaded; 0: missing (and reported); -1: present but wrong (reported). */
static int load_reference(void) {
  const size_t file_bytes = (size_t)REF_FILE_ELEMS * sizeof(float);
  static const char *const suffix[2] = {"k", "v"};
  char path[4096];
  int i;
  g_ref = malloc(2 * file_bytes);
  if (g_ref == NULL) return -1;
  for (i = 0; i < 2; ++i) {
    int r;
    snprintf(path, sizeof path, "%s/reference/kv260k.%s.f32", models_dir(), suffix[i]);
    r = read_exact(path, g_ref + (size_t)i * REF_FILE_ELEMS, file_bytes);
    if (r == 0) printf("reference model missing: cannot open %s (set KDN_MODELS)\n", path);
    if (r < 0) printf("%s is not %lu bytes of float32 KV\n", path, (unsigned long)file_bytes);
    if (r != 1) return r;
  }
  return 1;
}

/* A test program's setup: loads the reference KV. 0: loaded; 77: missing
 * (a skip, unless KDN_REQUIRE_MODELS=1 makes it a failure); 1: unreadable. */
static int reference_setup(void) {
  const int loaded = load_reference();
  if (loaded != 1) {
    const char *require = getenv("KDN_REQUIRE_MODELS");
    free(g_ref);
    g_ref = NULL;
    if (loaded == 0 && (require == NULL || strcmp(require, "1") != 0)) {
      printf("skipped: the reference model is missing (set KDN_MODELS, or KDN_REQUIRE_MODELS=1 to fail)\n");
      return 77;
    }
    printf("FAILED: the reference KV is %s\n", loaded == 0 ? "missing and KDN_REQUIRE_MODELS=1" : "unreadable");
    return 1;
  }
  return 0;
}

static void reference_free(void) {
  free(g_ref);
  g_ref = NULL;
}

/* The reference model's spec, and a model registered with it (check.h's
 * CHECK_OK must be included first). */
static kdn_model_spec stories260k_spec(const char *fingerprint) {
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = LAYERS;
  spec.num_kv_heads = HEADS;
  spec.head_dim = HEAD_DIM;
  spec.dtype = KDN_DTYPE_F32;
  spec.fingerprint = fingerprint;
  spec.fingerprint_len = strlen(fingerprint);
  return spec;
}

static kdn_model *new_model(kdn_runtime *runtime, const char *fingerprint) {
  const kdn_model_spec spec = stories260k_spec(fingerprint);
  kdn_model *model = NULL;
  CHECK_OK(kdn_model_create(runtime, &spec, &model));
  return model;
}

#endif /* KDN_TESTS_CAPI_REFERENCE_H */
