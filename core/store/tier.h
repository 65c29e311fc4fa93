// What the tiers of a store exchange, and the interface every tier
// implements. A tier only stores: it never evicts on its own; the chain
// (store/tiered_store.h) decides what to evict, where to demote and what to
// promote, and enforces capacity before it puts. A tier stores a chunk's
// payload as it is given, raw or encoded (ChunkMeta::codec): the chain
// encodes for the tiers that have a codec, and decodes what it reads back.
// Thread-safety: every Tier implementation must allow concurrent calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "keys/hash.h"
#include "util/status.h"

namespace kdn::store {

using Bytes = std::vector<std::uint8_t>;

// The bytes of a chunk's KV: contiguous, owned, move-only, and allocated
// either on the heap or by a memory pool (the host tier's pinned slabs),
// which gets them back when the last owner lets go.
class Payload {
 public:
  Payload() = default;
  // n bytes on the heap (64-byte aligned), zero-filled.
  explicit Payload(size_t n);
  // n bytes on the heap, not initialised (for bytes about to be overwritten).
  static Payload Uninitialized(size_t n);
  // A copy of [data, data + n) on the heap.
  Payload(const std::uint8_t* data, size_t n);
  // Memory that `owner`'s deleter returns where it came from.
  static Payload Adopt(std::uint8_t* data, size_t n, std::shared_ptr<void> owner);
  Payload(Payload&&) noexcept = default;
  Payload& operator=(Payload&&) noexcept = default;
  Payload(const Payload&) = delete;
  Payload& operator=(const Payload&) = delete;

  std::uint8_t* data() { return data_; }
  const std::uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::uint8_t* begin() { return data_; }
  std::uint8_t* end() { return data_ + size_; }
  const std::uint8_t* begin() const { return data_; }
  const std::uint8_t* end() const { return data_ + size_; }
  std::uint8_t& operator[](size_t i) { return data_[i]; }
  std::uint8_t operator[](size_t i) const { return data_[i]; }

 private:
  std::uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<void> owner_;  // frees the memory when the last holder goes
};

// Everything that describes a stored chunk's KV, besides the bytes.
struct ChunkMeta {
  keys::Digest key{};              // the chunk's key (prefix or content key)
  keys::Digest model{};            // model fingerprint
  keys::Digest ns_hash{};          // SHA-256 of the tenant namespace
  std::uint32_t dtype = 0;         // kdn_dtype
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0, tokens = 0;
  std::int64_t first_position = -1;  // position of the first token; -1 = position-free
  bool edited = false;             // rewritten by an editor stage after it was stored
  // How the payload holds the KV: kRaw, the canonical bytes themselves; any
  // other codec, that codec's self-describing payload (codec/codec.h), which
  // the chain decodes before anyone reads the KV (store/chunk_codec.h).
  codec::CodecId codec = codec::CodecId::kRaw;
  // The size of the canonical KV (the payload's size only when raw).
  std::uint64_t payload_bytes() const {
    return std::uint64_t{layers} * 2 * tokens * kv_heads * head_dim * (dtype == 0 ? 4 : 2);
  }
  bool operator==(const ChunkMeta&) const = default;
};

// An immutable chunk: the canonical KV bytes ([layer][k|v][token][kv_head][head_dim]),
// or, in a tier whose codec is not raw, their encoding (meta.codec).
struct Chunk {
  ChunkMeta meta;
  Payload payload;
};
using ChunkRef = std::shared_ptr<const Chunk>;

// An object a tier holds, as listed at open (a disk tier after a restart).
struct ObjectInfo {
  keys::Digest key{};
  std::uint64_t bytes = 0;     // what it costs in this tier's capacity
  std::int64_t last_use_ns = 0;  // for ordering recency after a restart (0 = unknown)
};

// Counters a tier keeps about its own storage (the chain keeps hits/misses).
struct TierCounters {
  std::uint64_t corrupt_detected = 0;  // objects that failed a check on read (and were removed)
  std::uint64_t io_errors = 0;
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual const std::string& name() const = 0;
  // What an object costs in this tier's capacity (payload as stored, encoded
  // or not, plus any header).
  virtual std::uint64_t Cost(const Chunk& chunk) const = 0;
  // Stores a chunk, all or nothing: no reader ever sees a partial object.
  // Putting a present key is a no-op returning Ok. Fails with kRetryLater
  // when it does not fit the remaining capacity (the caller evicts and
  // retries), other codes on I/O errors.
  virtual Status Put(const ChunkRef& chunk) = 0;
  // The chunk, or kNotFound. A corrupt object is reported as kNotFound too,
  // after being counted and removed.
  virtual Result<ChunkRef> Get(const keys::Digest& key) = 0;
  virtual bool Contains(const keys::Digest& key) const = 0;
  // Removes an object; false when absent.
  virtual bool Erase(const keys::Digest& key) = 0;
  // Every object held (at open, or now).
  virtual std::vector<ObjectInfo> List() const = 0;
  virtual std::uint64_t capacity_bytes() const = 0;
  virtual std::uint64_t used_bytes() const = 0;
  virtual std::uint64_t objects() const = 0;
  virtual TierCounters counters() const = 0;
};

}  // namespace kdn::store
