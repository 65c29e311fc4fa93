// SPDX-License-Identifier: Apache-2.0
#include "core/blend/blend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/ref/blend_rows_ref.h"
#include "kernels/ref/rope_ref.h"

namespace kdn::blend {

std::vector<int> CheckLayersFor(const BlendOptions& options, int layers) {
  if (!options.check_layers.empty()) return options.check_layers;
  if (layers >= 3) return {1, 2};
  return {layers == 2 ? 1 : 0};
}

Status LatentLayers::Run(bool kv_pass, int layer, std::span<const int> positions, std::span<const int> tokens,
                         float* hidden, float* k_plane, float* v_plane, int total) {
  if (inner_.on_device()) return Status::Unsupported("blend: a latent model's engine runs on the host");
  if (latent_ < 2 || latent_ % 2 != 0 || total < 0) return Status::InvalidArgument("blend: bad latent width");
  const auto half = static_cast<size_t>(latent_ / 2), w = static_cast<size_t>(latent_);
  whole_.resize(static_cast<size_t>(total) * w);
  for (size_t p = 0; p < static_cast<size_t>(total); ++p) {
    std::memcpy(&whole_[p * w], k_plane + p * half, half * sizeof(float));
    std::memcpy(&whole_[p * w + half], v_plane + p * half, half * sizeof(float));
  }
  KDN_RETURN_IF_ERROR(kv_pass ? inner_.KvPass(layer, positions, tokens, hidden, whole_.data(), nullptr, total)
                              : inner_.Layer(layer, positions, tokens, hidden, whole_.data(), nullptr, total));
  for (int q : positions) {  // the rows the engine wrote
    if (q < 0 || q >= total) return Status::InvalidArgument("blend: a position outside the context");
    const auto p = static_cast<size_t>(q);
    std::memcpy(k_plane + p * half, &whole_[p * w], half * sizeof(float));
    std::memcpy(v_plane + p * half, &whole_[p * w + half], half * sizeof(float));
  }
  return Status::Ok();
}

namespace {

// Host memory: the composed KV in kv_out, the hidden states in vectors.
class HostSpace final : public ComposeSpace {
 public:
  explicit HostSpace(std::vector<float>* kv_out) : kv_(kv_out) {}
  Status InitKv(size_t floats) override {
    kv_->assign(floats, 0.0f);
    return Status::Ok();
  }
  float* kv() override { return kv_->data(); }
  Status PlaceRows(size_t offset, const float* src, size_t n) override {
    std::memcpy(kv_->data() + offset, src, n * sizeof(float));
    return Status::Ok();
  }
  Status ShiftKeys(const kernels::RopeSpec& rope, size_t offset, std::int64_t row_stride, std::int64_t tokens,
                   int kv_heads, std::int64_t delta) override {
    if (!kernels::rope_shift_cpu(rope, kernels::KeyType::kF32, kv_->data() + offset, row_stride, tokens, kv_heads,
                                 delta)) {
      return Status::InvalidArgument("blend: cannot re-position a piece's keys");
    }
    return Status::Ok();
  }
  Status InitHidden(size_t rows, int width) override {
    h_.resize(rows * static_cast<size_t>(width));
    return Status::Ok();
  }
  float* hidden() override { return h_.data(); }
  Status KeepHidden(std::span<const std::int32_t> keep, int width) override {
    const auto w = static_cast<size_t>(width);
    for (size_t i = 0; i < keep.size(); ++i) {  // ascending: a row moves down or stays
      const auto from = static_cast<size_t>(keep[i]);
      if (from != i) std::memmove(&h_[i * w], &h_[from * w], w * sizeof(float));
    }
    h_.resize(keep.size() * w);
    return Status::Ok();
  }
  Result<float*> CandidateHidden(std::span<const std::int32_t> rows, int width, bool copy) override {
    const auto w = static_cast<size_t>(width);
    c_.resize(rows.size() * w);
    if (copy) kernels::gather_rows_cpu(c_.data(), h_.data(), rows.data(), static_cast<std::int64_t>(rows.size()), width);
    return c_.data();
  }
  Status SaveKeys(size_t offset, std::span<const std::int32_t> rows, int kv_dim) override {
    saved_.resize(rows.size() * static_cast<size_t>(kv_dim));
    kernels::gather_rows_cpu(saved_.data(), kv_->data() + offset, rows.data(), static_cast<std::int64_t>(rows.size()),
                             kv_dim);
    return Status::Ok();
  }
  Status Deviations(size_t offset, std::span<const std::int32_t> plane_rows, std::span<const std::int32_t> saved_rows,
                    int kv_dim, double* out) override {
    kernels::row_deviations_cpu(kv_->data() + offset, saved_.data(), plane_rows.data(), saved_rows.data(),
                                static_cast<std::int64_t>(plane_rows.size()), kv_dim, out);
    return Status::Ok();
  }

 private:
  std::vector<float>* kv_;
  std::vector<float> h_, c_, saved_;
};

}  // namespace

Result<BlendReport> Compose(const ModelShape& shape, std::span<const Piece> pieces, const BlendOptions& options,
                            LayerEngine& engine, std::vector<float>* kv_out) {
  if (engine.on_device()) {
    return Status::InvalidArgument("blend: an engine on a device composes there (ComposeOnDevice)");
  }
  HostSpace space(kv_out);
  return ComposeIn(shape, pieces, options, engine, space);
}

Result<BlendReport> ComposeIn(const ModelShape& shape, std::span<const Piece> pieces, const BlendOptions& options,
                              LayerEngine& engine, ComposeSpace& space) {
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
  // A latent's RoPE dims: the last rope.head_dim of each V-plane row (one head).
  const bool rotates = !o.latent || o.rope.head_dim != 0;
  if (o.latent) {
    if (shape.kv_heads != 1) return Status::InvalidArgument("blend: a latent model is kept as one head");
    if (o.rope.head_dim < 0 || o.rope.head_dim > shape.head_dim) {
      return Status::InvalidArgument("blend: a latent's RoPE dims must fit in its second half (" +
                                     std::to_string(shape.head_dim) + " dims)");
    }
  } else if (o.rope.head_dim != shape.head_dim) {
    return Status::InvalidArgument("blend: the RoPE spec's head_dim differs");
  }
  if (const char* why = rotates ? kernels::rope_spec_problem(o.rope) : nullptr) {
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
  for (const Piece& p : pieces) {
    if (!p.kv.empty() && p.kv.size() != static_cast<size_t>(L) * 2 * p.tokens.size() * kvd) {
      return Status::InvalidArgument("blend: a piece's KV does not hold its " + std::to_string(p.tokens.size()) +
                                     " tokens");
    }
  }
  KDN_RETURN_IF_ERROR(space.InitKv(static_cast<size_t>(L) * 2 * plane));
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
      for (int l = 0; l < L; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const float* src = p.kv.data() + (static_cast<size_t>(l) * 2 + kv) * n * kvd;
          const size_t dst = (static_cast<size_t>(l) * 2 + kv) * plane + static_cast<size_t>(at) * kvd;
          KDN_RETURN_IF_ERROR(space.PlaceRows(dst, src, static_cast<size_t>(n) * kvd));
          if (!o.latent && kv == 0) {
            KDN_RETURN_IF_ERROR(space.ShiftKeys(o.rope, dst, kvd, n, shape.kv_heads, at - p.cached_first));
          } else if (o.latent && kv == 1 && rotates) {  // the latent's tail: its RoPE dims
            const size_t tail = dst + static_cast<size_t>(kvd - o.rope.head_dim);
            KDN_RETURN_IF_ERROR(space.ShiftKeys(o.rope, tail, kvd, n, 1, at - p.cached_first));
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
  const auto candidate = [&](int p) { return cached[static_cast<size_t>(p)] && !anchored[static_cast<size_t>(p)]; };

  // 2. Recompute. `rows` are the positions running through the current
  // layer (ascending); the space's hidden() holds their rows.
  const bool selecting = o.ratio > 0 || o.threshold >= 0;
  std::vector<int> rows;
  for (int p = 0; p < N; ++p) {
    if (selecting || !candidate(p)) rows.push_back(p);
  }
  KDN_RETURN_IF_ERROR(space.InitHidden(rows.size(), hidden));
  std::vector<std::int32_t> row_tokens, all_rows;
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
  const auto tokens_of = [&](const std::vector<int>& ps, int l) {
    std::vector<std::int32_t> t;
    if (l == 0) {
      for (int p : ps) t.push_back(tokens[static_cast<size_t>(p)]);
    }
    return t;
  };
  for (int l = 0; l < L; ++l) {
    const bool is_check = selecting && check < o.check_layers.size() && o.check_layers[check] == l;
    const size_t k_off = static_cast<size_t>(l) * 2 * plane;
    float* k_layer = space.kv() + k_off;
    float* v_layer = k_layer + plane;
    if (is_check) {  // the placed keys of the rows, before the engine overwrites them
      all_rows.assign(rows.begin(), rows.end());
      KDN_RETURN_IF_ERROR(space.SaveKeys(k_off, all_rows, kvd));
    }
    row_tokens = tokens_of(rows, l);
    // A KV pass pays only when the check drops rows: with a ratio that keeps
    // every candidate (ratio 1) the layer runs whole at once.
    bool by_pass = is_check && kv_pass;
    if (by_pass && o.threshold < 0) {
      const double fraction =
          std::pow(o.ratio, static_cast<double>(check + 1) / static_cast<double>(o.check_layers.size()));
      size_t candidates = 0;
      for (int p : rows) candidates += candidate(p);
      by_pass = static_cast<size_t>(std::llround(fraction * (r.cached_positions - r.anchored))) < candidates;
    }
    if (!rows.empty() && by_pass) {
      // The candidates (cached rows neither anchored nor fresh) get K and V;
      // of them only those the selection below keeps run the whole layer,
      // with the fresh and anchored rows. The others stop here.
      std::vector<int> cand;
      std::vector<std::int32_t> cand_rows;
      for (size_t i = 0; i < rows.size(); ++i) {
        if (!candidate(rows[i])) continue;
        cand.push_back(rows[i]);
        cand_rows.push_back(static_cast<std::int32_t>(i));
      }
      if (!cand.empty()) {
        Result<float*> cand_h = space.CandidateHidden(cand_rows, hidden, /*copy=*/l > 0);
        if (!cand_h.ok()) return cand_h.status();
        const std::vector<std::int32_t> cand_tokens = tokens_of(cand, l);
        KDN_RETURN_IF_ERROR(space.BeforeEngine());
        KDN_RETURN_IF_ERROR(engine.KvPass(l, cand, cand_tokens, *cand_h, k_layer, v_layer, N));
      }
      r.kv_pass_per_layer[static_cast<size_t>(l)] = static_cast<int>(cand.size());
    } else if (!rows.empty()) {
      KDN_RETURN_IF_ERROR(space.BeforeEngine());
      KDN_RETURN_IF_ERROR(engine.Layer(l, rows, row_tokens, space.hidden(), k_layer, v_layer, N));
      r.recomputed_per_layer[static_cast<size_t>(l)] = static_cast<int>(rows.size());
    }
    if (!is_check) continue;
    // Select among the cached rows by the deviation of their fresh keys.
    std::vector<std::int32_t> plane_rows, saved_rows;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!candidate(rows[i])) continue;
      plane_rows.push_back(rows[i]);
      saved_rows.push_back(static_cast<std::int32_t>(i));
    }
    std::vector<double> d(plane_rows.size());
    KDN_RETURN_IF_ERROR(space.Deviations(k_off, plane_rows, saved_rows, kvd, d.data()));
    std::vector<std::pair<double, size_t>> dev;  // (deviation, row index)
    for (size_t j = 0; j < d.size(); ++j) dev.emplace_back(d[j], static_cast<size_t>(saved_rows[j]));
    ++check;
    size_t keep = 0;
    if (o.threshold >= 0) {
      for (const auto& [dv, i] : dev) keep += dv >= o.threshold;
    } else {
      const double fraction = std::pow(o.ratio, static_cast<double>(check) / static_cast<double>(o.check_layers.size()));
      keep = std::min(dev.size(), static_cast<size_t>(std::llround(fraction * (r.cached_positions - r.anchored))));
    }
    // The `keep` largest deviations (ties: the earlier position).
    std::stable_sort(dev.begin(), dev.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<char> stay(rows.size(), 0);
    for (size_t k = 0; k < keep; ++k) stay[dev[k].second] = 1;
    std::vector<std::int32_t> kept;
    std::vector<int> next;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!stay[i] && candidate(rows[i])) continue;  // fresh and anchored rows always run
      kept.push_back(static_cast<std::int32_t>(i));
      next.push_back(rows[i]);
    }
    KDN_RETURN_IF_ERROR(space.KeepHidden(kept, hidden));
    rows = std::move(next);
    if (by_pass && !rows.empty()) {  // the kept rows run the whole check layer (writing the same K and V)
      row_tokens = tokens_of(rows, l);
      KDN_RETURN_IF_ERROR(space.BeforeEngine());
      KDN_RETURN_IF_ERROR(engine.Layer(l, rows, row_tokens, space.hidden(), k_layer, v_layer, N));
      r.recomputed_per_layer[static_cast<size_t>(l)] = static_cast<int>(rows.size());
    }
  }
  for (int p : rows) {
    if (candidate(p)) r.selected_positions.push_back(p);
  }
  r.selected = static_cast<int>(r.selected_positions.size());
  const double work = std::accumulate(r.recomputed_per_layer.begin(), r.recomputed_per_layer.end(), 0.0) +
                      r.kv_pass_cost * std::accumulate(r.kv_pass_per_layer.begin(), r.kv_pass_per_layer.end(), 0.0);
  r.recompute_fraction = work / (static_cast<double>(L) * N);
  return r;
}

}  // namespace kdn::blend
