// SPDX-License-Identifier: Apache-2.0
#include "server/usage.h"

namespace kdn::server {

std::string UsageBook::ModelLabel(const keys::Digest& model) {
  if (model == keys::Digest{}) return "unknown";
  return "fp:" + keys::ToHex(model).substr(0, 12);
}

void UsageBook::SetNamespaceNames(std::unordered_map<keys::Digest, std::string, keys::DigestHash> names) {
  std::lock_guard<std::mutex> lock(mu_);
  names_ = std::move(names);
}

void UsageBook::Add(const keys::Digest& ns, const keys::Digest& model, const UsageCounts& delta) {
  std::lock_guard<std::mutex> lock(mu_);
  const Key key{ns, model};
  auto it = index_.find(key);
  if (it == index_.end()) {
    if (rows_.size() >= max_rows_) {
      other_used_ = true;
      other_.counts.Add(delta);
      return;
    }
    auto name = names_.find(ns);
    UsageRow row{name != names_.end() ? name->second : "ns:" + keys::ToHex(ns).substr(0, 8), ModelLabel(model), {}};
    it = index_.emplace(key, rows_.size()).first;
    rows_.push_back(std::move(row));
  }
  rows_[it->second].counts.Add(delta);
}

std::vector<UsageRow> UsageBook::Rows() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Rows whose labels meet (two hashes with one 8-digit prefix, say) are one
  // series: a page must not repeat a label set.
  std::vector<UsageRow> out;
  std::map<std::pair<std::string, std::string>, std::size_t> at;
  for (const UsageRow& r : rows_) {
    auto [it, fresh] = at.emplace(std::make_pair(r.ns, r.model), out.size());
    if (fresh) {
      out.push_back(r);
    } else {
      out[it->second].counts.Add(r.counts);
    }
  }
  if (other_used_) out.push_back(other_);
  return out;
}

}  // namespace kdn::server
