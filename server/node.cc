#include "server/node.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/timer.h>

#include "server/kv_events.h"
#include "server/tier_limits.h"
#include "core/knowledge/record_file.h"
#include "core/util/clock.h"
#include "core/wire/envelope.h"

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

std::uint64_t WallMs() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

std::string KindName(store::TierSpec::Kind k) {
  switch (k) {
    case store::TierSpec::Kind::kHost: return "host";
    case store::TierSpec::Kind::kDevice: return "device";
    case store::TierSpec::Kind::kDisk: return "disk";
    case store::TierSpec::Kind::kRemote: return "remote";
    case store::TierSpec::Kind::kRedis: return "redis";
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
  s->tier_limits_.assign(s->specs_.size(), 0.0);
  if (options.measure_tiers) {
    // After the tiers are open (a disk tier's tmp/ exists then), before the
    // node serves: the measurement has the disk to itself.
    std::vector<std::string> names;
    for (const store::LevelStats& l : s->chain_->Stats()) names.push_back(l.name);
    s->tier_limits_ = MeasureTierLimits(s->specs_, names);
  }
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
  s->knowledge_config_ = options.knowledge;
  for (const store::TierSpec& spec : s->specs_) {
    if (spec.kind == store::TierSpec::Kind::kDisk) {
      s->knowledge_path_ = spec.path + "/knowledge.kdnreg";
      break;
    }
  }
  if (!s->knowledge_path_.empty()) {
    s->LoadKnowledge();
    s->saver_ = std::make_unique<store::DebouncedSaver>(
        std::chrono::milliseconds(options.knowledge_save_delay_ms), [p = s.get()] { return p->SaveKnowledge(); },
        [](const Status& st) { std::fprintf(stderr, "kdnd: %s\n", st.message().c_str()); });
  }
  return s;
}

NodeService::~NodeService() {
  if (saver_) {
    saver_->Stop();
    // The last word: what changed since the saver's last save, and the hits
    // counted since (they alone never wake the saver).
    if (saver_->dirty() || hits_changed_.load()) {
      if (Status st = SaveKnowledge(); !st.ok()) std::fprintf(stderr, "kdnd: %s\n", st.message().c_str());
    }
  }
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

void NodeService::SetEventPublisher(KvEventPublisher* publisher) {
  events_ = publisher;
  if (!publisher) return;
  std::uint64_t held = 0;
  for (size_t i = 0; i < chain_->levels(); ++i) held += chain_->tier(i).objects();
  if (held != 0) publisher->AllBlocksCleared();
}

void NodeService::Learned(const keys::Digest& object, const keys::Digest& key, std::uint32_t tokens) {
  KvEventPublisher* events = events_.load();
  if (!events) return;
  {
    std::lock_guard<std::mutex> lock(client_keys_mu_);
    if (!client_keys_.emplace(object, key).second) return;  // known: announced when it was put
  }
  events->BlockStored({std::vector<std::uint8_t>(key.begin(), key.end())}, std::nullopt, {}, tokens);
}

store::ChunkRef NodeService::Get(const keys::Digest& ns, const keys::Digest& key) {
  const keys::Digest object = ObjectKey(ns, key);
  Result<store::Lease> lease = chain_->Get(object);
  if (!lease.ok()) return nullptr;
  store::ChunkRef stored = lease->chunk();
  Learned(object, key, stored->meta.tokens);
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
  if (pinned_documents_.load(std::memory_order_relaxed) != 0) {
    // A chunk of a pinned document that arrives after the pin is pinned now.
    std::lock_guard<std::mutex> lock(knowledge_mu_);
    const NsKey k{ns, key};
    if (pins_.Pinned(k)) ApplyPinLocked(k);
  }
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
      t.limit_bytes_per_s = tier_limits_[i];
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
  s.documents = documents_.load();
  s.registry_load_failures = registry_load_failures_.load();
  return s;
}

// ---- Knowledge items ------------------------------------------------------------

static_assert(kMaxKeysPerDocument == wire::node::MAX_KEYS_PER_CALL, "config.h's bound must be the schema's");

void NodeService::LinkLocked(const keys::Digest& ns, Doc& doc) {
  for (const keys::Digest& k : doc.distinct) refs_[NsKey{ns, k}].push_back(&doc);
  total_keys_ += doc.item.keys.size();
}

void NodeService::UnlinkLocked(const keys::Digest& ns, Doc& doc) {
  for (const keys::Digest& k : doc.distinct) {
    auto it = refs_.find(NsKey{ns, k});
    if (it == refs_.end()) continue;
    std::vector<Doc*>& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), &doc), v.end());
    if (v.empty()) refs_.erase(it);
  }
  total_keys_ -= doc.item.keys.size();
}

void NodeService::AddPinsLocked(const keys::Digest& ns, const Doc& doc) {
  if (!doc.pinned) return;
  for (const keys::Digest& k : doc.distinct) pins_.Add(NsKey{ns, k}, doc.pin_deadline_ms);
  ++pinned_documents_;
}

void NodeService::RemovePinsLocked(const keys::Digest& ns, const Doc& doc) {
  if (!doc.pinned) return;
  for (const keys::Digest& k : doc.distinct) pins_.Remove(NsKey{ns, k}, doc.pin_deadline_ms);
  --pinned_documents_;
}

bool NodeService::ApplyPinLocked(const NsKey& k) {
  const keys::Digest object = ObjectKey(k.ns, k.key);
  const std::optional<std::uint64_t> pin = pins_.Effective(k);  // 0 wins, else the latest deadline
  if (!pin) {
    chain_->Unpin(object);
    return false;
  }
  const std::uint64_t deadline = *pin;
  if (deadline == 0) return chain_->PinUntil(object, 0).ok();
  const std::uint64_t now = WallMs();
  if (deadline <= now) {
    chain_->Unpin(object);
    return false;
  }
  // The registry keeps wall-clock deadlines (they survive a restart); the
  // chain wants its own clock's.
  const std::uint64_t left_ms = deadline - now;
  const std::int64_t left_ns = left_ms > static_cast<std::uint64_t>(INT64_MAX / 1000000)
                                   ? INT64_MAX
                                   : static_cast<std::int64_t>(left_ms * 1000000);
  return chain_->PinUntil(object, store::DeadlineAfter(chain_->clock().NowNs(), left_ns)).ok();
}

NodeError NodeService::KnowledgePut(const keys::Digest& ns, KnowledgeDoc item) {
  if (draining_) return {ErrorCode::UNAVAILABLE, "the node is shutting down"};
  if (item.doc_id.empty()) return {ErrorCode::INVALID_ARGUMENT, "knowledge item: docId is empty"};
  if (item.doc_id.size() > wire::node::MAX_DOC_ID_BYTES) {
    return {ErrorCode::TOO_LARGE, "knowledge item: docId of " + std::to_string(item.doc_id.size()) +
                                      " bytes (at most " + std::to_string(wire::node::MAX_DOC_ID_BYTES) + ")"};
  }
  if (item.metadata.size() > wire::node::MAX_METADATA_BYTES) {
    return {ErrorCode::TOO_LARGE, "knowledge item: metadata of " + std::to_string(item.metadata.size()) +
                                      " bytes (at most " + std::to_string(wire::node::MAX_METADATA_BYTES) + ")"};
  }
  if (item.keys.size() > knowledge_config_.max_keys_per_document) {
    return {ErrorCode::TOO_LARGE, "knowledge item: " + std::to_string(item.keys.size()) + " keys (this node takes at most " +
                                      std::to_string(knowledge_config_.max_keys_per_document) +
                                      " per document: [knowledge] max_keys_per_document)"};
  }
  auto doc = std::make_unique<Doc>();
  doc->item = std::move(item);
  {
    std::unordered_set<keys::Digest, keys::DigestHash> seen;
    for (const keys::Digest& k : doc->item.keys) {
      if (seen.insert(k).second) doc->distinct.push_back(k);
    }
  }
  {
    std::lock_guard<std::mutex> lock(knowledge_mu_);
    const DocKey dk{ns, doc->item.model, doc->item.doc_id};
    auto it = docs_.find(dk);
    Doc* old = it == docs_.end() ? nullptr : it->second.get();
    if (!old && docs_.size() >= knowledge_config_.max_documents) {
      return {ErrorCode::BUSY, "the node holds " + std::to_string(docs_.size()) +
                                   " documents, its most ([knowledge] max_documents); delete some first"};
    }
    const std::uint64_t keys_after = total_keys_ - (old ? old->item.keys.size() : 0) + doc->item.keys.size();
    if (keys_after > knowledge_config_.max_keys) {
      return {ErrorCode::BUSY, "the node's documents would have " + std::to_string(keys_after) + " keys, more than " +
                                   std::to_string(knowledge_config_.max_keys) +
                                   " ([knowledge] max_keys); delete some documents first"};
    }
    if (old && old->item.version == doc->item.version && old->item.keys == doc->item.keys) {
      // The same version again (an engine registering what it registered
      // before a restart): its registration time, hits and pin stand.
      old->item.metadata = std::move(doc->item.metadata);
      old->item.tokens = doc->item.tokens;
    } else {
      doc->registered_ms = WallMs();
      // A pin is the operator's choice about the document, not about one
      // version of it: it carries over to the new chunks. The new pins are
      // applied before the old ones are withdrawn, so chunks both versions
      // share stay pinned throughout.
      if (old) {
        doc->pinned = old->pinned;
        doc->pin_deadline_ms = old->pin_deadline_ms;
      }
      LinkLocked(ns, *doc);
      AddPinsLocked(ns, *doc);
      if (doc->pinned) {
        for (const keys::Digest& k : doc->distinct) ApplyPinLocked(NsKey{ns, k});
      }
      std::unique_ptr<Doc> replaced;
      if (old) {
        replaced = std::move(it->second);
        it->second = std::move(doc);
        UnlinkLocked(ns, *replaced);
        RemovePinsLocked(ns, *replaced);
        if (replaced->pinned) {
          for (const keys::Digest& k : replaced->distinct) ApplyPinLocked(NsKey{ns, k});
        }
      } else {
        docs_.emplace(dk, std::move(doc));
      }
      documents_ = docs_.size();
    }
  }
  MarkKnowledgeDirty();
  return {};
}

std::vector<KnowledgeDocInfo> NodeService::KnowledgeList(const keys::Digest& ns) {
  std::vector<KnowledgeDocInfo> out;
  std::vector<std::vector<keys::Digest>> doc_keys;
  const std::uint64_t now = WallMs();
  {
    std::lock_guard<std::mutex> lock(knowledge_mu_);
    // Ordered by namespace first: the walk covers this namespace's documents only.
    for (auto it = docs_.lower_bound(DocKey{ns, keys::Digest{}, std::string()});
         it != docs_.end() && std::get<0>(it->first) == ns; ++it) {
      const Doc& d = *it->second;
      KnowledgeDocInfo info;
      info.doc_id = d.item.doc_id;
      info.version = d.item.version;
      info.metadata = d.item.metadata;
      info.tokens = d.item.tokens;
      info.model = d.item.model;
      info.chunks = static_cast<std::uint32_t>(d.item.keys.size());
      info.pinned = d.pinned && (d.pin_deadline_ms == 0 || d.pin_deadline_ms > now);
      info.pin_expires_ms = d.pinned ? d.pin_deadline_ms : 0;
      info.registered_ms = d.registered_ms;
      info.hits = d.hits;
      out.push_back(std::move(info));
      doc_keys.push_back(d.item.keys);
    }
  }
  // Which chunks the tiers hold, outside the registry's lock (a list may
  // look at many keys; gets must not wait for it).
  for (size_t i = 0; i < out.size(); ++i) {
    std::uint32_t held = 0;
    for (const keys::Digest& k : doc_keys[i]) held += chain_->Locate(ObjectKey(ns, k)) >= 0 ? 1 : 0;
    out[i].chunks_held = held;
  }
  return out;
}

NodeError NodeService::KnowledgePin(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id,
                                    bool pin, std::uint64_t ttl_ms, std::uint32_t& pinned) {
  pinned = 0;
  {
    std::lock_guard<std::mutex> lock(knowledge_mu_);
    auto it = docs_.find(DocKey{ns, model, doc_id});
    if (it == docs_.end()) return {ErrorCode::NOT_FOUND, "no document '" + doc_id + "' of that model in this namespace"};
    Doc& d = *it->second;
    const bool was = d.pinned;
    RemovePinsLocked(ns, d);
    d.pinned = pin;
    if (pin) {
      // Pinning again replaces the document's deadline.
      const std::uint64_t now = WallMs();
      d.pin_deadline_ms = ttl_ms == 0 ? 0 : (ttl_ms > UINT64_MAX - now ? UINT64_MAX : now + ttl_ms);
    } else {
      d.pin_deadline_ms = 0;
    }
    AddPinsLocked(ns, d);
    if (pin || was) {
      for (const keys::Digest& k : d.distinct) pinned += ApplyPinLocked(NsKey{ns, k}) ? 1 : 0;
    }
  }
  MarkKnowledgeDirty();
  return {};
}

NodeError NodeService::KnowledgeDelete(const keys::Digest& ns, const keys::Digest& model, const std::string& doc_id,
                                       std::uint32_t& erased) {
  erased = 0;
  {
    std::lock_guard<std::mutex> lock(knowledge_mu_);
    auto it = docs_.find(DocKey{ns, model, doc_id});
    if (it == docs_.end()) return {ErrorCode::NOT_FOUND, "no document '" + doc_id + "' of that model in this namespace"};
    Doc& d = *it->second;
    RemovePinsLocked(ns, d);
    UnlinkLocked(ns, d);
    std::vector<keys::Digest> unshared;
    for (const keys::Digest& k : d.distinct) {
      const NsKey nk{ns, k};
      if (refs_.count(nk) != 0) {
        if (d.pinned) ApplyPinLocked(nk);  // another document holds it: its pins alone now
        continue;
      }
      unshared.push_back(k);
    }
    docs_.erase(it);
    documents_ = docs_.size();
    // Under the registry's lock: a document registered meanwhile cannot
    // claim a chunk that is about to go. Delete counts, unpins and publishes
    // the removals as a delete call does.
    erased = Delete(ns, unshared);
  }
  MarkKnowledgeDirty();
  return {};
}

void NodeService::CreditKnowledgeHits(const keys::Digest& ns, std::span<const keys::Digest> served) {
  if (served.empty() || documents_.load(std::memory_order_relaxed) == 0) return;
  bool any = false;
  std::lock_guard<std::mutex> lock(knowledge_mu_);
  for (const keys::Digest& k : served) {
    auto it = refs_.find(NsKey{ns, k});
    if (it == refs_.end()) continue;
    for (Doc* d : it->second) ++d->hits;
    any = true;
  }
  if (any) hits_changed_ = true;
}

void NodeService::MarkKnowledgeDirty() {
  if (saver_) saver_->Mark();
}

// ---- The registry file ----------------------------------------------------------
//
// A record file (knowledge/record_file.h): magic "kdnreg\r\n", format version 1,
// domain "kdnd-registry-v1"; payload: u64 documents, then per document:
//     namespace hash (32), model (32), u32 + docId bytes, u64 version,
//     u32 + metadata bytes, u64 tokens, u64 registeredMs, u64 hits,
//     u8 pinned, u64 pin deadline (wall ms; 0: none), u32 keys, 32 bytes each
// Integers little-endian. Written to knowledge.kdnreg.tmp, fsynced, renamed
// over knowledge.kdnreg, and the directory fsynced: a crash leaves the old
// file or the new one, whole.

namespace {

constexpr store::RecordFormat kRegistryFormat{{'k', 'd', 'n', 'r', 'e', 'g', '\r', '\n'}, 1, "kdnd-registry-v1"};

}  // namespace

std::string NodeService::SerializeKnowledge() {
  store::RecordWriter w;
  std::lock_guard<std::mutex> lock(knowledge_mu_);
  w.U64(docs_.size());
  for (const auto& [key, doc] : docs_) {
    const KnowledgeDoc& it = doc->item;
    w.Digest(std::get<0>(key));
    w.Digest(it.model);
    w.Str(it.doc_id);
    w.U64(it.version);
    w.Str(it.metadata);
    w.U64(it.tokens);
    w.U64(doc->registered_ms);
    w.U64(doc->hits);
    w.U8(doc->pinned ? 1 : 0);
    w.U64(doc->pin_deadline_ms);
    w.U32(static_cast<std::uint32_t>(it.keys.size()));
    for (const keys::Digest& k : it.keys) w.Digest(k);
  }
  return w.bytes();
}

Status NodeService::SaveKnowledge() {
  if (knowledge_path_.empty()) return Status::Ok();
  std::lock_guard<std::mutex> file_lock(save_file_mu_);
  hits_changed_ = false;  // before the snapshot: hits counted after it mark it again
  const std::string payload = SerializeKnowledge();
  const Status st = store::WriteRecordFile(knowledge_path_, kRegistryFormat, payload);
  if (!st.ok()) return Status::Internal("knowledge registry: " + st.message());
  return Status::Ok();
}

Status NodeService::ParseKnowledge(std::span<const std::uint8_t> payload) {
  store::RecordReader r(payload);
  std::uint64_t count = 0;
  if (!r.U64(count)) return Status::Corrupt("truncated");
  std::uint64_t dropped = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    auto doc = std::make_unique<Doc>();
    keys::Digest ns{};
    KnowledgeDoc& it = doc->item;
    std::uint8_t pinned = 0;
    std::uint32_t nkeys = 0;
    if (!r.Digest(ns) || !r.Digest(it.model) || !r.Str(it.doc_id, wire::node::MAX_DOC_ID_BYTES) || !r.U64(it.version) ||
        !r.Str(it.metadata, wire::node::MAX_METADATA_BYTES) || !r.U64(it.tokens) || !r.U64(doc->registered_ms) ||
        !r.U64(doc->hits) || !r.U8(pinned) || !r.U64(doc->pin_deadline_ms) || !r.U32(nkeys) ||
        nkeys > wire::node::MAX_KEYS_PER_CALL || std::uint64_t{nkeys} * 32 > r.left()) {
      return Status::Corrupt("document " + std::to_string(i) + " is malformed");
    }
    it.keys.resize(nkeys);
    for (keys::Digest& k : it.keys) (void)r.Digest(k);
    if (it.doc_id.empty() || pinned > 1) return Status::Corrupt("document " + std::to_string(i) + " is malformed");
    doc->pinned = pinned == 1;
    if (doc->pinned && doc->pin_deadline_ms != 0 && doc->pin_deadline_ms <= WallMs()) {
      doc->pinned = false;  // the pin ran out while the node was down
      doc->pin_deadline_ms = 0;
    }
    // Bounds lowered since the file was written: what no longer fits is
    // left out (and said), the rest is served.
    DocKey dk{ns, it.model, it.doc_id};
    if (docs_.size() >= knowledge_config_.max_documents || it.keys.size() > knowledge_config_.max_keys_per_document ||
        total_keys_ + it.keys.size() > knowledge_config_.max_keys || docs_.count(dk) != 0) {
      ++dropped;
      continue;
    }
    std::unordered_set<keys::Digest, keys::DigestHash> seen;
    for (const keys::Digest& k : it.keys) {
      if (seen.insert(k).second) doc->distinct.push_back(k);
    }
    Doc& d = *doc;
    docs_.emplace(std::move(dk), std::move(doc));
    LinkLocked(ns, d);
    AddPinsLocked(ns, d);
  }
  if (r.left() != 0) return Status::Corrupt("bytes after the last document");
  if (dropped != 0) {
    std::fprintf(stderr, "kdnd: knowledge registry: %llu documents beyond the [knowledge] bounds left out\n",
                 static_cast<unsigned long long>(dropped));
  }
  return Status::Ok();
}

void NodeService::LoadKnowledge() {
  // The largest file the bounds allow, and then some: anything bigger is not ours.
  const std::uint64_t most = 8 + std::uint64_t{knowledge_config_.max_keys} * 32 +
                             std::uint64_t{knowledge_config_.max_documents} *
                                 (200 + wire::node::MAX_DOC_ID_BYTES + wire::node::MAX_METADATA_BYTES);
  auto file = store::ReadRecordFile(knowledge_path_, kRegistryFormat, most);
  if (!file.ok() && file.status().code() == Code::kNotFound) return;  // a new node
  std::lock_guard<std::mutex> lock(knowledge_mu_);
  const Status st = file.ok() ? ParseKnowledge(*file) : file.status();
  if (!st.ok()) {
    // Started empty, never stopped: the registry describes chunks, it does
    // not hold them. The file is set aside for a look, not overwritten.
    docs_.clear();
    refs_.clear();
    pins_.Clear();
    total_keys_ = 0;
    pinned_documents_ = 0;
    ++registry_load_failures_;
    const std::string aside = knowledge_path_ + ".bad";
    const std::string note = ::rename(knowledge_path_.c_str(), aside.c_str()) == 0 ? " (the file is now " + aside + ")" : "";
    std::fprintf(stderr, "kdnd: knowledge registry %s: %s; starting with no documents%s\n", knowledge_path_.c_str(),
                 st.message().c_str(), note.c_str());
    return;
  }
  documents_ = docs_.size();
  // Pins that were in force when the node stopped hold again, on the chunks
  // the tiers kept.
  pins_.ForEachKey([&](const NsKey& k) { ApplyPinLocked(k); });
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
      if (service_.knowledge_documents() != 0) {
        std::vector<keys::Digest> served;
        served.reserve(keys.size());
        for (unsigned i = 0; i < chunks.size(); ++i) {
          if (list[i].isEnvelope()) served.push_back(keys[i]);
        }
        service_.CreditKnowledgeHits(ns, served);
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

  // ---- Knowledge items (version 2) ----

  // A knowledge call's namespace (checked against the grant first, so a
  // refused call learns nothing of the namespace's documents), then its
  // docId and model.
  template <typename Params>
  NodeError NamespaceDocAndModel(Params params, keys::Digest& ns, std::string& doc_id, keys::Digest& model) {
    auto nsb = params.getNamespace();
    NodeError error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
    if (!error.ok()) return error;
    auto id = params.getDocId();
    if (id.size() == 0) return {ErrorCode::INVALID_ARGUMENT, "docId is empty"};
    if (id.size() > wire::node::MAX_DOC_ID_BYTES) {
      return {ErrorCode::TOO_LARGE, "docId longer than " + std::to_string(wire::node::MAX_DOC_ID_BYTES) + " bytes"};
    }
    doc_id.assign(id.begin(), id.size());
    if (!ToDigest(params.getModel(), model)) {
      return {ErrorCode::INVALID_ARGUMENT, "model: expected a 32-byte fingerprint, got " +
                                               std::to_string(params.getModel().size()) + " bytes"};
    }
    return {};
  }

  kj::Promise<void> knowledgePut(KnowledgePutContext context) override {
    return Guard(context, [&]() -> kj::Promise<void> {
      auto params = context.getParams();
      auto results = context.getResults();
      keys::Digest ns{};
      auto nsb = params.getNamespace();
      NodeError error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
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
          error = {ErrorCode::INVALID_ARGUMENT, "model: expected a 32-byte fingerprint, got " +
                                                    std::to_string(item.getModel().size()) + " bytes"};
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
      NodeError error = service_.CheckNamespace(grant_, {nsb.begin(), nsb.size()}, ns);
      std::vector<KnowledgeDocInfo> docs;
      std::uint64_t words = 8;
      if (error.ok()) {
        docs = service_.KnowledgeList(ns);
        for (const KnowledgeDocInfo& d : docs) words += 16 + (d.doc_id.size() + d.metadata.size() + 2) / 8 + 2;
        // One reply must stay well under what a client reads (core/wire/rpc.h).
        constexpr std::uint64_t kMaxReplyWords = (std::uint64_t{128} << 20) / 8;
        if (words > kMaxReplyWords) {
          error = {ErrorCode::TOO_LARGE, std::to_string(docs.size()) +
                                             " documents with their metadata are more than one reply carries (128 MiB)"};
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
      NodeError error = NamespaceDocAndModel(params, ns, doc_id, model);
      std::uint32_t pinned = 0;
      if (error.ok()) error = service_.KnowledgePin(ns, model, doc_id, params.getPin(), params.getTtlMs(), pinned);
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
      NodeError error = NamespaceDocAndModel(params, ns, doc_id, model);
      std::uint32_t erased = 0;
      if (error.ok()) error = service_.KnowledgeDelete(ns, model, doc_id, erased);
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
