// The node service: what kdnd does with each call. The RPC servers that
// carry the calls live beside it in node.cc (its error codes are Cap'n
// Proto's), the document registry and the stats wire form too: splitting
// the domain from the transport is left to do (issue 29).
// It holds a pass-through chain of tiers (store/tiered_store.h): chunks are
// kept as their writers encoded them and served so. Every call comes with
// the grant of the token its session logged in with, and is checked against
// it before any key is looked at.
//
// Objects are filed under SHA-256("kdnd/1", namespace hash, key), so one key
// in two namespaces names two objects and no call in namespace A can reach
// an object of namespace B. An envelope is stored only when it checks (both
// checksums) and names the call's namespace; the node rewrites its key to the
// object's and back when it serves it.
//
// Knowledge items (protocol version 2): a registry of documents, each
// named by (namespace, model, doc_id) and listing the client keys of its
// chunks. Chunks are counted per document: a chunk stays pinned while any
// pinned document holds it, and a document's delete erases only the chunks
// no other document references. A get credits each served chunk to the
// documents that reference it (one hash lookup per served chunk, skipped
// while no document is registered). With a disk tier the registry is saved
// to <first disk tier's directory>/knowledge.kdnreg (format below, at
// SaveKnowledge) a moment after each change (debounced on a saver thread)
// and when the service is destroyed, and loaded at Create; a file that
// cannot be read is logged, counted (registry_load_failures), renamed to
// knowledge.kdnreg.bad and the registry starts empty.
//
// NodeRpc (below) is the Cap'n Proto face of it (wire/node.capnp).
// Thread-safety: NodeService's members may be called from any thread. Lock
// order: save_file_mu_, then knowledge_mu_, then client_keys_mu_ or the
// chain's own locks; the saver's lock is only ever held alone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <capnp/capability.h>
#include <kj/timer.h>

#include "core/keys/hash.h"
#include "server/config.h"
#include "core/wire/node_stats.h"
#include "core/knowledge/record_file.h"
#include "core/store/pin_book.h"
#include "core/store/tiered_store.h"
#include "core/telemetry/histogram.h"
#include "core/wire/node.capnp.h"

namespace kdn::server {

class KvEventPublisher;

// What a token grants, resolved: namespace hashes, or every namespace.
struct Grant {
  std::string name;
  bool all_namespaces = false;
  std::unordered_set<keys::Digest, keys::DigestHash> namespaces;
  bool stats = false;
  bool Allows(const keys::Digest& ns_hash) const { return all_namespaces || namespaces.count(ns_hash) != 0; }
};

// The typed errors of the schema, as the service returns them.
using ErrorCode = wire::node::ErrorCode;
struct NodeError {
  ErrorCode code = ErrorCode::OK;
  std::string message;
  bool ok() const { return code == ErrorCode::OK; }
};

struct NodeOptions {
  std::vector<store::TierSpec> tiers;  // empty: one host tier of 1 GiB
  std::vector<TokenGrant> tokens;
  double prefill_us_per_token = 0;     // TTFT saved = hit tokens x this
  const Clock* clock = nullptr;
  KnowledgeConfig knowledge;           // bounds of the registry of knowledge items
  // How long the saver waits after a change before it saves the registry,
  // so that a burst of registrations costs one write.
  std::uint32_t knowledge_save_delay_ms = 200;
  // Measure each tier's read rate once in Create (server/tier_limits.h) and
  // report it as the tier's limit_bytes_per_s; kdnd's server.measure_tiers.
  bool measure_tiers = false;
};

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

class NodeService {
 public:
  static Result<std::unique_ptr<NodeService>> Create(const NodeOptions& options);
  ~NodeService();

  // The grant of a token (compared in constant time against every token), or
  // null: an unknown token (counted).
  const Grant* Authenticate(std::string_view token);

  // Per request (a list of chained keys), the leading keys held.
  NodeError Lookup(const Grant& g, std::span<const std::uint8_t> ns, const std::vector<std::vector<keys::Digest>>& requests,
                   std::span<const std::uint64_t> request_tokens, std::vector<std::uint32_t>& prefixes);
  // Checks a call's namespace hash against the grant.
  NodeError CheckNamespace(const Grant& g, std::span<const std::uint8_t> ns, keys::Digest& out);
  // A held chunk, its key the caller's again (null: not held).
  store::ChunkRef Get(const keys::Digest& ns, const keys::Digest& key);
  // Records a finished get of `chunks` keys (served bytes, misses, latency).
  void CountGet(std::uint64_t chunks, std::uint64_t misses, std::uint64_t bytes, std::uint64_t tokens, double micros);
  // Stores one envelope of namespace `ns`.
  NodeError Put(const keys::Digest& ns, std::span<const std::uint8_t> envelope);
  void CountPut(double micros) { put_us_.Record(micros); }
  std::uint32_t Delete(const keys::Digest& ns, std::span<const keys::Digest> keys);
  std::uint32_t Pin(const keys::Digest& ns, std::span<const keys::Digest> keys, std::uint64_t ttl_ms);
  std::uint32_t Unpin(const keys::Digest& ns, std::span<const keys::Digest> keys);
  NodeStats Stats() const;

  // ---- Knowledge items; `ns` was checked against the grant (CheckNamespace).
  // Registers (or replaces) a document: invalidArgument, tooLarge or busy
  // (the registry's bounds) and nothing changes.
  NodeError KnowledgePut(const keys::Digest& ns, KnowledgeDoc doc);
  // The namespace's documents, ordered by (model, doc_id).
  std::vector<KnowledgeDocInfo> KnowledgeList(const keys::Digest& ns);
  // Pins (ttl_ms 0: no deadline) or unpins the document; *pinned: its
  // chunks pinned after the call. notFound for an unknown document.
  NodeError KnowledgePin(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id, bool pin,
                         std::uint64_t ttl_ms, std::uint32_t& pinned);
  // Unregisters the document and erases (Delete) its chunks no other
  // document references; *erased: how many were held.
  NodeError KnowledgeDelete(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id,
                            std::uint32_t& erased);
  // Credits each of `served` (keys get served) to the documents that reference it.
  void CreditKnowledgeHits(const keys::Digest& ns, std::span<const keys::Digest> served);
  // Writes the registry file now (a no-op without a disk tier); the service
  // also saves by itself after changes and when it is destroyed.
  Status SaveKnowledge();
  // Where the registry is saved ("" without a disk tier).
  const std::string& knowledge_path() const { return knowledge_path_; }
  std::uint64_t knowledge_documents() const { return documents_.load(std::memory_order_relaxed); }

  void CountAuthFailure() { ++auth_failures_; }
  void SessionOpened() { ++sessions_; }
  void SessionClosed() { --sessions_; }
  // While draining, data calls get `unavailable`.
  void SetDraining() { draining_ = true; }
  bool draining() const { return draining_; }
  std::uint64_t uptime_ms() const;
  // Where stored and removed chunks are announced (may be null). When the
  // node's tiers already hold objects (a disk tier after a restart), it
  // first announces AllBlocksCleared: it cannot name what it held before
  // (the client keys of objects filed by another run are not known), so a
  // router forgets it, and relearns each such chunk as a BlockStored when a
  // get serves it (after which its eviction is announced too).
  void SetEventPublisher(KvEventPublisher* publisher);
  store::TieredStore& chain() { return *chain_; }

  // The object a key of a namespace is filed under.
  static keys::Digest ObjectKey(const keys::Digest& ns, const keys::Digest& key);

 private:
  NodeService() = default;

  // ---- The registry of knowledge items.
  // A chunk of a namespace: the key the registry's indexes use (no hashing:
  // the object key is a SHA-256 away, and a get's credit must stay cheap).
  struct NsKey {
    keys::Digest ns, key;
    bool operator==(const NsKey&) const = default;
  };
  struct NsKeyHash {
    size_t operator()(const NsKey& k) const noexcept {
      return keys::DigestHash()(k.key) ^ (keys::DigestHash()(k.ns) * 0x9E3779B97F4A7C15ull);
    }
  };
  struct Doc {
    KnowledgeDoc item;
    std::vector<keys::Digest> distinct;  // item.keys without repeats: what the reference counts count
    std::uint64_t registered_ms = 0, hits = 0;
    bool pinned = false;
    std::uint64_t pin_deadline_ms = 0;  // wall clock, while pinned; 0: none
  };
  using DocKey = std::tuple<keys::Digest, keys::Digest, std::string>;  // ns, model, doc_id
  // knowledge_mu_ held: adds or withdraws the document's references and,
  // when it is pinned, its pins (ApplyPinLocked is the caller's to call).
  void LinkLocked(const keys::Digest& ns, Doc& doc);
  void UnlinkLocked(const keys::Digest& ns, Doc& doc);
  void AddPinsLocked(const keys::Digest& ns, const Doc& doc);
  void RemovePinsLocked(const keys::Digest& ns, const Doc& doc);
  // knowledge_mu_ held: sets the chain's pin of one chunk to what the pinned
  // documents holding it ask for (no deadline wins, else the latest; none,
  // or every deadline passed: unpinned). True when the chunk is pinned now.
  bool ApplyPinLocked(const NsKey& k);
  void MarkKnowledgeDirty();
  void LoadKnowledge();
  std::string SerializeKnowledge();                       // takes knowledge_mu_
  Status ParseKnowledge(std::span<const std::uint8_t> payload);  // into the (empty) registry; knowledge_mu_ held

  KnowledgeConfig knowledge_config_;
  std::string knowledge_path_;
  std::mutex knowledge_mu_;
  std::map<DocKey, std::unique_ptr<Doc>> docs_;                          // guarded by knowledge_mu_
  std::unordered_map<NsKey, std::vector<Doc*>, NsKeyHash> refs_;        // chunk -> documents; guarded by knowledge_mu_
  store::PinBook<NsKey, std::uint64_t, NsKeyHash> pins_;  // chunk -> pinned documents' deadlines; guarded by knowledge_mu_
  std::uint64_t total_keys_ = 0;                                         // guarded by knowledge_mu_
  std::atomic<std::uint64_t> documents_{0}, pinned_documents_{0}, registry_load_failures_{0};
  std::atomic<bool> hits_changed_{false};
  // The saver: wakes on a change, waits knowledge_save_delay_ms, saves.
  std::unique_ptr<store::DebouncedSaver> saver_;
  std::mutex save_file_mu_;                                              // one writer of the file at a time

  std::unique_ptr<store::TieredStore> chain_;
  std::vector<store::TierSpec> specs_;
  std::vector<double> tier_limits_;  // per spec, bytes/s (0: not measured); set in Create only
  std::vector<std::pair<std::string, Grant>> grants_;  // (token, grant)
  double prefill_us_per_token_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<bool> draining_{false};
  std::atomic<KvEventPublisher*> events_{nullptr};
  // The client's key of each object the node filed since it started, or
  // served since (objects a restart found on disk enter it when a get serves
  // them), for KV events about evictions; an object evicted before that is
  // not announced (AllBlocksCleared at start made routers forget it).
  void Dropped(const keys::Digest& object);
  // A get served `object` as the client's `key`: learned (and announced as
  // stored) when the node did not know that key yet.
  void Learned(const keys::Digest& object, const keys::Digest& key, std::uint32_t tokens);
  std::mutex client_keys_mu_;
  std::unordered_map<keys::Digest, keys::Digest, keys::DigestHash> client_keys_;
  std::atomic<std::uint64_t> lookups_{0}, requested_tokens_{0}, hit_tokens_{0}, lookup_hit_tokens_{0};
  std::atomic<std::uint64_t> get_chunks_{0}, get_misses_{0}, get_bytes_{0};
  std::atomic<std::uint64_t> put_chunks_{0}, put_bytes_{0}, put_refused_{0}, deletes_{0};
  std::atomic<std::uint64_t> auth_failures_{0};
  std::atomic<std::int64_t> sessions_{0};
  telemetry::Histogram lookup_us_, get_us_, put_us_;
};

// The bootstrap capability of a connection (KdnNode). `timer` paces the
// statistics pushes; both must outlive every connection.
capnp::Capability::Client MakeNodeBootstrap(NodeService& service, kj::Timer& timer, const std::string& version);
// A session for a grant, as login makes it (tests and the fuzz target call
// its methods as local capabilities, through the same handlers).
wire::node::Session::Client MakeSession(NodeService& service, kj::Timer& timer, const Grant& grant);

}  // namespace kdn::server
