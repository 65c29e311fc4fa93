// SPDX-License-Identifier: Apache-2.0
#include "server/rpc.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/debug.h>

#include "core/wire/envelope.h"
#include "core/wire/node_stats.h"

namespace kdn::server {

namespace {

using wire::node::KdnNode;
using wire::node::Session;

using wire::node::ErrorCode;

// The service's Status as the schema's typed error.
ErrorCode WireCode(Code code) {
  switch (code) {
    case Code::kOk: return ErrorCode::OK;
    case Code::kInvalidArgument: return ErrorCode::INVALID_ARGUMENT;
    case Code::kPermissionDenied: return ErrorCode::PERMISSION_DENIED;
    case Code::kTooLarge: return ErrorCode::TOO_LARGE;
    case Code::kCorrupt: return ErrorCode::CORRUPT;
    case Code::kBusy: return ErrorCode::BUSY;
    case Code::kUnavailable: return ErrorCode::UNAVAILABLE;
    case Code::kNotFound: return ErrorCode::NOT_FOUND;
    default: return ErrorCode::INTERNAL;
  }
}

void SetError(wire::node::Error::Builder b, const Status& e) {
  b.setCode(WireCode(e.code()));
  b.setMessage(e.message());
}

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

bool ToDigest(capnp::Data::Reader d, keys::Digest& out) {
  if (d.size() != out.size()) return false;
  std::memcpy(out.data(), d.begin(), out.size());
  return true;
}

// Reads a list of keys; false (with the error set) when one is not 32 bytes
// or there are too many.
bool ReadKeys(capnp::List<capnp::Data>::Reader in, std::vector<keys::Digest>& out, Status& error) {
  if (in.size() > wire::node::MAX_KEYS_PER_CALL) {
    error = Status::TooLarge("more than " + std::to_string(wire::node::MAX_KEYS_PER_CALL) + " keys in one call");
    return false;
  }
  out.resize(in.size());
  for (unsigned i = 0; i < in.size(); ++i) {
    if (!ToDigest(in[i], out[i])) {
      error = Status::InvalidArgument("key " + std::to_string(i) + ": expected 32 bytes, got " +
                                      std::to_string(in[i].size()));
      return false;
    }
  }
  return true;
}

// What the sessions of one connection share: its statistics
// subscriptions, bounded (event loop thread only).
struct ConnectionShare {
  std::uint32_t max_subscriptions = 4;
  std::uint32_t subscriptions = 0;
};

class SubscriptionImpl final : public wire::node::Subscription::Server {
 public:
  // Made after the node and the connection took it (SubscriptionOpened,
  // share->subscriptions); gives both back when dropped.
  SubscriptionImpl(NodeService& service, kj::Timer& timer, wire::node::StatsSink::Client sink, std::uint32_t interval_ms,
                   std::shared_ptr<ConnectionShare> share)
      : service_(service),
        timer_(timer),
        sink_(kj::mv(sink)),
        interval_ms_(interval_ms),
        share_(std::move(share)),
        loop_(Loop()) {}
  ~SubscriptionImpl() noexcept(false) {
    --share_->subscriptions;
    service_.SubscriptionClosed();
  }

 private:
  kj::Promise<void> Loop() {
    auto req = sink_.pushRequest();
    ToWire(service_.Stats(), req.initStats());
    // A streaming call: it resolves when the sink has room for the next,
    // so a slow subscriber slows its own pushes and nobody else's.
    return req.send().then([this]() { return timer_.afterDelay(interval_ms_ * kj::MILLISECONDS); }).then([this]() {
      return Loop();
    });
  }

  NodeService& service_;
  kj::Timer& timer_;
  wire::node::StatsSink::Client sink_;
  std::uint32_t interval_ms_;
  std::shared_ptr<ConnectionShare> share_;
  // Ends when the subscriber drops the subscription (this is destroyed) or
  // its sink fails (disconnected): the error ends the loop quietly.
  kj::Promise<void> loop_;
};

class SessionImpl final : public Session::Server {
 public:
  // A call's namespace and keys, checked (sizes, count, the grant).
  template <typename Params>
  Status NamespaceAndKeys(Params params, keys::Digest& ns, std::vector<keys::Digest>& keys) {
    // The grant first: a token without the namespace gets no work done.
    auto nsb = params.getNamespace();
    Status error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
    if (error.ok()) ReadKeys(params.getKeys(), keys, error);
    return error;
  }

  // Whether a held chunk's envelope goes into a reply from where it lies
  // (held until written, and counted in the connection's held bytes), not
  // copied: it is whole words (a segment shows the bytes up to its end's
  // word boundary). What the connection holds is bounded before the get
  // starts (get: max_inflight_bytes, then at most one reply more).
  bool InPlace(const store::Chunk& c) const {
    return buffers_ && c.envelope && c.envelope_bytes % sizeof(capnp::word) == 0 &&
           reinterpret_cast<std::uintptr_t>(c.envelope) % sizeof(capnp::word) == 0;
  }

  SessionImpl(NodeService& service, kj::Timer& timer, const Grant& grant, std::shared_ptr<wire::StreamBuffers> buffers,
              std::shared_ptr<ConnectionShare> share)
      : service_(service), timer_(timer), grant_(grant), buffers_(std::move(buffers)), share_(std::move(share)) {
    service_.SessionOpened();
  }
  ~SessionImpl() noexcept(false) { service_.SessionClosed(); }

 protected:
  // Runs a handler; a message that turns out malformed while it is read
  // (a pointer of the wrong kind, out of bounds: Cap'n Proto throws) gets a
  // typed invalidArgument, like any other bad request, not an exception.
  template <typename Context, typename Body>
  kj::Promise<void> Guard(Context& context, Body&& body) {
    kj::Maybe<kj::Promise<void>> done;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { done = body(); })) {
      SetError(context.initResults().initError(),
               Status::InvalidArgument(std::string("malformed request: ") + e->getDescription().cStr()));
      return kj::READY_NOW;
    }
    return kj::mv(KJ_ASSERT_NONNULL(done));
  }

  kj::Promise<void> lookup(LookupContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      auto requests = params.getRequests();
      // The grant first, then the sizes, and only then anything allocated:
      // a list of empty requests costs its sender nothing (a 150-byte
      // message can claim 2^29 of them) and a token without the namespace
      // gets no work done.
      keys::Digest checked{};
      auto nsb = params.getNamespace();
      Status error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, checked);
      if (error.ok() && requests.size() > wire::node::MAX_KEYS_PER_CALL) {
        error = Status::TooLarge("more than " + std::to_string(wire::node::MAX_KEYS_PER_CALL) + " requests in one call");
      }
      if (!error.ok()) {
        SetError(context.getResults().initError(), error);
        return kj::READY_NOW;
      }
      std::vector<std::vector<keys::Digest>> keys(requests.size());
      std::vector<std::uint64_t> tokens(requests.size());
      std::uint64_t total = 0;
      for (unsigned r = 0; r < requests.size() && error.ok(); ++r) {
        total += requests[r].getKeys().size();
        if (total > wire::node::MAX_KEYS_PER_CALL) {
          error = Status::TooLarge("more than " + std::to_string(wire::node::MAX_KEYS_PER_CALL) + " keys in one call");
          break;
        }
        ReadKeys(requests[r].getKeys(), keys[r], error);
        tokens[r] = requests[r].getTokens();
      }
      auto results = context.getResults();
      std::vector<std::uint32_t> prefixes;
      if (error.ok()) {
        auto ns = params.getNamespace();
        error = service_.Lookup(grant_, {ns.begin(), ns.size()}, keys, tokens, prefixes);
      }
      SetError(results.initError(), error);
      if (error.ok()) {
        auto list = results.initResults(static_cast<unsigned>(prefixes.size()));
        for (unsigned i = 0; i < prefixes.size(); ++i) list[i].setPrefix(prefixes[i]);
      }
      return kj::READY_NOW;
    });
  }

  // Every envelope a get sends is held by the connection until written
  // (in place, or encoded into memory of its own): its stream reads no
  // further request while they pass max_inflight_bytes (a client that does
  // not read stops being read; core/wire/message_stream.h).
  kj::Promise<void> get(GetContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      const auto t0 = std::chrono::steady_clock::now();
      auto params = context.getParams();
      keys::Digest ns{};
      std::vector<keys::Digest> keys;
      Status error = NamespaceAndKeys(params, ns, keys);
      std::vector<store::ChunkRef> chunks;
      std::vector<bool> in_place;  // per chunk: sent from where it lies
      std::uint64_t words = 16, misses = 0, bytes = 0, tokens = 0;
      bool capped = false;  // the reply reached max_reply_bytes: the rest are missing
      if (error.ok()) {
        chunks.reserve(keys.size());
        for (const keys::Digest& k : keys) {
          chunks.push_back(capped ? nullptr : service_.Get(ns, k));
          if (chunks.back()) {
            const store::Chunk& c = *chunks.back();
            const std::uint64_t size = c.envelope ? c.envelope_bytes : wire::EncodedEnvelopeSize(c.payload.size());
            // (The first chunk always goes: a reply holds at least one.)
            if (bytes != 0 && bytes + size > service_.max_reply_bytes()) {
              capped = true;
              chunks.back() = nullptr;
            }
          }
          in_place.push_back(chunks.back() && InPlace(*chunks.back()));
          if (chunks.back()) {
            const store::Chunk& c = *chunks.back();
            const std::uint64_t size = c.envelope ? c.envelope_bytes : wire::EncodedEnvelopeSize(c.payload.size());
            // Copied into the reply's own segment: room for it there.
            if (!in_place.back() && !(buffers_ && !c.envelope && size % sizeof(capnp::word) == 0)) {
              words += size / 8 + 4;
            }
            bytes += size;
            tokens += c.meta.tokens;
          } else if (!capped) {
            ++misses;
          }
        }
      }
      // One segment sized for every envelope sent from it: each is encoded
      // straight into the reply (a word-aligned, zeroed Data), one copy of
      // its payload, or copied there as it was put. An envelope the node
      // kept as it was put is sent from where it lies (a segment of its own,
      // held until written: no copy at all) where the connection allows.
      const std::uint64_t seal_words = service_.sealer() ? wire::kSealTrailerBytes / 8 : 0;
      auto results = context.initResults(capnp::MessageSize{words + (4 + seal_words) * keys.size(), 0});
      if (!error.ok()) {
        SetError(results.initError(), error);
        return kj::READY_NOW;
      }
      SetError(results.initError(), error);
      auto list = results.initChunks(static_cast<unsigned>(chunks.size()));
      for (unsigned i = 0; i < chunks.size(); ++i) {
        if (!chunks[i]) {
          list[i].setMissing();
          continue;
        }
        const store::Chunk& c = *chunks[i];
        if (in_place[i]) {
          capnp::Data::Reader bytes(c.envelope, c.envelope_bytes);
          list[i].adoptEnvelope(capnp::Orphanage::getForMessageContaining(results).referenceExternalData(bytes));
          buffers_->Hold(c.envelope, chunks[i], c.envelope_bytes);
          continue;
        }
        if (c.envelope) {
          auto data = list[i].initEnvelope(static_cast<unsigned>(c.envelope_bytes));
          std::memcpy(data.begin(), c.envelope, c.envelope_bytes);
          continue;
        }
        const std::uint64_t size = wire::EncodedEnvelopeSize(c.payload.size());
        if (buffers_ && size % sizeof(capnp::word) == 0) {
          // Encoded into memory of its own, held (and counted against the
          // connection's in-flight bytes) until the reply is written.
          auto encoded = std::make_shared<chunk::Payload>(chunk::Payload::Uninitialized(size));
          if (wire::EncodeEnvelopeOver(c, encoded->data(), size).ok()) {  // over uninitialized memory
            list[i].adoptEnvelope(capnp::Orphanage::getForMessageContaining(results).referenceExternalData(
                capnp::Data::Reader(encoded->data(), size)));
            buffers_->Hold(encoded->data(), encoded, size);
          } else {
            list[i].setMissing();
            ++misses;
          }
          continue;
        }
        auto data = list[i].initEnvelope(static_cast<unsigned>(size));
        Status st = wire::EncodeEnvelopeInto(c, data.begin(), size);
        if (!st.ok()) {  // cannot happen for a chunk that decoded on put; a miss all the same
          list[i].setMissing();
          ++misses;
        }
      }
      // With a secret, each envelope goes with its seal: a runtime with the
      // secret takes only what this node (or another holder of it) sent.
      if (const wire::ChunkSealer* sealer = service_.sealer()) {
        for (unsigned i = 0; i < chunks.size(); ++i) {
          if (!list[i].isEnvelope()) continue;
          // As a reader: an envelope sent from where it lies is external
          // data, which has no builder.
          capnp::Data::Reader envelope = list[i].asReader().getEnvelope();
          auto seal = list[i].initSeal(static_cast<unsigned>(wire::kSealTrailerBytes));
          if (!sealer->Seal(envelope.begin(), envelope.size(), seal.begin()).ok()) {
            list[i].setMissing();  // no random bytes: a miss, not an unsealed chunk
            ++misses;
          }
        }
      }
      if (capped) service_.CountBound(NodeStat::kRepliesCapped);
      service_.CountGet(keys.size(), misses, bytes, tokens, MicrosSince(t0));
      if (service_.knowledge().documents() != 0) {
        std::vector<keys::Digest> served;
        served.reserve(keys.size());
        for (unsigned i = 0; i < chunks.size(); ++i) {
          if (list[i].isEnvelope()) served.push_back(keys[i]);
        }
        service_.knowledge().CreditHits(ns, served);
      }
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> put(PutContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      const auto t0 = std::chrono::steady_clock::now();
      auto params = context.getParams();
      auto envelopes = params.getEnvelopes();
      auto results = context.getResults();
      Status error;
      keys::Digest ns{};
      auto nsb = params.getNamespace();
      if (envelopes.size() > wire::node::MAX_KEYS_PER_CALL) {
        error = Status::TooLarge("too many envelopes in one call");
      } else {
        error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
      }
      SetError(results.initError(), error);
      if (!error.ok()) return kj::READY_NOW;
      auto list = results.initResults(envelopes.size());
      for (unsigned i = 0; i < envelopes.size(); ++i) {
        auto e = envelopes[i];
        Status r = e.size() > wire::node::MAX_ENVELOPE_BYTES
                          ? Status::TooLarge("envelope larger than the node takes")
                          : service_.Put(ns, {e.begin(), e.size()},
                                         buffers_ ? buffers_->OwnerOf(e.begin(), e.size()) : nullptr);
        SetError(list[i], r);
      }
      service_.CountPut(MicrosSince(t0));
      return kj::READY_NOW;
    });
  }

  // A call on keys of a namespace (delete, pin, unpin): checked, then `act`.
  template <typename Context, typename Act>
  kj::Promise<void> KeyedCall(Context& context, Act&& act) {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      keys::Digest ns{};
      std::vector<keys::Digest> keys;
      Status error = NamespaceAndKeys(params, ns, keys);
      auto results = context.getResults();
      SetError(results.initError(), error);
      if (error.ok()) act(ns, keys, params, results);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> delete_(DeleteContext context) override {
    return KeyedCall(context, [&](const keys::Digest& ns, const std::vector<keys::Digest>& keys, auto, auto results) {
      results.setErased(service_.Delete(ns, keys));
    });
  }

  kj::Promise<void> pin(PinContext context) override {
    return KeyedCall(context, [&](const keys::Digest& ns, const std::vector<keys::Digest>& keys, auto params, auto results) {
      results.setPinned(service_.Pin(ns, keys, params.getTtlMs()));
    });
  }

  kj::Promise<void> unpin(UnpinContext context) override {
    return KeyedCall(context, [&](const keys::Digest& ns, const std::vector<keys::Digest>& keys, auto, auto results) {
      results.setUnpinned(service_.Unpin(ns, keys));
    });
  }

  // ---- Knowledge items (version 2) ----

  // A knowledge call's namespace (checked against the grant first, so a
  // refused call learns nothing of the namespace's documents), then its
  // docId and model.
  template <typename Params>
  Status NamespaceDocAndModel(Params params, keys::Digest& ns, std::string& doc_id, keys::Digest& model) {
    auto nsb = params.getNamespace();
    Status error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
    if (!error.ok()) return error;
    auto id = params.getDocId();
    if (id.size() == 0) return Status::InvalidArgument("docId is empty");
    if (id.size() > wire::node::MAX_DOC_ID_BYTES) {
      return Status::TooLarge("docId longer than " + std::to_string(wire::node::MAX_DOC_ID_BYTES) + " bytes");
    }
    doc_id.assign(id.begin(), id.size());
    if (!ToDigest(params.getModel(), model)) {
      return Status::InvalidArgument("model: expected a 32-byte fingerprint, got " +
                                     std::to_string(params.getModel().size()) + " bytes");
    }
    return Status::Ok();
  }

  kj::Promise<void> knowledgePut(KnowledgePutContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      auto results = context.getResults();
      keys::Digest ns{};
      auto nsb = params.getNamespace();
      Status error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
      KnowledgeDoc doc;
      if (error.ok()) {
        auto item = params.getItem();
        auto id = item.getDocId();
        auto meta = item.getMetadata();
        doc.doc_id.assign(id.begin(), id.size());
        doc.version = item.getVersion();
        doc.metadata.assign(meta.begin(), meta.size());
        doc.tokens = item.getTokens();
        if (!ToDigest(item.getModel(), doc.model)) {
          error = Status::InvalidArgument("model: expected a 32-byte fingerprint, got " +
                                          std::to_string(item.getModel().size()) + " bytes");
        } else {
          ReadKeys(item.getKeys(), doc.keys, error);
        }
      }
      if (error.ok()) error = service_.KnowledgePut(ns, std::move(doc));
      SetError(results.initError(), error);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> knowledgeList(KnowledgeListContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      keys::Digest ns{};
      auto nsb = params.getNamespace();
      Status error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
      std::vector<KnowledgeDocInfo> docs;
      std::uint64_t words = 8;
      if (error.ok()) {
        docs = service_.knowledge().List(ns);
        for (const KnowledgeDocInfo& d : docs) words += 16 + (d.doc_id.size() + d.metadata.size() + 2) / 8 + 2;
        // One reply must stay well under what a client reads (core/wire/rpc.h).
        constexpr std::uint64_t kMaxReplyWords = (std::uint64_t{128} << 20) / 8;
        if (words > kMaxReplyWords) {
          error = Status::TooLarge(std::to_string(docs.size()) +
                                   " documents with their metadata are more than one reply carries (128 MiB)");
        }
      }
      auto results = context.initResults(capnp::MessageSize{error.ok() ? words : 8, 0});
      SetError(results.initError(), error);
      if (!error.ok()) return kj::READY_NOW;
      auto list = results.initItems(static_cast<unsigned>(docs.size()));
      for (unsigned i = 0; i < docs.size(); ++i) {
        const KnowledgeDocInfo& d = docs[i];
        auto b = list[i];
        b.setDocId(d.doc_id);
        b.setVersion(d.version);
        b.setMetadata(d.metadata);
        b.setTokens(d.tokens);
        b.setModel(capnp::Data::Reader(d.model.data(), d.model.size()));
        b.setChunks(d.chunks);
        b.setChunksHeld(d.chunks_held);
        b.setPinned(d.pinned);
        b.setPinExpiresMs(d.pin_expires_ms);
        b.setRegisteredMs(d.registered_ms);
        b.setHits(d.hits);
      }
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> knowledgePin(KnowledgePinContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      keys::Digest ns{}, model{};
      std::string doc_id;
      Status error = NamespaceDocAndModel(params, ns, doc_id, model);
      std::uint32_t pinned = 0;
      if (error.ok()) error = service_.knowledge().Pin(ns, model, doc_id, params.getPin(), params.getTtlMs(), pinned);
      auto results = context.getResults();
      SetError(results.initError(), error);
      results.setPinned(pinned);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> knowledgeDelete(KnowledgeDeleteContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      keys::Digest ns{}, model{};
      std::string doc_id;
      Status error = NamespaceDocAndModel(params, ns, doc_id, model);
      std::uint32_t erased = 0;
      if (error.ok()) error = service_.knowledge().Delete(ns, model, doc_id, erased);
      auto results = context.getResults();
      SetError(results.initError(), error);
      results.setErased(erased);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> report(ReportContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      auto r = params.getReport();
      NodeService::RequestReport report;
      report.lookups = r.getLookups();
      report.lookup_tokens = r.getLookupTokens();
      report.lookup_hit_tokens = r.getLookupHitTokens();
      report.loads = r.getLoads();
      report.load_tokens = r.getLoadTokens();
      report.load_hit_tokens = r.getLoadHitTokens();
      if (r.hasModel()) {
        auto model = r.getModel();
        if (model.size() != report.model.size()) {
          SetError(context.getResults().initError(),
                   Status::InvalidArgument("report: a model fingerprint is 32 bytes, got " + std::to_string(model.size())));
          return kj::READY_NOW;
        }
        std::memcpy(report.model.data(), model.begin(), model.size());
      }
      auto ns = params.getNamespace();
      SetError(context.getResults().initError(), service_.Report(grant_, {ns.begin(), ns.size()}, report));
      return kj::READY_NOW;
    });
  }

  // A statistics call: refused without the grant, else `act`.
  template <typename Context, typename Act>
  kj::Promise<void> StatsCall(Context& context, Act&& act) {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto results = context.getResults();
      const Status allowed = service_.CheckStats(grant_);
      SetError(results.initError(), allowed);
      if (!allowed.ok()) return kj::READY_NOW;
      act(context.getParams(), results);
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> stats(StatsContext context) override {
    return StatsCall(context, [&](auto, auto results) { ToWire(service_.Stats(), results.initStats()); });
  }

  kj::Promise<void> subscribeStats(SubscribeStatsContext context) override {
    return StatsCall(context, [&](auto params, auto results) {
      const std::uint32_t interval = std::max<std::uint32_t>(50, params.getIntervalMs());
      // Each subscription pushes on its own: their number is bounded per
      // connection and on the node, or a client could open thousands.
      if (share_->subscriptions >= share_->max_subscriptions) {
        service_.CountBound(NodeStat::kSubscriptionsRefused);
        SetError(results.initError(), Status::Busy("this connection holds its most statistics subscriptions (" +
                                                   std::to_string(share_->max_subscriptions) + ")"));
        return;
      }
      if (!service_.SubscriptionOpened()) {
        SetError(results.initError(), Status::Busy("the node holds its most statistics subscriptions"));
        return;
      }
      ++share_->subscriptions;
      results.setSubscription(kj::heap<SubscriptionImpl>(service_, timer_, params.getSink(), interval, share_));
    });
  }

 private:
  NodeService& service_;
  kj::Timer& timer_;
  const Grant& grant_;
  std::shared_ptr<wire::StreamBuffers> buffers_;  // null: replies copy what they send
  std::shared_ptr<ConnectionShare> share_;
};

class NodeImpl final : public KdnNode::Server {
 public:
  NodeImpl(NodeService& service, kj::Timer& timer, std::string version, std::shared_ptr<wire::StreamBuffers> buffers,
           std::uint32_t max_login_failures, std::uint32_t max_subscriptions)
      : service_(service),
        timer_(timer),
        version_(std::move(version)),
        buffers_(std::move(buffers)),
        max_login_failures_(max_login_failures),
        share_(std::make_shared<ConnectionShare>()) {
    share_->max_subscriptions = max_subscriptions;
  }

 protected:
  kj::Promise<void> health(HealthContext context) override {
    auto h = context.getResults().initHealth();
    h.setServing(!service_.draining());
    h.setVersion(version_);
    h.setProtocol(wire::node::PROTOCOL_VERSION);
    h.setUptimeMs(service_.uptime_ms());
    return kj::READY_NOW;
  }

  // Guessing tokens on one connection gets slow, then impossible: each
  // failed login is answered later than the one before (100 ms, doubling
  // to 2 s), and after max_login_failures_ the connection is closed.
  kj::Promise<void> login(LoginContext context) override {
    auto token = context.getParams().getToken();
    auto results = context.getResults();
    const Grant* grant = service_.Authenticate(std::string_view(token.begin(), token.size()));
    if (!grant) {
      auto error = results.initError();
      error.setCode(ErrorCode::UNAUTHENTICATED);  // no Status code of its own: only login says it
      error.setMessage("unknown token");
      if (max_login_failures_ == 0) return kj::READY_NOW;
      ++failures_;
      if (failures_ >= max_login_failures_ && buffers_) {
        buffers_->Drop();
        return kj::READY_NOW;
      }
      const std::uint64_t pause_ms = std::min<std::uint64_t>(std::uint64_t{100} << std::min(failures_ - 1, 10u), 2000);
      return timer_.afterDelay(pause_ms * kj::MILLISECONDS);
    }
    if (buffers_) buffers_->Authenticated();
    SetError(results.initError(), Status::Ok());
    results.setSession(kj::heap<SessionImpl>(service_, timer_, *grant, buffers_, share_));
    return kj::READY_NOW;
  }

 private:
  NodeService& service_;
  kj::Timer& timer_;
  std::string version_;
  std::shared_ptr<wire::StreamBuffers> buffers_;
  std::uint32_t max_login_failures_ = 0;  // 0: no throttling
  std::uint32_t failures_ = 0;
  std::shared_ptr<ConnectionShare> share_;  // its sessions'
};

}  // namespace

capnp::Capability::Client MakeNodeBootstrap(NodeService& service, kj::Timer& timer, const std::string& version,
                                            std::shared_ptr<wire::StreamBuffers> buffers,
                                            std::uint32_t max_login_failures, std::uint32_t max_subscriptions) {
  return kj::heap<NodeImpl>(service, timer, version, std::move(buffers), max_login_failures, max_subscriptions);
}

wire::node::Session::Client MakeSession(NodeService& service, kj::Timer& timer, const Grant& grant,
                                        std::shared_ptr<wire::StreamBuffers> buffers) {
  return kj::heap<SessionImpl>(service, timer, grant, std::move(buffers), std::make_shared<ConnectionShare>());
}

}  // namespace kdn::server
