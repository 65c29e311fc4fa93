// SPDX-License-Identifier: Apache-2.0
// Encryption at rest (issue 37): the KV a tier sends out of the process (a
// disk tier's files, a redis tier's values, what a remote tier puts on a
// node, a node's own disk and redis tiers) is encrypted, so that whoever
// reads those bytes (a stolen disk, a Redis dump, a backup, the node's
// operator for a client's chunks) learns nothing of the KV, from which a
// prompt can be partly reconstructed.
//
// - AES-256-GCM (OpenSSL) of the chunk's payload as its codec left it
//   (compressed, then encrypted), a 12-byte nonce from the system's random
//   source per chunk, the 16-byte tag. The encrypted chunk is one of codec
//   kEncrypted (wire/chunk.capnp `encrypted`), whose payload is
//     magic   "KDNAES1" and a zero byte                    8 bytes
//     codec   the codec it encrypts, u16 little-endian    2
//     zero    2 bytes, 0
//     key id  which master key (below)                     8
//     nonce                                                12
//     the ciphertext (as long as what it encrypts), then the tag (16),
//   so it travels in an envelope like any codec's payload (its checksums,
//   the seal), a node stores it without opening it, and a kdn that
//   predates it refuses it as an unknown codec rather than read it as KV.
// - A key per namespace: HKDF-SHA256 of the master key (salt "kdn at-rest
//   v1", info the namespace's 32-byte hash), so one tenant's key opens no
//   other's chunks and a key can be derived only by holders of the master.
// - The tag also authenticates the chunk's description (model, namespace,
//   chunk key, codec, dtype, shape, first position, edited, and the
//   payload's header above: AdditionalData below): ciphertext moved under another
//   key, namespace or shape does not open. A chunk that does not open is a
//   miss, counted where seal failures are (TierCounters::auth_failures).
// - The master keys: a ring, read from a file or an environment variable
//   (never a config value, which gets logged), one key per line as 64 hex
//   digits (32 bytes); blank lines and lines starting with '#' are skipped.
//   The first key encrypts; every key decrypts. Rotation: put a new key
//   first and restart (kdnd: or SIGHUP); chunks written under the old one
//   stay readable while it is on the ring, until they are re-written or
//   evicted; take it off and they are misses.
// - A key's id (in each encrypted payload) is the
//   first 8 bytes of SHA-256("kdn at-rest key id v1" || master key): it
//   says which master key to use and reveals nothing of it.
// - Nonces are random: NIST SP 800-38D bounds a key at 2^32 of them, here
//   2^32 chunks per namespace per master key (at 1 MiB a chunk, 4 PiB),
//   beyond which the master key must be rotated.
//
// Thread-safety: a ChunkCipher is immutable but for a cache of derived
// keys behind a mutex; Encrypt and Decrypt may run on any threads at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/chunk/chunk.h"
#include "core/keys/hash.h"
#include "core/util/status.h"

namespace kdn::wire {

inline constexpr size_t kMasterKeyBytes = 32;
// The encrypted payload's header and tag: it is this much longer than what
// it encrypts.
inline constexpr size_t kEncryptedHeaderBytes = 32;
inline constexpr size_t kEncryptionTagBytes = 16;
inline constexpr size_t kEncryptionOverhead = kEncryptedHeaderBytes + kEncryptionTagBytes;
using KeyId = std::array<std::uint8_t, 8>;
using SymmetricKey = std::array<std::uint8_t, 32>;

// A master key's id (see above).
KeyId MasterKeyId(const std::uint8_t* master);
// A namespace's key under a master key (HKDF-SHA256, see above).
SymmetricKey NamespaceKey(const std::uint8_t* master, const keys::Digest& ns_hash);
// The bytes the tag authenticates besides the ciphertext: "kdn at-rest v1",
// the chunk's model, namespace hash and key, then little-endian the codec
// encrypted (u16), dtype u16, layers, kv_heads, head_dim, tokens (u32
// each), first_position i64, edited u8, then the payload's header (32 bytes).
std::vector<std::uint8_t> AdditionalData(const chunk::ChunkMeta& meta, codec::CodecId encrypted,
                                         const std::uint8_t* header);
// The key id of an encrypted chunk's payload (false: not one, or too short).
bool EncryptedKeyId(const chunk::Chunk& chunk, KeyId* id);

class ChunkCipher {
 public:
  ~ChunkCipher();
  ChunkCipher(const ChunkCipher&) = delete;
  ChunkCipher& operator=(const ChunkCipher&) = delete;

  // The ring from its text (the format above); `source` names where it came
  // from in errors (never the keys). kInvalidArgument: no key, a line that
  // is not 64 hex digits, the same key twice.
  static Result<std::shared_ptr<const ChunkCipher>> FromText(std::string text, const std::string& source);
  // From a file readable by the service only (one others may read or
  // write is refused, as a secret file is).
  static Result<std::shared_ptr<const ChunkCipher>> FromFile(const std::string& path);
  // From an environment variable's value (the variable is named, not given).
  static Result<std::shared_ptr<const ChunkCipher>> FromEnv(const std::string& variable);
  // From the one of the two that is given (null when neither is; both
  // given: kInvalidArgument).
  static Result<std::shared_ptr<const ChunkCipher>> Load(const std::string& file, const std::string& env_variable);

  // A copy of `chunk` encrypted under the first key and its namespace's key:
  // codec kEncrypted, the payload kEncryptionOverhead bytes longer.
  // kInvalidArgument for a chunk encrypted already or one on a device.
  Result<chunk::ChunkRef> Encrypt(const chunk::Chunk& chunk) const;
  // The chunk decrypted: the codec it encrypted, its payload (a chunk that
  // is not encrypted is returned as it is). With `in_place` the plaintext
  // overwrites the ciphertext (the caller holds the only reference to those
  // bytes: a buffer it has just read into) and the chunk shares them.
  // kCorrupt: a key id this ring does not hold, a header that is not one,
  // or a tag that does not match (other bytes, another description,
  // another namespace's key).
  Result<chunk::ChunkRef> Decrypt(const chunk::ChunkRef& chunk, bool in_place = false) const;

  // Whether a key of the ring has this id.
  bool Holds(const KeyId& id) const;
  // The id of the key that encrypts (the first).
  const KeyId& key_id() const { return masters_.front().id; }
  size_t keys() const { return masters_.size(); }
  // Namespace keys derived and kept now (at most kMaxDerivedKeys).
  size_t derived_keys() const;
  static constexpr size_t kMaxDerivedKeys = 4096;

 private:
  struct Master {
    KeyId id{};
    SymmetricKey key{};
  };
  explicit ChunkCipher(std::vector<Master> masters) : masters_(std::move(masters)) {}
  const Master* Find(const KeyId& id) const;
  SymmetricKey KeyFor(const Master& m, const keys::Digest& ns_hash) const;

  std::vector<Master> masters_;
  // Derived namespace keys, by key id then namespace hash (bounded: cleared
  // when it holds kMaxDerivedKeys).
  mutable std::mutex mu_;
  mutable std::map<std::pair<KeyId, keys::Digest>, SymmetricKey> derived_;
};

// What a tier that sends chunks out of the process (disk, redis, remote; a
// node's own) does with them, with its cipher (null: none):
// - ToRest, before storing one: encrypted (a chunk encrypted already, a
//   client's on a node, as it is); without a cipher, as it is.
Result<chunk::ChunkRef> ToRest(const chunk::ChunkRef& chunk, const ChunkCipher* cipher);
// - The bytes it then stores of a chunk's `payload_bytes` (before ToRest).
std::uint64_t AtRestPayloadBytes(const chunk::Chunk& chunk, const ChunkCipher* cipher);
// - FromRest, after reading one back: a chunk not encrypted as it is; one
//   encrypted under a key of the cipher's ring decrypted (`in_place` as
//   Decrypt). Otherwise kCorrupt (a miss the tier counts with its seal
//   failures: TierCounters::auth_failures), unless `pass_through`: a node
//   keeps what it cannot open as it is, for the client that can (one that
//   does not open under its own key either: the node may share the key of
//   clients whose chunks it holds, whose description it changed).
Result<chunk::ChunkRef> FromRest(const chunk::ChunkRef& chunk, const ChunkCipher* cipher, bool pass_through,
                                 bool in_place = false);

}  // namespace kdn::wire
