#include "node_source.h"

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/compat/tls.h>
#include <kj/debug.h>

#include <QMetaObject>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "core/keys/hash.h"
#include "core/wire/node_stats.h"
#include "core/wire/node.capnp.h"

namespace kdn::dash {

namespace node = wire::node;

namespace {

std::int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

QString Q(const std::string& s) { return QString::fromStdString(s); }

// Why a connection attempt or a connection ended, for a human.
std::string Describe(const kj::Exception& e, std::uint32_t timeout_ms) {
  std::string d = e.getDescription().cStr();
  std::string lower = d;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower.find("refused") != std::string::npos) return "connection refused";
  if (e.getType() == kj::Exception::Type::OVERLOADED && lower.find("timed out") != std::string::npos) {
    return "no answer from kdnd within " + std::to_string(timeout_ms) + " ms";
  }
  if (e.getType() == kj::Exception::Type::DISCONNECTED) return "kdnd closed the connection (" + d + ")";
  return "cannot reach kdnd: " + d;
}

// A refused call (its typed error), for a human.
std::string Refusal(const char* what, node::Error::Reader e) {
  switch (e.getCode()) {
    case node::ErrorCode::UNAUTHENTICATED: return "login refused: bad token";
    case node::ErrorCode::PERMISSION_DENIED: return "permission denied: the token has no stats grant";
    case node::ErrorCode::UNAVAILABLE: return "kdnd is draining (shutting down)";
    default: break;
  }
  std::string why = std::string(what) + " refused (error " + std::to_string(static_cast<int>(e.getCode())) + ")";
  const std::string msg = e.getMessage().cStr();
  if (!msg.empty()) why += ": " + msg;
  return why;
}

TierSample ToTier(const server::TierStatsSnapshot& t) {
  TierSample s;
  s.name = Q(t.name);
  s.kind = Q(t.kind);
  s.codec = Q(t.codec);
  CopyTierCounters(t, s);
  s.high_watermark = t.high_watermark;
  s.low_watermark = t.low_watermark;
  // The read rate the node measured for the tier at start (0: not measured,
  // or a node from before protocol version 3).
  s.limit_bytes_per_s = t.limit_bytes_per_s;
  // Encoding sizes and I/O errors are not in the node's Stats: left 0 (not
  // reported).
  return s;
}

}  // namespace

struct NodeSource::Impl {
  // One connection to the node (loop thread only).
  struct Connection {
    explicit Connection(kj::Own<kj::AsyncIoStream>&& s) : stream(kj::mv(s)), rpc(*stream) {}
    kj::Own<kj::AsyncIoStream> stream;
    capnp::TwoPartyClient rpc;
    kj::Maybe<node::Session::Client> session;
    kj::Maybe<node::Subscription::Client> subscription;  // held: dropping it ends the pushes
  };

  // Receives the pushes (loop thread).
  class Sink final : public node::StatsSink::Server {
   public:
    Sink(Impl& impl, std::uint64_t generation) : impl_(impl), generation_(generation) {}

   protected:
    kj::Promise<void> push(PushContext context) override {
      impl_.OnPush(generation_, server::FromWire(context.getParams().getStats()));
      return kj::READY_NOW;
    }

   private:
    Impl& impl_;
    std::uint64_t generation_;
  };

  Impl(NodeSource& owner, NodeSourceOptions o) : q(owner), options(std::move(o)) {}

  // ---- Owner thread ----
  void Start() {
    if (thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_requested = false;
    }
    const std::uint64_t gen = ++generation;
    thread = std::thread([this, gen] { Run(gen); });
  }

  void Stop() {
    ++generation;  // whatever is still queued for the owner is dropped
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_requested = true;
      if (stopper) stopper->fulfill();
    }
    if (thread.joinable()) thread.join();
    std::lock_guard<std::mutex> lock(mu);
    stopper = nullptr;
  }

  // ---- Loop thread -> owner thread ----
  void PostState(std::uint64_t gen, State s, std::string why) {
    if (s == State::kConnecting && reported == State::kDisconnected) return;  // retrying: still disconnected
    if (s == reported && why == reported_why) return;
    reported = s;
    reported_why = why;
    NodeSource* self = &q;
    QMetaObject::invokeMethod(
        self,
        [self, gen, s, why = Q(why)] {
          if (self->impl_->generation != gen) return;
          self->impl_->state = s;
          emit self->stateChanged(s, why);
        },
        Qt::QueuedConnection);
  }

  void PostSnapshot(std::uint64_t gen, Snapshot snap) {
    NodeSource* self = &q;
    QMetaObject::invokeMethod(
        self,
        [self, gen, snap = std::move(snap)] {
          if (self->impl_->generation != gen) return;
          emit self->snapshot(snap);
        },
        Qt::QueuedConnection);
  }

  // ---- Loop thread ----
  void Run(std::uint64_t gen) {
    reported = State::kStopped;
    reported_why.clear();
    try {
      auto io = kj::setupAsyncIo();
      // The connection and TLS objects live on this loop: gone before it is.
      KJ_DEFER(conn = nullptr; tls = nullptr; trusted = nullptr);
      auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop_requested) return;
        stopper = kj::mv(stop.fulfiller);
      }
      timer = &io.provider->getTimer();
      network = &io.provider->getNetwork();
      auto stopped = stop.promise.fork();
      while (true) {
        PostState(gen, State::kConnecting, "");
        // Why the attempt ended; empty: stopped.
        auto attempt = Attempt(gen);
        auto outcome = stopped.addBranch().then([]() { return std::string(); });
        const std::string why = attempt.exclusiveJoin(kj::mv(outcome)).wait(io.waitScope);
        conn = nullptr;  // nothing stays open while disconnected
        if (why.empty()) break;
        PostState(gen, State::kDisconnected, why);
        timer->afterDelay(std::max<std::uint32_t>(options.reconnect_ms, 1) * kj::MILLISECONDS)
            .exclusiveJoin(stopped.addBranch())
            .wait(io.waitScope);
        std::lock_guard<std::mutex> lock(mu);
        if (stop_requested) break;
      }
    } catch (const kj::Exception& e) {
      PostState(gen, State::kDisconnected, std::string("the connection's event loop failed: ") + e.getDescription().cStr());
    } catch (const std::exception& e) {
      PostState(gen, State::kDisconnected, std::string("the connection's event loop failed: ") + e.what());
    }
    timer = nullptr;
    network = nullptr;
  }

  // The TLS context, made on first use; a reason when it cannot be.
  std::optional<std::string> PrepareTls() {
    if (options.tls_ca_file.empty() || tls.get() != nullptr) return std::nullopt;
    std::ifstream in(options.tls_ca_file);
    std::ostringstream pem;
    pem << in.rdbuf();
    if (!in || pem.str().empty()) return "cannot read the TLS CA file " + options.tls_ca_file;
    auto failure = kj::runCatchingExceptions([&] {
      trusted = kj::heap<kj::TlsCertificate>(kj::StringPtr(pem.str().c_str()));
      kj::TlsContext::Options o;
      o.useSystemTrustStore = false;
      o.trustedCertificates = kj::arrayPtr(trusted.get(), 1);
      tls = kj::heap<kj::TlsContext>(kj::mv(o));
    });
    KJ_IF_MAYBE(e, failure) {
      trusted = nullptr;
      return "bad TLS CA file " + options.tls_ca_file + ": " + e->getDescription().cStr();
    }
    std::string name = options.tls_server_name;
    if (name.empty()) {
      name = options.address.substr(0, options.address.rfind(':'));
      if (name.size() >= 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
    }
    server_name = kj::heapString(name.c_str());
    return std::nullopt;
  }

  // Connects, logs in and subscribes; then serves until the connection is
  // lost. Resolves to why it ended.
  kj::Promise<std::string> Attempt(std::uint64_t gen) {
    if (auto why = PrepareTls()) return *why;
    if (options.address.empty()) return std::string("no kdnd address given");
    auto subscribed =
        network->parseAddress(options.address)
            .then([](kj::Own<kj::NetworkAddress>&& addr) { return addr->connect().attach(kj::mv(addr)); })
            .then([this](kj::Own<kj::AsyncIoStream>&& stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
              if (tls.get() != nullptr) return tls->wrapClient(kj::mv(stream), server_name);
              return kj::mv(stream);
            })
            .then([this](kj::Own<kj::AsyncIoStream>&& stream) {
              conn = kj::heap<Connection>(kj::mv(stream));
              auto req = conn->rpc.bootstrap().castAs<node::KdnNode>().loginRequest();
              req.setToken(options.token);
              return req.send();
            })
            // Resolves to why the node refused, or "" once subscribed.
            .then([this, gen](capnp::Response<node::KdnNode::LoginResults>&& r) -> kj::Promise<std::string> {
              if (r.getError().getCode() != node::ErrorCode::OK) return Refusal("login", r.getError());
              node::Session::Client session = r.getSession();
              conn->session = session;
              auto req = session.subscribeStatsRequest();
              req.setIntervalMs(options.interval_ms);
              req.setSink(kj::heap<Sink>(*this, gen));
              return req.send().then(
                  [this](capnp::Response<node::Session::SubscribeStatsResults>&& s) -> std::string {
                    if (s.getError().getCode() != node::ErrorCode::OK) return Refusal("subscribeStats", s.getError());
                    conn->subscription = s.getSubscription();
                    return std::string();
                  });
            });
    const std::uint32_t timeout = options.timeout_ms;
    return timer->timeoutAfter(std::max<std::uint32_t>(timeout, 1) * kj::MILLISECONDS, kj::mv(subscribed))
        .then(
            [this, gen, timeout](std::string&& refused) -> kj::Promise<std::string> {
              if (!refused.empty()) return kj::mv(refused);
              last_push_ms = SteadyMs();
              PostState(gen, State::kConnected, "");
              return Serve().catch_([timeout](kj::Exception&& e) { return Describe(e, timeout); });
            },
            [timeout](kj::Exception&& e) -> kj::Promise<std::string> { return Describe(e, timeout); });
  }

  // Connected: until the node goes away or goes silent.
  kj::Promise<std::string> Serve() {
    auto closed = conn->rpc.onDisconnect().then([]() { return std::string("kdnd closed the connection"); });
    kj::Promise<std::string> ended = closed.exclusiveJoin(Watch());
    if (!options.namespaces.empty()) ended = ended.exclusiveJoin(ListDocuments());
    return ended;
  }

  // Resolves once no push came for 4 x interval + timeout.
  kj::Promise<std::string> Watch() {
    return timer->afterDelay(std::max<std::uint32_t>(options.interval_ms, 50) * kj::MILLISECONDS)
        .then([this]() -> kj::Promise<std::string> {
          const std::int64_t limit = 4 * std::int64_t{std::max<std::uint32_t>(options.interval_ms, 50)} + options.timeout_ms;
          const std::int64_t silent = SteadyMs() - last_push_ms;
          if (silent > limit) return "no statistics from kdnd for " + std::to_string(silent) + " ms";
          return Watch();
        });
  }

  // Lists the namespaces' documents every documents_ms (never resolves:
  // a failed list is left for the next round; a lost connection is seen
  // by Serve).
  kj::Promise<std::string> ListDocuments() {
    node::Session::Client session = KJ_ASSERT_NONNULL(conn->session);
    auto found = kj::heap<std::vector<DocumentSample>>();
    kj::Promise<void> all = kj::READY_NOW;
    for (const std::string& ns : options.namespaces) {
      all = all.then([session, ns, out = found.get()]() mutable {
        const keys::Digest h = keys::NamespaceHash(ns);
        auto req = session.knowledgeListRequest();
        req.setNamespace(capnp::Data::Reader(h.data(), h.size()));
        return req.send().then([ns, out](capnp::Response<node::Session::KnowledgeListResults>&& r) {
          if (r.getError().getCode() != node::ErrorCode::OK) return;
          for (auto i : r.getItems()) {
            DocumentSample d;
            d.ns = Q(ns);
            d.doc_id = QString::fromUtf8(i.getDocId().cStr());
            d.hits = i.getHits();
            d.chunks = i.getChunks();
            d.chunks_held = i.getChunksHeld();
            d.pinned = i.getPinned();
            d.pin_expires_ms = static_cast<std::int64_t>(i.getPinExpiresMs());
            out->push_back(std::move(d));
          }
        });
      });
    }
    auto listed = all.then([this, out = found.get()]() {
                       std::stable_sort(out->begin(), out->end(),
                                        [](const DocumentSample& a, const DocumentSample& b) { return a.hits > b.hits; });
                       if (out->size() > options.documents_top) out->resize(options.documents_top);
                       documents = QVector<DocumentSample>(out->begin(), out->end());
                     })
                      .attach(kj::mv(found))
                      .catch_([](kj::Exception&&) {});
    return listed.then([this]() { return timer->afterDelay(std::max<std::uint32_t>(options.documents_ms, 50) * kj::MILLISECONDS); })
        .then([this]() { return ListDocuments(); });
  }

  void OnPush(std::uint64_t gen, const server::NodeStats& n) {
    last_push_ms = SteadyMs();
    Snapshot s;
    s.time_ms = static_cast<std::int64_t>(n.time_ms);
    s.uptime_ms = n.uptime_ms;
    for (const auto& t : n.tiers) {
      s.tiers.push_back(ToTier(t));
      s.corrupt_detected += t.corrupt_detected;
    }
    s.lookups = n.lookups;
    s.requested_tokens = n.requested_tokens;
    s.hit_tokens = n.lookup_hit_tokens;
    s.served_tokens = n.hit_tokens;  // the node's hit tokens: served by get
    s.loads = n.get_chunks;
    s.failed_loads = n.get_misses;
    s.stores = n.put_chunks;
    s.documents = n.documents;
    s.ttft_saved_ms = n.ttft_saved_ms;
    s.delivery_ms = n.get_us.summary.sum / 1000.0;
    s.documents_top = documents;
    s.source = description;
    PostSnapshot(gen, std::move(s));
  }

  NodeSource& q;
  const NodeSourceOptions options;
  QString description;

  // Owner thread.
  std::thread thread;
  std::uint64_t generation = 0;  // bumped by start and stop: a queued signal of another run is dropped
  State state = State::kStopped;

  std::mutex mu;
  bool stop_requested = false;                                // guarded by mu
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stopper;     // guarded by mu (set by the loop)

  // Loop thread.
  kj::Timer* timer = nullptr;
  kj::Network* network = nullptr;
  kj::Own<kj::TlsCertificate> trusted;
  kj::Own<kj::TlsContext> tls;
  kj::String server_name;
  kj::Own<Connection> conn;
  std::int64_t last_push_ms = 0;
  QVector<DocumentSample> documents;  // the last listing
  State reported = State::kStopped;
  std::string reported_why;
};

NodeSource::NodeSource(NodeSourceOptions options, QObject* parent)
    : Source(parent), impl_(std::make_unique<Impl>(*this, std::move(options))) {
  qRegisterMetaType<kdn::dash::Snapshot>();
  qRegisterMetaType<kdn::dash::Source::State>();
  impl_->description = QStringLiteral("kdnd ") + Q(impl_->options.address);
}

NodeSource::~NodeSource() { impl_->Stop(); }

void NodeSource::start() { impl_->Start(); }

void NodeSource::stop() {
  impl_->Stop();
  if (impl_->state != State::kStopped) {
    impl_->state = State::kStopped;
    emit stateChanged(State::kStopped, QString());
  }
}

Source::State NodeSource::state() const { return impl_->state; }

QString NodeSource::describe() const { return impl_->description; }

}  // namespace kdn::dash
