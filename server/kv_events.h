// SPDX-License-Identifier: Apache-2.0
// KV events from kdnd in vLLM's format, so a KV-aware router that subscribes
// to vLLM engines (llm-d, Dynamo, AIBrix, ...) can subscribe to kdnd too.
// The node tells the publisher what it stored and removed; the publisher
// batches those events and sends them over a ZeroMQ PUB socket from its own
// thread, so the request path never waits on the network.
//
// Wire format, as vLLM's ZmqEventPublisher sends it
// (vllm/distributed/kv_events.py; checked against vLLM main, late 2026):
//
//   One ZeroMQ multipart message per batch, three frames:
//     1. topic: the configured topic's bytes (may be empty; SUB filters on it)
//     2. sequence: uint64, 8 bytes big-endian; 0 for the first message, +1 for
//        each further message of this publisher (a gap tells a subscriber it
//        missed messages)
//     3. payload: one msgpack value, the EventBatch (msgspec's encoding of
//        `class EventBatch(Struct, array_like=True, omit_defaults=True)`):
//          [ts, events, data_parallel_rank]
//        ts: float64, unix time in seconds when the batch was sent;
//        events: array of events; data_parallel_rank: int (kdnd sends 0,
//        as a vLLM engine without data parallelism does; vLLM always fills
//        it in, and Dynamo's decoder reads a 3-element array). One stored
//        copy of vLLM main shows EventBatch without array_like (it would
//        then be a map {"ts", "events", "data_parallel_rank"}); the newer
//        copies and every consumer we read (Dynamo, llm-d, SGLang's router,
//        kthena, late 2026) have the batch as this array.
//
//   Events are msgspec tagged structs (tag=True: the tag is the class name)
//   with omit_defaults. Since vLLM PR #42892 (merged June 2026; v0.22/v0.23
//   still used arrays, v0.26 sends maps) an event is a map whose first key is
//   "type", the fields after it in declaration order:
//     {"type": "BlockStored", "block_hashes": [h...], "parent_block_hash": h|nil,
//      "token_ids": [int...], "block_size": int, "lora_id": nil,
//      "medium": str, "lora_name": nil, "group_idx": int}
//     {"type": "BlockRemoved", "block_hashes": [h...], "medium": str, "group_idx": int}
//     {"type": "AllBlocksCleared"}
//   vLLM's declaration (late 2026): BlockStored's block_hashes,
//   parent_block_hash, token_ids, block_size, lora_id, medium, lora_name
//   have no default (always sent); then extra_keys, group_idx,
//   kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership,
//   session_id default to None. BlockRemoved: block_hashes, medium; then
//   group_idx, locality, ownership. A field at its default is left out of a
//   map: kdnd leaves out all but group_idx (KvEventOptions::group_idx; null
//   leaves it out too).
//
//   Before PR #42892 (array_like=True on the events too) an event was an
//   array whose first element is the tag, then the fields in order, up to
//   the last one not at its default:
//     ["BlockStored", [h...], parent|nil, [tokens...], block_size, nil, medium, nil, nil, group_idx]
//     ["BlockRemoved", [h...], medium, group_idx]
//     ["AllBlocksCleared"]
//   (BlockStored's ninth element is extra_keys, nil, holding group_idx's
//   place.) KvEventEncoding::kTaggedArray sends that, for routers that only
//   read the old form (msgspec ignores trailing elements a reader does not
//   know, so readers of the older, shorter forms read it too).
//
// Block hashes: vLLM's ExternalBlockHash is `bytes | int`. A vLLM block hash
// is a 32-byte SHA-256 digest; by default (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
// =1) vLLM sends its low 64 bits as an unsigned int (int.from_bytes(digest,
// "big") masked to 64 bits: the last 8 bytes, big-endian), with =0 the whole
// digest as msgpack bin. kdn keys are 32-byte SHA-256 digests too, and kdnd
// sends them whole, as bin (KvBlockHashForm::kBytes): a key is then the one
// name a store and a router share, with no chance of two keys meeting in 64
// bits. Routers that read only ints (Dynamo's BlockHashValue is i64|u64) get
// KvBlockHashForm::kUint64, vLLM's int form of the same digest.
//
// token_ids: the schema requires the field (list[int], no default), so it is
// always sent; an empty list decodes. vLLM itself always sends
// block_size tokens per block. kdnd stores chunks by key and often does not
// know their tokens: it then sends []. A router that keys blocks by the hashes
// in the event can use that; a router that recomputes its own hashes from
// token_ids (Dynamo computes its block hashes from them) cannot index such a
// block and will not route by it.
//
// medium: vLLM names where a block lives ("GPU" for its own cache, "CPU"
// for CPU offloading). Each event names one medium: kdnd announces a block
// per tier, as each tier takes and loses it ("CPU" for host memory, "DISK",
// "GPU", "REDIS", "REMOTE"; server/service.cc), so a router can tell a hit
// in host memory from one on disk. KvEventOptions::medium names the medium
// of calls that give none.
//
// Left out: vLLM's optional replay socket (a ROUTER that resends buffered
// batches from a sequence number on request). A subscriber that sees a gap
// in the sequence cannot ask kdnd to resend; it can only resynchronise as
// on a restart. Also left out: vLLM's rule of connecting (not binding) when
// the endpoint has no wildcard; kdnd always binds.
//
// Thread-safety: BlockStored, BlockRemoved, AllBlocksCleared, Flush and
// stats may be called from any thread at once; none of them waits on the
// socket (Flush waits for the publisher's thread by design). No call may
// race the destructor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/util/status.h"

namespace kdn::server {

enum class KvEventEncoding {
  kTaggedMap,    // vLLM after PR #42892: {"type": "BlockStored", ...}
  kTaggedArray,  // vLLM before it: ["BlockStored", ...]
};

enum class KvBlockHashForm {
  kBytes,   // msgpack bin, the key as given (32 bytes for a kdn key)
  kUint64,  // vLLM's int form: the last 8 bytes, big-endian, as an unsigned int
};

struct KvEventOptions {
  KvEventEncoding encoding = KvEventEncoding::kTaggedMap;
  KvBlockHashForm hash_form = KvBlockHashForm::kBytes;
  // The medium of events that name none.
  std::string medium = "CPU";
  // group_idx of BlockStored and BlockRemoved: the KV cache group of the
  // blocks. A kdn chunk holds every layer of its model, the one group of a
  // model whose layers all share a cache (vLLM's group 0). Null: the field is
  // left out (msgspec's default, None), as vLLM did before groups were sent.
  std::optional<std::int64_t> group_idx = 0;
  std::int64_t data_parallel_rank = 0;
  // Events waiting to be sent; past this the oldest is dropped (and counted),
  // so a stalled thread never grows memory without bound.
  std::size_t max_pending = 65536;
  // A batch is sent when this many events wait, or after batch_interval.
  std::size_t batch_events = 64;
  std::chrono::milliseconds batch_interval{10};
  // ZeroMQ's send high-water mark (messages queued per subscriber); past it
  // the PUB socket drops messages for that subscriber, as vLLM's does.
  int send_hwm = 100000;
  // The batch timestamp, unix seconds. Null: the system clock.
  std::function<double()> now;
  // Who may subscribe (issue 37: auth on every surface). Set: the socket
  // takes only subscribers that log in with ZeroMQ's PLAIN mechanism
  // (ZMQ_PLAIN_USERNAME: anything, e.g. "kdn"; ZMQ_PLAIN_PASSWORD: a token)
  // whose password this accepts; one with another password (an unknown
  // token, one without the grant) is refused at the handshake by a ZAP
  // handler (RFC 27) on the publisher's context, and counted
  // (Stats::subscribers_refused); one without credentials is refused by
  // ZeroMQ itself (its NULL mechanism meets a PLAIN server), uncounted.
  // Neither receives a message. Called on the
  // handler's thread. Null: any subscriber (ZeroMQ's NULL mechanism).
  // PLAIN sends the password in clear: keep the endpoint on the machine
  // (kdnd refuses a non-loopback one unless server.allow_plaintext).
  std::function<bool(std::string_view password)> authorize;
};

class KvEventPublisher {
 public:
  struct Stats {
    std::uint64_t events_queued = 0;
    std::uint64_t events_dropped = 0;  // dropped from a full queue
    std::uint64_t batches_sent = 0;
    std::uint64_t send_errors = 0;     // batches the socket refused
    // With KvEventOptions::authorize: subscribers let in, and refused.
    std::uint64_t subscribers_accepted = 0, subscribers_refused = 0;
  };

  // Binds a PUB socket to `endpoint` (e.g. "tcp://127.0.0.1:5557",
  // "tcp://*:5557", "ipc:///run/kdnd/events"; a port of "*" picks a free
  // one, see endpoint()) and starts the publishing thread.
  static Result<std::unique_ptr<KvEventPublisher>> Create(std::string endpoint, std::string topic);
  static Result<std::unique_ptr<KvEventPublisher>> Create(std::string endpoint, std::string topic,
                                                          KvEventOptions options);
  // Sends what is still queued (see Flush), then stops the thread and closes
  // the socket, lingering at most 250 ms for subscribers to take the rest.
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queue one event; they return at once.
  // block_hashes: one key per block, in sequence order; parent: the key of
  // the block before the first (nullopt: the blocks start a sequence);
  // token_ids: the blocks' tokens, or empty when unknown.
  // medium: where the blocks are (or were), "CPU", "DISK", ...; empty:
  // KvEventOptions::medium.
  void BlockStored(std::vector<std::vector<std::uint8_t>> block_hashes, std::optional<std::vector<std::uint8_t>> parent,
                   std::vector<std::int32_t> token_ids, std::uint32_t block_size, std::string medium = {});
  void BlockRemoved(std::vector<std::vector<std::uint8_t>> hashes, std::string medium = {});
  void AllBlocksCleared();

  // Returns once every event queued before the call has been handed to the
  // socket (or dropped): for tests, and before shutting down.
  void Flush();

  Stats stats() const;
  // The endpoint bound, with the port chosen when it was "*".
  const std::string& endpoint() const { return bound_endpoint_; }

 private:
  enum class Kind : std::uint8_t { kStored, kRemoved, kCleared };
  struct Event {
    Kind kind;
    std::vector<std::vector<std::uint8_t>> hashes;
    std::optional<std::vector<std::uint8_t>> parent;
    std::vector<std::int32_t> token_ids;
    std::uint32_t block_size = 0;
    std::string medium;  // empty: options_.medium
  };

  KvEventPublisher(void* ctx, void* socket, void* zap, std::string endpoint, std::string topic,
                   KvEventOptions options);
  void Enqueue(Event e);
  void Run();
  // The ZAP handler's loop (zap_ only): answers each handshake's request.
  void Authenticate();
  std::string Encode(const std::vector<Event>& events, double ts) const;
  bool Send(const std::string& payload);

  void* ctx_;     // zmq context, owned
  void* socket_;  // PUB socket, owned; used only by thread_ once it runs
  void* zap_;     // the ZAP handler's REP socket (with authorize), owned; used only by zap_thread_
  const std::string bound_endpoint_;
  const std::string topic_;
  const KvEventOptions options_;
  std::uint64_t next_seq_ = 0;  // thread_ only

  mutable std::mutex mu_;
  std::condition_variable wake_;  // for thread_: events, a flush, or stop
  std::condition_variable done_;  // for Flush: events left the queue
  std::deque<Event> pending_;     // guarded by mu_
  std::uint64_t enqueued_ = 0;    // guarded by mu_: events ever queued
  std::uint64_t finished_ = 0;    // guarded by mu_: events sent or dropped
  int flush_waiters_ = 0;         // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  Stats stats_;                   // guarded by mu_
  std::thread thread_;
  std::atomic<bool> zap_stop_{false};
  std::thread zap_thread_;
};

}  // namespace kdn::server
