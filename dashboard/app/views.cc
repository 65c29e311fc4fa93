// SPDX-License-Identifier: Apache-2.0
#include "views.h"

#include <QChart>
#include <QDateTime>
#include <QDateTimeAxis>
#include <QEvent>
#include <QLegendMarker>
#include <QLineSeries>
#include <QPainter>
#include <QPainterPath>
#include <QValueAxis>

#include <algorithm>
#include <cmath>
#include <limits>

#include "models.h"

namespace kdn::dash {

QColor AccentColor(Accent a) {
  switch (a) {
    case Accent::kBlue: return QColor(0x3d, 0x8e, 0xe0);
    case Accent::kOrange: return QColor(0xe8, 0x8a, 0x1a);
    case Accent::kGreen: return QColor(0x2e, 0xa8, 0x5a);
    case Accent::kPurple: return QColor(0x9b, 0x6b, 0xd6);
    case Accent::kRed: return QColor(0xd9, 0x4a, 0x4a);
  }
  return QColor(0x80, 0x80, 0x80);
}

namespace {

double ValueAt(const QAbstractItemModel* m, int row, int column) {
  const QVariant v = m->data(m->index(row, column), kValueRole);
  bool ok = false;
  const double d = v.toDouble(&ok);
  return ok ? d : std::numeric_limits<double>::quiet_NaN();
}

// A range from 0 to a little above the largest value (1 when all are 0).
double NiceMax(double max) {
  if (!(max > 0)) return 1;
  const double step = std::pow(10.0, std::floor(std::log10(max)));
  for (double m : {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0}) {
    if (m * step >= max * 1.05) return m * step;
  }
  return 10 * step;
}

}  // namespace

TimeChart::TimeChart(const QAbstractItemModel* model, int time_column, const QString& title, QWidget* parent)
    : QChartView(parent), model_(model), time_column_(time_column), title_(title), chart_(new QChart) {
  chart_->setTitle(title);
  chart_->legend()->setAlignment(Qt::AlignBottom);
  chart_->setMargins(QMargins(4, 4, 4, 4));
  chart_->setBackgroundRoundness(0);
  x_ = new QDateTimeAxis;
  x_->setFormat("hh:mm:ss");
  x_->setTickCount(5);
  left_ = new QValueAxis;
  left_->setLabelFormat("%.3g");
  chart_->addAxis(x_, Qt::AlignBottom);
  chart_->addAxis(left_, Qt::AlignLeft);
  setChart(chart_);
  setRenderHint(QPainter::Antialiasing);
  setMinimumSize(240, 180);
  applyPalette();
  watch(model_);
  rebuild();
}

void TimeChart::watch(const QAbstractItemModel* model) {
  connect(model, &QAbstractItemModel::rowsInserted, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::rowsRemoved, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::columnsInserted, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::columnsRemoved, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::dataChanged, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::headerDataChanged, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::modelReset, this, &TimeChart::schedule);
  connect(model, &QAbstractItemModel::layoutChanged, this, &TimeChart::schedule);
}

void TimeChart::addLine(int column, const QString& name, Accent accent, bool right, double scale) {
  QPen pen(AccentColor(accent));
  pen.setWidthF(2);
  QLineSeries* s = addSeries(pen, right);
  s->setName(name);
  lines_.push_back({model_, time_column_, column, s, right, scale, -1});
  applyPalette();
  rebuild();
}

void TimeChart::addColumnLines(const QAbstractItemModel* model, int time_column, int first_column, const QString& suffix,
                               const QVector<Accent>& accents, double scale) {
  if (model == nullptr || accents.isEmpty()) return;
  groups_.push_back({model, time_column, first_column, suffix, accents, scale});
  if (model != model_) watch(model);
  rebuild();
}

void TimeChart::followColumns() {
  for (int g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    const int want = std::max(0, group.model->columnCount() - group.first_column);
    int have = static_cast<int>(std::count_if(lines_.begin(), lines_.end(), [g](const Line& l) { return l.group == g; }));
    if (have < want) QMetaObject::invokeMethod(this, &TimeChart::applyPalette, Qt::QueuedConnection);  // the new legend labels
    for (; have < want; ++have) {
      QPen pen(AccentColor(group.accents[have % group.accents.size()]));
      pen.setWidthF(1.5);
      pen.setStyle(Qt::DashLine);
      lines_.push_back({group.model, group.time_column, group.first_column + have, addSeries(pen, false), false,
                        group.scale, g});
    }
    for (int i = static_cast<int>(lines_.size()) - 1; i >= 0 && have > want; --i) {
      if (lines_[i].group != g) continue;
      chart_->removeSeries(lines_[i].series);
      delete lines_[i].series;
      lines_.remove(i);
      --have;
    }
    // Named by the header: a column may stand for another tier after a reset.
    for (Line& line : lines_) {
      if (line.group != g) continue;
      line.series->setName(group.model->headerData(line.column, Qt::Horizontal).toString() + group.suffix);
    }
  }
}

QLineSeries* TimeChart::addSeries(const QPen& pen, bool right) {
  auto* s = new QLineSeries;
  s->setPen(pen);
  chart_->addSeries(s);
  s->attachAxis(x_);
  if (right) {
    if (right_ == nullptr) {
      right_ = new QValueAxis;
      right_->setLabelFormat("%.3g");
      chart_->addAxis(right_, Qt::AlignRight);
    }
    s->attachAxis(right_);
  } else {
    s->attachAxis(left_);
  }
  return s;
}

void TimeChart::setLeftAxis(const QString& title, double min, double max) {
  left_->setTitleText(title);
  left_min_ = min;
  left_max_ = max;
  if (max > min) {  // ticks at fifths of the fixed range, none in the headroom above it
    left_->setTickType(QValueAxis::TicksDynamic);
    left_->setTickAnchor(min);
    left_->setTickInterval((max - min) / 5);
  }
  rebuild();
}

void TimeChart::setRightAxis(const QString& title) {
  if (right_ != nullptr) right_->setTitleText(title);
}

int TimeChart::points(int line) const {
  return line >= 0 && line < lines_.size() ? static_cast<int>(lines_[line].series->count()) : 0;
}

// The model may send several signals for one update (rows inserted, old
// ones removed, cells changed): they are drawn together, once control
// returns to the event loop.
void TimeChart::schedule() {
  if (pending_) return;
  pending_ = true;
  QMetaObject::invokeMethod(
      this,
      [this] {
        pending_ = false;
        rebuild();
      },
      Qt::QueuedConnection);
}

void TimeChart::rebuild() {
  followColumns();
  const int rows = model_->rowCount();
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0;
  double max_left = 0, max_right = 0;
  for (Line& line : lines_) {
    const int line_rows = line.model->rowCount();
    QList<QPointF> pts;
    pts.reserve(line_rows);
    for (int r = 0; r < line_rows; ++r) {
      const double t = ValueAt(line.model, r, line.time_column);
      const double y = ValueAt(line.model, r, line.column) * line.scale;
      if (std::isnan(t) || std::isnan(y)) continue;
      pts.append(QPointF(t, y));
      t0 = std::min(t0, t);
      t1 = std::max(t1, t);
      (line.right ? max_right : max_left) = std::max(line.right ? max_right : max_left, y);
    }
    line.series->replace(pts);
  }
  if (t0 <= t1) {
    chart_->setTitle(title_);
  } else {
    const QString note = rows > 0 && !empty_note_.isEmpty() ? empty_note_ : tr("nothing reported yet");
    chart_->setTitle(title_ + " (" + note + ")");
  }
  if (!(t0 <= t1)) {  // nothing yet: the last minute up to now
    t1 = static_cast<double>(QDateTime::currentMSecsSinceEpoch());
    t0 = t1 - 60000;
  }
  if (t1 - t0 < 10000) t0 = t1 - 10000;  // at least ten seconds wide
  x_->setRange(QDateTime::fromMSecsSinceEpoch(static_cast<qint64>(t0)),
               QDateTime::fromMSecsSinceEpoch(static_cast<qint64>(t1)));
  if (left_max_ > left_min_) {
    // A little headroom, so a line at the maximum is not drawn on the frame.
    left_->setRange(left_min_, left_max_ + (left_max_ - left_min_) * 0.04);
  } else {
    left_->setRange(0, NiceMax(max_left));
    left_->applyNiceNumbers();  // round ticks
  }
  if (right_ != nullptr) {
    right_->setRange(0, NiceMax(max_right));
    right_->applyNiceNumbers();
  }
}

void TimeChart::changeEvent(QEvent* e) {
  QChartView::changeEvent(e);
  if (e->type() == QEvent::PaletteChange || e->type() == QEvent::StyleChange) applyPalette();
}

// The chart's own theme is light; these follow the window's palette instead.
void TimeChart::applyPalette() {
  const QPalette& p = palette();
  chart_->setBackgroundBrush(p.base());
  chart_->setBackgroundPen(Qt::NoPen);
  chart_->setTitleBrush(p.text());
  chart_->legend()->setLabelColor(p.text().color());
  QColor grid = p.text().color();
  grid.setAlpha(40);
  for (QAbstractAxis* axis : chart_->axes()) {
    axis->setLabelsColor(p.text().color());
    axis->setTitleBrush(p.text());
    axis->setLinePenColor(p.mid().color());
    axis->setGridLineColor(grid);
  }
  QFont title = chart_->titleFont();
  title.setBold(true);
  chart_->setTitleFont(title);
}

TierBars::TierBars(const QAbstractItemModel* tiers, Mode mode, QWidget* parent)
    : QWidget(parent), model_(tiers), mode_(mode) {
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Preferred);
  auto repaint = [this] {
    updateGeometry();
    update();
  };
  connect(model_, &QAbstractItemModel::dataChanged, this, repaint);
  connect(model_, &QAbstractItemModel::rowsInserted, this, repaint);
  connect(model_, &QAbstractItemModel::rowsRemoved, this, repaint);
  connect(model_, &QAbstractItemModel::modelReset, this, repaint);
  connect(model_, &QAbstractItemModel::layoutChanged, this, repaint);
}

double TierBars::value(int row, int column) const { return ValueAt(model_, row, column); }

QString TierBars::text(int row, int column) const {
  return model_->data(model_->index(row, column), Qt::DisplayRole).toString();
}

// Per tier: a line of words, the bar, and (occupancy) a line of details.
int TierBars::lines() const { return mode_ == Mode::kOccupancy ? 3 : 2; }

QSize TierBars::sizeHint() const {
  const int line = fontMetrics().height();
  return QSize(320, std::max(1, model_->rowCount()) * (lines() * line + 14) + 4);
}

QSize TierBars::minimumSizeHint() const {
  const int line = fontMetrics().height();
  return QSize(200, std::max(1, model_->rowCount()) * (lines() * line + 8));
}

void TierBars::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing);
  const QPalette& pal = palette();
  const int rows = model_->rowCount();
  const int line = fontMetrics().height();
  if (rows == 0) {
    p.setPen(pal.color(QPalette::PlaceholderText));
    p.drawText(rect(), Qt::AlignCenter, tr("no tiers reported yet"));
    return;
  }
  const int slot = std::max(lines() * line + 8, height() / rows);
  const int bar_h = std::clamp(slot - (lines() - 1) * line - 12, 8, line + 4);
  // Bandwidth without a known limit: against the fastest tier.
  double max_rate = 0;
  for (int r = 0; r < rows; ++r) {
    const double v = value(r, TierModel::kBytesOutPerS);
    if (!std::isnan(v)) max_rate = std::max(max_rate, v);
  }
  for (int r = 0; r < rows; ++r) {
    const int top = r * slot + 2;
    const QRect words(4, top, width() - 8, line);
    const QRectF bar(4, top + line + 3, width() - 8, bar_h);
    const QRect details(4, static_cast<int>(bar.bottom()) + 2, width() - 8, line);
    double fraction = 0;
    QString label, detail;
    QVector<std::pair<double, QColor>> marks;
    const QString name = text(r, TierModel::kName) + " (" + text(r, TierModel::kKind) + ")";
    if (mode_ == Mode::kOccupancy) {
      const double used = value(r, TierModel::kUsedBytes), cap = value(r, TierModel::kCapacityBytes);
      fraction = cap > 0 && !std::isnan(used) ? used / cap : 0;
      label = name + ":  " + text(r, TierModel::kUsedBytes) + " of " + text(r, TierModel::kCapacityBytes) + " (" +
              text(r, TierModel::kOccupancy) + ")";
      detail = text(r, TierModel::kObjects) + tr(" objects;  codec ") + text(r, TierModel::kCodec) +
               tr(", before/after ") + text(r, TierModel::kCompression);
      const double hw = value(r, TierModel::kHighWatermark), lw = value(r, TierModel::kLowWatermark);
      if (hw > 0) marks.push_back({hw, AccentColor(Accent::kRed)});
      if (lw > 0) marks.push_back({lw, AccentColor(Accent::kOrange)});
    } else {
      const double rate = value(r, TierModel::kBytesOutPerS), limit = value(r, TierModel::kLimitBytesPerS);
      const bool known = limit > 0;
      const double scale = known ? limit : max_rate;
      fraction = scale > 0 && rate > 0 ? rate / scale : 0;
      label = name + ":  " + text(r, TierModel::kBytesOutPerS) +
              (known ? tr(" of a measured limit of ") + text(r, TierModel::kLimitBytesPerS)
                     : tr(" (limit not measured)"));
      if (known) marks.push_back({1.0, AccentColor(Accent::kRed)});
    }
    fraction = std::clamp(fraction, 0.0, 1.0);
    p.setPen(pal.color(QPalette::WindowText));
    p.drawText(words, Qt::AlignLeft | Qt::AlignVCenter, fontMetrics().elidedText(label, Qt::ElideRight, words.width()));
    if (!detail.isEmpty()) {
      p.drawText(details, Qt::AlignLeft | Qt::AlignVCenter,
                 fontMetrics().elidedText(detail, Qt::ElideRight, details.width()));
    }
    p.setPen(QPen(pal.color(QPalette::Mid), 1));
    p.setBrush(pal.base());
    p.drawRoundedRect(bar, 3, 3);
    if (fraction > 0) {
      QRectF fill = bar.adjusted(1, 1, -1, -1);
      fill.setWidth(std::max(2.0, fill.width() * fraction));
      p.setPen(Qt::NoPen);
      p.setBrush(AccentColor(mode_ == Mode::kOccupancy ? Accent::kBlue : Accent::kGreen));
      p.drawRoundedRect(fill, 2, 2);
    }
    for (const auto& [at, colour] : marks) {
      const double x = bar.left() + bar.width() * std::clamp(at, 0.0, 1.0);
      p.setPen(QPen(colour, 2));
      p.drawLine(QPointF(x, bar.top() - 2), QPointF(x, bar.bottom() + 2));
    }
  }
}

void MovedDelegate::initStyleOption(QStyleOptionViewItem* option, const QModelIndex& index) const {
  QStyledItemDelegate::initStyleOption(option, index);
  if (!index.data(kMovedRole).toBool()) return;
  QColor tint = AccentColor(Accent::kOrange);
  tint.setAlpha(110);
  option->backgroundBrush = tint;
  option->font.setBold(true);
}

}  // namespace kdn::dash
