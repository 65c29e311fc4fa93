// SPDX-License-Identifier: Apache-2.0
// Element conversions between a model's KV dtype (kdn_dtype: 0 f32, 1 f16,
// 2 bf16) and float32, for code that computes in float on KV stored in the
// model's own type (blending).
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/common/half.h"

namespace kdn {

// The dtype and its size (kernels/common/dtype.h: one definition for host
// and device code).
using kernels::Dtype;
using kernels::DtypeBytes;

// n elements of `dtype` at `in` as floats.
inline void ToFloat(std::uint32_t dtype, const std::uint8_t* in, std::size_t n, float* out) {
  if (dtype == 0) {
    std::memcpy(out, in, n * 4);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = dtype == 1 ? kernels::half_to_float(h) : kernels::bf16_to_float(h);
  }
}

// n floats as elements of `dtype` at `out`.
inline void FromFloat(std::uint32_t dtype, const float* in, std::size_t n, std::uint8_t* out) {
  if (dtype == 0) {
    std::memcpy(out, in, n * 4);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = dtype == 1 ? kernels::float_to_half(in[i]) : kernels::float_to_bf16(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

}  // namespace kdn
