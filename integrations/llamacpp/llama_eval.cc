// SPDX-License-Identifier: Apache-2.0
// A tier codec's quality inside llama.cpp; the protocol is in llama_eval.h.
#include "llama_eval.h"

#include <algorithm>
#include <cstring>

#include "lab/codec/eval.h"
#include "connector.h"

namespace kdn::llamacpp {

Result<LlamaKlResult> LlamaCodecKl(const std::string& gguf, const std::vector<std::int32_t>& stream,
                                   const LlamaKlOptions& o) {
  const std::size_t N = static_cast<std::size_t>(o.context), K = static_cast<std::size_t>(o.continue_tokens);
  if (N < 2 || K < 1 || o.contexts < 1) return Status::InvalidArgument("llama eval: bad context, continue or contexts");
  if (stream.size() < N * static_cast<std::size_t>(o.contexts)) {
    return Status::InvalidArgument("llama eval: the stream has " + std::to_string(stream.size()) + " tokens, fewer than " +
                                   std::to_string(o.contexts) + " contexts of " + std::to_string(N));
  }
  SessionOptions so;
  so.gguf = gguf;
  so.backend_dir = KDN_LLAMACPP_LIBDIR;
  so.f16_cache = true;
  if (N + K > so.n_ctx) return Status::InvalidArgument("llama eval: context + continue exceed the session's context");
  auto a = Session::Load(so), b = Session::Load(so), c = Session::Load(so);
  for (auto* s : {&a, &b, &c}) {
    if (!s->ok()) return s->status();
  }
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = static_cast<std::uint32_t>(N);
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  host.codec = o.codec.c_str();
  host.codec_len = o.codec.size();
  ro.tiers = &host;
  ro.num_tiers = 1;
  kdn_runtime* rt = nullptr;
  if (kdn_runtime_create(&ro, &rt) != KDN_OK) return Status::InvalidArgument(kdn_last_error_message());
  std::string fingerprint;
  auto spec = ModelSpecFor(**a, gguf, &fingerprint);
  kdn_model* model = nullptr;
  if (!spec.ok() || kdn_model_create(rt, &*spec, &model) != KDN_OK) {
    kdn_runtime_destroy(rt);
    return spec.ok() ? Status::InvalidArgument(kdn_last_error_message()) : spec.status();
  }
  Connector save(**a, model, "eval"), load(**c, model, "eval");
  LlamaKlResult r;
  double kl_sum = 0;
  std::uint64_t positions = 0, agree = 0;
  const std::size_t vocab = static_cast<std::size_t>((*a)->vocab_size());
  Status st = [&]() -> Status {
    for (int i = 0; i < o.contexts; ++i) {
      std::vector<std::int32_t> ctx(stream.begin() + static_cast<std::ptrdiff_t>(i * N),
                                    stream.begin() + static_cast<std::ptrdiff_t>((i + 1) * N));
      ctx[0] = 1;  // BOS, as codec::Evaluate cuts its contexts
      // The original's greedy continuation, and its KV into kdn.
      (*a)->Clear();
      KDN_RETURN_IF_ERROR((*a)->Decode(ctx));
      Result<std::vector<std::int32_t>> g = (*a)->Greedy(static_cast<int>(K));
      if (!g.ok()) return g.status();
      Result<std::uint64_t> stored = save.Save(ctx);
      if (!stored.ok()) return stored.status();
      std::vector<std::int32_t> forced = {ctx.back()};
      forced.insert(forced.end(), g->begin(), g->end() - 1);
      // The original run.
      (*b)->Clear();
      KDN_RETURN_IF_ERROR((*b)->Decode(std::vector<std::int32_t>(ctx.begin(), ctx.end() - 1)));
      Result<std::vector<float>> orig = (*b)->DecodeWithLogits(forced);
      if (!orig.ok()) return orig.status();
      // The restored run.
      (*c)->Clear();
      Result<Connector::Restored> restored = load.Restore(ctx);
      if (!restored.ok()) return restored.status();
      r.restored_tokens += restored->tokens;
      if (restored->tokens != N - 1) {
        return Status::Internal("llama eval: context " + std::to_string(i) + " restored " +
                                std::to_string(restored->tokens) + " of " + std::to_string(N - 1) + " positions");
      }
      Result<std::vector<float>> dec = (*c)->DecodeWithLogits(forced);
      if (!dec.ok()) return dec.status();
      for (std::size_t k = 0; k < K; ++k) {
        const std::span<const float> x(orig->data() + k * vocab, vocab), y(dec->data() + k * vocab, vocab);
        kl_sum += codec::KlDivergence(x, y);
        agree += std::max_element(x.begin(), x.end()) - x.begin() == std::max_element(y.begin(), y.end()) - y.begin();
        ++positions;
      }
      ++r.contexts;
    }
    return Status::Ok();
  }();
  kdn_model_destroy(model);
  kdn_runtime_destroy(rt);
  KDN_RETURN_IF_ERROR(st);
  r.kl_mean = kl_sum / static_cast<double>(positions);
  r.top1_agreement = static_cast<double>(agree) / static_cast<double>(positions);
  return r;
}

Result<NaiveReuseResult> NaiveReuseKl(const std::string& gguf, const std::vector<std::int32_t>& stream,
                                      const NaiveReuseOptions& o) {
  const std::size_t P = static_cast<std::size_t>(o.prefix), D = static_cast<std::size_t>(o.document),
                    K = static_cast<std::size_t>(o.continue_tokens);
  if (P < 1 || D < 2 || K < 1 || o.trials < 1) return Status::InvalidArgument("naive reuse: bad sizes");
  if (stream.size() < (P + D) * static_cast<std::size_t>(o.trials)) {
    return Status::InvalidArgument("naive reuse: the stream is too short");
  }
  SessionOptions so;
  so.gguf = gguf;
  so.backend_dir = KDN_LLAMACPP_LIBDIR;
  if (P + D + K > so.n_ctx) return Status::InvalidArgument("naive reuse: the sizes exceed the context");
  SessionOptions two = so;
  two.n_seq_max = 2;
  auto full = Session::Load(so), doc = Session::Load(so), naive = Session::Load(two);
  for (auto* s : {&full, &doc, &naive}) {
    if (!s->ok()) return s->status();
  }
  NaiveReuseResult r;
  double kl_sum = 0;
  std::uint64_t positions = 0, agree = 0;
  const std::size_t vocab = static_cast<std::size_t>((*full)->vocab_size());
  for (int t = 0; t < o.trials; ++t) {
    const auto at = stream.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * (P + D));
    std::vector<std::int32_t> prefix(at, at + static_cast<std::ptrdiff_t>(P));
    prefix[0] = 1;  // BOS
    const std::vector<std::int32_t> document(at + static_cast<std::ptrdiff_t>(P),
                                             at + static_cast<std::ptrdiff_t>(P + D));
    std::vector<std::int32_t> all = prefix;
    all.insert(all.end(), document.begin(), document.end());
    // The full run's greedy continuation, then its logits.
    (*full)->Clear();
    KDN_RETURN_IF_ERROR((*full)->Decode(all));
    Result<std::vector<std::int32_t>> g = (*full)->Greedy(static_cast<int>(K));
    if (!g.ok()) return g.status();
    std::vector<std::int32_t> forced = {document.back()};
    forced.insert(forced.end(), g->begin(), g->end() - 1);
    (*full)->Clear();
    KDN_RETURN_IF_ERROR((*full)->Decode(std::vector<std::int32_t>(all.begin(), all.end() - 1)));
    Result<std::vector<float>> want = (*full)->DecodeWithLogits(forced);
    if (!want.ok()) return want.status();
    // The document's KV computed alone: BOS, then all but its last token.
    (*doc)->Clear();
    std::vector<std::int32_t> alone = {1};
    alone.insert(alone.end(), document.begin(), document.end() - 1);
    KDN_RETURN_IF_ERROR((*doc)->Decode(alone));
    Result<std::vector<std::uint8_t>> state = (*doc)->SaveSequence();
    if (!state.ok()) return state.status();
    // The naive run: P prefilled, D's KV moved after it.
    Session& n = **naive;
    n.Clear();
    KDN_RETURN_IF_ERROR(n.Decode(prefix));
    KDN_RETURN_IF_ERROR(n.RestoreSequence(*state, 1));
    const auto ip = static_cast<std::int32_t>(P), id = static_cast<std::int32_t>(D);
    n.SeqRemove(1, 0, 1);             // D's own BOS
    n.SeqShift(1, 1, id, ip - 1);     // positions 1..D-1 -> P..P+D-2
    n.SeqCopy(1, 0, -1, -1);
    n.SeqRemove(1, -1, -1);
    Result<std::vector<float>> got = n.DecodeWithLogits(forced);
    if (!got.ok()) return got.status();
    for (std::size_t k = 0; k < K; ++k) {
      const std::span<const float> x(want->data() + k * vocab, vocab), y(got->data() + k * vocab, vocab);
      kl_sum += codec::KlDivergence(x, y);
      agree += std::max_element(x.begin(), x.end()) - x.begin() == std::max_element(y.begin(), y.end()) - y.begin();
      ++positions;
    }
    ++r.trials;
  }
  r.kl_mean = kl_sum / static_cast<double>(positions);
  r.top1_agreement = static_cast<double>(agree) / static_cast<double>(positions);
  return r;
}

}  // namespace kdn::llamacpp
