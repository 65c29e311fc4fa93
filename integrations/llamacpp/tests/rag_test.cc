// SPDX-License-Identifier: Apache-2.0
// RAG inside llama.cpp (llama_eval.h, RagBlendKl): documents' KV computed
// alone, kept in kdn, placed after one another with llama_memory_seq_add and
// their first k tokens decoded again in place. k = 0 is naive reuse (the
// same figures as NaiveReuseKl on the same tokens); recomputing whole
// documents is full prefill (KL at float noise, the same greedy ids); the KL
// falls as k grows. And why the blend goes document by document: llama.cpp
// decodes a batch only right after its sequence's last position.
#include "llama_eval.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "lab/codec/eval.h"
#include "refengine/model_loader.h"
#include "test_models.h"

namespace kdn::llamacpp {
namespace {

class LlamaRag : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    auto m = refengine::LoadModel(testing::ModelPath(), testing::TokenizerPath(), /*allow_random=*/false);
    ASSERT_TRUE(m.ok()) << m.status().message();
    std::ifstream in(KDN_TEXTS_DIR "/heldout.txt", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::vector<int> s = codec::TokenizeStories(*m->tokenizer, text);
    stream_.assign(s.begin(), s.end());
    ASSERT_GT(stream_.size(), 1000u);
  }
  std::vector<std::int32_t> stream_;
};

// One document after BOS, nothing recomputed: the document's state is
// where it was computed (no shift), so the blended run is full prefill in
// two pieces.
TEST_F(LlamaRag, OneDocumentInPlaceIsFullPrefill) {
  RagBlendOptions o;
  o.documents = 1;
  o.trials = 1;
  o.recompute = {0};
  o.timing_runs = 0;
  auto r = RagBlendKl(KDN_GGUF_PATH, stream_, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->points.size(), 1u);
  EXPECT_EQ(r->prompt_tokens, 1u + 64 + 8);
  EXPECT_LT(r->points[0].kl_mean, 1e-9);
  EXPECT_EQ(r->points[0].top1_agreement, 1.0);
  EXPECT_TRUE(r->points[0].greedy_same);
}

// k = 0 on two documents and a one-token suffix is NaiveReuseKl's
// computation on the same tokens (its prefix: BOS and the first document;
// its document: the second and the suffix): the same KL, above float noise.
TEST_F(LlamaRag, NothingRecomputedIsNaiveReuse) {
  constexpr int kL = 64;
  RagBlendOptions o;
  o.documents = 2;
  o.document = kL;
  o.suffix = 1;
  o.trials = 1;
  o.recompute = {0};
  o.timing_runs = 0;
  auto rag = RagBlendKl(KDN_GGUF_PATH, stream_, o);
  ASSERT_TRUE(rag.ok()) << rag.status().message();
  NaiveReuseOptions n;
  n.prefix = 1 + kL;    // its first token is replaced by BOS
  n.document = kL + 1;  // all but its last token from its KV computed alone
  n.continue_tokens = o.continue_tokens;
  n.trials = 1;
  std::vector<std::int32_t> shifted = {0};
  shifted.insert(shifted.end(), stream_.begin(), stream_.end());
  auto naive = NaiveReuseKl(KDN_GGUF_PATH, shifted, n);
  ASSERT_TRUE(naive.ok()) << naive.status().message();
  std::printf("k = 0: KL %.6g (naive reuse %.6g), top-1 %.3f (%.3f)\n", rag->points[0].kl_mean, naive->kl_mean,
              rag->points[0].top1_agreement, naive->top1_agreement);
  EXPECT_GT(rag->points[0].kl_mean, 1e-4);
  EXPECT_NEAR(rag->points[0].kl_mean, naive->kl_mean, 1e-6 * naive->kl_mean);
  EXPECT_EQ(rag->points[0].top1_agreement, naive->top1_agreement);
}

// Four documents out of their stream order: the KL falls as more of each
// document's first tokens are decoded again, and recomputing them all (or
// more than all) is full prefill.
TEST_F(LlamaRag, RecomputingTheFirstTokensConverges) {
  RagBlendOptions o;
  o.documents = 4;
  o.document = 64;
  o.suffix = 8;
  o.trials = 1;
  o.order = {2, 0, 3, 1};
  o.recompute = {0, 4, 16, 64, 100};
  o.timing_runs = 0;
  auto r = RagBlendKl(KDN_GGUF_PATH, stream_, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->points.size(), 5u);
  for (const RagBlendPoint& p : r->points) {
    std::printf("k = %3d: KL %.4g, top-1 %.3f, greedy same %d, recomputed %llu of %llu\n", p.k, p.kl_mean,
                p.top1_agreement, p.greedy_same, static_cast<unsigned long long>(p.recomputed_tokens),
                static_cast<unsigned long long>(r->prompt_tokens));
  }
  EXPECT_EQ(r->prompt_tokens, 1u + 4 * 64 + 8);
  EXPECT_GT(r->points[0].kl_mean, 1e-4);
  EXPECT_GT(r->points[0].kl_mean, r->points[1].kl_mean);
  EXPECT_GT(r->points[1].kl_mean, r->points[2].kl_mean);
  EXPECT_GT(r->points[2].kl_mean, r->points[3].kl_mean);
  EXPECT_EQ(r->points[1].recomputed_tokens, 16u);
  for (std::size_t i : {3u, 4u}) {
    const RagBlendPoint& all = r->points[i];
    EXPECT_LT(all.kl_mean, 1e-6);
    EXPECT_EQ(all.top1_agreement, 1.0);
    EXPECT_TRUE(all.first_token_same);
    EXPECT_TRUE(all.greedy_same);
    EXPECT_EQ(all.recomputed_tokens, 256u);
  }
}

// The last m tokens of each document decoded again after the rest of it is
// placed (right before the next document or the question): m = L is full
// prefill again; some m lowers the KL of naive reuse; first k and last m
// together count both.
TEST_F(LlamaRag, RecomputingTheLastTokensToo) {
  RagBlendOptions o;
  o.documents = 3;
  o.document = 40;
  o.suffix = 8;
  o.trials = 1;
  o.order = {2, 0, 1};
  o.recompute = {0, 0, 0, 8, 30};
  o.recompute_last = {0, 16, 40, 8, 30};
  o.timing_runs = 0;
  auto r = RagBlendKl(KDN_GGUF_PATH, stream_, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->points.size(), 5u);
  EXPECT_EQ(r->points[1].m, 16);
  EXPECT_EQ(r->points[1].recomputed_tokens, 3u * 16);
  EXPECT_LT(r->points[1].kl_mean, r->points[0].kl_mean);
  EXPECT_EQ(r->points[3].recomputed_tokens, 3u * 16);
  EXPECT_LT(r->points[3].kl_mean, r->points[0].kl_mean);
  for (std::size_t i : {2u, 4u}) {  // m = L, and k + m > L: every token decoded again
    const RagBlendPoint& all = r->points[i];
    EXPECT_EQ(all.recomputed_tokens, 3u * 40);
    EXPECT_LT(all.kl_mean, 1e-6);
    EXPECT_EQ(all.top1_agreement, 1.0);
    EXPECT_TRUE(all.greedy_same);
  }
  o.recompute_last = {1, 2};  // not one m per k
  EXPECT_EQ(RagBlendKl(KDN_GGUF_PATH, stream_, o).status().code(), Code::kInvalidArgument);
}

// Why the blend recomputes document by document: llama.cpp decodes a batch
// only right after its sequence's last position, so tokens whose cells were
// removed from the middle cannot be decoded again there once later KV is in
// place; at the end, with explicit positions, they can.
TEST_F(LlamaRag, LlamaCppDecodesOnlyAfterTheSequencesLastPosition) {
  SessionOptions so;
  so.gguf = KDN_GGUF_PATH;
  so.backend_dir = KDN_LLAMACPP_LIBDIR;
  auto s = Session::Load(so);
  ASSERT_TRUE(s.ok()) << s.status().message();
  std::vector<std::int32_t> prompt = {1};
  prompt.insert(prompt.end(), stream_.begin() + 1, stream_.begin() + 40);
  ASSERT_TRUE((*s)->DecodeAt(prompt, 0).ok());
  (*s)->SeqRemove(0, 10, 14);
  const std::vector<std::int32_t> again(prompt.begin() + 10, prompt.begin() + 14);
  EXPECT_FALSE((*s)->DecodeAt(again, 10).ok());  // back into the sequence
  EXPECT_FALSE((*s)->DecodeAt(again, 41).ok());  // a gap after it
  EXPECT_TRUE((*s)->DecodeAt(again, 40).ok());   // right after it
}

TEST_F(LlamaRag, RefusesBadOptions) {
  RagBlendOptions o;
  o.order = {0, 1, 1, 3};
  EXPECT_EQ(RagBlendKl(KDN_GGUF_PATH, stream_, o).status().code(), Code::kInvalidArgument);
  o.order = {};
  o.recompute = {-1};
  EXPECT_EQ(RagBlendKl(KDN_GGUF_PATH, stream_, o).status().code(), Code::kInvalidArgument);
  o.recompute = {0};
  o.document = 200;  // the prompt and a document's cells exceed the context
  EXPECT_EQ(RagBlendKl(KDN_GGUF_PATH, stream_, o).status().code(), Code::kInvalidArgument);
  o.document = 64;
  EXPECT_EQ(RagBlendKl(KDN_GGUF_PATH, std::vector<std::int32_t>(stream_.begin(), stream_.begin() + 100), o)
                .status()
                .code(),
            Code::kInvalidArgument);
}

}  // namespace
}  // namespace kdn::llamacpp

