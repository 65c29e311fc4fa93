// SPDX-License-Identifier: Apache-2.0
// CUDA re-positioning of cached keys: rotates each token's keys from the
// position they were computed at to a new one, in place. The element math is
// common/rope_reposition.h (formulas there), the same the CPU path
// (ref/rope_ref.h) uses; the layout and the contract are those of the CPU
// path.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/rope_reposition.h"

namespace kdn::kernels {

struct RopeRepositionArgs {
  RopeSpec spec;
  KeyType type = KeyType::kF32;
  // Device memory: `tokens` rows, row t at element t * row_stride, each
  // holding kv_heads heads of spec.head_dim elements back to back.
  void* keys = nullptr;
  std::int64_t row_stride = 0;  // elements
  std::int64_t tokens = 0;
  int kv_heads = 0;
  // launch_rope_reposition: device arrays of `tokens` positions.
  const std::int64_t* old_pos = nullptr;
  const std::int64_t* new_pos = nullptr;
  // launch_rope_shift: new - old, the same for every token.
  std::int64_t delta = 0;
};

// Largest rotary_dim the kernels take (their per-block tables live in shared
// memory: 16 bytes per pair).
inline constexpr int kRopeMaxRotaryDim = 4096;

// Moves token t from old_pos[t] to new_pos[t]; tokens whose delta is 0 are
// not touched. Returns cudaErrorInvalidValue when rope_keys_problem() names
// a problem, the type is unknown, rotary_dim > kRopeMaxRotaryDim, or (with
// tokens > 0) a pointer is null; cudaSuccess without launching when there
// are no tokens; else the launch's error. Never synchronizes, allocates or
// prints.
cudaError_t launch_rope_reposition(const RopeRepositionArgs& args, cudaStream_t stream);
// Moves every token by args.delta (old_pos and new_pos are not read);
// delta 0 launches nothing. Errors as above.
cudaError_t launch_rope_shift(const RopeRepositionArgs& args, cudaStream_t stream);

}  // namespace kdn::kernels
