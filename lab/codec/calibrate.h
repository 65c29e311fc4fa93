// SPDX-License-Identifier: Apache-2.0
// Calibration of kdn's codec for one model (issue 4: "bit allocation per
// layer from measured sensitivity, not hard-coded by model name").
//
// 1. Sensitivity. For each plane p (layer, k|v) the codec quantizes p alone
//    at a probe step (every other plane 50x finer) and Evaluate measures the
//    next-token KL on the calibration text; the baseline (every plane fine)
//    is subtracted. Under high-rate quantization KL_p grows as step_p^2, so
//    w_p = KL_p / probe^2 is the plane's sensitivity per unit step^2.
// 2. Allocation. Minimizing sum_p w_p step_p^2 at a fixed total rate (sum_p
//    log step_p fixed) gives step_p proportional to w_p^(-1/2): the plane
//    weights (`pw`) are w_p^(-1/2), normalized to a geometric mean of 1 and
//    clamped to [1/20, 20].
// 3. Presets. For each preset a bisection on the global step (log scale)
//    finds the largest step whose KL mean stays at or below the preset's
//    target: `balanced` = the KL of cachegen (LMCache's default) on the same
//    text, `hifi` = 2e-3, both with a margin (0.8 x, and 1.2e-3) because KL
//    on a small model moves by tens of percent from one text to another
//    (measured: a profile fitted to the exact targets on one text missed
//    them by 15-45% on another).
// The result is a profile: one codec spec per preset, written as text
// (ProfileText) that `kdn:PRESET,profile=FILE` reads back.
// Thread-safety: Calibrate is reentrant.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "lab/codec/eval.h"
#include "core/codec/profile.h"

namespace kdn::codec {

struct CalibrateOptions {
  EvalOptions eval;           // context and continuation of every evaluation
  int max_contexts = 0;       // 0: every context of the text
  double probe_step = 0.5;    // the step of a probed plane
  double alpha = 0.5;         // the codec's alpha (see core/codec/kdn.cc)
  std::uint32_t sinks = 4;    // the codec's sink tokens
  double balanced_kl = 0;     // 0: balanced_margin x cachegen's KL mean on the text
  double balanced_margin = 0.8;
  double hifi_kl = 1.2e-3;
};

struct PresetFit {
  std::string name;           // "balanced", "hifi"
  double target_kl = 0;
  double step = 0;            // the largest step found at or under the target
  EvalResult result;          // the evaluation at that step
};

struct Calibration {
  int contexts = 0;
  double baseline_kl = 0;              // every plane fine
  std::vector<double> plane_kl;        // per plane (layer * 2 + kv) at the probe step, baseline subtracted
  std::vector<double> plane_weight;    // the `pw` multipliers
  EvalResult cachegen;                 // cachegen's evaluation on the same text
  std::vector<PresetFit> presets;
  int evaluations = 0;
};

// The largest step (log-scale search in [0.01, 16], starting from
// `probe_step`, about 8 evaluations) whose evaluation keeps the KL mean at
// or under `target_kl`; `eval(step)` encodes with that step. fit.name is
// left to the caller. kInvalidArgument when no step meets the target.
Result<PresetFit> FitStep(double target_kl, double probe_step,
                          const std::function<Result<EvalResult>(double)>& eval);

// kInvalidArgument as Evaluate; the model's layers set the number of planes.
Result<Calibration> Calibrate(const model::Checkpoint& weights, const std::vector<int>& text_tokens,
                              const CalibrateOptions& options);

// The spec of a fitted preset, e.g. "kdn:alpha=0.5,pw=...,sink=4,step=0.61".
std::string PresetSpec(const Calibration& c, const PresetFit& fit, const CalibrateOptions& options);

// The profile file: comment lines ('#') and one "PRESET SPEC" line per preset.
std::string ProfileText(const Calibration& c, const CalibrateOptions& options, const std::string& about);

}  // namespace kdn::codec
