// SPDX-License-Identifier: Apache-2.0
// llama.cpp's saved sequence state and kdn's canonical layout:
// - the canonical KV of llama.cpp's prefill of the reference run (BOS and 47
//   greedy tokens) equals the reference KV files, which an independent
//   double-precision pass computed (f32 cache, flash attention off);
// - blob -> canonical -> blob gives llama.cpp's own bytes back (cells in
//   position order), for f32 and f16 caches, V transposed or not, and a
//   restore of the rebuilt blob into a new context continues exactly as the
//   prefill does;
// - bytes that do not add up are refused, never turned into KV.
#include "state_blob.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "llama_session.h"
#include "llama_test_util.h"
#include "test_models.h"

namespace kdn::llamacpp {
namespace {

std::unique_ptr<Session> Open(bool flash_attn, bool f16) { return OpenReference(flash_attn, f16); }

KvShape ShapeOf(const Session& s) { return KvShape{s.layers(), s.kv_heads(), s.head_dim()}; }

// BOS and the first 47 greedy ids: the reference run's 48 positions.
std::vector<std::int32_t> ReferenceTokens() {
  std::vector<std::int32_t> t = {1};
  t.insert(t.end(), testing::kReferenceIds.begin(), testing::kReferenceIds.begin() + 47);
  return t;
}

TEST(StateBlob, LlamaCppKvEqualsTheReferenceKv) {
  KDN_REQUIRE_MODEL();
  auto s = Open(/*flash_attn=*/false, /*f16=*/false);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Decode(ReferenceTokens()).ok());
  auto blob = s->SaveSequence();
  ASSERT_TRUE(blob.ok()) << blob.status().message();
  const KvShape shape = ShapeOf(*s);
  auto kv = BlobToCanonical(blob->data(), blob->size(), shape);
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  ASSERT_EQ(kv->dtype, 0u);
  ASSERT_EQ(kv->tokens, 48u);
  EXPECT_TRUE(kv->v_trans);  // flash attention off
  const std::vector<float> k = testing::ReadFloats(testing::ReferencePath("kv260k.k.f32"));
  const std::vector<float> v = testing::ReadFloats(testing::ReferencePath("kv260k.v.f32"));
  const std::uint64_t C = shape.channels(), run = 48 * C;
  ASSERT_EQ(k.size(), shape.layers * run);
  const float* got = reinterpret_cast<const float*>(kv->bytes.data());
  double worst_k = 0, worst_v = 0;
  for (std::uint64_t l = 0; l < shape.layers; ++l) {
    for (std::uint64_t i = 0; i < run; ++i) {
      worst_k = std::max(worst_k, static_cast<double>(std::fabs(got[(2 * l) * run + i] - k[l * run + i])));
      worst_v = std::max(worst_v, static_cast<double>(std::fabs(got[(2 * l + 1) * run + i] - v[l * run + i])));
    }
  }
  // The keys reach about 26 and the values 3; fp32 against double precision.
  EXPECT_LT(worst_k, 1e-4);
  EXPECT_LT(worst_v, 1e-4);
}

TEST(StateBlob, RoundTripsAndRestoresAsPrefill) {
  KDN_REQUIRE_MODEL();
  const std::vector<std::int32_t> tokens = ReferenceTokens();
  const std::vector<std::int32_t> prompt(tokens.begin(), tokens.begin() + 30);
  for (bool flash_attn : {false, true}) {
    for (bool f16 : {false, true}) {
      SCOPED_TRACE(std::string("flash attention ") + (flash_attn ? "on" : "off") + ", " + (f16 ? "f16" : "f32"));
      auto cold = Open(flash_attn, f16);
      ASSERT_NE(cold, nullptr);
      // The prompt but its last token, saved; then the rest, as prefill does it.
      ASSERT_TRUE(cold->Decode(std::vector<std::int32_t>(prompt.begin(), prompt.end() - 1)).ok());
      auto blob = cold->SaveSequence();
      ASSERT_TRUE(blob.ok());
      ASSERT_TRUE(cold->Decode({prompt.back()}).ok());
      auto want = cold->Greedy(16);
      ASSERT_TRUE(want.ok());

      const KvShape shape = ShapeOf(*cold);
      auto kv = BlobToCanonical(blob->data(), blob->size(), shape);
      ASSERT_TRUE(kv.ok()) << kv.status().message();
      EXPECT_EQ(kv->dtype, f16 ? 1u : 0u);
      EXPECT_EQ(kv->v_trans, !flash_attn);
      EXPECT_EQ(kv->tokens, prompt.size() - 1);
      auto rebuilt = CanonicalToBlob(*kv, shape);
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().message();
      EXPECT_EQ(*rebuilt, *blob) << "llama.cpp's cells are in position order here: the same bytes";

      auto warm = Open(flash_attn, f16);
      ASSERT_NE(warm, nullptr);
      ASSERT_TRUE(warm->RestoreSequence(*rebuilt).ok());
      ASSERT_TRUE(warm->Decode({prompt.back()}).ok());
      auto got = warm->Greedy(16);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, *want);
    }
  }
}

TEST(StateBlob, BadBytesAreRefused) {
  KDN_REQUIRE_MODEL();
  auto s = Open(false, false);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Decode({1, 403, 407, 261}).ok());
  auto blob = s->SaveSequence();
  ASSERT_TRUE(blob.ok());
  const KvShape shape = ShapeOf(*s);
  ASSERT_TRUE(BlobToCanonical(blob->data(), blob->size(), shape).ok());
  // Every truncation.
  for (std::size_t n = 0; n < blob->size(); ++n) {
    EXPECT_FALSE(BlobToCanonical(blob->data(), n, shape).ok()) << "truncated to " << n;
  }
  auto refused = [&](std::vector<std::uint8_t> b, Code code, const char* what) {
    auto r = BlobToCanonical(b.data(), b.size(), shape);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), code) << what << ": " << r.status().message();
  };
  std::vector<std::uint8_t> b = *blob;
  b[0] ^= 1;
  refused(b, Code::kUnsupported, "magic");
  b = *blob;
  b[8] = 2;
  refused(b, Code::kUnsupported, "two streams");
  b = *blob;
  b.push_back(0);
  refused(b, Code::kCorrupt, "a byte after the end");
  b = *blob;
  b[16] = 3;  // cell 0 at position 3: position 3 twice, 0 missing
  refused(b, Code::kUnsupported, "a repeated position");
  // A blob of another model: another layer count, wider rows.
  auto other = BlobToCanonical(blob->data(), blob->size(), KvShape{shape.layers + 1, shape.kv_heads, shape.head_dim});
  EXPECT_EQ(other.status().code(), Code::kInvalidArgument);
  auto wider = BlobToCanonical(blob->data(), blob->size(), KvShape{shape.layers, shape.kv_heads * 2, shape.head_dim});
  EXPECT_EQ(wider.status().code(), Code::kInvalidArgument);
  // And kdn's own blob refuses canonical bytes of the wrong size.
  CanonicalKv kv;
  kv.tokens = 4;
  kv.bytes.resize(10);
  EXPECT_FALSE(CanonicalToBlob(kv, shape).ok());
}

}  // namespace
}  // namespace kdn::llamacpp
