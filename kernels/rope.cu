// SPDX-License-Identifier: Apache-2.0
#include "kernels/rope.cuh"

#include <type_traits>

namespace kdn::kernels {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % 32 == 0, "whole warps");
static_assert(std::is_trivially_copyable_v<RopeRepositionArgs>, "kernel parameter");
static_assert(sizeof(RopeRepositionArgs) <= 4096, "fits the kernel parameter space");
// Two double tables (cos, sin) of rotary_dim / 2 entries fit the 48 KiB of
// dynamic shared memory a launch gets without opting in.
static_assert(2 * sizeof(double) * (kRopeMaxRotaryDim / 2) <= 48 * 1024, "shared tables");

unsigned GridFor(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

// One thread per (token, pair), grid-stride; the thread rotates that pair in
// every head of the token, so cos/sin is computed once per (token, pair).
// Each block first tabulates w_j in shared memory.
template <KeyType T>
__global__ void RepositionKernel(const RopeRepositionArgs a) {
  extern __shared__ double inv_freq[];
  const int pairs = rope_pairs(a.spec);
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) inv_freq[j] = rope_spec_inv_freq(a.spec, j);
  __syncthreads();
  const std::int64_t n = a.tokens * pairs;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / pairs;
    const int j = static_cast<int>(e - t * pairs);
    const std::int64_t delta = a.new_pos[t] - a.old_pos[t];
    if (delta == 0) continue;
    double c, s;
    rope_delta_cos_sin(delta, inv_freq[j], c, s);
    for (int h = 0; h < a.kv_heads; ++h) {
      rope_rotate_key_pair<T>(a.keys, rope_head_offset(t, h, a.row_stride, a.spec.head_dim), a.spec, j, c, s);
    }
  }
}

// One delta for all: each block tabulates cos/sin per pair in shared memory,
// then one thread per (token, head, pair), grid-stride.
template <KeyType T>
__global__ void ShiftKernel(const RopeRepositionArgs a) {
  extern __shared__ double table[];  // [0, pairs): cos, [pairs, 2 pairs): sin
  const int pairs = rope_pairs(a.spec);
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    rope_delta_cos_sin(a.delta, rope_spec_inv_freq(a.spec, j), table[j], table[pairs + j]);
  }
  __syncthreads();
  const std::int64_t per_token = static_cast<std::int64_t>(a.kv_heads) * pairs;
  const std::int64_t n = a.tokens * per_token;
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = e / per_token;
    const std::int64_t r = e - t * per_token;
    const int h = static_cast<int>(r / pairs);
    const int j = static_cast<int>(r - static_cast<std::int64_t>(h) * pairs);
    rope_rotate_key_pair<T>(a.keys, rope_head_offset(t, h, a.row_stride, a.spec.head_dim), a.spec, j, table[j],
                            table[pairs + j]);
  }
}

bool ArgsValid(const RopeRepositionArgs& a) {
  return rope_keys_problem(a.spec, a.row_stride, a.tokens, a.kv_heads) == nullptr && key_type_valid(a.type) &&
         rope_rotary_dim(a.spec) <= kRopeMaxRotaryDim;
}

}  // namespace

cudaError_t launch_rope_reposition(const RopeRepositionArgs& a, cudaStream_t stream) {
  if (!ArgsValid(a)) return cudaErrorInvalidValue;
  if (a.tokens == 0) return cudaSuccess;
  if (a.keys == nullptr || a.old_pos == nullptr || a.new_pos == nullptr) return cudaErrorInvalidValue;
  const int pairs = rope_pairs(a.spec);
  const unsigned grid = GridFor(a.tokens * pairs);
  const size_t shared = sizeof(double) * static_cast<size_t>(pairs);
  switch (a.type) {
    case KeyType::kF32:
      RepositionKernel<KeyType::kF32><<<grid, kThreads, shared, stream>>>(a);
      break;
    case KeyType::kF16:
      RepositionKernel<KeyType::kF16><<<grid, kThreads, shared, stream>>>(a);
      break;
    case KeyType::kBF16:
      RepositionKernel<KeyType::kBF16><<<grid, kThreads, shared, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

cudaError_t launch_rope_shift(const RopeRepositionArgs& a, cudaStream_t stream) {
  if (!ArgsValid(a)) return cudaErrorInvalidValue;
  if (a.tokens == 0 || a.delta == 0) return cudaSuccess;
  if (a.keys == nullptr) return cudaErrorInvalidValue;
  const int pairs = rope_pairs(a.spec);
  const unsigned grid = GridFor(a.tokens * a.kv_heads * pairs);
  const size_t shared = 2 * sizeof(double) * static_cast<size_t>(pairs);
  switch (a.type) {
    case KeyType::kF32:
      ShiftKernel<KeyType::kF32><<<grid, kThreads, shared, stream>>>(a);
      break;
    case KeyType::kF16:
      ShiftKernel<KeyType::kF16><<<grid, kThreads, shared, stream>>>(a);
      break;
    case KeyType::kBF16:
      ShiftKernel<KeyType::kBF16><<<grid, kThreads, shared, stream>>>(a);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kdn::kernels
