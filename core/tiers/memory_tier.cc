// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/memory_tier.h"

#include <algorithm>
#include <cstring>

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kdn::store {

Result<std::unique_ptr<MemoryTier>> MemoryTier::Create(std::string name, std::uint64_t capacity_bytes, MemoryKind kind) {
  // The pool may hold more than the tier: blocks of evicted objects stay in
  // use while readers hold them or the mover demotes them. The tier's own
  // accounting keeps what it stores within capacity_bytes.
  const std::uint64_t slack = std::min<std::uint64_t>(capacity_bytes, std::uint64_t{1} << 30);
  auto pool = HostPool::Create(capacity_bytes + slack, kind);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<MemoryTier>(new MemoryTier(std::move(name), capacity_bytes, std::move(pool).value()));
}

void MemoryTier::CopyIn(std::uint8_t* dst, const std::uint8_t* src, size_t n, bool from_device) const {
#ifdef KDN_HAVE_CUDA
  if (pool_->kind() == MemoryKind::kDevice) {
    cudaMemcpy(dst, src, n, from_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice);
    return;
  }
#endif
  (void)from_device;
  std::memcpy(dst, src, n);
}

void MemoryTier::CopyOut(std::uint8_t* dst, const std::uint8_t* src, size_t n) const {
#ifdef KDN_HAVE_CUDA
  if (pool_->kind() == MemoryKind::kDevice) {
    cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

Status MemoryTier::Put(const ChunkRef& chunk) {
  if (chunk->meta.device && !on_device()) {
    return Status::Unsupported(name_ + " tier: a chunk in device memory goes to a device tier only");
  }
  if (Contains(chunk->meta.key)) return Status::Ok();
  const std::uint64_t cost = Cost(*chunk);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ + cost > capacity_) return Status(Code::kBusy, name_ + " tier full");
  }
  const bool whole = KeepsEnvelope(*chunk);
  if (whole && pool_->Holds(chunk->envelope)) {
    // Built in a block of this pool (Reserve): kept as it is.
    auto stored = std::make_shared<Chunk>();
    stored->meta = chunk->meta;
    stored->envelope = chunk->envelope;
    stored->envelope_bytes = chunk->envelope_bytes;
    stored->payload = Payload::Adopt(const_cast<std::uint8_t*>(chunk->payload.data()), chunk->payload.size(),
                                     std::const_pointer_cast<Chunk>(chunk));
    return Insert(std::move(stored), cost);
  }
  const std::uint64_t bytes = whole ? chunk->envelope_bytes : chunk->payload.size();
  Payload block = pool_->Allocate(bytes);
  if (block.empty() && bytes != 0) return Status(Code::kBusy, name_ + " tier: pool full");
  auto stored = std::make_shared<Chunk>();
  stored->meta = chunk->meta;
  stored->meta.device = on_device();
  if (whole) {
    // The envelope as it came, one copy; the payload is where it lies in it.
    CopyIn(block.data(), chunk->envelope, bytes, false);
    const auto offset = static_cast<size_t>(chunk->payload.data() - chunk->envelope);
    auto holder = std::make_shared<Payload>(std::move(block));
    stored->envelope = holder->data();
    stored->envelope_bytes = bytes;
    stored->payload = Payload::Adopt(holder->data() + offset, chunk->payload.size(), holder);
  } else {
    CopyIn(block.data(), chunk->payload.data(), chunk->payload.size(), chunk->meta.device);
    stored->payload = std::move(block);
  }
  return Insert(std::move(stored), cost);
}

Status MemoryTier::Insert(std::shared_ptr<Chunk> stored, std::uint64_t cost) {
  const keys::Digest key = stored->meta.key;
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.count(key)) return Status::Ok();  // a concurrent put won
  if (used_ + cost > capacity_) return Status(Code::kBusy, name_ + " tier full");
  map_.emplace(key, std::move(stored));
  used_ += cost;
  return Status::Ok();
}

Result<ChunkRef> MemoryTier::GetResident(const keys::Digest& key, const ReadContext& /*ctx*/) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return Status::NotFound(name_ + ": no such chunk");
  return it->second;
}

Result<ChunkRef> MemoryTier::Get(const keys::Digest& key, const ReadContext& /*ctx*/) {
  Result<ChunkRef> got = GetResident(key);
  if (!got.ok()) return got.status();
  const ChunkRef& c = *got;
  if (!on_device()) return c;  // host memory: hand out the block itself
  // A device tier (emulated too, so that tests see the same copies): the
  // host gets its own copy.
  auto host = std::make_shared<Chunk>();
  host->meta = c->meta;
  host->meta.device = false;
  host->payload = Payload::Uninitialized(c->payload.size());
  CopyOut(host->payload.data(), c->payload.data(), c->payload.size());
  host_copy_bytes_ += c->payload.size();
  return ChunkRef(std::move(host));
}

bool MemoryTier::Contains(const keys::Digest& key, const ReadContext& /*ctx*/) const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.count(key) != 0;
}

bool MemoryTier::Erase(const keys::Digest& key, const ReadContext& /*ctx*/) {
  ChunkRef dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  used_ -= Cost(*it->second);
  dropped = std::move(it->second);
  map_.erase(it);
  return true;
}

std::vector<ObjectInfo> MemoryTier::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ObjectInfo> out;
  out.reserve(map_.size());
  for (const auto& [key, c] : map_) out.push_back({key, Cost(*c), 0});
  return out;
}

std::uint64_t MemoryTier::used_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

std::uint64_t MemoryTier::objects() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

}  // namespace kdn::store
