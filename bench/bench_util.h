// SPDX-License-Identifier: Apache-2.0
// Shared by the benchmarks: timing, medians and the JSON records of DESIGN.md
// ({"name", "value", "unit", "baseline", "baseline_value", "ratio", "params"}).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kdn::bench {

inline double NowMs() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs fn once to warm up, then `repeats` times; the median in milliseconds.
template <typename Fn>
double MedianMs(int repeats, Fn&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = NowMs();
    fn();
    t.push_back(NowMs() - t0);
  }
  return Median(t);
}

// Prints each record as it is added and writes them all as one JSON array.
// `projected`, when given, becomes the record's "projected" field: false when
// this run measured the value, true when it is extrapolated from what was
// measured (then params say on what basis); left out, the record has no such
// field.
class Records {
 public:
  void Add(const std::string& name, double value, const std::string& unit, nlohmann::json params,
           const std::string& baseline = "", double baseline_value = 0.0,
           std::optional<bool> projected = std::nullopt) {
    nlohmann::json r = {{"name", name}, {"value", value}, {"unit", unit}};
    if (projected) r["projected"] = *projected;
    if (!baseline.empty()) {
      r["baseline"] = baseline;
      r["baseline_value"] = baseline_value;
      r["ratio"] = baseline_value != 0.0 ? value / baseline_value : 0.0;
    }
    r["params"] = std::move(params);
    std::printf("  %-26s %12.4f %-5s", name.c_str(), value, unit.c_str());
    if (!baseline.empty()) std::printf("  vs %-14s %12.4f  ratio %.3f", baseline.c_str(), baseline_value, value / baseline_value);
    if (print_params_) {
      std::printf("  %s\n", r["params"].dump().c_str());
    } else {
      std::printf("\n");
    }
    all_.push_back(std::move(r));
  }
  // false: each record's line leaves out its params (they are in the JSON).
  void set_print_params(bool on) { print_params_ = on; }
  bool Write(const std::string& path) const {
    std::ofstream f(path);
    f << all_.dump(2) << "\n";
    return static_cast<bool>(f);
  }
  // Writes the records as `command`'s last step: 0, or 2 saying why not.
  int Finish(const std::string& path, const char* command) const {
    if (!Write(path)) {
      std::fprintf(stderr, "%s: cannot write %s\n", command, path.c_str());
      return 2;
    }
    std::printf("wrote %s\n", path.c_str());
    return 0;
  }

 private:
  nlohmann::json all_ = nlohmann::json::array();
  bool print_params_ = true;
};

}  // namespace kdn::bench
