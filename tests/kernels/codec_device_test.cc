// SPDX-License-Identifier: Apache-2.0
// The codecs' device path (kernels/codec.cuh, core/codec/device.h) against
// the CPU codecs (core/codec: kdn.cc, cachegen.cc):
// - on the CPU: the host directory parse plus the CPU emulation of the
//   kernels (the same per-thread functions, kernels/ref/codec_ref.h) decode
//   bit-identically to Codec::Decode, on the reference model's KV and on
//   synthetic chunks (odd channel counts, several cachegen token groups, all
//   tokens sinks), for f32/f16/bf16; the encode-side work (quantization, the
//   per-stream rANS and range coders) reproduces the payload's scales and
//   streams byte for byte; and mutated payloads get the same verdict from
//   both (the parse mirrors the CPU decoders' checks). The CPU codec decodes
//   kdn streams of 8 lanes over channels in multiples of 8 with vectors
//   (codec/kdn_simd.h): the shapes of 16, 24 and 32 channels and the
//   reference KV take that path, with the instruction set the CPU has best
//   and, run again by ctest under KDN_CPU_SIMD, with AVX2 and with none;
// - on a GPU (skipped without one): the same decodes and encodes through the
//   kernels.
#include "core/codec/device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "../codec/codec_test_util.h"
#include "core/codec/kdn_simd.h"
#include "core/codec/payload.h"
#include "kernels/common/codec_device_math.h"
#include "kernels/ref/codec_ref.h"
#include "test_gpu.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/codec.cuh"
#endif

namespace kdn::codec {
namespace {

using Floats = std::vector<float>;

const char* const kKdnSpecs[] = {"kdn", "kdn:hifi", "kdn:group=12", "kdn:lanes=3"};
const char* const kCacheGenSpecs[] = {"cachegen", "cachegen:bins=16"};

// A deterministic chunk with per-channel offsets, a few outlier channels and
// a slow drift along tokens, in the canonical layout of `shape`.
Floats SyntheticKv(const Shape& shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  const std::uint64_t C = std::uint64_t{shape.kv_heads} * shape.head_dim;
  Floats kv(shape.elements());
  for (std::uint64_t plane = 0; plane < 2ull * shape.layers; ++plane) {
    for (std::uint64_t t = 0; t < shape.tokens; ++t) {
      for (std::uint64_t c = 0; c < C; ++c) {
        const float scale = c % 7 == 3 ? 6.0f : 1.0f;
        const float v = 0.3f * static_cast<float>(c % 5) - 0.5f + scale * (0.6f * noise(rng) + 0.2f * std::sin(0.05f * t));
        kv[(plane * shape.tokens + t) * C + c] = v;
      }
    }
  }
  return kv;
}

Status EmulatedDecode(CodecId id, const Shape& shape, const Bytes& payload, std::uint8_t* out) {
  return id == CodecId::kKdn ? KdnDecodeEmulated(shape, payload.data(), payload.size(), out)
                             : CacheGenDecodeEmulated(shape, payload.data(), payload.size(), out);
}

Bytes EncodeOrDie(const Codec& codec, const Shape& shape, const Floats& kv) {
  const std::vector<std::uint8_t> bytes = test::ToBytes(kv, shape.dtype);
  Result<Bytes> enc = codec.Encode(shape, bytes.data());
  EXPECT_TRUE(enc.ok()) << codec.spec().ToString() << ": " << enc.status().message();
  return enc.ok() ? *enc : Bytes{};
}

// Codec::Decode and the emulation, from differently filled buffers, agree on
// every byte.
void ExpectEmulationMatches(const std::string& spec, const Shape& shape, const Floats& kv) {
  SCOPED_TRACE(spec + " dtype " + std::to_string(shape.dtype));
  const std::unique_ptr<Codec> codec = test::Make(spec);
  const Bytes payload = EncodeOrDie(*codec, shape, kv);
  ASSERT_FALSE(payload.empty());
  std::vector<std::uint8_t> want(shape.bytes(), 0xAB), got(shape.bytes(), 0xCD);
  const Status w = codec->Decode(shape, payload.data(), payload.size(), want.data());
  ASSERT_TRUE(w.ok()) << w.message();
  const Status g = EmulatedDecode(codec->id(), shape, payload, got.data());
  ASSERT_TRUE(g.ok()) << g.message();
  EXPECT_TRUE(want == got) << "the emulated device decode differs from the CPU codec";
}

std::vector<Shape> SyntheticShapes(std::uint32_t dtype) {
  return {Shape{2, 3, 5, 300, dtype},   // 15 channels (not a multiple of 8 or 12), 2 cachegen groups
          Shape{1, 2, 8, 3, dtype},     // fewer tokens than the default sinks
          Shape{3, 1, 16, 513, dtype},  // 3 cachegen groups, the last of one token
          Shape{2, 3, 8, 260, dtype}};  // 24 channels: kdn's vector path, groups of 24, 16 + 8 or 8
}

TEST(CodecDeviceEmulation, KdnMatchesCodecOnReferenceKv) {
  KDN_REQUIRE_MODEL();
  const Floats kv = test::ReferenceKv();
  ASSERT_FALSE(kv.empty()) << "reference KV files missing";
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    for (const char* spec : kKdnSpecs) ExpectEmulationMatches(spec, test::RefShape(dtype), kv);
  }
}

TEST(CodecDeviceEmulation, CacheGenMatchesCodecOnReferenceKv) {
  KDN_REQUIRE_MODEL();
  const Floats kv = test::ReferenceKv();
  ASSERT_FALSE(kv.empty()) << "reference KV files missing";
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    for (const char* spec : kCacheGenSpecs) ExpectEmulationMatches(spec, test::RefShape(dtype), kv);
  }
}

TEST(CodecDeviceEmulation, MatchesCodecOnSyntheticShapes) {
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    for (const Shape& shape : SyntheticShapes(dtype)) {
      const Floats kv = SyntheticKv(shape, 7 + shape.tokens);
      for (const char* spec : {"kdn", "kdn:sink=0", "kdn:group=7,lanes=5", "kdn:sink=600,lanes=32",
                               "kdn:hifi,group=1,lanes=1", "kdn:group=8", "kdn:group=16", "cachegen",
                               "cachegen:bins=3", "cachegen:bins=256"}) {
        ExpectEmulationMatches(spec, shape, kv);
      }
    }
  }
}

// ---- the encode side: what the kernels compute from the KV reproduces the
// payload the CPU codec wrote.

// Offsets and steps of every plane, as the payload holds them.
void PlaneSteps(const Shape& shape, const Bytes& payload, const KdnDirectory& d, Floats* off, Floats* step) {
  const std::uint64_t C = std::uint64_t{shape.kv_heads} * shape.head_dim;
  off->resize(d.planes.size() * C);
  step->resize(d.planes.size() * C);
  for (size_t p = 0; p < d.planes.size(); ++p) {
    for (std::uint64_t c = 0; c < C; ++c) {
      (*off)[p * C + c] = kernels::codec_read_half(payload.data() + d.planes[p].halves + 2 * c);
      (*step)[p * C + c] = kernels::codec_read_half(payload.data() + d.planes[p].halves + 2 * (C + c));
    }
  }
}

std::vector<kernels::KdnCoding> Codings(const KdnDirectory& d) {
  std::vector<kernels::KdnCoding> coding(d.planes.size() * kernels::kKdnLutStride);
  for (size_t p = 0; p < d.planes.size(); ++p) {
    const std::uint32_t* cum = d.cum.data() + d.planes[p].cum;
    for (std::uint32_t s = 0; s < d.planes[p].n; ++s) {
      const std::uint32_t f = cum[s + 1] - cum[s];
      coding[p * kernels::kKdnLutStride + s] = {cum[s], f, f == 0 ? 0 : kernels::kdn_rcp(f)};
    }
  }
  return coding;
}

// The payload's bytes of every stream, as the encoders' output is compared.
template <typename Dir>
std::vector<Bytes> PayloadStreams(const Bytes& payload, const Dir& d) {
  std::vector<Bytes> out;
  for (const kernels::CodecStreamDir& s : d.streams) {
    out.emplace_back(payload.begin() + static_cast<std::ptrdiff_t>(s.offset),
                     payload.begin() + static_cast<std::ptrdiff_t>(s.offset + s.length));
  }
  return out;
}

void ExpectKdnEncodeMatches(const std::string& spec, const Shape& shape, const Floats& kv) {
  SCOPED_TRACE(spec + " dtype " + std::to_string(shape.dtype));
  const std::unique_ptr<Codec> codec = test::Make(spec);
  const Bytes payload = EncodeOrDie(*codec, shape, kv);
  Result<KdnDirectory> d = ParseKdnDirectory(shape, payload.data(), payload.size());
  ASSERT_TRUE(d.ok()) << d.status().message();
  const std::vector<std::uint8_t> bytes = test::ToBytes(kv, shape.dtype);
  Floats off, step;
  PlaneSteps(shape, payload, *d, &off, &step);
  const std::uint32_t P = static_cast<std::uint32_t>(d->planes.size()), C = shape.kv_heads * shape.head_dim;
  const std::uint32_t Tn = shape.tokens - d->sinks;
  std::vector<std::int8_t> codes(std::uint64_t{P} * Tn * C);
  std::vector<std::int32_t> lo(P), hi(P);
  kernels::KdnQuantizeArgs q;
  q.kv = bytes.data();
  q.off = off.data();
  q.step = step.data();
  q.codes = codes.data();
  q.code_min = lo.data();
  q.code_max = hi.data();
  q.n_planes = P;
  q.channels = C;
  q.tokens = shape.tokens;
  q.sinks = d->sinks;
  q.dtype = shape.dtype;
  kernels::kdn_quantize_ref(q);
  for (std::uint32_t p = 0; p < P; ++p) {
    EXPECT_EQ(lo[p], d->planes[p].min_code) << "plane " << p;
    EXPECT_EQ(hi[p], d->planes[p].min_code + static_cast<std::int32_t>(d->planes[p].n) - 1) << "plane " << p;
  }
  const std::vector<kernels::KdnCoding> coding = Codings(*d);
  kernels::KdnEncodeArgs e;
  e.codes = codes.data();
  e.min_code = lo.data();
  e.coding = coding.data();
  e.n_planes = P;
  e.channels = C;
  e.coded_tokens = Tn;
  e.group = d->group;
  e.groups = d->groups;
  e.lanes = d->lanes;
  std::vector<std::uint16_t> words(kernels::kdn_encode_words(e));
  std::vector<std::uint64_t> sizes(kernels::kdn_encode_threads(e));
  e.words = words.data();
  e.bytes = sizes.data();
  ASSERT_TRUE(kernels::kdn_encode_ref(e));
  const std::vector<Bytes> want = PayloadStreams(payload, *d);
  for (std::uint64_t i = 0; i < sizes.size(); ++i) {
    const std::uint64_t end = kernels::kdn_encode_region_end(e, i / e.groups, i % e.groups);
    const auto* first = reinterpret_cast<const std::uint8_t*>(words.data() + end) - sizes[i];
    EXPECT_TRUE(Bytes(first, first + sizes[i]) == want[i]) << "stream " << i;
  }
}

void ExpectCacheGenEncodeMatches(const std::string& spec, const Shape& shape, const Floats& kv) {
  SCOPED_TRACE(spec + " dtype " + std::to_string(shape.dtype));
  const std::unique_ptr<Codec> codec = test::Make(spec);
  const Bytes payload = EncodeOrDie(*codec, shape, kv);
  Result<CacheGenDirectory> d = ParseCacheGenDirectory(shape, payload.data(), payload.size());
  ASSERT_TRUE(d.ok()) << d.status().message();
  const std::vector<std::uint8_t> bytes = test::ToBytes(kv, shape.dtype);
  const std::uint32_t P = 2 * shape.layers, C = shape.kv_heads * shape.head_dim;
  Floats scales(std::uint64_t{P} * shape.tokens);
  std::vector<std::uint8_t> symbols(shape.elements());
  kernels::CacheGenQuantizeArgs q;
  q.kv = bytes.data();
  q.bins = payload.data() + d->bins_at;
  q.scales = scales.data();
  q.symbols = symbols.data();
  q.n_planes = P;
  q.channels = C;
  q.tokens = shape.tokens;
  q.dtype = shape.dtype;
  EXPECT_EQ(kernels::cachegen_quantize_ref(q), ~0u);
  EXPECT_EQ(std::memcmp(scales.data(), payload.data() + d->scales_at, 4 * scales.size()), 0) << "scales";
  kernels::CacheGenEncodeArgs e;
  e.symbols = symbols.data();
  e.bins = q.bins;
  e.cum = d->cum.data();
  e.cum_at = d->cum_at.data();
  e.n_planes = P;
  e.channels = C;
  e.tokens = shape.tokens;
  e.stream_tokens = d->stream_tokens;
  e.groups = d->groups;
  Bytes out(kernels::cachegen_encode_threads(e) * kernels::cachegen_stream_cap(e));
  std::vector<std::uint32_t> lengths(kernels::cachegen_encode_threads(e));
  e.out = out.data();
  e.lengths = lengths.data();
  ASSERT_TRUE(kernels::cachegen_encode_ref(e));
  const std::vector<Bytes> want = PayloadStreams(payload, *d);
  for (std::uint64_t i = 0; i < lengths.size(); ++i) {
    const std::uint8_t* first = out.data() + i * kernels::cachegen_stream_cap(e);
    EXPECT_TRUE(Bytes(first, first + lengths[i]) == want[i]) << "stream " << i;
  }
}

// ---- batches: every payload of a load decoded at once

// Payloads of several shapes, dtypes and lane counts (1, 3, 5, 8, 32), with
// the CPU codec's decode of each; payload `damaged` has a stream whose
// states are zeroed (it parses, and does not decode), `truncated` a byte
// less (it does not parse).
struct BatchCase {
  std::vector<Shape> shapes;
  std::vector<Bytes> payloads;
  std::vector<std::vector<std::uint8_t>> want;
  size_t damaged = 0, truncated = 0;
};

BatchCase MakeBatchCase() {
  BatchCase b;
  const char* const specs[] = {"kdn", "kdn:lanes=32", "kdn:group=7,lanes=5", "kdn:hifi,lanes=1", "kdn:lanes=3,sink=0"};
  std::vector<std::pair<Shape, Floats>> chunks;
  if (testing::ModelsPresent()) {
    for (std::uint32_t dtype : {1u, 2u, 0u}) chunks.emplace_back(test::RefShape(dtype), test::ReferenceKv());
  }
  for (std::uint32_t dtype : {1u, 0u}) {
    for (const Shape& shape : SyntheticShapes(dtype)) chunks.emplace_back(shape, SyntheticKv(shape, 3 + shape.tokens));
  }
  size_t k = 0;
  for (const auto& [shape, kv] : chunks) {
    const std::unique_ptr<Codec> codec = test::Make(specs[k++ % std::size(specs)]);
    b.shapes.push_back(shape);
    b.payloads.push_back(EncodeOrDie(*codec, shape, kv));
    b.want.emplace_back(shape.bytes());
    EXPECT_TRUE(codec->Decode(shape, b.payloads.back().data(), b.payloads.back().size(), b.want.back().data()).ok());
  }
  b.damaged = 1;
  Result<KdnDirectory> d = ParseKdnDirectory(b.shapes[b.damaged], b.payloads[b.damaged].data(), b.payloads[b.damaged].size());
  EXPECT_TRUE(d.ok());
  if (d.ok()) std::memset(b.payloads[b.damaged].data() + d->streams[3].offset, 0, 4);
  b.truncated = 2;
  b.payloads[b.truncated].pop_back();
  return b;
}

// Plane p's element (t, c) of a canonical chunk, as bytes.
std::vector<std::uint8_t> CanonicalElement(const Shape& s, const std::vector<std::uint8_t>& chunk, std::uint64_t p,
                                           std::uint64_t t, std::uint64_t c) {
  const std::uint64_t C = std::uint64_t{s.kv_heads} * s.head_dim, e = DtypeBytes(s.dtype);
  const std::uint8_t* at = chunk.data() + ((p * s.tokens + t) * C + c) * e;
  return {at, at + e};
}

// Runs the batch through `decode` (emulated, or on a device), odd jobs into
// per-plane outputs with rows 3 elements wider than the plane, and checks
// every good job byte for byte against the CPU codec and the bad ones'
// verdicts. `alloc(n)` gives n bytes the decode can write and `read` brings
// them back.
template <typename Alloc, typename Read, typename Decode>
void ExpectBatchMatches(const Alloc& alloc, const Read& read, const Decode& decode) {
  BatchCase b = MakeBatchCase();
  std::vector<KdnBatchJob> jobs(b.payloads.size());
  std::vector<std::vector<void*>> buffers(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Shape& s = b.shapes[i];
    const std::uint64_t C = std::uint64_t{s.kv_heads} * s.head_dim, e = DtypeBytes(s.dtype);
    jobs[i].shape = s;
    jobs[i].payload = b.payloads[i].data();
    jobs[i].size = b.payloads[i].size();
    if (i % 2 == 0) {
      buffers[i].push_back(alloc(s.bytes()));
      jobs[i].out = buffers[i][0];
    } else {
      jobs[i].row = C + 3;
      for (std::uint64_t p = 0; p < 2ull * s.layers; ++p) buffers[i].push_back(alloc(s.tokens * (C + 3) * e));
      jobs[i].planes = buffers[i];
    }
  }
  ASSERT_TRUE(decode(std::span<KdnBatchJob>(jobs))) << "the batch as a whole";
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("job " + std::to_string(i));
    const Shape& s = b.shapes[i];
    if (i == b.damaged || i == b.truncated) {
      EXPECT_EQ(jobs[i].status.code(), Code::kCorrupt) << jobs[i].status.message();
      if (i == b.damaged) {
        EXPECT_NE(jobs[i].status.message().find("does not decode"), std::string::npos) << jobs[i].status.message();
      }
      continue;
    }
    ASSERT_TRUE(jobs[i].status.ok()) << jobs[i].status.message();
    if (i % 2 == 0) {
      EXPECT_TRUE(read(buffers[i][0], s.bytes()) == b.want[i]) << "differs from the CPU codec";
      continue;
    }
    const std::uint64_t C = std::uint64_t{s.kv_heads} * s.head_dim, e = DtypeBytes(s.dtype);
    size_t bad = 0;
    for (std::uint64_t p = 0; p < 2ull * s.layers; ++p) {
      const std::vector<std::uint8_t> plane = read(buffers[i][p], s.tokens * (C + 3) * e);
      for (std::uint64_t t = 0; t < s.tokens; ++t) {
        for (std::uint64_t c = 0; c < C; ++c) {
          const std::uint8_t* got = plane.data() + (t * (C + 3) + c) * e;
          bad += std::vector<std::uint8_t>(got, got + e) != CanonicalElement(s, b.want[i], p, t, c);
        }
      }
    }
    EXPECT_EQ(bad, 0u) << "elements of the per-plane outputs differ from the CPU codec";
  }
}

TEST(CodecDeviceEmulation, ABatchDecodesEveryPayloadAsTheCodecAndFlagsOnlyTheBadOnes) {
  std::vector<std::unique_ptr<std::vector<std::uint8_t>>> held;
  auto alloc = [&](std::uint64_t n) -> void* {
    held.push_back(std::make_unique<std::vector<std::uint8_t>>(n, 0xCD));
    return held.back()->data();
  };
  auto read = [](void* p, std::uint64_t n) {
    auto* b = static_cast<std::uint8_t*>(p);
    return std::vector<std::uint8_t>(b, b + n);
  };
  ExpectBatchMatches(alloc, read, [](std::span<KdnBatchJob> jobs) { return KdnDecodeBatchEmulated(jobs).ok(); });
  // Outputs missing: refused before anything is decoded.
  KdnBatchJob j;
  j.shape = Shape{1, 1, 8, 4, 1};
  EXPECT_EQ(KdnDecodeBatchEmulated(std::span<KdnBatchJob>(&j, 1)).code(), Code::kInvalidArgument);
  j.planes = {nullptr, nullptr};
  j.row = 8;
  EXPECT_EQ(KdnDecodeBatchEmulated(std::span<KdnBatchJob>(&j, 1)).code(), Code::kInvalidArgument);
}

// A job's plane range (a load that writes its layers in steps): only those
// planes are written, each as the whole decode writes it; a stream that does
// not decode fails the range it lies in, named by its plane, and not the
// others.
TEST(CodecDeviceEmulation, APlaneRangeDecodesThosePlanesOnly) {
  const Shape shape{3, 2, 8, 40, 1};  // 6 planes of f16
  const std::unique_ptr<Codec> codec = test::Make("kdn:balanced");
  Bytes payload = EncodeOrDie(*codec, shape, SyntheticKv(shape, 5));
  ASSERT_FALSE(payload.empty());
  std::vector<std::uint8_t> whole(shape.bytes(), 0xAB);
  ASSERT_TRUE(KdnDecodeEmulated(shape, payload.data(), payload.size(), whole.data()).ok());
  const std::uint64_t plane_bytes = shape.bytes() / 6;
  const auto decode = [&](const Bytes& bytes, std::uint32_t begin, std::uint32_t end, std::vector<std::uint8_t>& out) {
    out.assign(shape.bytes(), 0xCD);
    KdnBatchJob j;
    j.shape = shape;
    j.payload = bytes.data();
    j.size = bytes.size();
    j.out = out.data();
    j.plane_begin = begin;
    j.plane_end = end;
    EXPECT_TRUE(KdnDecodeBatchEmulated(std::span<KdnBatchJob>(&j, 1)).ok());
    return j.status;
  };
  std::vector<std::uint8_t> got;
  ASSERT_TRUE(decode(payload, 2, 5, got).ok());
  for (std::uint64_t p = 0; p < 6; ++p) {
    const bool in = p >= 2 && p < 5;
    const auto* g = got.data() + p * plane_bytes;
    if (in) {
      EXPECT_EQ(std::memcmp(g, whole.data() + p * plane_bytes, plane_bytes), 0) << "plane " << p;
    } else {
      EXPECT_TRUE(std::all_of(g, g + plane_bytes, [](std::uint8_t b) { return b == 0xCD; })) << "plane " << p;
    }
  }
  // Plane 3's first stream, damaged: the range holding it fails, naming it.
  Result<KdnDirectory> d = ParseKdnDirectory(shape, payload.data(), payload.size());
  ASSERT_TRUE(d.ok());
  const kernels::CodecStreamDir& st = d->streams[3 * d->groups];
  ASSERT_GE(st.length, 4u);
  for (std::uint64_t i = 0; i < st.length; ++i) payload[st.offset + i] = static_cast<std::uint8_t>(0x3D * i + 7);
  EXPECT_TRUE(decode(payload, 0, 2, got).ok()) << "planes 0 and 1 do not hold the damage";
  EXPECT_EQ(std::memcmp(got.data(), whole.data(), 2 * plane_bytes), 0);
  const Status bad = decode(payload, 2, 4, got);
  EXPECT_EQ(bad.code(), Code::kCorrupt);
  EXPECT_NE(bad.message().find("stream 0 of plane 3"), std::string::npos) << bad.message();
  EXPECT_EQ(bad.message(), decode(payload, 0, 6, got).message()) << "a range names a stream as the whole decode does";
}

TEST(CodecDeviceEmulation, EncodeSideReproducesPayloads) {
  std::vector<std::pair<Shape, Floats>> chunks;
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    if (testing::ModelsPresent()) chunks.emplace_back(test::RefShape(dtype), test::ReferenceKv());
    for (const Shape& shape : SyntheticShapes(dtype)) chunks.emplace_back(shape, SyntheticKv(shape, 11 + shape.tokens));
  }
  for (const auto& [shape, kv] : chunks) {
    ASSERT_EQ(kv.size(), shape.elements());
    for (const char* spec : kKdnSpecs) ExpectKdnEncodeMatches(spec, shape, kv);
    ExpectKdnEncodeMatches("kdn:sink=0,lanes=32,group=5", shape, kv);
    for (const char* spec : kCacheGenSpecs) ExpectCacheGenEncodeMatches(spec, shape, kv);
    ExpectCacheGenEncodeMatches("cachegen:bins=255", shape, kv);
  }
}

TEST(CodecDeviceEmulation, EncoderRejectsSymbolsOutsideTheModel) {
  // A kdn stream whose code has no frequency, a cachegen symbol outside its
  // table: the encoders say so instead of writing garbage.
  std::vector<std::int8_t> codes = {0, 1, 2, 3};
  const std::int32_t lo = 0;
  std::vector<kernels::KdnCoding> coding(kernels::kKdnLutStride);
  coding[0] = {0, 2048, kernels::kdn_rcp(2048)};
  coding[1] = {2048, 2048, kernels::kdn_rcp(2048)};
  kernels::KdnEncodeArgs e;
  e.codes = codes.data();
  e.min_code = &lo;
  e.coding = coding.data();
  e.n_planes = 1;
  e.channels = 2;
  e.coded_tokens = 2;
  e.group = 2;
  e.groups = 1;
  e.lanes = 2;
  std::vector<std::uint16_t> words(kernels::kdn_encode_words(e));
  std::uint64_t size = 0;
  e.words = words.data();
  e.bytes = &size;
  EXPECT_FALSE(kernels::kdn_encode_ref(e));
  EXPECT_EQ(size, ~std::uint64_t{0});

  const std::uint8_t bins = 2;  // 3 bins: symbols 0..2
  const std::vector<std::uint8_t> symbols = {0, 3};
  const std::vector<std::uint32_t> cum = {0, 32768, 65536, 65536}, cum_at = {0};
  kernels::CacheGenEncodeArgs c;
  c.symbols = symbols.data();
  c.bins = &bins;
  c.cum = cum.data();
  c.cum_at = cum_at.data();
  c.n_planes = 1;
  c.channels = 1;
  c.tokens = 2;
  c.stream_tokens = 256;
  c.groups = 1;
  Bytes out(kernels::cachegen_stream_cap(c));
  std::uint32_t length = 0;
  c.out = out.data();
  c.lengths = &length;
  EXPECT_FALSE(kernels::cachegen_encode_ref(c));
  EXPECT_EQ(length, ~0u);
}

// ---- the same verdict on damaged payloads

// A damage: bytes overwritten at positions (a resize first, if any).
struct Damage {
  std::vector<std::pair<std::uint64_t, std::uint8_t>> bytes;
  std::int64_t resize = -1;
};

Damage Put(std::uint64_t at, std::initializer_list<std::uint8_t> v) {
  Damage d;
  for (std::uint8_t b : v) d.bytes.push_back({at++, b});
  return d;
}
Damage PutU32(std::uint64_t at, std::uint32_t v) {
  return Put(at, {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v >> 16),
                  static_cast<std::uint8_t>(v >> 24)});
}
std::uint32_t U32At(const Bytes& p, std::uint64_t at) { return kernels::kdn_read_u32(p.data() + at); }

// Damage aimed at every field the decoders check, located through the
// directory: codes range, offsets, steps, sinks, tables and lengths (kdn);
// bins, scales, table bitmaps and frequencies, lengths (cachegen). Steps,
// sinks and scales get values that overflow some dtypes and not others.
std::vector<Damage> AimedDamage(CodecId id, const Shape& shape, const Bytes& p) {
  std::vector<Damage> out;
  const std::uint64_t C = std::uint64_t{shape.kv_heads} * shape.head_dim;
  if (id == CodecId::kKdn) {
    Result<KdnDirectory> d = ParseKdnDirectory(shape, p.data(), p.size());
    EXPECT_TRUE(d.ok());
    if (!d.ok()) return out;
    for (size_t plane = 0; plane < d->planes.size(); ++plane) {
      const kernels::KdnPlaneDir& pd = d->planes[plane];
      for (std::uint8_t v : {0x80, 0x81, 0x7F, 0x00}) out.push_back(Put(pd.halves - 1, {v}));
      for (std::uint64_t c : {std::uint64_t{0}, C - 1}) {
        for (std::uint8_t v : {0x7C, 0xFC, 0x7B, 0x3C}) out.push_back(Put(pd.halves + 2 * c + 1, {v}));
        for (std::uint8_t v : {0x80, 0x7C, 0x7B, 0x5C, 0x00}) out.push_back(Put(pd.halves + 2 * (C + c) + 1, {v}));
      }
      if (d->sinks > 0) {
        for (std::uint8_t v : {0x7C, 0xFE, 0x7B, 0x00}) out.push_back(Put(pd.sinks + 1, {v}));
      }
      const std::uint64_t table = pd.sinks + 2ull * d->sinks * C;
      for (std::uint8_t v : {11, 13, 0, 16}) out.push_back(Put(table, {v}));
      for (std::uint8_t v : {std::uint8_t{0}, std::uint8_t{1}, std::uint8_t{0x80}, static_cast<std::uint8_t>(p[table + 1] + 1)}) {
        out.push_back(Put(table + 1, {v}));
      }
      out.push_back(Put(table + 2, {static_cast<std::uint8_t>(p[table + 2] + 1)}));
      const std::uint64_t g0 = plane * d->groups;
      const std::uint64_t lengths = d->streams[g0].offset - 4ull * d->groups;
      for (std::uint64_t g = 0; g < d->groups; ++g) {
        const std::uint32_t len = U32At(p, lengths + 4 * g);
        for (std::uint32_t v : {len + 1, len - 1, len + 2, 0u, 0xFFFFFFFFu}) out.push_back(PutU32(lengths + 4 * g, v));
        if (g + 1 < d->groups) {  // one byte moved between neighbours: sizes still add up
          Damage m = PutU32(lengths + 4 * g, len + 2);
          for (const auto& e : PutU32(lengths + 4 * g + 4, U32At(p, lengths + 4 * g + 4) - 2).bytes) m.bytes.push_back(e);
          out.push_back(m);
        }
      }
    }
  } else {
    Result<CacheGenDirectory> d = ParseCacheGenDirectory(shape, p.data(), p.size());
    EXPECT_TRUE(d.ok());
    if (!d.ok()) return out;
    const std::uint64_t planes = 2ull * shape.layers;
    for (std::uint64_t lk = 0; lk < planes; ++lk) {
      for (std::uint8_t v : {0, 1, 2, 15, 31, 255}) out.push_back(Put(d->bins_at + lk, {v}));
    }
    for (std::uint64_t b : {std::uint64_t{0}, planes * shape.tokens - 1}) {
      const std::uint64_t at = d->scales_at + 4 * b;
      for (std::uint32_t bits : {0xBF800000u, 0x7FC00000u, 0x7F800000u, 0x71800000u, 0x47000000u, 0x80000000u, 0u}) {
        out.push_back(PutU32(at, bits));
      }
    }
    // The first channel tables of the first and the last plane: bitmap
    // (padding bits and absent symbols), frequencies.
    for (std::uint64_t lk : {std::uint64_t{0}, planes - 1}) {
      std::uint64_t at = d->scales_at + 4 * planes * shape.tokens;
      for (std::uint64_t k = 0; k < lk * C; ++k) {  // skip the tables before
        const std::uint32_t A = kernels::cachegen_alphabet(p[d->bins_at + k / C]);
        std::uint32_t present = 0;
        for (std::uint32_t s = 0; s < A; ++s) present += (p[at + s / 8] >> (s % 8)) & 1u;
        at += (A + 7) / 8 + 2ull * present;
      }
      const std::uint32_t A = kernels::cachegen_alphabet(p[d->bins_at + lk]);
      for (std::uint32_t byte = 0; byte < (A + 7) / 8; ++byte) {
        for (std::uint8_t bit : {1, 2, 64, 128}) {
          out.push_back(Put(at + byte, {static_cast<std::uint8_t>(p[at + byte] ^ bit)}));
        }
      }
      const std::uint64_t freqs = at + (A + 7) / 8;
      out.push_back(Put(freqs, {static_cast<std::uint8_t>(p[freqs] + 1)}));
      out.push_back(Put(freqs + 1, {0xFF}));
    }
    const std::uint64_t lengths = d->streams[0].offset - 4 * d->streams.size();
    for (std::uint64_t s : {std::uint64_t{0}, d->streams.size() / 2}) {
      const std::uint32_t len = U32At(p, lengths + 4 * s);
      for (std::uint32_t v : {len + 1, len - 1, 0u}) out.push_back(PutU32(lengths + 4 * s, v));
      Damage m = PutU32(lengths + 4 * s, len + 1);
      for (const auto& e : PutU32(lengths + 4 * s + 4, U32At(p, lengths + 4 * s + 4) - 1).bytes) m.bytes.push_back(e);
      out.push_back(m);
    }
  }
  return out;
}

// Random damage: a flipped bit, a replaced byte, a truncation, a byte
// appended, a small number over 4 bytes (lengths, states); half of it in the
// first tenth of the body, where the tables and lengths are.
std::vector<Damage> RandomDamage(const Bytes& p, int n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t body = p.size() - internal::kHeaderBytes;
  std::vector<Damage> out;
  for (int trial = 0; trial < n; ++trial) {
    const size_t span = trial % 2 == 0 ? std::max<size_t>(body / 10, 1) : body;
    const size_t at = internal::kHeaderBytes + rng() % span;
    Damage d;
    switch (trial % 5) {
      case 0: d = Put(at, {static_cast<std::uint8_t>(p[at] ^ (1u << (rng() % 8)))}); break;
      case 1: d = Put(at, {static_cast<std::uint8_t>(rng())}); break;
      case 2: d.resize = static_cast<std::int64_t>(internal::kHeaderBytes + rng() % body); break;
      case 3: d = Put(p.size(), {static_cast<std::uint8_t>(rng())}); break;
      default: d = Put(at, {static_cast<std::uint8_t>(rng() % 8), 0, 0, 0});
    }
    out.push_back(d);
  }
  return out;
}

void ExpectSameVerdicts(const std::string& spec, const Shape& shape, const Floats& kv, int random,
                        std::uint32_t seed) {
  SCOPED_TRACE(spec + " dtype " + std::to_string(shape.dtype));
  const std::unique_ptr<Codec> codec = test::Make(spec);
  const Bytes payload = EncodeOrDie(*codec, shape, kv);
  ASSERT_GT(payload.size(), internal::kHeaderBytes);
  std::vector<Damage> damage = AimedDamage(codec->id(), shape, payload);
  const size_t aimed = damage.size();
  for (Damage& d : RandomDamage(payload, random, seed)) damage.push_back(std::move(d));
  std::vector<std::uint8_t> want(shape.bytes()), got(shape.bytes());
  size_t rejected = 0;
  for (size_t trial = 0; trial < damage.size(); ++trial) {
    Bytes m = payload;
    if (damage[trial].resize >= 0) m.resize(static_cast<size_t>(damage[trial].resize));
    for (const auto& [at, v] : damage[trial].bytes) {
      if (at >= m.size()) m.resize(at + 1);
      m[at] = v;
    }
    const Status w = codec->Decode(shape, m.data(), m.size(), want.data());
    const Status g = EmulatedDecode(codec->id(), shape, m, got.data());
    ASSERT_EQ(w.code(), g.code()) << (trial < aimed ? "aimed" : "random") << " damage " << trial << ": codec '"
                                  << w.message() << "', emulation '" << g.message() << "'";
    if (w.ok()) {
      EXPECT_TRUE(want == got) << "damage " << trial << ": accepted by both, decoded differently";
    } else {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, damage.size() / 2) << "the damage should mostly be caught";
  EXPECT_LT(rejected, damage.size()) << "some damage (offsets, steps, sinks) decodes";
}

TEST(CodecDeviceEmulation, SameVerdictsOnDamagedPayloads) {
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const Shape shape{2, 3, 5, 300, dtype};
    const Floats kv = SyntheticKv(shape, 3);
    ExpectSameVerdicts("kdn", shape, kv, 400, 1);
    ExpectSameVerdicts("kdn:group=7,lanes=5,sink=2", shape, kv, 200, 2);
    ExpectSameVerdicts("cachegen", shape, kv, 400, 3);
    ExpectSameVerdicts("cachegen:bins=7", shape, kv, 200, 4);
    // 32 channels: kdn's vector path (a plane in one stream, or in four).
    const Shape wide{2, 4, 8, 300, dtype};
    const Floats wide_kv = SyntheticKv(wide, 7);
    ExpectSameVerdicts("kdn", wide, wide_kv, 400, 8);
    ExpectSameVerdicts("kdn:group=8,sink=1", wide, wide_kv, 200, 9);
  }
  // Planes of 32 and 16 bins (LMCache's schedule on a 12-layer chunk).
  const Shape deep{12, 1, 4, 20, 1};
  ExpectSameVerdicts("cachegen", deep, SyntheticKv(deep, 6), 100, 5);
}

// The vector decoder in use is the CPU's best unless KDN_CPU_SIMD lowers it
// (ctest runs this file's emulation tests again with "avx2" and "none"), and
// it takes exactly the streams of 8 lanes over channels in multiples of 8.
TEST(CodecDeviceEmulation, TheEnvironmentChoosesTheVectorDecoder) {
  using internal::KdnSimd;
  const KdnSimd in_use = internal::KdnSimdInUse();
  const char* env = std::getenv("KDN_CPU_SIMD");
  const std::string asked = env == nullptr ? "" : env;
  if (asked == "none") {
    EXPECT_EQ(in_use, KdnSimd::kNone);
  } else if (asked == "avx2") {
    EXPECT_LE(in_use, KdnSimd::kAvx2);
  }
  std::printf("kdn vector decoder: %d (0 none, 1 AVX2, 2 AVX-512)\n", static_cast<int>(in_use));
  const bool vector = in_use != KdnSimd::kNone;
  EXPECT_EQ(internal::KdnSimdComputes(8, 32), vector);
  EXPECT_EQ(internal::KdnSimdComputes(8, 8), vector);
  EXPECT_FALSE(internal::KdnSimdComputes(8, 12));
  EXPECT_FALSE(internal::KdnSimdComputes(8, 0));
  EXPECT_FALSE(internal::KdnSimdComputes(4, 32));
}

TEST(CodecDeviceEmulation, RejectsBadStreamsAndMismatches) {
  const Shape shape{2, 3, 5, 300, 1};
  const Floats kv = SyntheticKv(shape, 5);
  std::vector<std::uint8_t> out(shape.bytes());
  {
    const Bytes payload = EncodeOrDie(*test::Make("kdn"), shape, kv);
    Result<KdnDirectory> d = ParseKdnDirectory(shape, payload.data(), payload.size());
    ASSERT_TRUE(d.ok());
    Bytes m = payload;
    std::memset(m.data() + d->streams[3].offset, 0, 4);  // lane 0's state below 2^16
    const Status s = KdnDecodeEmulated(shape, m.data(), m.size(), out.data());
    EXPECT_EQ(s.code(), Code::kCorrupt);
    EXPECT_NE(s.message().find("stream 0 of plane 3"), std::string::npos) << s.message();
    // A payload of the other codec, or for another shape.
    EXPECT_EQ(CacheGenDecodeEmulated(shape, payload.data(), payload.size(), out.data()).code(), Code::kCorrupt);
    Shape other = shape;
    other.tokens = 299;
    EXPECT_EQ(KdnDecodeEmulated(other, payload.data(), payload.size(), out.data()).code(), Code::kCorrupt);
  }
  {
    const Bytes payload = EncodeOrDie(*test::Make("cachegen"), shape, kv);
    Result<CacheGenDirectory> d = ParseCacheGenDirectory(shape, payload.data(), payload.size());
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->streams.size(), 2u * 2 * 15 * 2);
    Bytes m = payload;
    std::memset(m.data() + d->streams[5].offset, 0xFF, d->streams[5].length);  // a target beyond 2^16
    const Status s = CacheGenDecodeEmulated(shape, m.data(), m.size(), out.data());
    EXPECT_EQ(s.code(), Code::kCorrupt);
    EXPECT_NE(s.message().find("stream 5 "), std::string::npos) << s.message();
  }
  Shape bad = shape;
  bad.dtype = 7;
  const Bytes any(64, 0);
  EXPECT_EQ(KdnDecodeEmulated(bad, any.data(), any.size(), out.data()).code(), Code::kInvalidArgument);
}

// ---- the device entry points

using kdn::testing::HaveGpu;

TEST(CodecDevice, WithoutADeviceTheEntryPointsSayUnsupported) {
  if (HaveGpu()) GTEST_SKIP() << "a CUDA device is present: the device tests below cover it";
  const Shape shape{1, 2, 8, 40, 1};
  const Floats kv = SyntheticKv(shape, 9);
  const Bytes kdn = EncodeOrDie(*test::Make("kdn"), shape, kv);
  const Bytes cg = EncodeOrDie(*test::Make("cachegen"), shape, kv);
  char dummy = 0;
  EXPECT_EQ(KdnDecodeOnDevice(shape, kdn.data(), kdn.size(), &dummy, nullptr).code(), Code::kUnsupported);
  EXPECT_EQ(CacheGenDecodeOnDevice(shape, cg.data(), cg.size(), &dummy, nullptr).code(), Code::kUnsupported);
  if (DeviceCodecsBuilt()) {
    // Built with CUDA: the host parse runs first, so a damaged payload is
    // still reported as such.
    EXPECT_EQ(KdnDecodeOnDevice(shape, kdn.data(), kdn.size() - 1, &dummy, nullptr).code(), Code::kCorrupt);
  }
}

#ifdef KDN_HAVE_CUDA

TEST(CodecDevice, LaunchersCheckTheirArguments) {
  // Checked before anything touches a device: runs without a GPU too.
  kernels::KdnBatchArgs a;
  a.n_planes = 2;
  a.dtype = 3;
  EXPECT_EQ(kernels::launch_kdn_decode_batch(a, nullptr), cudaErrorInvalidValue);  // dtype
  a.dtype = 1;
  EXPECT_EQ(kernels::launch_kdn_decode_batch(a, nullptr), cudaErrorInvalidValue);  // null pointers
  a.n_planes = 0;
  EXPECT_EQ(kernels::launch_kdn_decode_batch(a, nullptr), cudaSuccess);  // nothing to do
  kernels::CacheGenDecodeArgs c;
  c.n_planes = 2;
  c.channels = 3;
  c.tokens = 300;
  c.stream_tokens = 256;
  c.groups = 1;
  EXPECT_EQ(kernels::launch_cachegen_decode(c, nullptr), cudaErrorInvalidValue);  // 300 tokens need 2 groups
  kernels::KdnQuantizeArgs q;
  q.tokens = 2;
  q.sinks = 3;
  EXPECT_EQ(kernels::launch_kdn_quantize(q, nullptr), cudaErrorInvalidValue);
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Device memory holding a copy of a host vector (or n zero-initialized T).
template <typename T>
class DeviceVector {
 public:
  explicit DeviceVector(size_t n) : n_(n) {
    if (cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_ != nullptr) (void)cudaMemset(p_, 0, std::max<size_t>(n, 1) * sizeof(T));
  }
  explicit DeviceVector(const std::vector<T>& v) : DeviceVector(v.size()) {
    if (p_ != nullptr && !v.empty()) (void)cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    if (n_ > 0) (void)cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

void ExpectDeviceDecodeMatches(const std::string& spec, const Shape& shape, const Floats& kv) {
  SCOPED_TRACE(spec + " dtype " + std::to_string(shape.dtype));
  const std::unique_ptr<Codec> codec = test::Make(spec);
  const Bytes payload = EncodeOrDie(*codec, shape, kv);
  std::vector<std::uint8_t> want(shape.bytes(), 0xAB);
  ASSERT_TRUE(codec->Decode(shape, payload.data(), payload.size(), want.data()).ok());
  DeviceVector<std::uint8_t> out(std::vector<std::uint8_t>(shape.bytes(), 0xCD));
  ASSERT_NE(out.get(), nullptr);
  const Status s = codec->id() == CodecId::kKdn
                       ? KdnDecodeOnDevice(shape, payload.data(), payload.size(), out.get(), nullptr)
                       : CacheGenDecodeOnDevice(shape, payload.data(), payload.size(), out.get(), nullptr);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(out.Download() == want) << "the device decode differs from the CPU codec";
}

TEST(CodecDevice, DecodeMatchesCodec) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their work is checked on the CPU above";
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    std::vector<std::pair<Shape, Floats>> chunks;
    if (testing::ModelsPresent()) chunks.emplace_back(test::RefShape(dtype), test::ReferenceKv());
    for (const Shape& shape : SyntheticShapes(dtype)) chunks.emplace_back(shape, SyntheticKv(shape, 7 + shape.tokens));
    for (const auto& [shape, kv] : chunks) {
      for (const char* spec : kKdnSpecs) ExpectDeviceDecodeMatches(spec, shape, kv);
      for (const char* spec : kCacheGenSpecs) ExpectDeviceDecodeMatches(spec, shape, kv);
      ExpectDeviceDecodeMatches("kdn:sink=0,group=7,lanes=5", shape, kv);
    }
  }
}

TEST(CodecDevice, ABatchDecodesEveryPayloadAsTheCodecAndFlagsOnlyTheBadOnes) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their work is checked on the CPU above";
  std::vector<std::unique_ptr<DeviceVector<std::uint8_t>>> held;
  auto alloc = [&](std::uint64_t n) -> void* {
    held.push_back(std::make_unique<DeviceVector<std::uint8_t>>(std::vector<std::uint8_t>(n, 0xCD)));
    return held.back()->get();
  };
  auto read = [](void* p, std::uint64_t n) {
    std::vector<std::uint8_t> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  };
  ExpectBatchMatches(alloc, read, [](std::span<KdnBatchJob> jobs) {
    const Status s = KdnDecodeBatchOnDevice(jobs, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    return s.ok();
  });
}

TEST(CodecDevice, DecodeReportsBadStreams) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their work is checked on the CPU above";
  const Shape shape{2, 3, 5, 300, 1};
  const Floats kv = SyntheticKv(shape, 5);
  DeviceVector<std::uint8_t> out(shape.bytes());
  const Bytes kdn = EncodeOrDie(*test::Make("kdn"), shape, kv);
  Result<KdnDirectory> d = ParseKdnDirectory(shape, kdn.data(), kdn.size());
  ASSERT_TRUE(d.ok());
  Bytes m = kdn;
  std::memset(m.data() + d->streams[3].offset, 0, 4);
  const Status s = KdnDecodeOnDevice(shape, m.data(), m.size(), out.get(), nullptr);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_NE(s.message().find("stream 0 of plane 3"), std::string::npos) << s.message();
  const Bytes cg = EncodeOrDie(*test::Make("cachegen"), shape, kv);
  Result<CacheGenDirectory> c = ParseCacheGenDirectory(shape, cg.data(), cg.size());
  ASSERT_TRUE(c.ok());
  m = cg;
  std::memset(m.data() + c->streams[5].offset, 0xFF, c->streams[5].length);
  EXPECT_EQ(CacheGenDecodeOnDevice(shape, m.data(), m.size(), out.get(), nullptr).code(), Code::kCorrupt);
}

TEST(CodecDevice, EncodeKernelsReproducePayloads) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their work is checked on the CPU above";
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    for (const Shape& shape : SyntheticShapes(dtype)) {
      SCOPED_TRACE("dtype " + std::to_string(dtype) + " tokens " + std::to_string(shape.tokens));
      const Floats kv = SyntheticKv(shape, 13 + shape.tokens);
      const DeviceVector<std::uint8_t> dkv(test::ToBytes(kv, dtype));
      const std::uint32_t P = 2 * shape.layers, C = shape.kv_heads * shape.head_dim;
      {  // kdn
        const Bytes payload = EncodeOrDie(*test::Make("kdn:group=7,lanes=5"), shape, kv);
        Result<KdnDirectory> d = ParseKdnDirectory(shape, payload.data(), payload.size());
        ASSERT_TRUE(d.ok());
        Floats off, step;
        PlaneSteps(shape, payload, *d, &off, &step);
        const std::uint32_t Tn = shape.tokens - d->sinks;
        const DeviceVector<float> doff(off), dstep(step);
        DeviceVector<std::int8_t> codes(std::uint64_t{P} * Tn * C);
        DeviceVector<std::int32_t> lo(P), hi(P);
        kernels::KdnQuantizeArgs q;
        q.kv = dkv.get();
        q.off = doff.get();
        q.step = dstep.get();
        q.codes = codes.get();
        q.code_min = lo.get();
        q.code_max = hi.get();
        q.n_planes = P;
        q.channels = C;
        q.tokens = shape.tokens;
        q.sinks = d->sinks;
        q.dtype = dtype;
        CUDA_OK(kernels::launch_kdn_quantize(q, nullptr));
        const DeviceVector<kernels::KdnCoding> coding(Codings(*d));
        kernels::KdnEncodeArgs e;
        e.codes = codes.get();
        e.min_code = lo.get();
        e.coding = coding.get();
        e.n_planes = P;
        e.channels = C;
        e.coded_tokens = Tn;
        e.group = d->group;
        e.groups = d->groups;
        e.lanes = d->lanes;
        DeviceVector<std::uint16_t> words(kernels::kdn_encode_words(e));
        DeviceVector<std::uint64_t> sizes(kernels::kdn_encode_threads(e));
        e.words = words.get();
        e.bytes = sizes.get();
        CUDA_OK(kernels::launch_kdn_encode(e, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<std::int32_t> hlo = lo.Download();
        for (std::uint32_t p = 0; p < P; ++p) EXPECT_EQ(hlo[p], d->planes[p].min_code) << "plane " << p;
        const std::vector<std::uint16_t> hw = words.Download();
        const std::vector<std::uint64_t> hs = sizes.Download();
        const std::vector<Bytes> want = PayloadStreams(payload, *d);
        for (std::uint64_t i = 0; i < hs.size(); ++i) {
          const std::uint64_t end = kernels::kdn_encode_region_end(e, i / e.groups, i % e.groups);
          ASSERT_LE(hs[i], 2 * end) << "stream " << i;
          const auto* first = reinterpret_cast<const std::uint8_t*>(hw.data() + end) - hs[i];
          EXPECT_TRUE(Bytes(first, first + hs[i]) == want[i]) << "stream " << i;
        }
      }
      {  // cachegen
        const Bytes payload = EncodeOrDie(*test::Make("cachegen"), shape, kv);
        Result<CacheGenDirectory> d = ParseCacheGenDirectory(shape, payload.data(), payload.size());
        ASSERT_TRUE(d.ok());
        const DeviceVector<std::uint8_t> bins(
            std::vector<std::uint8_t>(payload.begin() + static_cast<std::ptrdiff_t>(d->bins_at),
                                      payload.begin() + static_cast<std::ptrdiff_t>(d->bins_at + P)));
        DeviceVector<float> scales(std::uint64_t{P} * shape.tokens);
        DeviceVector<std::uint8_t> symbols(shape.elements());
        DeviceVector<std::uint32_t> failed(std::vector<std::uint32_t>{~0u});
        kernels::CacheGenQuantizeArgs q;
        q.kv = dkv.get();
        q.bins = bins.get();
        q.scales = scales.get();
        q.symbols = symbols.get();
        q.failed = failed.get();
        q.n_planes = P;
        q.channels = C;
        q.tokens = shape.tokens;
        q.dtype = dtype;
        CUDA_OK(kernels::launch_cachegen_quantize(q, nullptr));
        const DeviceVector<std::uint32_t> cum(d->cum), cum_at(d->cum_at);
        kernels::CacheGenEncodeArgs e;
        e.symbols = symbols.get();
        e.bins = bins.get();
        e.cum = cum.get();
        e.cum_at = cum_at.get();
        e.n_planes = P;
        e.channels = C;
        e.tokens = shape.tokens;
        e.stream_tokens = d->stream_tokens;
        e.groups = d->groups;
        DeviceVector<std::uint8_t> out(kernels::cachegen_encode_threads(e) * kernels::cachegen_stream_cap(e));
        DeviceVector<std::uint32_t> lengths(kernels::cachegen_encode_threads(e));
        e.out = out.get();
        e.lengths = lengths.get();
        CUDA_OK(kernels::launch_cachegen_encode(e, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        EXPECT_EQ(failed.Download()[0], ~0u);
        const std::vector<float> hsc = scales.Download();
        EXPECT_EQ(std::memcmp(hsc.data(), payload.data() + d->scales_at, 4 * hsc.size()), 0) << "scales";
        const std::vector<std::uint8_t> ho = out.Download();
        const std::vector<std::uint32_t> hl = lengths.Download();
        const std::vector<Bytes> want = PayloadStreams(payload, *d);
        for (std::uint64_t i = 0; i < hl.size(); ++i) {
          ASSERT_LE(hl[i], kernels::cachegen_stream_cap(e)) << "stream " << i;
          const std::uint8_t* first = ho.data() + i * kernels::cachegen_stream_cap(e);
          EXPECT_TRUE(Bytes(first, first + hl[i]) == want[i]) << "stream " << i;
        }
      }
    }
  }
}

#endif  // KDN_HAVE_CUDA

}  // namespace
}  // namespace kdn::codec
