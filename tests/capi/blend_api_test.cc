// SPDX-License-Identifier: Apache-2.0
// kdn_kv_blend through the C ABI: documents put as knowledge items, blended
// by the reference transformer behind the callback, compared with the C++
// blender; the callback's buffers have the lengths it is told; a failing
// callback's status comes back; bad arguments are refused.
// Blending is in the header's experimental section.
#define KDN_EXPERIMENTAL
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>
#include <string>
#include <vector>

#include "core/blend/blend.h"
#include "lab/blend/transformer_engine.h"
#include "kdn/kdn.h"
#include "lab/model/checkpoint.h"
#include "lab/model/transformer.h"
#include "test_models.h"

namespace {

constexpr int kBos = 1;

struct Engine {
  kdn::model::Transformer* t = nullptr;
  int fail_at = -1;
  int calls = 0;
  int kv_calls = 0;
  // Calls whose buffer lengths disagreed with count, total and the shapes.
  int bad_lengths = 0;
};

kdn_status Layer(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                 float* hidden, size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len,
                 size_t total) {
  Engine* e = static_cast<Engine*>(user);
  ++e->calls;
  if (static_cast<int>(layer) == e->fail_at) return KDN_ERR_UNAVAILABLE;
  const kdn::model::ModelConfig& c = e->t->config();
  if (hidden_dim != static_cast<uint32_t>(c.dim)) return KDN_ERR_INVALID_ARGUMENT;
  // The header: hidden holds count rows of hidden_dim floats; k and v one
  // row of kv_heads * head_dim floats per position of the whole context.
  if (hidden_len != count * hidden_dim || kv_len != total * static_cast<size_t>(c.kv_dim())) {
    ++e->bad_lengths;
    return KDN_ERR_INVALID_ARGUMENT;
  }
  if ((layer == 0) != (tokens != nullptr)) {
    ++e->bad_lengths;
    return KDN_ERR_INVALID_ARGUMENT;
  }
  std::vector<int> pos(positions, positions + count), ids;
  if (tokens != nullptr) ids.assign(tokens, tokens + count);
  const kdn::Status s = e->t->ForwardLayer(static_cast<int>(layer), pos, ids, hidden, k, v, static_cast<int>(total));
  return s.ok() ? KDN_OK : KDN_ERR_INTERNAL;
}

// The KV pass (1.9): the reference transformer's K and V of a layer alone.
kdn_status KvOnly(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                  float* hidden, size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len,
                  size_t total) {
  Engine* e = static_cast<Engine*>(user);
  ++e->kv_calls;
  const kdn::model::ModelConfig& c = e->t->config();
  if (hidden_dim != static_cast<uint32_t>(c.dim) || hidden_len != count * hidden_dim ||
      kv_len != total * static_cast<size_t>(c.kv_dim()) || (layer == 0) != (tokens != nullptr)) {
    ++e->bad_lengths;
    return KDN_ERR_INVALID_ARGUMENT;
  }
  std::vector<int> pos(positions, positions + count), ids;
  if (tokens != nullptr) ids.assign(tokens, tokens + count);
  const kdn::Status s = e->t->ForwardKv(static_cast<int>(layer), pos, ids, hidden, k, v, static_cast<int>(total));
  return s.ok() ? KDN_OK : KDN_ERR_INTERNAL;
}

// A segment of a document by id / of tokens (borrowed: `tokens` must outlive it).
kdn_blend_segment Document(const char* id) {
  kdn_blend_segment s = KDN_BLEND_SEGMENT_INIT;
  s.kind = KDN_SEGMENT_DOCUMENT;
  s.doc_id = id;
  s.doc_id_len = std::strlen(id);
  return s;
}
kdn_blend_segment Tokens(const std::vector<int32_t>& tokens) {
  kdn_blend_segment s = KDN_BLEND_SEGMENT_INIT;
  s.tokens = tokens.data();
  s.num_tokens = tokens.size();
  return s;
}

// A canonical view ([layer][k|v][token][kv_head][head_dim]) of `kv`.
kdn_kv_view Canonical(std::vector<float>& kv, size_t num_tokens) {
  kdn_kv_view view = KDN_KV_VIEW_INIT;
  view.dtype = KDN_DTYPE_F32;
  view.data = kv.data();
  view.size_bytes = kv.size() * sizeof(float);
  view.num_tokens = num_tokens;
  return view;
}

class BlendApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    auto w = kdn::model::Checkpoint::Load(kdn::testing::ModelPath());
    ASSERT_TRUE(w.ok());
    weights_ = std::make_unique<kdn::model::Checkpoint>(std::move(*w));
    t_ = std::make_unique<kdn::model::Transformer>(*weights_, 1);
    kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
    ro.device = device_;
    ASSERT_EQ(kdn_runtime_create(&ro, &rt_), KDN_OK);
    const kdn_model_spec spec = Spec();
    ASSERT_EQ(kdn_model_create(rt_, &spec, &model_), KDN_OK);
  }
  // The reference model, f32.
  kdn_model_spec Spec() const {
    const auto& c = t_->config();
    kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
    spec.num_layers = static_cast<uint32_t>(c.n_layers);
    spec.num_kv_heads = static_cast<uint32_t>(c.n_kv_heads);
    spec.head_dim = static_cast<uint32_t>(c.head_dim());
    spec.dtype = KDN_DTYPE_F32;
    spec.fingerprint = "stories260K";
    spec.fingerprint_len = std::strlen(spec.fingerprint);
    return spec;
  }
  void TearDown() override {
    kdn_model_destroy(model_);
    kdn_runtime_destroy(rt_);
  }

  // Puts `tokens` as a document (its KV computed alone from position 0, as
  // kdn_knowledge_put takes it); returns the same as a library piece.
  kdn::blend::Piece Put(const std::string& id, const std::vector<int32_t>& tokens) {
    kdn::model::KvCache alone = t_->NewCache();
    EXPECT_TRUE(t_->Forward(std::vector<int>(tokens.begin(), tokens.end()), 0, alone, nullptr).ok());
    std::vector<float> kv0 = alone.Export(0, static_cast<int>(tokens.size()));
    const kdn_kv_view kv = Canonical(kv0, tokens.size());
    EXPECT_EQ(
        kdn_knowledge_put(model_, "t", 1, id.data(), id.size(), 1, "", 0, tokens.data(), tokens.size(), &kv, 1),
        KDN_OK)
        << kdn_last_error_message();
    return kdn::blend::Piece{tokens, kv0, 0};
  }

  std::vector<int32_t> Ids(int salt, int n) {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      out.push_back(kdn::testing::kReferenceIds[static_cast<size_t>(salt * 7 + i) % kdn::testing::kReferenceIds.size()]);
    }
    return out;
  }

  kdn_device_mode device_ = KDN_DEVICE_AUTO;
  std::unique_ptr<kdn::model::Checkpoint> weights_;
  std::unique_ptr<kdn::model::Transformer> t_;
  kdn_runtime* rt_ = nullptr;
  kdn_model* model_ = nullptr;
};

// 1.5: a blend into views in device memory (the emulated device here: host
// memory standing in for the GPU's) writes what a blend into host views
// writes; a runtime without a device refuses such views.
class BlendDeviceTest : public BlendApiTest {
 protected:
  void SetUp() override {
    device_ = KDN_DEVICE_EMULATED;
    BlendApiTest::SetUp();
  }
};

TEST_F(BlendDeviceTest, BlendsIntoDeviceViewsAsIntoHostViews) {
  const auto& c = t_->config();
  Put("doc-a", Ids(1, 19));
  Put("doc-b", Ids(2, 23));
  const std::vector<int32_t> query = Ids(3, 5);
  kdn_blend_segment seg[3] = {Document("doc-b"), Document("doc-a"), Tokens(query)};
  const size_t total = 23 + 19 + 5;
  std::vector<float> host(total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim(), -1.0f), dev = host;
  Engine e{t_.get()};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  o.ratio = 0.25f;
  o.hidden_dim = static_cast<uint32_t>(c.dim);
  o.layer_fn = Layer;
  o.user = &e;
  kdn_blend_report rep = KDN_BLEND_REPORT_INIT;
  kdn_kv_view hv = Canonical(host, total), dv = Canonical(dev, total);
  dv.memory = KDN_MEMORY_DEVICE;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 3, &o, &hv, 1, &rep), KDN_OK) << kdn_last_error_message();
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 3, &o, &dv, 1, &rep), KDN_OK) << kdn_last_error_message();
  EXPECT_EQ(rep.positions, total);
  EXPECT_NE(host[0], -1.0f);
  EXPECT_EQ(dev, host);

  // Without a device: refused, nothing written.
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.device = KDN_DEVICE_NONE;
  kdn_runtime* rt = nullptr;
  ASSERT_EQ(kdn_runtime_create(&ro, &rt), KDN_OK);
  const kdn_model_spec spec = Spec();
  kdn_model* m = nullptr;
  ASSERT_EQ(kdn_model_create(rt, &spec, &m), KDN_OK);
  std::vector<float> none(host.size(), -1.0f);
  kdn_kv_view nv = Canonical(none, total);
  nv.memory = KDN_MEMORY_DEVICE;
  seg[0] = seg[2];
  EXPECT_EQ(kdn_kv_blend(m, "t", 1, seg, 1, &o, &nv, 1, &rep), KDN_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kdn_last_error_message()).find("no device"), std::string::npos);
  EXPECT_EQ(none[0], -1.0f);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

// 1.10: an engine on the device (KDN_BLEND_ENGINE_ON_DEVICE). The blend is
// composed in device memory (the callbacks get device pointers: on the
// emulated device the host may read them, so the reference transformer runs
// on them as it is) and written into the views there: the same KV as an
// engine on the host writes into host views, with a KV pass and without;
// the flag wants device views; unknown flags are refused.
TEST_F(BlendDeviceTest, AnEngineOnTheDeviceGetsTheSameBlend) {
  const auto& c = t_->config();
  Put("doc-a", Ids(1, 19));
  Put("doc-b", Ids(2, 23));
  const std::vector<int32_t> bos = {kBos}, query = Ids(3, 5);
  kdn_blend_segment seg[4] = {Tokens(bos), Document("doc-b"), Document("doc-a"), Tokens(query)};
  const size_t total = 1 + 23 + 19 + 5;
  for (const bool kv_pass : {true, false}) {
    std::vector<float> host(total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim(), -1.0f), dev = host;
    Engine e{t_.get()};
    kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
    o.hidden_dim = static_cast<uint32_t>(c.dim);
    o.layer_fn = Layer;
    o.user = &e;
    if (kv_pass) {
      o.kv_fn = KvOnly;
      o.kv_cost = static_cast<float>(t_->KvMacs() / t_->LayerMacs(static_cast<int>(total)));
    }
    kdn_blend_report on_host = KDN_BLEND_REPORT_INIT, on_dev = KDN_BLEND_REPORT_INIT;
    kdn_kv_view hv = Canonical(host, total), dv = Canonical(dev, total);
    dv.memory = KDN_MEMORY_DEVICE;
    ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &hv, 1, &on_host), KDN_OK) << kdn_last_error_message();
    o.flags = KDN_BLEND_ENGINE_ON_DEVICE;
    ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &dv, 1, &on_dev), KDN_OK) << kdn_last_error_message();
    EXPECT_EQ(e.bad_lengths, 0);
    EXPECT_GT(on_dev.selected, 0u);
    EXPECT_EQ(on_dev.selected, on_host.selected);
    EXPECT_EQ(on_dev.kv_passes, on_host.kv_passes);
    EXPECT_EQ(on_dev.kv_passes > 0, kv_pass);
    EXPECT_EQ(on_dev.recompute_fraction, on_host.recompute_fraction);
    EXPECT_NE(host[0], -1.0f);
    EXPECT_EQ(dev, host) << "kv_pass " << kv_pass;

    // The flag with host views: refused, nothing written.
    std::vector<float> untouched(host.size(), -1.0f);
    kdn_kv_view uv = Canonical(untouched, total);
    EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &uv, 1, &on_dev), KDN_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kdn_last_error_message()).find("KDN_BLEND_ENGINE_ON_DEVICE"), std::string::npos);
    EXPECT_EQ(untouched, std::vector<float>(host.size(), -1.0f));
    // Unknown flags: refused.
    o.flags = 2;
    EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &dv, 1, &on_dev), KDN_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(kdn_last_error_message()).find("unknown flags"), std::string::npos);
  }
}

TEST_F(BlendApiTest, BlendsDocumentsLikeTheLibrary) {
  const auto& c = t_->config();
  const kdn::blend::Piece a = Put("doc-a", Ids(1, 19)), b = Put("doc-b", Ids(2, 23));
  const std::vector<int32_t> bos = {kBos}, query = Ids(3, 5);
  kdn_blend_segment seg[4] = {Tokens(bos), Document("doc-b"), Document("doc-a"), Tokens(query)};
  const size_t total = 1 + 23 + 19 + 5;
  std::vector<float> out(total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim(), -1.0f);
  kdn_kv_view kv = Canonical(out, total);
  Engine e{t_.get()};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  o.ratio = 0.25f;
  o.hidden_dim = static_cast<uint32_t>(c.dim);
  o.layer_fn = Layer;
  o.user = &e;
  kdn_blend_report rep = KDN_BLEND_REPORT_INIT;
  // 1.4: with a reported prefill rate (1,000 ns per token), the blend's
  // saving is priced into TTFT saved: positions x the work not recomputed.
  ASSERT_EQ(kdn_model_report_prefill(model_, 10, 10000), KDN_OK);
  kdn_stats before = KDN_STATS_INIT;
  ASSERT_EQ(kdn_runtime_get_stats(rt_, &before), KDN_OK);
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_OK) << kdn_last_error_message();
  kdn_stats after = KDN_STATS_INIT;
  ASSERT_EQ(kdn_runtime_get_stats(rt_, &after), KDN_OK);
  EXPECT_NEAR(static_cast<double>(after.ttft_saved_ns - before.ttft_saved_ns),
              1000.0 * static_cast<double>(total) * (1.0 - rep.recompute_fraction), 1.0);
  EXPECT_GT(after.ttft_saved_ns, before.ttft_saved_ns);
  EXPECT_EQ(e.bad_lengths, 0);
  EXPECT_EQ(e.calls, c.n_layers);  // one call per layer, in order
  EXPECT_EQ(rep.filled_size, rep.struct_size);
  EXPECT_EQ(rep.positions, total);
  EXPECT_EQ(rep.cached_positions, 42u);
  EXPECT_EQ(rep.fresh_positions, 6u);
  EXPECT_EQ(rep.selected, 11u);  // 25% of 42, rounded
  EXPECT_GT(rep.recompute_fraction, 0.25);
  EXPECT_LT(rep.recompute_fraction, 1.0);
  // The library on the same pieces.
  kdn::blend::TransformerEngine engine(*t_);
  kdn::blend::BlendOptions bo;
  bo.ratio = 0.25;
  bo.check_layers = {1};  // without a kv_fn the C ABI's default is CacheBlend's check layer
  bo.rope = kdn::blend::Llama2cRope(c);
  std::vector<kdn::blend::Piece> pieces = {kdn::blend::Piece{bos, {}, 0}, b, a, kdn::blend::Piece{query, {}, 0}};
  std::vector<float> want;
  ASSERT_TRUE(kdn::blend::Compose(kdn::blend::ShapeOf(c), pieces, bo, engine, &want).ok());
  ASSERT_EQ(want.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], want[i]) << i;

  // The callback's failure stops the blend with its status.
  Engine failing{t_.get(), 2};
  o.user = &failing;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_UNAVAILABLE);
  EXPECT_NE(std::string(kdn_last_error_message()).find("layer 2"), std::string::npos);
  EXPECT_EQ(failing.calls, 3);
  // A failed blend leaves the report at its defaults (the rule at the top of
  // kdn.h), not the last success's figures.
  const auto at_defaults = [](const kdn_blend_report& r) {
    return r.filled_size == 0 && r.positions == 0 && r.cached_positions == 0 && r.fresh_positions == 0 && r.selected == 0 &&
           r.recompute_fraction == 0.0;
  };
  EXPECT_TRUE(at_defaults(rep));
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_UNAVAILABLE);
  o.user = &e;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_OK);
  ASSERT_FALSE(at_defaults(rep));
  seg[2].doc_id = "doc-x";
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_NOT_FOUND);
  EXPECT_TRUE(at_defaults(rep));
  seg[2].doc_id = "doc-a";
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_OK);
  kdn_blend_options no_fn = o;
  no_fn.layer_fn = nullptr;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &no_fn, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(at_defaults(rep));
  o.user = &failing;

  // Unknown documents, bad options and arguments.
  o.user = &e;
  seg[2].doc_id = "doc-x";
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_NOT_FOUND);
  seg[2].doc_id = "doc-a";
  EXPECT_EQ(kdn_kv_blend(model_, "other", 5, seg, 4, &o, &kv, 1, &rep), KDN_ERR_NOT_FOUND);  // another tenant
  kdn_blend_options bad = o;
  bad.layer_fn = nullptr;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &bad, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  bad = o;
  bad.ratio = 2.0f;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &bad, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  bad = o;
  bad.struct_size = 3;  // below the struct's first size
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &bad, &kv, 1, &rep), KDN_ERR_VERSION);
  // A caller built with a larger struct: fine while the field this library
  // does not know is zero, refused once it is set.
  struct Newer {
    kdn_blend_options o;
    uint64_t unknown;
  } newer{o, 0};
  newer.o.struct_size = sizeof newer;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &newer.o, &kv, 1, &rep), KDN_OK) << kdn_last_error_message();
  newer.unknown = 1;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &newer.o, &kv, 1, &rep), KDN_ERR_VERSION);
  EXPECT_NE(std::string(kdn_last_error_message()).find("kdn_blend_options"), std::string::npos);
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, nullptr, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 0, &o, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  kv.num_tokens = total - 1;  // too small for the context: its documents' length is known only in the call
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_BUFFER_TOO_SMALL);
  kv.num_tokens = 0;  // a view of "exactly the context" cannot be with documents in it
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  kv.num_tokens = total;
  seg[1].kind = static_cast<kdn_segment_kind>(7);
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
}

// 1.9: a KV pass (kv_fn) gives the same KV as whole check layers for less
// work; the defaults resolve by method (ratio < 0: 0.28 over check layers 1
// and 2 with kv_fn, CacheBlend's 0.15 at layer 1 without); first_tokens
// anchors each document's first tokens; a 1.8 caller's smaller struct
// still blends as before.
TEST_F(BlendApiTest, AKvPassGivesTheSameKvForLessWorkAndDefaultsResolveByMethod) {
  const auto& c = t_->config();
  Put("doc-a", Ids(1, 19));
  Put("doc-b", Ids(2, 23));
  const std::vector<int32_t> bos = {kBos}, query = Ids(3, 5);
  kdn_blend_segment seg[4] = {Tokens(bos), Document("doc-b"), Document("doc-a"), Tokens(query)};
  const size_t total = 1 + 23 + 19 + 5;
  const size_t floats = total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim();
  std::vector<float> by_pass(floats, -1.0f), whole(floats, -2.0f);
  kdn_kv_view kv_pass_view = Canonical(by_pass, total), whole_view = Canonical(whole, total);
  Engine e{t_.get()};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  EXPECT_LT(o.ratio, 0.0f);  // the default of the method
  o.hidden_dim = static_cast<uint32_t>(c.dim);
  o.layer_fn = Layer;
  o.user = &e;
  o.kv_fn = KvOnly;
  o.kv_cost = 0.05f;
  kdn_blend_report a = KDN_BLEND_REPORT_INIT, b = KDN_BLEND_REPORT_INIT;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &kv_pass_view, 1, &a), KDN_OK) << kdn_last_error_message();
  EXPECT_EQ(e.bad_lengths, 0);
  EXPECT_EQ(e.kv_calls, 2);  // check layers 1 and 2
  EXPECT_FLOAT_EQ(a.ratio, 0.28f);
  EXPECT_EQ(a.num_check_layers, 2u);
  EXPECT_EQ(a.selected, 12u);                // 42 x 0.28, rounded
  EXPECT_EQ(a.kv_passes, 42u + 22u);         // 42 candidates at layer 1, 42 x 0.28^(1/2) = 22 at layer 2
  // The same blend without the pass (explicit ratio and check layers).
  kdn_blend_options w = o;
  w.kv_fn = nullptr;
  w.ratio = 0.28f;
  const uint32_t checks[2] = {1, 2};
  w.check_layers = checks;
  w.num_check_layers = 2;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &w, &whole_view, 1, &b), KDN_OK) << kdn_last_error_message();
  EXPECT_EQ(b.kv_passes, 0u);
  EXPECT_EQ(b.selected, a.selected);
  for (size_t i = 0; i < floats; ++i) ASSERT_EQ(by_pass[i], whole[i]) << i;
  // Work: whole rows 48 at layer 0, 6 fresh + 22 kept at layer 1, 6 + 12 at
  // layers 2-4; pass rows 64 at 0.05; over 5 layers x 48 positions.
  EXPECT_NEAR(a.recompute_fraction, (48.0 + 28 + 3 * 18 + 0.05 * 64) / (5.0 * 48), 1e-6);
  EXPECT_LT(a.recompute_fraction, b.recompute_fraction);
  // Without kv_fn the default is CacheBlend's: 0.15 at check layer 1.
  kdn_blend_options plain = o;
  plain.kv_fn = nullptr;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &plain, &whole_view, 1, &b), KDN_OK);
  EXPECT_FLOAT_EQ(b.ratio, 0.15f);
  EXPECT_EQ(b.num_check_layers, 1u);
  EXPECT_EQ(b.selected, 6u);  // 42 x 0.15, rounded
  // First tokens: each document's first 3 run every layer.
  kdn_blend_options anchors = o;
  anchors.first_tokens = 3;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &anchors, &kv_pass_view, 1, &a), KDN_OK);
  EXPECT_EQ(a.anchored, 6u);
  // A kv_fn without its cost, or a cost outside (0, 1], is refused.
  for (float bad : {0.0f, -0.5f, 1.5f}) {
    kdn_blend_options nocost = o;
    nocost.kv_cost = bad;
    EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &nocost, &kv_pass_view, 1, &a), KDN_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(kdn_last_error_message()).find("kv_cost"), std::string::npos);
  }
  // A 1.8 caller: its struct ends before kv_fn, its report before anchored.
  kdn_blend_options old = o;
  old.struct_size = KDN_BLEND_OPTIONS_SIZE_V1;
  old.ratio = 0.15f;
  old.kv_fn = KvOnly;  // beyond its size: never read
  kdn_blend_report old_report = KDN_BLEND_REPORT_INIT;
  old_report.struct_size = KDN_BLEND_REPORT_SIZE_V1;
  old_report.anchored = 77;  // beyond its size: never written
  const int kv_calls = e.kv_calls;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &old, &whole_view, 1, &old_report), KDN_OK)
      << kdn_last_error_message();
  EXPECT_EQ(e.kv_calls, kv_calls);
  EXPECT_EQ(old_report.filled_size, KDN_BLEND_REPORT_SIZE_V1);
  EXPECT_EQ(old_report.selected, 6u);
  EXPECT_EQ(old_report.anchored, 77u);
}

// 1.9: blending by text. kdn_kv_match finds the documents' chunks in a
// context's tokens at any offset; kdn_kv_blend_tokens places them and
// computes the rest: the same KV, bit for bit, as kdn_kv_blend given the
// same documents as segments.
TEST_F(BlendApiTest, BlendsAContextGivenAsTokensAsTheSegmentsWould) {
  const auto& c = t_->config();
  const std::vector<int32_t> a = Ids(1, 19), b = Ids(2, 23), between = Ids(4, 3), query = Ids(3, 5);
  Put("doc-a", a);
  Put("doc-b", b);
  std::vector<int32_t> ctx = {kBos};
  ctx.insert(ctx.end(), b.begin(), b.end());
  ctx.insert(ctx.end(), between.begin(), between.end());
  ctx.insert(ctx.end(), a.begin(), a.end());
  ctx.insert(ctx.end(), query.begin(), query.end());
  const size_t total = ctx.size();  // 1 + 23 + 3 + 19 + 5
  kdn_token_range ranges[4];
  size_t count = 99;
  ASSERT_EQ(kdn_kv_match(model_, "t", 1, ctx.data(), ctx.size(), ranges, 4, &count), KDN_OK) << kdn_last_error_message();
  ASSERT_EQ(count, 2u);
  EXPECT_EQ(ranges[0].begin, 1u);
  EXPECT_EQ(ranges[0].end, 24u);
  EXPECT_EQ(ranges[1].begin, 27u);
  EXPECT_EQ(ranges[1].end, 46u);
  // Room for one: the count says two, one is written.
  kdn_token_range one[2] = {{7, 7}, {7, 7}};
  ASSERT_EQ(kdn_kv_match(model_, "t", 1, ctx.data(), ctx.size(), one, 1, &count), KDN_OK);
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(one[0].begin, 1u);
  EXPECT_EQ(one[1].begin, 7u);
  // Another tenant's context finds nothing of these documents.
  ASSERT_EQ(kdn_kv_match(model_, "u", 1, ctx.data(), ctx.size(), ranges, 4, &count), KDN_OK);
  EXPECT_EQ(count, 0u);
  EXPECT_EQ(kdn_kv_match(model_, "t", 1, ctx.data(), ctx.size(), nullptr, 4, &count), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_kv_match(model_, "t", 1, ctx.data(), ctx.size(), ranges, 4, nullptr), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_kv_match(model_, "t", 1, ctx.data(), 0, ranges, 4, &count), KDN_ERR_INVALID_ARGUMENT);

  const size_t floats = total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim();
  std::vector<float> by_text(floats, -1.0f), by_segments(floats, -2.0f);
  kdn_kv_view text_view = Canonical(by_text, total), seg_view = Canonical(by_segments, total);
  Engine e{t_.get()};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  o.hidden_dim = static_cast<uint32_t>(c.dim);
  o.layer_fn = Layer;
  o.user = &e;
  o.kv_fn = KvOnly;
  o.kv_cost = 0.05f;
  kdn_blend_report rt = KDN_BLEND_REPORT_INIT, rs = KDN_BLEND_REPORT_INIT;
  ASSERT_EQ(kdn_kv_blend_tokens(model_, "t", 1, ctx.data(), ctx.size(), &o, &text_view, 1, &rt), KDN_OK)
      << kdn_last_error_message();
  const std::vector<int32_t> bos = {kBos};
  kdn_blend_segment seg[5] = {Tokens(bos), Document("doc-b"), Tokens(between), Document("doc-a"), Tokens(query)};
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 5, &o, &seg_view, 1, &rs), KDN_OK) << kdn_last_error_message();
  EXPECT_EQ(rt.positions, total);
  EXPECT_EQ(rt.cached_positions, 42u);
  EXPECT_EQ(rt.fresh_positions, 9u);
  EXPECT_EQ(rt.selected, rs.selected);
  EXPECT_EQ(rt.recompute_fraction, rs.recompute_fraction);
  for (size_t i = 0; i < floats; ++i) ASSERT_EQ(by_text[i], by_segments[i]) << i;
  // A document replaced by other tokens is no longer found: its tokens are
  // computed now (the context's KV is then what full prefill computes for
  // that part at ratio 1).
  Put("doc-b", Ids(9, 23));
  ASSERT_EQ(kdn_kv_match(model_, "t", 1, ctx.data(), ctx.size(), ranges, 4, &count), KDN_OK);
  ASSERT_EQ(count, 1u);
  EXPECT_EQ(ranges[0].begin, 27u);
  ASSERT_EQ(kdn_kv_blend_tokens(model_, "t", 1, ctx.data(), ctx.size(), &o, &text_view, 1, &rt), KDN_OK);
  EXPECT_EQ(rt.cached_positions, 19u);
  EXPECT_EQ(rt.fresh_positions, 32u);
  // Bad arguments.
  EXPECT_EQ(kdn_kv_blend_tokens(model_, "t", 1, ctx.data(), 0, &o, &text_view, 1, &rt), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_kv_blend_tokens(model_, "t", 1, ctx.data(), ctx.size(), nullptr, &text_view, 1, &rt),
            KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kdn_kv_blend_tokens(model_, "t", 1, ctx.data(), ctx.size(), &o, nullptr, 0, &rt), KDN_ERR_INVALID_ARGUMENT);
  text_view.num_tokens = total - 1;
  EXPECT_NE(kdn_kv_blend_tokens(model_, "t", 1, ctx.data(), ctx.size(), &o, &text_view, 1, &rt), KDN_OK);
  EXPECT_EQ(rt.filled_size, 0u);
}

// A part of a document (its chunks 1 and 2 of 3, with 8-token chunks) is
// placed from where it sits in the document: the blend equals the library's
// Compose of a piece whose KV was computed at positions 8..23.
TEST_F(BlendApiTest, APartOfADocumentIsPlacedFromItsPlaceInTheDocument) {
  const auto& c = t_->config();
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = 8;
  kdn_runtime* rt = nullptr;
  ASSERT_EQ(kdn_runtime_create(&ro, &rt), KDN_OK);
  kdn_model* model = nullptr;
  const kdn_model_spec spec = Spec();
  ASSERT_EQ(kdn_model_create(rt, &spec, &model), KDN_OK);
  const std::vector<int32_t> doc = Ids(5, 24), query = Ids(6, 4);
  kdn::model::KvCache alone = t_->NewCache();
  ASSERT_TRUE(t_->Forward(std::vector<int>(doc.begin(), doc.end()), 0, alone, nullptr).ok());
  std::vector<float> kv0 = alone.Export(0, 24);
  const kdn_kv_view put_view = Canonical(kv0, 24);
  ASSERT_EQ(kdn_knowledge_put(model, "t", 1, "d", 1, 1, "", 0, doc.data(), doc.size(), &put_view, 1), KDN_OK);
  std::vector<int32_t> ctx = {kBos};
  ctx.insert(ctx.end(), doc.begin() + 8, doc.end());
  ctx.insert(ctx.end(), query.begin(), query.end());
  kdn_token_range ranges[2];
  size_t count = 0;
  ASSERT_EQ(kdn_kv_match(model, "t", 1, ctx.data(), ctx.size(), ranges, 2, &count), KDN_OK);
  ASSERT_EQ(count, 1u);  // chunks 1 and 2, one range
  EXPECT_EQ(ranges[0].begin, 1u);
  EXPECT_EQ(ranges[0].end, 17u);
  const size_t total = ctx.size();
  std::vector<float> out(total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim(), -1.0f);
  kdn_kv_view view = Canonical(out, total);
  Engine e{t_.get()};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  o.ratio = 0.25f;
  o.hidden_dim = static_cast<uint32_t>(c.dim);
  o.layer_fn = Layer;
  o.user = &e;
  kdn_blend_report rep = KDN_BLEND_REPORT_INIT;
  ASSERT_EQ(kdn_kv_blend_tokens(model, "t", 1, ctx.data(), ctx.size(), &o, &view, 1, &rep), KDN_OK)
      << kdn_last_error_message();
  EXPECT_EQ(rep.cached_positions, 16u);
  // The library: the slice's KV, computed at positions 8..23 of the document.
  const size_t kvd = static_cast<size_t>(c.kv_dim());
  std::vector<float> slice;
  for (size_t lk = 0; lk < static_cast<size_t>(c.n_layers) * 2; ++lk) {
    slice.insert(slice.end(), kv0.begin() + static_cast<std::ptrdiff_t>((lk * 24 + 8) * kvd),
                 kv0.begin() + static_cast<std::ptrdiff_t>((lk * 24 + 24) * kvd));
  }
  kdn::blend::TransformerEngine engine(*t_);
  kdn::blend::BlendOptions bo;
  bo.ratio = 0.25;
  bo.check_layers = {1};
  bo.rope = kdn::blend::Llama2cRope(c);
  const std::vector<kdn::blend::Piece> pieces = {
      kdn::blend::Piece{{kBos}, {}, 0}, kdn::blend::Piece{std::vector<int32_t>(doc.begin() + 8, doc.end()), slice, 8},
      kdn::blend::Piece{query, {}, 0}};
  std::vector<float> want;
  ASSERT_TRUE(kdn::blend::Compose(kdn::blend::ShapeOf(c), pieces, bo, engine, &want).ok());
  ASSERT_EQ(want.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], want[i]) << i;
  kdn_model_destroy(model);
  kdn_runtime_destroy(rt);
}

// 1.9: the accuracy gate. A gate file (as `kdn blend calibrate` writes it)
// with this model's measurements: the method measured at or below the bound
// blends; one above it, or one the file does not hold, is refused: every
// position recomputed (the full prefill, exact) and the report says so.
TEST_F(BlendApiTest, TheGateRefusesAMethodMeasuredAboveItsBoundAndOneNeverMeasured) {
  const auto& c = t_->config();
  Put("doc-a", Ids(1, 19));
  Put("doc-b", Ids(2, 23));
  const std::vector<int32_t> bos = {kBos}, query = Ids(3, 5);
  kdn_blend_segment seg[4] = {Tokens(bos), Document("doc-b"), Document("doc-a"), Tokens(query)};
  const size_t total = 1 + 23 + 19 + 5;
  uint8_t fp[32];
  ASSERT_EQ(kdn_model_get_fingerprint(model_, fp), KDN_OK);
  std::string hex;
  for (uint8_t b : fp) {
    char two[3];
    std::snprintf(two, sizeof two, "%02x", b);
    hex += two;
  }
  const std::string path = ::testing::TempDir() + "kdn_gate_" + std::to_string(getpid());
  {
    std::ofstream f(path);
    f << "# measured\n"
      << hex << " ratio=0.28 checks=1,2 kv_pass=1 first=0 kl_ratio=0.11 top1=0.99 f=0.547 contexts=15\n"
      << hex << " ratio=0.15 checks=1 kv_pass=0 first=0 kl_ratio=0.31 top1=0.98 f=0.543 contexts=15\n";
  }
  // Full prefill's KV of the context, for the refused blends.
  std::vector<int> ctx = {kBos};
  for (int32_t t : Ids(2, 23)) ctx.push_back(t);
  for (int32_t t : Ids(1, 19)) ctx.push_back(t);
  for (int32_t t : query) ctx.push_back(t);
  kdn::model::KvCache full = t_->NewCache();
  ASSERT_TRUE(t_->Forward(ctx, 0, full, nullptr).ok());
  const std::vector<float> prefill = full.Export(0, static_cast<int>(total));

  std::vector<float> out(total * static_cast<size_t>(c.n_layers) * 2 * c.kv_dim(), -1.0f);
  kdn_kv_view view = Canonical(out, total);
  Engine e{t_.get()};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  EXPECT_FLOAT_EQ(o.max_kl_ratio, 0.2f);
  o.hidden_dim = static_cast<uint32_t>(c.dim);
  o.layer_fn = Layer;
  o.user = &e;
  o.kv_fn = KvOnly;
  o.kv_cost = 0.05f;
  o.gate_file = path.c_str();
  o.gate_file_len = path.size();
  kdn_blend_report rep = KDN_BLEND_REPORT_INIT;
  EXPECT_EQ(rep.gate_kl_ratio, -1.0f);
  // The default method, measured at 0.11 <= 0.2: it blends.
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &view, 1, &rep), KDN_OK) << kdn_last_error_message();
  EXPECT_EQ(rep.gated, 0u);
  EXPECT_FLOAT_EQ(rep.gate_kl_ratio, 0.11f);
  EXPECT_LT(rep.recompute_fraction, 0.6);
  EXPECT_NE(out, prefill);
  // CacheBlend's (no kv_fn), measured at 0.31 > 0.2: refused, full prefill.
  kdn_blend_options whole = o;
  whole.kv_fn = nullptr;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &whole, &view, 1, &rep), KDN_OK) << kdn_last_error_message();
  EXPECT_EQ(rep.gated, 1u);
  EXPECT_FLOAT_EQ(rep.gate_kl_ratio, 0.31f);
  EXPECT_EQ(rep.recompute_fraction, 1.0);
  EXPECT_EQ(out, prefill);
  // With a looser bound it blends.
  whole.max_kl_ratio = 0.4f;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &whole, &view, 1, &rep), KDN_OK);
  EXPECT_EQ(rep.gated, 0u);
  EXPECT_LT(rep.recompute_fraction, 0.6);
  // A method the file does not hold (first tokens): refused, no measurement.
  kdn_blend_options anchors = o;
  anchors.first_tokens = 2;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &anchors, &view, 1, &rep), KDN_OK);
  EXPECT_EQ(rep.gated, 1u);
  EXPECT_EQ(rep.gate_kl_ratio, -1.0f);
  EXPECT_EQ(out, prefill);
  // Without a gate file nothing is gated.
  kdn_blend_options none = anchors;
  none.gate_file = nullptr;
  none.gate_file_len = 0;
  ASSERT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &none, &view, 1, &rep), KDN_OK);
  EXPECT_EQ(rep.gated, 0u);
  EXPECT_EQ(rep.gate_kl_ratio, -1.0f);
  // A file that cannot be read, or a malformed one, is an error naming it; a bad bound too.
  kdn_blend_options bad = o;
  const std::string missing = path + ".missing";
  bad.gate_file = missing.c_str();
  bad.gate_file_len = missing.size();
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &bad, &view, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find(".missing"), std::string::npos);
  {
    std::ofstream f(path, std::ios::app);
    f << hex << " ratio=0.28\n";
  }
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &o, &view, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("line 4"), std::string::npos) << kdn_last_error_message();
  bad = o;
  bad.max_kl_ratio = -1.0f;
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &bad, &view, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  bad = o;
  bad.gate_file = nullptr;  // with a length
  EXPECT_EQ(kdn_kv_blend(model_, "t", 1, seg, 4, &bad, &view, 1, &rep), KDN_ERR_INVALID_ARGUMENT);
  std::remove(path.c_str());
}

}  // namespace
