#pragma once

#include <string>

namespace kdn::tools {

struct DemoOptions {
  std::string model;       // empty: the default reference model, or a random stand-in
  std::string tokenizer;
  unsigned chunk_tokens = 256;
  int steps = 24;          // continuation tokens compared per query
  int repeats = 5;         // timed runs per query (the median is shown)
};

// Ingests the stories as documents through the C ABI, then answers
// follow-up queries cold and with kdn. Returns a process exit code: 0 when
// every continuation with kdn is identical to the cold one.
int RunDemo(const DemoOptions& options);

}  // namespace kdn::tools
