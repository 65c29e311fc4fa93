// SPDX-License-Identifier: Apache-2.0
#include "lab/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "kernels/common/rope.h"

namespace kdn::model {
namespace {

// Eight float lanes as two 4-wide vectors (GCC/Clang vector extensions: SSE
// on x86-64, NEON on aarch64, no -march needed).
typedef float V4 __attribute__((vector_size(16)));

inline V4 Load4(const float* p) {
  V4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float Reduce8(V4 lo, V4 hi, float tail) {
  return ((lo[0] + lo[1]) + (lo[2] + lo[3])) + ((hi[0] + hi[1]) + (hi[2] + hi[3])) + tail;
}

// The one dot product every matrix product uses, so that an output element
// is computed the same way whatever the batch size or thread split: a prefix
// reused from the cache gives bitwise the same logits as a full prefill.
// Lane j accumulates elements i = j (mod 8); the lanes are summed in a fixed
// tree, then the tail.
inline float Dot(const float* a, const float* b, int k) {
  V4 lo = {0, 0, 0, 0}, hi = {0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= k; i += 8) {
    lo += Load4(a + i) * Load4(b + i);
    hi += Load4(a + i + 4) * Load4(b + i + 4);
  }
  float tail = 0.0f;
  for (; i < k; ++i) tail += a[i] * b[i];
  return Reduce8(lo, hi, tail);
}

// Four dot products of `a` with rows b0..b3 at once (a is loaded once), each
// accumulated exactly as Dot does, so results are bitwise the same.
inline void Dot4(const float* a, const float* b0, const float* b1, const float* b2, const float* b3, int k,
                 float* out) {
  V4 lo[4] = {}, hi[4] = {};
  const float* b[4] = {b0, b1, b2, b3};
  int i = 0;
  for (; i + 8 <= k; i += 8) {
    const V4 xl = Load4(a + i), xh = Load4(a + i + 4);
    for (int r = 0; r < 4; ++r) {
      lo[r] += xl * Load4(b[r] + i);
      hi[r] += xh * Load4(b[r] + i + 4);
    }
  }
  for (int r = 0; r < 4; ++r) {
    float tail = 0.0f;
    for (int t = i; t < k; ++t) tail += a[t] * b[r][t];
    out[r] = Reduce8(lo[r], hi[r], tail);
  }
}

// Below this many multiply-adds a loop runs on the calling thread: waking a
// worker costs more than it saves.
constexpr size_t kParallelMacs = size_t{1} << 18;

void RmsNorm(const float* x, const float* gain, float* out, int dim) {
  float ss = 0.0f;
  for (int i = 0; i < dim; ++i) ss += x[i] * x[i];
  ss = ss / static_cast<float>(dim) + 1e-5f;
  const float inv = 1.0f / std::sqrt(ss);
  for (int i = 0; i < dim; ++i) out[i] = gain[i] * (inv * x[i]);
}

}  // namespace

KvCache::KvCache(int layers, int max_seq, int kv_dim)
    : layers_(layers),
      max_seq_(max_seq),
      kv_dim_(kv_dim),
      data_(static_cast<size_t>(layers) * 2 * static_cast<size_t>(max_seq) * static_cast<size_t>(kv_dim)) {}

std::vector<float> KvCache::Export(int begin, int end) const {
  const int n = std::max(0, std::min(end, max_seq_) - std::max(begin, 0));
  std::vector<float> out(static_cast<size_t>(layers_) * 2 * static_cast<size_t>(n) * kv_dim_);
  float* dst = out.data();
  for (int l = 0; l < layers_; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const size_t run = static_cast<size_t>(n) * kv_dim_;
      if (run) std::memcpy(dst, data_.data() + Offset(l, kv, begin), run * sizeof(float));
      dst += run;
    }
  }
  return out;
}

Status KvCache::Import(int begin, int tokens, std::span<const float> canonical) {
  if (begin < 0 || tokens < 0 || begin + tokens > max_seq_) {
    return Status::InvalidArgument("KV import of positions [" + std::to_string(begin) + ", " +
                                   std::to_string(begin + tokens) + ") exceeds the cache's " +
                                   std::to_string(max_seq_));
  }
  const size_t run = static_cast<size_t>(tokens) * kv_dim_;
  if (canonical.size() != static_cast<size_t>(layers_) * 2 * run) {
    return Status::InvalidArgument("KV import: " + std::to_string(canonical.size()) + " floats given, " +
                                   std::to_string(static_cast<size_t>(layers_) * 2 * run) + " expected");
  }
  const float* src = canonical.data();
  for (int l = 0; l < layers_; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      if (run) std::memcpy(data_.data() + Offset(l, kv, begin), src, run * sizeof(float));
      src += run;
    }
  }
  return Status::Ok();
}

Transformer::Transformer(const Checkpoint& weights, int threads) : w_(weights) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  pool_ = std::make_unique<ThreadPool>(threads);
  const int hd = config().head_dim();
  for (int j = 0; j < hd / 2; ++j) inv_freq_.push_back(kernels::rope_inv_freq(j, hd, 10000.0));
}

KvCache Transformer::NewCache() const {
  return KvCache(config().n_layers, config().seq_len, config().kv_dim());
}

void Transformer::MatMul(const float* x, const float* w, float* out, int n, int k, int m) {
  // Output columns in tiles, so a tile of W stays in cache across the rows.
  constexpr int kTile = 64;
  auto rows = [&](size_t r0, size_t r1, int c0, int c1) {
    for (int jb = c0; jb < c1; jb += kTile) {
      const int je = std::min(c1, jb + kTile);
      for (size_t i = r0; i < r1; ++i) {
        const float* xi = x + i * static_cast<size_t>(k);
        float* oi = out + i * static_cast<size_t>(m);
        int j = jb;
        for (; j + 4 <= je; j += 4) {
          const float* wj = w + static_cast<size_t>(j) * k;
          Dot4(xi, wj, wj + k, wj + 2 * static_cast<size_t>(k), wj + 3 * static_cast<size_t>(k), k, oi + j);
        }
        for (; j < je; ++j) oi[j] = Dot(xi, w + static_cast<size_t>(j) * k, k);
      }
    }
  };
  const size_t macs = static_cast<size_t>(n) * k * m;
  if (macs < kParallelMacs) {
    rows(0, static_cast<size_t>(n), 0, m);
  } else if (n >= pool_->threads()) {
    pool_->ParallelFor(static_cast<size_t>(n), 1, [&](size_t b, size_t e) { rows(b, e, 0, m); });
  } else {
    pool_->ParallelFor(static_cast<size_t>(m), 8,
                       [&](size_t b, size_t e) { rows(0, static_cast<size_t>(n), static_cast<int>(b), static_cast<int>(e)); });
  }
}

void Transformer::Attention(const int* positions, int n, const float* k_layer, const float* v_layer) {
  const ModelConfig& c = config();
  const int hd = c.head_dim(), heads = c.n_heads, group = c.n_heads / c.n_kv_heads, kvd = c.kv_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t units = static_cast<size_t>(n) * heads;
  const int last = n > 0 ? positions[n - 1] : 0;
  const size_t macs = units * static_cast<size_t>(last + 1) * hd * 2;
  pool_->ParallelFor(units, macs < kParallelMacs ? units : 8, [&](size_t b, size_t e) {
    std::vector<float> score(static_cast<size_t>(last + 1));
    for (size_t u = b; u < e; ++u) {
      // Rows alternate from both ends (0, n-1, 1, n-2, ...), so that under
      // the causal mask every contiguous range of units has as much work.
      const int r = static_cast<int>(u / heads), h = static_cast<int>(u % heads);
      const int i = r % 2 == 0 ? r / 2 : n - 1 - r / 2;
      const int pos = positions[i], g = h / group;
      const float* q = q_.data() + static_cast<size_t>(i) * c.dim + static_cast<size_t>(h) * hd;
      float mx = -INFINITY;
      for (int t = 0; t <= pos; ++t) {
        score[t] = Dot(q, k_layer + static_cast<size_t>(t) * kvd + g * hd, hd) * scale;
        mx = std::max(mx, score[t]);
      }
      float sum = 0.0f;
      for (int t = 0; t <= pos; ++t) {
        score[t] = std::exp(score[t] - mx);
        sum += score[t];
      }
      const float inv = 1.0f / sum;
      float* o = att_.data() + static_cast<size_t>(i) * c.dim + static_cast<size_t>(h) * hd;
      std::fill(o, o + hd, 0.0f);
      for (int t = 0; t <= pos; ++t) {
        const float a = score[t] * inv;
        const float* vt = v_layer + static_cast<size_t>(t) * kvd + g * hd;
        for (int d = 0; d < hd; ++d) o[d] += a * vt[d];
      }
    }
  });
}

void Transformer::Prepare(std::span<const int> positions) {
  const ModelConfig& c = config();
  const int dim = c.dim, kvd = c.kv_dim(), hid = c.hidden_dim, hd = c.head_dim();
  const size_t N = positions.size();
  xb_.resize(N * dim);
  q_.resize(N * dim);
  k_.resize(N * kvd);
  v_.resize(N * kvd);
  att_.resize(N * dim);
  h1_.resize(N * hid);
  h3_.resize(N * hid);
  tmp_.resize(N * dim);
  // cos/sin of every (row, pair), shared by all heads and layers.
  const int pairs = hd / 2;
  cs_.resize(N * pairs);
  sn_.resize(N * pairs);
  for (size_t i = 0; i < N; ++i) {
    for (int j = 0; j < pairs; ++j) {
      const double angle = static_cast<double>(positions[i]) * inv_freq_[static_cast<size_t>(j)];
      cs_[i * pairs + j] = static_cast<float>(std::cos(angle));
      sn_[i * pairs + j] = static_cast<float>(std::sin(angle));
    }
  }
}

void Transformer::Layer(int l, std::span<const int> positions, float* x, float* k_layer, float* v_layer) {
  const ModelConfig& c = config();
  const int dim = c.dim, hid = c.hidden_dim, hd = c.head_dim(), pairs = hd / 2;
  const int n = static_cast<int>(positions.size());
  const size_t N = positions.size();
  auto rope = [&](float* rows, int width) {
    for (int i = 0; i < n; ++i) {
      float* r = rows + static_cast<size_t>(i) * width;
      for (int h = 0; h < width / hd; ++h) {
        for (int j = 0; j < pairs; ++j) {
          float* e = r + h * hd;
          kernels::rope_rotate(e[kernels::rope_first(j, false)], e[kernels::rope_second(j, hd, false)],
                               cs_[static_cast<size_t>(i) * pairs + j], sn_[static_cast<size_t>(i) * pairs + j]);
        }
      }
    }
  };
  const Checkpoint::Layer& L = w_.layer(l);
  for (int i = 0; i < n; ++i) RmsNorm(&x[static_cast<size_t>(i) * dim], L.rms_att, &xb_[static_cast<size_t>(i) * dim], dim);
  MatMul(xb_.data(), L.wq, q_.data(), n, dim, dim);
  rope(q_.data(), dim);
  ProjectKv(L, positions, k_layer, v_layer);
  Attention(positions.data(), n, k_layer, v_layer);
  MatMul(att_.data(), L.wo, tmp_.data(), n, dim, dim);
  for (size_t e = 0; e < N * dim; ++e) x[e] += tmp_[e];
  for (int i = 0; i < n; ++i) {
    RmsNorm(&x[static_cast<size_t>(i) * dim], L.rms_ffn, &xb_[static_cast<size_t>(i) * dim], dim);
  }
  MatMul(xb_.data(), L.w1, h1_.data(), n, dim, hid);
  MatMul(xb_.data(), L.w3, h3_.data(), n, dim, hid);
  for (size_t e = 0; e < N * hid; ++e) {
    const float a = h1_[e];
    h1_[e] = a / (1.0f + std::exp(-a)) * h3_[e];
  }
  MatMul(h1_.data(), L.w2, tmp_.data(), n, hid, dim);
  for (size_t e = 0; e < N * dim; ++e) x[e] += tmp_[e];
}

void Transformer::ProjectKv(const Checkpoint::Layer& L, std::span<const int> positions, float* k_layer,
                            float* v_layer) {
  const ModelConfig& c = config();
  const int dim = c.dim, kvd = c.kv_dim(), hd = c.head_dim(), pairs = hd / 2;
  const int n = static_cast<int>(positions.size());
  MatMul(xb_.data(), L.wk, k_.data(), n, dim, kvd);
  MatMul(xb_.data(), L.wv, v_.data(), n, dim, kvd);
  for (int i = 0; i < n; ++i) {
    float* r = k_.data() + static_cast<size_t>(i) * kvd;
    for (int h = 0; h < kvd / hd; ++h) {
      for (int j = 0; j < pairs; ++j) {
        float* e = r + h * hd;
        kernels::rope_rotate(e[kernels::rope_first(j, false)], e[kernels::rope_second(j, hd, false)],
                             cs_[static_cast<size_t>(i) * pairs + j], sn_[static_cast<size_t>(i) * pairs + j]);
      }
    }
    const size_t at = static_cast<size_t>(positions[i]) * kvd;
    std::memcpy(k_layer + at, r, kvd * sizeof(float));
    std::memcpy(v_layer + at, v_.data() + static_cast<size_t>(i) * kvd, kvd * sizeof(float));
  }
}

void Transformer::EmbedAndPrepare(int layer, std::span<const int> positions, std::span<const int> tokens,
                                  float* hidden) {
  const size_t dim = static_cast<size_t>(config().dim);
  if (layer == 0) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::memcpy(hidden + i * dim, w_.tok_emb() + static_cast<size_t>(tokens[i]) * dim, dim * sizeof(float));
    }
  }
  Prepare(positions);
}

Status Transformer::ForwardKv(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                              float* k_layer, float* v_layer, int total_positions) {
  KDN_RETURN_IF_ERROR(CheckLayerCall(layer, positions, tokens, total_positions));
  if (positions.empty()) return Status::Ok();
  EmbedAndPrepare(layer, positions, tokens, hidden);
  const size_t dim = static_cast<size_t>(config().dim);
  const Checkpoint::Layer& L = w_.layer(layer);
  for (size_t i = 0; i < positions.size(); ++i) RmsNorm(hidden + i * dim, L.rms_att, &xb_[i * dim], config().dim);
  ProjectKv(L, positions, k_layer, v_layer);
  return Status::Ok();
}

double Transformer::KvMacs() const {
  const ModelConfig& c = config();
  return 2.0 * c.dim * c.kv_dim();
}

double Transformer::LayerMacs(int total) const {
  const ModelConfig& c = config();
  const double dim = c.dim;
  // Q and O, K and V, the feed-forward's three matrices, and attention
  // (scores and the weighted sum: 2 x dim per attended position).
  return 2.0 * dim * dim + KvMacs() + 3.0 * dim * c.hidden_dim + dim * (total + 1.0);
}

Status Transformer::CheckLayerCall(int layer, std::span<const int> positions, std::span<const int> tokens,
                                   int total_positions) const {
  const ModelConfig& c = config();
  if (layer < 0 || layer >= c.n_layers) return Status::InvalidArgument("forward layer: no layer " + std::to_string(layer));
  if (positions.empty()) return Status::Ok();
  if (layer == 0 && tokens.size() != positions.size()) {
    return Status::InvalidArgument("forward layer: layer 0 needs one token per position");
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    if (positions[i] < 0 || positions[i] >= total_positions || (i > 0 && positions[i] <= positions[i - 1])) {
      return Status::InvalidArgument("forward layer: positions must ascend within [0, " +
                                     std::to_string(total_positions) + ")");
    }
    if (layer == 0 && (tokens[i] < 0 || tokens[i] >= c.vocab_size)) {
      return Status::InvalidArgument("forward layer: token id " + std::to_string(tokens[i]) + " outside the vocabulary");
    }
  }
  return Status::Ok();
}

Status Transformer::ForwardLayer(int layer, std::span<const int> positions, std::span<const int> tokens,
                                 float* hidden, float* k_layer, float* v_layer, int total_positions) {
  KDN_RETURN_IF_ERROR(CheckLayerCall(layer, positions, tokens, total_positions));
  if (positions.empty()) return Status::Ok();
  EmbedAndPrepare(layer, positions, tokens, hidden);
  Layer(layer, positions, hidden, k_layer, v_layer);
  return Status::Ok();
}

void Transformer::Logits(const float* hidden, int rows, std::vector<float>* logits) {
  const ModelConfig& c = config();
  const size_t dim = static_cast<size_t>(c.dim);
  xb_.resize(static_cast<size_t>(rows) * dim);
  for (int i = 0; i < rows; ++i) RmsNorm(hidden + static_cast<size_t>(i) * dim, w_.rms_final(), &xb_[static_cast<size_t>(i) * dim], c.dim);
  logits->resize(static_cast<size_t>(rows) * c.vocab_size);
  MatMul(xb_.data(), w_.classifier(), logits->data(), rows, c.dim, c.vocab_size);
}

Status Transformer::Forward(std::span<const int> tokens, int start, KvCache& cache, std::vector<float>* logits,
                            bool all_logits) {
  const ModelConfig& c = config();
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return Status::InvalidArgument("forward: no tokens");
  if (cache.layers() != c.n_layers || cache.kv_dim() != c.kv_dim()) {
    return Status::InvalidArgument("forward: the KV cache's shape does not match the model");
  }
  if (start < 0 || static_cast<std::int64_t>(start) + n > cache.max_seq()) {
    return Status::InvalidArgument("forward: positions [" + std::to_string(start) + ", " +
                                   std::to_string(static_cast<std::int64_t>(start) + n) +
                                   ") exceed the context of " + std::to_string(cache.max_seq()));
  }
  for (int t : tokens) {
    if (t < 0 || t >= c.vocab_size) {
      return Status::InvalidArgument("forward: token id " + std::to_string(t) + " outside the vocabulary of " +
                                     std::to_string(c.vocab_size));
    }
  }
  const int dim = c.dim;
  x_.resize(static_cast<size_t>(n) * dim);
  for (int i = 0; i < n; ++i) {
    std::memcpy(x_.data() + static_cast<size_t>(i) * dim, w_.tok_emb() + static_cast<size_t>(tokens[i]) * dim,
                dim * sizeof(float));
  }
  std::vector<int> positions(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) positions[static_cast<size_t>(i)] = start + i;
  Prepare(positions);
  for (int l = 0; l < c.n_layers; ++l) Layer(l, positions, x_.data(), cache.k(l, 0), cache.v(l, 0));
  if (logits) {
    const int first = all_logits ? 0 : n - 1;
    const int rows = n - first;
    for (int i = first; i < n; ++i) {
      RmsNorm(&x_[static_cast<size_t>(i) * dim], w_.rms_final(), &xb_[static_cast<size_t>(i - first) * dim], dim);
    }
    logits->resize(static_cast<size_t>(rows) * c.vocab_size);
    MatMul(xb_.data(), w_.classifier(), logits->data(), rows, dim, c.vocab_size);
  }
  return Status::Ok();
}

int Argmax(std::span<const float> logits) {
  int best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int>(i);
  }
  return best;
}

}  // namespace kdn::model
