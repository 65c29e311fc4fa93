// SPDX-License-Identifier: Apache-2.0
// Bandwidth-adaptive delivery (CacheGen's streaming adaptation) for the
// remote tiers: a LeveledTier wraps a remote or redis tier and keeps every
// chunk at several quality levels side by side, and a load with a TTFT
// target fetches each chunk at the finest level that still meets it, given
// the link rate it measures as the chunks arrive, or leaves the chunk to be
// recomputed when even the coarsest level would miss it.
//
// Levels: codec specs, finest first (say "zstd", "kdn:hifi", "kdn:balanced",
// "tc:balanced,profile=F"). Put encodes the canonical chunk once per level
// and puts level 0 under the chunk's key and level i under LevelKey(key, i)
// (the node sees ordinary chunks of the namespace). Get decodes what it
// fetched, so the chain sees a raw tier (its codec for this tier is raw).
// Contains asks for level 0: the levels are put together.
//
// Adaptation: a load that has a target passes it down in its ReadContext
// (KvStore::FetchPrefix). Prefetch(keys, will_read, ctx) then starts a
// stream: `window` workers take the chunks in order and decide each one's
// level when they take it (ChooseLevel, below) from the time left, the
// tokens left, the link rate and each level's bytes and decode time per
// token as measured so far; a chunk to recompute is not fetched and its Get
// is a miss, which the load reports as a failed range (the engine prefills
// those tokens: kdn_op_get_failed_ranges). A Get of a chunk no stream holds
// fetches level 0. A chunk fetched at a coarser level than 0 is marked
// meta.degraded and is not promoted to the tiers above.
//
// The link: LinkMeter estimates the rate from the last fetches' bytes over
// the time the link was busy with them (each from its request, or from the
// previous arrival when requests overlapped). Before the first fetch the
// rate is unknown and the first chunk goes at the coarsest level.
// Thread-safety: every member may be called concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/codec/codec.h"
#include "core/store/tier.h"

namespace kdn::store {

// The key level `level` of a chunk is kept under (level 0: the key itself).
keys::Digest LevelKey(const keys::Digest& key, size_t level);

// The link's rate, from fetches as they complete.
class LinkMeter {
 public:
  // A fetch of `bytes` requested at sent_ns whose reply arrived at arrived_ns.
  void Observe(std::uint64_t bytes, std::int64_t sent_ns, std::int64_t arrived_ns);
  // Bytes per second over the last kWindow fetches: their bytes over the
  // time the link was busy with them (weighted by time, so a burst after an
  // idle moment, many bytes in no time, does not flatter it, and a link that
  // just slowed weighs at once); 0 before the first observation.
  double rate() const;
  static constexpr size_t kWindow = 8;
  std::uint64_t samples() const;

 private:
  mutable std::mutex mu_;
  std::deque<std::pair<double, double>> window_;  // (bytes, busy seconds), newest last
  double bytes_ = 0, busy_s_ = 0;                  // their sums
  std::int64_t last_arrival_ = 0;
  std::uint64_t samples_ = 0;
};

// The decision for one chunk.
struct LevelChoiceInput {
  double time_left_s = 0;        // until the deadline (may be negative)
  double tokens_left = 0;        // this chunk's and the ones after it in the stream
  double chunk_tokens = 0;       // this chunk's
  double rate = 0;               // link bytes per second (0: unknown)
  std::vector<double> bytes_per_token;   // per level, finest first
  std::vector<double> decode_s_per_token;  // per level
  double recompute_s_per_token = 0;      // 0: unknown
  double recompute_s_pending = 0;        // recompute already chosen for earlier chunks
  double inflight_bytes = 0;             // chunks requested and not arrived yet (as estimated)
};
// A chunk recomputed alone, late in its context and after the fetches,
// costs more than the mean per-token prefill of whole prompts (what the
// engine reports): it is priced at this many times that mean.
inline constexpr double kRecomputeCostFactor = 2.0;

// The finest level whose delivery of every token left, at this rate, ends
// within 80% of the time left (the recomputes already chosen and the bytes
// still in flight counted in; the rest a margin for what the rate does not
// show: round trips, the last chunk's decode); if none:
// -1 (recompute this chunk) when recomputing it (priced with
// kRecomputeCostFactor) is faster than fetching it
// at the coarsest level or either time is unknown, else the coarsest level.
// Unknown rate: the coarsest level (a probe).
int ChooseLevel(const LevelChoiceInput& in);

struct LeveledCounters {
  std::vector<std::uint64_t> fetched;  // chunks fetched per level (streams and plain gets)
  std::uint64_t recomputes = 0;        // chunks left to recompute
  std::uint64_t streams = 0;           // loads with a target
  double rate = 0;                     // the link's estimate now, bytes per second
};

class LeveledTier : public Tier {
 public:
  // `levels`: codec specs, finest first, at least one. `window`: fetches in
  // flight per stream.
  static Result<std::unique_ptr<LeveledTier>> Create(std::unique_ptr<Tier> inner, const std::vector<std::string>& levels,
                                                     int window = 2);
  ~LeveledTier() override;

  const std::string& name() const override { return inner_->name(); }
  std::uint64_t Cost(const Chunk& chunk) const override { return inner_->Cost(chunk); }
  Status Put(const ChunkRef& chunk) override;
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override;
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override { return inner_->Contains(key, ctx); }
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override;
  size_t EraseMany(std::span<const keys::Digest> keys, const ReadContext& ctx = {}) override;
  std::vector<ObjectInfo> List() const override { return inner_->List(); }
  std::uint64_t capacity_bytes() const override { return inner_->capacity_bytes(); }
  std::uint64_t used_bytes() const override { return inner_->used_bytes(); }
  std::uint64_t objects() const override { return inner_->objects(); }
  TierCounters counters() const override { return inner_->counters(); }
  TransportCounters transport_counters() const override { return inner_->transport_counters(); }
  void Flush() override { inner_->Flush(); }
  void Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& ctx = {}) const override;
  void Document(DocumentOp op, const DocumentRecord& doc, std::uint64_t ttl_ms) override {
    inner_->Document(op, doc, ttl_ms);
  }

  size_t levels() const { return codecs_.size(); }
  const std::vector<std::string>& level_specs() const { return specs_; }
  Tier& inner() { return *inner_; }
  LeveledCounters Counters() const;
  LinkMeter& link() { return link_; }
  // Chunks streams hold for Gets not made yet (bounded: the last streams'
  // keys; what a load left untaken goes 2 s after its deadline, at the next
  // stream).
  size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }

 private:
  struct Entry;
  struct Stream;
  LeveledTier(std::unique_ptr<Tier> inner, std::vector<std::shared_ptr<const codec::Codec>> codecs,
              std::vector<std::string> specs, int window);
  // Fetches and decodes level `level` of `key`; records the link and the level's costs.
  Result<ChunkRef> Fetch(const keys::Digest& key, size_t level, const ReadContext& ctx) const;
  void Work() const;  // a worker: takes the next chunk of the oldest stream with chunks left
  void Learn(size_t level, double bytes_per_token, double decode_s_per_token) const;
  // mu_ held: each level's bytes per token, estimated where not seen yet.
  std::vector<double> BytesPerTokenLocked() const;

  std::unique_ptr<Tier> inner_;
  std::vector<std::shared_ptr<const codec::Codec>> codecs_;
  std::vector<std::string> specs_;
  int window_;
  mutable LinkMeter link_;
  mutable std::mutex mu_;
  mutable std::vector<double> bytes_per_token_;    // guarded by mu_ (0: not seen)
  mutable std::vector<double> decode_s_per_token_;  // guarded by mu_
  mutable std::condition_variable cv_;  // a stream queued, or a chunk decided or fetched
  mutable std::unordered_map<keys::Digest, std::shared_ptr<Entry>, keys::DigestHash> pending_;  // guarded by mu_
  mutable std::vector<std::shared_ptr<Stream>> streams_;  // with chunks not taken yet; guarded by mu_
  std::vector<std::thread> workers_;  // `window` of them, joined at destruction
  mutable std::unique_ptr<std::atomic<std::uint64_t>[]> fetched_;
  mutable std::atomic<std::uint64_t> recomputes_{0}, stream_count_{0};
  bool stop_ = false;  // guarded by mu_
};

}  // namespace kdn::store
