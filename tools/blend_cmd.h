// SPDX-License-Identifier: Apache-2.0
// `kdn blend eval` and `kdn blend calibrate`: blending quality and TTFT on the reference model (issue
// 5, section 3; the measure itself is blend::EvaluateBlend in
// lab/blend/eval.h).
// Thread-safety: single-threaded command code.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "lab/blend/eval.h"

namespace kdn::tools {

struct BlendEvalCliOptions {
  std::string model, tokenizer, text;
  std::string suffix = "Question: What happened in the story? Answer:";
  blend::BlendEvalOptions eval;
  bool json = false;
};

// Runs the evaluation; prints one JSON object (with `json`) or a summary.
// Exit codes: 0 done, 2 bad arguments or an error (message on stderr).
int RunBlendEval(const BlendEvalCliOptions& options);

// `kdn blend calibrate` (issue 34, item 2): measures the blend's quality on
// a calibration text for kdn's two default methods (KV passes at check
// layers 1 and 2, 28%; CacheBlend's 15% at check layer 1, what an engine
// without a KV pass gets) and writes them to a gate file (core/blend/gate.h)
// under the reference engine's model fingerprint (or `fingerprint`).
struct BlendCalibrateCliOptions {
  std::string model, tokenizer, text, out, fingerprint;
  std::string suffix = "Question: What happened in the story? Answer:";
  int max_contexts = 0;
  bool json = false;
};
int RunBlendCalibrate(const BlendCalibrateCliOptions& options);

// Loads the model and text and evaluates (shared with `kdn bench blend`).
Result<blend::BlendEvalResult> EvaluateBlendFiles(const BlendEvalCliOptions& options);

// Registers `blend eval` on a CLI11 app.
class BlendCommand {
 public:
  explicit BlendCommand(CLI::App& app);
  BlendCommand(const BlendCommand&) = delete;
  BlendCommand& operator=(const BlendCommand&) = delete;
  bool chosen() const { return static_cast<bool>(*eval_cmd_) || static_cast<bool>(*calibrate_cmd_); }
  int Run() const { return *calibrate_cmd_ ? RunBlendCalibrate(calibrate_) : RunBlendEval(options_); }

 private:
  BlendEvalCliOptions options_;
  BlendCalibrateCliOptions calibrate_;
  CLI::App* eval_cmd_ = nullptr;
  CLI::App* calibrate_cmd_ = nullptr;
};

}  // namespace kdn::tools
