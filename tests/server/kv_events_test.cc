// SPDX-License-Identifier: Apache-2.0
// KvEventPublisher against real ZeroMQ subscribers: a SUB socket of the test
// (libzmq's C API) that decodes each message with msgpack-cxx and checks
// every frame, tag, field, order and value; and a Python subscriber
// (pyzmq + msgpack, as a router's consumer reads vLLM's events) whose view
// of a message the test compares with the one vLLM's schema gives.
//
// ZeroMQ's PUB drops messages until a subscriber's connection is up (the
// "slow joiner"), so each test first sends probe messages until one arrives,
// then skips every message numbered below the count of probes sent.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <msgpack.hpp>
#include <zmq.h>

#include "cli_runner.h"
#include "server/kv_events.h"
#include "server/config.h"
#include "server/registry.h"
#include "server/server.h"
#include "server/service.h"
#include "core/wire/envelope.h"

namespace kdn::server {
namespace {

using Bytes = std::vector<std::uint8_t>;

// A 32-byte key whose bytes are first, first+1, ...
Bytes Key(std::uint8_t first) {
  Bytes k(32);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = static_cast<std::uint8_t>(first + i);
  return k;
}

std::uint64_t Low64BigEndian(const Bytes& k) {
  std::uint64_t v = 0;
  for (std::size_t i = k.size() - 8; i < k.size(); ++i) v = (v << 8) | k[i];
  return v;
}

std::string Hex(const Bytes& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::uint8_t c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

struct Message {
  std::string topic;
  std::string seq_frame;
  std::string payload;
  std::uint64_t seq() const {
    std::uint64_t v = 0;
    for (unsigned char c : seq_frame) v = (v << 8) | c;
    return v;
  }
};

// A SUB socket of the test's own.
class Subscriber {
 public:
  // With `password`: logs in with ZeroMQ's PLAIN mechanism (user "kdn").
  Subscriber(const std::string& endpoint, const std::string& topic,
             const std::optional<std::string>& password = std::nullopt) {
    ctx_ = zmq_ctx_new();
    sock_ = zmq_socket(ctx_, ZMQ_SUB);
    const int linger = 0;
    zmq_setsockopt(sock_, ZMQ_LINGER, &linger, sizeof linger);
    if (password) {
      zmq_setsockopt(sock_, ZMQ_PLAIN_USERNAME, "kdn", 3);
      zmq_setsockopt(sock_, ZMQ_PLAIN_PASSWORD, password->data(), password->size());
    }
    zmq_setsockopt(sock_, ZMQ_SUBSCRIBE, topic.data(), topic.size());
    EXPECT_EQ(zmq_connect(sock_, endpoint.c_str()), 0) << zmq_strerror(zmq_errno());
  }
  ~Subscriber() {
    zmq_close(sock_);
    zmq_ctx_term(ctx_);
  }

  // Every frame of the next message, or nothing within timeout_ms.
  std::optional<std::vector<std::string>> Receive(int timeout_ms) {
    zmq_pollitem_t item{sock_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) return std::nullopt;
    std::vector<std::string> frames;
    int more = 0;
    do {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, sock_, 0) < 0) {
        zmq_msg_close(&m);
        return std::nullopt;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      more = zmq_msg_more(&m);
      zmq_msg_close(&m);
    } while (more);
    return frames;
  }

  // Probes until one arrives (at most ~5 s); returns how many were sent, so
  // that messages numbered from there on are the test's own.
  std::uint64_t Handshake(KvEventPublisher& pub) {
    for (std::uint64_t sent = 1; sent <= 50; ++sent) {
      pub.AllBlocksCleared();
      pub.Flush();
      if (Receive(100)) return sent;
    }
    ADD_FAILURE() << "no probe arrived";
    return 0;
  }

  // The next message numbered `first` or later, checked to be three frames.
  std::optional<Message> Next(std::uint64_t first, int timeout_ms = 5000) {
    for (;;) {
      auto frames = Receive(timeout_ms);
      if (!frames) return std::nullopt;
      EXPECT_EQ(frames->size(), 3u);
      if (frames->size() != 3) return std::nullopt;
      Message m{(*frames)[0], (*frames)[1], (*frames)[2]};
      EXPECT_EQ(m.seq_frame.size(), 8u);
      if (m.seq() >= first) return m;
    }
  }

 private:
  void* ctx_;
  void* sock_;
};

// msgpack-cxx object checks.
std::string Str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  if (o.type != msgpack::type::STR) return "";
  return std::string(o.via.str.ptr, o.via.str.size);
}
Bytes Bin(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::BIN);
  if (o.type != msgpack::type::BIN) return {};
  return Bytes(o.via.bin.ptr, o.via.bin.ptr + o.via.bin.size);
}
const msgpack::object_array& Arr(const msgpack::object& o) {
  static const msgpack::object_array kEmpty{0, nullptr};
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  return o.type == msgpack::type::ARRAY ? o.via.array : kEmpty;
}
// A map's keys in wire order, and its values.
std::vector<std::string> Keys(const msgpack::object& o) {
  std::vector<std::string> keys;
  EXPECT_EQ(o.type, msgpack::type::MAP);
  if (o.type != msgpack::type::MAP) return keys;
  for (std::uint32_t i = 0; i < o.via.map.size; ++i) keys.push_back(Str(o.via.map.ptr[i].key));
  return keys;
}
const msgpack::object& Val(const msgpack::object& o, std::uint32_t i) { return o.via.map.ptr[i].val; }

// The EventBatch of a payload: [ts, events, data_parallel_rank].
struct Batch {
  msgpack::object_handle handle;
  double ts = 0;
  std::vector<msgpack::object> events;
  std::int64_t dp_rank = -1;
};
Batch Decode(const std::string& payload) {
  Batch b;
  std::size_t off = 0;
  b.handle = msgpack::unpack(payload.data(), payload.size(), off);
  EXPECT_EQ(off, payload.size()) << "bytes after the batch";
  const msgpack::object& o = b.handle.get();
  const auto& top = Arr(o);
  EXPECT_EQ(top.size, 3u);
  if (top.size != 3) return b;
  EXPECT_EQ(top.ptr[0].type, msgpack::type::FLOAT64);
  b.ts = top.ptr[0].as<double>();
  const auto& ev = Arr(top.ptr[1]);
  b.events.assign(ev.ptr, ev.ptr + ev.size);
  EXPECT_EQ(top.ptr[2].type, msgpack::type::POSITIVE_INTEGER);
  b.dp_rank = top.ptr[2].as<std::int64_t>();
  return b;
}

KvEventOptions Fixed(KvEventOptions o = {}) {
  o.now = [] { return 1234.5; };
  return o;
}

std::unique_ptr<KvEventPublisher> Make(KvEventOptions o, const std::string& topic = "kv-events") {
  auto r = KvEventPublisher::Create("tcp://127.0.0.1:*", topic, std::move(o));
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(ServerKvEvents, EachKindIsATaggedMapInVllmFieldOrder) {
  auto pub = Make(Fixed());
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);

  pub->BlockStored({Key(0), Key(100)}, Key(200), {1, 2, 3, 151644, 5, 6, 7, 8}, 4);
  pub->Flush();
  auto m = sub.Next(k);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->topic, "kv-events");
  EXPECT_EQ(m->seq(), k);  // probes were 0..k-1: numbering starts at 0, +1 a message
  {
    Batch b = Decode(m->payload);
    EXPECT_EQ(b.ts, 1234.5);
    EXPECT_EQ(b.dp_rank, 0);
    ASSERT_EQ(b.events.size(), 1u);
    const msgpack::object& e = b.events[0];
    // extra_keys, at its default (None), is left out as msgspec's
    // omit_defaults leaves it; group_idx, set, follows it.
    ASSERT_EQ(Keys(e), (std::vector<std::string>{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                                                 "lora_id", "medium", "lora_name", "group_idx"}));
    EXPECT_EQ(Str(Val(e, 0)), "BlockStored");
    const auto& hashes = Arr(Val(e, 1));
    ASSERT_EQ(hashes.size, 2u);
    EXPECT_EQ(Bin(hashes.ptr[0]), Key(0));
    EXPECT_EQ(Bin(hashes.ptr[1]), Key(100));
    EXPECT_EQ(Bin(Val(e, 2)), Key(200));
    EXPECT_EQ(Val(e, 3).as<std::vector<std::int64_t>>(), (std::vector<std::int64_t>{1, 2, 3, 151644, 5, 6, 7, 8}));
    EXPECT_EQ(Val(e, 4).as<std::uint32_t>(), 4u);
    EXPECT_EQ(Val(e, 5).type, msgpack::type::NIL);
    EXPECT_EQ(Str(Val(e, 6)), "CPU");
    EXPECT_EQ(Val(e, 7).type, msgpack::type::NIL);
    EXPECT_EQ(Val(e, 8).type, msgpack::type::POSITIVE_INTEGER);
    EXPECT_EQ(Val(e, 8).as<int>(), 0);
  }

  // What kdnd sends when it stores by key: no parent, no tokens; the medium
  // of the tier that took the block.
  pub->BlockStored({Key(9)}, std::nullopt, {}, 256, "DISK");
  pub->Flush();
  m = sub.Next(k);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->seq(), k + 1);
  {
    Batch b = Decode(m->payload);
    ASSERT_EQ(b.events.size(), 1u);
    const msgpack::object& e = b.events[0];
    ASSERT_EQ(Keys(e).size(), 9u);
    EXPECT_EQ(Val(e, 2).type, msgpack::type::NIL);
    EXPECT_EQ(Arr(Val(e, 3)).size, 0u);
    EXPECT_EQ(Val(e, 4).as<std::uint32_t>(), 256u);
    EXPECT_EQ(Str(Val(e, 6)), "DISK");
  }

  pub->BlockRemoved({Key(0), Key(100)});
  pub->Flush();
  m = sub.Next(k);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->topic, "kv-events");
  EXPECT_EQ(m->seq(), k + 2);
  {
    Batch b = Decode(m->payload);
    ASSERT_EQ(b.events.size(), 1u);
    const msgpack::object& e = b.events[0];
    ASSERT_EQ(Keys(e), (std::vector<std::string>{"type", "block_hashes", "medium", "group_idx"}));
    EXPECT_EQ(Str(Val(e, 0)), "BlockRemoved");
    const auto& hashes = Arr(Val(e, 1));
    ASSERT_EQ(hashes.size, 2u);
    EXPECT_EQ(Bin(hashes.ptr[0]), Key(0));
    EXPECT_EQ(Bin(hashes.ptr[1]), Key(100));
    EXPECT_EQ(Str(Val(e, 2)), "CPU");
    EXPECT_EQ(Val(e, 3).as<int>(), 0);
  }

  pub->AllBlocksCleared();
  pub->Flush();
  m = sub.Next(k);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->seq(), k + 3);
  {
    Batch b = Decode(m->payload);
    ASSERT_EQ(b.events.size(), 1u);
    ASSERT_EQ(Keys(b.events[0]), (std::vector<std::string>{"type"}));
    EXPECT_EQ(Str(Val(b.events[0], 0)), "AllBlocksCleared");
  }
  const KvEventPublisher::Stats s = pub->stats();
  EXPECT_EQ(s.events_queued, k + 4);
  EXPECT_EQ(s.batches_sent, k + 4);
  EXPECT_EQ(s.events_dropped, 0u);
  EXPECT_EQ(s.send_errors, 0u);
}

TEST(ServerKvEvents, LegacyArrayEncodingWithIntHashes) {
  KvEventOptions o = Fixed();
  o.encoding = KvEventEncoding::kTaggedArray;
  o.hash_form = KvBlockHashForm::kUint64;
  o.medium = "STORAGE";
  o.group_idx = 2;
  o.data_parallel_rank = 3;
  auto pub = Make(o, "");
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);

  pub->BlockStored({Key(0x70), Key(1)}, Key(50), {7, 8}, 2);
  pub->BlockRemoved({Key(0x70)});
  pub->AllBlocksCleared();
  pub->Flush();
  auto m = sub.Next(k);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->topic, "");
  EXPECT_EQ(m->seq(), k);
  Batch b = Decode(m->payload);
  EXPECT_EQ(b.dp_rank, 3);
  ASSERT_EQ(b.events.size(), 3u);

  // ["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium,
  //  lora_name, extra_keys, group_idx]: positions, so extra_keys is there (nil)
  const auto& st = Arr(b.events[0]);
  ASSERT_EQ(st.size, 10u);
  EXPECT_EQ(Str(st.ptr[0]), "BlockStored");
  const auto& hashes = Arr(st.ptr[1]);
  ASSERT_EQ(hashes.size, 2u);
  // Key(0x70) ends in bytes 0x88..0x8f, above 2^63: sent as msgpack uint64.
  ASSERT_EQ(hashes.ptr[0].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(hashes.ptr[0].as<std::uint64_t>(), Low64BigEndian(Key(0x70)));
  EXPECT_EQ(hashes.ptr[1].as<std::uint64_t>(), Low64BigEndian(Key(1)));
  EXPECT_EQ(hashes.ptr[1].as<std::uint64_t>(), 0x191a1b1c1d1e1f20ull);
  EXPECT_EQ(st.ptr[2].as<std::uint64_t>(), Low64BigEndian(Key(50)));
  EXPECT_EQ(st.ptr[3].as<std::vector<int>>(), (std::vector<int>{7, 8}));
  EXPECT_EQ(st.ptr[4].as<int>(), 2);
  EXPECT_EQ(st.ptr[5].type, msgpack::type::NIL);
  EXPECT_EQ(Str(st.ptr[6]), "STORAGE");
  EXPECT_EQ(st.ptr[7].type, msgpack::type::NIL);
  EXPECT_EQ(st.ptr[8].type, msgpack::type::NIL);
  EXPECT_EQ(st.ptr[9].as<int>(), 2);

  const auto& rm = Arr(b.events[1]);  // ["BlockRemoved", hashes, medium, group_idx]
  ASSERT_EQ(rm.size, 4u);
  EXPECT_EQ(Str(rm.ptr[0]), "BlockRemoved");
  ASSERT_EQ(Arr(rm.ptr[1]).size, 1u);
  EXPECT_EQ(Arr(rm.ptr[1]).ptr[0].as<std::uint64_t>(), 0x88898a8b8c8d8e8full);
  EXPECT_EQ(Str(rm.ptr[2]), "STORAGE");
  EXPECT_EQ(rm.ptr[3].as<int>(), 2);

  const auto& cl = Arr(b.events[2]);  // ["AllBlocksCleared"]
  ASSERT_EQ(cl.size, 1u);
  EXPECT_EQ(Str(cl.ptr[0]), "AllBlocksCleared");
}

TEST(ServerKvEvents, EventsQueuedBeforeAFlushGoInOneBatchInOrder) {
  KvEventOptions o = Fixed();
  o.batch_interval = std::chrono::hours(1);  // only a flush or a full batch sends
  auto pub = Make(o);
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);

  pub->BlockStored({Key(1)}, std::nullopt, {}, 16);
  pub->BlockRemoved({Key(1)});
  pub->BlockStored({Key(2)}, Key(1), {}, 16);
  pub->Flush();
  auto m = sub.Next(k);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->seq(), k);
  Batch b = Decode(m->payload);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(Str(Val(b.events[0], 0)), "BlockStored");
  EXPECT_EQ(Bin(Arr(Val(b.events[0], 1)).ptr[0]), Key(1));
  EXPECT_EQ(Str(Val(b.events[1], 0)), "BlockRemoved");
  EXPECT_EQ(Str(Val(b.events[2], 0)), "BlockStored");
  EXPECT_EQ(Bin(Val(b.events[2], 2)), Key(1));
  EXPECT_FALSE(sub.Receive(100)) << "one flush, one message";
}

TEST(ServerKvEvents, AFullBatchIsSentWithoutAFlush) {
  KvEventOptions o = Fixed();
  o.batch_events = 4;
  o.batch_interval = std::chrono::hours(1);
  auto pub = Make(o);
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);

  for (std::uint8_t i = 0; i < 6; ++i) pub->BlockRemoved({Key(i)});
  auto m = sub.Next(k);  // the first four, sent because four waited
  ASSERT_TRUE(m);
  Batch b = Decode(m->payload);
  ASSERT_EQ(b.events.size(), 4u);
  for (std::uint8_t i = 0; i < 4; ++i) EXPECT_EQ(Bin(Arr(Val(b.events[i], 1)).ptr[0]), Key(i));
  pub->Flush();  // the other two
  m = sub.Next(k + 1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->seq(), k + 1);
  EXPECT_EQ(Decode(m->payload).events.size(), 2u);
}

TEST(ServerKvEvents, QueuedEventsAreSentAfterTheIntervalWithoutAFlush) {
  auto pub = Make(Fixed());  // the default interval, ~10 ms
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);
  pub->BlockRemoved({Key(5)});
  auto m = sub.Next(k);
  ASSERT_TRUE(m);
  Batch b = Decode(m->payload);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(Bin(Arr(Val(b.events[0], 1)).ptr[0]), Key(5));
}

TEST(ServerKvEvents, AFullQueueDropsTheOldestAndCountsIt) {
  KvEventOptions o = Fixed();
  o.max_pending = 2;
  o.batch_interval = std::chrono::hours(1);
  auto pub = Make(o);
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);

  pub->BlockRemoved({Key(1)});
  pub->BlockRemoved({Key(2)});
  pub->BlockRemoved({Key(3)});
  EXPECT_EQ(pub->stats().events_dropped, 1u);
  pub->Flush();
  auto m = sub.Next(k);
  ASSERT_TRUE(m);
  Batch b = Decode(m->payload);
  ASSERT_EQ(b.events.size(), 2u);
  EXPECT_EQ(Bin(Arr(Val(b.events[0], 1)).ptr[0]), Key(2));
  EXPECT_EQ(Bin(Arr(Val(b.events[1], 1)).ptr[0]), Key(3));
  const KvEventPublisher::Stats s = pub->stats();
  EXPECT_EQ(s.events_queued, k + 3);
  EXPECT_EQ(s.events_dropped, 1u);
}

TEST(ServerKvEvents, CallsFromManyThreadsAllArrive) {
  KvEventOptions o = Fixed();
  o.batch_events = 7;  // batches cut mid-stream
  auto pub = Make(o);
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);

  constexpr int kThreads = 4, kEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pub, t] {
      for (int i = 0; i < kEach; ++i) pub->BlockRemoved({Key(static_cast<std::uint8_t>(t * kEach + i))});
    });
  }
  for (auto& t : threads) t.join();
  pub->Flush();
  std::vector<int> seen(kThreads * kEach, 0);
  std::uint64_t next = k;
  std::size_t got = 0;
  while (got < seen.size()) {
    auto m = sub.Next(k);
    ASSERT_TRUE(m) << "after " << got << " events";
    EXPECT_EQ(m->seq(), next++);
    Batch b = Decode(m->payload);
    EXPECT_LE(b.events.size(), 7u);
    for (const auto& e : b.events) {
      ++seen[Bin(Arr(Val(e, 1)).ptr[0])[0]];
      ++got;
    }
  }
  for (int n : seen) EXPECT_EQ(n, 1);
  EXPECT_EQ(pub->stats().events_dropped, 0u);
}

TEST(ServerKvEvents, DestructorSendsWhatIsStillQueued) {
  KvEventOptions o = Fixed();
  o.batch_interval = std::chrono::hours(1);
  auto pub = Make(o);
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);
  pub->BlockRemoved({Key(42)});
  pub.reset();
  auto m = sub.Next(k);
  ASSERT_TRUE(m);
  Batch b = Decode(m->payload);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(Bin(Arr(Val(b.events[0], 1)).ptr[0]), Key(42));
}

// Puts a 16 KiB chunk (2 layers, 4 heads of 8, 32 tokens of f32, every
// byte `fill`) under `key` into the node, as a runtime's envelope.
void PutChunk(NodeService& node, const keys::Digest& ns, const keys::Digest& key, std::uint8_t fill) {
  auto c = std::make_shared<chunk::Chunk>();
  c->meta.key = key;
  c->meta.ns_hash = ns;
  c->meta.layers = 2;
  c->meta.kv_heads = 4;
  c->meta.head_dim = 8;
  c->meta.tokens = 32;
  std::vector<std::uint8_t> kv(c->meta.payload_bytes(), fill);
  c->payload = chunk::Payload(kv.data(), kv.size());
  auto bytes = wire::EncodeEnvelope(*c);
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(node.Put(ns, {bytes->data(), bytes->size()}).ok());
}

// A node announces what it stores, what is deleted, and what its last tier
// evicts, each under the client's own key (the node files it under another).
TEST(ServerKvEvents, ANodeAnnouncesStoredDeletedAndEvictedChunks) {
  auto pub = Make(Fixed());
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);
  NodeOptions no;
  store::TierSpec host;
  host.capacity_bytes = 40 << 10;  // two of the chunks below (16 KiB each), not three
  no.tiers = {host};
  auto service = NodeService::Create(no);
  ASSERT_TRUE(service.ok()) << service.status().message();
  (*service)->SetEventPublisher(pub.get());
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  std::vector<keys::Digest> keys(3);
  for (std::uint8_t i = 0; i < 3; ++i) {
    keys[i][0] = static_cast<std::uint8_t>(0xA0 + i);
    PutChunk(**service, ns, keys[i], i);
  }
  EXPECT_EQ((*service)->Delete(ns, std::vector<keys::Digest>{keys[2]}), 1u);
  (*service)->chain().Flush();
  pub->Flush();
  std::vector<std::pair<std::string, Bytes>> seen;  // (type, key)
  for (std::uint64_t next = k; seen.size() < 5;) {
    auto m = sub.Next(next, 5000);
    if (!m) break;
    next = m->seq() + 1;
    for (const msgpack::object& e : Decode(m->payload).events) {
      const std::string type = Str(Val(e, 0));
      if (type == "AllBlocksCleared") continue;
      for (std::uint32_t i = 0; i < Arr(Val(e, 1)).size; ++i) seen.emplace_back(type, Bin(Arr(Val(e, 1)).ptr[i]));
    }
  }
  auto K = [&](int i) { return Bytes(keys[static_cast<size_t>(i)].begin(), keys[static_cast<size_t>(i)].end()); };
  const std::vector<std::pair<std::string, Bytes>> want = {
      {"BlockStored", K(0)}, {"BlockStored", K(1)}, {"BlockRemoved", K(0)},  // evicted by the third
      {"BlockStored", K(2)}, {"BlockRemoved", K(2)}};                        // deleted
  EXPECT_EQ(seen, want);
  (*service)->SetEventPublisher(nullptr);
}

// With a host tier above a disk tier, each event names the tier it is
// about (medium "CPU" or "DISK"): chunks are stored in host memory, demoted
// to disk when it fills, promoted back when read, deleted from both. Replayed
// in order, the events leave a subscriber with exactly what each tier holds.
TEST(ServerKvEvents, EachTiersBlocksAreAnnouncedWithItsMedium) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kdn-kv-events-media-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto pub = Make(Fixed());
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);
  NodeOptions no;
  store::TierSpec host;
  host.capacity_bytes = 40 << 10;  // two of the chunks below (16 KiB each), not three
  store::TierSpec disk;
  disk.kind = store::TierSpec::Kind::kDisk;
  disk.path = dir.string();
  disk.capacity_bytes = 1 << 20;
  disk.fsync = false;
  no.tiers = {host, disk};
  auto service = NodeService::Create(no);
  ASSERT_TRUE(service.ok()) << service.status().message();
  NodeService& node = **service;
  node.SetEventPublisher(pub.get());
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  constexpr int kChunks = 6;
  std::vector<keys::Digest> keys(kChunks);
  for (int i = 0; i < kChunks; ++i) {
    keys[static_cast<size_t>(i)][0] = static_cast<std::uint8_t>(0xC0 + i);
    PutChunk(node, ns, keys[static_cast<size_t>(i)], static_cast<std::uint8_t>(i));
    node.chain().Flush();
  }
  // Reads of demoted chunks promote them (in the background), which demotes others.
  for (int i : {0, 1, 0}) {
    ASSERT_NE(node.Get(ns, keys[static_cast<size_t>(i)]), nullptr);
    node.chain().Flush();
  }
  EXPECT_EQ(node.Delete(ns, std::vector<keys::Digest>{keys[0], keys[5]}), 2u);
  node.chain().Flush();
  pub->Flush();

  // Replay: (key, medium) -> held.
  std::map<std::pair<Bytes, std::string>, bool> view;
  std::map<std::string, int> stored_by_medium;
  std::uint64_t next = k;
  for (;;) {
    auto m = sub.Next(next, 500);
    if (!m) break;
    next = m->seq() + 1;
    for (const msgpack::object& e : Decode(m->payload).events) {
      const std::string type = Str(Val(e, 0));
      if (type == "AllBlocksCleared") continue;
      const std::string medium = Str(Val(e, type == "BlockStored" ? 6 : 2));
      ASSERT_TRUE(medium == "CPU" || medium == "DISK") << medium;
      for (std::uint32_t i = 0; i < Arr(Val(e, 1)).size; ++i) {
        auto& held = view[{Bin(Arr(Val(e, 1)).ptr[i]), medium}];
        EXPECT_NE(held, type == "BlockStored") << type << " twice in a row for one block in " << medium;
        held = type == "BlockStored";
        if (held) ++stored_by_medium[medium];
      }
    }
  }
  EXPECT_GE(stored_by_medium["CPU"], kChunks + 2);  // each put, and the promotions
  EXPECT_GE(stored_by_medium["DISK"], kChunks - 2);  // the demotions
  int held_anywhere = 0;
  for (int i = 0; i < kChunks; ++i) {
    const Bytes key(keys[static_cast<size_t>(i)].begin(), keys[static_cast<size_t>(i)].end());
    const keys::Digest object = ObjectKey(ns, keys[static_cast<size_t>(i)]);
    for (size_t level = 0; level < 2; ++level) {
      const std::string medium = level == 0 ? "CPU" : "DISK";
      const bool actual = node.chain().ContainsAt(level, object);
      SCOPED_TRACE("chunk " + std::to_string(i) + " in " + medium);
      const bool announced = view[{key, medium}];
      EXPECT_EQ(announced, actual);
      held_anywhere += actual;
    }
  }
  EXPECT_GE(held_anywhere, kChunks - 2);  // everything but the deleted ones is somewhere
  const Bytes deleted(keys[0].begin(), keys[0].end());
  const bool in_cpu = view[{deleted, "CPU"}], in_disk = view[{deleted, "DISK"}];
  EXPECT_FALSE(in_cpu);
  EXPECT_FALSE(in_disk);
  node.SetEventPublisher(nullptr);
  service->reset();
  std::filesystem::remove_all(dir);
}

// After a restart with a disk tier, the node cannot name the objects it
// found: it announces AllBlocksCleared, then each such chunk as stored when a
// get serves it, and from then on its eviction too.
TEST(ServerKvEvents, ARestartedNodeClearsThenRelearnsWhatAGetServes) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kdn-kv-events-restart-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  NodeOptions no;
  store::TierSpec disk;
  disk.kind = store::TierSpec::Kind::kDisk;
  disk.path = dir.string();
  disk.capacity_bytes = 40 << 10;  // two of the chunks below (16 KiB each), not three
  no.tiers = {disk};
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  std::vector<keys::Digest> keys(4);
  auto put = [&](NodeService& service, int i) {
    keys[static_cast<size_t>(i)][0] = static_cast<std::uint8_t>(0xB0 + i);
    PutChunk(service, ns, keys[static_cast<size_t>(i)], static_cast<std::uint8_t>(i));
    service.chain().Flush();
  };
  {
    auto first = NodeService::Create(no);
    ASSERT_TRUE(first.ok()) << first.status().message();
    put(**first, 0);
    put(**first, 1);
  }
  auto pub = Make(Fixed());
  ASSERT_TRUE(pub);
  Subscriber sub(pub->endpoint(), "kv-events");
  const std::uint64_t k = sub.Handshake(*pub);
  ASSERT_GT(k, 0u);
  auto service = NodeService::Create(no);
  ASSERT_TRUE(service.ok()) << service.status().message();
  ASSERT_EQ((*service)->chain().tier(0).objects(), 2u);
  (*service)->SetEventPublisher(pub.get());
  ASSERT_NE((*service)->Get(ns, keys[0]), nullptr);  // relearned: announced as stored
  ASSERT_NE((*service)->Get(ns, keys[0]), nullptr);  // once
  put(**service, 2);  // evicts chunk 1 (least recently used; never relearned: not announced)
  put(**service, 3);  // evicts chunk 0 (relearned: announced)
  pub->Flush();
  std::vector<std::pair<std::string, Bytes>> seen;  // (type, key); AllBlocksCleared has none
  std::uint64_t next = k;
  for (int extra = 0; seen.size() < 5 || extra++ == 0;) {  // then one more look, briefly: nothing else comes
    auto m = sub.Next(next, seen.size() < 5 ? 5000 : 300);
    if (!m) break;
    next = m->seq() + 1;
    for (const msgpack::object& e : Decode(m->payload).events) {
      const std::string type = Str(Val(e, 0));
      if (type == "AllBlocksCleared") {
        seen.emplace_back(type, Bytes{});
        continue;
      }
      for (std::uint32_t i = 0; i < Arr(Val(e, 1)).size; ++i) seen.emplace_back(type, Bin(Arr(Val(e, 1)).ptr[i]));
    }
  }
  auto K = [&](int i) { return Bytes(keys[static_cast<size_t>(i)].begin(), keys[static_cast<size_t>(i)].end()); };
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen[0], std::make_pair(std::string("AllBlocksCleared"), Bytes{}));
  auto count = [&](const std::string& type, int i) {
    return std::count(seen.begin(), seen.end(), std::make_pair(type, K(i)));
  };
  EXPECT_EQ(count("BlockStored", 0), 1);
  EXPECT_EQ(count("BlockStored", 2), 1);
  EXPECT_EQ(count("BlockStored", 3), 1);
  EXPECT_EQ(count("BlockRemoved", 0), 1);
  EXPECT_EQ(count("BlockRemoved", 1), 0);  // never relearned: its key is not known
  EXPECT_EQ(seen.size(), 5u);
  (*service)->SetEventPublisher(nullptr);
  service->reset();
  std::filesystem::remove_all(dir);
}

// Auth on the KV events (issue 37, item 4): with KvEventOptions::authorize
// only a subscriber that logs in (ZeroMQ PLAIN) with a password it accepts
// gets messages; one with another password, or none, is refused at the
// handshake (counted) and receives nothing of what the first one does.
TEST(ServerKvEvents, OnlySubscribersWithAnAcceptedTokenReceiveEvents) {
  KvEventOptions o = Fixed();
  o.authorize = [](std::string_view password) { return password == "token-with-the-grant"; };
  auto pub = Make(std::move(o));
  ASSERT_TRUE(pub);
  Subscriber good(pub->endpoint(), "kv-events", std::string("token-with-the-grant"));
  Subscriber wrong(pub->endpoint(), "kv-events", std::string("token-without-it"));
  Subscriber none(pub->endpoint(), "kv-events");
  // Each PLAIN login was answered: one in, the other refused (ZeroMQ
  // retries a refused one now and then: at least once). The subscriber
  // without credentials never gets that far: ZeroMQ refuses its greeting
  // (the NULL mechanism, to a PLAIN server), uncounted.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((pub->stats().subscribers_accepted < 1 || pub->stats().subscribers_refused < 1) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pub->stats().subscribers_accepted, 1u);
  EXPECT_GE(pub->stats().subscribers_refused, 1u);
  const std::uint64_t first = good.Handshake(*pub);
  ASSERT_GT(first, 0u);
  pub->BlockRemoved({Bytes(32, 7)});
  pub->Flush();
  auto m = good.Next(first);
  ASSERT_TRUE(m.has_value()) << "the subscriber with the token got nothing";
  // Everything sent so far (the probes and the event) reached the one
  // subscriber let in, and neither of the others.
  EXPECT_FALSE(wrong.Receive(300).has_value()) << "a subscriber with another token received events";
  EXPECT_FALSE(none.Receive(300).has_value()) << "a subscriber without a token received events";
}

// kdnd: KV events need a token with the stats grant (server.kv_events_public
// opts out); a tenant's token without it is refused, as on every surface.
TEST(ServerKvEvents, KdndTakesOnlySubscribersWithAStatsToken) {
  for (const bool open : {false, true}) {
    SCOPED_TRACE(open ? "kv_events_public" : "tokens required");
    const std::string toml = std::string("[server]\nlisten = [\"127.0.0.1:0\"]\nkv_events = \"tcp://127.0.0.1:*\"\n") +
                             (open ? "kv_events_public = true\n" : "") +
                             "[[token]]\ntoken = \"tenant-token-0123456789abcdef\"\nnamespaces = [\"a\"]\n"
                             "[[token]]\ntoken = \"ops-token-0123456789abcdefgh\"\nnamespaces = [\"ops\"]\nstats = true\n";
    auto config = ParseConfig(toml, "kdnd.toml");
    ASSERT_TRUE(config.ok()) << config.status().message();
    auto server = Server::Create(*config);
    ASSERT_TRUE(server.ok()) << server.status().message();
    KvEventPublisher* pub = (*server)->event_publisher();
    ASSERT_NE(pub, nullptr);
    if (open) {
      // Public: any subscriber without credentials hears; no handshake is checked.
      Subscriber anyone(pub->endpoint(), "");
      EXPECT_GT(anyone.Handshake(*pub), 0u);
      EXPECT_EQ(pub->stats().subscribers_refused, 0u);
      continue;
    }
    Subscriber ops(pub->endpoint(), "", std::string("ops-token-0123456789abcdefgh"));
    Subscriber tenant(pub->endpoint(), "", std::string("tenant-token-0123456789abcdef"));
    Subscriber anyone(pub->endpoint(), "");
    EXPECT_GT(ops.Handshake(*pub), 0u) << "the token with the stats grant got no events";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pub->stats().subscribers_refused < 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(pub->stats().subscribers_refused, 1u);  // the tenant's token (no credentials: ZeroMQ refuses the greeting)
    EXPECT_FALSE(tenant.Receive(300).has_value()) << "a token without the stats grant received events";
    EXPECT_FALSE(anyone.Receive(300).has_value()) << "a subscriber without a token received events";
    EXPECT_GE((*server)->service().Stats().values[static_cast<size_t>(NodeStat::kAuthFailures)], 1u);
  }
}

TEST(ServerKvEvents, CreateRejectsBadEndpoints) {
  auto empty = KvEventPublisher::Create("", "t");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument);

  auto bogus = KvEventPublisher::Create("bogus://nowhere", "t");
  ASSERT_FALSE(bogus.ok());
  EXPECT_EQ(bogus.status().code(), Code::kInvalidArgument) << bogus.status().message();

  auto first = KvEventPublisher::Create("tcp://127.0.0.1:*", "t");
  ASSERT_TRUE(first.ok()) << first.status().message();
  const std::string taken = first.value()->endpoint();
  EXPECT_NE(taken.find("tcp://127.0.0.1:"), std::string::npos) << taken;
  EXPECT_EQ(taken.find('*'), std::string::npos) << "the port chosen is reported: " << taken;
  auto second = KvEventPublisher::Create(taken, "t");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kUnavailable) << second.status().message();
}

// A consumer as routers write them for vLLM: pyzmq's recv_multipart, then
// msgpack.unpackb to plain lists and dicts, then a decoder of vLLM's event
// types as vLLM declares them (vllm/distributed/kv_events.py, late 2026:
// msgspec structs with tag=True and omit_defaults), written here from that
// declaration: each field in order with its default, or none (required). An
// event is a map {"type": tag, field: value, ...} (vLLM since PR #42892) or
// an array [tag, value, ...] in declaration order (before it); as msgspec
// does, a field left out takes its default, a required one left out is an
// error (exit 4), an array's surplus trailing elements are ignored. It
// prints every field of every event, defaults filled in, as JSON.
constexpr const char* kPySubscriber = R"PY(
import json, sys
import msgpack, zmq

endpoint, topic = sys.argv[1], sys.argv[2]
REQUIRED = object()
SCHEMA = {
    "BlockStored": [("block_hashes", REQUIRED), ("parent_block_hash", REQUIRED),
                    ("token_ids", REQUIRED), ("block_size", REQUIRED),
                    ("lora_id", REQUIRED), ("medium", REQUIRED), ("lora_name", REQUIRED),
                    ("extra_keys", None), ("group_idx", None), ("kv_cache_spec_kind", None),
                    ("kv_cache_spec_sliding_window", None), ("locality", None),
                    ("ownership", None), ("session_id", None)],
    "BlockRemoved": [("block_hashes", REQUIRED), ("medium", REQUIRED), ("group_idx", None),
                     ("locality", None), ("ownership", None)],
    "AllBlocksCleared": [],
}
TYPES = {"block_hashes": list, "parent_block_hash": (bytes, int, type(None)), "token_ids": list,
         "block_size": int, "lora_id": (int, type(None)), "medium": (str, type(None)),
         "lora_name": (str, type(None)), "group_idx": (int, type(None))}

def fail(*why):
    print(*why)
    sys.exit(4)

def decode(e):
    if isinstance(e, dict):
        tag = e.get("type")
        if tag not in SCHEMA: fail("unknown tag", tag)
        names = [n for n, _ in SCHEMA[tag]]
        sent = [k for k in e if k != "type"]
        for k in sent:
            if k not in names: fail("unknown field", tag, k)
        if sent != [n for n in names if n in e]: fail("not in declaration order", tag, sent)
        values = {k: e[k] for k in sent}
    elif isinstance(e, list) and e:
        tag = e[0]
        if tag not in SCHEMA: fail("unknown tag", tag)
        values = dict(zip([n for n, _ in SCHEMA[tag]], e[1:]))
    else:
        fail("not an event", e)
    out = {"type": tag}
    for name, default in SCHEMA[tag]:
        if name in values:
            v = values[name]
            if name in TYPES and not isinstance(v, TYPES[name]): fail("bad type", tag, name, v)
            out[name] = v
        elif default is REQUIRED:
            fail("missing", tag, name)
        else:
            out[name] = default
    for h in out.get("block_hashes", []):
        if not isinstance(h, (bytes, int)): fail("bad hash", h)
    return out

def plain(v):
    if isinstance(v, bytes):
        return {"bin": v.hex()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v

ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
sub.connect(endpoint)
if not sub.poll(10000):
    sys.exit(3)
topic_b, seq_b, payload = sub.recv_multipart()
ts, events, dp_rank = msgpack.unpackb(payload, raw=False)
print(json.dumps({"topic": topic_b.decode("utf-8"), "seq_frame": len(seq_b), "ts": ts,
                  "events": [plain(decode(e)) for e in events], "data_parallel_rank": dp_rank},
                 separators=(",", ":")))
)PY";

// Both shapes kdnd sends decode, as vLLM's types, to the same events: every
// field where a v2 consumer looks for it (medium per tier, group_idx).
TEST(ServerKvEvents, PythonSubscriberDecodesBothShapesAsVllmsEvents) {
  const bool have = std::system("/usr/bin/python3 -c 'import zmq, msgpack' >/dev/null 2>&1") == 0;
  if (!have) {
    if (std::getenv("KDN_REQUIRE_PYZMQ") == nullptr) GTEST_SKIP() << "/usr/bin/python3 lacks zmq or msgpack";
    FAIL() << "KDN_REQUIRE_PYZMQ is set but /usr/bin/python3 cannot import zmq and msgpack";
  }
  char dir_template[] = "/tmp/kdn-kv-events-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string script = dir + "/sub.py";
  std::ofstream(script) << kPySubscriber;

  const std::string nulls = R"("extra_keys":null,"group_idx":0,"kv_cache_spec_kind":null,)"
                            R"("kv_cache_spec_sliding_window":null,"locality":null,"ownership":null,"session_id":null)";
  const std::string expected =
      std::string(R"({"topic":"kv-events","seq_frame":8,"ts":1234.5,"events":[)") +
      R"({"type":"BlockStored","block_hashes":[{"bin":")" + Hex(Key(0)) + R"("},{"bin":")" + Hex(Key(32)) +
      R"("}],"parent_block_hash":{"bin":")" + Hex(Key(64)) +
      R"("},"token_ids":[1,2,151644,4],"block_size":2,"lora_id":null,"medium":"CPU","lora_name":null,)" + nulls + "}," +
      R"({"type":"BlockStored","block_hashes":[{"bin":")" + Hex(Key(96)) +
      R"("}],"parent_block_hash":null,"token_ids":[],"block_size":256,"lora_id":null,"medium":"DISK","lora_name":null,)" +
      nulls + "}," + R"({"type":"BlockRemoved","block_hashes":[{"bin":")" + Hex(Key(0)) +
      R"("}],"medium":"CPU","group_idx":0,"locality":null,"ownership":null},)" +
      R"({"type":"AllBlocksCleared"}],"data_parallel_rank":0})" + "\n";

  for (KvEventEncoding encoding : {KvEventEncoding::kTaggedMap, KvEventEncoding::kTaggedArray}) {
    SCOPED_TRACE(encoding == KvEventEncoding::kTaggedMap ? "map" : "array");
    KvEventOptions o = Fixed();
    o.encoding = encoding;
    // Over ipc:// this time: the transport vLLM's docs suggest on one host.
    auto r = KvEventPublisher::Create("ipc://" + dir + "/events", "kv-events", o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    auto pub = std::move(r).value();

    std::atomic<bool> done{false};
    testing::CliRun run;
    std::thread py([&] {
      run = testing::RunShell("/usr/bin/python3 " + script + " " + pub->endpoint() + " kv-events 2>&1");
      done = true;
    });
    // Until the subscriber has its first message (it may join late), send the
    // same batch again and again; it reads one and exits.
    for (int i = 0; i < 100 && !done; ++i) {
      pub->BlockStored({Key(0), Key(32)}, Key(64), {1, 2, 151644, 4}, 2, "CPU");
      pub->BlockStored({Key(96)}, std::nullopt, {}, 256, "DISK");
      pub->BlockRemoved({Key(0)}, "CPU");
      pub->AllBlocksCleared();
      pub->Flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    py.join();
    ASSERT_EQ(run.code, 0) << run.out;
    EXPECT_EQ(run.out, expected);
    pub.reset();
    std::remove((dir + "/events").c_str());
  }
  std::remove(script.c_str());
  rmdir(dir.c_str());
}

// Without a group (KvEventOptions::group_idx null) an event has the shape
// vLLM sent before groups: group_idx (and extra_keys before it) left out.
TEST(ServerKvEvents, WithoutAGroupTheFieldIsLeftOut) {
  for (KvEventEncoding encoding : {KvEventEncoding::kTaggedMap, KvEventEncoding::kTaggedArray}) {
    KvEventOptions o = Fixed();
    o.encoding = encoding;
    o.group_idx = std::nullopt;
    auto pub = Make(o);
    ASSERT_TRUE(pub);
    Subscriber sub(pub->endpoint(), "kv-events");
    const std::uint64_t k = sub.Handshake(*pub);
    ASSERT_GT(k, 0u);
    pub->BlockStored({Key(1)}, std::nullopt, {}, 16, "CPU");
    pub->BlockRemoved({Key(1)}, "CPU");
    pub->Flush();
    auto m = sub.Next(k);
    ASSERT_TRUE(m);
    Batch b = Decode(m->payload);
    ASSERT_EQ(b.events.size(), 2u);
    if (encoding == KvEventEncoding::kTaggedMap) {
      EXPECT_EQ(Keys(b.events[0]).size(), 8u);
      EXPECT_EQ(Keys(b.events[1]), (std::vector<std::string>{"type", "block_hashes", "medium"}));
    } else {
      EXPECT_EQ(Arr(b.events[0]).size, 8u);
      EXPECT_EQ(Arr(b.events[1]).size, 3u);
    }
  }
}

}  // namespace
}  // namespace kdn::server
