// SPDX-License-Identifier: Apache-2.0
// The codec kernels: each is a grid-stride loop over one per-thread work
// function of common/codec_device_math.h (which thread does what is stated
// there and in codec.cuh), or, for kdn's batched decode, a block per plane
// whose lane groups call the per-lane functions of common/kdn_batch.h; the
// launchers check the scalars and launch.
#include "kernels/codec.cuh"

#include <cstdint>
#include <type_traits>

namespace kdn::kernels {
namespace {

constexpr unsigned kThreads = 256;       // element kernels
constexpr unsigned kStreamThreads = 64;  // one long-running thread per stream: spread them over the SMs
constexpr unsigned kWarp = 32;
constexpr unsigned kMaxGrid = 65535;
static_assert(kThreads % kWarp == 0 && kStreamThreads % kWarp == 0, "whole warps");
// Kernels take their arguments by value.
static_assert(std::is_trivially_copyable_v<KdnQuantizeArgs> && sizeof(KdnQuantizeArgs) <= 4096, "kernel parameter");
static_assert(std::is_trivially_copyable_v<KdnEncodeArgs> && sizeof(KdnEncodeArgs) <= 4096, "kernel parameter");
static_assert(std::is_trivially_copyable_v<CacheGenDecodeArgs> && sizeof(CacheGenDecodeArgs) <= 4096, "kernel parameter");
static_assert(std::is_trivially_copyable_v<CacheGenQuantizeArgs> && sizeof(CacheGenQuantizeArgs) <= 4096,
              "kernel parameter");
static_assert(std::is_trivially_copyable_v<CacheGenEncodeArgs> && sizeof(CacheGenEncodeArgs) <= 4096,
              "kernel parameter");
// The directory the host uploads as arrays of these (core/codec/device.cc).
static_assert(std::is_trivially_copyable_v<KdnBatchArgs> && sizeof(KdnBatchArgs) <= 4096, "kernel parameter");
static_assert(sizeof(KdnPlaneDir) == 32 && sizeof(CodecStreamDir) == 16 && sizeof(KdnCoding) == 16, "layouts");
// A slot entry packs a symbol in 8 bits, start and freq - 1 in 12 each.
static_assert(kKdnScaleBits == 12 && kKdnLutStride == 256, "slot entry layout");

unsigned GridFor(std::uint64_t n, unsigned threads) {
  const std::uint64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < kMaxGrid ? blocks : kMaxGrid);
}

__device__ std::uint64_t ThreadIndex() { return std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ std::uint64_t ThreadCount() { return std::uint64_t{gridDim.x} * blockDim.x; }

// ---- kdn batched decode (common/kdn_batch.h)

constexpr unsigned kBatchThreads = 256;  // 8 warps: with 8 lanes a stream, 32 streams (a 1,024-channel plane) at once
constexpr unsigned kFullMask = 0xFFFFFFFFu;

// Block b takes planes b, b + gridDim.x, ...: the plane's slot table into
// shared memory and its sink tokens (every thread), then its streams, 32 /
// lanes of them per warp, each by `lanes` consecutive lanes in step. A lane
// whose word lies past its stream stops; its group's streams end checked
// together (every state back at kKdnRansLow, every word consumed), and the
// group's first lane reports a failure.
template <typename E>
__global__ void __launch_bounds__(kBatchThreads) KdnBatchKernel(const KdnBatchArgs a) {
  __shared__ std::uint32_t slots[kKdnSlots];
  const unsigned lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  for (std::uint32_t pi = blockIdx.x; pi < a.n_planes; pi += gridDim.x) {
    const KdnBatchPlane p = a.planes[pi];
    __syncthreads();  // the previous plane's streams are done with the table
    for (std::uint32_t k = threadIdx.x; k < kKdnSlots; k += blockDim.x) slots[k] = kdn_batch_slot(a, p, k);
    for (std::uint64_t e = threadIdx.x; e < kdn_batch_sink_elements(p); e += blockDim.x) kdn_batch_sink<E>(a, p, e);
    __syncthreads();
    const std::uint32_t L = p.lanes, per_warp = kWarp / L, sub = lane / L, j = lane % L;
    const unsigned group_mask = sub < per_warp ? (L == kWarp ? kFullMask : ((1u << L) - 1u) << (sub * L)) : 0u;
    const unsigned below_mask = (1u << lane) - 1u;
    const std::uint32_t per_round = warps * per_warp;
    for (std::uint32_t r = 0; r * per_round < p.count; ++r) {
      const std::uint32_t g = r * per_round + warp * per_warp + sub;
      const bool mine = sub < per_warp && g < p.count;
      KdnBatchSegment s;
      KdnLane l;
      bool ok = false;
      const std::uint8_t* words = nullptr;
      const std::uint8_t* end = nullptr;
      std::uint64_t symbols = 0, steps = 0;
      if (mine) {
        s = a.segments[p.first + g];
        ok = kdn_lane_begin(p, s, j, l);
        words = kdn_segment_words(p, s);
        end = s.bytes + s.length;
        symbols = kdn_segment_symbols(p, s);
        steps = kdn_segment_steps(p, s);
      }
      for (unsigned o = kWarp / 2; o > 0; o /= 2) {  // the warp steps as long as its longest stream
        const unsigned long long other = __shfl_xor_sync(kFullMask, static_cast<unsigned long long>(steps), o);
        steps = other > steps ? other : steps;
      }
      for (std::uint64_t k = 0; k < steps; ++k) {
        const bool need = ok && k * L + j < symbols && kdn_lane_decode<E>(a, p, s, slots, l);
        const unsigned ballot = __ballot_sync(kFullMask, need) & group_mask;
        if (need) ok = kdn_lane_refill(l, words, end, static_cast<std::uint32_t>(__popc(ballot & below_mask)));
        if (mine) {
          words += 2 * __popc(ballot);
          kdn_lane_next(p, s, l);
        }
      }
      const bool lane_ok = !mine || (ok && kdn_lane_end(l) && words == end);
      const bool group_ok = (__ballot_sync(kFullMask, !lane_ok) & group_mask) == 0;
      if (mine && j == 0 && !group_ok) atomicMin(a.failed + p.job, codec_index32(p.first + g));
    }
  }
}

// ---- kdn encode

__global__ void KdnCodeRangeInitKernel(const KdnQuantizeArgs a) {
  for (std::uint64_t p = ThreadIndex(); p < a.n_planes; p += ThreadCount()) kdn_code_range_init(a, p);
}

// Block row blockIdx.y takes planes blockIdx.y, + gridDim.y, ...; within a
// plane, the x threads stride over its elements, fold their codes into a
// range, reduce it over the warp, and lane 0 folds it into the plane's.
__global__ void KdnQuantizeKernel(const KdnQuantizeArgs a) {
  const std::uint64_t per_plane = std::uint64_t{a.tokens - a.sinks} * a.channels;
  for (std::uint64_t p = blockIdx.y; p < a.n_planes; p += gridDim.y) {
    std::int32_t lo = kKdnMaxCode, hi = -kKdnMaxCode;
    for (std::uint64_t e = ThreadIndex(); e < per_plane; e += ThreadCount()) {
      const std::int32_t q = kdn_quantize_work(a, p * per_plane + e);
      lo = q < lo ? q : lo;
      hi = q > hi ? q : hi;
    }
    for (unsigned o = kWarp / 2; o > 0; o /= 2) {
      const std::int32_t olo = __shfl_xor_sync(0xFFFFFFFFu, lo, o), ohi = __shfl_xor_sync(0xFFFFFFFFu, hi, o);
      lo = olo < lo ? olo : lo;
      hi = ohi > hi ? ohi : hi;
    }
    if (threadIdx.x % kWarp == 0 && lo <= hi) {
      atomicMin(a.code_min + p, lo);
      atomicMax(a.code_max + p, hi);
    }
  }
}

__global__ void KdnEncodeKernel(const KdnEncodeArgs a) {
  for (std::uint64_t i = ThreadIndex(); i < kdn_encode_threads(a); i += ThreadCount()) kdn_encode_work(a, i);
}

// ---- cachegen

template <typename E>
__global__ void CacheGenStreamKernel(const CacheGenDecodeArgs a) {
  for (std::uint64_t i = ThreadIndex(); i < cachegen_stream_threads(a); i += ThreadCount()) {
    if (!cachegen_stream_work<E>(a, i)) atomicMin(a.failed, codec_index32(i));
  }
}

// Warp w takes rows w, w + warps, ...: its lanes split the row's channels
// for the absmax (exact whatever the split), all lanes take the reduced
// scale, lane 0 stores it, and the lanes quantize the channels they read.
__global__ void CacheGenQuantizeKernel(const CacheGenQuantizeArgs a) {
  const unsigned lane = threadIdx.x % kWarp;
  const std::uint64_t warps = ThreadCount() / kWarp;
  for (std::uint64_t row = ThreadIndex() / kWarp; row < cachegen_rows(a); row += warps) {
    bool finite = true;
    float m = cachegen_absmax_part(a, row, lane, kWarp, finite);
    for (unsigned o = kWarp / 2; o > 0; o /= 2) {
      const float other = __shfl_xor_sync(0xFFFFFFFFu, m, o);
      m = other > m ? other : m;
    }
    finite = __all_sync(0xFFFFFFFFu, finite);
    const float scale = cachegen_row_scale(a, row, m);
    if (lane == 0) {
      a.scales[row] = scale;
      if (!finite) atomicMin(a.failed, codec_index32(row));
    }
    for (std::uint64_t c = lane; c < a.channels; c += kWarp) cachegen_quantize_work(a, row, c, scale);
  }
}

__global__ void CacheGenEncodeKernel(const CacheGenEncodeArgs a) {
  for (std::uint64_t i = ThreadIndex(); i < cachegen_encode_threads(a); i += ThreadCount()) cachegen_encode_work(a, i);
}

std::uint64_t CeilDiv(std::uint64_t n, std::uint64_t d) { return (n + d - 1) / d; }

}  // namespace

cudaError_t launch_kdn_decode_batch(const KdnBatchArgs& a, cudaStream_t stream) {
  if (a.dtype > 2) return cudaErrorInvalidValue;
  if (a.n_planes == 0) return cudaSuccess;
  if (a.planes == nullptr || a.segments == nullptr || a.cum == nullptr || a.failed == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = a.n_planes < (1u << 20) ? a.n_planes : (1u << 20);
  if (a.dtype == 0) {
    KdnBatchKernel<float><<<grid, kBatchThreads, 0, stream>>>(a);
  } else {
    KdnBatchKernel<std::uint16_t><<<grid, kBatchThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_kdn_quantize(const KdnQuantizeArgs& a, cudaStream_t stream) {
  if (a.dtype > 2 || a.sinks > a.tokens) return cudaErrorInvalidValue;
  if (a.n_planes == 0) return cudaSuccess;
  if (a.code_min == nullptr || a.code_max == nullptr) return cudaErrorInvalidValue;
  const std::uint64_t per_plane = std::uint64_t{a.tokens - a.sinks} * a.channels;
  if (per_plane > 0 && (a.kv == nullptr || a.off == nullptr || a.step == nullptr || a.codes == nullptr)) {
    return cudaErrorInvalidValue;
  }
  KdnCodeRangeInitKernel<<<GridFor(a.n_planes, kThreads), kThreads, 0, stream>>>(a);
  if (per_plane > 0) {
    const dim3 grid(GridFor(per_plane, kThreads), a.n_planes < kMaxGrid ? a.n_planes : kMaxGrid);
    KdnQuantizeKernel<<<grid, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_kdn_encode(const KdnEncodeArgs& a, cudaStream_t stream) {
  if (a.lanes < 1 || a.lanes > kKdnMaxLanes || a.group < 1 || a.groups != CeilDiv(a.channels, a.group)) {
    return cudaErrorInvalidValue;
  }
  if (kdn_encode_threads(a) == 0) return cudaSuccess;
  if (a.min_code == nullptr || a.coding == nullptr || a.words == nullptr || a.bytes == nullptr ||
      (a.coded_tokens > 0 && a.codes == nullptr)) {
    return cudaErrorInvalidValue;
  }
  KdnEncodeKernel<<<GridFor(kdn_encode_threads(a), kStreamThreads), kStreamThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_cachegen_decode(const CacheGenDecodeArgs& a, cudaStream_t stream) {
  if (a.dtype > 2 || a.stream_tokens < 1 || a.groups != CeilDiv(a.tokens, a.stream_tokens)) {
    return cudaErrorInvalidValue;
  }
  if (cachegen_stream_threads(a) == 0) return cudaSuccess;
  if (a.payload == nullptr || a.cum == nullptr || a.cum_at == nullptr || a.streams == nullptr || a.out == nullptr ||
      a.failed == nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned grid = GridFor(cachegen_stream_threads(a), kStreamThreads);
  if (a.dtype == 0) {
    CacheGenStreamKernel<float><<<grid, kStreamThreads, 0, stream>>>(a);
  } else {
    CacheGenStreamKernel<std::uint16_t><<<grid, kStreamThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_cachegen_quantize(const CacheGenQuantizeArgs& a, cudaStream_t stream) {
  if (a.dtype > 2) return cudaErrorInvalidValue;
  if (cachegen_rows(a) == 0) return cudaSuccess;
  if (a.bins == nullptr || a.scales == nullptr || a.failed == nullptr ||
      (a.channels > 0 && (a.kv == nullptr || a.symbols == nullptr))) {
    return cudaErrorInvalidValue;
  }
  CacheGenQuantizeKernel<<<GridFor(cachegen_rows(a) * kWarp, kThreads), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_cachegen_encode(const CacheGenEncodeArgs& a, cudaStream_t stream) {
  if (a.stream_tokens < 1 || a.groups != CeilDiv(a.tokens, a.stream_tokens)) return cudaErrorInvalidValue;
  if (cachegen_encode_threads(a) == 0) return cudaSuccess;
  if (a.symbols == nullptr || a.bins == nullptr || a.cum == nullptr || a.cum_at == nullptr || a.out == nullptr ||
      a.lengths == nullptr) {
    return cudaErrorInvalidValue;
  }
  CacheGenEncodeKernel<<<GridFor(cachegen_encode_threads(a), kStreamThreads), kStreamThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kdn::kernels
