// SPDX-License-Identifier: Apache-2.0
#include "lab/blend/eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <string>

#include "core/blend/blend.h"
#include "lab/blend/transformer_engine.h"
#include "lab/codec/eval.h"
#include "core/keys/hash.h"
#include "lab/model/transformer.h"
#include "kernels/ref/rope_ref.h"
#include "core/knowledge/knowledge.h"
#include "core/engine/kv_store.h"

namespace kdn::blend {
namespace {

constexpr int kBos = 1;

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// A KvView over a canonical float buffer of `tokens` tokens.
struct CanonicalView {
  CanonicalView(const model::ModelConfig& c, float* data, int tokens) {
    const size_t plane = static_cast<size_t>(tokens) * c.kv_dim();
    for (int l = 0; l < c.n_layers; ++l) {
      k.push_back(data + static_cast<size_t>(l) * 2 * plane);
      v.push_back(data + (static_cast<size_t>(l) * 2 + 1) * plane);
    }
    view.shape = {c.n_layers, c.n_kv_heads, c.head_dim(), 4};
    view.k_base = k.data();
    view.v_base = v.data();
    view.stride_token = c.kv_dim();
    view.stride_head = c.head_dim();
    view.stride_dim = 1;
  }
  std::vector<void*> k, v;
  kernels::KvView view;
};

// The run's logits at the last context position and the positions after it
// (teacher-forced with `forced`), from a cache holding positions [0, n-1).
Status Score(model::Transformer& t, model::KvCache& cache, int last, int n, int k, const std::vector<int>& forced,
             std::vector<float>* logits) {
  std::vector<int> greedy;
  return codec::Continue(t, cache, last, n, k, &forced, logits, &greedy);
}

}  // namespace

Result<BlendEvalResult> EvaluateBlend(const model::Checkpoint& weights, const std::vector<int>& text_tokens,
                                      const std::vector<int>& suffix, const BlendEvalOptions& o) {
  Result<std::vector<BlendEvalResult>> r =
      EvaluateBlends(weights, text_tokens, suffix, o, {BlendVariant{o.ratio, o.check_layers, o.first_tokens, o.kv_pass}});
  if (!r.ok()) return r.status();
  return std::move(r->front());
}

Result<std::vector<BlendEvalResult>> EvaluateBlends(const model::Checkpoint& weights,
                                                    const std::vector<int>& text_tokens,
                                                    const std::vector<int>& suffix, const BlendEvalOptions& o,
                                                    const std::vector<BlendVariant>& variants) {
  const model::ModelConfig& c = weights.config();
  if (o.chunk_tokens < 1 || o.chunks < 1 || o.continue_tokens < 0) {
    return Status::InvalidArgument("blend eval: chunk tokens, chunks >= 1, continue >= 0");
  }
  if (variants.empty()) return Status::InvalidArgument("blend eval: no blend setting to evaluate");
  if (suffix.empty()) return Status::InvalidArgument("blend eval: the suffix must hold at least one token");
  std::vector<int> stream;
  for (int t : text_tokens) {
    if (t < 0 || t >= c.vocab_size) return Status::InvalidArgument("blend eval: token id outside the vocabulary");
    if (t != kBos) stream.push_back(t);
  }
  const int n_chunks = static_cast<int>(stream.size()) / o.chunk_tokens;
  int contexts = n_chunks / o.chunks;
  if (o.max_contexts > 0) contexts = std::min(contexts, o.max_contexts);
  if (contexts < 1) {
    return Status::InvalidArgument("blend eval: the text holds " + std::to_string(n_chunks) + " chunks of " +
                                   std::to_string(o.chunk_tokens) + " tokens, fewer than " + std::to_string(o.chunks));
  }
  const int N = 1 + o.chunks * o.chunk_tokens + static_cast<int>(suffix.size());
  const int K = 1 + o.continue_tokens;  // compared positions
  if (N + K > c.seq_len) {
    return Status::InvalidArgument("blend eval: contexts of " + std::to_string(N) + " tokens + " + std::to_string(K) +
                                   " exceed the model's " + std::to_string(c.seq_len));
  }

  model::Transformer t(weights, o.threads);
  TransformerEngine engine(t);
  const ModelShape shape = ShapeOf(c);
  const int kvd = c.kv_dim();
  // The store and the knowledge items: each chunk computed alone after a
  // BOS, its keys moved back to positions [0, n) (knowledge items hold KV at
  // their own positions).
  store::StoreOptions so;
  so.chunk_tokens = static_cast<std::uint32_t>(o.chunk_tokens);
  so.host_capacity_bytes = std::uint64_t{1} << 30;
  Result<std::unique_ptr<store::KvStore>> kv_store = store::KvStore::Create(so);
  if (!kv_store.ok()) return kv_store.status();
  store::KnowledgeIndex index(**kv_store);
  store::ModelKv mkv;
  mkv.fingerprint = keys::ModelFingerprint({static_cast<std::uint32_t>(c.n_layers),
                                            static_cast<std::uint32_t>(c.n_kv_heads),
                                            static_cast<std::uint32_t>(c.head_dim()), 0, 10000.0f, 0,
                                            static_cast<std::uint32_t>(c.head_dim()), "blend-eval"});
  mkv.shape = {c.n_layers, c.n_kv_heads, c.head_dim(), 4};
  const kernels::RopeSpec rope = Llama2cRope(c);
  const int used = contexts * o.chunks;
  for (int i = 0; i < used; ++i) {
    std::vector<int> seq = {kBos};
    seq.insert(seq.end(), stream.begin() + static_cast<std::ptrdiff_t>(i) * o.chunk_tokens,
               stream.begin() + static_cast<std::ptrdiff_t>(i + 1) * o.chunk_tokens);
    model::KvCache cache = t.NewCache();
    KDN_RETURN_IF_ERROR(t.Forward(seq, 0, cache, nullptr));
    std::vector<float> kv = cache.Export(1, 1 + o.chunk_tokens);
    for (int l = 0; l < c.n_layers; ++l) {
      float* keys = kv.data() + static_cast<size_t>(l) * 2 * o.chunk_tokens * kvd;
      if (!kernels::rope_shift_cpu(rope, kernels::KeyType::kF32, keys, kvd, o.chunk_tokens, c.n_kv_heads, -1)) {
        return Status::Internal("blend eval: re-positioning failed");
      }
    }
    CanonicalView view(c, kv.data(), o.chunk_tokens);
    const std::vector<std::int32_t> doc(seq.begin() + 1, seq.end());
    KDN_RETURN_IF_ERROR(index.Put(mkv, "", "chunk-" + std::to_string(i), 1, "", doc, view.view));
  }

  std::mt19937 rng(o.seed);
  std::vector<int> order(static_cast<size_t>(used));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  // Run 0 is naive reuse, run v + 1 is variants[v].
  const size_t runs = variants.size() + 1;
  std::vector<double> kl(runs, 0.0), work(runs, 0.0);
  std::vector<std::uint64_t> top(runs, 0);
  std::vector<std::vector<double>> t_run(runs);
  std::vector<double> t_full;
  std::uint64_t compared = 0;
  double full_work = 0;
  for (int ci = 0; ci < contexts; ++ci) {
    std::vector<int> ids(order.begin() + static_cast<std::ptrdiff_t>(ci) * o.chunks,
                         order.begin() + static_cast<std::ptrdiff_t>(ci + 1) * o.chunks);
    std::vector<int> ctx = {kBos};
    for (int id : ids) {
      ctx.insert(ctx.end(), stream.begin() + static_cast<std::ptrdiff_t>(id) * o.chunk_tokens,
                 stream.begin() + static_cast<std::ptrdiff_t>(id + 1) * o.chunk_tokens);
    }
    ctx.insert(ctx.end(), suffix.begin(), suffix.end());
    full_work += static_cast<double>(c.n_layers) * N;

    std::vector<float> logits_f;
    std::vector<int> forced;
    for (size_t run = 0; run < runs; ++run) {
      // Full prefill, timed before each run; the first one's greedy
      // continuation and logits are the reference.
      model::KvCache full = t.NewCache();
      std::vector<float> logits;
      const auto t0 = std::chrono::steady_clock::now();
      KDN_RETURN_IF_ERROR(t.Forward(ctx, 0, full, &logits));
      t_full.push_back(Ms(std::chrono::steady_clock::now() - t0));
      if (run == 0) {
        model::KvCache ref = t.NewCache();
        KDN_RETURN_IF_ERROR(ref.Import(0, N - 1, full.Export(0, N - 1)));
        std::vector<int> greedy_f;
        KDN_RETURN_IF_ERROR(codec::Continue(t, ref, ctx.back(), N, K, nullptr, &logits_f, &greedy_f));
        forced.assign(greedy_f.begin(), greedy_f.end() - 1);
      }

      BlendOptions bo{0.0, -1, {1}, rope};
      if (run > 0) {
        bo.ratio = variants[run - 1].ratio;
        bo.check_layers = variants[run - 1].check_layers;
        bo.first_tokens = variants[run - 1].first_tokens;
        bo.kv_pass = variants[run - 1].kv_pass;
      }
      const auto s0 = std::chrono::steady_clock::now();
      std::vector<Piece> pieces;
      pieces.push_back(Piece{{kBos}, {}, 0});
      for (int id : ids) {
        Piece p;
        p.kv.assign(static_cast<size_t>(c.n_layers) * 2 * o.chunk_tokens * kvd, 0.0f);
        CanonicalView view(c, p.kv.data(), o.chunk_tokens);
        Result<std::vector<std::int32_t>> got = index.Fetch(mkv, "", "chunk-" + std::to_string(id), &view.view);
        if (!got.ok()) return got.status();
        p.tokens = std::move(got).value();
        pieces.push_back(std::move(p));
      }
      pieces.push_back(Piece{std::vector<std::int32_t>(suffix.begin(), suffix.end() - 1), {}, 0});
      std::vector<float> composed;
      Result<BlendReport> rep = Compose(shape, pieces, bo, engine, &composed);
      if (!rep.ok()) return rep.status();
      model::KvCache cache = t.NewCache();
      KDN_RETURN_IF_ERROR(cache.Import(0, N - 1, composed));
      std::vector<float> first;
      const int last = ctx.back();
      KDN_RETURN_IF_ERROR(t.Forward(std::span<const int>(&last, 1), N - 1, cache, &first));
      t_run[run].push_back(Ms(std::chrono::steady_clock::now() - s0));
      work[run] += std::accumulate(rep->recomputed_per_layer.begin(), rep->recomputed_per_layer.end(), 0.0) +
                   rep->kv_pass_cost *
                       std::accumulate(rep->kv_pass_per_layer.begin(), rep->kv_pass_per_layer.end(), 0.0) +
                   c.n_layers;  // the last token
      // Teacher-forced comparison (the cache now holds N positions; Score
      // re-runs the last token at N-1, as the full run's continuation did).
      std::vector<float> logits_r;
      KDN_RETURN_IF_ERROR(Score(t, cache, last, N, K, forced, &logits_r));
      for (int j = 0; j < K; ++j) {
        const size_t at = static_cast<size_t>(j) * vocab;
        kl[run] += codec::KlDivergence(std::span<const float>(logits_f).subspan(at, vocab),
                                       std::span<const float>(logits_r).subspan(at, vocab));
        top[run] += model::Argmax(std::span<const float>(logits_f).subspan(at, vocab)) ==
                    model::Argmax(std::span<const float>(logits_r).subspan(at, vocab));
      }
    }
    compared += static_cast<std::uint64_t>(K);
  }
  const double n = static_cast<double>(compared);
  std::vector<BlendEvalResult> out;
  for (size_t v = 0; v < variants.size(); ++v) {
    BlendEvalResult r;
    r.contexts = contexts;
    r.ratio = variants[v].ratio;
    r.context_tokens = N;
    r.kl_blend_mean = kl[v + 1] / n;
    r.kl_naive_mean = kl[0] / n;
    r.top1_blend = static_cast<double>(top[v + 1]) / n;
    r.top1_naive = static_cast<double>(top[0]) / n;
    r.recompute_fraction = work[v + 1] / full_work;
    r.ttft_full_ms = Median(t_full);
    r.ttft_full_samples = static_cast<int>(t_full.size());
    r.ttft_blend_ms = Median(t_run[v + 1]);
    r.ttft_naive_ms = Median(t_run[0]);
    out.push_back(r);
  }
  return out;
}

}  // namespace kdn::blend
