// SPDX-License-Identifier: Apache-2.0
#include "refengine/variants.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>

namespace kdn::refengine {

struct VariantModel::Layer {
  LayerKind kind = LayerKind::kFull;
  std::vector<float> norm1, norm2, w1, w2;  // pre-norms, the MLP
  std::vector<float> wq, wk, wv, wo;        // attention; recurrent: q, k, v of the linear attention
  std::vector<float> wdkv, wkr, wuk, wuv, wqr;  // latent: down, RoPE key, up to K and V, RoPE query
  std::vector<float> win, conv;                 // recurrent: input, convolution taps [tap][channel]
};

namespace {

// out[i] = sum_j w[i * in + j] * x[j], j in order.
void MatVec(const std::vector<float>& w, const float* x, int in, int outs, float* out) {
  for (int i = 0; i < outs; ++i) {
    float acc = 0.0f;
    const float* row = w.data() + static_cast<size_t>(i) * static_cast<size_t>(in);
    for (int j = 0; j < in; ++j) acc += row[j] * x[j];
    out[i] = acc;
  }
}

std::vector<float> RmsNorm(const std::vector<float>& x, const std::vector<float>& weight) {
  float ss = 0.0f;
  for (float v : x) ss += v * v;
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(x.size()) + 1e-5f);
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * scale * weight[i];
  return out;
}

// Interleaved pairs (2i, 2i+1), theta 10000.
void Rope(float* v, int dims, int pos) {
  for (int i = 0; i < dims; i += 2) {
    const float freq = 1.0f / std::pow(10000.0f, static_cast<float>(i) / static_cast<float>(dims));
    const float angle = static_cast<float>(pos) * freq;
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = v[i], b = v[i + 1];
    v[i] = a * c - b * s;
    v[i + 1] = a * s + b * c;
  }
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }
float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Softmax of `scores` in place, then out[d] = sum_j p_j * value(j)[d].
template <typename Value>
void Attend(std::vector<float>& scores, int dims, Value value, float* out) {
  const float top = *std::max_element(scores.begin(), scores.end());
  float sum = 0.0f;
  for (float& s : scores) {
    s = std::exp(s - top);
    sum += s;
  }
  std::fill(out, out + dims, 0.0f);
  for (size_t j = 0; j < scores.size(); ++j) {
    const float p = scores[j] / sum;
    const float* v = value(j);
    for (int d = 0; d < dims; ++d) out[d] += p * v[d];
  }
}

class Init {
 public:
  explicit Init(std::uint64_t seed) : rng_(seed) {}
  // Uniform in +-1/sqrt(in): the scale of a trained layer's weights.
  std::vector<float> Matrix(int outs, int in) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const float a = 1.0f / std::sqrt(static_cast<float>(in));
    std::vector<float> w(static_cast<size_t>(outs) * static_cast<size_t>(in));
    for (float& v : w) v = u(rng_) * a;
    return w;
  }
  std::vector<float> Norm(int n) {
    std::uniform_real_distribution<float> u(0.9f, 1.1f);
    std::vector<float> w(static_cast<size_t>(n));
    for (float& v : w) v = u(rng_);
    return w;
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

VariantConfig Variant(std::string_view name) {
  VariantConfig c;
  c.name = std::string(name);
  using K = LayerKind;
  if (name == "mla") {
    c.layers = {K::kLatent, K::kLatent};
  } else if (name == "sliding") {
    c.layers = {K::kSliding, K::kFull, K::kSliding};
  } else if (name == "recurrent") {
    c.layers = {K::kFull, K::kRecurrent, K::kFull};
  } else if (name == "hybrid") {
    c.layers = {K::kSliding, K::kRecurrent, K::kFull, K::kSliding};
  } else {
    throw std::invalid_argument("unknown model variant '" + std::string(name) + "'");
  }
  return c;
}

VariantModel::~VariantModel() = default;
VariantModel::VariantModel(VariantModel&&) noexcept = default;

VariantModel::VariantModel(VariantConfig config) : c_(std::move(config)) {
  const bool latent = std::any_of(c_.layers.begin(), c_.layers.end(), [](LayerKind k) { return k == LayerKind::kLatent; });
  const bool kv = std::any_of(c_.layers.begin(), c_.layers.end(),
                              [](LayerKind k) { return k == LayerKind::kFull || k == LayerKind::kSliding; });
  if (latent && kv) throw std::invalid_argument("a variant's attention layers are all latent or all K/V");
  if (c_.heads % c_.kv_heads != 0 || c_.head_dim % 2 != 0 || c_.latent_rope % 2 != 0) {
    throw std::invalid_argument("variant: heads must be a multiple of kv_heads, RoPE dims even");
  }
  Init init(c_.seed);
  const int D = c_.dim, H = c_.heads, hd = c_.head_dim, q = H * hd;
  embed_ = init.Matrix(c_.vocab, D);
  for (LayerKind kind : c_.layers) {
    Layer L;
    L.kind = kind;
    L.norm1 = init.Norm(D);
    L.norm2 = init.Norm(D);
    switch (kind) {
      case LayerKind::kFull:
      case LayerKind::kSliding:
        L.wq = init.Matrix(q, D);
        L.wk = init.Matrix(c_.kv_heads * hd, D);
        L.wv = init.Matrix(c_.kv_heads * hd, D);
        break;
      case LayerKind::kLatent:
        L.wdkv = init.Matrix(c_.latent_rank, D);
        L.wkr = init.Matrix(c_.latent_rope, D);
        L.wuk = init.Matrix(q, c_.latent_rank);
        L.wuv = init.Matrix(q, c_.latent_rank);
        L.wq = init.Matrix(q, D);
        L.wqr = init.Matrix(H * c_.latent_rope, D);
        break;
      case LayerKind::kRecurrent:
        L.win = init.Matrix(D, D);
        L.conv = init.Matrix(c_.conv_width, D);  // [tap][channel]
        L.wq = init.Matrix(q, D);
        L.wk = init.Matrix(q, D);
        L.wv = init.Matrix(q, D);
        break;
    }
    L.wo = init.Matrix(D, q);
    L.w1 = init.Matrix(c_.hidden, D);
    L.w2 = init.Matrix(D, c_.hidden);
    slot_.push_back(kind == LayerKind::kRecurrent ? n_recurrent_++ : n_attention_++);
    layers_.push_back(std::move(L));
  }
  out_norm_ = init.Norm(D);
  out_ = init.Matrix(c_.vocab, D);
}

bool VariantModel::latent() const {
  return std::any_of(c_.layers.begin(), c_.layers.end(), [](LayerKind k) { return k == LayerKind::kLatent; });
}

int VariantModel::kv_width() const {
  return latent() ? c_.latent_rank + c_.latent_rope : c_.kv_heads * c_.head_dim;
}

int VariantModel::state_floats() const {
  return (c_.conv_width - 1) * c_.dim + c_.heads * c_.head_dim * c_.head_dim;
}

std::vector<std::uint32_t> VariantModel::windows() const {
  std::vector<std::uint32_t> out;
  for (LayerKind k : c_.layers) {
    if (k == LayerKind::kRecurrent) continue;
    out.push_back(k == LayerKind::kSliding ? static_cast<std::uint32_t>(c_.window) : 0u);
  }
  return out;
}

VariantModel::Cache VariantModel::NewCache(float fill) const {
  Cache c;
  const size_t rows = static_cast<size_t>(c_.max_tokens) * static_cast<size_t>(kv_width());
  for (int l = 0; l < n_attention_; ++l) {
    c.k.emplace_back(rows, fill);
    c.v.emplace_back(latent() ? 0 : rows, fill);
  }
  for (int l = 0; l < n_recurrent_; ++l) c.state.emplace_back(static_cast<size_t>(state_floats()), 0.0f);
  return c;
}

void VariantModel::Attention(const Layer& L, Cache& cache, int slot, const std::vector<float>& h, int pos,
                             std::vector<float>& x) const {
  const int H = c_.heads, hd = c_.head_dim, kvw = kv_width(), group = c_.heads / c_.kv_heads;
  std::vector<float> q(static_cast<size_t>(H * hd)), o(static_cast<size_t>(H * hd)), out(static_cast<size_t>(c_.dim));
  float* k = cache.k[static_cast<size_t>(slot)].data() + static_cast<size_t>(pos) * static_cast<size_t>(kvw);
  float* v = cache.v[static_cast<size_t>(slot)].data() + static_cast<size_t>(pos) * static_cast<size_t>(kvw);
  MatVec(L.wq, h.data(), c_.dim, H * hd, q.data());
  MatVec(L.wk, h.data(), c_.dim, kvw, k);
  MatVec(L.wv, h.data(), c_.dim, kvw, v);
  for (int i = 0; i < H; ++i) Rope(q.data() + i * hd, hd, pos);
  for (int i = 0; i < c_.kv_heads; ++i) Rope(k + i * hd, hd, pos);
  // A sliding layer reads the last `window` tokens only: older KV may be
  // anything (the tests fill it with NaN).
  const int lo = L.kind == LayerKind::kSliding ? std::max(0, pos - c_.window + 1) : 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* K = cache.k[static_cast<size_t>(slot)].data();
  const float* V = cache.v[static_cast<size_t>(slot)].data();
  for (int i = 0; i < H; ++i) {
    const int kvh = i / group;
    std::vector<float> scores;
    for (int j = lo; j <= pos; ++j) {
      const float* kj = K + static_cast<size_t>(j) * static_cast<size_t>(kvw) + static_cast<size_t>(kvh * hd);
      float s = 0.0f;
      for (int d = 0; d < hd; ++d) s += q[static_cast<size_t>(i * hd + d)] * kj[d];
      scores.push_back(s * scale);
    }
    Attend(scores, hd,
           [&](size_t j) {
             return V + (static_cast<size_t>(lo) + j) * static_cast<size_t>(kvw) + static_cast<size_t>(kvh * hd);
           },
           o.data() + i * hd);
  }
  MatVec(L.wo, o.data(), H * hd, c_.dim, out.data());
  for (int d = 0; d < c_.dim; ++d) x[static_cast<size_t>(d)] += out[static_cast<size_t>(d)];
}

void VariantModel::Latent(const Layer& L, Cache& cache, int slot, const std::vector<float>& h, int pos,
                          std::vector<float>& x) const {
  const int H = c_.heads, hd = c_.head_dim, r = c_.latent_rank, rd = c_.latent_rope, w = r + rd;
  float* row = cache.k[static_cast<size_t>(slot)].data() + static_cast<size_t>(pos) * static_cast<size_t>(w);
  // The latent: its first `r` dims compress K and V, its last `rd` are the
  // RoPE key every head shares (DeepSeek's layout: kv_c, then k_pe).
  MatVec(L.wdkv, h.data(), c_.dim, r, row);
  MatVec(L.wkr, h.data(), c_.dim, rd, row + r);
  Rope(row + r, rd, pos);
  std::vector<float> q(static_cast<size_t>(H * hd)), qr(static_cast<size_t>(H * rd));
  MatVec(L.wq, h.data(), c_.dim, H * hd, q.data());
  MatVec(L.wqr, h.data(), c_.dim, H * rd, qr.data());
  for (int i = 0; i < H; ++i) Rope(qr.data() + i * rd, rd, pos);
  // K and V rebuilt from every cached latent.
  const size_t n = static_cast<size_t>(pos) + 1;
  std::vector<float> keys(n * static_cast<size_t>(H * hd)), values(n * static_cast<size_t>(H * hd));
  const float* C = cache.k[static_cast<size_t>(slot)].data();
  for (size_t j = 0; j < n; ++j) {
    MatVec(L.wuk, C + j * static_cast<size_t>(w), r, H * hd, keys.data() + j * static_cast<size_t>(H * hd));
    MatVec(L.wuv, C + j * static_cast<size_t>(w), r, H * hd, values.data() + j * static_cast<size_t>(H * hd));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd + rd));
  std::vector<float> o(static_cast<size_t>(H * hd)), out(static_cast<size_t>(c_.dim));
  for (int i = 0; i < H; ++i) {
    std::vector<float> scores;
    for (size_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int d = 0; d < hd; ++d) s += q[static_cast<size_t>(i * hd + d)] * keys[j * static_cast<size_t>(H * hd) + static_cast<size_t>(i * hd + d)];
      const float* kr = C + j * static_cast<size_t>(w) + static_cast<size_t>(r);
      for (int d = 0; d < rd; ++d) s += qr[static_cast<size_t>(i * rd + d)] * kr[d];
      scores.push_back(s * scale);
    }
    Attend(scores, hd, [&](size_t j) { return values.data() + j * static_cast<size_t>(H * hd) + static_cast<size_t>(i * hd); },
           o.data() + i * hd);
  }
  MatVec(L.wo, o.data(), H * hd, c_.dim, out.data());
  for (int d = 0; d < c_.dim; ++d) x[static_cast<size_t>(d)] += out[static_cast<size_t>(d)];
}

void VariantModel::Recurrent(const Layer& L, Cache& cache, int slot, const std::vector<float>& h,
                             std::vector<float>& x) const {
  const int D = c_.dim, H = c_.heads, hd = c_.head_dim, taps = c_.conv_width;
  float* conv = cache.state[static_cast<size_t>(slot)].data();         // [taps - 1][D], oldest first
  float* S = conv + static_cast<size_t>(taps - 1) * static_cast<size_t>(D);  // [H][hd][hd]
  std::vector<float> u(static_cast<size_t>(D)), y(static_cast<size_t>(D));
  MatVec(L.win, h.data(), D, D, u.data());
  for (int ch = 0; ch < D; ++ch) {
    float acc = 0.0f;
    for (int t = 0; t < taps - 1; ++t) acc += L.conv[static_cast<size_t>(t * D + ch)] * conv[t * D + ch];
    acc += L.conv[static_cast<size_t>((taps - 1) * D + ch)] * u[static_cast<size_t>(ch)];
    y[static_cast<size_t>(ch)] = Silu(acc);
  }
  for (int t = 0; t + 1 < taps - 1; ++t) std::copy(conv + (t + 1) * D, conv + (t + 2) * D, conv + t * D);
  std::copy(u.begin(), u.end(), conv + (taps - 2) * D);
  std::vector<float> q(static_cast<size_t>(H * hd)), k(static_cast<size_t>(H * hd)), v(static_cast<size_t>(H * hd));
  MatVec(L.wq, y.data(), D, H * hd, q.data());
  MatVec(L.wk, y.data(), D, H * hd, k.data());
  MatVec(L.wv, y.data(), D, H * hd, v.data());
  std::vector<float> o(static_cast<size_t>(H * hd)), out(static_cast<size_t>(D));
  for (int i = 0; i < H; ++i) {
    float* Si = S + static_cast<size_t>(i) * static_cast<size_t>(hd * hd);
    for (int a = 0; a < hd; ++a) {
      const float ka = Sigmoid(k[static_cast<size_t>(i * hd + a)]);
      for (int b = 0; b < hd; ++b) Si[a * hd + b] = c_.decay * Si[a * hd + b] + ka * v[static_cast<size_t>(i * hd + b)];
    }
    for (int b = 0; b < hd; ++b) {
      float acc = 0.0f;
      for (int a = 0; a < hd; ++a) acc += Sigmoid(q[static_cast<size_t>(i * hd + a)]) * Si[a * hd + b];
      o[static_cast<size_t>(i * hd + b)] = acc / static_cast<float>(hd);
    }
  }
  MatVec(L.wo, o.data(), H * hd, D, out.data());
  for (int d = 0; d < D; ++d) x[static_cast<size_t>(d)] += out[static_cast<size_t>(d)];
}

std::vector<float> VariantModel::Embed(int token) const {
  if (token < 0 || token >= c_.vocab) throw std::out_of_range("variant: token out of range");
  const int D = c_.dim;
  return std::vector<float>(embed_.begin() + static_cast<std::ptrdiff_t>(token) * D,
                            embed_.begin() + static_cast<std::ptrdiff_t>(token + 1) * D);
}

void VariantModel::LayerStep(int layer, Cache& cache, int pos, std::vector<float>& x) const {
  if (layer < 0 || static_cast<size_t>(layer) >= layers_.size() || pos < 0 || pos >= c_.max_tokens ||
      x.size() != static_cast<size_t>(c_.dim)) {
    throw std::out_of_range("variant layer step: layer, position or width out of range");
  }
  const int D = c_.dim;
  const auto l = static_cast<size_t>(layer);
  const Layer& L = layers_[l];
  const std::vector<float> h = RmsNorm(x, L.norm1);
  switch (L.kind) {
    case LayerKind::kFull:
    case LayerKind::kSliding: Attention(L, cache, slot_[l], h, pos, x); break;
    case LayerKind::kLatent: Latent(L, cache, slot_[l], h, pos, x); break;
    case LayerKind::kRecurrent: Recurrent(L, cache, slot_[l], h, x); break;
  }
  const std::vector<float> h2 = RmsNorm(x, L.norm2);
  std::vector<float> a(static_cast<size_t>(c_.hidden)), out(static_cast<size_t>(D));
  MatVec(L.w1, h2.data(), D, c_.hidden, a.data());
  for (float& v : a) v = Silu(v);
  MatVec(L.w2, a.data(), c_.hidden, D, out.data());
  for (int d = 0; d < D; ++d) x[static_cast<size_t>(d)] += out[static_cast<size_t>(d)];
}

std::vector<float> VariantModel::Logits(const std::vector<float>& x) const {
  const std::vector<float> f = RmsNorm(x, out_norm_);
  std::vector<float> logits(static_cast<size_t>(c_.vocab));
  MatVec(out_, f.data(), c_.dim, c_.vocab, logits.data());
  return logits;
}

std::vector<float> VariantModel::Step(Cache& cache, int token, int pos) const {
  if (token < 0 || token >= c_.vocab || pos < 0 || pos >= c_.max_tokens) {
    throw std::out_of_range("variant step: token or position out of range");
  }
  std::vector<float> x = Embed(token);
  for (size_t l = 0; l < layers_.size(); ++l) LayerStep(static_cast<int>(l), cache, pos, x);
  return Logits(x);
}

int Argmax(const std::vector<float>& logits) {
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace kdn::refengine
