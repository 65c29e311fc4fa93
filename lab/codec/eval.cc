// SPDX-License-Identifier: Apache-2.0
#include "lab/codec/eval.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "kernels/common/half.h"
#include "lab/model/tokenizer.h"
#include "lab/model/transformer.h"

namespace kdn::codec {
namespace {

// fp32 KV in `dtype` (0 f32, 1 f16: round to nearest even) as bytes.
Bytes ToDtype(const std::vector<float>& kv, std::uint32_t dtype) {
  Bytes out(kv.size() * (dtype == 1 ? 2 : 4));
  if (dtype == 0) {
    std::memcpy(out.data(), kv.data(), out.size());
    return out;
  }
  for (size_t i = 0; i < kv.size(); ++i) {
    const std::uint16_t h = kernels::float_to_half(kv[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// The reverse of ToDtype (exact: every half is a float).
void FromDtype(const Bytes& in, std::uint32_t dtype, std::vector<float>* kv) {
  if (dtype == 0) {
    std::memcpy(kv->data(), in.data(), kv->size() * sizeof(float));
    return;
  }
  for (size_t i = 0; i < kv->size(); ++i) {
    std::uint16_t h;
    std::memcpy(&h, in.data() + 2 * i, 2);
    (*kv)[i] = kernels::half_to_float(h);
  }
}

}  // namespace

Status Continue(model::Transformer& t, model::KvCache& cache, int last_token, int n, int k,
                const std::vector<int>* forced, std::vector<float>* all_logits, std::vector<int>* greedy) {
  const size_t vocab = static_cast<size_t>(t.config().vocab_size);
  all_logits->assign(static_cast<size_t>(k) * vocab, 0.0f);
  greedy->clear();
  std::vector<float> logits;
  int in = last_token;
  for (int j = 0; j < k; ++j) {
    const int pos = n - 1 + j;
    KDN_RETURN_IF_ERROR(t.Forward(std::span<const int>(&in, 1), pos, cache, &logits));
    std::copy(logits.begin(), logits.end(), all_logits->begin() + static_cast<std::ptrdiff_t>(j * vocab));
    const int next = model::Argmax(logits);
    greedy->push_back(next);
    if (j + 1 < k) in = forced ? (*forced)[static_cast<size_t>(j)] : next;
  }
  return Status::Ok();
}

double KlDivergence(std::span<const float> a, std::span<const float> b) {
  const size_t n = a.size();
  double max_a = -INFINITY, max_b = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    max_a = std::max(max_a, static_cast<double>(a[i]));
    max_b = std::max(max_b, static_cast<double>(b[i]));
  }
  double sum_a = 0, sum_b = 0;
  for (size_t i = 0; i < n; ++i) {
    sum_a += std::exp(static_cast<double>(a[i]) - max_a);
    sum_b += std::exp(static_cast<double>(b[i]) - max_b);
  }
  const double lse_a = max_a + std::log(sum_a), lse_b = max_b + std::log(sum_b);
  double kl = 0;
  for (size_t i = 0; i < n; ++i) {
    const double la = static_cast<double>(a[i]) - lse_a;  // log p_i
    const double lb = static_cast<double>(b[i]) - lse_b;  // log q_i
    kl += std::exp(la) * (la - lb);
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative
}

std::vector<int> TokenizeStories(const model::Tokenizer& tokenizer, std::string_view text) {
  std::vector<int> out;
  auto flush = [&](std::string_view para) {
    const size_t b = para.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return;
    const size_t e = para.find_last_not_of(" \t\r\n");
    const std::vector<int> ids = tokenizer.Encode(para.substr(b, e - b + 1), /*bos=*/true);
    out.insert(out.end(), ids.begin(), ids.end());
  };
  // Lines accumulate into a paragraph until a line holding only blanks.
  size_t para = 0, pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const size_t line_end = nl == std::string_view::npos ? text.size() : nl;
    if (text.substr(pos, line_end - pos).find_first_not_of(" \t\r") == std::string_view::npos) {
      flush(text.substr(para, pos - para));
      para = line_end;
    }
    pos = line_end + 1;
  }
  if (para < text.size()) flush(text.substr(para));
  return out;
}

Result<EvalResult> Evaluate(const model::Checkpoint& weights, const std::vector<int>& text_tokens, const Codec& codec,
                            const EvalOptions& options) {
  const model::ModelConfig& c = weights.config();
  const int n = options.context, k = options.continue_tokens;
  if (n < 2) return Status::InvalidArgument("the context must hold at least 2 tokens (BOS and one more), got " +
                                            std::to_string(n));
  if (k < 1) return Status::InvalidArgument("at least 1 continued token is needed, got " + std::to_string(k));
  if (options.dtype > 1) {
    return Status::InvalidArgument("the KV is encoded as f32 (0) or f16 (1), got dtype " +
                                   std::to_string(options.dtype));
  }
  if (static_cast<std::int64_t>(n) + k > c.seq_len) {
    return Status::InvalidArgument("context " + std::to_string(n) + " + continue " + std::to_string(k) +
                                   " exceeds the model's context of " + std::to_string(c.seq_len) + " tokens");
  }
  if (text_tokens.size() < static_cast<size_t>(n)) {
    return Status::InvalidArgument("the text has " + std::to_string(text_tokens.size()) +
                                   " tokens, fewer than one context of " + std::to_string(n));
  }
  for (int id : text_tokens) {
    if (id < 0 || id >= c.vocab_size) {
      return Status::InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary of " +
                                     std::to_string(c.vocab_size));
    }
  }

  const int contexts = static_cast<int>(text_tokens.size() / static_cast<size_t>(n));
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  const Shape shape{static_cast<std::uint32_t>(c.n_layers), static_cast<std::uint32_t>(c.n_kv_heads),
                    static_cast<std::uint32_t>(c.head_dim()), static_cast<std::uint32_t>(n), options.dtype};

  EvalResult r;
  r.codec = codec.spec().ToString();
  r.dtype = options.dtype;
  r.contexts = contexts;
  model::Transformer t(weights);
  model::KvCache cache = t.NewCache();
  std::vector<double> kls;
  kls.reserve(static_cast<size_t>(contexts) * static_cast<size_t>(k));
  std::uint64_t top1 = 0, greedy = 0;
  std::vector<float> original(static_cast<size_t>(shape.elements())), decoded(original.size());
  Bytes decoded_bytes(shape.bytes());
  std::vector<float> logits_o, logits_d, logits_f;
  std::vector<int> greedy_o, greedy_d, greedy_f;

  for (int ci = 0; ci < contexts; ++ci) {
    std::vector<int> ctx(text_tokens.begin() + static_cast<std::ptrdiff_t>(ci) * n,
                         text_tokens.begin() + static_cast<std::ptrdiff_t>(ci + 1) * n);
    ctx[0] = model::kBos;
    KDN_RETURN_IF_ERROR(t.Forward(ctx, 0, cache, nullptr));
    // The KV as held: canonical [layer][k|v][token][kv_dim] in the dtype.
    const Bytes held = ToDtype(cache.Export(0, n), options.dtype);
    FromDtype(held, options.dtype, &original);

    Result<Bytes> encoded = codec.Encode(shape, held.data());
    if (!encoded.ok()) return encoded.status();
    std::fill(decoded_bytes.begin(), decoded_bytes.end(), std::uint8_t{0});
    KDN_RETURN_IF_ERROR(codec.Decode(shape, encoded->data(), encoded->size(), decoded_bytes.data()));
    FromDtype(decoded_bytes, options.dtype, &decoded);
    r.encoded_bytes += encoded->size();
    r.fp16_bytes += shape.elements() * 2;
    r.fp32_bytes += shape.elements() * 4;

    // The original run: greedy, from the original KV of positions [0, n-1)
    // (position n-1 is recomputed, as in the decoded runs).
    KDN_RETURN_IF_ERROR(cache.Import(0, n, original));
    KDN_RETURN_IF_ERROR(Continue(t, cache, ctx.back(), n, k, nullptr, &logits_o, &greedy_o));
    // The decoded run, teacher-forced with the original's tokens.
    KDN_RETURN_IF_ERROR(cache.Import(0, n, decoded));
    KDN_RETURN_IF_ERROR(Continue(t, cache, ctx.back(), n, k, &greedy_o, &logits_d, &greedy_d));
    // The decoded run, free-running: it equals the teacher-forced one until
    // the first disagreement, so it is only run when there is one.
    bool diverged = false;
    for (int j = 0; j < k; ++j) {
      const size_t at = static_cast<size_t>(j) * vocab;
      kls.push_back(KlDivergence(std::span<const float>(logits_o).subspan(at, vocab),
                                 std::span<const float>(logits_d).subspan(at, vocab)));
      if (greedy_o[static_cast<size_t>(j)] == greedy_d[static_cast<size_t>(j)]) {
        ++top1;
      } else {
        diverged = true;
      }
    }
    if (!options.free_running) continue;
    if (diverged) {
      KDN_RETURN_IF_ERROR(cache.Import(0, n, decoded));
      KDN_RETURN_IF_ERROR(Continue(t, cache, ctx.back(), n, k, nullptr, &logits_f, &greedy_f));
    } else {
      greedy_f = greedy_o;
    }
    for (int j = 0; j < k; ++j) greedy += greedy_o[static_cast<size_t>(j)] == greedy_f[static_cast<size_t>(j)];
  }

  const double positions = static_cast<double>(kls.size());
  double sum = 0;
  for (double v : kls) sum += v;
  r.kl_mean = sum / positions;
  std::sort(kls.begin(), kls.end());
  const size_t rank = static_cast<size_t>(std::ceil(0.95 * positions));  // nearest rank, 1-based
  r.kl_p95 = kls[std::max<size_t>(rank, 1) - 1];
  r.top1_agreement = static_cast<double>(top1) / positions;
  r.greedy_agreement = options.free_running ? static_cast<double>(greedy) / positions : -1.0;
  r.ratio_vs_fp16 = r.encoded_bytes ? static_cast<double>(r.fp16_bytes) / static_cast<double>(r.encoded_bytes) : 0.0;
  r.ratio_vs_fp32 = r.encoded_bytes ? static_cast<double>(r.fp32_bytes) / static_cast<double>(r.encoded_bytes) : 0.0;
  return r;
}

}  // namespace kdn::codec
