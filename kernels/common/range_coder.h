// SPDX-License-Identifier: Apache-2.0
// A 32-bit carry-less range coder (Subbotin's), shared by the CPU codec
// (core/codec/cachegen.cc) and a CUDA path: one coder state per stream, so
// one GPU thread can run one stream. Frequencies are 16-bit: every table's
// frequencies sum to exactly 2^16 (kRcTotalBits), each used symbol >= 1.
//
// State: low and range are u32; the encoder starts at low 0, range
// 0xFFFFFFFF. Per symbol (cum, freq): range >>= 16; low += cum * range;
// range *= freq; then renormalize bytewise: while the top byte of low and
// low + range agree (xor < 2^24), or range < 2^16 (then range is cut to
// -low mod 2^16 so the interval ends on a 2^16 boundary), emit low >> 24 and
// shift low and range left by 8. Flush emits the 4 bytes of low. The decoder
// reads 4 bytes into code and mirrors every step, reading one byte per
// shift, so it consumes exactly the bytes the encoder wrote.
// Decoder errors (target >= 2^16, reading past the stream's end) set
// `bad`; callers reject the stream. Nothing here reads or writes out of
// bounds whatever the input.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace kdn::kernels {

inline constexpr std::uint32_t kRcTotalBits = 16;
inline constexpr std::uint32_t kRcTotal = 1u << kRcTotalBits;
inline constexpr std::uint32_t kRcTop = 1u << 24;
inline constexpr std::uint32_t kRcBot = 1u << 16;

struct RcEncoder {
  std::uint32_t low, range;
  std::uint8_t* out;
  std::uint32_t pos, cap;
  bool overflow;  // out had no room: the stream is incomplete
};

struct RcDecoder {
  std::uint32_t low, range, code;
  const std::uint8_t* in;
  std::uint32_t pos, size;
  bool bad;  // read past the end, or a target outside the table
};

KDN_HD void rc_enc_init(RcEncoder& e, std::uint8_t* out, std::uint32_t cap) {
  e.low = 0;
  e.range = 0xFFFFFFFFu;
  e.out = out;
  e.pos = 0;
  e.cap = cap;
  e.overflow = false;
}

KDN_HD void rc_enc_byte(RcEncoder& e, std::uint32_t b) {
  if (e.pos < e.cap) {
    e.out[e.pos++] = static_cast<std::uint8_t>(b);
  } else {
    e.overflow = true;
  }
}

// Shared renormalization predicate: whether another byte must be shifted
// out (may cut range, as the encoder and decoder both must).
KDN_HD bool rc_needs_shift(std::uint32_t low, std::uint32_t& range) {
  if ((low ^ (low + range)) < kRcTop) return true;
  if (range < kRcBot) {
    range = (0u - low) & (kRcBot - 1);
    return true;
  }
  return false;
}

// Encodes the symbol occupying [cum, cum + freq) of 2^16 (freq >= 1).
KDN_HD void rc_enc_put(RcEncoder& e, std::uint32_t cum, std::uint32_t freq) {
  e.range >>= kRcTotalBits;
  e.low += cum * e.range;
  e.range *= freq;
  while (rc_needs_shift(e.low, e.range)) {
    rc_enc_byte(e, e.low >> 24);
    e.low <<= 8;
    e.range <<= 8;
  }
}

KDN_HD void rc_enc_flush(RcEncoder& e) {
  for (int i = 0; i < 4; ++i) {
    rc_enc_byte(e, e.low >> 24);
    e.low <<= 8;
  }
}

KDN_HD std::uint32_t rc_dec_byte(RcDecoder& d) {
  if (d.pos < d.size) return d.in[d.pos++];
  d.bad = true;
  return 0;
}

KDN_HD void rc_dec_init(RcDecoder& d, const std::uint8_t* in, std::uint32_t size) {
  d.low = 0;
  d.range = 0xFFFFFFFFu;
  d.in = in;
  d.pos = 0;
  d.size = size;
  d.bad = false;
  d.code = 0;
  for (int i = 0; i < 4; ++i) d.code = (d.code << 8) | rc_dec_byte(d);
}

// The next symbol's target in [0, 2^16): the caller finds the symbol s with
// cum[s] <= target < cum[s] + freq[s] and calls rc_dec_take. A target
// >= 2^16 (only from corrupt input) sets bad and returns kRcTotal.
KDN_HD std::uint32_t rc_dec_target(RcDecoder& d) {
  d.range >>= kRcTotalBits;
  const std::uint32_t v = (d.code - d.low) / d.range;  // range >= 1: it was >= 2^16
  if (v >= kRcTotal) {
    d.bad = true;
    return kRcTotal;
  }
  return v;
}

KDN_HD void rc_dec_take(RcDecoder& d, std::uint32_t cum, std::uint32_t freq) {
  d.low += cum * d.range;
  d.range *= freq;
  while (rc_needs_shift(d.low, d.range)) {
    d.code = (d.code << 8) | rc_dec_byte(d);
    d.low <<= 8;
    d.range <<= 8;
  }
}

// Whether a decoder finished cleanly: no error, every byte consumed.
KDN_HD bool rc_dec_done(const RcDecoder& d) { return !d.bad && d.pos == d.size; }

}  // namespace kdn::kernels
