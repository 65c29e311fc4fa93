// SPDX-License-Identifier: Apache-2.0
#include "core/wire/envelope.h"
#include "core/util/dtype.h"

#include <capnp/any.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "core/wire/chunk.capnp.h"

namespace kdn::wire {
namespace {

using schema::ChunkEnvelope;

// One numbering of codecs, three spellings: the codec library's ids, this
// header's enum and the schema's enumerants must never drift apart.
#define KDN_SAME_CODEC(ours, lib, capnp)                                                                   \
  static_assert(static_cast<std::uint32_t>(Codec::ours) == static_cast<std::uint32_t>(codec::CodecId::lib) && \
                static_cast<std::uint32_t>(Codec::ours) == static_cast<std::uint32_t>(schema::Codec::capnp))
KDN_SAME_CODEC(kRaw, kRaw, RAW);
KDN_SAME_CODEC(kFp8, kFp8, FP8);
KDN_SAME_CODEC(kInt8, kInt8, INT8);
KDN_SAME_CODEC(kKivi2, kKivi2, KIVI2);
KDN_SAME_CODEC(kCacheGen, kCacheGen, CACHEGEN);
KDN_SAME_CODEC(kKdn, kKdn, KDN);
KDN_SAME_CODEC(kZstd, kZstd, ZSTD);
KDN_SAME_CODEC(kTc, kTc, TC);
KDN_SAME_CODEC(kEncrypted, kEncrypted, ENCRYPTED);
#undef KDN_SAME_CODEC

bool KnownCodec(std::uint16_t codec) { return codec <= kLastKnownCodec; }

static_assert(std::endian::native == std::endian::little,
              "the segment table and the canonical header encoding are written as the memory image");

constexpr size_t kDigestBytes = sizeof(keys::Digest);
// Cap'n Proto's segment table of a one-segment message: (count - 1, size in words).
constexpr size_t kSegmentTableBytes = 8;

std::uint64_t RoundUpToWord(std::uint64_t n) { return (n + 7) & ~std::uint64_t{7}; }
std::uint64_t PieceCount(std::uint64_t n) { return (n + kPayloadPieceBytes - 1) / kPayloadPieceBytes; }

// Bytes per element of a dtype; nullopt for a dtype this code does not know.
std::optional<std::uint64_t> ElementBytes(std::uint32_t dtype) {
  const std::uint32_t bytes = DtypeBytes(dtype);
  if (bytes == 0) return std::nullopt;
  return bytes;
}

// layers x 2 (K and V) x tokens x kv_heads x head_dim x element size, or
// nullopt when the dtype is unknown or the product overflows (a hostile header).
std::optional<std::uint64_t> ShapeBytes(const chunk::ChunkMeta& m) {
  const std::optional<std::uint64_t> element = ElementBytes(m.dtype);
  if (!element) return std::nullopt;
  std::uint64_t n = *element;
  for (std::uint64_t f : {std::uint64_t{m.layers}, std::uint64_t{2}, std::uint64_t{m.tokens},
                          std::uint64_t{m.kv_heads}, std::uint64_t{m.head_dim}}) {
    if (__builtin_mul_overflow(n, f, &n)) return std::nullopt;
  }
  return n;
}

// What the schema's version-1.0 struct looks like on the wire, measured once
// from the generated code rather than restated by hand.
struct V1Layout {
  std::uint64_t empty_envelope_bytes = 0;  // the envelope of an empty payload
  std::vector<std::uint8_t> data_mask;     // bits of the data section v1 fields use
  size_t pointer_count = 0;
};

V1Layout MeasureV1Layout() {
  V1Layout layout;
  capnp::MallocMessageBuilder builder;
  ChunkEnvelope::Builder e = builder.initRoot<ChunkEnvelope>();
  const keys::Digest zeros{};
  const capnp::Data::Reader digest(zeros.data(), zeros.size());
  e.setModel(digest);
  e.setNamespaceHash(digest);
  e.setKey(digest);
  e.initPayload(0);
  layout.empty_envelope_bytes = capnp::computeSerializedSizeInWords(builder) * sizeof(capnp::word);
  // Every scalar at all ones (no field has a non-zero default, so these are
  // the wire bits too): the data section then shows which bits are used.
  e.setVersionMajor(0xFFFF);
  e.setVersionMinor(0xFFFF);
  e.setCodec(static_cast<schema::Codec>(0xFFFF));
  e.setDtype(static_cast<schema::DType>(0xFFFF));
  e.getShape().setLayers(~0u);
  e.getShape().setKvHeads(~0u);
  e.getShape().setHeadDim(~0u);
  e.getShape().setTokens(~0u);
  e.setFirstPosition(-1);
  e.setEdited(true);
  e.setChecksum(~std::uint64_t{0});
  e.setChecksumAlgorithm(static_cast<schema::ChecksumAlgorithm>(0xFFFF));
  e.setHeaderChecksum(~std::uint64_t{0});
  const capnp::AnyStruct::Reader any = capnp::toAny(e.asReader());
  layout.data_mask.assign(any.getDataSection().begin(), any.getDataSection().end());
  layout.pointer_count = any.getPointerSection().size();
  return layout;
}

const V1Layout& Layout() {
  static const V1Layout layout = MeasureV1Layout();
  return layout;
}

// Appends the canonical little-endian header encoding (see chunk.capnp).
class CanonicalWriter {
 public:
  template <typename T>
  void Int(T v) {
    std::memcpy(buf_.data() + n_, &v, sizeof v);
    n_ += sizeof v;
  }
  void Blob(const keys::Digest& d) {
    Int(std::uint64_t{d.size()});
    std::memcpy(buf_.data() + n_, d.data(), d.size());
    n_ += d.size();
  }
  std::uint64_t Hash() const { return XXH3_64bits(buf_.data(), n_); }

 private:
  std::array<std::uint8_t, 192> buf_{};  // the v1 encoding is 171 bytes
  size_t n_ = 0;
};

// The payload pieces of a parsed envelope, read once (each read of a blob
// counts against the traversal limit).
using Pieces = std::vector<capnp::Data::Reader>;

std::uint64_t PiecesChecksum(const Pieces& pieces) {
  if (pieces.size() == 1) return XXH3_64bits(pieces[0].begin(), pieces[0].size());
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  for (const capnp::Data::Reader& p : pieces) XXH3_64bits_update(state, p.begin(), p.size());
  const std::uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

Status Corrupt(const std::string& what) { return Status::Corrupt("chunk envelope: " + what); }

bool ReadDigest(capnp::Data::Reader blob, keys::Digest* out) {
  if (blob.size() != kDigestBytes) return false;
  std::memcpy(out->data(), blob.begin(), kDigestBytes);
  return true;
}

// A version-1.0 message must be exactly what this code writes: one segment,
// the struct at the schema's sizes with unused bits zero, pieces cut at
// kPayloadPieceBytes with zero padding, nothing else. Together with the two
// checksums this leaves no bit of the message unchecked.
Status CheckExactV1(kj::ArrayPtr<const capnp::word> words, ChunkEnvelope::Reader e,
                    const Pieces& pieces, std::uint64_t payload_bytes) {
  std::uint32_t segments_minus_one;
  std::memcpy(&segments_minus_one, words.begin(), sizeof segments_minus_one);
  if (segments_minus_one != 0) return Corrupt("a version 1.0 envelope has one segment");
  if (words.size() * sizeof(capnp::word) != EncodedEnvelopeSize(payload_bytes)) {
    return Corrupt("size does not match a version 1.0 envelope of its payload");
  }
  const V1Layout& layout = Layout();
  const capnp::AnyStruct::Reader any = capnp::toAny(e);
  const kj::ArrayPtr<const kj::byte> data = any.getDataSection();
  if (data.size() != layout.data_mask.size() || any.getPointerSection().size() != layout.pointer_count) {
    return Corrupt("struct sizes differ from version 1.0");
  }
  for (size_t i = 0; i < data.size(); ++i) {
    if (data[i] & ~layout.data_mask[i]) return Corrupt("unused header bits are set");
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const bool last = i + 1 == pieces.size();
    if (pieces[i].size() == 0 || pieces[i].size() > kPayloadPieceBytes ||
        (!last && pieces[i].size() != kPayloadPieceBytes)) {
      return Corrupt("payload pieces are not cut as version 1.0 cuts them");
    }
    // The padding to the next word lies inside the blob's words, which the
    // reader has bounds-checked.
    const std::uint64_t padded = RoundUpToWord(pieces[i].size());
    for (const kj::byte* p = pieces[i].end(); p < pieces[i].begin() + padded; ++p) {
      if (*p != 0) return Corrupt("payload padding is not zero");
    }
  }
  return Status::Ok();
}

// Reads the fields this reader knows. Refuses, before reading the rest, a
// major version it cannot read or a checksum algorithm it does not know.
Status ReadFields(ChunkEnvelope::Reader e, EnvelopeHeader* h, Pieces* pieces) {
  h->version_major = e.getVersionMajor();
  h->version_minor = e.getVersionMinor();
  if (h->version_major == 0) return Corrupt("format version 0 (not an envelope)");
  if (h->version_major > kEnvelopeVersionMajor) {
    return Status::Unsupported("chunk envelope: format version " + std::to_string(h->version_major) + "." +
                               std::to_string(h->version_minor) + " is newer than this kdn reads (" +
                               std::to_string(kEnvelopeVersionMajor) + ".x); upgrade kdn to read it");
  }
  h->checksum_algorithm = static_cast<std::uint16_t>(e.getChecksumAlgorithm());
  if (h->checksum_algorithm != static_cast<std::uint16_t>(ChecksumAlgorithm::kXxh3)) {
    return Status::Unsupported("chunk envelope: unknown checksum algorithm " + std::to_string(h->checksum_algorithm));
  }
  if (!ReadDigest(e.getModel(), &h->meta.model) || !ReadDigest(e.getNamespaceHash(), &h->meta.ns_hash) ||
      !ReadDigest(e.getKey(), &h->meta.key)) {
    return Corrupt("model, namespace and key must be 32 bytes each");
  }
  h->codec = static_cast<std::uint16_t>(e.getCodec());
  h->meta.dtype = static_cast<std::uint16_t>(e.getDtype());
  h->meta.layers = e.getShape().getLayers();
  h->meta.kv_heads = e.getShape().getKvHeads();
  h->meta.head_dim = e.getShape().getHeadDim();
  h->meta.tokens = e.getShape().getTokens();
  h->meta.first_position = e.getFirstPosition();
  h->meta.edited = e.getEdited();
  h->checksum = e.getChecksum();
  for (capnp::Data::Reader piece : e.getPayload()) {
    pieces->push_back(piece);
    h->payload_bytes += piece.size();  // cannot overflow: bounded by the buffer
  }
  return Status::Ok();
}

// The header's own checks, in an order that names the real problem: the
// header checksum first (past it, an odd value is a real one from a newer
// writer, not a flipped bit), then what this reader supports, then whether
// the payload fits the shape and is the object asked for.
Status CheckHeader(const EnvelopeHeader& h, std::uint64_t stored_header_checksum, const keys::Digest* expected_key) {
  if (HeaderChecksum(h) != stored_header_checksum) return Corrupt("header checksum mismatch");
  if (!KnownCodec(h.codec)) {
    return Status::Unsupported("chunk envelope: unknown codec " + std::to_string(h.codec));
  }
  if (!ElementBytes(h.meta.dtype)) {
    return Status::Unsupported("chunk envelope: unknown dtype " + std::to_string(h.meta.dtype));
  }
  const std::optional<std::uint64_t> shape_bytes = ShapeBytes(h.meta);
  if (!shape_bytes) return Corrupt("shape overflows");
  if (h.codec == static_cast<std::uint16_t>(Codec::kRaw) && *shape_bytes != h.payload_bytes) {
    return Corrupt("payload of " + std::to_string(h.payload_bytes) + " bytes does not match its shape and dtype");
  }
  // An encoded payload's size is the codec's to check (it starts with a
  // header naming the codec and the shape): here, only that there is one.
  if (h.codec != static_cast<std::uint16_t>(Codec::kRaw) && h.payload_bytes == 0) {
    return Corrupt("an encoded payload is empty");
  }
  // An encrypted payload holds at least its header and tag (wire/cipher.h).
  if (h.codec == static_cast<std::uint16_t>(Codec::kEncrypted) && h.payload_bytes < 48) {
    return Corrupt("an encrypted payload shorter than its header and tag");
  }
  if (expected_key && h.meta.key != *expected_key) {
    return Corrupt("holds key " + keys::ToHex(h.meta.key) + ", expected " + keys::ToHex(*expected_key));
  }
  return Status::Ok();
}

chunk::ChunkRef MakeChunk(const EnvelopeHeader& h, const Pieces& pieces, const std::shared_ptr<void>& owner) {
  const std::uint64_t payload_bytes = h.payload_bytes;
  auto chunk = std::make_shared<chunk::Chunk>();
  chunk->meta = h.meta;
  chunk->meta.codec = static_cast<codec::CodecId>(h.codec);
  if (pieces.size() == 1 && owner) {
    // The payload stays where it was read: the chunk shares the buffer.
    chunk->payload = chunk::Payload::Adopt(const_cast<std::uint8_t*>(pieces[0].begin()), pieces[0].size(), owner);
  } else if (pieces.size() == 1) {
    chunk->payload = chunk::Payload(pieces[0].begin(), pieces[0].size());
  } else {
    chunk->payload = chunk::Payload(payload_bytes);
    std::uint8_t* out = chunk->payload.data();
    for (const capnp::Data::Reader& p : pieces) out = std::copy(p.begin(), p.end(), out);
  }
  return chunk;
}

// DecodeEnvelope past the framing checks; may throw kj::Exception on a
// malformed message (the caller turns it into kCorrupt).
Result<chunk::ChunkRef> DecodeMessage(kj::ArrayPtr<const capnp::word> words, const keys::Digest* expected_key,
                                      const std::shared_ptr<void>& owner, const PayloadChecksummer& checksum) {
  capnp::ReaderOptions options;
  // Every word is read about once; twice bounds any amplification a
  // malicious message could attempt, and lets a 1 GiB payload through.
  options.traversalLimitInWords = 2 * words.size() + 1024;
  options.nestingLimit = 8;
  capnp::FlatArrayMessageReader reader(words, options);
  if (reader.getEnd() != words.end()) return Corrupt("bytes after the message (or a truncated segment table)");
  const ChunkEnvelope::Reader e = reader.getRoot<ChunkEnvelope>();
  EnvelopeHeader h;
  Pieces pieces;
  KDN_RETURN_IF_ERROR(ReadFields(e, &h, &pieces));
  KDN_RETURN_IF_ERROR(CheckHeader(h, e.getHeaderChecksum(), expected_key));
  if (h.version_minor == kEnvelopeVersionMinor) KDN_RETURN_IF_ERROR(CheckExactV1(words, e, pieces, h.payload_bytes));
  const std::uint64_t sum = checksum && pieces.size() == 1 ? checksum(pieces[0].begin(), pieces[0].size())
                                                           : PiecesChecksum(pieces);
  if (sum != h.checksum) return Corrupt("payload checksum mismatch");
  return MakeChunk(h, pieces, owner);
}

using CopyProgress = std::function<void(const std::uint8_t* end)>;

// Copies `n` bytes to `to` and hashes them (XXH3-64, as PayloadChecksum)
// in one pass: each block is hashed from the cache right after its copy,
// so the payload is read from memory once, not twice.
class CopyHasher {
 public:
  CopyHasher() : state_(XXH3_createState()) {
    if (state_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ~CopyHasher() { XXH3_freeState(state_); }
  CopyHasher(const CopyHasher&) = delete;
  CopyHasher& operator=(const CopyHasher&) = delete;
  // Calls `copied` with the end of what is copied so far after each block.
  void Copy(std::uint8_t* to, const std::uint8_t* from, std::uint64_t n, const CopyProgress& copied) {
    constexpr std::uint64_t kBlock = 64 << 10;  // stays in L2 between the copy and the hash
    for (std::uint64_t off = 0; off < n; off += kBlock) {
      const std::uint64_t len = std::min(kBlock, n - off);
      std::memcpy(to + off, from + off, len);
      XXH3_64bits_update(state_, to + off, len);
      if (copied) copied(to + off + len);
    }
  }
  std::uint64_t Digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

// Where the pieces of a payload of `n` bytes start in its envelope (byte
// offsets), as a flat message builder lays them out: right after the
// header, one after the other, each padded to a word. A builder working
// over a buffer that is not zero-filled relies on it (EncodeEnvelopeOver).
std::vector<std::uint64_t> PieceOffsets(std::uint64_t n) {
  std::vector<std::uint64_t> offsets;
  // Pieces other than the last are whole words (kPayloadPieceBytes is), so
  // the payload region is the last RoundUpToWord(n) bytes.
  std::uint64_t at = EncodedEnvelopeSize(n) - RoundUpToWord(n);
  for (std::uint64_t off = 0; off < n; off += kPayloadPieceBytes) {
    offsets.push_back(at);
    at += RoundUpToWord(std::min(kPayloadPieceBytes, n - off));
  }
  return offsets;
}

// Fills the envelope; with `expected` (PieceOffsets, relative to `base`),
// fails before copying any of the payload when a piece would land
// elsewhere (the caller zeroed only around them).
bool FillEnvelope(const chunk::Chunk& chunk, ChunkEnvelope::Builder e, const std::uint8_t* base = nullptr,
                  const std::vector<std::uint64_t>* expected = nullptr, const CopyProgress& copied = nullptr) {
  const chunk::ChunkMeta& m = chunk.meta;
  EnvelopeHeader h;
  h.meta = m;
  h.codec = static_cast<std::uint16_t>(m.codec);
  h.payload_bytes = chunk.payload.size();
  e.setVersionMajor(h.version_major);
  e.setVersionMinor(h.version_minor);
  e.setModel(capnp::Data::Reader(m.model.data(), m.model.size()));
  e.setNamespaceHash(capnp::Data::Reader(m.ns_hash.data(), m.ns_hash.size()));
  e.setKey(capnp::Data::Reader(m.key.data(), m.key.size()));
  e.setCodec(static_cast<schema::Codec>(h.codec));
  e.setDtype(static_cast<schema::DType>(m.dtype));
  e.getShape().setLayers(m.layers);
  e.getShape().setKvHeads(m.kv_heads);
  e.getShape().setHeadDim(m.head_dim);
  e.getShape().setTokens(m.tokens);
  e.setFirstPosition(m.first_position);
  e.setEdited(m.edited);
  const std::uint64_t n = chunk.payload.size();
  capnp::List<capnp::Data>::Builder list = e.initPayload(static_cast<unsigned>(PieceCount(n)));
  std::vector<capnp::Data::Builder> pieces;
  for (std::uint64_t i = 0, off = 0; off < n; ++i, off += kPayloadPieceBytes) {
    const std::uint64_t len = std::min(kPayloadPieceBytes, n - off);
    pieces.push_back(list.init(static_cast<unsigned>(i), static_cast<unsigned>(len)));
    if (expected && pieces.back().begin() != base + (*expected)[i]) return false;
  }
  // The checksum is taken while copying; it and the header checksum are
  // set after the pieces (scalars live in the struct, allocated first).
  CopyHasher copier;
  for (std::uint64_t i = 0; i < pieces.size(); ++i) {
    copier.Copy(pieces[i].begin(), chunk.payload.data() + i * kPayloadPieceBytes, pieces[i].size(), copied);
  }
  h.checksum = copier.Digest();
  e.setChecksum(h.checksum);
  e.setChecksumAlgorithm(schema::ChecksumAlgorithm::XXH3);
  e.setHeaderChecksum(HeaderChecksum(h));
  return true;
}

}  // namespace

std::uint64_t PayloadChecksum(const std::uint8_t* data, size_t size) { return XXH3_64bits(data, size); }

std::uint64_t CopyWithChecksum(std::uint8_t* dst, const std::uint8_t* src, size_t n) {
  CopyHasher h;
  h.Copy(dst, src, n, nullptr);
  return h.Digest();
}

std::uint64_t HeaderChecksum(const EnvelopeHeader& h) {
  CanonicalWriter w;
  w.Int(h.version_major);
  w.Int(h.version_minor);
  w.Blob(h.meta.model);
  w.Blob(h.meta.ns_hash);
  w.Blob(h.meta.key);
  w.Int(h.codec);
  w.Int(static_cast<std::uint16_t>(h.meta.dtype));
  w.Int(h.meta.layers);
  w.Int(h.meta.kv_heads);
  w.Int(h.meta.head_dim);
  w.Int(h.meta.tokens);
  w.Int(h.meta.first_position);
  w.Int(static_cast<std::uint8_t>(h.meta.edited ? 1 : 0));
  w.Int(h.payload_bytes);
  w.Int(h.checksum);
  w.Int(h.checksum_algorithm);
  return w.Hash();
}

std::uint64_t EncodedEnvelopeSize(std::uint64_t payload_bytes) {
  return Layout().empty_envelope_bytes + PieceCount(payload_bytes) * sizeof(capnp::word) +
         RoundUpToWord(payload_bytes);
}

namespace {

// EncodeEnvelopeInto and EncodeEnvelopeOver: `zeroed` says whether `out` is
// zero-filled already.
Status Encode(const chunk::Chunk& chunk, std::uint8_t* out, std::uint64_t size, bool zeroed,
              const std::function<void(std::uint64_t end)>& copied) {
  const std::optional<std::uint64_t> shape_bytes = ShapeBytes(chunk.meta);
  if (!shape_bytes) return Status::InvalidArgument("chunk envelope: unknown dtype or a shape that overflows");
  const auto codec = static_cast<std::uint32_t>(chunk.meta.codec);
  if (codec > kLastKnownCodec) {
    return Status::InvalidArgument("chunk envelope: unknown codec " + std::to_string(codec));
  }
  if (chunk.meta.codec == codec::CodecId::kRaw && *shape_bytes != chunk.payload.size()) {
    return Status::InvalidArgument("chunk envelope: payload of " + std::to_string(chunk.payload.size()) +
                                   " bytes, the shape and dtype say " + std::to_string(*shape_bytes));
  }
  if (chunk.meta.codec != codec::CodecId::kRaw && chunk.payload.empty()) {
    return Status::InvalidArgument("chunk envelope: an encoded payload is empty");
  }
  const std::uint64_t total = EncodedEnvelopeSize(chunk.payload.size());
  if (size != total) {
    return Status::InvalidArgument("chunk envelope: a buffer of " + std::to_string(size) + " bytes for an envelope of " +
                                   std::to_string(total));
  }
  if (reinterpret_cast<std::uintptr_t>(out) % sizeof(capnp::word) != 0) {
    return Status::InvalidArgument("chunk envelope: the buffer is not word-aligned");
  }
  try {
    const std::uint64_t words = (total - kSegmentTableBytes) / sizeof(capnp::word);
    if (words > UINT32_MAX) return Status::InvalidArgument("chunk envelope: payload too large");
    // The message is built in place, right after its segment table: the size
    // is known exactly, so one flat segment holds it and the payload is
    // copied once. requireFilled() proves the size was right.
    std::vector<std::uint64_t> offsets;
    if (!zeroed) {
      // A builder wants zeros where it writes; the payload copy overwrites
      // the pieces, so only the header and each piece's last word (its
      // padding) are cleared, not the whole buffer.
      offsets = PieceOffsets(chunk.payload.size());
      std::memset(out, 0, offsets.empty() ? total : offsets[0]);
      for (std::uint64_t i = 0, off = 0; i < offsets.size(); ++i, off += kPayloadPieceBytes) {
        const std::uint64_t padded = RoundUpToWord(std::min(kPayloadPieceBytes, chunk.payload.size() - off));
        if (padded > 0) std::memset(out + offsets[i] + padded - sizeof(capnp::word), 0, sizeof(capnp::word));
      }
    }
    bool laid_out;
    {
      capnp::FlatMessageBuilder builder(
          kj::arrayPtr(reinterpret_cast<capnp::word*>(out + kSegmentTableBytes), words));
      CopyProgress progress;
      if (copied) progress = [&](const std::uint8_t* end) { copied(static_cast<std::uint64_t>(end - out)); };
      laid_out = FillEnvelope(chunk, builder.initRoot<ChunkEnvelope>(), out, zeroed ? nullptr : &offsets, progress);
      if (laid_out) builder.requireFilled();
    }
    if (!laid_out) {
      // The builder placed a piece elsewhere than PieceOffsets says (another
      // Cap'n Proto?): clear everything and build again.
      std::memset(out, 0, total);
      return Encode(chunk, out, size, true, copied);
    }
    const std::uint32_t table[2] = {0, static_cast<std::uint32_t>(words)};
    std::memcpy(out, table, sizeof table);
    return Status::Ok();
  } catch (const kj::Exception& e) {
    return Status::Internal(std::string("chunk envelope: encoding failed: ") + e.getDescription().cStr());
  }
}

}  // namespace

Status EncodeEnvelopeInto(const chunk::Chunk& chunk, std::uint8_t* out, std::uint64_t size) {
  return Encode(chunk, out, size, true, nullptr);
}

Status EncodeEnvelopeOver(const chunk::Chunk& chunk, std::uint8_t* out, std::uint64_t size,
                          const std::function<void(std::uint64_t end)>& copied) {
  return Encode(chunk, out, size, false, copied);
}

Result<chunk::Bytes> EncodeEnvelope(const chunk::Chunk& chunk) {
  try {
    // Zero-filled, as a message builder requires; operator new aligns it for words.
    chunk::Bytes out(EncodedEnvelopeSize(chunk.payload.size()));
    KDN_RETURN_IF_ERROR(EncodeEnvelopeInto(chunk, out.data(), out.size()));
    return out;
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "chunk envelope: out of memory encoding " +
                                       std::to_string(chunk.payload.size()) + " bytes");
  }
}

std::uint64_t OnePiecePayloadOffset() { return EncodedEnvelopeSize(1) - sizeof(capnp::word); }

Result<chunk::ChunkRef> DecodeEnvelope(const std::uint8_t* data, size_t size, const keys::Digest* expected_key,
                                       std::shared_ptr<void> owner, const PayloadChecksummer& checksum) {
  if (data == nullptr && size != 0) return Status::InvalidArgument("chunk envelope: null buffer");
  if (size < kSegmentTableBytes || size % sizeof(capnp::word) != 0) {
    return Corrupt("truncated: " + std::to_string(size) + " bytes is not a whole number of words");
  }
  try {
    kj::Array<capnp::word> aligned;  // only for a buffer Cap'n Proto cannot read in place
    kj::ArrayPtr<const capnp::word> words;
    if (reinterpret_cast<std::uintptr_t>(data) % alignof(capnp::word) == 0) {
      words = kj::arrayPtr(reinterpret_cast<const capnp::word*>(data), size / sizeof(capnp::word));
    } else {
      aligned = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
      std::memcpy(aligned.begin(), data, size);
      words = kj::arrayPtr(static_cast<const capnp::word*>(aligned.begin()), aligned.size());
      owner.reset();  // the pieces point into the aligned copy, which dies here
      return DecodeMessage(words, expected_key, owner, nullptr);  // the caller's hash is not of the copy
    }
    return DecodeMessage(words, expected_key, owner, checksum);
  } catch (const kj::Exception& e) {
    return Corrupt(std::string("does not parse: ") + e.getDescription().cStr());
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "chunk envelope: out of memory decoding " + std::to_string(size) + " bytes");
  }
}

}  // namespace kdn::wire
