// SPDX-License-Identifier: Apache-2.0
// CUDA gather/scatter of KV between an engine's view (common/kv_view.h:
// paged or contiguous per-layer K and V) and a canonical device chunk, a
// vector of up to 16 bytes per thread (common/kv_rows.h: the same functions
// the emulated device runs, ref/kv_view_ref.h view_copy_emulated).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kv_rows.h"

namespace kdn::kernels {

// KvViewArgs (common/kv_rows.h) with DEVICE arrays: k_base and v_base
// ([layers] pointers to device memory) and block_table. Check the host-side
// view with view_valid (ref/kv_view_ref.h) before uploading it, and set
// base_alignment from it (view_base_alignment): the launcher cannot read
// these arrays.

// view -> chunk. Returns cudaErrorInvalidValue on bad scalars (elem_bytes,
// ranges, null arrays), cudaSuccess without launching when there is nothing
// to copy, else the launch's error. Never synchronizes, allocates or prints.
cudaError_t launch_view_gather(const KvViewArgs& args, cudaStream_t stream);
// chunk -> view: writes exactly the addressed elements.
cudaError_t launch_view_scatter(const KvViewArgs& args, cudaStream_t stream);

}  // namespace kdn::kernels
