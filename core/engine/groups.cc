// SPDX-License-Identifier: Apache-2.0
#include "core/engine/groups.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "core/engine/engine_ops.h"

namespace kdn::store {
namespace {

constexpr size_t kNone = static_cast<size_t>(-1);

double ElapsedMicros(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

keys::Digest Derived(std::string_view tag, const keys::Digest& fingerprint, const keys::Digest& key) {
  keys::Hasher h;
  h.Str(tag).Bytes(fingerprint.data(), fingerprint.size()).Bytes(key.data(), key.size());
  return h.Finish();
}

keys::Digest GroupKey(const LayerGroup& g, const keys::Digest& chain) { return GroupChunkKey(g, chain); }
keys::Digest StateKey(const GroupedModel& m, const keys::Digest& chain) { return StateSnapshotKey(m, chain); }

// What a request's chunks have, group by group.
struct Scan {
  std::vector<KvStore::KeyedRange> ranges;  // the chain (KvStore::ChainKeys), held meaning by some group
  std::vector<std::vector<bool>> held;      // [group][range]: its chunk, whole
  // [group][range i], sliding groups: the partial chunk the prefix ending
  // with range i needs (the first of its window, when the window starts
  // inside it: GroupPartialKey at that end).
  std::vector<std::vector<bool>> partial;
  std::vector<bool> state;  // [range]: the snapshot at its end
};

std::uint64_t EndOf(const KvStore::KeyedRange& r) { return r.begin + r.len; }

// Where a sliding group's window starts for a prefix of b tokens.
std::uint64_t WindowStart(const LayerGroup& g, std::uint64_t b) { return g.window == 0 || b <= g.window ? 0 : b - g.window; }

// The ranges a group needs for the prefix ending with range `last`.
std::vector<size_t> Needed(const LayerGroup& g, const std::vector<KvStore::KeyedRange>& ranges, size_t last) {
  std::vector<size_t> out;
  if (last == kNone) return out;
  const std::uint64_t lo = WindowStart(g, EndOf(ranges[last]));
  for (size_t j = 0; j <= last; ++j) {
    if (EndOf(ranges[j]) > lo) out.push_back(j);
  }
  return out;
}

// Whether range j, needed by the prefix ending with range `last`, is one
// the window starts inside (so that a partial chunk keyed at that end serves).
bool StartsInside(const LayerGroup& g, const std::vector<KvStore::KeyedRange>& ranges, size_t j, size_t last) {
  return ranges[j].begin < WindowStart(g, EndOf(ranges[last]));
}

// Which group holds what of the ranges `s` has, by `holds` (a key held in
// any tier, or in one).
template <typename Holds>
void FillHeld(const GroupedModel& m, Scan& s, const Holds& holds) {
  const size_t n = s.ranges.size();
  s.held.assign(m.groups.size(), std::vector<bool>(n, false));
  s.partial.assign(m.groups.size(), std::vector<bool>(n, false));
  s.state.assign(n, false);
  // The full groups' leading run bounds every prefix: nothing past it is probed.
  size_t run = n;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (m.groups[g].window != 0) continue;
    for (size_t i = 0; i < run; ++i) {
      s.held[g][i] = holds(GroupKey(m.groups[g], s.ranges[i].key));
      if (!s.held[g][i]) run = i;
    }
  }
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const LayerGroup& group = m.groups[g];
    if (group.window == 0) continue;
    for (size_t i = 0; i < run; ++i) {
      s.held[g][i] = holds(GroupKey(group, s.ranges[i].key));
      const std::vector<size_t> need = Needed(group, s.ranges, i);
      if (!need.empty() && StartsInside(group, s.ranges, need.front(), i)) {
        s.partial[g][i] = holds(GroupPartialKey(group, s.ranges[need.front()].key, EndOf(s.ranges[i])));
      }
    }
  }
  if (m.state_layers > 0) {
    for (size_t i = 0; i < run; ++i) s.state[i] = holds(StateKey(m, s.ranges[i].key));
  }
}

Scan ScanRequest(KvStore& store, const GroupedModel& m, std::string_view ns, const TokenKeys& keys) {
  Scan s;
  s.ranges = store.ChainKeys(m.model, ns, keys, [&](const keys::Digest& key, std::uint64_t begin, std::uint64_t len) {
    for (const LayerGroup& g : m.groups) {
      if (store.Holds(ns, GroupKey(g, key))) return true;
      if (g.window != 0 && store.Holds(ns, GroupPartialKey(g, key, begin + len))) return true;
    }
    return m.state_layers > 0 && store.Holds(ns, StateKey(m, key));
  });
  FillHeld(m, s, [&](const keys::Digest& key) { return store.Holds(ns, key); });
  return s;
}

// Whether group g has range j for the prefix ending with range `last`:
// whole, or (the window starting inside it) the partial chunk keyed there.
bool GroupHas(const GroupedModel& m, const Scan& s, size_t g, size_t j, size_t last) {
  return s.held[g][j] || (StartsInside(m.groups[g], s.ranges, j, last) && s.partial[g][last]);
}

// The largest prefix the rule allows (a range's end, or 0) with what `s`
// says is held; `last`: the range ending there (kNone for 0).
std::uint64_t RulePrefix(const GroupedModel& m, const Scan& s, size_t* last) {
  size_t run = s.ranges.size();
  for (size_t g = 0; g < m.groups.size(); ++g) {
    if (m.groups[g].window != 0) continue;
    for (size_t i = 0; i < run; ++i) {
      if (!s.held[g][i]) run = i;
    }
  }
  for (size_t i = run; i-- > 0;) {
    if (m.state_layers > 0 && !s.state[i]) continue;
    bool ok = true;
    for (size_t g = 0; g < m.groups.size() && ok; ++g) {
      if (m.groups[g].window == 0) continue;
      for (size_t j : Needed(m.groups[g], s.ranges, i)) ok = ok && GroupHas(m, s, g, j, i);
    }
    if (ok) {
      *last = i;
      return EndOf(s.ranges[i]);
    }
  }
  *last = kNone;
  return 0;
}

// Tokens [from, from + count) of a canonical chunk of `tokens` tokens
// ([layer][k|v][token][...]) of model `kv`, as a chunk of their own; and
// the reverse, into a chunk.
std::vector<std::uint8_t> SliceTokens(const ModelKv& kv, const std::uint8_t* chunk, std::uint64_t tokens,
                                      std::uint64_t from, std::uint64_t count) {
  const auto row = static_cast<std::uint64_t>(kv.bytes_per_token() / (2 * kv.shape.layers));
  const auto planes = static_cast<std::uint64_t>(2 * kv.shape.layers);
  std::vector<std::uint8_t> out(static_cast<size_t>(planes * count * row));
  for (std::uint64_t p = 0; p < planes; ++p) {
    std::memcpy(out.data() + p * count * row, chunk + (p * tokens + from) * row, static_cast<size_t>(count * row));
  }
  return out;
}
void PlaceTokens(const ModelKv& kv, const std::uint8_t* slice, std::uint64_t count, std::uint8_t* chunk,
                 std::uint64_t tokens, std::uint64_t from) {
  const auto row = static_cast<std::uint64_t>(kv.bytes_per_token() / (2 * kv.shape.layers));
  const auto planes = static_cast<std::uint64_t>(2 * kv.shape.layers);
  for (std::uint64_t p = 0; p < planes; ++p) {
    std::memcpy(chunk + (p * tokens + from) * row, slice + p * count * row, static_cast<size_t>(count * row));
  }
}

// The views of a group's layers as KV groups over `sub` (a model of just
// those layers: its layer i is model layer layers[i]); their base arrays in
// `bases`, which must outlive them.
std::vector<KvGroup> Select(std::span<const KvGroup> views, const ModelKv& sub, std::span<const std::uint32_t> layers,
                            std::vector<std::vector<void*>>& bases) {
  std::vector<KvGroup> out;
  bases.reserve(bases.size() + 2 * views.size());
  for (const KvGroup& g : views) {
    KvGroup s;
    s.engine_stream = g.engine_stream;
    std::vector<void*> k, v;
    for (size_t j = 0; j < g.layers.size(); ++j) {
      const auto at = std::find(layers.begin(), layers.end(), g.layers[j]);
      if (at == layers.end()) continue;
      s.layers.push_back(static_cast<std::uint32_t>(at - layers.begin()));
      k.push_back(g.view.k_base[j]);
      v.push_back(g.view.v_base[j]);
    }
    if (s.layers.empty()) continue;
    s.view = g.view;
    s.view.shape = sub.shape;
    s.view.shape.layers = static_cast<std::int64_t>(s.layers.size());
    bases.push_back(std::move(k));
    s.view.k_base = bases.back().data();
    bases.push_back(std::move(v));
    s.view.v_base = bases.back().data();
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

keys::Digest GroupChunkKey(const LayerGroup& group, const keys::Digest& chain) {
  return Derived("kdn-group-chunk-v1", group.kv.fingerprint, chain);
}

keys::Digest GroupPartialKey(const LayerGroup& group, const keys::Digest& chain, std::uint64_t end) {
  keys::Hasher h;
  h.Str("kdn-group-partial-v1").Bytes(group.kv.fingerprint.data(), group.kv.fingerprint.size());
  h.Bytes(chain.data(), chain.size()).U64(end);
  return h.Finish();
}

keys::Digest StateSnapshotKey(const GroupedModel& model, const keys::Digest& chain) {
  return Derived("kdn-state-v1", model.state.fingerprint, chain);
}

bool GroupedModel::Needed(std::span<const std::uint32_t> windows, std::uint32_t state_layers) {
  return state_layers > 0 || std::any_of(windows.begin(), windows.end(), [](std::uint32_t w) { return w != 0; });
}

Result<GroupedModel> GroupedModel::Make(const ModelKv& model, std::span<const std::uint32_t> windows,
                                        std::uint32_t state_layers, std::uint64_t state_bytes) {
  const auto L = static_cast<size_t>(model.shape.layers);
  if (!windows.empty() && windows.size() != L) {
    return Status::InvalidArgument("layer windows: " + std::to_string(windows.size()) + " given for " +
                                   std::to_string(L) + " attention layers");
  }
  if (state_layers > 0 && (state_bytes == 0 || state_bytes % 4 != 0)) {
    return Status::InvalidArgument("state_bytes must be a positive multiple of 4 (" + std::to_string(state_bytes) +
                                   ") for a model with recurrent layers");
  }
  if (state_layers == 0 && state_bytes != 0) {
    return Status::InvalidArgument("state_bytes is set but the model has no recurrent layers (num_state_layers 0)");
  }
  GroupedModel m;
  m.model = model;
  std::map<std::uint32_t, std::vector<std::uint32_t>> by_window;  // ascending: full (0) first
  for (size_t l = 0; l < L; ++l) by_window[windows.empty() ? 0 : windows[l]].push_back(static_cast<std::uint32_t>(l));
  for (auto& [window, layers] : by_window) {
    LayerGroup g;
    g.kv = model;
    g.kv.shape.layers = static_cast<std::int64_t>(layers.size());
    keys::Hasher h;
    h.Str("kdn-layer-group-v1").Bytes(model.fingerprint.data(), model.fingerprint.size()).U32(window);
    h.U64(layers.size());
    for (std::uint32_t l : layers) h.U32(l);
    g.kv.fingerprint = h.Finish();
    g.window = window;
    g.layers = std::move(layers);
    m.groups.push_back(std::move(g));
  }
  m.state_layers = state_layers;
  m.state_bytes = state_bytes;
  if (state_layers > 0) {
    keys::Hasher h;
    h.Str("kdn-state-model-v1").Bytes(model.fingerprint.data(), model.fingerprint.size()).U32(state_layers);
    h.U64(state_bytes);
    m.state.fingerprint = h.Finish();
    // Opaque bytes, kept as 2-byte elements: one "token" of one head per
    // layer, its halves the "K" and "V" planes. Never given to a lossy codec
    // (stored exact), so the element type means nothing.
    m.state.dtype = 1;
    m.state.shape = {static_cast<std::int64_t>(state_layers), 1, static_cast<std::int64_t>(state_bytes / 4), 2};
  }
  return m;
}

LookupResult GroupedLookup(KvStore& store, const GroupedModel& m, std::string_view ns, const TokenKeys& keys) {
  const auto t0 = std::chrono::steady_clock::now();
  LookupResult r;
  if (store.CheckKeys(keys).ok()) {
    Scan s = ScanRequest(store, m, ns, keys);
    size_t last = kNone;
    r.tokens = RulePrefix(m, s, &last);
    // Per tier, the prefix the rule gives with what that tier alone holds.
    const TieredStore& chain = store.chain();
    const ReadContext ctx = store.Context(ns);
    for (size_t level = 0; level < chain.levels(); ++level) {
      FillHeld(m, s, [&](const keys::Digest& key) { return chain.ContainsAt(level, key, ctx); });
      r.tier_tokens.push_back(RulePrefix(m, s, &last));
    }
  }
  store.CountLookup(keys.size(), r.tokens, ElapsedMicros(t0));
  return r;
}

Result<std::uint64_t> GroupedStore(KvStore& store, const GroupedModel& m, std::string_view ns, const TokenKeys& keys,
                                   std::span<const KvGroup> views, std::span<void* const> state) {
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(store.CheckKeys(keys));
  if (!state.empty() && state.size() != m.state_layers) {
    return Status::InvalidArgument("state: " + std::to_string(state.size()) + " layers given, the model has " +
                                   std::to_string(m.state_layers) + " recurrent layers");
  }
  // The chunks a store cuts (whole chunks, then pieces of decreasing powers
  // of two), as the plain store does.
  const auto ranges = store.ChainKeys(m.model, ns, keys, [](const keys::Digest&, std::uint64_t, std::uint64_t) {
    return true;
  });
  const ReadContext ctx = store.Context(ns);
  // What each chunk's presence saves when the request comes again, for the
  // cost-aware policy, as the plain store gives it (store/policy.h
  // ChunkValue). A sliding layer's KV is read only in its window [n - W, n):
  // the engine need not hold older tokens (llama.cpp's SWA cache keeps the
  // last W, vLLM frees a sliding group's blocks behind it). Its chunks
  // wholly before the window are not stored (the stores at the boundaries
  // a shorter prefix ends at keep those); the chunk the window starts
  // inside is stored as a partial chunk keyed by this end (GroupPartialKey:
  // the window's tokens, the older ones zero), which serves a prefix ending
  // here only. A retrieve of the whole request does not read older chunks,
  // so they age: the first to go for LRU and FIFO.
  const std::uint64_t n = keys.size();
  double work = 0;
  for (const KvStore::KeyedRange& r : ranges) work += PrefillCost(static_cast<std::int64_t>(r.begin), r.len);
  const double mean = n > 0 ? work / static_cast<double>(n) : 0;
  bool full = false;  // a put no tier took: what is held stays, and the rule says what prefix that leaves
  std::vector<keys::Digest> ends;  // each group's key of the last range (what a snapshot here is tied to)
  for (const LayerGroup& g : m.groups) {
    std::vector<std::vector<void*>> bases;
    const std::vector<KvGroup> sub = Select(views, g.kv, g.layers, bases);
    const auto per_token = static_cast<std::uint64_t>(g.kv.bytes_per_token());
    const std::uint64_t lo = WindowStart(g, n);
    for (size_t i = 0; i < ranges.size() && !full; ++i) {
      const KvStore::KeyedRange& r = ranges[i];
      if (EndOf(r) <= lo) continue;  // before the window
      const bool partial = r.begin < lo;
      const keys::Digest key = partial ? GroupPartialKey(g, r.key, n) : GroupKey(g, r.key);
      if (i + 1 == ranges.size()) ends.push_back(key);
      if (store.Holds(ns, key)) continue;
      Payload payload = Payload::Uninitialized(static_cast<size_t>(r.len * per_token));
      if (partial) {
        std::vector<std::uint8_t> window(static_cast<size_t>((EndOf(r) - lo) * per_token));
        GatherGroups(g.kv, sub, lo, EndOf(r) - lo, window.data());
        std::memset(payload.data(), 0, payload.size());
        PlaceTokens(g.kv, window.data(), EndOf(r) - lo, payload.data(), r.len, lo - r.begin);
      } else {
        GatherGroups(g.kv, sub, r.begin, r.len, payload.data());
      }
      full = !store.PutPayload(g.kv, ns, key, r.len, static_cast<std::int64_t>(r.begin), std::move(payload), false,
                               ChunkValue(mean, r.len, i, ranges.size()), ctx)
                  .ok();
    }
  }
  // The snapshot at the request's end, when that is a boundary a later
  // walk reaches (with block hashes, a tail shorter than a block is not):
  // worth the whole prefix's work, which it makes reusable, and tied to
  // each group's chunk ending there (TieredStore::Tie), without which it
  // serves nothing: evicted with them.
  if (!state.empty() && !ranges.empty() && EndOf(ranges.back()) == n) {
    const keys::Digest key = StateKey(m, ranges.back().key);
    if (!store.Holds(ns, key)) {
      Payload payload = Payload::Uninitialized(static_cast<size_t>(m.state_layers * m.state_bytes));
      for (std::uint32_t l = 0; l < m.state_layers; ++l) {
        std::memcpy(payload.data() + l * m.state_bytes, state[l], static_cast<size_t>(m.state_bytes));
      }
      (void)store.PutPayload(m.state, ns, key, 1, static_cast<std::int64_t>(n), std::move(payload), false, work, ctx,
                             /*exact=*/true);
    }
    if (store.Holds(ns, key)) (void)store.chain().Tie(key, ends);  // refused past its bound: evicted by policy alone
  }
  store.CountStore(ElapsedMicros(t0));
  const Scan s = ScanRequest(store, m, ns, keys);
  size_t last = kNone;
  return RulePrefix(m, s, &last);
}

Result<KvStore::Retrieved> GroupedRetrieve(KvStore& store, const GroupedModel& m, std::string_view ns,
                                           const TokenKeys& keys, std::span<const KvGroup> views,
                                           std::span<void* const> state) {
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(store.CheckKeys(keys));
  if (m.state_layers > 0 && state.size() != m.state_layers) {
    return Status::InvalidArgument("the model has " + std::to_string(m.state_layers) +
                                   " recurrent layers: a retrieve needs their state's memory (state_layers), " +
                                   std::to_string(state.size()) + " given");
  }
  Scan s = ScanRequest(store, m, ns, keys);
  size_t last = kNone;
  std::uint64_t b = RulePrefix(m, s, &last);
  KvStore::Retrieved out;
  out.covered = b;
  std::map<std::uint64_t, size_t> index;  // range begin -> range
  for (size_t i = 0; i < s.ranges.size(); ++i) index[s.ranges[i].begin] = i;
  // What has been read, per group and range (with the key it was read by:
  // a sliding group's partial chunk is another object at each end); the
  // snapshot read for `last`.
  std::vector<std::map<size_t, std::pair<keys::Digest, FetchedChunk>>> got(m.groups.size());
  std::optional<FetchedChunk> snapshot;
  size_t snapshot_of = kNone;
  // Read what the prefix needs; a chunk or snapshot that fails to read is
  // no longer held, and the rule chooses again (a shorter prefix, whose
  // sliding windows may need older chunks).
  while (last != kNone) {
    bool failed = false;
    for (size_t g = 0; g < m.groups.size(); ++g) {
      const LayerGroup& group = m.groups[g];
      std::vector<KvStore::KeyedRange> want;
      std::map<size_t, bool> partial;  // range -> read as the partial chunk
      for (size_t j : Needed(group, s.ranges, last)) {
        const bool part = !s.held[g][j];  // GroupHas(): then the partial chunk keyed at b
        const keys::Digest key = part ? GroupPartialKey(group, s.ranges[j].key, b) : GroupKey(group, s.ranges[j].key);
        auto it = got[g].find(j);
        if (it != got[g].end() && it->second.first == key) continue;
        if (it != got[g].end()) got[g].erase(it);
        want.push_back({key, s.ranges[j].begin, s.ranges[j].len});
        partial[j] = part;
      }
      if (want.empty()) continue;
      Fetch f = store.FetchKeys(group.kv, ns, want);
      for (FetchedChunk& c : f.chunks) {
        const size_t j = index.at(c.begin);
        const keys::Digest key = partial.at(j) ? GroupPartialKey(group, s.ranges[j].key, b) : GroupKey(group, s.ranges[j].key);
        got[g].insert_or_assign(j, std::make_pair(key, std::move(c)));
      }
      for (const TokenRange& bad : f.failed) {
        for (auto it = index.lower_bound(bad.begin); it != index.end() && it->first < bad.end; ++it) {
          if (partial.count(it->second) != 0 && partial.at(it->second)) {
            s.partial[g][last] = false;
          } else {
            s.held[g][it->second] = false;
          }
        }
        failed = true;
      }
    }
    if (m.state_layers > 0 && snapshot_of != last) {
      const KvStore::KeyedRange want{StateKey(m, s.ranges[last].key), b, 1};
      Fetch f = store.FetchKeys(m.state, ns, std::span<const KvStore::KeyedRange>(&want, 1));
      // A snapshot is used exact or not at all (a copy a lossy codec
      // decoded: ChunkMeta::exact).
      if (f.chunks.size() == 1 && !f.chunks.front().lease.chunk()->meta.lossy) {
        snapshot.emplace(std::move(f.chunks.front()));
        snapshot_of = last;
      } else {
        s.state[last] = false;
        failed = true;
      }
    }
    if (!failed) break;
    // A failure is no longer held, so the rule chooses a shorter prefix
    // each time round; should it not, nothing is served.
    const size_t before = last;
    b = RulePrefix(m, s, &last);
    if (last != kNone && last >= before) {
      last = kNone;
      b = 0;
    }
  }
  // Write the prefix: each group's chunks it needs, then the snapshot.
  Fetch served;
  std::uint64_t bytes = 0;
  for (size_t g = 0; g < m.groups.size() && last != kNone; ++g) {
    std::vector<std::vector<void*>> bases;
    const std::vector<KvGroup> sub = Select(views, m.groups[g].kv, m.groups[g].layers, bases);
    // A sliding layer gets its window's tokens only: nothing older is
    // written (a partial chunk holds zeros there).
    const std::uint64_t lo = WindowStart(m.groups[g], b);
    for (size_t j : Needed(m.groups[g], s.ranges, last)) {
      FetchedChunk& c = got[g].at(j).second;
      const std::uint8_t* payload = c.lease.chunk()->payload.data();
      if (c.begin < lo) {
        const std::vector<std::uint8_t> window = SliceTokens(m.groups[g].kv, payload, c.tokens, lo - c.begin,
                                                             c.begin + c.tokens - lo);
        ScatterGroups(m.groups[g].kv, sub, window.data(), lo, c.begin + c.tokens - lo);
      } else {
        ScatterGroups(m.groups[g].kv, sub, payload, c.begin, c.tokens);
      }
      bytes += c.lease.chunk()->payload.size();
      out.lossy = out.lossy || c.lease.chunk()->meta.lossy;
      served.chunks.push_back(std::move(c));
    }
  }
  if (last != kNone && m.state_layers > 0) {
    const std::uint8_t* p = snapshot->lease.chunk()->payload.data();
    for (std::uint32_t l = 0; l < m.state_layers; ++l) {
      std::memcpy(state[l], p + l * m.state_bytes, static_cast<size_t>(m.state_bytes));
    }
    bytes += m.state_layers * m.state_bytes;
  }
  out.tokens = b;
  served.covered = out.covered;
  store.CountLoad(m.model, ns, served, keys.size(), b, bytes, ElapsedMicros(t0));
  return out;
}

}  // namespace kdn::store
