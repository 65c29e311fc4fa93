// SPDX-License-Identifier: Apache-2.0
// Authenticated chunk envelopes for tiers that others can write (issue 31):
// with a deployment secret, a tier appends to each envelope it stores a
// trailer with a keyed MAC over every byte of the envelope (its header: the
// model fingerprint, the namespace's hash, the chunk key, codec, shape and
// position; its payload; both checksums), and a reader that holds the same
// secret takes only envelopes whose MAC it can recompute. Without the secret
// nobody can make one: a value planted in Redis or a file dropped in a disk
// tier's directory, its XXH3 checksums recomputed, is a miss, not KV.
//
// Sealed bytes = envelope || trailer (48 bytes):
//   magic   "KDNSEAL1"                                   8 bytes
//   key id  the first 8 bytes of SHA-256("kdn seal key id v1" || secret):
//           says which secret sealed it (a reader with another says so)
//   salt    16 random bytes, fresh per seal
//   tag     AES-256-GMAC of the envelope (GCM, empty plaintext, the
//           envelope as additional data, IV of 12 zero bytes) under the
//           chunk's own key HMAC-SHA256(secret, "kdn seal v1" || salt)
// A key per seal (from the salt) rather than one key with random IVs: no
// limit on the number of chunks one secret seals. GMAC rather than
// HMAC-SHA256 over the payload for speed (this machine: AES-256-GCM 4.7
// GB/s, SHA-256 1.7 GB/s, `openssl speed`); the key derivation is HMAC.
// The envelope's length comes from its own Cap'n Proto segment table, so the
// split is exact: whatever follows the message is the trailer or an error.
//
// Thread-safety: a ChunkSealer is immutable; Seal and Open may run on any
// threads at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/util/status.h"

namespace kdn::wire {

inline constexpr size_t kSealTrailerBytes = 48;

class ChunkSealer {
 public:
  // The secret: at least 32 bytes (e.g. `head -c 32 /dev/urandom`), at most
  // 4096, taken as they are (a trailing newline included).
  static Result<std::shared_ptr<const ChunkSealer>> FromSecret(std::string secret);
  // The secret read from a file (which should be readable by the service
  // only: a secret in a file that others can read is refused).
  static Result<std::shared_ptr<const ChunkSealer>> FromFile(const std::string& path);

  // Writes the trailer of `envelope` (n bytes) into trailer[0, 48).
  Status Seal(const std::uint8_t* envelope, size_t n, std::uint8_t* trailer) const;
  // Checks sealed bytes: the envelope must be followed by exactly its
  // trailer, sealed with this secret, its MAC right. On success
  // *envelope_bytes is the envelope's length (the bytes to decode).
  // kCorrupt: no trailer, a trailer of another secret, a wrong MAC, or bytes
  // that are no envelope.
  Status Open(const std::uint8_t* data, size_t size, size_t* envelope_bytes) const;
  // Checks a trailer kept apart from the bytes it seals (a node's reply
  // carries it beside the envelope): kCorrupt as Open.
  Status Check(const std::uint8_t* bytes, size_t n, const std::uint8_t* trailer, size_t trailer_size) const;

  const std::array<std::uint8_t, 8>& key_id() const { return key_id_; }

 private:
  explicit ChunkSealer(std::string secret);
  Status Tag(const std::uint8_t* salt, const std::uint8_t* envelope, size_t n, std::uint8_t* tag) const;

  std::string secret_;
  std::array<std::uint8_t, 8> key_id_{};
};

// The bytes of a file only the service may read: a regular file that others
// may neither read nor write (its group may read it), of at most
// `max_bytes`. kInvalidArgument otherwise, naming the file as `what` (e.g.
// "the secret file /etc/kdn/secret") and saying why. For secrets and keys.
Result<std::string> ReadPrivateFile(const std::string& path, size_t max_bytes, const std::string& what);

// The length of the Cap'n Proto message whose stream framing begins at p
// (n bytes of it read), from its segment table alone: the count, then each
// segment's length in words; nullopt when the table is not whole in those
// bytes or has more segments than Cap'n Proto's readers take (512). The
// message itself may run past the n bytes (a file's first block).
std::optional<std::uint64_t> FramedMessageBytes(const std::uint8_t* p, size_t n);
// The same for a whole buffer: the message must lie within it; kCorrupt if
// it does not, or there is no table.
Result<size_t> EnvelopeBytes(const std::uint8_t* data, size_t size);

// For a reader without a secret (which takes what its tier holds): the
// envelope's bytes of a value that may carry a seal (a trailer of the right
// size and magic after the message: its length; else `size`, all of it).
// The seal itself is not checked: without the secret it cannot be.
size_t EnvelopeBytesIgnoringSeal(const std::uint8_t* data, size_t size);

// Whether `size` bytes end in what looks like a seal's trailer (its magic
// 48 bytes from the end); not checked. For files sealed whole (a runtime's
// knowledge index), read by a reader without the secret.
bool EndsInSeal(const std::uint8_t* data, size_t size);

}  // namespace kdn::wire
