// SPDX-License-Identifier: Apache-2.0
// Knowledge items on the node (wire/node.capnp, protocol version 2) over
// real Cap'n Proto RPC on loopback: a kdnd on a thread of this process,
// clients on the test's thread, chunks of the reference model's real KV.
// Covers registration and listing, tenant isolation, pins under eviction
// pressure, reference-counted deletes, hit counting, replacement, typed
// errors and bounds, and the registry file across restarts (and its
// corruption). Also the [knowledge] table of the configuration.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "reference_kv.h"
#include "rpc_client.h"
#include "running_server.h"
#include "server/server.h"
#include "core/wire/node.capnp.h"

namespace kdn::server {
namespace {

namespace fs = std::filesystem;
using namespace testing_support;
using wire::node::ErrorCode;
using wire::node::Session;

constexpr const char* kTokenA = "knowledge-token-tenant-a-01";
constexpr const char* kTokenB = "knowledge-token-tenant-b-02";
constexpr const char* kTokenOps = "knowledge-token-operator-03";

std::uint64_t NowMs() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}


class KnowledgeNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    dir_ = fs::temp_directory_path() / ("kdn-knowledge-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ref_ = testing::PrefillReference(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog.");
    model_ = ref_.m.fingerprint;
    // Four 4-token chunks: k0 starts both documents; k1 follows it in A,
    // k2 in B; k3 is a chunk of its own.
    e0_ = MakeEnvelope(ref_, "tenant-a", 0, 4);
    e1_ = MakeEnvelope(ref_, "tenant-a", 4, 4, e0_.key);
    e2_ = MakeEnvelope(ref_, "tenant-a", 8, 4, e0_.key);
    e3_ = MakeEnvelope(ref_, "tenant-a", 12, 4);
    doc_a_ = {"doc-a", 1, R"({"title":"A"})", 8, model_, {e0_.key, e1_.key}};
    doc_b_ = {"doc-b", 7, R"({"title":"B"})", 8, model_, {e0_.key, e2_.key}};
  }
  void TearDown() override {
    node_.reset();
    fs::remove_all(dir_);
  }

  ServerConfig Config(std::uint64_t host_bytes = 64 << 20, bool disk = false) {
    ServerConfig c;
    c.listen = {"127.0.0.1:0"};
    c.metrics = "";
    store::TierSpec host;
    host.capacity_bytes = host_bytes;
    host.write_through = disk;  // every chunk reaches the disk tier
    c.tiers = {host};
    if (disk) {
      store::TierSpec d;
      d.kind = store::TierSpec::Kind::kDisk;
      d.path = (dir_ / "disk").string();
      d.capacity_bytes = 64 << 20;
      d.fsync = false;
      c.tiers.push_back(d);
    }
    c.tokens = {{"a", kTokenA, {"tenant-a"}, false}, {"b", kTokenB, {"tenant-b"}, false}, {"ops", kTokenOps, {"*"}, true}};
    return c;
  }
  void Start(const ServerConfig& c) {
    node_.reset();
    node_ = std::make_unique<RunningServer>(c);
  }

  ErrorCode Put(Client& c, Session::Client& s, const Envelope& e, const std::string& ns = "tenant-a") {
    auto req = s.putRequest();
    const keys::Digest h = keys::NamespaceHash(ns);
    req.setNamespace(AsData(h));
    req.initEnvelopes(1).set(0, capnp::Data::Reader(e.bytes.data(), e.bytes.size()));
    auto r = req.send().wait(c.io.waitScope);
    if (r.getError().getCode() != ErrorCode::OK) return r.getError().getCode();
    return r.getResults()[0].getCode();
  }
  // Whether the node holds the chunk (a one-key lookup).
  bool Held(Client& c, Session::Client& s, const keys::Digest& key, const std::string& ns = "tenant-a") {
    auto req = s.lookupRequest();
    const keys::Digest h = keys::NamespaceHash(ns);
    req.setNamespace(AsData(h));
    req.initRequests(1)[0].initKeys(1).set(0, AsData(key));
    auto r = req.send().wait(c.io.waitScope);
    EXPECT_EQ(r.getError().getCode(), ErrorCode::OK);
    return r.getError().getCode() == ErrorCode::OK && r.getResults()[0].getPrefix() == 1;
  }
  // Served chunks of a get.
  unsigned Get(Client& c, Session::Client& s, const std::vector<keys::Digest>& keys) {
    auto req = s.getRequest();
    const keys::Digest h = keys::NamespaceHash("tenant-a");
    req.setNamespace(AsData(h));
    auto list = req.initKeys(static_cast<unsigned>(keys.size()));
    for (unsigned i = 0; i < keys.size(); ++i) list.set(i, AsData(keys[i]));
    auto r = req.send().wait(c.io.waitScope);
    EXPECT_EQ(r.getError().getCode(), ErrorCode::OK);
    unsigned n = 0;
    for (auto g : r.getChunks()) n += g.isEnvelope() ? 1 : 0;
    return n;
  }
  // `n` chunks of 4 tokens no document references, each under its own key.
  void Fill(Client& c, Session::Client& s, int n, std::uint8_t salt) {
    for (int i = 0; i < n; ++i) {
      keys::Digest prev{};
      prev[0] = salt;
      prev[1] = static_cast<std::uint8_t>(i);
      prev[2] = static_cast<std::uint8_t>(i >> 8);
      ASSERT_EQ(Put(c, s, MakeEnvelope(ref_, "tenant-a", 16, 4, prev)), ErrorCode::OK);
    }
  }
  std::map<std::string, ListedDoc> List(Client& c, Session::Client& s, const std::string& ns = "tenant-a") {
    std::vector<ListedDoc> docs;
    EXPECT_EQ(KnowledgeList(c, s, ns, &docs), ErrorCode::OK);
    std::map<std::string, ListedDoc> out;
    for (ListedDoc& d : docs) out[d.doc_id] = std::move(d);
    return out;
  }

  // A node service with a 16 MiB host tier, called directly (no RPC).
  static std::unique_ptr<NodeService> Service() {
    NodeOptions o;
    store::TierSpec host;
    host.capacity_bytes = 16 << 20;
    o.tiers = {host};
    auto created = NodeService::Create(o);
    EXPECT_TRUE(created.ok()) << created.status().message();
    return created.ok() ? std::move(created).value() : nullptr;
  }
  // A document `id` of `keys` keys of its own (by the id's last character).
  TestDoc Doc(const std::string& id, std::uint64_t version, size_t keys) const {
    TestDoc d{id, version, "", 4 * keys, model_, {}};
    for (size_t i = 0; i < keys; ++i) {
      keys::Digest k{};
      k[0] = static_cast<std::uint8_t>(id.back());
      k[1] = static_cast<std::uint8_t>(i);
      d.keys.push_back(k);
    }
    return d;
  }

  fs::path dir_;
  testing::ReferenceKv ref_;
  keys::Digest model_{};
  Envelope e0_, e1_, e2_, e3_;
  TestDoc doc_a_, doc_b_;
  std::unique_ptr<RunningServer> node_;
};

TEST_F(KnowledgeNodeTest, RegisteredDocumentsAreListedWithWhatTheNodeHolds) {
  Start(Config());
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  auto h = c.node.healthRequest().send().wait(c.io.waitScope);
  EXPECT_GE(h.getHealth().getProtocol(), 2u);  // knowledge items came with version 2
  // Chunks k0 and k1 are stored; B's k2 is not (yet).
  ASSERT_EQ(Put(c, s, e0_), ErrorCode::OK);
  ASSERT_EQ(Put(c, s, e1_), ErrorCode::OK);
  const std::uint64_t before = NowMs();
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
  const std::uint64_t after = NowMs();

  auto docs = List(c, s);
  ASSERT_EQ(docs.size(), 2u);
  const ListedDoc& a = docs["doc-a"];
  EXPECT_EQ(a.version, 1u);
  EXPECT_EQ(a.metadata, R"({"title":"A"})");
  EXPECT_EQ(a.tokens, 8u);
  EXPECT_EQ(a.model, std::vector<std::uint8_t>(model_.begin(), model_.end()));
  EXPECT_EQ(a.chunks, 2u);
  EXPECT_EQ(a.chunks_held, 2u);
  EXPECT_FALSE(a.pinned);
  EXPECT_EQ(a.pin_expires_ms, 0u);
  EXPECT_GE(a.registered_ms, before);
  EXPECT_LE(a.registered_ms, after);
  EXPECT_EQ(a.hits, 0u);
  const ListedDoc& b = docs["doc-b"];
  EXPECT_EQ(b.version, 7u);
  EXPECT_EQ(b.chunks, 2u);
  EXPECT_EQ(b.chunks_held, 1u);  // k2 was never put
  // Registering describes chunks, it stores none; a later put counts.
  ASSERT_EQ(Put(c, s, e2_), ErrorCode::OK);
  EXPECT_EQ(List(c, s)["doc-b"].chunks_held, 2u);

  // The same doc_id under another model is another document.
  TestDoc other = doc_a_;
  other.model[0] ^= 1;
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", other), ErrorCode::OK);
  std::vector<ListedDoc> all;
  ASSERT_EQ(KnowledgeList(c, s, "tenant-a", &all), ErrorCode::OK);
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(node_->server().service().Stats()[NodeStat::kDocuments], 3u);
  Session::Client ops = c.MustLogin(kTokenOps);
  auto st = ops.statsRequest().send().wait(c.io.waitScope);
  ASSERT_EQ(st.getError().getCode(), ErrorCode::OK);
  EXPECT_EQ(st.getStats().getDocuments(), 3u);
  EXPECT_EQ(st.getStats().getRegistryLoadFailures(), 0u);
}

TEST_F(KnowledgeNodeTest, ATokenForAnotherNamespaceNeitherSeesNorTouchesTheDocuments) {
  Start(Config());
  Client c(node_->bound().rpc[0]);
  Session::Client sa = c.MustLogin(kTokenA);
  Session::Client sb = c.MustLogin(kTokenB);
  ASSERT_EQ(Put(c, sa, e0_), ErrorCode::OK);
  ASSERT_EQ(Put(c, sa, e1_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, sa, "tenant-a", doc_a_), ErrorCode::OK);

  std::vector<ListedDoc> seen;
  EXPECT_EQ(KnowledgeList(c, sb, "tenant-a", &seen), ErrorCode::PERMISSION_DENIED);
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(KnowledgePin(c, sb, "tenant-a", model_, "doc-a", true, 0), ErrorCode::PERMISSION_DENIED);
  EXPECT_EQ(KnowledgeDelete(c, sb, "tenant-a", model_, "doc-a"), ErrorCode::PERMISSION_DENIED);
  EXPECT_EQ(KnowledgePut(c, sb, "tenant-a", doc_b_), ErrorCode::PERMISSION_DENIED);
  // Refused before anything else is looked at: a malformed docId in A's
  // namespace says nothing either.
  EXPECT_EQ(KnowledgePin(c, sb, "tenant-a", model_, "", true, 0), ErrorCode::PERMISSION_DENIED);
  EXPECT_EQ(KnowledgeDelete(c, sb, "tenant-a", model_, "no-such-doc"), ErrorCode::PERMISSION_DENIED);
  // In its own namespace, B sees nothing of A's, and its document of the
  // same name is its own.
  EXPECT_TRUE(List(c, sb, "tenant-b").empty());
  TestDoc b_doc = doc_a_;
  b_doc.metadata = "b's";
  ASSERT_EQ(KnowledgePut(c, sb, "tenant-b", b_doc), ErrorCode::OK);
  EXPECT_EQ(KnowledgePin(c, sb, "tenant-b", model_, "doc-a", true, 0), ErrorCode::OK);
  auto a_docs = List(c, sa);
  ASSERT_EQ(a_docs.size(), 1u);
  EXPECT_EQ(a_docs["doc-a"].metadata, R"({"title":"A"})");
  EXPECT_FALSE(a_docs["doc-a"].pinned);
  EXPECT_EQ(a_docs["doc-a"].chunks_held, 2u);
  EXPECT_EQ(List(c, sb, "tenant-b")["doc-a"].chunks_held, 0u);  // B's keys name B's objects
  // B's delete erased nothing of A's.
  std::uint32_t erased = 99;
  EXPECT_EQ(KnowledgeDelete(c, sb, "tenant-b", model_, "doc-a", &erased), ErrorCode::OK);
  EXPECT_EQ(erased, 0u);
  EXPECT_TRUE(Held(c, sa, e0_.key));
  EXPECT_EQ(List(c, sa).size(), 1u);
  // The operator's "*" token reaches A's documents.
  Session::Client ops = c.MustLogin(kTokenOps);
  EXPECT_EQ(List(c, ops, "tenant-a").size(), 1u);
  EXPECT_GE(node_->server().service().Stats()[NodeStat::kAuthFailures], 6u);
}

TEST_F(KnowledgeNodeTest, PinnedDocumentsSurviveEvictionPressureAndUnpinReleasesWhatNoOtherPinHolds) {
  // A host tier of 128 KiB and nothing below it: about 24 chunks, the
  // rest evicted for good.
  Start(Config(128 << 10));
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  for (const Envelope* e : {&e0_, &e1_, &e2_}) ASSERT_EQ(Put(c, s, *e), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
  // C is registered, and pinned, before its chunk arrives.
  const TestDoc doc_c{"doc-c", 1, "", 4, model_, {e3_.key}};
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_c), ErrorCode::OK);

  std::uint32_t pinned = 99;
  const std::uint64_t before = NowMs();
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-a", true, 0, &pinned), ErrorCode::OK);
  EXPECT_EQ(pinned, 2u);
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-b", true, 3600 * 1000, &pinned), ErrorCode::OK);
  EXPECT_EQ(pinned, 2u);
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-c", true, 0, &pinned), ErrorCode::OK);
  EXPECT_EQ(pinned, 0u);  // its chunk is not there yet
  ASSERT_EQ(Put(c, s, e3_), ErrorCode::OK);  // pinned as it comes
  auto docs = List(c, s);
  EXPECT_TRUE(docs["doc-a"].pinned);
  EXPECT_EQ(docs["doc-a"].pin_expires_ms, 0u);
  EXPECT_TRUE(docs["doc-b"].pinned);
  EXPECT_GE(docs["doc-b"].pin_expires_ms, before + 3600 * 1000);
  EXPECT_LE(docs["doc-b"].pin_expires_ms, NowMs() + 3600 * 1000);
  EXPECT_EQ(node_->server().service().chain().Counters().pins_active, 4u);  // k0, k1, k2, k3

  // Unpinning B leaves k0 pinned: A holds it.
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-b", false, 0, &pinned), ErrorCode::OK);
  EXPECT_EQ(pinned, 1u);
  docs = List(c, s);
  EXPECT_FALSE(docs["doc-b"].pinned);
  EXPECT_EQ(docs["doc-b"].pin_expires_ms, 0u);
  EXPECT_EQ(node_->server().service().chain().Counters().pins_active, 3u);

  // Five times the tier's capacity of other chunks.
  Fill(c, s, 120, 0xF1);
  EXPECT_GT(node_->server().service().Stats().tiers[0][TierStat::kEvictions], 90u);
  EXPECT_TRUE(Held(c, s, e0_.key));
  EXPECT_TRUE(Held(c, s, e1_.key));
  EXPECT_TRUE(Held(c, s, e3_.key));
  EXPECT_FALSE(Held(c, s, e2_.key));  // B's own chunk, unpinned, went
  docs = List(c, s);
  EXPECT_EQ(docs["doc-a"].chunks_held, 2u);
  EXPECT_EQ(docs["doc-b"].chunks_held, 1u);

  // Unpinned, A's chunks go the way of the others.
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-a", false, 0, &pinned), ErrorCode::OK);
  EXPECT_EQ(pinned, 0u);
  Fill(c, s, 120, 0xF2);
  EXPECT_FALSE(Held(c, s, e0_.key));
  EXPECT_FALSE(Held(c, s, e1_.key));
  EXPECT_TRUE(Held(c, s, e3_.key));  // C is still pinned
  EXPECT_EQ(List(c, s)["doc-a"].chunks_held, 0u);
}

TEST_F(KnowledgeNodeTest, DeleteErasesOnlyTheChunksNoOtherDocumentReferences) {
  Start(Config());
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  for (const Envelope* e : {&e0_, &e1_, &e2_}) ASSERT_EQ(Put(c, s, *e), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-a", true, 0), ErrorCode::OK);
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-b", true, 0), ErrorCode::OK);

  std::uint32_t erased = 99;
  ASSERT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "doc-a", &erased), ErrorCode::OK);
  EXPECT_EQ(erased, 1u);  // k1; k0 is B's too
  EXPECT_TRUE(Held(c, s, e0_.key));
  EXPECT_FALSE(Held(c, s, e1_.key));
  EXPECT_TRUE(Held(c, s, e2_.key));
  auto docs = List(c, s);
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs.count("doc-b"), 1u);
  EXPECT_TRUE(docs["doc-b"].pinned);
  EXPECT_EQ(node_->server().service().chain().Counters().pins_active, 2u);  // B's k0 and k2
  EXPECT_EQ(node_->server().service().Stats()[NodeStat::kDeletes], 1u);                 // counted as a delete call's

  ASSERT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "doc-b", &erased), ErrorCode::OK);
  EXPECT_EQ(erased, 2u);
  EXPECT_FALSE(Held(c, s, e0_.key));
  EXPECT_FALSE(Held(c, s, e2_.key));
  EXPECT_TRUE(List(c, s).empty());
  EXPECT_EQ(node_->server().service().Stats()[NodeStat::kDocuments], 0u);
  EXPECT_EQ(node_->server().service().chain().Counters().pins_active, 0u);
  // Gone: a second delete, or a pin, finds nothing.
  EXPECT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "doc-b", &erased), ErrorCode::NOT_FOUND);
  EXPECT_EQ(erased, 0u);
  EXPECT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-b", true, 0), ErrorCode::NOT_FOUND);
}

TEST_F(KnowledgeNodeTest, GetCreditsEachServedChunkToTheDocumentsReferencingIt) {
  Start(Config());
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  for (const Envelope* e : {&e0_, &e1_, &e2_, &e3_}) ASSERT_EQ(Put(c, s, *e), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
  // k0 (both), k1 (A), k2 (B), k3 (neither), and a key never stored.
  EXPECT_EQ(Get(c, s, {e0_.key, e1_.key, e2_.key, e3_.key, keys::Digest{}}), 4u);
  auto docs = List(c, s);
  EXPECT_EQ(docs["doc-a"].hits, 2u);
  EXPECT_EQ(docs["doc-b"].hits, 2u);
  EXPECT_EQ(Get(c, s, {e0_.key, e0_.key}), 2u);
  docs = List(c, s);
  EXPECT_EQ(docs["doc-a"].hits, 4u);
  EXPECT_EQ(docs["doc-b"].hits, 4u);
  // A miss credits nothing.
  std::uint32_t erased = 0;
  auto del = s.deleteRequest();
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  del.setNamespace(AsData(ns));
  del.initKeys(1).set(0, AsData(e1_.key));
  erased = del.send().wait(c.io.waitScope).getErased();
  ASSERT_EQ(erased, 1u);
  EXPECT_EQ(Get(c, s, {e1_.key}), 0u);
  EXPECT_EQ(List(c, s)["doc-a"].hits, 4u);
}

TEST_F(KnowledgeNodeTest, APutOfARegisteredDocumentReplacesIt) {
  Start(Config());
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  for (const Envelope* e : {&e0_, &e1_, &e2_}) ASSERT_EQ(Put(c, s, *e), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-a", true, 0), ErrorCode::OK);
  ASSERT_EQ(Get(c, s, {e0_.key, e1_.key}), 2u);
  const ListedDoc v1 = List(c, s)["doc-a"];
  ASSERT_EQ(v1.hits, 2u);

  // The same version again (an engine registering after its restart): the
  // metadata is updated, the registration, hits and pin stand.
  TestDoc again = doc_a_;
  again.metadata = "refreshed";
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", again), ErrorCode::OK);
  ListedDoc now = List(c, s)["doc-a"];
  EXPECT_EQ(now.metadata, "refreshed");
  EXPECT_EQ(now.registered_ms, v1.registered_ms);
  EXPECT_EQ(now.hits, 2u);
  EXPECT_TRUE(now.pinned);

  // Version 2 has other chunks: k0 and k2. It is a new registration (no
  // hits yet) and keeps the document's pin, now on its own chunks.
  TestDoc v2 = doc_a_;
  v2.version = 2;
  v2.metadata = "v2";
  v2.tokens = 8;
  v2.keys = {e0_.key, e2_.key};
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", v2), ErrorCode::OK);
  auto docs = List(c, s);
  ASSERT_EQ(docs.size(), 1u);
  now = docs["doc-a"];
  EXPECT_EQ(now.version, 2u);
  EXPECT_EQ(now.metadata, "v2");
  EXPECT_EQ(now.chunks, 2u);
  EXPECT_EQ(now.chunks_held, 2u);
  EXPECT_EQ(now.hits, 0u);
  EXPECT_GE(now.registered_ms, v1.registered_ms);
  EXPECT_TRUE(now.pinned);
  EXPECT_EQ(node_->server().service().chain().Counters().pins_active, 2u);  // k0 and k2; k1 let go
  // A get of k1 credits nothing any more; its delete erases v2's chunks
  // and leaves k1, which lost its reference but was not erased.
  ASSERT_EQ(Get(c, s, {e1_.key}), 1u);
  EXPECT_EQ(List(c, s)["doc-a"].hits, 0u);
  std::uint32_t erased = 0;
  ASSERT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "doc-a", &erased), ErrorCode::OK);
  EXPECT_EQ(erased, 2u);
  EXPECT_TRUE(Held(c, s, e1_.key));
  EXPECT_FALSE(Held(c, s, e0_.key));
}

TEST_F(KnowledgeNodeTest, UnknownDocumentsAndMalformedRequestsGetTypedErrors) {
  Start(Config());
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  EXPECT_EQ(KnowledgePin(c, s, "tenant-a", model_, "no-such-doc", true, 0), ErrorCode::NOT_FOUND);
  EXPECT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "no-such-doc"), ErrorCode::NOT_FOUND);
  keys::Digest other_model = model_;
  other_model[31] ^= 0x80;
  EXPECT_EQ(KnowledgeDelete(c, s, "tenant-a", other_model, "doc-a"), ErrorCode::NOT_FOUND);

  // Bad fields: typed errors, nothing registered.
  TestDoc empty_id = doc_b_;
  empty_id.doc_id = "";
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", empty_id), ErrorCode::INVALID_ARGUMENT);
  TestDoc long_id = doc_b_;
  long_id.doc_id.assign(wire::node::MAX_DOC_ID_BYTES + 1, 'x');
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", long_id), ErrorCode::TOO_LARGE);
  TestDoc big_meta = doc_b_;
  big_meta.metadata.assign(wire::node::MAX_METADATA_BYTES + 1, 'm');
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", big_meta), ErrorCode::TOO_LARGE);
  TestDoc many = doc_b_;
  many.keys.assign(wire::node::MAX_KEYS_PER_CALL + 1, e0_.key);
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", many), ErrorCode::TOO_LARGE);
  const std::uint8_t five[5] = {1, 2, 3, 4, 5};
  {
    auto req = s.knowledgePutRequest();
    const keys::Digest ns = keys::NamespaceHash("tenant-a");
    req.setNamespace(AsData(ns));
    auto item = req.initItem();
    item.setDocId("short-model");
    item.setModel(capnp::Data::Reader(five, 5));
    EXPECT_EQ(req.send().wait(c.io.waitScope).getError().getCode(), ErrorCode::INVALID_ARGUMENT);
  }
  {
    auto req = s.knowledgePutRequest();
    const keys::Digest ns = keys::NamespaceHash("tenant-a");
    req.setNamespace(AsData(ns));
    auto item = req.initItem();
    item.setDocId("short-key");
    item.setModel(AsData(model_));
    item.initKeys(2).set(0, AsData(e0_.key));
    item.getKeys().set(1, capnp::Data::Reader(five, 5));
    EXPECT_EQ(req.send().wait(c.io.waitScope).getError().getCode(), ErrorCode::INVALID_ARGUMENT);
  }
  {
    auto req = s.knowledgeListRequest();
    req.setNamespace(capnp::Data::Reader(five, 3));
    EXPECT_EQ(req.send().wait(c.io.waitScope).getError().getCode(), ErrorCode::INVALID_ARGUMENT);
  }
  {
    auto req = s.knowledgePinRequest();
    const keys::Digest ns = keys::NamespaceHash("tenant-a");
    req.setNamespace(AsData(ns));
    req.setDocId("doc-a");
    req.setModel(capnp::Data::Reader(five, 5));
    req.setPin(true);
    EXPECT_EQ(req.send().wait(c.io.waitScope).getError().getCode(), ErrorCode::INVALID_ARGUMENT);
  }
  {
    // No item at all: an empty docId.
    auto req = s.knowledgePutRequest();
    const keys::Digest ns = keys::NamespaceHash("tenant-a");
    req.setNamespace(AsData(ns));
    EXPECT_EQ(req.send().wait(c.io.waitScope).getError().getCode(), ErrorCode::INVALID_ARGUMENT);
  }
  EXPECT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, ""), ErrorCode::INVALID_ARGUMENT);
  // The session still serves, and only A was ever registered.
  auto docs = List(c, s);
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs.count("doc-a"), 1u);
  EXPECT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "doc-a"), ErrorCode::OK);
}

TEST_F(KnowledgeNodeTest, TheConfiguredBoundsAreRefusedWithTypedErrors) {
  ServerConfig config = Config();
  config.knowledge.max_documents = 2;
  config.knowledge.max_keys_per_document = 3;
  config.knowledge.max_keys = 5;
  Start(config);
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d1", 1, 3)), ErrorCode::OK);
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d2", 1, 4)), ErrorCode::TOO_LARGE);  // per document
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d2", 1, 2)), ErrorCode::OK);
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d3", 1, 1)), ErrorCode::BUSY);  // documents
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d2", 2, 3)), ErrorCode::BUSY);  // keys of all: 6 > 5
  // Replacing within the bounds is fine at the limit.
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d2", 2, 1)), ErrorCode::OK);
  EXPECT_EQ(List(c, s)["d2"].version, 2u);
  ASSERT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "d1"), ErrorCode::OK);
  EXPECT_EQ(KnowledgePut(c, s, "tenant-a", Doc("d3", 1, 3)), ErrorCode::OK);
  EXPECT_EQ(List(c, s).size(), 2u);
}

// The bounds were the node's only: tenant A filling max_documents refused
// tenant B. Now each namespace has its own share within the node's.
TEST_F(KnowledgeNodeTest, ATenantThatFillsItsShareRefusesNobodyElse) {
  ServerConfig config = Config();
  config.knowledge.max_documents = 5;
  config.knowledge.max_keys = 100;
  config.knowledge.max_documents_per_namespace = 3;
  config.knowledge.max_keys_per_namespace = 7;
  Start(config);
  Client c(node_->bound().rpc[0]);
  Session::Client a = c.MustLogin(kTokenA);
  Session::Client b = c.MustLogin(kTokenB);
  for (const char* id : {"a1", "a2", "a3"}) ASSERT_EQ(KnowledgePut(c, a, "tenant-a", Doc(id, 1, 2)), ErrorCode::OK);
  EXPECT_EQ(KnowledgePut(c, a, "tenant-a", Doc("a4", 1, 1)), ErrorCode::BUSY);  // A's documents
  EXPECT_EQ(KnowledgePut(c, a, "tenant-a", Doc("a3", 2, 2)), ErrorCode::OK);    // a replacement fits
  EXPECT_EQ(KnowledgePut(c, a, "tenant-a", Doc("a3", 3, 4)), ErrorCode::BUSY);  // A's keys: 8 > 7
  // B is not refused for what A holds.
  ASSERT_EQ(KnowledgePut(c, b, "tenant-b", Doc("b1", 1, 2)), ErrorCode::OK);
  ASSERT_EQ(KnowledgePut(c, b, "tenant-b", Doc("b2", 1, 2)), ErrorCode::OK);
  // The node's bound still caps the sum (5 documents).
  EXPECT_EQ(KnowledgePut(c, b, "tenant-b", Doc("b3", 1, 1)), ErrorCode::BUSY);
  ASSERT_EQ(KnowledgeDelete(c, a, "tenant-a", model_, "a1"), ErrorCode::OK);
  EXPECT_EQ(KnowledgePut(c, b, "tenant-b", Doc("b3", 1, 1)), ErrorCode::OK);
  EXPECT_EQ(List(c, a, "tenant-a").size(), 2u);
  EXPECT_EQ(List(c, b, "tenant-b").size(), 3u);
}

TEST_F(KnowledgeNodeTest, TheRegistryIsSavedBesideTheDiskTierAndLoadedAfterARestart) {
  const ServerConfig config = Config(64 << 20, /*disk=*/true);
  Start(config);
  std::map<std::string, ListedDoc> saved;
  {
    Client c(node_->bound().rpc[0]);
    Session::Client s = c.MustLogin(kTokenA);
    for (const Envelope* e : {&e0_, &e1_, &e2_}) ASSERT_EQ(Put(c, s, *e), ErrorCode::OK);
    ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
    ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
    ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-a", true, 0), ErrorCode::OK);
    ASSERT_EQ(KnowledgePin(c, s, "tenant-a", model_, "doc-b", true, 3600 * 1000), ErrorCode::OK);
    ASSERT_EQ(Get(c, s, {e0_.key, e1_.key}), 2u);  // hits are saved with the rest
    Session::Client sb = c.MustLogin(kTokenB);
    ASSERT_EQ(KnowledgePut(c, sb, "tenant-b", TestDoc{"doc-of-b", 3, "b", 4, model_, {e3_.key}}), ErrorCode::OK);
    saved = List(c, s);
  }
  EXPECT_EQ(node_->server().service().knowledge().path(), (dir_ / "disk" / "knowledge.kdnreg").string());
  node_.reset();  // a graceful shutdown
  ASSERT_TRUE(fs::exists(dir_ / "disk" / "knowledge.kdnreg"));
  EXPECT_EQ(fs::status(dir_ / "disk" / "knowledge.kdnreg").permissions() & fs::perms::others_read, fs::perms::none);

  Start(config);
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  auto docs = List(c, s);
  ASSERT_EQ(docs.size(), 2u);
  for (const std::string id : {"doc-a", "doc-b"}) {
    SCOPED_TRACE(id);
    const ListedDoc& was = saved[id];
    const ListedDoc& is = docs[id];
    EXPECT_EQ(is.version, was.version);
    EXPECT_EQ(is.metadata, was.metadata);
    EXPECT_EQ(is.tokens, was.tokens);
    EXPECT_EQ(is.model, was.model);
    EXPECT_EQ(is.chunks, was.chunks);
    EXPECT_EQ(is.chunks_held, 2u);  // the disk tier kept them
    EXPECT_TRUE(is.pinned);
    EXPECT_EQ(is.pin_expires_ms, was.pin_expires_ms);
    EXPECT_EQ(is.registered_ms, was.registered_ms);
    EXPECT_EQ(is.hits, was.hits);
  }
  EXPECT_EQ(docs["doc-a"].hits, 2u);
  EXPECT_EQ(docs["doc-b"].hits, 1u);
  // The pins hold again: on the three chunks A and B share among them.
  EXPECT_EQ(node_->server().service().chain().Counters().pins_active, 3u);
  Session::Client sb = c.MustLogin(kTokenB);
  auto b_docs = List(c, sb, "tenant-b");
  ASSERT_EQ(b_docs.size(), 1u);
  EXPECT_EQ(b_docs["doc-of-b"].version, 3u);
  EXPECT_EQ(node_->server().service().Stats()[NodeStat::kRegistryLoadFailures], 0u);
  // A delete after the restart erases what the disk kept.
  std::uint32_t erased = 0;
  ASSERT_EQ(KnowledgeDelete(c, s, "tenant-a", model_, "doc-a", &erased), ErrorCode::OK);
  EXPECT_EQ(erased, 1u);
}

TEST_F(KnowledgeNodeTest, AnUnreadableRegistryFileIsSetAsideAndTheNodeStartsEmpty) {
  const ServerConfig config = Config(64 << 20, /*disk=*/true);
  const fs::path file = dir_ / "disk" / "knowledge.kdnreg";
  Start(config);
  {
    Client c(node_->bound().rpc[0]);
    Session::Client s = c.MustLogin(kTokenA);
    ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
    ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
  }
  node_.reset();
  std::string good;
  {
    std::ifstream in(file, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(good.size(), 100u);

  struct Variant {
    const char* name;
    std::string bytes;
  };
  std::vector<Variant> variants;
  std::string flipped = good;
  flipped[good.size() - 40] ^= 0x04;  // in a document: the checksum catches it
  variants.push_back({"a flipped bit", flipped});
  variants.push_back({"truncated", good.substr(0, good.size() - 7)});
  variants.push_back({"cut inside its header", good.substr(0, 20)});
  variants.push_back({"empty", ""});
  variants.push_back({"garbage", std::string(4096, '\x5a')});
  std::string newer = good;
  newer[8] = 9;  // a format version this kdnd does not read
  variants.push_back({"a newer format", newer});

  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    fs::remove(dir_ / "disk" / "knowledge.kdnreg.bad");
    {
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      out << v.bytes;
    }
    Start(config);
    EXPECT_EQ(node_->server().service().Stats()[NodeStat::kRegistryLoadFailures], 1u);
    EXPECT_EQ(node_->server().service().Stats()[NodeStat::kDocuments], 0u);
    EXPECT_TRUE(fs::exists(dir_ / "disk" / "knowledge.kdnreg.bad"));  // kept for a look
    Client c(node_->bound().rpc[0]);
    Session::Client s = c.MustLogin(kTokenA);
    EXPECT_TRUE(List(c, s).empty());
    // The node serves on, and registers anew.
    ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_b_), ErrorCode::OK);
    EXPECT_EQ(List(c, s).size(), 1u);
    node_.reset();
  }
  // What the last node registered was saved and loads.
  Start(config);
  EXPECT_EQ(node_->server().service().Stats()[NodeStat::kRegistryLoadFailures], 0u);
  EXPECT_EQ(node_->server().service().Stats()[NodeStat::kDocuments], 1u);
}

// Every knowledge change rewrote and fsynced the whole registry (66 pins of
// one document wrote 2.1 GB). Now a change is a record appended to the log
// beside the snapshot, and the snapshot is rewritten only when the log has
// grown past max(snapshot, 4 MiB). What a crash leaves (the files as they
// were after the last write, no shutdown) loads whole; a record cut short by
// the crash is dropped, the changes before it stand.
TEST_F(KnowledgeNodeTest, AChangeCostsItsOwnBytesAndACrashKeepsWhatWasWritten) {
  const fs::path disk = dir_ / "disk";
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  auto make = [&](const fs::path& path) {
    NodeOptions o;
    store::TierSpec host;
    host.capacity_bytes = 4 << 20;
    store::TierSpec d;
    d.kind = store::TierSpec::Kind::kDisk;
    d.path = path.string();
    d.capacity_bytes = 4 << 20;
    d.fsync = false;
    o.tiers = {host, d};
    o.knowledge_save_delay_ms = 3600 * 1000;  // no saver: the test writes (Flush) when it wants
    auto created = NodeService::Create(o);
    EXPECT_TRUE(created.ok()) << created.status().message();
    return created.ok() ? std::move(created).value() : nullptr;
  };
  auto listed = [&](NodeService& node) {
    std::map<std::string, std::tuple<std::uint64_t, bool, std::uint64_t, std::uint64_t, std::size_t>> out;
    for (const KnowledgeDocInfo& d : node.knowledge().List(ns)) {
      out[d.doc_id] = {d.version, d.pinned, d.pin_expires_ms, d.registered_ms, d.chunks};
    }
    return out;
  };
  auto doc = [&](const std::string& id, std::uint64_t version, int keys) {
    KnowledgeDoc d;
    d.doc_id = id;
    d.version = version;
    d.model = model_;
    for (int i = 0; i < keys; ++i) {
      keys::Digest k{};
      k[0] = static_cast<std::uint8_t>(version);
      std::memcpy(k.data() + 1, id.data(), std::min<size_t>(id.size(), 20));
      k[28] = static_cast<std::uint8_t>(i);
      k[29] = static_cast<std::uint8_t>(i >> 8);
      d.keys.push_back(k);
    }
    return d;
  };
  auto copy_files = [&](const fs::path& to) {
    fs::remove_all(to);
    fs::create_directories(to);
    for (const char* f : {"knowledge.kdnreg", "knowledge.kdnreg.log"}) fs::copy_file(disk / f, to / f);
  };

  std::unique_ptr<NodeService> node = make(disk);
  ASSERT_NE(node, nullptr);
  KnowledgeRegistry& reg = node->knowledge();
  // 40 documents of 1,000 keys: a snapshot of 1.3 MB.
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(reg.Put(ns, doc("doc-" + std::to_string(i), 1, 1000)).ok());
  ASSERT_TRUE(reg.Flush().ok());
  EXPECT_EQ(reg.snapshots_written(), 1u);  // the first write of a node
  const std::uint64_t snapshot = reg.bytes_written();
  EXPECT_GT(snapshot, 1280000u);
  // 66 pins and unpins, each written on its own.
  for (int i = 0; i < 66; ++i) {
    std::uint32_t pinned = 0;
    ASSERT_TRUE(reg.Pin(ns, model_, "doc-" + std::to_string(i % 40), i % 3 != 2, i % 2 ? 0 : 3600 * 1000, pinned).ok());
    ASSERT_TRUE(reg.Flush().ok());
  }
  const std::uint64_t pins = reg.bytes_written() - snapshot;
  std::printf("66 pins wrote %llu bytes (the snapshot: %llu)\n", static_cast<unsigned long long>(pins),
              static_cast<unsigned long long>(snapshot));
  EXPECT_LT(pins, 66u * 128u);
  EXPECT_EQ(reg.snapshots_written(), 1u);
  // A delete, a replacement and a new document: a put costs its document.
  std::uint32_t erased = 0;
  ASSERT_TRUE(reg.Delete(ns, model_, "doc-39", erased).ok());
  ASSERT_TRUE(reg.Put(ns, doc("doc-38", 2, 500)).ok());
  ASSERT_TRUE(reg.Put(ns, doc("late", 1, 10)).ok());
  ASSERT_TRUE(reg.Flush().ok());
  EXPECT_LT(reg.bytes_written() - snapshot - pins, 20000u);
  EXPECT_EQ(reg.snapshots_written(), 1u);
  const auto before = listed(*node);
  ASSERT_EQ(before.size(), 40u);

  // What a crash leaves: the files as they are now. All of it loads.
  copy_files(dir_ / "crash");
  {
    std::unique_ptr<NodeService> after = make(dir_ / "crash");
    ASSERT_NE(after, nullptr);
    EXPECT_EQ(after->knowledge().load_failures(), 0u);
    EXPECT_EQ(listed(*after), before);
    EXPECT_EQ(after->knowledge().snapshots_written(), 0u);  // loading writes nothing
  }
  // A crash in the last append: its record cut short. The changes before it stand.
  copy_files(dir_ / "torn");
  fs::resize_file(dir_ / "torn" / "knowledge.kdnreg.log", fs::file_size(dir_ / "torn" / "knowledge.kdnreg.log") - 5);
  {
    std::unique_ptr<NodeService> after = make(dir_ / "torn");
    ASSERT_NE(after, nullptr);
    EXPECT_EQ(after->knowledge().load_failures(), 0u);
    auto expect = before;
    expect.erase("late");
    EXPECT_EQ(listed(*after), expect);
    // The next write does not append after the torn record: a snapshot, then a new log.
    ASSERT_TRUE(after->knowledge().Put(ns, doc("later", 1, 3)).ok());
    ASSERT_TRUE(after->knowledge().Flush().ok());
    EXPECT_EQ(after->knowledge().snapshots_written(), 1u);
  }
  {
    std::unique_ptr<NodeService> again = make(dir_ / "torn");
    auto expect = before;
    expect.erase("late");
    auto got = listed(*again);
    EXPECT_EQ(got.count("later"), 1u);
    got.erase("later");
    EXPECT_EQ(got, expect);
  }

  // The log is compacted once it outgrows max(snapshot, 4 MiB): replacing a
  // 1,000-key document (a 32 KiB record) 160 times writes one more snapshot.
  for (int v = 2; v < 162; ++v) {
    ASSERT_TRUE(reg.Put(ns, doc("doc-0", static_cast<std::uint64_t>(v), 1000)).ok());
    ASSERT_TRUE(reg.Flush().ok());
  }
  EXPECT_EQ(reg.snapshots_written(), 2u);
  EXPECT_LT(fs::file_size(disk / "knowledge.kdnreg.log"), std::uint64_t{4} << 20);
  const auto compacted = listed(*node);
  EXPECT_EQ(std::get<0>(compacted.at("doc-0")), 161u);
  copy_files(dir_ / "compacted");
  {
    std::unique_ptr<NodeService> after = make(dir_ / "compacted");
    EXPECT_EQ(listed(*after), compacted);
  }
  // A shutdown leaves a snapshot and an empty log.
  node.reset();
  EXPECT_EQ(fs::file_size(disk / "knowledge.kdnreg.log"), store::RecordLog::kHeaderBytes);
  node = make(disk);
  EXPECT_EQ(listed(*node), compacted);
}

// A node without a disk tier keeps its registry in memory only.
TEST_F(KnowledgeNodeTest, WithoutADiskTierNothingIsSaved) {
  Start(Config());
  EXPECT_EQ(node_->server().service().knowledge().path(), "");
  Client c(node_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kTokenA);
  ASSERT_EQ(KnowledgePut(c, s, "tenant-a", doc_a_), ErrorCode::OK);
  EXPECT_TRUE(node_->server().service().knowledge().Save().ok());
  node_.reset();
  for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string().find("kdnreg"), std::string::npos) << entry.path();
  }
}

// The registry's calls from many threads at once, straight on the service:
// registrations, pins, hits, lists and deletes of documents that share
// chunks across threads. Afterwards the counts are exactly what each
// thread's own share says.
TEST_F(KnowledgeNodeTest, CallsFromManyThreadsKeepTheCountsExact) {
  std::unique_ptr<NodeService> service = Service();
  ASSERT_NE(service, nullptr);
  NodeService& node = *service;
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  for (const Envelope* e : {&e0_, &e1_, &e2_, &e3_}) ASSERT_TRUE(node.Put(ns, e->bytes).ok());
  constexpr int kThreads = 4, kDocs = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Each thread's documents share k0 and k1 with every other thread's,
      // and have a key of their own (never stored) for the hits.
      keys::Digest own{};
      own[0] = 0xA0;
      own[1] = static_cast<std::uint8_t>(t);
      for (int i = 0; i < kDocs; ++i) {
        KnowledgeDoc d;
        d.doc_id = "t" + std::to_string(t) + "-" + std::to_string(i);
        d.version = 1;
        d.model = model_;
        d.keys = {e0_.key, e1_.key, own};
        EXPECT_TRUE(node.KnowledgePut(ns, d).ok());
        std::uint32_t n = 0;
        EXPECT_TRUE(node.knowledge().Pin(ns, model_, d.doc_id, true, i % 2 ? 0 : 60000, n).ok());
        EXPECT_EQ(n, 2u);  // k0 and k1; `own` is not stored
        const keys::Digest served[] = {own};
        node.knowledge().CreditHits(ns, served);
        if (i % 5 == 0) (void)node.knowledge().List(ns);
        if (i % 2 == 1) {
          std::uint32_t erased = 0;
          EXPECT_TRUE(node.knowledge().Delete(ns, model_, d.doc_id, erased).ok());
          EXPECT_EQ(erased, 0u);  // k0 and k1 are other documents' too; `own` is not held
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const std::vector<KnowledgeDocInfo> docs = node.knowledge().List(ns);
  ASSERT_EQ(docs.size(), static_cast<size_t>(kThreads * kDocs / 2));
  EXPECT_EQ(node.Stats()[NodeStat::kDocuments], docs.size());
  for (const KnowledgeDocInfo& d : docs) {
    // Document i of a thread was credited once by each of that thread's
    // later hits on `own`: kDocs - i of them.
    const int i = std::stoi(d.doc_id.substr(d.doc_id.find('-') + 1));
    EXPECT_EQ(d.hits, static_cast<std::uint64_t>(kDocs - i)) << d.doc_id;
    EXPECT_TRUE(d.pinned);
    EXPECT_EQ(d.chunks_held, 2u);
  }
  EXPECT_EQ(node.chain().Counters().pins_active, 2u);
}

// Crediting a get's chunks to the documents that reference them cost keys x
// documents on the event loop (8.5 s for one get against 100k documents
// sharing a chunk). Now each served key is one increment, and every
// document still gets its hits exactly, through replacement and listing.
TEST_F(KnowledgeNodeTest, CreditingAChunkSharedByManyDocumentsIsOneStepPerKey) {
  std::unique_ptr<NodeService> service = Service();
  ASSERT_NE(service, nullptr);
  NodeService& node = *service;
  const keys::Digest ns = keys::NamespaceHash("tenant-a");
  constexpr int kDocs = 20000;
  for (int i = 0; i < kDocs; ++i) {
    KnowledgeDoc d;
    d.doc_id = "d" + std::to_string(i);
    d.version = 1;
    d.model = model_;
    keys::Digest own{};
    own[0] = 0xB0;
    std::memcpy(own.data() + 1, &i, sizeof i);
    d.keys = {e0_.key, own};  // e0 in every document
    ASSERT_TRUE(node.KnowledgePut(ns, d).ok());
  }
  // One get that served e0 65,536 times (the most keys a call carries).
  const std::vector<keys::Digest> served(wire::node::MAX_KEYS_PER_CALL, e0_.key);
  const auto t0 = std::chrono::steady_clock::now();
  node.knowledge().CreditHits(ns, served);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 500) << "crediting took " << ms << " ms";  // 1.3e9 increments before
  // A second version of d0 starts afresh; d1 keeps its hits and gains one
  // of its own key.
  KnowledgeDoc d0;
  d0.doc_id = "d0";
  d0.version = 2;
  d0.model = model_;
  d0.keys = {e0_.key};
  ASSERT_TRUE(node.KnowledgePut(ns, d0).ok());
  keys::Digest own1{};
  own1[0] = 0xB0;
  const int one = 1;
  std::memcpy(own1.data() + 1, &one, sizeof one);
  const keys::Digest more[] = {own1, e0_.key};
  node.knowledge().CreditHits(ns, more);
  std::map<std::string, std::uint64_t> hits;
  for (const KnowledgeDocInfo& d : node.knowledge().List(ns)) hits[d.doc_id] = d.hits;
  ASSERT_EQ(hits.size(), static_cast<size_t>(kDocs));
  EXPECT_EQ(hits["d0"], 1u);
  EXPECT_EQ(hits["d1"], wire::node::MAX_KEYS_PER_CALL + 2u);
  EXPECT_EQ(hits["d2"], wire::node::MAX_KEYS_PER_CALL + 1u);
  EXPECT_EQ(hits["d19999"], wire::node::MAX_KEYS_PER_CALL + 1u);
}

// ---- The [knowledge] table ----------------------------------------------------

constexpr const char* kOneToken = "[[token]]\ntoken = \"a-token-of-sixteen-chars\"\nnamespaces = [\"a\"]\n";

TEST(KnowledgeConfig, DefaultsAndValues) {
  auto d = ParseConfig(kOneToken, "k.toml");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->knowledge.max_documents, 100000u);
  EXPECT_EQ(d->knowledge.max_keys_per_document, wire::node::MAX_KEYS_PER_CALL);
  EXPECT_EQ(d->knowledge.max_keys, 4194304u);
  auto r = ParseConfig(std::string(kOneToken) + "[knowledge]\nmax_documents = 10\nmax_keys_per_document = 100\nmax_keys = 500\n",
                       "k.toml");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->knowledge.max_documents, 10u);
  EXPECT_EQ(r->knowledge.max_keys_per_document, 100u);
  EXPECT_EQ(r->knowledge.max_keys, 500u);
}

TEST(KnowledgeConfig, MistakesAreRefusedNamingTheKey) {
  for (const auto& [text, key] : std::vector<std::pair<std::string, std::string>>{
           {"[knowledge]\nmax_docs = 3\n", "knowledge.max_docs"},
           {"[knowledge]\nmax_documents = 0\n", "knowledge.max_documents"},
           {"[knowledge]\nmax_documents = -1\n", "knowledge.max_documents"},
           {"[knowledge]\nmax_keys = \"many\"\n", "knowledge.max_keys"},
           {"[knowledge]\nmax_keys_per_document = 65537\n", "knowledge.max_keys_per_document"},
           {"knowledge = 3\n", "knowledge"},
       }) {
    auto r = ParseConfig(text + kOneToken, "k.toml");
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("k.toml"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace kdn::server
