// SPDX-License-Identifier: Apache-2.0
// The item models over a recorder: checked by QAbstractItemModelTester while
// a recorder is fed (the snapshots are built here and added directly: a
// source's part is tested in node_source_test and runtime_source_test).
#include <QAbstractItemModelTester>
#include <QSignalSpy>
#include <QTest>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "models.h"

namespace kdn::dash {
namespace {

constexpr std::int64_t kEpochMs = 1'700'000'000'000;

TierSample Tier(const QString& name, std::uint64_t n) {
  TierSample t;
  t.name = name;
  t.kind = name == QLatin1String("redis") ? QStringLiteral("redis") : name;
  t.codec = QStringLiteral("kdn:balanced");
  t.objects = 10 * n;
  t.used_bytes = 1'000'000 * n;
  t.capacity_bytes = 1'000'000'000;
  t.high_watermark = 0.9;
  t.low_watermark = 0.7;
  t.hits = 3 * n;
  t.misses = n;
  t.puts = 2 * n;
  t.evictions = n / 3;  // moves every third reading
  t.demotions_in = n / 4;
  t.promotions_in = n / 5;
  t.corrupt_detected = n / 50;
  t.bytes_in = 100'000 * n;
  t.bytes_out = 300'000 * n;
  t.bytes_before_encoding = 4'000 * n;
  t.bytes_after_encoding = 1'000 * n;
  t.io_errors = n / 7;
  return t;
}

// Reading n of a source whose tiers and documents change as it runs:
// a redis tier between readings 30 and 59, the disk tier gone from 80 on,
// the tiers listed in another order from 70 on; the documents rotate and
// their order (most hit first) changes.
Snapshot Reading(std::uint64_t n) {
  Snapshot s;
  s.time_ms = kEpochMs + static_cast<std::int64_t>(n) * 1000;
  s.uptime_ms = n * 1000;
  s.lookups = 5 * n;
  s.requested_tokens = 100 * n;
  s.hit_tokens = 60 * n + (n % 4) * 10;
  s.loads = 4 * n;
  s.failed_loads = n / 6;
  s.stores = 2 * n;
  s.ttft_saved_ms = 12.5 * static_cast<double>(n);
  s.delivery_ms = 1.5 * static_cast<double>(n);
  s.tiers.push_back(Tier(QStringLiteral("host"), n));
  if (n >= 30 && n < 60) s.tiers.push_back(Tier(QStringLiteral("redis"), n - 30));
  if (n < 80) s.tiers.push_back(Tier(QStringLiteral("disk"), n));
  if (n >= 70) std::reverse(s.tiers.begin(), s.tiers.end());
  for (std::uint64_t d = 0; d < 1 + n % 6; ++d) {
    DocumentSample doc;
    doc.ns = QStringLiteral("tenant-%1").arg((n / 10 + d) % 2);
    doc.doc_id = QStringLiteral("doc-%1").arg((n / 3 + d) % 9);
    doc.hits = 1000 - d * 100 + (d == 1 ? n % 3 * 200 : 0);  // the second rises above the first now and then
    doc.chunks = 8;
    doc.chunks_held = static_cast<std::uint32_t>(8 - d % 3);
    doc.pinned = d % 2 == 0;
    doc.pin_expires_ms = d == 0 ? 0 : s.time_ms + 60'000;
    s.documents_top.push_back(doc);
  }
  std::stable_sort(s.documents_top.begin(), s.documents_top.end(),
                   [](const DocumentSample& a, const DocumentSample& b) { return a.hits > b.hits; });
  // Quotas: tenant-0's on the host tier throughout, tenant-1's there from
  // reading 20 on, tenant-0's on the disk tier while the disk is there.
  const auto quota = [&](const QString& tier, int index, const QString& ns) {
    QuotaSample q;
    q.tier = tier;
    q.tier_index = index;
    q.ns = ns;
    q.quota_bytes = 4'000'000;
    q.used_bytes = std::min<std::uint64_t>(q.quota_bytes, 100'000 * n);
    q.objects = q.used_bytes / 10'000;
    q.quota_evictions = n / 2;
    q.room_evictions = n / 9;
    q.refused = n / 40;
    return q;
  };
  s.quotas.push_back(quota(QStringLiteral("host"), 0, QStringLiteral("tenant-0")));
  if (n >= 20) s.quotas.push_back(quota(QStringLiteral("host"), 0, QStringLiteral("tenant-1")));
  if (n < 80) s.quotas.push_back(quota(QStringLiteral("disk"), 1, QStringLiteral("tenant-0")));
  return s;
}

QVariant Get(const QAbstractItemModel& m, int row, int column, int role = Qt::DisplayRole) {
  return m.data(m.index(row, column), role);
}

double Value(const QAbstractItemModel& m, int row, int column) { return Get(m, row, column, kValueRole).toDouble(); }
bool Moved(const QAbstractItemModel& m, int row, int column) { return Get(m, row, column, kMovedRole).toBool(); }
bool Fault(const QAbstractItemModel& m, int row, int column) { return Get(m, row, column, kFaultRole).toBool(); }
QString Text(const QAbstractItemModel& m, int row, int column) { return Get(m, row, column).toString(); }

// The models show what the recorder holds (once updated).
void CheckShows(const Recorder& rec, const HistoryModel& h, const TierModel& t, const DocumentModel& d,
                const EventModel& e) {
  QCOMPARE(h.rowCount(), static_cast<int>(rec.size()));
  for (int r = 0; r < h.rowCount(); ++r) {
    QCOMPARE(Value(h, r, HistoryModel::kTimeMs), static_cast<double>(rec.at(static_cast<std::size_t>(r)).time_ms));
  }
  QCOMPARE(e.rowCount(), int{EventModel::kRows});
  if (rec.size() == 0) {
    QCOMPARE(t.rowCount(), 0);
    QCOMPARE(d.rowCount(), 0);
    QVERIFY(std::isnan(Value(e, EventModel::kEvictions, EventModel::kTotal)));
    return;
  }
  const Snapshot& latest = rec.latest();
  QCOMPARE(t.rowCount(), static_cast<int>(latest.tiers.size()));
  double evictions = 0;
  for (int r = 0; r < t.rowCount(); ++r) {
    QCOMPARE(Text(t, r, TierModel::kName), latest.tiers[r].name);
    QCOMPARE(Value(t, r, TierModel::kUsedBytes), static_cast<double>(latest.tiers[r].used_bytes));
    evictions += static_cast<double>(latest.tiers[r].evictions);
  }
  QCOMPARE(Value(e, EventModel::kEvictions, EventModel::kTotal), evictions);
  QCOMPARE(d.rowCount(), static_cast<int>(latest.documents_top.size()));
  for (int r = 0; r < d.rowCount(); ++r) {
    QCOMPARE(Text(d, r, DocumentModel::kDocId), latest.documents_top[r].doc_id);
    QCOMPARE(Text(d, r, DocumentModel::kNamespace), latest.documents_top[r].ns);
    QCOMPARE(Value(d, r, DocumentModel::kHits), static_cast<double>(latest.documents_top[r].hits));
  }
}

// The quotas' table shows the latest reading's quotas, in its order.
void CheckQuotas(const Recorder& rec, const QuotaModel& q) {
  if (rec.size() == 0) {
    QCOMPARE(q.rowCount(), 0);
    return;
  }
  const Snapshot& latest = rec.latest();
  QCOMPARE(q.rowCount(), static_cast<int>(latest.quotas.size()));
  for (int r = 0; r < q.rowCount(); ++r) {
    QCOMPARE(Text(q, r, QuotaModel::kTier), latest.quotas[r].tier);
    QCOMPARE(Text(q, r, QuotaModel::kNamespace), latest.quotas[r].ns);
    QCOMPARE(Value(q, r, QuotaModel::kUsedOfQuota), static_cast<double>(latest.quotas[r].used_bytes));
    QCOMPARE(Value(q, r, QuotaModel::kQuotaEvictions), static_cast<double>(latest.quotas[r].quota_evictions));
  }
}

// The per-tier hit rates show what the recorder holds (once updated): a row
// per reading, a column per tier seen (and kept), each cell that tier's rate.
void CheckHitRates(const Recorder& rec, const TierHitRateModel& m) {
  QCOMPARE(m.rowCount(), static_cast<int>(rec.size()));
  QCOMPARE(m.columnCount(), TierHitRateModel::kFirstTier + static_cast<int>(m.tierNames().size()));
  if (rec.size() == 0) QCOMPARE(m.columnCount(), 1);
  for (int r = 0; r < m.rowCount(); ++r) {
    const Snapshot& s = rec.at(static_cast<std::size_t>(r));
    const Rates& rates = rec.rates(static_cast<std::size_t>(r));
    QCOMPARE(Value(m, r, TierHitRateModel::kTimeMs), static_cast<double>(s.time_ms));
    for (const TierSample& t : s.tiers) QVERIFY2(m.tierNames().contains(t.name), qPrintable(t.name));
    for (int c = TierHitRateModel::kFirstTier; c < m.columnCount(); ++c) {
      const QString name = m.headerData(c, Qt::Horizontal).toString();
      double want = std::nan("");
      for (int i = 0; i < s.tiers.size(); ++i) {
        if (s.tiers[i].name == name && rates.seconds > 0 && rates.tiers[i].hit_rate >= 0) want = rates.tiers[i].hit_rate;
      }
      const double got = Value(m, r, c);
      QVERIFY2(std::isnan(want) ? std::isnan(got) : got == want, qPrintable(QStringLiteral("row %1 %2").arg(r).arg(name)));
      if (std::isnan(got)) QCOMPARE(Text(m, r, c), QStringLiteral("\u2014"));
    }
  }
}

// Five models on one recorder, each under a tester.
struct Models {
  Models(const Recorder* rec, int min_update_ms)
      : history(rec, min_update_ms),
        tiers(rec, min_update_ms),
        events(rec, min_update_ms),
        docs(rec, min_update_ms),
        tier_hits(rec, min_update_ms),
        quotas(rec, min_update_ms) {
    for (QAbstractItemModel* m :
         std::initializer_list<QAbstractItemModel*>{&history, &tiers, &events, &docs, &tier_hits, &quotas}) {
      testers.push_back(std::make_unique<QAbstractItemModelTester>(
          m, QAbstractItemModelTester::FailureReportingMode::QtTest));
    }
  }
  HistoryModel history;
  TierModel tiers;
  EventModel events;
  DocumentModel docs;
  TierHitRateModel tier_hits;
  QuotaModel quotas;
  std::vector<std::unique_ptr<QAbstractItemModelTester>> testers;
};

void CheckAll(const Recorder& rec, const Models& m) {
  CheckShows(rec, m.history, m.tiers, m.docs, m.events);
  if (QTest::currentTestFailed()) return;
  CheckHitRates(rec, m.tier_hits);
  if (QTest::currentTestFailed()) return;
  CheckQuotas(rec, m.quotas);
}

// A model's structural signals, under a tester.
struct ModelSignals {
  explicit ModelSignals(QAbstractItemModel* m)
      : tester(m, QAbstractItemModelTester::FailureReportingMode::QtTest),
        inserted(m, &QAbstractItemModel::rowsInserted),
        removed(m, &QAbstractItemModel::rowsRemoved),
        reset(m, &QAbstractItemModel::modelReset),
        layout(m, &QAbstractItemModel::layoutChanged),
        columns_inserted(m, &QAbstractItemModel::columnsInserted),
        columns_removed(m, &QAbstractItemModel::columnsRemoved) {}
  QAbstractItemModelTester tester;
  QSignalSpy inserted, removed, reset, layout, columns_inserted, columns_removed;
};

}  // namespace

class ModelsTest : public QObject {
  Q_OBJECT
 private slots:
  // Every model under QAbstractItemModelTester while a recorder is fed: the
  // history fills and then drops, a tier comes and goes, the documents change,
  // the history is cleared and fed again.
  void ModelsPassTheTesterWhileFed() {
    Recorder rec(25);
    rec.add(Reading(0));
    Models now(&rec, 0);        // updated at each reading
    Models coalesced(&rec, 20);  // updated at most every 20 ms
    CheckAll(rec, now);
    for (std::uint64_t n = 1; n < 120; ++n) {
      rec.add(Reading(n));
      if (QTest::currentTestFailed()) return;
      CheckAll(rec, now);
      if (QTest::currentTestFailed()) return;
      if (n % 7 == 0) QTest::qWait(30);  // lets the coalesced models update
    }
    QTest::qWait(60);
    CheckAll(rec, coalesced);
    if (QTest::currentTestFailed()) return;
    // More readings than the history holds between two coalesced updates.
    for (std::uint64_t n = 120; n < 180; ++n) rec.add(Reading(n));
    QTest::qWait(60);
    CheckAll(rec, coalesced);
    if (QTest::currentTestFailed()) return;

    rec.clear();
    CheckAll(rec, now);
    CheckAll(rec, coalesced);
    if (QTest::currentTestFailed()) return;
    // Fed again: a source that restarted (its counters start over).
    for (std::uint64_t n = 1; n < 40; ++n) {
      rec.add(Reading(n));
      if (QTest::currentTestFailed()) return;
    }
    QTest::qWait(60);
    CheckAll(rec, now);
    CheckAll(rec, coalesced);
    // A clear while readings are pending: nothing stale arrives later.
    rec.add(Reading(40));
    rec.clear();
    QTest::qWait(60);
    CheckAll(rec, coalesced);
  }

  // The history is updated by rows inserted at the end and removed at the
  // front, never by a reset, also when several readings are coalesced.
  void HistoryIsIncremental() {
    Recorder rec(5);
    HistoryModel h(&rec, 0);
    ModelSignals hs(&h);
    for (std::uint64_t n = 0; n < 12; ++n) rec.add(Reading(n));
    QCOMPARE(hs.inserted.count(), 12);
    QCOMPARE(hs.removed.count(), 7);
    QCOMPARE(hs.reset.count(), 0);
    QCOMPARE(hs.layout.count(), 0);
    for (int i = 0; i < 12; ++i) {
      const int row = hs.inserted.at(i).at(1).toInt();
      QCOMPARE(row, std::min(i, 4));  // appended
      QCOMPARE(hs.inserted.at(i).at(2).toInt(), row);
    }
    for (const QList<QVariant>& args : hs.removed) {
      QCOMPARE(args.at(1).toInt(), 0);  // the oldest
      QCOMPARE(args.at(2).toInt(), 0);
    }
    QCOMPARE(h.rowCount(), 5);
    QCOMPARE(Value(h, 0, HistoryModel::kTimeMs), static_cast<double>(Reading(7).time_ms));
    QCOMPARE(Value(h, 4, HistoryModel::kTimeMs), static_cast<double>(Reading(11).time_ms));

    // Coalesced: three readings, then four (two drop), then twelve (more than it holds).
    Recorder rec2(5);
    HistoryModel c(&rec2, 50);
    ModelSignals cs(&c);
    for (std::uint64_t n = 0; n < 3; ++n) rec2.add(Reading(n));
    QTRY_COMPARE(cs.inserted.count(), 1);
    QCOMPARE(cs.inserted.at(0).at(1).toInt(), 0);
    QCOMPARE(cs.inserted.at(0).at(2).toInt(), 2);
    for (std::uint64_t n = 3; n < 7; ++n) rec2.add(Reading(n));
    // Until the update, the rows still show their readings (the dropped ones: nothing).
    QCOMPARE(c.rowCount(), 3);
    QVERIFY(!Get(c, 0, HistoryModel::kTimeMs).isValid());
    QCOMPARE(Value(c, 2, HistoryModel::kTimeMs), static_cast<double>(Reading(2).time_ms));
    QTRY_COMPARE(cs.inserted.count(), 2);
    QCOMPARE(cs.removed.count(), 1);
    QCOMPARE(cs.removed.at(0).at(1).toInt(), 0);
    QCOMPARE(cs.removed.at(0).at(2).toInt(), 1);
    QCOMPARE(cs.inserted.at(1).at(1).toInt(), 1);
    QCOMPARE(cs.inserted.at(1).at(2).toInt(), 4);
    QCOMPARE(Value(c, 0, HistoryModel::kTimeMs), static_cast<double>(Reading(2).time_ms));
    for (std::uint64_t n = 7; n < 19; ++n) rec2.add(Reading(n));
    QTRY_COMPARE(cs.inserted.count(), 3);
    QCOMPARE(cs.removed.count(), 2);
    QCOMPARE(cs.removed.at(1).at(2).toInt(), 4);  // all five shown
    QCOMPARE(c.rowCount(), 5);
    QCOMPARE(Value(c, 0, HistoryModel::kTimeMs), static_cast<double>(Reading(14).time_ms));
    QCOMPARE(cs.reset.count(), 0);
    QCOMPARE(cs.layout.count(), 0);

    // clear() is the one reset.
    rec.clear();
    QCOMPARE(hs.reset.count(), 1);
    QCOMPARE(h.rowCount(), 0);
  }

  // The tier rows follow the tier list by rows inserted and removed: a tier
  // added (30), removed (60), the list reordered (70), a tier gone (80).
  void TierRowsFollowTheTierList() {
    Recorder rec(10);
    TierModel t(&rec, 0);
    QAbstractItemModelTester tester(&t, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QSignalSpy inserted(&t, &QAbstractItemModel::rowsInserted);
    QSignalSpy removed(&t, &QAbstractItemModel::rowsRemoved);
    QSignalSpy reset(&t, &QAbstractItemModel::modelReset);
    QSignalSpy changed(&t, &QAbstractItemModel::dataChanged);
    const auto rows = [](const QSignalSpy& spy, int i) {
      return qMakePair(spy.at(i).at(1).toInt(), spy.at(i).at(2).toInt());
    };
    rec.add(Reading(29));
    QCOMPARE(inserted.count(), 1);
    QCOMPARE(rows(inserted, 0), qMakePair(0, 1));  // host, disk
    rec.add(Reading(30));
    QCOMPARE(inserted.count(), 2);
    QCOMPARE(rows(inserted, 1), qMakePair(1, 1));  // redis between them
    QCOMPARE(removed.count(), 0);
    QCOMPARE(Text(t, 1, TierModel::kName), QStringLiteral("redis"));
    changed.clear();
    rec.add(Reading(31));
    QCOMPARE(inserted.count() + removed.count(), 2);  // the list did not change
    QCOMPARE(changed.count(), 3);                      // every tier's counters did
    rec.add(Reading(60));
    QCOMPARE(removed.count(), 1);
    QCOMPARE(rows(removed, 0), qMakePair(1, 1));
    rec.add(Reading(70));  // disk, host
    QCOMPARE(removed.count(), 2);
    QCOMPARE(rows(removed, 1), qMakePair(0, 0));
    QCOMPARE(inserted.count(), 3);
    QCOMPARE(rows(inserted, 2), qMakePair(1, 1));
    QCOMPARE(Text(t, 0, TierModel::kName), QStringLiteral("disk"));
    QCOMPARE(Text(t, 1, TierModel::kName), QStringLiteral("host"));
    rec.add(Reading(80));  // host
    QCOMPARE(removed.count(), 3);
    QCOMPARE(rows(removed, 2), qMakePair(0, 0));
    QCOMPARE(t.rowCount(), 1);
    QCOMPARE(reset.count(), 0);
  }

  // Per-tier hit rates over time, for a hand-built sequence: exact values,
  // a tier added (a column inserted) and gone (its column kept, "—"), the
  // tiers listed in another order, the oldest readings dropped; rows
  // inserted and removed, never a reset until clear().
  void TierHitRatesOverTime() {
    const auto tier = [](const char* name, std::uint64_t hits, std::uint64_t misses) {
      TierSample t;
      t.name = QString::fromLatin1(name);
      t.hits = hits;
      t.misses = misses;
      return t;
    };
    const auto reading = [](std::int64_t second, QVector<TierSample> tiers) {
      Snapshot s;
      s.time_ms = kEpochMs + second * 1000;
      s.tiers = std::move(tiers);
      return s;
    };
    const std::vector<Snapshot> readings = {
        reading(0, {tier("host", 0, 0), tier("disk", 0, 0)}),
        reading(1, {tier("host", 3, 1), tier("disk", 0, 0)}),                      // host 75 %, disk not read
        reading(2, {tier("host", 3, 1), tier("disk", 1, 1), tier("redis", 5, 5)}),  // disk 50 %, redis new
        reading(3, {tier("host", 13, 1), tier("disk", 1, 3)}),                     // host 100 %, disk 0 %
        reading(4, {tier("disk", 1, 3), tier("host", 18, 6)}),                     // reordered; host 50 %
        reading(5, {tier("host", 19, 9)}),                                         // host 25 %, disk gone
    };
    Recorder rec(3);
    TierHitRateModel m(&rec, 0);
    ModelSignals ms(&m);
    QSignalSpy& cols_in = ms.columns_inserted;
    QCOMPARE(m.columnCount(), 1);
    QCOMPARE(m.headerData(TierHitRateModel::kTimeMs, Qt::Horizontal).toString(), QStringLiteral("Time"));
    const QString none = QStringLiteral("\u2014");
    const auto rate = [&](int row, const char* name) {
      const int c = TierHitRateModel::kFirstTier + static_cast<int>(m.tierNames().indexOf(QString::fromLatin1(name)));
      return Get(m, row, c, kValueRole).toDouble();
    };
    const auto text = [&](int row, const char* name) {
      return Text(m, row, TierHitRateModel::kFirstTier + static_cast<int>(m.tierNames().indexOf(QString::fromLatin1(name))));
    };

    rec.add(readings[0]);
    QCOMPARE(cols_in.count(), 1);
    QCOMPARE(cols_in.at(0).at(1).toInt(), 1);
    QCOMPARE(cols_in.at(0).at(2).toInt(), 2);
    QCOMPARE(m.tierNames(), (QVector<QString>{"host", "disk"}));
    QCOMPARE(m.headerData(1, Qt::Horizontal).toString(), QStringLiteral("host"));
    QCOMPARE(m.headerData(2, Qt::Horizontal).toString(), QStringLiteral("disk"));
    QVERIFY(!m.headerData(3, Qt::Horizontal).isValid());
    QCOMPARE(m.rowCount(), 1);
    QVERIFY(std::isnan(rate(0, "host")));  // the first reading has no interval
    QCOMPARE(text(0, "host"), none);

    rec.add(readings[1]);
    QCOMPARE(rate(1, "host"), 0.75);
    QCOMPARE(text(1, "host"), QStringLiteral("75.0 %"));
    QVERIFY(std::isnan(rate(1, "disk")));
    QCOMPARE(text(1, "disk"), none);

    rec.add(readings[2]);
    QCOMPARE(cols_in.count(), 2);
    QCOMPARE(cols_in.at(1).at(1).toInt(), 3);
    QCOMPARE(cols_in.at(1).at(2).toInt(), 3);
    QCOMPARE(m.headerData(3, Qt::Horizontal).toString(), QStringLiteral("redis"));
    QVERIFY(!m.headerData(3, Qt::Horizontal, Qt::ToolTipRole).toString().isEmpty());
    QVERIFY(std::isnan(rate(2, "host")));  // not read in the interval
    QCOMPARE(rate(2, "disk"), 0.5);
    QVERIFY(std::isnan(rate(2, "redis")));  // no reading before it to compare with
    QVERIFY(std::isnan(rate(1, "redis")));  // not in that reading
    QCOMPARE(text(1, "redis"), none);

    rec.add(readings[3]);  // the first reading drops
    QCOMPARE(m.rowCount(), 3);
    QCOMPARE(Value(m, 0, TierHitRateModel::kTimeMs), static_cast<double>(readings[1].time_ms));
    QCOMPARE(rate(0, "host"), 0.75);
    QCOMPARE(rate(2, "host"), 1.0);
    QCOMPARE(text(2, "host"), QStringLiteral("100.0 %"));
    QCOMPARE(rate(2, "disk"), 0.0);
    QCOMPARE(text(2, "disk"), QStringLiteral("0.0 %"));
    QVERIFY(std::isnan(rate(2, "redis")));

    rec.add(readings[4]);
    QCOMPARE(rate(2, "host"), 0.5);  // found by name, not by position
    QVERIFY(std::isnan(rate(2, "disk")));
    rec.add(readings[5]);  // redis is in no reading held now: its column stays, empty
    QCOMPARE(m.rowCount(), 3);
    QCOMPARE(m.columnCount(), 4);
    for (int r = 0; r < 3; ++r) QCOMPARE(text(r, "redis"), none);
    QCOMPARE(rate(2, "host"), 0.25);
    QVERIFY(std::isnan(rate(2, "disk")));
    CheckHitRates(rec, m);

    QCOMPARE(ms.inserted.count(), 6);
    QCOMPARE(ms.removed.count(), 3);
    for (const QList<QVariant>& args : ms.removed) QCOMPARE(args.at(1).toInt(), 0);  // the oldest
    QCOMPARE(cols_in.count(), 2);
    QCOMPARE(ms.columns_removed.count(), 0);
    QCOMPARE(ms.reset.count(), 0);
    QCOMPARE(ms.layout.count(), 0);

    // Coalesced: all six at once are one update (columns, then rows), and show the same.
    Recorder rec2(3);
    TierHitRateModel c(&rec2, 50);
    ModelSignals cs(&c);
    for (const Snapshot& s : readings) rec2.add(s);
    QCOMPARE(c.rowCount(), 0);
    QTRY_COMPARE(cs.inserted.count(), 1);
    QCOMPARE(cs.columns_inserted.count(), 1);
    // Only the tiers of the readings held (3 to 5; redis left with reading 2), as they first appear.
    QCOMPARE(c.tierNames(), (QVector<QString>{"host", "disk"}));
    CheckHitRates(rec2, c);
    QCOMPARE(cs.reset.count(), 0);

    // A model made after the readings shows them at once.
    TierHitRateModel late(&rec, 0);
    QCOMPARE(late.tierNames(), (QVector<QString>{"host", "disk"}));
    CheckHitRates(rec, late);

    // clear() is the one reset: no rows, no tier columns.
    rec.clear();
    QCOMPARE(ms.reset.count(), 1);
    QCOMPARE(m.rowCount(), 0);
    QCOMPARE(m.columnCount(), 1);
    CheckHitRates(rec, m);
  }

  // min_update_ms = 100: ten readings added at once are shown by one update.
  void ReadingsAreCoalesced() {
    Recorder rec(100);
    Models m(&rec, 100);
    QSignalSpy h_inserted(&m.history, &QAbstractItemModel::rowsInserted);
    QSignalSpy t_inserted(&m.tiers, &QAbstractItemModel::rowsInserted);
    QSignalSpy t_changed(&m.tiers, &QAbstractItemModel::dataChanged);
    QSignalSpy e_changed(&m.events, &QAbstractItemModel::dataChanged);
    QSignalSpy d_inserted(&m.docs, &QAbstractItemModel::rowsInserted);
    QSignalSpy d_changed(&m.docs, &QAbstractItemModel::dataChanged);
    for (std::uint64_t n = 1; n <= 10; ++n) rec.add(Reading(n));
    // Nothing at once.
    QCOMPARE(h_inserted.count(), 0);
    QCOMPARE(e_changed.count(), 0);
    QCOMPARE(m.history.rowCount(), 0);
    QTRY_COMPARE(h_inserted.count(), 1);
    QTest::qWait(300);  // and nothing more later
    QCOMPARE(h_inserted.count(), 1);
    QCOMPARE(h_inserted.at(0).at(1).toInt(), 0);
    QCOMPARE(h_inserted.at(0).at(2).toInt(), 9);
    QCOMPARE(t_inserted.count(), 1);  // both tiers at once
    QCOMPARE(t_changed.count(), 0);   // inserted as they are
    QCOMPARE(m.tiers.rowCount(), 2);
    // One update changes each event row at most once.
    QVERIFY(e_changed.count() >= 1);
    QVERIFY(e_changed.count() <= EventModel::kRows);
    QCOMPARE(d_inserted.count(), 1);
    QCOMPARE(d_changed.count(), 0);
    CheckAll(rec, m);

    // The same ten readings with min_update_ms = 0: ten updates.
    Recorder rec0(100);
    HistoryModel h0(&rec0, 0);
    QSignalSpy h0_inserted(&h0, &QAbstractItemModel::rowsInserted);
    for (std::uint64_t n = 1; n <= 10; ++n) rec0.add(Reading(n));
    QCOMPARE(h0_inserted.count(), 10);
  }

  // Values, texts and kMovedRole for a hand-built sequence.
  void ValuesAndMoved() {
    constexpr std::uint64_t kGiB = 1ull << 30, kMiB = 1ull << 20;
    Snapshot a;
    a.time_ms = kEpochMs;
    a.uptime_ms = 60'000;
    a.requested_tokens = 1'000;
    a.hit_tokens = 500;
    a.loads = 10;
    a.failed_loads = 1;
    a.ttft_saved_ms = 2'000;
    a.delivery_ms = 100;
    TierSample host;
    host.name = QStringLiteral("host");
    host.kind = QStringLiteral("host");
    host.codec = QStringLiteral("raw");
    host.objects = 12;
    host.used_bytes = kGiB + kGiB / 5;  // 1.2 GiB
    host.capacity_bytes = 4 * kGiB;
    host.high_watermark = 0.9;
    host.hits = 100;
    host.misses = 20;
    host.bytes_out = 10 * kMiB;
    host.evictions = 3;
    host.bytes_before_encoding = 3'000;
    host.bytes_after_encoding = 1'000;
    host.limit_bytes_per_s = 2.0 * static_cast<double>(kGiB);
    TierSample disk;
    disk.name = QStringLiteral("disk");
    disk.kind = QStringLiteral("disk");
    disk.used_bytes = 512;
    disk.io_errors = 1;
    a.tiers = {host, disk};
    DocumentSample doc;
    doc.ns = QStringLiteral("acme");
    doc.doc_id = QStringLiteral("manual");
    doc.hits = 40;
    doc.chunks = 8;
    doc.chunks_held = 6;
    doc.pinned = true;
    doc.pin_expires_ms = a.time_ms + 95'000;
    a.documents_top = {doc};

    // 2 s later: the host evicted 4 and served 8 MiB (7 hits of 8 reads), the
    // disk had 2 I/O errors, one more load failed.
    Snapshot b = a;
    b.time_ms = a.time_ms + 2'000;
    b.uptime_ms = 62'000;
    b.requested_tokens = 1'400;
    b.hit_tokens = 800;
    b.loads = 30;
    b.failed_loads = 2;
    b.ttft_saved_ms = 5'100;  // +3.1 s in 2 s: 93 s/min
    b.delivery_ms = 160;
    b.tiers[0].hits = 107;
    b.tiers[0].misses = 21;
    b.tiers[0].bytes_out = 18 * kMiB;
    b.tiers[0].evictions = 7;
    b.tiers[1].io_errors = 3;
    b.documents_top[0].hits = 41;
    b.ttft_basis = Snapshot::TtftBasis::kPriced;  // as a kdnd's: server.prefill_us_per_token
    b.prefill_us_per_token = 72.5;

    Recorder rec;
    Models m(&rec, 0);
    rec.add(a);
    // One reading: no rates, nothing moved.
    QCOMPARE(Text(m.tiers, 0, TierModel::kHitRate), QStringLiteral("\u2014"));
    QVERIFY(std::isnan(Value(m.tiers, 0, TierModel::kBytesOutPerS)));
    QCOMPARE(Moved(m.tiers, 0, TierModel::kEvictions), false);
    QCOMPARE(Text(m.history, 0, HistoryModel::kHitRate), QStringLiteral("\u2014"));
    QCOMPARE(Text(m.history, 0, HistoryModel::kCumulativeHitRate), QStringLiteral("50.0 %"));
    QCOMPARE(Text(m.events, EventModel::kEvictions, EventModel::kTotal), QStringLiteral("3"));
    QCOMPARE(Text(m.events, EventModel::kEvictions, EventModel::kPerSecond), QStringLiteral("\u2014"));
    QCOMPARE(Moved(m.events, EventModel::kEvictions, EventModel::kTotal), false);

    QSignalSpy tier_changed(&m.tiers, &QAbstractItemModel::dataChanged);
    QSignalSpy event_changed(&m.events, &QAbstractItemModel::dataChanged);
    rec.add(b);
    // Tiers.
    QCOMPARE(m.tiers.rowCount(), 2);
    QCOMPARE(Text(m.tiers, 0, TierModel::kName), QStringLiteral("host"));
    QCOMPARE(Text(m.tiers, 0, TierModel::kUsedBytes), QStringLiteral("1.2 GiB"));
    QCOMPARE(Value(m.tiers, 0, TierModel::kUsedBytes), static_cast<double>(host.used_bytes));
    QCOMPARE(Text(m.tiers, 0, TierModel::kCapacityBytes), QStringLiteral("4.0 GiB"));
    QCOMPARE(Value(m.tiers, 0, TierModel::kOccupancy), static_cast<double>(host.used_bytes) / (4.0 * kGiB));
    QCOMPARE(Text(m.tiers, 0, TierModel::kOccupancy), QStringLiteral("30.0 %"));
    QCOMPARE(Text(m.tiers, 0, TierModel::kHighWatermark), QStringLiteral("90.0 %"));
    QCOMPARE(Text(m.tiers, 0, TierModel::kLowWatermark), QStringLiteral("\u2014"));  // none
    QVERIFY(std::isnan(Value(m.tiers, 0, TierModel::kLowWatermark)));
    QCOMPARE(Value(m.tiers, 0, TierModel::kHitRate), 0.875);
    QCOMPARE(Text(m.tiers, 0, TierModel::kHitRate), QStringLiteral("87.5 %"));
    QCOMPARE(Value(m.tiers, 0, TierModel::kBytesOutPerS), 4.0 * kMiB);
    QCOMPARE(Text(m.tiers, 0, TierModel::kBytesOutPerS), QStringLiteral("4.0 MiB/s"));
    QCOMPARE(Text(m.tiers, 0, TierModel::kLimitBytesPerS), QStringLiteral("2.0 GiB/s"));
    QCOMPARE(Value(m.tiers, 0, TierModel::kCompression), 3.0);
    QCOMPARE(Text(m.tiers, 1, TierModel::kCompression), QStringLiteral("\u2014"));
    QVERIFY(std::isnan(Value(m.tiers, 1, TierModel::kCompression)));
    QVERIFY(std::isnan(Value(m.tiers, 1, TierModel::kCapacityBytes)));
    QCOMPARE(Text(m.tiers, 1, TierModel::kUsedBytes), QStringLiteral("512 B"));
    QCOMPARE(Text(m.tiers, 1, TierModel::kHitRate), QStringLiteral("\u2014"));  // no reads
    QCOMPARE(Value(m.tiers, 0, TierModel::kEvictions), 7.0);
    QCOMPARE(Moved(m.tiers, 0, TierModel::kEvictions), true);
    QCOMPARE(Moved(m.tiers, 0, TierModel::kIoErrors), false);
    QCOMPARE(Moved(m.tiers, 1, TierModel::kEvictions), false);
    QCOMPARE(Moved(m.tiers, 1, TierModel::kIoErrors), true);
    QCOMPARE(Moved(m.tiers, 0, TierModel::kUsedBytes), false);  // not a counter
    // Highlighted: faults that moved (the disk's I/O errors), not the host's
    // evictions, routine though they moved.
    QCOMPARE(Fault(m.tiers, 0, TierModel::kEvictions), false);
    QCOMPARE(Fault(m.tiers, 1, TierModel::kIoErrors), true);
    QCOMPARE(Fault(m.tiers, 0, TierModel::kIoErrors), false);  // a fault's counter that did not move
    QCOMPARE(Get(m.tiers, 0, TierModel::kLimitBytesPerS, kNoteRole).toString(), QStringLiteral("measured by kdnd at start"));
    QVERIFY(Get(m.tiers, 0, TierModel::kLimitBytesPerS, Qt::ToolTipRole).toString().endsWith(QStringLiteral("measured by kdnd at start")));
    QCOMPARE(tier_changed.count(), 2);  // both rows changed (rates, counters)
    // History.
    QCOMPARE(m.history.rowCount(), 2);
    QCOMPARE(Value(m.history, 1, HistoryModel::kHitRate), 0.75);
    QCOMPARE(Text(m.history, 1, HistoryModel::kHitRate), QStringLiteral("75.0 %"));
    QCOMPARE(Text(m.history, 1, HistoryModel::kCumulativeHitRate), QStringLiteral("57.1 %"));
    QCOMPARE(Text(m.history, 1, HistoryModel::kTtftSavedMs), QStringLiteral("5.1 s"));
    QCOMPARE(Value(m.history, 1, HistoryModel::kTtftSavedPerMin), 93'000.0);
    QCOMPARE(Text(m.history, 1, HistoryModel::kTtftSavedPerMin), QStringLiteral("93.0 s/min"));
    QCOMPARE(Value(m.history, 1, HistoryModel::kDeliveryMsPerMin), 1'800.0);
    QCOMPARE(Text(m.history, 1, HistoryModel::kDeliveryMsPerMin), QStringLiteral("1.8 s/min"));
    QCOMPARE(Text(m.history, 1, HistoryModel::kLoadsPerS), QStringLiteral("10.0/s"));
    QCOMPARE(Text(m.history, 1, HistoryModel::kFailedLoadsPerS), QStringLiteral("0.5/s"));
    QCOMPARE(Moved(m.history, 1, HistoryModel::kFailedLoadsPerS), true);
    QCOMPARE(Fault(m.history, 1, HistoryModel::kFailedLoadsPerS), true);
    QCOMPARE(Value(m.history, 1, HistoryModel::kUsedBytes), static_cast<double>(host.used_bytes + 512));
    // What TTFT saved is made of.
    QCOMPARE(Text(m.history, 0, HistoryModel::kTtftBasis), QStringLiteral("\u2014"));
    QVERIFY(std::isnan(Value(m.history, 0, HistoryModel::kPrefillUsPerToken)));
    QCOMPARE(Text(m.history, 1, HistoryModel::kTtftBasis), QStringLiteral("priced"));
    QCOMPARE(Value(m.history, 1, HistoryModel::kTtftBasis), 1.0);
    QCOMPARE(Value(m.history, 1, HistoryModel::kPrefillUsPerToken), 72.5);
    QCOMPARE(Text(m.history, 1, HistoryModel::kPrefillUsPerToken), QStringLiteral("72.5 \u00b5s/token"));
    // Events: summed over the tiers.
    QCOMPARE(Value(m.events, EventModel::kEvictions, EventModel::kTotal), 7.0);
    QCOMPARE(Value(m.events, EventModel::kEvictions, EventModel::kPerSecond), 2.0);
    QCOMPARE(Text(m.events, EventModel::kEvictions, EventModel::kPerSecond), QStringLiteral("2.0/s"));
    QCOMPARE(Moved(m.events, EventModel::kEvictions, EventModel::kTotal), true);
    QCOMPARE(Value(m.events, EventModel::kIoErrors, EventModel::kTotal), 3.0);
    QCOMPARE(Moved(m.events, EventModel::kIoErrors, EventModel::kTotal), true);
    QCOMPARE(Value(m.events, EventModel::kFailedLoads, EventModel::kTotal), 2.0);
    QCOMPARE(Moved(m.events, EventModel::kFailedLoads, EventModel::kTotal), true);
    QCOMPARE(Moved(m.events, EventModel::kPromotions, EventModel::kTotal), false);
    QCOMPARE(Value(m.events, EventModel::kPromotions, EventModel::kPerSecond), 0.0);
    QCOMPARE(Text(m.events, EventModel::kCorrupt, EventModel::kEvent), QStringLiteral("Corrupt chunks"));
    // Routine movement is not highlighted; faults that moved are.
    QCOMPARE(Fault(m.events, EventModel::kEvictions, EventModel::kTotal), false);
    QCOMPARE(Fault(m.events, EventModel::kEvictions, EventModel::kPerSecond), false);
    QCOMPARE(Fault(m.events, EventModel::kIoErrors, EventModel::kTotal), true);
    QCOMPARE(Fault(m.events, EventModel::kFailedLoads, EventModel::kPerSecond), true);
    QCOMPARE(Fault(m.events, EventModel::kCorrupt, EventModel::kTotal), false);  // did not move
    // A source that does not tell decode failures apart (a kdnd): unknown, not 0.
    QCOMPARE(Text(m.events, EventModel::kDecodeFailures, EventModel::kTotal), QStringLiteral("\u2014"));
    QCOMPARE(Text(m.events, EventModel::kDecodeFailures, EventModel::kPerSecond), QStringLiteral("\u2014"));
    QCOMPARE(Text(m.events, EventModel::kAuthFailures, EventModel::kTotal), QStringLiteral("0"));
    // Only the rows that changed: evictions, failed loads, I/O errors, and
    // the per-second cells of the others (no rate before, 0 now); decode
    // failures stay unknown.
    QCOMPARE(event_changed.count(), int{EventModel::kRows} - 1);
    // Documents: the TTL left at the reading's time.
    QCOMPARE(m.docs.rowCount(), 1);
    QCOMPARE(Value(m.docs, 0, DocumentModel::kPinTtlS), 93.0);
    QCOMPARE(Text(m.docs, 0, DocumentModel::kPinTtlS), QStringLiteral("1.6 min"));
    QCOMPARE(Text(m.docs, 0, DocumentModel::kChunksHeld), QStringLiteral("6 / 8"));
    QCOMPARE(Value(m.docs, 0, DocumentModel::kHits), 41.0);
    QCOMPARE(Text(m.docs, 0, DocumentModel::kPinned), QStringLiteral("pinned"));

    // 1 s later, nothing happened: nothing moves, only the changed cells are signalled.
    Snapshot c = b;
    c.time_ms = b.time_ms + 1'000;
    c.uptime_ms = 63'000;
    c.documents_top[0].pinned = false;
    tier_changed.clear();
    event_changed.clear();
    QSignalSpy doc_changed(&m.docs, &QAbstractItemModel::dataChanged);
    rec.add(c);
    QCOMPARE(Moved(m.tiers, 0, TierModel::kEvictions), false);
    QCOMPARE(Moved(m.tiers, 1, TierModel::kIoErrors), false);
    QCOMPARE(Value(m.tiers, 0, TierModel::kBytesOutPerS), 0.0);
    QCOMPARE(Text(m.tiers, 0, TierModel::kHitRate), QStringLiteral("\u2014"));
    QCOMPARE(Moved(m.events, EventModel::kEvictions, EventModel::kTotal), false);
    QCOMPARE(Value(m.events, EventModel::kEvictions, EventModel::kPerSecond), 0.0);
    QCOMPARE(Moved(m.history, 2, HistoryModel::kFailedLoadsPerS), false);
    QCOMPARE(Text(m.history, 2, HistoryModel::kHitRate), QStringLiteral("\u2014"));
    QCOMPARE(Text(m.docs, 0, DocumentModel::kPinTtlS), QStringLiteral("\u2014"));
    QCOMPARE(Text(m.docs, 0, DocumentModel::kPinned), QString());
    // The events that had moved (evictions, failed loads, I/O errors) changed;
    // demotions, promotions and corrupt stayed 0 and 0/s.
    QCOMPARE(event_changed.count(), 3);
    for (const QList<QVariant>& args : event_changed) {
      const int row = args.at(0).toModelIndex().row();
      QVERIFY(row == EventModel::kEvictions || row == EventModel::kFailedLoads || row == EventModel::kIoErrors);
    }
    QCOMPARE(tier_changed.count(), 2);
    QCOMPARE(doc_changed.count(), 1);
    QCOMPARE(doc_changed.at(0).at(0).toModelIndex().column(), int{DocumentModel::kPinned});
    QCOMPARE(doc_changed.at(0).at(1).toModelIndex().column(), int{DocumentModel::kPinTtlS});

    // A restart: no rates, nothing moved, totals as the new source says.
    Snapshot d = a;
    d.time_ms = c.time_ms + 1'000;
    d.uptime_ms = 1'000;
    d.tiers[0].evictions = 1;
    rec.add(d);
    QCOMPARE(Text(m.history, 3, HistoryModel::kLoadsPerS), QStringLiteral("\u2014"));
    QCOMPARE(Value(m.events, EventModel::kEvictions, EventModel::kTotal), 1.0);
    QCOMPARE(Moved(m.events, EventModel::kEvictions, EventModel::kTotal), false);
    QCOMPARE(Text(m.events, EventModel::kEvictions, EventModel::kPerSecond), QStringLiteral("\u2014"));
    QCOMPARE(Text(m.tiers, 0, TierModel::kBytesOutPerS), QStringLiteral("\u2014"));
  }

  // Every fault the events list is highlighted when it moves (a runtime's
  // decode and seal failures, corrupt chunks); routine movement never is.
  void OnlyFaultsAreHighlighted() {
    Snapshot a;
    a.time_ms = kEpochMs;
    a.uptime_ms = 1'000;
    a.reports_decode_failures = true;
    TierSample disk;
    disk.name = QStringLiteral("disk");
    disk.kind = QStringLiteral("disk");
    a.tiers = {disk};
    Snapshot b = a;
    b.time_ms += 1'000;
    b.uptime_ms += 1'000;
    b.tiers[0].evictions = 5;
    b.tiers[0].demotions_in = 4;
    b.tiers[0].promotions_in = 3;
    b.tiers[0].corrupt_detected = 3;  // of them, 2 did not decode and 1 was not sealed with our secret
    b.tiers[0].decode_failures = 2;
    b.tiers[0].auth_failures = 1;
    b.auth_failures = 1;
    Recorder rec;
    Models m(&rec, 0);
    rec.add(a);
    QCOMPARE(Text(m.events, EventModel::kDecodeFailures, EventModel::kTotal), QStringLiteral("0"));
    rec.add(b);
    for (int row = 0; row < EventModel::kRows; ++row) {
      const bool fault = row != EventModel::kEvictions && row != EventModel::kDemotions && row != EventModel::kPromotions;
      QCOMPARE(EventModel::IsFault(row), fault);
      for (int c : {int{EventModel::kTotal}, int{EventModel::kPerSecond}}) {
        const bool moved = row != EventModel::kFailedLoads && row != EventModel::kIoErrors;
        QVERIFY2(Moved(m.events, row, c) == moved, qPrintable(Text(m.events, row, EventModel::kEvent)));
        QVERIFY2(Fault(m.events, row, c) == (fault && moved), qPrintable(Text(m.events, row, EventModel::kEvent)));
      }
      QCOMPARE(Fault(m.events, row, EventModel::kEvent), false);
    }
    QCOMPARE(Value(m.events, EventModel::kDecodeFailures, EventModel::kTotal), 2.0);
    QCOMPARE(Value(m.events, EventModel::kDecodeFailures, EventModel::kPerSecond), 2.0);
    QCOMPARE(Value(m.events, EventModel::kAuthFailures, EventModel::kTotal), 1.0);
    QCOMPARE(Value(m.events, EventModel::kAuthFailures, EventModel::kPerSecond), 1.0);
    QCOMPARE(Text(m.events, EventModel::kAuthFailures, EventModel::kEvent), QStringLiteral("Auth failures"));
    QCOMPARE(Fault(m.tiers, 0, TierModel::kCorrupt), true);
    for (int c : {int{TierModel::kEvictions}, int{TierModel::kDemotions}, int{TierModel::kPromotions}}) {
      QCOMPARE(Moved(m.tiers, 0, c), true);
      QCOMPARE(Fault(m.tiers, 0, c), false);
    }
  }

  // Two namespaces' quotas on one tier: use against the quota and as a
  // share of it, objects, evictions (own and for room) since start and per
  // second over the last interval, refusals highlighted as a fault when
  // they move, evictions drawn plainly; a quota gone from the source's
  // reading leaves the table, and a restart shows no rates.
  void QuotasShowUseAndEvictions() {
    Snapshot a;
    a.time_ms = kEpochMs;
    a.uptime_ms = 1'000;
    QuotaSample qa;
    qa.tier = QStringLiteral("host");
    qa.ns = QStringLiteral("tenant-a");
    qa.quota_bytes = 4 << 20;
    qa.used_bytes = 3 << 20;
    qa.objects = 3;
    qa.quota_evictions = 10;
    qa.room_evictions = 1;
    QuotaSample qb = qa;
    qb.ns = QStringLiteral("#1a2b3c4d");
    qb.quota_bytes = 1 << 20;
    qb.used_bytes = 256 << 10;
    qb.objects = 1;
    qb.quota_evictions = 0;
    qb.room_evictions = 0;
    a.quotas = {qa, qb};
    Snapshot b = a;
    b.time_ms += 2'000;
    b.uptime_ms += 2'000;
    b.quotas[0].quota_evictions = 16;  // 3/s
    b.quotas[0].used_bytes = 4 << 20;
    b.quotas[0].objects = 4;
    b.quotas[1].refused = 1;
    Recorder rec;
    Models m(&rec, 0);
    rec.add(a);
    QCOMPARE(m.quotas.rowCount(), 2);
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kUsedOfQuota), QStringLiteral("3.0 MiB / 4.0 MiB"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kShare), QStringLiteral("75.0 %"));
    QCOMPARE(Value(m.quotas, 0, QuotaModel::kShare), 0.75);
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kQuotaEvictionsPerS), QStringLiteral("\u2014"));  // one reading: no rate
    QCOMPARE(Text(m.quotas, 1, QuotaModel::kNamespace), QStringLiteral("#1a2b3c4d"));
    QCOMPARE(Text(m.quotas, 1, QuotaModel::kUsedOfQuota), QStringLiteral("256.0 KiB / 1.0 MiB"));
    QCOMPARE(Text(m.quotas, 1, QuotaModel::kShare), QStringLiteral("25.0 %"));

    rec.add(b);
    QCOMPARE(m.quotas.rowCount(), 2);
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kTier), QStringLiteral("host"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kNamespace), QStringLiteral("tenant-a"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kUsedOfQuota), QStringLiteral("4.0 MiB / 4.0 MiB"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kShare), QStringLiteral("100.0 %"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kObjects), QStringLiteral("4"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kQuotaEvictions), QStringLiteral("16"));
    QCOMPARE(Value(m.quotas, 0, QuotaModel::kQuotaEvictionsPerS), 3.0);
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kQuotaEvictionsPerS), QStringLiteral("3.0/s"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kRoomEvictions), QStringLiteral("1"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kRoomEvictionsPerS), QStringLiteral("0/s"));
    QCOMPARE(Moved(m.quotas, 0, QuotaModel::kQuotaEvictions), true);
    QCOMPARE(Fault(m.quotas, 0, QuotaModel::kQuotaEvictions), false);  // the quota at work: routine
    QCOMPARE(Text(m.quotas, 1, QuotaModel::kRefused), QStringLiteral("1"));
    QCOMPARE(Fault(m.quotas, 1, QuotaModel::kRefused), true);
    QCOMPARE(Fault(m.quotas, 0, QuotaModel::kRefused), false);

    // tenant-a's quota gone (the source's configuration changed); a restart.
    Snapshot c = b;
    c.time_ms += 1'000;
    c.uptime_ms = 500;
    c.quotas.removeFirst();
    c.quotas[0].refused = 0;
    rec.add(c);
    QCOMPARE(m.quotas.rowCount(), 1);
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kNamespace), QStringLiteral("#1a2b3c4d"));
    QCOMPARE(Text(m.quotas, 0, QuotaModel::kQuotaEvictionsPerS), QStringLiteral("\u2014"));
    QCOMPARE(Moved(m.quotas, 0, QuotaModel::kRefused), false);
  }

  void HeadersAndToolTips() {
    Recorder rec;
    rec.add(Reading(5));
    Models m(&rec, 0);
    QCOMPARE(m.tiers.headerData(TierModel::kOccupancy, Qt::Horizontal).toString(), QStringLiteral("Occupancy"));
    QCOMPARE(m.history.headerData(HistoryModel::kCumulativeHitRate, Qt::Horizontal).toString(),
             QStringLiteral("Cumulative hit rate"));
    QCOMPARE(m.events.headerData(EventModel::kPerSecond, Qt::Horizontal).toString(), QStringLiteral("Per second"));
    QCOMPARE(m.docs.headerData(DocumentModel::kPinTtlS, Qt::Horizontal).toString(), QStringLiteral("Pin TTL"));
    QVERIFY(!m.tiers.headerData(TierModel::kColumns, Qt::Horizontal).isValid());
    QCOMPARE(m.tier_hits.headerData(TierHitRateModel::kFirstTier, Qt::Horizontal).toString(), QStringLiteral("host"));
    QCOMPARE(m.quotas.headerData(QuotaModel::kUsedOfQuota, Qt::Horizontal).toString(), QStringLiteral("Used / quota"));
    for (QAbstractItemModel* model : std::initializer_list<QAbstractItemModel*>{&m.tiers, &m.history, &m.events,
                                                                                &m.docs, &m.tier_hits, &m.quotas}) {
      QVERIFY(model->rowCount() > 0);
      for (int c = 0; c < model->columnCount(); ++c) {
        QVERIFY(!model->headerData(c, Qt::Horizontal).toString().isEmpty());
        QVERIFY(!model->headerData(c, Qt::Horizontal, Qt::ToolTipRole).toString().isEmpty());
        QVERIFY(!Get(*model, 0, c, Qt::ToolTipRole).toString().isEmpty());
      }
    }
    // Models made without a recorder stay empty.
    QTest::ignoreMessage(QtWarningMsg, "kdn dashboard: a model was given no recorder; it stays empty");
    HistoryModel none(nullptr, 0);
    QCOMPARE(none.rowCount(), 0);
  }
};

}  // namespace kdn::dash

QTEST_GUILESS_MAIN(kdn::dash::ModelsTest)
#include "models_test.moc"
