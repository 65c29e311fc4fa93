// SPDX-License-Identifier: Apache-2.0
// The disk tier: one file per object, in the chunk envelope format
// (wire/envelope.h), under a byte capacity, surviving restarts and crashes.
//
// Objects are stored as they are put: raw, or encoded by the chain for this
// tier's codec (ChunkMeta::codec, recorded in the envelope), and Get returns
// them in that form; capacity and usage count the file sizes, so encoded
// chunks cost their encoded bytes. A raw object's payload is handed out in
// the read buffer itself (no copy).
//
// Layout of the directory:
//   DIR/objects/<first 2 hex of key>/<64 hex of key>.kdn   one object each
//   DIR/tmp/<pid>-<n>.tmp                                   writes in progress
//   DIR/LOCK                                                held (flock) while open
// DIR/tmp must be a directory, never a symbolic link (Open refuses one: the
// tier deletes files there); the tier reaches it through a descriptor held
// open (openat), so a tmp swapped for a link later is not followed either.
//
// Writes are atomic: an object is written to DIR/tmp, synced per the fsync
// policy, then renamed into place. A reader, or the next process after a
// crash, sees a whole object or none. Open() removes what a crash left in
// DIR/tmp (regular files named <digits>-<digits>.tmp, nothing else: the
// directory may hold files that are not ours), rebuilds the index from the
// file names, sizes and mtimes (it reads no object) and, if the objects found
// exceed the capacity, first checks each one's size against its header (the
// message's segment table, its first bytes) and removes those that disagree,
// then removes the oldest valid ones (by mtime) until they fit: a few files
// grown behind the tier's back never cost the valid objects their place.
// Files named as objects that cannot be objects (not regular files, larger
// than the largest object) are removed at Open, never indexed; other files,
// and directories, are left alone.
//
// Fsync policy (what survives a power loss, not just a process crash; a
// process crash loses nothing that was renamed into place, whatever the policy):
//   kNone  no syncs: after a power loss an object may be missing, empty or
//          partial; Get detects that (checksums) and reports a miss.
//   kData  (default) the file's data is synced before the rename, so an object
//          whose name is durable is whole. The rename itself may be lost: a
//          recent Put may vanish after a power loss. One fdatasync per Put.
//   kFull  kData, and the object's directory is synced after the rename (and
//          after an Erase's unlink): a Put or Erase that returned is durable.
//
// Writes and reads use O_DIRECT with aligned buffers (the tier is a cache
// below the page cache's own; caching objects twice wastes memory, and a
// large object's fdatasync after a buffered write waits on the kernel's
// writeback) where the filesystem allows it: Open probes it (tmpfs before
// Linux 6.6 and some FUSE and network filesystems refuse O_DIRECT with
// EINVAL) and falls back to buffered I/O, as does a read or a temp file's
// creation that gets EINVAL later. A direct write covers whole blocks; the
// file is cut to the object's size before its sync. The buffers are reused
// (a pool of at most io_buffer_cache_bytes idle; a chunk Get returns keeps
// its read buffer until it dies). An object of two write segments (4 MiB)
// or more is written while it is being copied in: its blocks are allocated,
// each segment is queued (Linux AIO) as soon as its bytes are final, and
// the first segment, which holds the header and its checksums, goes last;
// the file is synced and renamed only once every write is complete, so a
// crash still leaves only a temp file. Such an object is read the same way,
// its segments queued at once and its payload hashed as they land, so that
// the checksum's check overlaps the read.
//
// Get opens object files without blocking (O_NONBLOCK: a FIFO in an
// object's place is not waited on) and without following a symbolic link,
// and checks, before reading, that the file is a regular file of the size
// the index holds (at most max_object_bytes). A size the tier has not seen
// in a valid object (one indexed at Open from a file's size) is also
// checked against the file's header before the read goes past the first
// block; a size it wrote or read back whole is read in one request. A read
// never allocates more than a valid object of the tier needs. It then checks every object it reads
// (wire::DecodeEnvelope with the expected key); an object that fails any
// check (not a regular file, another size, truncated, flipped bits, another
// key, a format this build cannot read, a file gone missing) is counted in
// corrupt_detected, removed, and reported as kNotFound; so is one on
// unreadable media (EIO), counted in io_errors. Get never returns wrong
// bytes. Only a passing shortage (memory, file descriptors) is returned as
// the error it is, the object kept.
//
// Recency: Get refreshes an object's last use in memory only; the file's
// mtime (the recency a restart sees) stays the time it was written. Touching
// the mtime on every hit would turn each read into a metadata write.
//
// The tier never evicts at run time: Put refuses with kBusy ("full")
// an object that does not fit, and the caller evicts (store/tier.h).
//
// Thread-safety: every member function may be called concurrently. A mutex
// guards the index; file reads and writes happen outside it (unlinks, which
// are short, happen under it so that they cannot race a rename of the same
// key), as they do outside the locks of the buffer pool and of the idle AIO
// contexts (held only to take or give one back). One process at a time uses a directory: Open fails with kUnavailable
// while another holds DIR/LOCK. A child made by fork() does not hold it
// (exec or not: a fork handler points the child's copy of the lock's
// descriptor at /dev/null), and must not use a tier it inherited.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/store/tier.h"
#include "core/wire/cipher.h"
#include "core/wire/seal.h"
#include "core/util/status.h"

namespace kdn::store {

enum class FsyncPolicy { kNone, kData, kFull };

struct DiskTierOptions {
  std::string directory;            // created if missing
  std::uint64_t capacity_bytes = 0; // total size of the object files; > 0
  FsyncPolicy fsync = FsyncPolicy::kData;
  bool use_odirect = true;          // write and read with O_DIRECT where the filesystem allows it
  // The largest object file (encoded envelope) the tier writes or reads: a
  // Put of a larger one is kInvalidArgument, a larger file on disk is
  // invalid. With the capacity, it bounds what a read allocates.
  std::uint64_t max_object_bytes = std::uint64_t{1} << 30;
  // Aligned I/O buffers kept idle for the next write or read (a fresh one
  // costs a page fault per page, more than the I/O's copy at 32 MiB): at
  // most this many bytes; a larger buffer is freed after its use. 0 keeps none.
  std::uint64_t io_buffer_cache_bytes = std::uint64_t{128} << 20;
  std::string name = "disk";
  // How object files are opened for reading: ::open(path, flags) when empty.
  // A seam for tests, which inject a filesystem that refuses O_DIRECT (as
  // tmpfs did before Linux 6.6, and some FUSE and network filesystems do).
  std::function<int(const std::string& path, int flags)> open_file;
  // With a deployment secret (wire/seal.h): every object file ends with the
  // seal of its envelope, and a file read back counts only if its seal is
  // this secret's and matches its bytes; any other is a miss, counted
  // (TierCounters::auth_failures) and removed. Null: files are taken as
  // they are (whoever can write to the directory decides the KV).
  std::shared_ptr<const wire::ChunkSealer> sealer;
  // With master keys (wire/cipher.h): every object is encrypted before it is
  // written (its file holds no KV in the clear), and one read back is
  // decrypted; one that does not open (another key, other bytes) is a miss,
  // counted (TierCounters::auth_failures) and removed. Null: written as
  // they come, and an encrypted object read back is such a miss.
  std::shared_ptr<const wire::ChunkCipher> cipher;
  // A node's tier (kdnd): an encrypted object it cannot open is served as
  // it is (wire::FromRest), for the client whose key it is.
  bool pass_through_encrypted = false;
};

class DiskTier final : public Tier {
 public:
  // Opens (creating if needed) a tier directory, as after a restart.
  static Result<std::unique_ptr<DiskTier>> Open(const DiskTierOptions& options);
  ~DiskTier() override;
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::string& name() const override { return options_.name; }
  // The object's file size: its encoded envelope (wire::EncodedEnvelopeSize).
  std::uint64_t Cost(const Chunk& chunk) const override;
  Status Put(const ChunkRef& chunk) override;
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override;
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override;
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override;
  std::vector<ObjectInfo> List() const override;
  std::uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  // Bytes of the objects held plus those of Puts in progress (reserved).
  std::uint64_t used_bytes() const override;
  std::uint64_t objects() const override;
  TierCounters counters() const override;

  // Whether writes and reads currently use O_DIRECT (false when disabled or
  // when the filesystem refused it).
  bool odirect_active() const { return odirect_.load(std::memory_order_relaxed); }
  // What Open found: temp files a crash left behind (removed), and objects
  // removed to honour the capacity.
  std::uint64_t stale_temp_files_removed() const { return stale_temps_removed_; }
  std::uint64_t objects_trimmed_at_open() const { return trimmed_at_open_; }

 private:
  struct Entry {
    std::uint64_t bytes = 0;
    std::int64_t last_use_ns = 0;
    std::uint64_t generation = 0;  // tells a re-put object from the one a reader saw
    // Whether `bytes` is known to be an object's size (written by this
    // tier, or read whole and checked), not just a file's (indexed at Open).
    bool size_known = false;
  };
  // Why a Get failed to return an object it found in the index: a failed
  // check or a lost file (removed, counted as corrupt), unreadable media
  // (removed, counted as an I/O error), or a passing shortage of memory or
  // file descriptors (kept, the error returned as is).
  enum class ReadFailure { kCorrupt, kUnsealed, kBadMedia, kTransient };
  struct FileBytes;   // a whole file in an O_DIRECT-aligned buffer
  class BufferPool;   // aligned buffers kept for reuse

  DiskTier(DiskTierOptions options, int lock_fd, int tmp_fd);
  Status Prepare();          // shard dirs, temp cleanup, index, trim, O_DIRECT probe
  Status RemoveStaleTemps();
  Status RebuildIndex();
  void TrimToCapacity();
  // Removes an indexed object whose file is not a regular file whose size
  // matches the index and its header (reads the header only). Requires mu_;
  // used at Open only.
  void DropIfInvalidLocked(const keys::Digest& key);
  // The largest object file this tier accepts: max_object_bytes, capacity.
  std::uint64_t MaxObjectBytes() const;
  int OpenFile(const std::string& path, int flags) const;
  std::string ObjectPath(const keys::Digest& key) const;
  std::string ShardDir(const keys::Digest& key) const;
  Status EnsureShard(std::uint8_t first_key_byte);  // creates objects/<xx> once
  Status WriteObject(const Chunk& chunk, std::uint64_t cost);
  // An AIO context for a pipelined write or read (0 when the kernel gives none), and back.
  std::uint64_t TakeAioContext() const;
  void GiveAioContext(std::uint64_t ctx, bool reusable) const;
  Result<ChunkRef> ReadObject(const keys::Digest& key, std::uint64_t bytes, bool size_known, ReadFailure* why);
  Result<FileBytes> ReadFile(const std::string& path, std::uint64_t bytes, bool size_known, int* errno_out);
  Result<FileBytes> ReadWhole(int fd, const std::string& path, std::uint64_t bytes, bool size_known, int* err) const;
  // Removes `key` if the index still holds the generation a reader saw.
  void DropFailed(const keys::Digest& key, std::uint64_t generation, ReadFailure why);
  void RemoveLocked(const keys::Digest& key);  // requires mu_

  const DiskTierOptions options_;
  const int lock_fd_;
  const int tmp_fd_;  // DIR/tmp, opened without following a link
  std::atomic<bool> odirect_;
  // Shared with the chunks Get returns, whose payloads live in its buffers.
  const std::shared_ptr<BufferPool> pool_;
  std::atomic<std::uint64_t> temp_seq_{0};
  std::array<std::atomic<bool>, 256> shard_ready_{};  // objects/<xx> exists
  std::uint64_t stale_temps_removed_ = 0;  // set by Open only
  std::uint64_t trimmed_at_open_ = 0;      // set by Open only

  mutable std::mutex aio_mu_;
  mutable std::vector<std::uint64_t> aio_idle_;  // AIO contexts (aio_context_t) kept for reuse; guarded by aio_mu_

  mutable std::mutex mu_;
  std::condition_variable put_done_;  // signalled when a pending Put ends
  std::unordered_map<keys::Digest, Entry, keys::DigestHash> index_;  // guarded by mu_
  std::unordered_set<keys::Digest, keys::DigestHash> pending_;       // keys being put; guarded by mu_
  std::uint64_t used_ = 0;         // index bytes + reservations of pending Puts; guarded by mu_
  std::uint64_t generation_ = 0;   // guarded by mu_
  TierCounters counters_;          // guarded by mu_
};

}  // namespace kdn::store
