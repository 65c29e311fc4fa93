// SPDX-License-Identifier: Apache-2.0
// kdn ingest's library (refengine/ingest.h) on the reference model and a
// real store (a host tier written through to a disk tier): a first run
// ingests, a second skips what is stored at the same version (also after a
// restart of the runtime), a changed file is replaced and the parts it no
// longer makes deleted, bad input is reported and skipped, a file changing
// during ingestion leaves nothing of it, a stop leaves the rest to the next
// run, and the stored KV is the engine's own.
#include "refengine/ingest.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "lab/model/transformer.h"
#include "test_models.h"

namespace kdn::refengine {
namespace {

namespace fs = std::filesystem;

const char* kStory1 = "Once upon a time, there was a little girl named Lily. She liked to play in the park.\n";
const char* kStory2 = "Tom had a red ball. He threw it high in the sky and his dog ran after it.\n";
const char* kStory3 = "The sun was warm. A bird sang on the tree, and the cat looked up at it.\n";

class IngestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kdn::testing::ModelsPresent()) GTEST_SKIP() << "the reference model is not present";
    root_ = fs::temp_directory_path() / ("kdn_ingest_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "docs" / "sub");
    auto m = LoadModel(kdn::testing::ModelPath(), kdn::testing::TokenizerPath(), false);
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::make_unique<LoadedModel>(std::move(m).value());
    Write("a.txt", kStory1);
    Write("sub/b.txt", kStory2);
    Write("c.md", kStory3);
  }
  void TearDown() override {
    Close();
    fs::remove_all(root_);
  }
  void Write(const std::string& rel, const std::string& text) {
    std::ofstream f(root_ / "docs" / rel, std::ios::binary);
    f << text;
  }
  void Open() {
    Close();
    StoreOptions so;
    so.dir = (root_ / "store").string();
    so.capacity = 256 << 20;
    auto rt = OpenStore(so);
    ASSERT_TRUE(rt.ok()) << rt.status().message();
    rt_ = *rt;
    auto e = RefEngine::Create(*model_, rt_, 1);
    ASSERT_TRUE(e.ok());
    engine_ = std::move(e).value();
  }
  void Close() {
    engine_.reset();
    kdn_runtime_destroy(rt_);
    rt_ = nullptr;
  }
  IngestOptions Options(std::uint32_t max_tokens = 0) {
    IngestOptions o;
    o.dir = (root_ / "docs").string();
    o.ns = "docs";
    o.workers = 2;
    o.max_tokens = max_tokens;
    return o;
  }
  // long.txt: three items or more at 64 tokens each; returns its text.
  std::string WriteLong() {
    std::string longer;
    for (int i = 0; i < 6; ++i) longer += std::string(kStory1) + kStory2;
    Write("long.txt", longer);
    return longer;
  }
  // Runs an ingestion on the open store; the events by path.
  IngestSummary Run(const IngestOptions& o, std::map<std::string, FileEvent>* events = nullptr,
                    const std::atomic<bool>* stop = nullptr, const IngestEventFn& also = {}) {
    auto sum = Ingest(*model_, rt_, o, stop, [&](const FileEvent& ev, const IngestProgress& p) {
      if (events) (*events)[ev.path] = ev;
      if (also) also(ev, p);
    });
    EXPECT_TRUE(sum.ok()) << sum.status().message();
    return sum.ok() ? *sum : IngestSummary{};
  }
  std::uint64_t Count(const IngestSummary& s, FileOutcome o) { return s.by_outcome[static_cast<int>(o)]; }
  std::map<std::string, kdn_document_info> Listed() {
    std::vector<kdn_document_info> docs(256);
    for (auto& d : docs) d = KDN_DOCUMENT_INFO_INIT;
    size_t n = 0;
    EXPECT_EQ(kdn_knowledge_list(engine_->model(), "docs", 4, docs.data(), docs.size(), &n), KDN_OK);
    std::map<std::string, kdn_document_info> out;
    for (size_t i = 0; i < n && i < docs.size(); ++i) out[docs[i].doc_id] = docs[i];
    return out;
  }

  fs::path root_;
  std::unique_ptr<LoadedModel> model_;
  kdn_runtime* rt_ = nullptr;
  std::unique_ptr<RefEngine> engine_;
};

TEST_F(IngestTest, ASecondRunSkipsWhatIsStoredAtTheSameVersionEvenAfterARestart) {
  Open();
  auto first = Run(Options());
  EXPECT_EQ(Count(first, FileOutcome::kIngested), 3u);
  EXPECT_EQ(first.items, 3u);
  EXPECT_GT(first.tokens, 40u);
  auto listed = Listed();
  ASSERT_EQ(listed.size(), 3u);
  ASSERT_TRUE(listed.count("sub/b.txt"));
  std::ifstream in(root_ / "docs" / "a.txt");
  const std::string a((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(listed["a.txt"].version, ContentVersion(a));
  EXPECT_EQ(listed["a.txt"].chunks_present, listed["a.txt"].chunks);

  auto second = Run(Options());
  EXPECT_EQ(Count(second, FileOutcome::kUnchanged), 3u);
  EXPECT_EQ(second.items, 0u);

  Open();  // a restart: the index comes back from the store's directory
  EXPECT_EQ(Listed().size(), 3u);
  auto third = Run(Options());
  EXPECT_EQ(Count(third, FileOutcome::kUnchanged), 3u);
  EXPECT_EQ(third.items, 0u);

  Write("a.txt", std::string(kStory1) + "Then it rained.\n");
  std::map<std::string, FileEvent> ev;
  auto fourth = Run(Options(), &ev);
  EXPECT_EQ(ev["a.txt"].outcome, FileOutcome::kReplaced);
  EXPECT_EQ(Count(fourth, FileOutcome::kUnchanged), 2u);
  EXPECT_EQ(fourth.items, 1u);
  EXPECT_NE(Listed()["a.txt"].version, listed["a.txt"].version);
}

TEST_F(IngestTest, TheStoredKvIsTheEnginesOwnPrefill) {
  Open();
  Run(Options());
  Open();  // read back from disk, after a restart
  const auto& c = model_->weights->config();
  std::vector<std::int32_t> tokens(512);
  const size_t n = Listed()["sub/b.txt"].num_tokens;
  ASSERT_GT(n, 0u);
  const size_t kv_dim = static_cast<size_t>(c.kv_dim());
  std::vector<float> got(static_cast<size_t>(c.n_layers) * 2 * n * kv_dim, -1.0f);
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.dtype = KDN_DTYPE_F32;
  v.data = got.data();
  v.size_bytes = got.size() * sizeof(float);
  v.num_tokens = n;
  v.stride_layer = 2 * n * kv_dim;
  v.stride_kv = n * kv_dim;
  v.stride_token = kv_dim;
  v.stride_head = static_cast<std::uint64_t>(c.head_dim());
  v.stride_dim = 1;
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  ASSERT_EQ(kdn_knowledge_fetch(engine_->model(), "docs", 4, "sub/b.txt", 9, &v, 1, tokens.data(), tokens.size(), &r),
            KDN_OK)
      << kdn_last_error_message();
  tokens.resize(n);
  EXPECT_EQ(std::vector<int>(tokens.begin(), tokens.end()), model_->tokenizer->Encode(kStory2, false));
  model::Transformer t(*model_->weights);
  model::KvCache cache = t.NewCache();
  ASSERT_TRUE(t.Forward(std::vector<int>(tokens.begin(), tokens.end()), 0, cache, nullptr).ok());
  EXPECT_EQ(got, cache.Export(0, static_cast<int>(n))) << "zstd is lossless: the bytes are the prefill's";
}

TEST_F(IngestTest, BadInputIsReportedAndSkippedAndTheRestIngested) {
  Write("empty.txt", "");
  Write("blank.txt", " \n\t\n");
  Write("image.png", std::string("\x89PNG\r\n\x1a\n\0\0\0", 11));
  Write("latin1.txt", "caf\xe9 au lait\n");  // not UTF-8
  Write("gone.txt", kStory1);
  Write(".hidden.txt", kStory1);
  fs::create_directories(root_ / "docs" / ".git");
  Write(".git/HEAD", "ref: refs/heads/main\n");
  fs::create_symlink(root_ / "docs" / "a.txt", root_ / "docs" / "link.txt");
  Open();
  IngestOptions o = Options();
  o.after_listing = [&] { fs::remove(root_ / "docs" / "gone.txt"); };  // gone between the listing and its read
  std::map<std::string, FileEvent> ev;
  auto s = Run(o, &ev);
  EXPECT_EQ(ev["empty.txt"].outcome, FileOutcome::kEmpty);
  EXPECT_EQ(ev["blank.txt"].outcome, FileOutcome::kEmpty);
  EXPECT_EQ(ev["image.png"].outcome, FileOutcome::kBinary);
  EXPECT_EQ(ev["latin1.txt"].outcome, FileOutcome::kBinary);
  EXPECT_EQ(ev["gone.txt"].outcome, FileOutcome::kUnreadable);
  EXPECT_NE(ev["gone.txt"].detail.find("No such file"), std::string::npos) << ev["gone.txt"].detail;
  EXPECT_EQ(ev.count(".hidden.txt"), 0u);
  EXPECT_EQ(ev.count(".git/HEAD"), 0u);
  EXPECT_EQ(ev.count("link.txt"), 0u) << "links are not followed";
  EXPECT_EQ(Count(s, FileOutcome::kIngested), 3u);
  const auto listed = Listed();
  EXPECT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed.count("image.png"), 0u);
}

TEST_F(IngestTest, AFileChangingDuringIngestionLeavesNothingOfItAndTheNextRunTakesIt) {
  const std::string longer = WriteLong();  // the change comes after one of its items was put
  Open();
  IngestOptions o = Options(64);
  int puts = 0;
  o.before_put = [&](const std::string& path) {
    if (path == "long.txt" && ++puts == 2) Write("long.txt", longer + "An edit.\n");
  };
  std::map<std::string, FileEvent> ev;
  auto s = Run(o, &ev);
  EXPECT_EQ(ev["long.txt"].outcome, FileOutcome::kChanged);
  EXPECT_EQ(Count(s, FileOutcome::kIngested), 3u);
  for (const auto& [id, info] : Listed()) EXPECT_EQ(id.rfind("long.txt", 0), std::string::npos) << id << " stayed";
  o.before_put = {};
  auto again = Run(o, &ev);
  EXPECT_EQ(ev["long.txt"].outcome, FileOutcome::kIngested);
  EXPECT_GE(ev["long.txt"].parts, 3u);
  EXPECT_EQ(Count(again, FileOutcome::kUnchanged), 3u);
}

TEST_F(IngestTest, LongFilesAreSplitAndPartsNoLongerMadeAreDeleted) {
  WriteLong();
  Open();
  IngestOptions o = Options(64);
  std::map<std::string, FileEvent> ev;
  Run(o, &ev);
  const std::uint32_t parts = ev["long.txt"].parts;
  ASSERT_GE(parts, 3u);
  auto listed = Listed();
  std::uint64_t tokens = 0;
  for (std::uint32_t k = 1; k <= parts; ++k) {
    const std::string id = "long.txt#" + std::to_string(k);
    ASSERT_TRUE(listed.count(id)) << id;
    EXPECT_LE(listed[id].num_tokens, 64u);
    tokens += listed[id].num_tokens;
  }
  EXPECT_EQ(tokens, ev["long.txt"].tokens);
  EXPECT_EQ(listed.count("long.txt"), 0u);
  Write("long.txt", kStory3);  // now one item: "long.txt"
  Run(o, &ev);
  EXPECT_EQ(ev["long.txt"].outcome, FileOutcome::kReplaced);
  listed = Listed();
  EXPECT_TRUE(listed.count("long.txt"));
  for (std::uint32_t k = 1; k <= parts; ++k) EXPECT_EQ(listed.count("long.txt#" + std::to_string(k)), 0u);
  // A file gone from the directory: kept, unless pruned.
  fs::remove(root_ / "docs" / "c.md");
  Run(o);
  EXPECT_TRUE(Listed().count("c.md"));
  o.prune = true;
  auto pruned = Run(o);
  EXPECT_EQ(pruned.deleted, 1u);
  EXPECT_FALSE(Listed().count("c.md"));
}

TEST_F(IngestTest, AStopLeavesTheRestToTheNextRunAndPinsHold) {
  for (int i = 0; i < 12; ++i) Write("more" + std::to_string(i) + ".txt", std::string(kStory2) + std::to_string(i) + "\n");
  Open();
  IngestOptions o = Options();
  o.pin_ttl_ms = 0;
  std::atomic<bool> stop{false};
  auto first = Run(o, nullptr, &stop, [&](const FileEvent&, const IngestProgress& p) {
    if (p.files_done == 3) stop = true;
  });
  EXPECT_TRUE(first.interrupted);
  EXPECT_GT(first.left, 0u);
  EXPECT_LT(first.files, 15u);
  const std::uint64_t done = Count(first, FileOutcome::kIngested);
  EXPECT_EQ(Listed().size(), done) << "every file looked at was put whole";
  for (const auto& [id, info] : Listed()) EXPECT_EQ(info.pinned, 1u) << id;
  auto second = Run(o);
  EXPECT_FALSE(second.interrupted);
  EXPECT_EQ(Count(second, FileOutcome::kUnchanged), done);
  EXPECT_EQ(Count(second, FileOutcome::kIngested), 15u - done);
  EXPECT_EQ(Listed().size(), 15u);
}

// Issue 31 item 2: files and directories swapped for links after the
// listing are never followed out of --dir (before, the secret file's and
// the outside directory's text ended up in the store).
TEST_F(IngestTest, LinksSwappedInAfterTheListingAreNotFollowed) {
  Open();
  const fs::path outside = root_ / "outside";
  fs::create_directories(outside);
  const std::string secret = "The secret code of the vault is four two four two, said the old man quietly.\n";
  {
    std::ofstream(outside / "secret.txt") << secret;
    std::ofstream(outside / "b.txt") << secret;
  }
  IngestOptions o = Options();
  o.after_listing = [&] {
    fs::remove(root_ / "docs" / "a.txt");
    fs::create_symlink(outside / "secret.txt", root_ / "docs" / "a.txt");  // the file itself
    fs::remove_all(root_ / "docs" / "sub");
    fs::create_directory_symlink(outside, root_ / "docs" / "sub");  // a directory on its path
  };
  std::map<std::string, FileEvent> ev;
  auto sum = Run(o, &ev);
  EXPECT_EQ(ev["a.txt"].outcome, FileOutcome::kUnreadable) << ev["a.txt"].detail;
  EXPECT_NE(ev["a.txt"].detail.find("symbolic link"), std::string::npos) << ev["a.txt"].detail;
  EXPECT_EQ(ev["sub/b.txt"].outcome, FileOutcome::kUnreadable) << ev["sub/b.txt"].detail;
  EXPECT_EQ(ev["c.md"].outcome, FileOutcome::kIngested);
  EXPECT_EQ(sum.items, 1u);
  const auto listed = Listed();
  EXPECT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed.count("a.txt"));
  EXPECT_FALSE(listed.count("sub/b.txt"));
}

// Item 3: a file swapped for a FIFO after the listing is skipped at once
// (before, the run blocked forever opening it).
TEST_F(IngestTest, AFifoSwappedInIsSkippedWithoutBlocking) {
  Open();
  IngestOptions o = Options();
  o.after_listing = [&] {
    fs::remove(root_ / "docs" / "c.md");
    ASSERT_EQ(::mkfifo((root_ / "docs" / "c.md").c_str(), 0600), 0);
  };
  std::map<std::string, FileEvent> ev;
  auto sum = Run(o, &ev);  // returns: ctest's timeout would catch a hang
  EXPECT_EQ(ev["c.md"].outcome, FileOutcome::kUnreadable);
  EXPECT_NE(ev["c.md"].detail.find("not a regular file"), std::string::npos) << ev["c.md"].detail;
  EXPECT_EQ(Count(sum, FileOutcome::kIngested), 2u);
}

// Item 3: a name that is not UTF-8 is skipped and reported, on every run
// (before, the run aborted, exit 134, rerun after rerun); a path whose item
// id would pass 255 bytes is skipped alone (before, it failed the run);
// names print escaped.
TEST_F(IngestTest, BadNamesAndLongPathsAreSkippedAloneAndPrintEscaped) {
  Open();
  Write("bad\xff\xfe.txt", kStory2);
  const std::string dir200(200, 'd');
  fs::create_directories(root_ / "docs" / dir200 / dir200);
  Write(dir200 + "/" + dir200 + "/long.txt", kStory3);
  Write("esc\x1b[31m\nnl.txt", kStory1);
  for (int run = 0; run < 2; ++run) {
    std::map<std::string, FileEvent> ev;
    auto sum = Run(Options(), &ev);
    EXPECT_EQ(ev["bad\xff\xfe.txt"].outcome, FileOutcome::kUnreadable) << run;
    EXPECT_NE(ev["bad\xff\xfe.txt"].detail.find("not UTF-8"), std::string::npos);
    const FileEvent& lp = ev[dir200 + "/" + dir200 + "/long.txt"];
    EXPECT_EQ(lp.outcome, FileOutcome::kUnreadable) << run;
    EXPECT_NE(lp.detail.find("255"), std::string::npos) << lp.detail;
    EXPECT_EQ(Count(sum, run == 0 ? FileOutcome::kIngested : FileOutcome::kUnchanged), 4u) << run;
  }
  EXPECT_EQ(PrintableName("bad\xff\xfe.txt"), "bad\\xFF\\xFE.txt");
  EXPECT_EQ(PrintableName("esc\x1b[31m\nnl.txt"), "esc\\x1B[31m\\x0Anl.txt");
  EXPECT_EQ(PrintableName("caf\xc3\xa9 a\\b.txt"), "caf\xc3\xa9 a\\x5Cb.txt");
  EXPECT_TRUE(Listed().count("esc\x1b[31m\nnl.txt"));
}

}  // namespace
}  // namespace kdn::refengine
