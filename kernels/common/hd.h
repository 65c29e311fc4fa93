// SPDX-License-Identifier: Apache-2.0
// KDN_HD marks element and index math shared by CUDA kernels and the CPU
// path: __host__ __device__ under nvcc, plain inline elsewhere.
#pragma once

#if defined(__CUDACC__)
#define KDN_HD __host__ __device__ __forceinline__
#else
#define KDN_HD inline
#endif
