// SPDX-License-Identifier: Apache-2.0
// The tiers' delivery limits (server/tier_limits.h): a real host tier's and
// a real disk tier's read rates are positive and finite and the disk's
// measurement leaves its directory as it found it; a kdnd measures its tiers
// at start when server.measure_tiers is on (the default) and reports the
// rates through the stats call and /metrics, and reports none when it is off.
#include "server/tier_limits.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "rpc_client.h"
#include "running_server.h"
#include "server/metrics.h"
#include "server/service.h"
#include "core/tiers/disk_tier.h"

namespace kdn::server {
namespace {

namespace fs = std::filesystem;
using namespace testing_support;

constexpr const char* kOpsToken = "token-for-operator-0003";

class TierLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kdn-tier-limits-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every path under `root`, files and directories.
  static std::set<std::string> Tree(const fs::path& root) {
    std::set<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root)) out.insert(e.path().string());
    return out;
  }

  fs::path dir_;
};

TEST_F(TierLimitsTest, AHostTierReadsAtAPositiveFiniteRate) {
  auto rate = MeasureTierLimit(store::TierSpec::Kind::kHost, "");
  ASSERT_TRUE(rate.ok()) << rate.status().message();
  EXPECT_GT(*rate, 0.0);
  EXPECT_TRUE(std::isfinite(*rate)) << *rate;
}

TEST_F(TierLimitsTest, ADiskTiersDirectoryIsMeasuredAndLeftAsItWas) {
  const fs::path tier_dir = dir_ / "disk";
  {
    store::DiskTierOptions o;
    o.directory = tier_dir.string();
    o.capacity_bytes = 64 << 20;
    auto tier = store::DiskTier::Open(o);
    ASSERT_TRUE(tier.ok()) << tier.status().message();
    const std::set<std::string> before = Tree(tier_dir);
    ASSERT_TRUE(before.count((tier_dir / "tmp").string())) << "the disk tier has no tmp/";
    // Measured while the tier holds its directory, as kdnd does.
    for (int i = 0; i < 2; ++i) {
      auto rate = MeasureTierLimit(store::TierSpec::Kind::kDisk, tier_dir.string());
      ASSERT_TRUE(rate.ok()) << rate.status().message();
      EXPECT_GT(*rate, 0.0);
      EXPECT_TRUE(std::isfinite(*rate)) << *rate;
    }
    EXPECT_EQ(Tree(tier_dir), before);
    EXPECT_TRUE(fs::is_empty(tier_dir / "tmp"));
  }
  // Reopened: no temp file of ours was there for it to clean up.
  store::DiskTierOptions o;
  o.directory = tier_dir.string();
  o.capacity_bytes = 64 << 20;
  auto again = store::DiskTier::Open(o);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*again)->stale_temp_files_removed(), 0u);
  EXPECT_EQ((*again)->objects(), 0u);
}

TEST_F(TierLimitsTest, ADirectoryNoDiskTierOpenedIsRefusedAndLeftAlone) {
  const std::set<std::string> before = Tree(dir_);
  auto rate = MeasureTierLimit(store::TierSpec::Kind::kDisk, dir_.string());
  ASSERT_FALSE(rate.ok());
  EXPECT_EQ(rate.status().code(), Code::kNotFound);
  EXPECT_NE(rate.status().message().find((dir_ / "tmp").string()), std::string::npos) << rate.status().message();
  EXPECT_EQ(Tree(dir_), before);

  auto empty = MeasureTierLimit(store::TierSpec::Kind::kDisk, "");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument);
}

TEST_F(TierLimitsTest, KindsNotMeasuredGiveZero) {
  for (auto kind : {store::TierSpec::Kind::kRemote, store::TierSpec::Kind::kRedis, store::TierSpec::Kind::kDevice}) {
    auto rate = MeasureTierLimit(kind, "");
    ASSERT_TRUE(rate.ok()) << rate.status().message();
    EXPECT_EQ(*rate, 0.0);
  }
}

// A failed measurement costs the tier its limit (0), never the node its start.
TEST_F(TierLimitsTest, AFailedMeasurementGivesZeroForThatTierOnly) {
  store::TierSpec host;
  store::TierSpec disk;
  disk.kind = store::TierSpec::Kind::kDisk;
  disk.path = dir_.string();  // no tmp/: no disk tier opened it
  const std::vector<double> limits = MeasureTierLimits({host, disk}, {"host", "disk"});
  ASSERT_EQ(limits.size(), 2u);
  EXPECT_GT(limits[0], 0.0);
  EXPECT_EQ(limits[1], 0.0);
}

// ---- A kdnd --------------------------------------------------------------------

ServerConfig NodeConfig(const fs::path& dir, bool measure) {
  ServerConfig c;
  c.listen = {"127.0.0.1:0"};
  c.measure_tiers = measure;
  store::TierSpec host;
  host.capacity_bytes = 32 << 20;
  store::TierSpec disk;
  disk.kind = store::TierSpec::Kind::kDisk;
  disk.capacity_bytes = 64 << 20;
  disk.path = (dir / "disk").string();
  c.tiers = {host, disk};
  c.tokens = {{"ops", kOpsToken, {"*"}, true}};
  return c;
}

// The node's statistics through the stats call.
NodeStats StatsOverRpc(const std::string& address) {
  Client c(address);
  Session::Client ops = c.MustLogin(kOpsToken);
  auto r = ops.statsRequest().send().wait(c.io.waitScope);
  EXPECT_EQ(r.getError().getCode(), ErrorCode::OK);
  return FromWire(r.getStats());
}

TEST_F(TierLimitsTest, AKdndReportsItsHostAndDiskTiersMeasuredLimits) {
  RunningServer node(NodeConfig(dir_, true));
  ASSERT_FALSE(node.bound().rpc.empty());
  const NodeStats s = StatsOverRpc(node.bound().rpc[0]);
  ASSERT_EQ(s.tiers.size(), 2u);
  EXPECT_EQ(s.tiers[0].kind, "host");
  EXPECT_EQ(s.tiers[1].kind, "disk");
  for (const TierStatsSnapshot& t : s.tiers) {
    EXPECT_GT(t.limit_bytes_per_s, 0.0) << t.name;
    EXPECT_TRUE(std::isfinite(t.limit_bytes_per_s)) << t.name;
  }
  // The measurement's file is gone before the node serves.
  EXPECT_TRUE(fs::is_empty(dir_ / "disk" / "tmp"));
  // And /metrics carries each as a gauge.
  const std::string text = RenderPrometheus(s);
  for (const char* tier : {"index=\"0\",tier=\"host\"", "index=\"1\",tier=\"disk\""}) {
    EXPECT_NE(text.find(std::string("kdn_tier_limit_bytes_per_second{") + tier + "}"), std::string::npos)
        << tier << "\n" << text;
  }
}

TEST_F(TierLimitsTest, AKdndWithMeasureTiersOffReportsNoLimits) {
  RunningServer node(NodeConfig(dir_, false));
  ASSERT_FALSE(node.bound().rpc.empty());
  const NodeStats s = StatsOverRpc(node.bound().rpc[0]);
  ASSERT_EQ(s.tiers.size(), 2u);
  for (const TierStatsSnapshot& t : s.tiers) EXPECT_EQ(t.limit_bytes_per_s, 0.0) << t.name;
  EXPECT_EQ(RenderPrometheus(s).find("kdn_tier_limit_bytes_per_second"), std::string::npos);
}

}  // namespace
}  // namespace kdn::server
