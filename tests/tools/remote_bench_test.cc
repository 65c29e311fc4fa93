// SPDX-License-Identifier: Apache-2.0
// `kdn bench remote --quick`, run as a user runs it (once for the suite: it
// starts a kdnd in-process and a shaping proxy): the put and get records
// stand beside their raw TCP baselines, the delivery records beside the
// link's measured rate with the codec's ratio and the goal, and TTFT
// delivered beside recomputed. Timings are only checked to be positive,
// never against a threshold.
#include <gtest/gtest.h>

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

class RemoteBench : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path json = fs::temp_directory_path() / ("kdn_remote_bench_" + std::to_string(getpid()) + ".json");
    run_ = new kdn::testing::CliRun(kdn::testing::RunShell("KDN_MODELS=" + kdn::testing::ModelsDir() + " " +
                                                           std::string(KDN_CLI) + " bench remote --quick --json " +
                                                           json.string() + " 2>&1"));
    by_name_ = new std::map<std::string, nlohmann::json>;
    if (run_->code == 0 && fs::exists(json)) {
      std::ifstream in(json);
      for (const auto& rec : nlohmann::json::parse(in)) (*by_name_)[rec.at("name").get<std::string>()] = rec;
    }
    fs::remove(json);
  }
  static void TearDownTestSuite() {
    delete run_;
    delete by_name_;
  }
  // The record, checked to have a positive value (and baseline, if named).
  static const nlohmann::json& Positive(const std::string& name, const std::string& baseline = "") {
    static const nlohmann::json none;
    auto it = by_name_->find(name);
    EXPECT_NE(it, by_name_->end()) << "missing " << name << "\n" << run_->out;
    if (it == by_name_->end()) return none;
    const nlohmann::json& rec = it->second;
    EXPECT_GT(rec.at("value").get<double>(), 0.0) << name;
    if (!baseline.empty()) {
      EXPECT_EQ(rec.at("baseline"), baseline) << name;
      EXPECT_GT(rec.at("baseline_value").get<double>(), 0.0) << name;
      EXPECT_NEAR(rec.at("ratio").get<double>(), rec.at("value").get<double>() / rec.at("baseline_value").get<double>(),
                  1e-9)
          << name;
    }
    return rec;
  }

  static kdn::testing::CliRun* run_;
  static std::map<std::string, nlohmann::json>* by_name_;
};
kdn::testing::CliRun* RemoteBench::run_ = nullptr;
std::map<std::string, nlohmann::json>* RemoteBench::by_name_ = nullptr;

// Puts and gets of both chunk shapes, each against raw TCP moving the same
// envelope bytes.
TEST_F(RemoteBench, PutAndGetBesideRawTcp) {
  ASSERT_EQ(run_->code, 0) << run_->out;
  for (const auto& [shape, bytes] : {std::pair<std::string, std::uint64_t>{"ref", 327680}, {"32mib", 32u << 20}}) {
    const nlohmann::json& put = Positive("remote_put_gbps_" + shape, "raw_tcp_put_gbps");
    const nlohmann::json& get = Positive("remote_get_gbps_" + shape, "raw_tcp_get_gbps");
    for (const nlohmann::json* rec : {&put, &get}) {
      if (rec->is_null()) continue;
      const nlohmann::json& p = rec->at("params");
      EXPECT_EQ(p.at("chunk_bytes").get<std::uint64_t>(), bytes) << shape;
      // The envelope frames the chunk: a little more than its bytes.
      EXPECT_GT(p.at("envelope_bytes").get<std::uint64_t>(), bytes) << shape;
      EXPECT_GT(p.at("chunks").get<int>(), 0) << shape;
      EXPECT_TRUE(p.at("content").is_string()) << shape;
    }
    if (!put.is_null()) {
      EXPECT_TRUE(put.at("params").at("guarantee").is_string());
    }
  }
}

// Delivery through the shaped link at 1 and 10 Gbit/s (kdn:balanced and
// raw against the link's measured rate), the decode alone, and TTFT.
TEST_F(RemoteBench, DeliveryAndTtftFromRealKv) {
  KDN_REQUIRE_MODEL();
  ASSERT_EQ(run_->code, 0) << run_->out;
  for (const char* link : {"1gbit", "10gbit"}) {
    const nlohmann::json& raw = Positive(std::string("remote_delivery_gbps_raw_") + link, "link_stream_gbps");
    const nlohmann::json& kdn = Positive(std::string("remote_delivery_gbps_kdn_") + link, "link_stream_gbps");
    if (raw.is_null() || kdn.is_null()) continue;
    const nlohmann::json& kp = kdn.at("params");
    EXPECT_EQ(kp.at("codec"), "kdn:balanced");
    EXPECT_EQ(raw.at("params").at("codec"), "raw");
    EXPECT_EQ(kp.at("dtype"), "f16");
    EXPECT_EQ(kp.at("chunk_tokens").get<int>(), 256);
    EXPECT_EQ(kp.at("kv_bytes"), raw.at("params").at("kv_bytes"));
    EXPECT_GT(kp.at("codec_ratio").get<double>(), 1.0);
    EXPECT_EQ(kp.at("link_gbit").get<double>(), std::string(link) == "1gbit" ? 1.0 : 10.0);
    EXPECT_TRUE(kp.at("goal").is_string());
    EXPECT_GT(kp.at("goal_gbps").get<double>(), 0.0);
    EXPECT_TRUE(kp.at("goal_met").is_boolean());
    // Both sides read the same link: the same measured baseline.
    EXPECT_EQ(kdn.at("baseline_value"), raw.at("baseline_value"));
  }
  Positive("remote_delivery_decode_gbps_kdn");
  const nlohmann::json& recompute = Positive("remote_ttft_ms_recompute");
  for (const char* side : {"raw", "kdn"}) {
    const nlohmann::json& rec = Positive(std::string("remote_ttft_ms_") + side, "remote_ttft_ms_recompute");
    if (rec.is_null() || recompute.is_null()) continue;
    EXPECT_EQ(rec.at("baseline_value"), recompute.at("value"));
    EXPECT_EQ(rec.at("params").at("tokens").get<int>(), 512);
    EXPECT_EQ(rec.at("params").at("reused_tokens").get<int>(), 512);
  }
  // Raw KV delivered exactly: the first token is the recomputed one.
  if (by_name_->count("remote_ttft_ms_raw")) {
    EXPECT_EQ(by_name_->at("remote_ttft_ms_raw").at("params").at("first_token_matches_recompute"), true);
  }
}

}  // namespace
