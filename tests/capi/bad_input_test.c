// SPDX-License-Identifier: Apache-2.0
/* Bad input through every function of the C ABI: each case is its own ctest
 * test (capi.bad_input.<case>; docs/abi.md has the table). Every case checks
 * the exact status, that kdn_last_error_message() says why, that
 * out-parameters got their neutral value, that nothing was stored or written
 * where that matters, and that the next successful call clears the message.
 *
 *   capi_bad_input --list     the case names, one a line
 *   capi_bad_input <case>     runs one case: exit 0 passed, 1 failed,
 *                             77 the reference model is missing, 2 no such case
 */
#define KDN_EXPERIMENTAL
#include "robustness.h"

#include <math.h>

/* ---- Fixtures ---------------------------------------------------------------
 * One runtime (chunks of 16 tokens, a 64 MiB host tier) and the reference
 * model, a document "fixture" (the 48 reference tokens) stored in it. */
enum { CHUNK = 16, SENTINEL = 0xA5, PAGE_BLOCKS = 4, PAGE_ELEMS = PAGE_BLOCKS * CHUNK * TOKEN_ELEMS };

static kdn_runtime *g_rt;
static kdn_model *g_m;
static float g_src[POSITIONS * ELEMS_PER_TOKEN]; /* the reference KV, canonical, 48 tokens */
static float g_dst[POSITIONS * ELEMS_PER_TOKEN]; /* an output buffer, all SENTINEL bytes */
static float g_pages[LAYERS * 2][PAGE_ELEMS];    /* per-layer paged K and V, all SENTINEL bytes */
static char g_junk;                              /* a non-NULL handle value put into out-parameters */
#define JUNK(T) ((T *)(void *)&g_junk)

static const char kNs[] = "bad";
#define NS kNs, (sizeof kNs - 1)
#define STR(s) s, (sizeof s - 1)
static const uint32_t kAllLayers[LAYERS] = {0, 1, 2, 3, 4};
static const int32_t kTable[3] = {2, 0, 3}; /* 48 tokens in blocks of 16 */

static void dst_reset(void) {
  memset(g_dst, SENTINEL, sizeof g_dst);
  memset(g_pages, SENTINEL, sizeof g_pages);
}

static int dst_untouched(void) {
  return bytes_are(g_dst, sizeof g_dst, SENTINEL) && bytes_are(g_pages, sizeof g_pages, SENTINEL);
}

/* ---- The check every bad call gets -------------------------------------------
 * The exact status; a message; and the next successful call (on the fixture
 * model) leaves the message empty. Prints the status and message, so the
 * ctest log shows what a caller would see. */
static void expect_at(kdn_status got, kdn_status want, const char *what, int line) {
  const char *message = kdn_last_error_message(); /* read before any other kdn call */
  char text[400];
  const int has_message = message != NULL && message[0] != '\0';
  uint64_t bytes = 0;
  kdn_status probe;
  snprintf(text, sizeof text, "%s", message != NULL ? message : "(NULL)");
  ++g_checks;
  if (got != want) {
    ++g_failures;
    printf("  FAILED (line %d): %s\n    returned %s (%d), want %s: \"%s\"\n", line, what, kdn_status_string(got),
           (int)got, kdn_status_string(want), text);
  } else {
    printf("  %-25s \"%s\"\n      from %s\n", kdn_status_string(got), text, what);
  }
  rb_check_at(has_message, "the failure sets kdn_last_error_message()", line);
  probe = kdn_model_get_kv_bytes_per_token(g_m, &bytes);
  rb_check_at(probe == KDN_OK && bytes == BYTES_PER_TOKEN && strcmp(kdn_last_error_message(), "") == 0,
              "a following successful call leaves kdn_last_error_message() empty", line);
}
#define EXPECT(want, call) expect_at((call), (want), #call, __LINE__)

/* ---- Small helpers -------------------------------------------------------- */

static kdn_kv_view src_view(void) { return canon_view(g_src, POSITIONS); }
static kdn_kv_view dst_view(void) { return canon_view(g_dst, POSITIONS); }

/* A view of g_pages: per-layer K and V, PAGED_NHD, blocks of 16, kTable. */
static void *g_k_ptrs[LAYERS];
static void *g_v_ptrs[LAYERS];
static kdn_kv_view paged_view(void) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  int l;
  for (l = 0; l < LAYERS; ++l) {
    g_k_ptrs[l] = g_pages[2 * l];
    g_v_ptrs[l] = g_pages[2 * l + 1];
  }
  v.layout = KDN_LAYOUT_PAGED_NHD;
  v.k_layers = g_k_ptrs;
  v.v_layers = g_v_ptrs;
  v.block_size = CHUNK;
  v.block_table = kTable;
  v.block_table_len = 3;
  v.num_blocks = PAGE_BLOCKS;
  return v;
}

static kdn_request ref_request(void) { return token_request(kTokens, POSITIONS); }

/* ---- Output structs -------------------------------------------------------------
 * An output struct the library accepts (not NULL, struct_size at least its
 * first published size) is written with its defaults as soon as the call has
 * checked it, so a failed call leaves it neutral: filled_size set, every
 * field its _INIT value. One it refuses (a bad struct_size) is not written at
 * all. PRIME fills a struct with SENTINEL bytes but for struct_size, so that
 * every byte the library writes, or leaves, shows. */
static void prime_at(void *out, size_t size, uint32_t struct_size) {
  memset(out, SENTINEL, size);
  memcpy(out, &struct_size, sizeof struct_size);
}
#define PRIME(s) prime_at(&(s), sizeof(s), (uint32_t)sizeof(s))

/* 1 when nothing but struct_size was ever written (after PRIME). */
static int unwritten(const void *out, size_t size) {
  return bytes_are((const unsigned char *)out + sizeof(uint32_t), size - sizeof(uint32_t), SENTINEL);
}

/* is_default_<T>(p): *p holds T's _INIT values, filled_size sizeof(T). */
#define DEFAULTS_CHECK(T, INIT)              \
  static int is_default_##T(const T *p) {    \
    T want = INIT;                           \
    want.filled_size = (uint32_t)sizeof(T);  \
    return memcmp(p, &want, sizeof want) == 0; \
  }
DEFAULTS_CHECK(kdn_document_info, KDN_DOCUMENT_INFO_INIT)
DEFAULTS_CHECK(kdn_stats, KDN_STATS_INIT)
DEFAULTS_CHECK(kdn_latency, KDN_LATENCY_INIT)
DEFAULTS_CHECK(kdn_tier_stats, KDN_TIER_STATS_INIT)

/* A kdn_kv_result must hold exactly this outcome (filled_size 48, no failed
 * ranges, no flags: the fixture's tier is raw). */
static void check_result_at(const kdn_kv_result *r, kdn_op_state state, kdn_status status, uint64_t tokens,
                            uint64_t covered, const char *what, int line) {
  kdn_kv_result want = KDN_KV_RESULT_INIT;
  want.filled_size = KDN_KV_RESULT_SIZE_V1;
  want.state = state;
  want.status = status;
  want.tokens = tokens;
  want.covered = covered;
  ++g_checks;
  if (memcmp(r, &want, sizeof want) == 0) return;
  ++g_failures;
  printf("  FAILED (line %d): %s: kdn_kv_result {struct_size %u, filled_size %u, state %d, status %s, tokens %llu, "
         "covered %llu, num_failed %llu, flags %u, reserved0 %u}, want {%u, %u, %d, %s, %llu, %llu, 0, 0, 0}\n",
         line, what, (unsigned)r->struct_size, (unsigned)r->filled_size, (int)r->state, kdn_status_string(r->status),
         (unsigned long long)r->tokens, (unsigned long long)r->covered, (unsigned long long)r->num_failed,
         (unsigned)r->flags, (unsigned)r->reserved0, (unsigned)want.struct_size, (unsigned)want.filled_size,
         (int)state, kdn_status_string(status), (unsigned long long)tokens, (unsigned long long)covered);
}
/* The neutral result of a failed call: the defaults (state KDN_OP_PENDING,
 * status KDN_OK, every count 0), filled_size 48. */
#define CHECK_RESULT_NEUTRAL(r) check_result_at((r), KDN_OP_PENDING, KDN_OK, 0, 0, "neutral after a failure", __LINE__)
#define CHECK_RESULT(r, state, status, tokens, covered) \
  check_result_at((r), (state), (status), (tokens), (covered), #r, __LINE__)

static uint64_t stats_chunks(void) {
  kdn_stats s;
  kdn_stats_init(&s, sizeof s);
  CHECK_OK(kdn_runtime_get_stats(g_rt, &s));
  return s.chunks;
}

static uint64_t cached_tokens(const char *ns, size_t ns_len, const int32_t *tokens, size_t n) {
  const kdn_request r = token_request(tokens, n);
  kdn_lookup_result res;
  kdn_lookup_result_init(&res, sizeof res);
  CHECK_OK(kdn_kv_lookup(g_m, ns, ns_len, &r, 1, &res));
  CHECK_OK(res.status);
  return res.cached_tokens;
}

static int doc_exists(const char *doc, size_t len) {
  kdn_document_info info;
  kdn_status s;
  kdn_document_info_init(&info, sizeof info);
  s = kdn_knowledge_get_info(g_m, NS, doc, len, &info);
  CHECK(s == KDN_OK || s == KDN_ERR_NOT_FOUND);
  return s == KDN_OK;
}

/* Ends an op that should never have started. */
static void drop_op(kdn_op *op) {
  if (op == NULL || op == JUNK(kdn_op)) return;
  kdn_op_cancel(op);
  kdn_op_destroy(op);
}

/* Every call that takes views, with these (bad) views and the 48 reference
 * tokens: each returns `want` (the fetch of the fixture `want_fetch`),
 * leaves its out-parameters neutral, stores nothing and writes nothing. */
static void expect_views_at(const kdn_kv_view *views, size_t n, kdn_status want, kdn_status want_fetch, int line) {
  const kdn_request req = ref_request();
  const uint64_t chunks = stats_chunks();
  static const char ns[] = "views";
  kdn_kv_result out;
  kdn_op *op = JUNK(kdn_op);
  int32_t tokens[POSITIONS];
  memset(tokens, SENTINEL, sizeof tokens);

  PRIME(out);
  expect_at(kdn_kv_store(g_m, STR(ns), &req, views, n, &out), want, "kdn_kv_store(views)", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_kv_store: out is neutral", line);
  PRIME(out);
  expect_at(kdn_kv_retrieve(g_m, STR(ns), &req, views, n, &out), want, "kdn_kv_retrieve(views)", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_kv_retrieve: out is neutral", line);
  expect_at(kdn_kv_load_async(g_m, STR(ns), &req, views, n, &op), want, "kdn_kv_load_async(views)", line);
  rb_check_at(op == NULL, "kdn_kv_load_async: *out is NULL", line);
  drop_op(op);
  op = JUNK(kdn_op);
  expect_at(kdn_kv_save_async(g_m, STR(ns), &req, views, n, &op), want, "kdn_kv_save_async(views)", line);
  rb_check_at(op == NULL, "kdn_kv_save_async: *out is NULL", line);
  drop_op(op);
  expect_at(kdn_knowledge_put(g_m, STR(ns), STR("doc"), 1, NULL, 0, kTokens, POSITIONS, views, n), want,
            "kdn_knowledge_put(views)", line);
  PRIME(out);
  expect_at(kdn_knowledge_fetch(g_m, NS, STR("fixture"), views, n, tokens, POSITIONS, &out), want_fetch,
            "kdn_knowledge_fetch(views)", line);
  if (want_fetch == KDN_ERR_BUFFER_TOO_SMALL) /* says the document's length */
    check_result_at(&out, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, POSITIONS, 0, "kdn_knowledge_fetch: out", line);
  else
    check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_knowledge_fetch: out is neutral", line);
  rb_check_at(bytes_are(tokens, sizeof tokens, SENTINEL), "kdn_knowledge_fetch wrote no tokens", line);

  rb_check_eq_at(stats_chunks(), chunks, "no chunk was stored", line);
  rb_check_eq_at(cached_tokens(STR(ns), kTokens, POSITIONS), 0, "the tokens are not cached", line);
  {
    kdn_document_info info;
    kdn_document_info_init(&info, sizeof info);
    rb_check_at(kdn_knowledge_get_info(g_m, STR(ns), STR("doc"), &info) == KDN_ERR_NOT_FOUND,
                "no document was stored", line);
  }
  rb_check_at(dst_untouched(), "no output buffer was written", line);
}
#define EXPECT_VIEWS(views, n, want, want_fetch) expect_views_at((views), (n), (want), (want_fetch), __LINE__)

/* ---- Status strings ------------------------------------------------------- */

static void case_status_string_unknown(void) {
  static const kdn_status unknown[] = {1, 5, -13, -99, INT32_MIN, INT32_MAX};
  size_t i;
  for (i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
    const char *s = kdn_status_string(unknown[i]);
    CHECK(s != NULL && strcmp(s, "KDN_ERR_UNKNOWN") == 0);
  }
  CHECK(strcmp(kdn_status_string(KDN_OK), "KDN_OK") == 0);
  CHECK(strcmp(kdn_status_string(KDN_ERR_VERSION), "KDN_ERR_VERSION") == 0);
  CHECK(strcmp(kdn_status_string(KDN_ERR_BUFFER_TOO_SMALL), "KDN_ERR_BUFFER_TOO_SMALL") == 0);
  CHECK(strcmp(kdn_last_error_message(), "") == 0); /* not a failed call */
}

/* ---- *_init ------------------------------------------------------------------ */

typedef kdn_status (*init_fn)(void *, size_t);
#define INIT_WRAP(T)                                                       \
  static kdn_status init_##T(void *p, size_t n) { return T##_init((T *)p, n); }
INIT_WRAP(kdn_tier_config)
INIT_WRAP(kdn_runtime_options)
INIT_WRAP(kdn_model_spec)
INIT_WRAP(kdn_request)
INIT_WRAP(kdn_kv_view)
INIT_WRAP(kdn_lookup_result)
INIT_WRAP(kdn_kv_result)
INIT_WRAP(kdn_document_info)
INIT_WRAP(kdn_stats)
INIT_WRAP(kdn_latency)
INIT_WRAP(kdn_tier_stats)
INIT_WRAP(kdn_chunk_info)
INIT_WRAP(kdn_blend_segment)
INIT_WRAP(kdn_blend_options)
INIT_WRAP(kdn_blend_report)

typedef struct {
  const char *name;
  init_fn init;
  size_t size;    /* sizeof */
  size_t size_v1; /* first published size; 0: experimental, none */
} init_entry;

#define INIT_ENTRY(T, v1) {#T "_init", init_##T, sizeof(T), v1}
static const init_entry kInits[] = {
    INIT_ENTRY(kdn_tier_config, KDN_TIER_CONFIG_SIZE_V1),
    INIT_ENTRY(kdn_runtime_options, KDN_RUNTIME_OPTIONS_SIZE_V1),
    INIT_ENTRY(kdn_model_spec, KDN_MODEL_SPEC_SIZE_V1),
    INIT_ENTRY(kdn_request, KDN_REQUEST_SIZE_V1),
    INIT_ENTRY(kdn_kv_view, KDN_KV_VIEW_SIZE_V1),
    INIT_ENTRY(kdn_lookup_result, KDN_LOOKUP_RESULT_SIZE_V1),
    INIT_ENTRY(kdn_kv_result, KDN_KV_RESULT_SIZE_V1),
    INIT_ENTRY(kdn_document_info, KDN_DOCUMENT_INFO_SIZE_V1),
    INIT_ENTRY(kdn_stats, KDN_STATS_SIZE_V1),
    INIT_ENTRY(kdn_latency, KDN_LATENCY_SIZE_V1),
    INIT_ENTRY(kdn_tier_stats, KDN_TIER_STATS_SIZE_V1),
    INIT_ENTRY(kdn_chunk_info, 0),
    INIT_ENTRY(kdn_blend_segment, 0),
    INIT_ENTRY(kdn_blend_options, 0),
    INIT_ENTRY(kdn_blend_report, 0),
};
enum { NUM_INITS = sizeof kInits / sizeof kInits[0] };

static void case_init_null(void) {
  int i;
  for (i = 0; i < NUM_INITS; ++i) {
    printf("  %s(NULL, %lu)\n", kInits[i].name, (unsigned long)kInits[i].size);
    EXPECT(KDN_ERR_INVALID_ARGUMENT, kInits[i].init(NULL, kInits[i].size));
  }
}

/* A size the library cannot accept: nothing is written, not even the bytes
 * the caller said it has. */
static void init_refused(const init_entry *e, size_t size) {
  unsigned char buf[1024];
  memset(buf, SENTINEL, sizeof buf);
  printf("  %s(&s, %lu)\n", e->name, (unsigned long)size);
  EXPECT(KDN_ERR_VERSION, e->init(buf, size));
  CHECK(bytes_are(buf, sizeof buf, SENTINEL));
}

static void case_init_size_zero(void) {
  int i;
  for (i = 0; i < NUM_INITS; ++i) init_refused(&kInits[i], 0);
}

static void case_init_size_small(void) {
  int i;
  for (i = 0; i < NUM_INITS; ++i) {
    init_refused(&kInits[i], 4);
    if (kInits[i].size_v1 != 0) init_refused(&kInits[i], kInits[i].size_v1 - 8);
  }
}

/* ---- Runtimes ---------------------------------------------------------------- */

/* kdn_runtime_create must fail with `want` and leave *out NULL. */
static void expect_no_runtime_at(const kdn_runtime_options *opts, kdn_status want, const char *what, int line) {
  kdn_runtime *rt = JUNK(kdn_runtime);
  expect_at(kdn_runtime_create(opts, &rt), want, what, line);
  rb_check_at(rt == NULL, "kdn_runtime_create: *out is NULL", line);
  if (rt != NULL && rt != JUNK(kdn_runtime)) kdn_runtime_destroy(rt);
}
#define EXPECT_NO_RUNTIME(opts, want, what) expect_no_runtime_at((opts), (want), what, __LINE__)

static void case_runtime_create_null_out(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(NULL, NULL));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create(&opts, NULL));
  kdn_runtime_destroy(NULL); /* a no-op */
}

static void case_runtime_options_size_zero(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.struct_size = 0;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "struct_size 0");
}

static void case_runtime_options_size_small(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.struct_size = KDN_RUNTIME_OPTIONS_SIZE_V1 - 8;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "struct_size KDN_RUNTIME_OPTIONS_SIZE_V1 - 8");
  opts.struct_size = 4;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "struct_size 4");
}

/* A caller compiled with a newer, larger struct. */
typedef struct {
  kdn_runtime_options o;
  uint64_t tail[2];
} newer_runtime_options;

static void case_runtime_options_unknown_tail(void) {
  newer_runtime_options big;
  kdn_runtime *rt = NULL;
  memset(&big, 0, sizeof big);
  kdn_runtime_options_init(&big.o, sizeof big.o);
  big.o.struct_size = sizeof big;
  big.tail[1] = 1;
  EXPECT_NO_RUNTIME(&big.o, KDN_ERR_VERSION, "a nonzero byte past the known fields");
  big.tail[1] = 0; /* an all-zero unknown tail is accepted */
  CHECK_OK(kdn_runtime_create(&big.o, &rt));
  CHECK(rt != NULL);
  kdn_runtime_destroy(rt);
}

static void case_runtime_chunk_tokens_zero(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.chunk_tokens = 0;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "chunk_tokens 0");
}

static void case_runtime_capacity_zero(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.host_capacity_bytes = 0;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "host_capacity_bytes 0");
}

static void case_runtime_tiers_null(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.tiers = NULL;
  opts.num_tiers = 2;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "tiers NULL, num_tiers 2");
}

static void host_tiers(kdn_tier_config *t, size_t n, uint64_t capacity) {
  size_t i;
  for (i = 0; i < n; ++i) {
    kdn_tier_config_init(&t[i], sizeof t[i]);
    t[i].capacity_bytes = capacity;
  }
}

static void case_runtime_too_many_tiers(void) {
  kdn_tier_config tiers[KDN_MAX_TIERS + 1];
  kdn_runtime_options opts;
  kdn_runtime *rt = NULL;
  host_tiers(tiers, KDN_MAX_TIERS + 1, 1u << 20);
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.tiers = tiers;
  opts.num_tiers = KDN_MAX_TIERS + 1;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "KDN_MAX_TIERS + 1 tiers");
  opts.num_tiers = KDN_MAX_TIERS; /* the most there may be */
  CHECK_OK(kdn_runtime_create(&opts, &rt));
  kdn_runtime_destroy(rt);
}

static void case_runtime_worker_threads(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.worker_threads = 65;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "worker_threads 65");
}

static void case_runtime_reserved_nonzero(void) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.reserved0 = 1; /* a field of a later version, set: as an unknown tail */
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "reserved0 1");
}

/* Runtime options with these tiers. */
static kdn_runtime_options with_tiers(const kdn_tier_config *tiers, size_t n) {
  kdn_runtime_options opts;
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.tiers = tiers;
  opts.num_tiers = n;
  return opts;
}

static void case_tier_size_small(void) {
  kdn_tier_config tier;
  kdn_runtime_options opts;
  host_tiers(&tier, 1, 1u << 20);
  tier.struct_size = 0;
  opts = with_tiers(&tier, 1);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "tier struct_size 0");
  tier.struct_size = KDN_TIER_CONFIG_SIZE_V1 - 8;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "tier struct_size KDN_TIER_CONFIG_SIZE_V1 - 8");
}

typedef struct {
  kdn_tier_config c;
  uint64_t tail[2];
} newer_tier_config;

static void case_tier_unknown_tail(void) {
  newer_tier_config big[2];
  kdn_runtime_options opts;
  kdn_runtime *rt = NULL;
  memset(big, 0, sizeof big);
  kdn_tier_config_init(&big[0].c, sizeof big[0].c);
  kdn_tier_config_init(&big[1].c, sizeof big[1].c);
  big[0].c.struct_size = big[1].c.struct_size = sizeof big[0];
  big[0].c.capacity_bytes = big[1].c.capacity_bytes = 1u << 20;
  big[1].tail[0] = 1; /* the second element asks for something unknown */
  opts = with_tiers(&big[0].c, 2);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_VERSION, "tiers[1] has a nonzero unknown tail");
  big[1].tail[0] = 0; /* and the array is read at the caller's stride */
  CHECK_OK(kdn_runtime_create(&opts, &rt));
  kdn_runtime_destroy(rt);
}

static void case_tier_sizes_differ(void) {
  kdn_tier_config tiers[3];
  kdn_runtime_options opts;
  memset(tiers, 0, sizeof tiers);
  host_tiers(tiers, 2, 1u << 20);
  tiers[1].struct_size = sizeof tiers[1] + 8;
  opts = with_tiers(tiers, 2);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "tiers[1].struct_size differs from tiers[0].struct_size");
}

static void case_tier_kind_unknown(void) {
  kdn_tier_config tier;
  kdn_runtime_options opts;
  host_tiers(&tier, 1, 1u << 20);
  tier.kind = (kdn_tier_kind)3;
  opts = with_tiers(&tier, 1);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "tier kind 3");
  tier.kind = (kdn_tier_kind)-1;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "tier kind -1");
}

static void case_tier_policy_unknown(void) {
  kdn_tier_config tier;
  kdn_runtime_options opts;
  host_tiers(&tier, 1, 1u << 20);
  tier.policy = (kdn_eviction_policy)3; /* lru, s3fifo and cost (2, since 1.5) only */
  opts = with_tiers(&tier, 1);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "eviction policy 3");
}

static void case_tier_watermarks(void) {
  static const float bad[][2] = {{1.5f, 0.0f}, {0.5f, 0.9f}, {0.0f, -0.1f}, {-0.5f, 0.0f}, {2.0f, 1.5f}};
  kdn_tier_config tier;
  kdn_runtime_options opts;
  size_t i;
  host_tiers(&tier, 1, 1u << 20);
  opts = with_tiers(&tier, 1);
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    tier.high_watermark = bad[i][0];
    tier.low_watermark = bad[i][1];
    printf("  high %g, low %g\n", (double)bad[i][0], (double)bad[i][1]);
    EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "watermarks out of range");
  }
  tier.high_watermark = (float)NAN;
  tier.low_watermark = 0.5f;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "high watermark NaN");
}

static void case_tier_capacity_zero(void) {
  kdn_tier_config tier;
  kdn_runtime_options opts;
  host_tiers(&tier, 1, 0);
  opts = with_tiers(&tier, 1);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "tier capacity_bytes 0");
}

static void case_tier_disk_without_path(void) {
  kdn_tier_config tiers[2];
  kdn_runtime_options opts;
  host_tiers(tiers, 2, 1u << 20);
  tiers[1].kind = KDN_TIER_DISK;
  opts = with_tiers(tiers, 2);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "disk tier, path NULL, path_len 0");
  tiers[1].path = "/tmp";
  tiers[1].path_len = 0;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "disk tier, path_len 0");
  tiers[1].path = NULL;
  tiers[1].path_len = 4;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "disk tier, path NULL, path_len 4");
}

static void case_tier_codec_unknown(void) {
  kdn_tier_config tier;
  kdn_runtime_options opts;
  host_tiers(&tier, 1, 1u << 20);
  tier.codec = "no-such-codec";
  tier.codec_len = strlen(tier.codec);
  opts = with_tiers(&tier, 1);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "codec \"no-such-codec\"");
  tier.codec = NULL;
  tier.codec_len = 3;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "codec NULL, codec_len 3");
}

/* Quality levels (1.6): remote and redis tiers only, without a codec, none empty, each a codec. */
static void case_tier_levels_bad(void) {
  kdn_tier_config tier;
  kdn_runtime_options opts;
  kdn_runtime *rt = NULL;
  host_tiers(&tier, 1, 1u << 20);
  tier.levels = "zstd;kdn:balanced";
  tier.levels_len = strlen(tier.levels);
  opts = with_tiers(&tier, 1);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "levels on a host tier");
  tier.kind = KDN_TIER_REMOTE;
  tier.address = "127.0.0.1:1";
  tier.address_len = strlen(tier.address);
  tier.token = "t";
  tier.token_len = 1;
  tier.codec = "zstd";
  tier.codec_len = 4;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "levels and a codec");
  tier.codec = NULL;
  tier.codec_len = 0;
  tier.levels = "zstd;;kdn:balanced";
  tier.levels_len = strlen(tier.levels);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "an empty level");
  tier.levels = "zstd;no-such-codec";
  tier.levels_len = strlen(tier.levels);
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "an unknown codec as a level");
  tier.levels = NULL;
  tier.levels_len = 4;
  EXPECT_NO_RUNTIME(&opts, KDN_ERR_INVALID_ARGUMENT, "levels NULL with a length");
  /* Well formed: the runtime is made (no node needs to answer yet). */
  tier.levels = "zstd; kdn:hifi ;kdn:balanced";
  tier.levels_len = strlen(tier.levels);
  CHECK_EQ(kdn_runtime_create(&opts, &rt), KDN_OK);
  kdn_runtime_destroy(rt);
}

static kdn_status never_edit(void *user, const kdn_chunk_info *info, void *kv, size_t kv_bytes, int *out_changed) {
  (void)user;
  (void)info;
  (void)kv;
  (void)kv_bytes;
  *out_changed = 0;
  return KDN_OK;
}

static void case_editor_bad_args(void) {
  kdn_runtime_options opts;
  kdn_runtime *rt = JUNK(kdn_runtime);
  kdn_runtime_options_init(&opts, sizeof opts);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create_with_editor(&opts, NULL, NULL, &rt));
  CHECK(rt == NULL);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_create_with_editor(&opts, never_edit, NULL, NULL));
  rt = JUNK(kdn_runtime);
  opts.struct_size = 0;
  EXPECT(KDN_ERR_VERSION, kdn_runtime_create_with_editor(&opts, never_edit, NULL, &rt));
  CHECK(rt == NULL);
}

/* ---- Models ---------------------------------------------------------------- */

static void expect_no_model_at(const kdn_model_spec *spec, kdn_status want, const char *what, int line) {
  kdn_model *m = JUNK(kdn_model);
  expect_at(kdn_model_create(g_rt, spec, &m), want, what, line);
  rb_check_at(m == NULL, "kdn_model_create: *out is NULL", line);
  if (m != NULL && m != JUNK(kdn_model)) kdn_model_destroy(m);
}
#define EXPECT_NO_MODEL(spec, want, what) expect_no_model_at((spec), (want), what, __LINE__)

static void case_model_create_null(void) {
  const kdn_model_spec spec = stories260k_spec(FINGERPRINT);
  kdn_model *m = JUNK(kdn_model);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(NULL, &spec, &m));
  CHECK(m == NULL);
  m = JUNK(kdn_model);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(g_rt, NULL, &m));
  CHECK(m == NULL);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_create(g_rt, &spec, NULL));
  kdn_model_destroy(NULL); /* a no-op */
}

typedef struct {
  kdn_model_spec s;
  uint64_t tail;
} newer_model_spec;

static void case_model_spec_size(void) {
  kdn_model_spec spec = stories260k_spec(FINGERPRINT);
  newer_model_spec big;
  spec.struct_size = 0;
  EXPECT_NO_MODEL(&spec, KDN_ERR_VERSION, "spec struct_size 0");
  spec.struct_size = KDN_MODEL_SPEC_SIZE_V1 - 8;
  EXPECT_NO_MODEL(&spec, KDN_ERR_VERSION, "spec struct_size KDN_MODEL_SPEC_SIZE_V1 - 8");
  memset(&big, 0, sizeof big);
  big.s = stories260k_spec(FINGERPRINT);
  big.s.struct_size = sizeof big;
  big.tail = 7;
  EXPECT_NO_MODEL(&big.s, KDN_ERR_VERSION, "spec with a nonzero unknown tail");
}

static void case_model_spec_range(void) {
  int i;
  for (i = 0; i < 10; ++i) {
    kdn_model_spec spec = stories260k_spec(FINGERPRINT);
    const char *what = "";
    switch (i) {
      case 0: spec.num_layers = 0, what = "num_layers 0"; break;
      case 1: spec.num_layers = 4097, what = "num_layers 4097"; break;
      case 2: spec.num_kv_heads = 0, what = "num_kv_heads 0"; break;
      case 3: spec.num_kv_heads = 4097, what = "num_kv_heads 4097"; break;
      case 4: spec.head_dim = 0, what = "head_dim 0"; break;
      case 5: spec.head_dim = 65537, what = "head_dim 65537"; break;
      case 6: spec.rotary_dim = HEAD_DIM + 2, what = "rotary_dim > head_dim"; break;
      case 7: spec.rope_theta = -1.0f, what = "rope_theta -1"; break;
      case 8: spec.rope_theta = (float)NAN, what = "rope_theta NaN"; break;
      default: spec.rope_theta = (float)INFINITY, what = "rope_theta infinite"; break;
    }
    printf("  %s\n", what);
    EXPECT_NO_MODEL(&spec, KDN_ERR_INVALID_ARGUMENT, what);
  }
}

static void case_model_spec_enum_unknown(void) {
  kdn_model_spec spec = stories260k_spec(FINGERPRINT);
  spec.dtype = (kdn_dtype)3;
  EXPECT_NO_MODEL(&spec, KDN_ERR_INVALID_ARGUMENT, "dtype 3");
  spec = stories260k_spec(FINGERPRINT);
  spec.rope_style = (kdn_rope_style)2;
  EXPECT_NO_MODEL(&spec, KDN_ERR_INVALID_ARGUMENT, "rope_style 2");
}

static void case_model_fingerprint_empty(void) {
  kdn_model_spec spec = stories260k_spec(FINGERPRINT);
  spec.fingerprint = NULL;
  spec.fingerprint_len = 0;
  EXPECT_NO_MODEL(&spec, KDN_ERR_INVALID_ARGUMENT, "fingerprint NULL, 0 bytes");
  spec.fingerprint = "x";
  spec.fingerprint_len = 0;
  EXPECT_NO_MODEL(&spec, KDN_ERR_INVALID_ARGUMENT, "fingerprint of 0 bytes");
  spec.fingerprint = NULL;
  spec.fingerprint_len = 5;
  EXPECT_NO_MODEL(&spec, KDN_ERR_INVALID_ARGUMENT, "fingerprint NULL, 5 bytes");
}

static void case_model_get_null(void) {
  uint8_t fp[32];
  uint64_t bytes = 77;
  memset(fp, SENTINEL, sizeof fp);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_fingerprint(NULL, fp));
  CHECK(bytes_are(fp, sizeof fp, 0)); /* neutral: zeroed */
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_fingerprint(g_m, NULL));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_kv_bytes_per_token(NULL, &bytes));
  CHECK_EQ(bytes, 0);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_model_get_kv_bytes_per_token(g_m, NULL));
}

/* ---- Lookups and requests ------------------------------------------------------ */

static void case_lookup_null_args(void) {
  const kdn_request req = ref_request();
  kdn_lookup_result res;
  kdn_lookup_result_init(&res, sizeof res);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(NULL, NS, &req, 1, &res));
  CHECK_EQ(res.filled_size, 0);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(g_m, NS, NULL, 1, &res));
  CHECK_EQ(res.filled_size, 0);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(g_m, NS, &req, 1, NULL));
}

/* Every call that takes a namespace, with this one. */
static void expect_namespace_at(const char *ns, size_t ns_len, int line) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view(), dst = dst_view();
  const uint64_t chunks = stats_chunks();
  kdn_lookup_result res;
  kdn_document_info info[2];
  size_t count = 77;
  kdn_kv_result out;
  kdn_op *op = JUNK(kdn_op);
  int32_t tokens[POSITIONS];
  kdn_lookup_result_init(&res, sizeof res);
  kdn_document_info_init(&info[0], sizeof info[0]);
  kdn_document_info_init(&info[1], sizeof info[1]);
  dst_reset();

  expect_at(kdn_kv_lookup(g_m, ns, ns_len, &req, 1, &res), KDN_ERR_INVALID_ARGUMENT, "kdn_kv_lookup", line);
  rb_check_eq_at(res.filled_size, 0, "results untouched", line);
  PRIME(out);
  expect_at(kdn_kv_store(g_m, ns, ns_len, &req, &src, 1, &out), KDN_ERR_INVALID_ARGUMENT, "kdn_kv_store", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_kv_store: out is neutral", line);
  PRIME(out);
  expect_at(kdn_kv_retrieve(g_m, ns, ns_len, &req, &dst, 1, &out), KDN_ERR_INVALID_ARGUMENT, "kdn_kv_retrieve", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_kv_retrieve: out is neutral", line);
  expect_at(kdn_kv_load_async(g_m, ns, ns_len, &req, &dst, 1, &op), KDN_ERR_INVALID_ARGUMENT, "kdn_kv_load_async",
            line);
  rb_check_at(op == NULL, "*out is NULL", line);
  drop_op(op);
  op = JUNK(kdn_op);
  expect_at(kdn_kv_save_async(g_m, ns, ns_len, &req, &src, 1, &op), KDN_ERR_INVALID_ARGUMENT, "kdn_kv_save_async",
            line);
  rb_check_at(op == NULL, "*out is NULL", line);
  drop_op(op);
  expect_at(kdn_knowledge_put(g_m, ns, ns_len, STR("doc"), 1, NULL, 0, kTokens, POSITIONS, &src, 1),
            KDN_ERR_INVALID_ARGUMENT, "kdn_knowledge_put", line);
  PRIME(info[0]);
  expect_at(kdn_knowledge_get_info(g_m, ns, ns_len, STR("fixture"), &info[0]), KDN_ERR_INVALID_ARGUMENT,
            "kdn_knowledge_get_info", line);
  rb_check_at(is_default_kdn_document_info(&info[0]), "kdn_knowledge_get_info: out holds its defaults", line);
  kdn_document_info_init(&info[0], sizeof info[0]);
  expect_at(kdn_knowledge_list(g_m, ns, ns_len, info, 2, &count), KDN_ERR_INVALID_ARGUMENT, "kdn_knowledge_list",
            line);
  rb_check_eq_at(count, 0, "*out_count is 0", line);
  expect_at(kdn_knowledge_pin(g_m, ns, ns_len, STR("fixture"), 0), KDN_ERR_INVALID_ARGUMENT, "kdn_knowledge_pin",
            line);
  expect_at(kdn_knowledge_unpin(g_m, ns, ns_len, STR("fixture")), KDN_ERR_INVALID_ARGUMENT, "kdn_knowledge_unpin",
            line);
  expect_at(kdn_knowledge_expire(g_m, ns, ns_len, STR("fixture"), 0), KDN_ERR_INVALID_ARGUMENT,
            "kdn_knowledge_expire", line);
  expect_at(kdn_knowledge_delete(g_m, ns, ns_len, STR("fixture")), KDN_ERR_INVALID_ARGUMENT, "kdn_knowledge_delete",
            line);
  PRIME(out);
  expect_at(kdn_knowledge_fetch(g_m, ns, ns_len, STR("fixture"), &dst, 1, tokens, POSITIONS, &out),
            KDN_ERR_INVALID_ARGUMENT, "kdn_knowledge_fetch", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_knowledge_fetch: out is neutral", line);
  rb_check_eq_at(stats_chunks(), chunks, "nothing was stored", line);
  rb_check_at(dst_untouched(), "nothing was written", line);
  rb_check_at(doc_exists(STR("fixture")), "the fixture document is still there", line);
}

static void case_namespace_empty(void) {
  printf("  ns NULL, 0 bytes\n");
  expect_namespace_at(NULL, 0, __LINE__);
  printf("  ns \"bad\", 0 bytes\n");
  expect_namespace_at("bad", 0, __LINE__);
  printf("  ns NULL, 3 bytes\n");
  expect_namespace_at(NULL, 3, __LINE__);
}

static void case_namespace_too_long(void) {
  static char ns[4097];
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view();
  kdn_kv_result stored;
  memset(ns, 'n', sizeof ns);
  printf("  ns of 4097 bytes\n");
  expect_namespace_at(ns, sizeof ns, __LINE__);
  /* 4096 bytes is the most there may be */
  PRIME(stored);
  CHECK_OK(kdn_kv_store(g_m, ns, 4096, &req, &src, 1, &stored));
  CHECK_RESULT(&stored, KDN_OP_DONE, KDN_OK, POSITIONS, 0);
  CHECK_EQ(cached_tokens(ns, 4096, kTokens, POSITIONS), POSITIONS);
}

/* A request that is bad in itself: the synchronous calls refuse it; a
 * lookup reports it in the request's own result (the call succeeds, the
 * other requests are answered). */
static void expect_bad_request_at(const kdn_request *bad, kdn_status want, int line) {
  const kdn_kv_view src = src_view(), dst = dst_view();
  const kdn_request good = ref_request();
  const uint64_t chunks = stats_chunks();
  kdn_kv_result out;
  kdn_op *op = JUNK(kdn_op);
  kdn_request reqs[2];
  kdn_lookup_result res[2];
  dst_reset();
  PRIME(out);
  expect_at(kdn_kv_store(g_m, NS, bad, &src, 1, &out), want, "kdn_kv_store(bad request)", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_kv_store: out is neutral", line);
  PRIME(out);
  expect_at(kdn_kv_retrieve(g_m, NS, bad, &dst, 1, &out), want, "kdn_kv_retrieve(bad request)", line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_kv_retrieve: out is neutral", line);
  expect_at(kdn_kv_load_async(g_m, NS, bad, &dst, 1, &op), want, "kdn_kv_load_async(bad request)", line);
  rb_check_at(op == NULL, "*out is NULL", line);
  drop_op(op);
  op = JUNK(kdn_op);
  expect_at(kdn_kv_save_async(g_m, NS, bad, &src, 1, &op), want, "kdn_kv_save_async(bad request)", line);
  rb_check_at(op == NULL, "*out is NULL", line);
  drop_op(op);
  rb_check_eq_at(stats_chunks(), chunks, "nothing was stored", line);
  rb_check_at(dst_untouched(), "nothing was written", line);

  /* In a batched lookup, the bad request fails alone. */
  reqs[0] = good;
  reqs[1] = *bad;
  reqs[1].struct_size = reqs[0].struct_size; /* the array's stride (a bad struct_size fails the call: other cases) */
  kdn_lookup_result_init(&res[0], sizeof res[0]);
  kdn_lookup_result_init(&res[1], sizeof res[1]);
  if (bad->struct_size == good.struct_size) {
    const kdn_status s = kdn_kv_lookup(g_m, NS, reqs, 2, res);
    rb_check_at(s == KDN_OK, "kdn_kv_lookup of a well-formed batch returns KDN_OK", line);
    rb_check_at(res[0].status == KDN_OK, "the good request's status is KDN_OK", line);
    if (res[1].status != want) {
      ++g_failures;
      printf("  FAILED (line %d): the bad request's result status is %s, want %s\n", line,
             kdn_status_string(res[1].status), kdn_status_string(want));
    } else {
      ++g_checks;
      printf("  %-25s in results[1].status of kdn_kv_lookup\n", kdn_status_string(res[1].status));
    }
    rb_check_eq_at(res[1].cached_tokens, 0, "the bad request has 0 cached tokens", line);
  }
}
#define EXPECT_BAD_REQUEST(req, want) expect_bad_request_at((req), (want), __LINE__)

static void case_request_negative_token(void) {
  int32_t tokens[POSITIONS];
  kdn_request req;
  memcpy(tokens, kTokens, sizeof tokens);
  tokens[20] = -5;
  req = token_request(tokens, POSITIONS);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
  CHECK_EQ(cached_tokens(NS, kTokens, 20), 0); /* not even the prefix before it was stored */
}

/* ttft_target_us (1.6) in microseconds: over an hour is a unit mistake. */
static void case_request_target_absurd(void) {
  kdn_request req = token_request(kTokens, POSITIONS);
  req.ttft_target_us = 3601ull * 1000000ull;
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

static void case_request_zero_tokens(void) {
  const kdn_request req = token_request(kTokens, 0);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

static void case_request_tokens_null(void) {
  const kdn_request req = token_request(NULL, POSITIONS);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

typedef struct {
  kdn_request r;
  uint64_t tail;
} newer_request;

static void case_request_size(void) {
  kdn_request req = ref_request();
  newer_request big, batch[2];
  kdn_lookup_result res, results[2];
  req.struct_size = 0;
  EXPECT_BAD_REQUEST(&req, KDN_ERR_VERSION);
  req.struct_size = KDN_REQUEST_SIZE_V1 - 8;
  EXPECT_BAD_REQUEST(&req, KDN_ERR_VERSION);
  memset(&big, 0, sizeof big);
  big.r = ref_request();
  big.r.struct_size = sizeof big;
  big.tail = 1;
  EXPECT_BAD_REQUEST(&big.r, KDN_ERR_VERSION);
  /* requests[0] says how the array is laid out: a bad one fails the call */
  kdn_lookup_result_init(&res, sizeof res);
  EXPECT(KDN_ERR_VERSION, kdn_kv_lookup(g_m, NS, &req, 1, &res));
  CHECK_EQ(res.filled_size, 0);
  /* A size that ends inside a field (52: half of the 8-byte field after
   * the first 48 bytes) is no size of the struct, for every call alike: the
   * single-request calls refused it as the lookup did not (they read half a
   * field). */
  memset(&big, 0, sizeof big);
  big.r = ref_request();
  big.r.struct_size = KDN_REQUEST_SIZE_V1 + 4;
  EXPECT_BAD_REQUEST(&big.r, KDN_ERR_VERSION);
  kdn_lookup_result_init(&res, sizeof res);
  EXPECT(KDN_ERR_VERSION, kdn_kv_lookup(g_m, NS, &big.r, 1, &res));
  CHECK_EQ(res.filled_size, 0);
  /* The same rule for what the library writes: an output struct whose size
   * ends inside a field is refused, and not written. */
  {
    const kdn_kv_view dst = dst_view();
    kdn_kv_result out;
    req = ref_request();
    dst_reset();
    kdn_kv_result_init(&out, sizeof out);
    out.struct_size = KDN_KV_RESULT_SIZE_V1 + 4;
    EXPECT(KDN_ERR_VERSION, kdn_kv_retrieve(g_m, NS, &req, &dst, 1, &out));
    CHECK_EQ(out.filled_size, 0);
    CHECK(dst_untouched());
  }
  /* a newer caller's array is laid out at its own stride: the request that
   * sets an unknown field fails alone, in its result */
  memset(batch, 0, sizeof batch);
  batch[0].r = batch[1].r = ref_request();
  batch[0].r.struct_size = batch[1].r.struct_size = sizeof batch[0];
  batch[1].tail = 1;
  kdn_lookup_result_init(&results[0], sizeof results[0]);
  kdn_lookup_result_init(&results[1], sizeof results[1]);
  CHECK_OK(kdn_kv_lookup(g_m, NS, &batch[0].r, 2, results));
  CHECK_EQ(results[0].status, KDN_OK);
  CHECK_EQ(results[1].status, KDN_ERR_VERSION);
  CHECK_EQ(results[1].cached_tokens, 0);
}

static void case_request_sizes_differ(void) {
  kdn_request reqs[3];
  kdn_lookup_result res[2];
  reqs[0] = reqs[1] = ref_request();
  reqs[1].struct_size = sizeof reqs[1] + 8;
  kdn_lookup_result_init(&res[0], sizeof res[0]);
  kdn_lookup_result_init(&res[1], sizeof res[1]);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(g_m, NS, reqs, 2, res));
  CHECK_EQ(res[0].filled_size, 0);
  CHECK_EQ(res[1].filled_size, 0);
}

static void case_request_reserved_nonzero(void) {
  kdn_request req = ref_request();
  req.reserved0 = 1; /* a field of a later version, set: as an unknown tail */
  EXPECT_BAD_REQUEST(&req, KDN_ERR_VERSION);
}

static uint8_t g_hashes[3 * 64];

static kdn_request hash_request(uint32_t hash_bytes, uint32_t block_tokens, size_t blocks) {
  kdn_request r = KDN_REQUEST_INIT;
  size_t i;
  for (i = 0; i < sizeof g_hashes; ++i) g_hashes[i] = (uint8_t)(i * 37u + 11u);
  r.hash_bytes = hash_bytes;
  r.block_hashes = g_hashes;
  r.num_blocks = blocks;
  r.block_tokens = block_tokens;
  return r;
}

static void case_hash_bytes_too_big(void) {
  const kdn_request req = hash_request(65, CHUNK, 3);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

static void case_hash_block_tokens_zero(void) {
  const kdn_request req = hash_request(32, 0, 3);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

static void case_hash_chunk_not_multiple(void) {
  /* chunks of 16 tokens cannot be made of blocks of 5 (or of 32) */
  kdn_request req = hash_request(32, 5, 3);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
  req = hash_request(32, 32, 1);
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

static void case_hash_null(void) {
  kdn_request req = hash_request(32, CHUNK, 3);
  req.block_hashes = NULL;
  EXPECT_BAD_REQUEST(&req, KDN_ERR_INVALID_ARGUMENT);
}

static void case_lookup_result_size(void) {
  kdn_request r[2];
  kdn_lookup_result res[2];
  r[0] = r[1] = ref_request();
  kdn_lookup_result_init(&res[0], sizeof res[0]);
  kdn_lookup_result_init(&res[1], sizeof res[1]);
  res[0].struct_size = 0;
  EXPECT(KDN_ERR_VERSION, kdn_kv_lookup(g_m, NS, r, 1, res));
  CHECK_EQ(res[0].filled_size, 0);
  res[0].struct_size = KDN_LOOKUP_RESULT_SIZE_V1 - 8;
  EXPECT(KDN_ERR_VERSION, kdn_kv_lookup(g_m, NS, r, 1, res));
  CHECK_EQ(res[0].filled_size, 0);
  res[0].struct_size = sizeof res[0];
  res[1].struct_size = sizeof res[1] - 8;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_lookup(g_m, NS, r, 2, res));
  CHECK_EQ(res[0].filled_size, 0);
}

/* ---- Views ------------------------------------------------------------------------ */

static void case_views_null(void) {
  dst_reset();
  EXPECT_VIEWS(NULL, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_views_none(void) {
  /* No view holds any layer: nothing to store from or write into. (A fetch
   * with no views, tokens only, is allowed: kdn_knowledge_fetch's comment.) */
  const kdn_request req = ref_request();
  kdn_kv_result out;
  kdn_op *op = JUNK(kdn_op);
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(g_m, NS, &req, NULL, 0, &out));
  CHECK_RESULT_NEUTRAL(&out);
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(g_m, NS, &req, NULL, 0, &out));
  CHECK_RESULT_NEUTRAL(&out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_load_async(g_m, NS, &req, NULL, 0, &op));
  CHECK(op == NULL);
  drop_op(op);
  op = JUNK(kdn_op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_save_async(g_m, NS, &req, NULL, 0, &op));
  CHECK(op == NULL);
  drop_op(op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_put(g_m, NS, STR("doc"), 1, NULL, 0, kTokens, POSITIONS, NULL, 0));
  CHECK(!doc_exists(STR("doc")));
  CHECK_EQ(cached_tokens(NS, kTokens, POSITIONS), 0);
}

typedef struct {
  kdn_kv_view v;
  uint64_t tail;
} newer_view;

static void case_view_size(void) {
  kdn_kv_view v;
  newer_view big;
  dst_reset();
  v = dst_view();
  v.struct_size = 0;
  EXPECT_VIEWS(&v, 1, KDN_ERR_VERSION, KDN_ERR_VERSION);
  v.struct_size = KDN_KV_VIEW_SIZE_V1 - 8;
  EXPECT_VIEWS(&v, 1, KDN_ERR_VERSION, KDN_ERR_VERSION);
  memset(&big, 0, sizeof big);
  big.v = dst_view();
  big.v.struct_size = sizeof big;
  big.tail = 3;
  EXPECT_VIEWS(&big.v, 1, KDN_ERR_VERSION, KDN_ERR_VERSION);
}

static const uint32_t kLow[2] = {0, 1}, kHigh[3] = {2, 3, 4};

/* Two views of g_dst (same buffer, as canonical 48-token layout): layers
 * {0, 1} and {2, 3, 4}. The canonical layout is indexed by view layer, so
 * this is only ever used for calls that must fail. */
static void split_views(kdn_kv_view v[2], const uint32_t *a, size_t na, const uint32_t *b, size_t nb) {
  v[0] = dst_view();
  v[1] = dst_view();
  v[0].layers = a;
  v[0].num_layers = na;
  v[1].layers = b;
  v[1].num_layers = nb;
}

static void case_view_sizes_differ(void) {
  kdn_kv_view v[3];
  memset(v, 0, sizeof v);
  dst_reset();
  split_views(v, kLow, 2, kHigh, 3);
  v[1].struct_size = sizeof v[1] + 8;
  EXPECT_VIEWS(v, 2, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_views_layers_missing(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.layers = kHigh; /* layers 0 and 1 are in no view */
  v.num_layers = 3;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_views_layers_overlap(void) {
  static const uint32_t a[3] = {0, 1, 2}, twice[5] = {0, 1, 1, 3, 4}, beyond[5] = {0, 1, 2, 3, 5};
  kdn_kv_view v[2];
  dst_reset();
  split_views(v, a, 3, kHigh, 3); /* layer 2 in both */
  printf("  layers {0, 1, 2} and {2, 3, 4}\n");
  EXPECT_VIEWS(v, 2, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v[0] = dst_view();
  v[0].layers = twice;
  v[0].num_layers = 5;
  printf("  layers {0, 1, 1, 3, 4}\n");
  EXPECT_VIEWS(v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v[0].layers = beyond;
  printf("  layers {0, 1, 2, 3, 5} of a 5-layer model\n");
  EXPECT_VIEWS(v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_num_layers_wrong(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.num_layers = 3; /* layers NULL means all: then 0 or the model's count */
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v.layers = kAllLayers; /* layers set, num_layers 0 */
  v.num_layers = 0;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_dtype_mismatch(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.dtype = KDN_DTYPE_F16;
  printf("  F16 view of an F32 model\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v.dtype = KDN_DTYPE_BF16;
  printf("  BF16 view of an F32 model\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_dtype_unknown(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.dtype = (kdn_dtype)7;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_memory_unknown(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.memory = (kdn_memory_kind)2; /* host (0) and device (1, since 1.5) only */
  printf("  memory kind 2\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v.memory = (kdn_memory_kind)99;
  printf("  memory kind 99\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_layout_unknown(void) {
  kdn_kv_view v = paged_view();
  dst_reset();
  v.layout = (kdn_kv_layout)3;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_no_memory(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.data = NULL;
  printf("  data NULL, k_layers NULL\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v = paged_view();
  v.v_layers = NULL;
  printf("  k_layers set, v_layers NULL\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v = paged_view();
  g_v_ptrs[3] = NULL;
  printf("  v_layers[3] NULL\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_negative_stride(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  /* a valid explicit canonical layout, but for one negative stride */
  v.stride_dim = 1;
  v.stride_head = HEAD_DIM;
  v.stride_token = TOKEN_ELEMS;
  v.stride_kv = (int64_t)POSITIONS * TOKEN_ELEMS;
  v.stride_layer = 2 * v.stride_kv;
  v.stride_token = -TOKEN_ELEMS;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v.stride_token = TOKEN_ELEMS;
  v.v_stride_dim = -1;
  v.v_stride_head = HEAD_DIM;
  v.v_stride_token = TOKEN_ELEMS;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_aliasing_strides(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  /* explicit strides under which K and V, or two layers, are the same memory */
  v.stride_dim = 1;
  v.stride_head = HEAD_DIM;
  v.stride_token = TOKEN_ELEMS;
  v.stride_kv = 0;
  v.stride_layer = (int64_t)POSITIONS * TOKEN_ELEMS;
  printf("  stride_kv 0\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v.stride_kv = (int64_t)POSITIONS * TOKEN_ELEMS;
  v.stride_layer = 0;
  printf("  stride_layer 0 with %d layers\n", LAYERS);
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_reserved_nonzero(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.reserved0 = 1; /* a field of a later version, set: as an unknown tail */
  EXPECT_VIEWS(&v, 1, KDN_ERR_VERSION, KDN_ERR_VERSION);
}

static void case_view_size_bytes_small(void) {
  kdn_kv_view v = dst_view();
  dst_reset();
  v.size_bytes = sizeof g_dst - 4; /* one float short */
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  /* explicit strides that reach past size_bytes */
  v.size_bytes = sizeof g_dst;
  v.stride_dim = 1;
  v.stride_head = HEAD_DIM;
  v.stride_token = TOKEN_ELEMS;
  v.stride_kv = (int64_t)POSITIONS * TOKEN_ELEMS + 1;
  v.stride_layer = 2 * (int64_t)POSITIONS * TOKEN_ELEMS;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_view_num_tokens_small(void) {
  /* Room for 47 tokens, a request of 48: refused before anything is
   * touched. The fixture document has 48 tokens: a fetch says so. */
  kdn_kv_view v = canon_view(g_dst, POSITIONS - 1);
  dst_reset();
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_BUFFER_TOO_SMALL);
}

static void case_view_layer_elements_small(void) {
  kdn_kv_view v = dst_view();
  static float *k[LAYERS], *vv[LAYERS];
  int l;
  dst_reset();
  /* per-layer contiguous [token][head][dim] in g_pages, one element short */
  for (l = 0; l < LAYERS; ++l) {
    k[l] = g_pages[2 * l];
    vv[l] = g_pages[2 * l + 1];
  }
  v.data = NULL;
  v.size_bytes = 0;
  v.k_layers = (void *const *)k;
  v.v_layers = (void *const *)vv;
  v.stride_dim = 1;
  v.stride_head = HEAD_DIM;
  v.stride_token = TOKEN_ELEMS;
  v.layer_elements = (uint64_t)POSITIONS * TOKEN_ELEMS - 1;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_paged_null_table(void) {
  kdn_kv_view v = paged_view();
  dst_reset();
  v.block_table = NULL;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_paged_block_out_of_range(void) {
  static const int32_t beyond[3] = {2, 0, PAGE_BLOCKS}, negative[3] = {2, -1, 3};
  kdn_kv_view v = paged_view();
  dst_reset();
  v.block_table = beyond;
  printf("  block id == num_blocks\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
  v.block_table = negative;
  printf("  block id -1\n");
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_paged_table_short(void) {
  kdn_kv_view v = paged_view();
  dst_reset();
  v.block_table_len = 2; /* 48 tokens in blocks of 16 need 3 */
  /* a fetch writes a length it finds: the table gives room for 32 */
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_BUFFER_TOO_SMALL);
}

static void case_paged_block_size_zero(void) {
  kdn_kv_view v = paged_view();
  dst_reset();
  v.block_size = 0;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

static void case_paged_with_data(void) {
  kdn_kv_view v = paged_view();
  dst_reset();
  v.k_layers = NULL; /* one allocation is CONTIGUOUS only */
  v.v_layers = NULL;
  v.data = g_dst;
  v.size_bytes = sizeof g_dst;
  EXPECT_VIEWS(&v, 1, KDN_ERR_INVALID_ARGUMENT, KDN_ERR_INVALID_ARGUMENT);
}

/* ---- Store and retrieve ------------------------------------------------------ */

static void case_store_null_args(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view();
  kdn_kv_result out;
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(NULL, NS, &req, &src, 1, &out));
  CHECK_RESULT_NEUTRAL(&out);
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(g_m, NS, NULL, &src, 1, &out));
  CHECK_RESULT_NEUTRAL(&out);
  /* and with out NULL (optional) too */
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(NULL, NS, &req, &src, 1, NULL));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(g_m, NS, NULL, &src, 1, NULL));
  CHECK_EQ(stats_chunks(), 3); /* the fixture document's */
  CHECK_EQ(cached_tokens(NS, kTokens, POSITIONS), 0);
}

static void case_retrieve_null_args(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view(), dst = dst_view();
  kdn_kv_result out;
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, NULL));
  dst_reset();
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(NULL, NS, &req, &dst, 1, &out));
  CHECK_RESULT_NEUTRAL(&out);
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(g_m, NS, NULL, &dst, 1, &out));
  CHECK_RESULT_NEUTRAL(&out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(g_m, NS, &req, &dst, 1, NULL)); /* out is required */
  CHECK(dst_untouched());
  /* and a good call writes it all */
  PRIME(out);
  CHECK_OK(kdn_kv_retrieve(g_m, NS, &req, &dst, 1, &out));
  CHECK_RESULT(&out, KDN_OP_DONE, KDN_OK, POSITIONS, POSITIONS);
  CHECK_EQ(canon_mismatches(g_dst, POSITIONS, POSITIONS, 0.0f, SENTINEL), 0);
}

/* ---- Asynchronous ops ---------------------------------------------------------- */

static void case_load_async_null_args(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view dst = dst_view();
  kdn_op *op = JUNK(kdn_op);
  dst_reset();
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_load_async(NULL, NS, &req, &dst, 1, &op));
  CHECK(op == NULL);
  drop_op(op);
  op = JUNK(kdn_op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_load_async(g_m, NS, NULL, &dst, 1, &op));
  CHECK(op == NULL);
  drop_op(op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_load_async(g_m, NS, &req, &dst, 1, NULL));
  CHECK(dst_untouched());
}

static void case_save_async_null_args(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view();
  const uint64_t chunks = stats_chunks();
  kdn_op *op = JUNK(kdn_op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_save_async(NULL, NS, &req, &src, 1, &op));
  CHECK(op == NULL);
  drop_op(op);
  op = JUNK(kdn_op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_save_async(g_m, NS, NULL, &src, 1, &op));
  CHECK(op == NULL);
  drop_op(op);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_save_async(g_m, NS, &req, &src, 1, NULL));
  CHECK_EQ(stats_chunks(), chunks);
}

/* A save op of the reference KV that has not been given any layer yet. */
static kdn_op *start_save(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view();
  kdn_op *op = NULL;
  CHECK_OK(kdn_kv_save_async(g_m, NS, &req, &src, 1, &op));
  return op;
}

static void finish_save(kdn_op *op) {
  uint32_t l;
  if (op == NULL) return;
  for (l = 0; l < LAYERS; ++l) CHECK_OK(kdn_op_layer_ready(op, l));
  CHECK_OK(kdn_op_wait(op, 30000));
  kdn_op_destroy(op);
}

/* A load op of the reference KV (stored first) into g_dst. */
static kdn_op *start_load(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view(), dst = dst_view();
  kdn_op *op = NULL;
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, NULL));
  dst_reset();
  CHECK_OK(kdn_kv_load_async(g_m, NS, &req, &dst, 1, &op));
  return op;
}

static void finish_load(kdn_op *op) {
  kdn_kv_result res;
  if (op == NULL) return;
  CHECK_OK(kdn_op_wait(op, 30000));
  PRIME(res);
  CHECK_OK(kdn_op_get_result(op, &res));
  CHECK_RESULT(&res, KDN_OP_DONE, KDN_OK, POSITIONS, POSITIONS);
  kdn_op_destroy(op);
  CHECK_EQ(canon_mismatches(g_dst, POSITIONS, POSITIONS, 0.0f, SENTINEL), 0);
}

static void case_op_null_handle(void) {
  kdn_op_state state = (kdn_op_state)77;
  kdn_kv_result res;
  kdn_token_range ranges[4];
  size_t count = 77;
  kdn_op *op;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_layer_ready(NULL, 0));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait_layer(NULL, 0, 0));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait(NULL, 0));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_poll(NULL, &state));
  CHECK_EQ(state, KDN_OP_PENDING); /* neutral: 0 */
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_cancel(NULL));
  PRIME(res);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_get_result(NULL, &res));
  CHECK_RESULT_NEUTRAL(&res);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_get_failed_ranges(NULL, ranges, 4, &count));
  CHECK_EQ(count, 0);
  kdn_op_destroy(NULL); /* a no-op */

  /* a real op, NULL outputs */
  op = start_load();
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_poll(op, NULL));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_get_result(op, NULL));
  count = 77;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_get_failed_ranges(op, NULL, 4, &count));
  CHECK_EQ(count, 0);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_get_failed_ranges(op, ranges, 4, NULL));
  finish_load(op);
}

static void case_op_layer_ready_on_load(void) {
  kdn_op *op = start_load();
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_layer_ready(op, 0));
  finish_load(op);
}

static void case_op_wait_layer_on_save(void) {
  kdn_op *op = start_save();
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait_layer(op, 0, 0));
  finish_save(op);
  CHECK_EQ(cached_tokens(NS, kTokens, POSITIONS), POSITIONS);
}

static void case_op_layer_out_of_range(void) {
  kdn_op *save = start_save(), *load;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_layer_ready(save, LAYERS));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_layer_ready(save, UINT32_MAX));
  finish_save(save);
  load = start_load();
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait_layer(load, LAYERS, 1000));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_wait_layer(load, UINT32_MAX, 1000));
  finish_load(load);
}

/* A caller built with a newer, larger kdn_kv_result. */
typedef struct {
  kdn_kv_result r;
  uint64_t tail[2];
} newer_kv_result;

static void case_op_result_size(void) {
  kdn_op *op = start_load();
  kdn_kv_result res;
  newer_kv_result big;
  CHECK_OK(kdn_op_wait(op, 30000));
  prime_at(&res, sizeof res, 0);
  EXPECT(KDN_ERR_VERSION, kdn_op_get_result(op, &res));
  CHECK(unwritten(&res, sizeof res));
  prime_at(&res, sizeof res, KDN_KV_RESULT_SIZE_V1 - 8);
  EXPECT(KDN_ERR_VERSION, kdn_op_get_result(op, &res));
  CHECK(unwritten(&res, sizeof res));
  /* a newer caller's larger output struct is fine: its tail is zeroed */
  PRIME(big);
  CHECK_OK(kdn_op_get_result(op, &big.r));
  CHECK_EQ(big.r.struct_size, sizeof big);
  big.r.struct_size = KDN_KV_RESULT_SIZE_V1; /* to compare the known part */
  CHECK_RESULT(&big.r, KDN_OP_DONE, KDN_OK, POSITIONS, POSITIONS);
  CHECK(bytes_are(big.tail, sizeof big.tail, 0));
  finish_load(op);
}

/* ---- kdn_kv_result -----------------------------------------------------------------
 * The one result of kdn_kv_store (optional), kdn_kv_retrieve and
 * kdn_knowledge_fetch (required) and kdn_op_get_result. */

/* A larger caller's result must hold exactly this outcome in its first 48
 * bytes, struct_size its own size, and a zeroed tail. */
static void check_big_at(const newer_kv_result *big, kdn_op_state state, kdn_status status, uint64_t tokens,
                         uint64_t covered, const char *what, int line) {
  kdn_kv_result known = big->r;
  rb_check_eq_at(big->r.struct_size, sizeof *big, "struct_size is the caller's", line);
  known.struct_size = KDN_KV_RESULT_SIZE_V1;
  check_result_at(&known, state, status, tokens, covered, what, line);
  rb_check_at(bytes_are(big->tail, sizeof big->tail, 0), "the tail the library does not know is zeroed", line);
}
#define CHECK_BIG(big, state, status, tokens, covered) \
  check_big_at((big), (state), (status), (tokens), (covered), #big, __LINE__)

/* The reference tokens but for token 0: a sequence nothing has stored. */
static int32_t g_other[POSITIONS];
static kdn_request other_request(void) {
  memcpy(g_other, kTokens, sizeof g_other);
  g_other[0] = 5;
  return token_request(g_other, POSITIONS);
}

static void case_kv_result_init_small(void) {
  static const size_t bad[] = {0, 4, 8, KDN_KV_RESULT_SIZE_V1 - 8, KDN_KV_RESULT_SIZE_V1 - 1};
  newer_kv_result big;
  kdn_kv_result want = KDN_KV_RESULT_INIT;
  size_t i;
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    memset(&big, SENTINEL, sizeof big);
    printf("  kdn_kv_result_init(&r, %lu)\n", (unsigned long)bad[i]);
    EXPECT(KDN_ERR_VERSION, kdn_kv_result_init(&big.r, bad[i]));
    CHECK(bytes_are(&big, sizeof big, SENTINEL)); /* nothing written, not even struct_size */
  }
  /* its first size: the defaults, and not a byte more */
  memset(&big, SENTINEL, sizeof big);
  CHECK_OK(kdn_kv_result_init(&big.r, KDN_KV_RESULT_SIZE_V1));
  CHECK(memcmp(&big.r, &want, sizeof want) == 0);
  CHECK(bytes_are(big.tail, sizeof big.tail, SENTINEL));
  /* a newer caller's size: the defaults, its size, a zeroed tail (so that the
   * struct is never refused for a field it did not set) */
  memset(&big, SENTINEL, sizeof big);
  CHECK_OK(kdn_kv_result_init(&big.r, sizeof big));
  CHECK_EQ(big.r.struct_size, sizeof big);
  big.r.struct_size = want.struct_size;
  CHECK(memcmp(&big.r, &want, sizeof want) == 0);
  CHECK(bytes_are(big.tail, sizeof big.tail, 0));
}

static void case_kv_result_required(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view(), dst = dst_view();
  int32_t tokens[POSITIONS];
  kdn_op *op;
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, NULL)); /* so that a retrieve would write */
  dst_reset();
  memset(tokens, SENTINEL, sizeof tokens);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(g_m, NS, &req, &dst, 1, NULL));
  CHECK(dst_untouched());
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &dst, 1, tokens, POSITIONS, NULL));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(g_m, NS, STR("fixture"), NULL, 0, tokens, POSITIONS, NULL));
  CHECK(dst_untouched());
  CHECK(bytes_are(tokens, sizeof tokens, SENTINEL));
  op = start_load();
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_op_get_result(op, NULL));
  finish_load(op);
}

static void case_kv_result_store_optional(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view(), dst = dst_view();
  kdn_kv_result out;
  uint64_t chunks;
  CHECK_EQ(cached_tokens(NS, kTokens, POSITIONS), 0);
  /* out NULL: stored all the same */
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, NULL));
  CHECK_EQ(cached_tokens(NS, kTokens, POSITIONS), POSITIONS);
  chunks = stats_chunks();
  dst_reset();
  PRIME(out);
  CHECK_OK(kdn_kv_retrieve(g_m, NS, &req, &dst, 1, &out));
  CHECK_RESULT(&out, KDN_OP_DONE, KDN_OK, POSITIONS, POSITIONS);
  CHECK_EQ(canon_mismatches(g_dst, POSITIONS, POSITIONS, 0.0f, SENTINEL), 0);
  /* out given: tokens are the leading tokens cached after the call */
  PRIME(out);
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, &out));
  CHECK_RESULT(&out, KDN_OP_DONE, KDN_OK, POSITIONS, 0);
  CHECK_EQ(stats_chunks(), chunks); /* nothing stored twice */
}

static void case_kv_result_size_small(void) {
  static const uint32_t bad[] = {0, 4, 40, KDN_KV_RESULT_SIZE_V1 - 1};
  const kdn_request req = ref_request(), other = other_request();
  const kdn_kv_view src = src_view(), dst = dst_view();
  int32_t tokens[POSITIONS];
  kdn_kv_result out;
  uint64_t chunks;
  size_t i;
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, NULL)); /* so that a retrieve would write */
  chunks = stats_chunks();
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    printf("  struct_size %u\n", (unsigned)bad[i]);
    dst_reset();
    memset(tokens, SENTINEL, sizeof tokens);
    prime_at(&out, sizeof out, bad[i]);
    EXPECT(KDN_ERR_VERSION, kdn_kv_store(g_m, NS, &other, &src, 1, &out));
    CHECK(unwritten(&out, sizeof out));
    EXPECT(KDN_ERR_VERSION, kdn_kv_retrieve(g_m, NS, &req, &dst, 1, &out));
    CHECK(unwritten(&out, sizeof out));
    EXPECT(KDN_ERR_VERSION, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &dst, 1, tokens, POSITIONS, &out));
    CHECK(unwritten(&out, sizeof out));
    CHECK(dst_untouched());
    CHECK(bytes_are(tokens, sizeof tokens, SENTINEL));
    CHECK_EQ(stats_chunks(), chunks); /* the refused store stored nothing */
    CHECK_EQ(cached_tokens(NS, g_other, POSITIONS), 0);
  }
}

static void case_kv_result_larger(void) {
  const kdn_request req = ref_request();
  const kdn_kv_view src = src_view(), dst = dst_view(), small = canon_view(g_dst, 32);
  int32_t tokens[POSITIONS];
  newer_kv_result big;
  PRIME(big);
  CHECK_OK(kdn_kv_store(g_m, NS, &req, &src, 1, &big.r));
  CHECK_BIG(&big, KDN_OP_DONE, KDN_OK, POSITIONS, 0);
  dst_reset();
  PRIME(big);
  CHECK_OK(kdn_kv_retrieve(g_m, NS, &req, &dst, 1, &big.r));
  CHECK_BIG(&big, KDN_OP_DONE, KDN_OK, POSITIONS, POSITIONS);
  CHECK_EQ(canon_mismatches(g_dst, POSITIONS, POSITIONS, 0.0f, SENTINEL), 0);
  dst_reset();
  PRIME(big);
  CHECK_OK(kdn_knowledge_fetch(g_m, NS, STR("fixture"), &dst, 1, tokens, POSITIONS, &big.r));
  CHECK_BIG(&big, KDN_OP_DONE, KDN_OK, POSITIONS, 0);
  CHECK_EQ(canon_mismatches(g_dst, POSITIONS, POSITIONS, 0.0f, SENTINEL), 0);
  /* and on failure: the defaults, the tail zeroed */
  dst_reset();
  PRIME(big);
  EXPECT(KDN_ERR_BUFFER_TOO_SMALL, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &small, 1, tokens, POSITIONS, &big.r));
  CHECK_BIG(&big, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, POSITIONS, 0);
  PRIME(big);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_retrieve(NULL, NS, &req, &dst, 1, &big.r));
  CHECK_BIG(&big, KDN_OP_PENDING, KDN_OK, 0, 0);
  PRIME(big);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_kv_store(g_m, NS, NULL, &src, 1, &big.r));
  CHECK_BIG(&big, KDN_OP_PENDING, KDN_OK, 0, 0);
  CHECK(dst_untouched());
}

/* ---- Knowledge items ------------------------------------------------------------- */

static void case_knowledge_put_null_args(void) {
  const kdn_kv_view src = src_view();
  EXPECT(KDN_ERR_INVALID_ARGUMENT,
         kdn_knowledge_put(NULL, NS, STR("doc"), 1, NULL, 0, kTokens, POSITIONS, &src, 1));
  EXPECT(KDN_ERR_INVALID_ARGUMENT,
         kdn_knowledge_put(g_m, NS, NULL, 3, 1, NULL, 0, kTokens, POSITIONS, &src, 1));
  EXPECT(KDN_ERR_INVALID_ARGUMENT,
         kdn_knowledge_put(g_m, NS, STR("doc"), 1, NULL, 0, NULL, POSITIONS, &src, 1));
  EXPECT(KDN_ERR_INVALID_ARGUMENT,
         kdn_knowledge_put(g_m, NS, STR("doc"), 1, NULL, 0, kTokens, POSITIONS, NULL, 1));
  EXPECT(KDN_ERR_INVALID_ARGUMENT,
         kdn_knowledge_put(g_m, NS, STR("doc"), 1, NULL, 9, kTokens, POSITIONS, &src, 1));
  CHECK(!doc_exists(STR("doc")));
  CHECK_EQ(stats_chunks(), 3); /* the fixture's */
}

/* Every call that takes a doc_id, with this one. */
static void expect_doc_id_at(const char *doc, size_t len, kdn_status want, int line) {
  const kdn_kv_view src = src_view(), dst = dst_view();
  const uint64_t chunks = stats_chunks();
  kdn_document_info info;
  kdn_kv_result out;
  int32_t tokens[POSITIONS];
  dst_reset();
  expect_at(kdn_knowledge_put(g_m, NS, doc, len, 1, NULL, 0, kTokens, POSITIONS, &src, 1), want,
            "kdn_knowledge_put", line);
  PRIME(info);
  expect_at(kdn_knowledge_get_info(g_m, NS, doc, len, &info), want, "kdn_knowledge_get_info", line);
  rb_check_at(is_default_kdn_document_info(&info), "kdn_knowledge_get_info: out holds its defaults", line);
  expect_at(kdn_knowledge_pin(g_m, NS, doc, len, 0), want, "kdn_knowledge_pin", line);
  expect_at(kdn_knowledge_unpin(g_m, NS, doc, len), want, "kdn_knowledge_unpin", line);
  expect_at(kdn_knowledge_expire(g_m, NS, doc, len, 0), want, "kdn_knowledge_expire", line);
  expect_at(kdn_knowledge_delete(g_m, NS, doc, len), want, "kdn_knowledge_delete", line);
  PRIME(out);
  expect_at(kdn_knowledge_fetch(g_m, NS, doc, len, &dst, 1, tokens, POSITIONS, &out), want, "kdn_knowledge_fetch",
            line);
  check_result_at(&out, KDN_OP_PENDING, KDN_OK, 0, 0, "kdn_knowledge_fetch: out is neutral", line);
  rb_check_eq_at(stats_chunks(), chunks, "nothing was stored", line);
  rb_check_at(dst_untouched(), "nothing was written", line);
  rb_check_at(doc_exists(STR("fixture")), "the fixture document is still there", line);
}

static void case_knowledge_doc_id_empty(void) {
  printf("  doc_id NULL, 0 bytes\n");
  expect_doc_id_at(NULL, 0, KDN_ERR_INVALID_ARGUMENT, __LINE__);
  printf("  doc_id \"doc\", 0 bytes\n");
  expect_doc_id_at("doc", 0, KDN_ERR_INVALID_ARGUMENT, __LINE__);
  printf("  doc_id NULL, 3 bytes\n");
  expect_doc_id_at(NULL, 3, KDN_ERR_INVALID_ARGUMENT, __LINE__);
}

static void case_knowledge_doc_id_too_long(void) {
  char id[256];
  const kdn_kv_view src = src_view();
  memset(id, 'd', sizeof id);
  printf("  doc_id of 256 bytes\n");
  expect_doc_id_at(id, sizeof id, KDN_ERR_INVALID_ARGUMENT, __LINE__);
  /* 255 bytes is the most there may be */
  CHECK_OK(kdn_knowledge_put(g_m, NS, id, 255, 1, NULL, 0, kTokens, POSITIONS, &src, 1));
  CHECK(doc_exists(id, 255));
}

static void case_knowledge_put_bad_tokens(void) {
  const kdn_kv_view src = src_view();
  int32_t tokens[POSITIONS];
  memcpy(tokens, kTokens, sizeof tokens);
  tokens[47] = -1;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_put(g_m, NS, STR("doc"), 1, NULL, 0, tokens, POSITIONS, &src, 1));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_put(g_m, NS, STR("doc"), 1, NULL, 0, kTokens, 0, &src, 1));
  CHECK(!doc_exists(STR("doc")));
  CHECK_EQ(stats_chunks(), 3);
}

static void case_knowledge_put_replaces_nothing_on_error(void) {
  /* a failed put of a new version leaves the old one as it was */
  kdn_kv_view bad = src_view();
  kdn_document_info info;
  bad.dtype = KDN_DTYPE_F16;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_put(g_m, NS, STR("fixture"), 2, NULL, 0, kTokens, 20, &bad, 1));
  kdn_document_info_init(&info, sizeof info);
  CHECK_OK(kdn_knowledge_get_info(g_m, NS, STR("fixture"), &info));
  CHECK_EQ(info.version, 1);
  CHECK_EQ(info.num_tokens, POSITIONS);
  CHECK_EQ(info.chunks_present, info.chunks);
}

static void case_knowledge_unknown_doc(void) {
  printf("  doc_id \"nope\" (never put)\n");
  {
    const kdn_kv_view dst = dst_view();
    kdn_document_info info;
    kdn_kv_result out;
    int32_t tokens[POSITIONS];
    dst_reset();
    PRIME(info);
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_get_info(g_m, NS, STR("nope"), &info));
    CHECK(is_default_kdn_document_info(&info));
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_pin(g_m, NS, STR("nope"), 0));
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_unpin(g_m, NS, STR("nope")));
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_expire(g_m, NS, STR("nope"), 0));
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_delete(g_m, NS, STR("nope")));
    PRIME(out);
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_fetch(g_m, NS, STR("nope"), &dst, 1, tokens, POSITIONS, &out));
    CHECK_RESULT_NEUTRAL(&out);
    CHECK(dst_untouched());
    /* the fixture, under another namespace, is unknown too */
    PRIME(info);
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_get_info(g_m, STR("other"), STR("fixture"), &info));
    CHECK(is_default_kdn_document_info(&info));
    PRIME(out);
    EXPECT(KDN_ERR_NOT_FOUND, kdn_knowledge_fetch(g_m, STR("other"), STR("fixture"), &dst, 1, tokens, POSITIONS, &out));
    CHECK_RESULT_NEUTRAL(&out);
    CHECK(dst_untouched());
  }
}

static void case_knowledge_fetch_too_small(void) {
  float *small = g_dst;
  int32_t tokens[POSITIONS + 1];
  kdn_kv_result out;
  kdn_kv_view v = canon_view(small, 32);
  dst_reset();
  memset(tokens, SENTINEL, sizeof tokens);
  /* room for 32 tokens of KV, 48 of tokens: nothing written, out says 48 */
  PRIME(out);
  EXPECT(KDN_ERR_BUFFER_TOO_SMALL, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, tokens, POSITIONS, &out));
  CHECK_RESULT(&out, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, POSITIONS, 0);
  CHECK(dst_untouched());
  CHECK(bytes_are(tokens, sizeof tokens, SENTINEL));
  /* room for 48 tokens of KV, 47 of tokens */
  v = dst_view();
  PRIME(out);
  EXPECT(KDN_ERR_BUFFER_TOO_SMALL, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, tokens, POSITIONS - 1, &out));
  CHECK_RESULT(&out, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, POSITIONS, 0);
  CHECK(dst_untouched());
  CHECK(bytes_are(tokens, sizeof tokens, SENTINEL));
  /* tokens only, too few */
  PRIME(out);
  EXPECT(KDN_ERR_BUFFER_TOO_SMALL, kdn_knowledge_fetch(g_m, NS, STR("fixture"), NULL, 0, tokens, 10, &out));
  CHECK_RESULT(&out, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, POSITIONS, 0);
  CHECK(bytes_are(tokens, sizeof tokens, SENTINEL));
  /* KV only (tokens NULL), too little room */
  v = canon_view(small, POSITIONS - 1);
  PRIME(out);
  EXPECT(KDN_ERR_BUFFER_TOO_SMALL, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, NULL, 0, &out));
  CHECK_RESULT(&out, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, POSITIONS, 0);
  CHECK(dst_untouched());
  /* an exact fit is enough */
  v = dst_view();
  PRIME(out);
  CHECK_OK(kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, tokens, POSITIONS, &out));
  CHECK_RESULT(&out, KDN_OP_DONE, KDN_OK, POSITIONS, 0);
  CHECK(memcmp(tokens, kTokens, sizeof kTokens) == 0);
  CHECK(bytes_are(&tokens[POSITIONS], sizeof tokens[0], SENTINEL));
  CHECK_EQ(canon_mismatches(g_dst, POSITIONS, POSITIONS, 0.0f, SENTINEL), 0);
}

static void case_knowledge_fetch_bad_args(void) {
  kdn_kv_view v = dst_view();
  int32_t tokens[POSITIONS];
  kdn_kv_result out;
  dst_reset();
  memset(tokens, SENTINEL, sizeof tokens);
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(NULL, NS, STR("fixture"), &v, 1, tokens, POSITIONS, &out));
  CHECK_RESULT_NEUTRAL(&out);
  /* out is required */
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, tokens, POSITIONS, NULL));
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, NULL, POSITIONS, &out));
  CHECK_RESULT_NEUTRAL(&out);
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(g_m, NS, STR("fixture"), NULL, 1, tokens, POSITIONS, &out));
  CHECK_RESULT_NEUTRAL(&out);
  /* a fetch writes a length the caller does not know: the view's room must be set */
  v.num_tokens = 0;
  PRIME(out);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_fetch(g_m, NS, STR("fixture"), &v, 1, tokens, POSITIONS, &out));
  CHECK_RESULT_NEUTRAL(&out);
  CHECK(dst_untouched());
  CHECK(bytes_are(tokens, sizeof tokens, SENTINEL));
}

static void case_knowledge_list_bad_args(void) {
  kdn_document_info docs[3];
  size_t count = 77;
  int i;
  for (i = 0; i < 3; ++i) kdn_document_info_init(&docs[i], sizeof docs[i]);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(NULL, NS, docs, 2, &count));
  CHECK_EQ(count, 0);
  count = 77;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(g_m, NS, NULL, 2, &count));
  CHECK_EQ(count, 0);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(g_m, NS, docs, 2, NULL));
  CHECK_EQ(docs[0].filled_size, 0);
  /* capacity 0 and out NULL: just the count */
  CHECK_OK(kdn_knowledge_list(g_m, NS, NULL, 0, &count));
  CHECK_EQ(count, 1);
}

static void case_knowledge_list_size(void) {
  kdn_document_info docs[3];
  size_t count = 77;
  int i;
  for (i = 0; i < 3; ++i) kdn_document_info_init(&docs[i], sizeof docs[i]);
  docs[0].struct_size = 0;
  EXPECT(KDN_ERR_VERSION, kdn_knowledge_list(g_m, NS, docs, 2, &count));
  CHECK_EQ(count, 0);
  count = 77;
  docs[0].struct_size = KDN_DOCUMENT_INFO_SIZE_V1 - 8;
  EXPECT(KDN_ERR_VERSION, kdn_knowledge_list(g_m, NS, docs, 2, &count));
  CHECK_EQ(count, 0);
  count = 77;
  docs[0].struct_size = sizeof docs[0];
  docs[1].struct_size = sizeof docs[1] + 8;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_list(g_m, NS, docs, 2, &count));
  CHECK_EQ(count, 0);
  CHECK_EQ(docs[0].filled_size, 0);
}

static void case_knowledge_get_info_bad_args(void) {
  kdn_document_info info;
  PRIME(info);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_get_info(NULL, NS, STR("fixture"), &info));
  CHECK(is_default_kdn_document_info(&info));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_get_info(g_m, NS, STR("fixture"), NULL));
  prime_at(&info, sizeof info, 0);
  EXPECT(KDN_ERR_VERSION, kdn_knowledge_get_info(g_m, NS, STR("fixture"), &info));
  CHECK(unwritten(&info, sizeof info));
  prime_at(&info, sizeof info, KDN_DOCUMENT_INFO_SIZE_V1 - 8);
  EXPECT(KDN_ERR_VERSION, kdn_knowledge_get_info(g_m, NS, STR("fixture"), &info));
  CHECK(unwritten(&info, sizeof info));
}

static void case_knowledge_negative_ttl(void) {
  kdn_document_info info;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(g_m, NS, STR("fixture"), -1));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(g_m, NS, STR("fixture"), -1));
  kdn_document_info_init(&info, sizeof info);
  CHECK_OK(kdn_knowledge_get_info(g_m, NS, STR("fixture"), &info));
  CHECK_EQ(info.pinned, 0);
  CHECK(info.expires_in_ms == -1);
}

static void case_knowledge_null_model(void) {
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_pin(NULL, NS, STR("fixture"), 0));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_unpin(NULL, NS, STR("fixture")));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_expire(NULL, NS, STR("fixture"), 0));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_knowledge_delete(NULL, NS, STR("fixture")));
  CHECK(doc_exists(STR("fixture")));
}

/* ---- Statistics -------------------------------------------------------------- */

static void case_stats_bad_args(void) {
  kdn_stats s;
  PRIME(s);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_stats(NULL, &s));
  CHECK(is_default_kdn_stats(&s));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_stats(g_rt, NULL));
  prime_at(&s, sizeof s, 0);
  EXPECT(KDN_ERR_VERSION, kdn_runtime_get_stats(g_rt, &s));
  CHECK(unwritten(&s, sizeof s));
  prime_at(&s, sizeof s, KDN_STATS_SIZE_V1 - 8);
  EXPECT(KDN_ERR_VERSION, kdn_runtime_get_stats(g_rt, &s));
  CHECK(unwritten(&s, sizeof s));
}

static void case_latency_bad_args(void) {
  kdn_latency lat;
  PRIME(lat);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(g_rt, (kdn_latency_kind)3, &lat));
  CHECK(is_default_kdn_latency(&lat));
  PRIME(lat);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(g_rt, (kdn_latency_kind)-1, &lat));
  CHECK(is_default_kdn_latency(&lat));
  PRIME(lat);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(NULL, KDN_LATENCY_LOOKUP, &lat));
  CHECK(is_default_kdn_latency(&lat));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_latency(g_rt, KDN_LATENCY_LOOKUP, NULL));
  prime_at(&lat, sizeof lat, KDN_LATENCY_SIZE_V1 - 8);
  EXPECT(KDN_ERR_VERSION, kdn_runtime_get_latency(g_rt, KDN_LATENCY_LOAD, &lat));
  CHECK(unwritten(&lat, sizeof lat));
}

static void case_tier_count_bad_args(void) {
  uint32_t n = 77;
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_tier_count(NULL, &n));
  CHECK_EQ(n, 0); /* neutral */
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_tier_count(g_rt, NULL));
}

static void case_tier_index_out_of_range(void) {
  kdn_tier_stats ts;
  uint32_t n = 0;
  CHECK_OK(kdn_runtime_get_tier_count(g_rt, &n));
  CHECK_EQ(n, 1);
  PRIME(ts);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_tier_stats(g_rt, n, &ts));
  CHECK(is_default_kdn_tier_stats(&ts));
  PRIME(ts);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_tier_stats(g_rt, UINT32_MAX, &ts));
  CHECK(is_default_kdn_tier_stats(&ts));
  PRIME(ts);
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_tier_stats(NULL, 0, &ts));
  CHECK(is_default_kdn_tier_stats(&ts));
  EXPECT(KDN_ERR_INVALID_ARGUMENT, kdn_runtime_get_tier_stats(g_rt, 0, NULL));
}

static void case_tier_stats_size(void) {
  kdn_tier_stats ts;
  prime_at(&ts, sizeof ts, 0);
  EXPECT(KDN_ERR_VERSION, kdn_runtime_get_tier_stats(g_rt, 0, &ts));
  CHECK(unwritten(&ts, sizeof ts));
  prime_at(&ts, sizeof ts, KDN_TIER_STATS_SIZE_V1 - 8);
  EXPECT(KDN_ERR_VERSION, kdn_runtime_get_tier_stats(g_rt, 0, &ts));
  CHECK(unwritten(&ts, sizeof ts));
}

/* ---- Blending (experimental) ------------------------------------------------------- */

static int g_blend_calls;
static kdn_status blend_never(void *user, uint32_t layer, const int32_t *positions, const int32_t *tokens,
                              size_t count, float *hidden, size_t hidden_len, uint32_t hidden_dim, float *k, float *v,
                              size_t kv_len, size_t total) {
  (void)user;
  (void)layer;
  (void)positions;
  (void)tokens;
  (void)count;
  (void)hidden;
  (void)hidden_len;
  (void)hidden_dim;
  (void)k;
  (void)v;
  (void)kv_len;
  (void)total;
  ++g_blend_calls;
  return KDN_ERR_INTERNAL;
}

static const int32_t kQuery[4] = {261, 378, 432, 383};

/* The context: the fixture document then 4 query tokens, 52 tokens. */
static float g_ctx[(POSITIONS + 4) * ELEMS_PER_TOKEN];

static void blend_setup(kdn_blend_segment seg[2], kdn_blend_options *opts, kdn_kv_view *view) {
  kdn_blend_segment_init(&seg[0], sizeof seg[0]);
  seg[0].kind = KDN_SEGMENT_DOCUMENT;
  seg[0].doc_id = "fixture";
  seg[0].doc_id_len = 7;
  kdn_blend_segment_init(&seg[1], sizeof seg[1]);
  seg[1].kind = KDN_SEGMENT_TOKENS;
  seg[1].tokens = kQuery;
  seg[1].num_tokens = 4;
  kdn_blend_options_init(opts, sizeof *opts);
  opts->hidden_dim = 64;
  opts->layer_fn = blend_never;
  memset(g_ctx, SENTINEL, sizeof g_ctx);
  *view = canon_view(g_ctx, POSITIONS + 4);
  g_blend_calls = 0;
}

static void expect_blend_at(const kdn_blend_segment *seg, size_t nseg, const kdn_blend_options *opts,
                            const kdn_kv_view *view, kdn_status want, int line) {
  kdn_blend_report report;
  kdn_blend_report_init(&report, sizeof report);
  expect_at(kdn_kv_blend(g_m, NS, seg, nseg, opts, view, 1, &report), want, "kdn_kv_blend", line);
  rb_check_eq_at(report.filled_size, 0, "report untouched", line);
  rb_check_eq_at((unsigned long long)g_blend_calls, 0, "the callback was not called", line);
  rb_check_at(bytes_are(g_ctx, sizeof g_ctx, SENTINEL), "the context views were not written", line);
}
#define EXPECT_BLEND(seg, nseg, opts, view, want) expect_blend_at((seg), (nseg), (opts), (view), (want), __LINE__)

static void case_blend_null_callback(void) {
  kdn_blend_segment seg[2];
  kdn_blend_options opts;
  kdn_kv_view view;
  blend_setup(seg, &opts, &view);
  opts.layer_fn = NULL;
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  EXPECT_BLEND(seg, 2, NULL, &view, KDN_ERR_INVALID_ARGUMENT);
}

static void case_blend_hidden_dim_zero(void) {
  kdn_blend_segment seg[2];
  kdn_blend_options opts;
  kdn_kv_view view;
  blend_setup(seg, &opts, &view);
  opts.hidden_dim = 0;
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
}

static void case_blend_bad_options(void) {
  static const uint32_t beyond[1] = {LAYERS};
  kdn_blend_segment seg[2];
  kdn_blend_options opts;
  kdn_kv_view view;
  int i;
  for (i = 0; i < 8; ++i) {
    blend_setup(seg, &opts, &view);
    switch (i) {
      case 0: opts.ratio = 1.5f, printf("  ratio 1.5\n"); break;
      case 1: opts.ratio = -0.5f, printf("  ratio -0.5 (only -1 asks for the default)\n"); break;
      case 6: opts.kv_fn = opts.layer_fn, opts.kv_cost = 0.0f, printf("  kv_fn without kv_cost\n"); break;
      case 7: opts.kv_fn = opts.layer_fn, opts.kv_cost = 2.0f, printf("  kv_cost 2\n"); break;
      case 2: opts.check_layers = NULL, opts.num_check_layers = 1, printf("  check_layers NULL, 1 of them\n"); break;
      case 3: opts.check_layers = beyond, opts.num_check_layers = 1, printf("  check layer 5 of 5\n"); break;
      case 4: opts.rope_scaling = (kdn_rope_scaling)3, printf("  rope_scaling 3\n"); break;
      default:
        opts.rope_scaling = KDN_ROPE_SCALING_LINEAR;
        opts.rope_factor = 0.0f;
        printf("  linear RoPE scaling, rope_factor 0\n");
        break;
    }
    EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  }
  blend_setup(seg, &opts, &view);
  opts.struct_size = 4;
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_VERSION);
}

static void case_blend_bad_segments(void) {
  kdn_blend_segment seg[3];
  kdn_blend_options opts;
  kdn_kv_view view;
  blend_setup(seg, &opts, &view);
  printf("  segments NULL, 2 of them\n");
  EXPECT_BLEND(NULL, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  printf("  no segments\n");
  EXPECT_BLEND(seg, 0, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  seg[1].kind = (kdn_segment_kind)2;
  printf("  segment kind 2\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  blend_setup(seg, &opts, &view);
  seg[1].struct_size = sizeof seg[1] + 8;
  printf("  segments[1].struct_size differs\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  blend_setup(seg, &opts, &view);
  seg[0].struct_size = 4;
  printf("  segments[0].struct_size 4\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_VERSION);
  blend_setup(seg, &opts, &view);
  seg[0].doc_id_len = 0;
  printf("  a document segment with an empty doc_id\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  blend_setup(seg, &opts, &view);
  seg[1].tokens = NULL;
  printf("  a tokens segment with tokens NULL\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  blend_setup(seg, &opts, &view);
  {
    static const int32_t negative[4] = {261, -378, 432, 383};
    seg[1].tokens = negative; /* refused as a store refuses it */
    printf("  a tokens segment with a negative token id\n");
    EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
  }
  blend_setup(seg, &opts, &view);
  view.num_tokens = POSITIONS + 3; /* one short of the context */
  view.size_bytes = canon_bytes(POSITIONS + 3);
  printf("  context views one token short\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_BUFFER_TOO_SMALL);
  blend_setup(seg, &opts, &view);
  view.num_tokens = 0; /* "exactly the context": unknowable while a document can change */
  printf("  views without num_tokens, with a document segment\n");
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_INVALID_ARGUMENT);
}

static void case_blend_unknown_doc(void) {
  kdn_blend_segment seg[2];
  kdn_blend_options opts;
  kdn_kv_view view;
  blend_setup(seg, &opts, &view);
  seg[0].doc_id = "nope";
  seg[0].doc_id_len = 4;
  EXPECT_BLEND(seg, 2, &opts, &view, KDN_ERR_NOT_FOUND);
}

/* ---- The cases --------------------------------------------------------------------- */

typedef struct {
  const char *name;
  void (*run)(void);
} bad_case;

#define CASE(name) {#name, case_##name}
static const bad_case kCases[] = {
    CASE(status_string_unknown),
    CASE(init_null),
    CASE(init_size_zero),
    CASE(init_size_small),
    CASE(runtime_create_null_out),
    CASE(runtime_options_size_zero),
    CASE(runtime_options_size_small),
    CASE(runtime_options_unknown_tail),
    CASE(runtime_chunk_tokens_zero),
    CASE(runtime_capacity_zero),
    CASE(runtime_tiers_null),
    CASE(runtime_too_many_tiers),
    CASE(runtime_worker_threads),
    CASE(runtime_reserved_nonzero),
    CASE(tier_size_small),
    CASE(tier_unknown_tail),
    CASE(tier_sizes_differ),
    CASE(tier_kind_unknown),
    CASE(tier_policy_unknown),
    CASE(tier_watermarks),
    CASE(tier_capacity_zero),
    CASE(tier_disk_without_path),
    CASE(tier_codec_unknown),
    CASE(tier_levels_bad),
    CASE(editor_bad_args),
    CASE(model_create_null),
    CASE(model_spec_size),
    CASE(model_spec_range),
    CASE(model_spec_enum_unknown),
    CASE(model_fingerprint_empty),
    CASE(model_get_null),
    CASE(lookup_null_args),
    CASE(namespace_empty),
    CASE(namespace_too_long),
    CASE(request_negative_token),
    CASE(request_target_absurd),
    CASE(request_zero_tokens),
    CASE(request_tokens_null),
    CASE(request_size),
    CASE(request_sizes_differ),
    CASE(request_reserved_nonzero),
    CASE(hash_bytes_too_big),
    CASE(hash_block_tokens_zero),
    CASE(hash_chunk_not_multiple),
    CASE(hash_null),
    CASE(lookup_result_size),
    CASE(views_null),
    CASE(views_none),
    CASE(view_size),
    CASE(view_sizes_differ),
    CASE(views_layers_missing),
    CASE(views_layers_overlap),
    CASE(view_num_layers_wrong),
    CASE(view_dtype_mismatch),
    CASE(view_dtype_unknown),
    CASE(view_memory_unknown),
    CASE(view_layout_unknown),
    CASE(view_no_memory),
    CASE(view_negative_stride),
    CASE(view_aliasing_strides),
    CASE(view_reserved_nonzero),
    CASE(view_size_bytes_small),
    CASE(view_num_tokens_small),
    CASE(view_layer_elements_small),
    CASE(paged_null_table),
    CASE(paged_block_out_of_range),
    CASE(paged_table_short),
    CASE(paged_block_size_zero),
    CASE(paged_with_data),
    CASE(store_null_args),
    CASE(retrieve_null_args),
    CASE(load_async_null_args),
    CASE(save_async_null_args),
    CASE(op_null_handle),
    CASE(op_layer_ready_on_load),
    CASE(op_wait_layer_on_save),
    CASE(op_layer_out_of_range),
    CASE(op_result_size),
    CASE(kv_result_init_small),
    CASE(kv_result_required),
    CASE(kv_result_store_optional),
    CASE(kv_result_size_small),
    CASE(kv_result_larger),
    CASE(knowledge_put_null_args),
    CASE(knowledge_doc_id_empty),
    CASE(knowledge_doc_id_too_long),
    CASE(knowledge_put_bad_tokens),
    CASE(knowledge_put_replaces_nothing_on_error),
    CASE(knowledge_unknown_doc),
    CASE(knowledge_fetch_too_small),
    CASE(knowledge_fetch_bad_args),
    CASE(knowledge_list_bad_args),
    CASE(knowledge_list_size),
    CASE(knowledge_get_info_bad_args),
    CASE(knowledge_negative_ttl),
    CASE(knowledge_null_model),
    CASE(stats_bad_args),
    CASE(latency_bad_args),
    CASE(tier_count_bad_args),
    CASE(tier_index_out_of_range),
    CASE(tier_stats_size),
    CASE(blend_null_callback),
    CASE(blend_hidden_dim_zero),
    CASE(blend_bad_options),
    CASE(blend_bad_segments),
    CASE(blend_unknown_doc),
};
enum { NUM_CASES = sizeof kCases / sizeof kCases[0] };

/* The fixture runtime, model and document. 1: ready. */
static int setup(void) {
  kdn_runtime_options opts;
  const kdn_kv_view src = src_view();
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.chunk_tokens = CHUNK;
  opts.host_capacity_bytes = 64u << 20;
  if (kdn_runtime_create(&opts, &g_rt) != KDN_OK) {
    printf("setup: kdn_runtime_create: %s\n", kdn_last_error_message());
    return 0;
  }
  g_m = new_model(g_rt, FINGERPRINT);
  if (g_m == NULL) return 0;
  canon_fill(g_src, POSITIONS, POSITIONS, 0.0f);
  dst_reset();
  if (kdn_knowledge_put(g_m, NS, STR("fixture"), 1, STR("meta"), kTokens, POSITIONS, &src, 1) != KDN_OK) {
    printf("setup: kdn_knowledge_put: %s\n", kdn_last_error_message());
    return 0;
  }
  return 1;
}

int main(int argc, char **argv) {
  const bad_case *c = NULL;
  int i, loaded;
  if (argc != 2) {
    printf("usage: %s --list | <case>\n", argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "--list") == 0) {
    for (i = 0; i < NUM_CASES; ++i) printf("%s\n", kCases[i].name);
    return 0;
  }
  for (i = 0; i < NUM_CASES; ++i)
    if (strcmp(argv[1], kCases[i].name) == 0) c = &kCases[i];
  if (c == NULL) {
    printf("no case named \"%s\" (--list lists them)\n", argv[1]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* every line out, even before a crash */
  loaded = reference_setup();
  if (loaded != 0) return loaded;
  if (!setup()) {
    kdn_model_destroy(g_m);
    kdn_runtime_destroy(g_rt);
    reference_free();
    return 1;
  }
  printf("case %s\n", c->name);
  c->run();
  kdn_model_destroy(g_m);
  kdn_runtime_destroy(g_rt);
  reference_free();
  printf("%s %s: %d checks, %d failed\n", g_failures == 0 ? "ok" : "FAIL", c->name, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
