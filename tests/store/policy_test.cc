// SPDX-License-Identifier: Apache-2.0
#include "core/store/policy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <random>
#include <set>
#include <unordered_set>
#include <vector>

namespace kdn::store {
namespace {

keys::Digest Key(std::uint32_t i) {
  keys::Digest d{};
  std::memcpy(d.data(), &i, sizeof i);
  d[31] = 0xAB;
  return d;
}

const auto kAny = [](const keys::Digest&) { return true; };
const auto kNone = [](const keys::Digest&) { return false; };

// Evicts n objects through the policy (Victim then OnRemove), returning them.
std::vector<keys::Digest> EvictN(EvictionPolicy& p, int n) {
  std::vector<keys::Digest> out;
  for (int i = 0; i < n; ++i) {
    const std::optional<keys::Digest> v = p.Victim(kAny);
    if (!v) break;
    out.push_back(*v);
    p.OnRemove(*v);
  }
  return out;
}

// ----------------------------------------------------------------- naming

TEST(Policy, ParseNameMake) {
  EXPECT_EQ(ParsePolicy("lru"), PolicyKind::kLru);
  EXPECT_EQ(ParsePolicy("s3fifo"), PolicyKind::kS3Fifo);
  EXPECT_EQ(ParsePolicy("LRU"), std::nullopt);
  EXPECT_EQ(ParsePolicy(""), std::nullopt);
  EXPECT_STREQ(PolicyName(PolicyKind::kLru), "lru");
  EXPECT_STREQ(PolicyName(PolicyKind::kS3Fifo), "s3fifo");
  EXPECT_EQ(ParsePolicy("cost"), PolicyKind::kCost);
  EXPECT_EQ(ParsePolicy("gdsf"), PolicyKind::kCost);
  EXPECT_STREQ(PolicyName(PolicyKind::kCost), "cost");
  for (PolicyKind k : {PolicyKind::kLru, PolicyKind::kS3Fifo, PolicyKind::kCost}) {
    auto p = MakePolicy(k, 1000);
    ASSERT_TRUE(p);
    EXPECT_STREQ(p->name(), PolicyName(k));
    EXPECT_EQ(p->tracked(), 0u);
    EXPECT_EQ(p->Victim(kAny), std::nullopt);
  }
}

// -------------------------------------------------------------------- LRU

TEST(LruPolicy, EvictsInInsertionOrderWithoutAccesses) {
  auto p = MakePolicy(PolicyKind::kLru, 0);
  for (std::uint32_t i = 0; i < 5; ++i) p->OnInsert(Key(i), 10, 0);
  EXPECT_EQ(p->tracked(), 5u);
  EXPECT_EQ(EvictN(*p, 5), (std::vector<keys::Digest>{Key(0), Key(1), Key(2), Key(3), Key(4)}));
  EXPECT_EQ(p->tracked(), 0u);
}

TEST(LruPolicy, AccessRefreshes) {
  auto p = MakePolicy(PolicyKind::kLru, 0);
  for (std::uint32_t i = 0; i < 4; ++i) p->OnInsert(Key(i), 10, 0);
  p->OnAccess(Key(0));
  p->OnAccess(Key(2));
  p->OnAccess(Key(0));
  EXPECT_EQ(EvictN(*p, 4), (std::vector<keys::Digest>{Key(1), Key(3), Key(2), Key(0)}));
}

TEST(LruPolicy, VictimDoesNotRemove) {
  auto p = MakePolicy(PolicyKind::kLru, 0);
  p->OnInsert(Key(1), 10, 0);
  p->OnInsert(Key(2), 10, 0);
  EXPECT_EQ(p->Victim(kAny), Key(1));
  EXPECT_EQ(p->Victim(kAny), Key(1));  // the caller changed its mind: still there
  EXPECT_EQ(p->tracked(), 2u);
}

TEST(LruPolicy, SkipsRefusedKeysAndKeepsTheirPlace) {
  auto p = MakePolicy(PolicyKind::kLru, 0);
  for (std::uint32_t i = 0; i < 4; ++i) p->OnInsert(Key(i), 10, 0);
  const auto pinned01 = [](const keys::Digest& k) { return k != Key(0) && k != Key(1); };
  EXPECT_EQ(p->Victim(pinned01), Key(2));
  p->OnRemove(Key(2));
  // Released again, 0 is still the least recently used.
  EXPECT_EQ(p->Victim(kAny), Key(0));
}

TEST(LruPolicy, NulloptWhenAllRefused) {
  auto p = MakePolicy(PolicyKind::kLru, 0);
  for (std::uint32_t i = 0; i < 4; ++i) p->OnInsert(Key(i), 10, 0);
  EXPECT_EQ(p->Victim(kNone), std::nullopt);
  EXPECT_EQ(p->tracked(), 4u);
}

TEST(LruPolicy, UnknownKeysAreIgnored) {
  auto p = MakePolicy(PolicyKind::kLru, 0);
  p->OnInsert(Key(1), 10, 0);
  p->OnRemove(Key(7));
  p->OnAccess(Key(8));
  EXPECT_EQ(p->tracked(), 1u);
  p->OnRemove(Key(1));
  p->OnRemove(Key(1));  // twice
  EXPECT_EQ(p->tracked(), 0u);
  EXPECT_EQ(p->Victim(kAny), std::nullopt);
}

// ---------------------------------------------------------------- S3-FIFO

TEST(S3FifoPolicy, OneHitWondersGoBeforeReaccessedObjects) {
  // Capacity 10 one-byte objects: S's share is 1, so S is drained first.
  auto p = MakePolicy(PolicyKind::kS3Fifo, 10);
  for (std::uint32_t i = 0; i < 10; ++i) p->OnInsert(Key(i), 1, 0);
  p->OnAccess(Key(1));
  p->OnAccess(Key(3));
  p->OnAccess(Key(3));
  const std::vector<keys::Digest> order = EvictN(*p, 10);
  ASSERT_EQ(order.size(), 10u);
  EXPECT_EQ(std::vector<keys::Digest>(order.begin(), order.begin() + 8),
            (std::vector<keys::Digest>{Key(0), Key(2), Key(4), Key(5), Key(6), Key(7), Key(8), Key(9)}));
  EXPECT_EQ(std::set<keys::Digest>(order.begin() + 8, order.end()), (std::set<keys::Digest>{Key(1), Key(3)}));
}

TEST(S3FifoPolicy, LruWouldEvictTheReaccessedObjectFirst) {
  // The same shape where the two differ: an object accessed early then
  // left alone. LRU forgets the access, S3-FIFO promoted the object to M.
  auto lru = MakePolicy(PolicyKind::kLru, 10);
  auto s3 = MakePolicy(PolicyKind::kS3Fifo, 10);
  for (auto* p : {lru.get(), s3.get()}) {
    p->OnInsert(Key(0), 1, 0);
    p->OnAccess(Key(0));
    for (std::uint32_t i = 1; i < 10; ++i) p->OnInsert(Key(i), 1, 0);
  }
  EXPECT_EQ(lru->Victim(kAny), Key(0));
  EXPECT_EQ(s3->Victim(kAny), Key(1));
}

TEST(S3FifoPolicy, GhostHitGoesToMain) {
  auto p = MakePolicy(PolicyKind::kS3Fifo, 10);
  for (std::uint32_t i = 0; i < 10; ++i) p->OnInsert(Key(i), 1, 0);
  ASSERT_EQ(p->Victim(kAny), Key(0));
  p->OnRemove(Key(0));  // evicted from S: its key is now in G
  p->OnInsert(Key(0), 1, 0);                     // ghost hit: straight into M
  for (std::uint32_t i = 10; i < 13; ++i) p->OnInsert(Key(i), 1, 0);  // new: into S
  EXPECT_EQ(p->tracked(), 13u);
  // Everything in S (1..12, none accessed) goes before 0, the only object in M.
  const std::vector<keys::Digest> order = EvictN(*p, 13);
  ASSERT_EQ(order.size(), 13u);
  EXPECT_EQ(order.back(), Key(0));
}

TEST(S3FifoPolicy, AnErasedObjectIsNotAGhost) {
  // G remembers evictions (keys Victim named), not explicit removals.
  auto p = MakePolicy(PolicyKind::kS3Fifo, 10);
  for (std::uint32_t i = 0; i < 10; ++i) p->OnInsert(Key(i), 1, 0);
  p->OnRemove(Key(0));      // erased, never named
  p->OnInsert(Key(0), 1, 0);   // new again: into S
  p->OnInsert(Key(10), 1, 0);  // S after it
  // FIFO order through S puts 0 before 10 (a ghost hit would have put 0 in
  // M, evicted after all of S).
  const std::vector<keys::Digest> order = EvictN(*p, 11);
  ASSERT_EQ(order.size(), 11u);
  EXPECT_EQ(order[9], Key(0));
  EXPECT_EQ(order[10], Key(10));
}

TEST(S3FifoPolicy, GhostIsBounded) {
  // Capacity 10: G holds at most ~9 bytes of keys. A key evicted long ago is
  // forgotten and comes back into S, not M.
  auto p = MakePolicy(PolicyKind::kS3Fifo, 10);
  std::uint32_t next = 0;
  for (; next < 10; ++next) p->OnInsert(Key(next), 1, 0);
  for (int i = 0; i < 100; ++i) {  // a scan: each insert evicts one old key
    EvictN(*p, 1);
    p->OnInsert(Key(next++), 1, 0);
  }
  // Key(0) left long ago; Key(next - 11) a moment ago.
  EvictN(*p, 1);
  p->OnInsert(Key(next - 11), 1, 0);  // still a ghost: M
  p->OnInsert(Key(0), 1, 0);          // forgotten: S (had it been a ghost, M's tail would be
                                   // next - 11 and 0 would go last)
  const std::vector<keys::Digest> order = EvictN(*p, 100);
  ASSERT_EQ(order.size(), 11u);
  EXPECT_EQ(order.back(), Key(next - 11));
}

TEST(S3FifoPolicy, MainGivesSecondChancesByFrequency) {
  // Everything lands in M through G; the counters then order eviction.
  auto p = MakePolicy(PolicyKind::kS3Fifo, 100);
  for (std::uint32_t i = 0; i < 4; ++i) p->OnInsert(Key(i), 1, 0);
  EXPECT_EQ(EvictN(*p, 4).size(), 4u);  // all four into G
  for (std::uint32_t i = 0; i < 4; ++i) p->OnInsert(Key(i), 1, 0);  // ghost hits: M = [3 2 1 0]
  for (int n = 0; n < 3; ++n) p->OnAccess(Key(0));
  p->OnAccess(Key(1));
  // 0 (freq 3) and 1 (freq 1) get second chances; 2 and 3 have none left.
  EXPECT_EQ(EvictN(*p, 4), (std::vector<keys::Digest>{Key(2), Key(3), Key(1), Key(0)}));
}

TEST(S3FifoPolicy, PromotionResetsTheCounter) {
  auto p = MakePolicy(PolicyKind::kS3Fifo, 100);  // S's share: 10
  for (std::uint32_t i = 0; i < 20; ++i) p->OnInsert(Key(i), 1, 0);
  p->OnAccess(Key(0));
  p->OnAccess(Key(0));
  p->OnAccess(Key(1));
  // The S walk promotes 0 then 1 (counters reset) and evicts 2..10, leaving
  // 9 objects in S, under its share: the next victims come from M = [1 0].
  const std::vector<keys::Digest> from_s = EvictN(*p, 9);
  ASSERT_EQ(from_s.size(), 9u);
  EXPECT_EQ(from_s.front(), Key(2));
  EXPECT_EQ(from_s.back(), Key(10));
  p->OnAccess(Key(0));  // the only access since promotion
  EXPECT_EQ(p->Victim(kAny), Key(1));
}

TEST(S3FifoPolicy, RefusedObjectsAreSkippedAndNulloptWhenAllRefused) {
  auto p = MakePolicy(PolicyKind::kS3Fifo, 10);
  for (std::uint32_t i = 0; i < 10; ++i) p->OnInsert(Key(i), 1, 0);
  p->OnAccess(Key(5));
  const auto pinned012 = [](const keys::Digest& k) { return k != Key(0) && k != Key(1) && k != Key(2); };
  EXPECT_EQ(p->Victim(pinned012), Key(3));
  EXPECT_EQ(p->Victim(kAny), Key(0));  // not removed, 0 keeps its place at the tail
  EXPECT_EQ(p->Victim(kNone), std::nullopt);
  EXPECT_EQ(p->tracked(), 10u);
  // The refused walk promoted 5 (accessed in S) to M and changed nothing else.
  const std::vector<keys::Digest> order = EvictN(*p, 10);
  ASSERT_EQ(order.size(), 10u);
  EXPECT_EQ(order.back(), Key(5));
}

TEST(S3FifoPolicy, FindsTheOnlyAcceptedObjectWhereverItIs) {
  // The accepted object sits in S below its share while M is all refused:
  // Victim must fall back from M to S, and to M again after promotions.
  auto p = MakePolicy(PolicyKind::kS3Fifo, 100);
  for (std::uint32_t i = 0; i < 20; ++i) p->OnInsert(Key(i), 1, 0);
  EvictN(*p, 20);
  for (std::uint32_t i = 0; i < 20; ++i) p->OnInsert(Key(i), 1, 0);  // all in M
  for (std::uint32_t i = 0; i < 20; ++i) p->OnAccess(Key(i));
  p->OnInsert(Key(100), 1, 0);  // in S, S under its share of 10
  p->OnAccess(Key(100));
  p->OnInsert(Key(101), 1, 0);
  const auto only = [](keys::Digest want) { return [want](const keys::Digest& k) { return k == want; }; };
  // M walk: nothing. S walk: promotes 100 (accessed), refuses 101. M again: 100.
  EXPECT_EQ(p->Victim(only(Key(100))), Key(100));
  EXPECT_EQ(p->Victim(only(Key(101))), Key(101));
  EXPECT_EQ(p->Victim(only(Key(7))), Key(7));
  EXPECT_EQ(p->Victim(only(Key(999))), std::nullopt);
  EXPECT_EQ(p->tracked(), 22u);
}

TEST(S3FifoPolicy, UnknownKeysAreIgnored) {
  auto p = MakePolicy(PolicyKind::kS3Fifo, 10);
  p->OnInsert(Key(1), 1, 0);
  p->OnRemove(Key(7));
  p->OnAccess(Key(8));
  EXPECT_EQ(p->tracked(), 1u);
  p->OnRemove(Key(1));
  p->OnRemove(Key(1));
  EXPECT_EQ(p->tracked(), 0u);
  EXPECT_EQ(p->Victim(kAny), std::nullopt);
}

TEST(S3FifoPolicy, UnknownCapacityStillWorks) {
  // capacity 0: S's share is 10% of what is tracked.
  auto p = MakePolicy(PolicyKind::kS3Fifo, 0);
  for (std::uint32_t i = 0; i < 10; ++i) p->OnInsert(Key(i), 1, 0);
  p->OnAccess(Key(0));
  const std::vector<keys::Digest> order = EvictN(*p, 10);
  ASSERT_EQ(order.size(), 10u);
  EXPECT_EQ(order.back(), Key(0));
}

// ------------------------------------------------------- scan resistance

// A cache of `capacity` unit objects run by `kind`; returns hits on `hot`.
struct ScanResult {
  int hot_hits = 0, hot_reads = 0;
};

ScanResult RunHotSetWithScan(PolicyKind kind) {
  constexpr std::uint32_t kCapacity = 50, kHot = 20, kScan = 1000, kScanPerRound = 50;
  auto p = MakePolicy(kind, kCapacity);
  std::unordered_set<keys::Digest, keys::DigestHash> present;
  ScanResult r;
  auto read = [&](const keys::Digest& k) {
    if (present.count(k)) {
      p->OnAccess(k);
      return true;
    }
    if (present.size() >= kCapacity) {
      const std::optional<keys::Digest> v = p->Victim(kAny);
      EXPECT_TRUE(v);
      if (!v) return false;
      present.erase(*v);
      p->OnRemove(*v);
    }
    present.insert(k);
    p->OnInsert(k, 1, 0);
    return false;
  };
  // Each round reads the whole hot set, then 50 keys of the scan, never read
  // again: a hot key's reuse distance (69 distinct keys) exceeds the cache.
  std::uint32_t scan = 0;
  while (scan < kScan) {
    for (std::uint32_t h = 0; h < kHot; ++h) {
      ++r.hot_reads;
      r.hot_hits += read(Key(h));
    }
    for (std::uint32_t s = 0; s < kScanPerRound; ++s) read(Key(1'000'000 + scan++));
  }
  EXPECT_EQ(p->tracked(), present.size());
  return r;
}

TEST(S3FifoPolicy, ScanDoesNotFlushTheWorkingSetUnlikeLru) {
  const ScanResult lru = RunHotSetWithScan(PolicyKind::kLru);
  const ScanResult s3 = RunHotSetWithScan(PolicyKind::kS3Fifo);
  EXPECT_EQ(lru.hot_reads, 400);
  EXPECT_EQ(lru.hot_hits, 0);  // every scan flushes the hot set
  // S3-FIFO: round 1 misses and ghosts the hot set, round 2 brings it into
  // M through G, every later round hits: 18 rounds of 20.
  EXPECT_GE(s3.hot_hits, 18 * 20);
}

// ------------------------------------------------- randomized consistency

// Random inserts / accesses / removes / victims against a model (the set of
// tracked keys), with a random refusal set each time.
// Capacity 40 keeps S3-FIFO's S above its share most of the time, 400 below.
void RandomizedConsistency(PolicyKind kind, std::uint64_t capacity, std::uint64_t seed) {
  SCOPED_TRACE(std::string(PolicyName(kind)) + " capacity " + std::to_string(capacity) + " seed " +
               std::to_string(seed));
  constexpr std::uint32_t kUniverse = 96;
  auto p = MakePolicy(kind, capacity);
  std::set<std::uint32_t> model;
  std::mt19937_64 rng(seed);
  auto pick = [&](std::uint32_t n) { return static_cast<std::uint32_t>(rng() % n); };
  for (int step = 0; step < 20000; ++step) {
    const std::uint32_t op = pick(100), i = pick(kUniverse);
    if (op < 35) {
      if (!model.count(i)) {
        p->OnInsert(Key(i), 1 + pick(4), pick(3) == 0 ? 0.0 : 1.0 + pick(50));  // some values unknown
        model.insert(i);
      }
    } else if (op < 60) {
      p->OnAccess(Key(i));  // present or not
    } else if (op < 70) {
      p->OnRemove(Key(i));  // present or not
      model.erase(i);
    } else {
      // A refusal set: none, all, all but one tracked key, or each key with
      // a random probability.
      const std::uint32_t mode = pick(11);
      const std::uint32_t spared =
          model.empty() ? 0 : *std::next(model.begin(), static_cast<std::ptrdiff_t>(pick(model.size())));
      std::set<std::uint32_t> refused;
      for (std::uint32_t k = 0; k < kUniverse; ++k)
        if (mode == 0 ? false : mode == 1 ? true : mode == 10 ? k != spared : pick(10) < mode) refused.insert(k);
      int calls = 0;
      const auto evictable = [&](const keys::Digest& k) {
        ++calls;
        std::uint32_t id;
        std::memcpy(&id, k.data(), sizeof id);
        EXPECT_TRUE(model.count(id)) << "asked about an untracked key";
        return !refused.count(id);
      };
      const std::optional<keys::Digest> v = p->Victim(evictable);
      EXPECT_LE(calls, static_cast<int>(2 * model.size() + 2));
      bool any_accepted = false;
      for (std::uint32_t k : model) any_accepted |= !refused.count(k);
      ASSERT_EQ(v.has_value(), any_accepted) << "step " << step;
      if (v) {
        std::uint32_t id;
        std::memcpy(&id, v->data(), sizeof id);
        ASSERT_TRUE(model.count(id)) << "untracked victim at step " << step;
        ASSERT_FALSE(refused.count(id)) << "refused victim at step " << step;
        if (pick(4) != 0) {  // usually evict it; sometimes change our mind
          p->OnRemove(*v);
          model.erase(id);
        }
      }
    }
    ASSERT_EQ(p->tracked(), model.size()) << "step " << step;
  }
}

TEST(LruPolicy, RandomizedConsistency) {
  for (std::uint64_t capacity : {40, 400})
    for (std::uint64_t seed : {1, 2, 3}) RandomizedConsistency(PolicyKind::kLru, capacity, seed);
}

TEST(S3FifoPolicy, RandomizedConsistency) {
  for (std::uint64_t capacity : {40, 400})
    for (std::uint64_t seed : {1, 2, 3}) RandomizedConsistency(PolicyKind::kS3Fifo, capacity, seed);
}

TEST(CostPolicy, RandomizedConsistency) {
  for (std::uint64_t capacity : {40, 400})
    for (std::uint64_t seed : {1, 2, 3}) RandomizedConsistency(PolicyKind::kCost, capacity, seed);
}

// ------------------------------------------------------ cost-aware (GDSF)

// The least prefill saved per byte goes first: value 10 in 10 bytes (1 per
// byte) before 30 in 20 (1.5) before 30 in 10 (3).
TEST(CostPolicy, EvictsTheLeastValuePerByteFirst) {
  auto p = MakePolicy(PolicyKind::kCost, 0);
  p->OnInsert(Key(1), 10, 30);
  p->OnInsert(Key(2), 20, 30);
  p->OnInsert(Key(3), 10, 10);
  EXPECT_EQ(EvictN(*p, 3), (std::vector<keys::Digest>{Key(3), Key(2), Key(1)}));
}

// Reuse counts: a chunk hit twice outranks one of three times its value per
// byte that was never hit (0.1 + 2 uses x 1 > 0.1 x 3).
TEST(CostPolicy, FrequencyOutweighsValueOnceAChunkIsReused) {
  auto p = MakePolicy(PolicyKind::kCost, 0);
  p->OnInsert(Key(1), 10, 10);
  p->OnInsert(Key(2), 10, 30);
  EXPECT_EQ(p->Victim(kAny), Key(1));
  p->OnAccess(Key(1));
  p->OnAccess(Key(1));
  EXPECT_EQ(p->Uses(Key(1)), 3u);
  EXPECT_EQ(p->Victim(kAny), Key(2));
  // Unknown keys: no-ops.
  p->OnAccess(Key(9));
  p->OnRemove(Key(9));
  EXPECT_EQ(p->Uses(Key(9)), 0u);
  EXPECT_EQ(p->tracked(), 2u);
}

// Aging: every eviction lifts the clock to the victim's priority, and new
// chunks start from it, so a chunk that was popular once but is no longer
// used is overtaken by chunks that keep coming, and goes.
TEST(CostPolicy, AChunkNoLongerUsedIsOvertakenByNewerOnes) {
  auto p = MakePolicy(PolicyKind::kCost, 0);
  p->OnInsert(Key(0), 10, 10);
  for (int i = 0; i < 5; ++i) p->OnAccess(Key(0));  // priority 5.1
  // A stream of new chunks, each reused once, one evicted per arrival.
  std::uint32_t next = 1;
  bool old_gone = false;
  for (int round = 0; round < 20 && !old_gone; ++round) {
    p->OnInsert(Key(next), 10, 10);
    p->OnAccess(Key(next));
    ++next;
    const std::optional<keys::Digest> v = p->Victim(kAny);
    ASSERT_TRUE(v);
    old_gone = *v == Key(0);
    p->OnRemove(*v);
  }
  EXPECT_TRUE(old_gone) << "the once-popular chunk was never evicted";
}

// An erase is not an eviction: it does not advance the clock.
TEST(CostPolicy, AnEraseDoesNotAgeTheCache) {
  auto a = MakePolicy(PolicyKind::kCost, 0), b = MakePolicy(PolicyKind::kCost, 0);
  for (auto* p : {a.get(), b.get()}) {
    p->OnInsert(Key(1), 10, 100);
    p->OnInsert(Key(2), 10, 10);
  }
  ASSERT_EQ(a->Victim(kAny), Key(2));
  a->OnRemove(Key(1));  // erased while Key(2) was named: no clock change
  b->OnRemove(Key(1));
  // Both then rank a new chunk the same against Key(2).
  a->OnInsert(Key(3), 10, 5);
  b->OnInsert(Key(3), 10, 5);
  EXPECT_EQ(a->Victim(kAny), Key(3));
  EXPECT_EQ(b->Victim(kAny), Key(3));
}

// The store's values for one request (ChunkValue): equal per byte but a
// little less for later chunks, so each request loses its last chunk first
// and its first chunk last; ties between requests go to the older one.
TEST(CostPolicy, DropsARequestsLaterChunksFirstAndTheOlderRequestOnTies) {
  auto p = MakePolicy(PolicyKind::kCost, 0);
  const double mean = PrefillCost(0, 1024) / 1024.0;
  for (std::uint32_t r = 0; r < 2; ++r) {
    for (std::uint32_t i = 0; i < 4; ++i) p->OnInsert(Key(r * 10 + i), 256, ChunkValue(mean, 256, i, 4));
  }
  // Tails first, request 0 (older) before request 1 at each depth.
  EXPECT_EQ(EvictN(*p, 8), (std::vector<keys::Digest>{Key(3), Key(13), Key(2), Key(12), Key(1), Key(11), Key(0),
                                                      Key(10)}));
}

// A chunk listed at open (value unknown, 0) is priced at the mean value per
// byte of the chunks whose value is known.
TEST(CostPolicy, AnUnknownValueIsTheMeanValuePerByte) {
  auto p = MakePolicy(PolicyKind::kCost, 0);
  p->OnInsert(Key(1), 10, 10);   // 1 per byte
  p->OnInsert(Key(2), 10, 30);   // 3 per byte
  p->OnInsert(Key(3), 20, 0);    // taken as 2 per byte
  EXPECT_EQ(EvictN(*p, 3), (std::vector<keys::Digest>{Key(1), Key(3), Key(2)}));
}

// Attention makes a token at a long context cost more: the work of 256
// tokens grows with their position (kAttentionParityTokens: a token at that
// context costs twice one at an empty context).
TEST(CostPolicy, PrefillCostGrowsWithPosition) {
  EXPECT_DOUBLE_EQ(PrefillCost(-1, 1), 1.0);
  EXPECT_DOUBLE_EQ(PrefillCost(0, 1), 1.0);
  EXPECT_DOUBLE_EQ(PrefillCost(static_cast<std::int64_t>(kAttentionParityTokens), 1), 2.0);
  EXPECT_GT(PrefillCost(4096, 256), PrefillCost(0, 256));
  EXPECT_NEAR(PrefillCost(0, 256), 256.0 * (1.0 + 127.5 / kAttentionParityTokens), 1e-9);
  EXPECT_DOUBLE_EQ(ChunkValue(2.0, 256, 0, 1), 512.0);
  EXPECT_DOUBLE_EQ(ChunkValue(2.0, 256, 3, 4), 512.0 * 0.99);
}


// Load or recompute: the prefix whose deliveries plus the rest's recomputes
// cost least; unknown deliveries (0) load; a slow chunk is loaded when the
// fast ones after it make up for it, and left (with all after it) when not.
TEST(CheapestPrefix, LoadsWhatPaysAndLeavesTheRestToRecompute) {
  using V = std::vector<double>;
  const V recompute = {10, 10, 10, 10};
  EXPECT_EQ(CheapestPrefix(V{1, 1, 1, 1}, recompute), 4u);
  EXPECT_EQ(CheapestPrefix(V{0, 0, 0, 0}, recompute), 4u);                // unmeasured: fetched
  EXPECT_EQ(CheapestPrefix(V{50, 50, 50, 50}, recompute), 0u);            // every tier slower than prefill
  EXPECT_EQ(CheapestPrefix(V{1, 1, 50, 50}, recompute), 2u);              // a fast head, a slow tail
  EXPECT_EQ(CheapestPrefix(V{1, 15, 1, 1}, recompute), 4u);               // one slow chunk, paid back after it
  EXPECT_EQ(CheapestPrefix(V{1, 40, 1, 1}, recompute), 1u);               // not paid back
  EXPECT_EQ(CheapestPrefix(V{20, 1, 1, 1}, recompute), 4u);               // a slow first chunk, paid back
  EXPECT_EQ(CheapestPrefix(V{10, 10, 10, 10}, recompute), 4u);            // a tie loads
  EXPECT_EQ(CheapestPrefix(V{}, V{}), 0u);
}

}  // namespace
}  // namespace kdn::store
