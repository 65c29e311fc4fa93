// SPDX-License-Identifier: Apache-2.0
#include "core/engine/kv_store.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <cmath>
#include <optional>
#include <thread>

#include "kernels/ref/kv_view_ref.h"
#include "core/store/chunk_codec.h"

namespace kdn::store {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// Adds [begin, end) to a fetch's failed ranges, joining the last one it continues.
void AddFailed(Fetch& f, std::uint64_t begin, std::uint64_t end) {
  if (!f.failed.empty() && f.failed.back().end == begin) {
    f.failed.back().end = end;
  } else {
    f.failed.push_back({begin, end});
  }
}

}  // namespace

// ---- Construction -------------------------------------------------------------

KvStore::KvStore(const StoreOptions& options, std::unique_ptr<TieredStore> chain)
    : options_(options), chain_(std::move(chain)) {
  std::uint32_t threads = options.fetch_threads;
  if (threads == 0) threads = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
  if (threads > 1) fetch_pool_ = std::make_unique<ThreadPool>(static_cast<int>(threads));
  // A get costs a read or a decode unless the tier holds raw KV in memory.
  for (const TierSpec& t : options_.tiers) {
    const bool remote = t.kind == TierSpec::Kind::kRemote || t.kind == TierSpec::Kind::kRedis;
    costly_get_.push_back(t.kind == TierSpec::Kind::kDisk || remote || t.codec != DefaultTierCodec(TierSpec::Kind::kHost));
    has_remote_ = has_remote_ || remote;
  }
  rates_.resize(chain_->levels());
}

Result<std::unique_ptr<KvStore>> KvStore::Create(const StoreOptions& options) {
  if (options.chunk_tokens == 0) return Status::InvalidArgument("chunk_tokens must be positive");
  std::vector<TierSpec> specs = options.tiers;
  if (specs.empty()) {
    // The first version's single host tier: it evicts exactly at capacity.
    TierSpec host;
    host.capacity_bytes = options.host_capacity_bytes;
    host.high_watermark = host.low_watermark = 1.0;
    specs.push_back(host);
  }
  // The deployment secret, for the tiers others can write to.
  std::shared_ptr<const wire::ChunkSealer> sealer;
  if (!options.secret_file.empty()) {
    auto s = wire::ChunkSealer::FromFile(options.secret_file);
    if (!s.ok()) return s.status();
    sealer = std::move(s).value();
  } else if (std::any_of(specs.begin(), specs.end(), [](const TierSpec& t) { return t.kind == TierSpec::Kind::kRedis; })) {
    static std::once_flag said;
    std::call_once(said, [] {
      std::fprintf(stderr,
                   "kdn: a redis tier without a secret (secret_file): whoever can write to its server decides the "
                   "KV this runtime loads (docs/security.md)\n");
    });
  }
  // The master keys, for the tiers whose chunks leave the process.
  auto cipher = wire::ChunkCipher::Load(options.encryption_key_file, options.encryption_key_env);
  if (!cipher.ok()) return cipher.status();
  TieredStoreOptions to;
  // With a GPU the cold tiers default to raw (DefaultTierCodec).
  const bool gpu = options.device != nullptr && !options.device->emulated();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (auto st = ValidateTierSpec(specs[i]); !st.ok()) {
      return Status(st.code(), "tier " + std::to_string(i) + ": " + st.message());
    }
    // A tier with levels keeps them itself (tiers/leveled_tier.h): the chain hands it canonical chunks.
    if (!specs[i].levels.empty()) specs[i].codec = "raw";
    // The codec first: a bad spec fails before any directory is touched.
    if (specs[i].codec.empty()) specs[i].codec = std::string(DefaultTierCodec(specs[i].kind, gpu));
    auto codec = MakeTierCodec(specs[i].codec);
    if (!codec.ok()) return Status::InvalidArgument("tier " + std::to_string(i) + ": " + codec.status().message());
    specs[i].codec = (*codec)->spec().ToString();  // what it resolved to
    auto tier = MakeTier(specs[i], i, options.chunk_tokens, options.device.get(), sealer, *cipher);
    if (!tier.ok()) return tier.status();
    LevelOptions lo = LevelFor(specs[i], std::move(tier).value());
    lo.codec = std::move(codec).value();
    to.levels.push_back(std::move(lo));
  }
  to.mover_queue_objects = options.mover_queue_objects;
  to.mover_queue_bytes = options.mover_queue_bytes;
  to.clock = options.clock;
  to.editor = options.editor;
  auto chain = TieredStore::Create(std::move(to));
  if (!chain.ok()) return chain.status();
  StoreOptions kept = options;
  kept.tiers = specs;
  std::unique_ptr<KvStore> store(new KvStore(kept, std::move(chain).value()));
  store->sealer_ = std::move(sealer);
  return store;
}

// ---- Keys ---------------------------------------------------------------------

Status KvStore::CheckKeys(const TokenKeys& k) const {
  if (!k.by_hash()) return Status::Ok();
  if (k.block_tokens == 0) return Status::InvalidArgument("block hashes: block_tokens must be positive");
  if (k.hash_bytes > 64) return Status::InvalidArgument("block hashes: hash_bytes must be 1..64");
  if (k.hashes.size() % k.hash_bytes != 0) {
    return Status::InvalidArgument("block hashes: the byte count is not a multiple of hash_bytes");
  }
  if (options_.chunk_tokens % k.block_tokens != 0) {
    return Status::InvalidArgument("block hashes: chunk_tokens " + std::to_string(options_.chunk_tokens) +
                                   " is not a multiple of the engine's block of " + std::to_string(k.block_tokens));
  }
  return Status::Ok();
}

keys::Digest KvStore::KeyOf(const keys::ChunkKeyer& keyer, const TokenKeys& k, const keys::Digest& prev,
                            std::uint64_t begin, std::uint64_t len) {
  if (!k.by_hash()) return keyer.Key(prev, k.tokens.subspan(begin, len));
  const std::uint64_t b0 = begin / k.block_tokens, nb = len / k.block_tokens;
  return keyer.KeyFromBlocks(prev, k.hashes.subspan(b0 * k.hash_bytes, nb * k.hash_bytes), k.hash_bytes);
}

keys::Digest KvStore::ContentKey(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens) const {
  return keys::ContentKey(options_.hash_seed, ns, model.fingerprint, tokens);
}

std::uint64_t KvStore::StoredLength(const TokenKeys& k, std::uint64_t pos, std::uint64_t n) const {
  const std::uint64_t C = options_.chunk_tokens, left = n - pos;
  if (left >= C) return C;
  // A piece: the largest power of two of units (tokens, or the engine's
  // blocks) that fits what is left.
  const std::uint64_t unit = k.by_hash() ? k.block_tokens : 1;
  const std::uint64_t units = left / unit;
  return units == 0 ? 0 : std::bit_floor(units) * unit;
}

template <typename Probe>
std::uint64_t KvStore::Walk(const ModelKv& model, std::string_view ns, const TokenKeys& k, Probe&& probe) const {
  const std::uint64_t C = options_.chunk_tokens, n = k.size();
  const keys::ChunkKeyer keyer(options_.hash_seed, ns, model.fingerprint);
  keys::Digest prev = keys::ChainStart(k.salt);
  std::uint64_t pos = 0;
  while (n - pos >= C) {
    const keys::Digest key = KeyOf(keyer, k, prev, pos, C);
    probes_.fetch_add(1, std::memory_order_relaxed);
    if (!probe(key, pos, C)) break;
    prev = key;
    pos += C;
  }
  WalkPieces(keyer, k, prev, pos, probe);
  return pos;
}

template <typename Probe>
void KvStore::WalkPieces(const keys::ChunkKeyer& keyer, const TokenKeys& k, keys::Digest& prev, std::uint64_t& pos,
                         Probe&& probe) const {
  // The pieces (see the file comment): each power of two below a chunk
  // once, largest first. Greedy is exact: pieces after a piece of s tokens
  // add up to less than s, so a longer first piece always reaches further.
  const std::uint64_t n = k.size();
  const std::uint64_t unit = k.by_hash() ? k.block_tokens : 1;
  const std::uint64_t chunk_units = options_.chunk_tokens / unit;
  if (chunk_units < 2) return;
  for (std::uint64_t units = std::bit_floor(chunk_units - 1); units >= 1; units /= 2) {
    const std::uint64_t len = units * unit;
    if (len > n - pos) continue;
    const keys::Digest key = KeyOf(keyer, k, prev, pos, len);
    probes_.fetch_add(1, std::memory_order_relaxed);
    if (!probe(key, pos, len)) continue;
    prev = key;
    pos += len;
  }
}

// ---- Lookup, store, retrieve ----------------------------------------------------

ReadContext KvStore::Context(std::string_view ns, const DeliveryTarget& target, bool one_deadline) const {
  ReadContext ctx;
  if (has_remote_) ctx.ns = keys::NamespaceHash(ns);
  ctx.target = target;
  if (one_deadline) {
    ctx.started_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                         .count();
  }
  return ctx;
}

void KvStore::AnnounceDocument(DocumentOp op, const DocumentRecord& doc, std::uint64_t ttl_ms) {
  if (!has_remote_) return;
  for (size_t i = 0; i < chain_->levels(); ++i) chain_->tier(i).Document(op, doc, ttl_ms);
}

void KvStore::PrefetchRemote(const ModelKv& model, std::string_view ns, const TokenKeys& k, bool will_read,
                             const ReadContext& ctx) const {
  if (!has_remote_) return;
  // The whole chunks' keys, as the walk computes them: one batched call per
  // remote tier instead of a call per probe. Pieces are probed one by one.
  const std::uint64_t C = options_.chunk_tokens, n = k.size();
  const keys::ChunkKeyer keyer(options_.hash_seed, ns, model.fingerprint);
  std::vector<keys::Digest> chain;
  keys::Digest prev = keys::ChainStart(k.salt);
  for (std::uint64_t pos = 0; n - pos >= C; pos += C) {
    prev = KeyOf(keyer, k, prev, pos, C);
    chain.push_back(prev);
  }
  // A single probe costs what the batched call costs; a read ahead pays
  // from one chunk on (the lookup and the get travel together).
  if (chain.size() < (will_read ? 1u : 2u)) return;
  std::vector<keys::Digest> wanted;
  for (size_t i = 0; i < chain_->levels(); ++i) {
    if (options_.tiers[i].kind != TierSpec::Kind::kRemote && options_.tiers[i].kind != TierSpec::Kind::kRedis) continue;
    if (!will_read) {
      chain_->tier(i).Prefetch(chain, false, ctx);
      continue;
    }
    // Only what no tier above holds is probed here and read from here (the
    // walk stops at the first key no tier holds, so the leading run of
    // these that the node holds is what it reads).
    wanted.clear();
    for (const keys::Digest& key : chain) {
      bool above = false;
      for (size_t j = 0; j < i && !above; ++j) above = chain_->ContainsAt(j, key, ctx);
      if (!above) wanted.push_back(key);
    }
    if (!wanted.empty()) chain_->tier(i).Prefetch(wanted, true, ctx);
  }
}

LookupResult KvStore::Lookup(const ModelKv& model, std::string_view ns, const TokenKeys& keys) {
  const auto t0 = std::chrono::steady_clock::now();
  ++lookups_;
  const ReadContext ctx = Context(ns);
  PrefetchRemote(model, ns, keys, /*will_read=*/false, ctx);
  LookupResult r;
  r.tier_tokens.assign(chain_->levels(), 0);
  std::vector<bool> contiguous(chain_->levels(), true);
  std::vector<bool> here(chain_->levels());
  r.tokens = Walk(model, ns, keys, [&](const keys::Digest& key, std::uint64_t, std::uint64_t len) {
    bool any = false;
    for (size_t i = 0; i < chain_->levels(); ++i) {
      here[i] = chain_->ContainsAt(i, key, ctx);
      any = any || here[i];
    }
    // A probe no tier holds is no gap: the walk tries a smaller piece at the
    // same position next. A tier's run ends at the first probe another tier
    // holds and it does not.
    if (any) {
      for (size_t i = 0; i < chain_->levels(); ++i) {
        if (here[i] && contiguous[i]) r.tier_tokens[i] += len;
        if (!here[i]) contiguous[i] = false;
      }
    }
    return any;
  });
  lookup_tokens_ += keys.size();
  lookup_hit_tokens_ += r.tokens;
  ReportOutcome(model, ns, /*load=*/false, keys.size(), r.tier_tokens);
  lookup_us_.Record(MicrosSince(t0));
  return r;
}

void KvStore::ReportOutcome(const ModelKv& model, std::string_view ns, bool load, std::uint64_t tokens,
                            const std::vector<std::uint64_t>& hit) {
  if (!has_remote_ || tokens == 0) return;
  const ReadContext ctx = Context(ns, {}, /*one_deadline=*/false);
  for (size_t i = 0; i < chain_->levels() && i < hit.size(); ++i) {
    if (options_.tiers[i].kind != TierSpec::Kind::kRemote && options_.tiers[i].kind != TierSpec::Kind::kRedis) continue;
    chain_->tier(i).Report({load, tokens, std::min(hit[i], tokens), model.fingerprint}, ctx);
  }
}

Status KvStore::PutPayload(const ModelKv& model, std::string_view ns, const keys::Digest& key, std::uint64_t tokens,
                           std::int64_t first_position, Payload payload, bool on_device, double value,
                           const ReadContext& ctx, bool exact) {
  auto chunk = std::make_shared<Chunk>();
  chunk->meta.device = on_device;
  chunk->meta.exact = exact;
  chunk->meta.prefill_value = value;
  chunk->meta.key = key;
  chunk->meta.model = model.fingerprint;
  chunk->meta.ns_hash = keys::NamespaceHash(ns);
  chunk->meta.dtype = model.dtype;
  chunk->meta.layers = static_cast<std::uint32_t>(model.shape.layers);
  chunk->meta.kv_heads = static_cast<std::uint32_t>(model.shape.heads);
  chunk->meta.head_dim = static_cast<std::uint32_t>(model.shape.head_dim);
  chunk->meta.tokens = static_cast<std::uint32_t>(tokens);
  chunk->meta.first_position = first_position;
  chunk->payload = std::move(payload);
  KDN_RETURN_IF_ERROR(chain_->Put(std::move(chunk), ctx));
  tokens_stored_ += tokens;
  bytes_stored_ += tokens * static_cast<std::uint64_t>(model.bytes_per_token());
  return Status::Ok();
}

Status KvStore::PutChunk(const ModelKv& model, std::string_view ns, const keys::Digest& key,
                         const kernels::KvView& view, std::uint64_t begin, std::uint64_t tokens,
                         std::int64_t first_position, const ReadContext& ctx) {
  Payload payload = Payload::Uninitialized(static_cast<size_t>(tokens * static_cast<std::uint64_t>(model.bytes_per_token())));
  kernels::view_gather_cpu(view, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(tokens), 0,
                           model.shape.layers, payload.data());
  return PutPayload(model, ns, key, tokens, first_position, std::move(payload), /*on_device=*/false, 0, ctx);
}

Result<std::vector<KvStore::PlannedChunk>> KvStore::PlanStore(const ModelKv& model, std::string_view ns,
                                                              const TokenKeys& k) {
  const ReadContext ctx = Context(ns);
  KDN_RETURN_IF_ERROR(CheckKeys(k));
  PrefetchRemote(model, ns, k, /*will_read=*/false, ctx);
  const std::uint64_t n = k.size();
  const auto per_token = static_cast<std::uint64_t>(model.bytes_per_token());
  const keys::ChunkKeyer keyer(options_.hash_seed, ns, model.fingerprint);
  std::vector<PlannedChunk> plan;
  keys::Digest prev = keys::ChainStart(k.salt);
  std::uint64_t pos = 0;
  // This call's chunks are the most recently used: once they add up to more
  // than all tiers hold, the next put would push out this call's own first
  // chunks, which are useless without them. Stop there. Each tier is counted
  // by what a chunk costs there (a memory tier's whole pages, not its bytes:
  // a chunk that is not page-sized costs more than its KV), the last one up
  // to its high watermark (crossing it evicts, and a last tier's victims are
  // gone); the chunks fill the tiers top down, as demotion would.
  std::vector<std::uint64_t> room(chain_->levels());
  for (size_t i = 0; i < room.size(); ++i) {
    const std::uint64_t cap = chain_->tier(i).capacity_bytes();
    room[i] = i + 1 < room.size() ? cap
                                  : static_cast<std::uint64_t>(std::min(1.0, options_.tiers[i].high_watermark) *
                                                               static_cast<double>(cap));
  }
  const auto cost_in = [&](size_t tier, std::uint64_t bytes) -> std::uint64_t {
    return EstimatedCost(options_.tiers[tier], bytes);
  };
  while (pos < n) {
    const std::uint64_t len = StoredLength(k, pos, n);
    if (len == 0) break;
    const std::uint64_t bytes = len * per_token;
    bool fits = false;
    for (size_t i = 0; i < room.size() && !fits; ++i) {
      const std::uint64_t cost = cost_in(i, bytes);
      if (cost <= room[i]) {
        room[i] -= cost;
        fits = true;
      }
    }
    if (!fits) break;
    PlannedChunk p;
    p.key = KeyOf(keyer, k, prev, pos, len);
    p.begin = pos;
    p.tokens = len;
    p.present = chain_->Locate(p.key, ctx) >= 0;
    plan.push_back(p);
    prev = p.key;
    pos += len;
  }
  // What each chunk's presence saves when the request comes again, for the
  // cost-aware policy (store/policy.h ChunkValue).
  double work = 0;
  std::uint64_t tokens = 0;
  for (const PlannedChunk& p : plan) {
    work += PrefillCost(static_cast<std::int64_t>(p.begin), p.tokens);
    tokens += p.tokens;
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    plan[i].value = ChunkValue(work / static_cast<double>(tokens), plan[i].tokens, i, plan.size());
  }
  return plan;
}

std::uint64_t KvStore::HeldPrefix(std::string_view ns, std::span<const PlannedChunk> plan,
                                  std::uint64_t committed) const {
  const ReadContext ctx = Context(ns);
  std::uint64_t held = 0;
  for (const PlannedChunk& p : plan) {
    if (p.begin + p.tokens > committed || chain_->Locate(p.key, ctx) < 0) break;
    held = p.begin + p.tokens;
  }
  return held;
}

Status KvStore::CommitChunk(const ModelKv& model, std::string_view ns, const PlannedChunk& p, Payload payload) {
  if (p.present) return Status::Ok();
  return PutPayload(model, ns, p.key, p.tokens, static_cast<std::int64_t>(p.begin), std::move(payload),
                    /*on_device=*/false, p.value);
}

Result<std::uint64_t> KvStore::Store(const ModelKv& model, std::string_view ns, const TokenKeys& k,
                                     const kernels::KvView& view) {
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = PlanStore(model, ns, k);
  if (!plan.ok()) return plan.status();
  std::uint64_t stored = 0;
  for (const PlannedChunk& p : *plan) {
    Payload payload;
    if (!p.present) {
      payload = Payload::Uninitialized(static_cast<size_t>(p.tokens * static_cast<std::uint64_t>(model.bytes_per_token())));
      kernels::view_gather_cpu(view, static_cast<std::int64_t>(p.begin), static_cast<std::int64_t>(p.tokens), 0,
                               model.shape.layers, payload.data());
    }
    if (!CommitChunk(model, ns, p, std::move(payload)).ok()) break;  // no tier could take it: keep the prefix
    stored = p.begin + p.tokens;
  }
  CountStore(MicrosSince(t0));
  // What the tiers hold now: a put may have evicted an earlier chunk of this
  // very call (one planned as present is the least recently used).
  return HeldPrefix(ns, *plan, stored);
}

Fetch KvStore::FetchPrefix(const ModelKv& model, std::string_view ns, const TokenKeys& k, TieredStore::Form form,
                           const DeliveryTarget& target) {
  Fetch f;
  // The prefix is decided by presence (as a lookup); each chunk is then read
  // and leased. A chunk that fails to read (evicted meanwhile, corrupt) is
  // reported, and the ones after it are still loaded: their keys, and so
  // their KV, do not depend on it.
  std::vector<Planned> plan;
  // A load with a target: the leveled remote tiers choose each chunk's
  // quality level by it (tiers/leveled_tier.h), knowing what a recompute costs.
  DeliveryTarget full;
  if (target.deadline_ns != 0) {
    full = target;
    full.recompute_ns_per_token = PrefillNsPerToken(model);
    full.chunk_tokens = options_.chunk_tokens;
  }
  const ReadContext ctx = Context(ns, full);
  PrefetchRemote(model, ns, k, /*will_read=*/true, ctx);
  f.covered = Walk(model, ns, k, [&](const keys::Digest& key, std::uint64_t begin, std::uint64_t len) {
    const int level = chain_->Locate(key, ctx);
    if (level < 0) return false;
    plan.push_back({key, begin, len, level, std::nullopt});
    return true;
  });
  f.device = form == TieredStore::Form::kStored;
  // Never slower than prefill: the chunks whose tiers deliver slower than
  // the engine recomputes are left to recompute.
  TokenRange left{};
  if (options_.recompute_when_faster && !plan.empty()) {
    std::vector<std::pair<int, std::uint64_t>> levels;
    for (const Planned& p : plan) levels.emplace_back(p.level, p.len);
    const size_t keep = ChunksWorthLoading(model, levels, f.device);
    if (keep < plan.size()) {
      left = {plan[keep].begin, plan.back().begin + plan.back().len};
      f.recompute_chunks = plan.size() - keep;
      f.recompute_tokens = left.end - left.begin;
      plan.resize(keep);
    }
  }
  ReadPlanned(model, plan, form, ctx, f);
  if (left.end > left.begin) AddFailed(f, left.begin, left.end);
  return f;
}

Fetch KvStore::FetchKeys(const ModelKv& model, std::string_view ns, std::span<const KeyedRange> ranges,
                         TieredStore::Form form) {
  Fetch f;
  const ReadContext ctx = Context(ns);
  std::vector<Planned> plan;
  for (const KeyedRange& r : ranges) {
    const int level = chain_->Locate(r.key, ctx);
    if (level < 0) {
      // Gone since the caller found it: reported as a failure, as a chunk
      // that fails to read.
      AddFailed(f, r.begin, r.begin + r.len);
      continue;
    }
    plan.push_back({r.key, r.begin, r.len, level, std::nullopt});
    f.covered = std::max(f.covered, r.begin + r.len);
  }
  f.device = form == TieredStore::Form::kStored;
  ReadPlanned(model, plan, form, ctx, f);
  std::sort(f.failed.begin(), f.failed.end(), [](const TokenRange& a, const TokenRange& b) { return a.begin < b.begin; });
  return f;
}

bool KvStore::Holds(std::string_view ns, const keys::Digest& key) const {
  return chain_->Locate(key, Context(ns)) >= 0;
}

std::vector<KvStore::KeyedRange> KvStore::ChainKeys(
    const ModelKv& model, std::string_view ns, const TokenKeys& k,
    const std::function<bool(const keys::Digest& key, std::uint64_t begin, std::uint64_t len)>& held) const {
  std::vector<KeyedRange> out;
  const std::uint64_t C = options_.chunk_tokens, n = k.size();
  const keys::ChunkKeyer keyer(options_.hash_seed, ns, model.fingerprint);
  keys::Digest prev = keys::ChainStart(k.salt);
  std::uint64_t pos = 0;
  // The pieces at `pos`, as Walk finds them (accepted when held); false
  // when none is.
  auto pieces = [&]() {
    const std::uint64_t at = pos;
    WalkPieces(keyer, k, prev, pos, [&](const keys::Digest& key, std::uint64_t begin, std::uint64_t len) {
      if (!held(key, begin, len)) return false;
      out.push_back({key, begin, len});
      return true;
    });
    return pos != at;
  };
  while (n - pos >= C) {
    const keys::Digest key = KeyOf(keyer, k, prev, pos, C);
    probes_.fetch_add(1, std::memory_order_relaxed);
    if (!held(key, pos, C)) {
      // Where a shorter request stored pieces instead, they end the chain;
      // else the chunk is listed, not held, and the chain goes on (a
      // sliding window's older chunks may be gone, later ones not).
      const std::uint64_t at = pos;
      const keys::Digest before = prev;
      if (pieces()) return out;
      pos = at;
      prev = before;
    }
    out.push_back({key, pos, C});
    prev = key;
    pos += C;
  }
  pieces();
  return out;
}

void KvStore::ReadPlanned(const ModelKv& model, std::vector<Planned>& plan, TieredStore::Form form,
                          const ReadContext& ctx, Fetch& f) {
  size_t costly = 0;  // chunks to read from disk or to decode
  for (const Planned& p : plan) costly += costly_get_[static_cast<size_t>(p.level)];
  // Reading and decoding chunks costs: on several threads when they are
  // free. A lease of raw KV in memory is cheap.
  f.reads_started = std::chrono::steady_clock::now();
  auto read = [&](size_t b, size_t e) {  // on the pool's threads too: ctx goes with the call
    for (size_t i = b; i < e; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      plan[i].lease.emplace(chain_->Get(plan[i].key, form, ctx));
      plan[i].ns = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    }
  };
  std::uint64_t sharing = 1;  // threads that shared the reads
  std::unique_lock<std::mutex> pool(fetch_mu_, std::defer_lock);
  if (fetch_pool_ != nullptr && costly >= 2 && pool.try_lock()) {
    sharing = std::min<std::uint64_t>(static_cast<std::uint64_t>(fetch_pool_->threads()), plan.size());
    fetch_pool_->ParallelFor(plan.size(), 1, read);
    pool.unlock();
  } else {
    read(0, plan.size());
  }
  const auto per_token = static_cast<std::uint64_t>(model.bytes_per_token());
  for (Planned& p : plan) {
    Result<Lease>& lease = *p.lease;
    const std::uint64_t begin = p.begin, len = p.len;
    // Stored form: an encoded payload's size is its codec's; its meta says
    // how many tokens it holds.
    const bool ok = lease.ok() &&
                    (lease->chunk()->meta.codec == codec::CodecId::kRaw
                         ? lease->chunk()->payload.size() == len * per_token
                         : lease->chunk()->meta.payload_bytes() == len * per_token) &&
                    lease->chunk()->meta.model == model.fingerprint;
    if (!ok) {
      AddFailed(f, begin, begin + len);
      continue;
    }
    if (lease->chunk()->meta.edited) ++f.edited_chunks;
    if (lease->chunk()->meta.lossy) ++f.lossy_chunks;
    f.chunks.push_back({std::move(lease).value(), begin, len, p.ns / sharing});
  }
}

size_t KvStore::ChunksWorthLoading(const ModelKv& model, std::span<const std::pair<int, std::uint64_t>> levels,
                                   bool device) {
  const double prefill = PrefillNsPerToken(model);
  const size_t n = levels.size();
  if (prefill <= 0) return n;  // no report yet: nothing to compare with
  std::vector<double> deliver(n), recompute(n);
  const size_t d = device ? 1 : 0;
  std::lock_guard<std::mutex> lock(rate_mu_);
  for (size_t i = 0; i < n; ++i) {
    const auto level = static_cast<size_t>(levels[i].first);
    const auto tokens = static_cast<double>(levels[i].second);
    recompute[i] = prefill * tokens;
    // Raw KV in memory is always loaded: its delivery is a copy, the
    // fastest path there is (and prefill is slower than a copy of its KV
    // on any engine kdn serves). A tier with quality levels chooses per
    // chunk itself, by the load's target (tiers/leveled_tier.h). An
    // unmeasured tier is fetched, and so measured.
    const DeliveryRate& r = rates_[level][d].rate;
    const bool decides = costly_get_[level] && options_.tiers[level].levels.empty();
    deliver[i] = !decides || r.samples == 0 ? 0 : r.ns_per_token * tokens;
  }
  const size_t keep = CheapestPrefix(deliver, recompute);
  if (keep == n) return n;
  if (++rates_[static_cast<size_t>(levels[keep].first)][d].declined % kRateProbeEvery == 0) {
    ++rate_probes_;  // fetched anyway: measured again
    return n;
  }
  std::uint64_t tokens = 0;
  for (size_t i = keep; i < n; ++i) {
    ++rates_[static_cast<size_t>(levels[i].first)][d].rate.recompute_chunks;
    tokens += levels[i].second;
  }
  recompute_chunks_ += n - keep;
  recompute_tokens_ += tokens;
  return keep;
}

void KvStore::RecordRates(const Fetch& f) {
  if (f.chunks.empty() || f.reads_started == std::chrono::steady_clock::time_point{}) return;
  const double wall = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - f.reads_started).count();
  // Per level: tokens delivered and the read and decode time spent on them;
  // the rest of the wall time (copies into the views, waits) by tokens.
  std::vector<double> tokens(rates_.size(), 0.0), work(rates_.size(), 0.0);
  double all_tokens = 0, all_work = 0;
  for (const FetchedChunk& c : f.chunks) {
    const int level = c.lease.level();
    if (level < 0 || static_cast<size_t>(level) >= rates_.size()) continue;
    tokens[static_cast<size_t>(level)] += static_cast<double>(c.tokens);
    work[static_cast<size_t>(level)] += static_cast<double>(c.work_ns);
    all_tokens += static_cast<double>(c.tokens);
    all_work += static_cast<double>(c.work_ns);
  }
  if (all_tokens <= 0) return;
  const double rest = std::max(0.0, wall - all_work);
  const size_t d = f.device ? 1 : 0;
  std::lock_guard<std::mutex> lock(rate_mu_);
  for (size_t level = 0; level < rates_.size(); ++level) {
    if (tokens[level] <= 0) continue;
    const double sample = (work[level] + rest * tokens[level] / all_tokens) / tokens[level];
    DeliveryRate& r = rates_[level][d].rate;
    r.ns_per_token = r.samples == 0 ? sample : (1.0 - kRateWeight) * r.ns_per_token + kRateWeight * sample;
    ++r.samples;
  }
}

KvStore::DeliveryRate KvStore::Rate(size_t level, bool device) const {
  std::lock_guard<std::mutex> lock(rate_mu_);
  return level < rates_.size() ? rates_[level][device ? 1 : 0].rate : DeliveryRate{};
}

void KvStore::Scatter(const Fetch& f, const kernels::KvView& view, std::int64_t layer_begin, std::int64_t layer_end) {
  for (const FetchedChunk& c : f.chunks) {
    kernels::view_scatter_cpu(c.lease.chunk()->payload.data(), view, static_cast<std::int64_t>(c.begin),
                              static_cast<std::int64_t>(c.tokens), layer_begin, layer_end);
  }
}

void KvStore::CountLoad(const ModelKv& model, std::string_view ns, const Fetch& f, std::uint64_t requested,
                        std::uint64_t tokens, std::uint64_t bytes, double micros) {
  if (has_remote_) {
    // What each tier delivered of the served prefix.
    std::vector<std::uint64_t> from(chain_->levels(), 0);
    for (const FetchedChunk& c : f.chunks) {
      const int level = c.lease.level();
      if (level >= 0 && static_cast<size_t>(level) < from.size() && c.begin < tokens) {
        from[static_cast<size_t>(level)] += std::min(c.tokens, tokens - c.begin);
      }
    }
    ReportOutcome(model, ns, /*load=*/true, requested, from);
  }
  ++retrieves_;
  hits_ += f.chunks.size();
  if (tokens < requested) ++misses_;
  tokens_requested_ += requested;
  tokens_served_ += tokens;
  if (tokens > 0) {
    const double per_token = PrefillNsPerToken(model);
    if (per_token > 0) {
      ttft_saved_ns_ += static_cast<std::uint64_t>(std::llround(per_token * static_cast<double>(tokens)));
    } else {
      tokens_served_unpriced_ += tokens;
    }
  }
  delivery_ns_ += static_cast<std::uint64_t>(std::llround(micros * 1000.0));
  bytes_served_ += bytes;
  edited_served_ += f.edited_chunks;
  load_us_.Record(micros);
  RecordRates(f);
}

std::uint64_t KvStore::Retrieve(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                const kernels::KvView& view) {
  return RetrieveInto(model, ns, keys, view).tokens;
}

KvStore::Retrieved KvStore::RetrieveInto(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                         const kernels::KvView& view, const DeliveryTarget& target) {
  return RetrieveWith(
      model, ns, keys,
      [&](const FetchedChunk& c) {
        kernels::view_scatter_cpu(c.lease.chunk()->payload.data(), view, static_cast<std::int64_t>(c.begin),
                                  static_cast<std::int64_t>(c.tokens), 0, model.shape.layers);
      },
      target);
}

KvStore::Retrieved KvStore::RetrieveWith(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                         const std::function<void(const FetchedChunk&)>& write,
                                         const DeliveryTarget& target) {
  const auto t0 = std::chrono::steady_clock::now();
  Fetch f = FetchPrefix(model, ns, keys, TieredStore::Form::kCanonical, target);
  // As a prefix: chunks past the first failure are dropped.
  const std::uint64_t prefix = f.prefix();
  std::erase_if(f.chunks, [&](const FetchedChunk& c) { return c.begin >= prefix; });
  for (const FetchedChunk& c : f.chunks) write(c);
  CountLoad(model, ns, f, keys.size(), prefix, prefix * static_cast<std::uint64_t>(model.bytes_per_token()),
            MicrosSince(t0));
  Retrieved r;
  r.tokens = prefix;
  r.covered = f.covered;
  for (const FetchedChunk& c : f.chunks) r.lossy = r.lossy || c.lease.chunk()->meta.lossy;
  return r;
}

Status KvStore::ReportPrefill(const ModelKv& model, std::uint64_t tokens, std::uint64_t ns) {
  if (tokens == 0 || ns == 0) {
    return Status::InvalidArgument("a prefill report needs tokens > 0 and a time > 0 (got " + std::to_string(tokens) +
                                   " tokens in " + std::to_string(ns) + " ns)");
  }
  // A report of over an hour per token is a unit mistake (ns were meant).
  constexpr std::uint64_t kMaxNsPerToken = std::uint64_t{3600} * 1000 * 1000 * 1000;
  if (ns / tokens > kMaxNsPerToken) {
    return Status::InvalidArgument("a prefill report of " + std::to_string(ns / tokens) +
                                   " ns per token is over an hour per token: the time is in nanoseconds");
  }
  std::lock_guard<std::mutex> lock(prefill_mu_);
  auto it = prefill_.find(model.fingerprint);
  if (it == prefill_.end()) {
    if (prefill_.size() >= kMaxPrefillModels) {
      return Status(Code::kBusy, "prefill reports: " + std::to_string(kMaxPrefillModels) +
                                     " models have reported already; no room for another");
    }
    it = prefill_.emplace(model.fingerprint, PrefillMeter{}).first;
  }
  PrefillMeter& m = it->second;
  if (m.ns + ns < m.ns || prefill_ns_ + ns < prefill_ns_) {
    return Status::InvalidArgument("prefill reports overflow 64-bit nanoseconds");
  }
  m.tokens += tokens;
  m.ns += ns;
  prefill_tokens_ += tokens;
  prefill_ns_ += ns;
  return Status::Ok();
}

double KvStore::PrefillNsPerToken(const ModelKv& model) const {
  std::lock_guard<std::mutex> lock(prefill_mu_);
  auto it = prefill_.find(model.fingerprint);
  return it == prefill_.end() ? 0 : static_cast<double>(it->second.ns) / static_cast<double>(it->second.tokens);
}

void KvStore::CountBlendSaving(const ModelKv& model, double positions) {
  const double per_token = PrefillNsPerToken(model);
  if (per_token > 0 && positions > 0) {
    ttft_saved_ns_ += static_cast<std::uint64_t>(std::llround(per_token * positions));
  }
}

Telemetry KvStore::Stats() const {
  Telemetry t;
  t.lookups = lookups_;
  t.retrieves = retrieves_;
  t.stores = stores_;
  t.hits = hits_;
  t.misses = misses_;
  t.tokens_served = tokens_served_;
  t.tokens_stored = tokens_stored_;
  t.bytes_served = bytes_served_;
  t.bytes_stored = bytes_stored_;
  t.edited_served = edited_served_;
  t.probes = probes_;
  t.tokens_requested = tokens_requested_;
  t.lookup_tokens = lookup_tokens_;
  t.lookup_hit_tokens = lookup_hit_tokens_;
  t.ttft_saved_ns = ttft_saved_ns_;
  t.tokens_served_unpriced = tokens_served_unpriced_;
  t.delivery_ns = delivery_ns_;
  t.recompute_chunks = recompute_chunks_;
  t.recompute_tokens = recompute_tokens_;
  t.rate_probes = rate_probes_;
  {
    std::lock_guard<std::mutex> lock(prefill_mu_);
    t.prefill_tokens = prefill_tokens_;
    t.prefill_ns = prefill_ns_;
  }
  t.lookup_us = lookup_us_.Snapshot();
  t.load_us = load_us_.Snapshot();
  t.store_us = store_us_.Snapshot();
  return t;
}

}  // namespace kdn::store
