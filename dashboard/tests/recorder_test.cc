// SPDX-License-Identifier: Apache-2.0
// The recorder: its bounded history and the rates between two readings.
#include <QSignalSpy>
#include <QTest>

#include "recorder.h"

namespace kdn::dash {
namespace {

TierSample Tier(const QString& name) {
  TierSample t;
  t.name = name;
  t.kind = name;
  return t;
}

// A reading numbered n: its clock and every counter grow with n.
Snapshot Numbered(std::uint64_t n) {
  Snapshot s;
  s.time_ms = 1'700'000'000'000 + static_cast<std::int64_t>(n) * 500;
  s.uptime_ms = n * 500;
  s.lookups = n;
  s.requested_tokens = 10 * n;
  s.hit_tokens = 7 * n;
  return s;
}

}  // namespace

class RecorderTest : public QObject {
  Q_OBJECT
 private slots:
  void CapacityBoundsTheHistory() {
    Recorder rec(50);
    QCOMPARE(rec.capacity(), std::size_t{50});
    QSignalSpy added(&rec, &Recorder::added);
    for (std::uint64_t n = 0; n < 60; ++n) rec.add(Numbered(n));
    QCOMPARE(rec.size(), std::size_t{50});
    QCOMPARE(rec.total(), std::uint64_t{60});
    // The oldest held is reading 10, the latest reading 59, in order.
    QCOMPARE(rec.at(0).lookups, std::uint64_t{10});
    QCOMPARE(rec.latest().lookups, std::uint64_t{59});
    for (std::size_t i = 0; i < rec.size(); ++i) QCOMPARE(rec.at(i).lookups, std::uint64_t{10 + i});
    // added(false) while filling, added(true) for each reading that dropped one.
    QCOMPARE(added.count(), 60);
    for (int i = 0; i < 60; ++i) QCOMPARE(added.at(i).at(0).toBool(), i >= 50);
    // Every held reading's rate is against the reading before it (0.5 s, 1 lookup).
    for (std::size_t i = 0; i < rec.size(); ++i) {
      QCOMPARE(rec.rates(i).seconds, 0.5);
      QCOMPARE(rec.rates(i).lookups_per_s, 2.0);
    }
    // Out of range: an empty reading, no rate.
    QCOMPARE(rec.at(50).time_ms, std::int64_t{0});
    QCOMPARE(rec.rates(50).seconds, 0.0);

    QSignalSpy cleared(&rec, &Recorder::cleared);
    rec.clear();
    QCOMPARE(cleared.count(), 1);
    QCOMPARE(rec.size(), std::size_t{0});
    QCOMPARE(rec.total(), std::uint64_t{0});
    // After a clear the first reading has no rate (nothing before it).
    rec.add(Numbered(100));
    QCOMPARE(rec.size(), std::size_t{1});
    QCOMPARE(rec.rates(0).seconds, 0.0);
    QCOMPARE(rec.rates(0).hit_rate, -1.0);
  }

  void CapacityOneAndZero() {
    Recorder one(1);
    one.add(Numbered(1));
    one.add(Numbered(2));
    QCOMPARE(one.size(), std::size_t{1});
    QCOMPARE(one.latest().lookups, std::uint64_t{2});
    QCOMPARE(one.rates(0).seconds, 0.5);
    // A capacity of 0 holds one reading rather than none.
    Recorder zero(0);
    QCOMPARE(zero.capacity(), std::size_t{1});
    QCOMPARE(zero.latest().time_ms, std::int64_t{0});  // empty: no crash
    zero.add(Numbered(3));
    QCOMPARE(zero.latest().lookups, std::uint64_t{3});
  }

  void RatesBetweenTwoReadings() {
    Snapshot a;
    a.time_ms = 10'000;
    a.uptime_ms = 5'000;
    a.lookups = 100;
    a.requested_tokens = 1'000;
    a.hit_tokens = 600;
    a.loads = 40;
    a.failed_loads = 3;
    a.stores = 20;
    a.ttft_saved_ms = 1'500;
    a.delivery_ms = 100;
    TierSample host = Tier("host");
    host.hits = 50;
    host.misses = 10;
    host.bytes_out = 1'000'000;
    host.bytes_in = 200'000;
    host.evictions = 7;
    host.promotions_in = 1;
    host.corrupt_detected = 0;
    TierSample disk = Tier("disk");
    disk.hits = 5;
    disk.misses = 5;
    disk.demotions_in = 3;
    disk.io_errors = 2;
    a.tiers = {host, disk};

    Snapshot b = a;
    b.time_ms = 14'000;  // 4 s later
    b.uptime_ms = 9'000;
    b.lookups = 140;          // +40
    b.requested_tokens = 1'800;  // +800
    b.hit_tokens = 1'200;     // +600
    b.loads = 60;             // +20
    b.failed_loads = 5;       // +2
    b.stores = 28;            // +8
    b.ttft_saved_ms = 3'500;  // +2000 ms in 4 s
    b.delivery_ms = 140;      // +40 ms in 4 s
    b.tiers[0].hits = 80;           // +30
    b.tiers[0].misses = 20;         // +10
    b.tiers[0].bytes_out = 9'000'000;  // +8 MB
    b.tiers[0].bytes_in = 600'000;  // +400 kB
    b.tiers[0].evictions = 15;      // +8
    b.tiers[0].promotions_in = 3;   // +2
    b.tiers[0].corrupt_detected = 4;  // +4
    b.tiers[1].demotions_in = 11;   // +8; no reads
    b.tiers[1].io_errors = 6;       // +4

    const Rates r = Recorder::Between(a, b);
    QCOMPARE(r.seconds, 4.0);
    QCOMPARE(r.hit_rate, 0.75);
    QCOMPARE(r.ttft_saved_ms_per_min, 30'000.0);
    QCOMPARE(r.delivery_ms_per_min, 600.0);
    QCOMPARE(r.lookups_per_s, 10.0);
    QCOMPARE(r.loads_per_s, 5.0);
    QCOMPARE(r.failed_loads_per_s, 0.5);
    QCOMPARE(r.stores_per_s, 2.0);
    QCOMPARE(r.tiers.size(), qsizetype{2});
    QCOMPARE(r.tiers[0].hit_rate, 0.75);
    QCOMPARE(r.tiers[0].bytes_out_per_s, 2'000'000.0);
    QCOMPARE(r.tiers[0].bytes_in_per_s, 100'000.0);
    QCOMPARE(r.tiers[0].evictions_per_s, 2.0);
    QCOMPARE(r.tiers[0].promotions_per_s, 0.5);
    QCOMPARE(r.tiers[0].corrupt_per_s, 1.0);
    QCOMPARE(r.tiers[0].demotions_per_s, 0.0);
    QCOMPARE(r.tiers[1].hit_rate, -1.0);  // no reads in the interval
    QCOMPARE(r.tiers[1].demotions_per_s, 2.0);
    QCOMPARE(r.tiers[1].io_errors_per_s, 1.0);

    // No requests in the interval: no hit rate, other rates still there.
    Snapshot c = b;
    c.time_ms = 16'000;
    c.uptime_ms = 11'000;
    c.loads = 70;
    const Rates idle = Recorder::Between(b, c);
    QCOMPARE(idle.seconds, 2.0);
    QCOMPARE(idle.hit_rate, -1.0);
    QCOMPARE(idle.loads_per_s, 5.0);
    QCOMPARE(idle.ttft_saved_ms_per_min, 0.0);

    // The recorder keeps the same rates with the later reading.
    Recorder rec(4);
    rec.add(a);
    rec.add(b);
    QCOMPARE(rec.rates(0).seconds, 0.0);  // the first reading: none
    QCOMPARE(rec.rates(0).tiers.size(), qsizetype{2});
    QCOMPARE(rec.rates(1).seconds, 4.0);
    QCOMPARE(rec.rates(1).hit_rate, 0.75);
    QCOMPARE(rec.rates(1).tiers[0].bytes_out_per_s, 2'000'000.0);
  }

  void CounterGoingDownIsARestart() {
    Snapshot a = Numbered(1000);
    a.loads = 500;
    a.tiers = {Tier("host")};
    a.tiers[0].hits = 400;
    // kdnd restarted: its counters start again, the clock goes on.
    Snapshot b = Numbered(1004);
    b.uptime_ms = 2'000;
    b.lookups = 3;
    b.requested_tokens = 30;
    b.hit_tokens = 20;
    b.loads = 2;
    b.tiers = {Tier("host")};
    b.tiers[0].hits = 1;
    Rates r = Recorder::Between(a, b);
    QCOMPARE(r.seconds, 0.0);
    QCOMPARE(r.hit_rate, -1.0);
    QCOMPARE(r.loads_per_s, 0.0);
    QCOMPARE(r.tiers.size(), qsizetype{1});
    QCOMPARE(r.tiers[0].hit_rate, -1.0);

    // One tier's counter going down alone is enough.
    Snapshot c = Numbered(1008);
    c.loads = 600;
    c.tiers = {Tier("host")};
    c.tiers[0].hits = 399;
    QCOMPARE(Recorder::Between(a, c).seconds, 0.0);
    QCOMPARE(Recorder::Between(a, c).loads_per_s, 0.0);

    // A clock that did not advance (or went back): no rate either.
    Snapshot d = a;
    d.loads = 510;
    QCOMPARE(Recorder::Between(a, d).seconds, 0.0);
    d.time_ms = a.time_ms - 1'000;
    QCOMPARE(Recorder::Between(a, d).seconds, 0.0);
    QCOMPARE(Recorder::Between(a, d).loads_per_s, 0.0);

    // In the recorder: the rates start again from the restart's reading.
    Recorder rec(10);
    rec.add(a);
    rec.add(b);
    Snapshot e = b;
    e.time_ms = b.time_ms + 1'000;
    e.loads = 12;
    rec.add(e);
    QCOMPARE(rec.rates(1).seconds, 0.0);
    QCOMPARE(rec.rates(2).seconds, 1.0);
    QCOMPARE(rec.rates(2).loads_per_s, 10.0);
  }

  void TiersAreMatchedByName() {
    Snapshot a;
    a.time_ms = 1'000;
    a.tiers = {Tier("host"), Tier("disk")};
    a.tiers[0].evictions = 10;
    a.tiers[1].evictions = 100;
    a.tiers[1].hits = 10;
    // The later reading lists a new tier first and the old ones in another order.
    Snapshot b;
    b.time_ms = 3'000;
    b.tiers = {Tier("redis"), Tier("disk"), Tier("host")};
    b.tiers[0].evictions = 1'000;  // new: no rate
    b.tiers[0].hits = 500;
    b.tiers[1].evictions = 104;    // disk +4
    b.tiers[1].hits = 14;          // disk +4 hits, no misses
    b.tiers[2].evictions = 30;     // host +20
    const Rates r = Recorder::Between(a, b);
    QCOMPARE(r.seconds, 2.0);
    QCOMPARE(r.tiers.size(), qsizetype{3});
    QCOMPARE(r.tiers[0].evictions_per_s, 0.0);
    QCOMPARE(r.tiers[0].hit_rate, -1.0);
    QCOMPARE(r.tiers[1].evictions_per_s, 2.0);
    QCOMPARE(r.tiers[1].hit_rate, 1.0);
    QCOMPARE(r.tiers[2].evictions_per_s, 10.0);
    QCOMPARE(r.tiers[2].hit_rate, -1.0);
    // A tier that went away is simply not in the later rates.
    Snapshot c = b;
    c.time_ms = 4'000;
    c.tiers.removeAt(1);
    c.tiers[1].evictions = 31;
    const Rates rc = Recorder::Between(b, c);
    QCOMPARE(rc.tiers.size(), qsizetype{2});
    QCOMPARE(rc.tiers[1].evictions_per_s, 1.0);
  }

  void CumulativeHitRate() {
    Snapshot s;
    QCOMPARE(Recorder::CumulativeHitRate(s), -1.0);
    s.requested_tokens = 400;
    s.hit_tokens = 0;
    QCOMPARE(Recorder::CumulativeHitRate(s), 0.0);
    s.hit_tokens = 300;
    QCOMPARE(Recorder::CumulativeHitRate(s), 0.75);
    QCOMPARE(Recorder::CumulativeHitRate(Numbered(9)), 0.7);
  }
};

}  // namespace kdn::dash

QTEST_GUILESS_MAIN(kdn::dash::RecorderTest)
#include "recorder_test.moc"
