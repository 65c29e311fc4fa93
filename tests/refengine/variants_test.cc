// SPDX-License-Identifier: Apache-2.0
// The model kinds served today, proved with exact reuse (issue 36): small
// variants of the reference engine (refengine/variants.h: MLA, sliding
// windows, a recurrent layer, and all of them together; seeded random
// weights) keep their KV, latents and recurrent states in kdn through the C
// ABI alone, as an engine does: stored at every chunk boundary of a
// chunked prefill, then, after a restart, served by the disk tier alone. A
// prompt continued from what kdn gave back computes the same bits as one
// prefilled from scratch. Layer groups follow one rule for hits: a group
// missing (a chunk of the full layers, one in a sliding window, a state
// snapshot) shortens the prefix, and nothing past it is written.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/engine/groups.h"
#include "core/keys/hash.h"
#define KDN_EXPERIMENTAL  // kdn_kv_blend
#include "kdn/kdn.h"
#include "refengine/variants.h"

namespace kdn::refengine {
namespace {

constexpr std::uint32_t kChunk = 16;

std::string TempDir() {
  std::string t = ::testing::TempDir() + "/kdn_variants_XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

std::vector<std::int32_t> Tokens(int n, std::uint64_t seed, int vocab) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(vocab));
  return t;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The variant's model as kdn sees it, and the views of a cache.
class Kdn {
 public:
  // A host tier written through to a disk tier in `dir`, or the disk tier alone.
  Kdn(const VariantModel& m, const std::string& dir, bool host) : m_(m) {
    kdn_tier_config tiers[2] = {KDN_TIER_CONFIG_INIT, KDN_TIER_CONFIG_INIT};
    size_t n = 0;
    if (host) {
      tiers[n].kind = KDN_TIER_HOST;
      tiers[n].capacity_bytes = std::uint64_t{16} << 20;
      tiers[n].write_through = 1;
      ++n;
    }
    tiers[n].kind = KDN_TIER_DISK;
    tiers[n].capacity_bytes = std::uint64_t{64} << 20;
    tiers[n].path = dir.c_str();
    tiers[n].path_len = dir.size();
    ++n;
    kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
    o.chunk_tokens = kChunk;
    o.tiers = tiers;
    o.num_tiers = n;
    o.device = KDN_DEVICE_NONE;
    EXPECT_EQ(kdn_runtime_create(&o, &rt_), KDN_OK) << kdn_last_error_message();
    windows_ = m.windows();
    kdn_model_spec s = Spec();
    EXPECT_EQ(kdn_model_create(rt_, &s, &model_), KDN_OK) << kdn_last_error_message();
  }
  ~Kdn() {
    kdn_model_destroy(model_);
    kdn_runtime_destroy(rt_);
  }
  Kdn(const Kdn&) = delete;
  Kdn& operator=(const Kdn&) = delete;

  kdn_model_spec Spec() const {
    kdn_model_spec s = KDN_MODEL_SPEC_INIT;
    const VariantConfig& c = m_.config();
    s.num_layers = static_cast<std::uint32_t>(m_.attention_layers());
    if (m_.latent()) {
      s.cache_kind = KDN_CACHE_LATENT;
      s.latent_dim = static_cast<std::uint32_t>(c.latent_rank + c.latent_rope);
      s.latent_rope_dim = static_cast<std::uint32_t>(c.latent_rope);
    } else {
      s.num_kv_heads = static_cast<std::uint32_t>(c.kv_heads);
      s.head_dim = static_cast<std::uint32_t>(c.head_dim);
    }
    s.dtype = KDN_DTYPE_F32;
    fingerprint_ = "variant-" + c.name + "-seed-" + std::to_string(c.seed);
    s.fingerprint = fingerprint_.c_str();
    s.fingerprint_len = fingerprint_.size();
    s.layer_windows = windows_.data();
    s.num_state_layers = static_cast<std::uint32_t>(m_.state_layers());
    s.state_bytes = m_.state_layers() > 0 ? static_cast<std::uint64_t>(m_.state_floats()) * sizeof(float) : 0;
    return s;
  }

  // One view over every attention layer of `c`, with its states.
  kdn_kv_view View(VariantModel::Cache& c) {
    k_.clear();
    v_.clear();
    state_.clear();
    for (auto& k : c.k) k_.push_back(k.data());
    for (auto& v : c.v) v_.push_back(v.data());
    for (auto& s : c.state) state_.push_back(s.data());
    kdn_kv_view view = KDN_KV_VIEW_INIT;
    view.dtype = KDN_DTYPE_F32;
    view.k_layers = k_.data();
    view.num_tokens = static_cast<std::uint64_t>(m_.config().max_tokens);
    if (!m_.latent()) {
      const std::int64_t hd = m_.config().head_dim;
      view.v_layers = v_.data();
      view.stride_token = m_.kv_width();
      view.stride_head = hd;
      view.stride_dim = 1;
    }
    view.state_layers = state_.empty() ? nullptr : state_.data();
    return view;
  }

  static kdn_request Request(const std::vector<std::int32_t>& tokens, size_t n) {
    kdn_request r = KDN_REQUEST_INIT;
    r.tokens = tokens.data();
    r.num_tokens = n;
    return r;
  }

  std::uint64_t Store(const std::string& ns, const std::vector<std::int32_t>& tokens, size_t n,
                      VariantModel::Cache& c, bool with_state = true) {
    kdn_request r = Request(tokens, n);
    kdn_kv_view view = View(c);
    if (!with_state) view.state_layers = nullptr;
    kdn_kv_result out = KDN_KV_RESULT_INIT;
    EXPECT_EQ(kdn_kv_store(model_, ns.data(), ns.size(), &r, &view, 1, &out), KDN_OK) << kdn_last_error_message();
    return out.tokens;
  }
  // The same through an asynchronous save, every layer reported ready.
  std::uint64_t Save(const std::string& ns, const std::vector<std::int32_t>& tokens, size_t n,
                     VariantModel::Cache& c) {
    kdn_request r = Request(tokens, n);
    kdn_kv_view view = View(c);
    kdn_op* op = nullptr;
    EXPECT_EQ(kdn_kv_save_async(model_, ns.data(), ns.size(), &r, &view, 1, &op), KDN_OK) << kdn_last_error_message();
    if (op == nullptr) return 0;
    for (int l = 0; l < m_.attention_layers(); ++l) EXPECT_EQ(kdn_op_layer_ready(op, static_cast<std::uint32_t>(l)), KDN_OK);
    EXPECT_EQ(kdn_op_wait(op, -1), KDN_OK) << kdn_last_error_message();
    kdn_kv_result out = KDN_KV_RESULT_INIT;
    EXPECT_EQ(kdn_op_get_result(op, &out), KDN_OK);
    kdn_op_destroy(op);
    return out.tokens;
  }
  std::uint64_t Lookup(const std::string& ns, const std::vector<std::int32_t>& tokens) {
    kdn_request r = Request(tokens, tokens.size());
    kdn_lookup_result out = KDN_LOOKUP_RESULT_INIT;
    EXPECT_EQ(kdn_kv_lookup(model_, ns.data(), ns.size(), &r, 1, &out), KDN_OK) << kdn_last_error_message();
    EXPECT_EQ(out.status, KDN_OK);
    return out.cached_tokens;
  }
  kdn_kv_result Retrieve(const std::string& ns, const std::vector<std::int32_t>& tokens, VariantModel::Cache& c) {
    kdn_request r = Request(tokens, tokens.size());
    kdn_kv_view view = View(c);
    kdn_kv_result out = KDN_KV_RESULT_INIT;
    EXPECT_EQ(kdn_kv_retrieve(model_, ns.data(), ns.size(), &r, &view, 1, &out), KDN_OK) << kdn_last_error_message();
    return out;
  }
  kdn_kv_result Load(const std::string& ns, const std::vector<std::int32_t>& tokens, VariantModel::Cache& c) {
    kdn_request r = Request(tokens, tokens.size());
    kdn_kv_view view = View(c);
    kdn_op* op = nullptr;
    kdn_kv_result out = KDN_KV_RESULT_INIT;
    EXPECT_EQ(kdn_kv_load_async(model_, ns.data(), ns.size(), &r, &view, 1, &op), KDN_OK) << kdn_last_error_message();
    if (op == nullptr) return out;
    for (int l = 0; l < m_.attention_layers(); ++l) EXPECT_EQ(kdn_op_wait_layer(op, static_cast<std::uint32_t>(l), -1), KDN_OK);
    EXPECT_EQ(kdn_op_wait(op, -1), KDN_OK);
    EXPECT_EQ(kdn_op_get_result(op, &out), KDN_OK);
    kdn_op_destroy(op);
    return out;
  }

  kdn_model* model() const { return model_; }
  kdn_runtime* runtime() const { return rt_; }

  // The keys kdn keeps a request's pieces under (engine/groups.h), to take
  // one away as an eviction would: the group of `layer`'s chunk starting at
  // `begin`, or the snapshot at the end of the chunk that ends at `end`.
  store::GroupedModel Grouped() const {
    std::uint8_t fp[32];
    EXPECT_EQ(kdn_model_get_fingerprint(model_, fp), KDN_OK);
    store::ModelKv kv;
    std::memcpy(kv.fingerprint.data(), fp, 32);
    const VariantConfig& c = m_.config();
    kv.shape = {m_.attention_layers(), m_.latent() ? 1 : c.kv_heads,
                m_.latent() ? (c.latent_rank + c.latent_rope) / 2 : c.head_dim, 4};
    kv.dtype = KDN_DTYPE_F32;
    auto g = store::GroupedModel::Make(kv, windows_, static_cast<std::uint32_t>(m_.state_layers()),
                                       m_.state_layers() > 0 ? static_cast<std::uint64_t>(m_.state_floats()) * 4 : 0);
    EXPECT_TRUE(g.ok());
    return std::move(g).value();
  }
  // The chain keys of tokens [0, end) cut as a store cuts them (whole
  // chunks, then pieces of decreasing powers of two).
  std::vector<std::pair<std::uint64_t, keys::Digest>> Chain(const std::string& ns, const std::vector<std::int32_t>& t,
                                                            size_t end) const {
    std::uint8_t fp[32];
    EXPECT_EQ(kdn_model_get_fingerprint(model_, fp), KDN_OK);
    keys::Digest model{};
    std::memcpy(model.data(), fp, 32);
    std::vector<std::pair<std::uint64_t, keys::Digest>> out;  // (chunk end, key)
    keys::Digest prev{};
    size_t pos = 0;
    while (pos < end) {
      size_t len = end - pos >= kChunk ? kChunk : std::bit_floor(end - pos);
      prev = keys::ChunkKey(0, ns, model, prev, std::span<const std::int32_t>(t.data() + pos, len));
      pos += len;
      out.emplace_back(pos, prev);
    }
    return out;
  }

 private:
  const VariantModel& m_;
  kdn_runtime* rt_ = nullptr;
  kdn_model* model_ = nullptr;
  std::vector<std::uint32_t> windows_;
  mutable std::string fingerprint_;
  std::vector<void*> k_, v_, state_;
};

// Removes the disk tier's file of `key` (the runtime closed): as if evicted.
void RemoveObject(const std::string& dir, const keys::Digest& key) {
  const std::string name = keys::ToHex(key) + ".kdn";
  bool found = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().filename() == name) found = std::filesystem::remove(e.path());
  }
  ASSERT_TRUE(found) << "no object " << name << " in " << dir;
}

// A prompt prefilled token by token, kdn storing every chunk boundary (and
// the prompt's end) as it goes: what an engine with chunked prefill does.
void PrefillStoring(const VariantModel& m, Kdn& kdn, const std::string& ns, const std::vector<std::int32_t>& prompt,
                    VariantModel::Cache& cache, bool async) {
  for (size_t p = 0; p < prompt.size(); ++p) {
    m.Step(cache, prompt[p], static_cast<int>(p));
    const size_t n = p + 1;
    if (n % kChunk != 0 && n != prompt.size()) continue;
    const std::uint64_t stored = async ? kdn.Save(ns, prompt, n, cache) : kdn.Store(ns, prompt, n, cache);
    EXPECT_EQ(stored, n) << "stored at " << n;
  }
}

// Logits of `tokens` fed from position `from` on, then `generate` greedy tokens.
std::vector<std::vector<float>> Continue(const VariantModel& m, VariantModel::Cache& cache,
                                         const std::vector<std::int32_t>& tokens, size_t from, int generate) {
  std::vector<std::vector<float>> out;
  int pos = static_cast<int>(from);
  for (size_t i = from; i < tokens.size(); ++i) out.push_back(m.Step(cache, tokens[i], pos++));
  for (int g = 0; g < generate && !out.empty(); ++g) out.push_back(m.Step(cache, Argmax(out.back()), pos++));
  return out;
}

class VariantReuse : public ::testing::TestWithParam<const char*> {};

TEST_P(VariantReuse, AContinuationFromReusedKvAndStateIsBitIdenticalAfterARestart) {
  const VariantModel m(Variant(GetParam()));
  const std::string dir = TempDir();
  const auto prompt = Tokens(70, 1, m.config().vocab);
  auto full = prompt;
  for (std::int32_t t : Tokens(10, 2, m.config().vocab)) full.push_back(t);
  // The reference: prompt and question prefilled from scratch, then 8 tokens.
  VariantModel::Cache ref = m.NewCache();
  const auto want = Continue(m, ref, full, 0, 8);
  {
    // Engine 1 serves the prompt, storing as it prefills (its saves
    // asynchronous for two of the variants).
    Kdn kdn(m, dir, /*host=*/true);
    VariantModel::Cache cache = m.NewCache();
    const bool async = std::string(GetParam()) == "hybrid" || std::string(GetParam()) == "mla";
    PrefillStoring(m, kdn, "t", prompt, cache, async);
    EXPECT_EQ(kdn.Lookup("t", full), prompt.size());
  }
  // Engine 2, after a restart, with the disk tier alone: its cache starts as
  // NaN, so any KV it reads that kdn did not write shows.
  Kdn kdn(m, dir, /*host=*/false);
  EXPECT_EQ(kdn.Lookup("t", full), prompt.size());
  VariantModel::Cache cache = m.NewCache(std::nanf(""));
  const kdn_kv_result r = kdn.Retrieve("t", full, cache);
  ASSERT_EQ(r.tokens, prompt.size());
  EXPECT_EQ(r.covered, prompt.size());
  EXPECT_EQ(r.flags & KDN_RESULT_LOSSY, 0u);
  const auto got = Continue(m, cache, full, prompt.size(), 8);
  ASSERT_EQ(got.size(), want.size() - prompt.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(SameBits(got[i], want[prompt.size() + i])) << GetParam() << ": logits at position " << prompt.size() + i;
  }
  // A load op gives the same.
  VariantModel::Cache loaded = m.NewCache(std::nanf(""));
  const kdn_kv_result l = kdn.Load("t", full, loaded);
  EXPECT_EQ(l.tokens, prompt.size());
  const auto again = Continue(m, loaded, full, prompt.size(), 8);
  for (size_t i = 0; i < again.size(); ++i) EXPECT_TRUE(SameBits(again[i], got[i])) << "load op, position " << i;
  // A sliding window's older chunks were neither required nor read: before
  // the chunk that holds the window's start, its layers' KV is still NaN;
  // full layers have every position.
  const auto windows = m.windows();
  for (size_t l = 0; l < windows.size(); ++l) {
    const float first = loaded.k[l][0];
    if (windows[l] != 0) {
      EXPECT_TRUE(std::isnan(first)) << "sliding layer " << l << ": position 0 was loaded";
    } else {
      EXPECT_FALSE(std::isnan(first)) << "full layer " << l << ": position 0 not loaded";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, VariantReuse, ::testing::Values("mla", "sliding", "recurrent", "hybrid"));

// ---- Blending a latent (MLA) model (issue 36, item 1)

// The variant run layer by layer as blending's engine (kdn_blend_layer_fn).
// A latent model's callback gets each position's latent whole in `k`
// ([total][latent_dim]) and `v` NULL (kdn.h).
struct LayerByLayer {
  const VariantModel* m = nullptr;
  int calls = 0;
};

kdn_status VariantLayer(void* user, std::uint32_t layer, const std::int32_t* positions, const std::int32_t* tokens,
                        size_t count, float* hidden, size_t hidden_len, std::uint32_t hidden_dim, float* k, float* v,
                        size_t kv_len, size_t total) {
  auto& e = *static_cast<LayerByLayer*>(user);
  const VariantModel& m = *e.m;
  const auto w = static_cast<size_t>(m.kv_width()), D = static_cast<size_t>(m.config().dim);
  if (v != nullptr || k == nullptr || kv_len != total * w || hidden_dim != D || hidden_len != count * D ||
      (layer == 0) != (tokens != nullptr)) {
    return KDN_ERR_INVALID_ARGUMENT;
  }
  ++e.calls;
  VariantModel::Cache c = m.NewCache();  // every layer latent: the layer's slot is its number
  std::copy(k, k + total * w, c.k[layer].begin());
  for (size_t i = 0; i < count; ++i) {
    std::vector<float> x = layer == 0 ? m.Embed(tokens[i]) : std::vector<float>(hidden + i * D, hidden + (i + 1) * D);
    m.LayerStep(static_cast<int>(layer), c, positions[i], x);
    std::copy(x.begin(), x.end(), hidden + i * D);
  }
  for (size_t i = 0; i < count; ++i) {
    const size_t p = static_cast<size_t>(positions[i]);
    std::copy(c.k[layer].begin() + static_cast<std::ptrdiff_t>(p * w),
              c.k[layer].begin() + static_cast<std::ptrdiff_t>((p + 1) * w), k + p * w);
  }
  return KDN_OK;
}

// Two documents whose latents were computed alone (each from position 0),
// composed in order before a question. Only the latents' RoPE dims move:
// with nothing recomputed (ratio 0) a placed document keeps its content
// dims bit for bit, and its RoPE dims at layer 0 (where a latent depends on
// its token alone) are what a full prefill computes there, to float
// rounding; with everything recomputed (ratio 1) the blend is the full
// prefill, bit for bit, and so is the continuation from it. The weights are
// random: quality figures (KL) would mean nothing and are not asserted.
TEST(VariantBlend, ALatentModelIsBlendedByMovingOnlyItsRopeDims) {
  const VariantModel m(Variant("mla"));
  const VariantConfig& c = m.config();
  const size_t w = static_cast<size_t>(m.kv_width()), rank = static_cast<size_t>(c.latent_rank);
  Kdn kdn(m, TempDir(), /*host=*/true);
  const auto a = Tokens(40, 21, c.vocab), b = Tokens(36, 22, c.vocab), question = Tokens(7, 23, c.vocab);
  std::vector<VariantModel::Cache> alone;
  for (const auto* doc : {&a, &b}) {
    alone.push_back(m.NewCache());
    for (size_t p = 0; p < doc->size(); ++p) m.Step(alone.back(), (*doc)[p], static_cast<int>(p));
    kdn_kv_view view = kdn.View(alone.back());
    const char* id = doc == &a ? "a" : "b";
    ASSERT_EQ(kdn_knowledge_put(kdn.model(), "t", 1, id, 1, 1, nullptr, 0, doc->data(), doc->size(), &view, 1), KDN_OK)
        << kdn_last_error_message();
  }
  // The reference: a, b and the question prefilled, then 8 tokens.
  std::vector<std::int32_t> full = a;
  full.insert(full.end(), b.begin(), b.end());
  full.insert(full.end(), question.begin(), question.end());
  VariantModel::Cache ref = m.NewCache();
  const auto want = Continue(m, ref, full, 0, 8);
  const size_t N = full.size() - 1;  // the blend's context: all but the question's last token, fed after it

  // Check layer 0 (the default, layer 1, is this 2-layer model's last: a
  // selection there would save nothing).
  const std::uint32_t check[1] = {0};
  auto blend = [&](float ratio, VariantModel::Cache& out, kdn_blend_report* report) {
    kdn_blend_segment segs[3] = {KDN_BLEND_SEGMENT_INIT, KDN_BLEND_SEGMENT_INIT, KDN_BLEND_SEGMENT_INIT};
    segs[0].kind = segs[1].kind = KDN_SEGMENT_DOCUMENT;
    segs[0].doc_id = "a";
    segs[1].doc_id = "b";
    segs[0].doc_id_len = segs[1].doc_id_len = 1;
    segs[2].tokens = question.data();
    segs[2].num_tokens = question.size() - 1;
    LayerByLayer engine{&m};
    kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
    o.ratio = ratio;
    o.hidden_dim = static_cast<std::uint32_t>(c.dim);
    o.layer_fn = VariantLayer;
    o.user = &engine;
    o.check_layers = check;
    o.num_check_layers = 1;
    kdn_kv_view view = kdn.View(out);
    EXPECT_EQ(kdn_kv_blend(kdn.model(), "t", 1, segs, 3, &o, &view, 1, report), KDN_OK) << kdn_last_error_message();
    EXPECT_GT(engine.calls, 0);
  };

  // Nothing recomputed: documents placed, only their RoPE dims moved.
  VariantModel::Cache naive = m.NewCache(std::nanf(""));
  kdn_blend_report r0 = KDN_BLEND_REPORT_INIT;
  blend(0.0f, naive, &r0);
  EXPECT_EQ(r0.positions, N);
  EXPECT_EQ(r0.cached_positions, a.size() + b.size());
  EXPECT_EQ(r0.selected, 0u);
  double moved = 0, off = 0;
  for (int l = 0; l < m.attention_layers(); ++l) {
    const float* got = naive.k[static_cast<size_t>(l)].data();
    for (size_t p = 0; p < N; ++p) {
      for (size_t d = 0; d < w; ++d) ASSERT_FALSE(std::isnan(got[p * w + d])) << "layer " << l << " position " << p;
    }
    for (size_t i = 0; i < a.size(); ++i) {  // at its own positions: unchanged
      ASSERT_EQ(std::memcmp(got + i * w, alone[0].k[static_cast<size_t>(l)].data() + i * w, w * 4), 0) << l << " " << i;
    }
    for (size_t i = 0; i < b.size(); ++i) {
      const float* placed = got + (a.size() + i) * w;
      const float* mine = alone[1].k[static_cast<size_t>(l)].data() + i * w;
      ASSERT_EQ(std::memcmp(placed, mine, rank * 4), 0) << "content dims changed: layer " << l << " token " << i;
      if (l != 0) continue;
      const float* prefilled = ref.k[0].data() + (a.size() + i) * w;
      for (size_t d = rank; d < w; ++d) {
        moved = std::max(moved, static_cast<double>(std::fabs(placed[d] - mine[d])));
        off = std::max(off, static_cast<double>(std::fabs(placed[d] - prefilled[d])));
      }
    }
  }
  EXPECT_GT(moved, 0.05) << "the second document's RoPE dims were not re-positioned";
  EXPECT_LT(off, 1e-4) << "layer 0's RoPE dims differ from a full prefill's";

  // Everything recomputed: the full prefill, bit for bit.
  VariantModel::Cache whole = m.NewCache(std::nanf(""));
  kdn_blend_report r1 = KDN_BLEND_REPORT_INIT;
  blend(1.0f, whole, &r1);
  EXPECT_DOUBLE_EQ(r1.recompute_fraction, 1.0);
  for (int l = 0; l < m.attention_layers(); ++l) {
    EXPECT_EQ(std::memcmp(whole.k[static_cast<size_t>(l)].data(), ref.k[static_cast<size_t>(l)].data(), N * w * 4), 0)
        << "layer " << l;
  }
  const auto got = Continue(m, whole, full, N, 8);
  ASSERT_EQ(got.size(), want.size() - N);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], want[N + i])) << "position " << N + i;

  // Between: a share selected at the check layer, every position written.
  VariantModel::Cache some = m.NewCache(std::nanf(""));
  kdn_blend_report rh = KDN_BLEND_REPORT_INIT;
  blend(0.5f, some, &rh);
  EXPECT_EQ(rh.selected, (a.size() + b.size()) / 2);
  // Layer 0 for every position, layer 1 for the selected and the question's.
  EXPECT_DOUBLE_EQ(rh.recompute_fraction, (N + rh.selected + (question.size() - 1)) / (2.0 * N));
  for (int l = 0; l < m.attention_layers(); ++l) {
    for (size_t i = 0; i < N * w; ++i) ASSERT_FALSE(std::isnan(some.k[static_cast<size_t>(l)][i])) << l << " " << i;
  }
}

// The one rule for hits, group by group, after a restart: each namespace
// holds the same prompt, stored at every chunk boundary; one piece of one
// group is then taken away (as an eviction would) and the prefix the
// lookup, the retrieve and the load report is the longest that every group
// still serves; nothing past it is written.
TEST(VariantGroups, AMissingGroupShortensThePrefixAndNothingPastItIsWritten) {
  const VariantModel m(Variant("hybrid"));  // sliding (W 12), recurrent, full, sliding
  const std::string dir = TempDir();
  const auto prompt = Tokens(70, 3, m.config().vocab);
  const std::vector<std::string> spaces = {"whole", "state64", "full16", "slide48", "slide16"};
  {
    Kdn kdn(m, dir, /*host=*/true);
    for (const std::string& ns : spaces) {
      VariantModel::Cache cache = m.NewCache();
      PrefillStoring(m, kdn, ns, prompt, cache, /*async=*/false);
    }
    // Stored without its state: the KV alone is no hit for a recurrent model.
    VariantModel::Cache cache = m.NewCache();
    for (size_t p = 0; p < prompt.size(); ++p) m.Step(cache, prompt[p], static_cast<int>(p));
    EXPECT_EQ(kdn.Store("nostate", prompt, prompt.size(), cache, /*with_state=*/false), 0u);
  }
  {
    // Take pieces away, runtime closed. The chain ends at 16, 32, 48, 64,
    // 68, 70 (chunks of 16, then pieces of 4 and 2).
    Kdn kdn(m, dir, /*host=*/false);
    const store::GroupedModel g = kdn.Grouped();
    ASSERT_EQ(g.groups.size(), 2u);  // full (layer 2 among the attention layers), sliding 12 (layers 0 and 2)
    ASSERT_EQ(g.groups[0].window, 0u);
    ASSERT_EQ(g.groups[1].window, 12u);
    auto key_at = [&](const std::string& ns, std::uint64_t end) {
      for (const auto& [e, k] : kdn.Chain(ns, prompt, prompt.size())) {
        if (e == end) return k;
      }
      ADD_FAILURE() << "no chunk ends at " << end;
      return keys::Digest{};
    };
    RemoveObject(dir, store::StateSnapshotKey(g, key_at("state64", 70)));     // the prompt's end: 64 has one
    RemoveObject(dir, store::GroupChunkKey(g.groups[0], key_at("full16", 32)));  // the full layers' [16, 32)
    // A sliding layer's chunk the window starts inside is stored by each
    // store as a partial chunk keyed by that store's end (W 12 < 16: every
    // chunk of the sliding group is one): [48, 64) by the stores at 64 and 70.
    RemoveObject(dir, store::GroupPartialKey(g.groups[1], key_at("slide48", 64), 64));  // the window's [48, 64)
    RemoveObject(dir, store::GroupPartialKey(g.groups[1], key_at("slide48", 64), 70));
    RemoveObject(dir, store::GroupPartialKey(g.groups[1], key_at("slide16", 32), 32));  // [16, 32): out of 70's window
  }
  Kdn kdn(m, dir, /*host=*/false);
  // Each request: the prompt and a question after it.
  auto full = prompt;
  for (std::int32_t t : Tokens(6, 6, m.config().vocab)) full.push_back(t);
  struct Case {
    std::string ns;
    std::uint64_t prefix;
  };
  // 70 needs: full [0, 70), the window [58, 70) (chunks from 48), the state at 70.
  const std::vector<Case> cases = {{"whole", 70}, {"state64", 64}, {"full16", 16}, {"slide48", 48},
                                   {"slide16", 70}, {"nostate", 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.ns);
    EXPECT_EQ(kdn.Lookup(c.ns, full), c.prefix);
    VariantModel::Cache cache = m.NewCache(std::nanf(""));
    const kdn_kv_result r = kdn.Retrieve(c.ns, full, cache);
    EXPECT_EQ(r.tokens, c.prefix);
    VariantModel::Cache loaded = m.NewCache(std::nanf(""));
    EXPECT_EQ(kdn.Load(c.ns, full, loaded).tokens, c.prefix);
    // Nothing past the prefix is written, in any layer.
    for (size_t l = 0; l < cache.k.size(); ++l) {
      for (size_t p = c.prefix; p < full.size(); ++p) {
        ASSERT_TRUE(std::isnan(cache.k[l][p * static_cast<size_t>(m.kv_width())])) << "layer " << l << " position " << p;
        ASSERT_TRUE(std::isnan(loaded.k[l][p * static_cast<size_t>(m.kv_width())])) << "layer " << l << " position " << p;
      }
    }
    // The state given back is the one at the prefix, bit for bit, and the
    // continuation from there is the reference's.
    VariantModel::Cache ref = m.NewCache();
    for (size_t p = 0; p < c.prefix; ++p) m.Step(ref, prompt[p], static_cast<int>(p));
    if (c.prefix > 0) {
      for (size_t s = 0; s < ref.state.size(); ++s) EXPECT_TRUE(SameBits(cache.state[s], ref.state[s])) << "state " << s;
    } else {
      for (const auto& s : cache.state) EXPECT_TRUE(SameBits(s, std::vector<float>(s.size(), 0.0f)));
    }
    const auto want = Continue(m, ref, full, c.prefix, 4);
    const auto got = Continue(m, cache, full, c.prefix, 4);
    ASSERT_EQ(got.size(), full.size() - c.prefix + 4);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(SameBits(got[i], want[i])) << "position " << c.prefix + i;
  }
  // A request that shares 60 of the prompt's tokens: the longest boundary
  // with a snapshot within it is 48.
  auto other = std::vector<std::int32_t>(prompt.begin(), prompt.begin() + 60);
  for (std::int32_t t : Tokens(15, 4, m.config().vocab)) other.push_back(t);
  EXPECT_EQ(kdn.Lookup("whole", other), 48u);
}

// Bad input: every misuse of the new fields is refused with its reason.
TEST(VariantGroups, BadSpecsAndViewsAreRefused) {
  const VariantModel hybrid(Variant("hybrid"));
  const VariantModel mla(Variant("mla"));
  const std::string dir = TempDir();
  Kdn kdn(hybrid, dir, /*host=*/true);
  kdn_model* bad = nullptr;
  kdn_model_spec s = kdn.Spec();
  s.state_bytes = 6;
  EXPECT_EQ(kdn_model_create(kdn.runtime(), &s, &bad), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("multiple of 4"), std::string::npos) << kdn_last_error_message();
  s = kdn.Spec();
  s.num_state_layers = 0;
  EXPECT_EQ(kdn_model_create(kdn.runtime(), &s, &bad), KDN_ERR_INVALID_ARGUMENT);  // state_bytes without layers
  s = kdn.Spec();
  s.reserved2 = 1;
  EXPECT_EQ(kdn_model_create(kdn.runtime(), &s, &bad), KDN_ERR_VERSION);
  EXPECT_EQ(bad, nullptr);
  // The groups are part of the identity: the same model without its
  // windows, or without its recurrent layers, sees nothing of it.
  const auto prompt = Tokens(40, 5, hybrid.config().vocab);
  VariantModel::Cache cache = hybrid.NewCache();
  PrefillStoring(hybrid, kdn, "t", prompt, cache, false);
  EXPECT_EQ(kdn.Lookup("t", prompt), 40u);
  std::uint8_t with[32], without[32];
  ASSERT_EQ(kdn_model_get_fingerprint(kdn.model(), with), KDN_OK);
  s = kdn.Spec();
  s.layer_windows = nullptr;
  kdn_model* plain = nullptr;
  ASSERT_EQ(kdn_model_create(kdn.runtime(), &s, &plain), KDN_OK) << kdn_last_error_message();
  ASSERT_EQ(kdn_model_get_fingerprint(plain, without), KDN_OK);
  EXPECT_NE(std::memcmp(with, without, 32), 0);
  kdn_model_destroy(plain);
  // A retrieve of a recurrent model needs the state's memory.
  kdn_request r = Kdn::Request(prompt, prompt.size());
  kdn_kv_view view = kdn.View(cache);
  view.state_layers = nullptr;
  kdn_kv_result out = KDN_KV_RESULT_INIT;
  EXPECT_EQ(kdn_kv_retrieve(kdn.model(), "t", 1, &r, &view, 1, &out), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("state"), std::string::npos) << kdn_last_error_message();
  kdn_op* op = nullptr;
  EXPECT_EQ(kdn_kv_load_async(kdn.model(), "t", 1, &r, &view, 1, &op), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(op, nullptr);
  // A state pointer left NULL.
  view = kdn.View(cache);
  void* holes[1] = {nullptr};
  view.state_layers = holes;
  EXPECT_EQ(kdn_kv_store(kdn.model(), "t", 1, &r, &view, 1, nullptr), KDN_ERR_INVALID_ARGUMENT);
  // Blending and knowledge items are not built for grouped models.
  kdn_blend_options bo = KDN_BLEND_OPTIONS_INIT;
  kdn_blend_segment seg = KDN_BLEND_SEGMENT_INIT;
  seg.tokens = prompt.data();
  seg.num_tokens = 2;
  view = kdn.View(cache);
  EXPECT_EQ(kdn_kv_blend(kdn.model(), "t", 1, &seg, 1, &bo, &view, 1, nullptr), KDN_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(kdn_last_error_message()).find("recurrent"), std::string::npos) << kdn_last_error_message();
  view = kdn.View(cache);
  EXPECT_EQ(kdn_knowledge_put(kdn.model(), "t", 1, "doc", 3, 1, nullptr, 0, prompt.data(), prompt.size(), &view, 1),
            KDN_ERR_UNSUPPORTED);
  // state_layers on a model without recurrent layers.
  Kdn latent(mla, TempDir(), /*host=*/true);
  VariantModel::Cache lc = mla.NewCache();
  kdn_kv_view lv = latent.View(lc);
  lv.state_layers = holes;
  kdn_request lr = Kdn::Request(prompt, prompt.size());
  EXPECT_EQ(kdn_kv_store(latent.model(), "t", 1, &lr, &lv, 1, nullptr), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("no"), std::string::npos) << kdn_last_error_message();
}

}  // namespace
}  // namespace kdn::refengine
