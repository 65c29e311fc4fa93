// SPDX-License-Identifier: Apache-2.0
#include "blend_cmd.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#define KDN_EXPERIMENTAL
#include "core/blend/gate.h"
#include "core/keys/hash.h"
#include "lab/codec/eval.h"
#include "refengine/model_loader.h"
#include "refengine/ref_engine.h"

namespace kdn::tools {

Result<blend::BlendEvalResult> EvaluateBlendFiles(const BlendEvalCliOptions& o) {
  std::ifstream in(o.text, std::ios::binary);
  if (!in) return Status::InvalidArgument("cannot read the text file '" + o.text + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto loaded = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) return loaded.status();
  const std::vector<int> tokens = codec::TokenizeStories(*loaded->tokenizer, text);
  const std::vector<int> suffix = loaded->tokenizer->Encode(" " + o.suffix, /*bos=*/false);
  return blend::EvaluateBlend(*loaded->weights, tokens, suffix, o.eval);
}

int RunBlendEval(const BlendEvalCliOptions& o) {
  Result<blend::BlendEvalResult> r = EvaluateBlendFiles(o);
  if (!r.ok()) {
    std::fprintf(stderr, "kdn blend eval: %s\n", r.status().message().c_str());
    return 2;
  }
  if (o.json) {
    const nlohmann::ordered_json j = {{"contexts", r->contexts},
                                      {"ratio", r->ratio},
                                      {"recompute_fraction", r->recompute_fraction},
                                      {"kl_blend_mean", r->kl_blend_mean},
                                      {"kl_naive_mean", r->kl_naive_mean},
                                      {"top1_blend", r->top1_blend},
                                      {"top1_naive", r->top1_naive},
                                      {"ttft_full_ms", r->ttft_full_ms},
                                      {"ttft_blend_ms", r->ttft_blend_ms},
                                      {"ttft_naive_ms", r->ttft_naive_ms},
                                      {"first_tokens", o.eval.first_tokens},  // after issue 5's ten
                                      {"kv_pass", o.eval.kv_pass}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("blend at ratio %.2f, first %d tokens of each chunk, check layers %s: %d contexts of %d tokens (%d "
              "chunks of %d)\n",
              r->ratio, o.eval.first_tokens, o.eval.kv_pass ? "by a KV pass" : "whole", r->contexts,
              r->context_tokens, o.eval.chunks, o.eval.chunk_tokens);
  std::printf("  recomputed  %.1f%% of the layer x token work\n", 100 * r->recompute_fraction);
  std::printf("  KL          blend %.4g, naive %.4g nats (teacher-forced, vs full prefill)\n", r->kl_blend_mean,
              r->kl_naive_mean);
  std::printf("  top-1       blend %.2f%%, naive %.2f%%\n", 100 * r->top1_blend, 100 * r->top1_naive);
  std::printf("  TTFT        full %.3f ms, blend %.3f ms, naive %.3f ms (medians)\n", r->ttft_full_ms,
              r->ttft_blend_ms, r->ttft_naive_ms);
  return 0;
}

namespace {

// The fingerprint the reference engine registers the model under (what
// kdn_model_get_fingerprint gives it), as 64 hex digits.
Result<std::string> ReferenceFingerprint(const refengine::LoadedModel& m) {
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  kdn_runtime* rt = nullptr;
  KDN_RETURN_IF_ERROR(refengine::FromKdn(kdn_runtime_create(&ro, &rt), "kdn_runtime_create"));
  Result<std::string> out = Status::Internal("no model");
  {
    auto engine = refengine::RefEngine::Create(m, rt, 1);
    if (!engine.ok()) {
      out = engine.status();
    } else {
      keys::Digest d{};
      const Status s = refengine::FromKdn(kdn_model_get_fingerprint((*engine)->model(), d.data()),
                                          "kdn_model_get_fingerprint");
      out = s.ok() ? Result<std::string>(keys::ToHex(d)) : Result<std::string>(s);
    }
  }
  kdn_runtime_destroy(rt);
  return out;
}

}  // namespace

int RunBlendCalibrate(const BlendCalibrateCliOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "kdn blend calibrate: %s\n", m.c_str());
    return 2;
  };
  std::ifstream in(o.text, std::ios::binary);
  if (!in) return fail("cannot read the text file '" + o.text + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto loaded = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) return fail(loaded.status().message());
  std::string fingerprint = o.fingerprint;
  if (!fingerprint.empty() &&
      (fingerprint.size() != 64 || fingerprint.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return fail("--fingerprint must be 64 lowercase hex digits (kdn_model_get_fingerprint)");
  }
  if (fingerprint.empty()) {
    Result<std::string> f = ReferenceFingerprint(*loaded);
    if (!f.ok()) return fail(f.status().message());
    fingerprint = *f;
  }
  const std::vector<int> tokens = codec::TokenizeStories(*loaded->tokenizer, text);
  const std::vector<int> suffix = loaded->tokenizer->Encode(" " + o.suffix, /*bos=*/false);
  const int layers = loaded->weights->config().n_layers;
  const blend::BlendOptions defaults;
  // kdn's default (an engine with a KV pass) and CacheBlend's (one without).
  const std::vector<blend::BlendVariant> methods = {
      {defaults.ratio, blend::CheckLayersFor(defaults, layers), 0, true},
      {blend::kDefaultRatioWholeChecks, {layers > 1 ? 1 : 0}, 0, false}};
  blend::BlendEvalOptions eo;
  eo.max_contexts = o.max_contexts;
  auto r = blend::EvaluateBlends(*loaded->weights, tokens, suffix, eo, methods);
  if (!r.ok()) return fail(r.status().message());
  std::vector<blend::GateRecord> records;
  for (size_t i = 0; i < methods.size(); ++i) {
    const blend::BlendEvalResult& e = (*r)[i];
    blend::GateRecord g;
    g.fingerprint = fingerprint;
    g.ratio = methods[i].ratio;
    g.check_layers = methods[i].check_layers;
    g.kv_pass = methods[i].kv_pass;
    g.first_tokens = methods[i].first_tokens;
    g.kl_ratio = e.kl_naive_mean > 0 ? e.kl_blend_mean / e.kl_naive_mean : 0;
    g.top1 = e.top1_blend;
    g.f = e.recompute_fraction;
    g.contexts = e.contexts;
    records.push_back(g);
  }
  if (!o.out.empty()) {
    // The file keeps other models' and methods' records; these replace their own.
    std::vector<blend::GateRecord> keep;
    if (std::ifstream(o.out).good()) {
      auto old = blend::ReadGate(o.out);
      if (!old.ok()) return fail(old.status().message());
      for (const blend::GateRecord& g : *old) {
        bool replaced = false;
        for (const blend::GateRecord& n : records) {
          replaced = replaced || (g.fingerprint == n.fingerprint && g.ratio == n.ratio &&
                                  g.check_layers == n.check_layers && g.kv_pass == n.kv_pass &&
                                  g.first_tokens == n.first_tokens);
        }
        if (!replaced) keep.push_back(g);
      }
    }
    keep.insert(keep.end(), records.begin(), records.end());
    const std::string tmp = o.out + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f << "# kdn blend gate (kdn blend calibrate): one line per model fingerprint and method\n";
      for (const blend::GateRecord& g : keep) f << blend::GateLine(g) << "\n";
      if (!f.flush()) return fail("cannot write '" + tmp + "'");
    }
    if (std::rename(tmp.c_str(), o.out.c_str()) != 0) return fail("cannot replace '" + o.out + "'");
  }
  if (o.json) {
    nlohmann::ordered_json j = {{"fingerprint", fingerprint}, {"methods", nlohmann::json::array()}};
    for (const blend::GateRecord& g : records) {
      j["methods"].push_back({{"ratio", g.ratio},
                              {"check_layers", g.check_layers},
                              {"kv_pass", g.kv_pass},
                              {"first_tokens", g.first_tokens},
                              {"kl_ratio", g.kl_ratio},
                              {"top1", g.top1},
                              {"f", g.f},
                              {"contexts", g.contexts}});
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (const blend::GateRecord& g : records) std::printf("%s\n", blend::GateLine(g).c_str());
  }
  return 0;
}

BlendCommand::BlendCommand(CLI::App& app) {
  CLI::App* blend = app.add_subcommand("blend", "Blending cached KV that is not a prefix (CacheBlend)");
  blend->require_subcommand(1);
  eval_cmd_ = blend->add_subcommand("eval", "Cache chunks alone, blend them in shuffled orders, compare");
  eval_cmd_->add_option("--model", options_.model, "llama2.c checkpoint")->required();
  eval_cmd_->add_option("--tokenizer", options_.tokenizer, "tokenizer file (tok512.bin format)")->required();
  eval_cmd_->add_option("--text", options_.text, "text file, cut into chunks")->required();
  eval_cmd_->add_option("--chunks", options_.eval.chunks, "chunks per context")->capture_default_str()
      ->check(CLI::Range(1, 64));
  eval_cmd_->add_option("--chunk-tokens", options_.eval.chunk_tokens, "tokens per chunk")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  eval_cmd_->add_option("--ratio", options_.eval.ratio, "fraction of cached tokens recomputed (0.28 = 28%)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  eval_cmd_->add_option("--check-layers", options_.eval.check_layers,
                        "layers where tokens are selected (default: 1 and 2, kdn's default)");
  eval_cmd_->add_option("--first-tokens", options_.eval.first_tokens,
                        "leading tokens of each chunk recomputed at every layer (EPIC/LegoLink)")
      ->capture_default_str()->check(CLI::Range(0, 4096));
  eval_cmd_->add_flag("--whole-check-layers{false}", options_.eval.kv_pass,
                      "check layers run whole for every token (CacheBlend as published); default: only K and V "
                      "there, then the whole layer for the selected tokens (the same KV, less work)");
  eval_cmd_->add_option("--continue", options_.eval.continue_tokens, "positions compared after the context")
      ->capture_default_str()->check(CLI::Range(0, 4096));
  eval_cmd_->add_option("--contexts", options_.eval.max_contexts, "at most this many contexts (0: all)")
      ->capture_default_str();
  eval_cmd_->add_option("--suffix", options_.suffix, "the question-like text after the chunks")->capture_default_str();
  eval_cmd_->add_flag("--json", options_.json, "print one JSON object");

  calibrate_cmd_ = blend->add_subcommand(
      "calibrate", "Measure blending's KL on a calibration text for kdn's default methods: a gate file");
  calibrate_cmd_->add_option("--model", calibrate_.model, "llama2.c checkpoint")->required();
  calibrate_cmd_->add_option("--tokenizer", calibrate_.tokenizer, "tokenizer file (tok512.bin format)")->required();
  calibrate_cmd_->add_option("--text", calibrate_.text, "calibration text (hold it out of evaluations)")->required();
  calibrate_cmd_->add_option("--out", calibrate_.out,
                             "gate file to write (other models' and methods' lines are kept): "
                             "kdn_blend_options.gate_file");
  calibrate_cmd_->add_option("--fingerprint", calibrate_.fingerprint,
                             "the model's fingerprint, 64 hex digits (kdn_model_get_fingerprint; default: the "
                             "reference engine's for this checkpoint)");
  calibrate_cmd_->add_option("--contexts", calibrate_.max_contexts, "at most this many contexts (0: all)")
      ->capture_default_str();
  calibrate_cmd_->add_flag("--json", calibrate_.json, "print one JSON object");
}

}  // namespace kdn::tools
