// SPDX-License-Identifier: Apache-2.0
// Memory for the memory tiers: blocks in size classes carved from slabs, so
// uniform chunks (every full chunk of a model has the same size) reuse
// blocks of exactly their size and there is no first-fit fragmentation.
// Slabs come from a MemoryResource: pinned host memory (cudaHostAlloc) when
// a GPU is present, page-aligned host memory otherwise, or device memory.
// The pool never holds more than its capacity in slabs; empty slabs of one
// class are released to make room for another. Everything is released when
// the pool is destroyed (no pinned memory outlives it).
// A payload keeps its pool alive, so blocks may outlive the tier that made them.
// Thread-safety: Allocate and the release of payloads are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/store/tier.h"

namespace kdn::store {

enum class MemoryKind {
  kHost,            // page-aligned host memory
  kPinnedHost,      // cudaHostAlloc when a GPU is present, else page-aligned host memory
  kDeviceEmulated,  // host memory standing in for a GPU's (tests, CPU-only builds)
  kDevice,          // cudaMalloc (a GPU must be present)
};
const char* MemoryKindName(MemoryKind kind);
// True when this build has CUDA and the machine a usable GPU.
bool GpuPresent();

struct PoolUsage {
  std::uint64_t capacity = 0;
  std::uint64_t reserved = 0;  // bytes held in slabs
  std::uint64_t in_use = 0;    // bytes of blocks handed out
  std::uint64_t slabs = 0;
};

class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  // kPinnedHost falls back to page-aligned memory without a GPU; kDevice
  // without a GPU is refused by Create.
  static Result<std::shared_ptr<HostPool>> Create(std::uint64_t capacity_bytes, MemoryKind kind);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // The block size a request of n bytes takes: n rounded up to its class.
  static std::uint64_t ClassSize(std::uint64_t n);
  // A block of ClassSize(n) bytes holding n bytes, or an empty payload when
  // the capacity is used up. The block returns to the pool when the payload
  // is destroyed (which may happen after the pool's tier dropped it, but not
  // after the pool itself is destroyed).
  Payload Allocate(std::uint64_t n);
  PoolUsage Usage() const;
  // Whether `p` lies in a slab of this pool.
  bool Holds(const void* p) const;
  MemoryKind kind() const { return kind_; }

 private:
  struct Slab {
    std::uint8_t* base = nullptr;
    std::uint64_t bytes = 0;
    std::uint64_t block = 0;
    std::uint32_t used = 0;  // blocks handed out
  };
  HostPool(std::uint64_t capacity, MemoryKind kind) : capacity_(capacity), kind_(kind) {}
  void Free(std::uint8_t* data);
  std::uint8_t* RawAlloc(std::uint64_t bytes);
  void RawFree(std::uint8_t* p, std::uint64_t bytes);
  bool ReleaseEmptySlabs(std::uint64_t needed);  // mu_ held

  const std::uint64_t capacity_;
  const MemoryKind kind_;
  mutable std::mutex mu_;
  std::map<std::uint8_t*, Slab> slabs_;                          // by base; guarded by mu_
  std::map<std::uint64_t, std::vector<std::uint8_t*>> free_;     // class -> free blocks; guarded by mu_
  std::uint64_t reserved_ = 0;                                   // guarded by mu_
  std::uint64_t in_use_ = 0;                                     // guarded by mu_
};

}  // namespace kdn::store
