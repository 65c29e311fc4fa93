// SPDX-License-Identifier: Apache-2.0
// CUDA kernels of the transform codec's decode (core/codec/tc.cc): each is a
// grid-stride loop around one per-thread work function of
// common/tc_device_math.h, which the CPU path (ref/tc_ref.h) runs too. The
// product between them is cuBLAS's (core/codec/device.cc).
//
// Every pointer in the argument structs is device memory. Launchers check
// the scalars (cudaErrorInvalidValue), launch on `stream` and return the
// launch's error; they never synchronize, allocate or print. Failures are
// reported through the args' `failed` word (the lowest failing index; the
// caller sets it to ~0u before the launch).
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/tc_device_math.h"

namespace kdn::kernels {

// One thread per stream (tc_stream_work) into a.y (zero-filled by the caller).
cudaError_t launch_tc_streams(const TcDecodeArgs& a, cudaStream_t stream);

// One thread per (plane, token, KV head) (tc_finish_work) into a.out.
cudaError_t launch_tc_finish(const TcFinishArgs& a, cudaStream_t stream);

}  // namespace kdn::kernels
