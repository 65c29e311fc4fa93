#include "core/wire/node_stats.h"

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
    b.setObjects(t.objects);
    b.setUsedBytes(t.used_bytes);
    b.setCapacityBytes(t.capacity_bytes);
    b.setHits(t.hits);
    b.setMisses(t.misses);
    b.setPuts(t.puts);
    b.setEvictions(t.evictions);
    b.setDemotionsIn(t.demotions_in);
    b.setPromotionsIn(t.promotions_in);
    b.setCorruptDetected(t.corrupt_detected);
    b.setBytesIn(t.bytes_in);
    b.setBytesOut(t.bytes_out);
    b.setHighWatermark(t.high_watermark);
    b.setLowWatermark(t.low_watermark);
    b.setLimitBytesPerS(t.limit_bytes_per_s);
  }
  out.setLookups(s.lookups);
  out.setRequestedTokens(s.requested_tokens);
  out.setHitTokens(s.hit_tokens);
  out.setLookupHitTokens(s.lookup_hit_tokens);
  out.setGetChunks(s.get_chunks);
  out.setGetMisses(s.get_misses);
  out.setGetBytes(s.get_bytes);
  out.setPutChunks(s.put_chunks);
  out.setPutBytes(s.put_bytes);
  out.setPutRefused(s.put_refused);
  out.setDeletes(s.deletes);
  out.setAuthFailures(s.auth_failures);
  out.setSessions(s.sessions);
  ToWire(s.lookup_us, out.initLookupUs());
  ToWire(s.get_us, out.initGetUs());
  ToWire(s.put_us, out.initPutUs());
  out.setTtftSavedMs(s.ttft_saved_ms);
  out.setDocuments(s.documents);
  out.setRegistryLoadFailures(s.registry_load_failures);
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
    x.objects = t.getObjects();
    x.used_bytes = t.getUsedBytes();
    x.capacity_bytes = t.getCapacityBytes();
    x.hits = t.getHits();
    x.misses = t.getMisses();
    x.puts = t.getPuts();
    x.evictions = t.getEvictions();
    x.demotions_in = t.getDemotionsIn();
    x.promotions_in = t.getPromotionsIn();
    x.corrupt_detected = t.getCorruptDetected();
    x.bytes_in = t.getBytesIn();
    x.bytes_out = t.getBytesOut();
    x.high_watermark = t.getHighWatermark();
    x.low_watermark = t.getLowWatermark();
    x.limit_bytes_per_s = t.getLimitBytesPerS();
    s.tiers.push_back(std::move(x));
  }
  s.lookups = in.getLookups();
  s.requested_tokens = in.getRequestedTokens();
  s.hit_tokens = in.getHitTokens();
  s.lookup_hit_tokens = in.getLookupHitTokens();
  s.get_chunks = in.getGetChunks();
  s.get_misses = in.getGetMisses();
  s.get_bytes = in.getGetBytes();
  s.put_chunks = in.getPutChunks();
  s.put_bytes = in.getPutBytes();
  s.put_refused = in.getPutRefused();
  s.deletes = in.getDeletes();
  s.auth_failures = in.getAuthFailures();
  s.sessions = in.getSessions();
  s.lookup_us = FromWire(in.getLookupUs());
  s.get_us = FromWire(in.getGetUs());
  s.put_us = FromWire(in.getPutUs());
  s.ttft_saved_ms = in.getTtftSavedMs();
  s.documents = in.getDocuments();
  s.registry_load_failures = in.getRegistryLoadFailures();
  return s;
}

}  // namespace kdn::server
