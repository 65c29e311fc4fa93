#include "kv_copy.cuh"

namespace kdn::kernels {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % 32 == 0, "whole warps");

template <bool kToChunk>
__global__ void KvCopyKernel(KvCopyArgs a) {
  const std::int64_t n = chunk_elements(a.shape, a.tokens);
  const KvStrides cs = canonical_strides(a.shape, a.tokens);
  auto* buffer = static_cast<unsigned char*>(a.buffer);
  auto* chunk = static_cast<unsigned char*>(a.chunk);
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const KvIndex i = canonical_index(a.shape, a.tokens, e);
    KvIndex bi = i;
    bi.token += a.token_begin;
    unsigned char* b = buffer + element_offset(a.strides, bi) * a.shape.elem_bytes;
    unsigned char* c = chunk + element_offset(cs, i) * a.shape.elem_bytes;
    if (kToChunk) {
      copy_element(b, c, a.shape.elem_bytes);
    } else {
      copy_element(c, b, a.shape.elem_bytes);
    }
  }
}

template <bool kToChunk>
cudaError_t Launch(const KvCopyArgs& a, cudaStream_t stream) {
  const std::int64_t n = chunk_elements(a.shape, a.tokens);
  if (n <= 0) return cudaSuccess;
  if (a.shape.elem_bytes != 2 && a.shape.elem_bytes != 4) return cudaErrorInvalidValue;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  KvCopyKernel<kToChunk><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_kv_gather(const KvCopyArgs& args, cudaStream_t stream) { return Launch<true>(args, stream); }
cudaError_t launch_kv_scatter(const KvCopyArgs& args, cudaStream_t stream) { return Launch<false>(args, stream); }

}  // namespace kdn::kernels
