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

class SubscriptionImpl final : public wire::node::Subscription::Server {
 public:
  SubscriptionImpl(NodeService& service, kj::Timer& timer, wire::node::StatsSink::Client sink, std::uint32_t interval_ms)
      : service_(service), timer_(timer), sink_(kj::mv(sink)), interval_ms_(interval_ms), loop_(Loop()) {}

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
  // Ends when the subscriber drops the subscription (this is destroyed) or
  // its sink fails (disconnected): the error ends the loop quietly.
  kj::Promise<void> loop_;
};

class SessionImpl final : public Session::Server {
 public:
  // A call's namespace and keys, checked (sizes, count, the grant).
  template <typename Params>
  Status NamespaceAndKeys(Params params, keys::Digest& ns, std::vector<keys::Digest>& keys) {
    Status error;
    auto nsb = params.getNamespace();
    if (ReadKeys(params.getKeys(), keys, error)) error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
    return error;
  }

  // Whether a held chunk's envelope goes into a reply from where it lies:
  // the connection has room to hold it until written (StreamBuffers'
  // bound, 1 GiB: a client that never reads keeps no more than that of
  // evicted chunks alive; beyond it, replies copy), and it is whole words
  // (a segment shows the bytes up to its end's word boundary). `more`:
  // what this reply holds already.
  bool InPlace(const store::Chunk& c, std::uint64_t more) const {
    return buffers_ && c.envelope && c.envelope_bytes % sizeof(capnp::word) == 0 &&
           reinterpret_cast<std::uintptr_t>(c.envelope) % sizeof(capnp::word) == 0 &&
           buffers_->CanHold(c.envelope_bytes, more);
  }

  SessionImpl(NodeService& service, kj::Timer& timer, const Grant& grant, std::shared_ptr<wire::StreamBuffers> buffers)
      : service_(service), timer_(timer), grant_(grant), buffers_(std::move(buffers)) {
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
      Status error;
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

  kj::Promise<void> get(GetContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      const auto t0 = std::chrono::steady_clock::now();
      auto params = context.getParams();
      keys::Digest ns{};
      std::vector<keys::Digest> keys;
      Status error = NamespaceAndKeys(params, ns, keys);
      std::vector<store::ChunkRef> chunks;
      std::vector<bool> in_place;  // per chunk: sent from where it lies
      std::uint64_t words = 16, misses = 0, bytes = 0, tokens = 0, holding = 0;
      if (error.ok()) {
        chunks.reserve(keys.size());
        for (const keys::Digest& k : keys) {
          chunks.push_back(service_.Get(ns, k));
          in_place.push_back(chunks.back() && InPlace(*chunks.back(), holding));
          if (chunks.back()) {
            const store::Chunk& c = *chunks.back();
            const std::uint64_t size = c.envelope ? c.envelope_bytes : wire::EncodedEnvelopeSize(c.payload.size());
            if (in_place.back()) {
              holding += size;
            } else {
              words += size / 8 + 4;
            }
            bytes += size;
            tokens += c.meta.tokens;
          } else {
            ++misses;
          }
        }
      }
      // One segment sized for every envelope sent from it: each is encoded
      // straight into the reply (a word-aligned, zeroed Data), one copy of
      // its payload, or copied there as it was put. An envelope the node
      // kept as it was put is sent from where it lies (a segment of its own,
      // held until written: no copy at all) where the connection allows.
      auto results = context.initResults(capnp::MessageSize{words + 4 * keys.size(), 0});
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
        auto data = list[i].initEnvelope(static_cast<unsigned>(size));
        Status st = wire::EncodeEnvelopeInto(c, data.begin(), size);
        if (!st.ok()) {  // cannot happen for a chunk that decoded on put; a miss all the same
          list[i].setMissing();
          ++misses;
        }
      }
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
      results.setSubscription(kj::heap<SubscriptionImpl>(service_, timer_, params.getSink(), interval));
    });
  }

 private:
  NodeService& service_;
  kj::Timer& timer_;
  const Grant& grant_;
  std::shared_ptr<wire::StreamBuffers> buffers_;  // null: replies copy what they send
};

class NodeImpl final : public KdnNode::Server {
 public:
  NodeImpl(NodeService& service, kj::Timer& timer, std::string version, std::shared_ptr<wire::StreamBuffers> buffers)
      : service_(service), timer_(timer), version_(std::move(version)), buffers_(std::move(buffers)) {}

 protected:
  kj::Promise<void> health(HealthContext context) override {
    auto h = context.getResults().initHealth();
    h.setServing(!service_.draining());
    h.setVersion(version_);
    h.setProtocol(wire::node::PROTOCOL_VERSION);
    h.setUptimeMs(service_.uptime_ms());
    return kj::READY_NOW;
  }

  kj::Promise<void> login(LoginContext context) override {
    auto token = context.getParams().getToken();
    auto results = context.getResults();
    const Grant* grant = service_.Authenticate(std::string_view(token.begin(), token.size()));
    if (!grant) {
      auto error = results.initError();
      error.setCode(ErrorCode::UNAUTHENTICATED);  // no Status code of its own: only login says it
      error.setMessage("unknown token");
      return kj::READY_NOW;
    }
    SetError(results.initError(), Status::Ok());
    results.setSession(kj::heap<SessionImpl>(service_, timer_, *grant, buffers_));
    return kj::READY_NOW;
  }

 private:
  NodeService& service_;
  kj::Timer& timer_;
  std::string version_;
  std::shared_ptr<wire::StreamBuffers> buffers_;
};

}  // namespace

capnp::Capability::Client MakeNodeBootstrap(NodeService& service, kj::Timer& timer, const std::string& version,
                                            std::shared_ptr<wire::StreamBuffers> buffers) {
  return kj::heap<NodeImpl>(service, timer, version, std::move(buffers));
}

wire::node::Session::Client MakeSession(NodeService& service, kj::Timer& timer, const Grant& grant,
                                        std::shared_ptr<wire::StreamBuffers> buffers) {
  return kj::heap<SessionImpl>(service, timer, grant, std::move(buffers));
}

}  // namespace kdn::server
