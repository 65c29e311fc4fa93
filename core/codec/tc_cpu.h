// SPDX-License-Identifier: Apache-2.0
// The transform codec's decode on a CPU (core/codec/tc.cc's payloads): the
// same bytes as TcDecodeEmulated (core/codec/device.h), which runs the GPU
// kernels' per-thread functions in thread order, and the same verdict on
// malformed payloads, reached with less work:
// - the streams are decoded by the kernels' own tc_decode_stream (into rows
//   of the coded components only: nothing else is read, so nothing is
//   zero-filled);
// - the product takes each row's non-zero components (compacted without a
//   branch) in ascending order, 8 channels per vector (AVX2 where the CPU has
//   it, built without FMA): every channel's sum has the emulation's terms in
//   its order, and a zero term, which the emulation skips, adds exactly
//   nothing;
// - each row is finished while its product is in the cache (mean, RoPE
//   again in double with one (cos, sin) table per chunk, the dtype's element
//   with F16C's rounding, which is IEEE's as kernels/common/half.h's).
//
// Thread-safety: plain functions (scratch per thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/codec/codec.h"
#include "core/codec/tc_profile.h"

namespace kdn::codec {

// Same contract as Codec::Decode; `hint` as ParseTcDirectory's.
Status TcDecodeCpu(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out,
                   std::shared_ptr<const TcProfile> hint = nullptr);
// The same with the vector path (AVX2 and F16C, where the CPU has them) or
// without it (`vectors` false): the tests compare both with the emulation.
Status TcDecodeCpuWith(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out,
                       std::shared_ptr<const TcProfile> hint, bool vectors);

}  // namespace kdn::codec
