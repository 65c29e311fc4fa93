// SPDX-License-Identifier: Apache-2.0
// `kdn blend eval` and `kdn bench blend`, run as a user runs them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unistd.h>

#include "cli_runner.h"
#include "test_models.h"

namespace {

namespace fs = std::filesystem;

kdn::testing::CliRun Kdn(const std::string& args, const std::string& redirect = "2>&1") {
  return kdn::testing::RunShell(std::string(KDN_CLI) + " " + args + " " + redirect);
}

std::string EvalArgs() {
  return "blend eval --model " + kdn::testing::ModelPath() + " --tokenizer " + kdn::testing::TokenizerPath() +
         " --text " + KDN_STORIES;
}

TEST(BlendEvalCli, PrintsTheIssuesJsonObject) {
  KDN_REQUIRE_MODEL();
  const auto r = Kdn(EvalArgs() + " --chunks 3 --ratio 0.2 --contexts 3 --json", "2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 12u) << r.out;  // issue 5's ten, then first_tokens and kv_pass (issue 34)
  size_t at = 0;  // the fields in the issue's order
  for (const char* key : {"contexts", "ratio", "recompute_fraction", "kl_blend_mean", "kl_naive_mean", "top1_blend",
                          "top1_naive", "ttft_full_ms", "ttft_blend_ms", "ttft_naive_ms"}) {
    const size_t found = r.out.find('"' + std::string(key) + '"');
    ASSERT_NE(found, std::string::npos) << key;
    EXPECT_GE(found, at) << key << " out of order: " << r.out;
    at = found;
  }
  EXPECT_EQ(j.at("contexts").get<int>(), 3);
  EXPECT_DOUBLE_EQ(j.at("ratio").get<double>(), 0.2);
  EXPECT_GT(j.at("recompute_fraction").get<double>(), 0.2);
  EXPECT_LT(j.at("recompute_fraction").get<double>(), 1.0);
  EXPECT_LT(j.at("kl_blend_mean").get<double>(), j.at("kl_naive_mean").get<double>());
  EXPECT_GT(j.at("ttft_full_ms").get<double>(), 0.0);
  // Ratio 1 is full prefill: no divergence at all.
  const auto full = Kdn(EvalArgs() + " --ratio 1 --contexts 2 --json", "2>/dev/null");
  ASSERT_EQ(full.code, 0) << full.out;
  const nlohmann::json f = nlohmann::json::parse(full.out);
  EXPECT_EQ(f.at("kl_blend_mean").get<double>(), 0.0);
  EXPECT_EQ(f.at("top1_blend").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(f.at("recompute_fraction").get<double>(), 1.0);
  // The first tokens of each chunk alone (EPIC/LegoLink): they are the work,
  // and they bring the blend closer to full prefill than naive reuse.
  const auto anchors = Kdn(EvalArgs() + " --ratio 0 --first-tokens 4 --contexts 2 --json", "2>/dev/null");
  ASSERT_EQ(anchors.code, 0) << anchors.out;
  const nlohmann::json a = nlohmann::json::parse(anchors.out);
  EXPECT_EQ(a.at("first_tokens").get<int>(), 4);
  EXPECT_GT(a.at("recompute_fraction").get<double>(), 0.0);
  EXPECT_LT(a.at("recompute_fraction").get<double>(), 0.2);
  EXPECT_LT(a.at("kl_blend_mean").get<double>(), a.at("kl_naive_mean").get<double>());
}

// `kdn blend calibrate`: the default methods measured on a text, written to
// a gate file under the reference engine's fingerprint; a second run keeps
// other models' lines and replaces its own.
TEST(BlendCalibrateCli, WritesAGateFileOfTheDefaultMethods) {
  KDN_REQUIRE_MODEL();
  const fs::path gate = fs::temp_directory_path() / ("kdn_gate_cli_" + std::to_string(getpid()));
  const std::string other = std::string(64, 'c') + " ratio=0.5 checks=1 kv_pass=0 first=0 kl_ratio=0.05";
  std::ofstream(gate) << other << "\n";
  const std::string args = "blend calibrate --model " + kdn::testing::ModelPath() + " --tokenizer " +
                           kdn::testing::TokenizerPath() + " --text " + KDN_STORIES + " --contexts 2 --out " +
                           gate.string();
  for (int run = 0; run < 2; ++run) {
    const auto r = Kdn(args + " --json", "2>&1");
    ASSERT_EQ(r.code, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("fingerprint").get<std::string>().size(), 64u);
    ASSERT_EQ(j.at("methods").size(), 2u);
    EXPECT_EQ(j.at("methods")[0].at("kv_pass"), true);
    EXPECT_EQ(j.at("methods")[0].at("check_layers"), nlohmann::json({1, 2}));
    EXPECT_EQ(j.at("methods")[1].at("kv_pass"), false);
    for (const auto& m : j.at("methods")) {
      EXPECT_GT(m.at("kl_ratio").get<double>(), 0.0);
      EXPECT_LT(m.at("kl_ratio").get<double>(), 1.0);
      EXPECT_EQ(m.at("contexts").get<int>(), 2);
    }
    std::ifstream in(gate);
    std::string line;
    int lines = 0, others = 0;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      ++lines;
      others += line.rfind(std::string(64, 'c') + " ratio=0.5 checks=1 kv_pass=0 first=0 kl_ratio=0.05", 0) == 0;
    }
    EXPECT_EQ(lines, 3) << run;  // the other model's line, then this model's two (replaced on the second run)
    EXPECT_EQ(others, 1);
  }
  EXPECT_NE(Kdn(args + " --fingerprint nothex").code, 0);
  fs::remove(gate);
}

TEST(BlendEvalCli, BadInputsFailWithAMessage) {
  KDN_REQUIRE_MODEL();
  auto r = Kdn("blend eval --model " + kdn::testing::ModelPath() + " --tokenizer " + kdn::testing::TokenizerPath() +
               " --text /nonexistent/stories.txt --json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("cannot read"), std::string::npos) << r.out;
  r = Kdn(EvalArgs() + " --ratio 1.5 --json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--ratio: Value 1.5 not in range"), std::string::npos) << r.out;
  r = Kdn(EvalArgs() + " --chunks 64 --chunk-tokens 4096 --json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("blend eval"), std::string::npos) << r.out;
}

TEST(BlendBenchCli, QuickWritesTheRecordsAndAPlot) {
  KDN_REQUIRE_MODEL();
  const fs::path json = fs::temp_directory_path() / ("kdn_bench_blend_" + std::to_string(getpid()) + ".json");
  const fs::path png = fs::path(json).replace_extension(".png");
  const auto r = kdn::testing::RunShell("KDN_MODELS=" + kdn::testing::ModelsDir() + " " + std::string(KDN_CLI) +
                                        " bench blend --quick --json " + json.string() + " 2>&1");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& rec : records) {
    names.insert(rec.at("name").get<std::string>());
    EXPECT_TRUE(rec.contains("value") && rec.contains("unit") && rec.contains("params")) << rec.dump();
  }
  for (int pct : {0, 5, 10, 15, 20, 30, 100}) {
    for (const char* m : {"blend_kl_r", "blend_top1_r", "blend_recompute_fraction_r", "blend_ttft_r"}) {
      EXPECT_TRUE(names.count(m + std::to_string(pct))) << m << pct;
    }
  }
  for (const char* m : {"blend_ttft_full", "blend_kl_ratio_vs_naive", "blend_ttft_vs_work",
                        "blend_projected_f_32_layers", "blend_projected_ttft_ratio_32_layers", "blend_gradual_kl_r15",
                        "blend_gradual_kl_ratio_vs_naive"}) {
    EXPECT_TRUE(names.count(m)) << m;
  }
  // Issue 34's methods at about the same work: each record names its method and f.
  for (const char* method : {"cacheblend", "kv_pass", "kdn_default", "first_k", "first_k_and_default"}) {
    for (const char* what : {"_kl_ratio_vs_naive", "_kl", "_top1", "_f", "_ttft"}) {
      const std::string name = std::string("blend_method_") + method + what;
      ASSERT_TRUE(names.count(name)) << name;
      for (const auto& rec : records) {
        if (rec.at("name") != name) continue;
        EXPECT_EQ(rec.at("params").at("method"), method) << rec.dump();
        EXPECT_GT(rec.at("params").at("f").get<double>(), 0.0) << rec.dump();
      }
    }
  }
  // One full-prefill series per run: every TTFT ratio is against it.
  double full_ms = 0;
  int samples = 0;
  for (const auto& rec : records) {
    if (rec.at("name") == "blend_ttft_full") {
      full_ms = rec.at("value").get<double>();
      samples = rec.at("params").at("samples").get<int>();
    }
  }
  EXPECT_GT(full_ms, 0.0);
  EXPECT_EQ(samples, 4 * 14);  // --quick: 4 contexts x (naive + 7 ratios + gradual + 5 methods)
  int against_full = 0;
  for (const auto& rec : records) {
    const std::string name = rec.at("name").get<std::string>();
    // Measured records say so; the 32-layer extrapolations say they are
    // projected and on what basis.
    ASSERT_TRUE(rec.contains("projected") && rec.at("projected").is_boolean()) << rec.dump();
    const bool projected = name.rfind("blend_projected_", 0) == 0;
    EXPECT_EQ(rec.at("projected").get<bool>(), projected) << rec.dump();
    if (projected) {
      EXPECT_TRUE(rec.at("params").contains("basis")) << rec.dump();
    }
    if (name == "blend_kl_r100") {
      EXPECT_EQ(rec.at("value").get<double>(), 0.0);
    }
    if (rec.contains("baseline") && rec.at("baseline") == "full_prefill") {
      ++against_full;
      EXPECT_EQ(rec.at("baseline_value").get<double>(), full_ms) << rec.dump();
      EXPECT_EQ(rec.at("params").at("baseline_series"), "blend_ttft_full") << rec.dump();
      EXPECT_EQ(rec.at("params").at("baseline_samples").get<int>(), samples) << rec.dump();
    }
  }
  EXPECT_EQ(against_full, 14);  // naive, 7 ratios, gradual, 5 methods
  if (r.out.find("gnuplot not found") == std::string::npos) {
    std::ifstream p(png, std::ios::binary);
    char sig[8] = {};
    p.read(sig, 8);
    EXPECT_EQ(std::string(sig + 1, 3), "PNG");
  }
  fs::remove(json);
  fs::remove(png);
}

}  // namespace
