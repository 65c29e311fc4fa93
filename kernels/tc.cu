// SPDX-License-Identifier: Apache-2.0
// The transform codec's decode kernels: grid-stride loops over the
// per-thread work of common/tc_device_math.h (tc.cuh says which thread does
// what).
#include "kernels/tc.cuh"

#include <cstdint>
#include <type_traits>

namespace kdn::kernels {
namespace {

constexpr unsigned kThreads = 256;       // finish: short threads
constexpr unsigned kStreamThreads = 64;  // one long-running thread per stream: spread them over the SMs
constexpr unsigned kMaxGrid = 65535;
static_assert(std::is_trivially_copyable_v<TcDecodeArgs> && sizeof(TcDecodeArgs) <= 4096, "kernel parameter");
static_assert(std::is_trivially_copyable_v<TcFinishArgs> && sizeof(TcFinishArgs) <= 4096, "kernel parameter");
static_assert(sizeof(TcStreamDir) == 32, "the directory's layout, as the host uploads it");

unsigned GridFor(std::uint64_t n, unsigned threads) {
  const std::uint64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

__device__ std::uint64_t ThreadIndex() { return std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ std::uint64_t ThreadCount() { return std::uint64_t{gridDim.x} * blockDim.x; }

__global__ void TcStreamKernel(const TcDecodeArgs a) {
  for (std::uint64_t i = ThreadIndex(); i < tc_stream_threads(a); i += ThreadCount()) {
    if (!tc_stream_work(a, i)) atomicMin(a.failed, codec_index32(i));
  }
}

__global__ void TcFinishKernel(const TcFinishArgs a) {
  for (std::uint64_t i = ThreadIndex(); i < tc_finish_threads(a); i += ThreadCount()) {
    if (!tc_finish_work(a, i)) atomicMin(a.failed, codec_index32(i));
  }
}

}  // namespace

cudaError_t launch_tc_streams(const TcDecodeArgs& a, cudaStream_t stream) {
  if (a.lanes < 1 || a.lanes > kKdnMaxLanes || a.sinks > a.tokens || a.failed == nullptr) return cudaErrorInvalidValue;
  if (a.n_streams == 0) return cudaSuccess;
  TcStreamKernel<<<GridFor(a.n_streams, kStreamThreads), kStreamThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_tc_finish(const TcFinishArgs& a, cudaStream_t stream) {
  if (a.kv_heads == 0 || a.rope.head_dim <= 0 || static_cast<std::uint32_t>(a.rope.head_dim) > kTcMaxHeadDim ||
      a.sinks > a.tokens || a.dtype > 2 || a.failed == nullptr || rope_spec_problem(a.rope) != nullptr) {
    return cudaErrorInvalidValue;
  }
  const std::uint64_t n = tc_finish_threads(a);
  if (n == 0) return cudaSuccess;
  TcFinishKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kdn::kernels
