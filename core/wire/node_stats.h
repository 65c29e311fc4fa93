// What a node reports about itself: the C++ form of wire/node.capnp's Stats,
// filled by the node service (server/) and rendered as Cap'n Proto (the stats
// call and its subscription: ToWire, FromWire) and as Prometheus text
// (/metrics). Here, below the server, so that readers of a node's stats (the
// dashboard) decode them without linking the server. The namespace is the
// server's, whose vocabulary it is.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/telemetry/histogram.h"
#include "core/wire/node.capnp.h"

namespace kdn::server {

struct TierStatsSnapshot {
  std::string name;   // e.g. "host", "disk"
  std::string kind;   // "host", "disk", "remote", "redis", "device"
  std::string codec;  // the tier's codec spec ("raw", "zstd", ...)
  std::uint64_t objects = 0, used_bytes = 0, capacity_bytes = 0;
  std::uint64_t hits = 0, misses = 0, puts = 0, evictions = 0;
  std::uint64_t demotions_in = 0, promotions_in = 0, corrupt_detected = 0;
  std::uint64_t bytes_in = 0, bytes_out = 0;
  double high_watermark = 0.95, low_watermark = 0.85;
  // The tier's read rate measured at start (server/tier_limits.h), bytes/s;
  // 0: not measured (server.measure_tiers off, a kind not measured, a
  // failed measurement, or a node from before the field).
  double limit_bytes_per_s = 0;
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

struct NodeStats {
  std::uint64_t time_ms = 0, uptime_ms = 0;
  std::vector<TierStatsSnapshot> tiers;
  std::uint64_t lookups = 0, requested_tokens = 0, hit_tokens = 0, lookup_hit_tokens = 0;
  std::uint64_t get_chunks = 0, get_misses = 0, get_bytes = 0;
  std::uint64_t put_chunks = 0, put_bytes = 0, put_refused = 0, deletes = 0;
  std::uint64_t auth_failures = 0, sessions = 0;
  LatencySnapshot lookup_us, get_us, put_us;
  double ttft_saved_ms = 0;
  std::uint64_t documents = 0;               // knowledge items registered
  std::uint64_t registry_load_failures = 0;  // registry files unreadable at start
};

// Fills a capnp Stats from a snapshot, and back.
void ToWire(const NodeStats& s, wire::node::Stats::Builder out);
NodeStats FromWire(wire::node::Stats::Reader in);

}  // namespace kdn::server
