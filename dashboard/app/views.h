// SPDX-License-Identifier: Apache-2.0
// The dashboard's views over kdn_dashboard's models: a line chart over time
// columns of a model, per-tier bars (occupancy against capacity with the
// watermarks; delivery bandwidth against the tier's limit), and a delegate
// that highlights cells whose fault counter moved. They read kValueRole for the
// geometry and DisplayRole for the words (the models format), and redraw on
// the model's signals; none computes anything the model does not give.
// Colours: the system palette, plus accents chosen to read on dark and
// light backgrounds (Accent()).
// Thread-safety: the UI thread.
#pragma once

#include <QAbstractItemModel>
#include <QChartView>
#include <QColor>
#include <QLabel>
#include <QPointer>
#include <QStyledItemDelegate>
#include <QVector>
#include <QWidget>

#include <utility>

class QAbstractSeries;
class QChart;
class QLineSeries;
class QValueAxis;
class QVBoxLayout;

namespace kdn::dash {

// Series and highlight colours of mid lightness, legible on dark and light.
enum class Accent { kBlue, kOrange, kGreen, kPurple, kRed };
QColor AccentColor(Accent a);

// A word-wrapped label whose minimum height is what its text needs at the
// width it has (a plain QLabel with word wrap asks for the height of its
// narrowest layout, one word a line, and so takes more room than a window of
// 1280x800 has).
class WrapLabel final : public QLabel {
  Q_OBJECT
 public:
  explicit WrapLabel(Qt::TextFormat format, QWidget* parent = nullptr);
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void resizeEvent(QResizeEvent* e) override;
};

// A chart of model columns against a time column (ms since the epoch, its
// kValueRole), on one or two value axes, with its key and a note under it.
// The x axis is the time before the latest reading, in seconds (minutes past
// five), its title naming the latest reading's clock time. Rows whose value
// is NaN are left out. Besides the lines of the chart's own model it may
// draw every column of another model from a given column on
// (addColumnLines: a line per tier).
// The key is a word-wrapped label (a chart's own legend cuts long names to
// its width): each line's colour and dash, then its name.
class TimeChart final : public QWidget {
  Q_OBJECT
 public:
  TimeChart(const QAbstractItemModel* model, int time_column, QWidget* parent = nullptr);
  // A line of `column` on the left axis (right = false) or the right one;
  // `scale` multiplies its values (100: a fraction shown in %).
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
  // Said over the plot while no line has a point but the model has rows.
  void setEmptyNote(const QString& note) { empty_note_ = note; }
  // A word-wrapped note under the key (what the lines are made of), and the
  // tooltip of the key and the note (why they may differ).
  void setNote(const QString& note);
  void setExplanation(const QString& tooltip);
  int points(int line) const;  // points drawn by line `line` (for tests and --check)
  // For --check: what is wrong with the time axis as drawn (it is not a time
  // axis, has no title, or fewer than two labels were laid out under the
  // plot); empty when nothing is.
  QString timeAxisProblem() const;

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
    Accent accent;
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
  void updateKey();
  void applyPalette();

  const QAbstractItemModel* model_;
  int time_column_;
  QString empty_note_;
  QChartView* view_;
  QLabel* key_;
  QLabel* note_;
  QChart* chart_;
  QValueAxis* x_;
  QValueAxis* left_;
  QValueAxis* right_ = nullptr;
  double left_min_ = 0, left_max_ = 0;
  QVector<Line> lines_;
  QVector<Group> groups_;
  bool pending_ = false;
};

// A bar of one tier (TierBars): a fraction filled, marks (the watermarks,
// the limit), or, when its scale is not measured, an empty dashed bar that
// says so.
class TierBar final : public QWidget {
  Q_OBJECT
 public:
  explicit TierBar(Accent fill, QWidget* parent = nullptr);
  void set(double fraction, QVector<std::pair<double, QColor>> marks);  // fraction NaN: nothing to draw yet
  void setNotMeasured(const QString& why);                               // no fraction: said in the bar
  QSize sizeHint() const override;
  QSize minimumSizeHint() const override;

 protected:
  void paintEvent(QPaintEvent* e) override;

 private:
  Accent fill_;
  double fraction_ = 0;
  QVector<std::pair<double, QColor>> marks_;
  QString not_measured_;  // non-empty: drawn as not measured
};

// Per tier (a TierModel row, highest first): a line of words, the bar, and
// (occupancy) a line of details; the words are word-wrapped labels, so
// every one is shown whole at any width the window gives them.
class TierBars final : public QWidget {
  Q_OBJECT
 public:
  enum class Mode {
    kOccupancy,  // used bytes / capacity, high and low watermarks drawn; objects and codec in words
    kBandwidth,  // bytes read per second, against the tier's measured limit (none drawn when not measured)
  };
  TierBars(const QAbstractItemModel* tiers, Mode mode, QWidget* parent = nullptr);

 private:
  struct Row {
    QLabel* words;
    TierBar* bar;
    QLabel* details;  // occupancy only
  };
  void sync();  // rows to the model's tiers, their words and bars
  double value(int row, int column) const;  // kValueRole; NaN when none
  QString text(int row, int column) const;  // DisplayRole, HTML-escaped
  const QAbstractItemModel* model_;
  Mode mode_;
  QVBoxLayout* layout_;
  QLabel* empty_;
  QVector<Row> rows_;
};

// Cells whose kFaultRole is true (a fault's counter that moved in the last
// reading) get an accent background and bold text; routine movement
// (kMovedRole alone) is drawn plainly.
class FaultDelegate final : public QStyledItemDelegate {
  Q_OBJECT
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  static bool Highlighted(const QModelIndex& index);  // what initStyleOption highlights

 protected:
  void initStyleOption(QStyleOptionViewItem* option, const QModelIndex& index) const override;
};

}  // namespace kdn::dash
