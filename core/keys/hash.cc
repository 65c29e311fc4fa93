#include "keys/hash.h"

#include <openssl/evp.h>

#include <bit>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace kdn::keys {
namespace {

EVP_MD_CTX* Ctx(void* p) { return static_cast<EVP_MD_CTX*>(p); }

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

Hasher::Hasher() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(Ctx(ctx_), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL SHA-256 unavailable");  // a broken install: a bug, not input
  }
}

Hasher::~Hasher() { EVP_MD_CTX_free(Ctx(ctx_)); }

Hasher& Hasher::Bytes(const void* data, size_t n) {
  if (n) EVP_DigestUpdate(Ctx(ctx_), data, n);
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
  Digest d{};
  unsigned int n = 0;
  EVP_DigestFinal_ex(Ctx(ctx_), d.data(), &n);
  return d;
}

Digest ModelFingerprint(const ModelIdentity& m) {
  std::uint32_t theta_bits;
  std::memcpy(&theta_bits, &m.rope_theta, 4);
  Hasher h;
  h.Str("kdn-model-v1").U32(m.layers).U32(m.kv_heads).U32(m.head_dim).U32(m.dtype).U32(theta_bits);
  h.U32(m.rope_style).U32(m.rotary_dim).Str(m.fingerprint);
  return h.Finish();
}

Digest ChunkKey(std::uint64_t seed, std::string_view ns, const Digest& model, const Digest& prev,
                std::span<const std::int32_t> tokens) {
  Hasher h;
  h.Str("kdn-chunk-v1").U64(seed).Str(ns).Bytes(model.data(), model.size()).Bytes(prev.data(), prev.size());
  h.Tokens(tokens);
  return h.Finish();
}

}  // namespace kdn::keys
