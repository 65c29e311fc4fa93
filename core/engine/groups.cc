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
  std::vector<std::vector<bool>> held;      // [group][range]
  std::vector<bool> state;                  // [range]: the snapshot at its end
};

std::uint64_t EndOf(const KvStore::KeyedRange& r) { return r.begin + r.len; }

// Which group holds what of the ranges `s` has, by `holds` (a key held in
// any tier, or in one).
template <typename Holds>
void FillHeld(const GroupedModel& m, Scan& s, const Holds& holds) {
  const size_t n = s.ranges.size();
  s.held.assign(m.groups.size(), std::vector<bool>(n, false));
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
    if (m.groups[g].window == 0) continue;
    for (size_t i = 0; i < run; ++i) s.held[g][i] = holds(GroupKey(m.groups[g], s.ranges[i].key));
  }
  if (m.state_layers > 0) {
    for (size_t i = 0; i < run; ++i) s.state[i] = holds(StateKey(m, s.ranges[i].key));
  }
}

Scan ScanRequest(KvStore& store, const GroupedModel& m, std::string_view ns, const TokenKeys& keys) {
  Scan s;
  s.ranges = store.ChainKeys(m.model, ns, keys, [&](const keys::Digest& key, std::uint64_t, std::uint64_t) {
    for (const LayerGroup& g : m.groups) {
      if (store.Holds(ns, GroupKey(g, key))) return true;
    }
    return m.state_layers > 0 && store.Holds(ns, StateKey(m, key));
  });
  FillHeld(m, s, [&](const keys::Digest& key) { return store.Holds(ns, key); });
  return s;
}

// The ranges a group needs for the prefix ending with range `last`.
std::vector<size_t> Needed(const LayerGroup& g, const Scan& s, size_t last) {
  std::vector<size_t> out;
  if (last == kNone) return out;
  const std::uint64_t b = EndOf(s.ranges[last]);
  const std::uint64_t lo = g.window == 0 || b <= g.window ? 0 : b - g.window;
  for (size_t j = 0; j <= last; ++j) {
    if (EndOf(s.ranges[j]) > lo) out.push_back(j);
  }
  return out;
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
      for (size_t j : Needed(m.groups[g], s, i)) ok = ok && s.held[g][j];
    }
    if (ok) {
      *last = i;
      return EndOf(s.ranges[i]);
    }
  }
  *last = kNone;
  return 0;
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
  // ChunkValue). A sliding group's chunks that end W or more tokens before
  // the request's end are not read: the engine need not hold them any more
  // (llama.cpp's SWA cache and vLLM's sliding-window blocks drop them), and
  // only shorter prefixes would use them, which the stores at those
  // boundaries keep. A retrieve of the whole request does not read the ones
  // stored earlier either, so they age: the first to go for LRU and FIFO.
  const std::uint64_t n = keys.size();
  double work = 0;
  for (const KvStore::KeyedRange& r : ranges) work += PrefillCost(static_cast<std::int64_t>(r.begin), r.len);
  const double mean = n > 0 ? work / static_cast<double>(n) : 0;
  bool full = false;  // a put no tier took: what is held stays, and the rule says what prefix that leaves
  for (const LayerGroup& g : m.groups) {
    std::vector<std::vector<void*>> bases;
    const std::vector<KvGroup> sub = Select(views, g.kv, g.layers, bases);
    const auto per_token = static_cast<std::uint64_t>(g.kv.bytes_per_token());
    for (size_t i = 0; i < ranges.size() && !full; ++i) {
      const KvStore::KeyedRange& r = ranges[i];
      if (g.window != 0 && EndOf(r) + g.window <= n) continue;  // behind the window
      const keys::Digest key = GroupKey(g, r.key);
      if (store.Holds(ns, key)) continue;
      Payload payload = Payload::Uninitialized(static_cast<size_t>(r.len * per_token));
      GatherGroups(g.kv, sub, r.begin, r.len, payload.data());
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
    if (store.Holds(ns, key)) {
      std::vector<keys::Digest> ends;
      for (const LayerGroup& g : m.groups) ends.push_back(GroupKey(g, ranges.back().key));
      store.chain().Tie(key, ends);
    }
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
  // What has been read, per group and range; the snapshot read for `last`.
  std::vector<std::map<size_t, FetchedChunk>> got(m.groups.size());
  std::optional<FetchedChunk> snapshot;
  size_t snapshot_of = kNone;
  // Read what the prefix needs; a chunk or snapshot that fails to read is
  // no longer held, and the rule chooses again (a shorter prefix, whose
  // sliding windows may need older chunks).
  while (last != kNone) {
    bool failed = false;
    for (size_t g = 0; g < m.groups.size(); ++g) {
      std::vector<KvStore::KeyedRange> want;
      for (size_t j : Needed(m.groups[g], s, last)) {
        if (got[g].count(j) == 0) want.push_back({GroupKey(m.groups[g], s.ranges[j].key), s.ranges[j].begin, s.ranges[j].len});
      }
      if (want.empty()) continue;
      Fetch f = store.FetchKeys(m.groups[g].kv, ns, want);
      for (FetchedChunk& c : f.chunks) got[g].emplace(index.at(c.begin), std::move(c));
      for (const TokenRange& bad : f.failed) {
        for (auto it = index.lower_bound(bad.begin); it != index.end() && it->first < bad.end; ++it) {
          s.held[g][it->second] = false;
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
    for (size_t j : Needed(m.groups[g], s, last)) {
      FetchedChunk& c = got[g].at(j);
      ScatterGroups(m.groups[g].kv, sub, c.lease.chunk()->payload.data(), c.begin, c.tokens);
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
