// SPDX-License-Identifier: Apache-2.0
// A tier codec's quality inside llama.cpp; the protocol is in llama_eval.h.
#include "llama_eval.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "lab/codec/eval.h"
#include "connector.h"

namespace kdn::llamacpp {
namespace {

double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Status BuildBlend(Session& s, Connector& kdn, const std::vector<std::vector<std::int32_t>>& docs, std::size_t k,
                  std::size_t m, const std::vector<std::int32_t>& tail) {
  s.Clear();
  // The BOS comes with the first document's state when that is restored in
  // place (nothing of its start recomputed, not all of it recomputed).
  const bool first_in_place = !docs.empty() && k == 0 && m < docs[0].size();
  if (!first_in_place) KDN_RETURN_IF_ERROR(s.DecodeAt({1}, 0));
  std::int32_t p = 1;  // the next document's first position
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const std::vector<std::int32_t>& d = docs[i];
    const std::size_t kk = std::min(k, d.size()), mm = std::min(m, d.size() - kk);
    const auto ik = static_cast<std::int32_t>(kk);
    const auto first_last = static_cast<std::int32_t>(d.size() - mm);  // the first of the last m
    // The first k tokens at their place, attending to the KV before them.
    // (Decoding them before the rest of the document is placed gives the
    // same attention and keeps that decode's span of cells short: measured,
    // the other order is no faster.)
    if (kk > 0) KDN_RETURN_IF_ERROR(s.DecodeAt(std::vector<std::int32_t>(d.begin(), d.begin() + ik), p));
    if (kk + mm < d.size()) {
      // The rest from the document's KV computed alone. With nothing
      // recomputed the first document's state, its BOS included, is already
      // where it belongs.
      const bool in_place = i == 0 && first_in_place;
      std::vector<std::int32_t> alone = {1};
      alone.insert(alone.end(), d.begin(), d.end());
      Result<Connector::Restored> r = kdn.RestoreInto(alone, in_place ? 0 : 1);
      if (!r.ok()) return r.status();
      if (r->tokens != alone.size()) {
        return Status::Internal("rag blend: document " + std::to_string(i) + " restored " +
                                std::to_string(r->tokens) + " of " + std::to_string(alone.size()) + " tokens from kdn");
      }
      if (!in_place) {
        s.SeqRemove(1, 0, 1 + ik);          // its BOS and the tokens decoded again
        if (mm > 0) s.SeqRemove(1, 1 + first_last, -1);
        s.SeqShift(1, 1 + ik, -1, p - 1);  // 1+k.. -> p+k..
        s.SeqCopy(1, 0, -1, -1);
        s.SeqRemove(1, -1, -1);
      } else if (mm > 0) {
        s.SeqRemove(0, 1 + first_last, -1);
      }
    }
    // The last m tokens at their place, after the rest of the document.
    if (mm > 0) {
      KDN_RETURN_IF_ERROR(s.DecodeAt(std::vector<std::int32_t>(d.begin() + first_last, d.end()), p + first_last));
    }
    p += static_cast<std::int32_t>(d.size());
  }
  if (!tail.empty()) KDN_RETURN_IF_ERROR(s.DecodeAt(tail, p));
  return Status::Ok();
}


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

Result<RagBlendResult> RagBlendKl(const std::string& gguf, const std::vector<std::int32_t>& stream,
                                  const RagBlendOptions& o) {
  if (o.documents < 1 || o.document < 1 || o.suffix < 1 || o.continue_tokens < 1 || o.trials < 1 ||
      o.timing_runs < 0 || o.recompute.empty()) {
    return Status::InvalidArgument("rag blend: bad sizes");
  }
  const std::size_t D = static_cast<std::size_t>(o.documents), L = static_cast<std::size_t>(o.document),
                    Q = static_cast<std::size_t>(o.suffix), K = static_cast<std::size_t>(o.continue_tokens);
  for (int k : o.recompute) {
    if (k < 0) return Status::InvalidArgument("rag blend: a negative k");
  }
  if (!o.recompute_last.empty() && o.recompute_last.size() != o.recompute.size()) {
    return Status::InvalidArgument("rag blend: recompute_last must have one m per k");
  }
  for (int m : o.recompute_last) {
    if (m < 0) return Status::InvalidArgument("rag blend: a negative m");
  }
  std::vector<int> order(D);
  std::iota(order.begin(), order.end(), 0);
  if (!o.order.empty()) {
    std::vector<int> sorted = o.order;
    std::sort(sorted.begin(), sorted.end());
    if (sorted != order) return Status::InvalidArgument("rag blend: the order is not a permutation of the documents");
    order = o.order;
  }
  const std::size_t stride = D * L + Q, P = 1 + stride;
  if (stream.size() < stride * static_cast<std::size_t>(o.trials)) {
    return Status::InvalidArgument("rag blend: the stream has " + std::to_string(stream.size()) +
                                   " tokens, fewer than " + std::to_string(o.trials) + " prompts of " +
                                   std::to_string(stride));
  }
  SessionOptions so;
  so.gguf = gguf;
  so.backend_dir = KDN_LLAMACPP_LIBDIR;
  // The blended context holds a document's cells in its second sequence
  // beside the prompt's.
  if (P + K + L + 1 > so.n_ctx) return Status::InvalidArgument("rag blend: the sizes exceed the context");
  SessionOptions two = so;
  two.n_seq_max = 2;
  auto full = Session::Load(so), alone = Session::Load(so), blend = Session::Load(two);
  for (auto* s : {&full, &alone, &blend}) {
    if (!s->ok()) return s->status();
  }
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;  // one host tier, lossless
  kdn_runtime* rt = nullptr;
  if (kdn_runtime_create(&ro, &rt) != KDN_OK) return Status::InvalidArgument(kdn_last_error_message());
  std::string fingerprint;
  auto spec = ModelSpecFor(**alone, gguf, &fingerprint);
  kdn_model* model = nullptr;
  if (!spec.ok() || kdn_model_create(rt, &*spec, &model) != KDN_OK) {
    kdn_runtime_destroy(rt);
    return spec.ok() ? Status::InvalidArgument(kdn_last_error_message()) : spec.status();
  }
  Connector save(**alone, model, "rag"), load(**blend, model, "rag");
  RagBlendResult r;
  r.prompt_tokens = P;
  struct Acc {
    double kl = 0;
    std::uint64_t positions = 0, agree = 0;
    std::vector<double> full_ms, blend_ms;
  };
  std::vector<Acc> acc(o.recompute.size());
  r.points.resize(o.recompute.size());
  const std::size_t vocab = static_cast<std::size_t>((*full)->vocab_size());
  Session& f = **full;
  Session& b = **blend;
  Status st = [&]() -> Status {
    for (int t = 0; t < o.trials; ++t) {
      const auto at = stream.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(t) * stride);
      // The documents as taken from the stream, each computed alone and
      // stored in kdn (once: the blended runs restore from there).
      std::vector<std::vector<std::int32_t>> taken(D);
      for (std::size_t i = 0; i < D; ++i) {
        taken[i].assign(at + static_cast<std::ptrdiff_t>(i * L), at + static_cast<std::ptrdiff_t>((i + 1) * L));
        std::vector<std::int32_t> a = {1};
        a.insert(a.end(), taken[i].begin(), taken[i].end());
        (*alone)->Clear();
        KDN_RETURN_IF_ERROR((*alone)->Decode(a));
        Result<std::uint64_t> stored = save.Save(a);
        if (!stored.ok()) return stored.status();
      }
      std::vector<std::vector<std::int32_t>> docs;
      std::vector<std::int32_t> prompt = {1};
      for (int i : order) {
        docs.push_back(taken[static_cast<std::size_t>(i)]);
        prompt.insert(prompt.end(), docs.back().begin(), docs.back().end());
      }
      const std::vector<std::int32_t> suffix(at + static_cast<std::ptrdiff_t>(D * L),
                                             at + static_cast<std::ptrdiff_t>(stride));
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      // Full prefill: its greedy continuation, then its logits on it.
      f.Clear();
      KDN_RETURN_IF_ERROR(f.Decode(prompt));
      const std::int32_t first = f.Argmax();
      Result<std::vector<std::int32_t>> g = f.Greedy(static_cast<int>(K));
      if (!g.ok()) return g.status();
      std::vector<std::int32_t> forced = {prompt.back()};
      forced.insert(forced.end(), g->begin(), g->end() - 1);
      f.Clear();
      KDN_RETURN_IF_ERROR(f.Decode(std::vector<std::int32_t>(prompt.begin(), prompt.end() - 1)));
      Result<std::vector<float>> want = f.DecodeWithLogits(forced);
      if (!want.ok()) return want.status();
      const std::vector<std::int32_t> tail_but_last(suffix.begin(), suffix.end() - 1);
      for (std::size_t j = 0; j < o.recompute.size(); ++j) {
        const std::size_t k = static_cast<std::size_t>(o.recompute[j]);
        const std::size_t m = o.recompute_last.empty() ? 0 : static_cast<std::size_t>(o.recompute_last[j]);
        RagBlendPoint& pt = r.points[j];
        Acc& a = acc[j];
        // Quality.
        KDN_RETURN_IF_ERROR(BuildBlend(b, load, docs, k, m, tail_but_last));
        Result<std::vector<float>> got = b.DecodeWithLogits(forced);
        if (!got.ok()) return got.status();
        for (std::size_t i = 0; i < K; ++i) {
          const std::span<const float> x(want->data() + i * vocab, vocab), y(got->data() + i * vocab, vocab);
          a.kl += codec::KlDivergence(x, y);
          a.agree +=
              std::max_element(x.begin(), x.end()) - x.begin() == std::max_element(y.begin(), y.end()) - y.begin();
          ++a.positions;
        }
        // TTFT, full and blended interleaved so that both see the same
        // machine; the first pair warms up.
        for (int run = 0; run <= o.timing_runs; ++run) {
          f.Clear();
          double t0 = NowMs();
          KDN_RETURN_IF_ERROR(f.Decode(prompt));
          (void)f.Argmax();
          const double tf = NowMs() - t0;
          t0 = NowMs();
          KDN_RETURN_IF_ERROR(BuildBlend(b, load, docs, k, m, suffix));
          const std::int32_t mine = b.Argmax();
          const double tb = NowMs() - t0;
          if (run > 0) {
            a.full_ms.push_back(tf);
            a.blend_ms.push_back(tb);
          }
          if (run == o.timing_runs) {  // the last blended run, continued
            pt.first_token_same &= mine == first;
            Result<std::vector<std::int32_t>> mg = b.Greedy(static_cast<int>(K));
            if (!mg.ok()) return mg.status();
            pt.greedy_same &= *mg == *g;
          }
        }
      }
      ++r.trials;
    }
    return Status::Ok();
  }();
  kdn_model_destroy(model);
  kdn_runtime_destroy(rt);
  KDN_RETURN_IF_ERROR(st);
  for (std::size_t j = 0; j < o.recompute.size(); ++j) {
    RagBlendPoint& pt = r.points[j];
    pt.k = o.recompute[j];
    pt.m = o.recompute_last.empty() ? 0 : o.recompute_last[j];
    pt.kl_mean = acc[j].kl / static_cast<double>(acc[j].positions);
    pt.top1_agreement = static_cast<double>(acc[j].agree) / static_cast<double>(acc[j].positions);
    pt.ttft_full_ms = Median(acc[j].full_ms);
    pt.ttft_blend_ms = Median(acc[j].blend_ms);
    const std::size_t kk = std::min<std::size_t>(static_cast<std::size_t>(pt.k), L);
    pt.recomputed_tokens = D * (kk + std::min<std::size_t>(static_cast<std::size_t>(pt.m), L - kk));
  }
  return r;
}

}  // namespace kdn::llamacpp
