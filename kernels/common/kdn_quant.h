// SPDX-License-Identifier: Apache-2.0
// Element math of kdn's own codec (core/codec/kdn.cc), shared by the CPU
// codec and the CUDA kernels (kernels/codec.cu):
// - a plane (one layer's keys or values of a chunk) is quantized per channel
//   c with an offset off_c and a step step_c: code = rint((x - off_c) /
//   step_c) clamped to [-kKdnMaxCode, kKdnMaxCode]; x' = code * step_c +
//   off_c rounded once (computed exactly in double, so every path produces
//   the same bits);
// - offsets and steps travel as IEEE half floats; a step is rounded up to
//   the next half (kdn_step_to_half), so |x - x'| <= step_c / 2 still holds
//   for every x the encoder saw within kKdnMaxCode steps of the offset.
// Division is IEEE and rounding to nearest even (no fast-math), as in
// quant.h.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/hd.h"
#include "kernels/common/quant.h"

namespace kdn::kernels {

inline constexpr std::int32_t kKdnMaxCode = 127;
// The smallest step a payload holds: the smallest normal half (2^-14).
inline constexpr float kKdnMinStep = 6.103515625e-05f;
// The largest finite half.
inline constexpr float kKdnMaxHalf = 65504.0f;

KDN_HD std::int32_t kdn_quantize(float x, float off, float step) {
  if (!(step > 0.0f)) return 0;
  float q = quant_rint((x - off) / step);
  const float lim = static_cast<float>(kKdnMaxCode);
  q = q > lim ? lim : (q < -lim ? -lim : q);
  return static_cast<std::int32_t>(q);
}

// code * step + off, rounded once to float. Computed in double, the product
// and the sum are exact, so this equals fmaf(code, step, off) on every path
// without needing an FMA unit: step and off are halves (step normal),
// |code| <= 127, so code * step has at most 19 significant bits between
// 2^-14 and 2^23 and off 11 bits between 2^-24 and 2^16; the exact sum
// spans at most 48 bits < 53.
KDN_HD float kdn_dequantize(std::int32_t code, float off, float step) {
  return static_cast<float>(static_cast<double>(code) * static_cast<double>(step) + static_cast<double>(off));
}

// The half whose value is the smallest >= step (step in [kKdnMinStep,
// kKdnMaxHalf]; the caller clamps).
KDN_HD std::uint16_t kdn_step_to_half(float step) {
  std::uint16_t h = float_to_half(step);
  if (half_to_float(h) < step) ++h;  // positive halves are ordered like their bits
  return h;
}

}  // namespace kdn::kernels

namespace kdn::kernels {

// ---- entropy coding: rANS with 16-bit renormalization
//
// kdn's streams use a 32-bit state in [2^16, 2^32) and move 16-bit words:
// with a 12-bit model one symbol moves at most one word, so a decoder
// renormalizes without branches (this is what makes it fast on CPUs and
// keeps GPU threads in step). (kernels/common/rans.h is the byte-wise
// variant core/codec/rans.cc uses for general streams.)
//
// A stream codes the symbols of `tokens` tokens x `channels` channels of one
// plane, token-major (symbol i = token i / channels, channel i % channels),
// with `lanes` interleaved states (symbol i by state i % lanes) sharing one
// stream: `lanes` little-endian u32 final states, then little-endian u16
// words in decode order. Encoders start every state at kKdnRansLow; a
// decoder requires every state back at kKdnRansLow and every word consumed.
inline constexpr std::uint32_t kKdnScaleBits = 12;
inline constexpr std::uint32_t kKdnMaxLanes = 32;
inline constexpr std::uint32_t kKdnRansLow = 1u << 16;

// floor(x / freq) for any x < 2^32 and freq in [1, 2^kKdnScaleBits], by a
// multiplication with rcp = kdn_rcp(freq) (exact: the error of the
// reciprocal stays below 2^-31 < 1 / freq).
KDN_HD std::uint64_t kdn_rcp(std::uint32_t freq) { return (std::uint64_t{1} << 63) / freq + 1u; }
KDN_HD std::uint32_t kdn_div(std::uint32_t x, std::uint64_t rcp) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint32_t>(__umul64hi(x, rcp) >> 31);
#else
  return static_cast<std::uint32_t>((static_cast<unsigned __int128>(x) * rcp) >> 63);
#endif
}

// Codes one symbol (start, freq of a 2^kKdnScaleBits model, rcp =
// kdn_rcp(freq)) into state x, moving at most one word below `ptr`
// (pre-decremented). Branch-free: ptr[-1] is always written, so it must be
// writable (the caller keeps a word of room below the stream).
KDN_HD std::uint32_t kdn_rans_put(std::uint32_t x, std::uint32_t start, std::uint32_t freq, std::uint64_t rcp,
                                  std::uint16_t*& ptr) {
  // x stays below 2^32 after the put iff x < freq << (32 - kKdnScaleBits)
  // (2^32 for a symbol owning every slot: no renormalization at all).
  const std::uint64_t limit = static_cast<std::uint64_t>(freq) << (32 - kKdnScaleBits);
  const bool emit = x >= limit;
  ptr[-1] = static_cast<std::uint16_t>(x & 0xFFFFu);
  ptr -= emit ? 1 : 0;
  x = emit ? x >> 16 : x;
  const std::uint32_t q = kdn_div(x, rcp);
  return (q << kKdnScaleBits) + (x - q * freq) + start;
}

// A slot's entry of the decode table: freq - 1 (bits 0-11), start (bits
// 12-23), symbol (bits 24-31).
KDN_HD std::uint32_t kdn_slot_pack(std::uint32_t sym, std::uint32_t start, std::uint32_t freq) {
  return (freq - 1u) | (start << 12) | (sym << 24);
}

// The stride of a channel's row in a dequantization table: one entry per
// possible symbol.
inline constexpr std::uint32_t kKdnLutStride = 256;

KDN_HD std::uint32_t kdn_read_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// One symbol of state `s`: writes lut_c[symbol] to *o, advances the state
// and, if it fell below kKdnRansLow, shifts in the word at ptr (without a
// branch). The caller guarantees two readable bytes at ptr.
template <typename E>
KDN_HD void kdn_decode_one(std::uint32_t& s, const std::uint32_t* slots, const E* lut_c, E* o,
                           const std::uint8_t*& ptr) {
  const std::uint32_t e = slots[s & ((1u << kKdnScaleBits) - 1u)];
  *o = lut_c[e >> 24];
  s = ((e & 0xFFFu) + 1u) * (s >> kKdnScaleBits) + (s & ((1u << kKdnScaleBits) - 1u)) - ((e >> 12) & 0xFFFu);
  const std::uint32_t word = static_cast<std::uint32_t>(ptr[0]) | (static_cast<std::uint32_t>(ptr[1]) << 8);
  const bool low = s < kKdnRansLow;
  s = low ? (s << 16) | word : s;
  ptr += low ? 2 : 0;
}

// The value of symbol `sym` of channel c from a dequantization table (rows
// of kKdnLutStride entries, one per channel).
template <typename E>
struct KdnLutValues {
  const E* lut;
  KDN_HD E operator()(std::uint64_t c, std::uint32_t sym) const { return lut[c * kKdnLutStride + sym]; }
};

// kdn_decode_one with a bounds check (false if a word is needed past `end`)
// and the value of channel c's symbol from `value` (a KdnLutValues, or any
// callable giving the same values).
template <typename E, typename Value>
KDN_HD bool kdn_decode_one_checked(std::uint32_t& s, const std::uint32_t* slots, const Value& value,
                                   std::uint64_t c, E* o, const std::uint8_t*& ptr, const std::uint8_t* end) {
  const std::uint32_t e = slots[s & ((1u << kKdnScaleBits) - 1u)];
  *o = value(c, e >> 24);
  s = ((e & 0xFFFu) + 1u) * (s >> kKdnScaleBits) + (s & ((1u << kKdnScaleBits) - 1u)) - ((e >> 12) & 0xFFFu);
  if (s < kKdnRansLow) {
    if (end - ptr < 2) return false;
    s = (s << 16) | static_cast<std::uint32_t>(ptr[0]) | (static_cast<std::uint32_t>(ptr[1]) << 8);
    ptr += 2;
  }
  return true;
}

// Reads the `lanes` initial states of a stream [p, p + len) into x and
// points *ptr at its first word. False if the stream is too short for its
// states or a state is out of range.
KDN_HD bool kdn_stream_begin(const std::uint8_t* p, std::uint64_t len, std::uint32_t lanes, std::uint32_t* x,
                             const std::uint8_t** ptr) {
  if (lanes < 1 || lanes > kKdnMaxLanes || len < 4ull * lanes) return false;
  for (std::uint32_t l = 0; l < lanes; ++l) {
    x[l] = kdn_read_u32(p + 4 * l);
    if (x[l] < kKdnRansLow) return false;
  }
  *ptr = p + 4ull * lanes;
  return true;
}

// Decodes the rows [t, tokens) of a stream whose rows before t are decoded
// (states x, next word at ptr; every row of `channels` symbols starts at
// lane t * channels % lanes), checking bounds on every word, then checks
// that the stream ends exactly: every word consumed, every state back at
// kKdnRansLow. (A fast path decodes the rows far from the end, this one the
// rest.) value(c, symbol) gives channel c's values (KdnLutValues).
template <typename E, typename Value>
KDN_HD bool kdn_stream_finish(std::uint32_t* x, const std::uint8_t* ptr, const std::uint8_t* end,
                              const std::uint32_t* slots, std::uint32_t lanes, std::uint32_t channels,
                              std::uint64_t t, std::uint64_t tokens, const Value& value, E* out, std::uint64_t row) {
  std::uint32_t lane = static_cast<std::uint32_t>(t * channels % lanes);
  for (; t < tokens; ++t) {
    E* o = out + t * row;
    for (std::uint32_t c = 0; c < channels; ++c) {
      if (!kdn_decode_one_checked(x[lane], slots, value, c, o + c, ptr, end)) {
        return false;
      }
      if (++lane == lanes) lane = 0;
    }
  }
  if (ptr != end) return false;
  for (std::uint32_t l = 0; l < lanes; ++l) {
    if (x[l] != kKdnRansLow) return false;
  }
  return true;
}

// Decodes one stream [p, p + len): element (t, c) becomes
// lut[c * kKdnLutStride + symbol], written at out[t * row + c]. `slots`
// holds 2^kKdnScaleBits packed entries (the caller builds them from a valid
// table and fills the lut entries of every symbol the table holds). False
// if the stream is malformed (truncated, trailing bytes, states out of
// range or not back at kKdnRansLow); never reads outside [p, p + len) or
// the tables.
template <typename E>
KDN_HD bool kdn_decode_stream(const std::uint8_t* p, std::uint64_t len, const std::uint32_t* slots,
                              std::uint32_t lanes, std::uint32_t channels, std::uint64_t tokens, const E* lut,
                              E* out, std::uint64_t row) {
  constexpr std::uint32_t n = kKdnLutStride;
  std::uint32_t x[kKdnMaxLanes];
  const std::uint8_t* ptr = nullptr;
  if (!kdn_stream_begin(p, len, lanes, x, &ptr)) return false;
  const std::uint8_t* const end = p + len;
  std::uint64_t t = 0;
  if (lanes == 8 && channels % 8 == 0) {
    // The common case, unrolled: 8 states in registers, each token's row
    // starting at lane 0, and no bounds checks while a whole row's worth of
    // words (one per symbol at most) remains.
    std::uint32_t x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3], x4 = x[4], x5 = x[5], x6 = x[6], x7 = x[7];
    for (; t < tokens && static_cast<std::uint64_t>(end - ptr) >= 2ull * channels; ++t) {
      E* o = out + t * row;
      for (std::uint32_t c = 0; c < channels; c += 8) {
        const E* lc = lut + std::uint64_t{c} * n;
        kdn_decode_one(x0, slots, lc, o + c, ptr);
        kdn_decode_one(x1, slots, lc + n, o + c + 1, ptr);
        kdn_decode_one(x2, slots, lc + 2 * n, o + c + 2, ptr);
        kdn_decode_one(x3, slots, lc + 3 * n, o + c + 3, ptr);
        kdn_decode_one(x4, slots, lc + 4 * n, o + c + 4, ptr);
        kdn_decode_one(x5, slots, lc + 5 * n, o + c + 5, ptr);
        kdn_decode_one(x6, slots, lc + 6 * n, o + c + 6, ptr);
        kdn_decode_one(x7, slots, lc + 7 * n, o + c + 7, ptr);
      }
    }
    x[0] = x0, x[1] = x1, x[2] = x2, x[3] = x3, x[4] = x4, x[5] = x5, x[6] = x6, x[7] = x7;
  }
  // The general case, and the last rows near the end of the stream.
  return kdn_stream_finish(x, ptr, end, slots, lanes, channels, t, tokens, KdnLutValues<E>{lut}, out, row);
}

}  // namespace kdn::kernels
