// SPDX-License-Identifier: Apache-2.0
#include "core/engine/kv_store.h"
#include "core/engine/kv_views.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "test_models.h"

namespace kdn::store {
namespace {

constexpr int kLayers = 5, kPos = 48, kKvDim = 32;
const std::vector<std::int32_t> kTokens = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                           421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
                                           292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358,
                                           394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266};


// Real KV of the reference run, in the canonical layout for 48 tokens.
class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    const std::vector<float> k = testing::ReadFloats(testing::ReferencePath("kv260k.k.f32"));
    const std::vector<float> v = testing::ReadFloats(testing::ReferencePath("kv260k.v.f32"));
    ASSERT_EQ(k.size(), static_cast<size_t>(kLayers * kPos * kKvDim));
    kv_.resize(2 * k.size());
    const size_t run = static_cast<size_t>(kPos) * kKvDim;
    for (int l = 0; l < kLayers; ++l) {
      std::memcpy(&kv_[(static_cast<size_t>(l) * 2 + 0) * run], &k[static_cast<size_t>(l) * run], run * 4);
      std::memcpy(&kv_[(static_cast<size_t>(l) * 2 + 1) * run], &v[static_cast<size_t>(l) * run], run * 4);
    }
    model_.fingerprint = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "stories260K"});
    model_.shape = {kLayers, 4, 8, 4};
  }
  // A canonical buffer of `tokens` tokens as a view: per-layer pointers into
  // the one allocation.
  struct Buffer {
    std::vector<void*> k, v;
    kernels::KvView view;
  };
  Buffer View(std::vector<float>& data, std::uint64_t tokens) {
    EXPECT_GE(data.size(), static_cast<size_t>(kLayers) * 2 * tokens * kKvDim);
    const kernels::KvStrides st = kernels::canonical_strides(model_.shape, static_cast<std::int64_t>(tokens));
    Buffer b;
    for (int l = 0; l < kLayers; ++l) {
      b.k.push_back(data.data() + l * st.layer);
      b.v.push_back(data.data() + l * st.layer + st.kv);
    }
    b.view.shape = model_.shape;
    b.view.k_base = b.k.data();
    b.view.v_base = b.v.data();
    b.view.stride_token = st.token;
    b.view.stride_head = st.head;
    b.view.stride_dim = st.dim;
    return b;
  }
  std::span<const std::int32_t> Tokens(size_t n) const { return std::span<const std::int32_t>(kTokens).first(n); }
  // The canonical KV of the first n tokens, laid out for a buffer of `cap` tokens.
  std::vector<float> Expected(size_t n, size_t cap) const {
    std::vector<float> out(static_cast<size_t>(kLayers) * 2 * cap * kKvDim, 0.0f);
    for (size_t lk = 0; lk < 2 * kLayers; ++lk) {
      std::memcpy(&out[lk * cap * kKvDim], &kv_[lk * kPos * kKvDim], n * kKvDim * 4);
    }
    return out;
  }
  // A buffer of 48 tokens, filled with -1 before a retrieve, holds the KV of
  // the first n tokens and nothing past them.
  bool HoldsPrefix(const std::vector<float>& out, size_t n) const {
    const std::vector<float> want = Expected(n, kPos);
    for (size_t lk = 0; lk < 2 * kLayers; ++lk) {
      if (std::memcmp(&out[lk * kPos * kKvDim], &want[lk * kPos * kKvDim], n * kKvDim * 4) != 0) return false;
      if (n < kPos && out[lk * kPos * kKvDim + n * kKvDim] != -1.0f) return false;
    }
    return true;
  }
  static std::unique_ptr<KvStore> Make(const StoreOptions& o) {
    auto s = KvStore::Create(o);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }
  static TokenKeys K(std::span<const std::int32_t> t) {
    TokenKeys k;
    k.tokens = t;
    return k;
  }
  std::uint64_t Lookup(KvStore& s, std::string_view ns, std::span<const std::int32_t> t) {
    return s.Lookup(model_, ns, K(t)).tokens;
  }
  std::uint64_t Store(KvStore& s, std::string_view ns, std::span<const std::int32_t> t, const Buffer& b) {
    return s.Store(model_, ns, K(t), b.view).value();
  }
  std::uint64_t Retrieve(KvStore& s, std::string_view ns, std::span<const std::int32_t> t, const Buffer& b) {
    return s.Retrieve(model_, ns, K(t), b.view);
  }
  struct Counts {
    std::uint64_t hits, tokens_served, tokens_stored, bytes_served;
    struct {
      std::uint64_t objects, bytes, capacity, evictions;
    } host;
  };
  static Counts Count(KvStore& s) {
    const Telemetry t = s.Stats();
    const LevelStats l = s.chain().Stats()[0];
    return Counts{t.hits, t.tokens_served, t.tokens_stored, t.bytes_served,
                  {l.objects, l.used_bytes, l.capacity_bytes, l.evictions}};
  }
  // One host tier that evicts exactly at capacity (watermarks 1.0).
  static StoreOptions Options(std::uint32_t chunk, std::uint64_t capacity = 1 << 24) {
    StoreOptions o;
    o.chunk_tokens = chunk;
    TierSpec host;
    host.capacity_bytes = capacity;
    host.high_watermark = host.low_watermark = 1.0;
    o.tiers.push_back(host);
    return o;
  }

  // An empty directory of this process.
  static std::filesystem::path FreshDir(const std::string& name) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("kdn-kvstore-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    return dir;
  }
  // One disk tier in `dir` (its default codec), 8-token chunks (6 chunks
  // of the 48 tokens).
  static StoreOptions OnDisk(const std::filesystem::path& dir) {
    StoreOptions o;
    o.chunk_tokens = 8;
    TierSpec disk;
    disk.kind = TierSpec::Kind::kDisk;
    disk.path = dir.string();
    disk.capacity_bytes = 64u << 20;
    o.tiers.push_back(disk);
    return o;
  }

  std::vector<float> kv_;
  ModelKv model_;
};

TEST_F(KvStoreTest, StoresAndRetrievesRealKvBitExact) {
  auto s_owner = Make(Options(16)); KvStore& s = *s_owner;
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 0u);
  EXPECT_EQ(Store(s, "t", Tokens(48), View(kv_, 48)), 48u);
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 48u);
  std::vector<float> out(kv_.size(), -1.0f);
  EXPECT_EQ(Retrieve(s, "t", Tokens(48), View(out, 48)), 48u);
  EXPECT_EQ(out, kv_);
  const Counts st = Count(s);
  EXPECT_EQ(st.host.objects, 3u);
  EXPECT_EQ(st.host.bytes, 48u * 1280);
  EXPECT_EQ(st.hits, 3u);
  EXPECT_EQ(st.tokens_served, 48u);
  EXPECT_EQ(st.tokens_stored, 48u);
  EXPECT_EQ(st.bytes_served, 48u * 1280);
  // Storing again adds nothing.
  EXPECT_EQ(Store(s, "t", Tokens(48), View(kv_, 48)), 48u);
  EXPECT_EQ(Count(s).tokens_stored, 48u);
}

TEST_F(KvStoreTest, TrailingPartialChunkIsReusedByLongerRequests) {
  auto s_owner = Make(Options(16)); KvStore& s = *s_owner;
  std::vector<float> first40 = Expected(40, 40);
  EXPECT_EQ(Store(s, "t", Tokens(40), View(first40, 40)), 40u);  // chunks 16 + 16 + partial 8
  EXPECT_EQ(Lookup(s, "t", Tokens(40)), 40u);
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 40u);  // longer request: the partial chunk still matches
  EXPECT_EQ(Lookup(s, "t", Tokens(44)), 40u);
  EXPECT_EQ(Lookup(s, "t", Tokens(39)), 32u);  // the partial chunk needs all its 8 tokens
  EXPECT_EQ(Lookup(s, "t", Tokens(10)), 0u);
  std::vector<float> out(kv_.size(), -1.0f);
  EXPECT_EQ(Retrieve(s, "t", Tokens(48), View(out, 48)), 40u);
  EXPECT_TRUE(HoldsPrefix(out, 40));
  // A short first store: its partial chunk (5 tokens) is reused at the root too.
  auto s2_owner = Make(Options(16)); KvStore& s2 = *s2_owner;
  std::vector<float> first5 = Expected(5, 5);
  EXPECT_EQ(Store(s2, "t", Tokens(5), View(first5, 5)), 5u);
  EXPECT_EQ(Lookup(s2, "t", Tokens(48)), 5u);
}

TEST_F(KvStoreTest, DivergingTokensStopTheMatchAtTheirChunk) {
  auto s_owner = Make(Options(16)); KvStore& s = *s_owner;
  Store(s, "t", Tokens(48), View(kv_, 48));
  std::vector<std::int32_t> other(kTokens);
  other[20] = 7;
  EXPECT_EQ(Lookup(s, "t", other), 16u);
  other[0] = 2;
  EXPECT_EQ(Lookup(s, "t", other), 0u);
}

TEST_F(KvStoreTest, TenantsAndModelsAreIsolated) {
  auto s_owner = Make(Options(16)); KvStore& s = *s_owner;
  Store(s, "tenant-a", Tokens(48), View(kv_, 48));
  EXPECT_EQ(Lookup(s, "tenant-b", Tokens(48)), 0u);
  std::vector<float> out(kv_.size(), -1.0f);
  EXPECT_EQ(Retrieve(s, "tenant-b", Tokens(48), View(out, 48)), 0u);
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == -1.0f; }));
  ModelKv other = model_;
  other.fingerprint = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "stories260K-other-weights"});
  EXPECT_EQ(s.Lookup(other, "tenant-a", K(Tokens(48))).tokens, 0u);
  EXPECT_EQ(Lookup(s, "tenant-a", Tokens(48)), 48u);
}

TEST_F(KvStoreTest, FullTierEvictsAndNeverFails) {
  // Room for two 16-token chunks (2 x 20480 bytes).
  auto s_owner = Make(Options(16, 2 * 16 * 1280)); KvStore& s = *s_owner;
  // The longest prefix that fits; never its own first chunks (useless tails).
  EXPECT_EQ(Store(s, "t", Tokens(48), View(kv_, 48)), 32u);
  Counts st = Count(s);
  EXPECT_EQ(st.host.objects, 2u);
  EXPECT_LE(st.host.bytes, st.host.capacity);
  EXPECT_EQ(st.host.evictions, 0u);
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 32u);
  // Another sequence evicts the older one, least recently used first.
  std::vector<std::int32_t> other(kTokens);
  other[0] = 2;
  EXPECT_EQ(Store(s, "t", other, View(kv_, 48)), 32u);
  st = Count(s);
  EXPECT_EQ(st.host.evictions, 2u);
  EXPECT_EQ(Lookup(s, "t", other), 32u);
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 0u);
  // A chunk larger than the whole tier is not cached; the call still succeeds.
  auto tiny_owner = Make(Options(16, 1000)); KvStore& tiny = *tiny_owner;
  EXPECT_EQ(Store(tiny, "t", Tokens(48), View(kv_, 48)), 0u);
  EXPECT_EQ(Count(tiny).host.objects, 0u);
}

// Chunks that are not page-sized cost a whole number of pages in a host
// tier: a store must not evict its own first chunks to make room for its
// last ones, and what it reports stored is what lookups then find.
TEST_F(KvStoreTest, AStoreReportsWhatTheTiersHoldWhenChunksRoundUpToPages) {
  // 3-token chunks of 3840 bytes cost 4096 each; 15 pages hold 15 of them,
  // though 16 x 3840 bytes is exactly the capacity.
  auto s_owner = Make(Options(3, 15 * 4096)); KvStore& s = *s_owner;
  const std::uint64_t stored = Store(s, "t", Tokens(48), View(kv_, 48));
  EXPECT_EQ(stored, 45u);
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), stored);
  EXPECT_EQ(Count(s).host.evictions, 0u);
  std::vector<float> out(kv_.size(), -1.0f);
  EXPECT_EQ(Retrieve(s, "t", Tokens(48), View(out, 48)), stored);
  EXPECT_TRUE(HoldsPrefix(out, 45));
}

// A chunk the plan counts as present can still be evicted by the store's own
// new chunks (it is the least recently used): the result says so.
TEST_F(KvStoreTest, AStoreDoesNotReportAPresentChunkItsOwnPutsEvicted) {
  std::vector<float> out(kv_.size(), -1.0f);
  auto t_owner = Make(Options(3, 4 * 4096)); KvStore& t = *t_owner;
  std::vector<float> first3 = Expected(3, 3);
  ASSERT_EQ(Store(t, "t", Tokens(3), View(first3, 3)), 3u);  // chunk 0, then...
  std::vector<std::int32_t> other(kTokens.begin(), kTokens.begin() + 3);
  other[0] = 2;
  ASSERT_EQ(Store(t, "t", other, View(first3, 3)), 3u);       // ...a newer one: chunk 0 goes first
  const std::uint64_t reported = Store(t, "t", Tokens(48), View(kv_, 48));
  EXPECT_EQ(reported, Lookup(t, "t", Tokens(48)));
  EXPECT_EQ(Retrieve(t, "t", Tokens(48), View(out, 48)), reported);
}

TEST_F(KvStoreTest, LookupHasNoSideEffectOnEvictionOrder) {
  std::vector<float> a = Expected(16, 16);
  for (bool touch_with_retrieve : {false, true}) {
    auto s_owner = Make(Options(16, 2 * 16 * 1280)); KvStore& s = *s_owner;
    std::vector<std::int32_t> ta(kTokens.begin(), kTokens.begin() + 16), tb = ta, tc = ta;
    tb[0] = 2;
    tc[0] = 3;
    Store(s, "t", ta, View(a, 16));
    Store(s, "t", tb, View(a, 16));
    std::vector<float> out(a.size());
    if (touch_with_retrieve) {
      EXPECT_EQ(Retrieve(s, "t", ta, View(out, 16)), 16u);
    } else {
      EXPECT_EQ(Lookup(s, "t", ta), 16u);
    }
    Store(s, "t", tc, View(a, 16));  // evicts the least recently used
    EXPECT_EQ(Lookup(s, "t", ta), touch_with_retrieve ? 16u : 0u);
    EXPECT_EQ(Lookup(s, "t", tb), touch_with_retrieve ? 0u : 16u);
  }
}

TEST_F(KvStoreTest, EvictedPartialChunksAreForgotten) {
  auto s_owner = Make(Options(16, 16 * 1280)); KvStore& s = *s_owner;
  std::vector<float> first8 = Expected(8, 8);
  EXPECT_EQ(Store(s, "t", Tokens(8), View(first8, 8)), 8u);
  std::vector<std::int32_t> other(kTokens.begin(), kTokens.begin() + 16);
  other[0] = 2;
  std::vector<float> full16 = Expected(16, 16);
  EXPECT_EQ(Store(s, "t", other, View(full16, 16)), 16u);  // evicts the partial chunk
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 0u);
  EXPECT_EQ(Store(s, "t", Tokens(8), View(first8, 8)), 8u);  // and it can come back
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 8u);
}

TEST_F(KvStoreTest, EvictingOneRequestsPiecesKeepsAnothersFindable) {
  // Two 3-token tails under the same parent (the root), each stored as
  // pieces of 2 and 1 tokens: one page each.
  auto s_owner = Make(Options(16, 4 * 4096)); KvStore& s = *s_owner;  // four pages
  std::vector<float> kv3 = Expected(3, 3);
  const std::vector<std::int32_t> a = {1, 2, 3}, b = {1, 5, 6}, c = {7, 8};
  EXPECT_EQ(Store(s, "t", a, View(kv3, 3)), 3u);
  EXPECT_EQ(Store(s, "t", b, View(kv3, 3)), 3u);
  EXPECT_EQ(Count(s).host.objects, 4u);
  EXPECT_EQ(Store(s, "t", c, View(kv3, 2)), 2u);  // one piece: evicts the least recently used, a's first
  EXPECT_EQ(Lookup(s, "t", a), 0u);
  EXPECT_EQ(Lookup(s, "t", b), 3u);
  EXPECT_EQ(Lookup(s, "t", c), 2u);
}

// The tokens after the last whole chunk are pieces of decreasing powers of
// two: a request reuses any piece boundary a stored request had.
TEST_F(KvStoreTest, TailPiecesAreReusedAtEveryPieceBoundary) {
  auto s_owner = Make(Options(16)); KvStore& s = *s_owner;
  std::vector<float> kv = Expected(47, 47);
  EXPECT_EQ(Store(s, "t", Tokens(47), View(kv, 47)), 47u);  // chunks 16 + 16, pieces 8 + 4 + 2 + 1
  EXPECT_EQ(Count(s).host.objects, 6u);
  for (std::uint64_t n = 0; n <= 48; ++n) {
    // The longest stored boundary at or below n.
    std::uint64_t want = 0;
    for (std::uint64_t b : {16, 32, 40, 44, 46, 47}) {
      if (b <= n) want = b;
    }
    EXPECT_EQ(Lookup(s, "t", Tokens(n)), want) << n;
  }
  std::vector<float> out(kv_.size(), -1.0f);
  EXPECT_EQ(Retrieve(s, "t", Tokens(45), View(out, 48)), 44u);
  EXPECT_TRUE(HoldsPrefix(out, 44));
  // Two stored tails under one parent: the walk takes the one that reaches
  // further, whichever was stored first.
  std::vector<std::int32_t> longer(kTokens.begin(), kTokens.begin() + 32 + 12);  // pieces 8 + 4
  longer[32 + 9] = 9;                                                           // differs from the 47 in its 4-piece
  std::vector<float> kv44 = Expected(44, 44);
  EXPECT_EQ(Store(s, "t", longer, View(kv44, 44)), 44u);
  EXPECT_EQ(Lookup(s, "t", longer), 44u);
  EXPECT_EQ(Lookup(s, "t", Tokens(48)), 47u);
}

// Issue 10, item 15: a lookup's work does not grow with how many tails of
// different lengths were stored under the same parent (it was one probe per
// stored length: quadratic in chunk_tokens).
TEST_F(KvStoreTest, LookupProbesStayLogarithmicWhateverTailsWereStored) {
  constexpr std::uint32_t kChunk = 1024;
  auto s_owner = Make(Options(kChunk, 1u << 30)); KvStore& s = *s_owner;
  // 300 tails of lengths 1..300 under the root, each its own text.
  std::vector<float> kv(static_cast<size_t>(kLayers) * 2 * 300 * kKvDim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = kv_[i % kv_.size()];
  for (std::int32_t len = 1; len <= 300; ++len) {
    std::vector<std::int32_t> t(static_cast<size_t>(len));
    for (std::int32_t i = 0; i < len; ++i) t[static_cast<size_t>(i)] = len * 1000 + i;
    ASSERT_EQ(Store(s, "t", t, View(kv, static_cast<std::uint64_t>(len))), static_cast<std::uint64_t>(len));
  }
  std::vector<std::int32_t> t(1000);
  for (std::int32_t i = 0; i < 1000; ++i) t[static_cast<size_t>(i)] = 257 * 1000 + i;  // tail 257's text, longer
  const std::uint64_t before = s.Stats().probes;
  EXPECT_EQ(Lookup(s, "t", t), 257u);
  // One probe per power of two below the chunk: 512, 256, ..., 1.
  EXPECT_EQ(s.Stats().probes - before, 10u);
  t[0] = -5;  // a miss costs the same
  const std::uint64_t before_miss = s.Stats().probes;
  EXPECT_EQ(Lookup(s, "t", t), 0u);
  EXPECT_EQ(s.Stats().probes - before_miss, 10u);
}

// Issue 10, item 11: the tail after the last whole chunk is found after a
// restart (it was indexed in memory only: lost, and its files never found).
TEST_F(KvStoreTest, TailsAreFoundAfterARestart) {
  const std::filesystem::path dir = FreshDir("restart");
  StoreOptions o = OnDisk(dir);
  o.chunk_tokens = 16;
  o.tiers[0].codec = "raw";
  // 30 sequences of 17..46 tokens, each its own text (a different first token).
  const auto sequence = [&](int i) {
    std::vector<std::int32_t> t(kTokens.begin(), kTokens.begin() + 17 + i);
    t[0] = 1000 + i;
    return t;
  };
  {
    auto s = Make(o);
    for (int i = 0; i < 30; ++i) {
      const auto t = sequence(i);
      ASSERT_EQ(Store(*s, "t", t, View(kv_, 48)), t.size());
    }
  }
  auto s = Make(o);
  for (int i = 0; i < 30; ++i) {
    const auto t = sequence(i);
    EXPECT_EQ(Lookup(*s, "t", t), t.size()) << i;
    std::vector<float> out(kv_.size(), -1.0f);
    ASSERT_EQ(Retrieve(*s, "t", t, View(out, 48)), t.size()) << i;
    EXPECT_TRUE(HoldsPrefix(out, t.size())) << i;
  }
  s.reset();
  std::filesystem::remove_all(dir);
}

// Chunks read from a disk tier (and decoded) on several threads come back
// as they do on one: the same bytes, the same failed chunk when an object is
// lost, whichever thread read it; and callers that find the threads busy
// read on their own.
TEST_F(KvStoreTest, ChunksFromADiskTierAreReadOnSeveralThreadsAsOnOne) {
  const std::filesystem::path dir = FreshDir("fetch");
  StoreOptions o = OnDisk(dir);  // the default codec: lossless zstd
  {
    auto s = Make(o);
    ASSERT_EQ(Store(*s, "t", Tokens(48), View(kv_, 48)), 48u);
  }
  const TokenKeys keys = K(Tokens(48));
  for (std::uint32_t threads : {1u, 3u}) {
    SCOPED_TRACE("fetch_threads " + std::to_string(threads));
    o.fetch_threads = threads;
    auto s = Make(o);
    std::vector<float> out(kv_.size(), -1.0f);
    ASSERT_EQ(Retrieve(*s, "t", Tokens(48), View(out, 48)), 48u);
    EXPECT_TRUE(HoldsPrefix(out, 48));
    // Four callers at once: one may take the threads, the others read alone.
    std::vector<std::thread> callers;
    std::atomic<int> bad{0};
    for (int c = 0; c < 4; ++c) {
      callers.emplace_back([&] {
        for (int i = 0; i < 10; ++i) {
          std::vector<float> mine(kv_.size(), -1.0f);
          if (Retrieve(*s, "t", Tokens(48), View(mine, 48)) != 48u || !HoldsPrefix(mine, 48)) ++bad;
        }
      });
    }
    for (auto& c : callers) c.join();
    EXPECT_EQ(bad.load(), 0);
  }
  // Lose one object: the same chunk fails on one thread and on three, and the
  // chunks after it are still read.
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> failed;
  for (std::uint32_t threads : {1u, 3u}) {
    SCOPED_TRACE("fetch_threads " + std::to_string(threads));
    o.fetch_threads = threads;
    auto s = Make(o);
    ASSERT_EQ(Store(*s, "t", Tokens(48), View(kv_, 48)), 48u);  // puts back the object lost before
    std::vector<std::filesystem::path> objects;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
      if (e.is_regular_file() && e.file_size() > 1024) objects.push_back(e.path());
    }
    ASSERT_EQ(objects.size(), 6u);
    std::sort(objects.begin(), objects.end());  // named by key: the same object each time
    std::filesystem::remove(objects[3]);
    const Fetch f = s->FetchPrefix(model_, "t", keys);
    EXPECT_EQ(f.covered, 48u);
    ASSERT_EQ(f.failed.size(), 1u);
    EXPECT_EQ(f.failed[0].end - f.failed[0].begin, 8u);
    EXPECT_EQ(f.chunks.size(), 5u);
    failed.push_back({{f.failed[0].begin, f.failed[0].end}});
    std::vector<float> out(kv_.size(), -1.0f);
    const std::uint64_t got = Retrieve(*s, "t", Tokens(48), View(out, 48));
    EXPECT_EQ(got, f.failed[0].begin);
    EXPECT_TRUE(HoldsPrefix(out, got));
  }
  EXPECT_EQ(failed[0], failed[1]);
  std::filesystem::remove_all(dir);
}

TEST_F(KvStoreTest, LayoutsReachingPast2To64BytesAreRefused) {
  ViewSpec v;
  v.data = kv_.data();
  v.size_bytes = 1280;
  v.num_tokens = (std::uint64_t{1} << 22) + 1;
  v.stride_layer = 64;  // the extent wraps to 1280 bytes in 64 bits
  v.stride_kv = 32;
  v.stride_token = std::int64_t{1} << 40;
  v.stride_head = 8;
  v.stride_dim = 1;
  auto r = ResolvedViews::Resolve(model_, std::vector<ViewSpec>{v}, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("too small"), std::string::npos) << r.status().message();
  v.num_tokens = std::uint64_t{1} << 32;
  EXPECT_FALSE(ResolvedViews::Resolve(model_, std::vector<ViewSpec>{v}, 2).ok());
}

TEST_F(KvStoreTest, ConcurrentStoresAndRetrievesStayConsistent) {
  auto s_owner = Make(Options(16, 6 * 16 * 1280)); KvStore& s = *s_owner;  // room for 6 of the 12 chunks: evictions race with reads
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const std::string ns = "ns" + std::to_string(t);
      std::vector<float> src = kv_;
      for (int i = 0; i < 50; ++i) {
        Store(s, ns, Tokens(48), View(src, 48));
        std::vector<float> out(kv_.size(), -1.0f);
        const std::uint64_t n = Retrieve(s, ns, Tokens(48), View(out, 48));
        const std::vector<float> want = Expected(n, 48);
        for (size_t lk = 0; lk < 2 * kLayers; ++lk) {
          if (std::memcmp(&out[lk * 48 * kKvDim], &want[lk * 48 * kKvDim], n * kKvDim * 4) != 0) ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(Count(s).host.bytes, Count(s).host.capacity);
}

// A view given as one allocation is checked before anything is touched
// (engine/kv_views.h).
TEST_F(KvStoreTest, BuffersAreChecked) {
  auto resolve = [&](const ViewSpec& v, std::uint64_t tokens) {
    return ResolvedViews::Resolve(model_, std::vector<ViewSpec>{v}, tokens).status();
  };
  ViewSpec v;
  EXPECT_EQ(resolve(v, 1).code(), Code::kInvalidArgument);  // NULL data
  v.data = kv_.data();
  v.size_bytes = kv_.size() * 4;
  v.num_tokens = 47;
  EXPECT_NE(resolve(v, 48).message().find("room for 47 tokens"), std::string::npos);
  v.num_tokens = 48;
  v.size_bytes -= 1;
  EXPECT_NE(resolve(v, 48).message().find("too small"), std::string::npos);
  v.size_bytes += 1;
  EXPECT_TRUE(resolve(v, 48).ok());
  v.stride_layer = 2 * 48 * 32;
  v.stride_kv = 48 * 32;
  v.stride_token = 32;
  v.stride_head = 8;
  v.stride_dim = -1;
  EXPECT_NE(resolve(v, 48).message().find("non-negative"), std::string::npos);
  v.stride_dim = 1;
  EXPECT_TRUE(resolve(v, 48).ok());
  v.stride_layer = 2 * 48 * 32 + 1;  // the last layer now reaches past the end
  EXPECT_FALSE(resolve(v, 48).ok());
}


// Never slower than prefill: a load measures its tier's delivery rate; once
// the engine reports a prefill faster than that, loads leave the chunks to
// recompute (a failed range the engine prefills), fetching them anyway
// once in kRateProbeEvery loads to measure again; a slower prefill, or the
// option off, loads them again.
TEST_F(KvStoreTest, ChunksATierDeliversSlowerThanPrefillAreLeftToRecompute) {
  const std::filesystem::path dir = FreshDir("rate");
  StoreOptions o = OnDisk(dir);  // zstd: read and decoded on the CPU
  o.fetch_threads = 1;
  auto s = Make(o);
  ASSERT_EQ(Store(*s, "t", Tokens(48), View(kv_, 48)), 48u);
  std::vector<float> out(kv_.size(), -1.0f);
  // No prefill reported: nothing to compare with; the load measures the disk.
  ASSERT_EQ(Retrieve(*s, "t", Tokens(48), View(out, 48)), 48u);
  const KvStore::DeliveryRate measured = s->Rate(0, /*device=*/false);
  EXPECT_EQ(measured.samples, 1u);
  ASSERT_GT(measured.ns_per_token, 0.0);
  EXPECT_EQ(s->Rate(0, /*device=*/true).samples, 0u);
  // The engine prefills 100x faster than the disk delivers.
  const auto fast = static_cast<std::uint64_t>(std::max(1.0, measured.ns_per_token / 100.0) * 1e6);
  ASSERT_TRUE(s->ReportPrefill(model_, 1000000, fast).ok());
  for (std::uint64_t load = 1; load < KvStore::kRateProbeEvery; ++load) {
    std::fill(out.begin(), out.end(), -1.0f);
    ASSERT_EQ(Retrieve(*s, "t", Tokens(48), View(out, 48)), 0u) << load;
    EXPECT_TRUE(HoldsPrefix(out, 0));
  }
  Telemetry t = s->Stats();
  EXPECT_EQ(t.recompute_chunks, 6 * (KvStore::kRateProbeEvery - 1));
  EXPECT_EQ(t.recompute_tokens, 48 * (KvStore::kRateProbeEvery - 1));
  EXPECT_EQ(s->Rate(0, false).recompute_chunks, t.recompute_chunks);
  EXPECT_EQ(s->Rate(0, false).samples, 1u);  // nothing fetched: nothing measured
  // A load op's view of it: the whole cached prefix is covered and failed.
  // (This call is the kRateProbeEvery-th that would leave the disk: a probe.)
  Fetch probe = s->FetchPrefix(model_, "t", K(Tokens(48)));
  EXPECT_EQ(probe.covered, 48u);
  EXPECT_TRUE(probe.failed.empty());
  EXPECT_EQ(probe.chunks.size(), 6u);
  EXPECT_EQ(s->Stats().rate_probes, 1u);
  probe.chunks.clear();
  Fetch left = s->FetchPrefix(model_, "t", K(Tokens(48)));
  EXPECT_EQ(left.covered, 48u);
  ASSERT_EQ(left.failed.size(), 1u);
  EXPECT_EQ(left.failed[0].begin, 0u);
  EXPECT_EQ(left.failed[0].end, 48u);
  EXPECT_EQ(left.recompute_chunks, 6u);
  EXPECT_TRUE(left.chunks.empty());
  // Prefill turns slow (an hour for one token moves the mean far above the
  // disk's rate): the disk is worth loading again.
  ASSERT_TRUE(s->ReportPrefill(model_, 1, std::uint64_t{3600} * 1000 * 1000 * 1000).ok());
  std::fill(out.begin(), out.end(), -1.0f);
  ASSERT_EQ(Retrieve(*s, "t", Tokens(48), View(out, 48)), 48u);
  EXPECT_TRUE(HoldsPrefix(out, 48));
  // With the option off, a store loads whatever the rates say.
  o.recompute_when_faster = false;
  s.reset();
  auto off = Make(o);
  ASSERT_EQ(Retrieve(*off, "t", Tokens(48), View(out, 48)), 48u);
  ASSERT_TRUE(off->ReportPrefill(model_, 1000000, 1000000).ok());  // 1 ns per token
  ASSERT_EQ(Retrieve(*off, "t", Tokens(48), View(out, 48)), 48u);
  EXPECT_EQ(off->Stats().recompute_chunks, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kdn::store
