// SPDX-License-Identifier: Apache-2.0
#include "core/knowledge/knowledge.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "kernels/ref/kv_view_ref.h"

namespace kdn::store {

KnowledgeIndex::Doc* KnowledgeIndex::Find(const ModelKv& model, std::string_view ns, const std::string& doc_id) {
  SweepLocked();
  auto it = docs_.find(DocKey{model.fingerprint, std::string(ns), doc_id});
  return it == docs_.end() ? nullptr : &it->second;
}

DocumentRecord KnowledgeIndex::RecordOf(const DocKey& key, const Doc* doc) {
  DocumentRecord r;
  r.model = std::get<0>(key);
  r.ns_hash = keys::NamespaceHash(std::get<1>(key));
  r.doc_id = std::get<2>(key);
  if (doc) {
    r.version = doc->info.version;
    r.metadata = doc->info.metadata;
    r.tokens = doc->info.tokens;
    r.keys = doc->stored_keys;
  }
  return r;
}

void KnowledgeIndex::DropLocked(DocMap::iterator it, bool announce) {
  const ReadContext ctx = ContextOf(it->first);  // a sweep drops any namespace's
  if (announce) store_.AnnounceDocument(DocumentOp::kDelete, RecordOf(it->first, nullptr));
  Doc& doc = it->second;
  ReleasePinsLocked(doc, ctx);
  std::vector<keys::Digest> unshared;
  for (const keys::Digest& k : doc.stored_keys) {
    auto r = refs_.find(k);
    if (r != refs_.end() && --r->second > 0) continue;  // another document shares it
    if (r != refs_.end()) refs_.erase(r);
    unshared.push_back(k);
  }
  store_.chain().EraseMany(unshared, ctx);  // together: one batch per tier
  if (doc.info.expires_at_ns != 0) by_deadline_.erase({doc.info.expires_at_ns, doc.seq});
  by_age_.erase(doc.seq);
  charged_ -= doc.charge;
  docs_.erase(it);
  generation_.fetch_add(1, std::memory_order_release);
  MarkDirty();
}

void KnowledgeIndex::DropLocked(const DocKey& key, bool announce) {
  auto it = docs_.find(key);
  if (it != docs_.end()) DropLocked(it, announce);
}

Status KnowledgeIndex::ApplyPinLocked(const keys::Digest& k, const ReadContext& ctx) {
  const std::optional<std::int64_t> deadline = pins_.Effective(k);
  if (!deadline) {
    store_.chain().Unpin(k);
    return Status::Ok();
  }
  return store_.chain().PinUntil(k, *deadline, ctx);
}

void KnowledgeIndex::ReleasePinsLocked(Doc& doc, const ReadContext& ctx) {
  if (!doc.info.pinned) return;
  doc.info.pinned = false;
  for (const keys::Digest& k : doc.stored_keys) pins_.Remove(k, doc.pin_deadline);
  for (const keys::Digest& k : doc.stored_keys) (void)ApplyPinLocked(k, ctx);  // a chunk gone from every tier has no pin
  doc.pin_deadline = 0;
}

void KnowledgeIndex::SweepLocked() {
  if (by_deadline_.empty()) return;
  const std::int64_t now = store_.chain().clock().NowNs();
  // Deadlines in order: only the documents whose deadline passed are looked at.
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) {
    ++scans_.sweep;
    auto a = by_age_.find(by_deadline_.begin()->second);
    if (a == by_age_.end()) {  // not reached: every entry names an indexed document
      by_deadline_.erase(by_deadline_.begin());
      continue;
    }
    DropLocked(a->second);
  }
}

void KnowledgeIndex::SetDeadlineLocked(Doc& doc, std::int64_t deadline) {
  if (doc.info.expires_at_ns != 0) by_deadline_.erase({doc.info.expires_at_ns, doc.seq});
  doc.info.expires_at_ns = deadline;
  if (deadline != 0) by_deadline_.insert({deadline, doc.seq});
  MarkDirty();
}

size_t KnowledgeIndex::Sweep() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t before = docs_.size();
  SweepLocked();
  return before - docs_.size();
}

void KnowledgeIndex::SetOptions(const KnowledgeOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  options_ = options;
}

KnowledgeOptions KnowledgeIndex::options() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

std::uint64_t KnowledgeIndex::charged_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return charged_;
}

size_t KnowledgeIndex::documents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return docs_.size();
}

KnowledgeIndex::ScanCounters KnowledgeIndex::Scans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scans_;
}

namespace {

// What glibc's malloc takes for a block of n bytes: n plus its 8-byte
// header, rounded up to 16, at least 32.
constexpr std::uint64_t Heap(std::uint64_t n) { return n == 0 ? 0 : std::max<std::uint64_t>(32, (n + 8 + 15) / 16 * 16); }
// A string's heap block: none while it fits the 15-byte small-string buffer.
constexpr std::uint64_t StrHeap(std::uint64_t n) { return n < 16 ? 0 : Heap(n + 1); }
constexpr std::uint64_t kTreeNode = 32;    // a std::map/std::set node's colour and three links
constexpr std::uint64_t kHashNode = 8 + 8;  // an unordered_map node's link and cached hash
constexpr std::uint64_t kBuckets = 16;     // bucket pointers per element, at a load factor of 1 to 0.5

}  // namespace

std::uint64_t KnowledgeIndex::ChargeOf(size_t ns_bytes, size_t doc_id_bytes, size_t metadata_bytes, size_t tokens,
                                       size_t chunks) {
  // Per document: its docs_ node (key and Doc), its by_age_ node and a
  // by_deadline_ node (charged always, so that an expire never needs room).
  std::uint64_t bytes = Heap(kTreeNode + sizeof(DocMap::value_type)) +
                        Heap(kTreeNode + sizeof(std::pair<const std::uint64_t, DocMap::iterator>)) +
                        Heap(kTreeNode + sizeof(std::pair<std::int64_t, std::uint64_t>));
  // Its strings: the namespace and doc_id in the key, the doc_id and metadata in its info.
  bytes += StrHeap(ns_bytes) + 2 * StrHeap(doc_id_bytes) + StrHeap(metadata_bytes);
  bytes += Heap(std::uint64_t{4} * tokens);                  // tokens
  bytes += 2 * Heap(std::uint64_t{sizeof(keys::Digest)} * chunks);  // content and stored keys
  // Per chunk: its refs_ entry and (charged always, so that a pin never needs
  // room) its pins_ entry and one deadline in it, as if no other document shared them.
  const std::uint64_t ref = Heap(kHashNode + sizeof(std::pair<const keys::Digest, std::uint32_t>)) + kBuckets;
  const std::uint64_t pin =
      Heap(kHashNode + sizeof(std::pair<const keys::Digest, std::multiset<std::int64_t>>)) + kBuckets +
      Heap(kTreeNode + sizeof(std::int64_t));
  return bytes + std::uint64_t{chunks} * (ref + pin);
}

bool KnowledgeIndex::DeadLocked(const Doc& doc, const ReadContext& ctx) {
  for (const keys::Digest& k : doc.stored_keys) {
    if (store_.chain().Locate(k, ctx) < 0) return true;
  }
  return false;
}

Status KnowledgeIndex::MakeRoomLocked(const DocKey& key, std::uint64_t need) {
  const std::uint64_t capacity = options_.capacity_bytes;
  const std::string& doc_id = std::get<2>(key);
  if (need > capacity) {
    return Status(Code::kBusy, "knowledge: document '" + doc_id + "' needs " + std::to_string(need) +
                                   " bytes of index, more than its whole capacity of " + std::to_string(capacity) +
                                   " bytes (KnowledgeOptions::capacity_bytes); split it into smaller documents");
  }
  auto old = docs_.find(key);
  const std::uint64_t freed = old == docs_.end() ? 0 : old->second.charge;  // a new version replaces it
  const auto fits = [&] { return charged_ - freed + need <= capacity; };
  if (fits()) return Status::Ok();
  // Documents whose KV left every tier, in put order from where the last
  // search stopped (so repeated puts cover every document), a bounded number
  // of chunk lookups per put. Live and pinned documents stay.
  constexpr size_t kMaxLookups = 4096;
  size_t lookups = 0, visited = 0;
  const size_t total = by_age_.size();
  auto a = by_age_.lower_bound(reclaim_from_);
  while (!fits() && visited < total && lookups < kMaxLookups) {
    if (a == by_age_.end()) a = by_age_.begin();
    const DocMap::iterator d = a->second;
    ++a;  // before the drop erases d's entry
    ++visited;
    ++scans_.reclaim;
    if (d == old || d->second.info.pinned) continue;
    lookups += d->second.stored_keys.size();
    if (DeadLocked(d->second, ContextOf(d->first))) DropLocked(d);
  }
  reclaim_from_ = a == by_age_.end() ? 0 : a->first;
  if (fits()) return Status::Ok();
  return Status(Code::kBusy, "knowledge: the index is full: " + std::to_string(docs_.size()) +
                                 " documents are charged " + std::to_string(charged_) + " of its " +
                                 std::to_string(capacity) + " bytes (KnowledgeOptions::capacity_bytes) and '" +
                                 doc_id + "' needs " + std::to_string(need) +
                                 "; delete documents or expire them to make room (documents whose KV left every "
                                 "tier are dropped to make room)");
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
  const ReadContext ctx = store_.Context(ns, {}, false);  // for tiers that file keys per namespace (a node)
  if (doc_id.empty()) return Status::InvalidArgument("knowledge: doc_id is empty");
  if (tokens.empty()) return Status::InvalidArgument("knowledge: a document needs tokens");
  const std::uint64_t C = store_.options().chunk_tokens;
  const size_t chunks = static_cast<size_t>((tokens.size() + C - 1) / C);
  const std::uint64_t need = ChargeOf(ns.size(), doc_id.size(), metadata.size(), tokens.size(), chunks);
  Doc doc;
  doc.info.doc_id = doc_id;
  doc.info.version = version;
  doc.info.metadata = metadata;
  doc.info.tokens = tokens.size();
  doc.tokens.assign(tokens.begin(), tokens.end());
  // Puts one at a time: which key holds which bytes is decided (compare,
  // then put) and recorded (references) with no other put in between.
  std::lock_guard<std::mutex> put_lock(put_mu_);
  const DocKey key{model.fingerprint, std::string(ns), doc_id};
  {
    // Room first, so a refused put stores nothing. Only puts add charge,
    // and they are serialized by put_mu_: the room stays until the insert.
    std::lock_guard<std::mutex> lock(mu_);
    SweepLocked();
    KDN_RETURN_IF_ERROR(MakeRoomLocked(key, need));
  }
  doc.chunk_keys.reserve(chunks);
  doc.stored_keys.reserve(chunks);
  std::unordered_set<keys::Digest, keys::DigestHash> mine;  // keys this put uses already
  for (std::uint64_t pos = 0; pos < tokens.size(); pos += C) {
    const std::uint64_t len = std::min<std::uint64_t>(C, tokens.size() - pos);
    const keys::Digest content = store_.ContentKey(model, ns, tokens.subspan(pos, len));
    Payload payload =
        Payload::Uninitialized(static_cast<size_t>(len * static_cast<std::uint64_t>(model.bytes_per_token())));
    gather(pos, len, payload.data());
    // The content key when it is free or holds these bytes; else the variant.
    bool present = false, taken = false;
    if (store_.chain().Locate(content, ctx) >= 0) {
      auto lease = store_.chain().Get(content, TieredStore::Form::kCanonical, ctx);
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
    if (!present && (!taken || store_.chain().Locate(stored, ctx) < 0)) {
      KDN_RETURN_IF_ERROR(store_.PutPayload(model, ns, stored, len, static_cast<std::int64_t>(pos), std::move(payload),
                                            /*on_device=*/false, 0, ctx));
    }
    mine.insert(stored);
    doc.chunk_keys.push_back(content);
    doc.stored_keys.push_back(stored);
  }
  doc.info.chunks = static_cast<std::uint32_t>(doc.chunk_keys.size());
  std::lock_guard<std::mutex> lock(mu_);
  // References first, then drop the old version: chunks both versions share survive.
  for (const keys::Digest& k : doc.stored_keys) ++refs_[k];
  DropLocked(key, /*announce=*/false);  // a registry replaces it with the put below
  doc.seq = next_seq_++;
  doc.charge = need;
  charged_ += need;
  const auto it = docs_.emplace(key, std::move(doc)).first;
  by_age_.emplace(it->second.seq, it);
  // After its chunks (queued before it by the puts above).
  store_.AnnounceDocument(DocumentOp::kPut, RecordOf(key, &it->second));
  generation_.fetch_add(1, std::memory_order_release);
  MarkDirty();
  return Status::Ok();
}

DocumentInfo KnowledgeIndex::DescribeLocked(const Doc& doc, const ReadContext& ctx) {
  DocumentInfo info = doc.info;
  info.pin_expires_at_ns = info.pinned ? doc.pin_deadline : 0;
  info.chunks_present = 0;
  for (const keys::Digest& k : doc.stored_keys) info.chunks_present += store_.chain().Locate(k, ctx) >= 0;
  return info;
}

std::vector<DocumentInfo> KnowledgeIndex::List(const ModelKv& model, std::string_view ns) {
  const ReadContext ctx = store_.Context(ns, {}, false);  // for tiers that file keys per namespace (a node)
  std::lock_guard<std::mutex> lock(mu_);
  SweepLocked();
  std::vector<DocumentInfo> out;
  // docs_ is ordered by (model, ns, doc_id): this namespace's documents are
  // one run, from its first doc_id ("" sorts first).
  for (auto it = docs_.lower_bound(DocKey{model.fingerprint, std::string(ns), std::string()});
       it != docs_.end() && std::get<0>(it->first) == model.fingerprint && std::get<1>(it->first) == ns; ++it) {
    ++scans_.list;
    out.push_back(DescribeLocked(it->second, ctx));
  }
  return out;
}

Result<DocumentInfo> KnowledgeIndex::Info(const ModelKv& model, std::string_view ns, const std::string& doc_id) {
  const ReadContext ctx = store_.Context(ns, {}, false);  // for tiers that file keys per namespace (a node)
  std::lock_guard<std::mutex> lock(mu_);
  const Doc* doc = Find(model, ns, doc_id);
  if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  ++scans_.list;
  return DescribeLocked(*doc, ctx);
}

Status KnowledgeIndex::Pin(const ModelKv& model, std::string_view ns, const std::string& doc_id, bool pin,
                           std::int64_t ttl_ns) {
  const ReadContext ctx = store_.Context(ns, {}, false);  // for tiers that file keys per namespace (a node)
  if (ttl_ns < 0) return Status::InvalidArgument("knowledge: pin TTL must not be negative");
  std::lock_guard<std::mutex> lock(mu_);
  Doc* doc = Find(model, ns, doc_id);
  if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  const DocKey key{model.fingerprint, std::string(ns), doc_id};
  if (!pin) {
    ReleasePinsLocked(*doc, ctx);
    MarkDirty();
    store_.AnnounceDocument(DocumentOp::kUnpin, RecordOf(key, nullptr));
    return Status::Ok();
  }
  for (size_t i = 0; i < doc->stored_keys.size(); ++i) {
    if (store_.chain().Locate(doc->stored_keys[i], ctx) < 0) {
      return Status::NotFound("knowledge: chunk " + std::to_string(i) + " of '" + doc_id +
                              "' is in no tier any more; put the document again");
    }
  }
  ReleasePinsLocked(*doc, ctx);  // pinning again replaces the document's TTL
  doc->info.pinned = true;
  doc->pin_deadline = ttl_ns == 0 ? 0 : DeadlineAfter(store_.chain().clock().NowNs(), ttl_ns);
  for (const keys::Digest& k : doc->stored_keys) pins_.Add(k, doc->pin_deadline);
  for (const keys::Digest& k : doc->stored_keys) {
    const Status st = ApplyPinLocked(k, ctx);
    if (!st.ok()) {  // evicted since the check: all or nothing
      ReleasePinsLocked(*doc, ctx);
      return st;
    }
  }
  // The node's clock is its own: the TTL travels, not the deadline (whole
  // milliseconds, at least 1 so that a short pin is not "until unpinned").
  const std::uint64_t ttl_ms = ttl_ns == 0 ? 0 : std::max<std::uint64_t>(1, static_cast<std::uint64_t>(ttl_ns) / 1000000);
  MarkDirty();
  store_.AnnounceDocument(DocumentOp::kPin, RecordOf(key, nullptr), ttl_ms);
  return Status::Ok();
}

Status KnowledgeIndex::Expire(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                              std::int64_t ttl_ns) {
  if (ttl_ns < 0) return Status::InvalidArgument("knowledge: TTL must not be negative");
  std::lock_guard<std::mutex> lock(mu_);
  Doc* doc = Find(model, ns, doc_id);
  if (!doc) return Status::NotFound("knowledge: no document '" + doc_id + "'");
  if (ttl_ns == 0) {
    DropLocked(DocKey{model.fingerprint, std::string(ns), doc_id});
    return Status::Ok();
  }
  SetDeadlineLocked(*doc, DeadlineAfter(store_.chain().clock().NowNs(), ttl_ns));
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
  const ReadContext ctx = store_.Context(ns);  // for tiers that file keys per namespace (a node)
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
    auto lease = store_.chain().Get(chunk_keys[i], TieredStore::Form::kCanonical, ctx);
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
  {
    // Counted on the document as it is now: a version put meanwhile with
    // other chunks starts from zero and is not credited with these.
    std::lock_guard<std::mutex> lock(mu_);
    Doc* doc = Find(model, ns, doc_id);
    if (doc != nullptr && doc->stored_keys == chunk_keys) doc->info.hits += leases.size();
  }
  return Status::Ok();
}

// ---- Persistence ----------------------------------------------------------------
//
// A record file (knowledge/record_file.h): magic "kdnidx\r\n", format version 1,
// domain "kdn-knowledge-index-v1"; payload: u64 documents, then per document
// in put order (oldest first):
//   model fingerprint (32), u32 + namespace, u32 + doc_id, u64 version,
//   u32 + metadata, u64 hits, u8 pinned, i64 pin deadline (wall ns; 0: none),
//   i64 expiry (wall ns; 0: none), u64 tokens then u32 each, u32 chunks then
//   per chunk its content key and stored key (32 bytes each).

namespace {

constexpr RecordFormat kIndexFormat{{'k', 'd', 'n', 'i', 'd', 'x', '\r', '\n'}, 1, "kdn-knowledge-index-v1"};
constexpr std::uint32_t kMaxStringBytes = 1u << 20;  // metadata; doc_id and namespace are far shorter
constexpr std::uint64_t kMaxFileBytes = std::uint64_t{16} << 30;

std::int64_t WallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A deadline on the store's clock as wall-clock time, and back (0 stays 0).
std::int64_t ToWall(std::int64_t deadline, std::int64_t now, std::int64_t wall_now) {
  return deadline == 0 ? 0 : wall_now + (deadline - now);
}
std::int64_t FromWall(std::int64_t wall, std::int64_t now, std::int64_t wall_now) {
  if (wall == 0) return 0;
  return wall <= wall_now ? std::max<std::int64_t>(1, now) : DeadlineAfter(now, wall - wall_now);
}

}  // namespace

KnowledgeIndex::~KnowledgeIndex() {
  if (!saver_) return;
  saver_->Stop();
  (void)Flush();
}

void KnowledgeIndex::MarkDirty() {
  if (saver_) saver_->Mark();
}

Status KnowledgeIndex::Flush() {
  if (!saver_ || !saver_->TakeDirty()) return Status::Ok();
  const Status st = SaveNow();
  if (!st.ok()) saver_->Mark();
  return st;
}

Status KnowledgeIndex::SaveNow() {
  std::lock_guard<std::mutex> file_lock(file_mu_);
  std::string payload;
  {
    std::lock_guard<std::mutex> lock(mu_);
    payload = SerializeLocked();
  }
  if (sealer_) {  // the payload, then its seal
    const size_t n = payload.size();
    payload.resize(n + wire::kSealTrailerBytes);
    auto* p = reinterpret_cast<std::uint8_t*>(payload.data());
    KDN_RETURN_IF_ERROR(sealer_->Seal(p, n, p + n));
  }
  const Status st = WriteRecordFile(path_, kIndexFormat, payload);
  if (!st.ok()) return Status::Internal("knowledge index: " + st.message());
  saves_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

std::string KnowledgeIndex::SerializeLocked() {
  const std::int64_t now = store_.chain().clock().NowNs(), wall_now = WallNs();
  RecordWriter w;
  w.U64(docs_.size());
  for (const auto& [seq, it] : by_age_) {
    (void)seq;
    const DocKey& key = it->first;
    const Doc& doc = it->second;
    w.Digest(std::get<0>(key));
    w.Str(std::get<1>(key));
    w.Str(std::get<2>(key));
    w.U64(doc.info.version);
    w.Str(doc.info.metadata);
    w.U64(doc.info.hits);
    w.U8(doc.info.pinned ? 1 : 0);
    w.U64(static_cast<std::uint64_t>(doc.info.pinned ? ToWall(doc.pin_deadline, now, wall_now) : 0));
    w.U64(static_cast<std::uint64_t>(ToWall(doc.info.expires_at_ns, now, wall_now)));
    w.U64(doc.tokens.size());
    for (std::int32_t t : doc.tokens) w.U32(static_cast<std::uint32_t>(t));
    w.U32(static_cast<std::uint32_t>(doc.chunk_keys.size()));
    for (size_t i = 0; i < doc.chunk_keys.size(); ++i) {
      w.Digest(doc.chunk_keys[i]);
      w.Digest(doc.stored_keys[i]);
    }
  }
  return w.bytes();
}

Status KnowledgeIndex::ParseLocked(std::span<const std::uint8_t> payload) {
  const std::int64_t now = store_.chain().clock().NowNs(), wall_now = WallNs();
  const std::uint64_t C = store_.options().chunk_tokens;
  RecordReader r(payload);
  std::uint64_t count = 0;
  if (!r.U64(count)) return Status::Corrupt("truncated");
  std::uint64_t left_out = 0;
  std::vector<Doc> docs;
  std::vector<DocKey> names;
  for (std::uint64_t i = 0; i < count; ++i) {
    keys::Digest model{};
    std::string ns, doc_id;
    Doc doc;
    std::uint8_t pinned = 0;
    std::uint64_t pin_wall = 0, expiry_wall = 0, ntokens = 0;
    std::uint32_t nchunks = 0;
    const auto bad = [&] { return Status::Corrupt("document " + std::to_string(i) + " is malformed"); };
    if (!r.Digest(model) || !r.Str(ns, kMaxStringBytes) || !r.Str(doc_id, kMaxStringBytes) ||
        !r.U64(doc.info.version) || !r.Str(doc.info.metadata, kMaxStringBytes) || !r.U64(doc.info.hits) ||
        !r.U8(pinned) || !r.U64(pin_wall) || !r.U64(expiry_wall) || !r.U64(ntokens) || ntokens == 0 ||
        ntokens > r.left() / 4 || doc_id.empty() || pinned > 1) {
      return bad();
    }
    doc.tokens.resize(static_cast<size_t>(ntokens));
    for (std::int32_t& t : doc.tokens) {
      std::uint32_t v = 0;
      (void)r.U32(v);
      t = static_cast<std::int32_t>(v);
    }
    if (!r.U32(nchunks) || nchunks != (ntokens + C - 1) / C || std::uint64_t{nchunks} * 64 > r.left()) return bad();
    doc.chunk_keys.resize(nchunks);
    doc.stored_keys.resize(nchunks);
    for (std::uint32_t c = 0; c < nchunks; ++c) {
      (void)r.Digest(doc.chunk_keys[c]);
      (void)r.Digest(doc.stored_keys[c]);
    }
    DocKey key{model, ns, doc_id};
    if (docs_.count(key) != 0) return bad();
    doc.info.doc_id = doc_id;
    doc.info.tokens = ntokens;
    doc.info.chunks = nchunks;
    doc.charge = ChargeOf(ns.size(), doc_id.size(), doc.info.metadata.size(), doc.tokens.size(), nchunks);
    if (charged_ + doc.charge > options_.capacity_bytes) {  // a capacity lowered since the save
      ++left_out;
      continue;
    }
    const std::int64_t pin_deadline = FromWall(static_cast<std::int64_t>(pin_wall), now, wall_now);
    if (pinned == 1 && !(pin_wall != 0 && static_cast<std::int64_t>(pin_wall) <= wall_now)) {
      doc.info.pinned = true;  // a pin whose deadline passed meanwhile is not applied again
      doc.pin_deadline = pin_deadline;
    }
    doc.seq = next_seq_++;
    charged_ += doc.charge;
    for (const keys::Digest& k : doc.stored_keys) ++refs_[k];
    if (doc.info.pinned) {
      for (const keys::Digest& k : doc.stored_keys) pins_.Add(k, doc.pin_deadline);
    }
    const std::int64_t expiry = FromWall(static_cast<std::int64_t>(expiry_wall), now, wall_now);
    auto it = docs_.emplace(std::move(key), std::move(doc)).first;
    by_age_.emplace(it->second.seq, it);
    if (expiry != 0) SetDeadlineLocked(it->second, expiry);
  }
  if (r.left() != 0) return Status::Corrupt("bytes after the last document");
  // The pins again, on the chunks the tiers kept (a chunk in no tier has none).
  pins_.ForEachKey([&](const keys::Digest& k) { (void)ApplyPinLocked(k, ReadContext{}); });
  generation_.fetch_add(1, std::memory_order_release);
  if (left_out != 0) {
    return Status(Code::kBusy, "knowledge index: " + std::to_string(left_out) +
                                   " documents beyond the index's capacity were left out");
  }
  return Status::Ok();
}

Status KnowledgeIndex::Persist(const std::string& path, std::chrono::milliseconds delay,
                               std::shared_ptr<const wire::ChunkSealer> sealer) {
  if (!path_.empty()) return Status::InvalidArgument("knowledge index: already kept in " + path_);
  if (path.empty()) return Status::InvalidArgument("knowledge index: an empty path");
  Status result;
  auto file = ReadRecordFile(path, kIndexFormat, kMaxFileBytes);
  if (!file.ok() && file.status().code() != Code::kNotFound) result = file.status();
  if (file.ok()) {
    // The seal (wire/seal.h) after the payload: checked with a secret, set
    // apart without one.
    std::vector<std::uint8_t>& bytes = *file;
    const size_t n = bytes.size() - std::min(bytes.size(), wire::kSealTrailerBytes);
    if (sealer) {
      result = wire::EndsInSeal(bytes.data(), bytes.size())
                   ? sealer->Check(bytes.data(), n, bytes.data() + n, wire::kSealTrailerBytes)
                   : Status::Corrupt("not sealed (a secret was given: only an index sealed with it is read)");
    }
    if (result.ok() && wire::EndsInSeal(bytes.data(), bytes.size())) bytes.resize(n);
  }
  if (file.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (result.ok()) result = ParseLocked(*file);
    if (!result.ok() && result.code() != Code::kBusy) {
      // Started empty (no pin was applied yet): the file describes chunks,
      // it does not hold them.
      docs_.clear();
      by_age_.clear();
      by_deadline_.clear();
      refs_.clear();
      pins_.Clear();
      charged_ = 0;
    }
  }
  if (!result.ok() && result.code() != Code::kBusy) {
    const std::string aside = path + ".bad";
    const bool moved = ::rename(path.c_str(), aside.c_str()) == 0;
    result = Status(result.code(), "knowledge index " + path + ": " + result.message() + "; started with no documents" +
                                       (moved ? " (the file is now " + aside + ")" : ""));
  }
  path_ = path;
  sealer_ = std::move(sealer);
  // Failures are retried; the owner learns of a lasting one from Flush.
  saver_ = std::make_unique<DebouncedSaver>(delay, [this] { return SaveNow(); });
  return result;
}

}  // namespace kdn::store
