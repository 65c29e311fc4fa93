// SPDX-License-Identifier: Apache-2.0
// Blending of knowledge items: the orchestration every front end needs
// (the C ABI's kdn_kv_blend, kdnd): documents are read from the knowledge
// index, each under one snapshot, converted to float, composed by Compose
// (blend/blend.h) through the engine's layers, and the composed KV is
// written into the caller's views in the model's dtype.
// Thread-safety: reentrant; the engine is called from the calling thread.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/blend/blend.h"
#include "core/blend/gate.h"
#include "core/knowledge/match.h"
#include "core/knowledge/knowledge.h"
#include "core/engine/kv_views.h"

namespace kdn::blend {

// One piece of the context: a document by id, or tokens computed now, or
// (found by matching) a slice of a document: its tokens [doc_begin,
// doc_begin + tokens.size()), which must still be `tokens` when it is read
// (else they are computed now, as fresh ones).
struct Segment {
  bool document = false;
  std::string doc_id;                // document, slice
  std::vector<std::int32_t> tokens;  // tokens; a slice's expected tokens
  bool slice = false;
  std::uint64_t doc_begin = 0;       // slice
};

// A context given as tokens, as segments: the chunks of the scope's
// knowledge items that `matcher` finds in it become slices (consecutive
// chunks of one document, adjacent in the context, one slice), the rest
// token segments. A chunk match shorter than `min_alone` tokens (a
// document's short last chunk) is taken only right after its document's
// previous chunk: alone, a few tokens recur in text by chance, and their KV,
// computed after the rest of their document, would be placed where that
// document is not. `cached` gets the slices' [begin, end) in the context.
std::vector<Segment> SegmentsOfTokens(ChunkMatcher& matcher, const store::ModelKv& model, std::string_view ns,
                                      std::span<const std::int32_t> tokens, std::uint64_t min_alone,
                                      std::vector<std::pair<std::uint64_t, std::uint64_t>>* cached = nullptr);

// Composes the segments, in order, into `views` (which must hold the whole
// context). Views in device memory get the composed KV through the store's
// device (kUnsupported without one): with an engine on the host, composed
// there and copied over (KvStore::ScatterToDevice); with an engine on the
// device (LayerEngine::on_device, which needs device views), composed there
// (ComposeOnDevice: keys re-positioned by the device's kernels), converted
// to the model's dtype and scattered into the views on the device. kNotFound when a document is unknown or lost from every
// tier (a slice's document: its tokens are computed instead, as when they changed);
// the engine's status when it fails.
// An accuracy gate (blend/gate.h): the measured records and the bound on
// KL(blend) / KL(naive) above which a method is refused.
struct BlendGate {
  std::vector<GateRecord> records;
  double max_kl_ratio = 0.2;
};

// With `gate`, the method `options` resolve to runs only when the gate holds
// this model's record for it at or below the bound; otherwise every
// position is recomputed (full prefill) and the report says `gated`.
Result<BlendReport> BlendDocuments(store::KnowledgeIndex& index, const store::ModelKv& model, std::string_view ns,
                                   std::span<const Segment> segments, const BlendOptions& options,
                                   LayerEngine& engine, std::span<const store::ViewSpec> views,
                                   const BlendGate* gate = nullptr);

}  // namespace kdn::blend
