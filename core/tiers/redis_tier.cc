// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/redis_tier.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/wire/envelope.h"

namespace kdn::store {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

Result<std::vector<std::string>> ParseRedisSeeds(std::string_view list) {
  std::vector<std::string> seeds;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view seed = Trim(list.substr(0, comma));
    const size_t colon = seed.rfind(':');
    if (seed.empty() || colon == std::string_view::npos || colon == 0 || colon + 1 == seed.size() ||
        seed.find('\0') != std::string_view::npos) {
      return Status::InvalidArgument("redis tier: \"" + std::string(seed) + "\" is not host:port");
    }
    const std::string_view port = seed.substr(colon + 1);
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return Status::InvalidArgument("redis tier: \"" + std::string(seed) + "\": the port is not 1..65535");
    }
    seeds.emplace_back(seed);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return seeds;
}

Result<std::unique_ptr<RedisTier>> RedisTier::Create(const RedisTierOptions& options) {
  if (options.client.seeds.empty()) return Status::InvalidArgument("redis tier: no address");
  for (const std::string& seed : options.client.seeds) {
    auto parsed = ParseRedisSeeds(seed);
    if (!parsed.ok()) return parsed.status();
  }
  if (options.client.command_timeout_ms == 0 || options.client.connect_timeout_ms == 0) {
    return Status::InvalidArgument("redis tier: timeouts must be positive");
  }
  if (options.key_prefix.find('\0') != std::string::npos || options.key_prefix.size() > 256) {
    return Status::InvalidArgument("redis tier: the key prefix has a NUL byte or is longer than 256 bytes");
  }
  std::unique_ptr<RedisTier> t(new RedisTier(options));
  auto client = redis::Client::Connect(options.client);
  if (client.ok()) {
    t->client_ = std::shared_ptr<redis::Client>(std::move(client).value());
    ++t->connects_;
  } else if (client.status().code() == Code::kUnavailable || client.status().code() == Code::kTimeout) {
    // No server yet: misses until one answers (as a remote tier's node).
    ++t->connect_failures_;
    t->next_connect_ = Clock::now() + std::chrono::milliseconds(options.retry_ms);
  } else {
    return Status(client.status().code(), "redis tier: " + client.status().message());
  }
  return t;
}

RedisTier::~RedisTier() {
  {
    std::lock_guard<std::mutex> lock(reader_mu_);
    reader_stop_ = true;
    reader_jobs_.clear();
  }
  reader_cv_.notify_all();
  if (reader_.joinable()) reader_.join();
}

std::shared_ptr<redis::Client> RedisTier::client() const {
  {
    std::lock_guard<std::mutex> lock(client_mu_);
    if (client_) return client_;
    // One caller connects; the others miss at once meanwhile (as they do
    // for retry_ms after a failed try) rather than wait on the server.
    if (connecting_ || Clock::now() < next_connect_) return nullptr;
    connecting_ = true;
  }
  auto c = redis::Client::Connect(options_.client);
  std::lock_guard<std::mutex> lock(client_mu_);
  connecting_ = false;
  if (!c.ok()) {
    ++connect_failures_;
    next_connect_ = Clock::now() + std::chrono::milliseconds(options_.retry_ms);
    return nullptr;
  }
  ++connects_;
  client_ = std::shared_ptr<redis::Client>(std::move(c).value());
  return client_;
}

// A reply saying the key holds a value of another type than a string.
bool RedisTier::WrongType(const Status& st) { return st.message().find("WRONGTYPE") != std::string::npos; }

std::string RedisTier::KeyOf(const keys::Digest& key) const { return options_.key_prefix + keys::ToHex(key); }

std::uint64_t RedisTier::Cost(const Chunk& chunk) const {
  return wire::EncodedEnvelopeSize(wire::AtRestPayloadBytes(chunk, options_.cipher.get())) +
         (options_.sealer ? wire::kSealTrailerBytes : 0);
}

Status RedisTier::Put(const ChunkRef& given) {
  if (!given) return Status::InvalidArgument("redis tier: null chunk");
  Forget(given->meta.key);  // an answer held from before is stale now
  // Encrypted first, with master keys: the server never holds the KV in the clear.
  Result<ChunkRef> at_rest = wire::ToRest(given, options_.cipher.get());
  if (!at_rest.ok()) return at_rest.status();
  const ChunkRef& chunk = *at_rest;
  auto envelope = wire::EncodeEnvelope(*chunk);
  if (!envelope.ok()) return envelope.status();
  if (options_.sealer) {
    const size_t n = envelope->size();
    envelope->resize(n + wire::kSealTrailerBytes);
    KDN_RETURN_IF_ERROR(options_.sealer->Seal(envelope->data(), n, envelope->data() + n));
  }
  auto c = client();
  if (!c) {
    ++io_errors_;
    ++puts_failed_;
    return Status(Code::kUnavailable, options_.name + ": no Redis server answers");
  }
  const std::string key = KeyOf(chunk->meta.key);
  const redis::KeyValue item{key, std::span<const std::uint8_t>(envelope->data(), envelope->size())};
  const std::vector<Status> done = c->Set(std::span<const redis::KeyValue>(&item, 1), options_.ttl_ms);
  if (done.size() != 1 || !done[0].ok()) {
    ++io_errors_;
    ++failed_commands_;
    ++puts_failed_;
    return Status(Code::kUnavailable,
                  options_.name + ": SET failed: " + (done.empty() ? std::string("no reply") : done[0].message()));
  }
  ++puts_;
  return Status::Ok();
}

Result<ChunkRef> RedisTier::Decode(const keys::Digest& key, const redis::Value& value) const {
  // Zero copy: the chunk's payload stays in the reply, which it keeps alive.
  std::shared_ptr<void> owner = std::const_pointer_cast<void>(value.owner);
  // Without a secret, a sealed value's envelope is read as it is (another
  // runtime sealed it; this one cannot check it and takes what the server holds).
  size_t envelope = wire::EnvelopeBytesIgnoringSeal(value.data, value.size);
  Status sealed = Status::Ok();
  if (options_.sealer) sealed = options_.sealer->Open(value.data, value.size, &envelope);
  if (sealed.ok()) {
    Result<ChunkRef> chunk = wire::DecodeEnvelope(value.data, envelope, &key, std::move(owner));
    // Decrypted into a copy (a reply read ahead may serve more than one
    // reader); one that does not open is a failed authentication.
    if (chunk.ok()) {
      Result<ChunkRef> open = wire::FromRest(*chunk, options_.cipher.get(), options_.pass_through_encrypted);
      if (open.ok()) return open;
      ++auth_failures_;
    }
  } else {
    ++auth_failures_;
  }
  // Not an envelope of this key (or not sealed with this tier's secret): a
  // miss, counted, and the key removed (as the disk tier removes a corrupt
  // file). Best effort: a failed DEL is a miss all the same.
  ++corrupt_;
  if (auto c = client()) {
    const std::string k = KeyOf(key);
    const std::string_view kv = k;
    (void)c->Del(std::span<const std::string_view>(&kv, 1));
  }
  return Status::NotFound(options_.name + ": not held (a corrupt value was removed)");
}

bool RedisTier::AwaitLocked(std::unique_lock<std::mutex>& lock, const keys::Digest& key) const {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(options_.client.command_timeout_ms);
  for (;;) {
    auto it = answers_.find(key);
    if (it == answers_.end() || !it->second.pending) return true;
    if (running_ticket_ != 0 && it->second.ticket > running_ticket_) {
      answers_.erase(it);  // its job waits behind another: read it now instead
      return true;
    }
    if (answers_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      it = answers_.find(key);
      if (it == answers_.end() || !it->second.pending) return true;
      answers_.erase(it);
      return false;
    }
  }
}

Result<ChunkRef> RedisTier::Get(const keys::Digest& key, const ReadContext& /*ctx*/) {
  {
    std::unique_lock<std::mutex> lock(answers_mu_);
    if (!AwaitLocked(lock, key)) {
      ++io_errors_;
      return Status(Code::kUnavailable, options_.name + ": the read ahead of this chunk timed out");
    }
    auto it = answers_.find(key);
    if (it != answers_.end() && it->second.has_value) {
      Answer a = std::move(it->second);
      answer_bytes_ -= a.value.size;
      answers_.erase(it);
      lock.unlock();
      if (Clock::now() <= a.until) {
        ++prefetch_used_;
        if (a.failed) {
          ++io_errors_;
          return Status(Code::kUnavailable, options_.name + ": GET failed");
        }
        if (!a.present) return Status::NotFound(options_.name + ": not held");
        return Decode(key, a.value);
      }
      ++prefetch_expired_;
    }
  }
  auto c = client();
  if (!c) {
    ++io_errors_;
    return Status(Code::kUnavailable, options_.name + ": no Redis server answers");
  }
  const std::string k = KeyOf(key);
  const std::string_view kv = k;
  auto got = c->Get(std::span<const std::string_view>(&kv, 1));
  if (got.size() == 1 && !got[0].ok() && WrongType(got[0].status())) {
    // Not a string (a list, a hash...): no chunk, and left there it would
    // count as cached in every probe and never be stored over. Removed, as
    // a corrupt value is; the next store puts the chunk.
    ++corrupt_;
    (void)c->Del(std::span<const std::string_view>(&kv, 1));
    return Status::NotFound(options_.name + ": not held (a value of another type was removed)");
  }
  if (got.size() != 1 || !got[0].ok()) {
    ++io_errors_;
    ++failed_commands_;
    return Status(Code::kUnavailable, options_.name + ": GET failed");
  }
  if (!got[0]->has_value()) return Status::NotFound(options_.name + ": not held");
  return Decode(key, **got[0]);
}

bool RedisTier::Contains(const keys::Digest& key, const ReadContext& /*ctx*/) const {
  {
    std::unique_lock<std::mutex> lock(answers_mu_);
    if (!AwaitLocked(lock, key)) {
      ++io_errors_;
      return false;
    }
    auto it = answers_.find(key);
    if (it != answers_.end()) {
      const Answer& a = it->second;
      if (Clock::now() <= a.until) {
        if (a.failed) {
          answers_.erase(it);
          ++io_errors_;
          return false;
        }
        if (a.has_value) return a.present;  // a read's answer: kept for its Get
        const bool present = a.present;
        answers_.erase(it);  // one probe per answer: later probes ask again
        ++prefetch_used_;
        return present;
      }
      answer_bytes_ -= a.value.size;
      answers_.erase(it);
      ++prefetch_expired_;
    }
  }
  auto c = client();
  if (!c) {
    ++io_errors_;
    return false;
  }
  const std::string k = KeyOf(key);
  const std::string_view kv = k;
  // STRLEN, not EXISTS: a value of another type under a chunk key (a list,
  // planted or left by something else) is not a chunk, so the engine stores
  // over it rather than skip storing for ever; a read removes it.
  auto held = c->HoldsString(std::span<const std::string_view>(&kv, 1));
  if (held.size() == 1 && !held[0].ok() && WrongType(held[0].status())) return false;
  if (held.size() != 1 || !held[0].ok()) {
    ++io_errors_;
    ++failed_commands_;
    return false;
  }
  return *held[0];
}

void RedisTier::Forget(const keys::Digest& key) const {
  {
    std::lock_guard<std::mutex> lock(answers_mu_);
    auto it = answers_.find(key);
    if (it == answers_.end()) return;
    answer_bytes_ -= it->second.value.size;
    answers_.erase(it);  // a read on its way finds it gone and drops its value
  }
  answers_cv_.notify_all();
}

bool RedisTier::Erase(const keys::Digest& key, const ReadContext& /*ctx*/) { return EraseMany(std::span<const keys::Digest>(&key, 1)) == 1; }

size_t RedisTier::EraseMany(std::span<const keys::Digest> keys, const ReadContext& /*ctx*/) {
  if (keys.empty()) return 0;
  for (const keys::Digest& k : keys) Forget(k);
  auto c = client();
  if (!c) {
    ++io_errors_;
    return 0;
  }
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (const keys::Digest& k : keys) names.push_back(KeyOf(k));
  const std::vector<std::string_view> views(names.begin(), names.end());
  size_t erased = 0;
  bool failed = false;
  for (const Result<bool>& gone : c->Del(views)) {
    if (!gone.ok()) {
      ++failed_commands_;
      failed = true;
    } else if (*gone) {
      ++erased;
    }
  }
  if (failed) ++io_errors_;
  return erased;
}

void RedisTier::SweepLocked(Clock::time_point now) const {
  for (auto it = answers_.begin(); it != answers_.end();) {
    if (!it->second.pending && it->second.until < now) {
      answer_bytes_ -= it->second.value.size;
      it = answers_.erase(it);
      ++prefetch_expired_;
    } else {
      ++it;
    }
  }
}

void RedisTier::Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& /*ctx*/) const {
  if (keys.empty()) return;
  const size_t n = std::min<size_t>(keys.size(), options_.read_ahead_keys);
  if (!will_read) {
    auto c = client();
    if (!c) return;  // the probes that follow miss (and count) by themselves
    std::vector<std::string> names;
    names.reserve(n);
    for (size_t i = 0; i < n; ++i) names.push_back(KeyOf(keys[i]));
    const std::vector<std::string_view> views(names.begin(), names.end());
    auto held = c->HoldsString(views);  // as Contains asks
    if (held.size() != n) return;
    const Clock::time_point now = Clock::now(), until = now + std::chrono::milliseconds(options_.hint_ms);
    std::lock_guard<std::mutex> lock(answers_mu_);
    SweepLocked(now);
    for (size_t i = 0; i < n; ++i) {
      if (!held[i].ok() && !WrongType(held[i].status())) {
        ++failed_commands_;
        continue;  // its probe asks again (and counts the error if it persists)
      }
      auto [it, fresh] = answers_.try_emplace(keys[i]);
      if (!fresh && (it->second.has_value || it->second.pending)) continue;  // a read's answer says more
      it->second = Answer{};
      it->second.present = held[i].ok() && *held[i];  // another type: not held
      it->second.until = until;
      ++prefetched_;
    }
    return;
  }
  // The reads: on the reader thread, in key order. The keys are marked as on
  // their way first, so a Get that comes before its value waits for it.
  ReadJob job;
  {
    std::lock_guard<std::mutex> lock(answers_mu_);
    SweepLocked(Clock::now());
    job.ticket = ++next_ticket_;
    for (size_t i = 0; i < n; ++i) {
      auto [it, fresh] = answers_.try_emplace(keys[i]);
      if (!fresh) {
        if (it->second.pending || it->second.has_value) break;  // read already (or being read)
        answer_bytes_ -= it->second.value.size;
      }
      it->second = Answer{};
      it->second.pending = true;
      it->second.ticket = job.ticket;
      job.keys.push_back(keys[i]);
    }
  }
  if (job.keys.empty()) return;
  {
    std::lock_guard<std::mutex> lock(reader_mu_);
    if (!reader_.joinable()) reader_ = std::thread([this] { ReaderLoop(); });
    reader_jobs_.push_back(std::move(job));
  }
  reader_cv_.notify_one();
}

void RedisTier::ReaderLoop() const {
  for (;;) {
    ReadJob job;
    {
      std::unique_lock<std::mutex> lock(reader_mu_);
      reader_cv_.wait(lock, [&] { return reader_stop_ || !reader_jobs_.empty(); });
      if (reader_stop_) return;
      job = std::move(reader_jobs_.front());
      reader_jobs_.pop_front();
    }
    ReadAhead(job);
  }
}

void RedisTier::ReadAhead(const ReadJob& job) const {
  {
    std::lock_guard<std::mutex> lock(answers_mu_);
    running_ticket_ = job.ticket;
  }
  ReadBatches(job);
  {
    std::lock_guard<std::mutex> lock(answers_mu_);
    running_ticket_ = 0;
  }
  answers_cv_.notify_all();
}

void RedisTier::ReadBatches(const ReadJob& job) const {
  // Drops this job's answers still pending from `from` on (their Gets read
  // by themselves), waking whoever waits for them.
  auto drop_from = [&](size_t from) {
    {
      std::lock_guard<std::mutex> lock(answers_mu_);
      for (size_t i = from; i < job.keys.size(); ++i) {
        auto it = answers_.find(job.keys[i]);
        if (it != answers_.end() && it->second.pending && it->second.ticket == job.ticket) answers_.erase(it);
      }
    }
    answers_cv_.notify_all();
  };
  auto c = client();
  if (!c) return drop_from(0);
  std::vector<std::string> names;
  names.reserve(job.keys.size());
  for (const keys::Digest& k : job.keys) names.push_back(KeyOf(k));
  const std::vector<std::string_view> views(names.begin(), names.end());
  const std::span<const std::string_view> all(views);
  // Small batches first, so the first chunks can be decoded while the rest
  // are on their way; the walk that follows stops at the first key no tier
  // holds, so nothing after an absent key is read.
  size_t batch = 2;
  for (size_t begin = 0; begin < job.keys.size();) {
    {
      std::lock_guard<std::mutex> lock(reader_mu_);
      if (reader_stop_) return drop_from(begin);
    }
    const size_t end = std::min(job.keys.size(), begin + batch);
    auto got = c->Get(all.subspan(begin, end - begin));
    if (got.size() != end - begin) return drop_from(begin);
    bool stop = false;
    {
      const Clock::time_point until = Clock::now() + std::chrono::milliseconds(options_.hint_ms);
      std::lock_guard<std::mutex> lock(answers_mu_);
      for (size_t i = begin; i < end; ++i) {
        const auto& r = got[i - begin];
        auto it = answers_.find(job.keys[i]);
        // Forgotten meanwhile (a put or erase of the key): the value read is stale.
        if (it == answers_.end() || !it->second.pending || it->second.ticket != job.ticket) continue;
        if (!r.ok() && WrongType(r.status())) {
          answers_.erase(it);  // its Get reads it again, and removes it (a value of another type)
          continue;
        }
        if (!r.ok()) {
          // A node failing: its Get misses at once (and counts it) rather
          // than wait out the same timeout again.
          ++failed_commands_;
          it->second.pending = false;
          it->second.failed = it->second.has_value = true;
          it->second.until = until;
          stop = true;
          break;
        }
        if (r->has_value() && answer_bytes_ + (*r)->size > options_.read_ahead_bytes) {
          ++prefetch_overflow_;
          stop = true;
          break;
        }
        Answer& a = it->second;
        a.pending = false;
        a.until = until;
        a.has_value = true;
        a.present = r->has_value();
        if (a.present) {
          a.value = **r;
          answer_bytes_ += a.value.size;
        } else {
          stop = true;  // the walk ends here
        }
        ++prefetched_;
        if (stop) break;
      }
    }
    answers_cv_.notify_all();
    if (stop) return drop_from(begin);  // keys after an absent one are not read
    begin = end;
    batch = std::min<size_t>(batch * 2, 32);
  }
}

TierCounters RedisTier::counters() const {
  TierCounters c;
  c.corrupt_detected = corrupt_;
  c.io_errors = io_errors_;
  c.auth_failures = auth_failures_;
  return c;
}

TransportCounters RedisTier::transport_counters() const {
  const RedisCounters rc = redis_counters();
  TransportCounters t;
  t.calls = rc.client.commands;
  t.failed_calls = rc.failed_commands;
  t.timeouts = rc.client.timeouts;
  return t;
}

RedisCounters RedisTier::redis_counters() const {
  RedisCounters r;
  {
    std::lock_guard<std::mutex> lock(client_mu_);
    if (client_) r.client = client_->counters();
  }
  r.failed_commands = failed_commands_;
  r.connects = connects_;
  r.connect_failures = connect_failures_;
  r.puts = puts_;
  r.puts_failed = puts_failed_;
  r.prefetched = prefetched_;
  r.prefetch_used = prefetch_used_;
  r.prefetch_overflow = prefetch_overflow_;
  r.prefetch_expired = prefetch_expired_;
  return r;
}

}  // namespace kdn::store
