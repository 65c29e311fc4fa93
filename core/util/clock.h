// SPDX-License-Identifier: Apache-2.0
// Time, injected: the system's steady clock in production, a manual one in
// tests of TTLs and expiry.
// Thread-safety: Now() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kdn {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual std::int64_t NowNs() const = 0;  // monotonic nanoseconds
};

class SteadyClock final : public Clock {
 public:
  std::int64_t NowNs() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static const SteadyClock* Get() {
    static const SteadyClock clock;  // stateless: safe to share
    return &clock;
  }
};

class ManualClock final : public Clock {
 public:
  std::int64_t NowNs() const override { return now_.load(); }
  void Advance(std::chrono::nanoseconds d) { now_ += d.count(); }

 private:
  std::atomic<std::int64_t> now_{1'000'000'000};
};

}  // namespace kdn
