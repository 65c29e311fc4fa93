// SPDX-License-Identifier: Apache-2.0
// Conversions between float and the narrow floating-point formats KV is
// stored in: IEEE binary16 (fp16), bfloat16 and OCP fp8 e4m3 (the "FN"
// variant: no infinities, NaN = 0x7F / 0xFF, largest finite 448).
// All float -> narrow conversions round to nearest, ties to even, in pure
// integer arithmetic, so the CPU path and the CUDA kernels produce the same
// bits whatever the FPU's mode. Shared by both through KDN_HD.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace kdn::kernels {

KDN_HD std::uint32_t float_bits(float f) {
  std::uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
KDN_HD float bits_float(std::uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// Shifts the 24-bit significand `m` right by `shift` (1..31), rounding to
// nearest even: the subnormal encodings of fp16 and fp8.
KDN_HD std::uint32_t shift_round_even(std::uint32_t m, std::uint32_t shift) {
  const std::uint32_t q = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1);
  const std::uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1))) ? 1u : 0u);
}

// ---- fp16 (IEEE binary16: 1 sign, 5 exponent bits with bias 15, 10 mantissa bits)

// Round to nearest even; overflow (|f| >= 65520) gives inf; NaN stays NaN
// (quiet, the top mantissa bits kept); subnormals are produced exactly.
KDN_HD std::uint16_t float_to_half(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax >= 0x7F800000u) {  // inf or NaN
    const std::uint32_t nan = ax > 0x7F800000u ? (0x200u | ((ax >> 13) & 0x3FFu)) : 0u;
    return static_cast<std::uint16_t>(sign | 0x7C00u | nan);
  }
  if (ax >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (ax >= 0x38800000u) {  // >= 2^-14: a normal half
    std::uint32_t r = ax + 0xFFFu + ((ax >> 13) & 1u);  // round the 13 dropped bits
    r -= 112u << 23;                                    // rebias 127 -> 15
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  // A half subnormal (units of 2^-24) or zero. value = m * 2^(e - 150).
  const std::uint32_t e = ax >> 23;
  const std::uint32_t shift = 126u - e;  // >= 14
  if (shift > 24) return static_cast<std::uint16_t>(sign);  // < 2^-25 (or the tie): zero
  const std::uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  return static_cast<std::uint16_t>(sign | shift_round_even(m, shift));
}

KDN_HD float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1Fu;
  std::uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return bits_float(sign | 0x7F800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    e = 113;  // normalize a subnormal: m * 2^-24 = 1.f * 2^(e - 127)
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    return bits_float(sign | (e << 23) | ((m & 0x3FFu) << 13));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

// ---- bf16 (the top half of a float)

// Round to nearest even; overflow gives inf; NaN stays NaN (made quiet).
KDN_HD std::uint16_t float_to_bf16(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

KDN_HD float bf16_to_float(std::uint16_t b) { return bits_float(std::uint32_t{b} << 16); }

// ---- fp8 e4m3 FN (1 sign, 4 exponent bits with bias 7, 3 mantissa bits)

inline constexpr float kFp8E4m3Max = 448.0f;
inline constexpr std::uint8_t kFp8E4m3Nan = 0x7F;

// Round to nearest even, saturating to +-448 (inf included); NaN -> 0x7F
// with the sign kept (0x7F or 0xFF). Subnormals (units of 2^-9) exactly.
KDN_HD std::uint8_t float_to_e4m3(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<std::uint8_t>(sign | kFp8E4m3Nan);
  if (ax >= 0x43E00000u) return static_cast<std::uint8_t>(sign | 0x7Eu);  // >= 448: saturate
  if (ax >= 0x3C800000u) {  // >= 2^-6: a normal e4m3; below 448, so never rounds to NaN
    std::uint32_t r = ax + 0x7FFFFu + ((ax >> 20) & 1u);  // round the 20 dropped bits
    r -= 120u << 23;                                      // rebias 127 -> 7
    return static_cast<std::uint8_t>(sign | (r >> 20));
  }
  const std::uint32_t e = ax >> 23;
  const std::uint32_t shift = 141u - e;  // >= 21
  if (shift > 24) return static_cast<std::uint8_t>(sign);  // < 2^-10 (or the tie): zero
  const std::uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  return static_cast<std::uint8_t>(sign | shift_round_even(m, shift));
}

KDN_HD bool e4m3_is_nan(std::uint8_t c) { return (c & 0x7Fu) == kFp8E4m3Nan; }

KDN_HD float e4m3_to_float(std::uint8_t c) {
  const std::uint32_t sign = (std::uint32_t{c} & 0x80u) << 24;
  const std::uint32_t e = (c >> 3) & 0xFu;
  const std::uint32_t m = c & 0x7u;
  if (e == 0xF && m == 0x7) return bits_float(sign | 0x7FC00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * 0.001953125f;  // m * 2^-9, exact
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 120u) << 23) | (m << 20));
}

}  // namespace kdn::kernels
