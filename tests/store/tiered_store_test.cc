// SPDX-License-Identifier: Apache-2.0
// The chain of tiers: placement, watermark eviction, asynchronous demotion,
// promotion on hit, leases, pins with TTLs, erase everywhere, the editor.
#include "core/store/tiered_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <thread>

#include "core/tiers/memory_tier.h"

namespace kdn::store {
namespace {

constexpr std::uint64_t kObj = 4096;  // one page: the memory tiers' smallest block

keys::Digest Key(int i) {
  keys::Digest d{};
  std::memcpy(d.data(), &i, sizeof i);
  d[31] = 0x5A;
  return d;
}

ChunkRef Obj(int key, std::uint8_t fill = 0) {
  auto c = std::make_shared<Chunk>();
  c->meta.key = Key(key);
  c->meta.tokens = 1;
  c->payload = Payload(kObj);
  std::memset(c->payload.data(), fill ? fill : key & 0xFF, kObj);
  return c;
}

std::unique_ptr<Tier> Mem(const char* name, int objects) {
  return MemoryTier::Create(name, objects * kObj, MemoryKind::kHost).value();
}

// Two tiers: "top" of `top` objects, "bottom" of `bottom`; watermarks 1.0/1.0
// unless given, so eviction happens exactly at capacity.
std::unique_ptr<TieredStore> Chain(int top, int bottom, double high = 1.0, double low = 1.0,
                                   PolicyKind policy = PolicyKind::kLru, const Clock* clock = nullptr,
                                   std::shared_ptr<ChunkEditor> editor = nullptr, bool write_through = false) {
  TieredStoreOptions o;
  LevelOptions a;
  a.tier = Mem("top", top);
  a.high_watermark = high;
  a.low_watermark = low;
  a.policy = policy;
  a.write_through = write_through;
  o.levels.push_back(std::move(a));
  if (bottom > 0) {
    LevelOptions b;
    b.tier = Mem("bottom", bottom);
    b.high_watermark = 1.0;
    b.low_watermark = 1.0;
    o.levels.push_back(std::move(b));
  }
  o.clock = clock;
  o.editor = std::move(editor);
  auto s = TieredStore::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

// Fault injection: a tier whose puts stall, once armed, until released (a
// disk whose write or fsync hangs); everything else is the inner tier's.
class StallingTier final : public Tier {
 public:
  explicit StallingTier(std::unique_ptr<Tier> inner) : inner_(std::move(inner)) {}
  void Arm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = true;
  }
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
    cv_.notify_all();
  }
  const std::string& name() const override { return inner_->name(); }
  std::uint64_t Cost(const Chunk& chunk) const override { return inner_->Cost(chunk); }
  Status Put(const ChunkRef& chunk) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (armed_) {
        entered_ = true;
        cv_.notify_all();
        cv_.wait(lock, [&] { return !armed_; });
      }
    }
    return inner_->Put(chunk);
  }
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override { return inner_->Get(key, ctx); }
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override { return inner_->Contains(key, ctx); }
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override { return inner_->Erase(key, ctx); }
  std::vector<ObjectInfo> List() const override { return inner_->List(); }
  std::uint64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  std::uint64_t used_bytes() const override { return inner_->used_bytes(); }
  std::uint64_t objects() const override { return inner_->objects(); }
  TierCounters counters() const override { return inner_->counters(); }

 private:
  std::unique_ptr<Tier> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, entered_ = false;
};

// No lock is held across a tier's I/O that readers take: a hit on a tier
// does not wait for a put into it that stalls in its write (after evicting
// to make room). Before the chain split its level lock, the hit's policy
// update queued behind the put's write.
TEST(TieredStore, AHitDoesNotWaitForASlowPutIntoTheSameTier) {
  auto stalling = std::make_unique<StallingTier>(Mem("disk", 2));
  StallingTier* tier = stalling.get();
  TieredStoreOptions o;
  LevelOptions a;
  a.tier = std::move(stalling);
  a.high_watermark = a.low_watermark = 1.0;
  o.levels.push_back(std::move(a));
  auto s = TieredStore::Create(std::move(o)).value();
  ASSERT_TRUE(s->Put(Obj(1)).ok());
  ASSERT_TRUE(s->Put(Obj(2)).ok());
  ASSERT_TRUE(s->Get(Key(2)).ok());  // 1 is the least recently used: the victim

  tier->Arm();
  std::thread writer([&] { EXPECT_TRUE(s->Put(Obj(3)).ok()); });
  tier->WaitEntered();  // 1 evicted, 3's write stalled
  auto hit = std::async(std::launch::async, [&] { return s->Get(Key(2)).ok(); });
  const bool served = hit.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  tier->Release();
  writer.join();
  EXPECT_TRUE(served) << "the hit waited for a put's write into its tier";
  EXPECT_TRUE(hit.get());
  EXPECT_TRUE(s->Get(Key(3)).ok());
  EXPECT_FALSE(s->Get(Key(1)).ok());
}

TEST(TieredStore, PutsGoToTheTopAndEvictionsAreDemoted) {
  auto s = Chain(2, 10);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  s->Flush();
  // The top keeps the two most recent; the three older ones were demoted.
  EXPECT_TRUE(s->ContainsAt(0, Key(3)));
  EXPECT_TRUE(s->ContainsAt(0, Key(4)));
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(s->ContainsAt(0, Key(i)));
    EXPECT_TRUE(s->ContainsAt(1, Key(i))) << i;
  }
  const auto st = s->Stats();
  EXPECT_EQ(st[0].evictions, 3u);
  EXPECT_EQ(st[1].demotions_in, 3u);
  EXPECT_LE(st[0].used_bytes, st[0].capacity_bytes);
}

TEST(TieredStore, AHitInALowerTierIsServedAndPromoted) {
  auto s = Chain(2, 10);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  s->Flush();
  ASSERT_EQ(s->Locate(Key(0)), 1);
  {
    auto lease = s->Get(Key(0));
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->level(), 1);
    EXPECT_EQ(lease->chunk()->payload[kObj - 1], 0);
  }
  s->Flush();
  EXPECT_TRUE(s->ContainsAt(0, Key(0)));  // promoted
  const auto st = s->Stats();
  EXPECT_EQ(st[0].promotions_in, 1u);
  EXPECT_EQ(st[1].hits, 1u);
  EXPECT_EQ(st[0].misses, 1u);
  EXPECT_EQ(s->Get(Key(99)).status().code(), Code::kNotFound);
}

TEST(TieredStore, WatermarksEvictFromHighDownToLow) {
  // 10 objects of room; a put that would cross 80% evicts down to 50%.
  auto s = Chain(10, 0, 0.8, 0.5);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  EXPECT_EQ(s->Stats()[0].objects, 8u);
  ASSERT_TRUE(s->Put(Obj(8)).ok());  // 9 > 8: evict to 5 - 1, then put
  EXPECT_EQ(s->Stats()[0].objects, 5u);
  EXPECT_EQ(s->Stats()[0].evictions, 4u);
  EXPECT_TRUE(s->ContainsAt(0, Key(8)));
  EXPECT_FALSE(s->ContainsAt(0, Key(0)));  // LRU: the oldest went first
}

TEST(TieredStore, LeasedAndPinnedObjectsAreNotEvicted) {
  ManualClock clock;
  auto s = Chain(3, 0, 1.0, 1.0, PolicyKind::kLru, &clock);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  auto lease = s->Get(Key(0));  // the oldest, held by a reader
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(s->Pin(Key(1), std::chrono::nanoseconds(std::chrono::seconds(10)).count()).ok());
  ASSERT_TRUE(s->Put(Obj(3)).ok());  // must evict 2, the only evictable one
  EXPECT_TRUE(s->ContainsAt(0, Key(0)));
  EXPECT_TRUE(s->ContainsAt(0, Key(1)));
  EXPECT_FALSE(s->ContainsAt(0, Key(2)));
  EXPECT_EQ(s->Counters().leases_active, 1u);
  EXPECT_EQ(s->Counters().pins_active, 1u);
  // Everything left is leased or pinned (and 3 is leased now too): a single
  // tier cannot take more, and says so instead of evicting them.
  auto lease3 = s->Get(Key(3));
  const Status full = s->Put(Obj(4));
  EXPECT_EQ(full.code(), Code::kBusy);
  EXPECT_EQ(s->Stats()[0].put_refusals, 1u);
  lease.value().Release();
  EXPECT_EQ(s->Counters().leases_active, 1u);
  ASSERT_TRUE(s->Put(Obj(4)).ok());  // 0 is free to go now
  EXPECT_FALSE(s->ContainsAt(0, Key(0)));
  EXPECT_TRUE(s->ContainsAt(0, Key(1)));
}

TEST(TieredStore, APinRunsOutAfterItsTtlAndTheForcedUnpinIsCounted) {
  ManualClock clock;
  auto s = Chain(2, 0, 1.0, 1.0, PolicyKind::kLru, &clock);
  ASSERT_TRUE(s->Put(Obj(0)).ok());
  ASSERT_TRUE(s->Put(Obj(1)).ok());
  ASSERT_TRUE(s->Pin(Key(0), 1'000'000'000).ok());  // 1 s
  ASSERT_TRUE(s->Put(Obj(2)).ok());                  // evicts 1, not the pinned 0
  EXPECT_TRUE(s->ContainsAt(0, Key(0)));
  clock.Advance(std::chrono::seconds(2));
  ASSERT_TRUE(s->Put(Obj(3)).ok());  // the pin ran out: 0 goes
  EXPECT_FALSE(s->ContainsAt(0, Key(0)));
  EXPECT_EQ(s->Counters().pins_forced_unpin, 1u);
  EXPECT_EQ(s->Pin(Key(77), 0).code(), Code::kNotFound);
  EXPECT_EQ(s->Pin(Key(3), -1).code(), Code::kInvalidArgument);
}

// A TTL near INT64_MAX saturates: the deadline does not wrap into the past.
TEST(TieredStore, APinWithAHugeTtlSaturates) {
  ManualClock clock;  // not at 0: now + INT64_MAX overflows
  auto s = Chain(2, 0, 1.0, 1.0, PolicyKind::kLru, &clock);
  ASSERT_TRUE(s->Put(Obj(0)).ok());
  ASSERT_TRUE(s->Put(Obj(1)).ok());
  ASSERT_TRUE(s->Pin(Key(0), std::numeric_limits<std::int64_t>::max()).ok());
  ASSERT_TRUE(s->Put(Obj(2)).ok());  // evicts 1, not the pinned 0
  EXPECT_TRUE(s->ContainsAt(0, Key(0)));
  clock.Advance(std::chrono::hours(24 * 365 * 200));
  ASSERT_TRUE(s->Put(Obj(3)).ok());
  EXPECT_TRUE(s->ContainsAt(0, Key(0)));
  EXPECT_EQ(s->Counters().pins_active, 1u);
  EXPECT_EQ(s->Counters().pins_forced_unpin, 0u);
}

TEST(TieredStore, AFullTierPassesThePutDownInsteadOfFailing) {
  auto s = Chain(1, 4);
  ASSERT_TRUE(s->Put(Obj(0)).ok());
  ASSERT_TRUE(s->Pin(Key(0), 0).ok());  // the top is full of a pinned object
  ASSERT_TRUE(s->Put(Obj(1)).ok());     // goes to the bottom tier
  EXPECT_TRUE(s->ContainsAt(1, Key(1)));
  EXPECT_EQ(s->Stats()[0].put_refusals, 1u);
  auto lease = s->Get(Key(1));
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->chunk()->payload[0], 1);
}

TEST(TieredStore, EraseRemovesFromEveryTierWithPendingMoves) {
  auto s = Chain(1, 4, 1.0, 1.0, PolicyKind::kLru, nullptr, nullptr, /*write_through=*/true);
  ASSERT_TRUE(s->Put(Obj(0)).ok());
  s->Flush();
  EXPECT_TRUE(s->ContainsAt(0, Key(0)));
  EXPECT_TRUE(s->ContainsAt(1, Key(0)));  // write-through copied it down
  ASSERT_TRUE(s->Pin(Key(0), 0).ok());
  EXPECT_TRUE(s->Erase(Key(0)));
  s->Flush();
  EXPECT_EQ(s->Locate(Key(0)), -1);
  EXPECT_EQ(s->Counters().pins_active, 0u);
  EXPECT_FALSE(s->Erase(Key(0)));
}

// Holds the mover thread inside its first edit until released, so the
// demotion queue fills whatever the scheduler does.
class GateEditor final : public ChunkEditor {
 public:
  Result<bool> Edit(Chunk&) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
    return false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(TieredStore, DemotionQueueAppliesBackpressureAndLosesNothing) {
  TieredStoreOptions o;
  LevelOptions a;
  a.tier = Mem("top", 1);
  a.high_watermark = a.low_watermark = 1.0;
  o.levels.push_back(std::move(a));
  LevelOptions b;
  b.tier = Mem("bottom", 200);
  b.high_watermark = b.low_watermark = 1.0;
  o.levels.push_back(std::move(b));
  o.mover_queue_objects = 2;  // tiny: writers must wait for the mover
  auto gate = std::make_shared<GateEditor>();
  o.editor = gate;
  auto s = TieredStore::Create(std::move(o)).value();
  std::thread writer([&] {
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  });
  // The mover is held in its first edit: the writer must come to wait.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (s->Counters().mover_backpressure_waits == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(s->Counters().mover_backpressure_waits, 0u);
  gate->Open();
  writer.join();
  s->Flush();
  for (int i = 0; i < 100; ++i) EXPECT_GE(s->Locate(Key(i)), 0) << i;
}

class XorEditor final : public ChunkEditor {
 public:
  Result<bool> Edit(Chunk& c) override {
    for (auto& b : c.payload) b ^= 0xFF;
    ++calls;
    return true;
  }
  std::atomic<int> calls{0};
};

TEST(TieredStore, TheEditorRewritesNewChunksBeforeTheyReachLowerTiers) {
  auto editor = std::make_shared<XorEditor>();
  auto s = Chain(1, 4, 1.0, 1.0, PolicyKind::kLru, nullptr, editor);
  ASSERT_TRUE(s->Put(Obj(1, 0x0F)).ok());
  ASSERT_TRUE(s->Put(Obj(2, 0x0F)).ok());  // demotes 1, maybe before its edit ran
  s->Flush();
  for (int k : {1, 2}) {
    auto lease = s->Get(Key(k));
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->chunk()->meta.edited) << k;
    EXPECT_EQ(lease->chunk()->payload[0], 0xF0) << k;
  }
  EXPECT_EQ(editor->calls.load(), 2);  // once per chunk, wherever it went
  EXPECT_EQ(s->Counters().edits, 2u);
}

TEST(TieredStore, ConcurrentPutsGetsAndErasesStayConsistent) {
  auto s = Chain(8, 32, 0.9, 0.6, PolicyKind::kS3Fifo);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 300; ++i) {
        const int k = (i * 13 + w * 7) % 60;
        (void)s->Put(Obj(k));
        auto lease = s->Get(Key(k));
        if (lease.ok() && lease->chunk()->payload[kObj / 2] != (k & 0xFF)) ++bad;
        if (i % 17 == 0) s->Erase(Key((k + 1) % 60));
      }
    });
  }
  for (auto& t : threads) t.join();
  s->Flush();
  EXPECT_EQ(bad.load(), 0);
  for (const auto& l : s->Stats()) EXPECT_LE(l.used_bytes, l.capacity_bytes) << l.name;
  EXPECT_EQ(s->Counters().leases_active, 0u);
}

}  // namespace
}  // namespace kdn::store

namespace kdn::store {
namespace {

// The cost-aware policy in a chain: each chunk is weighed by the value its
// store gave it (ChunkMeta::prefill_value), else by its own prefill at its
// position. Here the most valuable chunk survives though it is the oldest
// (LRU would drop it), and the least valuable goes first.
// A follower (a recurrent layer's state snapshot, engine/groups.h) leaves a
// level with the leader it is tied to (the chunk it ends), whatever its own
// recency: demoted with it, and dropped with it from the last level; the
// ties are forgotten once both have left the store.
TEST(TieredStore, ATiedObjectIsEvictedWithItsLeader) {
  auto s = Chain(3, 3);
  ASSERT_TRUE(s->Put(Obj(0)).ok());  // the leader
  ASSERT_TRUE(s->Put(Obj(1)).ok());  // the follower
  const keys::Digest leader = Key(0);
  s->Tie(Key(1), std::span<const keys::Digest>(&leader, 1));
  EXPECT_EQ(s->TiedObjects(), 2u);
  ASSERT_TRUE(s->Put(Obj(2)).ok());
  ASSERT_TRUE(s->Get(Key(1)).ok());  // the follower is the most recently used
  ASSERT_TRUE(s->Put(Obj(3)).ok());  // the top evicts 0 (LRU), and 1 with it
  s->Flush();
  EXPECT_FALSE(s->ContainsAt(0, Key(0)));
  EXPECT_FALSE(s->ContainsAt(0, Key(1)));
  EXPECT_TRUE(s->ContainsAt(0, Key(2)));  // room was made by the leader and its follower
  EXPECT_TRUE(s->ContainsAt(0, Key(3)));
  EXPECT_TRUE(s->ContainsAt(1, Key(0)));
  EXPECT_TRUE(s->ContainsAt(1, Key(1)));  // demoted with it
  EXPECT_EQ(s->Stats()[0].evictions, 2u);
  // The bottom (3 objects) fills: 2 comes down, then 3 makes it evict 0,
  // its oldest, and 1 goes with it: dropped, and the tie forgotten.
  ASSERT_TRUE(s->Put(Obj(4)).ok());
  ASSERT_TRUE(s->Put(Obj(5)).ok());  // top {3,4,5}: 2 demoted, bottom {0,1,2}
  s->Flush();
  EXPECT_EQ(s->TiedObjects(), 2u);
  ASSERT_TRUE(s->Put(Obj(6)).ok());  // 3 demoted: the bottom evicts 0 and 1
  s->Flush();
  EXPECT_EQ(s->Locate(Key(0)), -1);
  EXPECT_EQ(s->Locate(Key(1)), -1);
  EXPECT_TRUE(s->ContainsAt(1, Key(2)));
  EXPECT_TRUE(s->ContainsAt(1, Key(3)));
  EXPECT_EQ(s->Stats()[1].evictions, 2u);
  EXPECT_EQ(s->TiedObjects(), 0u);
}

// A pinned or leased follower stays when its leader goes; erasing either
// ends the tie; a follower tied to two leaders goes with the first to leave.
TEST(TieredStore, APinnedFollowerStaysAndAnEraseEndsTheTie) {
  auto s = Chain(3, 0);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  const keys::Digest leader = Key(0);
  s->Tie(Key(2), std::span<const keys::Digest>(&leader, 1));
  ASSERT_TRUE(s->Pin(Key(2), 0).ok());
  ASSERT_TRUE(s->Put(Obj(3)).ok());  // evicts 0; 2 is pinned and stays
  EXPECT_FALSE(s->ContainsAt(0, Key(0)));
  EXPECT_TRUE(s->ContainsAt(0, Key(2)));
  EXPECT_EQ(s->Stats()[0].evictions, 1u);
  EXPECT_EQ(s->TiedObjects(), 0u);  // 0 left the store: the tie with it
  ASSERT_TRUE(s->Unpin(Key(2)));
  // 4 tied to both 1 and 3: 1 is the oldest, and takes 4 with it.
  ASSERT_TRUE(s->Erase(Key(2)));
  ASSERT_TRUE(s->Put(Obj(4)).ok());  // {1, 3, 4}
  const keys::Digest two[2] = {Key(1), Key(3)};
  s->Tie(Key(4), two);
  EXPECT_EQ(s->TiedObjects(), 3u);
  ASSERT_TRUE(s->Erase(Key(3)));  // an erase ends its ties, nothing else
  EXPECT_TRUE(s->ContainsAt(0, Key(4)));
  EXPECT_EQ(s->TiedObjects(), 2u);
  ASSERT_TRUE(s->Get(Key(4)).ok());
  ASSERT_TRUE(s->Put(Obj(5)).ok());  // {1, 4, 5}: fits
  ASSERT_TRUE(s->Put(Obj(6)).ok());  // evicts 1, and 4 with it
  EXPECT_FALSE(s->ContainsAt(0, Key(1)));
  EXPECT_FALSE(s->ContainsAt(0, Key(4)));
  EXPECT_TRUE(s->ContainsAt(0, Key(5)));
  EXPECT_TRUE(s->ContainsAt(0, Key(6)));
  EXPECT_EQ(s->TiedObjects(), 0u);
}

// The ties are bounded (TieredStoreOptions::max_tied_objects): a follower
// tied to an object only a remote tier holds is never untied by the chain,
// so past the bound Tie refuses, and counts it; tying a follower again, or
// once ties have ended, is not refused.
TEST(TieredStore, TiesAreBounded) {
  TieredStoreOptions o;
  LevelOptions a;
  a.tier = Mem("top", 16);
  o.levels.push_back(std::move(a));
  o.max_tied_objects = 2;
  auto s = TieredStore::Create(std::move(o)).value();
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(s->Put(Obj(i)).ok());
  const keys::Digest leader = Key(0);
  const std::span<const keys::Digest> one(&leader, 1);
  EXPECT_TRUE(s->Tie(Key(1), one));
  EXPECT_TRUE(s->Tie(Key(2), one));
  EXPECT_FALSE(s->Tie(Key(3), one));  // a third follower: refused
  EXPECT_TRUE(s->Tie(Key(2), one));   // tied already: fine
  EXPECT_EQ(s->Counters().tied_objects, 2u);
  EXPECT_EQ(s->Counters().ties_refused, 1u);
  ASSERT_TRUE(s->Erase(Key(1)));  // its tie ends: room for another
  EXPECT_TRUE(s->Tie(Key(3), one));
  EXPECT_EQ(s->Counters().tied_objects, 2u);
  EXPECT_EQ(s->Counters().ties_refused, 1u);
}

TEST(TieredStore, TheCostPolicyWeighsChunksByTheirPrefillValue) {
  auto s = Chain(3, 0, 1.0, 1.0, PolicyKind::kCost);
  auto valued = [](int key, double value) {
    auto c = std::make_shared<Chunk>();
    c->meta.key = Key(key);
    c->meta.tokens = 1;
    c->meta.prefill_value = value;
    c->payload = Payload(kObj);
    return ChunkRef(c);
  };
  ASSERT_TRUE(s->Put(valued(1, 900)).ok());
  ASSERT_TRUE(s->Put(valued(2, 100)).ok());
  ASSERT_TRUE(s->Put(valued(3, 500)).ok());
  ASSERT_TRUE(s->Put(valued(4, 300)).ok());  // full: one goes
  EXPECT_FALSE(s->ContainsAt(0, Key(2)));
  EXPECT_TRUE(s->ContainsAt(0, Key(1)));
  // No value given: its own prefill at its position, here one token at an
  // empty context (1): below everything else.
  ASSERT_TRUE(s->Put(Obj(5)).ok());
  ASSERT_TRUE(s->Put(valued(6, 400)).ok());
  EXPECT_FALSE(s->ContainsAt(0, Key(5)));
  EXPECT_TRUE(s->ContainsAt(0, Key(1)) && s->ContainsAt(0, Key(3)) && s->ContainsAt(0, Key(6)));
}

}  // namespace
}  // namespace kdn::store
