// SPDX-License-Identifier: Apache-2.0
#include "core/store/tiered_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/store/chunk_codec.h"

namespace kdn::store {
namespace {

std::uint64_t NsSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

// ---- Lease ------------------------------------------------------------------

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    store_ = o.store_;
    chunk_ = std::move(o.chunk_);
    level_ = o.level_;
    o.store_ = nullptr;
    o.level_ = -1;
  }
  return *this;
}

void Lease::Release() {
  if (store_ && chunk_) store_->ReleaseLease(chunk_->meta.key);
  store_ = nullptr;
  chunk_.reset();
  level_ = -1;
}

// ---- Construction -----------------------------------------------------------

TieredStore::TieredStore(TieredStoreOptions& o)
    : clock_(o.clock ? o.clock : SteadyClock::Get()),
      editor_(std::move(o.editor)),
      pass_through_(o.pass_through),
      on_drop_(std::move(o.on_drop)),
      on_level_(std::move(o.on_level)),
      max_tied_(o.max_tied_objects),
      queue_objects_(std::max<size_t>(1, o.mover_queue_objects)),
      queue_bytes_(std::max<std::uint64_t>(1, o.mover_queue_bytes)) {}

Result<std::unique_ptr<TieredStore>> TieredStore::Create(TieredStoreOptions options) {
  if (options.levels.empty()) return Status::InvalidArgument("a store needs at least one tier");
  if (options.pass_through && options.editor) return Status::InvalidArgument("a pass-through store has no editor");
  std::unique_ptr<TieredStore> s(new TieredStore(options));
  for (LevelOptions& lo : options.levels) {
    if (!lo.tier) return Status::InvalidArgument("tier is null");
    if (!(lo.low_watermark > 0 && lo.low_watermark <= lo.high_watermark && lo.high_watermark <= 1.0)) {
      return Status::InvalidArgument(lo.tier->name() + ": watermarks must satisfy 0 < low <= high <= 1");
    }
    auto level = std::make_unique<Level>();
    level->policy = MakePolicy(lo.policy, lo.tier->capacity_bytes());
    level->high = lo.high_watermark;
    level->low = lo.low_watermark;
    level->write_through = lo.write_through;
    for (const NamespaceQuota& q : lo.quotas) {
      if (!level->quotas.emplace(q.ns, NamespaceUse{q.ns, q.bytes}).second) {
        return Status::InvalidArgument(lo.tier->name() + ": two quotas for one namespace");
      }
      level->quota_order.push_back(q.ns);
    }
    if (lo.codec && lo.codec->id() != codec::CodecId::kRaw) {
      if (options.pass_through) return Status::InvalidArgument(lo.tier->name() + ": a pass-through store's tiers have no codec");
      level->codec = std::move(lo.codec);
    }
    // Objects the tier already holds (a disk tier after a restart), oldest first.
    std::vector<ObjectInfo> held = lo.tier->List();
    std::sort(held.begin(), held.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.last_use_ns < b.last_use_ns; });
    for (const ObjectInfo& o : held) level->policy->OnInsert(o.key, o.bytes, 0);  // value unknown after a restart
    level->tier = std::move(lo.tier);
    s->levels_.push_back(std::move(level));
  }
  s->mover_ = std::thread([p = s.get()] { p->MoverLoop(); });
  return s;
}

TieredStore::~TieredStore() {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    stop_ = true;  // the mover drains what is queued (write-back demotions land), then exits
  }
  queue_cv_.notify_all();
  if (mover_.joinable()) mover_.join();
}

// ---- Presence ---------------------------------------------------------------

ChunkRef TieredStore::InTransit(const keys::Digest& key, size_t* target) const {
  std::lock_guard<std::mutex> lock(transit_mu_);
  auto it = in_transit_.find(key);
  if (it == in_transit_.end()) return nullptr;
  if (target) *target = it->second.second;
  return it->second.first;
}

bool TieredStore::ContainsAt(size_t level, const keys::Digest& key, const ReadContext& ctx) const {
  if (level >= levels_.size()) return false;
  if (levels_[level]->tier->Contains(key, ctx)) return true;
  size_t target = 0;
  return InTransit(key, &target) && target == level;
}

int TieredStore::Locate(const keys::Digest& key, const ReadContext& ctx) const {
  for (size_t i = 0; i < levels_.size(); ++i) {
    if (levels_[i]->tier->Contains(key, ctx)) return static_cast<int>(i);
  }
  size_t target = 0;
  return InTransit(key, &target) ? static_cast<int>(target) : -1;
}

// ---- Leases and pins --------------------------------------------------------

void TieredStore::ReleaseLease(const keys::Digest& key) {
  std::lock_guard<std::mutex> lock(lease_mu_);
  auto it = leases_.find(key);
  if (it != leases_.end() && --it->second == 0) leases_.erase(it);
}

bool TieredStore::Evictable(const keys::Digest& key) {
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    if (leases_.count(key)) return false;
  }
  std::lock_guard<std::mutex> lock(pin_mu_);
  auto it = pins_.find(key);
  if (it == pins_.end()) return true;
  if (it->second != 0 && it->second <= clock_->NowNs()) {
    pins_.erase(it);  // the TTL ran out: unpinned by force, and counted
    ++forced_unpins_;
    return true;
  }
  return false;
}

Status TieredStore::Pin(const keys::Digest& key, std::int64_t ttl_ns, const ReadContext& ctx) {
  if (ttl_ns < 0) return Status::InvalidArgument("pin TTL must not be negative");
  if (Locate(key, ctx) < 0) return Status::NotFound("pin: no such chunk in any tier");
  const std::int64_t deadline = ttl_ns == 0 ? 0 : DeadlineAfter(clock_->NowNs(), ttl_ns);
  std::lock_guard<std::mutex> lock(pin_mu_);
  auto [it, fresh] = pins_.emplace(key, deadline);
  if (!fresh && it->second != 0) it->second = deadline == 0 ? 0 : std::max(it->second, deadline);
  return Status::Ok();
}

Status TieredStore::PinUntil(const keys::Digest& key, std::int64_t deadline_ns, const ReadContext& ctx) {
  if (deadline_ns < 0) return Status::InvalidArgument("pin deadline must not be negative");
  if (Locate(key, ctx) < 0) return Status::NotFound("pin: no such chunk in any tier");
  std::lock_guard<std::mutex> lock(pin_mu_);
  pins_[key] = deadline_ns;
  return Status::Ok();
}

bool TieredStore::Unpin(const keys::Digest& key) {
  std::lock_guard<std::mutex> lock(pin_mu_);
  return pins_.erase(key) != 0;
}

// ---- Put and eviction -------------------------------------------------------

void TieredStore::Touch(Level& L, const keys::Digest& key, const ReadContext& ctx) {
  std::lock_guard<std::mutex> lock(L.policy_mu);
  if (L.tier->Contains(key, ctx)) L.policy->OnAccess(key);
}

void TieredStore::Level::Count(const keys::Digest& key, const keys::Digest& ns, std::uint64_t cost) {
  if (quotas.empty()) return;
  NamespaceUse* use = QuotaOf(ns);
  if (use == nullptr) return;
  auto [it, fresh] = owners.emplace(key, Owner{use, cost});
  if (!fresh) return;  // counted already (the policy's insert was not new either)
  use->used_bytes += cost;
  ++use->objects;
}

void TieredStore::Level::Uncount(const keys::Digest& key, Why why) {
  if (owners.empty()) return;
  auto it = owners.find(key);
  if (it == owners.end()) return;
  NamespaceUse& use = *it->second.use;
  use.used_bytes -= it->second.cost;
  --use.objects;
  if (why == Why::kQuota) ++use.quota_evictions;
  if (why == Why::kRoom) ++use.room_evictions;
  owners.erase(it);
}

std::vector<ChunkRef> TieredStore::MakeRoom(size_t li, std::uint64_t cost, bool hard,
                                            std::vector<keys::Digest>& dropped, const ReadContext& ctx,
                                            const keys::Digest* ns) {
  Level& L = *levels_[li];
  const auto cap = static_cast<double>(L.tier->capacity_bytes());
  std::vector<ChunkRef> victims;
  // What is measured against what: the level's bytes against its watermark
  // (or capacity), or a namespace's bytes against its quota.
  NamespaceUse* use = nullptr;
  double limit = 0, target = 0;
  const auto used_now = [&]() -> std::uint64_t {
    if (use == nullptr) return L.tier->used_bytes();
    std::lock_guard<std::mutex> lock(L.policy_mu);
    return use->used_bytes;
  };
  if (ns != nullptr) {
    {
      std::lock_guard<std::mutex> lock(L.policy_mu);
      use = L.QuotaOf(*ns);
    }
    if (use == nullptr) return victims;
    limit = static_cast<double>(use->quota_bytes);
    target = limit - static_cast<double>(cost);
  } else {
    limit = hard ? cap : L.high * cap;
    // Down to the low watermark (or just under the capacity when hard).
    target = (hard ? cap : L.low * cap) - static_cast<double>(cost);
  }
  std::uint64_t used = used_now();
  if (static_cast<double>(used + cost) <= limit) return victims;
  const bool next_exists = li + 1 < levels_.size();
  // The followers of the victims (Tie), evicted right after them whatever
  // room is left.
  std::deque<keys::Digest> tied;
  while (static_cast<double>(used) > target || !tied.empty()) {
    std::optional<keys::Digest> victim;
    if (!tied.empty()) {
      const keys::Digest follower = tied.front();
      tied.pop_front();
      if (!L.tier->Contains(follower, ctx) || !Evictable(follower)) continue;
      victim = follower;
    } else {
      std::lock_guard<std::mutex> lock(L.policy_mu);
      if (use != nullptr) {  // the namespace's own
        victim = L.policy->Victim([&](const keys::Digest& k) {
          auto it = L.owners.find(k);
          return it != L.owners.end() && it->second.use == use && Evictable(k);
        });
      } else if (!L.quotas.empty()) {  // namespaces without a quota first
        victim = L.policy->Victim([&](const keys::Digest& k) { return L.owners.count(k) == 0 && Evictable(k); });
      }
      if (!victim && use == nullptr) victim = L.policy->Victim([&](const keys::Digest& k) { return Evictable(k); });
    }
    if (!victim) break;  // everything left is leased or pinned
    ChunkRef ref;
    if (next_exists && !levels_[li + 1]->tier->Contains(*victim, ctx)) {
      auto got = L.tier->Get(*victim);
      if (got.ok()) {
        // A heap copy: the tier's block is free as soon as it is erased,
        // however long the demotion waits in the mover's queue.
        auto copy = std::make_shared<Chunk>();
        copy->meta = (*got)->meta;
        copy->payload = Payload((*got)->payload.data(), (*got)->payload.size());
        ref = std::move(copy);
        std::lock_guard<std::mutex> lock(transit_mu_);
        in_transit_[*victim] = {ref, li + 1};
      }
    }
    const bool erased = L.tier->Erase(*victim);
    {
      std::lock_guard<std::mutex> lock(L.policy_mu);
      L.policy->OnRemove(*victim);
      L.Uncount(*victim, use != nullptr ? Level::Why::kQuota : Level::Why::kRoom);
    }
    if (erased && on_level_) on_level_(*victim, li, false);
    ++L.evictions;
    if (!next_exists) dropped.push_back(*victim);
    if (ref) victims.push_back(std::move(ref));
    used = used_now();
    for (const keys::Digest& f : Followers(*victim)) tied.push_back(f);
  }
  return victims;
}

Status TieredStore::PutAt(size_t li, const ChunkRef& chunk, bool from_mover, JobKind why, const ReadContext& ctx) {
  Level& L = *levels_[li];
  const keys::Digest& key = chunk->meta.key;
  ChunkRef stored = chunk;
  if (!pass_through_ && chunk->meta.codec != L.codec_id()) {
    if (L.tier->Contains(key, ctx)) {  // present already: not worth an encode
      Touch(L, key, ctx);
      return Status::Ok();
    }
    // Outside the level's lock: encoding is the slow part of a put.
    Result<ChunkRef> form = StoredForm(li, chunk);
    if (!form.ok()) {
      ++L.put_refusals;
      return form.status();
    }
    stored = std::move(form).value();
  }
  std::vector<ChunkRef> victims;
  std::vector<keys::Digest> dropped;
  Status st;
  bool inserted = false;
  {
    // The tier's write (and fsync) and the evictions before it happen under
    // the level's write lock only: readers of the level never wait on them.
    std::lock_guard<std::mutex> write_lock(L.write_mu);
    if (L.tier->Contains(key, ctx)) {
      Touch(L, key, ctx);
      return Status::Ok();
    }
    const std::uint64_t cost = L.tier->Cost(*stored);
    if (cost > L.tier->capacity_bytes()) {
      ++L.put_refusals;
      return Status(Code::kBusy, L.tier->name() + ": object larger than the tier");
    }
    if (!L.quotas.empty()) {
      // The namespace's quota first: its own coldest chunks make room.
      const keys::Digest& ns = stored->meta.ns_hash;
      std::uint64_t quota = UINT64_MAX;
      {
        std::lock_guard<std::mutex> lock(L.policy_mu);
        if (NamespaceUse* use = L.QuotaOf(ns)) {
          quota = use->quota_bytes;
          if (cost > quota) ++use->refused;
        }
      }
      if (cost > quota) {
        ++L.put_refusals;
        return Status(Code::kBusy, L.tier->name() + ": object larger than its namespace's quota");
      }
      if (quota != UINT64_MAX) victims = MakeRoom(li, cost, /*hard=*/false, dropped, ctx, &ns);
    }
    {
      auto room = MakeRoom(li, cost, /*hard=*/false, dropped, ctx);
      victims.insert(victims.end(), std::make_move_iterator(room.begin()), std::make_move_iterator(room.end()));
    }
    st = L.tier->Put(stored);
    if (st.code() == Code::kBusy) {  // full after all: evict to the capacity and retry once
      auto more = MakeRoom(li, cost, /*hard=*/true, dropped, ctx);
      victims.insert(victims.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
      st = L.tier->Put(stored);
    }
    if (st.ok()) {
      {
        std::lock_guard<std::mutex> lock(L.policy_mu);
        L.policy->OnInsert(key, cost, PrefillValue(stored->meta));
        L.Count(key, stored->meta.ns_hash, cost);
      }
      inserted = true;
      if (on_level_) on_level_(key, li, true);
      ++L.puts;
      L.bytes_in += cost;
      if (why == JobKind::kDemote) ++L.demotions_in;
      if (why == JobKind::kPromote) ++L.promotions_in;
    } else {
      ++L.put_refusals;
    }
  }
  if (on_drop_) {
    for (const keys::Digest& k : dropped) {
      if (Locate(k, ctx) < 0) on_drop_(k);  // a higher level may still hold a copy
    }
  }
  UntieGone(dropped, ctx);
  Demote(li, std::move(victims), from_mover);
  if (inserted && L.write_through && li + 1 < levels_.size()) {
    if (from_mover) {
      (void)PutAt(li + 1, chunk, true, JobKind::kCopy, ReadContext{});
    } else {
      Enqueue(Job{JobKind::kCopy, chunk, li + 1}, /*wait=*/true);
    }
  }
  return st;
}

void TieredStore::Demote(size_t from, std::vector<ChunkRef> victims, bool from_mover) {
  if (from + 1 >= levels_.size()) return;
  for (ChunkRef& v : victims) {
    if (from_mover) {
      DemoteNow(from, v);
    } else {
      Enqueue(Job{JobKind::kDemote, std::move(v), from + 1}, /*wait=*/true);
    }
  }
}

void TieredStore::DemoteNow(size_t from, const ChunkRef& victim) {
  ChunkRef c = victim;
  // An encoded victim goes down as it is when the next level has the same
  // codec (no second lossy pass); it is decoded first for another codec,
  // or when the editor may still have to see its KV.
  const bool editable = editor_ && !c->meta.edited;
  if (!pass_through_ && c->meta.codec != codec::CodecId::kRaw && (c->meta.codec != levels_[from + 1]->codec_id() || editable)) {
    Result<ChunkRef> raw = Canonical(from, c);
    if (!raw.ok()) {  // unreadable: dropped, as a corrupt object would be
      EndTransit(victim);
      UntieGone(std::span<const keys::Digest>(&victim->meta.key, 1), ReadContext{});
      return;
    }
    c = std::move(raw).value();
  }
  c = ApplyEdit(c);  // edits land before lower tiers see the chunk
  const Status st = PutAt(from + 1, c, /*from_mover=*/true, JobKind::kDemote, ReadContext{});
  EndTransit(victim);
  // No lower level took it (and none holds it): it is gone.
  if (!st.ok() && on_drop_ && Locate(victim->meta.key) < 0) on_drop_(victim->meta.key);
  if (!st.ok()) UntieGone(std::span<const keys::Digest>(&victim->meta.key, 1), ReadContext{});
}

Result<ChunkRef> TieredStore::StoredForm(size_t li, const ChunkRef& chunk) {
  Level& L = *levels_[li];
  if (chunk->meta.codec == L.codec_id()) return chunk;
  ChunkRef raw = chunk;
  if (chunk->meta.codec != codec::CodecId::kRaw) {
    // In another level's codec (the callers pass canonical chunks or this
    // level's own form; kept correct for any input all the same).
    Result<ChunkRef> decoded = Canonical(li, chunk);
    if (!decoded.ok()) return decoded.status();
    raw = std::move(decoded).value();
  }
  if (!L.codec) return raw;
  // A chunk that must stay exact is kept raw where the codec is lossy.
  if (raw->meta.exact && codec::IsLossy(L.codec->id())) return raw;
  const auto t0 = std::chrono::steady_clock::now();
  Result<ChunkRef> encoded = EncodeChunk(*L.codec, *raw);
  L.encode_ns += NsSince(t0);
  if (!encoded.ok()) {
    // Stored raw: a cold tier holding canonical bytes beats a lost chunk.
    ++L.encode_failures;
    return raw;
  }
  ++L.encoded;
  L.encode_in += raw->payload.size();
  L.encode_out += (*encoded)->payload.size();
  return encoded;
}

Result<ChunkRef> TieredStore::Canonical(size_t li, const ChunkRef& stored) {
  if (pass_through_ || stored->meta.codec == codec::CodecId::kRaw) return stored;
  Level& L = *levels_[li];
  const auto t0 = std::chrono::steady_clock::now();
  Result<ChunkRef> raw = DecodeChunk(stored);
  L.decode_ns += NsSince(t0);
  if (raw.ok()) {
    ++L.decoded;
  } else if (raw.status().code() != Code::kNoMemory) {
    ++L.decode_failures;
  }
  return raw;
}

bool TieredStore::TakesDevicePayloads() const {
  const Level& top = *levels_.front();
  return top.tier->TakesDevicePayloads() && top.codec_id() == codec::CodecId::kRaw && !top.write_through &&
         !editor_ && !pass_through_;
}

Payload TieredStore::Reserve(std::uint64_t bytes) {
  if (!pass_through_ || levels_.empty()) return {};
  return levels_[0]->tier->Reserve(bytes);
}

Status TieredStore::Put(ChunkRef chunk, const ReadContext& ctx) {
  if (!chunk) return Status::InvalidArgument("put: null chunk");
  if (chunk->meta.device) {
    // Only the top level, when it holds device memory as it is: every other
    // path (encoding, lower tiers) reads the payload on the host.
    if (!TakesDevicePayloads()) return Status::Unsupported("put: the top tier does not take chunks in device memory");
    return PutAt(0, chunk, /*from_mover=*/false, JobKind::kCopy, ctx);
  }
  Status last;
  for (size_t i = 0; i < levels_.size(); ++i) {
    last = PutAt(i, chunk, /*from_mover=*/false, JobKind::kCopy, ctx);
    if (last.ok()) {
      if (editor_ && !chunk->meta.edited) {
        {
          std::lock_guard<std::mutex> lock(queue_mu_);
          pending_edits_.emplace(chunk->meta.key, nullptr);
        }
        Enqueue(Job{JobKind::kEdit, chunk, i}, /*wait=*/true);
      }
      return last;
    }
  }
  return Status(Code::kBusy, "no tier could take the chunk: " + last.message());
}

// ---- Get --------------------------------------------------------------------

Result<Lease> TieredStore::Get(const keys::Digest& key, Form form, const ReadContext& ctx) {
  const bool stored_form = form == Form::kStored;
  for (size_t i = 0; i < levels_.size(); ++i) {
    Level& L = *levels_[i];
    if (!L.tier->Contains(key, ctx)) {
      ++L.misses;
      continue;
    }
    // A device tier's own block only when it holds raw KV: a reader on the
    // device decodes payloads from host memory.
    auto got = stored_form && L.codec_id() == codec::CodecId::kRaw ? L.tier->GetResident(key, ctx) : L.tier->Get(key, ctx);
    if (!got.ok()) {  // evicted meanwhile, or corrupt (the tier removed it)
      ++L.misses;
      std::lock_guard<std::mutex> lock(L.policy_mu);
      if (!L.tier->Contains(key, ctx)) {
        L.policy->OnRemove(key);
        L.Uncount(key, Level::Why::kGone);
      }
      continue;
    }
    Result<ChunkRef> raw = stored_form ? Result<ChunkRef>(*got) : Canonical(i, *got);
    if (!raw.ok()) {
      ++L.misses;
      if (raw.status().code() == Code::kCorrupt) {
        // A payload that does not decode stays unreadable: removed, as the
        // tier removes objects that fail its own checks (counted in Canonical).
        // A write (rare): under the write lock, as every removal.
        std::lock_guard<std::mutex> write_lock(L.write_mu);
        if (L.tier->Erase(key, ctx) && on_level_) on_level_(key, i, false);
        std::lock_guard<std::mutex> lock(L.policy_mu);
        L.policy->OnRemove(key);
        L.Uncount(key, Level::Why::kGone);
      }
      continue;
    }
    Lease lease;
    {
      std::lock_guard<std::mutex> lock(lease_mu_);
      ++leases_[key];
    }
    ++leases_total_;
    lease.store_ = this;
    lease.chunk_ = std::move(raw).value();
    lease.level_ = static_cast<int>(i);
    Touch(L, key, ctx);
    ++L.hits;
    L.bytes_out += lease.chunk_->payload.size();
    if (i > 0 && !lease.chunk_->meta.device && !lease.chunk_->meta.degraded && !levels_[0]->tier->Contains(key, ctx)) {
      // Promote in the background; never make a reader wait for room.
      if (!Enqueue(Job{JobKind::kPromote, lease.chunk_, 0}, /*wait=*/false)) ++promotions_dropped_;
    }
    return lease;
  }
  size_t target = 0;
  if (ChunkRef moving = InTransit(key, &target)) {  // evicted, on its way down
    // In the stored form of the level it left (a heap copy: host memory).
    Result<ChunkRef> raw = stored_form ? Result<ChunkRef>(moving) : Canonical(target - 1, moving);
    if (!raw.ok()) return Status::NotFound("the chunk on its way down does not decode: " + raw.status().message());
    moving = std::move(raw).value();
    Lease lease;
    {
      std::lock_guard<std::mutex> lock(lease_mu_);
      ++leases_[key];
    }
    ++leases_total_;
    lease.store_ = this;
    lease.chunk_ = std::move(moving);
    lease.level_ = static_cast<int>(target);
    ++levels_[target]->hits;
    levels_[target]->bytes_out += lease.chunk_->payload.size();
    return lease;
  }
  return Status::NotFound("no tier holds the chunk");
}

void TieredStore::RecordDecode(size_t li, const keys::Digest& key, const Status& outcome, std::uint64_t ns) {
  if (li >= levels_.size()) return;
  Level& L = *levels_[li];
  L.decode_ns += ns;
  if (outcome.ok()) {
    ++L.decoded;
    return;
  }
  if (outcome.code() != Code::kCorrupt) return;
  ++L.decode_failures;
  std::lock_guard<std::mutex> write_lock(L.write_mu);
  if (L.tier->Erase(key) && on_level_) on_level_(key, li, false);
  std::lock_guard<std::mutex> lock(L.policy_mu);
  L.policy->OnRemove(key);
  L.Uncount(key, Level::Why::kGone);
}

void TieredStore::EndTransit(const ChunkRef& chunk) {
  std::lock_guard<std::mutex> lock(transit_mu_);
  auto it = in_transit_.find(chunk->meta.key);
  if (it != in_transit_.end() && it->second.first == chunk) in_transit_.erase(it);
}

// ---- Erase ------------------------------------------------------------------

bool TieredStore::Erase(const keys::Digest& key, const ReadContext& ctx) {
  return EraseMany(std::span<const keys::Digest>(&key, 1), ctx);
}

bool TieredStore::EraseMany(std::span<const keys::Digest> keys, const ReadContext& ctx) {
  if (keys.empty()) return false;
  const std::unordered_set<keys::Digest, keys::DigestHash> gone(keys.begin(), keys.end());
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (gone.count(it->chunk->meta.key) != 0) {
        queued_bytes_ -= it->chunk->payload.size();
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (const keys::Digest& k : keys) pending_edits_.erase(k);
    space_cv_.notify_all();
    space_cv_.wait(lock, [&] { return !(in_flight_ && gone.count(in_flight_key_) != 0); });
  }
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(transit_mu_);
    for (const keys::Digest& k : keys) any = in_transit_.erase(k) != 0 || any;
  }
  for (size_t li = 0; li < levels_.size(); ++li) {
    auto& level = levels_[li];
    std::lock_guard<std::mutex> write_lock(level->write_mu);
    if (on_level_) {  // which of them this level holds, to tell (an erase is rare; a lookup each is cheap)
      for (const keys::Digest& k : keys) {
        if (level->tier->Contains(k, ctx) && level->tier->Erase(k, ctx)) {
          any = true;
          on_level_(k, li, false);
        }
      }
    }
    if (level->tier->EraseMany(keys, ctx) > 0) any = true;
    std::lock_guard<std::mutex> lock(level->policy_mu);
    for (const keys::Digest& k : keys) {
      level->policy->OnRemove(k);
      level->Uncount(k, Level::Why::kGone);
    }
  }
  for (const keys::Digest& k : keys) {
    Unpin(k);
    Untie(k);
  }
  return any;
}

// ---- Ties -------------------------------------------------------------------

namespace {

void AddOnce(std::vector<keys::Digest>& v, const keys::Digest& k) {
  if (std::find(v.begin(), v.end(), k) == v.end()) v.push_back(k);
}

// Removes k from the list at map[at], and the list once empty.
void RemoveFrom(std::unordered_map<keys::Digest, std::vector<keys::Digest>, keys::DigestHash>& map,
                const keys::Digest& at, const keys::Digest& k) {
  auto it = map.find(at);
  if (it == map.end()) return;
  std::erase(it->second, k);
  if (it->second.empty()) map.erase(it);
}

}  // namespace

bool TieredStore::Tie(const keys::Digest& follower, std::span<const keys::Digest> leaders) {
  std::lock_guard<std::mutex> lock(tie_mu_);
  if (leaders_.count(follower) == 0 && leaders_.size() >= max_tied_) {
    ++ties_refused_;
    return false;
  }
  for (const keys::Digest& l : leaders) {
    if (l == follower) continue;
    AddOnce(followers_[l], follower);
    AddOnce(leaders_[follower], l);
  }
  return true;
}

size_t TieredStore::TiedObjects() const {
  std::lock_guard<std::mutex> lock(tie_mu_);
  std::unordered_set<keys::Digest, keys::DigestHash> all;
  for (const auto& [k, v] : followers_) all.insert(k);
  for (const auto& [k, v] : leaders_) all.insert(k);
  return all.size();
}

std::vector<keys::Digest> TieredStore::Followers(const keys::Digest& leader) const {
  std::lock_guard<std::mutex> lock(tie_mu_);
  auto it = followers_.find(leader);
  return it == followers_.end() ? std::vector<keys::Digest>{} : it->second;
}

void TieredStore::Untie(const keys::Digest& key) {
  std::lock_guard<std::mutex> lock(tie_mu_);
  if (auto it = followers_.find(key); it != followers_.end()) {
    for (const keys::Digest& f : it->second) RemoveFrom(leaders_, f, key);
    followers_.erase(it);
  }
  if (auto it = leaders_.find(key); it != leaders_.end()) {
    for (const keys::Digest& l : it->second) RemoveFrom(followers_, l, key);
    leaders_.erase(it);
  }
}

void TieredStore::UntieGone(std::span<const keys::Digest> keys, const ReadContext& ctx) {
  for (const keys::Digest& k : keys) {
    {
      std::lock_guard<std::mutex> lock(tie_mu_);
      if (followers_.count(k) == 0 && leaders_.count(k) == 0) continue;
    }
    if (Locate(k, ctx) < 0) Untie(k);
  }
}

// ---- The mover --------------------------------------------------------------

bool TieredStore::Enqueue(Job job, bool wait) {
  const std::uint64_t bytes = job.chunk->payload.size();
  std::unique_lock<std::mutex> lock(queue_mu_);
  auto full = [&] {
    return !queue_.empty() && (queue_.size() >= queue_objects_ || queued_bytes_ + bytes > queue_bytes_);
  };
  if (full()) {
    if (!wait) return false;
    ++backpressure_waits_;
    space_cv_.wait(lock, [&] { return !full() || stop_; });
  }
  queued_bytes_ += bytes;
  queue_.push_back(std::move(job));
  queue_cv_.notify_one();
  return true;
}

void TieredStore::MoverLoop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and drained
      job = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= job.chunk->payload.size();
      in_flight_ = true;
      in_flight_key_ = job.chunk->meta.key;
      space_cv_.notify_all();
    }
    RunJob(job);
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      in_flight_ = false;
    }
    space_cv_.notify_all();
  }
}

ChunkRef TieredStore::RunEditor(const ChunkRef& chunk) {
  auto copy = std::make_shared<Chunk>();
  copy->meta = chunk->meta;
  copy->payload = Payload(chunk->payload.data(), chunk->payload.size());
  auto changed = editor_->Edit(*copy);
  if (!changed.ok()) {
    ++edit_errors_;
    return chunk;
  }
  if (!*changed) return chunk;
  ++edits_;
  copy->meta.edited = true;
  return copy;
}

ChunkRef TieredStore::ApplyEdit(const ChunkRef& chunk) {
  if (!editor_ || chunk->meta.edited) return chunk;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    auto it = pending_edits_.find(chunk->meta.key);
    if (it == pending_edits_.end()) return chunk;  // not subject to editing (or done and placed)
    if (it->second) {                              // edited while it was on its way down
      ChunkRef edited = std::move(it->second);
      pending_edits_.erase(it);
      return edited;
    }
    pending_edits_.erase(it);
  }
  return RunEditor(chunk);
}

bool TieredStore::ReplaceEverywhere(const ChunkRef& edited, const std::vector<ChunkRef>& forms) {
  bool placed = false;
  for (size_t li = 0; li < levels_.size(); ++li) {
    auto& level = levels_[li];
    std::lock_guard<std::mutex> write_lock(level->write_mu);
    if (!level->tier->Contains(edited->meta.key)) continue;
    ChunkRef form = li < forms.size() ? forms[li] : nullptr;
    if (!form) {  // reached this level after the forms were made: encode here
      Result<ChunkRef> made = StoredForm(li, edited);
      if (made.ok()) form = std::move(made).value();
    }
    level->tier->Erase(edited->meta.key);
    if (form && level->tier->Put(form).ok()) {
      placed = true;
    } else {
      if (on_level_) on_level_(edited->meta.key, li, false);
      std::lock_guard<std::mutex> lock(level->policy_mu);
      level->policy->OnRemove(edited->meta.key);
      level->Uncount(edited->meta.key, Level::Why::kGone);
    }
  }
  return placed;
}

void TieredStore::RunJob(Job& job) {
  switch (job.kind) {
    case JobKind::kEdit: {
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        auto it = pending_edits_.find(job.chunk->meta.key);
        if (it == pending_edits_.end() || it->second) return;  // erased, or edited on its way down already
      }
      ChunkRef edited = RunEditor(job.chunk);
      // The edited chunk in the form of each level holding it, encoded here,
      // before any lock is taken.
      std::vector<ChunkRef> forms(levels_.size());
      for (size_t li = 0; edited != job.chunk && li < levels_.size(); ++li) {
        if (!levels_[li]->tier->Contains(edited->meta.key)) continue;
        Result<ChunkRef> form = StoredForm(li, edited);
        if (form.ok()) forms[li] = std::move(form).value();
      }
      std::lock_guard<std::mutex> lock(queue_mu_);
      auto it = pending_edits_.find(job.chunk->meta.key);
      if (it == pending_edits_.end()) return;  // erased meanwhile
      if (edited == job.chunk || ReplaceEverywhere(edited, forms)) {
        pending_edits_.erase(it);
      } else {
        it->second = edited;  // no tier holds it now: its queued demotion takes the edit
      }
      return;
    }
    case JobKind::kPromote:
      if (Locate(job.chunk->meta.key) < 0) return;  // erased or evicted everywhere meanwhile
      (void)PutAt(job.target, job.chunk, /*from_mover=*/true, JobKind::kPromote, ReadContext{});
      return;
    case JobKind::kDemote:
      DemoteNow(job.target - 1, job.chunk);
      return;
    case JobKind::kCopy: {
      ChunkRef c = ApplyEdit(job.chunk);  // edits land before lower tiers see the chunk
      (void)PutAt(job.target, c, /*from_mover=*/true, job.kind, ReadContext{});
      return;
    }
  }
}

void TieredStore::Flush() {
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    space_cv_.wait(lock, [&] { return queue_.empty() && !in_flight_; });
  }
  for (const auto& l : levels_) l->tier->Flush();  // write-back queues of the tiers themselves
}

// ---- Statistics -------------------------------------------------------------

std::vector<LevelStats> TieredStore::Stats() const {
  std::vector<LevelStats> out;
  for (const auto& l : levels_) {
    LevelStats s;
    s.name = l->tier->name();
    s.hits = l->hits;
    s.misses = l->misses;
    s.puts = l->puts;
    s.put_refusals = l->put_refusals;
    s.evictions = l->evictions;
    s.demotions_in = l->demotions_in;
    s.promotions_in = l->promotions_in;
    s.bytes_in = l->bytes_in;
    s.bytes_out = l->bytes_out;
    s.objects = l->tier->objects();
    s.used_bytes = l->tier->used_bytes();
    s.capacity_bytes = l->tier->capacity_bytes();
    const TierCounters tc = l->tier->counters();
    s.corrupt_detected = tc.corrupt_detected + l->decode_failures;
    s.auth_failures = tc.auth_failures;
    s.io_errors = tc.io_errors;
    s.codec = l->codec ? l->codec->spec().ToString() : "raw";
    s.encoded_chunks = l->encoded;
    s.bytes_before_encoding = l->encode_in;
    s.bytes_after_encoding = l->encode_out;
    s.encode_failures = l->encode_failures;
    s.decoded_chunks = l->decoded;
    s.decode_failures = l->decode_failures;
    s.encode_ns = l->encode_ns;
    s.decode_ns = l->decode_ns;
    out.push_back(s);
  }
  return out;
}

std::vector<NamespaceUse> TieredStore::Namespaces(size_t level) const {
  std::vector<NamespaceUse> out;
  if (level >= levels_.size()) return out;
  const Level& L = *levels_[level];
  std::lock_guard<std::mutex> lock(L.policy_mu);
  for (const keys::Digest& ns : L.quota_order) out.push_back(L.quotas.at(ns));
  return out;
}

StoreCounters TieredStore::Counters() const {
  StoreCounters c;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    for (const auto& [k, n] : leases_) c.leases_active += n;
  }
  c.leases_total = leases_total_;
  {
    std::lock_guard<std::mutex> lock(pin_mu_);
    const std::int64_t now = clock_->NowNs();
    for (const auto& [k, deadline] : pins_) c.pins_active += deadline == 0 || deadline > now;
  }
  c.pins_forced_unpin = forced_unpins_;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    c.mover_queue_depth = queue_.size();
  }
  c.mover_backpressure_waits = backpressure_waits_;
  c.promotions_dropped = promotions_dropped_;
  c.edits = edits_;
  c.edit_errors = edit_errors_;
  {
    std::lock_guard<std::mutex> lock(tie_mu_);
    c.tied_objects = leaders_.size();
  }
  c.ties_refused = ties_refused_;
  return c;
}

}  // namespace kdn::store
