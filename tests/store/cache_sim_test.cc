// SPDX-License-Identifier: Apache-2.0
#include "lab/sim/cache_sim.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

namespace kdn::store {
namespace {

// 1000 documents of 8 chunks (a working set of 8000 objects), 20/80 skew.
ZipfWorkload Workload(std::uint64_t seed = 42, std::uint64_t requests = 50'000) {
  return ZipfWorkload{.documents = 1000, .exponent = kZipfExponent8020, .chunks_per_doc = 8,
                      .requests = requests, .seed = seed};
}

TEST(ZipfSampler, CdfIsAProbabilityDistribution) {
  const ZipfSampler z(100, 1.0);
  EXPECT_EQ(z.size(), 100u);
  EXPECT_EQ(z.CdfBelow(0), 0.0);
  EXPECT_EQ(z.CdfBelow(100), 1.0);
  EXPECT_EQ(z.CdfBelow(1000), 1.0);
  double h = 0;
  for (int k = 1; k <= 100; ++k) h += 1.0 / k;
  EXPECT_NEAR(z.CdfBelow(1), 1.0 / h, 1e-12);  // P(rank 0) = 1 / H_100
  EXPECT_NEAR(z.CdfBelow(2) - z.CdfBelow(1), 0.5 / h, 1e-12);
  for (std::uint64_t k = 1; k < 100; ++k) EXPECT_LT(z.CdfBelow(k), z.CdfBelow(k + 1));
}

TEST(ZipfSampler, RankInvertsTheCdf) {
  const ZipfSampler z(10, 1.2);
  EXPECT_EQ(z.Rank(0.0), 0u);
  EXPECT_EQ(z.Rank(std::nextafter(1.0, 0.0)), 9u);
  for (std::uint64_t k = 0; k < 10; ++k) {
    EXPECT_EQ(z.Rank(z.CdfBelow(k)), k);  // the left edge of k's interval
    EXPECT_EQ(z.Rank(std::nextafter(z.CdfBelow(k + 1), 0.0)), k);  // the right edge
  }
  const ZipfSampler uniform(4, 0.0);
  EXPECT_EQ(uniform.Rank(0.24), 0u);
  EXPECT_EQ(uniform.Rank(0.26), 1u);
  EXPECT_EQ(uniform.Rank(0.99), 3u);
}

TEST(ZipfSampler, FrequenciesFollowTheDistribution) {
  const ZipfSampler z(50, 1.0);
  std::mt19937_64 rng(7);
  std::vector<int> counts(50, 0);
  constexpr int kDraws = 200'000;
  for (int i = 0; i < kDraws; ++i) ++counts[z(rng)];
  for (std::uint64_t k : {0, 1, 4, 20}) {
    const double p = z.CdfBelow(k + 1) - z.CdfBelow(k);
    const double sd = std::sqrt(p * (1 - p) / kDraws);
    EXPECT_NEAR(counts[k] / static_cast<double>(kDraws), p, 5 * sd) << "rank " << k;
  }
}

TEST(ZipfWorkload, DeterministicBySeed) {
  const std::vector<std::uint64_t> a = ZipfRequests(Workload(1, 5000));
  EXPECT_EQ(a.size(), 5000u);
  EXPECT_EQ(a, ZipfRequests(Workload(1, 5000)));
  EXPECT_NE(a, ZipfRequests(Workload(2, 5000)));
  for (std::uint64_t d : a) EXPECT_LT(d, 1000u);
  // Deterministic across processes and machines: seed 1's first requests
  // and the simulation's hit rate on them, pinned.
  const std::vector<std::uint64_t> first(a.begin(), a.begin() + 8);
  EXPECT_EQ(first, (std::vector<std::uint64_t>{0, 0, 13, 0, 6, 486, 15, 0}));
  EXPECT_DOUBLE_EQ(SimulateHitRate(PolicyKind::kS3Fifo, 800, Workload(1, 5000)), 0.67333333333333334);
}

TEST(ZipfWorkload, ExponentGivesTheTwentyEightyRule) {
  // The constant is what the search finds for 1000 documents.
  const double s = ZipfExponentForShare(1000, 0.2, 0.8);
  EXPECT_NEAR(s, kZipfExponent8020, 5e-4);
  EXPECT_NEAR(ZipfTopShare(1000, s, 0.2), 0.8, 1e-9);
  EXPECT_NEAR(ZipfTopShare(1000, kZipfExponent8020, 0.2), 0.8, 1e-3);
  // The share grows with the exponent; 0 is uniform.
  EXPECT_NEAR(ZipfTopShare(1000, 0.0, 0.2), 0.2, 1e-12);
  EXPECT_LT(ZipfTopShare(1000, 0.8, 0.2), ZipfTopShare(1000, 1.2, 0.2));
  // On a generated trace, the top 20% of documents take ~80% of requests.
  for (std::uint64_t seed : {1, 2, 3}) EXPECT_NEAR(TopDocumentShare(Workload(seed)), 0.8, 0.02) << seed;
}

TEST(SimChunkKey, DistinctPerDocumentAndChunk) {
  std::set<keys::Digest> seen;
  for (std::uint64_t d = 0; d < 200; ++d)
    for (std::uint32_t c = 0; c < 16; ++c) EXPECT_TRUE(seen.insert(SimChunkKey(d, c)).second);
  EXPECT_EQ(SimChunkKey(5, 3), SimChunkKey(5, 3));
}

TEST(Simulate, EdgeCases) {
  const ZipfWorkload w = Workload(1, 2000);
  EXPECT_EQ(SimulateHitRate(PolicyKind::kLru, 0, w), 0.0);  // no cache, no hits
  // A cache holding the whole working set misses only the first read of each
  // chunk: count the documents first requested after the warm-up.
  const std::vector<std::uint64_t> docs = ZipfRequests(w);
  std::set<std::uint64_t> warm(docs.begin(), docs.begin() + 200), first_after;
  for (std::size_t r = 200; r < docs.size(); ++r)
    if (!warm.count(docs[r])) first_after.insert(docs[r]);
  const SimResult all = Simulate(PolicyKind::kLru, 8000, w);
  EXPECT_EQ(all.lookups, 1800u * 8);
  EXPECT_EQ(all.hits, all.lookups - 8 * first_after.size());
  EXPECT_EQ(all.hit_rate(), SimulateHitRate(PolicyKind::kS3Fifo, 8000, w));
  EXPECT_EQ(SimulateHitRate(PolicyKind::kLru, 10, ZipfWorkload{}), 0.0);
}

TEST(Simulate, S3FifoAtLeastLruAndBothRiseWithCapacity) {
  const ZipfWorkload w = Workload();
  const std::uint64_t working_set = w.documents * w.chunks_per_doc;
  double last_lru = 0, last_s3 = 0;
  for (double fraction : {0.1, 0.25, 0.5}) {
    const auto capacity = static_cast<std::uint64_t>(fraction * static_cast<double>(working_set));
    const double lru = SimulateHitRate(PolicyKind::kLru, capacity, w);
    const double s3 = SimulateHitRate(PolicyKind::kS3Fifo, capacity, w);
    RecordProperty("hit_rate_lru_" + std::to_string(capacity), std::to_string(lru));
    RecordProperty("hit_rate_s3fifo_" + std::to_string(capacity), std::to_string(s3));
    EXPECT_GE(s3, lru - 0.01) << "capacity " << capacity;
    EXPECT_GT(lru, last_lru + 0.02) << "capacity " << capacity;
    EXPECT_GT(s3, last_s3 + 0.02) << "capacity " << capacity;
    last_lru = lru;
    last_s3 = s3;
  }
}

}  // namespace
}  // namespace kdn::store
