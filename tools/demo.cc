// SPDX-License-Identifier: Apache-2.0
// The RAG scene uses the experimental blending calls (kdn_kv_blend).
#define KDN_EXPERIMENTAL
#include "demo.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "refengine/ref_engine.h"
#include "refengine/stories.h"

namespace kdn::tools {
namespace {

using refengine::Answer;
using refengine::FromKdn;
using refengine::kStories;
using refengine::LoadedModel;
using refengine::LoadModel;
using refengine::RefEngine;

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

// Scene 4: RAG. Passages are put once as knowledge items; prompts retrieve
// them in different orders, which no prefix cache can reuse; kdn blends them
// (re-positioned keys, the tokens that matter recomputed by the engine
// through the kdn_kv_blend callback), by three methods at about the same
// work: CacheBlend's (15% at one whole check layer), kdn's default (KV passes
// at check layers 1 and 2, 28%) and the first tokens of each passage alone
// (EPIC/LegoLink).
int RagScene(const LoadedModel& m, RefEngine& engine, const DemoOptions& o) {
  const std::string ns = "demo-rag";
  constexpr size_t kPassageTokens = 96;
  std::printf("\n[4/4] RAG: %zu passages put once as knowledge items, blended in any order (kdn_kv_blend)\n",
              std::size(kStories));
  std::vector<std::string> ids;
  for (size_t i = 0; i < std::size(kStories); ++i) {
    std::vector<int> t = m.tokenizer->Encode(kStories[i].text, /*bos=*/false);
    if (t.size() > kPassageTokens) t.resize(kPassageTokens);
    ids.push_back("passage-" + std::to_string(i));
    if (Status s = engine.PutDocument(ns, ids.back(), t); !s.ok()) {
      std::fprintf(stderr, "kdn demo: %s\n", s.message().c_str());
      return 2;
    }
    std::printf("  passage %zu \"%s\": %zu tokens\n", i, kStories[i].title, t.size());
  }
  struct Method {
    const char* name;
    RefEngine::BlendMethod how;
  };
  const Method methods[] = {
      {"CacheBlend 15%", {0.15f, /*kv_pass=*/false, 0}},
      {"kdn default", {-1.0f, true, 0}},
      {"first 24 tokens", {0.0f, true, 24}},
  };
  const std::vector<int> question = m.tokenizer->Encode(" Question: Who was in the story? Answer:", false);
  const std::vector<std::vector<int>> orders = {{0, 1, 2}, {2, 0, 1}, {1, 2}, {2, 1, 0}};
  double cold_sum = 0;
  std::vector<double> blend_sum(std::size(methods), 0.0);
  std::vector<size_t> agree_sum(std::size(methods), 0), same_first(std::size(methods), 0);
  size_t compared = 0;
  for (const std::vector<int>& order : orders) {
    std::vector<std::string> docs;
    std::string label = "passages";
    for (int i : order) {
      docs.push_back(ids[static_cast<size_t>(i)]);
      label += " " + std::to_string(i);
    }
    std::vector<int> prompt;
    std::vector<double> cold_ms;
    Answer cold;
    std::vector<std::vector<double>> blend_ms(std::size(methods));
    std::vector<Answer> blended(std::size(methods));
    std::vector<kdn_blend_report> rep(std::size(methods));
    for (int r = 0; r < o.repeats; ++r) {
      for (size_t k = 0; k < std::size(methods); ++k) {
        rep[k] = KDN_BLEND_REPORT_INIT;
        auto b = engine.Blended(ns, docs, question, methods[k].how, o.steps, &prompt, &rep[k]);
        if (!b.ok()) {
          std::fprintf(stderr, "kdn demo: %s\n", b.status().message().c_str());
          return 2;
        }
        blend_ms[k].push_back(b->ttft_ms);
        blended[k] = std::move(*b);
      }
      auto c = engine.Cold(prompt, o.steps);
      if (!c.ok()) {
        std::fprintf(stderr, "kdn demo: %s\n", c.status().message().c_str());
        return 2;
      }
      cold_ms.push_back(c->ttft_ms);
      cold = std::move(*c);
    }
    cold_sum += Median(cold_ms);
    std::printf("  %s: %zu tok, TTFT full prefill %.3f ms\n", label.c_str(), prompt.size(), Median(cold_ms));
    for (size_t k = 0; k < std::size(methods); ++k) {
      size_t agree = 0;
      for (size_t i = 0; i < std::min(cold.continuation.size(), blended[k].continuation.size()); ++i) {
        agree += cold.continuation[i] == blended[k].continuation[i];
      }
      blend_sum[k] += Median(blend_ms[k]);
      agree_sum[k] += agree;
      same_first[k] += cold.first_token == blended[k].first_token;
      std::printf("    %-16s recomputed %4.1f%% of the work, TTFT %7.3f ms (%4.1fx), first token %s, "
                  "continuation agreement %zu/%zu\n",
                  methods[k].name, 100 * rep[k].recompute_fraction, Median(blend_ms[k]),
                  Median(cold_ms) / Median(blend_ms[k]), cold.first_token == blended[k].first_token ? "same" : "differs",
                  agree, cold.continuation.size());
    }
    compared += cold.continuation.size();
    std::printf("      kdn default -> \"%s\"\n",
                Clip(m.tokenizer->DecodeAll(blended[1].continuation, question.back()), 80).c_str());
  }
  std::printf("  over the RAG prompts: full prefill %.3f ms;", cold_sum);
  for (size_t k = 0; k < std::size(methods); ++k) {
    std::printf(" %s %.3f ms (%.1fx, first tokens %zu/%zu, %zu/%zu continued alike)%s", methods[k].name, blend_sum[k],
                cold_sum / blend_sum[k], same_first[k], orders.size(), agree_sum[k], compared,
                k + 1 < std::size(methods) ? ";" : "\n");
  }
  return 0;
}

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

    std::printf("\n[1/4] ingesting %zu documents (prefill, then kdn_kv_store through the C ABI; %u-token chunks)\n",
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
      std::printf("\n[2/4] answering queries: cold (full prefill) vs with kdn (lookup + retrieve + prefill of the rest)\n");
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
      std::printf("\n[3/4] summary (median of %d runs per query, %d continuation tokens compared)\n", o.repeats,
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
      if (kdn_runtime_get_stats(rt, &st) == KDN_OK) {
        std::printf("  total TTFT: cold %.3f ms, with kdn %.3f ms (%.1fx); identical continuations %d/%zu\n",
                    cold_sum, warm_sum, cold_sum / warm_sum, same, rows.size());
        std::printf("  store: %llu chunks, %.1f KiB held; %llu retrieves served %llu tokens (%llu chunk hits)\n",
                    static_cast<unsigned long long>(st.chunks), static_cast<double>(st.used_bytes) / 1024.0,
                    static_cast<unsigned long long>(st.retrieves), static_cast<unsigned long long>(st.tokens_served),
                    static_cast<unsigned long long>(st.hits));
      }
    }

    if (code == 0) code = RagScene(m, engine, o);
  }
  kdn_runtime_destroy(rt);
  return code;
}

}  // namespace kdn::tools
