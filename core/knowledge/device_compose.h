// SPDX-License-Identifier: Apache-2.0
// Blending where the engine's layers run (issue 34, item 5): Compose's
// algorithm (blend/blend.h) with the composed KV and the running positions'
// hidden states in a device's memory (store::Device: on a GPU, CUDA memory
// and kernels; the emulated device runs the same kernels' CPU paths).
//
// The pieces' KV crosses to the device once, as placed (float32); the keys
// are re-positioned there (kernels/rope.cuh), the check layers' placed keys
// saved and compared there (kernels/blend_rows.cuh), and only the
// deviations (8 bytes per candidate and check layer) come back for the
// selection, which the host makes (a sort of a few thousand numbers). The
// engine (LayerEngine::on_device) is handed device pointers: the running
// rows' hidden states and each layer's K and V planes ([position][kv_dim]
// float32, `total` positions), as Compose hands host ones. The result is
// Compose's, bit for bit, on the emulated device (tested); on a GPU, as
// far as the engine's own kernels agree with its CPU path.
// Thread-safety: reentrant; the engine is called from the calling thread.
#pragma once

#include <span>

#include "core/blend/blend.h"
#include "core/chunk/chunk.h"
#include "core/device/device.h"

namespace kdn::blend {

// `kv_out` receives device memory holding [layer][k|v][position][kv_dim]
// float32 (Compose's kv_out); the device's work is complete on return.
Result<BlendReport> ComposeOnDevice(const ModelShape& shape, std::span<const Piece> pieces,
                                    const BlendOptions& options, LayerEngine& engine, store::Device& device,
                                    chunk::Payload* kv_out);

}  // namespace kdn::blend
