#include "server/node.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <cstring>

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/timer.h>

#include "server/kv_events.h"
#include "util/clock.h"
#include "wire/envelope.h"

namespace kdn::server {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

keys::Digest TokenDigest(std::string_view token) {
  keys::Hasher h;
  h.Str("kdnd-token");
  h.Str(token);
  return h.Finish();
}

bool ToDigest(capnp::Data::Reader d, keys::Digest& out) {
  if (d.size() != out.size()) return false;
  std::memcpy(out.data(), d.begin(), out.size());
  return true;
}

LatencySnapshot Latency(const telemetry::Histogram& h) {
  LatencySnapshot s;
  s.summary = h.Snapshot();
  for (double b : kLatencyBoundsUs) s.buckets.push_back(h.CountAtOrBelow(b));
  return s;
}

std::string KindName(store::TierSpec::Kind k) {
  switch (k) {
    case store::TierSpec::Kind::kHost: return "host";
    case store::TierSpec::Kind::kDevice: return "device";
    case store::TierSpec::Kind::kDisk: return "disk";
    case store::TierSpec::Kind::kRemote: return "remote";
  }
  return "unknown";
}

}  // namespace

// ---- The service ----------------------------------------------------------------

Result<std::unique_ptr<NodeService>> NodeService::Create(const NodeOptions& options) {
  std::unique_ptr<NodeService> s(new NodeService());
  std::vector<store::TierSpec> specs = options.tiers;
  if (specs.empty()) specs.push_back(store::TierSpec{});
  store::TieredStoreOptions to;
  to.pass_through = true;
  to.on_drop = [p = s.get()](const keys::Digest& object) { p->Dropped(object); };
  to.clock = options.clock;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].codec.empty() && specs[i].codec != "raw") {
      return Status::InvalidArgument("tier " + std::to_string(i) +
                                     ": a node stores chunks as its clients encoded them; give codecs to the clients' remote tiers");
    }
    specs[i].codec = "raw";
    auto tier = store::MakeTier(specs[i], i);
    if (!tier.ok()) return tier.status();
    to.levels.push_back(store::LevelFor(specs[i], std::move(tier).value()));
  }
  auto chain = store::TieredStore::Create(std::move(to));
  if (!chain.ok()) return chain.status();
  s->chain_ = std::move(chain).value();
  s->specs_ = std::move(specs);
  for (const TokenGrant& t : options.tokens) {
    Grant g;
    g.name = t.name;
    g.stats = t.stats;
    for (const std::string& ns : t.namespaces) {
      if (ns == "*") {
        g.all_namespaces = true;
      } else {
        g.namespaces.insert(keys::NamespaceHash(ns));
      }
    }
    s->grants_.emplace_back(std::string(), std::move(g));
    const keys::Digest d = TokenDigest(t.token);
    s->grants_.back().first.assign(reinterpret_cast<const char*>(d.data()), d.size());
  }
  s->prefill_us_per_token_ = options.prefill_us_per_token;
  return s;
}

NodeService::~NodeService() {
  chain_.reset();  // first: its mover may still report drops to the members below it
}

const Grant* NodeService::Authenticate(std::string_view token) {
  // Every token is compared, in constant time, over digests of equal size:
  // neither the time nor the order says which one (or how much of one) matched.
  const keys::Digest d = TokenDigest(token);
  const Grant* found = nullptr;
  for (const auto& [digest, grant] : grants_) {
    const bool same = CRYPTO_memcmp(digest.data(), d.data(), d.size()) == 0;
    if (same) found = &grant;
  }
  if (!found) ++auth_failures_;
  return found;
}

keys::Digest NodeService::ObjectKey(const keys::Digest& ns, const keys::Digest& key) {
  keys::Hasher h;
  h.Str("kdnd/1");
  h.Bytes(ns.data(), ns.size());
  h.Bytes(key.data(), key.size());
  return h.Finish();
}

NodeError NodeService::CheckNamespace(const Grant& g, std::span<const std::uint8_t> ns, keys::Digest& out) {
  if (ns.size() != out.size()) {
    return {ErrorCode::INVALID_ARGUMENT, "namespace: expected a 32-byte SHA-256 of the namespace's name, got " +
                                             std::to_string(ns.size()) + " bytes"};
  }
  std::memcpy(out.data(), ns.data(), out.size());
  if (!g.Allows(out)) {
    ++auth_failures_;
    return {ErrorCode::PERMISSION_DENIED, "this token does not grant that namespace"};
  }
  if (draining_) return {ErrorCode::UNAVAILABLE, "the node is shutting down"};
  return {};
}

NodeError NodeService::Lookup(const Grant& g, std::span<const std::uint8_t> ns_bytes,
                              const std::vector<std::vector<keys::Digest>>& requests,
                              std::span<const std::uint64_t> request_tokens, std::vector<std::uint32_t>& prefixes) {
  const auto t0 = std::chrono::steady_clock::now();
  keys::Digest ns{};
  if (NodeError e = CheckNamespace(g, ns_bytes, ns); !e.ok()) return e;
  prefixes.assign(requests.size(), 0);
  for (size_t r = 0; r < requests.size(); ++r) {
    std::uint32_t n = 0;
    for (const keys::Digest& k : requests[r]) {
      if (chain_->Locate(ObjectKey(ns, k)) < 0) break;
      ++n;
    }
    prefixes[r] = n;
    ++lookups_;
    const std::uint64_t tokens = r < request_tokens.size() ? request_tokens[r] : 0;
    requested_tokens_ += tokens;
    if (tokens != 0 && !requests[r].empty()) {
      // Chunks are equal-sized but the last: the tokens found, pro rata.
      lookup_hit_tokens_ += n == requests[r].size() ? tokens : tokens * n / requests[r].size();
    }
  }
  lookup_us_.Record(MicrosSince(t0));
  return {};
}

store::ChunkRef NodeService::Get(const keys::Digest& ns, const keys::Digest& key) {
  Result<store::Lease> lease = chain_->Get(ObjectKey(ns, key));
  if (!lease.ok()) return nullptr;
  store::ChunkRef stored = lease->chunk();
  // The same payload (shared, not copied) under the caller's key.
  auto out = std::make_shared<store::Chunk>();
  out->meta = stored->meta;
  out->meta.key = key;
  out->payload = store::Payload::Adopt(const_cast<std::uint8_t*>(stored->payload.data()), stored->payload.size(), std::const_pointer_cast<store::Chunk>(stored));
  return out;
}

void NodeService::CountGet(std::uint64_t chunks, std::uint64_t misses, std::uint64_t bytes, std::uint64_t tokens,
                           double micros) {
  get_chunks_ += chunks - misses;
  get_misses_ += misses;
  get_bytes_ += bytes;
  hit_tokens_ += tokens;
  get_us_.Record(micros);
}

NodeError NodeService::Put(const keys::Digest& ns, std::span<const std::uint8_t> envelope) {
  if (draining_) return {ErrorCode::UNAVAILABLE, "the node is shutting down"};
  Result<store::ChunkRef> chunk = wire::DecodeEnvelope(envelope.data(), envelope.size(), nullptr);
  if (!chunk.ok()) {
    ++put_refused_;
    return {chunk.status().code() == Code::kUnsupported ? ErrorCode::INVALID_ARGUMENT : ErrorCode::CORRUPT,
            "envelope: " + chunk.status().message()};
  }
  const store::ChunkRef& c = *chunk;
  if (c->meta.ns_hash != ns) {
    ++put_refused_;
    return {ErrorCode::PERMISSION_DENIED, "envelope: its namespace is not the call's"};
  }
  const keys::Digest key = c->meta.key;
  auto filed = std::make_shared<store::Chunk>();
  filed->meta = c->meta;
  filed->meta.key = ObjectKey(ns, key);
  filed->payload = store::Payload::Adopt(const_cast<std::uint8_t*>(c->payload.data()), c->payload.size(), std::const_pointer_cast<store::Chunk>(c));
  Status st = chain_->Put(filed);
  if (!st.ok()) {
    ++put_refused_;
    return {st.code() == Code::kBusy ? ErrorCode::BUSY : ErrorCode::INTERNAL, st.message()};
  }
  ++put_chunks_;
  put_bytes_ += envelope.size();
  if (KvEventPublisher* events = events_.load()) {
    {
      std::lock_guard<std::mutex> lock(client_keys_mu_);
      client_keys_[filed->meta.key] = key;
    }
    events->BlockStored({std::vector<std::uint8_t>(key.begin(), key.end())}, std::nullopt, {}, c->meta.tokens);
  }
  return {};
}

void NodeService::Dropped(const keys::Digest& object) {
  KvEventPublisher* events = events_.load();
  if (!events) return;
  keys::Digest key;
  {
    std::lock_guard<std::mutex> lock(client_keys_mu_);
    auto it = client_keys_.find(object);
    if (it == client_keys_.end()) return;
    key = it->second;
    client_keys_.erase(it);
  }
  events->BlockRemoved({std::vector<std::uint8_t>(key.begin(), key.end())});
}

std::uint32_t NodeService::Delete(const keys::Digest& ns, std::span<const keys::Digest> keys) {
  std::uint32_t n = 0;
  std::vector<std::vector<std::uint8_t>> removed;
  for (const keys::Digest& k : keys) {
    const keys::Digest object = ObjectKey(ns, k);
    if (chain_->Erase(object)) {
      ++n;
      removed.emplace_back(k.begin(), k.end());
      std::lock_guard<std::mutex> lock(client_keys_mu_);
      client_keys_.erase(object);
    }
  }
  deletes_ += n;
  if (KvEventPublisher* events = events_.load(); events && !removed.empty()) events->BlockRemoved(std::move(removed));
  return n;
}

std::uint32_t NodeService::Pin(const keys::Digest& ns, std::span<const keys::Digest> keys, std::uint64_t ttl_ms) {
  std::uint32_t n = 0;
  const std::int64_t ttl_ns =
      ttl_ms > static_cast<std::uint64_t>(INT64_MAX / 1000000) ? INT64_MAX : static_cast<std::int64_t>(ttl_ms * 1000000);
  for (const keys::Digest& k : keys) n += chain_->Pin(ObjectKey(ns, k), ttl_ns).ok() ? 1 : 0;
  return n;
}

std::uint32_t NodeService::Unpin(const keys::Digest& ns, std::span<const keys::Digest> keys) {
  std::uint32_t n = 0;
  for (const keys::Digest& k : keys) n += chain_->Unpin(ObjectKey(ns, k)) ? 1 : 0;
  return n;
}

std::uint64_t NodeService::uptime_ms() const {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_).count());
}

NodeStats NodeService::Stats() const {
  NodeStats s;
  s.time_ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  s.uptime_ms = uptime_ms();
  const std::vector<store::LevelStats> levels = chain_->Stats();
  for (size_t i = 0; i < levels.size(); ++i) {
    const store::LevelStats& l = levels[i];
    TierStatsSnapshot t;
    t.name = l.name;
    t.kind = i < specs_.size() ? KindName(specs_[i].kind) : "unknown";
    t.codec = l.codec;
    t.objects = l.objects;
    t.used_bytes = l.used_bytes;
    t.capacity_bytes = l.capacity_bytes;
    t.hits = l.hits;
    t.misses = l.misses;
    t.puts = l.puts;
    t.evictions = l.evictions;
    t.demotions_in = l.demotions_in;
    t.promotions_in = l.promotions_in;
    t.corrupt_detected = l.corrupt_detected;
    t.bytes_in = l.bytes_in;
    t.bytes_out = l.bytes_out;
    if (i < specs_.size()) {
      t.high_watermark = specs_[i].high_watermark;
      t.low_watermark = specs_[i].low_watermark;
    }
    s.tiers.push_back(std::move(t));
  }
  s.lookups = lookups_;
  s.requested_tokens = requested_tokens_;
  s.hit_tokens = hit_tokens_;
  s.lookup_hit_tokens = lookup_hit_tokens_;
  s.get_chunks = get_chunks_;
  s.get_misses = get_misses_;
  s.get_bytes = get_bytes_;
  s.put_chunks = put_chunks_;
  s.put_bytes = put_bytes_;
  s.put_refused = put_refused_;
  s.deletes = deletes_;
  s.auth_failures = auth_failures_;
  s.sessions = static_cast<std::uint64_t>(std::max<std::int64_t>(0, sessions_.load()));
  s.lookup_us = Latency(lookup_us_);
  s.get_us = Latency(get_us_);
  s.put_us = Latency(put_us_);
  s.ttft_saved_ms = static_cast<double>(s.hit_tokens) * prefill_us_per_token_ / 1000.0;
  return s;
}

// ---- Wire form of the statistics ------------------------------------------------

namespace {

void ToWire(const LatencySnapshot& l, wire::node::Latency::Builder out) {
  out.setCount(l.summary.count);
  out.setSumUs(l.summary.sum);
  out.setP50Us(l.summary.p50);
  out.setP90Us(l.summary.p90);
  out.setP99Us(l.summary.p99);
  out.setMaxUs(l.summary.max);
}

LatencySnapshot FromWire(wire::node::Latency::Reader in) {
  LatencySnapshot l;
  l.summary.count = in.getCount();
  l.summary.sum = in.getSumUs();
  l.summary.p50 = in.getP50Us();
  l.summary.p90 = in.getP90Us();
  l.summary.p99 = in.getP99Us();
  l.summary.max = in.getMaxUs();
  return l;
}

}  // namespace

void ToWire(const NodeStats& s, wire::node::Stats::Builder out) {
  out.setTimeMs(s.time_ms);
  out.setUptimeMs(s.uptime_ms);
  auto tiers = out.initTiers(static_cast<unsigned>(s.tiers.size()));
  for (unsigned i = 0; i < s.tiers.size(); ++i) {
    const TierStatsSnapshot& t = s.tiers[i];
    auto b = tiers[i];
    b.setName(t.name);
    b.setKind(t.kind);
    b.setCodec(t.codec);
    b.setObjects(t.objects);
    b.setUsedBytes(t.used_bytes);
    b.setCapacityBytes(t.capacity_bytes);
    b.setHits(t.hits);
    b.setMisses(t.misses);
    b.setPuts(t.puts);
    b.setEvictions(t.evictions);
    b.setDemotionsIn(t.demotions_in);
    b.setPromotionsIn(t.promotions_in);
    b.setCorruptDetected(t.corrupt_detected);
    b.setBytesIn(t.bytes_in);
    b.setBytesOut(t.bytes_out);
    b.setHighWatermark(t.high_watermark);
    b.setLowWatermark(t.low_watermark);
  }
  out.setLookups(s.lookups);
  out.setRequestedTokens(s.requested_tokens);
  out.setHitTokens(s.hit_tokens);
  out.setLookupHitTokens(s.lookup_hit_tokens);
  out.setGetChunks(s.get_chunks);
  out.setGetMisses(s.get_misses);
  out.setGetBytes(s.get_bytes);
  out.setPutChunks(s.put_chunks);
  out.setPutBytes(s.put_bytes);
  out.setPutRefused(s.put_refused);
  out.setDeletes(s.deletes);
  out.setAuthFailures(s.auth_failures);
  out.setSessions(s.sessions);
  ToWire(s.lookup_us, out.initLookupUs());
  ToWire(s.get_us, out.initGetUs());
  ToWire(s.put_us, out.initPutUs());
  out.setTtftSavedMs(s.ttft_saved_ms);
}

NodeStats FromWire(wire::node::Stats::Reader in) {
  NodeStats s;
  s.time_ms = in.getTimeMs();
  s.uptime_ms = in.getUptimeMs();
  for (auto t : in.getTiers()) {
    TierStatsSnapshot x;
    x.name = t.getName();
    x.kind = t.getKind();
    x.codec = t.getCodec();
    x.objects = t.getObjects();
    x.used_bytes = t.getUsedBytes();
    x.capacity_bytes = t.getCapacityBytes();
    x.hits = t.getHits();
    x.misses = t.getMisses();
    x.puts = t.getPuts();
    x.evictions = t.getEvictions();
    x.demotions_in = t.getDemotionsIn();
    x.promotions_in = t.getPromotionsIn();
    x.corrupt_detected = t.getCorruptDetected();
    x.bytes_in = t.getBytesIn();
    x.bytes_out = t.getBytesOut();
    x.high_watermark = t.getHighWatermark();
    x.low_watermark = t.getLowWatermark();
    s.tiers.push_back(std::move(x));
  }
  s.lookups = in.getLookups();
  s.requested_tokens = in.getRequestedTokens();
  s.hit_tokens = in.getHitTokens();
  s.lookup_hit_tokens = in.getLookupHitTokens();
  s.get_chunks = in.getGetChunks();
  s.get_misses = in.getGetMisses();
  s.get_bytes = in.getGetBytes();
  s.put_chunks = in.getPutChunks();
  s.put_bytes = in.getPutBytes();
  s.put_refused = in.getPutRefused();
  s.deletes = in.getDeletes();
  s.auth_failures = in.getAuthFailures();
  s.sessions = in.getSessions();
  s.lookup_us = FromWire(in.getLookupUs());
  s.get_us = FromWire(in.getGetUs());
  s.put_us = FromWire(in.getPutUs());
  s.ttft_saved_ms = in.getTtftSavedMs();
  return s;
}

// ---- Cap'n Proto ----------------------------------------------------------------

namespace {

using wire::node::KdnNode;
using wire::node::Session;

void SetError(wire::node::Error::Builder b, const NodeError& e) {
  b.setCode(e.code);
  b.setMessage(e.message);
}

// Reads a list of keys; false (with the error set) when one is not 32 bytes
// or there are too many.
bool ReadKeys(capnp::List<capnp::Data>::Reader in, std::vector<keys::Digest>& out, NodeError& error) {
  if (in.size() > wire::node::MAX_KEYS_PER_CALL) {
    error = {ErrorCode::TOO_LARGE, "more than " + std::to_string(wire::node::MAX_KEYS_PER_CALL) + " keys in one call"};
    return false;
  }
  out.resize(in.size());
  for (unsigned i = 0; i < in.size(); ++i) {
    if (!ToDigest(in[i], out[i])) {
      error = {ErrorCode::INVALID_ARGUMENT, "key " + std::to_string(i) + ": expected 32 bytes, got " +
                                                std::to_string(in[i].size())};
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
  NodeError NamespaceAndKeys(Params params, keys::Digest& ns, std::vector<keys::Digest>& keys) {
    NodeError error;
    auto nsb = params.getNamespace();
    if (ReadKeys(params.getKeys(), keys, error)) error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
    return error;
  }

  SessionImpl(NodeService& service, kj::Timer& timer, const Grant& grant)
      : service_(service), timer_(timer), grant_(grant) {
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
               {ErrorCode::INVALID_ARGUMENT, std::string("malformed request: ") + e->getDescription().cStr()});
      return kj::READY_NOW;
    }
    return kj::mv(KJ_ASSERT_NONNULL(done));
  }

  kj::Promise<void> lookup(LookupContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      auto requests = params.getRequests();
      NodeError error;
      std::vector<std::vector<keys::Digest>> keys(requests.size());
      std::vector<std::uint64_t> tokens(requests.size());
      std::uint64_t total = 0;
      for (unsigned r = 0; r < requests.size() && error.ok(); ++r) {
        total += requests[r].getKeys().size();
        if (total > wire::node::MAX_KEYS_PER_CALL) {
          error = {ErrorCode::TOO_LARGE, "more than " + std::to_string(wire::node::MAX_KEYS_PER_CALL) + " keys in one call"};
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
      NodeError error = NamespaceAndKeys(params, ns, keys);
      std::vector<store::ChunkRef> chunks;
      std::uint64_t words = 16, misses = 0, bytes = 0, tokens = 0;
      if (error.ok()) {
        chunks.reserve(keys.size());
        for (const keys::Digest& k : keys) {
          chunks.push_back(service_.Get(ns, k));
          if (chunks.back()) {
            const std::uint64_t size = wire::EncodedEnvelopeSize(chunks.back()->payload.size());
            words += size / 8 + 4;
            bytes += size;
            tokens += chunks.back()->meta.tokens;
          } else {
            ++misses;
          }
        }
      }
      // One segment sized for every envelope: each is encoded straight into
      // the reply (a word-aligned, zeroed Data), one copy of its payload.
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
        const std::uint64_t size = wire::EncodedEnvelopeSize(chunks[i]->payload.size());
        auto data = list[i].initEnvelope(static_cast<unsigned>(size));
        Status st = wire::EncodeEnvelopeInto(*chunks[i], data.begin(), size);
        if (!st.ok()) {  // cannot happen for a chunk that decoded on put; a miss all the same
          list[i].setMissing();
          ++misses;
        }
      }
      service_.CountGet(keys.size(), misses, bytes, tokens, MicrosSince(t0));
      return kj::READY_NOW;
    });
  }

  kj::Promise<void> put(PutContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      const auto t0 = std::chrono::steady_clock::now();
      auto params = context.getParams();
      auto envelopes = params.getEnvelopes();
      auto results = context.getResults();
      NodeError error;
      keys::Digest ns{};
      auto nsb = params.getNamespace();
      if (envelopes.size() > wire::node::MAX_KEYS_PER_CALL) {
        error = {ErrorCode::TOO_LARGE, "too many envelopes in one call"};
      } else {
        error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
      }
      SetError(results.initError(), error);
      if (!error.ok()) return kj::READY_NOW;
      auto list = results.initResults(envelopes.size());
      for (unsigned i = 0; i < envelopes.size(); ++i) {
        auto e = envelopes[i];
        NodeError r = e.size() > wire::node::MAX_ENVELOPE_BYTES
                          ? NodeError{ErrorCode::TOO_LARGE, "envelope larger than the node takes"}
                          : service_.Put(ns, {e.begin(), e.size()});
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
      NodeError error = NamespaceAndKeys(params, ns, keys);
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

  // A statistics call: refused without the grant, else `act`.
  template <typename Context, typename Act>
  kj::Promise<void> StatsCall(Context& context, Act&& act) {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto results = context.getResults();
      if (!grant_.stats) {
        service_.CountAuthFailure();
        SetError(results.initError(), {ErrorCode::PERMISSION_DENIED, "this token does not grant statistics"});
        return kj::READY_NOW;
      }
      SetError(results.initError(), {});
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
};

class NodeImpl final : public KdnNode::Server {
 public:
  NodeImpl(NodeService& service, kj::Timer& timer, std::string version)
      : service_(service), timer_(timer), version_(std::move(version)) {}

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
      SetError(results.initError(), {ErrorCode::UNAUTHENTICATED, "unknown token"});
      return kj::READY_NOW;
    }
    SetError(results.initError(), {});
    results.setSession(kj::heap<SessionImpl>(service_, timer_, *grant));
    return kj::READY_NOW;
  }

 private:
  NodeService& service_;
  kj::Timer& timer_;
  std::string version_;
};

}  // namespace

capnp::Capability::Client MakeNodeBootstrap(NodeService& service, kj::Timer& timer, const std::string& version) {
  return kj::heap<NodeImpl>(service, timer, version);
}

wire::node::Session::Client MakeSession(NodeService& service, kj::Timer& timer, const Grant& grant) {
  return kj::heap<SessionImpl>(service, timer, grant);
}

}  // namespace kdn::server
