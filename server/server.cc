#include "server/server.h"

#include <errno.h>
#include <signal.h>
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

// One RPC connection: its message stream, network and RPC system live as
// long as it does; its capabilities share its message buffers.
struct Connection {
  Connection(kj::Own<kj::AsyncIoStream>&& s, const BootstrapFactory& bootstrap)
      : stream(kj::mv(s)),
        buffers(std::make_shared<wire::StreamBuffers>()),
        messages(*stream, buffers),
        network(messages, capnp::rpc::twoparty::Side::SERVER, wire::RpcReaderOptions()),
        rpc(capnp::makeRpcServer(network, bootstrap(buffers))) {}
  kj::Own<kj::AsyncIoStream> stream;
  std::shared_ptr<wire::StreamBuffers> buffers;
  wire::BulkMessageStream messages;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
};

class MetricsHttp final : public kj::HttpService {
 public:
  MetricsHttp(NodeService& service, kj::HttpHeaderTable& table, bool lmcache_names)
      : service_(service), table_(table) {
    options_.lmcache_names = lmcache_names;
  }

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url, const kj::HttpHeaders&,
                            kj::AsyncInputStream&, Response& response) override {
    kj::HttpHeaders headers(table_);
    std::string body;
    unsigned status = 200;
    kj::StringPtr reason = "OK";
    if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
      status = 405;
      reason = "Method Not Allowed";
      body = "only GET\n";
    } else if (url == "/metrics") {
      headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
      body = RenderPrometheus(service_.Stats(), options_);
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
  NodeService& service_;
  kj::HttpHeaderTable& table_;
  PrometheusOptions options_;
};

struct LogErrors final : kj::TaskSet::ErrorHandler {
  void taskFailed(kj::Exception&& e) override {
    if (e.getType() != kj::Exception::Type::DISCONNECTED) KJ_LOG(WARNING, "kdnd: connection failed", e);
  }
};

// Accepts connections until dropped; each serves RPC until it disconnects.
kj::Promise<void> AcceptLoop(kj::ConnectionReceiver& receiver, kj::TaskSet& connections,
                             const BootstrapFactory& bootstrap) {
  return receiver.accept().then(
      [&receiver, &connections, &bootstrap](kj::Own<kj::AsyncIoStream>&& stream) mutable {
        auto conn = kj::heap<Connection>(kj::mv(stream), bootstrap);
        auto done = conn->network.onDisconnect();
        connections.add(done.attach(kj::mv(conn)));
        return AcceptLoop(receiver, connections, bootstrap);
      });
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

Result<std::unique_ptr<Server>> Server::Create(const ServerConfig& config) {
  if (config.listen.empty()) return Status::InvalidArgument("kdnd: nothing to listen on");
  std::unique_ptr<Server> s(new Server());
  s->config_ = config;
  NodeOptions no;
  no.tiers = config.tiers;
  no.tokens = config.tokens;
  no.prefill_us_per_token = config.prefill_us_per_token;
  no.knowledge = config.knowledge;
  no.measure_tiers = config.measure_tiers;
  no.secret_file = config.secret_file;
  auto service = NodeService::Create(no);
  if (!service.ok()) return service.status();
  s->service_ = std::move(service).value();
  if (!config.kv_events.empty()) {
    KvEventOptions eo;
    eo.encoding = config.kv_events_format == "array" ? KvEventEncoding::kTaggedArray : KvEventEncoding::kTaggedMap;
    eo.hash_form = config.kv_events_hashes == "uint64" ? KvBlockHashForm::kUint64 : KvBlockHashForm::kBytes;
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
}

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
      return MakeNodeBootstrap(*service_, io.provider->getTimer(), KDN_SERVER_VERSION, std::move(buffers));
    };
    LogErrors log_errors;
    kj::TaskSet connections(log_errors);
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
    for (auto& l : listeners) accepting.add(AcceptLoop(*l, connections, bootstrap));
    // /metrics and /healthz.
    kj::Own<kj::HttpHeaderTable> table;
    kj::Own<MetricsHttp> http_service;
    kj::Own<kj::HttpServer> http;
    kj::Own<kj::ConnectionReceiver> http_listener;
    kj::Promise<void> http_loop = kj::READY_NOW;
    if (!config_.metrics.empty()) {
      table = kj::heap<kj::HttpHeaderTable>();
      http_service = kj::heap<MetricsHttp>(*service_, *table, config_.lmcache_metric_names);
      http = kj::heap<kj::HttpServer>(io.provider->getTimer(), *table, *http_service);
      auto parsed = io.provider->getNetwork().parseAddress(config_.metrics, 9450).wait(ws);
      http_listener = parsed->listen();
      const std::string host = config_.metrics.substr(0, config_.metrics.rfind(':'));
      bound.metrics = host + ":" + std::to_string(http_listener->getPort());
      http_loop = http->listenHttp(*http_listener).eagerlyEvaluate([](kj::Exception&& e) {
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
                    .exclusiveJoin(port.onSignal(SIGINT).ignoreResult());
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
