// SPDX-License-Identifier: Apache-2.0
/* Memory under a long workload of distinct prompts and namespaces (issue
 * 10, items 13 and 14), through the C ABI: for KDN_MEMORY_SECONDS (default
 * 15), one runtime with a 64 MiB host tier takes
 *   - stores of distinct prompts (17..47 tokens: a whole chunk of 16, then a
 *     tail that is not one), half of them each in a namespace of its own,
 *     the others in one shared namespace, each followed by a lookup and,
 *     every 16th, a retrieve whose bytes are checked;
 *   - every 8th iteration, a knowledge put of a new 20-token document.
 * Resident memory (/proc/self/statm) is sampled as it goes. The bound: the
 * peak stays below the resident size before the workload plus the host
 * tier's capacity, the knowledge index's budget and SLACK_MIB for the
 * allocator and the library's fixed tables. Before these fixes it did not:
 * every distinct prompt left ~250 bytes in an index that never shrank, and
 * every document ~1.4 KB. Prints the figures; exits 1 on a failure, 77 if
 * the reference model is missing. Not built with sanitizers (their shadow
 * memory and quarantine are not the library's). */
#define _DEFAULT_SOURCE
#include "robustness.h"

#include <time.h>
#include <unistd.h>

enum {
  CHUNK = 16,
  HOST_MIB = 64,
  KNOWLEDGE_MIB = 64, /* the knowledge index's default budget (knowledge/knowledge.h) */
  SLACK_MIB = 48,
  MAX_TOKENS = 47,
  DOC_TOKENS = 20
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Resident bytes of this process. */
static uint64_t rss_bytes(void) {
  unsigned long size = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL) return 0;
  if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  fclose(f);
  return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

int main(void) {
  const char *env = getenv("KDN_MEMORY_SECONDS");
  const double seconds = env != NULL && atof(env) > 0 ? atof(env) : 15.0;
  const int setup = reference_setup();
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime *runtime = NULL;
  kdn_model *model;
  float *kv, *out;
  int32_t tokens[MAX_TOKENS];
  uint64_t start_rss, peak_rss, bound, iterations = 0, stores = 0, retrieves = 0, docs = 0, docs_refused = 0;
  double t0, elapsed;
  if (setup != 0) return setup;

  host.capacity_bytes = (uint64_t)HOST_MIB << 20;
  options.chunk_tokens = CHUNK;
  options.tiers = &host;
  options.num_tiers = 1;
  CHECK_OK(kdn_runtime_create(&options, &runtime));
  if (runtime == NULL) return 1;
  model = new_model(runtime, FINGERPRINT);
  kv = malloc(canon_bytes(MAX_TOKENS));
  out = malloc(canon_bytes(MAX_TOKENS));
  if (model == NULL || kv == NULL || out == NULL) return 1;
  canon_fill(kv, MAX_TOKENS, MAX_TOKENS, 0.0f);
  memcpy(tokens, kTokens, sizeof tokens);

  start_rss = rss_bytes();
  peak_rss = start_rss;
  bound = start_rss + ((uint64_t)(HOST_MIB + KNOWLEDGE_MIB + SLACK_MIB) << 20);
  t0 = now_s();
  for (;;) {
    const uint64_t i = iterations++;
    const size_t n = 17 + (size_t)(i % 31);
    char ns[32];
    size_t ns_len;
    kdn_request request;
    kdn_kv_view view = canon_view(kv, MAX_TOKENS);
    kdn_kv_result result = KDN_KV_RESULT_INIT;
    kdn_status st;
    /* A distinct prompt: its first two tokens count the iterations. */
    tokens[0] = (int32_t)(i % 1000000007u);
    tokens[1] = (int32_t)(i / 1000000007u);
    ns_len = (size_t)snprintf(ns, sizeof ns, i % 2 == 0 ? "ns-%llu" : "shared", (unsigned long long)i);
    request = token_request(tokens, n);
    st = kdn_kv_store(model, ns, ns_len, &request, &view, 1, &result);
    CHECK_OK(st);
    if (st == KDN_OK) ++stores;
    CHECK_EQ(result.tokens, n);
    {
      kdn_lookup_result found = KDN_LOOKUP_RESULT_INIT;
      CHECK_OK(kdn_kv_lookup(model, ns, ns_len, &request, 1, &found));
      CHECK_EQ(found.cached_tokens, n);
    }
    if (i % 16 == 0) {
      kdn_kv_view into = canon_view(out, MAX_TOKENS);
      kdn_kv_result got = KDN_KV_RESULT_INIT;
      memset(out, 0x5A, canon_bytes(MAX_TOKENS));
      CHECK_OK(kdn_kv_retrieve(model, ns, ns_len, &request, &into, 1, &got));
      CHECK_EQ(got.tokens, n);
      CHECK_EQ(canon_mismatches(out, MAX_TOKENS, n, 0.0f, 0x5A), 0);
      ++retrieves;
    }
    if (i % 8 == 0) {
      char doc[32];
      const size_t doc_len = (size_t)snprintf(doc, sizeof doc, "doc-%llu", (unsigned long long)i);
      kdn_kv_view dv = canon_view(kv, MAX_TOKENS);
      st = kdn_knowledge_put(model, "docs", 4, doc, doc_len, 1, NULL, 0, tokens, DOC_TOKENS, &dv, 1);
      if (st == KDN_OK) {
        ++docs;
      } else if (st == KDN_ERR_BUSY) {
        ++docs_refused; /* the index is at its budget: a clear refusal, not growth */
      } else {
        CHECK_OK(st);
      }
    }
    if (i % 1024 == 0) {
      const uint64_t rss = rss_bytes();
      if (rss > peak_rss) peak_rss = rss;
      if (now_s() - t0 >= seconds) break;
    }
    if (g_failures > 8) break;
  }
  elapsed = now_s() - t0;
  {
    const uint64_t rss = rss_bytes();
    if (rss > peak_rss) peak_rss = rss;
  }
  printf("%.1f s: %llu stores (%.0f/s), %llu retrieves checked, %llu documents put, %llu refused at the budget\n",
         elapsed, (unsigned long long)stores, (double)stores / elapsed, (unsigned long long)retrieves,
         (unsigned long long)docs, (unsigned long long)docs_refused);
  printf("resident: %.1f MiB before, peak %.1f MiB; bound %.1f MiB (before + %d MiB host tier + %d MiB knowledge "
         "budget + %d MiB slack)\n",
         (double)start_rss / 1048576.0, (double)peak_rss / 1048576.0, (double)bound / 1048576.0, HOST_MIB,
         KNOWLEDGE_MIB, SLACK_MIB);
  CHECK(peak_rss <= bound);
  CHECK(stores > 10000); /* enough distinct prompts that an index kept per prompt would show */

  kdn_model_destroy(model);
  kdn_runtime_destroy(runtime);
  free(kv);
  free(out);
  reference_free();
  printf("%s: %d checks, %d failures\n", g_failures ? "FAILED" : "ok", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
