// SPDX-License-Identifier: Apache-2.0
// kdnd's Prometheus text: NodeStats -> prometheus-cpp MetricFamily values ->
// TextSerializer. The names, and which LMCache names alias which kdn
// series, are listed in metrics.h.
// Thread-safety: pure functions; no shared state.
#include "server/metrics.h"

#include "core/wire/node.capnp.h"

#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>
#include <prometheus/text_serializer.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace kdn::server {
namespace {

namespace pm = prometheus;
using Labels = std::vector<pm::ClientMetric::Label>;

constexpr double kMicrosPerSecond = 1e6;

// Collects the page's families. Each name is added once: the text format
// forbids a second HELP/TYPE block for a family.
class Page {
 public:
  void Counter(std::string name, std::string help, double value, Labels labels = {}) {
    pm::ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Add(std::move(name), std::move(help), pm::MetricType::Counter, std::move(m));
  }

  void Gauge(std::string name, std::string help, double value, Labels labels = {}) {
    pm::ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Add(std::move(name), std::move(help), pm::MetricType::Gauge, std::move(m));
  }

  // A latency snapshot in µs as a histogram in seconds. The serializer
  // appends the +Inf bucket itself, equal to sample_count.
  void Histogram(std::string name, std::string help, const LatencySnapshot& lat) {
    pm::ClientMetric m;
    m.histogram.sample_count = lat.summary.count;
    m.histogram.sample_sum = lat.summary.sum / kMicrosPerSecond;
    // A snapshot from an older peer may carry fewer buckets than we know
    // bounds for; the buckets it has are still right.
    const std::size_t n = std::min(lat.buckets.size(), std::size(kLatencyBoundsUs));
    // The bucket counts and the total are read from live atomics one after
    // another, so a value recorded meanwhile can make a bucket exceed a
    // later one or the count. Prometheus requires cumulative buckets that
    // never decrease and end at the count (histogram_quantile misbehaves
    // otherwise), so each is clamped between its predecessor and the count.
    std::uint64_t prev = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t c = std::min(std::max(lat.buckets[i], prev), lat.summary.count);
      m.histogram.bucket.push_back({c, kLatencyBoundsUs[i] / kMicrosPerSecond});
      prev = c;
    }
    Add(std::move(name), std::move(help), pm::MetricType::Histogram, std::move(m));
  }

  // A family with one series per tier, labelled tier="<name>" and
  // index="<its place in the chain>": two tiers of one name (two disks) are
  // two series, not one that Prometheus drops as a duplicate. `skip`: tiers
  // left out (their value unknown).
  template <typename Value>
  void PerTier(const std::vector<TierStatsSnapshot>& tiers, std::string name, std::string help, pm::MetricType type,
               Value value, const std::vector<bool>& skip = {}) {
    pm::MetricFamily f{std::move(name), std::move(help), type, {}};
    for (std::size_t i = 0; i < tiers.size(); ++i) {
      if (i < skip.size() && skip[i]) continue;
      const TierStatsSnapshot& t = tiers[i];
      pm::ClientMetric m;
      m.label = {{"index", std::to_string(i)}, {"tier", t.name}};
      if (type == pm::MetricType::Counter) {
        m.counter.value = value(t);
      } else {
        m.gauge.value = value(t);
      }
      f.metric.push_back(std::move(m));
    }
    if (f.metric.empty()) return;  // a HELP/TYPE block with no samples says nothing
    families_.push_back(std::move(f));
  }

  // A counter family with one series per usage row, labelled namespace and
  // model (server/usage.h: bounded).
  template <typename Value>
  void PerUsage(const std::vector<UsageRow>& rows, std::string name, std::string help, Value value) {
    pm::MetricFamily f{std::move(name), std::move(help), pm::MetricType::Counter, {}};
    for (const UsageRow& r : rows) {
      pm::ClientMetric m;
      m.label = {{"namespace", r.ns}, {"model", r.model}};
      m.counter.value = value(r.counts);
      f.metric.push_back(std::move(m));
    }
    if (f.metric.empty()) return;
    families_.push_back(std::move(f));
  }

  // The tier's kind and codec as labels of a constant 1 (the "info"
  // pattern), so they are not repeated on every per-tier series; a query
  // joins them in with `* on(index, tier) group_left(kind, codec) kdn_tier_info`.
  void TierInfo(const std::vector<TierStatsSnapshot>& tiers) {
    if (tiers.empty()) return;
    pm::MetricFamily f{"kdn_tier_info", "The tier's kind and codec, as labels; the value is always 1.",
                       pm::MetricType::Gauge, {}};
    for (std::size_t i = 0; i < tiers.size(); ++i) {
      const TierStatsSnapshot& t = tiers[i];
      pm::ClientMetric m;
      m.label = {{"index", std::to_string(i)}, {"tier", t.name}, {"kind", t.kind}, {"codec", t.codec}};
      m.gauge.value = 1.0;
      f.metric.push_back(std::move(m));
    }
    families_.push_back(std::move(f));
  }

  void AddFamily(pm::MetricFamily f) { families_.push_back(std::move(f)); }

  std::string Serialize() const {
    std::ostringstream out;
    pm::TextSerializer().Serialize(out, families_);
    return out.str();
  }

 private:
  void Add(std::string name, std::string help, pm::MetricType type, pm::ClientMetric m) {
    families_.push_back(pm::MetricFamily{std::move(name), std::move(help), type, {std::move(m)}});
  }

  std::vector<pm::MetricFamily> families_;
};

double AsDouble(std::uint64_t v) { return static_cast<double>(v); }

// part / whole, 0 when there is no whole yet (never NaN: a scrape before
// the first lookup must still parse), and at most 1: gets may serve tokens
// of requests whose lookup did not declare them, which would otherwise
// push a fraction above 1.
double Ratio(std::uint64_t part, std::uint64_t whole) {
  if (whole == 0) return 0.0;
  return std::min(1.0, AsDouble(part) / AsDouble(whole));
}

std::uint64_t SumOfKind(const std::vector<TierStatsSnapshot>& tiers, const std::string& kind, TierStat stat) {
  std::uint64_t sum = 0;
  for (const TierStatsSnapshot& t : tiers) {
    if (t.kind == kind) sum += t[stat];
  }
  return sum;
}

pm::MetricType TypeOf(StatKind k) { return k == StatKind::kCounter ? pm::MetricType::Counter : pm::MetricType::Gauge; }

// The hit ratios engines see, from the runtimes' reports of their requests
// (Session.report: one count per engine request). A node whose runtimes
// never reported (older than protocol 4) falls back to the per-probe counts,
// which understate partial hits (every probe of a request counts its tokens
// as requested).
double LookupHitRatio(const NodeStats& s) {
  if (s[NodeStat::kEngineLookupTokens] != 0) {
    return Ratio(s[NodeStat::kEngineLookupHitTokens], s[NodeStat::kEngineLookupTokens]);
  }
  return Ratio(s[NodeStat::kLookupHitTokens], s[NodeStat::kRequestedTokens]);
}
double RetrieveHitRatio(const NodeStats& s) {
  if (s[NodeStat::kEngineLoadTokens] != 0) {
    return Ratio(s[NodeStat::kEngineLoadHitTokens], s[NodeStat::kEngineLoadTokens]);
  }
  return Ratio(s[NodeStat::kHitTokens], s[NodeStat::kRequestedTokens]);
}

void AddNode(const NodeStats& s, Page& p) {
  // Every statistic of the schema (core/wire/node_stats.h), then what is
  // derived from them.
  for (std::size_t k = 0; k < kNodeStatCount; ++k) {
    const StatDef& d = kNodeStats[k];
    if (d.kind == StatKind::kCounter) {
      p.Counter(d.metric, d.help, AsDouble(s.values[k]));
    } else {
      p.Gauge(d.metric, d.help, AsDouble(s.values[k]));
    }
  }
  p.Gauge("kdn_retrieve_hit_ratio",
          "Tokens this node delivered to engine loads over the tokens they asked for, since start (RetrieveHitRatio).",
          RetrieveHitRatio(s));
  p.Gauge("kdn_lookup_hit_ratio",
          "Leading tokens of engine requests this node held over their tokens, since start (LookupHitRatio).",
          LookupHitRatio(s));
  p.Gauge("kdn_uptime_seconds", "Seconds since the node started.", AsDouble(s.uptime_ms) / 1000.0);
  p.Counter("kdn_ttft_saved_seconds_total",
            "Prefill time saved: hit tokens times the configured prefill time per token.", s.ttft_saved_ms / 1000.0);
  p.Histogram("kdn_lookup_duration_seconds", "Time to answer a lookup call.", s.lookup_us);
  p.Histogram("kdn_get_duration_seconds", "Time to answer a get call.", s.get_us);
  p.Histogram("kdn_put_duration_seconds", "Time to answer a put call.", s.put_us);
}

void AddTiers(const NodeStats& s, Page& p) {
  const auto& tiers = s.tiers;
  p.TierInfo(tiers);
  for (std::size_t k = 0; k < kTierStatCount; ++k) {
    const StatDef& d = kTierStats[k];
    p.PerTier(tiers, d.metric, d.help, TypeOf(d.kind),
              [k](const TierStatsSnapshot& t) { return AsDouble(t.values[k]); });
  }
  p.PerTier(tiers, "kdn_tier_high_watermark_ratio", "Fraction of capacity a put may not cross without evicting first.",
            pm::MetricType::Gauge, [](const TierStatsSnapshot& t) { return t.high_watermark; });
  p.PerTier(tiers, "kdn_tier_low_watermark_ratio", "Fraction of capacity eviction brings the tier down to.",
            pm::MetricType::Gauge, [](const TierStatsSnapshot& t) { return t.low_watermark; });
  // Only the tiers measured: a 0 would read as a tier that delivers nothing.
  std::vector<bool> unmeasured;
  for (const TierStatsSnapshot& t : tiers) unmeasured.push_back(!(t.limit_bytes_per_s > 0));
  p.PerTier(tiers, "kdn_tier_limit_bytes_per_second",
            "The tier's read rate measured at start (host: memcpy; disk: a cold read of a file in its directory).",
            pm::MetricType::Gauge, [](const TierStatsSnapshot& t) { return t.limit_bytes_per_s; }, unmeasured);
}

// Quotas by tier and namespace (the labels bounded by the config: one
// series per quota it sets).
void AddQuotas(const NodeStats& s, Page& p) {
  struct Def {
    const char* name;
    const char* help;
    pm::MetricType type;
    std::uint64_t QuotaRow::*field;
  };
  static const Def kDefs[] = {
      {"kdn_namespace_quota_bytes", "The namespace's quota in the tier (its config).", pm::MetricType::Gauge,
       &QuotaRow::quota_bytes},
      {"kdn_namespace_used_bytes", "Bytes of the tier the namespace's chunks take.", pm::MetricType::Gauge,
       &QuotaRow::used_bytes},
      {"kdn_namespace_objects", "The namespace's chunks the tier holds.", pm::MetricType::Gauge, &QuotaRow::objects},
      {"kdn_namespace_quota_evictions_total", "The namespace's chunks evicted to keep it within its quota.",
       pm::MetricType::Counter, &QuotaRow::quota_evictions},
      {"kdn_namespace_room_evictions_total",
       "The namespace's chunks evicted for the tier's room (the tier full of namespaces with quotas).",
       pm::MetricType::Counter, &QuotaRow::room_evictions},
      {"kdn_namespace_quota_refusals_total", "The namespace's puts refused in the tier: a chunk larger than its quota.",
       pm::MetricType::Counter, &QuotaRow::refused},
  };
  for (const Def& d : kDefs) {
    pm::MetricFamily f{d.name, d.help, d.type, {}};
    for (const QuotaRow& r : s.quotas) {
      pm::ClientMetric m;
      m.label = {{"index", std::to_string(r.index)}, {"tier", r.tier}, {"namespace", r.ns}};
      if (d.type == pm::MetricType::Counter) {
        m.counter.value = AsDouble(r.*d.field);
      } else {
        m.gauge.value = AsDouble(r.*d.field);
      }
      f.metric.push_back(std::move(m));
    }
    if (!f.metric.empty()) p.AddFamily(std::move(f));
  }
}

// Usage by namespace and model (server/usage.h; the labels bounded there).
void AddUsage(const NodeStats& s, Page& p) {
  const auto& rows = s.usage;
  p.PerUsage(rows, "kdn_usage_lookup_tokens_total", "Tokens of the engines' looked-up requests (their runtimes' reports), by namespace and model.",
             [](const UsageCounts& c) { return AsDouble(c.lookup_tokens); });
  p.PerUsage(rows, "kdn_usage_lookup_hit_tokens_total", "Of kdn_usage_lookup_tokens_total, the leading tokens this node held.",
             [](const UsageCounts& c) { return AsDouble(c.lookup_hit_tokens); });
  p.PerUsage(rows, "kdn_usage_load_tokens_total", "Tokens the engines' loads asked for (their runtimes' reports), by namespace and model.",
             [](const UsageCounts& c) { return AsDouble(c.load_tokens); });
  p.PerUsage(rows, "kdn_usage_load_hit_tokens_total", "Of kdn_usage_load_tokens_total, the tokens this node delivered.",
             [](const UsageCounts& c) { return AsDouble(c.load_hit_tokens); });
  p.PerUsage(rows, "kdn_usage_put_bytes_total", "Envelope bytes stored by puts, by namespace and model.",
             [](const UsageCounts& c) { return AsDouble(c.put_bytes); });
  p.PerUsage(rows, "kdn_usage_get_bytes_total", "Envelope bytes served by gets, by namespace and model.",
             [](const UsageCounts& c) { return AsDouble(c.get_bytes); });
}

// LMCache's names for the same values (see the table in metrics.h).
void AddLmcacheAliases(const NodeStats& s, Page& p) {
  // LMCache counts per engine request: the runtimes' reports.
  p.Counter("lmcache:num_lookup_requests_total", "Alias of kdn_engine_lookups_total, under LMCache's name.",
            AsDouble(s[NodeStat::kEngineLookups]));
  p.Counter("lmcache:num_requested_tokens_total", "Alias of kdn_engine_load_tokens_total, under LMCache's name.",
            AsDouble(s[NodeStat::kEngineLoadTokens]));
  p.Counter("lmcache:num_lookup_tokens_total", "Alias of kdn_engine_lookup_tokens_total, under LMCache's name.",
            AsDouble(s[NodeStat::kEngineLookupTokens]));
  p.Counter("lmcache:num_hit_tokens_total", "Alias of kdn_engine_load_hit_tokens_total, under LMCache's name.",
            AsDouble(s[NodeStat::kEngineLoadHitTokens]));
  p.Counter("lmcache:num_lookup_hits_total", "Alias of kdn_engine_lookup_hit_tokens_total, under LMCache's name.",
            AsDouble(s[NodeStat::kEngineLookupHitTokens]));
  p.Gauge("lmcache:retrieve_hit_rate", "Alias of kdn_retrieve_hit_ratio, under LMCache's name.", RetrieveHitRatio(s));
  p.Gauge("lmcache:lookup_hit_rate", "Alias of kdn_lookup_hit_ratio, under LMCache's name.", LookupHitRatio(s));
  p.Gauge("lmcache:local_cache_usage", "Bytes held by the host tiers (sum of kdn_tier_used_bytes of kind host).",
          AsDouble(SumOfKind(s.tiers, "host", TierStat::kUsedBytes)));
  p.Gauge("lmcache:local_storage_usage", "Bytes held by the disk tiers (sum of kdn_tier_used_bytes of kind disk).",
          AsDouble(SumOfKind(s.tiers, "disk", TierStat::kUsedBytes)));
  p.Counter("lmcache:local_cpu_evict_keys_count_total",
            "Objects evicted from the host tiers (sum of kdn_tier_evictions_total of kind host).",
            AsDouble(SumOfKind(s.tiers, "host", TierStat::kEvictions)));
  p.Histogram("lmcache:time_to_retrieve", "Alias of kdn_get_duration_seconds, under LMCache's name.", s.get_us);
  p.Histogram("lmcache:time_to_store", "Alias of kdn_put_duration_seconds, under LMCache's name.", s.put_us);
  p.Histogram("lmcache:time_to_lookup", "Alias of kdn_lookup_duration_seconds, under LMCache's name.", s.lookup_us);
}

// The process's own series, as Prometheus' client libraries name them
// (their process collector reads the same files): /proc/self/stat's CPU
// times, virtual size, resident pages and start time (in clock ticks after
// boot: /proc/stat's btime), the open descriptors in /proc/self/fd, and the
// descriptor limit. A file that cannot be read leaves its series out.
void AddProcess(Page& p) {
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page_bytes = static_cast<double>(::sysconf(_SC_PAGESIZE));
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), {});
  // After the command's closing parenthesis: field 3 (state) onward.
  const std::size_t close = stat.rfind(')');
  if (close != std::string::npos && ticks > 0) {
    std::istringstream in(stat.substr(close + 2));
    std::vector<std::string> f;
    for (std::string x; in >> x;) f.push_back(x);
    // f[0] is field 3; utime 14, stime 15, starttime 22, vsize 23, rss 24.
    if (f.size() > 21) {
      p.Counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                (std::stod(f[11]) + std::stod(f[12])) / ticks);
      p.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", std::stod(f[20]));
      p.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.", std::stod(f[21]) * page_bytes);
      std::ifstream proc_stat("/proc/stat");
      for (std::string line; std::getline(proc_stat, line);) {
        if (line.rfind("btime ", 0) == 0) {
          p.Gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                  std::stod(line.substr(6)) + std::stod(f[19]) / ticks);
          break;
        }
      }
    }
  }
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    ++fds;
  }
  if (!ec) p.Gauge("process_open_fds", "Number of open file descriptors.", fds);
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    p.Gauge("process_max_fds", "Maximum number of open file descriptors.", static_cast<double>(limit.rlim_cur));
  }
}

}  // namespace

std::string RenderPrometheus(const NodeStats& s, const PrometheusOptions& options) {
  Page page;
  page.Gauge("kdn_build_info", "kdnd's version and the node protocol it speaks, as labels; the value is always 1.", 1.0,
             {{"version", KDN_SERVER_VERSION}, {"protocol", std::to_string(wire::node::PROTOCOL_VERSION)}});
  AddNode(s, page);
  AddTiers(s, page);
  AddUsage(s, page);
  AddQuotas(s, page);
  if (options.kv_events) {
    page.Counter("kdn_kv_events_queued_total", "KV events queued for the subscribers.",
                 static_cast<double>(options.kv_events_queued));
    page.Counter("kdn_kv_events_dropped_total",
                 "KV events dropped: the publisher's queue was full (a subscriber that sees them has a gap).",
                 static_cast<double>(options.kv_events_dropped));
    page.Counter("kdn_kv_events_send_errors_total", "Batches of KV events the socket refused.",
                 static_cast<double>(options.kv_events_send_errors));
  }
  if (options.process_metrics) AddProcess(page);
  if (options.lmcache_names) AddLmcacheAliases(s, page);
  return page.Serialize();
}

std::string RenderHealth(bool serving) { return serving ? "serving\n" : "draining\n"; }

}  // namespace kdn::server
