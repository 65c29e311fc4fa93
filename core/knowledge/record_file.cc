// SPDX-License-Identifier: Apache-2.0
#include "core/knowledge/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <initializer_list>

namespace kdn::store {
namespace {

constexpr size_t kHeader = 8 + 4 + 4 + 8 + 32;

keys::Digest Checksum(const RecordFormat& format, std::span<const std::uint8_t> payload) {
  keys::Hasher h;
  h.Str(format.domain);
  h.U32(format.version);
  h.Bytes(payload.data(), payload.size());
  return h.Finish();
}

std::string Errno(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

Status WriteAll(int fd, const std::string& tmp, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Internal(Errno("cannot write", tmp));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

void SyncDirectoryOf(const std::string& path) {
  const std::string dir = path.substr(0, path.rfind('/') + 1);
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// Writes `parts` to PATH.tmp (mode 0600), fsyncs it, renames it over `path`
// and fsyncs the directory (the rename itself is durable once it is synced):
// a crash leaves the old file or the new one.
Status ReplaceFile(const std::string& path, std::initializer_list<std::string_view> parts) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Internal(Errno("cannot create", tmp));
  Status st = Status::Ok();
  for (std::string_view part : parts) {
    if (st.ok()) st = WriteAll(fd, tmp, part);
  }
  if (st.ok() && ::fsync(fd) != 0) st = Status::Internal(Errno("cannot sync", tmp));
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Status::Internal(Errno("cannot rename over", path));
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  SyncDirectoryOf(path);
  return Status::Ok();
}

}  // namespace

Status WriteRecordFile(const std::string& path, const RecordFormat& format, std::string_view payload) {
  const keys::Digest sum = Checksum(format, {reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()});
  RecordWriter head;
  head.Bytes(format.magic, sizeof format.magic);
  head.U32(format.version);
  head.U32(0);
  head.U64(payload.size());
  head.Digest(sum);

  return ReplaceFile(path, {head.bytes(), payload});
}

Result<std::vector<std::uint8_t>> ReadRecordFile(const std::string& path, const RecordFormat& format,
                                                 std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return Status::NotFound("no file " + path);
  if (fd < 0) return Status::Internal(Errno("cannot open", path));
  struct stat sb {};
  std::vector<std::uint8_t> file;
  Status st;
  if (::fstat(fd, &sb) != 0) {
    st = Status::Internal(Errno("cannot stat", path));
  } else if (!S_ISREG(sb.st_mode)) {
    st = Status::Corrupt("not a regular file");
  } else if (static_cast<std::uint64_t>(sb.st_size) > max_bytes + kHeader) {
    st = Status::Corrupt(std::to_string(sb.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
                         " its bounds allow");
  } else {
    file.resize(static_cast<size_t>(sb.st_size));
    size_t done = 0;
    while (done < file.size()) {
      const ssize_t n = ::read(fd, file.data() + done, file.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        st = Status::Internal(Errno("cannot read", path));
        break;
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    file.resize(done);
  }
  ::close(fd);
  if (!st.ok()) return st;

  if (file.size() < kHeader) return Status::Corrupt("shorter than its header");
  if (std::memcmp(file.data(), format.magic, sizeof format.magic) != 0) return Status::Corrupt("not a file of this kind");
  RecordReader head(std::span<const std::uint8_t>(file).subspan(8, kHeader - 8));
  std::uint32_t version = 0, zero = 0;
  std::uint64_t bytes = 0;
  keys::Digest sum{};
  (void)head.U32(version);
  (void)head.U32(zero);
  (void)head.U64(bytes);
  (void)head.Digest(sum);
  if (version != format.version) {
    return Status::Unsupported("format version " + std::to_string(version) + " (this build reads " +
                               std::to_string(format.version) + ")");
  }
  if (bytes != file.size() - kHeader) {
    return Status::Corrupt("payload of " + std::to_string(file.size() - kHeader) + " bytes, the header says " +
                           std::to_string(bytes));
  }
  if (Checksum(format, std::span<const std::uint8_t>(file).subspan(kHeader)) != sum) {
    return Status::Corrupt("checksum mismatch");
  }
  file.erase(file.begin(), file.begin() + kHeader);
  return file;
}

namespace {

constexpr std::uint32_t kLogVersion = 1;

std::array<std::uint8_t, 8> RecordSum(const LogFormat& format, std::uint64_t generation, std::string_view body) {
  keys::Hasher h;
  h.Str(format.domain);
  h.U64(generation);
  h.Bytes(body.data(), body.size());
  const keys::Digest d = h.Finish();
  std::array<std::uint8_t, 8> out{};
  std::memcpy(out.data(), d.data(), out.size());
  return out;
}

std::string LogHeader(const LogFormat& format, std::uint64_t generation) {
  RecordWriter w;
  w.Bytes(format.magic, sizeof format.magic);
  w.U32(kLogVersion);
  w.U32(0);
  w.U64(generation);
  return w.bytes();
}

}  // namespace

Result<LogContents> ReadRecordLog(const std::string& path, const LogFormat& format, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return Status::NotFound("no file " + path);
  if (fd < 0) return Status::Internal(Errno("cannot open", path));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const Status st = Status::Internal(Errno("cannot stat", path));
    ::close(fd);
    return st;
  }
  if (!S_ISREG(sb.st_mode)) {
    ::close(fd);
    return Status::Corrupt("not a regular file");
  }
  LogContents out;
  out.bytes = static_cast<std::uint64_t>(sb.st_size);
  std::vector<std::uint8_t> file(static_cast<size_t>(std::min<std::uint64_t>(out.bytes, max_bytes)));
  size_t done = 0;
  while (done < file.size()) {
    const ssize_t n = ::read(fd, file.data() + done, file.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const Status st = Status::Internal(Errno("cannot read", path));
      ::close(fd);
      return st;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  file.resize(done);
  if (file.size() < RecordLog::kHeaderBytes) return Status::Corrupt("shorter than its header");
  if (std::memcmp(file.data(), format.magic, sizeof format.magic) != 0) return Status::Corrupt("not a log of this kind");
  RecordReader r(std::span<const std::uint8_t>(file).subspan(8));
  std::uint32_t version = 0, zero = 0;
  (void)r.U32(version);
  (void)r.U32(zero);
  (void)r.U64(out.generation);
  if (version != kLogVersion || zero != 0) return Status::Corrupt("log format version " + std::to_string(version));
  size_t at = RecordLog::kHeaderBytes;
  while (at < file.size()) {
    if (file.size() - at < 12) break;
    std::uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= std::uint32_t{file[at + i]} << (8 * i);
    if (file.size() - at - 12 < n) break;
    const std::string_view body(reinterpret_cast<const char*>(file.data() + at + 12), n);
    if (std::memcmp(RecordSum(format, out.generation, body).data(), file.data() + at + 4, 8) != 0) break;
    out.records.emplace_back(body);
    at += 12 + n;
  }
  out.torn = at != out.bytes;
  return out;
}

Result<std::unique_ptr<RecordLog>> RecordLog::Create(const std::string& path, const LogFormat& format,
                                                     std::uint64_t generation) {
  KDN_RETURN_IF_ERROR(ReplaceFile(path, {LogHeader(format, generation)}));
  LogContents empty;
  empty.generation = generation;
  empty.bytes = kHeaderBytes;
  return Open(path, format, empty);
}

Result<std::unique_ptr<RecordLog>> RecordLog::Open(const std::string& path, const LogFormat& format,
                                                   const LogContents& contents) {
  if (contents.torn) return Status::InvalidArgument("a torn log is not appended to: start a new one");
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::Internal(Errno("cannot open", path));
  return std::unique_ptr<RecordLog>(new RecordLog(fd, path, format, contents.generation, contents.bytes));
}

RecordLog::~RecordLog() { ::close(fd_); }

Status RecordLog::Append(const std::vector<std::string>& bodies) {
  RecordWriter w;
  for (const std::string& b : bodies) {
    w.U32(static_cast<std::uint32_t>(b.size()));
    const auto sum = RecordSum(format_, generation_, b);
    w.Bytes(sum.data(), sum.size());
    w.Bytes(b.data(), b.size());
  }
  KDN_RETURN_IF_ERROR(WriteAll(fd_, path_, w.bytes()));
  bytes_ += w.bytes().size();
  if (::fdatasync(fd_) != 0) return Status::Internal(Errno("cannot sync", path_));
  return Status::Ok();
}

DebouncedSaver::DebouncedSaver(std::chrono::milliseconds delay, std::function<Status()> save,
                               std::function<void(const Status&)> on_error)
    : delay_(delay), save_(std::move(save)), on_error_(std::move(on_error)) {
  thread_ = std::thread([this] { Loop(); });
}

void DebouncedSaver::Mark() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dirty_ = true;
  }
  cv_.notify_all();
}

bool DebouncedSaver::TakeDirty() {
  std::lock_guard<std::mutex> lock(mu_);
  const bool was = dirty_;
  dirty_ = false;
  return was;
}

bool DebouncedSaver::dirty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dirty_;
}

void DebouncedSaver::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DebouncedSaver::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return dirty_ || stop_; });
    if (stop_) return;
    if (cv_.wait_for(lock, delay_, [&] { return stop_; })) return;
    dirty_ = false;  // before the save's snapshot: a change after it marks again
    lock.unlock();
    const Status st = save_();
    lock.lock();
    if (!st.ok()) {
      dirty_ = true;
      if (on_error_) on_error_(st);
      cv_.wait_for(lock, std::chrono::seconds(5), [&] { return stop_; });
    }
  }
}

}  // namespace kdn::store
