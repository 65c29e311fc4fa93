// SPDX-License-Identifier: Apache-2.0
// Vector decoding of kdn streams; the contract is in kdn_simd.h, the
// decoder itself in kdn_simd_x86.inc.
#include "core/codec/kdn_simd.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "kernels/common/kdn_quant.h"

namespace kdn::codec::internal {
namespace {

template <typename E>
bool DecodeScalar(const KdnStream<E>& s) {
  return kernels::kdn_decode_stream<E>(s.p, s.len, s.slots, s.lanes, s.channels, s.tokens, s.lut, s.out, s.row);
}

// A stream's values computed as its lut would hold them.
template <typename E>
struct Computed {
  const double* step;
  const double* off;
  std::int32_t min_code;
  std::uint32_t dtype;
  E operator()(std::uint64_t c, std::uint32_t sym) const {
    const float v = kernels::kdn_dequantize(min_code + static_cast<std::int32_t>(sym), static_cast<float>(off[c]),
                                            static_cast<float>(step[c]));
    if constexpr (sizeof(E) == 4) {
      return v;
    } else {
      return dtype == 1 ? kernels::float_to_half(v) : kernels::float_to_bf16(v);
    }
  }
};

#if defined(__x86_64__)

// The instruction sets the vector decoders need, from cpuid and the state
// the OS saves (clang 14's __builtin_cpu_supports does not know "f16c").
KdnSimd DetectSimd() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return KdnSimd::kNone;
  const bool avx = (c & bit_AVX) != 0, osxsave = (c & bit_OSXSAVE) != 0, f16c = (c & bit_F16C) != 0,
             popcnt = (c & bit_POPCNT) != 0;
  if (!(avx && osxsave && f16c && popcnt)) return KdnSimd::kNone;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x6u) != 0x6u || __get_cpuid_max(0, nullptr) < 7) return KdnSimd::kNone;  // XMM and YMM state
  __cpuid_count(7, 0, a, b, c, d);
  if ((b & bit_AVX2) == 0) return KdnSimd::kNone;
  const bool avx512 = (b & bit_AVX512F) && (b & bit_AVX512VL) && (b & bit_AVX512BW) && (c & bit_AVX512VBMI2);
  const bool zmm_state = (lo & 0xE6u) == 0xE6u;  // opmask and ZMM state too
  return avx512 && zmm_state ? KdnSimd::kAvx512 : KdnSimd::kAvx2;
}

constexpr const std::array<std::uint32_t, 256>& kWordIndex = kKdnSimdWordIndex;

#else
KdnSimd DetectSimd() { return KdnSimd::kNone; }
#endif

// The CPU's best, or less as KDN_CPU_SIMD says (none, avx2).
KdnSimd ChooseSimd() {
  const KdnSimd best = DetectSimd();
  const char* env = std::getenv("KDN_CPU_SIMD");
  if (env == nullptr) return best;
  const std::string want = env;
  const KdnSimd asked = want == "none" ? KdnSimd::kNone : want == "avx2" ? KdnSimd::kAvx2 : best;
  return std::min(asked, best);
}
// On first use (callers may be static initializers).
KdnSimd Simd() {
  static const KdnSimd simd = ChooseSimd();
  return simd;
}

#if defined(__x86_64__)
// The vector decoders, one per instruction set (kdn_simd_x86.inc).
namespace avx2 {
#define KDN_SIMD_TARGET __attribute__((target("avx2,f16c,popcnt")))
#define KDN_SIMD_WIDE 0
#include "core/codec/kdn_simd_x86.inc"
#undef KDN_SIMD_TARGET
#undef KDN_SIMD_WIDE
}  // namespace avx2
namespace avx512 {
#define KDN_SIMD_TARGET __attribute__((target("avx2,f16c,popcnt,avx512f,avx512vl,avx512bw,avx512vbmi2")))
#define KDN_SIMD_WIDE 1
#include "core/codec/kdn_simd_x86.inc"
#undef KDN_SIMD_TARGET
#undef KDN_SIMD_WIDE
}  // namespace avx512

#endif  // __x86_64__

bool Computes(std::uint32_t lanes, std::uint32_t channels) {
  return Simd() != KdnSimd::kNone && lanes == 8 && channels % 8 == 0 && channels > 0;
}

template <typename E>
int DecodeVector(const KdnStream<E>* s, int count) {
#if defined(__x86_64__)
  return Simd() == KdnSimd::kAvx512 ? avx512::DecodeVectorKind(s, count) : avx2::DecodeVectorKind(s, count);
#else
  (void)s, (void)count;
  return 0;  // never called: Computes is false
#endif
}

template <typename E>
int Decode(const KdnStream<E>* s, int count) {
  if (count <= 0) return -1;
  // The vector streams of one shape and dtype together, the others one by one.
  auto vector = [](const KdnStream<E>& x) { return x.step != nullptr && Computes(x.lanes, x.channels); };
  bool together = count <= kKdnSimdStreams;
  for (int i = 0; i < count && together; ++i) {
    together = vector(s[i]) && s[i].channels == s[0].channels && s[i].tokens == s[0].tokens && s[i].dtype == s[0].dtype;
  }
  if (together) return DecodeVector(s, count);
  for (int i = 0; i < count; ++i) {
    if (!(vector(s[i]) ? DecodeVector(s + i, 1) < 0 : DecodeScalar(s[i]))) return i;
  }
  return -1;
}

}  // namespace

KdnSimd KdnSimdInUse() { return Simd(); }

KdnSimd KdnSimdOfCpu() {
  static const KdnSimd simd = DetectSimd();
  return simd;
}

bool KdnSimdComputes(std::uint32_t lanes, std::uint32_t channels) { return Computes(lanes, channels); }

int DecodeKdnStreams(const KdnStream<std::uint16_t>* streams, int count) { return Decode(streams, count); }
int DecodeKdnStreams(const KdnStream<float>* streams, int count) { return Decode(streams, count); }

}  // namespace kdn::codec::internal
