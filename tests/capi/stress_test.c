// SPDX-License-Identifier: Apache-2.0
/* Concurrency stress of the C ABI: seven threads use one runtime at once for
 * KDN_STRESS_SECONDS (default 20) or KDN_STRESS_OPS operations per thread
 * (default 1,000,000), whichever ends first. The host tier holds about a
 * dozen chunks, so chunks are evicted (to a disk tier in a temporary
 * directory, and from it) all the time.
 *
 * Every byte of KV is a known function of its tokens: token sequence s is
 * the reference tokens with token 0 replaced by an id of its own, and its KV
 * is the reference model's KV plus a per-sequence offset. So every byte a
 * retrieve, load or fetch writes is checked, a partial hit for the tokens it
 * covers, and every byte it must not write is checked to be untouched.
 *
 *   kv-canonical  kdn_kv_store / kdn_kv_retrieve / batched kdn_kv_lookup, one allocation
 *   kv-paged      the same through per-layer paged views with a block table
 *   async         kdn_kv_save_async (layer by layer) and kdn_kv_load_async with
 *                 kdn_op_wait_layer per layer, some cancelled
 *   documents     put / fetch / get_info / list / pin / unpin / expire / delete of
 *                 documents, and fetches of the race document
 *   race-put      puts versions of 20, 37 and 48 tokens of one doc_id, deletes it
 *   race-fetch    fetches it into buffers that end where an unmapped page begins:
 *                 a fetch fills exactly the length it reports, or says
 *                 KDN_ERR_BUFFER_TOO_SMALL and writes nothing; never past the end
 *   race-blend    blends it and 4 query tokens (kdn_kv_blend, no recompute past
 *                 the check layer) into a context that ends at an unmapped page:
 *                 the context is one version's, its cached KV that version's
 *                 (layers past the check layer), nothing written past it, or
 *                 KDN_ERR_BUFFER_TOO_SMALL and nothing written at all
 * Every thread reads the statistics as it goes. Prints the counts; exits 1
 * on any mismatch or unexpected status, 77 if the reference model is missing.
 */
#define _DEFAULT_SOURCE
#define _XOPEN_SOURCE 700
#define KDN_EXPERIMENTAL /* kdn_kv_blend */
#include "robustness.h"

#include <ftw.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum {
  CHUNK = 16,
  SENTINEL = 0x5A,
  NUM_SEQS = 24,       /* token sequences of the KV threads */
  NUM_DOCS = 6,        /* documents of the documents thread */
  NUM_VERSIONS = 3,    /* of the race document */
  NUM_THREADS = 7,
  PAGED_BLOCKS = 4,    /* per layer, of which 3 hold the 48 tokens */
  PAGED_ELEMS = PAGED_BLOCKS * CHUNK * TOKEN_ELEMS,
  WAIT_MS = 60000,     /* no single wait may take this long */
  MAX_REPORTS = 8      /* mismatch reports printed per thread */
};

static const char kNs[] = "stress";
#define NS kNs, (sizeof kNs - 1)
static const char kDocNs[] = "stress-docs";
#define DOC_NS kDocNs, (sizeof kDocNs - 1)
static const char kRaceDoc[] = "race";
#define RACE_DOC kRaceDoc, (sizeof kRaceDoc - 1)
static const uint64_t kRaceLength[NUM_VERSIONS] = {20, 37, 48};
static const uint64_t kFetchRoom[3] = {20, 37, 48};
enum { QUERY = 4 };                                       /* blend: tokens after the race document */
static const uint64_t kBlendRoom[3] = {20 + QUERY, 37 + QUERY, 48 + QUERY};
static const int32_t kPagedTable[3] = {2, 0, 3}; /* block 1 is never used */

/* ---- Contents: known functions of the tokens ----------------------------- */

typedef struct {
  int32_t tokens[POSITIONS];
  float add;
  float *kv; /* canonical, room POSITIONS, every token filled */
} content;

static content g_seq[NUM_SEQS];      /* token 0: 1000 + s */
static content g_doc[NUM_DOCS];      /* chunk c's token 0: 2000 + 10 j + c; doc-j has doc_length(j) tokens */
static content g_race[NUM_VERSIONS]; /* chunk c's token 0: 3000 + 10 k + c; version k has kRaceLength[k] */

static uint64_t doc_length(int j) { return 5u + 8u * (uint64_t)j; }

/* The reference tokens; the first token of each chunk is first + the
 * chunk's index when `every_chunk`, else only token 0 is `first`.
 * Sequences (prefix keys: a chunk's key covers every token before it) need
 * only token 0 of their own. Documents are stored under content keys of a
 * chunk's tokens alone, and kdn keeps one chunk per key: a document's KV
 * depends on all its earlier tokens, so each document chunk gets tokens no
 * other document has. */
static int content_init(content *c, int32_t first, int every_chunk, float add) {
  int i;
  memcpy(c->tokens, kTokens, sizeof c->tokens);
  c->tokens[0] = first;
  for (i = CHUNK; every_chunk && i < POSITIONS; i += CHUNK) c->tokens[i] = first + i / CHUNK;
  c->add = add;
  c->kv = malloc(canon_bytes(POSITIONS));
  if (c->kv == NULL) return 0;
  canon_fill(c->kv, POSITIONS, POSITIONS, add);
  return 1;
}

/* ---- Per-thread state ---------------------------------------------------- */

typedef struct {
  int index;
  const char *name;
  uint64_t rng;
  uint64_t ops, bytes_checked, mismatches, errors, busy;
  uint64_t hits, partial_hits, misses;                    /* retrieves and loads */
  uint64_t fetch_ok, fetch_too_small, fetch_not_found;   /* fetches */
  uint64_t cancelled;
  uint64_t prefill_seen; /* kdn_stats.prefill_tokens last read: never falls */
  int reports;
} worker;

static kdn_runtime *g_rt;
static kdn_model *g_m;
static double g_deadline;
static uint64_t g_budget;
static size_t g_page;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int keep_going(const worker *w) { return w->ops < g_budget && now_s() < g_deadline; }

static uint32_t rnd(worker *w, uint32_t n) {
  /* xorshift64* */
  w->rng ^= w->rng >> 12;
  w->rng ^= w->rng << 25;
  w->rng ^= w->rng >> 27;
  return (uint32_t)((w->rng * 2685821657736338717ull) >> 33) % n;
}

static void mismatch(worker *w, uint64_t count, const char *what) {
  w->mismatches += count;
  if (w->reports++ < MAX_REPORTS) printf("[%s] MISMATCH: %s (%llu elements)\n", w->name, what, (unsigned long long)count);
}

/* A canonical buffer's mismatches, with the first one described. */
static void canon_mismatch(worker *w, uint64_t count, const char *what, const float *buf, uint64_t room, uint64_t n,
                           float add) {
  char detail[300];
  if (w->reports < MAX_REPORTS) {
    canon_describe(buf, room, n, add, SENTINEL, detail, sizeof detail);
    printf("[%s] %s\n", w->name, detail);
  }
  mismatch(w, count, what);
}

/* A status the operation may not return. */
static void unexpected(worker *w, kdn_status s, const char *what) {
  ++w->errors;
  if (w->reports++ < MAX_REPORTS)
    printf("[%s] UNEXPECTED %s from %s: \"%s\"\n", w->name, kdn_status_string(s), what, kdn_last_error_message());
}

/* KDN_OK; KDN_ERR_BUSY is allowed (counted): anything else is an error. */
static int ok_or_busy(worker *w, kdn_status s, const char *what) {
  if (s == KDN_OK) return 1;
  if (s == KDN_ERR_BUSY) {
    ++w->busy;
    return 0;
  }
  unexpected(w, s, what);
  return 0;
}

/* A leading-token count a retrieve or load may report for a request of n
 * tokens. (Not only whole chunks: a stored trailing partial chunk counts
 * for any request that contains all of its tokens.) */
static int plausible_prefix(uint64_t got, uint64_t n) { return got <= n; }

static void count_hit(worker *w, uint64_t got, uint64_t n) {
  if (got == 0) ++w->misses;
  else if (got < n) ++w->partial_hits;
  else ++w->hits;
}

/* A kdn_kv_result as a call returned it: filled to its 48 bytes, in this
 * state and status, never LOSSY (every tier here is raw), num_failed 0
 * unless a load reports failed ranges. */
static void check_result(worker *w, const kdn_kv_result *r, kdn_op_state state, kdn_status status, int is_load,
                         const char *what) {
  char text[200];
  if (r->struct_size == KDN_KV_RESULT_SIZE_V1 && r->filled_size == KDN_KV_RESULT_SIZE_V1 && r->state == state &&
      r->status == status && r->flags == 0 && r->reserved0 == 0 && (is_load || r->num_failed == 0))
    return;
  snprintf(text, sizeof text,
           "%s: kdn_kv_result {size %u, filled %u, state %d, status %s, flags %u, num_failed %llu}, want state %d, "
           "status %s, no flags",
           what, (unsigned)r->struct_size, (unsigned)r->filled_size, (int)r->state, kdn_status_string(r->status),
           (unsigned)r->flags, (unsigned long long)r->num_failed, (int)state, kdn_status_string(status));
  mismatch(w, 1, text);
}

/* ---- Statistics, read by every thread ------------------------------------ */

static void read_stats(worker *w) {
  kdn_stats s;
  kdn_latency lat;
  kdn_tier_stats ts;
  uint32_t tiers = 0, i;
  int k;
  /* 1.4: prefill reports race with the loads that price their tokens. */
  if (!ok_or_busy(w, kdn_model_report_prefill(g_m, 1 + (w->rng >> 40) % 64, 1000 + (w->rng >> 20) % 100000),
                  "kdn_model_report_prefill"))
    return;
  kdn_stats_init(&s, sizeof s);
  if (!ok_or_busy(w, kdn_runtime_get_stats(g_rt, &s), "kdn_runtime_get_stats")) return;
  if (s.filled_size < KDN_STATS_SIZE_V1) mismatch(w, 1, "kdn_stats.filled_size below its first size");
  if (s.prefill_tokens < w->prefill_seen + 1) mismatch(w, 1, "kdn_stats.prefill_tokens fell or missed a report");
  w->prefill_seen = s.prefill_tokens;
  for (k = 0; k < 3; ++k) {
    kdn_latency_init(&lat, sizeof lat);
    if (ok_or_busy(w, kdn_runtime_get_latency(g_rt, (kdn_latency_kind)k, &lat), "kdn_runtime_get_latency") &&
        !(lat.p50_us <= lat.max_us + 1e-9 && lat.mean_us >= 0.0))
      mismatch(w, 1, "latency: p50 above max, or a negative mean");
  }
  if (!ok_or_busy(w, kdn_runtime_get_tier_count(g_rt, &tiers), "kdn_runtime_get_tier_count")) return;
  if (tiers != 2) mismatch(w, 1, "the runtime does not have 2 tiers");
  for (i = 0; i < tiers; ++i) {
    kdn_tier_stats_init(&ts, sizeof ts);
    if (ok_or_busy(w, kdn_runtime_get_tier_stats(g_rt, i, &ts), "kdn_runtime_get_tier_stats") &&
        (ts.filled_size < KDN_TIER_STATS_SIZE_V1 || memchr(ts.name, '\0', sizeof ts.name) == NULL ||
         memchr(ts.codec, '\0', sizeof ts.codec) == NULL))
      mismatch(w, 1, "kdn_tier_stats: short filled_size, or an unterminated name or codec");
  }
}

/* ---- Canonical KV: store, retrieve, lookup --------------------------------- */

static void lookup_batch(worker *w) {
  kdn_request req[4];
  kdn_lookup_result res[4];
  uint64_t n[4];
  int i;
  for (i = 0; i < 4; ++i) {
    const content *c = &g_seq[rnd(w, NUM_SEQS)];
    n[i] = 1 + rnd(w, POSITIONS);
    req[i] = token_request(c->tokens, (size_t)n[i]);
    kdn_lookup_result_init(&res[i], sizeof res[i]);
  }
  if (!ok_or_busy(w, kdn_kv_lookup(g_m, NS, req, 4, res), "kdn_kv_lookup")) return;
  for (i = 0; i < 4; ++i) {
    uint32_t t;
    if (res[i].status != KDN_OK) {
      unexpected(w, res[i].status, "kdn_kv_lookup results[i].status");
      continue;
    }
    if (!plausible_prefix(res[i].cached_tokens, n[i])) mismatch(w, 1, "lookup: cached_tokens not a chunk prefix");
    if (res[i].num_tiers != 2) mismatch(w, 1, "lookup: num_tiers is not 2");
    for (t = 0; t < res[i].num_tiers && t < KDN_MAX_TIERS; ++t)
      if (res[i].tier_tokens[t] > res[i].cached_tokens) mismatch(w, 1, "lookup: a tier holds more than is cached");
  }
}

static void *run_kv_canonical(void *arg) {
  worker *w = arg;
  float *dst = malloc(canon_bytes(POSITIONS));
  if (dst == NULL) {
    ++w->errors;
    return NULL;
  }
  while (keep_going(w)) {
    const content *c = &g_seq[rnd(w, NUM_SEQS)];
    const uint64_t n = 1 + rnd(w, POSITIONS);
    const kdn_request req = token_request(c->tokens, (size_t)n);
    const uint32_t what = rnd(w, 10);
    if (what < 4) {
      const kdn_kv_view src = canon_view(c->kv, POSITIONS);
      kdn_kv_result stored;
      kdn_kv_result_init(&stored, sizeof stored);
      if (ok_or_busy(w, kdn_kv_store(g_m, NS, &req, &src, 1, &stored), "kdn_kv_store")) {
        check_result(w, &stored, KDN_OP_DONE, KDN_OK, 0, "store");
        if (stored.tokens > n) mismatch(w, 1, "store: more tokens cached than requested");
      }
    } else if (what < 8) {
      const kdn_kv_view view = canon_view(dst, POSITIONS);
      kdn_kv_result res;
      uint64_t got, bad;
      memset(dst, SENTINEL, canon_bytes(POSITIONS));
      kdn_kv_result_init(&res, sizeof res);
      if (ok_or_busy(w, kdn_kv_retrieve(g_m, NS, &req, &view, 1, &res), "kdn_kv_retrieve")) {
        got = res.tokens;
        check_result(w, &res, KDN_OP_DONE, KDN_OK, 0, "retrieve");
        if (!plausible_prefix(res.covered, n)) mismatch(w, 1, "retrieve: covered more than the request");
        if (got > res.covered) mismatch(w, 1, "retrieve: more tokens written than covered");
        bad = canon_mismatches(dst, POSITIONS, got, c->add, SENTINEL);
        if (bad != 0)
          canon_mismatch(w, bad, "retrieve (canonical): wrong KV, or bytes written past the hit", dst, POSITIONS, got,
                         c->add);
        w->bytes_checked += canon_bytes(POSITIONS);
        count_hit(w, got, n);
      }
    } else {
      lookup_batch(w);
    }
    if (++w->ops % 64 == 0) read_stats(w);
  }
  free(dst);
  return NULL;
}

/* ---- Paged KV: per-layer allocations, a block table ------------------------- */

typedef struct {
  float *layer[LAYERS][2]; /* [layer][k|v]: PAGED_ELEMS each */
  void *k[LAYERS], *v[LAYERS];
} paged_kv;

static size_t paged_offset(uint64_t t, int h, int d) {
  return ((size_t)kPagedTable[t / CHUNK] * CHUNK + (size_t)(t % CHUNK)) * TOKEN_ELEMS + (size_t)h * HEAD_DIM + (size_t)d;
}

static kdn_kv_view paged_view(paged_kv *p) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  int l;
  for (l = 0; l < LAYERS; ++l) {
    p->k[l] = p->layer[l][0];
    p->v[l] = p->layer[l][1];
  }
  v.layout = KDN_LAYOUT_PAGED_NHD;
  v.k_layers = p->k;
  v.v_layers = p->v;
  v.block_size = CHUNK;
  v.block_table = kPagedTable;
  v.block_table_len = 3;
  v.num_blocks = PAGED_BLOCKS;
  return v;
}

static void paged_fill(paged_kv *p, const content *c, uint64_t n) {
  int l, kv, h, d;
  uint64_t t;
  for (l = 0; l < LAYERS; ++l) memset(p->layer[l][0], SENTINEL, PAGED_ELEMS * sizeof(float));
  for (l = 0; l < LAYERS; ++l) memset(p->layer[l][1], SENTINEL, PAGED_ELEMS * sizeof(float));
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < n; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) p->layer[l][kv][paged_offset(t, h, d)] = kv_value(l, kv, (int)t, h, d, c->add);
}

/* Elements of tokens [0, n) that are wrong, plus every other element of the
 * allocations (slots past n, the unused block) that is not SENTINEL. */
static uint64_t paged_mismatches(const paged_kv *p, const content *c, uint64_t n) {
  static const unsigned char s4[4] = {SENTINEL, SENTINEL, SENTINEL, SENTINEL};
  uint64_t bad = 0, t;
  int l, kv, h, d;
  size_t i;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv) {
      const float *a = p->layer[l][kv];
      unsigned char *expected_written = calloc(PAGED_ELEMS, 1);
      if (expected_written == NULL) return 1;
      for (t = 0; t < n; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const size_t off = paged_offset(t, h, d);
            const float want = kv_value(l, kv, (int)t, h, d, c->add);
            expected_written[off] = 1;
            if (memcmp(&a[off], &want, sizeof want) != 0) ++bad;
          }
      for (i = 0; i < PAGED_ELEMS; ++i)
        if (!expected_written[i] && memcmp(&a[i], s4, 4) != 0) ++bad;
      free(expected_written);
    }
  return bad;
}

static void *run_kv_paged(void *arg) {
  worker *w = arg;
  paged_kv p;
  int l, kv, ok = 1;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv) {
      p.layer[l][kv] = malloc(PAGED_ELEMS * sizeof(float));
      if (p.layer[l][kv] == NULL) ok = 0;
    }
  while (ok && keep_going(w)) {
    const content *c = &g_seq[rnd(w, NUM_SEQS)];
    const uint64_t n = 1 + rnd(w, POSITIONS);
    const kdn_request req = token_request(c->tokens, (size_t)n);
    const kdn_kv_view view = paged_view(&p);
    if (rnd(w, 2) == 0) {
      kdn_kv_result stored;
      paged_fill(&p, c, n);
      kdn_kv_result_init(&stored, sizeof stored);
      if (ok_or_busy(w, kdn_kv_store(g_m, NS, &req, &view, 1, &stored), "kdn_kv_store (paged)")) {
        check_result(w, &stored, KDN_OP_DONE, KDN_OK, 0, "store (paged)");
        if (stored.tokens > n) mismatch(w, 1, "store (paged): more tokens cached than requested");
      }
    } else {
      kdn_kv_result res;
      uint64_t got, bad;
      paged_fill(&p, c, 0);
      kdn_kv_result_init(&res, sizeof res);
      if (ok_or_busy(w, kdn_kv_retrieve(g_m, NS, &req, &view, 1, &res), "kdn_kv_retrieve (paged)")) {
        got = res.tokens;
        check_result(w, &res, KDN_OP_DONE, KDN_OK, 0, "retrieve (paged)");
        if (!plausible_prefix(res.covered, n)) mismatch(w, 1, "retrieve (paged): covered more than the request");
        if (got > res.covered) mismatch(w, 1, "retrieve (paged): more tokens written than covered");
        bad = paged_mismatches(&p, c, got);
        if (bad != 0) mismatch(w, bad, "retrieve (paged): wrong KV, or bytes written outside the hit");
        w->bytes_checked += (uint64_t)LAYERS * 2 * PAGED_ELEMS * sizeof(float);
        count_hit(w, got, n);
      }
    }
    if (++w->ops % 64 == 0) read_stats(w);
  }
  if (!ok) ++w->errors;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv) free(p.layer[l][kv]);
  return NULL;
}

/* ---- Asynchronous loads and saves, layer by layer ----------------------------- */

static int in_ranges(uint64_t t, const kdn_token_range *r, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i)
    if (t >= r[i].begin && t < r[i].end) return 1;
  return 0;
}

/* A finished load's buffer: tokens [0, covered) hold the KV except in the
 * failed ranges (not checked) and, when the op was cancelled, where nothing
 * was written yet (SENTINEL); tokens past `covered` are untouched. */
static uint64_t load_mismatches(const float *buf, const content *c, uint64_t covered, const kdn_token_range *failed,
                                size_t num_failed, int cancelled) {
  uint64_t bad = 0, t;
  int l, kv, h, d;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < POSITIONS; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float *e = &buf[canon_index(POSITIONS, l, kv, t, h, d)];
            const unsigned char *b = (const unsigned char *)e;
            const int untouched = b[0] == SENTINEL && b[1] == SENTINEL && b[2] == SENTINEL && b[3] == SENTINEL;
            if (t >= covered) {
              if (!untouched) ++bad;
            } else if (!in_ranges(t, failed, num_failed)) {
              const float want = kv_value(l, kv, (int)t, h, d, c->add);
              if (memcmp(e, &want, sizeof want) != 0 && !(cancelled && untouched)) ++bad;
            }
          }
  return bad;
}

static void async_save(worker *w) {
  const content *c = &g_seq[rnd(w, NUM_SEQS)];
  const uint64_t n = 1 + rnd(w, POSITIONS);
  const kdn_request req = token_request(c->tokens, (size_t)n);
  const kdn_kv_view src = canon_view(c->kv, POSITIONS);
  const int reverse = rnd(w, 2) == 0;
  kdn_op *op = NULL;
  kdn_kv_result res;
  kdn_status s;
  uint32_t i;
  if (!ok_or_busy(w, kdn_kv_save_async(g_m, NS, &req, &src, 1, &op), "kdn_kv_save_async")) return;
  for (i = 0; i < LAYERS; ++i) {
    const uint32_t layer = reverse ? LAYERS - 1 - i : i;
    s = kdn_op_layer_ready(op, layer);
    if (s != KDN_OK) unexpected(w, s, "kdn_op_layer_ready");
  }
  s = kdn_op_wait(op, WAIT_MS);
  if (s != KDN_OK && s != KDN_ERR_BUSY) unexpected(w, s, "kdn_op_wait (save)");
  kdn_kv_result_init(&res, sizeof res);
  if (ok_or_busy(w, kdn_op_get_result(op, &res), "kdn_op_get_result (save)")) {
    check_result(w, &res, s == KDN_OK ? KDN_OP_DONE : KDN_OP_FAILED, s, 0, "save: kdn_op_get_result after kdn_op_wait");
    if (res.tokens > n) mismatch(w, 1, "save: more tokens cached than requested");
  }
  kdn_op_destroy(op);
}

static void async_load(worker *w, float *dst) {
  const content *c = &g_seq[rnd(w, NUM_SEQS)];
  const uint64_t n = 1 + rnd(w, POSITIONS);
  const kdn_request req = token_request(c->tokens, (size_t)n);
  const kdn_kv_view view = canon_view(dst, POSITIONS);
  const int cancel = rnd(w, 8) == 0;
  kdn_token_range failed[8];
  size_t num_failed = 0;
  kdn_op *op = NULL;
  kdn_kv_result res;
  kdn_op_state state;
  kdn_status s, end;
  uint32_t l;
  memset(dst, SENTINEL, canon_bytes(POSITIONS));
  if (!ok_or_busy(w, kdn_kv_load_async(g_m, NS, &req, &view, 1, &op), "kdn_kv_load_async")) return;
  for (l = 0; l < LAYERS; ++l) {
    s = kdn_op_wait_layer(op, l, WAIT_MS);
    if (s == KDN_ERR_CANCELLED && cancel) break;
    if (s != KDN_OK) {
      unexpected(w, s, "kdn_op_wait_layer");
      break;
    }
    if (cancel && l == 0) {
      s = kdn_op_cancel(op);
      if (s != KDN_OK) unexpected(w, s, "kdn_op_cancel");
    }
  }
  end = kdn_op_wait(op, WAIT_MS);
  if (end == KDN_ERR_CANCELLED && cancel) ++w->cancelled;
  else if (end != KDN_OK) unexpected(w, end, "kdn_op_wait (load)");
  if (ok_or_busy(w, kdn_op_poll(op, &state), "kdn_op_poll") && state == KDN_OP_PENDING)
    mismatch(w, 1, "load: pending after kdn_op_wait");
  kdn_kv_result_init(&res, sizeof res);
  if (ok_or_busy(w, kdn_op_get_result(op, &res), "kdn_op_get_result (load)") &&
      ok_or_busy(w, kdn_op_get_failed_ranges(op, failed, 8, &num_failed), "kdn_op_get_failed_ranges")) {
    uint64_t bad;
    check_result(w, &res,
                 end == KDN_OK ? KDN_OP_DONE : end == KDN_ERR_CANCELLED ? KDN_OP_CANCELLED : KDN_OP_FAILED, end, 1,
                 "load: kdn_op_get_result after kdn_op_wait");
    if (!plausible_prefix(res.covered, n)) mismatch(w, 1, "load: covered not a chunk prefix");
    if (res.tokens > res.covered) mismatch(w, 1, "load: more tokens written than covered");
    if (num_failed > 8) {
      mismatch(w, 1, "load: more than 8 failed ranges for 3 chunks");
      num_failed = 8;
    }
    if (num_failed != res.num_failed) mismatch(w, 1, "load: failed range counts disagree");
    bad = load_mismatches(dst, c, res.covered, failed, num_failed, end == KDN_ERR_CANCELLED);
    if (bad != 0)
      canon_mismatch(w, bad, "load: wrong KV, or bytes written past the covered prefix", dst, POSITIONS, res.covered,
                     c->add);
    w->bytes_checked += canon_bytes(POSITIONS);
    if (end == KDN_OK) count_hit(w, res.tokens, n);
  }
  kdn_op_destroy(op);
}

static void *run_async(void *arg) {
  worker *w = arg;
  float *dst = malloc(canon_bytes(POSITIONS));
  if (dst == NULL) {
    ++w->errors;
    return NULL;
  }
  while (keep_going(w)) {
    if (rnd(w, 2) == 0) async_save(w);
    else async_load(w, dst);
    if (++w->ops % 32 == 0) read_stats(w);
  }
  free(dst);
  return NULL;
}

/* ---- Documents ---------------------------------------------------------------- */

/* Buffers that end exactly where an unmapped page begins. */
typedef struct {
  unsigned char *kv_map, *tok_map;
  size_t kv_map_bytes, tok_map_bytes;
} guarded;

static unsigned char *guarded_map(size_t bytes, size_t *map_bytes) {
  const size_t pages = (bytes + g_page - 1) / g_page + 1;
  unsigned char *p = mmap(NULL, pages * g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  if (mprotect(p + (pages - 1) * g_page, g_page, PROT_NONE) != 0) {
    munmap(p, pages * g_page);
    return NULL;
  }
  *map_bytes = pages * g_page;
  return p;
}

static int guarded_init(guarded *g) {
  g->kv_map = guarded_map(canon_bytes(POSITIONS), &g->kv_map_bytes);
  g->tok_map = guarded_map(POSITIONS * sizeof(int32_t), &g->tok_map_bytes);
  return g->kv_map != NULL && g->tok_map != NULL;
}

static void guarded_free(guarded *g) {
  if (g->kv_map != NULL) munmap(g->kv_map, g->kv_map_bytes);
  if (g->tok_map != NULL) munmap(g->tok_map, g->tok_map_bytes);
}

/* The last `bytes` bytes before the guard page. */
static void *guarded_tail(unsigned char *map, size_t map_bytes, size_t bytes) { return map + (map_bytes - g_page) - bytes; }

/* Fetches `doc` into buffers of room `room` that end at a guard page. The
 * document is one of `versions` (told apart by token 0). */
static void fetch_checked(worker *w, const char *doc, size_t doc_len, const content *versions, const uint64_t *lengths,
                          int num_versions, uint64_t room, guarded *g) {
  float *kv = guarded_tail(g->kv_map, g->kv_map_bytes, canon_bytes(room));
  int32_t *tokens = guarded_tail(g->tok_map, g->tok_map_bytes, room * sizeof(int32_t));
  const kdn_kv_view view = canon_view(kv, room);
  kdn_kv_result res;
  uint64_t got;
  kdn_status s;
  memset(kv, SENTINEL, canon_bytes(room));
  memset(tokens, SENTINEL, room * sizeof(int32_t));
  kdn_kv_result_init(&res, sizeof res);
  s = kdn_knowledge_fetch(g_m, DOC_NS, doc, doc_len, &view, 1, tokens, (size_t)room, &res);
  got = res.tokens; /* the document's length, also on KDN_ERR_BUFFER_TOO_SMALL */
  if (s == KDN_OK) {
    const content *c = NULL;
    int k;
    ++w->fetch_ok;
    check_result(w, &res, KDN_OP_DONE, KDN_OK, 0, "fetch");
    if (res.covered != 0) mismatch(w, 1, "fetch: covered set (it is for retrieves and loads)");
    for (k = 0; k < num_versions; ++k)
      if (got > 0 && tokens[0] == versions[k].tokens[0]) c = &versions[k];
    if (c == NULL || got != lengths[c - versions]) {
      mismatch(w, 1, "fetch: the tokens are no version of the document, or its length is wrong");
      return;
    }
    if (got > room) {
      mismatch(w, 1, "fetch: reported more tokens than the room it had");
      return;
    }
    if (memcmp(tokens, c->tokens, (size_t)got * sizeof(int32_t)) != 0) mismatch(w, 1, "fetch: wrong tokens");
    if (!bytes_are(tokens + got, (size_t)(room - got) * sizeof(int32_t), SENTINEL))
      mismatch(w, 1, "fetch: tokens written past the document's length");
    {
      const uint64_t bad = canon_mismatches(kv, room, got, c->add, SENTINEL);
      if (bad != 0) canon_mismatch(w, bad, "fetch: wrong KV, or KV written past the document's length", kv, room, got, c->add);
    }
    w->bytes_checked += canon_bytes(room) + room * sizeof(int32_t);
  } else if (s == KDN_ERR_BUFFER_TOO_SMALL) {
    int k, known = 0;
    ++w->fetch_too_small;
    check_result(w, &res, KDN_OP_FAILED, KDN_ERR_BUFFER_TOO_SMALL, 0, "fetch (too small)");
    for (k = 0; k < num_versions; ++k)
      if (got == lengths[k]) known = 1;
    if (!known || got <= room) mismatch(w, 1, "fetch: BUFFER_TOO_SMALL with a length no version has, or that fits");
    if (!bytes_are(kv, canon_bytes(room), SENTINEL) || !bytes_are(tokens, room * sizeof(int32_t), SENTINEL))
      mismatch(w, 1, "fetch: KDN_ERR_BUFFER_TOO_SMALL wrote into the buffers");
    w->bytes_checked += canon_bytes(room) + room * sizeof(int32_t);
  } else if (s == KDN_ERR_NOT_FOUND) {
    ++w->fetch_not_found; /* deleted, expired, or its KV evicted from every tier */
    check_result(w, &res, KDN_OP_PENDING, KDN_OK, 0, "fetch (not found): the neutral result");
    if (got != 0 || res.covered != 0) mismatch(w, 1, "fetch: KDN_ERR_NOT_FOUND with a length");
  } else {
    unexpected(w, s, "kdn_knowledge_fetch");
  }
}

static void put_doc(worker *w, const char *doc, size_t doc_len, const content *c, uint64_t n, uint64_t version) {
  const kdn_kv_view src = canon_view(c->kv, POSITIONS);
  ok_or_busy(w, kdn_knowledge_put(g_m, DOC_NS, doc, doc_len, version, "stress", 6, c->tokens, (size_t)n, &src, 1),
             "kdn_knowledge_put");
}

static void doc_name(char *out, int j) { snprintf(out, 16, "doc-%d", j); }

static void documents_op(worker *w, guarded *g, uint64_t *version) {
  const int j = (int)rnd(w, NUM_DOCS);
  const uint64_t len = doc_length(j);
  const uint32_t what = rnd(w, 16);
  char id[16];
  size_t id_len;
  kdn_status s;
  doc_name(id, j);
  id_len = strlen(id);
  if (what < 4) {
    put_doc(w, id, id_len, &g_doc[j], len, ++*version);
  } else if (what < 8) {
    fetch_checked(w, id, id_len, &g_doc[j], &len, 1, POSITIONS, g);
  } else if (what < 10) {
    fetch_checked(w, RACE_DOC, g_race, kRaceLength, NUM_VERSIONS, kFetchRoom[rnd(w, 3)], g);
  } else if (what == 10) {
    kdn_document_info info;
    kdn_document_info_init(&info, sizeof info);
    s = kdn_knowledge_get_info(g_m, DOC_NS, id, id_len, &info);
    if (s == KDN_OK) {
      if (info.num_tokens != len || info.doc_id_len != id_len || strcmp(info.doc_id, id) != 0 ||
          info.chunks_present > info.chunks)
        mismatch(w, 1, "get_info: wrong length, doc_id or chunk counts");
    } else if (s != KDN_ERR_NOT_FOUND) {
      unexpected(w, s, "kdn_knowledge_get_info");
    }
  } else if (what == 11) {
    kdn_document_info list[NUM_DOCS + 2];
    size_t count = 0, i;
    for (i = 0; i < NUM_DOCS + 2; ++i) kdn_document_info_init(&list[i], sizeof list[i]);
    if (ok_or_busy(w, kdn_knowledge_list(g_m, DOC_NS, list, NUM_DOCS + 2, &count), "kdn_knowledge_list")) {
      if (count > NUM_DOCS + 1) mismatch(w, 1, "list: more documents than were ever put");
      for (i = 0; i < count && i < NUM_DOCS + 2; ++i) {
        const kdn_document_info *d = &list[i];
        if (memchr(d->doc_id, '\0', sizeof d->doc_id) == NULL || strlen(d->doc_id) != d->doc_id_len ||
            (strncmp(d->doc_id, "doc-", 4) != 0 && strcmp(d->doc_id, kRaceDoc) != 0))
          mismatch(w, 1, "list: a doc_id that was never put");
        if (i > 0 && strcmp(list[i - 1].doc_id, d->doc_id) >= 0) mismatch(w, 1, "list: not in doc_id order");
      }
    }
  } else if (what == 12) {
    s = kdn_knowledge_pin(g_m, DOC_NS, id, id_len, 1 + (int64_t)rnd(w, 100));
    if (s != KDN_OK && s != KDN_ERR_NOT_FOUND) unexpected(w, s, "kdn_knowledge_pin");
  } else if (what == 13) {
    s = kdn_knowledge_unpin(g_m, DOC_NS, id, id_len);
    if (s != KDN_OK && s != KDN_ERR_NOT_FOUND) unexpected(w, s, "kdn_knowledge_unpin");
  } else if (what == 14) {
    s = kdn_knowledge_expire(g_m, DOC_NS, id, id_len, (int64_t)rnd(w, 200));
    if (s != KDN_OK && s != KDN_ERR_NOT_FOUND) unexpected(w, s, "kdn_knowledge_expire");
  } else {
    s = kdn_knowledge_delete(g_m, DOC_NS, id, id_len);
    if (s != KDN_OK && s != KDN_ERR_NOT_FOUND) unexpected(w, s, "kdn_knowledge_delete");
  }
}

static void *run_documents(void *arg) {
  worker *w = arg;
  guarded g;
  uint64_t version = 0;
  memset(&g, 0, sizeof g);
  if (!guarded_init(&g)) {
    ++w->errors;
    guarded_free(&g);
    return NULL;
  }
  while (keep_going(w)) {
    documents_op(w, &g, &version);
    if (++w->ops % 64 == 0) read_stats(w);
  }
  guarded_free(&g);
  return NULL;
}

static void *run_race_put(void *arg) {
  worker *w = arg;
  uint64_t version = 0;
  while (keep_going(w)) {
    const int k = (int)rnd(w, NUM_VERSIONS);
    if (rnd(w, 32) == 0) {
      const kdn_status s = kdn_knowledge_delete(g_m, DOC_NS, RACE_DOC);
      if (s != KDN_OK && s != KDN_ERR_NOT_FOUND) unexpected(w, s, "kdn_knowledge_delete (race)");
    } else {
      put_doc(w, RACE_DOC, &g_race[k], kRaceLength[k], ++version);
    }
    if (++w->ops % 64 == 0) read_stats(w);
  }
  return NULL;
}

static void *run_race_fetch(void *arg) {
  worker *w = arg;
  guarded g;
  memset(&g, 0, sizeof g);
  if (!guarded_init(&g)) {
    ++w->errors;
    guarded_free(&g);
    return NULL;
  }
  while (keep_going(w)) {
    fetch_checked(w, RACE_DOC, g_race, kRaceLength, NUM_VERSIONS, kFetchRoom[rnd(w, 3)], &g);
    if (++w->ops % 64 == 0) read_stats(w);
  }
  guarded_free(&g);
  return NULL;
}

/* ---- race-blend ------------------------------------------------------------ */

/* The engine's recompute, stood in for: every position it is asked for gets
 * K = V = its position (the blend's checks here are about memory and
 * snapshots, not about a transformer's numbers: those are blend_api_test's). */
static kdn_status blend_layer(void *user, uint32_t layer, const int32_t *positions, const int32_t *tokens,
                              size_t count, float *hidden, size_t hidden_len, uint32_t hidden_dim, float *k, float *v,
                              size_t kv_len, size_t total) {
  const size_t row = (size_t)HEADS * HEAD_DIM;
  size_t i, j;
  (void)user;
  (void)tokens;
  (void)hidden_dim;
  (void)total;
  if (layer == 0) memset(hidden, 0, hidden_len * sizeof *hidden);
  for (i = 0; i < count; ++i) {
    const size_t p = (size_t)positions[i];
    if ((p + 1) * row > kv_len) return KDN_ERR_INTERNAL;
    for (j = 0; j < row; ++j) k[p * row + j] = v[p * row + j] = (float)p;
  }
  return KDN_OK;
}

/* The elements of layers [2, LAYERS) of tokens [0, n) of a canonical buffer
 * that do not hold the content's KV (layers 0 and 1 are the check layer's
 * and below: recomputed by the blend). */
static uint64_t cached_mismatches(const float *buf, uint64_t room, uint64_t n, float add) {
  uint64_t bad = 0, t;
  int l, kv, h, d;
  for (l = 2; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < n; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float want = kv_value(l, kv, (int)t, h, d, add);
            if (memcmp(&buf[canon_index(room, l, kv, t, h, d)], &want, sizeof want) != 0) ++bad;
          }
  return bad;
}

/* Whether tokens [from, room) of every layer of a canonical buffer are untouched. */
static int canon_untouched_from(const float *buf, uint64_t room, uint64_t from) {
  int l, kv;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      if (!bytes_are(&buf[canon_index(room, l, kv, from, 0, 0)], (size_t)(room - from) * TOKEN_ELEMS * sizeof(float),
                     SENTINEL))
        return 0;
  return 1;
}

static void blend_checked(worker *w, unsigned char *map, size_t map_bytes, uint64_t room) {
  static const int32_t query[QUERY] = {261, 378, 432, 383};
  float *kv = guarded_tail(map, map_bytes, canon_bytes(room));
  const kdn_kv_view view = canon_view(kv, room);
  kdn_blend_segment seg[2];
  kdn_blend_options opts;
  kdn_blend_report rep;
  kdn_status s;
  kdn_blend_segment_init(&seg[0], sizeof seg[0]);
  seg[0].kind = KDN_SEGMENT_DOCUMENT;
  seg[0].doc_id = kRaceDoc;
  seg[0].doc_id_len = sizeof kRaceDoc - 1;
  kdn_blend_segment_init(&seg[1], sizeof seg[1]);
  seg[1].tokens = query;
  seg[1].num_tokens = QUERY;
  kdn_blend_options_init(&opts, sizeof opts);
  opts.ratio = 0.0f; /* no cached position recomputed past the check layer */
  opts.hidden_dim = 64;
  opts.layer_fn = blend_layer;
  kdn_blend_report_init(&rep, sizeof rep);
  memset(kv, SENTINEL, canon_bytes(room));
  s = kdn_kv_blend(g_m, DOC_NS, seg, 2, &opts, &view, 1, &rep);
  if (s == KDN_OK) {
    const content *c = NULL;
    int k;
    ++w->fetch_ok;
    for (k = 0; k < NUM_VERSIONS; ++k)
      if (rep.positions == kRaceLength[k] + QUERY) c = &g_race[k];
    if (c == NULL || rep.positions > room || rep.cached_positions != rep.positions - QUERY) {
      mismatch(w, 1, "blend: a context no version of the document makes, or longer than the room");
      return;
    }
    if (!canon_untouched_from(kv, room, rep.positions)) mismatch(w, 1, "blend: KV written past the context");
    if (rep.selected == 0) {
      const uint64_t bad = cached_mismatches(kv, room, rep.cached_positions, c->add);
      if (bad != 0) mismatch(w, bad, "blend: cached KV that is not the version's the context is (a torn snapshot)");
    } else {
      mismatch(w, 1, "blend: positions recomputed with ratio 0");
    }
    w->bytes_checked += canon_bytes(room);
  } else if (s == KDN_ERR_BUFFER_TOO_SMALL) {
    ++w->fetch_too_small;
    if (room == kBlendRoom[NUM_VERSIONS - 1]) mismatch(w, 1, "blend: KDN_ERR_BUFFER_TOO_SMALL with room for every version");
    if (!bytes_are(kv, canon_bytes(room), SENTINEL)) mismatch(w, 1, "blend: KDN_ERR_BUFFER_TOO_SMALL wrote KV");
    w->bytes_checked += canon_bytes(room);
  } else if (s == KDN_ERR_NOT_FOUND) {
    ++w->fetch_not_found; /* deleted, or its KV evicted from every tier */
    if (!bytes_are(kv, canon_bytes(room), SENTINEL)) mismatch(w, 1, "blend: KDN_ERR_NOT_FOUND wrote KV");
  } else {
    unexpected(w, s, "kdn_kv_blend");
  }
}

static void *run_race_blend(void *arg) {
  worker *w = arg;
  size_t map_bytes = 0;
  unsigned char *map = guarded_map(canon_bytes(POSITIONS + QUERY), &map_bytes);
  if (map == NULL) {
    ++w->errors;
    return NULL;
  }
  while (keep_going(w)) {
    blend_checked(w, map, map_bytes, kBlendRoom[rnd(w, 3)]);
    if (++w->ops % 64 == 0) read_stats(w);
  }
  munmap(map, map_bytes);
  return NULL;
}

/* ---- Setup, run, report ----------------------------------------------------------- */

static char g_dir[256];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static double env_double(const char *name, double fallback) {
  const char *v = getenv(name);
  char *end = NULL;
  double d;
  if (v == NULL || v[0] == '\0') return fallback;
  d = strtod(v, &end);
  return end != v && d > 0 ? d : fallback;
}

static kdn_runtime *make_runtime(void) {
  kdn_tier_config tiers[2];
  kdn_runtime_options opts;
  kdn_runtime *rt = NULL;
  kdn_tier_config_init(&tiers[0], sizeof tiers[0]);
  tiers[0].kind = KDN_TIER_HOST;
  tiers[0].capacity_bytes = 256u << 10; /* a dozen chunks of 20 KiB */
  kdn_tier_config_init(&tiers[1], sizeof tiers[1]);
  tiers[1].kind = KDN_TIER_DISK;
  tiers[1].capacity_bytes = 3u << 20;
  tiers[1].path = g_dir;
  tiers[1].path_len = strlen(g_dir);
  tiers[1].policy = KDN_EVICT_S3FIFO;
  /* The disk default, lossless zstd: every byte is checked, through its
   * encoder and decoder under concurrency. */
  kdn_runtime_options_init(&opts, sizeof opts);
  opts.chunk_tokens = CHUNK;
  opts.tiers = tiers;
  opts.num_tiers = 2;
  opts.worker_threads = 2;
  if (kdn_runtime_create(&opts, &rt) != KDN_OK) {
    printf("kdn_runtime_create: %s\n", kdn_last_error_message());
    return NULL;
  }
  return rt;
}

int main(void) {
  static void *(*const kRun[NUM_THREADS])(void *) = {run_kv_canonical, run_kv_paged,   run_async,     run_documents,
                                                     run_race_put,     run_race_fetch, run_race_blend};
  static const char *const kName[NUM_THREADS] = {"kv-canonical", "kv-paged",   "async",     "documents",
                                                 "race-put",     "race-fetch", "race-blend"};
  worker w[NUM_THREADS];
  pthread_t th[NUM_THREADS];
  worker total;
  const double seconds = env_double("KDN_STRESS_SECONDS", 20.0);
  const char *tmp = getenv("TMPDIR");
  double started, elapsed;
  int i, loaded, ok = 1;
  kdn_stats stats;

  setvbuf(stdout, NULL, _IOLBF, 0); /* every line out, even before a crash */
  loaded = reference_setup();
  if (loaded != 0) return loaded;
  g_budget = (uint64_t)env_double("KDN_STRESS_OPS", 1000000.0);
  g_page = (size_t)sysconf(_SC_PAGESIZE);
  for (i = 0; i < NUM_SEQS; ++i) ok &= content_init(&g_seq[i], 1000 + i, 0, 0.0625f * (float)(i + 1));
  for (i = 0; i < NUM_DOCS; ++i) ok &= content_init(&g_doc[i], 2000 + 10 * i, 1, 0.5f + 0.0625f * (float)i);
  for (i = 0; i < NUM_VERSIONS; ++i) ok &= content_init(&g_race[i], 3000 + 10 * i, 1, -0.25f - 0.125f * (float)i);
  snprintf(g_dir, sizeof g_dir, "%s/kdn-stress-XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
  if (!ok || mkdtemp(g_dir) == NULL) {
    printf("setup failed (memory, or mkdtemp %s)\n", g_dir);
    return 1;
  }
  g_rt = make_runtime();
  g_m = g_rt != NULL ? new_model(g_rt, FINGERPRINT) : NULL;
  if (g_m == NULL || g_failures != 0) {
    kdn_runtime_destroy(g_rt);
    nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 1;
  }

  printf("stress: %d threads for %.1f s or %llu operations each; host tier 256 KiB, zstd disk tier 3 MiB in %s\n",
         NUM_THREADS, seconds, (unsigned long long)g_budget, g_dir);
  started = now_s();
  g_deadline = started + seconds;
  memset(w, 0, sizeof w);
  for (i = 0; i < NUM_THREADS; ++i) {
    w[i].index = i;
    w[i].name = kName[i];
    w[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    if (pthread_create(&th[i], NULL, kRun[i], &w[i]) != 0) {
      printf("pthread_create failed\n");
      return 1;
    }
  }
  for (i = 0; i < NUM_THREADS; ++i) pthread_join(th[i], NULL);
  elapsed = now_s() - started;

  memset(&total, 0, sizeof total);
  printf("%-13s %9s %14s %10s %6s %6s %8s %8s %8s %8s %8s %8s %6s\n", "thread", "ops", "bytes checked", "mismatches",
         "errors", "busy", "hits", "partial", "misses", "fetch ok", "too small", "not found", "cancel");
  for (i = 0; i < NUM_THREADS; ++i) {
    const worker *x = &w[i];
    printf("%-13s %9llu %14llu %10llu %6llu %6llu %8llu %8llu %8llu %8llu %8llu %8llu %6llu\n", x->name,
           (unsigned long long)x->ops, (unsigned long long)x->bytes_checked, (unsigned long long)x->mismatches,
           (unsigned long long)x->errors, (unsigned long long)x->busy, (unsigned long long)x->hits,
           (unsigned long long)x->partial_hits, (unsigned long long)x->misses, (unsigned long long)x->fetch_ok,
           (unsigned long long)x->fetch_too_small, (unsigned long long)x->fetch_not_found,
           (unsigned long long)x->cancelled);
    total.ops += x->ops;
    total.bytes_checked += x->bytes_checked;
    total.mismatches += x->mismatches;
    total.errors += x->errors;
    total.fetch_ok += x->fetch_ok;
    total.fetch_too_small += x->fetch_too_small;
    if (x->ops == 0) {
      printf("[%s] did no operation\n", x->name);
      ok = 0;
    }
  }
  kdn_stats_init(&stats, sizeof stats);
  if (kdn_runtime_get_stats(g_rt, &stats) == KDN_OK)
    printf("runtime: %llu evictions, %llu chunks held, %llu of %llu bytes, %llu corrupt detected\n",
           (unsigned long long)stats.evictions, (unsigned long long)stats.chunks, (unsigned long long)stats.used_bytes,
           (unsigned long long)stats.capacity_bytes, (unsigned long long)stats.corrupt_detected);
  printf("total: %llu ops in %.1f s, %llu bytes checked, %llu mismatches, %llu unexpected statuses, "
         "%llu fetches filled, %llu too small\n",
         (unsigned long long)total.ops, elapsed, (unsigned long long)total.bytes_checked,
         (unsigned long long)total.mismatches, (unsigned long long)total.errors, (unsigned long long)total.fetch_ok,
         (unsigned long long)total.fetch_too_small);
  if (stats.evictions == 0) {
    printf("no chunk was evicted: the test did not test eviction\n");
    ok = 0;
  }
  if (total.mismatches != 0 || total.errors != 0) ok = 0;

  kdn_model_destroy(g_m);
  kdn_runtime_destroy(g_rt);
  nftw(g_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  for (i = 0; i < NUM_SEQS; ++i) free(g_seq[i].kv);
  for (i = 0; i < NUM_DOCS; ++i) free(g_doc[i].kv);
  for (i = 0; i < NUM_VERSIONS; ++i) free(g_race[i].kv);
  reference_free();
  printf("%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
