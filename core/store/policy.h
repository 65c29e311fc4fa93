// SPDX-License-Identifier: Apache-2.0
// Eviction policies: which object of a tier goes next. A policy tracks keys
// and sizes only; the tier slot in the chain calls it under its own lock.
// Thread-safety: none; the caller serializes every call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/keys/hash.h"

namespace kdn::store {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  // A new object (not present before), of `bytes` in the tier, whose
  // presence saves `value` of prefill work when it is reused (PrefillValue;
  // 0: unknown). Policies that do not weigh value (LRU, S3-FIFO) ignore it.
  virtual void OnInsert(const keys::Digest& key, std::uint64_t bytes, double value) = 0;
  // A hit on a present object.
  virtual void OnAccess(const keys::Digest& key) = 0;
  // The object left the tier (evicted or erased). Unknown keys are ignored.
  virtual void OnRemove(const keys::Digest& key) = 0;
  // The next object to evict among those `evictable` accepts (leased or
  // pinned ones are refused), or nullopt when none is. It stays tracked
  // until OnRemove.
  virtual std::optional<keys::Digest> Victim(const std::function<bool(const keys::Digest&)>& evictable) = 0;
  virtual std::uint64_t tracked() const = 0;  // objects tracked
  // How often a tracked object was used (inserted, then hit), for policies
  // that count it; 0 otherwise.
  virtual std::uint64_t Uses(const keys::Digest& key) const {
    (void)key;
    return 0;
  }
};

enum class PolicyKind { kLru, kS3Fifo, kCost };

// Parses "lru" / "s3fifo" / "cost".
std::optional<PolicyKind> ParsePolicy(const std::string& name);
const char* PolicyName(PolicyKind kind);
// capacity_bytes sizes S3-FIFO's small queue (10%) and ghost queue.
std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind, std::uint64_t capacity_bytes);

// ---- What a chunk is worth (the cost-aware policy's input) ----------------
// The context length at which a token's attention costs as much as the rest
// of its forward pass (the MLP and projections). For a Llama-3-8B-like model
// that is ~30k tokens by FLOPs (2 x 8e9 per token against 4 x 32 layers x
// 4096 x context for QK^T and AV); attention kernels run below peak, so kdn
// takes 16k. A model with fewer parameters per layer width reaches it sooner.
inline constexpr double kAttentionParityTokens = 16384.0;

// The prefill work of `tokens` tokens starting at `first_position` (< 0:
// position-free, taken as 0), in token-equivalents (one token at an empty
// context = 1): each token costs 1 + its context / kAttentionParityTokens.
inline double PrefillCost(std::int64_t first_position, std::uint64_t tokens) {
  const double p = first_position < 0 ? 0.0 : static_cast<double>(first_position);
  const double n = static_cast<double>(tokens);
  return n * (1.0 + (p + (n - 1.0) / 2.0) / kAttentionParityTokens);
}

// The value the store gives chunk `index` of the `count` chunks of one
// request, `tokens` long, when the whole request costs `mean` per token
// (its PrefillCost / its tokens): its tokens at that mean, so that every
// chunk of a request is worth as much per byte (not its own cost, which
// grows with its position), less up to 1% the later it comes: a request's
// later chunks go before its first ones, without which they are useless (a
// lookup reuses a prefix).
inline double ChunkValue(double mean, std::uint64_t tokens, size_t index, size_t count) {
  const double later = count > 1 ? static_cast<double>(index) / static_cast<double>(count - 1) : 0.0;
  return static_cast<double>(tokens) * mean * (1.0 - 0.01 * later);
}


// ---- Load or recompute (never slower than prefill) -------------------------
// A load's chunks, in order: `deliver[i]` the time chunk i's delivery is
// expected to take from the tier that holds it (0: unknown, taken as free:
// it is fetched, which measures it), `recompute[i]` the time the engine
// would take to prefill its tokens instead. Engines use a cached prefix:
// loading n chunks and recomputing the rest costs the first n deliveries
// plus the other recomputes. Returns the n that costs least (the largest
// of equal ones: a tie loads).
inline size_t CheapestPrefix(std::span<const double> deliver, std::span<const double> recompute) {
  size_t best = 0;
  double gain = 0, best_gain = 0;  // sum over the first n of (recompute - deliver)
  for (size_t i = 0; i < deliver.size() && i < recompute.size(); ++i) {
    gain += recompute[i] - deliver[i];
    if (gain >= best_gain) {
      best_gain = gain;
      best = i + 1;
    }
  }
  return best;
}

}  // namespace kdn::store
