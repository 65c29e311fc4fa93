// SPDX-License-Identifier: Apache-2.0
// Where tests find the reference model (the repository's models/, or $KDN_MODELS).
// KDN_REQUIRE_MODEL() skips the test when it is absent, saying so, unless
// KDN_REQUIRE_MODELS=1 is set (as CI does), when it fails the test instead.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace kdn::testing {

inline std::string ModelsDir() {
  const char* env = std::getenv("KDN_MODELS");
  return env && *env ? env : KDN_MODELS_DIR;
}
inline std::string ModelPath() { return ModelsDir() + "/stories260K.bin"; }
inline std::string TokenizerPath() { return ModelsDir() + "/tok512.bin"; }
inline std::string ReferencePath(const std::string& name) { return ModelsDir() + "/reference/" + name; }
// The reference run of models/README.md: greedy from BOS, 48 steps.
inline const std::vector<int> kReferenceIds = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292,
    411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267};

// A whole file of little-endian float32 (empty when it cannot be read).
inline std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

inline bool ModelsPresent() {
  return std::filesystem::exists(ModelPath()) && std::filesystem::exists(TokenizerPath());
}
inline bool ModelsRequired() {
  const char* env = std::getenv("KDN_REQUIRE_MODELS");
  return env && std::string(env) == "1";
}

}  // namespace kdn::testing

#define KDN_REQUIRE_MODEL()                                                                    \
  do {                                                                                         \
    if (!::kdn::testing::ModelsPresent()) {                                                    \
      if (::kdn::testing::ModelsRequired()) {                                                  \
        FAIL() << "reference model missing at " << ::kdn::testing::ModelsDir()                 \
               << " and KDN_REQUIRE_MODELS=1";                                                 \
      }                                                                                        \
      GTEST_SKIP() << "reference model not found at " << ::kdn::testing::ModelsDir()           \
                   << " (set KDN_MODELS): skipped";                                            \
    }                                                                                          \
  } while (0)
