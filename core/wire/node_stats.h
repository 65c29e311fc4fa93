// SPDX-License-Identifier: Apache-2.0
// What a node reports about itself: the C++ form of wire/node.capnp's Stats,
// filled by the node service (server/) and rendered as Cap'n Proto (the stats
// call and its subscription: ToWire, FromWire) and as Prometheus text
// (/metrics). Here, below the server, so that readers of a node's stats (the
// dashboard) decode them without linking the server. The namespace is the
// server's, whose vocabulary it is.
// Thread-safety: plain values.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/telemetry/histogram.h"
#include "core/wire/node.capnp.h"

namespace kdn::server {

// The node's statistics, one schema (RocksDB's Tickers): an enum per level
// (the node, each tier) and a table that names each entry once, as the
// field of wire/node.capnp's Stats or TierStats that carries it and as its
// Prometheus series. ToWire and FromWire copy by the field's name,
// /metrics (server/metrics.cc) lists the table, and readers index by the
// enum; a new statistic is an enum entry, a row and a capnp field (and the
// code that counts it).
enum class StatKind : std::uint8_t { kCounter, kGauge };
struct StatDef {
  const char* wire;    // the capnp field (lowerCamelCase)
  const char* metric;  // the Prometheus series
  const char* help;
  StatKind kind;
};

enum class NodeStat : std::uint8_t {
  kLookups,
  kRequestedTokens,
  kHitTokens,
  kLookupHitTokens,
  kGetChunks,
  kGetMisses,
  kGetBytes,
  kPutChunks,
  kPutBytes,
  kPutRefused,
  kDeletes,
  kAuthFailures,
  kSessions,
  kDocuments,
  kRegistryLoadFailures,
  kConnections,
  kConnectionsRefused,
  kAcceptErrors,
  kConnectionsDropped,
  kRepliesCapped,
  kSubscriptions,
  kSubscriptionsRefused,
  kEngineLookups,
  kEngineLookupTokens,
  kEngineLookupHitTokens,
  kEngineLoads,
  kEngineLoadTokens,
  kEngineLoadHitTokens,
  kCount
};
inline constexpr std::size_t kNodeStatCount = static_cast<std::size_t>(NodeStat::kCount);
// Indexed by NodeStat.
inline constexpr StatDef kNodeStats[kNodeStatCount] = {
    {"lookups", "kdn_lookups_total",
     "Prefix lookups answered: one per key run a runtime asked about (an engine request may make several; "
     "kdn_engine_lookups_total counts engine requests).",
     StatKind::kCounter},
    {"requestedTokens", "kdn_requested_tokens_total",
     "Tokens covered by the key runs lookups asked about (per probe; kdn_engine_lookup_tokens_total counts "
     "each engine request once).",
     StatKind::kCounter},
    {"hitTokens", "kdn_hit_tokens_total", "Tokens of the chunks served by get.", StatKind::kCounter},
    {"lookupHitTokens", "kdn_lookup_hit_tokens_total", "Tokens of the prefixes lookups found (per probe).",
     StatKind::kCounter},
    {"getChunks", "kdn_get_chunks_total", "Chunks served by get.", StatKind::kCounter},
    {"getMisses", "kdn_get_misses_total", "Chunks asked of get that no tier held.", StatKind::kCounter},
    {"getBytes", "kdn_get_bytes_total", "Bytes served by get.", StatKind::kCounter},
    {"putChunks", "kdn_put_chunks_total", "Chunks stored by put.", StatKind::kCounter},
    {"putBytes", "kdn_put_bytes_total", "Bytes stored by put.", StatKind::kCounter},
    {"putRefused", "kdn_put_refused_total", "Chunks put refused (bad envelope, wrong namespace, or no room).",
     StatKind::kCounter},
    {"deletes", "kdn_deletes_total", "Chunks deleted.", StatKind::kCounter},
    {"authFailures", "kdn_auth_failures_total", "Calls refused: unknown token, or outside the token's grant.",
     StatKind::kCounter},
    {"sessions", "kdn_sessions", "Client sessions open now.", StatKind::kGauge},
    {"documents", "kdn_documents", "Knowledge items registered on the node now.", StatKind::kGauge},
    {"registryLoadFailures", "kdn_registry_load_failures_total",
     "Knowledge registry files that could not be read at start (the node started without documents).",
     StatKind::kCounter},
    {"connections", "kdn_connections", "Connections open now (RPC and HTTP).", StatKind::kGauge},
    {"connectionsRefused", "kdn_connections_refused_total",
     "Connections closed as they came: the node held server.max_connections.", StatKind::kCounter},
    {"acceptErrors", "kdn_accept_errors_total",
     "Accepts that failed (out of file descriptors, say); the listener went on after a pause.", StatKind::kCounter},
    {"connectionsDropped", "kdn_connections_dropped_total",
     "Connections closed for a bound: no login in time, a message stalled half-sent, a message too large before "
     "login, or too many failed logins.",
     StatKind::kCounter},
    {"repliesCapped", "kdn_replies_capped_total",
     "Get calls whose reply reached server.max_reply_bytes (the keys past it were answered missing).",
     StatKind::kCounter},
    {"subscriptions", "kdn_subscriptions", "Statistics subscriptions open now.", StatKind::kGauge},
    {"subscriptionsRefused", "kdn_subscriptions_refused_total",
     "subscribeStats calls refused (busy): server.max_subscriptions, or per connection "
     "server.max_subscriptions_per_connection.",
     StatKind::kCounter},
    {"engineLookups", "kdn_engine_lookups_total",
     "Engine requests looked up against this node, as the runtimes that served them reported.", StatKind::kCounter},
    {"engineLookupTokens", "kdn_engine_lookup_tokens_total", "Tokens of the engine requests looked up.",
     StatKind::kCounter},
    {"engineLookupHitTokens", "kdn_engine_lookup_hit_tokens_total",
     "Leading tokens of those requests that this node held.", StatKind::kCounter},
    {"engineLoads", "kdn_engine_loads_total", "Engine loads (retrieves) that could read from this node.",
     StatKind::kCounter},
    {"engineLoadTokens", "kdn_engine_load_tokens_total", "Tokens those loads asked for.", StatKind::kCounter},
    {"engineLoadHitTokens", "kdn_engine_load_hit_tokens_total", "Tokens this node delivered to those loads.",
     StatKind::kCounter},
};

enum class TierStat : std::uint8_t {
  kObjects,
  kUsedBytes,
  kCapacityBytes,
  kHits,
  kMisses,
  kPuts,
  kEvictions,
  kDemotionsIn,
  kPromotionsIn,
  kCorruptDetected,
  kBytesIn,
  kBytesOut,
  kIoErrors,
  kCount
};
inline constexpr std::size_t kTierStatCount = static_cast<std::size_t>(TierStat::kCount);
// Indexed by TierStat; each a series per tier, labelled tier="<name>" and
// index="<its place in the chain>" (two tiers may share a name).
inline constexpr StatDef kTierStats[kTierStatCount] = {
    {"objects", "kdn_tier_objects", "Objects the tier holds.", StatKind::kGauge},
    {"usedBytes", "kdn_tier_used_bytes", "Bytes the tier holds.", StatKind::kGauge},
    {"capacityBytes", "kdn_tier_capacity_bytes", "Bytes the tier may hold.", StatKind::kGauge},
    {"hits", "kdn_tier_hits_total", "Reads the tier served.", StatKind::kCounter},
    {"misses", "kdn_tier_misses_total", "Reads the tier did not hold.", StatKind::kCounter},
    {"puts", "kdn_tier_puts_total", "Objects stored into the tier (new, demoted or promoted).", StatKind::kCounter},
    {"evictions", "kdn_tier_evictions_total", "Objects evicted from the tier to make room.", StatKind::kCounter},
    {"demotionsIn", "kdn_tier_demotions_in_total", "Objects the tier received, evicted from the tier above.",
     StatKind::kCounter},
    {"promotionsIn", "kdn_tier_promotions_in_total", "Objects the tier received, promoted from a tier below.",
     StatKind::kCounter},
    {"corruptDetected", "kdn_tier_corrupt_objects_total",
     "Objects that failed a check on read and were removed from the tier.", StatKind::kCounter},
    {"bytesIn", "kdn_tier_written_bytes_total", "Bytes stored into the tier.", StatKind::kCounter},
    {"bytesOut", "kdn_tier_read_bytes_total", "Bytes the tier served.", StatKind::kCounter},
    {"ioErrors", "kdn_tier_io_errors_total", "Reads and writes of the tier that failed (a disk's I/O errors, say).",
     StatKind::kCounter},
};

struct TierStatsSnapshot {
  std::string name;   // e.g. "host", "disk"
  std::string kind;   // "host", "disk", "remote", "redis", "device"
  std::string codec;  // the tier's codec spec ("raw", "zstd", ...)
  std::array<std::uint64_t, kTierStatCount> values{};  // indexed by TierStat
  double high_watermark = 0.95, low_watermark = 0.85;
  // The tier's read rate measured at start (server/tier_limits.h), bytes/s;
  // 0: not measured (server.measure_tiers off, a kind not measured, a
  // failed measurement, or a node from before the field).
  double limit_bytes_per_s = 0;

  std::uint64_t& operator[](TierStat s) { return values[static_cast<std::size_t>(s)]; }
  std::uint64_t operator[](TierStat s) const { return values[static_cast<std::size_t>(s)]; }
};

// A latency distribution in microseconds: the summary, plus cumulative
// counts at fixed bounds (for Prometheus histograms): buckets[i] counts the
// values <= kLatencyBoundsUs[i].
inline constexpr double kLatencyBoundsUs[] = {50,    100,    250,    500,     1000,    2500,   5000,
                                              10000, 25000,  50000,  100000,  250000,  500000, 1000000,
                                              2500000, 5000000, 10000000};
struct LatencySnapshot {
  telemetry::HistogramSnapshot summary;
  std::vector<std::uint64_t> buckets;  // one per kLatencyBoundsUs entry
};

// Usage of one namespace and model (server/usage.h): kept by kdnd for its
// metrics page, not sent over RPC.
struct UsageCounts {
  std::uint64_t lookup_tokens = 0, lookup_hit_tokens = 0;
  std::uint64_t load_tokens = 0, load_hit_tokens = 0;
  std::uint64_t put_bytes = 0, get_bytes = 0;
  void Add(const UsageCounts& o) {
    lookup_tokens += o.lookup_tokens;
    lookup_hit_tokens += o.lookup_hit_tokens;
    load_tokens += o.load_tokens;
    load_hit_tokens += o.load_hit_tokens;
    put_bytes += o.put_bytes;
    get_bytes += o.get_bytes;
  }
};
struct UsageRow {
  std::string ns, model;  // the labels
  UsageCounts counts;
};

// A namespace's quota in one of kdnd's tiers (store/tiered_store.h,
// NamespaceUse): on its metrics page and, as Stats.quotas (NamespaceQuota,
// protocol version 5), over RPC.
struct QuotaRow {
  std::string tier, ns;  // the labels: the tier's name, the namespace as the config names it
  std::size_t index = 0;  // the tier's place in the chain
  std::uint64_t quota_bytes = 0, used_bytes = 0, objects = 0;
  std::uint64_t quota_evictions = 0, room_evictions = 0, refused = 0;
};

struct NodeStats {
  std::uint64_t time_ms = 0, uptime_ms = 0;
  std::vector<TierStatsSnapshot> tiers;
  std::array<std::uint64_t, kNodeStatCount> values{};  // indexed by NodeStat
  LatencySnapshot lookup_us, get_us, put_us;
  double ttft_saved_ms = 0;
  std::vector<UsageRow> usage;  // kdnd's own page only (ToWire leaves it out)
  std::vector<QuotaRow> quotas;  // one per tier and namespace configured (ToWire sends them)

  std::uint64_t& operator[](NodeStat s) { return values[static_cast<std::size_t>(s)]; }
  std::uint64_t operator[](NodeStat s) const { return values[static_cast<std::size_t>(s)]; }
};

// Fills a capnp Stats from a snapshot, and back. A field the peer's schema
// does not have (an older node) reads as 0.
void ToWire(const NodeStats& s, wire::node::Stats::Builder out);
NodeStats FromWire(wire::node::Stats::Reader in);

}  // namespace kdn::server
