// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/host_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kdn::store {
namespace {

constexpr std::uint64_t kPage = 4096;
// A slab holds at least this many bytes of blocks (fewer, larger
// allocations: cudaHostAlloc is slow), unless one block is larger.
constexpr std::uint64_t kSlabBytes = std::uint64_t{4} << 20;

}  // namespace

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kPinnedHost: return GpuPresent() ? "pinned-host" : "host";
    case MemoryKind::kDeviceEmulated: return "device-emulated";
    case MemoryKind::kDevice: return "device";
  }
  return "?";
}

bool GpuPresent() {
#ifdef KDN_HAVE_CUDA
  static const bool present = [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;  // any error means no usable GPU
  }();
  return present;
#else
  return false;
#endif
}

Result<std::shared_ptr<HostPool>> HostPool::Create(std::uint64_t capacity_bytes, MemoryKind kind) {
  if (kind == MemoryKind::kDevice && !GpuPresent()) {
    return Status::Unsupported("device memory pool: no CUDA device (use the device-emulated kind)");
  }
  return std::shared_ptr<HostPool>(new HostPool(capacity_bytes, kind));
}

HostPool::~HostPool() {
  // Every payload holds the pool, so no block is in use here.
  for (auto& [base, slab] : slabs_) RawFree(base, slab.bytes);
}

std::uint64_t HostPool::ClassSize(std::uint64_t n) {
  // Pages, then geometric classes 1/8 apart above 64 KiB: at most 12.5% slack
  // for odd sizes, none for page-multiple uniform chunks below that.
  std::uint64_t c = std::max<std::uint64_t>(kPage, (n + kPage - 1) / kPage * kPage);
  if (c <= (std::uint64_t{64} << 10)) return c;
  const int top = 63 - __builtin_clzll(c);  // c in [2^top, 2^(top+1))
  const std::uint64_t step = (std::uint64_t{1} << top) / 8;
  return (c + step - 1) / step * step;
}

std::uint8_t* HostPool::RawAlloc(std::uint64_t bytes) {
#ifdef KDN_HAVE_CUDA
  if (kind_ == MemoryKind::kDevice || (kind_ == MemoryKind::kPinnedHost && GpuPresent())) {
    void* p = nullptr;
    const cudaError_t e = kind_ == MemoryKind::kDevice ? cudaMalloc(&p, bytes) : cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    return e == cudaSuccess ? static_cast<std::uint8_t*>(p) : nullptr;
  }
#endif
  // Pages of their own, not malloc's: slabs are released and made again as
  // size classes come and go, and in malloc's heap (where glibc puts blocks
  // of this size once one was freed) they left holes that the heap never
  // gave back (capi.memory).
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::uint8_t*>(p);
}

void HostPool::RawFree(std::uint8_t* p, std::uint64_t bytes) {
#ifdef KDN_HAVE_CUDA
  if (kind_ == MemoryKind::kDevice) {
    cudaFree(p);
    return;
  }
  if (kind_ == MemoryKind::kPinnedHost && GpuPresent()) {
    cudaFreeHost(p);
    return;
  }
#endif
  ::munmap(p, bytes);
}

bool HostPool::ReleaseEmptySlabs(std::uint64_t needed) {
  for (auto it = slabs_.begin(); it != slabs_.end() && reserved_ + needed > capacity_;) {
    Slab& s = it->second;
    if (s.used != 0) {
      ++it;
      continue;
    }
    auto& list = free_[s.block];
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](std::uint8_t* b) { return b >= s.base && b < s.base + s.bytes; }),
               list.end());
    reserved_ -= s.bytes;
    RawFree(s.base, s.bytes);
    it = slabs_.erase(it);
  }
  return reserved_ + needed <= capacity_;
}

Payload HostPool::Allocate(std::uint64_t n) {
  if (n == 0) return Payload();
  const std::uint64_t block = ClassSize(n);
  std::lock_guard<std::mutex> lock(mu_);
  auto& list = free_[block];
  if (list.empty()) {
    // A new slab of this class: as many blocks as fit kSlabBytes and the capacity left.
    // At most an eighth of the capacity per slab, so that one size class
    // cannot take a small pool from the others.
    std::uint64_t count = std::max<std::uint64_t>(1, std::min(kSlabBytes, capacity_ / 8) / block);
    if (reserved_ + count * block > capacity_) {
      ReleaseEmptySlabs(count * block);
      const std::uint64_t room = capacity_ > reserved_ ? capacity_ - reserved_ : 0;
      count = std::min(count, room / block);
      if (count == 0 && !ReleaseEmptySlabs(block)) return Payload();
      count = std::max<std::uint64_t>(count, 1);
      if (reserved_ + count * block > capacity_) return Payload();
    }
    std::uint8_t* base = RawAlloc(count * block);
    if (!base) return Payload();
    slabs_[base] = Slab{base, count * block, block, 0};
    reserved_ += count * block;
    for (std::uint64_t i = count; i-- > 0;) list.push_back(base + i * block);
  }
  std::uint8_t* p = list.back();
  list.pop_back();
  auto slab = std::prev(slabs_.upper_bound(p));
  ++slab->second.used;
  in_use_ += block;
  auto self = shared_from_this();
  return Payload::Adopt(p, static_cast<size_t>(n),
                        std::shared_ptr<void>(p, [self](void* q) { self->Free(static_cast<std::uint8_t*>(q)); }));
}

void HostPool::Free(std::uint8_t* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto slab = std::prev(slabs_.upper_bound(data));
  --slab->second.used;
  in_use_ -= slab->second.block;
  free_[slab->second.block].push_back(data);
}

bool HostPool::Holds(const void* p) const {
  const auto* b = static_cast<const std::uint8_t*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slabs_.upper_bound(const_cast<std::uint8_t*>(b));
  if (it == slabs_.begin()) return false;
  --it;
  return b < it->second.base + it->second.bytes;
}

PoolUsage HostPool::Usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return PoolUsage{capacity_, reserved_, in_use_, slabs_.size()};
}

}  // namespace kdn::store
