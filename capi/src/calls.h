// SPDX-License-Identifier: Apache-2.0
// The reading of a call's common arguments, shared by the shims: handles,
// namespaces, doc ids, tokens, requests, views; the editor and the ops.
#pragma once

#include <deque>
#include <optional>

#include "shim.h"

namespace kdn::capi {

// Inside an editor, on the store's mover thread, a handle's release may be
// the runtime's last reference, and freeing the runtime joins that very
// thread: the release runs on a thread of its own instead, after the
// callback returns. Without a thread to run it on, the handle leaks rather
// than abort.
template <typename F>
bool ReleasedElsewhereInEditor(F release) {
  if (!t_in_editor) return false;
  try {
    std::thread(std::move(release)).detach();
  } catch (...) {
  }
  return true;
}

inline kdn_status NotInEditor() {
  if (!t_in_editor) return KDN_OK;
  return Fail(KDN_ERR_INVALID_ARGUMENT,
              "called from inside an editor callback: the editor runs on the runtime's mover thread, which this call "
              "could wait for; only calls that take no runtime, model or op are allowed there");
}

// An editor callback as the store's ChunkEditor.
class CallbackEditor final : public kdn::store::ChunkEditor {
 public:
  CallbackEditor(kdn_edit_fn fn, void* user) : fn_(fn), user_(user) {}
  kdn::Result<bool> Edit(kdn::store::Chunk& chunk) override {
    kdn_chunk_info info = KDN_CHUNK_INFO_INIT;
    info.filled_size = sizeof info;
    info.num_layers = chunk.meta.layers;
    info.num_kv_heads = chunk.meta.kv_heads;
    info.head_dim = chunk.meta.head_dim;
    info.num_tokens = chunk.meta.tokens;
    info.dtype = static_cast<kdn_dtype>(chunk.meta.dtype);
    info.first_position = chunk.meta.first_position;
    std::memcpy(info.model_fingerprint, chunk.meta.model.data(), 32);
    int changed = 0;
    t_in_editor = true;
    const kdn_status s = fn_(user_, &info, chunk.payload.data(), chunk.payload.size(), &changed);
    t_in_editor = false;
    if (s != KDN_OK) return kdn::Status(kdn::Code::kInternal, "editor callback failed with status " + std::to_string(s));
    return changed != 0;
  }

 private:
  kdn_edit_fn fn_;
  void* user_;
};

inline kdn_op_state StateOf(kdn::store::OpState s) {
  switch (s) {
    case kdn::store::OpState::kPending: return KDN_OP_PENDING;
    case kdn::store::OpState::kDone: return KDN_OP_DONE;
    case kdn::store::OpState::kFailed: return KDN_OP_FAILED;
    case kdn::store::OpState::kCancelled: return KDN_OP_CANCELLED;
  }
  return KDN_OP_FAILED;
}

inline kdn_status CheckDocId(const char* doc_id, size_t len) {
  if (doc_id == nullptr || len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "doc_id is empty");
  if (len > 255) return Fail(KDN_ERR_INVALID_ARGUMENT, "doc_id longer than 255 bytes");
  if (std::memchr(doc_id, '\0', len) != nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "doc_id contains a NUL byte");
  return KDN_OK;
}

inline kdn_status CheckTarget(const kdn_model* model, const char* ns, size_t ns_len) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (ns == nullptr || ns_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace is empty: every call names its tenant");
  if (ns_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace longer than 4096 bytes");
  return KDN_OK;
}

inline kdn_status CheckRuntime(const kdn_runtime* rt) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (rt == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  return KDN_OK;
}

inline kdn_status CheckOp(const kdn_op* op) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  return KDN_OK;
}

inline kdn_status CheckTokens(const int32_t* tokens, size_t num_tokens, const std::string& what) {
  if (num_tokens == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": no tokens (num_tokens is 0)");
  if (tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": tokens is NULL");
  if (num_tokens > (size_t{1} << 32)) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": more than 2^32 tokens");
  for (size_t i = 0; i < num_tokens; ++i) {
    if (tokens[i] < 0) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": token " + std::to_string(i) + " has negative id " +
                                                std::to_string(tokens[i]));
    }
  }
  return KDN_OK;
}

// A request's keys, copied (asynchronous ops outlive the caller's arrays).
inline kdn_status ReadRequest(const kdn::store::KvStore& store, const kdn_request* in, const std::string& what,
                       kdn::store::OwnedKeys* out, std::uint64_t* target_us = nullptr) {
  if (in == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + " is NULL");
  kdn_request r = KDN_REQUEST_INIT;
  if (kdn_status s = ReadIn(in, KDN_REQUEST_SIZE_V1, "kdn_request", &r); s != KDN_OK) return s;
  if (kdn_status s = CheckReserved(r.reserved0, what); s != KDN_OK) return s;
  if (r.ttft_target_us > std::uint64_t{3600} * 1000000) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": ttft_target_us is over an hour (microseconds, not nanoseconds?)");
  }
  if (target_us != nullptr) *target_us = r.ttft_target_us;
  if (r.salt == nullptr && r.salt_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": salt is NULL with salt_len > 0");
  if (r.salt_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": salt_len is over 4096 bytes");
  if (r.salt_len != 0) out->salt.assign(r.salt, r.salt + r.salt_len);
  if (r.hash_bytes == 0) {
    if (kdn_status s = CheckTokens(r.tokens, r.num_tokens, what); s != KDN_OK) return s;
    out->tokens.assign(r.tokens, r.tokens + r.num_tokens);
    return KDN_OK;
  }
  if (r.hash_bytes > 64) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": hash_bytes must be 1..64");
  if (r.num_blocks == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": no blocks (num_blocks is 0)");
  if (r.block_hashes == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_hashes is NULL");
  if (r.block_tokens == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_tokens is 0");
  if (r.num_blocks > (size_t{1} << 28)) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": too many blocks");
  out->hashes.assign(r.block_hashes, r.block_hashes + r.num_blocks * r.hash_bytes);
  out->hash_bytes = r.hash_bytes;
  out->block_tokens = r.block_tokens;
  if (kdn::Status s = store.CheckKeys(out->keys()); !s.ok()) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": " + s.message());
  return KDN_OK;
}

// A latent (MLA) model's view, as the caller describes the latent (k_layers
// or data; kdn.h, kdn_model_spec.cache_kind), turned into the K/V view kdn
// keeps it as: one head of latent_dim / 2, the vector's first half as K and
// its second as V (V's bases half a vector further, into `v_bases`).
inline kdn_status LatentView(const kdn_model* model, const kdn_kv_view& v, const std::string& what, ViewSpec* s,
                             std::vector<void*>* v_bases, std::optional<std::uint64_t> tokens) {
  const int64_t latent = model->latent_dim, half = latent / 2, elem = model->kv.shape.elem_bytes;
  auto bad = [&](const std::string& m) { return Fail(KDN_ERR_INVALID_ARGUMENT, what + " (a latent model's): " + m); };
  if (v.v_layers != nullptr) return bad("v_layers must be NULL: k_layers address each token's latent vector");
  if (v.stride_kv != 0 || v.stride_head != 0 || v.v_stride_token != 0 || v.v_stride_head != 0 || v.v_stride_dim != 0) {
    return bad("stride_kv, stride_head and v_stride_* must be 0: a latent has no V and no heads");
  }
  const bool paged = Raw(v.layout) != KDN_LAYOUT_CONTIGUOUS;
  if (paged && (v.stride_token != 0 || v.stride_dim != 0)) {
    return bad("a paged latent view is dense within its blocks ([block][slot][latent_dim]): stride_token and "
               "stride_dim must be 0");
  }
  const int64_t dim = v.stride_dim != 0 ? v.stride_dim : 1;
  const int64_t token = v.stride_token != 0 ? v.stride_token : latent * dim;
  if (dim < 0 || token < 0) return bad("strides must be non-negative");
  if (paged) {
    s->layout = kdn::store::ViewLayout::kPagedNhd;  // one head: NHD and HND are the same memory
    s->paged_token_stride = latent;
  } else {
    s->stride_token = token;
    s->stride_head = half * dim;
    s->stride_dim = dim;
  }
  if (v.k_layers != nullptr) {
    const size_t n = v.layers != nullptr ? v.num_layers : static_cast<size_t>(model->kv.shape.layers);
    for (size_t l = 0; l < n; ++l) {
      v_bases->push_back(v.k_layers[l] == nullptr ? nullptr : static_cast<uint8_t*>(v.k_layers[l]) + half * dim * elem);
    }
    s->v_layers = v_bases->data();
    if (v.layer_elements != 0) {
      // Bounds each half's reach as the whole vector's: V starts half a
      // vector into the allocation.
      if (v.layer_elements < static_cast<uint64_t>(half * dim)) return bad("layer_elements is smaller than one vector");
      s->layer_elements = v.layer_elements - static_cast<uint64_t>(half * dim);
    }
  } else if (v.data != nullptr) {
    s->stride_kv = half * dim;
    if (v.stride_layer == 0) {
      // Dense: [layer][token][latent] for its room (num_tokens, else the
      // request's tokens).
      const std::uint64_t room = v.num_tokens != 0 ? v.num_tokens : tokens.value_or(0);
      if (room == 0) return bad("one allocation needs stride_layer or num_tokens here");
      s->stride_layer = static_cast<int64_t>(room) * token;
    }
  }
  return KDN_OK;
}

// The caller's views as core view specs (their arrays still the caller's;
// a latent model's V bases in `latent_v`, which must outlive the specs).
// A model with recurrent layers: the state's memory one view carries
// (kdn_kv_view.state_layers), copied into `state`; calls that take none
// pass null.
inline kdn_status ReadViews(const kdn_model* model, const kdn_kv_view* views, size_t num_views, std::vector<ViewSpec>* out,
                            std::deque<std::vector<void*>>* latent_v = nullptr,
                            std::optional<std::uint64_t> tokens = std::nullopt, std::vector<void*>* state = nullptr) {
  if (num_views == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no KV views (num_views is 0)");
  if (views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "views is NULL");
  if (num_views > static_cast<size_t>(model->kv.shape.layers)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "num_views " + std::to_string(num_views) + " exceeds the model's " +
                                              std::to_string(model->kv.shape.layers) + " layers");
  }
  size_t stride = 0;
  if (kdn_status s = ArrayStride(views, num_views, KDN_KV_VIEW_SIZE_V1, "views", &stride); s != KDN_OK) return s;
  for (size_t i = 0; i < num_views; ++i) {
    const std::string what = "views[" + std::to_string(i) + "]";
    kdn_kv_view v = KDN_KV_VIEW_INIT;
    if (kdn_status s = ReadIn(At(views, stride, i), KDN_KV_VIEW_SIZE_V1, "kdn_kv_view", &v); s != KDN_OK) return s;
    if (kdn_status s = CheckReserved(v.reserved0, what); s != KDN_OK) return s;
    if (Raw(v.memory) != KDN_MEMORY_HOST && Raw(v.memory) != KDN_MEMORY_DEVICE) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown memory kind " + std::to_string(Raw(v.memory)));
    }
    if (const int32_t l = Raw(v.layout); l != KDN_LAYOUT_CONTIGUOUS && l != KDN_LAYOUT_PAGED_NHD && l != KDN_LAYOUT_PAGED_HND) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown layout " + std::to_string(l));
    }
    if (v.num_layers > static_cast<size_t>(model->kv.shape.layers)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": num_layers " + std::to_string(v.num_layers) +
                                                " exceeds the model's " + std::to_string(model->kv.shape.layers));
    }
    if (v.layers != nullptr && v.num_layers == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": layers given, num_layers is 0");
    if (v.block_table == nullptr && v.block_table_len != 0) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_table is NULL with block_table_len > 0");
    }
    if (v.block_table_len > (size_t{1} << 31)) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_table_len is absurd");
    ViewSpec s;
    s.memory = static_cast<std::uint32_t>(Raw(v.memory));
    s.dtype = static_cast<std::uint32_t>(Raw(v.dtype));
    s.layout = static_cast<kdn::store::ViewLayout>(Raw(v.layout));
    if (v.layers != nullptr) s.layers = {v.layers, v.num_layers};
    s.num_layers = v.num_layers;
    s.k_layers = v.k_layers;
    s.v_layers = v.v_layers;
    s.data = v.data;
    s.size_bytes = v.size_bytes;
    s.stride_layer = v.stride_layer;
    s.stride_kv = v.stride_kv;
    s.stride_token = v.stride_token;
    s.stride_head = v.stride_head;
    s.stride_dim = v.stride_dim;
    s.v_stride_token = v.v_stride_token;
    s.v_stride_head = v.v_stride_head;
    s.v_stride_dim = v.v_stride_dim;
    s.num_tokens = v.num_tokens;
    s.layer_elements = v.layer_elements;
    s.block_size = v.block_size;
    if (v.block_table != nullptr) s.block_table = {v.block_table, v.block_table_len};
    s.num_blocks = v.num_blocks;
    s.block_stride = v.block_stride;
    s.engine_stream = v.cuda_stream;  // read only by callers of 1.8 and later (struct_size says)
    if (model->grouped && Raw(v.memory) != KDN_MEMORY_HOST) {
      return Fail(KDN_ERR_UNSUPPORTED, what + ": a model with sliding-window or recurrent layers takes host views only");
    }
    if (v.state_layers != nullptr) {
      const std::uint32_t n = model->grouped ? model->grouped->state_layers : 0;
      if (n == 0) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": state_layers is for a model with recurrent layers "
                                                     "(kdn_model_spec.num_state_layers); this one has none");
      }
      if (state == nullptr) return Fail(KDN_ERR_UNSUPPORTED, what + ": this call takes no recurrent state (state_layers)");
      if (!state->empty()) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": state_layers is given by two views");
      for (std::uint32_t l = 0; l < n; ++l) {
        if (v.state_layers[l] == nullptr) {
          return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": state_layers[" + std::to_string(l) + "] is NULL");
        }
      }
      state->assign(v.state_layers, v.state_layers + n);
    }
    if (model->latent_dim != 0) {
      if (latent_v == nullptr) return Fail(KDN_ERR_UNSUPPORTED, what + ": this call does not take a latent model's views");
      latent_v->emplace_back();
      if (kdn_status st = LatentView(model, v, what, &s, &latent_v->back(), tokens); st != KDN_OK) return st;
    }
    out->push_back(s);
  }
  return KDN_OK;
}

// Views checked against the model for `tokens` tokens (nullopt: their room).
// Views in device memory only where `device_ok` (the calls that deliver to
// a device) and the runtime has a device.
inline kdn_status ResolveViews(const kdn_model* model, const kdn_kv_view* views, size_t num_views,
                        std::optional<std::uint64_t> tokens, kdn::store::ResolvedViews* out, bool device_ok = false,
                        std::vector<void*>* state = nullptr) {
  std::vector<ViewSpec> specs;
  std::deque<std::vector<void*>> latent_v;  // Resolve copies the bases it is given
  if (kdn_status s = ReadViews(model, views, num_views, &specs, &latent_v, tokens, state); s != KDN_OK) return s;
  auto r = kdn::store::ResolvedViews::Resolve(model->kv, specs, tokens);
  if (!r.ok()) return FromStatus(r.status());
  if (r->device() && !device_ok) {
    return Fail(KDN_ERR_UNSUPPORTED, "KV views in device memory are taken by kdn_kv_store, kdn_kv_retrieve, "
                                     "kdn_kv_load_async and kdn_kv_save_async only");
  }
  if (r->device() && model->runtime->store().device() == nullptr) {
    return Fail(KDN_ERR_UNSUPPORTED, "KV views in device memory: this runtime has no device (no usable GPU, or "
                                     "device = KDN_DEVICE_NONE; KDN_DEVICE_EMULATED stands host memory in for one)");
  }
  *out = std::move(r).value();
  return KDN_OK;
}

// A request's TTFT target as the store's delivery target (none for 0): a
// deadline that many microseconds from now.
inline kdn::store::DeliveryTarget Deliver(std::uint64_t target_us) {
  kdn::store::DeliveryTarget t;
  if (target_us == 0) return t;
  t.deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count() +
                  static_cast<std::int64_t>(target_us) * 1000;
  return t;
}

// What every KV call of a request checks first: the model and namespace,
// the request's keys (copied), and the views resolved for its length.
// `state`: the recurrent state's memory (kdn_kv_view.state_layers) when the
// model has recurrent layers and a view gives it.
inline kdn_status ReadKvCall(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                      const kdn_kv_view* views, size_t num_views, kdn::store::OwnedKeys* keys,
                      kdn::store::ResolvedViews* resolved, std::uint64_t* target_us = nullptr,
                      std::vector<void*>* state = nullptr) {
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = ReadRequest(model->runtime->store(), request, "request", keys, target_us); s != KDN_OK) return s;
  return ResolveViews(model, views, num_views, keys->keys().size(), resolved, /*device_ok=*/true, state);
}

// Starts a load or save op and wraps it in a handle.
template <typename OpT, typename StartFn>
kdn_status StartOp(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                   const kdn_kv_view* views, size_t num_views, kdn_op** out, OpT* kdn_op::*member, StartFn start) {
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  kdn::store::OwnedKeys keys;
  kdn::store::ResolvedViews resolved;
  std::uint64_t target_us = 0;
  std::vector<void*> state;
  if (kdn_status s = ReadKvCall(model, ns, ns_len, request, views, num_views, &keys, &resolved, &target_us, &state);
      s != KDN_OK) {
    return s;
  }
  // A load op takes the target with it.
  auto op = start(*model->runtime, model->kv, std::string(ns, ns_len), std::move(keys), resolved, Deliver(target_us),
                  std::move(state));
  if (!op.ok()) return FromStatus(op.status());
  auto handle = std::make_unique<kdn_op>();
  handle->runtime = model->runtime;
  handle.get()->*member = op->get();
  handle->rep = std::move(op).value();
  *out = handle.release();
  return KDN_OK;
}

}  // namespace kdn::capi
