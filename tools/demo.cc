#include "demo.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "ref_engine.h"
#include "stories.h"

namespace kdn::tools {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Row {
  std::string query;
  size_t prompt_tokens = 0;
  std::uint64_t reused = 0;
  double cold_ms = 0, warm_ms = 0;
  bool identical = false;
};

std::string Clip(std::string s, size_t n) {
  for (auto& c : s) {
    if (c == '\n') c = ' ';
  }
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

}  // namespace

int RunDemo(const DemoOptions& o) {
  auto loaded = LoadModel(o.model, o.tokenizer, /*allow_random=*/true);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kdn demo: %s\n", loaded.status().message().c_str());
    return 2;
  }
  const LoadedModel& m = *loaded;
  std::printf("kdn %s demo: reuse of stored KV instead of prefill\n", kdn_version());
  std::printf("model: %s\n", m.description.c_str());
  if (m.random) std::printf("NOTE: no reference model found; using a RANDOM model (set --model or KDN_MODELS)\n");

  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = o.chunk_tokens;
  ro.host_capacity_bytes = std::uint64_t{256} << 20;
  kdn_runtime* rt = nullptr;
  if (kdn_status s = kdn_runtime_create(&ro, &rt); s != KDN_OK) {
    std::fprintf(stderr, "kdn demo: %s\n", FromKdn(s, "kdn_runtime_create").message().c_str());
    return 2;
  }
  int code = 0;
  {
    auto engine_or = RefEngine::Create(m, rt);
    if (!engine_or.ok()) {
      std::fprintf(stderr, "kdn demo: %s\n", engine_or.status().message().c_str());
      kdn_runtime_destroy(rt);
      return 2;
    }
    RefEngine& engine = **engine_or;
    const std::string ns = "demo";
    const int ctx = engine.config().seq_len;

    std::printf("\n[1/3] ingesting %zu documents (prefill, then kdn_store through the C ABI; %u-token chunks)\n",
                std::size(kStories), o.chunk_tokens);
    std::vector<std::vector<int>> docs;
    for (size_t i = 0; i < std::size(kStories); ++i) {
      std::vector<int> t = m.tokenizer->Encode(kStories[i].text, /*bos=*/true);
      if (static_cast<int>(t.size()) > ctx - 64) t.resize(static_cast<size_t>(ctx - 64));
      auto stored = engine.Ingest(ns, t);
      if (!stored.ok()) {
        std::fprintf(stderr, "kdn demo: %s\n", stored.status().message().c_str());
        code = 2;
        break;
      }
      std::printf("  doc %zu/%zu \"%s\": %zu tokens, %llu cached\n", i + 1, std::size(kStories), kStories[i].title,
                  t.size(), static_cast<unsigned long long>(*stored));
      docs.push_back(std::move(t));
    }

    std::vector<Row> rows;
    if (code == 0) {
      std::printf("\n[2/3] answering queries: cold (full prefill) vs with kdn (lookup + retrieve + prefill of the rest)\n");
      struct Query {
        std::string label;
        std::vector<int> tokens;
      };
      std::vector<Query> queries;
      for (size_t i = 0; i < docs.size(); ++i) {
        for (const char* q : kStories[i].questions) {
          std::vector<int> t = docs[i];
          const std::vector<int> suffix = m.tokenizer->Encode(q, /*bos=*/false);
          // Skip the dummy-prefix space token: the text continues the story.
          t.insert(t.end(), suffix.begin() + (suffix.size() > 1 ? 1 : 0), suffix.end());
          if (static_cast<int>(t.size()) + o.steps <= ctx) queries.push_back({std::string(kStories[i].title) + " +" + q, t});
        }
      }
      // A query that no document starts: kdn finds nothing and prefill runs in full.
      queries.push_back({"(new text) Once upon a time, a dog",
                         m.tokenizer->Encode("Once upon a time, a dog named Max found a ball.", true)});

      for (size_t qi = 0; qi < queries.size() && code == 0; ++qi) {
        const Query& q = queries[qi];
        std::printf("  query %zu/%zu: %-48s", qi + 1, queries.size(), Clip(q.label, 48).c_str());
        std::fflush(stdout);
        std::vector<double> cold, warm;
        Answer cold_answer, warm_answer;
        for (int r = 0; r < o.repeats; ++r) {
          auto c = engine.Cold(q.tokens, o.steps);
          auto w = engine.Warm(ns, q.tokens, o.steps);
          if (!c.ok() || !w.ok()) {
            std::fprintf(stderr, "\nkdn demo: %s\n", (!c.ok() ? c.status() : w.status()).message().c_str());
            code = 2;
            break;
          }
          cold.push_back(c->ttft_ms);
          warm.push_back(w->ttft_ms);
          cold_answer = std::move(*c);
          warm_answer = std::move(*w);
        }
        if (code != 0) break;
        Row row;
        row.query = q.label;
        row.prompt_tokens = q.tokens.size();
        row.reused = warm_answer.reused_tokens;
        row.cold_ms = Median(cold);
        row.warm_ms = Median(warm);
        row.identical = cold_answer.continuation == warm_answer.continuation;
        std::printf(" %4zu tok, reused %4llu, TTFT cold %7.3f ms, kdn %7.3f ms, %5.1fx, continuation %s\n",
                    row.prompt_tokens, static_cast<unsigned long long>(row.reused), row.cold_ms, row.warm_ms,
                    row.cold_ms / row.warm_ms, row.identical ? "identical" : "DIFFERENT");
        std::printf("      -> \"%s\"\n",
                    Clip(m.tokenizer->DecodeAll(warm_answer.continuation, q.tokens.back()), 90).c_str());
        if (!row.identical) code = 1;
        rows.push_back(row);
      }
    }

    if (!rows.empty()) {
      std::printf("\n[3/3] summary (median of %d runs per query, %d continuation tokens compared)\n", o.repeats,
                  o.steps);
      std::printf("  %-50s %6s %6s %10s %10s %7s %s\n", "query", "tokens", "reused", "cold ms", "kdn ms", "speedup",
                  "same");
      double cold_sum = 0, warm_sum = 0;
      int same = 0;
      for (const Row& r : rows) {
        std::printf("  %-50s %6zu %6llu %10.3f %10.3f %6.1fx %s\n", Clip(r.query, 50).c_str(), r.prompt_tokens,
                    static_cast<unsigned long long>(r.reused), r.cold_ms, r.warm_ms, r.cold_ms / r.warm_ms,
                    r.identical ? "yes" : "NO");
        cold_sum += r.cold_ms;
        warm_sum += r.warm_ms;
        same += r.identical;
      }
      kdn_stats st = KDN_STATS_INIT;
      if (kdn_runtime_stats(rt, &st) == KDN_OK) {
        std::printf("  total TTFT: cold %.3f ms, with kdn %.3f ms (%.1fx); identical continuations %d/%zu\n",
                    cold_sum, warm_sum, cold_sum / warm_sum, same, rows.size());
        std::printf("  store: %llu chunks, %.1f KiB held; %llu retrieves served %llu tokens (%llu chunk hits)\n",
                    static_cast<unsigned long long>(st.chunks), static_cast<double>(st.used_bytes) / 1024.0,
                    static_cast<unsigned long long>(st.retrieves), static_cast<unsigned long long>(st.tokens_served),
                    static_cast<unsigned long long>(st.hits));
      }
    }
  }
  kdn_runtime_destroy(rt);
  return code;
}

}  // namespace kdn::tools
