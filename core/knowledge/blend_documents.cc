// SPDX-License-Identifier: Apache-2.0
#include "core/knowledge/blend_documents.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "core/keys/hash.h"
#include "core/knowledge/device_compose.h"
#include "core/util/dtype.h"

namespace kdn::blend {

Result<BlendReport> BlendDocuments(store::KnowledgeIndex& index, const store::ModelKv& model, std::string_view ns,
                                   std::span<const Segment> segments, const BlendOptions& options,
                                   LayerEngine& engine, std::span<const store::ViewSpec> views,
                                   const BlendGate* gate) {
  if (segments.empty()) return Status::InvalidArgument("blend: no segments");
  // A document's length is known only under the snapshot read below (a put
  // may replace it with a longer version meanwhile): with documents, the
  // views must state their room, and a context longer than it is
  // kBufferTooSmall with nothing written, as a fetch says.
  bool documents = false;
  for (const Segment& s : segments) documents = documents || (s.document && !s.slice);
  std::uint64_t room = UINT64_MAX;
  if (documents) {
    auto stated = store::ResolvedViews::Resolve(model, views, std::nullopt);
    if (!stated.ok()) return stated.status();
    room = stated->room();
  }
  const auto L = static_cast<size_t>(model.shape.layers);
  const auto row = static_cast<size_t>(model.shape.heads * model.shape.head_dim);
  const auto eb = static_cast<size_t>(model.shape.elem_bytes);
  // A document read whole, under one snapshot: the chunks arrive in order,
  // each scattered into the piece's float KV ([layer][k|v][token][row]).
  auto read = [&](const std::string& doc_id, Piece* p) {
    const store::KnowledgeIndex::ScatterFn scatter = [&](const std::uint8_t* chunk, std::uint64_t begin,
                                                         std::uint64_t len) {
      const size_t T = p->tokens.size();
      if (p->kv.empty()) p->kv.resize(L * 2 * T * row);
      for (size_t l = 0; l < L; ++l) {
        for (size_t kv = 0; kv < 2; ++kv) {
          const std::uint8_t* src = chunk + ((l * 2 + kv) * len) * row * eb;
          float* dst = p->kv.data() + ((l * 2 + kv) * T + begin) * row;
          ToFloat(model.dtype, src, len * row, dst);
        }
      }
    };
    return index.FetchScattered(model, ns, doc_id, scatter, &p->tokens);
  };
  // Documents that slices come from, each read once (empty: gone or unreadable).
  std::map<std::string, Piece> whole;
  std::vector<Piece> pieces;
  std::uint64_t total = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    Piece p;
    if (!s.document) {
      p.tokens = s.tokens;
    } else if (!s.slice) {
      KDN_RETURN_IF_ERROR(read(s.doc_id, &p));
    } else {
      auto it = whole.find(s.doc_id);
      if (it == whole.end()) {
        Piece doc;
        const Status st = read(s.doc_id, &doc);
        if (!st.ok() && st.code() != Code::kNotFound) return st;
        if (!st.ok()) doc = Piece{};
        it = whole.emplace(s.doc_id, std::move(doc)).first;
      }
      const Piece& doc = it->second;
      const size_t n = s.tokens.size(), T = doc.tokens.size();
      p.tokens = s.tokens;
      // The document as it is now must still hold the matched tokens there;
      // otherwise (replaced, deleted since the match) they are computed now.
      if (s.doc_begin <= T && n <= T - s.doc_begin && !doc.kv.empty() &&
          std::equal(s.tokens.begin(), s.tokens.end(), doc.tokens.begin() + static_cast<std::ptrdiff_t>(s.doc_begin))) {
        p.kv.resize(L * 2 * n * row);
        for (size_t lk = 0; lk < L * 2; ++lk) {
          std::memcpy(p.kv.data() + lk * n * row, doc.kv.data() + (lk * T + s.doc_begin) * row, n * row * sizeof(float));
        }
        p.cached_first = static_cast<std::int64_t>(s.doc_begin);
      }
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
  // The gate: a method this model was not measured with, or measured above
  // the bound, is refused; the context is then recomputed whole (exact).
  BlendOptions run = options;
  bool gated = false;
  double gate_kl = -1;
  if (gate != nullptr) {
    const GateRecord* r = FindGate(gate->records, keys::ToHex(model.fingerprint), options, shape.layers,
                                   options.kv_pass && engine.has_kv_pass());
    gate_kl = r != nullptr ? r->kl_ratio : -1;
    if (r == nullptr || r->kl_ratio > gate->max_kl_ratio) {
      gated = true;
      run.ratio = 1;
      run.threshold = -1;
    }
  }
  if (engine.on_device()) {
    // Composed where the engine's layers run; converted to the model's
    // dtype and scattered into the views there: nothing of the composed KV
    // crosses to the host.
    store::Device* dev = index.store().device();
    if (!out->device() || dev == nullptr) {
      return Status::InvalidArgument("blend: an engine on the device needs views in device memory");
    }
    chunk::Payload kv;
    auto report = ComposeOnDevice(shape, pieces, run, engine, *dev, &kv);
    if (!report.ok()) return report.status();
    report->gated = gated;
    report->gate_kl_ratio = gate_kl;
    const size_t n = kv.size() / sizeof(float);
    Result<chunk::Payload> converted = dev->Allocate(n * eb);
    if (!converted.ok()) return converted.status();
    KDN_RETURN_IF_ERROR(dev->FromFloat(model.dtype, reinterpret_cast<const float*>(kv.data()),
                                       static_cast<std::int64_t>(n), converted->data()));
    KDN_RETURN_IF_ERROR(index.store().ScatterOnDevice(model, converted->data(), total, out->groups()));
    return report;
  }
  auto report = Compose(shape, pieces, run, engine, &composed);
  if (!report.ok()) return report.status();
  report->gated = gated;
  report->gate_kl_ratio = gate_kl;
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

std::vector<Segment> SegmentsOfTokens(ChunkMatcher& matcher, const store::ModelKv& model, std::string_view ns,
                                      std::span<const std::int32_t> tokens, std::uint64_t min_alone,
                                      std::vector<std::pair<std::uint64_t, std::uint64_t>>* cached) {
  const Matches found = matcher.Match(model, ns, tokens);
  std::vector<Segment> out;
  if (cached != nullptr) cached->clear();
  std::uint64_t at = 0;
  auto fresh = [&](std::uint64_t end) {
    if (end <= at) return;
    if (!out.empty() && !out.back().document) {
      out.back().tokens.insert(out.back().tokens.end(), tokens.begin() + static_cast<std::ptrdiff_t>(at),
                               tokens.begin() + static_cast<std::ptrdiff_t>(end));
    } else {
      Segment s;
      s.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(at), tokens.begin() + static_cast<std::ptrdiff_t>(end));
      out.push_back(std::move(s));
    }
    at = end;
  };
  for (const ChunkMatch& m : found.matches) {
    // The next chunk of the same document, right after the previous one (no
    // tokens between them): one slice.
    const bool extends = at == m.offset && !out.empty() && out.back().slice && out.back().doc_id == m.doc_id &&
                         out.back().doc_begin + out.back().tokens.size() == m.doc_begin;
    if (!extends && m.tokens < min_alone) continue;  // its tokens stay fresh
    fresh(m.offset);
    const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(m.offset);
    if (extends) {
      out.back().tokens.insert(out.back().tokens.end(), first, first + static_cast<std::ptrdiff_t>(m.tokens));
      if (cached != nullptr) cached->back().second = m.offset + m.tokens;
    } else {
      Segment s;
      s.document = true;
      s.slice = true;
      s.doc_id = m.doc_id;
      s.doc_begin = m.doc_begin;
      s.tokens.assign(first, first + static_cast<std::ptrdiff_t>(m.tokens));
      out.push_back(std::move(s));
      if (cached != nullptr) cached->emplace_back(m.offset, m.offset + m.tokens);
    }
    at = m.offset + m.tokens;
  }
  fresh(tokens.size());
  return out;
}

}  // namespace kdn::blend
