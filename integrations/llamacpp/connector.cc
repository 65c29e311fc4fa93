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

}  // namespace

Result<kdn_model_spec> ModelSpecFor(const Session& session, const std::string& gguf, std::string* fingerprint) {
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

Connector::Connector(Session& session, const kdn_model* model, std::string ns)
    : session_(session), model_(model), ns_(std::move(ns)) {}

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
  CanonicalKv kv;
  kv.dtype = dtype;
  kv.v_trans = !session_.options().flash_attn;  // llama.cpp transposes V without flash attention
  kv.tokens = m;
  kv.bytes.resize(static_cast<std::size_t>(2ull * shape.layers * m * row));
  for (std::uint64_t lk = 0; lk < 2ull * shape.layers; ++lk) {
    std::memcpy(kv.bytes.data() + lk * m * row, buf.data() + lk * n * row, static_cast<std::size_t>(m * row));
  }
  Result<std::vector<std::uint8_t>> blob = CanonicalToBlob(kv, shape);
  if (!blob.ok() || !session_.RestoreSequence(*blob, seq).ok()) {
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
  Result<CanonicalKv> kv = BlobToCanonical(blob->data(), blob->size(), ShapeOf(session_));
  if (!kv.ok()) return kv.status();
  if (kv->tokens < tokens.size()) {
    return Status::InvalidArgument("llama connector: the sequence holds " + std::to_string(kv->tokens) +
                                   " positions, fewer than the " + std::to_string(tokens.size()) + " tokens given");
  }
  // The first tokens.size() positions: a prefix of each (layer, k|v) plane.
  const std::uint64_t n = tokens.size(), all = kv->tokens;
  const std::uint64_t row = ShapeOf(session_).channels() * kdn::DtypeBytes(kv->dtype);
  std::vector<std::uint8_t> mine(static_cast<std::size_t>(2ull * session_.layers() * n * row));
  for (std::uint64_t lk = 0; lk < 2ull * session_.layers(); ++lk) {
    std::memcpy(mine.data() + lk * n * row, kv->bytes.data() + lk * all * row, static_cast<std::size_t>(n * row));
  }
  const kdn_kv_view view = CanonicalView(kv->dtype, mine.data(), mine.size(), n);
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = tokens.data();
  req.num_tokens = tokens.size();
  kdn_kv_result out = KDN_KV_RESULT_INIT;
  KDN_RETURN_IF_ERROR(FromC(kdn_kv_store(model_, ns_.data(), ns_.size(), &req, &view, 1, &out), "store"));
  return out.tokens;
}

}  // namespace kdn::llamacpp
