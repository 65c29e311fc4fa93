// SPDX-License-Identifier: Apache-2.0
#include "kernels/kv_view.cuh"

#include <type_traits>

namespace kdn::kernels {
namespace {

constexpr int kThreads = 256;
static_assert(kThreads % 32 == 0, "whole warps");
// The kernel takes its arguments by value, pointers and all.
static_assert(std::is_trivially_copyable_v<KvViewArgs>, "kernel parameter");
static_assert(sizeof(KvViewArgs) + sizeof(KvRowPlan) <= 4096, "fits the kernel parameter space");
static_assert(std::is_trivially_copyable_v<KvRowPlan>, "kernel parameter");
// Block tables are int32 physical block ids, as vLLM's.
static_assert(std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(KvView::block_table)>>, std::int32_t>,
              "int32 block ids");
static_assert(static_cast<int>(PageOrder::kNHD) == 0 && static_cast<int>(PageOrder::kHND) == 1, "page orders");
// The NHD, HND, interleaved and llama.cpp offsets the kernel computes.
static_assert(detail::kv_view_layouts_pinned(), "layouts");

// One thread per vector of a row (common/kv_rows.h), grid-stride: the
// threads of a warp move consecutive vectors of a row, then of the next, so
// their loads and stores are adjacent.
template <bool kToChunk, typename I>
__global__ void KvViewKernel(const KvViewArgs a, const KvRowPlan p) {
  const std::int64_t n = p.items();
  for (std::int64_t item = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; item < n;
       item += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    move_row_vector<I>(a, p, static_cast<I>(item), kToChunk);
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
  const KvRowPlan p = plan_rows(a);
  const std::int64_t blocks = (p.items() + kThreads - 1) / kThreads;
  // Enough blocks to fill the GPU several times over; the grid-stride loop
  // covers the rest.
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  if (rows_fit_32_bits(p)) {
    KvViewKernel<kToChunk, std::uint32_t><<<grid, kThreads, 0, stream>>>(a, p);
  } else {
    KvViewKernel<kToChunk, std::uint64_t><<<grid, kThreads, 0, stream>>>(a, p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_view_gather(const KvViewArgs& args, cudaStream_t stream) { return Launch<true>(args, stream); }
cudaError_t launch_view_scatter(const KvViewArgs& args, cudaStream_t stream) { return Launch<false>(args, stream); }

}  // namespace kdn::kernels
