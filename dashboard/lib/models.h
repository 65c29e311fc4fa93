// Item models over the recorder's history, apart from the views (the app's
// widgets and charts only read them). Each follows the recorder: updates are
// incremental (rows inserted, removed and changed, never a reset per
// reading) and rate-limited (readings that arrive closer than
// min_update_ms apart are shown together, by one update).
// Roles: Qt::DisplayRole is the text shown; kValueRole the number behind it
// (double; NaN where there is none); kMovedRole whether the counter moved in
// the last reading (the views highlight it); Qt::ToolTipRole what it means.
// Thread-safety: the UI thread.
#pragma once

#include <QAbstractTableModel>
#include <QTimer>

#include "recorder.h"

namespace kdn::dash {

enum Role { kValueRole = Qt::UserRole + 1, kMovedRole };

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
    kFailedLoadsPerS, kUsedBytes, kColumns
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
  std::size_t rows_ = 0;  // readings shown (the recorder may hold more until the next update)
  std::uint64_t first_ = 0;  // the first shown reading's number (Recorder::total() counts them)
};

// The events an operator watches: totals, rates, and whether they moved.
class EventModel final : public RecorderModel {
  Q_OBJECT
 public:
  enum Row { kEvictions, kDemotions, kPromotions, kCorrupt, kFailedLoads, kIoErrors, kRows };
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

}  // namespace kdn::dash
