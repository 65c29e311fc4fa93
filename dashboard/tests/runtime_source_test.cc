// SPDX-License-Identifier: Apache-2.0
// RuntimeSource over a real runtime made through the C ABI: the reference
// model's KV (models/reference/kv260k.{k,v}.f32: stories260K, 48 positions)
// stored and retrieved, then read back as a Snapshot; the polling worker's
// snapshots, and stop.
#include <kdn/kdn.h>

#include <QScopeGuard>
#include <QSignalSpy>
#include <QtTest>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/keys/hash.h"
#include "runtime_source.h"

namespace kdn::dash {
namespace {

constexpr int kLayers = 5, kPositions = 48, kRow = 4 * 8;  // 4 KV heads of 8 dims
constexpr std::uint32_t kChunkTokens = 16;
const std::int32_t kTokens[kPositions] = {1,   403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315,
                                          421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
                                          292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358,
                                          394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266};

std::string ModelsDir() {
  const char* env = std::getenv("KDN_MODELS");
  return env != nullptr && *env != '\0' ? env : KDN_MODELS_DIR;
}

// The reference KV in the canonical layout [layer][k|v][token][head][dim]
// (empty when the files are missing or not the expected size).
std::vector<float> ReferenceCanonical() {
  const size_t file_floats = static_cast<size_t>(kLayers) * kPositions * kRow;
  std::vector<float> file[2];
  const char* suffix[2] = {"k", "v"};
  for (int kv = 0; kv < 2; ++kv) {
    std::ifstream in(ModelsDir() + "/reference/kv260k." + suffix[kv] + ".f32", std::ios::binary | std::ios::ate);
    if (!in || static_cast<size_t>(in.tellg()) != file_floats * 4) return {};
    in.seekg(0);
    file[kv].resize(file_floats);
    in.read(reinterpret_cast<char*>(file[kv].data()), static_cast<std::streamsize>(file_floats * 4));
    if (!in) return {};
  }
  // Each file is [layer][position][head][dim]: the same rows, K and V apart.
  std::vector<float> canonical;
  canonical.reserve(2 * file_floats);
  for (int l = 0; l < kLayers; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto begin = file[kv].begin() + static_cast<std::ptrdiff_t>(l) * kPositions * kRow;
      canonical.insert(canonical.end(), begin, begin + kPositions * kRow);
    }
  }
  return canonical;
}

kdn_kv_view CanonicalView(std::vector<float>& kv) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.data = kv.data();
  v.size_bytes = kv.size() * sizeof(float);
  return v;
}

}  // namespace

class RuntimeSourceTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void cleanupTestCase();
  void readShowsHitsTokensAndTierOccupancy();
  void ttftSavedIsTokensServedTimesThePrefillRate();
  void hitRateIsTheLookupsOnceTheEngineLooksUp();
  void documentsAreListedMostHitFirst();
  void startDeliversSnapshotsUntilStop();
  void theWorkerListsDocumentsEveryDocumentsInterval();
  void noRuntimeIsAClearStateNotACrash();
  void tierLimitIsTheRateItsLoadsWereMeasuredAt();
  void faultsAndTtftBasisAreTheRuntimes();
  void quotasAreTheTiersNamedWhereTheSourceKnowsTheNamespace();

 private:
  // Stores the reference KV under `ns` and retrieves it back (bit for bit).
  void StoreAndRetrieve(const char* ns);

  std::vector<float> ref_;
  kdn_runtime* runtime_ = nullptr;
  kdn_model* model_ = nullptr;
};

void RuntimeSourceTest::initTestCase() {
  ref_ = ReferenceCanonical();
  if (ref_.empty()) {
    const char* required = std::getenv("KDN_REQUIRE_MODELS");
    if (required != nullptr && std::string(required) == "1") QFAIL("the reference KV is missing (KDN_REQUIRE_MODELS=1)");
    QSKIP("the reference KV (models/reference/kv260k.*.f32) is missing: set KDN_MODELS");
  }
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  host.kind = KDN_TIER_HOST;
  host.capacity_bytes = 16u << 20;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.chunk_tokens = kChunkTokens;
  o.tiers = &host;
  o.num_tiers = 1;
  QCOMPARE(kdn_runtime_create(&o, &runtime_), KDN_OK);
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = kLayers;
  spec.num_kv_heads = 4;
  spec.head_dim = 8;
  spec.dtype = KDN_DTYPE_F32;
  spec.fingerprint = "stories260K";
  spec.fingerprint_len = 11;
  QCOMPARE(kdn_model_create(runtime_, &spec, &model_), KDN_OK);
}

void RuntimeSourceTest::cleanupTestCase() {
  kdn_model_destroy(model_);
  kdn_runtime_destroy(runtime_);
}

void RuntimeSourceTest::StoreAndRetrieve(const char* ns) {
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = kTokens;
  req.num_tokens = kPositions;
  kdn_kv_view in = CanonicalView(ref_);
  kdn_kv_result stored = KDN_KV_RESULT_INIT;
  QCOMPARE(kdn_kv_store(model_, ns, std::strlen(ns), &req, &in, 1, &stored), KDN_OK);
  QCOMPARE(stored.tokens, std::uint64_t{kPositions});
  std::vector<float> out(ref_.size(), -7.0f);
  kdn_kv_view ov = CanonicalView(out);
  kdn_kv_result got = KDN_KV_RESULT_INIT;
  QCOMPARE(kdn_kv_retrieve(model_, ns, std::strlen(ns), &req, &ov, 1, &got), KDN_OK);
  QCOMPARE(got.tokens, std::uint64_t{kPositions});
  QVERIFY(out == ref_);
}

void RuntimeSourceTest::readShowsHitsTokensAndTierOccupancy() {
  const Snapshot before = RuntimeSource::Read(runtime_, {});
  QCOMPARE(before.source, QStringLiteral("runtime (in process)"));
  QCOMPARE(before.tiers.size(), 1);
  QCOMPARE(before.tiers[0].objects, std::uint64_t{0});

  StoreAndRetrieve("tenant-a");
  const Snapshot s = RuntimeSource::Read(runtime_, {});
  kdn_stats st = KDN_STATS_INIT;
  QCOMPARE(kdn_runtime_get_stats(runtime_, &st), KDN_OK);
  QCOMPARE(s.hit_tokens, before.hit_tokens + kPositions);
  QCOMPARE(s.hit_tokens, st.tokens_served);
  QCOMPARE(s.requested_tokens, st.tokens_requested);
  QCOMPARE(s.requested_tokens, before.requested_tokens + kPositions);
  QCOMPARE(s.stores, before.stores + 1);
  QCOMPARE(s.loads, before.loads + 1);
  QCOMPARE(s.failed_loads, before.failed_loads);
  QCOMPARE(s.corrupt_detected, std::uint64_t{0});
  QVERIFY(s.time_ms > 0);
  QVERIFY(s.delivery_ms > 0);  // one retrieve, measured
  QCOMPARE(s.delivery_ms, static_cast<double>(st.delivery_ns) / 1e6);
  QCOMPARE(s.ttft_saved_ms, 0.0);  // no prefill reported, no fallback rate

  QCOMPARE(s.tiers.size(), 1);
  const TierSample& t = s.tiers[0];
  QCOMPARE(t.kind, QStringLiteral("host"));
  QVERIFY(!t.name.isEmpty());
  kdn_tier_stats direct = KDN_TIER_STATS_INIT;
  QCOMPARE(kdn_runtime_get_tier_stats(runtime_, 0, &direct), KDN_OK);
  QCOMPARE(t.name, QString::fromUtf8(direct.name));
  QCOMPARE(t.codec, QString::fromUtf8(direct.codec));
  QCOMPARE(t.objects, before.tiers[0].objects + kPositions / kChunkTokens);
  QCOMPARE(t.capacity_bytes, std::uint64_t{16} << 20);
  // 3 chunks of 16 tokens x 1,280 bytes, each in whole 4 KiB pages.
  QCOMPARE(t.used_bytes, before.tiers[0].used_bytes + 3 * ((16 * 1280 + 4095) / 4096 * 4096));
  QVERIFY(t.puts >= before.tiers[0].puts + 3);
  QVERIFY(t.hits >= before.tiers[0].hits + 3);
  QVERIFY(t.bytes_in > before.tiers[0].bytes_in);
  QCOMPARE(t.high_watermark, direct.high_watermark);  // the defaults, 0.95 and 0.85
  QVERIFY(t.high_watermark > 0.94 && t.high_watermark < 0.96);
  QCOMPARE(t.low_watermark, direct.low_watermark);
  QVERIFY(t.low_watermark > 0.84 && t.low_watermark < 0.86);

  // A miss: a namespace nothing was stored under.
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = kTokens;
  req.num_tokens = kPositions;
  std::vector<float> out(ref_.size());
  kdn_kv_view ov = CanonicalView(out);
  kdn_kv_result got = KDN_KV_RESULT_INIT;
  QCOMPARE(kdn_kv_retrieve(model_, "nobody", 6, &req, &ov, 1, &got), KDN_OK);
  QCOMPARE(got.tokens, std::uint64_t{0});
  const Snapshot after_miss = RuntimeSource::Read(runtime_, {});
  QCOMPARE(after_miss.loads, s.loads + 1);
  QCOMPARE(after_miss.failed_loads, s.failed_loads + 1);
  QCOMPARE(after_miss.hit_tokens, s.hit_tokens);
  QCOMPARE(after_miss.requested_tokens, s.requested_tokens + kPositions);
  QVERIFY(after_miss.delivery_ms > s.delivery_ms);  // a miss costs time too
}

void RuntimeSourceTest::hitRateIsTheLookupsOnceTheEngineLooksUp() {
  StoreAndRetrieve("tenant-c");
  const Snapshot loads = RuntimeSource::Read(runtime_, {});
  kdn_stats st = KDN_STATS_INIT;
  QCOMPARE(kdn_runtime_get_stats(runtime_, &st), KDN_OK);
  QCOMPARE(st.lookup_tokens, std::uint64_t{0});
  QCOMPARE(loads.requested_tokens, st.tokens_requested);  // no lookups yet: the loads
  QCOMPARE(loads.hit_tokens, st.tokens_served);
  // Two lookups: all 48 tokens found, then 40 tokens in a namespace with
  // nothing (none found).
  kdn_request reqs[2] = {KDN_REQUEST_INIT, KDN_REQUEST_INIT};
  reqs[0].tokens = kTokens;
  reqs[0].num_tokens = kPositions;
  kdn_lookup_result found = KDN_LOOKUP_RESULT_INIT;
  QCOMPARE(kdn_kv_lookup(model_, "tenant-c", 8, reqs, 1, &found), KDN_OK);
  QCOMPARE(found.cached_tokens, std::uint64_t{kPositions});
  reqs[1].tokens = kTokens;
  reqs[1].num_tokens = 40;
  QCOMPARE(kdn_kv_lookup(model_, "nobody", 6, &reqs[1], 1, &found), KDN_OK);
  QCOMPARE(found.cached_tokens, std::uint64_t{0});
  const Snapshot s = RuntimeSource::Read(runtime_, {});
  QCOMPARE(s.requested_tokens, std::uint64_t{kPositions + 40});
  QCOMPARE(s.hit_tokens, std::uint64_t{kPositions});
  QCOMPARE(s.served_tokens, loads.served_tokens);  // lookups serve nothing
}

void RuntimeSourceTest::documentsAreListedMostHitFirst() {
  // Two knowledge items of the reference KV: "cold" (the first 16 tokens)
  // never fetched, "hot" (all 48: 3 chunks) fetched twice and pinned.
  kdn_kv_view in = CanonicalView(ref_);
  QCOMPARE(kdn_knowledge_put(model_, "docs", 4, "hot", 3, 1, "", 0, kTokens, kPositions, &in, 1), KDN_OK);
  QCOMPARE(kdn_knowledge_put(model_, "docs", 4, "cold", 4, 1, "", 0, kTokens, 16, &in, 1), KDN_OK);
  std::vector<float> out(ref_.size());
  kdn_kv_view ov = CanonicalView(out);
  ov.num_tokens = kPositions;  // a fetch's views say their room
  std::vector<std::int32_t> tokens(kPositions);
  for (int i = 0; i < 2; ++i) {
    kdn_kv_result got = KDN_KV_RESULT_INIT;
    QVERIFY2(kdn_knowledge_fetch(model_, "docs", 4, "hot", 3, &ov, 1, tokens.data(), tokens.size(), &got) == KDN_OK,
             kdn_last_error_message());
    QCOMPARE(got.tokens, std::uint64_t{kPositions});
  }
  QCOMPARE(kdn_knowledge_pin(model_, "docs", 4, "hot", 3, 60000), KDN_OK);

  RuntimeSourceOptions o;
  const Snapshot none = RuntimeSource::Read(runtime_, o);  // no model given: nothing listed
  QVERIFY(none.documents_top.isEmpty());
  o.model = model_;
  o.namespaces = {"docs", "nobody"};
  const Snapshot s = RuntimeSource::Read(runtime_, o);
  QCOMPARE(s.documents, std::uint64_t{2});
  QCOMPARE(s.documents_top.size(), 2);
  const DocumentSample& hot = s.documents_top[0];
  QCOMPARE(hot.doc_id, QStringLiteral("hot"));
  QCOMPARE(hot.ns, QStringLiteral("docs"));
  QCOMPARE(hot.hits, std::uint64_t{6});  // 2 fetches x 3 chunks
  QCOMPARE(hot.chunks, 3u);
  QCOMPARE(hot.chunks_held, 3u);
  QVERIFY(hot.pinned);
  QVERIFY(hot.pin_expires_ms > s.time_ms && hot.pin_expires_ms <= s.time_ms + 60000);
  QCOMPARE(s.documents_top[1].doc_id, QStringLiteral("cold"));
  QCOMPARE(s.documents_top[1].hits, std::uint64_t{0});
  QVERIFY(!s.documents_top[1].pinned);
  o.documents_top = 1;
  QCOMPARE(RuntimeSource::Read(runtime_, o).documents_top.size(), 1);
}

void RuntimeSourceTest::ttftSavedIsTokensServedTimesThePrefillRate() {
  StoreAndRetrieve("tenant-b");
  // No prefill reported yet: the tokens served are unpriced; a fallback
  // rate prices them, none leaves them out.
  RuntimeSourceOptions none;
  none.prefill_us_per_token = 0;
  const Snapshot zero = RuntimeSource::Read(runtime_, none);
  QVERIFY(zero.served_tokens >= kPositions);
  QCOMPARE(zero.ttft_saved_ms, 0.0);
  RuntimeSourceOptions fallback;
  fallback.prefill_us_per_token = 250;
  const Snapshot priced = RuntimeSource::Read(runtime_, fallback);
  QCOMPARE(priced.served_tokens, zero.served_tokens);
  QCOMPARE(priced.ttft_saved_ms, static_cast<double>(priced.served_tokens) * 250.0 / 1000.0);

  // The engine reports its prefills (48 tokens in 96 us, 16 in 64 us: a
  // mean of 2,500 ns per token); a later load is priced at that mean.
  QCOMPARE(kdn_model_report_prefill(model_, kPositions, 96000), KDN_OK);
  QCOMPARE(kdn_model_report_prefill(model_, 16, 64000), KDN_OK);
  StoreAndRetrieve("tenant-b");
  const Snapshot measured = RuntimeSource::Read(runtime_, none);
  QCOMPARE(measured.served_tokens, zero.served_tokens + kPositions);
  QCOMPARE(measured.ttft_saved_ms, kPositions * 2500.0 / 1e6);
  const Snapshot both = RuntimeSource::Read(runtime_, fallback);
  QCOMPARE(both.ttft_saved_ms, kPositions * 2500.0 / 1e6 + static_cast<double>(zero.served_tokens) * 250.0 / 1000.0);
  // What the view says TTFT saved is made of: measured, at the mean of the
  // reported prefills (64 tokens in 160 us: 2.5 us per token).
  QCOMPARE(measured.ttft_basis, Snapshot::TtftBasis::kMeasured);
  QCOMPARE(measured.prefill_us_per_token, 2.5);
}

// A tier's delivery limit in-process: the rate its loads were measured at
// (kdn_tier_stats.delivery_ns_per_token x the model's KV bytes per token),
// and 0 (not measured: the bandwidth view draws no bar) until a load.
void RuntimeSourceTest::tierLimitIsTheRateItsLoadsWereMeasuredAt() {
  // A runtime of its own: no load has been served from its tier.
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  host.kind = KDN_TIER_HOST;
  host.capacity_bytes = 16u << 20;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.chunk_tokens = kChunkTokens;
  o.tiers = &host;
  o.num_tiers = 1;
  kdn_runtime* fresh = nullptr;
  QCOMPARE(kdn_runtime_create(&o, &fresh), KDN_OK);
  auto destroy = qScopeGuard([&] { kdn_runtime_destroy(fresh); });
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = kLayers;
  spec.num_kv_heads = 4;
  spec.head_dim = 8;
  spec.dtype = KDN_DTYPE_F32;
  spec.fingerprint = "stories260K";
  spec.fingerprint_len = 11;
  kdn_model* model = nullptr;
  QCOMPARE(kdn_model_create(fresh, &spec, &model), KDN_OK);
  auto destroy_model = qScopeGuard([&] { kdn_model_destroy(model); });
  RuntimeSourceOptions with_model;
  with_model.model = model;
  const Snapshot before = RuntimeSource::Read(fresh, with_model);
  QCOMPARE(before.tiers.size(), 1);
  QCOMPARE(before.tiers[0].limit_bytes_per_s, 0.0);  // not measured yet
  QVERIFY(before.tiers[0].limit_from_loads);

  // A store and a load: the tier's delivery time per token is measured.
  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = kTokens;
  req.num_tokens = kPositions;
  kdn_kv_view in = CanonicalView(ref_);
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  QCOMPARE(kdn_kv_store(model, "t", 1, &req, &in, 1, &r), KDN_OK);
  std::vector<float> out(ref_.size());
  kdn_kv_view ov = CanonicalView(out);
  QCOMPARE(kdn_kv_retrieve(model, "t", 1, &req, &ov, 1, &r), KDN_OK);
  QCOMPARE(r.tokens, std::uint64_t{kPositions});
  kdn_tier_stats direct = KDN_TIER_STATS_INIT;
  QCOMPARE(kdn_runtime_get_tier_stats(fresh, 0, &direct), KDN_OK);
  QVERIFY2(direct.delivery_ns_per_token > 0, "a load measures its tier");
  std::uint64_t kv_bytes = 0;
  QCOMPARE(kdn_model_get_kv_bytes_per_token(model, &kv_bytes), KDN_OK);
  QCOMPARE(kv_bytes, std::uint64_t{kLayers} * 2 * kRow * 4);  // 1,280 bytes
  const Snapshot s = RuntimeSource::Read(fresh, with_model);
  QVERIFY(s.tiers[0].limit_from_loads);
  // A raw host tier stores the KV as it is: its bytes per token are the model's.
  QCOMPARE(direct.bytes_before_encoding, std::uint64_t{0});
  const double want = static_cast<double>(kv_bytes) * 1e9 / direct.delivery_ns_per_token;
  QVERIFY2(std::abs(s.tiers[0].limit_bytes_per_s - want) <= want * 1e-9,
           qPrintable(QStringLiteral("%1 != %2").arg(s.tiers[0].limit_bytes_per_s).arg(want)));
  // Without the model the KV size per token is not known: not measured.
  QCOMPARE(RuntimeSource::Read(fresh, {}).tiers[0].limit_bytes_per_s, 0.0);
}

void RuntimeSourceTest::faultsAndTtftBasisAreTheRuntimes() {
  const Snapshot s = RuntimeSource::Read(runtime_, {});
  kdn_tier_stats direct = KDN_TIER_STATS_INIT;
  QCOMPARE(kdn_runtime_get_tier_stats(runtime_, 0, &direct), KDN_OK);
  // A runtime tells decode and seal failures apart (none here).
  QVERIFY(s.reports_decode_failures);
  QCOMPARE(s.tiers[0].decode_failures, direct.decode_failures);
  QCOMPARE(s.tiers[0].auth_failures, direct.auth_failures);
  QCOMPARE(s.auth_failures, std::uint64_t{0});
  QCOMPARE(s.ttft_basis, Snapshot::TtftBasis::kMeasured);
}

// A runtime whose host tier gives two namespaces quotas
// (kdn_tier_config.quotas): each reading carries them, as
// kdn_runtime_get_quota_stats reports them, named where the source was told
// the namespace (RuntimeSourceOptions::namespaces), else by its hash.
void RuntimeSourceTest::quotasAreTheTiersNamedWhereTheSourceKnowsTheNamespace() {
  kdn_quota quotas[2] = {KDN_QUOTA_INIT, KDN_QUOTA_INIT};
  quotas[0].ns = "tenant-a";
  quotas[0].ns_len = 8;
  quotas[0].bytes = 48u << 10;  // two of the reference KV's three 16-token chunks (20 KiB each, raw)
  quotas[1].ns = "tenant-b";
  quotas[1].ns_len = 8;
  quotas[1].bytes = 1u << 20;
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  host.kind = KDN_TIER_HOST;
  host.capacity_bytes = 16u << 20;
  host.quotas = quotas;
  host.num_quotas = 2;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.chunk_tokens = kChunkTokens;
  o.tiers = &host;
  o.num_tiers = 1;
  kdn_runtime* rt = nullptr;
  QCOMPARE(kdn_runtime_create(&o, &rt), KDN_OK);
  auto destroy = qScopeGuard([&] { kdn_runtime_destroy(rt); });
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = kLayers;
  spec.num_kv_heads = 4;
  spec.head_dim = 8;
  spec.dtype = KDN_DTYPE_F32;
  spec.fingerprint = "stories260K";
  spec.fingerprint_len = 11;
  kdn_model* model = nullptr;
  QCOMPARE(kdn_model_create(rt, &spec, &model), KDN_OK);
  auto destroy_model = qScopeGuard([&] { kdn_model_destroy(model); });
  RuntimeSourceOptions named;
  named.namespaces = {"tenant-a"};
  {
    const Snapshot s = RuntimeSource::Read(rt, named);
    QCOMPARE(s.quotas.size(), 2);  // configured: there before any chunk
    QCOMPARE(s.quotas[0].used_bytes, std::uint64_t{0});
  }

  kdn_request req = KDN_REQUEST_INIT;
  req.tokens = kTokens;
  req.num_tokens = kPositions;
  kdn_kv_view in = CanonicalView(ref_);
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  QCOMPARE(kdn_kv_store(model, "tenant-a", 8, &req, &in, 1, &r), KDN_OK);
  QCOMPARE(kdn_kv_store(model, "tenant-b", 8, &req, &in, 1, &r), KDN_OK);

  kdn_quota_stats direct[2] = {KDN_QUOTA_STATS_INIT, KDN_QUOTA_STATS_INIT};
  size_t count = 0;
  QCOMPARE(kdn_runtime_get_quota_stats(rt, 0, direct, 2, &count), KDN_OK);
  QCOMPARE(count, size_t{2});
  const Snapshot s = RuntimeSource::Read(rt, named);
  QCOMPARE(s.quotas.size(), 2);
  for (int i = 0; i < 2; ++i) {
    const QuotaSample& q = s.quotas[i];
    QCOMPARE(q.tier, s.tiers[0].name);
    QCOMPARE(q.tier_index, 0);
    QCOMPARE(q.quota_bytes, direct[i].quota_bytes);
    QCOMPARE(q.used_bytes, direct[i].used_bytes);
    QCOMPARE(q.objects, direct[i].objects);
    QCOMPARE(q.quota_evictions, direct[i].quota_evictions);
    QCOMPARE(q.room_evictions, direct[i].room_evictions);
    QCOMPARE(q.refused, direct[i].refused);
    QVERIFY(q.used_bytes > 0);
    QVERIFY(q.used_bytes <= q.quota_bytes);
  }
  QCOMPARE(s.quotas[0].ns, QStringLiteral("tenant-a"));
  QCOMPARE(s.quotas[0].quota_bytes, std::uint64_t{48} << 10);
  // Three chunks into a quota of two: each held or evicted by its own puts.
  QVERIFY(s.quotas[0].quota_evictions > 0);
  QCOMPARE(s.quotas[0].objects + s.quotas[0].quota_evictions, std::uint64_t{kPositions / kChunkTokens});
  QCOMPARE(s.quotas[1].objects, std::uint64_t{kPositions / kChunkTokens});  // within its quota: none lost
  QCOMPARE(s.quotas[1].quota_evictions, std::uint64_t{0});
  // tenant-b was not named to the source: its hash's first 8 hex digits.
  const keys::Digest b = keys::NamespaceHash("tenant-b");
  QCOMPARE(s.quotas[1].ns, QLatin1Char('#') + QString::fromLatin1(QByteArray(reinterpret_cast<const char*>(b.data()), 4).toHex()));
  QCOMPARE(s.quotas[1].ns.size(), 9);
  // A reading without the document listing still names them.
  QCOMPARE(RuntimeSource::Read(rt, named, false).quotas[0].ns, QStringLiteral("tenant-a"));
  QCOMPARE(RuntimeSource::Read(rt, {}).quotas[0].ns.left(1), QStringLiteral("#"));
}

void RuntimeSourceTest::startDeliversSnapshotsUntilStop() {
  RuntimeSourceOptions o;
  o.interval_ms = 20;
  RuntimeSource src(runtime_, o);
  QCOMPARE(src.state(), Source::State::kStopped);
  QCOMPARE(src.describe(), QStringLiteral("runtime (in process)"));
  QSignalSpy snaps(&src, &Source::snapshot);
  QSignalSpy states(&src, &Source::stateChanged);
  src.start();
  QCOMPARE(src.state(), Source::State::kConnected);
  QCOMPARE(states.size(), 1);
  QCOMPARE(states.last().at(0).value<Source::State>(), Source::State::kConnected);
  QTRY_VERIFY_WITH_TIMEOUT(snaps.size() >= 3, 5000);
  const std::uint64_t stores = snaps.last().at(0).value<Snapshot>().stores;

  // New traffic shows in a later snapshot.
  StoreAndRetrieve("tenant-c");
  QTRY_VERIFY_WITH_TIMEOUT(snaps.last().at(0).value<Snapshot>().stores == stores + 1, 5000);
  const Snapshot last = snaps.last().at(0).value<Snapshot>();
  QCOMPARE(last.tiers.size(), 1);
  QVERIFY(last.uptime_ms > 0);

  src.stop();
  QCOMPARE(src.state(), Source::State::kStopped);
  QCOMPARE(states.last().at(0).value<Source::State>(), Source::State::kStopped);
  const qsizetype n = snaps.size(), changes = states.size();
  QTest::qWait(200);  // ten intervals: a queued or late one would show
  QCOMPARE(snaps.size(), n);
  QCOMPARE(states.size(), changes);
}

// The worker lists documents every documents_interval_ms and carries the last
// listing between: a document put after a listing shows only at the next.
void RuntimeSourceTest::theWorkerListsDocumentsEveryDocumentsInterval() {
  kdn_kv_view in = CanonicalView(ref_);
  QCOMPARE(kdn_knowledge_put(model_, "listed", 6, "a", 1, 1, "", 0, kTokens, 16, &in, 1), KDN_OK);
  RuntimeSourceOptions o;
  o.interval_ms = 20;
  o.model = model_;
  o.namespaces = {"listed"};
  o.documents_interval_ms = 600000;  // one listing in this test
  {
    RuntimeSource src(runtime_, o);
    QSignalSpy snaps(&src, &Source::snapshot);
    src.start();
    QTRY_VERIFY_WITH_TIMEOUT(snaps.size() >= 2, 5000);
    QCOMPARE(kdn_knowledge_put(model_, "listed", 6, "b", 1, 1, "", 0, kTokens, 16, &in, 1), KDN_OK);
    const qsizetype seen = snaps.size();
    QTRY_VERIFY_WITH_TIMEOUT(snaps.size() >= seen + 3, 5000);
    for (const QList<QVariant>& args : snaps) {
      const Snapshot s = args.at(0).value<Snapshot>();
      QCOMPARE(s.documents, std::uint64_t{1});  // the first listing, carried
      QCOMPARE(s.documents_top.size(), 1);
      QCOMPARE(s.documents_top[0].doc_id, QStringLiteral("a"));
    }
    src.stop();
  }
  o.documents_interval_ms = 0;  // every reading lists
  RuntimeSource src(runtime_, o);
  QSignalSpy snaps(&src, &Source::snapshot);
  src.start();
  QTRY_VERIFY_WITH_TIMEOUT(snaps.size() >= 1, 5000);
  QCOMPARE(snaps.last().at(0).value<Snapshot>().documents, std::uint64_t{2});
  src.stop();
}

void RuntimeSourceTest::noRuntimeIsAClearStateNotACrash() {
  const Snapshot s = RuntimeSource::Read(nullptr, {});
  QCOMPARE(s.tiers.size(), 0);
  QCOMPARE(s.hit_tokens, std::uint64_t{0});
  RuntimeSource src(nullptr, {});
  QSignalSpy states(&src, &Source::stateChanged);
  QSignalSpy snaps(&src, &Source::snapshot);
  src.start();
  QCOMPARE(src.state(), Source::State::kDisconnected);
  QCOMPARE(states.size(), 1);
  QVERIFY(!states.last().at(1).toString().isEmpty());
  QTest::qWait(50);
  QCOMPARE(snaps.size(), 0);
}

}  // namespace kdn::dash

QTEST_GUILESS_MAIN(kdn::dash::RuntimeSourceTest)
#include "runtime_source_test.moc"
