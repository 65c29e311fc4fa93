// SPDX-License-Identifier: Apache-2.0
#include "server/service.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "server/kv_events.h"
#include "server/tier_limits.h"
#include "core/util/clock.h"
#include "core/wire/envelope.h"
#include "core/wire/seal.h"

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

LatencySnapshot Latency(const telemetry::Histogram& h) {
  LatencySnapshot s;
  s.summary = h.Snapshot();
  for (double b : kLatencyBoundsUs) s.buckets.push_back(h.CountAtOrBelow(b));
  return s;
}

// Where each tier statistic is in the chain's LevelStats.
constexpr std::pair<TierStat, std::uint64_t store::LevelStats::*> kLevelFields[] = {
    {TierStat::kObjects, &store::LevelStats::objects},
    {TierStat::kUsedBytes, &store::LevelStats::used_bytes},
    {TierStat::kCapacityBytes, &store::LevelStats::capacity_bytes},
    {TierStat::kHits, &store::LevelStats::hits},
    {TierStat::kMisses, &store::LevelStats::misses},
    {TierStat::kPuts, &store::LevelStats::puts},
    {TierStat::kEvictions, &store::LevelStats::evictions},
    {TierStat::kDemotionsIn, &store::LevelStats::demotions_in},
    {TierStat::kPromotionsIn, &store::LevelStats::promotions_in},
    {TierStat::kCorruptDetected, &store::LevelStats::corrupt_detected},
    {TierStat::kBytesIn, &store::LevelStats::bytes_in},
    {TierStat::kBytesOut, &store::LevelStats::bytes_out},
    {TierStat::kIoErrors, &store::LevelStats::io_errors},
};
static_assert(std::size(kLevelFields) == kTierStatCount, "every tier statistic comes from the chain");

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

// The `medium` of KV events about a tier's blocks, in vLLM's upper-case
// style ("GPU", "CPU" are vLLM's own; it says "STORAGE" for offloaded
// storage in general, kdnd names the kind).
std::string Medium(store::TierSpec::Kind k) {
  switch (k) {
    case store::TierSpec::Kind::kHost: return "CPU";
    case store::TierSpec::Kind::kDevice: return "GPU";
    case store::TierSpec::Kind::kDisk: return "DISK";
    case store::TierSpec::Kind::kRemote: return "REMOTE";
    case store::TierSpec::Kind::kRedis: return "REDIS";
  }
  return "CPU";
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
  to.on_level = [p = s.get()](const keys::Digest& object, size_t level, bool held) { p->LevelChanged(object, level, held); };
  to.clock = options.clock;
  std::shared_ptr<const wire::ChunkSealer> sealer;
  if (!options.secret_file.empty()) {
    auto sl = wire::ChunkSealer::FromFile(options.secret_file);
    if (!sl.ok()) return sl.status();
    sealer = std::move(sl).value();
    s->sealer_ = sealer;
  } else if (std::any_of(specs.begin(), specs.end(), [](const store::TierSpec& t) { return t.kind == store::TierSpec::Kind::kRedis; })) {
    std::fprintf(stderr, "kdnd: a redis tier without a secret (server.secret_file): whoever can write to its server "
                         "decides the KV this node serves (docs/security.md)\n");
  }
  auto cipher = wire::ChunkCipher::Load(options.encryption_key_file, options.encryption_key_env);
  if (!cipher.ok()) return cipher.status();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].codec.empty() && specs[i].codec != "raw") {
      return Status::InvalidArgument("tier " + std::to_string(i) +
                                     ": a node stores chunks as its clients encoded them; give codecs to the clients' remote tiers");
    }
    specs[i].codec = "raw";
    auto tier = store::MakeTier(specs[i], i, 0, nullptr, sealer, *cipher, /*node=*/true);
    if (!tier.ok()) return tier.status();
    to.levels.push_back(store::LevelFor(specs[i], std::move(tier).value()));
  }
  auto chain = store::TieredStore::Create(std::move(to));
  if (!chain.ok()) return chain.status();
  s->chain_ = std::move(chain).value();
  s->specs_ = std::move(specs);
  for (const store::TierSpec& spec : s->specs_) s->media_.push_back(Medium(spec.kind));
  s->tier_limits_.assign(s->specs_.size(), 0.0);
  if (options.measure_tiers) {
    // After the tiers are open (a disk tier's tmp/ exists then), before the
    // node serves: the measurement has the disk to itself.
    std::vector<std::string> names;
    for (const store::LevelStats& l : s->chain_->Stats()) names.push_back(l.name);
    s->tier_limits_ = MeasureTierLimits(s->specs_, names);
  }
  s->usage_ = std::make_unique<UsageBook>(options.max_usage_series);
  s->ReloadTokens(options.tokens);
  s->prefill_us_per_token_ = options.prefill_us_per_token;
  s->max_reply_bytes_ = options.max_reply_bytes;
  s->max_subscriptions_ = options.max_subscriptions;
  std::string registry_path;
  for (const store::TierSpec& spec : s->specs_) {
    if (spec.kind == store::TierSpec::Kind::kDisk) {
      registry_path = spec.path + "/knowledge.kdnreg";
      break;
    }
  }
  s->registry_ = std::make_unique<KnowledgeRegistry>(
      options.knowledge, std::move(registry_path), std::chrono::milliseconds(options.knowledge_save_delay_ms), *s->chain_,
      [p = s.get()](const keys::Digest& ns, std::span<const keys::Digest> keys) { return p->Delete(ns, keys); });
  return s;
}

NodeService::~NodeService() {
  registry_.reset();  // first: it saves what changed, and unpins nothing
  chain_.reset();     // then the chain: its mover may still report drops to the members below it
}

const Grant* NodeService::Authenticate(std::string_view token) {
  // Every token is compared, in constant time, over digests of equal size:
  // neither the time nor the order says which one (or how much of one) matched.
  const keys::Digest d = TokenDigest(token);
  const Grant* found = nullptr;
  for (const auto& [digest, grant] : grants_) {
    const bool same = CRYPTO_memcmp(digest.data(), d.data(), d.size()) == 0;
    if (same) found = grant.get();
  }
  if (!found) Count(NodeStat::kAuthFailures);
  return found;
}

bool NodeService::GrantsStats(std::string_view token) {
  const keys::Digest d = TokenDigest(token);
  std::lock_guard<std::mutex> lock(grants_mu_);
  const Grant* found = nullptr;
  for (const auto& [digest, grant] : grants_) {
    if (CRYPTO_memcmp(digest.data(), d.data(), d.size()) == 0) found = grant.get();
  }
  if (found != nullptr && found->stats) return true;
  Count(NodeStat::kAuthFailures);
  return false;
}

TokenReload NodeService::ReloadTokens(const std::vector<TokenGrant>& tokens) {
  std::lock_guard<std::mutex> lock(grants_mu_);
  TokenReload r;
  std::vector<std::pair<std::string, std::unique_ptr<Grant>>> next;
  for (const TokenGrant& t : tokens) {
    const keys::Digest d = TokenDigest(t.token);
    std::string digest(reinterpret_cast<const char*>(d.data()), d.size());
    std::unique_ptr<Grant> g;
    for (auto& [old_digest, old_grant] : grants_) {
      if (old_grant && old_digest == digest) g = std::move(old_grant);
    }
    (g ? r.kept : r.added) += 1;
    if (!g) g = std::make_unique<Grant>();
    g->name = t.name;
    g->stats = t.stats;
    g->all_namespaces = false;
    g->namespaces.clear();
    for (const std::string& ns : t.namespaces) {
      if (ns == "*") {
        g->all_namespaces = true;
      } else {
        g->namespaces.insert(keys::NamespaceHash(ns));
      }
    }
    next.emplace_back(std::move(digest), std::move(g));
  }
  for (auto& [digest, grant] : grants_) {
    if (!grant) continue;
    grant->revoked = true;
    grant->namespaces.clear();
    grant->all_namespaces = grant->stats = false;
    revoked_grants_.push_back(std::move(grant));
    ++r.revoked;
  }
  grants_ = std::move(next);
  std::unordered_map<keys::Digest, std::string, keys::DigestHash> names;
  for (const TokenGrant& t : tokens) {
    for (const std::string& ns : t.namespaces) {
      if (ns != "*") names.emplace(keys::NamespaceHash(ns), ns);
    }
  }
  usage_->SetNamespaceNames(std::move(names));
  return r;
}

Status NodeService::CheckNamespace(const Grant& g, std::span<const std::uint8_t> ns, keys::Digest& out) {
  if (ns.size() != out.size()) {
    return Status::InvalidArgument("namespace: expected a 32-byte SHA-256 of the namespace's name, got " +
                                   std::to_string(ns.size()) + " bytes");
  }
  std::memcpy(out.data(), ns.data(), out.size());
  if (!g.Allows(out)) {
    Count(NodeStat::kAuthFailures);
    if (g.revoked) return Status::PermissionDenied("this token was revoked (kdnd reloaded its tokens)");
    return Status::PermissionDenied("this token does not grant that namespace");
  }
  if (draining_) return Status::Unavailable("the node is shutting down");
  return Status::Ok();
}

Status NodeService::Lookup(const Grant& g, std::span<const std::uint8_t> ns_bytes,
                              const std::vector<std::vector<keys::Digest>>& requests,
                              std::span<const std::uint64_t> request_tokens, std::vector<std::uint32_t>& prefixes) {
  const auto t0 = std::chrono::steady_clock::now();
  keys::Digest ns{};
  KDN_RETURN_IF_ERROR(CheckNamespace(g, ns_bytes, ns));
  prefixes.assign(requests.size(), 0);
  for (size_t r = 0; r < requests.size(); ++r) {
    std::uint32_t n = 0;
    for (const keys::Digest& k : requests[r]) {
      if (chain_->Locate(ObjectKey(ns, k)) < 0) break;
      ++n;
    }
    prefixes[r] = n;
    Count(NodeStat::kLookups);
    const std::uint64_t tokens = r < request_tokens.size() ? request_tokens[r] : 0;
    Count(NodeStat::kRequestedTokens, tokens);
    if (tokens != 0 && !requests[r].empty()) {
      // Chunks are equal-sized but the last: the tokens found, pro rata.
      Count(NodeStat::kLookupHitTokens, n == requests[r].size() ? tokens : tokens * n / requests[r].size());
    }
  }
  lookup_us_.Record(MicrosSince(t0));
  return Status::Ok();
}

Status NodeService::Report(const Grant& g, std::span<const std::uint8_t> ns_bytes, const RequestReport& r) {
  keys::Digest ns{};
  KDN_RETURN_IF_ERROR(CheckNamespace(g, ns_bytes, ns));
  if (r.lookup_hit_tokens > r.lookup_tokens || r.load_hit_tokens > r.load_tokens) {
    return Status::InvalidArgument("report: more hit tokens than requested tokens");
  }
  Count(NodeStat::kEngineLookups, r.lookups);
  Count(NodeStat::kEngineLookupTokens, r.lookup_tokens);
  Count(NodeStat::kEngineLookupHitTokens, r.lookup_hit_tokens);
  Count(NodeStat::kEngineLoads, r.loads);
  Count(NodeStat::kEngineLoadTokens, r.load_tokens);
  Count(NodeStat::kEngineLoadHitTokens, r.load_hit_tokens);
  UsageCounts u;
  u.lookup_tokens = r.lookup_tokens;
  u.lookup_hit_tokens = r.lookup_hit_tokens;
  u.load_tokens = r.load_tokens;
  u.load_hit_tokens = r.load_hit_tokens;
  usage_->Add(ns, r.model, u);
  return Status::Ok();
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
    if (!client_keys_.emplace(object, ClientKey{key, tokens}).second) return;  // known: announced as it moved
  }
  // Where it is now, tier by tier. A move between the lookups and the
  // insertion above is announced by LevelChanged, which now knows the key.
  for (size_t i = 0; i < chain_->levels(); ++i) {
    if (chain_->ContainsAt(i, object)) events->BlockStored({std::vector<std::uint8_t>(key.begin(), key.end())}, std::nullopt, {}, tokens, media_[i]);
  }
}

void NodeService::LevelChanged(const keys::Digest& object, size_t level, bool held) {
  KvEventPublisher* events = events_.load();
  if (!events || level >= media_.size()) return;
  ClientKey ck;
  {
    std::lock_guard<std::mutex> lock(client_keys_mu_);
    auto it = client_keys_.find(object);
    if (it == client_keys_.end()) return;  // found at start, not served since: routers were told to forget it
    ck = it->second;
  }
  std::vector<std::vector<std::uint8_t>> hashes{std::vector<std::uint8_t>(ck.key.begin(), ck.key.end())};
  if (held) {
    events->BlockStored(std::move(hashes), std::nullopt, {}, ck.tokens, media_[level]);
  } else {
    events->BlockRemoved(std::move(hashes), media_[level]);
  }
}

store::ChunkRef NodeService::Get(const keys::Digest& ns, const keys::Digest& key) {
  const keys::Digest object = ObjectKey(ns, key);
  Result<store::Lease> lease = chain_->Get(object);
  if (!lease.ok()) return nullptr;
  store::ChunkRef stored = lease->chunk();
  Learned(object, key, stored->meta.tokens);
  UsageCounts u;
  u.get_bytes = stored->envelope ? stored->envelope_bytes : stored->payload.size();
  usage_->Add(ns, stored->meta.model, u);
  // The same payload (shared, not copied) under the caller's key.
  auto out = std::make_shared<store::Chunk>();
  out->meta = stored->meta;
  out->meta.key = key;
  out->payload = store::Payload::Adopt(const_cast<std::uint8_t*>(stored->payload.data()), stored->payload.size(), std::const_pointer_cast<store::Chunk>(stored));
  out->envelope = stored->envelope;  // put with the caller's key, which it holds
  out->envelope_bytes = stored->envelope_bytes;
  return out;
}

void NodeService::CountGet(std::uint64_t chunks, std::uint64_t misses, std::uint64_t bytes, std::uint64_t tokens,
                           double micros) {
  Count(NodeStat::kGetChunks, chunks - misses);
  Count(NodeStat::kGetMisses, misses);
  Count(NodeStat::kGetBytes, bytes);
  Count(NodeStat::kHitTokens, tokens);
  get_us_.Record(micros);
}

Status NodeService::Put(const keys::Digest& ns, std::span<const std::uint8_t> envelope, std::shared_ptr<void> owner) {
  if (draining_) return Status::Unavailable("the node is shutting down");
  // Where the envelope's bytes stay valid (an owner), it is copied into a
  // block of the top tier's memory while its checksum is taken (one pass),
  // and the tier keeps that block: the chunk's one copy on the node.
  std::shared_ptr<store::Payload> block;
  bool in_block = false;
  wire::PayloadChecksummer copy_in;
  if (owner) {
    store::Payload b = chain_->Reserve(envelope.size());
    if (b.size() == envelope.size()) block = std::make_shared<store::Payload>(std::move(b));
  }
  if (block) {
    copy_in = [&](const std::uint8_t* p, size_t n) -> std::uint64_t {
      if (p < envelope.data() || p + n > envelope.data() + envelope.size()) return wire::PayloadChecksum(p, n);
      in_block = true;
      return wire::CopyWithChecksum(block->data() + (p - envelope.data()), p, n);
    };
  }
  Result<store::ChunkRef> chunk = wire::DecodeEnvelope(envelope.data(), envelope.size(), nullptr, std::move(owner), copy_in);
  if (!chunk.ok()) {
    Count(NodeStat::kPutRefused);
    return Status(chunk.status().code() == Code::kUnsupported ? Code::kInvalidArgument : Code::kCorrupt,
                  "envelope: " + chunk.status().message());
  }
  const store::ChunkRef& c = *chunk;
  if (c->meta.ns_hash != ns) {
    Count(NodeStat::kPutRefused);
    return Status::PermissionDenied("envelope: its namespace is not the call's");
  }
  const keys::Digest key = c->meta.key;
  auto filed = std::make_shared<store::Chunk>();
  filed->meta = c->meta;
  filed->meta.key = ObjectKey(ns, key);
  const bool inside = c->payload.data() >= envelope.data() &&
                      c->payload.data() + c->payload.size() <= envelope.data() + envelope.size();
  if (inside && in_block) {
    // The payload is in the block already; the rest of the envelope (its
    // header, the padding after the payload) follows it there.
    const auto off = static_cast<size_t>(c->payload.data() - envelope.data());
    std::memcpy(block->data(), envelope.data(), off);
    std::memcpy(block->data() + off + c->payload.size(), envelope.data() + off + c->payload.size(),
                envelope.size() - off - c->payload.size());
    filed->payload = store::Payload::Adopt(block->data() + off, c->payload.size(), block);
    filed->envelope = block->data();
    filed->envelope_bytes = envelope.size();
  } else {
    filed->payload = store::Payload::Adopt(const_cast<std::uint8_t*>(c->payload.data()), c->payload.size(),
                                           std::const_pointer_cast<store::Chunk>(c));
    if (inside) {
      // Decoded in place: the envelope's bytes live as long as the payload.
      filed->envelope = envelope.data();
      filed->envelope_bytes = envelope.size();
    }
  }
  KvEventPublisher* events = events_.load();
  if (events) {
    // Before the put: the tiers announce the object under this key as they take it (LevelChanged).
    std::lock_guard<std::mutex> lock(client_keys_mu_);
    client_keys_[filed->meta.key] = ClientKey{key, c->meta.tokens};
  }
  Status st = chain_->Put(filed);
  if (!st.ok()) {
    if (events) {
      bool held = false;
      for (size_t i = 0; i < chain_->levels() && !held; ++i) held = chain_->ContainsAt(i, filed->meta.key);
      std::lock_guard<std::mutex> lock(client_keys_mu_);
      if (!held) client_keys_.erase(filed->meta.key);
    }
    Count(NodeStat::kPutRefused);
    return Status(st.code() == Code::kBusy ? Code::kBusy : Code::kInternal, st.message());
  }
  Count(NodeStat::kPutChunks);
  Count(NodeStat::kPutBytes, envelope.size());
  UsageCounts u;
  u.put_bytes = envelope.size();
  usage_->Add(ns, c->meta.model, u);
  registry_->Stored(ns, key);
  return Status::Ok();
}

void NodeService::Dropped(const keys::Digest& object) {
  // Its removal from the last tier holding it was announced (LevelChanged).
  std::lock_guard<std::mutex> lock(client_keys_mu_);
  client_keys_.erase(object);
}

std::uint32_t NodeService::Delete(const keys::Digest& ns, std::span<const keys::Digest> keys) {
  std::uint32_t n = 0;
  for (const keys::Digest& k : keys) {
    const keys::Digest object = ObjectKey(ns, k);
    if (chain_->Erase(object)) ++n;  // each tier that held it announces it (LevelChanged)
    std::lock_guard<std::mutex> lock(client_keys_mu_);
    client_keys_.erase(object);
  }
  Count(NodeStat::kDeletes, n);
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
  s.usage = usage_->Rows();
  const std::vector<store::LevelStats> levels = chain_->Stats();
  for (size_t i = 0; i < levels.size(); ++i) {
    const store::LevelStats& l = levels[i];
    TierStatsSnapshot t;
    t.name = l.name;
    t.kind = i < specs_.size() ? KindName(specs_[i].kind) : "unknown";
    t.codec = l.codec;
    for (const auto& [stat, field] : kLevelFields) t[stat] = l.*field;
    if (i < specs_.size()) {
      t.high_watermark = specs_[i].high_watermark;
      t.low_watermark = specs_[i].low_watermark;
      t.limit_bytes_per_s = tier_limits_[i];
    }
    s.tiers.push_back(std::move(t));
  }
  for (size_t i = 0; i < specs_.size() && i < levels.size(); ++i) {
    const std::vector<store::NamespaceUse> uses = chain_->Namespaces(i);
    for (size_t j = 0; j < uses.size() && j < specs_[i].quotas.size(); ++j) {  // in the config's order
      const store::NamespaceUse& u = uses[j];
      s.quotas.push_back(QuotaRow{levels[i].name, specs_[i].quotas[j].ns, i, u.quota_bytes, u.used_bytes, u.objects,
                                  u.quota_evictions, u.room_evictions, u.refused});
    }
  }
  for (std::size_t k = 0; k < kNodeStatCount; ++k) s.values[k] = counts_[k].load(std::memory_order_relaxed);
  s[NodeStat::kSessions] = static_cast<std::uint64_t>(std::max<std::int64_t>(0, sessions_.load()));
  s[NodeStat::kConnections] = static_cast<std::uint64_t>(std::max<std::int64_t>(0, connections_.load()));
  s[NodeStat::kSubscriptions] = static_cast<std::uint64_t>(std::max<std::int64_t>(0, subscriptions_.load()));
  s[NodeStat::kDocuments] = registry_->documents();
  s[NodeStat::kRegistryLoadFailures] = registry_->load_failures();
  s.lookup_us = Latency(lookup_us_);
  s.get_us = Latency(get_us_);
  s.put_us = Latency(put_us_);
  s.ttft_saved_ms = static_cast<double>(s[NodeStat::kHitTokens]) * prefill_us_per_token_ / 1000.0;
  return s;
}

Status NodeService::CheckStats(const Grant& g) {
  if (g.stats) return Status::Ok();
  Count(NodeStat::kAuthFailures);
  if (g.revoked) return Status::PermissionDenied("this token was revoked (kdnd reloaded its tokens)");
  return Status::PermissionDenied("this token has no stats grant");
}

Status NodeService::KnowledgePut(const keys::Digest& ns, KnowledgeDoc doc) {
  if (draining_) return Status::Unavailable("the node is shutting down");
  return registry_->Put(ns, std::move(doc));
}

}  // namespace kdn::server
