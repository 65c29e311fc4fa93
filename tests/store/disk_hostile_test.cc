// SPDX-License-Identifier: Apache-2.0
// The disk tier under hostile use of its directory (issue 10, items 4-6 and
// the smaller ones): non-regular files in place of objects, a tmp/ holding
// files that are not kdn's or pointing elsewhere, objects grown to absurd
// sizes, NUL bytes in paths, and forked children. Every test is bounded in
// time (a would-be hang is broken from outside and reported as a failure)
// and in memory (absurd reads run in a child under RLIMIT_AS).
#include "core/tiers/disk_tier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <thread>

#include "disk_test_util.h"
#include "kdn/kdn.h"

namespace kdn::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using namespace disk_test;

// The process's virtual memory size in bytes (/proc/self/statm, first field).
std::uint64_t VirtualBytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
}

class DiskHostileTest : public DiskTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdn-disk-hostile-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/cache";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Get(KeyOf(i)) in a thread, given `limit` to return; a Get still blocked
  // then is unblocked by opening `fifo` for writing (EOF for the reader) and
  // reported as a hang.
  Result<ChunkRef> GetWithin(DiskTier& t, int i, const fs::path& fifo, std::chrono::seconds limit, bool* hung) {
    std::packaged_task<Result<ChunkRef>()> task([&t, i] { return t.Get(KeyOf(i)); });
    std::future<Result<ChunkRef>> done = task.get_future();
    std::thread reader(std::move(task));
    *hung = done.wait_for(limit) != std::future_status::ready;
    while (done.wait_for(50ms) != std::future_status::ready) {
      const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (w >= 0) ::close(w);
    }
    reader.join();
    return done.get();
  }

  // Runs Get(KeyOf(i)) in a forked child whose address space may grow by
  // at most `headroom` bytes: it exits 0 if the Get was a miss counted as
  // corrupt, 2 if it returned an object, 3 if it returned another error
  // (out of memory: it tried to read the file whole).
  int GetInBoundedChild(DiskTier& t, int i, std::uint64_t headroom) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      const rlimit lim{VirtualBytes() + headroom, VirtualBytes() + headroom};
      if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(4);
      const std::uint64_t corrupt_before = t.counters().corrupt_detected;
      Result<ChunkRef> got = t.Get(KeyOf(i));
      if (got.ok()) ::_exit(2);
      if (got.status().code() != Code::kNotFound) {
        std::fprintf(stderr, "child: %s\n", got.status().message().c_str());
        ::_exit(3);
      }
      ::_exit(t.counters().corrupt_detected == corrupt_before + 1 && !t.Contains(KeyOf(i)) ? 0 : 5);
    }
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
  }

  std::string root_;
};

// Item 4: a FIFO put in place of an object file made a read block forever
// (an open for reading waits for a writer). It is a miss, counted as
// corrupt and removed, at once; so is any other non-regular file.
TEST_F(DiskHostileTest, AFifoInPlaceOfAnObjectIsAMissNotAHang) {
  for (bool odirect : {true, false}) {
    SCOPED_TRACE(odirect ? "O_DIRECT" : "buffered");
    fs::remove_all(dir_);
    DiskTierOptions o = Options();
    o.use_odirect = odirect;
    auto t = Open(o);
    ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
    ASSERT_TRUE(t->Put(MakeChunk(2)).ok());
    ASSERT_EQ(::unlink(ObjectFile(1).c_str()), 0);
    ASSERT_EQ(::mkfifo(ObjectFile(1).c_str(), 0644), 0);
    bool hung = false;
    Result<ChunkRef> got = GetWithin(*t, 1, ObjectFile(1), 5s, &hung);
    EXPECT_FALSE(hung) << "Get blocked on a FIFO";
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), Code::kNotFound) << got.status().message();
    EXPECT_EQ(t->counters().corrupt_detected, 1u);
    EXPECT_FALSE(t->Contains(KeyOf(1)));
    EXPECT_FALSE(fs::exists(fs::symlink_status(ObjectFile(1))));
    EXPECT_EQ(t->odirect_active(), odirect);  // a FIFO refusing O_DIRECT says nothing of the filesystem
    ExpectIntact(*t, 2);
  }
}

// The same after a restart: a FIFO (or a symlink) named like an object is
// never indexed, and is removed (the name is kdn's); a directory is left.
TEST_F(DiskHostileTest, NonRegularObjectFilesFoundAtOpenAreNotIndexed) {
  {
    auto t = Open();
    for (int i = 1; i <= 4; ++i) ASSERT_TRUE(t->Put(MakeChunk(i)).ok());
  }
  const fs::path outside = fs::path(root_) / "outside";
  std::ofstream(outside) << "precious";
  ASSERT_EQ(::unlink(ObjectFile(1).c_str()), 0);
  ASSERT_EQ(::mkfifo(ObjectFile(1).c_str(), 0644), 0);
  fs::remove(ObjectFile(2));
  fs::create_symlink(outside, ObjectFile(2));
  fs::remove(ObjectFile(3));
  fs::create_directory(ObjectFile(3));
  auto t = Open();
  EXPECT_EQ(t->objects(), 1u);
  EXPECT_FALSE(fs::exists(fs::symlink_status(ObjectFile(1))));
  EXPECT_FALSE(fs::exists(fs::symlink_status(ObjectFile(2))));
  EXPECT_TRUE(fs::is_directory(ObjectFile(3)));
  EXPECT_TRUE(fs::exists(outside));
  ExpectIntact(*t, 4);
}

// Item 5: Open deleted every file in tmp/. It deletes only regular files
// named as kdn names its temp files (<pid>-<n>.tmp).
TEST_F(DiskHostileTest, OnlyKdnTempFilesAreRemovedAtOpen) {
  { auto t = Open(); }
  const fs::path outside = fs::path(root_) / "outside.txt";
  std::ofstream(outside) << "precious";
  std::ofstream(Tmp() / "123-0.tmp") << "a crashed write";
  std::ofstream(Tmp() / "notes.txt") << "someone's file";
  std::ofstream(Tmp() / "123-0.tmp.keep") << "someone's file";
  std::ofstream(Tmp() / "x123-0.tmp") << "someone's file";
  std::ofstream(Tmp() / "-0.tmp") << "someone's file";
  std::ofstream(Tmp() / ".tmp") << "someone's file";
  fs::create_directory(Tmp() / "77-1.tmp");
  fs::create_symlink(outside, Tmp() / "77-2.tmp");
  ASSERT_EQ(::mkfifo((Tmp() / "77-3.tmp").c_str(), 0644), 0);
  auto t = Open();
  EXPECT_EQ(t->stale_temp_files_removed(), 1u);
  EXPECT_FALSE(fs::exists(Tmp() / "123-0.tmp"));
  for (const char* kept : {"notes.txt", "123-0.tmp.keep", "x123-0.tmp", "-0.tmp", ".tmp", "77-1.tmp", "77-2.tmp",
                           "77-3.tmp"}) {
    EXPECT_TRUE(fs::exists(fs::symlink_status(Tmp() / kept))) << kept;
  }
  EXPECT_TRUE(fs::exists(outside));
  ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  ExpectIntact(*t, 1);
}

// Item 5: a tmp/ that is a symlink took Open's deletes out of the cache
// directory. It is refused, and nothing outside is touched.
TEST_F(DiskHostileTest, ATmpSymlinkIsRefused) {
  const fs::path elsewhere = fs::path(root_) / "elsewhere";
  fs::create_directories(elsewhere);
  std::ofstream(elsewhere / "1-1.tmp") << "precious";
  std::ofstream(elsewhere / "data.bin") << "precious";
  fs::create_directories(dir_);
  fs::create_directory_symlink(elsewhere, Tmp());
  Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(Options());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_NE(t.status().message().find("symbolic link"), std::string::npos) << t.status().message();
  EXPECT_TRUE(fs::exists(elsewhere / "1-1.tmp"));
  EXPECT_TRUE(fs::exists(elsewhere / "data.bin"));
}

// Item 6: three object files grown to 1 GiB (sparse) made the trim at open
// delete every valid object first (the grown files were the newest). Only
// the invalid ones go.
TEST_F(DiskHostileTest, GrownObjectsAreDroppedAtOpenNotTheValidOnes) {
  std::uint64_t cost = 0;
  ASSERT_NO_FATAL_FAILURE(PutDatedObjects(10, &cost));
  for (int i : {7, 8, 9}) fs::resize_file(ObjectFile(i), std::uint64_t{1} << 30);
  auto t = Open((std::uint64_t{2} << 30) + 20 * cost);  // room for the valid ones, not for all
  EXPECT_EQ(t->objects(), 7u);
  EXPECT_EQ(t->objects_trimmed_at_open(), 0u);
  EXPECT_EQ(t->counters().corrupt_detected, 3u);
  EXPECT_EQ(t->used_bytes(), 7 * cost);
  for (int i = 0; i < 7; ++i) ExpectIntact(*t, i);
  for (int i : {7, 8, 9}) EXPECT_FALSE(fs::exists(ObjectFile(i))) << i;
}

// Item 6: a 4 GiB sparse object was read whole into memory before it was
// rejected. Larger than max_object_bytes (1 GiB by default), it is removed
// at Open by its size alone. Where the limit allows it, it is rejected at
// Get from its size and header alone: each read runs in a child whose
// address space may grow by 256 MiB at most.
TEST_F(DiskHostileTest, AHugeSparseObjectIsRejectedWithoutReadingIt) {
  const std::uint64_t huge = std::uint64_t{4} << 30;
  {
    auto t = Open();
    ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  }
  fs::resize_file(ObjectFile(1), huge);  // grown while closed
  {
    auto t = Open(std::uint64_t{1} << 40);  // fits the capacity, not the largest object
    EXPECT_FALSE(t->Contains(KeyOf(1)));
    EXPECT_EQ(t->counters().corrupt_detected, 1u);
    EXPECT_FALSE(fs::exists(ObjectFile(1)));
    ASSERT_TRUE(t->Put(MakeChunk(1)).ok());
  }
  fs::resize_file(ObjectFile(1), huge);
  DiskTierOptions o = Options(std::uint64_t{1} << 40);
  o.max_object_bytes = o.capacity_bytes;  // no limit but the capacity
  auto t = Open(o);
  ASSERT_TRUE(t->Contains(KeyOf(1)));  // Open reads no object while they fit
  EXPECT_EQ(GetInBoundedChild(*t, 1, 256 << 20), 0);
  // Grown while open.
  ASSERT_TRUE(t->Put(MakeChunk(2)).ok());
  fs::resize_file(ObjectFile(2), huge);
  EXPECT_EQ(GetInBoundedChild(*t, 2, 256 << 20), 0);
  // Grown while open, with a header that claims the huge size.
  ASSERT_TRUE(t->Put(MakeChunk(3)).ok());
  {
    const std::uint32_t table[2] = {0, static_cast<std::uint32_t>((huge - 8) / 8)};
    std::fstream f(ObjectFile(3), std::ios::in | std::ios::out | std::ios::binary);
    f.write(reinterpret_cast<const char*>(table), sizeof table);
  }
  fs::resize_file(ObjectFile(3), huge);
  EXPECT_EQ(GetInBoundedChild(*t, 3, 256 << 20), 0);
  ASSERT_TRUE(t->Put(MakeChunk(4)).ok());
  ExpectIntact(*t, 4);
}

// max_object_bytes: Put refuses a larger object (it could never be read).
TEST_F(DiskHostileTest, PutRefusesObjectsLargerThanTheLargestObject) {
  DiskTierOptions o = Options();
  auto probe = Open(o);
  const std::uint64_t cost = probe->Cost(*MakeChunk(1));
  probe.reset();
  o.max_object_bytes = cost - 1;
  auto t = Open(o);
  EXPECT_EQ(t->Put(MakeChunk(1)).code(), Code::kInvalidArgument);
  EXPECT_EQ(t->used_bytes(), 0u);
  o.max_object_bytes = 0;
  t.reset();
  EXPECT_EQ(DiskTier::Open(o).status().code(), Code::kInvalidArgument);
}

// Smaller: a directory with a NUL byte created a directory named by the
// part before it.
TEST_F(DiskHostileTest, ADirectoryWithANulByteIsRefused) {
  DiskTierOptions o = Options();
  o.directory = root_ + "/before" + std::string(1, '\0') + "after";
  Result<std::unique_ptr<DiskTier>> t = DiskTier::Open(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(fs::exists(fs::path(root_) / "before"));
}

// Smaller: a forked child that never calls kdn kept the directory's lock
// (flock locks belong to the open file, which fork shares): after the
// parent closed the tier, no process could open the directory while the
// child lived. Without exec, and with exec.
TEST_F(DiskHostileTest, AForkedChildDoesNotHoldTheDirectoryLock) {
  for (bool exec : {false, true}) {
    SCOPED_TRACE(exec ? "fork + exec" : "fork alone");
    auto t = Open();
    int release[2];
    ASSERT_EQ(::pipe(release), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(release[1]);
      if (exec) {
        // sleep's stdin is the pipe's read end: it exits when killed.
        ::dup2(release[0], 0);
        ::execl("/bin/sleep", "sleep", "30", static_cast<char*>(nullptr));
        ::_exit(127);
      }
      char c;
      while (::read(release[0], &c, 1) < 0) {
      }
      ::_exit(0);
    }
    ASSERT_GT(pid, 0);
    ::close(release[0]);
    std::this_thread::sleep_for(100ms);  // the child has exec'd (or not)
    t.reset();
    Result<std::unique_ptr<DiskTier>> again = DiskTier::Open(Options());
    EXPECT_TRUE(again.ok()) << again.status().message();
    ::close(release[1]);
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
}

// Smaller, through the C ABI: a NUL byte in a disk tier's path (the file
// system would see the part before it) or in a doc id is refused, with a
// message, and creates nothing.
TEST_F(DiskHostileTest, TheCAbiRefusesNulBytesInDiskPathsAndDocIds) {
  const std::string path = root_ + "/before" + std::string(1, '\0') + "after";
  kdn_tier_config tier = KDN_TIER_CONFIG_INIT;
  tier.kind = KDN_TIER_DISK;
  tier.capacity_bytes = 1 << 26;
  tier.path = path.data();
  tier.path_len = path.size();
  tier.codec = "raw";
  tier.codec_len = 3;
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  options.tiers = &tier;
  options.num_tiers = 1;
  kdn_runtime* rt = nullptr;
  EXPECT_EQ(kdn_runtime_create(&options, &rt), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("NUL"), std::string::npos) << kdn_last_error_message();
  EXPECT_FALSE(fs::exists(fs::path(root_) / "before"));
  kdn_runtime_destroy(rt);

  ASSERT_EQ(kdn_runtime_create(nullptr, &rt), KDN_OK) << kdn_last_error_message();
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = 1;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.fingerprint = "disk-hostile";
  spec.fingerprint_len = 12;
  kdn_model* model = nullptr;
  ASSERT_EQ(kdn_model_create(rt, &spec, &model), KDN_OK) << kdn_last_error_message();
  const char doc[] = {'a', '\0', 'b'};
  EXPECT_EQ(kdn_knowledge_delete(model, "ns", 2, doc, sizeof doc), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("NUL"), std::string::npos) << kdn_last_error_message();
  EXPECT_EQ(kdn_knowledge_delete(model, "ns", 2, "ab", 2), KDN_ERR_NOT_FOUND) << kdn_last_error_message();
  kdn_model_destroy(model);
  kdn_runtime_destroy(rt);
}

}  // namespace
}  // namespace kdn::store
