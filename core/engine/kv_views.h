// SPDX-License-Identifier: Apache-2.0
// Callers' KV views (the C ABI's kdn_kv_view, as plain C++) resolved into
// KV groups over a model's layers: checked against the model and a request
// before anything is touched, with every caller array copied: the C ABI's
// one validation of views (C++ callers use it too; kdnd takes no views). Gather and scatter of canonical
// chunk bytes through a set of groups live here too.
// Thread-safety: plain values; ResolvedViews is immutable once built.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/engine/engine_ops.h"
#include "core/engine/kv_store.h"

namespace kdn::store {

enum class ViewLayout : std::uint32_t { kContiguous = 0, kPagedNhd = 1, kPagedHnd = 2 };

// One view as a caller describes it. Either per-layer bases (k_layers /
// v_layers, `num_layers` each) or one allocation (`data`, with
// stride_layer / stride_kv, or all five strides 0 for the canonical layout).
// `layers` names the model layers the view holds (empty: all, in order).
struct ViewSpec {
  std::uint32_t memory = 0;  // 0 = host, 1 = device (the runtime's Device: device/device.h)
  std::uint32_t dtype = 0;   // kdn_dtype
  ViewLayout layout = ViewLayout::kContiguous;
  std::span<const std::uint32_t> layers;
  size_t num_layers = 0;
  void* const* k_layers = nullptr;
  void* const* v_layers = nullptr;
  void* data = nullptr;
  std::uint64_t size_bytes = 0;
  std::int64_t stride_layer = 0, stride_kv = 0;
  std::int64_t stride_token = 0, stride_head = 0, stride_dim = 0;
  std::int64_t v_stride_token = 0, v_stride_head = 0, v_stride_dim = 0;
  std::uint64_t num_tokens = 0;  // room; 0 = the request's
  std::uint64_t layer_elements = 0;
  std::uint32_t block_size = 0;
  std::span<const std::int32_t> block_table;
  std::uint64_t num_blocks = 0;
  std::int64_t block_stride = 0;
  void* engine_stream = nullptr;  // device memory: the engine's CUDA stream (KvGroup::engine_stream)
  std::int64_t paged_token_stride = 0;  // paged NHD: kernels::KvView::paged_token_stride (a latent model's)
};

// Views checked and turned into KV groups that cover every model layer once.
class ResolvedViews {
 public:
  // `tokens`: the request's length, which every view must hold; nullopt
  // when the caller does not know it yet (a fetch): every view must then
  // state its room (num_tokens, or a block table), and is checked for it.
  static Result<ResolvedViews> Resolve(const ModelKv& model, std::span<const ViewSpec> views,
                                       std::optional<std::uint64_t> tokens);

  const std::vector<KvGroup>& groups() const { return groups_; }
  // The one view over every layer in order, when that is what the caller
  // gave (the common case, and the fast path of synchronous calls).
  const kernels::KvView* whole() const { return whole_ ? &groups_.front().view : nullptr; }
  // Tokens every view has room for (UINT64_MAX: not stated, unbounded).
  std::uint64_t room() const { return room_; }
  // The views' elements are device memory (every view of a call is in one
  // kind of memory): only a Device touches them, never Gather or Scatter.
  bool device() const { return device_; }

  // Canonical bytes of tokens [begin, begin + tokens) of every layer, from
  // the views (out: tokens * bytes_per_token bytes) / into the views.
  void Gather(const ModelKv& model, std::uint64_t begin, std::uint64_t tokens, std::uint8_t* out) const;
  void Scatter(const ModelKv& model, const std::uint8_t* canonical, std::uint64_t begin, std::uint64_t tokens) const;

 private:
  std::vector<KvGroup> groups_;
  std::vector<std::vector<void*>> pointers_;       // owned copies of the bases
  std::vector<std::vector<std::int32_t>> tables_;  // owned copies of block tables
  bool whole_ = false;
  bool device_ = false;
  std::uint64_t room_ = UINT64_MAX;
};

}  // namespace kdn::store
