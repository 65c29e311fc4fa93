// SPDX-License-Identifier: Apache-2.0
// kdnd's server: the node service (server/service.h) on Cap'n Proto RPC over
// every configured listen address (TCP, Unix sockets; TLS when configured),
// /metrics and /healthz over HTTP, and KV events over ZeroMQ, all on one
// event loop thread (the one that calls Run).
//
// SIGHUP (when Run handles signals) reloads the tokens from the token
// source (kdnd: the configuration file again): revoking a token needs no
// restart. Other settings take effect at the next start. A source that
// fails (an invalid file) leaves the tokens as they were, and says why.
//
// Shutdown (SIGTERM or SIGINT when Run handles signals, or Shutdown() from
// any thread): the node stops accepting connections, answers data calls with
// `unavailable`, waits for the tiers' queued moves (write-back to disk), and
// Run returns; if that takes longer than drain_timeout_ms, the process exits
// (status 3) without waiting further. A disk tier then holds everything it was given, and the next
// kdnd on the same directory serves it.
// Thread-safety: Run on one thread; Shutdown and the accessors from any.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <kj/async.h>

#include "server/config.h"
#include "server/rpc.h"
#include "server/service.h"

namespace kdn::server {

class KvEventPublisher;

// Where a running server listens (the ports the OS chose for ":0").
struct BoundAddresses {
  std::vector<std::string> rpc;  // "127.0.0.1:7450", "unix:/path"
  std::string metrics;           // "127.0.0.1:9450", or empty
};

// The rule on plaintext (ServerConfig::allow_plaintext): an RPC listener
// on a TCP address that is not loopback needs [server.tls], and /metrics
// (which takes a bearer token unless metrics_public) a loopback address, and
// so do KV events over TCP (a subscriber's token, or with kv_events_public
// every tenant's chunk keys, in clear); kInvalidArgument naming the address
// otherwise. Server::Create applies it.
Status CheckPlaintext(const ServerConfig& config);

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(const ServerConfig& config);
  ~Server();

  // Blocks SIGTERM, SIGINT and SIGHUP for the loop to take them: call first
  // thing in main, before any thread starts (threads inherit the mask).
  static void CaptureSignals();
  // Where SIGHUP reads the tokens again (before Run; none: SIGHUP is
  // ignored, and said so).
  using TokenSource = std::function<Result<std::vector<TokenGrant>>()>;
  void SetTokenSource(TokenSource source) { token_source_ = std::move(source); }
  // Reloads the tokens from the source now (what SIGHUP does), on the
  // calling thread: the loop's, or before Run. Returns what changed.
  Result<TokenReload> ReloadTokens();
  // Serves until a shutdown; `ready` is called once every address is bound.
  // With handle_signals (after CaptureSignals), SIGTERM and SIGINT shut it
  // down and SIGHUP reloads the tokens.
  Status Run(const std::function<void(const BoundAddresses&)>& ready, bool handle_signals);
  // Asks Run to shut down (from any thread); returns at once.
  void Shutdown();
  // Waits until Run has bound its addresses (for tests running it on a thread).
  BoundAddresses WaitReady();

  NodeService& service() { return *service_; }
  // The KV events' publisher (server.kv_events); null without one.
  KvEventPublisher* event_publisher() { return events_.get(); }

 private:
  Server() = default;
  ServerConfig config_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<KvEventPublisher> events_;
  TokenSource token_source_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false, stop_requested_ = false, finished_ = false;
  BoundAddresses bound_;
  const kj::Executor* executor_ = nullptr;  // the loop's, while Run runs
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stop_;
};

}  // namespace kdn::server
