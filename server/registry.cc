// SPDX-License-Identifier: Apache-2.0
#include "server/registry.h"


#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>
#include <unordered_set>

#include "core/wire/node.capnp.h"

namespace kdn::server {
namespace {

std::uint64_t WallMs() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace

keys::Digest ObjectKey(const keys::Digest& ns, const keys::Digest& key) {
  keys::Hasher h;
  h.Str("kdnd/1");
  h.Bytes(ns.data(), ns.size());
  h.Bytes(key.data(), key.size());
  return h.Finish();
}

KnowledgeRegistry::KnowledgeRegistry(KnowledgeConfig config, std::string path, std::chrono::milliseconds save_delay,
                                     store::TieredStore& chain, EraseFn erase)
    : config_(config), path_(std::move(path)), chain_(chain), erase_(std::move(erase)) {
  if (path_.empty()) return;
  Load();
  saver_ = std::make_unique<store::DebouncedSaver>(
      save_delay, [this] { return Flush(); },
      [](const Status& st) { std::fprintf(stderr, "kdnd: %s\n", st.message().c_str()); });
}

KnowledgeRegistry::~KnowledgeRegistry() {
  if (!saver_) return;
  saver_->Stop();
  // The last word, as a snapshot (the next start reads one file): when
  // anything changed since the saver's last write, hits counted since (they
  // alone never wake the saver), or the log holds changes.
  bool logged = false;
  {
    std::lock_guard<std::mutex> file_lock(save_file_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    logged = log_ ? log_->bytes() > store::RecordLog::kHeaderBytes : generation_ != 0 || !docs_.empty();
  }
  if (saver_->dirty() || hits_changed_.load() || logged) {
    if (Status st = Save(); !st.ok()) std::fprintf(stderr, "kdnd: %s\n", st.message().c_str());
  }
}

void KnowledgeRegistry::Stored(const keys::Digest& ns, const keys::Digest& key) {
  if (pinned_documents_.load(std::memory_order_relaxed) == 0) return;
  // A chunk of a pinned document that arrives after the pin is pinned now.
  std::lock_guard<std::mutex> lock(mu_);
  const NsKey k{ns, key};
  if (pins_.Pinned(k)) ApplyPinLocked(k);
}

// ---- Documents ---------------------------------------------------------------------

static_assert(kMaxKeysPerDocument == wire::node::MAX_KEYS_PER_CALL, "config.h's bound must be the schema's");

std::uint64_t KnowledgeRegistry::HitsOfLocked(const Doc& doc) {
  std::uint64_t hits = doc.hits;
  for (size_t i = 0; i < doc.refs.size(); ++i) hits += doc.refs[i]->hits - doc.base[i];
  return hits;
}

void KnowledgeRegistry::LinkLocked(const keys::Digest& ns, Doc& doc) {
  doc.refs.clear();
  doc.base.clear();
  for (const keys::Digest& k : doc.distinct) {
    KeyRef& r = refs_[NsKey{ns, k}];  // a node of its own: its address stays while it is referenced
    r.docs.push_back(&doc);
    doc.refs.push_back(&r);
    doc.base.push_back(r.hits);
  }
  total_keys_ += doc.item.keys.size();
  NsUsage& u = ns_usage_[ns];
  u.documents += 1;
  u.keys += doc.item.keys.size();
}

void KnowledgeRegistry::UnlinkLocked(const keys::Digest& ns, Doc& doc) {
  doc.hits = HitsOfLocked(doc);  // what its chunks earned it stays with it
  doc.refs.clear();
  doc.base.clear();
  for (const keys::Digest& k : doc.distinct) {
    auto it = refs_.find(NsKey{ns, k});
    if (it == refs_.end()) continue;
    std::vector<Doc*>& v = it->second.docs;
    v.erase(std::remove(v.begin(), v.end(), &doc), v.end());
    if (v.empty()) refs_.erase(it);
  }
  total_keys_ -= doc.item.keys.size();
  auto u = ns_usage_.find(ns);
  if (u != ns_usage_.end()) {
    u->second.documents -= 1;
    u->second.keys -= doc.item.keys.size();
    if (u->second.documents == 0) ns_usage_.erase(u);
  }
}

void KnowledgeRegistry::AddPinsLocked(const keys::Digest& ns, const Doc& doc) {
  if (!doc.pinned) return;
  for (const keys::Digest& k : doc.distinct) pins_.Add(NsKey{ns, k}, doc.pin_deadline_ms);
  ++pinned_documents_;
}

void KnowledgeRegistry::RemovePinsLocked(const keys::Digest& ns, const Doc& doc) {
  if (!doc.pinned) return;
  for (const keys::Digest& k : doc.distinct) pins_.Remove(NsKey{ns, k}, doc.pin_deadline_ms);
  --pinned_documents_;
}

bool KnowledgeRegistry::ApplyPinLocked(const NsKey& k) {
  const keys::Digest object = ObjectKey(k.ns, k.key);
  const std::optional<std::uint64_t> pin = pins_.Effective(k);  // 0 wins, else the latest deadline
  if (!pin) {
    chain_.Unpin(object);
    return false;
  }
  const std::uint64_t deadline = *pin;
  if (deadline == 0) return chain_.PinUntil(object, 0).ok();
  const std::uint64_t now = WallMs();
  if (deadline <= now) {
    chain_.Unpin(object);
    return false;
  }
  // The registry keeps wall-clock deadlines (they survive a restart); the
  // chain wants its own clock's.
  const std::uint64_t left_ms = deadline - now;
  const std::int64_t left_ns = left_ms > static_cast<std::uint64_t>(INT64_MAX / 1000000)
                                   ? INT64_MAX
                                   : static_cast<std::int64_t>(left_ms * 1000000);
  return chain_.PinUntil(object, store::DeadlineAfter(chain_.clock().NowNs(), left_ns)).ok();
}

Status KnowledgeRegistry::Put(const keys::Digest& ns, KnowledgeDoc item) {
  if (item.doc_id.empty()) return Status::InvalidArgument("knowledge item: docId is empty");
  if (item.doc_id.size() > wire::node::MAX_DOC_ID_BYTES) {
    return Status::TooLarge("knowledge item: docId of " + std::to_string(item.doc_id.size()) +
                                      " bytes (at most " + std::to_string(wire::node::MAX_DOC_ID_BYTES) + ")");
  }
  if (item.metadata.size() > wire::node::MAX_METADATA_BYTES) {
    return Status::TooLarge("knowledge item: metadata of " + std::to_string(item.metadata.size()) +
                                      " bytes (at most " + std::to_string(wire::node::MAX_METADATA_BYTES) + ")");
  }
  if (item.keys.size() > config_.max_keys_per_document) {
    return Status::TooLarge("knowledge item: " + std::to_string(item.keys.size()) + " keys (this node takes at most " +
                                      std::to_string(config_.max_keys_per_document) +
                                      " per document: [knowledge] max_keys_per_document)");
  }
  auto doc = std::make_unique<Doc>();
  doc->item = std::move(item);
  {
    std::unordered_set<keys::Digest, keys::DigestHash> seen;
    for (const keys::Digest& k : doc->item.keys) {
      if (seen.insert(k).second) doc->distinct.push_back(k);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const DocKey dk{ns, doc->item.model, doc->item.doc_id};
    auto it = docs_.find(dk);
    Doc* old = it == docs_.end() ? nullptr : it->second.get();
    if (!old && docs_.size() >= config_.max_documents) {
      return Status::Busy("the node holds " + std::to_string(docs_.size()) +
                                   " documents, its most ([knowledge] max_documents); delete some first");
    }
    const std::uint64_t keys_after = total_keys_ - (old ? old->item.keys.size() : 0) + doc->item.keys.size();
    if (keys_after > config_.max_keys) {
      return Status::Busy("the node's documents would have " + std::to_string(keys_after) + " keys, more than " +
                                   std::to_string(config_.max_keys) +
                                   " ([knowledge] max_keys); delete some documents first");
    }
    // The namespace's own share, within the node's.
    const auto used = ns_usage_.find(ns);
    const NsUsage u = used == ns_usage_.end() ? NsUsage{} : used->second;
    if (!old && u.documents >= config_.max_documents_per_namespace) {
      return Status::Busy("this namespace holds " + std::to_string(u.documents) +
                          " documents, its most ([knowledge] max_documents_per_namespace); delete some first");
    }
    const std::uint64_t ns_keys_after = u.keys - (old ? old->item.keys.size() : 0) + doc->item.keys.size();
    if (ns_keys_after > config_.max_keys_per_namespace) {
      return Status::Busy("this namespace's documents would have " + std::to_string(ns_keys_after) +
                          " keys, more than " + std::to_string(config_.max_keys_per_namespace) +
                          " ([knowledge] max_keys_per_namespace); delete some documents first");
    }
    if (old && old->item.version == doc->item.version && old->item.keys == doc->item.keys) {
      // The same version again (an engine registering what it registered
      // before a restart): its registration time, hits and pin stand.
      old->item.metadata = std::move(doc->item.metadata);
      old->item.tokens = doc->item.tokens;
      LogDocLocked(ns, *old);
    } else {
      doc->registered_ms = WallMs();
      // A pin is the operator's choice about the document, not about one
      // version of it: it carries over to the new chunks. The new pins are
      // applied before the old ones are withdrawn, so chunks both versions
      // share stay pinned throughout.
      if (old) {
        doc->pinned = old->pinned;
        doc->pin_deadline_ms = old->pin_deadline_ms;
      }
      LinkLocked(ns, *doc);
      AddPinsLocked(ns, *doc);
      LogDocLocked(ns, *doc);
      if (doc->pinned) {
        for (const keys::Digest& k : doc->distinct) ApplyPinLocked(NsKey{ns, k});
      }
      std::unique_ptr<Doc> replaced;
      if (old) {
        replaced = std::move(it->second);
        it->second = std::move(doc);
        UnlinkLocked(ns, *replaced);
        RemovePinsLocked(ns, *replaced);
        if (replaced->pinned) {
          for (const keys::Digest& k : replaced->distinct) ApplyPinLocked(NsKey{ns, k});
        }
      } else {
        docs_.emplace(dk, std::move(doc));
      }
      documents_ = docs_.size();
    }
  }
  MarkDirty();
  return Status::Ok();
}

std::vector<KnowledgeDocInfo> KnowledgeRegistry::List(const keys::Digest& ns) {
  std::vector<KnowledgeDocInfo> out;
  std::vector<std::vector<keys::Digest>> doc_keys;
  const std::uint64_t now = WallMs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Ordered by namespace first: the walk covers this namespace's documents only.
    for (auto it = docs_.lower_bound(DocKey{ns, keys::Digest{}, std::string()});
         it != docs_.end() && std::get<0>(it->first) == ns; ++it) {
      const Doc& d = *it->second;
      KnowledgeDocInfo info;
      info.doc_id = d.item.doc_id;
      info.version = d.item.version;
      info.metadata = d.item.metadata;
      info.tokens = d.item.tokens;
      info.model = d.item.model;
      info.chunks = static_cast<std::uint32_t>(d.item.keys.size());
      info.pinned = d.pinned && (d.pin_deadline_ms == 0 || d.pin_deadline_ms > now);
      info.pin_expires_ms = d.pinned ? d.pin_deadline_ms : 0;
      info.registered_ms = d.registered_ms;
      info.hits = HitsOfLocked(d);
      out.push_back(std::move(info));
      doc_keys.push_back(d.item.keys);
    }
  }
  // Which chunks the tiers hold, outside the registry's lock (a list may
  // look at many keys; gets must not wait for it).
  for (size_t i = 0; i < out.size(); ++i) {
    std::uint32_t held = 0;
    for (const keys::Digest& k : doc_keys[i]) held += chain_.Locate(ObjectKey(ns, k)) >= 0 ? 1 : 0;
    out[i].chunks_held = held;
  }
  return out;
}

Status KnowledgeRegistry::Pin(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id,
                              bool pin, std::uint64_t ttl_ms, std::uint32_t& pinned) {
  pinned = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = docs_.find(DocKey{ns, model, doc_id});
    if (it == docs_.end()) return Status::NotFound("no document '" + doc_id + "' of that model in this namespace");
    Doc& d = *it->second;
    const bool was = d.pinned;
    RemovePinsLocked(ns, d);
    d.pinned = pin;
    if (pin) {
      // Pinning again replaces the document's deadline.
      const std::uint64_t now = WallMs();
      d.pin_deadline_ms = ttl_ms == 0 ? 0 : (ttl_ms > UINT64_MAX - now ? UINT64_MAX : now + ttl_ms);
    } else {
      d.pin_deadline_ms = 0;
    }
    AddPinsLocked(ns, d);
    LogPinLocked(ns, d);
    if (pin || was) {
      for (const keys::Digest& k : d.distinct) pinned += ApplyPinLocked(NsKey{ns, k}) ? 1 : 0;
    }
  }
  MarkDirty();
  return Status::Ok();
}

Status KnowledgeRegistry::Delete(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id,
                                 std::uint32_t& erased) {
  erased = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = docs_.find(DocKey{ns, model, doc_id});
    if (it == docs_.end()) return Status::NotFound("no document '" + doc_id + "' of that model in this namespace");
    Doc& d = *it->second;
    LogDeleteLocked(ns, model, doc_id);
    RemovePinsLocked(ns, d);
    UnlinkLocked(ns, d);
    std::vector<keys::Digest> unshared;
    for (const keys::Digest& k : d.distinct) {
      const NsKey nk{ns, k};
      if (refs_.count(nk) != 0) {
        if (d.pinned) ApplyPinLocked(nk);  // another document holds it: its pins alone now
        continue;
      }
      unshared.push_back(k);
    }
    docs_.erase(it);
    documents_ = docs_.size();
    // Under the registry's lock: a document registered meanwhile cannot
    // claim a chunk that is about to go. Delete counts, unpins and publishes
    // the removals as a delete call does.
    erased = erase_(ns, unshared);
  }
  MarkDirty();
  return Status::Ok();
}

void KnowledgeRegistry::CreditHits(const keys::Digest& ns, std::span<const keys::Digest> served) {
  if (served.empty() || documents_.load(std::memory_order_relaxed) == 0) return;
  bool any = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (const keys::Digest& k : served) {
    auto it = refs_.find(NsKey{ns, k});
    if (it == refs_.end()) continue;
    ++it->second.hits;  // every document referencing it, at once (Doc)
    any = true;
  }
  if (any) hits_changed_ = true;
}

void KnowledgeRegistry::MarkDirty() {
  if (saver_) saver_->Mark();
}

// ---- The registry's files ------------------------------------------------------
//
// The snapshot, knowledge.kdnreg: a record file (knowledge/record_file.h),
// magic "kdnreg\r\n", format version 2, domain "kdnd-registry-v1"; payload:
// u64 generation, u64 documents, then per document (a "document" below):
//     namespace hash (32), model (32), u32 + docId bytes, u64 version,
//     u32 + metadata bytes, u64 tokens, u64 registeredMs, u64 hits,
//     u8 pinned, u64 pin deadline (wall ms; 0: none), u32 keys, 32 bytes each
// Version 1 (before the log) is the same without the generation, and is
// still read. Written to knowledge.kdnreg.tmp, fsynced, renamed over
// knowledge.kdnreg, and the directory fsynced: a crash leaves the old file
// or the new one, whole.
//
// The log, knowledge.kdnreg.log: a RecordLog (magic "kdnrlog\n", domain
// "kdnd-registry-log-v1") of the snapshot's generation; each record's body
// is u8 kind, then:
//     1 (put):    a document, as above (its hits then)
//     2 (delete): namespace hash, model, u32 + docId bytes
//     3 (pin):    namespace hash, model, u32 + docId bytes, u8 pinned, u64 deadline
// Integers little-endian. Hits alone are not logged: they are in the
// snapshots (at shutdown, and each time the log is compacted) and in a
// document's put record; a crash loses the hits counted since.

namespace {

constexpr store::RecordFormat kRegistryFormat{{'k', 'd', 'n', 'r', 'e', 'g', '\r', '\n'}, 2, "kdnd-registry-v1"};
constexpr store::RecordFormat kRegistryFormatV1{{'k', 'd', 'n', 'r', 'e', 'g', '\r', '\n'}, 1, "kdnd-registry-v1"};
constexpr store::LogFormat kLogFormat{{'k', 'd', 'n', 'r', 'l', 'o', 'g', '\n'}, "kdnd-registry-log-v1"};
constexpr std::uint8_t kPutRecord = 1, kDeleteRecord = 2, kPinRecord = 3;
// The log is compacted into a snapshot once it is larger than this or the
// snapshot, whichever is larger: replaying it never costs much more than
// reading the snapshot, and a change costs its own bytes plus, amortized,
// at most about as many again.
constexpr std::uint64_t kMinCompactionBytes = 4 << 20;

std::string LogPath(const std::string& path) { return path + ".log"; }

}  // namespace

namespace {

void WriteDoc(store::RecordWriter& w, const keys::Digest& ns, const KnowledgeDoc& it, std::uint64_t registered_ms,
              std::uint64_t hits, bool pinned, std::uint64_t pin_deadline_ms) {
  w.Digest(ns);
  w.Digest(it.model);
  w.Str(it.doc_id);
  w.U64(it.version);
  w.Str(it.metadata);
  w.U64(it.tokens);
  w.U64(registered_ms);
  w.U64(hits);
  w.U8(pinned ? 1 : 0);
  w.U64(pin_deadline_ms);
  w.U32(static_cast<std::uint32_t>(it.keys.size()));
  for (const keys::Digest& k : it.keys) w.Digest(k);
}

}  // namespace

void KnowledgeRegistry::LogDocLocked(const keys::Digest& ns, const Doc& doc) {
  if (path_.empty()) return;
  store::RecordWriter w;
  w.U8(kPutRecord);
  WriteDoc(w, ns, doc.item, doc.registered_ms, HitsOfLocked(doc), doc.pinned, doc.pin_deadline_ms);
  pending_.push_back(w.bytes());
}

void KnowledgeRegistry::LogPinLocked(const keys::Digest& ns, const Doc& doc) {
  if (path_.empty()) return;
  store::RecordWriter w;
  w.U8(kPinRecord);
  w.Digest(ns);
  w.Digest(doc.item.model);
  w.Str(doc.item.doc_id);
  w.U8(doc.pinned ? 1 : 0);
  w.U64(doc.pin_deadline_ms);
  pending_.push_back(w.bytes());
}

void KnowledgeRegistry::LogDeleteLocked(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id) {
  if (path_.empty()) return;
  store::RecordWriter w;
  w.U8(kDeleteRecord);
  w.Digest(ns);
  w.Digest(model);
  w.Str(doc_id);
  pending_.push_back(w.bytes());
}

std::string KnowledgeRegistry::SerializeLocked(std::uint64_t generation) {
  store::RecordWriter w;
  w.U64(generation);
  w.U64(docs_.size());
  for (const auto& [key, doc] : docs_) {
    WriteDoc(w, std::get<0>(key), doc->item, doc->registered_ms, HitsOfLocked(*doc), doc->pinned,
             doc->pin_deadline_ms);
  }
  return w.bytes();
}

Status KnowledgeRegistry::SnapshotLocked() {
  std::string payload;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hits_changed_ = false;  // hits counted after the snapshot mark it again
    payload = SerializeLocked(generation_ + 1);
    pending_.clear();  // in the snapshot
  }
  log_.reset();  // until a log of the new snapshot is there, nothing is appended
  if (Status st = store::WriteRecordFile(path_, kRegistryFormat, payload); !st.ok()) {
    return Status::Internal("knowledge registry: " + st.message());
  }
  ++generation_;
  snapshot_bytes_ = payload.size();
  bytes_written_ += payload.size() + 56;  // with the record file's header
  ++snapshots_written_;
  auto log = store::RecordLog::Create(LogPath(path_), kLogFormat, generation_);
  if (!log.ok()) return Status::Internal("knowledge registry: " + log.status().message());
  log_ = std::move(log).value();
  bytes_written_ += store::RecordLog::kHeaderBytes;
  return Status::Ok();
}

Status KnowledgeRegistry::Save() {
  if (path_.empty()) return Status::Ok();
  std::lock_guard<std::mutex> file_lock(save_file_mu_);
  // The snapshot holds every change made before it: the saver's mark of
  // them is taken first (a change made after marks again), so neither the
  // saver nor the destructor writes them a second time. A node saved at
  // shutdown then writes nothing more when it is destroyed unless something
  // changed since (before: a change up to save_delay old was snapshotted
  // again, into a directory its owner may have removed by then).
  if (saver_) saver_->TakeDirty();
  Status st = SnapshotLocked();
  if (!st.ok() && saver_) saver_->Mark();  // tried again by the saver (or the destructor)
  return st;
}

Status KnowledgeRegistry::Flush() {
  if (path_.empty()) return Status::Ok();
  std::lock_guard<std::mutex> file_lock(save_file_mu_);
  if (!log_ || log_->bytes() > std::max(snapshot_bytes_, kMinCompactionBytes)) return SnapshotLocked();
  std::vector<std::string> records;
  {
    std::lock_guard<std::mutex> lock(mu_);
    records.swap(pending_);
  }
  if (records.empty()) return Status::Ok();
  const std::uint64_t before = log_->bytes();
  const Status st = log_->Append(records);
  bytes_written_ += log_->bytes() - before;
  if (!st.ok()) {
    // The log may end in a torn record now: the next write is a snapshot,
    // which holds these changes too.
    log_.reset();
    return Status::Internal("knowledge registry: " + st.message());
  }
  return Status::Ok();
}

namespace {

// A document's fields (WriteDoc's) into `doc`, its namespace into `ns`.
bool ReadDoc(store::RecordReader& r, keys::Digest& ns, KnowledgeDoc& it, std::uint64_t& registered_ms,
             std::uint64_t& hits, bool& pinned, std::uint64_t& pin_deadline_ms) {
  std::uint8_t pin = 0;
  std::uint32_t nkeys = 0;
  if (!r.Digest(ns) || !r.Digest(it.model) || !r.Str(it.doc_id, wire::node::MAX_DOC_ID_BYTES) || !r.U64(it.version) ||
      !r.Str(it.metadata, wire::node::MAX_METADATA_BYTES) || !r.U64(it.tokens) || !r.U64(registered_ms) ||
      !r.U64(hits) || !r.U8(pin) || !r.U64(pin_deadline_ms) || !r.U32(nkeys) ||
      nkeys > wire::node::MAX_KEYS_PER_CALL || std::uint64_t{nkeys} * 32 > r.left()) {
    return false;
  }
  it.keys.resize(nkeys);
  for (keys::Digest& k : it.keys) (void)r.Digest(k);
  if (it.doc_id.empty() || pin > 1) return false;
  pinned = pin == 1;
  return true;
}

}  // namespace

bool KnowledgeRegistry::InsertLoadedLocked(const keys::Digest& ns, std::unique_ptr<Doc> doc) {
  KnowledgeDoc& it = doc->item;
  if (doc->pinned && doc->pin_deadline_ms != 0 && doc->pin_deadline_ms <= WallMs()) {
    doc->pinned = false;  // the pin ran out while the node was down
    doc->pin_deadline_ms = 0;
  }
  // Bounds lowered since the file was written: what no longer fits is left
  // out (and said), the rest is served.
  DocKey dk{ns, it.model, it.doc_id};
  const auto used = ns_usage_.find(ns);
  const NsUsage u = used == ns_usage_.end() ? NsUsage{} : used->second;
  if (docs_.size() >= config_.max_documents || it.keys.size() > config_.max_keys_per_document ||
      total_keys_ + it.keys.size() > config_.max_keys || docs_.count(dk) != 0 ||
      u.documents >= config_.max_documents_per_namespace || u.keys + it.keys.size() > config_.max_keys_per_namespace) {
    return false;
  }
  std::unordered_set<keys::Digest, keys::DigestHash> seen;
  for (const keys::Digest& k : it.keys) {
    if (seen.insert(k).second) doc->distinct.push_back(k);
  }
  Doc& d = *doc;
  docs_.emplace(std::move(dk), std::move(doc));
  LinkLocked(ns, d);
  AddPinsLocked(ns, d);
  return true;
}

Status KnowledgeRegistry::Parse(std::span<const std::uint8_t> payload, bool with_generation, std::uint64_t* generation) {
  store::RecordReader r(payload);
  *generation = 0;
  if (with_generation && !r.U64(*generation)) return Status::Corrupt("truncated");
  std::uint64_t count = 0;
  if (!r.U64(count)) return Status::Corrupt("truncated");
  std::uint64_t dropped = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto doc = std::make_unique<Doc>();
    keys::Digest ns{};
    if (!ReadDoc(r, ns, doc->item, doc->registered_ms, doc->hits, doc->pinned, doc->pin_deadline_ms)) {
      return Status::Corrupt("document " + std::to_string(i) + " is malformed");
    }
    if (!InsertLoadedLocked(ns, std::move(doc))) ++dropped;
  }
  if (r.left() != 0) return Status::Corrupt("bytes after the last document");
  if (dropped != 0) {
    std::fprintf(stderr, "kdnd: knowledge registry: %llu documents beyond the [knowledge] bounds left out\n",
                 static_cast<unsigned long long>(dropped));
  }
  return Status::Ok();
}

bool KnowledgeRegistry::ReplayLocked(std::span<const std::uint8_t> body) {
  store::RecordReader r(body);
  std::uint8_t kind = 0;
  if (!r.U8(kind)) return false;
  keys::Digest ns{}, model{};
  std::string doc_id;
  if (kind == kPutRecord) {
    auto doc = std::make_unique<Doc>();
    if (!ReadDoc(r, ns, doc->item, doc->registered_ms, doc->hits, doc->pinned, doc->pin_deadline_ms) || r.left() != 0) {
      return false;
    }
    auto it = docs_.find(DocKey{ns, doc->item.model, doc->item.doc_id});
    if (it != docs_.end()) {  // a replacement
      RemovePinsLocked(ns, *it->second);
      UnlinkLocked(ns, *it->second);
      docs_.erase(it);
    }
    (void)InsertLoadedLocked(ns, std::move(doc));  // a bound lowered since: left out, as in a snapshot
    return true;
  }
  if (!r.Digest(ns) || !r.Digest(model) || !r.Str(doc_id, wire::node::MAX_DOC_ID_BYTES)) return false;
  auto it = docs_.find(DocKey{ns, model, doc_id});
  if (kind == kDeleteRecord) {
    if (r.left() != 0) return false;
    if (it != docs_.end()) {
      RemovePinsLocked(ns, *it->second);
      UnlinkLocked(ns, *it->second);
      docs_.erase(it);
    }
    return true;
  }
  if (kind == kPinRecord) {
    std::uint8_t pinned = 0;
    std::uint64_t deadline = 0;
    if (!r.U8(pinned) || !r.U64(deadline) || pinned > 1 || r.left() != 0) return false;
    if (it == docs_.end()) return true;  // left out by a bound
    Doc& d = *it->second;
    RemovePinsLocked(ns, d);
    d.pinned = pinned == 1 && (deadline == 0 || deadline > WallMs());
    d.pin_deadline_ms = d.pinned ? deadline : 0;
    AddPinsLocked(ns, d);
    return true;
  }
  return false;
}

void KnowledgeRegistry::ClearLocked() {
  docs_.clear();
  refs_.clear();
  ns_usage_.clear();
  pins_.Clear();
  total_keys_ = 0;
  pinned_documents_ = 0;
}

void KnowledgeRegistry::Load() {
  // The largest snapshot the bounds allow, and then some: anything bigger is not ours.
  const std::uint64_t most = 16 + std::uint64_t{config_.max_keys} * 32 +
                             std::uint64_t{config_.max_documents} *
                                 (200 + wire::node::MAX_DOC_ID_BYTES + wire::node::MAX_METADATA_BYTES);
  bool with_generation = true;
  auto file = store::ReadRecordFile(path_, kRegistryFormat, most);
  if (!file.ok() && file.status().code() == Code::kUnsupported) {
    auto v1 = store::ReadRecordFile(path_, kRegistryFormatV1, most);  // written before the log
    if (v1.ok()) {
      file = std::move(v1);
      with_generation = false;
    }
  }
  const bool had_snapshot = file.ok() || file.status().code() != Code::kNotFound;
  std::lock_guard<std::mutex> file_lock(save_file_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  Status st = Status::Ok();
  if (had_snapshot) {
    st = file.ok() ? Parse(*file, with_generation, &generation_) : file.status();
    snapshot_bytes_ = file.ok() ? file->size() : 0;
  }
  if (!st.ok()) {
    // Started empty, never stopped: the registry describes chunks, it does
    // not hold them. The files are set aside for a look, not overwritten.
    ClearLocked();
    generation_ = 0;
    ++load_failures_;
    const std::string aside = path_ + ".bad";
    const std::string note = ::rename(path_.c_str(), aside.c_str()) == 0 ? " (the file is now " + aside + ")" : "";
    (void)::rename(LogPath(path_).c_str(), (LogPath(path_) + ".bad").c_str());
    std::fprintf(stderr, "kdnd: knowledge registry %s: %s; starting with no documents%s\n", path_.c_str(),
                 st.message().c_str(), note.c_str());
    return;
  }
  // The changes since the snapshot. A log a change at most past compaction
  // size; one past twice the snapshot's bound is not read beyond it.
  auto log = store::ReadRecordLog(LogPath(path_), kLogFormat, 2 * most + 2 * kMinCompactionBytes);
  if (log.ok() && log->generation == generation_) {
    size_t applied = 0;
    for (const std::string& body : log->records) {
      if (!ReplayLocked({reinterpret_cast<const std::uint8_t*>(body.data()), body.size()})) break;
      ++applied;
    }
    if (applied != log->records.size() || log->torn) {
      // A crash in an append: the changes before it are whole and applied.
      std::fprintf(stderr,
                   "kdnd: knowledge registry %s: %zu changes replayed; the log's end (%llu bytes) was cut short by a "
                   "crash and is dropped\n",
                   LogPath(path_).c_str(), applied, static_cast<unsigned long long>(log->bytes));
    } else if (auto opened = store::RecordLog::Open(LogPath(path_), kLogFormat, *log); opened.ok()) {
      log_ = std::move(opened).value();  // appended to as it is
    }
  } else if (log.ok()) {
    // From before the snapshot (a crash between writing it and starting its
    // log): everything in it is in the snapshot.
  } else if (log.status().code() != Code::kNotFound) {
    ++load_failures_;
    (void)::rename(LogPath(path_).c_str(), (LogPath(path_) + ".bad").c_str());
    std::fprintf(stderr, "kdnd: knowledge registry %s: %s; its changes are lost (the file is now %s.bad)\n",
                 LogPath(path_).c_str(), log.status().message().c_str(), LogPath(path_).c_str());
  }
  // Without an open log the first write is a snapshot (and a new log).
  documents_ = docs_.size();
  // Pins that were in force when the node stopped hold again, on the chunks
  // the tiers kept.
  pins_.ForEachKey([&](const NsKey& k) { ApplyPinLocked(k); });
}

}  // namespace kdn::server
