// SPDX-License-Identifier: Apache-2.0
#include "bench/bindings_bench.h"

#include <kdn/kdn.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"

namespace kdn::bench {
namespace {

namespace fs = std::filesystem;

// The parameters every language's bench uses (bindings/<lang>/bench).
constexpr std::uint32_t kTokens = 256;
constexpr int kLookupCalls = 20000, kLookupBatches = 5;
const char kNs[] = "bench";

struct CSide {
  double retrieve_gbps = 0, lookup_us = 0;
};

// The C side: the calls each binding makes, from C, in this process.
int MeasureC(int repeats, CSide* out) {
  kdn_tier_config tier = KDN_TIER_CONFIG_INIT;
  tier.capacity_bytes = 256ull << 20;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.chunk_tokens = kTokens;
  o.tiers = &tier;
  o.num_tiers = 1;
  kdn_runtime* rt = nullptr;
  if (kdn_runtime_create(&o, &rt) != KDN_OK) {
    std::fprintf(stderr, "kdn bench bindings: %s\n", kdn_last_error_message());
    return 2;
  }
  std::unique_ptr<kdn_runtime, void (*)(kdn_runtime*)> rt_owner(rt, kdn_runtime_destroy);
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = 32;
  spec.num_kv_heads = 8;
  spec.head_dim = 128;
  spec.dtype = KDN_DTYPE_BF16;
  spec.fingerprint = "bench-8b";
  spec.fingerprint_len = std::strlen(spec.fingerprint);
  kdn_model* m = nullptr;
  if (kdn_model_create(rt, &spec, &m) != KDN_OK) {
    std::fprintf(stderr, "kdn bench bindings: %s\n", kdn_last_error_message());
    return 2;
  }
  std::unique_ptr<kdn_model, void (*)(kdn_model*)> m_owner(m, kdn_model_destroy);
  std::vector<std::int32_t> tokens(kTokens);
  for (std::uint32_t i = 0; i < kTokens; ++i) tokens[i] = static_cast<std::int32_t>(i % 32000);
  const size_t bytes = size_t{kTokens} * 32 * 2 * 8 * 128 * 2;
  std::vector<std::uint8_t> src(bytes), dst(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<std::uint8_t>(i * 2654435761u >> 24);
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = tokens.data();
  req.num_tokens = tokens.size();
  kdn_kv_view in = KDN_KV_VIEW_INIT, outv = KDN_KV_VIEW_INIT;
  in.dtype = outv.dtype = KDN_DTYPE_BF16;
  in.data = src.data();
  outv.data = dst.data();
  in.size_bytes = outv.size_bytes = bytes;
  kdn_kv_result stored = KDN_KV_RESULT_INIT;
  if (kdn_kv_store(m, kNs, sizeof kNs - 1, &req, &in, 1, &stored) != KDN_OK || stored.tokens != kTokens) {
    std::fprintf(stderr, "kdn bench bindings: store failed: %s\n", kdn_last_error_message());
    return 2;
  }
  bool ok = true;
  const double retrieve_ms = MedianMs(repeats, [&] {
    kdn_kv_result r = KDN_KV_RESULT_INIT;
    ok &= kdn_kv_retrieve(m, kNs, sizeof kNs - 1, &req, &outv, 1, &r) == KDN_OK && r.tokens == kTokens;
  });
  if (!ok || std::memcmp(src.data(), dst.data(), bytes) != 0) {
    std::fprintf(stderr, "kdn bench bindings: the C retrieve returned wrong bytes\n");
    return 1;
  }
  std::vector<double> batches;
  for (int b = 0; b < kLookupBatches; ++b) {
    const double t0 = NowMs();
    for (int i = 0; i < kLookupCalls; ++i) {
      kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
      ok &= kdn_kv_lookup(m, kNs, sizeof kNs - 1, &req, 1, &r) == KDN_OK && r.cached_tokens == kTokens;
    }
    batches.push_back((NowMs() - t0) * 1e3 / kLookupCalls);
  }
  if (!ok) {
    std::fprintf(stderr, "kdn bench bindings: a C lookup failed\n");
    return 1;
  }
  out->retrieve_gbps = static_cast<double>(bytes) / 1e9 / (retrieve_ms / 1e3);
  out->lookup_us = Median(batches);
  return 0;
}

// Runs bindings/<lang>/bench and reads the JSON object on its last line.
bool RunLanguage(const fs::path& script, int repeats, nlohmann::json* out, std::string* why) {
  const std::string cmd = "'" + script.string() + "' --repeats " + std::to_string(repeats);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *why = "cannot run " + cmd;
    return false;
  }
  std::string text;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const int rc = ::pclose(p);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const std::string last = text.substr(text.find_last_of('\n') == std::string::npos ? 0 : text.find_last_of('\n') + 1);
  if (rc != 0) {
    *why = cmd + " failed (status " + std::to_string(rc) + "): " + last;
    return false;
  }
  try {
    *out = nlohmann::json::parse(last);
    if (!out->contains("retrieve_gbps") || !out->contains("lookup_us")) throw std::runtime_error("fields missing");
    (void)(*out)["retrieve_gbps"].get<double>();
    (void)(*out)["lookup_us"].get<double>();
  } catch (const std::exception& e) {
    *why = cmd + " printed no {\"retrieve_gbps\", \"lookup_us\"} object (" + e.what() + "): " + last;
    return false;
  }
  return true;
}

}  // namespace

int RunBindingsBench(const BindingsBenchOptions& o) {
  const int repeats = o.repeats > 0 ? o.repeats : 5;
  const fs::path dir = o.bindings_dir.empty() ? fs::path(KDN_BINDINGS_BUILD_DIR) : fs::path(o.bindings_dir);
  std::vector<std::string> langs = o.languages;
  const bool named = !langs.empty();
  if (!named) langs = {"rust", "go", "java", "python"};
  std::printf("kdn bench bindings: %d repeats per retrieve (medians), lookups %d x %d calls\n", repeats,
              kLookupBatches, kLookupCalls);
  Records records;
  int ran = 0;
  for (const std::string& lang : langs) {
    const fs::path script = dir / lang / "bench";
    if (!fs::exists(script)) {
      std::printf("  %s: not built (no %s)\n", lang.c_str(), script.c_str());
      if (named) {
        std::fprintf(stderr, "kdn bench bindings: the %s binding is not built here\n", lang.c_str());
        return 2;
      }
      continue;
    }
    CSide c;
    if (int rc = MeasureC(repeats, &c); rc != 0) return rc;
    nlohmann::json got;
    std::string why;
    if (!RunLanguage(script, repeats, &got, &why)) {
      std::fprintf(stderr, "kdn bench bindings: %s\n", why.c_str());
      return 1;
    }
    const nlohmann::json params = {{"language", lang}, {"chunk_bytes", 32 << 20}, {"tokens", kTokens},
                                   {"layers", 32}, {"kv_heads", 8}, {"head_dim", 128}, {"dtype", "bf16"},
                                   {"repeats", repeats}, {"c_measured", "in this process, right before"}};
    records.Add("bindings_retrieve_gbps_" + lang, got["retrieve_gbps"].get<double>(), "GB/s", params,
                "c_retrieve_gbps", c.retrieve_gbps);
    nlohmann::json lp = params;
    lp["calls"] = kLookupCalls;
    lp["batches"] = kLookupBatches;
    lp["lower_is_better"] = true;
    records.Add("bindings_lookup_us_" + lang, got["lookup_us"].get<double>(), "us", lp, "c_lookup_us", c.lookup_us);
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "kdn bench bindings: no binding is built here (configure with -DKDN_BINDINGS=ON)\n");
    return 2;
  }
  return records.Finish(o.json_path, "kdn bench bindings");
}

}  // namespace kdn::bench
