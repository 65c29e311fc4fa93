// SPDX-License-Identifier: Apache-2.0
// Deterministic keys: SHA-256 (OpenSSL) over canonical little-endian byte
// encodings with a domain tag and an explicit seed, so every process,
// language and machine derives the same key from the same inputs.
// Thread-safety: pure functions; Hasher objects are single-threaded.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kdn::keys {

using Digest = std::array<std::uint8_t, 32>;

// The hash of a digest in kdn's hash tables. Keys reach those tables from
// clients (a kdnd tenant's puts, lookups and documents name keys of their
// choosing), so the value is a keyed hash (XXH3 under a secret drawn at
// process start), never bytes of the digest itself: keys crafted to share
// their leading bytes would otherwise all land in one bucket and make each
// insert and find cost the whole table. Values differ between processes.
struct DigestHash {
  size_t operator()(const Digest& d) const noexcept;
};

std::string ToHex(const Digest& d);

// Incremental SHA-256 over a canonical encoding.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  Hasher& Bytes(const void* data, size_t n);
  Hasher& U32(std::uint32_t v);
  Hasher& U64(std::uint64_t v);
  // Length (u64) then bytes: unambiguous concatenation.
  Hasher& Str(std::string_view s);
  Hasher& Tokens(std::span<const std::int32_t> tokens);  // count (u64) then u32 LE each
  Digest Finish();

 private:
  void Flush();
  void* ctx_;  // EVP_MD_CTX: the thread's cached one, or its own when that is in use
  bool owned_ = false;
  // Small fields are gathered here and handed to OpenSSL in one update:
  // per-call overhead would otherwise cost more than hashing a chunk.
  std::uint8_t pending_[256];
  size_t pending_size_ = 0;
};

// Everything that separates one model's KV from another's.
struct ModelIdentity {
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0, dtype = 0;
  float rope_theta = 10000.0f;
  std::uint32_t rope_style = 0, rotary_dim = 0;
  std::string fingerprint;
  // What a layer caches (kdn_cache_kind: 0 K and V, 1 a latent vector) and,
  // for a latent, its dims and RoPE dims. A K/V model's identity is hashed
  // as before these existed (its fingerprint unchanged); any other kind's
  // under its own tag, so its chunks never reach a K/V model.
  std::uint32_t cache_kind = 0, latent_dim = 0, latent_rope_dim = 0;
  // Layer groups (engine/groups.h): each attention layer's sliding window
  // (0: full attention; empty: all full) and the recurrent layers' state. A
  // model with neither is hashed as before they existed; one with either
  // gains a second hash over the first, so its chunks reach no model that
  // declares other groups.
  std::vector<std::uint32_t> layer_windows{};
  std::uint32_t state_layers = 0;
  std::uint64_t state_bytes = 0;
};
Digest ModelFingerprint(const ModelIdentity& m);

// key_i = H("kdn-chunk-v1", seed, ns, model, key_{i-1}, tokens_i); key_{-1} = zeros.
Digest ChunkKey(std::uint64_t seed, std::string_view ns, const Digest& model, const Digest& prev,
                std::span<const std::int32_t> tokens);

// The chain's key_{-1}: 32 zero bytes for a request without a salt (the
// keys are those of every earlier version), else H("kdn-salt-v1", salt),
// the salt as a string (u64 length + bytes). Each key hashes the one before
// it, so the salt enters every chunk key of the request (vLLM's
// `cache_salt`: salted requests hit only KV stored with the same salt).
Digest ChainStart(std::span<const std::uint8_t> salt);

// The same chain over an engine's own block hashes (a chunk is N engine
// blocks): H("kdn-chunk-blocks-v1", seed, ns, model, key_{i-1}, hash_bytes, hashes).
Digest ChunkKeyFromBlocks(std::uint64_t seed, std::string_view ns, const Digest& model, const Digest& prev,
                          std::span<const std::uint8_t> block_hashes, std::uint32_t hash_bytes);

// ChunkKey and ChunkKeyFromBlocks for one (seed, ns, model), as a walk over
// a request's chunks computes them: the encoding's head (tag, seed, ns,
// model) is absorbed once, and each key resumes from that state, so a key
// hashes little more than its previous key and its tokens. Each thread keeps
// the head states of the last (seed, ns, model) it made a keyer for, so that
// a walk of a short prefix does not pay for absorbing them again. Same values
// as the functions above (tests/keys checks it). Thread-safety: const members
// may be called concurrently; keyers may be made on any thread.
class ChunkKeyer {
 public:
  ChunkKeyer(std::uint64_t seed, std::string_view ns, const Digest& model);
  Digest Key(const Digest& prev, std::span<const std::int32_t> tokens) const;
  Digest KeyFromBlocks(const Digest& prev, std::span<const std::uint8_t> block_hashes, std::uint32_t hash_bytes) const;

 private:
  // SHA-256 states after each encoding's head (OpenSSL's SHA256_CTX, kept
  // as bytes so that this header does not include OpenSSL's).
  alignas(8) std::array<std::uint8_t, 112> tokens_head_{}, blocks_head_{};
};

// Position-free key of a chunk's tokens alone (knowledge items, blending):
// H("kdn-content-v1", seed, ns, model, tokens).
Digest ContentKey(std::uint64_t seed, std::string_view ns, const Digest& model, std::span<const std::int32_t> tokens);

// SHA-256 of a namespace, as chunk envelopes record it.
Digest NamespaceHash(std::string_view ns);

}  // namespace kdn::keys
