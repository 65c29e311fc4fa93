// SPDX-License-Identifier: Apache-2.0
// Usage by namespace and model, for the labelled kdn_usage_* series of
// kdnd's /metrics: the tokens engines asked for and found (their runtimes'
// reports, Session.report) and the bytes the node stored and served.
//
// Labels are bounded, as a metrics page must be: at most `max_rows`
// (namespace, model) pairs get a row of their own, in the order they first
// appear; every pair after that adds to one row labelled namespace="other",
// model="other", so no client can grow the page (or Prometheus's series)
// without limit by inventing namespaces or models.
// - namespace: the name a [[token]] grants it under (the node sees only
//   namespace hashes; the token file names them), else "ns:" and the
//   hash's first 8 hex digits;
// - model: "fp:" and the first 12 hex digits of the model's fingerprint
//   digest (what kdn_model_get_fingerprint returns to the engine), or
//   "unknown" for reports of runtimes that do not send it.
//
// Thread-safety: every member may be called from any thread at once.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/keys/hash.h"
#include "core/wire/node_stats.h"

namespace kdn::server {

class UsageBook {
 public:
  static constexpr std::size_t kDefaultMaxRows = 64;
  explicit UsageBook(std::size_t max_rows = kDefaultMaxRows) : max_rows_(max_rows) {}

  // The namespaces' names (hash -> name), from the token file; replaces the
  // previous ones (rows keep the label they were given).
  void SetNamespaceNames(std::unordered_map<keys::Digest, std::string, keys::DigestHash> names);
  void Add(const keys::Digest& ns, const keys::Digest& model, const UsageCounts& delta);
  // Every row, the "other" row last when it was used.
  std::vector<UsageRow> Rows() const;

  static std::string ModelLabel(const keys::Digest& model);

 private:
  struct Key {
    keys::Digest ns{}, model{};
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return keys::DigestHash()(k.ns) ^ (keys::DigestHash()(k.model) * 0x9E3779B97F4A7C15ull);
    }
  };
  const std::size_t max_rows_;
  mutable std::mutex mu_;
  std::unordered_map<keys::Digest, std::string, keys::DigestHash> names_;  // guarded by mu_
  std::unordered_map<Key, std::size_t, KeyHash> index_;                    // guarded by mu_: into rows_
  std::vector<UsageRow> rows_;                                             // guarded by mu_
  UsageRow other_{"other", "other", {}};                                   // guarded by mu_
  bool other_used_ = false;                                                // guarded by mu_
};

}  // namespace kdn::server
