// SPDX-License-Identifier: Apache-2.0
#include "views.h"

#include <QChart>
#include <QDateTime>
#include <QEvent>
#include <QGraphicsTextItem>
#include <QLabel>
#include <QLineSeries>
#include <QPainter>
#include <QPainterPath>
#include <QResizeEvent>
#include <QValueAxis>
#include <QVBoxLayout>

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

WrapLabel::WrapLabel(Qt::TextFormat format, QWidget* parent) : QLabel(parent) {
  setTextFormat(format);
  setWordWrap(true);
  setSizePolicy(QSizePolicy::Preferred, QSizePolicy::Minimum);
}

QSize WrapLabel::sizeHint() const {
  const QSize one_line = QLabel::sizeHint();
  return QSize(one_line.width(), heightForWidth(width() > 0 ? width() : one_line.width()));
}

QSize WrapLabel::minimumSizeHint() const {
  const int w = width() > 0 ? width() : QLabel::sizeHint().width();
  return QSize(std::min(w, 12 * fontMetrics().averageCharWidth()), heightForWidth(w));
}

void WrapLabel::resizeEvent(QResizeEvent* e) {
  QLabel::resizeEvent(e);
  if (e->size().width() != e->oldSize().width()) updateGeometry();  // another width, another height
}

TimeChart::TimeChart(const QAbstractItemModel* model, int time_column, QWidget* parent)
    : QWidget(parent),
      model_(model),
      time_column_(time_column),
      view_(new QChartView),
      key_(new WrapLabel(Qt::RichText)),
      note_(new WrapLabel(Qt::PlainText)),
      chart_(new QChart) {
  // The key is a label of its own: the chart's legend would cut long names.
  chart_->legend()->hide();
  chart_->setMargins(QMargins(2, 2, 2, 2));
  chart_->setBackgroundRoundness(0);
  // Time before the latest reading, drawn with 0 (the latest) at the right.
  // (A QDateTimeAxis is not used: Qt 6.4 lays out no labels for one that
  // gets a series after the chart is shown, as a tier's line is added when
  // the tier first reports; the old dashboard's charts had no time labels.)
  x_ = new QValueAxis;
  x_->setReverse(true);
  x_->setLabelFormat("%.0f");
  left_ = new QValueAxis;
  left_->setLabelFormat("%.3g");
  chart_->addAxis(x_, Qt::AlignBottom);
  chart_->addAxis(left_, Qt::AlignLeft);
  view_->setChart(chart_);
  view_->setRenderHint(QPainter::Antialiasing);
  view_->setMinimumSize(200, 150);
  note_->hide();
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(2);
  layout->addWidget(view_, 1);
  layout->addWidget(key_);
  layout->addWidget(note_);
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
  lines_.push_back({model_, time_column_, column, s, right, scale, -1, accent});
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

void TimeChart::setNote(const QString& note) {
  note_->setText(note);
  note_->setVisible(!note.isEmpty());
}

void TimeChart::setExplanation(const QString& tooltip) {
  key_->setToolTip(tooltip);
  note_->setToolTip(tooltip);
  view_->setToolTip(tooltip);
}

void TimeChart::followColumns() {
  for (int g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    const int want = std::max(0, group.model->columnCount() - group.first_column);
    int have = static_cast<int>(std::count_if(lines_.begin(), lines_.end(), [g](const Line& l) { return l.group == g; }));
    if (have < want) QMetaObject::invokeMethod(this, &TimeChart::applyPalette, Qt::QueuedConnection);  // the new axes' colours
    for (; have < want; ++have) {
      const Accent accent = group.accents[have % group.accents.size()];
      QPen pen(AccentColor(accent));
      pen.setWidthF(1.5);
      pen.setStyle(Qt::DashLine);
      lines_.push_back({group.model, group.time_column, group.first_column + have, addSeries(pen, false), false,
                        group.scale, g, accent});
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
  // The latest reading of any line: the right end of the time axis.
  double latest = -std::numeric_limits<double>::infinity();
  for (const Line& line : lines_) {
    for (int r = line.model->rowCount() - 1; r >= 0; --r) {
      const double t = ValueAt(line.model, r, line.time_column);
      if (std::isnan(t)) continue;
      latest = std::max(latest, t);
      break;
    }
  }
  const bool any_time = std::isfinite(latest);
  // Seconds, or minutes once the history is longer than five minutes.
  double oldest_s = 0;
  for (const Line& line : lines_) {
    if (line.model->rowCount() == 0 || !any_time) continue;
    const double t = ValueAt(line.model, 0, line.time_column);
    if (!std::isnan(t)) oldest_s = std::max(oldest_s, (latest - t) / 1000);
  }
  const bool minutes = oldest_s > 300;
  const double unit_ms = minutes ? 60000 : 1000;
  double span = 0, max_left = 0, max_right = 0;
  bool any_point = false;
  for (Line& line : lines_) {
    const int line_rows = line.model->rowCount();
    QList<QPointF> pts;
    pts.reserve(line_rows);
    for (int r = 0; r < line_rows; ++r) {
      const double t = ValueAt(line.model, r, line.time_column);
      const double y = ValueAt(line.model, r, line.column) * line.scale;
      if (std::isnan(t) || std::isnan(y)) continue;
      const double age = (latest - t) / unit_ms;
      pts.append(QPointF(age, y));
      span = std::max(span, age);
      (line.right ? max_right : max_left) = std::max(line.right ? max_right : max_left, y);
    }
    any_point = any_point || !pts.isEmpty();
    line.series->replace(pts);
  }
  const int rows = model_->rowCount();
  if (any_point) {
    chart_->setTitle(QString());
  } else {
    chart_->setTitle(rows > 0 && !empty_note_.isEmpty() ? empty_note_ : tr("nothing reported yet"));
  }
  // At least ten seconds (a minute when nothing is there yet), to a round end.
  span = std::max(span, any_point ? (minutes ? 1.0 : 10.0) : 60.0);
  x_->setRange(0, NiceMax(span / 1.05));
  x_->applyNiceNumbers();
  const QString clock = any_time ? QDateTime::fromMSecsSinceEpoch(static_cast<qint64>(latest)).toString("HH:mm:ss")
                                 : QDateTime::currentDateTime().toString("HH:mm:ss");
  x_->setTitleText(minutes ? tr("minutes before %1 (the latest reading)").arg(clock)
                           : tr("seconds before %1 (the latest reading)").arg(clock));
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
  updateKey();
}

// "━━ name   ┄┄ name ...": each line's accent and dash, in the order added;
// entries break between them, never inside one.
void TimeChart::updateKey() {
  QStringList entries;
  for (const Line& line : lines_) {
    const QString sample = line.group < 0 ? QStringLiteral("&#9473;&#9473;") : QStringLiteral("&#9476;&#9476;");
    QString name = line.series->name().toHtmlEscaped();
    name.replace(QLatin1Char(' '), QStringLiteral("&nbsp;"));
    entries << QStringLiteral("<span style=\"color:%1\"><b>%2</b></span>&nbsp;%3")
                   .arg(AccentColor(line.accent).name(), sample, name);
  }
  const QString text = entries.join(QStringLiteral(" &nbsp; "));
  if (key_->text() != text) key_->setText(text);
}

QString TimeChart::timeAxisProblem() const {
  // Whatever axis is at the bottom: it must be drawn, titled and labelled.
  const QList<QAbstractAxis*> bottom = chart_->axes(Qt::Horizontal);
  const QAbstractAxis* x = bottom.isEmpty() ? nullptr : bottom.first();
  if (x == nullptr || !x->isVisible() || !x->labelsVisible()) return tr("no time axis with labels");
  if (x->titleText().isEmpty() || !x->isTitleVisible()) return tr("the time axis has no title");
  // What was laid out: the axis' labels are text items under the plot area,
  // its title one more; Qt hides labels that do not fit.
  const QRectF plot = chart_->plotArea();
  int labels = 0;
  bool title = false;
  QList<QGraphicsItem*> items = chart_->childItems();
  while (!items.isEmpty()) {
    QGraphicsItem* item = items.takeLast();
    items += item->childItems();
    const auto* text = dynamic_cast<const QGraphicsTextItem*>(item);
    if (text == nullptr || !text->isVisible() || text->toPlainText().isEmpty()) continue;
    const QRectF at = text->mapRectToScene(text->boundingRect());
    if (at.top() < plot.bottom() - 1 || at.bottom() > chart_->size().height() + 1) continue;
    if (text->toPlainText() == x->titleText()) {
      title = true;
    } else if (at.center().x() >= plot.left() - 2 && at.center().x() <= plot.right() + 2) {
      ++labels;
    }
  }
  if (labels < 2) return tr("%1 labels laid out under the plot (at least 2 wanted)").arg(labels);
  if (!title) return tr("the time axis' title is not laid out");
  return {};
}

void TimeChart::changeEvent(QEvent* e) {
  QWidget::changeEvent(e);
  if (e->type() == QEvent::PaletteChange || e->type() == QEvent::StyleChange) applyPalette();
}

// The chart's own theme is light; these follow the window's palette instead.
void TimeChart::applyPalette() {
  const QPalette& p = palette();
  chart_->setBackgroundBrush(p.base());
  chart_->setBackgroundPen(Qt::NoPen);
  chart_->setTitleBrush(QBrush(p.color(QPalette::PlaceholderText)));
  QColor grid = p.text().color();
  grid.setAlpha(40);
  for (QAbstractAxis* axis : chart_->axes()) {
    axis->setLabelsColor(p.text().color());
    axis->setTitleBrush(p.text());
    axis->setLinePenColor(p.mid().color());
    axis->setGridLineColor(grid);
  }
}

TierBar::TierBar(Accent fill, QWidget* parent) : QWidget(parent), fill_(fill) {
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Fixed);
}

void TierBar::set(double fraction, QVector<std::pair<double, QColor>> marks) {
  fraction_ = std::isnan(fraction) ? 0 : std::clamp(fraction, 0.0, 1.0);
  marks_ = std::move(marks);
  not_measured_.clear();
  setToolTip(QString());
  update();
}

void TierBar::setNotMeasured(const QString& why) {
  fraction_ = 0;
  marks_.clear();
  not_measured_ = why;
  setToolTip(why);
  update();
}

QSize TierBar::sizeHint() const { return QSize(240, fontMetrics().height() + 6); }
QSize TierBar::minimumSizeHint() const { return QSize(100, fontMetrics().height() + 6); }

void TierBar::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.setRenderHint(QPainter::Antialiasing);
  const QPalette& pal = palette();
  const QRectF bar = QRectF(rect()).adjusted(1.5, 2.5, -1.5, -2.5);
  if (!not_measured_.isEmpty()) {
    // Not measured: an empty bar with a dashed edge, and the words in it.
    QPen edge(pal.color(QPalette::Mid), 1, Qt::DashLine);
    p.setPen(edge);
    p.setBrush(Qt::NoBrush);
    p.drawRoundedRect(bar, 3, 3);
    p.setPen(pal.color(QPalette::PlaceholderText));
    p.drawText(bar, Qt::AlignCenter, tr("not measured"));
    return;
  }
  p.setPen(QPen(pal.color(QPalette::Mid), 1));
  p.setBrush(pal.base());
  p.drawRoundedRect(bar, 3, 3);
  if (fraction_ > 0) {
    QRectF fill = bar.adjusted(1, 1, -1, -1);
    fill.setWidth(std::max(2.0, fill.width() * fraction_));
    p.setPen(Qt::NoPen);
    p.setBrush(AccentColor(fill_));
    p.drawRoundedRect(fill, 2, 2);
  }
  for (const auto& [at, colour] : marks_) {
    const double x = bar.left() + bar.width() * std::clamp(at, 0.0, 1.0);
    p.setPen(QPen(colour, 2));
    p.drawLine(QPointF(x, bar.top() - 2), QPointF(x, bar.bottom() + 2));
  }
}

TierBars::TierBars(const QAbstractItemModel* tiers, Mode mode, QWidget* parent)
    : QWidget(parent), model_(tiers), mode_(mode), layout_(new QVBoxLayout(this)), empty_(new QLabel) {
  layout_->setContentsMargins(4, 2, 4, 2);
  layout_->setSpacing(2);
  empty_->setText(tr("no tiers reported yet"));
  empty_->setAlignment(Qt::AlignCenter);
  empty_->setForegroundRole(QPalette::PlaceholderText);
  layout_->addWidget(empty_);
  layout_->addStretch(1);
  connect(model_, &QAbstractItemModel::dataChanged, this, &TierBars::sync);
  connect(model_, &QAbstractItemModel::rowsInserted, this, &TierBars::sync);
  connect(model_, &QAbstractItemModel::rowsRemoved, this, &TierBars::sync);
  connect(model_, &QAbstractItemModel::modelReset, this, &TierBars::sync);
  connect(model_, &QAbstractItemModel::layoutChanged, this, &TierBars::sync);
  sync();
}

double TierBars::value(int row, int column) const { return ValueAt(model_, row, column); }

QString TierBars::text(int row, int column) const {
  return model_->data(model_->index(row, column), Qt::DisplayRole).toString().toHtmlEscaped();
}

void TierBars::sync() {
  const int rows = model_->rowCount();
  // Rows: one per tier, before the stretch at the end.
  while (rows_.size() < rows) {
    Row row{new WrapLabel(Qt::RichText), new TierBar(mode_ == Mode::kOccupancy ? Accent::kBlue : Accent::kGreen),
            nullptr};
    if (mode_ == Mode::kOccupancy) row.details = new WrapLabel(Qt::RichText);
    const int at = layout_->count() - 1;
    int offset = 0;
    layout_->insertWidget(at + offset++, row.words);
    layout_->insertWidget(at + offset++, row.bar);
    if (row.details != nullptr) layout_->insertWidget(at + offset++, row.details);
    layout_->insertSpacing(at + offset, 6);
    rows_.push_back(row);
  }
  while (rows_.size() > rows) {
    const Row row = rows_.takeLast();
    // The spacer after the row's widgets goes with it.
    const int last = layout_->indexOf(row.details != nullptr ? static_cast<QWidget*>(row.details) : row.bar);
    if (QLayoutItem* spacer = layout_->takeAt(last + 1)) delete spacer;
    delete row.words;
    delete row.bar;
    delete row.details;
  }
  empty_->setVisible(rows == 0);
  for (int r = 0; r < rows; ++r) {
    const Row& row = rows_[r];
    // "host tier" when the name is the kind's, else "cold (disk)".
    const QString name = text(r, TierModel::kName), kind = text(r, TierModel::kKind);
    const QString who = name == kind ? tr("<b>%1</b> tier").arg(name) : tr("<b>%1</b> (%2)").arg(name, kind);
    QString words, details;
    if (mode_ == Mode::kOccupancy) {
      const double used = value(r, TierModel::kUsedBytes), cap = value(r, TierModel::kCapacityBytes);
      words = tr("%1: %2 of %3 held (%4)")
                  .arg(who, text(r, TierModel::kUsedBytes), text(r, TierModel::kCapacityBytes),
                       text(r, TierModel::kOccupancy));
      details = tr("%1 objects; codec %2").arg(text(r, TierModel::kObjects), text(r, TierModel::kCodec));
      if (!std::isnan(value(r, TierModel::kCompression))) {
        details += tr(", before/after encoding %1").arg(text(r, TierModel::kCompression));
      }
      const double hw = value(r, TierModel::kHighWatermark), lw = value(r, TierModel::kLowWatermark);
      QVector<std::pair<double, QColor>> marks;
      if (hw > 0) marks.push_back({hw, AccentColor(Accent::kRed)});
      if (lw > 0) marks.push_back({lw, AccentColor(Accent::kOrange)});
      if (hw > 0 && lw > 0) {
        details += tr("; evicts at %1 down to %2").arg(text(r, TierModel::kHighWatermark), text(r, TierModel::kLowWatermark));
      }
      row.bar->set(cap > 0 && !std::isnan(used) ? used / cap : 0, marks);
    } else {
      const double rate = value(r, TierModel::kBytesOutPerS), limit = value(r, TierModel::kLimitBytesPerS);
      const QModelIndex at = model_->index(r, TierModel::kLimitBytesPerS);
      const QString how = at.data(kNoteRole).toString().toHtmlEscaped();
      if (limit > 0) {
        words = tr("%1: %2 read, of a limit of %3 %4")
                    .arg(who, text(r, TierModel::kBytesOutPerS), text(r, TierModel::kLimitBytesPerS), how);
        row.bar->set(rate > 0 ? rate / limit : 0, {{1.0, AccentColor(Accent::kRed)}});
      } else {
        // Not measured (yet): no scale to draw the rate against, and no bar.
        words = tr("%1: %2 read; limit %3").arg(who, text(r, TierModel::kBytesOutPerS), how);
        row.bar->setNotMeasured(at.data(Qt::ToolTipRole).toString());
      }
      row.words->setToolTip(at.data(Qt::ToolTipRole).toString());
    }
    if (row.words->text() != words) row.words->setText(words);
    if (row.details != nullptr && row.details->text() != details) row.details->setText(details);
  }
}

bool FaultDelegate::Highlighted(const QModelIndex& index) { return index.data(kFaultRole).toBool(); }

void FaultDelegate::initStyleOption(QStyleOptionViewItem* option, const QModelIndex& index) const {
  QStyledItemDelegate::initStyleOption(option, index);
  if (!Highlighted(index)) return;
  QColor tint = AccentColor(Accent::kOrange);
  tint.setAlpha(110);
  option->backgroundBrush = tint;
  option->font.setBold(true);
}

}  // namespace kdn::dash
