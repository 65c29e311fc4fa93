// SPDX-License-Identifier: Apache-2.0
// The C ABI: kdn_model (a model spec registered with a runtime).
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

extern "C" {

/* ---- models ---- */

kdn_status kdn_model_create(kdn_runtime* runtime, const kdn_model_spec* spec, kdn_model** out) {
  KDN_BEGIN
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  if (spec == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model spec is NULL");
  kdn_model_spec s = KDN_MODEL_SPEC_INIT;
  if (kdn_status st = ReadIn(spec, KDN_MODEL_SPEC_SIZE_V1, "kdn_model_spec", &s); st != KDN_OK) return st;
  auto bad = [](const std::string& m) { return Fail(KDN_ERR_INVALID_ARGUMENT, "model spec: " + m); };
  if (s.num_layers == 0 || s.num_layers > 4096) return bad("num_layers " + std::to_string(s.num_layers) + " out of range 1..4096");
  const int32_t kind = Raw(s.cache_kind);
  if (kind != KDN_CACHE_KV && kind != KDN_CACHE_LATENT) return bad("unknown cache_kind " + std::to_string(kind));
  if (s.reserved1 != 0) {
    return Fail(KDN_ERR_VERSION, "model spec: reserved1 is set; it is reserved for later versions and must be 0");
  }
  if (s.reserved2 != 0) {
    return Fail(KDN_ERR_VERSION, "model spec: reserved2 is set; it is reserved for later versions and must be 0");
  }
  if (s.num_state_layers > 4096) return bad("num_state_layers " + std::to_string(s.num_state_layers) + " out of range 0..4096");
  if (s.num_state_layers > 0 && (s.state_bytes == 0 || s.state_bytes % 4 != 0 || s.state_bytes > (uint64_t{1} << 30))) {
    return bad("state_bytes " + std::to_string(s.state_bytes) +
               " must be a positive multiple of 4, at most 1 GiB, for a model with recurrent layers");
  }
  if (s.num_state_layers == 0 && s.state_bytes != 0) {
    return bad("state_bytes is set but num_state_layers is 0 (no recurrent layers)");
  }
  std::vector<uint32_t> windows;
  if (s.layer_windows != nullptr && s.num_layers <= 4096) windows.assign(s.layer_windows, s.layer_windows + s.num_layers);
  const bool latent = kind == KDN_CACHE_LATENT;
  if (latent) {
    // One latent vector per token, kept as one head of latent_dim / 2 in
    // each of the K and V planes (its halves): every tier, codec and view
    // path applies unchanged.
    if (s.num_kv_heads != 0 || s.head_dim != 0 || s.rotary_dim != 0) {
      return bad("a latent model (KDN_CACHE_LATENT) has no K/V heads: num_kv_heads, head_dim and rotary_dim must be 0");
    }
    if (s.latent_dim < 2 || s.latent_dim > 65536 || s.latent_dim % 2 != 0) {
      return bad("latent_dim " + std::to_string(s.latent_dim) + " must be even, 2..65536");
    }
    if (s.latent_rope_dim > s.latent_dim || s.latent_rope_dim % 2 != 0) {
      return bad("latent_rope_dim " + std::to_string(s.latent_rope_dim) + " must be even and at most latent_dim " +
                 std::to_string(s.latent_dim));
    }
  } else {
    if (s.latent_dim != 0 || s.latent_rope_dim != 0) {
      return bad("latent_dim and latent_rope_dim are for a latent model (cache_kind KDN_CACHE_LATENT); they must be 0");
    }
    if (s.num_kv_heads == 0 || s.num_kv_heads > 4096) return bad("num_kv_heads " + std::to_string(s.num_kv_heads) + " out of range 1..4096");
    if (s.head_dim == 0 || s.head_dim > 65536) return bad("head_dim " + std::to_string(s.head_dim) + " out of range 1..65536");
  }
  const uint32_t kv_heads = latent ? 1 : s.num_kv_heads, head_dim = latent ? s.latent_dim / 2 : s.head_dim;
  const int32_t dtype = Raw(s.dtype), rope_style = Raw(s.rope_style);
  const auto elem = static_cast<int64_t>(dtype < 0 ? 0 : kdn::DtypeBytes(static_cast<uint32_t>(dtype)));
  if (elem == 0) return bad("unknown dtype " + std::to_string(dtype));
  if (rope_style != KDN_ROPE_INTERLEAVED && rope_style != KDN_ROPE_NEOX) {
    return bad("unknown rope_style " + std::to_string(rope_style));
  }
  if (!(s.rope_theta > 0.0f) || !std::isfinite(s.rope_theta)) return bad("rope_theta must be positive and finite");
  const uint32_t rotary = latent ? s.latent_rope_dim : (s.rotary_dim == 0 ? s.head_dim : s.rotary_dim);
  if (!latent && (rotary > s.head_dim || rotary % 2 != 0)) {
    return bad("rotary_dim " + std::to_string(rotary) + " must be even and at most head_dim " + std::to_string(s.head_dim));
  }
  if (s.fingerprint == nullptr || s.fingerprint_len == 0) {
    return bad("fingerprint is empty: it must identify the weights, so KV never reaches another model");
  }
  if (s.fingerprint_len > 65536) return bad("fingerprint longer than 65536 bytes");
  const int64_t per_token = int64_t{s.num_layers} * 2 * kv_heads * head_dim * elem;
  if (per_token > (int64_t{1} << 32)) return bad("KV bytes per token exceed 4 GiB");
  kdn::keys::ModelIdentity id;
  id.layers = s.num_layers;
  id.kv_heads = kv_heads;
  id.head_dim = head_dim;
  id.dtype = static_cast<uint32_t>(dtype);
  id.rope_theta = s.rope_theta;
  id.rope_style = static_cast<uint32_t>(rope_style);
  id.rotary_dim = rotary;
  id.fingerprint.assign(s.fingerprint, s.fingerprint_len);
  if (latent) {
    id.cache_kind = KDN_CACHE_LATENT;
    id.latent_dim = s.latent_dim;
    id.latent_rope_dim = s.latent_rope_dim;
  }
  const bool grouped = kdn::store::GroupedModel::Needed(windows, s.num_state_layers);
  if (grouped) {
    id.layer_windows = windows;
    id.state_layers = s.num_state_layers;
    id.state_bytes = s.state_bytes;
  }
  auto m = std::make_unique<kdn_model>();
  m->runtime = runtime->rep;
  m->kv.fingerprint = kdn::keys::ModelFingerprint(id);
  m->kv.shape = {s.num_layers, kv_heads, head_dim, elem};
  m->kv.dtype = static_cast<uint32_t>(dtype);
  // Blending re-positions K's rotary dims; a latent's RoPE dims are one
  // head of latent_rope_dim at the end of its second half (blend.h,
  // BlendOptions::latent).
  m->rope.head_dim = static_cast<int>(latent ? s.latent_rope_dim : head_dim);
  m->rope.rotary_dim = static_cast<int>(latent ? s.latent_rope_dim : rotary);
  m->rope.theta = s.rope_theta;
  m->rope.style = rope_style == KDN_ROPE_NEOX ? kdn::kernels::RopeStyle::kNeox : kdn::kernels::RopeStyle::kInterleaved;
  m->latent_dim = latent ? s.latent_dim : 0;
  if (grouped) {
    auto g = kdn::store::GroupedModel::Make(m->kv, windows, s.num_state_layers, s.state_bytes);
    if (!g.ok()) return bad(g.status().message());
    m->grouped = std::make_shared<const kdn::store::GroupedModel>(std::move(g).value());
  }
  *out = m.release();
  return KDN_OK;
  KDN_END
}

void kdn_model_destroy(kdn_model* model) {
  if (model == nullptr || ReleasedElsewhereInEditor([model] { delete model; })) return;
  delete model;
}

kdn_status kdn_model_get_fingerprint(const kdn_model* model, uint8_t out[32]) {
  KDN_BEGIN
  if (out != nullptr) std::memset(out, 0, 32);
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  std::memcpy(out, model->kv.fingerprint.data(), 32);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_model_get_kv_bytes_per_token(const kdn_model* model, uint64_t* out) {
  KDN_BEGIN
  if (out != nullptr) *out = 0;
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = static_cast<uint64_t>(model->kv.bytes_per_token());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_model_report_prefill(const kdn_model* model, uint64_t tokens, uint64_t elapsed_ns) {
  KDN_BEGIN
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  return FromStatus(model->runtime->store().ReportPrefill(model->kv, tokens, elapsed_ns));
  KDN_END
}

}  // extern "C"
