// SPDX-License-Identifier: Apache-2.0
// CUDA kernels of the blender's row operations (element math and contract:
// common/blend_rows.h; CPU path: ref/blend_rows_ref.h). Pointers are device
// memory, index arrays included. Each returns cudaErrorInvalidValue for a
// negative count or width, or a null pointer with work to do; cudaSuccess
// without launching when there is none; else the launch's error. None
// synchronizes, allocates or prints.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kdn::kernels {

cudaError_t launch_gather_rows(float* dst, const float* src, const std::int32_t* rows, std::int64_t n,
                               std::int64_t width, cudaStream_t stream);
// One thread per pair of rows, summing in ascending order: the CPU path's
// sums, bit for bit (a row is kv_dim elements: the per-thread loop is short
// next to the layer the engine ran to produce it).
cudaError_t launch_row_deviations(const float* plane, const float* saved, const std::int32_t* plane_rows,
                                  const std::int32_t* saved_rows, std::int64_t n, std::int64_t width, double* out,
                                  cudaStream_t stream);
cudaError_t launch_float_to_dtype(std::uint32_t dtype, const float* src, void* dst, std::int64_t n,
                                  cudaStream_t stream);

}  // namespace kdn::kernels
