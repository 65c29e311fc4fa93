// SPDX-License-Identifier: Apache-2.0
// CPU path of re-positioning cached keys (common/rope_reposition.h: the math
// and the formulas, shared with the CUDA kernel in rope.cuh).
//
// Keys: `tokens` rows, row t starting `t * row_stride` ELEMENTS after `keys`,
// each row holding `kv_heads` heads of spec.head_dim elements back to back
// ([token][kv_head][head_dim], e.g. one layer's K of a canonical chunk with
// row_stride = kv_heads * head_dim, or of model::KvCache). In place: pair j
// of every head of token t is rotated by delta_t * w_j; elements past
// rotary_dim in a head, and everything between rows, are not touched.
// Tokens whose delta is 0 are not touched at all (bit-exact identity).
//
// Every function returns false, writing nothing, when rope_keys_problem()
// names a problem, the type is not a KeyType, or a pointer it needs is null
// (with tokens > 0); true otherwise. Positions may be any int64 with |new - old| < 2^53.
// Single-threaded; callers parallelize across layers or token ranges.
// Thread-safety: pure functions of their arguments (distinct buffers may be
// moved concurrently).
#pragma once

#include <cstdint>

#include "kernels/common/rope_reposition.h"

namespace kdn::kernels {

// Moves token t from old_pos[t] to new_pos[t] (arrays of `tokens`).
// Consecutive tokens with equal deltas share one cos/sin table, so a chunk
// moved by one offset costs one table.
bool rope_reposition_cpu(const RopeSpec& spec, KeyType type, void* keys, std::int64_t row_stride,
                         std::int64_t tokens, int kv_heads, const std::int64_t* old_pos,
                         const std::int64_t* new_pos);

// Moves every token by the same `delta` (new - old): a chunk placed at
// another offset. delta 0 returns at once.
bool rope_shift_cpu(const RopeSpec& spec, KeyType type, void* keys, std::int64_t row_stride, std::int64_t tokens,
                    int kv_heads, std::int64_t delta);

// float32 conveniences for core/blend: the two functions above with
// KeyType::kF32 and row_stride counted in floats.
bool RepositionKeysF32(const RopeSpec& spec, float* keys, std::int64_t row_stride_floats, int tokens, int kv_heads,
                       const std::int64_t* old_pos, const std::int64_t* new_pos);
bool RepositionKeysF32Delta(const RopeSpec& spec, float* keys, std::int64_t row_stride_floats, int tokens,
                            int kv_heads, std::int64_t delta);

}  // namespace kdn::kernels
