// SPDX-License-Identifier: Apache-2.0
// How the view kernels move KV (kv_view.cu), as functions the CPU runs too
// (ref/kv_view_ref.h view_copy_emulated, the emulated device): by rows, not
// elements. A row is one (layer, k|v, token, head)'s head_dim elements,
// contiguous in the canonical chunk and, in every layout kdn knows but
// llama.cpp's transposed V, in the view too. Each row is cut into vectors of
// the widest width (16, 8, 4 or 2 bytes) at which every row of the copy
// starts aligned on both sides, and one work item moves one vector: the index
// arithmetic (a row's coordinates and its view offset) is paid once per
// vector, not per element, and a 16-byte vector is one load and one store.
// Where the view's dims are not contiguous, a vector is one element.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/kv_copy.h"
#include "kernels/common/kv_view.h"

namespace kdn::kernels {

// A view copy's arguments. The view's arrays (k_base, v_base, block_table)
// are where the code that reads them runs: device memory for a launch, host
// memory for the CPU.
struct KvViewArgs {
  KvView view;
  void* chunk = nullptr;         // canonical chunk of `tokens` tokens, all layers
  std::int64_t token_begin = 0;  // first view token of the chunk
  std::int64_t tokens = 0;       // tokens in the chunk
  std::int64_t layer_begin = 0;  // layers [layer_begin, layer_end) move; other
  std::int64_t layer_end = 0;    // layers' slices of the chunk are untouched
  // The largest power of two, at most 16, that divides every K and V base
  // address of the view (view_base_alignment, read where the base arrays
  // are host memory); 0 or 1: unknown, so vectors are one element wide.
  std::int64_t base_alignment = 0;
};

struct KvRowPlan {
  std::int64_t rows = 0;          // (layer_end - layer_begin) x 2 x tokens x heads
  std::int64_t vec_bytes = 0;     // bytes one work item moves
  std::int64_t vecs_per_row = 0;  // work items per row
  bool contiguous_rows = false;   // the view's rows are contiguous (dims at stride 1)
  KDN_HD std::int64_t items() const { return rows * vecs_per_row; }
};

KDN_HD std::int64_t gcd_pow2(std::int64_t width, std::int64_t x) {
  // The largest power of two <= width that divides x (width a power of two).
  while (width > 1 && (x % width) != 0) width /= 2;
  return width;
}

// The widest vector every row start meets on both sides: the base
// alignment, the chunk's address, the row length and every stride a row
// start moves by (token, head, block) in bytes.
KDN_HD KvRowPlan plan_rows(const KvViewArgs& a) {
  const KvView& v = a.view;
  const KvShape& s = v.shape;
  KvRowPlan p;
  p.rows = (a.layer_end - a.layer_begin) * 2 * a.tokens * s.heads;
  const KvRunStrides k = view_run_strides(v, 0), val = view_run_strides(v, 1);
  p.contiguous_rows = s.head_dim == 1 || (k.dim == 1 && val.dim == 1);
  std::int64_t w = 1;
  if (p.contiguous_rows) {
    w = a.base_alignment > 16 ? 16 : (a.base_alignment < 1 ? 1 : a.base_alignment);
    const std::int64_t eb = s.elem_bytes;
    w = gcd_pow2(w, static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(a.chunk) % 16));
    w = gcd_pow2(w, s.head_dim * eb);
    w = gcd_pow2(w, k.token * eb);
    w = gcd_pow2(w, k.head * eb);
    w = gcd_pow2(w, val.token * eb);
    w = gcd_pow2(w, val.head * eb);
    if (v.paged) w = gcd_pow2(w, view_block_stride(v) * eb);
  }
  if (w < s.elem_bytes) w = s.elem_bytes;  // every address is element-aligned
  p.vec_bytes = w;
  p.vecs_per_row = p.contiguous_rows ? s.head_dim * s.elem_bytes / w : s.head_dim;
  return p;
}

// Copies one vector of `bytes` (16, 8, 4 or 2) between aligned addresses.
struct alignas(16) KvVec16 {
  std::uint32_t x, y, z, w;
};
KDN_HD void copy_vector(const unsigned char* src, unsigned char* dst, std::int64_t bytes) {
  switch (bytes) {
    case 16: *reinterpret_cast<KvVec16*>(dst) = *reinterpret_cast<const KvVec16*>(src); break;
    case 8: *reinterpret_cast<std::uint64_t*>(dst) = *reinterpret_cast<const std::uint64_t*>(src); break;
    case 4: *reinterpret_cast<std::uint32_t*>(dst) = *reinterpret_cast<const std::uint32_t*>(src); break;
    default: *reinterpret_cast<std::uint16_t*>(dst) = *reinterpret_cast<const std::uint16_t*>(src); break;
  }
}

// Work item `item` (< p.items()) of a copy: row item / vecs_per_row in the
// canonical order of the selected layers, vector item % vecs_per_row of it.
// to_chunk: view -> chunk (gather), else chunk -> view (scatter). I is the
// type the coordinates are divided in: a launch whose items and counts fit
// 32 bits divides in 32 bits (a GPU's 64-bit division is a long software
// sequence); addresses are computed in 64 bits either way.
template <typename I>
KDN_HD void move_row_vector(const KvViewArgs& a, const KvRowPlan& p, I item, bool to_chunk) {
  const KvShape& s = a.view.shape;
  const I per_row = static_cast<I>(p.vecs_per_row), heads = static_cast<I>(s.heads), tokens = static_cast<I>(a.tokens);
  const I row = item / per_row, vec = item - row * per_row;
  I r = row / heads;
  const I head = row - r * heads;
  const I rest = r / tokens;
  const I token = r - rest * tokens;
  const std::int64_t kv = static_cast<std::int64_t>(rest % 2);
  const std::int64_t layer = a.layer_begin + static_cast<std::int64_t>(rest / 2);
  auto* base = static_cast<unsigned char*>((kv == 0 ? a.view.k_base : a.view.v_base)[layer]);
  const std::int64_t row_bytes = s.head_dim * s.elem_bytes;
  const std::int64_t t = static_cast<std::int64_t>(token), h = static_cast<std::int64_t>(head),
                     x = static_cast<std::int64_t>(vec);
  unsigned char* view_at;
  if (p.contiguous_rows) {
    view_at = base + view_offset(a.view, kv, a.token_begin + t, h, 0) * s.elem_bytes + x * p.vec_bytes;
  } else {
    view_at = base + view_offset(a.view, kv, a.token_begin + t, h, x) * s.elem_bytes;
  }
  unsigned char* chunk_at =
      static_cast<unsigned char*>(a.chunk) + (((layer * 2 + kv) * a.tokens + t) * s.heads + h) * row_bytes + x * p.vec_bytes;
  if (to_chunk) {
    copy_vector(view_at, chunk_at, p.vec_bytes);
  } else {
    copy_vector(chunk_at, view_at, p.vec_bytes);
  }
}

// Whether a copy's work items can be divided in 32 bits.
KDN_HD bool rows_fit_32_bits(const KvRowPlan& p) { return p.items() <= 0xFFFFFFFFll; }

}  // namespace kdn::kernels
