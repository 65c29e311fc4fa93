// SPDX-License-Identifier: Apache-2.0
// Element math of the transform codec (core/codec/tc.cc), shared by the CPU
// codec and, later, the CUDA path:
// - a token's C channels x (keys with RoPE undone) minus the chunk's channel
//   means m (halves) are projected on an orthonormal basis B (C x C, f32,
//   B[c * C + i] = component i's weight on channel c): y_i = sum_c B[c][i]
//   (x_c - m_c), summed in float in ascending c;
// - component i is quantized with step s_i = delta * 2^e_i: q = rint(y_i /
//   s_i) clamped to [-127, 127]; y'_i = q * s_i (exact: |q| < 2^7, s_i a
//   float);
// - the decoder rebuilds x'_c = m_c + sum_i B[c][i] y'_i, the sum in float
//   in ascending i skipping zero terms (a GPU's matrix product sums in
//   another order: its results agree with these within a tolerance, not
//   bit for bit);
// - keys are rotated by -angle before projection and +angle after
//   reconstruction (rope_reposition.h's double-precision rotation).
// Division is IEEE, rounding to nearest even, no contraction (the file that
// includes this is built with -ffp-contract=off).
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/kdn_quant.h"
#include "kernels/common/quant.h"
#include "kernels/common/rope_reposition.h"

namespace kdn::kernels {

inline constexpr std::int32_t kTcMaxCode = 127;
inline constexpr std::int32_t kTcMaxShift = 24;
// The largest head a profile may describe (a GPU thread holds one head).
inline constexpr std::uint32_t kTcMaxHeadDim = 512;

KDN_HD std::int32_t tc_quantize(float y, float step) {
  float q = quant_rint(y / step);
  const float lim = static_cast<float>(kTcMaxCode);
  q = q > lim ? lim : (q < -lim ? -lim : q);
  return static_cast<std::int32_t>(q);
}

// y (C floats) = B^T (x - m).
KDN_HD void tc_project(const float* x, const float* mean, const float* basis, std::uint32_t C, float* y) {
  for (std::uint32_t i = 0; i < C; ++i) y[i] = 0.0f;
  for (std::uint32_t c = 0; c < C; ++c) {
    const float d = x[c] - mean[c];
    const float* row = basis + static_cast<std::uint64_t>(c) * C;
    for (std::uint32_t i = 0; i < C; ++i) y[i] += row[i] * d;
  }
}

// acc (C floats) = B y, from the transposed basis (bt[i * C + c] =
// B[c][i]): acc_c sums B[c][i] y_i in ascending i from 0, skipping zero
// terms (a loop over c for each i: independent lanes a compiler vectorizes).
KDN_HD void tc_accumulate(const float* y, const float* bt, std::uint32_t C, float* acc) {
  for (std::uint32_t c = 0; c < C; ++c) acc[c] = 0.0f;
  for (std::uint32_t i = 0; i < C; ++i) {
    const float yi = y[i];
    if (yi == 0.0f) continue;  // adds exactly nothing
    const float* col = bt + static_cast<std::uint64_t>(i) * C;
    for (std::uint32_t c = 0; c < C; ++c) acc[c] += col[c] * yi;
  }
}

// x (C floats) = m + B y (tc_accumulate, then the mean added).
KDN_HD void tc_reconstruct(const float* y, const float* mean, const float* bt, std::uint32_t C, float* x) {
  tc_accumulate(y, bt, C, x);
  for (std::uint32_t c = 0; c < C; ++c) x[c] = mean[c] + x[c];
}

// Rotates every rotary pair of the `heads` heads of one token (x, heads *
// spec.head_dim floats) by sign * position * w_j. cs holds (cos, sin) of
// position * w_j per pair (rope_pairs(spec) pairs, 2 doubles each).
KDN_HD void tc_rotate_token(float* x, int heads, const RopeSpec& spec, const double* cs, double sign) {
  const bool neox = spec.style == RopeStyle::kNeox;
  const int pairs = rope_pairs(spec), r = rope_rotary_dim(spec);
  for (int h = 0; h < heads; ++h) {
    float* head = x + static_cast<std::int64_t>(h) * spec.head_dim;
    for (int j = 0; j < pairs; ++j) {
      float& x0 = head[rope_first(j, neox)];
      float& x1 = head[rope_second(j, r, neox)];
      rope_rotate_precise(x0, x1, cs[2 * j], sign * cs[2 * j + 1]);
    }
  }
}

// Decodes one stream of a plane (core/codec/tc.cc's payload): tokens
// [t0, t1) x the coded components comps[0, n) (ascending), token-major, with
// `lanes` interleaved states (symbol k by state k % lanes); the value of
// component i's symbol s is (s - range[i]) * step[i], written at
// y[t * C + i] (other components untouched). slots(i) gives component i's
// table of 2^kKdnScaleBits packed slots. False if the stream is malformed
// (truncated, trailing words, states out of range or not back at
// kKdnRansLow); never reads outside [p, p + len). One GPU thread can run it
// per stream.
template <typename Slots>
KDN_HD bool tc_decode_stream(const std::uint8_t* p, std::uint64_t len, std::uint32_t lanes, std::uint32_t t0,
                             std::uint32_t t1, std::uint32_t C, const std::uint32_t* comps, std::uint32_t n,
                             const Slots& slots, const std::int32_t* range, const float* step, float* y) {
  std::uint32_t x[kKdnMaxLanes];
  const std::uint8_t* ptr = nullptr;
  if (!kdn_stream_begin(p, len, lanes, x, &ptr)) return false;
  const std::uint8_t* const end = p + len;
  std::uint32_t lane = 0;
  std::uint32_t t = t0;
  // Rows far from the stream's end (a row moves at most one word a symbol):
  // no bounds checks, the word shifted in without a branch (kdn_decode_one's
  // arithmetic, the same bits).
  for (; t < t1 && static_cast<std::uint64_t>(end - ptr) >= 2ull * n; ++t) {
    float* yt = y + static_cast<std::uint64_t>(t) * C;
    for (std::uint32_t j = 0; j < n; ++j) {
      const std::uint32_t i = comps[j];
      std::uint32_t& sx = x[lane];
      const std::uint32_t e = slots(i)[sx & ((1u << kKdnScaleBits) - 1u)];
      yt[i] = static_cast<float>(static_cast<std::int32_t>(e >> 24) - range[i]) * step[i];
      sx = ((e & 0xFFFu) + 1u) * (sx >> kKdnScaleBits) + (sx & ((1u << kKdnScaleBits) - 1u)) - ((e >> 12) & 0xFFFu);
      const std::uint32_t word = static_cast<std::uint32_t>(ptr[0]) | (static_cast<std::uint32_t>(ptr[1]) << 8);
      const bool low = sx < kKdnRansLow;
      sx = low ? (sx << 16) | word : sx;
      ptr += low ? 2 : 0;
      lane = lane + 1 == lanes ? 0 : lane + 1;
    }
  }
  for (; t < t1; ++t) {
    float* yt = y + static_cast<std::uint64_t>(t) * C;
    for (std::uint32_t j = 0; j < n; ++j) {
      const std::uint32_t i = comps[j];
      const std::int32_t r = range[i];
      const float st = step[i];
      auto value = [r, st](std::uint64_t, std::uint32_t sym) {
        return static_cast<float>(static_cast<std::int32_t>(sym) - r) * st;
      };
      if (!kdn_decode_one_checked(x[lane], slots(i), value, i, yt + i, ptr, end)) return false;
      lane = lane + 1 == lanes ? 0 : lane + 1;
    }
  }
  if (ptr != end) return false;
  for (std::uint32_t l = 0; l < lanes; ++l) {
    if (x[l] != kKdnRansLow) return false;
  }
  return true;
}

}  // namespace kdn::kernels
