// SPDX-License-Identifier: Apache-2.0
// See bench_kv.h.
#include "bench/bench_kv.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <thread>

#include "bench/bench_util.h"
#include "lab/codec/eval.h"
#include "kernels/common/half.h"
#include "lab/model/transformer.h"
#include "core/wire/envelope.h"
#include "core/util/dtype.h"

#ifndef KDN_BENCH_TEXTS_DIR
#define KDN_BENCH_TEXTS_DIR "bench/texts"
#endif

namespace kdn::bench {

namespace fs = std::filesystem;
using chunk::Bytes;
using chunk::ChunkRef;

std::string TextPath(const std::string& name) {
  const std::string built = std::string(KDN_BENCH_TEXTS_DIR) + "/" + name;
  std::error_code ec;
  if (fs::exists(built, ec)) return built;
  return "bench/texts/" + name;
}

RealKv Prefill(size_t windows) {
  RealKv r;
  auto m = refengine::LoadModel("", "", /*allow_random=*/false);
  if (!m.ok()) {
    r.why_not = m.status().message();
    return r;
  }
  const model::ModelConfig& cfg = m->weights->config();
  r.text_name = "heldout.txt";
  std::ifstream in(TextPath(r.text_name), std::ios::binary);
  if (!in) {
    r.why_not = "cannot read the text " + TextPath(r.text_name);
    return r;
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int> stream = codec::TokenizeStories(*m->tokenizer, text);
  r.window = cfg.seq_len / static_cast<int>(kChunkTokens) * static_cast<int>(kChunkTokens);
  if (r.window == 0) {
    r.why_not = "the model's context is shorter than a chunk";
    return r;
  }
  const size_t w = static_cast<size_t>(r.window);
  if (stream.size() < w + windows) {
    r.why_not = "the text is too short";
    return r;
  }
  r.stride = std::min<size_t>(w, (stream.size() - w) / std::max<size_t>(windows - 1, 1));
  r.layers = static_cast<std::uint32_t>(cfg.n_layers);
  r.heads = static_cast<std::uint32_t>(cfg.n_kv_heads);
  r.head_dim = static_cast<std::uint32_t>(cfg.head_dim());
  const double t0 = NowMs();
  model::Transformer t(*m->weights);
  model::KvCache cache = t.NewCache();
  for (size_t i = 0; i < windows; ++i) {
    std::vector<int> tokens(stream.begin() + static_cast<std::ptrdiff_t>(i * r.stride),
                            stream.begin() + static_cast<std::ptrdiff_t>(i * r.stride + w));
    tokens[0] = model::kBos;
    if (Status st = t.Forward(tokens, 0, cache, nullptr); !st.ok()) {
      r.why_not = st.message();
      return r;
    }
    r.kv.push_back(cache.Export(0, r.window));
    r.ids.emplace_back(tokens.begin(), tokens.end());
  }
  std::printf("  %zu windows of %d tokens of %s (stride %zu) prefilled in %.1f s\n", windows, r.window,
              r.text_name.c_str(), r.stride, (NowMs() - t0) / 1e3);
  r.model = std::move(*m);
  return r;
}

std::vector<std::uint16_t> ToHalf(const std::vector<float>& v) {
  std::vector<std::uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = kernels::float_to_half(v[i]);
  return h;
}

ChunkSet MakeChunks(const Shape& s, size_t count, const RealKv& real) {
  ChunkSet set;
  set.shape = s;
  set.ns = keys::NamespaceHash("bench");
  const bool use_real = s.dtype == 0 && real.model && s.layers == real.layers && s.heads == real.heads &&
                        s.head_dim == real.head_dim && real.kv.size() * static_cast<size_t>(real.window) / kChunkTokens >= count;
  set.content = use_real ? "the reference model's KV (stories260K, f32) of bench/texts/" + real.text_name
                         : "deterministic pattern (not model KV)";
  const keys::Digest model = keys::ModelFingerprint({s.layers, s.heads, s.head_dim, s.dtype, 10000.0f, 0, s.head_dim,
                                                     std::string("bench-") + s.suffix});
  const size_t per_window = use_real ? static_cast<size_t>(real.window) / kChunkTokens : 1;
  for (size_t i = 0; i < count; ++i) {
    auto c = std::make_shared<chunk::Chunk>();
    c->meta.key = keys::ChunkKey(i, "bench", model, keys::Digest{}, {});
    c->meta.model = model;
    c->meta.ns_hash = set.ns;
    c->meta.dtype = s.dtype;
    c->meta.layers = s.layers;
    c->meta.kv_heads = s.heads;
    c->meta.head_dim = s.head_dim;
    c->meta.tokens = kChunkTokens;
    if (use_real) {
      c->payload = Slice(real.kv[i / per_window], s.layers, s.heads * s.head_dim, static_cast<size_t>(real.window),
                         (i % per_window) * kChunkTokens, kChunkTokens);
    } else {
      c->payload = chunk::Payload::Uninitialized(s.chunk_bytes());
      std::uint32_t x = 0x9e3779b9u * static_cast<std::uint32_t>(i + 1);
      for (size_t b = 0; b + 4 <= c->payload.size(); b += 4) {
        x = x * 1664525u + 1013904223u;
        std::memcpy(c->payload.data() + b, &x, 4);
      }
    }
    auto env = wire::EncodeEnvelope(*c);
    if (!env.ok()) throw std::runtime_error("bench: cannot frame a chunk: " + env.status().message());
    set.envelopes.push_back(std::move(env).value());
    set.chunks.push_back(std::move(c));
  }
  return set;
}

nlohmann::json ShapeParams(const ChunkSet& s, int repeats) {
  const Shape& sh = s.shape;
  return {{"chunk_bytes", sh.chunk_bytes()},
          {"envelope_bytes", s.envelope_bytes()},
          {"chunks", s.chunks.size()},
          {"tokens", kChunkTokens},
          {"layers", sh.layers},
          {"kv_heads", sh.heads},
          {"head_dim", sh.head_dim},
          {"dtype", sh.dtype == 0 ? "f32" : "f16"},
          {"content", s.content},
          {"repeats", repeats},
          {"cores", std::thread::hardware_concurrency()}};
}

store::ModelKv ModelOf(const RealKv& real, std::uint32_t dtype) {
  store::ModelKv m;
  m.fingerprint = keys::ModelFingerprint(
      {real.layers, real.heads, real.head_dim, dtype, 10000.0f, 0, real.head_dim, real.model->fingerprint});
  m.shape = {real.layers, real.heads, real.head_dim, static_cast<std::int64_t>(kdn::DtypeBytes(dtype))};
  m.dtype = dtype;
  return m;
}

// One view over a canonical buffer of `tokens` tokens.
Result<store::ResolvedViews> CanonicalViews(const store::ModelKv& m, void* data, std::uint64_t tokens) {
  store::ViewSpec v;
  v.dtype = m.dtype;
  v.data = data;
  v.size_bytes = static_cast<std::uint64_t>(m.bytes_per_token()) * tokens;
  v.num_tokens = tokens;
  return store::ResolvedViews::Resolve(m, std::span<const store::ViewSpec>(&v, 1), tokens);
}

store::TokenKeys Keys(const std::vector<std::int32_t>& t) {
  store::TokenKeys k;
  k.tokens = t;
  return k;
}

Result<std::shared_ptr<store::Runtime>> OneTierRuntime(store::TierSpec::Kind kind, const std::string& address,
                                                       const std::string& codec, const std::string& token,
                                                       std::uint32_t timeout_ms) {
  store::TierSpec tier;
  tier.kind = kind;
  tier.address = address;
  tier.codec = codec;
  tier.token = token;
  tier.timeout_ms = timeout_ms;
  store::StoreOptions o;
  o.chunk_tokens = kChunkTokens;
  o.tiers = {tier};
  return store::Runtime::Create(o, 1);
}

WindowKv::WindowKv(const RealKv& r) : real(r), m16(ModelOf(r, 1)), windows(r.kv.size()) {
  window_bytes = static_cast<std::uint64_t>(m16.bytes_per_token()) * static_cast<std::uint64_t>(real.window);
  kv_bytes = window_bytes * windows;
  for (const std::vector<float>& kv : real.kv) src.push_back(ToHalf(kv));
  dst.assign(static_cast<size_t>(kv_bytes / 2), 1);
  for (size_t w = 0; w < windows; ++w) {
    auto v = CanonicalViews(m16, dst.data() + w * window_bytes / 2, static_cast<std::uint64_t>(real.window));
    if (!v.ok()) return;
    dviews.push_back(std::move(v).value());
  }
  ok = true;
}

bool WindowKv::StoreAll(store::Runtime& rt, const std::string& ns, const char* codec) {
  for (size_t w = 0; w < windows; ++w) {
    auto views = CanonicalViews(m16, src[w].data(), static_cast<std::uint64_t>(real.window));
    Result<std::uint64_t> stored =
        views.ok() ? rt.Store(m16, ns, Keys(real.ids[w]), *views) : Result<std::uint64_t>(views.status());
    if (!stored.ok() || *stored != static_cast<std::uint64_t>(real.window)) {
      std::fprintf(stderr, "bench: delivery: store of window %zu (%s): %s\n", w, codec,
                   stored.ok() ? "partial" : stored.status().message().c_str());
      return false;
    }
  }
  return true;
}

void WindowKv::Retrieve(store::Runtime& rt, const std::string& ns, size_t w, std::atomic<bool>& whole,
                        std::atomic<bool>& lossy) const {
  auto got = rt.Retrieve(m16, ns, Keys(real.ids[w]), dviews[w]);
  if (!got.ok() || got->tokens != static_cast<std::uint64_t>(real.window)) whole = false;
  if (got.ok() && got->lossy) lossy = true;
}

bool WindowKv::CheckAndReset(const char* side, bool raw, bool whole, bool lossy) {
  bool same = true;
  for (size_t w = 0; raw && same && w < windows; ++w) {
    same = std::memcmp(dst.data() + w * window_bytes / 2, src[w].data(), window_bytes) == 0;
  }
  if (!whole || lossy == raw || !same) {
    std::fprintf(stderr, "bench: delivery: the %s side returned %s\n", side,
                 !whole ? "a partial prefix" : lossy ? "lossy KV" : raw ? "other bytes" : "KV not marked lossy");
    return false;
  }
  std::fill(dst.begin(), dst.end(), std::uint16_t{1});
  return true;
}

}  // namespace kdn::bench
