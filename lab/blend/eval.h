// SPDX-License-Identifier: Apache-2.0
// Blending quality and speed on the reference model (issue 5, section 3).
//
// The text's token stream (BOS tokens dropped) is cut into chunks of
// `chunk_tokens`; each is computed alone (after a BOS, as an engine would
// prefill it) and cached as a knowledge item in a KvStore (host tier).
// Context i takes `chunks` chunks in a shuffled order: BOS, the chunks, then
// the question-like `suffix`. For each context:
//  - full prefill: Forward over the whole context (its time is TTFT full);
//  - blend: fetch the chunks by doc id, Compose (core/blend/blend.h) the
//    first N-1 positions at `ratio`, then run the last token (TTFT blend is
//    all of it, fetch included);
//  - naive: the same at ratio 0 (keys re-positioned, nothing recomputed).
// Every blend and naive run is timed right after a full prefill of the same
// context, so the full-prefill timings are one series interleaved with the
// runs they are compared with (prefill, naive, prefill, blend, ...).
// Then, teacher-forced on full prefill's greedy tokens, the next-token KL(full
// || run) in nats and top-1 agreement at the last context position and the
// `continue_tokens` positions after it, for blend and naive.
// recompute_fraction = layer x position work of the blend (the last token
// included) over the full prefill's; a KV-pass row counts at its share of a
// layer's multiply-adds (Transformer::KvMacs / LayerMacs).
// Thread-safety: reentrant (each call builds its own transformer and store).
#pragma once

#include <cstdint>
#include <vector>

#include "core/blend/blend.h"
#include "lab/model/checkpoint.h"
#include "core/util/status.h"

namespace kdn::blend {

struct BlendEvalOptions {
  int chunk_tokens = 64;
  int chunks = 4;                // per context
  double ratio = kDefaultRatio;  // kdn's default method (core/blend/blend.h) unless told otherwise
  std::vector<int> check_layers;  // empty: the default for the model (CheckLayersFor)
  int first_tokens = 0;          // BlendOptions::first_tokens (EPIC/LegoLink anchors)
  bool kv_pass = true;           // BlendOptions::kv_pass (false: check layers run whole, as CacheBlend)
  int continue_tokens = 31;      // positions compared after the last context position
  int max_contexts = 0;          // 0: as many as the chunks allow (each chunk used once)
  std::uint32_t seed = 1;        // the shuffles
  int threads = 0;               // the transformer's (0: all cores)
};

struct BlendEvalResult {
  int contexts = 0;
  double ratio = 0;
  double recompute_fraction = 0;
  double kl_blend_mean = 0, kl_naive_mean = 0;
  double top1_blend = 0, top1_naive = 0;
  double ttft_full_ms = 0, ttft_blend_ms = 0, ttft_naive_ms = 0;  // medians over contexts
  int ttft_full_samples = 0;     // the full-prefill series behind ttft_full_ms
  int context_tokens = 0;        // of the last context
};

// One blend setting of EvaluateBlends.
struct BlendVariant {
  double ratio = 0.15;
  std::vector<int> check_layers = {1};
  int first_tokens = 0;
  bool kv_pass = true;
};

// kInvalidArgument when the text holds fewer than `chunks` chunks or the
// contexts exceed the model's sequence length.
Result<BlendEvalResult> EvaluateBlend(const model::Checkpoint& weights, const std::vector<int>& text_tokens,
                                      const std::vector<int>& suffix, const BlendEvalOptions& options);

// Several blend settings over the same contexts in one pass (options.ratio
// options.check_layers, options.first_tokens and options.kv_pass are ignored): per context naive reuse and then
// each variant, each run after a full prefill timed for it. One result per
// variant, in order; all share one full-prefill series (ttft_full_ms is its
// median, ttft_full_samples its length: contexts x (variants + 1)) and the
// naive run's figures, so ratios between results are against the same
// baseline. EvaluateBlend is this with one variant.
Result<std::vector<BlendEvalResult>> EvaluateBlends(const model::Checkpoint& weights,
                                                    const std::vector<int>& text_tokens,
                                                    const std::vector<int>& suffix, const BlendEvalOptions& options,
                                                    const std::vector<BlendVariant>& variants);

}  // namespace kdn::blend
