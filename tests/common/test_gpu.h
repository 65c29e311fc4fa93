// SPDX-License-Identifier: Apache-2.0
// Whether a CUDA device is usable: device tests run only then (they skip,
// saying so, elsewhere); the CPU runs of the kernels' work are tested always.
#pragma once

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kdn::testing {

inline bool HaveGpu() {
#ifdef KDN_HAVE_CUDA
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

}  // namespace kdn::testing
