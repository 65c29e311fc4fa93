// SPDX-License-Identifier: Apache-2.0
// `kdn llama`: a prompt on llama.cpp with the reference model's GGUF, cold
// and with kdn (the connector), both TTFTs and whether the continuations are
// identical.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kdn::llamacpp {

struct LlamaCommandOptions {
  std::string gguf;   // default: the GGUF the build made
  std::string text;   // default: bench/texts/heldout.txt
  std::uint32_t tokens = 480;  // prompt tokens (BOS included), from the text's start
  int steps = 32;
  bool flash_attn = false, f16 = false;
  std::string disk;   // a disk tier there instead of a host tier
  std::string codec;  // the tier's codec (default: the tier's)
  std::string json;   // one JSON object there
};

int RunLlama(const LlamaCommandOptions& options);

// Registers `llama` on a CLI11 app.
class LlamaCommand {
 public:
  explicit LlamaCommand(CLI::App& app);
  LlamaCommand(const LlamaCommand&) = delete;
  LlamaCommand& operator=(const LlamaCommand&) = delete;
  bool chosen() const { return static_cast<bool>(*cmd_); }
  int Run() const { return RunLlama(options_); }

 private:
  LlamaCommandOptions options_;
  CLI::App* cmd_ = nullptr;
};

struct LlamaBenchOptions {
  std::string json;        // the records (a JSON array)
  std::string dir;         // scratch for the disk tier (default: the temp dir)
  bool quick = false;      // one run per point, 2 KL contexts (a smoke test)
};

int RunLlamaBench(const LlamaBenchOptions& options);

// Registers `llama` under `kdn bench`.
class LlamaBenchCommand {
 public:
  explicit LlamaBenchCommand(CLI::App& bench);
  LlamaBenchCommand(const LlamaBenchCommand&) = delete;
  LlamaBenchCommand& operator=(const LlamaBenchCommand&) = delete;
  bool chosen() const { return static_cast<bool>(*cmd_); }
  int Run() const { return RunLlamaBench(options_); }

 private:
  LlamaBenchOptions options_;
  CLI::App* cmd_ = nullptr;
};

}  // namespace kdn::llamacpp
