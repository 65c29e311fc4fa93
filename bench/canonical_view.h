// SPDX-License-Identifier: Apache-2.0
// A canonical KV buffer as a view, for benchmarks that keep KV in one
// allocation per request.
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <vector>

#include "core/engine/kv_store.h"
#include "kernels/common/kv_view.h"

namespace kdn::bench {

// A canonical buffer (one allocation of `tokens` tokens, every layer, K and
// V) as a view: per-layer pointers into it.
class CanonicalView {
 public:
  CanonicalView(const store::ModelKv& model, void* data, std::uint64_t tokens) {
    const kernels::KvStrides st = kernels::canonical_strides(model.shape, static_cast<std::int64_t>(tokens));
    auto* base = static_cast<std::uint8_t*>(data);
    const std::int64_t eb = model.shape.elem_bytes;
    for (std::int64_t l = 0; l < model.shape.layers; ++l) {
      k_.push_back(base + l * st.layer * eb);
      v_.push_back(base + (l * st.layer + st.kv) * eb);
    }
    view_.shape = model.shape;
    view_.k_base = k_.data();
    view_.v_base = v_.data();
    view_.stride_token = st.token;
    view_.stride_head = st.head;
    view_.stride_dim = st.dim;
  }
  const kernels::KvView& view() const { return view_; }

 private:
  std::vector<void*> k_, v_;
  kernels::KvView view_;
};

}  // namespace kdn::bench
