// SPDX-License-Identifier: Apache-2.0
// Bandwidth-adaptive delivery (tiers/leveled_tier.h): the level decision on
// small cases, the link meter, and a leveled tier over a memory tier behind
// a simulated link (fault injection: a tier whose reads take bytes / rate)
// choosing each chunk's level as the rate it measures changes.
#include "core/tiers/leveled_tier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "core/store/chunk_codec.h"
#include "kernels/common/half.h"
#include "core/tiers/memory_tier.h"
#include "core/store/tiered_store.h"

namespace kdn::store {
namespace {

// ---- The decision ---------------------------------------------------------------

LevelChoiceInput Case(double time_left_s, double rate) {
  LevelChoiceInput in;
  in.time_left_s = time_left_s;
  in.tokens_left = 1000;  // 10 chunks of 100
  in.chunk_tokens = 100;
  in.rate = rate;
  in.bytes_per_token = {1000, 300, 100};  // lossless, finer, coarser
  in.decode_s_per_token = {0, 0, 0};
  in.recompute_s_per_token = 1e-4;  // 10 ms a chunk
  return in;
}

TEST(ChooseLevel, TheFinestLevelThatMeetsTheTarget) {
  // 1000 tokens: 1 MB at level 0, 300 KB at 1, 100 KB at 2; at 10 MB/s:
  // 100, 30, 10 ms, each to fit in 80% of the time left.
  EXPECT_EQ(ChooseLevel(Case(0.200, 10e6)), 0);
  EXPECT_EQ(ChooseLevel(Case(0.126, 10e6)), 0);
  EXPECT_EQ(ChooseLevel(Case(0.112, 10e6)), 1);  // on time, but not with the margin
  EXPECT_EQ(ChooseLevel(Case(0.050, 10e6)), 1);
  EXPECT_EQ(ChooseLevel(Case(0.011, 10e6)), 2);
  // The same target at a tenth of the rate: one level coarser at least.
  EXPECT_EQ(ChooseLevel(Case(0.200, 1e6)), 2);
}

TEST(ChooseLevel, DecodeTimeCountsWhenItIsSlowerThanTheLink) {
  LevelChoiceInput in = Case(0.050, 10e6);
  in.decode_s_per_token = {0, 1e-4, 0};  // level 1 decodes at 100 ms per 1000 tokens
  EXPECT_EQ(ChooseLevel(in), 2);
}

TEST(ChooseLevel, RecomputeWhenNoLevelMeetsTheTargetAndRecomputingIsFaster) {
  // Coarsest: 10 KB a chunk at 100 KB/s = 100 ms; recompute: 10 ms.
  EXPECT_EQ(ChooseLevel(Case(0.010, 100e3)), -1);
  // Recomputing faster, but by less than the factor a chunk recomputed alone
  // is priced up by (2 x 60 ms against 100 ms): the coarsest.
  LevelChoiceInput close = Case(0.010, 100e3);
  close.recompute_s_per_token = 6e-4;
  EXPECT_EQ(ChooseLevel(close), 2);
  // Recomputing slower than the coarsest fetch: the coarsest.
  LevelChoiceInput slow = Case(0.010, 100e3);
  slow.recompute_s_per_token = 1e-2;  // 1 s a chunk
  EXPECT_EQ(ChooseLevel(slow), 2);
  // Recompute cost unknown (no prefill reported): recompute.
  slow.recompute_s_per_token = 0;
  EXPECT_EQ(ChooseLevel(slow), -1);
  // A deadline already passed: whichever is faster.
  EXPECT_EQ(ChooseLevel(Case(-0.5, 10e6)), 2);   // 1 ms at the coarsest level against a 10 ms recompute
  EXPECT_EQ(ChooseLevel(Case(-0.5, 100e3)), -1);
}

TEST(ChooseLevel, RecomputesChosenEarlierAndBytesInFlightTakeTheirTime) {
  LevelChoiceInput in = Case(0.140, 10e6);  // 112 ms to plan with
  EXPECT_EQ(ChooseLevel(in), 0);
  in.inflight_bytes = 200e3;  // 20 ms still on the wire: 92 ms left
  EXPECT_EQ(ChooseLevel(in), 1);
  in.inflight_bytes = 0;
  in.recompute_s_pending = 0.090;  // 22 ms left for the fetches (recomputes already chosen, as priced)
  EXPECT_EQ(ChooseLevel(in), 2);
}

TEST(ChooseLevel, AnUnknownLinkIsProbedAtTheCoarsestLevel) {
  EXPECT_EQ(ChooseLevel(Case(10.0, 0)), 2);
}

TEST(LinkMeter, RateFromBusyTimeAndOverlappingRequests) {
  LinkMeter m;
  EXPECT_EQ(m.rate(), 0);
  m.Observe(1'000'000, 0, 100'000'000);  // 1 MB in 100 ms
  EXPECT_DOUBLE_EQ(m.rate(), 10e6);
  // Requested at 50 ms (while the first was arriving): busy from 100 ms.
  m.Observe(1'000'000, 50'000'000, 200'000'000);
  EXPECT_DOUBLE_EQ(m.rate(), 10e6);
  // A burst after an idle moment (100 KB in 0.1 ms) barely moves it: time weighs.
  m.Observe(100'000, 300'000'000, 300'100'000);
  EXPECT_LT(m.rate(), 10.5e6);
  EXPECT_GT(m.rate(), 10e6);
  // The link drops to 1 MB/s: the estimate follows within a few chunks.
  for (int i = 0; i < 4; ++i) m.Observe(1'000'000, 400'000'000 + i * 1'000'000'000LL, 1'400'000'000 + i * 1'000'000'000LL);
  EXPECT_LT(m.rate(), 1.6e6);
  EXPECT_EQ(m.samples(), 7u);
}

// ---- A leveled tier over a simulated link ---------------------------------------

// Fault injection: reads of `inner` cross a link of `rate` bytes per second,
// one at a time; from the `drop_after`th crossing on, at `dropped_rate`.
class LinkTier : public Tier {
 public:
  explicit LinkTier(std::unique_ptr<Tier> inner) : inner_(std::move(inner)) {}
  std::atomic<double> rate{1e9};
  std::atomic<int> gets{0};
  std::atomic<int> crossings{0};
  std::atomic<int> drop_after{std::numeric_limits<int>::max()};
  std::atomic<double> dropped_rate{1e9};
  const std::string& name() const override { return inner_->name(); }
  std::uint64_t Cost(const Chunk& c) const override { return inner_->Cost(c); }
  Status Put(const ChunkRef& c) override { return inner_->Put(c); }
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override {
    auto got = inner_->Get(key, ctx);
    if (got.ok()) {
      std::lock_guard<std::mutex> lock(link_);
      const double r = crossings++ >= drop_after ? dropped_rate.load() : rate.load();
      std::this_thread::sleep_for(std::chrono::duration<double>(static_cast<double>((*got)->payload.size()) / r));
    }
    ++gets;
    return got;
  }
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override { return inner_->Contains(key, ctx); }
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override { return inner_->Erase(key, ctx); }
  std::vector<ObjectInfo> List() const override { return inner_->List(); }
  std::uint64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  std::uint64_t used_bytes() const override { return inner_->used_bytes(); }
  std::uint64_t objects() const override { return inner_->objects(); }
  TierCounters counters() const override { return inner_->counters(); }

 private:
  std::unique_ptr<Tier> inner_;
  std::mutex link_;
};

// The steady clock's time `d` from now, in ns (a DeliveryTarget's deadline).
std::int64_t DeadlineIn(std::chrono::duration<double> d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch() + d)
      .count();
}

// Chunk i: f16 KV of 64 tokens (2 layers, 2 heads, 16 dims), smooth values.
ChunkRef KvChunk(int i) {
  auto c = std::make_shared<Chunk>();
  keys::Hasher h;
  h.Str("leveled-test").U32(static_cast<std::uint32_t>(i));
  c->meta.key = h.Finish();
  c->meta.model[0] = 1;
  c->meta.ns_hash[0] = 2;
  c->meta.dtype = 1;  // f16
  c->meta.layers = 2;
  c->meta.kv_heads = 2;
  c->meta.head_dim = 16;
  c->meta.tokens = 64;
  c->meta.first_position = 64 * i;
  c->payload = Payload(c->meta.payload_bytes());
  std::mt19937 rng(static_cast<std::uint32_t>(i) + 7);
  std::normal_distribution<float> n(0.0f, 1.0f);
  auto* h16 = reinterpret_cast<std::uint16_t*>(c->payload.data());
  for (size_t e = 0; e < c->payload.size() / 2; ++e) {
    const float x = std::sin(static_cast<float>(e) * 0.01f) + 0.1f * n(rng);
    h16[e] = kernels::float_to_half(x);
  }
  return c;
}

class LeveledTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto mem = MemoryTier::Create("remote", 1 << 30, MemoryKind::kHost);
    ASSERT_TRUE(mem.ok());
    auto link = std::make_unique<LinkTier>(std::move(mem).value());
    link_ = link.get();
    auto t = LeveledTier::Create(std::move(link), {"zstd", "kdn:hifi", "kdn:balanced"});
    ASSERT_TRUE(t.ok()) << t.status().message();
    tier_ = std::move(t).value();
    for (int i = 0; i < kChunks; ++i) {
      chunks_.push_back(KvChunk(i));
      ASSERT_TRUE(tier_->Put(chunks_.back()).ok());
    }
  }
  // A load of every chunk with `budget_s`, as KvStore::FetchPrefix runs it;
  // the level each chunk came at (-1: left to recompute).
  std::vector<int> Load(double budget_s, const std::function<void(int)>& after_get = {}) {
    const auto before = tier_->Counters();
    std::vector<keys::Digest> keys;
    for (const ChunkRef& c : chunks_) keys.push_back(c->meta.key);
    DeliveryTarget t;
    t.deadline_ns = DeadlineIn(std::chrono::duration<double>(budget_s));
    t.recompute_ns_per_token = 1e5;  // 6.4 ms a chunk
    t.chunk_tokens = 64;
    std::vector<int> levels;
    {
      ReadContext ctx;
      ctx.target = t;
      tier_->Prefetch(keys, true, ctx);
    }
    std::vector<std::uint64_t> seen = before.fetched;
    for (int i = 0; i < kChunks; ++i) {
      auto got = tier_->Get(keys[static_cast<size_t>(i)]);
      const auto now = tier_->Counters();
      int level = -1;
      for (size_t l = 0; l < now.fetched.size(); ++l) {
        if (now.fetched[l] > seen[l] && level < 0 && got.ok()) level = static_cast<int>(l);
      }
      // Two fetches may complete between gets: attribute by the chunk itself.
      if (got.ok()) {
        level = (*got)->meta.degraded ? ((*got)->meta.lossy ? 1 : 0) : 0;
        EXPECT_EQ((*got)->meta.key, keys[static_cast<size_t>(i)]);
        EXPECT_EQ((*got)->meta.codec, codec::CodecId::kRaw);
        EXPECT_EQ((*got)->payload.size(), chunks_[static_cast<size_t>(i)]->payload.size());
      }
      seen = now.fetched;
      levels.push_back(got.ok() ? level : -1);
      if (after_get) after_get(i);
    }
    return levels;
  }
  static constexpr int kChunks = 12;
  LinkTier* link_ = nullptr;
  std::unique_ptr<LeveledTier> tier_;
  std::vector<ChunkRef> chunks_;
};

TEST_F(LeveledTierTest, EveryLevelIsKeptAndAPlainGetServesTheFinest) {
  for (const ChunkRef& c : chunks_) {
    for (size_t l = 0; l < 3; ++l) EXPECT_TRUE(link_->Contains(LevelKey(c->meta.key, l))) << l;
  }
  auto got = tier_->Get(chunks_[3]->meta.key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)->meta.degraded);
  EXPECT_FALSE((*got)->meta.lossy) << "level 0 is zstd: exact";
  EXPECT_TRUE(std::equal((*got)->payload.begin(), (*got)->payload.end(), chunks_[3]->payload.begin()));
  EXPECT_EQ(tier_->Counters().fetched[0], 1u);
  EXPECT_TRUE(tier_->Erase(chunks_[3]->meta.key));
  for (size_t l = 0; l < 3; ++l) EXPECT_FALSE(link_->Contains(LevelKey(chunks_[3]->meta.key, l))) << l;
}

TEST_F(LeveledTierTest, LevelsFollowTheRateAndTheTarget) {
  // Each chunk: 4 KiB of f16 KV; zstd ~3.6 KiB, kdn:hifi ~1.3, kdn:balanced ~0.9.
  link_->rate = 200e6;
  ASSERT_TRUE(tier_->Get(chunks_[0]->meta.key).ok());  // the meter's first sample
  // A fast link and a generous target: every chunk at level 0, exact.
  auto levels = Load(1.0);
  EXPECT_EQ(tier_->Counters().fetched[0], 1u + kChunks);
  EXPECT_EQ(tier_->Counters().recomputes, 0u);
  for (int l : levels) EXPECT_EQ(l, 0);

  // 1 MB/s: 12 chunks at level 0 take ~45 ms; a 25 ms target leaves room for
  // coarser levels only, after the meter has seen the new rate.
  link_->rate = 1e6;
  ASSERT_TRUE(tier_->Get(chunks_[0]->meta.key).ok());
  const auto before = tier_->Counters();
  Load(0.025);
  const auto after = tier_->Counters();
  EXPECT_GT(after.fetched[1] + after.fetched[2], before.fetched[1] + before.fetched[2]);
  EXPECT_LT(after.fetched[0] - before.fetched[0], static_cast<std::uint64_t>(kChunks) / 2);
}

TEST_F(LeveledTierTest, ADropMidLoadMovesTheRestToCoarserLevels) {
  link_->rate = 100e6;
  ASSERT_TRUE(tier_->Get(chunks_[0]->meta.key).ok());
  const auto before = tier_->Counters();
  // 100 MB/s for the first 3 chunks, then 50 KB/s: level 0 for the rest
  // would take ~650 ms; the target is 400 ms. The link itself drops (not the
  // reader, whom the fetches run ahead of), and the margins are wide on both
  // sides (before the drop, level 0 for all 12 fits the target even if the
  // meter reads 0.2 MB/s), so a busy machine's stalls do not decide it.
  link_->dropped_rate = 0.05e6;
  link_->drop_after = link_->crossings + 3;
  Load(0.400);
  const auto after = tier_->Counters();
  EXPECT_GE(after.fetched[0] - before.fetched[0], 3u) << "before the drop: level 0";
  EXPECT_GT(after.fetched[1] - before.fetched[1] + after.fetched[2] - before.fetched[2] + after.recomputes -
                before.recomputes,
            0u)
      << "after it: a coarser level, or recompute";
}

TEST_F(LeveledTierTest, ATargetNoLevelCanMeetLeavesChunksToRecompute) {
  link_->rate = 20e3;  // 20 KB/s: the coarsest chunk takes ~45 ms, a recompute 6.4 ms
  ASSERT_TRUE(tier_->Get(chunks_[0]->meta.key).ok());
  const auto before = tier_->Counters();
  auto levels = Load(0.005);
  const auto after = tier_->Counters();
  EXPECT_EQ(after.recomputes - before.recomputes, static_cast<std::uint64_t>(kChunks));
  for (int l : levels) EXPECT_EQ(l, -1);
  // A plain get afterwards (no target) still serves level 0.
  auto got = tier_->Get(chunks_[5]->meta.key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)->meta.degraded);
}

TEST_F(LeveledTierTest, ALevelThatDoesNotDecodeIsAnErrorNotACrash) {
  // Level 0 of chunk 4 replaced behind the tier's back by bytes that claim zstd and are not.
  auto bad = std::make_shared<Chunk>();
  bad->meta = chunks_[4]->meta;
  bad->meta.codec = codec::CodecId::kZstd;
  bad->payload = Payload(100);
  ASSERT_TRUE(link_->Erase(chunks_[4]->meta.key));
  ASSERT_TRUE(link_->Put(bad).ok());
  auto got = tier_->Get(chunks_[4]->meta.key);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kCorrupt) << got.status().message();
  // Through a stream too: the load's Get of it fails, the others are served.
  link_->rate = 200e6;
  ASSERT_TRUE(tier_->Get(chunks_[0]->meta.key).ok());
  const std::vector<int> levels = Load(1.0);
  EXPECT_EQ(levels[4], -1);
  for (int i = 0; i < kChunks; ++i) {
    if (i != 4) {
      EXPECT_EQ(levels[static_cast<size_t>(i)], 0) << i;
    }
  }
}

TEST_F(LeveledTierTest, WhatALoadLeftUntakenGoesOnceStale) {
  link_->rate = 200e6;
  std::vector<keys::Digest> keys;
  for (const ChunkRef& c : chunks_) keys.push_back(c->meta.key);
  DeliveryTarget t;
  // 100 ms: enough for the first chunks on a loaded machine (at 10 ms a
  // worker that started late left chunk 0 to recompute); the entries are
  // stale 2 s after it.
  t.deadline_ns = DeadlineIn(std::chrono::milliseconds(100));
  t.chunk_tokens = 64;
  {
    ReadContext ctx;
    ctx.target = t;
    tier_->Prefetch(keys, true, ctx);
  }
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(tier_->Get(keys[static_cast<size_t>(i)]).ok());  // the load stops early
  EXPECT_EQ(tier_->pending(), static_cast<size_t>(kChunks - 3));
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  // The next load's stream drops them, holding only its own.
  std::vector<keys::Digest> two(keys.begin(), keys.begin() + 2);
  t.deadline_ns = DeadlineIn(std::chrono::seconds(1));
  {
    ReadContext ctx;
    ctx.target = t;
    tier_->Prefetch(two, true, ctx);
  }
  EXPECT_EQ(tier_->pending(), 2u);
  for (const keys::Digest& k : two) EXPECT_TRUE(tier_->Get(k).ok());
  EXPECT_EQ(tier_->pending(), 0u);
  // A stale entry's chunk fetched anew by a plain get (not the old result).
  auto got = tier_->Get(keys[7]);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE((*got)->meta.degraded);
}

// A chunk served from a coarser level is not promoted to the tier above
// (later loads would get the lower quality); one from level 0 is.
TEST(LeveledTierChain, DegradedChunksAreNotPromoted) {
  auto mem = MemoryTier::Create("remote", 1 << 30, MemoryKind::kHost);
  ASSERT_TRUE(mem.ok());
  auto leveled = LeveledTier::Create(std::move(mem).value(), {"zstd", "kdn:balanced"});
  ASSERT_TRUE(leveled.ok());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*leveled)->Put(KvChunk(i)).ok());
  TieredStoreOptions o;
  LevelOptions host, remote;
  host.tier = MemoryTier::Create("host", 1 << 30, MemoryKind::kHost).value();
  remote.tier = std::move(leveled).value();
  o.levels.push_back(std::move(host));
  o.levels.push_back(std::move(remote));
  auto chain = TieredStore::Create(std::move(o));
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  const keys::Digest k0 = KvChunk(0)->meta.key, k1 = KvChunk(1)->meta.key;
  // A load with a target on a link never measured: its first chunk is the coarsest level's.
  DeliveryTarget t;
  t.deadline_ns = DeadlineIn(std::chrono::seconds(10));
  t.chunk_tokens = 64;
  {
    ReadContext ctx;
    ctx.target = t;
    const std::vector<keys::Digest> one = {k0};
    (*chain)->tier(1).Prefetch(one, true, ctx);
  }
  {
    auto lease = (*chain)->Get(k0);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->chunk()->meta.degraded);
    EXPECT_TRUE(lease->chunk()->meta.lossy);
  }
  {
    auto lease = (*chain)->Get(k1);  // no target: level 0, exact
    ASSERT_TRUE(lease.ok());
    EXPECT_FALSE(lease->chunk()->meta.degraded);
  }
  (*chain)->Flush();  // the mover's promotions done
  EXPECT_FALSE((*chain)->ContainsAt(0, k0)) << "a degraded chunk was promoted";
  EXPECT_TRUE((*chain)->ContainsAt(0, k1));
}

}  // namespace
}  // namespace kdn::store
