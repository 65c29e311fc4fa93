// SPDX-License-Identifier: Apache-2.0
// Host side of the compressing codecs' CUDA path (kernels/codec.cuh): the
// host parses a payload's headers and tables into a directory (where each
// plane's tables and each stream sit, the parsed frequency tables) with the
// same checks as the CPU decoders (core/codec/kdn.cc, cachegen.cc), and the
// device decodes the streams. Decode*Emulated runs the same per-thread
// functions on the CPU (kernels/ref/codec_ref.h): the tests compare it with
// the CPU codecs bit for bit, and so check what the GPU computes.
//
// Errors: kInvalidArgument for a bad shape; kCorrupt for a payload the CPU
// codec rejects too (a stream that does not decode: "stream g of plane p");
// kUnsupported when the CUDA kernels are not built or no CUDA device is
// usable; kInternal for other CUDA errors.
// Thread-safety: plain functions; concurrent calls are fine (the device
// calls each use their own memory and the caller's stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/codec/codec.h"
#include "core/codec/tc_profile.h"
#include "kernels/common/codec_device_math.h"
#include "kernels/common/kdn_batch.h"
#include "kernels/common/tc_device_math.h"
#include "core/util/status.h"

namespace kdn::codec {

// What the kdn decode kernels need besides the payload bytes
// (kernels::KdnDecodeArgs). Planes are (layer, k|v) in payload order.
struct KdnDirectory {
  std::uint32_t sinks = 0;  // sink tokens stored per plane: min(param0, tokens)
  std::uint32_t group = 1, groups = 0, lanes = 1;
  std::vector<kernels::KdnPlaneDir> planes;
  std::vector<std::uint32_t> cum;                // every plane's n + 1 cumulative frequencies
  std::vector<kernels::CodecStreamDir> streams;  // (plane, group) order
};
// Parses and checks everything but the streams' contents.
Result<KdnDirectory> ParseKdnDirectory(const Shape& shape, const std::uint8_t* data, size_t size);

// One payload of a batched kdn decode (kernels/common/kdn_batch.h: every
// stream of every payload in one launch) and where it goes: the canonical
// chunk at `out` (plane p at out + p * tokens * C elements, rows of C) unless
// `planes` is set: then plane p = (layer, k|v) starts at planes[p] (2 *
// layers of them) and its token rows are `row` >= C elements apart (an
// engine's view of the same dtype laid out token-major, one array per layer's
// K or V). `status` is the job's outcome: Ok, or kCorrupt (or the parse's
// error) for a payload the CPU codec would reject too.
struct KdnBatchJob {
  Shape shape;
  const std::uint8_t* payload = nullptr;  // host memory
  size_t size = 0;
  void* out = nullptr;
  std::vector<void*> planes;
  std::uint64_t row = 0;
  // The planes decoded: [plane_begin, plane_end) of the payload's 2 x
  // layers (layer l's K and V are planes 2l and 2l + 1); the others are not
  // written. A load that writes its layers in steps decodes each step's.
  std::uint32_t plane_begin = 0, plane_end = ~0u;
  // The same bytes as `payload`, already in device memory (uploaded once
  // for several steps): the device decoder reads them there instead of
  // uploading `payload`. Null: it uploads. The emulation reads `payload`.
  const std::uint8_t* device_payload = nullptr;
  Status status;
};

// What the cachegen decode kernel needs besides the payload bytes
// (kernels::CacheGenDecodeArgs).
struct CacheGenDirectory {
  std::uint64_t bins_at = 0, scales_at = 0;  // payload offsets
  std::uint32_t stream_tokens = 1, groups = 0;
  std::vector<std::uint32_t> cum;     // per (plane, channel): A + 1 cumulative frequencies
  std::vector<std::uint32_t> cum_at;  // [planes * channels]
  std::vector<kernels::CodecStreamDir> streams;  // (plane, channel, group) order
};
Result<CacheGenDirectory> ParseCacheGenDirectory(const Shape& shape, const std::uint8_t* data, size_t size);

// What the transform codec's decode kernels need besides the payload bytes
// (kernels::TcDecodeArgs, TcFinishArgs): the payload's profile and, per
// plane and component, the parsed fields.
struct TcDirectory {
  std::shared_ptr<const TcProfile> profile;
  std::uint32_t sinks = 0, lanes = 1;  // sinks: min(param0, tokens)
  std::int64_t first = 0;
  std::vector<float> mean, step;           // [plane * C + i]
  std::vector<std::int32_t> range;         // [plane * C + i] (0 for uncoded components)
  std::vector<std::uint32_t> table_of;     // [plane * C + i] (0 for uncoded components)
  std::vector<std::uint64_t> sinks_at;     // [plane]
  std::vector<kernels::TcStreamDir> streams;
  std::vector<std::uint32_t> comps;
};
// Parses and checks everything but the streams' contents. The profile is
// `hint` when the payload names it, else the one this process registered
// under the payload's id (kCorrupt if none: the chunk is unreadable here).
Result<TcDirectory> ParseTcDirectory(const Shape& shape, const std::uint8_t* data, size_t size,
                                     std::shared_ptr<const TcProfile> hint = nullptr);

// The scalars of the tc decode kernels' arguments for a parsed payload (the
// caller sets every pointer: device or host memory).
kernels::TcDecodeArgs TcStreamScalars(const Shape& shape, const TcDirectory& d);
kernels::TcFinishArgs TcFinishScalars(const Shape& shape, const TcDirectory& d);

// The device decode emulated on the CPU, into `out` (shape.bytes() bytes,
// host memory, canonical layout). Same contract as Codec::Decode.
Status KdnDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out);
// The batched device decode emulated on the CPU (host memory outputs).
// kInvalidArgument if a job's outputs are missing; each job's own outcome in
// its `status`.
Status KdnDecodeBatchEmulated(std::span<KdnBatchJob> jobs);
Status CacheGenDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out);
// The transform codec's: the kernels' per-thread work and tc_accumulate for
// the product (the CPU codec's TcDecodeCpu gives its bytes with less work;
// the tests compare them).
Status TcDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out,
                        std::shared_ptr<const TcProfile> hint = nullptr);

// Whether this build has the CUDA kernels (a device may still be missing).
bool DeviceCodecsBuilt();

// Decodes a payload in host memory into `out_device` (shape.bytes() bytes of
// device memory, canonical layout, shape.dtype) on `cuda_stream` (a
// cudaStream_t; nullptr: the default stream). Parses on the host, uploads the
// payload and the directory, decodes, and returns once the stream has run
// the decode (it must, to report a stream that does not decode). Scratch:
// the payload, 16 KiB per plane of slot tables and planes x channels x 256
// elements of dequantization tables (kdn), allocated and freed on the
// stream. On error `out_device` is unspecified.
Status KdnDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                         void* cuda_stream);
// Every job at once (outputs in device memory): parses each payload on the
// host, uploads them all and one directory, launches one kernel per dtype
// and synchronizes once. A payload that does not decode is its job's status;
// the return value is the device's (kInternal, kUnsupported) or a job's bad
// outputs (kInvalidArgument). KdnDecodeOnDevice is a batch of one.
Status KdnDecodeBatchOnDevice(std::span<KdnBatchJob> jobs, void* cuda_stream);
Status CacheGenDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                              void* cuda_stream);
// The transform codec: the payload, the directory, the profile's tables and
// bases uploaded (per call: about 1 MiB for stories260K's profile), the
// streams decoded (one thread each), the product by cuBLAS
// (cublasSgemmStridedBatched, one batch entry per plane), then the finish
// kernel. Results agree with TcDecodeEmulated within float rounding of the
// product (another order of summation), not bit for bit.
Status TcDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                        void* cuda_stream);

}  // namespace kdn::codec
