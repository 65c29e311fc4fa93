/* The C ABI from a plain C99 program (after leveldb's db/c_test.c): real KV
 * of the reference model (stories260K) goes through libkdn.so in several
 * layouts and comes back bit for bit; prefixes, tenants, fingerprints,
 * capacity and statistics behave as documented; every bad argument gets its
 * documented status and a message, which the next successful call clears.
 *
 * Prints a line per group of checks and ends with "N passed, M failed".
 * Exit status: 0 all passed, 1 a check failed, 77 the reference model is
 * missing (skipped; a failure instead when KDN_REQUIRE_MODELS=1). */
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

/* A caller's KV buffer: the floats, their layout, and its kdn description. */
typedef struct test_buf {
  float *data;
  size_t elems;
  uint64_t tokens;
  strides st;
  kdn_kv_buffer kv;
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
  kdn_kv_buffer kv = KDN_KV_BUFFER_INIT;
  b.tokens = tokens;
  b.elems = (size_t)tokens * ELEMS_PER_TOKEN;
  b.st = layout_strides(kind, (int64_t)tokens);
  b.data = malloc(b.elems * sizeof(float));
  if (b.data == NULL) {
    printf("out of memory\n");
    exit(1);
  }
  memset(b.data, kSentinel, b.elems * sizeof(float));
  kv.data = b.data;
  kv.size_bytes = b.elems * sizeof(float);
  kv.num_tokens = tokens;
  kv.dtype = KDN_DTYPE_F32;
  if (kind != LAYOUT_CANONICAL) {
    kv.stride_layer = b.st.layer;
    kv.stride_kv = b.st.kv;
    kv.stride_token = b.st.token;
    kv.stride_head = b.st.head;
    kv.stride_dim = b.st.dim;
  }
  b.kv = kv;
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
  CHECK_OK(kdn_runtime_stats(runtime, &stats));
  return stats;
}

static uint64_t lookup(kdn_runtime *rt, const kdn_model *m, const char *ns, const int32_t *tokens, size_t n) {
  uint64_t cached = 12345;
  CHECK_OK(kdn_lookup(rt, m, ns, strlen(ns), tokens, n, &cached));
  return cached;
}

static uint64_t store(kdn_runtime *rt, const kdn_model *m, const char *ns, const int32_t *tokens, size_t n,
                      const test_buf *b) {
  uint64_t stored = 12345;
  CHECK_OK(kdn_store(rt, m, ns, strlen(ns), tokens, n, &b->kv, NULL, &stored));
  return stored;
}

/* kdn_retrieve expecting KDN_OK; returns the tokens filled. */
static uint64_t retrieve(kdn_runtime *rt, const kdn_model *m, const char *ns, const int32_t *tokens, size_t n,
                         const test_buf *b) {
  uint64_t filled = 12345;
  CHECK_OK(kdn_retrieve(rt, m, ns, strlen(ns), tokens, n, &b->kv, &filled));
  return filled;
}

/* kdn_retrieve expecting KDN_ERR_NOT_FOUND, *filled 0 and an untouched buffer. */
static void check_retrieve_misses(kdn_runtime *rt, const kdn_model *m, const char *ns, const int32_t *tokens,
                                  size_t n, int line) {
  test_buf b = buf_new(LAYOUT_CANONICAL, n);
  uint64_t filled = 12345;
  check_error_at(kdn_retrieve(rt, m, ns, strlen(ns), tokens, n, &b.kv, &filled), KDN_ERR_NOT_FOUND, "kdn_retrieve",
                 line);
  check_eq_at(filled, 0, "filled tokens of a miss", line);
  check_at(buf_holds_ref(&b, 0), "a miss writes nothing to the buffer", line);
  buf_free(&b);
}
#define CHECK_RETRIEVE_MISSES(rt, m, ns, tokens, n) check_retrieve_misses(rt, m, ns, tokens, n, __LINE__)

/* ---- Groups ------------------------------------------------------------- */

static void test_versions_and_statuses(void) {
  char version[64];
  group_begin("versions, status names, destroy(NULL)");
  CHECK_EQ(kdn_version_number(), KDN_VERSION_NUMBER);
  CHECK_EQ(KDN_VERSION_NUMBER, KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH);
  snprintf(version, sizeof version, "%d.%d.%d", KDN_VERSION_MAJOR, KDN_VERSION_MINOR, KDN_VERSION_PATCH);
  CHECK(kdn_version() != NULL && strcmp(kdn_version(), version) == 0);

  /* The values are pinned forever. */
  CHECK(KDN_OK == 0 && KDN_ERR_INVALID_ARGUMENT == -1 && KDN_ERR_NOT_FOUND == -2 && KDN_ERR_RETRY_LATER == -3);
  CHECK(KDN_ERR_UNAVAILABLE == -4 && KDN_ERR_CORRUPT == -5 && KDN_ERR_UNSUPPORTED == -6);
  CHECK(KDN_ERR_NO_MEMORY == -7 && KDN_ERR_INTERNAL == -8);
  CHECK(strcmp(kdn_status_str(KDN_OK), "KDN_OK") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_INVALID_ARGUMENT), "KDN_ERR_INVALID_ARGUMENT") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_NOT_FOUND), "KDN_ERR_NOT_FOUND") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_RETRY_LATER), "KDN_ERR_RETRY_LATER") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_UNAVAILABLE), "KDN_ERR_UNAVAILABLE") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_CORRUPT), "KDN_ERR_CORRUPT") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_UNSUPPORTED), "KDN_ERR_UNSUPPORTED") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_NO_MEMORY), "KDN_ERR_NO_MEMORY") == 0);
  CHECK(strcmp(kdn_status_str(KDN_ERR_INTERNAL), "KDN_ERR_INTERNAL") == 0);
  CHECK(kdn_status_str((kdn_status)-99) != NULL && kdn_status_str((kdn_status)-99)[0] != '\0');
  CHECK(kdn_status_str((kdn_status)1) != NULL && kdn_status_str((kdn_status)1)[0] != '\0');
  CHECK(kdn_status_str(KDN_STATUS_FORCE32_) != NULL);

  /* Before any failure the message is "", never NULL. */
  CHECK(kdn_last_error_message() != NULL && strcmp(kdn_last_error_message(), "") == 0);

  kdn_runtime_destroy(NULL);
  kdn_model_destroy(NULL);
  kdn_runtime_options_init(NULL);
  kdn_model_spec_init(NULL);
  kdn_kv_buffer_init(NULL);
  kdn_store_options_init(NULL);
  kdn_stats_init(NULL);
  check_at(1, "destroy(NULL) and init(NULL) are no-ops", __LINE__);
  group_end();
}

/* Stores the 48 positions from a canonical and from a strided buffer, and
 * reads them back in three layouts; prefixes; statistics. */
static void test_data_path(void) {
  /* The 48 positions followed by 12 tokens never stored. */
  int32_t longer[POSITIONS + 12];
  int32_t other_start[POSITIONS];
  static const int32_t extra[12] = {267, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  test_buf canonical = buf_new(LAYOUT_CANONICAL, POSITIONS);
  test_buf file = buf_new(LAYOUT_FILE, POSITIONS);
  kdn_stats s;
  uint64_t bytes_per_token = 0;

  memcpy(longer, kTokens, sizeof kTokens);
  memcpy(longer + POSITIONS, extra, sizeof extra);
  memcpy(other_start, kTokens, sizeof kTokens);
  other_start[0] = 2;
  write_ref(canonical.data, &canonical.st, POSITIONS);
  memcpy(file.data, g_ref, KV_BYTES); /* the files' bytes, as they are */

  group_begin("store: canonical and strided (file) layouts");
  CHECK_OK(kdn_model_kv_bytes_per_token(m, &bytes_per_token));
  CHECK_EQ(bytes_per_token, BYTES_PER_TOKEN);
  s = get_stats(rt);
  CHECK(s.lookups == 0 && s.retrieves == 0 && s.stores == 0 && s.chunks == 0 && s.used_bytes == 0);
  CHECK_EQ(s.capacity_bytes, (uint64_t)1 << 30);

  CHECK_EQ(lookup(rt, m, "canonical", kTokens, POSITIONS), 0);                 /* lookups 1 */
  CHECK_RETRIEVE_MISSES(rt, m, "canonical", kTokens, POSITIONS);                /* retrieves 1, misses 1 */
  CHECK_EQ(store(rt, m, "canonical", kTokens, POSITIONS, &canonical), POSITIONS); /* stores 1: 3 chunks */
  s = get_stats(rt);
  CHECK_EQ(s.chunks, 3);
  CHECK_EQ(s.used_bytes, KV_HELD);
  CHECK_EQ(s.tokens_stored, POSITIONS);
  {
    /* Again, with explicit store options: every chunk is there already. */
    kdn_store_options options = KDN_STORE_OPTIONS_INIT;
    uint64_t stored = 0;
    CHECK_OK(kdn_store(rt, m, "canonical", 9, kTokens, POSITIONS, &canonical.kv, &options, &stored)); /* stores 2 */
    CHECK_EQ(stored, POSITIONS);
    s = get_stats(rt);
    CHECK_EQ(s.chunks, 3);
    CHECK_EQ(s.tokens_stored, POSITIONS);
  }
  CHECK_EQ(lookup(rt, m, "canonical", kTokens, POSITIONS), POSITIONS);        /* lookups 2 */
  CHECK_EQ(store(rt, m, "strided", kTokens, POSITIONS, &file), POSITIONS);    /* stores 3: 3 more chunks */
  CHECK_EQ(lookup(rt, m, "strided", kTokens, POSITIONS), POSITIONS);          /* lookups 3 */
  CHECK(buf_holds_ref(&canonical, POSITIONS) && memcmp(file.data, g_ref, KV_BYTES) == 0); /* inputs untouched */
  group_end();

  group_begin("retrieve: every layout, bit for bit");
  {
    test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS);
    CHECK_EQ(retrieve(rt, m, "canonical", kTokens, POSITIONS, &out), POSITIONS); /* retrieves 2, hits 3 */
    CHECK(buf_holds_ref(&out, POSITIONS));
    CHECK(memcmp(out.data, canonical.data, KV_BYTES) == 0);
    buf_free(&out);
  }
  {
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    CHECK_EQ(retrieve(rt, m, "strided", kTokens, POSITIONS, &out), POSITIONS);   /* retrieves 3, hits 6 */
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    buf_free(&out);
  }
  {
    /* Stored canonical, read strided: the layouts are only the caller's. */
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    CHECK_EQ(retrieve(rt, m, "canonical", kTokens, POSITIONS, &out), POSITIONS); /* retrieves 4, hits 9 */
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    buf_free(&out);
  }
  {
    test_buf out = buf_new(LAYOUT_TRANSPOSED, POSITIONS);
    CHECK_EQ(retrieve(rt, m, "strided", kTokens, POSITIONS, &out), POSITIONS);   /* retrieves 5, hits 12 */
    CHECK(buf_holds_ref(&out, POSITIONS));
    buf_free(&out);
  }
  group_end();

  /* Chunks of 20: [0,20) and [20,40) chain; the partial [40,48) is indexed
   * under [20,40) and matches a request holding at least its 8 tokens. Only
   * whole stored chunks count, so a request ending inside one stops before it. */
  group_begin("prefixes, longer and different requests");
  CHECK_EQ(lookup(rt, m, "canonical", kTokens, 16), 0);                 /* inside the first chunk; lookups 4 */
  CHECK_EQ(lookup(rt, m, "canonical", kTokens, 20), 20);                /* lookups 5 */
  CHECK_EQ(lookup(rt, m, "canonical", kTokens, 30), 20);                /* lookups 6 */
  CHECK_EQ(lookup(rt, m, "canonical", kTokens, 44), 40);                /* the partial needs 8; lookups 7 */
  CHECK_EQ(lookup(rt, m, "canonical", longer, POSITIONS + 5), POSITIONS);  /* 13 left < a chunk; lookups 8 */
  CHECK_EQ(lookup(rt, m, "canonical", longer, POSITIONS + 12), POSITIONS); /* 20 left, no such chunk; lookups 9 */
  {
    /* The first 20 tokens into a 48-token buffer: tokens 20.. stay untouched. */
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    CHECK_EQ(retrieve(rt, m, "canonical", kTokens, 20, &out), 20);      /* retrieves 6, hits 13 */
    CHECK(buf_holds_ref(&out, 20));
    memset(out.data, kSentinel, out.elems * sizeof(float));
    CHECK_EQ(retrieve(rt, m, "canonical", kTokens, 30, &out), 20);      /* retrieves 7, hits 14, misses 2 */
    CHECK(buf_holds_ref(&out, 20));
    buf_free(&out);
  }
  {
    test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS + 12);
    CHECK_EQ(retrieve(rt, m, "strided", longer, POSITIONS + 12, &out), POSITIONS); /* retrieves 8, hits 17, misses 3 */
    CHECK(buf_holds_ref(&out, POSITIONS));
    buf_free(&out);
  }
  CHECK_EQ(lookup(rt, m, "canonical", other_start, POSITIONS), 0);      /* lookups 10 */
  CHECK_RETRIEVE_MISSES(rt, m, "canonical", other_start, POSITIONS);     /* retrieves 9, misses 4 */
  group_end();

  group_begin("statistics");
  s = get_stats(rt);
  CHECK_EQ(s.struct_size, sizeof(kdn_stats));
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
  {
    /* An older caller's struct that ends after `lookups`: nothing beyond it
     * is written, and its struct_size is kept. */
    kdn_stats old;
    memset(&old, 0xEE, sizeof old);
    old.struct_size = (uint32_t)(offsetof(kdn_stats, lookups) + sizeof old.lookups);
    CHECK_OK(kdn_runtime_stats(rt, &old));
    CHECK_EQ(old.struct_size, offsetof(kdn_stats, lookups) + sizeof old.lookups);
    CHECK_EQ(old.lookups, 10);
    CHECK_EQ(old.retrieves, 0xEEEEEEEEEEEEEEEEull);
    CHECK_EQ(old.evictions, 0xEEEEEEEEEEEEEEEEull);
  }
  group_end();

  buf_free(&canonical);
  buf_free(&file);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

static void test_tenants_and_fingerprints(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  write_ref(kv.data, &kv.st, POSITIONS);

  group_begin("tenant isolation");
  CHECK_EQ(store(rt, m, "tenant-a", kTokens, POSITIONS, &kv), POSITIONS);
  CHECK_EQ(lookup(rt, m, "tenant-a", kTokens, POSITIONS), POSITIONS);
  CHECK_EQ(lookup(rt, m, "tenant-b", kTokens, POSITIONS), 0);
  CHECK_RETRIEVE_MISSES(rt, m, "tenant-b", kTokens, POSITIONS);
  {
    /* Namespaces are (pointer, length): "tenant-a" cut to 7 bytes is another
     * tenant, and a longer string cut to 8 bytes is tenant-a. */
    uint64_t cached = 12345;
    CHECK_OK(kdn_lookup(rt, m, "tenant-a", 7, kTokens, POSITIONS, &cached));
    CHECK_EQ(cached, 0);
    CHECK_OK(kdn_lookup(rt, m, "tenant-a/other", 8, kTokens, POSITIONS, &cached));
    CHECK_EQ(cached, POSITIONS);
  }
  group_end();

  group_begin("model fingerprints");
  {
    kdn_model *other = new_model(rt, "stories260K-finetuned"); /* same shape, other weights */
    kdn_model *same = new_model(rt, FINGERPRINT);              /* registered again */
    kdn_model_spec spec = stories260k_spec("stories260K and more");
    kdn_model *cut = NULL;
    kdn_model *theta = NULL;
    uint8_t fp[4][32];
    static const uint8_t zeros[32];

    spec.fingerprint_len = strlen(FINGERPRINT); /* (pointer, length): "stories260K" */
    CHECK_OK(kdn_model_create(rt, &spec, &cut));
    spec = stories260k_spec(FINGERPRINT);
    spec.rope_theta = 500000.0f; /* the KV of another RoPE base is not this KV */
    CHECK_OK(kdn_model_create(rt, &spec, &theta));

    CHECK_EQ(lookup(rt, other, "tenant-a", kTokens, POSITIONS), 0);
    CHECK_RETRIEVE_MISSES(rt, other, "tenant-a", kTokens, POSITIONS);
    CHECK_EQ(lookup(rt, theta, "tenant-a", kTokens, POSITIONS), 0);
    CHECK_EQ(lookup(rt, same, "tenant-a", kTokens, POSITIONS), POSITIONS);
    CHECK_EQ(lookup(rt, cut, "tenant-a", kTokens, POSITIONS), POSITIONS);
    {
      test_buf out = buf_new(LAYOUT_CANONICAL, POSITIONS);
      CHECK_EQ(retrieve(rt, same, "tenant-a", kTokens, POSITIONS, &out), POSITIONS);
      CHECK(buf_holds_ref(&out, POSITIONS));
      buf_free(&out);
    }

    CHECK_OK(kdn_model_fingerprint(m, fp[0]));
    CHECK_OK(kdn_model_fingerprint(same, fp[1]));
    CHECK_OK(kdn_model_fingerprint(other, fp[2]));
    CHECK_OK(kdn_model_fingerprint(theta, fp[3]));
    CHECK(memcmp(fp[0], zeros, 32) != 0);
    CHECK(memcmp(fp[0], fp[1], 32) == 0);
    CHECK(memcmp(fp[0], fp[2], 32) != 0);
    CHECK(memcmp(fp[0], fp[3], 32) != 0);

    kdn_model_destroy(theta);
    kdn_model_destroy(cut);
    kdn_model_destroy(same);
    kdn_model_destroy(other);
  }
  group_end();

  buf_free(&kv);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

static void test_capacity(void) {
  test_buf kv = buf_new(LAYOUT_CANONICAL, POSITIONS);
  write_ref(kv.data, &kv.st, POSITIONS);

  group_begin("small capacity: stores what fits, fails nothing");
  {
    /* Smaller than one chunk: nothing fits, nothing fails. */
    kdn_runtime *rt = new_runtime(CHUNK, CHUNK_BYTES - 1);
    kdn_model *m = new_model(rt, FINGERPRINT);
    kdn_stats s;
    CHECK_EQ(store(rt, m, "ns", kTokens, POSITIONS, &kv), 0);
    s = get_stats(rt);
    CHECK(s.chunks == 0 && s.used_bytes == 0 && s.tokens_stored == 0 && s.evictions == 0);
    CHECK_EQ(lookup(rt, m, "ns", kTokens, POSITIONS), 0);
    CHECK_RETRIEVE_MISSES(rt, m, "ns", kTokens, POSITIONS);
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
  }
  {
    /* Room for exactly one sequence: a second one evicts the first (least
     * recently used), chunk by chunk, and is served whole. */
    kdn_runtime *rt = new_runtime(CHUNK, KV_HELD);
    kdn_model *m = new_model(rt, FINGERPRINT);
    test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
    kdn_stats s;
    CHECK_EQ(store(rt, m, "first", kTokens, POSITIONS, &kv), POSITIONS);
    CHECK_EQ(get_stats(rt).evictions, 0);
    CHECK_EQ(store(rt, m, "second", kTokens, POSITIONS, &kv), POSITIONS);
    s = get_stats(rt);
    CHECK_EQ(s.evictions, 3);
    CHECK_EQ(s.chunks, 3);
    CHECK_EQ(s.used_bytes, KV_HELD);
    CHECK_EQ(s.tokens_stored, 2 * POSITIONS);
    CHECK_EQ(lookup(rt, m, "first", kTokens, POSITIONS), 0);
    CHECK_EQ(retrieve(rt, m, "second", kTokens, POSITIONS, &out), POSITIONS);
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    buf_free(&out);
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
  }
  {
    /* Room for two chunks of a three-chunk sequence: the store keeps the
     * longest prefix that fits and never evicts its own chunks, so what it
     * reports is what a lookup then finds. */
    kdn_runtime *rt = new_runtime(CHUNK, 2 * CHUNK_HELD);
    kdn_model *m = new_model(rt, FINGERPRINT);
    kdn_stats s;
    CHECK_EQ(store(rt, m, "ns", kTokens, POSITIONS, &kv), 2 * CHUNK);
    s = get_stats(rt);
    CHECK_EQ(s.evictions, 0);
    CHECK_EQ(s.chunks, 2);
    CHECK_EQ(s.used_bytes, 2 * CHUNK_HELD);
    CHECK(s.used_bytes <= s.capacity_bytes);
    CHECK_EQ(s.tokens_stored, 2 * CHUNK);
    CHECK_EQ(lookup(rt, m, "ns", kTokens, POSITIONS), 2 * CHUNK);
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
  }
  group_end();
  buf_free(&kv);
}

static void test_bad_runtime_and_model_arguments(void) {
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  kdn_runtime *out_rt;
  kdn_model *out_m;
  kdn_runtime_options ro;
  kdn_model_spec spec;
  uint64_t bytes = 0;
  uint8_t fp[32];

  group_begin("bad arguments: runtime options");
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(NULL, NULL));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.struct_size = 0;
  out_rt = (kdn_runtime *)&ro; /* not NULL: a failure must set it to NULL */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  CHECK(out_rt == NULL);
  ro.struct_size = (uint32_t)offsetof(kdn_runtime_options, hash_seed); /* too small: no hash_seed */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro.chunk_tokens = 65537;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  ro = (kdn_runtime_options)KDN_RUNTIME_OPTIONS_INIT;
  ro.host_capacity_bytes = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&ro, &out_rt));
  CHECK(out_rt == NULL);
  {
    /* NULL options mean defaults; a newer caller's longer struct is fine. */
    struct {
      kdn_runtime_options base;
      uint64_t field_of_a_later_version;
    } newer;
    kdn_stats s;
    kdn_runtime_options_init(&newer.base);
    newer.base.struct_size = (uint32_t)sizeof newer;
    newer.base.chunk_tokens = 7;
    newer.field_of_a_later_version = 42;
    CHECK_OK(kdn_runtime_create(NULL, &out_rt));
    s = get_stats(out_rt);
    CHECK_EQ(s.capacity_bytes, (uint64_t)1 << 30);
    kdn_runtime_destroy(out_rt);
    CHECK_OK(kdn_runtime_create(&newer.base, &out_rt));
    CHECK(out_rt != NULL);
    kdn_runtime_destroy(out_rt);
  }
  group_end();

  group_begin("bad arguments: model specs");
  out_m = (kdn_model *)&spec;
  spec = stories260k_spec(FINGERPRINT);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, NULL));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(NULL, &spec, &out_m));
  CHECK(out_m == NULL);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, NULL, &out_m));
  spec.struct_size = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec.struct_size = (uint32_t)offsetof(kdn_model_spec, fingerprint); /* too small */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.num_layers = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.num_kv_heads = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.head_dim = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.rotary_dim = 7; /* odd */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec.rotary_dim = HEAD_DIM + 2; /* beyond the head */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.head_dim = 7; /* rotary_dim 0 means head_dim: odd */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.dtype = (kdn_dtype)3;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.rope_style = (kdn_rope_style)2;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.fingerprint_len = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec.fingerprint = NULL;
  spec.fingerprint_len = 5;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec = stories260k_spec(FINGERPRINT);
  spec.rope_theta = 0.0f;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec.rope_theta = -10000.0f;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec.rope_theta = (float)NAN;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  spec.rope_theta = (float)INFINITY;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(rt, &spec, &out_m));
  CHECK(out_m == NULL);

  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_fingerprint(NULL, fp));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_fingerprint(m, NULL));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_kv_bytes_per_token(NULL, &bytes));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_model_kv_bytes_per_token(m, NULL));
  group_end();

  group_begin("bad arguments: statistics");
  {
    kdn_stats s = KDN_STATS_INIT;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_stats(NULL, &s));
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_stats(rt, NULL));
    s.struct_size = 0;
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_stats(rt, &s));
    s.struct_size = 4; /* not even the header */
    CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_stats(rt, &s));
  }
  group_end();

  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

static void test_bad_call_arguments(void) {
  static const char ns[] = "bad-args";
  const size_t ns_len = sizeof ns - 1;
  const size_t n = POSITIONS;
  int32_t negative[POSITIONS];
  char long_ns[4097];
  kdn_runtime *rt = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_runtime *rt_b = new_runtime(CHUNK, (uint64_t)1 << 30);
  kdn_model *m = new_model(rt, FINGERPRINT);
  kdn_model *m_b = new_model(rt_b, FINGERPRINT); /* registered with rt_b */
  test_buf in = buf_new(LAYOUT_CANONICAL, POSITIONS);
  test_buf out = buf_new(LAYOUT_FILE, POSITIONS);
  kdn_kv_buffer kv;
  kdn_store_options so;
  uint64_t result = 0;
  write_ref(in.data, &in.st, POSITIONS);
  memcpy(negative, kTokens, sizeof kTokens);
  negative[3] = -1;
  memset(long_ns, 'n', sizeof long_ns);

  group_begin("bad arguments: lookup");
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(NULL, m, ns, ns_len, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, NULL, ns, ns_len, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m_b, ns, ns_len, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, NULL, ns_len, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, NULL, 0, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, ns, 0, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, long_ns, sizeof long_ns, kTokens, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, ns, ns_len, NULL, n, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, ns, ns_len, kTokens, 0, &result));
  result = 12345;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, ns, ns_len, negative, n, &result));
  CHECK_EQ(result, 0);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_lookup(rt, m, ns, ns_len, kTokens, n, NULL));
  group_end();

  group_begin("bad arguments: store");
  result = 12345;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(NULL, m, ns, ns_len, kTokens, n, &in.kv, NULL, &result));
  CHECK_EQ(result, 0);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, NULL, ns, ns_len, kTokens, n, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m_b, ns, ns_len, kTokens, n, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, NULL, ns_len, kTokens, n, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, 0, kTokens, n, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, ns_len, NULL, n, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, ns_len, kTokens, 0, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, ns_len, negative, n, &in.kv, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, ns_len, kTokens, n, NULL, NULL, &result));
  so = (kdn_store_options)KDN_STORE_OPTIONS_INIT;
  so.struct_size = 0;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, ns_len, kTokens, n, &in.kv, &so, &result));
  so.struct_size = 4; /* too small */
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_store(rt, m, ns, ns_len, kTokens, n, &in.kv, &so, &result));
  group_end();

  /* The same buffer checks apply to store and retrieve. */
  group_begin("bad arguments: KV buffers (store, retrieve)");
#define CHECK_BAD_KV(want, buffer)                                                                 \
  do {                                                                                             \
    CHECK_ERROR(want, kdn_store(rt, m, ns, ns_len, kTokens, n, (buffer), NULL, &result));          \
    CHECK_ERROR(want, kdn_retrieve(rt, m, ns, ns_len, kTokens, n, (buffer), &result));             \
  } while (0)
  kv = in.kv;
  kv.data = NULL;
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = in.kv;
  kv.num_tokens = n - 1; /* fewer tokens than the request */
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = in.kv;
  kv.size_bytes = KV_BYTES - 1; /* the canonical layout reaches one byte further */
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = out.kv;
  kv.size_bytes = KV_BYTES - 1; /* so does the strided one */
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = out.kv;
  kv.stride_token = -TOKEN_ELEMS;
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = in.kv;
  kv.stride_layer = -1; /* one negative stride, the rest 0: not canonical */
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = out.kv;
  kv.stride_head = (int64_t)1 << 41;
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = in.kv;
  kv.dtype = KDN_DTYPE_F16; /* the model is F32 */
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv = in.kv;
  kv.memory = (kdn_memory_kind)7;
  CHECK_BAD_KV(KDN_ERR_UNSUPPORTED, &kv);
  kv = in.kv;
  kv.struct_size = 0;
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
  kv.struct_size = (uint32_t)offsetof(kdn_kv_buffer, stride_dim); /* too small */
  CHECK_BAD_KV(KDN_ERR_INVALID_ARGUMENT, &kv);
#undef CHECK_BAD_KV
  group_end();

  group_begin("bad arguments: retrieve");
  result = 12345;
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(NULL, m, ns, ns_len, kTokens, n, &out.kv, &result));
  CHECK_EQ(result, 0);
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, NULL, ns, ns_len, kTokens, n, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m_b, ns, ns_len, kTokens, n, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, NULL, ns_len, kTokens, n, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, ns, 0, kTokens, n, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, ns, ns_len, NULL, n, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, ns, ns_len, kTokens, 0, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, ns, ns_len, negative, n, &out.kv, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, ns, ns_len, kTokens, n, NULL, &result));
  CHECK_ERROR(KDN_ERR_INVALID_ARGUMENT, kdn_retrieve(rt, m, ns, ns_len, kTokens, n, &out.kv, NULL));
  CHECK(buf_holds_ref(&out, 0)); /* no failed call wrote to it */
  group_end();

  group_begin("after the bad arguments");
  {
    /* No failed call stored anything or counted as a call. */
    kdn_stats s = get_stats(rt);
    CHECK(s.stores == 0 && s.retrieves == 0 && s.lookups == 0 && s.chunks == 0);
    /* The same arguments, corrected, work; out_stored_tokens is optional. */
    CHECK_OK(kdn_store(rt, m, ns, ns_len, kTokens, n, &in.kv, NULL, NULL));
    CHECK_EQ(retrieve(rt, m, ns, kTokens, n, &out), POSITIONS);
    CHECK(memcmp(out.data, g_ref, KV_BYTES) == 0);
    CHECK_EQ(lookup(rt_b, m_b, ns, kTokens, n), 0); /* runtimes share nothing */
  }
  group_end();

  buf_free(&in);
  buf_free(&out);
  kdn_model_destroy(m_b);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt_b);
  kdn_runtime_destroy(rt);
}

int main(void) {
  const kdn_model_spec probe_spec = stories260k_spec("probe");
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

  if (kdn_runtime_create(NULL, &g_probe_runtime) != KDN_OK ||
      kdn_model_create(g_probe_runtime, &probe_spec, &g_probe_model) != KDN_OK) {
    printf("FAILED: cannot create a runtime and a model: %s\n", kdn_last_error_message());
    return 1;
  }

  test_versions_and_statuses();
  test_data_path();
  test_tenants_and_fingerprints();
  test_capacity();
  test_bad_runtime_and_model_arguments();
  test_bad_call_arguments();

  kdn_model_destroy(g_probe_model);
  kdn_runtime_destroy(g_probe_runtime);
  free(g_ref);
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
