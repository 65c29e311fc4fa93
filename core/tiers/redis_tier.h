// SPDX-License-Identifier: Apache-2.0
// A tier in Redis or Redis Cluster (or Valkey), shared by every runtime and
// kdnd that points at it, over redis/client.h.
//
// - One key per chunk: key_prefix + the hex of the chunk's key digest (the
//   digest already covers the tenant namespace, the model and the tokens, as
//   the disk tier's file names do) -> the chunk's envelope (wire/envelope.h),
//   its payload in this tier's codec (the chain encodes; kdn:balanced by
//   default, so a chunk crosses the network compressed). A put is one SET,
//   atomic (optionally with PX ttl_ms): no reader ever sees half a chunk, and
//   there is no second key to disagree with.
// - Reads that fail (a node down, failing over, slower than the timeouts,
//   refusing) are misses and counters (io_errors), within the client's
//   timeouts, never an error to the engine and never a hang. A reply that is
//   not a valid envelope of its key (another key, a checksum, truncated) is a
//   miss counted in corrupt_detected, and the key is deleted.
// - Puts are write-through (synchronous): a put that fails is kUnavailable,
//   which the chain counts as a failed put.
// - No server at creation is not an error: the tier connects when it is first
//   used, at most once per retry_ms, and misses meanwhile (as a remote tier
//   whose node is down). A malformed seed or a refused AUTH is an error at
//   creation (kInvalidArgument). Once connected, the client keeps itself
//   connected (it reconnects and refreshes its slot map on its own).
// - Prefetch(keys, false): one pipelined EXISTS batch (one pipeline per
//   node) whose answers serve the Contains calls that follow, one probe
//   each, for hint_ms at most.
// - Prefetch(keys, true), keys about to be read in order: returns at once;
//   a reader thread GETs them in pipelined batches of growing size (2, 4,
//   ... 32 keys), and each batch's values serve their Gets as soon as it
//   arrives, so the caller decodes the first chunks while the next ones are
//   on the wire. A Get (or Contains) of a key still on its way waits for it,
//   at most command_timeout_ms (then it is a miss and an io error). Reading
//   stops at the first absent key, a failure, or read_ahead_bytes held;
//   keys not read then are asked for by their own Gets. Answers held are
//   bounded by read_ahead_bytes and read_ahead_keys.
// - Capacity is the server's business (its maxmemory and eviction policy,
//   or the TTL): this tier reports no usage, lists nothing, and the chain
//   never evicts from it.
// Thread-safety: every member may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/redis/client.h"
#include "core/wire/cipher.h"
#include "core/wire/seal.h"
#include "core/store/tier.h"

namespace kdn::store {

struct RedisTierOptions {
  std::string name = "redis";
  redis::Options client;             // seeds, user, password, timeouts
  std::string key_prefix = "kdn:";
  std::uint64_t ttl_ms = 0;          // 0: keys do not expire
  std::uint32_t retry_ms = 1000;     // after a failed connect, miss at once this long
  std::uint32_t hint_ms = 2000;      // how long a prefetched answer serves
  std::uint64_t read_ahead_bytes = std::uint64_t{256} << 20;
  std::uint32_t read_ahead_keys = 1024;
  // With a deployment secret (wire/seal.h): every value this tier SETs is
  // sealed, and a value read back is taken only if its seal is this
  // secret's and matches its bytes; any other is a miss, counted
  // (TierCounters::auth_failures) and deleted. Null: values are taken as
  // they are (whoever can write to the server decides the KV).
  std::shared_ptr<const wire::ChunkSealer> sealer;
  // With master keys (wire/cipher.h): every value is encrypted before it is
  // SET (the server holds no KV in the clear) and decrypted when read back;
  // one that does not open is a miss, counted (TierCounters::auth_failures)
  // and deleted. Null: values go as they are; an encrypted one read back is
  // such a miss. `pass_through_encrypted`: a node's tier serves what it
  // cannot open as it is (wire::FromRest).
  std::shared_ptr<const wire::ChunkCipher> cipher;
  bool pass_through_encrypted = false;
};

// Counters beyond TierCounters.
struct RedisCounters {
  redis::Counters client;            // the client's (commands, redirects, timeouts...)
  std::uint64_t failed_commands = 0; // per-key outcomes that were errors
  std::uint64_t connects = 0, connect_failures = 0;  // the tier's (re)connects
  std::uint64_t puts = 0, puts_failed = 0;
  // Prefetch: keys answered ahead, answers used by Contains/Get, answers not
  // kept (read_ahead_bytes held), answers that expired unused.
  std::uint64_t prefetched = 0, prefetch_used = 0, prefetch_overflow = 0, prefetch_expired = 0;
};

class RedisTier final : public Tier {
 public:
  static Result<std::unique_ptr<RedisTier>> Create(const RedisTierOptions& options);
  ~RedisTier() override;

  const std::string& name() const override { return options_.name; }
  std::uint64_t Cost(const Chunk& chunk) const override;
  Status Put(const ChunkRef& chunk) override;
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override;
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override;
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override;
  // One pipelined DEL batch (one pipeline per node).
  size_t EraseMany(std::span<const keys::Digest> keys, const ReadContext& ctx = {}) override;
  std::vector<ObjectInfo> List() const override { return {}; }
  std::uint64_t capacity_bytes() const override { return std::uint64_t{1} << 62; }
  std::uint64_t used_bytes() const override { return 0; }
  std::uint64_t objects() const override { return 0; }
  TierCounters counters() const override;
  void Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& ctx = {}) const override;

  TransportCounters transport_counters() const override;

  RedisCounters redis_counters() const;
  // The Redis key a chunk is stored under.
  std::string KeyOf(const keys::Digest& key) const;
  const RedisTierOptions& options() const { return options_; }

 private:
  explicit RedisTier(const RedisTierOptions& options) : options_(options) {}
  static bool WrongType(const Status& st);
  using Clock = std::chrono::steady_clock;
  // The client, connecting when none is there and retry_ms passed since the
  // last try; null meanwhile, and while another caller connects (the caller
  // misses).
  std::shared_ptr<redis::Client> client() const;
  // A read's value as a chunk, or a miss (a corrupt one counted and deleted).
  Result<ChunkRef> Decode(const keys::Digest& key, const redis::Value& value) const;
  void Forget(const keys::Digest& key) const;  // drops any answer held for it

  const RedisTierOptions options_;
  mutable std::mutex client_mu_;
  mutable std::shared_ptr<redis::Client> client_;   // GUARDED_BY(client_mu_)
  mutable Clock::time_point next_connect_{};        // GUARDED_BY(client_mu_)
  mutable bool connecting_ = false;                 // GUARDED_BY(client_mu_)

  // Prefetched answers: presence (EXISTS) and values (GET; absent: nullopt).
  // A read not answered yet is `pending`, owned by the read-ahead `ticket`
  // that will fill it (or drop it).
  struct Answer {
    bool present = false;
    bool has_value = false;
    bool pending = false;
    bool failed = false;  // the read failed (a node down or slow): a miss without asking again
    std::uint64_t ticket = 0;
    redis::Value value;
    Clock::time_point until;
  };
  mutable std::mutex answers_mu_;
  mutable std::condition_variable answers_cv_;  // a pending answer filled or dropped
  mutable std::unordered_map<keys::Digest, Answer, keys::DigestHash> answers_;  // GUARDED_BY(answers_mu_)
  mutable std::uint64_t answer_bytes_ = 0;                                     // GUARDED_BY(answers_mu_)
  mutable std::uint64_t next_ticket_ = 0;                                      // GUARDED_BY(answers_mu_)
  mutable std::uint64_t running_ticket_ = 0;  // the job being read, 0: none: GUARDED_BY(answers_mu_)
  void SweepLocked(Clock::time_point now) const;
  // Waits while the answer for `key` is being read (lock held on
  // answers_mu_); one whose job has not started is dropped at once (its
  // caller reads by itself). False if it is still pending after
  // command_timeout_ms (then it is dropped: the caller misses).
  bool AwaitLocked(std::unique_lock<std::mutex>& lock, const keys::Digest& key) const;

  // Read-ahead: one reader thread, jobs in order.
  struct ReadJob {
    std::uint64_t ticket;
    std::vector<keys::Digest> keys;
  };
  void ReadAhead(const ReadJob& job) const;
  void ReadBatches(const ReadJob& job) const;
  void ReaderLoop() const;
  mutable std::mutex reader_mu_;
  mutable std::condition_variable reader_cv_;
  mutable std::deque<ReadJob> reader_jobs_;    // GUARDED_BY(reader_mu_)
  mutable bool reader_stop_ = false;          // GUARDED_BY(reader_mu_)
  mutable std::thread reader_;                // started by the first read-ahead

  mutable std::atomic<std::uint64_t> corrupt_{0}, io_errors_{0}, failed_commands_{0}, auth_failures_{0};
  mutable std::atomic<std::uint64_t> connects_{0}, connect_failures_{0}, puts_{0}, puts_failed_{0};
  mutable std::atomic<std::uint64_t> prefetched_{0}, prefetch_used_{0}, prefetch_overflow_{0}, prefetch_expired_{0};
};

// Parses "host:port[,host:port...]" (spaces around commas allowed) into
// seeds; kInvalidArgument naming the bad one.
Result<std::vector<std::string>> ParseRedisSeeds(std::string_view list);

}  // namespace kdn::store
