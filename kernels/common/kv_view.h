// SPDX-License-Identifier: Apache-2.0
// Index math of an engine's KV view: per-layer K and V base pointers, laid
// out either contiguously (token, head, dim strides within a layer, as
// llama.cpp's per-layer caches) or paged (a block table of physical blocks of
// block_size tokens, NHD = [block][token][head][dim] as vLLM, or HND =
// [block][head][token][dim]). Shared by the CPU path (ref/kv_view_ref) and
// the CUDA kernels (kv_view.cu).
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/kv_copy.h"

namespace kdn::kernels {

enum class PageOrder : std::int32_t { kNHD = 0, kHND = 1 };

// All offsets and strides are in elements of shape.elem_bytes bytes. The
// arrays (k_base, v_base, block_table) live where the code reading them runs:
// host memory for the CPU path, device memory for the CUDA launchers.
struct KvView {
  KvShape shape;                    // layers, heads, head_dim, elem_bytes
  void* const* k_base = nullptr;    // [layers] base pointers of K
  void* const* v_base = nullptr;    // [layers] base pointers of V
  bool paged = false;
  // Contiguous: element strides of (token, head, dim) within one layer's K,
  // and V's too unless one of the v_stride_* below is non-zero.
  std::int64_t stride_token = 0, stride_head = 0, stride_dim = 0;
  // Paged: logical block i of the sequence is physical block block_table[i].
  std::int64_t block_size = 0;
  const std::int32_t* block_table = nullptr;
  std::int64_t table_len = 0;
  PageOrder order = PageOrder::kNHD;

  // Contiguous: V's own strides when it is laid out unlike K, as llama.cpp's
  // V without flash attention ([kv_heads*head_dim][n_ctx]: v_stride_token 1,
  // v_stride_dim n_ctx, v_stride_head head_dim*n_ctx). All zero: K's strides.
  std::int64_t v_stride_token = 0, v_stride_head = 0, v_stride_dim = 0;
  // Contiguous: elements in each layer's K allocation (and V's); 0 = unknown,
  // bounds unchecked.
  std::int64_t layer_elements = 0;
  // Paged: elements from one physical block to the next; 0 = dense
  // (block_size*heads*head_dim). FlashInfer-style caches that interleave K and
  // V per block ([block][k|v][...]) use 2*block_size*heads*head_dim, with
  // v_base = k_base + block_size*heads*head_dim.
  std::int64_t block_stride = 0;
  // Paged: physical blocks in each layer's allocation; block ids must be
  // below it. 0 = unknown, unchecked.
  std::int64_t num_blocks = 0;
  // Paged NHD: elements from one token's row to the next within a block; 0 =
  // heads*head_dim. Not in the C ABI: a latent (MLA) model's view sets it,
  // its one vector of 2*head_dim per token kept as K (the first half) and V
  // (v_base = k_base + head_dim), so a block holds block_size*2*head_dim.
  std::int64_t paged_token_stride = 0;
};

// Strides of (token, head, dim) within one run of tokens that the view lays
// out uniformly: a whole layer for contiguous views, one physical block for
// paged ones. kv: 0 = K, 1 = V.
struct KvRunStrides {
  std::int64_t token = 0, head = 0, dim = 0;
};

KDN_HD constexpr bool view_v_own_strides(const KvView& v) {
  return v.v_stride_token != 0 || v.v_stride_head != 0 || v.v_stride_dim != 0;
}

KDN_HD constexpr KvRunStrides view_run_strides(const KvView& v, std::int64_t kv) {
  if (!v.paged) {
    if (kv != 0 && view_v_own_strides(v)) return {v.v_stride_token, v.v_stride_head, v.v_stride_dim};
    return {v.stride_token, v.stride_head, v.stride_dim};
  }
  if (v.order == PageOrder::kNHD) {
    return {v.paged_token_stride != 0 ? v.paged_token_stride : v.shape.heads * v.shape.head_dim, v.shape.head_dim, 1};
  }
  return {v.shape.head_dim, v.block_size * v.shape.head_dim, 1};
}

// Elements from one physical block to the next.
KDN_HD constexpr std::int64_t view_block_stride(const KvView& v) {
  if (v.block_stride != 0) return v.block_stride;
  return v.block_size * (v.paged_token_stride != 0 ? v.paged_token_stride : v.shape.heads * v.shape.head_dim);
}

// Element offset, within layer's K (kv 0) or V (kv 1) allocation, of
// sequence token `token`, head, dim.
KDN_HD constexpr std::int64_t view_offset(const KvView& v, std::int64_t kv, std::int64_t token, std::int64_t head,
                                          std::int64_t dim) {
  const KvRunStrides s = view_run_strides(v, kv);
  if (!v.paged) return token * s.token + head * s.head + dim * s.dim;
  const std::int64_t block = v.block_table[token / v.block_size];
  const std::int64_t slot = token % v.block_size;
  return block * view_block_stride(v) + slot * s.token + head * s.head + dim * s.dim;
}

// K's offset (V's too when V shares K's layout: every paged view, and
// contiguous ones without v_stride_*).
KDN_HD constexpr std::int64_t view_offset(const KvView& v, std::int64_t token, std::int64_t head, std::int64_t dim) {
  return view_offset(v, 0, token, head, dim);
}

// Whether a contiguous view lays each layer's K and V out as the canonical
// chunk does ([token][head][dim], dense): a chunk's slice of one layer's K
// (or V) is then one run of bytes in the view, at view_offset(token_begin).
KDN_HD constexpr bool view_dense_like_chunk(const KvView& v) {
  return !v.paged && !view_v_own_strides(v) && v.stride_dim == 1 && v.stride_head == v.shape.head_dim &&
         v.stride_token == v.shape.heads * v.shape.head_dim;
}

namespace detail {

// The layouts pinned, against the engines' own index formulas, on a small
// view: H=3 heads, D=5 dims, blocks of 4 tokens, table {7, 2}.
constexpr bool kv_view_layouts_pinned() {
  const std::int32_t table[2] = {7, 2};
  constexpr std::int64_t H = 3, D = 5, B = 4;
  KvView v;
  v.shape = {1, H, D, 2};
  v.paged = true;
  v.block_size = B;
  v.block_table = table;
  v.table_len = 2;
  // Token 6 is slot 2 of logical block 1, physical block 2; head 1, dim 4.
  const std::int64_t t = 6, h = 1, d = 4, block = 2, slot = 2;
  bool ok = true;
  // vLLM: key_cache[block][slot][head][dim].
  v.order = PageOrder::kNHD;
  ok = ok && view_offset(v, 0, t, h, d) == ((block * B + slot) * H + h) * D + d;
  ok = ok && view_offset(v, 1, t, h, d) == view_offset(v, 0, t, h, d);
  // HND (FlashInfer's default): cache[block][head][slot][dim].
  v.order = PageOrder::kHND;
  ok = ok && view_offset(v, 0, t, h, d) == ((block * H + h) * B + slot) * D + d;
  // FlashInfer NHD with K and V interleaved: cache[block][k|v][slot][head][dim],
  // offsets from each of the K and V bases.
  v.order = PageOrder::kNHD;
  v.block_stride = 2 * B * H * D;
  ok = ok && view_offset(v, 1, t, h, d) + B * H * D == (((block * 2 + 1) * B + slot) * H + h) * D + d;
  // llama.cpp, 8 context cells: K [cell][head*D + dim], V transposed
  // [head*D + dim][cell].
  KvView c;
  c.shape = {1, H, D, 2};
  c.stride_token = H * D;
  c.stride_head = D;
  c.stride_dim = 1;
  c.v_stride_token = 1;
  c.v_stride_head = D * 8;
  c.v_stride_dim = 8;
  ok = ok && view_offset(c, 0, t, h, d) == t * (H * D) + (h * D + d);
  ok = ok && view_offset(c, 1, t, h, d) == (h * D + d) * 8 + t;
  return ok;
}
static_assert(kv_view_layouts_pinned(), "the NHD, HND, interleaved and llama.cpp layouts");

}  // namespace detail

}  // namespace kdn::kernels
