// SPDX-License-Identifier: Apache-2.0
// kivi2: KIVI's asymmetric low-bit quantization (Liu et al., 2024): keys per
// channel, values per token, min/max groups.
// Spec: kivi2[:bits=2|4][,group=G] (defaults bits=2, group=32; G in [1, 65536]).
// - Keys (kv = 0): one group per (layer, kv_head, dim, token group), token
//   groups of G tokens, the last one shorter when tokens % G != 0:
//   NK = layers * kv_heads * head_dim * ceil(tokens / G) groups, index
//   ((layer * kv_heads + head) * head_dim + dim) * ceil(tokens / G) + g.
// - Values (kv = 1): one group per (layer, token, kv_head, channel group),
//   channel groups of GV = min(G, head_dim) channels, the last one shorter:
//   NV = layers * tokens * kv_heads * ceil(head_dim / GV) groups, index
//   ((layer * tokens + token) * kv_heads + head) * ceil(head_dim / GV) + g.
// Each group stores (min, scale) as two float32 (float32 rather than KIVI's
// fp16, so that the stated bound |x - x'| <= scale / 2 holds for every
// element: an fp16 min would shift the whole group). scale = (max - min) /
// (2^bits - 1); code = rint((x - min) / scale) (kernels/common/quant.h).
// KIVI's full-precision residual window is not kept: a chunk is stored whole.
// Payload: header (param0 = bits, param1 = G), NK (min, scale) pairs, NV
// (min, scale) pairs, then the codes of every element in canonical order,
// packed `bits` bits each, 8 / bits per byte, low bits first.
// Size: 40 + 8 * (NK + NV) + ceil(elements * bits / 8).
// Decode rejects (kCorrupt) bad bits or G, negative scales, and groups
// whose min or top level min + scale * (2^bits - 1) does not fit the output
// dtype (so a decoded element is always finite).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/codec/payload.h"
#include "kernels/common/quant.h"

namespace kdn::codec::internal {
namespace {

constexpr std::uint32_t kMaxGroup = 65536;

struct Layout {
  std::uint64_t key_groups_per_channel, value_group, value_groups_per_head;
  std::uint64_t nk, nv;
};

Layout MakeLayout(const Shape& s, std::uint32_t group) {
  Layout lay;
  lay.key_groups_per_channel = (std::uint64_t{s.tokens} + group - 1) / group;
  lay.value_group = std::max<std::uint64_t>(1, std::min<std::uint64_t>(group, s.head_dim));
  lay.value_groups_per_head = (std::uint64_t{s.head_dim} + lay.value_group - 1) / lay.value_group;
  lay.nk = std::uint64_t{s.layers} * s.kv_heads * s.head_dim * lay.key_groups_per_channel;
  lay.nv = std::uint64_t{s.layers} * s.tokens * s.kv_heads * lay.value_groups_per_head;
  return lay;
}

// The group (in the NK + NV parameter list) of the element at (l, kv, t, h, d).
std::uint64_t GroupOf(const Shape& s, const Layout& lay, std::uint32_t group, std::uint64_t l, std::uint64_t kv,
                      std::uint64_t t, std::uint64_t h, std::uint64_t d) {
  if (kv == 0) return ((l * s.kv_heads + h) * s.head_dim + d) * lay.key_groups_per_channel + t / group;
  return lay.nk + ((l * s.tokens + t) * s.kv_heads + h) * lay.value_groups_per_head + d / lay.value_group;
}

template <typename F>
void ForEachElement(const Shape& s, const Layout& lay, std::uint32_t group, F&& f) {
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    for (std::uint64_t kv = 0; kv < 2; ++kv) {
      for (std::uint64_t t = 0; t < s.tokens; ++t) {
        for (std::uint64_t h = 0; h < s.kv_heads; ++h) {
          for (std::uint64_t d = 0; d < s.head_dim; ++d) {
            f(GroupOf(s, lay, group, l, kv, t, h, d), Index(s, l, kv, t, h, d));
          }
        }
      }
    }
  }
}

class KiviCodec final : public Codec {
 public:
  KiviCodec(Spec spec, std::uint32_t bits, std::uint32_t group)
      : spec_(std::move(spec)), bits_(bits), group_(group) {}
  CodecId id() const override { return CodecId::kKivi2; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    const Layout lay = MakeLayout(shape, group_);
    const std::uint64_t groups = lay.nk + lay.nv, n = shape.elements();
    const int bits = static_cast<int>(bits_);
    std::vector<float> lo(groups, INFINITY), hi(groups, -INFINITY);
    bool finite = true;
    ForEachElement(shape, lay, group_, [&](std::uint64_t g, std::uint64_t i) {
      const float x = LoadElement(shape.dtype, kv, i);
      finite = finite && std::isfinite(x);
      lo[g] = std::fmin(lo[g], x);
      hi[g] = std::fmax(hi[g], x);
    });
    if (!finite) return Status::InvalidArgument("kivi2: the KV holds a non-finite value");
    std::vector<float> scale(groups);
    Bytes out(kHeaderBytes + 8 * groups + kernels::packed_bytes(n, bits), 0);
    WriteHeader(Header{CodecId::kKivi2, shape, bits_, group_}, out.data());
    std::uint8_t* params = out.data() + kHeaderBytes;
    for (std::uint64_t g = 0; g < groups; ++g) {
      scale[g] = kernels::asym_scale(lo[g], hi[g], bits);
      if (!std::isfinite(scale[g])) return Status::InvalidArgument("kivi2: a group's range overflows float32");
      PutF32(params + 8 * g, lo[g]);
      PutF32(params + 8 * g + 4, scale[g]);
    }
    std::uint8_t* codes = params + 8 * groups;
    ForEachElement(shape, lay, group_, [&](std::uint64_t g, std::uint64_t i) {
      kernels::pack_code(codes, i, kernels::asym_quantize(LoadElement(shape.dtype, kv, i), lo[g], scale[g], bits), bits);
    });
    return out;
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Result<Header> h = ReadHeader(CodecId::kKivi2, shape, data, size);
    if (!h.ok()) return h.status();
    const std::uint32_t bits_u = h->param0, group = h->param1;
    if (bits_u != 2 && bits_u != 4) return Status::Corrupt("kivi2 payload: bits " + std::to_string(bits_u));
    if (group < 1 || group > kMaxGroup) return Status::Corrupt("kivi2 payload: group " + std::to_string(group));
    const int bits = static_cast<int>(bits_u);
    const Layout lay = MakeLayout(shape, group);
    const std::uint64_t groups = lay.nk + lay.nv, n = shape.elements();
    const std::uint64_t want = kHeaderBytes + 8 * groups + kernels::packed_bytes(n, bits);
    if (size != want) {
      return Status::Corrupt("kivi2 payload: " + std::to_string(size) + " bytes, expected " + std::to_string(want));
    }
    const std::uint8_t* params = data + kHeaderBytes;
    std::vector<float> lo(groups), scale(groups);
    const float levels = static_cast<float>(kernels::asym_levels(bits));
    for (std::uint64_t g = 0; g < groups; ++g) {
      lo[g] = GetF32(params + 8 * g);
      scale[g] = GetF32(params + 8 * g + 4);
      if (!std::isfinite(lo[g]) || !(scale[g] >= 0.0f) || !FitsDtype(shape.dtype, std::fabs(lo[g])) ||
          !FitsDtype(shape.dtype, std::fabs(lo[g] + scale[g] * levels))) {
        return Status::Corrupt("kivi2 payload: invalid group " + std::to_string(g) + " (min " +
                               std::to_string(lo[g]) + ", scale " + std::to_string(scale[g]) + ")");
      }
    }
    const std::uint8_t* codes = params + 8 * groups;
    ForEachElement(shape, lay, group, [&](std::uint64_t g, std::uint64_t i) {
      StoreElement(shape.dtype, out, i, kernels::asym_dequantize(kernels::unpack_code(codes, i, bits), lo[g], scale[g]));
    });
    return Status::Ok();
  }

 private:
  Spec spec_;
  std::uint32_t bits_, group_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeKivi(const Spec& spec) {
  KDN_RETURN_IF_ERROR(RejectUnknownParams(spec, {"bits", "group"}));
  std::uint32_t bits = 2, group = 32;
  if (auto it = spec.params.find("bits"); it != spec.params.end()) {
    Result<std::uint32_t> v = ParseUint("bits", it->second, 2, 4);
    if (!v.ok()) return v.status();
    if (*v == 3) return Status::InvalidArgument("codec parameter bits=3: expected 2 or 4");
    bits = *v;
  }
  if (auto it = spec.params.find("group"); it != spec.params.end()) {
    Result<std::uint32_t> v = ParseUint("group", it->second, 1, kMaxGroup);
    if (!v.ok()) return v.status();
    group = *v;
  }
  Spec normalized{"kivi2", {{"bits", std::to_string(bits)}, {"group", std::to_string(group)}}};
  return std::unique_ptr<Codec>(new KiviCodec(std::move(normalized), bits, group));
}

}  // namespace kdn::codec::internal
