// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

namespace kdn::bench {

struct BindingsBenchOptions {
  std::string json_path;
  int repeats = 5;
  std::vector<std::string> languages;  // empty: every binding this build has
  std::string bindings_dir;            // empty: the build's bindings/ (KDN_BINDINGS_BUILD_DIR)
};

// The bindings against C, in the same run: for each language, the same
// calls from C in this process right before the language's own bench
// (bindings/<lang>/bench, which prints {"retrieve_gbps", "lookup_us"}), so
// drift hits both sides. Retrieve: one Llama-3-8B-shaped chunk (32 layers x
// 8 KV heads x 128 x bf16 x 256 tokens = 32 MiB) from a host tier into the
// caller's own buffer, median GB/s. Lookup: one 256-token request, mean per
// call over 20000 calls, median of 5 batches. Records
// bindings_retrieve_gbps_<lang> (baseline c_retrieve_gbps) and
// bindings_lookup_us_<lang> (baseline c_lookup_us; lower is better).
int RunBindingsBench(const BindingsBenchOptions& options);

}  // namespace kdn::bench
