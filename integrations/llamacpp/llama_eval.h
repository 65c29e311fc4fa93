// SPDX-License-Identifier: Apache-2.0
// A tier codec's quality inside llama.cpp, by codec::Evaluate's protocol
// (lab/codec/eval.h) with llama.cpp as the engine: per context of N
// positions (a window of the token stream, BOS first), the original run
// prefills N-1 positions; the restored run gets those positions' KV from kdn
// through the connector (a host tier with the codec, chunks of N tokens, so
// a context is one encoded chunk); both then decode the last context token
// and the original's greedy continuation g1..g(K-1) in one batch, and at
// each of the K positions KL(original || restored) of the next-token
// distributions (nats) and whether the argmaxes agree are taken. The cache
// is f16 (as the reference figures hold the KV), flash attention off.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llama_session.h"
#include "core/util/status.h"

namespace kdn::llamacpp {

struct LlamaKlOptions {
  int context = 256;         // N
  int continue_tokens = 64;  // K
  int contexts = 4;          // windows of the stream, from its start
  std::string codec;         // the host tier's codec ("raw": lossless)
};

struct LlamaKlResult {
  int contexts = 0;
  double kl_mean = 0;         // over every continued position of every context
  double top1_agreement = 0;
  std::uint64_t restored_tokens = 0;  // summed over contexts (N-1 each when all restore)
};

Result<LlamaKlResult> LlamaCodecKl(const std::string& gguf, const std::vector<std::int32_t>& stream,
                                   const LlamaKlOptions& options);

// Naive reuse of a document's KV at another offset (no selective
// recompute): per trial, a prefix P (BOS first) and a document D from the
// stream. The full run prefills P then D (all but D's last token); the naive
// run prefills P alone, takes D's KV as computed alone (BOS, D; from
// llama.cpp's own saved state), drops its BOS, shifts it to follow P
// (llama_memory_seq_add: keys re-rotated) and copies it into the sequence
// (through a second sequence of a unified cache). Both then decode D's last
// token and the full run's greedy continuation; KL(full || naive) at each of
// the K positions. f32 cache, flash attention off. With a prefix of BOS
// alone the shift is 0 and the runs are the same computation.
struct NaiveReuseOptions {
  int prefix = 96;           // |P|, BOS included
  int document = 128;        // |D|
  int continue_tokens = 32;  // K
  int trials = 2;
};
struct NaiveReuseResult {
  int trials = 0;
  double kl_mean = 0;
  double top1_agreement = 0;
};
Result<NaiveReuseResult> NaiveReuseKl(const std::string& gguf, const std::vector<std::int32_t>& stream,
                                      const NaiveReuseOptions& options);

// RAG inside llama.cpp: a prompt of BOS, D documents of L tokens (windows
// of the stream, placed in `order`) and a question-like suffix of Q tokens
// (the stream's next tokens), served from each document's KV computed alone
// (BOS, then the document, in a context of its own) and kept in kdn (stored
// through the connector, a host tier, lossless), with the first k tokens of
// every document decoded again in context: EPIC / LegoLink's rule (a chunk
// computed alone puts its attention sink on its first tokens; those tokens,
// recomputed, attend to everything placed before them). k = 0 is naive
// reuse; k = L recomputes every document (it is full prefill, in pieces).
//
// The blended run, document by document at its place p (BOS at 0, document
// i at 1 + i·L): decode its first k tokens at positions p .. p+k-1 (explicit
// positions; llama.cpp's mask is by position, so they see the KV before
// them); restore its stored KV into a second sequence (RestoreInto), drop
// the cells of its BOS and of the k recomputed tokens (llama_memory_seq_rm),
// shift the rest to p+k .. p+L-1 (llama_memory_seq_add; keys re-rotated at
// the next decode) and copy them into the request's sequence. Then the
// suffix. llama.cpp refuses a batch that does not start right after its
// sequence's last position, so the recomputed tokens cannot be decoded in
// one batch after every document is placed; placing the documents in turn
// gives the same attention. The BOS is the first document's (position 0,
// the same in every run) when k = 0, else decoded first.
//
// Quality, by NaiveReuseKl's protocol: the full run prefills all but the
// prompt's last token; the blended run is built with the suffix but its last
// token; both decode that token and the full run's greedy continuation
// g1..g(K-1), KL(full || blend) and top-1 agreement at each of the K
// positions. TTFT: the whole prompt, full prefill (one batch) against the
// blended run (restores, shifts, the recomputed tokens and the suffix, up to
// the first token's argmax), interleaved full, blend, full, ... per trial
// and k (one warm-up pair first), medians. f32 cache, flash attention off.
struct RagBlendOptions {
  int documents = 4;         // D
  int document = 64;         // L
  int suffix = 8;            // Q
  int continue_tokens = 32;  // K
  int trials = 2;            // prompts, consecutive stretches of the stream
  std::vector<int> recompute = {0};  // the k values, each on every prompt
  // The m of each point (empty: 0): the last m tokens of each document
  // decoded again too, after the rest of it is placed (the tokens right
  // before the next document or the question).
  std::vector<int> recompute_last;
  std::vector<int> order;    // the documents' order in the prompt (a permutation of 0..D-1; empty: as taken)
  int timing_runs = 1;       // TTFT pairs per trial and k (0: none)
};
struct RagBlendPoint {
  int k = 0;
  int m = 0;  // last tokens of each document recomputed
  double kl_mean = 0;
  double top1_agreement = 0;
  double ttft_full_ms = 0, ttft_blend_ms = 0;  // medians over trials x runs
  std::uint64_t recomputed_tokens = 0;          // per prompt: D · (min(k, L) + min(m, L - min(k, L)))
  bool first_token_same = true;  // the blended run's first token is full prefill's, every trial
  bool greedy_same = true;       // and its K greedy ids, every trial
};
struct RagBlendResult {
  int trials = 0;
  std::uint64_t prompt_tokens = 0;  // 1 + D·L + Q
  std::vector<RagBlendPoint> points;  // one per k, in the options' order
};
// Sequence 0 of `s` as RagBlendKl's blended run: BOS, `docs` in that order
// (each restored from kdn through `kdn`, where it is stored as BOS then the
// document, computed alone) with the first k and the last m tokens of each
// decoded again in place, then `tail` decoded (none if empty; the last
// decoded token's logits are kept). Sequence 1 is used for the moves.
class Connector;
Status BuildBlend(Session& s, Connector& kdn, const std::vector<std::vector<std::int32_t>>& docs, std::size_t k,
                  std::size_t m, const std::vector<std::int32_t>& tail);

Result<RagBlendResult> RagBlendKl(const std::string& gguf, const std::vector<std::int32_t>& stream,
                                  const RagBlendOptions& options);

}  // namespace kdn::llamacpp
