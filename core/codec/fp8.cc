// SPDX-License-Identifier: Apache-2.0
// fp8: OCP e4m3 (FN) codes with float32 scales, as vLLM's fp8 KV cache.
// Spec: fp8[:scale=token|head] (token is the default).
// - scale=token (param0 = 0): one scale per (layer, k|v, token), over that
//   token's kv_heads x head_dim elements; S = layers * 2 * tokens scales,
//   scale index (layer * 2 + kv) * tokens + token.
// - scale=head (param0 = 1): one scale per (layer, k|v, kv_head), over the
//   chunk's tokens x head_dim elements; S = layers * 2 * kv_heads,
//   index (layer * 2 + kv) * kv_heads + head.
// scale = absmax / 448 (0 for an all-zero block); code = e4m3(x / scale)
// (kernels/common/quant.h).
// Payload: header (param0 = mode, param1 = 0), S float32 scales, then one
// code byte per element in canonical order. Size: 40 + 4 * S + elements.
// Decode rejects (kCorrupt) negative scales, scales whose largest value
// (448 * scale) does not fit the output dtype, and NaN codes, none of which
// the encoder writes.
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/codec/payload.h"
#include "kernels/common/quant.h"

namespace kdn::codec::internal {
namespace {

enum Mode : std::uint32_t { kPerToken = 0, kPerHead = 1 };

std::uint64_t ScaleCount(const Shape& s, std::uint32_t mode) {
  return std::uint64_t{s.layers} * 2 * (mode == kPerToken ? s.tokens : s.kv_heads);
}

// Calls f(scale_index, element_index) for every element, grouped by block.
template <typename F>
void ForEachElement(const Shape& s, std::uint32_t mode, F&& f) {
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    for (std::uint64_t kv = 0; kv < 2; ++kv) {
      for (std::uint64_t t = 0; t < s.tokens; ++t) {
        for (std::uint64_t h = 0; h < s.kv_heads; ++h) {
          const std::uint64_t block = mode == kPerToken ? (l * 2 + kv) * s.tokens + t : (l * 2 + kv) * s.kv_heads + h;
          const std::uint64_t base = Index(s, l, kv, t, h, 0);
          for (std::uint64_t d = 0; d < s.head_dim; ++d) f(block, base + d);
        }
      }
    }
  }
}

class Fp8Codec final : public Codec {
 public:
  Fp8Codec(Spec spec, std::uint32_t mode) : spec_(std::move(spec)), mode_(mode) {}
  CodecId id() const override { return CodecId::kFp8; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    const std::uint64_t n_scales = ScaleCount(shape, mode_), n = shape.elements();
    std::vector<float> absmax(n_scales, 0.0f);
    bool finite = true;
    ForEachElement(shape, mode_, [&](std::uint64_t b, std::uint64_t i) {
      const float x = LoadElement(shape.dtype, kv, i);
      finite = finite && std::isfinite(x);
      absmax[b] = std::fmax(absmax[b], std::fabs(x));
    });
    if (!finite) return Status::InvalidArgument("fp8: the KV holds a non-finite value");
    Bytes out(kHeaderBytes + 4 * n_scales + n);
    WriteHeader(Header{CodecId::kFp8, shape, mode_, 0}, out.data());
    std::uint8_t* scales = out.data() + kHeaderBytes;
    std::uint8_t* codes = scales + 4 * n_scales;
    for (std::uint64_t b = 0; b < n_scales; ++b) {
      absmax[b] = kernels::sym_scale(absmax[b], kernels::kFp8E4m3Max);
      PutF32(scales + 4 * b, absmax[b]);
    }
    ForEachElement(shape, mode_, [&](std::uint64_t b, std::uint64_t i) {
      codes[i] = kernels::fp8_quantize(LoadElement(shape.dtype, kv, i), absmax[b]);
    });
    return out;
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Result<Header> h = ReadHeader(CodecId::kFp8, shape, data, size);
    if (!h.ok()) return h.status();
    const std::uint32_t mode = h->param0;
    if (mode != kPerToken && mode != kPerHead) {
      return Status::Corrupt("fp8 payload: unknown scale mode " + std::to_string(mode));
    }
    if (h->param1 != 0) return Status::Corrupt("fp8 payload: nonzero second parameter");
    const std::uint64_t n_scales = ScaleCount(shape, mode), n = shape.elements();
    const std::uint64_t want = kHeaderBytes + 4 * n_scales + n;
    if (size != want) {
      return Status::Corrupt("fp8 payload: " + std::to_string(size) + " bytes, expected " + std::to_string(want));
    }
    const std::uint8_t* scale_bytes = data + kHeaderBytes;
    const std::uint8_t* codes = scale_bytes + 4 * n_scales;
    std::vector<float> scales(n_scales);
    for (std::uint64_t b = 0; b < n_scales; ++b) {
      scales[b] = GetF32(scale_bytes + 4 * b);
      if (!(scales[b] >= 0.0f) || !FitsDtype(shape.dtype, scales[b] * kernels::kFp8E4m3Max)) {
        return Status::Corrupt("fp8 payload: invalid scale " + std::to_string(scales[b]) + " at " + std::to_string(b));
      }
    }
    for (std::uint64_t i = 0; i < n; ++i) {
      if (kernels::e4m3_is_nan(codes[i])) return Status::Corrupt("fp8 payload: NaN code at " + std::to_string(i));
    }
    ForEachElement(shape, mode, [&](std::uint64_t b, std::uint64_t i) {
      StoreElement(shape.dtype, out, i, kernels::fp8_dequantize(codes[i], scales[b]));
    });
    return Status::Ok();
  }

 private:
  Spec spec_;
  std::uint32_t mode_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeFp8(const Spec& spec) {
  KDN_RETURN_IF_ERROR(RejectUnknownParams(spec, {"scale"}));
  std::uint32_t mode = kPerToken;
  if (auto it = spec.params.find("scale"); it != spec.params.end()) {
    if (it->second == "token") {
      mode = kPerToken;
    } else if (it->second == "head") {
      mode = kPerHead;
    } else {
      return Status::InvalidArgument("codec 'fp8': parameter scale=" + it->second + ": expected token or head");
    }
  }
  Spec normalized{"fp8", {{"scale", mode == kPerToken ? "token" : "head"}}};
  return std::unique_ptr<Codec>(new Fp8Codec(std::move(normalized), mode));
}

}  // namespace kdn::codec::internal
