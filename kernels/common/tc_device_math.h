// SPDX-License-Identifier: Apache-2.0
// The per-thread work of the transform codec's decode (core/codec/tc.cc),
// shared by the CUDA kernels (kernels/tc.cu) and their CPU reference
// (kernels/ref/tc_ref.h), which the CPU codec itself runs: so the tests of
// the CPU codec check the GPU's arithmetic and control flow.
//
// A decode is three steps:
//  1. streams: one thread per rANS stream (tc_stream_work) decodes its
//     tokens x coded components into y ([plane][token][C], zero-filled
//     before);
//  2. the product acc = y B^T per plane: acc[t][c] = sum_i B[c][i] y[t][i]
//     (cuBLAS on the GPU; on the CPU tc_accumulate, ascending i, skipping
//     zeros; the two agree within float rounding, not bit for bit);
//  3. finish: one thread per (plane, token, KV head) (tc_finish_work): the
//     mean added, RoPE applied again to keys at the token's position, the
//     dtype's element stored; sink tokens copied from the payload's halves.
// Argument structs hold raw pointers: device memory for the kernels, host
// memory for the reference.
#pragma once

#include <cstdint>

#include "kernels/common/codec_device_math.h"
#include "kernels/common/half.h"
#include "kernels/common/hd.h"
#include "kernels/common/kdn_quant.h"
#include "kernels/common/rope_reposition.h"
#include "kernels/common/tc_math.h"

namespace kdn::kernels {

// One stream: its bytes in the payload, its plane, and its coded
// components (comps[comp_at, comp_at + comps), ascending).
struct TcStreamDir {
  std::uint64_t offset = 0, length = 0;
  std::uint32_t plane = 0, comp_at = 0, comps = 0, pad = 0;
};

struct TcDecodeArgs {
  const std::uint8_t* payload = nullptr;
  std::uint32_t tokens = 0, channels = 0, sinks = 0, lanes = 1;
  std::uint64_t n_streams = 0;
  const TcStreamDir* streams = nullptr;
  const std::uint32_t* comps = nullptr;     // coded component indices
  const std::uint32_t* table_of = nullptr;  // [plane * C + i]: the component's table
  const std::int32_t* range = nullptr;      // [plane * C + i]: its table's R
  const float* step = nullptr;              // [plane * C + i]
  const std::uint32_t* slots = nullptr;     // [table][2^kKdnScaleBits] packed slots
  float* y = nullptr;                       // [plane][token][C], zero-filled
  std::uint32_t* failed = nullptr;          // lowest failing stream (kernels only)
};

KDN_HD std::uint64_t tc_stream_threads(const TcDecodeArgs& a) { return a.n_streams; }

// Stream s into a.y; false if it does not decode.
KDN_HD bool tc_stream_work(const TcDecodeArgs& a, std::uint64_t s) {
  const TcStreamDir d = a.streams[s];
  const std::uint64_t plane_at = std::uint64_t{d.plane} * a.channels;
  struct Slots {
    const std::uint32_t* slots;
    const std::uint32_t* table_of;
    KDN_HD const std::uint32_t* operator()(std::uint32_t i) const {
      return slots + (std::uint64_t{table_of[i]} << kKdnScaleBits);
    }
  } slots{a.slots, a.table_of + plane_at};
  return tc_decode_stream(a.payload + d.offset, d.length, a.lanes, a.sinks, a.tokens, a.channels, a.comps + d.comp_at,
                          d.comps, slots, a.range + plane_at, a.step + plane_at,
                          a.y + std::uint64_t{d.plane} * a.tokens * a.channels);
}

struct TcFinishArgs {
  const std::uint8_t* payload = nullptr;
  std::uint32_t tokens = 0, channels = 0, sinks = 0, kv_heads = 0, planes = 0, dtype = 0;
  std::int64_t first = 0;                // the chunk's first position
  RopeSpec rope;
  const std::uint64_t* sinks_at = nullptr;  // [plane]: payload offset of its sink halves
  const float* mean = nullptr;              // [plane * C + c]
  const float* acc = nullptr;               // [plane][token][C]: B y
  const double* cs = nullptr;               // optional [token][pair] (cos, sin) (tc_finish_cos_sin); null: each thread computes its own
  void* out = nullptr;                      // canonical KV of dtype
  std::uint32_t* failed = nullptr;          // lowest (plane, token, head) that overflows (kernels only)
};

KDN_HD std::uint64_t tc_finish_threads(const TcFinishArgs& a) {
  return std::uint64_t{a.planes} * a.tokens * a.kv_heads;
}

// (cos, sin) of the rotation of every rotary pair j of token t (at position
// first + t) into cs[2 j], cs[2 j + 1]: what tc_finish_work uses, shared by
// every layer and head of the token (a CPU decode computes them once per
// token; a GPU thread computes its own).
KDN_HD void tc_finish_cos_sin(const TcFinishArgs& a, std::uint64_t t, double* cs) {
  const int pairs = rope_pairs(a.rope);
  for (int j = 0; j < pairs; ++j) {
    rope_delta_cos_sin(a.first + static_cast<std::int64_t>(t), rope_spec_inv_freq(a.rope, j), cs[2 * j], cs[2 * j + 1]);
  }
}

// (plane, token, head) i: writes its head_dim elements; false if one is not
// finite or does not fit the dtype (then the decode fails).
KDN_HD bool tc_finish_head(const TcFinishArgs& a, std::uint64_t plane, std::uint64_t t, std::uint64_t h);

KDN_HD bool tc_finish_work(const TcFinishArgs& a, std::uint64_t i) {
  const std::uint64_t h = i % a.kv_heads, t = (i / a.kv_heads) % a.tokens, plane = i / (std::uint64_t{a.kv_heads} * a.tokens);
  return tc_finish_head(a, plane, t, h);
}

// The same, for (plane, token t, head h) (a CPU loop over the three indices
// saves tc_finish_work's divisions).
KDN_HD bool tc_finish_head(const TcFinishArgs& a, std::uint64_t plane, std::uint64_t t, std::uint64_t h) {
  const std::uint32_t D = static_cast<std::uint32_t>(a.rope.head_dim);
  const std::uint64_t at = (plane * a.tokens + t) * a.channels + h * D;  // element of the head's first value
  float row[kTcMaxHeadDim];
  if (t < a.sinks) {
    const std::uint8_t* p = a.payload + a.sinks_at[plane] + 2 * (t * a.channels + h * D);
    for (std::uint32_t d = 0; d < D; ++d) row[d] = codec_read_half(p + 2 * d);
  } else {
    const float* m = a.mean + plane * a.channels + h * D;
    for (std::uint32_t d = 0; d < D; ++d) row[d] = m[d] + a.acc[at + d];
    if (plane % 2 == 0) {  // keys
      const bool neox = a.rope.style == RopeStyle::kNeox;
      const int pairs = rope_pairs(a.rope), r = rope_rotary_dim(a.rope);
      const double* table = a.cs != nullptr ? a.cs + t * 2 * static_cast<std::uint64_t>(pairs) : nullptr;
      for (int j = 0; j < pairs; ++j) {
        double c, s;
        if (table != nullptr) {
          c = table[2 * j];
          s = table[2 * j + 1];
        } else {
          rope_delta_cos_sin(a.first + static_cast<std::int64_t>(t), rope_spec_inv_freq(a.rope, j), c, s);
        }
        rope_rotate_precise(row[rope_first(j, neox)], row[rope_second(j, r, neox)], c, s);
      }
    }
  }
  // Finite in the dtype (core/codec's FitsDtype): NaN and inf fail too. For
  // a half or bf16 the stored element tells: both round the magnitude apart
  // from the sign, so its bits without the sign are those of |v| (-0.0 as
  // +0.0: a key of zeros rotated by a negative cosine is -0.0).
  bool ok = true;
  if (a.dtype == 0) {
    for (std::uint32_t d = 0; d < D; ++d) {
      ok = ok && codec_finite(row[d]);
      static_cast<float*>(a.out)[at + d] = row[d];
    }
    return ok;
  }
  const std::uint32_t inf = a.dtype == 1 ? 0x7C00u : 0x7F80u;
  for (std::uint32_t d = 0; d < D; ++d) {
    const std::uint16_t e = codec_to_element<std::uint16_t>(a.dtype, row[d]);
    ok = ok && (e & 0x7FFFu) < inf;
    static_cast<std::uint16_t*>(a.out)[at + d] = e;
  }
  return ok;
}

}  // namespace kdn::kernels
