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

// Per ratio, blend::EvaluateBlend's results as records blend_<measure>_r<pct>
// (KL blend and naive, top-1, recompute fraction, TTFT full / blend / naive,
// with full prefill's TTFT as the TTFT baseline). At 15% also the goals:
// blend_kl_ratio_vs_naive (KL blend / KL naive, goal <= 0.2) and
// blend_ttft_vs_work (TTFT blend / (f x TTFT full), goal <= 1.25), and the
// projection of f and of the TTFT ratio for a 32-layer model of the same
// kind (the first two layers in full, then the ratio). Also a gradual
// selection run (check layers 1 and 4) at 15%. Returns an exit code.
int RunBlendBench(const BlendBenchOptions& options);

}  // namespace kdn::bench
