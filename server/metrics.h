// SPDX-License-Identifier: Apache-2.0
// kdnd's /metrics and /healthz bodies: a NodeStats snapshot rendered in the
// Prometheus text exposition format 0.0.4. The families are built by hand
// as prometheus-cpp MetricFamily values and written by its TextSerializer
// (which escapes label values); nothing is registered anywhere, so each
// scrape renders exactly the snapshot it is given.
// Thread-safety: pure functions of their arguments; call from any thread.
//
// Names. kdn's own series are `kdn_*`, lint-clean for `promtool check
// metrics` (counters end in _total, base units: seconds, bytes, ratios).
// Where LMCache exposes a value with the same meaning, the value is ALSO
// emitted under LMCache's exact exposed name, so LMCache's Grafana boards
// and scripts work against a kdnd. LMCache's names come from
// lmcache/observability.py (PrometheusLogger) in github.com/LMCache/LMCache;
// its counters are prometheus_client Counters, which expose `<name>_total`,
// so the `_total` below is part of the name a board queries.
//
//   kdn                              LMCache alias                            value / notes
//   -------------------------------  ---------------------------------------  -------------------------------
//   kdn_engine_lookups_total         lmcache:num_lookup_requests_total        engine requests looked up, as the
//                                                                               runtimes reported them (report)
//   kdn_engine_load_tokens_total     lmcache:num_requested_tokens_total       tokens engine loads asked for
//   kdn_engine_lookup_tokens_total   lmcache:num_lookup_tokens_total          tokens engine lookups had
//   kdn_engine_load_hit_tokens_total lmcache:num_hit_tokens_total             tokens this node delivered to loads
//   kdn_engine_lookup_hit_tokens_total lmcache:num_lookup_hits_total          leading tokens this node held
//   kdn_retrieve_hit_ratio           lmcache:retrieve_hit_rate                load hit / load tokens since start
//                                                                               (LMCache's: since its last log);
//                                                                               per probe (kdn_hit_tokens_total
//                                                                               / kdn_requested_tokens_total)
//                                                                               while no runtime has reported
//   kdn_lookup_hit_ratio             lmcache:lookup_hit_rate                  lookup hit / lookup tokens,
//                                                                               likewise
// (kdn_lookups_total, kdn_requested_tokens_total and kdn_lookup_hit_tokens_total
// count per probe: each key run a runtime asked about, several per engine
// request; kdn_hit_tokens_total the tokens of the chunks get served.)
//   kdn_tier_used_bytes{tier}        lmcache:local_cache_usage                sum over tiers of kind "host"
//                                    lmcache:local_storage_usage              sum over tiers of kind "disk"
//   kdn_tier_evictions_total{tier}   lmcache:local_cpu_evict_keys_count_total objects evicted, host tiers
//   kdn_get_duration_seconds         lmcache:time_to_retrieve                 histogram, kdn's buckets
//                                                                               (kLatencyBoundsUs, in s)
//   kdn_put_duration_seconds         lmcache:time_to_store                    histogram, likewise
//   kdn_lookup_duration_seconds      lmcache:time_to_lookup                   histogram, likewise
//
// kdn-only series: kdn_get_chunks_total, kdn_get_misses_total,
// kdn_get_bytes_total, kdn_put_chunks_total, kdn_put_bytes_total,
// kdn_put_refused_total, kdn_deletes_total, kdn_auth_failures_total,
// kdn_sessions, kdn_uptime_seconds, kdn_ttft_saved_seconds_total,
// kdn_build_info{version,protocol}, kdn_kv_events_{queued,dropped,send_errors}_total
// (with KV events), the process_* series (PrometheusOptions::process_metrics);
// per tier {index="<place in the chain>",tier="<name>"}:
// kdn_tier_info{index,tier,kind,codec} (always 1),
// kdn_tier_objects, kdn_tier_used_bytes, kdn_tier_capacity_bytes,
// kdn_tier_high_watermark_ratio, kdn_tier_low_watermark_ratio, and the
// counters kdn_tier_{hits,misses,puts,evictions,demotions_in,
// promotions_in,corrupt_objects}_total, kdn_tier_written_bytes_total (bytes
// stored into the tier), kdn_tier_read_bytes_total (bytes served from it) and
// kdn_tier_io_errors_total;
// kdn_tier_limit_bytes_per_second (the read rate measured at start, for the
// tiers measured: server.measure_tiers).
//
// LMCache aliases carry no labels: LMCache labels its series with the
// engine's model_name / worker_id / role / served_model_name, which a
// shared node does not have, so board panels that select on those labels
// need them removed. LMCache series with no kdn counterpart
// (num_stored_tokens, retrieve/store request counts, remote_* and p2p_*,
// the per-stage profiling histograms) are not emitted. Note `promtool check
// metrics` flags every `lmcache:` name ("metric names should not contain
// ':'", a convention for recording rules); Prometheus itself scrapes them
// fine. Turn them off with PrometheusOptions::lmcache_names for a
// lint-clean page.
#pragma once

#include <cstdint>
#include <string>

#include "core/wire/node_stats.h"

namespace kdn::server {

struct PrometheusOptions {
  // Also emit the LMCache-named aliases of the table above.
  bool lmcache_names = true;
  // The serving process's own series, under the names Prometheus' client
  // libraries give them (process_resident_memory_bytes,
  // process_virtual_memory_bytes, process_cpu_seconds_total,
  // process_open_fds, process_max_fds, process_start_time_seconds), read
  // from /proc/self when the page is rendered: kdnd's /metrics sets it.
  bool process_metrics = false;
  // The KV event publisher's counts (kdn_kv_events_{queued,dropped,send_errors}_total),
  // when the node publishes events.
  bool kv_events = false;
  std::uint64_t kv_events_queued = 0, kv_events_dropped = 0, kv_events_send_errors = 0;
};

// The /metrics body (Content-Type "text/plain; version=0.0.4").
std::string RenderPrometheus(const NodeStats& s, const PrometheusOptions& options = {});

// The /healthz body: "serving\n" or "draining\n" (the HTTP status says the
// same: 200 or 503; the body is for humans and curl).
std::string RenderHealth(bool serving);

}  // namespace kdn::server
