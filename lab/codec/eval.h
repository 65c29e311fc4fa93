// SPDX-License-Identifier: Apache-2.0
// Codec quality on the reference model (issue 4, section 4): cut a token
// stream into contexts, compute their KV with the reference transformer
// (fp32), encode and decode it with a codec, and compare the model's
// continuations from the original KV and from the decoded KV.
//
// Per context of N positions (BOS, then N-1 tokens of the text):
//  - The KV of all N positions is held in the options' dtype (f16 by
//    default, as engines hold it and the store keeps it: the fp32 KV rounded
//    to nearest even), encoded as ONE chunk (shape: layers, kv_heads,
//    head_dim, N tokens, dtype) and decoded back. The size ratios and the KL
//    come from this one encoding.
//  - Both runs start from a cache holding the first N-1 positions' KV
//    (original in the dtype, resp. decoded; as fp32 in the cache: a lossless
//    codec gives KL 0), run the last context token again at position
//    N-1 (its KV is computed fresh), and continue for K tokens; every
//    continued position's KV is computed fresh in both runs.
//  - Teacher-forced (KL, top-1): the original run decodes greedily (tokens
//    g1..gK); the decoded run is fed g1..g(K-1), so both runs predict the same
//    K positions. At each, KL(original || decoded) of softmax(logits) in nats
//    (double), and whether the argmaxes agree.
//  - Free-running (greedy): a second decoded run feeds its own greedy tokens;
//    the fraction of positions where its token equals the original's.
// Thread-safety: Evaluate is reentrant (each call builds its own transformer).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/codec/codec.h"
#include "lab/model/checkpoint.h"
#include "lab/model/tokenizer.h"
#include "lab/model/transformer.h"
#include "core/util/status.h"

namespace kdn::codec {

struct EvalOptions {
  int context = 448;         // N: positions per context, BOS included
  int continue_tokens = 64;  // K: continued positions compared per context
  std::uint32_t dtype = 1;   // the KV as encoded: 1 f16 (as stored), 0 f32 (Shape::dtype)
  bool free_running = true;  // false: no free-running runs (a third less work); greedy_agreement is -1
};

struct EvalResult {
  std::string codec;  // the codec's spec
  int contexts = 0;
  std::uint32_t dtype = 1;   // the KV's dtype as encoded
  double ratio_vs_fp16 = 0;  // (elements * 2) / encoded_bytes
  double ratio_vs_fp32 = 0;  // (elements * 4) / encoded_bytes
  double kl_mean = 0;        // nats, over every continued position of every context
  double kl_p95 = 0;         // nearest-rank 95th percentile of the same values
  double top1_agreement = 0;    // teacher-forced
  double greedy_agreement = 0;  // free-running (-1: not measured)
  std::uint64_t encoded_bytes = 0, fp16_bytes = 0, fp32_bytes = 0;
};

// One run from a cache whose positions [0, n-1) hold a context's KV: runs
// `last_token` at n-1, then continues for k positions. With `forced` (k-1
// tokens) it feeds those (teacher forcing); otherwise its own greedy tokens.
// Returns the logits of the k predicted positions ([k][vocab]) and its
// greedy tokens.
Status Continue(model::Transformer& t, model::KvCache& cache, int last_token, int n, int k,
                const std::vector<int>* forced, std::vector<float>* all_logits, std::vector<int>* greedy);

// KL(softmax(a) || softmax(b)) in nats, in double (also used by the blend
// evaluation).
double KlDivergence(std::span<const float> a, std::span<const float> b);

// The token stream of a text of stories, as llama2.c prepares TinyStories:
// paragraphs (separated by blank lines) are trimmed and encoded one by one,
// each with BOS first, and concatenated. (Encoding paragraph by paragraph also
// keeps the tokenizer's quadratic merge loop short.)
std::vector<int> TokenizeStories(const model::Tokenizer& tokenizer, std::string_view text);

// `text_tokens` is the text's token stream (e.g. Tokenizer::Encode(text,
// true)). It is cut into floor(size / N) windows of N tokens; context i is
// window i with its first token replaced by BOS (so a stream that starts with
// BOS keeps its first window as is). kInvalidArgument when N < 2, K < 1,
// N + K > the model's seq_len, the dtype is neither f32 nor f16, the stream is shorter than N or holds ids
// outside the vocabulary; a codec's failure is returned as is.
Result<EvalResult> Evaluate(const model::Checkpoint& weights, const std::vector<int>& text_tokens, const Codec& codec,
                            const EvalOptions& options);

}  // namespace kdn::codec
