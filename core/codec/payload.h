// SPDX-License-Identifier: Apache-2.0
// Internal to core/codec: the header every codec payload starts with, the
// element access of the three KV dtypes, and the codec factories codec.cc
// dispatches to.
//
// Header (40 bytes, little-endian, pinned; kHeaderBytes):
//   0  magic "KDNC"            4 bytes
//   4  version (1)             u16
//   6  codec id (CodecId)      u16
//   8  layers, kv_heads, head_dim, tokens, dtype   5 x u32 (the Shape)
//   28 param0, param1          2 x u32 (the codec's parameters; 0 if unused)
//   36 check                   u32: FNV-1a of bytes 0..35
// The body follows; each codec's .cc documents it and its exact size, and
// Decode requires size == header + body exactly.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "kernels/common/half.h"
#include "core/util/status.h"

namespace kdn::codec::internal {

inline constexpr size_t kHeaderBytes = 40;
inline constexpr std::uint16_t kVersion = 1;

struct Header {
  CodecId id = CodecId::kRaw;
  Shape shape;
  std::uint32_t param0 = 0, param1 = 0;
};

// Writes the header into out[0, kHeaderBytes).
void WriteHeader(const Header& h, std::uint8_t* out);
// Reads and checks the header of a payload of codec `id` for `shape`:
// kCorrupt on truncation, bad magic, version, checksum, codec id or shape.
Result<Header> ReadHeader(CodecId id, const Shape& shape, const std::uint8_t* data, size_t size);

// kInvalidArgument unless dtype is known and the element count fits in
// 2^40 (well beyond any chunk; keeps every size computation exact).
Status CheckShape(const Shape& shape);

// Element i of a buffer of `dtype` as float, and the other way.
float LoadElement(std::uint32_t dtype, const std::uint8_t* base, std::uint64_t i);
void StoreElement(std::uint32_t dtype, std::uint8_t* base, std::uint64_t i, float v);

// Whether a float of magnitude `maxabs` stays finite stored as `dtype`
// (decoders check each block's largest value, so output is never inf).
bool FitsDtype(std::uint32_t dtype, float maxabs);

// Little-endian float32 / u32 access to unaligned bytes.
void PutF32(std::uint8_t* p, float v);
float GetF32(const std::uint8_t* p);

// The canonical index of (layer, kv, token, head, dim).
inline std::uint64_t Index(const Shape& s, std::uint64_t layer, std::uint64_t kv, std::uint64_t token,
                           std::uint64_t head, std::uint64_t dim) {
  return (((layer * 2 + kv) * s.tokens + token) * s.kv_heads + head) * s.head_dim + dim;
}

// kdn's plane scales (core/codec/kdn.cc's payload): C offsets then C steps,
// little-endian halves at `halves`, as T. kCorrupt (naming `plane`) if an
// offset or a step is not finite or a step is negative.
template <typename T>
Status ReadKdnScales(const std::uint8_t* halves, std::uint64_t C, std::uint64_t plane, T* off, T* step) {
  auto u16 = [](const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | p[1] << 8); };
  auto finite = [](std::uint16_t h) { return (h & 0x7C00u) != 0x7C00u; };
  for (std::uint64_t c = 0; c < C; ++c) {
    const std::uint16_t ho = u16(halves + 2 * c), hs = u16(halves + 2 * C + 2 * c);
    if (!finite(ho) || !finite(hs) || (hs & 0x8000u) != 0) {
      return Status::Corrupt("kdn payload: a non-finite offset or a bad step in plane " + std::to_string(plane));
    }
    off[c] = kernels::half_to_float(ho);
    step[c] = kernels::half_to_float(hs);
  }
  return Status::Ok();
}

// kInvalidArgument naming the first parameter of `spec` not in `known`
// (a preset counts as the parameter "preset").
Status RejectUnknownParams(const Spec& spec, std::initializer_list<std::string_view> known);

// Reads an unsigned decimal parameter in [lo, hi].
Result<std::uint32_t> ParseUint(const std::string& name, const std::string& value, std::uint32_t lo,
                                std::uint32_t hi);

// Reads a decimal floating-point parameter in [lo, hi].
Result<double> ParseFloat(const std::string& name, const std::string& value, double lo, double hi);

// Reads a list of numbers in [1e-3, 1e3] joined by '_' ("1_0.5_2"): the
// per-plane weights of kdn and tc.
Result<std::vector<double>> ParseList(const std::string& name, const std::string& value);

// The quantizing parameters kdn and tc share, where a parser stores them.
struct StepFields {
  double* step;                      // step: in [1e-3, 64]
  double* vmul;                      // vmul: in [1e-2, 1e2]
  std::uint32_t* sinks;              // sink: in [0, 1024]
  std::uint32_t* lanes;              // lanes: in [1, kernels::kKdnMaxLanes]
  std::vector<double>* plane_weight;  // pw: ParseList
};
// Parses `key` into its field if it is one of them: true if it was, false
// if the key is another (nothing written), or the value's error.
Result<bool> ParseStepField(const std::string& key, const std::string& value, const StepFields& fields);

Result<std::unique_ptr<Codec>> MakeRaw(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeFp8(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeInt8(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeKivi(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeCacheGen(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeKdn(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeZstd(const Spec& spec);
Result<std::unique_ptr<Codec>> MakeTc(const Spec& spec);

}  // namespace kdn::codec::internal
