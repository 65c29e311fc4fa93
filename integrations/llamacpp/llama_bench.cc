// SPDX-License-Identifier: Apache-2.0
// `kdn bench llama`: TTFT in llama.cpp cold and with kdn, and a codec's KL
// inside llama.cpp beside the reference model's; see llama_command.h.
//
// TTFT: for prompts of 128, 256 and 480 tokens (the first of the held-out
// text), flash attention off and on, a host tier and a disk tier: the time
// from a request to its first token, cold (prefill) and with kdn (the
// connector's restore of all but the last token, then that token), beside
// llama.cpp's own restore of the same state (llama_state_seq_set_data of a
// blob it saved, then the last token): the connector's conversion and kdn's
// retrieve are the difference. Medians of 5 runs (1 with --quick).
// KL: llama_eval.h's protocol for kdn:balanced and kdn:hifi, beside
// codec::Evaluate on the reference model over the same contexts. Naive
// reuse of a document after a prefix, and RAG prompts of 3 and 4 documents
// served from their KV computed alone with the first k tokens of each
// decoded again (llama_eval.h, RagBlendKl): KL and TTFT against full
// prefill for k = 0 (naive), 2, 4, 8, 16, 32 and the whole document.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "core/codec/codec.h"
#include "lab/codec/eval.h"
#include "connector.h"
#include "llama_command.h"
#include "llama_eval.h"
#include "refengine/model_loader.h"

namespace kdn::llamacpp {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

nlohmann::json Record(const std::string& name, double value, const std::string& unit, nlohmann::json params,
                      const std::string& baseline = "", double baseline_value = 0) {
  nlohmann::json r = {{"name", name}, {"value", value}, {"unit", unit}, {"params", std::move(params)}};
  if (!baseline.empty()) {
    r["baseline"] = baseline;
    r["baseline_value"] = baseline_value;
    r["ratio"] = baseline_value != 0 ? value / baseline_value : 0.0;
  }
  std::printf("  %-40s %10.4f %-3s", name.c_str(), value, unit.c_str());
  if (!baseline.empty()) std::printf("  vs %-34s %10.4f  ratio %.3f", baseline.c_str(), baseline_value, value / baseline_value);
  std::printf("\n");
  return r;
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "kdn bench llama: %s\n", why.c_str());
  return 2;
}

}  // namespace

int RunLlamaBench(const LlamaBenchOptions& o) {
  const int runs = o.quick ? 1 : 5;
  nlohmann::json records = nlohmann::json::array();
  std::ifstream in(KDN_TEXTS_DIR "/heldout.txt", std::ios::binary);
  if (!in) return Fail("cannot read " KDN_TEXTS_DIR "/heldout.txt");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::filesystem::path scratch =
      std::filesystem::path(o.dir.empty() ? std::filesystem::temp_directory_path().string() : o.dir) /
      ("kdn-bench-llama-" + std::to_string(::getpid()));

  for (bool flash_attn : {false, true}) {
    SessionOptions so;
    so.gguf = KDN_GGUF_PATH;
    so.backend_dir = KDN_LLAMACPP_LIBDIR;
    so.flash_attn = flash_attn;
    auto s = Session::Load(so);
    if (!s.ok()) return Fail(s.status().message());
    auto all = (*s)->Tokenize(text);
    if (!all.ok() || all->size() < 480) return Fail("the held-out text is too short");
    for (const char* tier : {"host", "disk"}) {
      std::filesystem::remove_all(scratch);
      kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
      kdn_tier_config t = KDN_TIER_CONFIG_INIT;
      const std::string dir = scratch.string();
      if (std::string(tier) == "disk") {
        t.kind = KDN_TIER_DISK;
        t.path = dir.c_str();
        t.path_len = dir.size();
      }
      ro.tiers = &t;
      ro.num_tiers = 1;
      kdn_runtime* rt = nullptr;
      if (kdn_runtime_create(&ro, &rt) != KDN_OK) return Fail(kdn_last_error_message());
      std::string fingerprint;
      auto spec = ModelSpecFor(**s, so.gguf, &fingerprint);
      kdn_model* model = nullptr;
      if (!spec.ok() || kdn_model_create(rt, &*spec, &model) != KDN_OK) return Fail("model: " + fingerprint);
      Connector c(**s, model, "bench");
      for (std::uint32_t n : {128u, 256u, 480u}) {
        const std::vector<std::int32_t> prompt(all->begin(), all->begin() + n);
        std::vector<double> cold, warm, state;
        std::int32_t first_cold = -1;
        bool same = true;
        // llama.cpp's own state of all but the last token.
        (*s)->Clear();
        if (!(*s)->Decode(std::vector<std::int32_t>(prompt.begin(), prompt.end() - 1)).ok()) return Fail("decode");
        auto blob = (*s)->SaveSequence();
        if (!blob.ok()) return Fail(blob.status().message());
        for (int r = 0; r < runs + 1; ++r) {  // the first run warms up
          (*s)->Clear();
          double t0 = NowMs();
          if (!(*s)->Decode(prompt).ok()) return Fail("decode");
          first_cold = (*s)->Argmax();
          const double tc = NowMs() - t0;
          if (r == 0 && !c.Save(prompt).ok()) return Fail("save");
          (*s)->Clear();
          t0 = NowMs();
          auto got = c.Restore(prompt);
          if (!got.ok() || got->tokens != n - 1) return Fail("restore");
          if (!(*s)->Decode({prompt.back()}).ok()) return Fail("decode");
          same &= (*s)->Argmax() == first_cold;
          const double tw = NowMs() - t0;
          (*s)->Clear();
          t0 = NowMs();
          if (!(*s)->RestoreSequence(*blob).ok() || !(*s)->Decode({prompt.back()}).ok()) return Fail("state");
          (void)(*s)->Argmax();
          const double ts = NowMs() - t0;
          if (r > 0) {
            cold.push_back(tc);
            warm.push_back(tw);
            state.push_back(ts);
          }
        }
        const std::string suffix = std::to_string(n) + (flash_attn ? "_fa" : "") + "_" + tier;
        nlohmann::json p = {{"prompt_tokens", n},   {"flash_attn", flash_attn}, {"cache", "f32"}, {"tier", tier},
                            {"runs", runs},         {"threads", so.threads},    {"first_token_same", same},
                            {"model", "stories260K.gguf"}, {"text", "bench/texts/heldout.txt"}};
        records.push_back(Record("llama_ttft_cold_ms_" + suffix, Median(cold), "ms", p));
        records.push_back(Record("llama_ttft_kdn_ms_" + suffix, Median(warm), "ms", p, "llama_ttft_cold_ms_" + suffix,
                                 Median(cold)));
        records.push_back(Record("llama_ttft_own_state_ms_" + suffix, Median(state), "ms", p));
        p["what"] = "TTFT with kdn minus TTFT with llama.cpp's own set_data of the same state: kdn's retrieve and "
                    "the connector's conversion";
        records.push_back(Record("llama_connector_overhead_ms_" + suffix, Median(warm) - Median(state), "ms", p));
      }
      kdn_model_destroy(model);
      kdn_runtime_destroy(rt);
      std::filesystem::remove_all(scratch);
    }
  }

  // KL of lossy tier codecs inside llama.cpp, beside the reference model's.
  auto m = refengine::LoadModel("", "", /*allow_random=*/false);
  if (!m.ok()) return Fail(m.status().message());
  const int contexts = o.quick ? 2 : 8;
  std::vector<int> stream = codec::TokenizeStories(*m->tokenizer, text);
  stream.resize(std::min<std::size_t>(stream.size(), 256u * static_cast<std::size_t>(contexts)));
  for (const char* spec : {"kdn:balanced", "kdn:hifi"}) {
    LlamaKlOptions ko;
    ko.contexts = contexts;
    ko.codec = spec;
    auto llama = LlamaCodecKl(KDN_GGUF_PATH, std::vector<std::int32_t>(stream.begin(), stream.end()), ko);
    if (!llama.ok()) return Fail(llama.status().message());
    auto parsed = codec::ParseSpec(spec);
    auto c = codec::MakeCodec(*parsed);
    codec::EvalOptions eo;
    eo.context = 256;
    eo.continue_tokens = 64;
    eo.free_running = false;
    auto ref = codec::Evaluate(*m->weights, stream, **c, eo);
    if (!ref.ok()) return Fail(ref.status().message());
    std::string name = spec;
    std::replace(name.begin(), name.end(), ':', '_');
    nlohmann::json p = {{"codec", spec}, {"contexts", contexts}, {"context_tokens", 256}, {"continue_tokens", 64},
                        {"cache", "f16"}, {"flash_attn", false}, {"text", "bench/texts/heldout.txt"},
                        {"llama_top1_agreement", llama->top1_agreement},
                        {"reference_top1_agreement", ref->top1_agreement}};
    records.push_back(Record("llama_kl_" + name, llama->kl_mean, "nats", p, "reference_model_kl_" + name, ref->kl_mean));
  }
  // Naive reuse of a document's KV after another prefix (llama_eval.h).
  {
    NaiveReuseOptions no;
    no.trials = o.quick ? 1 : 4;
    std::vector<int> longer = codec::TokenizeStories(*m->tokenizer, text);
    auto naive = NaiveReuseKl(KDN_GGUF_PATH, std::vector<std::int32_t>(longer.begin(), longer.end()), no);
    if (!naive.ok()) return Fail(naive.status().message());
    nlohmann::json p = {{"prefix_tokens", no.prefix}, {"document_tokens", no.document},
                        {"continue_tokens", no.continue_tokens}, {"trials", no.trials}, {"cache", "f32"},
                        {"top1_agreement", naive->top1_agreement}, {"text", "bench/texts/heldout.txt"},
                        {"what", "KL(full prefill || a document's KV computed alone, shifted after the prefix "
                                 "with llama_memory_seq_add), no recompute"}};
    records.push_back(Record("llama_naive_reuse_kl", naive->kl_mean, "nats", p));
  }
  // RAG: documents' KV computed alone, from kdn, placed with their first k
  // tokens decoded again in context (llama_eval.h, RagBlendKl).
  {
    std::vector<int> longer = codec::TokenizeStories(*m->tokenizer, text);
    const std::vector<std::int32_t> s(longer.begin(), longer.end());
    // (documents, tokens each): 201 and 249 prompt tokens; 265 crosses
    // 256, where llama.cpp's attention widens from 256 cells to 512 (full
    // prefill then takes twice as long).
    using Shapes = std::vector<std::pair<int, int>>;
    const Shapes shapes = o.quick ? Shapes{{4, 64}} : Shapes{{3, 64}, {4, 60}, {4, 64}};
    for (const auto& [documents, document] : shapes) {
      RagBlendOptions ro;
      ro.documents = documents;
      ro.document = document;
      ro.suffix = 8;
      ro.continue_tokens = 32;
      ro.trials = o.quick ? 1 : 16;
      ro.timing_runs = o.quick ? 1 : 3;
      ro.order = documents == 4 ? std::vector<int>{2, 0, 3, 1} : std::vector<int>{2, 0, 1};
      ro.recompute = {0, 2, 4, 8, 16, 32, ro.document};
      ro.recompute_last = {0, 0, 0, 0, 0, 0, 0};
      if (!o.quick) {  // the last m tokens too, at the work of first 16 and first 32
        for (const auto& [k, m] : std::vector<std::pair<int, int>>{{0, 16}, {8, 8}, {0, 32}, {8, 24}}) {
          ro.recompute.push_back(k);
          ro.recompute_last.push_back(m);
        }
      }
      auto rag = RagBlendKl(KDN_GGUF_PATH, s, ro);
      if (!rag.ok()) return Fail(rag.status().message());
      for (const RagBlendPoint& pt : rag->points) {
        const double ratio = pt.ttft_full_ms > 0 ? pt.ttft_blend_ms / pt.ttft_full_ms : 0.0;
        nlohmann::json p = {
            {"method", pt.m > 0 ? (pt.k > 0 ? "first-k+last-m" : "last-m") : pt.k == 0 ? "naive" : "first-k"},
            {"k", pt.k},
            {"m", pt.m},
            {"documents", documents},
            {"document_tokens", ro.document},
            {"suffix_tokens", ro.suffix},
            {"prompt_tokens", rag->prompt_tokens},
            {"order", ro.order},
            {"continue_tokens", ro.continue_tokens},
            {"trials", rag->trials},
            {"timing_runs", ro.timing_runs},
            {"kl_mean", pt.kl_mean},
            {"top1_agreement", pt.top1_agreement},
            {"ttft_full_ms", pt.ttft_full_ms},
            {"ttft_blend_ms", pt.ttft_blend_ms},
            {"ttft_ratio", ratio},
            {"recomputed_tokens", pt.recomputed_tokens},
            {"recompute_fraction",
             static_cast<double>(pt.recomputed_tokens) / static_cast<double>(rag->prompt_tokens)},
            {"first_token_same", pt.first_token_same},
            {"greedy_same", pt.greedy_same},
            {"cache", "f32"},
            {"threads", 1},
            {"kv_from", "kdn host tier (the connector), each document computed alone"},
            {"text", "bench/texts/heldout.txt"},
            {"model", "stories260K.gguf"}};
        const std::string suffix = "_d" + std::to_string(documents) + "x" + std::to_string(document) + "_k" +
                                   std::to_string(pt.k) + (pt.m > 0 ? "_m" + std::to_string(pt.m) : "");
        p["what"] = "KL(full prefill || blended run) over the teacher-forced continuation";
        records.push_back(Record("llama_rag_kl" + suffix, pt.kl_mean, "nats", p));
        p["what"] = "TTFT of the blended run (restores from kdn, shifts, k tokens per document and the suffix "
                    "decoded) against full prefill of the same prompt, interleaved";
        records.push_back(Record("llama_rag_ttft_blend_ms" + suffix, pt.ttft_blend_ms, "ms", p,
                                 "llama_rag_ttft_full_ms" + suffix, pt.ttft_full_ms));
      }
    }
  }
  std::ofstream out(o.json);
  out << records.dump(2) << "\n";
  if (!out) return Fail("cannot write " + o.json);
  std::printf("wrote %s\n", o.json.c_str());
  return 0;
}

LlamaBenchCommand::LlamaBenchCommand(CLI::App& bench) {
  cmd_ = bench.add_subcommand("llama", "llama.cpp: TTFT cold and with kdn; a codec's KL inside it");
  cmd_->add_option("--json", options_.json, "output file")->required();
  cmd_->add_option("--dir", options_.dir, "scratch directory for the disk tier (default: the temp dir)");
  cmd_->add_flag("--quick", options_.quick, "one run per point, 2 KL contexts (a smoke test, not a measurement)");
}

}  // namespace kdn::llamacpp
