// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/remote_tier.h"

#include <kj/async-io.h>
#include <kj/debug.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

#include "core/wire/envelope.h"
#include "core/wire/node.capnp.h"
#include "core/wire/node_client.h"

namespace kdn::store {

namespace node = wire::node;

namespace {

#if defined(__SANITIZE_THREAD__)
void TsanRelease(void* p) { __tsan_release(p); }
void TsanAcquire(void* p) { __tsan_acquire(p); }
#else
void TsanRelease(void*) {}
void TsanAcquire(void*) {}
#endif

std::int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

capnp::Data::Reader AsData(const keys::Digest& d) { return capnp::Data::Reader(d.data(), d.size()); }

// A call that came back with an Error other than ok (wire::IsRefusal knows it).
kj::Exception CallError(node::Error::Reader e) { return wire::RefusalException("the call", e); }

}  // namespace

// ---- The event loop and its connection ------------------------------------------------

struct RemoteTier::Impl final : public kj::TaskSet::ErrorHandler {
  // A logged-in connection (core/wire/node_client.h) and whether it broke.
  struct Connection {
    kj::Own<wire::NodeConnection> link;
    bool broken = false;
  };

  explicit Impl(const RemoteTierOptions& o) : options(o) {}

  // Starts the loop thread; false (with `error`) when it cannot.
  bool Start(std::string& error) {
    std::promise<std::string> started;
    auto ready = started.get_future();
    thread = std::thread([this, &started] {
      try {
        auto io = kj::setupAsyncIo();
        auto stop = kj::newPromiseAndCrossThreadFulfiller<void>();
        timer = &io.provider->getTimer();
        network = &io.provider->getNetwork();
        reads = kj::heap<kj::TaskSet>(*this);
        stopper = kj::mv(stop.fulfiller);
        executor = kj::getCurrentThreadExecutor().addRef();
        started.set_value("");
        stop.promise.wait(io.waitScope);
        // Torn down here, on the loop's own thread.
        reads = nullptr;
        connecting = nullptr;
        connection = nullptr;
        disconnect_watch = nullptr;
        connector.reset();
      } catch (const std::exception& e) {
        try {
          started.set_value(e.what());
        } catch (...) {
        }
      }
    });
    error = ready.get();
    return error.empty();
  }

  void Stop() {
    if (stopper) stopper->fulfill();
    if (thread.joinable()) thread.join();
  }

  // On the loop thread: the session, connecting (and logging in) if needed.
  kj::Promise<node::Session::Client> Session() {
    KJ_IF_MAYBE(c, connection) {
      if (!(*c)->broken) return (*c)->link->session();
    }
    KJ_IF_MAYBE(f, connecting) { return f->addBranch(); }
    ++connects;
    auto attempt = connector->Connect(*network)
                       .then(
                           [this](kj::Own<wire::NodeConnection>&& link) -> node::Session::Client {
                             auto conn = kj::heap<Connection>();
                             conn->link = kj::mv(link);
                             node::Session::Client session = conn->link->session();
                             Connection* raw = conn.get();
                             // A dropped connection marks itself broken; the next call reconnects.
                             disconnect_watch = conn->link->onDisconnect()
                                                    .then([raw]() { raw->broken = true; })
                                                    .eagerlyEvaluate([raw](kj::Exception&&) { raw->broken = true; });
                             connection = kj::mv(conn);
                             connecting = nullptr;
                             return session;
                           },
                           [this](kj::Exception&& e) -> node::Session::Client {
                             ++connect_failures;
                             MarkDown();
                             connecting = nullptr;
                             kj::throwFatalException(kj::mv(e));
                           });
    auto forked = attempt.fork();
    auto branch = forked.addBranch();
    connecting = kj::mv(forked);
    return branch;
  }

  // On the loop thread: the message buffers of the connection calls go out
  // on now (null: none yet).
  wire::StreamBuffers* Buffers() {
    KJ_IF_MAYBE(c, connection) { return &(*c)->link->buffers(); }
    return nullptr;
  }
  // On the loop thread: `data` (an envelope of a reply), checked against
  // `key` and kept where it arrived when the connection read it into a
  // buffer of its own (no copy), else copied out.
  // With a secret, the node's seal of it is checked first (*unsealed: it
  // was not the secret's).
  Result<ChunkRef> Decode(node::GetResult::Reader result, const keys::Digest& key, bool* unsealed) {
    capnp::Data::Reader data = result.getEnvelope();
    *unsealed = false;
    if (options.sealer) {
      capnp::Data::Reader seal = result.getSeal();
      Status st = options.sealer->Check(data.begin(), data.size(), seal.begin(), seal.size());
      if (!st.ok()) {
        *unsealed = true;
        return st;
      }
    }
    wire::StreamBuffers* b = Buffers();
    return wire::DecodeEnvelope(data.begin(), data.size(), &key, b ? b->OwnerOf(data.begin(), data.size()) : nullptr);
  }

  // ---- The circuit breaker (loop thread) ----
  // A node that did not answer a call by its deadline, or could not be
  // connected to, is marked down: calls skip it (a miss at once) for
  // retry_ms, then one call goes through as a probe while the others still
  // skip. A probe that is answered (even with a refusal: the node is there)
  // closes the breaker; one that is not marks the node down again, each
  // time for twice as long, up to kMaxDownMs or retry_ms if larger.
  static constexpr std::int64_t kMaxDownMs = 30000;
  void MarkDown() {
    if (NowMs() < down_until_ms) return;  // already down (a call and the reads it started)
    const std::int64_t retry = std::max<std::int64_t>(options.retry_ms, 1);
    const std::int64_t cap = std::max<std::int64_t>(retry, kMaxDownMs);
    const std::int64_t down = std::min<std::int64_t>(retry << std::min<std::uint32_t>(misses_in_row, 5), cap);
    ++misses_in_row;
    down_until_ms = NowMs() + down;
    ++marked_down;
  }
  // Whether a call may go out now; sets `probe` when it is the one that
  // tries a node marked down.
  bool Admit(bool& probe) {
    probe = false;
    if (misses_in_row == 0) return true;
    if (probing || NowMs() < down_until_ms) return false;
    probing = probe = true;
    return true;
  }

  // Runs `call` (given the session; returns a promise) on the loop thread
  // until `deadline_ms` (NowMs's clock); rethrows its failure on the
  // caller's thread. A call past its deadline, or to a node marked down,
  // fails at once (counted). executeSync orders the two threads through
  // kj's own futex mutex, which ThreadSanitizer cannot see: the handoffs
  // are annotated for it.
  template <typename Call>
  void Run(std::int64_t deadline_ms, Call&& call) {
    ++calls;
    const std::int64_t left = std::min<std::int64_t>(deadline_ms - NowMs(), options.timeout_ms);
    if (left <= 0) {
      ++past_deadline;
      kj::throwFatalException(KJ_EXCEPTION(OVERLOADED, "kdnd: the call's deadline has passed", options.address));
    }
    // Only a round trip given (about) the whole timeout that still gets no
    // answer says the node is not answering; one cut short by its call's
    // deadline says little about the node. "About": the call's clock starts
    // before its first round trip goes out, and on a loaded machine the
    // milliseconds between them are not the node's; half the timeout or
    // more counts as whole.
    const bool whole = 2 * left >= static_cast<std::int64_t>(options.timeout_ms);
    TsanRelease(this);
    KJ_DEFER(TsanAcquire(this));  // also when executeSync rethrows the call's failure
    executor->executeSync([this, &call, left, whole]() -> kj::Promise<void> {
      TsanAcquire(this);
      bool probe = false;
      if (!Admit(probe)) {
        ++down_skips;
        // Made before the release: the caller's thread rethrows and frees it.
        kj::Exception skipped = KJ_EXCEPTION(
            DISCONNECTED, "kdnd marked down (no answer in time); skipped until a probe is answered", options.address);
        TsanRelease(this);
        return kj::mv(skipped);
      }
      auto expired = kj::heap<bool>(false);
      bool* expired_flag = expired.get();
      auto work = Session().then([&call](node::Session::Client&& s) { return call(s); });
      auto deadline = timer->afterDelay(left * kj::MILLISECONDS).then([expired_flag]() -> kj::Promise<void> {
        *expired_flag = true;
        return KJ_EXCEPTION(OVERLOADED, "kdnd: no answer by the call's deadline");
      });
      return work.exclusiveJoin(kj::mv(deadline))
          .then(
              [this, probe]() -> kj::Promise<void> {
                if (probe) probing = false;
                misses_in_row = 0;
                TsanRelease(this);
                return kj::READY_NOW;
              },
              [this, probe, whole, expired = kj::mv(expired)](kj::Exception&& e) -> kj::Promise<void> {
                if (probe) probing = false;
                // A call that failed or timed out may have left the
                // connection in an unknown state: start afresh next time.
                KJ_IF_MAYBE(c, connection) { (*c)->broken = true; }
                if (*expired) {
                  ++timeouts;
                  // A connection (or its login) that never completed is
                  // abandoned too: the next probe connects afresh.
                  connecting = nullptr;
                  if (whole || probe) MarkDown();
                } else if (wire::IsRefusal(e) || e.getType() == kj::Exception::Type::UNIMPLEMENTED) {
                  misses_in_row = 0;  // the node answered
                }
                TsanRelease(this);
                return kj::mv(e);
              });
    });
  }
  // The deadline (NowMs's clock) of a round trip of the call `ctx` is of:
  // the call's start plus timeout_ms, or from now when it carries no start.
  std::int64_t DeadlineOf(const ReadContext& ctx) const {
    return (ctx.started_ms != 0 ? ctx.started_ms : NowMs()) + options.timeout_ms;
  }

  // ---- Read-ahead (Prefetch with will_read) ----
  struct Arrival {
    std::int64_t deadline_ms = 0;  // the read's own deadline; a Get waits no longer
    bool done = false;             // answered, failed, timed out or cancelled
    bool failed = false, corrupt = false, unsealed = false;
    bool overflow = false;         // arrived while read_ahead_bytes were held: not kept
    bool counted = false;          // its bytes are in arrival_bytes
    ChunkRef chunk;                // the chunk, when held
    std::uint64_t bytes = 0;
  };
  // On the loop thread: a get's reply.
  void Fill(Arrival& a, const keys::Digest& key, node::Session::GetResults::Reader r) {
    ChunkRef chunk;
    bool corrupt = false, failed = false, unsealed = false;
    std::uint64_t bytes = 0;
    if (r.getError().getCode() != node::ErrorCode::OK) {
      failed = true;
    } else if (r.getChunks().size() == 1 && r.getChunks()[0].isEnvelope()) {
      auto data = r.getChunks()[0].getEnvelope();
      bytes = data.size();
      bool keep = true;
      {
        std::lock_guard<std::mutex> lock(arrivals_mu);
        auto it = arrivals.find(key);
        // Still waiting for its Get in the map: bounded by read_ahead_bytes.
        keep = it == arrivals.end() || it->second.get() != &a || arrival_bytes + bytes <= options.read_ahead_bytes;
      }
      if (keep) {
        // Checked here; kept in the buffer it arrived in, or copied out.
        Result<ChunkRef> c = Decode(r.getChunks()[0], key, &unsealed);
        if (c.ok()) {
          chunk = std::move(c).value();
        } else {
          corrupt = true;
        }
      } else {
        std::lock_guard<std::mutex> lock(arrivals_mu);
        a.overflow = true;
        ++reads_ahead_overflow;
      }
    }
    {
      std::lock_guard<std::mutex> lock(arrivals_mu);
      if (!a.done) {
        a.done = true;
        a.chunk = std::move(chunk);
        a.corrupt = corrupt;
        a.unsealed = unsealed;
        a.failed = failed;
        auto it = arrivals.find(key);
        if (a.chunk && it != arrivals.end() && it->second.get() == &a) {
          a.bytes = bytes;
          a.counted = true;
          arrival_bytes += bytes;
        }
      }
    }
    arrivals_cv.notify_all();
  }
  // On the loop thread: the read ended without a reply (failed: an error or
  // its deadline; otherwise cancelled, past the node's prefix).
  void Finish(Arrival& a, bool failed) {
    {
      std::lock_guard<std::mutex> lock(arrivals_mu);
      if (!a.done) {
        a.done = true;
        a.failed = failed;
      }
    }
    arrivals_cv.notify_all();
  }
  // arrivals_mu held: takes the key's arrival out of the map (null: none).
  std::shared_ptr<Arrival> TakeLocked(const keys::Digest& key) {
    auto it = arrivals.find(key);
    if (it == arrivals.end()) return nullptr;
    std::shared_ptr<Arrival> a = std::move(it->second);
    arrivals.erase(it);
    if (a->counted) {
      arrival_bytes -= a->bytes;
      a->counted = false;
    }
    return a;
  }
  // arrivals_mu held: drops arrivals no Get took long after their deadline
  // (the walk that asked for them stopped earlier).
  void SweepLocked(std::int64_t now) {
    const std::int64_t grace = std::max<std::int64_t>(options.timeout_ms, 10000);
    for (auto it = arrivals.begin(); it != arrivals.end();) {
      if (now > it->second->deadline_ms + grace) {
        if (it->second->counted) arrival_bytes -= it->second->bytes;
        it->second->counted = false;
        ++reads_ahead_dropped;
        it = arrivals.erase(it);
      } else {
        ++it;
      }
    }
  }
  void taskFailed(kj::Exception&&) override {}  // every read handles its own failure

  std::mutex arrivals_mu;
  std::condition_variable arrivals_cv;
  std::unordered_map<keys::Digest, std::shared_ptr<Arrival>, keys::DigestHash> arrivals;
  std::uint64_t arrival_bytes = 0;  // held by arrivals in the map
  std::atomic<std::uint64_t> reads_ahead{0}, reads_ahead_used{0}, reads_ahead_dropped{0}, reads_ahead_overflow{0};
  kj::Maybe<kj::Own<kj::TaskSet>> reads;  // loop thread: the reads in flight

  const RemoteTierOptions& options;
  std::unique_ptr<wire::NodeConnector> connector;  // made at Create; used on the loop thread
  std::thread thread;
  kj::Own<const kj::Executor> executor;
  kj::Own<kj::CrossThreadPromiseFulfiller<void>> stopper;
  // Loop thread only:
  kj::Timer* timer = nullptr;
  kj::Network* network = nullptr;
  kj::Maybe<kj::Own<Connection>> connection;
  kj::Maybe<kj::ForkedPromise<node::Session::Client>> connecting;
  kj::Maybe<kj::Promise<void>> disconnect_watch;
  // The breaker's state.
  std::int64_t down_until_ms = 0;
  std::uint32_t misses_in_row = 0;  // unanswered probes and calls since the last answer
  bool probing = false;
  // Counters (any thread).
  std::atomic<std::uint64_t> calls{0}, timeouts{0}, connects{0}, connect_failures{0}, failed_calls{0};
  std::atomic<std::uint64_t> marked_down{0}, down_skips{0}, past_deadline{0};
  // Presence learned from batched lookups (Prefetch), briefly.
  struct Presence {
    bool present;
    std::int64_t until_ms;
  };
  std::mutex hints_mu;
  std::unordered_map<keys::Digest, Presence, keys::DigestHash> hints;
  // A key just read is held: the chain probes it again right after a get
  // (for its policy), and that probe needs no call.
  void Hint(const keys::Digest& key, bool present) {
    std::lock_guard<std::mutex> lock(hints_mu);
    if (hints.size() > 65536) hints.clear();
    hints[key] = {present, NowMs() + 1000};
  }
};

// ---- The tier ----------------------------------------------------------------------------

RemoteTier::RemoteTier(const RemoteTierOptions& options) : options_(options) {}

Result<std::unique_ptr<RemoteTier>> RemoteTier::Create(const RemoteTierOptions& options) {
  if (options.address.empty()) return Status::InvalidArgument("remote tier: no address");
  if (options.token.empty()) return Status::InvalidArgument("remote tier: no token");
  if (options.timeout_ms == 0) return Status::InvalidArgument("remote tier: timeout_ms must be positive");
  std::unique_ptr<RemoteTier> t(new RemoteTier(options));
  t->impl_ = std::make_unique<Impl>(t->options_);
  auto connector = wire::NodeConnector::Create(
      wire::NodeEndpoint{options.address, options.token, options.tls_ca_file, options.tls_server_name});
  if (!connector.ok()) return Status(connector.status().code(), "remote tier: " + connector.status().message());
  t->impl_->connector = std::move(connector).value();
  std::string error;
  if (!t->impl_->Start(error)) return Status(Code::kUnavailable, "remote tier: cannot start its event loop: " + error);
  for (std::uint32_t i = 0; i < std::max<std::uint32_t>(options.senders, 1); ++i) {
    t->senders_.emplace_back([p = t.get()] { p->SenderLoop(); });
  }
  return t;
}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    stopping_ = true;
  }
  qcv_.notify_all();
  for (std::thread& t : senders_) t.join();
  if (impl_) impl_->Stop();
}

std::uint64_t RemoteTier::Cost(const Chunk& chunk) const {
  return wire::EncodedEnvelopeSize(wire::AtRestPayloadBytes(chunk, options_.cipher.get()));
}

Result<ChunkRef> RemoteTier::Opened(ChunkRef chunk) const {
  Result<ChunkRef> open = wire::FromRest(chunk, options_.cipher.get(), false);
  if (open.ok()) return open;
  ++corrupt_;
  ++auth_failures_;
  return Status::NotFound(options_.name + ": not held (" + open.status().message() + ")");
}

Status RemoteTier::Put(const ChunkRef& chunk) {
  if (!chunk) return Status::InvalidArgument("remote tier: null chunk");
  const std::uint64_t cost = Cost(*chunk);
  {
    std::lock_guard<std::mutex> lock(qmu_);
    if (pending_.count(chunk->meta.key)) return Status::Ok();
    if (queued_bytes_ + cost > options_.write_queue_bytes && queued_bytes_ != 0) {
      ++queue_full_;
      return Status(Code::kBusy, options_.name + ": write-back queue full");
    }
    pending_.emplace(chunk->meta.key, chunk);
    queue_.push_back(Entry{chunk, nullptr});
    queued_bytes_ += cost;
  }
  qcv_.notify_one();
  return Status::Ok();
}

void RemoteTier::ReportCounts::Add(const ReportCounts& o) {
  lookups += o.lookups;
  lookup_tokens += o.lookup_tokens;
  lookup_hit_tokens += o.lookup_hit_tokens;
  loads += o.loads;
  load_tokens += o.load_tokens;
  load_hit_tokens += o.load_hit_tokens;
}

void RemoteTier::Report(const RequestOutcome& outcome, const ReadContext& ctx) {
  if (!ctx.ns || outcome.tokens == 0 || reports_unsupported_) return;
  ReportCounts c;
  if (outcome.load) {
    c.loads = 1;
    c.load_tokens = outcome.tokens;
    c.load_hit_tokens = std::min(outcome.hit_tokens, outcome.tokens);
  } else {
    c.lookups = 1;
    c.lookup_tokens = outcome.tokens;
    c.lookup_hit_tokens = std::min(outcome.hit_tokens, outcome.tokens);
  }
  {
    std::lock_guard<std::mutex> lock(qmu_);
    if (reports_.empty()) reports_due_ms_ = NowMs() + options_.report_ms;
    reports_[ReportKey{*ctx.ns, outcome.model}].Add(c);
  }
  qcv_.notify_one();
}

bool RemoteTier::SendReports(const Reports& reports, Reports& left) {
  for (auto it = reports.begin(); it != reports.end(); ++it) {
    const ReportCounts& c = it->second;
    try {
      impl_->Run(NowMs() + options_.timeout_ms, [&](node::Session::Client& s) {
        auto req = s.reportRequest();
        req.setNamespace(AsData(it->first.ns));
        auto r = req.initReport();
        if (it->first.model != keys::Digest{}) r.setModel(AsData(it->first.model));
        r.setLookups(c.lookups);
        r.setLookupTokens(c.lookup_tokens);
        r.setLookupHitTokens(c.lookup_hit_tokens);
        r.setLoads(c.loads);
        r.setLoadTokens(c.load_tokens);
        r.setLoadHitTokens(c.load_hit_tokens);
        return req.send().then([](capnp::Response<node::Session::ReportResults>&& r) {
          if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(r.getError()));
        });
      });
      ++reports_sent_;
    } catch (const kj::Exception& e) {
      ++impl_->failed_calls;
      if (e.getType() == kj::Exception::Type::UNIMPLEMENTED) {
        reports_unsupported_ = true;  // a node of protocol < 4: no more reports
        ++reports_not_sent_;
        continue;
      }
      if (wire::IsRefusal(e)) {
        ++reports_refused_;
        continue;
      }
      ++io_errors_;
      for (; it != reports.end(); ++it) left[it->first].Add(it->second);
      return false;
    }
  }
  return true;
}

void RemoteTier::SenderLoop() {
  for (;;) {
    std::vector<ChunkRef> batch;
    std::shared_ptr<const DocumentCall> document;
    Reports reports;
    {
      std::unique_lock<std::mutex> lock(qmu_);
      // A document goes once the chunks queued before it were answered (no
      // other sender has a batch out). Reports go when due (report_ms after
      // the first of them), on a Flush, and before the tier stops.
      for (;;) {
        const bool chunk_ready = !queue_.empty() && (queue_.front().chunk || in_flight_ == 0);
        const bool reports_ready =
            !reports_.empty() && (stopping_ || reports_now_ || NowMs() >= reports_due_ms_);
        if (reports_ready) {
          reports.swap(reports_);
          reports_now_ = false;
          ++reports_in_flight_;
          break;
        }
        if (chunk_ready || stopping_) break;
        if (!reports_.empty()) {
          qcv_.wait_for(lock, std::chrono::milliseconds(std::max<std::int64_t>(1, reports_due_ms_ - NowMs())));
        } else {
          qcv_.wait(lock);
        }
      }
      if (reports.empty() && queue_.empty()) return;  // stopping, nothing left
      if (!reports.empty()) {
        // Sent below, outside the lock.
      } else if (queue_.front().document) {
        document = std::move(queue_.front().document);
        queue_.pop_front();
        --queued_documents_;
        in_flight_ += 1;
      } else {
        std::uint64_t bytes = 0;
        // One namespace per call: the batch is the queue's head and the
        // chunks that follow it in the same namespace, up to batch_bytes.
        const keys::Digest ns = queue_.front().chunk->meta.ns_hash;
        while (!queue_.empty() && queue_.front().chunk && queue_.front().chunk->meta.ns_hash == ns &&
               (batch.empty() || bytes + Cost(*queue_.front().chunk) <= options_.batch_bytes)) {
          bytes += Cost(*queue_.front().chunk);
          batch.push_back(std::move(queue_.front().chunk));
          queue_.pop_front();
        }
        in_flight_ += batch.size();
      }
    }
    if (!reports.empty()) {
      Reports left;
      const bool answered = SendReports(reports, left);
      std::unique_lock<std::mutex> lock(qmu_);
      --reports_in_flight_;
      if (!answered) {
        ++send_failures_;
        if (stopping_) {
          reports_not_sent_ += left.size();  // the node is gone: dropped
        } else {
          for (auto& [key, c] : left) {
            if (reports_.empty()) reports_due_ms_ = NowMs() + std::max(options_.report_ms, options_.retry_ms);
            reports_[key].Add(c);
          }
        }
      }
      lock.unlock();
      drained_.notify_all();
      continue;
    }
    if (document) {
      const bool answered = SendDocument(*document);
      std::unique_lock<std::mutex> lock(qmu_);
      ++send_attempts_;
      in_flight_ -= 1;
      if (!answered && !stopping_) {
        ++send_failures_;
        queue_.push_front(Entry{nullptr, std::move(document)});
        ++queued_documents_;
        lock.unlock();
        drained_.notify_all();
        lock.lock();
        qcv_.wait_for(lock, std::chrono::milliseconds(options_.retry_ms), [&] { return stopping_; });
        continue;
      }
      lock.unlock();
      drained_.notify_all();
      qcv_.notify_all();  // an announcement waiting for this one
      continue;
    }
    // Each envelope framed here, on this sender's thread (while the other
    // senders' batches are on the wire), in memory of its own (chunk::
    // Payload's: huge pages for large chunks). The request takes each as a
    // segment of its own where the connection can hold it until written
    // (no copy), else copies it in. A chunk that cannot be framed is
    // refused here (counted), not sent.
    std::vector<std::shared_ptr<chunk::Payload>> framed(batch.size());
    std::vector<bool> stored(batch.size(), false);
    for (size_t i = 0; i < batch.size(); ++i) {
      // Encrypted here with master keys: the node never sees the KV.
      Result<ChunkRef> at_rest = wire::ToRest(batch[i], options_.cipher.get());
      if (!at_rest.ok()) continue;
      const std::uint64_t size = Cost(**at_rest);
      auto f = std::make_shared<chunk::Payload>(chunk::Payload::Uninitialized(size));
      if (wire::EncodeEnvelopeOver(**at_rest, f->data(), size).ok()) framed[i] = std::move(f);
    }
    std::vector<unsigned> sending;  // indices into batch of the framed chunks
    for (unsigned i = 0; i < batch.size(); ++i) {
      if (framed[i]) sending.push_back(i);
    }
    bool unreachable = false;  // the node did not answer (down, timed out): worth another try
    if (!sending.empty()) try {
      impl_->Run(NowMs() + options_.timeout_ms, [&](node::Session::Client& s) {
        wire::StreamBuffers* buffers = impl_->Buffers();
        std::uint64_t words = 64;
        for (unsigned i : sending) words += (buffers ? 0 : framed[i]->size() / 8) + 4;
        auto req = s.putRequest(capnp::MessageSize{words, 0});
        req.setNamespace(AsData(batch.front()->meta.ns_hash));
        auto list = req.initEnvelopes(static_cast<unsigned>(sending.size()));
        auto orphanage = capnp::Orphanage::getForMessageContaining(static_cast<node::Session::PutParams::Builder&>(req));
        for (unsigned j = 0; j < sending.size(); ++j) {
          const std::shared_ptr<chunk::Payload>& f = framed[sending[j]];
          if (buffers) {
            list.adopt(j, orphanage.referenceExternalData(capnp::Data::Reader(f->data(), f->size())));
            buffers->Hold(f->data(), f, f->size());
          } else {
            auto data = list.init(j, static_cast<unsigned>(f->size()));
            std::memcpy(data.begin(), f->data(), f->size());
          }
        }
        return req.send().then([&](capnp::Response<node::Session::PutResults>&& r) {
          if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(r.getError()));
          auto results = r.getResults();
          for (unsigned j = 0; j < results.size() && j < sending.size(); ++j) {
            stored[sending[j]] = results[j].getCode() == node::ErrorCode::OK;
          }
        });
      });
    } catch (const kj::Exception& e) {
      ++impl_->failed_calls;
      ++io_errors_;
      // Anything but the node's own typed refusal (CallError) means it did
      // not answer: not there, not reachable, too slow.
      unreachable = !wire::IsRefusal(e) && e.getType() != kj::Exception::Type::UNIMPLEMENTED;
    }
    {
      std::unique_lock<std::mutex> lock(qmu_);
      ++send_attempts_;
      if (unreachable && !stopping_) {
        // Back to the head of the queue, still served to readers from it;
        // sent again once the node answers (after retry_ms). A refusal
        // (typed error) is not retried.
        ++send_failures_;
        in_flight_ -= batch.size();
        for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(Entry{std::move(*it), nullptr});
        lock.unlock();
        drained_.notify_all();
        lock.lock();
        qcv_.wait_for(lock, std::chrono::milliseconds(options_.retry_ms), [&] { return stopping_; });
        continue;
      }
    }
    std::uint64_t sent = 0, refused = 0;
    for (bool ok : stored) (ok ? sent : refused) += 1;
    puts_sent_ += sent;
    puts_refused_ += refused;
    {
      std::lock_guard<std::mutex> lock(qmu_);
      for (const ChunkRef& c : batch) {
        pending_.erase(c->meta.key);
        queued_bytes_ -= Cost(*c);
      }
      in_flight_ -= batch.size();
    }
    drained_.notify_all();
    qcv_.notify_all();  // a document waiting for the batches before it
  }
}

void RemoteTier::Document(DocumentOp op, const DocumentRecord& doc, std::uint64_t ttl_ms) {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    if (queued_documents_ >= options_.document_queue) {
      ++documents_dropped_;
      return;
    }
    queue_.push_back(Entry{nullptr, std::make_shared<const DocumentCall>(DocumentCall{op, doc, ttl_ms})});
    ++queued_documents_;
  }
  qcv_.notify_one();
}

bool RemoteTier::SendDocument(const DocumentCall& call) {
  const DocumentRecord& d = call.doc;
  try {
    impl_->Run(NowMs() + options_.timeout_ms, [&](node::Session::Client& s) -> kj::Promise<void> {
      auto check = [](node::Error::Reader e) {
        if (e.getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(e));
      };
      switch (call.op) {
        case DocumentOp::kPut: {
          auto req = s.knowledgePutRequest();
          req.setNamespace(AsData(d.ns_hash));
          auto item = req.initItem();
          item.setDocId(d.doc_id);
          item.setVersion(d.version);
          item.setMetadata(d.metadata);
          item.setTokens(d.tokens);
          item.setModel(AsData(d.model));
          auto keys = item.initKeys(static_cast<unsigned>(d.keys.size()));
          for (unsigned i = 0; i < d.keys.size(); ++i) keys.set(i, AsData(d.keys[i]));
          return req.send().then([check](auto&& r) { check(r.getError()); });
        }
        case DocumentOp::kPin:
        case DocumentOp::kUnpin: {
          auto req = s.knowledgePinRequest();
          req.setNamespace(AsData(d.ns_hash));
          req.setDocId(d.doc_id);
          req.setModel(AsData(d.model));
          req.setPin(call.op == DocumentOp::kPin);
          req.setTtlMs(call.ttl_ms);
          return req.send().then([check](auto&& r) { check(r.getError()); });
        }
        case DocumentOp::kDelete: {
          auto req = s.knowledgeDeleteRequest();
          req.setNamespace(AsData(d.ns_hash));
          req.setDocId(d.doc_id);
          req.setModel(AsData(d.model));
          return req.send().then([check](auto&& r) { check(r.getError()); });
        }
      }
      return kj::READY_NOW;
    });
  } catch (const kj::Exception& e) {
    ++impl_->failed_calls;
    if (wire::IsRefusal(e) || e.getType() == kj::Exception::Type::UNIMPLEMENTED) {
      ++documents_refused_;
      return true;
    }
    ++io_errors_;
    return false;
  }
  ++documents_sent_;
  return true;
}

void RemoteTier::Flush() {
  // Until the queue is sent, or a send fails after this call began (the
  // node is unreachable now: what is queued waits for it, and a flush does
  // not).
  std::unique_lock<std::mutex> lock(qmu_);
  const std::uint64_t failures = send_failures_;
  if (!reports_.empty()) {
    reports_now_ = true;
    qcv_.notify_all();
  }
  drained_.wait(lock, [&] {
    return (queue_.empty() && in_flight_ == 0 && reports_.empty() && reports_in_flight_ == 0) || stopping_ ||
           send_failures_ != failures;
  });
}

Result<ChunkRef> RemoteTier::Get(const keys::Digest& key, const ReadContext& ctx) {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    auto it = pending_.find(key);
    if (it != pending_.end()) return it->second;
  }
  std::shared_ptr<Impl::Arrival> ahead;
  {
    std::lock_guard<std::mutex> lock(impl_->arrivals_mu);
    ahead = impl_->TakeLocked(key);
  }
  if (ahead) {
    std::unique_lock<std::mutex> lock(impl_->arrivals_mu);
    // The read has its own deadline and ends by it; the wait is bounded
    // again in case the loop cannot run it.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(std::max<std::int64_t>(ahead->deadline_ms - NowMs(), 0) + 2 * options_.timeout_ms);
    impl_->arrivals_cv.wait_until(lock, until, [&] { return ahead->done; });
    if (!ahead->done) {
      ++io_errors_;
      return Status(Code::kUnavailable, options_.name + ": node unavailable");
    }
    // A read that failed (no answer, the connection lost) says nothing of
    // the key: asked for again below, within the call's deadline and the
    // breaker's say.
    if (!ahead->overflow && !ahead->failed) {
      ++impl_->reads_ahead_used;
      if (ahead->corrupt) {
        ++corrupt_;
        if (ahead->unsealed) ++auth_failures_;
        return Status::NotFound(options_.name + ": not held");
      }
      if (!ahead->chunk) return Status::NotFound(options_.name + ": not held");
      lock.unlock();
      impl_->Hint(key, true);
      return Opened(std::move(ahead->chunk));
    }
    // Not kept (read_ahead_bytes were held): asked for again below.
  }
  const keys::Digest* ns = ctx.ns ? &*ctx.ns : nullptr;
  if (!ns) {
    ++no_namespace_;
    return Status::NotFound(options_.name + ": no namespace for the read");
  }
  ChunkRef out;
  bool corrupt = false, unsealed = false;
  try {
    impl_->Run(impl_->DeadlineOf(ctx), [&](node::Session::Client& s) {
      auto req = s.getRequest();
      req.setNamespace(AsData(*ns));
      req.initKeys(1).set(0, AsData(key));
      return req.send().then([&](capnp::Response<node::Session::GetResults>&& r) {
        if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(r.getError()));
        auto chunks = r.getChunks();
        if (chunks.size() != 1 || !chunks[0].isEnvelope()) return;
        // Checked here, on the loop thread; kept in the buffer it arrived
        // in (the connection's registry is the loop's), or copied out.
        Result<ChunkRef> c = impl_->Decode(chunks[0], key, &unsealed);
        if (c.ok()) {
          out = std::move(c).value();
        } else {
          corrupt = true;
        }
      });
    });
  } catch (const kj::Exception&) {
    ++impl_->failed_calls;
    ++io_errors_;
    return Status(Code::kUnavailable, options_.name + ": node unavailable");
  }
  if (corrupt) ++corrupt_;
  if (unsealed) ++auth_failures_;
  if (!out) return Status::NotFound(options_.name + ": not held");
  impl_->Hint(key, true);
  return Opened(std::move(out));
}

void RemoteTier::Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& ctx) const {
  const keys::Digest* ns = ctx.ns ? &*ctx.ns : nullptr;
  if (!ns || keys.empty()) return;
  // The reads to start ahead: keys neither queued here (served from the
  // queue) nor already on their way, while arrivals hold less than
  // read_ahead_bytes.
  std::vector<std::shared_ptr<Impl::Arrival>> ahead(keys.size());
  const std::int64_t call_deadline = impl_->DeadlineOf(ctx);
  if (will_read) {
    std::vector<bool> queued(keys.size());
    {
      std::lock_guard<std::mutex> lock(qmu_);
      for (size_t i = 0; i < keys.size(); ++i) queued[i] = pending_.count(keys[i]) != 0;
    }
    const std::int64_t now = NowMs();
    std::lock_guard<std::mutex> lock(impl_->arrivals_mu);
    if (!impl_->arrivals.empty()) impl_->SweepLocked(now);
    std::uint32_t started = 0;
    for (size_t i = 0; i < keys.size() && started < options_.read_ahead_keys &&
                       impl_->arrival_bytes < options_.read_ahead_bytes;
         ++i) {
      if (queued[i] || impl_->arrivals.count(keys[i])) continue;
      auto a = std::make_shared<Impl::Arrival>();
      a->deadline_ms = call_deadline;
      impl_->arrivals.emplace(keys[i], a);
      ahead[i] = std::move(a);
      ++started;
    }
    impl_->reads_ahead += started;
  }
  std::uint32_t prefix = 0;
  bool sent = false;
  try {
    impl_->Run(call_deadline, [&](node::Session::Client& s) {
      auto req = s.lookupRequest();
      req.setNamespace(AsData(*ns));
      auto request = req.initRequests(1)[0];
      request.setTokens(keys.size() * options_.chunk_tokens);
      auto list = request.initKeys(static_cast<unsigned>(keys.size()));
      for (unsigned i = 0; i < keys.size(); ++i) list.set(i, AsData(keys[i]));
      auto lookup = req.send();  // first on the wire: its answer comes first
      // Every read at once, each a get of one key (its chunk its own reply),
      // cancelled when the lookup says the node's prefix ends before it.
      // The replies come in order, so each read's deadline runs from the
      // end of the one before it (timeout_ms of no progress, not of the
      // whole request: a long request streams for as long as it flows); a
      // read that failed or timed out fails the ones after it at once.
      auto cancels = kj::heapArrayBuilder<kj::Own<kj::PromiseFulfiller<void>>>(keys.size());
      Impl* impl = impl_.get();
      const std::uint32_t timeout_ms = options_.timeout_ms;
      kj::Maybe<kj::ForkedPromise<void>> previous;
      for (size_t i = 0; i < keys.size(); ++i) {
        auto cancel = kj::newPromiseAndFulfiller<void>();
        cancels.add(kj::mv(cancel.fulfiller));
        if (!ahead[i]) continue;
        auto g = s.getRequest();
        g.setNamespace(AsData(*ns));
        g.initKeys(1).set(0, AsData(keys[i]));
        std::shared_ptr<Impl::Arrival> a = ahead[i];
        const keys::Digest key = keys[i];
        auto got = g.send().then([impl, a, key](capnp::Response<node::Session::GetResults>&& r) {
          impl->Fill(*a, key, r);
        });
        kj::Promise<void> start = kj::READY_NOW;
        KJ_IF_MAYBE(p, previous) { start = p->addBranch(); }
        auto deadline = start.then([impl, timeout_ms]() {
          return impl->timer->afterDelay(timeout_ms * kj::MILLISECONDS).then([impl]() -> kj::Promise<void> {
            // No reply for timeout_ms: the connection is in an unknown
            // state, and the node is not answering.
            ++impl->timeouts;
            KJ_IF_MAYBE(c, impl->connection) { (*c)->broken = true; }
            impl->MarkDown();
            return KJ_EXCEPTION(OVERLOADED, "kdnd: no reply in time");
          });
        });
        auto outcome = got.exclusiveJoin(kj::mv(deadline)).fork();
        KJ_ASSERT_NONNULL(impl->reads)
            ->add(outcome.addBranch()
                      .exclusiveJoin(cancel.promise.then([]() -> kj::Promise<void> { return kj::READY_NOW; },
                                                         // Fulfiller dropped, not fulfilled: no cancel.
                                                         [](kj::Exception&&) -> kj::Promise<void> {
                                                           return kj::NEVER_DONE;
                                                         }))
                      .then([impl, a]() { impl->Finish(*a, false); },
                            [impl, a](kj::Exception&&) { impl->Finish(*a, true); }));
        previous = kj::mv(outcome);
      }
      sent = true;
      return lookup.then([&prefix, &ahead, impl, cancels = cancels.finish()](
                             capnp::Response<node::Session::LookupResults>&& r) mutable {
        if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(r.getError()));
        if (r.getResults().size() == 1) prefix = r.getResults()[0].getPrefix();
        for (size_t i = prefix; i < cancels.size(); ++i) {
          // Ended here, before this call returns: the cancel's own
          // continuation runs later on this loop, and a walk that asked
          // Contains meanwhile took the key as held ("being read ahead"),
          // then missed it on Get and lost the tail pieces after it.
          if (ahead[i]) impl->Finish(*ahead[i], false);
          cancels[i]->fulfill();
        }
      });
    });
  } catch (const kj::Exception&) {
    ++impl_->failed_calls;
    ++io_errors_;
    if (!sent) {
      // Never sent (no connection): the reads end here, as failed.
      for (auto& a : ahead) {
        if (a) impl_->Finish(*a, true);
      }
    }
    return;
  }
  // The walk that follows asks for these keys in order, at once: what the
  // node said holds for a moment (a later eviction there is a miss on get).
  for (size_t i = 0; i < keys.size() && i <= prefix; ++i) impl_->Hint(keys[i], i < prefix);
}

bool RemoteTier::Contains(const keys::Digest& key, const ReadContext& ctx) const {
  {
    std::lock_guard<std::mutex> lock(qmu_);
    if (pending_.count(key)) return true;
  }
  {
    // Being read ahead: held unless its reply said otherwise (a Get that
    // finds it missing after all is a miss, as after any probe).
    std::lock_guard<std::mutex> lock(impl_->arrivals_mu);
    auto it = impl_->arrivals.find(key);
    if (it != impl_->arrivals.end()) {
      const Impl::Arrival& a = *it->second;
      if (!a.done || !a.failed) return !a.done || a.chunk != nullptr || a.overflow;
      // A read that failed says nothing of the key (and no Get will take
      // it: the walk stops here): dropped, and the node asked.
      if (a.counted) impl_->arrival_bytes -= a.bytes;
      impl_->arrivals.erase(it);
    }
  }
  {
    std::lock_guard<std::mutex> lock(impl_->hints_mu);
    auto it = impl_->hints.find(key);
    if (it != impl_->hints.end()) {
      const Impl::Presence h = it->second;
      impl_->hints.erase(it);  // one probe per hint: later probes ask again
      if (h.until_ms >= NowMs()) return h.present;
    }
  }
  const keys::Digest* ns = ctx.ns ? &*ctx.ns : nullptr;
  if (!ns) {
    ++no_namespace_;
    return false;
  }
  bool held = false;
  try {
    impl_->Run(impl_->DeadlineOf(ctx), [&](node::Session::Client& s) {
      auto req = s.lookupRequest();
      req.setNamespace(AsData(*ns));
      auto request = req.initRequests(1)[0];
      request.setTokens(options_.chunk_tokens);
      request.initKeys(1).set(0, AsData(key));
      return req.send().then([&](capnp::Response<node::Session::LookupResults>&& r) {
        if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(r.getError()));
        held = r.getResults().size() == 1 && r.getResults()[0].getPrefix() == 1;
      });
    });
  } catch (const kj::Exception&) {
    ++impl_->failed_calls;
    ++io_errors_;
    return false;
  }
  return held;
}

bool RemoteTier::Erase(const keys::Digest& key, const ReadContext& ctx) {
  {
    std::lock_guard<std::mutex> lock(impl_->arrivals_mu);
    impl_->TakeLocked(key);  // read ahead before the erase: not served after it
  }
  {
    std::lock_guard<std::mutex> lock(impl_->hints_mu);
    impl_->hints.erase(key);
  }
  bool was_pending = false;
  {
    std::lock_guard<std::mutex> lock(qmu_);
    was_pending = pending_.count(key) != 0;
  }
  const keys::Digest* ns = ctx.ns ? &*ctx.ns : nullptr;
  if (!ns) {
    ++no_namespace_;
    return was_pending;
  }
  std::uint32_t erased = 0;
  try {
    impl_->Run(impl_->DeadlineOf(ctx), [&](node::Session::Client& s) {
      auto req = s.deleteRequest();
      req.setNamespace(AsData(*ns));
      req.initKeys(1).set(0, AsData(key));
      return req.send().then([&](capnp::Response<node::Session::DeleteResults>&& r) {
        if (r.getError().getCode() != node::ErrorCode::OK) kj::throwFatalException(CallError(r.getError()));
        erased = r.getErased();
      });
    });
  } catch (const kj::Exception&) {
    ++impl_->failed_calls;
    ++io_errors_;
  }
  return erased != 0 || was_pending;
}

TierCounters RemoteTier::counters() const {
  TierCounters c;
  c.corrupt_detected = corrupt_;
  c.auth_failures = auth_failures_;
  c.io_errors = io_errors_;
  return c;
}

TransportCounters RemoteTier::transport_counters() const {
  const RemoteCounters rc = remote_counters();
  TransportCounters t;
  t.calls = rc.calls;
  t.failed_calls = rc.failed_calls;
  t.timeouts = rc.timeouts;
  t.queue_full = rc.queue_full;
  t.queued_bytes = rc.queued_bytes;
  return t;
}

RemoteCounters RemoteTier::remote_counters() const {
  RemoteCounters c;
  c.calls = impl_->calls;
  c.failed_calls = impl_->failed_calls;
  c.timeouts = impl_->timeouts;
  c.connects = impl_->connects;
  c.connect_failures = impl_->connect_failures;
  c.marked_down = impl_->marked_down;
  c.down_skips = impl_->down_skips;
  c.past_deadline = impl_->past_deadline;
  c.puts_sent = puts_sent_;
  c.puts_refused = puts_refused_;
  c.reports_sent = reports_sent_;
  c.reports_refused = reports_refused_;
  c.reports_unsupported = reports_not_sent_;
  c.queue_full = queue_full_;
  c.no_namespace = no_namespace_;
  c.reads_ahead = impl_->reads_ahead;
  c.reads_ahead_used = impl_->reads_ahead_used;
  c.reads_ahead_dropped = impl_->reads_ahead_dropped;
  c.reads_ahead_overflow = impl_->reads_ahead_overflow;
  c.documents_sent = documents_sent_;
  c.documents_refused = documents_refused_;
  c.documents_dropped = documents_dropped_;
  {
    std::lock_guard<std::mutex> lock(qmu_);
    c.queued_bytes = queued_bytes_;
  }
  return c;
}

}  // namespace kdn::store
