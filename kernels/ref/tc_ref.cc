#include "kernels/ref/tc_ref.h"

namespace kdn::kernels {

std::uint32_t tc_streams_ref(const TcDecodeArgs& a) {
  for (std::uint64_t s = 0; s < tc_stream_threads(a); ++s) {
    if (!tc_stream_work(a, s)) return codec_index32(s);
  }
  return ~0u;
}

void tc_accumulate_ref(const float* y, const float* bt, std::uint32_t planes, std::uint32_t tokens,
                       std::uint32_t sinks, std::uint32_t C, float* acc) {
  const std::uint64_t CC = std::uint64_t{C} * C;
  for (std::uint32_t p = 0; p < planes; ++p) {
    for (std::uint32_t t = sinks; t < tokens; ++t) {
      const std::uint64_t row = (std::uint64_t{p} * tokens + t) * C;
      tc_accumulate(y + row, bt + p * CC, C, acc + row);
    }
  }
}

std::uint64_t tc_finish_ref(const TcFinishArgs& a) {
  std::uint64_t failed = ~std::uint64_t{0};
  for (std::uint64_t i = 0; i < tc_finish_threads(a); ++i) {
    if (!tc_finish_work(a, i) && failed == ~std::uint64_t{0}) failed = i;
  }
  return failed;
}

}  // namespace kdn::kernels
