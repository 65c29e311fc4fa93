// SPDX-License-Identifier: Apache-2.0
// The llama.cpp connector: what a llama.cpp host calls around its decode to
// keep the KV of the prompts it has read in kdn, through kdn's C ABI.
//
//   prefill: Prefill(tokens) decodes them in the session, timed, and tells
//     kdn how long it took (kdn_model_report_prefill), so the runtime prices
//     the tokens later restores serve at llama.cpp's measured prefill rate;
//   before prefill: Restore(prompt) puts the longest cached prefix of the
//     prompt (leaving at least its last token to decode: the logits are not
//     in llama.cpp's state) into the session's sequence 0, and says how many
//     tokens it holds; the host decodes the rest;
//   after prefill: Save(tokens) stores the sequence's KV, in whole chunks
//     and pieces, in kdn's canonical layout (so every tier, codec and
//     knowledge item applies unchanged).
//
// Chunks are keyed by tokens under a model whose fingerprint names the GGUF
// file's SHA-256, the cache's element type and the llama.cpp build, and
// whose shape is the GGUF's (ModelSpecFor). A model with sliding-window
// layers (llama.cpp's two caches) is kept as kdn's layer groups
// (CacheLayout); recurrent and latent (MLA) models are refused. KV that kdn cannot turn into a
// state this llama.cpp accepts (a blob of an unknown layout, a chunk that
// fails its checks, a restore llama.cpp refuses) is a miss: the sequence is
// cleared and the host recomputes; never wrong KV.
//
// Thread-safety: one connector per session, used by the session's thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kdn/kdn.h"
#include "llama_session.h"
#include "core/util/status.h"

namespace kdn::llamacpp {

// The kdn model spec of a session's KV (fingerprint kept in *fingerprint,
// which must outlive the spec's use). kNotFound if the GGUF cannot be read;
// kUnsupported for a model this form does not take: sliding-window layers
// (the CacheLayout form below takes them), recurrent layers (Mamba, hybrids)
// or multi-head latent attention (neither is taken yet).
Result<kdn_model_spec> ModelSpecFor(const Session& session, const std::string& gguf, std::string* fingerprint);

// How a session's llama.cpp cache maps onto kdn's layers. A model with
// sliding-window layers (Gemma 2 and 3, gpt-oss, ...) has two caches in
// llama.cpp (llama_kv_cache_iswa): its full layers', then its SWA layers'.
// kdn's layers are theirs in that order, the last swa_layers with the
// model's window (kdn_model_spec.layer_windows), so that kdn keeps them as
// layer groups (docs/model-kinds.md): a sliding layer's older chunks are
// neither stored nor loaded. What the spec points into lives here.
struct CacheLayout {
  std::string fingerprint;
  std::vector<std::uint32_t> windows;  // per kdn layer (0: full); empty: every layer full, one cache
  std::uint32_t swa_layers = 0;        // the last swa_layers of kdn's layers are llama.cpp's SWA cache
  std::uint32_t window = 0;            // their window (llama_model_n_swa): the SWA cache keeps the last `window` tokens
};
// The spec, for plain and sliding-window models. For a model with a window
// it reads how llama.cpp splits the layers by decoding one token into the
// session's sequence 0 and clearing it again: the session must be empty
// then (kInvalidArgument otherwise).
Result<kdn_model_spec> ModelSpecFor(Session& session, const std::string& gguf, CacheLayout* layout);

class Connector {
 public:
  // `session` and `model` are borrowed; `model` is the session's
  // (ModelSpecFor); `ns` the tenant namespace; `layout` the one ModelSpecFor
  // gave (a model with sliding-window layers needs it).
  Connector(Session& session, const kdn_model* model, std::string ns, CacheLayout layout = {});

  struct Restored {
    std::uint64_t tokens = 0;  // leading tokens of the prompt now in the sequence
    bool lossy = false;        // decoded from a lossy tier codec
  };
  Result<Restored> Restore(const std::vector<std::int32_t>& prompt);
  // For KV that is placed rather than continued (a RAG document's KV,
  // computed alone, then moved to its place in another sequence): restores
  // every cached token of `tokens` (none left to decode) into sequence `seq`,
  // replacing it. tokens 0: a miss, nothing restored.
  Result<Restored> RestoreInto(const std::vector<std::int32_t>& tokens, std::int32_t seq);
  // Decodes `tokens` at the sequence's next positions (the session's
  // Decode) and reports the time it took to kdn.
  Status Prefill(const std::vector<std::int32_t>& tokens);
  // Stores the KV of the sequence's first tokens.size() positions (the
  // tokens decoded so far, in order). Returns the leading tokens cached.
  Result<std::uint64_t> Save(const std::vector<std::int32_t>& tokens);

 private:
  // The cached prefix of `tokens`, at most `most` of them, into `seq`.
  Result<Restored> RestoreUpTo(const std::vector<std::int32_t>& tokens, std::uint64_t most, std::int32_t seq);

  // The session's caches as kdn's layers: [first, first + layers) each.
  struct Part {
    std::uint32_t first, layers;
  };
  std::vector<Part> Parts() const;

  Session& session_;
  const kdn_model* model_;
  std::string ns_;
  CacheLayout layout_;
};

}  // namespace kdn::llamacpp
