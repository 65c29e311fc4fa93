// SPDX-License-Identifier: Apache-2.0
// The GPU side of delivery: a Device runs what the store does to KV that
// lives in GPU memory (an engine's KV view, a device tier's blocks):
// copies, the gather and scatter kernels between views and canonical
// chunks, and the codecs' decode kernels (core/codec/device.h), so that a
// load into a device view reads a device tier's chunk device to device, and
// an encoded chunk from a lower tier is decoded on the GPU, straight into
// device memory: no host round trip of the canonical KV.
//
// Two implementations:
// - the CUDA device (MakeCudaDevice): cudaMalloc'd memory, the kernels of
//   kernels/*.cu on the calling thread's default stream
//   (cudaStreamPerThread); a store call synchronizes that stream before it
//   returns, so the KV is in place when the call is done;
// - the emulated device (MakeEmulatedDevice): host memory stands in for the
//   GPU's, and every operation runs the CPU path of the same kernel (the
//   same per-thread functions: kernels/ref/*), so a machine without a GPU
//   runs, and the tests check, the logic and the bytes of every device path.
//
// Both count what crossed which way (DeviceCounters), so a test can say that
// a load from a device tier moved nothing between host and device.
// Thread-safety: every member may be called from any thread at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/chunk/chunk.h"
#include "core/codec/codec.h"
#include "core/codec/device.h"
#include "kernels/common/kv_view.h"
#include "kernels/common/rope_reposition.h"
#include "core/util/status.h"

namespace kdn::store {

struct DeviceCounters {
  std::uint64_t h2d_bytes = 0;   // host -> device (payloads to decode, raw chunks from host tiers)
  std::uint64_t d2h_bytes = 0;   // device -> host (saves to tiers that are not on the device)
  std::uint64_t d2d_bytes = 0;   // device -> device copies (into a device tier)
  std::uint64_t scatters = 0, gathers = 0;  // kernel launches (or their CPU path)
  std::uint64_t device_decodes = 0;         // payloads decoded by the device's decode kernels
  std::uint64_t host_decodes = 0;           // payloads decoded on the CPU, then copied (codecs without kernels)
  std::uint64_t stream_marks = 0;           // engine streams marked (MarkStream with a stream)
  std::uint64_t mark_waits = 0;             // kdn's work made to wait for a mark
  std::uint64_t stream_waits = 0;           // engine streams made to wait for kdn's work
  std::uint64_t blend_ops = 0;              // GatherRows, RowDeviations, RopeShift and FromFloat calls
};

class Device {
 public:
  virtual ~Device() = default;
  // "cuda:N" or "emulated".
  virtual std::string name() const = 0;
  virtual bool emulated() const = 0;

  // n bytes of device memory, freed when the payload goes (its pointer is a
  // device address: never read it on the host). kNoMemory when out of it.
  virtual Result<chunk::Payload> Allocate(size_t n) = 0;
  virtual Status CopyToDevice(void* dst, const void* src, size_t n) = 0;
  virtual Status CopyToHost(void* dst, const void* src, size_t n) = 0;
  virtual Status CopyOnDevice(void* dst, const void* src, size_t n) = 0;

  // The kernels of kernels/kv_view.cuh: `view`'s arrays (per-layer bases,
  // block table) are host memory, as the caller described them, and the
  // elements they point to device memory; `chunk` is a canonical chunk of
  // `tokens` tokens in device memory. Check the view (kernels::view_valid)
  // first: these do not.
  virtual Status Scatter(const void* chunk, const kernels::KvView& view, std::int64_t token_begin,
                         std::int64_t tokens, std::int64_t layer_begin, std::int64_t layer_end) = 0;
  virtual Status Gather(const kernels::KvView& view, std::int64_t token_begin, std::int64_t tokens,
                        std::int64_t layer_begin, std::int64_t layer_end, void* chunk) = 0;

  // Whether the device decodes this codec's payloads itself (kdn, cachegen,
  // tc); others are decoded on the CPU and copied (Deliver does that).
  static bool DecodesOnDevice(codec::CodecId id);
  // Decodes a payload in host memory into `out` (shape.bytes() of device
  // memory, canonical layout): only for DecodesOnDevice codecs. kCorrupt for
  // a payload that does not decode (as the CPU decoder would say).
  virtual Status Decode(const codec::Shape& shape, codec::CodecId id, const std::uint8_t* payload, size_t size,
                        void* out) = 0;
  // Decodes kdn payloads in host memory all at once into device memory
  // (codec::KdnBatchJob: canonical chunks, or per-plane outputs such as an
  // engine's view): on a GPU one upload, one launch and one synchronize for
  // the lot. Each job's outcome is its status (kCorrupt for a payload that
  // does not decode, as Decode says); the return value is the device's.
  virtual Status DecodeKdnBatch(std::span<codec::KdnBatchJob> jobs) = 0;
  // Waits for the work this thread queued.
  virtual Status Synchronize() = 0;

  // The blender's work where the engine's layers run (core/blend/blend.h,
  // ComposeOnDevice; kernels/blend_rows.cuh and kernels/rope.cuh). Float
  // arrays are device memory; index arrays are the host's (they cross to
  // the device, counted in h2d_bytes).
  // dst row i = src row rows[i], rows of `width` floats.
  virtual Status GatherRows(float* dst, const float* src, std::span<const std::int32_t> rows,
                            std::int64_t width) = 0;
  // out[i] (host memory; it crosses, counted in d2h_bytes) = the sum over e
  // of (plane[plane_rows[i]][e] - saved[saved_rows[i]][e])^2, in double, in
  // ascending e (the host blend's sum). Returns once out is written.
  virtual Status RowDeviations(const float* plane, const float* saved, std::span<const std::int32_t> plane_rows,
                               std::span<const std::int32_t> saved_rows, std::int64_t width, double* out) = 0;
  // Moves float32 keys (`tokens` rows `row_stride` floats apart, kv_heads
  // heads each) by `delta` positions (kernels::launch_rope_shift);
  // kInvalidArgument for keys the spec cannot move.
  virtual Status RopeShift(const kernels::RopeSpec& spec, float* keys, std::int64_t row_stride, std::int64_t tokens,
                           int kv_heads, std::int64_t delta) = 0;
  // dst = src converted to `dtype` (0 f32, 1 f16, 2 bf16), n elements.
  virtual Status FromFloat(std::uint32_t dtype, const float* src, std::int64_t n, void* dst) = 0;

  // An engine's CUDA stream (KvGroup::engine_stream): MarkStream records
  // what it holds now (a CUDA event; null for a null stream), AfterMark
  // makes the work this thread queues from then on wait for the mark (a
  // stream wait: the host does not block), and StreamAfterUs makes what the
  // stream runs from then on wait for the work this thread queued so far. A
  // mark may be taken on one thread and waited for on another (a load op's
  // worker); it is released when the last copy goes. On the emulated device
  // work is done when queued: these only count (DeviceCounters), so tests
  // see that a call ordered itself against the engine's stream.
  using StreamMark = std::shared_ptr<void>;
  virtual Result<StreamMark> MarkStream(void* stream) = 0;
  virtual Status AfterMark(const StreamMark& mark) = 0;
  virtual Status StreamAfterUs(void* stream) = 0;

  DeviceCounters counters() const;

 protected:
  // After a batch decode: the payloads crossed, the decoded ones counted,
  // each failure stated as Decode states it.
  void CountBatch(std::span<codec::KdnBatchJob> jobs);
  std::atomic<std::uint64_t> h2d_{0}, d2h_{0}, d2d_{0}, scatters_{0}, gathers_{0}, device_decodes_{0};
  std::atomic<std::uint64_t> stream_marks_{0}, mark_waits_{0}, stream_waits_{0};
  std::atomic<std::uint64_t> blend_ops_{0};

 private:
  friend class KvStore;
  std::atomic<std::uint64_t> host_decodes_{0};
};

// Host memory standing in for a GPU's; the kernels' CPU paths.
std::shared_ptr<Device> MakeEmulatedDevice();
// The CUDA device `ordinal`; kUnsupported when this build has no CUDA or the
// machine no usable GPU.
Result<std::shared_ptr<Device>> MakeCudaDevice(int ordinal);

}  // namespace kdn::store
