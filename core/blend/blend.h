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
//     With a KV pass (an engine that can project K and V without running
//     the rest of the layer: LayerEngine::KvPass), a check layer costs less:
//     every row gets only its K and V there, the selection is made on those
//     keys, and only the selected and fresh rows run the whole check layer.
//     The KV is the same as without it (the selected rows write the same K
//     and V again; an unselected row's whole-layer output was never used,
//     since it stops at the check layer): the same blend for less work.
//  3. Report what was recomputed: f = the fraction of layer x position work,
//     a KV-pass row counted at the engine's stated cost (kv_pass_cost).
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
  // Optional: K and V of layer `layer` for `positions` only (the layer's
  // projections of its input `hidden`, K rotated to the positions; at layer
  // 0 `tokens` are embedded into `hidden` first), written to k_layer /
  // v_layer as Layer writes them, bit for bit; no attention, `hidden` left
  // as the layer's input. An engine that cannot leaves it (Unsupported).
  virtual Status KvPass(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                        float* k_layer, float* v_layer, int total) {
    (void)layer, (void)positions, (void)tokens, (void)hidden, (void)k_layer, (void)v_layer, (void)total;
    return Status::Unsupported("blend: the engine has no KV pass");
  }
  virtual bool has_kv_pass() const { return false; }
  // The work of a KV pass per position over that of the whole layer, for a
  // context of `total` positions, in (0, 1] (FLOPs; counted into f).
  virtual double kv_pass_cost(int total) const {
    (void)total;
    return 1.0;
  }
  // Whether the engine's layers run on a device (a GPU): then `hidden`,
  // k_layer and v_layer are that device's memory (positions and tokens stay
  // the host's) and the composition runs there too (ComposeOnDevice,
  // knowledge/device_compose.h). The device's work queued before a call is
  // complete when it is made; the engine's writes must be complete when it
  // returns.
  virtual bool on_device() const { return false; }
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

// The defaults were chosen on the tuning text (bench/texts/stories.txt, the
// reference model; docs/blending.md): with a KV pass, ratio 0.28 over check
// layers 1 and 2 costs f = 0.55 of a prefill (what CacheBlend's 15% at one
// whole check layer costs) for a third of its KL. Without a KV pass the
// engine gets CacheBlend's published setting (15%, check layer 1).
inline constexpr double kDefaultRatio = 0.28;
inline constexpr double kDefaultRatioWholeChecks = 0.15;

struct BlendOptions {
  double ratio = kDefaultRatio;     // fraction of cached positions recomputed after the checks, in [0, 1]
  double threshold = -1;            // >= 0: select by deviation >= threshold instead of by ratio
  // Ascending; the first one is where selection starts. Empty: layers 1 and
  // 2 (1 in a 2-layer model, 0 in a 1-layer one).
  std::vector<int> check_layers;
  kernels::RopeSpec rope;           // how the model rotates keys (for re-positioning)
  // A latent (MLA) model, kept as one head of latent_dim / 2 (ModelShape:
  // kv_heads 1, head_dim latent_dim / 2; the K plane the latent's first
  // half, the V plane its second): its RoPE dims are the last rope.head_dim
  // of each V-plane row (rope.head_dim <= head_dim; 0: none), and only they
  // are re-positioned; the selection compares the K plane, the latent's
  // leading content dims (no RoPE there). An engine of such a model sees
  // the latent whole through LatentLayers.
  bool latent = false;
  int first_tokens = 0;             // >= 0: leading positions of each cached piece recomputed at every layer
  bool kv_pass = true;              // check layers by a KV pass when the engine has one (same KV, less work)
};

struct BlendReport {
  int positions = 0;                 // of the composed context
  int cached_positions = 0;          // placed from cached KV
  int fresh_positions = 0;           // computed now at every layer
  int anchored = 0;                  // cached positions recomputed at every layer (first_tokens of each piece)
  int selected = 0;                  // other cached positions recomputed past the last check layer
  std::vector<int> recomputed_per_layer;  // positions run through each layer
  std::vector<int> kv_pass_per_layer;     // positions given only a KV pass at each layer (check layers)
  double kv_pass_cost = 0;                // the engine's cost of a KV-pass row over a whole layer's
  // (sum(recomputed_per_layer) + kv_pass_cost * sum(kv_pass_per_layer)) / (layers * positions)
  double recompute_fraction = 0;
  std::vector<int> selected_positions;    // ascending (the anchored ones not among them)
  // With an accuracy gate (BlendDocuments, blend/gate.h): whether it refused
  // the method (every position then recomputed: full prefill), and the KL
  // ratio the gate file holds for it (-1: none).
  bool gated = false;
  double gate_kl_ratio = -1;
};

// A latent (MLA) model's engine sees each position's latent vector whole:
// its Layer and KvPass get k_layer as [position][latent_dim] floats and
// v_layer null. The blender keeps a latent as two planes of latent_dim / 2
// (BlendOptions::latent); this adapter gathers them into one buffer before
// each call and puts the called positions' rows back after it (host memory:
// an engine on a device is refused).
class LatentLayers final : public LayerEngine {
 public:
  LatentLayers(LayerEngine& inner, int latent_dim) : inner_(inner), latent_(latent_dim) {}
  Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k_layer,
               float* v_layer, int total) override {
    return Run(false, layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  Status KvPass(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                float* k_layer, float* v_layer, int total) override {
    return Run(true, layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  bool has_kv_pass() const override { return inner_.has_kv_pass(); }
  double kv_pass_cost(int total) const override { return inner_.kv_pass_cost(total); }
  int hidden_dim() const override { return inner_.hidden_dim(); }
  bool on_device() const override { return false; }

 private:
  Status Run(bool kv_pass, int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
             float* k_plane, float* v_plane, int total);
  LayerEngine& inner_;
  int latent_;
  std::vector<float> whole_;  // [total][latent_dim]
};

// The check layers `options` gives for a model of `layers` layers (its
// default when empty).
std::vector<int> CheckLayersFor(const BlendOptions& options, int layers);

// Composes the context; `kv_out` receives [layer][k|v][position][kv_dim]
// float32. kInvalidArgument on inconsistent pieces or options; an engine
// failure is returned as is (the blend stops there).
Result<BlendReport> Compose(const ModelShape& shape, std::span<const Piece> pieces, const BlendOptions& options,
                            LayerEngine& engine, std::vector<float>* kv_out);

// Where a composition's KV and the running positions' hidden states live,
// and the row work done on them: host memory (Compose) or a device's
// (knowledge/device_compose.h). Compose's algorithm is one whatever the
// space; a space's float pointers are what the engine is handed. Indices
// are host arrays.
class ComposeSpace {
 public:
  virtual ~ComposeSpace() = default;
  // Room for the composed KV (`floats`, contents unset: every element is
  // written by a placement or by the engine before it is read).
  virtual Status InitKv(size_t floats) = 0;
  virtual float* kv() = 0;
  // Host floats `src` (n of them) copied to kv() + offset.
  virtual Status PlaceRows(size_t offset, const float* src, size_t n) = 0;
  // Keys at kv() + offset (`tokens` rows of row_stride floats) moved by
  // delta positions (kernels/common/rope_reposition.h).
  virtual Status ShiftKeys(const kernels::RopeSpec& rope, size_t offset, std::int64_t row_stride, std::int64_t tokens,
                           int kv_heads, std::int64_t delta) = 0;
  // The running rows' hidden states: `rows` rows of `width` floats (unset).
  virtual Status InitHidden(size_t rows, int width) = 0;
  virtual float* hidden() = 0;
  // hidden() = its rows `keep` (ascending), in that order.
  virtual Status KeepHidden(std::span<const std::int32_t> keep, int width) = 0;
  // A scratch of hidden() rows `rows` (copy = false: of their number, unset).
  virtual Result<float*> CandidateHidden(std::span<const std::int32_t> rows, int width, bool copy) = 0;
  // Saves rows `rows` of the K plane at kv() + offset (kv_dim floats each),
  // in that order, for Deviations.
  virtual Status SaveKeys(size_t offset, std::span<const std::int32_t> rows, int kv_dim) = 0;
  // out[i] = the squared distance of plane row plane_rows[i] from saved row
  // saved_rows[i] (kernels/common/blend_rows.h); out is host memory.
  virtual Status Deviations(size_t offset, std::span<const std::int32_t> plane_rows,
                            std::span<const std::int32_t> saved_rows, int kv_dim, double* out) = 0;
  // Called before each engine call: the space's queued work is complete.
  virtual Status BeforeEngine() { return Status::Ok(); }
};

// Compose in `space`: kv() then holds what Compose writes to kv_out.
Result<BlendReport> ComposeIn(const ModelShape& shape, std::span<const Piece> pieces, const BlendOptions& options,
                              LayerEngine& engine, ComposeSpace& space);

}  // namespace kdn::blend
