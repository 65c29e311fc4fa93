// The host tier: chunks in host memory under a byte capacity, evicting the
// least recently used when full. Objects are immutable and handed out as
// shared pointers, so a reader keeps the bytes it is copying even if the
// object is evicted meanwhile (a read lease).
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "keys/hash.h"

namespace kdn::store {

using Bytes = std::vector<std::uint8_t>;
using Object = std::shared_ptr<const Bytes>;

struct TierUsage {
  std::uint64_t objects = 0;
  std::uint64_t bytes = 0;
  std::uint64_t capacity = 0;
  std::uint64_t evictions = 0;
};

class HostTier {
 public:
  explicit HostTier(std::uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Inserts an object, evicting least recently used ones to make room.
  // Returns false (and stores nothing) when the object alone exceeds the
  // capacity. Re-putting a present key only refreshes its recency. `on_evict`
  // is called, under the tier's lock, with each evicted key.
  template <typename OnEvict>
  bool Put(const keys::Digest& key, Object object, OnEvict&& on_evict);
  bool Put(const keys::Digest& key, Object object) {
    return Put(key, std::move(object), [](const keys::Digest&) {});
  }
  // The object, refreshed as most recently used; nullptr on a miss.
  Object Get(const keys::Digest& key);
  // Refreshes a present object as most recently used; false on a miss.
  bool Touch(const keys::Digest& key);
  // Presence without touching recency.
  bool Contains(const keys::Digest& key) const;
  TierUsage Usage() const;

 private:
  struct Entry {
    Object object;
    std::list<keys::Digest>::iterator lru;
  };
  const std::uint64_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<keys::Digest, Entry, keys::DigestHash> map_;  // guarded by mu_
  std::list<keys::Digest> lru_;                                    // front = most recent; guarded by mu_
  std::uint64_t bytes_ = 0;                                        // guarded by mu_
  std::uint64_t evictions_ = 0;                                    // guarded by mu_
};

template <typename OnEvict>
bool HostTier::Put(const keys::Digest& key, Object object, OnEvict&& on_evict) {
  const std::uint64_t size = object->size();
  if (size > capacity_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = map_.find(key); it != map_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return true;
  }
  while (bytes_ + size > capacity_ && !lru_.empty()) {
    const keys::Digest victim = lru_.back();
    auto it = map_.find(victim);
    bytes_ -= it->second.object->size();
    map_.erase(it);
    lru_.pop_back();
    ++evictions_;
    on_evict(victim);
  }
  lru_.push_front(key);
  map_.emplace(key, Entry{std::move(object), lru_.begin()});
  bytes_ += size;
  return true;
}

}  // namespace kdn::store
