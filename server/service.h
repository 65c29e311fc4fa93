// SPDX-License-Identifier: Apache-2.0
// The node service: what kdnd does with each call, apart from how calls
// arrive (server/rpc.h carries them over Cap'n Proto and turns this
// service's Status values into the schema's typed errors).
// It holds a pass-through chain of tiers (core/store/tiered_store.h): chunks
// are kept as their writers encoded them and served so. Every call comes
// with the grant of the token its session logged in with, and is checked
// against it before any key is looked at.
//
// Objects are filed under ObjectKey(namespace hash, key) (server/registry.h),
// so no call in namespace A can reach an object of namespace B. An envelope
// is stored only when it checks (both checksums) and names the call's
// namespace; the node rewrites its key to the object's and back when it
// serves it. Knowledge items are kept by a KnowledgeRegistry
// (server/registry.h), saved beside the first disk tier.
//
// Errors: kInvalidArgument (a malformed namespace or envelope field),
// kPermissionDenied (outside the grant), kCorrupt (an envelope that fails
// its checks), kBusy (no room), kUnavailable (draining), kTooLarge and
// kNotFound (the registry's), kInternal.
// Thread-safety: NodeService's members may be called from any thread. Lock
// order: the registry's locks, then the chain's own, then client_keys_mu_
// (LevelChanged runs under a tier's write lock).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/keys/hash.h"
#include "core/store/tiered_store.h"
#include "core/telemetry/histogram.h"
#include "core/wire/node_stats.h"
#include "core/wire/seal.h"
#include "server/config.h"
#include "server/registry.h"
#include "server/usage.h"

namespace kdn::server {

class KvEventPublisher;

// What a token grants, resolved: namespace hashes, or every namespace.
// A session refers to its grant for as long as it lives; a token dropped
// by a reload (NodeService::ReloadTokens) is revoked, and its sessions' calls
// are refused from then on.
struct Grant {
  std::string name;
  bool all_namespaces = false;
  std::unordered_set<keys::Digest, keys::DigestHash> namespaces;
  bool stats = false;
  bool revoked = false;
  bool Allows(const keys::Digest& ns_hash) const {
    return !revoked && (all_namespaces || namespaces.count(ns_hash) != 0);
  }
};

// What a reload of the tokens did.
struct TokenReload {
  size_t kept = 0, added = 0, revoked = 0;
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
  // The deployment secret's file (wire/seal.h; kdnd's server.secret_file):
  // the node's redis and disk tiers seal what they store and read back only
  // what is sealed with it. Empty: none.
  std::string secret_file;
  // Master keys for encryption at rest (wire/cipher.h; kdnd's
  // server.encryption_key_file or server.encryption_key_env, at most one):
  // the node's disk and redis tiers encrypt the chunks they store that their
  // clients sent in the clear, and decrypt them when read back; chunks a
  // client encrypted (its remote tier's keys) are stored and served as they
  // came. Empty: none.
  std::string encryption_key_file;
  std::string encryption_key_env;
  // Statistics subscriptions open at once on the node (kdnd's
  // server.max_subscriptions); past it subscribeStats gets busy.
  std::uint32_t max_subscriptions = 256;
  // A get's reply carries at most this many bytes of envelopes; the keys
  // past it are answered missing (counted: repliesCapped). kdnd's
  // server.max_reply_bytes.
  std::uint64_t max_reply_bytes = std::uint64_t{256} << 20;
  // (namespace, model) pairs with series of their own on the metrics page
  // (kdn_usage_*); the rest add up under "other" (server/usage.h). kdnd's
  // server.max_usage_series.
  std::uint32_t max_usage_series = 64;
};

class NodeService {
 public:
  static Result<std::unique_ptr<NodeService>> Create(const NodeOptions& options);
  ~NodeService();

  // The grant of a token (compared in constant time against every token), or
  // null: an unknown token (counted).
  const Grant* Authenticate(std::string_view token);
  // Whether `token` is a token with the stats grant (an unknown one, or one
  // without the grant, counted as Authenticate and CheckStats count them).
  // From any thread (the KV events' ZAP handler): under grants_mu_, which
  // ReloadTokens holds while it changes the grants.
  bool GrantsStats(std::string_view token);
  // Replaces the tokens (kdnd's SIGHUP): a token still there keeps its
  // sessions, under its new grant (namespaces, stats, name); a new one can
  // log in; one no longer there is revoked: its sessions' calls are refused
  // (kPermissionDenied, counted) from now on. On the thread that serves the
  // sessions (the node's event loop), as every call that reads a grant.
  TokenReload ReloadTokens(const std::vector<TokenGrant>& tokens);

  // Per request (a list of chained keys), the leading keys held.
  Status Lookup(const Grant& g, std::span<const std::uint8_t> ns, const std::vector<std::vector<keys::Digest>>& requests,
                   std::span<const std::uint64_t> request_tokens, std::vector<std::uint32_t>& prefixes);
  // A runtime's report of its engines' requests in namespace `ns` (the
  // engine* statistics): a lookup's hit tokens beyond its tokens, or a
  // load's, are refused (kInvalidArgument), nothing counted.
  struct RequestReport {
    std::uint64_t lookups = 0, lookup_tokens = 0, lookup_hit_tokens = 0;
    std::uint64_t loads = 0, load_tokens = 0, load_hit_tokens = 0;
    keys::Digest model{};  // the engines' model fingerprint; zero: not said
  };
  Status Report(const Grant& g, std::span<const std::uint8_t> ns, const RequestReport& report);
  // Checks a call's namespace hash against the grant.
  Status CheckNamespace(const Grant& g, std::span<const std::uint8_t> ns, keys::Digest& out);
  // A held chunk, its key the caller's again (null: not held). Where the
  // node kept the envelope it was put in (a memory tier), the chunk's
  // `envelope` is those bytes, to be sent as they are.
  store::ChunkRef Get(const keys::Digest& ns, const keys::Digest& key);
  // Records a finished get of `chunks` keys (served bytes, misses, latency).
  void CountGet(std::uint64_t chunks, std::uint64_t misses, std::uint64_t bytes, std::uint64_t tokens, double micros);
  // Stores one envelope of namespace `ns`, checked as DecodeEnvelope checks
  // it. With `owner` (which keeps the envelope's bytes alive: the message it
  // arrived in), the chunk is filed from those bytes as they are: its
  // payload is not copied out of them, and a memory tier keeps the envelope
  // whole (one copy, into the tier), which gets then send back unchanged.
  Status Put(const keys::Digest& ns, std::span<const std::uint8_t> envelope, std::shared_ptr<void> owner = nullptr);
  void CountPut(double micros) { put_us_.Record(micros); }
  std::uint32_t Delete(const keys::Digest& ns, std::span<const keys::Digest> keys);
  std::uint32_t Pin(const keys::Digest& ns, std::span<const keys::Digest> keys, std::uint64_t ttl_ms);
  std::uint32_t Unpin(const keys::Digest& ns, std::span<const keys::Digest> keys);
  NodeStats Stats() const;
  // Whether the grant includes statistics (kPermissionDenied, counted, when not).
  Status CheckStats(const Grant& g);

  // ---- Knowledge items (server/registry.h); `ns` was checked against the
  // grant (CheckNamespace). A put while draining is kUnavailable.
  Status KnowledgePut(const keys::Digest& ns, KnowledgeDoc doc);
  KnowledgeRegistry& knowledge() { return *registry_; }
  // The deployment secret's sealer (null: none): the node seals each
  // envelope it sends with it (wire/node.capnp GetResult.seal).
  const wire::ChunkSealer* sealer() const { return sealer_.get(); }

  void SessionOpened() { ++sessions_; }
  void SessionClosed() { --sessions_; }
  void ConnectionOpened() { ++connections_; }
  void ConnectionClosed() { --connections_; }
  std::int64_t connections() const { return connections_.load(); }
  // A bound the transport enforced (server/server.cc, server/rpc.cc).
  void CountBound(NodeStat s) { Count(s); }
  std::uint64_t max_reply_bytes() const { return max_reply_bytes_; }
  // A subscription opened (false, counted: the node holds its most) and
  // closed.
  bool SubscriptionOpened() {
    if (subscriptions_.fetch_add(1) >= static_cast<std::int64_t>(max_subscriptions_)) {
      --subscriptions_;
      Count(NodeStat::kSubscriptionsRefused);
      return false;
    }
    return true;
  }
  void SubscriptionClosed() { --subscriptions_; }
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
  // The publisher set there, or null.
  const KvEventPublisher* event_publisher() const { return events_.load(); }
  store::TieredStore& chain() { return *chain_; }

 private:
  NodeService() = default;

  std::unique_ptr<store::TieredStore> chain_;
  std::unique_ptr<KnowledgeRegistry> registry_;  // after chain_: destroyed (and saved) first
  std::vector<store::TierSpec> specs_;
  std::shared_ptr<const wire::ChunkSealer> sealer_;
  std::vector<double> tier_limits_;  // per spec, bytes/s (0: not measured); set in Create only
  // (token digest, grant). Grants live as long as the service: a session
  // refers to its own, revoked ones too (a few hundred bytes a token a
  // reload).
  std::mutex grants_mu_;  // ReloadTokens against GrantsStats (other readers share ReloadTokens' thread)
  std::vector<std::pair<std::string, std::unique_ptr<Grant>>> grants_;
  std::vector<std::unique_ptr<Grant>> revoked_grants_;
  double prefill_us_per_token_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<bool> draining_{false};
  std::atomic<KvEventPublisher*> events_{nullptr};
  // KV events. The client's key (and tokens) of each object the node filed
  // since it started, or served since (objects a restart found on disk
  // enter it when a get serves them): a tier taking or losing such an object
  // is announced under that key with the tier's medium (media_: "CPU",
  // "DISK", ... by tier); an object not known so is not announced
  // (AllBlocksCleared at start made routers forget it).
  struct ClientKey {
    keys::Digest key{};
    std::uint32_t tokens = 0;
  };
  std::vector<std::string> media_;
  std::unique_ptr<UsageBook> usage_;
  void LevelChanged(const keys::Digest& object, size_t level, bool held);
  // Forgets the key of an object no tier holds any more.
  void Dropped(const keys::Digest& object);
  // A get served `object` as the client's `key`: learned (and announced as
  // held by the tiers holding it) when the node did not know that key yet.
  void Learned(const keys::Digest& object, const keys::Digest& key, std::uint32_t tokens);
  std::mutex client_keys_mu_;
  std::unordered_map<keys::Digest, ClientKey, keys::DigestHash> client_keys_;
  // The counters of NodeStat (core/wire/node_stats.h) the service counts;
  // the gauges (sessions, documents) and the registry's are read in Stats.
  void Count(NodeStat s, std::uint64_t n = 1) { counts_[static_cast<std::size_t>(s)].fetch_add(n, std::memory_order_relaxed); }
  std::array<std::atomic<std::uint64_t>, kNodeStatCount> counts_{};
  std::atomic<std::int64_t> sessions_{0};
  std::atomic<std::int64_t> connections_{0};
  std::uint64_t max_reply_bytes_ = std::uint64_t{256} << 20;
  std::atomic<std::int64_t> subscriptions_{0};
  std::uint32_t max_subscriptions_ = 256;
  telemetry::Histogram lookup_us_, get_us_, put_us_;
};

}  // namespace kdn::server
