// SPDX-License-Identifier: Apache-2.0
// The app's views (app/views.cc) drawn offscreen over models fed by hand:
// a bandwidth bar whose tier's limit is not measured is drawn as not
// measured (no fill), not full; a measured one is filled to its share; the
// charts' time axis is laid out with labels and a title; the delegate
// highlights faults that moved, never routine movement.
#include <QApplication>
#include <QImage>
#include <QLabel>
#include <QTableView>
#include <QtTest>

#include <cmath>

#include "models.h"
#include "recorder.h"
#include "views.h"

namespace kdn::dash {
namespace {

constexpr std::int64_t kEpochMs = 1'700'000'000'000;
constexpr double kMiB = 1024.0 * 1024.0;

// Two readings 1 s apart: the tier read 8 MiB in between.
void Feed(Recorder& rec, double limit_bytes_per_s, bool from_loads) {
  Snapshot a;
  a.time_ms = kEpochMs;
  a.uptime_ms = 1'000;
  TierSample disk;
  disk.name = QStringLiteral("disk");
  disk.kind = QStringLiteral("disk");
  disk.capacity_bytes = 64 << 20;
  disk.limit_bytes_per_s = limit_bytes_per_s;
  disk.limit_from_loads = from_loads;
  a.tiers = {disk};
  Snapshot b = a;
  b.time_ms += 1'000;
  b.uptime_ms += 1'000;
  b.tiers[0].bytes_out = 8 << 20;
  b.tiers[0].evictions = 3;
  rec.add(a);
  rec.add(b);
}

// The share of the bar's width painted in `accent` (a column counts when
// its middle pixel is that colour).
double FilledShare(QWidget* bar, Accent accent) {
  const QImage image = bar->grab().toImage();
  const QColor want = AccentColor(accent);
  int filled = 0;
  const int y = image.height() / 2;
  for (int x = 0; x < image.width(); ++x) {
    const QColor got = image.pixelColor(x, y);
    if (std::abs(got.red() - want.red()) < 24 && std::abs(got.green() - want.green()) < 24 &&
        std::abs(got.blue() - want.blue()) < 24) {
      ++filled;
    }
  }
  return static_cast<double>(filled) / image.width();
}

QString Words(const TierBars& bars) {
  QStringList all;
  for (const QLabel* l : bars.findChildren<QLabel*>()) {
    if (l->isVisible()) all << l->text();
  }
  return all.join(QLatin1Char('\n'));
}

}  // namespace

class ViewsTest : public QObject {
  Q_OBJECT

 private slots:
  void anUnmeasuredLimitIsDrawnAsNotMeasuredNotFull();
  void aMeasuredLimitIsFilledToItsShare();
  void theChartsHaveATimeAxisWithLabels();
  void onlyFaultsAreHighlighted();
  void theQuotaTableShowsEachNamespaceAndHighlightsOnlyRefusals();
};

void ViewsTest::anUnmeasuredLimitIsDrawnAsNotMeasuredNotFull() {
  Recorder rec;
  TierModel tiers(&rec, 0);
  Feed(rec, 0, /*from_loads=*/true);  // a runtime's tier that served no load yet
  TierBars bars(&tiers, TierBars::Mode::kBandwidth);
  bars.resize(400, 120);
  bars.show();
  QVERIFY(QTest::qWaitForWindowExposed(&bars));
  const QList<TierBar*> drawn = bars.findChildren<TierBar*>();
  QCOMPARE(drawn.size(), 1);
  // The only tier, so the fastest: before, drawn full green against itself.
  QCOMPARE(FilledShare(drawn[0], Accent::kGreen), 0.0);
  QVERIFY2(Words(bars).contains(QStringLiteral("not measured")), qPrintable(Words(bars)));
  QVERIFY2(Words(bars).contains(QStringLiteral("8.0 MiB/s read")), qPrintable(Words(bars)));
  QVERIFY(!drawn[0]->toolTip().isEmpty());
}

void ViewsTest::aMeasuredLimitIsFilledToItsShare() {
  Recorder rec;
  TierModel tiers(&rec, 0);
  Feed(rec, 32 * kMiB, /*from_loads=*/false);  // 8 MiB/s of 32 MiB/s: a quarter
  TierBars bars(&tiers, TierBars::Mode::kBandwidth);
  bars.resize(400, 120);
  bars.show();
  QVERIFY(QTest::qWaitForWindowExposed(&bars));
  const QList<TierBar*> drawn = bars.findChildren<TierBar*>();
  QCOMPARE(drawn.size(), 1);
  const double share = FilledShare(drawn[0], Accent::kGreen);
  QVERIFY2(share > 0.20 && share < 0.27, qPrintable(QString::number(share)));
  QVERIFY2(Words(bars).contains(QStringLiteral("of a limit of 32.0 MiB/s measured by kdnd at start")),
           qPrintable(Words(bars)));
}

void ViewsTest::theChartsHaveATimeAxisWithLabels() {
  Recorder rec;
  HistoryModel history(&rec, 0);
  for (int i = 0; i < 20; ++i) {
    Snapshot s;
    s.time_ms = kEpochMs + i * 500;
    s.uptime_ms = 1'000 + static_cast<std::uint64_t>(i) * 500;
    s.requested_tokens = 100 * static_cast<std::uint64_t>(i + 1);
    s.hit_tokens = 50 * static_cast<std::uint64_t>(i + 1);
    rec.add(s);
  }
  TimeChart chart(&history, HistoryModel::kTimeMs);
  chart.resize(450, 350);
  chart.show();  // shown first, lines after: what the window does
  QVERIFY(QTest::qWaitForWindowExposed(&chart));
  chart.addLine(HistoryModel::kCumulativeHitRate, QStringLiteral("overall, since start"), Accent::kOrange, false, 100);
  chart.setLeftAxis(QStringLiteral("hit rate, %"), 0, 100);
  QTRY_COMPARE(chart.points(0), 20);
  QTRY_VERIFY2(chart.timeAxisProblem().isEmpty(), qPrintable(chart.timeAxisProblem()));
  // The key names the line (a label, not the chart's legend, which cuts names).
  bool keyed = false;
  for (const QLabel* l : chart.findChildren<QLabel*>()) keyed = keyed || l->text().contains(QStringLiteral("since&nbsp;start"));
  QVERIFY(keyed);
}

void ViewsTest::onlyFaultsAreHighlighted() {
  Recorder rec;
  EventModel events(&rec, 0);
  TierModel tiers(&rec, 0);
  Snapshot a;
  a.time_ms = kEpochMs;
  a.uptime_ms = 1'000;
  TierSample disk;
  disk.name = QStringLiteral("disk");
  disk.kind = QStringLiteral("disk");
  a.tiers = {disk};
  Snapshot b = a;
  b.time_ms += 1'000;
  b.uptime_ms += 1'000;
  b.tiers[0].evictions = 4;
  b.tiers[0].io_errors = 1;
  rec.add(a);
  rec.add(b);
  QVERIFY(events.index(EventModel::kEvictions, EventModel::kTotal).data(kMovedRole).toBool());
  QVERIFY(!FaultDelegate::Highlighted(events.index(EventModel::kEvictions, EventModel::kTotal)));
  QVERIFY(FaultDelegate::Highlighted(events.index(EventModel::kIoErrors, EventModel::kTotal)));
  QVERIFY(!FaultDelegate::Highlighted(tiers.index(0, TierModel::kEvictions)));
  QVERIFY(FaultDelegate::Highlighted(tiers.index(0, TierModel::kIoErrors)));
  // Drawn: the evictions cell in the base colour, the I/O errors one tinted.
  QTableView view;
  view.setModel(&events);
  view.setItemDelegate(new FaultDelegate(&view));
  view.resize(400, 260);
  view.show();
  QVERIFY(QTest::qWaitForWindowExposed(&view));
  const QImage image = view.viewport()->grab().toImage();
  const auto middle = [&](int row) {
    const QRect r = view.visualRect(events.index(row, EventModel::kPerSecond));
    return image.pixelColor(r.left() + 3, r.center().y());
  };
  const QColor routine = middle(EventModel::kEvictions), fault = middle(EventModel::kIoErrors);
  QVERIFY2(routine != fault, qPrintable(routine.name() + " " + fault.name()));
  QVERIFY2(fault.red() > fault.blue() + 40, qPrintable(fault.name()));  // the orange tint
  QVERIFY2(std::abs(routine.red() - routine.blue()) < 20, qPrintable(routine.name()));  // no tint
}

// The namespaces' quotas as the window draws them (a table over QuotaModel
// with the fault delegate): two namespaces on the host tier, their use of
// their quotas in bytes and %, evictions drawn plainly as they move, a
// refusal (a chunk larger than the quota) tinted.
void ViewsTest::theQuotaTableShowsEachNamespaceAndHighlightsOnlyRefusals() {
  Recorder rec;
  QuotaModel quotas(&rec, 0);
  Snapshot a;
  a.time_ms = kEpochMs;
  a.uptime_ms = 1'000;
  QuotaSample qa;
  qa.tier = QStringLiteral("host");
  qa.ns = QStringLiteral("tenant-a");
  qa.quota_bytes = 4 << 20;
  qa.used_bytes = 1 << 20;
  qa.objects = 16;
  QuotaSample qb = qa;
  qb.ns = QStringLiteral("tenant-b");
  qb.quota_bytes = 8 << 20;
  qb.used_bytes = 6 << 20;
  qb.objects = 96;
  a.quotas = {qa, qb};
  Snapshot b = a;
  b.time_ms += 1'000;
  b.uptime_ms += 1'000;
  b.quotas[0].quota_evictions = 5;
  b.quotas[1].room_evictions = 2;
  b.quotas[1].refused = 1;
  rec.add(a);
  rec.add(b);
  QTableView view;
  view.setModel(&quotas);
  view.setItemDelegate(new FaultDelegate(&view));
  view.resize(1000, 160);
  view.show();
  QVERIFY(QTest::qWaitForWindowExposed(&view));
  QCOMPARE(quotas.rowCount(), 2);
  const auto shown = [&](int row, int column) { return quotas.index(row, column).data().toString(); };
  QCOMPARE(shown(0, QuotaModel::kNamespace), QStringLiteral("tenant-a"));
  QCOMPARE(shown(0, QuotaModel::kUsedOfQuota), QStringLiteral("1.0 MiB / 4.0 MiB"));
  QCOMPARE(shown(0, QuotaModel::kShare), QStringLiteral("25.0 %"));
  QCOMPARE(shown(0, QuotaModel::kQuotaEvictionsPerS), QStringLiteral("5.0/s"));
  QCOMPARE(shown(1, QuotaModel::kNamespace), QStringLiteral("tenant-b"));
  QCOMPARE(shown(1, QuotaModel::kUsedOfQuota), QStringLiteral("6.0 MiB / 8.0 MiB"));
  QCOMPARE(shown(1, QuotaModel::kShare), QStringLiteral("75.0 %"));
  QCOMPARE(shown(1, QuotaModel::kObjects), QStringLiteral("96"));
  QCOMPARE(shown(1, QuotaModel::kRoomEvictions), QStringLiteral("2"));
  for (int row = 0; row < 2; ++row) {
    for (int c = 0; c < QuotaModel::kColumns; ++c) QVERIFY(view.visualRect(quotas.index(row, c)).isValid());
  }
  QVERIFY(quotas.index(0, QuotaModel::kQuotaEvictions).data(kMovedRole).toBool());
  QVERIFY(!FaultDelegate::Highlighted(quotas.index(0, QuotaModel::kQuotaEvictions)));
  QVERIFY(!FaultDelegate::Highlighted(quotas.index(1, QuotaModel::kRoomEvictions)));
  QVERIFY(FaultDelegate::Highlighted(quotas.index(1, QuotaModel::kRefused)));
  QVERIFY(!FaultDelegate::Highlighted(quotas.index(0, QuotaModel::kRefused)));
  const QImage image = view.viewport()->grab().toImage();
  const auto left = [&](int row, int column) {
    const QRect r = view.visualRect(quotas.index(row, column));
    return image.pixelColor(r.left() + 3, r.center().y());
  };
  const QColor refused = left(1, QuotaModel::kRefused), evicted = left(1, QuotaModel::kRoomEvictions);
  QVERIFY2(refused.red() > refused.blue() + 40, qPrintable(refused.name()));  // the orange tint
  QVERIFY2(std::abs(evicted.red() - evicted.blue()) < 20, qPrintable(evicted.name()));  // no tint
}

}  // namespace kdn::dash

QTEST_MAIN(kdn::dash::ViewsTest)
#include "views_test.moc"
