// SPDX-License-Identifier: Apache-2.0
// Element math of scalar quantization, shared by the CPU codecs
// (core/codec) and their CUDA kernels:
// - symmetric: code = round(x / scale) in [-qmax, qmax], x' = code * scale,
//   scale = absmax / qmax (int8: qmax 127);
// - asymmetric min/max over a group, to `bits` bits (KIVI):
//   scale = (max - min) / (2^bits - 1), code = round((x - min) / scale) in
//   [0, 2^bits - 1], x' = min + code * scale.
// Rounding is to nearest even (rintf), divisions are IEEE (no fast-math
// reciprocals), so both paths produce the same codes. With exact arithmetic
// |x - x'| <= scale / 2; in float a few ulps more (the codec tests state it).
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/hd.h"

namespace kdn::kernels {

KDN_HD float quant_rint(float x) {
#if defined(__CUDA_ARCH__)
  return ::rintf(x);
#else
  return __builtin_rintf(x);
#endif
}

KDN_HD float quant_fabs(float x) { return x < 0.0f ? -x : x; }

// ---- symmetric

// The scale of a block whose largest magnitude is `absmax`: absmax / qmax
// (0 for an all-zero block, whose codes are then all 0).
KDN_HD float sym_scale(float absmax, float qmax) { return absmax / qmax; }

// round(x / scale) clamped to [-qmax, qmax]; 0 when scale is 0.
KDN_HD std::int32_t sym_quantize(float x, float scale, std::int32_t qmax) {
  if (!(scale > 0.0f)) return 0;
  float q = quant_rint(x / scale);
  const float lim = static_cast<float>(qmax);
  q = q > lim ? lim : (q < -lim ? -lim : q);
  return static_cast<std::int32_t>(q);
}

KDN_HD float sym_dequantize(std::int32_t code, float scale) { return static_cast<float>(code) * scale; }

// ---- scaled fp8 e4m3: code = e4m3(x / scale), scale = absmax / 448

KDN_HD std::uint8_t fp8_quantize(float x, float scale) {
  return scale > 0.0f ? float_to_e4m3(x / scale) : std::uint8_t{0};
}
KDN_HD float fp8_dequantize(std::uint8_t code, float scale) { return e4m3_to_float(code) * scale; }

// ---- asymmetric (KIVI)

KDN_HD std::int32_t asym_levels(std::int32_t bits) { return (1 << bits) - 1; }

// The scale of a group spanning [lo, hi]: (hi - lo) / (2^bits - 1).
KDN_HD float asym_scale(float lo, float hi, std::int32_t bits) {
  return (hi - lo) / static_cast<float>(asym_levels(bits));
}

// round((x - lo) / scale) clamped to [0, 2^bits - 1]; 0 when scale is 0.
KDN_HD std::uint32_t asym_quantize(float x, float lo, float scale, std::int32_t bits) {
  if (!(scale > 0.0f)) return 0;
  float q = quant_rint((x - lo) / scale);
  const float lim = static_cast<float>(asym_levels(bits));
  q = q > lim ? lim : (q < 0.0f ? 0.0f : q);
  return static_cast<std::uint32_t>(q);
}

KDN_HD float asym_dequantize(std::uint32_t code, float lo, float scale) {
  return lo + static_cast<float>(code) * scale;
}

// Packing of b-bit codes (b in {1, 2, 4, 8}), little-endian within a byte:
// code i of a stream sits at byte i * b / 8, bits (i * b) % 8 upwards.
KDN_HD std::uint64_t packed_bytes(std::uint64_t count, std::int32_t bits) {
  return (count * static_cast<std::uint64_t>(bits) + 7) / 8;
}
KDN_HD void pack_code(std::uint8_t* stream, std::uint64_t i, std::uint32_t code, std::int32_t bits) {
  const std::uint64_t bit = i * static_cast<std::uint64_t>(bits);
  const std::uint32_t mask = (1u << bits) - 1u;
  std::uint8_t& byte = stream[bit / 8];
  const std::uint32_t shift = static_cast<std::uint32_t>(bit % 8);
  byte = static_cast<std::uint8_t>((byte & ~(mask << shift)) | ((code & mask) << shift));
}
KDN_HD std::uint32_t unpack_code(const std::uint8_t* stream, std::uint64_t i, std::int32_t bits) {
  const std::uint64_t bit = i * static_cast<std::uint64_t>(bits);
  return (static_cast<std::uint32_t>(stream[bit / 8]) >> (bit % 8)) & ((1u << bits) - 1u);
}

}  // namespace kdn::kernels
