// SPDX-License-Identifier: Apache-2.0
// Shared by the benchmarks that move chunks through a tier (remote, redis):
// the two chunk shapes, the reference model's real KV (prefilled windows of
// a held-out text), chunks of a shape framed as envelopes, and the views and
// keys a runtime takes for that KV.
// Thread-safety: plain functions and values; none keeps state.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/chunk/chunk.h"
#include "core/keys/hash.h"
#include "refengine/model_loader.h"
#include "core/engine/kv_store.h"
#include "core/engine/kv_views.h"
#include "core/runtime/runtime.h"
#include "core/util/dtype.h"

namespace kdn::bench {

// Tokens per chunk: the runtime's default (StoreOptions::chunk_tokens).
inline constexpr std::uint32_t kChunkTokens = 256;

struct Shape {
  const char* suffix;
  std::uint32_t layers, heads, head_dim, dtype;  // dtype: 0 f32, 1 f16
  std::uint64_t elem_bytes() const { return kdn::DtypeBytes(dtype); }
  std::uint64_t row_bytes() const { return std::uint64_t{heads} * head_dim * elem_bytes(); }
  std::uint64_t chunk_bytes() const { return std::uint64_t{layers} * 2 * kChunkTokens * row_bytes(); }
};
// The reference model's 256-token chunk at f32 (5 x 2 x 4 x 8 x 256 x 4 =
// 327680 B) and a Llama-3-8B-shaped one at f16 (32 MiB).
inline constexpr Shape kRef{"ref", 5, 4, 8, 0};
inline constexpr Shape k8b{"32mib", 32, 8, 128, 1};

// The reference model's KV: windows of its whole context prefilled from
// position 0 (the first token BOS, as a fresh prompt), canonical f32.
struct RealKv {
  std::optional<refengine::LoadedModel> model;
  std::string text_name;
  int window = 0;  // tokens per window
  size_t stride = 0;
  std::vector<std::vector<std::int32_t>> ids;
  std::vector<std::vector<float>> kv;  // [layer][k|v][token][head][dim]
  std::uint32_t layers = 0, heads = 0, head_dim = 0;
  std::string why_not;  // when absent
};

// A text of bench/texts, from the source tree (or the working directory).
std::string TextPath(const std::string& name);

// `windows` windows of the held-out text prefilled by the reference model;
// without the model, `model` is absent and why_not says why.
RealKv Prefill(size_t windows);

// Tokens [begin, begin + n) of a canonical window of `window` tokens, as a
// canonical chunk payload (per layer and k|v, those tokens' rows).
template <typename T>
chunk::Payload Slice(const std::vector<T>& kv, std::uint32_t layers, size_t row_elems, size_t window, size_t begin,
                     size_t n) {
  chunk::Payload p = chunk::Payload::Uninitialized(std::size_t{layers} * 2 * n * row_elems * sizeof(T));
  auto* out = reinterpret_cast<T*>(p.data());
  for (size_t lk = 0; lk < std::size_t{layers} * 2; ++lk) {
    std::memcpy(out + lk * n * row_elems, kv.data() + (lk * window + begin) * row_elems, n * row_elems * sizeof(T));
  }
  return p;
}

std::vector<std::uint16_t> ToHalf(const std::vector<float>& v);

// Chunks of one shape, as a tier and a raw baseline move them.
struct ChunkSet {
  Shape shape;
  std::string content;
  std::vector<chunk::ChunkRef> chunks;
  std::vector<chunk::Bytes> envelopes;  // what travels: each chunk framed
  keys::Digest ns{};
  std::uint64_t envelope_bytes() const { return envelopes.empty() ? 0 : envelopes.front().size(); }
};

// `count` chunks of shape `s` in namespace "bench": the reference model's KV
// when `real` has it for this shape and enough of it, else a deterministic
// pattern. Throws std::runtime_error when a chunk cannot be framed.
ChunkSet MakeChunks(const Shape& s, size_t count, const RealKv& real);

// The params every record of a ChunkSet carries (shape, sizes, content).
nlohmann::json ShapeParams(const ChunkSet& s, int repeats);

// The reference model's KV layout at dtype 0 (f32) or 1 (f16).
store::ModelKv ModelOf(const RealKv& real, std::uint32_t dtype);

// One view over a canonical buffer of `tokens` tokens.
Result<store::ResolvedViews> CanonicalViews(const store::ModelKv& m, void* data, std::uint64_t tokens);

store::TokenKeys Keys(const std::vector<std::int32_t>& t);

// A runtime whose only tier is of `kind` at `address` and keeps chunks in
// `codec`, at kChunkTokens tokens per chunk (`token`: a remote tier's bearer
// token or a redis tier's password; `timeout_ms`: the deadline of a call).
Result<std::shared_ptr<store::Runtime>> OneTierRuntime(store::TierSpec::Kind kind, const std::string& address,
                                                       const std::string& codec, const std::string& token = "",
                                                       std::uint32_t timeout_ms = store::TierSpec().timeout_ms);

// The reference model's windows as f16 KV (as an engine holds it), stored
// through runtimes and retrieved back into one destination buffer, a view
// per window, each delivery checked against what was stored. Needs
// real.model. Retrieve may be called from several threads at once (each
// window by one of them); the rest from one thread.
struct WindowKv {
  explicit WindowKv(const RealKv& real);
  const RealKv& real;
  store::ModelKv m16;
  size_t windows = 0;
  std::uint64_t window_bytes = 0, kv_bytes = 0;
  std::vector<std::vector<std::uint16_t>> src;  // per window, canonical f16
  std::vector<std::uint16_t> dst;               // every window, back to back
  std::vector<store::ResolvedViews> dviews;     // per window, into dst
  bool ok = false;                              // the views resolved

  // Stores every window through `rt` in `ns`; false, saying why on stderr.
  bool StoreAll(store::Runtime& rt, const std::string& ns, const char* codec);
  // Retrieves window w into dst; clears `whole` when not all of it came
  // back, sets `lossy` when it was decoded from a lossy codec.
  void Retrieve(store::Runtime& rt, const std::string& ns, size_t w, std::atomic<bool>& whole,
                std::atomic<bool>& lossy) const;
  // Once every window was retrieved: whether it all came back, lossless and
  // the same bytes from a raw side, lossy from another (else says what on
  // stderr); dst is reset for the next run.
  bool CheckAndReset(const char* side, bool raw, bool whole, bool lossy);
};

}  // namespace kdn::bench
