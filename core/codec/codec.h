// SPDX-License-Identifier: Apache-2.0
// KV codecs: encode a canonical chunk's KV ([layer][k|v][token][kv_head]
// [head_dim], in the model's dtype) into a self-describing payload, and
// decode it back. Every parameter a decoder needs travels in the payload;
// the chunk envelope records the codec id beside it (core/wire).
// Thread-safety: a Codec is immutable after creation; Encode and Decode may
// run concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"
#include "core/util/dtype.h"

namespace kdn::codec {

using Bytes = std::vector<std::uint8_t>;

// A codec and its settings, as written on command lines: "int8",
// "kivi2:group=32", "cachegen:bins=16", "kdn:balanced" (a preset),
// "zstd:level=3,shuffle=1".
struct Spec {
  std::string name;
  std::map<std::string, std::string> params;
  std::string ToString() const;
};
// Parses NAME[:key=value,...] (a bare word after the colon is a preset).
Result<Spec> ParseSpec(std::string_view text);

// The shape and element type of a chunk's KV.
struct Shape {
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0, tokens = 0;
  std::uint32_t dtype = 0;  // kdn_dtype: 0 f32, 1 f16, 2 bf16
  std::uint64_t elements() const { return std::uint64_t{layers} * 2 * tokens * kv_heads * head_dim; }
  std::uint64_t bytes() const { return elements() * DtypeBytes(dtype); }
  bool operator==(const Shape&) const = default;
};

// Codec ids as the chunk envelope records them. Pinned forever: only
// appended.
enum class CodecId : std::uint32_t {
  kRaw = 0,
  kFp8 = 1,
  kInt8 = 2,
  kKivi2 = 3,
  kCacheGen = 4,
  kKdn = 5,
  kZstd = 6,
  kTc = 7,  // transform codec (core/codec/tc.cc)
  // Not a codec of KV: a payload encrypted at rest (wire/cipher.h), which
  // holds another codec's payload; no decoder takes it (DecoderFor refuses
  // it), the cipher that holds its key opens it first.
  kEncrypted = 8,
};

// What a store knows of a chunk beyond its shape: a codec that models one
// model's KV (tc) checks the model and undoes RoPE at the chunk's positions.
struct ChunkInfo {
  std::int64_t first_position = -1;  // -1: position-free (taken as 0)
  bool has_model = false;
  std::uint8_t model[32] = {};  // the model's fingerprint (keys::ModelFingerprint)
};

// Whether decoding a payload of `id` may give other bytes than were encoded
// (the codec quantizes). raw and zstd are lossless; every other codec is
// lossy, and so is an id this build does not know.
bool IsLossy(CodecId id);

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  virtual const Spec& spec() const = 0;
  // Encodes `kv` (shape.bytes() bytes, canonical layout, shape.dtype).
  virtual Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const = 0;
  // The same, knowing the chunk's model and position (the store calls this
  // one). A codec that needs neither ignores `info`.
  virtual Result<Bytes> EncodeWith(const Shape& shape, const std::uint8_t* kv, const ChunkInfo& info) const {
    (void)info;
    return Encode(shape, kv);
  }
  // Decodes into `out` (shape.bytes() bytes). The payload's own header must
  // describe `shape` (else kCorrupt); truncated, oversized or inconsistent
  // payloads are kCorrupt and `out` is left unspecified but never read past.
  virtual Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const = 0;
};

// A codec from its spec; kInvalidArgument for unknown names or parameters.
Result<std::unique_ptr<Codec>> MakeCodec(const Spec& spec);
// The codec that decodes payloads of `id` (with their own parameters).
Result<std::unique_ptr<Codec>> DecoderFor(CodecId id);

}  // namespace kdn::codec
