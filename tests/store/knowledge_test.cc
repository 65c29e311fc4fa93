// Knowledge items: put, list, fetch, versions, pins, expiry, deletion from
// every tier, tenant isolation, chunks shared between documents.
#include "store/knowledge.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

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
    store_ = KvStore::Create(o).value();
    index_ = std::make_unique<KnowledgeIndex>(*store_);
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
  EXPECT_EQ(docs[0].doc_id, "doc-a");
  EXPECT_EQ(docs[0].version, 3u);
  EXPECT_EQ(docs[0].metadata, "title=A");
  EXPECT_EQ(docs[0].tokens, 20u);
  EXPECT_EQ(docs[0].chunks, 3u);  // 8 + 8 + 4
  EXPECT_EQ(docs[0].chunks_present, 3u);
  Kv out(20, -1e9f);
  auto got = index_->Fetch(m_, "ns", "doc-a", &out.view);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, tokens);
  EXPECT_EQ(out.data, kv.data);
  EXPECT_EQ(index_->Fetch(m_, "ns", "nope", nullptr).status().code(), Code::kNotFound);
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

}  // namespace
}  // namespace kdn::store
