#include "store/host_tier.h"

namespace kdn::store {

Object HostTier::Get(const keys::Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.object;
}

bool HostTier::Touch(const keys::Digest& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return true;
}

bool HostTier::Contains(const keys::Digest& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.count(key) != 0;
}

TierUsage HostTier::Usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TierUsage{map_.size(), bytes_, capacity_, evictions_};
}

}  // namespace kdn::store
