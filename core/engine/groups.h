// SPDX-License-Identifier: Apache-2.0
// Models whose layers do not all cache the same way (docs/model-kinds.md):
// full-attention layers need every token's KV, sliding-window layers only
// the last W tokens', recurrent layers (Mamba, linear attention) a
// fixed-size state per layer instead of per-token KV. Such a model is kept
// in groups, each stored apart: the attention layers of one window (0:
// full) as chunks of a model of their own (its fingerprint derived from the
// model's), keyed by the model's chunk chain; the recurrent layers' state as
// a snapshot at a chunk boundary, keyed by the chain's key there and stored
// exact (no lossy codec: ChunkMeta::exact).
//
// A store of n tokens reads a sliding group's layers only in their window
// [n - W, n) (an engine drops older tokens): its chunks before the window
// are not stored, and the one the window starts inside is stored as a
// partial chunk keyed by n (GroupPartialKey), which serves the prefix n.
//
// The one rule for hits: a prefix of b tokens counts only when every group
// has what it needs for it: the full groups every chunk of [0, b), each
// sliding group the chunks overlapping [b - W, b), the recurrent layers the
// snapshot at b (b = 0 needs nothing). Lookups report that prefix, and a
// retrieve loads exactly that (a sliding group's older chunks neither
// required nor read) or writes nothing past it: a missing group shortens
// the prefix, never returns part of one.
// Thread-safety: GroupedModel is immutable once made; the calls are as
// thread-safe as the KvStore's.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/engine/kv_store.h"

namespace kdn::store {

// The attention layers of one window, as a model of their own.
struct LayerGroup {
  ModelKv kv;                         // its shape (layers = layers.size()); fingerprint derived
  std::vector<std::uint32_t> layers;  // the model's attention layers it holds, ascending
  std::uint32_t window = 0;           // 0: full attention; W: the last W tokens
};

struct GroupedModel {
  ModelKv model;                   // every attention layer; its fingerprint keys the chunk chain
  std::vector<LayerGroup> groups;  // the full group first (when there is one), then windows ascending
  std::uint32_t state_layers = 0;  // recurrent layers
  std::uint64_t state_bytes = 0;   // bytes of one recurrent layer's state
  ModelKv state;                   // a snapshot's shape: state_layers x state_bytes as one "token"

  // `windows`: one per attention layer (0: full), or empty (all full).
  // kInvalidArgument for a window count that does not match, or a state
  // whose size is not a positive multiple of 4 bytes.
  static Result<GroupedModel> Make(const ModelKv& model, std::span<const std::uint32_t> windows,
                                   std::uint32_t state_layers, std::uint64_t state_bytes);
  // Whether the model needs groups at all (a sliding window or recurrent
  // layers): a model of full-attention layers alone is kept as one.
  static bool Needed(std::span<const std::uint32_t> windows, std::uint32_t state_layers);
};

// The key of a group's object for the chunk whose chain key (the model's
// own, keys::ChunkKey) is `chain`, and of the recurrent layers' snapshot at
// that chunk's end: what tools and tests name a stored piece by.
keys::Digest GroupChunkKey(const LayerGroup& group, const keys::Digest& chain);
// A sliding group's chunk whose window starts inside it, stored by a
// request that ended at `end`: the window's tokens [end - W, ...) only (the
// older ones zero: the engine may no longer hold them). It serves the
// prefix ending at `end` only.
keys::Digest GroupPartialKey(const LayerGroup& group, const keys::Digest& chain, std::uint64_t end);
keys::Digest StateSnapshotKey(const GroupedModel& model, const keys::Digest& chain);

// The leading tokens for which every group has what it needs (the rule
// above), and per tier (LookupResult::tier_tokens) the prefix the rule
// gives with what that tier alone holds.
LookupResult GroupedLookup(KvStore& store, const GroupedModel& model, std::string_view ns, const TokenKeys& keys);

// `views`: KV groups over model.model's layers (each layer once: a
// ResolvedViews' groups, or an op's), in host memory.

// Stores every group's chunks of the request (those not held yet) from
// `views`, and, with `state` (one pointer
// per recurrent layer: its state after all of the request's tokens), the
// snapshot at the request's end. Returns the prefix the rule gives after it.
Result<std::uint64_t> GroupedStore(KvStore& store, const GroupedModel& model, std::string_view ns, const TokenKeys& keys,
                                   std::span<const KvGroup> views, std::span<void* const> state);

// Writes the prefix the rule gives into `views` (each group's chunks it
// needs, nothing older) and the snapshot at its end into `state` (required
// when the model has recurrent layers: kInvalidArgument without). A chunk
// or snapshot that fails to read shortens the prefix to one the rest
// serves; nothing past the prefix returned is written. covered: the prefix
// the lookup found.
Result<KvStore::Retrieved> GroupedRetrieve(KvStore& store, const GroupedModel& model, std::string_view ns,
                                           const TokenKeys& keys, std::span<const KvGroup> views,
                                           std::span<void* const> state);

}  // namespace kdn::store
