// SPDX-License-Identifier: Apache-2.0
// Pins that several owners (documents) hold on one object (a chunk): per
// key, one deadline per pin. What the object's pin is, is the rule of every
// registry of documents (the runtime's knowledge index, kdnd's): a pin
// without a deadline (0) wins, otherwise the latest deadline.
// Deadline is the owners' unit (nanoseconds of a clock, wall-clock
// milliseconds): the book only orders them.
// Thread-safety: none (its owner's lock guards it).
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <unordered_map>

namespace kdn::store {

template <typename Key, typename Deadline, typename Hash = std::hash<Key>>
class PinBook {
 public:
  // One more pin on `key`, until `deadline` (0: none).
  void Add(const Key& key, Deadline deadline) { pins_[key].insert(deadline); }
  // Removes one pin with that deadline (none: nothing).
  void Remove(const Key& key, Deadline deadline) {
    auto it = pins_.find(key);
    if (it == pins_.end()) return;
    if (auto one = it->second.find(deadline); one != it->second.end()) it->second.erase(one);
    if (it->second.empty()) pins_.erase(it);
  }
  // The pin `key` holds: 0 when some pin has no deadline, else the latest
  // deadline; nullopt when it has no pin.
  std::optional<Deadline> Effective(const Key& key) const {
    auto it = pins_.find(key);
    if (it == pins_.end() || it->second.empty()) return std::nullopt;
    return *it->second.begin() == Deadline{0} ? Deadline{0} : *it->second.rbegin();
  }
  bool Pinned(const Key& key) const { return pins_.count(key) != 0; }
  size_t keys() const { return pins_.size(); }
  void Clear() { pins_.clear(); }
  // Calls f(key) for every pinned key.
  template <typename F>
  void ForEachKey(F&& f) const {
    for (const auto& [k, deadlines] : pins_) f(k);
  }

 private:
  std::unordered_map<Key, std::multiset<Deadline>, Hash> pins_;
};

}  // namespace kdn::store
