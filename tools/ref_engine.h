// The reference engine: the reference transformer wired to kdn through the C
// ABI, as a serving engine would be. It prefills and stores documents, and
// answers a prompt cold (full prefill) or warm (lookup + retrieve + prefill
// of the rest), timing each. The demo and the benchmarks use it.
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kdn/kdn.h"
#include "model/checkpoint.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "util/status.h"

namespace kdn::tools {

// Where the reference model is looked for: $KDN_MODELS, the build's
// configured folder, then ../shared/models.
std::string DefaultModelsDir();

// A loaded model and tokenizer, or the randomly initialised stand-in.
struct LoadedModel {
  std::unique_ptr<model::Checkpoint> weights;
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::string fingerprint;  // identifies weights and tokenizer
  bool random = false;      // true: no model file, random weights
  std::string description;
};

// Loads `model_path` / `tokenizer_path` (empty = defaults). When the default
// model is absent and `allow_random` is set, returns a random model of the
// stories260K shape with a byte-level tokenizer instead.
Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path, bool allow_random);

// Status of a failed C ABI call, with its message.
Status FromKdn(kdn_status status, const std::string& what);

struct Answer {
  std::uint64_t reused_tokens = 0;  // tokens whose KV came from kdn
  double ttft_ms = 0;               // request start to first-token logits
  double lookup_ms = 0, retrieve_ms = 0, prefill_ms = 0;
  int first_token = -1;
  std::vector<int> continuation;  // greedy tokens after the prompt (first_token first)
};

class RefEngine {
 public:
  // Registers the model with `runtime` (borrowed; must outlive the engine).
  static Result<std::unique_ptr<RefEngine>> Create(const LoadedModel& model, kdn_runtime* runtime, int threads = 0);
  ~RefEngine();
  RefEngine(const RefEngine&) = delete;
  RefEngine& operator=(const RefEngine&) = delete;

  const model::ModelConfig& config() const { return transformer_.config(); }

  // Prefills `tokens` and stores their KV under `ns`. Returns tokens cached.
  Result<std::uint64_t> Ingest(const std::string& ns, const std::vector<int>& tokens);
  // Full prefill, then `steps` - 1 greedy decode steps after the first token.
  Result<Answer> Cold(const std::vector<int>& tokens, int steps);
  // kdn lookup + retrieve, prefill of the rest, then greedy decoding.
  Result<Answer> Warm(const std::string& ns, const std::vector<int>& tokens, int steps);

  // Prefills `tokens` alone (from position 0) and puts them as a knowledge
  // item `doc_id` (kdn_knowledge_put).
  Status PutDocument(const std::string& ns, const std::string& doc_id, const std::vector<int>& tokens);
  // A RAG prompt: BOS, the documents in this order, then `question`:
  // kdn_blend (the transformer recomputes the selected tokens through the
  // callback) for every position but the last, which is run to get the
  // first token; then greedy decoding. `prompt` receives the whole prompt's
  // tokens (for a cold run of the same), `report` what was recomputed.
  Result<Answer> Blended(const std::string& ns, const std::vector<std::string>& doc_ids,
                         const std::vector<int>& question, double ratio, int steps, std::vector<int>* prompt,
                         kdn_blend_report* report);

 private:
  RefEngine(const LoadedModel& model, kdn_runtime* runtime, int threads);
  kdn_kv_buffer View(model::KvCache& cache) const;
  Status Decode(model::KvCache& cache, int pos, int steps, Answer* answer);

  model::Transformer transformer_;
  kdn_runtime* runtime_;
  kdn_model* model_ = nullptr;
  std::vector<float> logits_;
};

}  // namespace kdn::tools
