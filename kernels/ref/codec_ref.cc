#include "kernels/ref/codec_ref.h"

#include <algorithm>

namespace kdn::kernels {
namespace {

template <typename E>
std::uint32_t KdnDecode(const KdnDecodeArgs& a) {
  for (std::uint64_t i = 0; i < kdn_slot_threads(a); ++i) kdn_slot_work(a, i);
  for (std::uint64_t i = 0; i < kdn_lut_threads(a); ++i) kdn_lut_work<E>(a, i);
  for (std::uint64_t i = 0; i < kdn_sink_threads(a); ++i) kdn_sink_work<E>(a, i);
  std::uint32_t failed = ~0u;
  for (std::uint64_t i = 0; i < kdn_stream_threads(a); ++i) {
    if (!kdn_stream_work<E>(a, i) && failed == ~0u) failed = codec_index32(i);
  }
  if (a.failed != nullptr) *a.failed = failed;
  return failed;
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

std::uint32_t kdn_decode_ref(const KdnDecodeArgs& a) {
  return a.dtype == 0 ? KdnDecode<float>(a) : KdnDecode<std::uint16_t>(a);
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
