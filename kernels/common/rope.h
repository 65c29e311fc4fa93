// SPDX-License-Identifier: Apache-2.0
// Rotary position embedding math shared by the reference transformer, the
// CPU path and the CUDA kernels.
#pragma once

#include "kernels/common/hd.h"

namespace kdn::kernels {

// Inverse frequency of rotary pair j for a head of `rotary_dim` rotated
// dimensions: theta^(-2j / rotary_dim).
KDN_HD double rope_inv_freq(int pair, int rotary_dim, double theta) {
#if defined(__CUDA_ARCH__)
  return ::pow(theta, -2.0 * pair / rotary_dim);
#else
  return __builtin_pow(theta, -2.0 * pair / rotary_dim);
#endif
}

// Rotates the pair (x0, x1) by angle (cos c, sin s).
KDN_HD void rope_rotate(float& x0, float& x1, float c, float s) {
  const float a = x0, b = x1;
  x0 = a * c - b * s;
  x1 = a * s + b * c;
}

// Index of the two elements of rotary pair j in a head.
// Interleaved (llama2.c, GPT-J): (2j, 2j+1). NeoX: (j, j + rotary_dim/2).
KDN_HD int rope_first(int pair, bool neox) { return neox ? pair : 2 * pair; }
KDN_HD int rope_second(int pair, int rotary_dim, bool neox) {
  return neox ? pair + rotary_dim / 2 : 2 * pair + 1;
}

}  // namespace kdn::kernels
