// SPDX-License-Identifier: Apache-2.0
// `kdn codec eval`, run as a user runs it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_runner.h"
#include "test_models.h"

namespace {

namespace fs = std::filesystem;

using kdn::testing::CliRun;

// Runs the kdn command with `args`; `redirect` says what becomes of stderr
// ("2>&1": merged into the output).
CliRun Kdn(const std::string& args, const std::string& redirect = "2>&1") {
  return kdn::testing::RunShell(std::string(KDN_CLI) + " " + args + " " + redirect);
}

std::string EvalArgs(const std::string& codec, const std::string& text) {
  return "codec eval --model " + kdn::testing::ModelPath() + " --tokenizer " + kdn::testing::TokenizerPath() +
         " --codec " + codec + " --text " + text;
}

TEST(CodecEvalCli, RawPrintsOneJsonObject) {
  KDN_REQUIRE_MODEL();
  const CliRun r = Kdn(EvalArgs("raw", KDN_STORIES) + " --context 128 --continue 16 --json", "2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 8u) << r.out;
  // The fields in the order.
  size_t at = 0;
  for (const char* key : {"codec", "contexts", "ratio_vs_fp16", "ratio_vs_fp32", "kl_mean", "kl_p95",
                          "top1_agreement", "greedy_agreement"}) {
    const size_t found = r.out.find('"' + std::string(key) + '"');
    ASSERT_NE(found, std::string::npos) << key;
    EXPECT_GE(found, at) << key << " out of order: " << r.out;
    at = found;
  }
  EXPECT_EQ(j.at("codec").get<std::string>(), "raw");
  EXPECT_GE(j.at("contexts").get<int>(), 6000 / 128);
  EXPECT_EQ(j.at("kl_mean").get<double>(), 0.0);
  EXPECT_EQ(j.at("kl_p95").get<double>(), 0.0);
  EXPECT_EQ(j.at("top1_agreement").get<double>(), 1.0);
  EXPECT_EQ(j.at("greedy_agreement").get<double>(), 1.0);
  // The KV is encoded as f16 (as stored): raw is as large as f16 but for its
  // header.
  const double r16 = j.at("ratio_vs_fp16").get<double>();
  EXPECT_LE(r16, 1.0);
  EXPECT_GT(r16, 0.99);
  EXPECT_NEAR(j.at("ratio_vs_fp32").get<double>(), r16 * 2, 1e-9);
}

TEST(CodecEvalCli, SummaryWithoutJson) {
  KDN_REQUIRE_MODEL();
  const CliRun r = Kdn(EvalArgs("raw", KDN_STORIES) + " --context 256 --continue 4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("codec raw"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KL"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("greedy"), std::string::npos) << r.out;
}

TEST(CodecEvalCli, BadInputsFailWithAMessage) {
  KDN_REQUIRE_MODEL();
  CliRun r = Kdn(EvalArgs("raw", "/nonexistent/stories.txt") + " --json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("cannot read the text file"), std::string::npos) << r.out;

  r = Kdn(EvalArgs("no-such-codec", KDN_STORIES) + " --json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("no-such-codec"), std::string::npos) << r.out;

  r = Kdn(EvalArgs("raw", KDN_STORIES) + " --context 448 --continue 100 --json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("exceeds the model's context"), std::string::npos) << r.out;

  const fs::path small = fs::temp_directory_path() / ("kdn_codec_eval_" + std::to_string(getpid()) + ".txt");
  std::ofstream(small) << "Once upon a time, there was a cat.\n";
  r = Kdn(EvalArgs("raw", small.string()) + " --json");
  fs::remove(small);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("fewer than one context"), std::string::npos) << r.out;

  r = Kdn("codec eval --model /nonexistent.bin --tokenizer /nonexistent.tok --codec raw --text " +
          std::string(KDN_STORIES));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("cannot open model file"), std::string::npos) << r.out;
}

}  // namespace
