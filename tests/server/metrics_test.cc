// SPDX-License-Identifier: Apache-2.0
// kdnd's Prometheus text: values land on the right series, histograms are
// cumulative and end at their count, label values are escaped, LMCache's
// aliases carry kdn's values, and promtool accepts the page.
#include "server/metrics.h"

#include <capnp/message.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/wire/node.capnp.h"
#include "server/usage.h"

namespace kdn::server {
namespace {

// Cumulative buckets shaped like a real snapshot: `count` values, of which
// bucket i holds min(count, 10 * (i + 1)).
LatencySnapshot Latency(std::uint64_t count, double sum_us) {
  LatencySnapshot l;
  l.summary.count = count;
  l.summary.sum = sum_us;
  for (std::size_t i = 0; i < std::size(kLatencyBoundsUs); ++i) {
    l.buckets.push_back(std::min<std::uint64_t>(count, 10 * (i + 1)));
  }
  return l;
}

NodeStats Populated() {
  NodeStats s;
  s.uptime_ms = 12500;
  TierStatsSnapshot host;
  host.name = "host";
  host.kind = "host";
  host.codec = "raw";
  host[TierStat::kObjects] = 40;
  host[TierStat::kUsedBytes] = 4096;
  host[TierStat::kCapacityBytes] = 1 << 20;
  host[TierStat::kHits] = 7;
  host[TierStat::kMisses] = 2;
  host[TierStat::kPuts] = 41;
  host[TierStat::kEvictions] = 5;
  host[TierStat::kPromotionsIn] = 3;
  host[TierStat::kBytesIn] = 5000;
  host[TierStat::kBytesOut] = 900;
  host.high_watermark = 0.9;
  host.low_watermark = 0.75;
  host.limit_bytes_per_s = 1.5e9;  // measured; the disk tier's is not (0)
  TierStatsSnapshot disk;
  disk.name = "disk";
  disk.kind = "disk";
  disk.codec = "zstd";
  disk[TierStat::kObjects] = 11;
  disk[TierStat::kUsedBytes] = 70000;
  disk[TierStat::kCapacityBytes] = 1 << 30;
  disk[TierStat::kHits] = 1;
  disk[TierStat::kEvictions] = 4;
  disk[TierStat::kDemotionsIn] = 5;
  disk[TierStat::kCorruptDetected] = 2;
  s.tiers = {host, disk};
  s[NodeStat::kLookups] = 9;
  s[NodeStat::kRequestedTokens] = 1000;
  s[NodeStat::kHitTokens] = 250;
  s[NodeStat::kLookupHitTokens] = 500;
  // What runtimes reported of their engines' requests (per request, not
  // per probe: fewer tokens, a higher rate).
  s[NodeStat::kEngineLookups] = 4;
  s[NodeStat::kEngineLookupTokens] = 320;
  s[NodeStat::kEngineLookupHitTokens] = 256;
  s[NodeStat::kEngineLoads] = 3;
  s[NodeStat::kEngineLoadTokens] = 240;
  s[NodeStat::kEngineLoadHitTokens] = 180;
  s[NodeStat::kGetChunks] = 123;
  s[NodeStat::kGetMisses] = 4;
  s[NodeStat::kGetBytes] = 65536;
  s[NodeStat::kPutChunks] = 44;
  s[NodeStat::kPutBytes] = 32768;
  s[NodeStat::kPutRefused] = 1;
  s[NodeStat::kDeletes] = 6;
  s[NodeStat::kAuthFailures] = 2;
  s[NodeStat::kSessions] = 3;
  s[NodeStat::kDocuments] = 7;
  s[NodeStat::kRegistryLoadFailures] = 1;
  s.lookup_us = Latency(30, 1500);
  s.get_us = Latency(55, 2'000'000);  // 2 s in all
  s.put_us = Latency(0, 0);
  s.ttft_saved_ms = 1234.5;
  s.quotas.push_back(QuotaRow{"host", "tenant-a", 0, 1 << 20, 8192, 2, 5, 1, 3});
  return s;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool HasLine(const std::string& text, const std::string& line) {
  for (const std::string& l : Lines(text)) {
    if (l == line) return true;
  }
  return false;
}

// The value of the sample line that starts with `series` followed by a space.
std::string ValueOf(const std::string& text, const std::string& series) {
  for (const std::string& l : Lines(text)) {
    if (l.size() > series.size() && l.compare(0, series.size(), series) == 0 && l[series.size()] == ' ') {
      return l.substr(series.size() + 1);
    }
  }
  return "<absent>";
}

TEST(ServerMetrics, NodeCountersAndGauges) {
  const std::string text = RenderPrometheus(Populated());
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_get_chunks_total counter")) << text;
  EXPECT_TRUE(HasLine(text, "# HELP kdn_get_chunks_total Chunks served by get."));
  EXPECT_EQ(ValueOf(text, "kdn_get_chunks_total"), "123");
  EXPECT_EQ(ValueOf(text, "kdn_get_misses_total"), "4");
  EXPECT_EQ(ValueOf(text, "kdn_get_bytes_total"), "65536");
  EXPECT_EQ(ValueOf(text, "kdn_put_chunks_total"), "44");
  EXPECT_EQ(ValueOf(text, "kdn_put_bytes_total"), "32768");
  EXPECT_EQ(ValueOf(text, "kdn_put_refused_total"), "1");
  EXPECT_EQ(ValueOf(text, "kdn_deletes_total"), "6");
  EXPECT_EQ(ValueOf(text, "kdn_auth_failures_total"), "2");
  EXPECT_EQ(ValueOf(text, "kdn_lookups_total"), "9");
  EXPECT_EQ(ValueOf(text, "kdn_requested_tokens_total"), "1000");
  EXPECT_EQ(ValueOf(text, "kdn_hit_tokens_total"), "250");
  EXPECT_EQ(ValueOf(text, "kdn_lookup_hit_tokens_total"), "500");
  // The ratios are the engines' (reported), not the probes' (0.25, 0.5).
  EXPECT_EQ(ValueOf(text, "kdn_retrieve_hit_ratio"), "0.75");
  EXPECT_EQ(ValueOf(text, "kdn_lookup_hit_ratio"), "0.8");
  EXPECT_EQ(ValueOf(text, "kdn_engine_lookups_total"), "4");
  EXPECT_EQ(ValueOf(text, "kdn_engine_lookup_tokens_total"), "320");
  EXPECT_EQ(ValueOf(text, "kdn_engine_lookup_hit_tokens_total"), "256");
  EXPECT_EQ(ValueOf(text, "kdn_engine_loads_total"), "3");
  EXPECT_EQ(ValueOf(text, "kdn_engine_load_tokens_total"), "240");
  EXPECT_EQ(ValueOf(text, "kdn_engine_load_hit_tokens_total"), "180");
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_sessions gauge"));
  EXPECT_EQ(ValueOf(text, "kdn_sessions"), "3");
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_documents gauge"));
  EXPECT_EQ(ValueOf(text, "kdn_documents"), "7");
  EXPECT_EQ(ValueOf(text, "kdn_registry_load_failures_total"), "1");
  EXPECT_EQ(ValueOf(text, "kdn_uptime_seconds"), "12.5");
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_ttft_saved_seconds_total counter"));
  EXPECT_EQ(ValueOf(text, "kdn_ttft_saved_seconds_total"), "1.2345");
}

TEST(ServerMetrics, PerTierSeries) {
  const std::string text = RenderPrometheus(Populated());
  EXPECT_EQ(ValueOf(text, "kdn_tier_info{index=\"0\",tier=\"host\",kind=\"host\",codec=\"raw\"}"), "1");
  EXPECT_EQ(ValueOf(text, "kdn_tier_info{index=\"1\",tier=\"disk\",kind=\"disk\",codec=\"zstd\"}"), "1");
  EXPECT_EQ(ValueOf(text, "kdn_tier_objects{index=\"0\",tier=\"host\"}"), "40");
  EXPECT_EQ(ValueOf(text, "kdn_tier_objects{index=\"1\",tier=\"disk\"}"), "11");
  EXPECT_EQ(ValueOf(text, "kdn_tier_used_bytes{index=\"1\",tier=\"disk\"}"), "70000");
  EXPECT_EQ(ValueOf(text, "kdn_tier_capacity_bytes{index=\"0\",tier=\"host\"}"), "1048576");
  EXPECT_EQ(ValueOf(text, "kdn_tier_high_watermark_ratio{index=\"0\",tier=\"host\"}"), "0.9");
  EXPECT_EQ(ValueOf(text, "kdn_tier_low_watermark_ratio{index=\"0\",tier=\"host\"}"), "0.75");
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_tier_hits_total counter"));
  EXPECT_EQ(ValueOf(text, "kdn_tier_hits_total{index=\"0\",tier=\"host\"}"), "7");
  EXPECT_EQ(ValueOf(text, "kdn_tier_misses_total{index=\"0\",tier=\"host\"}"), "2");
  EXPECT_EQ(ValueOf(text, "kdn_tier_puts_total{index=\"0\",tier=\"host\"}"), "41");
  EXPECT_EQ(ValueOf(text, "kdn_tier_evictions_total{index=\"1\",tier=\"disk\"}"), "4");
  EXPECT_EQ(ValueOf(text, "kdn_tier_demotions_in_total{index=\"1\",tier=\"disk\"}"), "5");
  EXPECT_EQ(ValueOf(text, "kdn_tier_promotions_in_total{index=\"0\",tier=\"host\"}"), "3");
  EXPECT_EQ(ValueOf(text, "kdn_tier_corrupt_objects_total{index=\"1\",tier=\"disk\"}"), "2");
  EXPECT_EQ(ValueOf(text, "kdn_tier_written_bytes_total{index=\"0\",tier=\"host\"}"), "5000");
  EXPECT_EQ(ValueOf(text, "kdn_tier_read_bytes_total{index=\"0\",tier=\"host\"}"), "900");
  // The limit: a gauge for the measured tiers only (0 would read as a tier
  // that delivers nothing).
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_tier_limit_bytes_per_second gauge"));
  EXPECT_EQ(ValueOf(text, "kdn_tier_limit_bytes_per_second{index=\"0\",tier=\"host\"}"), "1500000000");
  EXPECT_EQ(ValueOf(text, "kdn_tier_limit_bytes_per_second{index=\"1\",tier=\"disk\"}"), "<absent>");
  // No tier measured: no family at all (a HELP/TYPE block with no samples).
  NodeStats unmeasured = Populated();
  unmeasured.tiers[0].limit_bytes_per_s = 0;
  EXPECT_EQ(RenderPrometheus(unmeasured).find("kdn_tier_limit_bytes_per_second"), std::string::npos);
}

TEST(ServerMetrics, HistogramsInSecondsEndingAtTheCount) {
  const std::string text = RenderPrometheus(Populated());
  EXPECT_TRUE(HasLine(text, "# TYPE kdn_get_duration_seconds histogram"));
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_count"), "55");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_sum"), "2");
  // kLatencyBoundsUs[0] = 50 µs, [1] = 100 µs, [4] = 1 ms; bucket i holds min(55, 10(i+1)).
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"5e-05\"}"), "10");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"0.0001\"}"), "20");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"0.001\"}"), "50");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"10\"}"), "55");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"+Inf\"}"),
            ValueOf(text, "kdn_get_duration_seconds_count"));
  EXPECT_EQ(ValueOf(text, "kdn_lookup_duration_seconds_bucket{le=\"+Inf\"}"), "30");
  EXPECT_EQ(ValueOf(text, "kdn_lookup_duration_seconds_sum"), "0.0015");
  // An empty histogram still has its buckets, all zero, and a +Inf of 0.
  EXPECT_EQ(ValueOf(text, "kdn_put_duration_seconds_bucket{le=\"0.0025\"}"), "0");
  EXPECT_EQ(ValueOf(text, "kdn_put_duration_seconds_bucket{le=\"+Inf\"}"), "0");
  // One bucket line per bound, plus +Inf.
  int buckets = 0;
  for (const std::string& l : Lines(text)) {
    if (l.rfind("kdn_get_duration_seconds_bucket{", 0) == 0) ++buckets;
  }
  EXPECT_EQ(buckets, static_cast<int>(std::size(kLatencyBoundsUs)) + 1);
}

TEST(ServerMetrics, TornBucketsAreMadeCumulativeAndCappedAtTheCount) {
  // Buckets and count are read from live atomics one after another, so a
  // snapshot may be torn: a bucket above a later one, or above the count.
  NodeStats s;
  s.get_us.summary.count = 5;
  s.get_us.buckets.assign(std::size(kLatencyBoundsUs), 5);
  s.get_us.buckets[0] = 3;
  s.get_us.buckets[1] = 2;  // below its predecessor
  s.get_us.buckets[2] = 7;  // above the count
  const std::string text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"5e-05\"}"), "3");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"0.0001\"}"), "3");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"0.00025\"}"), "5");
  EXPECT_EQ(ValueOf(text, "kdn_get_duration_seconds_bucket{le=\"+Inf\"}"), "5");
}

TEST(ServerMetrics, ShortBucketListFromAnOlderPeerKeepsWhatItHas) {
  NodeStats s;
  s.put_us.summary.count = 4;
  s.put_us.buckets = {1, 2};
  const std::string text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_put_duration_seconds_bucket{le=\"5e-05\"}"), "1");
  EXPECT_EQ(ValueOf(text, "kdn_put_duration_seconds_bucket{le=\"0.0001\"}"), "2");
  EXPECT_EQ(ValueOf(text, "kdn_put_duration_seconds_bucket{le=\"0.00025\"}"), "<absent>");
  EXPECT_EQ(ValueOf(text, "kdn_put_duration_seconds_bucket{le=\"+Inf\"}"), "4");
}

// Two tiers of one name (two disks) were one series to Prometheus, which
// dropped the second as a duplicate: each series carries the tier's place.
TEST(ServerMetrics, TwoTiersOfOneNameAreTwoSeries) {
  NodeStats s = Populated();
  s.tiers[0].name = "disk";
  const std::string text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_tier_objects{index=\"0\",tier=\"disk\"}"), "40");
  EXPECT_EQ(ValueOf(text, "kdn_tier_objects{index=\"1\",tier=\"disk\"}"), "11");
  EXPECT_EQ(ValueOf(text, "kdn_tier_info{index=\"0\",tier=\"disk\",kind=\"host\",codec=\"raw\"}"), "1");
}

// Usage by namespace and model: a row per pair up to the bound, then one
// "other" row for the rest, so no client grows the page by inventing
// namespaces or models; a namespace the token file names is labelled by its
// name, another by its hash; a model by its fingerprint.
TEST(ServerMetrics, UsageSeriesAreLabelledAndBounded) {
  UsageBook book(2);
  const keys::Digest a = keys::NamespaceHash("tenant-a"), b = keys::NamespaceHash("tenant-b");
  book.SetNamespaceNames({{a, "tenant-a"}});
  keys::Digest m1{}, m2{};
  m1[0] = 0xab;
  m1[5] = 0xcd;
  m2[0] = 0x12;
  UsageCounts c;
  c.load_tokens = 100;
  c.load_hit_tokens = 80;
  book.Add(a, m1, c);
  book.Add(a, m1, c);
  UsageCounts put;
  put.put_bytes = 4096;
  book.Add(b, keys::Digest{}, put);
  for (int i = 0; i < 5; ++i) book.Add(a, m2, c);  // a third pair: past the bound
  NodeStats s;
  s.usage = book.Rows();
  ASSERT_EQ(s.usage.size(), 3u);
  const std::string page = RenderPrometheus(s);
  const std::string b_label = "ns:" + keys::ToHex(b).substr(0, 8);
  EXPECT_NE(page.find("kdn_usage_load_tokens_total{namespace=\"tenant-a\",model=\"fp:ab00000000cd\"} 200\n"),
            std::string::npos) << page;
  EXPECT_NE(page.find("kdn_usage_load_hit_tokens_total{namespace=\"tenant-a\",model=\"fp:ab00000000cd\"} 160\n"),
            std::string::npos);
  EXPECT_NE(page.find("kdn_usage_put_bytes_total{namespace=\"" + b_label + "\",model=\"unknown\"} 4096\n"),
            std::string::npos);
  EXPECT_NE(page.find("kdn_usage_load_tokens_total{namespace=\"other\",model=\"other\"} 500\n"), std::string::npos);
  EXPECT_EQ(page.find("fp:120000000000"), std::string::npos);  // never a label of its own
  // Nothing yet: no family at all.
  EXPECT_EQ(RenderPrometheus(NodeStats{}).find("kdn_usage_"), std::string::npos);
}

// Quotas (issue 37): one series per tier and namespace the config names.
TEST(ServerMetrics, QuotaSeriesAreLabelledByTierAndNamespace) {
  const std::string page = RenderPrometheus(Populated());
  const std::string labels = "{index=\"0\",tier=\"host\",namespace=\"tenant-a\"}";
  EXPECT_EQ(ValueOf(page, "kdn_namespace_quota_bytes" + labels), "1048576") << page;
  EXPECT_EQ(ValueOf(page, "kdn_namespace_used_bytes" + labels), "8192");
  EXPECT_EQ(ValueOf(page, "kdn_namespace_objects" + labels), "2");
  EXPECT_EQ(ValueOf(page, "kdn_namespace_quota_evictions_total" + labels), "5");
  EXPECT_EQ(ValueOf(page, "kdn_namespace_room_evictions_total" + labels), "1");
  EXPECT_EQ(ValueOf(page, "kdn_namespace_quota_refusals_total" + labels), "3");
  EXPECT_EQ(RenderPrometheus(NodeStats{}).find("kdn_namespace_"), std::string::npos);
}

TEST(ServerMetrics, BuildInfoTierIoErrorsAndKvEvents) {
  NodeStats s = Populated();
  s.tiers[1][TierStat::kIoErrors] = 3;
  PrometheusOptions o;
  std::string text = RenderPrometheus(s, o);
  EXPECT_EQ(ValueOf(text, "kdn_build_info{version=\"" KDN_TEST_VERSION "\",protocol=\"" +
                              std::to_string(wire::node::PROTOCOL_VERSION) + "\"}"),
            "1")
      << text;
  EXPECT_EQ(ValueOf(text, "kdn_tier_io_errors_total{index=\"1\",tier=\"disk\"}"), "3");
  EXPECT_EQ(text.find("kdn_kv_events_"), std::string::npos);  // no publisher: no series
  EXPECT_EQ(text.find("process_"), std::string::npos);
  o.kv_events = true;
  o.kv_events_queued = 10;
  o.kv_events_dropped = 2;
  text = RenderPrometheus(s, o);
  EXPECT_EQ(ValueOf(text, "kdn_kv_events_queued_total"), "10");
  EXPECT_EQ(ValueOf(text, "kdn_kv_events_dropped_total"), "2");
  EXPECT_EQ(ValueOf(text, "kdn_kv_events_send_errors_total"), "0");
}

// The process's series, as Prometheus' client libraries name them, read
// from /proc/self: this test process's own.
TEST(ServerMetrics, ProcessSeriesAreThisProcesses) {
  PrometheusOptions o;
  o.process_metrics = true;
  const std::string text = RenderPrometheus(NodeStats{}, o);
  const auto number = [&](const std::string& name) {
    const std::string v = ValueOf(text, name);
    return v == "<absent>" ? -1.0 : std::stod(v);
  };
  EXPECT_GT(number("process_resident_memory_bytes"), 1e6) << text;
  EXPECT_GE(number("process_virtual_memory_bytes"), number("process_resident_memory_bytes"));
  EXPECT_GE(number("process_cpu_seconds_total"), 0.0);
  EXPECT_GE(number("process_open_fds"), 3.0);  // stdin, stdout, stderr at least
  EXPECT_GE(number("process_max_fds"), number("process_open_fds"));
  // Started after 2020 and not in the future.
  EXPECT_GT(number("process_start_time_seconds"), 1.58e9);
  EXPECT_LE(number("process_start_time_seconds"), static_cast<double>(std::time(nullptr)) + 1);
  EXPECT_TRUE(HasLine(text, "# TYPE process_cpu_seconds_total counter"));
}

TEST(ServerMetrics, TierNameIsEscapedInLabels) {
  NodeStats s = Populated();
  s.tiers[1].name = "dis\"k\\2\nx";
  const std::string text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_tier_objects{index=\"1\",tier=\"dis\\\"k\\\\2\\nx\"}"), "11") << text;
  EXPECT_EQ(text.find("dis\"k"), std::string::npos);
}

TEST(ServerMetrics, RatiosAreZeroBeforeAnyRequestAndAtMostOne) {
  NodeStats s;
  std::string text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_retrieve_hit_ratio"), "0");
  EXPECT_EQ(ValueOf(text, "lmcache:retrieve_hit_rate"), "0");
  s[NodeStat::kRequestedTokens] = 10;
  s[NodeStat::kHitTokens] = 30;  // gets of tokens whose lookup did not declare them
  text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_retrieve_hit_ratio"), "1");
}

// Without reports (runtimes older than protocol 4) the ratios are the
// probes'; once a runtime reported, the engines' alone.
TEST(ServerMetrics, RatiosAreTheEnginesOnceReportedElseTheProbes) {
  NodeStats s;
  s[NodeStat::kRequestedTokens] = 400;  // 80-token requests, 64 cached: five probes each
  s[NodeStat::kLookupHitTokens] = 176;
  s[NodeStat::kHitTokens] = 88;
  std::string text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_lookup_hit_ratio"), "0.44");
  EXPECT_EQ(ValueOf(text, "kdn_retrieve_hit_ratio"), "0.22");
  EXPECT_EQ(ValueOf(text, "lmcache:num_lookup_tokens_total"), "0");  // counters: reports only
  s[NodeStat::kEngineLookupTokens] = 80;
  s[NodeStat::kEngineLookupHitTokens] = 64;
  s[NodeStat::kEngineLoadTokens] = 80;
  s[NodeStat::kEngineLoadHitTokens] = 64;
  text = RenderPrometheus(s);
  EXPECT_EQ(ValueOf(text, "kdn_lookup_hit_ratio"), "0.8");
  EXPECT_EQ(ValueOf(text, "kdn_retrieve_hit_ratio"), "0.8");
  EXPECT_EQ(ValueOf(text, "lmcache:lookup_hit_rate"), "0.8");
  EXPECT_EQ(ValueOf(text, "lmcache:num_lookup_tokens_total"), "80");
}

TEST(ServerMetrics, NoTiersNoTierFamilies) {
  const std::string text = RenderPrometheus(NodeStats{});
  for (const std::string& l : Lines(text)) {
    EXPECT_NE(l.rfind("kdn_tier_", 0), 0u) << l;
    EXPECT_EQ(l.find("# TYPE kdn_tier_"), std::string::npos) << l;
  }
  EXPECT_EQ(ValueOf(text, "kdn_get_chunks_total"), "0");
  EXPECT_EQ(ValueOf(text, "lmcache:local_cache_usage"), "0");
}

TEST(ServerMetrics, LmcacheAliasesCarryKdnValues) {
  const std::string text = RenderPrometheus(Populated());
  EXPECT_TRUE(HasLine(text, "# TYPE lmcache:num_hit_tokens_total counter"));
  // LMCache counts per engine request: the reported values.
  EXPECT_EQ(ValueOf(text, "lmcache:num_hit_tokens_total"), "180");
  EXPECT_EQ(ValueOf(text, "lmcache:num_requested_tokens_total"), "240");
  EXPECT_EQ(ValueOf(text, "lmcache:num_lookup_tokens_total"), "320");
  EXPECT_EQ(ValueOf(text, "lmcache:num_lookup_hits_total"), "256");
  EXPECT_EQ(ValueOf(text, "lmcache:num_lookup_requests_total"), "4");
  EXPECT_TRUE(HasLine(text, "# TYPE lmcache:retrieve_hit_rate gauge"));
  EXPECT_EQ(ValueOf(text, "lmcache:retrieve_hit_rate"), "0.75");
  EXPECT_EQ(ValueOf(text, "lmcache:lookup_hit_rate"), "0.8");
  EXPECT_EQ(ValueOf(text, "lmcache:local_cache_usage"), "4096");     // the host tier
  EXPECT_EQ(ValueOf(text, "lmcache:local_storage_usage"), "70000");  // the disk tier
  EXPECT_EQ(ValueOf(text, "lmcache:local_cpu_evict_keys_count_total"), "5");
  EXPECT_TRUE(HasLine(text, "# TYPE lmcache:time_to_retrieve histogram"));
  EXPECT_EQ(ValueOf(text, "lmcache:time_to_retrieve_bucket{le=\"0.0001\"}"), "20");
  EXPECT_EQ(ValueOf(text, "lmcache:time_to_retrieve_bucket{le=\"+Inf\"}"), "55");
  EXPECT_EQ(ValueOf(text, "lmcache:time_to_store_count"), "0");
  EXPECT_EQ(ValueOf(text, "lmcache:time_to_lookup_count"), "30");

  const std::string plain = RenderPrometheus(Populated(), PrometheusOptions{.lmcache_names = false});
  EXPECT_EQ(plain.find("lmcache:"), std::string::npos);
  EXPECT_EQ(ValueOf(plain, "kdn_hit_tokens_total"), "250");
}

// Every sample belongs to a family declared once with HELP then TYPE, and
// every counter family ends in _total.
TEST(ServerMetrics, EveryFamilyHasHelpAndTypeOnce) {
  const std::string text = RenderPrometheus(Populated());
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  for (const std::string& l : Lines(text)) {
    std::istringstream in(l);
    std::string hash, kind, name, rest;
    if (l.rfind("# HELP ", 0) == 0) {
      in >> hash >> kind >> name;
      std::getline(in, rest);
      EXPECT_FALSE(rest.empty()) << l;
      EXPECT_TRUE(helped.insert(name).second) << "second HELP: " << l;
    } else if (l.rfind("# TYPE ", 0) == 0) {
      in >> hash >> kind >> name >> rest;
      EXPECT_TRUE(helped.count(name)) << "TYPE before HELP: " << l;
      EXPECT_TRUE(types.emplace(name, rest).second) << "second TYPE: " << l;
      if (rest == "counter") {
        EXPECT_TRUE(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0) << l;
      }
    } else {
      ASSERT_FALSE(l.empty());
      std::string series = l.substr(0, l.find_first_of("{ "));
      if (!types.count(series)) {
        for (const char* suffix : {"_bucket", "_sum", "_count"}) {
          const std::string sfx = suffix;
          if (series.size() > sfx.size() && series.compare(series.size() - sfx.size(), sfx.size(), sfx) == 0) {
            series.resize(series.size() - sfx.size());
            break;
          }
        }
        EXPECT_EQ(types[series], "histogram") << l;
      }
    }
  }
  EXPECT_GT(types.size(), 30u);
}

TEST(ServerMetrics, HealthBody) {
  EXPECT_EQ(RenderHealth(true), "serving\n");
  EXPECT_EQ(RenderHealth(false), "draining\n");
}

// promtool: its parser must accept the page, and its linter must find
// nothing in kdn's own names.
struct Promtool {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Promtool RunPromtool(const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "kdn_metrics_" + std::to_string(::getpid()) + "_" +
      ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".prom";
  {
    std::ofstream f(path, std::ios::binary);
    f << text;
  }
  Promtool r;
  const std::string cmd = "promtool check metrics < '" + path + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::remove(path.c_str());
  return r;
}

bool PromtoolPresent() {
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) return true;
  return false;
}

#define KDN_NEED_PROMTOOL()                                                              \
  do {                                                                                   \
    if (!PromtoolPresent()) {                                                            \
      if (std::getenv("KDN_REQUIRE_PROMTOOL") != nullptr) {                              \
        FAIL() << "promtool is not on PATH and KDN_REQUIRE_PROMTOOL is set";             \
      }                                                                                  \
      GTEST_SKIP() << "promtool is not on PATH (install Debian's prometheus package)"; \
    }                                                                                    \
  } while (0)

TEST(ServerMetricsPromtool, KdnNamesAreLintClean) {
  KDN_NEED_PROMTOOL();
  for (const NodeStats& s : {Populated(), NodeStats{}}) {
    const Promtool r = RunPromtool(RenderPrometheus(s, PrometheusOptions{.lmcache_names = false}));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output, "");
  }
}

TEST(ServerMetricsPromtool, LmcacheAliasesOnlyDrawTheColonNotice) {
  // The default page parses; the linter's only remarks are about the ':' of
  // LMCache's names (a naming convention; see metrics.h), which kdnd keeps
  // so that LMCache's boards work. promtool exits 3 for lint-only findings.
  KDN_NEED_PROMTOOL();
  const Promtool r = RunPromtool(RenderPrometheus(Populated()));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const std::vector<std::string> lines = Lines(r.output);
  EXPECT_FALSE(lines.empty());
  for (const std::string& l : lines) {
    EXPECT_EQ(l.rfind("lmcache:", 0), 0u) << l;
    EXPECT_NE(l.find("metric names should not contain ':'"), std::string::npos) << l;
  }
}

// The schema (core/wire/node_stats.h) is the one list of the node's
// statistics: each travels through the Cap'n Proto field its row names (a
// typo would throw in ToWire) and back, lands on its Prometheus series, and
// no two rows share a field or a series.
TEST(StatsSchema, EveryStatisticTravelsByItsFieldAndIsRendered) {
  NodeStats s;
  for (std::size_t k = 0; k < kNodeStatCount; ++k) s.values[k] = 1000 + k;
  TierStatsSnapshot t;
  t.name = "host";
  t.kind = "host";
  for (std::size_t k = 0; k < kTierStatCount; ++k) t.values[k] = 2000 + k;
  s.tiers.push_back(t);

  capnp::MallocMessageBuilder message;
  ToWire(s, message.initRoot<wire::node::Stats>());
  const wire::node::Stats::Reader wire = message.getRoot<wire::node::Stats>().asReader();
  // The rows name the fields the schema means (spot checks through the typed getters).
  EXPECT_EQ(wire.getLookups(), 1000 + static_cast<std::size_t>(NodeStat::kLookups));
  EXPECT_EQ(wire.getHitTokens(), 1000 + static_cast<std::size_t>(NodeStat::kHitTokens));
  EXPECT_EQ(wire.getRegistryLoadFailures(), 1000 + static_cast<std::size_t>(NodeStat::kRegistryLoadFailures));
  EXPECT_EQ(wire.getTiers()[0].getObjects(), 2000 + static_cast<std::size_t>(TierStat::kObjects));
  EXPECT_EQ(wire.getTiers()[0].getBytesOut(), 2000 + static_cast<std::size_t>(TierStat::kBytesOut));
  const NodeStats back = FromWire(wire);
  EXPECT_EQ(back.values, s.values);
  ASSERT_EQ(back.tiers.size(), 1u);
  EXPECT_EQ(back.tiers[0].values, t.values);
  EXPECT_TRUE(back.quotas.empty());

  const std::string text = RenderPrometheus(s);
  std::set<std::string> fields, series;
  for (std::size_t k = 0; k < kNodeStatCount; ++k) {
    EXPECT_EQ(ValueOf(text, kNodeStats[k].metric), std::to_string(1000 + k)) << kNodeStats[k].metric;
    EXPECT_TRUE(HasLine(text, std::string("# TYPE ") + kNodeStats[k].metric +
                                  (kNodeStats[k].kind == StatKind::kCounter ? " counter" : " gauge")));
    EXPECT_TRUE(fields.insert(kNodeStats[k].wire).second) << kNodeStats[k].wire;
    EXPECT_TRUE(series.insert(kNodeStats[k].metric).second) << kNodeStats[k].metric;
  }
  fields.clear();
  for (std::size_t k = 0; k < kTierStatCount; ++k) {
    EXPECT_EQ(ValueOf(text, std::string(kTierStats[k].metric) + "{index=\"0\",tier=\"host\"}"), std::to_string(2000 + k))
        << kTierStats[k].metric;
    EXPECT_TRUE(fields.insert(kTierStats[k].wire).second) << kTierStats[k].wire;
    EXPECT_TRUE(series.insert(kTierStats[k].metric).second) << kTierStats[k].metric;
  }
}

// The namespaces' quotas (protocol version 5) travel as Stats.quotas, every
// field of every row, in order; a Stats without them (a node before version
// 5) reads as none.
TEST(StatsSchema, QuotaRowsTravelWithTheStats) {
  NodeStats s;
  s.tiers.resize(2);
  s.tiers[0].name = "host";
  s.tiers[1].name = "disk";
  s.quotas.push_back(QuotaRow{"host", "tenant-a", 0, 4096, 3072, 3, 11, 12, 13});
  s.quotas.push_back(QuotaRow{"disk", "tenant-b", 1, 1ull << 40, (1ull << 40) - 1, 21, 22, 23, 24});
  capnp::MallocMessageBuilder message;
  ToWire(s, message.initRoot<wire::node::Stats>());
  const wire::node::Stats::Reader wire = message.getRoot<wire::node::Stats>().asReader();
  ASSERT_EQ(wire.getQuotas().size(), 2u);
  EXPECT_EQ(std::string(wire.getQuotas()[1].getNs().cStr()), "tenant-b");
  EXPECT_EQ(wire.getQuotas()[1].getTierIndex(), 1u);
  EXPECT_EQ(wire.getQuotas()[0].getRoomEvictions(), 12u);
  const NodeStats back = FromWire(wire);
  ASSERT_EQ(back.quotas.size(), s.quotas.size());
  for (size_t i = 0; i < s.quotas.size(); ++i) {
    const QuotaRow &a = s.quotas[i], &b = back.quotas[i];
    EXPECT_EQ(b.tier, a.tier) << i;
    EXPECT_EQ(b.ns, a.ns) << i;
    EXPECT_EQ(b.index, a.index) << i;
    EXPECT_EQ(b.quota_bytes, a.quota_bytes) << i;
    EXPECT_EQ(b.used_bytes, a.used_bytes) << i;
    EXPECT_EQ(b.objects, a.objects) << i;
    EXPECT_EQ(b.quota_evictions, a.quota_evictions) << i;
    EXPECT_EQ(b.room_evictions, a.room_evictions) << i;
    EXPECT_EQ(b.refused, a.refused) << i;
  }

  capnp::MallocMessageBuilder old;
  old.initRoot<wire::node::Stats>().setLookups(1);  // a node before version 5 sets no quotas
  EXPECT_TRUE(FromWire(old.getRoot<wire::node::Stats>().asReader()).quotas.empty());
}

}  // namespace
}  // namespace kdn::server
