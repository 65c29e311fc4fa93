// SPDX-License-Identifier: Apache-2.0
#include "blend_cmd.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "lab/codec/eval.h"
#include "refengine/model_loader.h"

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
  eval_cmd_->add_option("--ratio", options_.eval.ratio, "fraction of cached tokens recomputed (0.15 = 15%)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  eval_cmd_->add_option("--check-layers", options_.eval.check_layers, "layers where tokens are selected")
      ->capture_default_str();
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
}

}  // namespace kdn::tools
