// SPDX-License-Identifier: Apache-2.0
// kdn's own codec (core/codec/kdn.cc) and its shared math
// (kernels/common/kdn_quant.h): error bounds per element on the reference
// model's KV, sinks, the entropy-coded stream paths (unrolled and general),
// presets and profiles, and rejection of inconsistent payloads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lab/codec/calibrate.h"
#include "lab/model/checkpoint.h"
#include "core/codec/codec.h"
#include "core/codec/payload.h"
#include "core/codec/rans.h"
#include "kernels/common/half.h"
#include "kernels/common/kdn_quant.h"
#include "codec_test_util.h"
#include "test_models.h"

namespace kdn::codec {
namespace {

using namespace test;  // NOLINT: the shared helpers
constexpr size_t kHeader = internal::kHeaderBytes;

// What one plane's header says (see the payload layout in kdn.cc).
struct PlaneInfo {
  int min_code = 0;
  std::vector<float> off, step;
  size_t sinks_at = 0;  // offset of the plane's sink halves
};

// Walks a payload's planes (the test's own reading of the documented format).
std::vector<PlaneInfo> ReadPlanes(const Bytes& p, const Shape& s, std::uint32_t sinks, std::uint32_t group) {
  const size_t C = size_t{s.kv_heads} * s.head_dim, S = std::min<size_t>(sinks, s.tokens);
  const size_t G = (C + group - 1) / group;
  std::vector<PlaneInfo> planes;
  size_t pos = kHeader;
  for (size_t plane = 0; plane < size_t{s.layers} * 2; ++plane) {
    PlaneInfo info;
    info.min_code = static_cast<std::int8_t>(p.at(pos));
    for (size_t c = 0; c < C; ++c) {
      info.off.push_back(kernels::half_to_float(static_cast<std::uint16_t>(p.at(pos + 1 + 2 * c) |
                                                                         p.at(pos + 2 + 2 * c) << 8)));
      info.step.push_back(kernels::half_to_float(
          static_cast<std::uint16_t>(p.at(pos + 1 + 2 * C + 2 * c) | p.at(pos + 2 + 2 * C + 2 * c) << 8)));
    }
    info.sinks_at = pos + 1 + 4 * C;
    pos = info.sinks_at + 2 * S * C;
    size_t used = 0;
    Result<rans::FreqTable> t = rans::ParseTable(std::span<const std::uint8_t>(p.data() + pos, p.size() - pos), &used);
    EXPECT_TRUE(t.ok());
    pos += used;
    size_t total = 0;
    for (size_t g = 0; g < G; ++g) {
      total += std::uint32_t{p.at(pos + 4 * g)} | std::uint32_t{p.at(pos + 4 * g + 1)} << 8 |
               std::uint32_t{p.at(pos + 4 * g + 2)} << 16 | std::uint32_t{p.at(pos + 4 * g + 3)} << 24;
    }
    pos += 4 * G + total;
    planes.push_back(info);
  }
  EXPECT_EQ(pos, p.size());
  return planes;
}

float OutputRounding(std::uint32_t dtype, float y) {
  if (dtype == 1) return std::fmax(std::fabs(y) * 0x1p-11f, 0x1p-25f);
  if (dtype == 2) return std::fabs(y) * 0x1p-8f;
  return 0.0f;
}

// Every quantized element within half its channel's step (plus float
// rounding); every sink element within half an ulp of a half float.
void CheckBounds(const std::string& spec, std::uint32_t sinks, std::uint32_t group, const Shape& s,
                 const std::vector<float>& kv, bool lossy = true) {
  auto codec = Make(spec);
  const std::vector<std::uint8_t> bytes = ToBytes(kv, s.dtype);
  const std::vector<float> in = ToFloats(bytes, s.dtype);
  Result<Bytes> p = codec->Encode(s, bytes.data());
  ASSERT_TRUE(p.ok()) << p.status().message();
  std::vector<std::uint8_t> out(s.bytes());
  const Status st = codec->Decode(s, p->data(), p->size(), out.data());
  ASSERT_TRUE(st.ok()) << spec << ": " << st.message();
  const std::vector<float> dec = ToFloats(out, s.dtype);
  const std::vector<PlaneInfo> planes = ReadPlanes(*p, s, sinks, group);
  const size_t C = size_t{s.kv_heads} * s.head_dim, T = s.tokens, S = std::min<size_t>(sinks, T);
  double worst = 0;
  for (size_t plane = 0; plane < planes.size(); ++plane) {
    for (size_t t = 0; t < T; ++t) {
      for (size_t c = 0; c < C; ++c) {
        const size_t i = (plane * T + t) * C + c;
        const float err = std::fabs(dec[i] - in[i]);
        if (t < S) {
          const float sink_bound = std::fmax(std::fabs(in[i]) * 0x1p-11f, 0x1p-25f) + OutputRounding(s.dtype, dec[i]);
          ASSERT_LE(err, sink_bound) << spec << " dtype " << s.dtype << " sink element " << i;
          continue;
        }
        const float step = planes[plane].step[c];
        ASSERT_GE(step, kernels::kKdnMinStep);
        const float bound = step / 2 * (1 + 0x1p-10f) +
                            0x1p-20f * (std::fabs(in[i]) + std::fabs(planes[plane].off[c])) +
                            OutputRounding(s.dtype, dec[i]);
        ASSERT_LE(err, bound) << spec << " dtype " << s.dtype << " element " << i << " plane " << plane;
        worst = std::fmax(worst, err);
      }
    }
  }
  if (lossy && S < T) {
    EXPECT_GT(worst, 0.0) << spec;  // lossy, really
  }
}

void CheckBounds(const std::string& spec, std::uint32_t sinks, std::uint32_t group) {
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  for (std::uint32_t dtype : {0u, 1u, 2u}) CheckBounds(spec, sinks, group, RefShape(dtype), kv);
}

TEST(KdnCodecTest, WithinHalfAStepOnReferenceKv) {
  KDN_REQUIRE_MODEL();
  CheckBounds("kdn", 4, 32);
  CheckBounds("kdn:hifi", 4, 32);
  CheckBounds("kdn:step=2,alpha=1,vmul=3", 4, 32);
  // The general stream path: groups not a multiple of 8, odd lane counts.
  CheckBounds("kdn:group=5,lanes=3,sink=0", 0, 5);
  CheckBounds("kdn:group=32,lanes=1,sink=7", 7, 32);
  CheckBounds("kdn:group=1,lanes=32,sink=1", 1, 1);
  // Every token a sink.
  CheckBounds("kdn:sink=100", 100, 32);
}

TEST(KdnCodecTest, DeterministicAndSmallerThanCacheGen) {
  KDN_REQUIRE_MODEL();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  auto kdn = Make("kdn");
  Result<Bytes> a = kdn->Encode(RefShape(1), bytes.data()), b = kdn->Encode(RefShape(1), bytes.data());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  Result<Bytes> cg = Make("cachegen")->Encode(RefShape(1), bytes.data());
  ASSERT_TRUE(cg.ok());
  // Only 48 tokens here (tables and offsets weigh more than at 448), still smaller.
  EXPECT_LT(a->size(), cg->size());
  // hifi is larger than balanced, and presets name themselves.
  Result<Bytes> hifi = Make("kdn:hifi")->Encode(RefShape(1), bytes.data());
  ASSERT_TRUE(hifi.ok());
  EXPECT_GT(hifi->size(), a->size());
  EXPECT_EQ(kdn->spec().ToString(), "kdn:balanced");
  EXPECT_EQ(Make("kdn:hifi,step=0.2")->spec().ToString(), "kdn:hifi,step=0.2");
  // The decoder takes every parameter from the payload.
  Result<std::unique_ptr<Codec>> dec = DecoderFor(CodecId::kKdn);
  ASSERT_TRUE(dec.ok());
  std::vector<std::uint8_t> x(RefShape(1).bytes()), y(RefShape(1).bytes());
  ASSERT_TRUE(Make("kdn:group=5,lanes=3,sink=9")->Decode(RefShape(1), a->data(), a->size(), x.data()).ok());
  auto odd = Make("kdn:group=5,lanes=3,sink=9");
  Result<Bytes> p = odd->Encode(RefShape(1), bytes.data());
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*dec)->Decode(RefShape(1), p->data(), p->size(), x.data()).ok());
  ASSERT_TRUE(odd->Decode(RefShape(1), p->data(), p->size(), y.data()).ok());
  EXPECT_EQ(x, y);
}

// Heavy tails and a fine step use the whole code range (up to 255 symbols);
// a single-symbol plane owns every slot of its model.
TEST(KdnCodecTest, WideAlphabetsAndOddShapes) {
  std::mt19937 rng(7);
  std::cauchy_distribution<float> heavy(0.0f, 0.3f);
  const Shape constant{1, 2, 8, 40, 1};
  CheckBounds("kdn:sink=0", 0, 32, constant, std::vector<float>(constant.elements(), 0.75f), /*lossy=*/false);
  for (const Shape& s : {Shape{2, 3, 7, 300, 0}, Shape{1, 1, 1, 1, 1}, Shape{3, 2, 8, 9, 2}, Shape{1, 5, 16, 64, 1}}) {
    std::vector<float> f(s.elements());
    for (float& v : f) v = std::clamp(heavy(rng), -50.0f, 50.0f);
    const bool lossy = s.elements() > 2;  // a single value per plane is its own offset
    CheckBounds("kdn:step=0.01", 4, 32, s, f, lossy);
    CheckBounds("kdn", 4, 32, s, f, lossy);
    CheckBounds("kdn:sink=0,lanes=8,group=8", 0, 8, s, f, lossy);
  }
}

TEST(KdnCodecTest, EncodeRejectsWhatItCannotCarry) {
  const Shape s{2, 1, 8, 6, 0};
  std::vector<float> f(s.elements(), 1.0f);
  auto codec = Make("kdn:pw=1_1_1");
  EXPECT_EQ(codec->Encode(s, reinterpret_cast<const std::uint8_t*>(f.data())).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Make("kdn:pw=1_2_1_0.5")->Encode(s, reinterpret_cast<const std::uint8_t*>(f.data())).ok());
  f[5] = 1e30f;  // a spread beyond half-float steps
  EXPECT_EQ(Make("kdn")->Encode(s, reinterpret_cast<const std::uint8_t*>(f.data())).status().code(),
            Code::kInvalidArgument);
  f[5] = 1e5f;  // fine as a quantized value, not as a sink half
  EXPECT_TRUE(Make("kdn:sink=0")->Encode(s, reinterpret_cast<const std::uint8_t*>(f.data())).ok());
  EXPECT_EQ(Make("kdn:sink=6")->Encode(s, reinterpret_cast<const std::uint8_t*>(f.data())).status().code(),
            Code::kInvalidArgument);
  // Found by the fuzzer: f16 KV near the largest half either round-trips or
  // is refused at encode; what Encode writes, Decode always reads.
  const Shape h{1, 1, 8, 20, 1};
  for (float big : {65000.0f, 65504.0f, -65504.0f, 60000.0f}) {
    std::vector<float> g(h.elements());
    for (size_t i = 0; i < g.size(); ++i) g[i] = i % 3 == 0 ? big : big * 0.25f * static_cast<float>(i % 5);
    const std::vector<std::uint8_t> bytes = ToBytes(g, 1);
    Result<Bytes> p = Make("kdn:sink=0")->Encode(h, bytes.data());
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), Code::kInvalidArgument) << big;
      continue;
    }
    std::vector<std::uint8_t> out(h.bytes());
    EXPECT_TRUE(Make("kdn")->Decode(h, p->data(), p->size(), out.data()).ok()) << big;
  }
  // Found by the fuzzer: planes without channels or tokens.
  for (const Shape& empty : {Shape{2, 0, 8, 5, 0}, Shape{2, 3, 0, 5, 1}, Shape{1, 2, 8, 0, 0}}) {
    Result<Bytes> p = Make("kdn")->Encode(empty, nullptr);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_TRUE(Make("kdn")->Decode(empty, p->data(), p->size(), nullptr).ok());
  }
}

// Targeted corruptions of each part of a plane are kCorrupt.
TEST(KdnCodecTest, InconsistentPayloadsAreCorrupt) {
  const Shape s{2, 2, 8, 20, 1};
  std::vector<float> f(s.elements());
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + (i % 7));
  const std::vector<std::uint8_t> bytes = ToBytes(f, 1);
  auto codec = Make("kdn");
  const Bytes good = *codec->Encode(s, bytes.data());
  std::vector<std::uint8_t> out(s.bytes());
  ASSERT_TRUE(codec->Decode(s, good.data(), good.size(), out.data()).ok());
  auto expect_corrupt = [&](const Bytes& bad, const char* what) {
    std::vector<std::uint8_t> copy(bad);
    const Status st = codec->Decode(s, copy.data(), copy.size(), out.data());
    EXPECT_EQ(st.code(), Code::kCorrupt) << what << ": " << st.message();
  };
  const size_t C = 16;
  Bytes b = good;
  b[kHeader] = 0x80;  // min code -128
  expect_corrupt(b, "min code");
  b = good;
  b[kHeader + 1 + 2 * C + 1] = 0x7C;  // a step's high byte: inf
  expect_corrupt(b, "inf step");
  b = good;
  b[kHeader + 1 + 2 * C + 1] |= 0x80;  // a negative step
  expect_corrupt(b, "negative step");
  b = good;
  b[kHeader + 1 + 1] = 0x7E;  // an offset NaN
  expect_corrupt(b, "nan offset");
  b = good;
  b[kHeader + 1 + 4 * C + 1] = 0x7C;  // a sink: inf
  expect_corrupt(b, "inf sink");
  b = good;
  b.push_back(0);
  expect_corrupt(b, "trailing byte");
  for (size_t cut = kHeader; cut < good.size(); cut += 7) {
    expect_corrupt(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)), "truncated");
  }
  // Bad header parameters (lanes 0, lanes 33, group 0) are rejected.
  for (std::uint32_t param1 : {0u | 0u << 16, 32u | 0u << 16, 32u | 33u << 16, 0u | 8u << 16}) {
    b = good;
    internal::WriteHeader(internal::Header{CodecId::kKdn, s, 4, param1}, b.data());
    expect_corrupt(b, "header parameters");
  }
  // A stream of another plane's length: the lengths no longer add up.
  const std::vector<PlaneInfo> planes = ReadPlanes(good, s, 4, 32);
  EXPECT_EQ(planes.size(), 4u);
}

TEST(KdnMathTest, ReciprocalDivisionIsExact) {
  std::mt19937 rng(3);
  for (std::uint32_t f = 1; f <= (1u << kernels::kKdnScaleBits); ++f) {
    const std::uint64_t r = kernels::kdn_rcp(f);
    for (std::uint32_t x : {0u, 1u, f - 1, f, f + 1, 0xFFFFFFFFu, 0xFFFFFFFEu, 1u << 31, (1u << 31) - 1}) {
      ASSERT_EQ(kernels::kdn_div(x, r), x / f) << x << " / " << f;
    }
    for (int i = 0; i < 64; ++i) {
      const std::uint32_t x = static_cast<std::uint32_t>(rng());
      ASSERT_EQ(kernels::kdn_div(x, r), x / f) << x << " / " << f;
    }
  }
}

TEST(KdnMathTest, StepsRoundUpAndQuantizationStaysInRange) {
  for (float s : {6.103515625e-05f, 0.001f, 0.0123f, 0.5f, 1.0f / 3, 1000.7f, 65504.0f}) {
    const float h = kernels::half_to_float(kernels::kdn_step_to_half(s));
    EXPECT_GE(h, s);
    EXPECT_LE(h, s * (1 + 0x1p-10f));
  }
  EXPECT_EQ(kernels::kdn_quantize(1e9f, 0.0f, 1.0f), kernels::kKdnMaxCode);
  EXPECT_EQ(kernels::kdn_quantize(-1e9f, 0.0f, 1.0f), -kernels::kKdnMaxCode);
  EXPECT_EQ(kernels::kdn_quantize(5.0f, 1.0f, 0.0f), 0);
  EXPECT_EQ(kernels::kdn_dequantize(-3, 1.0f, 0.25f), 0.25f);
}

// A profile names one spec per preset; the codec reads it, and parameters
// given in the spec override it.
TEST(KdnProfileTest, PresetsComeFromAProfile) {
  const std::string path = ::testing::TempDir() + "/kdn_profile.txt";
  {
    std::ofstream f(path);
    f << "# a comment\nbalanced kdn:step=0.9,pw=1_2\nhifi kdn:step=0.05\n";
  }
  const Shape s{1, 1, 8, 16, 1};
  std::vector<float> f(s.elements());
  for (size_t i = 0; i < f.size(); ++i) f[i] = std::cos(0.3f * static_cast<float>(i));
  const std::vector<std::uint8_t> bytes = ToBytes(f, 1);
  auto size_of = [&](const std::string& spec) { return Make(spec)->Encode(s, bytes.data())->size(); };
  EXPECT_EQ(size_of("kdn:balanced,profile=" + path), size_of("kdn:step=0.9,pw=1_2"));
  EXPECT_EQ(size_of("kdn:hifi,profile=" + path), size_of("kdn:step=0.05"));
  EXPECT_EQ(size_of("kdn:hifi,profile=" + path + ",step=0.9,pw=1_2"), size_of("kdn:step=0.9,pw=1_2"));
  Result<Spec> spec = ParseSpec("kdn:balanced,profile=/nonexistent/p.txt");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(MakeCodec(*spec).status().code(), Code::kInvalidArgument);
  {
    std::ofstream bad(path);
    bad << "hifi kdn:step=0.05\n";
  }
  spec = ParseSpec("kdn:balanced,profile=" + path);
  EXPECT_EQ(MakeCodec(*spec).status().code(), Code::kNotFound);
  {
    std::ofstream bad(path);
    bad << "balanced kdn:preset=hifi\n";
  }
  EXPECT_EQ(MakeCodec(*spec).status().code(), Code::kInvalidArgument);
  {
    std::ofstream bad(path);
    bad << "balanced int8\n";
  }
  EXPECT_EQ(MakeCodec(*spec).status().code(), Code::kInvalidArgument);
  std::remove(path.c_str());
}

// Calibration on the reference model, small: the plane weights are measured
// (keys and values differ), and each preset meets its target on the text.
TEST(KdnCalibrateTest, MeasuresPlanesAndFitsPresets) {
  KDN_REQUIRE_MODEL();
  Result<model::Checkpoint> w = model::Checkpoint::Load(kdn::testing::ModelPath());
  ASSERT_TRUE(w.ok()) << w.status().message();
  std::vector<int> tokens;
  for (int rep = 0; rep < 4; ++rep) {
    tokens.push_back(1);
    tokens.insert(tokens.end(), kdn::testing::kReferenceIds.begin(), kdn::testing::kReferenceIds.end());
  }
  CalibrateOptions o;
  o.eval.context = 48;
  o.eval.continue_tokens = 8;
  o.max_contexts = 3;
  Result<Calibration> c = Calibrate(*w, tokens, o);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->contexts, 3);
  ASSERT_EQ(c->plane_weight.size(), 10u);
  double log_sum = 0;
  for (double pw : c->plane_weight) {
    EXPECT_GE(pw, 1.0 / 20);
    EXPECT_LE(pw, 20.0);
    log_sum += std::log(pw);
  }
  EXPECT_NEAR(log_sum / 10, 0.0, 0.5);  // geometric mean about 1 (before clamping: exactly)
  ASSERT_EQ(c->presets.size(), 2u);
  for (const PresetFit& f : c->presets) {
    EXPECT_LE(f.result.kl_mean, f.target_kl) << f.name;
    EXPECT_GT(f.step, 0.0);
    EXPECT_GT(f.result.ratio_vs_fp16, 1.0);
  }
  EXPECT_LT(c->presets[1].step, c->presets[0].step);  // hifi finer than balanced
  // The profile reads back into the same specs.
  const std::string path = ::testing::TempDir() + "/kdn_calibrated.txt";
  {
    std::ofstream f(path);
    f << ProfileText(*c, o, "test");
  }
  Result<std::string> line = ReadProfile(path, "hifi");
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(*line, PresetSpec(*c, c->presets[1], o));
  EXPECT_TRUE(MakeCodec(*ParseSpec("kdn:hifi,profile=" + path)).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kdn::codec
