// SPDX-License-Identifier: Apache-2.0
#include "bench/foundation_bench.h"

#include <cstring>
#include <memory>
#include <vector>

#include "bench/bench_util.h"
#include "refengine/ref_engine.h"
#include "refengine/stories.h"

namespace kdn::bench {
namespace {

using refengine::RefEngine;

struct RuntimeDeleter {
  void operator()(kdn_runtime* r) const { kdn_runtime_destroy(r); }
};
struct ModelDeleter {
  void operator()(kdn_model* m) const { kdn_model_destroy(m); }
};
using RuntimePtr = std::unique_ptr<kdn_runtime, RuntimeDeleter>;
using ModelPtr = std::unique_ptr<kdn_model, ModelDeleter>;

RuntimePtr NewRuntime(std::uint64_t capacity) {
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.host_capacity_bytes = capacity;
  kdn_runtime* rt = nullptr;
  return RuntimePtr(kdn_runtime_create(&o, &rt) == KDN_OK ? rt : nullptr);
}

// Prompt of n tokens: BOS and the stories, repeated as needed.
std::vector<int> Prompt(const model::Tokenizer& tok, size_t n) {
  std::vector<int> t = {model::kBos};
  while (t.size() < n) {
    for (const auto& s : refengine::kStories) {
      const std::vector<int> more = tok.Encode(s.text, false);
      t.insert(t.end(), more.begin(), more.end());
    }
  }
  t.resize(n);
  return t;
}

int Ttft(const refengine::LoadedModel& m, int repeats, Records& out) {
  RuntimePtr rt = NewRuntime(std::uint64_t{256} << 20);
  auto engine_or = RefEngine::Create(m, rt.get());
  if (!rt || !engine_or.ok()) {
    std::fprintf(stderr, "bench: cannot set up the engine: %s\n", engine_or.status().message().c_str());
    return 2;
  }
  RefEngine& engine = **engine_or;
  for (size_t n : {128u, 256u, 512u}) {
    const std::vector<int> prompt = Prompt(*m.tokenizer, std::min<size_t>(n, static_cast<size_t>(engine.config().seq_len)));
    const std::string ns = "bench";
    if (auto s = engine.Ingest(ns, prompt); !s.ok()) {
      std::fprintf(stderr, "bench: %s\n", s.status().message().c_str());
      return 2;
    }
    std::vector<double> cold, warm;
    std::uint64_t reused = 0;
    for (int r = -1; r < repeats; ++r) {  // r = -1 warms up
      auto c = engine.Cold(prompt, 1);
      auto w = engine.Warm(ns, prompt, 1);
      if (!c.ok() || !w.ok()) {
        std::fprintf(stderr, "bench: %s\n", (!c.ok() ? c.status() : w.status()).message().c_str());
        return 2;
      }
      if (c->first_token != w->first_token) {
        std::fprintf(stderr, "bench: first token differs cold vs warm at %zu tokens\n", n);
        return 1;
      }
      if (r < 0) continue;
      cold.push_back(c->ttft_ms);
      warm.push_back(w->ttft_ms);
      reused = w->reused_tokens;
    }
    const nlohmann::json params = {{"tokens", prompt.size()}, {"reused_tokens", reused}, {"repeats", repeats},
                                   {"model", m.random ? "random-stories260K-shape" : "stories260K"}};
    const double c = Median(cold), w = Median(warm);
    out.Add("ttft_cold_ms", c, "ms", params);
    out.Add("ttft_warm_ms", w, "ms", params, "ttft_cold_ms", c);
  }
  return 0;
}

// Retrieve of one chunk of `tokens` tokens from the host tier into a
// canonical view (kdn_kv_view with `data` and all strides 0), against
// memcpy of the same bytes.
int HostRetrieve(const std::string& name, const kdn_model_spec& spec, std::uint32_t tokens, int repeats,
                 Records& out) {
  RuntimePtr rt = NewRuntime(std::uint64_t{1} << 30);
  kdn_model* mp = nullptr;
  if (!rt || kdn_model_create(rt.get(), &spec, &mp) != KDN_OK) {
    std::fprintf(stderr, "bench: %s\n", kdn_last_error_message());
    return 2;
  }
  ModelPtr model(mp);
  std::uint64_t per_token = 0;
  if (kdn_model_get_kv_bytes_per_token(model.get(), &per_token) != KDN_OK) {
    std::fprintf(stderr, "bench: %s\n", kdn_last_error_message());
    return 2;
  }
  const size_t bytes = per_token * tokens;
  // Throughput does not depend on the values; fill them deterministically.
  std::vector<std::uint8_t> src(bytes), dst(bytes, 0), dst2(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<std::uint8_t>(i * 2654435761u >> 13);
  std::vector<std::int32_t> ids(tokens);
  for (std::uint32_t i = 0; i < tokens; ++i) ids[i] = static_cast<std::int32_t>(i % 500 + 3);
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = ids.data();
  req.num_tokens = ids.size();
  kdn_kv_view in = KDN_KV_VIEW_INIT;
  in.data = src.data();
  in.size_bytes = bytes;
  in.num_tokens = tokens;
  in.dtype = spec.dtype;
  kdn_kv_view outv = in;
  outv.data = dst.data();
  const char ns[] = "bench";
  kdn_kv_result stored = KDN_KV_RESULT_INIT;
  if (kdn_kv_store(model.get(), ns, sizeof ns - 1, &req, &in, 1, &stored) != KDN_OK || stored.tokens != tokens) {
    std::fprintf(stderr, "bench: store failed: %s\n", kdn_last_error_message());
    return 2;
  }
  bool ok = true;
  const double retrieve_ms = MedianMs(repeats, [&] {
    kdn_kv_result filled = KDN_KV_RESULT_INIT;
    ok &= kdn_kv_retrieve(model.get(), ns, sizeof ns - 1, &req, &outv, 1, &filled) == KDN_OK && filled.tokens == tokens;
  });
  const double memcpy_ms = MedianMs(repeats, [&] {
    std::memcpy(dst2.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst2.data()) : "memory");  // keep the copy
  });
  if (!ok || std::memcmp(dst.data(), src.data(), bytes) != 0) {
    std::fprintf(stderr, "bench: retrieve returned wrong bytes\n");
    return 1;
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  const nlohmann::json params = {{"chunk_bytes", bytes}, {"tokens", tokens}, {"layers", spec.num_layers},
                                 {"kv_heads", spec.num_kv_heads}, {"head_dim", spec.head_dim},
                                 {"dtype", spec.dtype == KDN_DTYPE_BF16 ? "bf16" : "f32"}, {"repeats", repeats}};
  out.Add(name, gb / (retrieve_ms / 1e3), "GB/s", params, "memcpy_gbps", gb / (memcpy_ms / 1e3));
  return 0;
}

}  // namespace

int RunFoundation(const FoundationOptions& o) {
  const int repeats = o.repeats > 0 ? o.repeats : (o.quick ? 5 : 30);
  auto m = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/true);
  if (!m.ok()) {
    std::fprintf(stderr, "kdn bench foundation: %s\n", m.status().message().c_str());
    return 2;
  }
  std::printf("kdn bench foundation: %s, %d repeats per measure (medians)\n", m->description.c_str(), repeats);
  Records records;
  if (int rc = Ttft(*m, repeats, records); rc != 0) return rc;

  // Llama-3-8B: 32 layers x 8 KV heads x 128 dims x bf16 x 256 tokens = 32 MiB.
  kdn_model_spec llama = KDN_MODEL_SPEC_INIT;
  llama.num_layers = 32;
  llama.num_kv_heads = 8;
  llama.head_dim = 128;
  llama.dtype = KDN_DTYPE_BF16;
  llama.rope_theta = 500000.0f;
  llama.fingerprint = "bench:llama-3-8b-shape";
  llama.fingerprint_len = std::strlen(llama.fingerprint);
  if (int rc = HostRetrieve("host_retrieve_gbps_8b", llama, 256, repeats, records); rc != 0) return rc;

  const model::ModelConfig& c = m->weights->config();
  kdn_model_spec ref = KDN_MODEL_SPEC_INIT;
  ref.num_layers = static_cast<std::uint32_t>(c.n_layers);
  ref.num_kv_heads = static_cast<std::uint32_t>(c.n_kv_heads);
  ref.head_dim = static_cast<std::uint32_t>(c.head_dim());
  ref.dtype = KDN_DTYPE_F32;
  ref.fingerprint = "bench:stories260K-shape";
  ref.fingerprint_len = std::strlen(ref.fingerprint);
  if (int rc = HostRetrieve("host_retrieve_gbps_ref", ref, 256, repeats, records); rc != 0) return rc;

  return records.Finish(o.json_path, "kdn bench foundation");
}

}  // namespace kdn::bench
