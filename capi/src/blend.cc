// SPDX-License-Identifier: Apache-2.0
// The C ABI: kdn_kv_blend (experimental).
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

/* ---- blending (experimental) ---- */

namespace {

// The caller's callback as the blender's engine.
class CallbackEngine final : public kdn::blend::LayerEngine {
 public:
  CallbackEngine(const kdn_blend_options& o, int kv_dim) : o_(o), kv_dim_(kv_dim) {}
  kdn::Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                    float* k_layer, float* v_layer, int total) override {
    std::vector<int32_t> ids(tokens.begin(), tokens.end());
    std::vector<int32_t> pos(positions.begin(), positions.end());
    const size_t count = positions.size();
    const kdn_status st =
        o_.layer_fn(o_.user, static_cast<uint32_t>(layer), pos.data(), layer == 0 ? ids.data() : nullptr, count, hidden,
                    count * o_.hidden_dim, o_.hidden_dim, k_layer, v_layer,
                    static_cast<size_t>(total) * static_cast<size_t>(kv_dim_), static_cast<size_t>(total));
    if (st == KDN_OK) return kdn::Status::Ok();
    if (st > 0 || st < KDN_ERR_BUFFER_TOO_SMALL) {
      return kdn::Status::Internal("the blend callback returned an unknown status " + std::to_string(st) +
                                   " at layer " + std::to_string(layer));
    }
    return kdn::Status(static_cast<kdn::Code>(st), "the blend callback failed at layer " + std::to_string(layer) +
                                                       " (" + kdn_status_string(st) + ")");
  }
  int hidden_dim() const override { return static_cast<int>(o_.hidden_dim); }

 private:
  const kdn_blend_options& o_;
  int kv_dim_;
};

}  // namespace

extern "C" kdn_status kdn_kv_blend(const kdn_model* model, const char* ns, size_t ns_len,
                                   const kdn_blend_segment* segments, size_t num_segments,
                                   const kdn_blend_options* options, const kdn_kv_view* views, size_t num_views,
                                   kdn_blend_report* report) {
  KDN_BEGIN
  if (report != nullptr) {
    if (kdn_status s = CheckOut(report, sizeof(kdn_blend_report), "kdn_blend_report"); s != KDN_OK) return s;
    // Its defaults until the blend succeeds (the rule at the top of kdn.h).
    ResetOut(kdn_blend_report(KDN_BLEND_REPORT_INIT), report);
  }
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (options == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options are NULL (they carry the callback)");
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  if (kdn_status s = ReadIn(options, sizeof(kdn_blend_options), "kdn_blend_options", &o); s != KDN_OK) return s;
  if (o.layer_fn == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: layer_fn is NULL");
  if (o.hidden_dim == 0 || o.hidden_dim > (1u << 20)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: hidden_dim must be 1..2^20");
  }
  if (num_segments == 0 || segments == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no segments");
  if (num_views == 0 || views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no KV views");
  const int layers = static_cast<int>(model->kv.shape.layers);
  kdn::blend::BlendOptions bo;
  bo.ratio = o.ratio;
  bo.threshold = o.threshold;
  if (o.check_layers != nullptr) {
    if (o.num_check_layers > static_cast<size_t>(layers)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: more check layers than model layers");
    }
    bo.check_layers.assign(o.check_layers, o.check_layers + o.num_check_layers);
  } else if (o.num_check_layers != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: check_layers is NULL with num_check_layers > 0");
  } else {
    bo.check_layers = {layers > 1 ? 1 : 0};
  }
  bo.rope = model->rope;
  const int32_t scaling = Raw(o.rope_scaling);
  if (scaling != KDN_ROPE_SCALING_NONE && scaling != KDN_ROPE_SCALING_LINEAR && scaling != KDN_ROPE_SCALING_NTK) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: unknown rope_scaling " + std::to_string(scaling));
  }
  bo.rope.scaling = static_cast<kdn::kernels::RopeScaling>(scaling);
  bo.rope.factor = o.rope_factor;

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
  std::vector<ViewSpec> specs;
  if (kdn_status s = ReadViews(model, views, num_views, &specs); s != KDN_OK) return s;
  for (const ViewSpec& v : specs) {
    if (v.memory == KDN_MEMORY_DEVICE && model->runtime->store().device() == nullptr) {
      return Fail(KDN_ERR_UNSUPPORTED, "kdn_kv_blend: KV views in device memory: this runtime has no device");
    }
  }
  CallbackEngine engine(o, static_cast<int>(model->kv.shape.heads * model->kv.shape.head_dim));
  auto r = kdn::blend::BlendDocuments(model->runtime->knowledge(), model->kv, std::string_view(ns, ns_len), segs, bo,
                                      engine, specs);
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
    WriteOut(full, report);
  }
  return KDN_OK;
  KDN_END
}
