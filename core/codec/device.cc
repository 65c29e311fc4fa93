// SPDX-License-Identifier: Apache-2.0
// The directory parsers mirror the CPU decoders' checks (kdn.cc's and
// cachegen.cc's Decode, in the same order; their constants are restated
// here): a payload is accepted here iff the CPU codec accepts it, which
// tests/kernels/codec_device_test.cc checks on mutated payloads.
#include "core/codec/device.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <string>

#include "core/codec/payload.h"
#include "core/codec/rans.h"
#include "kernels/common/half.h"
#include "kernels/common/kdn_quant.h"
#include "kernels/ref/codec_ref.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include <cublas_v2.h>

#include "kernels/codec.cuh"
#include "kernels/tc.cuh"
#include "core/util/dtype.h"
#endif

namespace kdn::codec {
namespace {

using internal::FitsDtype;
using internal::kHeaderBytes;

// As core/codec/kdn.cc.
constexpr std::uint32_t kKdnMaxSinks = 1024;
// As core/codec/cachegen.cc.
constexpr std::uint32_t kCacheGenStreamTokens = 256;
constexpr std::uint32_t kCacheGenMinBins = 3, kCacheGenMaxBins = 256;

std::uint32_t CacheGenScheduleBins(std::uint32_t forced, std::uint32_t layers, std::uint32_t layer, std::uint32_t kv) {
  if (forced != 0) return forced;
  if (layers < 10) return 32;
  if (kv == 0) return layer < 10 ? 32 : 16;
  return layer < 2 ? 32 : 16;
}

std::uint32_t GetU32(const std::uint8_t* p) { return kernels::kdn_read_u32(p); }
std::uint16_t GetU16(const std::uint8_t* p) { return static_cast<std::uint16_t>(kernels::codec_read_u16(p)); }
bool HalfFinite(std::uint16_t h) { return (h & 0x7C00u) != 0x7C00u; }

// The kernels count planes and channels in 32 bits (CheckShape allows more
// for degenerate shapes, e.g. one token of 2^33 channels).
Status CheckKernelRanges(std::uint64_t layers, std::uint64_t channels) {
  if (2 * layers > 0xFFFFFFFFull || channels > 0xFFFFFFFFull) {
    return Status::Unsupported("codec on a device: more than 2^32 planes or channels");
  }
  return Status::Ok();
}

// "stream g of plane p" of a failing kdn stream index.
std::string KdnStreamName(const KdnDirectory& d, std::uint32_t i) {
  return "stream " + std::to_string(i % d.groups) + " of plane " + std::to_string(i / d.groups);
}

// The directory of a batch of kdn payloads of one dtype, built from each
// job's parsed directory and the address the decoder reads its payload at
// (device memory for the kernel, the host's bytes for the emulation).
struct KdnBatch {
  std::vector<kernels::KdnBatchPlane> planes;
  std::vector<kernels::KdnBatchSegment> segments;
  std::vector<std::uint32_t> cum;
  std::vector<std::uint32_t> jobs;  // batch-local job index -> index in the caller's span
};

// Checks a job's outputs before anything is decoded.
Status CheckKdnJob(const KdnBatchJob& job) {
  if (job.planes.empty()) {
    if (job.out == nullptr && job.shape.bytes() > 0) return Status::InvalidArgument("kdn batch decode: null output");
    return Status::Ok();
  }
  const std::uint64_t C = std::uint64_t{job.shape.kv_heads} * job.shape.head_dim;
  if (job.planes.size() != 2ull * job.shape.layers || job.row < C) {
    return Status::InvalidArgument("kdn batch decode: plane outputs need 2 x layers planes and rows of >= C elements");
  }
  for (void* p : job.planes) {
    if (p == nullptr && job.shape.tokens > 0) return Status::InvalidArgument("kdn batch decode: a null plane output");
  }
  return Status::Ok();
}

void AddKdnJob(KdnBatch& b, const KdnBatchJob& job, std::uint32_t index, const KdnDirectory& d,
               const std::uint8_t* payload) {
  const Shape& sh = job.shape;
  const std::uint64_t C = std::uint64_t{sh.kv_heads} * sh.head_dim;
  const std::uint32_t local = static_cast<std::uint32_t>(b.jobs.size());
  b.jobs.push_back(index);
  const std::uint32_t cum_base = static_cast<std::uint32_t>(b.cum.size());
  b.cum.insert(b.cum.end(), d.cum.begin(), d.cum.end());
  const size_t elem = DtypeBytes(sh.dtype);
  const size_t plane_end = std::min<size_t>(job.plane_end, d.planes.size());
  for (size_t p = job.plane_begin; p < plane_end; ++p) {
    const kernels::KdnPlaneDir& pd = d.planes[p];
    kernels::KdnBatchPlane bp;
    bp.halves = payload + pd.halves;
    bp.sinks = payload + pd.sinks;
    if (job.planes.empty()) {
      bp.out = static_cast<std::uint8_t*>(job.out) + p * sh.tokens * C * elem;
      bp.row = C;
    } else {
      bp.out = job.planes[p];
      bp.row = job.row;
    }
    bp.channels = static_cast<std::uint32_t>(C);
    bp.tokens = sh.tokens;
    bp.sinks_n = d.sinks;
    bp.cum = cum_base + pd.cum;
    bp.n = pd.n;
    bp.min_code = pd.min_code;
    bp.lanes = d.lanes;
    bp.job = local;
    bp.first = b.segments.size();
    bp.count = d.groups;
    for (std::uint32_t g = 0; g < d.groups; ++g) {
      const kernels::CodecStreamDir& st = d.streams[p * d.groups + g];
      kernels::KdnBatchSegment seg;
      seg.bytes = payload + st.offset;
      seg.length = st.length;
      seg.c0 = g * d.group;
      seg.width = static_cast<std::uint32_t>(std::min<std::uint64_t>(C, seg.c0 + std::uint64_t{d.group}) - seg.c0);
      b.segments.push_back(seg);
    }
    b.planes.push_back(bp);
  }
}

// The job's status from its failed word (the lowest failing segment, batch-wide).
Status KdnJobOutcome(const KdnBatch& b, std::uint32_t local, const KdnBatchJob& job, const KdnDirectory& d,
                     std::uint32_t failed) {
  if (failed == ~0u) return Status::Ok();
  std::uint64_t first = 0;
  for (const kernels::KdnBatchPlane& p : b.planes) {
    if (p.job == local) {
      first = p.first;
      break;
    }
  }
  // The job's first segment is its first plane's first stream.
  const std::uint64_t index = failed - first + std::uint64_t{job.plane_begin} * d.groups;
  return Status::Corrupt("kdn payload: " + KdnStreamName(d, static_cast<std::uint32_t>(index)) + " does not decode");
}

kernels::CacheGenDecodeArgs CacheGenArgs(const Shape& shape, const CacheGenDirectory& d) {
  kernels::CacheGenDecodeArgs a;
  a.bins_at = d.bins_at;
  a.scales_at = d.scales_at;
  a.n_planes = 2 * shape.layers;
  a.channels = shape.kv_heads * shape.head_dim;
  a.tokens = shape.tokens;
  a.stream_tokens = d.stream_tokens;
  a.groups = d.groups;
  a.dtype = shape.dtype;
  return a;
}

// One payload as a batch of one, through `batch`.
template <typename Batch>
Status KdnDecodeOne(const Shape& shape, const std::uint8_t* data, size_t size, void* out, const Batch& batch) {
  KDN_RETURN_IF_ERROR(internal::CheckShape(shape));
  KdnBatchJob job;
  job.shape = shape;
  job.payload = data;
  job.size = size;
  job.out = out;
  KDN_RETURN_IF_ERROR(batch(std::span<KdnBatchJob>(&job, 1)));
  return job.status;
}

}  // namespace

Result<KdnDirectory> ParseKdnDirectory(const Shape& shape, const std::uint8_t* data, size_t size) {
  KDN_RETURN_IF_ERROR(internal::CheckShape(shape));
  Result<internal::Header> h = internal::ReadHeader(CodecId::kKdn, shape, data, size);
  if (!h.ok()) return h.status();
  const std::uint32_t sinks = h->param0, group = h->param1 & 0xFFFFu, lanes = h->param1 >> 16;
  if (sinks > kKdnMaxSinks || group < 1 || lanes < 1 || lanes > kernels::kKdnMaxLanes) {
    return Status::Corrupt("kdn payload: bad parameters (sinks " + std::to_string(sinks) + ", group " +
                           std::to_string(group) + ", lanes " + std::to_string(lanes) + ")");
  }
  const std::uint64_t L = shape.layers, T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
  KDN_RETURN_IF_ERROR(CheckKernelRanges(L, C));
  const std::uint64_t S = std::min<std::uint64_t>(sinks, T);
  const std::uint64_t G = (C + group - 1) / group;
  KdnDirectory d;
  d.sinks = static_cast<std::uint32_t>(S);
  d.group = group;
  d.groups = static_cast<std::uint32_t>(G);
  d.lanes = lanes;
  d.planes.resize(2 * L);
  d.streams.reserve(2 * L * G);
  std::uint64_t pos = kHeaderBytes;
  auto need = [&](std::uint64_t n, const char* what) -> Status {
    if (n > size - pos) return Status::Corrupt(std::string("kdn payload: truncated in the ") + what);
    return Status::Ok();
  };
  std::vector<float> off(C), step(C);
  for (std::uint64_t plane = 0; plane < 2 * L; ++plane) {
    kernels::KdnPlaneDir& pd = d.planes[plane];
    KDN_RETURN_IF_ERROR(need(1 + 4 * C + 2 * S * C, "plane header"));
    const std::int32_t min_code = static_cast<std::int8_t>(data[pos]);
    if (min_code < -kernels::kKdnMaxCode) return Status::Corrupt("kdn payload: min code -128");
    pd.min_code = min_code;
    pd.halves = pos + 1;
    pd.sinks = pos + 1 + 4 * C;
    const std::uint8_t* halves = data + pos + 1;
    KDN_RETURN_IF_ERROR(internal::ReadKdnScales(halves, C, plane, off.data(), step.data()));
    const std::uint8_t* sink = halves + 4 * C;
    for (std::uint64_t i = 0; i < S * C; ++i) {
      const std::uint16_t hv = GetU16(sink + 2 * i);
      if (!HalfFinite(hv)) return Status::Corrupt("kdn payload: a non-finite sink value");
      if (!FitsDtype(shape.dtype, std::fabs(kernels::half_to_float(hv)))) {
        return Status::Corrupt("kdn payload: a sink value overflows");
      }
    }
    pos += 1 + 4 * C + 2 * S * C;
    size_t consumed = 0;
    Result<rans::FreqTable> table = rans::ParseTable(std::span<const std::uint8_t>(data + pos, size - pos), &consumed);
    if (!table.ok()) return Status::Corrupt("kdn payload: " + table.status().message());
    pos += consumed;
    const std::uint32_t n = static_cast<std::uint32_t>(table->freq.size());
    if (table->scale_bits != kernels::kKdnScaleBits || min_code + static_cast<std::int32_t>(n) - 1 > kernels::kKdnMaxCode) {
      return Status::Corrupt("kdn payload: a table does not fit the codes of plane " + std::to_string(plane));
    }
    if (d.cum.size() + n + 1 > 0xFFFFFFFFull) return Status::Unsupported("kdn decode on a device: tables too large");
    pd.n = n;
    pd.cum = static_cast<std::uint32_t>(d.cum.size());
    d.cum.insert(d.cum.end(), table->cum.begin(), table->cum.end());
    KDN_RETURN_IF_ERROR(need(4 * G, "stream lengths"));
    const std::uint8_t* lengths = data + pos;
    pos += 4 * G;
    for (std::uint64_t g = 0; g < G; ++g) {
      const std::uint64_t c0 = g * group, c1 = std::min(C, c0 + group);
      // Every value a stream can decode to fits the dtype (values are linear
      // in the code: the two ends bound the rest).
      for (std::uint64_t c = c0; c < c1; ++c) {
        const float lo = kernels::kdn_dequantize(min_code, off[c], step[c]);
        const float hi = kernels::kdn_dequantize(min_code + static_cast<std::int32_t>(n) - 1, off[c], step[c]);
        if (!FitsDtype(shape.dtype, std::fmax(std::fabs(lo), std::fabs(hi)))) {
          return Status::Corrupt("kdn payload: a decoded value overflows the dtype in plane " + std::to_string(plane));
        }
      }
      const std::uint32_t len = GetU32(lengths + 4 * g);
      KDN_RETURN_IF_ERROR(need(len, "streams"));
      d.streams.push_back({pos, len});
      pos += len;
    }
  }
  if (pos != size) {
    return Status::Corrupt("kdn payload: " + std::to_string(size - pos) + " bytes after the last stream");
  }
  return d;
}

Result<CacheGenDirectory> ParseCacheGenDirectory(const Shape& shape, const std::uint8_t* data, size_t size) {
  KDN_RETURN_IF_ERROR(internal::CheckShape(shape));
  Result<internal::Header> h = internal::ReadHeader(CodecId::kCacheGen, shape, data, size);
  if (!h.ok()) return h.status();
  // The payload states its stream length; cachegen.cc writes and reads 256
  // only, and this mirrors it (the kernel itself takes any).
  if (h->param1 != kCacheGenStreamTokens) {
    return Status::Corrupt("cachegen payload: stream cap " + std::to_string(h->param1) + ", expected 256");
  }
  if (h->param0 != 0 && (h->param0 < kCacheGenMinBins || h->param0 > kCacheGenMaxBins)) {
    return Status::Corrupt("cachegen payload: bins " + std::to_string(h->param0));
  }
  const std::uint64_t L = shape.layers, T = shape.tokens, C = std::uint64_t{shape.kv_heads} * shape.head_dim;
  KDN_RETURN_IF_ERROR(CheckKernelRanges(L, C));
  const std::uint64_t n_scales = L * 2 * T, groups = (T + h->param1 - 1) / h->param1;
  const std::uint64_t n_streams = L * 2 * C * groups;
  CacheGenDirectory d;
  d.stream_tokens = h->param1;
  d.groups = static_cast<std::uint32_t>(groups);
  std::uint64_t pos = kHeaderBytes;
  auto need = [&](std::uint64_t n, const char* what) -> Status {
    if (n > size - pos) return Status::Corrupt(std::string("cachegen payload: truncated in the ") + what);
    return Status::Ok();
  };
  KDN_RETURN_IF_ERROR(need(2 * L + 4 * n_scales, "bins and scales"));
  const std::uint8_t* bins = data + pos;
  d.bins_at = pos;
  for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
    const std::uint32_t b = bins[lk] + 1u;
    if (b < kCacheGenMinBins || b != CacheGenScheduleBins(h->param0, shape.layers, static_cast<std::uint32_t>(lk / 2),
                                                          static_cast<std::uint32_t>(lk % 2))) {
      return Status::Corrupt("cachegen payload: bins " + std::to_string(b) + " at " + std::to_string(lk) +
                             " do not match the schedule");
    }
  }
  pos += 2 * L;
  d.scales_at = pos;
  const std::uint8_t* scales = data + pos;
  for (std::uint64_t b = 0; b < n_scales; ++b) {
    const float scale = kernels::codec_read_f32(scales + 4 * b);
    const float qmax = static_cast<float>(kernels::cachegen_qmax(bins[b / T]));
    if (!(scale >= 0.0f) || !FitsDtype(shape.dtype, scale * qmax)) {
      return Status::Corrupt("cachegen payload: invalid scale " + std::to_string(scale) + " at " + std::to_string(b));
    }
  }
  pos += 4 * n_scales;
  d.cum_at.resize(L * 2 * C);
  for (std::uint64_t lk = 0; lk < L * 2; ++lk) {
    const std::uint32_t A = kernels::cachegen_alphabet(bins[lk]);
    for (std::uint64_t c = 0; c < C; ++c) {
      KDN_RETURN_IF_ERROR(need((A + 7) / 8, "tables"));
      const std::uint8_t* bitmap = data + pos;
      pos += (A + 7) / 8;
      if (A % 8 != 0 && (bitmap[A / 8] >> (A % 8)) != 0) {
        return Status::Corrupt("cachegen payload: a table marks symbols beyond its alphabet");
      }
      if (d.cum.size() + A + 1 > 0xFFFFFFFFull) {
        return Status::Unsupported("cachegen decode on a device: tables too large");
      }
      d.cum_at[lk * C + c] = static_cast<std::uint32_t>(d.cum.size());
      std::uint32_t sum = 0;
      d.cum.push_back(0);
      for (std::uint32_t s = 0; s < A; ++s) {
        if ((bitmap[s / 8] >> (s % 8)) & 1u) {
          KDN_RETURN_IF_ERROR(need(2, "tables"));
          sum += kernels::codec_read_u16(data + pos) + 1u;
          pos += 2;
          if (sum > kernels::kRcTotal) return Status::Corrupt("cachegen payload: a table sums beyond 2^16");
        }
        d.cum.push_back(sum);
      }
      if (sum != (T == 0 ? 0u : kernels::kRcTotal)) {
        return Status::Corrupt("cachegen payload: a table sums to " + std::to_string(sum) + ", not 2^16");
      }
    }
  }
  KDN_RETURN_IF_ERROR(need(4 * n_streams, "stream lengths"));
  const std::uint8_t* lengths = data + pos;
  pos += 4 * n_streams;
  std::uint64_t total = 0;
  d.streams.resize(n_streams);
  for (std::uint64_t s = 0; s < n_streams; ++s) {
    const std::uint32_t len = GetU32(lengths + 4 * s);
    d.streams[s] = {pos + total, len};
    total += len;
  }
  if (total != size - pos) {
    return Status::Corrupt("cachegen payload: streams hold " + std::to_string(size - pos) + " bytes, lengths say " +
                           std::to_string(total));
  }
  return d;
}

Status KdnDecodeBatchEmulated(std::span<KdnBatchJob> jobs) {
  for (const KdnBatchJob& j : jobs) KDN_RETURN_IF_ERROR(CheckKdnJob(j));
  for (std::uint32_t dtype = 0; dtype < 3; ++dtype) {
    KdnBatch b;
    std::vector<KdnDirectory> dirs;
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].shape.dtype != dtype) continue;
      Result<KdnDirectory> d = ParseKdnDirectory(jobs[i].shape, jobs[i].payload, jobs[i].size);
      jobs[i].status = d.status();
      if (!d.ok()) continue;
      AddKdnJob(b, jobs[i], static_cast<std::uint32_t>(i), *d, jobs[i].payload);
      dirs.push_back(std::move(d).value());
    }
    if (b.jobs.empty()) continue;
    std::vector<std::uint32_t> failed(b.jobs.size(), ~0u);
    kernels::KdnBatchArgs a;
    a.planes = b.planes.data();
    a.segments = b.segments.data();
    a.cum = b.cum.data();
    a.failed = failed.data();
    a.n_planes = static_cast<std::uint32_t>(b.planes.size());
    a.dtype = dtype;
    kernels::kdn_decode_batch_ref(a);
    for (std::uint32_t k = 0; k < b.jobs.size(); ++k) {
      jobs[b.jobs[k]].status = KdnJobOutcome(b, k, jobs[b.jobs[k]], dirs[k], failed[k]);
    }
  }
  return Status::Ok();
}

Status KdnDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) {
  return KdnDecodeOne(shape, data, size, out, [](std::span<KdnBatchJob> j) { return KdnDecodeBatchEmulated(j); });
}

Status CacheGenDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) {
  Result<CacheGenDirectory> d = ParseCacheGenDirectory(shape, data, size);
  if (!d.ok()) return d.status();
  kernels::CacheGenDecodeArgs a = CacheGenArgs(shape, *d);
  a.payload = data;
  a.cum = d->cum.data();
  a.cum_at = d->cum_at.data();
  a.streams = d->streams.data();
  a.out = out;
  const std::uint32_t failed = kernels::cachegen_decode_ref(a);
  if (failed != ~0u) return Status::Corrupt("cachegen payload: stream " + std::to_string(failed) + " does not decode");
  return Status::Ok();
}

#ifndef KDN_HAVE_CUDA

bool DeviceCodecsBuilt() { return false; }

Status KdnDecodeOnDevice(const Shape&, const std::uint8_t*, size_t, void*, void*) {
  return Status::Unsupported("kdn decode on a device: this build has no CUDA kernels");
}
Status KdnDecodeBatchOnDevice(std::span<KdnBatchJob>, void*) {
  return Status::Unsupported("kdn decode on a device: this build has no CUDA kernels");
}
Status CacheGenDecodeOnDevice(const Shape&, const std::uint8_t*, size_t, void*, void*) {
  return Status::Unsupported("cachegen decode on a device: this build has no CUDA kernels");
}
Status TcDecodeOnDevice(const Shape&, const std::uint8_t*, size_t, void*, void*) {
  return Status::Unsupported("tc decode on a device: this build has no CUDA kernels");
}

#else

namespace {

Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return Status::Unsupported(std::string(what) + ": no usable CUDA device (" + cudaGetErrorString(e) + ")");
  }
  return Status::Internal(std::string(what) + ": " + cudaGetErrorString(e));
}

#define KDN_CUDA_RETURN(expr, what)                     \
  do {                                                  \
    const cudaError_t kdn_cuda_err_ = (expr);           \
    if (kdn_cuda_err_ != cudaSuccess) return CudaError(kdn_cuda_err_, what); \
  } while (0)

// One device allocation carved into aligned pieces, freed on the stream
// when it goes out of scope (after the work queued before it).
class Arena {
 public:
  explicit Arena(cudaStream_t stream) : stream_(stream) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (base_ != nullptr) (void)cudaFreeAsync(base_, stream_);
  }
  // Reserves n bytes (before Allocate); returns the piece's offset.
  std::uint64_t Reserve(std::uint64_t n) {
    const std::uint64_t at = size_;
    size_ += (n + 255) / 256 * 256;
    return at;
  }
  cudaError_t Allocate() { return size_ == 0 ? cudaSuccess : cudaMallocAsync(&base_, size_, stream_); }
  template <typename T>
  T* At(std::uint64_t offset) const {
    return reinterpret_cast<T*>(static_cast<std::uint8_t*>(base_) + offset);
  }

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
  std::uint64_t size_ = 0;
};

template <typename T>
cudaError_t Upload(const std::vector<T>& v, T* to, cudaStream_t stream) {
  if (v.empty()) return cudaSuccess;
  return cudaMemcpyAsync(to, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream);
}

}  // namespace

bool DeviceCodecsBuilt() { return true; }

Status KdnDecodeBatchOnDevice(std::span<KdnBatchJob> jobs, void* cuda_stream) {
  for (const KdnBatchJob& j : jobs) KDN_RETURN_IF_ERROR(CheckKdnJob(j));
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  std::vector<std::optional<KdnDirectory>> dirs(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    Result<KdnDirectory> d = ParseKdnDirectory(jobs[i].shape, jobs[i].payload, jobs[i].size);
    jobs[i].status = d.status();
    if (d.ok()) dirs[i].emplace(std::move(d).value());
  }
  // One arena: every payload, then per dtype the directory and the failed words.
  Arena arena(stream);
  std::vector<std::uint64_t> payload_at(jobs.size(), 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (dirs[i] && jobs[i].device_payload == nullptr) payload_at[i] = arena.Reserve(jobs[i].size);
  }
  if (std::none_of(dirs.begin(), dirs.end(), [](const auto& d) { return d.has_value(); })) return Status::Ok();
  // Per dtype: planes, segments, cumulative frequencies, jobs.
  std::uint64_t count[3][4] = {};
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!dirs[i]) continue;
    std::uint64_t* c = count[jobs[i].shape.dtype];
    c[0] += dirs[i]->planes.size();
    c[1] += dirs[i]->streams.size();
    c[2] += dirs[i]->cum.size();
    c[3] += 1;
  }
  std::uint64_t planes_at[3], segments_at[3], cum_at[3], failed_at[3];
  for (int t = 0; t < 3; ++t) {
    planes_at[t] = arena.Reserve(count[t][0] * sizeof(kernels::KdnBatchPlane));
    segments_at[t] = arena.Reserve(count[t][1] * sizeof(kernels::KdnBatchSegment));
    cum_at[t] = arena.Reserve(count[t][2] * 4);
    failed_at[t] = arena.Reserve(count[t][3] * 4);
  }
  KDN_CUDA_RETURN(arena.Allocate(), "kdn decode on a device: allocating scratch");
  KdnBatch b[3];
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!dirs[i]) continue;
    const std::uint8_t* at = jobs[i].device_payload;
    if (at == nullptr) {
      auto* up = arena.At<std::uint8_t>(payload_at[i]);
      KDN_CUDA_RETURN(cudaMemcpyAsync(up, jobs[i].payload, jobs[i].size, cudaMemcpyHostToDevice, stream),
                      "kdn decode on a device: uploading a payload");
      at = up;
    }
    AddKdnJob(b[jobs[i].shape.dtype], jobs[i], static_cast<std::uint32_t>(i), *dirs[i], at);
  }
  std::vector<std::uint32_t> failed[3];
  for (std::uint32_t t = 0; t < 3; ++t) {
    if (b[t].jobs.empty()) continue;
    kernels::KdnBatchArgs a;
    a.planes = arena.At<kernels::KdnBatchPlane>(planes_at[t]);
    a.segments = arena.At<kernels::KdnBatchSegment>(segments_at[t]);
    a.cum = arena.At<std::uint32_t>(cum_at[t]);
    a.failed = arena.At<std::uint32_t>(failed_at[t]);
    a.n_planes = static_cast<std::uint32_t>(b[t].planes.size());
    a.dtype = t;
    KDN_CUDA_RETURN(Upload(b[t].planes, arena.At<kernels::KdnBatchPlane>(planes_at[t]), stream), "kdn decode: uploading");
    KDN_CUDA_RETURN(Upload(b[t].segments, arena.At<kernels::KdnBatchSegment>(segments_at[t]), stream),
                    "kdn decode: uploading");
    KDN_CUDA_RETURN(Upload(b[t].cum, arena.At<std::uint32_t>(cum_at[t]), stream), "kdn decode: uploading");
    KDN_CUDA_RETURN(cudaMemsetAsync(a.failed, 0xFF, b[t].jobs.size() * 4, stream), "kdn decode on a device");
    KDN_CUDA_RETURN(kernels::launch_kdn_decode_batch(a, stream), "kdn decode on a device: launching");
    failed[t].resize(b[t].jobs.size());
    KDN_CUDA_RETURN(cudaMemcpyAsync(failed[t].data(), a.failed, failed[t].size() * 4, cudaMemcpyDeviceToHost, stream),
                    "kdn decode on a device");
  }
  KDN_CUDA_RETURN(cudaStreamSynchronize(stream), "kdn decode on a device");
  for (std::uint32_t t = 0; t < 3; ++t) {
    for (std::uint32_t k = 0; k < b[t].jobs.size(); ++k) {
      const std::uint32_t i = b[t].jobs[k];
      jobs[i].status = KdnJobOutcome(b[t], k, jobs[i], *dirs[i], failed[t][k]);
    }
  }
  return Status::Ok();
}

Status KdnDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                         void* cuda_stream) {
  return KdnDecodeOne(shape, payload_host, size, out_device,
                      [cuda_stream](std::span<KdnBatchJob> j) { return KdnDecodeBatchOnDevice(j, cuda_stream); });
}

Status CacheGenDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                              void* cuda_stream) {
  Result<CacheGenDirectory> d = ParseCacheGenDirectory(shape, payload_host, size);
  if (!d.ok()) return d.status();
  if (out_device == nullptr && shape.bytes() > 0) {
    return Status::InvalidArgument("cachegen decode on a device: null output");
  }
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  kernels::CacheGenDecodeArgs a = CacheGenArgs(shape, *d);
  Arena arena(stream);
  const std::uint64_t payload_at = arena.Reserve(size);
  const std::uint64_t cum_at = arena.Reserve(d->cum.size() * 4);
  const std::uint64_t cum_index_at = arena.Reserve(d->cum_at.size() * 4);
  const std::uint64_t streams_at = arena.Reserve(d->streams.size() * sizeof(kernels::CodecStreamDir));
  const std::uint64_t failed_at = arena.Reserve(4);
  KDN_CUDA_RETURN(arena.Allocate(), "cachegen decode on a device: allocating scratch");
  a.payload = arena.At<std::uint8_t>(payload_at);
  a.cum = arena.At<std::uint32_t>(cum_at);
  a.cum_at = arena.At<std::uint32_t>(cum_index_at);
  a.streams = arena.At<kernels::CodecStreamDir>(streams_at);
  a.failed = arena.At<std::uint32_t>(failed_at);
  a.out = out_device;
  KDN_CUDA_RETURN(cudaMemcpyAsync(arena.At<std::uint8_t>(payload_at), payload_host, size, cudaMemcpyHostToDevice, stream),
                  "cachegen decode on a device: uploading the payload");
  KDN_CUDA_RETURN(Upload(d->cum, arena.At<std::uint32_t>(cum_at), stream), "cachegen decode: uploading");
  KDN_CUDA_RETURN(Upload(d->cum_at, arena.At<std::uint32_t>(cum_index_at), stream), "cachegen decode: uploading");
  KDN_CUDA_RETURN(Upload(d->streams, arena.At<kernels::CodecStreamDir>(streams_at), stream),
                  "cachegen decode: uploading");
  KDN_CUDA_RETURN(cudaMemsetAsync(a.failed, 0xFF, 4, stream), "cachegen decode on a device");
  KDN_CUDA_RETURN(kernels::launch_cachegen_decode(a, stream), "cachegen decode on a device: launching");
  std::uint32_t failed = 0;
  KDN_CUDA_RETURN(cudaMemcpyAsync(&failed, a.failed, 4, cudaMemcpyDeviceToHost, stream),
                  "cachegen decode on a device");
  KDN_CUDA_RETURN(cudaStreamSynchronize(stream), "cachegen decode on a device");
  if (failed != ~0u) return Status::Corrupt("cachegen payload: stream " + std::to_string(failed) + " does not decode");
  return Status::Ok();
}

namespace {

// A cuBLAS handle for one call, bound to its stream.
class Blas {
 public:
  ~Blas() {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
  }
  Status Open(cudaStream_t stream) {
    const cublasStatus_t st = cublasCreate(&handle_);
    if (st == CUBLAS_STATUS_NOT_INITIALIZED) {
      handle_ = nullptr;  // no usable device (docs: ../shared/TOOLCHAIN.md)
      return Status::Unsupported("tc decode on a device: cuBLAS found no usable CUDA device");
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      handle_ = nullptr;
      return Status::Internal("tc decode on a device: cublasCreate failed (" + std::to_string(static_cast<int>(st)) + ")");
    }
    if (cublasSetStream(handle_, stream) != CUBLAS_STATUS_SUCCESS) return Status::Internal("cublasSetStream failed");
    return Status::Ok();
  }
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

Status TcDecodeOnDevice(const Shape& shape, const std::uint8_t* payload_host, size_t size, void* out_device,
                        void* cuda_stream) {
  Result<TcDirectory> d = ParseTcDirectory(shape, payload_host, size);
  if (!d.ok()) return d.status();
  if (out_device == nullptr && shape.bytes() > 0) return Status::InvalidArgument("tc decode on a device: null output");
  const TcProfile& pr = *d->profile;
  const std::uint32_t C = pr.channels(), T = shape.tokens, planes = shape.layers * 2;
  const std::uint64_t plane_floats = std::uint64_t{T} * C;
  const auto stream = static_cast<cudaStream_t>(cuda_stream);
  Blas blas;
  KDN_RETURN_IF_ERROR(blas.Open(stream));
  Arena arena(stream);
  const std::uint64_t payload_at = arena.Reserve(size);
  const std::uint64_t streams_at = arena.Reserve(d->streams.size() * sizeof(kernels::TcStreamDir));
  const std::uint64_t comps_at = arena.Reserve(d->comps.size() * 4);
  const std::uint64_t table_of_at = arena.Reserve(d->table_of.size() * 4);
  const std::uint64_t range_at = arena.Reserve(d->range.size() * 4);
  const std::uint64_t step_at = arena.Reserve(d->step.size() * 4);
  const std::uint64_t mean_at = arena.Reserve(d->mean.size() * 4);
  const std::uint64_t sinks_at = arena.Reserve(d->sinks_at.size() * 8);
  const std::uint64_t slots_at = arena.Reserve(pr.slots.size() * 4);
  const std::uint64_t bases_at = arena.Reserve(pr.bases.size() * 4);
  const std::uint64_t y_at = arena.Reserve(planes * plane_floats * 4);
  const std::uint64_t acc_at = arena.Reserve(planes * plane_floats * 4);
  const std::uint64_t failed_at = arena.Reserve(8);
  KDN_CUDA_RETURN(arena.Allocate(), "tc decode on a device: allocating scratch");
  KDN_CUDA_RETURN(cudaMemcpyAsync(arena.At<std::uint8_t>(payload_at), payload_host, size, cudaMemcpyHostToDevice, stream),
                  "tc decode on a device: uploading the payload");
  KDN_CUDA_RETURN(Upload(d->streams, arena.At<kernels::TcStreamDir>(streams_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(d->comps, arena.At<std::uint32_t>(comps_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(d->table_of, arena.At<std::uint32_t>(table_of_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(d->range, arena.At<std::int32_t>(range_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(d->step, arena.At<float>(step_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(d->mean, arena.At<float>(mean_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(d->sinks_at, arena.At<std::uint64_t>(sinks_at), stream), "tc decode: uploading");
  KDN_CUDA_RETURN(Upload(pr.slots, arena.At<std::uint32_t>(slots_at), stream), "tc decode: uploading the tables");
  KDN_CUDA_RETURN(Upload(pr.bases, arena.At<float>(bases_at), stream), "tc decode: uploading the bases");
  KDN_CUDA_RETURN(cudaMemsetAsync(arena.At<float>(y_at), 0, planes * plane_floats * 4, stream), "tc decode");
  KDN_CUDA_RETURN(cudaMemsetAsync(arena.At<std::uint32_t>(failed_at), 0xFF, 8, stream), "tc decode");
  kernels::TcDecodeArgs a = TcStreamScalars(shape, *d);
  a.payload = arena.At<std::uint8_t>(payload_at);
  a.streams = arena.At<kernels::TcStreamDir>(streams_at);
  a.comps = arena.At<std::uint32_t>(comps_at);
  a.table_of = arena.At<std::uint32_t>(table_of_at);
  a.range = arena.At<std::int32_t>(range_at);
  a.step = arena.At<float>(step_at);
  a.slots = arena.At<std::uint32_t>(slots_at);
  a.y = arena.At<float>(y_at);
  a.failed = arena.At<std::uint32_t>(failed_at);
  KDN_CUDA_RETURN(kernels::launch_tc_streams(a, stream), "tc decode on a device: launching the streams");
  // acc (row-major T x C per plane) = y B^T: column-major, acc^T (C x T) =
  // B (C x C) y^T (C x T), and the row-major basis read column-major is
  // B^T, hence op(A) = transpose.
  if (plane_floats > 0) {
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t st = cublasSgemmStridedBatched(
        blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(C), static_cast<int>(T), static_cast<int>(C), &one,
        arena.At<float>(bases_at), static_cast<int>(C), static_cast<long long>(C) * C, arena.At<float>(y_at),
        static_cast<int>(C), static_cast<long long>(plane_floats), &zero, arena.At<float>(acc_at), static_cast<int>(C),
        static_cast<long long>(plane_floats), static_cast<int>(planes));
    if (st != CUBLAS_STATUS_SUCCESS) {
      return Status::Internal("tc decode on a device: cublasSgemmStridedBatched failed (" +
                              std::to_string(static_cast<int>(st)) + ")");
    }
  }
  kernels::TcFinishArgs f = TcFinishScalars(shape, *d);
  f.payload = a.payload;
  f.sinks_at = arena.At<std::uint64_t>(sinks_at);
  f.mean = arena.At<float>(mean_at);
  f.acc = arena.At<float>(acc_at);
  f.out = out_device;
  f.failed = arena.At<std::uint32_t>(failed_at) + 1;
  KDN_CUDA_RETURN(kernels::launch_tc_finish(f, stream), "tc decode on a device: launching the finish");
  std::uint32_t failed[2] = {0, 0};
  KDN_CUDA_RETURN(cudaMemcpyAsync(failed, a.failed, 8, cudaMemcpyDeviceToHost, stream), "tc decode on a device");
  KDN_CUDA_RETURN(cudaStreamSynchronize(stream), "tc decode on a device");
  if (failed[0] != ~0u) return Status::Corrupt("tc payload: stream " + std::to_string(failed[0]) + " does not decode");
  if (failed[1] != ~0u) return Status::Corrupt("tc payload: values overflow the dtype");
  return Status::Ok();
}

#undef KDN_CUDA_RETURN

#endif  // KDN_HAVE_CUDA

}  // namespace kdn::codec
