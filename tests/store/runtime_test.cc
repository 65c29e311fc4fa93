// SPDX-License-Identifier: Apache-2.0
// The runtime as front ends share it (runtime/runtime.h) and callers' views
// resolved into KV groups (engine/kv_views.h): one view or several, checked
// before anything is touched; a runtime that outlives its creator's handle;
// lossy tiers reported; a knowledge fetch under one snapshot. KV comes from
// the reference transformer.
#include "core/runtime/runtime.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "lab/model/tokenizer.h"
#include "lab/model/transformer.h"
#include "reference_kv.h"
#include "test_models.h"

namespace kdn::store {
namespace {

using Reference = testing::ReferenceKv;

// The reference model's KV of a short story, canonical.
Reference Prefill() { return testing::PrefillStory(); }

ViewSpec Canonical(std::vector<float>& kv) {
  ViewSpec s;
  s.data = kv.data();
  s.size_bytes = kv.size() * 4;
  return s;
}

TokenKeys Keys(const std::vector<int>& tokens) {
  TokenKeys k;
  k.tokens = {reinterpret_cast<const std::int32_t*>(tokens.data()), tokens.size()};
  return k;
}

// Views split among layers: layers {4, 0, 2} per layer (k, v), {1, 3} as
// one allocation (rest), each element `fill` until written.
struct SplitViews {
  SplitViews(const Reference& r, float fill)
      : T(r.tokens.size()),
        k(3, std::vector<float>(T * kRow, fill)),
        v(3, std::vector<float>(T * kRow, fill)),
        rest(2 * 2 * T * kRow, fill) {
    kp = {k[0].data(), k[1].data(), k[2].data()};
    vp = {v[0].data(), v[1].data(), v[2].data()};
    ViewSpec a;
    a.layers = first;
    a.num_layers = 3;
    a.k_layers = kp.data();
    a.v_layers = vp.data();
    a.stride_token = 32;
    a.stride_head = 8;
    a.stride_dim = 1;
    a.num_tokens = T;
    ViewSpec b;
    b.data = rest.data();
    b.size_bytes = rest.size() * 4;
    b.layers = second;
    b.num_layers = 2;
    specs = {a, b};
  }
  static constexpr size_t kRow = 32;
  const std::vector<std::uint32_t> first = {4, 0, 2}, second = {1, 3};
  size_t T;
  std::vector<std::vector<float>> k, v;
  std::vector<float> rest;
  std::vector<void*> kp, vp;
  std::vector<ViewSpec> specs;
};

TEST(Runtime, ViewsSplitAmongLayersStoreAndRetrieveTheSameBytes) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  StoreOptions o;
  o.chunk_tokens = 8;
  auto rt = Runtime::Create(o, 2).value();
  std::vector<float> in = r.canonical;
  auto whole = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(in)}, r.tokens.size());
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  ASSERT_NE(whole->whole(), nullptr);
  ASSERT_EQ(rt->Store(r.m, "t", Keys(r.tokens), *whole).value(), r.tokens.size());

  // Read back into two views: layers {4, 0, 2} per layer, {1, 3} as one allocation.
  SplitViews sv(r, -1.0f);
  const size_t T = sv.T, row = SplitViews::kRow;
  auto& k = sv.k;
  auto& v = sv.v;
  auto& rest = sv.rest;
  const auto& first = sv.first;
  const auto& second = sv.second;
  auto split = ResolvedViews::Resolve(r.m, sv.specs, T);
  ASSERT_TRUE(split.ok()) << split.status().message();
  EXPECT_EQ(split->whole(), nullptr);
  const KvStore::Retrieved got = rt->Retrieve(r.m, "t", Keys(r.tokens), *split).value();
  EXPECT_EQ(got.tokens, T);
  EXPECT_FALSE(got.lossy);
  auto layer_of = [&](std::uint32_t l, int kv) { return &r.canonical[((l * 2 + static_cast<size_t>(kv)) * T) * row]; };
  for (size_t j = 0; j < first.size(); ++j) {
    EXPECT_EQ(std::memcmp(k[j].data(), layer_of(first[j], 0), T * row * 4), 0) << first[j];
    EXPECT_EQ(std::memcmp(v[j].data(), layer_of(first[j], 1), T * row * 4), 0) << first[j];
  }
  for (size_t j = 0; j < second.size(); ++j) {
    EXPECT_EQ(std::memcmp(&rest[(j * 2) * T * row], layer_of(second[j], 0), T * row * 4), 0) << second[j];
    EXPECT_EQ(std::memcmp(&rest[(j * 2 + 1) * T * row], layer_of(second[j], 1), T * row * 4), 0) << second[j];
  }

  // And stored through the split views: the same keys, found whole.
  auto rt2 = Runtime::Create(o, 2).value();
  ASSERT_EQ(rt2->Store(r.m, "t", Keys(r.tokens), *split).value(), T);
  std::vector<float> out(r.canonical.size(), 0.0f);
  auto back = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(out)}, T).value();
  EXPECT_EQ(rt2->Retrieve(r.m, "t", Keys(r.tokens), back).value().tokens, T);
  EXPECT_EQ(out, r.canonical);
}

TEST(Runtime, ViewsAreCheckedBeforeAnythingIsTouched) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  const size_t T = r.tokens.size();
  std::vector<float> kv = r.canonical;
  const std::vector<std::uint32_t> some = {0, 1}, dup = {0, 0, 1, 2, 3};
  auto fails = [&](std::vector<ViewSpec> views, std::optional<std::uint64_t> tokens, const char* why) {
    auto got = ResolvedViews::Resolve(r.m, views, tokens);
    EXPECT_FALSE(got.ok()) << why;
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), Code::kInvalidArgument) << why << ": " << got.status().message();
    }
  };
  fails({}, T, "no views");
  ViewSpec part = Canonical(kv);
  part.layers = some;
  part.num_layers = 2;
  fails({part}, T, "layers 2..4 in no view");
  ViewSpec twice = Canonical(kv);
  twice.layers = dup;
  twice.num_layers = 5;
  fails({twice}, T, "layer 0 twice");
  ViewSpec small = Canonical(kv);
  small.size_bytes = kv.size() * 4 - 4;
  fails({small}, T, "one byte short");
  ViewSpec bad_dtype = Canonical(kv);
  bad_dtype.dtype = 1;
  fails({bad_dtype}, T, "dtype");
  ViewSpec room = Canonical(kv);
  room.num_tokens = T - 1;
  fails({room}, T, "room for one token less than the request");
  fails({Canonical(kv)}, std::nullopt, "a fetch needs the room stated");
  ViewSpec paged;
  paged.layout = ViewLayout::kPagedNhd;
  std::vector<void*> k(5, kv.data()), v(5, kv.data() + 1);
  paged.k_layers = k.data();
  paged.v_layers = v.data();
  paged.block_size = 4;
  fails({paged}, T, "paged without a block table");
  ViewSpec stated = Canonical(kv);
  stated.num_tokens = T;
  auto ok = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{stated}, std::nullopt);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->room(), T);
}

TEST(Runtime, OutlivesWhoeverCreatedIt) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  StoreOptions o;
  o.chunk_tokens = 16;
  std::shared_ptr<Runtime> held;
  std::weak_ptr<Runtime> watch;
  {
    auto rt = Runtime::Create(o, 1).value();
    watch = rt;
    held = rt;  // as a model's handle holds it
  }
  ASSERT_FALSE(watch.expired());
  std::vector<float> in = r.canonical;
  auto views = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(in)}, r.tokens.size()).value();
  // An op started now holds the views' memory; the runtime is the last thing to go.
  auto op = held->Save(r.m, "t", OwnedKeys::Of(Keys(r.tokens)), views).value();
  for (std::uint32_t l = 0; l < 5; ++l) ASSERT_TRUE(op->SaveLayer(l).ok());
  ASSERT_TRUE(op->Wait(-1).ok());
  EXPECT_EQ(op->Outcome().tokens, r.tokens.size());
  held.reset();
  EXPECT_TRUE(watch.expired());
}

// A synchronous retrieve into several KV groups is a prefix, as one into a
// single view: with chunk 1 of 3+ unreadable, it writes and counts tokens
// [0, 8) only. It went out through a load op (not a prefix) and scattered
// and counted the chunks after the failure while reporting 8 tokens.
TEST(Runtime, ARetrieveIntoSeveralGroupsWritesAndCountsOnlyThePrefix) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  const size_t T = r.tokens.size(), row = 32;
  ASSERT_GE(T, 24u);
  const auto dir = std::filesystem::temp_directory_path() / ("kdn-runtime-prefix-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  StoreOptions o;
  o.chunk_tokens = 8;
  TierSpec disk;
  disk.kind = TierSpec::Kind::kDisk;
  disk.path = dir.string();
  disk.capacity_bytes = 64 << 20;
  disk.codec = "raw";
  o.tiers = {disk};
  auto rt = Runtime::Create(o, 2).value();
  std::vector<float> in = r.canonical;
  auto views = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(in)}, T).value();
  ASSERT_EQ(rt->Store(r.m, "t", Keys(r.tokens), views).value(), T);
  keys::Digest lost{};
  {
    Fetch f = rt->store().FetchPrefix(r.m, "t", Keys(r.tokens));
    ASSERT_GE(f.chunks.size(), 3u);
    lost = f.chunks[1].lease.chunk()->meta.key;
  }
  bool flipped = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().find(keys::ToHex(lost)) != std::string::npos) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-100, std::ios::end);
      char c;
      f.get(c);
      f.seekp(-100, std::ios::end);
      f.put(static_cast<char>(c ^ 0x5A));
      flipped = true;
    }
  }
  ASSERT_TRUE(flipped);

  // Layers {4, 0, 2} per layer, {1, 3} as one allocation; -1 everywhere.
  SplitViews sv(r, -1.0f);
  auto& k = sv.k;
  auto& rest = sv.rest;
  const auto& first = sv.first;
  const auto& second = sv.second;
  auto split = ResolvedViews::Resolve(r.m, sv.specs, T).value();
  const std::uint64_t served_before = rt->store().Stats().tokens_served;
  const KvStore::Retrieved got = rt->Retrieve(r.m, "t", Keys(r.tokens), split).value();
  EXPECT_EQ(got.tokens, 8u);
  EXPECT_EQ(got.covered, T);
  EXPECT_EQ(rt->store().Stats().tokens_served - served_before, 8u);
  auto layer_of = [&](std::uint32_t l, int kv) { return &r.canonical[((l * 2 + static_cast<size_t>(kv)) * T) * row]; };
  for (size_t j = 0; j < first.size(); ++j) {
    EXPECT_EQ(std::memcmp(k[j].data(), layer_of(first[j], 0), 8 * row * 4), 0) << first[j];
    for (size_t t = 8; t < T; ++t) ASSERT_EQ(k[j][t * row], -1.0f) << "layer " << first[j] << " token " << t;
  }
  for (size_t j = 0; j < second.size(); ++j) {
    EXPECT_EQ(std::memcmp(&rest[(j * 2) * T * row], layer_of(second[j], 0), 8 * row * 4), 0) << second[j];
    for (size_t t = 8; t < T; ++t) ASSERT_EQ(rest[(j * 2 * T + t) * row], -1.0f) << "layer " << second[j] << " token " << t;
  }
  rt.reset();
  std::filesystem::remove_all(dir);
}

TEST(Runtime, ALossyTierIsReportedAndARawOneIsNot) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  const auto dir = std::filesystem::temp_directory_path() / ("kdn-runtime-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (const char* codec : {"kdn", "raw"}) {
    StoreOptions o;
    o.chunk_tokens = 8;
    TierSpec host;
    host.capacity_bytes = 4096;  // nothing stays here: every chunk goes to disk
    host.high_watermark = host.low_watermark = 1.0;
    TierSpec disk;
    disk.kind = TierSpec::Kind::kDisk;
    disk.path = (dir / codec).string();
    disk.capacity_bytes = 64 << 20;
    disk.codec = codec;
    o.tiers = {host, disk};
    auto rt = Runtime::Create(o, 1).value();
    std::vector<float> in = r.canonical;
    auto views = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(in)}, r.tokens.size()).value();
    ASSERT_EQ(rt->Store(r.m, "t", Keys(r.tokens), views).value(), r.tokens.size()) << codec;
    rt->store().chain().Flush();
    std::vector<float> out(r.canonical.size(), 0.0f);
    auto back = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(out)}, r.tokens.size()).value();
    const KvStore::Retrieved got = rt->Retrieve(r.m, "t", Keys(r.tokens), back).value();
    EXPECT_EQ(got.tokens, r.tokens.size()) << codec;
    const bool raw = std::string(codec) == "raw";
    EXPECT_EQ(got.lossy, !raw) << codec;
    EXPECT_EQ(out == r.canonical, raw) << codec;
  }
  std::filesystem::remove_all(dir);
}

TEST(Runtime, AFetchIsOneSnapshotAndRefusesTooSmallBuffers) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  StoreOptions o;
  o.chunk_tokens = 8;
  auto rt = Runtime::Create(o, 1).value();
  const size_t T = r.tokens.size();
  std::vector<float> in = r.canonical;
  auto put = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(in)}, T).value();
  const std::span<const std::int32_t> ids(reinterpret_cast<const std::int32_t*>(r.tokens.data()), T);
  ASSERT_TRUE(rt->knowledge().Put(r.m, "t", "doc", 1, "", ids, put).ok());

  std::vector<float> small(r.canonical.size() / T * (T - 1), 7.0f);
  ViewSpec s = Canonical(small);
  s.num_tokens = T - 1;
  auto too_small = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{s}, std::nullopt).value();
  std::vector<std::int32_t> tokens;
  const Status st = rt->knowledge().Fetch(r.m, "t", "doc", &too_small, too_small.room(), &tokens);
  EXPECT_EQ(st.code(), Code::kBufferTooSmall) << st.message();
  EXPECT_EQ(tokens.size(), T);  // the length it needs
  for (float f : small) ASSERT_EQ(f, 7.0f);  // nothing written

  std::vector<float> out(r.canonical.size(), 0.0f);
  ViewSpec fits = Canonical(out);
  fits.num_tokens = T;
  auto views = ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{fits}, std::nullopt).value();
  bool lossy = true;
  ASSERT_TRUE(rt->knowledge().Fetch(r.m, "t", "doc", &views, views.room(), &tokens, &lossy).ok());
  EXPECT_FALSE(lossy);
  EXPECT_EQ(std::vector<std::int32_t>(ids.begin(), ids.end()), tokens);
  EXPECT_EQ(out, r.canonical);
  EXPECT_EQ(rt->knowledge().Fetch(r.m, "t", "nope", &views, views.room(), &tokens).code(), Code::kNotFound);
}

}  // namespace
}  // namespace kdn::store

namespace kdn::store {
namespace {

// The value a store gives each chunk for the cost-aware policy: its tokens
// at the request's mean prefill cost per token, a little less for later
// chunks (ChunkValue), carried by the chunk into the tiers.
TEST(Runtime, StoredChunksCarryTheirPrefillValue) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  StoreOptions o;
  o.chunk_tokens = 8;
  TierSpec host;
  host.policy = PolicyKind::kCost;
  o.tiers = {host};
  auto rt = Runtime::Create(o, 1).value();
  const auto plan = rt->store().PlanStore(r.m, "t", r.Keys()).value();
  ASSERT_GE(plan.size(), 3u);
  double work = 0;
  for (const auto& p : plan) work += PrefillCost(static_cast<std::int64_t>(p.begin), p.tokens);
  const double mean = work / static_cast<double>(r.tokens.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_DOUBLE_EQ(plan[i].value, ChunkValue(mean, plan[i].tokens, i, plan.size())) << i;
    if (i > 0 && plan[i].tokens == plan[i - 1].tokens) {
      EXPECT_LT(plan[i].value, plan[i - 1].value) << i;
    }
  }
  std::vector<float> in = r.canonical;
  ASSERT_EQ(rt->Store(r.m, "t", r.Keys(), ResolvedViews::Resolve(r.m, std::vector<ViewSpec>{Canonical(in)}, r.tokens.size()).value())
                .value(),
            r.tokens.size());
  auto lease = rt->store().chain().Get(plan[1].key);
  ASSERT_TRUE(lease.ok());
  EXPECT_DOUBLE_EQ(lease->chunk()->meta.prefill_value, plan[1].value);
}

}  // namespace
}  // namespace kdn::store
