// SPDX-License-Identifier: Apache-2.0
// Item models over the recorder's history, apart from the views (the app's
// widgets and charts only read them). Each follows the recorder: updates are
// incremental (rows inserted, removed and changed, never a reset per
// reading) and rate-limited (readings that arrive closer than
// min_update_ms apart are shown together, by one update).
// Roles: Qt::DisplayRole is the text shown; kValueRole the number behind it
// (double; NaN where there is none); kMovedRole whether the counter moved in
// the last reading; kFaultRole whether it is a fault's counter (corrupt
// chunks, decode and seal failures, I/O errors, failed loads, refused calls)
// that moved in the last reading: the views highlight only these, routine
// movement (evictions, demotions, promotions) is shown plainly;
// Qt::ToolTipRole what it means.
// Thread-safety: the UI thread.
#pragma once

#include <QAbstractTableModel>
#include <QTimer>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "recorder.h"

namespace kdn::dash {

enum Role {
  kValueRole = Qt::UserRole + 1,
  kMovedRole,
  kFaultRole,
  kNoteRole,  // how the number was obtained, where sources differ (a tier's limit: "measured by kdnd at start"); else empty
};

// Base: follows a recorder, coalescing its readings.
class RecorderModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  RecorderModel(const Recorder* recorder, int min_update_ms, QObject* parent);
  const Recorder* recorder() const { return recorder_; }

 protected:
  // Called at most once per min_update_ms, after readings were added
  // (`dropped`: how many old readings left the history meanwhile).
  virtual void update(std::size_t dropped) = 0;
  virtual void clearAll() = 0;

  // For models with one row per reading held (oldest first): which readings
  // the rows show.
  struct HeldRows {
    std::size_t rows = 0;      // readings shown (the recorder may hold more until the next update)
    std::uint64_t first = 0;   // the first shown reading's number (Recorder::total() counts them)
  };
  // Removes the rows of the readings that left the history (`dropped`),
  // calls `before_append(i)` with the recorder index of the first new
  // reading (when there are new ones), then appends their rows.
  void followReadings(std::size_t dropped, HeldRows& held, const std::function<void(std::size_t)>& before_append = {});
  // The recorder index of row `row`'s reading; -1 when it has left the history.
  std::ptrdiff_t heldIndex(const HeldRows& held, int row) const;

 private:
  void onAdded(bool dropped);
  void flush();  // calls update() with what is pending
  const Recorder* recorder_;
  QTimer timer_;
  std::size_t pending_dropped_ = 0;
  bool pending_ = false;
};

// One row per tier of the latest reading (highest first).
class TierModel final : public RecorderModel {
  Q_OBJECT
 public:
  enum Column {
    kName, kKind, kCodec, kObjects, kUsedBytes, kCapacityBytes, kOccupancy, kHighWatermark, kLowWatermark,
    kHitRate, kBytesOutPerS, kLimitBytesPerS, kCompression, kEvictions, kDemotions, kPromotions, kCorrupt,
    kIoErrors, kColumns
  };
  explicit TierModel(const Recorder* recorder, int min_update_ms = 250, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 protected:
  void update(std::size_t dropped) override;
  void clearAll() override;

 private:
  QVector<TierSample> tiers_;   // shown
  QVector<TierRates> rates_;
  QVector<TierSample> before_;  // the reading before, for kMovedRole
  bool rated_ = false;          // rates_ cover an interval (not the first reading nor a restart)
};

// One row per reading held (oldest first): the time series the charts draw.
class HistoryModel final : public RecorderModel {
  Q_OBJECT
 public:
  enum Column {
    kTimeMs, kHitRate, kCumulativeHitRate, kTtftSavedMs, kTtftSavedPerMin, kDeliveryMsPerMin, kLoadsPerS,
    kFailedLoadsPerS, kUsedBytes,
    kTtftBasis,          // "priced" (kValueRole 1: kdnd's configured price) or "measured" (2: a runtime's); NaN: unknown
    kPrefillUsPerToken,  // the prefill time per token behind TTFT saved, in us (Snapshot::prefill_us_per_token)
    kColumns
  };
  explicit HistoryModel(const Recorder* recorder, int min_update_ms = 250, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 protected:
  void update(std::size_t dropped) override;
  void clearAll() override;

 private:
  HeldRows held_;
};

// Per-tier hit rate over time: one row per reading held (oldest first, as
// HistoryModel: appended as the recorder adds, removed from the front as it
// drops). Column 0 is the reading's time_ms; then one column per tier name
// seen in the readings shown, in order of first appearance (a new tier is
// inserted as a column at the end). A tier's column stays after the tier is
// gone from every reading held (its cells are then "—"), until clear():
// columns never move, so a chart's line per column stays that tier's.
// A cell is the tier's hit rate over the interval before that reading
// (TierRates::hit_rate): NaN and "—" when it was not read, or the tier was
// not in that reading.
class TierHitRateModel final : public RecorderModel {
  Q_OBJECT
 public:
  enum Column { kTimeMs, kFirstTier };
  explicit TierHitRateModel(const Recorder* recorder, int min_update_ms = 250, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
  const QVector<QString>& tierNames() const { return names_; }  // column kFirstTier + i is names_[i]

 protected:
  void update(std::size_t dropped) override;
  void clearAll() override;

 private:
  HeldRows held_;
  QVector<QString> names_;   // the tier columns
};

// The events an operator watches: totals, rates, and whether they moved.
class EventModel final : public RecorderModel {
  Q_OBJECT
 public:
  // Evictions, demotions and promotions are routine (a full tier makes
  // room); the others are faults. Decode failures are "—" where the source
  // does not tell them apart (a kdnd); auth failures are a kdnd's refused
  // calls and a runtime's chunks whose seal did not verify.
  enum Row { kEvictions, kDemotions, kPromotions, kCorrupt, kFailedLoads, kIoErrors, kDecodeFailures, kAuthFailures, kRows };
  static bool IsFault(int row) { return row >= kCorrupt && row < kRows; }
  enum Column { kEvent, kTotal, kPerSecond, kColumns };
  explicit EventModel(const Recorder* recorder, int min_update_ms = 250, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 protected:
  void update(std::size_t dropped) override;
  void clearAll() override;

 private:
  double total_[kRows] = {};
  double rate_[kRows] = {};
  bool moved_[kRows] = {};
};

// The latest reading's documents_top: most hit first, pins and their TTLs.
class DocumentModel final : public RecorderModel {
  Q_OBJECT
 public:
  enum Column { kNamespace, kDocId, kHits, kChunksHeld, kPinned, kPinTtlS, kColumns };
  explicit DocumentModel(const Recorder* recorder, int min_update_ms = 250, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 protected:
  void update(std::size_t dropped) override;
  void clearAll() override;

 private:
  QVector<DocumentSample> docs_;
  std::int64_t time_ms_ = 0;  // the reading's clock, for the TTL left
};

// The latest reading's namespace quotas: one row per tier and namespace
// with a quota (as the source's configuration sets them, so a bounded
// count), keyed by (tier index, namespace). Used is against the quota, the
// evictions and refusals are counted since the source started, and their
// rates per second are over the last interval (TierModel's rates: "—" on
// the first reading and after a restart). Refused puts (a chunk larger than
// the namespace's quota) are a fault (kFaultRole when they move); evictions
// are the quota at work, drawn plainly.
class QuotaModel final : public RecorderModel {
  Q_OBJECT
 public:
  enum Column {
    kTier, kNamespace, kUsedOfQuota, kShare, kObjects, kQuotaEvictions, kQuotaEvictionsPerS, kRoomEvictions,
    kRoomEvictionsPerS, kRefused, kColumns
  };
  explicit QuotaModel(const Recorder* recorder, int min_update_ms = 250, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
  QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;

 protected:
  void update(std::size_t dropped) override;
  void clearAll() override;

 private:
  struct Row {
    QuotaSample now;
    QuotaSample before;     // the reading before (itself when none), for kMovedRole
    double seconds = 0;     // the interval to it; 0: no rates
  };
  QVector<Row> rows_;
};

}  // namespace kdn::dash
