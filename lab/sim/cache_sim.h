// SPDX-License-Identifier: Apache-2.0
// A small cache simulator for the eviction-policy benchmarks: a Zipf
// workload over documents made of chunks, and one cache of uniform objects
// driven by an EvictionPolicy.
// Thread-safety: free functions share no state; a ZipfSampler is immutable
// after construction (concurrent const calls need one generator each).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/keys/hash.h"
#include "core/store/policy.h"

namespace kdn::store {

// Exponent with which ~80% of requests go to the top 20% of 1000 documents,
// found with ZipfExponentForShare(1000, 0.2, 0.8). The value depends on the
// number of documents (a longer tail needs less skew): 100 -> 1.2149,
// 10000 -> 0.9496, 100000 -> 0.9138.
inline constexpr double kZipfExponent8020 = 1.0239;

struct ZipfWorkload {
  std::uint64_t documents = 0;     // document ranks 0..documents-1, rank 0 the most popular
  double exponent = 0;             // P(rank k) proportional to 1 / (k + 1)^exponent
  std::uint32_t chunks_per_doc = 0;
  std::uint64_t requests = 0;      // each request reads all chunks of one document, in order
  std::uint64_t seed = 0;
};

// Draws ranks from a Zipf distribution by inverting a precomputed CDF
// (binary search), so a draw costs O(log n) and one uniform number.
class ZipfSampler {
 public:
  ZipfSampler(std::uint64_t n, double exponent);
  std::uint64_t size() const { return cdf_.size(); }
  // The rank whose CDF interval holds u, for u in [0, 1).
  std::uint64_t Rank(double u) const;
  // One draw; uses exactly one number from `rng`.
  std::uint64_t operator()(std::mt19937_64& rng) const;
  // P(rank < k), in [0, 1].
  double CdfBelow(std::uint64_t k) const;

 private:
  std::vector<double> cdf_;  // cdf_[k] = P(rank <= k); the last entry is 1
};

// A uniform double in [0, 1) from the top 53 bits of one draw (the same on
// every platform, unlike std::uniform_real_distribution).
double UniformUnit(std::mt19937_64& rng);

// The document of every request, in order; the same for the same workload.
std::vector<std::uint64_t> ZipfRequests(const ZipfWorkload& w);

// The key of chunk `chunk` of document `doc`: unique per (doc, chunk), cheap
// (no SHA-256), with well-mixed leading bytes for DigestHash.
keys::Digest SimChunkKey(std::uint64_t doc, std::uint32_t chunk);

// Share of the workload's requests that go to its ceil(top_fraction *
// documents) most requested documents, counted on the generated trace.
double TopDocumentShare(const ZipfWorkload& w, double top_fraction = 0.2);
// The same share from the distribution itself (no sampling).
double ZipfTopShare(std::uint64_t documents, double exponent, double top_fraction = 0.2);
// The exponent for which ZipfTopShare(documents, exponent, top_fraction) ==
// share, by bisection on [0, 8] (the share grows with the exponent).
double ZipfExponentForShare(std::uint64_t documents, double top_fraction, double share);

struct SimResult {
  std::uint64_t lookups = 0;  // chunk reads counted (after the warm-up)
  std::uint64_t hits = 0;
  double hit_rate() const { return lookups ? static_cast<double>(hits) / static_cast<double>(lookups) : 0.0; }
};

// Runs the workload through one cache of `capacity_objects` objects of the
// same size, under `kind`: a read that misses inserts the chunk, evicting the
// policy's victim when full. The first 10% of requests warm the cache and
// are not counted.
SimResult Simulate(PolicyKind kind, std::uint64_t capacity_objects, const ZipfWorkload& w);
double SimulateHitRate(PolicyKind kind, std::uint64_t capacity_objects, const ZipfWorkload& w);

// ---- Prefix reuse, priced: what kdn's store does with a trace -------------
// A token sequence requests read whole (a document, or a chat's history):
// chunks of chunk_tokens, the last one partial.
struct SimSequence {
  std::uint64_t id = 0;
  std::uint64_t tokens = 0;
};

// A mix of sequence families, each with its own Zipf popularity, requested
// in the given shares (e.g. short chats and long documents).
struct SimFamily {
  std::string name;
  std::uint64_t sequences = 0;      // distinct sequences of the family
  std::uint64_t tokens = 0;         // tokens of each
  double exponent = 0;              // Zipf exponent of their popularity
  double share = 0;                 // of the requests
};
struct MixedWorkload {
  std::vector<SimFamily> families;
  std::uint32_t chunk_tokens = 256;
  std::uint64_t bytes_per_token = 131072;  // KV of Llama-3-8B in bf16: 32 layers x 8 KV heads x 128 x 2 x 2 bytes
  std::uint64_t requests = 0;
  std::uint64_t seed = 0;
};

// The sequences requested, in order (ids unique across families).
std::vector<SimSequence> MixedRequests(const MixedWorkload& w);

struct PrefixSimResult {
  std::uint64_t requests = 0;   // counted (after the warm-up)
  double work = 0;              // prefill work of the counted requests (PrefillCost, token-equivalents)
  double saved = 0;             // of it, what their cached prefixes saved
  std::uint64_t tokens = 0, hit_tokens = 0;
  double saved_share() const { return work > 0 ? saved / work : 0.0; }
};

// Runs the requests through one cache of capacity_bytes under `kind`, as
// kdn's store serves them: a request reuses its longest cached prefix (each
// of those chunks a hit, in order); the rest is prefilled and stored, each
// new chunk with the value the store gives it (KvStore::PlanStore: its
// tokens at the sequence's mean prefill cost per token), evicting the policy's victims
// until it fits. Chunks cached after the first miss are not touched (a
// lookup stops there), as in the store. The first 10% of requests warm the
// cache and are not counted.
PrefixSimResult SimulatePrefixReuse(PolicyKind kind, std::uint64_t capacity_bytes, const MixedWorkload& w,
                                    const std::vector<SimSequence>& requests);

}  // namespace kdn::store
