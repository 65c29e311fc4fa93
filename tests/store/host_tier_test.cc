#include "store/host_tier.h"

#include <gtest/gtest.h>

namespace kdn::store {
namespace {

keys::Digest Key(int i) {
  keys::Digest d{};
  d[0] = static_cast<std::uint8_t>(i);
  d[31] = 0xAB;
  return d;
}

Object Obj(size_t n, std::uint8_t fill) { return std::make_shared<const Bytes>(n, fill); }

TEST(HostTier, PutGetContainsUsage) {
  HostTier t(1000);
  EXPECT_TRUE(t.Put(Key(1), Obj(100, 1)));
  EXPECT_TRUE(t.Contains(Key(1)));
  EXPECT_FALSE(t.Contains(Key(2)));
  Object o = t.Get(Key(1));
  ASSERT_TRUE(o);
  EXPECT_EQ(o->size(), 100u);
  EXPECT_EQ((*o)[99], 1);
  EXPECT_EQ(t.Get(Key(2)), nullptr);
  const TierUsage u = t.Usage();
  EXPECT_EQ(u.objects, 1u);
  EXPECT_EQ(u.bytes, 100u);
  EXPECT_EQ(u.capacity, 1000u);
}

TEST(HostTier, EvictsLeastRecentlyUsedAndHonoursCapacity) {
  HostTier t(300);
  std::vector<keys::Digest> evicted;
  auto record = [&](const keys::Digest& k) { evicted.push_back(k); };
  ASSERT_TRUE(t.Put(Key(1), Obj(100, 1), record));
  ASSERT_TRUE(t.Put(Key(2), Obj(100, 2), record));
  ASSERT_TRUE(t.Put(Key(3), Obj(100, 3), record));
  ASSERT_TRUE(t.Get(Key(1)));                       // 1 is now the most recent
  EXPECT_TRUE(t.Contains(Key(2)));                  // Contains does not refresh 2
  ASSERT_TRUE(t.Put(Key(4), Obj(150, 4), record));  // needs 150: evicts 2, then 3
  EXPECT_EQ(evicted, (std::vector<keys::Digest>{Key(2), Key(3)}));
  EXPECT_TRUE(t.Contains(Key(1)));
  EXPECT_TRUE(t.Contains(Key(4)));
  EXPECT_LE(t.Usage().bytes, 300u);
  EXPECT_EQ(t.Usage().evictions, 2u);
}

TEST(HostTier, ObjectLargerThanTheTierIsRefusedWithoutEvicting) {
  HostTier t(100);
  ASSERT_TRUE(t.Put(Key(1), Obj(60, 1)));
  EXPECT_FALSE(t.Put(Key(2), Obj(101, 2)));
  EXPECT_TRUE(t.Contains(Key(1)));
  EXPECT_EQ(t.Usage().evictions, 0u);
}

TEST(HostTier, AReaderKeepsItsBytesWhenTheObjectIsEvicted) {
  HostTier t(100);
  ASSERT_TRUE(t.Put(Key(1), Obj(100, 7)));
  Object held = t.Get(Key(1));
  ASSERT_TRUE(t.Put(Key(2), Obj(100, 8)));
  EXPECT_FALSE(t.Contains(Key(1)));
  EXPECT_EQ(held->size(), 100u);
  EXPECT_EQ((*held)[50], 7);
}

TEST(HostTier, RePutRefreshesWithoutDuplicating) {
  HostTier t(200);
  ASSERT_TRUE(t.Put(Key(1), Obj(100, 1)));
  ASSERT_TRUE(t.Put(Key(2), Obj(100, 2)));
  ASSERT_TRUE(t.Put(Key(1), Obj(100, 9)));  // refresh 1; keeps the original bytes
  EXPECT_EQ(t.Usage().bytes, 200u);
  ASSERT_TRUE(t.Put(Key(3), Obj(100, 3)));  // evicts 2, the least recent
  EXPECT_TRUE(t.Contains(Key(1)));
  EXPECT_FALSE(t.Contains(Key(2)));
  EXPECT_EQ((*t.Get(Key(1)))[0], 1);
}

}  // namespace
}  // namespace kdn::store
