// SPDX-License-Identifier: Apache-2.0
// The dashboard's window: a connection banner over the views of one source.
// It owns the recorder and the models (kdn_dashboard) and only shows them:
// every number comes from a model's kValueRole, every text from its
// DisplayRole; the charts and bars redraw when their model signals a change
// (rows inserted or removed, data changed), never on a timer of their own.
//
//   banner: the source's state and why (a lost kdnd is said, its history kept)
//   hit rate over time (per reading, cumulative, and per tier) | TTFT saved and delivery time | tier occupancy, bandwidth
//   the tiers' table
//   the namespaces' quotas (only once the source reports a quota)
//   top knowledge items | events (faults that moved highlighted)
//
// Every word is shown whole at 1280x800 and up (labels wrap; the tiers'
// table fits its columns without scrolling): layoutProblems() says what is
// cut, and --check fails on it.
//
// Thread-safety: the UI thread.
#pragma once

#include <QMainWindow>

#include "models.h"
#include "recorder.h"
#include "source.h"

class QLabel;
class QTableView;

namespace kdn::dash {

class TimeChart;

// What --check reads: the values behind the views, from the models.
struct Headline {
  double cumulative_hit_rate = -1;  // fraction; -1: no reading with requests yet
  // The best tier's hit rate over the last interval (its hits / reads);
  // -1: no tier was read. What a node whose clients send no token counts
  // with their lookups still shows.
  double tier_hit_rate = -1;
  QString tier;                     // that tier's name
  double used_bytes = 0;            // all tiers
  double ttft_saved_ms = 0;         // cumulative
  double readings = 0;              // rows of the history
};

class MainWindow final : public QMainWindow {
  Q_OBJECT
 public:
  // `source` is borrowed (it must outlive the window); the window starts it.
  explicit MainWindow(Source* source, QWidget* parent = nullptr);
  ~MainWindow() override;

  const Recorder& recorder() const { return recorder_; }
  const TierModel& tiers() const { return *tiers_; }
  const HistoryModel& history() const { return *history_; }
  const TierHitRateModel& tierHitRates() const { return *tier_hits_; }
  const EventModel& events() const { return *events_; }
  const DocumentModel& documents() const { return *documents_; }
  const QuotaModel& quotas() const { return *quotas_; }
  Headline headline() const;

  // For --check, at the window's current size: what is cut or hidden. A
  // label whose text needs more room than it has, a group box whose title
  // does not fit, a table that scrolls sideways (a column past its viewport,
  // or narrower than its contents) or hides a tier's row, a chart whose time
  // axis has no title or labels. Empty: nothing.
  QStringList layoutProblems() const;
  // For --check: highlighted cells that are not faults (routine evictions,
  // demotions and promotions must be drawn plainly), and faults that moved
  // but are not highlighted. `routine_moved`: routine cells that moved (and
  // were drawn plainly), so a caller can tell the check saw some.
  QStringList highlightProblems(int* routine_moved = nullptr) const;

 private:
  void onState(Source::State state, const QString& why);
  void updateHeadline();
  void updateTtftNote();

  Source* source_;
  Recorder recorder_;
  TierModel* tiers_;
  HistoryModel* history_;
  TierHitRateModel* tier_hits_;
  EventModel* events_;
  DocumentModel* documents_;
  QuotaModel* quotas_;
  QLabel* banner_ = nullptr;
  QLabel* numbers_ = nullptr;
  TimeChart* hit_chart_ = nullptr;
  TimeChart* ttft_chart_ = nullptr;
  QTableView* tier_table_ = nullptr;
  QTableView* event_table_ = nullptr;
  QTableView* quota_table_ = nullptr;
};

}  // namespace kdn::dash
