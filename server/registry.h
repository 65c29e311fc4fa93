// SPDX-License-Identifier: Apache-2.0
// kdnd's registry of knowledge items (protocol version 2): documents, each
// named by (namespace, model, doc_id) and listing the client keys of its
// chunks, with their reference counts and pins over the node's chain of
// tiers. Chunks are counted per document: a chunk stays pinned while any
// pinned document holds it (core/store/pin_book.h: no deadline wins, else
// the latest), and a document's delete erases only the chunks no other
// document references. A get credits each served chunk to the documents
// that reference it (one hash lookup per served chunk, skipped while no
// document is registered).
//
// With a path (the node's first disk tier's directory + knowledge.kdnreg)
// the registry is kept in two files: a snapshot (knowledge.kdnreg) and a log
// of the changes since (knowledge.kdnreg.log, core/knowledge/record_file.h's
// RecordLog). A change is appended to the log a moment after it is made
// (debounced on a saver thread: a burst of changes is one write and one
// fdatasync), so it costs its own bytes; the snapshot is rewritten when the
// log has grown past max(the snapshot, 4 MiB), when an append failed, and
// when the registry is saved (Save: at shutdown, and when it is destroyed).
// At load the snapshot is read and its log replayed (a torn last record, a
// crash in an append, is dropped and said). A snapshot that cannot be read
// is logged, counted (load_failures), renamed to knowledge.kdnreg.bad (its
// log to knowledge.kdnreg.log.bad) and the registry starts empty. The
// formats are in registry.cc.
//
// Errors are Status values: kInvalidArgument, kTooLarge and kBusy (its
// bounds, [knowledge] of kdnd.toml) and kNotFound (no such document); the
// RPC layer (server/rpc.h) turns them into the schema's typed errors.
// Thread-safety: every member may be called from any thread. Lock order:
// the file's lock, then the registry's, then the chain's own locks and
// whatever `erase` takes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/keys/hash.h"
#include "core/knowledge/record_file.h"
#include "core/store/pin_book.h"
#include "core/store/tiered_store.h"
#include "core/util/status.h"
#include "server/config.h"

namespace kdn::server {

// The object a key of a namespace is filed under in the node's tiers:
// SHA-256("kdnd/1", namespace hash, key), so one key in two namespaces names
// two objects.
keys::Digest ObjectKey(const keys::Digest& ns, const keys::Digest& key);

// A knowledge item as a client registers it (wire KnowledgeItem).
struct KnowledgeDoc {
  std::string doc_id;
  std::uint64_t version = 0;
  std::string metadata;
  std::uint64_t tokens = 0;
  keys::Digest model{};
  std::vector<keys::Digest> keys;  // the client's keys of its chunks, in order
};

// What the node knows of one (wire KnowledgeInfo).
struct KnowledgeDocInfo {
  std::string doc_id;
  std::uint64_t version = 0;
  std::string metadata;
  std::uint64_t tokens = 0;
  keys::Digest model{};
  std::uint32_t chunks = 0, chunks_held = 0;
  bool pinned = false;
  std::uint64_t pin_expires_ms = 0;  // wall clock; 0: no deadline
  std::uint64_t registered_ms = 0;   // wall clock
  std::uint64_t hits = 0;
};

class KnowledgeRegistry {
 public:
  // Erases chunks of a namespace from the node (counted and announced as a
  // delete call's are); returns how many were held.
  using EraseFn = std::function<std::uint32_t(const keys::Digest& ns, std::span<const keys::Digest> keys)>;

  // `path` "": kept in memory only. Loads the file at `path` when there is
  // one. `chain` and `erase` must outlive the registry.
  KnowledgeRegistry(KnowledgeConfig config, std::string path, std::chrono::milliseconds save_delay,
                    store::TieredStore& chain, EraseFn erase);
  // Saves what changed since the last save.
  ~KnowledgeRegistry();
  KnowledgeRegistry(const KnowledgeRegistry&) = delete;
  KnowledgeRegistry& operator=(const KnowledgeRegistry&) = delete;

  // Registers (or replaces) a document: kInvalidArgument, kTooLarge or
  // kBusy (the bounds) and nothing changes.
  Status Put(const keys::Digest& ns, KnowledgeDoc doc);
  // The namespace's documents, ordered by (model, doc_id).
  std::vector<KnowledgeDocInfo> List(const keys::Digest& ns);
  // Pins (ttl_ms 0: no deadline) or unpins the document; *pinned: its
  // chunks pinned after the call. kNotFound for an unknown document.
  Status Pin(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id, bool pin,
             std::uint64_t ttl_ms, std::uint32_t& pinned);
  // Unregisters the document and erases its chunks no other document
  // references; *erased: how many were held. kNotFound for an unknown one.
  Status Delete(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id, std::uint32_t& erased);
  // Credits each of `served` (keys a get served) to the documents that reference it.
  void CreditHits(const keys::Digest& ns, std::span<const keys::Digest> served);
  // A chunk was stored: when a pinned document holds it, it is pinned now.
  void Stored(const keys::Digest& ns, const keys::Digest& key);
  // Writes a snapshot now and starts a new log (a no-op without a path); what
  // it wrote is not written again by the saver or the destructor.
  Status Save();
  // Appends the changes made since the last write to the log (or writes a
  // snapshot, when the log is due for one): what the saver thread runs.
  Status Flush();

  // What the files cost: bytes written to them since the registry was made,
  // and the snapshots among the writes.
  std::uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  std::uint64_t snapshots_written() const { return snapshots_written_.load(std::memory_order_relaxed); }

  const std::string& path() const { return path_; }
  std::uint64_t documents() const { return documents_.load(std::memory_order_relaxed); }
  std::uint64_t load_failures() const { return load_failures_.load(std::memory_order_relaxed); }

 private:
  // A chunk of a namespace: the key the indexes use (no hashing: the object
  // key is a SHA-256 away, and a get's credit must stay cheap).
  struct NsKey {
    keys::Digest ns, key;
    bool operator==(const NsKey&) const = default;
  };
  struct NsKeyHash {
    size_t operator()(const NsKey& k) const noexcept {
      return keys::DigestHash()(k.key) ^ (keys::DigestHash()(k.ns) * 0x9E3779B97F4A7C15ull);
    }
  };
  // What the registry knows of one chunk: the documents that reference it,
  // and how many times a get served it since it was first referenced.
  struct Doc;
  struct KeyRef {
    std::vector<Doc*> docs;
    std::uint64_t hits = 0;
  };
  struct Doc {
    KnowledgeDoc item;
    std::vector<keys::Digest> distinct;  // item.keys without repeats: what the reference counts count
    // A document's hits are `hits` plus what its chunks were served since
    // it was linked: per distinct key, its KeyRef and that key's hits then
    // (a get credits each served key once, whatever the documents sharing
    // it: a key in 100,000 documents costs one increment, not 100,000).
    std::vector<const KeyRef*> refs;
    std::vector<std::uint64_t> base;
    std::uint64_t registered_ms = 0, hits = 0;
    bool pinned = false;
    std::uint64_t pin_deadline_ms = 0;  // wall clock, while pinned; 0: none
  };
  using DocKey = std::tuple<keys::Digest, keys::Digest, std::string>;  // ns, model, doc_id

  // mu_ held: adds or withdraws the document's references and, when it is
  // pinned, its pins (ApplyPinLocked is the caller's to call).
  // mu_ held: a document's hits (see Doc).
  static std::uint64_t HitsOfLocked(const Doc& doc);
  void LinkLocked(const keys::Digest& ns, Doc& doc);
  void UnlinkLocked(const keys::Digest& ns, Doc& doc);
  void AddPinsLocked(const keys::Digest& ns, const Doc& doc);
  void RemovePinsLocked(const keys::Digest& ns, const Doc& doc);
  // mu_ held: sets the chain's pin of one chunk to what the pinned
  // documents holding it ask for (none, or every deadline passed:
  // unpinned). True when the chunk is pinned now.
  bool ApplyPinLocked(const NsKey& k);
  // mu_ held: a change for the log (the records' layouts: registry.cc).
  void LogDocLocked(const keys::Digest& ns, const Doc& doc);
  void LogPinLocked(const keys::Digest& ns, const Doc& doc);
  void LogDeleteLocked(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id);
  void MarkDirty();
  void Load();
  std::string SerializeLocked(std::uint64_t generation);  // mu_ held
  // Into the (empty) registry; mu_ held. *generation: the snapshot's.
  Status Parse(std::span<const std::uint8_t> payload, bool with_generation, std::uint64_t* generation);
  // A log record replayed; mu_ held. False: malformed.
  bool ReplayLocked(std::span<const std::uint8_t> body);
  // A loaded document into the registry, unless the bounds leave it out
  // (false); mu_ held.
  bool InsertLoadedLocked(const keys::Digest& ns, std::unique_ptr<Doc> doc);
  void ClearLocked();
  Status SnapshotLocked();  // save_file_mu_ held

  const KnowledgeConfig config_;
  const std::string path_;
  store::TieredStore& chain_;
  const EraseFn erase_;

  std::mutex mu_;
  std::map<DocKey, std::unique_ptr<Doc>> docs_;                     // guarded by mu_
  std::unordered_map<NsKey, KeyRef, NsKeyHash> refs_;   // chunk -> documents, hits; guarded by mu_
  store::PinBook<NsKey, std::uint64_t, NsKeyHash> pins_;           // chunk -> pinned documents' deadlines; guarded by mu_
  std::uint64_t total_keys_ = 0;                                    // guarded by mu_
  // Per namespace: its documents and their keys (the per-namespace bounds).
  struct NsUsage {
    std::uint64_t documents = 0, keys = 0;
  };
  std::unordered_map<keys::Digest, NsUsage, keys::DigestHash> ns_usage_;  // guarded by mu_
  std::atomic<std::uint64_t> documents_{0}, pinned_documents_{0}, load_failures_{0};
  std::atomic<bool> hits_changed_{false};
  std::vector<std::string> pending_;  // records not yet in the log; guarded by mu_
  std::mutex save_file_mu_;  // one writer of the files at a time; guards what follows
  std::uint64_t generation_ = 0;       // the snapshot's, which the log continues
  std::uint64_t snapshot_bytes_ = 0;
  std::unique_ptr<store::RecordLog> log_;  // null: the next write is a snapshot
  std::atomic<std::uint64_t> bytes_written_{0}, snapshots_written_{0};
  // The saver: wakes on a change, waits the delay, saves (with a path only).
  std::unique_ptr<store::DebouncedSaver> saver_;
};

}  // namespace kdn::server
