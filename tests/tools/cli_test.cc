// SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sys/wait.h>
#include <unistd.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.h"
#include "test_models.h"

namespace {

namespace fs = std::filesystem;

using kdn::testing::CliRun;

// Runs the kdn command with `args` through the shell; stdout and stderr together.
CliRun Kdn(const std::string& args, const std::string& env = "") {
  return kdn::testing::RunShell(env + (env.empty() ? "" : " ") + std::string(KDN_CLI) + " " + args + " 2>&1");
}

std::string ModelArgs() {
  return "--model " + kdn::testing::ModelPath() + " --tokenizer " + kdn::testing::TokenizerPath();
}


// The reference ids as `--ids` prints them.
std::string ReferenceIdsLine() {
  std::string line;
  for (int id : kdn::testing::kReferenceIds) line += (line.empty() ? "" : " ") + std::to_string(id);
  return line + "\n";
}

TEST(Cli, GenerateIdsMatchTheReference) {
  KDN_REQUIRE_MODEL();
  const CliRun r = Kdn("generate " + ModelArgs() + " --steps 48 --ids");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, ReferenceIdsLine());
}

TEST(Cli, GenerateTextMatchesTheReference) {
  KDN_REQUIRE_MODEL();
  const CliRun r = Kdn("generate " + ModelArgs() + " --steps 48");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out,
            "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
            "saw a big, red ball. She wanted to\n");
}

TEST(Cli, GenerateWithAPromptContinuesIt) {
  KDN_REQUIRE_MODEL();
  // "Once upon a time" encodes to the reference's first four ids, so greedy
  // decoding continues with the reference's next ones (prompt ids excluded).
  const CliRun r = Kdn("generate " + ModelArgs() + " --prompt 'Once upon a time' --steps 6 --ids");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "432 383 286 261 376 298\n");
}

TEST(Cli, DumpKvMatchesTheReferenceFiles) {
  KDN_REQUIRE_MODEL();
  const fs::path dir = fs::temp_directory_path() / ("kdn_cli_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string prefix = (dir / "kv").string();
  const CliRun r = Kdn("generate " + ModelArgs() + " --steps 48 --ids --dump-kv " + prefix);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* which : {"k", "v"}) {
    const std::vector<float> got = kdn::testing::ReadFloats(prefix + "." + which + ".f32");
    const std::vector<float> want = kdn::testing::ReadFloats(kdn::testing::ReferencePath(std::string("kv260k.") + which + ".f32"));
    ASSERT_EQ(got.size(), want.size()) << which;  // 5 layers x 48 positions x 32
    double max_abs = 0, max_err = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
      max_err = std::max(max_err, std::fabs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_LE(max_err / max_abs, 1e-4) << which;
  }
  // With a prompt: BOS + 4 prompt tokens + 9 of the 10 generated = 14 positions.
  ASSERT_EQ(Kdn("generate " + ModelArgs() + " --prompt 'Once upon a time' --steps 10 --dump-kv " + prefix).code, 0);
  EXPECT_EQ(kdn::testing::ReadFloats(prefix + ".k.f32").size(), 5u * 14 * 32);
  // ...and the id at each of the 14 positions: BOS, then the prompt's.
  std::ifstream ids(prefix + ".tokens.i32", std::ios::binary);
  std::vector<std::int32_t> tokens(15, -7);
  ids.read(reinterpret_cast<char*>(tokens.data()), 15 * sizeof(std::int32_t));
  EXPECT_EQ(ids.gcount(), static_cast<std::streamsize>(14 * sizeof(std::int32_t)));
  EXPECT_EQ(tokens[0], 1);
  for (int i = 0; i < 14; ++i) EXPECT_GE(tokens[static_cast<size_t>(i)], 0) << i;
  fs::remove_all(dir);
}

TEST(Cli, GenerateReportsBadInput) {
  CliRun r = Kdn("generate --model /nonexistent.bin --tokenizer /nonexistent.tok --steps 4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("cannot open model file"), std::string::npos) << r.out;
  r = Kdn("generate --steps 4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--model"), std::string::npos) << r.out;
}

// The held-out texts are the reference model's own stories: `--stories 36`
// with seed 11 writes bench/texts/heldout.txt, with seed 12 heldout2.txt, byte
// for byte (the sampler is std::mt19937_64, nucleus 0.9, temperature 1). The
// stories come one after another from one generator, so the first 3 are the
// texts' first 3 (all 36 take seconds, minutes under the sanitizers).
TEST(Cli, GenerateStoriesWritesTheHeldOutTexts) {
  KDN_REQUIRE_MODEL();
  for (const auto& [seed, file] : {std::pair<int, const char*>{11, "heldout.txt"}, {12, "heldout2.txt"}}) {
    const CliRun r = kdn::testing::RunShell(std::string(KDN_CLI) + " generate " + ModelArgs() +
                                            " --stories 3 --seed " + std::to_string(seed));
    ASSERT_EQ(r.code, 0) << r.out;
    std::ifstream in(std::string(KDN_TEXTS_DIR) + "/" + file, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t end = 0;
    for (int story = 0; story < 3 && end != std::string::npos; ++story) {
      end = text.find("\n\n", end);
      if (end != std::string::npos) end += 2;
    }
    ASSERT_NE(end, std::string::npos) << file;
    EXPECT_TRUE(r.out == text.substr(0, end)) << file << ": the stories differ from the committed text";
  }
  const CliRun both = Kdn("generate " + ModelArgs() + " --stories 2 --steps 4");
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.out.find("excludes"), std::string::npos) << both.out;
  const CliRun neither = Kdn("generate " + ModelArgs());
  EXPECT_NE(neither.code, 0);
  EXPECT_NE(neither.out.find("--stories"), std::string::npos) << neither.out;
}

TEST(Cli, DemoReusesKvWithIdenticalContinuations) {
  KDN_REQUIRE_MODEL();
  const CliRun r = Kdn("demo --repeats 1 --steps 16", "KDN_MODELS=" + kdn::testing::ModelsDir());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("stories260K.bin"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("identical continuations 7/7"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("DIFFERENT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reused  312"), std::string::npos) << r.out;
  // The RAG scene: every prompt blended (kdn_kv_blend, the transformer
  // behind the callback) by three methods, each recomputing a part of the work.
  EXPECT_NE(r.out.find("[4/4] RAG"), std::string::npos) << r.out;
  size_t blended = 0;
  for (size_t at = r.out.find("recomputed "); at != std::string::npos; at = r.out.find("recomputed ", at + 1)) {
    const double pct = std::atof(r.out.c_str() + at + std::strlen("recomputed "));
    EXPECT_GT(pct, 0.0) << r.out.substr(at, 40);
    EXPECT_LT(pct, 100.0) << r.out.substr(at, 40);
    ++blended;
  }
  EXPECT_EQ(blended, 4u * 3) << r.out;  // 4 prompts x 3 methods
  for (const char* method : {"CacheBlend 15%", "kdn default", "first 24 tokens"}) {
    EXPECT_NE(r.out.find(method), std::string::npos) << method << r.out;
  }
  EXPECT_NE(r.out.find("over the RAG prompts: full prefill"), std::string::npos) << r.out;
}

// A fresh clone runs the real model with no settings: the repository
// carries it (models/), and the tools find it from any directory.
TEST(Cli, DemoFindsTheRealModelWithNoSettings) {
  KDN_REQUIRE_MODEL();
  const fs::path empty = fs::temp_directory_path() / ("kdn_no_settings_" + std::to_string(getpid()));
  fs::create_directories(empty);
  const CliRun r = Kdn("demo --repeats 1 --steps 8", "cd " + empty.string() + " && unset KDN_MODELS &&");
  fs::remove_all(empty);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("RANDOM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stories260K.bin"), std::string::npos) << r.out;
}

TEST(Cli, DemoRunsWithoutTheModelOnARandomOne) {
  const fs::path empty = fs::temp_directory_path() / ("kdn_no_models_" + std::to_string(getpid()));
  fs::create_directories(empty);
  const CliRun r = Kdn("demo --repeats 1 --steps 8", "cd " + empty.string() + " && KDN_MODELS=" + empty.string());
  fs::remove_all(empty);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("RANDOM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("identical continuations 7/7"), std::string::npos) << r.out;
}

// `kdn ingest` as an operator runs it: lines when not on a terminal, a
// summary, a JSON summary, a second run that skips everything, and Ctrl-C
// (SIGINT) stopping after the files in progress with exit status 130 and a
// third run finishing the rest.
TEST(Cli, IngestIsResumableAndStopsOnCtrlC) {
  if (!kdn::testing::ModelsPresent()) GTEST_SKIP() << "the reference model is not present";
  const fs::path root = fs::temp_directory_path() / ("kdn_cli_ingest_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "docs");
  std::string story;
  for (int i = 0; i < 6; ++i) story += "Once upon a time, a little dog named Max found a big red ball in the park. ";
  for (int i = 0; i < 40; ++i) std::ofstream(root / "docs" / ("story" + std::to_string(i) + ".txt")) << story << i << "\n";
  std::ofstream(root / "docs" / "data.bin", std::ios::binary) << std::string("\0\1\2", 3);
  const std::string base = "ingest " + ModelArgs() + " --dir " + (root / "docs").string() + " --store " +
                           (root / "store").string() + " --progress lines";

  // Ctrl-C after the first file: the files in progress finish, the rest wait.
  const CliRun stopped = kdn::testing::RunShell(
      "(" + std::string(KDN_CLI) + " " + base + " > " + (root / "out").string() + " 2>&1 & p=$!; " +
      "for i in $(seq 1000); do grep -q '^\\[1/' " + (root / "out").string() + " && break; sleep 0.01; done; " +
      "kill -INT $p; wait $p; echo exit=$?; cat " + (root / "out").string() + ")");
  EXPECT_NE(stopped.out.find("exit=130"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("stopping after the files in progress"), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("run the same command again to go on"), std::string::npos) << stopped.out;

  const CliRun rest = Kdn(base + " --json " + (root / "s.json").string());
  EXPECT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("unchanged story0.txt"), std::string::npos) << rest.out;
  EXPECT_NE(rest.out.find("binary data.bin: not UTF-8 text"), std::string::npos) << rest.out;
  EXPECT_NE(rest.out.find("41 documents:"), std::string::npos) << rest.out;
  std::ifstream jf(root / "s.json");
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["documents"], 41);
  EXPECT_EQ(j["outcomes"]["binary"], 1);
  EXPECT_GT(j["outcomes"]["unchanged"].get<int>(), 0);
  EXPECT_EQ(j["outcomes"]["unchanged"].get<int>() + j["outcomes"]["ingested"].get<int>(), 40);
  EXPECT_GT(j["store"]["objects"].get<int>(), 0);

  const CliRun again = Kdn(base);
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("0 ingested, 0 replaced, 40 unchanged, 1 skipped (1 binary)"), std::string::npos) << again.out;

  const CliRun bad = Kdn("ingest " + ModelArgs() + " --dir " + (root / "nope").string() + " --store " +
                         (root / "store2").string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("not a directory"), std::string::npos) << bad.out;
  fs::remove_all(root);
}

// `kdn bench ingest --quick`: every record, the store side against the
// prefill side of the same run, and the resume skipping everything.
TEST(Cli, BenchIngestWritesTheRecords) {
  if (!kdn::testing::ModelsPresent()) GTEST_SKIP() << "the reference model is not present";
  const fs::path json = fs::temp_directory_path() / ("kdn_bench_ingest_" + std::to_string(::getpid()) + ".json");
  const CliRun r = Kdn("bench ingest --quick --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(json);
  const nlohmann::json records = nlohmann::json::parse(f);
  std::map<std::string, nlohmann::json> by;
  for (const auto& rec : records) by[rec["name"]] = rec;
  for (const char* name : {"ingest_prefill_only_tokens_per_s", "ingest_tokens_per_s", "ingest_store_overhead",
                           "ingest_reference_corpus_s", "ingest_resume_s"}) {
    ASSERT_TRUE(by.count(name)) << name;
    EXPECT_TRUE(std::isfinite(by[name]["value"].get<double>())) << name;
  }
  EXPECT_EQ(by["ingest_tokens_per_s"]["baseline"], "prefill_only");
  EXPECT_GT(by["ingest_tokens_per_s"]["params"]["tokens"].get<int>(), 0);
  EXPECT_EQ(by["ingest_tokens_per_s"]["params"]["documents"], 8);
  fs::remove(json);
}

// `kdn bench rag --quick`: the paper's table with this run's rows, every
// mode's records against in-context, and the quality the modes owe:
// prefix reuse and warm serve the same KV (the same first-token
// distribution, the same continuation); blending is lossy but close.
TEST(Cli, BenchRagWritesThePapersTable) {
  if (!kdn::testing::ModelsPresent()) GTEST_SKIP() << "the reference model is not present";
  const fs::path json = fs::temp_directory_path() / ("kdn_bench_rag_" + std::to_string(::getpid()) + ".json");
  const CliRun r = Kdn("bench rag --quick --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* row : {"KV-cache learning with a KDN", "in-context learning", "KDN prefix reuse", "KDN blending",
                          "bound: warm (whole prompt cached)", "bound: knowledge cached in place",
                          "goals, KDN blending against in-context"}) {
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  }
  std::ifstream f(json);
  const nlohmann::json records = nlohmann::json::parse(f);
  std::map<std::string, nlohmann::json> by;
  for (const auto& rec : records) by[rec["name"]] = rec;
  std::vector<std::string> engines = {"rag_reference"};
  if (const char* v = std::getenv("KDN_REQUIRE_LLAMACPP"); v != nullptr && std::string(v) == "1") {
    engines.push_back("rag_llamacpp");
  }
  for (const std::string& e : engines) {
    for (const char* mode : {"in_context", "prefix", "blend", "warm", "knowledge_cached"}) {
      const std::string k = e + "_" + mode;
      for (const char* m : {"_delay_ms", "_delay_p90_ms", "_ttft_ms", "_cost_usd", "_cpu_ms", "_engine_ms",
                            "_kdn_cpu_ms", "_kdn_usd", "_top1", "_kl", "_same_continuation", "_reused_fraction"}) {
        ASSERT_TRUE(by.count(k + m)) << k + m;
        EXPECT_TRUE(std::isfinite(by[k + m]["value"].get<double>())) << k + m;
      }
      EXPECT_EQ(by[k + "_delay_ms"]["params"]["served"], 8) << k;
      if (std::string(mode) != "in_context") {
        EXPECT_EQ(by[k + "_delay_ms"]["baseline"], "in_context") << k;
      }
      EXPECT_GT(by[k + "_cost_usd"]["value"].get<double>(), 0) << k;
      // The model's forward passes are part of every request, and inside its CPU time.
      EXPECT_GT(by[k + "_engine_ms"]["value"].get<double>(), 0) << k;
      EXPECT_LE(by[k + "_kdn_usd"]["value"].get<double>(), by[k + "_cost_usd"]["value"].get<double>()) << k;
    }
    // The same KV as full prefill: the same distribution to float rounding.
    for (const char* exact : {"_prefix", "_warm", "_knowledge_cached"}) {
      EXPECT_LT(by[e + exact + "_kl_max"]["value"].get<double>(), 1e-9) << e << exact;
      EXPECT_EQ(by[e + exact + "_same_continuation"]["value"].get<double>(), 1.0) << e << exact;
    }
    EXPECT_GT(by[e + "_warm_reused_fraction"]["value"].get<double>(), 0.9) << e;
    EXPECT_GT(by[e + "_blend_reused_fraction"]["value"].get<double>(), 0.4) << e;
    EXPECT_LT(by[e + "_blend_kl"]["value"].get<double>(), 0.1) << e;
    EXPECT_EQ(by[e + "_inject_s"]["baseline"], "prefill_only") << e;
    EXPECT_EQ(by[e + "_inject_2m_tokens_h"]["projected"], true) << e;
  }
  // The reference engine's store for blending is the ingest's: a disk tier.
  EXPECT_GT(by["rag_reference_blend_delay_ms"]["params"]["store"]["disk_bytes"].get<double>(), 0);
  fs::remove(json);
  fs::remove(fs::path(json).replace_extension(".png"));
}

// `kdn bench adaptive --quick`: every side on both links, against recompute,
// with the levels the adaptive side used and the KL of each.
TEST(Cli, BenchAdaptiveWritesTheRecords) {
  if (!kdn::testing::ModelsPresent()) GTEST_SKIP() << "the reference model is not present";
  const fs::path json = fs::temp_directory_path() / ("kdn_bench_adaptive_" + std::to_string(::getpid()) + ".json");
  const CliRun r = Kdn("bench adaptive --quick --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(json);
  const nlohmann::json records = nlohmann::json::parse(f);
  std::map<std::string, nlohmann::json> by;
  for (const auto& rec : records) by[rec["name"]] = rec;
  ASSERT_TRUE(by.count("adaptive_recompute_ttft_ms"));
  for (const char* link : {"0.1gbit", "1to0.1gbit"}) {
    for (const char* side : {"adaptive", "fixed_zstd", "fixed_kdn_hifi", "fixed_kdn_balanced", "fixed_tc_balanced"}) {
      const std::string ttft = std::string(side) + "_" + link + "_ttft_ms", kl = std::string(side) + "_" + link + "_kl";
      ASSERT_TRUE(by.count(ttft) && by.count(kl)) << ttft;
      EXPECT_GT(by[ttft]["value"].get<double>(), 0) << ttft;
      EXPECT_EQ(by[ttft]["baseline"], "recompute");
      EXPECT_GE(by[kl]["value"].get<double>(), 0) << kl;
    }
    // Lossless zstd against the lossy levels: the KL says which is which.
    EXPECT_LT(by[std::string("fixed_zstd_") + link + "_kl"]["value"].get<double>(),
              by[std::string("fixed_kdn_balanced_") + link + "_kl"]["value"].get<double>());
    const auto& levels = by[std::string("adaptive_") + link + "_ttft_ms"]["params"]["chunks_per_level"];
    ASSERT_EQ(levels.size(), 4u);
    std::uint64_t chunks = 0;
    for (const auto& n : levels) chunks += n.get<std::uint64_t>();
    const double recomputed = by[std::string("adaptive_") + link + "_ttft_ms"]["params"]["tokens_recomputed_per_request"];
    EXPECT_EQ(chunks * 64 + static_cast<std::uint64_t>(recomputed * 2), 2u * 448) << "every chunk fetched at a level or recomputed";
  }
  fs::remove(json);
}

TEST(Cli, BenchFoundationWritesTheRecords) {
  const fs::path json = fs::temp_directory_path() / ("kdn_bench_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench foundation --quick --repeats 2 --json " + json.string(),
                    "KDN_MODELS=" + kdn::testing::ModelsDir());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  fs::remove(json);
  std::map<std::string, int> names;
  for (const auto& rec : records) {
    names[rec.at("name").get<std::string>()]++;
    EXPECT_GT(rec.at("value").get<double>(), 0.0) << rec.dump();
    EXPECT_TRUE(rec.at("params").is_object());
    if (rec.contains("baseline")) {
      EXPECT_GT(rec.at("baseline_value").get<double>(), 0.0);
      EXPECT_NEAR(rec.at("ratio").get<double>(),
                  rec.at("value").get<double>() / rec.at("baseline_value").get<double>(), 1e-9);
    }
  }
  EXPECT_EQ(names["ttft_cold_ms"], 3);
  EXPECT_EQ(names["ttft_warm_ms"], 3);
  EXPECT_EQ(names["host_retrieve_gbps_8b"], 1);
  EXPECT_EQ(names["host_retrieve_gbps_ref"], 1);
}

}  // namespace
