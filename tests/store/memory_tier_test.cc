// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/memory_tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <thread>

namespace kdn::store {
namespace {

keys::Digest Key(int i) {
  keys::Digest d{};
  d[0] = static_cast<std::uint8_t>(i);
  d[1] = static_cast<std::uint8_t>(i >> 8);
  d[31] = 0xAB;
  return d;
}

ChunkRef Obj(int key, size_t n, std::uint8_t fill) {
  auto c = std::make_shared<Chunk>();
  c->meta.key = Key(key);
  c->payload = Payload(n);
  std::memset(c->payload.data(), fill, n);
  return c;
}

std::unique_ptr<MemoryTier> Tier(std::uint64_t capacity, MemoryKind kind = MemoryKind::kHost) {
  auto t = MemoryTier::Create("host", capacity, kind);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST(HostPool, ClassSizesArePagesThenEighthSteps) {
  EXPECT_EQ(HostPool::ClassSize(1), 4096u);
  EXPECT_EQ(HostPool::ClassSize(4096), 4096u);
  EXPECT_EQ(HostPool::ClassSize(4097), 8192u);
  EXPECT_EQ(HostPool::ClassSize(65536), 65536u);
  // Uniform chunks of common sizes take exactly their size.
  EXPECT_EQ(HostPool::ClassSize(std::uint64_t{32} << 20), std::uint64_t{32} << 20);
  EXPECT_EQ(HostPool::ClassSize(327680), 327680u);  // the reference model's 256-token chunk
  for (std::uint64_t n : {70000ull, 1000000ull, 33554433ull}) {
    EXPECT_GE(HostPool::ClassSize(n), n);
    EXPECT_LE(HostPool::ClassSize(n), n + n / 8 + 4096);
  }
}

TEST(HostPool, HonoursCapacityAndReusesBlocksWithoutLeaking) {
  auto pool = HostPool::Create(std::uint64_t{1} << 20, MemoryKind::kHost);
  ASSERT_TRUE(pool.ok());
  std::vector<Payload> held;
  for (;;) {
    Payload p = (*pool)->Allocate(65536);
    if (p.empty()) break;
    held.push_back(std::move(p));
  }
  EXPECT_EQ(held.size(), 16u);  // 1 MiB / 64 KiB: the whole capacity, nothing more
  EXPECT_LE((*pool)->Usage().reserved, std::uint64_t{1} << 20);
  held.clear();
  EXPECT_EQ((*pool)->Usage().in_use, 0u);
  // Churn: blocks come back and are reused; reserved memory does not grow.
  const std::uint64_t reserved = (*pool)->Usage().reserved;
  for (int i = 0; i < 1000; ++i) {
    Payload p = (*pool)->Allocate(65536);
    ASSERT_FALSE(p.empty());
  }
  EXPECT_EQ((*pool)->Usage().reserved, reserved);
  // Another size class gets room by releasing empty slabs.
  Payload big = (*pool)->Allocate(900000);
  EXPECT_FALSE(big.empty());
}

TEST(HostPool, PayloadsOutliveTheirTier) {
  ChunkRef kept;
  {
    auto t = Tier(1 << 20);
    ASSERT_TRUE(t->Put(Obj(1, 5000, 7)).ok());
    kept = t->Get(Key(1)).value();
  }
  EXPECT_EQ(kept->payload.size(), 5000u);
  EXPECT_EQ(kept->payload[4999], 7);
}

// Payloads of a page and more reuse mappings given back (core/chunk/chunk.cc):
// after many sizes have filled the cache, a new size is still kept (the
// oldest go), and its next payload faults in no page again.
TEST(Payload, ANewSizeIsReusedAfterManyOthersFilledTheCache) {
  for (size_t i = 0; i < 200; ++i) {  // 200+ MiB of sizes given back once each: more than the cache holds
    Payload p = Payload::Uninitialized((std::size_t{1} << 20) + i * 4096);
    p[0] = 1;
  }
  const size_t n = (std::size_t{3} << 20) - 8192;  // 766 pages, below the huge-page size
  {
    Payload p = Payload::Uninitialized(n);
    std::memset(p.data(), 1, n);
  }
  rusage before{}, after{};
  ::getrusage(RUSAGE_SELF, &before);
  {
    Payload p = Payload::Uninitialized(n);
    std::memset(p.data(), 2, n);
  }
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_minflt - before.ru_minflt, 64) << "its pages were faulted in again: the mapping was not kept";
}

TEST(MemoryTier, PutGetContainsEraseUsage) {
  auto t = Tier(1 << 20);
  ASSERT_TRUE(t->Put(Obj(1, 100, 1)).ok());
  EXPECT_TRUE(t->Contains(Key(1)));
  EXPECT_FALSE(t->Contains(Key(2)));
  auto o = t->Get(Key(1));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ((*o)->payload.size(), 100u);
  EXPECT_EQ((*o)->payload[99], 1);
  EXPECT_EQ(t->Get(Key(2)).status().code(), Code::kNotFound);
  EXPECT_EQ(t->used_bytes(), 4096u);  // one page: the block's class
  EXPECT_EQ(t->objects(), 1u);
  EXPECT_EQ(t->List().size(), 1u);
  EXPECT_TRUE(t->Put(Obj(1, 100, 9)).ok());  // present: a no-op
  EXPECT_EQ((*t->Get(Key(1)))->payload[0], 1);
  EXPECT_TRUE(t->Erase(Key(1)));
  EXPECT_FALSE(t->Erase(Key(1)));
  EXPECT_EQ(t->used_bytes(), 0u);
}

TEST(MemoryTier, RefusesWhatDoesNotFitWithoutEvicting) {
  auto t = Tier(3 * 4096);
  ASSERT_TRUE(t->Put(Obj(1, 4096, 1)).ok());
  ASSERT_TRUE(t->Put(Obj(2, 4096, 2)).ok());
  ASSERT_TRUE(t->Put(Obj(3, 4096, 3)).ok());
  const Status s = t->Put(Obj(4, 4096, 4));
  EXPECT_EQ(s.code(), Code::kBusy);
  EXPECT_TRUE(t->Contains(Key(1)));
  EXPECT_EQ(t->objects(), 3u);
}

TEST(MemoryTier, AReaderKeepsItsBytesWhenTheObjectIsErased) {
  auto t = Tier(4096);
  ASSERT_TRUE(t->Put(Obj(1, 4096, 7)).ok());
  ChunkRef held = t->Get(Key(1)).value();
  ASSERT_TRUE(t->Erase(Key(1)));
  ASSERT_TRUE(t->Put(Obj(2, 4096, 8)).ok());  // the tier's capacity is free again...
  EXPECT_EQ(held->payload[100], 7);           // ...but the reader's block is not reused
}

TEST(MemoryTier, DeviceEmulationBehavesLikeTheHostTier) {
  auto t = Tier(1 << 20, MemoryKind::kDeviceEmulated);
  EXPECT_EQ(t->kind(), MemoryKind::kDeviceEmulated);
  ASSERT_TRUE(t->Put(Obj(1, 1000, 3)).ok());
  EXPECT_EQ((*t->Get(Key(1)))->payload[999], 3);
  if (!GpuPresent()) {
    EXPECT_EQ(MemoryTier::Create("device", 1 << 20, MemoryKind::kDevice).status().code(), Code::kUnsupported);
  }
}

// A chunk that arrived in an envelope: `before` bytes of header, the
// payload, `after` bytes of padding, in one buffer the payload shares.
ChunkRef InEnvelope(int key, size_t before, size_t n, size_t after, std::uint8_t fill) {
  auto buffer = std::make_shared<Payload>(before + n + after);
  for (size_t i = 0; i < buffer->size(); ++i) (*buffer)[i] = static_cast<std::uint8_t>(fill + i);
  auto c = std::make_shared<Chunk>();
  c->meta.key = Key(key);
  c->payload = Payload::Adopt(buffer->data() + before, n, buffer);
  c->envelope = buffer->data();
  c->envelope_bytes = buffer->size();
  return c;
}

TEST(MemoryTier, AChunkThatCameInAnEnvelopeIsKeptWholeAndCostsItsEnvelope) {
  auto tier = Tier(1 << 20);
  ChunkRef in = InEnvelope(1, 200, 70000, 8, 3);
  EXPECT_EQ(tier->Cost(*in), HostPool::ClassSize(70208));
  ASSERT_TRUE(tier->Put(in).ok());
  EXPECT_EQ(tier->used_bytes(), HostPool::ClassSize(70208));
  auto got = tier->Get(Key(1));
  ASSERT_TRUE(got.ok());
  const Chunk& c = **got;
  ASSERT_NE(c.envelope, nullptr);
  EXPECT_NE(c.envelope, in->envelope);  // a copy in the tier's pool
  ASSERT_EQ(c.envelope_bytes, 70208u);
  EXPECT_EQ(std::memcmp(c.envelope, in->envelope, 70208), 0);
  EXPECT_EQ(c.payload.data(), c.envelope + 200);
  EXPECT_EQ(c.payload.size(), 70000u);
  EXPECT_TRUE(tier->Erase(Key(1)));
  EXPECT_EQ(tier->used_bytes(), 0u);
  // A payload outside its envelope is not one: the payload alone is kept.
  auto odd = std::make_shared<Chunk>();
  odd->meta.key = Key(2);
  odd->payload = Payload(4096);
  odd->envelope = in->envelope;
  odd->envelope_bytes = in->envelope_bytes;
  ASSERT_TRUE(tier->Put(odd).ok());
  EXPECT_EQ((*tier->Get(Key(2)))->envelope, nullptr);
  EXPECT_EQ(tier->used_bytes(), 4096u);
  // A device tier keeps payloads only.
  auto dev = Tier(1 << 20, MemoryKind::kDeviceEmulated);
  EXPECT_TRUE(dev->Reserve(4096).empty());
  ASSERT_TRUE(dev->Put(InEnvelope(3, 64, 8192, 0, 1)).ok());
  EXPECT_EQ(dev->used_bytes(), 8192u);
}

TEST(MemoryTier, AChunkBuiltInAReservedBlockIsKeptWithoutACopy) {
  auto tier = Tier(1 << 20);
  Payload block = tier->Reserve(70208);
  ASSERT_EQ(block.size(), 70208u);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<std::uint8_t>(i * 5);
  auto holder = std::make_shared<Payload>(std::move(block));
  auto c = std::make_shared<Chunk>();
  c->meta.key = Key(4);
  c->payload = Payload::Adopt(holder->data() + 200, 70000, holder);
  c->envelope = holder->data();
  c->envelope_bytes = holder->size();
  const std::uint8_t* where = holder->data();
  holder = nullptr;
  ASSERT_TRUE(tier->Put(c).ok());
  c = nullptr;
  auto got = tier->Get(Key(4));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)->envelope, where);  // the very block
  EXPECT_EQ((*got)->payload.data(), where + 200);
  EXPECT_EQ((*got)->payload[0], static_cast<std::uint8_t>(200 * 5));
  EXPECT_EQ(tier->used_bytes(), HostPool::ClassSize(70208));
  got = Status::NotFound("");
  EXPECT_TRUE(tier->Erase(Key(4)));
  // Back in the pool, taken by the next reservation of its class.
  EXPECT_EQ(tier->Reserve(70208).data(), where);
}

TEST(MemoryTier, ConcurrentPutsAndGets) {
  auto t = Tier(64 * 4096);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (int i = 0; i < 500; ++i) {
        const int k = (i * 7 + w) % 100;
        (void)t->Put(Obj(k, 4000, static_cast<std::uint8_t>(k)));
        auto g = t->Get(Key(k));
        if (g.ok() && (*g)->payload[3999] != static_cast<std::uint8_t>(k)) ++bad;
        if (i % 3 == 0) t->Erase(Key(k));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(t->used_bytes(), t->capacity_bytes());
}

}  // namespace
}  // namespace kdn::store
