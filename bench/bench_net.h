// SPDX-License-Identifier: Apache-2.0
// The bench's network pieces: loopback sockets, a shaping proxy (a link of a
// set rate, which may change at a set time) and a kdnd on a thread of this
// process. `kdn bench remote` and `kdn bench adaptive` use them.
// Thread-safety: as each class says.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/util/loopback.h"
#include "server/server.h"
#include "core/util/status.h"

namespace kdn::bench {

inline constexpr const char* kNodeToken = "kdn-bench-remote-token-0001";

// ---------------------------------------------------------------- sockets

inline void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

inline int ConnectLoopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  NoDelay(fd);
  return fd;
}

// MSG_NOSIGNAL: a peer gone is an error here, not a SIGPIPE.
inline bool SendAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

inline bool RecvAll(int fd, void* data, size_t n) {
  auto* p = static_cast<std::uint8_t*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// ---------------------------------------------------------------- proxy

// A bandwidth-limited link in the bench (never in kdnd): a TCP proxy on
// loopback that forwards each accepted connection to `target_port`, client
// to server as fast as it comes, server to client paced to `bits_per_second`
// by a token bucket that holds at most burst_bytes(): 250 us at the rate (at
// least 16 KiB), enough to absorb a sleep's overshoot without lowering the
// mean rate, and little enough that bytes arriving after an idle moment get
// at most 250 us ahead of a real link (a request's first bytes would
// otherwise ride a large bucket filled while idle). Two threads per
// connection, one per direction. The rate may change (SetRate, Schedule):
// the bucket keeps the size the first rate gave it.
class ShapingProxy {
 public:
  ShapingProxy(std::uint16_t target_port, double bits_per_second)
      : target_(target_port),
        burst_(std::max<size_t>(16 << 10, static_cast<size_t>(bits_per_second / 8.0 * 250e-6))) {
    SetRate(bits_per_second);
    listen_fd_ = ListenLoopback(&port_);
    if (listen_fd_ >= 0) accept_ = std::thread([this] { Accept(); });
  }
  ~ShapingProxy() {
    if (listen_fd_ < 0) return;
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (std::thread& t : pipes_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_fd_);
  }
  bool ok() const { return listen_fd_ >= 0; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::uint16_t port() const { return port_; }
  size_t burst_bytes() const { return burst_; }
  // From now on, this rate.
  void SetRate(double bits_per_second) { Schedule(bits_per_second, 0, bits_per_second); }
  // `before` until `at_ns` (steady clock), `after` from then on (a link that
  // drops, or recovers, mid-request).
  void Schedule(double before_bits_per_second, std::int64_t at_ns, double after_bits_per_second) {
    before_.store(before_bits_per_second / 8.0);
    after_.store(after_bits_per_second / 8.0);
    switch_ns_.store(at_ns);
  }
  // Bytes per second now.
  double rate() const {
    const std::int64_t now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return now < switch_ns_.load() ? before_.load() : after_.load();
  }

 private:
  void Accept() {
    for (;;) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      NoDelay(client);
      const int server = ConnectLoopback(target_);
      if (server < 0) {
        ::close(client);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(client);
      fds_.push_back(server);
      pipes_.emplace_back([=, this] { Forward(client, server, false); });
      pipes_.emplace_back([=, this] { Forward(server, client, true); });
    }
  }
  // Copies `from` to `to` until either side closes; paced at rate() when `paced`.
  void Forward(int from, int to, bool paced) const {
    std::vector<std::uint8_t> buf(std::max<size_t>(burst_, 256 << 10));
    double tokens = static_cast<double>(burst_);
    auto last = std::chrono::steady_clock::now();
    for (;;) {
      const ssize_t n = ::recv(from, buf.data(), paced ? burst_ : buf.size(), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      bool ok = true;
      for (size_t off = 0; ok && off < static_cast<size_t>(n);) {
        size_t piece = static_cast<size_t>(n) - off;
        if (paced) {
          const double rate = this->rate();
          const auto now = std::chrono::steady_clock::now();
          tokens = std::min(static_cast<double>(burst_),
                            tokens + std::chrono::duration<double>(now - last).count() * rate);
          last = now;
          // Send what the bucket holds, but not in slivers: wait for an
          // eighth of the bucket (at least 4 KiB, or the rest) to accrue.
          const size_t least = std::min<size_t>(piece, std::max<size_t>(4096, burst_ / 8));
          if (tokens < static_cast<double>(least)) {
            std::this_thread::sleep_for(std::chrono::duration<double>((static_cast<double>(least) - tokens) / rate));
            continue;
          }
          piece = std::min(piece, static_cast<size_t>(tokens));
          tokens -= static_cast<double>(piece);
        }
        ok = SendAll(to, buf.data() + off, piece);
        off += piece;
      }
      if (!ok) break;
    }
    ::shutdown(to, SHUT_WR);
  }

  const std::uint16_t target_;
  std::atomic<double> before_{0}, after_{0};  // bytes per second
  std::atomic<std::int64_t> switch_ns_{0};
  const size_t burst_;
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> pipes_;
};

// ---------------------------------------------------------------- node

// A kdnd on a thread of this process: one host tier, one token for every
// namespace, RPC on an OS-chosen loopback port, no metrics or events.
class Node {
 public:
  Status Start() {
    server::ServerConfig c;
    c.listen = {"127.0.0.1:0"};
    store::TierSpec host;
    host.capacity_bytes = std::uint64_t{3} << 30;
    c.tiers = {host};
    c.tokens = {{"bench", kNodeToken, {"*"}, false}};
    auto s = server::Server::Create(c);
    if (!s.ok()) return s.status();
    server_ = std::move(s).value();
    thread_ = std::thread([this] { status_ = server_->Run(nullptr, false); });
    const server::BoundAddresses b = server_->WaitReady();
    if (b.rpc.empty()) {  // Run failed before it bound: it has returned, saying why
      thread_.join();
      return status_.ok() ? Status::Internal("kdnd bound no address") : status_;
    }
    address_ = b.rpc.front();
    port_ = static_cast<std::uint16_t>(std::stoi(address_.substr(address_.rfind(':') + 1)));
    return Status::Ok();
  }
  ~Node() {
    if (!thread_.joinable()) return;
    server_->Shutdown();
    thread_.join();
  }
  const std::string& address() const { return address_; }
  std::uint16_t port() const { return port_; }

 private:
  std::unique_ptr<server::Server> server_;
  std::thread thread_;
  Status status_;
  std::string address_;
  std::uint16_t port_ = 0;
};

}  // namespace kdn::bench
