// SPDX-License-Identifier: Apache-2.0
#include "core/knowledge/blend_documents.h"

#include <cstring>
#include <optional>
#include <string>

#include "core/util/dtype.h"

namespace kdn::blend {

Result<BlendReport> BlendDocuments(store::KnowledgeIndex& index, const store::ModelKv& model, std::string_view ns,
                                   std::span<const Segment> segments, const BlendOptions& options,
                                   LayerEngine& engine, std::span<const store::ViewSpec> views) {
  if (segments.empty()) return Status::InvalidArgument("blend: no segments");
  // A document's length is known only under the snapshot read below (a put
  // may replace it with a longer version meanwhile): with documents, the
  // views must state their room, and a context longer than it is
  // kBufferTooSmall with nothing written, as a fetch says.
  bool documents = false;
  for (const Segment& s : segments) documents = documents || s.document;
  std::uint64_t room = UINT64_MAX;
  if (documents) {
    auto stated = store::ResolvedViews::Resolve(model, views, std::nullopt);
    if (!stated.ok()) return stated.status();
    room = stated->room();
  }
  const auto L = static_cast<size_t>(model.shape.layers);
  const auto row = static_cast<size_t>(model.shape.heads * model.shape.head_dim);
  const auto eb = static_cast<size_t>(model.shape.elem_bytes);
  std::vector<Piece> pieces;
  std::uint64_t total = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    Piece p;
    if (!s.document) {
      p.tokens = s.tokens;
    } else {
      // One snapshot: the chunks arrive in order, each scattered into the
      // piece's float KV ([layer][k|v][token][row]) as it is read.
      const store::KnowledgeIndex::ScatterFn scatter = [&](const std::uint8_t* chunk, std::uint64_t begin,
                                                           std::uint64_t len) {
        const size_t T = p.tokens.size();
        if (p.kv.empty()) p.kv.resize(L * 2 * T * row);
        for (size_t l = 0; l < L; ++l) {
          for (size_t kv = 0; kv < 2; ++kv) {
            const std::uint8_t* src = chunk + ((l * 2 + kv) * len) * row * eb;
            float* dst = p.kv.data() + ((l * 2 + kv) * T + begin) * row;
            ToFloat(model.dtype, src, len * row, dst);
          }
        }
      };
      KDN_RETURN_IF_ERROR(index.FetchScattered(model, ns, s.doc_id, scatter, &p.tokens));
    }
    total += p.tokens.size();
    pieces.push_back(std::move(p));
  }
  if (total == 0) return Status::InvalidArgument("blend: the segments hold no tokens");
  if (total > (std::uint64_t{1} << 31)) return Status::InvalidArgument("blend: more than 2^31 positions");
  if (total > room) {
    return Status(Code::kBufferTooSmall, "blend: the context is " + std::to_string(total) +
                                             " tokens (its documents as they are now); the views have room for " +
                                             std::to_string(room));
  }
  auto out = store::ResolvedViews::Resolve(model, views, total);
  if (!out.ok()) return out.status();
  std::vector<float> composed;
  const ModelShape shape{static_cast<int>(L), static_cast<int>(model.shape.heads), static_cast<int>(model.shape.head_dim)};
  auto report = Compose(shape, pieces, options, engine, &composed);
  if (!report.ok()) return report.status();
  std::vector<std::uint8_t> canonical(composed.size() * eb);
  FromFloat(model.dtype, composed.data(), composed.size(), canonical.data());
  if (out->device()) {
    // Composed on the host (the engine's layers run there); one copy to the
    // device, scattered into the views by the device.
    KDN_RETURN_IF_ERROR(index.store().ScatterToDevice(model, canonical.data(), total, out->groups()));
  } else {
    out->Scatter(model, canonical.data(), 0, total);
  }
  return report;
}

}  // namespace kdn::blend
