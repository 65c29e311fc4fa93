// SPDX-License-Identifier: Apache-2.0
// The tiers' delivery limits (server/tier_limits.h): a timed memcpy for
// memory, a timed cold read of a file the measurement writes for a disk.
#include "server/tier_limits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace kdn::server {
namespace {

using Steady = std::chrono::steady_clock;

// A host tier hands out chunks of a few MiB; a copy of that size is what a
// hit costs, and 5 of them take a few ms.
constexpr size_t kHostBytes = size_t{8} << 20;
constexpr int kHostCopies = 5;
// Large enough that the disk's own latency does not dominate, small enough
// that writing and syncing it stays well under a second on a slow disk.
constexpr size_t kDiskBytes = size_t{16} << 20;
// The tier reads an object in requests of about this size (its segments).
constexpr size_t kDiskRequestBytes = size_t{4} << 20;
constexpr int kDiskReads = 3;
// No further read starts after this long in reads: on a slow disk one is
// all the start can afford.
constexpr auto kDiskReadBudget = std::chrono::milliseconds(300);

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Keeps the compiler from moving or dropping the memory accesses before it
// (the clock read that follows must see the copy finished).
inline void Barrier(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

Result<double> MeasureHost() {
  std::vector<std::uint8_t> src(kHostBytes), dst(kHostBytes);
  // Both touched first: a fresh page's first write costs a fault, which a
  // hit on a filled tier never pays.
  std::memset(src.data(), 0x5a, src.size());
  std::memset(dst.data(), 0xa5, dst.size());
  std::vector<double> rates;
  for (int i = 0; i < kHostCopies; ++i) {
    src[static_cast<size_t>(i) * 4096] = static_cast<std::uint8_t>(i);  // each copy moves other bytes
    Barrier(src.data());
    const auto t0 = Steady::now();
    std::memcpy(dst.data(), src.data(), src.size());
    Barrier(dst.data());
    const double s = Seconds(Steady::now() - t0);
    if (s > 0) rates.push_back(static_cast<double>(kHostBytes) / s);
  }
  if (rates.empty()) return Status::Internal("host tier: the clock did not advance over an 8 MiB copy");
  return Median(std::move(rates));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status IoError(const char* what, const std::string& path, int err) {
  return Status(err == ENOSPC ? Code::kBusy : Code::kUnavailable,
                std::string("disk tier limit: ") + what + " " + path + ": " + std::strerror(err));
}

// Bytes that no filesystem can compress: a compressing one (btrfs, zfs)
// would otherwise read back far fewer bytes than it reports.
void FillIncompressible(std::vector<std::uint8_t>& data) {
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data.data() + i, &x, 8);
  }
}

Result<double> MeasureDisk(const std::string& directory) {
  const std::string tmp = directory + "/tmp";
  // tmp/ is reached without following a link, as the tier reaches it: a
  // link there would put the file (and its removal) somewhere else.
  Fd dir{::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)};
  if (dir.fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return Status::NotFound("disk tier limit: " + tmp + " does not exist (not a directory a disk tier has opened)");
    }
    return IoError("open directory", tmp, err);
  }
  // A name the tier's Open takes for a write a crash interrupted and
  // removes ("<pid>-<n>.tmp"), so a kdnd killed mid-measurement leaves
  // nothing behind either; n (ns since the epoch) is far beyond the
  // tier's own sequence numbers, and O_EXCL refuses any file already there.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch());
  const std::string name = std::to_string(::getpid()) + "-" + std::to_string(ns.count()) + ".tmp";
  const std::string path = tmp + "/" + name;
  Fd file{::openat(dir.fd, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)};
  if (file.fd < 0) return IoError("create", path, errno);
  // From here on the file exists: removed on every way out (before dir
  // and file close, which are declared earlier).
  struct Remove {
    int dir;
    const std::string& name;
    ~Remove() { ::unlinkat(dir, name.c_str(), 0); }
  } remove{dir.fd, name};

  std::vector<std::uint8_t> data(kDiskBytes);
  FillIncompressible(data);
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(file.fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("write", path, errno);
    if (n == 0) return IoError("write", path, EIO);
    done += static_cast<size_t>(n);
  }
  // Synced: the page cache drops clean pages only.
  if (::fdatasync(file.fd) != 0) return IoError("fdatasync", path, errno);

  std::vector<double> rates;
  const auto reads_started = Steady::now();
  for (int i = 0; i < kDiskReads; ++i) {
    if (i > 0 && Steady::now() - reads_started > kDiskReadBudget) break;
    // Each read starts cold: what the last one brought in is dropped.
    if (const int err = ::posix_fadvise(file.fd, 0, 0, POSIX_FADV_DONTNEED); err != 0) {
      return IoError("posix_fadvise(DONTNEED)", path, err);
    }
    if (::lseek(file.fd, 0, SEEK_SET) != 0) return IoError("lseek", path, errno);
    const auto t0 = Steady::now();
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = ::read(file.fd, data.data() + done, std::min(kDiskRequestBytes, data.size() - done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError("read", path, errno);
      if (n == 0) {
        return Status(Code::kUnavailable, "disk tier limit: " + path + " ended after " + std::to_string(done) +
                                              " of its " + std::to_string(data.size()) + " bytes");
      }
      done += static_cast<size_t>(n);
    }
    const double s = Seconds(Steady::now() - t0);
    if (s > 0) rates.push_back(static_cast<double>(data.size()) / s);
  }
  if (rates.empty()) return Status::Internal("disk tier limit: the clock did not advance over a 16 MiB read");
  return Median(std::move(rates));
}

}  // namespace

Result<double> MeasureTierLimit(store::TierSpec::Kind kind, const std::string& directory) {
  switch (kind) {
    case store::TierSpec::Kind::kHost: return MeasureHost();
    case store::TierSpec::Kind::kDisk:
      if (directory.empty()) return Status::InvalidArgument("disk tier limit: no directory");
      return MeasureDisk(directory);
    case store::TierSpec::Kind::kDevice:
    case store::TierSpec::Kind::kRemote:
    case store::TierSpec::Kind::kRedis: break;
  }
  return 0.0;
}

std::vector<double> MeasureTierLimits(const std::vector<store::TierSpec>& specs, const std::vector<std::string>& names) {
  std::vector<double> limits(specs.size(), 0.0);
  for (size_t i = 0; i < specs.size(); ++i) {
    const store::TierSpec& spec = specs[i];
    const std::string label = "tier " + std::to_string(i) + " (" + (i < names.size() ? names[i] : std::string("?")) +
                              (spec.kind == store::TierSpec::Kind::kDisk ? ", " + spec.path : std::string()) + ")";
    const auto t0 = Steady::now();
    Result<double> rate = MeasureTierLimit(spec.kind, spec.path);
    const double ms = Seconds(Steady::now() - t0) * 1e3;
    if (!rate.ok()) {
      std::fprintf(stderr, "kdnd: %s: read rate not measured: %s\n", label.c_str(), rate.status().message().c_str());
      continue;
    }
    if (*rate <= 0) continue;  // a kind not measured: nothing to say
    limits[i] = *rate;
    std::fprintf(stderr, "kdnd: %s: measured read rate %.1f MiB/s (%s; took %.0f ms)\n", label.c_str(),
                 *rate / (1024.0 * 1024.0),
                 spec.kind == store::TierSpec::Kind::kDisk ? "16 MiB read cold, after fsync and a page-cache drop"
                                                           : "8 MiB memcpy, median of 5",
                 ms);
  }
  return limits;
}

}  // namespace kdn::server
