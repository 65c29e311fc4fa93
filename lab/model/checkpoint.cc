// SPDX-License-Identifier: Apache-2.0
#include "lab/model/checkpoint.h"

#include <cstring>
#include <fstream>
#include <random>

namespace kdn::model {
namespace {

constexpr int kHeaderInts = 7;
constexpr std::int64_t kHeaderBytes = kHeaderInts * 4;

}  // namespace

Status ModelConfig::Validate() const {
  auto bad = [](const std::string& m) { return Status::InvalidArgument("model header: " + m); };
  // Bounds keep every size computation far from overflow.
  if (dim <= 0 || dim > (1 << 16)) return bad("dim " + std::to_string(dim) + " out of range 1..65536");
  if (hidden_dim <= 0 || hidden_dim > (1 << 18))
    return bad("hidden_dim " + std::to_string(hidden_dim) + " out of range 1..262144");
  if (n_layers <= 0 || n_layers > 1024) return bad("n_layers " + std::to_string(n_layers) + " out of range 1..1024");
  if (n_heads <= 0 || n_heads > dim) return bad("n_heads " + std::to_string(n_heads) + " out of range 1..dim");
  if (dim % n_heads != 0)
    return bad("dim " + std::to_string(dim) + " is not a multiple of n_heads " + std::to_string(n_heads));
  if (head_dim() % 2 != 0) return bad("head_dim " + std::to_string(head_dim()) + " is odd (RoPE needs pairs)");
  if (n_kv_heads <= 0 || n_kv_heads > n_heads || n_heads % n_kv_heads != 0)
    return bad("n_kv_heads " + std::to_string(n_kv_heads) + " must divide n_heads " + std::to_string(n_heads));
  if (vocab_size <= 0 || vocab_size > (1 << 21))
    return bad("vocab_size " + std::to_string(vocab_size) + " out of range 1..2097152");
  if (seq_len <= 0 || seq_len > (1 << 20)) return bad("seq_len " + std::to_string(seq_len) + " out of range 1..1048576");
  return Status::Ok();
}

ModelConfig Stories260KConfig() {
  ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 5;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.vocab_size = 512;
  c.seq_len = 512;
  c.shared_classifier = true;
  return c;
}

std::int64_t Checkpoint::FloatCount(const ModelConfig& c) {
  const std::int64_t d = c.dim, h = c.hidden_dim, L = c.n_layers, kv = c.kv_dim(), v = c.vocab_size;
  std::int64_t n = v * d;                  // tok_emb
  n += L * d;                              // rms_att
  n += L * d * d + 2 * L * kv * d;         // wq, wk, wv
  n += L * d * d;                          // wo
  n += L * d;                              // rms_ffn
  n += 3 * L * h * d;                      // w1, w2, w3
  n += d;                                  // rms_final
  n += std::int64_t{c.seq_len} * c.head_dim();  // RoPE tables (cos, sin): seq_len x head_dim/2 each
  if (!c.shared_classifier) n += v * d;    // wcls
  return n;
}

void Checkpoint::Bind() {
  const ModelConfig& c = config_;
  const std::int64_t d = c.dim, h = c.hidden_dim, L = c.n_layers, kv = c.kv_dim(), v = c.vocab_size;
  const float* p = data_.data();
  tok_emb_ = p;
  p += v * d;
  const float* rms_att = p;
  p += L * d;
  const float* wq = p;
  p += L * d * d;
  const float* wk = p;
  p += L * kv * d;
  const float* wv = p;
  p += L * kv * d;
  const float* wo = p;
  p += L * d * d;
  const float* rms_ffn = p;
  p += L * d;
  const float* w1 = p;
  p += L * h * d;
  const float* w2 = p;
  p += L * d * h;
  const float* w3 = p;
  p += L * h * d;
  rms_final_ = p;
  p += d;
  p += std::int64_t{c.seq_len} * c.head_dim();
  wcls_ = c.shared_classifier ? tok_emb_ : p;
  layers_.clear();
  for (std::int64_t l = 0; l < L; ++l) {
    layers_.push_back(Layer{rms_att + l * d, wq + l * d * d, wk + l * kv * d, wv + l * kv * d, wo + l * d * d,
                            rms_ffn + l * d, w1 + l * h * d, w2 + l * d * h, w3 + l * h * d});
  }
}

Result<Checkpoint> Checkpoint::Parse(const std::vector<std::uint8_t>& bytes) {
  if (bytes.size() < static_cast<size_t>(kHeaderBytes)) {
    return Status::InvalidArgument("model file truncated: " + std::to_string(bytes.size()) +
                                   " bytes, the header alone is 28");
  }
  std::int32_t h[kHeaderInts];
  std::memcpy(h, bytes.data(), sizeof h);  // little-endian hosts only (x86-64, aarch64)
  ModelConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] == INT32_MIN ? 0 : (h[5] > 0 ? h[5] : -h[5]);
  c.seq_len = h[6];
  KDN_RETURN_IF_ERROR(c.Validate());
  const std::int64_t floats = FloatCount(c);
  const std::int64_t expected = kHeaderBytes + floats * 4;
  const auto actual = static_cast<std::int64_t>(bytes.size());
  if (actual < expected) {
    return Status::InvalidArgument("model file truncated: " + std::to_string(actual) + " bytes, the header (dim " +
                                   std::to_string(c.dim) + ", layers " + std::to_string(c.n_layers) + ", vocab " +
                                   std::to_string(c.vocab_size) + ") needs " + std::to_string(expected));
  }
  if (actual > expected) {
    return Status::InvalidArgument("model file oversized: " + std::to_string(actual) + " bytes, the header needs " +
                                   std::to_string(expected) + " (wrong header, or not a llama2.c checkpoint)");
  }
  std::vector<float> data(static_cast<size_t>(floats));
  std::memcpy(data.data(), bytes.data() + kHeaderBytes, static_cast<size_t>(floats) * 4);
  return Checkpoint(c, std::move(data));
}

Result<Checkpoint> Checkpoint::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return Status::NotFound("cannot open model file '" + path + "'");
  const auto size = static_cast<std::int64_t>(in.tellg());
  // The largest accepted model stays far below this; refuse absurd files early.
  if (size < 0 || size > (std::int64_t{1} << 36)) return Status::InvalidArgument("model file '" + path + "' too large");
  std::vector<std::uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    return Status::InvalidArgument("cannot read model file '" + path + "'");
  }
  auto r = Parse(bytes);
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

Checkpoint Checkpoint::Random(const ModelConfig& config, std::uint64_t seed) {
  std::vector<float> data(static_cast<size_t>(FloatCount(config)));
  std::mt19937_64 rng(seed);
  const float scale = 1.0f / static_cast<float>(config.dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& x : data) x = normal(rng) * scale * 8.0f;
  Checkpoint c(config, std::move(data));
  // RMSNorm gains of one, like a freshly initialised model.
  auto ones = [](const float* p, int n) { std::fill(const_cast<float*>(p), const_cast<float*>(p) + n, 1.0f); };
  for (int l = 0; l < config.n_layers; ++l) {
    ones(c.layer(l).rms_att, config.dim);
    ones(c.layer(l).rms_ffn, config.dim);
  }
  ones(c.rms_final(), config.dim);
  return c;
}

}  // namespace kdn::model
