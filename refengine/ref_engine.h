// SPDX-License-Identifier: Apache-2.0
// The reference engine: the reference transformer wired to kdn through the C
// ABI (and nothing else of kdn), as a serving engine would be. It prefills
// and stores documents, and answers a prompt cold (full prefill) or warm
// (lookup + retrieve + prefill of the rest), timing each. The demo and the
// benchmarks use it.
// Thread-safety: one thread at a time.
#pragma once

// RefEngine::Blended uses the experimental blending calls (kdn_kv_blend).
#ifndef KDN_EXPERIMENTAL
#define KDN_EXPERIMENTAL
#endif
#include "kdn/kdn.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "lab/model/transformer.h"
#include "refengine/model_loader.h"
#include "core/util/status.h"

namespace kdn::refengine {

// Status of a failed C ABI call, with its message (its code, when kdn has
// one, is the same number).
Status FromKdn(kdn_status status, const std::string& what);

struct Answer {
  std::uint64_t reused_tokens = 0;  // tokens whose KV came from kdn
  double ttft_ms = 0;               // request start to first-token logits
  double lookup_ms = 0, retrieve_ms = 0, prefill_ms = 0;
  int first_token = -1;
  std::vector<int> continuation;  // greedy tokens after the prompt (first_token first)
  std::vector<float> step_logits;   // the logits each continuation token was chosen from ([steps][vocab])
  double decode_ms = 0;             // the greedy steps after the first token
  double engine_ms = 0;             // the transformer's own work: prefill (Blended: its layers) and decoding
  std::uint64_t cached_after = 0;  // Serve: the leading tokens cached after its store
};

class RefEngine {
 public:
  // Registers the model with `runtime` (borrowed for the call: the engine's
  // kdn_model holds its own reference on the runtime). `model` is borrowed
  // and must outlive the engine.
  static Result<std::unique_ptr<RefEngine>> Create(const LoadedModel& model, kdn_runtime* runtime, int threads = 0);
  ~RefEngine();
  RefEngine(const RefEngine&) = delete;
  RefEngine& operator=(const RefEngine&) = delete;

  const model::ModelConfig& config() const { return transformer_.config(); }
  // The engine's kdn_model (owned by the engine), for calls it does not wrap
  // (kdn_knowledge_pin, ...).
  kdn_model* model() const { return model_; }

  // Prefills `tokens` and stores their KV under `ns` (kdn_kv_store).
  // Returns the leading tokens cached after the call.
  Result<std::uint64_t> Ingest(const std::string& ns, const std::vector<int>& tokens);
  // Full prefill, then `steps` - 1 greedy decode steps after the first token.
  Result<Answer> Cold(const std::vector<int>& tokens, int steps);
  // kdn_kv_lookup + kdn_kv_retrieve, prefill of the rest, then greedy decoding.
  Result<Answer> Warm(const std::string& ns, const std::vector<int>& tokens, int steps);
  // What a serving engine does with each prompt: Warm, then, after the first
  // token, kdn_kv_store of the prompt's KV when kdn did not serve all of it
  // (the chunks kdn holds already are skipped), then decoding.
  Result<Answer> Serve(const std::string& ns, const std::vector<int>& tokens, int steps);

  // Prefills `tokens` alone (from position 0) and puts them as a knowledge
  // item `doc_id` (kdn_knowledge_put).
  Status PutDocument(const std::string& ns, const std::string& doc_id, const std::vector<int>& tokens);
  // Teacher forcing, for quality measurements: the next answer's decode
  // steps feed `tokens` (another run's continuation, its first token first)
  // instead of their own choices, so that its step_logits line up with that
  // run's; its continuation is still its own argmax at each step. Used up by
  // the next call that decodes.
  void ForceContinuation(std::vector<int> tokens) { forced_ = std::move(tokens); }
  // A document's tokens (kdn_knowledge_fetch without KV).
  Result<std::vector<int>> DocumentTokens(const std::string& ns, const std::string& doc_id);
  // The same with the document's version and metadata; *prefill_ns and
  // *put_ns (if given) get the forward pass's and kdn_knowledge_put's wall
  // time. `before_put` (if given) runs between the two; a status it returns
  // that is not OK is returned and nothing is put.
  Status PutDocument(const std::string& ns, const std::string& doc_id, std::uint64_t version,
                     const std::string& metadata, std::span<const int> tokens, std::uint64_t* prefill_ns,
                     std::uint64_t* put_ns, const std::function<Status()>& before_put = {});
  // The forward pass over `tokens` from position 0 and nothing else (what
  // PutDocument costs without kdn): its wall time in ns.
  Result<std::uint64_t> PrefillOnly(std::span<const int> tokens);
  // A RAG prompt: BOS, the documents in this order, then `question`:
  // kdn_kv_blend (the transformer recomputes the selected tokens through the
  // callback) for every position but the last, which is run to get the
  // first token; then greedy decoding. `prompt` receives the whole prompt's
  // tokens (for a cold run of the same), `report` what was recomputed.
  // How to blend (kdn_blend_options): ratio -1 is kdn's default for the
  // method; kv_pass gives kdn the transformer's K and V alone (kv_fn).
  struct BlendMethod {
    float ratio = -1.0f;
    bool kv_pass = true;
    std::uint32_t first_tokens = 0;
  };
  Result<Answer> Blended(const std::string& ns, const std::vector<std::string>& doc_ids,
                         const std::vector<int>& question, const BlendMethod& method, int steps,
                         std::vector<int>* prompt, kdn_blend_report* report);
  // CacheBlend's setting (15%, one whole check layer), as before 1.9.
  Result<Answer> Blended(const std::string& ns, const std::vector<std::string>& doc_ids,
                         const std::vector<int>& question, double ratio, int steps, std::vector<int>* prompt,
                         kdn_blend_report* report) {
    return Blended(ns, doc_ids, question, BlendMethod{static_cast<float>(ratio), false, 0}, steps, prompt, report);
  }

 private:
  RefEngine(const LoadedModel& model, int threads);
  // The cache as one kdn_kv_view: [layer][k|v][pos][kv_head][head_dim] with
  // room for the model's whole context; view token i is position i.
  kdn_kv_view View(model::KvCache& cache) const;
  Status Decode(model::KvCache& cache, int pos, int steps, Answer* answer);
  // Warm, and with `store` Serve.
  Result<Answer> WarmThenMaybeStore(const std::string& ns, const std::vector<int>& tokens, int steps, bool store);
  // The transformer's forward pass over `tokens` from `pos`, timed and
  // reported to kdn (kdn_model_report_prefill): what a hit on them saves.
  Status Prefill(std::span<const int> tokens, int pos, model::KvCache& cache, std::vector<float>* logits);

  model::Transformer transformer_;
  kdn_model* model_ = nullptr;
  std::vector<float> logits_;
  std::unique_ptr<model::KvCache> cache_;  // PutDocument's and PrefillOnly's, made once
  std::vector<int> forced_;                // ForceContinuation's tokens
};

}  // namespace kdn::refengine
