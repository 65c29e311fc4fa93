// SPDX-License-Identifier: Apache-2.0
#include "core/codec/tc_cpu.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/codec/device.h"
#include "core/codec/kdn_simd.h"
#include "kernels/common/codec_device_math.h"
#include "kernels/common/half.h"
#include "kernels/common/tc_device_math.h"
#include "kernels/ref/tc_ref.h"

namespace kdn::codec {
namespace {

// What one plane's rows need (tc_cpu_rows.inc); scratch of C entries each.
struct RowsArgs {
  std::uint32_t C = 0, T = 0, S = 0;
  const kernels::TcFinishArgs* finish = nullptr;  // payload, sinks_at, mean, rope, dtype, out
  const float* y = nullptr;                       // the plane's rows of coded components' values
  const float* bt = nullptr;                      // the profile's transposed bases, [plane][C][C]
  const double* cs = nullptr;                     // [token][pair] (cos, sin)
  const std::uint32_t* coded = nullptr;           // the plane's coded components, ascending
  std::uint32_t n_coded = 0;
  std::uint32_t* comp = nullptr;
  float* val = nullptr;
  float* acc = nullptr;
  float* row = nullptr;
};

// For a mask of 8 lanes: where lane k's value goes when the lanes set are
// moved to the front in order (3 bits per position: the lane whose value
// lands there).
constexpr std::array<std::uint32_t, 256> MakeCompress() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t m = 0; m < 256; ++m) {
    std::uint32_t packed = 0, at = 0;
    for (std::uint32_t k = 0; k < 8; ++k) {
      if ((m >> k) & 1u) packed |= k << (3 * at++);
    }
    t[m] = packed;
  }
  return t;
}
inline constexpr std::array<std::uint32_t, 256> kCompress = MakeCompress();

// Vector types are passed only between inlined functions of one target: no
// ABI crosses (-Wpsabi warns of one).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
namespace generic {
#define KDN_TC_TARGET
#define KDN_TC_AVX2 0
#define KDN_TC_LANES 8
#include "core/codec/tc_cpu_rows.inc"
#undef KDN_TC_TARGET
#undef KDN_TC_AVX2
#undef KDN_TC_LANES
}  // namespace generic

#if defined(__x86_64__)
namespace avx2 {
#define KDN_TC_TARGET __attribute__((target("avx2,f16c,popcnt")))
#define KDN_TC_AVX2 1
#define KDN_TC_LANES 8
#include "core/codec/tc_cpu_rows.inc"
#undef KDN_TC_TARGET
#undef KDN_TC_AVX2
#undef KDN_TC_LANES
}  // namespace avx2
// The same with the product 16 floats a vector.
namespace avx512 {
#define KDN_TC_TARGET __attribute__((target("avx2,f16c,popcnt,avx512f")))
#define KDN_TC_AVX2 1
#define KDN_TC_LANES 16
#include "core/codec/tc_cpu_rows.inc"
#undef KDN_TC_TARGET
#undef KDN_TC_AVX2
#undef KDN_TC_LANES
}  // namespace avx512
#endif

// One stream of a plane, decoded into the plane's rows of coded components
// (row t - S: `stride` values; the stream's n components are columns
// [col0, col0 + n)). table/range/step: the plane's, per column.
struct StreamJob {
  const std::uint8_t* p = nullptr;
  std::uint64_t len = 0;
  std::uint32_t lanes = 0, n = 0, stride = 0, col0 = 0;
  std::uint64_t rows = 0;
  const std::uint32_t* table = nullptr;  // the profile's table index per column
  const std::int32_t* range = nullptr;
  const float* step = nullptr;
  float* out = nullptr;
  std::uint32_t index = 0;  // in the payload's stream order (reported when it fails)
};

// Any stream, by the kernels' own tc_decode_stream: its tokens counted from
// 0 (rows), its components named by their columns.
bool DecodeStreamScalar(const StreamJob& j, const std::uint32_t* slots, std::vector<std::uint32_t>& cols) {
  cols.resize(j.n);
  for (std::uint32_t c = 0; c < j.n; ++c) cols[c] = j.col0 + c;
  struct Slots {
    const std::uint32_t* slots;
    const std::uint32_t* table;
    const std::uint32_t* operator()(std::uint32_t col) const {
      return slots + (std::uint64_t{table[col]} << kernels::kKdnScaleBits);
    }
  } tables{slots, j.table};
  return kernels::tc_decode_stream(j.p, j.len, j.lanes, 0, static_cast<std::uint32_t>(j.rows), j.stride, cols.data(),
                                   j.n, tables, j.range, j.step, j.out);
}

#if defined(__x86_64__)
// Streams of 8 lanes, 8 symbols (one per lane) a vector step, up to 4
// streams in lock-step (a step's chain, from the gather of the slots'
// entries to the renormalization, is long). Symbol k of a stream is column
// col0 + k % n of row k / n; its per-symbol fields repeat every P = lcm(n,
// 8) symbols, so they are laid out once per period (the schedule). The
// states, the words read and the values are tc_decode_stream's; rows near
// the stream's end (fewer than 16 bytes left) take the checked scalar step.
struct Schedule {
  std::uint32_t P = 0;
  std::uint64_t advance = 0;  // output values a period moves on
  bool dense = false;         // symbol k's value lands at out[k]
  std::vector<std::uint32_t> base;  // [P]: the symbol's table's first slot
  std::vector<std::int32_t> range;
  std::vector<float> step;
  std::vector<std::uint32_t> off;  // [P]: its value's offset within the period
};

Schedule MakeSchedule(const StreamJob& j) {
  Schedule s;
  std::uint32_t P = 8;
  while (P % j.n != 0) P += 8;
  s.P = P;
  s.advance = std::uint64_t{P / j.n} * j.stride;
  s.dense = j.stride == j.n && j.col0 == 0;
  s.base.resize(P);
  s.range.resize(P);
  s.step.resize(P);
  s.off.resize(P);
  for (std::uint32_t p = 0; p < P; ++p) {
    const std::uint32_t col = j.col0 + p % j.n;
    s.base[p] = j.table[col] << kernels::kKdnScaleBits;
    s.range[p] = j.range[col];
    s.step[p] = j.step[col];
    s.off[p] = (p / j.n) * j.stride + col;
  }
  return s;
}

struct Cursor {
  std::uint32_t x[8];  // the states between runs of vector steps (held in a register during them)
  const std::uint8_t* ptr;
  const std::uint8_t* end;
  std::uint64_t k = 0, blocks = 0;  // symbols done (a multiple of 8), whole blocks of the stream
  std::uint32_t at = 0;             // k % P
  std::uint64_t out_at = 0;         // (k / P) * advance
  const Schedule* s;
  float* out;
  bool Ready() const { return k / 8 < blocks && end - ptr >= 16; }
};

__attribute__((target("avx2,popcnt"))) inline void VectorStep(__m256i& state, Cursor& c, const std::uint32_t* slots) {
  const Schedule& s = *c.s;
  const __m256i m12 = _mm256_set1_epi32(0xFFF);
  const __m256i slot = _mm256_and_si256(state, m12);
  const __m256i index =
      _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.base.data() + c.at)), slot);
  const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(slots), index, 4);
  const __m256i sym = _mm256_srli_epi32(e, 24);
  const __m256 v = _mm256_mul_ps(
      _mm256_cvtepi32_ps(_mm256_sub_epi32(sym, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s.range.data() + c.at)))),
      _mm256_loadu_ps(s.step.data() + c.at));
  if (s.dense) {
    _mm256_storeu_ps(c.out + c.out_at + c.at, v);
  } else {
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    for (int l = 0; l < 8; ++l) c.out[c.out_at + s.off[c.at + l]] = tmp[l];
  }
  const __m256i freq = _mm256_add_epi32(_mm256_and_si256(e, m12), _mm256_set1_epi32(1));
  const __m256i start = _mm256_and_si256(_mm256_srli_epi32(e, 12), m12);
  const __m256i hi = _mm256_srli_epi32(state, 12);
  const __m256i even = _mm256_mul_epu32(freq, hi);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(freq, 32), _mm256_srli_epi64(hi, 32));
  const __m256i product = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  const __m256i x = _mm256_sub_epi32(_mm256_add_epi32(product, slot), start);
  const __m256i low = _mm256_cmpeq_epi32(_mm256_srli_epi32(x, 16), _mm256_setzero_si256());
  const unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(low)));
  const __m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.ptr)));
  const __m256i which =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(internal::kKdnSimdWordIndex[m])),
                                         _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21)),
                       _mm256_set1_epi32(7));
  const __m256i shifted = _mm256_or_si256(_mm256_slli_epi32(x, 16), _mm256_permutevar8x32_epi32(words, which));
  state = _mm256_blendv_epi8(x, shifted, low);
  c.ptr += 2 * __builtin_popcount(m);
  c.k += 8;
  c.at += 8;
  if (c.at == s.P) {
    c.at = 0;
    c.out_at += s.advance;
  }
}

// The symbols after the vector steps, checked (kdn_decode_one_checked), and
// the stream's end. False if the stream is malformed.
__attribute__((target("avx2,popcnt"))) bool FinishStream(Cursor& c, const StreamJob& j, const std::uint32_t* slots) {
  std::uint32_t* const x = c.x;
  const Schedule& s = *c.s;
  const std::uint64_t N = j.rows * j.n;
  const std::uint8_t* ptr = c.ptr;
  for (std::uint64_t k = c.k; k < N; ++k) {
    const std::uint32_t at = c.at;
    auto value = [&s, at](std::uint64_t, std::uint32_t sym) {
      return static_cast<float>(static_cast<std::int32_t>(sym) - s.range[at]) * s.step[at];
    };
    if (!kernels::kdn_decode_one_checked(x[k % 8], slots + s.base[at], value, 0, c.out + c.out_at + s.off[at], ptr,
                                         c.end)) {
      return false;
    }
    if (++c.at == s.P) {
      c.at = 0;
      c.out_at += s.advance;
    }
  }
  if (ptr != c.end) return false;
  for (std::uint32_t l = 0; l < 8; ++l) {
    if (x[l] != kernels::kKdnRansLow) return false;
  }
  return true;
}

__attribute__((target("avx2,popcnt"))) inline __m256i load(const Cursor& c) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.x));
}
__attribute__((target("avx2,popcnt"))) inline void store(Cursor& c, __m256i x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(c.x), x);
}

// Decodes streams of 8 lanes; the index of the first that fails, or ~0u.
__attribute__((target("avx2,popcnt"))) std::uint32_t DecodeStreamsAvx2(const std::vector<StreamJob>& jobs,
                                                                const std::uint32_t* slots) {
  std::vector<Schedule> schedules(jobs.size());
  std::vector<Cursor> cursors(jobs.size());
  std::uint32_t failed = ~0u;
  std::vector<bool> begun(jobs.size(), false);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const StreamJob& j = jobs[i];
    Cursor& c = cursors[i];
    const std::uint8_t* ptr = nullptr;
    if (!kernels::kdn_stream_begin(j.p, j.len, 8, c.x, &ptr)) {
      failed = std::min(failed, j.index);
      continue;
    }
    begun[i] = true;
    schedules[i] = MakeSchedule(j);
    c.ptr = ptr;
    c.end = j.p + j.len;
    c.blocks = j.rows * j.n / 8;
    c.s = &schedules[i];
    c.out = j.out;
  }
  // Four streams in lock-step; when one has no vector steps left, it
  // finishes and the next stream takes its place. The last three run alone.
  auto finish = [&](size_t i) {
    if (!FinishStream(cursors[i], jobs[i], slots)) failed = std::min(failed, jobs[i].index);
  };
  size_t next = 0, slot[4];
  int live = 0;
  for (;;) {
    for (; live < 4 && next < jobs.size(); ++next) {
      if (!begun[next]) continue;
      if (cursors[next].Ready()) {
        slot[live++] = next;
      } else {
        finish(next);
      }
    }
    if (live < 4) break;
    Cursor &c0 = cursors[slot[0]], &c1 = cursors[slot[1]], &c2 = cursors[slot[2]], &c3 = cursors[slot[3]];
    __m256i x0 = load(c0), x1 = load(c1), x2 = load(c2), x3 = load(c3);
    while (c0.Ready() && c1.Ready() && c2.Ready() && c3.Ready()) {
      VectorStep(x0, c0, slots);
      VectorStep(x1, c1, slots);
      VectorStep(x2, c2, slots);
      VectorStep(x3, c3, slots);
    }
    store(c0, x0);
    store(c1, x1);
    store(c2, x2);
    store(c3, x3);
    int kept = 0;
    for (int k = 0; k < 4; ++k) {
      if (cursors[slot[k]].Ready()) {
        slot[kept++] = slot[k];
      } else {
        finish(slot[k]);
      }
    }
    live = kept;
  }
  for (int k = 0; k < live; ++k) {
    Cursor& c = cursors[slot[k]];
    __m256i x = load(c);
    while (c.Ready()) VectorStep(x, c, slots);
    store(c, x);
    finish(slot[k]);
  }
  return failed;
}
#endif  // __x86_64__
#pragma GCC diagnostic pop

}  // namespace

Status TcDecodeCpu(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out,
                   std::shared_ptr<const TcProfile> hint) {
  return TcDecodeCpuWith(shape, data, size, out, std::move(hint), internal::KdnSimdInUse() != internal::KdnSimd::kNone);
}

Status TcDecodeCpuWith(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out,
                       std::shared_ptr<const TcProfile> hint, bool vectors) {
  Result<TcDirectory> d = ParseTcDirectory(shape, data, size, std::move(hint));
  if (!d.ok()) return d.status();
  const TcProfile& pr = *d->profile;
  const std::uint32_t C = pr.channels(), T = shape.tokens, planes = shape.layers * 2, S = d->sinks;
#if defined(__x86_64__)
  const bool use_avx2 = vectors && internal::KdnSimdOfCpu() != internal::KdnSimd::kNone;
  const bool use_avx512 = use_avx2 && internal::KdnSimdInUse() == internal::KdnSimd::kAvx512;
#else
  (void)vectors;
#endif
  // Per plane: its streams (consecutive in the directory, components
  // ascending), its coded components, and their fields by column.
  std::vector<size_t> first_stream(planes + 1, d->streams.size());
  std::vector<std::uint32_t> coded(planes, 0);
  for (size_t s = d->streams.size(); s-- > 0;) {
    first_stream[d->streams[s].plane] = s;
    coded[d->streams[s].plane] += d->streams[s].comps;
  }
  std::vector<std::uint64_t> rows_at(planes + 1, 0);  // a plane's first value
  for (std::uint32_t plane = 0; plane < planes; ++plane) {
    rows_at[plane + 1] = rows_at[plane] + std::uint64_t{T - S} * coded[plane];
  }
  // The values, and the columns' fields. Reused per thread up to kKeep
  // bytes (a fresh buffer this size comes from mmap as zero pages, and
  // faulting them in cost more than the decode).
  constexpr size_t kKeep = size_t{16} << 20;
  const size_t n_values = rows_at[planes];
  thread_local std::vector<float> kept;
  std::vector<float> own;
  std::vector<float>& y = n_values * sizeof(float) <= kKeep ? kept : own;
  if (y.size() < n_values) y.resize(n_values);
  const size_t columns = d->comps.size();
  std::vector<std::uint32_t> table(columns);
  std::vector<std::int32_t> range(columns);
  std::vector<float> step(columns);
  for (const kernels::TcStreamDir& sd : d->streams) {
    for (std::uint32_t c = 0; c < sd.comps; ++c) {
      const std::uint64_t at = std::uint64_t{sd.plane} * C + d->comps[sd.comp_at + c];
      table[sd.comp_at + c] = d->table_of[at];
      range[sd.comp_at + c] = d->range[at];
      step[sd.comp_at + c] = d->step[at];
    }
  }
  std::vector<StreamJob> jobs, wide;
  for (size_t s = 0; s < d->streams.size(); ++s) {
    const kernels::TcStreamDir& sd = d->streams[s];
    const std::uint32_t plane_col0 = d->streams[first_stream[sd.plane]].comp_at;
    StreamJob j;
    j.p = data + sd.offset;
    j.len = sd.length;
    j.lanes = d->lanes;
    j.n = sd.comps;
    j.stride = coded[sd.plane];
    j.col0 = sd.comp_at - plane_col0;
    j.rows = T - S;
    j.table = table.data() + plane_col0;
    j.range = range.data() + plane_col0;
    j.step = step.data() + plane_col0;
    j.out = y.data() + rows_at[sd.plane];
    j.index = static_cast<std::uint32_t>(s);
#if defined(__x86_64__)
    if (use_avx2 && j.lanes == 8 && j.n > 0) {
      wide.push_back(j);
      continue;
    }
#endif
    jobs.push_back(j);
  }
  std::uint32_t bad = ~0u;
  std::vector<std::uint32_t> cols;
  for (const StreamJob& j : jobs) {
    if (!DecodeStreamScalar(j, pr.slots.data(), cols)) {
      bad = j.index;
      break;
    }
  }
#if defined(__x86_64__)
  if (!wide.empty()) bad = std::min(bad, DecodeStreamsAvx2(wide, pr.slots.data()));
#endif
  if (bad != ~0u) {
    return Status::Corrupt("tc payload: stream " + std::to_string(bad) + " (plane " +
                           std::to_string(d->streams[bad].plane) + ") does not decode");
  }
  kernels::TcFinishArgs f = TcFinishScalars(shape, *d);
  f.payload = data;
  f.sinks_at = d->sinks_at.data();
  f.mean = d->mean.data();
  f.out = out;
  // The rotations, once per token (tc_finish_ref's table).
  const auto pairs = static_cast<std::uint64_t>(kernels::rope_pairs(f.rope));
  std::vector<double> cs(std::uint64_t{T} * pairs * 2);
  for (std::uint64_t t = S; t < T; ++t) kernels::tc_finish_cos_sin(f, t, cs.data() + t * pairs * 2);
  std::vector<std::uint32_t> comp(C);
  std::vector<float> val(C), acc(C), row(C);
  RowsArgs r;
  r.C = C;
  r.T = T;
  r.S = S;
  r.finish = &f;
  r.bt = pr.bases_t.data();
  r.cs = cs.data();
  r.comp = comp.data();
  r.val = val.data();
  r.acc = acc.data();
  r.row = row.data();
  bool ok = true;
  for (std::uint32_t plane = 0; plane < planes; ++plane) {
    r.y = y.data() + rows_at[plane];
    r.coded = d->comps.data() + d->streams[first_stream[plane]].comp_at;
    r.n_coded = coded[plane];
#if defined(__x86_64__)
    ok &= use_avx512 ? avx512::PlaneRows(r, plane) : use_avx2 ? avx2::PlaneRows(r, plane) : generic::PlaneRows(r, plane);
#else
    ok &= generic::PlaneRows(r, plane);
#endif
  }
  if (!ok) return Status::Corrupt("tc payload: values overflow the dtype");
  return Status::Ok();
}

}  // namespace kdn::codec
