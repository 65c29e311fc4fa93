// SPDX-License-Identifier: Apache-2.0
#include "kernels/ref/tc_ref.h"

#include <vector>

namespace kdn::kernels {

std::uint32_t tc_streams_ref(const TcDecodeArgs& a) {
  for (std::uint64_t s = 0; s < tc_stream_threads(a); ++s) {
    if (!tc_stream_work(a, s)) return codec_index32(s);
  }
  return ~0u;
}

namespace {

// tc_accumulate over every row; compiled twice below. Each acc[c] takes the
// same products and sums in the same order whatever the vector width (no
// contraction: -ffp-contract=off, and the AVX2 clone has no FMA), so both
// give tc_accumulate's bits.
#define KDN_TC_ACCUMULATE_ROWS                                                        \
  const std::uint64_t CC = std::uint64_t{C} * C;                                     \
  for (std::uint32_t p = 0; p < planes; ++p) {                                        \
    for (std::uint32_t t = sinks; t < tokens; ++t) {                                  \
      const std::uint64_t row = (std::uint64_t{p} * tokens + t) * C;                  \
      tc_accumulate(y + row, bt + p * CC, C, acc + row);                              \
    }                                                                                 \
  }

void AccumulateRows(const float* y, const float* bt, std::uint32_t planes, std::uint32_t tokens, std::uint32_t sinks,
                    std::uint32_t C, float* acc) {
  KDN_TC_ACCUMULATE_ROWS
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void AccumulateRowsAvx2(const float* y, const float* bt, std::uint32_t planes,
                                                         std::uint32_t tokens, std::uint32_t sinks, std::uint32_t C,
                                                         float* acc) {
  KDN_TC_ACCUMULATE_ROWS
}
#endif
#undef KDN_TC_ACCUMULATE_ROWS

}  // namespace

void tc_accumulate_ref(const float* y, const float* bt, std::uint32_t planes, std::uint32_t tokens,
                       std::uint32_t sinks, std::uint32_t C, float* acc) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return AccumulateRowsAvx2(y, bt, planes, tokens, sinks, C, acc);
#endif
  AccumulateRows(y, bt, planes, tokens, sinks, C, acc);
}

std::uint64_t tc_finish_ref(const TcFinishArgs& a) {
  // The rotations, once per token rather than per (layer, head): the same
  // values tc_finish_work computes without the table.
  const auto pairs = static_cast<std::uint64_t>(rope_pairs(a.rope));
  std::vector<double> cs(std::uint64_t{a.tokens} * pairs * 2);
  for (std::uint64_t t = a.sinks; t < a.tokens; ++t) tc_finish_cos_sin(a, t, cs.data() + t * pairs * 2);
  TcFinishArgs b = a;
  b.cs = cs.data();
  // Thread i = (plane, token, head), in ascending i.
  std::uint64_t failed = ~std::uint64_t{0}, i = 0;
  for (std::uint64_t plane = 0; plane < b.planes; ++plane) {
    for (std::uint64_t t = 0; t < b.tokens; ++t) {
      for (std::uint64_t h = 0; h < b.kv_heads; ++h, ++i) {
        if (!tc_finish_head(b, plane, t, h) && failed == ~std::uint64_t{0}) failed = i;
      }
    }
  }
  return failed;
}

}  // namespace kdn::kernels
