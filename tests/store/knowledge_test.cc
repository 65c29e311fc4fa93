// SPDX-License-Identifier: Apache-2.0
// Knowledge items: put, list, fetch, versions, pins, expiry, deletion from
// every tier, tenant isolation, chunks shared between documents (only where
// their bytes are the same), pins counted per document, TTLs that saturate,
// and the index's own bound and cost (no call walks every document).
#include "core/knowledge/knowledge.h"
#include "core/wire/seal.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <unistd.h>

#include "lab/model/tokenizer.h"
#include "lab/model/transformer.h"
#include "test_models.h"

namespace kdn::store {
namespace {

constexpr int kL = 2, kH = 2, kD = 4;

ModelKv Model() {
  ModelKv m;
  m.fingerprint = keys::ModelFingerprint({kL, kH, kD, 0, 10000.0f, 0, kD, "knowledge-test"});
  m.shape = {kL, kH, kD, 4};
  return m;
}

// A contiguous per-layer KV buffer: [layer][k|v] arrays of [token][head][dim].
struct Kv {
  explicit Kv(int tokens, float seed = 0) : tokens(tokens) {
    for (int i = 0; i < 2 * kL; ++i) {
      data.emplace_back(static_cast<size_t>(tokens) * kH * kD);
      for (size_t e = 0; e < data.back().size(); ++e) data.back()[e] = seed + static_cast<float>(i * 100000 + e);
    }
    for (int l = 0; l < kL; ++l) {
      k.push_back(data[static_cast<size_t>(2 * l)].data());
      v.push_back(data[static_cast<size_t>(2 * l + 1)].data());
    }
    view.shape = {kL, kH, kD, 4};
    view.k_base = k.data();
    view.v_base = v.data();
    view.stride_token = kH * kD;
    view.stride_head = kD;
    view.stride_dim = 1;
  }
  int tokens;
  std::vector<std::vector<float>> data;
  std::vector<void*> k, v;
  kernels::KvView view;
};

std::vector<std::int32_t> Tokens(int n, int salt) {
  std::vector<std::int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(3 + (i * 11 + salt) % 300);
  return t;
}

// "doc-a" as the tests put it: version 3, "title=A", 20 tokens in chunks of 8 + 8 + 4, all held.
void ExpectDocA(const DocumentInfo& d) {
  EXPECT_EQ(d.doc_id, "doc-a");
  EXPECT_EQ(d.version, 3u);
  EXPECT_EQ(d.metadata, "title=A");
  EXPECT_EQ(d.tokens, 20u);
  EXPECT_EQ(d.chunks, 3u);
  EXPECT_EQ(d.chunks_present, 3u);
}

class KnowledgeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kdn_knowledge_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    StoreOptions o;
    o.chunk_tokens = 8;
    o.clock = &clock_;
    TierSpec host, disk;
    host.capacity_bytes = 8 * 4096;  // 8 chunks (8 tokens x 128 B = 1 KiB, one page each)
    host.high_watermark = host.low_watermark = 1.0;
    host.write_through = true;       // every chunk also lands on disk
    disk.kind = TierSpec::Kind::kDisk;
    disk.path = dir_.string();
    disk.capacity_bytes = 1 << 20;
    o.tiers = {host, disk};
    options_ = o;
    store_ = KvStore::Create(o).value();
    index_ = std::make_unique<KnowledgeIndex>(*store_);
  }
  std::string IndexPath() const { return (dir_ / "knowledge.kdnidx").string(); }
  // A restart: the index (saving what changed) and the store go, a new
  // store opens the same disk directory and a new index loads the file.
  Status Restart(std::chrono::milliseconds delay = std::chrono::milliseconds(200),
                 std::shared_ptr<const wire::ChunkSealer> sealer = nullptr) {
    index_.reset();
    store_.reset();
    store_ = KvStore::Create(options_).value();
    index_ = std::make_unique<KnowledgeIndex>(*store_);
    return index_->Persist(IndexPath(), delay, std::move(sealer));
  }
  void TearDown() override {
    index_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  size_t FilesOnDisk() {
    size_t n = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir_)) n += e.is_regular_file() && e.path().extension() == ".kdn";
    return n;
  }

  ManualClock clock_;
  StoreOptions options_;
  std::filesystem::path dir_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KnowledgeIndex> index_;
  const ModelKv m_ = Model();
};

TEST_F(KnowledgeTest, PutListFetch) {
  Kv kv(20);
  const auto tokens = Tokens(20, 1);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc-a", 3, "title=A", tokens, kv.view).ok());
  const auto docs = index_->List(m_, "ns");
  ASSERT_EQ(docs.size(), 1u);
  ExpectDocA(docs[0]);
  Kv out(20, -1e9f);
  auto got = index_->Fetch(m_, "ns", "doc-a", &out.view);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, tokens);
  EXPECT_EQ(out.data, kv.data);
  EXPECT_EQ(index_->Fetch(m_, "ns", "nope", nullptr).status().code(), Code::kNotFound);
}

TEST_F(KnowledgeTest, FetchesCountHitsPerDocumentVersion) {
  Kv kv(20);
  const auto tokens = Tokens(20, 1);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc-a", 1, "", tokens, kv.view).ok());
  ASSERT_TRUE(index_->Put(m_, "ns", "doc-b", 1, "", Tokens(8, 9), kv.view).ok());
  EXPECT_EQ(index_->Info(m_, "ns", "doc-a")->hits, 0u);
  Kv out(20);
  ASSERT_TRUE(index_->Fetch(m_, "ns", "doc-a", &out.view).ok());
  ASSERT_TRUE(index_->Fetch(m_, "ns", "doc-a", &out.view).ok());
  EXPECT_EQ(index_->Info(m_, "ns", "doc-a")->hits, 6u);  // 2 fetches x 3 chunks
  EXPECT_EQ(index_->Info(m_, "ns", "doc-b")->hits, 0u);
  // Tokens only (no views): nothing served, nothing counted.
  ASSERT_TRUE(index_->Fetch(m_, "ns", "doc-a", nullptr).ok());
  EXPECT_EQ(index_->Info(m_, "ns", "doc-a")->hits, 6u);
  // A new version with other chunks starts from zero.
  auto v2 = tokens;
  v2[17] = 300;
  ASSERT_TRUE(index_->Put(m_, "ns", "doc-a", 2, "", v2, kv.view).ok());
  EXPECT_EQ(index_->Info(m_, "ns", "doc-a")->hits, 0u);
}

TEST_F(KnowledgeTest, TenantsDoNotSeeEachOthersDocuments) {
  Kv kv(8);
  ASSERT_TRUE(index_->Put(m_, "tenant-a", "doc", 1, "", Tokens(8, 2), kv.view).ok());
  EXPECT_TRUE(index_->List(m_, "tenant-b").empty());
  EXPECT_EQ(index_->Fetch(m_, "tenant-b", "doc", nullptr).status().code(), Code::kNotFound);
  EXPECT_EQ(index_->Delete(m_, "tenant-b", "doc").code(), Code::kNotFound);
  // The content keys differ by namespace too: the same tokens are not shared.
  EXPECT_NE(store_->ContentKey(m_, "tenant-a", Tokens(8, 2)), store_->ContentKey(m_, "tenant-b", Tokens(8, 2)));
}

TEST_F(KnowledgeTest, DeleteRemovesTheDocumentFromEveryTier) {
  Kv kv(24);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 1, "", Tokens(24, 3), kv.view).ok());
  store_->chain().Flush();
  EXPECT_EQ(FilesOnDisk(), 3u);
  const auto k0 = store_->ContentKey(m_, "ns", std::span<const std::int32_t>(Tokens(24, 3)).first(8));
  EXPECT_TRUE(store_->chain().ContainsAt(0, k0));
  EXPECT_TRUE(store_->chain().ContainsAt(1, k0));
  ASSERT_TRUE(index_->Delete(m_, "ns", "doc").ok());
  EXPECT_EQ(store_->chain().Locate(k0), -1);
  EXPECT_EQ(FilesOnDisk(), 0u);
  EXPECT_TRUE(index_->List(m_, "ns").empty());
  for (const auto& l : store_->chain().Stats()) EXPECT_EQ(l.objects, 0u) << l.name;
}

TEST_F(KnowledgeTest, ANewVersionReplacesTheOldAndSharedChunksSurvive) {
  Kv kv(16);
  auto v1 = Tokens(16, 4), v2 = v1;
  v2[12] = 299;  // the second chunk changes, the first stays
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 1, "", v1, kv.view).ok());
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 2, "", v2, kv.view).ok());
  const auto docs = index_->List(m_, "ns");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].version, 2u);
  const auto first = std::span<const std::int32_t>(v1).first(8);
  EXPECT_GE(store_->chain().Locate(store_->ContentKey(m_, "ns", first)), 0);  // shared by both versions
  EXPECT_EQ(store_->chain().Locate(store_->ContentKey(m_, "ns", std::span<const std::int32_t>(v1).subspan(8))), -1);
  // Another document sharing a chunk keeps it when the first is deleted.
  ASSERT_TRUE(index_->Put(m_, "ns", "other", 1, "", std::vector<std::int32_t>(first.begin(), first.end()), kv.view).ok());
  ASSERT_TRUE(index_->Delete(m_, "ns", "doc").ok());
  EXPECT_GE(store_->chain().Locate(store_->ContentKey(m_, "ns", first)), 0);
  Kv out(8);
  EXPECT_TRUE(index_->Fetch(m_, "ns", "other", &out.view).ok());
}

TEST_F(KnowledgeTest, PinnedDocumentsStayInTheHostTier) {
  Kv kv(16);
  ASSERT_TRUE(index_->Put(m_, "ns", "pinned", 1, "", Tokens(16, 5), kv.view).ok());
  ASSERT_TRUE(index_->Pin(m_, "ns", "pinned", true, 0).ok());
  const auto k0 = store_->ContentKey(m_, "ns", std::span<const std::int32_t>(Tokens(16, 5)).first(8));
  for (int d = 0; d < 12; ++d) {  // floods the 8-chunk host tier
    ASSERT_TRUE(index_->Put(m_, "ns", "flood" + std::to_string(d), 1, "", Tokens(8, 100 + d), kv.view).ok());
  }
  EXPECT_TRUE(store_->chain().ContainsAt(0, k0));
  EXPECT_TRUE(index_->Info(m_, "ns", "pinned")->pinned);
  ASSERT_TRUE(index_->Pin(m_, "ns", "pinned", false, 0).ok());
  for (int d = 0; d < 12; ++d) {
    ASSERT_TRUE(index_->Put(m_, "ns", "again" + std::to_string(d), 1, "", Tokens(8, 200 + d), kv.view).ok());
  }
  EXPECT_FALSE(store_->chain().ContainsAt(0, k0));  // evicted once unpinned...
  store_->chain().Flush();
  EXPECT_TRUE(store_->chain().ContainsAt(1, k0));   // ...and still on disk
}

TEST_F(KnowledgeTest, ExpiredDocumentsAreDeleted) {
  Kv kv(8);
  ASSERT_TRUE(index_->Put(m_, "ns", "short-lived", 1, "", Tokens(8, 6), kv.view).ok());
  ASSERT_TRUE(index_->Expire(m_, "ns", "short-lived", 1'000'000'000).ok());
  EXPECT_EQ(index_->List(m_, "ns").size(), 1u);
  clock_.Advance(std::chrono::seconds(2));
  EXPECT_TRUE(index_->List(m_, "ns").empty());
  EXPECT_EQ(store_->chain().Locate(store_->ContentKey(m_, "ns", Tokens(8, 6))), -1);
  EXPECT_EQ(index_->Expire(m_, "ns", "short-lived", 0).code(), Code::kNotFound);
}

// Pins are counted per document: unpinning (or deleting) one document leaves
// a chunk it shares with a still-pinned document pinned.
TEST_F(KnowledgeTest, UnpinningOneDocumentKeepsTheChunksAnotherStillPins) {
  Kv kv(16);
  auto a = Tokens(16, 7), b = a;
  for (size_t i = 8; i < 16; ++i) b[i] = 299 - static_cast<std::int32_t>(i);  // the first chunk is shared
  ASSERT_TRUE(index_->Put(m_, "ns", "a", 1, "", a, kv.view).ok());
  ASSERT_TRUE(index_->Put(m_, "ns", "b", 1, "", b, kv.view).ok());
  const auto shared = store_->ContentKey(m_, "ns", std::span<const std::int32_t>(a).first(8));
  ASSERT_TRUE(index_->Pin(m_, "ns", "a", true, 0).ok());
  ASSERT_TRUE(index_->Pin(m_, "ns", "b", true, 0).ok());
  ASSERT_TRUE(index_->Pin(m_, "ns", "a", false, 0).ok());
  const auto flood = [&](int salt) {
    for (int d = 0; d < 12; ++d) {  // floods the 8-chunk host tier
      ASSERT_TRUE(index_->Put(m_, "ns", "flood" + std::to_string(salt + d), 1, "", Tokens(8, salt + d), kv.view).ok());
    }
  };
  flood(100);
  EXPECT_TRUE(store_->chain().ContainsAt(0, shared)) << "b still pins the shared chunk";
  EXPECT_FALSE(index_->Info(m_, "ns", "a")->pinned);
  EXPECT_TRUE(index_->Info(m_, "ns", "b")->pinned);
  // Pinning twice counts once: one unpin releases it.
  ASSERT_TRUE(index_->Pin(m_, "ns", "a", true, 0).ok());
  ASSERT_TRUE(index_->Pin(m_, "ns", "a", true, 0).ok());
  ASSERT_TRUE(index_->Pin(m_, "ns", "a", false, 0).ok());
  // Deleting the last pinning document releases its pins: the chunk (still
  // a's) can be evicted from the host tier again.
  ASSERT_TRUE(index_->Delete(m_, "ns", "b").ok());
  flood(200);
  EXPECT_FALSE(store_->chain().ContainsAt(0, shared));
  store_->chain().Flush();
  EXPECT_TRUE(store_->chain().ContainsAt(1, shared));
  EXPECT_EQ(store_->chain().Counters().pins_active, 0u);
}

// TTLs near INT64_MAX saturate (the clock is not at 0): no overflow into the
// past, so expire does not delete the document now and pin pins.
TEST_F(KnowledgeTest, HugeTtlsSaturateInsteadOfOverflowing) {
  Kv kv(8);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  clock_.Advance(std::chrono::hours(1));
  ASSERT_TRUE(index_->Put(m_, "ns", "forever", 1, "", Tokens(8, 8), kv.view).ok());
  ASSERT_TRUE(index_->Expire(m_, "ns", "forever", kMax).ok());
  ASSERT_TRUE(index_->Expire(m_, "ns", "forever", kMax - 1).ok());
  EXPECT_EQ(index_->List(m_, "ns").size(), 1u);
  clock_.Advance(std::chrono::hours(24 * 365 * 100));
  EXPECT_EQ(index_->List(m_, "ns").size(), 1u) << "expired 100 years into a 292-year TTL";
  const auto k = store_->ContentKey(m_, "ns", Tokens(8, 8));
  for (std::int64_t ttl : {kMax, kMax - 1, kMax / 2 + 1}) {
    ASSERT_TRUE(index_->Pin(m_, "ns", "forever", false, 0).ok());
    ASSERT_TRUE(index_->Pin(m_, "ns", "forever", true, ttl).ok());
    for (int d = 0; d < 12; ++d) {
      ASSERT_TRUE(index_->Put(m_, "ns", "flood" + std::to_string(d), 1, "", Tokens(8, 300 + d + static_cast<int>(ttl % 7) * 20), kv.view).ok());
    }
    EXPECT_TRUE(store_->chain().ContainsAt(0, k)) << "ttl " << ttl;
    EXPECT_EQ(store_->chain().Counters().pins_active, 1u) << "ttl " << ttl;
  }
  EXPECT_EQ(index_->Expire(m_, "ns", "forever", -1).code(), Code::kInvalidArgument);
  EXPECT_EQ(index_->Pin(m_, "ns", "forever", true, -1).code(), Code::kInvalidArgument);
}

// The reference model's KV of `tokens`, prefilled from position 0, canonical
// ([layer][k|v][token][head][dim]).
struct RealKv {
  ModelKv m;
  std::vector<float> kv;
};
RealKv Prefill(model::Transformer& t, const std::vector<int>& tokens) {
  RealKv r;
  const auto& c = t.config();
  model::KvCache cache = t.NewCache();
  EXPECT_TRUE(t.Forward(tokens, 0, cache, nullptr).ok());
  r.m.fingerprint = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "stories260K"});
  r.m.shape = {c.n_layers, c.n_kv_heads, c.head_dim(), 4};
  const size_t T = tokens.size(), row = static_cast<size_t>(c.kv_dim());
  r.kv.resize(static_cast<size_t>(c.n_layers) * 2 * T * row);
  for (int l = 0; l < c.n_layers; ++l) {
    for (size_t i = 0; i < T; ++i) {
      std::memcpy(&r.kv[((static_cast<size_t>(l) * 2 + 0) * T + i) * row], cache.k(l, static_cast<int>(i)), row * 4);
      std::memcpy(&r.kv[((static_cast<size_t>(l) * 2 + 1) * T + i) * row], cache.v(l, static_cast<int>(i)), row * 4);
    }
  }
  return r;
}

// A host tier that holds every chunk of these tests, raw: fetches are bit exact.
struct RealStore {
  RealStore() {
    StoreOptions o;
    o.chunk_tokens = 8;
    o.host_capacity_bytes = 1 << 20;
    store = KvStore::Create(o).value();
    index = std::make_unique<KnowledgeIndex>(*store);
  }
  std::unique_ptr<KvStore> store;
  std::unique_ptr<KnowledgeIndex> index;
};

// Two documents whose tokens differ only in token 0, their KV from the
// reference model, and a RealStore to put them in.
struct TwoDocuments {
  // a is `text` encoded; b is a with token 0 replaced by a's token `b0`.
  // Call under ASSERT_NO_FATAL_FAILURE.
  void Make(const std::string& text, size_t b0) {
    auto weights = model::Checkpoint::Load(testing::ModelPath()).value();
    auto tok = model::Tokenizer::Load(testing::TokenizerPath(), 512).value();
    model::Transformer t(weights, 1);
    a = tok.Encode(text, true);
    ASSERT_GE(a.size(), 17u);
    b = a;
    b[0] = a[b0];
    ka = Prefill(t, a);
    kb = Prefill(t, b);
    T = a.size();
    ta.assign(a.begin(), a.end());
    tb.assign(b.begin(), b.end());
    in_a = ka.kv;
    in_b = kb.kv;
  }
  RealStore rs;
  std::vector<int> a, b;
  RealKv ka, kb;
  size_t T = 0;
  std::vector<std::int32_t> ta, tb;
  std::vector<float> in_a, in_b;  // what the views put read
};

ViewSpec CanonicalSpec(std::vector<float>& kv) {
  ViewSpec s;
  s.data = kv.data();
  s.size_bytes = kv.size() * 4;
  return s;
}

// Two documents whose tokens differ only in token 0: their later chunks have
// the same tokens (the same content key) but other KV, since attention saw a
// different first token. Each fetch returns the KV put for that document,
// bit for bit; documents with the same bytes still share chunks.
TEST_F(KnowledgeTest, FetchReturnsTheKvPutForThatDocumentEvenWhereTextIsShared) {
  KDN_REQUIRE_MODEL();
  TwoDocuments d;
  ASSERT_NO_FATAL_FAILURE(
      d.Make("Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.", 1));
  KvStore* const store_ = d.rs.store.get();
  KnowledgeIndex* const index_ = d.rs.index.get();
  const RealKv &ka = d.ka, &kb = d.kb;
  const size_t T = d.T;
  ASSERT_NE(0, std::memcmp(&ka.kv[2 * T * 32 + 8 * 32], &kb.kv[2 * T * 32 + 8 * 32], 32 * 4))
      << "layer 1's KV at token 8 should depend on token 0";
  const ModelKv& m = ka.m;
  auto va = ResolvedViews::Resolve(m, std::vector<ViewSpec>{CanonicalSpec(d.in_a)}, T).value();
  auto vb = ResolvedViews::Resolve(m, std::vector<ViewSpec>{CanonicalSpec(d.in_b)}, T).value();
  ASSERT_TRUE(index_->Put(m, "ns", "a", 1, "", d.ta, va).ok());
  ASSERT_TRUE(index_->Put(m, "ns", "b", 1, "", d.tb, vb).ok());
  ASSERT_TRUE(index_->Put(m, "ns", "a-again", 1, "", d.ta, va).ok());  // the same bytes as a: shares a's chunks
  const auto fetch = [&](const std::string& id) {
    std::vector<float> out(ka.kv.size(), -7.0f);
    auto view = ResolvedViews::Resolve(m, std::vector<ViewSpec>{CanonicalSpec(out)}, T).value();
    std::vector<std::int32_t> tokens;
    const Status st = index_->Fetch(m, "ns", id, &view, T, &tokens);
    EXPECT_TRUE(st.ok()) << id << ": " << st.message();
    return out;
  };
  EXPECT_EQ(fetch("a"), ka.kv);
  EXPECT_EQ(fetch("b"), kb.kv);
  EXPECT_EQ(fetch("a-again"), ka.kv);
  // The content keys (what the matcher finds a chunk by) are the text's.
  const auto ca = index_->Chunks(m, "ns", "a").value(), cb = index_->Chunks(m, "ns", "b").value();
  for (size_t i = 1; i < ca.size(); ++i) EXPECT_EQ(ca[i].key, cb[i].key) << i;
  // a's chunks and b's (token 0 differs, so none of theirs match); a-again shares a's.
  EXPECT_EQ(store_->chain().Stats()[0].objects, ca.size() + cb.size());
  // Deleting a keeps b's KV, and a-again's (shared with a).
  ASSERT_TRUE(index_->Delete(m, "ns", "a").ok());
  EXPECT_EQ(fetch("b"), kb.kv);
  EXPECT_EQ(fetch("a-again"), ka.kv);
}

// A document whose chunk was evicted from every tier is not served another
// document's KV for the same text put since: its fetch says it is gone.
TEST_F(KnowledgeTest, AnEvictedChunkIsNotReplacedByAnotherDocumentsKv) {
  KDN_REQUIRE_MODEL();
  TwoDocuments d;
  ASSERT_NO_FATAL_FAILURE(d.Make("The cat sat on the mat and looked at the big red ball in the garden.", 2));
  KvStore* const store_ = d.rs.store.get();
  KnowledgeIndex* const index_ = d.rs.index.get();
  const size_t T = d.T;
  const ModelKv& m = d.ka.m;
  ASSERT_TRUE(index_->Put(m, "ns", "a", 1, "", d.ta,
                          ResolvedViews::Resolve(m, std::vector<ViewSpec>{CanonicalSpec(d.in_a)}, T).value()).ok());
  const auto k1 = store_->ContentKey(m, "ns", std::span<const std::int32_t>(d.ta).subspan(8, 8));
  ASSERT_TRUE(store_->chain().Erase(k1));  // a's chunk 1 is gone from every tier
  ASSERT_TRUE(index_->Put(m, "ns", "b", 1, "", d.tb,
                          ResolvedViews::Resolve(m, std::vector<ViewSpec>{CanonicalSpec(d.in_b)}, T).value()).ok());
  std::vector<float> out(d.ka.kv.size(), -7.0f);
  auto view = ResolvedViews::Resolve(m, std::vector<ViewSpec>{CanonicalSpec(out)}, T).value();
  std::vector<std::int32_t> tokens;
  EXPECT_EQ(index_->Fetch(m, "ns", "a", &view, T, &tokens).code(), Code::kNotFound);
  out.assign(out.size(), -7.0f);
  ASSERT_TRUE(index_->Fetch(m, "ns", "b", &view, T, &tokens).ok());
  EXPECT_EQ(out, d.kb.kv);
}


// ---- The index's own bound (issue 10, item 14) ------------------------------

// A store of one host tier of `chunks` chunks (8 tokens x 128 B, one page
// each) and an index of `capacity` bytes.
struct BoundedStore {
  BoundedStore(std::uint64_t chunks, std::uint64_t capacity, const Clock* clock) {
    StoreOptions o;
    o.chunk_tokens = 8;
    o.clock = clock;
    TierSpec host;
    host.capacity_bytes = chunks * 4096;
    host.high_watermark = host.low_watermark = 1.0;
    o.tiers = {host};
    store = KvStore::Create(o).value();
    KnowledgeOptions k;
    k.capacity_bytes = capacity;
    index = std::make_unique<KnowledgeIndex>(*store, k);
  }
  std::unique_ptr<KvStore> store;
  std::unique_ptr<KnowledgeIndex> index;
};

// 8 tokens no other document of these tests has.
std::vector<std::int32_t> UniqueTokens(int i) {
  std::vector<std::int32_t> t(8);
  for (int j = 0; j < 8; ++j) t[static_cast<size_t>(j)] = 1000 + i * 8 + j;
  return t;
}

// With every document live (the host tier holds them all), puts stop at the
// index's capacity with kBusy, nothing listed is lost, and a delete, an
// expiry or a replacement of the same doc_id makes room again.
TEST_F(KnowledgeTest, PutsStopAtTheIndexCapacityAndADeleteMakesRoom) {
  constexpr std::uint64_t kCapacity = 32 << 10;
  BoundedStore bs(2048, kCapacity, &clock_);
  KnowledgeIndex& index = *bs.index;
  Kv kv(8);
  int put = 0;
  Status refused;
  for (; put < 1000; ++put) {
    refused = index.Put(m_, "ns", "d" + std::to_string(put), 1, "meta", UniqueTokens(put), kv.view);
    if (!refused.ok()) break;
  }
  ASSERT_LT(put, 1000) << "1000 documents went into an index of " << kCapacity << " bytes";
  EXPECT_GT(put, 10);
  EXPECT_EQ(refused.code(), Code::kBusy) << refused.message();
  EXPECT_NE(refused.message().find("32768"), std::string::npos) << refused.message();  // names the limit
  EXPECT_NE(refused.message().find("delete"), std::string::npos) << refused.message();  // and how to free room
  EXPECT_LE(index.charged_bytes(), kCapacity);
  EXPECT_EQ(index.List(m_, "ns").size(), static_cast<size_t>(put)) << "a live document was dropped";
  EXPECT_EQ(index.Fetch(m_, "ns", "d" + std::to_string(put), nullptr).status().code(), Code::kNotFound);
  for (int i = 0; i < put; ++i) {
    Kv out(8);
    ASSERT_TRUE(index.Fetch(m_, "ns", "d" + std::to_string(i), &out.view).ok()) << i;
  }
  // Still full; a new version of a listed document replaces it in place.
  EXPECT_EQ(index.Put(m_, "ns", "new", 1, "meta", UniqueTokens(5000), kv.view).code(), Code::kBusy);
  EXPECT_TRUE(index.Put(m_, "ns", "d3", 2, "meta", UniqueTokens(3), kv.view).ok());
  // A delete makes room for one more.
  ASSERT_TRUE(index.Delete(m_, "ns", "d0").ok());
  EXPECT_TRUE(index.Put(m_, "ns", "new", 1, "meta", UniqueTokens(5000), kv.view).ok());
  EXPECT_EQ(index.Put(m_, "ns", "new2", 1, "meta", UniqueTokens(5001), kv.view).code(), Code::kBusy);
  // So does an expiry, once its time has come (the put sweeps first).
  ASSERT_TRUE(index.Expire(m_, "ns", "d1", 1'000'000'000).ok());
  EXPECT_EQ(index.Put(m_, "ns", "new2", 1, "meta", UniqueTokens(5001), kv.view).code(), Code::kBusy);
  clock_.Advance(std::chrono::seconds(2));
  EXPECT_TRUE(index.Put(m_, "ns", "new2", 1, "meta", UniqueTokens(5001), kv.view).ok());
  EXPECT_LE(index.charged_bytes(), kCapacity);
  // A document larger than the whole index is refused outright.
  Kv big(8192);
  std::vector<std::int32_t> many(8192, 7);
  const Status too_big = index.Put(m_, "ns", "huge", 1, "", many, big.view);
  EXPECT_EQ(too_big.code(), Code::kBusy);
  EXPECT_NE(too_big.message().find("32768"), std::string::npos) << too_big.message();
}

// Documents whose KV left every tier (a fetch says NOT_FOUND) are dropped,
// oldest first, to make room; live and pinned documents never are.
TEST_F(KnowledgeTest, DocumentsWhoseKvLeftEveryTierAreDroppedFirstToMakeRoom) {
  constexpr std::uint64_t kCapacity = 32 << 10;
  BoundedStore bs(16, kCapacity, &clock_);  // the tier holds 16 documents' chunks
  KnowledgeIndex& index = *bs.index;
  Kv kv(8);
  ASSERT_TRUE(index.Put(m_, "ns", "pinned", 1, "", UniqueTokens(9999), kv.view).ok());
  ASSERT_TRUE(index.Pin(m_, "ns", "pinned", true, 0).ok());
  constexpr int kDocs = 400;
  for (int i = 0; i < kDocs; ++i) {
    const Status st = index.Put(m_, "ns", "d" + std::to_string(i), 1, "", UniqueTokens(i), kv.view);
    ASSERT_TRUE(st.ok()) << i << ": " << st.message();
    ASSERT_LE(index.charged_bytes(), kCapacity) << i;
  }
  const auto docs = index.List(m_, "ns");
  EXPECT_LT(docs.size(), static_cast<size_t>(kDocs) / 2) << "dead documents were kept";
  EXPECT_TRUE(index.Info(m_, "ns", "pinned").ok());
  Kv out(8);
  EXPECT_TRUE(index.Fetch(m_, "ns", "pinned", &out.view).ok());
  EXPECT_EQ(index.Info(m_, "ns", "d0").status().code(), Code::kNotFound);  // the oldest went first
  // Every document the tier still holds is listed and fetchable.
  int live = 0;
  for (int i = 0; i < kDocs; ++i) {
    const auto key = bs.store->ContentKey(m_, "ns", UniqueTokens(i));
    if (bs.store->chain().Locate(key) < 0) continue;
    ++live;
    EXPECT_TRUE(index.Fetch(m_, "ns", "d" + std::to_string(i), &out.view).ok()) << i;
  }
  EXPECT_GE(live, 10);
  EXPECT_GT(index.Scans().reclaim, 0u);
}

// No call walks every document: the sweep looks only at documents whose
// deadline passed, a list or an info only at its own namespace or document.
// (Before: every call walked all 20,000.) Expiry still happens at the next call.
TEST_F(KnowledgeTest, CallsDoNotWalkEveryDocument) {
  BoundedStore bs(16, std::uint64_t{1} << 30, &clock_);
  KnowledgeIndex& index = *bs.index;
  Kv kv(8);
  constexpr int kDocs = 20000;
  for (int i = 0; i < kDocs; ++i) {
    ASSERT_TRUE(index.Put(m_, "big", "d" + std::to_string(i), 1, "", UniqueTokens(i), kv.view).ok()) << i;
  }
  ASSERT_TRUE(index.Put(m_, "small", "only", 1, "", UniqueTokens(kDocs), kv.view).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(index.Expire(m_, "big", "d" + std::to_string(i * 7), 1'000'000'000).ok());
  const auto before = index.Scans();
  constexpr int kCalls = 200;
  for (int c = 0; c < kCalls; ++c) {
    const std::string id = "d" + std::to_string(1000 + c);
    ASSERT_TRUE(index.Info(m_, "big", id).ok());
    ASSERT_EQ(index.List(m_, "small").size(), 1u);
    ASSERT_TRUE(index.Chunks(m_, "big", id).ok());
    ASSERT_EQ(index.Fetch(m_, "big", id, nullptr).status().code(), Code::kOk);
    ASSERT_TRUE(index.Pin(m_, "small", "only", c % 2 == 0, 0).ok());
    ASSERT_TRUE(index.Expire(m_, "big", id, 3'000'000'000).ok());
  }
  const auto after = index.Scans();
  EXPECT_LE(after.sweep - before.sweep, 10u * kCalls) << "documents the sweeps looked at";
  EXPECT_LE(after.list - before.list, 2u * kCalls) << "documents the lists and infos looked at";
  // Expiry: the 10 documents' deadline passes; the next call drops them, and
  // looks at those 10 only (the 200 others expire a second later).
  EXPECT_EQ(index.List(m_, "big").size(), static_cast<size_t>(kDocs));
  clock_.Advance(std::chrono::milliseconds(1500));
  const auto swept = index.Scans().sweep;
  EXPECT_EQ(index.Info(m_, "big", "d0").status().code(), Code::kNotFound);
  EXPECT_LE(index.Scans().sweep - swept, 12u);
  EXPECT_EQ(index.Info(m_, "big", "d7").status().code(), Code::kNotFound);
  EXPECT_TRUE(index.Info(m_, "big", "d1").ok());
  EXPECT_TRUE(index.Info(m_, "big", "d1000").ok());
  clock_.Advance(std::chrono::seconds(2));
  EXPECT_EQ(index.Sweep(), static_cast<size_t>(kCalls));
  EXPECT_EQ(index.List(m_, "big").size(), static_cast<size_t>(kDocs - 10 - kCalls));
}

std::uint64_t RssBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  if (f) {
    if (std::fscanf(f, "%llu %llu", &size, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// 200,000 small documents against an index of 4 MiB and a tier of 64
// chunks: the index's charge stays under its capacity and the process's
// resident memory grows by less than 48 MiB (before: ~1.4 KB per document,
// several hundred MiB). Every put succeeds: documents whose KV the tier
// evicted make room.
TEST_F(KnowledgeTest, TwoHundredThousandDocumentsStayWithinTheCapacity) {
  constexpr std::uint64_t kCapacity = 4 << 20;
  BoundedStore bs(64, kCapacity, &clock_);
  KnowledgeIndex& index = *bs.index;
  Kv kv(8);
  const std::uint64_t rss0 = RssBytes();
  std::uint64_t peak_charge = 0;
  for (int i = 0; i < 200000; ++i) {
    const Status st = index.Put(m_, "ns", "document-" + std::to_string(i), 1, "source=test", UniqueTokens(i), kv.view);
    ASSERT_TRUE(st.ok()) << i << ": " << st.message();
    if (i % 1000 == 0) peak_charge = std::max(peak_charge, index.charged_bytes());
  }
  peak_charge = std::max(peak_charge, index.charged_bytes());
  const std::uint64_t grown = RssBytes() - std::min(RssBytes(), rss0);
  EXPECT_LE(peak_charge, kCapacity);
  EXPECT_GT(peak_charge, kCapacity / 2) << "the index should fill before it reclaims";
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (Not under sanitizers: their quarantine and shadow memory are not the index's.)
  EXPECT_LT(grown, std::uint64_t{48} << 20) << "resident memory grew by " << grown << " bytes";
#endif
  RecordProperty("rss_growth_bytes", std::to_string(grown));
  RecordProperty("documents_listed", std::to_string(index.List(m_, "ns").size()));
}

// ---- Persistence: documents survive a restart with their disk tier ----------

TEST_F(KnowledgeTest, DocumentsSurviveARestartWithTheirDiskTier) {
  ASSERT_TRUE(index_->Persist(IndexPath()).ok());  // no file yet: a new index
  Kv a(20), b(12, 7);
  const auto ta = Tokens(20, 1), tb = Tokens(12, 2);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc-a", 3, "title=A", ta, a.view).ok());
  ASSERT_TRUE(index_->Put(m_, "other", "doc-b", 9, "", tb, b.view).ok());
  ASSERT_TRUE(index_->Pin(m_, "other", "doc-b", true, 0).ok());
  ASSERT_TRUE(index_->Fetch(m_, "ns", "doc-a", nullptr).ok());
  Kv scratch(20);
  ASSERT_TRUE(index_->Fetch(m_, "ns", "doc-a", &scratch.view).ok());  // 3 hits
  store_->chain().Flush();

  ASSERT_TRUE(Restart().ok());
  EXPECT_FALSE(store_->chain().ContainsAt(0, store_->ContentKey(m_, "ns", std::span(ta).first(8))))
      << "the host tier starts empty: what follows comes from disk";
  const auto docs = index_->List(m_, "ns");
  ASSERT_EQ(docs.size(), 1u);
  ExpectDocA(docs[0]);
  EXPECT_EQ(docs[0].hits, 3u);
  EXPECT_FALSE(docs[0].pinned);
  Kv out(20, -1e9f);
  auto got = index_->Fetch(m_, "ns", "doc-a", &out.view);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, ta);
  EXPECT_EQ(out.data, a.data);
  auto info = index_->Info(m_, "other", "doc-b");
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->pinned);
  EXPECT_EQ(info->version, 9u);
  Kv outb(12, -1e9f);
  ASSERT_TRUE(index_->Fetch(m_, "other", "doc-b", &outb.view).ok());
  EXPECT_EQ(outb.data, b.data);
  // The restored references still share and release chunks as before: a
  // delete erases the document's chunks from every tier.
  ASSERT_TRUE(index_->Delete(m_, "ns", "doc-a").ok());
  EXPECT_EQ(store_->chain().Locate(store_->ContentKey(m_, "ns", std::span(ta).first(8))), -1);
  ASSERT_TRUE(Restart().ok());
  EXPECT_TRUE(index_->List(m_, "ns").empty()) << "the delete was saved";
  EXPECT_EQ(index_->List(m_, "other").size(), 1u);
}

TEST_F(KnowledgeTest, ANewVersionAndAnExpiryAreKeptAcrossARestart) {
  ASSERT_TRUE(index_->Persist(IndexPath()).ok());
  Kv v1(16), v2(16, 3);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 1, "", Tokens(16, 1), v1.view).ok());
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 2, "", Tokens(16, 2), v2.view).ok());
  ASSERT_TRUE(index_->Put(m_, "ns", "soon", 1, "", Tokens(8, 3), v1.view).ok());
  ASSERT_TRUE(index_->Expire(m_, "ns", "soon", 1'000'000).ok());  // 1 ms of wall time
  ASSERT_TRUE(index_->Put(m_, "ns", "later", 1, "", Tokens(8, 4), v1.view).ok());
  ASSERT_TRUE(index_->Expire(m_, "ns", "later", std::int64_t{3600} * 1'000'000'000).ok());
  store_->chain().Flush();
  ASSERT_TRUE(index_->Flush().ok());  // saved now: "soon" has 1 ms left in the file
  ::usleep(20'000);                   // and expires while the index lies on disk (nothing changes: no second save)
  ASSERT_TRUE(Restart().ok());
  const auto docs = index_->List(m_, "ns");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].doc_id, "doc");
  EXPECT_EQ(docs[0].version, 2u);
  EXPECT_EQ(docs[1].doc_id, "later");
  EXPECT_NE(docs[1].expires_at_ns, 0);
  EXPECT_GT(docs[1].expires_at_ns - clock_.NowNs(), std::int64_t{3500} * 1'000'000'000);
  Kv out(16, -1e9f);
  auto got = index_->Fetch(m_, "ns", "doc", &out.view);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, Tokens(16, 2));
  EXPECT_EQ(out.data, v2.data);
  EXPECT_EQ(store_->chain().Locate(store_->ContentKey(m_, "ns", Tokens(8, 3))), -1)
      << "the expired document's chunk was erased at the first call";
}

TEST_F(KnowledgeTest, AFileThatCannotBeLoadedIsSetAsideAndTheIndexStartsEmpty) {
  ASSERT_TRUE(index_->Persist(IndexPath()).ok());
  Kv kv(8);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 1, "", Tokens(8, 1), kv.view).ok());
  ASSERT_TRUE(index_->Flush().ok());
  index_.reset();
  {
    std::FILE* f = std::fopen(IndexPath().c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -3, SEEK_END);
    std::fputc('X', f);  // one byte of the payload: the checksum no longer matches
    std::fclose(f);
  }
  const Status st = Restart();
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st.message();
  EXPECT_TRUE(index_->List(m_, "ns").empty());
  EXPECT_TRUE(std::filesystem::exists(IndexPath() + ".bad"));
  // Still kept: the next put is saved and loaded again.
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 2, "", Tokens(8, 1), kv.view).ok());
  ASSERT_TRUE(Restart().ok());
  ASSERT_EQ(index_->List(m_, "ns").size(), 1u);
  EXPECT_EQ(index_->List(m_, "ns")[0].version, 2u);
  // Not ours at all: refused the same way.
  index_.reset();
  {
    std::FILE* f = std::fopen(IndexPath().c_str(), "wb");
    std::fputs("hello", f);
    std::fclose(f);
  }
  EXPECT_EQ(Restart().code(), Code::kCorrupt);
  EXPECT_TRUE(index_->List(m_, "ns").empty());
}

// Whoever could write to the disk tier's directory could hand a runtime an
// index whose documents name other KV (a document's fetch then loads it).
// With the deployment secret the index is sealed whole: a file without the
// secret's seal is refused as a corrupt one is; without a secret a sealed
// file is read as it is.
TEST_F(KnowledgeTest, WithASecretOnlyAnIndexSealedWithItIsLoaded) {
  auto sealer = wire::ChunkSealer::FromSecret(std::string(40, 's')).value();
  auto other = wire::ChunkSealer::FromSecret(std::string(40, 'o')).value();
  ASSERT_TRUE(Restart(std::chrono::milliseconds(200), sealer).ok());
  Kv kv(16);
  ASSERT_TRUE(index_->Put(m_, "ns", "doc", 1, "", Tokens(16, 1), kv.view).ok());
  ASSERT_TRUE(index_->Flush().ok());
  ASSERT_TRUE(Restart(std::chrono::milliseconds(200), sealer).ok());
  ASSERT_EQ(index_->List(m_, "ns").size(), 1u);
  ASSERT_TRUE(Restart().ok());  // no secret: read as it is
  ASSERT_EQ(index_->List(m_, "ns").size(), 1u);
  ASSERT_TRUE(Restart(std::chrono::milliseconds(200), sealer).ok()) << "a sealed file loads again with the secret";
  ASSERT_EQ(index_->List(m_, "ns").size(), 1u);
  // A forged index (written without the secret) and one of another secret.
  for (const auto& forger : {std::shared_ptr<const wire::ChunkSealer>(), other}) {
    SCOPED_TRACE(forger ? "another secret" : "no secret");
    std::filesystem::remove(IndexPath() + ".bad");
    ASSERT_TRUE(Restart(std::chrono::milliseconds(200), forger).ok());
    ASSERT_TRUE(index_->Put(m_, "ns", "forged", 1, "", Tokens(8, 5), kv.view).ok());
    ASSERT_TRUE(index_->Flush().ok());
    const Status st = Restart(std::chrono::milliseconds(200), sealer);
    EXPECT_EQ(st.code(), Code::kCorrupt);
    EXPECT_NE(st.message().find(forger ? "another secret" : "not sealed"), std::string::npos) << st.message();
    EXPECT_TRUE(index_->List(m_, "ns").empty());
    EXPECT_TRUE(std::filesystem::exists(IndexPath() + ".bad"));
    index_.reset();  // nothing changed: nothing saved over the forged file's place
  }
}

TEST_F(KnowledgeTest, ABurstOfChangesIsSavedOnce) {
  ASSERT_TRUE(index_->Persist(IndexPath(), std::chrono::hours(1)).ok());
  Kv kv(8);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(index_->Put(m_, "ns", "doc" + std::to_string(i), 1, "", Tokens(8, i), kv.view).ok());
  }
  EXPECT_EQ(index_->saves(), 0u) << "the saver waits out the burst";
  ASSERT_TRUE(index_->Flush().ok());
  EXPECT_EQ(index_->saves(), 1u);
  ASSERT_TRUE(index_->Flush().ok());
  EXPECT_EQ(index_->saves(), 1u) << "nothing changed since";
  ASSERT_TRUE(index_->Delete(m_, "ns", "doc3").ok());
  ASSERT_TRUE(Restart().ok()) << "the destructor saved the delete";
  EXPECT_EQ(index_->List(m_, "ns").size(), 9u);
}

}  // namespace
}  // namespace kdn::store
