// SPDX-License-Identifier: Apache-2.0
// The transform codec (core/codec/tc.cc), its profile and its calibration,
// on the reference model's real KV.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>

#include "core/codec/device.h"
#include "core/codec/tc_cpu.h"
#include "lab/codec/tc_calibrate.h"
#include "core/codec/tc_profile.h"
#include "codec_test_util.h"
#include "kernels/common/tc_math.h"
#include "core/keys/hash.h"
#include "lab/model/checkpoint.h"
#include "core/store/chunk_codec.h"
#include "test_gpu.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/tc.cuh"
#endif

namespace kdn::codec {
namespace {

using test::kDim;
using test::kHeads;
using test::kLayers;
using test::kTokens;
using test::Make;
using test::ReferenceKv;
using test::ToBytes;
using test::ToFloats;

constexpr std::uint32_t kC = kHeads * kDim;

// The reference tokens, four times, BOS first: 4 contexts of 48.
std::vector<int> CalibrationTokens() {
  std::vector<int> tokens;
  for (int rep = 0; rep < 4; ++rep) {
    tokens.push_back(1);
    tokens.insert(tokens.end(), kdn::testing::kReferenceIds.begin(), kdn::testing::kReferenceIds.end());
  }
  return tokens;
}

std::array<std::uint8_t, 32> Fingerprint(std::uint8_t fill) {
  std::array<std::uint8_t, 32> f;
  f.fill(fill);
  return f;
}

// A profile fitted to the reference model (bases and tables; no presets),
// written to a file once per test binary.
struct Fitted {
  TcCalibration cal;
  std::string path;
  std::vector<std::uint8_t> bytes;
};
const Fitted* Fit() {
  static const Fitted* fitted = [] {
    Result<model::Checkpoint> w = model::Checkpoint::Load(kdn::testing::ModelPath());
    if (!w.ok()) return static_cast<Fitted*>(nullptr);
    TcCalibrateOptions o;
    o.eval.context = 48;
    o.fit_presets = false;
    o.rope.head_dim = kDim;
    o.fingerprints = {Fingerprint(7)};
    Result<TcCalibration> cal = CalibrateTransform(*w, CalibrationTokens(), o);
    if (!cal.ok()) {
      ADD_FAILURE() << cal.status().message();
      return static_cast<Fitted*>(nullptr);
    }
    // A file of this process's own: ctest runs each case in its own process,
    // two at a time, and one writing the file while another read it failed.
    auto* f = new Fitted{std::move(cal).value(),
                         ::testing::TempDir() + "/kdn_tc_test_" + std::to_string(::getpid()) + ".kdntc", {}};
    Result<std::vector<std::uint8_t>> bytes = SerializeTcProfile(&f->cal.profile);
    if (!bytes.ok()) return static_cast<Fitted*>(nullptr);
    f->bytes = *bytes;
    std::ofstream out(f->path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(f->bytes.data()), static_cast<std::streamsize>(f->bytes.size()));
    struct Remover {
      std::string path;
      ~Remover() { std::remove(path.c_str()); }
    };
    static const Remover remover{f->path};  // at exit
    return out ? f : nullptr;
  }();
  return fitted;
}

#define KDN_REQUIRE_PROFILE()                 \
  KDN_REQUIRE_MODEL();                        \
  const Fitted* fitted = Fit();               \
  ASSERT_NE(fitted, nullptr);                 \
  [[maybe_unused]] const TcProfile& profile = fitted->cal.profile

// Each plane's quantization steps, read from a payload (layout in tc.cc;
// sinks S x C halves per plane).
std::vector<std::vector<float>> PayloadSteps(const Bytes& p, std::uint32_t sinks) {
  std::vector<std::vector<float>> out;
  size_t at = internal::kHeaderBytes + 16;
  for (std::uint32_t plane = 0; plane < kLayers * 2; ++plane) {
    float delta;
    std::memcpy(&delta, &p[at], 4);
    at += 4 + 2 * kC;
    std::vector<float> steps(kC);
    for (std::uint32_t i = 0; i < kC; ++i) steps[i] = std::ldexp(delta, p[at + 2 * i + 1]);
    at += 2 * kC + 2 * size_t{sinks} * kC;
    std::uint32_t param1;
    std::memcpy(&param1, &p[32], 4);
    const std::uint32_t groups = (kC + (param1 >> 16) - 1) / (param1 >> 16);
    size_t streams = 0;
    for (std::uint32_t g = 0; g < groups; ++g) {
      std::uint32_t len;
      std::memcpy(&len, &p[at + 4 * g], 4);
      streams += len;
    }
    at += 4 * groups + streams;
    out.push_back(steps);
  }
  EXPECT_EQ(at, p.size());
  return out;
}

// Every token's error (L2 over its channels) is at most half the steps'
// norm (the basis is orthonormal and RoPE a rotation), plus the output's
// rounding to the dtype.
void ExpectWithinSteps(const std::vector<float>& kv, const std::vector<float>& got, const Bytes& payload,
                       std::uint32_t dtype, std::uint32_t sinks) {
  const auto steps = PayloadSteps(payload, sinks);
  for (std::uint32_t plane = 0; plane < kLayers * 2; ++plane) {
    double bound2 = 0;
    for (float s : steps[plane]) bound2 += 0.25 * double(s) * s;
    for (std::uint32_t t = 0; t < kTokens; ++t) {
      double err2 = 0, norm2 = 0;
      for (std::uint32_t c = 0; c < kC; ++c) {
        const size_t i = (size_t{plane} * kTokens + t) * kC + c;
        err2 += (double(kv[i]) - got[i]) * (double(kv[i]) - got[i]);
        norm2 += double(kv[i]) * kv[i];
      }
      const double rounding = (dtype == 0 ? 1e-6 : 1.0 / 1024) * std::sqrt(norm2) + 1e-5;
      ASSERT_LE(std::sqrt(err2), std::sqrt(bound2) * 1.0001 + rounding) << "plane " << plane << " token " << t;
    }
  }
}

TEST(TcProfileTest, RoundTripsAndDetectsDamage) {
  KDN_REQUIRE_PROFILE();
  Result<std::shared_ptr<const TcProfile>> back = ParseTcProfile(fitted->bytes);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ((*back)->id, profile.id);
  EXPECT_NE(profile.id, 0u);
  EXPECT_EQ((*back)->layers, kLayers);
  EXPECT_EQ((*back)->channels(), kC);
  EXPECT_EQ((*back)->planes[3].basis, profile.planes[3].basis);
  EXPECT_EQ((*back)->tables.size(), profile.tables.size());
  EXPECT_TRUE((*back)->Fits(Fingerprint(7).data()));
  EXPECT_FALSE((*back)->Fits(Fingerprint(8).data()));
  // Any damaged byte, or a missing one, is caught by the digest.
  for (size_t at : {size_t{0}, size_t{9}, fitted->bytes.size() / 2, fitted->bytes.size() - 1}) {
    std::vector<std::uint8_t> bad = fitted->bytes;
    bad[at] ^= 0x10;
    Result<std::shared_ptr<const TcProfile>> r = ParseTcProfile(bad);
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << "byte " << at;
  }
  std::vector<std::uint8_t> cut(fitted->bytes.begin(), fitted->bytes.end() - 1);
  EXPECT_EQ(ParseTcProfile(cut).status().code(), Code::kCorrupt);
  EXPECT_EQ(ParseTcProfile({}).status().code(), Code::kCorrupt);
  EXPECT_EQ(LoadTcProfile(::testing::TempDir() + "/no-such.kdntc").status().code(), Code::kInvalidArgument);
}

// A profile's bytes with one field changed and the digest made right again:
// the parser's own checks, behind the digest.
std::vector<std::uint8_t> Redigest(std::vector<std::uint8_t> bytes) {
  const keys::Digest d = keys::Hasher().Bytes(bytes.data(), bytes.size() - 32).Finish();
  std::memcpy(bytes.data() + bytes.size() - 32, d.data(), 32);
  return bytes;
}

TEST(TcProfileTest, ParserChecksFieldsBehindTheDigest) {
  KDN_REQUIRE_PROFILE();
  ASSERT_TRUE(ParseTcProfile(Redigest(fitted->bytes)).ok());  // the digest is a plain SHA-256
  // Header: magic, version, layers, kv_heads, head_dim, rotary_dim, style.
  for (size_t at : {size_t{0}, size_t{8}, size_t{12}, size_t{16}, size_t{20}, size_t{28}}) {
    std::vector<std::uint8_t> bad = fitted->bytes;
    bad[at + 1] ^= 0x7F;
    EXPECT_EQ(ParseTcProfile(Redigest(bad)).status().code(), Code::kCorrupt) << "byte " << at + 1;
  }
  // A table whose frequencies no longer sum to 4096: the last table's last
  // frequency (just before the digest).
  std::vector<std::uint8_t> bad = fitted->bytes;
  bad[bad.size() - 33] ^= 0x01;
  const Status st = ParseTcProfile(Redigest(bad)).status();
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_NE(st.message().find("table"), std::string::npos) << st.message();
  // A trailing byte.
  std::vector<std::uint8_t> longer = fitted->bytes;
  longer.insert(longer.end() - 32, 0);
  EXPECT_EQ(ParseTcProfile(Redigest(longer)).status().code(), Code::kCorrupt);
  // Profiles the encoder could not use are not written: no table up to 127.
  TcProfile narrow = profile;
  std::erase_if(narrow.tables, [](const TcTable& t) { return t.range == 127; });
  EXPECT_EQ(SerializeTcProfile(&narrow).status().code(), Code::kInvalidArgument);
}

TEST(TcProfileTest, RegistryRefusesAnIdCollision) {
  KDN_REQUIRE_PROFILE();
  Result<std::shared_ptr<const TcProfile>> loaded = LoadTcProfile(fitted->path);
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(RegisterTcProfile(*loaded).ok());  // the same profile again: fine
  auto other = std::make_shared<TcProfile>(**loaded);
  other->digest[31] ^= 1;  // same id, other content
  EXPECT_EQ(RegisterTcProfile(other).code(), Code::kInvalidArgument);
  EXPECT_EQ(FindTcProfile((*loaded)->id)->digest, (*loaded)->digest);
}

TEST(TcCalibrateTest, BasesAreOrthonormalAndOrderedAndTablesAreModels) {
  KDN_REQUIRE_PROFILE();
  EXPECT_EQ(fitted->cal.contexts, 4);
  ASSERT_EQ(profile.planes.size(), size_t{kLayers} * 2);
  for (const TcPlane& pl : profile.planes) {
    for (std::uint32_t i = 0; i < kC; ++i) {
      for (std::uint32_t j = 0; j < kC; ++j) {
        double dot = 0;
        for (std::uint32_t c = 0; c < kC; ++c) dot += double(pl.basis[c * kC + i]) * pl.basis[c * kC + j];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
      }
      if (i > 0) {
        EXPECT_GE(pl.var[i - 1], pl.var[i]);
      }
    }
    EXPECT_GT(pl.sigma, 0);
  }
  // Keys with RoPE undone concentrate their energy: the top quarter of the
  // components hold most of it in every layer (measured: 86-91% on the
  // tuning text; here, on 4 short contexts, at least 60%).
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    const std::vector<double>& s = fitted->cal.spectra[l * 2];
    double top = 0, all = 0;
    for (std::uint32_t i = 0; i < kC; ++i) (i < kC / 4 ? top : all) += s[i];
    all += top;
    EXPECT_GT(top / all, 0.6) << "layer " << l;
  }
  for (const TcTable& t : profile.tables) {
    ASSERT_EQ(t.freq.size(), 2 * size_t{t.range} + 1);
    std::uint32_t sum = 0;
    for (std::uint16_t f : t.freq) sum += f;
    EXPECT_EQ(sum, 4096u);
    EXPECT_EQ(t.slots.size(), 4096u);
  }
  // The family is deterministic (it is stored in every profile all the same).
  const std::vector<TcTable> again = TcTableFamily();
  ASSERT_EQ(again.size(), profile.tables.size());
  for (size_t k = 0; k < again.size(); ++k) EXPECT_EQ(again[k].freq, profile.tables[k].freq) << k;
}

TEST(TcCodecTest, ReconstructsReferenceKvWithinItsSteps) {
  KDN_REQUIRE_PROFILE();
  const std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    for (const char* params :
         {"step=0.05", "step=0.4", "step=0.7,vmul=4", "step=0.3,sink=4,lanes=3", "step=0.3,group=8", "step=0.2,group=5,lanes=1"}) {
      SCOPED_TRACE(std::string(params) + " dtype " + std::to_string(dtype));
      auto codec = Make("tc:profile=" + fitted->path + "," + params);
      EXPECT_EQ(codec->id(), CodecId::kTc);
      const std::vector<std::uint8_t> bytes = ToBytes(kv, dtype);
      const std::vector<float> held = ToFloats(bytes, dtype);
      Result<Bytes> p = codec->Encode(test::RefShape(dtype), bytes.data());
      ASSERT_TRUE(p.ok()) << p.status().message();
      // Deterministic.
      EXPECT_EQ(*codec->Encode(test::RefShape(dtype), bytes.data()), *p);
      std::vector<std::uint8_t> out(bytes.size());
      // Any tc decoder finds the profile (loaded by the spec above).
      auto decoder = DecoderFor(CodecId::kTc);
      ASSERT_TRUE(decoder.ok());
      ASSERT_TRUE((*decoder)->Decode(test::RefShape(dtype), p->data(), p->size(), out.data()).ok());
      const std::uint32_t sinks = std::strstr(params, "sink=4") ? 4 : 0;
      ExpectWithinSteps(held, ToFloats(out, dtype), *p, dtype, sinks);
      if (sinks == 4) {
        // Sinks are the stored halves exactly (f16 input: bit for bit).
        for (std::uint32_t plane = 0; plane < kLayers * 2 && dtype == 1; ++plane) {
          for (std::uint32_t i = 0; i < 4 * kC; ++i) {
            const size_t at = size_t{plane} * kTokens * kC + i;
            ASSERT_EQ(out[2 * at], bytes[2 * at]);
            ASSERT_EQ(out[2 * at + 1], bytes[2 * at + 1]);
          }
        }
      }
    }
  }
  // Coarser steps, fewer bytes.
  const std::vector<std::uint8_t> f16 = ToBytes(kv, 1);
  const size_t fine = Make("tc:profile=" + fitted->path + ",step=0.1")->Encode(test::RefShape(1), f16.data())->size();
  const size_t coarse = Make("tc:profile=" + fitted->path + ",step=0.8")->Encode(test::RefShape(1), f16.data())->size();
  EXPECT_LT(coarse, fine);
}

// A chunk of zeros (padding) decodes in every dtype: its keys, rotated again
// by a negative cosine, come out as -0.0, which the decoder once took for a
// value out of the dtype's range (fuzz/corpus/kdn_codec_fuzz/tc-negative-zero-keys).
TEST(TcCodecTest, ZerosRoundTripInEveryDtype) {
  KDN_REQUIRE_PROFILE();
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    SCOPED_TRACE("dtype " + std::to_string(dtype));
    const std::vector<std::uint8_t> zeros(test::RefShape(dtype).bytes(), 0);
    auto codec = Make("tc:profile=" + fitted->path + ",step=0.3");
    Result<Bytes> p = codec->Encode(test::RefShape(dtype), zeros.data());
    ASSERT_TRUE(p.ok()) << p.status().message();
    std::vector<std::uint8_t> out(zeros.size(), 0xFF);
    ASSERT_TRUE(codec->Decode(test::RefShape(dtype), p->data(), p->size(), out.data()).ok());
    for (float v : ToFloats(out, dtype)) ASSERT_EQ(v, 0.0f);
  }
}

// Keys are un-rotated at the chunk's own positions: the same KV moved to
// position 1000 (keys rotated by 1000 positions) codes back within the same
// bound, and its payload records the position.
TEST(TcCodecTest, UndoesRopeAtTheChunksPositions) {
  KDN_REQUIRE_PROFILE();
  std::vector<float> kv = ReferenceKv();
  ASSERT_FALSE(kv.empty());
  const std::int64_t first = 1000;
  // Rotate every key from position t to first + t.
  const int pairs = kernels::rope_pairs(profile.rope);
  std::vector<double> cs(size_t(pairs) * 2);
  for (int j = 0; j < pairs; ++j) {
    kernels::rope_delta_cos_sin(first, kernels::rope_spec_inv_freq(profile.rope, j), cs[2 * j], cs[2 * j + 1]);
  }
  for (std::uint32_t l = 0; l < kLayers; ++l) {
    for (std::uint32_t t = 0; t < kTokens; ++t) {
      kernels::tc_rotate_token(&kv[((size_t{l} * 2) * kTokens + t) * kC], kHeads, profile.rope, cs.data(), 1.0);
    }
  }
  const std::vector<std::uint8_t> bytes = ToBytes(kv, 0);
  auto codec = Make("tc:profile=" + fitted->path + ",step=0.3");
  ChunkInfo info;
  info.first_position = first;
  Result<Bytes> at = codec->EncodeWith(test::RefShape(0), bytes.data(), info);
  Result<Bytes> at0 = codec->Encode(test::RefShape(0), bytes.data());
  ASSERT_TRUE(at.ok() && at0.ok());
  std::int64_t recorded;
  std::memcpy(&recorded, at->data() + internal::kHeaderBytes + 8, 8);
  EXPECT_EQ(recorded, first);
  // Undoing RoPE at the right positions gives the model's pre-RoPE keys,
  // which the basis fits: fewer bytes than at the wrong positions.
  EXPECT_LT(at->size(), at0->size());
  std::vector<std::uint8_t> out(bytes.size());
  ASSERT_TRUE(codec->Decode(test::RefShape(0), at->data(), at->size(), out.data()).ok());
  ExpectWithinSteps(kv, ToFloats(out, 0), *at, 0, 0);
}

TEST(TcCodecTest, RefusesOtherModelsAndUnknownProfiles) {
  KDN_REQUIRE_PROFILE();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  auto codec = Make("tc:profile=" + fitted->path + ",step=0.3");
  ChunkInfo info;
  info.has_model = true;
  std::memcpy(info.model, Fingerprint(9).data(), 32);
  Result<Bytes> other = codec->EncodeWith(test::RefShape(1), bytes.data(), info);
  EXPECT_EQ(other.status().code(), Code::kInvalidArgument);
  std::memcpy(info.model, Fingerprint(7).data(), 32);
  Result<Bytes> p = codec->EncodeWith(test::RefShape(1), bytes.data(), info);
  ASSERT_TRUE(p.ok()) << p.status().message();
  // Another shape: refused.
  Shape wide = test::RefShape(1);
  wide.kv_heads = 2;
  EXPECT_EQ(codec->Encode(wide, bytes.data()).status().code(), Code::kInvalidArgument);
  // A payload naming a profile this process never loaded.
  Bytes unknown = *p;
  unknown[internal::kHeaderBytes] ^= 0xFF;
  std::vector<std::uint8_t> out(bytes.size());
  auto decoder = DecoderFor(CodecId::kTc);
  ASSERT_TRUE(decoder.ok());
  const Status st = (*decoder)->Decode(test::RefShape(1), unknown.data(), unknown.size(), out.data());
  EXPECT_EQ(st.code(), Code::kCorrupt) << st.message();
  EXPECT_NE(st.message().find("not loaded"), std::string::npos) << st.message();
  // A decoder-only codec (no profile) cannot encode.
  EXPECT_EQ((*decoder)->Encode(test::RefShape(1), bytes.data()).status().code(), Code::kInvalidArgument);
}

TEST(TcCodecTest, DamagedPayloadsFailCleanly) {
  KDN_REQUIRE_PROFILE();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  auto codec = Make("tc:profile=" + fitted->path + ",step=0.3,sink=2");
  Result<Bytes> p = codec->Encode(test::RefShape(1), bytes.data());
  ASSERT_TRUE(p.ok());
  std::vector<std::uint8_t> out(bytes.size());
  auto decode = [&](const Bytes& b) { return codec->Decode(test::RefShape(1), b.data(), b.size(), out.data()); };
  ASSERT_TRUE(decode(*p).ok());
  // Every truncation, and a trailing byte.
  for (size_t n = 0; n < p->size(); n += (n < 200 ? 1 : 97)) {
    Bytes cut(p->begin(), p->begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(decode(cut).ok()) << n;
  }
  Bytes longer = *p;
  longer.push_back(0);
  EXPECT_EQ(decode(longer).code(), Code::kCorrupt);
  // Named fields of plane 0: a table past the profile's, a shift past 24, a
  // non-finite mean, a zero step.
  const size_t plane0 = internal::kHeaderBytes + 16;
  auto with = [&](size_t at, std::uint8_t v) {
    Bytes b = *p;
    b[at] = v;
    return b;
  };
  EXPECT_EQ(decode(with(plane0 + 4 + 2 * kC, 200)).code(), Code::kCorrupt);
  EXPECT_EQ(decode(with(plane0 + 4 + 2 * kC + 1, 30)).code(), Code::kCorrupt);
  EXPECT_EQ(decode(with(plane0 + 5, 0x7C)).code(), Code::kCorrupt);
  Bytes zero_step = *p;
  std::memset(&zero_step[plane0], 0, 4);
  EXPECT_EQ(decode(zero_step).code(), Code::kCorrupt);
  // Random damage anywhere: an error or some finite KV, never a crash or a
  // read past the payload (ASan and the fuzz target check the same).
  std::mt19937 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    Bytes b = *p;
    b[internal::kHeaderBytes + rng() % (b.size() - internal::kHeaderBytes)] ^= static_cast<std::uint8_t>(1 + rng() % 255);
    const Status st = decode(b);
    if (st.ok()) {
      for (float v : ToFloats(out, 1)) ASSERT_TRUE(std::isfinite(v));
    }
  }
}

// What the encoder cannot carry is refused (the store then keeps the chunk
// raw), never coded into a payload the decoder would reject.
TEST(TcCodecTest, EncodeRefusesWhatItCannotCarry) {
  KDN_REQUIRE_PROFILE();
  auto codec = Make("tc:profile=" + fitted->path + ",step=0.3,sink=2");
  std::vector<float> kv = ReferenceKv();
  auto encode = [&](const std::vector<float>& v, std::uint32_t dtype, std::int64_t first = 0) {
    const std::vector<std::uint8_t> b = ToBytes(v, dtype);
    ChunkInfo info;
    info.first_position = first;
    return codec->EncodeWith(test::RefShape(dtype), b.data(), info).status().code();
  };
  EXPECT_EQ(encode(kv, 0), Code::kOk);
  EXPECT_EQ(encode(kv, 0, std::int64_t{1} << 40), Code::kOk);
  EXPECT_EQ(encode(kv, 0, (std::int64_t{1} << 40) + 1), Code::kInvalidArgument);
  std::vector<float> nan = kv;
  nan[kC * 10 + 3] = std::nanf("");
  EXPECT_EQ(encode(nan, 0), Code::kInvalidArgument);
  std::vector<float> big_sink = kv;
  big_sink[1] = 1e6f;  // token 0: a sink, which travels as a half
  EXPECT_EQ(encode(big_sink, 0), Code::kInvalidArgument);
  std::vector<float> big_mean = kv;
  for (std::uint32_t t = 2; t < kTokens; ++t) big_mean[(size_t{kTokens} + t) * kC] = 1e6f;  // a value channel's mean
  EXPECT_EQ(encode(big_mean, 0), Code::kInvalidArgument);
  // Decoding into an unknown dtype: kInvalidArgument, as every codec.
  const std::vector<std::uint8_t> b = ToBytes(kv, 1);
  Result<Bytes> p = codec->Encode(test::RefShape(1), b.data());
  ASSERT_TRUE(p.ok());
  std::vector<std::uint8_t> out(b.size() * 2);
  EXPECT_EQ(codec->Decode(test::RefShape(3), p->data(), p->size(), out.data()).code(), Code::kInvalidArgument);
}

TEST(TcCodecTest, SpecsAreChecked) {
  KDN_REQUIRE_PROFILE();
  auto make = [](const std::string& text) { return MakeCodec(*ParseSpec(text)).status().code(); };
  EXPECT_EQ(make("tc:balanced"), Code::kInvalidArgument);  // a preset needs a profile
  EXPECT_EQ(make("tc:balanced,profile=" + fitted->path), Code::kInvalidArgument);  // no presets in it
  EXPECT_EQ(make("tc:profile=" + fitted->path), Code::kInvalidArgument);  // no step
  EXPECT_EQ(make("tc:profile=" + fitted->path + ",step=0.3,pw=1_2"), Code::kInvalidArgument);
  EXPECT_EQ(make("tc:profile=" + fitted->path + ",step=0.3,colour=red"), Code::kInvalidArgument);
  EXPECT_EQ(make("tc:profile=/nonexistent/x.kdntc,step=0.3"), Code::kInvalidArgument);
  EXPECT_EQ(make("tc:profile=" + fitted->path + ",step=0.3,pw=1_1_1_1_1_1_1_1_1_2"), Code::kOk);
  EXPECT_EQ(make("tc"), Code::kOk);  // a decoder
}

// Through the store's encode step: a chunk of the profile's model is coded
// with it; a chunk of another model is refused (the tier then keeps it raw).
TEST(TcCodecTest, StoreEncodesOnlyTheProfilesModel) {
  KDN_REQUIRE_PROFILE();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  Result<std::shared_ptr<const Codec>> codec = store::MakeTierCodec("tc:profile=" + fitted->path + ",step=0.4");
  ASSERT_TRUE(codec.ok()) << codec.status().message();
  chunk::Chunk c;
  c.meta.dtype = 1;
  c.meta.layers = kLayers;
  c.meta.kv_heads = kHeads;
  c.meta.head_dim = kDim;
  c.meta.tokens = kTokens;
  c.meta.first_position = 256;
  c.meta.model = Fingerprint(7);
  c.payload = chunk::Payload(bytes.data(), bytes.size());
  Result<chunk::ChunkRef> enc = store::EncodeChunk(**codec, c);
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  EXPECT_EQ((*enc)->meta.codec, CodecId::kTc);
  EXPECT_LT((*enc)->payload.size(), bytes.size() / 3);
  Result<chunk::ChunkRef> dec = store::DecodeChunk(*enc);
  ASSERT_TRUE(dec.ok()) << dec.status().message();
  EXPECT_TRUE((*dec)->meta.lossy);
  EXPECT_EQ((*dec)->payload.size(), bytes.size());
  c.meta.model = Fingerprint(3);
  EXPECT_EQ(store::EncodeChunk(**codec, c).status().code(), Code::kInvalidArgument);
}

// Presets fitted on a small text meet their KL targets there, hifi finer.
// A quick calibration: 3 contexts of 48 tokens, 8 continued.
TcCalibrateOptions SmallCalibration(const std::string& work_name) {
  TcCalibrateOptions o;
  o.eval.context = 48;
  o.eval.continue_tokens = 8;
  o.max_contexts = 3;
  o.rope.head_dim = kDim;
  o.work_path = ::testing::TempDir() + "/" + work_name;
  return o;
}

TEST(TcCalibrateTest, FitsPresetsToTargets) {
  KDN_REQUIRE_MODEL();
  Result<model::Checkpoint> w = model::Checkpoint::Load(kdn::testing::ModelPath());
  ASSERT_TRUE(w.ok());
  TcCalibrateOptions o = SmallCalibration("kdn_tc_presets.kdntc");
  Result<TcCalibration> cal = CalibrateTransform(*w, CalibrationTokens(), o);
  ASSERT_TRUE(cal.ok()) << cal.status().message();
  std::remove(o.work_path.c_str());
  ASSERT_EQ(cal->presets.size(), 2u);
  for (const PresetFit& f : cal->presets) {
    EXPECT_LE(f.result.kl_mean, f.target_kl) << f.name;
    EXPECT_GT(f.result.ratio_vs_fp16, 1.0);
  }
  EXPECT_LT(cal->presets[1].step, cal->presets[0].step);
  ASSERT_EQ(cal->profile.presets.size(), 2u);
  EXPECT_EQ(cal->profile.presets[0].first, "balanced");
  // The profile's presets make codecs.
  const std::string path = ::testing::TempDir() + "/kdn_tc_presets2.kdntc";
  Result<std::vector<std::uint8_t>> bytes = SerializeTcProfile(&cal->profile);
  ASSERT_TRUE(bytes.ok());
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
  }
  EXPECT_TRUE(MakeCodec(*ParseSpec("tc:hifi,profile=" + path)).ok());
  std::remove(path.c_str());
}

// The balanced preset fitted at a second context length as well keeps the
// margin there: its step is the smaller of the two fits, and at that step
// its KL is under margin x cachegen's at the second length.
TEST(TcCalibrateTest, TheBalancedPresetHoldsAtEveryContextItIsFittedAt) {
  KDN_REQUIRE_MODEL();
  Result<model::Checkpoint> w = model::Checkpoint::Load(kdn::testing::ModelPath());
  ASSERT_TRUE(w.ok());
  TcCalibrateOptions o = SmallCalibration("kdn_tc_presets3.kdntc");
  Result<TcCalibration> one = CalibrateTransform(*w, CalibrationTokens(), o);
  ASSERT_TRUE(one.ok()) << one.status().message();
  o.balanced_contexts = {96};
  Result<TcCalibration> two = CalibrateTransform(*w, CalibrationTokens(), o);
  ASSERT_TRUE(two.ok()) << two.status().message();
  std::remove(o.work_path.c_str());
  const PresetFit& a = one->presets.at(0);
  const PresetFit& b = two->presets.at(0);
  ASSERT_EQ(b.name, "balanced");
  EXPECT_LE(b.step, a.step);
  EXPECT_LE(b.result.kl_mean, b.target_kl);
  EXPECT_EQ(two->presets.at(1).step, one->presets.at(1).step) << "hifi is fitted as before";
  EXPECT_GT(two->evaluations, one->evaluations);
}

// ---- the device path (core/codec/device.h): the CPU codec's decode
// (tc_cpu.h) gives the bytes of the kernels' per-thread work
// (kernels/common/tc_device_math.h) run on the CPU (TcCpuTest below), so
// every test above checks it; here, the entry points.

using kdn::testing::HaveGpu;

TEST(TcDeviceTest, TheCpuCodecDecodesWithTheEmulation) {
  KDN_REQUIRE_PROFILE();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  auto codec = Make("tc:profile=" + fitted->path + ",step=0.3,sink=2,group=8");
  Result<Bytes> p = codec->Encode(test::RefShape(1), bytes.data());
  ASSERT_TRUE(p.ok());
  std::vector<std::uint8_t> a(bytes.size()), b(bytes.size(), 0xFF);
  ASSERT_TRUE(codec->Decode(test::RefShape(1), p->data(), p->size(), a.data()).ok());
  ASSERT_TRUE(TcDecodeEmulated(test::RefShape(1), p->data(), p->size(), b.data()).ok());
  EXPECT_EQ(a, b);
  // The directory: 4 streams per plane, their components in their group.
  Result<TcDirectory> d = ParseTcDirectory(test::RefShape(1), p->data(), p->size());
  ASSERT_TRUE(d.ok()) << d.status().message();
  ASSERT_EQ(d->streams.size(), size_t{kLayers} * 2 * 4);
  for (size_t s = 0; s < d->streams.size(); ++s) {
    const kernels::TcStreamDir& sd = d->streams[s];
    EXPECT_EQ(sd.plane, s / 4);
    for (std::uint32_t j = 0; j < sd.comps; ++j) EXPECT_EQ(d->comps[sd.comp_at + j] / 8, s % 4);
  }
  EXPECT_EQ(d->sinks, 2u);
}

// The CPU decode (tc_cpu.h: vector streams, the product over non-zero
// terms, rows finished as they come) gives the emulation's bytes, with and
// without its vector code, in every dtype and payload layout: 8 lanes with
// one stream a plane (the vector path's dense case), several streams a plane
// (values scattered), a group that is no multiple of 8 (a period of
// lcm(n, 8) symbols), other lane counts (the kernels' scalar stream),
// sinks, and token counts that leave symbols after the last whole vector.
TEST(TcCpuTest, DecodesTheEmulationsBytes) {
  KDN_REQUIRE_PROFILE();
  const std::vector<float> kv = ReferenceKv();
  // The first `tokens` positions of the reference chunk, canonical.
  auto first = [&](std::uint32_t tokens) {
    std::vector<float> out;
    const size_t row = size_t{kHeads} * kDim;
    for (size_t plane = 0; plane < size_t{kLayers} * 2; ++plane) {
      out.insert(out.end(), kv.begin() + static_cast<std::ptrdiff_t>(plane * kTokens * row),
                 kv.begin() + static_cast<std::ptrdiff_t>((plane * kTokens + tokens) * row));
    }
    return out;
  };
  int compared = 0;
  for (const char* params : {",step=0.3", ",step=0.3,sink=2", ",step=0.3,group=8", ",step=0.3,group=5,sink=1",
                             ",step=0.3,lanes=4", ",step=0.3,lanes=3,group=7", ",step=0.1"}) {
    for (std::uint32_t tokens : {48u, 13u, 3u}) {
      for (std::uint32_t dtype : {0u, 1u, 2u}) {
        const Shape shape{kLayers, kHeads, kDim, tokens, dtype};
        const std::vector<std::uint8_t> bytes = ToBytes(first(tokens), dtype);
        auto codec = Make("tc:profile=" + fitted->path + params);
        Result<Bytes> p = codec->Encode(shape, bytes.data());
        ASSERT_TRUE(p.ok()) << params << ": " << p.status().message();
        std::vector<std::uint8_t> want(bytes.size(), 0xAB);
        ASSERT_TRUE(TcDecodeEmulated(shape, p->data(), p->size(), want.data()).ok());
        for (bool vectors : {true, false}) {
          std::vector<std::uint8_t> got(bytes.size(), 0xCD);
          const Status st = TcDecodeCpuWith(shape, p->data(), p->size(), got.data(), nullptr, vectors);
          ASSERT_TRUE(st.ok()) << st.message();
          ASSERT_EQ(got, want) << "tc" << params << ", " << tokens << " tokens, dtype " << dtype
                               << (vectors ? ", vectors" : ", scalar");
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 7 * 3 * 3 * 2);
}

// Damaged payloads: the CPU decode's verdict is the emulation's (the same
// error, naming the same stream), and what decodes is the same KV.
TEST(TcCpuTest, DamagedPayloadsGetTheEmulationsVerdict) {
  KDN_REQUIRE_PROFILE();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  std::mt19937 rng(23);
  int failed = 0, decoded = 0;
  for (const char* params : {"", ",group=8,sink=1", ",lanes=4"}) {
    Result<Bytes> p = Make("tc:profile=" + fitted->path + ",step=0.3" + params)->Encode(test::RefShape(1), bytes.data());
    ASSERT_TRUE(p.ok());
    for (int trial = 0; trial < 200; ++trial) {
      Bytes b = *p;
      // Damage in the streams' part mostly (the directory's checks are
      // shared): one byte, or a cut.
      const size_t at = b.size() / 2 + rng() % (b.size() / 2);
      if (trial % 4 == 3) {
        b.resize(at);
      } else {
        b[at] ^= static_cast<std::uint8_t>(1 + rng() % 255);
      }
      std::vector<std::uint8_t> want(bytes.size()), got(bytes.size());
      const Status e = TcDecodeEmulated(test::RefShape(1), b.data(), b.size(), want.data());
      for (bool vectors : {true, false}) {
        const Status c = TcDecodeCpuWith(test::RefShape(1), b.data(), b.size(), got.data(), nullptr, vectors);
        ASSERT_EQ(c.code(), e.code()) << params << " trial " << trial << ": " << c.message() << " / " << e.message();
        ASSERT_EQ(c.message(), e.message()) << params << " trial " << trial;
        if (e.ok()) {
          ASSERT_EQ(got, want) << params << " trial " << trial;
        }
      }
      (e.ok() ? decoded : failed) += 1;
    }
  }
  EXPECT_GT(failed, 100);  // most damage is caught (the rest decodes to other finite KV)
}

TEST(TcDeviceTest, WithoutADeviceTheEntryPointSaysUnsupported) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present: TcDeviceTest.OnAGpu covers it";
  KDN_REQUIRE_PROFILE();
  const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), 1);
  Result<Bytes> p = Make("tc:profile=" + fitted->path + ",step=0.3")->Encode(test::RefShape(1), bytes.data());
  ASSERT_TRUE(p.ok());
  char dummy = 0;
  EXPECT_EQ(TcDecodeOnDevice(test::RefShape(1), p->data(), p->size(), &dummy, nullptr).code(), Code::kUnsupported);
  if (DeviceCodecsBuilt()) {
    // The host parse runs first: a damaged payload is reported as such.
    EXPECT_EQ(TcDecodeOnDevice(test::RefShape(1), p->data(), p->size() - 1, &dummy, nullptr).code(), Code::kCorrupt);
  }
}

#ifdef KDN_HAVE_CUDA
TEST(TcDeviceTest, LaunchersCheckTheirArguments) {
  // Checked before anything touches a device: runs without a GPU too.
  std::uint32_t failed = 0;
  kernels::TcDecodeArgs a;
  a.tokens = 4;
  a.lanes = 0;
  a.failed = &failed;
  EXPECT_EQ(kernels::launch_tc_streams(a, nullptr), cudaErrorInvalidValue);
  a.lanes = 8;
  a.sinks = 5;  // more than the tokens
  EXPECT_EQ(kernels::launch_tc_streams(a, nullptr), cudaErrorInvalidValue);
  kernels::TcFinishArgs f;
  f.tokens = 4;
  f.kv_heads = 4;
  f.rope.head_dim = 8;
  f.dtype = 3;
  f.failed = &failed;
  EXPECT_EQ(kernels::launch_tc_finish(f, nullptr), cudaErrorInvalidValue);
  f.dtype = 1;
  f.rope.head_dim = 1024;  // over kTcMaxHeadDim
  EXPECT_EQ(kernels::launch_tc_finish(f, nullptr), cudaErrorInvalidValue);
}

// On a GPU: the streams and the finish kernel on the device, the product by
// cuBLAS; the same KV as the CPU within the product's rounding (another order
// of summation): per element, 1e-5 of the chunk's largest value plus the
// dtype's rounding of it.
TEST(TcDeviceTest, OnAGpuMatchesTheEmulationWithinRounding) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels' work is checked on the CPU above";
  KDN_REQUIRE_PROFILE();
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const std::vector<std::uint8_t> bytes = ToBytes(ReferenceKv(), dtype);
    Result<Bytes> p = Make("tc:profile=" + fitted->path + ",step=0.3,sink=1,group=8")->Encode(test::RefShape(dtype), bytes.data());
    ASSERT_TRUE(p.ok());
    std::vector<std::uint8_t> cpu(bytes.size()), gpu(bytes.size());
    ASSERT_TRUE(TcDecodeEmulated(test::RefShape(dtype), p->data(), p->size(), cpu.data()).ok());
    void* dev = nullptr;
    ASSERT_EQ(cudaMalloc(&dev, bytes.size()), cudaSuccess);
    const Status st = TcDecodeOnDevice(test::RefShape(dtype), p->data(), p->size(), dev, nullptr);
    ASSERT_EQ(cudaMemcpy(gpu.data(), dev, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dev);
    ASSERT_TRUE(st.ok()) << st.message();
    const std::vector<float> c = ToFloats(cpu, dtype), g = ToFloats(gpu, dtype);
    float largest = 0;
    for (float v : c) largest = std::max(largest, std::fabs(v));
    for (size_t i = 0; i < c.size(); ++i) {
      const float rounding = dtype == 0 ? 0.0f : std::fabs(c[i]) * (dtype == 1 ? 1.0f / 1024 : 1.0f / 128);
      ASSERT_LE(std::fabs(c[i] - g[i]), 1e-5f * largest + rounding) << "dtype " << dtype << " element " << i;
    }
  }
}
#endif

}  // namespace
}  // namespace kdn::codec
