// Eviction policies: which object of a tier goes next. A policy tracks keys
// and sizes only; the tier slot in the chain calls it under its own lock.
// Thread-safety: none; the caller serializes every call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "keys/hash.h"

namespace kdn::store {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  // A new object (not present before).
  virtual void OnInsert(const keys::Digest& key, std::uint64_t bytes) = 0;
  // A hit on a present object.
  virtual void OnAccess(const keys::Digest& key) = 0;
  // The object left the tier (evicted or erased). Unknown keys are ignored.
  virtual void OnRemove(const keys::Digest& key) = 0;
  // The next object to evict among those `evictable` accepts (leased or
  // pinned ones are refused), or nullopt when none is. It stays tracked
  // until OnRemove.
  virtual std::optional<keys::Digest> Victim(const std::function<bool(const keys::Digest&)>& evictable) = 0;
  virtual std::uint64_t tracked() const = 0;  // objects tracked
};

enum class PolicyKind { kLru, kS3Fifo };

// Parses "lru" / "s3fifo".
std::optional<PolicyKind> ParsePolicy(const std::string& name);
const char* PolicyName(PolicyKind kind);
// capacity_bytes sizes S3-FIFO's small queue (10%) and ghost queue.
std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind, std::uint64_t capacity_bytes);

}  // namespace kdn::store
