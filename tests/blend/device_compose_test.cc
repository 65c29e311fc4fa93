// SPDX-License-Identifier: Apache-2.0
// Blending where the engine's layers run (core/knowledge/device_compose.h,
// issue 34 item 5), on the emulated device (host memory standing in for a
// GPU's, every device operation the CPU path of its kernel): the composed
// KV and the report are Compose's, bit for bit, for every method; what
// crosses back to the host is the check layers' deviations alone; an engine
// on the wrong side is refused; an engine's failure stops the blend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/blend/blend.h"
#include "core/knowledge/blend_documents.h"
#include "core/knowledge/device_compose.h"
#include "core/runtime/runtime.h"
#include "core/util/dtype.h"
#include "kernels/ref/blend_rows_ref.h"
#include "lab/blend/transformer_engine.h"
#include "lab/model/checkpoint.h"
#include "lab/model/transformer.h"
#include "reference_pieces.h"
#include "test_models.h"

namespace kdn::blend {
namespace {

using testing::Cached;
using testing::Chunk;
using testing::Fixture;
using testing::kBos;
using testing::Load;

// The reference transformer as an engine on the (emulated) device: its
// buffers are the device's memory, which on the emulated device the host
// may read. `fail_at`: the layer whose call fails (fault injection).
class EmulatedDeviceEngine final : public LayerEngine {
 public:
  explicit EmulatedDeviceEngine(model::Transformer& t) : inner_(t) {}
  Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k_layer,
               float* v_layer, int total) override {
    if (layer == fail_at) return Status(Code::kUnavailable, "the engine's GPU is gone");
    return inner_.Layer(layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  Status KvPass(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k_layer,
                float* v_layer, int total) override {
    return inner_.KvPass(layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  int hidden_dim() const override { return inner_.hidden_dim(); }
  bool has_kv_pass() const override { return inner_.has_kv_pass(); }
  double kv_pass_cost(int total) const override { return inner_.kv_pass_cost(total); }
  bool on_device() const override { return true; }
  void set_kv_pass(bool on) { inner_.set_kv_pass(on); }
  int fail_at = -1;

 private:
  TransformerEngine inner_;
};


// BOS, three cached chunks (one a slice computed from position 9), a query.
std::vector<Piece> Context(model::Transformer& t) {
  Piece slice = Cached(t, Chunk(9, 25));
  slice.cached_first = 9;  // as if computed later in its document: moved by another delta
  return {Piece{{kBos}, {}, 0}, Cached(t, Chunk(6, 30)), slice, Cached(t, Chunk(7, 22)), Piece{Chunk(8, 5), {}, 0}};
}

std::vector<float> HostFloats(const chunk::Payload& p) {
  std::vector<float> out(p.size() / sizeof(float));
  std::memcpy(out.data(), p.data(), out.size() * sizeof(float));  // the emulated device's memory is the host's
  return out;
}

// Each test: the reference model on one thread (skipped without it).
class DeviceCompose : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    f = Load();
    ASSERT_TRUE(f.t);
  }
  Fixture f;
};

TEST_F(DeviceCompose, IsComposeBitForBitForEveryMethod) {
  const model::ModelConfig& c = f.t->config();
  const std::vector<Piece> pieces = Context(*f.t);
  struct Case {
    const char* name;
    double ratio, threshold;
    std::vector<int> checks;
    int first_tokens;
    bool kv_pass;
  };
  const Case cases[] = {
      {"naive reuse", 0.0, -1, {1}, 0, true},
      {"the default (KV passes at 1 and 2, 28%)", kDefaultRatio, -1, {}, 0, true},
      {"CacheBlend 15% at one whole check layer", 0.15, -1, {1}, 0, false},
      {"gradual over layers 1 and 3", 0.2, -1, {1, 3}, 0, true},
      {"first 4 tokens and 20%", 0.2, -1, {1, 2}, 4, true},
      {"by threshold", 0.0, 0.5, {1}, 0, true},
      {"check layer 0", 0.3, -1, {0}, 0, true},
      {"full prefill", 1.0, -1, {1}, 0, true},
  };
  for (const Case& k : cases) {
    BlendOptions o;
    o.ratio = k.ratio;
    o.threshold = k.threshold;
    o.check_layers = k.checks;
    o.first_tokens = k.first_tokens;
    o.kv_pass = k.kv_pass;
    o.rope = Llama2cRope(c);
    TransformerEngine host(*f.t);
    std::vector<float> want;
    Result<BlendReport> a = Compose(ShapeOf(c), pieces, o, host, &want);
    ASSERT_TRUE(a.ok()) << k.name << ": " << a.status().message();
    EmulatedDeviceEngine engine(*f.t);
    const std::shared_ptr<store::Device> dev = store::MakeEmulatedDevice();
    chunk::Payload kv;
    Result<BlendReport> b = ComposeOnDevice(ShapeOf(c), pieces, o, engine, *dev, &kv);
    ASSERT_TRUE(b.ok()) << k.name << ": " << b.status().message();
    EXPECT_EQ(b->selected_positions, a->selected_positions) << k.name;
    EXPECT_EQ(b->recomputed_per_layer, a->recomputed_per_layer) << k.name;
    EXPECT_EQ(b->kv_pass_per_layer, a->kv_pass_per_layer) << k.name;
    EXPECT_EQ(b->recompute_fraction, a->recompute_fraction) << k.name;
    EXPECT_EQ(b->cached_positions, a->cached_positions) << k.name;
    EXPECT_EQ(b->anchored, a->anchored) << k.name;
    const std::vector<float> got = HostFloats(kv);
    ASSERT_EQ(got.size(), want.size()) << k.name;
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << k.name;
    // The methods differ (the comparison above is not between two no-ops).
    if (k.ratio > 0 && k.ratio < 1) {
      EXPECT_GT(a->selected, 0) << k.name;
    }
  }
}

// The reference transformer behind a GPU engine's interface: each call
// copies the rows and the layer's K and V planes to the host, runs there and
// copies them back (a test harness on a real GPU, where device pointers are
// not the host's; the blend's own work stays on the device).
class StagedGpuEngine final : public LayerEngine {
 public:
  StagedGpuEngine(model::Transformer& t, store::Device& d) : inner_(t), dev_(d), kvd_(t.config().kv_dim()) {}
  Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k_layer,
               float* v_layer, int total) override {
    return Staged(false, layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  Status KvPass(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden, float* k_layer,
                float* v_layer, int total) override {
    return Staged(true, layer, positions, tokens, hidden, k_layer, v_layer, total);
  }
  int hidden_dim() const override { return inner_.hidden_dim(); }
  bool has_kv_pass() const override { return true; }
  double kv_pass_cost(int total) const override { return inner_.kv_pass_cost(total); }
  bool on_device() const override { return true; }

 private:
  Status Staged(bool kv_only, int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                float* k_layer, float* v_layer, int total) {
    std::vector<float> h(positions.size() * static_cast<size_t>(hidden_dim()));
    std::vector<float> k(static_cast<size_t>(total) * kvd_), v(k.size());
    KDN_RETURN_IF_ERROR(dev_.CopyToHost(h.data(), hidden, h.size() * sizeof(float)));
    KDN_RETURN_IF_ERROR(dev_.CopyToHost(k.data(), k_layer, k.size() * sizeof(float)));
    KDN_RETURN_IF_ERROR(dev_.CopyToHost(v.data(), v_layer, v.size() * sizeof(float)));
    KDN_RETURN_IF_ERROR(kv_only ? inner_.KvPass(layer, positions, tokens, h.data(), k.data(), v.data(), total)
                                : inner_.Layer(layer, positions, tokens, h.data(), k.data(), v.data(), total));
    KDN_RETURN_IF_ERROR(dev_.CopyToDevice(hidden, h.data(), h.size() * sizeof(float)));
    KDN_RETURN_IF_ERROR(dev_.CopyToDevice(k_layer, k.data(), k.size() * sizeof(float)));
    KDN_RETURN_IF_ERROR(dev_.CopyToDevice(v_layer, v.data(), v.size() * sizeof(float)));
    return dev_.Synchronize();
  }
  TransformerEngine inner_;
  store::Device& dev_;
  size_t kvd_;
};

// On a real GPU (skipped without one): the CUDA kernels' composition against
// the host's. The keys' rotation may differ from the CPU's by an ulp (cos and
// sin on the GPU; kernels/rope.cuh), so the KV is compared within 1e-5 of
// its scale; the selection must be the same.
TEST_F(DeviceCompose, OnAGpuMatchesTheHost) {
  auto gpu = store::MakeCudaDevice(0);
  if (!gpu.ok()) GTEST_SKIP() << gpu.status().message();
  const model::ModelConfig& c = f.t->config();
  const std::vector<Piece> pieces = Context(*f.t);
  for (const int first : {0, 4}) {
    BlendOptions o;
    o.rope = Llama2cRope(c);
    o.first_tokens = first;
    TransformerEngine host(*f.t);
    std::vector<float> want;
    Result<BlendReport> a = Compose(ShapeOf(c), pieces, o, host, &want);
    ASSERT_TRUE(a.ok()) << a.status().message();
    StagedGpuEngine engine(*f.t, **gpu);
    chunk::Payload kv;
    Result<BlendReport> b = ComposeOnDevice(ShapeOf(c), pieces, o, engine, **gpu, &kv);
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ(b->selected_positions, a->selected_positions);
    std::vector<float> got(want.size());
    ASSERT_EQ(kv.size(), got.size() * sizeof(float));
    ASSERT_TRUE((*gpu)->CopyToHost(got.data(), kv.data(), kv.size()).ok());
    float scale = 0, worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, std::fabs(want[i]));
      worst = std::max(worst, std::fabs(got[i] - want[i]));
    }
    EXPECT_LE(worst, 1e-5f * scale) << "first " << first;
  }
}

// The pieces' KV crosses to the device once; back come only the deviations
// (8 bytes per candidate per check layer), never the KV.
TEST_F(DeviceCompose, OnlyTheDeviationsComeBackToTheHost) {
  const model::ModelConfig& c = f.t->config();
  const std::vector<Piece> pieces = Context(*f.t);
  BlendOptions o;
  o.rope = Llama2cRope(c);  // the default method: checks at layers 1 and 2
  EmulatedDeviceEngine engine(*f.t);
  const std::shared_ptr<store::Device> dev = store::MakeEmulatedDevice();
  chunk::Payload kv;
  Result<BlendReport> r = ComposeOnDevice(ShapeOf(c), pieces, o, engine, *dev, &kv);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const store::DeviceCounters n = dev->counters();
  size_t placed_floats = 0;
  for (const Piece& p : pieces) placed_floats += p.kv.size();
  // Candidates at the checks: every cached position at layer 1, those left
  // after it at layer 2 (each check's KV-pass rows).
  const size_t candidates = static_cast<size_t>(r->kv_pass_per_layer[1] + r->kv_pass_per_layer[2]);
  EXPECT_EQ(r->kv_pass_per_layer[1], r->cached_positions);
  EXPECT_GT(r->kv_pass_per_layer[2], 0);
  EXPECT_LT(r->kv_pass_per_layer[2], r->cached_positions);
  EXPECT_EQ(n.d2h_bytes, candidates * sizeof(double));
  EXPECT_GE(n.h2d_bytes, placed_floats * sizeof(float));
  EXPECT_LT(n.h2d_bytes - placed_floats * sizeof(float), placed_floats / 10) << "beyond the KV: index lists only";
  // Every cached piece's keys moved once per layer (on the device), rows
  // gathered, deviations summed: all on the device.
  EXPECT_GE(n.blend_ops, static_cast<std::uint64_t>(3 * c.n_layers));
}

TEST_F(DeviceCompose, AnEngineOnTheWrongSideIsRefusedAndAFailureStopsTheBlend) {
  const model::ModelConfig& c = f.t->config();
  const std::vector<Piece> pieces = Context(*f.t);
  BlendOptions o;
  o.rope = Llama2cRope(c);
  const std::shared_ptr<store::Device> dev = store::MakeEmulatedDevice();
  TransformerEngine host(*f.t);
  EmulatedDeviceEngine on_device(*f.t);
  chunk::Payload kv;
  std::vector<float> out;
  EXPECT_EQ(ComposeOnDevice(ShapeOf(c), pieces, o, host, *dev, &kv).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Compose(ShapeOf(c), pieces, o, on_device, &out).status().code(), Code::kInvalidArgument);
  on_device.fail_at = 3;
  Result<BlendReport> r = ComposeOnDevice(ShapeOf(c), pieces, o, on_device, *dev, &kv);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_NE(r.status().message().find("GPU is gone"), std::string::npos);
  EXPECT_EQ(kv.size(), 0u) << "nothing handed out";
  o.ratio = 2;  // bad options: refused before the device does anything
  const std::uint64_t ops = dev->counters().blend_ops;
  EXPECT_EQ(ComposeOnDevice(ShapeOf(c), pieces, o, on_device, *dev, &kv).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(dev->counters().blend_ops, ops);
}

// Documents blended into an f16 model's device views (what kdn_kv_blend
// does): an engine on the host composes on the host and the composed KV
// crosses to the device; an engine on the device composes there, converts
// to f16 there, and nothing but the deviations crosses back. The views end
// up with the same bytes.
TEST_F(DeviceCompose, DocumentsBlendIntoDeviceViewsWhereTheEngineRuns) {
  const model::ModelConfig& c = f.t->config();
  const std::shared_ptr<store::Device> dev = store::MakeEmulatedDevice();
  store::StoreOptions so;
  so.device = dev;
  auto rt = store::Runtime::Create(so, 1);
  ASSERT_TRUE(rt.ok()) << rt.status().message();
  store::ModelKv model;
  model.fingerprint[0] = 7;
  model.shape = {c.n_layers, c.n_kv_heads, c.head_dim(), 2};
  model.dtype = 1;  // f16
  const size_t kvd = static_cast<size_t>(c.kv_dim()), L = static_cast<size_t>(c.n_layers);
  // Two documents, their KV computed alone from position 0, stored as f16.
  for (const auto& [id, tokens] : {std::pair<std::string, std::vector<std::int32_t>>{"a", Chunk(1, 21)},
                                   std::pair<std::string, std::vector<std::int32_t>>{"b", Chunk(2, 26)}}) {
    model::KvCache alone = f.t->NewCache();
    ASSERT_TRUE(f.t->Forward(std::vector<int>(tokens.begin(), tokens.end()), 0, alone, nullptr).ok());
    const std::vector<float> kv = alone.Export(0, static_cast<int>(tokens.size()));
    std::vector<std::uint8_t> half(kv.size() * 2);
    FromFloat(1, kv.data(), kv.size(), half.data());
    store::ViewSpec v;
    v.dtype = 1;
    v.data = half.data();
    v.size_bytes = half.size();
    v.num_tokens = tokens.size();
    auto views = store::ResolvedViews::Resolve(model, std::span<const store::ViewSpec>(&v, 1), tokens.size());
    ASSERT_TRUE(views.ok()) << views.status().message();
    ASSERT_TRUE((*rt)->knowledge().Put(model, "t", id, 1, "", tokens, *views).ok());
  }
  std::vector<Segment> segs(4);
  segs[0].tokens = {kBos};
  segs[1].document = true;
  segs[1].doc_id = "b";
  segs[2].document = true;
  segs[2].doc_id = "a";
  segs[3].tokens = Chunk(3, 6);
  const size_t total = 1 + 26 + 21 + 6;
  BlendOptions o;
  o.rope = Llama2cRope(c);
  const auto blend_into = [&](LayerEngine& engine, std::uint32_t memory, std::vector<std::uint8_t>* out) {
    out->assign(total * L * 2 * kvd * 2, 0xAB);
    store::ViewSpec v;
    v.memory = memory;
    v.dtype = 1;
    v.data = out->data();
    v.size_bytes = out->size();
    v.num_tokens = total;
    return BlendDocuments((*rt)->knowledge(), model, "t", segs, o, engine, std::span<const store::ViewSpec>(&v, 1));
  };
  TransformerEngine host(*f.t);
  EmulatedDeviceEngine on_device(*f.t);
  std::vector<std::uint8_t> want, by_host, by_device;
  Result<BlendReport> a = blend_into(host, 0, &want);
  ASSERT_TRUE(a.ok()) << a.status().message();
  store::DeviceCounters before = dev->counters();
  Result<BlendReport> b = blend_into(host, 1, &by_host);
  ASSERT_TRUE(b.ok()) << b.status().message();
  store::DeviceCounters after = dev->counters();
  EXPECT_EQ(after.blend_ops, before.blend_ops) << "composed on the host";
  EXPECT_GE(after.h2d_bytes - before.h2d_bytes, want.size()) << "the composed KV crossed";
  before = after;
  Result<BlendReport> d = blend_into(on_device, 1, &by_device);
  ASSERT_TRUE(d.ok()) << d.status().message();
  after = dev->counters();
  EXPECT_GT(after.blend_ops, before.blend_ops) << "composed on the device";
  EXPECT_EQ(after.d2h_bytes - before.d2h_bytes,
            sizeof(double) * static_cast<size_t>(std::accumulate(d->kv_pass_per_layer.begin(),
                                                                  d->kv_pass_per_layer.end(), 0)))
      << "only the deviations came back";
  EXPECT_GT(d->selected, 0);
  EXPECT_EQ(d->selected_positions, a->selected_positions);
  EXPECT_EQ(by_host, want);
  EXPECT_EQ(by_device, want);
  // An engine on the device with host views: refused, nothing written.
  std::vector<std::uint8_t> none;
  EXPECT_EQ(blend_into(on_device, 0, &none).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(none, std::vector<std::uint8_t>(want.size(), 0xAB));
}

// The kernels' CPU paths: a row gather, the deviation sums (the host
// blend's: double, ascending), and the conversion to the model's dtype
// (FromFloat's, special values included).
TEST(BlendRowKernels, MatchTheHostsArithmetic) {
  const std::vector<float> src = {0, 1, 2, 10, 11, 12, 20, 21, 22};
  const std::vector<std::int32_t> rows = {2, 0};
  std::vector<float> dst(6, -1);
  kernels::gather_rows_cpu(dst.data(), src.data(), rows.data(), 2, 3);
  EXPECT_EQ(dst, (std::vector<float>{20, 21, 22, 0, 1, 2}));
  const std::vector<std::int32_t> plane_rows = {1, 2}, saved_rows = {1, 0};
  double out[2] = {-1, -1};
  kernels::row_deviations_cpu(src.data(), dst.data(), plane_rows.data(), saved_rows.data(), 2, 3, out);
  EXPECT_EQ(out[0], 100.0 + 100.0 + 100.0);  // row 1 {10,11,12} vs saved 1 {0,1,2}
  EXPECT_EQ(out[1], 0.0);                    // row 2 vs saved 0 (row 2)
  const float specials[] = {0.0f, -0.0f, 1.0f / 3, 65504.0f, 70000.0f, 1e-8f, -1e-40f,
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    const size_t eb = dtype == 0 ? 4 : 2;
    std::vector<std::uint8_t> a(std::size(specials) * eb), b(a.size());
    kernels::float_to_dtype_cpu(dtype, specials, a.data(), static_cast<std::int64_t>(std::size(specials)));
    FromFloat(dtype, specials, std::size(specials), b.data());
    EXPECT_EQ(a, b) << dtype;
  }
}

}  // namespace
}  // namespace kdn::blend
