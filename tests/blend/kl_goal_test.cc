// SPDX-License-Identifier: Apache-2.0
// The blend's quality goal (issue 34; docs/blending.md reports it):
// KL(blend) / KL(naive reuse) <= 0.2 at f <= 0.55 of a prefill's work (what
// CacheBlend's 15% at one whole check layer costs) with top-1 >= 0.97, met
// by kdn's default method (KV passes at check layers 1 and 2, 28%), on the
// reference model over a text the method was not chosen on
// (bench/texts/calibration.txt; it was chosen on stories.txt), with
// blend::EvaluateBlends as `kdn bench blend` runs it. Deterministic: a change
// that breaks the goal, or worsens the CacheBlend figure the docs report,
// fails here. No timings.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/blend/blend.h"
#include "lab/blend/eval.h"
#include "lab/codec/eval.h"
#include "lab/model/checkpoint.h"
#include "lab/model/tokenizer.h"
#include "test_models.h"

namespace kdn::blend {
namespace {

// The claims (docs/blending.md): kdn's default meets the goal at the work
// of CacheBlend's 15% (0.11 here at f 0.547); CacheBlend's own setting does
// not (0.31 here, 0.32 on stories.txt), and must not get worse than 0.35.
constexpr double kGoal = 0.2;
constexpr double kMaxWork = 0.55;
constexpr double kMinTop1 = 0.97;
constexpr double kCacheBlendMax = 0.35;

TEST(BlendKlGoal, TheDefaultMeetsItOnAHeldOutTextAtCacheBlendsWork) {
  KDN_REQUIRE_MODEL();
  auto w = model::Checkpoint::Load(kdn::testing::ModelPath());
  auto tok = model::Tokenizer::Load(kdn::testing::TokenizerPath(), 512);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  std::ifstream in(KDN_CALIBRATION_TEXT, std::ios::binary);
  ASSERT_TRUE(in) << KDN_CALIBRATION_TEXT;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int> tokens = codec::TokenizeStories(*tok, text);
  // `kdn bench blend`'s question.
  const std::vector<int> suffix = tok->Encode(" Question: What happened in the story? Answer:", /*bos=*/false);
  const int layers = w->config().n_layers;
  const BlendOptions defaults;

  BlendEvalOptions o;  // chunks of 64 tokens, 4 per context, 31 continued tokens
  Result<std::vector<BlendEvalResult>> r = EvaluateBlends(
      *w, tokens, suffix, o,
      {{0.15, {1}, 0, /*kv_pass=*/false}, {defaults.ratio, CheckLayersFor(defaults, layers), 0, defaults.kv_pass}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  const BlendEvalResult& cacheblend = (*r)[0];
  const BlendEvalResult& kdn = (*r)[1];
  EXPECT_GE(cacheblend.contexts, 15);
  ASSERT_GT(cacheblend.kl_naive_mean, 0.0);
  EXPECT_EQ(cacheblend.kl_naive_mean, kdn.kl_naive_mean);  // one naive run per context, shared
  const double cb_ratio = cacheblend.kl_blend_mean / cacheblend.kl_naive_mean;
  const double kdn_ratio = kdn.kl_blend_mean / kdn.kl_naive_mean;
  const std::string got = "KL naive " + std::to_string(cacheblend.kl_naive_mean) + "; CacheBlend: KL " +
                          std::to_string(cacheblend.kl_blend_mean) + " (x" + std::to_string(cb_ratio) + ", f " +
                          std::to_string(cacheblend.recompute_fraction) + "); kdn's default: KL " +
                          std::to_string(kdn.kl_blend_mean) + " (x" + std::to_string(kdn_ratio) + ", f " +
                          std::to_string(kdn.recompute_fraction) + ", top-1 " + std::to_string(kdn.top1_blend) + ")";
  EXPECT_LE(kdn_ratio, kGoal) << got;
  EXPECT_LE(kdn.recompute_fraction, kMaxWork) << got;
  EXPECT_GE(kdn.top1_blend, kMinTop1) << got;
  EXPECT_LE(kdn.recompute_fraction, cacheblend.recompute_fraction + 0.01) << got;  // the same work, within 1%
  EXPECT_LE(cb_ratio, kCacheBlendMax) << got;
  EXPECT_LT(kdn_ratio, cb_ratio / 2) << got;
  // Both runs shared one full-prefill series: a prefill before naive and
  // before each blend, per context.
  EXPECT_EQ(cacheblend.ttft_full_samples, 3 * cacheblend.contexts);
  EXPECT_EQ(cacheblend.ttft_full_ms, kdn.ttft_full_ms);
}

}  // namespace
}  // namespace kdn::blend
