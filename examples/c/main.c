// SPDX-License-Identifier: Apache-2.0
/* kdn from a host program, through the installed C ABI alone: keep the KV
 * cache of a prompt, find it again, read it back, check every byte, print
 * the runtime's statistics.
 *
 * The KV is real: the reference model's (stories260K: 5 layers, 4 KV heads
 * of 8 dims, float32) for BOS and its first 47 greedy tokens, read from
 * <models>/reference/kv260k.k.f32 and .v.f32 ([layer][position][head][dim]).
 *
 * Build against an installed kdn, either way:
 *   cmake -S examples/c -B build-example -DCMAKE_PREFIX_PATH=<prefix>
 *   cmake --build build-example
 * or
 *   cc -std=c99 main.c $(pkg-config --cflags --libs kdn) -o kdn_example
 * Run: kdn_example [models dir]  (default: $KDN_MODELS)
 *  or: kdn_example --kv PREFIX     (what `kdn generate --dump-kv PREFIX` wrote
 *                                   for 48 positions: PREFIX.k.f32, .v.f32 and
 *                                   .tokens.i32; the other bindings' examples
 *                                   take the same)
 * Exit status: 0 done, 1 a check failed, 2 usage, 77 the reference KV is missing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kdn/kdn.h>

enum {
  LAYERS = 5,
  HEADS = 4,
  HEAD_DIM = 8,
  POSITIONS = 48,
  CHUNK_TOKENS = 16,                             /* 48 tokens = 3 chunks */
  TOKEN_ELEMS = HEADS * HEAD_DIM,                /* one token's K (or V) in one layer */
  FILE_ELEMS = LAYERS * POSITIONS * TOKEN_ELEMS, /* one of the two files */
  KV_ELEMS = 2 * FILE_ELEMS                      /* all of the prompt's KV */
};

/* The prompt: BOS, then the model's first 47 greedy tokens ("Once upon a
 * time, there was a little girl named Lily. ..."). */
static int32_t kPrompt[POSITIONS] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                           421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
                                           292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358,
                                           394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266};

static const char kNamespace[] = "example";
#define NS kNamespace, sizeof kNamespace - 1

/* Every kdn call returns a status; on failure kdn_last_error_message() says why. */
#define CHECK(call)                                                                                   \
  do {                                                                                                \
    kdn_status status_ = (call);                                                                      \
    if (status_ != KDN_OK) {                                                                          \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, kdn_status_string(status_), \
              kdn_last_error_message());                                                              \
      exit(1);                                                                                        \
    }                                                                                                 \
  } while (0)

#define EXPECT(cond)                                                             \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);        \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

/* Reads exactly `bytes` bytes (and not one more). 1: read; 0: missing; -1: wrong size. */
static int read_file(const char *path, void *out, size_t bytes) {
  FILE *f = fopen(path, "rb");
  char extra;
  int result = 1;
  if (f == NULL) return 0;
  if (fread(out, 1, bytes, f) != bytes || fread(&extra, 1, 1, f) != 0) result = -1;
  fclose(f);
  return result;
}

static double mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

int main(int argc, char **argv) {
  const int dumped = argc > 2 && strcmp(argv[1], "--kv") == 0;
  const char *models = dumped ? argv[2] : argc > 1 ? argv[1] : getenv("KDN_MODELS");
  static const char *const kFiles[2] = {"kv260k.k.f32", "kv260k.v.f32"};
  static const char *const kDumped[2] = {".k.f32", ".v.f32"};
  int32_t doc_tokens[POSITIONS];
  kdn_document_info docs[4];
  size_t num_docs = 0;
  float *prompt_kv; /* K file, then V file: [k|v][layer][position][head][dim] */
  float *loaded;    /* canonical layout: [layer][k|v][position][head][dim] */
  kdn_runtime_options options;
  kdn_runtime *runtime = NULL;
  kdn_model_spec spec;
  kdn_model *model = NULL;
  kdn_request request, lookups[2];
  kdn_lookup_result found[2];
  kdn_kv_view engine, out;
  kdn_kv_result result;
  kdn_stats stats;
  kdn_latency latency;
  uint64_t bytes_per_token = 0;
  uint32_t tiers = 0, t;
  int i, layer;

  if (models == NULL || models[0] == '\0') {
    fprintf(stderr, "usage: %s MODELS_DIR (or set KDN_MODELS) | --kv PREFIX\n", argv[0]);
    return 2;
  }
  prompt_kv = malloc(sizeof(float) * KV_ELEMS);
  loaded = calloc(KV_ELEMS, sizeof(float));
  EXPECT(prompt_kv != NULL && loaded != NULL);
  for (i = 0; i < 2; ++i) {
    char path[4096];
    int r;
    if (dumped) {
      snprintf(path, sizeof path, "%s%s", models, kDumped[i]);
    } else {
      snprintf(path, sizeof path, "%s/reference/%s", models, kFiles[i]);
    }
    r = read_file(path, prompt_kv + (size_t)i * FILE_ELEMS, sizeof(float) * FILE_ELEMS);
    if (r != 1) {
      printf("%s: %s\n", path, r == 0 ? "missing (the reference model's KV)" : "not the reference KV");
      free(prompt_kv);
      free(loaded);
      return r == 0 ? 77 : 1;
    }
  }
  if (dumped) { /* the prompt's ids, as generate wrote them */
    char path[4096];
    snprintf(path, sizeof path, "%s.tokens.i32", models);
    if (read_file(path, kPrompt, sizeof kPrompt) != 1) {
      printf("%s: missing, or not %d ids\n", path, POSITIONS);
      free(prompt_kv);
      free(loaded);
      return 1;
    }
  }

  printf("kdn %s (library), %d.%d.%d (header)\n", kdn_version(), KDN_VERSION_MAJOR, KDN_VERSION_MINOR,
         KDN_VERSION_PATCH);
  EXPECT(kdn_version_number() / 10000 == KDN_VERSION_MAJOR); /* same ABI */
  EXPECT(kdn_version_number() >= KDN_VERSION_NUMBER);          /* at least what we were built with */

  /* A runtime with one host tier of 16 MiB, chunks of 16 tokens. */
  CHECK(kdn_runtime_options_init(&options, sizeof options));
  options.chunk_tokens = CHUNK_TOKENS;
  options.host_capacity_bytes = 16u << 20;
  CHECK(kdn_runtime_create(&options, &runtime));

  CHECK(kdn_model_spec_init(&spec, sizeof spec));
  spec.num_layers = LAYERS;
  spec.num_kv_heads = HEADS;
  spec.head_dim = HEAD_DIM;
  spec.dtype = KDN_DTYPE_F32;
  spec.fingerprint = "stories260K";
  spec.fingerprint_len = strlen(spec.fingerprint);
  CHECK(kdn_model_create(runtime, &spec, &model));
  CHECK(kdn_model_get_kv_bytes_per_token(model, &bytes_per_token));
  EXPECT(bytes_per_token == (uint64_t)LAYERS * 2 * TOKEN_ELEMS * sizeof(float));

  CHECK(kdn_request_init(&request, sizeof request));
  request.tokens = kPrompt;
  request.num_tokens = POSITIONS;

  /* Store: the engine's KV where it lies, described by strides (elements):
   * layer j's K at j * POSITIONS * TOKEN_ELEMS, its V FILE_ELEMS further. */
  CHECK(kdn_kv_view_init(&engine, sizeof engine));
  engine.dtype = KDN_DTYPE_F32;
  engine.data = prompt_kv;
  engine.size_bytes = sizeof(float) * KV_ELEMS;
  engine.stride_layer = (int64_t)POSITIONS * TOKEN_ELEMS;
  engine.stride_kv = FILE_ELEMS;
  engine.stride_token = TOKEN_ELEMS;
  engine.stride_head = HEAD_DIM;
  engine.stride_dim = 1;
  CHECK(kdn_kv_result_init(&result, sizeof result));
  CHECK(kdn_kv_store(model, NS, &request, &engine, 1, &result));
  printf("stored: %llu tokens cached (%d chunks of %d)\n", (unsigned long long)result.tokens,
         POSITIONS / CHUNK_TOKENS, CHUNK_TOKENS);
  EXPECT(result.tokens == POSITIONS);

  /* Lookup, without side effects: the prompt, and its first 40 tokens, of
   * which only the two whole chunks (32 tokens) count. */
  for (i = 0; i < 2; ++i) {
    CHECK(kdn_request_init(&lookups[i], sizeof lookups[i]));
    CHECK(kdn_lookup_result_init(&found[i], sizeof found[i]));
    lookups[i].tokens = kPrompt;
  }
  lookups[0].num_tokens = POSITIONS;
  lookups[1].num_tokens = 40;
  CHECK(kdn_kv_lookup(model, NS, lookups, 2, found));
  for (i = 0; i < 2; ++i) {
    printf("lookup of %llu tokens: %llu cached\n", (unsigned long long)lookups[i].num_tokens,
           (unsigned long long)found[i].cached_tokens);
    EXPECT(found[i].status == KDN_OK);
  }
  EXPECT(found[0].cached_tokens == POSITIONS);
  EXPECT(found[1].cached_tokens == 2 * CHUNK_TOKENS);

  /* Retrieve into a buffer of the canonical layout (data, strides all 0),
   * and compare every byte with what was stored. */
  CHECK(kdn_kv_view_init(&out, sizeof out));
  out.dtype = KDN_DTYPE_F32;
  out.data = loaded;
  out.size_bytes = sizeof(float) * KV_ELEMS;
  CHECK(kdn_kv_result_init(&result, sizeof result));
  CHECK(kdn_kv_retrieve(model, NS, &request, &out, 1, &result));
  printf("retrieved: %llu tokens\n", (unsigned long long)result.tokens);
  EXPECT(result.tokens == POSITIONS && result.covered == POSITIONS);
  EXPECT((result.flags & KDN_RESULT_LOSSY) == 0); /* a host tier keeps the bytes as they were */
  for (layer = 0; layer < LAYERS; ++layer) {
    for (i = 0; i < 2; ++i) { /* K, V */
      const float *want = prompt_kv + (size_t)i * FILE_ELEMS + (size_t)layer * POSITIONS * TOKEN_ELEMS;
      const float *got = loaded + ((size_t)layer * 2 + i) * POSITIONS * TOKEN_ELEMS;
      if (memcmp(want, got, sizeof(float) * POSITIONS * TOKEN_ELEMS) != 0) {
        fprintf(stderr, "layer %d %c: the retrieved KV differs from the stored KV\n", layer, i == 0 ? 'K' : 'V');
        return 1;
      }
    }
  }
  printf("retrieved KV: all %lu bytes equal to the stored KV\n", (unsigned long)(sizeof(float) * KV_ELEMS));

  /* A miss is not an error: another namespace sees nothing. */
  CHECK(kdn_kv_result_init(&result, sizeof result));
  result.tokens = 1;
  CHECK(kdn_kv_retrieve(model, "someone-else", 12, &request, &out, 1, &result));
  EXPECT(result.tokens == 0);

  /* The prompt as a knowledge item: put under a name, listed, fetched back
   * (its tokens and KV at its own positions) and compared. */
  CHECK(kdn_knowledge_put(model, NS, "story", 5, 1, "{}", 2, kPrompt, POSITIONS, &engine, 1));
  for (i = 0; i < 4; ++i) CHECK(kdn_document_info_init(&docs[i], sizeof docs[i]));
  CHECK(kdn_knowledge_list(model, NS, docs, 4, &num_docs));
  EXPECT(num_docs == 1 && strcmp(docs[0].doc_id, "story") == 0 && docs[0].num_tokens == POSITIONS);
  printf("knowledge: %s, version %llu, %llu tokens, %u of %u chunks held\n", docs[0].doc_id,
         (unsigned long long)docs[0].version, (unsigned long long)docs[0].num_tokens, docs[0].chunks_present,
         docs[0].chunks);
  memset(loaded, 0, sizeof(float) * KV_ELEMS);
  out.num_tokens = POSITIONS; /* the room a fetch needs stated */
  CHECK(kdn_kv_result_init(&result, sizeof result));
  CHECK(kdn_knowledge_fetch(model, NS, "story", 5, &out, 1, doc_tokens, POSITIONS, &result));
  EXPECT(result.tokens == POSITIONS && memcmp(doc_tokens, kPrompt, sizeof kPrompt) == 0);
  for (layer = 0; layer < LAYERS; ++layer) {
    for (i = 0; i < 2; ++i) {
      const float *want = prompt_kv + (size_t)i * FILE_ELEMS + (size_t)layer * POSITIONS * TOKEN_ELEMS;
      const float *got = loaded + ((size_t)layer * 2 + i) * POSITIONS * TOKEN_ELEMS;
      EXPECT(memcmp(want, got, sizeof(float) * POSITIONS * TOKEN_ELEMS) == 0);
    }
  }
  printf("knowledge fetch: tokens and KV equal to what was put\n");

  CHECK(kdn_stats_init(&stats, sizeof stats));
  CHECK(kdn_runtime_get_stats(runtime, &stats));
  printf("stats: %llu lookups, %llu stores, %llu retrieves, %llu chunk hits, %llu misses\n",
         (unsigned long long)stats.lookups, (unsigned long long)stats.stores, (unsigned long long)stats.retrieves,
         (unsigned long long)stats.hits, (unsigned long long)stats.misses);
  printf("       %llu tokens stored, %llu served; %llu chunks held, %.2f of %.2f MiB\n",
         (unsigned long long)stats.tokens_stored, (unsigned long long)stats.tokens_served,
         (unsigned long long)stats.chunks, mib(stats.used_bytes), mib(stats.capacity_bytes));
  /* The prompt twice: under its own keys, and as a knowledge item under
   * position-free ones. */
  EXPECT(stats.tokens_stored == 2 * POSITIONS);
  EXPECT(stats.tokens_served == POSITIONS);
  EXPECT(stats.chunks == 2 * POSITIONS / CHUNK_TOKENS);

  CHECK(kdn_latency_init(&latency, sizeof latency));
  CHECK(kdn_runtime_get_latency(runtime, KDN_LATENCY_LOAD, &latency));
  printf("       loads: %llu, p50 %.1f us, max %.1f us\n", (unsigned long long)latency.count, latency.p50_us,
         latency.max_us);

  CHECK(kdn_runtime_get_tier_count(runtime, &tiers));
  EXPECT(tiers == 1);
  for (t = 0; t < tiers; ++t) {
    kdn_tier_stats tier;
    CHECK(kdn_tier_stats_init(&tier, sizeof tier));
    CHECK(kdn_runtime_get_tier_stats(runtime, t, &tier));
    printf("tier %u: %s (codec %s): %llu objects, %llu hits, %.2f of %.2f MiB\n", (unsigned)t, tier.name, tier.codec,
           (unsigned long long)tier.objects, (unsigned long long)tier.hits, mib(tier.used_bytes),
           mib(tier.capacity_bytes));
  }

  kdn_model_destroy(model);
  kdn_runtime_destroy(runtime);
  free(loaded);
  free(prompt_kv);
  printf("ok\n");
  return 0;
}
