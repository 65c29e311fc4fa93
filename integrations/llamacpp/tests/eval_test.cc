// SPDX-License-Identifier: Apache-2.0
// A tier codec's quality inside llama.cpp (llama_eval.h) against the same
// codec's on kdn's reference transformer (codec::Evaluate), on the same
// contexts of the held-out text: lossless KV restores with KL 0 and every
// argmax kept; kdn:balanced's KL inside llama.cpp is the reference model's
// within a factor of 1.5 either way (the two engines compute the same model
// to about 1e-5).
#include "llama_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "core/codec/codec.h"
#include "lab/codec/eval.h"
#include "refengine/model_loader.h"
#include "test_models.h"

namespace kdn::llamacpp {
namespace {

constexpr int kContexts = 2;

std::vector<int> HeldOutStream(const model::Tokenizer& tok) {
  std::ifstream in(KDN_TEXTS_DIR "/heldout.txt", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<int> s = codec::TokenizeStories(tok, text);
  s.resize(std::min<std::size_t>(s.size(), 256 * kContexts));
  return s;
}

class LlamaEval : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    auto m = refengine::LoadModel(testing::ModelPath(), testing::TokenizerPath(), /*allow_random=*/false);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(m).value();
    stream_ = HeldOutStream(*model_.tokenizer);
  }
  // The codec's figures inside llama.cpp.
  Result<LlamaKlResult> InLlama(const std::string& codec) const {
    LlamaKlOptions o;
    o.contexts = kContexts;
    o.codec = codec;
    return LlamaCodecKl(KDN_GGUF_PATH, std::vector<std::int32_t>(stream_.begin(), stream_.end()), o);
  }
  refengine::LoadedModel model_;
  std::vector<int> stream_;
};

TEST_F(LlamaEval, LosslessKvRestoresWithNoLoss) {
  auto r = InLlama("raw");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->contexts, kContexts);
  EXPECT_EQ(r->restored_tokens, static_cast<std::uint64_t>(kContexts * 255));
  EXPECT_LT(r->kl_mean, 1e-9);
  EXPECT_EQ(r->top1_agreement, 1.0);
}

TEST_F(LlamaEval, KdnBalancedCostsInsideLlamaCppWhatItCostsTheReferenceModel) {
  auto llama = InLlama("kdn:balanced");
  ASSERT_TRUE(llama.ok()) << llama.status().message();
  auto spec = codec::ParseSpec("kdn:balanced");
  auto c = codec::MakeCodec(*spec);
  ASSERT_TRUE(c.ok());
  codec::EvalOptions eo;
  eo.context = 256;
  eo.continue_tokens = 64;
  eo.free_running = false;
  auto ref = codec::Evaluate(*model_.weights, stream_, **c, eo);
  ASSERT_TRUE(ref.ok()) << ref.status().message();
  std::printf("kdn:balanced, %d contexts: KL %.3g in llama.cpp, %.3g on the reference model; top-1 %.3f / %.3f\n",
              kContexts, llama->kl_mean, ref->kl_mean, llama->top1_agreement, ref->top1_agreement);
  EXPECT_GT(llama->kl_mean, 0.0);
  EXPECT_LT(llama->kl_mean, 1.5 * ref->kl_mean);
  EXPECT_GT(llama->kl_mean, ref->kl_mean / 1.5);
}

// Naive reuse: with a prefix of BOS alone nothing moves and the KL is 0 (the
// mechanics: a second sequence, the shift, the copy); after a real prefix
// the document's KV lacks the prefix's attention and the KL is the naive
// baseline kdn's blender improves on.
TEST_F(LlamaEval, NaiveReuseAtAnotherOffset) {
  const std::vector<std::int32_t> s(stream_.begin(), stream_.end());
  NaiveReuseOptions o;
  o.prefix = 1;
  auto none = NaiveReuseKl(KDN_GGUF_PATH, s, o);
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_LT(none->kl_mean, 1e-6);
  EXPECT_EQ(none->top1_agreement, 1.0);
  o.prefix = 96;
  auto moved = NaiveReuseKl(KDN_GGUF_PATH, s, o);
  ASSERT_TRUE(moved.ok()) << moved.status().message();
  std::printf("naive reuse after a prefix of 96 tokens: KL %.3g, top-1 %.3f\n", moved->kl_mean, moved->top1_agreement);
  EXPECT_GT(moved->kl_mean, 1e-4);
}

}  // namespace
}  // namespace kdn::llamacpp
