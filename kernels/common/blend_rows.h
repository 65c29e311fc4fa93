// SPDX-License-Identifier: Apache-2.0
// The blender's row operations on the device (a blend composed where the
// engine's layers run: core/blend/blend.h, ComposeOnDevice): the element
// math shared by the CUDA kernels (blend_rows.cuh) and their CPU path
// (ref/blend_rows_ref.h), which the emulated device runs.
//
// - Gathering rows: dst row i = src row rows[i] (float rows of `width`
//   elements): the running rows' hidden states, compacted after a check
//   layer, and the placed keys of the rows saved before a check layer.
// - A row's deviation: sum over e of (plane[plane_row][e] - saved[saved_row][e])^2,
//   accumulated in double in ascending e, as the host blend sums it, so the
//   same keys give the same deviation (and selection) on either side.
// - The composed KV in the model's dtype: float -> f16 / bf16 by
//   common/half.h's conversions (round to nearest even), as the host's
//   FromFloat converts.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/hd.h"

namespace kdn::kernels {

// Element e of a row gather of `width`-float rows: (row i, column c) with
// e = i * width + c.
KDN_HD void gather_rows_element(float* dst, const float* src, const std::int32_t* rows, std::int64_t width,
                                std::int64_t e) {
  const std::int64_t i = e / width, c = e - i * width;
  dst[e] = src[static_cast<std::int64_t>(rows[i]) * width + c];
}

// One term of a deviation sum (element e of the pair of rows).
KDN_HD double deviation_term(const float* plane, const float* saved, std::int64_t plane_row, std::int64_t saved_row,
                             std::int64_t width, std::int64_t e) {
  const double x = static_cast<double>(plane[plane_row * width + e]) - saved[saved_row * width + e];
  return x * x;
}

// Deviation of one pair of rows, summed in ascending order (the CPU path,
// and the CUDA kernel's one thread per pair).
KDN_HD double row_deviation(const float* plane, const float* saved, std::int64_t plane_row, std::int64_t saved_row,
                            std::int64_t width) {
  double d = 0;
  for (std::int64_t e = 0; e < width; ++e) d += deviation_term(plane, saved, plane_row, saved_row, width, e);
  return d;
}

// Element i of a float -> dtype conversion (dtype 0 f32, 1 f16, 2 bf16).
KDN_HD void float_to_dtype_element(std::uint32_t dtype, const float* src, void* dst, std::int64_t i) {
  if (dtype == 0) {
    static_cast<float*>(dst)[i] = src[i];
  } else if (dtype == 1) {
    static_cast<std::uint16_t*>(dst)[i] = float_to_half(src[i]);
  } else {
    static_cast<std::uint16_t*>(dst)[i] = float_to_bf16(src[i]);
  }
}

}  // namespace kdn::kernels
