// SPDX-License-Identifier: Apache-2.0
// KvEventPublisher: vLLM-format KV events over ZeroMQ PUB (the wire format is
// described in kv_events.h). Callers queue events under a mutex; one thread
// owns the socket, encodes batches with msgpack-cxx and sends them.
// Thread-safety: see kv_events.h.
#include "server/kv_events.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <string_view>
#include <utility>

#include <msgpack.hpp>
#include <zmq.h>

namespace kdn::server {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

// How long the destructor lets ZeroMQ deliver what it still holds: long
// enough for a local subscriber to take the last batches, short enough that
// a dead subscriber cannot hold up kdnd's shutdown.
constexpr int kLingerMs = 250;

void PackStr(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<std::uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

// vLLM's int form of a block hash: int.from_bytes(digest, "big") & (2**64-1),
// i.e. the last eight bytes read big-endian.
std::uint64_t Low64(const std::vector<std::uint8_t>& h) {
  std::uint64_t v = 0;
  const std::size_t from = h.size() > 8 ? h.size() - 8 : 0;
  for (std::size_t i = from; i < h.size(); ++i) v = (v << 8) | h[i];
  return v;
}

void PackHash(Packer& pk, const std::vector<std::uint8_t>& h, KvBlockHashForm form) {
  if (form == KvBlockHashForm::kUint64) {
    pk.pack_uint64(Low64(h));
    return;
  }
  pk.pack_bin(static_cast<std::uint32_t>(h.size()));
  pk.pack_bin_body(reinterpret_cast<const char*>(h.data()), static_cast<std::uint32_t>(h.size()));
}

void PackHashes(Packer& pk, const std::vector<std::vector<std::uint8_t>>& hs, KvBlockHashForm form) {
  pk.pack_array(static_cast<std::uint32_t>(hs.size()));
  for (const auto& h : hs) PackHash(pk, h, form);
}

double SystemNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(std::string endpoint, std::string topic) {
  return Create(std::move(endpoint), std::move(topic), KvEventOptions{});
}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(std::string endpoint, std::string topic,
                                                                   KvEventOptions options) {
  if (endpoint.empty()) return Status::InvalidArgument("kv events: empty endpoint");
  options.max_pending = std::max<std::size_t>(options.max_pending, 1);
  options.batch_events = std::max<std::size_t>(options.batch_events, 1);
  if (options.batch_interval <= std::chrono::milliseconds::zero()) options.batch_interval = std::chrono::milliseconds(1);

  void* ctx = zmq_ctx_new();
  if (ctx == nullptr) return Status::Internal(std::string("kv events: zmq_ctx_new: ") + zmq_strerror(errno));
  void* sock = zmq_socket(ctx, ZMQ_PUB);
  if (sock == nullptr) {
    const int err = errno;
    zmq_ctx_term(ctx);
    return Status::Internal(std::string("kv events: zmq_socket: ") + zmq_strerror(err));
  }
  const int linger = kLingerMs;
  const int hwm = options.send_hwm;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
  zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
  // With authorize: the ZAP handler's socket first (ZeroMQ asks it at each
  // handshake of a PLAIN server socket), then the PUB socket as a PLAIN server.
  void* zap = nullptr;
  const int no_linger = 0;
  if (options.authorize) {
    zap = zmq_socket(ctx, ZMQ_REP);
    const int on = 1;
    const std::string domain = "kdnd-kv-events";
    if (zap == nullptr || zmq_setsockopt(zap, ZMQ_LINGER, &no_linger, sizeof no_linger) != 0 ||
        zmq_bind(zap, "inproc://zeromq.zap.01") != 0 || zmq_setsockopt(sock, ZMQ_PLAIN_SERVER, &on, sizeof on) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain.data(), domain.size()) != 0) {
      const int err = errno;
      if (zap != nullptr) zmq_close(zap);
      zmq_setsockopt(sock, ZMQ_LINGER, &no_linger, sizeof no_linger);
      zmq_close(sock);
      zmq_ctx_term(ctx);
      return Status::Internal(std::string("kv events: the subscribers' authentication (ZAP): ") + zmq_strerror(err));
    }
  }
  if (zmq_bind(sock, endpoint.c_str()) != 0) {
    const int err = errno;
    zmq_setsockopt(sock, ZMQ_LINGER, &no_linger, sizeof no_linger);
    zmq_close(sock);
    if (zap != nullptr) zmq_close(zap);
    zmq_ctx_term(ctx);
    const std::string msg = "kv events: bind " + endpoint + ": " + zmq_strerror(err);
    // A malformed endpoint is the caller's to fix; an address in use or not
    // ours may free up.
    const bool bad = err == EINVAL || err == EPROTONOSUPPORT || err == ENOCOMPATPROTO;
    return Status(bad ? Code::kInvalidArgument : Code::kUnavailable, msg);
  }
  std::array<char, 1024> last{};
  std::size_t last_len = last.size();
  std::string bound = endpoint;
  if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, last.data(), &last_len) == 0 && last_len > 1) bound = last.data();
  return std::unique_ptr<KvEventPublisher>(
      new KvEventPublisher(ctx, sock, zap, std::move(bound), std::move(topic), std::move(options)));
}

KvEventPublisher::KvEventPublisher(void* ctx, void* socket, void* zap, std::string endpoint, std::string topic,
                                   KvEventOptions options)
    : ctx_(ctx),
      socket_(socket),
      zap_(zap),
      bound_endpoint_(std::move(endpoint)),
      topic_(std::move(topic)),
      options_(std::move(options)) {
  // The sockets were made on the caller's thread; thread creation is the full
  // memory barrier ZeroMQ asks for before a socket moves to another thread.
  if (zap_ != nullptr) zap_thread_ = std::thread([this] { Authenticate(); });
  thread_ = std::thread([this] { Run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  zmq_close(socket_);
  if (zap_thread_.joinable()) {
    zap_stop_ = true;
    zap_thread_.join();
    zmq_close(zap_);
  }
  zmq_ctx_term(ctx_);
}

void KvEventPublisher::Authenticate() {
  // RFC 27: a request is version "1.0", request id, domain, address,
  // routing id, mechanism, then the mechanism's credentials (PLAIN: user
  // name, password); the reply is version, request id, status code ("200"
  // in, "400" refused), status text, user id, metadata.
  while (!zap_stop_.load()) {
    zmq_pollitem_t item{zap_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 100) <= 0 || (item.revents & ZMQ_POLLIN) == 0) continue;
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, zap_, 0) < 0) {
        zmq_msg_close(&m);
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
      if (!more) break;
    }
    const bool well_formed = frames.size() >= 6 && frames[0] == "1.0";
    const bool in = well_formed && frames[5] == "PLAIN" && frames.size() == 8 && options_.authorize(frames[7]);
    {
      std::lock_guard<std::mutex> l(mu_);
      ++(in ? stats_.subscribers_accepted : stats_.subscribers_refused);
    }
    const std::string reply[6] = {"1.0", frames.size() > 1 ? frames[1] : std::string(), in ? "200" : "400",
                                  in ? "OK" : "refused: log in with ZeroMQ PLAIN, a token this publisher accepts as the password",
                                  "", ""};
    for (int i = 0; i < 6; ++i) zmq_send(zap_, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
  }
}

void KvEventPublisher::BlockStored(std::vector<std::vector<std::uint8_t>> block_hashes,
                                   std::optional<std::vector<std::uint8_t>> parent, std::vector<std::int32_t> token_ids,
                                   std::uint32_t block_size, std::string medium) {
  Enqueue(Event{Kind::kStored, std::move(block_hashes), std::move(parent), std::move(token_ids), block_size,
                std::move(medium)});
}

void KvEventPublisher::BlockRemoved(std::vector<std::vector<std::uint8_t>> hashes, std::string medium) {
  Enqueue(Event{Kind::kRemoved, std::move(hashes), std::nullopt, {}, 0, std::move(medium)});
}

void KvEventPublisher::AllBlocksCleared() { Enqueue(Event{Kind::kCleared, {}, std::nullopt, {}, 0, {}}); }

void KvEventPublisher::Enqueue(Event e) {
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (pending_.size() >= options_.max_pending) {
      // Dropping the oldest keeps the newest state, which is what a router
      // acts on; the count tells an operator the router's view has holes.
      pending_.pop_front();
      ++finished_;
      ++stats_.events_dropped;
    }
    pending_.push_back(std::move(e));
    ++enqueued_;
    ++stats_.events_queued;
    wake = pending_.size() >= options_.batch_events;
  }
  if (wake) wake_.notify_one();
}

void KvEventPublisher::Flush() {
  std::unique_lock<std::mutex> l(mu_);
  const std::uint64_t target = enqueued_;
  if (finished_ >= target) return;
  ++flush_waiters_;
  wake_.notify_one();
  done_.wait(l, [&] { return finished_ >= target; });
  --flush_waiters_;
}

KvEventPublisher::Stats KvEventPublisher::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

void KvEventPublisher::Run() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    // Wake for a full batch, a flush or a stop; otherwise send what there is
    // once the interval has passed.
    wake_.wait_for(l, options_.batch_interval, [&] {
      return stop_ || pending_.size() >= options_.batch_events || (flush_waiters_ > 0 && !pending_.empty());
    });
    if (pending_.empty()) {
      if (stop_) return;
      continue;
    }
    const std::size_t n = std::min(pending_.size(), options_.batch_events);
    std::vector<Event> batch;
    batch.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      batch.push_back(std::move(pending_.front()));
      pending_.pop_front();
    }
    l.unlock();
    const double ts = options_.now ? options_.now() : SystemNow();
    const bool sent = Send(Encode(batch, ts));
    l.lock();
    finished_ += n;
    if (sent) {
      ++stats_.batches_sent;
    } else {
      ++stats_.send_errors;
    }
    done_.notify_all();
  }
}

std::string KvEventPublisher::Encode(const std::vector<Event>& events, double ts) const {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  const bool map = options_.encoding == KvEventEncoding::kTaggedMap;
  const KvBlockHashForm form = options_.hash_form;

  pk.pack_array(3);  // EventBatch: [ts, events, data_parallel_rank]
  pk.pack_double(ts);
  pk.pack_array(static_cast<std::uint32_t>(events.size()));
  const bool group = options_.group_idx.has_value();
  for (const Event& e : events) {
    const std::string& medium = e.medium.empty() ? options_.medium : e.medium;
    switch (e.kind) {
      case Kind::kStored:
        // Fields in vLLM's declaration order; the tag first. group_idx
        // follows extra_keys: a map leaves extra_keys out (its default, as
        // msgspec's omit_defaults does), an array holds its place with nil.
        if (map) {
          pk.pack_map(group ? 9 : 8);
          PackStr(pk, "type");
        } else {
          pk.pack_array(group ? 10 : 8);
        }
        PackStr(pk, "BlockStored");
        if (map) PackStr(pk, "block_hashes");
        PackHashes(pk, e.hashes, form);
        if (map) PackStr(pk, "parent_block_hash");
        if (e.parent) {
          PackHash(pk, *e.parent, form);
        } else {
          pk.pack_nil();
        }
        if (map) PackStr(pk, "token_ids");
        pk.pack_array(static_cast<std::uint32_t>(e.token_ids.size()));
        for (std::int32_t t : e.token_ids) pk.pack_int32(t);
        if (map) PackStr(pk, "block_size");
        pk.pack_uint32(e.block_size);
        if (map) PackStr(pk, "lora_id");
        pk.pack_nil();
        if (map) PackStr(pk, "medium");
        PackStr(pk, medium);
        if (map) PackStr(pk, "lora_name");
        pk.pack_nil();
        if (group) {
          if (map) {
            PackStr(pk, "group_idx");
          } else {
            pk.pack_nil();  // extra_keys
          }
          pk.pack_int64(*options_.group_idx);
        }
        break;
      case Kind::kRemoved:
        if (map) {
          pk.pack_map(group ? 4 : 3);
          PackStr(pk, "type");
        } else {
          pk.pack_array(group ? 4 : 3);
        }
        PackStr(pk, "BlockRemoved");
        if (map) PackStr(pk, "block_hashes");
        PackHashes(pk, e.hashes, form);
        if (map) PackStr(pk, "medium");
        PackStr(pk, medium);
        if (group) {
          if (map) PackStr(pk, "group_idx");
          pk.pack_int64(*options_.group_idx);
        }
        break;
      case Kind::kCleared:
        if (map) {
          pk.pack_map(1);
          PackStr(pk, "type");
        } else {
          pk.pack_array(1);
        }
        PackStr(pk, "AllBlocksCleared");
        break;
    }
  }
  pk.pack_int64(options_.data_parallel_rank);
  return std::string(buf.data(), buf.size());
}

bool KvEventPublisher::Send(const std::string& payload) {
  std::array<std::uint8_t, 8> seq{};
  const std::uint64_t s = next_seq_++;
  for (int i = 0; i < 8; ++i) seq[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(s >> (56 - 8 * i));
  // A PUB socket never blocks: past the high-water mark it drops the whole
  // message for that subscriber. ZMQ_DONTWAIT keeps it so whatever happens.
  if (zmq_send(socket_, topic_.data(), topic_.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return false;
  if (zmq_send(socket_, seq.data(), seq.size(), ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) return false;
  return zmq_send(socket_, payload.data(), payload.size(), ZMQ_DONTWAIT) >= 0;
}

}  // namespace kdn::server
