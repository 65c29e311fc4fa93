// SPDX-License-Identifier: Apache-2.0
// The C ABI: kdn_kv_blend (experimental).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <deque>
#include <optional>

#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

static_assert(offsetof(kdn_blend_options, kv_fn) == KDN_BLEND_OPTIONS_SIZE_V1, "1.8's kdn_blend_options ends at kv_fn");
static_assert(offsetof(kdn_blend_report, anchored) == KDN_BLEND_REPORT_SIZE_V1, "1.8's kdn_blend_report ends there");

/* ---- blending (experimental) ---- */

namespace {

// The caller's callback as the blender's engine.
class CallbackEngine final : public kdn::blend::LayerEngine {
 public:
  CallbackEngine(const kdn_blend_options& o, int kv_dim) : o_(o), kv_dim_(kv_dim) {}
  kdn::Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                    float* k_layer, float* v_layer, int total) override {
    return Call(o_.layer_fn, "blend callback", layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  kdn::Status KvPass(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                     float* k_layer, float* v_layer, int total) override {
    return Call(o_.kv_fn, "KV pass (kv_fn)", layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  bool has_kv_pass() const override { return o_.kv_fn != nullptr; }
  double kv_pass_cost(int) const override { return o_.kv_cost; }
  int hidden_dim() const override { return static_cast<int>(o_.hidden_dim); }
  bool on_device() const override { return (o_.flags & KDN_BLEND_ENGINE_ON_DEVICE) != 0; }

 private:
  kdn::Status Call(kdn_blend_layer_fn fn, const char* what, int layer, std::span<const int> positions,
                   std::span<const int> tokens, float* hidden, float* k_layer, float* v_layer, int total) {
    std::vector<int32_t> ids(tokens.begin(), tokens.end());
    std::vector<int32_t> pos(positions.begin(), positions.end());
    const size_t count = positions.size();
    const kdn_status st =
        fn(o_.user, static_cast<uint32_t>(layer), pos.data(), layer == 0 ? ids.data() : nullptr, count, hidden,
           count * o_.hidden_dim, o_.hidden_dim, k_layer, v_layer,
           static_cast<size_t>(total) * static_cast<size_t>(kv_dim_), static_cast<size_t>(total));
    if (st == KDN_OK) return kdn::Status::Ok();
    if (st > 0 || st < KDN_ERR_BUFFER_TOO_SMALL) {
      return kdn::Status::Internal(std::string("the ") + what + " returned an unknown status " + std::to_string(st) +
                                   " at layer " + std::to_string(layer));
    }
    return kdn::Status(static_cast<kdn::Code>(st), std::string("the ") + what + " failed at layer " +
                                                       std::to_string(layer) + " (" + kdn_status_string(st) + ")");
  }

  const kdn_blend_options& o_;
  int kv_dim_;
};

}  // namespace

namespace {

// Reads and checks the caller's options into `out` (the caller's struct as
// this library reads it) and the blender's.
kdn_status ReadBlendOptions(const kdn_model* model, const kdn_blend_options* options, kdn_blend_options* out,
                            kdn::blend::BlendOptions* out_bo) {
  kdn_blend_options& o = *out;
  kdn::blend::BlendOptions& bo = *out_bo;
  if (options == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options are NULL (they carry the callback)");
  if (kdn_status s = ReadIn(options, KDN_BLEND_OPTIONS_SIZE_V1, "kdn_blend_options", &o); s != KDN_OK) return s;
  if (o.layer_fn == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: layer_fn is NULL");
  if (o.hidden_dim == 0 || o.hidden_dim > (1u << 20)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: hidden_dim must be 1..2^20");
  }
  if (o.kv_fn != nullptr && !(o.kv_cost > 0.0f && o.kv_cost <= 1.0f)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT,
                "blend options: with kv_fn, kv_cost (its work per position over a whole layer's) must be in (0, 1]");
  }
  if (o.first_tokens > (1u << 30)) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: first_tokens too large");
  if ((o.flags & ~KDN_BLEND_ENGINE_ON_DEVICE) != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: unknown flags " + std::to_string(o.flags));
  }
  if (o.gate_file == nullptr && o.gate_file_len != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: gate_file is NULL with gate_file_len > 0");
  }
  if (o.gate_file != nullptr && !(o.max_kl_ratio >= 0.0f && std::isfinite(o.max_kl_ratio))) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: max_kl_ratio must be a number >= 0");
  }
  const int layers = static_cast<int>(model->kv.shape.layers);
  const bool by_pass = o.kv_fn != nullptr;
  // Ratio -1 asks for the default of the method (kdn.h); other values
  // outside [0, 1] are refused by the blender.
  bo.ratio = o.ratio == -1.0f ? (by_pass ? kdn::blend::kDefaultRatio : kdn::blend::kDefaultRatioWholeChecks) : o.ratio;
  bo.threshold = o.threshold;
  bo.kv_pass = by_pass;
  bo.first_tokens = static_cast<int>(o.first_tokens);
  if (o.check_layers != nullptr) {
    if (o.num_check_layers > static_cast<size_t>(layers)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: more check layers than model layers");
    }
    bo.check_layers.assign(o.check_layers, o.check_layers + o.num_check_layers);
  } else if (o.num_check_layers != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: check_layers is NULL with num_check_layers > 0");
  } else if (!by_pass) {
    bo.check_layers = {layers > 1 ? 1 : 0};  // CacheBlend's
  }  // else empty: the library's default (kdn::blend::CheckLayersFor)
  bo.rope = model->rope;
  bo.latent = model->latent_dim != 0;
  if (bo.latent && (o.flags & KDN_BLEND_ENGINE_ON_DEVICE) != 0) {
    return Fail(KDN_ERR_UNSUPPORTED, "blend options: a latent (MLA) model's engine runs on the host "
                                     "(KDN_BLEND_ENGINE_ON_DEVICE is not supported for it)");
  }
  const int32_t scaling = Raw(o.rope_scaling);
  if (scaling != KDN_ROPE_SCALING_NONE && scaling != KDN_ROPE_SCALING_LINEAR && scaling != KDN_ROPE_SCALING_NTK) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: unknown rope_scaling " + std::to_string(scaling));
  }
  bo.rope.scaling = static_cast<kdn::kernels::RopeScaling>(scaling);
  bo.rope.factor = o.rope_factor;
  return KDN_OK;
}

// A chunk match alone must hold at least a matching window (16 tokens), or
// a whole chunk where chunks are shorter (kdn.h, kdn_kv_match).
std::uint64_t MinAlone(const kdn_model& model) {
  return std::min<std::uint64_t>(kdn::blend::MatcherOptions{}.window, model.runtime->store().options().chunk_tokens);
}

// What every blend call does first: the report at its defaults until the
// blend succeeds (the rule at the top of kdn.h), the target and the options.
kdn_status BeginBlend(const kdn_model* model, const char* ns, size_t ns_len, const kdn_blend_options* options,
                      kdn_blend_report* report, kdn_blend_options* o, kdn::blend::BlendOptions* bo) {
  if (report != nullptr) {
    if (kdn_status s = CheckOut(report, KDN_BLEND_REPORT_SIZE_V1, "kdn_blend_report"); s != KDN_OK) return s;
    ResetOut(kdn_blend_report(KDN_BLEND_REPORT_INIT), report);
  }
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (model->latent_dim != 0 && model->rope.head_dim > static_cast<int>(model->latent_dim / 2)) {
    // Re-positioned within the half kept as V (blend.h, BlendOptions::latent).
    return Fail(KDN_ERR_UNSUPPORTED, "blending a latent (MLA) model whose RoPE dims (latent_rope_dim " +
                                         std::to_string(model->rope.head_dim) + ") exceed half its latent_dim (" +
                                         std::to_string(model->latent_dim) + ") is not supported");
  }
  if (model->grouped) {
    // A recurrent layer's state cannot be composed from pieces, and a
    // sliding window's selection is not built (docs/model-kinds.md).
    return Fail(KDN_ERR_UNSUPPORTED, "blending a model with sliding-window or recurrent layers is not supported yet");
  }
  return ReadBlendOptions(model, options, o, bo);
}

// Blends the segments into the views and fills the report.
kdn_status RunBlend(const kdn_model* model, const char* ns, size_t ns_len, const kdn_blend_options& o,
                    const kdn::blend::BlendOptions& bo, std::span<const kdn::blend::Segment> segs,
                    const kdn_kv_view* views, size_t num_views, kdn_blend_report* report) {
  const int layers = static_cast<int>(model->kv.shape.layers);
  if (num_views == 0 || views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no KV views");
  std::vector<ViewSpec> specs;
  std::deque<std::vector<void*>> latent_v;  // a latent model's V bases (calls.h, LatentView)
  if (kdn_status s = ReadViews(model, views, num_views, &specs, &latent_v); s != KDN_OK) return s;
  for (const ViewSpec& v : specs) {
    if (v.memory == KDN_MEMORY_DEVICE && model->runtime->store().device() == nullptr) {
      return Fail(KDN_ERR_UNSUPPORTED, "kdn_kv_blend: KV views in device memory: this runtime has no device");
    }
    if ((o.flags & KDN_BLEND_ENGINE_ON_DEVICE) != 0 && v.memory != KDN_MEMORY_DEVICE) {
      return Fail(KDN_ERR_INVALID_ARGUMENT,
                  "kdn_kv_blend: KDN_BLEND_ENGINE_ON_DEVICE needs every view in device memory (KDN_MEMORY_DEVICE)");
    }
  }
  std::optional<kdn::blend::BlendGate> gate;
  if (o.gate_file != nullptr) {
    auto records = kdn::blend::ReadGate(std::string(o.gate_file, o.gate_file_len));
    if (!records.ok()) return Fail(KDN_ERR_INVALID_ARGUMENT, records.status().message());
    gate = kdn::blend::BlendGate{std::move(records).value(), o.max_kl_ratio};
  }
  // A latent model's callback sees each position's latent whole (kdn.h).
  const bool latent = model->latent_dim != 0;
  CallbackEngine callback(o, latent ? static_cast<int>(model->latent_dim)
                                    : static_cast<int>(model->kv.shape.heads * model->kv.shape.head_dim));
  kdn::blend::LatentLayers latent_engine(callback, static_cast<int>(model->latent_dim));
  kdn::blend::LayerEngine& engine = latent ? static_cast<kdn::blend::LayerEngine&>(latent_engine) : callback;
  auto r = kdn::blend::BlendDocuments(model->runtime->knowledge(), model->kv, std::string_view(ns, ns_len), segs, bo,
                                      engine, specs, gate ? &*gate : nullptr);
  if (!r.ok()) return FromStatus(r.status());
  // The prefill the blend saved: the context's positions x the share of
  // the layer x position work not recomputed (kdn_stats.ttft_saved_ns).
  model->runtime->store().CountBlendSaving(model->kv,
                                           static_cast<double>(r->positions) * (1.0 - r->recompute_fraction));
  if (report != nullptr) {
    kdn_blend_report full = KDN_BLEND_REPORT_INIT;
    full.positions = static_cast<uint32_t>(r->positions);
    full.cached_positions = static_cast<uint32_t>(r->cached_positions);
    full.fresh_positions = static_cast<uint32_t>(r->fresh_positions);
    full.selected = static_cast<uint32_t>(r->selected);
    full.recompute_fraction = r->recompute_fraction;
    full.anchored = static_cast<uint32_t>(r->anchored);
    for (int n : r->kv_pass_per_layer) full.kv_passes += static_cast<uint32_t>(n);
    full.ratio = static_cast<float>(bo.ratio);
    full.num_check_layers = static_cast<uint32_t>(kdn::blend::CheckLayersFor(bo, layers).size());
    full.gated = r->gated ? 1u : 0u;
    full.gate_kl_ratio = static_cast<float>(r->gate_kl_ratio);
    WriteOut(full, report);
  }
  return KDN_OK;
}

}  // namespace

extern "C" kdn_status kdn_kv_blend(const kdn_model* model, const char* ns, size_t ns_len,
                                   const kdn_blend_segment* segments, size_t num_segments,
                                   const kdn_blend_options* options, const kdn_kv_view* views, size_t num_views,
                                   kdn_blend_report* report) {
  KDN_BEGIN
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  kdn::blend::BlendOptions bo;
  if (kdn_status s = BeginBlend(model, ns, ns_len, options, report, &o, &bo); s != KDN_OK) return s;
  if (num_segments == 0 || segments == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no segments");
  size_t stride = 0;
  if (kdn_status s = ArrayStride(segments, num_segments, sizeof(kdn_blend_segment), "segments", &stride); s != KDN_OK) {
    return s;
  }
  std::vector<kdn::blend::Segment> segs;
  for (size_t i = 0; i < num_segments; ++i) {
    const std::string what = "segments[" + std::to_string(i) + "]";
    kdn_blend_segment seg = KDN_BLEND_SEGMENT_INIT;
    if (kdn_status s = ReadIn(At(segments, stride, i), sizeof(kdn_blend_segment), "kdn_blend_segment", &seg); s != KDN_OK) {
      return s;
    }
    kdn::blend::Segment out;
    if (Raw(seg.kind) == KDN_SEGMENT_TOKENS) {
      if (seg.num_tokens > 0) {
        if (kdn_status s = CheckTokens(seg.tokens, seg.num_tokens, what); s != KDN_OK) return s;
        out.tokens.assign(seg.tokens, seg.tokens + seg.num_tokens);
      }
    } else if (Raw(seg.kind) == KDN_SEGMENT_DOCUMENT) {
      if (kdn_status s = CheckDocId(seg.doc_id, seg.doc_id_len); s != KDN_OK) return s;
      out.document = true;
      out.doc_id.assign(seg.doc_id, seg.doc_id_len);
    } else {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown kind " + std::to_string(Raw(seg.kind)));
    }
    segs.push_back(std::move(out));
  }
  return RunBlend(model, ns, ns_len, o, bo, segs, views, num_views, report);
  KDN_END
}

extern "C" kdn_status kdn_kv_match(const kdn_model* model, const char* ns, size_t ns_len, const int32_t* tokens,
                                   size_t num_tokens, kdn_token_range* cached, size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (out_count != nullptr) *out_count = 0;
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && cached == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "cached is NULL");
  if (kdn_status s = CheckTokens(tokens, num_tokens, "kdn_kv_match"); s != KDN_OK) return s;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  (void)kdn::blend::SegmentsOfTokens(model->runtime->matcher(), model->kv, std::string_view(ns, ns_len),
                                     std::span<const int32_t>(tokens, num_tokens), MinAlone(*model), &ranges);
  *out_count = ranges.size();
  for (size_t i = 0; i < std::min(capacity, ranges.size()); ++i) cached[i] = {ranges[i].first, ranges[i].second};
  return KDN_OK;
  KDN_END
}

extern "C" kdn_status kdn_kv_blend_tokens(const kdn_model* model, const char* ns, size_t ns_len,
                                          const int32_t* tokens, size_t num_tokens, const kdn_blend_options* options,
                                          const kdn_kv_view* views, size_t num_views, kdn_blend_report* report) {
  KDN_BEGIN
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  kdn::blend::BlendOptions bo;
  if (kdn_status s = BeginBlend(model, ns, ns_len, options, report, &o, &bo); s != KDN_OK) return s;
  if (kdn_status s = CheckTokens(tokens, num_tokens, "kdn_kv_blend_tokens"); s != KDN_OK) return s;
  const std::vector<kdn::blend::Segment> segs = kdn::blend::SegmentsOfTokens(
      model->runtime->matcher(), model->kv, std::string_view(ns, ns_len), std::span<const int32_t>(tokens, num_tokens),
      MinAlone(*model));
  return RunBlend(model, ns, ns_len, o, bo, segs, views, num_views, report);
  KDN_END
}
