// CUDA gather/scatter of KV between an engine's view (common/kv_view.h:
// paged or contiguous per-layer K and V) and a canonical device chunk. The
// per-element math is common/kv_view.h and common/kv_copy.h, the same the CPU
// path (ref/kv_view_ref.h) uses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kv_view.h"

namespace kdn::kernels {

struct KvViewArgs {
  // The view, with DEVICE arrays: k_base and v_base ([layers] pointers to
  // device memory) and block_table. Check the host-side view with view_valid
  // (ref/kv_view_ref.h) before uploading it: the launcher cannot read these.
  KvView view;
  void* chunk = nullptr;         // device: canonical chunk of `tokens` tokens, all layers
  std::int64_t token_begin = 0;  // first view token of the chunk
  std::int64_t tokens = 0;       // tokens in the chunk
  std::int64_t layer_begin = 0;  // layers [layer_begin, layer_end) move; other
  std::int64_t layer_end = 0;    // layers' slices of the chunk are untouched
};

// view -> chunk. Returns cudaErrorInvalidValue on bad scalars (elem_bytes,
// ranges, null arrays), cudaSuccess without launching when there is nothing
// to copy, else the launch's error. Never synchronizes, allocates or prints.
cudaError_t launch_view_gather(const KvViewArgs& args, cudaStream_t stream);
// chunk -> view: writes exactly the addressed elements.
cudaError_t launch_view_scatter(const KvViewArgs& args, cudaStream_t stream);

}  // namespace kdn::kernels
