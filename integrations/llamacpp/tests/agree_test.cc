// SPDX-License-Identifier: Apache-2.0
// Two independent engines agree on the reference model: llama.cpp (the
// prebuilt libllama, reading the GGUF that tools/llama2c_to_gguf.py makes)
// and kdn's reference transformer give the same greedy ids from the same
// token ids, for BOS alone and three prompts, with flash attention on and
// off; and llama.cpp's tokenizer gives kdn's ids. The cache is f32, as the
// reference model's: an f16 cache rounds the KV, and near ties then go the
// other way (with flash attention off, the third prompt's greedy ids part
// from the reference after 5 steps).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "llama_session.h"
#include "llama_test_util.h"
#include "lab/model/transformer.h"
#include "refengine/model_loader.h"
#include "test_models.h"

namespace kdn::llamacpp {
namespace {

constexpr int kSteps = 32;
const char* const kPrompts[] = {"Once upon a time", "Lily and Tom went to the park",
                                "The little dog was sad because it lost its ball."};

// kdn's reference model: `steps` greedy ids after `tokens`.
std::vector<std::int32_t> ReferenceGreedy(const refengine::LoadedModel& m, const std::vector<int>& tokens,
                                          int steps) {
  model::Transformer t(*m.weights);
  model::KvCache cache = t.NewCache();
  std::vector<float> logits;
  std::vector<std::int32_t> out;
  std::vector<int> in = tokens;
  int pos = 0;
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE(t.Forward(in, pos, cache, &logits).ok());
    pos += static_cast<int>(in.size());
    out.push_back(model::Argmax(logits));
    in.assign(1, out.back());
  }
  return out;
}

std::unique_ptr<Session> Open(bool flash_attn, bool f16) { return OpenReference(flash_attn, f16); }

TEST(LlamaCpp, GreedyIdsEqualTheReferenceModel) {
  KDN_REQUIRE_MODEL();
  auto m = refengine::LoadModel(testing::ModelPath(), testing::TokenizerPath(), /*allow_random=*/false);
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::vector<std::vector<int>> prompts = {{model::kBos}};
  for (const char* p : kPrompts) prompts.push_back(m->tokenizer->Encode(p, /*bos=*/true));
  // From BOS, the reference run pinned in models/README.md.
  std::vector<std::int32_t> from_bos(testing::kReferenceIds.begin(), testing::kReferenceIds.begin() + kSteps);
  ASSERT_EQ(ReferenceGreedy(*m, prompts[0], kSteps), from_bos);
  for (bool flash_attn : {false, true}) {
    SCOPED_TRACE(std::string("flash attention ") + (flash_attn ? "on" : "off"));
    auto s = Open(flash_attn, /*f16=*/false);
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(s->vocab_size(), m->weights->config().vocab_size);
    for (const std::vector<int>& prompt : prompts) {
      s->Clear();
      ASSERT_TRUE(s->Decode(std::vector<std::int32_t>(prompt.begin(), prompt.end())).ok());
      auto ids = s->Greedy(kSteps);
      ASSERT_TRUE(ids.ok()) << ids.status().message();
      EXPECT_EQ(*ids, ReferenceGreedy(*m, prompt, kSteps)) << "prompt of " << prompt.size() << " tokens";
    }
  }
}

TEST(LlamaCpp, TokenizesAsTheReferenceModel) {
  KDN_REQUIRE_MODEL();
  auto m = refengine::LoadModel(testing::ModelPath(), testing::TokenizerPath(), /*allow_random=*/false);
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto s = Open(false, false);
  ASSERT_NE(s, nullptr);
  for (const char* p : kPrompts) {
    const std::vector<int> want = m->tokenizer->Encode(p, /*bos=*/true);
    auto got = s->Tokenize(p);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(*got, std::vector<std::int32_t>(want.begin(), want.end())) << p;
  }
}

TEST(LlamaCpp, AMissingModelIsAnError) {
  SessionOptions o;
  o.gguf = "/nonexistent/model.gguf";
  o.backend_dir = KDN_LLAMACPP_LIBDIR;
  auto s = Session::Load(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot load the model"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace kdn::llamacpp
