// SPDX-License-Identifier: Apache-2.0
// State transitions of 32-bit rANS (Duda's asymmetric numeral systems, range
// variant) with byte-wise renormalization, shared by the CPU codec
// (core/codec/rans.cc) and CUDA decoders. No allocation, no std:: containers.
//
// - A state x lives in [kRansLow, kRansLow << 8) = [2^23, 2^31) between symbols.
// - Probabilities are quantized to `scale_bits` bits (M = 2^scale_bits,
//   1 <= scale_bits <= kRansMaxScaleBits): symbol s owns the slots
//   [start_s, start_s + freq_s) of [0, M), freq_s >= 1 for coded symbols.
// - Encoding runs over the symbols in reverse and writes bytes downwards
//   (`ptr` is pre-decremented); decoding reads them upwards in forward order.
//   Per symbol the encoder calls rans_enc_renorm then rans_enc_put; the
//   decoder calls rans_dec_slot (-> symbol, via the caller's table),
//   rans_dec_advance, then rans_dec_renorm.
// - With scale_bits <= 15 one symbol emits at most 2 renormalization bytes
//   (rans_max_bytes_per_symbol), and a decoded state never drops below 2^8,
//   so rans_dec_renorm reads at most 2 bytes.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace kdn::kernels {

inline constexpr std::uint32_t kRansLow = 1u << 23;         // lower bound of the state
inline constexpr std::uint32_t kRansHigh = kRansLow << 8;   // exclusive upper bound (2^31)
inline constexpr std::uint32_t kRansDefaultScaleBits = 12;
inline constexpr std::uint32_t kRansMaxScaleBits = 15;      // keeps freq in u16, limits in u32
inline constexpr std::uint32_t kRansStateBytes = 4;         // a flushed state, little-endian

KDN_HD bool rans_state_valid(std::uint32_t x) { return x >= kRansLow && x < kRansHigh; }

KDN_HD std::uint32_t rans_max_bytes_per_symbol(std::uint32_t scale_bits) { return (scale_bits + 7) / 8; }

// ---- encoder

// The exclusive bound on x before coding a symbol of frequency `freq`: after
// rans_enc_put from any x below it the state stays below 2^31.
KDN_HD std::uint32_t rans_enc_limit(std::uint32_t freq, std::uint32_t scale_bits) {
  return ((kRansLow >> scale_bits) << 8) * freq;
}

// Shifts bytes out of x (low byte first, written at --ptr) until x is below
// the symbol's limit. Returns the renormalized state.
KDN_HD std::uint32_t rans_enc_renorm(std::uint32_t x, std::uint32_t freq, std::uint32_t scale_bits,
                                     std::uint8_t*& ptr) {
  const std::uint32_t limit = rans_enc_limit(freq, scale_bits);
  while (x >= limit) {
    *--ptr = static_cast<std::uint8_t>(x & 0xffu);
    x >>= 8;
  }
  return x;
}

// C(s, x) = floor(x / freq) * M + (x mod freq) + start (x renormalized).
KDN_HD std::uint32_t rans_enc_put(std::uint32_t x, std::uint32_t start, std::uint32_t freq,
                                  std::uint32_t scale_bits) {
  return ((x / freq) << scale_bits) + (x % freq) + start;
}

// Writes a final state as 4 little-endian bytes below ptr.
KDN_HD void rans_enc_flush(std::uint32_t x, std::uint8_t*& ptr) {
  ptr -= kRansStateBytes;
  ptr[0] = static_cast<std::uint8_t>(x);
  ptr[1] = static_cast<std::uint8_t>(x >> 8);
  ptr[2] = static_cast<std::uint8_t>(x >> 16);
  ptr[3] = static_cast<std::uint8_t>(x >> 24);
}

// ---- decoder

// Reads a state flushed by rans_enc_flush (the caller checks 4 bytes remain
// and rans_state_valid).
KDN_HD std::uint32_t rans_dec_read_state(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}

// The slot in [0, M) of the next symbol; the caller maps it to a symbol.
KDN_HD std::uint32_t rans_dec_slot(std::uint32_t x, std::uint32_t scale_bits) {
  return x & ((1u << scale_bits) - 1u);
}

// D(x) = freq * floor(x / M) + slot - start, for the symbol owning the slot.
// No overflow for any x < 2^31 and start <= slot < start + freq <= M.
KDN_HD std::uint32_t rans_dec_advance(std::uint32_t x, std::uint32_t start, std::uint32_t freq,
                                      std::uint32_t scale_bits) {
  return freq * (x >> scale_bits) + rans_dec_slot(x, scale_bits) - start;
}

// Shifts bytes from [ptr, end) into x until x >= kRansLow. False (x and ptr
// then unspecified) if the stream ends first; never reads at or past end.
KDN_HD bool rans_dec_renorm(std::uint32_t& x, const std::uint8_t*& ptr, const std::uint8_t* end) {
  while (x < kRansLow) {
    if (ptr == end) return false;
    x = (x << 8) | *ptr++;
  }
  return true;
}

}  // namespace kdn::kernels
