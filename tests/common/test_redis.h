// SPDX-License-Identifier: Apache-2.0
// The Redis suites need a real redis-server and redis-cli (Debian's, or
// KDN_REDIS_BIN_DIR's). KDN_REQUIRE_REDIS_SERVER(have) skips the test without
// them, saying so, unless KDN_REQUIRE_REDIS=1 is set (as CI does), when it
// fails the test instead: a CI run never passes by skipping them.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace kdn::testing {

inline bool RedisRequired() {
  const char* env = std::getenv("KDN_REQUIRE_REDIS");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace kdn::testing

#define KDN_REQUIRE_REDIS_SERVER(have)                                                          \
  do {                                                                                          \
    if (!(have)) {                                                                              \
      if (::kdn::testing::RedisRequired()) {                                                    \
        FAIL() << "redis-server / redis-cli not found and KDN_REQUIRE_REDIS=1";                 \
      }                                                                                         \
      GTEST_SKIP() << "redis-server / redis-cli not installed (scripts/setup installs them): skipped"; \
    }                                                                                           \
  } while (0)
