// SPDX-License-Identifier: Apache-2.0
// A tier that is another node: a kdnd (server/), reached over Cap'n Proto
// RPC (wire/node.capnp). Chunks travel as envelopes in the chain's form for
// this tier (its codec: a compressing codec sends fewer bytes), and the chain
// decodes what comes back, as for any tier with a codec.
//
// - Reads (Contains, Get) are synchronous calls with a deadline: a node that
//   is down, slow or refusing costs a miss and a counter (io_errors) within
//   RemoteTierOptions::timeout_ms, never an error and never a hang. The
//   deadline is the call's (ReadContext::started_ms + timeout_ms): however
//   many round trips one lookup or retrieve makes, it waits on the node at
//   most timeout_ms (a read-ahead stream that keeps delivering goes on: its
//   limit is timeout_ms without progress).
// - A circuit breaker: a node that leaves a call unanswered for timeout_ms,
//   or cannot be connected to, is marked down; calls miss at once (counted:
//   down_skips) for retry_ms, then one call probes it while the others still
//   skip; an answer (a refusal too) closes the breaker, no answer marks it
//   down again for twice as long (up to 30 s, or retry_ms if larger). The
//   tier heals by itself.
// - Puts are write-back: queued (bounded by write_queue_bytes: beyond it a
//   put is refused with kBusy, which the chain counts) and sent in batches
//   by `senders` sender threads (one batch each on the wire, the next one
//   framed meanwhile; a knowledge-item announcement waits for the batches
//   before it). Until it is sent, a queued chunk is served from the
//   queue (a runtime reads its own writes). A batch the node did not answer
//   (down, timed out) goes back to the queue and is sent again after
//   retry_ms; one it refused (a typed error) is dropped and counted. At
//   destruction what is queued is tried once more, then dropped. Flush()
//   waits for the queue, or until a send fails (the node is unreachable).
// - Namespaces: the node files keys per namespace and checks each call's
//   namespace against the token. A put takes it from the chunk; a read or an
//   erase from its ReadContext (tier.h), which the store fills for the
//   request it serves. A read without a namespace misses.
// - Read-ahead: Prefetch(keys, will_read) sends the batched lookup and a get
//   per key at once (one round trip for all of them; each chunk comes back
//   in its own reply). Each reply is checked on the loop thread as it
//   arrives (its payload stays in the buffer the reply was read into:
//   wire/message_stream.h) and waits, bounded by read_ahead_bytes, for the Get of its key,
//   which takes it (or, when it is late, waits for it until the deadline).
//   Gets of keys past the node's prefix are cancelled when the lookup's
//   answer comes back. Arrivals no Get takes are dropped after a deadline.
// - Knowledge items: Document() queues the announcement behind the chunks
//   queued before it (a put of a document after its chunks), sent by the
//   same sender thread and retried as they are; one the node refuses (or a
//   node without knowledge items, protocol 1) is dropped and counted.
// - Engine requests (Report): the store tells the tier how each lookup and
//   load went for it; the tier adds them up per namespace and a sender sends
//   them (Session.report, protocol 4) at most every report_ms, before it
//   stops, and on Flush. A node that answers unreachable gets them again
//   later; one without the method (protocol < 4) gets none again.
// - Capacity is the node's business: this tier reports no usage, lists
//   nothing, and the chain never evicts from it.
// - Corrupt replies (checksums, another key) are misses, counted as
//   corrupt_detected.
// - With a deployment secret (`sealer`) every envelope must come with the
//   node's seal of it (wire/node.capnp GetResult.seal; kdnd with the same
//   server.secret_file): one without it, with another secret's, or whose
//   bytes do not match it is a miss, counted as auth_failures (and
//   corrupt_detected). Whoever answers at the node's address without the
//   secret cannot make this tier load KV.
// Thread-safety: every member may be called concurrently. All RPC runs on
// the tier's own event loop thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/store/tier.h"
#include "core/wire/cipher.h"
#include "core/wire/seal.h"

namespace kdn::store {

struct RemoteTierOptions {
  std::string name = "remote";
  std::string address;                  // "host:port" or "unix:/path"
  std::string token;                    // bearer token (kdnd's [[token]])
  std::uint32_t timeout_ms = 2000;      // per call, connecting included
  std::uint32_t retry_ms = 1000;        // marked down (the breaker): miss at once this long, then probe
  std::uint64_t write_queue_bytes = std::uint64_t{256} << 20;
  std::uint64_t batch_bytes = std::uint64_t{4} << 20;  // one put call carries up to this much
  // Put calls out at once, each from a sender thread of its own that frames
  // its batch while the others' are on the wire (at least 1).
  std::uint32_t senders = 2;
  // Read-ahead (Prefetch with will_read): chunks that arrived and no Get has
  // taken yet are held up to this many bytes; beyond it reads are not
  // started ahead (Get then asks for its chunk itself). At most
  // read_ahead_keys reads are started per Prefetch.
  std::uint64_t read_ahead_bytes = std::uint64_t{256} << 20;
  std::uint32_t read_ahead_keys = 1024;
  // Knowledge-item announcements (Document) waiting in the write-back
  // queue; beyond this many one is dropped (counted).
  std::uint32_t document_queue = 4096;
  // TLS (kdnd's [server.tls]): the certificate(s) to trust, PEM, and the
  // name the node's certificate must carry (default: the address's host).
  // Empty: plain TCP.
  std::string tls_ca_file, tls_server_name;
  // The store's chunk size: each lookup tells the node the tokens its keys
  // cover (keys x chunk_tokens), which the node's statistics count as
  // requested tokens (and found ones as lookup hit tokens). 0: not told.
  std::uint64_t chunk_tokens = 0;
  // Reports of engine requests (Report) are sent at most this often.
  std::uint32_t report_ms = 200;
  // The deployment secret's sealer (wire/seal.h); null: replies are taken
  // as the node (or whoever answers at its address) sends them.
  std::shared_ptr<const wire::ChunkSealer> sealer;
  // With master keys (wire/cipher.h): every chunk is encrypted before it is
  // sent (the node holds, and its tiers store, only ciphertext of it), and
  // decrypted when it comes back, on the caller's thread; one that does not
  // open is a miss, counted (TierCounters::auth_failures). Null: chunks go
  // as they are; an encrypted one that comes back is such a miss.
  std::shared_ptr<const wire::ChunkCipher> cipher;
};

// Counters beyond TierCounters.
struct RemoteCounters {
  std::uint64_t calls = 0, failed_calls = 0, timeouts = 0, connects = 0, connect_failures = 0;
  // The circuit breaker: times the node was marked down (a call unanswered
  // by its deadline, a failed connect), calls skipped while it was (misses
  // at once), and round trips not started because their call's deadline had
  // passed (earlier round trips of the call used it up).
  std::uint64_t marked_down = 0, down_skips = 0, past_deadline = 0;
  std::uint64_t puts_sent = 0, puts_refused = 0, queue_full = 0, queued_bytes = 0;
  std::uint64_t no_namespace = 0;  // reads without a namespace in their ReadContext (misses)
  // Read-ahead: reads started by Prefetch, Gets served from them, arrivals
  // dropped unread (the walk stopped before them, or they waited past their
  // deadline), and arrivals not kept (read_ahead_bytes were held; their Get
  // asks again).
  std::uint64_t reads_ahead = 0, reads_ahead_used = 0, reads_ahead_dropped = 0, reads_ahead_overflow = 0;
  // Knowledge-item announcements: sent (the node took them), refused by the
  // node (a typed error: an unknown document, a namespace not granted, a
  // node without knowledge items), dropped (document_queue full).
  std::uint64_t documents_sent = 0, documents_refused = 0, documents_dropped = 0;
  // Reports of engine requests (Session.report calls): sent, refused by the
  // node (a namespace not granted, counts it would not take), not sent
  // because the node does not have the method (protocol < 4).
  std::uint64_t reports_sent = 0, reports_refused = 0, reports_unsupported = 0;
};

class RemoteTier final : public Tier {
 public:
  static Result<std::unique_ptr<RemoteTier>> Create(const RemoteTierOptions& options);
  ~RemoteTier() override;

  const std::string& name() const override { return options_.name; }
  std::uint64_t Cost(const Chunk& chunk) const override;
  Status Put(const ChunkRef& chunk) override;
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override;
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override;
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override;
  std::vector<ObjectInfo> List() const override { return {}; }
  std::uint64_t capacity_bytes() const override { return std::uint64_t{1} << 62; }
  std::uint64_t used_bytes() const override { return 0; }
  std::uint64_t objects() const override { return 0; }
  TierCounters counters() const override;
  void Flush() override;
  void Prefetch(std::span<const keys::Digest> keys, bool will_read, const ReadContext& ctx = {}) const override;
  void Document(DocumentOp op, const DocumentRecord& doc, std::uint64_t ttl_ms) override;
  void Report(const RequestOutcome& outcome, const ReadContext& ctx) override;

  TransportCounters transport_counters() const override;

  RemoteCounters remote_counters() const;

  struct Impl;

 private:
  explicit RemoteTier(const RemoteTierOptions& options);
  void SenderLoop();
  // A chunk that came back, decrypted (wire::FromRest); one that does not
  // open is a miss, counted.
  Result<ChunkRef> Opened(ChunkRef chunk) const;

  const RemoteTierOptions options_;
  std::unique_ptr<Impl> impl_;  // the event loop thread and its connection
  // Write-back queue: chunks, and knowledge-item announcements in the order
  // they were made (one after the chunks put before it).
  struct DocumentCall {
    DocumentOp op;
    DocumentRecord doc;
    std::uint64_t ttl_ms;
  };
  struct Entry {
    ChunkRef chunk;                              // or
    std::shared_ptr<const DocumentCall> document;
  };
  // Sends one announcement; false when the node did not answer (worth
  // another try), true when it answered (took or refused it).
  bool SendDocument(const DocumentCall& call);
  // Engine requests per namespace and model since the last report (under qmu_).
  struct ReportCounts {
    std::uint64_t lookups = 0, lookup_tokens = 0, lookup_hit_tokens = 0;
    std::uint64_t loads = 0, load_tokens = 0, load_hit_tokens = 0;
    void Add(const ReportCounts& o);
  };
  struct ReportKey {
    keys::Digest ns{}, model{};
    bool operator==(const ReportKey&) const = default;
  };
  struct ReportKeyHash {
    size_t operator()(const ReportKey& k) const noexcept {
      return keys::DigestHash()(k.ns) ^ (keys::DigestHash()(k.model) * 0x9E3779B97F4A7C15ull);
    }
  };
  using Reports = std::unordered_map<ReportKey, ReportCounts, ReportKeyHash>;
  // Sends them; false when the node did not answer (worth another try):
  // `left` then holds the ones not sent.
  bool SendReports(const Reports& reports, Reports& left);
  Reports reports_;
  std::int64_t reports_due_ms_ = 0;   // when the pending reports go (NowMs)
  bool reports_now_ = false;          // a Flush asked for them
  size_t reports_in_flight_ = 0;
  std::atomic<bool> reports_unsupported_{false};
  std::atomic<std::uint64_t> reports_sent_{0}, reports_refused_{0}, reports_not_sent_{0};
  mutable std::mutex qmu_;
  std::condition_variable qcv_, drained_;
  std::deque<Entry> queue_;
  size_t queued_documents_ = 0;
  std::unordered_map<keys::Digest, ChunkRef, keys::DigestHash> pending_;  // queued or being sent
  std::uint64_t queued_bytes_ = 0;
  bool stopping_ = false;
  size_t in_flight_ = 0;  // chunks and documents the senders have out
  std::uint64_t send_attempts_ = 0, send_failures_ = 0;  // under qmu_
  std::vector<std::thread> senders_;
  mutable std::atomic<std::uint64_t> corrupt_{0}, auth_failures_{0}, io_errors_{0}, no_namespace_{0}, queue_full_{0};
  mutable std::atomic<std::uint64_t> puts_sent_{0}, puts_refused_{0};
  std::atomic<std::uint64_t> documents_sent_{0}, documents_refused_{0}, documents_dropped_{0};
};

}  // namespace kdn::store
