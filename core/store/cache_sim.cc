#include "store/cache_sim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <unordered_set>

namespace kdn::store {

ZipfSampler::ZipfSampler(std::uint64_t n, double exponent) : cdf_(n) {
  // Sum from the largest rank down: the small terms are added first, which
  // keeps the rounding error of the total low for large n.
  double total = 0;
  for (std::uint64_t k = n; k-- > 0;) total += std::pow(static_cast<double>(k + 1), -exponent);
  double running = 0;
  for (std::uint64_t k = 0; k < n; ++k) {
    running += std::pow(static_cast<double>(k + 1), -exponent);
    cdf_[k] = running / total;
  }
  if (n > 0) cdf_.back() = 1.0;  // no u in [0, 1) may fall past the end
}

std::uint64_t ZipfSampler::Rank(double u) const {
  // The first rank whose cumulative probability exceeds u.
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  return std::min<std::uint64_t>(static_cast<std::uint64_t>(it - cdf_.begin()), cdf_.size() - 1);
}

std::uint64_t ZipfSampler::operator()(std::mt19937_64& rng) const { return Rank(UniformUnit(rng)); }

double ZipfSampler::CdfBelow(std::uint64_t k) const {
  if (k == 0 || cdf_.empty()) return 0.0;
  return cdf_[std::min<std::uint64_t>(k, cdf_.size()) - 1];
}

double UniformUnit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

namespace {

// Calls fn(doc) for every request of the workload, in order.
void ForEachRequest(const ZipfWorkload& w, const std::function<void(std::uint64_t)>& fn) {
  if (w.documents == 0) return;
  const ZipfSampler sampler(w.documents, w.exponent);
  std::mt19937_64 rng(w.seed);
  for (std::uint64_t r = 0; r < w.requests; ++r) fn(sampler(rng));
}

// SplitMix64's finalizer: a bijection on 64 bits with good avalanche.
std::uint64_t Mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<std::uint64_t> ZipfRequests(const ZipfWorkload& w) {
  std::vector<std::uint64_t> docs;
  docs.reserve(w.requests);
  ForEachRequest(w, [&](std::uint64_t doc) { docs.push_back(doc); });
  return docs;
}

keys::Digest SimChunkKey(std::uint64_t doc, std::uint32_t chunk) {
  // Bytes 0..7: a mixed hash (what DigestHash reads); bytes 8..19: doc and
  // chunk themselves, so distinct (doc, chunk) pairs never collide.
  keys::Digest d{};
  const std::uint64_t h = Mix(doc * 0x100000001B3ull ^ Mix(chunk));
  std::memcpy(d.data(), &h, sizeof h);
  std::memcpy(d.data() + 8, &doc, sizeof doc);
  std::memcpy(d.data() + 16, &chunk, sizeof chunk);
  d[31] = 0x5C;  // marks simulator keys
  return d;
}

namespace {
std::uint64_t TopCount(std::uint64_t documents, double top_fraction) {
  const double k = std::ceil(top_fraction * static_cast<double>(documents) - 1e-9);
  return std::min<std::uint64_t>(documents, static_cast<std::uint64_t>(std::max(0.0, k)));
}
}  // namespace

double TopDocumentShare(const ZipfWorkload& w, double top_fraction) {
  if (w.documents == 0 || w.requests == 0) return 0.0;
  std::vector<std::uint64_t> counts(w.documents, 0);
  ForEachRequest(w, [&](std::uint64_t doc) { ++counts[doc]; });
  const std::uint64_t top = TopCount(w.documents, top_fraction);
  std::partial_sort(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(top), counts.end(),
                    std::greater<>());
  std::uint64_t in_top = 0;
  for (std::uint64_t i = 0; i < top; ++i) in_top += counts[i];
  return static_cast<double>(in_top) / static_cast<double>(w.requests);
}

double ZipfTopShare(std::uint64_t documents, double exponent, double top_fraction) {
  if (documents == 0) return 0.0;
  return ZipfSampler(documents, exponent).CdfBelow(TopCount(documents, top_fraction));
}

double ZipfExponentForShare(std::uint64_t documents, double top_fraction, double share) {
  double lo = 0.0, hi = 8.0;
  for (int i = 0; i < 50; ++i) {
    const double mid = 0.5 * (lo + hi);
    (ZipfTopShare(documents, mid, top_fraction) < share ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

SimResult Simulate(PolicyKind kind, std::uint64_t capacity_objects, const ZipfWorkload& w) {
  constexpr std::uint64_t kObjectBytes = 1;  // uniform sizes: bytes count objects
  const std::unique_ptr<EvictionPolicy> policy = MakePolicy(kind, capacity_objects * kObjectBytes);
  std::unordered_set<keys::Digest, keys::DigestHash> present;
  present.reserve(capacity_objects + 1);
  const std::uint64_t warmup = w.requests / 10;
  const auto any = [](const keys::Digest&) { return true; };

  SimResult result;
  std::uint64_t request = 0;
  ForEachRequest(w, [&](std::uint64_t doc) {
    const bool counted = request++ >= warmup;
    for (std::uint32_t c = 0; c < w.chunks_per_doc; ++c) {
      const keys::Digest key = SimChunkKey(doc, c);
      if (counted) ++result.lookups;
      if (present.count(key)) {
        if (counted) ++result.hits;
        policy->OnAccess(key);
        continue;
      }
      if (capacity_objects == 0) continue;
      if (present.size() >= capacity_objects) {
        const std::optional<keys::Digest> victim = policy->Victim(any);
        if (!victim) continue;  // cannot happen: nothing is ever refused here
        present.erase(*victim);
        policy->OnRemove(*victim);
      }
      present.insert(key);
      policy->OnInsert(key, kObjectBytes);
    }
  });
  return result;
}

double SimulateHitRate(PolicyKind kind, std::uint64_t capacity_objects, const ZipfWorkload& w) {
  return Simulate(kind, capacity_objects, w).hit_rate();
}

}  // namespace kdn::store
