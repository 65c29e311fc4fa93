// SPDX-License-Identifier: Apache-2.0
#include "kernels/blend_rows.cuh"

#include "kernels/common/blend_rows.h"

namespace kdn::kernels {
namespace {

constexpr int kThreads = 256;

unsigned GridFor(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

__global__ void GatherRowsKernel(float* dst, const float* src, const std::int32_t* rows, std::int64_t n,
                                 std::int64_t width) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n * width;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    gather_rows_element(dst, src, rows, width, e);
  }
}

__global__ void RowDeviationsKernel(const float* plane, const float* saved, const std::int32_t* plane_rows,
                                    const std::int32_t* saved_rows, std::int64_t n, std::int64_t width,
                                    double* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = row_deviation(plane, saved, plane_rows[i], saved_rows[i], width);
  }
}

__global__ void FloatToDtypeKernel(std::uint32_t dtype, const float* src, void* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float_to_dtype_element(dtype, src, dst, i);
  }
}

}  // namespace

cudaError_t launch_gather_rows(float* dst, const float* src, const std::int32_t* rows, std::int64_t n,
                               std::int64_t width, cudaStream_t stream) {
  if (n < 0 || width < 0) return cudaErrorInvalidValue;
  if (n == 0 || width == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr || rows == nullptr) return cudaErrorInvalidValue;
  GatherRowsKernel<<<GridFor(n * width), kThreads, 0, stream>>>(dst, src, rows, n, width);
  return cudaGetLastError();
}

cudaError_t launch_row_deviations(const float* plane, const float* saved, const std::int32_t* plane_rows,
                                  const std::int32_t* saved_rows, std::int64_t n, std::int64_t width, double* out,
                                  cudaStream_t stream) {
  if (n < 0 || width < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (plane == nullptr || saved == nullptr || plane_rows == nullptr || saved_rows == nullptr || out == nullptr) {
    return cudaErrorInvalidValue;
  }
  RowDeviationsKernel<<<GridFor(n), kThreads, 0, stream>>>(plane, saved, plane_rows, saved_rows, n, width, out);
  return cudaGetLastError();
}

cudaError_t launch_float_to_dtype(std::uint32_t dtype, const float* src, void* dst, std::int64_t n,
                                  cudaStream_t stream) {
  if (n < 0 || dtype > 2) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  FloatToDtypeKernel<<<GridFor(n), kThreads, 0, stream>>>(dtype, src, dst, n);
  return cudaGetLastError();
}

}  // namespace kdn::kernels
