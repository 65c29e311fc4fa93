// SPDX-License-Identifier: Apache-2.0
// Blending (CacheBlend, issue 5): compose a context from pieces whose KV was
// computed alone (RAG chunks in any order) by re-positioning their keys and
// recomputing only the tokens whose KV matters most.
//
// The algorithm (Compose):
//  1. Place. Pieces are laid out one after the other; a piece's cached KV
//     (computed at its own positions from `cached_first`) is copied to its
//     place and every layer's keys are rotated to the new positions
//     (kernels/common/rope_reposition.h). Pieces without KV (the query, or
//     any raw tokens) are "fresh": computed at every layer.
//  2. Recompute, layer by layer, through the engine (LayerEngine): with a
//     ratio (or threshold) above 0, every position runs through layers
//     0..c0 (c0 = the first check layer); at each check layer the cached
//     positions' fresh keys are compared with their placed ones (sum of
//     squared differences) and only the most deviating stay selected: after
//     check layer i of m, a fraction ratio^((i+1)/m) of the cached positions
//     (gradual selection; one check layer: `ratio`). From then on only the
//     selected and the fresh positions run; each writes its new K and V
//     (attending over the whole patched KV) and the rest keep their placed
//     KV. With ratio 0 nothing cached is recomputed (naive reuse); with
//     ratio 1 every position runs through every layer (full prefill).
//     With first_tokens k > 0, the first k positions of each cached piece
//     run through every layer as fresh ones do (EPIC, LegoLink: a piece
//     computed alone puts its attention sink on its first tokens, which is
//     wrong once it follows other text); the check layers select among the
//     piece's other positions, `ratio` a fraction of those.
//  3. Report what was recomputed: f = the fraction of layer x position work.
// Thread-safety: Compose is reentrant; the engine is called from the calling
// thread only, layer by layer in order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/common/rope_reposition.h"
#include "core/util/status.h"

namespace kdn::blend {

// The engine's side of the recompute: the engine implements it (through the
// C ABI, a callback; the reference transformer for tests and the demo).
class LayerEngine {
 public:
  virtual ~LayerEngine() = default;
  // Layer `layer` for `positions` (ascending). `hidden` has one row of
  // hidden_dim() floats per position: the layer's input (at layer 0 it is
  // unset: the engine embeds `tokens`, one per position) and, on return, its
  // output. The engine writes the positions' K and V into k_layer / v_layer
  // ([position][kv_dim], this layer's, `total` positions) and attends each
  // position causally over [0, position] of them.
  virtual Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                       float* k_layer, float* v_layer, int total) = 0;
  virtual int hidden_dim() const = 0;
};

struct ModelShape {
  int layers = 0, kv_heads = 0, head_dim = 0;
  int kv_dim() const { return kv_heads * head_dim; }
};

// One piece of the context, in order.
struct Piece {
  std::vector<std::int32_t> tokens;
  // Cached KV of the tokens, canonical [layer][k|v][token][kv_dim] float32,
  // computed at positions [cached_first, cached_first + tokens); empty: a
  // fresh piece, computed now.
  std::vector<float> kv;
  std::int64_t cached_first = 0;
};

struct BlendOptions {
  double ratio = 0.15;              // fraction of cached positions recomputed after the checks, in [0, 1]
  double threshold = -1;            // >= 0: select by deviation >= threshold instead of by ratio
  std::vector<int> check_layers = {1};  // ascending; the first one is where selection starts
  kernels::RopeSpec rope;           // how the model rotates keys (for re-positioning)
  int first_tokens = 0;             // >= 0: leading positions of each cached piece recomputed at every layer
};

struct BlendReport {
  int positions = 0;                 // of the composed context
  int cached_positions = 0;          // placed from cached KV
  int fresh_positions = 0;           // computed now at every layer
  int anchored = 0;                  // cached positions recomputed at every layer (first_tokens of each piece)
  int selected = 0;                  // other cached positions recomputed past the last check layer
  std::vector<int> recomputed_per_layer;  // positions run through each layer
  double recompute_fraction = 0;     // sum(recomputed_per_layer) / (layers * positions)
  std::vector<int> selected_positions;    // ascending (the anchored ones not among them)
};

// Composes the context; `kv_out` receives [layer][k|v][position][kv_dim]
// float32. kInvalidArgument on inconsistent pieces or options; an engine
// failure is returned as is (the blend stops there).
Result<BlendReport> Compose(const ModelShape& shape, std::span<const Piece> pieces, const BlendOptions& options,
                            LayerEngine& engine, std::vector<float>* kv_out);

}  // namespace kdn::blend
