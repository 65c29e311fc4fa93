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

}  // namespace kdn::llamacpp
