// SPDX-License-Identifier: Apache-2.0
// cachegen (core/codec/cachegen.cc) and the range coder it shares with a
// CUDA path (kernels/common/range_coder.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "core/codec/payload.h"
#include "kernels/common/quant.h"
#include "kernels/common/range_coder.h"
#include "codec_test_util.h"
#include "test_models.h"

namespace kdn::codec {
namespace {

using namespace test;  // NOLINT: the shared helpers
constexpr std::uint64_t kHeader = internal::kHeaderBytes;

std::vector<std::uint8_t> Synthetic(const Shape& s) {
  std::vector<float> f(s.elements());
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + (i % 7));
  return ToBytes(f, s.dtype);
}

Status DecodeCopy(const Codec& c, const Shape& shape, const std::uint8_t* data, size_t size) {
  std::vector<std::uint8_t> in(data, data + size), out(shape.bytes());
  return c.Decode(shape, in.data(), in.size(), out.data());
}

// The bins cachegen's payload records for (layer, kv) (byte 40 + 2l + kv).
std::uint32_t BinsIn(const Bytes& p, std::uint32_t layer, std::uint32_t kv) {
  return p[kHeader + 2 * layer + kv] + 1u;
}

// What the quantizer alone gives: per (layer, kv, token) scale = absmax /
// qmax, qmax = (bins - 1) / 2, x' = rint(x / scale) * scale, stored in dtype.
std::vector<float> QuantDequant(const Shape& s, const std::vector<float>& in, const Bytes& payload) {
  const std::uint64_t C = std::uint64_t{s.kv_heads} * s.head_dim;
  std::vector<std::uint8_t> bytes(s.bytes());
  for (std::uint64_t b = 0; b < std::uint64_t{s.layers} * 2 * s.tokens; ++b) {
    const std::uint32_t lk = static_cast<std::uint32_t>(b / s.tokens);
    const auto qmax = static_cast<std::int32_t>((BinsIn(payload, lk / 2, lk % 2) - 1) / 2);
    float am = 0.0f;
    for (std::uint64_t i = b * C; i < (b + 1) * C; ++i) am = std::fmax(am, std::fabs(in[i]));
    const float scale = kernels::sym_scale(am, static_cast<float>(qmax));
    for (std::uint64_t i = b * C; i < (b + 1) * C; ++i) {
      internal::StoreElement(s.dtype, bytes.data(), i,
                             kernels::sym_dequantize(kernels::sym_quantize(in[i], scale, qmax), scale));
    }
  }
  return ToFloats(bytes, s.dtype);
}

float OutputRounding(std::uint32_t dtype, float y) {
  if (dtype == 1) return std::fmax(std::fabs(y) * 0x1p-11f, 0x1p-25f);
  if (dtype == 2) return std::fabs(y) * 0x1p-8f;
  return 0.0f;
}

// ---------------------------------------------------------------- range coder

// Encodes `syms` under the table `freq` (sum 2^16); decodes them back.
void RoundTripStream(const std::vector<std::uint32_t>& freq, const std::vector<std::uint32_t>& syms) {
  std::vector<std::uint32_t> cum(freq.size() + 1, 0);
  for (size_t s = 0; s < freq.size(); ++s) cum[s + 1] = cum[s] + freq[s];
  ASSERT_EQ(cum.back(), kernels::kRcTotal);
  std::vector<std::uint8_t> buf(4 * syms.size() + 8);
  kernels::RcEncoder e;
  kernels::rc_enc_init(e, buf.data(), static_cast<std::uint32_t>(buf.size()));
  for (std::uint32_t s : syms) kernels::rc_enc_put(e, cum[s], freq[s]);
  kernels::rc_enc_flush(e);
  ASSERT_FALSE(e.overflow);
  std::vector<std::uint8_t> exact(buf.begin(), buf.begin() + e.pos);  // heap-exact for ASan
  kernels::RcDecoder d;
  kernels::rc_dec_init(d, exact.data(), e.pos);
  for (size_t i = 0; i < syms.size(); ++i) {
    const std::uint32_t v = kernels::rc_dec_target(d);
    ASSERT_FALSE(d.bad) << i;
    size_t s = 0;
    while (cum[s + 1] <= v) ++s;
    ASSERT_EQ(s, syms[i]) << "symbol " << i;
    kernels::rc_dec_take(d, cum[s], freq[s]);
  }
  EXPECT_TRUE(kernels::rc_dec_done(d));
}

TEST(CacheGenRangeCoderTest, SkewedRandomStreamsRoundTrip) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t A = 2 + rng() % 255;
    // Geometric-ish frequencies, every symbol >= 1, summing to 2^16.
    std::vector<std::uint32_t> freq(A, 1);
    std::uint32_t left = kernels::kRcTotal - static_cast<std::uint32_t>(A);
    for (size_t s = 0; s < A && left > 0; ++s) {
      const std::uint32_t take = s + 1 == A ? left : left / (2 + rng() % 3);
      freq[s] += take;
      left -= take;
    }
    freq[0] += left;
    std::discrete_distribution<std::uint32_t> pick(freq.begin(), freq.end());
    std::uniform_int_distribution<std::uint32_t> any(0, static_cast<std::uint32_t>(A - 1));
    std::vector<std::uint32_t> syms(1 + rng() % 600);
    for (auto& s : syms) s = trial % 4 == 0 ? any(rng) : pick(rng);  // also rare symbols, often
    RoundTripStream(freq, syms);
  }
}

TEST(CacheGenRangeCoderTest, DegenerateTablesRoundTrip) {
  RoundTripStream({kernels::kRcTotal}, std::vector<std::uint32_t>(256, 0));  // one symbol
  RoundTripStream({kernels::kRcTotal - 1, 1}, {1, 1, 1, 1, 0, 1, 1});         // the 2^-16 symbol
  RoundTripStream({1, kernels::kRcTotal - 2, 1}, {0, 2, 0, 2, 2, 0, 1});
  RoundTripStream({kernels::kRcTotal}, {});
}

TEST(CacheGenRangeCoderTest, GarbageStreamsNeverReadPastTheirEnd) {
  std::mt19937 rng(9);
  const std::vector<std::uint32_t> cum = {0, 30000, 30001, 65535, 65536};
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::uint8_t> buf(rng() % 12);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    kernels::RcDecoder d;
    kernels::rc_dec_init(d, buf.data(), static_cast<std::uint32_t>(buf.size()));
    for (int k = 0; k < 64 && !d.bad; ++k) {
      const std::uint32_t v = kernels::rc_dec_target(d);
      if (d.bad) break;
      size_t s = 0;
      while (cum[s + 1] <= v) ++s;
      kernels::rc_dec_take(d, cum[s], cum[s + 1] - cum[s]);
    }
    ASSERT_LE(d.pos, buf.size());
  }
}

// ---------------------------------------------------------------- the codec

// Decoded == quantize/dequantize bit for bit (the entropy stage is
// lossless), hence per element |x - x'| <= scale / 2 + 2^-20 absmax (+ the
// output dtype's rounding), scale = absmax / qmax: absmax / (2 qmax), i.e.
// absmax / 30 at 32 bins and absmax / 14 at 16.
TEST(CacheGenTest, RoundTripIsQuantizationExactlyOnReferenceKv) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  for (const char* spec : {"cachegen", "cachegen:bins=16", "cachegen:bins=32", "cachegen:bins=3", "cachegen:bins=256"}) {
    auto codec = Make(spec);
    for (std::uint32_t dtype : {0u, 1u, 2u}) {
      const Shape shape = RefShape(dtype);
      const std::vector<std::uint8_t> bytes = ToBytes(kv, dtype);
      const std::vector<float> in = ToFloats(bytes, dtype);
      Result<Bytes> p = codec->Encode(shape, bytes.data());
      ASSERT_TRUE(p.ok()) << p.status().message();
      std::vector<std::uint8_t> out(shape.bytes());
      ASSERT_TRUE(codec->Decode(shape, p->data(), p->size(), out.data()).ok());
      Result<std::unique_ptr<Codec>> d = DecoderFor(CodecId::kCacheGen);
      ASSERT_TRUE(d.ok());
      std::vector<std::uint8_t> out2(shape.bytes());
      ASSERT_TRUE((*d)->Decode(shape, p->data(), p->size(), out2.data()).ok());
      EXPECT_EQ(out, out2) << spec;
      const std::vector<float> got = ToFloats(out, dtype), want = QuantDequant(shape, in, *p);
      const std::uint64_t C = kHeads * kDim;
      for (std::uint64_t b = 0; b < std::uint64_t{kLayers} * 2 * kTokens; ++b) {
        const std::uint32_t lk = static_cast<std::uint32_t>(b / kTokens);
        const float qmax = static_cast<float>((BinsIn(*p, lk / 2, lk % 2) - 1) / 2);
        float am = 0.0f;
        for (std::uint64_t i = b * C; i < (b + 1) * C; ++i) am = std::fmax(am, std::fabs(in[i]));
        for (std::uint64_t i = b * C; i < (b + 1) * C; ++i) {
          ASSERT_EQ(kernels::float_bits(got[i]), kernels::float_bits(want[i])) << spec << " dtype " << dtype << " " << i;
          const float bound = am / (2 * qmax) + 0x1p-20f * am + OutputRounding(dtype, got[i]);
          ASSERT_LE(std::fabs(got[i] - in[i]), bound) << spec << " dtype " << dtype << " " << i;
        }
      }
    }
  }
}

TEST(CacheGenTest, SmallerThanInt8OnReferenceKv) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  const std::vector<std::uint8_t> f16 = ToBytes(kv, 1);
  Result<Bytes> i8 = Make("int8")->Encode(RefShape(1), f16.data());
  ASSERT_TRUE(i8.ok());
  for (const char* spec : {"cachegen", "cachegen:bins=32", "cachegen:bins=16"}) {
    Result<Bytes> p = Make(spec)->Encode(RefShape(1), f16.data());
    ASSERT_TRUE(p.ok());
    std::printf("  %-18s %6zu bytes, %.3fx smaller than fp16 (int8: %zu)\n", spec, p->size(),
                double(f16.size()) / double(p->size()), i8->size());
    if (std::string(spec) == "cachegen:bins=16") {
      EXPECT_LT(p->size(), i8->size()) << spec;
    }
  }
}

TEST(CacheGenTest, DefaultBinScheduleFollowsLmCache) {
  // 5 layers (under 10): 32 everywhere.
  const Shape small{5, 1, 4, 3, 0};
  Result<Bytes> p = Make("cachegen")->Encode(small, Synthetic(small).data());
  ASSERT_TRUE(p.ok());
  for (std::uint32_t l = 0; l < 5; ++l) {
    EXPECT_EQ(BinsIn(*p, l, 0), 32u);
    EXPECT_EQ(BinsIn(*p, l, 1), 32u);
  }
  EXPECT_EQ(internal::ReadHeader(CodecId::kCacheGen, small, p->data(), p->size())->param0, 0u);
  // 32 layers: keys 32 in 0-9, values 32 in 0-1, 16 after.
  const Shape big{32, 2, 4, 5, 1};
  const std::vector<std::uint8_t> kv = Synthetic(big);
  p = Make("cachegen")->Encode(big, kv.data());
  ASSERT_TRUE(p.ok());
  for (std::uint32_t l = 0; l < 32; ++l) {
    EXPECT_EQ(BinsIn(*p, l, 0), l < 10 ? 32u : 16u) << l;
    EXPECT_EQ(BinsIn(*p, l, 1), l < 2 ? 32u : 16u) << l;
  }
  EXPECT_TRUE(DecodeCopy(*Make("cachegen:bins=16"), big, p->data(), p->size()).ok());  // parameters travel
  // Forced bins everywhere.
  p = Make("cachegen:bins=16")->Encode(big, kv.data());
  ASSERT_TRUE(p.ok());
  for (std::uint32_t l = 0; l < 32; ++l) {
    EXPECT_EQ(BinsIn(*p, l, 0), 16u);
    EXPECT_EQ(BinsIn(*p, l, 1), 16u);
  }
  EXPECT_EQ(internal::ReadHeader(CodecId::kCacheGen, big, p->data(), p->size())->param0, 16u);
  // The decoded 32-layer chunk is the quantizer's result.
  std::vector<std::uint8_t> out(big.bytes());
  ASSERT_TRUE(Make("cachegen")->Decode(big, p->data(), p->size(), out.data()).ok());
  EXPECT_EQ(ToFloats(out, 1), QuantDequant(big, ToFloats(kv, 1), *p));
}

TEST(CacheGenTest, StreamsAreCappedAt256Tokens) {
  for (std::uint32_t tokens : {1u, 255u, 256u, 257u, 600u}) {
    const Shape shape{2, 1, 3, tokens, 0};
    const std::vector<std::uint8_t> kv = Synthetic(shape);
    Result<Bytes> p = Make("cachegen:bins=16")->Encode(shape, kv.data());
    ASSERT_TRUE(p.ok());
    const std::uint64_t streams = 2 * 2 * 3 * ((tokens + 255) / 256);
    // bins + scales + tables (bitmap 2 bytes + 2 per symbol) + lengths + streams.
    std::uint64_t pos = kHeader + 2 * 2 + 4 * 2 * 2 * tokens;
    for (int t = 0; t < 2 * 2 * 3; ++t) {
      const std::uint32_t bits = std::uint32_t{(*p)[pos]} | std::uint32_t{(*p)[pos + 1]} << 8;
      pos += 2 + 2 * static_cast<std::uint64_t>(__builtin_popcount(bits));
    }
    std::uint64_t total = 0;
    for (std::uint64_t s = 0; s < streams; ++s) {
      std::uint32_t len;
      std::memcpy(&len, p->data() + pos + 4 * s, 4);
      EXPECT_GE(len, 4u);
      total += len;
    }
    EXPECT_EQ(pos + 4 * streams + total, p->size()) << tokens << " tokens: expected " << streams << " streams";
    std::vector<std::uint8_t> out(shape.bytes());
    ASSERT_TRUE(Make("cachegen")->Decode(shape, p->data(), p->size(), out.data()).ok());
    EXPECT_EQ(ToFloats(out, 0), QuantDequant(shape, ToFloats(kv, 0), *p));
  }
}

TEST(CacheGenTest, SpecsAndDispatch) {
  EXPECT_EQ(Make("cachegen")->id(), CodecId::kCacheGen);
  EXPECT_EQ(Make("cachegen:bins=16")->spec().ToString(), "cachegen:bins=16");
  for (const char* bad : {"cachegen:bins=2", "cachegen:bins=257", "cachegen:bins=x", "cachegen:fast",
                          "cachegen:group=4"}) {
    Result<Spec> spec = ParseSpec(bad);
    ASSERT_TRUE(spec.ok());
    EXPECT_EQ(MakeCodec(*spec).status().code(), Code::kInvalidArgument) << bad;
  }
  Result<std::unique_ptr<Codec>> d = DecoderFor(CodecId::kCacheGen);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->id(), CodecId::kCacheGen);
}

// ---------------------------------------------------------------- rejection

TEST(CacheGenRejectTest, TruncatedLongerAndFlippedAreCorrupt) {
  const Shape shape{2, 2, 8, 13, 1};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  for (const char* spec : {"cachegen", "cachegen:bins=16", "cachegen:bins=255"}) {
    auto codec = Make(spec);
    const Bytes payload = *codec->Encode(shape, kv.data());
    ASSERT_TRUE(DecodeCopy(*codec, shape, payload.data(), payload.size()).ok());
    for (size_t n = 0; n < payload.size(); ++n) {
      const Status s = DecodeCopy(*codec, shape, payload.data(), n);
      ASSERT_EQ(s.code(), Code::kCorrupt) << spec << " truncated to " << n;
    }
    Bytes longer = payload;
    longer.push_back(0);
    EXPECT_EQ(DecodeCopy(*codec, shape, longer.data(), longer.size()).code(), Code::kCorrupt);
    // Every single-bit flip outside the scales and stream bytes is caught
    // (header, bins, tables, lengths); in the streams it gives a status.
    for (size_t i = 0; i < payload.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes f = payload;
        f[i] ^= static_cast<std::uint8_t>(1u << bit);
        const Status s = DecodeCopy(*codec, shape, f.data(), f.size());
        ASSERT_TRUE(s.ok() || s.code() == Code::kCorrupt) << s.message();
        if (i < kHeader + 4) {  // the header and the bins
          ASSERT_EQ(s.code(), Code::kCorrupt) << spec << " byte " << i << " bit " << bit;
        }
      }
    }
    // Other shapes and other codecs' decoders.
    Shape other = shape;
    other.tokens = 12;
    EXPECT_EQ(DecodeCopy(*codec, other, payload.data(), payload.size()).code(), Code::kCorrupt);
    EXPECT_EQ(DecodeCopy(*Make("int8"), shape, payload.data(), payload.size()).code(), Code::kCorrupt);
  }
}

// Hand-made inconsistencies in an otherwise valid payload.
TEST(CacheGenRejectTest, InconsistentBodiesAreCorrupt) {
  const Shape shape{1, 1, 2, 5, 0};  // 2 channels x k|v, 5 tokens, 32 bins (A = 31, bitmap 4 bytes)
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  auto codec = Make("cachegen");
  const Bytes good = *codec->Encode(shape, kv.data());
  ASSERT_TRUE(DecodeCopy(*codec, shape, good.data(), good.size()).ok());
  const size_t tables = kHeader + 2 + 4 * 2 * 5;
  auto corrupt = [&](const std::function<void(Bytes&)>& edit, const char* what) {
    Bytes p = good;
    edit(p);
    const Status s = DecodeCopy(*codec, shape, p.data(), p.size());
    EXPECT_EQ(s.code(), Code::kCorrupt) << what;
    EXPECT_FALSE(s.message().empty());
  };
  auto f32 = [](Bytes& p, size_t at, float v) { std::memcpy(p.data() + at, &v, 4); };
  corrupt([&](Bytes& p) { p[kHeader] = 15; }, "bins off the schedule");
  corrupt([&](Bytes& p) { p[kHeader] = 1; }, "bins 2");
  corrupt([&](Bytes& p) { f32(p, kHeader + 2, -1.0f); }, "negative scale");
  corrupt([&](Bytes& p) { f32(p, kHeader + 2, NAN); }, "NaN scale");
  corrupt([&](Bytes& p) { f32(p, kHeader + 2, 1e38f); }, "scale overflows");
  corrupt([&](Bytes& p) { p[tables + 3] |= 0x80; }, "symbol 31 of 31");
  corrupt([&](Bytes& p) { p[tables + 4] ^= 1; }, "table sum off by one");
  corrupt([&](Bytes& p) { p[tables + 5] ^= 0x80; }, "table sum off by 2^15");
  corrupt([&](Bytes& p) { p[tables] = 0; p[tables + 1] = 0; p[tables + 2] = 0; p[tables + 3] = 0; },
          "empty table");
  // The lengths (4 streams: 2 kv x 2 channels) follow the 4 tables.
  size_t lengths = tables;
  for (int t = 0; t < 4; ++t) {
    std::uint32_t bits;
    std::memcpy(&bits, good.data() + lengths, 4);
    lengths += 4 + 2 * static_cast<size_t>(__builtin_popcount(bits));
  }
  std::uint32_t l0, l1, l2, l3;
  std::memcpy(&l0, good.data() + lengths, 4);
  std::memcpy(&l1, good.data() + lengths + 4, 4);
  std::memcpy(&l2, good.data() + lengths + 8, 4);
  std::memcpy(&l3, good.data() + lengths + 12, 4);
  ASSERT_EQ(lengths + 16 + l0 + l1 + l2 + l3, good.size());
  auto put = [](Bytes& p, size_t at, std::uint32_t v) { std::memcpy(p.data() + at, &v, 4); };
  corrupt([&](Bytes& p) { put(p, lengths, l0 + 1); put(p, lengths + 4, l1 - 1); }, "lengths shifted");
  corrupt([&](Bytes& p) { put(p, lengths, 0xFFFFFFFFu); }, "length overruns");
  corrupt([&](Bytes& p) { put(p, lengths, l0 + l1); put(p, lengths + 4, 0); }, "all bytes in one stream");
  corrupt([&](Bytes& p) { put(p, lengths, 0xFFFFFFFFu); put(p, lengths + 4, l0 + l1 + 1); }, "lengths wrap");
  corrupt([&](Bytes& p) { put(p, lengths + 12, l3 + l0); put(p, lengths, 0); }, "a stream of 0 bytes");
}

TEST(CacheGenRejectTest, GarbageGivesAStatusNeverACrash) {
  std::mt19937 rng(777);
  const Shape shape{2, 3, 8, 9, 1};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  int ok = 0, corrupt = 0;
  for (const char* spec : {"cachegen", "cachegen:bins=16", "cachegen:bins=200"}) {
    auto codec = Make(spec);
    const Bytes payload = *codec->Encode(shape, kv.data());
    std::vector<std::uint8_t> out(shape.bytes());
    for (int i = 0; i < 2000; ++i) {
      std::vector<std::uint8_t> buf(rng() % (payload.size() * 2 + 1));
      for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
      ASSERT_EQ(DecodeCopy(*codec, shape, buf.data(), buf.size()).code(), Code::kCorrupt);
      ++corrupt;
    }
    for (int i = 0; i < 500; ++i) {  // a valid header, random body
      Bytes buf = payload;
      for (size_t j = kHeader; j < buf.size(); ++j) buf[j] = static_cast<std::uint8_t>(rng());
      const Status s = DecodeCopy(*codec, shape, buf.data(), buf.size());
      ASSERT_TRUE(s.ok() || s.code() == Code::kCorrupt);
      (s.ok() ? ok : corrupt)++;
    }
    for (int i = 0; i < 3000; ++i) {  // a few bytes changed
      Bytes buf = payload;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) buf[rng() % buf.size()] = static_cast<std::uint8_t>(rng());
      std::vector<std::uint8_t> in(buf);
      const Status s = codec->Decode(shape, in.data(), in.size(), out.data());
      ASSERT_TRUE(s.ok() || s.code() == Code::kCorrupt) << s.message();
      if (s.ok()) {
        for (float f : ToFloats(out, shape.dtype)) ASSERT_TRUE(std::isfinite(f));
      }
      (s.ok() ? ok : corrupt)++;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(corrupt, 0);
}

}  // namespace
}  // namespace kdn::codec
