// SPDX-License-Identifier: Apache-2.0
// What the tests that play a misbehaving peer share: loopback TCP sockets
// made by hand (a listener that never accepts, a raw client), whether the
// other end closed one, and a process's resident memory.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#include "core/util/loopback.h"

namespace kdn::testing {

// A listener that never accepts: kdn::ListenLoopback (core/util/loopback.h).
using kdn::ListenLoopback;

// A TCP connection to "ipv4:port"; -1 when refused.
inline int ConnectTcp(const std::string& address) {
  const auto colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(colon + 1))));
  ::inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Whether the peer closed `fd` within `ms` (reads what it sends meanwhile).
inline bool ClosedWithin(int fd, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
  }
  return false;
}

// A process's resident memory now (VmRSS; 0: this one), in bytes; 0 when
// unknown.
inline std::uint64_t RssBytes(pid_t pid = 0) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status") : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace kdn::testing
