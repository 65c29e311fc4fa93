// SPDX-License-Identifier: Apache-2.0
#include "runtime_source.h"

#include <kdn/kdn.h>

#include <QMetaObject>

#include <algorithm>
#include <chrono>
#include <optional>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/keys/hash.h"

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

// The documents of `model` in `ns` (kdn_knowledge_list: asked for the count
// first, then listed; a document put in between is left for the next read).
void ListDocuments(const kdn_model* model, const std::string& ns, std::int64_t now_ms,
                   std::vector<DocumentSample>* out) {
  size_t count = 0;
  if (kdn_knowledge_list(model, ns.data(), ns.size(), nullptr, 0, &count) != KDN_OK || count == 0) return;
  std::vector<kdn_document_info> infos(count, kdn_document_info(KDN_DOCUMENT_INFO_INIT));
  size_t listed = 0;
  if (kdn_knowledge_list(model, ns.data(), ns.size(), infos.data(), infos.size(), &listed) != KDN_OK) return;
  infos.resize(std::min(listed, infos.size()));
  for (const kdn_document_info& i : infos) {
    DocumentSample d;
    d.ns = QString::fromStdString(ns);
    d.doc_id = QString::fromUtf8(i.doc_id, static_cast<qsizetype>(std::min<size_t>(i.doc_id_len, sizeof i.doc_id - 1)));
    d.hits = i.hits;
    d.chunks = i.chunks;
    d.chunks_held = i.chunks_present;
    d.pinned = i.pinned != 0;
    d.pin_expires_ms = i.pinned != 0 && i.pin_expires_in_ms >= 0 ? now_ms + i.pin_expires_in_ms : 0;
    out->push_back(std::move(d));
  }
}

// How many bytes per second the tier can be read at, as the runtime
// measured its loads (1.7: delivery_ns_per_token, the time to read, decode
// and copy one token's KV into host views, a moving average; into device
// views when no host view was loaded): the model's KV bytes per token as the
// tier stores them (its codec's bytes after / before encoding), per that
// time. 0 until the tier served a load, or without the model.
double LimitBytesPerS(const kdn_tier_stats& t, std::uint64_t kv_bytes_per_token) {
  const double ns = t.delivery_ns_per_token > 0 ? t.delivery_ns_per_token : t.device_delivery_ns_per_token;
  if (!(ns > 0) || kv_bytes_per_token == 0) return 0;
  double stored = static_cast<double>(kv_bytes_per_token);
  if (t.bytes_before_encoding > 0 && t.bytes_after_encoding > 0) {
    stored *= static_cast<double>(t.bytes_after_encoding) / static_cast<double>(t.bytes_before_encoding);
  }
  return stored * 1e9 / ns;
}

// The namespace a quota's hash stands for: its name when it is one of
// `names` (RuntimeSourceOptions::namespaces), else "#" and the hash's first
// 8 hex digits (the C ABI reports namespaces by their hash only).
QString QuotaNamespace(const std::uint8_t (&hash)[32], const std::vector<std::string>& names) {
  for (const std::string& n : names) {
    const keys::Digest d = keys::NamespaceHash(n);
    if (std::equal(d.begin(), d.end(), std::begin(hash))) return QString::fromStdString(n);
  }
  return QLatin1Char('#') + QString::fromLatin1(QByteArray(reinterpret_cast<const char*>(hash), 4).toHex());
}

// The quotas of tier `index` (kdn_runtime_get_quota_stats, 1.13; a library
// before it has none to report: nothing added).
void ReadQuotas(kdn_runtime* runtime, std::uint32_t index, const QString& tier, const std::vector<std::string>& names,
                QVector<QuotaSample>* out) {
  size_t count = 0;
  if (kdn_runtime_get_quota_stats(runtime, index, nullptr, 0, &count) != KDN_OK || count == 0) return;
  std::vector<kdn_quota_stats> qs(count, kdn_quota_stats(KDN_QUOTA_STATS_INIT));
  if (kdn_runtime_get_quota_stats(runtime, index, qs.data(), qs.size(), &count) != KDN_OK) return;
  qs.resize(std::min(count, qs.size()));
  for (const kdn_quota_stats& q : qs) {
    QuotaSample x;
    x.tier = tier;
    x.ns = QuotaNamespace(q.ns_hash, names);
    x.tier_index = static_cast<int>(index);
    x.quota_bytes = q.quota_bytes;
    x.used_bytes = q.used_bytes;
    x.objects = q.objects;
    x.quota_evictions = q.quota_evictions;
    x.room_evictions = q.room_evictions;
    x.refused = q.refused;
    out->push_back(std::move(x));
  }
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
    std::optional<std::chrono::steady_clock::time_point> listed;
    std::uint64_t documents = 0;
    QVector<DocumentSample> documents_top;
    while (!stop_requested) {
      lock.unlock();
      const auto now = std::chrono::steady_clock::now();
      const bool list = !listed || now - *listed >= std::chrono::milliseconds(options.documents_interval_ms);
      Snapshot s = Read(runtime, options, list);
      if (list) {
        listed = now;
        documents = s.documents;
        documents_top = s.documents_top;
      } else {
        s.documents = documents;
        s.documents_top = documents_top;
      }
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

Snapshot RuntimeSource::Read(kdn_runtime* runtime, const RuntimeSourceOptions& options, bool list_documents) {
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
    // The hit rate's pair (1.4): an engine that looks up each request
    // before loading it (kdn_kv_lookup, then a load of what was found) asks
    // for its prompts' tokens in its lookups, and loads only the hits; one
    // that loads without looking up asks in its loads.
    if (st.lookup_tokens > 0) {
      s.requested_tokens = st.lookup_tokens;
      s.hit_tokens = st.lookup_hit_tokens;
    } else {
      s.requested_tokens = st.tokens_requested;
      s.hit_tokens = st.tokens_served;
    }
    s.served_tokens = st.tokens_served;
    s.corrupt_detected = st.corrupt_detected;
    s.pins_active = st.pins_active;
    // TTFT saved as the runtime measured it: each load's tokens x its
    // model's mean prefill time per token, as the engine reported its
    // prefills (kdn_model_report_prefill). Tokens served before any report
    // are priced at the configured fallback rate, when there is one.
    s.ttft_saved_ms = static_cast<double>(st.ttft_saved_ns) / 1e6;
    if (options.prefill_us_per_token > 0) {
      s.ttft_saved_ms += static_cast<double>(st.tokens_served_unpriced) * options.prefill_us_per_token / 1000.0;
    }
    s.ttft_basis = Snapshot::TtftBasis::kMeasured;
    if (st.prefill_tokens > 0) {
      s.prefill_us_per_token = static_cast<double>(st.prefill_ns) / static_cast<double>(st.prefill_tokens) / 1000.0;
    }
    s.delivery_ms = static_cast<double>(st.delivery_ns) / 1e6;
  }

  if (list_documents && options.model != nullptr && !options.namespaces.empty()) {
    std::vector<DocumentSample> docs;
    for (const std::string& ns : options.namespaces) ListDocuments(options.model, ns, s.time_ms, &docs);
    s.documents = docs.size();
    std::stable_sort(docs.begin(), docs.end(),
                     [](const DocumentSample& a, const DocumentSample& b) { return a.hits > b.hits; });
    if (docs.size() > options.documents_top) docs.resize(options.documents_top);
    s.documents_top = QVector<DocumentSample>(docs.begin(), docs.end());
  }

  // The KV bytes of one token of the model: a tier's delivery time per
  // token becomes the bytes per second it can be read at.
  std::uint64_t kv_bytes_per_token = 0;
  if (options.model != nullptr && kdn_model_get_kv_bytes_per_token(options.model, &kv_bytes_per_token) != KDN_OK) {
    kv_bytes_per_token = 0;
  }
  s.reports_decode_failures = true;
  std::uint32_t count = 0;
  if (kdn_runtime_get_tier_count(runtime, &count) == KDN_OK) {
    for (std::uint32_t i = 0; i < count; ++i) {
      kdn_tier_stats t = KDN_TIER_STATS_INIT;
      if (kdn_runtime_get_tier_stats(runtime, i, &t) != KDN_OK) continue;
      TierSample ts;
      ts.name = FixedString(t.name);
      ts.kind = KindName(t.kind);
      ts.codec = FixedString(t.codec);
      CopyTierCounters(t, ts);
      ts.high_watermark = t.high_watermark;  // 1.4; 0 for tiers without (not drawn)
      ts.low_watermark = t.low_watermark;
      ts.bytes_before_encoding = t.bytes_before_encoding;
      ts.bytes_after_encoding = t.bytes_after_encoding;
      ts.io_errors = t.io_errors;
      ts.decode_failures = t.decode_failures;
      ts.auth_failures = t.auth_failures;  // 1.8
      s.auth_failures += t.auth_failures;
      ts.limit_bytes_per_s = LimitBytesPerS(t, kv_bytes_per_token);
      ts.limit_from_loads = true;
      ReadQuotas(runtime, i, ts.name, options.namespaces, &s.quotas);
      s.tiers.push_back(std::move(ts));
    }
  }
  return s;
}

}  // namespace kdn::dash
