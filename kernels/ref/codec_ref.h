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

namespace kdn::kernels {

// kdn decode: slot tables, dequantization tables, sink tokens, then one
// stream after another. Returns the lowest failing stream index, ~0u if
// every stream decoded (also stored in *a.failed when it is not null).
// a.out, a.slots and a.lut are written; the directory must be valid
// (core/codec/device.h builds it).
std::uint32_t kdn_decode_ref(const KdnDecodeArgs& a);

// kdn quantization: every code, and each plane's code range (a.sinks <=
// a.tokens, as the launcher checks).
void kdn_quantize_ref(const KdnQuantizeArgs& a);

// kdn rANS encode of every stream; false if any stream failed (its bytes
// entry is ~0).
bool kdn_encode_ref(const KdnEncodeArgs& a);

// cachegen decode, one stream after another: as kdn_decode_ref.
std::uint32_t cachegen_decode_ref(const CacheGenDecodeArgs& a);

// cachegen quantization, row by row: scales and symbols. Returns the lowest
// row holding a non-finite value, ~0u if none (also stored in *a.failed
// when it is not null).
std::uint32_t cachegen_quantize_ref(const CacheGenQuantizeArgs& a);

// cachegen range encode of every stream; false if any stream failed (its
// lengths entry is ~0u).
bool cachegen_encode_ref(const CacheGenEncodeArgs& a);

}  // namespace kdn::kernels
