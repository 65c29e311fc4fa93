// SPDX-License-Identifier: Apache-2.0
// `kdn llama`; see llama_command.h.
#include "llama_command.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "connector.h"
#include "llama_session.h"

namespace kdn::llamacpp {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "kdn llama: %s\n", why.c_str());
  return 2;
}

}  // namespace

int RunLlama(const LlamaCommandOptions& o) {
  SessionOptions so;
  so.gguf = o.gguf.empty() ? KDN_GGUF_PATH : o.gguf;
  so.backend_dir = KDN_LLAMACPP_LIBDIR;
  so.flash_attn = o.flash_attn;
  so.f16_cache = o.f16;
  auto cold = Session::Load(so);
  if (!cold.ok()) return Fail(cold.status().message());
  const std::string text_path = o.text.empty() ? KDN_TEXTS_DIR "/heldout.txt" : o.text;
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return Fail("cannot read the text '" + text_path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto all = (*cold)->Tokenize(text);
  if (!all.ok()) return Fail(all.status().message());
  const std::uint32_t ctx = so.n_ctx;
  if (o.tokens < 2 || o.tokens + static_cast<std::uint32_t>(o.steps) > ctx || all->size() < o.tokens) {
    return Fail("--tokens " + std::to_string(o.tokens) + " and --steps " + std::to_string(o.steps) +
                " must fit the context of " + std::to_string(ctx) + " and the text's " + std::to_string(all->size()) +
                " tokens");
  }
  const std::vector<std::int32_t> prompt(all->begin(), all->begin() + o.tokens);

  // The runtime: one host tier, or one disk tier.
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  kdn_tier_config tier = KDN_TIER_CONFIG_INIT;
  if (!o.disk.empty()) {
    tier.kind = KDN_TIER_DISK;
    tier.path = o.disk.c_str();
    tier.path_len = o.disk.size();
  }
  tier.codec = o.codec.c_str();
  tier.codec_len = o.codec.size();
  ro.tiers = &tier;
  ro.num_tiers = 1;
  kdn_runtime* rt = nullptr;
  if (kdn_runtime_create(&ro, &rt) != KDN_OK) return Fail(kdn_last_error_message());
  CacheLayout layout;  // a model with sliding-window layers keeps them as kdn's layer groups
  auto spec = ModelSpecFor(**cold, so.gguf, &layout);
  kdn_model* model = nullptr;
  if (!spec.ok() || kdn_model_create(rt, &*spec, &model) != KDN_OK) {
    kdn_runtime_destroy(rt);
    return Fail(spec.ok() ? kdn_last_error_message() : spec.status().message());
  }
  int rc = 0;
  nlohmann::json j;
  [&] {
    // Cold: prefill, the first token; then the continuation; then kdn keeps the KV.
    Connector save(**cold, model, "kdn-llama", layout);
    double t0 = NowMs();
    if (Status s = save.Prefill(prompt); !s.ok()) {
      rc = Fail(s.message());
      return;
    }
    const std::int32_t first_cold = (*cold)->Argmax();
    const double ttft_cold = NowMs() - t0;
    // Saved right after the prefill: a model with sliding-window layers
    // keeps only the window's KV, which the continuation moves on.
    t0 = NowMs();
    auto cached = save.Save(prompt);
    const double save_ms = NowMs() - t0;
    auto ids_cold = (*cold)->Greedy(o.steps);
    if (!ids_cold.ok() || !cached.ok()) {
      rc = Fail(!ids_cold.ok() ? ids_cold.status().message() : cached.status().message());
      return;
    }
    // With kdn: a new context restores the cached prefix and decodes the rest.
    auto warm = Session::Load(so);
    if (!warm.ok()) {
      rc = Fail(warm.status().message());
      return;
    }
    Connector load(**warm, model, "kdn-llama", layout);
    t0 = NowMs();
    auto restored = load.Restore(prompt);
    const double restore_ms = NowMs() - t0;
    if (!restored.ok()) {
      rc = Fail(restored.status().message());
      return;
    }
    const std::vector<std::int32_t> rest(prompt.begin() + static_cast<std::ptrdiff_t>(restored->tokens), prompt.end());
    if (Status s = load.Prefill(rest); !s.ok()) {
      rc = Fail(s.message());
      return;
    }
    const std::int32_t first_warm = (*warm)->Argmax();
    const double ttft_warm = NowMs() - t0;
    auto ids_warm = (*warm)->Greedy(o.steps);
    const bool identical = ids_warm.ok() && *ids_warm == *ids_cold && first_warm == first_cold;
    std::printf("llama.cpp (%s, %s cache, flash attention %s), %u prompt tokens, %s tier%s\n", so.gguf.c_str(),
                o.f16 ? "f16" : "f32", o.flash_attn ? "on" : "off", o.tokens, o.disk.empty() ? "host" : "disk",
                o.codec.empty() ? "" : (" (" + o.codec + ")").c_str());
    std::printf("  TTFT cold (prefill):        %8.2f ms\n", ttft_cold);
    std::printf("  TTFT with kdn:              %8.2f ms (restore of %llu tokens %.2f ms, then %zu decoded)\n",
                ttft_warm, static_cast<unsigned long long>(restored->tokens), restore_ms, rest.size());
    std::printf("  speedup:                    %8.2fx\n", ttft_cold / ttft_warm);
    // kdn's own account: the restored tokens priced at the prefill rate
    // llama.cpp showed (Connector::Prefill reports every decode it times).
    kdn_stats st = KDN_STATS_INIT;
    const double saved_ms = kdn_runtime_get_stats(rt, &st) == KDN_OK ? static_cast<double>(st.ttft_saved_ns) / 1e6 : 0;
    std::printf("  TTFT saved, as kdn counts:  %8.2f ms (%llu tokens served x %.2f us/token measured)\n", saved_ms,
                static_cast<unsigned long long>(st.tokens_served),
                st.prefill_tokens > 0 ? static_cast<double>(st.prefill_ns) / 1e3 / static_cast<double>(st.prefill_tokens) : 0.0);
    std::printf("  stored after prefill:       %8.2f ms (%llu tokens cached)\n", save_ms,
                static_cast<unsigned long long>(*cached));
    std::printf("  continuation of %d tokens identical: %s%s\n", o.steps, identical ? "yes" : "no",
                restored->lossy ? " (the KV came through a lossy codec)" : "");
    j = {{"prompt_tokens", o.tokens},     {"steps", o.steps},         {"flash_attn", o.flash_attn},
         {"cache", o.f16 ? "f16" : "f32"}, {"tier", o.disk.empty() ? "host" : "disk"},
         {"codec", o.codec},               {"ttft_cold_ms", ttft_cold}, {"ttft_kdn_ms", ttft_warm},
         {"restore_ms", restore_ms},       {"restored_tokens", restored->tokens},
         {"save_ms", save_ms},             {"identical", identical},  {"lossy", restored->lossy},
         {"ttft_saved_kdn_ms", saved_ms}};
    // Lossless KV must continue exactly as prefill does.
    if (!identical && !restored->lossy) rc = 1;
  }();
  kdn_model_destroy(model);
  kdn_runtime_destroy(rt);
  if (rc == 0 && !o.json.empty()) {
    std::ofstream out(o.json);
    out << j.dump(2) << "\n";
    if (!out) return Fail("cannot write " + o.json);
  }
  return rc;
}

LlamaCommand::LlamaCommand(CLI::App& app) {
  cmd_ = app.add_subcommand("llama", "A prompt on llama.cpp with the reference GGUF: TTFT cold and with kdn");
  cmd_->add_option("--gguf", options_.gguf, "model file (default: the reference model's GGUF the build made)");
  cmd_->add_option("--text", options_.text, "text whose first tokens are the prompt (default: bench/texts/heldout.txt)");
  cmd_->add_option("--tokens", options_.tokens, "prompt tokens, BOS included")->capture_default_str();
  cmd_->add_option("--steps", options_.steps, "continuation compared")->capture_default_str()->check(
      CLI::Range(1, 256));
  cmd_->add_flag("--flash-attn", options_.flash_attn, "flash attention on");
  cmd_->add_flag("--f16", options_.f16, "f16 KV cache (default f32)");
  cmd_->add_option("--disk", options_.disk, "keep the KV in a disk tier in this directory (default: a host tier)");
  cmd_->add_option("--codec", options_.codec, "the tier's codec (e.g. kdn:balanced; default: the tier's own)");
  cmd_->add_option("--json", options_.json, "write the figures as one JSON object");
}

}  // namespace kdn::llamacpp
