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
#include "core/knowledge/knowledge.h"
#include "core/engine/kv_views.h"

namespace kdn::blend {

// One piece of the context: a document by id, or tokens computed now.
struct Segment {
  bool document = false;
  std::string doc_id;                // document
  std::vector<std::int32_t> tokens;  // tokens
};

// Composes the segments, in order, into `views` (which must hold the whole
// context). Views in device memory get the composed KV through the store's
// device (KvStore::ScatterToDevice; kUnsupported without one): the keys are
// re-positioned and the selected tokens recomputed on the host. kNotFound when a document is unknown or lost from every tier;
// the engine's status when it fails.
Result<BlendReport> BlendDocuments(store::KnowledgeIndex& index, const store::ModelKv& model, std::string_view ns,
                                   std::span<const Segment> segments, const BlendOptions& options,
                                   LayerEngine& engine, std::span<const store::ViewSpec> views);

}  // namespace kdn::blend
