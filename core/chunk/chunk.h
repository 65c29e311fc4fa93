// SPDX-License-Identifier: Apache-2.0
// A chunk of KV as every layer above the kernels exchanges it: its bytes
// (Payload: owned, move-only, heap or pool memory) and what describes them
// (ChunkMeta). The store's tiers keep chunks, the wire envelope encodes them,
// the codecs transform their payloads; this is the one definition they share,
// below all of them.
// Thread-safety: a Chunk is immutable once shared (ChunkRef).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/codec/codec.h"
#include "core/keys/hash.h"
#include "core/util/dtype.h"

namespace kdn::chunk {

using Bytes = std::vector<std::uint8_t>;

// The bytes of a chunk's KV: contiguous, owned, move-only, and allocated
// either on the heap or by a memory pool (the host tier's pinned slabs),
// which gets them back when the last owner lets go.
class Payload {
 public:
  Payload() = default;
  // n bytes on the heap (64-byte aligned; above half a page, in pages of
  // their own: see chunk.cc), zero-filled.
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
  // Decoded from a lossy codec: close to the KV stored, not equal. Set by
  // store::DecodeChunk; kept in memory only (the envelope does not carry it).
  bool lossy = false;
  // The payload is in device memory (a device tier's block, or KV gathered
  // from an engine's device view): only a Device reads it, never the host.
  // Kept in memory only.
  bool device = false;
  // In memory only: decoded from a coarser quality level than the tier keeps
  // (tiers/leveled_tier.h): served to this load, never promoted to the tiers above.
  bool degraded = false;
  // In memory only: the chunk must come back bit for bit (a recurrent
  // layer's state snapshot, engine/groups.h): a tier whose codec is lossy
  // keeps it raw. A copy read back from a disk, redis or remote tier has lost
  // the mark (the envelope does not carry it); the readers of such chunks
  // refuse one decoded lossy (ChunkMeta::lossy) instead.
  bool exact = false;
  // The prefill work this chunk's presence saves when its request comes
  // again (store/policy.h PrefillCost: its tokens at the request's mean cost
  // per token), for the cost-aware eviction policy. 0: unknown. Kept in
  // memory only.
  double prefill_value = 0;
  // How the payload holds the KV: kRaw, the canonical bytes themselves; any
  // other codec, that codec's self-describing payload (codec/codec.h), which
  // the chain decodes before anyone reads the KV (store/chunk_codec.h).
  codec::CodecId codec = codec::CodecId::kRaw;
  // The size of the canonical KV (the payload's size only when raw).
  std::uint64_t payload_bytes() const {
    return std::uint64_t{layers} * 2 * tokens * kv_heads * head_dim * DtypeBytes(dtype);
  }
  bool operator==(const ChunkMeta&) const = default;
};

// An immutable chunk: the canonical KV bytes ([layer][k|v][token][kv_head][head_dim]),
// or, in a tier whose codec is not raw, their encoding (meta.codec).
struct Chunk {
  ChunkMeta meta;
  Payload payload;
  // The envelope (wire/envelope.h) this chunk arrived in, as it arrived,
  // where a tier keeps it whole (kdnd's memory tiers: a get replies with
  // these bytes, not a new encoding). It holds `payload` and lives as long
  // as it (one owner). Its key is the one it was put with, which a node's
  // meta.key (the node's own object key) is not. Null: none.
  const std::uint8_t* envelope = nullptr;
  std::uint64_t envelope_bytes = 0;
};
using ChunkRef = std::shared_ptr<const Chunk>;

}  // namespace kdn::chunk
