// SPDX-License-Identifier: Apache-2.0
// The blend's quality goal, KL(blend) / KL(naive reuse) <= 0.2 at 15%
// (issue 5; docs/blending.md reports it), on the reference model over a text
// the blend's settings were not chosen on (bench/texts/calibration.txt; the
// check layers were chosen on stories.txt), with blend::EvaluateBlends as
// `kdn bench blend` runs it. Deterministic: a change that breaks the goal, or
// worsens the one-check-layer figure the docs report, fails here. No timings.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "lab/blend/eval.h"
#include "lab/codec/eval.h"
#include "lab/model/checkpoint.h"
#include "lab/model/tokenizer.h"
#include "test_models.h"

namespace kdn::blend {
namespace {

// The claims (docs/blending.md): gradual selection (check layers 1 and the
// last) meets the goal at 15% while recomputing at most 70% of the work;
// CacheBlend's one check layer does not (0.31 here, 0.32 on stories.txt),
// and must not get worse than 0.35.
constexpr double kGoal = 0.2;
constexpr double kGradualMaxWork = 0.7;
constexpr double kOneLayerMax = 0.35;

TEST(BlendKlGoal, GradualSelectionMeetsItOnAHeldOutText) {
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

  BlendEvalOptions o;  // chunks of 64 tokens, 4 per context, 31 continued tokens
  Result<std::vector<BlendEvalResult>> r =
      EvaluateBlends(*w, tokens, suffix, o, {{0.15, {1}}, {0.15, {1, layers - 1}}});
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  const BlendEvalResult& one = (*r)[0];
  const BlendEvalResult& gradual = (*r)[1];
  EXPECT_GE(one.contexts, 15);
  ASSERT_GT(one.kl_naive_mean, 0.0);
  EXPECT_EQ(one.kl_naive_mean, gradual.kl_naive_mean);  // one naive run per context, shared
  const double one_ratio = one.kl_blend_mean / one.kl_naive_mean;
  const double gradual_ratio = gradual.kl_blend_mean / gradual.kl_naive_mean;
  const std::string got = "KL naive " + std::to_string(one.kl_naive_mean) + "; check layer 1: KL " +
                          std::to_string(one.kl_blend_mean) + " (x" + std::to_string(one_ratio) + ", f " +
                          std::to_string(one.recompute_fraction) + "); gradual: KL " +
                          std::to_string(gradual.kl_blend_mean) + " (x" + std::to_string(gradual_ratio) + ", f " +
                          std::to_string(gradual.recompute_fraction) + ")";
  EXPECT_LE(gradual_ratio, kGoal) << got;
  EXPECT_LE(gradual.recompute_fraction, kGradualMaxWork) << got;
  EXPECT_LE(one_ratio, kOneLayerMax) << got;
  EXPECT_LT(one.recompute_fraction, gradual.recompute_fraction) << got;
  // Both runs shared one full-prefill series: a prefill before naive and
  // before each blend, per context.
  EXPECT_EQ(one.ttft_full_samples, 3 * one.contexts);
  EXPECT_EQ(one.ttft_full_ms, gradual.ttft_full_ms);
}

}  // namespace
}  // namespace kdn::blend
