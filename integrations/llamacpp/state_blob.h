// SPDX-License-Identifier: Apache-2.0
// llama.cpp's saved state of one sequence (llama_state_seq_get_data /
// _set_data) and kdn's canonical KV layout, each from the other.
//
// The blob, as this llama.cpp (node-llama-cpp 3.22.1, commit de3ff815) writes
// it in src/llama-kv-cache.cpp (state_write / state_read), little-endian:
//   u32 magic 0xaf143cd8, i32 source sequence; then each cache's state (one;
//   a model with sliding-window layers: its full layers' cache, then its
//   SWA cache's), each: u32 streams (kdn takes 1);
//   per stream: u32 cells; per cell: i32 position, u32 n_seq, i32 seq[n_seq];
//   then (when cells > 0) u32 v_trans, u32 layers;
//   per layer, K: i32 ggml type, u64 row bytes, one row per cell;
//   per layer, V: as K when v_trans is 0 (flash attention on); else i32
//   type, u32 element bytes, u32 values per token, then for each value its
//   cells' elements (transposed).
// The format has no version and llama.cpp checks little of it on restore,
// so kdn checks everything it can and refuses (kUnsupported for a layout
// it does not know, kCorrupt for bytes that do not add up) rather than
// guess. Only f32 and f16 caches are known.
//
// The canonical layout: [layer][k|v][token][kv_head][head_dim] of one dtype,
// token t at position t (a llama.cpp row is [kv_head][head_dim] already).
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/util/status.h"

namespace kdn::llamacpp {

inline constexpr std::uint32_t kStateMagic = 0xaf143cd8u;

// What a model's KV looks like in a blob.
struct KvShape {
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  std::uint64_t channels() const { return std::uint64_t{kv_heads} * head_dim; }
};

// 0: f32, 1: f16 (ggml's type ids, and kdn's dtype codes).
struct CanonicalKv {
  std::uint32_t dtype = 0;
  bool v_trans = false;       // how the blob held V (restores must use the same)
  std::uint64_t first = 0;    // the first position (0; later in a sliding-window cache)
  std::uint64_t tokens = 0;   // positions first .. first + tokens - 1
  std::vector<std::uint8_t> bytes;
};

// The canonical KV of a blob of `shape` (shape.layers 0: as many layers as
// the blob has). Its cells must hold positions first .. first + n - 1, each
// once, of one sequence (in any order).
Result<CanonicalKv> BlobToCanonical(const std::uint8_t* blob, std::size_t size, const KvShape& shape);
// A blob of several caches (a model with sliding-window layers: llama.cpp's
// llama_kv_cache_iswa writes its full layers' cache, then its SWA cache's,
// after the one header), each of its shape (layers 0: the blob's).
Result<std::vector<CanonicalKv>> BlobToCanonical(const std::uint8_t* blob, std::size_t size,
                                                 std::span<const KvShape> caches);

// A blob of positions [kv.first, kv.first + kv.tokens) in position order,
// sequence 0, for a cache of kv.dtype with kv.v_trans, from canonical bytes.
Result<std::vector<std::uint8_t>> CanonicalToBlob(const CanonicalKv& kv, const KvShape& shape);
// The same of several caches, one after the other after the one header.
Result<std::vector<std::uint8_t>> CanonicalToBlob(std::span<const CanonicalKv> caches, std::span<const KvShape> shapes);

}  // namespace kdn::llamacpp
