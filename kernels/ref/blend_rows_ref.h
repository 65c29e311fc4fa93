// SPDX-License-Identifier: Apache-2.0
// The CPU path of the blender's row kernels (blend_rows.cuh): the same
// element functions (common/blend_rows.h), run in a loop. The emulated
// device runs these.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace kdn::kernels {

// dst row i = src row rows[i], n rows of `width` floats.
void gather_rows_cpu(float* dst, const float* src, const std::int32_t* rows, std::int64_t n, std::int64_t width);
// out[i] = deviation of plane row plane_rows[i] from saved row saved_rows[i].
void row_deviations_cpu(const float* plane, const float* saved, const std::int32_t* plane_rows,
                        const std::int32_t* saved_rows, std::int64_t n, std::int64_t width, double* out);
// dst = src converted to dtype (0 f32, 1 f16, 2 bf16), n elements.
void float_to_dtype_cpu(std::uint32_t dtype, const float* src, void* dst, std::int64_t n);

}  // namespace kdn::kernels
