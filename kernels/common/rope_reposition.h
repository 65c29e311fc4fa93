// SPDX-License-Identifier: Apache-2.0
// Re-positioning cached keys: the element math shared by the CPU path
// (ref/rope_ref.h) and the CUDA kernel (rope.cuh).
//
// RoPE rotates rotary pair j of every head at position p by the angle
//   angle(p, j) = p * w_j,
// where w_j is the pair's angular frequency (below, per scaling). Rotations
// compose additively, R(a) R(b) = R(a + b), so a key cached after RoPE at
// position `old` is the key at position `new` once each pair is rotated by
//   (new - old) * w_j:
// the unrotated key is never needed. Only the first rotary_dim elements of
// a head rotate (partial rotary); the rest are position-free and untouched.
//
// Frequencies, with r = rotary_dim and j in [0, r/2):
//   none:   w_j = theta^(-2j / r)                          (rope_inv_freq)
//   linear: w_j = theta^(-2j / r) / factor                 ("position
//           interpolation": positions divided by factor)
//   NTK:    w_j = theta'^(-2j / r), theta' = theta * factor^(r / (r - 2))
//           (NTK-aware scaling: the highest frequency j = 0 is unchanged and
//           the lowest, j = r/2 - 1, is divided by exactly `factor`, as
//           linear scaling would; frequencies between are scaled
//           geometrically.) Dynamic NTK is this formula with a factor that
//           grows with the sequence length; keys cached under one factor
//           cannot be moved to another by a rotation of (new - old) alone.
// The angle is computed in double from the integer delta, cos and sin in
// double, and the pair is rotated in double and rounded to the key's type
// once, so the result is within half an ulp of the exact rotation of the
// stored values (plus the double error, ~1e-16 relative, of the angle).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "kernels/common/half.h"
#include "kernels/common/hd.h"
#include "kernels/common/rope.h"

namespace kdn::kernels {

// Pair layout. The kernels know nothing of the layers above them: a front
// end with its own numbering of styles and scalings (an API's enums)
// converts to these where it reads them, and checks that conversion there.
enum class RopeStyle : std::int32_t {
  kInterleaved = 0,  // pairs (2j, 2j + 1): llama2.c, GPT-J, Meta's Llama
  kNeox = 1,         // pairs (j, j + rotary_dim / 2): GPT-NeoX, HF Llama
};

// Position scaling; formulas in the file comment.
enum class RopeScaling : std::int32_t {
  kNone = 0,
  kLinear = 1,  // positions divided by factor
  kNtk = 2,     // NTK-aware: theta * factor^(r / (r - 2))
};

// How a model applies RoPE to one head of its keys.
struct RopeSpec {
  int head_dim = 0;    // elements per head
  int rotary_dim = 0;  // leading elements of a head that rotate; 0 = head_dim
  double theta = 10000.0;
  RopeStyle style = RopeStyle::kInterleaved;
  RopeScaling scaling = RopeScaling::kNone;
  double factor = 1.0;  // read by linear and NTK scaling only
};

// Element type of the keys being moved.
enum class KeyType : std::int32_t {
  kF32 = 0,
  kF16 = 1,   // IEEE binary16
  kBF16 = 2,  // bfloat16
};

KDN_HD bool key_type_valid(KeyType t) { return t == KeyType::kF32 || t == KeyType::kF16 || t == KeyType::kBF16; }
KDN_HD int key_type_bytes(KeyType t) { return t == KeyType::kF32 ? 4 : 2; }

KDN_HD int rope_rotary_dim(const RopeSpec& s) { return s.rotary_dim == 0 ? s.head_dim : s.rotary_dim; }
KDN_HD int rope_pairs(const RopeSpec& s) { return rope_rotary_dim(s) / 2; }

// Why `s` cannot be used, as a static string, or nullptr when it can:
// head_dim > 0; rotary_dim (after 0 -> head_dim) even, in [2, head_dim];
// theta finite and > 0; a known style and scaling; for linear and NTK a
// finite factor > 0; NTK also needs rotary_dim >= 4 (r / (r - 2)).
inline const char* rope_spec_problem(const RopeSpec& s) {
  const int r = rope_rotary_dim(s);
  if (s.head_dim <= 0) return "head_dim must be positive";
  if (r < 2 || r > s.head_dim || r % 2 != 0) return "rotary_dim must be even and in [2, head_dim]";
  if (!(s.theta > 0.0 && s.theta < __builtin_huge_val())) return "theta must be finite and positive";
  if (s.style != RopeStyle::kInterleaved && s.style != RopeStyle::kNeox) return "unknown RoPE style";
  if (s.scaling == RopeScaling::kNone) return nullptr;
  if (s.scaling != RopeScaling::kLinear && s.scaling != RopeScaling::kNtk) return "unknown RoPE scaling";
  if (!(s.factor > 0.0 && s.factor < __builtin_huge_val())) return "scaling factor must be finite and positive";
  if (s.scaling == RopeScaling::kNtk && r < 4) return "NTK scaling needs rotary_dim >= 4";
  return nullptr;
}

// Why keys of `tokens` rows, `row_stride` elements apart, each holding
// `kv_heads` heads of s.head_dim elements back to back, cannot be moved
// under `s`, or nullptr when they can: the spec's problem, tokens < 0,
// kv_heads <= 0, or rows that overlap (row_stride < kv_heads * head_dim).
// Pointers are the caller's to check.
inline const char* rope_keys_problem(const RopeSpec& s, std::int64_t row_stride, std::int64_t tokens, int kv_heads) {
  if (const char* why = rope_spec_problem(s)) return why;
  if (tokens < 0) return "negative token count";
  if (kv_heads <= 0) return "kv_heads must be positive";
  if (row_stride < static_cast<std::int64_t>(kv_heads) * s.head_dim) {
    return "row_stride shorter than kv_heads * head_dim";
  }
  return nullptr;
}

// ---- double-precision math with one spelling on host and device

KDN_HD double rope_pow(double x, double y) {
#if defined(__CUDA_ARCH__)
  return ::pow(x, y);
#else
  return __builtin_pow(x, y);
#endif
}

// cos and sin of `angle` (radians).
KDN_HD void rope_cos_sin(double angle, double& c, double& s) {
#if defined(__CUDA_ARCH__)
  ::sincos(angle, &s, &c);
#else
  c = __builtin_cos(angle);
  s = __builtin_sin(angle);
#endif
}

// theta' of NTK-aware scaling: theta * factor^(r / (r - 2)).
KDN_HD double rope_ntk_theta(double theta, double factor, int rotary_dim) {
  return theta * rope_pow(factor, static_cast<double>(rotary_dim) / (rotary_dim - 2));
}

// w_j of `s` (file comment), in radians per position. Precondition:
// rope_spec_problem(s) == nullptr and 0 <= pair < rope_pairs(s).
KDN_HD double rope_spec_inv_freq(const RopeSpec& s, int pair) {
  const int r = rope_rotary_dim(s);
  switch (s.scaling) {
    case RopeScaling::kLinear:
      return rope_inv_freq(pair, r, s.theta) / s.factor;
    case RopeScaling::kNtk:
      return rope_inv_freq(pair, r, rope_ntk_theta(s.theta, s.factor, r));
    default:
      return rope_inv_freq(pair, r, s.theta);
  }
}

// cos and sin of the rotation that moves pair j (frequency inv_freq) by
// `delta` positions: angle = delta * inv_freq, in double. delta converts to
// double exactly while |delta| < 2^53.
KDN_HD void rope_delta_cos_sin(std::int64_t delta, double inv_freq, double& c, double& s) {
  rope_cos_sin(static_cast<double>(delta) * inv_freq, c, s);
}

// Rotates the pair (x0, x1) by (c, s) in double, rounding each result once.
// (The transformer's rope_rotate works in float with float cos/sin; this one
// is at least as accurate, so moved keys carry no more error than computed
// ones.)
KDN_HD void rope_rotate_precise(float& x0, float& x1, double c, double s) {
  const double a = x0, b = x1;
  x0 = static_cast<float>(a * c - b * s);
  x1 = static_cast<float>(a * s + b * c);
}

// ---- keys in memory

// Element i of a key array of type T, as float; and its store, rounding to
// nearest even (half.h).
template <KeyType T>
KDN_HD float key_load(const void* keys, std::int64_t i) {
  if constexpr (T == KeyType::kF32) {
    return static_cast<const float*>(keys)[i];
  } else if constexpr (T == KeyType::kF16) {
    return half_to_float(static_cast<const std::uint16_t*>(keys)[i]);
  } else {
    return bf16_to_float(static_cast<const std::uint16_t*>(keys)[i]);
  }
}
template <KeyType T>
KDN_HD void key_store(void* keys, std::int64_t i, float v) {
  if constexpr (T == KeyType::kF32) {
    static_cast<float*>(keys)[i] = v;
  } else if constexpr (T == KeyType::kF16) {
    static_cast<std::uint16_t*>(keys)[i] = float_to_half(v);
  } else {
    static_cast<std::uint16_t*>(keys)[i] = float_to_bf16(v);
  }
}

// Rotates pair `pair` of the head whose first element is element `head` of
// `keys` by (c, s). Both elements are read before either is written.
template <KeyType T>
KDN_HD void rope_rotate_key_pair(void* keys, std::int64_t head, const RopeSpec& s, int pair, double c,
                                 double sn) {
  const bool neox = s.style == RopeStyle::kNeox;
  const std::int64_t i0 = head + rope_first(pair, neox);
  const std::int64_t i1 = head + rope_second(pair, rope_rotary_dim(s), neox);
  float x0 = key_load<T>(keys, i0), x1 = key_load<T>(keys, i1);
  rope_rotate_precise(x0, x1, c, sn);
  key_store<T>(keys, i0, x0);
  key_store<T>(keys, i1, x1);
}

// Element index of head h of token t when rows (tokens) are `row_stride`
// elements apart and a row holds its heads back to back.
KDN_HD std::int64_t rope_head_offset(std::int64_t t, int h, std::int64_t row_stride, int head_dim) {
  return t * row_stride + static_cast<std::int64_t>(h) * head_dim;
}

}  // namespace kdn::kernels
