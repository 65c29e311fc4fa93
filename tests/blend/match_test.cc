// SPDX-License-Identifier: Apache-2.0
// Matching stored knowledge chunks inside a query without separators: chunks
// at arbitrary offsets, first-window look-alikes and forced rolling-hash
// collisions rejected by the full content key, scopes (namespace, model),
// documents put, replaced, deleted and expired after the index was built,
// short last chunks, empty and short queries, concurrent use.
#include "core/knowledge/match.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

namespace kdn::blend {
namespace {

// The reference model's KV shape (stories260K: 5 layers, 4 KV heads of 8, f32).
constexpr int kL = 5, kH = 4, kD = 8;
constexpr std::uint32_t kChunk = 32;  // chunk_tokens of the store
constexpr std::int32_t kVocab = 512;

store::ModelKv Model(const std::string& name = "stories260K") {
  store::ModelKv m;
  m.fingerprint = keys::ModelFingerprint({kL, kH, kD, 0, 10000.0f, 0, kD, name});
  m.shape = {kL, kH, kD, 4};
  return m;
}

// A contiguous per-layer KV buffer of deterministic floats (matching reads
// only tokens and keys; Put needs some KV to store).
struct Kv {
  explicit Kv(size_t tokens) {
    for (int i = 0; i < 2 * kL; ++i) {
      data.emplace_back(tokens * kH * kD);
      for (size_t e = 0; e < data.back().size(); ++e) data.back()[e] = static_cast<float>(i * 1000 + e % 1000) * 0.01f;
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
  std::vector<std::vector<float>> data;
  std::vector<void*> k, v;
  kernels::KvView view;
};

std::vector<std::int32_t> Random(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<std::int32_t> token(3, kVocab - 1);
  std::vector<std::int32_t> t(n);
  for (auto& x : t) x = token(rng);
  return t;
}

void Append(std::vector<std::int32_t>& to, std::span<const std::int32_t> from) {
  to.insert(to.end(), from.begin(), from.end());
}

class ChunkMatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::StoreOptions o;
    o.chunk_tokens = kChunk;
    o.hash_seed = 7;
    o.clock = &clock_;
    store::TierSpec host;
    host.capacity_bytes = 64 << 20;
    o.tiers = {host};
    store_ = store::KvStore::Create(o).value();
    index_ = std::make_unique<store::KnowledgeIndex>(*store_);
  }

  // Puts a document of `tokens` under (m_, ns) unless told otherwise.
  void Put(const std::string& doc_id, const std::vector<std::int32_t>& tokens, std::string_view ns = "ns",
           const store::ModelKv* model = nullptr) {
    Kv kv(tokens.size());
    const Status s = index_->Put(model ? *model : m_, ns, doc_id, 1, "", tokens, kv.view);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  std::vector<store::ChunkInfo> Chunks(const std::string& doc_id, std::string_view ns = "ns") {
    auto c = index_->Chunks(m_, ns, doc_id);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? *c : std::vector<store::ChunkInfo>{};
  }

  ManualClock clock_;
  std::unique_ptr<store::KvStore> store_;
  std::unique_ptr<store::KnowledgeIndex> index_;
  const store::ModelKv m_ = Model();
};

struct Expected {
  std::uint64_t offset;
  std::string doc_id;
  std::uint32_t chunk;
};

// Every match is what was expected, and is what it claims: the query's
// tokens there are the chunk's, under the chunk's key.
void ExpectMatches(const Matches& got, std::vector<Expected> want, std::span<const std::int32_t> query,
                   store::KnowledgeIndex& index, const store::ModelKv& m, std::string_view ns = "ns") {
  std::sort(want.begin(), want.end(), [](const Expected& a, const Expected& b) { return a.offset < b.offset; });
  ASSERT_EQ(got.matches.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const ChunkMatch& g = got.matches[i];
    SCOPED_TRACE("match " + std::to_string(i));
    EXPECT_EQ(g.offset, want[i].offset);
    EXPECT_EQ(g.doc_id, want[i].doc_id);
    EXPECT_EQ(g.chunk, want[i].chunk);
    auto chunks = index.Chunks(m, ns, g.doc_id);
    ASSERT_TRUE(chunks.ok());
    const store::ChunkInfo& c = (*chunks)[g.chunk];
    EXPECT_EQ(g.tokens, c.tokens.size());
    EXPECT_EQ(g.key, c.key);
    ASSERT_LE(g.offset + g.tokens, query.size());
    EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), query.begin() + static_cast<std::ptrdiff_t>(g.offset)));
  }
}

TEST_F(ChunkMatcherTest, ChunksAccessorDescribesPutsSplit) {
  std::mt19937 rng(1);
  const auto doc = Random(rng, 100);  // 32 + 32 + 32 + 4
  Put("doc", doc);
  const auto chunks = Chunks("doc");
  ASSERT_EQ(chunks.size(), 4u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].index, i);
    EXPECT_EQ(chunks[i].begin, i * kChunk);
    EXPECT_EQ(chunks[i].tokens.size(), i < 3 ? kChunk : 4u);
    EXPECT_TRUE(std::equal(chunks[i].tokens.begin(), chunks[i].tokens.end(), doc.begin() + i * kChunk));
    EXPECT_EQ(chunks[i].key, store_->ContentKey(m_, "ns", chunks[i].tokens));
    EXPECT_GE(store_->chain().Locate(chunks[i].key), 0);
  }
  EXPECT_EQ(index_->Chunks(m_, "ns", "nope").status().code(), Code::kNotFound);
  EXPECT_EQ(index_->Chunks(m_, "other", "doc").status().code(), Code::kNotFound);
}

// (1) Pieces of three documents (full chunks and short last chunks) in
// shuffled order, random filler before, between and after them.
TEST_F(ChunkMatcherTest, FindsChunksAtArbitraryOffsets) {
  std::mt19937 rng(2);
  const std::vector<std::pair<std::string, size_t>> docs = {{"alpha", 100}, {"beta", 70}, {"gamma", 64}};
  std::vector<std::pair<std::string, store::ChunkInfo>> pieces;
  for (const auto& [id, n] : docs) {
    Put(id, Random(rng, n));
    for (auto& c : Chunks(id)) pieces.emplace_back(id, std::move(c));
  }
  ASSERT_EQ(pieces.size(), 4u + 3u + 2u);
  ChunkMatcher matcher(*index_);
  EXPECT_EQ(matcher.IndexedChunks(m_, "ns"), pieces.size());
  std::uniform_int_distribution<size_t> gap(0, 40);
  for (int round = 0; round < 20; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::shuffle(pieces.begin(), pieces.end(), rng);
    std::vector<std::int32_t> query = Random(rng, 1 + gap(rng));  // never at offset 0
    std::vector<Expected> want;
    for (size_t i = 0; i < pieces.size(); ++i) {
      if ((round + i) % 4 == 3) continue;  // leave some chunks out
      want.push_back({query.size(), pieces[i].first, pieces[i].second.index});
      Append(query, pieces[i].second.tokens);
      Append(query, Random(rng, gap(rng)));  // sometimes none: chunks back to back
    }
    const Matches got = matcher.Match(m_, "ns", query);
    ExpectMatches(got, want, query, *index_, m_);
    EXPECT_EQ(got.rejected, 0u);  // random filler never shares a 16-token window with a chunk
    EXPECT_EQ(got.checked, want.size());
  }
}

// The same with a window longer than a chunk: every chunk is filed under its
// whole length, and the scan still finds them.
TEST_F(ChunkMatcherTest, WindowLongerThanTheChunks) {
  std::mt19937 rng(3);
  Put("doc", Random(rng, 80));  // 32 + 32 + 16
  const auto chunks = Chunks("doc");
  MatcherOptions o;
  o.window = 64;
  ChunkMatcher matcher(*index_, o);
  std::vector<std::int32_t> query = Random(rng, 9);
  std::vector<Expected> want;
  for (int i : {2, 0, 1}) {
    want.push_back({query.size(), "doc", static_cast<std::uint32_t>(i)});
    Append(query, chunks[static_cast<size_t>(i)].tokens);
    Append(query, Random(rng, 5));
  }
  ExpectMatches(matcher.Match(m_, "ns", query), want, query, *index_, m_);
}

// (2) The first window of a chunk (and more) is in the query, the rest is
// not: the full key rejects it.
TEST_F(ChunkMatcherTest, RejectsAChunkWhoseFirstWindowMatchesButNotTheRest) {
  std::mt19937 rng(4);
  Put("doc", Random(rng, kChunk));
  const auto chunk = Chunks("doc")[0].tokens;
  ChunkMatcher matcher(*index_);

  for (size_t differ : {size_t{16}, size_t{20}, size_t{kChunk - 1}}) {
    SCOPED_TRACE("differs at " + std::to_string(differ));
    std::vector<std::int32_t> query = Random(rng, 5);
    std::vector<std::int32_t> altered = chunk;
    altered[differ] = altered[differ] == 3 ? 4 : 3;
    Append(query, altered);
    Append(query, Random(rng, 5));
    const Matches got = matcher.Match(m_, "ns", query);
    EXPECT_TRUE(got.matches.empty());
    EXPECT_EQ(got.checked, 1u);
    EXPECT_EQ(got.rejected, 1u);
  }
  // The query ends inside the chunk: nothing to check.
  std::vector<std::int32_t> cut = Random(rng, 5);
  Append(cut, std::span<const std::int32_t>(chunk).first(20));
  const Matches got = matcher.Match(m_, "ns", cut);
  EXPECT_TRUE(got.matches.empty());
  EXPECT_EQ(got.checked, 0u);
  // Unaltered, it matches.
  std::vector<std::int32_t> whole = Random(rng, 5);
  Append(whole, chunk);
  ExpectMatches(matcher.Match(m_, "ns", whole), {{5, "doc", 0}}, whole, *index_, m_);
}

// The greedy scan the matcher documents, with tokens compared instead of
// keys: what it must find and how many candidates it must check and reject
// when every window of every width collides.
Matches Reference(const std::vector<std::pair<std::string, store::ChunkInfo>>& chunks,
                  std::span<const std::int32_t> query) {
  auto order = chunks;
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second.tokens.size() != b.second.tokens.size()) return a.second.tokens.size() > b.second.tokens.size();
    if (a.first != b.first) return a.first < b.first;
    return a.second.index < b.second.index;
  });
  Matches out;
  for (size_t p = 0; p < query.size();) {
    bool found = false;
    for (const auto& [id, c] : order) {
      if (p + c.tokens.size() > query.size()) continue;
      ++out.checked;
      if (!std::equal(c.tokens.begin(), c.tokens.end(), query.begin() + static_cast<std::ptrdiff_t>(p))) {
        ++out.rejected;
        continue;
      }
      out.matches.push_back({p, c.tokens.size(), id, c.index, c.key});
      p += c.tokens.size();
      found = true;
      break;
    }
    if (!found) ++p;
  }
  return out;
}

// (3) A degenerate window hash puts every window of the query in the bucket
// of every chunk: only the full key stands between them and a false match.
TEST_F(ChunkMatcherTest, ForcedWindowHashCollisionsAreRejectedAndCounted) {
  std::mt19937 rng(5);
  Put("a", Random(rng, kChunk));       // one chunk of 32
  Put("b", Random(rng, kChunk + 8));   // 32 + 8
  std::vector<std::pair<std::string, store::ChunkInfo>> chunks;
  for (const char* id : {"a", "b"}) {
    for (auto& c : Chunks(id)) chunks.emplace_back(id, std::move(c));
  }
  for (std::uint32_t window : {1u, 16u}) {
    SCOPED_TRACE("window " + std::to_string(window));
    MatcherOptions o;
    o.window = window;
    std::atomic<std::uint64_t> calls{0};
    o.window_hash = [&calls](std::span<const std::int32_t>) {
      ++calls;
      return std::uint64_t{42};
    };
    ChunkMatcher matcher(*index_, o);
    std::vector<std::int32_t> query = Random(rng, 5);
    Append(query, chunks[2].second.tokens);  // b's 8-token last chunk
    Append(query, Random(rng, 3));
    Append(query, chunks[0].second.tokens);  // a's chunk
    Append(query, Random(rng, 2));
    const Matches got = matcher.Match(m_, "ns", query);
    ExpectMatches(got, {{5, "b", 1}, {16, "a", 0}}, query, *index_, m_);
    const Matches want = Reference(chunks, query);
    EXPECT_EQ(got.checked, want.checked);
    EXPECT_EQ(got.rejected, want.rejected);
    EXPECT_GT(got.rejected, 20u);
    EXPECT_GT(calls.load(), 0u);  // the hook was used
  }
}

// (4) Documents of another namespace or another model never match.
TEST_F(ChunkMatcherTest, MatchesOnlyWithinTheSameNamespaceAndModel) {
  std::mt19937 rng(6);
  const auto tokens = Random(rng, 40);
  Put("doc", tokens, "tenant-a");
  const store::ModelKv other = Model("stories260K-finetuned");
  ChunkMatcher matcher(*index_);
  std::vector<std::int32_t> query = Random(rng, 3);
  Append(query, tokens);
  EXPECT_TRUE(matcher.Match(m_, "tenant-b", query).matches.empty());
  EXPECT_TRUE(matcher.Match(other, "tenant-a", query).matches.empty());
  EXPECT_EQ(matcher.IndexedChunks(m_, "tenant-b"), 0u);
  ExpectMatches(matcher.Match(m_, "tenant-a", query), {{3, "doc", 0}, {35, "doc", 1}}, query, *index_, m_,
                "tenant-a");
  // The same tokens put in the other tenant under another name match there, as that document.
  Put("copy", tokens, "tenant-b");
  ExpectMatches(matcher.Match(m_, "tenant-b", query), {{3, "copy", 0}, {35, "copy", 1}}, query, *index_, m_,
                "tenant-b");
  Put("doc", tokens, "tenant-a", &other);
  EXPECT_EQ(matcher.Match(other, "tenant-a", query).matches.size(), 2u);
}

// (5) Documents put, replaced, deleted or expired after the matcher built its
// index are seen by the next match.
TEST_F(ChunkMatcherTest, FollowsDocumentsAddedReplacedDeletedAndExpired) {
  std::mt19937 rng(7);
  const auto a = Random(rng, kChunk), b = Random(rng, kChunk), b2 = Random(rng, kChunk);
  Put("a", a);
  ChunkMatcher matcher(*index_);
  std::vector<std::int32_t> query = Random(rng, 4);
  Append(query, a);
  Append(query, Random(rng, 4));
  Append(query, b);
  ExpectMatches(matcher.Match(m_, "ns", query), {{4, "a", 0}}, query, *index_, m_);

  Put("b", b);  // added
  ExpectMatches(matcher.Match(m_, "ns", query), {{4, "a", 0}, {40, "b", 0}}, query, *index_, m_);
  EXPECT_EQ(matcher.IndexedChunks(m_, "ns"), 2u);

  ASSERT_TRUE(index_->Delete(m_, "ns", "a").ok());  // deleted
  ExpectMatches(matcher.Match(m_, "ns", query), {{40, "b", 0}}, query, *index_, m_);
  EXPECT_EQ(matcher.IndexedChunks(m_, "ns"), 1u);

  Put("b", b2);  // replaced: the old content is gone, the new one matches
  EXPECT_TRUE(matcher.Match(m_, "ns", query).matches.empty());
  std::vector<std::int32_t> query2 = Random(rng, 1);
  Append(query2, b2);
  ExpectMatches(matcher.Match(m_, "ns", query2), {{1, "b", 0}}, query2, *index_, m_);

  ASSERT_TRUE(index_->Expire(m_, "ns", "b", 1'000'000'000).ok());  // expired, with nobody sweeping
  EXPECT_EQ(matcher.Match(m_, "ns", query2).matches.size(), 1u);
  clock_.Advance(std::chrono::seconds(2));
  EXPECT_TRUE(matcher.Match(m_, "ns", query2).matches.empty());
  EXPECT_EQ(matcher.IndexedChunks(m_, "ns"), 0u);
}

// (6) A document's last chunk, shorter than the window, is filed under its
// own length and matches anywhere, alone or next to full chunks; a minimum
// length keeps the shortest ones out.
TEST_F(ChunkMatcherTest, ShortLastChunksMatch) {
  std::mt19937 rng(8);
  Put("doc", Random(rng, kChunk + 3));  // 32 + 3
  Put("other", Random(rng, kChunk + 11));  // 32 + 11
  const auto doc = Chunks("doc"), other = Chunks("other");
  ChunkMatcher matcher(*index_);
  std::vector<std::int32_t> query = Random(rng, 7);
  Append(query, doc[1].tokens);        // 3 tokens at 7
  Append(query, Random(rng, 6));
  Append(query, other[1].tokens);      // 11 tokens at 16
  Append(query, other[0].tokens);      // 32 tokens at 27, right after
  Append(query, doc[1].tokens);        // 3 tokens at 59
  ExpectMatches(matcher.Match(m_, "ns", query), {{7, "doc", 1}, {16, "other", 1}, {27, "other", 0}, {59, "doc", 1}},
                query, *index_, m_);
  // A query that is exactly one short chunk.
  ExpectMatches(matcher.Match(m_, "ns", doc[1].tokens), {{0, "doc", 1}}, doc[1].tokens, *index_, m_);

  MatcherOptions o;
  o.min_chunk_tokens = 4;
  ChunkMatcher longer(*index_, o);
  EXPECT_EQ(longer.IndexedChunks(m_, "ns"), 3u);
  ExpectMatches(longer.Match(m_, "ns", query), {{16, "other", 1}, {27, "other", 0}}, query, *index_, m_);
}

// (7) Nothing to find in an empty query, or in one shorter than every chunk.
TEST_F(ChunkMatcherTest, EmptyAndShortQueries) {
  std::mt19937 rng(9);
  const auto tokens = Random(rng, kChunk);
  Put("doc", tokens);
  ChunkMatcher matcher(*index_);
  const Matches empty = matcher.Match(m_, "ns", {});
  EXPECT_TRUE(empty.matches.empty());
  EXPECT_EQ(empty.checked, 0u);
  for (size_t n : {size_t{1}, size_t{10}, size_t{16}, size_t{kChunk - 1}}) {
    const Matches got = matcher.Match(m_, "ns", std::span<const std::int32_t>(tokens).first(n));
    EXPECT_TRUE(got.matches.empty()) << n;
    EXPECT_EQ(got.checked, 0u) << n;
  }
  // And in a scope with no documents at all.
  EXPECT_TRUE(matcher.Match(m_, "empty", tokens).matches.empty());
}

// A document's chunk shared with another document (the same content key)
// is reported once, as the first document in doc_id order.
TEST_F(ChunkMatcherTest, SharedChunksAreReportedOnce) {
  std::mt19937 rng(10);
  const auto shared = Random(rng, kChunk);
  std::vector<std::int32_t> x = shared, y = Random(rng, kChunk);
  Append(x, Random(rng, kChunk));
  Append(y, shared);
  Put("y", y);
  Put("x", x);
  ChunkMatcher matcher(*index_);
  std::vector<std::int32_t> query = Random(rng, 2);
  Append(query, shared);
  const Matches got = matcher.Match(m_, "ns", query);
  ExpectMatches(got, {{2, "x", 0}}, query, *index_, m_);
  EXPECT_EQ(got.rejected, 0u);
}

// Matches and index changes from several threads: every match is the
// content it claims (checked by ExpectMatches' token comparison).
TEST_F(ChunkMatcherTest, ConcurrentMatchesAndChanges) {
  std::mt19937 rng(11);
  std::vector<std::vector<std::int32_t>> docs;
  for (int i = 0; i < 6; ++i) docs.push_back(Random(rng, 48));
  std::vector<std::int32_t> query = Random(rng, 3);
  for (const auto& d : docs) {
    Append(query, d);
    Append(query, Random(rng, 2));
  }
  ChunkMatcher matcher(*index_);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int round = 0; round < 60; ++round) {
      const std::string id = "doc" + std::to_string(round % docs.size());
      if (round % 3 == 2) {
        (void)index_->Delete(m_, "ns", id);
      } else {
        Kv kv(48);
        EXPECT_TRUE(index_->Put(m_, "ns", id, 1, "", docs[static_cast<size_t>(round) % docs.size()], kv.view).ok());
      }
    }
    stop = true;
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      while (!stop) {
        const Matches got = matcher.Match(m_, "ns", query);
        EXPECT_EQ(got.rejected, 0u);
        for (const ChunkMatch& g : got.matches) {
          ASSERT_LE(g.offset + g.tokens, query.size());
          EXPECT_EQ(g.key, store_->ContentKey(m_, "ns", std::span<const std::int32_t>(query).subspan(g.offset, g.tokens)));
        }
      }
    });
  }
  writer.join();
  for (auto& r : readers) r.join();
}

}  // namespace
}  // namespace kdn::blend
