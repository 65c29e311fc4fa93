// SPDX-License-Identifier: Apache-2.0
// Matching without separators: finds the stored content chunks of knowledge
// items (knowledge/knowledge.h) inside a query's tokens at any offset, so an
// engine need not mark where one retrieved chunk ends and the next begins.
//
// Index: per (model fingerprint, namespace), every chunk of every document
// of that scope is filed under the hash of its first w = min(window, chunk
// length) tokens. Chunks of chunk_tokens >= window tokens share one width;
// shorter ones (a document's last chunk) are filed under their own length, so
// a scope has at most `window` distinct widths.
//
// Window hash: a polynomial (Rabin-Karp) hash mod 2^64 of the tokens, each
// first mixed to 64 bits: H(x_0..x_{w-1}) = sum x_i B^(w-1-i). The query's
// prefix hashes P[i+1] = P[i] B + x_i are computed once, in O(query length),
// and then the hash of any window [p, p+w) is P[p+w] - P[p] B^w, in O(1); a
// scan costs O(query length x distinct widths). A window hash is only a
// filter: mod-2^64 polynomial hashes can be made to collide on purpose (and
// the first window of a chunk may match where the rest differs), so every
// window hit is CONFIRMED by computing the content key (SHA-256,
// keys::ContentKey, with the store's seed) of the query's tokens at that
// offset over the candidate chunk's length and comparing it with the stored
// key. A collision costs one SHA-256 of a chunk; it never yields a match.
//
// Why a window of 16 by default: it bounds the distinct widths (so the scan
// stays linear), 16 tokens of text (about a sentence) rarely repeat by chance
// so confirmations are mostly true hits, and it is at most a chunk.
//
// Selection: greedy left to right. At each query position the window hits
// are tried longest chunk first (then by doc_id and chunk index, for
// determinism); the first confirmed one is taken and the scan resumes after
// it; otherwise it moves on by one token. Matches do not overlap.
//
// Freshness: the matcher rebuilds a scope on demand. Match() first sweeps
// the knowledge index's expired documents, then compares its Generation()
// with the one the scope was built at, and rebuilds the scope from
// List()/Chunks() when they differ (any put or delete in any scope moves
// it). A rebuild costs O(tokens of the scope's documents); matches between
// changes cost only the scan.
//
// Matching reports what the index describes, not what tiers hold now: a
// matched chunk may have been evicted since (the caller's fetch says so).
// Thread-safety: every member function may be called concurrently. A mutex
// guards the scope table and rebuilds; a scan runs outside it over an
// immutable snapshot of the scope.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/keys/hash.h"
#include "core/knowledge/knowledge.h"

namespace kdn::blend {

// Hash of one window of tokens (the whole span). Tests use it to force
// collisions; it replaces the rolling hash both when filing chunks and when
// scanning, costing O(width) per query position instead of O(1). Called from
// every thread that matches, concurrently.
using WindowHashFn = std::function<std::uint64_t(std::span<const std::int32_t>)>;

struct MatcherOptions {
  std::uint32_t window = 16;          // W >= 1: tokens hashed per chunk (fewer when the chunk is shorter)
  std::uint32_t min_chunk_tokens = 1;  // shorter chunks are not indexed (a 1-token chunk matches anywhere)
  WindowHashFn window_hash;           // empty: the rolling polynomial hash (test hook)
};

// One chunk found in the query: query tokens [offset, offset + tokens) are
// exactly the tokens of chunk `chunk` of document `doc_id` (content key `key`),
// which sits at [doc_begin, doc_begin + tokens) of its document.
struct ChunkMatch {
  std::uint64_t offset = 0;
  std::uint64_t tokens = 0;
  std::string doc_id;
  std::uint32_t chunk = 0;
  keys::Digest key{};
  std::uint64_t doc_begin = 0;
};

struct Matches {
  std::vector<ChunkMatch> matches;  // ascending offset, non-overlapping
  std::uint64_t checked = 0;        // window hits checked by the full content key
  // Of those, rejected by it: rolling-hash collisions, and chunks whose first
  // window matches where the rest differs (the two look alike without
  // comparing tokens, which the matcher does not keep).
  std::uint64_t rejected = 0;
  std::uint64_t matched_tokens() const {
    std::uint64_t n = 0;
    for (const ChunkMatch& m : matches) n += m.tokens;
    return n;
  }
};

class ChunkMatcher {
 public:
  // Borrows `index` (and through it its store, whose seed keys the chunks);
  // both must outlive the matcher. options.window 0 is taken as 1.
  explicit ChunkMatcher(store::KnowledgeIndex& index, MatcherOptions options = {});

  // The chunks of the scope's documents found in `query`; only documents of
  // the same model fingerprint and namespace are considered. An empty query,
  // or one shorter than every indexed chunk, has no matches.
  Matches Match(const store::ModelKv& model, std::string_view ns, std::span<const std::int32_t> query);

  // Chunks indexed for the scope, after bringing it up to date.
  size_t IndexedChunks(const store::ModelKv& model, std::string_view ns);

 private:
  struct Entry {
    std::string doc_id;
    std::uint32_t chunk = 0;
    std::uint32_t tokens = 0;
    keys::Digest key{};
    std::uint64_t begin = 0;  // in the document
  };
  // Chunks filed under one window width: hash -> entries (indices into Scope::entries).
  struct Width {
    std::uint32_t width = 0;
    std::uint64_t power = 0;  // B^width mod 2^64
    std::unordered_multimap<std::uint64_t, std::uint32_t> by_hash;
  };
  // One (model, namespace)'s index, immutable once built.
  struct Scope {
    std::uint64_t generation = 0;
    std::vector<Entry> entries;
    std::vector<Width> widths;  // ascending width
  };
  using ScopeKey = std::pair<keys::Digest, std::string>;  // model fingerprint, ns

  std::shared_ptr<const Scope> Current(const store::ModelKv& model, std::string_view ns);
  std::shared_ptr<const Scope> Build(const store::ModelKv& model, std::string_view ns, std::uint64_t generation);
  std::uint64_t HashWindow(std::span<const std::int32_t> tokens) const;

  store::KnowledgeIndex& index_;
  const MatcherOptions options_;
  std::mutex mu_;
  std::map<ScopeKey, std::shared_ptr<const Scope>> scopes_;  // guarded by mu_
};

}  // namespace kdn::blend
