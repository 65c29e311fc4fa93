// SPDX-License-Identifier: Apache-2.0
#include "core/telemetry/histogram.h"

#include <cmath>

namespace kdn::telemetry {
namespace {

constexpr double kFirst = 0.1;     // upper bound of bucket 0
constexpr double kGrowth = 1.1892;  // 2^(1/4)

}  // namespace

double Histogram::BucketLimit(int i) { return kFirst * std::pow(kGrowth, i); }

void Histogram::Record(double value) {
  if (!(value >= 0)) value = 0;  // NaN and negatives count as zero
  int b = value <= kFirst ? 0 : static_cast<int>(std::ceil(std::log(value / kFirst) / std::log(kGrowth)));
  if (b >= kBuckets) b = kBuckets - 1;
  if (b < 0) b = 0;
  buckets_[static_cast<size_t>(b)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  const auto milli = static_cast<std::uint64_t>(std::min(value, 1e15) * 1000.0);
  sum_milli_.fetch_add(milli, std::memory_order_relaxed);
  std::uint64_t seen = max_milli_.load(std::memory_order_relaxed);
  while (milli > seen && !max_milli_.compare_exchange_weak(seen, milli, std::memory_order_relaxed)) {
  }
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot s;
  std::array<std::uint64_t, kBuckets> b;
  for (int i = 0; i < kBuckets; ++i) {
    b[static_cast<size_t>(i)] = buckets_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
    s.count += b[static_cast<size_t>(i)];
  }
  s.sum = static_cast<double>(sum_milli_.load()) / 1000.0;
  s.max = static_cast<double>(max_milli_.load()) / 1000.0;
  auto quantile = [&](double q) {
    if (s.count == 0) return 0.0;
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(s.count)));
    std::uint64_t seen = 0;
    for (int i = 0; i < kBuckets; ++i) {
      seen += b[static_cast<size_t>(i)];
      if (seen >= rank) return std::min(BucketLimit(i), s.max);
    }
    return s.max;
  };
  s.p50 = quantile(0.50);
  s.p90 = quantile(0.90);
  s.p99 = quantile(0.99);
  return s;
}

std::uint64_t Histogram::CountAtOrBelow(double bound) const {
  std::uint64_t n = 0;
  for (int i = 0; i < kBuckets && BucketLimit(i) <= bound; ++i) {
    n += buckets_[static_cast<size_t>(i)].load(std::memory_order_relaxed);
  }
  return n;
}

}  // namespace kdn::telemetry
