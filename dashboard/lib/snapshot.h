// SPDX-License-Identifier: Apache-2.0
// One reading of what a kdn store is doing, whatever it came from: a kdnd's
// pushed statistics (wire/node.capnp Stats) or a runtime's C ABI counters.
// Every counter is cumulative since the source started (monotonic); rates
// are differences of two snapshots (recorder.h).
// Thread-safety: a plain value, copied across threads (queued signals).
#pragma once

#include <QMetaType>
#include <QString>
#include <QVector>

#include <cstdint>

namespace kdn::dash {

struct TierSample {
  QString name;   // "host", "disk", "redis", ...
  QString kind;   // "host", "disk", "remote", "redis", "device"
  QString codec;  // the tier's codec spec ("raw", "kdn:balanced", ...)
  std::uint64_t objects = 0, used_bytes = 0, capacity_bytes = 0;
  double high_watermark = 0, low_watermark = 0;  // fractions of capacity; 0: none (not drawn)
  std::uint64_t hits = 0, misses = 0, puts = 0, evictions = 0;
  std::uint64_t demotions_in = 0, promotions_in = 0, corrupt_detected = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;  // bytes written to / read from the tier
  // The codec's bytes before and after encoding (0 and 0: not reported).
  std::uint64_t bytes_before_encoding = 0, bytes_after_encoding = 0;
  std::uint64_t io_errors = 0;  // failed reads and writes (a remote or redis tier's misses)
  // Of corrupt_detected, where the source tells them apart (a runtime's
  // kdn_tier_stats; a kdnd's Stats do not): chunks that did not decode, and
  // chunks whose seal did not verify (a runtime with a secret file).
  std::uint64_t decode_failures = 0, auth_failures = 0;
  // The tier's measured delivery limit in bytes read per second (0: not
  // measured yet); the bandwidth view draws the rate against it.
  double limit_bytes_per_s = 0;
  // How it was measured: false, by kdnd at start (a cold read of the tier,
  // server.measure_tiers); true, on the loads the tier served (a runtime's
  // kdn_tier_stats.delivery_ns_per_token, a moving average).
  bool limit_from_loads = false;
};

// Copies the counters that a source's tier statistics name as TierSample
// does (kdn_tier_stats; a node's TierStatsSnapshot is read by TierStat).
template <typename TierStats>
void CopyTierCounters(const TierStats& t, TierSample& s) {
  s.objects = t.objects;
  s.used_bytes = t.used_bytes;
  s.capacity_bytes = t.capacity_bytes;
  s.hits = t.hits;
  s.misses = t.misses;
  s.puts = t.puts;
  s.evictions = t.evictions;
  s.demotions_in = t.demotions_in;
  s.promotions_in = t.promotions_in;
  s.corrupt_detected = t.corrupt_detected;
  s.bytes_in = t.bytes_in;
  s.bytes_out = t.bytes_out;
}

// A knowledge item (a document whose KV is kept), as its source lists it.
struct DocumentSample {
  QString ns;      // tenant namespace
  QString doc_id;
  std::uint64_t hits = 0;     // chunks of it served since it was registered
  std::uint32_t chunks = 0, chunks_held = 0;
  bool pinned = false;
  std::int64_t pin_expires_ms = 0;  // ms since the epoch; 0: no deadline
};

// A namespace's quota in one tier, now: its use and what it lost. Only the
// quotas a source is configured with (a kdnd's tier.quotas, a runtime's
// kdn_tier_config.quotas), so the rows are bounded by its configuration.
struct QuotaSample {
  QString tier;         // the tier's name (TierSample::name)
  QString ns;           // the namespace's name; a runtime's namespace not named to its source:
                        // its hash's first 8 hex digits ("#1a2b3c4d")
  int tier_index = 0;   // the tier's place in the chain (two tiers may share a name)
  std::uint64_t quota_bytes = 0, used_bytes = 0, objects = 0;
  std::uint64_t quota_evictions = 0;  // its chunks evicted to keep it within its quota (its own puts)
  std::uint64_t room_evictions = 0;   // its chunks evicted for the tier's room
  std::uint64_t refused = 0;          // its puts the tier refused: one chunk larger than its quota
};

struct Snapshot {
  std::int64_t time_ms = 0;    // when it was taken: ms since the epoch (the source's clock)
  std::uint64_t uptime_ms = 0; // since the source started
  QVector<TierSample> tiers;   // highest first
  std::uint64_t lookups = 0;
  // The hit rate's pair: tokens asked for, and of them the tokens found in
  // cache (a kdnd: its lookups' tokens and found prefixes, as the runtimes'
  // remote tiers tell it; a runtime: see runtime_source.h).
  std::uint64_t requested_tokens = 0;
  std::uint64_t hit_tokens = 0;
  std::uint64_t served_tokens = 0;     // tokens whose KV was delivered (what saved TTFT)
  std::uint64_t loads = 0;             // retrieves / gets served
  std::uint64_t failed_loads = 0;      // loads that stopped short (misses) or failed
  std::uint64_t stores = 0;
  std::uint64_t corrupt_detected = 0;  // all tiers
  // Refused for authentication: a kdnd's calls with an unknown token or
  // outside its grant; a runtime's chunks whose seal did not verify (all
  // tiers; also in corrupt_detected).
  std::uint64_t auth_failures = 0;
  bool reports_decode_failures = false;  // TierSample::decode_failures are the source's (else unknown)
  std::uint64_t pins_active = 0;
  std::uint64_t documents = 0;         // knowledge items registered
  // TTFT: the prefill time the hits avoided (hit tokens x the measured or
  // configured prefill time per token) and the time spent delivering them.
  double ttft_saved_ms = 0;
  double delivery_ms = 0;
  // Where the prefill time per token behind ttft_saved_ms comes from: a
  // price (kdnd: server.prefill_us_per_token in its config, the same for
  // every token; it does not see the engines' prefills) or a measure (a
  // runtime: the prefills its engines reported, kdn_model_report_prefill).
  enum class TtftBasis { kUnknown, kPriced, kMeasured };
  TtftBasis ttft_basis = TtftBasis::kUnknown;
  // That time per token in us: the price (kdnd: ttftSavedMs / hitTokens,
  // which is how kdnd computes it; 0 before a token is served or when not
  // configured) or the mean of the reported prefills (0: none reported).
  double prefill_us_per_token = 0;
  // The documents of the namespaces the source may list, most hit first
  // (at most a source's configured count).
  QVector<DocumentSample> documents_top;
  // The namespaces' quotas, tier by tier (highest first), each tier's in
  // the order its configuration gives them.
  QVector<QuotaSample> quotas;
  QString source;  // what it came from, for the title: "kdnd 127.0.0.1:7450", "runtime"
};

}  // namespace kdn::dash

Q_DECLARE_METATYPE(kdn::dash::Snapshot)
