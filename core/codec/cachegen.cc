// SPDX-License-Identifier: Apache-2.0
// cachegen: a re-implementation of LMCache's CacheGen, kdn's baseline.
//
// Quantization (kernels/common/quant.h, symmetric): one float32 scale per
// (layer, k|v, token), scale = absmax / qmax over that token's kv_heads x
// head_dim channels; code = rint(x / scale) in [-qmax, qmax], x' = code *
// scale, with qmax = (bins - 1) / 2 (LMCache: bins / 2 - 1 for its even bin
// counts; 15 for 32 bins, 7 for 16). Symbols are code + qmax in [0, A),
// A = 2 * qmax + 1 <= bins. Bin counts per (layer, k|v): LMCache's default
// (param0 = 0): keys 32 in layers 0-9, 16 after; values 32 in layers 0-1,
// 16 after; models under 10 layers 32 everywhere. "cachegen:bins=N"
// (param0 = N, 3..256) forces N everywhere.
//
// Entropy coding (kernels/common/range_coder.h): a 16-bit frequency table
// per (layer, k|v, channel), computed from the chunk (counts over all its
// tokens normalized to sum 2^16, every occurring symbol >= 1); one
// independent range-coded stream per (layer, k|v, channel, group of at most
// 256 tokens) (param1 = 256, the cap), so one GPU thread can run one stream.
//
// Payload: header (param0 = 0 or the forced bins, param1 = 256), then
//   bins:    2 * layers bytes, bins - 1 per (layer, kv)
//   scales:  S = layers * 2 * tokens float32, index (layer * 2 + kv) * tokens + token
//   tables:  per (layer, kv, channel) in order: a bitmap of the symbols that
//            occur (ceil(A / 8) bytes, bit s of byte s / 8; padding bits 0),
//            then u16 (freq - 1) per occurring symbol, ascending; the
//            frequencies sum to 2^16 (no symbols at all when tokens = 0)
//   lengths: u32 byte length per stream, order (layer, kv, channel, group)
//   streams: the streams' bytes, same order.
// The size is exact (header + all of the above); Decode rejects (kCorrupt)
// every inconsistency: bins outside [3, 256] or not matching param0's
// schedule, bad scales, bad bitmaps or sums, lengths that overrun or leave
// bytes over, and streams that do not decode to exactly their bytes.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/codec/payload.h"
#include "kernels/common/quant.h"
#include "kernels/common/range_coder.h"

namespace kdn::codec::internal {
namespace {

constexpr std::uint32_t kStreamTokens = 256;
constexpr std::uint32_t kMinBins = 3, kMaxBins = 256;

std::uint32_t QmaxOf(std::uint32_t bins) { return (bins - 1) / 2; }

// LMCache's schedule (param0 = 0) or `forced` bins everywhere.
std::uint32_t ScheduleBins(std::uint32_t forced, std::uint32_t layers, std::uint32_t layer, std::uint32_t kv) {
  if (forced != 0) return forced;
  if (layers < 10) return 32;
  if (kv == 0) return layer < 10 ? 32 : 16;
  return layer < 2 ? 32 : 16;
}

void PutU16(Bytes& out, std::uint32_t v) {
  out.push_back(static_cast<std::uint8_t>(v));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
}
void PutU32At(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t GetU32At(const std::uint8_t* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

// Counts (summing to n > 0) normalized to 2^16: floor(c * 2^16 / n), at
// least 1 where c > 0, the difference added to (or taken from) the most
// frequent symbol, which keeps >= 1 (it holds >= 2^16 / A >= 256 before).
std::vector<std::uint32_t> Normalize(const std::vector<std::uint32_t>& counts, std::uint64_t n) {
  std::vector<std::uint32_t> f(counts.size(), 0);
  std::int64_t sum = 0;
  size_t top = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    if (counts[s] == 0) continue;
    f[s] = static_cast<std::uint32_t>(std::max<std::uint64_t>(1, std::uint64_t{counts[s]} * kernels::kRcTotal / n));
    sum += f[s];
    if (counts[s] > counts[top]) top = s;
  }
  f[top] = static_cast<std::uint32_t>(static_cast<std::int64_t>(f[top]) + (std::int64_t{kernels::kRcTotal} - sum));
  return f;
}

class CacheGenCodec final : public Codec {
 public:
  CacheGenCodec(Spec spec, std::uint32_t forced) : spec_(std::move(spec)), forced_(forced) {}
  CodecId id() const override { return CodecId::kCacheGen; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    const std::uint64_t L = shape.layers, T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
    const std::uint64_t n_scales = L * 2 * T, groups = (T + kStreamTokens - 1) / kStreamTokens;
    if (L * 2 * C * groups > 0xFFFFFFFFull) return Status::InvalidArgument("cachegen: too many streams");
    Bytes out(kHeaderBytes + 2 * L + 4 * n_scales);
    WriteHeader(Header{CodecId::kCacheGen, shape, forced_, kStreamTokens}, out.data());
    std::vector<std::uint8_t> sym(shape.elements());
    for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
      const std::uint32_t bins = ScheduleBins(forced_, shape.layers, static_cast<std::uint32_t>(lk / 2),
                                              static_cast<std::uint32_t>(lk % 2));
      const auto qmax = static_cast<std::int32_t>(QmaxOf(bins));
      out[kHeaderBytes + lk] = static_cast<std::uint8_t>(bins - 1);
      for (std::uint64_t t = 0; t < T; ++t) {
        const std::uint64_t b = lk * T + t;
        float absmax = 0.0f;
        for (std::uint64_t i = b * C; i < (b + 1) * C; ++i) {
          const float x = LoadElement(shape.dtype, kv, i);
          if (!std::isfinite(x)) return Status::InvalidArgument("cachegen: the KV holds a non-finite value");
          absmax = std::fmax(absmax, std::fabs(x));
        }
        const float scale = kernels::sym_scale(absmax, static_cast<float>(qmax));
        PutF32(out.data() + kHeaderBytes + 2 * L + 4 * b, scale);
        for (std::uint64_t i = b * C; i < (b + 1) * C; ++i) {
          sym[i] = static_cast<std::uint8_t>(kernels::sym_quantize(LoadElement(shape.dtype, kv, i), scale, qmax) + qmax);
        }
      }
    }
    // Tables, then the streams (lengths filled in as they are coded).
    std::vector<std::vector<std::uint32_t>> freqs(L * 2 * C), cums(L * 2 * C);
    for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
      const std::uint32_t A = 2 * QmaxOf(out[kHeaderBytes + lk] + 1u) + 1;
      for (std::uint64_t c = 0; c < C; ++c) {
        std::vector<std::uint32_t> counts(A, 0);
        for (std::uint64_t t = 0; t < T; ++t) ++counts[sym[(lk * T + t) * C + c]];
        const size_t bitmap = out.size();
        out.resize(out.size() + (A + 7) / 8, 0);
        if (T == 0) continue;
        std::vector<std::uint32_t>& f = freqs[lk * C + c];
        std::vector<std::uint32_t>& cum = cums[lk * C + c];
        f = Normalize(counts, T);
        cum.assign(A + 1, 0);
        for (std::uint32_t s = 0; s < A; ++s) {
          cum[s + 1] = cum[s] + f[s];
          if (f[s] == 0) continue;
          out[bitmap + s / 8] |= static_cast<std::uint8_t>(1u << (s % 8));
          PutU16(out, f[s] - 1);
        }
      }
    }
    const size_t lengths = out.size();
    out.resize(out.size() + 4 * L * 2 * C * groups);
    std::vector<std::uint8_t> buf(4 * kStreamTokens + 8);
    std::uint64_t stream = 0;
    for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
      for (std::uint64_t c = 0; c < C; ++c) {
        const std::vector<std::uint32_t>& f = freqs[lk * C + c];
        const std::vector<std::uint32_t>& cum = cums[lk * C + c];
        for (std::uint64_t g = 0; g < groups; ++g, ++stream) {
          kernels::RcEncoder e;
          kernels::rc_enc_init(e, buf.data(), static_cast<std::uint32_t>(buf.size()));
          for (std::uint64_t t = g * kStreamTokens; t < std::min(T, (g + 1) * kStreamTokens); ++t) {
            const std::uint8_t s = sym[(lk * T + t) * C + c];
            kernels::rc_enc_put(e, cum[s], f[s]);
          }
          kernels::rc_enc_flush(e);
          if (e.overflow) return Status::Internal("cachegen: a stream outgrew its bound");
          PutU32At(out.data() + lengths + 4 * stream, e.pos);
          out.insert(out.end(), buf.begin(), buf.begin() + e.pos);
        }
      }
    }
    return out;
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Result<Header> h = ReadHeader(CodecId::kCacheGen, shape, data, size);
    if (!h.ok()) return h.status();
    if (h->param1 != kStreamTokens) {
      return Status::Corrupt("cachegen payload: stream cap " + std::to_string(h->param1) + ", expected 256");
    }
    if (h->param0 != 0 && (h->param0 < kMinBins || h->param0 > kMaxBins)) {
      return Status::Corrupt("cachegen payload: bins " + std::to_string(h->param0));
    }
    const std::uint64_t L = shape.layers, T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
    const std::uint64_t n_scales = L * 2 * T, groups = (T + kStreamTokens - 1) / kStreamTokens;
    const std::uint64_t n_streams = L * 2 * C * groups;
    std::uint64_t pos = kHeaderBytes;
    auto need = [&](std::uint64_t n, const char* what) -> Status {
      if (n > size - pos) return Status::Corrupt(std::string("cachegen payload: truncated in the ") + what);
      return Status::Ok();
    };
    KDN_RETURN_IF_ERROR(need(2 * L + 4 * n_scales, "bins and scales"));
    const std::uint8_t* bins = data + pos;
    for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
      const std::uint32_t b = bins[lk] + 1u;
      if (b < kMinBins || b != ScheduleBins(h->param0, shape.layers, static_cast<std::uint32_t>(lk / 2),
                                            static_cast<std::uint32_t>(lk % 2))) {
        return Status::Corrupt("cachegen payload: bins " + std::to_string(b) + " at " + std::to_string(lk) +
                               " do not match the schedule");
      }
    }
    pos += 2 * L;
    const std::uint8_t* scales = data + pos;
    for (std::uint64_t b = 0; b < n_scales; ++b) {
      const float scale = GetF32(scales + 4 * b);
      const float qmax = static_cast<float>(QmaxOf(bins[b / T] + 1u));
      if (!(scale >= 0.0f) || !FitsDtype(shape.dtype, scale * qmax)) {
        return Status::Corrupt("cachegen payload: invalid scale " + std::to_string(scale) + " at " + std::to_string(b));
      }
    }
    pos += 4 * n_scales;
    // Tables: cum per channel, A + 1 entries each (symbols absent: freq 0).
    std::vector<std::uint32_t> cum_at(L * 2 * C + 1, 0);
    std::vector<std::uint32_t> cum;
    for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
      const std::uint32_t A = 2 * QmaxOf(bins[lk] + 1u) + 1;
      for (std::uint64_t c = 0; c < C; ++c) {
        KDN_RETURN_IF_ERROR(need((A + 7) / 8, "tables"));
        const std::uint8_t* bitmap = data + pos;
        pos += (A + 7) / 8;
        if (A % 8 != 0 && (bitmap[A / 8] >> (A % 8)) != 0) {
          return Status::Corrupt("cachegen payload: a table marks symbols beyond its alphabet");
        }
        cum_at[lk * C + c] = static_cast<std::uint32_t>(cum.size());
        std::uint32_t sum = 0;
        cum.push_back(0);
        for (std::uint32_t s = 0; s < A; ++s) {
          if ((bitmap[s / 8] >> (s % 8)) & 1u) {
            KDN_RETURN_IF_ERROR(need(2, "tables"));
            sum += (std::uint32_t{data[pos]} | std::uint32_t{data[pos + 1]} << 8) + 1u;
            pos += 2;
            if (sum > kernels::kRcTotal) return Status::Corrupt("cachegen payload: a table sums beyond 2^16");
          }
          cum.push_back(sum);
        }
        if (sum != (T == 0 ? 0u : kernels::kRcTotal)) {
          return Status::Corrupt("cachegen payload: a table sums to " + std::to_string(sum) + ", not 2^16");
        }
      }
    }
    KDN_RETURN_IF_ERROR(need(4 * n_streams, "stream lengths"));
    const std::uint8_t* lengths = data + pos;
    pos += 4 * n_streams;
    std::uint64_t total = 0;
    for (std::uint64_t s = 0; s < n_streams; ++s) total += GetU32At(lengths + 4 * s);
    if (total != size - pos) {
      return Status::Corrupt("cachegen payload: streams hold " + std::to_string(size - pos) + " bytes, lengths say " +
                             std::to_string(total));
    }
    std::uint64_t stream = 0;
    for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
      const std::uint32_t A = 2 * QmaxOf(bins[lk] + 1u) + 1;
      const auto qmax = static_cast<std::int32_t>(QmaxOf(bins[lk] + 1u));
      for (std::uint64_t c = 0; c < C; ++c) {
        const std::uint32_t* cm = cum.data() + cum_at[lk * C + c];
        for (std::uint64_t g = 0; g < groups; ++g, ++stream) {
          const std::uint32_t len = GetU32At(lengths + 4 * stream);
          kernels::RcDecoder d;
          kernels::rc_dec_init(d, data + pos, len);
          for (std::uint64_t t = g * kStreamTokens; t < std::min(T, (g + 1) * kStreamTokens); ++t) {
            const std::uint32_t v = kernels::rc_dec_target(d);
            if (d.bad) break;
            // The symbol s with cm[s] <= v < cm[s + 1] (absent symbols have
            // cm[s] == cm[s + 1] and are never chosen).
            std::uint32_t lo = 0, hi = A;  // invariant: cm[lo] <= v < cm[hi]
            while (hi - lo > 1) {
              const std::uint32_t mid = (lo + hi) / 2;
              if (cm[mid] <= v) lo = mid; else hi = mid;
            }
            kernels::rc_dec_take(d, cm[lo], cm[lo + 1] - cm[lo]);
            const std::uint64_t i = (lk * T + t) * C + c;
            const float scale = GetF32(scales + 4 * (lk * T + t));
            StoreElement(shape.dtype, out, i,
                         kernels::sym_dequantize(static_cast<std::int32_t>(lo) - qmax, scale));
          }
          if (!kernels::rc_dec_done(d)) {
            return Status::Corrupt("cachegen payload: stream " + std::to_string(stream) + " does not decode");
          }
          pos += len;
        }
      }
    }
    return Status::Ok();
  }

 private:
  Spec spec_;
  std::uint32_t forced_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeCacheGen(const Spec& spec) {
  KDN_RETURN_IF_ERROR(RejectUnknownParams(spec, {"bins"}));
  std::uint32_t forced = 0;
  if (auto it = spec.params.find("bins"); it != spec.params.end()) {
    Result<std::uint32_t> b = ParseUint("bins", it->second, kMinBins, kMaxBins);
    if (!b.ok()) return b.status();
    forced = *b;
  }
  return std::unique_ptr<Codec>(new CacheGenCodec(spec, forced));
}

}  // namespace kdn::codec::internal
