// SPDX-License-Identifier: Apache-2.0
// `kdn blend eval`: blending quality and TTFT on the reference model (issue
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

// Loads the model and text and evaluates (shared with `kdn bench blend`).
Result<blend::BlendEvalResult> EvaluateBlendFiles(const BlendEvalCliOptions& options);

// Registers `blend eval` on a CLI11 app.
class BlendCommand {
 public:
  explicit BlendCommand(CLI::App& app);
  BlendCommand(const BlendCommand&) = delete;
  BlendCommand& operator=(const BlendCommand&) = delete;
  bool chosen() const { return static_cast<bool>(*eval_cmd_); }
  int Run() const { return RunBlendEval(options_); }

 private:
  BlendEvalCliOptions options_;
  CLI::App* eval_cmd_ = nullptr;
};

}  // namespace kdn::tools
