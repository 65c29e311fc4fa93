// SPDX-License-Identifier: Apache-2.0
// Knowledge items: named documents (doc_id, version, metadata) whose KV is
// kept under position-free content keys, chunk by chunk, so that operators
// choose which documents are served and the blender can fetch a document's
// KV wherever it lands in a context. Operators list, pin, expire and delete
// them; a delete removes the document's chunks from every tier (chunks that
// another document shares stay, by reference count).
//
// Sharing: a fetch returns exactly the KV put for that document. The same
// text has other KV in another document when what precedes it differs (the
// KV of chunk i depends on every token before it), so a chunk is shared only
// where the bytes are the same: a put stores a chunk under its content key
// when that key is free or holds these very bytes, and otherwise under a
// variant key, H(content key, bytes), that no other bytes can have. A key
// that an indexed document references while no tier holds it (evicted) is
// not free: its bytes are unknown, so another document's put takes a variant
// rather than hand the first document KV it never put. Content keys still
// describe the text (Chunks(), the blender's matcher); stored keys say where
// each document's KV is.
//
// Pins are counted per document: a chunk stays pinned while any document
// that holds it is pinned, until the latest of their deadlines.
// The index lives in memory and, once Persist() names a file (a runtime
// with a disk tier keeps DIR/knowledge.kdnidx in its first disk tier's
// directory), in that file too: it is loaded there and saved 200 ms after
// each change (a burst of changes costs one write) and when the index is
// destroyed, so documents survive a restart with the chunks the disk tier
// kept. Hits are saved with the next change. A store with a remote
// tier (a kdnd) also announces each put, pin, unpin and delete of a
// document to the node (Tier::Document), which keeps a registry of its own
// that operators and other engines list (docs/kdnd.md).
// Pins on the node run on its clock: the TTL travels, not the deadline.
//
// Bound: the index's own memory is charged against a capacity
// (KnowledgeOptions::capacity_bytes, 64 MiB by default). Each document is
// charged what it costs here (ChargeOf): its tokens, its two keys per chunk
// and the chunk's reference and pin entries, its strings, and its map, age
// and deadline entries: 4 bytes per token, 320 per chunk and ~460 per
// document (more for strings over 15 bytes), ~5.3 bytes per token with
// 256-token chunks. 64 MiB describes ~12M tokens of documents, far more KV
// than the tiers of any real model hold (a 1B model's 12M tokens are
// ~400 GB), so the bound binds only on documents whose KV has left the
// tiers, or on abuse (a document per few tokens).
// A put that would exceed it first drops documents whose KV left every tier
// (a chunk in no tier: their fetch returns kNotFound anyway; pinned ones are
// kept), oldest first, looking at a bounded number of chunks per put and
// resuming where the last put stopped; if the document still does not fit,
// it is refused with kBusy, naming the limit, and nothing is stored. A live
// document is never dropped to make room, not even one with a TTL: it is
// live until its deadline (the sweep drops it then, and every put sweeps
// first), and dropping it early would silently shorten the TTL an operator
// set. Room is made by deleting or expiring documents.
// Cost: a call looks up its document by (model, namespace, doc_id) in an
// ordered map; the sweep of expired documents walks an ordered index of
// deadlines, so it looks at expired documents only; a list walks only its
// own (model, namespace).
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <functional>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/engine/kv_store.h"
#include "core/engine/kv_views.h"
#include "core/knowledge/record_file.h"
#include "core/store/pin_book.h"

namespace kdn::store {

struct DocumentInfo {
  std::string doc_id;
  std::uint64_t version = 0;
  std::string metadata;
  std::uint64_t tokens = 0;
  std::uint32_t chunks = 0;
  bool pinned = false;
  std::int64_t expires_at_ns = 0;  // 0: never
  std::uint32_t chunks_present = 0;  // chunks some tier holds now
  std::uint64_t hits = 0;            // chunks of it served (fetches, blends) since this version was put
  std::int64_t pin_expires_at_ns = 0;  // while pinned: when the pin ends (0: when unpinned)
};

// One chunk of a document, as Put split and keyed it.
struct ChunkInfo {
  std::uint32_t index = 0;           // chunk `index` of the document
  std::uint64_t begin = 0;           // its first token's position in the document
  std::vector<std::int32_t> tokens;  // chunk_tokens of them; fewer for the last chunk only
  keys::Digest key{};                // its content key: KvStore::ContentKey(model, ns, tokens)
  keys::Digest stored_key{};         // where its KV is: `key`, or a variant when other bytes hold that
};

struct KnowledgeOptions {
  // The memory the index may use for its documents, as charged by
  // KnowledgeIndex (see the file comment); puts beyond it are refused with
  // kBusy. UINT64_MAX: unbounded.
  std::uint64_t capacity_bytes = std::uint64_t{64} << 20;
};

class KnowledgeIndex {
 public:
  explicit KnowledgeIndex(KvStore& store, KnowledgeOptions options = {}) : store_(store), options_(options) {}
  // Saves what changed since the last save (if the index is persisted).
  ~KnowledgeIndex();
  KnowledgeIndex(const KnowledgeIndex&) = delete;
  KnowledgeIndex& operator=(const KnowledgeIndex&) = delete;

  // Keeps the index in the record file `path` (knowledge/record_file.h) from now
  // on: first loads the documents it holds (call it before any put), then
  // saves every change `delay` after it, in the background, and at
  // destruction. A file that cannot be loaded (corrupt, truncated, another
  // format) is renamed to PATH.bad and the index starts empty (its chunks
  // stay in the tiers): the returned status says why, and persistence is on
  // either way. Documents whose expiry passed while the file lay are dropped
  // at the first call; pins whose deadline passed are not applied again;
  // documents beyond the capacity are left out (counted in the status).
  // Deadlines are kept as wall-clock times.
  // With a sealer (the deployment secret: wire/seal.h) the file is sealed
  // whole, and a file whose seal is not the secret's is refused as a corrupt
  // one is (set aside; the status says why): whoever can write to the
  // directory cannot hand the index documents that name other KV. Without
  // one a sealed file is read as it is (its seal unchecked).
  Status Persist(const std::string& path, std::chrono::milliseconds delay = std::chrono::milliseconds(200),
                 std::shared_ptr<const wire::ChunkSealer> sealer = nullptr);
  // Saves now if anything changed since the last save (no-op when not persisted).
  Status Flush();
  // Saves written since Persist (tests).
  std::uint64_t saves() const { return saves_.load(std::memory_order_relaxed); }
  // Applies to later puts: a smaller capacity drops nothing, it refuses
  // puts until deletes and expiries bring the charge under it.
  void SetOptions(const KnowledgeOptions& options);
  KnowledgeOptions options() const;

  // Stores a document's KV (view token i = tokens[i], computed from position
  // 0) under content keys; replaces an older version of the same doc_id.
  Status Put(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::uint64_t version,
             const std::string& metadata, std::span<const std::int32_t> tokens, const kernels::KvView& view);
  // The same from a caller's views (resolved for tokens.size() tokens).
  Status Put(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::uint64_t version,
             const std::string& metadata, std::span<const std::int32_t> tokens, const ResolvedViews& views);
  std::vector<DocumentInfo> List(const ModelKv& model, std::string_view ns);
  Result<DocumentInfo> Info(const ModelKv& model, std::string_view ns, const std::string& doc_id);
  // Pins (or unpins) the document: its chunks stay in their tiers while it
  // is pinned, for ttl_ns (0: until unpinned; a TTL too large for the clock
  // saturates). Pinning again replaces the document's TTL; unpinning leaves
  // the chunks other pinned documents share pinned. kNotFound (and nothing
  // pinned) when a chunk is in no tier.
  Status Pin(const ModelKv& model, std::string_view ns, const std::string& doc_id, bool pin, std::int64_t ttl_ns);
  // The document is deleted ttl_ns from now (0: now; a TTL too large for the
  // clock saturates: never).
  Status Expire(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::int64_t ttl_ns);
  Status Delete(const ModelKv& model, std::string_view ns, const std::string& doc_id);
  // The document's tokens, and its KV written into `view` at the document's
  // own positions (token i of the view = token i of the document). kNotFound
  // when a chunk is gone from every tier (the document must be re-ingested).
  Result<std::vector<std::int32_t>> Fetch(const ModelKv& model, std::string_view ns, const std::string& doc_id,
                                          const kernels::KvView* view);
  // One snapshot of the document: *tokens gets its tokens (whenever it
  // exists); its KV goes into `views` (may be null) unless the document is
  // longer than `room` tokens: then kBufferTooSmall and nothing is written.
  // A concurrent put of another version never mixes into what is written.
  Status Fetch(const ModelKv& model, std::string_view ns, const std::string& doc_id, const ResolvedViews* views,
               std::uint64_t room, std::vector<std::int32_t>* tokens, bool* lossy = nullptr);
  // One snapshot of the document: *tokens gets its tokens, then each chunk's
  // canonical KV is handed to `scatter` in order (begin = the chunk's first
  // token), after every chunk was leased and checked.
  using ScatterFn = std::function<void(const std::uint8_t* canonical, std::uint64_t begin, std::uint64_t tokens)>;
  Status FetchScattered(const ModelKv& model, std::string_view ns, const std::string& doc_id, const ScatterFn& scatter,
                        std::vector<std::int32_t>* tokens) {
    return FetchWith(model, ns, doc_id, UINT64_MAX, &scatter, tokens);
  }
  // Deletes expired documents; returns how many.
  size_t Sweep();
  // The bytes charged for the documents indexed now (at most the capacity
  // once a put was refused or made room), and how many there are.
  std::uint64_t charged_bytes() const;
  size_t documents() const;
  // What one document of these sizes is charged (see the file comment).
  static std::uint64_t ChargeOf(size_t ns_bytes, size_t doc_id_bytes, size_t metadata_bytes, size_t tokens,
                                size_t chunks);
  // Documents looked at, since the index was made: by the sweeps of expired
  // documents, by lists and infos, and by puts making room (tests use them
  // to check that no call walks every document).
  struct ScanCounters {
    std::uint64_t sweep = 0, list = 0, reclaim = 0;
  };
  ScanCounters Scans() const;
  // The document's chunks in order (each one's tokens and content key);
  // kNotFound when there is no such document. Chunks evicted from every tier
  // are listed too: this describes the document, not what tiers hold.
  Result<std::vector<ChunkInfo>> Chunks(const ModelKv& model, std::string_view ns, const std::string& doc_id);
  // Counts changes to the set of documents (puts, deletes, expiries): a
  // reader that saw generation g and sees g again saw no change in between.
  // Expired documents count once swept (any call here sweeps; Sweep() forces it).
  std::uint64_t Generation() const { return generation_.load(std::memory_order_acquire); }
  // The store this index keeps its chunks in (its seed keys the chunks).
  KvStore& store() const { return store_; }

 private:
  struct Doc {
    DocumentInfo info;
    std::vector<std::int32_t> tokens;
    std::vector<keys::Digest> chunk_keys;   // content keys
    std::vector<keys::Digest> stored_keys;  // where each chunk's KV is (see the file comment)
    std::int64_t pin_deadline = 0;          // while info.pinned: its pin's deadline (0: none)
    std::uint64_t seq = 0;                  // put order: its key in by_age_
    std::uint64_t charge = 0;               // bytes charged against the capacity (ChargeOf)
  };
  using DocKey = std::tuple<keys::Digest, std::string, std::string>;  // model, ns, doc_id
  using DocMap = std::map<DocKey, Doc>;

  using GatherFn = std::function<void(std::uint64_t begin, std::uint64_t tokens, std::uint8_t* out)>;
  Status PutWith(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::uint64_t version,
                 const std::string& metadata, std::span<const std::int32_t> tokens, const GatherFn& gather);
  // Snapshot, room check, then leases and scatter (null: tokens only).
  Status FetchWith(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::uint64_t room,
                   const ScatterFn* scatter, std::vector<std::int32_t>* tokens, bool* lossy = nullptr);
  Doc* Find(const ModelKv& model, std::string_view ns, const std::string& doc_id);  // mu_ held
  // mu_ held: releases chunk references and pins, erases unshared chunks,
  // and the document's entries in every index.
  // With `announce`, tiers that keep a registry of documents (a node) are
  // told of the delete; a put that replaces the document does not (its own
  // announcement replaces it there).
  void DropLocked(DocMap::iterator it, bool announce = true);
  void DropLocked(const DocKey& key, bool announce = true);
  // The document as a registry records it (`doc` null: its name only).
  static DocumentRecord RecordOf(const DocKey& key, const Doc* doc);
  void SweepLocked();
  // mu_ held: sets (0: clears) the document's deadline, in by_deadline_ too.
  void SetDeadlineLocked(Doc& doc, std::int64_t deadline);
  // mu_ held: makes room for a document charged `need` that replaces the
  // one at `key` (if any): drops documents whose KV left every tier, then
  // kBusy if it still does not fit.
  Status MakeRoomLocked(const DocKey& key, std::uint64_t need);
  // mu_ held: true when a chunk of the document is in no tier.
  bool DeadLocked(const Doc& doc, const ReadContext& ctx);
  // mu_ held: the document's info, with the chunks some tier holds now.
  DocumentInfo DescribeLocked(const Doc& doc, const ReadContext& ctx);
  // mu_ held: sets the store's pin of a chunk to what the documents pinning
  // it ask for (the latest deadline; none: unpinned).
  Status ApplyPinLocked(const keys::Digest& stored_key, const ReadContext& ctx);
  // mu_ held: withdraws a pinned document's pin from its chunks.
  void ReleasePinsLocked(Doc& doc, const ReadContext& ctx);
  // What calls about a document pass down the chain: its namespace's (store/tier.h).
  ReadContext ContextOf(const DocKey& key) const { return store_.Context(std::get<1>(key), {}, false); }
  // Persistence: the payload of the file (mu_ held), its parse into an
  // empty index (mu_ held), the saver thread, and what wakes it.
  std::string SerializeLocked();
  Status ParseLocked(std::span<const std::uint8_t> payload);
  Status SaveNow();  // file_mu_ not held
  void MarkDirty();

  KvStore& store_;
  std::mutex put_mu_;  // one put at a time decides which key holds which bytes; taken before mu_
  mutable std::mutex mu_;
  KnowledgeOptions options_;                                                   // guarded by mu_
  DocMap docs_;                                                                // guarded by mu_
  std::map<std::uint64_t, DocMap::iterator> by_age_;                           // seq -> document; guarded by mu_
  std::set<std::pair<std::int64_t, std::uint64_t>> by_deadline_;               // (expires_at_ns, seq); guarded by mu_
  std::uint64_t next_seq_ = 1;                                                 // guarded by mu_
  std::uint64_t reclaim_from_ = 0;  // seq the next search for dead documents starts at; guarded by mu_
  std::uint64_t charged_ = 0;                                                  // guarded by mu_
  ScanCounters scans_;                                                         // guarded by mu_
  std::unordered_map<keys::Digest, std::uint32_t, keys::DigestHash> refs_;    // stored key -> documents; guarded by mu_
  // stored key -> deadlines of the pinned documents holding it (0: none),
  // one per document and chunk; guarded by mu_
  PinBook<keys::Digest, std::int64_t, keys::DigestHash> pins_;
  std::atomic<std::uint64_t> generation_{0};                                   // written under mu_

  std::string path_;  // set once by Persist; empty: not persisted
  std::shared_ptr<const wire::ChunkSealer> sealer_;  // set once by Persist; null: files unsealed
  std::mutex file_mu_;  // one save at a time (they share PATH.tmp)
  std::atomic<std::uint64_t> saves_{0};
  std::unique_ptr<DebouncedSaver> saver_;  // set once by Persist
};

}  // namespace kdn::store
