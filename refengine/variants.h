// SPDX-License-Identifier: Apache-2.0
// Small model variants of the kinds served today (docs/model-kinds.md), to
// prove that kdn gives back what an engine of each kind needs, bit for bit:
// multi-head latent attention (DeepSeek's MLA: one latent per token, K and V
// rebuilt from it, a shared RoPE key), sliding-window attention (Gemma 3,
// gpt-oss: the last W tokens), and a recurrent layer (a Mamba-style short
// convolution then gated linear attention: a fixed-size state, no per-token
// KV), beside full attention.
//
// The weights are seeded random numbers, not trained: exact reuse is a
// matter of the same arithmetic on the same numbers, which trained weights
// do not change; what they would change (codec ratios, KL of lossy KV)
// means nothing here and is not measured with these models.
//
// The forward pass is one token at a time (a decode step), in float32, in
// one fixed order: a prompt fed token by token and one whose prefix came
// from a cache compute the same bits when the cache holds the same bits.
// Thread-safety: a VariantModel is immutable; a Cache belongs to one caller.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kdn::refengine {

enum class LayerKind { kFull, kSliding, kLatent, kRecurrent };

struct VariantConfig {
  std::string name;
  std::vector<LayerKind> layers;
  int vocab = 64, dim = 32, heads = 4, head_dim = 8, kv_heads = 2, hidden = 64;
  int window = 12;                         // sliding layers: the last `window` tokens, this one included
  int latent_rank = 16, latent_rope = 8;   // latent layers: a latent of rank + rope dims per token
  int conv_width = 4;                      // recurrent layers: the short convolution's taps
  float decay = 0.9f;                      // recurrent layers: the linear-attention state's decay
  std::uint64_t seed = 36;
  int max_tokens = 256;
};

// "mla" (latent layers), "sliding" (sliding, full, sliding), "recurrent"
// (full, recurrent, full), "hybrid" (sliding, recurrent, full, sliding).
// Every name the tests use; an unknown one throws std::invalid_argument.
VariantConfig Variant(std::string_view name);

class VariantModel {
 public:
  explicit VariantModel(VariantConfig config);
  const VariantConfig& config() const { return c_; }

  // The attention layers (full, sliding, latent: in model order), which
  // cache per-token KV, and the recurrent ones, which keep a state.
  int attention_layers() const { return n_attention_; }
  int state_layers() const { return n_recurrent_; }
  bool latent() const;
  // Per attention layer and token: K's (and V's) floats, or the latent's.
  int kv_width() const;
  // A recurrent layer's state: the convolution's last conv_width - 1
  // inputs, then the linear-attention state (heads x head_dim x head_dim).
  int state_floats() const;
  // Per attention layer: its window in tokens (0: full attention).
  std::vector<std::uint32_t> windows() const;

  struct Cache {
    std::vector<std::vector<float>> k, v;   // [attention layer][token][kv_width] (latent: k only)
    std::vector<std::vector<float>> state;  // [recurrent layer][state_floats]
  };
  // KV filled with `fill` (a NaN shows any read of KV never written), states zero.
  Cache NewCache(float fill = 0.0f) const;
  // Token `token` at position `pos`: its KV (or latent) into the cache, the
  // states advanced; returns the logits.
  std::vector<float> Step(Cache& cache, int token, int pos) const;
  // Step's parts, for an engine that runs the model layer by layer
  // (blending's LayerEngine): the token's embedding (layer 0's input), one
  // layer for the token at `pos` (x: the layer's input, on return its
  // output; its KV or latent into the cache, its state advanced), and the
  // logits of the last layer's output. Step is these in order, bit for bit.
  std::vector<float> Embed(int token) const;
  void LayerStep(int layer, Cache& cache, int pos, std::vector<float>& x) const;
  std::vector<float> Logits(const std::vector<float>& x) const;

 private:
  struct Layer;
  VariantConfig c_;
  std::vector<Layer> layers_;
  std::vector<int> slot_;  // model layer -> its index among the attention (or the recurrent) layers
  int n_attention_ = 0, n_recurrent_ = 0;
  std::vector<float> embed_, out_norm_, out_;
  void Attention(const Layer& L, Cache& cache, int slot, const std::vector<float>& h, int pos, std::vector<float>& x) const;
  void Latent(const Layer& L, Cache& cache, int slot, const std::vector<float>& h, int pos, std::vector<float>& x) const;
  void Recurrent(const Layer& L, Cache& cache, int slot, const std::vector<float>& h, std::vector<float>& x) const;

 public:
  ~VariantModel();
  VariantModel(VariantModel&&) noexcept;
};

// Greedy argmax (the lowest index among equals).
int Argmax(const std::vector<float>& logits);

}  // namespace kdn::refengine
