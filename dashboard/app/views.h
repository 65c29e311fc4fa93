// SPDX-License-Identifier: Apache-2.0
// The dashboard's views over kdn_dashboard's models: a line chart over time
// columns of a model, per-tier bars (occupancy against capacity with the
// watermarks; delivery bandwidth against the tier's limit), and a delegate
// that highlights cells whose counter moved. They read kValueRole for the
// geometry and DisplayRole for the words (the models format), and redraw on
// the model's signals; none computes anything the model does not give.
// Colours: the system palette, plus accents chosen to read on dark and
// light backgrounds (Accent()).
// Thread-safety: the UI thread.
#pragma once

#include <QAbstractItemModel>
#include <QChartView>
#include <QColor>
#include <QPointer>
#include <QStyledItemDelegate>
#include <QVector>
#include <QWidget>

class QAbstractSeries;
class QChart;
class QDateTimeAxis;
class QLineSeries;
class QValueAxis;

namespace kdn::dash {

// Series and highlight colours of mid lightness, legible on dark and light.
enum class Accent { kBlue, kOrange, kGreen, kPurple, kRed };
QColor AccentColor(Accent a);

// A chart of model columns against a time column (ms since the epoch, its
// kValueRole), on one or two value axes. Rows whose value is NaN are left out.
// Besides the lines of the chart's own model it may draw every column of
// another model from a given column on (addColumnLines: a line per tier).
class TimeChart final : public QChartView {
  Q_OBJECT
 public:
  // `y_scale` multiplies the left axis' values (100: a fraction shown in %).
  TimeChart(const QAbstractItemModel* model, int time_column, const QString& title, QWidget* parent = nullptr);
  // A line of `column` on the left axis (right = false) or the right one.
  void addLine(int column, const QString& name, Accent accent, bool right = false, double scale = 1);
  // A thinner, dashed line on the left axis for each column of `model` from
  // `first_column` on, the columns it inserts later included (and dropped
  // when it removes them), against its `time_column`; named by the column's
  // header and `suffix` ("host" + " tier"), coloured by `accents` in turn.
  void addColumnLines(const QAbstractItemModel* model, int time_column, int first_column, const QString& suffix,
                      const QVector<Accent>& accents, double scale = 1);
  // Axis titles and fixed ranges (max <= min: from the data, from 0).
  void setLeftAxis(const QString& title, double min = 0, double max = 0);
  void setRightAxis(const QString& title);
  // Said in the title while no line has a point but the model has rows.
  void setEmptyNote(const QString& note) { empty_note_ = note; }
  int points(int line) const;  // points drawn by line `line` (for tests and --check)

 protected:
  void changeEvent(QEvent* e) override;

 private:
  struct Line {
    const QAbstractItemModel* model;
    int time_column;
    int column;
    QLineSeries* series;
    bool right;
    double scale;
    int group;  // -1: added by addLine; else the index in groups_
  };
  struct Group {
    const QAbstractItemModel* model;
    int time_column, first_column;
    QString suffix;
    QVector<Accent> accents;
    double scale;
  };
  void watch(const QAbstractItemModel* model);  // redraws on its signals
  QLineSeries* addSeries(const QPen& pen, bool right);
  void followColumns();  // a group's lines to its model's columns
  void schedule();
  void rebuild();
  void applyPalette();

  const QAbstractItemModel* model_;
  int time_column_;
  QString title_, empty_note_;
  QChart* chart_;
  QDateTimeAxis* x_;
  QValueAxis* left_;
  QValueAxis* right_ = nullptr;
  double left_min_ = 0, left_max_ = 0;
  QVector<Line> lines_;
  QVector<Group> groups_;
  bool pending_ = false;
};

// One horizontal bar per tier (a TierModel row).
class TierBars final : public QWidget {
  Q_OBJECT
 public:
  enum class Mode {
    kOccupancy,  // used bytes / capacity, high and low watermarks drawn; objects and codec in words
    kBandwidth,  // bytes read per second, against the tier's measured limit when known
  };
  TierBars(const QAbstractItemModel* tiers, Mode mode, QWidget* parent = nullptr);
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* e) override;

 private:
  int lines() const;                        // of text, per tier
  double value(int row, int column) const;  // kValueRole; NaN when none
  QString text(int row, int column) const;
  const QAbstractItemModel* model_;
  Mode mode_;
};

// Cells whose kMovedRole is true get an accent background and bold text.
class MovedDelegate final : public QStyledItemDelegate {
  Q_OBJECT
 public:
  using QStyledItemDelegate::QStyledItemDelegate;

 protected:
  void initStyleOption(QStyleOptionViewItem* option, const QModelIndex& index) const override;
};

}  // namespace kdn::dash
