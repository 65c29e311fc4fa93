// SPDX-License-Identifier: Apache-2.0
// Latency histograms: lock-free recording into logarithmic buckets (about
// 19% wide, from 0.1 µs to about 10^4 s), and snapshots with percentiles.
// Thread-safety: Record and Snapshot may be called concurrently.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace kdn::telemetry {

struct HistogramSnapshot {
  std::uint64_t count = 0;
  double sum = 0, max = 0;
  double p50 = 0, p90 = 0, p99 = 0;  // upper bounds of the buckets holding them
  double mean() const { return count ? sum / static_cast<double>(count) : 0.0; }
};

class Histogram {
 public:
  static constexpr int kBuckets = 160;
  void Record(double value);
  HistogramSnapshot Snapshot() const;
  // Values recorded in buckets whose upper bound is <= `bound`: those
  // certainly <= bound (a bucket straddling it is left out; buckets are
  // about 19% wide). For Prometheus' cumulative buckets.
  std::uint64_t CountAtOrBelow(double bound) const;
  // Upper bound of bucket i.
  static double BucketLimit(int i);

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets> buckets_{};
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_milli_{0};  // sum in 1/1000 units
  std::atomic<std::uint64_t> max_milli_{0};
};

}  // namespace kdn::telemetry
