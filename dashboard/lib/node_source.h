// SPDX-License-Identifier: Apache-2.0
// A kdnd as a data source: logs in with a token that has the stats grant,
// subscribes to its statistics (Session.subscribeStats, pushed every
// interval_ms) and turns each push into a Snapshot. Optionally lists the
// knowledge items of the namespaces the token grants (knowledgeList), every
// documents_ms. Its own thread runs the connection (kj event loop): the UI
// thread never waits on the network. When kdnd goes away it says so
// (kDisconnected, with why), keeps nothing open, and tries again every
// reconnect_ms until stopped.
// Thread-safety: construct, start, stop on the owning thread; signals arrive
// there (queued).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "source.h"

namespace kdn::dash {

struct NodeSourceOptions {
  std::string address;          // "host:port" or "unix:/path", as kdnd's server.listen
  std::string token;            // needs `stats = true` on kdnd
  std::string tls_ca_file;      // non-empty: TLS, the node's certificate checked against this CA
  std::string tls_server_name;  // the name the certificate must carry (default: the address's host)
  std::uint32_t interval_ms = 500;   // pushes (kdnd's floor is 50)
  std::uint32_t reconnect_ms = 1000;
  std::uint32_t timeout_ms = 3000;   // connect + login + subscribe; a subscription silent for
                                     // 4 x interval_ms + timeout_ms is taken as lost
  std::vector<std::string> namespaces;  // listed for documents_top (the token must grant them)
  std::uint32_t documents_ms = 2000;
  std::uint32_t documents_top = 20;
};

class NodeSource final : public Source {
  Q_OBJECT
 public:
  explicit NodeSource(NodeSourceOptions options, QObject* parent = nullptr);
  ~NodeSource() override;  // stops

  void start() override;
  void stop() override;
  State state() const override;
  QString describe() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdn::dash
