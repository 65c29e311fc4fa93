// SPDX-License-Identifier: Apache-2.0
// The lossless zstd codec (codec/zstd.cc): bit-exact on the reference
// model's real KV in every dtype and setting, smaller than the KV, and
// bounds-safe on damaged payloads (every truncation and every bit flip of a
// payload is kCorrupt or the exact bytes, never a crash or other bytes).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "codec_test_util.h"

namespace kdn::codec {
namespace {

using internal::kHeaderBytes;
using test::Make;
using test::ReferenceKv;
using test::RefShape;
using test::ToBytes;

// Decodes from a heap copy of exactly `size` bytes (so ASan sees any read
// past it) into exactly shape.bytes().
Status DecodeExact(const Codec& c, const Shape& shape, const std::uint8_t* data, size_t size,
                   std::vector<std::uint8_t>* out) {
  std::unique_ptr<std::uint8_t[]> in(new std::uint8_t[size == 0 ? 1 : size]);
  if (size > 0) std::memcpy(in.get(), data, size);
  out->assign(shape.bytes(), 0xA5);
  return c.Decode(shape, in.get(), size, out->data());
}

TEST(CodecZstdTest, IsLosslessAndOthersAreNot) {
  EXPECT_FALSE(IsLossy(CodecId::kRaw));
  EXPECT_FALSE(IsLossy(CodecId::kZstd));
  for (CodecId id : {CodecId::kFp8, CodecId::kInt8, CodecId::kKivi2, CodecId::kCacheGen, CodecId::kKdn}) {
    EXPECT_TRUE(IsLossy(id)) << static_cast<int>(id);
  }
  EXPECT_TRUE(IsLossy(static_cast<CodecId>(99)));  // unknown: assume the worst
  EXPECT_EQ(static_cast<int>(CodecId::kZstd), 6);   // pinned
}

TEST(CodecZstdTest, ReferenceKvRoundTripsBitExactAndCompresses) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  for (const char* spec : {"zstd", "zstd:shuffle=0", "zstd:level=1", "zstd:level=19"}) {
    auto codec = Make(spec);
    for (std::uint32_t dtype : {0u, 1u, 2u}) {
      const Shape shape = RefShape(dtype);
      const std::vector<std::uint8_t> bytes = ToBytes(kv, dtype);
      Result<Bytes> p = codec->Encode(shape, bytes.data());
      ASSERT_TRUE(p.ok()) << spec << ": " << p.status().message();
      std::vector<std::uint8_t> out;
      ASSERT_TRUE(DecodeExact(*codec, shape, p->data(), p->size(), &out).ok()) << spec;
      EXPECT_EQ(out, bytes) << spec << " dtype " << dtype;
      // Any zstd decoder reads the settings from the payload.
      std::vector<std::uint8_t> again;
      ASSERT_TRUE(DecodeExact(*DecoderFor(CodecId::kZstd).value(), shape, p->data(), p->size(), &again).ok());
      EXPECT_EQ(again, bytes);
      const double ratio = static_cast<double>(bytes.size()) / static_cast<double>(p->size());
      std::printf("  %-16s dtype %u: %6zu -> %6zu bytes, ratio %.3f\n", spec, dtype, bytes.size(), p->size(), ratio);
      EXPECT_GT(ratio, 1.0) << spec << " dtype " << dtype;
    }
  }
}

// Every truncation and every single-bit flip of a payload of real KV: the
// decoder returns kCorrupt or exactly the bytes encoded. A payload of one
// layer (6 KiB of f16) keeps the ~50K decodes well under a second.
TEST(CodecZstdTest, EveryTruncationAndBitFlipIsCorruptOrExact) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> all = ReferenceKv();
  ASSERT_FALSE(all.empty());
  for (const char* spec : {"zstd", "zstd:shuffle=0"}) {
    const Shape shape{1, test::kHeads, test::kDim, test::kTokens, 1};
    const std::vector<float> kv(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(shape.elements()));
    const std::vector<std::uint8_t> bytes = ToBytes(kv, shape.dtype);
    auto codec = Make(spec);
    const Bytes payload = codec->Encode(shape, bytes.data()).value();
    std::vector<std::uint8_t> out;
    ASSERT_TRUE(DecodeExact(*codec, shape, payload.data(), payload.size(), &out).ok());
    ASSERT_EQ(out, bytes);
    for (size_t n = 0; n < payload.size(); ++n) {
      const Status s = DecodeExact(*codec, shape, payload.data(), n, &out);
      ASSERT_EQ(s.code(), Code::kCorrupt) << spec << " truncated to " << n;
      ASSERT_FALSE(s.message().empty());
    }
    int exact = 0, corrupt = 0;
    for (size_t i = 0; i < payload.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes flipped = payload;
        flipped[i] ^= static_cast<std::uint8_t>(1u << bit);
        const Status s = DecodeExact(*codec, shape, flipped.data(), flipped.size(), &out);
        if (s.ok()) {
          ASSERT_EQ(out, bytes) << spec << ": byte " << i << " bit " << bit << " decoded to other bytes";
          ++exact;
        } else {
          ASSERT_EQ(s.code(), Code::kCorrupt) << spec << " byte " << i << " bit " << bit;
          ++corrupt;
        }
      }
    }
    std::printf("  %s: %zu-byte payload, bit flips: %d corrupt, %d still exact\n", spec, payload.size(), corrupt,
                exact);
    EXPECT_GT(corrupt, 0);
  }
}

// Payloads that are well formed for zstd but not what the codec writes.
TEST(CodecZstdTest, ExtraFramesTrailingBytesAndOtherSizesAreCorrupt) {
  const Shape shape{2, 2, 8, 5, 0};
  std::vector<float> f(shape.elements());
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i % 13) * 0.25f - 1.0f;
  const std::vector<std::uint8_t> bytes = ToBytes(f, shape.dtype);
  auto codec = Make("zstd");
  const Bytes payload = codec->Encode(shape, bytes.data()).value();
  std::vector<std::uint8_t> out;
  // Two frames back to back (the second a copy of the first's body).
  Bytes two = payload;
  two.insert(two.end(), payload.begin() + kHeaderBytes, payload.end());
  EXPECT_EQ(DecodeExact(*codec, shape, two.data(), two.size(), &out).code(), Code::kCorrupt);
  // A body that is a frame of another content size, behind this shape's header.
  Shape other = shape;
  other.tokens = 4;
  const Bytes smaller = codec->Encode(other, bytes.data()).value();
  Bytes mixed(payload.begin(), payload.begin() + kHeaderBytes);
  mixed.insert(mixed.end(), smaller.begin() + kHeaderBytes, smaller.end());
  const Status s = DecodeExact(*codec, shape, mixed.data(), mixed.size(), &out);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("content size"), std::string::npos) << s.message();
  // No body at all.
  EXPECT_EQ(DecodeExact(*codec, shape, payload.data(), kHeaderBytes, &out).code(), Code::kCorrupt);
  // The header's parameters: an unknown format or shuffle, a level out of range.
  for (auto [param0, param1] : {std::pair{3u, 2u | (1u << 8)}, std::pair{3u, 1u | (2u << 8)},
                                std::pair{3u, 1u | (1u << 16)}, std::pair{0u, 1u | (1u << 8)},
                                std::pair{20u, 1u | (1u << 8)}}) {
    Bytes p = payload;
    internal::WriteHeader(internal::Header{CodecId::kZstd, shape, param0, param1}, p.data());
    EXPECT_EQ(DecodeExact(*codec, shape, p.data(), p.size(), &out).code(), Code::kCorrupt) << param0 << " " << param1;
  }
  // The settings travel: the header says level 3, shuffle 1.
  Bytes p = payload;
  internal::WriteHeader(internal::Header{CodecId::kZstd, shape, 3, 1u | (1u << 8)}, p.data());
  EXPECT_EQ(p, payload);
}

}  // namespace
}  // namespace kdn::codec
