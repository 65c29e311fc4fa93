// SPDX-License-Identifier: Apache-2.0
// The blend's accuracy gate (issue 34, item 2): before a model blends, its
// blending quality is measured on a calibration text (`kdn blend
// calibrate`, the reference model's evaluation of lab/blend/eval.h) and kept
// in a gate file, one line per model fingerprint and method; a blend given
// the file and a bound on KL(blend) / KL(naive reuse) runs only when the
// file holds that model's measurement for that method at or below the
// bound. Otherwise every position is recomputed (the blend is full prefill,
// exact) and the report says it was gated: no silent garbling.
//
// File format (text; '#' starts a comment line):
//   FINGERPRINT_HEX ratio=R checks=L1,L2 kv_pass=0|1 first=K kl_ratio=X top1=T f=F contexts=N
// FINGERPRINT_HEX is the model's 64 hex digits (kdn_model_get_fingerprint).
// A method is (ratio, check layers, kv_pass, first tokens); a record matches
// a blend's resolved options when these are equal (the ratio within 1e-6).
// Thread-safety: pure functions over values.
#pragma once

#include <string>
#include <vector>

#include "core/blend/blend.h"
#include "core/util/status.h"

namespace kdn::blend {

struct GateRecord {
  std::string fingerprint;      // 64 lowercase hex digits
  double ratio = 0;
  std::vector<int> check_layers;
  bool kv_pass = false;
  int first_tokens = 0;
  double kl_ratio = 0;          // KL(blend) / KL(naive reuse) measured on the calibration text
  double top1 = 0;              // top-1 agreement with full prefill there
  double f = 0;                 // the work recomputed there
  int contexts = 0;
};

// The file's records; kInvalidArgument naming the line for a malformed one,
// kNotFound when the file cannot be read.
Result<std::vector<GateRecord>> ReadGate(const std::string& path);
// One record as a line of the file (no newline).
std::string GateLine(const GateRecord& record);

// The record of `fingerprint` for the method `options` resolve to (check
// layers resolved for `layers`, kv_pass as the engine will run it), or null.
const GateRecord* FindGate(const std::vector<GateRecord>& records, const std::string& fingerprint,
                           const BlendOptions& options, int layers, bool kv_pass);

}  // namespace kdn::blend
