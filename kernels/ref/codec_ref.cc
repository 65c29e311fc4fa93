// SPDX-License-Identifier: Apache-2.0
#include "kernels/ref/codec_ref.h"

#include <algorithm>

namespace kdn::kernels {
namespace {

template <typename E>
bool KdnSegment(const KdnBatchArgs& a, const KdnBatchPlane& p, const KdnBatchSegment& s, const std::uint32_t* slots) {
  KdnLane lane[kKdnMaxLanes];
  bool ok = true;
  for (std::uint32_t j = 0; j < p.lanes; ++j) ok = kdn_lane_begin(p, s, j, lane[j]) && ok;
  if (!ok) return false;
  const std::uint8_t* words = kdn_segment_words(p, s);
  const std::uint8_t* const end = s.bytes + s.length;
  const std::uint64_t symbols = kdn_segment_symbols(p, s);
  for (std::uint64_t base = 0; base < symbols; base += p.lanes) {
    bool need[kKdnMaxLanes];
    for (std::uint32_t j = 0; j < p.lanes; ++j) need[j] = base + j < symbols && kdn_lane_decode<E>(a, p, s, slots, lane[j]);
    std::uint32_t below = 0;  // the ballot's population below lane j
    for (std::uint32_t j = 0; j < p.lanes; ++j) {
      if (!need[j]) continue;
      if (!kdn_lane_refill(lane[j], words, end, below)) return false;
      ++below;
    }
    words += 2ull * below;
    for (std::uint32_t j = 0; j < p.lanes; ++j) kdn_lane_next(p, s, lane[j]);
  }
  for (std::uint32_t j = 0; j < p.lanes; ++j) ok = kdn_lane_end(lane[j]) && ok;
  return ok && words == end;
}

template <typename E>
void KdnDecodeBatch(const KdnBatchArgs& a) {
  std::uint32_t slots[kKdnSlots];
  for (std::uint32_t i = 0; i < a.n_planes; ++i) {
    const KdnBatchPlane& p = a.planes[i];
    for (std::uint32_t k = 0; k < kKdnSlots; ++k) slots[k] = kdn_batch_slot(a, p, k);
    for (std::uint64_t e = 0; e < kdn_batch_sink_elements(p); ++e) kdn_batch_sink<E>(a, p, e);
    for (std::uint32_t g = 0; g < p.count; ++g) {
      if (!KdnSegment<E>(a, p, a.segments[p.first + g], slots)) {
        std::uint32_t& f = a.failed[p.job];
        f = std::min(f, codec_index32(p.first + g));
      }
    }
  }
}

template <typename E>
std::uint32_t CacheGenDecode(const CacheGenDecodeArgs& a) {
  std::uint32_t failed = ~0u;
  for (std::uint64_t i = 0; i < cachegen_stream_threads(a); ++i) {
    if (!cachegen_stream_work<E>(a, i) && failed == ~0u) failed = codec_index32(i);
  }
  if (a.failed != nullptr) *a.failed = failed;
  return failed;
}

}  // namespace

void kdn_decode_batch_ref(const KdnBatchArgs& a) {
  if (a.dtype == 0) {
    KdnDecodeBatch<float>(a);
  } else {
    KdnDecodeBatch<std::uint16_t>(a);
  }
}

void kdn_quantize_ref(const KdnQuantizeArgs& a) {
  for (std::uint64_t p = 0; p < a.n_planes; ++p) kdn_code_range_init(a, p);
  const std::uint64_t per_plane = std::uint64_t{a.tokens - a.sinks} * a.channels;
  for (std::uint64_t i = 0; i < kdn_quantize_threads(a); ++i) {
    const std::int32_t q = kdn_quantize_work(a, i);
    const std::uint64_t p = i / per_plane;
    a.code_min[p] = std::min(a.code_min[p], q);
    a.code_max[p] = std::max(a.code_max[p], q);
  }
}

bool kdn_encode_ref(const KdnEncodeArgs& a) {
  bool ok = true;
  for (std::uint64_t i = 0; i < kdn_encode_threads(a); ++i) ok = kdn_encode_work(a, i) && ok;
  return ok;
}

std::uint32_t cachegen_decode_ref(const CacheGenDecodeArgs& a) {
  return a.dtype == 0 ? CacheGenDecode<float>(a) : CacheGenDecode<std::uint16_t>(a);
}

std::uint32_t cachegen_quantize_ref(const CacheGenQuantizeArgs& a) {
  std::uint32_t failed = ~0u;
  for (std::uint64_t row = 0; row < cachegen_rows(a); ++row) {
    bool finite = true;
    const float scale = cachegen_row_scale(a, row, cachegen_absmax_part(a, row, 0, 1, finite));
    a.scales[row] = scale;
    if (!finite && failed == ~0u) failed = codec_index32(row);
    for (std::uint64_t c = 0; c < a.channels; ++c) cachegen_quantize_work(a, row, c, scale);
  }
  if (a.failed != nullptr) *a.failed = failed;
  return failed;
}

bool cachegen_encode_ref(const CacheGenEncodeArgs& a) {
  bool ok = true;
  for (std::uint64_t i = 0; i < cachegen_encode_threads(a); ++i) ok = cachegen_encode_work(a, i) && ok;
  return ok;
}

}  // namespace kdn::kernels
