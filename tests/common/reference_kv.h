// SPDX-License-Identifier: Apache-2.0
// The reference model's KV of a short text, in the canonical layout
// ([layer][k|v][token][head][dim], f32), with the ModelKv that describes it:
// real KV for tests of the tiers and the node.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/keys/hash.h"
#include "lab/model/tokenizer.h"
#include "lab/model/transformer.h"
#include "core/engine/kv_store.h"
#include "test_models.h"

namespace kdn::testing {

struct ReferenceKv {
  std::unique_ptr<model::Checkpoint> weights;
  std::unique_ptr<model::Transformer> t;
  store::ModelKv m;
  std::vector<int> tokens;
  std::vector<float> canonical;

  store::TokenKeys Keys() const {
    store::TokenKeys k;
    k.tokens = {reinterpret_cast<const std::int32_t*>(tokens.data()), tokens.size()};
    return k;
  }
};

inline ReferenceKv PrefillReference(const std::string& text) {
  ReferenceKv r;
  r.weights = std::make_unique<model::Checkpoint>(model::Checkpoint::Load(ModelPath()).value());
  auto tok = model::Tokenizer::Load(TokenizerPath(), 512).value();
  r.t = std::make_unique<model::Transformer>(*r.weights);
  const auto& c = r.t->config();
  r.tokens = tok.Encode(text, true);
  model::KvCache cache = r.t->NewCache();
  if (!r.t->Forward(r.tokens, 0, cache, nullptr).ok()) return r;
  r.m.fingerprint = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "stories260K"});
  r.m.shape = {c.n_layers, c.n_kv_heads, c.head_dim(), 4};
  const size_t T = r.tokens.size(), row = static_cast<size_t>(c.kv_dim());
  r.canonical.resize(static_cast<size_t>(c.n_layers) * 2 * T * row);
  for (int l = 0; l < c.n_layers; ++l) {
    for (size_t t = 0; t < T; ++t) {
      std::memcpy(&r.canonical[((static_cast<size_t>(l) * 2 + 0) * T + t) * row], cache.k(l, static_cast<int>(t)), row * 4);
      std::memcpy(&r.canonical[((static_cast<size_t>(l) * 2 + 1) * T + t) * row], cache.v(l, static_cast<int>(t)), row * 4);
    }
  }
  return r;
}

// The KV of a short story (26 tokens with BOS), as the store tests use it.
inline ReferenceKv PrefillStory() {
  return PrefillReference("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.");
}

}  // namespace kdn::testing
