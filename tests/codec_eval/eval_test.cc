// SPDX-License-Identifier: Apache-2.0
#include "lab/codec/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "kernels/common/half.h"
#include "lab/model/checkpoint.h"
#include "lab/model/tokenizer.h"
#include "test_models.h"

namespace {

using namespace kdn;

// Test-only codecs: a lossless copy behind a 16-byte header, and one whose
// decode perturbs every element by a relative noise of `amplitude`.
class CopyCodec : public codec::Codec {
 public:
  explicit CopyCodec(float amplitude = 0.0f) : amplitude_(amplitude) {
    spec_.name = amplitude == 0.0f ? "test-copy" : "test-noise";
  }
  codec::CodecId id() const override { return codec::CodecId::kRaw; }
  const codec::Spec& spec() const override { return spec_; }
  Result<codec::Bytes> Encode(const codec::Shape& shape, const std::uint8_t* kv) const override {
    codec::Bytes out(kHeader + shape.bytes());
    const std::uint64_t n = shape.bytes();
    std::memcpy(out.data(), &n, sizeof n);
    std::memcpy(out.data() + kHeader, kv, shape.bytes());
    return out;
  }
  Status Decode(const codec::Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    if (size != kHeader + shape.bytes()) return Status::Corrupt("size");
    std::memcpy(out, data + kHeader, shape.bytes());
    if (amplitude_ != 0.0f) {
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> u(-amplitude_, amplitude_);
      float* f = reinterpret_cast<float*>(out);
      for (std::uint64_t i = 0; i < shape.elements(); ++i) f[i] *= 1.0f + u(rng);
    }
    return Status::Ok();
  }

 private:
  static constexpr size_t kHeader = 16;
  float amplitude_;
  codec::Spec spec_;
};

struct Fixture {
  std::unique_ptr<model::Checkpoint> weights;
  std::vector<int> tokens;  // the stories, BOS first
};

const Fixture& Loaded() {
  static const Fixture f = [] {
    Fixture x;
    auto w = model::Checkpoint::Load(kdn::testing::ModelPath());
    auto tok = model::Tokenizer::Load(kdn::testing::TokenizerPath(), 512);
    if (!w.ok() || !tok.ok()) return x;
    x.weights = std::make_unique<model::Checkpoint>(std::move(*w));
    std::ifstream in(KDN_STORIES, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    x.tokens = codec::TokenizeStories(*tok, text);
    return x;
  }();
  return f;
}

std::vector<int> First(size_t n) {
  const std::vector<int>& t = Loaded().tokens;
  return std::vector<int>(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(std::min(n, t.size())));
}

TEST(CodecEval, StoriesAreTokenizedParagraphByParagraph) {
  KDN_REQUIRE_MODEL();
  auto tok = model::Tokenizer::Load(kdn::testing::TokenizerPath(), 512);
  ASSERT_TRUE(tok.ok());
  std::vector<int> want = tok->Encode("One day, a cat sat.", true);
  const std::vector<int> second = tok->Encode("The end.", true);
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_EQ(codec::TokenizeStories(*tok, "One day, a cat sat.\n\nThe end.\n"), want);
  EXPECT_EQ(codec::TokenizeStories(*tok, "\n  One day, a cat sat. \n \n\n\r\nThe end."), want);
  EXPECT_EQ(codec::TokenizeStories(*tok, "One day, a cat sat.\nThe end."), tok->Encode("One day, a cat sat.\nThe end.", true));
  EXPECT_TRUE(codec::TokenizeStories(*tok, "\n \n").empty());
}

TEST(CodecEval, TheStoriesAreLongEnough) {
  KDN_REQUIRE_MODEL();
  EXPECT_GE(Loaded().tokens.size(), 6000u);
}

TEST(CodecEval, LosslessCodecIsExact) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  const std::vector<int> tokens = First(1000);
  // 5 layers x 2 x 96 tokens x 32 elements per context; 16 header bytes each.
  const std::uint64_t elements = 5ull * 2 * 96 * 32 * 10;
  for (std::uint32_t dtype : {1u, 0u}) {  // f16 (the default, as stored), f32
    codec::EvalOptions o;
    o.context = 96;
    o.continue_tokens = 12;
    o.dtype = dtype;
    const CopyCodec copy;
    auto r = codec::Evaluate(*Loaded().weights, tokens, copy, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->codec, "test-copy");
    EXPECT_EQ(r->dtype, dtype);
    EXPECT_EQ(r->contexts, 1000 / 96);
    EXPECT_EQ(r->kl_mean, 0.0) << dtype;
    EXPECT_EQ(r->kl_p95, 0.0);
    EXPECT_EQ(r->top1_agreement, 1.0);
    EXPECT_EQ(r->greedy_agreement, 1.0);
    EXPECT_EQ(r->fp32_bytes, elements * 4);
    EXPECT_EQ(r->fp16_bytes, elements * 2);
    EXPECT_EQ(r->encoded_bytes, elements * (dtype == 1 ? 2 : 4) + 16 * 10);
    const double held = dtype == 1 ? r->ratio_vs_fp16 : r->ratio_vs_fp32;
    EXPECT_LT(held, 1.0);
    EXPECT_GT(held, 0.999);
    EXPECT_DOUBLE_EQ(r->ratio_vs_fp16, r->ratio_vs_fp32 / 2);
  }
}

// The f16 evaluation compares against the KV rounded to f16: a codec that
// rounds f32 KV to f16 costs KL in an f32 evaluation and none in an f16 one.
TEST(CodecEval, TheOriginalIsTheKvAsHeld) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  // Rounding through f16 inside a "codec": its decode of f32 KV.
  class HalfCodec : public CopyCodec {
   public:
    Status Decode(const codec::Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
      KDN_RETURN_IF_ERROR(CopyCodec::Decode(shape, data, size, out));
      if (shape.dtype == 0) {
        float* f = reinterpret_cast<float*>(out);
        for (std::uint64_t i = 0; i < shape.elements(); ++i) {
          f[i] = kernels::half_to_float(kernels::float_to_half(f[i]));
        }
      }
      return Status::Ok();
    }
  };
  codec::EvalOptions o;
  o.context = 96;
  o.continue_tokens = 12;
  o.dtype = 0;
  auto f32 = codec::Evaluate(*Loaded().weights, First(500), HalfCodec(), o);
  o.dtype = 1;
  auto f16 = codec::Evaluate(*Loaded().weights, First(500), HalfCodec(), o);
  ASSERT_TRUE(f32.ok() && f16.ok());
  EXPECT_GT(f32->kl_mean, 0.0);
  EXPECT_EQ(f16->kl_mean, 0.0);
}

TEST(CodecEval, RawCodecIsExact) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  auto spec = codec::ParseSpec("raw");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  auto raw = codec::MakeCodec(*spec);
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  codec::EvalOptions o;
  o.context = 128;
  o.continue_tokens = 16;
  auto r = codec::Evaluate(*Loaded().weights, First(1100), **raw, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->contexts, 1100 / 128);
  EXPECT_EQ(r->kl_mean, 0.0);
  EXPECT_EQ(r->kl_p95, 0.0);
  EXPECT_EQ(r->top1_agreement, 1.0);
  EXPECT_EQ(r->greedy_agreement, 1.0);
  EXPECT_EQ(r->dtype, 1u);  // the KV as stored
  EXPECT_LE(r->ratio_vs_fp16, 1.0);  // headers count
  EXPECT_GT(r->ratio_vs_fp16, 0.99);
  EXPECT_NEAR(r->ratio_vs_fp16, r->ratio_vs_fp32 / 2, 1e-12);
}

TEST(CodecEval, PerturbedKvDiverges) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  const std::vector<int> tokens = First(1000);
  codec::EvalOptions o;
  o.context = 96;
  o.continue_tokens = 12;
  o.dtype = 0;  // the noise codec perturbs floats
  auto small = codec::Evaluate(*Loaded().weights, tokens, CopyCodec(0.02f), o);
  auto large = codec::Evaluate(*Loaded().weights, tokens, CopyCodec(0.5f), o);
  ASSERT_TRUE(small.ok()) << small.status().message();
  ASSERT_TRUE(large.ok()) << large.status().message();
  EXPECT_EQ(small->codec, "test-noise");
  EXPECT_GT(small->kl_mean, 0.0);
  EXPECT_GE(small->kl_p95, 0.0);
  EXPECT_LE(small->top1_agreement, 1.0);
  EXPECT_LE(small->greedy_agreement, 1.0);
  // More noise, more divergence.
  EXPECT_GT(large->kl_mean, small->kl_mean);
  EXPECT_GT(large->kl_p95, 0.0);
  EXPECT_LT(large->top1_agreement, 1.0);
  EXPECT_LE(large->top1_agreement, small->top1_agreement);
  EXPECT_GE(large->kl_p95, large->kl_mean * 0.5);
}

TEST(CodecEval, FreeRunningRunsCanBeLeftOut) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  codec::EvalOptions o;
  o.context = 96;
  o.continue_tokens = 12;
  o.dtype = 0;
  auto with = codec::Evaluate(*Loaded().weights, First(500), CopyCodec(0.3f), o);
  o.free_running = false;
  auto without = codec::Evaluate(*Loaded().weights, First(500), CopyCodec(0.3f), o);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_GE(with->greedy_agreement, 0.0);
  EXPECT_EQ(without->greedy_agreement, -1.0);
  // The teacher-forced measures are the same.
  EXPECT_EQ(without->kl_mean, with->kl_mean);
  EXPECT_EQ(without->kl_p95, with->kl_p95);
  EXPECT_EQ(without->top1_agreement, with->top1_agreement);
}

TEST(CodecEval, ContextsAreWholeWindows) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  codec::EvalOptions o;
  o.context = 50;
  o.continue_tokens = 2;
  for (size_t n : {50u, 99u, 100u, 101u, 317u}) {
    auto r = codec::Evaluate(*Loaded().weights, First(n), CopyCodec(), o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->contexts, static_cast<int>(n / 50)) << n;
  }
}

TEST(CodecEval, BadInputsAreRejected) {
  KDN_REQUIRE_MODEL();
  ASSERT_TRUE(Loaded().weights);
  const model::Checkpoint& w = *Loaded().weights;
  const CopyCodec copy;
  codec::EvalOptions o;
  o.context = 448;
  o.continue_tokens = 65;  // 448 + 65 > 512
  EXPECT_EQ(codec::Evaluate(w, First(1000), copy, o).status().code(), Code::kInvalidArgument);
  o.continue_tokens = 64;
  EXPECT_EQ(codec::Evaluate(w, First(447), copy, o).status().code(), Code::kInvalidArgument);
  o.continue_tokens = 0;
  EXPECT_EQ(codec::Evaluate(w, First(1000), copy, o).status().code(), Code::kInvalidArgument);
  o.context = 1;
  o.continue_tokens = 4;
  EXPECT_EQ(codec::Evaluate(w, First(1000), copy, o).status().code(), Code::kInvalidArgument);
  o.context = 8;
  EXPECT_EQ(codec::Evaluate(w, {1, 5, 9, 600, 7, 8, 9, 10}, copy, o).status().code(),
            Code::kInvalidArgument);
  o.dtype = 2;  // bf16: not an evaluation dtype
  EXPECT_EQ(codec::Evaluate(w, First(1000), copy, o).status().code(), Code::kInvalidArgument);
}

}  // namespace
