// SPDX-License-Identifier: Apache-2.0
#include "lab/model/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "lab/model/tokenizer.h"
#include "test_models.h"

namespace kdn::model {
namespace {



class TransformerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    auto c = Checkpoint::Load(testing::ModelPath());
    ASSERT_TRUE(c.ok()) << c.status().message();
    weights_ = std::make_unique<Checkpoint>(std::move(c).value());
  }
  // Greedy from BOS, one token per step; returns the ids.
  std::vector<int> Greedy(Transformer& t, KvCache& cache, int steps) {
    std::vector<int> ids;
    std::vector<float> logits;
    int token = kBos;
    for (int pos = 0; pos < steps; ++pos) {
      const int in[1] = {token};
      EXPECT_TRUE(t.Forward(in, pos, cache, &logits).ok());
      token = Argmax(logits);
      ids.push_back(token);
    }
    return ids;
  }
  std::unique_ptr<Checkpoint> weights_;
};

TEST_F(TransformerTest, GreedyIdsMatchTheReference) {
  for (int threads : {1, 2}) {
    Transformer t(*weights_, threads);
    KvCache cache = t.NewCache();
    EXPECT_EQ(Greedy(t, cache, 48), testing::kReferenceIds) << threads << " threads";
  }
}

TEST_F(TransformerTest, KvMatchesTheReferenceWithin1e4Relative) {
  Transformer t(*weights_);
  KvCache cache = t.NewCache();
  Greedy(t, cache, 48);  // positions 0..47: BOS + 47 generated tokens
  const std::vector<float> ref[2] = {testing::ReadFloats(testing::ReferencePath("kv260k.k.f32")),
                                     testing::ReadFloats(testing::ReferencePath("kv260k.v.f32"))};
  const int L = 5, P = 48, D = 32;
  for (int kv = 0; kv < 2; ++kv) {
    ASSERT_EQ(ref[kv].size(), static_cast<size_t>(L * P * D));
    double max_abs = 0, max_err = 0;
    for (float x : ref[kv]) max_abs = std::max(max_abs, std::fabs(static_cast<double>(x)));
    for (int l = 0; l < L; ++l) {
      for (int p = 0; p < P; ++p) {
        const float* got = kv == 0 ? cache.k(l, p) : cache.v(l, p);
        for (int d = 0; d < D; ++d) {
          const double want = ref[kv][(static_cast<size_t>(l) * P + p) * D + d];
          const double err = std::fabs(got[d] - want);
          max_err = std::max(max_err, err);
          // Relative to the element, with a floor at 1% of the tensor's scale.
          ASSERT_LE(err, 1e-4 * std::max(std::fabs(want), 0.01 * max_abs))
              << (kv ? "V" : "K") << " layer " << l << " pos " << p << " dim " << d;
        }
      }
    }
    EXPECT_LE(max_err / max_abs, 1e-4) << (kv ? "V" : "K");
  }
}

TEST_F(TransformerTest, BatchedPrefillEqualsTokenByTokenBitwise) {
  std::vector<int> prompt = {kBos};
  prompt.insert(prompt.end(), testing::kReferenceIds.begin(), testing::kReferenceIds.end() - 1);  // 48 tokens
  Transformer t(*weights_, 2);
  KvCache step = t.NewCache(), batch = t.NewCache();
  std::vector<float> step_logits, batch_logits;
  for (int pos = 0; pos < 48; ++pos) {
    const int in[1] = {prompt[static_cast<size_t>(pos)]};
    ASSERT_TRUE(t.Forward(in, pos, step, &step_logits).ok());
  }
  ASSERT_TRUE(t.Forward(prompt, 0, batch, &batch_logits, /*all_logits=*/true).ok());
  ASSERT_EQ(batch_logits.size(), 48u * 512);
  EXPECT_EQ(0, std::memcmp(step_logits.data(), batch_logits.data() + 47 * 512, 512 * sizeof(float)));
  EXPECT_EQ(step.Export(0, 48), batch.Export(0, 48));
  // The logits of every position predict the next reference token.
  for (int p = 0; p < 48; ++p) {
    EXPECT_EQ(Argmax({batch_logits.data() + static_cast<size_t>(p) * 512, 512}), testing::kReferenceIds[static_cast<size_t>(p)]);
  }
}

TEST_F(TransformerTest, PrefillResumedFromImportedKvIsBitwiseIdentical) {
  std::vector<int> prompt = {kBos};
  prompt.insert(prompt.end(), testing::kReferenceIds.begin(), testing::kReferenceIds.end());  // 49 tokens
  Transformer t(*weights_);
  KvCache full = t.NewCache();
  std::vector<float> full_logits, resumed_logits;
  ASSERT_TRUE(t.Forward(prompt, 0, full, &full_logits).ok());
  for (int split : {1, 16, 30, 48}) {
    const std::vector<float> prefix = full.Export(0, split);
    ASSERT_EQ(prefix.size(), static_cast<size_t>(5 * 2 * split * 32));
    KvCache resumed = t.NewCache();
    ASSERT_TRUE(resumed.Import(0, split, prefix).ok());
    ASSERT_TRUE(t.Forward(std::span<const int>(prompt).subspan(static_cast<size_t>(split)), split, resumed,
                          &resumed_logits)
                    .ok());
    EXPECT_EQ(resumed_logits, full_logits) << "split " << split;
    EXPECT_EQ(resumed.Export(0, 49), full.Export(0, 49)) << "split " << split;
  }
}

TEST_F(TransformerTest, ExportIsTheCanonicalChunkLayout) {
  Transformer t(*weights_);
  KvCache cache = t.NewCache();
  Greedy(t, cache, 20);
  const std::vector<float> chunk = cache.Export(4, 12);  // [layer][k|v][token 8][kv_head 4][head_dim 8]
  ASSERT_EQ(chunk.size(), 5u * 2 * 8 * 32);
  for (int l = 0; l < 5; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int tok = 0; tok < 8; ++tok) {
        const float* src = kv == 0 ? cache.k(l, 4 + tok) : cache.v(l, 4 + tok);
        for (int e = 0; e < 32; ++e) {
          ASSERT_EQ(chunk[((static_cast<size_t>(l) * 2 + kv) * 8 + tok) * 32 + e], src[e]);
        }
      }
    }
  }
}

TEST_F(TransformerTest, BadCallsAreErrorsNotCrashes) {
  Transformer t(*weights_);
  KvCache cache = t.NewCache();
  std::vector<float> logits;
  EXPECT_EQ(t.Forward({}, 0, cache, &logits).code(), Code::kInvalidArgument);
  const int bad_token[1] = {512};
  EXPECT_EQ(t.Forward(bad_token, 0, cache, &logits).code(), Code::kInvalidArgument);
  const int neg[1] = {-1};
  EXPECT_EQ(t.Forward(neg, 0, cache, &logits).code(), Code::kInvalidArgument);
  const int ok[1] = {1};
  EXPECT_EQ(t.Forward(ok, 512, cache, &logits).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Forward(ok, -1, cache, &logits).code(), Code::kInvalidArgument);
  KvCache wrong(4, 512, 32);
  EXPECT_EQ(t.Forward(ok, 0, wrong, &logits).code(), Code::kInvalidArgument);
  EXPECT_EQ(cache.Import(510, 4, std::vector<float>(5 * 2 * 4 * 32)).code(), Code::kInvalidArgument);
  EXPECT_EQ(cache.Import(0, 4, std::vector<float>(7)).code(), Code::kInvalidArgument);
}

TEST(RandomTransformer, IsDeterministicAndRuns) {
  const Checkpoint a = Checkpoint::Random(Stories260KConfig(), 7), b = Checkpoint::Random(Stories260KConfig(), 7);
  Transformer ta(a, 1), tb(b, 2);
  KvCache ca = ta.NewCache(), cb = tb.NewCache();
  std::vector<float> la, lb;
  const std::vector<int> prompt = {1, 50, 60, 70, 80};
  ASSERT_TRUE(ta.Forward(prompt, 0, ca, &la).ok());
  ASSERT_TRUE(tb.Forward(prompt, 0, cb, &lb).ok());
  EXPECT_EQ(la, lb);
  for (float x : la) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace kdn::model
