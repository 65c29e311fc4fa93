// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace kdn::bench {

struct FoundationOptions {
  std::string json_path;
  std::string model;      // empty: the reference model (a random stand-in when absent)
  std::string tokenizer;
  int repeats = 0;        // 0: 30, or 5 with quick
  bool quick = false;
};

// TTFT cold vs warm at 128/256/512 tokens on the reference model, and host
// retrieve throughput against memcpy for a Llama-3-8B chunk and the
// reference model's chunk. Writes JSON records; returns an exit code.
int RunFoundation(const FoundationOptions& options);

}  // namespace kdn::bench
