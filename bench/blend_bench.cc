// SPDX-License-Identifier: Apache-2.0
#include "bench/blend_bench.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "lab/blend/eval.h"
#include "lab/codec/eval.h"
#include "bench/plot.h"
#include "refengine/model_loader.h"

namespace kdn::bench {
namespace {

constexpr const char* kTool = "kdn bench blend";
constexpr const char* kSuffix = " Question: What happened in the story? Answer:";

std::string DefaultBlendText() {
  const std::string built = std::string(KDN_BENCH_TEXTS_DIR) + "/stories.txt";
  std::error_code ec;
  if (std::filesystem::exists(built, ec)) return built;
  return "bench/texts/stories.txt";
}

}  // namespace

int RunBlendBench(const BlendBenchOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "%s: %s\n", kTool, m.c_str());
    return 2;
  };
  const std::string text_path = o.text.empty() ? DefaultBlendText() : o.text;
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return fail("cannot read the text file '" + text_path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto loaded = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) return fail(loaded.status().message());
  const std::vector<int> tokens = codec::TokenizeStories(*loaded->tokenizer, text);
  const std::vector<int> suffix = loaded->tokenizer->Encode(kSuffix, /*bos=*/false);
  const int layers = loaded->weights->config().n_layers;

  // Every ratio, then gradual selection at 15%, in one pass: one full-prefill
  // series for the whole run, a prefill timed before each blend.
  // The ratio sweep is CacheBlend as published (one whole check layer);
  // then the methods of issue 34 at about the same work f.
  const std::vector<int> pcts = {0, 5, 10, 15, 20, 30, 100};
  std::vector<blend::BlendVariant> variants;
  for (int pct : pcts) variants.push_back({pct / 100.0, {1}, 0, /*kv_pass=*/false});
  variants.push_back({0.15, {1, layers - 1}, 0, false});
  struct Method {
    const char* name;
    const char* what;
    blend::BlendVariant v;
  };
  const std::vector<Method> methods = {
      {"cacheblend", "CacheBlend: 15% by key deviation at one whole check layer (1)", {0.15, {1}, 0, false}},
      {"kv_pass", "the same selection, check layer 1 by a KV pass (K and V only), 33%", {0.33, {1}, 0, true}},
      {"kdn_default", "kdn's default: KV passes at check layers 1 and 2, 28% (gradual)", {0.28, {1, 2}, 0, true}},
      {"first_k", "EPIC/LegoLink: the first 32 tokens of each chunk at every layer, nothing else", {0.0, {1}, 32, true}},
      {"first_k_and_default", "the first 2 tokens of each chunk, then kdn's default at 26%", {0.26, {1, 2}, 2, true}},
  };
  for (const Method& m : methods) variants.push_back(m.v);
  blend::BlendEvalOptions eo;
  eo.max_contexts = o.contexts > 0 ? o.contexts : (o.quick ? 4 : 0);
  std::printf("%s: %s, chunks of 64 tokens, 4 per context\n", kTool, text_path.c_str());
  Result<std::vector<blend::BlendEvalResult>> all =
      blend::EvaluateBlends(*loaded->weights, tokens, suffix, eo, variants);
  if (!all.ok()) return fail(all.status().message());

  // Every record says "projected": false when this run measured it, true when
  // it is extrapolated from what was measured (then params say on what basis).
  Records rec;
  const blend::BlendEvalResult& first = all->front();
  const std::string full = "full_prefill";
  const nlohmann::json series = {{"contexts", first.contexts},
                                 {"samples", first.ttft_full_samples},
                                 {"interleaved", "per context: prefill, naive, then prefill, blend for each setting"}};
  rec.Add("blend_ttft_full", first.ttft_full_ms, "ms", series, "", 0.0, false);
  // What every TTFT ratio record adds to its params: the series it is against.
  auto against_full = [&](nlohmann::json params, const blend::BlendEvalResult& r) {
    params["baseline_series"] = "blend_ttft_full";
    params["baseline_samples"] = r.ttft_full_samples;
    return params;
  };
  rec.Add("blend_ttft_naive", first.ttft_naive_ms, "ms", against_full({{"contexts", first.contexts}}, first), full,
          first.ttft_full_ms, false);
  struct Point {
    double ratio;
    blend::BlendEvalResult r;
  };
  std::vector<Point> points;
  for (size_t i = 0; i < pcts.size(); ++i) {
    const blend::BlendEvalResult& r = (*all)[i];
    points.push_back({r.ratio, r});
    const std::string s = "_r" + std::to_string(pcts[i]);
    nlohmann::json params = {{"ratio", r.ratio}, {"contexts", r.contexts}, {"check_layers", {1}},
                             {"context_tokens", r.context_tokens}};
    rec.Add("blend_kl" + s, r.kl_blend_mean, "nats", params, "naive", r.kl_naive_mean, false);
    rec.Add("blend_top1" + s, r.top1_blend, "frac", params, "naive", r.top1_naive, false);
    rec.Add("blend_recompute_fraction" + s, r.recompute_fraction, "frac", params, "", 0.0, false);
    rec.Add("blend_ttft" + s, r.ttft_blend_ms, "ms", against_full(params, r), full, r.ttft_full_ms, false);
    if (pcts[i] == 15) {
      rec.Add("blend_kl_ratio_vs_naive", r.kl_blend_mean / r.kl_naive_mean, "x",
              {{"ratio", 0.15}, {"check_layers", {1}}, {"goal", "<= 0.2"}}, "", 0.0, false);
      const double budget = r.recompute_fraction * r.ttft_full_ms;
      const double machinery = r.ttft_blend_ms / budget;
      rec.Add("blend_ttft_vs_work", machinery, "x",
              against_full({{"ratio", 0.15}, {"goal", "<= 1.25"}, {"f", r.recompute_fraction},
                            {"ttft_full_ms", r.ttft_full_ms}},
                           r),
              "", 0.0, false);
      // A 32-layer model of the same kind: layers 0 and 1 in full, then 15%
      // (plus the fresh suffix and the last token, as measured here).
      const double fresh = 1.0 - (r.context_tokens - 1 - static_cast<double>(suffix.size())) / r.context_tokens;
      const double f32 = (2.0 + 30.0 * (0.15 + (1 - 0.15) * fresh)) / 32.0;
      rec.Add("blend_projected_f_32_layers", f32, "frac",
              {{"ratio", 0.15}, {"layers_here", layers}, {"fresh_fraction", fresh},
               {"basis", "32 layers: 0 and 1 in full, then 15% of the cached tokens plus this run's fresh ones"}},
              "", 0.0, true);
      rec.Add("blend_projected_ttft_ratio_32_layers", f32 * machinery, "x",
              {{"ratio", 0.15}, {"machinery_factor", machinery},
               {"basis", "projected f x blend_ttft_vs_work measured here = TTFT blend / TTFT full"}},
              "", 0.0, true);
    }
  }
  // The methods at about the same work: each record names the method and f.
  const size_t first_method = pcts.size() + 1;
  for (size_t i = 0; i < methods.size(); ++i) {
    const Method& m = methods[i];
    const blend::BlendEvalResult& r = (*all)[first_method + i];
    const nlohmann::json params = {{"method", m.name},
                                   {"what", m.what},
                                   {"f", r.recompute_fraction},
                                   {"ratio", m.v.ratio},
                                   {"check_layers", m.v.check_layers},
                                   {"first_tokens", m.v.first_tokens},
                                   {"kv_pass", m.v.kv_pass},
                                   {"contexts", r.contexts},
                                   {"text", std::filesystem::path(text_path).filename().string()}};
    const std::string p = std::string("blend_method_") + m.name;
    rec.Add(p + "_kl_ratio_vs_naive", r.kl_blend_mean / r.kl_naive_mean, "x", params, "naive", 1.0, false);
    rec.Add(p + "_kl", r.kl_blend_mean, "nats", params, "naive", r.kl_naive_mean, false);
    rec.Add(p + "_top1", r.top1_blend, "frac", params, "naive", r.top1_naive, false);
    rec.Add(p + "_f", r.recompute_fraction, "frac", params, "", 0.0, false);
    rec.Add(p + "_ttft", r.ttft_blend_ms, "ms", against_full(params, r), full, r.ttft_full_ms, false);
    std::printf("  %-20s f %.3f  KL/naive %.3f  top-1 %.3f  TTFT %.2f ms (full %.2f)\n", m.name,
                r.recompute_fraction, r.kl_blend_mean / r.kl_naive_mean, r.top1_blend, r.ttft_blend_ms,
                r.ttft_full_ms);
  }
  const blend::BlendEvalResult& gradual = (*all)[pcts.size()];
  nlohmann::json gp = {{"ratio", 0.15}, {"contexts", gradual.contexts}, {"check_layers", {1, layers - 1}}};
  rec.Add("blend_gradual_kl_r15", gradual.kl_blend_mean, "nats", gp, "naive", gradual.kl_naive_mean, false);
  rec.Add("blend_gradual_kl_ratio_vs_naive", gradual.kl_blend_mean / gradual.kl_naive_mean, "x",
          {{"ratio", 0.15}, {"check_layers", {1, layers - 1}}, {"goal", "<= 0.2"}}, "", 0.0, false);
  rec.Add("blend_gradual_recompute_fraction_r15", gradual.recompute_fraction, "frac", gp, "", 0.0, false);
  rec.Add("blend_gradual_ttft_r15", gradual.ttft_blend_ms, "ms", against_full(gp, gradual), full,
          gradual.ttft_full_ms, false);
  if (!rec.Write(o.json_path)) return fail("cannot write " + o.json_path);

  // KL against ratio (log y; ratio 100% has KL 0 and is left out).
  std::string data = "$b << EOD\n", naive = "$n << EOD\n";
  for (const Point& p : points) {
    char row[96];
    if (p.r.kl_blend_mean > 0) {
      std::snprintf(row, sizeof row, "%.4g %.6g\n", 100 * p.ratio, p.r.kl_blend_mean);
      data += row;
    }
    std::snprintf(row, sizeof row, "%.4g %.6g\n", 100 * p.ratio, p.r.kl_naive_mean);
    naive += row;
  }
  data += "EOD\n";
  naive += "EOD\n";
  const std::string body =
      data + naive + "set title " + GnuplotQuote("Blending on the reference model: KL(full prefill || blended)") +
      "\nset logscale y\nset xlabel 'recomputed cached tokens (%)'\nset ylabel 'KL mean (nats, log scale)'\n"
      "set grid\nset key top right\n"
      "plot $b using 1:2 with linespoints lw 2 pt 7 title 'blend (check layer 1)', "
      "$n using 1:2 with lines dt 2 lw 2 title 'naive reuse (no recompute)'\n";
  std::string png = o.png_path;
  if (png.empty()) png = std::filesystem::path(o.json_path).replace_extension(".png").string();
  DrawPng(png, body, kTool);
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace kdn::bench
