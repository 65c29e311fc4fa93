// SPDX-License-Identifier: Apache-2.0
// `kdn bench codec --quick`, run as a user runs it: the records it writes and
// their plausibility. Timings are only checked to be positive, never against
// a threshold.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli_runner.h"
#include "test_models.h"

namespace {

namespace fs = std::filesystem;

using kdn::testing::CliRun;

CliRun Kdn(const std::string& args) {
  return kdn::testing::RunShell("KDN_MODELS=" + kdn::testing::ModelsDir() + " " + std::string(KDN_CLI) + " " + args +
                                " 2>&1");
}

// bench/texts in the source tree (this file is tests/tools/codec_bench_test.cc).
std::string TextsDir() {
  return (fs::path(__FILE__).parent_path().parent_path().parent_path() / "bench/texts").string();
}

// The codecs every build has (kdn's own codec is checked when it is there).
constexpr const char* kCodecs[] = {"raw", "fp8", "int8", "kivi2", "cachegen"};

TEST(CodecBench, QuickWritesPlausibleRecords) {
  KDN_REQUIRE_MODEL();
  const fs::path dir = fs::temp_directory_path() / ("kdn_codec_bench_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path json = dir / "codec.json";
  const CliRun r = Kdn("bench codec --quick --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  ASSERT_TRUE(records.is_array());

  std::map<std::string, nlohmann::json> by_name;
  for (const auto& rec : records) {
    const std::string name = rec.at("name").get<std::string>();
    EXPECT_EQ(by_name.count(name), 0u) << "duplicate record " << name;
    by_name[name] = rec;
    EXPECT_TRUE(rec.at("value").is_number()) << rec.dump();
    EXPECT_TRUE(rec.at("unit").is_string()) << rec.dump();
    EXPECT_TRUE(rec.at("params").is_object()) << rec.dump();
    if (rec.contains("baseline")) {
      // The baseline is another record of the same run, with its value.
      const std::string base = rec.at("baseline").get<std::string>();
      ASSERT_TRUE(by_name.count(base)) << name << ": baseline " << base << " is not an earlier record";
      EXPECT_EQ(rec.at("baseline_value").get<double>(), by_name[base].at("value").get<double>()) << name;
      EXPECT_NEAR(rec.at("ratio").get<double>(),
                  rec.at("value").get<double>() / rec.at("baseline_value").get<double>(), 1e-9) << name;
    }
  }
  // Every figure says the text it came from: the held-out text by default.
  for (const auto& [name, rec] : by_name) {
    const auto& p = rec.at("params");
    EXPECT_EQ(p.value("text", ""), "bench/texts/heldout.txt") << name;
    EXPECT_EQ(p.value("held_out", false), true) << name;
    // Quality and size: one encoding of f16 KV, one chunk per context.
    if (p.contains("context_tokens")) {
      EXPECT_EQ(p.at("dtype").get<std::string>(), "f16") << name;
      EXPECT_EQ(p.at("chunk_tokens"), p.at("context_tokens")) << name;
      const bool long_ctx = name.size() > 4 && name.compare(name.size() - 4, 4, "_448") == 0;
      EXPECT_EQ(p.at("context_tokens").get<int>(), long_ctx ? 448 : 128) << name;  // --quick: 128
    }
    if (name.find("kdn") != std::string::npos && name.find("zstd") == std::string::npos &&
        (name.rfind("codec_ratio", 0) == 0 || name.rfind("codec_kl", 0) == 0)) {
      EXPECT_EQ(p.value("tuned_on", ""), "bench/texts/stories.txt") << name;
    }
  }
  EXPECT_EQ(r.out.find("tuning text"), std::string::npos) << r.out;
  auto value = [&](const std::string& name) {
    EXPECT_TRUE(by_name.count(name)) << "missing record " << name << "\n" << r.out;
    return by_name.count(name) ? by_name[name].at("value").get<double>() : -1.0;
  };

  // The baselines: zstd -1 (the reference), zstd -3 and lz4, lossless.
  for (const char* b : {"zstd1", "zstd3", "lz4"}) {
    EXPECT_GE(value(std::string("codec_ratio_") + b), 1.0) << b;
    for (const char* m : {"codec_encode_gbps_", "codec_decode_gbps_", "codec_encode_f32_gbps_",
                          "codec_decode_f32_gbps_"}) {
      EXPECT_GT(value(m + std::string(b)), 0.0) << m << b;
    }
  }

  for (const char* c : kCodecs) {
    const std::string n = c;
    EXPECT_EQ(by_name["codec_ratio_" + n].value("baseline", ""), "codec_ratio_zstd1") << n;
    // The 448-token figures beside the headline, against zstd -1 at 448.
    EXPECT_EQ(by_name["codec_ratio_" + n + "_448"].value("baseline", ""), "codec_ratio_zstd1_448") << n;
    EXPECT_GE(value("codec_kl_" + n + "_448"), 0.0) << n;
    EXPECT_GE(value("codec_kl_p95_" + n + "_448"), 0.0) << n;
    EXPECT_GE(value("codec_top1_" + n + "_448"), 0.0) << n;
    EXPECT_EQ(by_name["codec_encode_gbps_" + n].value("baseline", ""), "codec_encode_gbps_zstd1") << n;
    EXPECT_EQ(by_name["codec_decode_gbps_" + n].value("baseline", ""), "codec_decode_gbps_zstd1") << n;
    for (const char* m : {"codec_encode_gbps_", "codec_decode_gbps_", "codec_encode_f32_gbps_",
                          "codec_decode_f32_gbps_"}) {
      EXPECT_GT(value(m + n), 0.0) << m << n;
    }
    EXPECT_GE(value("codec_kl_" + n), 0.0) << n;
    EXPECT_GE(value("codec_kl_p95_" + n), 0.0) << n;
    const double top1 = value("codec_top1_" + n);
    EXPECT_GE(top1, 0.0) << n;
    EXPECT_LE(top1, 1.0) << n;
  }
  // raw: lossless, and as large as fp16 but for its header (the ratio and
  // the KL come from the same f16 encoding).
  for (const std::string sfx : {"", "_448"}) {
    EXPECT_GT(value("codec_ratio_raw" + sfx), 0.99) << sfx;
    EXPECT_LE(value("codec_ratio_raw" + sfx), 1.0) << sfx;
    EXPECT_EQ(value("codec_kl_raw" + sfx), 0.0) << sfx;
  }
  EXPECT_EQ(value("codec_kl_raw"), 0.0);
  EXPECT_EQ(value("codec_kl_p95_raw"), 0.0);
  EXPECT_EQ(value("codec_top1_raw"), 1.0);
  // int8 and fp8: one byte per element plus a float32 scale per (layer,
  // k|v, token) over 32 elements: 2 * 32 / 36 = 1.78x.
  EXPECT_NEAR(value("codec_ratio_int8"), 1.78, 0.05);
  EXPECT_NEAR(value("codec_ratio_fp8"), 1.78, 0.05);
  EXPECT_GT(value("codec_kl_int8"), 0.0);
  EXPECT_GT(value("codec_ratio_cachegen"), 1.5);

  // The sweeps: cachegen loses quality and size together as its bins shrink.
  for (int bins : {8, 12, 16, 24, 32, 48, 64}) value("codec_curve_cachegen_bins_" + std::to_string(bins));
  for (int group : {16, 32, 64}) value("codec_curve_kivi2_group_" + std::to_string(group));
  value("codec_curve_fp8_scale_token");
  value("codec_curve_fp8_scale_head");
  value("codec_curve_int8");
  EXPECT_GT(value("codec_curve_cachegen_bins_8"), value("codec_curve_cachegen_bins_64"));
  EXPECT_GT(by_name["codec_curve_cachegen_bins_8"].at("params").at("kl_mean").get<double>(),
            by_name["codec_curve_cachegen_bins_64"].at("params").at("kl_mean").get<double>());
  // The default cachegen is LMCache's schedule: 32 bins everywhere for a model
  // under 10 layers.
  EXPECT_EQ(value("codec_ratio_cachegen"), value("codec_curve_cachegen_bins_32"));

  // The transform codec with the reference model's profile
  // (models/stories260K.kdntc): its presets' records, the text they were
  // tuned on, and its speed beside zstd's.
  for (const std::string n : {"tc", "tc_hifi"}) {
    EXPECT_GT(value("codec_ratio_" + n), 1.0) << n;
    EXPECT_GE(value("codec_kl_" + n), 0.0) << n;
    EXPECT_EQ(by_name["codec_ratio_" + n].at("params").value("tuned_on", ""), "bench/texts/stories.txt") << n;
    EXPECT_GT(value("codec_decode_gbps_" + n), 0.0) << n;
    EXPECT_GT(value("codec_encode_gbps_" + n), 0.0) << n;
  }
  EXPECT_EQ(value("codec_ratio_tc_at_cachegen_kl"), value("codec_ratio_tc"));
  EXPECT_EQ(by_name["codec_ratio_tc_at_cachegen_kl"].at("params").at("kl_no_higher").get<bool>(),
            value("codec_kl_tc") <= value("codec_kl_cachegen"));
  EXPECT_EQ(value("codec_ratio_hifi_tc"), value("codec_ratio_tc_hifi"));

  // kdn's own codec, when it is built: its summary records agree with its others.
  if (by_name.count("codec_ratio_kdn")) {
    for (const std::string sfx : {"", "_448"}) {
      EXPECT_NEAR(value("codec_ratio_vs_cachegen" + sfx),
                  value("codec_ratio_kdn" + sfx) / value("codec_ratio_cachegen" + sfx), 1e-9);
      const auto& p = by_name["codec_ratio_vs_cachegen" + sfx].at("params");
      EXPECT_EQ(p.at("kl_no_higher").get<bool>(), value("codec_kl_kdn" + sfx) <= value("codec_kl_cachegen" + sfx));
      EXPECT_NEAR(value("codec_kl_vs_cachegen" + sfx), value("codec_kl_kdn" + sfx) / value("codec_kl_cachegen" + sfx),
                  1e-9);
      EXPECT_EQ(p.at("tuned_on").get<std::string>(), "bench/texts/stories.txt");
    }
    EXPECT_GT(value("codec_decode_gbps_kdn"), 0.0);
    EXPECT_GT(value("codec_encode_gbps_kdn"), 0.0);
    // Several chunks decoded on two threads against one, wall-clock, the
    // same chunks in the same run; the record says how many cores there are.
    EXPECT_GT(value("codec_decode_1thread_gbps_kdn"), 0.0);
    EXPECT_GT(value("codec_decode_2threads_gbps_kdn"), 0.0);
    const auto& two = by_name["codec_decode_2threads_gbps_kdn"];
    EXPECT_EQ(two.value("baseline", ""), "codec_decode_1thread_gbps_kdn");
    const auto& tp = two.at("params");
    EXPECT_EQ(tp.at("threads").get<int>(), 2);
    EXPECT_EQ(by_name["codec_decode_1thread_gbps_kdn"].at("params").at("threads").get<int>(), 1);
    EXPECT_EQ(tp.at("spec").get<std::string>(), "kdn:balanced");
    EXPECT_EQ(tp.at("dtype").get<std::string>(), "f16");
    EXPECT_EQ(tp.at("chunk_tokens").get<int>(), 256);
    EXPECT_GE(tp.at("chunks").get<int>(), 2);
    EXPECT_EQ(tp.at("clock").get<std::string>(), "wall-clock");
    EXPECT_EQ(tp.at("goal").get<std::string>(), ">= 1.8");
    const unsigned cores = std::thread::hardware_concurrency();
    EXPECT_EQ(tp.at("hardware_concurrency").get<unsigned>(), cores);
    EXPECT_EQ(tp.at("meaningful").get<bool>(), cores >= 2);
    EXPECT_EQ(tp.contains("note"), cores < 2);
    EXPECT_GT(tp.at("cpu_per_wall").get<double>(), 0.0);
  }
  if (by_name.count("codec_ratio_kdn_hifi")) {
    EXPECT_EQ(value("codec_ratio_hifi_kdn"), value("codec_ratio_kdn_hifi"));
    EXPECT_EQ(value("codec_ratio_hifi_kdn_448"), value("codec_ratio_kdn_hifi_448"));
    EXPECT_EQ(by_name["codec_ratio_hifi_kdn"].at("params").at("kl_mean").get<double>(), value("codec_kl_kdn_hifi"));
  }

  // The plot, next to the JSON, unless gnuplot is missing (then it says so).
  const fs::path png = dir / "codec.png";
  if (r.out.find("gnuplot not found") == std::string::npos) {
    std::ifstream p(png, std::ios::binary);
    char magic[8] = {};
    p.read(magic, sizeof magic);
    EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << r.out;
  }
  fs::remove_all(dir);
}

// The tuning text can be measured, but not as held out.
TEST(CodecBench, TheTuningTextIsNotHeldOut) {
  KDN_REQUIRE_MODEL();
  const fs::path json = fs::temp_directory_path() / ("kdn_codec_bench_tuning_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench codec --quick --contexts 1 --repeats 1 --text " + TextsDir() +
                       "/stories.txt --json " + json.string() + " --png " + json.string() + ".png");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tuning text"), std::string::npos) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  ASSERT_FALSE(records.empty());
  for (const auto& rec : records) {
    EXPECT_EQ(rec.at("params").value("text", ""), "bench/texts/stories.txt") << rec.dump();
    EXPECT_EQ(rec.at("params").value("held_out", true), false) << rec.dump();
  }
  fs::remove(json);
  fs::remove(json.string() + ".png");
}

TEST(CodecBench, AMissingTextIsAnError) {
  KDN_REQUIRE_MODEL();
  const fs::path json = fs::temp_directory_path() / ("kdn_codec_bench_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench codec --quick --text /nonexistent/stories.txt --json " + json.string());
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("/nonexistent/stories.txt"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(json));
}

}  // namespace

// `kdn bench gpu` without a GPU (as on every machine here): it says it needs
// one, writes no records and exits 0. With a GPU its records are checked by
// running it; there is none to check them here.
TEST(GpuBench, WithoutAGpuWritesNoRecords) {
  const fs::path json = fs::temp_directory_path() / ("kdn_gpu_bench_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench gpu --json " + json.string());
  if (r.out.find("needs a CUDA GPU") == std::string::npos) GTEST_SKIP() << "a GPU is present: " << r.out;
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  EXPECT_TRUE(records.is_array());
  EXPECT_TRUE(records.empty());
  fs::remove(json);
}

// `kdn bench gpu --emulated`: the delivery measures through the store into a
// device view on the emulated device (host memory, the kernels' CPU paths),
// each against the copy of the same bytes it replaces, measured in the same
// run. Checks the records' shape and that every path delivered, not speed.
TEST(GpuBench, EmulatedDeliveryRecordsEveryPathAgainstItsCopy) {
  KDN_REQUIRE_MODEL();
  const fs::path json = fs::temp_directory_path() / ("kdn_gpu_bench_emu_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench gpu --emulated --repeats 2 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& rec : records) by_name[rec["name"].get<std::string>()] = rec;
  for (const char* name : {"emulated_copy_h2d_gbps_raw", "emulated_copy_d2d_gbps_raw", "emulated_get_device_tier_gbps",
                           "emulated_deliver_host_raw_gbps", "emulated_deliver_disk_zstd_gbps",
                           "emulated_deliver_disk_kdn_gbps", "emulated_deliver_disk_tc_gbps"}) {
    ASSERT_TRUE(by_name.count(name)) << name << " missing: " << r.out;
    const nlohmann::json& rec = by_name[name];
    EXPECT_GT(rec["value"].get<double>(), 0.0) << name;
    EXPECT_EQ(rec["params"]["device"], "emulated") << name;
    EXPECT_TRUE(rec["params"].contains("emulated")) << name;
  }
  EXPECT_EQ(by_name["emulated_get_device_tier_gbps"]["baseline"], "emulated_copy_d2d_gbps_raw");
  EXPECT_EQ(by_name["emulated_deliver_disk_tc_gbps"]["baseline"], "emulated_copy_h2d_gbps_raw");
  EXPECT_EQ(by_name["emulated_deliver_disk_tc_gbps"]["params"]["codec"].get<std::string>().rfind("tc:", 0), 0u);
  fs::remove(json);
}

// `kdn bench gpu --emulated --shape llama-8b`: Llama-3.1-8B's shape with
// synthetic KV (labelled so), one request of 512 tokens: every tier of the
// table (host kdn and cachegen besides raw), the scatter kernel into each
// layout and kdn's batched decode alone, each against its copy of the same bytes in the same run. Checks
// the records, not speed.
TEST(GpuBench, EmulatedLlama8bShapeRecordsEveryPathAndLayout) {
  const fs::path json = fs::temp_directory_path() / ("kdn_gpu_bench_8b_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench gpu --emulated --shape llama-8b --tokens 512 --repeats 1 --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& rec : records) by_name[rec["name"].get<std::string>()] = rec;
  const std::string p = "emulated_llama8b_512_";
  for (const char* name : {"copy_h2d_gbps_raw", "copy_d2d_gbps_raw", "scatter_canonical_gbps", "scatter_paged_nhd_gbps",
                           "scatter_paged_hnd_gbps", "get_device_tier_gbps", "deliver_host_raw_gbps",
                           "deliver_host_kdn_gbps", "deliver_host_cachegen_gbps", "deliver_disk_kdn_gbps",
                           "deliver_disk_zstd_gbps", "decode_kdn_batch_gbps"}) {
    ASSERT_TRUE(by_name.count(p + name)) << name << " missing: " << r.out;
    const nlohmann::json& rec = by_name[p + name];
    EXPECT_GT(rec["value"].get<double>(), 0.0) << name;
    EXPECT_EQ(rec["params"]["shape"], "llama-8b") << name;
    EXPECT_EQ(rec["params"]["tokens_per_request"], 512) << name;
    EXPECT_EQ(rec["params"]["total_bytes"], std::uint64_t{512} * 128 * 1024) << name;  // 128 KiB per token
    EXPECT_NE(rec["params"]["kv"].get<std::string>().find("synthetic"), std::string::npos) << name;
  }
  EXPECT_EQ(by_name[p + "scatter_paged_nhd_gbps"]["baseline"], p + "copy_d2d_gbps_raw");
  EXPECT_EQ(by_name[p + "get_device_tier_gbps"]["baseline"], p + "copy_d2d_gbps_raw");
  EXPECT_EQ(by_name[p + "deliver_host_kdn_gbps"]["baseline"], p + "copy_h2d_gbps_raw");
  EXPECT_EQ(by_name[p + "deliver_host_kdn_gbps"]["params"]["codec"].get<std::string>().rfind("kdn", 0), 0u);
  EXPECT_EQ(by_name[p + "decode_kdn_batch_gbps"]["baseline"], p + "copy_d2d_gbps_raw");
  EXPECT_GT(by_name[p + "decode_kdn_batch_gbps"]["params"]["ratio"].get<double>(), 2.0) << "kdn:balanced compresses";
  // Blending composed on the device against on the host (kdn's own work),
  // the second named with the first as its baseline.
  ASSERT_TRUE(by_name.count(p + "blend_compose_host_ms")) << r.out;
  ASSERT_TRUE(by_name.count(p + "blend_compose_device_ms")) << r.out;
  EXPECT_GT(by_name[p + "blend_compose_device_ms"]["value"].get<double>(), 0.0);
  EXPECT_EQ(by_name[p + "blend_compose_device_ms"]["baseline"], p + "blend_compose_host_ms");
  EXPECT_EQ(by_name[p + "blend_compose_device_ms"]["params"]["positions"], 512);
  EXPECT_NE(by_name[p + "blend_compose_device_ms"]["params"]["engine"].get<std::string>().find("kdn's own work"),
            std::string::npos);
  fs::remove(json);
  // A request size that is not whole chunks is refused, saying why.
  const CliRun bad = Kdn("bench gpu --emulated --shape llama-8b --tokens 300 --json " + json.string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("multiple of 256"), std::string::npos) << bad.out;
}

// `kdn bench eviction --quick`: every policy at every capacity of both
// workloads, LRU the baseline of the others and S3-FIFO a second one of the
// cost policy; the shares are fractions. Checks the records, not the policy.
TEST(EvictionBench, QuickWritesEveryRecordAgainstItsBaselines) {
  const fs::path json = fs::temp_directory_path() / ("kdn_evict_bench_" + std::to_string(getpid()) + ".json");
  const CliRun r = Kdn("bench eviction --quick --json " + json.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(json);
  const nlohmann::json records = nlohmann::json::parse(in);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& rec : records) by_name[rec["name"].get<std::string>()] = rec;
  for (const char* w : {"zipf", "mixed"}) {
    for (const char* cap : {"64gb", "256gb"}) {
      const std::string lru = std::string("evict_") + w + "_lru_" + cap;
      ASSERT_TRUE(by_name.count(lru)) << lru << ": " << r.out;
      EXPECT_GT(by_name[lru]["value"].get<double>(), 0.0);
      for (const char* p : {"s3fifo", "cost"}) {
        const std::string name = std::string("evict_") + w + "_" + p + "_" + cap;
        ASSERT_TRUE(by_name.count(name)) << name;
        EXPECT_EQ(by_name[name]["baseline"], lru);
        const double share = by_name[name]["params"]["saved_work_share"].get<double>();
        EXPECT_GT(share, 0.0);
        EXPECT_LE(share, 1.0);
        EXPECT_EQ(by_name[name]["params"]["seed"], 1818);
      }
      const std::string vs = std::string("evict_") + w + "_cost_vs_s3fifo_" + cap;
      ASSERT_TRUE(by_name.count(vs)) << vs;
      EXPECT_EQ(by_name[vs]["baseline"], std::string("evict_") + w + "_s3fifo_" + cap);
    }
  }
  fs::remove(json);
}
