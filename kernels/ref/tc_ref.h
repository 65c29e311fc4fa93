// SPDX-License-Identifier: Apache-2.0
// CPU reference of the transform codec's decode kernels (kernels/tc.cuh):
// the per-thread work of common/tc_device_math.h for every thread index in
// ascending order, and the product step on the CPU (tc_accumulate). The CPU
// codec (core/codec/tc.cc) decodes with these, so its tests check the
// kernels' arithmetic. Argument structs hold host pointers here.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>

#include "kernels/common/tc_device_math.h"

namespace kdn::kernels {

// Every stream, one after another; the lowest failing stream, ~0u if all
// decoded.
std::uint32_t tc_streams_ref(const TcDecodeArgs& a);

// acc[plane][t] = B_plane y[plane][t] for tokens [sinks, tokens) of every
// plane (tc_accumulate; bt: each plane's transposed basis, C x C, back to
// back). Rows of sink tokens are left as they are.
void tc_accumulate_ref(const float* y, const float* bt, std::uint32_t planes, std::uint32_t tokens,
                       std::uint32_t sinks, std::uint32_t C, float* acc);

// Every (plane, token, head); the lowest index that does not fit the dtype,
// ~0 if none.
std::uint64_t tc_finish_ref(const TcFinishArgs& a);

}  // namespace kdn::kernels
