#include "kernels/kv_view.cuh"

#include <type_traits>

namespace kdn::kernels {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % 32 == 0, "whole warps");
// The kernel takes its arguments by value, pointers and all.
static_assert(std::is_trivially_copyable_v<KvViewArgs>, "kernel parameter");
static_assert(sizeof(KvViewArgs) <= 4096, "fits the kernel parameter space");
// Block tables are int32 physical block ids, as vLLM's.
static_assert(std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(KvView::block_table)>>, std::int32_t>,
              "int32 block ids");
static_assert(static_cast<int>(PageOrder::kNHD) == 0 && static_cast<int>(PageOrder::kHND) == 1, "page orders");
// The NHD, HND, interleaved and llama.cpp offsets the kernel computes.
static_assert(detail::kv_view_layouts_pinned(), "layouts");

// One thread per element of the selected layers' slices of the chunk
// (grid-stride): element e of the launch is chunk element
// layer_begin * per_layer + e.
template <bool kToChunk>
__global__ void KvViewKernel(const KvViewArgs a) {
  const KvShape s = a.view.shape;
  const std::int64_t per_layer = 2 * a.tokens * s.heads * s.head_dim;
  const std::int64_t first = a.layer_begin * per_layer;
  const std::int64_t n = (a.layer_end - a.layer_begin) * per_layer;
  const KvStrides cs = canonical_strides(s, a.tokens);
  auto* chunk = static_cast<unsigned char*>(a.chunk);
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const KvIndex i = canonical_index(s, a.tokens, first + e);
    auto* base = static_cast<unsigned char*>((i.kv == 0 ? a.view.k_base : a.view.v_base)[i.layer]);
    unsigned char* b = base + view_offset(a.view, i.kv, a.token_begin + i.token, i.head, i.dim) * s.elem_bytes;
    unsigned char* c = chunk + element_offset(cs, i) * s.elem_bytes;
    if (kToChunk) {
      copy_element(b, c, s.elem_bytes);
    } else {
      copy_element(c, b, s.elem_bytes);
    }
  }
}

template <bool kToChunk>
cudaError_t Launch(const KvViewArgs& a, cudaStream_t stream) {
  const KvView& v = a.view;
  const KvShape& s = v.shape;
  if (s.elem_bytes != 2 && s.elem_bytes != 4) return cudaErrorInvalidValue;
  if (s.layers <= 0 || s.heads <= 0 || s.head_dim <= 0) return cudaErrorInvalidValue;
  if (a.tokens < 0 || a.token_begin < 0) return cudaErrorInvalidValue;
  if (a.layer_begin < 0 || a.layer_begin > a.layer_end || a.layer_end > s.layers) return cudaErrorInvalidValue;
  const std::int64_t n = (a.layer_end - a.layer_begin) * 2 * a.tokens * s.heads * s.head_dim;
  if (n == 0) return cudaSuccess;
  if (v.k_base == nullptr || v.v_base == nullptr || a.chunk == nullptr) return cudaErrorInvalidValue;
  if (v.paged && (v.block_size <= 0 || v.block_table == nullptr)) return cudaErrorInvalidValue;
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  KvViewKernel<kToChunk><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_view_gather(const KvViewArgs& args, cudaStream_t stream) { return Launch<true>(args, stream); }
cudaError_t launch_view_scatter(const KvViewArgs& args, cudaStream_t stream) { return Launch<false>(args, stream); }

}  // namespace kdn::kernels
