// SPDX-License-Identifier: Apache-2.0
// Index math of moving KV between a caller's strided buffer and canonical
// chunks ([layer][k|v][token][kv_head][head_dim], contiguous). Shared by the
// CPU path (kernels/ref) and the CUDA kernel (kernels/kv_copy.cu).
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace kdn::kernels {

struct KvShape {
  std::int64_t layers = 0;
  std::int64_t heads = 0;     // KV heads
  std::int64_t head_dim = 0;
  std::int64_t elem_bytes = 0;  // 2 or 4
};

// Element strides of a caller's buffer, per index of an element.
struct KvStrides {
  std::int64_t layer = 0, kv = 0, token = 0, head = 0, dim = 0;
};

// A KV element's coordinates.
struct KvIndex {
  std::int64_t layer, kv, token, head, dim;
};

// The canonical strides of a buffer of `tokens` tokens.
KDN_HD KvStrides canonical_strides(const KvShape& s, std::int64_t tokens) {
  KvStrides st;
  st.dim = 1;
  st.head = s.head_dim;
  st.token = s.heads * s.head_dim;
  st.kv = tokens * st.token;
  st.layer = 2 * st.kv;
  return st;
}

KDN_HD std::int64_t element_offset(const KvStrides& st, const KvIndex& i) {
  return i.layer * st.layer + i.kv * st.kv + i.token * st.token + i.head * st.head + i.dim * st.dim;
}

// Coordinates of the e-th element of a canonical chunk of `tokens` tokens.
KDN_HD KvIndex canonical_index(const KvShape& s, std::int64_t tokens, std::int64_t e) {
  KvIndex i;
  i.dim = e % s.head_dim;
  e /= s.head_dim;
  i.head = e % s.heads;
  e /= s.heads;
  i.token = e % tokens;
  e /= tokens;
  i.kv = e % 2;
  i.layer = e / 2;
  return i;
}

// Elements in a canonical chunk of `tokens` tokens.
KDN_HD std::int64_t chunk_elements(const KvShape& s, std::int64_t tokens) {
  return s.layers * 2 * tokens * s.heads * s.head_dim;
}

// Copies one element of elem_bytes (2 or 4) bytes.
KDN_HD void copy_element(const unsigned char* src, unsigned char* dst, std::int64_t elem_bytes) {
  if (elem_bytes == 4) {
    *reinterpret_cast<std::uint32_t*>(dst) = *reinterpret_cast<const std::uint32_t*>(src);
  } else {
    *reinterpret_cast<std::uint16_t*>(dst) = *reinterpret_cast<const std::uint16_t*>(src);
  }
}

}  // namespace kdn::kernels
