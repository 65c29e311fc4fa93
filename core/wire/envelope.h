// SPDX-License-Identifier: Apache-2.0
// The chunk envelope (wire/chunk.capnp): how one chunk is stored as bytes,
// on disk and on the network. Decoding checks everything a reader can check
// (format version, both checksums, the payload size against the shape and
// dtype, the key, the codec) and never throws: a malformed buffer is a
// kCorrupt status, a newer format or an unknown codec kUnsupported.
//
// The envelope carries the payload as stored: the canonical KV for the raw
// codec, a codec's payload otherwise (ChunkMeta::codec). A raw payload's size
// is checked against the shape and dtype here; an encoded payload is checked
// here by its checksum only, and against the shape, dtype and codec by the
// codec when it is decoded (chunk::DecodeChunk, which every read through the
// chain does): an envelope never turns into KV of another shape.
// Thread-safety: pure functions; no shared mutable state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/keys/hash.h"
#include "core/chunk/chunk.h"
#include "core/util/status.h"

namespace kdn::wire {

// The format this code writes. It reads every 1.x (ignoring fields added by
// newer minors) and refuses 2.0 and later.
inline constexpr std::uint16_t kEnvelopeVersionMajor = 1;
inline constexpr std::uint16_t kEnvelopeVersionMinor = 0;
// Payloads are stored in pieces of this size (the last one shorter): a Cap'n
// Proto Data holds less than 512 MiB.
inline constexpr std::uint64_t kPayloadPieceBytes = std::uint64_t{1} << 28;

// The schema's Codec; equal to codec::CodecId (asserted in envelope.cc).
enum class Codec : std::uint16_t { kRaw = 0, kFp8 = 1, kInt8 = 2, kKivi2 = 3, kCacheGen = 4, kKdn = 5, kZstd = 6, kTc = 7, kEncrypted = 8 };
inline constexpr std::uint16_t kLastKnownCodec = static_cast<std::uint16_t>(Codec::kEncrypted);
enum class ChecksumAlgorithm : std::uint16_t { kXxh3 = 0 };

// The bytes EncodeEnvelope produces for a payload of `payload_bytes`: a pure
// function of the size (fixed header, piece pointers, payload rounded up to
// whole words), so a tier can account for an object without encoding it.
std::uint64_t EncodedEnvelopeSize(std::uint64_t payload_bytes);

// Frames a chunk as it is stored (meta.codec says how its payload encodes
// the KV; this does no encoding). The payload is copied once, straight into
// the output (the message is built in place in a buffer of the exact size).
// kInvalidArgument when the dtype or the codec is unknown, the shape
// overflows, a raw payload does not match the shape and dtype, or an encoded
// payload is empty.
Result<chunk::Bytes> EncodeEnvelope(const chunk::Chunk& chunk);
// The same into `out`: `size` bytes, exactly EncodedEnvelopeSize(payload),
// word-aligned and zero-filled (a message builder requires both), e.g. a
// page-aligned buffer for an O_DIRECT write.
Status EncodeEnvelopeInto(const chunk::Chunk& chunk, std::uint8_t* out, std::uint64_t size);
// The same into a word-aligned buffer that may hold old bytes (a reused
// one): only what the payload copy does not overwrite (the header, each
// piece's padding) is zeroed first, not the whole buffer. With `copied`,
// calls it as the payload is copied in (every 64 KiB): the bytes of `out`
// from the payload's start up to offset `end` are then final; the header
// before the payload is final only when this returns. A writer can send the
// payload on its way while the rest is still being copied.
Status EncodeEnvelopeOver(const chunk::Chunk& chunk, std::uint8_t* out, std::uint64_t size,
                          const std::function<void(std::uint64_t end)>& copied = nullptr);

// Decodes and checks an envelope, returning the chunk as stored (its payload
// still encoded when meta.codec is not raw). `data` need not be aligned (an unaligned
// buffer costs one copy). With `expected_key`, an envelope holding another
// key is kCorrupt (a misplaced object). The payload is copied once into the
// returned chunk, unless `owner` (which keeps `data` alive) is given: then a
// payload of one piece (up to 256 MiB) stays in `data`, shared by the chunk
// (16-byte aligned when `data` is 64-byte aligned).
//
// With `checksum`, a payload of one piece is checked against what it
// returns for it (PayloadChecksum of those bytes, which it must compute):
// a reader that hashed the payload while it arrived finishes its hash
// there instead of reading the payload again (see OnePiecePayloadOffset).
using PayloadChecksummer = std::function<std::uint64_t(const std::uint8_t* payload, size_t size)>;
Result<chunk::ChunkRef> DecodeEnvelope(const std::uint8_t* data, size_t size,
                                       const keys::Digest* expected_key, std::shared_ptr<void> owner = nullptr,
                                       const PayloadChecksummer& checksum = nullptr);

// Where the payload of an envelope of one piece (up to kPayloadPieceBytes)
// starts, as this code writes them: the size of everything before it.
std::uint64_t OnePiecePayloadOffset();

// The checked fields of an envelope besides the payload bytes, as stored.
// Exposed so that tests and tools can build envelopes field by field
// (e.g. a newer minor version) and still checksum them.
struct EnvelopeHeader {
  std::uint16_t version_major = kEnvelopeVersionMajor;
  std::uint16_t version_minor = kEnvelopeVersionMinor;
  std::uint16_t codec = 0;               // a Codec, possibly unknown to this reader (meta.codec is not read)
  std::uint16_t checksum_algorithm = 0;  // a ChecksumAlgorithm
  chunk::ChunkMeta meta;
  std::uint64_t payload_bytes = 0;       // the payload's stored length
  std::uint64_t checksum = 0;            // PayloadChecksum of the payload
};

// XXH3-64 (seed 0) of the payload bytes.
std::uint64_t PayloadChecksum(const std::uint8_t* data, size_t size);
// PayloadChecksum of [src, src + n), taken while copying those bytes to dst
// (one pass: each block is hashed while it is still in cache).
std::uint64_t CopyWithChecksum(std::uint8_t* dst, const std::uint8_t* src, size_t n);
// XXH3-64 (seed 0) of the canonical header encoding (documented in chunk.capnp).
std::uint64_t HeaderChecksum(const EnvelopeHeader& header);

}  // namespace kdn::wire
