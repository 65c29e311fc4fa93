#include "store/kv_store.h"

#include <algorithm>

#include "ref/kv_copy_ref.h"

namespace kdn::store {

Result<KvBufferView> ResolveBuffer(const ModelKv& model, const KvBufferView& view, std::uint64_t tokens) {
  if (view.data == nullptr) return Status::InvalidArgument("KV buffer: data is NULL");
  if (view.num_tokens < tokens) {
    return Status::InvalidArgument("KV buffer too small: it holds " + std::to_string(view.num_tokens) +
                                   " tokens, the request has " + std::to_string(tokens));
  }
  if (view.num_tokens > (std::uint64_t{1} << 32)) {
    return Status::InvalidArgument("KV buffer: num_tokens " + std::to_string(view.num_tokens) + " is absurd");
  }
  KvBufferView out = view;
  const kernels::KvStrides& s = view.strides;
  const bool canonical = s.layer == 0 && s.kv == 0 && s.token == 0 && s.head == 0 && s.dim == 0;
  if (canonical) {
    out.strides = kernels::canonical_strides(model.shape, static_cast<std::int64_t>(view.num_tokens));
  } else if (s.layer < 0 || s.kv < 0 || s.token < 0 || s.head < 0 || s.dim < 0) {
    return Status::InvalidArgument("KV buffer: strides must be non-negative");
  } else if (s.layer > (std::int64_t{1} << 40) || s.kv > (std::int64_t{1} << 40) ||
             s.token > (std::int64_t{1} << 40) || s.head > (std::int64_t{1} << 40) ||
             s.dim > (std::int64_t{1} << 40)) {
    return Status::InvalidArgument("KV buffer: a stride exceeds 2^40 elements");
  }
  // The furthest element the layout reaches, in 128 bits: strides up to 2^40
  // times 2^32 tokens overflow 64.
  using U128 = unsigned __int128;
  const kernels::KvShape& sh = model.shape;
  const kernels::KvStrides& st = out.strides;
  const U128 last = U128(sh.layers - 1) * U128(st.layer) + U128(st.kv) + U128(view.num_tokens - 1) * U128(st.token) +
                    U128(sh.heads - 1) * U128(st.head) + U128(sh.head_dim - 1) * U128(st.dim);
  const U128 need = (last + 1) * U128(sh.elem_bytes);
  if (view.num_tokens > 0 && need > U128(view.size_bytes)) {
    return Status::InvalidArgument("KV buffer too small: its layout reaches " +
                                   (need >> 64 ? std::string("beyond 2^64") : std::to_string(static_cast<std::uint64_t>(need))) +
                                   " bytes, size_bytes is " + std::to_string(view.size_bytes));
  }
  return out;
}

KvStore::KvStore(const StoreOptions& options) : options_(options), host_(options.host_capacity_bytes) {}

keys::Digest KvStore::Root(const ModelKv& model, std::string_view ns) const {
  // The key of an empty chunk: distinct from every real chunk's key.
  return keys::ChunkKey(options_.hash_seed, ns, model.fingerprint, keys::Digest{}, {});
}

std::vector<std::uint32_t> KvStore::PartialLengths(const keys::Digest& parent) const {
  std::lock_guard<std::mutex> lock(partial_mu_);
  std::vector<std::uint32_t> lengths;
  if (auto it = partials_.find(parent); it != partials_.end()) {
    for (const auto& [len, count] : it->second) lengths.push_back(len);
  }
  return lengths;
}

void KvStore::RememberPartial(const keys::Digest& key, const keys::Digest& parent, std::uint32_t len) {
  std::lock_guard<std::mutex> lock(partial_mu_);
  if (!partial_parent_.emplace(key, std::make_pair(parent, len)).second) return;  // known already
  ++partials_[parent][len];
}

void KvStore::ForgetPartial(const keys::Digest& key) {
  std::lock_guard<std::mutex> lock(partial_mu_);
  auto it = partial_parent_.find(key);
  if (it == partial_parent_.end()) return;
  const auto [parent, len] = it->second;
  partial_parent_.erase(it);
  auto p = partials_.find(parent);
  if (p == partials_.end()) return;
  // Other partial chunks of the same length under the same parent stay findable.
  if (auto c = p->second.find(len); c != p->second.end() && --c->second == 0) p->second.erase(c);
  if (p->second.empty()) partials_.erase(p);
}

template <typename Probe>
std::uint64_t KvStore::Walk(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens,
                            Probe&& probe) {
  const size_t C = options_.chunk_tokens;
  const keys::Digest root = Root(model, ns);
  keys::Digest prev{};
  size_t pos = 0;
  while (pos < tokens.size()) {
    const size_t left = tokens.size() - pos;
    if (left >= C) {
      const keys::Digest key = keys::ChunkKey(options_.hash_seed, ns, model.fingerprint, prev, tokens.subspan(pos, C));
      if (probe(key, pos, C)) {
        prev = key;
        pos += C;
        continue;
      }
    }
    // A stored partial chunk ends the chain; try the longest that fits.
    std::vector<std::uint32_t> lengths = PartialLengths(pos == 0 ? root : prev);
    std::sort(lengths.rbegin(), lengths.rend());
    for (std::uint32_t len : lengths) {
      if (len > left) continue;
      const keys::Digest key = keys::ChunkKey(options_.hash_seed, ns, model.fingerprint, prev, tokens.subspan(pos, len));
      if (probe(key, pos, len)) {
        pos += len;
        break;
      }
    }
    break;
  }
  return pos;
}

std::uint64_t KvStore::Lookup(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens) {
  ++lookups_;
  return Walk(model, ns, tokens, [&](const keys::Digest& key, size_t, size_t) { return host_.Contains(key); });
}

std::uint64_t KvStore::Store(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens,
                             const KvBufferView& kv) {
  ++stores_;
  const size_t C = options_.chunk_tokens;
  const auto per_token = static_cast<size_t>(model.bytes_per_token());
  const keys::Digest root = Root(model, ns);
  keys::Digest prev{};
  size_t pos = 0;
  // Bytes of this call's chunks. They are the most recently used, so a Put
  // would evict one of them only once this sum exceeds the capacity: stop
  // there, since a chunk is useless once its prefix is gone.
  std::uint64_t call_bytes = 0;
  while (pos < tokens.size()) {
    const size_t len = std::min(C, tokens.size() - pos);
    const std::uint64_t size = len * per_token;
    if (call_bytes + size > options_.host_capacity_bytes) break;
    const keys::Digest key = keys::ChunkKey(options_.hash_seed, ns, model.fingerprint, prev, tokens.subspan(pos, len));
    if (!host_.Touch(key)) {
      auto bytes = std::make_shared<Bytes>(size);
      kernels::kv_gather_cpu(kv.data, kv.strides, model.shape, static_cast<std::int64_t>(pos),
                             static_cast<std::int64_t>(len), bytes->data());
      std::vector<keys::Digest> evicted;
      const bool ok = host_.Put(key, std::move(bytes), [&](const keys::Digest& k) { evicted.push_back(k); });
      for (const auto& k : evicted) ForgetPartial(k);
      if (!ok) break;
      tokens_stored_ += len;
      bytes_stored_ += size;
    }
    call_bytes += size;
    if (len < C) RememberPartial(key, pos == 0 ? root : prev, static_cast<std::uint32_t>(len));
    prev = key;
    pos += len;
  }
  return pos;
}

std::uint64_t KvStore::Retrieve(const ModelKv& model, std::string_view ns, std::span<const std::int32_t> tokens,
                                const KvBufferView& kv) {
  ++retrieves_;
  const auto per_token = static_cast<std::uint64_t>(model.bytes_per_token());
  std::uint64_t chunks = 0;
  const std::uint64_t filled = Walk(model, ns, tokens, [&](const keys::Digest& key, size_t begin, size_t len) {
    Object object = host_.Get(key);  // holds the bytes even if evicted meanwhile
    if (!object || object->size() != len * per_token) return false;
    kernels::kv_scatter_cpu(object->data(), kv.strides, model.shape, static_cast<std::int64_t>(begin),
                            static_cast<std::int64_t>(len), kv.data);
    ++chunks;
    return true;
  });
  hits_ += chunks;
  if (filled < tokens.size()) ++misses_;
  tokens_served_ += filled;
  bytes_served_ += filled * per_token;
  return filled;
}

StoreStats KvStore::Stats() const {
  StoreStats s;
  s.lookups = lookups_;
  s.retrieves = retrieves_;
  s.stores = stores_;
  s.hits = hits_;
  s.misses = misses_;
  s.tokens_served = tokens_served_;
  s.tokens_stored = tokens_stored_;
  s.bytes_served = bytes_served_;
  s.bytes_stored = bytes_stored_;
  s.host = host_.Usage();
  return s;
}

}  // namespace kdn::store
