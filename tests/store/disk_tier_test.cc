// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/disk_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "disk_test_util.h"
#include "core/wire/envelope.h"
#include "core/wire/seal.h"

namespace kdn::store {
namespace {

namespace fs = std::filesystem;

using namespace disk_test;

size_t FilesIn(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

std::uint64_t BytesIn(const fs::path& dir) {
  std::uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.is_regular_file() ? e.file_size() : 0;
  return n;
}

class DiskTierTest : public DiskTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-disk-tier-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A read of object i is a miss that removes it, counted as corrupt.
  void ExpectCorruptMiss(DiskTier& t, int i, const std::string& what) {
    const std::uint64_t before = t.counters().corrupt_detected;
    Result<ChunkRef> got = t.Get(KeyOf(i));
    ASSERT_FALSE(got.ok()) << what << ": the tier returned an object";
    EXPECT_EQ(got.status().code(), Code::kNotFound) << what;
    EXPECT_EQ(t.counters().corrupt_detected, before + 1) << what;
    EXPECT_FALSE(t.Contains(KeyOf(i))) << what;
    EXPECT_FALSE(fs::exists(ObjectFile(i))) << what;
  }
};

// Objects are written around the page cache (O_DIRECT) where the filesystem
// takes it: none of a new object's pages is cached, and it reads back whole
// at its exact size (the direct write covers whole blocks, then is cut).
TEST_F(DiskTierTest, ObjectsAreWrittenAroundThePageCache) {
  auto t = Open();
  if (!t->odirect_active()) GTEST_SKIP() << dir_ << " refuses O_DIRECT";
  const ChunkRef c = MakeChunk(7, 131072 + 3);  // 1 MiB and 24 bytes of payload: not a block multiple
  ASSERT_TRUE(t->Put(c).ok());
  const std::uint64_t size = fs::file_size(ObjectFile(7));
  EXPECT_EQ(size, t->Cost(*c));
  const int fd = ::open(ObjectFile(7).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(map, MAP_FAILED);
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident((size + page - 1) / page);
  ASSERT_EQ(::mincore(map, size, resident.data()), 0);
  const size_t cached = static_cast<size_t>(std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }));
  ::munmap(map, size);
  ::close(fd);
  EXPECT_EQ(cached, 0u) << "of " << resident.size() << " pages";
  ExpectIntact(*t, 7, 131072 + 3);
}

TEST_F(DiskTierTest, PutGetRoundTripsAndAccountsTheFileSize) {
  auto t = Open();
  std::uint64_t cost = 0;
  for (int i = 0; i < 6; ++i) {
    const ChunkRef c = MakeChunk(i, 1 + 997 * static_cast<std::uint32_t>(i));  // sizes off any block size
    ASSERT_TRUE(t->Put(c).ok());
    EXPECT_EQ(fs::file_size(ObjectFile(i)), t->Cost(*c));
    cost += t->Cost(*c);
  }
  for (int i = 0; i < 6; ++i) ExpectIntact(*t, i, 1 + 997 * static_cast<std::uint32_t>(i));
  EXPECT_TRUE(t->Contains(KeyOf(3)));
  EXPECT_FALSE(t->Contains(KeyOf(99)));
  EXPECT_EQ(t->Get(KeyOf(99)).status().code(), Code::kNotFound);
  EXPECT_EQ(t->objects(), 6u);
  EXPECT_EQ(t->used_bytes(), cost);
  EXPECT_EQ(BytesIn(Objects()), cost);
  EXPECT_EQ(t->List().size(), 6u);
  EXPECT_EQ(t->counters().corrupt_detected, 0u);
  EXPECT_EQ(FilesIn(Tmp()), 0u);
}

// With a deployment secret (issue 31 item 1): every file carries the seal
// of its envelope (large objects too: written in segments while the payload
// is copied, the seal in the last); a file planted in the directory (a valid
// envelope of the key, another payload, correct checksums) is a miss,
// counted as an authentication failure and removed. A tier without the
// secret reads sealed files as they are.
TEST_F(DiskTierTest, WithASecretOnlySealedFilesAreRead) {
  auto secret = wire::ChunkSealer::FromSecret("the deployment secret, 32 bytes or more: 0001");
  ASSERT_TRUE(secret.ok());
  DiskTierOptions o = Options();
  o.sealer = *secret;
  {
    auto t = Open(o);
    for (int i = 0; i < 4; ++i) {
      const ChunkRef c = MakeChunk(i, 1 + 997 * static_cast<std::uint32_t>(i));
      ASSERT_TRUE(t->Put(c).ok());
      EXPECT_EQ(t->Cost(*c), wire::EncodedEnvelopeSize(c->payload.size()) + wire::kSealTrailerBytes);
      EXPECT_EQ(fs::file_size(ObjectFile(i)), t->Cost(*c));
    }
    const ChunkRef big = MakeChunk(4, 5u << 20);  // 40 MiB: written in segments
    ASSERT_TRUE(t->Put(big).ok());
    for (int i = 0; i < 4; ++i) ExpectIntact(*t, i, 1 + 997 * static_cast<std::uint32_t>(i));
    ExpectIntact(*t, 4, 5u << 20);
    EXPECT_EQ(t->counters().auth_failures, 0u);
  }
  {
    auto plain = Open();  // no secret: the sealed files read as they are
    for (int i = 0; i < 4; ++i) ExpectIntact(*plain, i, 1 + 997 * static_cast<std::uint32_t>(i));
  }
  // The plant: object 0's file replaced by an unsealed envelope of its key
  // over object 1's payload.
  const ChunkRef one = MakeChunk(1, 998);
  auto forged = std::make_shared<chunk::Chunk>();
  forged->meta = MakeChunk(0, 1)->meta;
  forged->meta.head_dim = one->meta.head_dim;
  forged->payload = chunk::Payload(one->payload.data(), one->payload.size());
  const auto bytes = wire::EncodeEnvelope(*forged).value();
  {
    std::ofstream f(ObjectFile(0), std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  auto t = Open(o);
  ExpectCorruptMiss(*t, 0, "an unsealed file");
  EXPECT_EQ(t->counters().auth_failures, 1u);
  for (int i = 1; i < 4; ++i) ExpectIntact(*t, i, 1 + 997 * static_cast<std::uint32_t>(i));
}

TEST_F(DiskTierTest, CostIsTheEnvelopeSize) {
  auto t = Open();
  for (std::uint32_t hd : {1u, 7u, 512u, 8191u}) {
    const ChunkRef c = MakeChunk(1, hd);
    Result<Bytes> encoded = wire::EncodeEnvelope(*c);
    ASSERT_TRUE(encoded.ok());
    EXPECT_EQ(t->Cost(*c), encoded->size());
  }
}

TEST_F(DiskTierTest, PuttingAPresentKeyIsANoOp) {
  auto t = Open();
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  const std::uint64_t used = t->used_bytes();
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  EXPECT_EQ(t->used_bytes(), used);
  EXPECT_EQ(t->objects(), 1u);
}

TEST_F(DiskTierTest, EraseRemovesTheFileAndItsBytes) {
  auto t = Open();
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  ASSERT_TRUE(t->Put(MakeChunk(2)).ok());
  EXPECT_TRUE(t->Erase(KeyOf(1)));
  EXPECT_FALSE(t->Erase(KeyOf(1)));
  EXPECT_FALSE(fs::exists(ObjectFile(1)));
  EXPECT_EQ(t->Get(KeyOf(1)).status().code(), Code::kNotFound);
  EXPECT_EQ(t->used_bytes(), t->Cost(*MakeChunk(2)));
  EXPECT_EQ(t->counters().corrupt_detected, 0u);  // a plain miss
  ExpectIntact(*t, 2);
}

TEST_F(DiskTierTest, RejectsBadOptionsAndBadChunks) {
  DiskTierOptions o = Options();
  o.capacity_bytes = 0;
  EXPECT_EQ(DiskTier::Open(o).status().code(), Code::kInvalidArgument);
  o = Options();
  o.directory.clear();
  EXPECT_EQ(DiskTier::Open(o).status().code(), Code::kInvalidArgument);
  auto t = Open();
  auto bad = std::make_shared<Chunk>();
  bad->meta = MakeChunk(1)->meta;
  bad->payload = Payload(3);  // not what the shape says
  EXPECT_EQ(t->Put(bad).code(), Code::kInvalidArgument);
  EXPECT_EQ(t->used_bytes(), 0u);
  EXPECT_EQ(t->Put(nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(FilesIn(Tmp()), 0u);
}

TEST_F(DiskTierTest, ASecondOpenOfTheSameDirectoryIsRefused) {
  auto t = Open();
  Result<std::unique_ptr<DiskTier>> second = DiskTier::Open(Options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable);
  t.reset();
  EXPECT_TRUE(DiskTier::Open(Options()).ok());
}

TEST_F(DiskTierTest, RestartKeepsEveryObject) {
  std::map<keys::Digest, std::uint64_t> sizes;
  {
    auto t = Open();
    for (int i = 0; i < 40; ++i) ASSERT_TRUE(t->Put(MakeChunk(i, 50 + static_cast<std::uint32_t>(i))).ok());
    for (const ObjectInfo& o : t->List()) sizes[o.key] = o.bytes;
  }
  auto t = Open();
  EXPECT_EQ(t->objects(), 40u);
  std::uint64_t total = 0;
  for (const ObjectInfo& o : t->List()) {
    EXPECT_EQ(sizes.at(o.key), o.bytes);
    EXPECT_GT(o.last_use_ns, 0);  // the file's mtime
    total += o.bytes;
  }
  EXPECT_EQ(t->used_bytes(), total);
  for (int i = 0; i < 40; ++i) ExpectIntact(*t, i, 50 + static_cast<std::uint32_t>(i));
  EXPECT_EQ(t->stale_temp_files_removed(), 0u);
  EXPECT_EQ(t->objects_trimmed_at_open(), 0u);
}

TEST_F(DiskTierTest, LeftoverTempFilesAreRemovedAtOpen) {
  {
    auto t = Open();
    ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  }
  // What a crash mid-write leaves: a partial envelope, an empty file, a whole one never renamed.
  Result<Bytes> whole = wire::EncodeEnvelope(*MakeChunk(2));
  ASSERT_TRUE(whole.ok());
  std::ofstream(Tmp() / "123-0.tmp", std::ios::binary).write(reinterpret_cast<const char*>(whole->data()), 100);
  std::ofstream(Tmp() / "123-1.tmp", std::ios::binary);
  std::ofstream(Tmp() / "123-2.tmp", std::ios::binary)
      .write(reinterpret_cast<const char*>(whole->data()), static_cast<std::streamsize>(whole->size()));
  auto t = Open();
  EXPECT_EQ(t->stale_temp_files_removed(), 3u);
  EXPECT_EQ(FilesIn(Tmp()), 0u);
  EXPECT_EQ(t->objects(), 1u);
  EXPECT_FALSE(t->Contains(KeyOf(2)));
  ExpectIntact(*t, 1);
}

TEST_F(DiskTierTest, CapacityIsHonouredAtOpenByRemovingTheOldest) {
  std::uint64_t cost = 0;
  ASSERT_NO_FATAL_FAILURE(PutDatedObjects(10, &cost));  // object i last used at t0 + i seconds
  auto t = Open(4 * cost + cost / 2);  // room for 4
  EXPECT_EQ(t->objects(), 4u);
  EXPECT_LE(t->used_bytes(), t->capacity_bytes());
  EXPECT_EQ(t->objects_trimmed_at_open(), 6u);
  EXPECT_EQ(FilesIn(Objects()), 4u);
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(fs::exists(ObjectFile(i))) << i;
  for (int i = 6; i < 10; ++i) ExpectIntact(*t, i);
}

TEST_F(DiskTierTest, PutRefusesWhatDoesNotFitAndTheCallerEvicts) {
  const std::uint64_t cost = DiskTier::Open(Options()).value()->Cost(*MakeChunk(0));
  auto t = Open(3 * cost);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeChunk(i)).ok());
  const Status full = t->Put(MakeChunk(3));
  EXPECT_EQ(full.code(), Code::kBusy);
  EXPECT_EQ(full.message(), "full");
  EXPECT_FALSE(fs::exists(ObjectFile(3)));
  EXPECT_EQ(FilesIn(Tmp()), 0u);
  EXPECT_EQ(t->used_bytes(), 3 * cost);
  ASSERT_TRUE(t->Erase(KeyOf(0)));
  ASSERT_TRUE(t->Put(MakeChunk(3)).ok());
  EXPECT_EQ(t->used_bytes(), 3 * cost);
  // An object bigger than the whole tier never fits.
  EXPECT_EQ(t->Put(MakeChunk(9, 1000)).code(), Code::kBusy);
}

TEST_F(DiskTierTest, EveryFsyncPolicyStoresAndRestarts) {
  for (FsyncPolicy p : {FsyncPolicy::kNone, FsyncPolicy::kData, FsyncPolicy::kFull}) {
    DiskTierOptions o = Options();
    o.fsync = p;
    {
      auto t = Open(o);
      ASSERT_TRUE(t->Put(MakeChunk(static_cast<int>(p))).ok());
      ASSERT_TRUE(t->Put(MakeChunk(10)).ok());
      ASSERT_TRUE(t->Erase(KeyOf(10)));
    }
    auto t = Open(o);
    ExpectIntact(*t, static_cast<int>(p));
    EXPECT_FALSE(t->Contains(KeyOf(10)));
  }
}

TEST_F(DiskTierTest, ReadsUseODirectWhereTheFilesystemAllowsIt) {
  auto t = Open();
  if (!t->odirect_active()) GTEST_SKIP() << dir_ << " is on a filesystem without O_DIRECT";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(t->Put(MakeChunk(i, 1 + 1500 * static_cast<std::uint32_t>(i))).ok());
  for (int i = 0; i < 4; ++i) ExpectIntact(*t, i, 1 + 1500 * static_cast<std::uint32_t>(i));
  EXPECT_TRUE(t->odirect_active());  // no read fell back
}

TEST_F(DiskTierTest, ReadsAreBufferedWhenODirectIsDisabled) {
  DiskTierOptions o = Options();
  o.use_odirect = false;
  std::atomic<int> direct_opens{0};
  o.open_file = [&](const std::string& path, int flags) {
    if (flags & O_DIRECT) ++direct_opens;
    return ::open(path.c_str(), flags);
  };
  auto t = Open(o);
  EXPECT_FALSE(t->odirect_active());
  ASSERT_TRUE(t->Put(MakeChunk(1, 3000)).ok());
  ExpectIntact(*t, 1, 3000);
  EXPECT_EQ(direct_opens.load(), 0);
}

// A filesystem that refuses O_DIRECT (EINVAL at open), from the start: Open
// detects it and every read is buffered.
TEST_F(DiskTierTest, FallsBackToBufferedReadsWhenOpenRefusesODirect) {
  DiskTierOptions o = Options();
  std::atomic<int> direct_opens{0}, buffered_opens{0};
  o.open_file = [&](const std::string& path, int flags) {
    if (flags & O_DIRECT) {
      ++direct_opens;
      errno = EINVAL;
      return -1;
    }
    ++buffered_opens;
    return ::open(path.c_str(), flags);
  };
  auto t = Open(o);
  EXPECT_FALSE(t->odirect_active());
  EXPECT_EQ(direct_opens.load(), 1);  // the probe at Open
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeChunk(i, 777)).ok());
  for (int i = 0; i < 3; ++i) ExpectIntact(*t, i, 777);
  EXPECT_EQ(direct_opens.load(), 1);
  EXPECT_EQ(buffered_opens.load(), 3);
  EXPECT_EQ(t->counters().corrupt_detected, 0u);
}

// The probe passed, then a read is refused (a file on another filesystem,
// or one that fails at the first read): that read and the next ones are buffered.
TEST_F(DiskTierTest, FallsBackToBufferedReadsWhenAReadRefusesODirect) {
  DiskTierOptions o = Options();
  std::atomic<bool> refuse{false};
  std::atomic<int> direct_opens{0};
  o.open_file = [&](const std::string& path, int flags) {
    if ((flags & O_DIRECT) && refuse) {
      ++direct_opens;
      errno = EINVAL;
      return -1;
    }
    return ::open(path.c_str(), flags);
  };
  auto t = Open(o);
  ASSERT_TRUE(t->odirect_active());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeChunk(i)).ok());
  ExpectIntact(*t, 0);
  refuse = true;
  ExpectIntact(*t, 1);
  EXPECT_FALSE(t->odirect_active());
  ExpectIntact(*t, 2);
  EXPECT_EQ(direct_opens.load(), 1);
  EXPECT_EQ(t->counters().corrupt_detected, 0u);
}

// Running out of file descriptors says nothing about the object: it stays.
// Unreadable media (EIO) does: the object goes, as an I/O error.
TEST_F(DiskTierTest, TransientReadErrorsKeepTheObjectMediaErrorsDropIt) {
  DiskTierOptions o = Options();
  std::atomic<int> fail_with{0};
  o.open_file = [&](const std::string& path, int flags) {
    if (const int err = fail_with.load(); err != 0) {
      errno = err;
      return -1;
    }
    return ::open(path.c_str(), flags);
  };
  auto t = Open(o);
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  fail_with = EMFILE;
  Result<ChunkRef> got = t->Get(KeyOf(1));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kUnavailable);
  EXPECT_TRUE(t->Contains(KeyOf(1)));
  EXPECT_EQ(t->counters().io_errors, 1u);
  fail_with = 0;
  ExpectIntact(*t, 1);
  fail_with = EIO;
  got = t->Get(KeyOf(1));
  EXPECT_EQ(got.status().code(), Code::kNotFound);
  EXPECT_FALSE(t->Contains(KeyOf(1)));
  EXPECT_FALSE(fs::exists(ObjectFile(1)));
  EXPECT_EQ(t->counters().io_errors, 2u);
  EXPECT_EQ(t->counters().corrupt_detected, 0u);
  EXPECT_EQ(t->used_bytes(), 0u);
}

TEST_F(DiskTierTest, ConcurrentPutsGetsErasesAndListsStayConsistent) {
  const std::uint64_t cost = DiskTier::Open(Options()).value()->Cost(*MakeChunk(0));
  auto t = Open(40 * cost);  // 64 keys compete for 40 places: some Puts are refused
  constexpr int kThreads = 6, kOps = 400, kKeys = 64;
  std::vector<ChunkRef> chunks;
  for (int i = 0; i < kKeys; ++i) chunks.push_back(MakeChunk(i));
  std::atomic<int> wrong{0}, hits{0}, refused{0};
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(static_cast<std::uint32_t>(th));
      for (int op = 0; op < kOps; ++op) {
        const int k = static_cast<int>(rng() % kKeys);
        switch (rng() % 5) {
          case 0:
          case 1: {
            const Status s = t->Put(chunks[static_cast<size_t>(k)]);
            if (s.code() == Code::kBusy) ++refused;
            else if (!s.ok()) ++wrong;
            break;
          }
          case 2:
          case 3: {
            Result<ChunkRef> g = t->Get(KeyOf(k));
            if (g.ok()) {
              ++hits;
              if (!SameChunk(**g, *chunks[static_cast<size_t>(k)])) ++wrong;
            } else if (g.status().code() != Code::kNotFound) {
              ++wrong;
            }
            break;
          }
          case 4:
            if (rng() % 4 == 0) {
              (void)t->List();
            } else {
              t->Erase(KeyOf(k));
            }
            break;
        }
        if (t->used_bytes() > t->capacity_bytes()) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_GT(refused.load(), 0);
  EXPECT_EQ(t->counters().corrupt_detected, 0u);
  EXPECT_EQ(t->counters().io_errors, 0u);
  // The index, the accounting and the files agree.
  std::uint64_t listed = 0;
  for (const ObjectInfo& o : t->List()) listed += o.bytes;
  EXPECT_EQ(t->used_bytes(), listed);
  EXPECT_EQ(BytesIn(Objects()), listed);
  EXPECT_EQ(FilesIn(Objects()), t->objects());
  EXPECT_EQ(FilesIn(Tmp()), 0u);
  const std::uint64_t objects = t->objects();
  t.reset();
  t = Open(40 * cost);
  EXPECT_EQ(t->objects(), objects);
  EXPECT_EQ(t->used_bytes(), listed);
}

TEST_F(DiskTierTest, ConcurrentPutsOfTheSameKeyStoreOneWholeObject) {
  auto t = Open();
  constexpr int kThreads = 8;
  for (int round = 0; round < 10; ++round) {
    const ChunkRef c = MakeChunk(round, 20000);
    std::barrier start(kThreads);
    std::atomic<int> failed{0};
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&] {
        start.arrive_and_wait();
        if (!t->Put(c).ok()) ++failed;
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failed.load(), 0);
    ExpectIntact(*t, round, 20000);
  }
  EXPECT_EQ(t->objects(), 10u);
  EXPECT_EQ(t->used_bytes(), 10 * t->Cost(*MakeChunk(0, 20000)));
  EXPECT_EQ(FilesIn(Objects()), 10u);
  EXPECT_EQ(FilesIn(Tmp()), 0u);
}

// A large object is read in segments and its payload hashed as they land:
// a flipped byte anywhere (the header, either side of a segment bound,
// either side of the payload's last word, which is hashed only once the
// header is parsed) or a cut is still a miss, before and after a restart;
// an untouched one reads back whole.
TEST_F(DiskTierTest, LargeObjectsReadInSegmentsAreCheckedWhole) {
  const std::uint32_t dim = 655361;  // 5 MiB and 8 bytes of payload: three read segments
  const ChunkRef c = MakeChunk(1, dim);
  const std::uint64_t cost = DiskTier::Open(Options()).value()->Cost(*c);
  const std::uint64_t payload_at = wire::OnePiecePayloadOffset();
  const std::uint64_t seg = std::uint64_t{2} << 20;
  const std::vector<std::uint64_t> offsets = {100, payload_at, seg - 1, seg, 2 * seg + 5, cost - 9, cost - 8, cost - 1};
  for (const bool restart : {false, true}) {
    for (const std::uint64_t at : offsets) {
      auto t = Open();
      ASSERT_TRUE(t->Put(c).ok());
      ExpectIntact(*t, 1, dim);
      if (restart) t = nullptr;
      {
        std::fstream f(ObjectFile(1), std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(static_cast<std::streamoff>(at));
        const char b = static_cast<char>(f.get());
        f.seekp(static_cast<std::streamoff>(at));
        f.put(static_cast<char>(b ^ 0x10));
      }
      if (restart) t = Open();
      ExpectCorruptMiss(*t, 1, "byte " + std::to_string(at) + (restart ? " after a restart" : ""));
    }
    auto t = Open();
    ASSERT_TRUE(t->Put(c).ok());
    if (restart) t = nullptr;
    fs::resize_file(ObjectFile(1), cost - 4096);
    if (restart) t = Open();
    ExpectCorruptMiss(*t, 1, std::string("cut") + (restart ? " after a restart" : ""));
  }
}

// Reads and writes reuse the tier's aligned buffers: objects of sizes from
// a few bytes to several MiB (written in segments while being copied), put
// and read back in mixed orders, with the chunks read earlier still alive
// (their payloads live in buffers that must not be handed out again), and
// kept alive past the tier itself. With no buffers kept, a few, or many.
TEST_F(DiskTierTest, BuffersAreReusedAcrossObjectsOfDifferentSizes) {
  // Payloads of 8 x head_dim bytes: 8 B to 5.6 MB, on and off block and segment bounds.
  const std::vector<std::uint32_t> dims = {1, 700000, 3, 131072, 524288, 1000, 524800, 262144 + 1, 5};
  for (const std::uint64_t keep : {std::uint64_t{0}, std::uint64_t{64} << 10, std::uint64_t{128} << 20}) {
    fs::remove_all(dir_);
    DiskTierOptions o = Options();
    o.io_buffer_cache_bytes = keep;
    auto t = Open(o);
    for (size_t i = 0; i < dims.size(); ++i) ASSERT_TRUE(t->Put(MakeChunk(static_cast<int>(i), dims[i])).ok()) << i;
    std::vector<ChunkRef> held;
    for (size_t i = dims.size(); i-- > 0;) {  // largest and smallest interleaved, all held
      Result<ChunkRef> got = t->Get(KeyOf(static_cast<int>(i)));
      ASSERT_TRUE(got.ok()) << got.status().message();
      held.push_back(*got);
    }
    for (size_t i = 0; i < dims.size(); ++i) {
      EXPECT_TRUE(SameChunk(*held[dims.size() - 1 - i], *MakeChunk(static_cast<int>(i), dims[i]))) << i << " kept " << keep;
    }
    // Released and read again, each dropped at once: buffers come back and go out again.
    held.resize(2);
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < dims.size(); ++i) ExpectIntact(*t, static_cast<int>(i), dims[i]);
    }
    // Puts reuse what Gets gave back.
    for (size_t i = 0; i < dims.size(); ++i) {
      ASSERT_TRUE(t->Put(MakeChunk(100 + static_cast<int>(i), dims[dims.size() - 1 - i])).ok());
    }
    t.reset();  // the held chunks outlive the tier
    EXPECT_TRUE(SameChunk(*held[0], *MakeChunk(static_cast<int>(dims.size() - 1), dims.back())));
    EXPECT_TRUE(SameChunk(*held[1], *MakeChunk(static_cast<int>(dims.size() - 2), dims[dims.size() - 2])));
    held.clear();
    // After a restart (sizes known only from the files): all intact, file sizes exact.
    t = Open(o);
    for (size_t i = 0; i < dims.size(); ++i) {
      ExpectIntact(*t, static_cast<int>(i), dims[i]);
      ExpectIntact(*t, 100 + static_cast<int>(i), dims[dims.size() - 1 - i]);
      EXPECT_EQ(fs::file_size(ObjectFile(static_cast<int>(i))), t->Cost(*MakeChunk(0, dims[i])));
    }
    EXPECT_EQ(FilesIn(Tmp()), 0u);
    EXPECT_EQ(t->counters().corrupt_detected, 0u);
    EXPECT_EQ(t->counters().io_errors, 0u);
    t.reset();
  }
}

// Large objects written and read by several threads at once: each write in
// its own buffer and its own queue of writes; every object whole.
TEST_F(DiskTierTest, ConcurrentLargePutsAndGetsStayWhole) {
  auto t = Open();
  constexpr int kThreads = 4, kPerThread = 3;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  std::barrier start(kThreads);
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      start.arrive_and_wait();
      for (int k = 0; k < kPerThread; ++k) {
        const int i = th * kPerThread + k;
        const std::uint32_t dim = 520000 + 4099 * static_cast<std::uint32_t>(i);  // ~4.2-4.4 MB, all different
        if (!t->Put(MakeChunk(i, dim)).ok()) ++wrong;
        Result<ChunkRef> got = t->Get(KeyOf(i));
        if (!got.ok() || !SameChunk(**got, *MakeChunk(i, dim))) ++wrong;
        // Another thread's object, possibly being written: whole or a miss.
        const int j = ((th + 1) % kThreads) * kPerThread + k;
        Result<ChunkRef> other = t->Get(KeyOf(j));
        if (other.ok() && !SameChunk(**other, *MakeChunk(j, 520000 + 4099 * static_cast<std::uint32_t>(j)))) ++wrong;
        if (!other.ok() && other.status().code() != Code::kNotFound) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(t->objects(), static_cast<std::uint64_t>(kThreads * kPerThread));
  EXPECT_EQ(t->counters().corrupt_detected, 0u);
  EXPECT_EQ(FilesIn(Tmp()), 0u);
}

// No tier lock is held across disk I/O: while one Get waits inside its
// open of an object file (held there by the test), Puts, Gets, Erases and
// lookups of other objects on another thread all complete. (The held Get
// is let go when they are done, or after a minute, which fails the test:
// a guard against a hang, not a timing.)
TEST_F(DiskTierTest, AGetWaitingOnTheDiskHoldsUpNoOtherCall) {
  DiskTierOptions o = Options();
  std::mutex m;
  std::condition_variable cv;
  bool inside = false, release = false, timed_out = false;
  const std::string held_path = ObjectFile(1).string();
  o.open_file = [&](const std::string& path, int flags) {
    if (path == held_path) {
      std::unique_lock<std::mutex> lock(m);
      inside = true;
      cv.notify_all();
      if (!cv.wait_for(lock, std::chrono::minutes(1), [&] { return release; })) timed_out = true;
    }
    return ::open(path.c_str(), flags);
  };
  auto t = Open(o);
  ASSERT_TRUE(t->Put(MakeChunk(1, 3000)).ok());
  ASSERT_TRUE(t->Put(MakeChunk(2, 3000)).ok());
  std::thread reader([&] { ExpectIntact(*t, 1, 3000); });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return inside; });
  }
  std::thread others([&] {
    EXPECT_TRUE(t->Put(MakeChunk(3, 600000)).ok());  // a large one: written in segments
    EXPECT_TRUE(t->Put(MakeChunk(4, 10)).ok());
    ExpectIntact(*t, 2, 3000);
    ExpectIntact(*t, 3, 600000);
    EXPECT_TRUE(t->Contains(KeyOf(1)));
    EXPECT_TRUE(t->Erase(KeyOf(4)));
    EXPECT_EQ(t->objects(), 3u);
    std::lock_guard<std::mutex> lock(m);
    release = true;
    cv.notify_all();
  });
  others.join();
  reader.join();
  EXPECT_FALSE(timed_out) << "calls waited for a Get's disk I/O";
}

// Flips one byte of a stored file at every offset of the header, at many
// of the payload, and at the end: every read is a miss, counted, and the
// object is gone. (Syncs off: this test writes hundreds of objects.)
TEST_F(DiskTierTest, AFlippedByteAnywhereIsAMissNeverWrongBytes) {
  DiskTierOptions o = Options();
  o.fsync = FsyncPolicy::kNone;
  auto t = Open(o);
  const ChunkRef c = MakeChunk(5, 250);  // 2000 bytes of payload
  const std::uint64_t size = t->Cost(*c);
  std::vector<std::uint64_t> offsets;
  for (std::uint64_t off = 0; off < size - c->payload.size(); ++off) offsets.push_back(off);  // header
  for (std::uint64_t off = size - c->payload.size(); off < size; off += 37) offsets.push_back(off);  // payload
  for (std::uint64_t off = size - 8; off < size; ++off) offsets.push_back(off);  // end
  int misses = 0;
  for (std::uint64_t off : offsets) {
    ASSERT_TRUE(t->Put(c).ok());
    const int fd = ::open(ObjectFile(5).c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::uint8_t b;
    ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(off)), 1);
    b ^= static_cast<std::uint8_t>(1u << (off % 8));
    ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(off)), 1);
    ::close(fd);
    ExpectCorruptMiss(*t, 5, "flip at " + std::to_string(off));
    misses += t->Contains(KeyOf(5)) ? 0 : 1;
  }
  EXPECT_EQ(misses, static_cast<int>(offsets.size()));
  EXPECT_EQ(t->counters().corrupt_detected, offsets.size());
  EXPECT_EQ(t->used_bytes(), 0u);
  EXPECT_EQ(FilesIn(Objects()), 0u);
}

TEST_F(DiskTierTest, TruncatedAndExtendedFilesAreMisses) {
  auto t = Open();
  const ChunkRef c = MakeChunk(7, 600);
  const std::uint64_t size = t->Cost(*c);
  const std::vector<std::uint64_t> lengths = {0, 1, 7, 8, 16, 100, size / 2, size - 8, size - 1};
  for (std::uint64_t len : lengths) {
    ASSERT_TRUE(t->Put(c).ok());
    fs::resize_file(ObjectFile(7), len);
    ExpectCorruptMiss(*t, 7, "truncated to " + std::to_string(len));
  }
  for (std::uint64_t extra : {1u, 8u, 4096u}) {
    ASSERT_TRUE(t->Put(c).ok());
    fs::resize_file(ObjectFile(7), size + extra);
    ExpectCorruptMiss(*t, 7, "extended by " + std::to_string(extra));
  }
  EXPECT_EQ(t->counters().corrupt_detected, lengths.size() + 3);
  EXPECT_EQ(t->used_bytes(), 0u);
}

TEST_F(DiskTierTest, SwappedFilesAreMisses) {
  auto t = Open();
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  ASSERT_TRUE(t->Put(MakeChunk(2)).ok());
  ASSERT_TRUE(t->Put(MakeChunk(3)).ok());
  const fs::path aside = fs::path(dir_) / "aside";
  fs::rename(ObjectFile(1), aside);
  fs::rename(ObjectFile(2), ObjectFile(1));
  fs::rename(aside, ObjectFile(2));
  ExpectCorruptMiss(*t, 1, "1 holds 2");
  ExpectCorruptMiss(*t, 2, "2 holds 1");
  ExpectIntact(*t, 3);
  EXPECT_EQ(t->counters().corrupt_detected, 2u);
  EXPECT_EQ(t->used_bytes(), t->Cost(*MakeChunk(3)));
}

TEST_F(DiskTierTest, AFileDeletedBehindTheTiersBackIsAMiss) {
  auto t = Open();
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  fs::remove(ObjectFile(1));
  ExpectCorruptMiss(*t, 1, "deleted");
  EXPECT_EQ(t->used_bytes(), 0u);
}

TEST_F(DiskTierTest, CorruptionFoundAfterARestartIsAMiss) {
  {
    auto t = Open();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(t->Put(MakeChunk(i)).ok());
  }
  fs::resize_file(ObjectFile(0), 40);
  {
    std::fstream f(ObjectFile(1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(300);
    f.put('\x55');
  }
  auto t = Open();
  EXPECT_EQ(t->objects(), 3u);  // Open reads no object: found at first read
  ExpectCorruptMiss(*t, 0, "truncated while closed");
  ExpectCorruptMiss(*t, 1, "flipped while closed");
  ExpectIntact(*t, 2);
  EXPECT_EQ(t->used_bytes(), t->Cost(*MakeChunk(2)));
}

TEST_F(DiskTierTest, FilesThatAreNotObjectsAreLeftAlone) {
  {
    auto t = Open();
    ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  }
  const std::string hex = keys::ToHex(KeyOf(1));
  fs::create_directories(Objects() / "ab");
  std::ofstream(Objects() / "ab" / "notes.txt") << "not an object";
  std::ofstream(Objects() / "zz") << "not a shard";
  // A valid name in the wrong shard.
  const fs::path wrong_shard = Objects() / (hex.substr(0, 2) == "00" ? "01" : "00");
  fs::create_directories(wrong_shard);
  fs::copy_file(ObjectFile(1), wrong_shard / (hex + ".kdn"));
  std::ofstream(Objects() / "0f") << "a file where a shard would be";
  auto t = Open();
  EXPECT_EQ(t->objects(), 1u);
  EXPECT_EQ(t->used_bytes(), t->Cost(*MakeChunk(1)));
  EXPECT_TRUE(fs::exists(Objects() / "ab" / "notes.txt"));
  ExpectIntact(*t, 1);
}

}  // namespace
}  // namespace kdn::store
