// SPDX-License-Identifier: Apache-2.0
// llama2.c checkpoints: the header, the fp32 weights, and validation.
// Thread-safety: a Checkpoint is immutable after loading; share it freely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace kdn::model {

struct ModelConfig {
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int vocab_size = 0;
  int seq_len = 0;
  bool shared_classifier = true;

  int head_dim() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_dim(); }
  // KV bytes per token in fp32: layers x (K + V) x kv_dim x 4.
  std::int64_t kv_bytes_per_token() const { return std::int64_t{n_layers} * 2 * kv_dim() * 4; }
  Status Validate() const;
};

// The shape of stories260K, used for the randomly initialised stand-in.
ModelConfig Stories260KConfig();

class Checkpoint {
 public:
  struct Layer {
    const float* rms_att;  // [dim]
    const float* wq;       // [dim][dim]
    const float* wk;       // [kv_dim][dim]
    const float* wv;       // [kv_dim][dim]
    const float* wo;       // [dim][dim]
    const float* rms_ffn;  // [dim]
    const float* w1;       // [hidden][dim]
    const float* w2;       // [dim][hidden]
    const float* w3;       // [hidden][dim]
  };

  // Parses a whole llama2.c file image; errors name what is wrong.
  static Result<Checkpoint> Parse(const std::vector<std::uint8_t>& bytes);
  static Result<Checkpoint> Load(const std::string& path);
  // Deterministic random weights of the given shape (for runs without the file).
  static Checkpoint Random(const ModelConfig& config, std::uint64_t seed);

  Checkpoint(const Checkpoint& other) : config_(other.config_), data_(other.data_) { Bind(); }
  Checkpoint(Checkpoint&& other) noexcept : config_(other.config_), data_(std::move(other.data_)) { Bind(); }
  Checkpoint& operator=(const Checkpoint&) = delete;
  Checkpoint& operator=(Checkpoint&&) = delete;

  const ModelConfig& config() const { return config_; }
  const float* tok_emb() const { return tok_emb_; }  // [vocab][dim]
  const float* rms_final() const { return rms_final_; }
  const float* classifier() const { return wcls_; }  // [vocab][dim]
  const Layer& layer(int l) const { return layers_[static_cast<size_t>(l)]; }

  // Number of floats a file of this config holds after the header.
  static std::int64_t FloatCount(const ModelConfig& c);

 private:
  Checkpoint(ModelConfig config, std::vector<float> data) : config_(config), data_(std::move(data)) { Bind(); }
  void Bind();

  ModelConfig config_;
  std::vector<float> data_;
  const float* tok_emb_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* wcls_ = nullptr;
  std::vector<Layer> layers_;
};

}  // namespace kdn::model
