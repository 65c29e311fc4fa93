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
#include <vector>

#include "codec/codec.h"
#include "common/codec_device_math.h"
#include "util/status.h"

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

// The device decode emulated on the CPU, into `out` (shape.bytes() bytes,
// host memory, canonical layout). Same contract as Codec::Decode.
Status KdnDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out);
Status CacheGenDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out);

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
Status CacheGenDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                              void* cuda_stream);

}  // namespace kdn::codec
