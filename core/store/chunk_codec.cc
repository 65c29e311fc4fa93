// SPDX-License-Identifier: Apache-2.0
#include "core/store/chunk_codec.h"
#include "core/util/dtype.h"

#include <cstring>
#include <new>
#include <optional>
#include <utility>

namespace kdn::store {
namespace {

codec::Shape ShapeOf(const ChunkMeta& m) { return codec::Shape{m.layers, m.kv_heads, m.head_dim, m.tokens, m.dtype}; }

// The canonical size of a chunk's KV; nullopt for an unknown dtype or a
// shape whose size overflows (a hostile header).
std::optional<std::uint64_t> CanonicalBytes(const ChunkMeta& m) {
  if (m.dtype > 2) return std::nullopt;
  std::uint64_t n = DtypeBytes(m.dtype);
  for (std::uint64_t f : {std::uint64_t{m.layers}, std::uint64_t{2}, std::uint64_t{m.tokens},
                          std::uint64_t{m.kv_heads}, std::uint64_t{m.head_dim}}) {
    if (__builtin_mul_overflow(n, f, &n)) return std::nullopt;
  }
  return n;
}

std::string CodecName(codec::CodecId id) { return "codec " + std::to_string(static_cast<std::uint32_t>(id)); }

}  // namespace

Result<std::shared_ptr<const codec::Codec>> MakeTierCodec(std::string_view text) {
  Result<codec::Spec> spec = codec::ParseSpec(text);
  if (!spec.ok()) return Status::InvalidArgument(spec.status().message());
  Result<std::unique_ptr<codec::Codec>> made = codec::MakeCodec(*spec);
  if (!made.ok()) {
    return Status::InvalidArgument("codec '" + std::string(text) + "': " + made.status().message());
  }
  return std::shared_ptr<const codec::Codec>(std::move(made).value());
}

Result<ChunkRef> EncodeChunk(const codec::Codec& codec, const Chunk& chunk) {
  if (chunk.meta.codec != codec::CodecId::kRaw) {
    return Status::InvalidArgument("encode: the chunk is encoded already (" + CodecName(chunk.meta.codec) + ")");
  }
  const std::optional<std::uint64_t> bytes = CanonicalBytes(chunk.meta);
  if (!bytes || *bytes != chunk.payload.size()) {
    return Status::InvalidArgument("encode: a payload of " + std::to_string(chunk.payload.size()) +
                                   " bytes does not match the chunk's shape and dtype");
  }
  try {
    codec::ChunkInfo info;
    info.first_position = chunk.meta.first_position;
    info.has_model = true;
    static_assert(sizeof info.model == sizeof chunk.meta.model);
    std::memcpy(info.model, chunk.meta.model.data(), sizeof info.model);
    Result<codec::Bytes> encoded = codec.EncodeWith(ShapeOf(chunk.meta), chunk.payload.data(), info);
    if (!encoded.ok()) return encoded.status();
    // The chunk adopts the encoder's buffer: no copy.
    auto buffer = std::make_shared<codec::Bytes>(std::move(encoded).value());
    auto out = std::make_shared<Chunk>();
    out->meta = chunk.meta;
    out->meta.codec = codec.id();
    out->payload = Payload::Adopt(buffer->data(), buffer->size(), buffer);
    return ChunkRef(std::move(out));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "encode: out of memory");
  }
}

Result<ChunkRef> DecodeChunk(const ChunkRef& stored) {
  if (!stored) return Status::InvalidArgument("decode: null chunk");
  if (stored->meta.codec == codec::CodecId::kRaw) return stored;
  const std::optional<std::uint64_t> bytes = CanonicalBytes(stored->meta);
  if (!bytes) return Status::Corrupt("decode: unknown dtype or a shape that overflows");
  // A chunk's KV is at most a few hundred MiB (a 405B model's 256 tokens:
  // 126 MiB); a larger claim comes from damaged or hostile bytes, and
  // allocating for it is not worth trying.
  constexpr std::uint64_t kMaxDecodedBytes = std::uint64_t{4} << 30;
  if (*bytes > kMaxDecodedBytes) {
    return Status::Corrupt("decode: the chunk claims " + std::to_string(*bytes) + " bytes of KV, over the 4 GiB limit");
  }
  Result<std::unique_ptr<codec::Codec>> decoder = codec::DecoderFor(stored->meta.codec);
  if (!decoder.ok()) {
    // Unknown to this build (a newer writer) or not built: unreadable here.
    return Status::Corrupt("decode: " + CodecName(stored->meta.codec) + ": " + decoder.status().message());
  }
  try {
    auto out = std::make_shared<Chunk>();
    out->meta = stored->meta;
    out->meta.codec = codec::CodecId::kRaw;
    // Only a codec that quantizes makes the KV other than what was stored.
    out->meta.lossy = codec::IsLossy(stored->meta.codec);
    out->payload = Payload::Uninitialized(static_cast<size_t>(*bytes));
    // The codec checks its payload's header against this shape, dtype and
    // its own id, then the body; any failure makes the chunk unreadable.
    const Status st =
        (*decoder)->Decode(ShapeOf(stored->meta), stored->payload.data(), stored->payload.size(), out->payload.data());
    if (st.code() == Code::kNoMemory) return st;
    if (!st.ok()) return Status::Corrupt("decode: " + CodecName(stored->meta.codec) + ": " + st.message());
    return ChunkRef(std::move(out));
  } catch (const std::bad_alloc&) {
    return Status(Code::kNoMemory, "decode: out of memory for " + std::to_string(*bytes) + " bytes");
  }
}

}  // namespace kdn::store
