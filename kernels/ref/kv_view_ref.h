// SPDX-License-Identifier: Apache-2.0
// CPU path of moving KV between an engine's view (common/kv_view.h: paged or
// contiguous per-layer K and V) and canonical chunks
// ([layer][k|v][token][kv_head][head_dim]), plus the checks a caller runs on
// a view it was handed before trusting it.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "kernels/common/kv_rows.h"
#include "kernels/common/kv_view.h"

namespace kdn::kernels {

// Copies view tokens [token_begin, token_begin + tokens) of layers
// [layer_begin, layer_end) into `chunk`, a canonical chunk of `tokens` tokens
// and all v.shape.layers layers; only the selected layers' slices are
// written. The view's arrays are host memory. Preconditions (unchecked):
// view_valid(v, token_begin + tokens), 0 <= layer_begin <= layer_end <=
// layers, token_begin >= 0; empty ranges copy nothing.
void view_gather_cpu(const KvView& v, std::int64_t token_begin, std::int64_t tokens, std::int64_t layer_begin,
                     std::int64_t layer_end, void* chunk);
// The inverse: writes the selected layers' slices of `chunk` into the view,
// and nothing else.
void view_scatter_cpu(const void* chunk, const KvView& v, std::int64_t token_begin, std::int64_t tokens,
                      std::int64_t layer_begin, std::int64_t layer_end);

// The largest power of two, at most 16, dividing every K and V base address
// of a view whose base arrays are host memory (KvViewArgs::base_alignment).
std::int64_t view_base_alignment(const KvView& v);
// The view kernels' work (common/kv_rows.h) run on the CPU, item by item in
// order: what the emulated device does for a scatter (to_chunk false) or a
// gather, byte for byte the kernel's moves. The view's arrays are host
// memory; base_alignment as for a launch. Preconditions as view_gather_cpu.
void view_copy_emulated(const KvViewArgs& a, bool to_chunk);

// Whether a host view can be read for tokens [0, tokens_needed): positive
// shape, elem_bytes 2 or 4, non-null K and V base arrays and entries; paged:
// block_size > 0, block_stride 0 or at least a block, a table of at least
// ceil(tokens_needed / block_size) entries, non-negative block ids; contiguous:
// non-negative strides whose elements do not overlap. Also view_in_bounds for
// those tokens. On false, *why (when why is not null) names the first problem,
// a static string.
bool view_valid(const KvView& v, std::int64_t tokens_needed, const char** why);

// Whether every element touched for tokens [token_begin, token_begin + tokens)
// stays inside its allocation: paged, each table entry those tokens use exists
// and is in [0, num_blocks); contiguous, every K and V offset is in
// [0, layer_elements). A limit of 0 (num_blocks or layer_elements unknown)
// checks only the table length. *why as for view_valid.
bool view_in_bounds(const KvView& v, std::int64_t token_begin, std::int64_t tokens, const char** why);

}  // namespace kdn::kernels
