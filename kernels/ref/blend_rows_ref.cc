// SPDX-License-Identifier: Apache-2.0
#include "kernels/ref/blend_rows_ref.h"

#include "kernels/common/blend_rows.h"

namespace kdn::kernels {

void gather_rows_cpu(float* dst, const float* src, const std::int32_t* rows, std::int64_t n, std::int64_t width) {
  for (std::int64_t e = 0; e < n * width; ++e) gather_rows_element(dst, src, rows, width, e);
}

void row_deviations_cpu(const float* plane, const float* saved, const std::int32_t* plane_rows,
                        const std::int32_t* saved_rows, std::int64_t n, std::int64_t width, double* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = row_deviation(plane, saved, plane_rows[i], saved_rows[i], width);
}

void float_to_dtype_cpu(std::uint32_t dtype, const float* src, void* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) float_to_dtype_element(dtype, src, dst, i);
}

}  // namespace kdn::kernels
