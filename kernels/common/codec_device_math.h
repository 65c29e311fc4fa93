// SPDX-License-Identifier: Apache-2.0
// The per-thread work of the codec kernels (kernels/codec.cu), shared with
// their CPU reference (kernels/ref/codec_ref.h), which runs the same
// functions in the order of the kernels' thread indices. Every function here
// is the whole body of one GPU thread: the kernels are grid-stride loops
// around them, so the CPU tests check the GPU's arithmetic and control flow.
// The element math itself is kdn_quant.h (kdn), quant.h (cachegen's
// symmetric quantization), range_coder.h and half.h.
//
// Argument structs hold raw pointers: device memory for the kernels, host
// memory for the reference. A host parses the payload's headers and tables
// (core/codec/device.h) into the directories below; the payload bytes
// themselves are read in place (unaligned, little-endian).
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/hd.h"
#include "kernels/common/kdn_quant.h"
#include "kernels/common/quant.h"
#include "kernels/common/range_coder.h"

namespace kdn::kernels {

// ---- helpers

KDN_HD std::uint32_t codec_read_u16(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8);
}
KDN_HD float codec_read_half(const std::uint8_t* p) { return half_to_float(static_cast<std::uint16_t>(codec_read_u16(p))); }
KDN_HD float codec_read_f32(const std::uint8_t* p) { return bits_float(kdn_read_u32(p)); }

// A float stored as a chunk element: E is float for dtype 0 (f32), else
// std::uint16_t holding an f16 (dtype 1) or bf16 (dtype 2) pattern; rounding
// to nearest even (half.h), as core/codec's StoreElement.
template <typename E>
KDN_HD E codec_to_element(std::uint32_t dtype, float v) {
  if constexpr (sizeof(E) == 4) {
    (void)dtype;
    return v;
  } else {
    return dtype == 1 ? float_to_half(v) : float_to_bf16(v);
  }
}

// Element i of a chunk of `dtype` (0 f32, 1 f16, 2 bf16), as float.
KDN_HD float codec_load(std::uint32_t dtype, const void* kv, std::uint64_t i) {
  if (dtype == 0) return static_cast<const float*>(kv)[i];
  const std::uint16_t h = static_cast<const std::uint16_t*>(kv)[i];
  return dtype == 1 ? half_to_float(h) : bf16_to_float(h);
}

// A thread index as reported in a `failed` word (~0u means none failed).
KDN_HD std::uint32_t codec_index32(std::uint64_t i) {
  return i < 0xFFFFFFFEull ? static_cast<std::uint32_t>(i) : 0xFFFFFFFEu;
}

KDN_HD bool codec_finite(float x) { return (float_bits(x) & 0x7F800000u) != 0x7F800000u; }

// The symbol s < n with cum[s] <= v < cum[s + 1], for a table of n >= 1
// symbols with cum[0] <= v < cum[n] (absent symbols, cum[s] == cum[s + 1],
// are never chosen). Bisection: log2(n) steps whatever v is.
KDN_HD std::uint32_t codec_find_symbol(const std::uint32_t* cum, std::uint32_t n, std::uint32_t v) {
  std::uint32_t lo = 0, hi = n;  // invariant: cum[lo] <= v < cum[hi]
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    if (cum[mid] <= v) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// A stream's bytes inside the payload (both codecs).
struct CodecStreamDir {
  std::uint64_t offset = 0;  // from the payload's first byte
  std::uint64_t length = 0;
};

// ---- kdn decode (payload: core/codec/kdn.cc)
//
// A plane is (layer, k|v); its channels are cut into `groups` groups of
// `group` channels (the last may be smaller); stream (plane, g) is
// streams[plane * groups + g] and codes tokens [sinks, tokens) of channels
// [g * group, min(channels, (g + 1) * group)).
struct KdnPlaneDir {
  std::uint64_t halves = 0;  // offset of off[channels] f16, then step[channels] f16
  std::uint64_t sinks = 0;   // offset of sinks x channels f16 (token-major)
  std::uint32_t cum = 0;     // index in KdnDirectory::cum of the plane's n + 1 cumulative frequencies
  std::uint32_t n = 0;       // alphabet size: symbols 0..n-1 are codes min_code..min_code+n-1
  std::int32_t min_code = 0;
  std::uint32_t reserved = 0;
};

// ---- kdn encode, the per-element and per-stream parts
//
// The host computes each plane's offsets and steps (statistics over the
// chunk, core/codec/kdn.cc); codes are then element-wise, and each stream is
// coded by one thread.
struct KdnQuantizeArgs {
  const void* kv = nullptr;     // the canonical chunk, dtype
  const float* off = nullptr;   // [n_planes * channels]
  const float* step = nullptr;  // [n_planes * channels]
  std::int8_t* codes = nullptr; // [n_planes * (tokens - sinks) * channels], token-major per plane
  // [n_planes]: the smallest and largest code of each plane (kdn_code_range_init
  // first; then lowered / raised by every element; both 0 for a plane
  // without coded elements, as the CPU codec).
  std::int32_t* code_min = nullptr;
  std::int32_t* code_max = nullptr;
  std::uint32_t n_planes = 0, channels = 0, tokens = 0, sinks = 0;
  std::uint32_t dtype = 0;
};

// Plane p's code range before any element is seen.
KDN_HD void kdn_code_range_init(const KdnQuantizeArgs& a, std::uint64_t plane) {
  const bool empty = a.tokens == a.sinks || a.channels == 0;
  a.code_min[plane] = empty ? 0 : kKdnMaxCode;
  a.code_max[plane] = empty ? 0 : -kKdnMaxCode;
}

KDN_HD std::uint64_t kdn_quantize_threads(const KdnQuantizeArgs& a) {  // element of a non-sink token
  return std::uint64_t{a.n_planes} * (a.tokens - a.sinks) * a.channels;
}

// Element i of `codes`: its code (also returned: the caller folds it into
// the plane's code_min / code_max).
KDN_HD std::int32_t kdn_quantize_work(const KdnQuantizeArgs& a, std::uint64_t i) {
  const std::uint64_t per_plane = std::uint64_t{a.tokens - a.sinks} * a.channels;
  const std::uint64_t plane = i / per_plane, tc = i % per_plane, c = tc % a.channels;
  const float x = codec_load(a.dtype, a.kv, (plane * a.tokens + a.sinks) * a.channels + tc);
  const std::int32_t q = kdn_quantize(x, a.off[plane * a.channels + c], a.step[plane * a.channels + c]);
  a.codes[i] = static_cast<std::int8_t>(q);
  return q;
}

// A symbol's encoder entry: start and freq in the 2^kKdnScaleBits model,
// rcp = kdn_rcp(freq) (freq 0: absent, rcp unused).
struct KdnCoding {
  std::uint32_t start = 0, freq = 0;
  std::uint64_t rcp = 0;
};

struct KdnEncodeArgs {
  const std::int8_t* codes = nullptr;      // as KdnQuantizeArgs::codes
  const std::int32_t* min_code = nullptr;  // [n_planes]: symbol = code - min_code
  const KdnCoding* coding = nullptr;       // [n_planes * kKdnLutStride]
  std::uint16_t* words = nullptr;          // [kdn_encode_words(a)]: each stream's region, see below
  std::uint64_t* bytes = nullptr;          // [n_planes * groups]: each stream's size, ~0 on error
  std::uint32_t n_planes = 0, channels = 0, coded_tokens = 0;  // coded_tokens = tokens - sinks
  std::uint32_t group = 1, groups = 0, lanes = 1;
};

// Stream (plane, g) owns words [begin, end): room for its lanes' states and
// one word per symbol (the most a 12-bit model moves). Its bytes are the
// last bytes[i] / 2 words of the region, as the stream's memory image.
KDN_HD std::uint64_t kdn_encode_region_begin(const KdnEncodeArgs& a, std::uint64_t plane, std::uint64_t g) {
  const std::uint64_t per_plane = std::uint64_t{a.coded_tokens} * a.channels + 2ull * a.lanes * a.groups;
  return plane * per_plane + g * (std::uint64_t{a.coded_tokens} * a.group + 2ull * a.lanes);
}
KDN_HD std::uint64_t kdn_encode_region_end(const KdnEncodeArgs& a, std::uint64_t plane, std::uint64_t g) {
  const std::uint64_t c0 = g * a.group, c1 = c0 + a.group < a.channels ? c0 + a.group : a.channels;
  return kdn_encode_region_begin(a, plane, g) + 2ull * a.lanes + std::uint64_t{a.coded_tokens} * (c1 - c0);
}
KDN_HD std::uint64_t kdn_encode_words(const KdnEncodeArgs& a) {
  return std::uint64_t{a.n_planes} * (std::uint64_t{a.coded_tokens} * a.channels + 2ull * a.lanes * a.groups);
}
KDN_HD std::uint64_t kdn_encode_threads(const KdnEncodeArgs& a) { return std::uint64_t{a.n_planes} * a.groups; }

// Codes stream i = (plane, g): symbol j (token j / width, channel c0 + j %
// width) by state j % lanes, last symbol first, every state starting at
// kKdnRansLow; then the states, lane 0 first. False (bytes[i] = ~0) if a
// symbol has no frequency in the plane's model or lanes is out of range.
KDN_HD bool kdn_encode_work(const KdnEncodeArgs& a, std::uint64_t i) {
  const std::uint64_t plane = i / a.groups, g = i % a.groups;
  const std::uint64_t c0 = g * a.group;
  const std::uint64_t width = (c0 + a.group < a.channels ? c0 + a.group : a.channels) - c0;
  const std::uint32_t lanes = a.lanes;
  if (lanes < 1 || lanes > kKdnMaxLanes) {
    a.bytes[i] = ~std::uint64_t{0};
    return false;
  }
  std::uint16_t* const end = a.words + kdn_encode_region_end(a, plane, g);
  std::uint16_t* ptr = end;
  std::uint32_t x[kKdnMaxLanes];
  for (std::uint32_t l = 0; l < lanes; ++l) x[l] = kKdnRansLow;
  const KdnCoding* coding = a.coding + plane * kKdnLutStride;
  const std::int32_t lo = a.min_code[plane];
  const std::int8_t* codes = a.codes + plane * a.coded_tokens * a.channels;
  const std::uint64_t count = a.coded_tokens * width;
  std::uint32_t lane = static_cast<std::uint32_t>((count + lanes - 1) % lanes);
  for (std::uint64_t j = count; j-- > 0;) {
    const std::int32_t sym = codes[(j / width) * a.channels + c0 + j % width] - lo;
    if (sym < 0 || sym >= static_cast<std::int32_t>(kKdnLutStride) || coding[sym].freq == 0) {
      a.bytes[i] = ~std::uint64_t{0};
      return false;
    }
    const KdnCoding& k = coding[sym];
    x[lane] = kdn_rans_put(x[lane], k.start, k.freq, k.rcp, ptr);
    lane = lane == 0 ? lanes - 1 : lane - 1;
  }
  for (std::uint32_t l = lanes; l-- > 0;) {
    *--ptr = static_cast<std::uint16_t>(x[l] >> 16);
    *--ptr = static_cast<std::uint16_t>(x[l] & 0xFFFFu);
  }
  a.bytes[i] = 2ull * static_cast<std::uint64_t>(end - ptr);
  return true;
}

// ---- cachegen (payload: core/codec/cachegen.cc)
//
// Plane lk = (layer, k|v) has `bins` bins (the payload stores bins - 1),
// qmax = (bins - 1) / 2 and alphabet A = 2 * qmax + 1; a float scale per
// (lk, token); a table per (lk, channel); stream (lk, c, g) codes tokens
// [g * stream_tokens, min(tokens, (g + 1) * stream_tokens)) of channel c.
KDN_HD std::uint32_t cachegen_qmax(std::uint32_t bins_minus_1) { return bins_minus_1 / 2; }
KDN_HD std::uint32_t cachegen_alphabet(std::uint32_t bins_minus_1) { return 2 * cachegen_qmax(bins_minus_1) + 1; }

struct CacheGenDecodeArgs {
  const std::uint8_t* payload = nullptr;   // the whole payload
  std::uint64_t bins_at = 0;               // offset of n_planes bytes: bins - 1
  std::uint64_t scales_at = 0;             // offset of n_planes * tokens f32
  const std::uint32_t* cum = nullptr;      // per (lk, c): A + 1 cumulative frequencies (sum 2^16)
  const std::uint32_t* cum_at = nullptr;   // [n_planes * channels]: index in cum
  const CodecStreamDir* streams = nullptr; // [n_planes * channels * groups]; lengths < 2^32
  void* out = nullptr;                     // E[n_planes * tokens * channels]
  std::uint32_t* failed = nullptr;         // the lowest failing stream index; the caller sets ~0u
  std::uint32_t n_planes = 0, channels = 0, tokens = 0;
  std::uint32_t stream_tokens = 1, groups = 0;
  std::uint32_t dtype = 0;
};

KDN_HD std::uint64_t cachegen_stream_threads(const CacheGenDecodeArgs& a) {
  return std::uint64_t{a.n_planes} * a.channels * a.groups;
}

// Range-decodes stream i = (lk, c, g) and dequantizes each symbol with its
// token's scale. False if the stream does not decode to exactly its bytes.
template <typename E>
KDN_HD bool cachegen_stream_work(const CacheGenDecodeArgs& a, std::uint64_t i) {
  const std::uint64_t g = i % a.groups, lkc = i / a.groups;
  const std::uint64_t lk = lkc / a.channels, c = lkc % a.channels;
  const std::uint32_t bm1 = a.payload[a.bins_at + lk];
  const std::uint32_t A = cachegen_alphabet(bm1);
  const auto qmax = static_cast<std::int32_t>(cachegen_qmax(bm1));
  const std::uint32_t* cm = a.cum + a.cum_at[lkc];
  const std::uint8_t* scales = a.payload + a.scales_at + 4 * lk * a.tokens;
  E* out = static_cast<E*>(a.out);
  const CodecStreamDir& s = a.streams[i];
  RcDecoder d;
  rc_dec_init(d, a.payload + s.offset, static_cast<std::uint32_t>(s.length));
  const std::uint64_t t0 = g * a.stream_tokens;
  const std::uint64_t t1 = t0 + a.stream_tokens < a.tokens ? t0 + a.stream_tokens : a.tokens;
  for (std::uint64_t t = t0; t < t1; ++t) {
    const std::uint32_t v = rc_dec_target(d);
    if (d.bad) break;
    const std::uint32_t sym = codec_find_symbol(cm, A, v);
    rc_dec_take(d, cm[sym], cm[sym + 1] - cm[sym]);
    const float x = sym_dequantize(static_cast<std::int32_t>(sym) - qmax, codec_read_f32(scales + 4 * t));
    out[(lk * a.tokens + t) * a.channels + c] = codec_to_element<E>(a.dtype, x);
  }
  return rc_dec_done(d);
}

// ---- cachegen encode: quantization per (lk, token) row, then one thread
// per stream.
struct CacheGenQuantizeArgs {
  const void* kv = nullptr;                 // the canonical chunk, dtype
  const std::uint8_t* bins = nullptr;       // [n_planes]: bins - 1
  float* scales = nullptr;                  // [n_planes * tokens]
  std::uint8_t* symbols = nullptr;          // [n_planes * tokens * channels]: code + qmax
  std::uint32_t* failed = nullptr;          // the lowest row holding a non-finite value; the caller sets ~0u
  std::uint32_t n_planes = 0, channels = 0, tokens = 0;
  std::uint32_t dtype = 0;
};

KDN_HD std::uint64_t cachegen_rows(const CacheGenQuantizeArgs& a) { return std::uint64_t{a.n_planes} * a.tokens; }

// The largest |x| over channels first, first + stride, ... of row `row`
// (a part of the row's absmax: max is exact, so any split gives the same
// scale), and whether all of them are finite.
KDN_HD float cachegen_absmax_part(const CacheGenQuantizeArgs& a, std::uint64_t row, std::uint32_t first,
                                  std::uint32_t stride, bool& finite) {
  float m = 0.0f;
  for (std::uint64_t c = first; c < a.channels; c += stride) {
    const float x = codec_load(a.dtype, a.kv, row * a.channels + c);
    finite = finite && codec_finite(x);
    const float ax = quant_fabs(x);
    m = ax > m ? ax : m;
  }
  return m;
}

// The row's scale from its absmax.
KDN_HD float cachegen_row_scale(const CacheGenQuantizeArgs& a, std::uint64_t row, float absmax) {
  const std::uint32_t qmax = cachegen_qmax(a.bins[row / a.tokens]);
  return sym_scale(absmax, static_cast<float>(qmax));
}

// Symbol of element (row, c) under the row's scale.
KDN_HD void cachegen_quantize_work(const CacheGenQuantizeArgs& a, std::uint64_t row, std::uint64_t c, float scale) {
  const auto qmax = static_cast<std::int32_t>(cachegen_qmax(a.bins[row / a.tokens]));
  const std::uint64_t i = row * a.channels + c;
  a.symbols[i] = static_cast<std::uint8_t>(sym_quantize(codec_load(a.dtype, a.kv, i), scale, qmax) + qmax);
}

struct CacheGenEncodeArgs {
  const std::uint8_t* symbols = nullptr;  // as CacheGenQuantizeArgs::symbols
  const std::uint8_t* bins = nullptr;     // [n_planes]: bins - 1
  const std::uint32_t* cum = nullptr;     // as CacheGenDecodeArgs
  const std::uint32_t* cum_at = nullptr;
  std::uint8_t* out = nullptr;            // stream i's bytes start at i * cachegen_stream_cap(a)
  std::uint32_t* lengths = nullptr;       // [streams]: each stream's size, ~0u on error
  std::uint32_t n_planes = 0, channels = 0, tokens = 0;
  std::uint32_t stream_tokens = 1, groups = 0;
};

// The room a stream of stream_tokens symbols may need (as the CPU encoder).
KDN_HD std::uint64_t cachegen_stream_cap(const CacheGenEncodeArgs& a) { return 4ull * a.stream_tokens + 8; }
KDN_HD std::uint64_t cachegen_encode_threads(const CacheGenEncodeArgs& a) {
  return std::uint64_t{a.n_planes} * a.channels * a.groups;
}

// Range-codes stream i = (lk, c, g). False (lengths[i] = ~0u) if a symbol is
// outside the alphabet or absent from the table, or the stream outgrew its room.
KDN_HD bool cachegen_encode_work(const CacheGenEncodeArgs& a, std::uint64_t i) {
  const std::uint64_t g = i % a.groups, lkc = i / a.groups;
  const std::uint64_t lk = lkc / a.channels, c = lkc % a.channels;
  const std::uint32_t A = cachegen_alphabet(a.bins[lk]);
  const std::uint32_t* cm = a.cum + a.cum_at[lkc];
  const std::uint64_t cap = cachegen_stream_cap(a);
  RcEncoder e;
  rc_enc_init(e, a.out + i * cap, static_cast<std::uint32_t>(cap));
  const std::uint64_t t0 = g * a.stream_tokens;
  const std::uint64_t t1 = t0 + a.stream_tokens < a.tokens ? t0 + a.stream_tokens : a.tokens;
  for (std::uint64_t t = t0; t < t1; ++t) {
    const std::uint32_t s = a.symbols[(lk * a.tokens + t) * a.channels + c];
    if (s >= A || cm[s + 1] == cm[s]) {
      a.lengths[i] = ~0u;
      return false;
    }
    rc_enc_put(e, cm[s], cm[s + 1] - cm[s]);
  }
  rc_enc_flush(e);
  a.lengths[i] = e.overflow ? ~0u : e.pos;
  return !e.overflow;
}

}  // namespace kdn::kernels
