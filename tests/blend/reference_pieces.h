// SPDX-License-Identifier: Apache-2.0
// The blend tests' pieces from the reference model: the transformer, chunks
// of the reference ids, and a chunk's KV computed alone after a BOS.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "core/blend/blend.h"
#include "lab/model/checkpoint.h"
#include "lab/model/transformer.h"
#include "test_models.h"

namespace kdn::blend::testing {

inline constexpr int kBos = 1;

struct Fixture {
  std::unique_ptr<model::Checkpoint> weights;
  std::unique_ptr<model::Transformer> t;
};

// The reference model on one thread (t is null when it cannot be loaded).
inline Fixture Load() {
  Fixture f;
  auto w = model::Checkpoint::Load(kdn::testing::ModelPath());
  if (!w.ok()) return f;
  f.weights = std::make_unique<model::Checkpoint>(std::move(*w));
  f.t = std::make_unique<model::Transformer>(*f.weights, 1);
  return f;
}

// Chunks of the reference ids (no BOS).
inline std::vector<std::int32_t> Chunk(int i, int n) {
  std::vector<std::int32_t> out;
  for (int k = 0; k < n; ++k) {
    out.push_back(kdn::testing::kReferenceIds[static_cast<size_t>((i * 13 + k) % kdn::testing::kReferenceIds.size())]);
  }
  return out;
}

// A chunk's KV computed alone after a BOS (positions 1..n, cached_first 1).
inline Piece Cached(model::Transformer& t, const std::vector<std::int32_t>& tokens) {
  std::vector<int> seq = {kBos};
  seq.insert(seq.end(), tokens.begin(), tokens.end());
  model::KvCache cache = t.NewCache();
  EXPECT_TRUE(t.Forward(seq, 0, cache, nullptr).ok());
  return Piece{tokens, cache.Export(1, 1 + static_cast<int>(tokens.size())), 1};
}

}  // namespace kdn::blend::testing
