// SPDX-License-Identifier: Apache-2.0
// The reference transformer as a blend engine (tests, `kdn blend eval`, the
// demo): LayerEngine::Layer is Transformer::ForwardLayer, KvPass ForwardKv.
// Thread-safety: as the transformer (one thread at a time).
#pragma once

#include "core/blend/blend.h"
#include "lab/model/transformer.h"

namespace kdn::blend {

class TransformerEngine final : public LayerEngine {
 public:
  explicit TransformerEngine(model::Transformer& t) : t_(t) {}
  Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k_layer,
               float* v_layer, int total) override {
    return t_.ForwardLayer(layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  int hidden_dim() const override { return t_.config().dim; }
  Status KvPass(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                float* k_layer, float* v_layer, int total) override {
    return t_.ForwardKv(layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  bool has_kv_pass() const override { return kv_pass_; }
  double kv_pass_cost(int total) const override { return t_.KvMacs() / t_.LayerMacs(total); }
  // Without a KV pass, check layers run whole (CacheBlend as published).
  void set_kv_pass(bool on) { kv_pass_ = on; }

 private:
  model::Transformer& t_;
  bool kv_pass_ = true;
};

// The RoPE of a llama2.c model (interleaved pairs, theta 10000, the whole head).
inline kernels::RopeSpec Llama2cRope(const model::ModelConfig& c) {
  kernels::RopeSpec s;
  s.head_dim = c.head_dim();
  s.rotary_dim = c.head_dim();
  s.theta = 10000.0;
  s.style = kernels::RopeStyle::kInterleaved;
  return s;
}

inline ModelShape ShapeOf(const model::ModelConfig& c) { return ModelShape{c.n_layers, c.n_kv_heads, c.head_dim()}; }

}  // namespace kdn::blend
