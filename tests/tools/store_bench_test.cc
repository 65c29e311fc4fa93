// `kdn bench store --quick`, run as a user runs it: the disk records state
// both sides' durability and whether O_DIRECT was in effect, every record
// names the scratch filesystem, and a memory filesystem is refused unless
// allowed. Timings are only checked to be positive, never against a threshold.
#include <gtest/gtest.h>

#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"

namespace {

namespace fs = std::filesystem;

using kdn::testing::CliRun;

CliRun Kdn(const std::string& args) { return kdn::testing::RunShell(std::string(KDN_CLI) + " " + args + " 2>&1"); }

bool OnMemoryFs(const fs::path& dir) {
  struct statfs st;
  return ::statfs(dir.c_str(), &st) == 0 && (st.f_type == TMPFS_MAGIC || st.f_type == RAMFS_MAGIC);
}

class StoreBench : public ::testing::Test {
 protected:
  void SetUp() override {
    // The working directory ctest gives (the build tree): a disk, usually.
    dir_ = fs::current_path() / ("kdn_store_bench_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs the quick bench with scratch in `scratch`; the records by name (the
  // last of each name) and all of them.
  nlohmann::json Run(const fs::path& scratch, const std::string& extra, CliRun* r) {
    const fs::path json = dir_ / "store.json";
    fs::remove(json);
    *r = Kdn("bench store --quick --json " + json.string() + " --dir " + scratch.string() + " " + extra);
    if (r->code != 0 || !fs::exists(json)) return nlohmann::json::array();
    std::ifstream in(json);
    return nlohmann::json::parse(in);
  }

  fs::path dir_;
};

// Each disk measure's baseline does the tier's per-object work under the
// tier's policy, and both sides say what they promised and how they did I/O.
TEST_F(StoreBench, DiskRecordsStateDurabilityAndODirect) {
  const bool memory = OnMemoryFs(dir_);
  CliRun r;
  const nlohmann::json records = Run(dir_, memory ? "--allow-memory-fs" : "", &r);
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(records.is_array());
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& rec : records) {
    by_name[rec.at("name").get<std::string>()] = rec;
    const nlohmann::json& p = rec.at("params");
    ASSERT_TRUE(p.contains("scratch_fs")) << rec.dump();
    EXPECT_TRUE(p.at("scratch_fs").is_string()) << rec.dump();
    EXPECT_EQ(p.at("memory_fs"), memory) << rec.dump();
  }
  for (const char* shape : {"8b", "ref"}) {
    for (const char* op : {"write", "read"}) {
      const std::string name = std::string("disk_") + op + "_gbps_" + shape;
      ASSERT_TRUE(by_name.count(name)) << "missing " << name << "\n" << r.out;
      const nlohmann::json& rec = by_name[name];
      EXPECT_EQ(rec.at("baseline"), std::string("raw_disk_") + op + "_gbps") << name;
      EXPECT_GT(rec.at("value").get<double>(), 0.0) << name;
      EXPECT_GT(rec.at("baseline_value").get<double>(), 0.0) << name;
      EXPECT_NEAR(rec.at("ratio").get<double>(), rec.at("value").get<double>() / rec.at("baseline_value").get<double>(),
                  1e-9)
          << name;
      const nlohmann::json& p = rec.at("params");
      // The same bytes per object: the tier's file, a little more than the chunk.
      EXPECT_GE(p.at("object_bytes").get<std::uint64_t>(), p.at("chunk_bytes").get<std::uint64_t>()) << name;
      for (const char* side : {"tier", "raw"}) {
        ASSERT_TRUE(p.contains(side)) << name << " " << p.dump();
        const nlohmann::json& s = p.at(side);
        EXPECT_TRUE(s.at("write_odirect").is_boolean()) << name << " " << side;
        EXPECT_TRUE(s.at("read_odirect").is_boolean()) << name << " " << side;
      }
      // The same durability on both sides: the tier's default (data synced
      // per object, before its rename).
      EXPECT_EQ(p.at("tier").at("fsync"), "data") << name;
      EXPECT_EQ(p.at("raw").at("fsync"), p.at("tier").at("fsync")) << name;
      EXPECT_EQ(p.at("raw").at("durability"), p.at("tier").at("durability")) << name;
      EXPECT_NE(p.at("tier").at("durability").get<std::string>().find("fdatasync, rename"), std::string::npos) << name;
      // Both read the same filesystem, so O_DIRECT reads work for both or neither.
      EXPECT_EQ(p.at("raw").at("read_odirect"), p.at("tier").at("read_odirect")) << name;
    }
    const std::string stream = std::string("raw_stream_write_gbps_") + shape;
    ASSERT_TRUE(by_name.count(stream)) << "missing " << stream;
    EXPECT_FALSE(by_name[stream].contains("baseline")) << "the stream is no baseline of the tier";
    EXPECT_TRUE(by_name[stream].at("params").at("write_odirect").is_boolean());
  }
}

// A memory filesystem is refused, saying why and what to do; allowed, it
// runs and every record says so.
TEST_F(StoreBench, MemoryFilesystemRefusedUnlessAllowed) {
  const fs::path shm = "/dev/shm";
  if (!fs::is_directory(shm) || !OnMemoryFs(shm) || ::access(shm.c_str(), W_OK) != 0) {
    GTEST_SKIP() << "no writable tmpfs at /dev/shm";
  }
  CliRun r;
  nlohmann::json records = Run(shm, "", &r);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("memory filesystem"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tmpfs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--allow-memory-fs"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "store.json"));

  records = Run(shm, "--allow-memory-fs", &r);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("WARNING"), std::string::npos) << r.out;
  ASSERT_FALSE(records.empty());
  for (const auto& rec : records) {
    EXPECT_EQ(rec.at("params").at("memory_fs"), true) << rec.dump();
    EXPECT_EQ(rec.at("params").at("scratch_fs"), "tmpfs") << rec.dump();
  }
}

}  // namespace
