// The node service: what kdnd does with each call, apart from the transport.
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
// NodeRpc (below) is the Cap'n Proto face of it (wire/node.capnp).
// Thread-safety: NodeService's members may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include <capnp/capability.h>
#include <kj/timer.h>

#include "keys/hash.h"
#include "server/config.h"
#include "server/node_stats.h"
#include "store/tiered_store.h"
#include "telemetry/histogram.h"
#include "wire/node.capnp.h"

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

  void CountAuthFailure() { ++auth_failures_; }
  void SessionOpened() { ++sessions_; }
  void SessionClosed() { --sessions_; }
  // While draining, data calls get `unavailable`.
  void SetDraining() { draining_ = true; }
  bool draining() const { return draining_; }
  std::uint64_t uptime_ms() const;
  // Where stored and removed chunks are announced (may be null).
  void SetEventPublisher(KvEventPublisher* publisher) { events_ = publisher; }
  store::TieredStore& chain() { return *chain_; }

  // The object a key of a namespace is filed under.
  static keys::Digest ObjectKey(const keys::Digest& ns, const keys::Digest& key);

 private:
  NodeService() = default;
  std::unique_ptr<store::TieredStore> chain_;
  std::vector<store::TierSpec> specs_;
  std::vector<std::pair<std::string, Grant>> grants_;  // (token, grant)
  double prefill_us_per_token_ = 0;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::atomic<bool> draining_{false};
  std::atomic<KvEventPublisher*> events_{nullptr};
  // The client's key of each object the node filed since it started, for
  // KV events about evictions (objects a restart found on disk are not in
  // it: their evictions are not announced).
  void Dropped(const keys::Digest& object);
  std::mutex client_keys_mu_;
  std::unordered_map<keys::Digest, keys::Digest, keys::DigestHash> client_keys_;
  std::atomic<std::uint64_t> lookups_{0}, requested_tokens_{0}, hit_tokens_{0}, lookup_hit_tokens_{0};
  std::atomic<std::uint64_t> get_chunks_{0}, get_misses_{0}, get_bytes_{0};
  std::atomic<std::uint64_t> put_chunks_{0}, put_bytes_{0}, put_refused_{0}, deletes_{0};
  std::atomic<std::uint64_t> auth_failures_{0};
  std::atomic<std::int64_t> sessions_{0};
  telemetry::Histogram lookup_us_, get_us_, put_us_;
};

// Fills a capnp Stats from a snapshot.
void ToWire(const NodeStats& s, wire::node::Stats::Builder out);
NodeStats FromWire(wire::node::Stats::Reader in);

// The bootstrap capability of a connection (KdnNode). `timer` paces the
// statistics pushes; both must outlive every connection.
capnp::Capability::Client MakeNodeBootstrap(NodeService& service, kj::Timer& timer, const std::string& version);
// A session for a grant, as login makes it (tests and the fuzz target call
// its methods as local capabilities, through the same handlers).
wire::node::Session::Client MakeSession(NodeService& service, kj::Timer& timer, const Grant& grant);

}  // namespace kdn::server
