// SPDX-License-Identifier: Apache-2.0
// Calibration of the transform codec (tc) for one model: `kdn codec
// calibrate --transform`.
//
// 1. KV. The calibration text is cut into contexts of N tokens (as
//    Evaluate cuts them); the reference transformer computes their KV.
// 2. Bases. Per plane (layer, k|v), over the tokens after the sinks (keys
//    with RoPE undone at their positions): the channels' mean and
//    covariance (double), and its eigenvectors (LAPACK dsyev), by
//    decreasing eigenvalue: the KLT. The eigenvalues are the components'
//    variances; sigma = sqrt(their mean).
// 3. Tables. A fixed family of static 12-bit rANS models: discretized
//    Laplace densities of scale 0.05 x 1.25^k steps (k < 32) and Gauss
//    densities of deviation 0.1 x 1.25^k (k < 30), each over [-R, R] with R
//    covering 12 scales (6 deviations) up to 127. The encoder picks, per
//    component and chunk, the one that codes it in the fewest bits among
//    those within about 2x of the codes' own scale and the widest.
// 4. Presets. As kdn's calibration: bisect the global step (log scale) for
//    the largest that keeps the KL mean at or under each target (balanced:
//    margin x cachegen's KL on the text; hifi: 1.2e-3), values' steps vmul
//    times the keys'.
// Thread-safety: reentrant.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "lab/codec/calibrate.h"
#include "core/codec/tc_profile.h"

namespace kdn::codec {

struct TcCalibrateOptions {
  EvalOptions eval;     // context and continuation of every evaluation
  int max_contexts = 0;  // 0: every context of the text
  // The codec's sink tokens (kept as halves): 0, since the transform codes the
  // first tokens well enough (measured: sink=4 cost 13% of the size at the
  // same KL on the tuning text; docs/codecs.md).
  std::uint32_t sinks = 0;
  double vmul = 2.5;
  double balanced_kl = 0;  // 0: balanced_margin x cachegen's KL mean on the text
  double balanced_margin = 0.8;
  // Other context lengths at which the balanced preset must keep its margin
  // against cachegen's KL at that length (balanced_kl 0): it is fitted at
  // each as well, and the smallest step wins. The transform's advantage over
  // cachegen shrinks with the context (on the tuning text, at the step
  // fitted at 256 tokens, 0.77x cachegen's KL at 256 and 0.95x at 448), so
  // a preset fitted at one length has no margin left at the other.
  std::vector<int> balanced_contexts;
  double hifi_kl = 1.2e-3;
  bool fit_presets = true;  // false: bases and tables only (tests)
  kernels::RopeSpec rope;   // the model's RoPE (head_dim set from the model)
  std::vector<std::array<std::uint8_t, 32>> fingerprints;
  std::string work_path;    // where the profile is written while presets are fitted
};

struct TcCalibration {
  int contexts = 0;
  TcProfile profile;                          // with presets when fitted
  EvalResult cachegen;                        // when presets are fitted
  std::vector<PresetFit> presets;
  std::vector<std::vector<double>> spectra;   // per plane: variances, decreasing
  int evaluations = 0;
};

// The family of tables of step 3 (deterministic; stored in every profile).
std::vector<TcTable> TcTableFamily();

Result<TcCalibration> CalibrateTransform(const model::Checkpoint& weights, const std::vector<int>& text_tokens,
                                         const TcCalibrateOptions& options);

}  // namespace kdn::codec
