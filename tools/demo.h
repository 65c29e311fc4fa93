// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace kdn::tools {

struct DemoOptions {
  std::string model;       // empty: the default reference model, or a random stand-in
  std::string tokenizer;
  unsigned chunk_tokens = 256;
  int steps = 24;          // continuation tokens compared per query
  int repeats = 5;         // timed runs per query (the median is shown)
  bool remote = false;     // --remote: two engines in two processes share a kdnd
  std::string node;        // --remote --node ADDRESS: your kdnd instead of one the demo starts
  std::string ns = "demo";  // --namespace: the kdn namespace the engines use
  std::string join_address, token_file;  // --remote-join: the second engine's side; --token-file: the node's token
};

// Ingests the stories as documents through the C ABI, then answers
// follow-up queries cold and with kdn. Returns a process exit code: 0 when
// every continuation with kdn is identical to the cold one.
int RunDemo(const DemoOptions& options);
// --remote (tools/demo_remote.cc): starts a kdnd (or, with --node, uses a
// running one, with the token in --token-file), ingests the stories through
// a runtime that shares it, then runs `self demo --remote-join` as a second
// engine in another process. 0 when its continuations with kdn are identical.
int RunRemoteDemo(const DemoOptions& options, const std::string& argv0);
int RunRemoteJoin(const DemoOptions& options);

}  // namespace kdn::tools
