#include "store/knowledge.h"

#include <cstring>
#include <unordered_set>

#include "ref/kv_view_ref.h"

namespace kdn::store {

KnowledgeIndex::Doc* KnowledgeIndex::Find(const ModelKv& model, std::string_view ns, const std::string& doc_id) {
  SweepLocked();
  auto it = docs_.find(DocKey{model.fingerprint, std::string(ns), doc_id});
  return it == docs_.end() ? nullptr : &it->second;
}

void KnowledgeIndex::DropLocked(const DocKey& key) {
  auto it = docs_.find(key);
  if (it == docs_.end()) return;
  ReleasePinsLocked(it->second);
  for (const keys::Digest& k : it->second.stored_keys) {
    auto r = refs_.find(k);
    if (r != refs_.end() && --r->second > 0) continue;  // another document shares it
    if (r != refs_.end()) refs_.erase(r);
    store_.chain().Erase(k);
  }
  docs_.erase(it);
  generation_.fetch_add(1, std::memory_order_release);
}

Status KnowledgeIndex::ApplyPinLocked(const keys::Digest& k) {
  auto it = pins_.find(k);
  if (it == pins_.end() || it->second.empty()) {
    if (it != pins_.end()) pins_.erase(it);
    store_.chain().Unpin(k);
    return Status::Ok();
  }
  // 0 (no deadline) sorts first and wins; otherwise the latest deadline.
  const std::int64_t deadline = *it->second.begin() == 0 ? 0 : *it->second.rbegin();
  return store_.chain().PinUntil(k, deadline);
}

void KnowledgeIndex::ReleasePinsLocked(Doc& doc) {
  if (!doc.info.pinned) return;
  doc.info.pinned = false;
  for (const keys::Digest& k : doc.stored_keys) {
    auto it = pins_.find(k);
    if (it == pins_.end()) continue;
    if (auto one = it->second.find(doc.pin_deadline); one != it->second.end()) it->second.erase(one);
  }
  for (const keys::Digest& k : doc.stored_keys) (void)ApplyPinLocked(k);  // a chunk gone from every tier has no pin
  doc.pin_deadline = 0;
}

void KnowledgeIndex::SweepLocked() {
  const std::int64_t now = store_.chain().clock().NowNs();
  std::vector<DocKey> expired;
  for (const auto& [key, doc] : docs_) {
    if (doc.info.expires_at_ns != 0 && doc.info.expires_at_ns <= now) expired.push_back(key);
  }
  for (const DocKey& k : expired) DropLocked(k);
}

size_t KnowledgeIndex::Sweep() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t before = docs_.size();
  SweepLocked();
  return before - docs_.size();
}

Status KnowledgeIndex::Put(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                           std::uint64_t version, const std::string& metadata, std::span<const std::int32_t> tokens,
                           const kernels::KvView& view) {
  return PutWith(model, ns, doc_id, version, metadata, tokens,
                 [&](std::uint64_t begin, std::uint64_t len, std::uint8_t* out) {
                   kernels::view_gather_cpu(view, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(len), 0,
                                            model.shape.layers, out);
                 });
}

Status KnowledgeIndex::Put(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                           std::uint64_t version, const std::string& metadata, std::span<const std::int32_t> tokens,
                           const ResolvedViews& views) {
  return PutWith(model, ns, doc_id, version, metadata, tokens,
                 [&](std::uint64_t begin, std::uint64_t len, std::uint8_t* out) { views.Gather(model, begin, len, out); });
}

namespace {

// The key a chunk's bytes are stored under when its content key holds other
// bytes: no two byte strings share one.
keys::Digest VariantKey(const keys::Digest& content, const Payload& bytes) {
  keys::Hasher h;
  h.Str("kdn-knowledge-variant-v1").Bytes(content.data(), content.size()).Bytes(bytes.data(), bytes.size());
  return h.Finish();
}

}  // namespace

Status KnowledgeIndex::PutWith(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                               std::uint64_t version, const std::string& metadata,
                               std::span<const std::int32_t> tokens, const GatherFn& gather) {
  if (doc_id.empty()) return Status::InvalidArgument("knowledge: doc_id is empty");
  if (tokens.empty()) return Status::InvalidArgument("knowledge: a document needs tokens");
  const std::uint64_t C = store_.options().chunk_tokens;
  Doc doc;
  doc.info.doc_id = doc_id;
  doc.info.version = version;
  doc.info.metadata = metadata;
  doc.info.tokens = tokens.size();
  doc.tokens.assign(tokens.begin(), tokens.end());
  // Puts one at a time: which key holds which bytes is decided (compare,
  // then put) and recorded (references) with no other put in between.
  std::lock_guard<std::mutex> put_lock(put_mu_);
  std::unordered_set<keys::Digest, keys::DigestHash> mine;  // keys this put uses already
  for (std::uint64_t pos = 0; pos < tokens.size(); pos += C) {
    const std::uint64_t len = std::min<std::uint64_t>(C, tokens.size() - pos);
    const keys::Digest content = store_.ContentKey(model, ns, tokens.subspan(pos, len));
    Payload payload =
        Payload::Uninitialized(static_cast<size_t>(len * static_cast<std::uint64_t>(model.bytes_per_token())));
    gather(pos, len, payload.data());
    // The content key when it is free or holds these bytes; else the variant.
    bool present = false, taken = false;
    if (store_.chain().Locate(content) >= 0) {
      auto lease = store_.chain().Get(content);
      if (lease.ok()) {
        const Payload& held = lease->chunk()->payload;
        present = held.size() == payload.size() && std::memcmp(held.data(), payload.data(), held.size()) == 0;
      }
      taken = !present;
    } else {
      // Referenced but in no tier (evicted): its bytes are unknown, so not free.
      taken = mine.count(content) != 0;
      if (!taken) {
        std::lock_guard<std::mutex> lock(mu_);
        taken = refs_.count(content) != 0;
      }
    }
    const keys::Digest stored = taken ? VariantKey(content, payload) : content;
    // A variant key names its bytes: when a tier holds it, it holds these.
    if (!present && (!taken || store_.chain().Locate(stored) < 0)) {
      KDN_RETURN_IF_ERROR(store_.PutPayload(model, ns, stored, len, static_cast<std::int64_t>(pos), std::move(payload)));
    }
    mine.insert(stored);
    doc.chunk_keys.push_back(content);
    doc.stored_keys.push_back(stored);
  }
  doc.info.chunks = static_cast<std::uint32_t>(doc.chunk_keys.size());
  std::lock_guard<std::mutex> lock(mu_);
  const DocKey key{model.fingerprint, std::string(ns), doc_id};
  // References first, then drop the old version: chunks both versions share survive.
  for (const keys::Digest& k : doc.stored_keys) ++refs_[k];
  DropLocked(key);
  docs_.emplace(key, std::move(doc));
  generation_.fetch_add(1, std::memory_order_release);
  return Status::Ok();
}

std::vector<DocumentInfo> KnowledgeIndex::List(const ModelKv& model, std::string_view ns) {
  std::lock_guard<std::mutex> lock(mu_);
  SweepLocked();
  std::vector<DocumentInfo> out;
  for (const auto& [key, doc] : docs_) {
    if (std::get<0>(key) != model.fingerprint || std::get<1>(key) != ns) continue;
    DocumentInfo info = doc.info;
    info.chunks_present = 0;
    for (const keys::Digest& k : doc.stored_keys) info.chunks_present += store_.chain().Locate(k) >= 0;
    out.push_back(info);
  }
  return out;
}

Result<DocumentInfo> KnowledgeIndex::Info(const ModelKv& model, std::string_view ns, const std::string& doc_id) {
  for (DocumentInfo& d : List(model, ns)) {
    if (d.doc_id == doc_id) return d;
  }
  return Status::NotFound("knowledge: no document '" + doc_id + "'");
}

Status KnowledgeIndex::Pin(const ModelKv& model, std::string_view ns, const std::string& doc_id, bool pin,
                           std::int64_t ttl_ns) {
  if (ttl_ns < 0) return Status::InvalidArgument("knowledge: pin TTL must not be negative");
  std::lock_guard<std::mutex> lock(mu_);
  Doc* doc = Find(model, ns, doc_id);
  if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  if (!pin) {
    ReleasePinsLocked(*doc);
    return Status::Ok();
  }
  for (size_t i = 0; i < doc->stored_keys.size(); ++i) {
    if (store_.chain().Locate(doc->stored_keys[i]) < 0) {
      return Status::NotFound("knowledge: chunk " + std::to_string(i) + " of '" + doc_id +
                              "' is in no tier any more; put the document again");
    }
  }
  ReleasePinsLocked(*doc);  // pinning again replaces the document's TTL
  doc->info.pinned = true;
  doc->pin_deadline = ttl_ns == 0 ? 0 : DeadlineAfter(store_.chain().clock().NowNs(), ttl_ns);
  for (const keys::Digest& k : doc->stored_keys) pins_[k].insert(doc->pin_deadline);
  for (const keys::Digest& k : doc->stored_keys) {
    const Status st = ApplyPinLocked(k);
    if (!st.ok()) {  // evicted since the check: all or nothing
      ReleasePinsLocked(*doc);
      return st;
    }
  }
  return Status::Ok();
}

Status KnowledgeIndex::Expire(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                              std::int64_t ttl_ns) {
  if (ttl_ns < 0) return Status::InvalidArgument("knowledge: TTL must not be negative");
  std::lock_guard<std::mutex> lock(mu_);
  Doc* doc = Find(model, ns, doc_id);
  if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  doc->info.expires_at_ns = DeadlineAfter(store_.chain().clock().NowNs(), ttl_ns);
  if (ttl_ns == 0) SweepLocked();
  return Status::Ok();
}

Status KnowledgeIndex::Delete(const ModelKv& model, std::string_view ns, const std::string& doc_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Find(model, ns, doc_id)) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  DropLocked(DocKey{model.fingerprint, std::string(ns), doc_id});
  return Status::Ok();
}

Result<std::vector<ChunkInfo>> KnowledgeIndex::Chunks(const ModelKv& model, std::string_view ns,
                                                      const std::string& doc_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const Doc* doc = Find(model, ns, doc_id);
  if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  const std::uint64_t C = store_.options().chunk_tokens;  // Put's split
  std::vector<ChunkInfo> out(doc->chunk_keys.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const std::uint64_t begin = i * C;
    const std::uint64_t len = std::min<std::uint64_t>(C, doc->tokens.size() - begin);
    out[i].index = static_cast<std::uint32_t>(i);
    out[i].begin = begin;
    out[i].tokens.assign(doc->tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                         doc->tokens.begin() + static_cast<std::ptrdiff_t>(begin + len));
    out[i].key = doc->chunk_keys[i];
    out[i].stored_key = doc->stored_keys[i];
  }
  return out;
}

Result<std::vector<std::int32_t>> KnowledgeIndex::Fetch(const ModelKv& model, std::string_view ns,
                                                        const std::string& doc_id, const kernels::KvView* view) {
  std::vector<std::int32_t> tokens;
  const ScatterFn scatter = [&](const std::uint8_t* canonical, std::uint64_t begin, std::uint64_t len) {
    kernels::view_scatter_cpu(canonical, *view, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(len), 0,
                              model.shape.layers);
  };
  KDN_RETURN_IF_ERROR(FetchWith(model, ns, doc_id, UINT64_MAX, view ? &scatter : nullptr, &tokens));
  return tokens;
}

Status KnowledgeIndex::Fetch(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                             const ResolvedViews* views, std::uint64_t room, std::vector<std::int32_t>* tokens,
                             bool* lossy) {
  const ScatterFn scatter = [&](const std::uint8_t* canonical, std::uint64_t begin, std::uint64_t len) {
    views->Scatter(model, canonical, begin, len);
  };
  return FetchWith(model, ns, doc_id, room, views ? &scatter : nullptr, tokens, lossy);
}

Status KnowledgeIndex::FetchWith(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                                 std::uint64_t room, const ScatterFn* scatter, std::vector<std::int32_t>* tokens,
                                 bool* lossy) {
  if (lossy) *lossy = false;
  std::vector<keys::Digest> chunk_keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Doc* doc = Find(model, ns, doc_id);
    if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
    chunk_keys = doc->stored_keys;
    *tokens = doc->tokens;
  }
  if (tokens->size() > room) {
    return Status(Code::kBufferTooSmall, "knowledge: document '" + doc_id + "' has " + std::to_string(tokens->size()) +
                                             " tokens, the buffers hold " + std::to_string(room));
  }
  if (!scatter) return Status::Ok();
  // Lease every chunk first, so the views are written all or nothing. The
  // keys are this snapshot's stored keys: whatever a chunk holds is the KV
  // this document was put with (see the file comment), whatever version is
  // current now.
  std::vector<Lease> leases;
  for (size_t i = 0; i < chunk_keys.size(); ++i) {
    auto lease = store_.chain().Get(chunk_keys[i]);
    if (!lease.ok()) {
      return Status::NotFound("knowledge: chunk " + std::to_string(i) + " of '" + doc_id +
                              "' is in no tier any more; put the document again");
    }
    leases.push_back(std::move(lease).value());
  }
  const std::uint64_t C = store_.options().chunk_tokens;
  for (size_t i = 0; i < leases.size(); ++i) {
    const std::uint64_t len = std::min<std::uint64_t>(C, tokens->size() - i * C);
    const ChunkRef& c = leases[i].chunk();
    if (c->meta.tokens != len || c->payload.size() != len * static_cast<std::uint64_t>(model.bytes_per_token())) {
      return Status::Corrupt("knowledge: chunk " + std::to_string(i) + " of '" + doc_id + "' has the wrong shape");
    }
  }
  for (size_t i = 0; i < leases.size(); ++i) {
    (*scatter)(leases[i].chunk()->payload.data(), i * C, leases[i].chunk()->meta.tokens);
    if (lossy && leases[i].chunk()->meta.lossy) *lossy = true;
  }
  return Status::Ok();
}

}  // namespace kdn::store
