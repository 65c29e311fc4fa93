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
// The index lives in memory: documents are lost on restart while their
// chunks stay in the persistent tiers until evicted.
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <atomic>
#include <functional>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "store/kv_store.h"
#include "store/kv_views.h"

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
};

// One chunk of a document, as Put split and keyed it.
struct ChunkInfo {
  std::uint32_t index = 0;           // chunk `index` of the document
  std::uint64_t begin = 0;           // its first token's position in the document
  std::vector<std::int32_t> tokens;  // chunk_tokens of them; fewer for the last chunk only
  keys::Digest key{};                // its content key: KvStore::ContentKey(model, ns, tokens)
  keys::Digest stored_key{};         // where its KV is: `key`, or a variant when other bytes hold that
};

class KnowledgeIndex {
 public:
  explicit KnowledgeIndex(KvStore& store) : store_(store) {}

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
  };
  using DocKey = std::tuple<keys::Digest, std::string, std::string>;  // model, ns, doc_id

  using GatherFn = std::function<void(std::uint64_t begin, std::uint64_t tokens, std::uint8_t* out)>;
  Status PutWith(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::uint64_t version,
                 const std::string& metadata, std::span<const std::int32_t> tokens, const GatherFn& gather);
  // Snapshot, room check, then leases and scatter (null: tokens only).
  Status FetchWith(const ModelKv& model, std::string_view ns, const std::string& doc_id, std::uint64_t room,
                   const ScatterFn* scatter, std::vector<std::int32_t>* tokens, bool* lossy = nullptr);
  Doc* Find(const ModelKv& model, std::string_view ns, const std::string& doc_id);  // mu_ held
  void DropLocked(const DocKey& key);  // mu_ held: releases chunk references and pins, erases unshared chunks
  void SweepLocked();
  // mu_ held: sets the store's pin of a chunk to what the documents pinning
  // it ask for (the latest deadline; none: unpinned).
  Status ApplyPinLocked(const keys::Digest& stored_key);
  // mu_ held: withdraws a pinned document's pin from its chunks.
  void ReleasePinsLocked(Doc& doc);

  KvStore& store_;
  std::mutex put_mu_;  // one put at a time decides which key holds which bytes; taken before mu_
  std::mutex mu_;
  std::map<DocKey, Doc> docs_;                                                 // guarded by mu_
  std::unordered_map<keys::Digest, std::uint32_t, keys::DigestHash> refs_;    // stored key -> documents; guarded by mu_
  // stored key -> deadlines of the pinned documents holding it (0: none),
  // one per document and chunk; guarded by mu_
  std::unordered_map<keys::Digest, std::multiset<std::int64_t>, keys::DigestHash> pins_;
  std::atomic<std::uint64_t> generation_{0};                                   // written under mu_
};

}  // namespace kdn::store
