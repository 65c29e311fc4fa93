#include "chunk/chunk.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace kdn::chunk {
namespace {

std::shared_ptr<void> AllocHeap(size_t n) {
  if (n == 0) return nullptr;
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
