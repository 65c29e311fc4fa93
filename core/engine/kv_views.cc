// SPDX-License-Identifier: Apache-2.0
#include "core/engine/kv_views.h"

#include <algorithm>
#include <string>

#include "kernels/ref/kv_view_ref.h"

namespace kdn::store {
namespace {

Status Bad(size_t i, const std::string& m) {
  return Status::InvalidArgument("KV view " + std::to_string(i) + ": " + m);
}

// A view given as one allocation: its size, the tokens it has room for, and
// element strides of (layer, k|v, token, head, dim); all zero = canonical.
struct Allocation {
  std::uint64_t size_bytes = 0;
  std::uint64_t num_tokens = 0;
  kernels::KvStrides strides;
};

// Checks an allocation against a model and a request of `tokens` tokens,
// and resolves zero strides to canonical ones.
Result<Allocation> ResolveAllocation(const ModelKv& model, const Allocation& view, std::uint64_t tokens) {
  if (view.num_tokens < tokens) {
    return Status::InvalidArgument("KV buffer too small: it holds " + std::to_string(view.num_tokens) +
                                   " tokens, the request has " + std::to_string(tokens));
  }
  if (view.num_tokens > (std::uint64_t{1} << 32)) {
    return Status::InvalidArgument("KV buffer: num_tokens " + std::to_string(view.num_tokens) + " is absurd");
  }
  Allocation out = view;
  const kernels::KvStrides& s = view.strides;
  const bool canonical = s.layer == 0 && s.kv == 0 && s.token == 0 && s.head == 0 && s.dim == 0;
  if (canonical) {
    out.strides = kernels::canonical_strides(model.shape, static_cast<std::int64_t>(view.num_tokens));
  } else if (s.layer < 0 || s.kv < 0 || s.token < 0 || s.head < 0 || s.dim < 0) {
    return Status::InvalidArgument("KV buffer: strides must be non-negative");
  } else if (s.layer > (std::int64_t{1} << 40) || s.kv > (std::int64_t{1} << 40) ||
             s.token > (std::int64_t{1} << 40) || s.head > (std::int64_t{1} << 40) ||
             s.dim > (std::int64_t{1} << 40)) {
    return Status::InvalidArgument("KV buffer: a stride exceeds 2^40 elements");
  }
  // The furthest element the layout reaches, in 128 bits: strides up to 2^40
  // times 2^32 tokens overflow 64.
  using U128 = unsigned __int128;
  const kernels::KvShape& sh = model.shape;
  const kernels::KvStrides& st = out.strides;
  const U128 last = U128(sh.layers - 1) * U128(st.layer) + U128(st.kv) + U128(view.num_tokens - 1) * U128(st.token) +
                    U128(sh.heads - 1) * U128(st.head) + U128(sh.head_dim - 1) * U128(st.dim);
  const U128 need = (last + 1) * U128(sh.elem_bytes);
  if (view.num_tokens > 0 && need > U128(view.size_bytes)) {
    return Status::InvalidArgument("KV buffer too small: its layout reaches " +
                                   (need >> 64 ? std::string("beyond 2^64")
                                               : std::to_string(static_cast<std::uint64_t>(need))) +
                                   " bytes, size_bytes is " + std::to_string(view.size_bytes));
  }
  return out;
}

// Per-layer bases of a view given as one allocation.
Status FromAllocation(const ModelKv& model, const ViewSpec& s, size_t i, std::int64_t layers, std::uint64_t tokens,
                      std::vector<void*>& k, std::vector<void*>& v, kernels::KvView& view) {
  if (s.data == nullptr) return Bad(i, "neither k_layers/v_layers nor data is set");
  if (s.layout != ViewLayout::kContiguous) return Bad(i, "a paged view needs k_layers and v_layers");
  if (s.v_stride_token != 0 || s.v_stride_head != 0 || s.v_stride_dim != 0) {
    return Bad(i, "v_stride_* are for per-layer views; one allocation has stride_kv");
  }
  ModelKv sub = model;
  sub.shape.layers = layers;
  Allocation b;
  b.size_bytes = s.size_bytes;
  b.num_tokens = s.num_tokens != 0 ? s.num_tokens : tokens;
  b.strides = {s.stride_layer, s.stride_kv, s.stride_token, s.stride_head, s.stride_dim};
  auto r = ResolveAllocation(sub, b, tokens);
  if (!r.ok()) return Bad(i, r.status().message());
  if (r->strides.kv == 0 || (layers > 1 && r->strides.layer == 0)) {
    return Bad(i, "stride_kv and stride_layer must not be 0 when the strides are given: K and V, or two layers, would "
                  "share memory");
  }
  auto* base = static_cast<std::uint8_t*>(s.data);
  const std::int64_t eb = model.shape.elem_bytes;
  for (std::int64_t l = 0; l < layers; ++l) {
    k.push_back(base + l * r->strides.layer * eb);
    v.push_back(base + (l * r->strides.layer + r->strides.kv) * eb);
  }
  view.stride_token = r->strides.token;
  view.stride_head = r->strides.head;
  view.stride_dim = r->strides.dim;
  return Status::Ok();
}

}  // namespace

Result<ResolvedViews> ResolvedViews::Resolve(const ModelKv& model, std::span<const ViewSpec> views,
                                             std::optional<std::uint64_t> tokens) {
  if (views.empty()) return Status::InvalidArgument("no KV views (num_views is 0)");
  if (views.size() > static_cast<size_t>(model.shape.layers)) {
    return Status::InvalidArgument("more KV views (" + std::to_string(views.size()) + ") than model layers");
  }
  const auto L = static_cast<size_t>(model.shape.layers);
  ResolvedViews out;
  std::vector<bool> seen(L, false);
  for (size_t i = 0; i < views.size(); ++i) {
    const ViewSpec& s = views[i];
    if (s.memory > 1) return Bad(i, "unknown memory kind " + std::to_string(s.memory));
    if (s.memory != views[0].memory) {
      return Bad(i, "its memory kind differs from view 0's: the views of a call are all host or all device memory");
    }
    out.device_ = s.memory == 1;
    if (s.engine_stream != nullptr && s.memory != 1) {
      return Bad(i, "cuda_stream is set on a view in host memory (a stream orders device work only)");
    }
    if (s.engine_stream != views[0].engine_stream) {
      return Bad(i, "its cuda_stream differs from view 0's: the views of a call name one stream");
    }
    if (s.dtype != model.dtype) {
      return Bad(i, "dtype " + std::to_string(s.dtype) + " differs from the model's " + std::to_string(model.dtype));
    }
    if (s.layout != ViewLayout::kContiguous && s.layout != ViewLayout::kPagedNhd && s.layout != ViewLayout::kPagedHnd) {
      return Bad(i, "unknown layout " + std::to_string(static_cast<std::uint32_t>(s.layout)));
    }
    // Which model layers.
    KvGroup g;
    g.engine_stream = s.engine_stream;
    if (s.layers.empty()) {
      if (s.num_layers != 0 && s.num_layers != L) {
        return Bad(i, "layers is NULL, so num_layers must be 0 or the model's " + std::to_string(L));
      }
      for (size_t l = 0; l < L; ++l) g.layers.push_back(static_cast<std::uint32_t>(l));
    } else {
      g.layers.assign(s.layers.begin(), s.layers.end());
    }
    for (std::uint32_t l : g.layers) {
      if (l >= L) return Bad(i, "layer " + std::to_string(l) + " beyond the model's " + std::to_string(L));
      if (seen[l]) return Bad(i, "layer " + std::to_string(l) + " is in two views");
      seen[l] = true;
    }
    const auto n = static_cast<std::int64_t>(g.layers.size());
    // Room, and the tokens the view is checked for.
    std::uint64_t room = s.num_tokens != 0 ? s.num_tokens : UINT64_MAX;
    const bool paged = s.layout != ViewLayout::kContiguous;
    if (paged && s.block_size > 0) room = std::min<std::uint64_t>(room, s.block_table.size() * std::uint64_t{s.block_size});
    if (!tokens && room == UINT64_MAX) {
      return Bad(i, "num_tokens must say how many tokens the view has room for");
    }
    if (room != UINT64_MAX && room > (std::uint64_t{1} << 32)) room = std::uint64_t{1} << 32;
    const std::uint64_t need = tokens ? *tokens : room;
    if (tokens && room < *tokens) {
      return Bad(i, "it has room for " + std::to_string(room) + " tokens, the request has " + std::to_string(*tokens));
    }
    out.room_ = std::min(out.room_, room);
    // Bases.
    kernels::KvView& kv = g.view;
    kv.shape = model.shape;
    kv.shape.layers = n;
    std::vector<void*> k, v;
    if (s.k_layers == nullptr && s.v_layers == nullptr) {
      KDN_RETURN_IF_ERROR(FromAllocation(model, s, i, n, need, k, v, kv));
    } else {
      if (s.k_layers == nullptr || s.v_layers == nullptr) return Bad(i, "k_layers or v_layers is NULL");
      if (s.data != nullptr) return Bad(i, "give either k_layers/v_layers or data, not both");
      if (!s.layers.empty() && s.num_layers != g.layers.size()) {
        return Bad(i, "num_layers must count the entries of layers");
      }
      k.assign(s.k_layers, s.k_layers + n);
      v.assign(s.v_layers, s.v_layers + n);
      kv.stride_token = s.stride_token;
      kv.stride_head = s.stride_head;
      kv.stride_dim = s.stride_dim;
      kv.v_stride_token = s.v_stride_token;
      kv.v_stride_head = s.v_stride_head;
      kv.v_stride_dim = s.v_stride_dim;
      kv.layer_elements = static_cast<std::int64_t>(s.layer_elements);
      if (paged) {
        if (s.block_table.data() == nullptr) return Bad(i, "block_table is NULL");
        kv.paged = true;
        kv.order = s.layout == ViewLayout::kPagedNhd ? kernels::PageOrder::kNHD : kernels::PageOrder::kHND;
        kv.block_size = s.block_size;
        out.tables_.emplace_back(s.block_table.begin(), s.block_table.end());
        kv.block_table = out.tables_.back().data();
        kv.table_len = static_cast<std::int64_t>(s.block_table.size());
        kv.num_blocks = static_cast<std::int64_t>(s.num_blocks);
        kv.block_stride = s.block_stride;
        kv.paged_token_stride = s.paged_token_stride;
      }
    }
    out.pointers_.push_back(std::move(k));
    kv.k_base = out.pointers_.back().data();
    out.pointers_.push_back(std::move(v));
    kv.v_base = out.pointers_.back().data();
    const char* why = nullptr;
    if (!kernels::view_valid(kv, static_cast<std::int64_t>(need), &why)) return Bad(i, why);
    out.groups_.push_back(std::move(g));
  }
  for (size_t l = 0; l < L; ++l) {
    if (!seen[l]) return Status::InvalidArgument("the KV views must hold every model layer; layer " + std::to_string(l) + " is in none");
  }
  if (out.groups_.size() == 1) {
    const auto& ls = out.groups_.front().layers;
    out.whole_ = std::is_sorted(ls.begin(), ls.end());  // every layer once, so sorted = 0..L-1
  }
  return out;
}

void ResolvedViews::Gather(const ModelKv& model, std::uint64_t begin, std::uint64_t tokens, std::uint8_t* out) const {
  if (const kernels::KvView* w = whole()) {
    kernels::view_gather_cpu(*w, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(tokens), 0,
                             model.shape.layers, out);
    return;
  }
  GatherGroups(model, groups_, begin, tokens, out);
}

void ResolvedViews::Scatter(const ModelKv& model, const std::uint8_t* canonical, std::uint64_t begin,
                            std::uint64_t tokens) const {
  if (const kernels::KvView* w = whole()) {
    kernels::view_scatter_cpu(canonical, *w, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(tokens), 0,
                              model.shape.layers);
    return;
  }
  ScatterGroups(model, groups_, canonical, begin, tokens);
}

}  // namespace kdn::store
