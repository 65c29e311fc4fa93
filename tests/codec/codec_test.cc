// SPDX-License-Identifier: Apache-2.0
// The KV codecs (core/codec) and their shared element math
// (kernels/common/half.h, quant.h), on the reference model's real KV.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "core/codec/payload.h"
#include "kernels/common/half.h"
#include "kernels/common/quant.h"
#include "codec_test_util.h"
#include "test_models.h"

namespace kdn::codec {
namespace {

using kernels::bf16_to_float;
using kernels::e4m3_to_float;
using kernels::float_to_bf16;
using kernels::float_to_e4m3;
using kernels::float_to_half;
using kernels::half_to_float;

// ---------------------------------------------------------------- half.h

// Every fp16 code decodes to a float that encodes back to the same code
// (NaNs stay NaN); decoding agrees with the compiler's _Float16 where it has one.
TEST(HalfTest, Fp16RoundTripsEveryCode) {
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const auto h = static_cast<std::uint16_t>(c);
    const float f = half_to_float(h);
    if ((c & 0x7C00) == 0x7C00 && (c & 0x3FF)) {
      ASSERT_TRUE(std::isnan(f)) << c;
      const std::uint16_t back = float_to_half(f);
      ASSERT_EQ(back & 0x7C00, 0x7C00) << c;
      ASSERT_NE(back & 0x3FF, 0) << c;
      continue;
    }
    ASSERT_EQ(float_to_half(f), h) << c;
#if defined(__FLT16_MAX__)
    _Float16 r;
    std::memcpy(&r, &h, 2);
    ASSERT_EQ(kernels::float_bits(static_cast<float>(r)), kernels::float_bits(f)) << c;
#endif
  }
}

// Midpoints between neighbouring codes go to the even code; a float ulp off
// the midpoint goes to the nearer code. Covers subnormals and overflow.
TEST(HalfTest, Fp16RoundsTiesToEven) {
  for (std::uint32_t c = 0; c < 0x7BFF; ++c) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      const float a = half_to_float(static_cast<std::uint16_t>(c | sign));
      const float b = half_to_float(static_cast<std::uint16_t>((c + 1) | sign));
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);  // exact: 11 bits + 1
      const std::uint32_t even = (c & 1) ? c + 1 : c;
      ASSERT_EQ(float_to_half(mid), even | sign) << c;
      ASSERT_EQ(float_to_half(std::nextafter(mid, b)), (c + 1) | sign) << c;
      ASSERT_EQ(float_to_half(std::nextafter(mid, a)), c | sign) << c;
    }
  }
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);  // the tie with 2^16 goes to even: inf
  EXPECT_EQ(float_to_half(-1e30f), 0xFC00);
  EXPECT_EQ(float_to_half(INFINITY), 0x7C00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);  // tie with the smallest subnormal
  EXPECT_EQ(float_to_half(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(1e-45f), 0x0000);  // a float subnormal
}

#if defined(__FLT16_MAX__)
// Random float bit patterns convert as the compiler's _Float16 does.
TEST(HalfTest, Fp16MatchesCompilerOnRandomFloats) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1'000'000; ++i) {
    const float f = kernels::bits_float(rng());
    if (std::isnan(f)) continue;
    const _Float16 r = static_cast<_Float16>(f);
    std::uint16_t want;
    std::memcpy(&want, &r, 2);
    ASSERT_EQ(float_to_half(f), want) << kernels::float_bits(f);
  }
}
#endif

TEST(HalfTest, Bf16RoundTripsEveryCodeAndRoundsTiesToEven) {
  for (std::uint32_t c = 0; c < 0x10000; ++c) {
    const auto b = static_cast<std::uint16_t>(c);
    const float f = bf16_to_float(b);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << c;
      continue;
    }
    ASSERT_EQ(float_to_bf16(f), b) << c;
  }
  for (std::uint32_t c = 0; c < 0x7F7F; ++c) {
    for (std::uint32_t sign : {0u, 0x8000u}) {
      const float a = bf16_to_float(static_cast<std::uint16_t>(c | sign));
      const float b = bf16_to_float(static_cast<std::uint16_t>((c + 1) | sign));
      const float mid = kernels::bits_float((std::uint32_t{c | sign} << 16) | 0x8000u);
      const std::uint32_t even = (c & 1) ? c + 1 : c;
      ASSERT_EQ(float_to_bf16(mid), even | sign) << c;
      ASSERT_EQ(float_to_bf16(std::nextafter(mid, b)), (c + 1) | sign) << c;
      ASSERT_EQ(float_to_bf16(std::nextafter(mid, a)), c | sign) << c;
    }
  }
  EXPECT_EQ(float_to_bf16(3.4e38f), 0x7F80);  // beyond the largest bf16: inf
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(HalfTest, Fp8E4m3RoundTripsEveryCodeAndSaturates) {
  int nans = 0;
  for (std::uint32_t c = 0; c < 0x100; ++c) {
    const auto q = static_cast<std::uint8_t>(c);
    const float f = e4m3_to_float(q);
    if (kernels::e4m3_is_nan(q)) {
      ++nans;
      ASSERT_TRUE(std::isnan(f)) << c;
      ASSERT_EQ(float_to_e4m3(f) & 0x7F, 0x7F) << c;
      continue;
    }
    ASSERT_TRUE(std::isfinite(f)) << c;
    ASSERT_LE(std::fabs(f), 448.0f) << c;
    ASSERT_EQ(float_to_e4m3(f), q) << c;
  }
  EXPECT_EQ(nans, 2);  // 0x7F and 0xFF only: no infinities
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(float_to_e4m3(NAN), 0x7F);
  EXPECT_EQ(float_to_e4m3(-NAN), 0xFF);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // tie with 2^-9: even (zero)
  EXPECT_EQ(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // tie 1.5 * 2^-9 -> 2 * 2^-9
}

TEST(HalfTest, Fp8E4m3RoundsTiesToEven) {
  for (std::uint32_t c = 0; c < 0x7E; ++c) {
    for (std::uint32_t sign : {0u, 0x80u}) {
      const float a = e4m3_to_float(static_cast<std::uint8_t>(c | sign));
      const float b = e4m3_to_float(static_cast<std::uint8_t>((c + 1) | sign));
      const float mid = (a + b) / 2;  // exact
      const std::uint32_t even = (c & 1) ? c + 1 : c;
      ASSERT_EQ(float_to_e4m3(mid), even | sign) << c;
      ASSERT_EQ(float_to_e4m3(std::nextafter(mid, b)), (c + 1) | sign) << c;
      ASSERT_EQ(float_to_e4m3(std::nextafter(mid, a)), c | sign) << c;
    }
  }
}

// ---------------------------------------------------------------- quant.h

TEST(QuantTest, SymmetricWithinHalfAScale) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  const float scale = kernels::sym_scale(3.0f, 127.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng);
    const std::int32_t q = kernels::sym_quantize(x, scale, 127);
    ASSERT_GE(q, -127);
    ASSERT_LE(q, 127);
    ASSERT_LE(std::fabs(kernels::sym_dequantize(q, scale) - x), scale / 2 * (1 + 1e-5f)) << x;
  }
  EXPECT_EQ(kernels::sym_quantize(10.0f, scale, 127), 127);   // clamped
  EXPECT_EQ(kernels::sym_quantize(-10.0f, scale, 127), -127);
  EXPECT_EQ(kernels::sym_quantize(1.0f, 0.0f, 127), 0);       // all-zero block
  EXPECT_EQ(kernels::sym_quantize(2.5f, 1.0f, 127), 2);       // ties to even
  EXPECT_EQ(kernels::sym_quantize(3.5f, 1.0f, 127), 4);
}

TEST(QuantTest, AsymmetricWithinHalfAScaleAndPacks) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 5.0f);
  for (int bits : {2, 4}) {
    const float lo = -1.0f, scale = kernels::asym_scale(-1.0f, 5.0f, bits);
    std::vector<std::uint8_t> stream(kernels::packed_bytes(1001, bits), 0);
    std::vector<std::uint32_t> codes;
    for (int i = 0; i < 1001; ++i) {
      const float x = u(rng);
      const std::uint32_t q = kernels::asym_quantize(x, lo, scale, bits);
      ASSERT_LE(q, static_cast<std::uint32_t>(kernels::asym_levels(bits)));
      ASSERT_LE(std::fabs(kernels::asym_dequantize(q, lo, scale) - x), scale / 2 * (1 + 1e-5f));
      kernels::pack_code(stream.data(), static_cast<std::uint64_t>(i), q, bits);
      codes.push_back(q);
    }
    for (int i = 0; i < 1001; ++i) ASSERT_EQ(kernels::unpack_code(stream.data(), static_cast<std::uint64_t>(i), bits), codes[i]);
    EXPECT_EQ(kernels::asym_quantize(5.0f, lo, scale, bits), static_cast<std::uint32_t>(kernels::asym_levels(bits)));
    EXPECT_EQ(kernels::asym_quantize(-9.0f, lo, scale, bits), 0u);
  }
  EXPECT_EQ(kernels::packed_bytes(5, 2), 2u);
  EXPECT_EQ(kernels::packed_bytes(5, 4), 3u);
}

// ---------------------------------------------------------------- the reference KV

using namespace test;  // NOLINT: the shared helpers
constexpr std::uint64_t kHeaderBytes = internal::kHeaderBytes;

// Encodes the reference KV in `dtype`, decodes it; returns (input, decoded)
// as floats and the payload.
struct RoundTrip {
  std::vector<float> in, out;
  Bytes payload;
};
RoundTrip RunCodec(const Codec& codec, const std::vector<float>& kv, std::uint32_t dtype) {
  RoundTrip r;
  const std::vector<std::uint8_t> bytes = ToBytes(kv, dtype);
  r.in = ToFloats(bytes, dtype);
  Result<Bytes> p = codec.Encode(RefShape(dtype), bytes.data());
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (!p.ok()) return r;
  r.payload = std::move(p).value();
  std::vector<std::uint8_t> out(RefShape(dtype).bytes());
  const Status s = codec.Decode(RefShape(dtype), r.payload.data(), r.payload.size(), out.data());
  EXPECT_TRUE(s.ok()) << s.message();
  r.out = ToFloats(out, dtype);
  return r;
}

// What storing a float in `dtype` may add to an element's error: half an
// ulp (f16: relative 2^-11, absolute 2^-25 among subnormals; bf16: 2^-8).
float OutputRounding(std::uint32_t dtype, float y) {
  if (dtype == 1) return std::fmax(std::fabs(y) * 0x1p-11f, 0x1p-25f);
  if (dtype == 2) return std::fabs(y) * 0x1p-8f;
  return 0.0f;
}

// Calls f(index, layer, kv, token, head, dim) over the reference shape.
void ForEach(const std::function<void(std::uint64_t i, std::uint64_t l, std::uint64_t kv, std::uint64_t t,
                                      std::uint64_t h, std::uint64_t d)>& f) {
  std::uint64_t i = 0;
  for (std::uint64_t l = 0; l < kLayers; ++l)
    for (std::uint64_t kv = 0; kv < 2; ++kv)
      for (std::uint64_t t = 0; t < kTokens; ++t)
        for (std::uint64_t h = 0; h < kHeads; ++h)
          for (std::uint64_t d = 0; d < kDim; ++d) f(i++, l, kv, t, h, d);
}

TEST(CodecRawTest, BitExactForEveryDtype) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  auto codec = Make("raw");
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const std::vector<std::uint8_t> bytes = ToBytes(kv, dtype);
    Result<Bytes> p = codec->Encode(RefShape(dtype), bytes.data());
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->size(), kHeaderBytes + RefShape(dtype).bytes());
    std::vector<std::uint8_t> out(bytes.size());
    ASSERT_TRUE(codec->Decode(RefShape(dtype), p->data(), p->size(), out.data()).ok());
    EXPECT_EQ(out, bytes) << dtype;
  }
}

// fp8: per element |x - x'| <= 2^-4 |x| + 2^-10 s + 2^-20 absmax (+ the
// output dtype's rounding), s = absmax / 448 of the element's block: e4m3 has
// 3 mantissa bits (half an ulp is at most 2^-4 of the value) and subnormals
// in steps of 2^-9 (half a step: 2^-10 s); 2^-20 absmax covers the float
// division and product.
void CheckFp8(const std::string& spec, bool per_head) {
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  auto codec = Make(spec);
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const RoundTrip r = RunCodec(*codec, kv, dtype);
    ASSERT_EQ(r.out.size(), r.in.size());
    const std::uint64_t scales = std::uint64_t{kLayers} * 2 * (per_head ? kHeads : kTokens);
    EXPECT_EQ(r.payload.size(), kHeaderBytes + 4 * scales + RefShape(dtype).elements());
    auto block = [&](std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t h) {
      return per_head ? (l * 2 + v) * kHeads + h : (l * 2 + v) * kTokens + t;
    };
    std::vector<float> absmax(scales, 0.0f);
    ForEach([&](std::uint64_t i, std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t h, std::uint64_t) {
      absmax[block(l, v, t, h)] = std::fmax(absmax[block(l, v, t, h)], std::fabs(r.in[i]));
    });
    double worst = 0;
    ForEach([&](std::uint64_t i, std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t h, std::uint64_t) {
      const float am = absmax[block(l, v, t, h)], s = am / 448.0f;
      const float err = std::fabs(r.out[i] - r.in[i]);
      const float bound = 0x1p-4f * std::fabs(r.in[i]) + 0x1p-10f * s + 0x1p-20f * am + OutputRounding(dtype, r.out[i]);
      ASSERT_LE(err, bound) << spec << " dtype " << dtype << " element " << i << " x " << r.in[i];
      if (am > 0) worst = std::fmax(worst, err / am);
    });
    EXPECT_GT(worst, 0.0);  // lossy, really
  }
}

TEST(CodecFp8Test, PerTokenWithinBound) {
  KDN_REQUIRE_MODEL();
  CheckFp8("fp8", false);
  CheckFp8("fp8:scale=token", false);
}
TEST(CodecFp8Test, PerHeadWithinBound) {
  KDN_REQUIRE_MODEL();
  CheckFp8("fp8:scale=head", true);
}

// int8: per element |x - x'| <= s/2 + 2^-20 absmax (+ output rounding),
// s = absmax / 127 over the element's (layer, k|v, token).
TEST(CodecInt8Test, PerTokenWithinHalfAScale) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  auto codec = Make("int8");
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const RoundTrip r = RunCodec(*codec, kv, dtype);
    ASSERT_EQ(r.out.size(), r.in.size());
    const std::uint64_t scales = std::uint64_t{kLayers} * 2 * kTokens;
    EXPECT_EQ(r.payload.size(), kHeaderBytes + 4 * scales + RefShape(dtype).elements());
    std::vector<float> absmax(scales, 0.0f);
    ForEach([&](std::uint64_t i, std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t, std::uint64_t) {
      absmax[(l * 2 + v) * kTokens + t] = std::fmax(absmax[(l * 2 + v) * kTokens + t], std::fabs(r.in[i]));
    });
    ForEach([&](std::uint64_t i, std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t, std::uint64_t) {
      const float am = absmax[(l * 2 + v) * kTokens + t];
      const float bound = am / 127.0f / 2 + 0x1p-20f * am + OutputRounding(dtype, r.out[i]);
      ASSERT_LE(std::fabs(r.out[i] - r.in[i]), bound) << "dtype " << dtype << " element " << i;
    });
  }
}

// kivi2: per element |x - x'| <= s/2 + 2^-20 (|min| + |max|) (+ output
// rounding), s = (max - min) / (2^bits - 1) over the element's group: keys
// per (layer, head, dim) over groups of G tokens, values per (layer, token,
// head) over groups of min(G, head_dim) channels.
void CheckKivi(std::uint32_t bits, std::uint32_t group) {
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  auto codec = Make("kivi2:bits=" + std::to_string(bits) + ",group=" + std::to_string(group));
  const std::uint64_t kgroups = (kTokens + group - 1) / group, vg = std::min(group, kDim);
  const std::uint64_t vgroups = (kDim + vg - 1) / vg;
  const std::uint64_t nk = std::uint64_t{kLayers} * kHeads * kDim * kgroups;
  const std::uint64_t nv = std::uint64_t{kLayers} * kTokens * kHeads * vgroups;
  auto group_of = [&](std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t h, std::uint64_t d) {
    return v == 0 ? ((l * kHeads + h) * kDim + d) * kgroups + t / group
                  : nk + ((l * kTokens + t) * kHeads + h) * vgroups + d / vg;
  };
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const RoundTrip r = RunCodec(*codec, kv, dtype);
    ASSERT_EQ(r.out.size(), r.in.size());
    const std::uint64_t n = RefShape(dtype).elements();
    EXPECT_EQ(r.payload.size(), kHeaderBytes + 8 * (nk + nv) + (n * bits + 7) / 8) << bits << " " << group;
    std::vector<float> lo(nk + nv, INFINITY), hi(nk + nv, -INFINITY);
    ForEach([&](std::uint64_t i, std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t h, std::uint64_t d) {
      const std::uint64_t g = group_of(l, v, t, h, d);
      lo[g] = std::fmin(lo[g], r.in[i]);
      hi[g] = std::fmax(hi[g], r.in[i]);
    });
    ForEach([&](std::uint64_t i, std::uint64_t l, std::uint64_t v, std::uint64_t t, std::uint64_t h, std::uint64_t d) {
      const std::uint64_t g = group_of(l, v, t, h, d);
      const float s = (hi[g] - lo[g]) / static_cast<float>((1u << bits) - 1);
      const float bound = s / 2 + 0x1p-20f * (std::fabs(lo[g]) + std::fabs(hi[g])) + OutputRounding(dtype, r.out[i]);
      ASSERT_LE(std::fabs(r.out[i] - r.in[i]), bound)
          << "bits " << bits << " group " << group << " dtype " << dtype << " element " << i;
    });
  }
}

TEST(CodecKiviTest, TwoBitWithinHalfAScale) {
  KDN_REQUIRE_MODEL();
  for (std::uint32_t group : {32u, 16u, 5u, 64u, 1u}) CheckKivi(2, group);
}
TEST(CodecKiviTest, FourBitWithinHalfAScale) {
  KDN_REQUIRE_MODEL();
  for (std::uint32_t group : {32u, 7u}) CheckKivi(4, group);
}

// Sizes vs the same KV as fp16 (30720 bytes), every byte counted.
TEST(CodecSizeTest, RatiosVsFp16OnReferenceKv) {
  KDN_REQUIRE_MODEL();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  const std::vector<std::uint8_t> f16 = ToBytes(kv, 1);
  ASSERT_EQ(f16.size(), 30720u);
  struct Want {
    const char* spec;
    size_t bytes;
  };
  // E = 15360 elements. fp8/int8 per token: 40 + 4 * 480 + E; fp8 per head:
  // 40 + 4 * 40 + E; kivi2 (G 32): 320 key + 960 value groups of 8 bytes + E * bits / 8.
  for (const Want& w : {Want{"raw", 30760}, Want{"fp8", 17320}, Want{"fp8:scale=head", 15560}, Want{"int8", 17320},
                        Want{"kivi2", 14120}, Want{"kivi2:bits=4", 17960}, Want{"kivi2:group=48", 12840}}) {
    Result<Bytes> p = Make(w.spec)->Encode(RefShape(1), f16.data());
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->size(), w.bytes) << w.spec;
    std::printf("  %-16s %6zu bytes, %.3fx smaller than fp16\n", w.spec, p->size(), 30720.0 / p->size());
  }
}

// ---------------------------------------------------------------- specs

TEST(CodecSpecTest, ParsesAndPrints) {
  Result<Spec> s = ParseSpec("int8");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "int8");
  EXPECT_TRUE(s->params.empty());
  EXPECT_EQ(s->ToString(), "int8");

  s = ParseSpec("kivi2:group=32,bits=4");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "kivi2");
  EXPECT_EQ(s->params.at("group"), "32");
  EXPECT_EQ(s->params.at("bits"), "4");
  EXPECT_EQ(s->ToString(), "kivi2:bits=4,group=32");

  s = ParseSpec("kdn:balanced");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->params.at("preset"), "balanced");
  EXPECT_EQ(s->ToString(), "kdn:balanced");
  s = ParseSpec("kdn:hifi,bins=16");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ToString(), "kdn:hifi,bins=16");
  EXPECT_EQ(ParseSpec(s->ToString())->params, s->params);
}

TEST(CodecSpecTest, RejectsBadSyntax) {
  for (const char* bad : {"", ":", ":x", "int8:", "int8:a=", "int8:=3", "int8:a=1,", "int8:,a=1", "int8:a=1,a=2",
                          "int 8", "fp8:scale=token,,x", "kdn:a,b", "int8:a=b=c", "x:y:z", "in\x01t8"}) {
    Result<Spec> s = ParseSpec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_FALSE(s.status().message().empty());
  }
  EXPECT_NE(ParseSpec("").status().message().find("empty"), std::string::npos);
}

TEST(CodecSpecTest, MakeCodecChecksNamesAndParams) {
  struct Case {
    const char* spec;
    Code code;
    const char* mentions;
  };
  for (const Case& c : {Case{"zip", Code::kInvalidArgument, "zip"},
                        Case{"zstd:level=0", Code::kInvalidArgument, "level"},
                        Case{"zstd:level=20", Code::kInvalidArgument, "level"},
                        Case{"zstd:shuffle=2", Code::kInvalidArgument, "shuffle"},
                        Case{"zstd:fast", Code::kInvalidArgument, "preset"},
                        Case{"int8:foo=1", Code::kInvalidArgument, "foo"},
                        Case{"raw:fast", Code::kInvalidArgument, "preset"},
                        Case{"fp8:scale=block", Code::kInvalidArgument, "scale"},
                        Case{"fp8:bits=8", Code::kInvalidArgument, "bits"},
                        Case{"kivi2:bits=3", Code::kInvalidArgument, "bits"},
                        Case{"kivi2:bits=8", Code::kInvalidArgument, "bits"},
                        Case{"kivi2:group=0", Code::kInvalidArgument, "group"},
                        Case{"kivi2:group=x", Code::kInvalidArgument, "group"},
                        Case{"kivi2:group=99999999999", Code::kInvalidArgument, "group"},
                        Case{"kivi2:groups=4", Code::kInvalidArgument, "groups"},
                        Case{"cachegen:bins=1", Code::kInvalidArgument, "bins"},
                        Case{"kdn:fast", Code::kInvalidArgument, "fast"},
                        Case{"kdn:lanes=33", Code::kInvalidArgument, "lanes"},
                        Case{"kdn:step=0", Code::kInvalidArgument, "step"},
                        Case{"kdn:pw=1_x", Code::kInvalidArgument, "pw"},
                        Case{"kdn:bins=16", Code::kInvalidArgument, "bins"}}) {
    Result<Spec> spec = ParseSpec(c.spec);
    ASSERT_TRUE(spec.ok()) << c.spec;
    Result<std::unique_ptr<Codec>> codec = MakeCodec(*spec);
    ASSERT_FALSE(codec.ok()) << c.spec;
    EXPECT_EQ(codec.status().code(), c.code) << c.spec;
    EXPECT_NE(codec.status().message().find(c.mentions), std::string::npos) << codec.status().message();
  }
  EXPECT_EQ(Make("raw")->id(), CodecId::kRaw);
  EXPECT_EQ(Make("fp8")->id(), CodecId::kFp8);
  EXPECT_EQ(Make("fp8")->spec().ToString(), "fp8:scale=token");
  EXPECT_EQ(Make("int8")->id(), CodecId::kInt8);
  EXPECT_EQ(Make("kivi2")->id(), CodecId::kKivi2);
  EXPECT_EQ(Make("kivi2")->spec().ToString(), "kivi2:bits=2,group=32");
  EXPECT_EQ(Make("cachegen")->id(), CodecId::kCacheGen);
  EXPECT_EQ(Make("zstd")->id(), CodecId::kZstd);
  EXPECT_EQ(Make("zstd")->spec().ToString(), "zstd:level=3,shuffle=1");
  for (CodecId id : {CodecId::kRaw, CodecId::kFp8, CodecId::kInt8, CodecId::kKivi2, CodecId::kCacheGen,
                     CodecId::kZstd}) {
    Result<std::unique_ptr<Codec>> d = DecoderFor(id);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ((*d)->id(), id);
  }
  EXPECT_EQ(DecoderFor(static_cast<CodecId>(99)).status().code(), Code::kUnsupported);
}

// ---------------------------------------------------------------- rejection

const char* const kSpecs[] = {"raw",  "fp8",      "fp8:scale=head",             "int8",
                              "kivi2", "kivi2:bits=4,group=5", "kdn", "kdn:hifi",
                              "kdn:group=5,lanes=3,sink=2", "zstd", "zstd:level=1,shuffle=0"};

// A smooth synthetic chunk (so these tests run without the model files).
std::vector<std::uint8_t> Synthetic(const Shape& s) {
  std::vector<float> f(s.elements());
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + (i % 7));
  return ToBytes(f, s.dtype);
}

// Decodes with a buffer of exactly `size` bytes on the heap (so ASan sees
// any read past it) into an output of exactly shape.bytes().
Status DecodeCopy(const Codec& c, const Shape& shape, const std::uint8_t* data, size_t size) {
  std::vector<std::uint8_t> in(data, data + size), out(shape.bytes());
  return c.Decode(shape, in.data(), in.size(), out.data());
}

TEST(CodecRejectTest, TruncatedOversizedAndFlippedHeaders) {
  const Shape shape{2, 2, 8, 13, 1};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  for (const char* spec : kSpecs) {
    auto codec = Make(spec);
    Result<Bytes> p = codec->Encode(shape, kv.data());
    ASSERT_TRUE(p.ok());
    const Bytes& payload = *p;
    ASSERT_TRUE(DecodeCopy(*codec, shape, payload.data(), payload.size()).ok()) << spec;
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= kHeaderBytes + 64 && n < payload.size(); ++n) lengths.push_back(n);
    for (size_t n : {payload.size() / 2, payload.size() - 2, payload.size() - 1}) lengths.push_back(n);
    for (size_t n : lengths) {
      const Status s = DecodeCopy(*codec, shape, payload.data(), n);
      ASSERT_EQ(s.code(), Code::kCorrupt) << spec << " truncated to " << n;
      ASSERT_FALSE(s.message().empty());
    }
    EXPECT_EQ(codec->Decode(shape, nullptr, 0, nullptr).code(), Code::kCorrupt);
    Bytes longer = payload;
    longer.push_back(0);
    EXPECT_EQ(DecodeCopy(*codec, shape, longer.data(), longer.size()).code(), Code::kCorrupt) << spec;
    for (size_t i = 0; i < kHeaderBytes; ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes flipped = payload;
        flipped[i] ^= static_cast<std::uint8_t>(1u << bit);
        ASSERT_EQ(DecodeCopy(*codec, shape, flipped.data(), flipped.size()).code(), Code::kCorrupt)
            << spec << " byte " << i << " bit " << bit;
      }
    }
  }
}

TEST(CodecRejectTest, OtherShapeOrCodecIsCorrupt) {
  const Shape shape{2, 2, 8, 13, 1};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  std::vector<Shape> others;
  for (int i = 0; i < 6; ++i) others.push_back(shape);
  others[0].tokens = 12;
  others[1].layers = 1;
  others[2].dtype = 2;   // same byte count
  others[3].kv_heads = 4;
  others[3].head_dim = 4;  // same element count
  others[4].tokens = 26;
  others[4].layers = 1;  // same element count
  others[5].dtype = 0;
  for (const char* spec : kSpecs) {
    auto codec = Make(spec);
    Result<Bytes> p = codec->Encode(shape, kv.data());
    ASSERT_TRUE(p.ok());
    for (const Shape& other : others) {
      const Status s = DecodeCopy(*codec, other, p->data(), p->size());
      EXPECT_EQ(s.code(), Code::kCorrupt) << spec;
      EXPECT_NE(s.message().find("expected"), std::string::npos) << s.message();
    }
    for (const char* decoder : kSpecs) {
      auto d = Make(decoder);
      const Status s = DecodeCopy(*d, shape, p->data(), p->size());
      if (d->id() == codec->id()) {
        EXPECT_TRUE(s.ok()) << spec << " by " << decoder << ": " << s.message();  // parameters travel
      } else {
        EXPECT_EQ(s.code(), Code::kCorrupt) << spec << " by " << decoder;
        EXPECT_NE(s.message().find("codec id"), std::string::npos) << s.message();
      }
    }
  }
}

// Payloads are self-describing: DecoderFor(id) decodes what any setting
// of the codec wrote, to the same bytes the encoding codec decodes.
TEST(CodecRejectTest, DecoderForReadsParametersFromPayload) {
  const Shape shape{3, 2, 8, 21, 2};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  for (const char* spec : kSpecs) {
    auto codec = Make(spec);
    Result<Bytes> p = codec->Encode(shape, kv.data());
    ASSERT_TRUE(p.ok());
    Result<std::unique_ptr<Codec>> d = DecoderFor(codec->id());
    ASSERT_TRUE(d.ok());
    std::vector<std::uint8_t> a(shape.bytes()), b(shape.bytes());
    ASSERT_TRUE(codec->Decode(shape, p->data(), p->size(), a.data()).ok());
    ASSERT_TRUE((*d)->Decode(shape, p->data(), p->size(), b.data()).ok());
    EXPECT_EQ(a, b) << spec;
  }
}

TEST(CodecRejectTest, InvalidBodyValuesAreCorrupt) {
  const Shape shape{1, 2, 8, 4, 0};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  auto expect_corrupt = [&](const char* spec, size_t offset, std::vector<std::uint8_t> bytes) {
    auto codec = Make(spec);
    Bytes p = *codec->Encode(shape, kv.data());
    std::memcpy(p.data() + offset, bytes.data(), bytes.size());
    EXPECT_EQ(DecodeCopy(*codec, shape, p.data(), p.size()).code(), Code::kCorrupt) << spec << " at " << offset;
  };
  auto f32 = [](float v) {
    std::vector<std::uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
  };
  const size_t fp8_codes = kHeaderBytes + 4 * 2 * 4;
  expect_corrupt("fp8", fp8_codes + 5, {0x7F});    // a NaN code
  expect_corrupt("fp8", fp8_codes + 6, {0xFF});
  expect_corrupt("fp8", kHeaderBytes + 4, f32(-1.0f));
  expect_corrupt("fp8", kHeaderBytes, f32(NAN));
  expect_corrupt("fp8", kHeaderBytes, f32(1e37f));  // 448 * scale overflows
  expect_corrupt("int8", kHeaderBytes + 4 * 2 * 4 + 3, {0x80});  // -128
  expect_corrupt("int8", kHeaderBytes, f32(INFINITY));
  expect_corrupt("kivi2", kHeaderBytes, f32(INFINITY));       // a min
  expect_corrupt("kivi2", kHeaderBytes + 4, f32(-0.5f));      // a scale
  std::vector<std::uint8_t> group = f32(3e38f), scale = f32(2e38f);
  group.insert(group.end(), scale.begin(), scale.end());
  expect_corrupt("kivi2", kHeaderBytes + 8, group);  // min + 3 * scale overflows
}

TEST(CodecRejectTest, EncodeRejectsBadInput) {
  Shape shape{1, 1, 4, 2, 0};
  std::vector<float> kv(shape.elements(), 1.0f);
  kv[3] = NAN;
  for (const char* spec : {"fp8", "int8", "kivi2"}) {
    Result<Bytes> p = Make(spec)->Encode(shape, reinterpret_cast<const std::uint8_t*>(kv.data()));
    EXPECT_EQ(p.status().code(), Code::kInvalidArgument) << spec;
  }
  EXPECT_TRUE(Make("raw")->Encode(shape, reinterpret_cast<const std::uint8_t*>(kv.data())).ok());
  shape.dtype = 3;
  for (const char* spec : kSpecs) {
    EXPECT_EQ(Make(spec)->Encode(shape, nullptr).status().code(), Code::kInvalidArgument) << spec;
  }
  // Empty chunks are fine.
  const Shape empty{2, 2, 8, 0, 1};
  for (const char* spec : kSpecs) {
    auto codec = Make(spec);
    Result<Bytes> p = codec->Encode(empty, nullptr);
    ASSERT_TRUE(p.ok()) << spec;
    EXPECT_TRUE(DecodeCopy(*codec, empty, p->data(), p->size()).ok()) << spec;
  }
}

// Garbage never crashes a decoder: random buffers, random bodies behind a
// valid header, and valid payloads with random bytes changed all give a
// status; when one decodes, every element is finite.
TEST(CodecRejectTest, GarbageGivesAStatusNeverACrash) {
  std::mt19937 rng(12345);
  const Shape shape{2, 3, 8, 9, 1};
  const std::vector<std::uint8_t> kv = Synthetic(shape);
  auto all_finite = [&](const std::vector<std::uint8_t>& out) {
    for (float f : ToFloats(out, shape.dtype)) {
      if (!std::isfinite(f)) return false;
    }
    return true;
  };
  int ok = 0, corrupt = 0;
  for (const char* spec : kSpecs) {
    auto codec = Make(spec);
    const Bytes payload = *codec->Encode(shape, kv.data());
    std::vector<std::uint8_t> out(shape.bytes());
    // 1. Random buffers of random length.
    for (int i = 0; i < 2000; ++i) {
      std::vector<std::uint8_t> buf(rng() % (payload.size() * 2 + 1));
      for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
      if (i % 2 == 0 && buf.size() >= 4) std::memcpy(buf.data(), "KDNC", 4);
      const Status s = codec->Decode(shape, buf.data(), buf.size(), out.data());
      ASSERT_EQ(s.code(), Code::kCorrupt);
      ++corrupt;
    }
    // 2. A valid header (with the codec's own parameters) and a random body.
    for (int i = 0; i < 300; ++i) {
      Bytes buf = payload;
      for (size_t j = kHeaderBytes; j < buf.size(); ++j) buf[j] = static_cast<std::uint8_t>(rng());
      const Status s = codec->Decode(shape, buf.data(), buf.size(), out.data());
      ASSERT_TRUE(s.ok() || s.code() == Code::kCorrupt) << s.message();
      if (s.ok()) {
        // Lossless codecs return whatever bytes they were given.
        ASSERT_TRUE(!IsLossy(codec->id()) || all_finite(out)) << spec;
        ++ok;
      } else {
        ++corrupt;
      }
    }
    // 3. Valid payloads with a few random bytes changed.
    for (int i = 0; i < 2000; ++i) {
      Bytes buf = payload;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) buf[rng() % buf.size()] = static_cast<std::uint8_t>(rng());
      const Status s = DecodeCopy(*codec, shape, buf.data(), buf.size());
      ASSERT_TRUE(s.ok() || s.code() == Code::kCorrupt) << s.message();
      (s.ok() ? ok : corrupt)++;
    }
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(corrupt, 0);
}

}  // namespace
}  // namespace kdn::codec
