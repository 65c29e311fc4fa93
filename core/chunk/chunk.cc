// SPDX-License-Identifier: Apache-2.0
#include "core/chunk/chunk.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace kdn::chunk {
namespace {

// Payloads of a page and more live in pages mapped for them, not in
// malloc's heap. Most payloads are short-lived (a store gathers a chunk into
// one and a memory tier copies it into its pool; a codec's output until it
// is written), and in the heap, between the long-lived small allocations
// made meanwhile (index entries, documents), their freed blocks left holes
// the heap never gave back: a workload of distinct prompts and documents
// grew the heap to 300 MB with 42 MB in use (capi.memory). Freed mappings
// are kept by size for the next payload of that size, up to kCachedBytes in
// all, so that a steady stream of chunks costs no system calls and no page
// faults (on a virtual machine a 4 KiB fault cost 12 us here: a fresh 32 MiB
// buffer took 95 ms to fill, a reused one 2-5 ms).
class PageCache {
 public:
  static PageCache& Get() {
    static PageCache* cache = new PageCache;  // never destroyed: payloads may outlive static destructors
    return *cache;
  }
  static size_t Rounded(size_t n) {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return (n + page - 1) / page * page;
  }
  void* Take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = free_.find(bytes); it != free_.end() && !it->second.empty()) {
        const std::uint64_t age = it->second.back();  // the newest of its size
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        auto a = by_age_.find(age);
        void* p = a->second.p;
        by_age_.erase(a);
        cached_ -= bytes;
        return p;
      }
    }
    if (bytes >= kHugeFrom) return MapHuge(bytes);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return p;
  }
  // Keeps the mapping for the next payload of its size; to stay within
  // kCachedBytes, the mappings given back longest ago go first, whatever
  // their size (a cache full of sizes no longer asked for would otherwise
  // turn every new size away: after a varied workload, each payload of a
  // new size was mapped and faulted afresh).
  void Give(void* p, size_t bytes) {
    if (bytes > kCachedBytes) {
      ::munmap(p, bytes);
      return;
    }
    std::vector<Mapping> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (cached_ + bytes > kCachedBytes) {
        auto oldest = by_age_.begin();
        auto ages = free_.find(oldest->second.bytes);
        ages->second.pop_front();  // each size's ages are in order: the oldest is its first
        if (ages->second.empty()) free_.erase(ages);
        cached_ -= oldest->second.bytes;
        drop.push_back(oldest->second);
        by_age_.erase(oldest);
      }
      const std::uint64_t age = next_age_++;
      by_age_.emplace(age, Mapping{p, bytes});
      free_[bytes].push_back(age);
      cached_ += bytes;
    }
    for (const Mapping& m : drop) ::munmap(m.p, m.bytes);
  }

 private:
  // A large payload (a 32 MiB chunk of an 8B model) is written once, whole,
  // right after it is mapped: faulting it in 4 KiB pages cost more than the
  // copy that fills it (a remote get of such chunks spent most of its time
  // in page faults). Mapped on a 2 MiB boundary and advised as huge pages,
  // it faults in 2 MiB at a time where the kernel allows transparent huge
  // pages ("madvise" or "always"); elsewhere the advice does nothing.
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kHugeFrom = size_t{4} << 20;
  static void* MapHuge(size_t bytes) {
    void* raw = ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (start > base) ::munmap(raw, start - base);
    const std::uintptr_t tail = start + bytes, end = base + bytes + kHugePage;
    if (end > tail) ::munmap(reinterpret_cast<void*>(tail), end - tail);
    ::madvise(reinterpret_cast<void*>(start), bytes, MADV_HUGEPAGE);
    return reinterpret_cast<void*>(start);
  }
  // Enough for the chunks in flight through a remote tier's transfers (two
  // 32 MiB chunks of an 8B model; at 16 MiB, none of them was ever reused,
  // and a get of 320 KiB chunks ran at 0.3 GB/s against 2-3 with 64).
  static constexpr size_t kCachedBytes = size_t{64} << 20;
  struct Mapping {
    void* p;
    size_t bytes;
  };
  std::mutex mu_;
  // Cached mappings by the order they were given back (an age), and each
  // size's ages in that order; guarded by mu_.
  std::map<std::uint64_t, Mapping> by_age_;
  std::unordered_map<size_t, std::deque<std::uint64_t>> free_;
  std::uint64_t next_age_ = 0;
  size_t cached_ = 0;
};

std::shared_ptr<void> AllocHeap(size_t n) {
  if (n == 0) return nullptr;
  const size_t mapped = PageCache::Rounded(n);
  if (n > mapped / 2) {  // more than half a page, and less than half of the mapping left unused
    return std::shared_ptr<void>(PageCache::Get().Take(mapped), [mapped](void* q) { PageCache::Get().Give(q, mapped); });
  }
  void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

Payload::Payload(size_t n) : size_(n), owner_(AllocHeap(n)) {
  data_ = static_cast<std::uint8_t*>(owner_.get());
  if (n) std::memset(data_, 0, n);
}

Payload::Payload(const std::uint8_t* data, size_t n) : size_(n), owner_(AllocHeap(n)) {
  data_ = static_cast<std::uint8_t*>(owner_.get());
  if (n) std::memcpy(data_, data, n);
}

Payload Payload::Uninitialized(size_t n) {
  std::shared_ptr<void> owner = AllocHeap(n);
  auto* data = static_cast<std::uint8_t*>(owner.get());
  return Adopt(data, n, std::move(owner));
}

Payload Payload::Adopt(std::uint8_t* data, size_t n, std::shared_ptr<void> owner) {
  Payload p;
  p.data_ = data;
  p.size_ = n;
  p.owner_ = std::move(owner);
  return p;
}

}  // namespace kdn::chunk
