// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/leveled_tier.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/store/chunk_codec.h"

namespace kdn::store {
namespace {

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What a codec is expected to make of canonical f16/f32 KV before a chunk of
// its level was seen (then its real size is used): a start, nothing more.
double NominalRatio(codec::CodecId id) {
  switch (id) {
    case codec::CodecId::kRaw: return 1.0;
    case codec::CodecId::kZstd: return 1.15;
    case codec::CodecId::kInt8:
    case codec::CodecId::kFp8: return 1.9;
    case codec::CodecId::kCacheGen: return 2.6;
    case codec::CodecId::kKivi2: return 3.5;
    case codec::CodecId::kKdn: return 4.0;
    case codec::CodecId::kTc: return 8.0;
    case codec::CodecId::kEncrypted: return 1.0;
  }
  return 1.0;
}

constexpr double kWeight = 0.5;  // of the newest sample, in the per-level averages

// `c` under another key (its payload shared, not copied).
ChunkRef Rekeyed(const ChunkRef& c, const keys::Digest& key, bool degraded) {
  auto out = std::make_shared<Chunk>();
  out->meta = c->meta;
  out->meta.key = key;
  out->meta.degraded = degraded;
  out->payload = Payload::Adopt(const_cast<std::uint8_t*>(c->payload.data()), c->payload.size(),
                                 std::const_pointer_cast<Chunk>(c));
  return out;
}

}  // namespace

keys::Digest LevelKey(const keys::Digest& key, size_t level) {
  if (level == 0) return key;
  keys::Hasher h;
  h.Str("kdn-level-v1").Bytes(key.data(), key.size()).U32(static_cast<std::uint32_t>(level));
  return h.Finish();
}

// ---- LinkMeter -------------------------------------------------------------------

void LinkMeter::Observe(std::uint64_t bytes, std::int64_t sent_ns, std::int64_t arrived_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  // The link was busy with this reply from its request, or from the previous
  // arrival when the request went out while another reply was still coming.
  const std::int64_t from = std::max(sent_ns, last_arrival_);
  last_arrival_ = std::max(last_arrival_, arrived_ns);
  const double busy_s = static_cast<double>(arrived_ns - from) * 1e-9;
  if (busy_s <= 0 || bytes == 0) return;
  window_.emplace_back(static_cast<double>(bytes), busy_s);
  bytes_ += static_cast<double>(bytes);
  busy_s_ += busy_s;
  if (window_.size() > kWindow) {
    bytes_ -= window_.front().first;
    busy_s_ -= window_.front().second;
    window_.pop_front();
  }
  ++samples_;
}

double LinkMeter::rate() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_s_ > 0 ? bytes_ / busy_s_ : 0;
}

std::uint64_t LinkMeter::samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}

// ---- The decision ------------------------------------------------------------------

int ChooseLevel(const LevelChoiceInput& in) {
  const int levels = static_cast<int>(in.bytes_per_token.size());
  if (levels == 0) return -1;
  if (in.rate <= 0) return levels - 1;  // unknown link: the cheapest probe
  const auto per_token = [&](int l) {
    const double dec = l < static_cast<int>(in.decode_s_per_token.size()) ? in.decode_s_per_token[l] : 0.0;
    // Transfer and decode overlap (the next chunk is on the wire while this one decodes).
    return std::max(in.bytes_per_token[l] / in.rate, dec);
  };
  constexpr double kMargin = 0.8;
  const double inflight_s = in.inflight_bytes / in.rate;
  for (int l = 0; l < levels; ++l) {
    if (in.recompute_s_pending + inflight_s + in.tokens_left * per_token(l) <= kMargin * in.time_left_s) return l;
  }
  const double coarsest = in.chunk_tokens * per_token(levels - 1);
  if (in.recompute_s_per_token <= 0) return -1;
  return kRecomputeCostFactor * in.chunk_tokens * in.recompute_s_per_token <= coarsest ? -1 : levels - 1;
}

// ---- LeveledTier ---------------------------------------------------------------------

// A chunk a stream holds for its Get: decided (level, or -1), then fetched.
struct LeveledTier::Entry {
  bool done = false;
  Result<ChunkRef> chunk = Status::NotFound("not fetched yet");
  std::int64_t stale_after_ns = 0;  // a Get after this fetches anew (its load is long over)
};

struct LeveledTier::Stream {
  std::vector<keys::Digest> keys;
  std::vector<std::shared_ptr<Entry>> entries;
  size_t next = 0;           // the next chunk to take
  DeliveryTarget target;
  std::optional<keys::Digest> ns;
  double recompute_s_pending = 0;
  double inflight_bytes = 0;  // estimated bytes of the chunks taken and not arrived
  bool absent = false;       // a key the node does not hold: the rest is not fetched
};

Result<std::unique_ptr<LeveledTier>> LeveledTier::Create(std::unique_ptr<Tier> inner,
                                                         const std::vector<std::string>& levels, int window) {
  if (!inner) return Status::InvalidArgument("levels: no tier to keep them in");
  if (levels.empty()) return Status::InvalidArgument("levels: none given");
  if (levels.size() > 8) return Status::InvalidArgument("levels: at most 8");
  if (window < 1 || window > 16) return Status::InvalidArgument("levels: window out of range 1..16");
  std::vector<std::shared_ptr<const codec::Codec>> codecs;
  std::vector<std::string> specs;
  for (const std::string& l : levels) {
    auto c = MakeTierCodec(l);
    if (!c.ok()) return Status::InvalidArgument("level '" + l + "': " + c.status().message());
    specs.push_back((*c)->spec().ToString());
    codecs.push_back(std::move(c).value());
  }
  return std::unique_ptr<LeveledTier>(new LeveledTier(std::move(inner), std::move(codecs), std::move(specs), window));
}

LeveledTier::LeveledTier(std::unique_ptr<Tier> inner, std::vector<std::shared_ptr<const codec::Codec>> codecs,
                         std::vector<std::string> specs, int window)
    : inner_(std::move(inner)),
      codecs_(std::move(codecs)),
      specs_(std::move(specs)),
      window_(window),
      bytes_per_token_(codecs_.size(), 0.0),
      decode_s_per_token_(codecs_.size(), 0.0),
      fetched_(new std::atomic<std::uint64_t>[codecs_.size()]) {
  for (size_t i = 0; i < codecs_.size(); ++i) fetched_[i] = 0;
  for (int w = 0; w < window_; ++w) workers_.emplace_back([this] { Work(); });
}

LeveledTier::~LeveledTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void LeveledTier::Learn(size_t level, double bpt, double dec) const {
  std::lock_guard<std::mutex> lock(mu_);
  double& b = bytes_per_token_[level];
  b = b == 0 ? bpt : kWeight * bpt + (1 - kWeight) * b;
  if (dec >= 0) {
    double& d = decode_s_per_token_[level];
    d = d == 0 ? dec : kWeight * dec + (1 - kWeight) * d;
  }
}

std::vector<double> LeveledTier::BytesPerTokenLocked() const {
  std::vector<double> out = bytes_per_token_;
  // A level not seen yet: from a seen one, scaled by the codecs' nominal ratios.
  double raw = 0;
  for (size_t i = 0; i < out.size() && raw == 0; ++i) {
    if (out[i] > 0) raw = out[i] * NominalRatio(codecs_[i]->id());
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0) out[i] = raw > 0 ? raw / NominalRatio(codecs_[i]->id()) : 1.0;
  }
  return out;
}

Status LeveledTier::Put(const ChunkRef& chunk) {
  if (chunk->meta.codec != codec::CodecId::kRaw) {
    return Status::InvalidArgument("a leveled tier takes canonical chunks (its chain codec must be raw)");
  }
  // A chunk that must stay exact (a recurrent state snapshot) is kept raw,
  // as level 0 only: a load that chooses a coarser level misses it.
  if (chunk->meta.exact) return inner_->Put(chunk);
  const double tokens = std::max<double>(1, chunk->meta.tokens);
  // Coarsest first: level 0 (the key itself) last, so that a reader that
  // finds the key finds every level (a write-back tier sends them in order).
  for (size_t l = codecs_.size(); l-- > 0;) {
    Result<ChunkRef> enc = codecs_[l]->id() == codec::CodecId::kRaw ? Result<ChunkRef>(chunk) : EncodeChunk(*codecs_[l], *chunk);
    if (!enc.ok()) return Status(enc.status().code(), "level '" + specs_[l] + "': " + enc.status().message());
    ChunkRef put = l > 0 ? Rekeyed(*enc, LevelKey(chunk->meta.key, l), false) : *enc;
    Learn(l, static_cast<double>(put->payload.size()) / tokens, -1);
    KDN_RETURN_IF_ERROR(inner_->Put(put));
  }
  return Status::Ok();
}

Result<ChunkRef> LeveledTier::Fetch(const keys::Digest& key, size_t level, const ReadContext& ctx) const {
  const std::int64_t sent = NowNs();
  Result<ChunkRef> got = inner_->Get(LevelKey(key, level), ctx);
  const std::int64_t arrived = NowNs();
  if (!got.ok()) return got;
  const ChunkRef& c = *got;
  const double tokens = std::max<double>(1, c->meta.tokens);
  link_.Observe(c->payload.size(), sent, arrived);
  Result<ChunkRef> raw = DecodeChunk(c);
  const std::int64_t decoded = NowNs();
  if (!raw.ok()) return raw;
  Learn(level, static_cast<double>(c->payload.size()) / tokens, static_cast<double>(decoded - arrived) * 1e-9 / tokens);
  fetched_[level].fetch_add(1, std::memory_order_relaxed);
  return level > 0 || (*raw)->meta.key != key ? Rekeyed(*raw, key, level > 0) : *raw;
}

Result<ChunkRef> LeveledTier::Get(const keys::Digest& key, const ReadContext& ctx) {
  std::shared_ptr<Entry> e;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (auto it = pending_.find(key); it != pending_.end()) {
      e = it->second;
      pending_.erase(it);
      if (e->done && e->stale_after_ns < NowNs()) {
        lock.unlock();
        return Fetch(key, 0, ctx);
      }
      cv_.wait(lock, [&] { return e->done || stop_; });
      if (!e->done) return Status::NotFound("the tier is closing");
      return e->chunk;
    }
  }
  return Fetch(key, 0, ctx);
}

bool LeveledTier::Erase(const keys::Digest& key, const ReadContext& ctx) {
  std::vector<keys::Digest> all;
  for (size_t l = 0; l < codecs_.size(); ++l) all.push_back(LevelKey(key, l));
  return inner_->EraseMany(all, ctx) > 0;
}

size_t LeveledTier::EraseMany(std::span<const keys::Digest> keys, const ReadContext& ctx) {
  std::vector<keys::Digest> all;
  for (size_t l = 0; l < codecs_.size(); ++l) {
    for (const keys::Digest& k : keys) all.push_back(LevelKey(k, l));
  }
  // Counted by level 0: what the caller asked to erase.
  size_t held = 0;
  for (const keys::Digest& k : keys) held += inner_->Contains(k, ctx) ? 1 : 0;
  inner_->EraseMany(all, ctx);
  return held;
}

void LeveledTier::Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& ctx) const {
  inner_->Prefetch(keys, false, ctx);  // the batched probe of level 0
  if (!will_read || ctx.target.deadline_ns == 0 || keys.empty()) return;
  auto s = std::make_shared<Stream>();
  s->keys.assign(keys.begin(), keys.end());
  s->target = ctx.target;
  s->ns = ctx.ns;
  stream_count_.fetch_add(1, std::memory_order_relaxed);
  constexpr std::int64_t kStale = 2'000'000'000;
  const std::int64_t now = NowNs();
  std::lock_guard<std::mutex> lock(mu_);
  // What earlier loads left untaken (they stopped short), once stale.
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = it->second->done && it->second->stale_after_ns < now ? pending_.erase(it) : std::next(it);
  }
  for (const keys::Digest& k : s->keys) {
    auto e = std::make_shared<Entry>();
    e->stale_after_ns = std::max(s->target.deadline_ns, now) + kStale;
    s->entries.push_back(e);
    pending_[k] = e;  // replaces what an earlier stream left untaken
  }
  streams_.push_back(std::move(s));
  cv_.notify_all();
}

void LeveledTier::Work() const {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !streams_.empty(); });
    if (stop_) return;
    std::shared_ptr<Stream> s = streams_.front();
    const size_t i = s->next++;
    if (s->next >= s->keys.size()) streams_.erase(streams_.begin());
    std::shared_ptr<Entry> e = s->entries[i];
    const keys::Digest key = s->keys[i];
    int level = 0;
    double inflight = 0;
    if (s->absent) {
      level = -2;  // past the node's prefix: not fetched
    } else {
      LevelChoiceInput in;
      in.time_left_s = static_cast<double>(s->target.deadline_ns - NowNs()) * 1e-9;
      in.chunk_tokens = s->target.chunk_tokens;
      in.tokens_left = static_cast<double>(s->keys.size() - i) * s->target.chunk_tokens;
      in.rate = link_.rate();
      in.bytes_per_token = BytesPerTokenLocked();
      in.decode_s_per_token = decode_s_per_token_;
      in.recompute_s_per_token = s->target.recompute_ns_per_token * 1e-9;
      in.recompute_s_pending = s->recompute_s_pending;
      in.inflight_bytes = s->inflight_bytes;
      level = ChooseLevel(in);
      if (level < 0) s->recompute_s_pending += kRecomputeCostFactor * in.chunk_tokens * in.recompute_s_per_token;
      if (level >= 0) inflight = in.bytes_per_token[static_cast<size_t>(level)] * in.chunk_tokens;
      s->inflight_bytes += inflight;
    }
    lock.unlock();
    Result<ChunkRef> got = Status::NotFound("left to recompute: no level of it arrives within the load's target");
    if (level == -2) {
      got = Status::NotFound("not held");
    } else if (level == -1) {
      recomputes_.fetch_add(1, std::memory_order_relaxed);
    } else {
      ReadContext ctx;  // the stream's namespace, on this thread
      ctx.ns = s->ns;
      got = Fetch(key, static_cast<size_t>(level), ctx);
      if (!got.ok() && got.status().code() == Code::kNotFound && !inner_->Contains(key, ctx)) level = -2;
    }
    lock.lock();
    s->inflight_bytes -= inflight;
    if (level == -2) s->absent = true;
    e->chunk = std::move(got);
    e->done = true;
    cv_.notify_all();
  }
}

LeveledCounters LeveledTier::Counters() const {
  LeveledCounters c;
  for (size_t i = 0; i < codecs_.size(); ++i) c.fetched.push_back(fetched_[i].load(std::memory_order_relaxed));
  c.recomputes = recomputes_.load(std::memory_order_relaxed);
  c.streams = stream_count_.load(std::memory_order_relaxed);
  c.rate = link_.rate();
  return c;
}

}  // namespace kdn::store
