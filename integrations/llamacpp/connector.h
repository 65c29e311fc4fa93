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
// whose shape is the GGUF's (ModelSpecFor). KV that kdn cannot turn into a
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
// which must outlive the spec's use). kNotFound if the GGUF cannot be read.
Result<kdn_model_spec> ModelSpecFor(const Session& session, const std::string& gguf, std::string* fingerprint);

class Connector {
 public:
  // `session` and `model` are borrowed; `model` is the session's
  // (ModelSpecFor); `ns` the tenant namespace.
  Connector(Session& session, const kdn_model* model, std::string ns);

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

  Session& session_;
  const kdn_model* model_;
  std::string ns_;
};

}  // namespace kdn::llamacpp
