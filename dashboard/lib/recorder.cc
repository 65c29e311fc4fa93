// SPDX-License-Identifier: Apache-2.0
#include "recorder.h"

#include <algorithm>

namespace kdn::dash {
namespace {

// No interval: the first reading, a restart, or a clock that did not advance.
// The tiers are sized as the reading's, each without a rate.
Rates NoRate(const Snapshot& s) {
  Rates r;
  r.tiers.resize(s.tiers.size());
  return r;
}

// Whether a cumulative counter went down from `before` to `after` (the
// source restarted, or its counters were reset).
bool WentDown(const Snapshot& before, const Snapshot& after) {
  if (after.uptime_ms < before.uptime_ms || after.lookups < before.lookups ||
      after.requested_tokens < before.requested_tokens || after.hit_tokens < before.hit_tokens ||
      after.loads < before.loads || after.failed_loads < before.failed_loads || after.stores < before.stores ||
      after.corrupt_detected < before.corrupt_detected || after.ttft_saved_ms < before.ttft_saved_ms ||
      after.delivery_ms < before.delivery_ms || after.auth_failures < before.auth_failures) {
    return true;
  }
  for (const TierSample& a : after.tiers) {
    for (const TierSample& b : before.tiers) {
      if (b.name != a.name) continue;
      if (a.hits < b.hits || a.misses < b.misses || a.puts < b.puts || a.evictions < b.evictions ||
          a.demotions_in < b.demotions_in || a.promotions_in < b.promotions_in ||
          a.corrupt_detected < b.corrupt_detected || a.bytes_in < b.bytes_in || a.bytes_out < b.bytes_out ||
          a.io_errors < b.io_errors || a.decode_failures < b.decode_failures || a.auth_failures < b.auth_failures) {
        return true;
      }
    }
  }
  return false;
}

// The difference of two counters known not to go down, as a double.
double Delta(std::uint64_t before, std::uint64_t after) { return static_cast<double>(after - before); }

TierRates TierBetween(const TierSample& b, const TierSample& a, double seconds) {
  TierRates t;
  const double hits = Delta(b.hits, a.hits), reads = hits + Delta(b.misses, a.misses);
  t.hit_rate = reads > 0 ? hits / reads : -1;
  t.bytes_out_per_s = Delta(b.bytes_out, a.bytes_out) / seconds;
  t.bytes_in_per_s = Delta(b.bytes_in, a.bytes_in) / seconds;
  t.evictions_per_s = Delta(b.evictions, a.evictions) / seconds;
  t.demotions_per_s = Delta(b.demotions_in, a.demotions_in) / seconds;
  t.promotions_per_s = Delta(b.promotions_in, a.promotions_in) / seconds;
  t.corrupt_per_s = Delta(b.corrupt_detected, a.corrupt_detected) / seconds;
  t.io_errors_per_s = Delta(b.io_errors, a.io_errors) / seconds;
  t.decode_failures_per_s = Delta(b.decode_failures, a.decode_failures) / seconds;
  t.auth_failures_per_s = Delta(b.auth_failures, a.auth_failures) / seconds;
  return t;
}

const Snapshot kNoSnapshot;
const Rates kNoRates;

}  // namespace

Recorder::Recorder(std::size_t capacity, QObject* parent)
    : QObject(parent), capacity_(std::max<std::size_t>(capacity, 1)) {}

std::size_t Recorder::size() const { return static_cast<std::size_t>(ring_.size()); }

const Snapshot& Recorder::at(std::size_t i) const {
  if (i >= size()) return kNoSnapshot;
  return ring_[static_cast<qsizetype>((head_ + i) % size())];
}

const Snapshot& Recorder::latest() const { return size() == 0 ? kNoSnapshot : at(size() - 1); }

const Rates& Recorder::rates(std::size_t i) const {
  if (i >= size()) return kNoRates;
  return rates_[static_cast<qsizetype>((head_ + i) % size())];
}

std::uint64_t Recorder::total() const { return total_; }

void Recorder::clear() {
  ring_.clear();
  rates_.clear();
  head_ = 0;
  total_ = 0;
  emit cleared();
}

double Recorder::CumulativeHitRate(const Snapshot& s) {
  if (s.requested_tokens == 0) return -1;
  return static_cast<double>(s.hit_tokens) / static_cast<double>(s.requested_tokens);
}

Rates Recorder::Between(const Snapshot& before, const Snapshot& after) {
  const double seconds = static_cast<double>(after.time_ms - before.time_ms) / 1000.0;
  if (!(seconds > 0) || WentDown(before, after)) return NoRate(after);
  Rates r;
  r.seconds = seconds;
  const double requested = Delta(before.requested_tokens, after.requested_tokens);
  r.hit_rate = requested > 0 ? Delta(before.hit_tokens, after.hit_tokens) / requested : -1;
  r.ttft_saved_ms_per_min = (after.ttft_saved_ms - before.ttft_saved_ms) / seconds * 60.0;
  r.delivery_ms_per_min = (after.delivery_ms - before.delivery_ms) / seconds * 60.0;
  r.lookups_per_s = Delta(before.lookups, after.lookups) / seconds;
  r.loads_per_s = Delta(before.loads, after.loads) / seconds;
  r.failed_loads_per_s = Delta(before.failed_loads, after.failed_loads) / seconds;
  r.stores_per_s = Delta(before.stores, after.stores) / seconds;
  r.auth_failures_per_s = Delta(before.auth_failures, after.auth_failures) / seconds;
  r.tiers.reserve(after.tiers.size());
  for (const TierSample& a : after.tiers) {
    const auto b = std::find_if(before.tiers.begin(), before.tiers.end(),
                                [&](const TierSample& t) { return t.name == a.name; });
    r.tiers.push_back(b == before.tiers.end() ? TierRates{} : TierBetween(*b, a, seconds));
  }
  return r;
}

void Recorder::add(const Snapshot& s) {
  // Rates against the reading before (kept with the reading: the oldest
  // held still shows the rate to the one dropped before it).
  Rates r = size() == 0 ? NoRate(s) : Between(latest(), s);
  const bool dropped = size() == capacity_;
  if (dropped) {
    ring_[static_cast<qsizetype>(head_)] = s;
    rates_[static_cast<qsizetype>(head_)] = std::move(r);
    head_ = (head_ + 1) % capacity_;
  } else {
    // Not yet full: head_ is 0 and the readings are in order.
    ring_.push_back(s);
    rates_.push_back(std::move(r));
  }
  ++total_;
  emit added(dropped);
}

}  // namespace kdn::dash
