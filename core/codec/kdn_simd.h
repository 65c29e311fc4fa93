// SPDX-License-Identifier: Apache-2.0
// kdn streams (kernels/common/kdn_quant.h) decoded with vector
// instructions (AVX2 and F16C, or AVX-512), several streams at once: the
// CPU's fast path for the kdn codec (x86-64; elsewhere, and on CPUs without
// them, streams take the scalar path). The output is
// the same, bit for bit, as kernels::kdn_decode_stream's (which the device
// path runs), and so is the verdict on malformed streams; only the order of
// the work differs. Rows far from a stream's end are decoded 8 lanes per
// vector; the rest by kdn_stream_finish.
//
// Thread-safety: plain functions.
#pragma once

#include <array>
#include <cstdint>

namespace kdn::codec::internal {

// One stream to decode: kernels::kdn_decode_stream's arguments, with the
// values of the symbols either from `lut` or, when `step` is set, computed
// as the lut's entries are: element (t, c) = the dtype's value of
// kdn_dequantize(min_code + symbol, off[c], step[c]) (off and step hold the
// channels' floats; the dtype is E's: float, or `dtype` 1 f16 / 2 bf16).
// Computed values need KdnSimdComputes(lanes, channels).
template <typename E>
struct KdnStream {
  const std::uint8_t* p = nullptr;
  std::uint64_t len = 0;
  const std::uint32_t* slots = nullptr;
  std::uint32_t lanes = 0, channels = 0;
  std::uint64_t tokens = 0;
  const E* lut = nullptr;
  E* out = nullptr;
  std::uint64_t row = 0;
  const double* step = nullptr;
  const double* off = nullptr;
  std::int32_t min_code = 0;
  std::uint32_t dtype = 0;
  // The end of the readable bytes around the stream (at least p + len): the
  // SIMD path reads words in blocks of 16 bytes and may read past the
  // stream's end (into the next one) before it finds the stream malformed.
  const std::uint8_t* limit = nullptr;
};

// The vector decoders, in order.
enum class KdnSimd { kNone = 0, kAvx2 = 1, kAvx512 = 2 };

// The vector code this process uses (the decoder here and the encoder,
// kdn_encode_avx2.h): the best the CPU has, or less if the
// environment variable KDN_CPU_SIMD says so ("none" or "avx2", for tests
// and for comparing them), read once.
KdnSimd KdnSimdInUse();

// The best the CPU has (AVX2 with F16C and POPCNT and the OS saving the YMM
// state, or AVX-512 too), whatever KDN_CPU_SIMD says: for callers that
// choose vectors themselves (tests compare both paths). From cpuid: clang
// 14's __builtin_cpu_supports does not know "f16c".
KdnSimd KdnSimdOfCpu();

// Whether streams of `lanes` lanes over `channels` channels take the vector
// path in this process, with values computed (no lut needed).
bool KdnSimdComputes(std::uint32_t lanes, std::uint32_t channels);

// Decodes `count` streams (at most kKdnSimdStreams together, interleaved).
// Returns the index of the first stream that is malformed, or -1 if all
// decode. Streams with a lut (no `step`) go through
// kernels::kdn_decode_stream.
inline constexpr int kKdnSimdStreams = 4;
int DecodeKdnStreams(const KdnStream<std::uint16_t>* streams, int count);
int DecodeKdnStreams(const KdnStream<float>* streams, int count);

// For a mask m of the 8 lanes that renormalize (bit k: lane k): lane k's
// word is word number popcount(m & ((1 << k) - 1)) of those at the stream's
// cursor, 3 bits per lane (the AVX2 renormalization's permutation;
// core/codec/tc_cpu.cc uses it too).
constexpr std::array<std::uint32_t, 256> MakeKdnSimdWordIndex() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t m = 0; m < 256; ++m) {
    std::uint32_t packed = 0, before = 0;
    for (std::uint32_t k = 0; k < 8; ++k) {
      packed |= (before & 7u) << (3 * k);
      before += (m >> k) & 1u;
    }
    t[m] = packed;
  }
  return t;
}
inline constexpr std::array<std::uint32_t, 256> kKdnSimdWordIndex = MakeKdnSimdWordIndex();

}  // namespace kdn::codec::internal
