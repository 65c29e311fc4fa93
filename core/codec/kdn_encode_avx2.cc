// SPDX-License-Identifier: Apache-2.0
// AVX2 loops of the kdn encoder; the contract is in kdn_encode_avx2.h.
//
// Statistics and quantization run over several channels per vector: each
// channel's accumulator sees the same operations in the same token order as
// in the scalar loops. Streams: one stream's 8 states sit in one vector
// (lane l coding channel c + l of each block of 8, as the scalar loop's x_l
// does). Per block, walked backwards: gather the symbols' (start, freq),
// write the words of the lanes that renormalize (lanes 7..0 in the scalar
// order, so ascending lanes at ascending addresses, placed by a shuffle
// chosen by their mask), then x = floor(x / freq) << 12 + x % freq + start.
// The quotient is estimated in float and corrected once, so it is exact: x
// < freq << 20 after renormalization, so x / freq < 2^20 and the float
// estimate (three roundings, relative error < 3 * 2^-24) is within 3/16 of
// it; minus 1/2 and truncated it is the quotient or one less. A block's chain
// of dependent steps is long (a float estimate, a 32-bit multiply), so
// several streams are coded in lock-step.
#include "core/codec/kdn_encode_avx2.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "core/codec/kdn_simd.h"
#include "kernels/common/kdn_quant.h"

namespace kdn::codec::internal {

#if defined(__x86_64__)
namespace {

// For a mask m of the lanes that renormalize, a byte shuffle of the 8
// lanes' low halves (as 8 u16) putting those lanes' halves, ascending, in
// the last popcount(m) words.
struct Compress {
  alignas(16) std::uint8_t b[16];
};
constexpr std::array<Compress, 256> MakeCompress() {
  std::array<Compress, 256> t{};
  for (std::uint32_t m = 0; m < 256; ++m) {
    std::uint32_t n = 0;
    for (std::uint32_t k = 0; k < 8; ++k) n += (m >> k) & 1u;
    for (std::uint32_t i = 0; i < 16; ++i) t[m].b[i] = 0x80;
    std::uint32_t at = 8 - n;
    for (std::uint32_t k = 0; k < 8; ++k) {
      if ((m >> k) & 1u) {
        t[m].b[2 * at] = static_cast<std::uint8_t>(2 * k);
        t[m].b[2 * at + 1] = static_cast<std::uint8_t>(2 * k + 1);
        ++at;
      }
    }
  }
  return t;
}
constexpr std::array<Compress, 256> kCompress = MakeCompress();

// One stream's cursor in the vector loop.
struct Cursor {
  __m256i x;
  std::uint16_t* ptr;
};

// Codes the block of 8 symbols at b (lane l codes b[l]) into cur.
__attribute__((target("avx2,popcnt"), always_inline)) inline void Put(Cursor& cur, const std::uint8_t* b,
                                                                      const std::uint32_t* coding) {
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(coding), idx, 4);
  const __m256i freq = _mm256_srli_epi32(e, 16);
  const __m256i start = _mm256_and_si256(e, _mm256_set1_epi32(0xFFFF));
  // x >= freq << 20 (unsigned), as x > (freq << 20) - 1: for freq 2^12 the
  // limit is 2^32 - 1 and no lane renormalizes.
  const __m256i lim = _mm256_sub_epi32(_mm256_slli_epi32(freq, 32 - kernels::kKdnScaleBits), _mm256_set1_epi32(1));
  const __m256 freqf = _mm256_cvtepi32_ps(freq);
  const __m256 rcp = _mm256_div_ps(_mm256_set1_ps(1.0f), freqf);
  __m256i x = cur.x;
  const __m256i emit = _mm256_cmpgt_epi32(_mm256_xor_si256(x, sign), _mm256_xor_si256(lim, sign));
  const unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(emit)));
  // The lanes' low halves as 8 u16, the renormalizing ones last, stored to
  // end at ptr (the words below ptr - popcount(m) are scratch).
  const __m256i halves = _mm256_shuffle_epi8(
      x, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1, -1,
                          -1, -1, -1, -1, -1, -1));
  const __m128i packed = _mm256_castsi256_si128(_mm256_permute4x64_epi64(halves, 0x08));
  const __m128i words =
      _mm_shuffle_epi8(packed, _mm_load_si128(reinterpret_cast<const __m128i*>(kCompress[m].b)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(cur.ptr - 8), words);
  cur.ptr -= __builtin_popcount(m);
  x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), emit);
  // q = floor(x / freq): estimated, then corrected upwards once.
  const __m256 xf = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 16)), _mm256_set1_ps(65536.0f)),
                                  _mm256_cvtepi32_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF))));
  __m256i q = _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_mul_ps(xf, rcp), _mm256_set1_ps(0.5f)));
  __m256i r = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, freq));
  const __m256i up = _mm256_cmpgt_epi32(r, _mm256_sub_epi32(freq, _mm256_set1_epi32(1)));
  q = _mm256_sub_epi32(q, up);
  r = _mm256_sub_epi32(r, _mm256_and_si256(up, freq));
  cur.x = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(q, kernels::kKdnScaleBits), r), start);
}

template <int N>
__attribute__((target("avx2,popcnt"))) void Streams(KdnEncodeJob* jobs) {
  Cursor cur[N];
  for (int k = 0; k < N; ++k) {
    cur[k].x = _mm256_set1_epi32(static_cast<int>(kernels::kKdnRansLow));
    cur[k].ptr = jobs[k].end;
  }
  const std::uint64_t width = jobs[0].width, tokens = jobs[0].tokens;
  for (std::uint64_t t = tokens; t-- > 0;) {
    for (std::uint64_t c = width; c > 0; c -= 8) {
      for (int k = 0; k < N; ++k) Put(cur[k], jobs[k].codes + t * jobs[k].row + c - 8, jobs[k].coding);
    }
  }
  for (int k = 0; k < N; ++k) {
    // The final states, lane 0 first, as little-endian u32 (u16 halves).
    cur[k].ptr -= 16;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cur[k].ptr), cur[k].x);
    jobs[k].bytes = 2 * static_cast<std::uint64_t>(jobs[k].end - cur[k].ptr);
  }
}

__attribute__((target("avx2"))) void SumImpl(const float* x, std::uint64_t C, std::uint64_t t0, std::uint64_t t1,
                                             double* sum) {
  std::uint64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    __m256d a0 = _mm256_loadu_pd(sum + c), a1 = _mm256_loadu_pd(sum + c + 4), a2 = _mm256_loadu_pd(sum + c + 8),
            a3 = _mm256_loadu_pd(sum + c + 12);
    for (std::uint64_t t = t0; t < t1; ++t) {
      const float* r = x + t * C + c;
      a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm_loadu_ps(r)));
      a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm_loadu_ps(r + 4)));
      a2 = _mm256_add_pd(a2, _mm256_cvtps_pd(_mm_loadu_ps(r + 8)));
      a3 = _mm256_add_pd(a3, _mm256_cvtps_pd(_mm_loadu_ps(r + 12)));
    }
    _mm256_storeu_pd(sum + c, a0);
    _mm256_storeu_pd(sum + c + 4, a1);
    _mm256_storeu_pd(sum + c + 8, a2);
    _mm256_storeu_pd(sum + c + 12, a3);
  }
  for (; c + 4 <= C; c += 4) {
    __m256d a = _mm256_loadu_pd(sum + c);
    for (std::uint64_t t = t0; t < t1; ++t) a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm_loadu_ps(x + t * C + c)));
    _mm256_storeu_pd(sum + c, a);
  }
  for (; c < C; ++c) {
    for (std::uint64_t t = t0; t < t1; ++t) sum[c] += x[t * C + c];
  }
}

// var += double(d) * d and mx = max(mx, |d|) for 8 channels (max(m, |d|)
// is std::max(m, |d|) for numbers: the x are finite).
__attribute__((target("avx2"), always_inline)) inline void Spread8(__m256 d, __m256d& v0, __m256d& v1, __m256& mx) {
  const __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(d)), d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1));
  v0 = _mm256_add_pd(v0, _mm256_mul_pd(d0, d0));
  v1 = _mm256_add_pd(v1, _mm256_mul_pd(d1, d1));
  mx = _mm256_max_ps(mx, _mm256_and_ps(d, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))));
}

// Blocks of 16 channels keep four chains of additions in flight.
__attribute__((target("avx2"))) void SpreadImpl(const float* x, std::uint64_t C, std::uint64_t t0, std::uint64_t t1,
                                                const float* off, double* var, float* maxdev) {
  std::uint64_t c = 0;
  for (; c + 16 <= C; c += 16) {
    const __m256 oa = _mm256_loadu_ps(off + c), ob = _mm256_loadu_ps(off + c + 8);
    __m256d va0 = _mm256_loadu_pd(var + c), va1 = _mm256_loadu_pd(var + c + 4);
    __m256d vb0 = _mm256_loadu_pd(var + c + 8), vb1 = _mm256_loadu_pd(var + c + 12);
    __m256 ma = _mm256_loadu_ps(maxdev + c), mb = _mm256_loadu_ps(maxdev + c + 8);
    for (std::uint64_t t = t0; t < t1; ++t) {
      Spread8(_mm256_sub_ps(_mm256_loadu_ps(x + t * C + c), oa), va0, va1, ma);
      Spread8(_mm256_sub_ps(_mm256_loadu_ps(x + t * C + c + 8), ob), vb0, vb1, mb);
    }
    _mm256_storeu_pd(var + c, va0);
    _mm256_storeu_pd(var + c + 4, va1);
    _mm256_storeu_pd(var + c + 8, vb0);
    _mm256_storeu_pd(var + c + 12, vb1);
    _mm256_storeu_ps(maxdev + c, ma);
    _mm256_storeu_ps(maxdev + c + 8, mb);
  }
  for (; c + 8 <= C; c += 8) {
    const __m256 o = _mm256_loadu_ps(off + c);
    __m256d v0 = _mm256_loadu_pd(var + c), v1 = _mm256_loadu_pd(var + c + 4);
    __m256 mx = _mm256_loadu_ps(maxdev + c);
    for (std::uint64_t t = t0; t < t1; ++t) Spread8(_mm256_sub_ps(_mm256_loadu_ps(x + t * C + c), o), v0, v1, mx);
    _mm256_storeu_pd(var + c, v0);
    _mm256_storeu_pd(var + c + 4, v1);
    _mm256_storeu_ps(maxdev + c, mx);
  }
  for (; c < C; ++c) {
    for (std::uint64_t t = t0; t < t1; ++t) {
      const float d = x[t * C + c] - off[c];
      var[c] += static_cast<double>(d) * d;
      maxdev[c] = std::max(maxdev[c], std::fabs(d));
    }
  }
}

__attribute__((target("avx2"))) void QuantizeImpl(const float* x, std::uint64_t C, std::uint64_t rows,
                                                  const float* off, const float* step, std::uint8_t* code) {
  const __m256 lim = _mm256_set1_ps(static_cast<float>(kernels::kKdnMaxCode));
  const __m256 neg_lim = _mm256_set1_ps(-static_cast<float>(kernels::kKdnMaxCode));
  const __m256i bias = _mm256_set1_epi32(kernels::kKdnMaxCode);
  for (std::uint64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * C;
    std::uint8_t* ct = code + t * C;
    std::uint64_t c = 0;
    for (; c + 8 <= C; c += 8) {
      // kdn_quantize: rint((x - off) / step) (nearest even, IEEE division),
      // clamped (no NaN reaches here, so min/max clamp the same way).
      const __m256 q = _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(xt + c), _mm256_loadu_ps(off + c)),
                                     _mm256_loadu_ps(step + c));
      const __m256 r = _mm256_min_ps(_mm256_max_ps(_mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                                   neg_lim),
                                     lim);
      const __m256i v = _mm256_add_epi32(_mm256_cvttps_epi32(r), bias);  // 0..254
      const __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(v, v), _mm256_setzero_si256());
      const __m128i bytes = _mm_unpacklo_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(ct + c), bytes);
    }
    for (; c < C; ++c) {
      ct[c] = static_cast<std::uint8_t>(kernels::kdn_quantize(xt[c], off[c], step[c]) + kernels::kKdnMaxCode);
    }
  }
}

}  // namespace

bool KdnEncodeAvx2() { return KdnSimdInUse() != KdnSimd::kNone; }

void KdnSumAvx2(const float* x, std::uint64_t C, std::uint64_t t0, std::uint64_t t1, double* sum) {
  SumImpl(x, C, t0, t1, sum);
}

void KdnSpreadAvx2(const float* x, std::uint64_t C, std::uint64_t t0, std::uint64_t t1, const float* off,
                   double* var, float* maxdev) {
  SpreadImpl(x, C, t0, t1, off, var, maxdev);
}

void KdnQuantizeAvx2(const float* x, std::uint64_t C, std::uint64_t rows, const float* off, const float* step,
                     std::uint8_t* code, std::uint64_t* hist) {
  QuantizeImpl(x, C, rows, off, step, code);
  // Eight histograms side by side, so repeated codes do not wait on each
  // other's increments; counted in slices that cannot overflow them.
  const std::uint64_t n = rows * C;
  std::uint32_t h[8][256];
  for (std::uint64_t begin = 0; begin < n; begin += std::uint64_t{1} << 31) {
    std::memset(h, 0, sizeof h);
    const std::uint64_t end = std::min(n, begin + (std::uint64_t{1} << 31));
    std::uint64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      for (int k = 0; k < 8; ++k) ++h[k][code[i + k]];
    }
    for (; i < end; ++i) ++h[0][code[i]];
    for (int s = 0; s < 2 * kernels::kKdnMaxCode + 1; ++s) {  // codes are 0..254
      hist[s] += std::uint64_t{h[0][s]} + h[1][s] + h[2][s] + h[3][s] + h[4][s] + h[5][s] + h[6][s] + h[7][s];
    }
  }
}

void KdnEncodeStreamsAvx2(KdnEncodeJob* jobs, int count) {
  switch (count) {
    case 1: Streams<1>(jobs); break;
    case 2: Streams<2>(jobs); break;
    case 3: Streams<3>(jobs); break;
    default: Streams<4>(jobs); break;
  }
}

#else

bool KdnEncodeAvx2() { return false; }
void KdnSumAvx2(const float*, std::uint64_t, std::uint64_t, std::uint64_t, double*) {}
void KdnSpreadAvx2(const float*, std::uint64_t, std::uint64_t, std::uint64_t, const float*, double*, float*) {}
void KdnQuantizeAvx2(const float*, std::uint64_t, std::uint64_t, const float*, const float*, std::uint8_t*,
                     std::uint64_t*) {}
void KdnEncodeStreamsAvx2(KdnEncodeJob*, int) {}

#endif

}  // namespace kdn::codec::internal
