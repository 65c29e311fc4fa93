// SPDX-License-Identifier: Apache-2.0
// A model's KV element type (kdn_dtype: 0 f32, 1 f16, 2 bf16) and its size in
// bytes: the one definition, for host and device code alike.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace kdn::kernels {

enum class Dtype : std::uint32_t { kF32 = 0, kF16 = 1, kBf16 = 2 };

// Bytes per element; 0 for a value that names no dtype.
KDN_HD constexpr std::uint32_t DtypeBytes(std::uint32_t dtype) {
  return dtype == 0 ? 4u : (dtype == 1 || dtype == 2) ? 2u : 0u;
}
KDN_HD constexpr std::uint32_t DtypeBytes(Dtype dtype) { return DtypeBytes(static_cast<std::uint32_t>(dtype)); }

static_assert(DtypeBytes(Dtype::kF32) == 4 && DtypeBytes(Dtype::kF16) == 2 && DtypeBytes(Dtype::kBf16) == 2);

}  // namespace kdn::kernels
