// SPDX-License-Identifier: Apache-2.0
// Eviction policies: LRU, S3-FIFO and the cost-aware GDSF.
//
// Both keep intrusive-free std::list queues plus a hash index from key to
// list position, so insert / access / remove are O(1) and moving an object
// between queues is a splice (iterators stay valid).
//
// Victim never removes: it names a candidate that stays tracked until the
// caller reports OnRemove. A caller may also change its mind and never call
// OnRemove; each policy below keeps its queues consistent in both cases.
#include "core/store/policy.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <list>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

namespace kdn::store {
namespace {

using keys::Digest;
using keys::DigestHash;
using Evictable = std::function<bool(const Digest&)>;

// ---------------------------------------------------------------------------
// LRU: one list, most recently used at the front.
// ---------------------------------------------------------------------------
class LruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "lru"; }

  void OnInsert(const Digest& key, std::uint64_t /*bytes*/, double /*value*/) override {
    // The contract says the key is new; a repeated insert is treated as a
    // use rather than tracked twice.
    if (auto it = index_.find(key); it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.push_front(key);
    index_.emplace(key, order_.begin());
  }

  void OnAccess(const Digest& key) override {
    if (auto it = index_.find(key); it != index_.end()) order_.splice(order_.begin(), order_, it->second);
  }

  void OnRemove(const Digest& key) override {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    order_.erase(it->second);
    index_.erase(it);
  }

  // Walks from the least recently used end; refused keys keep their place,
  // so once released they are the first candidates again. O(refused) per call.
  std::optional<Digest> Victim(const Evictable& evictable) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it)
      if (evictable(*it)) return *it;
    return std::nullopt;
  }

  std::uint64_t tracked() const override { return index_.size(); }

 private:
  std::list<Digest> order_;
  std::unordered_map<Digest, std::list<Digest>::iterator, DigestHash> index_;
};

// ---------------------------------------------------------------------------
// S3-FIFO, after Yang, Zhang, Qiu, Yue and Rashmi, "FIFO queues are all you
// need for cache eviction", SOSP 2023 (Algorithm 1 there).
//
//   S  small FIFO, ~10% of the capacity in bytes: where new objects land.
//   M  main FIFO: objects that proved useful (re-accessed while in S, or
//      re-inserted soon after being evicted from S).
//   G  ghost FIFO: keys (no data) of objects recently evicted from S.
//
// Each object carries a 2-bit access counter (0..3), bumped on every hit;
// hits never move anything (that is the point: a hit is a counter write).
// Eviction, done lazily in Victim:
//   - if S holds at least its share (or M is empty): look at S's tail; if it
//     was accessed while in S, move it to M's head with its counter reset;
//     otherwise it is the victim (a "one-hit wonder"), and its key goes to G
//     once the caller removes it;
//   - else look at M's tail: if its counter is non-zero, decrement it and
//     reinsert it at M's head (CLOCK-like second chance); otherwise it is
//     the victim.
// Insertion puts a key found in G straight into M, anything else into S.
// Two simplifications of the paper's pseudo-code, both due to a single byte
// capacity shared by S and M and to Victim naming one object at a time: a
// promotion from S never triggers an eviction from M by itself (M shrinks
// when S is back under its share), and G is bounded by bytes (90% of the
// capacity, like M) rather than by M's object count.
//
// Refusals (leased / pinned objects) and a non-removing Victim:
//   - A refused object with a zero counter keeps its place at the tail end;
//     the walk continues towards the head past it. The promotions and
//     counter decrements made on the way are ordinary steps of the algorithm
//     and stay valid whether or not the victim is then removed.
//   - The victim itself is not moved: if the caller never removes it, the
//     next Victim finds it at the same place (and returns it again if it is
//     still accepted and was not accessed meanwhile).
//   - An S victim is marked; G records its key when OnRemove arrives for it.
//     An object removed without having been named (an explicit erase) is not
//     ghosted: G remembers evictions, not deletions.
//   - Termination: a walk over S visits each object once (promoted, skipped
//     or chosen); a walk over M visits each object at most four times (its
//     counter drops 3, 2, 1, 0 before it is skipped or chosen). Every walk is
//     also capped at 4 * size + 4 steps as a guard. When S is walked after M
//     and promotes objects, M is walked once more, so Victim returns nullopt
//     only when every tracked object was refused.
// ---------------------------------------------------------------------------
class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(std::uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  const char* name() const override { return "s3fifo"; }

  void OnInsert(const Digest& key, std::uint64_t bytes, double /*value*/) override {
    if (auto it = index_.find(key); it != index_.end()) {
      // Not new after all (contract violation): keep one entry, update its
      // size and count the insert as a use.
      Entry& e = *it->second;
      BytesOf(e.queue) -= e.bytes;
      e.bytes = bytes;
      BytesOf(e.queue) += bytes;
      Touch(e);
      return;
    }
    Queue q = Queue::kSmall;
    if (auto g = ghost_index_.find(key); g != ghost_index_.end()) {
      // Ghost hit: evicted from S recently and wanted again, so it belongs in M.
      ghost_bytes_ -= g->second->charge;
      ghost_.erase(g->second);
      ghost_index_.erase(g);
      q = Queue::kMain;
    }
    std::list<Entry>& list = ListOf(q);
    list.push_front(Entry{key, bytes, 0, q, false});
    BytesOf(q) += bytes;
    index_.emplace(key, list.begin());
  }

  void OnAccess(const Digest& key) override {
    if (auto it = index_.find(key); it != index_.end()) Touch(*it->second);
  }

  void OnRemove(const Digest& key) override {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    const auto pos = it->second;
    BytesOf(pos->queue) -= pos->bytes;
    if (pos->queue == Queue::kSmall && pos->named_victim) Ghost(pos->key, pos->bytes);
    ListOf(pos->queue).erase(pos);
    index_.erase(it);
  }

  std::optional<Digest> Victim(const Evictable& evictable) override {
    if (SmallFirst()) {
      // S then M is complete: after the S walk every S object is either
      // refused or in M, and the M walk then sees all of M.
      if (auto v = WalkSmall(evictable)) return v;
      return WalkMain(evictable);
    }
    if (auto v = WalkMain(evictable)) return v;
    const std::uint64_t before = main_.size();
    if (auto v = WalkSmall(evictable)) return v;
    if (main_.size() != before) return WalkMain(evictable);  // promoted objects may be accepted
    return std::nullopt;
  }

  std::uint64_t tracked() const override { return index_.size(); }

 private:
  enum class Queue : std::uint8_t { kSmall, kMain };
  static constexpr std::uint8_t kMaxFreq = 3;  // a 2-bit counter

  struct Entry {
    Digest key;
    std::uint64_t bytes;
    std::uint8_t freq;     // accesses since insertion / promotion / last second chance, capped
    Queue queue;
    bool named_victim;     // returned by Victim while in S: ghost it on removal
  };
  struct GhostEntry {
    Digest key;
    std::uint64_t charge;  // GhostCharge(object bytes)
  };
  using Pos = std::list<Entry>::iterator;

  std::list<Entry>& ListOf(Queue q) { return q == Queue::kSmall ? small_ : main_; }
  std::uint64_t& BytesOf(Queue q) { return q == Queue::kSmall ? small_bytes_ : main_bytes_; }

  // Bytes S may hold: 10% of the capacity, or of what is tracked when the
  // capacity was given as 0 (unknown).
  std::uint64_t SmallTarget() const { return (capacity_ ? capacity_ : small_bytes_ + main_bytes_) / 10; }
  // G remembers about as many bytes as M may hold (the paper sizes G like M).
  std::uint64_t GhostLimit() const {
    const std::uint64_t base = capacity_ ? capacity_ : small_bytes_ + main_bytes_;
    return base - base / 10;
  }
  // What a ghost entry counts against GhostLimit: its object's size, at
  // least 1 so that zero-byte objects cannot make G unbounded.
  static std::uint64_t GhostCharge(std::uint64_t bytes) { return std::max<std::uint64_t>(bytes, 1); }

  // As in the paper, S is evicted from once it reaches its share.
  bool SmallFirst() const { return main_.empty() || (!small_.empty() && small_bytes_ >= SmallTarget()); }

  static void Touch(Entry& e) {
    if (e.freq < kMaxFreq) ++e.freq;
  }

  void Ghost(const Digest& key, std::uint64_t bytes) {
    // The key is not in G already: an insert takes a key out of G.
    ghost_.push_front(GhostEntry{key, GhostCharge(bytes)});
    ghost_bytes_ += ghost_.front().charge;
    ghost_index_.emplace(key, ghost_.begin());
    while (!ghost_.empty() && ghost_bytes_ > GhostLimit()) {
      ghost_bytes_ -= ghost_.back().charge;
      ghost_index_.erase(ghost_.back().key);
      ghost_.pop_back();
    }
  }

  void MoveToMain(Pos pos) {
    small_bytes_ -= pos->bytes;
    main_bytes_ += pos->bytes;
    pos->queue = Queue::kMain;
    pos->freq = 0;
    pos->named_victim = false;
    main_.splice(main_.begin(), small_, pos);
  }

  // Walks S from its tail. `boundary` separates the unvisited part
  // [begin, boundary) from refused objects [boundary, end) left in place.
  std::optional<Digest> WalkSmall(const Evictable& evictable) {
    std::uint64_t guard = 4 * small_.size() + 4;
    auto boundary = small_.end();
    while (boundary != small_.begin() && guard-- > 0) {
      const Pos cur = std::prev(boundary);
      if (cur->freq > 0) {
        MoveToMain(cur);  // accessed while in S: promote (boundary stays valid)
        continue;
      }
      if (evictable(cur->key)) {
        cur->named_victim = true;
        return cur->key;
      }
      boundary = cur;  // refused: keep its place, look further
    }
    return std::nullopt;
  }

  // Walks M from its tail; objects with a non-zero counter get a second
  // chance at the head (and are met again if the walk gets that far).
  std::optional<Digest> WalkMain(const Evictable& evictable) {
    std::uint64_t guard = 4 * main_.size() + 4;
    auto boundary = main_.end();
    while (boundary != main_.begin() && guard-- > 0) {
      const Pos cur = std::prev(boundary);
      if (cur->freq > 0) {
        --cur->freq;
        main_.splice(main_.begin(), main_, cur);
        continue;
      }
      if (evictable(cur->key)) return cur->key;
      boundary = cur;
    }
    return std::nullopt;
  }

  std::uint64_t capacity_;
  std::list<Entry> small_, main_;
  std::uint64_t small_bytes_ = 0, main_bytes_ = 0;
  std::unordered_map<Digest, Pos, DigestHash> index_;  // every tracked object, S or M

  std::list<GhostEntry> ghost_;  // most recent at the front
  std::uint64_t ghost_bytes_ = 0;  // sum of charges
  std::unordered_map<Digest, std::list<GhostEntry>::iterator, DigestHash> ghost_index_;
};

// ---------------------------------------------------------------------------
// Cost-aware: GreedyDual-Size-Frequency (Cherkasova, "Improving WWW proxies
// performance with Greedy-Dual-Size-Frequency caching policy", HP Labs
// 1998; GreedyDual-Size: Cao and Irani, USITS 1997).
//
// Each object has a priority H = L + F * V / S: F its uses (at insert 0.1,
// then +1 per hit: see kFirstUseWeight), V the prefill work its presence
// saves (PrefillValue), S its
// bytes in the tier; the object of lowest H goes first. L, the clock, is the
// H of the last object evicted: objects that stop being used are overtaken
// by newer ones (H of a new object starts at the current L), so old
// frequency does not pin a chunk forever. Why this one: kdn's question is
// "which bytes save the most prefill time per byte held", which is V / S;
// frequency estimates how often that saving recurs, and the clock ages both
// in O(log n) per operation, with no tuning.
//
// Ties (equal H) go to the object placed (inserted or hit) longest ago, as
// in LRU. The store values a request's later chunks a little below its
// first ones (ChunkValue), so that they go first: a lookup reuses a prefix,
// and the later chunks are useless without the first.
//
// V unknown (0: an object listed at open) is taken as the mean value per
// byte of the objects tracked, times its bytes.
// ---------------------------------------------------------------------------
class CostPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "cost"; }

  void OnInsert(const Digest& key, std::uint64_t bytes, double value) override {
    if (index_.count(key) != 0) {
      OnAccess(key);
      return;
    }
    Entry e;
    e.bytes = std::max<std::uint64_t>(bytes, 1);
    if (value > 0) {
      e.value = value;
      known_value_ += value;
      known_bytes_ += static_cast<double>(e.bytes);
      e.known = true;
    } else {
      e.value = known_bytes_ > 0 ? known_value_ / known_bytes_ * static_cast<double>(e.bytes)
                                 : static_cast<double>(e.bytes);
    }
    e.uses = 1;
    Place(key, e);
  }

  void OnAccess(const Digest& key) override {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    Entry e = it->second;
    order_.erase({e.priority, e.tick, key});
    ++e.uses;
    Place(key, e);
  }

  void OnRemove(const Digest& key) override {
    auto it = index_.find(key);
    if (it == index_.end()) return;
    const Entry& e = it->second;
    // Only an eviction (a named victim) advances the clock, not an erase.
    if (named_ && *named_ == key) {
      clock_ = std::max(clock_, e.priority);
      named_.reset();
    }
    if (e.known) {
      known_value_ -= e.value;
      known_bytes_ -= static_cast<double>(e.bytes);
    }
    order_.erase({e.priority, e.tick, key});
    index_.erase(it);
  }

  std::optional<Digest> Victim(const Evictable& evictable) override {
    for (const auto& [priority, tick, key] : order_) {
      (void)priority;
      (void)tick;
      if (evictable(key)) {
        named_ = key;
        return key;
      }
    }
    return std::nullopt;
  }

  std::uint64_t tracked() const override { return index_.size(); }
  std::uint64_t Uses(const Digest& key) const override {
    auto it = index_.find(key);
    return it == index_.end() ? 0 : it->second.uses;
  }

 private:
  struct Entry {
    double value = 0, priority = 0;
    std::uint64_t bytes = 1, uses = 1, tick = 0;
    bool known = false;
  };
  // (priority, tick) ascending: lowest priority first; among equals, the
  // one placed longest ago.

  void Place(const Digest& key, Entry e) {
    e.priority = clock_ + (static_cast<double>(e.uses) - 1.0 + kFirstUseWeight) * e.value / static_cast<double>(e.bytes);
    e.tick = ++tick_;
    order_.insert({e.priority, e.tick, key});
    index_[key] = e;
  }

  // A chunk used once (stored, never hit) counts as a tenth of a use: until
  // it is reused it ranks below what proved reusable, so one-off requests
  // (most chats) leave first, as S3-FIFO's small queue makes them; a reuse
  // lifts it to 1.1 uses. Tuned on `kdn bench eviction --seed 18` (0.05 to
  // 0.1 best of 1, 0.5, 0.25, 0.1, 0.05, 0.02, 0; 0 never keeps anything
  // new), reported on another trace (docs/eviction.md).
  static constexpr double kFirstUseWeight = 0.1;
  double clock_ = 0;
  std::uint64_t tick_ = 0;
  double known_value_ = 0, known_bytes_ = 0;
  std::optional<Digest> named_;
  std::set<std::tuple<double, std::uint64_t, Digest>> order_;
  std::unordered_map<Digest, Entry, DigestHash> index_;
};

}  // namespace

std::optional<PolicyKind> ParsePolicy(const std::string& name) {
  if (name == "lru") return PolicyKind::kLru;
  if (name == "s3fifo") return PolicyKind::kS3Fifo;
  if (name == "cost" || name == "gdsf") return PolicyKind::kCost;
  return std::nullopt;
}

const char* PolicyName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kLru: return "lru";
    case PolicyKind::kS3Fifo: return "s3fifo";
    case PolicyKind::kCost: return "cost";
  }
  return "unknown";
}

std::unique_ptr<EvictionPolicy> MakePolicy(PolicyKind kind, std::uint64_t capacity_bytes) {
  switch (kind) {
    case PolicyKind::kLru: return std::make_unique<LruPolicy>();
    case PolicyKind::kS3Fifo: return std::make_unique<S3FifoPolicy>(capacity_bytes);
    case PolicyKind::kCost: return std::make_unique<CostPolicy>();
  }
  return nullptr;
}

}  // namespace kdn::store
