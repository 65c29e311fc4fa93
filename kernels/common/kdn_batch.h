// SPDX-License-Identifier: Apache-2.0
// kdn's batched decode: every stream of every payload of a load decoded in
// one launch (kernels/codec.cu: launch_kdn_decode_batch), shared with its
// CPU emulation (kernels/ref/codec_ref.cc), which runs the same per-lane
// functions in the order of the warp's lanes.
//
// The payload format is kdn's own (core/codec/kdn.cc): a stream codes
// `tokens x width` symbols, token-major, with `lanes` interleaved states
// (symbol i by state i % lanes) sharing one sequence of 16-bit words, in
// decode order. So `lanes` consecutive lanes of a warp decode one stream
// together, one symbol each per step: lane j takes symbols j, j + lanes,
// j + 2 lanes, ... and holds state j. After a step, the lanes whose state
// fell below kKdnRansLow each need the next word, and a serial decoder would
// have read them in lane order: lane j's word is the (number of needing lanes
// below j)-th after the shared read position, which then moves by the count
// of needing lanes (a ballot and a population count on the GPU; a loop over
// the lanes on the CPU). A warp holds 32 / lanes streams (8 lanes: 4 streams
// a warp, 4 x 8 states in flight), a block one plane: its slot table in
// shared memory, its sink tokens, then its streams.
//
// Argument structs hold raw pointers: device memory for the kernel, host
// memory for the emulation. The host (core/codec/device.cc) parses and checks
// every payload's headers and tables and builds the directory; the streams'
// bytes are read in place and checked here as they are decoded.
#pragma once

#include <cstdint>

#include "kernels/common/codec_device_math.h"
#include "kernels/common/hd.h"
#include "kernels/common/kdn_quant.h"

namespace kdn::kernels {

inline constexpr std::uint32_t kKdnWarp = 32;
inline constexpr std::uint32_t kKdnSlots = 1u << kKdnScaleBits;

// One plane (layer, k|v) of one payload of the batch.
struct KdnBatchPlane {
  const std::uint8_t* halves = nullptr;  // off[channels] f16, then step[channels] f16
  const std::uint8_t* sinks = nullptr;   // sinks x channels f16, token-major
  void* out = nullptr;                   // token 0, channel 0 of the plane's output (E elements)
  std::uint64_t row = 0;                 // elements from one token's row of the output to the next (>= channels)
  std::uint32_t channels = 0, tokens = 0, sinks_n = 0;
  std::uint32_t cum = 0;                 // index in KdnBatchArgs::cum of the plane's n + 1 cumulative frequencies
  std::uint32_t n = 0;                   // alphabet size: symbols 0..n-1 are codes min_code..min_code+n-1
  std::int32_t min_code = 0;
  std::uint32_t lanes = 1;               // states per stream, 1..kKdnMaxLanes
  std::uint32_t job = 0;                 // the payload's index: its `failed` word
  std::uint64_t first = 0;               // the plane's streams: segments [first, first + count)
  std::uint32_t count = 0;
  std::uint32_t reserved = 0;
};

// One stream: channels [c0, c0 + width) of its plane, tokens [sinks_n, tokens).
struct KdnBatchSegment {
  const std::uint8_t* bytes = nullptr;
  std::uint64_t length = 0;
  std::uint32_t c0 = 0, width = 0;
};

struct KdnBatchArgs {
  const KdnBatchPlane* planes = nullptr;      // [n_planes]
  const KdnBatchSegment* segments = nullptr;  // every plane's streams, in plane order
  const std::uint32_t* cum = nullptr;         // cumulative frequencies, scale 2^kKdnScaleBits
  std::uint32_t* failed = nullptr;            // [jobs]: the lowest failing segment index, or ~0u (the caller's)
  std::uint32_t n_planes = 0;
  std::uint32_t dtype = 0;                    // of every output: 0 f32, 1 f16, 2 bf16
};

// ---- per plane (one block): its slot table, then its sink tokens

// Entry k of the plane's slot table: the packed (symbol, start, freq) of the
// symbol whose range holds slot k.
KDN_HD std::uint32_t kdn_batch_slot(const KdnBatchArgs& a, const KdnBatchPlane& p, std::uint32_t k) {
  const std::uint32_t* cum = a.cum + p.cum;
  const std::uint32_t s = codec_find_symbol(cum, p.n, k);
  return kdn_slot_pack(s, cum[s], cum[s + 1] - cum[s]);
}

KDN_HD std::uint64_t kdn_batch_sink_elements(const KdnBatchPlane& p) {
  return std::uint64_t{p.sinks_n} * p.channels;
}

// Sink element i = (token t, channel c) of the plane: its half, as an element.
template <typename E>
KDN_HD void kdn_batch_sink(const KdnBatchArgs& a, const KdnBatchPlane& p, std::uint64_t i) {
  const std::uint64_t t = i / p.channels, c = i % p.channels;
  static_cast<E*>(p.out)[t * p.row + c] = codec_to_element<E>(a.dtype, codec_read_half(p.sinks + 2 * i));
}

// ---- per lane of a stream

// What one lane of a stream's lane group holds: its rANS state and the
// (token, channel) of its next symbol, relative to the stream.
struct KdnLane {
  std::uint32_t x = 0;
  std::uint32_t c = 0;
  std::uint64_t t = 0;
};

// The stream's symbol count, and the steps its lane group takes.
KDN_HD std::uint64_t kdn_segment_symbols(const KdnBatchPlane& p, const KdnBatchSegment& s) {
  return std::uint64_t{p.tokens - p.sinks_n} * s.width;
}
KDN_HD std::uint64_t kdn_segment_steps(const KdnBatchPlane& p, const KdnBatchSegment& s) {
  return (kdn_segment_symbols(p, s) + p.lanes - 1) / p.lanes;
}
// Where the stream's words start (after its `lanes` states).
KDN_HD const std::uint8_t* kdn_segment_words(const KdnBatchPlane& p, const KdnBatchSegment& s) {
  return s.bytes + 4ull * p.lanes;
}

// Lane j (< lanes) reads its initial state and takes symbol j. False if the
// stream is too short for its states or the state is out of range.
KDN_HD bool kdn_lane_begin(const KdnBatchPlane& p, const KdnBatchSegment& s, std::uint32_t j, KdnLane& l) {
  if (s.length < 4ull * p.lanes || s.width == 0) return false;
  l.x = kdn_read_u32(s.bytes + 4ull * j);
  l.t = j / s.width;
  l.c = j % s.width;
  return l.x >= kKdnRansLow;
}

// Decodes the lane's symbol with the plane's slot table, writes its value,
// and advances the state; true if the state then needs a word.
template <typename E>
KDN_HD bool kdn_lane_decode(const KdnBatchArgs& a, const KdnBatchPlane& p, const KdnBatchSegment& s,
                            const std::uint32_t* slots, KdnLane& l) {
  const std::uint32_t e = slots[l.x & (kKdnSlots - 1u)];
  const std::uint32_t ch = s.c0 + l.c;
  const float off = codec_read_half(p.halves + 2ull * ch);
  const float step = codec_read_half(p.halves + 2ull * (p.channels + ch));
  static_cast<E*>(p.out)[(p.sinks_n + l.t) * p.row + ch] =
      codec_to_element<E>(a.dtype, kdn_dequantize(p.min_code + static_cast<std::int32_t>(e >> 24), off, step));
  l.x = ((e & 0xFFFu) + 1u) * (l.x >> kKdnScaleBits) + (l.x & (kKdnSlots - 1u)) - ((e >> 12) & 0xFFFu);
  return l.x < kKdnRansLow;
}

// Shifts in the lane's word: the `below`-th after `words` (the lanes below
// it that needed one come first). False if it lies at or past `end`.
KDN_HD bool kdn_lane_refill(KdnLane& l, const std::uint8_t* words, const std::uint8_t* end, std::uint32_t below) {
  const std::uint8_t* w = words + 2ull * below;
  if (end - w < 2) return false;
  l.x = (l.x << 16) | codec_read_u16(w);
  return true;
}

// Moves the lane to its next symbol, `lanes` further on.
KDN_HD void kdn_lane_next(const KdnBatchPlane& p, const KdnBatchSegment& s, KdnLane& l) {
  l.c += p.lanes;
  while (l.c >= s.width) {
    l.c -= s.width;
    ++l.t;
  }
}

// Whether the lane's state ended where every encoder starts.
KDN_HD bool kdn_lane_end(const KdnLane& l) { return l.x == kKdnRansLow; }

}  // namespace kdn::kernels
