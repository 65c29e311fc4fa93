// SPDX-License-Identifier: Apache-2.0
// Namespace quotas in the chain of tiers (issue 37, item 1): a namespace
// over its quota evicts its own coldest chunks, never another's; one
// without a quota shares what the quotas leave; use and evictions are
// counted per namespace.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "core/store/tiered_store.h"
#include "core/tiers/memory_tier.h"

namespace kdn::store {
namespace {

constexpr std::uint64_t kObj = 4096;  // one page: the memory tiers' smallest block

keys::Digest QuotaKey(int tenant, int i) {
  keys::Digest d{};
  std::memcpy(d.data(), &i, sizeof i);
  d[30] = static_cast<std::uint8_t>(tenant);
  d[31] = 0x9C;
  return d;
}

ChunkRef TenantObj(const keys::Digest& ns, int tenant, int i) {
  auto c = std::make_shared<Chunk>();
  c->meta.key = QuotaKey(tenant, i);
  c->meta.ns_hash = ns;
  c->meta.tokens = 1;
  c->payload = Payload(kObj);
  std::memset(c->payload.data(), i & 0xFF, kObj);
  return c;
}

const keys::Digest kNsA = keys::NamespaceHash("tenant-a"), kNsB = keys::NamespaceHash("tenant-b"),
                   kNsC = keys::NamespaceHash("tenant-c");

// One level of `objects` pages (or two, the second `bottom` pages), with
// quotas in pages; watermarks 1.0 so that only a full level evicts for room.
std::unique_ptr<TieredStore> QuotaChain(int objects, std::vector<NamespaceQuota> quotas, int bottom = 0,
                                        std::vector<NamespaceQuota> bottom_quotas = {}) {
  TieredStoreOptions o;
  auto level = [&](const char* name, int pages, std::vector<NamespaceQuota> q) {
    LevelOptions l;
    l.tier = MemoryTier::Create(name, pages * kObj, MemoryKind::kHost).value();
    l.high_watermark = l.low_watermark = 1.0;
    for (NamespaceQuota& e : q) e.bytes *= kObj;
    l.quotas = std::move(q);
    o.levels.push_back(std::move(l));
  };
  level("top", objects, std::move(quotas));
  if (bottom > 0) level("bottom", bottom, std::move(bottom_quotas));
  auto s = TieredStore::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

NamespaceUse QuotaUse(const TieredStore& s, size_t level, const keys::Digest& ns) {
  for (const NamespaceUse& u : s.Namespaces(level)) {
    if (u.ns == ns) return u;
  }
  ADD_FAILURE() << "no quota for that namespace";
  return {};
}

// Two tenants, each on its own thread, put 600 chunks each into one tier of
// 100 whose quotas are 30 and 50: neither ever holds more than its quota
// (watched from a third thread), every eviction is the putter's own (none
// for room), and each ends holding exactly its last `quota` chunks.
TEST(Quotas, TwoTenantsHammeringOneTierEachEvictOnlyThemselves) {
  auto s = QuotaChain(100, {{kNsA, 30}, {kNsB, 50}});
  constexpr int kPuts = 600;
  std::atomic<bool> done{false}, over{false};
  std::thread watch([&] {
    while (!done.load()) {
      for (const NamespaceUse& u : s->Namespaces(0)) {
        if (u.used_bytes > u.quota_bytes) over = true;
      }
    }
  });
  auto hammer = [&](const keys::Digest& ns, int tenant) {
    for (int i = 0; i < kPuts; ++i) ASSERT_TRUE(s->Put(TenantObj(ns, tenant, i)).ok()) << tenant << " " << i;
  };
  std::thread a(hammer, kNsA, 1), b(hammer, kNsB, 2);
  a.join();
  b.join();
  done = true;
  watch.join();
  EXPECT_FALSE(over.load()) << "a namespace held more than its quota";
  const NamespaceUse ua = QuotaUse(*s, 0, kNsA), ub = QuotaUse(*s, 0, kNsB);
  EXPECT_EQ(ua.used_bytes, 30 * kObj);
  EXPECT_EQ(ub.used_bytes, 50 * kObj);
  EXPECT_EQ(ua.objects, 30u);
  EXPECT_EQ(ua.quota_evictions, kPuts - 30u);
  EXPECT_EQ(ub.quota_evictions, kPuts - 50u);
  EXPECT_EQ(ua.room_evictions, 0u);
  EXPECT_EQ(ub.room_evictions, 0u);
  for (int i = 0; i < kPuts; ++i) {
    EXPECT_EQ(s->ContainsAt(0, QuotaKey(1, i)), i >= kPuts - 30) << "tenant a, chunk " << i;
    EXPECT_EQ(s->ContainsAt(0, QuotaKey(2, i)), i >= kPuts - 50) << "tenant b, chunk " << i;
  }
}

// A namespace without a quota shares what the quotas leave: it fills the
// level, then gives way to a quota'd namespace's puts (its chunks go first
// when the level is full), and its later puts evict its own, not the
// quota'd namespace's.
TEST(Quotas, ANamespaceWithoutAQuotaSharesWhatTheQuotasLeave) {
  auto s = QuotaChain(100, {{kNsA, 40}});
  for (int i = 0; i < 150; ++i) ASSERT_TRUE(s->Put(TenantObj(kNsC, 3, i)).ok());
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(s->Put(TenantObj(kNsA, 1, i)).ok());
  for (int i = 150; i < 300; ++i) ASSERT_TRUE(s->Put(TenantObj(kNsC, 3, i)).ok());
  const NamespaceUse ua = QuotaUse(*s, 0, kNsA);
  EXPECT_EQ(ua.objects, 40u);
  EXPECT_EQ(ua.room_evictions, 0u);
  EXPECT_EQ(ua.quota_evictions, 0u);
  for (int i = 0; i < 40; ++i) EXPECT_TRUE(s->ContainsAt(0, QuotaKey(1, i))) << i;
  int c_held = 0;
  for (int i = 0; i < 300; ++i) c_held += s->ContainsAt(0, QuotaKey(3, i));
  EXPECT_EQ(c_held, 60);
  for (int i = 240; i < 300; ++i) EXPECT_TRUE(s->ContainsAt(0, QuotaKey(3, i))) << i;  // its newest
  // When every chunk left is a quota'd namespace's, a put of another's
  // still finds room (the quotas here add up to more than the level).
  auto t = QuotaChain(10, {{kNsA, 8}, {kNsB, 8}});
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(t->Put(TenantObj(kNsA, 1, i)).ok());
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(t->Put(TenantObj(kNsB, 2, i)).ok());
  EXPECT_EQ(QuotaUse(*t, 0, kNsA).objects + QuotaUse(*t, 0, kNsB).objects, 10u);
  EXPECT_EQ(QuotaUse(*t, 0, kNsA).room_evictions, 6u);
}

// Evicted for its quota from the top level, a chunk is demoted as any
// victim, and the lower level applies its own quota; a chunk larger than
// its namespace's quota is refused there (counted) and lands below; an
// erase gives the bytes back.
TEST(Quotas, EachLevelKeepsItsOwnQuotaAndCountsWhatLeaves) {
  auto s = QuotaChain(20, {{kNsA, 4}, {kNsB, 0}}, 20, {{kNsA, 6}});
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(s->Put(TenantObj(kNsA, 1, i)).ok());
  s->Flush();
  EXPECT_EQ(QuotaUse(*s, 0, kNsA).objects, 4u);
  EXPECT_EQ(QuotaUse(*s, 1, kNsA).objects, 6u);
  EXPECT_EQ(QuotaUse(*s, 1, kNsA).quota_evictions, 2u);  // 8 demoted into a quota of 6
  for (int i = 0; i < 2; ++i) EXPECT_LT(s->Locate(QuotaKey(1, i)), 0) << i;
  for (int i = 2; i < 8; ++i) EXPECT_EQ(s->Locate(QuotaKey(1, i)), 1) << i;
  for (int i = 8; i < 12; ++i) EXPECT_EQ(s->Locate(QuotaKey(1, i)), 0) << i;
  // A quota of 0: every chunk of the namespace refused at the top, stored below.
  ASSERT_TRUE(s->Put(TenantObj(kNsB, 2, 0)).ok());
  EXPECT_EQ(s->Locate(QuotaKey(2, 0)), 1);
  EXPECT_EQ(QuotaUse(*s, 0, kNsB).refused, 1u);
  EXPECT_TRUE(s->Erase(QuotaKey(1, 11)));
  EXPECT_EQ(QuotaUse(*s, 0, kNsA).used_bytes, 3 * kObj);
  EXPECT_EQ(QuotaUse(*s, 0, kNsA).quota_evictions, 8u);
}

TEST(Quotas, TwoQuotasForOneNamespaceAreRefused) {
  TieredStoreOptions o;
  LevelOptions top;
  top.tier = MemoryTier::Create("top", 10 * kObj, MemoryKind::kHost).value();
  top.quotas = {{kNsA, kObj}, {kNsA, 2 * kObj}};
  o.levels.push_back(std::move(top));
  auto s = TieredStore::Create(std::move(o));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("quota"), std::string::npos);
}

}  // namespace
}  // namespace kdn::store
