// SPDX-License-Identifier: Apache-2.0
// `kdn codec eval` and `kdn codec calibrate`: a codec's quality on the reference model (issue 4,
// section 4; the measure itself is codec::Evaluate in lab/codec/eval.h).
// Thread-safety: single-threaded command code.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace kdn::tools {

struct CodecEvalOptions {
  std::string model, tokenizer, codec, text;
  int context = 448;
  int continue_tokens = 64;
  bool json = false;
};

// Prints one JSON object (with `json`) or a readable summary. Exit codes: 0
// done, 2 bad arguments or an error (with a message on stderr).
int RunCodecEval(const CodecEvalOptions& options);

struct CodecCalibrateOptions {
  std::string model, tokenizer, text, out;
  int context = 448;
  int continue_tokens = 64;
  int max_contexts = 0;
  bool json = false;
  // The transform codec's profile (lab/codec/tc_calibrate.h) instead of
  // kdn's: binary, so --out is required.
  bool transform = false;
  double vmul = 2.5;
  std::string fingerprint;  // the engine's model fingerprint; default: the reference engine's
  std::vector<int> balanced_contexts;  // tc: other context lengths the balanced preset must hold at
};

// Measures kdn's codec on a model (lab/codec/calibrate.h), prints the
// profile (or one JSON object), and writes it to `out` when given. Exit
// codes as RunCodecEval.
int RunCodecCalibrate(const CodecCalibrateOptions& options);

// Registers `codec eval` and `codec calibrate` on a CLI11 app; after parsing, chosen() says
// whether it was picked and Run() runs it.
class CodecCommand {
 public:
  explicit CodecCommand(CLI::App& app);
  // The parser writes into the options in place: the object must not move.
  CodecCommand(const CodecCommand&) = delete;
  CodecCommand& operator=(const CodecCommand&) = delete;
  bool chosen() const { return static_cast<bool>(*eval_cmd_) || static_cast<bool>(*calibrate_cmd_); }
  int Run() const { return *eval_cmd_ ? RunCodecEval(eval_) : RunCodecCalibrate(calibrate_); }

 private:
  CodecEvalOptions eval_;
  CodecCalibrateOptions calibrate_;
  CLI::App* eval_cmd_ = nullptr;
  CLI::App* calibrate_cmd_ = nullptr;
};

}  // namespace kdn::tools
