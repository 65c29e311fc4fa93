// SPDX-License-Identifier: Apache-2.0
// What the disk tier's tests share (disk_tier_test.cc, disk_hostile_test.cc):
// chunks whose every byte is a function of their number, and a fixture that
// opens a tier on a fresh directory and names its files.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "core/tiers/disk_tier.h"

namespace kdn::store::disk_test {

inline keys::Digest KeyOf(int i) {
  keys::Hasher h;
  h.Str("disk-tier-test").U64(static_cast<std::uint64_t>(i));
  return h.Finish();
}

// Chunk i: f32, `head_dim` wide (payload = 8 x head_dim bytes), bytes
// derived from i so that a mix-up shows.
inline ChunkRef MakeChunk(int i, std::uint32_t head_dim = 100) {
  auto c = std::make_shared<Chunk>();
  c->meta.key = KeyOf(i);
  c->meta.model[0] = 0x4D;
  c->meta.ns_hash[0] = 0x4E;
  c->meta.dtype = 0;
  c->meta.layers = 1;
  c->meta.kv_heads = 1;
  c->meta.head_dim = head_dim;
  c->meta.tokens = 1;
  c->meta.first_position = i;
  c->payload = Payload(c->meta.payload_bytes());
  std::mt19937 rng(static_cast<std::uint32_t>(i) * 2654435761u);
  for (auto& b : c->payload) b = static_cast<std::uint8_t>(rng());
  return c;
}

inline bool SameChunk(const Chunk& a, const Chunk& b) {
  return a.meta == b.meta && a.payload.size() == b.payload.size() &&
         std::equal(a.payload.begin(), a.payload.end(), b.payload.begin());
}

// A disk tier in dir_ (set by the test's SetUp).
class DiskTest : public ::testing::Test {
 protected:
  DiskTierOptions Options(std::uint64_t capacity = 1 << 30) const {
    DiskTierOptions o;
    o.directory = dir_;
    o.capacity_bytes = capacity;
    return o;
  }
  std::unique_ptr<DiskTier> Open(const DiskTierOptions& o) {
    Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  std::unique_ptr<DiskTier> Open(std::uint64_t capacity = 1 << 30) { return Open(Options(capacity)); }
  std::filesystem::path ObjectFile(int i) const {
    const std::string hex = keys::ToHex(KeyOf(i));
    return std::filesystem::path(dir_) / "objects" / hex.substr(0, 2) / (hex + ".kdn");
  }
  std::filesystem::path Objects() const { return std::filesystem::path(dir_) / "objects"; }
  std::filesystem::path Tmp() const { return std::filesystem::path(dir_) / "tmp"; }

  // Reads object i back, expecting exactly the chunk that was put.
  void ExpectIntact(DiskTier& t, int i, std::uint32_t head_dim = 100) {
    Result<ChunkRef> got = t.Get(KeyOf(i));
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(SameChunk(**got, *MakeChunk(i, head_dim))) << i;
  }

  // Puts chunks 0 to n-1 through a tier that is then closed, and dates object
  // i's last use t0 + i seconds (mtimes are what a restart sees); *cost is
  // what one of them costs. Call under ASSERT_NO_FATAL_FAILURE.
  void PutDatedObjects(int n, std::uint64_t* cost) {
    {
      auto t = Open();
      for (int i = 0; i < n; ++i) ASSERT_TRUE(t->Put(MakeChunk(i)).ok());
      *cost = t->Cost(*MakeChunk(0));
    }
    for (int i = 0; i < n; ++i) {
      const timespec ts[2] = {{1'700'000'000 + i, 0}, {1'700'000'000 + i, 0}};
      ASSERT_EQ(::utimensat(AT_FDCWD, ObjectFile(i).c_str(), ts, 0), 0);
    }
  }

  std::string dir_;
};

}  // namespace kdn::store::disk_test
