// SPDX-License-Identifier: Apache-2.0
#include "main_window.h"

#include <QFrame>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QIdentityProxyModel>
#include <QLabel>
#include <QRegularExpression>
#include <QScrollBar>
#include <QSplitter>
#include <QStyleOptionGroupBox>
#include <QTableView>
#include <QVBoxLayout>

#include <algorithm>
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

// The tiers' table as shown: headers of two words on two lines ("High"
// over "watermark"), and a long codec spec on lines of a few parameters
// ("zstd:level=3," over "shuffle=1"), so its eighteen columns fit in 1280
// pixels without scrolling whatever the codecs.
class TierTable final : public QIdentityProxyModel {
 public:
  using QIdentityProxyModel::QIdentityProxyModel;
  QVariant headerData(int section, Qt::Orientation o, int role) const override {
    QVariant v = QIdentityProxyModel::headerData(section, o, role);
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return v;
    QString text = v.toString();
    const qsizetype space = text.indexOf(QLatin1Char(' '));
    if (space > 0) text[space] = QLatin1Char('\n');
    return text;
  }
  QVariant data(const QModelIndex& index, int role) const override {
    QVariant v = QIdentityProxyModel::data(index, role);
    if (role != Qt::DisplayRole || index.column() != TierModel::kCodec) return v;
    // Broken after a comma once a line has kLine characters.
    constexpr qsizetype kLine = 12;
    const QStringList parts = v.toString().split(QLatin1Char(','));
    QString text, line;
    for (qsizetype i = 0; i < parts.size(); ++i) {
      const QString part = parts[i] + (i + 1 < parts.size() ? QStringLiteral(",") : QString());
      if (!line.isEmpty() && line.size() + part.size() > kLine) {
        text += line + QLatin1Char('\n');
        line.clear();
      }
      line += part;
    }
    return text + line;
  }
};

QTableView* Table(QAbstractItemModel* model, QObject* owner) {
  auto* view = new QTableView;
  view->setModel(model);
  view->setItemDelegate(new FaultDelegate(owner));
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

// At least `rows` rows of the table are shown (each as tall as its
// contents), with its header, without scrolling.
void ShowRows(QTableView* view, int rows) {
  int height = view->horizontalHeader()->sizeHint().height() + 2 * view->frameWidth() + 2;
  const int have = view->model()->rowCount();
  for (int r = 0; r < rows; ++r) {
    const int hint = r < have ? static_cast<const QAbstractItemView*>(view)->sizeHintForRow(r) : 0;
    height += std::max(view->verticalHeader()->defaultSectionSize(), hint);
  }
  view->setMinimumHeight(height);
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
      documents_(new DocumentModel(&recorder_, 250, this)),
      quotas_(new QuotaModel(&recorder_, 250, this)) {
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

  // Hit rate over time. Two quantities, said apart: the overall (solid) is
  // tokens found / tokens requested over the engines' requests, a tier's
  // (dashed) its chunk reads that hit.
  auto* hit = new TimeChart(history_, HistoryModel::kTimeMs);
  hit->addLine(HistoryModel::kHitRate, tr("overall, per reading"), Accent::kBlue, false, 100);
  hit->addLine(HistoryModel::kCumulativeHitRate, tr("overall, since start"), Accent::kOrange, false, 100);
  hit->addColumnLines(tier_hits_, TierHitRateModel::kTimeMs, TierHitRateModel::kFirstTier, tr(" tier"),
                      {Accent::kGreen, Accent::kPurple, Accent::kRed}, 100);
  hit->setLeftAxis(tr("hit rate, %"), 0, 100);
  hit->setEmptyNote(tr("no token counts"));
  hit->setNote(tr("Overall: tokens found / tokens requested by the engines. A tier: its chunk hits / "
                  "(hits + misses). Not the same (see the tooltip)."));
  hit->setExplanation(
      tr("Solid lines (overall): the tokens of the engines' requests found in cache / the tokens they requested, "
         "per reading and since start (a kdnd: as its runtimes report their engines' lookups; a runtime: its "
         "lookups' tokens).\n"
         "Dashed lines (per tier): that tier's chunk reads that hit, hits / (hits + misses), per reading.\n"
         "Not the same quantity, so the overall may lie below (or above) every tier's line: it counts every "
         "token requested, also those no tier is ever asked for (the chunks after a request's first missing "
         "one, and a prompt's last partial chunk, never stored), and weighs by tokens, not reads; a lower tier "
         "is only asked for what the tiers above it lacked."));

  // TTFT saved next to the time spent delivering it; the note says whether
  // it is measured or priced (updateTtftNote).
  auto* ttft = new TimeChart(history_, HistoryModel::kTimeMs);
  ttft->addLine(HistoryModel::kTtftSavedPerMin, tr("saved per min"), Accent::kGreen, false, 1e-3);
  ttft->addLine(HistoryModel::kDeliveryMsPerMin, tr("delivering per min"), Accent::kPurple, false, 1e-3);
  ttft->addLine(HistoryModel::kTtftSavedMs, tr("saved in total (right axis)"), Accent::kOrange, true, 1e-3);
  ttft->setLeftAxis(tr("s per minute"));
  ttft->setRightAxis(tr("s in total"));
  hit_chart_ = hit;
  ttft_chart_ = ttft;

  auto* occupancy = new TierBars(tiers_, TierBars::Mode::kOccupancy);
  auto* bandwidth = new TierBars(tiers_, TierBars::Mode::kBandwidth);
  auto* bars = new QWidget;
  auto* bars_layout = new QVBoxLayout(bars);
  bars_layout->setContentsMargins(0, 0, 0, 0);
  bars_layout->addWidget(Box(tr("Tier occupancy (watermarks: high red, low orange)"), occupancy,
                             tr("Bytes held against capacity; objects and the codec's bytes before/after encoding")));
  bars_layout->addWidget(Box(tr("Delivery bandwidth per tier"), bandwidth,
                             tr("Bytes read from each tier per second, against its measured limit; a tier whose "
                                "limit is not measured (yet) has no bar")),
                         1);

  auto* charts = new QSplitter(Qt::Horizontal);
  charts->addWidget(Box(tr("Hit rate"), hit));
  charts->addWidget(Box(tr("TTFT saved and time spent delivering"), ttft));
  charts->addWidget(bars);
  charts->setStretchFactor(0, 3);
  charts->setStretchFactor(1, 3);
  charts->setStretchFactor(2, 3);

  auto* tier_shown = new TierTable(this);
  tier_shown->setSourceModel(tiers_);
  auto* tier_table = Table(tier_shown, this);
  tier_table->horizontalHeader()->setDefaultAlignment(Qt::AlignCenter);
  tier_table->verticalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);  // a codec on two lines
  auto* doc_table = Table(documents_, this);
  auto* event_table = Table(events_, this);
  tier_table_ = tier_table;
  event_table_ = event_table;
  // The namespaces' quotas: shown once the source reports one (a kdnd's
  // tier.quotas, a runtime's kdn_tier_config.quotas); most stores have none.
  auto* quota_table = Table(quotas_, this);
  quota_table_ = quota_table;
  auto* quota_box = Box(tr("Namespace quotas (used of each quota; evictions since start and per second)"), quota_table,
                        tr("Each namespace with a quota in a tier: the bytes its chunks take of its quota, its chunks "
                           "evicted to keep it within the quota (own) and for the tier's room, and its puts refused "
                           "(a chunk larger than its quota, highlighted when they move)"));
  quota_box->setVisible(false);
  auto* lists = new QSplitter(Qt::Horizontal);
  lists->addWidget(Box(tr("Top knowledge items (hits, pins and their TTLs)"), doc_table));
  lists->addWidget(Box(tr("Events (faults highlighted when they move)"), event_table,
                       tr("Evictions, demotions and promotions are routine (a full tier makes room) and drawn "
                          "plainly; the faults below them are highlighted when they move")));
  lists->setStretchFactor(0, 3);
  lists->setStretchFactor(1, 2);

  auto* rows = new QSplitter(Qt::Vertical);
  rows->addWidget(charts);
  rows->addWidget(Box(tr("Tiers (faults highlighted when they move)"), tier_table));
  rows->addWidget(quota_box);
  rows->addWidget(lists);
  rows->setStretchFactor(0, 5);
  rows->setStretchFactor(1, 1);
  rows->setStretchFactor(2, 1);
  rows->setStretchFactor(3, 2);
  rows->setChildrenCollapsible(false);
  rows->setSizes({420, 110, 0, 230});  // proportions: charts, the tiers' table, the quotas (hidden), the lists

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
  // Every tier's row and every event's is shown; the charts take the rest.
  const auto show_tiers = [tier_table] { ShowRows(tier_table, tier_table->model()->rowCount()); };
  connect(tiers_, &QAbstractItemModel::rowsInserted, this, show_tiers);
  connect(tiers_, &QAbstractItemModel::rowsRemoved, this, show_tiers);
  connect(tiers_, &QAbstractItemModel::dataChanged, this, show_tiers);
  // The quotas' box once there is a quota; up to four rows shown, more scroll.
  const auto show_quotas = [quota_table, quota_box] {
    const int n = quota_table->model()->rowCount();
    quota_box->setVisible(n > 0);
    ShowRows(quota_table, std::min(n, 4));
  };
  connect(quotas_, &QAbstractItemModel::rowsInserted, this, show_quotas);
  connect(quotas_, &QAbstractItemModel::rowsRemoved, this, show_quotas);
  connect(quotas_, &QAbstractItemModel::modelReset, this, show_quotas);
  ShowRows(tier_table, 2);
  ShowRows(event_table, EventModel::kRows);
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
  const double basis = LastValue(*history_, HistoryModel::kTtftBasis);
  const QString how = basis == 1 ? tr(" (priced)") : basis == 2 ? tr(" (measured)") : QString();
  numbers_->setText(tr("hit rate since start %1   TTFT saved %2%3   held %4")
                        .arg(LastText(*history_, HistoryModel::kCumulativeHitRate),
                             LastText(*history_, HistoryModel::kTtftSavedMs), how,
                             LastText(*history_, HistoryModel::kUsedBytes)));
  updateTtftNote();
}

// Whether TTFT saved is a measure or a price, and at how much per token.
void MainWindow::updateTtftNote() {
  const double basis = LastValue(*history_, HistoryModel::kTtftBasis);
  const double price = LastValue(*history_, HistoryModel::kPrefillUsPerToken);
  const QString per_token = LastText(*history_, HistoryModel::kPrefillUsPerToken);
  QString note, tip;
  if (basis == 1) {
    note = std::isnan(price)
               ? tr("TTFT saved is priced, not measured: tokens kdnd served x the prefill time per token set in "
                    "kdnd's config (server.prefill_us_per_token; 0 or no token served yet).")
               : tr("TTFT saved is priced at %1, kdnd's config (server.prefill_us_per_token), x the tokens it "
                    "served; not measured.")
                     .arg(per_token);
    tip = tr("kdnd does not see the engines' prefills: its TTFT saved is the tokens it served (hitTokens) x "
             "server.prefill_us_per_token, a price set in its config (read back here as TTFT saved / tokens "
             "served). The delivery time is the time kdnd spent serving gets.");
  } else if (basis == 2) {
    note = std::isnan(price)
               ? tr("TTFT saved is measured from the prefills the engines report (kdn_model_report_prefill); "
                    "none reported yet.")
               : tr("TTFT saved is measured from the engines' reported prefills (kdn_model_report_prefill, mean "
                    "%1) x the tokens loads served.")
                     .arg(per_token);
    tip = tr("A runtime prices each load's tokens at its model's mean prefill time per token as its engine "
             "reported it (kdn_stats.ttft_saved_ns), and each RAG blend at the share of positions it did not "
             "recompute. The delivery time is the time spent in loads (kdn_stats.delivery_ns).");
  }
  ttft_chart_->setNote(note);
  ttft_chart_->setExplanation(tip);
}

QStringList MainWindow::layoutProblems() const {
  QStringList problems;
  const auto name = [](const QWidget* w, const QString& text) {
    QString t = text.simplified();
    t.remove(QRegularExpression(QStringLiteral("<[^>]*>")));
    if (t.size() > 60) t = t.left(57) + QStringLiteral("...");
    return QStringLiteral("%1 \"%2\"").arg(QString::fromUtf8(w->metaObject()->className()), t);
  };
  for (const QLabel* label : findChildren<QLabel*>()) {
    if (!label->isVisible() || label->text().isEmpty()) continue;
    const QRect has = label->contentsRect();
    if (label->wordWrap()) {
      // Wrapped: all its lines in the height it was given.
      const int needs = label->heightForWidth(label->width());
      if (needs > label->height()) {
        problems << tr("%1 needs %2 px of height at width %3, has %4").arg(name(label, label->text())).arg(needs)
                        .arg(label->width()).arg(label->height());
      }
    } else if (label->sizeHint().width() > label->width() || label->sizeHint().height() > label->height()) {
      problems << tr("%1 needs %2x%3, has %4x%5")
                      .arg(name(label, label->text()))
                      .arg(label->sizeHint().width())
                      .arg(label->sizeHint().height())
                      .arg(has.width())
                      .arg(has.height());
    }
  }
  for (const QGroupBox* box : findChildren<QGroupBox*>()) {
    if (!box->isVisible() || box->title().isEmpty()) continue;
    QStyleOptionGroupBox opt;
    opt.initFrom(box);
    opt.text = box->title();
    opt.subControls = QStyle::SC_GroupBoxLabel | QStyle::SC_GroupBoxFrame;
    const QRect title = box->style()->subControlRect(QStyle::CC_GroupBox, &opt, QStyle::SC_GroupBoxLabel, box);
    if (box->fontMetrics().horizontalAdvance(box->title()) > title.width() || title.right() > box->width()) {
      problems << tr("%1: the title needs %2 px, has %3").arg(name(box, box->title()))
                      .arg(box->fontMetrics().horizontalAdvance(box->title())).arg(box->width());
    }
  }
  for (const QTableView* table : findChildren<QTableView*>()) {
    if (!table->isVisible() || table->model() == nullptr) continue;
    const QHeaderView* header = table->horizontalHeader();
    const QString which = name(table, table->model()->headerData(0, Qt::Horizontal).toString() + QStringLiteral(", ..."));
    if (table->horizontalScrollBar()->isVisible()) problems << tr("%1 scrolls sideways").arg(which);
    const int viewport = table->viewport()->width();
    for (int c = 0; c < table->model()->columnCount(); ++c) {
      if (header->isSectionHidden(c)) {
        problems << tr("%1: column %2 is hidden").arg(which).arg(c);
        continue;
      }
      const int at = header->sectionViewportPosition(c), size = header->sectionSize(c);
      const QString column = table->model()->headerData(c, Qt::Horizontal).toString().simplified();
      if (at < 0 || at + size > viewport) {
        problems << tr("%1: column \"%2\" at %3..%4 is not within the viewport's %5 px")
                        .arg(which, column).arg(at).arg(at + size).arg(viewport);
      }
      const int needs = std::max(header->sectionSizeHint(c), static_cast<const QAbstractItemView*>(table)->sizeHintForColumn(c));
      if (size < needs) {
        problems << tr("%1: column \"%2\" is %3 px, its contents need %4").arg(which, column).arg(size).arg(needs);
      }
    }
    // Every tier's and every event's row (the documents and the quotas may scroll: long lists).
    if ((table == tier_table_ || table == event_table_) && table->verticalScrollBar()->isVisible()) {
      problems << tr("%1 scrolls: not every row is shown").arg(which);
    }
  }
  for (const TimeChart* chart : {hit_chart_, ttft_chart_}) {
    const QString problem = chart->timeAxisProblem();
    if (!problem.isEmpty()) {
      const auto* box = qobject_cast<const QGroupBox*>(chart->parentWidget());
      problems << tr("chart \"%1\": %2").arg(box != nullptr ? box->title() : QString(), problem);
    }
  }
  return problems;
}

QStringList MainWindow::highlightProblems(int* routine_moved) const {
  // Listed here by name, apart from the models' own marks: the check is of
  // what is drawn (FaultDelegate's decision), against what an operator
  // calls routine.
  static const QStringList kRoutine = {QStringLiteral("Evictions"), QStringLiteral("Demotions"),
                                       QStringLiteral("Promotions"), QStringLiteral("Own evictions"),
                                       QStringLiteral("Room evictions")};
  static const QStringList kFaults = {QStringLiteral("Corrupt"),       QStringLiteral("Corrupt chunks"),
                                      QStringLiteral("I/O errors"),    QStringLiteral("Failed loads"),
                                      QStringLiteral("Auth failures"), QStringLiteral("Decode failures"),
                                      QStringLiteral("Refused")};
  QStringList problems;
  int routine = 0;
  const auto look = [&](const QAbstractItemModel* m, const QString& table, bool by_row) {
    for (int r = 0; r < m->rowCount(); ++r) {
      for (int c = 0; c < m->columnCount(); ++c) {
        const QModelIndex i = m->index(r, c);
        const QString what = by_row ? m->index(r, 0).data().toString()
                                    : m->headerData(c, Qt::Horizontal).toString().simplified();
        const bool lit = FaultDelegate::Highlighted(i), moved = i.data(kMovedRole).toBool();
        const QString where = tr("%1: \"%2\" (row %3, column %4)").arg(table, what).arg(r).arg(c);
        if (lit && !kFaults.contains(what)) problems << tr("%1 is highlighted but is not a fault").arg(where);
        if (!lit && moved && kFaults.contains(what)) problems << tr("%1 moved but is not highlighted").arg(where);
        if (moved && kRoutine.contains(what) && !lit) ++routine;
      }
    }
  };
  look(tier_table_->model(), tr("tiers"), false);
  look(event_table_->model(), tr("events"), true);
  look(quota_table_->model(), tr("quotas"), false);
  if (routine_moved != nullptr) *routine_moved = routine;
  return problems;
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
