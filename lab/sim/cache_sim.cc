// SPDX-License-Identifier: Apache-2.0
#include "lab/sim/cache_sim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <unordered_map>
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
      policy->OnInsert(key, kObjectBytes, 0);
    }
  });
  return result;
}

double SimulateHitRate(PolicyKind kind, std::uint64_t capacity_objects, const ZipfWorkload& w) {
  return Simulate(kind, capacity_objects, w).hit_rate();
}

std::vector<SimSequence> MixedRequests(const MixedWorkload& w) {
  std::mt19937_64 rng(w.seed);
  std::vector<ZipfSampler> samplers;
  std::vector<double> cumulative;
  std::vector<std::uint64_t> first_id;
  double total = 0;
  std::uint64_t next_id = 0;
  for (const SimFamily& f : w.families) {
    samplers.emplace_back(f.sequences, f.exponent);
    total += f.share;
    cumulative.push_back(total);
    first_id.push_back(next_id);
    next_id += f.sequences;
  }
  std::vector<SimSequence> out;
  out.reserve(w.requests);
  for (std::uint64_t r = 0; r < w.requests; ++r) {
    const double u = UniformUnit(rng) * total;
    size_t f = 0;
    while (f + 1 < cumulative.size() && u >= cumulative[f]) ++f;
    const std::uint64_t rank = samplers[f](rng);
    // Ranks are scattered over the ids so that popularity is not id order.
    const std::uint64_t n = w.families[f].sequences;
    const std::uint64_t id = first_id[f] + (rank * 2654435761ull) % n;
    out.push_back({id, w.families[f].tokens});
  }
  return out;
}

PrefixSimResult SimulatePrefixReuse(PolicyKind kind, std::uint64_t capacity_bytes, const MixedWorkload& w,
                                    const std::vector<SimSequence>& requests) {
  const std::unique_ptr<EvictionPolicy> policy = MakePolicy(kind, capacity_bytes);
  std::unordered_map<keys::Digest, std::uint64_t, keys::DigestHash> present;  // key -> bytes
  std::uint64_t used = 0;
  const std::uint64_t warmup = requests.size() / 10;
  const auto any = [](const keys::Digest&) { return true; };
  PrefixSimResult result;
  struct Piece {
    keys::Digest key;
    std::uint64_t begin, tokens;
    double cost, value;
  };
  std::vector<Piece> pieces;
  for (std::uint64_t r = 0; r < requests.size(); ++r) {
    const SimSequence& q = requests[r];
    const bool counted = r >= warmup;
    pieces.clear();
    for (std::uint64_t b = 0; b < q.tokens; b += w.chunk_tokens) {
      const std::uint64_t n = std::min<std::uint64_t>(w.chunk_tokens, q.tokens - b);
      pieces.push_back({SimChunkKey(q.id, static_cast<std::uint32_t>(b / w.chunk_tokens)), b, n,
                        PrefillCost(static_cast<std::int64_t>(b), n), 0});
    }
    double total = 0;
    for (const Piece& p : pieces) total += p.cost;
    for (size_t i = 0; i < pieces.size(); ++i) {
      pieces[i].value = ChunkValue(total / static_cast<double>(q.tokens), pieces[i].tokens, i, pieces.size());
    }
    size_t hit = 0;
    while (hit < pieces.size() && present.count(pieces[hit].key)) {
      policy->OnAccess(pieces[hit].key);
      ++hit;
    }
    if (counted) {
      ++result.requests;
      result.tokens += q.tokens;
      for (size_t i = 0; i < pieces.size(); ++i) {
        result.work += pieces[i].cost;
        if (i < hit) {
          result.saved += pieces[i].cost;
          result.hit_tokens += pieces[i].tokens;
        }
      }
    }
    for (size_t i = hit; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      if (present.count(p.key)) continue;  // held already: the store skips it
      const std::uint64_t bytes = p.tokens * w.bytes_per_token;
      if (bytes > capacity_bytes) break;
      bool room = true;
      while (used + bytes > capacity_bytes) {
        const std::optional<keys::Digest> victim = policy->Victim(any);
        if (!victim) {
          room = false;
          break;
        }
        auto v = present.find(*victim);
        used -= v->second;
        present.erase(v);
        policy->OnRemove(*victim);
      }
      if (!room) break;
      present.emplace(p.key, bytes);
      used += bytes;
      policy->OnInsert(p.key, bytes, p.value);
    }
  }
  return result;
}

}  // namespace kdn::store
