// SPDX-License-Identifier: Apache-2.0
// What the tiers of a store exchange, and the interface every tier
// implements. A tier only stores: it never evicts on its own; the chain
// (store/tiered_store.h) decides what to evict, where to demote and what to
// promote, and enforces capacity before it puts. A tier stores a chunk's
// payload as it is given, raw or encoded (ChunkMeta::codec): the chain
// encodes for the tiers that have a codec, and decodes what it reads back.
// Thread-safety: every Tier implementation must allow concurrent calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/chunk/chunk.h"
#include "core/codec/codec.h"
#include "core/keys/hash.h"
#include "core/util/status.h"

namespace kdn::store {

// The chunk types live below the store (chunk/chunk.h); the store's
// code names them as its own.
using chunk::Bytes;
using chunk::Chunk;
using chunk::ChunkMeta;
using chunk::ChunkRef;
using chunk::Payload;

// An object a tier holds, as listed at open (a disk tier after a restart).
struct ObjectInfo {
  keys::Digest key{};
  std::uint64_t bytes = 0;     // what it costs in this tier's capacity
  std::int64_t last_use_ns = 0;  // for ordering recency after a restart (0 = unknown)
};

// Counters a tier keeps about its own storage (the chain keeps hits/misses).
struct TierCounters {
  std::uint64_t corrupt_detected = 0;  // objects that failed a check on read (and were removed)
  std::uint64_t io_errors = 0;
  // Of those, objects that failed authentication: a seal (wire/seal.h:
  // none, another secret's, or a MAC that does not match: a tier with a
  // secret), or encryption at rest (wire/cipher.h: a key the tier does not
  // hold, or a GCM tag that does not match).
  std::uint64_t auth_failures = 0;
};

// Counters of a tier that reaches its objects over a network (a node, a
// Redis server): every call or command sent, those that failed, those that
// ran past their deadline, and (a tier that queues writes) the writes
// refused by a full queue and the bytes queued now. Zero for other tiers.
struct TransportCounters {
  std::uint64_t calls = 0, failed_calls = 0, timeouts = 0;
  std::uint64_t queue_full = 0, queued_bytes = 0;
};

// A knowledge item (knowledge/knowledge.h) as a tier that keeps a registry of
// them (a node: wire/node.capnp's knowledge methods) is told of it.
struct DocumentRecord {
  keys::Digest ns_hash{};            // its namespace's hash
  keys::Digest model{};              // the model fingerprint its KV is of
  std::string doc_id;
  std::uint64_t version = 0;
  std::string metadata;
  std::uint64_t tokens = 0;
  std::vector<keys::Digest> keys;    // its chunks' stored keys, in order (kPut only)
};
enum class DocumentOp { kPut, kPin, kUnpin, kDelete };

// What a load with a target tells the tiers (a tier with quality levels,
// tiers/leveled_tier.h).
struct DeliveryTarget {
  std::int64_t deadline_ns = 0;              // steady clock; 0: no target
  double recompute_ns_per_token = 0;         // the model's mean prefill (0: unknown)
  std::uint32_t chunk_tokens = 0;            // tokens per chunk of the request
};

// What a call carries down the chain to its tiers, as an argument (never in
// a thread-local): the namespace (its hash) of the request it serves, for
// tiers that file keys per namespace (a remote node: without one, a read is
// a miss and an erase reaches nothing there), and the request's delivery
// target, and when the call began: a tier that waits on another process
// (a remote node) counts its timeout from there, so that one call waits at
// most one timeout for answers however many round trips it makes. The
// chain's own moves (demotions, promotions, write-through copies on its
// mover) carry none of these.
struct ReadContext {
  std::optional<keys::Digest> ns;
  DeliveryTarget target;
  std::int64_t started_ms = 0;  // steady clock, milliseconds; 0: each round trip its own timeout
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual const std::string& name() const = 0;
  // What an object costs in this tier's capacity (payload as stored, encoded
  // or not, plus any header).
  virtual std::uint64_t Cost(const Chunk& chunk) const = 0;
  // Stores a chunk, all or nothing: no reader ever sees a partial object.
  // Putting a present key is a no-op returning Ok. Fails with kBusy
  // when it does not fit the remaining capacity (the caller evicts and
  // retries), other codes on I/O errors.
  virtual Status Put(const ChunkRef& chunk) = 0;
  // The chunk, or kNotFound. A corrupt object is reported as kNotFound too,
  // after being counted and removed.
  virtual Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) = 0;
  virtual bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const = 0;
  // The chunk as this tier holds it, for a reader on the device (store/
  // device.h): a device tier's own block, in device memory (meta.device),
  // without a copy. Every other tier: Get.
  virtual Result<ChunkRef> GetResident(const keys::Digest& key, const ReadContext& ctx = {}) { return Get(key, ctx); }
  // Whether Put takes chunks whose payload is in device memory (meta.device).
  virtual bool TakesDevicePayloads() const { return false; }
  // Memory in which this tier would keep a chunk of `bytes` (its pool), for
  // a writer that builds the chunk there: Put then keeps a chunk whose
  // envelope (Chunk::envelope) is such a block as it is, without a copy.
  // The block is the writer's alone until then; dropped unused, it goes
  // back. Empty: the tier has no such memory (the default), or none now.
  virtual Payload Reserve(std::uint64_t bytes) {
    (void)bytes;
    return {};
  }
  // Removes an object; false when absent.
  virtual bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) = 0;
  // Removes several objects (a knowledge item's chunks) together; how many
  // were there. A tier that can batch them (one round trip) does.
  virtual size_t EraseMany(std::span<const keys::Digest> keys, const ReadContext& ctx = {}) {
    size_t n = 0;
    for (const keys::Digest& k : keys) n += Erase(k, ctx) ? 1 : 0;
    return n;
  }
  // Every object held (at open, or now).
  virtual std::vector<ObjectInfo> List() const = 0;
  virtual std::uint64_t capacity_bytes() const = 0;
  virtual std::uint64_t used_bytes() const = 0;
  virtual std::uint64_t objects() const = 0;
  virtual TierCounters counters() const = 0;
  // A networked tier's transport counters (a tier that wraps another: the
  // inner one's); zero for local tiers.
  virtual TransportCounters transport_counters() const { return {}; }
  // Waits until writes the tier accepted are where readers elsewhere see
  // them (a write-back queue drained). Most tiers write through: no-op.
  virtual void Flush() {}
  // A hint: these chained keys of one request are about to be probed, in
  // order. A tier whose probes are costly (a remote one) answers them with
  // one batched call and serves the probes from that. With `will_read`, the
  // held ones are also about to be read (Get), in order: such a tier starts
  // every read at once and serves each Get as its chunk arrives (the reads
  // stream: chunk i is decoded while chunk i+1 is on the wire).
  virtual void Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& ctx = {}) const {
    (void)keys;
    (void)will_read;
    (void)ctx;
  }
  // A knowledge item was put (replacing any of its doc_id), pinned for
  // ttl_ms (0: until unpinned), unpinned or deleted. A tier that keeps a
  // registry of documents records it, after the chunks put before this call
  // (best effort: never an error to the caller). Most tiers: nothing.
  virtual void Document(DocumentOp op, const DocumentRecord& doc, std::uint64_t ttl_ms) {
    (void)op;
    (void)doc;
    (void)ttl_ms;
  }
  // An engine request the store served, as it concerned this tier: a
  // lookup's tokens and the leading tokens this tier held, or a load's
  // tokens and those this tier delivered (ctx.ns: its namespace). A tier
  // that keeps statistics of its own (a kdnd) counts hit rates per engine
  // request from these, not per probe. Best effort, never an error; most
  // tiers: nothing.
  struct RequestOutcome {
    bool load = false;
    std::uint64_t tokens = 0, hit_tokens = 0;
    keys::Digest model{};  // the model's fingerprint (all zero: not said)
  };
  virtual void Report(const RequestOutcome& outcome, const ReadContext& ctx) {
    (void)outcome;
    (void)ctx;
  }
};

}  // namespace kdn::store
