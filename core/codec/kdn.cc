// SPDX-License-Identifier: Apache-2.0
// kdn: kdn's own compressing codec. Uniform scalar quantization with a step
// per (layer, k|v, channel), followed by static-model rANS with interleaved
// states; the first few tokens of the chunk (attention sinks) travel as half
// floats. What was measured to choose this design is in
// docs/codecs.md.
//
// Quantization (kernels/common/kdn_quant.h). A plane is one layer's keys or
// values of the chunk: tokens x C channels (C = kv_heads * head_dim). Sink
// tokens [0, S) are stored as half floats; the others are quantized per
// channel c: off_c = the channel's mean (as a half), code = rint((x - off_c)
// / step_c) in [-127, 127], x' = code * step_c + off_c (rounded once). The step is
//   step_c = step * mul(layer, k|v) * sigma_c^alpha * sigma_plane^(1 - alpha)
// where sigma_c is the channel's RMS deviation from off_c, sigma_plane the
// RMS over the plane; mul is `vmul` for values (1 for keys) times the
// layer's weight from `lw`; then raised to at least max|x - off_c| / 127
// (so no value clips) and kKdnMinStep, and rounded up to a half. The error
// of every quantized element is at most step_c / 2 (plus a few ulps).
//
// Entropy coding: one static rANS model (12-bit, core/codec/rans.h's table
// format) per plane over symbols code - min_code; the plane's channels are
// cut into groups of `group` channels (the last may be smaller), and each
// group is one independent stream (kernels/common/kdn_quant.h:
// kdn_decode_stream) with `lanes` interleaved states, so a decoder (one GPU
// thread, or one CPU core) runs streams in parallel and lanes in flight.
//
// Payload: header (param0 = S, the sink tokens requested; param1 = group |
// lanes << 16), then per plane, in order (layer, k|v):
//   min_code        i8, in [-127, 127]
//   off             C x f16
//   step            C x f16
//   sinks           min(S, tokens) x C x f16, token-major
//   table           rans::SerializeTable (scale 12, n <= 255 symbols,
//                   min_code + n - 1 <= 127)
//   lengths         G x u32, G = ceil(C / group)
//   streams         G streams, their bytes back to back
// Decode requires every byte to be consumed and rejects (kCorrupt) any
// inconsistency: bad codes range, non-finite halves, negative steps, values
// that overflow the output dtype, tables, lengths or streams that do not
// decode exactly.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core/codec/kdn_encode_avx2.h"
#include "core/codec/kdn_simd.h"
#include "core/codec/payload.h"
#include "core/codec/profile.h"
#include "core/codec/rans.h"
#include "kernels/common/half.h"
#include "kernels/common/kdn_quant.h"

namespace kdn::codec::internal {
namespace {

using kernels::kKdnMaxCode;

constexpr std::uint32_t kMaxSinks = 1024, kMaxGroup = 0xFFFF;

struct Params {
  double step = 0.5;   // relative step (in units of the plane's RMS deviation)
  double alpha = 0.5;  // 0: one step per plane; 1: steps proportional to each channel's RMS
  double vmul = 1.0;   // values' step relative to keys'
  std::uint32_t sinks = 4;
  std::uint32_t group = 32;
  std::uint32_t lanes = 8;
  std::vector<double> plane_weight;  // empty: 1 for every plane (layer, k|v)
};

void PutU16At(Bytes& out, size_t at, std::uint16_t v) {
  out[at] = static_cast<std::uint8_t>(v);
  out[at + 1] = static_cast<std::uint8_t>(v >> 8);
}
std::uint16_t GetU16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | p[1] << 8); }
void PutU32At(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t GetU32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

// How the encoder codes a quantized value: indexed by code + kKdnMaxCode.
struct Coding {
  std::uint32_t start = 0, freq = 0;
  std::uint64_t rcp = 0;
};

// Codes the symbols of one stream (kernels/common/kdn_quant.h): tokens
// [0, tokens) x channels [c0, c0 + width) of `codes` (code + kKdnMaxCode
// per element, rows of `row` bytes), token-major, with `lanes` interleaved
// states, backwards into the words below `end` (2 * lanes + tokens * width
// of them are free). Returns the stream's size in bytes: the size / 2 words
// below `end` (the states first, as u32 halves). The states' 2 * lanes
// words sit below the symbols' words, so the put's word of room below `ptr`
// always exists.
std::uint64_t EncodeStream(const std::uint8_t* codes, std::uint64_t row, std::uint64_t c0, std::uint64_t width,
                           std::uint64_t tokens, const Coding* coding, std::uint32_t lanes, std::uint16_t* end) {
  const std::uint64_t count = tokens * width;
  std::uint16_t* ptr = end;
  std::uint32_t state[kernels::kKdnMaxLanes];
  for (std::uint32_t l = 0; l < lanes; ++l) state[l] = kernels::kKdnRansLow;
  auto put = [&ptr](std::uint32_t x, const Coding& k) { return kernels::kdn_rans_put(x, k.start, k.freq, k.rcp, ptr); };
  if (lanes == 8 && width % 8 == 0) {
    // Every row starts at lane 0: walk rows and blocks of 8 backwards, lanes
    // 7..0, with the states in registers.
    std::uint32_t x0 = state[0], x1 = state[1], x2 = state[2], x3 = state[3], x4 = state[4], x5 = state[5],
                  x6 = state[6], x7 = state[7];
    for (std::uint64_t t = tokens; t-- > 0;) {
      const std::uint8_t* r = codes + t * row + c0;
      for (std::uint64_t c = width; c > 0; c -= 8) {
        const std::uint8_t* b = r + c - 8;
        x7 = put(x7, coding[b[7]]);
        x6 = put(x6, coding[b[6]]);
        x5 = put(x5, coding[b[5]]);
        x4 = put(x4, coding[b[4]]);
        x3 = put(x3, coding[b[3]]);
        x2 = put(x2, coding[b[2]]);
        x1 = put(x1, coding[b[1]]);
        x0 = put(x0, coding[b[0]]);
      }
    }
    state[0] = x0, state[1] = x1, state[2] = x2, state[3] = x3, state[4] = x4, state[5] = x5, state[6] = x6,
    state[7] = x7;
  } else {
    std::uint32_t lane = static_cast<std::uint32_t>((count + lanes - 1) % lanes);
    for (std::uint64_t t = tokens; t-- > 0;) {
      const std::uint8_t* r = codes + t * row + c0;
      for (std::uint64_t c = width; c-- > 0;) {
        state[lane] = put(state[lane], coding[r[c]]);
        lane = lane == 0 ? lanes - 1 : lane - 1;
      }
    }
  }
  for (std::uint32_t l = lanes; l-- > 0;) {
    *--ptr = static_cast<std::uint16_t>(state[l] >> 16);
    *--ptr = static_cast<std::uint16_t>(state[l] & 0xFFFFu);
  }
  static_assert(std::endian::native == std::endian::little, "streams are written as the memory image");
  return 2 * static_cast<std::uint64_t>(end - ptr);
}

// The encoder's buffers, kept per thread across calls (as zstd.cc keeps its
// contexts): a plane's floats and statistics, and a batch of planes' heads,
// codes, models and streams.
struct EncodeScratch {
  std::vector<float> x, off, step, maxdev;
  std::vector<double> sum, var;
  std::vector<std::uint8_t> code, heads;
  std::vector<Coding> coding;
  std::vector<std::uint32_t> packed;
  std::vector<std::uint16_t> words;
  std::vector<std::uint64_t> bytes;
  std::vector<size_t> head_end;
  // Releases the buffers a large chunk grew past a few MiB.
  void Trim() {
    constexpr size_t kKeep = size_t{8} << 20;
    if (x.capacity() * sizeof(float) > kKeep) std::vector<float>().swap(x);
    if (code.capacity() > kKeep) std::vector<std::uint8_t>().swap(code);
    if (heads.capacity() > kKeep) std::vector<std::uint8_t>().swap(heads);
    if (words.capacity() * sizeof(std::uint16_t) > kKeep) std::vector<std::uint16_t>().swap(words);
  }
};
thread_local EncodeScratch t_encode_scratch;

#if defined(__x86_64__)
// Halves to floats with the F16C instructions (exact, like half_to_float).
__attribute__((target("avx,f16c"))) void HalvesToFloatsF16c(const std::uint8_t* p, std::uint64_t n, float* out) {
  std::uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = kernels::half_to_float(static_cast<std::uint16_t>(p[2 * i] | p[2 * i + 1] << 8));
}
// Floats to halves with the F16C instructions (round to nearest even, like
// float_to_half).
__attribute__((target("avx,f16c"))) void FloatsToHalvesF16c(const float* in, std::uint32_t n, std::uint16_t* out) {
  std::uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = kernels::float_to_half(in[i]);
}
// F16C and AVX (with the OS saving the AVX state), from cpuid: clang 14's
// __builtin_cpu_supports does not know "f16c".
bool HaveF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool f16c = (c & bit_F16C) != 0, avx = (c & bit_AVX) != 0, osxsave = (c & bit_OSXSAVE) != 0;
  if (!(f16c && avx && osxsave)) return false;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0x6u) == 0x6u;  // XMM and YMM state enabled
}
const bool kHaveF16c = HaveF16c();
#endif

// n floats as 16-bit elements of `dtype` (1 f16, 2 bf16).
void FloatsToElements(std::uint32_t dtype, const float* in, std::uint32_t n, std::uint16_t* out) {
#if defined(__x86_64__)
  if (dtype == 1 && kHaveF16c) {
    FloatsToHalvesF16c(in, n, out);
    return;
  }
#endif
  for (std::uint32_t i = 0; i < n; ++i) out[i] = dtype == 1 ? kernels::float_to_half(in[i]) : kernels::float_to_bf16(in[i]);
}

// Elements [first, first + n) of a KV buffer of `dtype` as floats.
void LoadPlane(std::uint32_t dtype, const std::uint8_t* kv, std::uint64_t first, std::uint64_t n, float* out) {
  if (dtype == 0) {
    if (n > 0) std::memcpy(out, kv + 4 * first, 4 * n);
    return;
  }
  const std::uint8_t* p = kv + 2 * first;
#if defined(__x86_64__)
  if (dtype == 1 && kHaveF16c) {
    HalvesToFloatsF16c(p, n, out);
    return;
  }
#endif
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint16_t h = static_cast<std::uint16_t>(p[2 * i] | p[2 * i + 1] << 8);
    out[i] = dtype == 1 ? kernels::half_to_float(h) : kernels::bf16_to_float(h);
  }
}

bool HalfFinite(std::uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

// A float held in a double (exactly).
float F(double v) { return static_cast<float>(v); }

class KdnCodec final : public Codec {
 public:
  KdnCodec(Spec spec, Params p) : spec_(std::move(spec)), p_(std::move(p)) {}
  CodecId id() const override { return CodecId::kKdn; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    if (!p_.plane_weight.empty() && p_.plane_weight.size() != 2 * std::uint64_t{shape.layers}) {
      return Status::InvalidArgument("kdn codec: pw gives " + std::to_string(p_.plane_weight.size()) +
                                     " plane weights for a model of " + std::to_string(shape.layers) +
                                     " layers (expected 2 per layer: keys, values)");
    }
    const std::uint64_t L = shape.layers, T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
    const std::uint64_t S = std::min<std::uint64_t>(p_.sinks, T), Tn = T - S;
    const std::uint64_t G = (C + p_.group - 1) / p_.group;
    Bytes out(kHeaderBytes);
    WriteHeader(Header{CodecId::kKdn, shape, p_.sinks, p_.group | p_.lanes << 16}, out.data());
    EncodeScratch& s = t_encode_scratch;
    struct TrimOnExit {
      EncodeScratch& s;
      ~TrimOnExit() { s.Trim(); }
    } trim{s};
    const bool avx2 = KdnEncodeAvx2();
    s.x.resize(T * C);
    // Planes are prepared a batch at a time (enough streams to code
    // kKdnEncodeStreams in lock-step), then their streams are coded and the
    // batch appended: plane head, lengths, streams.
    const std::uint64_t batch = G == 0 ? 2 * L : std::max<std::uint64_t>(1, (kKdnEncodeStreams + G - 1) / G);
    const std::uint64_t region = 2 * std::uint64_t{p_.lanes} + Tn * std::min<std::uint64_t>(p_.group, C);
    s.code.resize(std::min(batch, 2 * L) * Tn * C);
    s.words.resize(std::min(batch, 2 * L) * G * region);
    s.bytes.resize(std::min(batch, 2 * L) * G);
    s.coding.resize(std::min(batch, 2 * L) * (2 * kKdnMaxCode + 1));
    s.packed.resize(std::min(batch, 2 * L) * (2 * kKdnMaxCode + 1));
    s.head_end.resize(std::min(batch, 2 * L));
    for (std::uint64_t first = 0; first < 2 * L; first += batch) {
      const std::uint64_t planes = std::min(batch, 2 * L - first);
      s.heads.clear();
      for (std::uint64_t i = 0; i < planes; ++i) {
        KDN_RETURN_IF_ERROR(PreparePlane(shape, kv, first + i, s.code.data() + i * Tn * C,
                                         s.coding.data() + i * (2 * kKdnMaxCode + 1),
                                         s.packed.data() + i * (2 * kKdnMaxCode + 1), avx2, &s));
        s.head_end[i] = s.heads.size();
      }
      // The streams: each codes backwards into its own region of words.
      KdnEncodeJob jobs[kKdnEncodeStreams];
      std::uint64_t job_index[kKdnEncodeStreams];
      int n_jobs = 0;
      auto flush = [&] {
        if (n_jobs > 0) KdnEncodeStreamsAvx2(jobs, n_jobs);
        for (int j = 0; j < n_jobs; ++j) s.bytes[job_index[j]] = jobs[j].bytes;
        n_jobs = 0;
      };
      for (std::uint64_t i = 0; i < planes; ++i) {
        for (std::uint64_t g = 0; g < G; ++g) {
          const std::uint64_t c0 = g * p_.group, width = std::min(C, c0 + p_.group) - c0;
          const std::uint8_t* codes = s.code.data() + i * Tn * C;
          std::uint16_t* end = s.words.data() + (i * G + g + 1) * region;
          if (avx2 && p_.lanes == 8 && width % 8 == 0 && width > 0) {
            if (n_jobs > 0 && jobs[0].width != width) flush();
            jobs[n_jobs] = KdnEncodeJob{codes + c0, C, width, Tn, s.packed.data() + i * (2 * kKdnMaxCode + 1), end};
            job_index[n_jobs] = i * G + g;
            if (++n_jobs == kKdnEncodeStreams) flush();
          } else {
            s.bytes[i * G + g] = EncodeStream(codes, C, c0, width, Tn, s.coding.data() + i * (2 * kKdnMaxCode + 1),
                                              p_.lanes, end);
          }
        }
      }
      flush();
      for (std::uint64_t i = 0; i < planes; ++i) {
        const size_t head_begin = i == 0 ? 0 : s.head_end[i - 1];
        std::uint64_t total = 0;
        for (std::uint64_t g = 0; g < G; ++g) {
          if (s.bytes[i * G + g] > 0xFFFFFFFFull) return Status::InvalidArgument("kdn codec: a stream exceeds 4 GiB");
          total += s.bytes[i * G + g];
        }
        size_t at = out.size();
        out.resize(at + (s.head_end[i] - head_begin) + 4 * G + total);
        std::memcpy(out.data() + at, s.heads.data() + head_begin, s.head_end[i] - head_begin);
        at += s.head_end[i] - head_begin;
        for (std::uint64_t g = 0; g < G; ++g) {
          PutU32At(out.data() + at + 4 * g, static_cast<std::uint32_t>(s.bytes[i * G + g]));
        }
        at += 4 * G;
        for (std::uint64_t g = 0; g < G; ++g) {
          const std::uint64_t bytes = s.bytes[i * G + g];
          std::memcpy(out.data() + at, s.words.data() + (i * G + g + 1) * region - bytes / 2, bytes);
          at += bytes;
        }
      }
    }
    return out;
  }

  // Prepares plane `plane` of the chunk for coding: appends its head (min
  // code, offsets, steps, sinks, table) to s->heads, writes its codes (code
  // + kKdnMaxCode, Tn x C) to `code` and its symbols' model, indexed by code
  // + kKdnMaxCode, to `coding` (EncodeStream's) and `packed` (start | freq
  // << 16, KdnEncodeStreamsAvx2's). With `avx2`, the statistics and the
  // quantization run in kdn_encode_avx2.cc (the same results).
  Status PreparePlane(const Shape& shape, const std::uint8_t* kv, std::uint64_t plane, std::uint8_t* code,
                      Coding* coding, std::uint32_t* packed, bool avx2, EncodeScratch* s) const {
    const std::uint64_t T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
    const std::uint64_t S = std::min<std::uint64_t>(p_.sinks, T), Tn = T - S;
    const std::uint64_t kv_index = plane % 2;
    float* const x = s->x.data();
    LoadPlane(shape.dtype, kv, plane * T * C, T * C, x);
    // Offsets and spreads per channel, over the non-sink tokens (a
    // non-finite value makes its channel's sum non-finite; sinks are
    // checked as they are written).
    s->sum.assign(C, 0.0);
    s->var.assign(C, 0.0);
    s->maxdev.assign(C, 0.0f);
    s->off.resize(C);
    s->step.resize(C);
    double* const sum = s->sum.data();
    double* const var = s->var.data();
    float* const maxdev = s->maxdev.data();
    float* const off = s->off.data();
    float* const step = s->step.data();
    if (avx2) {
      KdnSumAvx2(x, C, S, T, sum);
    } else {
      for (std::uint64_t t = S; t < T; ++t) {
        for (std::uint64_t c = 0; c < C; ++c) sum[c] += x[t * C + c];
      }
    }
    for (std::uint64_t c = 0; c < C; ++c) {
      if (!std::isfinite(sum[c])) return Status::InvalidArgument("kdn codec: the KV holds a non-finite value");
      const double mean = Tn == 0 ? 0.0 : sum[c] / static_cast<double>(Tn);
      const double clamped = std::clamp(mean, -double{kernels::kKdnMaxHalf}, double{kernels::kKdnMaxHalf});
      off[c] = kernels::half_to_float(kernels::float_to_half(static_cast<float>(clamped)));
    }
    if (avx2) {
      KdnSpreadAvx2(x, C, S, T, off, var, maxdev);
    } else {
      for (std::uint64_t t = S; t < T; ++t) {
        for (std::uint64_t c = 0; c < C; ++c) {
          const float d = x[t * C + c] - off[c];
          var[c] += static_cast<double>(d) * d;
          maxdev[c] = std::max(maxdev[c], std::fabs(d));
        }
      }
    }
    double plane_var = 0;
    for (std::uint64_t c = 0; c < C; ++c) {
      var[c] = Tn == 0 ? 0.0 : var[c] / static_cast<double>(Tn);
      plane_var += var[c];
    }
    const double plane_sigma = std::sqrt(plane_var / static_cast<double>(std::max<std::uint64_t>(C, 1)));
    double mul = p_.step * (kv_index == 1 ? p_.vmul : 1.0);
    if (!p_.plane_weight.empty()) mul *= p_.plane_weight[plane];
    const double plane_part = std::pow(plane_sigma, 1.0 - p_.alpha);
    Bytes& head = s->heads;
    const size_t head_at = head.size();
    head.resize(head.size() + 1 + 4 * C + 2 * S * C);
    for (std::uint64_t c = 0; c < C; ++c) {
      const double sigma_c = std::sqrt(var[c]);
      double st = mul * std::pow(sigma_c, p_.alpha) * plane_part;
      // No clipping: every value within kKdnMaxCode steps (a hair of slack
      // for the division's rounding).
      st = std::max({st, double{maxdev[c]} / (kKdnMaxCode - 0.5), double{kernels::kKdnMinStep}});
      if (!(st <= kernels::kKdnMaxHalf)) {
        return Status::InvalidArgument("kdn codec: KV values too large for half-float steps (spread " +
                                       std::to_string(maxdev[c]) + ")");
      }
      const std::uint16_t h = kernels::kdn_step_to_half(static_cast<float>(st));
      step[c] = kernels::half_to_float(h);
      PutU16At(head, head_at + 1 + 2 * c, kernels::float_to_half(off[c]));
      PutU16At(head, head_at + 1 + 2 * C + 2 * c, h);
    }
    for (std::uint64_t t = 0; t < S; ++t) {
      for (std::uint64_t c = 0; c < C; ++c) {
        const float v = x[t * C + c];
        if (!std::isfinite(v)) return Status::InvalidArgument("kdn codec: the KV holds a non-finite value");
        if (!FitsDtype(1, std::fabs(v))) {
          return Status::InvalidArgument("kdn codec: a sink token's value does not fit a half float");
        }
        PutU16At(head, head_at + 1 + 4 * C + 2 * (t * C + c), kernels::float_to_half(v));
      }
    }
    std::uint64_t hist[2 * kKdnMaxCode + 1] = {};
    if (avx2) {
      KdnQuantizeAvx2(x + S * C, C, Tn, off, step, code, hist);
    } else {
      for (std::uint64_t t = 0; t < Tn; ++t) {
        const float* xt = x + (S + t) * C;
        std::uint8_t* ct = code + t * C;
        for (std::uint64_t c = 0; c < C; ++c) {
          ct[c] = static_cast<std::uint8_t>(kernels::kdn_quantize(xt[c], off[c], step[c]) + kKdnMaxCode);
          ++hist[ct[c]];
        }
      }
    }
    std::int32_t lo = 0, hi = 0;  // the smallest and largest code + kKdnMaxCode
    if (Tn > 0 && C > 0) {
      while (hist[lo] == 0) ++lo;
      hi = 2 * kKdnMaxCode;
      while (hist[hi] == 0) --hi;
    } else {
      lo = hi = kKdnMaxCode;
    }
    head[head_at] = static_cast<std::uint8_t>(static_cast<std::int8_t>(lo - kKdnMaxCode));
    // The decoder checks that every channel's values over the plane's code
    // range fit the dtype (so its output is never inf): refuse KV that
    // close to the dtype's limit rather than write what cannot decode.
    for (std::uint64_t c = 0; c < C; ++c) {
      const float a = kernels::kdn_dequantize(lo - kKdnMaxCode, off[c], step[c]);
      const float b = kernels::kdn_dequantize(hi - kKdnMaxCode, off[c], step[c]);
      if (!FitsDtype(shape.dtype, std::fmax(std::fabs(a), std::fabs(b)))) {
        return Status::InvalidArgument("kdn codec: KV values too close to the dtype's largest value");
      }
    }
    Result<rans::FreqTable> table = rans::BuildTable(
        std::span<const std::uint64_t>(hist + lo, static_cast<size_t>(hi - lo + 1)), kernels::kKdnScaleBits);
    if (!table.ok()) return table.status();
    rans::SerializeTable(*table, &head);
    std::fill(coding, coding + 2 * kKdnMaxCode + 1, Coding{});
    std::fill(packed, packed + 2 * kKdnMaxCode + 1, 0u);
    for (size_t k = 0; k < table->freq.size(); ++k) {
      const std::uint32_t f = table->freq[k];
      coding[lo + k] = Coding{table->cum[k], f, f == 0 ? 0 : kernels::kdn_rcp(f)};
      packed[lo + k] = table->cum[k] | f << 16;
    }
    return Status::Ok();
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Result<Header> h = ReadHeader(CodecId::kKdn, shape, data, size);
    if (!h.ok()) return h.status();
    const std::uint32_t sinks = h->param0, group = h->param1 & 0xFFFFu, lanes = h->param1 >> 16;
    if (sinks > kMaxSinks || group < 1 || lanes < 1 || lanes > kernels::kKdnMaxLanes) {
      return Status::Corrupt("kdn payload: bad parameters (sinks " + std::to_string(sinks) + ", group " +
                             std::to_string(group) + ", lanes " + std::to_string(lanes) + ")");
    }
    switch (shape.dtype) {
      case 0: return DecodeAs<float>(shape, sinks, group, lanes, data, size, out);
      default: return DecodeAs<std::uint16_t>(shape, sinks, group, lanes, data, size, out);
    }
  }

 private:
  template <typename E>
  static Status DecodeAs(const Shape& shape, std::uint32_t sinks, std::uint32_t group, std::uint32_t lanes,
                         const std::uint8_t* data, size_t size, std::uint8_t* out_bytes) {
    const std::uint64_t L = shape.layers, T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
    const std::uint64_t S = std::min<std::uint64_t>(sinks, T), Tn = T - S;
    const std::uint64_t G = (C + group - 1) / group;
    std::uint64_t pos = kHeaderBytes;
    auto need = [&](std::uint64_t n, const char* what) -> Status {
      if (n > size - pos) return Status::Corrupt(std::string("kdn payload: truncated in the ") + what);
      return Status::Ok();
    };
    // Streams are parsed in order and decoded kKdnSimdStreams at a time
    // (kdn_simd.h): the slot tables of the planes they come from (a ring:
    // pending streams span at most kKdnSimdStreams planes) and their luts
    // are kept per thread, across calls.
    struct Scratch {
      std::vector<std::uint32_t> slots[kKdnSimdStreams];
      std::vector<double> off[kKdnSimdStreams], step[kKdnSimdStreams];
      std::vector<E> lut[kKdnSimdStreams];
    };
    thread_local Scratch scratch;
    KdnStream<E> pending[kKdnSimdStreams];
    std::uint64_t pending_plane[kKdnSimdStreams] = {}, pending_group[kKdnSimdStreams] = {};
    int n_pending = 0;
    auto flush = [&]() -> Status {
      const int bad = DecodeKdnStreams(pending, n_pending);
      n_pending = 0;
      if (bad < 0) return Status::Ok();
      return Status::Corrupt("kdn payload: stream " + std::to_string(pending_group[bad]) + " of plane " +
                             std::to_string(pending_plane[bad]) + " does not decode");
    };
    E* out = reinterpret_cast<E*>(out_bytes);
    Status status = [&]() -> Status {
      for (std::uint64_t plane = 0; plane < L * 2; ++plane) {
        KDN_RETURN_IF_ERROR(need(1 + 4 * C + 2 * S * C, "plane header"));
        const std::int32_t min_code = static_cast<std::int8_t>(data[pos]);
        if (min_code < -kKdnMaxCode) return Status::Corrupt("kdn payload: min code -128");
        const std::uint8_t* halves = data + pos + 1;
        // No pending stream reads this plane's ring entries: they come from
        // the last kKdnSimdStreams - 1 planes at most (a full batch is
        // decoded at once).
        std::vector<double>& off = scratch.off[plane % kKdnSimdStreams];
        std::vector<double>& step = scratch.step[plane % kKdnSimdStreams];
        off.resize(C);
        step.resize(C);
        KDN_RETURN_IF_ERROR(ReadKdnScales(halves, C, plane, off.data(), step.data()));
        // Sinks: a finite half fits every dtype (f32, f16 as it is, bf16).
        const std::uint8_t* sink = halves + 4 * C;
        E* sink_out = out + plane * T * C;
        for (std::uint64_t i = 0; i < S * C; ++i) {
          const std::uint16_t hv = GetU16(sink + 2 * i);
          if (!HalfFinite(hv)) return Status::Corrupt("kdn payload: a non-finite sink value");
          if constexpr (sizeof(E) == 4) {
            sink_out[i] = kernels::half_to_float(hv);
          } else {
            sink_out[i] = shape.dtype == 1 ? hv : kernels::float_to_bf16(kernels::half_to_float(hv));
          }
        }
        pos += 1 + 4 * C + 2 * S * C;
        size_t consumed = 0;
        Result<rans::FreqTable> table =
            rans::ParseTable(std::span<const std::uint8_t>(data + pos, size - pos), &consumed);
        if (!table.ok()) return Status::Corrupt("kdn payload: " + table.status().message());
        pos += consumed;
        const std::uint32_t n = static_cast<std::uint32_t>(table->freq.size());
        if (table->scale_bits != kernels::kKdnScaleBits || min_code + static_cast<std::int32_t>(n) - 1 > kKdnMaxCode) {
          return Status::Corrupt("kdn payload: a table does not fit the codes of plane " + std::to_string(plane));
        }
        std::vector<std::uint32_t>& slots = scratch.slots[plane % kKdnSimdStreams];
        slots.resize(std::size_t{1} << kernels::kKdnScaleBits);
        for (std::uint32_t s = 0; s < n; ++s) {  // every slot of a symbol holds the same entry
          std::fill(slots.begin() + table->cum[s], slots.begin() + table->cum[s + 1],
                    kernels::kdn_slot_pack(s, table->cum[s], table->freq[s]));
        }
        KDN_RETURN_IF_ERROR(need(4 * G, "stream lengths"));
        const std::uint8_t* lengths = data + pos;
        pos += 4 * G;
        for (std::uint64_t g = 0; g < G; ++g) {
          const std::uint64_t c0 = g * group, c1 = std::min(C, c0 + group), width = c1 - c0;
          // Every value of the group must fit the dtype (values are linear in
          // the code: the two ends bound the rest). The SIMD path computes
          // them; the others take them from a table of every (channel,
          // symbol) value.
          for (std::uint64_t c = c0; c < c1; ++c) {
            const float lo = kernels::kdn_dequantize(min_code, F(off[c]), F(step[c]));
            const float hi =
                kernels::kdn_dequantize(min_code + static_cast<std::int32_t>(n) - 1, F(off[c]), F(step[c]));
            if (!FitsDtype(shape.dtype, std::fmax(std::fabs(lo), std::fabs(hi)))) {
              return Status::Corrupt("kdn payload: a decoded value overflows the dtype in plane " +
                                     std::to_string(plane));
            }
          }
          const bool computed = KdnSimdComputes(lanes, static_cast<std::uint32_t>(width));
          std::vector<E>& lut = scratch.lut[n_pending];
          if (!computed) {
            lut.resize(width * kernels::kKdnLutStride);
            for (std::uint64_t c = c0; c < c1; ++c) {
              E* row = lut.data() + (c - c0) * kernels::kKdnLutStride;
              float values[kernels::kKdnLutStride];
              for (std::uint32_t s = 0; s < n; ++s) {
                values[s] = kernels::kdn_dequantize(min_code + static_cast<std::int32_t>(s), F(off[c]), F(step[c]));
              }
              if constexpr (sizeof(E) == 2) {
                FloatsToElements(shape.dtype, values, n, row);
              } else {
                std::copy(values, values + n, row);
              }
            }
          }
          const std::uint32_t len = GetU32(lengths + 4 * g);
          KDN_RETURN_IF_ERROR(need(len, "streams"));
          pending[n_pending] = KdnStream<E>{data + pos,
                                            len,
                                            slots.data(),
                                            lanes,
                                            static_cast<std::uint32_t>(width),
                                            Tn,
                                            computed ? nullptr : lut.data(),
                                            out + (plane * T + S) * C + c0,
                                            C,
                                            computed ? step.data() + c0 : nullptr,
                                            computed ? off.data() + c0 : nullptr,
                                            min_code,
                                            shape.dtype,
                                            data + size};
          pending_plane[n_pending] = plane;
          pending_group[n_pending] = g;
          if (++n_pending == kKdnSimdStreams) KDN_RETURN_IF_ERROR(flush());
          pos += len;
        }
      }
      return flush();
    }();
    // Keep at most a few MiB per thread (a payload of huge groups may have
    // grown the luts).
    for (std::vector<E>& lut : scratch.lut) {
      if (lut.capacity() * sizeof(E) > (std::size_t{1} << 20)) std::vector<E>().swap(lut);
    }
    if (!status.ok()) return status;
    if (pos != size) {
      return Status::Corrupt("kdn payload: " + std::to_string(size - pos) + " bytes after the last stream");
    }
    return Status::Ok();
  }

  Spec spec_;
  Params p_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeKdn(const Spec& spec) {
  auto reject_unknown = [](const Spec& s) {
    return RejectUnknownParams(s, {"preset", "profile", "step", "alpha", "vmul", "sink", "group", "lanes", "pw"});
  };
  KDN_RETURN_IF_ERROR(reject_unknown(spec));
  const auto preset = spec.params.find("preset");
  const std::string name = preset == spec.params.end() ? "balanced" : preset->second;
  Params p;
  // The presets without a profile: steps measured on the reference model,
  // values coarser than keys (keys steer attention; see docs/codecs.md).
  if (name == "balanced") {
    p.step = 0.33;
  } else if (name == "hifi") {
    p.step = 0.10;
  } else {
    return Status::InvalidArgument("codec 'kdn': unknown preset '" + name + "' (known: balanced, hifi)");
  }
  // A profile (kdn codec calibrate) gives the preset's parameters for one
  // model; parameters given in the spec override it.
  std::map<std::string, std::string> params;
  if (auto it = spec.params.find("profile"); it != spec.params.end()) {
    Result<std::string> line = ReadProfile(it->second, name);
    if (!line.ok()) return line.status();
    Result<Spec> from = ParseSpec(*line);
    if (!from.ok()) return Status::InvalidArgument("codec profile '" + it->second + "': " + from.status().message());
    if (from->name != "kdn" || from->params.count("profile") || from->params.count("preset")) {
      return Status::InvalidArgument("codec profile '" + it->second + "': preset " + name +
                                     " must be a kdn spec without preset or profile");
    }
    KDN_RETURN_IF_ERROR(reject_unknown(*from));
    params = from->params;
  }
  for (const auto& [key, value] : spec.params) params[key] = value;
  p.vmul = params.count("pw") ? 1.0 : 2.5;
  const StepFields fields{&p.step, &p.vmul, &p.sinks, &p.lanes, &p.plane_weight};
  for (const auto& [key, value] : params) {
    Result<bool> shared = ParseStepField(key, value, fields);
    if (!shared.ok()) return shared.status();
    if (*shared) continue;
    if (key == "alpha") {
      Result<double> v = ParseFloat(key, value, 0, 1);
      if (!v.ok()) return v.status();
      p.alpha = *v;
    } else if (key == "group") {
      Result<std::uint32_t> v = ParseUint(key, value, 1, kMaxGroup);
      if (!v.ok()) return v.status();
      p.group = *v;
    }
  }
  // The spec as given (a preset stays named; explicit parameters override it).
  Spec normalized{"kdn", spec.params};
  if (preset == spec.params.end()) normalized.params["preset"] = "balanced";
  return std::unique_ptr<Codec>(new KdnCodec(std::move(normalized), std::move(p)));
}

}  // namespace kdn::codec::internal
