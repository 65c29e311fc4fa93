// SPDX-License-Identifier: Apache-2.0
#include "core/wire/node_stats.h"

#include <capnp/dynamic.h>

namespace kdn::server {

namespace {

void ToWire(const LatencySnapshot& l, wire::node::Latency::Builder out) {
  out.setCount(l.summary.count);
  out.setSumUs(l.summary.sum);
  out.setP50Us(l.summary.p50);
  out.setP90Us(l.summary.p90);
  out.setP99Us(l.summary.p99);
  out.setMaxUs(l.summary.max);
}

LatencySnapshot FromWire(wire::node::Latency::Reader in) {
  LatencySnapshot l;
  l.summary.count = in.getCount();
  l.summary.sum = in.getSumUs();
  l.summary.p50 = in.getP50Us();
  l.summary.p90 = in.getP90Us();
  l.summary.p99 = in.getP99Us();
  l.summary.max = in.getMaxUs();
  return l;
}

}  // namespace

void ToWire(const NodeStats& s, wire::node::Stats::Builder out) {
  out.setTimeMs(s.time_ms);
  out.setUptimeMs(s.uptime_ms);
  auto tiers = out.initTiers(static_cast<unsigned>(s.tiers.size()));
  for (unsigned i = 0; i < s.tiers.size(); ++i) {
    const TierStatsSnapshot& t = s.tiers[i];
    auto b = tiers[i];
    b.setName(t.name);
    b.setKind(t.kind);
    b.setCodec(t.codec);
    capnp::DynamicStruct::Builder d = capnp::toDynamic(b);
    for (std::size_t k = 0; k < kTierStatCount; ++k) d.set(kTierStats[k].wire, t.values[k]);
    b.setHighWatermark(t.high_watermark);
    b.setLowWatermark(t.low_watermark);
    b.setLimitBytesPerS(t.limit_bytes_per_s);
  }
  capnp::DynamicStruct::Builder d = capnp::toDynamic(out);
  for (std::size_t k = 0; k < kNodeStatCount; ++k) d.set(kNodeStats[k].wire, s.values[k]);
  ToWire(s.lookup_us, out.initLookupUs());
  ToWire(s.get_us, out.initGetUs());
  ToWire(s.put_us, out.initPutUs());
  out.setTtftSavedMs(s.ttft_saved_ms);
  auto quotas = out.initQuotas(static_cast<unsigned>(s.quotas.size()));
  for (unsigned i = 0; i < s.quotas.size(); ++i) {
    const QuotaRow& q = s.quotas[i];
    auto b = quotas[i];
    b.setTier(q.tier);
    b.setNs(q.ns);
    b.setTierIndex(static_cast<std::uint32_t>(q.index));
    b.setQuotaBytes(q.quota_bytes);
    b.setUsedBytes(q.used_bytes);
    b.setObjects(q.objects);
    b.setQuotaEvictions(q.quota_evictions);
    b.setRoomEvictions(q.room_evictions);
    b.setRefused(q.refused);
  }
}

NodeStats FromWire(wire::node::Stats::Reader in) {
  NodeStats s;
  s.time_ms = in.getTimeMs();
  s.uptime_ms = in.getUptimeMs();
  for (auto t : in.getTiers()) {
    TierStatsSnapshot x;
    x.name = t.getName();
    x.kind = t.getKind();
    x.codec = t.getCodec();
    capnp::DynamicStruct::Reader d = capnp::toDynamic(t);
    for (std::size_t k = 0; k < kTierStatCount; ++k) x.values[k] = d.get(kTierStats[k].wire).as<std::uint64_t>();
    x.high_watermark = t.getHighWatermark();
    x.low_watermark = t.getLowWatermark();
    x.limit_bytes_per_s = t.getLimitBytesPerS();
    s.tiers.push_back(std::move(x));
  }
  capnp::DynamicStruct::Reader d = capnp::toDynamic(in);
  for (std::size_t k = 0; k < kNodeStatCount; ++k) s.values[k] = d.get(kNodeStats[k].wire).as<std::uint64_t>();
  s.lookup_us = FromWire(in.getLookupUs());
  s.get_us = FromWire(in.getGetUs());
  s.put_us = FromWire(in.getPutUs());
  s.ttft_saved_ms = in.getTtftSavedMs();
  for (auto q : in.getQuotas()) {  // none from a node before version 5
    QuotaRow r;
    r.tier = q.getTier();
    r.ns = q.getNs();
    r.index = q.getTierIndex();
    r.quota_bytes = q.getQuotaBytes();
    r.used_bytes = q.getUsedBytes();
    r.objects = q.getObjects();
    r.quota_evictions = q.getQuotaEvictions();
    r.room_evictions = q.getRoomEvictions();
    r.refused = q.getRefused();
    s.quotas.push_back(std::move(r));
  }
  return s;
}

}  // namespace kdn::server
