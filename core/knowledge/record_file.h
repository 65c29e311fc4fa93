// SPDX-License-Identifier: Apache-2.0
// A small file of records that survives crashes whole or not at all: the
// knowledge registries (kdnd's knowledge.kdnreg, a runtime's
// knowledge.kdnidx) are kept in one.
//
//   magic (8 bytes, the caller's; end it with \r\n to catch text-mode copies)
//   u32 format version, u32 zero
//   u64 payload bytes
//   32 bytes: SHA-256 (domain, format version, payload), keys::Hasher's encoding
//   payload
//
// Integers little-endian. WriteRecordFile writes PATH.tmp, fsyncs it, renames
// it over PATH and fsyncs the directory: a crash leaves the old file or the
// new one. ReadRecordFile checks every field and returns the payload.
// Thread-safety: free functions; two writers of one path must be serialized
// by the caller (they share PATH.tmp).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/keys/hash.h"
#include "core/util/status.h"

namespace kdn::store {

struct RecordFormat {
  char magic[8];
  std::uint32_t version;
  const char* domain;  // hashed with the payload: a file of one kind never checks as another
};

// Writes `payload` to `path` (mode 0600) as described above.
Status WriteRecordFile(const std::string& path, const RecordFormat& format, std::string_view payload);

// The payload of the file at `path`. kNotFound: no such file; kUnsupported:
// another format version; kCorrupt: anything else wrong with it (not a
// regular file, over `max_bytes`, bad magic, size or checksum); kInternal:
// the file could not be read. Never blocks on a FIFO.
Result<std::vector<std::uint8_t>> ReadRecordFile(const std::string& path, const RecordFormat& format,
                                                 std::uint64_t max_bytes);

// Fields for a payload, little-endian.
class RecordWriter {
 public:
  void U8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void U64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void Bytes(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void Digest(const keys::Digest& d) { Bytes(d.data(), d.size()); }
  // u32 length, then the bytes.
  void Str(std::string_view s) {
    U32(static_cast<std::uint32_t>(s.size()));
    Bytes(s.data(), s.size());
  }
  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

// Reads a payload; every read is bounds-checked and returns false past the end.
class RecordReader {
 public:
  explicit RecordReader(std::span<const std::uint8_t> b) : b_(b) {}
  bool U8(std::uint8_t& v) { return Raw(&v, 1); }
  bool U32(std::uint32_t& v) {
    std::uint8_t x[4];
    if (!Raw(x, 4)) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t{x[i]} << (8 * i);
    return true;
  }
  bool U64(std::uint64_t& v) {
    std::uint8_t x[8];
    if (!Raw(x, 8)) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t{x[i]} << (8 * i);
    return true;
  }
  bool Digest(keys::Digest& d) { return Raw(d.data(), d.size()); }
  // A Str of RecordWriter, of at most `max` bytes.
  bool Str(std::string& s, std::uint32_t max) {
    std::uint32_t n;
    if (!U32(n) || n > max || n > left()) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return true;
  }
  size_t left() const { return b_.size() - at_; }

 private:
  bool Raw(void* out, size_t n) {
    if (n > left()) return false;
    std::memcpy(out, b_.data() + at_, n);
    at_ += n;
    return true;
  }
  std::span<const std::uint8_t> b_;
  size_t at_ = 0;
};

// An append-only log of changes beside a record file (its snapshot), so a
// change costs its own bytes, not a rewrite of the whole file:
//
//   header (24 bytes): magic (the caller's), u32 format version 1, u32 zero,
//                      u64 generation (the snapshot it continues)
//   records:           u32 body bytes, 8 bytes: the first 8 of
//                      SHA-256(domain, generation, body), body
//
// A log belongs to one snapshot: its owner writes the snapshot with a new
// generation, then starts a new log (written to PATH.tmp, fsynced, renamed,
// the directory fsynced) with that generation; a log whose generation is not
// the snapshot's is left over from before it and is not replayed. Appends
// are written and fdatasynced before Append returns; a crash in one leaves a
// torn last record, which ReadRecordLog drops (and says so): the records
// before it are whole.
// Thread-safety: a RecordLog is used by one thread at a time (its owner's lock).
struct LogFormat {
  char magic[8];
  const char* domain;
};

// What a log holds.
struct LogContents {
  std::uint64_t generation = 0;
  std::vector<std::string> records;  // bodies, whole and checked, in order
  std::uint64_t bytes = 0;           // of the file
  bool torn = false;                 // bytes after the last good record (a crash in an append)
};

// The log at `path`. kNotFound: no such file; kCorrupt: not a log of this
// kind (magic, version, not a regular file, a header cut short); kInternal:
// unreadable. At most `max_bytes` are read: records past them count as torn.
Result<LogContents> ReadRecordLog(const std::string& path, const LogFormat& format, std::uint64_t max_bytes);

class RecordLog {
 public:
  // Starts an empty log of `generation` at `path`, replacing any there.
  static Result<std::unique_ptr<RecordLog>> Create(const std::string& path, const LogFormat& format,
                                                   std::uint64_t generation);
  // Opens the log at `path` (read before: `contents`, not torn) for appends.
  static Result<std::unique_ptr<RecordLog>> Open(const std::string& path, const LogFormat& format,
                                                 const LogContents& contents);
  ~RecordLog();
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  // Appends the records (bodies), durably. On an error the log may end in a
  // torn record: its owner must start a new one before appending again.
  Status Append(const std::vector<std::string>& bodies);

  std::uint64_t generation() const { return generation_; }
  std::uint64_t bytes() const { return bytes_; }  // of the file, header included
  static constexpr std::uint64_t kHeaderBytes = 24;

 private:
  RecordLog(int fd, std::string path, const LogFormat& format, std::uint64_t generation, std::uint64_t bytes)
      : fd_(fd), path_(std::move(path)), format_(format), generation_(generation), bytes_(bytes) {}
  int fd_;
  std::string path_;
  LogFormat format_;
  std::uint64_t generation_, bytes_;
};

// Saves a file a moment after it changes, on a thread of its own: Mark()
// after each change; `delay` after the first change of a burst the thread
// clears the mark and calls `save` (a burst of changes costs one write). A
// save that fails marks again, is reported to `on_error` (if given) and is
// tried again 5 s later or at Stop. The owner saves the last changes itself
// after Stop (dirty() says whether there are any).
// Thread-safety: Mark, TakeDirty and dirty from any thread; save runs on the
// saver's thread and must not call Stop.
class DebouncedSaver {
 public:
  DebouncedSaver(std::chrono::milliseconds delay, std::function<Status()> save,
                 std::function<void(const Status&)> on_error = {});
  ~DebouncedSaver() { Stop(); }
  DebouncedSaver(const DebouncedSaver&) = delete;
  DebouncedSaver& operator=(const DebouncedSaver&) = delete;

  void Mark();
  // Whether a change is unsaved, clearing the mark (a save about to snapshot).
  bool TakeDirty();
  bool dirty() const;
  // Ends the thread without saving; idempotent.
  void Stop();

 private:
  void Loop();
  const std::chrono::milliseconds delay_;
  const std::function<Status()> save_;
  const std::function<void(const Status&)> on_error_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool dirty_ = false, stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace kdn::store
