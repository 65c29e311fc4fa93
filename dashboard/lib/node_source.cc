// SPDX-License-Identifier: Apache-2.0
#include "node_source.h"

#include <kj/async-io.h>
#include <kj/debug.h>

#include <QMetaObject>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/keys/hash.h"
#include "core/wire/node.capnp.h"
#include "core/wire/node_client.h"
#include "core/wire/node_stats.h"

namespace kdn::dash {

namespace node = wire::node;

namespace {

std::int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

QString Q(const std::string& s) { return QString::fromStdString(s); }

// Where each of a node's tier statistics (core/wire/node_stats.h) goes in a sample.
using server::TierStat;
constexpr std::pair<TierStat, std::uint64_t TierSample::*> kSampleFields[] = {
    {TierStat::kObjects, &TierSample::objects},
    {TierStat::kUsedBytes, &TierSample::used_bytes},
    {TierStat::kCapacityBytes, &TierSample::capacity_bytes},
    {TierStat::kHits, &TierSample::hits},
    {TierStat::kMisses, &TierSample::misses},
    {TierStat::kPuts, &TierSample::puts},
    {TierStat::kEvictions, &TierSample::evictions},
    {TierStat::kDemotionsIn, &TierSample::demotions_in},
    {TierStat::kPromotionsIn, &TierSample::promotions_in},
    {TierStat::kCorruptDetected, &TierSample::corrupt_detected},
    {TierStat::kBytesIn, &TierSample::bytes_in},
    {TierStat::kBytesOut, &TierSample::bytes_out},
    {TierStat::kIoErrors, &TierSample::io_errors},
};

TierSample ToTier(const server::TierStatsSnapshot& t) {
  TierSample s;
  s.name = Q(t.name);
  s.kind = Q(t.kind);
  s.codec = Q(t.codec);
  for (const auto& [stat, field] : kSampleFields) s.*field = t[stat];
  s.high_watermark = t.high_watermark;
  s.low_watermark = t.low_watermark;
  // The read rate the node measured for the tier at start (0: not measured,
  // or a node from before protocol version 3).
  s.limit_bytes_per_s = t.limit_bytes_per_s;
  // Encoding sizes and decode or seal failures are not in the node's Stats:
  // left 0 (not reported; Snapshot::reports_decode_failures stays false).
  return s;
}

}  // namespace

struct NodeSource::Impl {
  // One connection to the node (loop thread only): logged in
  // (core/wire/node_client.h), then subscribed.
  struct Connection {
    kj::Own<wire::NodeConnection> link;
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
      KJ_DEFER(conn = nullptr; connector.reset());
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

  // The connector (TLS context included), made on first use; a reason
  // when it cannot be.
  std::optional<std::string> PrepareConnector() {
    if (connector) return std::nullopt;
    auto made = wire::NodeConnector::Create(
        wire::NodeEndpoint{options.address, options.token, options.tls_ca_file, options.tls_server_name});
    if (!made.ok()) return made.status().message();
    connector = std::move(made).value();
    return std::nullopt;
  }

  // Connects, logs in and subscribes; then serves until the connection is
  // lost. Resolves to why it ended.
  kj::Promise<std::string> Attempt(std::uint64_t gen) {
    if (auto why = PrepareConnector()) return *why;
    auto subscribed =
        connector->Connect(*network)
            // Resolves to why the node refused, or "" once subscribed.
            .then([this, gen](kj::Own<wire::NodeConnection>&& link) -> kj::Promise<std::string> {
              conn = kj::heap<Connection>();
              conn->link = kj::mv(link);
              auto req = conn->link->session().subscribeStatsRequest();
              req.setIntervalMs(options.interval_ms);
              req.setSink(kj::heap<Sink>(*this, gen));
              return req.send().then(
                  [this](capnp::Response<node::Session::SubscribeStatsResults>&& s) -> std::string {
                    if (s.getError().getCode() != node::ErrorCode::OK) {
                      return wire::RefusalStatus("subscribeStats", s.getError()).message();
                    }
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
              return Serve().catch_([timeout](kj::Exception&& e) { return wire::DescribeFailure(e, timeout); });
            },
            [timeout](kj::Exception&& e) -> kj::Promise<std::string> { return wire::DescribeFailure(e, timeout); });
  }

  // Connected: until the node goes away or goes silent.
  kj::Promise<std::string> Serve() {
    auto closed = conn->link->onDisconnect().then([]() { return std::string("kdnd closed the connection"); });
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
    node::Session::Client session = conn->link->session();
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
      s.corrupt_detected += t[server::TierStat::kCorruptDetected];
    }
    using server::NodeStat;
    // The hit rate engines see: per engine request, as the runtimes
    // reported them (protocol 4); the per-probe counts only while no runtime
    // has (every probe of a request counts as requested tokens: a partial hit
    // looks like a fraction of itself).
    if (n[NodeStat::kEngineLookupTokens] != 0) {
      s.lookups = n[NodeStat::kEngineLookups];
      s.requested_tokens = n[NodeStat::kEngineLookupTokens];
      s.hit_tokens = n[NodeStat::kEngineLookupHitTokens];
    } else {
      s.lookups = n[NodeStat::kLookups];
      s.requested_tokens = n[NodeStat::kRequestedTokens];
      s.hit_tokens = n[NodeStat::kLookupHitTokens];
    }
    s.served_tokens = n[NodeStat::kHitTokens];  // the node's hit tokens: served by get
    s.loads = n[NodeStat::kGetChunks];
    s.failed_loads = n[NodeStat::kGetMisses];
    s.stores = n[NodeStat::kPutChunks];
    s.documents = n[NodeStat::kDocuments];
    s.auth_failures = n[NodeStat::kAuthFailures];
    // kdnd prices every token it served at server.prefill_us_per_token
    // (ttftSavedMs = hitTokens x that / 1000): the price is read back from
    // the pair, so the view can say what TTFT saved is made of.
    s.ttft_saved_ms = n.ttft_saved_ms;
    s.ttft_basis = Snapshot::TtftBasis::kPriced;
    if (s.served_tokens > 0) s.prefill_us_per_token = n.ttft_saved_ms * 1000.0 / static_cast<double>(s.served_tokens);
    s.delivery_ms = n.get_us.summary.sum / 1000.0;
    s.documents_top = documents;
    for (const server::QuotaRow& r : n.quotas) {  // protocol 5: the quotas of the node's config; none before
      QuotaSample qs;
      qs.tier = Q(r.tier);
      qs.ns = Q(r.ns);
      qs.tier_index = static_cast<int>(r.index);
      qs.quota_bytes = r.quota_bytes;
      qs.used_bytes = r.used_bytes;
      qs.objects = r.objects;
      qs.quota_evictions = r.quota_evictions;
      qs.room_evictions = r.room_evictions;
      qs.refused = r.refused;
      s.quotas.push_back(std::move(qs));
    }
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
  std::unique_ptr<wire::NodeConnector> connector;
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
