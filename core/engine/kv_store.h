// SPDX-License-Identifier: Apache-2.0
// The KV store of a runtime: splits a request's tokens into chunks, keys
// them (chained prefix keys over token ids, or over the engine's own block
// hashes), keeps them in a chain of tiers (store/tiered_store.h), and moves
// KV between engines' views (kernels/common/kv_view.h) and canonical chunks.
//
// The tokens after the last whole chunk are stored too, as pieces of
// decreasing powers of two (of tokens, or of the engine's blocks): 200
// tokens past a chunk boundary are pieces of 128, 64 and 8, each keyed like
// a chunk (chained on the one before). A later request finds them by trying
// each power once, largest first: a request that shares any piece boundary
// with a stored one reuses that prefix, and a lookup costs at most log2 of
// chunk_tokens probes and one chunk's worth of hashing, however many
// requests were stored. No index lives in memory: what the tiers hold is
// what a lookup finds, before and after a restart, and pieces are evicted
// like any chunk.
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/common/kv_copy.h"
#include "kernels/common/kv_view.h"
#include "core/keys/hash.h"
#include "core/device/device.h"
#include "core/store/policy.h"
#include "core/store/tiered_store.h"
#include "core/tiers/tier_spec.h"
#include "core/telemetry/histogram.h"
#include "core/util/status.h"
#include "core/util/thread_pool.h"

namespace kdn::store {

// A registered model as the store sees it.
struct ModelKv {
  keys::Digest fingerprint{};
  kernels::KvShape shape;
  std::uint32_t dtype = 0;  // kdn_dtype
  std::int64_t bytes_per_token() const { return shape.layers * 2 * shape.heads * shape.head_dim * shape.elem_bytes; }
};

// One KV group of an engine's views: which model layers it holds, and where
// (view layer j holds model layer layers[j]).
struct KvGroup {
  std::vector<std::uint32_t> layers;
  kernels::KvView view;
  // Device views: the engine's CUDA stream (a cudaStream_t) or null. kdn's
  // work on the view waits for what the stream held when the call was made,
  // and the stream then waits for kdn's writes (Device::MarkStream). Every
  // group of a call names the same one.
  void* engine_stream = nullptr;
};

// What identifies a request's tokens: their ids, or the engine's own chained
// block hashes (hash_bytes each, one per block of block_tokens tokens).
struct TokenKeys {
  std::span<const std::int32_t> tokens;
  std::span<const std::uint8_t> hashes;
  std::uint32_t hash_bytes = 0;
  std::uint32_t block_tokens = 0;
  // The request's salt (kdn_request.salt; empty: none): it starts the chain
  // (keys::ChainStart), so it enters every chunk key.
  std::span<const std::uint8_t> salt = {};
  bool by_hash() const { return hash_bytes != 0; }
  std::uint64_t size() const {
    return by_hash() ? hashes.size() / hash_bytes * std::uint64_t{block_tokens} : tokens.size();
  }
};

struct StoreOptions {
  std::uint32_t chunk_tokens = 256;
  std::uint64_t hash_seed = 0;
  std::vector<TierSpec> tiers;  // highest first; empty: one host tier of host_capacity_bytes
  std::uint64_t host_capacity_bytes = std::uint64_t{1} << 30;
  size_t mover_queue_objects = 256;
  std::uint64_t mover_queue_bytes = std::uint64_t{1} << 30;
  const Clock* clock = nullptr;
  std::shared_ptr<ChunkEditor> editor;
  // Threads that read and decode the chunks of one retrieve or load at once,
  // the caller among them, when two or more of its chunks come from a disk
  // tier or a tier with a codec (reading one while decoding another, and
  // decoding on several cores): 0 = the machine's cores, at most 4; 1 = one
  // chunk after another. One call at a time uses them; calls meanwhile read
  // their chunks one after another.
  std::uint32_t fetch_threads = 0;
  // Where engines' device views live (device/device.h): the CUDA device, or
  // the emulated one. Null: no device; device views are refused, and a
  // device tier is the GPU's when one is usable, else emulated.
  std::shared_ptr<Device> device;
  // Device memory for the kdn chunks of a load that are decoded in batches
  // and then scattered (views not laid out as the chunks): a load's batches
  // hold at most this much decoded KV (at least one chunk).
  std::uint64_t device_staging_bytes = std::uint64_t{256} << 20;
  // Never slower than prefill: once the engine has reported its prefill
  // time (ReportPrefill), a load leaves to recompute the chunks whose
  // delivery, at the rate measured for their tier (DeliveryRate), would
  // take longer than prefilling them (policy.h CheapestPrefix). Tiers that
  // hold raw KV in memory, and tiers with quality levels (which choose by
  // the load's target themselves), are always loaded. False: every cached
  // chunk is loaded.
  bool recompute_when_faster = true;
  // A deployment secret's file (wire/seal.h): with one, every chunk a redis
  // or disk tier stores is sealed and only chunks sealed with it are read
  // back (others: misses, counted in TierCounters::auth_failures, deleted).
  // Empty: none; such tiers serve whatever their server holds, and
  // KvStore::Create says so once in the log. A file that cannot be read, is
  // open to others or holds fewer than 32 bytes fails Create.
  std::string secret_file;
  // Master keys for encryption at rest (wire/cipher.h): a file (mode 600,
  // one key per line, 64 hex digits, the first encrypts) or the name of an
  // environment variable holding the same text; at most one of the two.
  // With them, every chunk a disk, redis or remote tier sends out of the
  // process is encrypted (AES-256-GCM, a key per namespace by HKDF-SHA256)
  // and decrypted when read back; one that does not open is a miss,
  // counted in TierCounters::auth_failures. Empty: none (an encrypted chunk
  // read back is such a miss). A key source that cannot be read or holds no
  // key fails Create.
  std::string encryption_key_file;
  std::string encryption_key_env;
};

struct LookupResult {
  std::uint64_t tokens = 0;                 // leading tokens cached in some tier
  std::vector<std::uint64_t> tier_tokens;   // per tier: leading tokens held by that tier alone
};

// A range of a request's tokens whose KV could not be loaded.
struct TokenRange {
  std::uint64_t begin = 0, end = 0;
};

// The chunks of a request's cached prefix, fetched and leased.
struct FetchedChunk {
  Lease lease;
  std::uint64_t begin = 0, tokens = 0;
  // The read and decode time spent on it, as wall time (work shared by n
  // threads counts 1/n): what its tier's delivery rate is measured by.
  std::uint64_t work_ns = 0;
};
struct Fetch {
  std::vector<FetchedChunk> chunks;
  std::uint64_t covered = 0;          // tokens the cached prefix covers (lookup)
  std::vector<TokenRange> failed;     // chunks of it that could not be read
  std::uint64_t edited_chunks = 0;    // chunks an editor rewrote
  std::uint64_t lossy_chunks = 0;     // chunks decoded from a lossy codec
  // Chunks of the cached prefix left to recompute because the engine
  // prefills them faster than their tiers deliver them (the last range of
  // `failed`).
  std::uint64_t recompute_chunks = 0, recompute_tokens = 0;
  bool device = false;                                  // fetched for device views
  std::chrono::steady_clock::time_point reads_started;  // after the walk: delivery time starts
  // Tokens loadable as a prefix: up to the first failure.
  std::uint64_t prefix() const { return failed.empty() ? covered : failed.front().begin; }
};

struct Telemetry {
  std::uint64_t lookups = 0, retrieves = 0, stores = 0, hits = 0, misses = 0;
  std::uint64_t tokens_served = 0, tokens_stored = 0, bytes_served = 0, bytes_stored = 0, edited_served = 0;
  std::uint64_t probes = 0;  // keys probed by the walks of lookups, retrieves and loads
  std::uint64_t tokens_requested = 0;  // tokens the loads asked for
  std::uint64_t lookup_tokens = 0, lookup_hit_tokens = 0;  // tokens the lookups covered, and found cached
  // TTFT: the prefills engines reported (ReportPrefill), the prefill time
  // the loads saved (each load's tokens x its model's mean reported prefill
  // time per token then), the tokens served while their model had no
  // report (not priced), and the time spent in loads.
  std::uint64_t prefill_tokens = 0, prefill_ns = 0;
  std::uint64_t ttft_saved_ns = 0, tokens_served_unpriced = 0, delivery_ns = 0;
  // Cached chunks (and their tokens) that loads left to recompute because
  // their tiers deliver slower than the engine prefills
  // (StoreOptions::recompute_when_faster), and the loads that fetched such
  // chunks anyway to measure their tier again.
  std::uint64_t recompute_chunks = 0, recompute_tokens = 0, rate_probes = 0;
  telemetry::HistogramSnapshot lookup_us, load_us, store_us;
};

class KvStore {
 public:
  static Result<std::unique_ptr<KvStore>> Create(const StoreOptions& options);
  const StoreOptions& options() const { return options_; }
  // The deployment secret's sealer (StoreOptions::secret_file; null: none).
  const std::shared_ptr<const wire::ChunkSealer>& sealer() const { return sealer_; }
  // The threads a retrieve or load reads and decodes chunks on (the
  // resolved StoreOptions::fetch_threads).
  int fetch_threads() const { return fetch_pool_ ? fetch_pool_->threads() : 1; }
  TieredStore& chain() { return *chain_; }
  const TieredStore& chain() const { return *chain_; }

  // Checks a request's keys against the store's chunking.
  Status CheckKeys(const TokenKeys& keys) const;
  // Leading tokens cached, per tier and overall; no side effects but counters.
  LookupResult Lookup(const ModelKv& model, std::string_view ns, const TokenKeys& keys);
  // Stores the KV of the request's tokens from `view`; returns the leading
  // tokens cached afterwards (a prefix, when the store cannot hold them all).
  Result<std::uint64_t> Store(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                              const kernels::KvView& view);
  // A store in two steps, for saves that gather layer by layer: the chunks
  // to write (those no tier holds yet), then each one committed with its
  // bytes. Store() is PlanStore + gather + CommitChunk.
  struct PlannedChunk {
    keys::Digest key{};
    std::uint64_t begin = 0, tokens = 0;
    bool present = false;   // already held: nothing to write
    // The prefill work its presence saves (store/policy.h ChunkValue):
    // ChunkMeta::prefill_value.
    double value = 0;
  };
  Result<std::vector<PlannedChunk>> PlanStore(const ModelKv& model, std::string_view ns, const TokenKeys& keys);
  // Puts a planned chunk whose payload holds its canonical KV.
  Status CommitChunk(const ModelKv& model, std::string_view ns, const PlannedChunk& planned, Payload payload);
  // The leading tokens of a plan, up to `committed`, that some tier holds
  // now: what a store reports, since a put can evict an earlier chunk of
  // the same store (one planned as present, least recently used).
  std::uint64_t HeldPrefix(std::string_view ns, std::span<const PlannedChunk> plan, std::uint64_t committed) const;
  // A lookup made outside Lookup (engine/groups.h): `requested` tokens, of
  // which `hit` were found.
  void CountLookup(std::uint64_t requested, std::uint64_t hit, double micros) {
    ++lookups_;
    lookup_tokens_ += requested;
    lookup_hit_tokens_ += hit;
    lookup_us_.Record(micros);
  }
  void CountStore(double micros) {
    ++stores_;
    store_us_.Record(micros);
  }

  // Leases the chunks of the cached prefix: their canonical KV in host
  // memory, or (Form::kStored) as their tiers hold them, for DeliverToDevice.
  // With a target (deadline_ns set), the tiers with quality levels choose
  // each chunk's level by it (tiers/leveled_tier.h).
  Fetch FetchPrefix(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                    TieredStore::Form form = TieredStore::Form::kCanonical, const DeliveryTarget& target = {});
  // Writes layers [layer_begin, layer_end) of fetched chunks into `view`.
  static void Scatter(const Fetch& fetch, const kernels::KvView& view, std::int64_t layer_begin, std::int64_t layer_end);
  // Fetch + scatter of every layer, as a prefix: returns the tokens filled.
  std::uint64_t Retrieve(const ModelKv& model, std::string_view ns, const TokenKeys& keys, const kernels::KvView& view);
  struct Retrieved {
    std::uint64_t tokens = 0;   // the prefix written
    std::uint64_t covered = 0;  // the cached prefix found
    bool lossy = false;         // some of it was decoded from a lossy codec
  };
  Retrieved RetrieveInto(const ModelKv& model, std::string_view ns, const TokenKeys& keys, const kernels::KvView& view,
                         const DeliveryTarget& target = {});
  // The same, writing each chunk of the prefix through `write` (views split
  // into KV groups: kv_views.h), on the caller's thread.
  Retrieved RetrieveWith(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                         const std::function<void(const FetchedChunk&)>& write, const DeliveryTarget& target = {});
  // Records a finished load of `requested` tokens in the statistics; its
  // `tokens` served are priced at the model's prefill time per token.
  void CountLoad(const ModelKv& model, std::string_view ns, const Fetch& fetch, std::uint64_t requested,
                 std::uint64_t tokens, std::uint64_t bytes, double micros);
  // An engine's prefill of `tokens` tokens of `model` that took `ns`
  // nanoseconds (what a load would have saved it). The model's prefill time
  // per token is the mean over its reports: total time / total tokens.
  Status ReportPrefill(const ModelKv& model, std::uint64_t tokens, std::uint64_t ns);
  // That mean in nanoseconds per token; 0 while the model has no report.
  double PrefillNsPerToken(const ModelKv& model) const;
  // How fast a tier delivers, measured on the loads it served: into host
  // views (device = false) or device views. A load's wall time from its
  // first read to its last write is split among its chunks: each chunk's
  // own read and decode time (FetchedChunk::work_ns), and the rest (the
  // copies into the views) by tokens. ns_per_token is a moving average
  // (each load weighs kRateWeight); 0 before the first sample.
  struct DeliveryRate {
    double ns_per_token = 0;
    std::uint64_t samples = 0;           // loads that measured it
    std::uint64_t recompute_chunks = 0;  // its chunks left to recompute as slower than prefill
  };
  static constexpr double kRateWeight = 0.25;
  // A tier found slower than prefill is fetched from anyway once in this
  // many loads that would leave it (its rate measured again: page caches
  // warm up, links speed up).
  static constexpr std::uint64_t kRateProbeEvery = 8;
  DeliveryRate Rate(size_t level, bool device) const;
  // A blend that saved the prefill of `positions` positions (its context
  // x the share of the layer x position work it did not recompute): priced
  // at the model's mean into TTFT saved; nothing while it has no report.
  void CountBlendSaving(const ModelKv& model, double positions);

  Telemetry Stats() const;

  // ---- Device views (device/device.h; kv_store_device.cc) -------------------
  // The store's device, or null.
  Device* device() const { return options_.device.get(); }
  // Writes the chunks of a stored-form fetch into device views (`groups`:
  // every model layer once, views whose elements are device memory), chunk
  // by chunk in order: a device tier's chunk by the scatter kernel straight
  // from its block; an encoded chunk (kdn, cachegen, tc) decoded by the
  // device's kernels into a device staging buffer, then scattered; a raw
  // chunk in host memory copied into staging; other codecs decoded on the
  // CPU first. Two staging buffers alternate. A payload that fails to
  // decode joins fetch.failed (and is removed from its tier); with
  // `as_prefix` nothing after the first failure is written. Returns the
  // tokens written, or a device error (kInternal, kNoMemory).
  // With `layers_done`, layers are written in order, in up to
  // kDeviceLayerSteps steps of consecutive layers, each synchronized and
  // then reported (layers_done(n): layers [0, n) are in place); a chunk that
  // fails in a later step has its earlier layers written (its KV, correct)
  // and is reported failed. Loads with cachegen or tc chunks (decoded whole)
  // take one step. Without it: one step, every layer.
  struct Delivered {
    std::uint64_t tokens = 0;  // written (as_prefix: the prefix)
    bool lossy = false;        // some of it decoded from a lossy codec
  };
  using LayersDone = std::function<void(std::uint32_t layers)>;
  static constexpr std::int64_t kDeviceLayerSteps = 8;
  // The views' engine stream (KvGroup::engine_stream): the device work
  // waits for `after` (a mark taken when the call was made: a load op's
  // Start) or, without one, for what the stream holds now; once every layer
  // is written, the stream waits for kdn's writes.
  Result<Delivered> DeliverToDevice(const ModelKv& model, Fetch& fetch, std::span<const KvGroup> groups,
                                    bool as_prefix, const LayersDone& layers_done = {},
                                    const Device::StreamMark& after = {});
  // Retrieve and Store for device views (the groups of engine/kv_views.h).
  // A store gathers each new chunk on the device; when the top tier takes
  // device memory (a device tier, raw, no write-through, no editor) the
  // chunk goes there device to device, otherwise it is copied to the host
  // and put as usual.
  Result<Retrieved> RetrieveToDevice(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                     std::span<const KvGroup> groups, const DeliveryTarget& target = {});
  Result<std::uint64_t> StoreFromDevice(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                        std::span<const KvGroup> groups);
  // The engine stream of a call's groups (null without one), and the
  // ordering of this thread's device work after it: after `mark` when one
  // was taken, else after what the stream holds now.
  static void* EngineStream(std::span<const KvGroup> groups) {
    return groups.empty() ? nullptr : groups.front().engine_stream;
  }
  Status FollowEngineStream(std::span<const KvGroup> groups, const Device::StreamMark& mark = {});
  // A mark of the groups' engine stream as it is now (null without a
  // device or a stream): what a call takes when made, for its work later.
  Result<Device::StreamMark> MarkEngineStream(std::span<const KvGroup> groups);
  // Writes canonical KV in host memory (tokens [0, tokens) of every layer)
  // into device views: one copy to the device, then the scatter kernel (the
  // blender's composed KV).
  Status ScatterToDevice(const ModelKv& model, const std::uint8_t* canonical, std::uint64_t tokens,
                         std::span<const KvGroup> groups);
  // The same from canonical KV already in device memory (a blend composed
  // on the device): the scatter kernel alone.
  Status ScatterOnDevice(const ModelKv& model, const void* canonical, std::uint64_t tokens,
                         std::span<const KvGroup> groups);

  // Tells the tiers that keep a registry of knowledge items (remote nodes)
  // of a change to one (see Tier::Document).
  void AnnounceDocument(DocumentOp op, const DocumentRecord& doc, std::uint64_t ttl_ms = 0);
  // Position-free content key of one chunk of tokens (knowledge items).
  keys::Digest ContentKey(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens) const;
  // Puts one chunk gathered from `view` under `key` (knowledge items).
  Status PutChunk(const ModelKv& model, std::string_view ns, const keys::Digest& key, const kernels::KvView& view,
                  std::uint64_t begin, std::uint64_t tokens, std::int64_t first_position, const ReadContext& ctx = {});
  // Puts a chunk of canonical bytes under `key` (on_device: the payload is
  // device memory, which only a top tier that takes it does:
  // TieredStore::TakesDevicePayloads; kUnsupported otherwise).
  // exact: the chunk must come back bit for bit (ChunkMeta::exact: no
  // lossy codec stores it).
  Status PutPayload(const ModelKv& model, std::string_view ns, const keys::Digest& key, std::uint64_t tokens,
                    std::int64_t first_position, Payload payload, bool on_device = false, double value = 0,
                    const ReadContext& ctx = {}, bool exact = false);

  // ---- Chunks by key (models kept in several groups: engine/groups.h) -------
  struct KeyedRange {
    keys::Digest key{};
    std::uint64_t begin = 0, len = 0;
  };
  // The keys of a request's chunks, keyed by `model`'s fingerprint: its
  // whole chunks, held or not (`held` says), except that where a whole
  // chunk is not held but pieces are (a shorter request stored them), the
  // pieces end the chain, as they end a walk; and the pieces after the last
  // whole chunk that are held. A store's cut: `held` always true.
  std::vector<KeyedRange> ChainKeys(
      const ModelKv& model, std::string_view ns, const TokenKeys& keys,
      const std::function<bool(const keys::Digest& key, std::uint64_t begin, std::uint64_t len)>& held) const;
  // Whether some tier holds `key` (a probe: no side effects but counters).
  bool Holds(std::string_view ns, const keys::Digest& key) const;
  // Leases the chunks of `ranges` (any tokens of a request, in order), of
  // `model`'s shape: a range whose chunk is gone or fails to read joins
  // `failed`. No prefix logic, no recompute-when-faster trimming: the caller
  // decided what to load.
  Fetch FetchKeys(const ModelKv& model, std::string_view ns, std::span<const KeyedRange> ranges,
                  TieredStore::Form form = TieredStore::Form::kCanonical);

 private:
  KvStore(const StoreOptions& options, std::unique_ptr<TieredStore> chain);
  // The scatter kernel from device-resident canonical KV into the groups'
  // views, then the engine stream after it (ScatterToDevice, ScatterOnDevice).
  Status ScatterRuns(const ModelKv& model, const void* canonical, std::uint64_t tokens,
                     std::span<const KvGroup> groups);
  static keys::Digest KeyOf(const keys::ChunkKeyer& keyer, const TokenKeys& keys, const keys::Digest& prev,
                            std::uint64_t begin, std::uint64_t len);
  // The tokens a chunk or piece starting at `pos` of an n-token request
  // covers when stored: a whole chunk, else the largest piece that fits.
  std::uint64_t StoredLength(const TokenKeys& keys, std::uint64_t pos, std::uint64_t n) const;
  // What a call in namespace `ns` passes down the chain (store/tier.h): the
  // namespace's hash when some tier files keys per namespace (a remote
  // node), the call's delivery target, and its start (now), from which
  // remote tiers count one deadline for all of the call's round trips.
  // Management calls that walk many keys (a knowledge item's listing,
  // pinning, dropping) pass one_deadline false: each round trip its own.
 public:
  ReadContext Context(std::string_view ns, const DeliveryTarget& target = {}, bool one_deadline = true) const;
  // Tells the remote and redis tiers how an engine request went for them
  // (Tier::Report): per tier, `hit[i]` of `tokens`, for `model`.
  void ReportOutcome(const ModelKv& model, std::string_view ns, bool load, std::uint64_t tokens,
                     const std::vector<std::uint64_t>& hit);

 private:
  // Tells remote tiers which keys the walk is about to probe (one call);
  // with will_read, that the ones no tier above holds are then read (the
  // remote reads start at once and stream).
  void PrefetchRemote(const ModelKv& model, std::string_view ns, const TokenKeys& keys, bool will_read,
                      const ReadContext& ctx) const;
  // A chunk planned for reading (FetchPrefix, FetchKeys), then read and
  // leased into `f` by ReadPlanned (on the fetch threads when several are
  // costly).
  struct Planned {
    keys::Digest key;
    std::uint64_t begin, len;
    int level;
    std::optional<Result<Lease>> lease;  // set by the read
    std::uint64_t ns = 0;                // the read's time
  };
  void ReadPlanned(const ModelKv& model, std::vector<Planned>& plan, TieredStore::Form form, const ReadContext& ctx,
                   Fetch& f);
  // Walks the request's chunks while probe(key, begin, len) accepts them;
  // returns the tokens walked.
  template <typename Probe>
  std::uint64_t Walk(const ModelKv& model, std::string_view ns, const TokenKeys& keys, Probe&& probe) const;
  // The pieces after whole chunk boundary `pos` (the file comment), each
  // taken when probe(key, begin, len) accepts it: `prev` and `pos` advance.
  template <typename Probe>
  void WalkPieces(const keys::ChunkKeyer& keyer, const TokenKeys& keys, keys::Digest& prev, std::uint64_t& pos,
                  Probe&& probe) const;

  const StoreOptions options_;
  std::unique_ptr<TieredStore> chain_;
  std::shared_ptr<const wire::ChunkSealer> sealer_;
  std::unique_ptr<ThreadPool> fetch_pool_;  // null: one thread; used under fetch_mu_
  std::mutex fetch_mu_;
  std::vector<bool> costly_get_;  // per level: a get reads from disk or decodes
  bool has_remote_ = false;       // some tier is a remote node or a redis tier
  std::atomic<std::uint64_t> lookups_{0}, retrieves_{0}, stores_{0}, hits_{0}, misses_{0};
  std::atomic<std::uint64_t> tokens_served_{0}, tokens_stored_{0}, bytes_served_{0}, bytes_stored_{0}, edited_served_{0};
  mutable std::atomic<std::uint64_t> probes_{0};
  std::atomic<std::uint64_t> lookup_tokens_{0}, lookup_hit_tokens_{0};
  std::atomic<std::uint64_t> tokens_requested_{0}, ttft_saved_ns_{0}, tokens_served_unpriced_{0}, delivery_ns_{0};
  // Reported prefills per model fingerprint (a few models per runtime; at
  // most kMaxPrefillModels, then reports of new models are kBusy).
  struct PrefillMeter {
    std::uint64_t tokens = 0, ns = 0;
  };
  static constexpr size_t kMaxPrefillModels = 4096;
  mutable std::mutex prefill_mu_;
  std::unordered_map<keys::Digest, PrefillMeter, keys::DigestHash> prefill_;  // under prefill_mu_
  std::uint64_t prefill_tokens_ = 0, prefill_ns_ = 0;  // all models, under prefill_mu_
  // Delivery rates per tier, [host views, device views] (Rate()).
  struct RateSlot {
    DeliveryRate rate;
    std::uint64_t declined = 0;  // loads that would have left it (kRateProbeEvery)
  };
  // Leaves the tail of `plan` that costs more to deliver than to recompute
  // (StoreOptions::recompute_when_faster): returns the chunks to fetch.
  size_t ChunksWorthLoading(const ModelKv& model, std::span<const std::pair<int, std::uint64_t>> levels_tokens,
                            bool device);
  void RecordRates(const Fetch& fetch);
  mutable std::mutex rate_mu_;
  std::vector<std::array<RateSlot, 2>> rates_;  // per level, under rate_mu_
  std::atomic<std::uint64_t> recompute_chunks_{0}, recompute_tokens_{0}, rate_probes_{0};
  telemetry::Histogram lookup_us_, load_us_, store_us_;
};

}  // namespace kdn::store
