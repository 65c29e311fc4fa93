// SPDX-License-Identifier: Apache-2.0
// What the Redis client's tests share: byte views of strings and timing.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/redis/client.h"

namespace kdn::redis::testing {

// A string's bytes (a view: a literal's stay valid, no temporary is made).
inline std::span<const std::uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}
inline std::string Str(const Value& v) { return std::string(reinterpret_cast<const char*>(v.data), v.size); }
inline long long ElapsedMs(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace kdn::redis::testing
