// SPDX-License-Identifier: Apache-2.0
#include "core/blend/gate.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kdn::blend {
namespace {

bool IsHexDigest(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool ParseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  size_t used = 0;
  try {
    *out = std::stod(s, &used);
  } catch (...) {
    return false;
  }
  return used == s.size() && std::isfinite(*out);
}

bool ParseInt(const std::string& s, int* out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  *out = std::stoi(s);
  return true;
}

}  // namespace

Result<std::vector<GateRecord>> ReadGate(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("blend gate: cannot read '" + path + "'");
  std::vector<GateRecord> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t start = line.find_first_not_of(" \t\r");
    if (start == std::string::npos || line[start] == '#') continue;
    auto bad = [&](const std::string& why) {
      return Status::InvalidArgument("blend gate '" + path + "' line " + std::to_string(n) + ": " + why);
    };
    std::istringstream fields(line);
    GateRecord r;
    fields >> r.fingerprint;
    if (!IsHexDigest(r.fingerprint)) return bad("the model fingerprint must be 64 lowercase hex digits");
    bool have_ratio = false, have_checks = false, have_kl = false;
    std::string field;
    while (fields >> field) {
      const size_t eq = field.find('=');
      if (eq == std::string::npos) return bad("'" + field + "' is not key=value");
      const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
      int flag = 0;
      if (key == "ratio") {
        if (!ParseDouble(value, &r.ratio) || r.ratio < 0 || r.ratio > 1) return bad("ratio must be in [0, 1]");
        have_ratio = true;
      } else if (key == "checks") {
        std::istringstream list(value);
        std::string item;
        while (std::getline(list, item, ',')) {
          int layer = 0;
          if (!ParseInt(item, &layer)) return bad("checks must be layers, comma-separated");
          r.check_layers.push_back(layer);
        }
        if (r.check_layers.empty()) return bad("checks names no layer");
        have_checks = true;
      } else if (key == "kv_pass") {
        if (!ParseInt(value, &flag) || flag > 1) return bad("kv_pass must be 0 or 1");
        r.kv_pass = flag == 1;
      } else if (key == "first") {
        if (!ParseInt(value, &r.first_tokens)) return bad("first must be a token count");
      } else if (key == "kl_ratio") {
        if (!ParseDouble(value, &r.kl_ratio) || r.kl_ratio < 0) return bad("kl_ratio must be a number >= 0");
        have_kl = true;
      } else if (key == "top1") {
        if (!ParseDouble(value, &r.top1) || r.top1 < 0 || r.top1 > 1) return bad("top1 must be in [0, 1]");
      } else if (key == "f") {
        if (!ParseDouble(value, &r.f) || r.f < 0 || r.f > 1.5) return bad("f must be a fraction");
      } else if (key == "contexts") {
        if (!ParseInt(value, &r.contexts)) return bad("contexts must be a count");
      } else {
        return bad("unknown key '" + key + "'");
      }
    }
    if (!have_ratio || !have_checks || !have_kl) return bad("ratio, checks and kl_ratio are required");
    out.push_back(std::move(r));
  }
  return out;
}

std::string GateLine(const GateRecord& r) {
  std::string checks;
  for (size_t i = 0; i < r.check_layers.size(); ++i) checks += (i ? "," : "") + std::to_string(r.check_layers[i]);
  char tail[160];
  std::snprintf(tail, sizeof tail, " kl_ratio=%.6g top1=%.6g f=%.6g contexts=%d", r.kl_ratio, r.top1, r.f,
                r.contexts);
  char head[64];
  std::snprintf(head, sizeof head, " ratio=%.6g", r.ratio);
  return r.fingerprint + head + " checks=" + checks + " kv_pass=" + (r.kv_pass ? "1" : "0") +
         " first=" + std::to_string(r.first_tokens) + tail;
}

const GateRecord* FindGate(const std::vector<GateRecord>& records, const std::string& fingerprint,
                           const BlendOptions& options, int layers, bool kv_pass) {
  const std::vector<int> checks = CheckLayersFor(options, layers);
  for (const GateRecord& r : records) {
    if (r.fingerprint == fingerprint && std::abs(r.ratio - options.ratio) <= 1e-6 && r.check_layers == checks &&
        r.kv_pass == kv_pass && r.first_tokens == options.first_tokens) {
      return &r;
    }
  }
  return nullptr;
}

}  // namespace kdn::blend
