// SPDX-License-Identifier: Apache-2.0
#include "core/keys/hash.h"

// SHA256_Init and friends are deprecated in OpenSSL 3 in favour of EVP, but
// ChunkKeyer needs what only they give: a digest state that is a plain
// struct, copied in a few nanoseconds. EVP_MD_CTX_copy_ex allocates a
// provider context per copy: a 512-chunk walk took 4% longer with it.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <sys/random.h>
#include <xxhash.h>

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace kdn::keys {
namespace {

EVP_MD_CTX* Ctx(void* p) { return static_cast<EVP_MD_CTX*>(p); }

// SHA-256 fetched once: OpenSSL 3 looks an algorithm up on every
// EVP_sha256() init otherwise, which costs more than hashing a chunk's tokens.
const EVP_MD* Sha256() {
  static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md ? md : EVP_sha256();
}

}  // namespace

std::string ToHex(const Digest& d) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (auto b : d) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

namespace {

// One digest context per thread, reused by its hashers (allocating and
// freeing one per chunk key shows in lookups of long prefixes).
struct ThreadCtx {
  EVP_MD_CTX* ctx = nullptr;
  bool busy = false;
  ~ThreadCtx() { EVP_MD_CTX_free(ctx); }
};
thread_local ThreadCtx t_ctx;

}  // namespace

Hasher::Hasher() {
  if (!t_ctx.busy) {
    if (!t_ctx.ctx) t_ctx.ctx = EVP_MD_CTX_new();
    ctx_ = t_ctx.ctx;
    t_ctx.busy = true;
  } else {
    ctx_ = EVP_MD_CTX_new();
    owned_ = true;
  }
  if (!ctx_ || EVP_DigestInit_ex(Ctx(ctx_), Sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL SHA-256 unavailable");  // a broken install: a bug, not input
  }
}

Hasher::~Hasher() {
  if (owned_) {
    EVP_MD_CTX_free(Ctx(ctx_));
  } else {
    t_ctx.busy = false;
  }
}

void Hasher::Flush() {
  if (pending_size_) EVP_DigestUpdate(Ctx(ctx_), pending_, pending_size_);
  pending_size_ = 0;
}

Hasher& Hasher::Bytes(const void* data, size_t n) {
  if (n == 0) return *this;  // data may be null then
  if (n <= sizeof pending_ - pending_size_) {
    std::memcpy(pending_ + pending_size_, data, n);
    pending_size_ += n;
    return *this;
  }
  Flush();
  if (n < sizeof pending_) {
    std::memcpy(pending_, data, n);
    pending_size_ = n;
  } else {
    EVP_DigestUpdate(Ctx(ctx_), data, n);
  }
  return *this;
}

Hasher& Hasher::U32(std::uint32_t v) {
  const std::uint8_t b[4] = {static_cast<std::uint8_t>(v), static_cast<std::uint8_t>(v >> 8),
                             static_cast<std::uint8_t>(v >> 16), static_cast<std::uint8_t>(v >> 24)};
  return Bytes(b, 4);
}

Hasher& Hasher::U64(std::uint64_t v) {
  U32(static_cast<std::uint32_t>(v));
  return U32(static_cast<std::uint32_t>(v >> 32));
}

Hasher& Hasher::Str(std::string_view s) {
  U64(s.size());
  return Bytes(s.data(), s.size());
}

Hasher& Hasher::Tokens(std::span<const std::int32_t> tokens) {
  U64(tokens.size());
  // Little-endian u32 per token; on little-endian hosts that is the memory image.
  static_assert(std::endian::native == std::endian::little, "big-endian hosts need a byte swap here");
  return Bytes(tokens.data(), tokens.size_bytes());
}

Digest Hasher::Finish() {
  Flush();
  Digest d{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(Ctx(ctx_), d.data(), &n);
  return d;
}

namespace {
Digest KindFingerprint(const ModelIdentity& m);
}  // namespace

Digest ModelFingerprint(const ModelIdentity& m) {
  const Digest base = KindFingerprint(m);
  bool windows = false;
  for (std::uint32_t w : m.layer_windows) windows = windows || w != 0;
  if (!windows && m.state_layers == 0) return base;
  Hasher h;
  h.Str("kdn-model-groups-v1").Bytes(base.data(), base.size()).U64(windows ? m.layer_windows.size() : 0);
  if (windows) {
    for (std::uint32_t w : m.layer_windows) h.U32(w);
  }
  h.U32(m.state_layers).U64(m.state_bytes);
  return h.Finish();
}

namespace {
Digest KindFingerprint(const ModelIdentity& m) {
  std::uint32_t theta_bits;
  std::memcpy(&theta_bits, &m.rope_theta, 4);
  Hasher h;
  if (m.cache_kind == 0) {
    h.Str("kdn-model-v1").U32(m.layers).U32(m.kv_heads).U32(m.head_dim).U32(m.dtype).U32(theta_bits);
    h.U32(m.rope_style).U32(m.rotary_dim).Str(m.fingerprint);
    return h.Finish();
  }
  h.Str("kdn-model-kind-v1").U32(m.cache_kind).U32(m.layers).U32(m.kv_heads).U32(m.head_dim).U32(m.dtype);
  h.U32(theta_bits).U32(m.rope_style).U32(m.rotary_dim).U32(m.latent_dim).U32(m.latent_rope_dim).Str(m.fingerprint);
  return h.Finish();
}
}  // namespace

Digest ChunkKey(std::uint64_t seed, std::string_view ns, const Digest& model, const Digest& prev,
                std::span<const std::int32_t> tokens) {
  Hasher h;
  h.Str("kdn-chunk-v1").U64(seed).Str(ns).Bytes(model.data(), model.size()).Bytes(prev.data(), prev.size());
  h.Tokens(tokens);
  return h.Finish();
}

Digest ChainStart(std::span<const std::uint8_t> salt) {
  if (salt.empty()) return Digest{};
  Hasher h;
  h.Str("kdn-salt-v1").Str(std::string_view(reinterpret_cast<const char*>(salt.data()), salt.size()));
  return h.Finish();
}

Digest ChunkKeyFromBlocks(std::uint64_t seed, std::string_view ns, const Digest& model, const Digest& prev,
                          std::span<const std::uint8_t> block_hashes, std::uint32_t hash_bytes) {
  Hasher h;
  h.Str("kdn-chunk-blocks-v1").U64(seed).Str(ns).Bytes(model.data(), model.size()).Bytes(prev.data(), prev.size());
  h.U32(hash_bytes).U64(block_hashes.size()).Bytes(block_hashes.data(), block_hashes.size());
  return h.Finish();
}

Digest ContentKey(std::uint64_t seed, std::string_view ns, const Digest& model, std::span<const std::int32_t> tokens) {
  Hasher h;
  h.Str("kdn-content-v1").U64(seed).Str(ns).Bytes(model.data(), model.size());
  h.Tokens(tokens);
  return h.Finish();
}

namespace {

static_assert(sizeof(SHA256_CTX) <= 112, "ChunkKeyer's head state holds a SHA256_CTX");

void PutU64(std::uint8_t* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// The SHA-256 state after Str(tag), U64(seed), Str(ns), model.
void HeadState(std::string_view tag, std::uint64_t seed, std::string_view ns, const Digest& model, void* state) {
  auto* ctx = static_cast<SHA256_CTX*>(state);
  std::uint8_t n[8];
  SHA256_Init(ctx);
  PutU64(n, tag.size());
  SHA256_Update(ctx, n, 8);
  SHA256_Update(ctx, tag.data(), tag.size());
  PutU64(n, seed);
  SHA256_Update(ctx, n, 8);
  PutU64(n, ns.size());
  SHA256_Update(ctx, n, 8);
  SHA256_Update(ctx, ns.data(), ns.size());
  SHA256_Update(ctx, model.data(), model.size());
}

// The head states of the last (seed, ns, model) this thread made a keyer
// for. A store's walks mostly repeat it (one namespace, one model), and
// absorbing the two heads again cost a fifth of a 256-token chunk's key: a
// fixed cost of every lookup, store and get. Plain bytes, without a
// destructor, so that a keyer made during the thread's exit (a static
// destructor that walks a store) still finds it valid; longer namespaces
// are not kept.
struct HeadMemo {
  bool valid = false;
  std::uint64_t seed = 0;
  Digest model{};
  size_t ns_size = 0;
  char ns[128];
  alignas(8) std::array<std::uint8_t, 112> tokens_head, blocks_head;
};
static_assert(std::is_trivially_destructible_v<HeadMemo>);
thread_local HeadMemo t_heads;

}  // namespace

ChunkKeyer::ChunkKeyer(std::uint64_t seed, std::string_view ns, const Digest& model) {
  HeadMemo& m = t_heads;
  const bool kept = m.valid && m.seed == seed && m.model == model && std::string_view(m.ns, m.ns_size) == ns;
  if (!kept) {
    HeadState("kdn-chunk-v1", seed, ns, model, tokens_head_.data());
    HeadState("kdn-chunk-blocks-v1", seed, ns, model, blocks_head_.data());
    if (ns.size() > sizeof m.ns) return;
    m.seed = seed;
    m.model = model;
    m.ns_size = ns.size();
    if (!ns.empty()) std::memcpy(m.ns, ns.data(), ns.size());
    m.tokens_head = tokens_head_;
    m.blocks_head = blocks_head_;
    m.valid = true;
    return;
  }
  tokens_head_ = m.tokens_head;
  blocks_head_ = m.blocks_head;
}

Digest ChunkKeyer::Key(const Digest& prev, std::span<const std::int32_t> tokens) const {
  SHA256_CTX ctx;
  std::memcpy(&ctx, tokens_head_.data(), sizeof ctx);
  // The previous key and the token count in one update, then the tokens in place.
  std::uint8_t pn[40];
  std::memcpy(pn, prev.data(), 32);
  PutU64(pn + 32, tokens.size());
  SHA256_Update(&ctx, pn, sizeof pn);
  static_assert(std::endian::native == std::endian::little, "big-endian hosts need a byte swap here");
  SHA256_Update(&ctx, tokens.data(), tokens.size_bytes());
  Digest d{};
  SHA256_Final(d.data(), &ctx);
  return d;
}

Digest ChunkKeyer::KeyFromBlocks(const Digest& prev, std::span<const std::uint8_t> block_hashes,
                                 std::uint32_t hash_bytes) const {
  SHA256_CTX ctx;
  std::memcpy(&ctx, blocks_head_.data(), sizeof ctx);
  std::uint8_t pn[44];
  std::memcpy(pn, prev.data(), 32);
  for (int i = 0; i < 4; ++i) pn[32 + i] = static_cast<std::uint8_t>(hash_bytes >> (8 * i));
  PutU64(pn + 36, block_hashes.size());
  SHA256_Update(&ctx, pn, sizeof pn);
  SHA256_Update(&ctx, block_hashes.data(), block_hashes.size());
  Digest d{};
  SHA256_Final(d.data(), &ctx);
  return d;
}

Digest NamespaceHash(std::string_view ns) {
  Hasher h;
  h.Str("kdn-namespace-v1").Str(ns);
  return h.Finish();
}

namespace {
// XXH3's secret: 192 random bytes (it needs at least XXH3_SECRET_SIZE_MIN).
struct HashSecret {
  alignas(64) std::uint8_t bytes[192];
  HashSecret() {
    size_t got = 0;
    while (got < sizeof bytes) {
      const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
      else if (n < 0 && errno != EINTR) break;
    }
    if (got < sizeof bytes) {  // no getrandom (an old kernel): std::random_device
      std::random_device rd;
      for (size_t i = got; i < sizeof bytes; ++i) bytes[i] = static_cast<std::uint8_t>(rd());
    }
  }
};
}  // namespace

size_t DigestHash::operator()(const Digest& d) const noexcept {
  static const HashSecret secret;
  return static_cast<size_t>(XXH3_64bits_withSecret(d.data(), d.size(), secret.bytes, sizeof secret.bytes));
}

}  // namespace kdn::keys
