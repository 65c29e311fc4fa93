// SPDX-License-Identifier: Apache-2.0
#include "core/knowledge/match.h"

#include <algorithm>
#include <numeric>

namespace kdn::blend {
namespace {

// The polynomial's base: odd, so multiplying by it is a bijection mod 2^64.
constexpr std::uint64_t kBase = 0xC2B2AE3D27D4EB4FULL;

// Spreads a token id over 64 bits (splitmix64's finalizer) before it enters
// the polynomial, so that small, close ids do not give structured sums.
std::uint64_t Mix(std::int32_t token) {
  std::uint64_t z = static_cast<std::uint32_t>(token) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t Power(std::uint32_t w) {
  std::uint64_t p = 1;
  for (std::uint32_t i = 0; i < w; ++i) p *= kBase;
  return p;
}

}  // namespace

ChunkMatcher::ChunkMatcher(store::KnowledgeIndex& index, MatcherOptions options)
    : index_(index), options_([&] {
        if (options.window == 0) options.window = 1;
        if (options.min_chunk_tokens == 0) options.min_chunk_tokens = 1;
        return options;
      }()) {}

std::uint64_t ChunkMatcher::HashWindow(std::span<const std::int32_t> tokens) const {
  if (options_.window_hash) return options_.window_hash(tokens);
  std::uint64_t h = 0;  // the same sum the scan's prefix differences give
  for (std::int32_t t : tokens) h = h * kBase + Mix(t);
  return h;
}

std::shared_ptr<const ChunkMatcher::Scope> ChunkMatcher::Build(const store::ModelKv& model, std::string_view ns,
                                                              std::uint64_t generation) {
  auto scope = std::make_shared<Scope>();
  scope->generation = generation;
  std::vector<Entry> entries;
  std::vector<std::uint64_t> hashes;  // of each entry's first window
  for (const store::DocumentInfo& doc : index_.List(model, ns)) {
    auto chunks = index_.Chunks(model, ns, doc.doc_id);
    if (!chunks.ok()) continue;  // deleted since List: the generation moved, the next Match rebuilds
    for (const store::ChunkInfo& c : *chunks) {
      if (c.tokens.size() < options_.min_chunk_tokens) continue;
      const size_t w = std::min<size_t>(options_.window, c.tokens.size());
      entries.push_back(Entry{doc.doc_id, c.index, static_cast<std::uint32_t>(c.tokens.size()), c.key, c.begin});
      hashes.push_back(HashWindow(std::span<const std::int32_t>(c.tokens).first(w)));
    }
  }
  // Entries in the order a scan tries them: longest first, then doc_id and
  // chunk index. Candidates found at a position are then tried in index order.
  std::vector<std::uint32_t> order(entries.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    const Entry& x = entries[a];
    const Entry& y = entries[b];
    if (x.tokens != y.tokens) return x.tokens > y.tokens;
    if (x.doc_id != y.doc_id) return x.doc_id < y.doc_id;
    return x.chunk < y.chunk;
  });
  std::map<std::uint32_t, Width> widths;
  scope->entries.reserve(entries.size());
  for (std::uint32_t i : order) {
    const std::uint32_t w = std::min(options_.window, entries[i].tokens);
    Width& bucket = widths[w];
    bucket.width = w;
    bucket.by_hash.emplace(hashes[i], static_cast<std::uint32_t>(scope->entries.size()));
    scope->entries.push_back(std::move(entries[i]));
  }
  for (auto& [w, bucket] : widths) {
    bucket.power = Power(w);
    scope->widths.push_back(std::move(bucket));
  }
  return scope;
}

std::shared_ptr<const ChunkMatcher::Scope> ChunkMatcher::Current(const store::ModelKv& model, std::string_view ns) {
  index_.Sweep();  // expired documents leave the index, and so move its generation
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t generation = index_.Generation();  // read before listing: a later change forces a rebuild
  const ScopeKey key{model.fingerprint, std::string(ns)};
  auto it = scopes_.find(key);
  if (it != scopes_.end() && it->second->generation == generation) return it->second;
  std::shared_ptr<const Scope> scope = Build(model, ns, generation);
  if (scope->entries.empty()) {
    // Not kept: a table of empty scopes would grow with every namespace ever queried.
    if (it != scopes_.end()) scopes_.erase(it);
    return scope;
  }
  scopes_[key] = scope;
  return scope;
}

size_t ChunkMatcher::IndexedChunks(const store::ModelKv& model, std::string_view ns) {
  return Current(model, ns)->entries.size();
}

Matches ChunkMatcher::Match(const store::ModelKv& model, std::string_view ns, std::span<const std::int32_t> query) {
  Matches out;
  const std::shared_ptr<const Scope> scope = Current(model, ns);
  const size_t n = query.size();
  if (n == 0 || scope->entries.empty()) return out;

  // Prefix hashes: the hash of window [p, p + w) is prefix[p + w] - prefix[p] * B^w.
  std::vector<std::uint64_t> prefix;
  if (!options_.window_hash) {
    prefix.resize(n + 1);
    for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] * kBase + Mix(query[i]);
  }
  std::vector<std::uint32_t> candidates;
  std::vector<std::pair<std::uint32_t, keys::Digest>> keys_here;  // content keys of query[p, p + len) by len
  size_t p = 0;
  while (p < n) {
    candidates.clear();
    for (const Width& w : scope->widths) {  // ascending: once one does not fit, none does
      if (p + w.width > n) break;
      const std::uint64_t h = options_.window_hash ? options_.window_hash(query.subspan(p, w.width))
                                                   : prefix[p + w.width] - prefix[p] * w.power;
      auto [lo, hi] = w.by_hash.equal_range(h);
      for (auto e = lo; e != hi; ++e) {
        if (p + scope->entries[e->second].tokens <= n) candidates.push_back(e->second);
      }
    }
    bool found = false;
    if (!candidates.empty()) {
      std::sort(candidates.begin(), candidates.end());  // the entries' order: longest first
      keys_here.clear();
      for (std::uint32_t c : candidates) {
        const Entry& e = scope->entries[c];
        const keys::Digest* computed_key = nullptr;
        for (const auto& [len, k] : keys_here) {
          if (len == e.tokens) computed_key = &k;
        }
        if (!computed_key) {
          keys_here.emplace_back(e.tokens, index_.store().ContentKey(model, ns, query.subspan(p, e.tokens)));
          computed_key = &keys_here.back().second;
        }
        ++out.checked;
        if (*computed_key != e.key) {
          ++out.rejected;
          continue;
        }
        out.matches.push_back(ChunkMatch{p, e.tokens, e.doc_id, e.chunk, e.key, e.begin});
        p += e.tokens;
        found = true;
        break;
      }
    }
    if (!found) ++p;
  }
  return out;
}

}  // namespace kdn::blend
