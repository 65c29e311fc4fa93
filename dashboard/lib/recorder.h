// SPDX-License-Identifier: Apache-2.0
// The recorder: a bounded history of snapshots (a ring buffer of `capacity`
// readings, so charts can show the last minutes), and the rates between two
// readings. It never grows past its capacity; a source restart (a counter
// that goes down: kdnd restarted) starts the rates again from that reading
// instead of showing a negative rate.
// Thread-safety: one thread (the UI thread); fed by Source::snapshot.
#pragma once

#include <QObject>
#include <QVector>

#include <cstddef>

#include "snapshot.h"

namespace kdn::dash {

// What changed between two readings, per second (hit rate as a fraction).
struct TierRates {
  double hit_rate = -1;          // hits / (hits + misses) over the interval; -1: no reads
  double bytes_out_per_s = 0;    // delivery bandwidth (bytes read from the tier)
  double bytes_in_per_s = 0;
  double evictions_per_s = 0, demotions_per_s = 0, promotions_per_s = 0;
  double corrupt_per_s = 0, io_errors_per_s = 0;
  double decode_failures_per_s = 0, auth_failures_per_s = 0;
};

struct Rates {
  double seconds = 0;            // the interval; 0: no rate (the first reading, or a restart)
  double hit_rate = -1;          // hit tokens / requested tokens over the interval; -1: no requests
  double ttft_saved_ms_per_min = 0;
  double delivery_ms_per_min = 0;
  double lookups_per_s = 0, loads_per_s = 0, failed_loads_per_s = 0, stores_per_s = 0;
  double auth_failures_per_s = 0;  // Snapshot::auth_failures
  QVector<TierRates> tiers;      // as the later reading's tiers
};

class Recorder : public QObject {
  Q_OBJECT
 public:
  explicit Recorder(std::size_t capacity = 3600, QObject* parent = nullptr);

  std::size_t capacity() const { return capacity_; }
  std::size_t size() const;             // readings held (<= capacity)
  const Snapshot& at(std::size_t i) const;  // 0: the oldest held; out of range: an empty reading
  const Snapshot& latest() const;       // size() > 0 (else an empty reading)
  // Between reading i-1 and i, kept with reading i: for i = 0, the rates to
  // the reading dropped before it (none for the first reading after clear()).
  const Rates& rates(std::size_t i) const;
  std::uint64_t total() const;          // readings ever added (the first held is total() - size())
  void clear();

  // Overall hit rate since the source started (its cumulative counters); -1: no requests.
  static double CumulativeHitRate(const Snapshot& s);
  static Rates Between(const Snapshot& before, const Snapshot& after);

 public slots:
  void add(const kdn::dash::Snapshot& s);

 signals:
  // A reading was added; when the history was full the oldest was dropped
  // first (dropped = true).
  void added(bool dropped);
  void cleared();

 private:
  std::size_t capacity_;
  QVector<Snapshot> ring_;   // capacity_ slots once full
  QVector<Rates> rates_;
  std::size_t head_ = 0;     // index in ring_ of the oldest held
  std::uint64_t total_ = 0;
};

}  // namespace kdn::dash
