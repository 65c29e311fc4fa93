// SPDX-License-Identifier: Apache-2.0
// Re-positioning cached keys (common/rope_reposition.h, ref/rope_ref.h and
// the CUDA kernel in rope.cuh):
// - against recompute on the reference model (llama2.c stories260K:
//   interleaved RoPE, theta 10000, head_dim 8): the keys of a sequence at
//   positions [0, n), moved by P, equal the keys the model computes for the
//   same tokens at [P, P + n), in layer 0 (which depends only on token and
//   position) and in every deeper layer (the whole sequence shifted: relative
//   positions, hence attention, are unchanged);
// - NeoX and interleaved, partial rotary, linear and NTK-aware scaling, in
//   f32, f16 and bf16, against a double-precision reference written here from
//   the definitions (key at position q computed from the unrotated key);
// - round trips p -> q -> p, delta 0 as the bit-exact identity, the argument
//   checks;
// - on a GPU (skipped without one): the kernels against the CPU path.
//
// Tolerances are relative to the L2 norm of the head (per token and head) and
// come from the rounding of the stored values: an f32 key carries <= 2^-24
// relative error per element, the rotation (in double, rounded once) adds
// <= 2^-24, so a moved key is within ~2 * 2^-24 = 1.2e-7 of the exact one;
// f16 (2^-11 per rounding) and bf16 (2^-8) likewise. The bounds checked are
// these, with a small margin (MoveTolerance); the tests print what they
// measure.
#include "kernels/ref/rope_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lab/model/checkpoint.h"
#include "lab/model/transformer.h"
#include "test_models.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/rope.cuh"
#endif

namespace kdn::kernels {
namespace {

// ---- the reference, in double, from the definitions (not from the header)

int RotaryDim(const RopeSpec& s) { return s.rotary_dim != 0 ? s.rotary_dim : s.head_dim; }

// The angle RoPE gives pair j at position p.
double RefAngle(const RopeSpec& s, double p, int j) {
  const double r = RotaryDim(s);
  switch (s.scaling) {
    case RopeScaling::kLinear:
      return (p / s.factor) * std::pow(s.theta, -2.0 * j / r);
    case RopeScaling::kNtk:
      return p * std::pow(s.theta * std::pow(s.factor, r / (r - 2.0)), -2.0 * j / r);
    case RopeScaling::kNone:
      break;
  }
  return p * std::pow(s.theta, -2.0 * j / r);
}

// One head's unrotated key x -> the key at position p.
std::vector<double> RefRope(const RopeSpec& s, const double* x, double p) {
  std::vector<double> y(x, x + s.head_dim);
  const int half = RotaryDim(s) / 2;
  for (int j = 0; j < half; ++j) {
    const int a = s.style == RopeStyle::kNeox ? j : 2 * j;
    const int b = s.style == RopeStyle::kNeox ? j + half : 2 * j + 1;
    const double th = RefAngle(s, p, j);
    y[a] = x[a] * std::cos(th) - x[b] * std::sin(th);
    y[b] = x[a] * std::sin(th) + x[b] * std::cos(th);
  }
  return y;
}

// ||got - want|| / ||want|| over n elements.
template <typename G, typename W>
double RelErr(const G* got, const W* want, int n) {
  double d = 0, w = 0;
  for (int i = 0; i < n; ++i) {
    const double e = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    d += e * e;
    w += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return w > 0 ? std::sqrt(d / w) : std::sqrt(d);
}

// ---- keys in any KeyType, with padding between rows

float ToFloat(KeyType t, const std::vector<std::uint16_t>& h, const std::vector<float>& f, size_t i) {
  if (t == KeyType::kF32) return f[i];
  return t == KeyType::kF16 ? half_to_float(h[i]) : bf16_to_float(h[i]);
}

struct KeyBuffer {
  KeyType type;
  int tokens, heads, head_dim;
  std::int64_t stride;
  std::vector<float> f;          // kF32
  std::vector<std::uint16_t> h;  // kF16, kBF16

  KeyBuffer(KeyType t, int n, int kv_heads, int hd, int pad)
      : type(t), tokens(n), heads(kv_heads), head_dim(hd), stride(std::int64_t{kv_heads} * hd + pad) {
    const size_t size = static_cast<size_t>(stride) * static_cast<size_t>(n);
    // Padding holds a value no rotation produces: any write to it shows.
    if (t == KeyType::kF32) {
      f.assign(size, 1234.5f);
    } else {
      h.assign(size, 0x7C01);  // a signalling-NaN pattern in f16, a NaN in bf16
    }
  }
  void* data() { return type == KeyType::kF32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
  size_t Index(int t, int hh, int d) const {
    return static_cast<size_t>(t) * static_cast<size_t>(stride) + static_cast<size_t>(hh) * head_dim + d;
  }
  void Set(int t, int hh, int d, double v) {
    const size_t i = Index(t, hh, d);
    if (type == KeyType::kF32) {
      f[i] = static_cast<float>(v);
    } else {
      h[i] = type == KeyType::kF16 ? float_to_half(static_cast<float>(v)) : float_to_bf16(static_cast<float>(v));
    }
  }
  std::vector<float> Head(int t, int hh) const {
    std::vector<float> out(static_cast<size_t>(head_dim));
    for (int d = 0; d < head_dim; ++d) out[static_cast<size_t>(d)] = ToFloat(type, h, f, Index(t, hh, d));
    return out;
  }
  // Bitwise (NaNs included).
  bool SameBytes(const KeyBuffer& o) const {
    return f.size() == o.f.size() && h == o.h &&
           (f.empty() || std::memcmp(f.data(), o.f.data(), f.size() * sizeof(float)) == 0);
  }
  // Whether the padding and the non-rotary elements equal `o`'s, bit for bit.
  bool UnrotatedEqual(const KeyBuffer& o, int rotary_dim) const {
    for (int t = 0; t < tokens; ++t) {
      for (std::int64_t e = 0; e < stride; ++e) {
        const bool rotary = e < std::int64_t{heads} * head_dim && e % head_dim < rotary_dim;
        if (rotary) continue;
        const size_t i = static_cast<size_t>(t) * static_cast<size_t>(stride) + static_cast<size_t>(e);
        if (type == KeyType::kF32 ? std::memcmp(&f[i], &o.f[i], 4) != 0 : h[i] != o.h[i]) return false;
      }
    }
    return true;
  }
};

const char* TypeName(KeyType t) { return t == KeyType::kF32 ? "f32" : t == KeyType::kF16 ? "f16" : "bf16"; }

// Bounds on the head-relative error of a key moved once: the stored
// rounding plus the rotation's, each <= u (2^-24, 2^-11, 2^-8) of the
// head, so <= 2u, plus a margin (1.5e-7 = 2.5 u for f32). Measured maxima
// (printed by the tests): f32 7.1e-8, f16 6.3e-4, bf16 4.6e-3.
double MoveTolerance(KeyType t) { return t == KeyType::kF32 ? 1.5e-7 : t == KeyType::kF16 ? 1.2e-3 : 1e-2; }

struct NamedSpec {
  const char* name;
  RopeSpec spec;
};

RopeSpec Spec(int head_dim, int rotary_dim, RopeStyle style, RopeScaling scaling = RopeScaling::kNone,
              double factor = 1.0, double theta = 10000.0) {
  RopeSpec s;
  s.head_dim = head_dim;
  s.rotary_dim = rotary_dim;
  s.theta = theta;
  s.style = style;
  s.scaling = scaling;
  s.factor = factor;
  return s;
}

std::vector<NamedSpec> Specs() {
  return {
      {"interleaved full", Spec(64, 0, RopeStyle::kInterleaved)},
      {"neox full", Spec(128, 128, RopeStyle::kNeox, RopeScaling::kNone, 1.0, 500000.0)},
      {"neox partial 25%", Spec(64, 16, RopeStyle::kNeox)},
      {"interleaved partial (GPT-J)", Spec(256, 64, RopeStyle::kInterleaved)},
      {"odd head_dim, partial", Spec(10, 6, RopeStyle::kNeox)},
      {"linear x4", Spec(64, 64, RopeStyle::kNeox, RopeScaling::kLinear, 4.0)},
      {"linear x2 interleaved partial", Spec(32, 16, RopeStyle::kInterleaved, RopeScaling::kLinear, 2.0)},
      {"ntk x8", Spec(64, 64, RopeStyle::kNeox, RopeScaling::kNtk, 8.0)},
      {"ntk x2 interleaved partial", Spec(96, 32, RopeStyle::kInterleaved, RopeScaling::kNtk, 2.0)},
      {"rotary_dim 2", Spec(4, 2, RopeStyle::kInterleaved)},
  };
}

constexpr KeyType kTypes[] = {KeyType::kF32, KeyType::kF16, KeyType::kBF16};

// Unrotated keys x (double, [token][head][head_dim]) stored at `pos`.
struct Scenario {
  std::vector<double> x;
  std::vector<std::int64_t> old_pos, new_pos;
};

Scenario MakeScenario(const RopeSpec& s, int tokens, int heads, std::mt19937_64& rng, bool constant_delta) {
  Scenario sc;
  std::normal_distribution<double> g(0.0, 1.0);
  sc.x.resize(static_cast<size_t>(tokens) * heads * s.head_dim);
  for (double& v : sc.x) v = g(rng);
  std::uniform_int_distribution<std::int64_t> old_d(0, 5000), new_d(0, 40000), shift_d(-3000, 30000);
  const std::int64_t shift = shift_d(rng);
  for (int t = 0; t < tokens; ++t) {
    sc.old_pos.push_back(old_d(rng));
    sc.new_pos.push_back(constant_delta ? sc.old_pos.back() + shift : new_d(rng));
  }
  return sc;
}

KeyBuffer Store(const RopeSpec& s, KeyType type, const Scenario& sc, int tokens, int heads, int pad,
                const std::vector<std::int64_t>& pos) {
  KeyBuffer b(type, tokens, heads, s.head_dim, pad);
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const std::vector<double> y =
          RefRope(s, &sc.x[(static_cast<size_t>(t) * heads + h) * s.head_dim], static_cast<double>(pos[t]));
      for (int d = 0; d < s.head_dim; ++d) b.Set(t, h, d, y[static_cast<size_t>(d)]);
    }
  }
  return b;
}

// Worst head-relative error of `b` against the keys of `sc` at `pos`.
double WorstError(const RopeSpec& s, const KeyBuffer& b, const Scenario& sc, const std::vector<std::int64_t>& pos) {
  double worst = 0;
  for (int t = 0; t < b.tokens; ++t) {
    for (int h = 0; h < b.heads; ++h) {
      const std::vector<double> want =
          RefRope(s, &sc.x[(static_cast<size_t>(t) * b.heads + h) * s.head_dim], static_cast<double>(pos[t]));
      const std::vector<float> got = b.Head(t, h);
      worst = std::max(worst, RelErr(got.data(), want.data(), s.head_dim));
    }
  }
  return worst;
}

// ---- (b) every style, partial rotary and scaling against the reference

TEST(RopeReposition, MatchesTheReferenceForEveryStyleAndScaling) {
  std::mt19937_64 rng(7);
  constexpr int kTokens = 24, kHeads = 3, kPad = 5;
  double worst[3] = {0, 0, 0};  // per KeyType
  for (const NamedSpec& ns : Specs()) {
    ASSERT_EQ(rope_spec_problem(ns.spec), nullptr) << ns.name;
    for (KeyType type : kTypes) {
      for (bool constant : {false, true}) {
        SCOPED_TRACE(std::string(ns.name) + " " + TypeName(type) + (constant ? " shift" : " per-token"));
        const Scenario sc = MakeScenario(ns.spec, kTokens, kHeads, rng, constant);
        KeyBuffer b = Store(ns.spec, type, sc, kTokens, kHeads, kPad, sc.old_pos);
        const KeyBuffer before = b;
        if (constant) {
          const std::int64_t delta = sc.new_pos[0] - sc.old_pos[0];
          ASSERT_TRUE(rope_shift_cpu(ns.spec, type, b.data(), b.stride, kTokens, kHeads, delta));
        } else {
          ASSERT_TRUE(rope_reposition_cpu(ns.spec, type, b.data(), b.stride, kTokens, kHeads, sc.old_pos.data(),
                                          sc.new_pos.data()));
        }
        const double err = WorstError(ns.spec, b, sc, sc.new_pos);
        const double stored = WorstError(ns.spec, before, sc, sc.old_pos);  // the rounding it started with
        EXPECT_LE(stored, MoveTolerance(type) / 2);
        EXPECT_LE(err, MoveTolerance(type));
        worst[static_cast<int>(type)] = std::max(worst[static_cast<int>(type)], err);
        EXPECT_TRUE(b.UnrotatedEqual(before, RotaryDim(ns.spec))) << "non-rotary elements or padding changed";
      }
    }
  }
  for (KeyType type : kTypes) {
    std::printf("[ measured ] moved once, %-4s: worst head-relative error %.2e (bound %.1e)\n", TypeName(type),
                worst[static_cast<int>(type)], MoveTolerance(type));
  }
}

// A shift by one offset and per-token positions with that same delta are
// the same computation, bit for bit; so are per-token deltas and one shift
// per token.
TEST(RopeReposition, ShiftEqualsPerTokenBitForBit) {
  std::mt19937_64 rng(11);
  for (const NamedSpec& ns : Specs()) {
    for (KeyType type : kTypes) {
      SCOPED_TRACE(std::string(ns.name) + " " + TypeName(type));
      const Scenario sc = MakeScenario(ns.spec, 9, 2, rng, /*constant_delta=*/true);
      KeyBuffer a = Store(ns.spec, type, sc, 9, 2, 3, sc.old_pos), b = a;
      ASSERT_TRUE(rope_shift_cpu(ns.spec, type, a.data(), a.stride, 9, 2, sc.new_pos[0] - sc.old_pos[0]));
      ASSERT_TRUE(rope_reposition_cpu(ns.spec, type, b.data(), b.stride, 9, 2, sc.old_pos.data(), sc.new_pos.data()));
      EXPECT_TRUE(a.SameBytes(b));

      const Scenario mixed = MakeScenario(ns.spec, 9, 2, rng, /*constant_delta=*/false);
      KeyBuffer c = Store(ns.spec, type, mixed, 9, 2, 0, mixed.old_pos), d = c;
      ASSERT_TRUE(rope_reposition_cpu(ns.spec, type, c.data(), c.stride, 9, 2, mixed.old_pos.data(),
                                      mixed.new_pos.data()));
      const int bytes = key_type_bytes(type);
      for (int t = 0; t < 9; ++t) {
        auto* row = static_cast<unsigned char*>(d.data()) + t * d.stride * bytes;
        ASSERT_TRUE(rope_shift_cpu(ns.spec, type, row, d.stride, 1, 2,
                                   mixed.new_pos[static_cast<size_t>(t)] - mixed.old_pos[static_cast<size_t>(t)]));
      }
      EXPECT_TRUE(c.SameBytes(d));
    }
  }
}

// ---- (d) round trips and the identity

TEST(RopeReposition, RoundTripReturnsTheOriginal) {
  std::mt19937_64 rng(3);
  double all[3] = {0, 0, 0};  // per KeyType
  for (const NamedSpec& ns : Specs()) {
    for (KeyType type : kTypes) {
      SCOPED_TRACE(std::string(ns.name) + " " + TypeName(type));
      const Scenario sc = MakeScenario(ns.spec, 16, 2, rng, /*constant_delta=*/false);
      KeyBuffer b = Store(ns.spec, type, sc, 16, 2, 1, sc.old_pos);
      const KeyBuffer before = b;
      ASSERT_TRUE(rope_reposition_cpu(ns.spec, type, b.data(), b.stride, 16, 2, sc.old_pos.data(), sc.new_pos.data()));
      ASSERT_TRUE(rope_reposition_cpu(ns.spec, type, b.data(), b.stride, 16, 2, sc.new_pos.data(), sc.old_pos.data()));
      double worst = 0;
      for (int t = 0; t < 16; ++t) {
        for (int h = 0; h < 2; ++h) {
          const std::vector<float> got = b.Head(t, h), want = before.Head(t, h);
          worst = std::max(worst, RelErr(got.data(), want.data(), ns.spec.head_dim));
        }
      }
      all[static_cast<int>(type)] = std::max(all[static_cast<int>(type)], worst);
      // Two rotations, each rounded once (<= u each); the original, not the
      // exact key, is the reference: the one-move bound (2u + margin).
      EXPECT_LE(worst, MoveTolerance(type));
      EXPECT_TRUE(b.UnrotatedEqual(before, RotaryDim(ns.spec)));
    }
  }
  for (KeyType type : kTypes) {
    std::printf("[ measured ] round trip, %-4s: worst head-relative error %.2e (bound %.1e)\n", TypeName(type),
                all[static_cast<int>(type)], MoveTolerance(type));
  }
}

TEST(RopeReposition, DeltaZeroIsTheIdentityBitForBit) {
  const RopeSpec s = Spec(8, 8, RopeStyle::kInterleaved);
  for (KeyType type : kTypes) {
    SCOPED_TRACE(TypeName(type));
    KeyBuffer b(type, 4, 2, 8, 2);
    // Values a rotation by 0 computed in floating point could alter: -0
    // (x*1 - (-y)*0 gives +0), NaN and infinities.
    const double specials[] = {-0.0, 0.0, NAN, INFINITY, -INFINITY, 1e-30, -3.5, 65504.0};
    for (int t = 0; t < 4; ++t) {
      for (int h = 0; h < 2; ++h) {
        for (int d = 0; d < 8; ++d) b.Set(t, h, d, specials[(t + h + d) % 8]);
      }
    }
    const KeyBuffer before = b;
    ASSERT_TRUE(rope_shift_cpu(s, type, b.data(), b.stride, 4, 2, 0));
    EXPECT_TRUE(b.SameBytes(before));
    const std::vector<std::int64_t> pos = {0, 5, 123456789, -7};
    ASSERT_TRUE(rope_reposition_cpu(s, type, b.data(), b.stride, 4, 2, pos.data(), pos.data()));
    EXPECT_TRUE(b.SameBytes(before));
    // Mixed: only the tokens that move change.
    const std::vector<std::int64_t> to = {0, 6, 123456789, -7};
    ASSERT_TRUE(rope_reposition_cpu(s, type, b.data(), b.stride, 4, 2, pos.data(), to.data()));
    for (int t : {0, 2, 3}) {
      for (int h = 0; h < 2; ++h) {
        for (int d = 0; d < 8; ++d) {
          const size_t i = b.Index(t, h, d);
          if (type == KeyType::kF32) {
            EXPECT_EQ(std::memcmp(&b.f[i], &before.f[i], 4), 0);
          } else {
            EXPECT_EQ(b.h[i], before.h[i]);
          }
        }
      }
    }
  }
}

// ---- argument checks

TEST(RopeReposition, RejectsBadSpecsAndArgumentsWithoutWriting) {
  const RopeSpec good = Spec(8, 0, RopeStyle::kInterleaved);
  EXPECT_EQ(rope_spec_problem(good), nullptr);
  EXPECT_EQ(rope_rotary_dim(good), 8);
  std::vector<RopeSpec> bad;
  bad.push_back(Spec(0, 0, RopeStyle::kInterleaved));                        // no head
  bad.push_back(Spec(8, 7, RopeStyle::kInterleaved));                        // odd rotary
  bad.push_back(Spec(8, 10, RopeStyle::kInterleaved));                       // rotary > head
  bad.push_back(Spec(7, 0, RopeStyle::kInterleaved));                        // odd head, full rotary
  bad.push_back(Spec(8, 8, RopeStyle::kInterleaved, RopeScaling::kNone, 1, 0.0));       // theta 0
  bad.push_back(Spec(8, 8, RopeStyle::kInterleaved, RopeScaling::kNone, 1, NAN));       // theta NaN
  bad.push_back(Spec(8, 8, RopeStyle::kInterleaved, RopeScaling::kNone, 1, INFINITY));  // theta inf
  bad.push_back(Spec(8, 8, static_cast<RopeStyle>(2)));                              // style
  bad.push_back(Spec(8, 8, RopeStyle::kNeox, static_cast<RopeScaling>(9)));          // scaling
  bad.push_back(Spec(8, 8, RopeStyle::kNeox, RopeScaling::kLinear, 0.0));            // factor 0
  bad.push_back(Spec(8, 8, RopeStyle::kNeox, RopeScaling::kNtk, -2.0));              // factor < 0
  bad.push_back(Spec(8, 2, RopeStyle::kNeox, RopeScaling::kNtk, 2.0));               // NTK, r = 2
  // Without scaling the factor is not read.
  EXPECT_EQ(rope_spec_problem(Spec(8, 8, RopeStyle::kNeox, RopeScaling::kNone, 0.0)), nullptr);

  std::vector<float> keys(64, 1.0f);
  const std::vector<float> copy = keys;
  const std::vector<std::int64_t> from = {0, 0, 0, 0}, to = {3, 3, 3, 3};
  for (const RopeSpec& s : bad) {
    EXPECT_NE(rope_spec_problem(s), nullptr);
    EXPECT_FALSE(RepositionKeysF32(s, keys.data(), 16, 4, 2, from.data(), to.data()));
    EXPECT_FALSE(RepositionKeysF32Delta(s, keys.data(), 16, 4, 2, 3));
  }
  EXPECT_FALSE(RepositionKeysF32(good, keys.data(), 15, 4, 2, from.data(), to.data()));  // rows overlap
  EXPECT_FALSE(RepositionKeysF32Delta(good, keys.data(), 16, 4, 0, 3));                  // no heads
  EXPECT_FALSE(RepositionKeysF32Delta(good, keys.data(), 16, -1, 2, 3));                 // tokens < 0
  EXPECT_FALSE(RepositionKeysF32(good, nullptr, 16, 4, 2, from.data(), to.data()));
  EXPECT_FALSE(RepositionKeysF32(good, keys.data(), 16, 4, 2, nullptr, to.data()));
  EXPECT_FALSE(RepositionKeysF32Delta(good, nullptr, 16, 4, 2, 3));
  EXPECT_FALSE(rope_shift_cpu(good, static_cast<KeyType>(3), keys.data(), 16, 4, 2, 3));
  EXPECT_FALSE(rope_reposition_cpu(good, static_cast<KeyType>(3), keys.data(), 16, 4, 2, from.data(), to.data()));
  EXPECT_EQ(keys, copy);
  // Nothing to do is fine, null pointers included.
  EXPECT_TRUE(RepositionKeysF32(good, nullptr, 16, 0, 2, nullptr, nullptr));
  EXPECT_TRUE(RepositionKeysF32Delta(good, nullptr, 16, 4, 2, 0));
  EXPECT_TRUE(RepositionKeysF32Delta(good, keys.data(), 16, 4, 2, 3));
  EXPECT_NE(keys, copy);
}

// The NTK theta and the scaled frequencies follow the documented formulas.
TEST(RopeReposition, ScaledFrequencies) {
  const RopeSpec ntk = Spec(64, 64, RopeStyle::kNeox, RopeScaling::kNtk, 4.0);
  EXPECT_DOUBLE_EQ(rope_ntk_theta(10000.0, 4.0, 64), 10000.0 * std::pow(4.0, 64.0 / 62.0));
  // NTK keeps the highest frequency and divides the lowest by the factor.
  EXPECT_DOUBLE_EQ(rope_spec_inv_freq(ntk, 0), 1.0);
  EXPECT_NEAR(rope_spec_inv_freq(ntk, 31) / std::pow(10000.0, -62.0 / 64.0), 1.0 / 4.0, 1e-14);
  const RopeSpec lin = Spec(64, 64, RopeStyle::kNeox, RopeScaling::kLinear, 4.0);
  for (int j = 0; j < 32; ++j) {
    EXPECT_DOUBLE_EQ(rope_spec_inv_freq(lin, j), rope_inv_freq(j, 64, 10000.0) / 4.0);
  }
}

// ---- (a) against recompute on the reference model

// Keys of every layer, [layer][token][kv_dim], in double, for `tokens` at
// positions [start, start + n), attending only among themselves: the
// llama2.c forward pass written out plainly (the Transformer cannot run a
// sequence at an offset without attending to the positions before it).
std::vector<std::vector<double>> RefForwardKeys(const model::Checkpoint& w, const std::vector<int>& tokens, int start) {
  const model::ModelConfig& c = w.config();
  const int n = static_cast<int>(tokens.size()), dim = c.dim, hd = c.head_dim(), kvd = c.kv_dim(),
            hid = c.hidden_dim, group = c.n_heads / c.n_kv_heads;
  using Vec = std::vector<double>;
  auto matvec = [](const float* m, const double* x, int rows, int cols) {
    Vec y(rows);
    for (int r = 0; r < rows; ++r) {
      double s = 0;
      for (int k = 0; k < cols; ++k) s += static_cast<double>(m[r * cols + k]) * x[k];
      y[r] = s;
    }
    return y;
  };
  auto rmsnorm = [dim](const Vec& x, const float* g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
    Vec y(x.size());
    for (int i = 0; i < dim; ++i) y[i] = g[i] * inv * x[i];
    return y;
  };
  const RopeSpec spec = Spec(hd, hd, RopeStyle::kInterleaved);
  auto rope = [&](Vec& v, int heads, int pos) {
    for (int h = 0; h < heads; ++h) {
      const Vec y = RefRope(spec, &v[h * hd], pos);
      std::copy(y.begin(), y.end(), v.begin() + static_cast<std::ptrdiff_t>(h) * hd);
    }
  };
  std::vector<Vec> x(n);
  for (int i = 0; i < n; ++i) {
    const float* e = w.tok_emb() + static_cast<size_t>(tokens[i]) * dim;
    x[i].assign(e, e + dim);
  }
  std::vector<Vec> keys_out;
  for (int l = 0; l < c.n_layers; ++l) {
    const model::Checkpoint::Layer& L = w.layer(l);
    std::vector<Vec> q(n), k(n), v(n);
    for (int i = 0; i < n; ++i) {
      const Vec xb = rmsnorm(x[i], L.rms_att);
      q[i] = matvec(L.wq, xb.data(), dim, dim);
      k[i] = matvec(L.wk, xb.data(), kvd, dim);
      v[i] = matvec(L.wv, xb.data(), kvd, dim);
      rope(q[i], c.n_heads, start + i);
      rope(k[i], c.n_kv_heads, start + i);
    }
    Vec layer_keys;
    for (const Vec& ki : k) layer_keys.insert(layer_keys.end(), ki.begin(), ki.end());
    keys_out.push_back(std::move(layer_keys));
    for (int i = 0; i < n; ++i) {
      Vec att(dim, 0.0);
      for (int h = 0; h < c.n_heads; ++h) {
        const int g = h / group;
        Vec score(i + 1);
        double mx = -INFINITY;
        for (int t = 0; t <= i; ++t) {
          double s = 0;
          for (int d = 0; d < hd; ++d) s += q[i][h * hd + d] * k[t][g * hd + d];
          score[t] = s / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, score[t]);
        }
        double sum = 0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (int t = 0; t <= i; ++t) {
          for (int d = 0; d < hd; ++d) att[h * hd + d] += score[t] / sum * v[t][g * hd + d];
        }
      }
      const Vec o = matvec(L.wo, att.data(), dim, dim);
      Vec& xi = x[i];
      for (int d = 0; d < dim; ++d) xi[d] += o[d];
      const Vec xb = rmsnorm(xi, L.rms_ffn);
      const Vec h1 = matvec(L.w1, xb.data(), hid, dim), h3 = matvec(L.w3, xb.data(), hid, dim);
      Vec hh(hid);
      for (int e = 0; e < hid; ++e) {
        const double a = h1[e];
        hh[e] = a / (1.0 + std::exp(-a)) * h3[e];
      }
      const Vec f = matvec(L.w2, hh.data(), dim, hid);
      for (int d = 0; d < dim; ++d) xi[d] += f[d];
    }
  }
  return keys_out;
}

// Worst head-relative error of n rows of float keys [n][kv_heads][hd]
// against keys of the same shape.
template <typename T>
double WorstHeadError(const float* got, const T* want, int n, int kv_heads, int hd) {
  double worst = 0;
  for (int i = 0; i < n * kv_heads; ++i) {
    worst = std::max(worst, RelErr(got + static_cast<size_t>(i) * hd, want + static_cast<size_t>(i) * hd, hd));
  }
  return worst;
}

class RopeModel : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    auto w = model::Checkpoint::Load(testing::ModelPath());
    ASSERT_TRUE(w.ok()) << w.status().message();
    weights_ = std::make_unique<model::Checkpoint>(std::move(w).value());
    tokens_.push_back(1);  // BOS
    tokens_.insert(tokens_.end(), testing::kReferenceIds.begin(), testing::kReferenceIds.end());
  }
  RopeSpec ModelSpec() const { return Spec(weights_->config().head_dim(), 0, RopeStyle::kInterleaved); }
  std::unique_ptr<model::Checkpoint> weights_;
  std::vector<int> tokens_;
};

constexpr int kOffsets[] = {37, 100, 300};

// Layer 0's keys depend only on the token and its position, so the
// Transformer itself gives the keys at [P, P + n) (with an empty prefix its
// deeper layers differ: they attend to the empty positions too). The model
// rounds cos/sin to float and rotates in float (<= ~3 * 2^-24 of the head);
// the move rotates in double (<= 2^-24): bound 5e-7; measured <= 2.0e-7.
TEST_F(RopeModel, Layer0KeysMatchRecomputeAtTheNewPositions) {
  const model::ModelConfig& c = weights_->config();
  const int n = static_cast<int>(tokens_.size()), kvd = c.kv_dim(), hd = c.head_dim();
  model::Transformer tf(*weights_, 1);
  model::KvCache at0 = tf.NewCache();
  ASSERT_TRUE(tf.Forward(tokens_, 0, at0, nullptr).ok());
  for (int p : kOffsets) {
    SCOPED_TRACE("P = " + std::to_string(p));
    model::KvCache atp = tf.NewCache();
    ASSERT_TRUE(tf.Forward(tokens_, p, atp, nullptr).ok());
    std::vector<float> shifted(at0.k(0, 0), at0.k(0, 0) + static_cast<size_t>(n) * kvd);
    std::vector<float> moved = shifted;
    ASSERT_TRUE(RepositionKeysF32Delta(ModelSpec(), shifted.data(), kvd, n, c.n_kv_heads, p));
    std::vector<std::int64_t> from, to;
    for (int i = 0; i < n; ++i) {
      from.push_back(i);
      to.push_back(p + i);
    }
    ASSERT_TRUE(RepositionKeysF32(ModelSpec(), moved.data(), kvd, n, c.n_kv_heads, from.data(), to.data()));
    EXPECT_EQ(std::memcmp(shifted.data(), moved.data(), shifted.size() * sizeof(float)), 0);
    const double err = WorstHeadError(shifted.data(), atp.k(0, p), n, c.n_kv_heads, hd);
    std::printf("[ measured ] layer 0, P = %d: worst head-relative error %.2e\n", p, err);
    EXPECT_LE(err, 5e-7);
    // The comparison discriminates: one position off is far outside it.
    std::vector<float> off(at0.k(0, 0), at0.k(0, 0) + static_cast<size_t>(n) * kvd);
    ASSERT_TRUE(RepositionKeysF32Delta(ModelSpec(), off.data(), kvd, n, c.n_kv_heads, p + 1));
    EXPECT_GT(WorstHeadError(off.data(), atp.k(0, p), n, c.n_kv_heads, hd), 1e-2);
  }
}

// The whole sequence shifted by P: every layer's keys are the position-0 run's
// keys rotated by P. Checked two ways against a double-precision forward pass
// at [P, P + n):
// - rotating that forward pass's own position-0 keys (rounded to float):
//   only the float rounding remains (bound 1.5e-7 of the head, as
//   MoveTolerance(kF32); measured <= 1.0e-7);
// - rotating the Transformer's (float) keys: adds the Transformer's float
//   arithmetic through the layers, measured against the double forward at
//   position 0 first (7.8e-7); the bound is that error x 1.5 plus the
//   rotation's (measured <= 7.7e-7: the move adds nothing visible).
TEST_F(RopeModel, EveryLayersKeysMatchTheShiftedSequence) {
  const model::ModelConfig& c = weights_->config();
  const int n = static_cast<int>(tokens_.size()), kvd = c.kv_dim(), hd = c.head_dim();
  model::Transformer tf(*weights_, 1);
  model::KvCache at0 = tf.NewCache();
  ASSERT_TRUE(tf.Forward(tokens_, 0, at0, nullptr).ok());
  const auto ref0 = RefForwardKeys(*weights_, tokens_, 0);
  double model_err = 0;  // the Transformer's float forward against the double one
  for (int l = 0; l < c.n_layers; ++l) {
    model_err = std::max(model_err, WorstHeadError(at0.k(l, 0), ref0[l].data(), n, c.n_kv_heads, hd));
  }
  std::printf("[ measured ] Transformer (float) vs double forward, all layers: %.2e\n", model_err);
  ASSERT_LE(model_err, 1e-4) << "the in-test forward pass does not reproduce the Transformer";
  for (int p : kOffsets) {
    SCOPED_TRACE("P = " + std::to_string(p));
    const auto refp = RefForwardKeys(*weights_, tokens_, p);
    double own = 0, tf_err = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const std::vector<double>& want = refp[static_cast<size_t>(l)];
      std::vector<float> a(ref0[static_cast<size_t>(l)].begin(), ref0[static_cast<size_t>(l)].end());
      ASSERT_TRUE(RepositionKeysF32Delta(ModelSpec(), a.data(), kvd, n, c.n_kv_heads, p));
      own = std::max(own, WorstHeadError(a.data(), want.data(), n, c.n_kv_heads, hd));
      std::vector<float> b(at0.k(l, 0), at0.k(l, 0) + static_cast<size_t>(n) * kvd);
      ASSERT_TRUE(RepositionKeysF32Delta(ModelSpec(), b.data(), kvd, n, c.n_kv_heads, p));
      tf_err = std::max(tf_err, WorstHeadError(b.data(), want.data(), n, c.n_kv_heads, hd));
    }
    std::printf("[ measured ] all layers, P = %d: double forward moved %.2e, Transformer moved %.2e\n", p, own,
                tf_err);
    EXPECT_LE(own, MoveTolerance(KeyType::kF32));
    EXPECT_LE(tf_err, 1.5 * model_err + 3e-7);
  }
}

// ---- (c) the CUDA kernels against the CPU path

#ifdef KDN_HAVE_CUDA
bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(RopeCuda, LaunchersRejectBadArgumentsBeforeLaunching) {
  RopeRepositionArgs a;
  a.spec = Spec(8, 8, RopeStyle::kInterleaved);
  a.kv_heads = 2;
  a.row_stride = 16;
  a.tokens = 4;
  a.delta = 3;
  EXPECT_EQ(launch_rope_shift(a, nullptr), cudaErrorInvalidValue);       // null keys
  EXPECT_EQ(launch_rope_reposition(a, nullptr), cudaErrorInvalidValue);  // null keys and positions
  RopeRepositionArgs b = a;
  b.spec.rotary_dim = 7;
  EXPECT_EQ(launch_rope_shift(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.row_stride = 15;
  EXPECT_EQ(launch_rope_shift(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.type = static_cast<KeyType>(5);
  EXPECT_EQ(launch_rope_reposition(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.spec.head_dim = b.spec.rotary_dim = kRopeMaxRotaryDim + 2;
  b.row_stride = 2 * b.spec.head_dim;
  EXPECT_EQ(launch_rope_shift(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.tokens = 0;
  EXPECT_EQ(launch_rope_reposition(b, nullptr), cudaSuccess);
  b = a;
  b.delta = 0;
  EXPECT_EQ(launch_rope_shift(b, nullptr), cudaSuccess);
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// The GPU computes the same formula; its double pow/sincos may differ from
// glibc's in the last double bit, which can flip the final rounding of an
// element by one ulp of its type: bound one ulp of the head's norm.
TEST(RopeCuda, MatchesTheCpuPath) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their math is checked on the CPU above";
  std::mt19937_64 rng(5);
  constexpr int kTokens = 300, kHeads = 4, kPad = 2;
  for (const NamedSpec& ns : Specs()) {
    for (KeyType type : kTypes) {
      for (bool constant : {false, true}) {
        SCOPED_TRACE(std::string(ns.name) + " " + TypeName(type) + (constant ? " shift" : " per-token"));
        const Scenario sc = MakeScenario(ns.spec, kTokens, kHeads, rng, constant);
        KeyBuffer cpu = Store(ns.spec, type, sc, kTokens, kHeads, kPad, sc.old_pos), gpu = cpu;
        const size_t bytes = static_cast<size_t>(cpu.stride) * kTokens * key_type_bytes(type);
        RopeRepositionArgs a;
        a.spec = ns.spec;
        a.type = type;
        a.row_stride = cpu.stride;
        a.tokens = kTokens;
        a.kv_heads = kHeads;
        a.delta = sc.new_pos[0] - sc.old_pos[0];
        std::int64_t *dold = nullptr, *dnew = nullptr;
        CUDA_OK(cudaMalloc(&a.keys, bytes));
        CUDA_OK(cudaMalloc(&dold, kTokens * sizeof(std::int64_t)));
        CUDA_OK(cudaMalloc(&dnew, kTokens * sizeof(std::int64_t)));
        CUDA_OK(cudaMemcpy(a.keys, gpu.data(), bytes, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dold, sc.old_pos.data(), kTokens * sizeof(std::int64_t), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMemcpy(dnew, sc.new_pos.data(), kTokens * sizeof(std::int64_t), cudaMemcpyHostToDevice));
        a.old_pos = dold;
        a.new_pos = dnew;
        if (constant) {
          CUDA_OK(launch_rope_shift(a, nullptr));
          ASSERT_TRUE(rope_shift_cpu(ns.spec, type, cpu.data(), cpu.stride, kTokens, kHeads, a.delta));
        } else {
          CUDA_OK(launch_rope_reposition(a, nullptr));
          ASSERT_TRUE(rope_reposition_cpu(ns.spec, type, cpu.data(), cpu.stride, kTokens, kHeads, sc.old_pos.data(),
                                          sc.new_pos.data()));
        }
        CUDA_OK(cudaMemcpy(gpu.data(), a.keys, bytes, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaFree(a.keys));
        CUDA_OK(cudaFree(dold));
        CUDA_OK(cudaFree(dnew));
        const double ulp = type == KeyType::kF32 ? 0x1p-23 : type == KeyType::kF16 ? 0x1p-10 : 0x1p-7;
        double worst = 0;
        for (int t = 0; t < kTokens; ++t) {
          for (int h = 0; h < kHeads; ++h) {
            const std::vector<float> g = gpu.Head(t, h), c = cpu.Head(t, h);
            worst = std::max(worst, RelErr(g.data(), c.data(), ns.spec.head_dim));
          }
        }
        EXPECT_LE(worst, ulp);
        EXPECT_TRUE(gpu.UnrotatedEqual(cpu, RotaryDim(ns.spec)));
      }
    }
  }
}
#endif  // KDN_HAVE_CUDA

}  // namespace
}  // namespace kdn::kernels
