// SPDX-License-Identifier: Apache-2.0
// CPU reference of the codec kernels (kernels/codec.cuh): each function runs
// the per-thread work of common/codec_device_math.h for every thread index
// in ascending order, one kernel after another, exactly as the GPU launches
// them (the work of one kernel never depends on another thread of the same
// kernel, so the order inside a kernel does not change the result). The
// argument structs hold host pointers here.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "kernels/common/codec_device_math.h"
#include "kernels/common/kdn_batch.h"

namespace kdn::kernels {

// kdn batched decode (kdn_batch.h), plane after plane as the kernel's
// blocks: the plane's slot table, its sink tokens, then its streams, each by
// its lane group, lane after lane at every step (the warp's ballot as a
// loop). A stream that does not decode lowers a.failed[plane.job] to its
// segment index (the caller sets every word to ~0u first).
void kdn_decode_batch_ref(const KdnBatchArgs& a);

// kdn quantization: every code, and each plane's code range (a.sinks <=
// a.tokens, as the launcher checks).
void kdn_quantize_ref(const KdnQuantizeArgs& a);

// kdn rANS encode of every stream; false if any stream failed (its bytes
// entry is ~0).
bool kdn_encode_ref(const KdnEncodeArgs& a);

// cachegen decode, one stream after another. Returns the lowest failing
// stream index, ~0u if every stream decoded (also stored in *a.failed when
// it is not null).
std::uint32_t cachegen_decode_ref(const CacheGenDecodeArgs& a);

// cachegen quantization, row by row: scales and symbols. Returns the lowest
// row holding a non-finite value, ~0u if none (also stored in *a.failed
// when it is not null).
std::uint32_t cachegen_quantize_ref(const CacheGenQuantizeArgs& a);

// cachegen range encode of every stream; false if any stream failed (its
// lengths entry is ~0u).
bool cachegen_encode_ref(const CacheGenEncodeArgs& a);

}  // namespace kdn::kernels
