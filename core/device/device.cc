// SPDX-License-Identifier: Apache-2.0
#include "core/device/device.h"

#include <cstring>
#include <new>
#include <vector>

#include "core/codec/device.h"
#include "kernels/ref/blend_rows_ref.h"
#include "kernels/ref/kv_view_ref.h"
#include "kernels/ref/rope_ref.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/blend_rows.cuh"
#include "kernels/kv_view.cuh"
#include "kernels/rope.cuh"
#endif

namespace kdn::store {

DeviceCounters Device::counters() const {
  DeviceCounters c;
  c.h2d_bytes = h2d_;
  c.d2h_bytes = d2h_;
  c.d2d_bytes = d2d_;
  c.scatters = scatters_;
  c.gathers = gathers_;
  c.device_decodes = device_decodes_;
  c.host_decodes = host_decodes_;
  c.stream_marks = stream_marks_;
  c.mark_waits = mark_waits_;
  c.stream_waits = stream_waits_;
  c.blend_ops = blend_ops_;
  return c;
}

bool Device::DecodesOnDevice(codec::CodecId id) {
  return id == codec::CodecId::kKdn || id == codec::CodecId::kCacheGen || id == codec::CodecId::kTc;
}

namespace {

// A decoder's failure as the store treats it: out of memory stays so, any
// other failure makes the chunk unreadable (a miss), as DecodeChunk says.
Status AsDecodeStatus(codec::CodecId id, const Status& st) {
  if (st.ok() || st.code() == Code::kNoMemory) return st;
  return Status::Corrupt("device decode of codec " + std::to_string(static_cast<std::uint32_t>(id)) + ": " +
                         st.message());
}

}  // namespace

void Device::CountBatch(std::span<codec::KdnBatchJob> jobs) {
  for (codec::KdnBatchJob& j : jobs) {
    h2d_ += j.size;  // the payload crosses, not the canonical KV
    if (j.status.ok()) ++device_decodes_;
    j.status = AsDecodeStatus(codec::CodecId::kKdn, j.status);
  }
}

namespace {

class EmulatedDevice final : public Device {
 public:
  std::string name() const override { return "emulated"; }
  bool emulated() const override { return true; }

  Result<chunk::Payload> Allocate(size_t n) override {
    try {
      return chunk::Payload::Uninitialized(n);
    } catch (const std::bad_alloc&) {
      return Status(Code::kNoMemory, "emulated device: out of memory for " + std::to_string(n) + " bytes");
    }
  }
  Status CopyToDevice(void* dst, const void* src, size_t n) override {
    if (n != 0) std::memcpy(dst, src, n);
    h2d_ += n;
    return Status::Ok();
  }
  Status CopyToHost(void* dst, const void* src, size_t n) override {
    if (n != 0) std::memcpy(dst, src, n);
    d2h_ += n;
    return Status::Ok();
  }
  Status CopyOnDevice(void* dst, const void* src, size_t n) override {
    if (n != 0 && dst != src) std::memcpy(dst, src, n);
    d2d_ += n;
    return Status::Ok();
  }
  Status Scatter(const void* chunk, const kernels::KvView& view, std::int64_t token_begin, std::int64_t tokens,
                 std::int64_t layer_begin, std::int64_t layer_end) override {
    Emulate(view, const_cast<void*>(chunk), token_begin, tokens, layer_begin, layer_end, false);
    ++scatters_;
    return Status::Ok();
  }
  Status Gather(const kernels::KvView& view, std::int64_t token_begin, std::int64_t tokens, std::int64_t layer_begin,
                std::int64_t layer_end, void* chunk) override {
    Emulate(view, chunk, token_begin, tokens, layer_begin, layer_end, true);
    ++gathers_;
    return Status::Ok();
  }
  Status Decode(const codec::Shape& shape, codec::CodecId id, const std::uint8_t* payload, size_t size,
                void* out) override {
    auto* o = static_cast<std::uint8_t*>(out);
    Status st;
    switch (id) {
      case codec::CodecId::kKdn: st = codec::KdnDecodeEmulated(shape, payload, size, o); break;
      case codec::CodecId::kCacheGen: st = codec::CacheGenDecodeEmulated(shape, payload, size, o); break;
      case codec::CodecId::kTc: st = codec::TcDecodeEmulated(shape, payload, size, o); break;
      default:
        return Status::Unsupported("codec " + std::to_string(static_cast<std::uint32_t>(id)) +
                                   " has no device decode");
    }
    h2d_ += size;  // the payload crosses, not the canonical KV
    if (st.ok()) ++device_decodes_;
    return AsDecodeStatus(id, st);
  }
  Status DecodeKdnBatch(std::span<codec::KdnBatchJob> jobs) override {
    KDN_RETURN_IF_ERROR(codec::KdnDecodeBatchEmulated(jobs));
    CountBatch(jobs);
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }
  Status GatherRows(float* dst, const float* src, std::span<const std::int32_t> rows, std::int64_t width) override {
    kernels::gather_rows_cpu(dst, src, rows.data(), static_cast<std::int64_t>(rows.size()), width);
    h2d_ += rows.size_bytes();
    ++blend_ops_;
    return Status::Ok();
  }
  Status RowDeviations(const float* plane, const float* saved, std::span<const std::int32_t> plane_rows,
                       std::span<const std::int32_t> saved_rows, std::int64_t width, double* out) override {
    if (plane_rows.size() != saved_rows.size()) return Status::InvalidArgument("row deviations: unequal row lists");
    kernels::row_deviations_cpu(plane, saved, plane_rows.data(), saved_rows.data(),
                                static_cast<std::int64_t>(plane_rows.size()), width, out);
    h2d_ += plane_rows.size_bytes() + saved_rows.size_bytes();
    d2h_ += plane_rows.size() * sizeof(double);
    ++blend_ops_;
    return Status::Ok();
  }
  Status RopeShift(const kernels::RopeSpec& spec, float* keys, std::int64_t row_stride, std::int64_t tokens,
                   int kv_heads, std::int64_t delta) override {
    if (!kernels::rope_shift_cpu(spec, kernels::KeyType::kF32, keys, row_stride, tokens, kv_heads, delta)) {
      return Status::InvalidArgument("rope shift: keys the spec cannot move");
    }
    ++blend_ops_;
    return Status::Ok();
  }
  Status FromFloat(std::uint32_t dtype, const float* src, std::int64_t n, void* dst) override {
    if (dtype > 2) return Status::InvalidArgument("from float: unknown dtype");
    kernels::float_to_dtype_cpu(dtype, src, dst, n);
    ++blend_ops_;
    return Status::Ok();
  }
  // Work here is done when queued: nothing to wait for, only counted. A
  // mark stands for the stream it was taken on (never dereferenced).
  Result<StreamMark> MarkStream(void* stream) override {
    if (stream == nullptr) return StreamMark();
    ++stream_marks_;
    return StreamMark(stream, [](void*) {});
  }
  Status AfterMark(const StreamMark& mark) override {
    if (mark) ++mark_waits_;
    return Status::Ok();
  }
  Status StreamAfterUs(void* stream) override {
    if (stream != nullptr) ++stream_waits_;
    return Status::Ok();
  }

 private:
  // The view kernels' own work items, run on the CPU (kernels/common/kv_rows.h).
  static void Emulate(const kernels::KvView& view, void* chunk, std::int64_t token_begin, std::int64_t tokens,
                      std::int64_t layer_begin, std::int64_t layer_end, bool to_chunk) {
    kernels::KvViewArgs a;
    a.view = view;
    a.chunk = chunk;
    a.token_begin = token_begin;
    a.tokens = tokens;
    a.layer_begin = layer_begin;
    a.layer_end = layer_end;
    a.base_alignment = kernels::view_base_alignment(view);
    kernels::view_copy_emulated(a, to_chunk);
  }
};

#ifdef KDN_HAVE_CUDA

Status CudaFailed(const char* what, cudaError_t e) {
  if (e == cudaErrorMemoryAllocation) return Status(Code::kNoMemory, std::string(what) + ": out of device memory");
  return Status(Code::kInternal, std::string(what) + ": " + cudaGetErrorString(e));
}

#define KDN_CUDA_OR_RETURN(what, expr)                      \
  do {                                                      \
    const cudaError_t kdn_cuda_e_ = (expr);                 \
    if (kdn_cuda_e_ != cudaSuccess) return CudaFailed(what, kdn_cuda_e_); \
  } while (0)

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}
  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  bool emulated() const override { return false; }

  Result<chunk::Payload> Allocate(size_t n) override {
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    void* p = nullptr;
    KDN_CUDA_OR_RETURN("cudaMalloc", cudaMalloc(&p, n == 0 ? 1 : n));
    const int ordinal = ordinal_;
    std::shared_ptr<void> owner(p, [ordinal](void* q) {
      (void)cudaSetDevice(ordinal);
      (void)cudaFree(q);  // synchronizes: no kernel still reads it
    });
    return chunk::Payload::Adopt(static_cast<std::uint8_t*>(p), n, std::move(owner));
  }
  Status CopyToDevice(void* dst, const void* src, size_t n) override {
    return Copy(dst, src, n, cudaMemcpyHostToDevice, h2d_);
  }
  Status CopyToHost(void* dst, const void* src, size_t n) override {
    KDN_RETURN_IF_ERROR(Copy(dst, src, n, cudaMemcpyDeviceToHost, d2h_));
    return Synchronize();  // the host reads it next
  }
  Status CopyOnDevice(void* dst, const void* src, size_t n) override {
    return Copy(dst, src, n, cudaMemcpyDeviceToDevice, d2d_);
  }
  Status Scatter(const void* chunk, const kernels::KvView& view, std::int64_t token_begin, std::int64_t tokens,
                 std::int64_t layer_begin, std::int64_t layer_end) override {
    KDN_RETURN_IF_ERROR(Launch(view, const_cast<void*>(chunk), token_begin, tokens, layer_begin, layer_end, true));
    ++scatters_;
    return Status::Ok();
  }
  Status Gather(const kernels::KvView& view, std::int64_t token_begin, std::int64_t tokens, std::int64_t layer_begin,
                std::int64_t layer_end, void* chunk) override {
    KDN_RETURN_IF_ERROR(Launch(view, chunk, token_begin, tokens, layer_begin, layer_end, false));
    ++gathers_;
    return Status::Ok();
  }
  Status Decode(const codec::Shape& shape, codec::CodecId id, const std::uint8_t* payload, size_t size,
                void* out) override {
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    void* stream = cudaStreamPerThread;
    Status st;
    switch (id) {
      case codec::CodecId::kKdn: st = codec::KdnDecodeOnDevice(shape, payload, size, out, stream); break;
      case codec::CodecId::kCacheGen: st = codec::CacheGenDecodeOnDevice(shape, payload, size, out, stream); break;
      case codec::CodecId::kTc: st = codec::TcDecodeOnDevice(shape, payload, size, out, stream); break;
      default:
        return Status::Unsupported("codec " + std::to_string(static_cast<std::uint32_t>(id)) +
                                   " has no device decode");
    }
    h2d_ += size;
    if (st.ok()) ++device_decodes_;
    if (st.code() == Code::kInternal || st.code() == Code::kUnsupported) return st;  // the device, not the bytes
    return AsDecodeStatus(id, st);
  }
  Status DecodeKdnBatch(std::span<codec::KdnBatchJob> jobs) override {
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    KDN_RETURN_IF_ERROR(codec::KdnDecodeBatchOnDevice(jobs, cudaStreamPerThread));
    CountBatch(jobs);
    return Status::Ok();
  }
  Status Synchronize() override {
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    KDN_CUDA_OR_RETURN("cudaStreamSynchronize", cudaStreamSynchronize(cudaStreamPerThread));
    return Status::Ok();
  }
  Status GatherRows(float* dst, const float* src, std::span<const std::int32_t> rows, std::int64_t width) override {
    if (rows.empty() || width == 0) return Status::Ok();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    const cudaStream_t stream = cudaStreamPerThread;
    void* idx = nullptr;
    KDN_CUDA_OR_RETURN("cudaMallocAsync", cudaMallocAsync(&idx, rows.size_bytes(), stream));
    cudaError_t e = cudaMemcpyAsync(idx, rows.data(), rows.size_bytes(), cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) {
      e = kernels::launch_gather_rows(dst, src, static_cast<const std::int32_t*>(idx),
                                      static_cast<std::int64_t>(rows.size()), width, stream);
    }
    (void)cudaFreeAsync(idx, stream);
    KDN_CUDA_OR_RETURN("gather rows", e);
    h2d_ += rows.size_bytes();
    ++blend_ops_;
    return Status::Ok();
  }
  Status RowDeviations(const float* plane, const float* saved, std::span<const std::int32_t> plane_rows,
                       std::span<const std::int32_t> saved_rows, std::int64_t width, double* out) override {
    if (plane_rows.size() != saved_rows.size()) return Status::InvalidArgument("row deviations: unequal row lists");
    const size_t n = plane_rows.size();
    if (n == 0) return Status::Ok();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    const cudaStream_t stream = cudaStreamPerThread;
    // One scratch: both index lists, then the n sums (8-byte aligned).
    const size_t idx_bytes = (2 * n * sizeof(std::int32_t) + 7) / 8 * 8;
    void* scratch = nullptr;
    KDN_CUDA_OR_RETURN("cudaMallocAsync", cudaMallocAsync(&scratch, idx_bytes + n * sizeof(double), stream));
    auto* prow = static_cast<std::int32_t*>(scratch);
    auto* dsum = reinterpret_cast<double*>(static_cast<char*>(scratch) + idx_bytes);
    cudaError_t e = cudaMemcpyAsync(prow, plane_rows.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(prow + n, saved_rows.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream);
    }
    if (e == cudaSuccess) {
      e = kernels::launch_row_deviations(plane, saved, prow, prow + n, static_cast<std::int64_t>(n), width, dsum,
                                         stream);
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(out, dsum, n * sizeof(double), cudaMemcpyDeviceToHost, stream);
    (void)cudaFreeAsync(scratch, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);  // the host reads out next
    KDN_CUDA_OR_RETURN("row deviations", e);
    h2d_ += 2 * n * sizeof(std::int32_t);
    d2h_ += n * sizeof(double);
    ++blend_ops_;
    return Status::Ok();
  }
  Status RopeShift(const kernels::RopeSpec& spec, float* keys, std::int64_t row_stride, std::int64_t tokens,
                   int kv_heads, std::int64_t delta) override {
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    kernels::RopeRepositionArgs a;
    a.spec = spec;
    a.type = kernels::KeyType::kF32;
    a.keys = keys;
    a.row_stride = row_stride;
    a.tokens = tokens;
    a.kv_heads = kv_heads;
    a.delta = delta;
    const cudaError_t e = kernels::launch_rope_shift(a, cudaStreamPerThread);
    if (e == cudaErrorInvalidValue) return Status::InvalidArgument("rope shift: keys the spec cannot move");
    KDN_CUDA_OR_RETURN("rope shift", e);
    ++blend_ops_;
    return Status::Ok();
  }
  Status FromFloat(std::uint32_t dtype, const float* src, std::int64_t n, void* dst) override {
    if (dtype > 2) return Status::InvalidArgument("from float: unknown dtype");
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    KDN_CUDA_OR_RETURN("float to dtype", kernels::launch_float_to_dtype(dtype, src, dst, n, cudaStreamPerThread));
    ++blend_ops_;
    return Status::Ok();
  }
  Result<StreamMark> MarkStream(void* stream) override {
    if (stream == nullptr) return StreamMark();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    cudaEvent_t e = nullptr;
    KDN_CUDA_OR_RETURN("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    StreamMark mark(e, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
    KDN_CUDA_OR_RETURN("cudaEventRecord", cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
    ++stream_marks_;
    return mark;
  }
  Status AfterMark(const StreamMark& mark) override {
    if (!mark) return Status::Ok();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    KDN_CUDA_OR_RETURN("cudaStreamWaitEvent",
                       cudaStreamWaitEvent(cudaStreamPerThread, static_cast<cudaEvent_t>(mark.get()), 0));
    ++mark_waits_;
    return Status::Ok();
  }
  Status StreamAfterUs(void* stream) override {
    if (stream == nullptr) return Status::Ok();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    cudaEvent_t e = nullptr;
    KDN_CUDA_OR_RETURN("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    // Destroying a recorded event that a stream waits for is allowed: its
    // resources go once it has completed.
    const cudaError_t rec = cudaEventRecord(e, cudaStreamPerThread);
    const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), e, 0) : rec;
    cudaEventDestroy(e);
    KDN_CUDA_OR_RETURN("cudaEventRecord / cudaStreamWaitEvent", wait);
    ++stream_waits_;
    return Status::Ok();
  }

 private:
  Status Copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, std::atomic<std::uint64_t>& counter) {
    if (n == 0) return Status::Ok();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    KDN_CUDA_OR_RETURN("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, n, kind, cudaStreamPerThread));
    counter += n;
    return Status::Ok();
  }
  // The view's arrays go to the device (stream-ordered scratch, freed after
  // the kernel), then the gather or scatter kernel runs.
  Status Launch(const kernels::KvView& view, void* chunk, std::int64_t token_begin, std::int64_t tokens,
                std::int64_t layer_begin, std::int64_t layer_end, bool scatter) {
    if (tokens <= 0 || layer_begin >= layer_end) return Status::Ok();
    KDN_CUDA_OR_RETURN("cudaSetDevice", cudaSetDevice(ordinal_));
    const cudaStream_t stream = cudaStreamPerThread;
    const auto layers = static_cast<size_t>(view.shape.layers);
    std::vector<void*> bases(2 * layers);
    for (size_t l = 0; l < layers; ++l) {
      bases[l] = view.k_base[l];
      bases[layers + l] = view.v_base[l];
    }
    const size_t table = view.paged ? static_cast<size_t>(view.table_len) : 0;
    const size_t bytes = bases.size() * sizeof(void*) + table * sizeof(std::int32_t);
    void* scratch = nullptr;
    KDN_CUDA_OR_RETURN("cudaMallocAsync", cudaMallocAsync(&scratch, bytes, stream));
    auto* dev_bases = static_cast<void**>(scratch);
    auto* dev_table = reinterpret_cast<std::int32_t*>(dev_bases + bases.size());
    cudaError_t e = cudaMemcpyAsync(dev_bases, bases.data(), bases.size() * sizeof(void*), cudaMemcpyHostToDevice, stream);
    if (e == cudaSuccess && table != 0) {
      e = cudaMemcpyAsync(dev_table, view.block_table, table * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream);
    }
    if (e == cudaSuccess) {
      kernels::KvViewArgs a;
      a.view = view;
      a.view.k_base = dev_bases;
      a.view.v_base = dev_bases + layers;
      a.view.block_table = table != 0 ? dev_table : nullptr;
      a.chunk = chunk;
      a.token_begin = token_begin;
      a.tokens = tokens;
      a.layer_begin = layer_begin;
      a.layer_end = layer_end;
      a.base_alignment = kernels::view_base_alignment(view);  // the host view: same base addresses
      e = scatter ? kernels::launch_view_scatter(a, stream) : kernels::launch_view_gather(a, stream);
    }
    (void)cudaFreeAsync(scratch, stream);
    if (e != cudaSuccess) return CudaFailed(scatter ? "view scatter" : "view gather", e);
    return Status::Ok();
  }

  const int ordinal_;
};

#endif  // KDN_HAVE_CUDA

}  // namespace

std::shared_ptr<Device> MakeEmulatedDevice() { return std::make_shared<EmulatedDevice>(); }

Result<std::shared_ptr<Device>> MakeCudaDevice(int ordinal) {
#ifdef KDN_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
    return Status::Unsupported("no usable CUDA device (use the emulated device on a machine without a GPU)");
  }
  if (ordinal < 0 || ordinal >= n) {
    return Status::InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                   std::to_string(n) + " present)");
  }
  return std::shared_ptr<Device>(std::make_shared<CudaDevice>(ordinal));
#else
  (void)ordinal;
  return Status::Unsupported("this build has no CUDA (use the emulated device)");
#endif
}

}  // namespace kdn::store
