// SPDX-License-Identifier: Apache-2.0
// kdn's entropy coder: static-model rANS over byte symbols (alphabet <= 256),
// with 1..kMaxLanes interleaved states sharing one byte stream (symbol i is
// coded by state i % lanes), so a decoder has `lanes` independent dependency
// chains. The state math is kernels/common/rans.h, shared with CUDA.
//
// Stream (Encode's output, Decode's input): the `lanes` final encoder states
// as little-endian u32 (state 0 first), then the renormalization bytes in
// decode order. An empty sequence is the lanes states alone (each 2^23).
// Decode requires every byte to be consumed and every state to end at 2^23.
//
// Table serialization (SerializeTable / ParseTable), little-endian:
//   scale_bits                u8, 1..15
//   alphabet size n           LEB128 varint, 1..256
//   freq[0..n)                n x LEB128 varint (0 = symbol absent; at most 3
//                             bytes each, no overlong encodings), sum = 2^scale_bits
// A 256-symbol table at scale 12 is at most ~2 + 512 bytes; a sparse one
// about 1 byte per symbol below the largest present symbol.
//
// Thread-safety: plain functions on values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/util/status.h"

namespace kdn::codec::rans {

inline constexpr std::uint32_t kDefaultScaleBits = 12;
inline constexpr std::uint32_t kMaxScaleBits = 15;
inline constexpr std::size_t kMaxAlphabet = 256;
inline constexpr std::uint32_t kMaxLanes = 32;

// A normalized static model. freq.size() is the alphabet size n; cum has n + 1
// entries, cum[s] = freq[0] + ... + freq[s - 1], cum[n] = 2^scale_bits.
struct FreqTable {
  std::uint32_t scale_bits = kDefaultScaleBits;
  std::vector<std::uint16_t> freq;
  std::vector<std::uint32_t> cum;
};

// Occurrences of each byte value; the result has (largest symbol + 1)
// entries (empty for an empty input).
std::vector<std::uint64_t> Histogram(std::span<const std::uint8_t> symbols);

// Normalizes `counts` (alphabet size = counts.size(), 1..256) to a sum of
// exactly 2^scale_bits: every symbol with a nonzero count gets freq >= 1,
// absent ones 0; rounding is corrected greedily by the least code-length
// cost. All-zero counts give symbol 0 the whole range (a table for the empty
// sequence). kInvalidArgument on a bad scale, alphabet size, or more present
// symbols than slots.
Result<FreqTable> BuildTable(std::span<const std::uint64_t> counts,
                             std::uint32_t scale_bits = kDefaultScaleBits);

// Ok iff the table is consistent (scale range, sizes, cum prefix sums, sum).
Status ValidateTable(const FreqTable& table);

// Appends the serialized table (format above) to *out. The table must be valid.
void SerializeTable(const FreqTable& table, std::vector<std::uint8_t>* out);

// Parses a table from the front of `data`; *consumed (if non-null) gets its
// size in bytes. kCorrupt on truncation, bad scale, alphabet or sum.
Result<FreqTable> ParseTable(std::span<const std::uint8_t> data, std::size_t* consumed = nullptr);

// slot -> symbol for slots [0, 2^scale_bits) of a valid table.
std::vector<std::uint8_t> BuildSlotTable(const FreqTable& table);

// Codes `symbols` with `lanes` interleaved states (1 = plain single-state
// rANS; 4 or 8 for interleaved decoding). kInvalidArgument on a bad table or
// lane count, or a symbol outside the alphabet or of frequency 0.
Result<std::vector<std::uint8_t>> Encode(std::span<const std::uint8_t> symbols, const FreqTable& table,
                                         std::uint32_t lanes = 1);

// Decodes `count` symbols into out[0, count). kInvalidArgument on a bad
// table or lane count; kCorrupt on a truncated stream, trailing bytes, a
// state out of range, or final states that do not match the encoder's
// initial ones. Never reads outside `bytes`; on error `out` is unspecified.
Status Decode(std::span<const std::uint8_t> bytes, const FreqTable& table, std::size_t count,
              std::uint8_t* out, std::uint32_t lanes = 1);
// The same with a prebuilt BuildSlotTable(table) (for repeated decodes).
Status Decode(std::span<const std::uint8_t> bytes, const FreqTable& table,
              std::span<const std::uint8_t> slots, std::size_t count, std::uint8_t* out,
              std::uint32_t lanes = 1);

}  // namespace kdn::codec::rans
