// SPDX-License-Identifier: Apache-2.0
// The engine API of the store: asynchronous layer-by-layer loads and saves
// over contiguous and paged views, KV groups, engine block hashes, per-tier
// lookups and failed ranges; and an asynchronous layer-by-layer load into the
// reference transformer that gives the same generation as a full prefill.
#include "core/engine/engine_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "lab/model/tokenizer.h"
#include "lab/model/transformer.h"
#include "test_models.h"

namespace kdn::store {
namespace {

// A small made-up shape for the layout tests: 3 layers, 2 KV heads of 4, f32.
constexpr int kL = 3, kH = 2, kD = 4, kTok = 37;

ModelKv SmallModel() {
  ModelKv m;
  m.fingerprint = keys::ModelFingerprint({kL, kH, kD, 0, 10000.0f, 0, kD, "small"});
  m.shape = {kL, kH, kD, 4};
  return m;
}

StoreOptions Options(std::uint32_t chunk, std::vector<TierSpec> tiers = {}) {
  StoreOptions o;
  o.chunk_tokens = chunk;
  o.tiers = std::move(tiers);
  return o;
}

// vLLM-like paged KV: per layer, K and V apart, [num_blocks][block][heads][dim].
struct PagedKv {
  PagedKv(int blocks, int block_size, std::vector<std::int32_t> table)
      : block_size(block_size), table(std::move(table)) {
    for (int l = 0; l < kL; ++l) {
      k.emplace_back(static_cast<size_t>(blocks) * block_size * kH * kD, 0.0f);
      v.emplace_back(static_cast<size_t>(blocks) * block_size * kH * kD, 0.0f);
      kp.push_back(k.back().data());
      vp.push_back(v.back().data());
    }
    num_blocks = blocks;
  }
  KvGroup Group() {
    KvGroup g;
    g.layers.resize(kL);
    std::iota(g.layers.begin(), g.layers.end(), 0u);
    g.view.shape = {kL, kH, kD, 4};
    g.view.k_base = kp.data();
    g.view.v_base = vp.data();
    g.view.paged = true;
    g.view.block_size = block_size;
    g.view.block_table = table.data();
    g.view.table_len = static_cast<std::int64_t>(table.size());
    g.view.num_blocks = num_blocks;
    return g;
  }
  // Element (layer, kv, token, head, dim) through the block table.
  float& at(int l, int kv, int t, int h, int d) {
    auto& a = kv ? v[static_cast<size_t>(l)] : k[static_cast<size_t>(l)];
    const int b = table[static_cast<size_t>(t / block_size)];
    return a[((static_cast<size_t>(b) * block_size + t % block_size) * kH + h) * kD + d];
  }
  int block_size, num_blocks;
  std::vector<std::int32_t> table;
  std::vector<std::vector<float>> k, v;
  std::vector<void*> kp, vp;
};

OwnedKeys Tokens(int n, int salt = 0) {
  OwnedKeys k;
  for (int i = 0; i < n; ++i) k.tokens.push_back(3 + (i * 7 + salt) % 400);
  return k;
}

void Fill(PagedKv& p, int tokens, float seed) {
  for (int l = 0; l < kL; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int t = 0; t < tokens; ++t)
        for (int h = 0; h < kH; ++h)
          for (int d = 0; d < kD; ++d) p.at(l, kv, t, h, d) = seed + l * 1000 + kv * 500 + t * 10 + h * 4 + d;
}

std::shared_ptr<SaveOp> SaveAllLayers(KvStore& s, Executor& ex, const ModelKv& m, const std::string& ns,
                                      OwnedKeys keys, std::vector<KvGroup> groups) {
  auto op = SaveOp::Start(s, ex, m, ns, std::move(keys), std::move(groups));
  EXPECT_TRUE(op.ok()) << op.status().message();
  for (std::uint32_t l = 0; l < kL; ++l) EXPECT_TRUE((*op)->SaveLayer(l).ok());
  EXPECT_TRUE((*op)->Wait(10000).ok());
  return *op;
}

TEST(EngineOps, PagedSaveThenLoadIntoAnotherBlockTable) {
  auto store = KvStore::Create(Options(16)).value();
  Executor ex(2);
  const ModelKv m = SmallModel();
  PagedKv src(8, 8, {5, 2, 7, 0, 3});  // 37 tokens in 5 shuffled blocks of 8
  Fill(src, kTok, 0.5f);
  auto save = SaveAllLayers(*store, ex, m, "t", Tokens(kTok), {src.Group()});
  EXPECT_EQ(save->Outcome().tokens, static_cast<std::uint64_t>(kTok));

  PagedKv dst(6, 8, {1, 4, 0, 5, 2});
  auto load = LoadOp::Start(*store, ex, m, "t", Tokens(kTok), {dst.Group()});
  ASSERT_TRUE(load.ok()) << load.status().message();
  for (std::uint32_t l = 0; l < kL; ++l) ASSERT_TRUE((*load)->WaitLayer(l, 10000).ok());
  ASSERT_TRUE((*load)->Wait(10000).ok());
  const OpResult r = (*load)->Outcome();
  EXPECT_EQ(r.state, OpState::kDone);
  EXPECT_EQ(r.covered, static_cast<std::uint64_t>(kTok));  // two chunks of 16 and a partial of 5
  EXPECT_EQ(r.tokens, static_cast<std::uint64_t>(kTok));
  EXPECT_TRUE(r.failed.empty());
  for (int l = 0; l < kL; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int t = 0; t < kTok; ++t)
        for (int h = 0; h < kH; ++h)
          for (int d = 0; d < kD; ++d) ASSERT_EQ(dst.at(l, kv, t, h, d), src.at(l, kv, t, h, d));
  EXPECT_EQ(store->Stats().tokens_served, static_cast<std::uint64_t>(kTok));
}

TEST(EngineOps, TwoGroupsSplitTheLayers) {
  auto store = KvStore::Create(Options(16)).value();
  Executor ex(2);
  const ModelKv m = SmallModel();
  PagedKv a(8, 8, {0, 1, 2, 3, 4}), b(8, 8, {4, 3, 2, 1, 0});
  Fill(a, kTok, 1.0f);
  Fill(b, kTok, 2.0f);
  // Layers 0 and 2 from view a, layer 1 from view b (say, full vs sliding-window attention).
  KvGroup ga = a.Group(), gb = b.Group();
  ga.layers = {0, 2};
  ga.view.k_base = a.kp.data();  // view layer j = model layer layers[j]
  std::vector<void*> ak = {a.kp[0], a.kp[2]}, av = {a.vp[0], a.vp[2]};
  ga.view.k_base = ak.data();
  ga.view.v_base = av.data();
  gb.layers = {1};
  std::vector<void*> bk = {b.kp[1]}, bv = {b.vp[1]};
  gb.view.k_base = bk.data();
  gb.view.v_base = bv.data();
  SaveAllLayers(*store, ex, m, "t", Tokens(kTok), {ga, gb});

  PagedKv out(8, 8, {7, 6, 5, 4, 3});
  auto load = LoadOp::Start(*store, ex, m, "t", Tokens(kTok), {out.Group()});
  ASSERT_TRUE(load.ok());
  ASSERT_TRUE((*load)->Wait(10000).ok());
  for (int t = 0; t < kTok; ++t) {
    EXPECT_EQ(out.at(0, 0, t, 1, 3), a.at(0, 0, t, 1, 3));
    EXPECT_EQ(out.at(1, 1, t, 0, 2), b.at(1, 1, t, 0, 2));
    EXPECT_EQ(out.at(2, 1, t, 1, 1), a.at(2, 1, t, 1, 1));
  }
  // Groups must cover every layer exactly once.
  KvGroup partial = a.Group();
  partial.layers = {0, 1};
  partial.view.shape.layers = 2;
  EXPECT_EQ(LoadOp::Start(*store, ex, m, "t", Tokens(kTok), {partial}).status().code(), Code::kInvalidArgument);
}

TEST(EngineOps, EngineBlockHashesKeyTheChunks) {
  auto store = KvStore::Create(Options(16)).value();
  Executor ex(2);
  const ModelKv m = SmallModel();
  PagedKv src(8, 8, {0, 1, 2, 3, 4});
  Fill(src, 40, 3.0f);
  // 5 engine blocks of 8 tokens, 32-byte hashes (a chunk = 2 blocks).
  OwnedKeys keys;
  keys.hash_bytes = 32;
  keys.block_tokens = 8;
  for (int b = 0; b < 5; ++b) {
    for (int i = 0; i < 32; ++i) keys.hashes.push_back(static_cast<std::uint8_t>(b * 31 + i));
  }
  auto save = SaveAllLayers(*store, ex, m, "t", keys, {src.Group()});
  EXPECT_EQ(save->Outcome().tokens, 40u);
  EXPECT_EQ(store->Lookup(m, "t", keys.keys()).tokens, 40u);
  OwnedKeys changed = keys;
  changed.hashes[3 * 32] ^= 1;  // block 3 differs: the chunk of blocks 2-3 and after miss
  EXPECT_EQ(store->Lookup(m, "t", changed.keys()).tokens, 16u);
  // A chunk must be whole engine blocks.
  OwnedKeys odd = keys;
  odd.block_tokens = 5;
  EXPECT_EQ(store->CheckKeys(odd.keys()).code(), Code::kInvalidArgument);
}

std::filesystem::path TempDir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / (std::string(name) + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(EngineOps, ACorruptChunkIsReportedAsFailedAndTheRestLoads) {
  const auto dir = TempDir("kdn_engine_corrupt");
  TierSpec disk;
  disk.kind = TierSpec::Kind::kDisk;
  disk.path = dir.string();
  disk.capacity_bytes = 1 << 20;
  disk.codec = "raw";  // the loaded KV is compared bit for bit
  auto store = KvStore::Create(Options(8, {disk})).value();
  Executor ex(2);
  const ModelKv m = SmallModel();
  PagedKv src(8, 8, {0, 1, 2, 3, 4});
  Fill(src, 32, 4.0f);
  SaveAllLayers(*store, ex, m, "t", Tokens(32), {src.Group()});
  keys::Digest lost;
  {
    Fetch f = store->FetchPrefix(m, "t", Tokens(32).keys());
    ASSERT_EQ(f.chunks.size(), 4u);
    lost = f.chunks[1].lease.chunk()->meta.key;
  }
  // Flip a byte near the end of chunk 1's file (its payload).
  const std::string hex = keys::ToHex(lost);
  bool flipped = false;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().filename().string().find(hex) != std::string::npos) {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(-100, std::ios::end);
      char c;
      f.get(c);
      f.seekp(-100, std::ios::end);
      f.put(static_cast<char>(c ^ 0x5A));
      flipped = true;
    }
  }
  ASSERT_TRUE(flipped);
  PagedKv dst(8, 8, {4, 3, 2, 1, 0});
  auto load = LoadOp::Start(*store, ex, m, "t", Tokens(32), {dst.Group()});
  ASSERT_TRUE(load.ok());
  ASSERT_TRUE((*load)->Wait(10000).ok());
  const OpResult r = (*load)->Outcome();
  EXPECT_EQ(r.covered, 32u);
  EXPECT_EQ(r.tokens, 24u);  // chunks 0, 2 and 3
  ASSERT_EQ(r.failed.size(), 1u);
  EXPECT_EQ(r.failed[0].begin, 8u);  // recompute only tokens [8, 16)
  EXPECT_EQ(r.failed[0].end, 16u);
  for (int t : {0, 7, 16, 31}) EXPECT_EQ(dst.at(2, 1, t, 1, 2), src.at(2, 1, t, 1, 2)) << t;
  EXPECT_EQ(dst.at(2, 1, 8, 1, 2), 0.0f);  // never garbage: the failed chunk was not written
  EXPECT_EQ(store->chain().Stats()[0].corrupt_detected, 1u);
  store.reset();
  std::filesystem::remove_all(dir);
}

TEST(EngineOps, CancelStopsALoadAndWaitsTimeOut) {
  auto store = KvStore::Create(Options(16)).value();
  const ModelKv m = SmallModel();
  PagedKv dst(8, 8, {0, 1, 2, 3, 4});
  std::shared_ptr<LoadOp> op;
  {
    Executor blocked(1);
    std::mutex gate;
    std::unique_lock<std::mutex> hold(gate);
    blocked.Submit([&] { std::lock_guard<std::mutex> wait(gate); });  // keeps the worker busy
    op = LoadOp::Start(*store, blocked, m, "t", Tokens(kTok), {dst.Group()}).value();
    EXPECT_EQ(op->Poll(), OpState::kPending);
    EXPECT_EQ(op->Wait(10).code(), Code::kTimeout);
    EXPECT_EQ(op->WaitLayer(0, 10).code(), Code::kTimeout);
    op->Cancel();
    hold.unlock();
  }  // the executor ran the load: it saw the cancel
  EXPECT_EQ(op->Poll(), OpState::kCancelled);
  EXPECT_NE(op->WaitLayer(0, 0).code(), Code::kOk);
}

// The tail of a request is probed in pieces of decreasing powers of two: a
// larger piece that no tier holds is no gap (the walk tries a smaller one at
// the same position), so a tier that holds the smaller ones holds the whole
// prefix. It used to end the tier's run at the first missed probe: 16 of 21.
TEST(EngineOps, ATiersPrefixGoesOnPastPiecesNoTierHolds) {
  auto store = KvStore::Create(Options(16, {TierSpec{}})).value();
  Executor ex(2);
  const ModelKv m = SmallModel();
  PagedKv src(16, 8, {0, 1, 2, 3, 4, 5, 6, 7});
  Fill(src, 21, 2.0f);
  SaveAllLayers(*store, ex, m, "t", Tokens(21), {src.Group()});  // a chunk of 16, pieces of 4 and 1
  store->chain().Flush();
  // 27 tokens: the chunk, then pieces of 8 (missed), 4, 2 (missed), 1, 1 (missed).
  const LookupResult r = store->Lookup(m, "t", Tokens(27).keys());
  EXPECT_EQ(r.tokens, 21u);
  ASSERT_EQ(r.tier_tokens.size(), 1u);
  EXPECT_EQ(r.tier_tokens[0], 21u);
}

TEST(EngineOps, LookupReportsEachTiersPrefix) {
  const auto dir = TempDir("kdn_engine_tiers");
  TierSpec host, disk;
  // A 16-token chunk of this shape is 3 KiB, one 4 KiB block: the host holds 4.
  host.capacity_bytes = 4 * 4096;
  host.high_watermark = host.low_watermark = 1.0;
  disk.kind = TierSpec::Kind::kDisk;
  disk.path = dir.string();
  disk.capacity_bytes = 1 << 20;
  disk.codec = "raw";  // the loaded KV is compared bit for bit
  auto store = KvStore::Create(Options(16, {host, disk})).value();
  Executor ex(2);
  const ModelKv m = SmallModel();
  PagedKv src(16, 8, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  Fill(src, 80, 5.0f);
  // 5 chunks: the fifth pushes the first out of the host, down to the disk.
  SaveAllLayers(*store, ex, m, "t", Tokens(80), {src.Group()});
  store->chain().Flush();
  const LookupResult r = store->Lookup(m, "t", Tokens(80).keys());
  EXPECT_EQ(r.tokens, 80u);
  ASSERT_EQ(r.tier_tokens.size(), 2u);
  EXPECT_EQ(r.tier_tokens[0], 0u);   // the host lacks chunk 0
  EXPECT_EQ(r.tier_tokens[1], 16u);  // the disk holds chunk 0 only
  // A load reads across both tiers.
  PagedKv dst(16, 8, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  auto load = LoadOp::Start(*store, ex, m, "t", Tokens(80), {dst.Group()}).value();
  ASSERT_TRUE(load->Wait(10000).ok());
  EXPECT_EQ(load->Outcome().tokens, 80u);
  for (int t = 0; t < 80; ++t) ASSERT_EQ(dst.at(1, 0, t, 1, 3), src.at(1, 0, t, 1, 3)) << t;
  store.reset();
  std::filesystem::remove_all(dir);
}

// The reference transformer's cache as a contiguous per-layer view.
KvGroup CacheGroup(model::KvCache& cache, int heads, int head_dim, std::vector<void*>& k, std::vector<void*>& v) {
  KvGroup g;
  for (int l = 0; l < cache.layers(); ++l) {
    g.layers.push_back(static_cast<std::uint32_t>(l));
    k.push_back(cache.k(l, 0));
    v.push_back(cache.v(l, 0));
  }
  g.view.shape = {cache.layers(), heads, head_dim, 4};
  g.view.k_base = k.data();
  g.view.v_base = v.data();
  g.view.stride_token = cache.kv_dim();
  g.view.stride_head = head_dim;
  g.view.stride_dim = 1;
  g.view.layer_elements = static_cast<std::int64_t>(cache.max_seq()) * cache.kv_dim();
  return g;
}

TEST(EngineOps, LayerByLayerLoadIntoTheReferenceModelGivesTheSameGeneration) {
  KDN_REQUIRE_MODEL();
  auto weights = model::Checkpoint::Load(testing::ModelPath()).value();
  auto tok = model::Tokenizer::Load(testing::TokenizerPath(), 512).value();
  model::Transformer t(weights);
  const auto& c = t.config();
  const std::vector<int> doc = tok.Encode(
      "Once upon a time, there was a little boy named Tom. Tom had a red kite. He loved to fly his kite in the park "
      "near his house. One windy day, Tom ran to the park with his mom.",
      true);
  std::vector<int> prompt = doc;
  for (int id : tok.Encode(" The kite", false)) prompt.push_back(id);
  prompt.erase(prompt.begin() + static_cast<std::ptrdiff_t>(doc.size()));  // the dummy-prefix space

  ModelKv m;
  m.fingerprint = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "stories260K"});
  m.shape = {c.n_layers, c.n_kv_heads, c.head_dim(), 4};
  auto store = KvStore::Create(Options(16)).value();
  Executor ex(2);

  // The engine prefills the document and saves its KV layer by layer.
  model::KvCache doc_cache = t.NewCache();
  ASSERT_TRUE(t.Forward(doc, 0, doc_cache, nullptr).ok());
  std::vector<void*> dk, dv;
  OwnedKeys doc_keys;
  doc_keys.tokens.assign(doc.begin(), doc.end());
  auto save = SaveOp::Start(*store, ex, m, "t", doc_keys, {CacheGroup(doc_cache, c.n_kv_heads, c.head_dim(), dk, dv)});
  ASSERT_TRUE(save.ok()) << save.status().message();
  for (int l = 0; l < c.n_layers; ++l) ASSERT_TRUE((*save)->SaveLayer(static_cast<std::uint32_t>(l)).ok());
  ASSERT_TRUE((*save)->Wait(10000).ok());

  // Cold: the whole prompt, then greedy decoding.
  auto generate = [&](model::KvCache& cache, int start) {
    std::vector<float> logits;
    std::vector<int> out;
    EXPECT_TRUE(t.Forward(std::span<const int>(prompt).subspan(static_cast<size_t>(start)), start, cache, &logits).ok());
    int pos = static_cast<int>(prompt.size());
    for (int s = 0; s < 24; ++s, ++pos) {
      const int next = model::Argmax(logits);
      out.push_back(next);
      const int in[1] = {next};
      EXPECT_TRUE(t.Forward(in, pos, cache, &logits).ok());
    }
    return out;
  };
  model::KvCache cold = t.NewCache();
  const std::vector<int> want = generate(cold, 0);

  // Warm: load the document's KV layer by layer, waiting on each layer as a
  // forward pass would, then prefill only the new tokens.
  model::KvCache warm = t.NewCache();
  std::vector<void*> wk, wv;
  OwnedKeys prompt_keys;
  prompt_keys.tokens.assign(prompt.begin(), prompt.end());
  auto load = LoadOp::Start(*store, ex, m, "t", prompt_keys, {CacheGroup(warm, c.n_kv_heads, c.head_dim(), wk, wv)});
  ASSERT_TRUE(load.ok()) << load.status().message();
  for (int l = 0; l < c.n_layers; ++l) ASSERT_TRUE((*load)->WaitLayer(static_cast<std::uint32_t>(l), 10000).ok());
  ASSERT_TRUE((*load)->Wait(10000).ok());
  const OpResult r = (*load)->Outcome();
  EXPECT_EQ(r.tokens, doc.size());
  EXPECT_EQ(generate(warm, static_cast<int>(r.tokens)), want);
}

}  // namespace
}  // namespace kdn::store
