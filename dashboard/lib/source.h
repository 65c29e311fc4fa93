// SPDX-License-Identifier: Apache-2.0
// A data source: where snapshots come from. Two kinds: a kdnd (its stats
// subscription over Cap'n Proto RPC, node_source.h) and a runtime in this
// process (its C ABI counters, polled: runtime_source.h). A source works off
// the UI thread (network, parsing, polling) and delivers on the thread that
// owns it, through queued signals.
// Thread-safety: construct, start and stop on the owning (UI) thread.
#pragma once

#include <QObject>
#include <QString>

#include "snapshot.h"

namespace kdn::dash {

class Source : public QObject {
  Q_OBJECT
 public:
  enum class State { kStopped, kConnecting, kConnected, kDisconnected };
  Q_ENUM(State)

  using QObject::QObject;
  ~Source() override = default;

  virtual void start() = 0;  // begins delivering (and reconnecting, for a remote source)
  virtual void stop() = 0;   // stops; no signal after it returns
  virtual State state() const = 0;
  virtual QString describe() const = 0;  // "kdnd 127.0.0.1:7450", "runtime (in process)"

 signals:
  void snapshot(const kdn::dash::Snapshot& s);
  // kDisconnected carries why ("connection refused", "kdnd closed the
  // connection", "permission denied: the token has no stats grant").
  void stateChanged(kdn::dash::Source::State state, const QString& why);
};

}  // namespace kdn::dash
