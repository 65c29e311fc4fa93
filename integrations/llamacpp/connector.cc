// SPDX-License-Identifier: Apache-2.0
// The llama.cpp connector; the contract is in connector.h.
#include "connector.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>

#include "core/keys/hash.h"
#include "state_blob.h"
#include "core/util/dtype.h"

namespace kdn::llamacpp {
namespace {

// SHA-256 of a file, in hex.
Result<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("llama connector: cannot read '" + path + "'");
  keys::Hasher h;
  std::vector<char> buf(std::size_t{1} << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.Bytes(buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  return keys::ToHex(h.Finish());
}

KvShape ShapeOf(const Session& s) { return KvShape{s.layers(), s.kv_heads(), s.head_dim()}; }
std::uint32_t DtypeOf(const Session& s) { return s.options().f16_cache ? 1u : 0u; }

// The view of canonical bytes of `tokens` tokens.
kdn_kv_view CanonicalView(std::uint32_t dtype, void* data, std::uint64_t bytes, std::uint64_t tokens) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.dtype = static_cast<kdn_dtype>(dtype);
  v.data = data;
  v.size_bytes = bytes;
  v.num_tokens = tokens;
  return v;
}

Status FromC(kdn_status s, const char* what) {
  if (s == KDN_OK) return Status::Ok();
  return Status(static_cast<Code>(s), std::string("llama connector: ") + what + ": " + kdn_last_error_message());
}

// Models whose cache the connector does not map yet.
Status NotTakenYet(const Session& s) {
  if (s.recurrent()) {
    return Status::Unsupported(
        "llama connector: the model has recurrent layers (Mamba, a hybrid): llama.cpp's recurrent state is "
        "not mapped onto kdn's yet (docs/model-kinds.md)");
  }
  const std::string arch = s.Metadata("general.architecture");
  if (!s.Metadata(arch + ".attention.kv_lora_rank").empty()) {
    return Status::Unsupported("llama connector: the model (" + arch +
                               ") caches a latent (multi-head latent attention): not mapped onto kdn's yet");
  }
  return Status::Ok();
}

// The spec of the session's KV, whatever its layers.
Result<kdn_model_spec> SpecOf(const Session& session, const std::string& gguf, std::string* fingerprint) {
  Result<std::string> sha = FileSha256(gguf);
  if (!sha.ok()) return sha.status();
  // What changes the KV's bytes besides the shape and the dtype: the weights
  // and tokenizer (the file) and the engine that computed them.
  *fingerprint = "llama.cpp/" KDN_LLAMACPP_BUILD " gguf-sha256=" + *sha;
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = session.layers();
  spec.num_kv_heads = session.kv_heads();
  spec.head_dim = session.head_dim();
  spec.dtype = static_cast<kdn_dtype>(DtypeOf(session));
  spec.fingerprint = fingerprint->data();
  spec.fingerprint_len = fingerprint->size();
  return spec;
}

}  // namespace

Result<kdn_model_spec> ModelSpecFor(const Session& session, const std::string& gguf, std::string* fingerprint) {
  KDN_RETURN_IF_ERROR(NotTakenYet(session));
  if (session.sliding_window() > 0) {
    return Status::Unsupported("llama connector: the model has sliding-window layers (window " +
                               std::to_string(session.sliding_window()) +
                               "): take its spec with ModelSpecFor(session, gguf, CacheLayout*)");
  }
  return SpecOf(session, gguf, fingerprint);
}

Result<kdn_model_spec> ModelSpecFor(Session& session, const std::string& gguf, CacheLayout* layout) {
  *layout = CacheLayout{};
  KDN_RETURN_IF_ERROR(NotTakenYet(session));
  const std::uint32_t window = session.sliding_window();
  if (window > 0) {
    // How llama.cpp splits the layers between its two caches: the layer
    // counts of a state of one token.
    const KvShape any[2] = {{0, session.kv_heads(), session.head_dim()}, {0, session.kv_heads(), session.head_dim()}};
    Result<std::vector<std::uint8_t>> before = session.SaveSequence();
    if (!before.ok()) return before.status();
    Result<std::vector<CanonicalKv>> held = BlobToCanonical(before->data(), before->size(), any);
    if (!held.ok() || (*held)[0].tokens != 0) {
      return Status::InvalidArgument(
          "llama connector: ModelSpecFor reads a sliding-window model's cache layout from an empty session");
    }
    KDN_RETURN_IF_ERROR(session.Decode({0}));
    Result<std::vector<std::uint8_t>> probe = session.SaveSequence();
    session.Clear();
    if (!probe.ok()) return probe.status();
    Result<std::vector<CanonicalKv>> caches = BlobToCanonical(probe->data(), probe->size(), any);
    if (!caches.ok()) {
      return Status::Unsupported("llama connector: a sliding-window model's state is not two caches (" +
                                 caches.status().message() + ")");
    }
    const CanonicalKv* base = &(*caches)[0];
    const CanonicalKv* swa = &(*caches)[1];
    const std::uint64_t row = std::uint64_t{any[0].kv_heads} * any[0].head_dim * kdn::DtypeBytes(base->dtype);
    const auto base_layers = static_cast<std::uint32_t>(base->bytes.size() / (2 * row));
    const auto swa_layers = static_cast<std::uint32_t>(swa->bytes.size() / (2 * row));
    if (base_layers + swa_layers != session.layers() || swa_layers == 0) {
      return Status::Unsupported("llama connector: llama.cpp's caches hold " + std::to_string(base_layers) + " + " +
                                 std::to_string(swa_layers) + " layers, the model has " +
                                 std::to_string(session.layers()));
    }
    layout->swa_layers = swa_layers;
    layout->window = window;
    layout->windows.assign(base_layers, 0);
    layout->windows.resize(session.layers(), window);
  }
  Result<kdn_model_spec> spec = SpecOf(session, gguf, &layout->fingerprint);
  if (spec.ok() && window > 0) spec->layer_windows = layout->windows.data();
  return spec;
}

Connector::Connector(Session& session, const kdn_model* model, std::string ns, CacheLayout layout)
    : session_(session), model_(model), ns_(std::move(ns)), layout_(std::move(layout)) {}

std::vector<Connector::Part> Connector::Parts() const {
  const std::uint32_t L = session_.layers(), S = layout_.swa_layers;
  if (S == 0) return {Part{0, L}};
  return {Part{0, L - S}, Part{L - S, S}};
}

Result<Connector::Restored> Connector::Restore(const std::vector<std::int32_t>& prompt) {
  if (prompt.size() < 2) return Restored{};  // nothing to restore before the last token
  // Leave the last token to decode (its logits are not in the state).
  return RestoreUpTo(prompt, prompt.size() - 1, 0);
}

Result<Connector::Restored> Connector::RestoreInto(const std::vector<std::int32_t>& tokens, std::int32_t seq) {
  if (tokens.empty()) return Restored{};
  return RestoreUpTo(tokens, tokens.size(), seq);
}

Result<Connector::Restored> Connector::RestoreUpTo(const std::vector<std::int32_t>& prompt, std::uint64_t most,
                                                   std::int32_t seq) {
  Restored r;
  const KvShape shape = ShapeOf(session_);
  const std::uint32_t dtype = DtypeOf(session_);
  const std::uint64_t row = shape.channels() * kdn::DtypeBytes(dtype), n = prompt.size();
  std::vector<std::uint8_t> buf(static_cast<std::size_t>(2ull * shape.layers * n * row));
  const kdn_kv_view view = CanonicalView(dtype, buf.data(), buf.size(), n);
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = prompt.data();
  req.num_tokens = prompt.size();
  kdn_kv_result got = KDN_KV_RESULT_INIT;
  KDN_RETURN_IF_ERROR(FromC(kdn_kv_retrieve(model_, ns_.data(), ns_.size(), &req, &view, 1, &got), "retrieve"));
  const std::uint64_t m = std::min<std::uint64_t>(got.tokens, most);
  if (m == 0) return r;
  // One state per cache of the session (its layers' planes, the first m
  // tokens; the SWA cache's window), one after the other as llama.cpp
  // writes them.
  std::vector<CanonicalKv> caches;
  std::vector<KvShape> shapes;
  for (const Part& part : Parts()) {
    // The SWA cache gets the window's positions only, as llama.cpp keeps it.
    const std::uint64_t from = part.first > 0 && m > layout_.window ? m - layout_.window : 0;
    CanonicalKv kv;
    kv.dtype = dtype;
    kv.v_trans = !session_.options().flash_attn;  // llama.cpp transposes V without flash attention
    kv.first = from;
    kv.tokens = m - from;
    kv.bytes.resize(static_cast<std::size_t>(2ull * part.layers * kv.tokens * row));
    for (std::uint64_t lk = 0; lk < 2ull * part.layers; ++lk) {
      std::memcpy(kv.bytes.data() + lk * kv.tokens * row, buf.data() + ((2ull * part.first + lk) * n + from) * row,
                  static_cast<std::size_t>(kv.tokens * row));
    }
    caches.push_back(std::move(kv));
    shapes.push_back(KvShape{part.layers, shape.kv_heads, shape.head_dim});
  }
  Result<std::vector<std::uint8_t>> blob = CanonicalToBlob(caches, shapes);
  const bool ok = blob.ok();
  if (!ok || !session_.RestoreSequence(*blob, seq).ok()) {
    // A miss: the host recomputes.
    if (seq == 0) {
      session_.Clear();
    } else {
      session_.SeqRemove(seq, -1, -1);
    }
    return r;
  }
  r.tokens = m;
  r.lossy = (got.flags & KDN_RESULT_LOSSY) != 0;
  return r;
}

Status Connector::Prefill(const std::vector<std::int32_t>& tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(session_.Decode(tokens));
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  // A report kdn refuses (no tokens, a zero time) only loses a sample.
  if (!tokens.empty() && ns > 0) kdn_model_report_prefill(model_, tokens.size(), static_cast<std::uint64_t>(ns));
  return Status::Ok();
}

Result<std::uint64_t> Connector::Save(const std::vector<std::int32_t>& tokens) {
  if (tokens.empty()) return std::uint64_t{0};
  Result<std::vector<std::uint8_t>> blob = session_.SaveSequence();
  if (!blob.ok()) return blob.status();
  // Each cache's state in turn (one, or a sliding-window model's two), its
  // first tokens.size() positions: a prefix of each (layer, k|v) plane.
  const KvShape shape = ShapeOf(session_);
  const std::uint64_t n = tokens.size();
  const std::vector<Part> parts = Parts();
  std::vector<KvShape> shapes;
  for (const Part& p : parts) shapes.push_back(KvShape{p.layers, shape.kv_heads, shape.head_dim});
  Result<std::vector<CanonicalKv>> caches = BlobToCanonical(blob->data(), blob->size(), shapes);
  if (!caches.ok()) return caches.status();
  std::vector<std::uint8_t> mine;
  std::uint32_t dtype = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    // The full layers' cache holds every position; the SWA cache at least
    // the window's (kdn reads nothing older of those layers; zero here).
    const CanonicalKv& kv = (*caches)[i];
    const std::uint64_t from = i > 0 && n > layout_.window ? n - layout_.window : 0;
    if (kv.first > from || kv.first + kv.tokens < n) {
      return Status::InvalidArgument("llama connector: the sequence's cache holds positions " +
                                     std::to_string(kv.first) + ".." + std::to_string(kv.first + kv.tokens) +
                                     ", not " + std::to_string(from) + ".." + std::to_string(n) + " of the " +
                                     std::to_string(n) + " tokens given");
    }
    const std::uint64_t all = kv.tokens;
    const std::uint64_t row = shape.channels() * kdn::DtypeBytes(kv.dtype);
    dtype = kv.dtype;
    const std::size_t base = mine.size();
    mine.resize(base + static_cast<std::size_t>(2ull * parts[i].layers * n * row));
    for (std::uint64_t lk = 0; lk < 2ull * parts[i].layers; ++lk) {
      std::memcpy(mine.data() + base + (lk * n + kv.first) * row, kv.bytes.data() + lk * all * row,
                  static_cast<std::size_t>((n - kv.first) * row));
    }
  }
  const kdn_kv_view view = CanonicalView(dtype, mine.data(), mine.size(), n);
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = tokens.data();
  req.num_tokens = tokens.size();
  kdn_kv_result out = KDN_KV_RESULT_INIT;
  KDN_RETURN_IF_ERROR(FromC(kdn_kv_store(model_, ns_.data(), ns_.size(), &req, &view, 1, &out), "store"));
  return out.tokens;
}

}  // namespace kdn::llamacpp
