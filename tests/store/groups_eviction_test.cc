// SPDX-License-Identifier: Apache-2.0
// Layer groups (engine/groups.h) under eviction, in a host tier too small
// for everything: a recurrent layer's state snapshot leaves the tier with
// the chunks it ends (without them it serves nothing), and a sliding
// window's older chunks, which only the shorter prefixes need, go before
// the chunks every prefix needs; a store reads a sliding layer's KV only
// from the chunks of its window (the engine may have dropped older ones).
// Each object here is one 4 KiB page of the
// tier, so its capacity counts objects. (The bytes are a counting pattern:
// eviction looks at keys and sizes, not at KV; the exactness of reused KV
// and state is proved with the reference engine's variants,
// tests/refengine/variants_test.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "core/engine/groups.h"
#include "core/engine/kv_views.h"
#include "core/keys/hash.h"

namespace kdn::store {
namespace {

constexpr std::uint64_t kEvChunk = 16;
constexpr std::int64_t kEvHeads = 2, kEvDim = 8;  // one layer's chunk: 2 x 16 x 2 x 8 x 4 bytes, a page
constexpr std::uint64_t kEvPage = 4096;
constexpr std::uint64_t kEvState = 64;  // one recurrent layer's state (a page in the tier)
constexpr const char* kEvNs = "tenant";

struct EvModel {
  ModelKv kv;
  GroupedModel grouped;
};

EvModel MakeEvModel(const char* name, std::vector<std::uint32_t> windows, std::uint32_t state_layers) {
  EvModel m;
  keys::Hasher h;
  h.Str(name);
  m.kv.fingerprint = h.Finish();
  m.kv.shape = {static_cast<std::int64_t>(windows.size()), kEvHeads, kEvDim, 4};
  auto g = GroupedModel::Make(m.kv, windows, state_layers, state_layers > 0 ? kEvState : 0);
  EXPECT_TRUE(g.ok()) << g.status().message();
  m.grouped = std::move(g).value();
  return m;
}

std::unique_ptr<KvStore> EvStore(std::uint64_t pages, PolicyKind policy) {
  StoreOptions o;
  o.chunk_tokens = kEvChunk;
  TierSpec host;
  host.capacity_bytes = pages * kEvPage;
  host.policy = policy;
  host.high_watermark = 1.0;  // evict exactly at capacity
  host.low_watermark = 1.0;
  o.tiers = {host};
  auto s = KvStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

std::vector<std::int32_t> EvTokens(int n, int first) {
  std::vector<std::int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

TokenKeys EvKeys(const std::vector<std::int32_t>& tokens, size_t n) {
  TokenKeys k;
  k.tokens = std::span<const std::int32_t>(tokens.data(), n);
  return k;
}

// Stores the first n tokens' KV (a counting pattern over a canonical buffer
// of every token) and, for a model with recurrent layers, the state `tag`.
std::vector<float> EvPattern(const EvModel& m, size_t tokens) {
  std::vector<float> kv(static_cast<size_t>(m.kv.shape.layers * 2 * kEvHeads * kEvDim) * tokens);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i);
  return kv;
}

// Views over a canonical buffer of every token of the request.
ResolvedViews EvViews(const EvModel& m, std::vector<float>& kv, size_t tokens, size_t n) {
  ViewSpec s;
  s.data = kv.data();
  s.size_bytes = kv.size() * sizeof(float);
  s.num_tokens = tokens;
  auto views = ResolvedViews::Resolve(m.kv, std::vector<ViewSpec>{s}, n);
  EXPECT_TRUE(views.ok()) << views.status().message();
  return std::move(views).value();
}

std::uint64_t EvStoreKv(KvStore& store, const EvModel& m, const std::vector<std::int32_t>& tokens, size_t n,
                        float tag, std::vector<float> kv = {}) {
  if (kv.empty()) kv = EvPattern(m, tokens.size());
  const ResolvedViews views = EvViews(m, kv, tokens.size(), n);
  std::vector<float> state(kEvState / sizeof(float), tag);
  void* p = state.data();
  const std::span<void* const> states = m.grouped.state_layers > 0 ? std::span<void* const>(&p, 1)
                                                                     : std::span<void* const>();
  auto stored = GroupedStore(store, m.grouped, kEvNs, EvKeys(tokens, n), views.groups(), states);
  EXPECT_TRUE(stored.ok()) << stored.status().message();
  return stored.ok() ? *stored : 0;
}

// The chain keys of the whole chunks of `tokens` (as the store cuts them).
std::vector<keys::Digest> EvChain(const EvModel& m, const std::vector<std::int32_t>& tokens) {
  std::vector<keys::Digest> out;
  keys::Digest prev{};
  for (size_t pos = 0; pos + kEvChunk <= tokens.size(); pos += kEvChunk) {
    prev = keys::ChunkKey(0, kEvNs, m.kv.fingerprint, prev,
                          std::span<const std::int32_t>(tokens.data() + pos, kEvChunk));
    out.push_back(prev);
  }
  return out;
}

class GroupsEviction : public ::testing::TestWithParam<PolicyKind> {};

// A model of one full-attention layer and one recurrent layer, stored at
// every chunk boundary of a 64-token prefill: 4 chunks and 4 snapshots fill
// the tier. Another request then needs 3 pages: every snapshot that stays
// still has the chunk it ends (none is left serving nothing), and the ties
// the store keeps are those of the pairs left.
TEST_P(GroupsEviction, ASnapshotLeavesTheTierWithTheChunkItEnds) {
  const EvModel m = MakeEvModel("groups-eviction-recurrent", {0}, 1);
  auto store = EvStore(8, GetParam());
  const auto a = EvTokens(64, 1000);
  for (size_t b = kEvChunk; b <= a.size(); b += kEvChunk) {
    EXPECT_EQ(EvStoreKv(*store, m, a, b, static_cast<float>(b)), b);
  }
  EXPECT_EQ(store->chain().Stats()[0].objects, 8u);
  EXPECT_EQ(GroupedLookup(*store, m.grouped, kEvNs, EvKeys(a, a.size())).tokens, 64u);
  EXPECT_EQ(store->chain().TiedObjects(), 8u);
  const auto other = EvTokens(32, 5000);
  EvStoreKv(*store, m, other, other.size(), -1.0f);

  int pairs = 0, snapshots_gone = 0;
  for (const auto* request : {&a, &other}) {
    const auto chain = EvChain(m, *request);
    for (size_t i = 0; i < chain.size(); ++i) {
      const bool snapshot = store->Holds(kEvNs, StateSnapshotKey(m.grouped, chain[i]));
      const bool chunk = store->Holds(kEvNs, GroupChunkKey(m.grouped.groups[0], chain[i]));
      const bool stored_there = request == &a || i + 1 == chain.size();
      if (!stored_there) continue;
      EXPECT_TRUE(!snapshot || chunk) << "a snapshot held without the chunk it ends (request "
                                      << (request == &a ? "a" : "other") << ", chunk " << i << ")";
      pairs += snapshot && chunk ? 1 : 0;
      snapshots_gone += snapshot ? 0 : 1;
    }
  }
  EXPECT_GT(snapshots_gone, 0);  // eviction happened
  EXPECT_EQ(store->chain().TiedObjects(), 2u * static_cast<size_t>(pairs));
  EXPECT_LE(store->chain().Stats()[0].used_bytes, 8 * kEvPage);
}

// A model of one sliding-window layer (W 16) and one full layer, a 64-token
// prefill stored at each chunk boundary, then retrieved whole: the window's
// three older chunks (only the prefixes 16, 32 and 48 need them) are not
// read by it and age, so that when another request needs two pages, they
// go first, and the whole request is still a hit; its full layer's chunks
// and the window's last one stay.
TEST_P(GroupsEviction, ASlidingWindowsOlderChunksGoFirst) {
  const EvModel m = MakeEvModel("groups-eviction-sliding", {16, 0}, 0);
  ASSERT_EQ(m.grouped.groups.size(), 2u);
  const LayerGroup& full = m.grouped.groups[0];
  const LayerGroup& sliding = m.grouped.groups[1];
  ASSERT_EQ(sliding.window, 16u);
  auto store = EvStore(8, GetParam());
  const auto a = EvTokens(64, 1000);
  for (size_t b = kEvChunk; b <= a.size(); b += kEvChunk) EXPECT_EQ(EvStoreKv(*store, m, a, b, 0), b);
  EXPECT_EQ(store->chain().Stats()[0].objects, 8u);
  std::vector<float> out(EvPattern(m, a.size()).size(), 0.0f);
  const ResolvedViews views = EvViews(m, out, a.size(), a.size());
  auto got = GroupedRetrieve(*store, m.grouped, kEvNs, EvKeys(a, a.size()), views.groups(), {});
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->tokens, 64u);
  const auto other = EvTokens(16, 5000);
  EXPECT_EQ(EvStoreKv(*store, m, other, other.size(), 0), 16u);
  EXPECT_EQ(store->chain().Stats()[0].evictions, 2u);

  const auto chain = EvChain(m, a);
  ASSERT_EQ(chain.size(), 4u);
  int older_held = 0;
  for (size_t i = 0; i < chain.size(); ++i) {
    EXPECT_TRUE(store->Holds(kEvNs, GroupChunkKey(full, chain[i]))) << "full layer's chunk " << i;
    if (i + 1 < chain.size()) older_held += store->Holds(kEvNs, GroupChunkKey(sliding, chain[i])) ? 1 : 0;
  }
  EXPECT_TRUE(store->Holds(kEvNs, GroupChunkKey(sliding, chain[3])));  // the window of the whole request
  EXPECT_EQ(older_held, 1);
  EXPECT_EQ(GroupedLookup(*store, m.grouped, kEvNs, EvKeys(a, a.size())).tokens, 64u);
  EXPECT_EQ(GroupedLookup(*store, m.grouped, kEvNs, EvKeys(other, other.size())).tokens, 16u);
}

// An engine drops a sliding layer's KV once it is out of the window
// (llama.cpp's SWA cache, vLLM's sliding-window blocks): a store of 64
// tokens with W 16 reads that layer's last chunk only. The older positions
// are NaN here, as freed memory would hold anything: nothing of them is
// stored, the whole request is a hit, its shorter prefixes are not (no
// chunk of their windows was stored then) rather than hits served from
// freed memory, and a retrieve writes the window's chunk and nothing older.
TEST_P(GroupsEviction, AStoreReadsASlidingLayerOnlyInItsWindow) {
  const EvModel m = MakeEvModel("groups-eviction-window-read", {16, 0}, 0);
  auto store = EvStore(64, GetParam());
  const auto a = EvTokens(64, 1000);
  std::vector<float> kv = EvPattern(m, a.size());
  const size_t row = static_cast<size_t>(kEvHeads * kEvDim);
  // Canonical [layer][k|v][token][head][dim]: layer 0 (the sliding one), tokens 0..47.
  for (size_t plane = 0; plane < 2; ++plane) {
    for (size_t t = 0; t < 48; ++t) {
      for (size_t e = 0; e < row; ++e) kv[(plane * a.size() + t) * row + e] = std::nanf("");
    }
  }
  const std::vector<float> source = kv;
  EXPECT_EQ(EvStoreKv(*store, m, a, a.size(), 0, kv), 64u);
  EXPECT_EQ(store->chain().Stats()[0].objects, 5u);  // the full layer's 4 chunks, the window's 1
  EXPECT_EQ(GroupedLookup(*store, m.grouped, kEvNs, EvKeys(a, a.size())).tokens, 64u);
  EXPECT_EQ(GroupedLookup(*store, m.grouped, kEvNs, EvKeys(a, 48)).tokens, 0u);
  std::vector<float> out(kv.size(), 0.0f);
  const ResolvedViews views = EvViews(m, out, a.size(), a.size());
  auto got = GroupedRetrieve(*store, m.grouped, kEvNs, EvKeys(a, a.size()), views.groups(), {});
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->tokens, 64u);
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t layer = i / (2 * a.size() * row), token = i / row % a.size();
    const float want = layer == 0 && token < 48 ? 0.0f : source[i];
    ASSERT_EQ(out[i], want) << "layer " << layer << " token " << token;
  }
}

// Per tier, a lookup counts the prefix the rule gives with what that tier
// alone holds: a host tier of 4 pages over a disk tier, a sliding-window
// model stored at each boundary of 64 tokens; the host keeps the last two
// boundaries' pieces (no first chunk: 0), the disk the first two (the
// prefix 32: its full chunks and its window's chunk).
TEST(GroupsTiers, EachTiersCountFollowsTheRule) {
  std::string dir = ::testing::TempDir() + "/kdn_groups_tiers_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const EvModel m = MakeEvModel("groups-tiers", {16, 0}, 0);
  StoreOptions o;
  o.chunk_tokens = kEvChunk;
  TierSpec host;
  host.capacity_bytes = 4 * kEvPage;
  host.high_watermark = 1.0;
  host.low_watermark = 1.0;
  TierSpec disk;
  disk.kind = TierSpec::Kind::kDisk;
  disk.capacity_bytes = std::uint64_t{16} << 20;
  disk.path = dir;
  disk.fsync = false;
  o.tiers = {host, disk};
  auto store = KvStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status().message();
  const auto a = EvTokens(64, 1000);
  for (size_t b = kEvChunk; b <= a.size(); b += kEvChunk) EXPECT_EQ(EvStoreKv(**store, m, a, b, 0), b);
  (*store)->chain().Flush();
  const LookupResult r = GroupedLookup(**store, m.grouped, kEvNs, EvKeys(a, a.size()));
  EXPECT_EQ(r.tokens, 64u);
  EXPECT_EQ(r.tier_tokens, (std::vector<std::uint64_t>{0, 32}));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Policies, GroupsEviction, ::testing::Values(PolicyKind::kLru, PolicyKind::kS3Fifo, PolicyKind::kCost),
                         [](const ::testing::TestParamInfo<PolicyKind>& p) {
                           return std::string(PolicyName(p.param));
                         });

}  // namespace
}  // namespace kdn::store
