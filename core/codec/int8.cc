// SPDX-License-Identifier: Apache-2.0
// int8: symmetric int8 with one float32 scale per (layer, k|v, token), over
// that token's kv_heads x head_dim elements.
// scale = absmax / 127 (0 for an all-zero block); code = rint(x / scale) in
// [-127, 127] (kernels/common/quant.h).
// Payload: header (param0 = param1 = 0), S = layers * 2 * tokens float32
// scales (index (layer * 2 + kv) * tokens + token), then one int8 code per
// element in canonical order. Size: 40 + 4 * S + elements.
// Decode rejects (kCorrupt) negative scales, scales whose largest value
// (127 * scale) does not fit the output dtype, and the code -128, none of
// which the encoder writes.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/codec/payload.h"
#include "kernels/common/quant.h"

namespace kdn::codec::internal {
namespace {

constexpr std::int32_t kQmax = 127;

class Int8Codec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kInt8; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    const std::uint64_t n_scales = std::uint64_t{shape.layers} * 2 * shape.tokens, n = shape.elements();
    const std::uint64_t block = std::uint64_t{shape.kv_heads} * shape.head_dim;
    Bytes out(kHeaderBytes + 4 * n_scales + n);
    WriteHeader(Header{CodecId::kInt8, shape, 0, 0}, out.data());
    std::uint8_t* scales = out.data() + kHeaderBytes;
    std::uint8_t* codes = scales + 4 * n_scales;
    for (std::uint64_t b = 0; b < n_scales; ++b) {
      float absmax = 0.0f;
      for (std::uint64_t i = b * block; i < (b + 1) * block; ++i) {
        const float x = LoadElement(shape.dtype, kv, i);
        if (!std::isfinite(x)) return Status::InvalidArgument("int8: the KV holds a non-finite value");
        absmax = std::fmax(absmax, std::fabs(x));
      }
      const float scale = kernels::sym_scale(absmax, static_cast<float>(kQmax));
      PutF32(scales + 4 * b, scale);
      for (std::uint64_t i = b * block; i < (b + 1) * block; ++i) {
        const std::int32_t q = kernels::sym_quantize(LoadElement(shape.dtype, kv, i), scale, kQmax);
        codes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
      }
    }
    return out;
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Result<Header> h = ReadHeader(CodecId::kInt8, shape, data, size);
    if (!h.ok()) return h.status();
    if (h->param0 != 0 || h->param1 != 0) return Status::Corrupt("int8 payload: nonzero parameters");
    const std::uint64_t n_scales = std::uint64_t{shape.layers} * 2 * shape.tokens, n = shape.elements();
    const std::uint64_t block = std::uint64_t{shape.kv_heads} * shape.head_dim;
    const std::uint64_t want = kHeaderBytes + 4 * n_scales + n;
    if (size != want) {
      return Status::Corrupt("int8 payload: " + std::to_string(size) + " bytes, expected " + std::to_string(want));
    }
    const std::uint8_t* scales = data + kHeaderBytes;
    const std::uint8_t* codes = scales + 4 * n_scales;
    for (std::uint64_t b = 0; b < n_scales; ++b) {
      const float scale = GetF32(scales + 4 * b);
      if (!(scale >= 0.0f) || !FitsDtype(shape.dtype, scale * static_cast<float>(kQmax))) {
        return Status::Corrupt("int8 payload: invalid scale " + std::to_string(scale) + " at " + std::to_string(b));
      }
      for (std::uint64_t i = b * block; i < (b + 1) * block; ++i) {
        const std::int32_t q = static_cast<std::int8_t>(codes[i]);
        if (q < -kQmax) return Status::Corrupt("int8 payload: code -128 at " + std::to_string(i));
        StoreElement(shape.dtype, out, i, kernels::sym_dequantize(q, scale));
      }
    }
    return Status::Ok();
  }

 private:
  Spec spec_{"int8", {}};
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeInt8(const Spec& spec) {
  KDN_RETURN_IF_ERROR(RejectUnknownParams(spec, {}));
  return std::unique_ptr<Codec>(new Int8Codec());
}

}  // namespace kdn::codec::internal
