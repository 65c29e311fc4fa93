#include "core/knowledge/record_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

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

}  // namespace

Status WriteRecordFile(const std::string& path, const RecordFormat& format, std::string_view payload) {
  const keys::Digest sum = Checksum(format, {reinterpret_cast<const std::uint8_t*>(payload.data()), payload.size()});
  RecordWriter head;
  head.Bytes(format.magic, sizeof format.magic);
  head.U32(format.version);
  head.U32(0);
  head.U64(payload.size());
  head.Digest(sum);

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Internal(Errno("cannot create", tmp));
  Status st = WriteAll(fd, tmp, head.bytes());
  if (st.ok()) st = WriteAll(fd, tmp, payload);
  if (st.ok() && ::fsync(fd) != 0) st = Status::Internal(Errno("cannot sync", tmp));
  ::close(fd);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = Status::Internal(Errno("cannot rename over", path));
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  // The rename itself is durable once the directory is synced.
  const std::string dir = path.substr(0, path.rfind('/') + 1);
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
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
