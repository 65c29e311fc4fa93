// SPDX-License-Identifier: Apache-2.0
#include "server/server.h"

#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include <capnp/rpc-twoparty.h>
#include <capnp/rpc.h>
#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/compat/http.h>
#include <kj/compat/tls.h>
#include <kj/debug.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "server/kv_events.h"
#include "server/metrics.h"
#include "core/wire/message_stream.h"
#include "core/wire/rpc.h"

#ifndef KDN_SERVER_VERSION
#define KDN_SERVER_VERSION "unknown"
#endif

namespace kdn::server {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Makes a connection's bootstrap capability, given its message buffers.
using BootstrapFactory = std::function<capnp::Capability::Client(std::shared_ptr<wire::StreamBuffers>)>;

// What every connection of one Run is held to (server.bounds, with
// max_connections resolved), and what it counts on.
struct Admission {
  NodeService& service;
  kj::Timer& timer;
  ServerBounds bounds;
};

// One RPC connection: its message stream, network and RPC system live as
// long as it does; its capabilities share its message buffers. It is
// closed when it disconnects, or when a bound drops it (its buffers'
// Drop(): no login in time, a message too large before a login or stalled
// halfway, too many failed logins).
struct Connection {
  Connection(kj::Own<kj::AsyncIoStream>&& s, const BootstrapFactory& bootstrap, Admission& a)
      : admission(a),
        stream(kj::mv(s)),
        buffers(MakeBuffers(a)),
        messages(*stream, buffers, &a.timer, a.bounds.message_timeout_ms),
        network(messages, capnp::rpc::twoparty::Side::SERVER, wire::RpcReaderOptions()),
        rpc(capnp::makeRpcServer(network, bootstrap(buffers))) {
    // Calls in flight (not yet returned): past this, the connection's
    // requests are not read either (Cap'n Proto's flow limit; the replies
    // its gets hold bound its reads too: core/wire/message_stream.h).
    rpc.setFlowLimit(static_cast<size_t>(a.bounds.max_inflight_bytes / sizeof(capnp::word)));
    admission.service.ConnectionOpened();
    auto drop = kj::newPromiseAndFulfiller<void>();
    dropped = kj::mv(drop.promise);
    auto fulfiller = std::make_shared<kj::Own<kj::PromiseFulfiller<void>>>(kj::mv(drop.fulfiller));
    buffers->SetDropper([fulfiller, &a]() {
      a.service.CountBound(NodeStat::kConnectionsDropped);
      (*fulfiller)->fulfill();
    });
  }
  ~Connection() noexcept(false) {
    buffers->SetDropper(nullptr);  // the capabilities may outlive the connection
    admission.service.ConnectionClosed();
  }
  static std::shared_ptr<wire::StreamBuffers> MakeBuffers(const Admission& a) {
    auto b = std::make_shared<wire::StreamBuffers>(a.bounds.max_inflight_bytes);
    b->SetPreAuthLimit(a.bounds.pre_auth_max_bytes);
    return b;
  }
  // Ends when the connection should close: it disconnected, a bound
  // dropped it, or it did not log in within login_timeout_ms.
  kj::Promise<void> Done() {
    std::shared_ptr<wire::StreamBuffers> b = buffers;
    auto login = admission.timer.afterDelay(admission.bounds.login_timeout_ms * kj::MILLISECONDS)
                     .then([b]() -> kj::Promise<void> {
                       if (b->authenticated()) return kj::NEVER_DONE;
                       b->Drop();
                       return kj::READY_NOW;
                     });
    return network.onDisconnect().exclusiveJoin(kj::mv(dropped)).exclusiveJoin(kj::mv(login));
  }
  Admission& admission;
  kj::Own<kj::AsyncIoStream> stream;
  std::shared_ptr<wire::StreamBuffers> buffers;
  wire::BulkMessageStream messages;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
  kj::Promise<void> dropped = kj::NEVER_DONE;
};

class MetricsHttp final : public kj::HttpService {
 public:
  MetricsHttp(NodeService& service, kj::HttpHeaderTable& table, kj::HttpHeaderId authorization,
              kj::HttpHeaderId www_authenticate, bool lmcache_names, bool open)
      : service_(service), table_(table), authorization_(authorization), www_authenticate_(www_authenticate),
        open_(open) {
    options_.lmcache_names = lmcache_names;
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders& in,
                            kj::AsyncInputStream&, Response& response) override {
    kj::HttpHeaders headers(table_);
    std::string body;
    unsigned status = 200;
    kj::StringPtr reason = "OK";
    if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
      status = 405;
      reason = "Method Not Allowed";
      body = "only GET\n";
    } else if (url == "/metrics" && !open_ && !Authorized(in)) {
      // Every tenant's counts and names: a token with the stats grant.
      status = 401;
      reason = "Unauthorized";
      headers.set(www_authenticate_, "Bearer");
      body = "/metrics needs \"Authorization: Bearer <token>\" of a token with the stats grant\n";
    } else if (url == "/metrics") {
      headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
      PrometheusOptions options = options_;
      options.process_metrics = true;
      if (const KvEventPublisher* events = service_.event_publisher()) {
        const KvEventPublisher::Stats e = events->stats();
        options.kv_events = true;
        options.kv_events_queued = e.events_queued;
        options.kv_events_dropped = e.events_dropped;
        options.kv_events_send_errors = e.send_errors;
      }
      body = RenderPrometheus(service_.Stats(), options);
    } else if (url == "/healthz") {
      const bool serving = !service_.draining();
      status = serving ? 200 : 503;
      reason = serving ? "OK" : "Service Unavailable";
      body = RenderHealth(serving);
    } else {
      status = 404;
      reason = "Not Found";
      body = "kdnd serves /metrics and /healthz\n";
    }
    if (headers.get(kj::HttpHeaderId::CONTENT_TYPE) == nullptr) headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain");
    auto out = response.send(status, reason, headers, static_cast<std::uint64_t>(body.size()));
    auto text = kj::heapString(body.data(), body.size());
    auto write = out->write(text.begin(), text.size());
    return write.attach(kj::mv(out), kj::mv(text));
  }

 private:
  // Whether the request carries a token with the stats grant (an unknown
  // token or one without the grant is counted, as a refused RPC is).
  bool Authorized(const kj::HttpHeaders& in) {
    KJ_IF_MAYBE(value, in.get(authorization_)) {
      const std::string_view v(value->begin(), value->size());
      if (v.rfind("Bearer ", 0) != 0) return false;
      const Grant* g = service_.Authenticate(v.substr(7));
      return g != nullptr && service_.CheckStats(*g).ok();
    }
    return false;
  }

  NodeService& service_;
  kj::HttpHeaderTable& table_;
  kj::HttpHeaderId authorization_, www_authenticate_;
  PrometheusOptions options_;
  bool open_ = false;
};

struct LogErrors final : kj::TaskSet::ErrorHandler {
  void taskFailed(kj::Exception&& e) override {
    if (e.getType() != kj::Exception::Type::DISCONNECTED) KJ_LOG(WARNING, "kdnd: connection failed", e);
  }
};

// Accepts connections until dropped; each serves RPC until it disconnects
// or a bound closes it. Past max_connections (RPC and HTTP together) a new
// one is closed as it comes. An accept that fails (out of file
// descriptors, say) is counted and retried after a pause (10 ms, doubling
// to 1 s while they keep failing): the listener never stops for good.
kj::Promise<void> AcceptLoop(kj::ConnectionReceiver& receiver, Admission& a,
                             const std::function<void(kj::Own<kj::AsyncIoStream>&&)>& serve, std::uint32_t pause_ms = 0);

// After a failed accept: counted, a pause, and on.
kj::Promise<void> AcceptAfterPause(kj::ConnectionReceiver& receiver, Admission& a,
                                   const std::function<void(kj::Own<kj::AsyncIoStream>&&)>& serve, std::uint32_t pause_ms,
                                   const kj::Exception& e) {
  a.service.CountBound(NodeStat::kAcceptErrors);
  if (pause_ms == 0) KJ_LOG(WARNING, "kdnd: accept failed; retrying after a pause", e);
  const std::uint32_t next = pause_ms == 0 ? 10 : std::min<std::uint32_t>(pause_ms * 2, 1000);
  return a.timer.afterDelay(next * kj::MILLISECONDS).then([&receiver, &a, &serve, next]() {
    return AcceptLoop(receiver, a, serve, next);
  });
}

kj::Promise<void> AcceptLoop(kj::ConnectionReceiver& receiver, Admission& a,
                             const std::function<void(kj::Own<kj::AsyncIoStream>&&)>& serve, std::uint32_t pause_ms) {
  // accept() may fail at once (out of file descriptors: it throws) or later
  // (its promise breaks): both pause and go on.
  kj::Maybe<kj::Promise<kj::Own<kj::AsyncIoStream>>> accepting;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { accepting = receiver.accept(); })) {
    return AcceptAfterPause(receiver, a, serve, pause_ms, *e);
  }
  return KJ_ASSERT_NONNULL(accepting).then(
      [&receiver, &a, &serve](kj::Own<kj::AsyncIoStream>&& stream) mutable -> kj::Promise<void> {
        if (a.service.connections() >= static_cast<std::int64_t>(a.bounds.max_connections)) {
          a.service.CountBound(NodeStat::kConnectionsRefused);  // `stream` closes here
        } else {
          serve(kj::mv(stream));
        }
        return AcceptLoop(receiver, a, serve);
      },
      [&receiver, &a, &serve, pause_ms](kj::Exception&& e) -> kj::Promise<void> {
        return AcceptAfterPause(receiver, a, serve, pause_ms, e);
      });
}

// An HTTP connection, counted among the node's connections while it lives.
struct HttpConnection {
  explicit HttpConnection(NodeService& s) : service(s) { service.ConnectionOpened(); }
  ~HttpConnection() { service.ConnectionClosed(); }
  NodeService& service;
};

// The connection cap, resolved: the file descriptor limit less 64 (the
// tiers' files, the listeners, the event loop) unless configured.
std::uint32_t ResolveMaxConnections(std::uint32_t configured) {
  if (configured != 0) return configured;
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 65536;
  return static_cast<std::uint32_t>(std::max<rlim_t>(rl.rlim_cur, 128) - 64);
}

// A Unix socket left by a kdnd that died (kill -9) would make the bind
// fail: removed when nothing answers on it. One that answers is another
// node's, and the bind then fails, as it should.
void RemoveStaleSocket(const std::string& address) {
  if (address.rfind("unix:", 0) != 0) return;
  const std::string path = address.substr(5);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return;
  sockaddr_un sa{};
  if (path.size() >= sizeof(sa.sun_path)) return;
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const bool refused = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 && errno == ECONNREFUSED;
  ::close(fd);
  if (refused) ::unlink(path.c_str());
}

std::string Describe(const kj::Exception& e) { return std::string(e.getDescription().cStr()); }

}  // namespace

namespace {

// Whether a listen address keeps its traffic on this machine: a unix
// socket, or a TCP address on the loopback (127.0.0.0/8, ::1, localhost).
bool StaysOnThisMachine(const std::string& address) {
  if (address.rfind("unix:", 0) == 0) return true;
  std::string host = address;
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    host = host.substr(1, host.find(']') == std::string::npos ? std::string::npos : host.find(']') - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos && host.find(':') == colon) {
    host.resize(colon);  // v4 or a name, then :port
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

Status CheckPlaintext(const ServerConfig& config) {
  if (config.allow_plaintext) return Status::Ok();
  for (const std::string& a : config.listen) {
    if (!config.tls.enabled() && !StaysOnThisMachine(a)) {
      return Status::InvalidArgument("kdnd: server.listen \"" + a +
                                     "\" is not a loopback address and [server.tls] is not set: tokens and KV "
                                     "would cross the network in clear (set server.allow_plaintext = true to allow it)");
    }
  }
  if (!config.metrics.empty() && !config.metrics_public && !StaysOnThisMachine(config.metrics)) {
    return Status::InvalidArgument("kdnd: server.metrics \"" + config.metrics +
                                   "\" is not a loopback address: a scrape's bearer token would cross the network "
                                   "in clear (set server.allow_plaintext = true, or metrics_public)");
  }
  // KV events: a subscriber's token (ZeroMQ PLAIN), or the events themselves.
  if (const std::string& e = config.kv_events; e.rfind("tcp://", 0) == 0 && !StaysOnThisMachine(e.substr(6))) {
    return Status::InvalidArgument("kdnd: server.kv_events \"" + e +
                                   "\" is not a loopback address: subscribers' tokens and every tenant's chunk keys "
                                   "would cross the network in clear (set server.allow_plaintext = true to allow it)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Server>> Server::Create(const ServerConfig& config) {
  if (config.listen.empty()) return Status::InvalidArgument("kdnd: nothing to listen on");
  KDN_RETURN_IF_ERROR(CheckPlaintext(config));
  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
  NodeOptions no;
  no.tiers = config.tiers;
  no.tokens = config.tokens;
  no.prefill_us_per_token = config.prefill_us_per_token;
  no.knowledge = config.knowledge;
  no.measure_tiers = config.measure_tiers;
  no.secret_file = config.secret_file;
  no.encryption_key_file = config.encryption_key_file;
  no.encryption_key_env = config.encryption_key_env;
  no.max_reply_bytes = config.bounds.max_reply_bytes;
  no.max_subscriptions = config.bounds.max_subscriptions;
  no.max_usage_series = config.bounds.max_usage_series;
  auto service = NodeService::Create(no);
  if (!service.ok()) return service.status();
  s->service_ = std::move(service).value();
  if (!config.kv_events.empty()) {
    KvEventOptions eo;
    eo.encoding = config.kv_events_format == "array" ? KvEventEncoding::kTaggedArray : KvEventEncoding::kTaggedMap;
    eo.hash_form = config.kv_events_hashes == "uint64" ? KvBlockHashForm::kUint64 : KvBlockHashForm::kBytes;
    if (!config.kv_events_public) {
      // A subscriber logs in with a token (its PLAIN password) that has the
      // stats grant, as /metrics asks; an unknown token is counted as a
      // refused call is.
      NodeService* service = s->service_.get();
      eo.authorize = [service](std::string_view token) { return service->GrantsStats(token); };
    }
    auto events = KvEventPublisher::Create(config.kv_events, config.kv_events_topic, eo);
    if (!events.ok()) return events.status();
    s->events_ = std::move(events).value();
    s->service_->SetEventPublisher(s->events_.get());
  }
  return s;
}

Server::~Server() {
  if (service_) service_->SetEventPublisher(nullptr);
}

void Server::CaptureSignals() {
  kj::UnixEventPort::captureSignal(SIGTERM);
  kj::UnixEventPort::captureSignal(SIGINT);
  kj::UnixEventPort::captureSignal(SIGHUP);
}

Result<TokenReload> Server::ReloadTokens() {
  if (!token_source_) return Status::Unsupported("kdnd: no token source to reload from");
  Result<std::vector<TokenGrant>> tokens = token_source_();
  if (!tokens.ok()) return tokens.status();
  if (tokens->empty()) return Status::InvalidArgument("kdnd: the new configuration has no tokens");
  return service_->ReloadTokens(*tokens);
}

namespace {

// Each SIGHUP, on the loop: the tokens reloaded, what changed said on stderr.
kj::Promise<void> ReloadOnHangup(kj::UnixEventPort& port, Server& server) {
  return port.onSignal(SIGHUP).then([&port, &server](siginfo_t&&) {
    Result<TokenReload> r = server.ReloadTokens();
    if (r.ok()) {
      std::fprintf(stderr,
                   "kdnd: SIGHUP: tokens reloaded (%zu kept, %zu added, %zu revoked); other settings take effect at "
                   "the next start\n",
                   r->kept, r->added, r->revoked);
    } else {
      std::fprintf(stderr, "kdnd: SIGHUP: tokens unchanged: %s\n", r.status().message().c_str());
    }
    return ReloadOnHangup(port, server);
  });
}

}  // namespace

void Server::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_requested_ = true;
  if (stop_) stop_->fulfill();
}

BoundAddresses Server::WaitReady() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_ || finished_; });
  return bound_;
}

Status Server::Run(const std::function<void(const BoundAddresses&)>& ready, bool handle_signals) {
  Status result;
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&]() {
    auto io = kj::setupAsyncIo();
    auto& ws = io.waitScope;
    auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = kj::mv(stop.fulfiller);
      if (stop_requested_) stop_->fulfill();
    }
    kj::Maybe<kj::TlsKeypair> keypair;  // outlives the context, which refers to it
    kj::Maybe<kj::Own<kj::TlsContext>> tls;
    if (config_.tls.enabled()) {
      kj::TlsContext::Options o;
      auto cert = ReadFile(config_.tls.cert_file), key = ReadFile(config_.tls.key_file);
      if (cert.empty() || key.empty()) KJ_FAIL_REQUIRE("TLS: cannot read the certificate or the key", config_.tls.cert_file);
      keypair = kj::TlsKeypair{kj::TlsPrivateKey(kj::StringPtr(key.c_str())),
                               kj::TlsCertificate(kj::StringPtr(cert.c_str()))};
      o.defaultKeypair = KJ_ASSERT_NONNULL(keypair);
      tls = kj::heap<kj::TlsContext>(kj::mv(o));
    }
    const BootstrapFactory bootstrap = [this, &io](std::shared_ptr<wire::StreamBuffers> buffers) {
      return MakeNodeBootstrap(*service_, io.provider->getTimer(), KDN_SERVER_VERSION, std::move(buffers),
                               config_.bounds.max_login_failures, config_.bounds.max_subscriptions_per_connection);
    };
    LogErrors log_errors;
    kj::TaskSet connections(log_errors);
    Admission admission{*service_, io.provider->getTimer(), config_.bounds};
    admission.bounds.max_connections = ResolveMaxConnections(config_.bounds.max_connections);
    const std::function<void(kj::Own<kj::AsyncIoStream>&&)> serve_rpc = [&](kj::Own<kj::AsyncIoStream>&& stream) {
      auto conn = kj::heap<Connection>(kj::mv(stream), bootstrap, admission);
      auto done = conn->Done();
      connections.add(done.attach(kj::mv(conn)));
    };
    kj::Vector<kj::Own<kj::ConnectionReceiver>> listeners;
    BoundAddresses bound;
    for (const std::string& addr : config_.listen) {
      RemoveStaleSocket(addr);
      auto parsed = io.provider->getNetwork().parseAddress(addr, 7450).wait(ws);
      auto listener = parsed->listen();
      if (addr.rfind("unix:", 0) == 0) {
        bound.rpc.push_back(addr);
      } else {
        const std::string host = addr.substr(0, addr.rfind(':'));
        bound.rpc.push_back(host + ":" + std::to_string(listener->getPort()));
      }
      KJ_IF_MAYBE(t, tls) { listener = (*t)->wrapPort(kj::mv(listener)); }
      listeners.add(kj::mv(listener));
    }
    // Each listener accepts until the node shuts down (the loops are dropped then).
    kj::Vector<kj::Promise<void>> accepting;
    for (auto& l : listeners) accepting.add(AcceptLoop(*l, admission, serve_rpc));
    // /metrics and /healthz.
    kj::Own<kj::HttpHeaderTable> table;
    kj::Own<MetricsHttp> http_service;
    kj::Own<kj::HttpServer> http;
    kj::Own<kj::ConnectionReceiver> http_listener;
    kj::Promise<void> http_loop = kj::READY_NOW;
    kj::TaskSet http_connections(log_errors);  // after `http`: destroyed before it
    const std::function<void(kj::Own<kj::AsyncIoStream>&&)> serve_http = [&](kj::Own<kj::AsyncIoStream>&& stream) {
      auto counted = kj::heap<HttpConnection>(*service_);
      http_connections.add(http->listenHttp(kj::mv(stream)).attach(kj::mv(counted)));
    };
    if (!config_.metrics.empty()) {
      kj::HttpHeaderTable::Builder builder;
      const kj::HttpHeaderId authorization = builder.add("Authorization");
      const kj::HttpHeaderId www_authenticate = builder.add("WWW-Authenticate");
      table = builder.build();
      http_service = kj::heap<MetricsHttp>(*service_, *table, authorization, www_authenticate,
                                           config_.lmcache_metric_names, config_.metrics_public);
      http = kj::heap<kj::HttpServer>(io.provider->getTimer(), *table, *http_service);
      auto parsed = io.provider->getNetwork().parseAddress(config_.metrics, 9450).wait(ws);
      http_listener = parsed->listen();
      const std::string host = config_.metrics.substr(0, config_.metrics.rfind(':'));
      bound.metrics = host + ":" + std::to_string(http_listener->getPort());
      http_loop = AcceptLoop(*http_listener, admission, serve_http).eagerlyEvaluate([](kj::Exception&& e) {
        KJ_LOG(WARNING, "kdnd: metrics listener failed", e);
      });
    }
    auto all_accepting = kj::joinPromises(accepting.releaseAsArray()).eagerlyEvaluate([](kj::Exception&& e) {
      KJ_LOG(ERROR, "kdnd: a listener failed", e);
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      bound_ = bound;
      ready_ = true;
      executor_ = &kj::getCurrentThreadExecutor();
    }
    cv_.notify_all();
    if (ready) ready(bound);

    kj::Promise<void> stopped = kj::mv(stop.promise);
    if (handle_signals) {
      auto& port = io.unixEventPort;
      stopped = stopped.exclusiveJoin(port.onSignal(SIGTERM).ignoreResult())
                    .exclusiveJoin(port.onSignal(SIGINT).ignoreResult())
                    .exclusiveJoin(ReloadOnHangup(port, *this));
    }
    stopped.wait(ws);

    // Drain: no new connections, data calls refused, queued moves finished,
    // all within drain_timeout_ms: past it, kdnd exits anyway (what the disk
    // tier holds is crash-safe; a write-through copy still queued is lost).
    std::mutex drain_mu;
    std::condition_variable drain_cv;
    bool drained = false;
    std::thread watchdog([&] {
      std::unique_lock<std::mutex> lock(drain_mu);
      if (!drain_cv.wait_for(lock, std::chrono::milliseconds(config_.drain_timeout_ms), [&] { return drained; })) {
        std::fprintf(stderr, "kdnd: drain took longer than %u ms; exiting without it\n", config_.drain_timeout_ms);
        std::_Exit(3);
      }
    });
    KJ_DEFER({
      {
        std::lock_guard<std::mutex> lock(drain_mu);
        drained = true;
      }
      drain_cv.notify_all();
      watchdog.join();
    });
    service_->SetDraining();
    all_accepting = kj::READY_NOW;
    http_loop = kj::READY_NOW;
    listeners.clear();
    http_listener = nullptr;
    service_->chain().Flush();
    // The registry of knowledge items, saved now rather than when the
    // service is destroyed: a drain past its timeout exits without that.
    if (Status saved = service_->knowledge().Save(); !saved.ok()) std::fprintf(stderr, "kdnd: %s\n", saved.message().c_str());
    if (events_) events_->Flush();
    // Let refusals and in-flight replies reach their clients, briefly.
    io.provider->getTimer().afterDelay(50 * kj::MILLISECONDS).wait(ws);
  });
  KJ_IF_MAYBE(e, failure) { result = Status(Code::kUnavailable, "kdnd: " + Describe(*e)); }
  {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    executor_ = nullptr;
    stop_ = nullptr;
  }
  cv_.notify_all();
  return result;
}

}  // namespace kdn::server
