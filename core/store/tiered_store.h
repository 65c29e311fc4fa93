// SPDX-License-Identifier: Apache-2.0
// The chain of tiers: highest (fastest) first. It decides what each tier
// holds: puts go to the highest tier that takes them; a tier that would
// cross its high watermark evicts down to its low watermark (by its policy,
// skipping leased and pinned objects) and the evicted objects are demoted
// to the next tier asynchronously, by a mover thread with a bounded queue
// (backpressure: a full queue makes the evicting writer wait). A get reads
// from the highest tier holding the chunk, hands out a lease (the chunk is
// not evicted while it is held) and promotes the chunk to the top tier in
// the background. A full tier evicts and retries; when nothing can be
// evicted the put moves on to the next tier, and only fails when no tier
// can take it. An optional editor rewrites new chunks in the background,
// before they are demoted to lower tiers.
//
// Codecs: each level may store its chunks encoded (LevelOptions::codec; a
// disk tier typically does, to hold more chunks). The chain encodes a chunk
// for such a level before it puts it there, outside the level's lock: on the
// mover thread for demotions, write-through copies and promotions, and on the
// putting thread only for a Put that lands in that level directly (the
// engine API's saves put from worker threads, so never an engine's own
// thread). The level's capacity then counts the encoded bytes. A chunk
// already in the level's codec (demoted from a level with the same codec)
// is not encoded again; one that fails to encode (e.g. non-finite KV) is
// stored raw, and counted. Every read decodes what it got before anyone
// sees it: leases, promotions and the editor only ever see canonical KV. A
// payload that fails to decode is a miss: counted (decode_failures and
// corrupt_detected of its level) and erased from that level. Raw chunks
// pass through without a copy.
// Thread-safety: every public member may be called from any thread. Leases
// must be released before the store is destroyed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/codec/codec.h"
#include "core/store/policy.h"
#include "core/store/tier.h"
#include "core/util/clock.h"

namespace kdn::store {

// Rewrites a chunk's KV after it was stored (offline KV editing). Called on
// the store's mover thread, one chunk at a time.
class ChunkEditor {
 public:
  virtual ~ChunkEditor() = default;
  // Edits `chunk` in place (its payload bytes); returns true when it changed
  // it, false to leave it as it is, or an error (the chunk is kept unedited).
  virtual Result<bool> Edit(Chunk& chunk) = 0;
};

// now_ns + ttl_ns, saturated at INT64_MAX (a TTL of centuries never wraps
// into the past). ttl_ns must not be negative.
inline std::int64_t DeadlineAfter(std::int64_t now_ns, std::int64_t ttl_ns) {
  std::int64_t deadline = 0;
  return __builtin_add_overflow(now_ns, ttl_ns, &deadline) ? INT64_MAX : deadline;
}

// What a chunk is worth to the cost-aware policy (store/policy.h): the
// value its store gave it, else its own prefill work at its position.
inline double PrefillValue(const ChunkMeta& m) {
  return m.prefill_value > 0 ? m.prefill_value : PrefillCost(m.first_position, m.tokens);
}

// A namespace's quota in one level: the most bytes (as the level counts
// them: Tier::Cost) its chunks may take there. Over it, a put of that
// namespace evicts the namespace's own coldest chunks first (by the level's
// policy), never another's; when the level itself is full, chunks of
// namespaces without a quota (and chunks whose namespace the level has not
// seen: found at start) go first, so a namespace with a quota keeps up to
// it while the quotas add up to no more than the level, and the others
// share what is left.
struct NamespaceQuota {
  keys::Digest ns{};  // keys::NamespaceHash of the namespace
  std::uint64_t bytes = 0;
};

struct LevelOptions {
  std::unique_ptr<Tier> tier;
  std::vector<NamespaceQuota> quotas;  // at most one per namespace; empty: none
  PolicyKind policy = PolicyKind::kLru;
  double high_watermark = 0.95;  // a put that would cross this fraction of capacity evicts first...
  double low_watermark = 0.85;   // ...down to this fraction
  bool write_through = false;    // also copy new objects to the next tier (in the background)
  // How this level stores chunks: null or raw, the canonical KV as it is;
  // any other codec, encoded by it (see the file comment).
  std::shared_ptr<const codec::Codec> codec;
};

struct TieredStoreOptions {
  std::vector<LevelOptions> levels;
  size_t mover_queue_objects = 256;
  std::uint64_t mover_queue_bytes = std::uint64_t{1} << 30;
  const Clock* clock = nullptr;  // default: steady clock
  std::shared_ptr<ChunkEditor> editor;
  // Stores chunks as they are given and returns them as stored: no level
  // encodes or decodes (levels may not have codecs, nor the store an
  // editor). For a node that keeps other runtimes' chunks in their own
  // encoding and serves them so (kdnd): its clients decode.
  bool pass_through = false;
  // Told of each object that leaves the store for good without being asked
  // to (evicted from the last level, or a demotion no lower level took),
  // outside the store's locks. Erase does not call it.
  std::function<void(const keys::Digest&)> on_drop;
  // Told each time a level comes to hold an object (a put, a write-through
  // copy, a demotion or a promotion into it: held true) and each time it
  // stops holding one the store removed (evicted or demoted out, erased,
  // found not to decode: held false), with the level's index. Called under
  // that level's write lock, so the calls for one level come in the order
  // its contents changed: it must be quick (queue and return) and must not
  // call the store. Not told: objects a tier drops on its own (a failed
  // checksum on read, a Redis key that expired) and objects found at start.
  std::function<void(const keys::Digest& key, size_t level, bool held)> on_level;
  // The most objects tied as followers at once (Tie): a tie to an object
  // that leaves the store only behind the chain's back (a node or Redis
  // evicting on its own) is never forgotten, so the ties are bounded; past
  // this, Tie refuses (counted: StoreCounters::ties_refused) and such a
  // follower is evicted by its level's policy alone.
  size_t max_tied_objects = size_t{1} << 20;
};

struct LevelStats {
  std::string name;
  std::uint64_t hits = 0, misses = 0, puts = 0, put_refusals = 0, evictions = 0;
  std::uint64_t demotions_in = 0, promotions_in = 0, bytes_in = 0, bytes_out = 0;
  std::uint64_t objects = 0, used_bytes = 0, capacity_bytes = 0;
  // Objects that failed a check on read and were removed: the tier's own
  // checks (checksums) plus payloads that failed to decode.
  std::uint64_t corrupt_detected = 0;
  // Of those, objects that failed authentication: a seal or encryption at
  // rest (TierCounters::auth_failures).
  std::uint64_t auth_failures = 0;
  // Reads and writes of the tier that failed (TierCounters::io_errors).
  std::uint64_t io_errors = 0;
  // The level's codec, as a spec ("raw", "int8", "kdn:balanced", ...).
  std::string codec = "raw";
  // Chunks encoded for this level, their canonical bytes and their encoded
  // bytes (the compression ratio is before / after), and encodes that
  // failed (those chunks were stored raw).
  std::uint64_t encoded_chunks = 0, bytes_before_encoding = 0, bytes_after_encoding = 0, encode_failures = 0;
  // Chunks read from this level and decoded, and those whose payload failed
  // to decode (misses, removed).
  std::uint64_t decoded_chunks = 0, decode_failures = 0;
  // Time spent encoding for this level and decoding what it returned.
  std::uint64_t encode_ns = 0, decode_ns = 0;
};

// A namespace with a quota in a level, now (TieredStore::Namespaces).
struct NamespaceUse {
  keys::Digest ns{};
  std::uint64_t quota_bytes = 0;
  std::uint64_t used_bytes = 0, objects = 0;  // its chunks the level holds that it counted
  // Its chunks evicted to keep it within its quota (its own puts), and for
  // the level's room (anyone's put, once the level held nothing else to
  // evict); its puts refused because one chunk exceeded its quota.
  std::uint64_t quota_evictions = 0, room_evictions = 0, refused = 0;
};

struct StoreCounters {
  std::uint64_t leases_active = 0, leases_total = 0;
  std::uint64_t pins_active = 0, pins_forced_unpin = 0;
  std::uint64_t mover_queue_depth = 0, mover_backpressure_waits = 0, promotions_dropped = 0;
  std::uint64_t edits = 0, edit_errors = 0;
  std::uint64_t tied_objects = 0, ties_refused = 0;  // followers tied now; Tie calls refused (the bound)
};

class TieredStore;

// A read lease: the chunk's bytes, and a hold that keeps it from eviction.
// Move-only; must not outlive its store.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& o) noexcept { *this = std::move(o); }
  Lease& operator=(Lease&& o) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease() { Release(); }

  const ChunkRef& chunk() const { return chunk_; }
  int level() const { return level_; }  // the tier it was read from
  void Release();

 private:
  friend class TieredStore;
  TieredStore* store_ = nullptr;
  ChunkRef chunk_;
  int level_ = -1;
};

class TieredStore {
 public:
  static Result<std::unique_ptr<TieredStore>> Create(TieredStoreOptions options);
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  size_t levels() const { return levels_.size(); }
  const Tier& tier(size_t level) const { return *levels_[level]->tier; }
  // For what passes the chain by (Tier::Document): never to put, get or
  // erase behind the chain's back.
  Tier& tier(size_t level) { return *levels_[level]->tier; }
  // Presence, without side effects.
  // ctx: the request's (store/tier.h), for tiers that file keys per namespace.
  bool ContainsAt(size_t level, const keys::Digest& key, const ReadContext& ctx = {}) const;
  // The highest level holding the key, or -1.
  int Locate(const keys::Digest& key, const ReadContext& ctx = {}) const;

  // Stores a chunk in the highest tier that takes it.
  Status Put(ChunkRef chunk, const ReadContext& ctx = {});
  // A pass-through store: memory of its top tier to build a chunk of
  // `bytes` in, which a Put keeps without a copy when the top tier takes it
  // (Tier::Reserve). Empty: none (not pass-through, or the tier has none).
  Payload Reserve(std::uint64_t bytes);
  // The chunk from the highest tier holding it, leased; kNotFound on a miss.
  // kCanonical: its canonical KV in host memory (decoded, copied out of a
  // device tier). kStored: as the tier holds it, for a reader on a device
  // (device/device.h): encoded payloads are not decoded (the reader decodes
  // them, and reports the outcome: RecordDecode), and a device tier's raw
  // chunk is its own block in device memory (meta.device). A chunk read so
  // is promoted like any other (decoded on the mover), unless it is in
  // device memory.
  enum class Form { kCanonical, kStored };
  Result<Lease> Get(const keys::Digest& key, Form form = Form::kCanonical, const ReadContext& ctx = {});
  // A decode of a chunk read (Form::kStored) from `level`, done by its
  // reader: counted in the level's telemetry; a payload that does not decode
  // (kCorrupt) is removed from the level, as Get does with the ones it decodes.
  void RecordDecode(size_t level, const keys::Digest& key, const Status& outcome, std::uint64_t ns);
  // Whether a chunk in device memory (meta.device) may be put: the top
  // level's tier takes them, stores them as they are (raw), copies them to
  // no lower level on its own (no write-through) and has no editor to run.
  bool TakesDevicePayloads() const;
  // Removes the chunk from every tier, with its pin and pending moves.
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {});
  // Erase of several chunks, each tier's part in one batch (Tier::EraseMany);
  // whether any tier held any of them.
  bool EraseMany(std::span<const keys::Digest> keys, const ReadContext& ctx = {});
  // Pins a present chunk for ttl_ns (0: until unpinned): no tier evicts it.
  // A second pin keeps the later deadline. A TTL too large for the clock
  // saturates (DeadlineAfter).
  Status Pin(const keys::Digest& key, std::int64_t ttl_ns, const ReadContext& ctx = {});
  // Sets a present chunk's pin to end at deadline_ns on the store's clock (0:
  // until unpinned), replacing any deadline it had: for owners that count
  // pins themselves (knowledge items, one pin per document).
  Status PinUntil(const keys::Digest& key, std::int64_t deadline_ns, const ReadContext& ctx = {});
  bool Unpin(const keys::Digest& key);
  // Ties `follower` to `leaders` (false: refused, TieredStoreOptions::
  // max_tied_objects reached): an object useless without each of them (a
  // recurrent layer's state snapshot without the chunks that end where it
  // was taken: engine/groups.h). When a level evicts a leader, it evicts the
  // follower from that level right after it (demoted with it, or dropped at
  // the last level), unless it is leased or pinned. Tying again adds leaders;
  // a tie ends when either object leaves the store (dropped or erased). In
  // memory only: ties are not kept across a restart, and a tier that evicts
  // on its own (a node, Redis) knows nothing of them.
  bool Tie(const keys::Digest& follower, std::span<const keys::Digest> leaders);
  // Objects tied to something now (leaders and followers), for tests and
  // telemetry: the ties' memory grows with them.
  size_t TiedObjects() const;
  // Waits until the mover has nothing queued or in flight, then until each
  // tier has written what it accepted (Tier::Flush).
  void Flush();

  std::vector<LevelStats> Stats() const;
  StoreCounters Counters() const;
  // The namespaces with a quota in `level` (LevelOptions::quotas), in the
  // order given. Chunks a tier held at start count toward none until
  // stored again (a disk tier does not read its files' headers at start).
  std::vector<NamespaceUse> Namespaces(size_t level) const;
  const Clock& clock() const { return *clock_; }

 private:
  struct Level {
    std::unique_ptr<Tier> tier;
    std::shared_ptr<const codec::Codec> codec;  // null: raw
    std::unique_ptr<EvictionPolicy> policy;  // guarded by policy_mu
    double high = 0.95, low = 0.85;
    bool write_through = false;
    // Two locks, so that readers never wait on a tier's I/O: write_mu
    // serializes the level's writes (a put with the evictions that make room
    // for it, erasures, replacements), held across the tier's writes and
    // fsyncs and its reads of victims; policy_mu guards the policy alone and
    // is held only for policy calls, never across tier I/O. Order: write_mu,
    // then policy_mu.
    std::mutex write_mu;
    mutable std::mutex policy_mu;
    std::atomic<std::uint64_t> hits{0}, misses{0}, puts{0}, put_refusals{0}, evictions{0};
    std::atomic<std::uint64_t> demotions_in{0}, promotions_in{0}, bytes_in{0}, bytes_out{0};
    std::atomic<std::uint64_t> encoded{0}, encode_in{0}, encode_out{0}, encode_failures{0}, encode_ns{0};
    std::atomic<std::uint64_t> decoded{0}, decode_failures{0}, decode_ns{0};
    codec::CodecId codec_id() const { return codec ? codec->id() : codec::CodecId::kRaw; }
    // Quotas (LevelOptions::quotas; empty: none): each quota'd namespace's
    // use, and the namespace and cost of each chunk of one. The maps' keys
    // are fixed at Create; the values are guarded by policy_mu.
    std::vector<keys::Digest> quota_order;
    std::unordered_map<keys::Digest, NamespaceUse, keys::DigestHash> quotas;
    struct Owner {
      NamespaceUse* use;
      std::uint64_t cost;
    };
    std::unordered_map<keys::Digest, Owner, keys::DigestHash> owners;
    // policy_mu held: the quota'd namespace of `ns`, or null.
    NamespaceUse* QuotaOf(const keys::Digest& ns) {
      auto it = quotas.find(ns);
      return it == quotas.end() ? nullptr : &it->second;
    }
    // policy_mu held: counts a chunk the level now holds / no longer holds
    // (the policy's OnInsert / OnRemove); `evicted` counts the removal as
    // an eviction of its namespace (for its quota, or for the level's room).
    void Count(const keys::Digest& key, const keys::Digest& ns, std::uint64_t cost);
    enum class Why { kGone, kQuota, kRoom };
    void Uncount(const keys::Digest& key, Why why);
  };
  enum class JobKind { kDemote, kPromote, kCopy, kEdit };
  // A use of a held chunk, told to the level's policy (under policy_mu).
  static void Touch(Level& L, const keys::Digest& key, const ReadContext& ctx);
  struct Job {
    JobKind kind;
    ChunkRef chunk;
    size_t target;
  };

  explicit TieredStore(TieredStoreOptions& options);
  // Puts into one level, evicting first; victims are demoted inline when
  // called from the mover (it must not wait on its own queue).
  Status PutAt(size_t level, const ChunkRef& chunk, bool from_mover, JobKind why, const ReadContext& ctx);
  // Evicts from a level (its mu held) until `cost` more bytes fit under the
  // watermark (or, `hard`, under the capacity); returns chunks to demote.
  // (`dropped`: the keys of victims that leave the store, the last level's.)
  // With `ns` (a namespace with a quota in the level): evicts that
  // namespace's own chunks until `cost` more of its bytes fit its quota.
  std::vector<ChunkRef> MakeRoom(size_t level, std::uint64_t cost, bool hard, std::vector<keys::Digest>& dropped,
                                 const ReadContext& ctx, const keys::Digest* ns = nullptr);
  bool Evictable(const keys::Digest& key);
  void Demote(size_t from_level, std::vector<ChunkRef> victims, bool from_mover);
  // Puts a victim of `from_level` (in that level's stored form) into the
  // next level; on the mover. Ends its transit.
  void DemoteNow(size_t from_level, const ChunkRef& victim);
  // The form level `level` stores `chunk` in: the chunk itself when it is in
  // the level's codec already (raw included), otherwise encoded by it (a
  // chunk in another codec is decoded first). Counts in the level's
  // telemetry; an encode failure yields the canonical chunk.
  Result<ChunkRef> StoredForm(size_t level, const ChunkRef& chunk);
  // The canonical KV of a chunk read from `level` (itself when raw), the
  // decode counted at that level; kCorrupt when its payload does not decode.
  Result<ChunkRef> Canonical(size_t level, const ChunkRef& stored);
  bool Enqueue(Job job, bool wait);
  void MoverLoop();
  void RunJob(Job& job);
  // The edited chunk (editing it now if it is pending), or chunk unchanged.
  ChunkRef ApplyEdit(const ChunkRef& chunk);
  ChunkRef RunEditor(const ChunkRef& chunk);
  // Puts `edited` in place of the chunk in every level holding it, in each
  // level's stored form: forms[level] when given (encoded beforehand,
  // outside the locks), else made here.
  bool ReplaceEverywhere(const ChunkRef& edited, const std::vector<ChunkRef>& forms);
  void ReleaseLease(const keys::Digest& key);
  // Ties (Tie): the followers of `leader`, and forgetting an object's ties
  // once it has left the store.
  std::vector<keys::Digest> Followers(const keys::Digest& leader) const;
  void Untie(const keys::Digest& key);
  // Untie for each of `keys` tied to something that no level holds now.
  void UntieGone(std::span<const keys::Digest> keys, const ReadContext& ctx);

  const Clock* clock_;
  std::shared_ptr<ChunkEditor> editor_;
  bool pass_through_ = false;
  std::function<void(const keys::Digest&)> on_drop_;
  std::function<void(const keys::Digest&, size_t, bool)> on_level_;
  std::vector<std::unique_ptr<Level>> levels_;

  mutable std::mutex lease_mu_;
  std::unordered_map<keys::Digest, std::uint32_t, keys::DigestHash> leases_;  // guarded by lease_mu_
  std::atomic<std::uint64_t> leases_total_{0};

  mutable std::mutex pin_mu_;
  std::unordered_map<keys::Digest, std::int64_t, keys::DigestHash> pins_;  // deadline ns (0 = none); guarded by pin_mu_
  std::atomic<std::uint64_t> forced_unpins_{0};

  // Chunks evicted from a tier and not yet put into the next one: still
  // readable there, so a load never misses a chunk that is only moving.
  mutable std::mutex transit_mu_;  // a leaf lock: nothing is locked while holding it
  std::unordered_map<keys::Digest, std::pair<ChunkRef, size_t>, keys::DigestHash> in_transit_;  // guarded
  ChunkRef InTransit(const keys::Digest& key, size_t* target) const;
  void EndTransit(const ChunkRef& chunk);

  // Ties (Tie): leader -> followers, follower -> leaders.
  const size_t max_tied_;
  std::atomic<std::uint64_t> ties_refused_{0};
  mutable std::mutex tie_mu_;  // a leaf lock
  std::unordered_map<keys::Digest, std::vector<keys::Digest>, keys::DigestHash> followers_;  // guarded by tie_mu_
  std::unordered_map<keys::Digest, std::vector<keys::Digest>, keys::DigestHash> leaders_;    // guarded by tie_mu_

  // The mover.
  const size_t queue_objects_;
  const std::uint64_t queue_bytes_;
  mutable std::mutex queue_mu_;
  std::condition_variable queue_cv_;   // work arrived / stop
  std::condition_variable space_cv_;   // room in the queue / job done
  std::deque<Job> queue_;                                            // guarded by queue_mu_
  std::uint64_t queued_bytes_ = 0;                                   // guarded by queue_mu_
  bool in_flight_ = false;                                           // guarded by queue_mu_
  keys::Digest in_flight_key_{};                                     // guarded by queue_mu_
  bool stop_ = false;                                                // guarded by queue_mu_
  // Chunks waiting for the editor: null until edited; an edited chunk waits
  // here when no tier held it at edit time (a demotion of it is queued).
  std::unordered_map<keys::Digest, ChunkRef, keys::DigestHash> pending_edits_;  // guarded by queue_mu_
  std::atomic<std::uint64_t> backpressure_waits_{0}, promotions_dropped_{0}, edits_{0}, edit_errors_{0};
  std::thread mover_;

  friend class Lease;
};

}  // namespace kdn::store
