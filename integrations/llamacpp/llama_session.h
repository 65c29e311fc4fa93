// SPDX-License-Identifier: Apache-2.0
// A llama.cpp model and one context over it, through the prebuilt libllama
// that scripts/fetch-llamacpp fetches: what kdn's llama.cpp integration (the
// connector, `kdn llama`, the tests) drives. Errors are Status values; no
// llama.cpp type appears in this header.
//
// Thread-safety: a session is used by one thread at a time. Load() may be
// called from several threads; the backends are registered once per process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace kdn::llamacpp {

struct SessionOptions {
  std::string gguf;            // the model file
  std::string backend_dir;     // where libggml-cpu-*.so are (ggml_backend_load_all_from_path)
  std::uint32_t n_ctx = 512;   // context length of the session (and its batch)
  bool flash_attn = false;     // flash attention (V is then stored row-major, not transposed)
  bool f16_cache = false;      // K and V cache as f16 (else f32)
  int threads = 1;
  std::uint32_t n_seq_max = 1;  // sequences (more than 1: one unified cache, for moving KV between them)
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> Load(const SessionOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // llama.cpp's own tokenizer: BOS, then the text.
  Result<std::vector<std::int32_t>> Tokenize(const std::string& text) const;
  std::int32_t vocab_size() const;

  // Decodes `tokens` at the end of sequence 0 (one batch). With `logits`,
  // the last token's logits are kept for Argmax.
  Status Decode(const std::vector<std::int32_t>& tokens);
  // Decodes `tokens` at positions first, first + 1, ... of sequence 0 (one
  // batch with explicit positions; the last token's logits kept). llama.cpp
  // accepts only first = the sequence's largest position + 1: a batch may
  // not go back into a sequence, nor leave gaps in it.
  Status DecodeAt(const std::vector<std::int32_t>& tokens, std::int32_t first);
  // Decodes `tokens` at the end of sequence 0 and returns the logits of
  // every one of them ([tokens][vocab]).
  Result<std::vector<float>> DecodeWithLogits(const std::vector<std::int32_t>& tokens);
  // The id of the largest logit of the last decoded token.
  std::int32_t Argmax() const;
  // Time spent in llama_decode since the session was loaded (the model's
  // own work), in ns.
  std::uint64_t decode_ns() const;
  // The last decoded token's logits ([vocab]).
  std::vector<float> LastLogits() const;
  // Greedy: `steps` ids after the tokens decoded so far, the first from the
  // logits of the last decode.
  Result<std::vector<std::int32_t>> Greedy(int steps);
  // Forgets sequence 0.
  void Clear();
  // Sequence 0's saved state (llama_state_seq_get_data), and its restore
  // (llama_state_seq_set_data, which replaces the sequence; the logits are
  // not in the state: decode the next token after a restore).
  Result<std::vector<std::uint8_t>> SaveSequence() const;
  Status RestoreSequence(const std::vector<std::uint8_t>& state, std::int32_t seq = 0);
  // Cells of sequence `seq` at positions [p0, p1): removed; shifted by
  // `delta` (keys re-rotated at the next decode); copied to sequence `dst`.
  void SeqRemove(std::int32_t seq, std::int32_t p0, std::int32_t p1);
  void SeqShift(std::int32_t seq, std::int32_t p0, std::int32_t p1, std::int32_t delta);
  void SeqCopy(std::int32_t seq, std::int32_t dst, std::int32_t p0, std::int32_t p1);
  const SessionOptions& options() const;
  // The model's KV shape: layers, KV heads, head dimension.
  std::uint32_t layers() const;
  std::uint32_t kv_heads() const;
  std::uint32_t head_dim() const;
  // The model's sliding window in tokens (llama_model_n_swa; 0: none), and
  // whether it has recurrent layers (a recurrent or hybrid model).
  std::uint32_t sliding_window() const;
  bool recurrent() const;
  // A GGUF metadata value of the model as text ("" when absent).
  std::string Metadata(const std::string& key) const;

 private:
  Session() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdn::llamacpp
