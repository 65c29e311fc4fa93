// SPDX-License-Identifier: Apache-2.0
#include "core/blend/blend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/ref/rope_ref.h"

namespace kdn::blend {

std::vector<int> CheckLayersFor(const BlendOptions& options, int layers) {
  if (!options.check_layers.empty()) return options.check_layers;
  if (layers >= 3) return {1, 2};
  return {layers == 2 ? 1 : 0};
}

Result<BlendReport> Compose(const ModelShape& shape, std::span<const Piece> pieces, const BlendOptions& options,
                            LayerEngine& engine, std::vector<float>* kv_out) {
  const int L = shape.layers, kvd = shape.kv_dim();
  if (L <= 0 || shape.kv_heads <= 0 || shape.head_dim <= 0) return Status::InvalidArgument("blend: bad model shape");
  BlendOptions o = options;
  o.check_layers = CheckLayersFor(options, L);
  if (!(o.ratio >= 0 && o.ratio <= 1)) return Status::InvalidArgument("blend: ratio must be in [0, 1]");
  if (!(o.threshold < 0 || std::isfinite(o.threshold))) return Status::InvalidArgument("blend: bad threshold");
  if (o.first_tokens < 0) return Status::InvalidArgument("blend: first_tokens must not be negative");
  for (size_t i = 0; i < o.check_layers.size(); ++i) {
    if (o.check_layers[i] < 0 || o.check_layers[i] >= L || (i > 0 && o.check_layers[i] <= o.check_layers[i - 1])) {
      return Status::InvalidArgument("blend: check layers must ascend within [0, " + std::to_string(L) + ")");
    }
  }
  if (o.rope.head_dim != shape.head_dim) return Status::InvalidArgument("blend: the RoPE spec's head_dim differs");
  if (const char* why = kernels::rope_spec_problem(o.rope)) {
    return Status::InvalidArgument(std::string("blend: RoPE: ") + why);
  }
  const int hidden = engine.hidden_dim();
  if (hidden <= 0) return Status::InvalidArgument("blend: the engine reports no hidden width");

  // 1. Place.
  std::int64_t total = 0;
  for (const Piece& p : pieces) total += static_cast<std::int64_t>(p.tokens.size());
  if (total == 0) return Status::InvalidArgument("blend: nothing to compose");
  if (total > (std::int64_t{1} << 30)) return Status::InvalidArgument("blend: context too long");
  const int N = static_cast<int>(total);
  const size_t plane = static_cast<size_t>(N) * kvd;
  kv_out->assign(static_cast<size_t>(L) * 2 * plane, 0.0f);
  std::vector<std::int32_t> tokens;
  tokens.reserve(static_cast<size_t>(N));
  std::vector<char> cached(static_cast<size_t>(N), 0);
  std::vector<char> anchored(static_cast<size_t>(N), 0);  // cached, but run through every layer
  BlendReport r;
  r.positions = N;
  int at = 0;
  for (const Piece& p : pieces) {
    const int n = static_cast<int>(p.tokens.size());
    tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
    if (!p.kv.empty()) {
      if (p.kv.size() != static_cast<size_t>(L) * 2 * n * kvd) {
        return Status::InvalidArgument("blend: a piece's KV does not hold its " + std::to_string(n) + " tokens");
      }
      for (int l = 0; l < L; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const float* src = p.kv.data() + (static_cast<size_t>(l) * 2 + kv) * n * kvd;
          float* dst = kv_out->data() + (static_cast<size_t>(l) * 2 + kv) * plane + static_cast<size_t>(at) * kvd;
          std::memcpy(dst, src, static_cast<size_t>(n) * kvd * sizeof(float));
          if (kv == 0 && !kernels::rope_shift_cpu(o.rope, kernels::KeyType::kF32, dst, kvd, n, shape.kv_heads,
                                                  at - p.cached_first)) {
            return Status::InvalidArgument("blend: cannot re-position a piece's keys");
          }
        }
      }
      std::fill(cached.begin() + at, cached.begin() + at + n, 1);
      const int k = std::min(n, o.first_tokens);
      std::fill(anchored.begin() + at, anchored.begin() + at + k, 1);
      r.cached_positions += n;
      r.anchored += k;
    } else {
      r.fresh_positions += n;
    }
    at += n;
  }

  // 2. Recompute. `rows` are the positions running through the current
  // layer (ascending); hidden holds their rows.
  const bool selecting = o.ratio > 0 || o.threshold >= 0;
  std::vector<int> rows;
  for (int p = 0; p < N; ++p) {
    if (selecting || !cached[static_cast<size_t>(p)] || anchored[static_cast<size_t>(p)]) rows.push_back(p);
  }
  std::vector<float> h(rows.size() * static_cast<size_t>(hidden));
  std::vector<float> placed_k;
  std::vector<std::int32_t> row_tokens;
  size_t check = 0;
  r.recomputed_per_layer.assign(static_cast<size_t>(L), 0);
  r.kv_pass_per_layer.assign(static_cast<size_t>(L), 0);
  const bool kv_pass = o.kv_pass && engine.has_kv_pass();
  if (kv_pass) {
    r.kv_pass_cost = engine.kv_pass_cost(N);
    if (!(r.kv_pass_cost > 0 && r.kv_pass_cost <= 1)) {
      return Status::InvalidArgument("blend: the engine's KV-pass cost must be in (0, 1]");
    }
  }
  for (int l = 0; l < L; ++l) {
    const bool is_check = selecting && check < o.check_layers.size() && o.check_layers[check] == l;
    float* k_layer = kv_out->data() + static_cast<size_t>(l) * 2 * plane;
    float* v_layer = k_layer + plane;
    if (is_check) {  // the placed keys of the rows, before the engine overwrites them
      placed_k.resize(rows.size() * kvd);
      for (size_t i = 0; i < rows.size(); ++i) {
        std::memcpy(&placed_k[i * kvd], k_layer + static_cast<size_t>(rows[i]) * kvd, kvd * sizeof(float));
      }
    }
    row_tokens.clear();
    if (l == 0) {
      for (int p : rows) row_tokens.push_back(tokens[static_cast<size_t>(p)]);
    }
    // A KV pass pays only when the check drops rows: with a ratio that keeps
    // every candidate (ratio 1) the layer runs whole at once.
    bool by_pass = is_check && kv_pass;
    if (by_pass && o.threshold < 0) {
      const double fraction =
          std::pow(o.ratio, static_cast<double>(check + 1) / static_cast<double>(o.check_layers.size()));
      size_t candidates = 0;
      for (int p : rows) candidates += cached[static_cast<size_t>(p)] && !anchored[static_cast<size_t>(p)];
      by_pass = static_cast<size_t>(std::llround(fraction * (r.cached_positions - r.anchored))) < candidates;
    }
    if (!rows.empty() && by_pass) {
      // The candidates (cached rows neither anchored nor fresh) get K and V;
      // of them only those the selection below keeps run the whole layer,
      // with the fresh and anchored rows. The others stop here.
      std::vector<int> cand;
      std::vector<std::int32_t> cand_tokens;
      std::vector<float> cand_h;
      for (size_t i = 0; i < rows.size(); ++i) {
        const size_t p = static_cast<size_t>(rows[i]);
        if (!cached[p] || anchored[p]) continue;
        cand.push_back(rows[i]);
        if (l == 0) {
          cand_tokens.push_back(tokens[p]);
        } else {
          cand_h.insert(cand_h.end(), h.begin() + static_cast<std::ptrdiff_t>(i * hidden),
                        h.begin() + static_cast<std::ptrdiff_t>((i + 1) * hidden));
        }
      }
      cand_h.resize(cand.size() * static_cast<size_t>(hidden));
      if (!cand.empty()) KDN_RETURN_IF_ERROR(engine.KvPass(l, cand, cand_tokens, cand_h.data(), k_layer, v_layer, N));
      r.kv_pass_per_layer[static_cast<size_t>(l)] = static_cast<int>(cand.size());
    } else if (!rows.empty()) {
      KDN_RETURN_IF_ERROR(engine.Layer(l, rows, row_tokens, h.data(), k_layer, v_layer, N));
      r.recomputed_per_layer[static_cast<size_t>(l)] = static_cast<int>(rows.size());
    }
    if (!is_check) continue;
    // Select among the cached rows by the deviation of their fresh keys.
    std::vector<std::pair<double, size_t>> dev;  // (deviation, row index)
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!cached[static_cast<size_t>(rows[i])] || anchored[static_cast<size_t>(rows[i])]) continue;
      double d = 0;
      const float* fresh = k_layer + static_cast<size_t>(rows[i]) * kvd;
      for (int e = 0; e < kvd; ++e) {
        const double x = static_cast<double>(fresh[e]) - placed_k[i * kvd + e];
        d += x * x;
      }
      dev.emplace_back(d, i);
    }
    ++check;
    size_t keep = 0;
    if (o.threshold >= 0) {
      for (const auto& [d, i] : dev) keep += d >= o.threshold;
    } else {
      const double fraction = std::pow(o.ratio, static_cast<double>(check) / static_cast<double>(o.check_layers.size()));
      keep = std::min(dev.size(), static_cast<size_t>(std::llround(fraction * (r.cached_positions - r.anchored))));
    }
    // The `keep` largest deviations (ties: the earlier position).
    std::stable_sort(dev.begin(), dev.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<char> stay(rows.size(), 0);
    for (size_t k = 0; k < keep; ++k) stay[dev[k].second] = 1;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!cached[static_cast<size_t>(rows[i])] || anchored[static_cast<size_t>(rows[i])]) stay[i] = 1;  // fresh and anchored rows always run
    }
    size_t w = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!stay[i]) continue;
      if (w != i) {
        rows[w] = rows[i];
        std::memmove(&h[w * hidden], &h[i * hidden], static_cast<size_t>(hidden) * sizeof(float));
      }
      ++w;
    }
    rows.resize(w);
    h.resize(w * static_cast<size_t>(hidden));
    if (by_pass && !rows.empty()) {  // the kept rows run the whole check layer (writing the same K and V)
      row_tokens.clear();
      if (l == 0) {
        for (int p : rows) row_tokens.push_back(tokens[static_cast<size_t>(p)]);
      }
      KDN_RETURN_IF_ERROR(engine.Layer(l, rows, row_tokens, h.data(), k_layer, v_layer, N));
      r.recomputed_per_layer[static_cast<size_t>(l)] = static_cast<int>(rows.size());
    }
  }
  for (int p : rows) {
    if (cached[static_cast<size_t>(p)] && !anchored[static_cast<size_t>(p)]) r.selected_positions.push_back(p);
  }
  r.selected = static_cast<int>(r.selected_positions.size());
  const double work = std::accumulate(r.recomputed_per_layer.begin(), r.recomputed_per_layer.end(), 0.0) +
                      r.kv_pass_cost * std::accumulate(r.kv_pass_per_layer.begin(), r.kv_pass_per_layer.end(), 0.0);
  r.recompute_fraction = work / (static_cast<double>(L) * N);
  return r;
}

}  // namespace kdn::blend
