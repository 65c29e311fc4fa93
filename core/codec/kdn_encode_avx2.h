// SPDX-License-Identifier: Apache-2.0
// The kdn encoder's loops (core/codec/kdn.cc) with AVX2: the per-channel
// statistics of a plane, its quantization, and the coding of 8-lane streams
// several at a time. Each gives the same results, bit for bit, as the
// scalar loops in kdn.cc (the same IEEE operations on every element in the
// same order, only several channels or streams at once); the caller uses
// them only when KdnEncodeAvx2() says the CPU runs them.
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>

namespace kdn::codec::internal {

// Whether this process runs the functions below: the CPU (and OS) can, and
// KDN_CPU_SIMD does not say "none" (codec/kdn_simd.h: KdnSimdInUse).
bool KdnEncodeAvx2();

// sum[c] += x[t * C + c] for t in [t0, t1), in double, in token order.
void KdnSumAvx2(const float* x, std::uint64_t C, std::uint64_t t0, std::uint64_t t1, double* sum);

// For t in [t0, t1): d = x[t * C + c] - off[c] (float); var[c] +=
// double(d) * d; maxdev[c] = max(maxdev[c], |d|). The x are finite.
void KdnSpreadAvx2(const float* x, std::uint64_t C, std::uint64_t t0, std::uint64_t t1, const float* off,
                   double* var, float* maxdev);

// code[t * C + c] = kdn_quantize(x[t * C + c], off[c], step[c]) + kKdnMaxCode
// for t in [0, rows), and hist[code] += 1 for each. The steps are positive
// and every (x - off) / step finite.
void KdnQuantizeAvx2(const float* x, std::uint64_t C, std::uint64_t rows, const float* off, const float* step,
                     std::uint8_t* code, std::uint64_t* hist);

// One 8-lane stream to code (kdn.cc's EncodeStream with lanes == 8): the
// symbols are tokens x width codes at codes[t * row + c] (width a multiple
// of 8), their model is coding[code] = start | freq << 16; the stream is
// written backwards ending at `end`, with room for it below (2 * 8 + tokens
// * width words).
struct KdnEncodeJob {
  const std::uint8_t* codes = nullptr;
  std::uint64_t row = 0, width = 0, tokens = 0;
  const std::uint32_t* coding = nullptr;
  std::uint16_t* end = nullptr;
  std::uint64_t bytes = 0;  // out: the stream's size, at end - bytes / 2
};

// Codes `count` (1..kKdnEncodeStreams) streams of the same tokens and width
// in lock-step; the words are those of kernels::kdn_rans_put.
inline constexpr int kKdnEncodeStreams = 4;
void KdnEncodeStreamsAvx2(KdnEncodeJob* jobs, int count);

}  // namespace kdn::codec::internal
