// SPDX-License-Identifier: Apache-2.0
// The host and device tiers: chunks in a HostPool of one MemoryKind. The
// host tier uses pinned memory when a GPU is present; the device tier uses
// device memory, or a host-memory emulation of it where there is no GPU (so
// the chain's logic is tested without one).
// A device tier (either kind) holds its chunks as device memory: Get copies
// one out to the host (counted: host_copy_bytes), GetResident hands out the
// block itself for a Device to read (device/device.h), and Put takes chunks
// already in device memory (copied device to device).
// The objects a tier stores never exceed its capacity; its pool may reserve
// up to twice that (at most 1 GiB more) for blocks that readers or the mover
// still hold after the tier dropped them.
// Thread-safety: every member may be called concurrently.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/tiers/host_pool.h"
#include "core/store/tier.h"

namespace kdn::store {

class MemoryTier final : public Tier {
 public:
  static Result<std::unique_ptr<MemoryTier>> Create(std::string name, std::uint64_t capacity_bytes, MemoryKind kind);

  const std::string& name() const override { return name_; }
  // A chunk that came with its envelope (Chunk::envelope) is kept whole in
  // host memory, the envelope's bytes as they came: what it costs.
  std::uint64_t Cost(const Chunk& chunk) const override {
    return HostPool::ClassSize(KeepsEnvelope(chunk) ? chunk.envelope_bytes : chunk.payload.size());
  }
  Status Put(const ChunkRef& chunk) override;
  Result<ChunkRef> Get(const keys::Digest& key, const ReadContext& ctx = {}) override;
  Result<ChunkRef> GetResident(const keys::Digest& key, const ReadContext& ctx = {}) override;
  bool TakesDevicePayloads() const override { return on_device(); }
  // A block of the pool, in host memory only.
  Payload Reserve(std::uint64_t bytes) override { return on_device() ? Payload() : pool_->Allocate(bytes); }
  bool Contains(const keys::Digest& key, const ReadContext& ctx = {}) const override;
  bool Erase(const keys::Digest& key, const ReadContext& ctx = {}) override;
  std::vector<ObjectInfo> List() const override;
  std::uint64_t capacity_bytes() const override { return capacity_; }
  std::uint64_t used_bytes() const override;
  std::uint64_t objects() const override;
  TierCounters counters() const override { return {}; }
  PoolUsage pool_usage() const { return pool_->Usage(); }
  MemoryKind kind() const { return pool_->kind(); }
  bool on_device() const { return kind() == MemoryKind::kDevice || kind() == MemoryKind::kDeviceEmulated; }
  // Whether Put keeps `chunk` as the envelope it came in: a host tier, and
  // an envelope that holds the chunk's payload.
  bool KeepsEnvelope(const Chunk& chunk) const {
    return chunk.envelope && !on_device() && !chunk.meta.device && chunk.payload.data() >= chunk.envelope &&
           chunk.payload.data() + chunk.payload.size() <= chunk.envelope + chunk.envelope_bytes;
  }
  // Bytes a device tier copied out to the host for Get.
  std::uint64_t host_copy_bytes() const { return host_copy_bytes_; }

 private:
  MemoryTier(std::string name, std::uint64_t capacity, std::shared_ptr<HostPool> pool)
      : name_(std::move(name)), capacity_(capacity), pool_(std::move(pool)) {}
  // Copies between host memory (or device memory, from_device) and this tier's memory.
  void CopyIn(std::uint8_t* dst, const std::uint8_t* src, size_t n, bool from_device) const;
  void CopyOut(std::uint8_t* dst, const std::uint8_t* src, size_t n) const;
  // Files a chunk made for this tier, unless a concurrent put filed its key
  // first (Ok) or it no longer fits (kBusy).
  Status Insert(std::shared_ptr<Chunk> stored, std::uint64_t cost);

  const std::string name_;
  const std::uint64_t capacity_;
  std::shared_ptr<HostPool> pool_;
  mutable std::mutex mu_;
  std::unordered_map<keys::Digest, ChunkRef, keys::DigestHash> map_;  // guarded by mu_
  std::uint64_t used_ = 0;                                          // guarded by mu_
  std::atomic<std::uint64_t> host_copy_bytes_{0};
};

}  // namespace kdn::store
