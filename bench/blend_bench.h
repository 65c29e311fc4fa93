// SPDX-License-Identifier: Apache-2.0
// `kdn bench blend`: blending on the reference model at ratios 0, 5, 10, 15,
// 20, 30 and 100% (issue 5, section 3), with a PNG of KL against ratio.
// Thread-safety: RunBlendBench is a whole command; run one at a time.
#pragma once

#include <string>

namespace kdn::bench {

struct BlendBenchOptions {
  std::string json_path;
  std::string png_path;   // empty: json_path with its extension replaced by .png
  std::string model;      // empty: the reference model
  std::string tokenizer;  // empty: the reference tokenizer
  std::string text;       // empty: bench/texts/stories.txt
  int contexts = 0;       // 0: every context the text allows (4 with quick)
  bool quick = false;
};

// One pass of blend::EvaluateBlends over every ratio (check layer 1) and a
// gradual selection (check layers 1 and the last) at 15%, so all of them are
// timed against one full-prefill series (blend_ttft_full: a prefill timed
// before each blend and naive run, interleaved; its median is every TTFT
// record's baseline "full_prefill", baseline_samples its length). Per ratio
// the records blend_<measure>_r<pct> (KL blend against naive, top-1, recompute
// fraction, TTFT blend). At 15% also the goals: blend_kl_ratio_vs_naive and
// blend_gradual_kl_ratio_vs_naive (KL blend / KL naive, goal <= 0.2) and
// blend_ttft_vs_work (TTFT blend / (f x TTFT full), goal <= 1.25), and the
// projection of f and of the TTFT ratio to a 32-layer model of the same kind
// (the first two layers in full, then the ratio). Every record carries
// "projected": true for those two, false for the measured ones. Returns an
// exit code.
int RunBlendBench(const BlendBenchOptions& options);

}  // namespace kdn::bench
