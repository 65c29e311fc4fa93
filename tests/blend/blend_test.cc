// SPDX-License-Identifier: Apache-2.0
// The blender (core/blend/blend.h) on the reference model: ratio 100%
// reproduces full prefill's KV, ratio 0% is naive reuse (placed, re-positioned
// KV; only fresh tokens computed), selection follows the options, a failing
// engine stops the blend with its status, and bad input is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "core/blend/blend.h"
#include "lab/blend/eval.h"
#include "lab/blend/transformer_engine.h"
#include "lab/model/checkpoint.h"
#include "lab/model/transformer.h"
#include "kernels/ref/rope_ref.h"
#include "reference_pieces.h"
#include "test_models.h"

namespace kdn::blend {
namespace {

using testing::Cached;
using testing::Chunk;
using testing::Fixture;
using testing::kBos;
using testing::Load;

// One check layer (1), as CacheBlend: the mechanics tests count on it.
BlendOptions Options(const model::ModelConfig& c, double ratio) {
  BlendOptions o;
  o.ratio = ratio;
  o.check_layers = {1};
  o.rope = Llama2cRope(c);
  return o;
}

// BOS, two cached chunks of 30, a query of 4: the context of the selection tests.
std::vector<Piece> TwoChunksAndAQuery(model::Transformer& t) {
  return {Piece{{kBos}, {}, 0}, Cached(t, Chunk(6, 30)), Cached(t, Chunk(7, 30)), Piece{Chunk(8, 4), {}, 0}};
}

// Full prefill's KV of the pieces' tokens, in Compose's layout.
std::vector<float> FullPrefill(model::Transformer& t, const std::vector<Piece>& pieces) {
  std::vector<int> ctx;
  for (const Piece& p : pieces) ctx.insert(ctx.end(), p.tokens.begin(), p.tokens.end());
  model::KvCache full = t.NewCache();
  EXPECT_TRUE(t.Forward(ctx, 0, full, nullptr).ok());
  return full.Export(0, static_cast<int>(ctx.size()));
}

double SquaredError(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double err = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) err += (a[i] - b[i]) * (a[i] - b[i]);
  return err;
}

TEST(BlendTest, FullRatioReproducesPrefill) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  const std::vector<std::int32_t> a = Chunk(0, 20), b = Chunk(1, 17), q = Chunk(2, 6);
  std::vector<Piece> pieces = {Piece{{kBos}, {}, 0}, Cached(*f.t, b), Cached(*f.t, a), Piece{q, {}, 0}};
  TransformerEngine engine(*f.t);
  std::vector<float> kv;
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, Options(c, 1.0), engine, &kv);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_DOUBLE_EQ(r->recompute_fraction, 1.0);
  EXPECT_EQ(r->selected, 37);
  // Full prefill of the same context.
  std::vector<int> ctx = {kBos};
  ctx.insert(ctx.end(), b.begin(), b.end());
  ctx.insert(ctx.end(), a.begin(), a.end());
  ctx.insert(ctx.end(), q.begin(), q.end());
  model::KvCache full = f.t->NewCache();
  ASSERT_TRUE(f.t->Forward(ctx, 0, full, nullptr).ok());
  const std::vector<float> want = full.Export(0, static_cast<int>(ctx.size()));
  ASSERT_EQ(kv.size(), want.size());
  // The same arithmetic row by row: equal to the bit (the tolerance is
  // only there to report a difference readably).
  for (size_t i = 0; i < kv.size(); ++i) ASSERT_NEAR(kv[i], want[i], 0.0f) << i;
}

TEST(BlendTest, ZeroRatioIsNaiveReuse) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  const std::vector<std::int32_t> a = Chunk(3, 24), b = Chunk(4, 11), q = Chunk(5, 5);
  const Piece pa = Cached(*f.t, a), pb = Cached(*f.t, b);
  std::vector<Piece> pieces = {pa, pb, Piece{q, {}, 0}};
  TransformerEngine engine(*f.t);
  std::vector<float> kv;
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, Options(c, 0.0), engine, &kv);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->selected, 0);
  EXPECT_EQ(r->cached_positions, 35);
  EXPECT_EQ(r->fresh_positions, 5);
  for (int n : r->recomputed_per_layer) EXPECT_EQ(n, 5);
  // Naive by hand: the cached KV re-positioned (a from 1 to 0, b from 1 to
  // 24), then the query computed over it.
  model::KvCache cache = f.t->NewCache();
  const int kvd = c.kv_dim();
  for (const auto& [piece, at] : {std::pair<const Piece*, int>{&pa, 0}, std::pair<const Piece*, int>{&pb, 24}}) {
    std::vector<float> moved = piece->kv;
    const int n = static_cast<int>(piece->tokens.size());
    for (int l = 0; l < c.n_layers; ++l) {
      ASSERT_TRUE(kernels::rope_shift_cpu(Llama2cRope(c), kernels::KeyType::kF32,
                                          moved.data() + static_cast<size_t>(l) * 2 * n * kvd, kvd, n, c.n_kv_heads,
                                          at - 1));
    }
    ASSERT_TRUE(cache.Import(at, n, moved).ok());
  }
  ASSERT_TRUE(f.t->Forward(std::vector<int>(q.begin(), q.end()), 35, cache, nullptr).ok());
  const std::vector<float> want = cache.Export(0, 40);
  ASSERT_EQ(kv.size(), want.size());
  for (size_t i = 0; i < kv.size(); ++i) ASSERT_NEAR(kv[i], want[i], 0.0f) << i;
}

TEST(BlendTest, SelectsTheRatioAndGradually) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  std::vector<Piece> pieces = TwoChunksAndAQuery(*f.t);
  TransformerEngine engine(*f.t);
  std::vector<float> kv;
  BlendOptions o = Options(c, 0.2);
  o.kv_pass = false;  // check layers run whole, as CacheBlend publishes it (the KV pass: below)
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, o, engine, &kv);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->selected, 12);  // 20% of 60
  EXPECT_EQ(r->recomputed_per_layer, (std::vector<int>{65, 65, 17, 17, 17}));
  EXPECT_NEAR(r->recompute_fraction, (65.0 * 2 + 17 * 3) / (5 * 65.0), 1e-12);
  // Gradual: 60 * 0.2^(1/2) = 27 after layer 1, 12 after layer 3.
  o.check_layers = {1, 3};
  r = Compose(ShapeOf(c), pieces, o, engine, &kv);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->recomputed_per_layer, (std::vector<int>{65, 65, 32, 32, 17}));
  // A threshold instead of a ratio: 0 keeps every cached position.
  o.threshold = 0;
  r = Compose(ShapeOf(c), pieces, o, engine, &kv);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->selected, 60);
  // The selection follows the keys' deviation: recomputing more moves the
  // composed KV closer to full prefill's. (The first chunk sits where it was
  // computed, right after the BOS: its KV is already exact, it deviates by
  // 0 and is picked last; half the cached tokens recomputed is exact.)
  const std::vector<float> want = FullPrefill(*f.t, pieces);
  double prev = INFINITY;
  for (double ratio : {0.0, 0.1, 0.3, 0.5}) {
    ASSERT_TRUE(Compose(ShapeOf(c), pieces, Options(c, ratio), engine, &kv).ok());
    const double err = SquaredError(kv, want);
    if (ratio < 0.5) {
      EXPECT_LT(err, prev) << ratio;
    }
    prev = err;
  }
  EXPECT_EQ(prev, 0.0);
}

// first_tokens (EPIC/LegoLink): the first k positions of each cached piece
// run through every layer, as fresh ones; the check layers select among the
// rest, `ratio` of those. With ratio 0 only they (and the fresh ones) run.
// A piece that sits where it was computed (right after the BOS) is exact
// already: recomputing its first tokens changes nothing; the other piece's
// first tokens, recomputed in context, move its KV closer to full prefill's.
TEST(BlendTest, FirstTokensOfEachPieceRunThroughEveryLayer) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  std::vector<Piece> pieces = TwoChunksAndAQuery(*f.t);
  TransformerEngine engine(*f.t);
  std::vector<float> kv;
  BlendOptions o = Options(c, 0.0);
  o.first_tokens = 3;
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, o, engine, &kv);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->anchored, 6);
  EXPECT_EQ(r->selected, 0);
  EXPECT_EQ(r->recomputed_per_layer, (std::vector<int>(5, 11)));  // BOS, 2 x 3 anchored, 4 query
  EXPECT_NEAR(r->recompute_fraction, 11.0 / 65.0, 1e-12);
  // Beside a ratio: 20% of the 54 other cached positions (11), selected past layer 1.
  o.ratio = 0.2;
  r = Compose(ShapeOf(c), pieces, o, engine, &kv);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->anchored, 6);
  EXPECT_EQ(r->selected, 11);
  // Check layer 1 by a KV pass over the 54 candidates; the 11 selected, the
  // 6 anchored and the 5 fresh run it whole.
  EXPECT_EQ(r->recomputed_per_layer, (std::vector<int>{65, 22, 22, 22, 22}));
  EXPECT_EQ(r->kv_pass_per_layer, (std::vector<int>{0, 54, 0, 0, 0}));
  for (int p : r->selected_positions) {
    EXPECT_FALSE((p >= 1 && p < 4) || (p >= 31 && p < 34)) << p << " is anchored, not selected";
  }
  // Closer to full prefill than naive reuse; the second piece's first tokens
  // are exact at layer 0 (computed in context from their embeddings).
  const std::vector<float> want = FullPrefill(*f.t, pieces);
  auto error_at = [&](const BlendOptions& bo) {
    EXPECT_TRUE(Compose(ShapeOf(c), pieces, bo, engine, &kv).ok());
    return SquaredError(kv, want);
  };
  BlendOptions naive = Options(c, 0.0), anchors = Options(c, 0.0);
  anchors.first_tokens = 3;
  EXPECT_LT(error_at(anchors), error_at(naive));
  // Every cached position anchored is full prefill.
  anchors.first_tokens = 30;
  EXPECT_EQ(error_at(anchors), 0.0);
  // A negative count is refused.
  anchors.first_tokens = -1;
  EXPECT_EQ(Compose(ShapeOf(c), pieces, anchors, engine, &kv).status().code(), Code::kInvalidArgument);
}

// A KV pass at the check layers (the engine gives a layer's K and V alone):
// the same selection and the same KV as whole check layers, bit for bit,
// for less work; the pass's rows are counted at the engine's stated cost. At
// ratio 1 nothing would be dropped, so no pass is made.
TEST(BlendTest, AKvPassAtTheCheckLayersGivesTheSameKvForLessWork) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  std::vector<Piece> pieces = TwoChunksAndAQuery(*f.t);
  TransformerEngine engine(*f.t);
  const double cost = engine.kv_pass_cost(65);
  EXPECT_GT(cost, 0.0);
  EXPECT_LT(cost, 0.1);  // K and V are a small part of a layer's work
  struct Case {
    double ratio;
    std::vector<int> checks;
    int first_tokens;
    std::vector<int> whole_layers, pass_rows;
  };
  const Case cases[] = {
      {0.2, {1}, 0, {65, 17, 17, 17, 17}, {0, 60, 0, 0, 0}},
      {0.2, {1, 3}, 0, {65, 32, 32, 17, 17}, {0, 60, 0, 27, 0}},  // 27 after layer 1, 12 after layer 3
      {0.2, {0}, 0, {17, 17, 17, 17, 17}, {60, 0, 0, 0, 0}},      // blind at layer 0, but valid
      {0.2, {1}, 3, {65, 22, 22, 22, 22}, {0, 54, 0, 0, 0}},
      {1.0, {1}, 0, {65, 65, 65, 65, 65}, {0, 0, 0, 0, 0}},
  };
  for (const Case& k : cases) {
    BlendOptions o = Options(c, k.ratio);
    o.check_layers = k.checks;
    o.first_tokens = k.first_tokens;
    std::vector<float> by_pass, whole;
    Result<BlendReport> a = Compose(ShapeOf(c), pieces, o, engine, &by_pass);
    o.kv_pass = false;
    Result<BlendReport> b = Compose(ShapeOf(c), pieces, o, engine, &whole);
    ASSERT_TRUE(a.ok() && b.ok()) << k.ratio;
    EXPECT_EQ(a->selected_positions, b->selected_positions) << k.ratio;
    EXPECT_EQ(a->recomputed_per_layer, k.whole_layers) << k.ratio;
    EXPECT_EQ(a->kv_pass_per_layer, k.pass_rows) << k.ratio;
    EXPECT_EQ(b->kv_pass_per_layer, std::vector<int>(5, 0));
    ASSERT_EQ(by_pass.size(), whole.size());
    for (size_t i = 0; i < by_pass.size(); ++i) ASSERT_EQ(by_pass[i], whole[i]) << k.ratio << " at " << i;
    const double passes = std::accumulate(k.pass_rows.begin(), k.pass_rows.end(), 0.0);
    EXPECT_NEAR(a->recompute_fraction,
                (std::accumulate(k.whole_layers.begin(), k.whole_layers.end(), 0.0) + cost * passes) / (5 * 65.0),
                1e-12);
    if (passes > 0) {
      EXPECT_LT(a->recompute_fraction, b->recompute_fraction) << k.ratio;
    } else {
      EXPECT_EQ(a->recompute_fraction, b->recompute_fraction);
    }
  }
}

// The defaults (chosen on the tuning text, docs/blending.md): ratio 0.28 over
// check layers 1 and 2 by a KV pass; fewer check layers in shallower models.
TEST(BlendTest, DefaultsAreTheTunedMethod) {
  const BlendOptions d;
  EXPECT_EQ(d.ratio, 0.28);
  EXPECT_TRUE(d.kv_pass);
  EXPECT_EQ(d.first_tokens, 0);
  EXPECT_EQ(CheckLayersFor(d, 32), (std::vector<int>{1, 2}));
  EXPECT_EQ(CheckLayersFor(d, 5), (std::vector<int>{1, 2}));
  EXPECT_EQ(CheckLayersFor(d, 2), (std::vector<int>{1}));
  EXPECT_EQ(CheckLayersFor(d, 1), (std::vector<int>{0}));
  BlendOptions mine;
  mine.check_layers = {3};
  EXPECT_EQ(CheckLayersFor(mine, 5), (std::vector<int>{3}));
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  std::vector<Piece> pieces = TwoChunksAndAQuery(*f.t);
  TransformerEngine engine(*f.t);
  BlendOptions o;
  o.rope = Llama2cRope(c);
  std::vector<float> kv;
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, o, engine, &kv);
  ASSERT_TRUE(r.ok()) << r.status().message();
  // 60 cached: 60 x 0.28^(1/2) = 32 after layer 1, 60 x 0.28 = 17 after layer 2.
  EXPECT_EQ(r->kv_pass_per_layer, (std::vector<int>{0, 60, 32, 0, 0}));
  EXPECT_EQ(r->recomputed_per_layer, (std::vector<int>{65, 37, 22, 22, 22}));
  EXPECT_EQ(r->selected, 17);
}

// An engine that fails at one layer.
class FailingEngine final : public LayerEngine {
 public:
  FailingEngine(LayerEngine& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k,
               float* v, int total) override {
    ++calls;
    if (layer == fail_at_) return Status(Code::kUnavailable, "engine: device lost at layer " + std::to_string(layer));
    return inner_.Layer(layer, positions, tokens, hidden, k, v, total);
  }
  int hidden_dim() const override { return inner_.hidden_dim(); }
  int calls = 0;

 private:
  LayerEngine& inner_;
  int fail_at_;
};

TEST(BlendTest, AFailingEngineStopsTheBlendWithItsStatus) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  std::vector<Piece> pieces = {Cached(*f.t, Chunk(9, 10)), Piece{Chunk(10, 3), {}, 0}};
  TransformerEngine inner(*f.t);
  FailingEngine engine(inner, 2);
  std::vector<float> kv;
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, Options(c, 0.5), engine, &kv);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("layer 2"), std::string::npos);
  EXPECT_EQ(engine.calls, 3);  // layers 0, 1, 2: nothing after the failure
}

// An engine whose KV pass fails: the blend stops with its status.
class FailingKvPassEngine final : public LayerEngine {
 public:
  explicit FailingKvPassEngine(LayerEngine& inner) : inner_(inner) {}
  Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k,
               float* v, int total) override {
    ++layers;
    return inner_.Layer(layer, positions, tokens, hidden, k, v, total);
  }
  Status KvPass(int layer, std::span<const int>, std::span<const int>, float*, float*, float*, int) override {
    return Status(Code::kUnavailable, "engine: no K at layer " + std::to_string(layer));
  }
  bool has_kv_pass() const override { return true; }
  double kv_pass_cost(int) const override { return cost; }
  int hidden_dim() const override { return inner_.hidden_dim(); }
  int layers = 0;
  double cost = 0.05;

 private:
  LayerEngine& inner_;
};

TEST(BlendTest, AFailingKvPassStopsTheBlendAndABadCostIsRefused) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  std::vector<Piece> pieces = {Cached(*f.t, Chunk(9, 10)), Piece{Chunk(10, 3), {}, 0}};
  TransformerEngine inner(*f.t);
  FailingKvPassEngine engine(inner);
  std::vector<float> kv;
  Result<BlendReport> r = Compose(ShapeOf(c), pieces, Options(c, 0.5), engine, &kv);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("no K at layer 1"), std::string::npos);
  EXPECT_EQ(engine.layers, 1);  // layer 0, then the pass at layer 1 failed
  BlendOptions whole = Options(c, 0.5);
  whole.kv_pass = false;  // not asked for: the engine's pass is never called
  EXPECT_TRUE(Compose(ShapeOf(c), pieces, whole, engine, &kv).ok());
  for (double bad : {0.0, -1.0, 1.5, std::nan("")}) {
    engine.cost = bad;
    EXPECT_EQ(Compose(ShapeOf(c), pieces, Options(c, 0.5), engine, &kv).status().code(), Code::kInvalidArgument)
        << bad;
  }
}

TEST(BlendTest, RefusesBadInput) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.t);
  const model::ModelConfig& c = f.t->config();
  TransformerEngine engine(*f.t);
  std::vector<float> kv;
  const std::vector<Piece> good = {Cached(*f.t, Chunk(11, 8)), Piece{Chunk(12, 2), {}, 0}};
  auto code = [&](const std::vector<Piece>& pieces, const BlendOptions& o) {
    return Compose(ShapeOf(c), pieces, o, engine, &kv).status().code();
  };
  EXPECT_EQ(code(good, Options(c, 0.15)), Code::kOk);
  EXPECT_EQ(code({}, Options(c, 0.15)), Code::kInvalidArgument);
  EXPECT_EQ(code(good, Options(c, 1.5)), Code::kInvalidArgument);
  BlendOptions o = Options(c, 0.15);
  o.check_layers = {3, 1};
  EXPECT_EQ(code(good, o), Code::kInvalidArgument);
  o.check_layers = {5};
  EXPECT_EQ(code(good, o), Code::kInvalidArgument);
  o = Options(c, 0.15);
  o.rope.head_dim = 16;
  EXPECT_EQ(code(good, o), Code::kInvalidArgument);
  std::vector<Piece> short_kv = good;
  short_kv[0].kv.resize(short_kv[0].kv.size() - 1);
  EXPECT_EQ(code(short_kv, Options(c, 0.15)), Code::kInvalidArgument);
  std::vector<Piece> bad_token = good;
  bad_token[1].tokens[0] = 100000;
  EXPECT_EQ(code(bad_token, Options(c, 0.15)), Code::kInvalidArgument);  // the engine refuses it
}

// The evaluation end to end, small: blending beats naive reuse, ratio 1 is
// exact, and the recompute fraction is what the layers did.
TEST(BlendEvalTest, SmallRunOnTheReferenceModel) {
  KDN_REQUIRE_MODEL();
  Fixture f = Load();
  ASSERT_TRUE(f.weights);
  std::vector<int> text;
  for (int rep = 0; rep < 6; ++rep) {
    for (size_t i = 0; i < kdn::testing::kReferenceIds.size(); ++i) {
      text.push_back(kdn::testing::kReferenceIds[(i * 7 + rep * 5) % kdn::testing::kReferenceIds.size()]);
    }
  }
  BlendEvalOptions o;
  o.chunk_tokens = 24;
  o.chunks = 3;
  o.continue_tokens = 7;
  o.threads = 1;
  const std::vector<int> suffix = {kdn::testing::kReferenceIds[0], kdn::testing::kReferenceIds[1]};
  o.ratio = 1.0;
  Result<BlendEvalResult> full = EvaluateBlend(*f.weights, text, suffix, o);
  ASSERT_TRUE(full.ok()) << full.status().message();
  EXPECT_EQ(full->contexts, 4);
  EXPECT_EQ(full->kl_blend_mean, 0.0);
  EXPECT_EQ(full->top1_blend, 1.0);
  EXPECT_DOUBLE_EQ(full->recompute_fraction, 1.0);
  EXPECT_GT(full->kl_naive_mean, 0.0);
  o.ratio = 0.3;
  Result<BlendEvalResult> part = EvaluateBlend(*f.weights, text, suffix, o);
  ASSERT_TRUE(part.ok());
  EXPECT_LT(part->kl_blend_mean, part->kl_naive_mean);
  EXPECT_EQ(part->kl_naive_mean, full->kl_naive_mean);
  EXPECT_LT(part->recompute_fraction, 1.0);
  EXPECT_GT(part->recompute_fraction, 0.3);
  o.chunks = 100;
  EXPECT_EQ(EvaluateBlend(*f.weights, text, suffix, o).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kdn::blend
