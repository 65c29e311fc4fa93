// SPDX-License-Identifier: Apache-2.0
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
#include "test_models.h"

namespace {

namespace fs = std::filesystem;

using kdn::testing::CliRun;

CliRun Kdn(const std::string& args) {
  return kdn::testing::RunShell("KDN_MODELS=" + kdn::testing::ModelsDir() + " " + std::string(KDN_CLI) + " " + args +
                                " 2>&1");
}

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
// tier's policy, and both sides say what they promised and how they did I/O;
// key hashing and host gets name their baselines.
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
  // Key hashing beside both of its baselines (SHA-256 of the same bytes in
  // one stream, and one digest per chunk); the host get beside memcpy with
  // the alignments it states.
  for (const auto& [name, baseline] : std::vector<std::pair<std::string, std::string>>{
           {"key_hash_gbps", "raw_sha256_gbps"},
           {"key_hash_chunkwise_gbps", "raw_sha256_chunkwise_gbps"},
           {"host_get_gbps_ref", "memcpy_gbps"}}) {
    ASSERT_TRUE(by_name.count(name)) << "missing " << name << "\n" << r.out;
    const nlohmann::json& rec = by_name[name];
    EXPECT_EQ(rec.at("baseline"), baseline) << name;
    EXPECT_GT(rec.at("value").get<double>(), 0.0) << name;
    EXPECT_GT(rec.at("baseline_value").get<double>(), 0.0) << name;
  }
  EXPECT_EQ(by_name["key_hash_gbps"].at("value"), by_name["key_hash_chunkwise_gbps"].at("value"))
      << "one measure of the keys, two baselines";
  EXPECT_NE(by_name["host_get_gbps_ref"].at("params").at("buffers").get<std::string>().find("64-byte aligned"),
            std::string::npos);
}

// Effective delivery from disk: the reference model's real KV (f16, 256-token
// chunks) delivered by a disk-only store keeping it as kdn:balanced, against
// one keeping it raw, each from a cold page cache, with the measures that say
// what limits it beside.
TEST_F(StoreBench, DiskDeliveryRecordsFromRealKv) {
  KDN_REQUIRE_MODEL();
  const bool memory = OnMemoryFs(dir_);
  CliRun r;
  const nlohmann::json records = Run(dir_, memory ? "--allow-memory-fs" : "", &r);
  ASSERT_EQ(r.code, 0) << r.out;
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& rec : records) by_name[rec.at("name").get<std::string>()] = rec;
  for (const char* name : {"disk_delivery_gbps_raw", "disk_delivery_gbps_kdn", "disk_delivery_concurrent_gbps_raw",
                           "disk_delivery_concurrent_gbps_kdn", "disk_delivery_file_read_gbps_raw",
                           "disk_delivery_file_read_gbps_kdn", "disk_delivery_decode_gbps_kdn"}) {
    ASSERT_TRUE(by_name.count(name)) << "missing " << name << "\n" << r.out;
    EXPECT_GT(by_name[name].at("value").get<double>(), 0.0) << name;
  }
  const nlohmann::json& kdn = by_name["disk_delivery_gbps_kdn"];
  const nlohmann::json& raw = by_name["disk_delivery_gbps_raw"];
  EXPECT_EQ(kdn.at("baseline"), "disk_delivery_gbps_raw");
  EXPECT_EQ(kdn.at("baseline_value").get<double>(), raw.at("value").get<double>());
  EXPECT_NEAR(kdn.at("ratio").get<double>(), kdn.at("value").get<double>() / raw.at("value").get<double>(), 1e-9);
  EXPECT_EQ(kdn.at("params").at("goal"), ">= 2");
  // Decode seconds summed over the threads that decode: up to fetch_threads
  // per second of delivery.
  const double share = kdn.at("params").at("decode_s_per_delivery_s").get<double>();
  EXPECT_GT(share, 0.0);
  EXPECT_LE(share, kdn.at("params").at("fetch_threads").get<double>());
  const nlohmann::json& kp = kdn.at("params");
  const nlohmann::json& rp = raw.at("params");
  EXPECT_EQ(kp.at("callers").get<int>(), 1);
  EXPECT_GE(kp.at("fetch_threads").get<int>(), 1);
  // The same windows to several callers at once, against raw the same way.
  const nlohmann::json& kc = by_name["disk_delivery_concurrent_gbps_kdn"];
  const nlohmann::json& rc = by_name["disk_delivery_concurrent_gbps_raw"];
  EXPECT_EQ(kc.at("baseline"), "disk_delivery_concurrent_gbps_raw");
  EXPECT_EQ(kc.at("baseline_value").get<double>(), rc.at("value").get<double>());
  EXPECT_EQ(kc.at("params").at("goal"), ">= 2");
  EXPECT_GT(kc.at("params").at("callers").get<int>(), 1);
  EXPECT_EQ(kc.at("params").at("callers"), rc.at("params").at("callers"));
  EXPECT_EQ(kp.at("codec"), "kdn:balanced");
  EXPECT_EQ(rp.at("codec"), "raw");
  for (const nlohmann::json* p : {&kp, &rp}) {
    EXPECT_EQ(p->at("dtype"), "f16");
    EXPECT_EQ(p->at("chunk_tokens").get<int>(), 256);
    EXPECT_EQ(p->at("chunks").get<int>(), 16);  // --quick
    EXPECT_EQ(p->at("model"), "stories260K");
    EXPECT_EQ(p->at("text"), "bench/texts/heldout.txt");
    EXPECT_EQ(p->at("memory_fs"), memory);
    EXPECT_TRUE(p->at("tier").at("read_odirect").is_boolean());
    EXPECT_EQ(p->at("tier").at("fsync"), "data");
    const nlohmann::json& pc = p->at("page_cache");
    EXPECT_TRUE(pc.at("cold_by").is_string());
    EXPECT_EQ(pc.at("dropped"), true);
    // Cold: on a disk the dropped pages are gone (a memory filesystem keeps them).
    if (!memory) {
      EXPECT_LT(pc.at("resident_fraction_before_read_max").get<double>(), 0.5);
    }
  }
  // The same KV on both sides; kdn:balanced keeps it in fewer bytes, raw in
  // a little more (the envelope).
  EXPECT_EQ(kp.at("kv_bytes"), rp.at("kv_bytes"));
  // stories260K: 5 layers x (K + V) x 4 KV heads x 8 dims x 2 bytes per token.
  EXPECT_EQ(kp.at("kv_bytes").get<std::uint64_t>(), 16u * 256u * 640u);
  EXPECT_GE(rp.at("file_bytes").get<std::uint64_t>(), rp.at("kv_bytes").get<std::uint64_t>());
  EXPECT_GT(kp.at("stored_ratio").get<double>(), 2.0);
  EXPECT_LT(rp.at("stored_ratio").get<double>(), 1.0);
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
