// SPDX-License-Identifier: Apache-2.0
#include "models.h"

#include <QDateTime>
#include <QPair>
#include <QtGlobal>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>

namespace kdn::dash {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

QString Unknown() { return QStringLiteral("\u2014"); }

// Human units: binary multiples ("1.2 GiB").
QString Bytes(double b) {
  if (std::isnan(b)) return Unknown();
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (std::abs(b) >= 1024 && unit < 5) {
    b /= 1024;
    ++unit;
  }
  return QString::number(b, 'f', unit == 0 ? 0 : 1) + QLatin1Char(' ') + QLatin1String(kUnits[unit]);
}

QString Percent(double fraction) {
  if (std::isnan(fraction)) return Unknown();
  return QString::number(fraction * 100, 'f', 1) + QStringLiteral(" %");
}

// A duration in ms: "850 ms", "3.1 s", "2.5 min", "1.2 h".
QString Duration(double ms) {
  if (std::isnan(ms)) return Unknown();
  const double s = ms / 1000;
  if (std::abs(ms) < 1000) return QString::number(ms, 'f', 0) + QStringLiteral(" ms");
  if (std::abs(s) < 60) return QString::number(s, 'f', 1) + QStringLiteral(" s");
  if (std::abs(s) < 3600) return QString::number(s / 60, 'f', 1) + QStringLiteral(" min");
  return QString::number(s / 3600, 'f', 1) + QStringLiteral(" h");
}

// A rate: three significant digits at most, small rates not rounded to 0.
QString Number(double v) {
  if (std::isnan(v)) return Unknown();
  if (v == 0) return QStringLiteral("0");
  if (std::abs(v) >= 100) return QString::number(v, 'f', 0);
  if (std::abs(v) >= 1) return QString::number(v, 'f', 1);
  return QString::number(v, 'g', 2);
}

// A time per minute (ms per minute): "850 ms/min", "93.0 s/min".
QString PerMinute(double ms) {
  if (std::isnan(ms)) return Unknown();
  if (std::abs(ms) < 1000) return QString::number(ms, 'f', 0) + QStringLiteral(" ms/min");
  return QString::number(ms / 1000, 'f', 1) + QStringLiteral(" s/min");
}

QString PerSecond(double v) { return std::isnan(v) ? Unknown() : Number(v) + QStringLiteral("/s"); }

QString Count(double v) {
  return std::isnan(v) ? Unknown() : QString::number(static_cast<qulonglong>(v));
}

double Fraction(double part, double whole) { return whole > 0 ? part / whole : kNaN; }

// A hit rate as Rates carries it (-1: none) as a fraction or NaN.
double HitRate(double rate) { return rate < 0 ? kNaN : rate; }

// What a cell shows: its text, the number behind it, whether its counter
// moved, and whether that counter counts faults (kFaultRole: moved and fault).
struct Cell {
  QString text;
  double value = kNaN;
  bool moved = false;
  bool fault = false;
  QString note;  // kNoteRole, and added to the tooltip
};

Cell Text(const QString& text) { return {text, kNaN, false, false, {}}; }
Cell Value(double v, const QString& text, bool moved = false, bool fault = false) { return {text, v, moved, fault, {}}; }

bool SameCell(const Cell& a, const Cell& b) {
  const bool same_value = (std::isnan(a.value) && std::isnan(b.value)) || a.value == b.value;
  return same_value && a.moved == b.moved && a.fault == b.fault && a.text == b.text && a.note == b.note;
}

struct Column {
  const char* header;
  const char* tooltip;
  bool numeric;
};

QVariant CellData(const Cell& c, int role, const Column& column) {
  switch (role) {
    case Qt::DisplayRole:
      return c.text;
    case kValueRole:
      return c.value;
    case kMovedRole:
      return c.moved;
    case kFaultRole:
      return c.moved && c.fault;
    case kNoteRole:
      return c.note;
    case Qt::ToolTipRole:
      return c.note.isEmpty() ? QString::fromUtf8(column.tooltip)
                              : QString::fromUtf8(column.tooltip) + QStringLiteral(": ") + c.note;
    case Qt::TextAlignmentRole:
      return column.numeric ? QVariant((Qt::AlignRight | Qt::AlignVCenter).toInt()) : QVariant();
    default:
      return {};
  }
}

template <std::size_t N>
QVariant Header(const Column (&columns)[N], int section, Qt::Orientation o, int role, int rows) {
  if (o == Qt::Vertical) {
    if (section < 0 || section >= rows || role != Qt::DisplayRole) return {};
    return section + 1;
  }
  if (section < 0 || section >= static_cast<int>(N)) return {};
  if (role == Qt::DisplayRole) return QString::fromUtf8(columns[section].header);
  if (role == Qt::ToolTipRole) return QString::fromUtf8(columns[section].tooltip);
  return {};
}

// Runs `replace` (which changes what the model's rows show, not how many
// there are) and emits dataChanged for each row's span of cells whose text,
// value or highlight changed.
void ReplaceCells(QAbstractItemModel* m, const std::function<void()>& replace) {
  const int rows = m->rowCount(), cols = m->columnCount();
  auto grab = [m](int r, int c) {
    const QModelIndex i = m->index(r, c);
    return Cell{m->data(i).toString(), m->data(i, kValueRole).toDouble(), m->data(i, kMovedRole).toBool(),
                m->data(i, kFaultRole).toBool(), m->data(i, kNoteRole).toString()};
  };
  QVector<Cell> before;
  before.reserve(rows * cols);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) before.push_back(grab(r, c));
  }
  replace();
  Q_ASSERT(m->rowCount() == rows);
  for (int r = 0; r < rows; ++r) {
    int first = -1, last = -1;
    for (int c = 0; c < cols; ++c) {
      if (SameCell(before[r * cols + c], grab(r, c))) continue;
      if (first < 0) first = c;
      last = c;
    }
    if (first >= 0) {
      emit m->dataChanged(m->index(r, first), m->index(r, last),
                          {Qt::DisplayRole, kValueRole, kMovedRole, kFaultRole, kNoteRole, Qt::ToolTipRole});
    }
  }
}

// Brings rows keyed `keys` to the keys and order of `next` by removing and
// inserting runs of rows (remove(row, count); insert(row, first index in
// next, count)); rows whose key stays are kept for the caller to update.
// `keys` follows.
template <typename Key>
void Reconcile(QVector<Key>& keys, const QVector<Key>& next, const std::function<void(int, int, int)>& insert,
               const std::function<void(int, int)>& remove) {
  for (int i = 0; i < next.size(); ++i) {
    // Remove the rows not wanted from here on, or standing before the row wanted here.
    int end = i;
    while (end < keys.size() && keys[end] != next[i] &&
           (next.indexOf(keys[end], i) < 0 || keys.indexOf(next[i], end + 1) >= 0)) {
      ++end;
    }
    if (end > i) {
      remove(i, end - i);
      keys.remove(i, end - i);
    }
    if (i < keys.size() && keys[i] == next[i]) continue;
    // Insert the rows wanted here that are not held further on.
    int stop = i + 1;
    while (stop < next.size() && keys.indexOf(next[stop], i) < 0) ++stop;
    insert(i, i, stop - i);
    for (int j = i; j < stop; ++j) keys.insert(j, next[j]);
    i = stop - 1;
  }
  if (keys.size() > next.size()) {
    const int from = static_cast<int>(next.size());
    remove(from, static_cast<int>(keys.size()) - from);
    keys.resize(next.size());
  }
}

const TierSample* FindTier(const QVector<TierSample>& tiers, const QString& name) {
  for (const TierSample& t : tiers) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

double UsedBytes(const Snapshot& s) {
  double used = 0;
  for (const TierSample& t : s.tiers) used += static_cast<double>(t.used_bytes);
  return used;
}

}  // namespace

// ---------------------------------------------------------------- RecorderModel

RecorderModel::RecorderModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : QAbstractTableModel(parent), recorder_(recorder) {
  timer_.setSingleShot(true);
  timer_.setInterval(std::max(min_update_ms, 0));
  connect(&timer_, &QTimer::timeout, this, &RecorderModel::flush);
  if (recorder_ == nullptr) {
    qWarning("kdn dashboard: a model was given no recorder; it stays empty");
    return;
  }
  connect(recorder_, &Recorder::added, this, &RecorderModel::onAdded);
  connect(recorder_, &Recorder::cleared, this, [this] {
    timer_.stop();
    pending_ = false;
    pending_dropped_ = 0;
    clearAll();
  });
  // A recorder destroyed first leaves the model empty, not dangling.
  connect(recorder_, &QObject::destroyed, this, [this] {
    timer_.stop();
    pending_ = false;
    pending_dropped_ = 0;
    recorder_ = nullptr;
    clearAll();
  });
}

void RecorderModel::onAdded(bool dropped) {
  if (dropped) ++pending_dropped_;
  pending_ = true;
  if (timer_.interval() == 0) {
    flush();
  } else if (!timer_.isActive()) {
    timer_.start();
  }
}

void RecorderModel::flush() {
  if (!pending_ || recorder_ == nullptr) return;
  const std::size_t dropped = pending_dropped_;
  pending_ = false;
  pending_dropped_ = 0;
  update(dropped);
}

void RecorderModel::followReadings(std::size_t dropped, HeldRows& held,
                                   const std::function<void(std::size_t)>& before_append) {
  const Recorder* rec = recorder();
  // The oldest rows left the history: remove them (all of them when more
  // readings were dropped than were shown).
  const std::size_t remove = std::min(dropped, held.rows);
  if (remove > 0) {
    beginRemoveRows({}, 0, static_cast<int>(remove) - 1);
    held.rows -= remove;
    held.first += remove;
    endRemoveRows();
  }
  if (rec == nullptr) return;
  held.first = rec->total() - rec->size();
  // The new readings: appended.
  if (rec->size() > held.rows) {
    if (before_append) before_append(held.rows);
    beginInsertRows({}, static_cast<int>(held.rows), static_cast<int>(rec->size()) - 1);
    held.rows = rec->size();
    endInsertRows();
  }
}

std::ptrdiff_t RecorderModel::heldIndex(const HeldRows& held, int row) const {
  const Recorder* rec = recorder();
  if (rec == nullptr || row < 0 || static_cast<std::size_t>(row) >= held.rows) return -1;
  // Row r is reading number first + r; the recorder holds numbers from
  // total() - size() on (readings dropped before this model's update are gone).
  const std::uint64_t number = held.first + static_cast<std::uint64_t>(row);
  const std::uint64_t held_first = rec->total() - rec->size();
  if (number < held_first || number >= rec->total()) return -1;
  return static_cast<std::ptrdiff_t>(number - held_first);
}

// ---------------------------------------------------------------- TierModel

namespace {

const Column kTierColumns[] = {
    {"Tier", "The tier's name", false},
    {"Kind", "The kind of store: host memory, disk, remote kdnd, Redis, device", false},
    {"Codec", "How the tier encodes KV chunks", false},
    {"Objects", "Chunks held", true},
    {"Used", "Bytes held", true},
    {"Capacity", "The tier's capacity in bytes", true},
    {"Occupancy", "Used bytes as a share of the capacity", true},
    {"High watermark", "Occupancy at which the tier starts evicting or demoting", true},
    {"Low watermark", "Occupancy the tier evicts or demotes down to", true},
    {"Hit rate", "Hits / (hits + misses) of the tier over the last interval", true},
    {"Delivery", "Bytes read from the tier per second over the last interval", true},
    {"Limit", "The tier's measured delivery limit in bytes read per second (kdnd: a cold read at start; "
              "a runtime: the rate its loads were served at)", true},
    {"Compression", "Bytes before encoding / bytes after encoding", true},
    {"Evictions", "Chunks evicted from the tier since the source started", true},
    {"Demotions", "Chunks demoted into the tier since the source started", true},
    {"Promotions", "Chunks promoted into the tier since the source started", true},
    {"Corrupt", "Corrupt chunks detected in the tier since the source started", true},
    {"I/O errors", "Failed reads and writes of the tier since the source started", true},
};
static_assert(std::size(kTierColumns) == TierModel::kColumns);

Cell TierCell(const TierSample& t, const TierRates* rates, const TierSample& before, int column) {
  const auto moved = [](std::uint64_t now, std::uint64_t was) { return now > was; };
  const auto bytes = [](std::uint64_t b) { return Value(static_cast<double>(b), Bytes(static_cast<double>(b))); };
  // Routine movement (evictions, demotions, promotions) and faults (corrupt
  // chunks, I/O errors): both say whether they moved, only faults are
  // highlighted.
  const auto count = [](std::uint64_t n, bool m, bool fault = false) {
    return Value(static_cast<double>(n), QString::number(static_cast<qulonglong>(n)), m, fault);
  };
  const auto fraction = [](double f) { return Value(f, Percent(f)); };
  const auto watermark = [&](double f) { return fraction(f > 0 ? f : kNaN); };
  switch (column) {
    case TierModel::kName:
      return Text(t.name);
    case TierModel::kKind:
      return Text(t.kind);
    case TierModel::kCodec:
      return Text(t.codec.isEmpty() ? Unknown() : t.codec);
    case TierModel::kObjects:
      return count(t.objects, false);
    case TierModel::kUsedBytes:
      return bytes(t.used_bytes);
    case TierModel::kCapacityBytes:
      return t.capacity_bytes == 0 ? Value(kNaN, Unknown()) : bytes(t.capacity_bytes);
    case TierModel::kOccupancy:
      return fraction(Fraction(static_cast<double>(t.used_bytes), static_cast<double>(t.capacity_bytes)));
    case TierModel::kHighWatermark:
      return watermark(t.high_watermark);
    case TierModel::kLowWatermark:
      return watermark(t.low_watermark);
    case TierModel::kHitRate:
      return fraction(rates == nullptr ? kNaN : HitRate(rates->hit_rate));
    case TierModel::kBytesOutPerS: {
      const double v = rates == nullptr ? kNaN : rates->bytes_out_per_s;
      return Value(v, std::isnan(v) ? Unknown() : Bytes(v) + QStringLiteral("/s"));
    }
    case TierModel::kLimitBytesPerS: {
      const double v = t.limit_bytes_per_s > 0 ? t.limit_bytes_per_s : kNaN;
      Cell c = Value(v, std::isnan(v) ? Unknown() : Bytes(v) + QStringLiteral("/s"));
      if (t.limit_from_loads) {
        c.note = std::isnan(v) ? QStringLiteral("not measured until the tier serves a load")
                               : QStringLiteral("measured on the loads it served");
      } else {
        c.note = std::isnan(v) ? QStringLiteral("not measured by kdnd (server.measure_tiers off, or a kind it does "
                                                "not measure)")
                               : QStringLiteral("measured by kdnd at start");
      }
      return c;
    }
    case TierModel::kCompression: {
      const double v = t.bytes_before_encoding == 0 ? kNaN
                                                    : Fraction(static_cast<double>(t.bytes_before_encoding),
                                                               static_cast<double>(t.bytes_after_encoding));
      return Value(v, std::isnan(v) ? Unknown() : QString::number(v, 'f', 2) + QStringLiteral("\u00d7"));
    }
    case TierModel::kEvictions:
      return count(t.evictions, moved(t.evictions, before.evictions));
    case TierModel::kDemotions:
      return count(t.demotions_in, moved(t.demotions_in, before.demotions_in));
    case TierModel::kPromotions:
      return count(t.promotions_in, moved(t.promotions_in, before.promotions_in));
    case TierModel::kCorrupt:
      return count(t.corrupt_detected, moved(t.corrupt_detected, before.corrupt_detected), true);
    case TierModel::kIoErrors:
      return count(t.io_errors, moved(t.io_errors, before.io_errors), true);
    default:
      return {};
  }
}

}  // namespace

TierModel::TierModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : RecorderModel(recorder, min_update_ms, parent) {
  if (recorder != nullptr) update(0);
}

int TierModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(tiers_.size());
}

int TierModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumns; }

QVariant TierModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const int r = index.row();
  return CellData(TierCell(tiers_[r], rated_ ? &rates_[r] : nullptr, before_[r], index.column()), role,
                  kTierColumns[index.column()]);
}

QVariant TierModel::headerData(int section, Qt::Orientation o, int role) const {
  return Header(kTierColumns, section, o, role, rowCount());
}

void TierModel::update(std::size_t) {
  const Recorder* rec = recorder();
  if (rec->size() == 0) return;
  const Snapshot& latest = rec->latest();
  const Rates& rates = rec->rates(rec->size() - 1);
  const QVector<TierSample>& next = latest.tiers;
  // What each tier's counters are compared with: what was shown, else the
  // reading before (a model made after the readings), else itself.
  const QVector<TierSample> earlier = rec->size() >= 2 ? rec->at(rec->size() - 2).tiers : QVector<TierSample>{};
  QVector<TierSample> next_before;
  next_before.reserve(next.size());
  for (const TierSample& t : next) {
    const TierSample* b = FindTier(tiers_, t.name);
    if (b == nullptr) b = FindTier(earlier, t.name);
    next_before.push_back(b != nullptr ? *b : t);
  }
  QVector<TierRates> next_rates = rates.tiers;
  next_rates.resize(next.size());  // Between() sizes them so; a Rates{} of a cleared history does not

  QVector<QString> keys, next_keys;
  for (const TierSample& t : tiers_) keys.push_back(t.name);
  for (const TierSample& t : next) next_keys.push_back(t.name);
  if (tiers_.isEmpty()) rated_ = rates.seconds > 0;  // rows inserted now show it at once
  Reconcile<QString>(
      keys, next_keys,
      [&](int row, int j, int count) {
        beginInsertRows({}, row, row + count - 1);
        for (int k = 0; k < count; ++k) {
          tiers_.insert(row + k, next[j + k]);
          rates_.insert(row + k, next_rates[j + k]);
          before_.insert(row + k, next_before[j + k]);
        }
        endInsertRows();
      },
      [&](int row, int count) {
        beginRemoveRows({}, row, row + count - 1);
        tiers_.remove(row, count);
        rates_.remove(row, count);
        before_.remove(row, count);
        endRemoveRows();
      });
  ReplaceCells(this, [&] {
    tiers_ = next;
    rates_ = next_rates;
    before_ = next_before;
    rated_ = rates.seconds > 0;
  });
}

void TierModel::clearAll() {
  beginResetModel();
  tiers_.clear();
  rates_.clear();
  before_.clear();
  rated_ = false;
  endResetModel();
}

// ---------------------------------------------------------------- HistoryModel

namespace {

const Column kHistoryColumns[] = {
    {"Time", "When the reading was taken (the source's clock)", true},
    {"Hit rate", "Hit tokens / requested tokens over the interval before the reading", true},
    {"Cumulative hit rate", "Hit tokens / requested tokens since the source started", true},
    {"TTFT saved", "Prefill time the hits avoided since the source started", true},
    {"TTFT saved / min", "Prefill time the hits avoided, per minute, over the interval", true},
    {"Delivery / min", "Time spent delivering hits, per minute, over the interval", true},
    {"Loads/s", "Loads served per second over the interval", true},
    {"Failed loads/s", "Loads that stopped short or failed, per second, over the interval", true},
    {"Used", "Bytes held by all tiers", true},
    {"TTFT basis", "What TTFT saved is made of: \"priced\" (kdnd: tokens served x the prefill time per token "
                   "configured in kdnd, server.prefill_us_per_token) or \"measured\" (a runtime: tokens served x "
                   "the mean of the prefills its engines reported)", false},
    {"Prefill / token", "The prefill time per token behind TTFT saved: kdnd's configured price, or the mean of "
                        "the prefills the engines reported", true},
};
static_assert(std::size(kHistoryColumns) == HistoryModel::kColumns);

Cell HistoryCell(const Snapshot& s, const Rates& r, int column) {
  const bool rated = r.seconds > 0;
  const auto rate = [&](double v) { return rated ? v : kNaN; };
  switch (column) {
    case HistoryModel::kTimeMs:
      return Value(static_cast<double>(s.time_ms),
                   QDateTime::fromMSecsSinceEpoch(s.time_ms).toLocalTime().toString(QStringLiteral("HH:mm:ss")));
    case HistoryModel::kHitRate: {
      const double v = rated ? HitRate(r.hit_rate) : kNaN;
      return Value(v, Percent(v));
    }
    case HistoryModel::kCumulativeHitRate: {
      const double v = HitRate(Recorder::CumulativeHitRate(s));
      return Value(v, Percent(v));
    }
    case HistoryModel::kTtftSavedMs:
      return Value(s.ttft_saved_ms, Duration(s.ttft_saved_ms));
    case HistoryModel::kTtftSavedPerMin: {
      const double v = rate(r.ttft_saved_ms_per_min);
      return Value(v, PerMinute(v));
    }
    case HistoryModel::kDeliveryMsPerMin: {
      const double v = rate(r.delivery_ms_per_min);
      return Value(v, PerMinute(v));
    }
    case HistoryModel::kLoadsPerS:
      return Value(rate(r.loads_per_s), PerSecond(rate(r.loads_per_s)));
    case HistoryModel::kFailedLoadsPerS:
      return Value(rate(r.failed_loads_per_s), PerSecond(rate(r.failed_loads_per_s)), r.failed_loads_per_s > 0,
                   true);
    case HistoryModel::kUsedBytes:
      return Value(UsedBytes(s), Bytes(UsedBytes(s)));
    case HistoryModel::kTtftBasis:
      switch (s.ttft_basis) {
        case Snapshot::TtftBasis::kPriced: return Value(1, QStringLiteral("priced"));
        case Snapshot::TtftBasis::kMeasured: return Value(2, QStringLiteral("measured"));
        case Snapshot::TtftBasis::kUnknown: break;
      }
      return Value(kNaN, Unknown());
    case HistoryModel::kPrefillUsPerToken: {
      const double v = s.prefill_us_per_token > 0 ? s.prefill_us_per_token : kNaN;
      return Value(v, std::isnan(v) ? Unknown() : QString::number(v, 'g', 3) + QStringLiteral(" \u00b5s/token"));
    }
    default:
      return {};
  }
}

}  // namespace

HistoryModel::HistoryModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : RecorderModel(recorder, min_update_ms, parent) {
  if (recorder != nullptr) update(0);
}

int HistoryModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(held_.rows);
}

int HistoryModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumns; }

QVariant HistoryModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const std::ptrdiff_t i = heldIndex(held_, index.row());
  if (i < 0) return {};
  const auto at = static_cast<std::size_t>(i);
  const Recorder* rec = recorder();
  return CellData(HistoryCell(rec->at(at), rec->rates(at), index.column()), role, kHistoryColumns[index.column()]);
}

QVariant HistoryModel::headerData(int section, Qt::Orientation o, int role) const {
  return Header(kHistoryColumns, section, o, role, rowCount());
}

void HistoryModel::update(std::size_t dropped) { followReadings(dropped, held_); }

void HistoryModel::clearAll() {
  beginResetModel();
  held_ = {};
  endResetModel();
}

// ---------------------------------------------------------------- TierHitRateModel

namespace {

// A tier's column (its header and tooltip name the tier).
const Column kTierHitRateColumn = {"", "", true};

// The hit rate of tier `name` over the interval before reading `s` (its
// rates `r`); NaN when the tier was not read or is not in the reading.
double TierHitRate(const Snapshot& s, const Rates& r, const QString& name) {
  if (!(r.seconds > 0)) return kNaN;
  for (int t = 0; t < s.tiers.size(); ++t) {
    if (s.tiers[t].name == name) return t < r.tiers.size() ? HitRate(r.tiers[t].hit_rate) : kNaN;
  }
  return kNaN;
}

}  // namespace

TierHitRateModel::TierHitRateModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : RecorderModel(recorder, min_update_ms, parent) {
  if (recorder != nullptr) update(0);
}

int TierHitRateModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(held_.rows);
}

int TierHitRateModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : kFirstTier + static_cast<int>(names_.size());
}

QVariant TierHitRateModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const std::ptrdiff_t i = heldIndex(held_, index.row());
  if (i < 0) return {};
  const auto at = static_cast<std::size_t>(i);
  const Recorder* rec = recorder();
  const Snapshot& s = rec->at(at);
  if (index.column() == kTimeMs) {
    return CellData(HistoryCell(s, rec->rates(at), HistoryModel::kTimeMs), role, kHistoryColumns[HistoryModel::kTimeMs]);
  }
  if (role == Qt::ToolTipRole) return headerData(index.column(), Qt::Horizontal, role);
  const double v = TierHitRate(s, rec->rates(at), names_[index.column() - kFirstTier]);
  return CellData(Value(v, Percent(v)), role, kTierHitRateColumn);
}

QVariant TierHitRateModel::headerData(int section, Qt::Orientation o, int role) const {
  if (o == Qt::Vertical || section == kTimeMs) return Header(kHistoryColumns, section, o, role, rowCount());
  if (section < kFirstTier || section >= columnCount()) return {};
  const QString& name = names_[section - kFirstTier];
  if (role == Qt::DisplayRole) return name;
  if (role == Qt::ToolTipRole) {
    return tr("The %1 tier's hits / (hits + misses) over the interval before the reading").arg(name);
  }
  return {};
}

void TierHitRateModel::update(std::size_t dropped) {
  followReadings(dropped, held_, [this](std::size_t from) {
    // Tiers first seen in the new readings: columns appended, in order of appearance.
    const Recorder* rec = recorder();
    QVector<QString> added;
    for (std::size_t i = from; i < rec->size(); ++i) {
      for (const TierSample& t : rec->at(i).tiers) {
        if (!names_.contains(t.name) && !added.contains(t.name)) added.push_back(t.name);
      }
    }
    if (added.isEmpty()) return;
    const int at = columnCount();
    beginInsertColumns({}, at, at + static_cast<int>(added.size()) - 1);
    names_ += added;
    endInsertColumns();
  });
}

void TierHitRateModel::clearAll() {
  beginResetModel();
  held_ = {};
  names_.clear();
  endResetModel();
}

// ---------------------------------------------------------------- EventModel

namespace {

const Column kEventColumns[] = {
    {"Event", "What happened", false},
    {"Total", "How many times since the source started (all tiers)", true},
    {"Per second", "How many times per second over the last interval", true},
};
static_assert(std::size(kEventColumns) == EventModel::kColumns);

const char* const kEventNames[] = {"Evictions",    "Demotions",  "Promotions",      "Corrupt chunks",
                                   "Failed loads", "I/O errors", "Decode failures", "Auth failures"};
const char* const kEventTips[] = {
    "Chunks evicted from a tier (routine: a full tier makes room)",
    "Chunks demoted to a lower tier (routine)",
    "Chunks promoted to a higher tier (routine)",
    "Chunks that failed a check on read and were removed (a fault)",
    "Loads that stopped short (misses) or failed (a fault)",
    "Failed reads and writes of a tier (a remote or Redis tier's errors; a fault)",
    "Chunks read back that did not decode (of the corrupt chunks; a runtime's tiers, not reported by kdnd)",
    "kdnd: calls refused for their token (unknown, or outside its grant); a runtime: chunks whose seal did "
    "not verify (of the corrupt chunks). A fault",
};
static_assert(std::size(kEventNames) == EventModel::kRows && std::size(kEventTips) == EventModel::kRows);

// The totals of a reading, per EventModel row (NaN: the source does not report it).
void EventTotals(const Snapshot& s, double (&out)[EventModel::kRows]) {
  std::fill(std::begin(out), std::end(out), 0.0);
  double corrupt = 0;
  for (const TierSample& t : s.tiers) {
    out[EventModel::kEvictions] += static_cast<double>(t.evictions);
    out[EventModel::kDemotions] += static_cast<double>(t.demotions_in);
    out[EventModel::kPromotions] += static_cast<double>(t.promotions_in);
    out[EventModel::kIoErrors] += static_cast<double>(t.io_errors);
    out[EventModel::kDecodeFailures] += static_cast<double>(t.decode_failures);
    corrupt += static_cast<double>(t.corrupt_detected);
  }
  if (!s.reports_decode_failures) out[EventModel::kDecodeFailures] = kNaN;
  out[EventModel::kAuthFailures] = static_cast<double>(s.auth_failures);
  // A source may count corruption found outside its tiers too.
  out[EventModel::kCorrupt] = std::max(corrupt, static_cast<double>(s.corrupt_detected));
  out[EventModel::kFailedLoads] = static_cast<double>(s.failed_loads);
}

}  // namespace

EventModel::EventModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : RecorderModel(recorder, min_update_ms, parent) {
  std::fill(std::begin(total_), std::end(total_), kNaN);
  std::fill(std::begin(rate_), std::end(rate_), kNaN);
  if (recorder != nullptr) update(0);
}

int EventModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kRows; }

int EventModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumns; }

QVariant EventModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const int r = index.row();
  Cell cell;
  switch (index.column()) {
    case kEvent:
      cell = Text(QString::fromUtf8(kEventNames[r]));
      break;
    case kTotal:
      cell = Value(total_[r], Count(total_[r]), moved_[r], IsFault(r));
      break;
    case kPerSecond:
      cell = Value(rate_[r], PerSecond(rate_[r]), moved_[r], IsFault(r));
      break;
    default:
      return {};
  }
  if (role == Qt::ToolTipRole) {
    return QString::fromUtf8(kEventTips[r]) + QStringLiteral(": ") + QString::fromUtf8(kEventColumns[index.column()].tooltip).toLower();
  }
  return CellData(cell, role, kEventColumns[index.column()]);
}

QVariant EventModel::headerData(int section, Qt::Orientation o, int role) const {
  return Header(kEventColumns, section, o, role, rowCount());
}

void EventModel::update(std::size_t) {
  const Recorder* rec = recorder();
  if (rec->size() == 0) return;
  double now[kRows], was[kRows];
  EventTotals(rec->latest(), now);
  // Moved: compared with what was shown, else the reading before, else not.
  if (!std::isnan(total_[0])) {
    std::copy(std::begin(total_), std::end(total_), std::begin(was));
  } else if (rec->size() >= 2) {
    EventTotals(rec->at(rec->size() - 2), was);
  } else {
    std::copy(std::begin(now), std::end(now), std::begin(was));
  }
  const Rates& r = rec->rates(rec->size() - 1);
  double per_s[kRows] = {};
  for (const TierRates& t : r.tiers) {
    per_s[kEvictions] += t.evictions_per_s;
    per_s[kDemotions] += t.demotions_per_s;
    per_s[kPromotions] += t.promotions_per_s;
    per_s[kCorrupt] += t.corrupt_per_s;
    per_s[kIoErrors] += t.io_errors_per_s;
    per_s[kDecodeFailures] += t.decode_failures_per_s;
  }
  per_s[kFailedLoads] = r.failed_loads_per_s;
  per_s[kAuthFailures] = r.auth_failures_per_s;
  ReplaceCells(this, [&] {
    for (int i = 0; i < kRows; ++i) {
      total_[i] = now[i];
      rate_[i] = r.seconds > 0 && !std::isnan(now[i]) ? per_s[i] : kNaN;
      moved_[i] = now[i] > was[i];
    }
  });
}

void EventModel::clearAll() {
  // The rows stay (they are the events); their numbers become unknown.
  ReplaceCells(this, [this] {
    std::fill(std::begin(total_), std::end(total_), kNaN);
    std::fill(std::begin(rate_), std::end(rate_), kNaN);
    std::fill(std::begin(moved_), std::end(moved_), false);
  });
}

// ---------------------------------------------------------------- DocumentModel

namespace {

const Column kDocumentColumns[] = {
    {"Namespace", "The tenant namespace of the knowledge item", false},
    {"Document", "The knowledge item's id", false},
    {"Hits", "Chunks of it served since it was registered", true},
    {"Chunks held", "Chunks whose KV is held / chunks of the document", true},
    {"Pinned", "Whether its KV is pinned (not evicted)", false},
    {"Pin TTL", "Time left until the pin expires", true},
};
static_assert(std::size(kDocumentColumns) == DocumentModel::kColumns);

using DocKey = QPair<QString, QString>;
DocKey KeyOf(const DocumentSample& d) { return {d.ns, d.doc_id}; }

Cell DocumentCell(const DocumentSample& d, std::int64_t time_ms, int column) {
  switch (column) {
    case DocumentModel::kNamespace:
      return Text(d.ns);
    case DocumentModel::kDocId:
      return Text(d.doc_id);
    case DocumentModel::kHits:
      return Value(static_cast<double>(d.hits), QString::number(static_cast<qulonglong>(d.hits)));
    case DocumentModel::kChunksHeld:
      return Value(static_cast<double>(d.chunks_held), QStringLiteral("%1 / %2").arg(d.chunks_held).arg(d.chunks));
    case DocumentModel::kPinned:
      return Value(d.pinned ? 1 : 0, d.pinned ? QStringLiteral("pinned") : QString());
    case DocumentModel::kPinTtlS: {
      if (!d.pinned) return Value(kNaN, Unknown());
      if (d.pin_expires_ms == 0) return Value(kNaN, QStringLiteral("no deadline"));
      const double left = static_cast<double>(d.pin_expires_ms - time_ms) / 1000;
      return Value(left, left <= 0 ? QStringLiteral("expired") : Duration(left * 1000));
    }
    default:
      return {};
  }
}

}  // namespace

DocumentModel::DocumentModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : RecorderModel(recorder, min_update_ms, parent) {
  if (recorder != nullptr) update(0);
}

int DocumentModel::rowCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(docs_.size());
}

int DocumentModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumns; }

QVariant DocumentModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  return CellData(DocumentCell(docs_[index.row()], time_ms_, index.column()), role, kDocumentColumns[index.column()]);
}

QVariant DocumentModel::headerData(int section, Qt::Orientation o, int role) const {
  return Header(kDocumentColumns, section, o, role, rowCount());
}

void DocumentModel::update(std::size_t) {
  const Recorder* rec = recorder();
  if (rec->size() == 0) return;
  const Snapshot& latest = rec->latest();
  const QVector<DocumentSample>& next = latest.documents_top;
  QVector<DocKey> keys, next_keys;
  for (const DocumentSample& d : docs_) keys.push_back(KeyOf(d));
  for (const DocumentSample& d : next) next_keys.push_back(KeyOf(d));
  if (docs_.isEmpty()) time_ms_ = latest.time_ms;  // rows inserted now show it at once
  Reconcile<DocKey>(
      keys, next_keys,
      [&](int row, int j, int count) {
        beginInsertRows({}, row, row + count - 1);
        for (int k = 0; k < count; ++k) docs_.insert(row + k, next[j + k]);
        endInsertRows();
      },
      [&](int row, int count) {
        beginRemoveRows({}, row, row + count - 1);
        docs_.remove(row, count);
        endRemoveRows();
      });
  ReplaceCells(this, [&] {
    docs_ = next;
    time_ms_ = latest.time_ms;
  });
}

void DocumentModel::clearAll() {
  beginResetModel();
  docs_.clear();
  time_ms_ = 0;
  endResetModel();
}

// ---------------------------------------------------------------- QuotaModel

namespace {

const Column kQuotaColumns[] = {
    {"Tier", "The tier the quota is in", false},
    {"Namespace", "The tenant namespace (a runtime's namespace not named to the dashboard: its hash's first 8 hex "
                  "digits)", false},
    {"Used / quota", "Bytes of the tier the namespace's chunks take, of its quota", true},
    {"Use", "Used bytes as a share of the quota", true},
    {"Objects", "The namespace's chunks the tier holds", true},
    {"Own evictions", "Its chunks evicted to keep it within its quota (by its own puts), since the source started",
     true},
    {"Own evictions/s", "Own evictions per second over the last interval", true},
    {"Room evictions", "Its chunks evicted for the tier's room (the tier full of namespaces with quotas), since the "
                       "source started", true},
    {"Room evictions/s", "Room evictions per second over the last interval", true},
    {"Refused", "Its puts the tier refused (a chunk larger than its quota; it went to the next tier), since the "
                "source started", true},
};
static_assert(std::size(kQuotaColumns) == QuotaModel::kColumns);

using QuotaKey = QPair<int, QString>;
QuotaKey KeyOf(const QuotaSample& q) { return {q.tier_index, q.ns}; }

const QuotaSample* FindQuota(const QVector<QuotaSample>& quotas, const QuotaKey& key) {
  for (const QuotaSample& q : quotas) {
    if (KeyOf(q) == key) return &q;
  }
  return nullptr;
}

Cell QuotaCell(const QuotaSample& q, const QuotaSample& before, double seconds, int column) {
  const auto count = [](std::uint64_t n, std::uint64_t was, bool fault = false) {
    return Value(static_cast<double>(n), QString::number(static_cast<qulonglong>(n)), n > was, fault);
  };
  const auto rate = [&](std::uint64_t n, std::uint64_t was) {
    const double v = seconds > 0 && n >= was ? static_cast<double>(n - was) / seconds : kNaN;
    return Value(v, PerSecond(v));
  };
  switch (column) {
    case QuotaModel::kTier:
      return Text(q.tier);
    case QuotaModel::kNamespace:
      return Text(q.ns);
    case QuotaModel::kUsedOfQuota:
      return Value(static_cast<double>(q.used_bytes), Bytes(static_cast<double>(q.used_bytes)) + QStringLiteral(" / ") +
                                                          Bytes(static_cast<double>(q.quota_bytes)));
    case QuotaModel::kShare: {
      const double f = Fraction(static_cast<double>(q.used_bytes), static_cast<double>(q.quota_bytes));
      return Value(f, Percent(f));
    }
    case QuotaModel::kObjects:
      return Value(static_cast<double>(q.objects), QString::number(static_cast<qulonglong>(q.objects)));
    case QuotaModel::kQuotaEvictions:
      return count(q.quota_evictions, before.quota_evictions);
    case QuotaModel::kQuotaEvictionsPerS:
      return rate(q.quota_evictions, before.quota_evictions);
    case QuotaModel::kRoomEvictions:
      return count(q.room_evictions, before.room_evictions);
    case QuotaModel::kRoomEvictionsPerS:
      return rate(q.room_evictions, before.room_evictions);
    case QuotaModel::kRefused:
      return count(q.refused, before.refused, true);
    default:
      return {};
  }
}

}  // namespace

QuotaModel::QuotaModel(const Recorder* recorder, int min_update_ms, QObject* parent)
    : RecorderModel(recorder, min_update_ms, parent) {
  if (recorder != nullptr) update(0);
}

int QuotaModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }

int QuotaModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kColumns; }

QVariant QuotaModel::data(const QModelIndex& index, int role) const {
  if (!checkIndex(index, CheckIndexOption::IndexIsValid | CheckIndexOption::ParentIsInvalid)) return {};
  const Row& r = rows_[index.row()];
  return CellData(QuotaCell(r.now, r.before, r.seconds, index.column()), role, kQuotaColumns[index.column()]);
}

QVariant QuotaModel::headerData(int section, Qt::Orientation o, int role) const {
  return Header(kQuotaColumns, section, o, role, rowCount());
}

void QuotaModel::update(std::size_t) {
  const Recorder* rec = recorder();
  if (rec->size() == 0) return;
  const Snapshot& latest = rec->latest();
  // Rates over the last interval, against the reading before; none over a
  // restart (Recorder: seconds 0) or for a quota that was not in it.
  const double seconds = rec->rates(rec->size() - 1).seconds;
  const QVector<QuotaSample> earlier = rec->size() >= 2 ? rec->at(rec->size() - 2).quotas : QVector<QuotaSample>{};
  QVector<Row> next;
  next.reserve(latest.quotas.size());
  for (const QuotaSample& q : latest.quotas) {
    const QuotaSample* b = seconds > 0 ? FindQuota(earlier, KeyOf(q)) : nullptr;
    next.push_back(Row{q, b != nullptr ? *b : q, b != nullptr ? seconds : 0});
  }
  QVector<QuotaKey> keys, next_keys;
  for (const Row& r : rows_) keys.push_back(KeyOf(r.now));
  for (const Row& r : next) next_keys.push_back(KeyOf(r.now));
  Reconcile<QuotaKey>(
      keys, next_keys,
      [&](int row, int j, int count) {
        beginInsertRows({}, row, row + count - 1);
        for (int k = 0; k < count; ++k) rows_.insert(row + k, next[j + k]);
        endInsertRows();
      },
      [&](int row, int count) {
        beginRemoveRows({}, row, row + count - 1);
        rows_.remove(row, count);
        endRemoveRows();
      });
  ReplaceCells(this, [&] { rows_ = next; });
}

void QuotaModel::clearAll() {
  beginResetModel();
  rows_.clear();
  endResetModel();
}

}  // namespace kdn::dash
