#include "runtime_source.h"

#include <kdn/kdn.h>

#include <QMetaObject>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace kdn::dash {

namespace {

QString KindName(kdn_tier_kind kind) {
  switch (kind) {
    case KDN_TIER_HOST: return QStringLiteral("host");
    case KDN_TIER_DEVICE: return QStringLiteral("device");
    case KDN_TIER_DISK: return QStringLiteral("disk");
    case KDN_TIER_REMOTE: return QStringLiteral("remote");
    case KDN_TIER_REDIS: return QStringLiteral("redis");
    default: return QStringLiteral("tier %1").arg(static_cast<int>(kind));
  }
}

// A fixed char array that the library NUL-terminates; bounded anyway.
template <size_t N>
QString FixedString(const char (&s)[N]) {
  size_t n = 0;
  while (n < N && s[n] != '\0') ++n;
  return QString::fromUtf8(s, static_cast<qsizetype>(n));
}

}  // namespace

struct RuntimeSource::Impl {
  Impl(RuntimeSource& owner, kdn_runtime* rt, RuntimeSourceOptions o) : q(owner), runtime(rt), options(o) {}

  // Owner thread.
  void Start() {
    if (thread.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_requested = false;
    }
    const std::uint64_t gen = ++generation;
    started = std::chrono::steady_clock::now();
    thread = std::thread([this, gen] { Poll(gen); });
  }

  void Stop() {
    ++generation;  // what is still queued for the owner is dropped
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_requested = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }

  // Worker thread: a reading every interval_ms until stopped.
  void Poll(std::uint64_t gen) {
    const auto interval = std::chrono::milliseconds(std::max<std::uint32_t>(options.interval_ms, 1));
    std::unique_lock<std::mutex> lock(mu);
    while (!stop_requested) {
      lock.unlock();
      Snapshot s = Read(runtime, options);
      s.uptime_ms = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started).count());
      RuntimeSource* self = &q;
      QMetaObject::invokeMethod(
          self,
          [self, gen, s = std::move(s)] {
            if (self->impl_->generation != gen) return;
            emit self->snapshot(s);
          },
          Qt::QueuedConnection);
      lock.lock();
      cv.wait_for(lock, interval, [this] { return stop_requested; });
    }
  }

  RuntimeSource& q;
  kdn_runtime* const runtime;
  const RuntimeSourceOptions options;

  // Owner thread.
  std::thread thread;
  std::uint64_t generation = 0;  // bumped by start and stop: a queued signal of another run is dropped
  State state = State::kStopped;
  std::chrono::steady_clock::time_point started;  // written before the worker starts

  std::mutex mu;
  std::condition_variable cv;
  bool stop_requested = false;  // guarded by mu
};

RuntimeSource::RuntimeSource(kdn_runtime* runtime, RuntimeSourceOptions options, QObject* parent)
    : Source(parent), impl_(std::make_unique<Impl>(*this, runtime, options)) {
  qRegisterMetaType<kdn::dash::Snapshot>();
  qRegisterMetaType<kdn::dash::Source::State>();
}

RuntimeSource::~RuntimeSource() { impl_->Stop(); }

void RuntimeSource::start() {
  if (impl_->thread.joinable()) return;
  if (impl_->runtime == nullptr) {
    impl_->state = State::kDisconnected;
    emit stateChanged(State::kDisconnected, QStringLiteral("no runtime to read"));
    return;
  }
  impl_->Start();
  impl_->state = State::kConnected;
  emit stateChanged(State::kConnected, QString());
}

void RuntimeSource::stop() {
  impl_->Stop();
  if (impl_->state != State::kStopped) {
    impl_->state = State::kStopped;
    emit stateChanged(State::kStopped, QString());
  }
}

Source::State RuntimeSource::state() const { return impl_->state; }

QString RuntimeSource::describe() const { return QStringLiteral("runtime (in process)"); }

Snapshot RuntimeSource::Read(kdn_runtime* runtime, const RuntimeSourceOptions& options) {
  Snapshot s;
  s.time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
  s.source = QStringLiteral("runtime (in process)");
  if (runtime == nullptr) return s;

  kdn_stats st = KDN_STATS_INIT;
  if (kdn_runtime_get_stats(runtime, &st) == KDN_OK) {
    s.lookups = st.lookups;
    s.loads = st.retrieves;
    s.failed_loads = st.misses;
    s.stores = st.stores;
    s.hit_tokens = st.tokens_served;
    s.served_tokens = st.tokens_served;
    // The C ABI does not count the tokens loads asked for. What an engine
    // needs is either served from the cache or computed and then stored, so
    // the tokens asked for are taken as tokens served + tokens newly
    // stored: the hit rate is then the share of tokens the cache saved
    // recomputing. (A load that misses and whose tokens are never stored is
    // not counted.)
    s.requested_tokens = st.tokens_served + st.tokens_stored;
    s.corrupt_detected = st.corrupt_detected;
    s.pins_active = st.pins_active;
    if (options.prefill_us_per_token > 0) {
      s.ttft_saved_ms = static_cast<double>(st.tokens_served) * options.prefill_us_per_token / 1000.0;
    }
  }

  kdn_latency load = KDN_LATENCY_INIT;
  if (kdn_runtime_get_latency(runtime, KDN_LATENCY_LOAD, &load) == KDN_OK) {
    s.delivery_ms = static_cast<double>(load.count) * load.mean_us / 1000.0;
  }

  std::uint32_t count = 0;
  if (kdn_runtime_get_tier_count(runtime, &count) == KDN_OK) {
    for (std::uint32_t i = 0; i < count; ++i) {
      kdn_tier_stats t = KDN_TIER_STATS_INIT;
      if (kdn_runtime_get_tier_stats(runtime, i, &t) != KDN_OK) continue;
      TierSample ts;
      ts.name = FixedString(t.name);
      ts.kind = KindName(t.kind);
      ts.codec = FixedString(t.codec);
      CopyTierCounters(t, ts);  // watermarks are not in the C ABI: 0 (not drawn)
      ts.bytes_before_encoding = t.bytes_before_encoding;
      ts.bytes_after_encoding = t.bytes_after_encoding;
      ts.io_errors = t.io_errors;
      s.tiers.push_back(std::move(ts));
    }
  }
  return s;
}

}  // namespace kdn::dash
