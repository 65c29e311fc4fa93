// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>
#include <utility>

#include <xxhash.h>

#include "core/wire/envelope.h"

namespace kdn::store {
namespace {

namespace fs = std::filesystem;

// O_DIRECT wants the buffer, the file offset and the length aligned to the
// device's logical block size; 4 KiB covers every common device.
constexpr size_t kDirectAlignment = 4096;
// A large object is written and read in segments of this size (WriteObject, ReadWhole).
constexpr size_t kWriteSegment = size_t{2} << 20;
constexpr size_t kReadSegment = kWriteSegment;
constexpr std::string_view kObjectSuffix = ".kdn";
constexpr std::string_view kTempSuffix = ".tmp";
// How object files are opened for reading: never waiting (a FIFO in an
// object's place would wait for a writer forever), never following a link,
// never becoming a controlling terminal.
constexpr int kObjectReadFlags = O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC;

std::int64_t NowNs() {
  // Wall-clock time, so that it orders with the mtimes a restart reads.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string ErrnoText(int err) { return std::error_code(err, std::generic_category()).message(); }

// What a failed system call means to the caller: a full disk is worth a
// retry after evicting; anything else means the device is not usable.
// `err` is read before any argument that allocates: callers pass errno
// itself or a saved copy, and `op` and `path` are never temporaries.
Status IoStatus(std::string_view op, const std::string& path, int err) {
  const std::string message = "disk tier: " + std::string(op) + " " + path + ": " + ErrnoText(err);
  if (err == ENOSPC || err == EDQUOT) return Status(Code::kBusy, message);
  if (err == ENOENT) return Status::NotFound(message);
  return Status(Code::kUnavailable, message);
}

// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { CloseQuietly(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  void Reset(int fd) {
    CloseQuietly();
    fd_ = fd;
  }
  // Closes now, reporting the error close() reports (a deferred write error).
  int Close() {
    const int rc = fd_ >= 0 ? ::close(fd_) : 0;
    fd_ = -1;
    return rc;
  }

 private:
  void CloseQuietly() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd_;
};

// Pages mapped for I/O buffers, unmapped when released.
struct Unmapper {
  size_t bytes = 0;
  void operator()(std::uint8_t* p) const { ::munmap(p, bytes); }
};
using AlignedBytes = std::unique_ptr<std::uint8_t, Unmapper>;

// An aligned buffer of `capacity` bytes (a multiple of kDirectAlignment).
struct IoBuffer {
  AlignedBytes data;
  size_t capacity = 0;
};

// Mapped and populated in one call (MAP_POPULATE): a first touch page by
// page costs a fault each, 8192 for a 32 MiB buffer, a third more than
// populating them at once. Huge pages would fault less still, but may stall
// on compaction (seen here: 0.2 s for 32 MiB).
IoBuffer AllocateIoBuffer(size_t n) {
  const size_t capacity = (std::max<size_t>(n, 1) + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  void* m = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (m == MAP_FAILED) return {};
  return IoBuffer{AlignedBytes(static_cast<std::uint8_t*>(m), Unmapper{capacity}), capacity};
}

}  // namespace

// The aligned buffers writes are built in and reads land in, kept for the
// next object: a buffer fresh from the allocator costs a page fault per page
// on first touch and an munmap on release (at 32 MiB, more than the copy of
// the payload). Shared with the chunks Get returns (their payload stays in
// the read buffer, which comes back here when the chunk dies), so it
// outlives the tier. At most `limit` bytes are kept idle.
class DiskTier::BufferPool {
 public:
  explicit BufferPool(std::uint64_t limit) : limit_(limit) {}

  // A buffer of at least `n` bytes: the smallest idle one that fits, or a
  // new one. Empty data when memory is short.
  IoBuffer Take(size_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->capacity >= n && (best == idle_.end() || it->capacity < best->capacity)) best = it;
      }
      if (best != idle_.end()) {
        IoBuffer b = std::move(*best);
        idle_.erase(best);
        idle_bytes_ -= b.capacity;
        return b;
      }
    }
    return AllocateIoBuffer(n);
  }

  // Keeps `b` for reuse if it fits under the limit, making room by freeing
  // smaller idle buffers (the larger one serves more sizes); frees it otherwise.
  // Never throws (a chunk's deleter calls it): a buffer it cannot keep is freed.
  void Give(IoBuffer b) noexcept {
    if (!b.data || b.capacity > limit_) return;
    std::lock_guard<std::mutex> lock(mu_);
    std::sort(idle_.begin(), idle_.end(), [](const IoBuffer& x, const IoBuffer& y) { return x.capacity < y.capacity; });
    while (idle_bytes_ + b.capacity > limit_ && !idle_.empty() && idle_.front().capacity <= b.capacity) {
      idle_bytes_ -= idle_.front().capacity;
      idle_.erase(idle_.begin());
    }
    if (idle_bytes_ + b.capacity > limit_) return;
    try {
      idle_.push_back(std::move(b));  // leaves b whole if it throws
      idle_bytes_ += idle_.back().capacity;
    } catch (const std::bad_alloc&) {
    }
  }

  std::uint64_t idle_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return idle_bytes_;
  }

 private:
  const std::uint64_t limit_;
  mutable std::mutex mu_;
  std::vector<IoBuffer> idle_;     // guarded by mu_
  std::uint64_t idle_bytes_ = 0;   // guarded by mu_
};

namespace {

int DefaultOpen(const std::string& path, int flags) { return ::open(path.c_str(), flags); }

Status WriteAll(int fd, const std::string& path, const std::uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoStatus("write", path, errno);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Reads or writes of one file handed to the kernel without waiting for
// them (Linux native AIO: with O_DIRECT, io_submit queues them on the
// device and returns), so that the caller copies or checks one part of an
// object while another is on its way. A request the kernel does not take
// is done synchronously instead. The buffers must stay put until Finish()
// (the destructor waits too). Its AIO context (for kMaxInFlight requests)
// is borrowed from the tier, which keeps idle ones: setting one up per
// object costs its io_destroy, which waits for an RCU grace period (25 ms
// here, as long as the write of a 32 MiB object).
class AsyncIo {
 public:
  static constexpr unsigned kMaxInFlight = 16;
  // Gives a context back when done: reusable unless requests may be left in it.
  using Release = std::function<void(aio_context_t ctx, bool reusable)>;
  // Called as each read completes (in any order): its offset and the bytes
  // read (fewer than asked at the end of the file), or -errno.
  using ReadDone = std::function<void(std::uint64_t offset, std::int64_t result)>;

  AsyncIo() = default;
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;
  ~AsyncIo() {
    Finish();
    if (ctx_ != 0) release_(ctx_, in_flight_ == 0);
  }

  // Works on `fd` through `ctx`, given back through `release`; reads report
  // to `read_done`. False when `ctx` is 0 (no context: do the I/O synchronously).
  bool Start(int fd, aio_context_t ctx, Release release, ReadDone read_done = nullptr) {
    fd_ = fd;
    ctx_ = ctx;
    release_ = std::move(release);
    read_done_ = std::move(read_done);
    return ctx_ != 0;
  }

  // Queue a write or a read of `n` bytes (at most 16 MiB) at `offset`;
  // after a failure, they do nothing.
  void Write(const std::uint8_t* data, size_t n, std::uint64_t offset) {
    Submit(IOCB_CMD_PWRITE, const_cast<std::uint8_t*>(data), n, offset);
  }
  void Read(std::uint8_t* data, size_t n, std::uint64_t offset) { Submit(IOCB_CMD_PREAD, data, n, offset); }

  // Waits for every queued request: 0, or the errno of the first failed
  // write (EIO for a short one). Reads report through read_done.
  int Finish() {
    while (in_flight_ > 0 && !abandoned_) Reap(in_flight_);
    return err_;
  }

 private:
  static constexpr unsigned kLengthBits = 24;

  void Submit(std::uint16_t op, std::uint8_t* data, size_t n, std::uint64_t offset) {
    if (err_ != 0) return;
    if (in_flight_ == kMaxInFlight) Reap(1);
    iocb cb{};
    cb.aio_fildes = static_cast<std::uint32_t>(fd_);
    cb.aio_lio_opcode = op;
    cb.aio_buf = reinterpret_cast<std::uint64_t>(data);
    cb.aio_nbytes = n;
    cb.aio_offset = static_cast<std::int64_t>(offset);
    cb.aio_data = offset << kLengthBits | n;  // what Done needs
    iocb* list[1] = {&cb};
    long rc;
    do {
      rc = ::syscall(SYS_io_submit, ctx_, 1, list);
    } while (rc < 0 && errno == EINTR);
    if (rc == 1) {
      ++in_flight_;
      return;
    }
    // Not taken (EAGAIN, a filesystem without AIO): done here and now.
    size_t done = 0;
    while (done < n) {
      const ssize_t r = op == IOCB_CMD_PWRITE ? ::pwrite(fd_, data + done, n - done, static_cast<off_t>(offset + done))
                                              : ::pread(fd_, data + done, n - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        Done(op == IOCB_CMD_PREAD, cb.aio_data, -errno);
        return;
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    Done(op == IOCB_CMD_PREAD, cb.aio_data, static_cast<std::int64_t>(done));
  }

  void Done(bool read, std::uint64_t data, std::int64_t result) {
    const std::uint64_t offset = data >> kLengthBits;
    const std::uint64_t n = data & ((std::uint64_t{1} << kLengthBits) - 1);
    if (read) {
      read_done_(offset, result);
    } else if (err_ == 0 && result < 0) {
      err_ = static_cast<int>(-result);
    } else if (err_ == 0 && static_cast<std::uint64_t>(result) != n) {
      err_ = EIO;
    }
  }

  void Reap(unsigned at_least) {
    io_event events[kMaxInFlight];
    const long got = ::syscall(SYS_io_getevents, ctx_, at_least, kMaxInFlight, events, nullptr);
    if (got < 0) {
      if (errno == EINTR) return;
      // Cannot happen with a valid context: give up on the requests left
      // (their context is then destroyed, which waits for them).
      err_ = err_ != 0 ? err_ : errno;
      abandoned_ = true;
      return;
    }
    in_flight_ -= static_cast<unsigned>(got);
    for (long i = 0; i < got; ++i) Done(static_cast<bool>(read_done_), events[i].data, events[i].res);
  }

  aio_context_t ctx_ = 0;
  Release release_;
  ReadDone read_done_;
  int fd_ = -1;
  unsigned in_flight_ = 0;
  bool abandoned_ = false;
  int err_ = 0;
};

Status SyncDir(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) return IoStatus("open directory", dir, errno);
  if (::fsync(fd.get()) != 0) return IoStatus("fsync directory", dir, errno);
  return Status::Ok();
}

Status MakeDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return IoStatus("mkdir", dir, errno);
  return Status::Ok();
}

// The names in a directory (without "." and ".."); kInvalidArgument when
// `dir` is not a directory.
Result<std::vector<std::string>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOTDIR) return Status::InvalidArgument(dir + " is not a directory");
    return IoStatus("opendir", dir, errno);
  }
  std::vector<std::string> names;
  int err = 0;
  for (;;) {
    errno = 0;  // readdir tells the end from an error only through errno
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      err = errno;
      break;
    }
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  if (err != 0) return IoStatus("readdir", dir, err);
  return names;
}

std::string Hex2(std::uint8_t b) {
  static constexpr char kHex[] = "0123456789abcdef";
  return {kHex[b >> 4], kHex[b & 15]};
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// "<64 lowercase hex>.kdn" -> the key; nullopt for any other name.
std::optional<keys::Digest> ParseObjectName(std::string_view name) {
  keys::Digest key{};
  if (name.size() != 2 * key.size() + kObjectSuffix.size() || !name.ends_with(kObjectSuffix)) return std::nullopt;
  for (size_t i = 0; i < key.size(); ++i) {
    const int hi = HexValue(name[2 * i]), lo = HexValue(name[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    key[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return key;
}

// "<digits>-<digits>.tmp": the names WriteObject gives its temp files, the
// only files Open deletes from tmp/.
bool IsTempName(std::string_view name) {
  if (!name.ends_with(kTempSuffix)) return false;
  name.remove_suffix(kTempSuffix.size());
  const size_t dash = name.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == name.size()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (i != dash && (name[i] < '0' || name[i] > '9')) return false;
  }
  return true;
}

// Why a file is not an object, by its metadata: "" when `st` is a regular
// file of `expected` bytes, at most `max` bytes.
std::string FileStatProblem(const struct stat& st, std::uint64_t expected, std::uint64_t max) {
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size != expected) return "its size changed: " + std::to_string(size) + " bytes, " + std::to_string(expected) + " written";
  if (size > max) return "larger than the largest object (" + std::to_string(max) + " bytes)";
  return "";
}

// Why a file of `size` bytes is not an object, by its header (the first `n`
// bytes read, `p`): "" when the segment table says that size, or that size
// less a seal's trailer (wire/seal.h: checked when the object is decoded).
std::string HeaderProblem(std::uint64_t size, const std::uint8_t* p, size_t n) {
  if (n < std::min<std::uint64_t>(size, kDirectAlignment)) return "shorter than its size";
  const std::optional<std::uint64_t> said = wire::FramedMessageBytes(p, n);
  if (!said) return "no valid header";
  if (*said != size && *said + wire::kSealTrailerBytes != size) {
    return "its header says " + std::to_string(*said) + " bytes, the file has " + std::to_string(size);
  }
  return "";
}

// Both: "" when the header (first `n` bytes) and `st` agree with an object
// of `expected` bytes, at most `max` bytes.
std::string ObjectFileProblem(const struct stat& st, std::uint64_t expected, std::uint64_t max, const std::uint8_t* p,
                              size_t n) {
  if (std::string problem = FileStatProblem(st, expected, max); !problem.empty()) return problem;
  return HeaderProblem(expected, p, n);
}

// The lock descriptors of the tiers open in this process. A child made by
// fork() shares its parent's open files, and a flock belongs to the open
// file: a child that never calls kdn would hold every directory's lock for
// as long as it lives (exec closes them, O_CLOEXEC; a child that does not
// exec keeps them). The child handler points each of those descriptors at
// /dev/null: the child lets go of the locks (the parent keeps them), and a
// destructor that runs in the child later closes /dev/null, not a
// descriptor the child reused. Process-wide because fork is: this is the
// one registry pthread_atfork leaves no way around.
class LockFds {
 public:
  static void Add(int fd) {
    LockFds& r = Instance();
    std::lock_guard<std::mutex> lock(r.mu_);
    r.fds_.insert(fd);
  }
  static void Remove(int fd) {
    LockFds& r = Instance();
    std::lock_guard<std::mutex> lock(r.mu_);
    r.fds_.erase(fd);
  }

 private:
  LockFds() = default;
  static LockFds& Instance() {
    // Never destroyed: the fork handlers outlive static destruction.
    static LockFds* const instance = [] {
      auto* r = new LockFds;
      ::pthread_atfork(&Prepare, &Parent, &Child);
      return r;
    }();
    return *instance;
  }
  // No Add or Remove runs while fork copies the set.
  static void Prepare() { Instance().mu_.lock(); }
  static void Parent() { Instance().mu_.unlock(); }
  // Async-signal-safe calls only (the child of a threaded process).
  static void Child() {
    LockFds& r = Instance();
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (const int fd : r.fds_) {
      if (null_fd < 0 || ::dup3(null_fd, fd, O_CLOEXEC) < 0) ::close(fd);
    }
    if (null_fd >= 0) ::close(null_fd);
    r.mu_.unlock();
  }

  std::mutex mu_;
  std::set<int> fds_;  // guarded by mu_
};
}  // namespace

struct XxhStateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

struct DiskTier::FileBytes {
  IoBuffer buffer;  // from pool_
  size_t size = 0;  // bytes read
  // A large file's payload hashed while it was read: from
  // wire::OnePiecePayloadOffset() up to `hashed_to`, its last word left
  // out (the payload's exact end is known only once the header is parsed).
  std::unique_ptr<XXH3_state_t, XxhStateDeleter> hash;
  std::uint64_t hashed_to = 0;
};

// Reads an open object file whole, once its type and size (`bytes`, as the
// index holds it, at most MaxObjectBytes()) are checked, into a buffer from
// the pool, then checks its header. A size the tier has not seen in an
// object (`size_known` false: indexed at Open from a file's size, which a
// file grown while the tier was closed sets) is first checked against the
// header in the first block, before the buffer is taken: a read never
// allocates more than a valid object of the tier needs. Otherwise the file
// is read in one request (one device round trip, not two). With O_DIRECT
// every request is block-aligned (the length is rounded up to a block); the
// last read comes back short. `*err` is the errno of a failed call (0 on
// success, and on a failed check: kCorrupt).
Result<DiskTier::FileBytes> DiskTier::ReadWhole(int fd, const std::string& path, std::uint64_t bytes, bool size_known,
                                                int* err) const {
  *err = 0;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *err = errno;
    return IoStatus("fstat", path, *err);
  }
  if (const std::string problem = FileStatProblem(st, bytes, MaxObjectBytes()); !problem.empty()) {
    return Status::Corrupt("disk tier: " + path + ": " + problem);
  }
  auto read_some = [&](std::uint8_t* to, size_t want, size_t* got) -> Status {
    while (*got < want) {
      const ssize_t r = ::read(fd, to + *got, want - *got);
      if (r < 0) {
        if (errno == EINTR) continue;
        *err = errno;
        return IoStatus("read", path, *err);
      }
      if (r == 0) break;
      *got += static_cast<size_t>(r);
    }
    return Status::Ok();
  };
  alignas(kDirectAlignment) std::uint8_t head[kDirectAlignment];
  size_t head_size = 0;
  if (!size_known) {
    KDN_RETURN_IF_ERROR(read_some(head, sizeof head, &head_size));
    if (const std::string problem = HeaderProblem(bytes, head, head_size); !problem.empty()) {
      return Status::Corrupt("disk tier: " + path + ": " + problem);
    }
  }
  const size_t size = static_cast<size_t>(bytes);
  const size_t want = (std::max<size_t>(size, 1) + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
  FileBytes file;
  file.buffer = pool_->Take(want);
  if (!file.buffer.data) {
    return Status(Code::kNoMemory, "disk tier: no memory for a read of " + std::to_string(want) + " bytes");
  }
  std::uint8_t* to = file.buffer.data.get();
  std::memcpy(to, head, head_size);
  file.size = head_size;
  const std::uint64_t payload_at = wire::OnePiecePayloadOffset();
  if (want - head_size >= 2 * kReadSegment && size >= payload_at + kReadSegment) {
    // Read in segments, all queued at once, the payload hashed in order as
    // they land: the check of the payload's checksum overlaps the read
    // instead of following it (a sixth of the read at 32 MiB, bench store).
    file.hash.reset(XXH3_createState());
    if (!file.hash) return Status(Code::kNoMemory, "disk tier: no memory for a read's hash");
    XXH3_64bits_reset(file.hash.get());
    const std::uint64_t hash_end = size - sizeof(std::uint64_t);  // the last word waits for the header
    file.hashed_to = payload_at;
    std::uint64_t landed = head_size;  // every byte before this has arrived
    bool whole = true;                 // every read returned what the file should hold
    std::map<std::uint64_t, std::int64_t> early;  // reads that landed before the ones ahead of them
    auto read_done = [&](std::uint64_t offset, std::int64_t result) {
      const std::uint64_t expect = std::min<std::uint64_t>(kReadSegment, size - std::min<std::uint64_t>(offset, size));
      if (result < 0) {
        if (*err == 0) *err = static_cast<int>(-result);
        whole = false;
        return;
      }
      if (static_cast<std::uint64_t>(result) != expect) whole = false;
      early[offset] = result;
      for (auto it = early.begin(); whole && it != early.end() && it->first == landed; it = early.erase(it)) {
        landed += static_cast<std::uint64_t>(it->second);
        const std::uint64_t upto = std::min(landed, hash_end);
        if (upto > file.hashed_to) {
          XXH3_64bits_update(file.hash.get(), to + file.hashed_to, upto - file.hashed_to);
          file.hashed_to = upto;
        }
      }
    };
    AsyncIo aio;
    if (aio.Start(fd, TakeAioContext(), [this](aio_context_t ctx, bool reusable) { GiveAioContext(ctx, reusable); },
                  read_done)) {
      for (std::uint64_t off = head_size; off < want; off += kReadSegment) {
        aio.Read(to + off, static_cast<size_t>(std::min<std::uint64_t>(kReadSegment, want - off)), off);
      }
      if (const int failed = aio.Finish(); failed != 0 && *err == 0) *err = failed;
      if (*err != 0) return IoStatus("read", path, *err);
      file.size = static_cast<size_t>(landed);
      if (!whole) file.hash.reset();  // a file that changed size under the read: checked the slow way
      if (file.hash && file.hashed_to != hash_end) file.hash.reset();
    } else {
      file.hash.reset();
    }
  }
  if (file.size == head_size) KDN_RETURN_IF_ERROR(read_some(to, want, &file.size));
  if (size_known) {
    if (const std::string problem = HeaderProblem(bytes, to, file.size); !problem.empty()) {
      return Status::Corrupt("disk tier: " + path + ": " + problem);
    }
  }
  return file;
}

DiskTier::DiskTier(DiskTierOptions options, int lock_fd, int tmp_fd)
    : options_(std::move(options)),
      lock_fd_(lock_fd),
      tmp_fd_(tmp_fd),
      odirect_(options_.use_odirect),
      pool_(std::make_shared<BufferPool>(options_.io_buffer_cache_bytes)) {}

DiskTier::~DiskTier() {
  for (const std::uint64_t ctx : aio_idle_) ::syscall(SYS_io_destroy, static_cast<aio_context_t>(ctx));
  if (tmp_fd_ >= 0) ::close(tmp_fd_);
  if (lock_fd_ >= 0) {
    LockFds::Remove(lock_fd_);
    ::close(lock_fd_);  // releases the directory's flock
  }
}

std::uint64_t DiskTier::MaxObjectBytes() const { return std::min(options_.max_object_bytes, options_.capacity_bytes); }

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.directory.empty()) return Status::InvalidArgument("disk tier: no directory");
  // The system calls would see only the part before it.
  if (options.directory.find('\0') != std::string::npos) {
    return Status::InvalidArgument("disk tier: the directory's path contains a NUL byte");
  }
  if (options.capacity_bytes == 0) return Status::InvalidArgument("disk tier: capacity must be > 0");
  if (options.max_object_bytes == 0) return Status::InvalidArgument("disk tier: max_object_bytes must be > 0");
  std::error_code ec;
  fs::create_directories(fs::path(options.directory) / "objects", ec);
  if (ec) return Status(Code::kUnavailable, "disk tier: cannot create " + options.directory + ": " + ec.message());
  // Open deletes files in tmp/: through a link it would delete them elsewhere.
  const std::string tmp = options.directory + "/tmp";
  const Status tmp_is_link = Status::InvalidArgument(
      "disk tier: " + tmp + " is a symbolic link; refusing to use it (the tier deletes files there): "
      "remove it, or point the tier at another directory");
  struct stat st;
  if (::lstat(tmp.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return tmp_is_link;
  } else if (errno == ENOENT) {
    KDN_RETURN_IF_ERROR(MakeDir(tmp));
  } else {
    return IoStatus("lstat", tmp, errno);
  }
  const std::string lock_path = options.directory + "/LOCK";
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lock_fd < 0) return IoStatus("open", lock_path, errno);
  // Open deletes temp files and trims objects: a second process on the same
  // directory would have its writes in progress deleted under it.
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK) {
      return Status(Code::kUnavailable, "disk tier: " + options.directory + " is in use by another process");
    }
    return IoStatus("flock", lock_path, err);
  }
  LockFds::Add(lock_fd);
  // O_NOFOLLOW: a tmp made a link since the check above is refused too.
  const int tmp_fd = ::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (tmp_fd < 0) {
    const int err = errno;
    LockFds::Remove(lock_fd);
    ::close(lock_fd);
    if (err == ELOOP) return tmp_is_link;
    if (err == ENOTDIR) return Status::InvalidArgument("disk tier: " + tmp + " is not a directory");
    return IoStatus("open directory", tmp, err);
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(options, lock_fd, tmp_fd));
  KDN_RETURN_IF_ERROR(tier->Prepare());
  return tier;
}

Status DiskTier::Prepare() {
  if (options_.fsync == FsyncPolicy::kFull) {
    KDN_RETURN_IF_ERROR(SyncDir(options_.directory + "/objects"));
    KDN_RETURN_IF_ERROR(SyncDir(options_.directory));
  }
  KDN_RETURN_IF_ERROR(RemoveStaleTemps());
  KDN_RETURN_IF_ERROR(RebuildIndex());
  TrimToCapacity();
  if (options_.use_odirect) {
    // Probed on a file of this directory: O_DIRECT support is per filesystem.
    Fd probe(OpenFile(options_.directory + "/LOCK", O_RDONLY | O_DIRECT | O_CLOEXEC));
    if (!probe.ok() && errno == EINVAL) odirect_.store(false);
  }
  return Status::Ok();
}

// A temp file is a write a crash interrupted: never renamed, so never an
// object. Only regular files with the names WriteObject gives are ours;
// everything is reached through tmp_fd_ and nothing is followed.
Status DiskTier::RemoveStaleTemps() {
  const std::string tmp = options_.directory + "/tmp";
  const int list_fd = ::openat(tmp_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (list_fd < 0) return IoStatus("open directory", tmp, errno);
  DIR* d = ::fdopendir(list_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(list_fd);
    return IoStatus("opendir", tmp, err);
  }
  std::vector<std::string> names;
  int err = 0;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) {
      err = errno;
      break;
    }
    if (IsTempName(e->d_name)) names.emplace_back(e->d_name);
  }
  ::closedir(d);
  if (err != 0) return IoStatus("readdir", tmp, err);
  for (const std::string& name : names) {
    struct stat st;
    if (::fstatat(tmp_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlinkat(tmp_fd_, name.c_str(), 0) == 0) ++stale_temps_removed_;
  }
  return Status::Ok();
}

Status DiskTier::RebuildIndex() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string objects = options_.directory + "/objects";
  Result<std::vector<std::string>> shards = ListDir(objects);
  if (!shards.ok()) return shards.status();
  for (const std::string& name : *shards) {
    if (name.size() != 2 || HexValue(name[0]) < 0 || HexValue(name[1]) < 0) continue;
    const int b = HexValue(name[0]) << 4 | HexValue(name[1]);
    const std::string shard = objects + "/" + name;
    Result<std::vector<std::string>> files = ListDir(shard);
    if (!files.ok()) {
      if (files.status().code() == Code::kInvalidArgument) continue;  // not a directory
      return files.status();
    }
    shard_ready_[static_cast<size_t>(b)].store(true);
    for (const std::string& file : *files) {
      const std::optional<keys::Digest> key = ParseObjectName(file);
      // Not an object of this shard: not ours to count or delete.
      if (!key || (*key)[0] != b) continue;
      const std::string path = shard + "/" + file;
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
      // Named as ours and no object can be this: a FIFO, a link, a file
      // larger than the largest object. Removed (a link, not its target).
      if (!S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) > MaxObjectBytes()) {
        if (::unlink(path.c_str()) == 0) ++counters_.corrupt_detected;
        continue;
      }
      const std::int64_t mtime_ns = std::int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
      index_[*key] = Entry{static_cast<std::uint64_t>(st.st_size), mtime_ns, ++generation_, false};
      used_ += static_cast<std::uint64_t>(st.st_size);
    }
  }
  return Status::Ok();
}

void DiskTier::TrimToCapacity() {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ <= options_.capacity_bytes) return;
  // Over capacity: files grown (or replaced) behind the tier's back go
  // first, before any valid object is trimmed for them.
  std::vector<keys::Digest> keys;
  keys.reserve(index_.size());
  for (const auto& [key, e] : index_) keys.push_back(key);
  for (const keys::Digest& key : keys) DropIfInvalidLocked(key);
  std::vector<std::pair<std::int64_t, keys::Digest>> by_age;
  by_age.reserve(index_.size());
  for (const auto& [key, e] : index_) by_age.emplace_back(e.last_use_ns, key);
  std::sort(by_age.begin(), by_age.end());  // oldest first; ties by key, deterministically
  for (const auto& [age, key] : by_age) {
    if (used_ <= options_.capacity_bytes) break;
    RemoveLocked(key);
    ++trimmed_at_open_;
  }
}

void DiskTier::DropIfInvalidLocked(const keys::Digest& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  const std::string path = ObjectPath(key);
  Fd fd(OpenFile(path, kObjectReadFlags));
  if (!fd.ok()) {
    if (errno == ELOOP || errno == ENXIO) {  // a link or a device put there since the listing
      RemoveLocked(key);
      ++counters_.corrupt_detected;
    }
    return;  // gone, or a passing shortage: Get decides
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return;
  std::uint8_t head[kDirectAlignment];
  ssize_t n = 0;
  if (S_ISREG(st.st_mode)) {
    do {
      n = ::pread(fd.get(), head, sizeof head, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return;  // unreadable: Get decides
  }
  if (!ObjectFileProblem(st, it->second.bytes, MaxObjectBytes(), head, static_cast<size_t>(n)).empty()) {
    RemoveLocked(key);
    ++counters_.corrupt_detected;
  }
}

int DiskTier::OpenFile(const std::string& path, int flags) const {
  return options_.open_file ? options_.open_file(path, flags) : DefaultOpen(path, flags);
}

std::string DiskTier::ShardDir(const keys::Digest& key) const {
  return options_.directory + "/objects/" + Hex2(key[0]);
}

std::string DiskTier::ObjectPath(const keys::Digest& key) const {
  return ShardDir(key) + "/" + keys::ToHex(key) + std::string(kObjectSuffix);
}

std::uint64_t DiskTier::Cost(const Chunk& chunk) const {
  return wire::EncodedEnvelopeSize(wire::AtRestPayloadBytes(chunk, options_.cipher.get())) +
         (options_.sealer ? wire::kSealTrailerBytes : 0);
}

Status DiskTier::Put(const ChunkRef& given) {
  if (!given) return Status::InvalidArgument("disk tier: null chunk");
  // Encrypted first, with master keys: the file never holds the KV in the clear.
  Result<ChunkRef> at_rest = wire::ToRest(given, options_.cipher.get());
  if (!at_rest.ok()) return at_rest.status();
  const ChunkRef& chunk = *at_rest;
  const keys::Digest& key = chunk->meta.key;
  const std::uint64_t cost = Cost(*chunk);
  if (cost > options_.max_object_bytes) {
    return Status::InvalidArgument("disk tier: an object of " + std::to_string(cost) +
                                   " bytes is larger than max_object_bytes (" +
                                   std::to_string(options_.max_object_bytes) + ")");
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A second Put of a key being written waits for the first: it then sees
    // the object (a no-op) or, if the first failed, writes it itself.
    put_done_.wait(lock, [&] { return !pending_.contains(key); });
    if (index_.contains(key)) return Status::Ok();
    if (cost > options_.capacity_bytes - std::min(used_, options_.capacity_bytes)) {
      return Status(Code::kBusy, "full");
    }
    used_ += cost;  // reserved while the file is written
    pending_.insert(key);
  }
  Status written;
  try {
    written = WriteObject(*chunk, cost);
  } catch (const std::bad_alloc&) {
    // Never leave the key pending: later Puts of it would wait forever.
    written = Status(Code::kNoMemory, "disk tier: out of memory writing " + keys::ToHex(key));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(key);
    if (written.ok()) {
      index_[key] = Entry{cost, NowNs(), ++generation_, true};
    } else {
      used_ -= cost;
      if (written.code() != Code::kInvalidArgument) ++counters_.io_errors;
    }
  }
  put_done_.notify_all();
  return written;
}

Status DiskTier::EnsureShard(std::uint8_t b) {
  std::atomic<bool>& ready = shard_ready_[b];
  if (ready.load(std::memory_order_acquire)) return Status::Ok();
  // Created on first use (a small tier need not own 256 directories); two
  // writers racing here both succeed (EEXIST is fine).
  const std::string objects = options_.directory + "/objects";
  KDN_RETURN_IF_ERROR(MakeDir(objects + "/" + Hex2(b)));
  // kFull: the new directory's name must be durable before an object in it is.
  if (options_.fsync == FsyncPolicy::kFull) KDN_RETURN_IF_ERROR(SyncDir(objects));
  ready.store(true, std::memory_order_release);
  return Status::Ok();
}

std::uint64_t DiskTier::TakeAioContext() const {
  {
    std::lock_guard<std::mutex> lock(aio_mu_);
    if (!aio_idle_.empty()) {
      const std::uint64_t ctx = aio_idle_.back();
      aio_idle_.pop_back();
      return ctx;
    }
  }
  aio_context_t ctx = 0;
  if (::syscall(SYS_io_setup, AsyncIo::kMaxInFlight, &ctx) != 0) return 0;  // none: write synchronously
  return ctx;
}

void DiskTier::GiveAioContext(std::uint64_t ctx, bool reusable) const {
  if (reusable) {
    std::lock_guard<std::mutex> lock(aio_mu_);
    try {
      aio_idle_.push_back(ctx);
      return;
    } catch (const std::bad_alloc&) {
    }
  }
  ::syscall(SYS_io_destroy, static_cast<aio_context_t>(ctx));  // waits for what is left in it
}

Status DiskTier::WriteObject(const Chunk& chunk, std::uint64_t cost) {
  // The envelope is built in an aligned buffer from the pool (reused: a
  // fresh one costs a page fault per page) and written whole blocks at a
  // time with O_DIRECT where the filesystem takes it: through the page
  // cache, a large object's fdatasync waited on the kernel's writeback
  // (0.2-0.3x of the disk at 32 MiB, bench store). The file is then cut to
  // the object's size before the sync; a crash before the rename leaves
  // only a temp file, which the next Open removes.
  const size_t padded = static_cast<size_t>((cost + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment);
  IoBuffer buffer = pool_->Take(padded);
  if (!buffer.data) return Status(Code::kNoMemory, "disk tier: no memory for a write of " + std::to_string(cost) + " bytes");
  struct GiveBack {
    BufferPool& pool;
    IoBuffer& buffer;
    ~GiveBack() { pool.Give(std::move(buffer)); }
  } give_back{*pool_, buffer};
  std::uint8_t* encoded = buffer.data.get();
  // The blocks' tail past the object is cut off below, but is written
  // first: no bytes of an earlier object reach the disk with it.
  std::memset(encoded + cost, 0, padded - static_cast<size_t>(cost));
  const bool direct = odirect_.load(std::memory_order_relaxed);
  // Unique per process (pid) and per write (sequence); only one process
  // uses the directory (LOCK), so no two writers ever share a temp file.
  // The name matches IsTempName: the next Open removes it after a crash.
  // Created and renamed through tmp_fd_ (tmp/ is never reached by a path).
  std::string name, tmp;
  Fd fd;
  for (int attempt = 0; attempt < 8 && !fd.ok(); ++attempt) {
    name = std::to_string(::getpid()) + "-" + std::to_string(temp_seq_.fetch_add(1, std::memory_order_relaxed)) +
           std::string(kTempSuffix);
    tmp = options_.directory + "/tmp/" + name;
    fd.Reset(::openat(tmp_fd_, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | (direct ? O_DIRECT : 0),
                      0644));
    if (!fd.ok() && errno != EEXIST) break;
  }
  bool written_direct = direct;
  if (!fd.ok() && direct && errno == EINVAL) {
    // This filesystem refuses O_DIRECT (Open probed with a read): write through the page cache.
    written_direct = false;
    fd.Reset(::openat(tmp_fd_, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  }
  if (!fd.ok()) return IoStatus("create", tmp, errno);
  // A large object goes to the disk in segments while the rest of it is
  // copied in (the copy and its checksum cost a third of the write at 32
  // MiB, bench store), the first segment last: it holds the header, which
  // takes the checksum. The file's blocks are allocated first, or each
  // write that extends the file would wait for the disk in io_submit.
  // Declared after the buffer and the file: destroyed first, so it waits
  // for its writes before either goes.
  AsyncIo aio;
  const bool pipelined = written_direct && padded >= 2 * kWriteSegment &&
                         aio.Start(fd.get(), TakeAioContext(), [this](aio_context_t ctx, bool reusable) {
                           GiveAioContext(ctx, reusable);
                         });
  size_t next = kWriteSegment;  // where the next segment starts; the first waits for the header
  auto send_ready = [&](std::uint64_t end) {
    while (next + kWriteSegment <= end) {
      aio.Write(encoded + next, kWriteSegment, next);
      next += kWriteSegment;
    }
  };
  if (pipelined) (void)::fallocate(fd.get(), 0, 0, static_cast<off_t>(padded));  // advice: fine if refused
  // With a secret the seal follows the envelope (in the last segment, which
  // goes after the copy), made once the whole envelope is final.
  const std::uint64_t envelope = options_.sealer ? cost - wire::kSealTrailerBytes : cost;
  Status st = wire::EncodeEnvelopeOver(chunk, encoded, envelope,
                                       pipelined ? std::function<void(std::uint64_t)>(send_ready) : nullptr);
  if (st.ok() && options_.sealer) st = options_.sealer->Seal(encoded, envelope, encoded + envelope);
  if (!st.ok()) {
    aio.Finish();
    ::unlinkat(tmp_fd_, name.c_str(), 0);
    return st.code() == Code::kInvalidArgument && st.message().find("a buffer of") != std::string::npos
               ? Status::Internal("disk tier: envelope size differs from Cost()")
               : st;
  }
  if (pipelined) {
    for (; next < padded; next += kWriteSegment) aio.Write(encoded + next, std::min(kWriteSegment, padded - next), next);
    aio.Write(encoded, kWriteSegment, 0);
    if (const int err = aio.Finish(); err != 0) st = IoStatus("write", tmp, err);
  } else {
    st = WriteAll(fd.get(), tmp, encoded, written_direct ? padded : static_cast<size_t>(cost));
  }
  if (st.ok() && written_direct && padded != cost && ::ftruncate(fd.get(), static_cast<off_t>(cost)) != 0) {
    st = IoStatus("truncate", tmp, errno);
  }
  // fdatasync suffices: a new file's size is the metadata a read needs.
  if (st.ok() && options_.fsync != FsyncPolicy::kNone && ::fdatasync(fd.get()) != 0) st = IoStatus("fdatasync", tmp, errno);
  if (fd.Close() != 0 && st.ok()) st = IoStatus("close", tmp, errno);
  const std::string path = ObjectPath(chunk.meta.key);
  if (st.ok()) st = EnsureShard(chunk.meta.key[0]);
  if (st.ok() && ::renameat(tmp_fd_, name.c_str(), AT_FDCWD, path.c_str()) != 0) st = IoStatus("rename to", path, errno);
  if (!st.ok()) {
    ::unlinkat(tmp_fd_, name.c_str(), 0);
    return st;
  }
  if (options_.fsync == FsyncPolicy::kFull) {
    if (Status synced = SyncDir(ShardDir(chunk.meta.key)); !synced.ok()) {
      // Not durable, so not stored: the key is pending, nobody else touches the path.
      ::unlink(path.c_str());
      return synced;
    }
  }
  return Status::Ok();
}

Result<ChunkRef> DiskTier::Get(const keys::Digest& key, const ReadContext& /*ctx*/) {
  std::uint64_t generation, bytes;
  bool size_known;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return Status::NotFound("disk tier: no object " + keys::ToHex(key));
    generation = it->second.generation;
    bytes = it->second.bytes;
    size_known = it->second.size_known;
  }
  ReadFailure why = ReadFailure::kCorrupt;
  Result<ChunkRef> chunk = ReadObject(key, bytes, size_known, &why);
  if (!chunk.ok()) {
    if (why == ReadFailure::kTransient) {
      // Out of memory or file descriptors: the object may well be fine.
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.io_errors;
      return chunk.status();
    }
    DropFailed(key, generation, why);
    return Status::NotFound("disk tier: object " + keys::ToHex(key) + " unreadable, removed: " +
                            chunk.status().message());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end() && it->second.generation == generation) {
      it->second.last_use_ns = NowNs();
      it->second.size_known = true;  // read whole and checked: its size is an object's
    }
  }
  return chunk;
}

Result<ChunkRef> DiskTier::ReadObject(const keys::Digest& key, std::uint64_t bytes, bool size_known,
                                      ReadFailure* why) {
  const std::string path = ObjectPath(key);
  int err = 0;
  Result<FileBytes> file = ReadFile(path, bytes, size_known, &err);
  if (!file.ok()) {
    if (file.status().code() == Code::kCorrupt) {
      *why = ReadFailure::kCorrupt;  // not a regular file, another size, a header that disagrees
    } else if (err == ENOENT || err == ELOOP || err == ENXIO || err == ENODEV) {
      // A file the index lists is gone (a lost object), or replaced by a
      // link, a socket or a device node.
      *why = ReadFailure::kCorrupt;
    } else if (err == EIO || err == EBADMSG || err == ENODATA) {
      *why = ReadFailure::kBadMedia;  // unreadable blocks; it will not get better
    } else {
      *why = ReadFailure::kTransient;
    }
    return file.status();
  }
  // The chunk keeps the read buffer (no copy of the payload), which goes
  // back to the pool when the chunk dies.
  const size_t capacity = file->buffer.capacity;
  std::shared_ptr<void> owner(file->buffer.data.release(), [pool = pool_, capacity](void* p) {
    pool->Give(IoBuffer{AlignedBytes(static_cast<std::uint8_t*>(p), Unmapper{capacity}), capacity});
  });
  const auto* base = static_cast<const std::uint8_t*>(owner.get());
  wire::PayloadChecksummer checksum;
  if (file->hash) {
    // Finishes the hash taken while reading, if the payload is where it
    // was taken (a one-piece envelope of this size); hashes it whole otherwise.
    checksum = [&file, base](const std::uint8_t* p, size_t n) -> std::uint64_t {
      const std::uint64_t at = wire::OnePiecePayloadOffset();
      if (p != base + at || at + n > file->size || at + n < file->hashed_to) return XXH3_64bits(p, n);
      XXH3_64bits_update(file->hash.get(), base + file->hashed_to, at + n - file->hashed_to);
      return XXH3_64bits_digest(file->hash.get());
    };
  }
  // The envelope's bytes: sealed with this tier's secret when it has one;
  // without one, a seal is skipped (it cannot be checked).
  size_t envelope = wire::EnvelopeBytesIgnoringSeal(base, file->size);
  if (options_.sealer) {
    if (Status sealed = options_.sealer->Open(base, file->size, &envelope); !sealed.ok()) {
      *why = ReadFailure::kUnsealed;
      return sealed;
    }
  }
  Result<ChunkRef> chunk = wire::DecodeEnvelope(base, envelope, &key, owner, checksum);
  if (chunk.ok() && (*chunk)->meta.codec == codec::CodecId::kEncrypted) {
    // Decrypted where it was read (the buffer is this read's alone); one
    // that does not open is a failed authentication, as a bad seal is.
    Result<ChunkRef> open = wire::FromRest(*chunk, options_.cipher.get(), options_.pass_through_encrypted, true);
    *why = open.status().code() == Code::kCorrupt ? ReadFailure::kUnsealed : ReadFailure::kTransient;
    return open;
  }
  *why = chunk.status().code() == Code::kNoMemory ? ReadFailure::kTransient : ReadFailure::kCorrupt;
  return chunk;
}

Result<DiskTier::FileBytes> DiskTier::ReadFile(const std::string& path, std::uint64_t bytes, bool size_known,
                                               int* errno_out) {
  int& err = *errno_out;
  err = 0;
  if (odirect_.load(std::memory_order_relaxed)) {
    Fd fd(OpenFile(path, kObjectReadFlags | O_DIRECT));
    if (!fd.ok()) {
      err = errno;
      if (err != EINVAL) return IoStatus("open", path, err);
    } else {
      Result<FileBytes> file = ReadWhole(fd.get(), path, bytes, size_known, &err);
      // EINVAL from a read: ReadWhole reads only regular files.
      if (file.ok() || err != EINVAL) return file;
      odirect_.store(false, std::memory_order_relaxed);
    }
  }
  Fd fd(OpenFile(path, kObjectReadFlags));
  if (!fd.ok()) {
    err = errno;
    return IoStatus("open", path, err);
  }
  if (odirect_.load(std::memory_order_relaxed)) {
    // The O_DIRECT open was refused (EINVAL). For a regular file, this
    // filesystem refuses O_DIRECT: read buffered from now on. Not for a
    // FIFO or a directory in an object's place (refused for what it is).
    struct stat st;
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) odirect_.store(false, std::memory_order_relaxed);
  }
  return ReadWhole(fd.get(), path, bytes, size_known, &err);
}

void DiskTier::DropFailed(const keys::Digest& key, std::uint64_t generation, ReadFailure why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  // Erased (or erased and put again) while we read: that is not the object
  // we found wanting.
  if (it == index_.end() || it->second.generation != generation) return;
  RemoveLocked(key);
  if (why == ReadFailure::kCorrupt || why == ReadFailure::kUnsealed) {
    ++counters_.corrupt_detected;
    if (why == ReadFailure::kUnsealed) ++counters_.auth_failures;
  } else {
    ++counters_.io_errors;
  }
}

void DiskTier::RemoveLocked(const keys::Digest& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  // Under the lock: a Put of the same key renames only once the key has
  // left the index, so this unlink cannot remove the new object.
  if (::unlink(ObjectPath(key).c_str()) != 0 && errno != ENOENT) ++counters_.io_errors;
  used_ -= it->second.bytes;
  index_.erase(it);
}

bool DiskTier::Contains(const keys::Digest& key, const ReadContext& /*ctx*/) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

bool DiskTier::Erase(const keys::Digest& key, const ReadContext& /*ctx*/) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!index_.contains(key)) return false;
    RemoveLocked(key);
  }
  if (options_.fsync == FsyncPolicy::kFull && !SyncDir(ShardDir(key)).ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.io_errors;
  }
  return true;
}

std::vector<ObjectInfo> DiskTier::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ObjectInfo> out;
  out.reserve(index_.size());
  for (const auto& [key, e] : index_) out.push_back(ObjectInfo{key, e.bytes, e.last_use_ns});
  return out;
}

std::uint64_t DiskTier::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

std::uint64_t DiskTier::objects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.size();
}

TierCounters DiskTier::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

}  // namespace kdn::store
