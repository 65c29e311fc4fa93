// SPDX-License-Identifier: Apache-2.0
// CUDA kernels of the compressing codecs (core/codec/kdn.cc: kdn's own codec;
// core/codec/cachegen.cc: the CacheGen baseline): dequantize + entropy
// decode, quantize + entropy encode. Each kernel is a grid-stride loop around
// one per-thread work function of common/codec_device_math.h, which the CPU
// reference (ref/codec_ref.h) runs too. The stream structure (how many
// streams, their lengths, channels and tokens) comes from the arguments,
// which a host fills from the payload (core/codec/device.h): nothing here
// splits or caps streams.
//
// Every pointer in the argument structs is device memory. Launchers check
// the scalars (cudaErrorInvalidValue), launch on `stream` and return the
// launch's error; they never synchronize, allocate or print. Per-stream
// failures are reported through the args' `failed` word (the lowest failing
// index; the caller sets it to ~0u before the launch) or the per-stream
// size entries, read back by the caller after the stream completes.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/codec_device_math.h"
#include "kernels/common/kdn_batch.h"

namespace kdn::kernels {

// kdn batched decode (common/kdn_batch.h): one kernel, a block per plane of
// every payload, a lane group per stream; a.failed[job] lowered to the
// index of a segment that does not decode.
cudaError_t launch_kdn_decode_batch(const KdnBatchArgs& a, cudaStream_t stream);

// kdn quantization of the non-sink tokens: one thread per element
// (kdn_quantize), and each plane's code range (a.code_min / a.code_max,
// initialized by the launch itself).
cudaError_t launch_kdn_quantize(const KdnQuantizeArgs& a, cudaStream_t stream);

// kdn rANS encode: one thread per stream (kdn_rans_put), each into its own
// region of a.words; a.bytes gets each stream's size (~0 on error).
cudaError_t launch_kdn_encode(const KdnEncodeArgs& a, cudaStream_t stream);

// cachegen decode: one thread per (layer, k|v, channel, token group) stream
// (range_coder.h), dequantized with its tokens' scales into a.out.
cudaError_t launch_cachegen_decode(const CacheGenDecodeArgs& a, cudaStream_t stream);

// cachegen quantization: one warp per (layer, k|v, token) row: its absmax,
// scale (a.scales) and symbols (a.symbols); a.failed gets the lowest row
// holding a non-finite value.
cudaError_t launch_cachegen_quantize(const CacheGenQuantizeArgs& a, cudaStream_t stream);

// cachegen range encode: one thread per stream, each into its own region of
// a.out (cachegen_stream_cap bytes); a.lengths gets each stream's size
// (~0u on error).
cudaError_t launch_cachegen_encode(const CacheGenEncodeArgs& a, cudaStream_t stream);

}  // namespace kdn::kernels
