// SPDX-License-Identifier: Apache-2.0
#include "main_window.h"

#include <QFrame>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QSplitter>
#include <QTableView>
#include <QVBoxLayout>

#include <cmath>

#include "views.h"

namespace kdn::dash {
namespace {

QGroupBox* Box(const QString& title, QWidget* content, const QString& tip = {}) {
  auto* box = new QGroupBox(title);
  auto* layout = new QVBoxLayout(box);
  layout->setContentsMargins(4, 4, 4, 4);
  layout->addWidget(content);
  box->setToolTip(tip);
  return box;
}

QTableView* Table(QAbstractItemModel* model, QObject* owner) {
  auto* view = new QTableView;
  view->setModel(model);
  view->setItemDelegate(new MovedDelegate(owner));
  view->setAlternatingRowColors(true);
  view->setSelectionMode(QAbstractItemView::NoSelection);
  view->setEditTriggers(QAbstractItemView::NoEditTriggers);
  view->verticalHeader()->hide();
  view->verticalHeader()->setDefaultSectionSize(view->fontMetrics().height() + 6);
  view->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  view->horizontalHeader()->setStretchLastSection(true);
  view->setWordWrap(false);
  return view;
}

double LastValue(const QAbstractItemModel& m, int column) {
  const int rows = m.rowCount();
  if (rows == 0) return std::nan("");
  bool ok = false;
  const double v = m.data(m.index(rows - 1, column), kValueRole).toDouble(&ok);
  return ok ? v : std::nan("");
}

QString LastText(const QAbstractItemModel& m, int column) {
  const int rows = m.rowCount();
  return rows == 0 ? QStringLiteral("-") : m.data(m.index(rows - 1, column), Qt::DisplayRole).toString();
}

}  // namespace

MainWindow::MainWindow(Source* source, QWidget* parent)
    : QMainWindow(parent),
      source_(source),
      tiers_(new TierModel(&recorder_, 250, this)),
      history_(new HistoryModel(&recorder_, 250, this)),
      tier_hits_(new TierHitRateModel(&recorder_, 250, this)),
      events_(new EventModel(&recorder_, 250, this)),
      documents_(new DocumentModel(&recorder_, 250, this)) {
  setWindowTitle(tr("kdn dashboard: %1").arg(source_->describe()));

  // The banner: where the numbers come from and whether they are live.
  auto* banner_frame = new QFrame;
  banner_frame->setFrameShape(QFrame::StyledPanel);
  banner_frame->setAutoFillBackground(true);
  banner_frame->setBackgroundRole(QPalette::AlternateBase);
  auto* banner_layout = new QHBoxLayout(banner_frame);
  banner_layout->setContentsMargins(8, 4, 8, 4);
  banner_ = new QLabel;
  banner_->setTextFormat(Qt::RichText);
  numbers_ = new QLabel;
  numbers_->setAlignment(Qt::AlignRight | Qt::AlignVCenter);
  QFont strong = numbers_->font();
  strong.setBold(true);
  numbers_->setFont(strong);
  banner_layout->addWidget(banner_, 1);
  banner_layout->addWidget(numbers_);

  // Hit rate over time: tokens served from cache / tokens requested.
  auto* hit = new TimeChart(history_, HistoryModel::kTimeMs, tr("Hit rate (tokens found in cache / requested)"));
  hit->addLine(HistoryModel::kHitRate, tr("per reading"), Accent::kBlue, false, 100);
  hit->addLine(HistoryModel::kCumulativeHitRate, tr("since start"), Accent::kOrange, false, 100);
  // Per tier: its hits / (hits + misses), a dashed line each.
  hit->addColumnLines(tier_hits_, TierHitRateModel::kTimeMs, TierHitRateModel::kFirstTier, tr(" tier"),
                      {Accent::kGreen, Accent::kPurple, Accent::kRed}, 100);
  hit->setLeftAxis(tr("%"), 0, 100);
  hit->setEmptyNote(tr("no token counts"));

  // TTFT saved next to the time spent delivering it.
  auto* ttft = new TimeChart(history_, HistoryModel::kTimeMs, tr("TTFT saved and delivery time"));
  ttft->addLine(HistoryModel::kTtftSavedPerMin, tr("saved per min"), Accent::kGreen, false, 1e-3);
  ttft->addLine(HistoryModel::kDeliveryMsPerMin, tr("delivering per min"), Accent::kPurple, false, 1e-3);
  ttft->addLine(HistoryModel::kTtftSavedMs, tr("saved, total"), Accent::kOrange, true, 1e-3);
  ttft->setLeftAxis(tr("s per minute"));
  ttft->setRightAxis(tr("s total"));

  auto* occupancy = new TierBars(tiers_, TierBars::Mode::kOccupancy);
  auto* bandwidth = new TierBars(tiers_, TierBars::Mode::kBandwidth);
  auto* bars = new QWidget;
  auto* bars_layout = new QVBoxLayout(bars);
  bars_layout->setContentsMargins(0, 0, 0, 0);
  bars_layout->addWidget(Box(tr("Tier occupancy (watermarks: high red, low orange)"), occupancy,
                             tr("Bytes held against capacity; objects and the codec's bytes before/after encoding")));
  bars_layout->addWidget(Box(tr("Delivery bandwidth per tier"), bandwidth,
                             tr("Bytes read from each tier per second, against its measured limit when known")));

  auto* charts = new QSplitter(Qt::Horizontal);
  charts->addWidget(hit);
  charts->addWidget(ttft);
  charts->addWidget(bars);
  charts->setStretchFactor(0, 3);
  charts->setStretchFactor(1, 3);
  charts->setStretchFactor(2, 3);

  auto* tier_table = Table(tiers_, this);
  auto* doc_table = Table(documents_, this);
  auto* event_table = Table(events_, this);
  auto* lists = new QSplitter(Qt::Horizontal);
  lists->addWidget(Box(tr("Top knowledge items (hits, pins and their TTLs)"), doc_table));
  lists->addWidget(Box(tr("Events (highlighted when they move)"), event_table));
  lists->setStretchFactor(0, 3);
  lists->setStretchFactor(1, 2);

  auto* rows = new QSplitter(Qt::Vertical);
  rows->addWidget(charts);
  rows->addWidget(Box(tr("Tiers"), tier_table));
  rows->addWidget(lists);
  rows->setStretchFactor(0, 5);
  rows->setStretchFactor(1, 2);
  rows->setStretchFactor(2, 3);
  rows->setChildrenCollapsible(false);
  rows->setSizes({470, 150, 330});  // proportions: charts, the tiers' table, the lists

  auto* central = new QWidget;
  auto* layout = new QVBoxLayout(central);
  layout->setContentsMargins(6, 6, 6, 6);
  layout->setSpacing(6);
  layout->addWidget(banner_frame);
  layout->addWidget(rows, 1);
  setCentralWidget(central);

  connect(source_, &Source::snapshot, &recorder_, &Recorder::add);
  connect(source_, &Source::stateChanged, this, &MainWindow::onState);
  connect(history_, &QAbstractItemModel::rowsInserted, this, &MainWindow::updateHeadline);
  connect(history_, &QAbstractItemModel::dataChanged, this, &MainWindow::updateHeadline);
  onState(source_->state(), {});
  updateHeadline();
  source_->start();
}

MainWindow::~MainWindow() {
  // No snapshot may reach the recorder while it goes away.
  disconnect(source_, nullptr, this, nullptr);
  disconnect(source_, nullptr, &recorder_, nullptr);
}

void MainWindow::onState(Source::State state, const QString& why) {
  const QString where = source_->describe().toHtmlEscaped();
  QString text;
  Accent accent = Accent::kOrange;
  switch (state) {
    case Source::State::kConnected:
      text = tr("Connected to %1").arg(where);
      accent = Accent::kGreen;
      break;
    case Source::State::kConnecting: text = tr("Connecting to %1 ...").arg(where); break;
    case Source::State::kDisconnected:
      text = (recorder_.size() > 0 ? tr("Lost %1: %2. The history below is kept; reconnecting by itself.")
                                   : tr("Cannot reach %1: %2. Trying again by itself."))
                 .arg(where, why.isEmpty() ? tr("disconnected") : why.toHtmlEscaped());
      accent = Accent::kRed;
      break;
    case Source::State::kStopped: text = tr("Stopped (%1)").arg(where); break;
  }
  banner_->setText(QStringLiteral("<span style=\"color:%1\">&#9679;</span> %2")
                       .arg(AccentColor(accent).name(), text));
  banner_->setToolTip(why);
}

void MainWindow::updateHeadline() {
  numbers_->setText(tr("hit rate since start %1   TTFT saved %2   held %3")
                        .arg(LastText(*history_, HistoryModel::kCumulativeHitRate),
                             LastText(*history_, HistoryModel::kTtftSavedMs),
                             LastText(*history_, HistoryModel::kUsedBytes)));
}

Headline MainWindow::headline() const {
  Headline h;
  h.readings = history_->rowCount();
  const double hit = LastValue(*history_, HistoryModel::kCumulativeHitRate);
  h.cumulative_hit_rate = std::isnan(hit) ? -1 : hit;
  for (int r = 0; r < tiers_->rowCount(); ++r) {
    bool ok = false;
    const double rate = tiers_->data(tiers_->index(r, TierModel::kHitRate), kValueRole).toDouble(&ok);
    if (ok && !std::isnan(rate) && rate > h.tier_hit_rate) {
      h.tier_hit_rate = rate;
      h.tier = tiers_->data(tiers_->index(r, TierModel::kName)).toString();
    }
    const double used = tiers_->data(tiers_->index(r, TierModel::kUsedBytes), kValueRole).toDouble(&ok);
    if (ok && !std::isnan(used)) h.used_bytes += used;
  }
  const double saved = LastValue(*history_, HistoryModel::kTtftSavedMs);
  h.ttft_saved_ms = std::isnan(saved) ? 0 : saved;
  return h;
}

}  // namespace kdn::dash
