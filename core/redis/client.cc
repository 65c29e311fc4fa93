// SPDX-License-Identifier: Apache-2.0
// The Redis / Redis Cluster client (see client.h).
//
// hiredis does the protocol: commands are formatted with
// redisAppendCommandArgv (argv lengths: binary safe) into the context's
// output buffer and replies are parsed by its reader. The I/O is ours: each
// connection's socket is non-blocking once connected, and one batch's
// pipelines (one per node) are written and read together under a single
// poll() with one deadline, so a node that is stopped or slow costs its keys
// the command timeout once, not once per node, and the other nodes' replies
// are read meanwhile. Writes use send(MSG_NOSIGNAL): a peer that died never
// raises SIGPIPE in the caller's process (hiredis' own write() would).
//
// Reads are zero-copy past hiredis: a Value points into the redisReply's
// string, which its shared owner keeps alive.
//
// Redirects and failures, per key: MOVED sets the slot's owner, retries the
// key there and asks for a full refresh of the map (done at the end of the
// call); ASK retries on the target after ASKING, the map unchanged; a node
// that fails (refused, connection lost, timeout) has its idle connections
// closed, the map is reloaded from another node (at most every 100 ms), and
// its unanswered keys are retried once if their slot now has another owner
// or the lost connection was an old pooled one (a fresh one is tried, so a
// server that closed idle connections costs nothing); else they get
// kUnavailable / kTimeout. CLUSTERDOWN, TRYAGAIN, LOADING, MASTERDOWN,
// READONLY: kUnavailable for the key at once. At most 3 sends per key.
#include "core/redis/client.h"

#include <fcntl.h>
// hiredis 0.14's sds.h has no extern "C" of its own (hiredis.h includes it
// outside its block): declare its functions with C linkage first.
extern "C" {
#include <hiredis/sds.h>
}
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <utility>

namespace kdn::redis {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kSlots = 16384;
// A failed node triggers a refresh of the slot map at most this often.
constexpr auto kRefreshInterval = std::chrono::milliseconds(100);
// Executions of one key per call: the first, then redirects or one retry.
constexpr int kMaxAttempts = 3;

constexpr std::array<std::uint16_t, 256> MakeCrcTable() {
  std::array<std::uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) {
      crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    t[static_cast<size_t>(i)] = crc;
  }
  return t;
}
constexpr std::array<std::uint16_t, 256> kCrcTable = MakeCrcTable();

std::uint16_t Crc16(std::string_view s) {
  std::uint16_t crc = 0;
  for (unsigned char c : s) {
    crc = static_cast<std::uint16_t>((crc << 8) ^ kCrcTable[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

struct Endpoint {
  std::string host;
  int port = 0;
  std::string addr() const { return host + ":" + std::to_string(port); }
};

// "host:port" or "[v6]:port".
std::optional<Endpoint> ParseAddress(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon + 1 >= s.size()) return std::nullopt;
  std::string_view host = s.substr(0, colon);
  const std::string_view port = s.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p <= 0 || p > 65535) return std::nullopt;
  return Endpoint{std::string(host), p};
}

std::string_view ReplyText(const redisReply* r) {
  return r->str != nullptr ? std::string_view(r->str, r->len) : std::string_view();
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

// An argument's bytes for hiredis: never a null pointer (an empty key or
// value may have none).
const char* Arg(const void* p) { return p != nullptr ? static_cast<const char*>(p) : ""; }

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left + 1, 1 << 30));
}

}  // namespace

std::uint16_t KeySlot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return static_cast<std::uint16_t>(Crc16(key) & (kSlots - 1));
}

namespace {

// One server: its address and its pool of idle connections.
struct Node {
  Endpoint ep;
  std::string addr;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<redisContext*> idle;  // GUARDED_BY(mu)
  std::uint32_t open = 0;           // GUARDED_BY(mu): idle + leased
  std::uint64_t epoch = 0;          // GUARDED_BY(mu): bumped when the node failed
  std::atomic<std::int64_t> failed_at{0};  // steady-clock ns of its last failure (0: none)
};

// What one reply may make the reader build and hold (hiredis 0.14 bounds
// neither): an array of more than kMaxArrayElements elements, or a reply of
// more than kMaxReplyObjects objects, is a protocol error, and so is a reply
// whose unparsed bytes pass Options::max_reply_bytes (a bulk string that
// never ends). kdn's replies are single values, counts and CLUSTER SLOTS
// maps (at most 16384 ranges of a few elements each).
constexpr int kMaxArrayElements = 1 << 20;
constexpr std::uint64_t kMaxReplyObjects = std::uint64_t{1} << 21;
// At most this much is read per pass over a connection before its replies
// are parsed and the deadline looked at again.
constexpr size_t kReadPassBytes = size_t{16} << 20;

// Per connection (the reader's privdata): the objects of the reply being
// read, and hiredis' own functions, which build them.
struct ReaderGuard {
  const redisReplyObjectFunctions* orig = nullptr;
  std::uint64_t objects = 0;
  bool refused = false;  // an object past the bounds was refused
};
ReaderGuard* GuardOf(const redisReadTask* t) { return static_cast<ReaderGuard*>(t->privdata); }
// A null object is hiredis' "out of memory": the reader stops with an error.
void* GuardedString(const redisReadTask* t, char* s, size_t n) {
  ReaderGuard* g = GuardOf(t);
  if (++g->objects > kMaxReplyObjects) return g->refused = true, nullptr;
  return g->orig->createString(t, s, n);
}
void* GuardedArray(const redisReadTask* t, int elements) {
  ReaderGuard* g = GuardOf(t);
  if (++g->objects > kMaxReplyObjects || elements > kMaxArrayElements) return g->refused = true, nullptr;
  return g->orig->createArray(t, elements);
}
void* GuardedInteger(const redisReadTask* t, long long v) {
  ReaderGuard* g = GuardOf(t);
  if (++g->objects > kMaxReplyObjects) return g->refused = true, nullptr;
  return g->orig->createInteger(t, v);
}
void* GuardedNil(const redisReadTask* t) {
  ReaderGuard* g = GuardOf(t);
  if (++g->objects > kMaxReplyObjects) return g->refused = true, nullptr;
  return g->orig->createNil(t);
}
// hiredis' own freeReplyObject frees what its create functions made.
redisReplyObjectFunctions guarded_functions = {GuardedString, GuardedArray, GuardedInteger, GuardedNil, freeReplyObject};

// Puts a new connection's reader under a guard.
void Guard(redisContext* c) {
  auto* g = new ReaderGuard;
  g->orig = c->reader->fn;
  c->reader->fn = &guarded_functions;  // never written: shared by every connection's reader
  c->reader->privdata = g;
}
void FreeContext(redisContext* c) {
  if (c == nullptr) return;
  delete static_cast<ReaderGuard*>(c->reader != nullptr ? c->reader->privdata : nullptr);
  redisFree(c);
}

// A connection leased from a node's pool.
struct Lease {
  redisContext* ctx = nullptr;
  std::uint64_t epoch = 0;
  bool fresh = false;  // dialled for this lease (not reused from the pool)
};

// One node's pipeline of one round.
struct Pipeline {
  enum class Kind : std::uint8_t { kAuth, kAsking, kCommand };
  // kBusy: no connection free in time (the node is fine, just busy).
  enum class Fail : std::uint8_t { kNone, kConnect, kIo, kTimeout, kAuth, kBusy };

  Node* node = nullptr;
  Lease lease;
  std::vector<Kind> kinds;         // one per command appended, in order
  size_t answered = 0;             // replies consumed so far (all kinds)
  std::vector<ReplyPtr> replies;   // the kCommand replies, in order
  size_t sent = 0;                 // bytes of ctx->obuf written
  Fail fail = Fail::kNone;
  Status failure;                  // why, when fail != kNone
  bool done = false;
};

}  // namespace

struct Client::Impl {
  Options opt;
  std::vector<Endpoint> seeds;

  std::mutex nodes_mu;
  std::map<std::string, std::unique_ptr<Node>> nodes;  // GUARDED_BY(nodes_mu); never erased

  mutable std::shared_mutex map_mu;
  std::vector<Node*> slots = std::vector<Node*>(kSlots, nullptr);  // GUARDED_BY(map_mu)
  std::vector<Node*> masters;                                       // GUARDED_BY(map_mu)
  std::vector<Node*> replicas;                                      // GUARDED_BY(map_mu)
  std::atomic<bool> cluster{false};

  // One refresh at a time (a flag and a condition variable rather than a
  // timed mutex: TSan does not see pthread_mutex_clocklock).
  std::mutex refresh_mu;
  std::condition_variable refresh_cv;
  bool refreshing = false;           // GUARDED_BY(refresh_mu)
  Clock::time_point last_refresh{};  // GUARDED_BY(refresh_mu)
  std::atomic<bool> refresh_wanted{false};

  struct {
    std::atomic<std::uint64_t> commands{0}, moved{0}, ask{0}, slot_map_refreshes{0}, connects{0},
        connect_failures{0}, timeouts{0}, io_errors{0}, server_errors{0};
  } n;

  ~Impl() {
    for (auto& [addr, node] : nodes) {
      for (redisContext* c : node->idle) FreeContext(c);
    }
  }

  Node* GetNode(const Endpoint& ep) {
    std::string addr = ep.addr();
    std::lock_guard lk(nodes_mu);
    auto& slot = nodes[addr];
    if (!slot) {
      slot = std::make_unique<Node>();
      slot->ep = ep;
      slot->addr = std::move(addr);
    }
    return slot.get();
  }

  // ---- connections ----

  Result<redisContext*> Dial(const Node& node, Clock::time_point deadline) {
    const auto budget = std::min<std::int64_t>(
        opt.connect_timeout_ms,
        std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(budget / 1000);
    tv.tv_usec = static_cast<suseconds_t>((budget % 1000) * 1000);
    redisContext* c = redisConnectWithTimeout(node.ep.host.c_str(), node.ep.port, tv);
    if (c == nullptr || c->err != 0) {
      std::string why = c != nullptr ? c->errstr : "out of memory";
      if (c != nullptr) redisFree(c);
      n.connect_failures.fetch_add(1, std::memory_order_relaxed);
      return Status(Code::kUnavailable, "redis: cannot connect to " + node.addr + ": " + why);
    }
    // Small commands go out at once (hiredis sets this too; say it here).
    const int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    Guard(c);
    // From here on the I/O is ours (poll + send/recv): non-blocking.
    const int flags = fcntl(c->fd, F_GETFL, 0);
    fcntl(c->fd, F_SETFL, flags | O_NONBLOCK);
    n.connects.fetch_add(1, std::memory_order_relaxed);
    return c;
  }

  Result<Lease> Acquire(Node* node, Clock::time_point deadline) {
    std::unique_lock lk(node->mu);
    const std::uint32_t cap = std::max<std::uint32_t>(1, opt.connections_per_node);
    while (node->idle.empty() && node->open >= cap) {
      if (node->cv.wait_until(lk, deadline) == std::cv_status::timeout && node->idle.empty() &&
          node->open >= cap) {
        return Status(Code::kTimeout, "redis: all " + std::to_string(cap) + " connections to " + node->addr +
                                          " stayed busy until the timeout");
      }
    }
    if (!node->idle.empty()) {
      Lease l{node->idle.back(), node->epoch, false};
      node->idle.pop_back();
      return l;
    }
    ++node->open;
    const std::uint64_t epoch = node->epoch;
    lk.unlock();
    auto c = Dial(*node, deadline);
    if (!c.ok()) {
      lk.lock();
      --node->open;
      node->cv.notify_one();
      return c.status();
    }
    return Lease{*c, epoch, true};
  }

  void Release(Node* node, Lease& lease, bool healthy) {
    if (lease.ctx == nullptr) return;
    redisContext* drop = nullptr;
    {
      std::lock_guard lk(node->mu);
      if (healthy && lease.epoch == node->epoch && lease.ctx->err == 0) {
        // An idle connection does not keep a big reply's buffer.
        redisReader* rd = lease.ctx->reader;
        if (rd->len == 0 && sdsavail(rd->buf) > 256 * 1024) {
          sdsfree(rd->buf);
          rd->buf = sdsempty();
          rd->pos = 0;
        }
        node->idle.push_back(lease.ctx);
      } else {
        drop = lease.ctx;
        --node->open;
      }
      node->cv.notify_one();
    }
    lease.ctx = nullptr;
    if (drop != nullptr) FreeContext(drop);
  }

  // The node failed: its idle connections are likely dead too.
  void DropIdle(Node* node) {
    node->failed_at.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    std::vector<redisContext*> drop;
    {
      std::lock_guard lk(node->mu);
      ++node->epoch;
      drop.swap(node->idle);
      node->open -= static_cast<std::uint32_t>(drop.size());
      node->cv.notify_all();
    }
    for (redisContext* c : drop) FreeContext(c);
  }

  // ---- pipelines ----

  // Leases a connection (AUTH first on a new one); false if none.
  bool Begin(Pipeline& p, Clock::time_point deadline) {
    auto l = Acquire(p.node, deadline);
    if (!l.ok()) {
      p.fail = l.status().code() == Code::kTimeout ? Pipeline::Fail::kBusy : Pipeline::Fail::kConnect;
      p.failure = l.status();
      p.done = true;
      return false;
    }
    p.lease = *l;
    if (p.lease.fresh && !opt.password.empty()) {
      if (opt.user.empty()) {
        const char* argv[] = {"AUTH", opt.password.data()};
        const size_t lens[] = {4, opt.password.size()};
        redisAppendCommandArgv(p.lease.ctx, 2, argv, lens);
      } else {
        const char* argv[] = {"AUTH", opt.user.data(), opt.password.data()};
        const size_t lens[] = {4, opt.user.size(), opt.password.size()};
        redisAppendCommandArgv(p.lease.ctx, 3, argv, lens);
      }
      p.kinds.push_back(Pipeline::Kind::kAuth);
    }
    return true;
  }

  static void Append(Pipeline& p, int argc, const char** argv, const size_t* lens, bool asking) {
    if (asking) {
      const char* a[] = {"ASKING"};
      const size_t al[] = {6};
      redisAppendCommandArgv(p.lease.ctx, 1, a, al);
      p.kinds.push_back(Pipeline::Kind::kAsking);
    }
    redisAppendCommandArgv(p.lease.ctx, argc, argv, lens);
    p.kinds.push_back(Pipeline::Kind::kCommand);
  }

  void Fail(Pipeline& p, Pipeline::Fail why, Status status) {
    if (p.done) return;
    p.fail = why;
    p.failure = std::move(status);
    p.done = true;
    if (why == Pipeline::Fail::kTimeout) n.timeouts.fetch_add(1, std::memory_order_relaxed);
    if (why == Pipeline::Fail::kIo) n.io_errors.fetch_add(1, std::memory_order_relaxed);
  }

  void Consume(Pipeline& p, ReplyPtr r) {
    const Pipeline::Kind kind = p.kinds[p.answered++];
    if (kind == Pipeline::Kind::kAuth) {
      if (r->type == REDIS_REPLY_ERROR) {
        Fail(p, Pipeline::Fail::kAuth,
             Status::InvalidArgument("redis: AUTH refused by " + p.node->addr + ": " + std::string(ReplyText(r.get()))));
      }
    } else if (kind == Pipeline::Kind::kCommand) {
      p.replies.push_back(std::move(r));
    }
    if (p.answered == p.kinds.size()) p.done = true;
  }

  bool SendSome(Pipeline& p) {
    redisContext* c = p.lease.ctx;
    const size_t len = sdslen(c->obuf);
    while (p.sent < len) {
      const ssize_t w = send(c->fd, c->obuf + p.sent, len - p.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        p.sent += static_cast<size_t>(w);
      } else if (w < 0 && errno == EINTR) {
        continue;
      } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return true;
      } else {
        Fail(p, Pipeline::Fail::kIo,
             Status(Code::kUnavailable, "redis: write to " + p.node->addr + " failed: " + std::strerror(errno)));
        return false;
      }
    }
    sdsfree(c->obuf);
    c->obuf = sdsempty();
    p.sent = 0;
    return true;
  }

  void ReceiveSome(Pipeline& p) {
    redisReader* rd = p.lease.ctx->reader;
    bool eof = false;
    int err = 0;
    size_t pass = 0;  // bytes read in this pass (kReadPassBytes at most)
    for (;;) {
      // Straight into the reader's buffer (what redisReaderFeed would copy
      // there), giving back a big buffer once it is drained, as Feed does.
      if (rd->len == 0 && sdsavail(rd->buf) > 256 * 1024) {
        sdsfree(rd->buf);
        rd->buf = sdsempty();
        rd->pos = 0;
      }
      constexpr size_t kChunk = 256 * 1024;
      if (sdsavail(rd->buf) < kChunk) {
        // Grown in proportion to what it holds (sdsMakeRoomFor alone adds
        // 1 MiB at a time past 1 MiB, so a reply of n MiB cost n copies of
        // the buffer), up to about max_reply_bytes.
        const std::uint64_t cap = opt.max_reply_bytes + kChunk;
        size_t want = std::max<size_t>(kChunk, rd->len);
        if (rd->len + want > cap) {
          want = static_cast<size_t>(std::max<std::uint64_t>(kChunk, cap - std::min<std::uint64_t>(cap, rd->len)));
        }
        sds grown = sdsMakeRoomFor(rd->buf, want);
        if (grown == nullptr) {
          err = ENOMEM;
          break;
        }
        rd->buf = grown;
      }
      const size_t room = std::min<size_t>(sdsavail(rd->buf), kReadPassBytes - pass);
      const ssize_t got = recv(p.lease.ctx->fd, rd->buf + rd->len, room, MSG_DONTWAIT);
      if (got > 0) {
        sdsIncrLen(rd->buf, static_cast<int>(got));
        rd->len = sdslen(rd->buf);
        pass += static_cast<size_t>(got);
        // The rest waits for the next pass, after the poll loop has looked
        // at the deadline: a server that streams without end cannot hold
        // the caller here.
        if (static_cast<size_t>(got) < room || pass >= kReadPassBytes) break;
        continue;
      }
      if (got == 0) {
        eof = true;
      } else if (errno == EINTR) {
        continue;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
        err = errno;
      }
      break;
    }
    // Replies that arrived before an error are still good.
    while (!p.done) {
      void* reply = nullptr;
      if (redisReaderGetReply(rd, &reply) != REDIS_OK) {
        const bool refused = static_cast<ReaderGuard*>(rd->privdata)->refused;
        Fail(p, Pipeline::Fail::kIo,
             Status(Code::kUnavailable, "redis: protocol error from " + p.node->addr + ": " +
                                            (refused ? "a reply of more than " + std::to_string(kMaxReplyObjects) +
                                                           " objects or an array of more than " +
                                                           std::to_string(kMaxArrayElements) + " elements"
                                                     : std::string(rd->errstr))));
        p.lease.ctx->err = REDIS_ERR_PROTOCOL;
        return;
      }
      if (reply == nullptr) break;
      static_cast<ReaderGuard*>(rd->privdata)->objects = 0;  // the next reply's count
      Consume(p, ReplyPtr(static_cast<redisReply*>(reply)));
    }
    if (p.done) return;
    // What is left unparsed is (part of) one reply: beyond the bound it is
    // no reply kdn asked for.
    if (rd->len - rd->pos > opt.max_reply_bytes) {
      p.lease.ctx->err = REDIS_ERR_PROTOCOL;
      Fail(p, Pipeline::Fail::kIo,
           Status(Code::kUnavailable, "redis: a reply from " + p.node->addr + " of more than " +
                                          std::to_string(opt.max_reply_bytes) + " bytes (max_reply_bytes)"));
      return;
    }
    if (eof) {
      p.lease.ctx->err = REDIS_ERR_EOF;
      Fail(p, Pipeline::Fail::kIo, Status(Code::kUnavailable, "redis: " + p.node->addr + " closed the connection"));
    } else if (err != 0) {
      p.lease.ctx->err = REDIS_ERR_IO;
      Fail(p, Pipeline::Fail::kIo,
           Status(Code::kUnavailable, "redis: read from " + p.node->addr + " failed: " + std::strerror(err)));
    }
  }

  // Writes and reads every started pipeline until all are answered, failed,
  // or the deadline passes.
  void Run(std::vector<Pipeline>& ps, Clock::time_point deadline) {
    std::vector<pollfd> fds;
    std::vector<Pipeline*> who;
    for (;;) {
      fds.clear();
      who.clear();
      for (Pipeline& p : ps) {
        if (p.done) continue;
        if (p.kinds.empty()) {
          p.done = true;
          continue;
        }
        if (p.sent < sdslen(p.lease.ctx->obuf) && !SendSome(p)) continue;
        short events = POLLIN;
        if (sdslen(p.lease.ctx->obuf) > 0) events |= POLLOUT;
        fds.push_back(pollfd{p.lease.ctx->fd, events, 0});
        who.push_back(&p);
      }
      if (fds.empty()) return;
      const int wait = RemainingMs(deadline);
      const int ready = wait == 0 ? 0 : poll(fds.data(), fds.size(), wait);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        for (Pipeline* p : who) {
          p->lease.ctx->err = REDIS_ERR_IO;
          Fail(*p, Pipeline::Fail::kTimeout,
               Status(Code::kTimeout, "redis: " + p->node->addr + " did not answer within " +
                                          std::to_string(opt.command_timeout_ms) + " ms"));
        }
        return;
      }
      for (size_t i = 0; i < fds.size(); ++i) {
        Pipeline& p = *who[i];
        if (fds[i].revents == 0 || p.done) continue;
        if ((fds[i].revents & POLLOUT) != 0 && !SendSome(p)) continue;
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) ReceiveSome(p);
      }
    }
  }

  // Hands the connections back (closing the ones that failed) and tells
  // the pool when a node failed.
  void Finish(std::vector<Pipeline>& ps) {
    for (Pipeline& p : ps) {
      const bool healthy = p.fail == Pipeline::Fail::kNone && p.answered == p.kinds.size();
      Release(p.node, p.lease, healthy);
      if (p.fail == Pipeline::Fail::kIo || p.fail == Pipeline::Fail::kTimeout || p.fail == Pipeline::Fail::kConnect) {
        DropIdle(p.node);
      }
    }
  }

  // One command to one node (CLUSTER SLOTS).
  Result<ReplyPtr> Single(Node* node, std::initializer_list<std::string_view> args, Clock::time_point deadline) {
    std::vector<Pipeline> ps(1);
    ps[0].node = node;
    if (Begin(ps[0], deadline)) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (std::string_view a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      Append(ps[0], static_cast<int>(argv.size()), argv.data(), lens.data(), false);
      Run(ps, deadline);
    }
    Finish(ps);
    if (ps[0].fail != Pipeline::Fail::kNone) return ps[0].failure;
    return std::move(ps[0].replies.at(0));
  }

  // ---- the slot map ----

  // Installs the map of a CLUSTER SLOTS reply from `from`; false if malformed.
  bool Install(const redisReply* r, Node* from) {
    if (r->type != REDIS_REPLY_ARRAY) return false;
    std::vector<Node*> map(kSlots, nullptr);
    std::vector<Node*> ms, rs;
    auto node_of = [&](const redisReply* e) -> Node* {
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 2 || e->element[0]->type != REDIS_REPLY_STRING ||
          e->element[1]->type != REDIS_REPLY_INTEGER) {
        return nullptr;
      }
      std::string host(ReplyText(e->element[0]));
      if (host.empty() || host == "?") host = from->ep.host;  // a node that does not know its address
      return GetNode(Endpoint{host, static_cast<int>(e->element[1]->integer)});
    };
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* range = r->element[i];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 || range->element[0]->type != REDIS_REPLY_INTEGER ||
          range->element[1]->type != REDIS_REPLY_INTEGER) {
        return false;
      }
      const long long lo = range->element[0]->integer, hi = range->element[1]->integer;
      if (lo < 0 || hi >= kSlots || lo > hi) return false;
      Node* master = node_of(range->element[2]);
      if (master == nullptr) return false;
      for (long long s = lo; s <= hi; ++s) map[static_cast<size_t>(s)] = master;
      if (std::find(ms.begin(), ms.end(), master) == ms.end()) ms.push_back(master);
      for (size_t j = 3; j < range->elements; ++j) {
        Node* replica = node_of(range->element[j]);
        if (replica != nullptr && std::find(rs.begin(), rs.end(), replica) == rs.end()) rs.push_back(replica);
      }
    }
    std::unique_lock lk(map_mu);
    slots.swap(map);
    masters.swap(ms);
    replicas.swap(rs);
    return true;
  }

  void InstallSingle(Node* node) {
    std::unique_lock lk(map_mu);
    std::fill(slots.begin(), slots.end(), node);
    masters.assign(1, node);
    replicas.clear();
  }

  // Asks `node` for the map. A status when it cannot tell (not reachable, or
  // it refused: AUTH, ACL).
  Status LoadFrom(Node* node, Clock::time_point deadline) {
    auto r = Single(node, {"CLUSTER", "SLOTS"}, deadline);
    if (!r.ok()) return r.status();
    const redisReply* reply = r->get();
    if (reply->type == REDIS_REPLY_ERROR) {
      const std::string_view text = ReplyText(reply);
      if (text.find("cluster support disabled") != std::string_view::npos) {
        cluster.store(false);
        InstallSingle(node);
        n.slot_map_refreshes.fetch_add(1, std::memory_order_relaxed);
        return Status::Ok();
      }
      n.server_errors.fetch_add(1, std::memory_order_relaxed);
      const bool refused = StartsWith(text, "NOAUTH") || StartsWith(text, "NOPERM") || StartsWith(text, "WRONGPASS");
      return Status(refused ? Code::kInvalidArgument : Code::kUnavailable,
                    "redis: CLUSTER SLOTS on " + node->addr + ": " + std::string(text));
    }
    if (!Install(reply, node)) {
      return Status(Code::kUnavailable, "redis: malformed CLUSTER SLOTS reply from " + node->addr);
    }
    cluster.store(true);
    n.slot_map_refreshes.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  // Reloads the map from a reachable node other than the `avoid` ones, at
  // most once per kRefreshInterval; true if a new map was installed.
  bool Refresh(const std::vector<Node*>& avoid) {
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(opt.command_timeout_ms);
    {
      std::unique_lock lk(refresh_mu);
      if (!refresh_cv.wait_until(lk, deadline, [&] { return !refreshing; })) return false;
      if (Clock::now() - last_refresh < kRefreshInterval) return false;
      last_refresh = Clock::now();
      refreshing = true;
    }
    const bool done = RefreshFrom(avoid, deadline);
    std::lock_guard lk(refresh_mu);
    refreshing = false;
    if (done) last_refresh = Clock::now();
    refresh_cv.notify_all();
    return done;
  }

  bool RefreshFrom(const std::vector<Node*>& avoid, Clock::time_point deadline) {
    std::vector<Node*> candidates;
    {
      std::shared_lock mk(map_mu);
      candidates = masters;
      candidates.insert(candidates.end(), replicas.begin(), replicas.end());
    }
    for (const Endpoint& s : seeds) candidates.push_back(GetNode(s));
    // Nodes that failed in the last seconds are asked last.
    const std::int64_t recent = (Clock::now() - std::chrono::seconds(5)).time_since_epoch().count();
    std::stable_partition(candidates.begin(), candidates.end(), [&](const Node* c) {
      const std::int64_t f = c->failed_at.load(std::memory_order_relaxed);
      return f == 0 || f < recent;
    });
    std::vector<Node*> tried;
    for (Node* c : candidates) {
      if (Clock::now() >= deadline) break;
      if (std::find(avoid.begin(), avoid.end(), c) != avoid.end()) continue;
      if (std::find(tried.begin(), tried.end(), c) != tried.end()) continue;
      tried.push_back(c);
      if (LoadFrom(c, deadline).ok()) return true;
    }
    return false;
  }

  void SetSlot(std::uint16_t slot, Node* node) {
    std::unique_lock lk(map_mu);
    slots[slot] = node;
    if (std::find(masters.begin(), masters.end(), node) == masters.end()) masters.push_back(node);
  }

  // ---- batches ----
  // `command key` for every key, answered by an integer: per key, whether
  // it was > 0 (EXISTS: there; DEL: removed; STRLEN: a non-empty string),
  // or why not.
  std::vector<Result<bool>> CountPerKey(std::string_view command, std::span<const std::string_view> keys);


  struct Outcome {
    Status status;
    ReplyPtr reply;
  };
  using AppendFn = std::function<void(Pipeline&, size_t index, bool asking)>;

  // Runs commands[i] (appended by `append`) for every key; returns each
  // one's reply (never an error reply) or why not.
  std::vector<Outcome> Execute(std::span<const std::string_view> keys, const AppendFn& append) {
    struct Item {
      size_t index;
      std::uint16_t slot;
      int attempts = 0;
      bool retried = false;   // retried once after its node failed
      Node* target = nullptr; // an ASK redirect: that node, with ASKING
    };
    std::vector<Outcome> out(keys.size());
    std::vector<Item> todo;
    todo.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) todo.push_back(Item{i, KeySlot(keys[i])});

    while (!todo.empty()) {
      // Group by node.
      std::vector<Pipeline> ps;
      std::vector<std::vector<Item>> items;
      std::vector<Item> next;
      {
        std::shared_lock lk(map_mu);
        for (Item& it : todo) {
          Node* node = it.target != nullptr ? it.target : slots[it.slot];
          if (node == nullptr) {
            out[it.index].status = Status(Code::kUnavailable, "redis: slot " + std::to_string(it.slot) + " has no node");
            continue;
          }
          size_t g = 0;
          while (g < ps.size() && ps[g].node != node) ++g;
          if (g == ps.size()) {
            ps.emplace_back().node = node;
            items.emplace_back();
          }
          items[g].push_back(it);
        }
      }
      // Append everything, then send and read all nodes at once.
      // Connections are leased in one global order (by node), so batches
      // that wait for a busy pool never wait for each other in a cycle.
      std::vector<size_t> order(ps.size());
      for (size_t g = 0; g < ps.size(); ++g) order[g] = g;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ps[a].node < ps[b].node; });
      const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(opt.command_timeout_ms);
      for (size_t g : order) {
        if (!Begin(ps[g], deadline)) continue;
        for (Item& it : items[g]) {
          append(ps[g], it.index, it.target != nullptr);
          ++it.attempts;
        }
        n.commands.fetch_add(items[g].size(), std::memory_order_relaxed);
      }
      Run(ps, deadline);
      Finish(ps);

      std::vector<Node*> failed;
      struct Lost {
        Item item;
        Pipeline::Fail why;
        Node* node;
        bool fresh;
      };
      std::vector<Lost> lost;  // unanswered items of failed nodes
      for (size_t g = 0; g < ps.size(); ++g) {
        Pipeline& p = ps[g];
        for (size_t k = 0; k < items[g].size(); ++k) {
          Item it = items[g][k];
          Outcome& o = out[it.index];
          if (p.fail == Pipeline::Fail::kAuth || p.fail == Pipeline::Fail::kBusy) {
            o.status = p.failure;
            continue;
          }
          if (k >= p.replies.size()) {
            lost.push_back(Lost{it, p.fail, p.node, p.lease.fresh});
            o.status = p.failure;
            continue;
          }
          ReplyPtr& r = p.replies[k];
          if (r->type != REDIS_REPLY_ERROR) {
            o.status = Status::Ok();
            o.reply = std::move(r);
            continue;
          }
          const std::string_view text = ReplyText(r.get());
          const bool moved = StartsWith(text, "MOVED "), ask = StartsWith(text, "ASK ");
          if (moved || ask) {
            (moved ? n.moved : n.ask).fetch_add(1, std::memory_order_relaxed);
            // "MOVED <slot> <host>:<port>"; an empty host is the replier's.
            const size_t sp = text.rfind(' ');
            auto ep = ParseAddress(text.substr(sp + 1));
            if (ep && ep->host.empty()) ep->host = p.node->ep.host;
            if (!ep) {
              o.status = Status(Code::kInternal, "redis: malformed redirect from " + p.node->addr + ": " + std::string(text));
              continue;
            }
            Node* to = GetNode(*ep);
            if (moved) {
              SetSlot(it.slot, to);
              refresh_wanted.store(true, std::memory_order_relaxed);
              it.target = nullptr;
            } else {
              it.target = to;
            }
            if (it.attempts < kMaxAttempts) {
              next.push_back(it);
            } else {
              o.status = Status(Code::kUnavailable, "redis: too many redirects for slot " + std::to_string(it.slot) +
                                                        " (last: " + std::string(text) + ")");
            }
            continue;
          }
          n.server_errors.fetch_add(1, std::memory_order_relaxed);
          Code code = Code::kInternal;
          if (StartsWith(text, "CLUSTERDOWN") || StartsWith(text, "TRYAGAIN") || StartsWith(text, "LOADING") ||
              StartsWith(text, "MASTERDOWN") || StartsWith(text, "READONLY")) {
            code = Code::kUnavailable;
            if (StartsWith(text, "READONLY")) refresh_wanted.store(true, std::memory_order_relaxed);
          } else if (StartsWith(text, "OOM") || StartsWith(text, "BUSY")) {
            code = Code::kBusy;
          } else if (StartsWith(text, "NOAUTH") || StartsWith(text, "NOPERM") || StartsWith(text, "WRONGPASS")) {
            code = Code::kInvalidArgument;
          }
          o.status = Status(code, "redis: " + p.node->addr + ": " + std::string(text));
        }
        if (p.fail == Pipeline::Fail::kIo || p.fail == Pipeline::Fail::kTimeout || p.fail == Pipeline::Fail::kConnect) {
          failed.push_back(p.node);
        }
      }
      if (!lost.empty()) {
        // A node failed: learn the map from another one, then retry a key
        // once where that helps: its slot has a new owner, or the lost
        // connection was an old pooled one (a fresh one may well work).
        Refresh(failed);
        std::shared_lock lk(map_mu);
        for (Lost& l : lost) {
          Item& it = l.item;
          const bool moved_away = slots[it.slot] != nullptr && slots[it.slot] != l.node;
          const bool stale_conn = l.why == Pipeline::Fail::kIo && !l.fresh;
          if (!it.retried && it.attempts < kMaxAttempts && (moved_away || stale_conn)) {
            it.retried = true;
            it.target = nullptr;
            next.push_back(it);
          }
        }
      }
      todo = std::move(next);
    }
    if (refresh_wanted.exchange(false, std::memory_order_relaxed) && !Refresh({})) {
      refresh_wanted.store(true, std::memory_order_relaxed);  // rate-limited: the next call does it
    }
    return out;
  }
};

std::vector<Result<bool>> Client::Impl::CountPerKey(std::string_view command, std::span<const std::string_view> keys) {
  auto outcomes = Execute(keys, [&](Pipeline& p, size_t i, bool asking) {
    const char* argv[] = {command.data(), Arg(keys[i].data())};
    const size_t lens[] = {command.size(), keys[i].size()};
    Append(p, 2, argv, lens, asking);
  });
  std::vector<Result<bool>> out;
  out.reserve(keys.size());
  for (auto& o : outcomes) {
    if (!o.status.ok()) {
      out.emplace_back(std::move(o.status));
    } else if (o.reply->type == REDIS_REPLY_INTEGER) {
      out.emplace_back(o.reply->integer > 0);
    } else {
      out.emplace_back(Status::Internal("redis: " + std::string(command) + ": unexpected reply type " +
                                        std::to_string(o.reply->type)));
    }
  }
  return out;
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const Options& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  if (options.seeds.empty()) return Status::InvalidArgument("redis: no seed node given");
  for (const std::string& s : options.seeds) {
    auto ep = ParseAddress(s);
    if (!ep || ep->host.empty()) return Status::InvalidArgument("redis: malformed seed '" + s + "' (want host:port)");
    impl->seeds.push_back(*ep);
  }
  std::string why;
  for (const Endpoint& s : impl->seeds) {
    Node* node = impl->GetNode(s);
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms + options.command_timeout_ms);
    Status st = impl->LoadFrom(node, deadline);
    if (st.ok()) {
      std::lock_guard lk(impl->refresh_mu);
      impl->last_refresh = Clock::now();
      return std::unique_ptr<Client>(new Client(std::move(impl)));
    }
    if (st.code() == Code::kInvalidArgument) return st;
    why += (why.empty() ? "" : "; ") + st.message();
  }
  return Status(Code::kUnavailable, "redis: no seed answered: " + why);
}

bool Client::cluster() const { return impl_->cluster.load(); }

std::vector<std::string> Client::masters() const {
  std::shared_lock lk(impl_->map_mu);
  std::vector<std::string> out;
  for (const Node* m : impl_->masters) {
    if (std::find(impl_->slots.begin(), impl_->slots.end(), m) != impl_->slots.end()) out.push_back(m->addr);
  }
  return out;
}

std::vector<Result<bool>> Client::Exists(std::span<const std::string_view> keys) {
  return impl_->CountPerKey("EXISTS", keys);
}

std::vector<Result<bool>> Client::HoldsString(std::span<const std::string_view> keys) {
  return impl_->CountPerKey("STRLEN", keys);
}

std::vector<Result<std::optional<Value>>> Client::Get(std::span<const std::string_view> keys) {
  auto outcomes = impl_->Execute(keys, [&](Pipeline& p, size_t i, bool asking) {
    const char* argv[] = {"GET", Arg(keys[i].data())};
    const size_t lens[] = {3, keys[i].size()};
    Impl::Append(p, 2, argv, lens, asking);
  });
  std::vector<Result<std::optional<Value>>> out;
  out.reserve(keys.size());
  for (auto& o : outcomes) {
    if (!o.status.ok()) {
      out.emplace_back(std::move(o.status));
    } else if (o.reply->type == REDIS_REPLY_NIL) {
      out.emplace_back(std::optional<Value>());
    } else if (o.reply->type == REDIS_REPLY_STRING) {
      Value v;
      v.data = reinterpret_cast<const std::uint8_t*>(o.reply->str);
      v.size = o.reply->len;
      v.owner = std::shared_ptr<const void>(o.reply.release(),
                                            [](const void* r) { freeReplyObject(const_cast<void*>(r)); });
      out.emplace_back(std::optional<Value>(std::move(v)));
    } else {
      out.emplace_back(Status::Internal("redis: GET: unexpected reply type " + std::to_string(o.reply->type)));
    }
  }
  return out;
}

std::vector<Status> Client::Set(std::span<const KeyValue> items, std::uint64_t ttl_ms) {
  std::vector<std::string_view> keys;
  keys.reserve(items.size());
  for (const KeyValue& kv : items) keys.push_back(kv.key);
  const std::string ttl = std::to_string(ttl_ms);
  auto outcomes = impl_->Execute(keys, [&](Pipeline& p, size_t i, bool asking) {
    const KeyValue& kv = items[i];
    const char* argv[] = {"SET", Arg(kv.key.data()), Arg(kv.value.data()), "PX", ttl.data()};
    const size_t lens[] = {3, kv.key.size(), kv.value.size(), 2, ttl.size()};
    Impl::Append(p, ttl_ms > 0 ? 5 : 3, argv, lens, asking);
  });
  std::vector<Status> out;
  out.reserve(items.size());
  for (auto& o : outcomes) {
    if (!o.status.ok()) {
      out.push_back(std::move(o.status));
    } else if (o.reply->type == REDIS_REPLY_STATUS) {
      out.push_back(Status::Ok());
    } else {
      out.push_back(Status::Internal("redis: SET: unexpected reply type " + std::to_string(o.reply->type)));
    }
  }
  return out;
}

std::vector<Result<bool>> Client::Del(std::span<const std::string_view> keys) {
  return impl_->CountPerKey("DEL", keys);
}

Counters Client::counters() const {
  const auto& c = impl_->n;
  Counters out;
  out.commands = c.commands.load(std::memory_order_relaxed);
  out.moved = c.moved.load(std::memory_order_relaxed);
  out.ask = c.ask.load(std::memory_order_relaxed);
  out.slot_map_refreshes = c.slot_map_refreshes.load(std::memory_order_relaxed);
  out.connects = c.connects.load(std::memory_order_relaxed);
  out.connect_failures = c.connect_failures.load(std::memory_order_relaxed);
  out.timeouts = c.timeouts.load(std::memory_order_relaxed);
  out.io_errors = c.io_errors.load(std::memory_order_relaxed);
  out.server_errors = c.server_errors.load(std::memory_order_relaxed);
  return out;
}

}  // namespace kdn::redis
