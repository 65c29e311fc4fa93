// The KV store of a runtime: splits token sequences into chunks, keys them by
// chained hashes, keeps them in the host tier, and moves KV between callers'
// strided buffers and canonical chunks.
//
// A trailing partial chunk is stored too, and indexed under its parent (the
// previous chunk's key, or the root of the namespace and model), so a later,
// longer request that starts with the same tokens reuses it.
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/kv_copy.h"
#include "keys/hash.h"
#include "store/host_tier.h"
#include "util/status.h"

namespace kdn::store {

// A registered model as the store sees it.
struct ModelKv {
  keys::Digest fingerprint{};
  kernels::KvShape shape;
  std::int64_t bytes_per_token() const { return shape.layers * 2 * shape.heads * shape.head_dim * shape.elem_bytes; }
};

// A caller's KV buffer: base pointer, reachable bytes, tokens held, strides.
struct KvBufferView {
  void* data = nullptr;
  std::uint64_t size_bytes = 0;
  std::uint64_t num_tokens = 0;
  kernels::KvStrides strides;  // all zero = canonical for num_tokens
};

// Checks a buffer against a model and a request of `tokens` tokens, and
// resolves zero strides to canonical ones.
Result<KvBufferView> ResolveBuffer(const ModelKv& model, const KvBufferView& view, std::uint64_t tokens);

struct StoreOptions {
  std::uint32_t chunk_tokens = 256;
  std::uint64_t host_capacity_bytes = std::uint64_t{1} << 30;
  std::uint64_t hash_seed = 0;
};

struct StoreStats {
  std::uint64_t lookups = 0, retrieves = 0, stores = 0, hits = 0, misses = 0;
  std::uint64_t tokens_served = 0, tokens_stored = 0, bytes_served = 0, bytes_stored = 0;
  TierUsage host;
};

class KvStore {
 public:
  explicit KvStore(const StoreOptions& options);
  const StoreOptions& options() const { return options_; }

  // Leading tokens cached; no side effects but the lookup counter.
  std::uint64_t Lookup(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens);
  // Stores the KV of `tokens` from `kv` (already resolved); returns the
  // leading tokens cached afterwards. When the sequence does not fit the tier
  // it stores the longest prefix that does, never evicting its own chunks.
  std::uint64_t Store(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens,
                      const KvBufferView& kv);
  // Writes the longest cached prefix into `kv` (already resolved); returns its length.
  std::uint64_t Retrieve(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens,
                         const KvBufferView& kv);
  StoreStats Stats() const;

 private:
  keys::Digest Root(const ModelKv& model, std::string_view ns) const;
  std::vector<std::uint32_t> PartialLengths(const keys::Digest& parent) const;
  void RememberPartial(const keys::Digest& key, const keys::Digest& parent, std::uint32_t len);
  void ForgetPartial(const keys::Digest& key);
  // Walks the cached prefix; probe(key, token_begin, tokens) says whether the
  // chunk is there (and may consume it). Returns the tokens walked.
  template <typename Probe>
  std::uint64_t Walk(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens, Probe&& probe);

  const StoreOptions options_;
  HostTier host_;
  mutable std::mutex partial_mu_;  // never held while calling into host_
  // parent -> (length -> how many partial chunks of that length it has)
  std::unordered_map<keys::Digest, std::map<std::uint32_t, std::uint32_t>, keys::DigestHash>
      partials_;  // guarded by partial_mu_
  std::unordered_map<keys::Digest, std::pair<keys::Digest, std::uint32_t>, keys::DigestHash>
      partial_parent_;  // guarded by partial_mu_
  std::atomic<std::uint64_t> lookups_{0}, retrieves_{0}, stores_{0}, hits_{0}, misses_{0};
  std::atomic<std::uint64_t> tokens_served_{0}, tokens_stored_{0}, bytes_served_{0}, bytes_stored_{0};
};

}  // namespace kdn::store
