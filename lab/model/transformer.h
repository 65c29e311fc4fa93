// SPDX-License-Identifier: Apache-2.0
// The reference transformer: a llama-family forward pass on the CPU in fp32.
// Batched prefill runs N tokens as matrix-matrix products; it resumes from a
// KV prefix already in the cache (the path reused KV takes); a decode step is
// a prefill of one token.
// Thread-safety: a Transformer is used by one thread at a time (it owns
// scratch buffers and a thread pool); a KvCache likewise.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "lab/model/checkpoint.h"
#include "core/util/status.h"
#include "core/util/thread_pool.h"

namespace kdn::model {

// KV of one sequence, one allocation laid out [layer][k|v][pos][kv_head][head_dim]
// (keys after RoPE), so that a strided view of it describes every position.
class KvCache {
 public:
  KvCache(int layers, int max_seq, int kv_dim);
  int layers() const { return layers_; }
  int max_seq() const { return max_seq_; }
  int kv_dim() const { return kv_dim_; }
  float* k(int layer, int pos) { return data_.data() + Offset(layer, 0, pos); }
  float* v(int layer, int pos) { return data_.data() + Offset(layer, 1, pos); }
  const float* k(int layer, int pos) const { return data_.data() + Offset(layer, 0, pos); }
  const float* v(int layer, int pos) const { return data_.data() + Offset(layer, 1, pos); }
  float* data() { return data_.data(); }
  size_t size_floats() const { return data_.size(); }
  // Element strides of (layer, kv, pos); a head is kv_dim / kv_heads floats.
  std::int64_t stride_layer() const { return std::int64_t{2} * max_seq_ * kv_dim_; }
  std::int64_t stride_kv() const { return std::int64_t{max_seq_} * kv_dim_; }

  // The KV of positions [begin, end) in the canonical chunk layout
  // [layer][k|v][token][kv_head][head_dim].
  std::vector<float> Export(int begin, int end) const;
  // Writes canonical-layout KV of `tokens` positions starting at `begin`.
  Status Import(int begin, int tokens, std::span<const float> canonical);

 private:
  size_t Offset(int layer, int kv, int pos) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(stride_layer()) +
           static_cast<size_t>(kv) * static_cast<size_t>(stride_kv()) + static_cast<size_t>(pos) * kv_dim_;
  }
  int layers_, max_seq_, kv_dim_;
  std::vector<float> data_;
};

class Transformer {
 public:
  // Borrows `weights`, which must outlive the transformer. threads <= 0: all cores.
  explicit Transformer(const Checkpoint& weights, int threads = 0);

  const ModelConfig& config() const { return w_.config(); }
  KvCache NewCache() const;

  // Runs `tokens` at positions [start, start + n): the cache must hold the KV
  // of [0, start). Writes their KV into the cache. When `logits` is given it
  // receives the logits of the last position (vocab floats); with
  // `all_logits`, those of every position ([n][vocab]).
  Status Forward(std::span<const int> tokens, int start, KvCache& cache, std::vector<float>* logits,
                 bool all_logits = false);

  // One layer for some positions, over KV held elsewhere (the blender's
  // recompute, core/blend). `positions` ascend within [0, total_positions);
  // `hidden` holds one row of config().dim floats per position: the layer's
  // input (at layer 0 the rows are filled from `tokens`' embeddings instead)
  // and, on return, its output. The rows' K (after RoPE at their positions)
  // and V are written into k_layer / v_layer ([position][kv_dim], this
  // layer's), then each row attends causally over positions [0, its own].
  // Computed exactly as Forward computes the same rows, so running every
  // position through every layer reproduces Forward's KV bit for bit.
  Status ForwardLayer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                      float* k_layer, float* v_layer, int total_positions);
  // Only the K and V of a layer for some positions (the blender's KV pass):
  // as ForwardLayer writes them, bit for bit, without the attention and the
  // feed-forward; `hidden` stays the layer's input (at layer 0 it is filled
  // from `tokens`' embeddings).
  Status ForwardKv(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                   float* k_layer, float* v_layer, int total_positions);
  // Multiply-adds per position of one layer, in a context of `total`
  // positions (causal attention: about (total + 1) / 2 of them per query),
  // and of the K and V projections alone.
  double LayerMacs(int total) const;
  double KvMacs() const;
  // The logits ([rows][vocab]) of final hidden rows (after the last layer).
  void Logits(const float* hidden, int rows, std::vector<float>* logits);

 private:
  // out[n][m] = x[n][k] . w[m][k]^T
  void MatMul(const float* x, const float* w, float* out, int n, int k, int m);
  // Scratch sizes and the rotary cos/sin for these rows' positions.
  void Prepare(std::span<const int> positions);
  // Layer l for rows x (one per position; Prepare first), KV of the layer.
  void Layer(int l, std::span<const int> positions, float* x, float* k_layer, float* v_layer);
  void Attention(const int* positions, int n, const float* k_layer, const float* v_layer);
  // K and V of the n rows normalised in xb_ (Prepare first), rotated and
  // written at their positions.
  void ProjectKv(const Checkpoint::Layer& L, std::span<const int> positions, float* k_layer, float* v_layer);
  // A layer call's input rows (at layer 0 the tokens' embeddings) and scratch.
  void EmbedAndPrepare(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden);
  Status CheckLayerCall(int layer, std::span<const int> positions, std::span<const int> tokens,
                        int total_positions) const;

  const Checkpoint& w_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<double> inv_freq_;  // per rotary pair
  // Scratch, sized per call.
  std::vector<float> x_, xb_, q_, k_, v_, att_, h1_, h3_, tmp_, cs_, sn_;
};

// Index of the largest logit (the first on ties).
int Argmax(std::span<const float> logits);

}  // namespace kdn::model
