// SPDX-License-Identifier: Apache-2.0
// A TCP socket listening on 127.0.0.1, for the benchmarks' links and the
// tests' misbehaving peers (a listener that never accepts: the kernel still
// completes connections into its backlog).
// Thread-safety: a plain function.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace kdn {

// Listening at a port the kernel picks (*port); -1 on failure.
inline int ListenLoopback(std::uint16_t* port, int backlog = 16) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

}  // namespace kdn
