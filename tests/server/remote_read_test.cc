// SPDX-License-Identifier: Apache-2.0
// The remote tier's streamed reads (Prefetch with will_read): the lookup and
// a get per key leave at once, each Get takes its chunk as it arrives, reads
// past the node's prefix are cancelled, a bounded read-ahead falls back to
// plain gets, an erase is not undone by a chunk read ahead, and a node that
// goes away mid-read costs misses within the deadline. Real kdnd on a thread
// of this process, real KV of the reference model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <vector>

#include "reference_kv.h"
#include "rpc_client.h"
#include "running_server.h"
#include "test_sockets.h"
#include "core/tiers/remote_tier.h"
#include "core/runtime/runtime.h"
#include "core/wire/envelope.h"
#include "core/wire/node.capnp.h"

#include <capnp/ez-rpc.h>

namespace kdn::server {
namespace {

namespace fs = std::filesystem;
using namespace testing_support;

constexpr const char* kToken = "token-for-tenant-a-0001";
constexpr const char* kNs = "tenant-a";

class RemoteReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    dir_ = fs::temp_directory_path() / ("kdn-remote-read-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ref_ = testing::PrefillReference(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog.");
    ServerConfig c;
    c.listen = {"127.0.0.1:0"};
    store::TierSpec host;
    host.capacity_bytes = 64 << 20;
    c.tiers = {host};
    c.tokens = {{"a", kToken, {kNs}, false}};
    server_ = std::make_unique<RunningServer>(c);
    // Chained 8-token chunks of the text, as chunks the tier puts.
    keys::Digest prev{};
    for (std::uint32_t b = 0; b + 8 <= ref_.tokens.size(); b += 8) {
      Envelope e = MakeEnvelope(ref_, kNs, b, 8, prev);
      prev = e.key;
      auto c = wire::DecodeEnvelope(e.bytes.data(), e.bytes.size(), &e.key);
      ASSERT_TRUE(c.ok());
      chunks_.push_back(std::move(c).value());
      keys_.push_back(e.key);
    }
    ASSERT_GE(chunks_.size(), 4u);
  }
  void TearDown() override {
    server_.reset();
    fs::remove_all(dir_);
  }

  std::unique_ptr<store::RemoteTier> Tier(std::uint64_t read_ahead_bytes = std::uint64_t{256} << 20,
                                          std::uint32_t timeout_ms = 2000) {
    store::RemoteTierOptions o;
    o.address = server_->bound().rpc[0];
    o.token = kToken;
    o.timeout_ms = timeout_ms;
    o.retry_ms = 100;
    o.read_ahead_bytes = read_ahead_bytes;
    auto t = store::RemoteTier::Create(o);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return std::move(t).value();
  }
  // Stores chunks [0, n) through a tier of their own, sent before it returns.
  void Store(size_t n) {
    auto writer = Tier();
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(writer->Put(chunks_[i]).ok());
    writer->Flush();
    ASSERT_EQ(writer->remote_counters().puts_sent, n);
  }
  static bool Same(const store::ChunkRef& a, const store::ChunkRef& b) {
    return a && b && a->meta == b->meta && a->payload.size() == b->payload.size() &&
           std::memcmp(a->payload.data(), b->payload.data(), a->payload.size()) == 0;
  }

  fs::path dir_;
  testing::ReferenceKv ref_;
  std::unique_ptr<RunningServer> server_;
  std::vector<store::ChunkRef> chunks_;
  std::vector<keys::Digest> keys_;
};

TEST_F(RemoteReadTest, EveryChunkIsReadAheadAndEachGetTakesItsOwn) {
  Store(chunks_.size());
  auto tier = Tier();
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);  // the namespace the reads are of
  const std::uint64_t calls_before = tier->remote_counters().calls;
  tier->Prefetch(keys_, /*will_read=*/true, ctx);
  // One synchronous call (the lookup; the gets went with it), and the
  // probes are answered from it.
  EXPECT_EQ(tier->remote_counters().calls, calls_before + 1);
  for (size_t i = 0; i < keys_.size(); ++i) EXPECT_TRUE(tier->Contains(keys_[i], ctx)) << i;
  EXPECT_EQ(tier->remote_counters().calls, calls_before + 1);
  for (size_t i = 0; i < keys_.size(); ++i) {
    auto got = tier->Get(keys_[i], ctx);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(Same(*got, chunks_[i])) << i;
  }
  const store::RemoteCounters c = tier->remote_counters();
  EXPECT_EQ(c.reads_ahead, keys_.size());
  EXPECT_EQ(c.reads_ahead_used, keys_.size());
  EXPECT_EQ(c.calls, calls_before + 1);  // no Get made a call of its own
  EXPECT_EQ(tier->counters().io_errors, 0u);
  // Taken: a second Get of a key asks the node again, and still gets it.
  auto again = tier->Get(keys_[0], ctx);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(Same(*again, chunks_[0]));
  EXPECT_EQ(tier->remote_counters().calls, calls_before + 2);
}

TEST_F(RemoteReadTest, ReadsPastTheNodesPrefixEndAsMissesNotErrors) {
  const size_t held = chunks_.size() / 2;
  Store(held);
  auto tier = Tier();
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);  // the namespace the reads are of
  tier->Prefetch(keys_, true, ctx);
  for (size_t i = 0; i < keys_.size(); ++i) {
    auto got = tier->Get(keys_[i], ctx);
    if (i < held) {
      ASSERT_TRUE(got.ok()) << i;
      EXPECT_TRUE(Same(*got, chunks_[i]));
    } else {
      EXPECT_EQ(got.status().code(), Code::kNotFound) << i << ": " << got.status().message();
    }
  }
  EXPECT_EQ(tier->counters().io_errors, 0u);
  EXPECT_EQ(tier->remote_counters().failed_calls, 0u);
}

TEST_F(RemoteReadTest, ABoundedReadAheadFallsBackToPlainGets) {
  Store(chunks_.size());
  // Room for about one chunk: the others are not kept when they arrive and
  // each Get asks for its own.
  auto tier = Tier(chunks_[0]->payload.size() + 512);
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);  // the namespace the reads are of
  const std::uint64_t calls_before = tier->remote_counters().calls;
  tier->Prefetch(keys_, true, ctx);
  // Every reply in before any Get: the first is kept, the rest are not.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tier->remote_counters().reads_ahead_overflow < keys_.size() - 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(tier->remote_counters().reads_ahead_overflow, keys_.size() - 1);
  for (size_t i = 0; i < keys_.size(); ++i) {
    auto got = tier->Get(keys_[i], ctx);
    ASSERT_TRUE(got.ok()) << i;
    EXPECT_TRUE(Same(*got, chunks_[i])) << i;
  }
  const store::RemoteCounters c = tier->remote_counters();
  EXPECT_EQ(c.reads_ahead_used, 1u);
  EXPECT_EQ(c.calls - calls_before, keys_.size());  // the lookup, and a get of its own for each chunk not kept
}

TEST_F(RemoteReadTest, AnEraseIsNotUndoneByAChunkReadAhead) {
  Store(chunks_.size());
  auto tier = Tier();
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);  // the namespace the reads are of
  tier->Prefetch(keys_, true, ctx);
  EXPECT_TRUE(tier->Erase(keys_[1], ctx));
  EXPECT_EQ(tier->Get(keys_[1], ctx).status().code(), Code::kNotFound);
  auto first = tier->Get(keys_[0], ctx);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(Same(*first, chunks_[0]));
}

TEST_F(RemoteReadTest, ReadsOutsideANamespaceOrWithoutANodeAreMissesWithinTheDeadline) {
  Store(chunks_.size());
  auto tier = Tier(std::uint64_t{256} << 20, 500);
  {
    // No namespace: nothing is asked.
    tier->Prefetch(keys_, true, store::ReadContext{});
    EXPECT_EQ(tier->remote_counters().reads_ahead, 0u);
  }
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);  // the namespace the reads are of
  server_->Stop();
  const auto t0 = std::chrono::steady_clock::now();
  tier->Prefetch(keys_, true, ctx);
  for (const keys::Digest& k : keys_) EXPECT_FALSE(tier->Get(k, ctx).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_GT(tier->counters().io_errors, 0u);
}

// The write-back queue is bounded: with the node unreachable nothing drains,
// and a put past write_queue_bytes is refused with kBusy (counted) while what
// is queued is still served to this runtime's reads.
TEST_F(RemoteReadTest, AFullWriteBackQueueRefusesPutsWithBusyAndKeepsServingWhatItHolds) {
  store::RemoteTierOptions o;
  // (A short path: a unix socket's must fit 107 bytes, and the tier checks.)
  o.address = "unix:" + (fs::temp_directory_path() / ("kdn-nobody-" + std::to_string(::getpid()) + ".sock")).string();
  o.token = kToken;
  o.timeout_ms = 300;
  o.retry_ms = 60000;  // no second attempt during the test
  const std::uint64_t cost = wire::EncodedEnvelopeSize(chunks_[0]->payload.size());
  o.write_queue_bytes = 2 * cost;
  auto tier = store::RemoteTier::Create(o).value();
  ASSERT_TRUE(tier->Put(chunks_[0]).ok());
  ASSERT_TRUE(tier->Put(chunks_[1]).ok());
  const Status third = tier->Put(chunks_[2]);
  EXPECT_EQ(third.code(), Code::kBusy) << third.message();
  EXPECT_EQ(tier->remote_counters().queue_full, 1u);
  EXPECT_TRUE(tier->Put(chunks_[0]).ok());  // queued already: no new bytes
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);  // the namespace the reads are of
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(tier->Contains(keys_[i], ctx));
    auto got = tier->Get(keys_[i], ctx);
    ASSERT_TRUE(got.ok()) << i;
    EXPECT_TRUE(Same(*got, chunks_[i]));
  }
  EXPECT_FALSE(tier->Get(keys_[2], ctx).ok());
  EXPECT_EQ(tier->remote_counters().queued_bytes, 2 * cost);
}

// Several senders (each chunk a batch of its own here): every chunk is sent,
// and announcements made after them wait for them and for each other; a
// second one right behind the first goes once the first is answered (a
// flush returns).
TEST_F(RemoteReadTest, SeveralSendersSendEveryChunkAndTheAnnouncementsAfterThem) {
  store::RemoteTierOptions o;
  o.address = server_->bound().rpc[0];
  o.token = kToken;
  o.batch_bytes = 1;
  o.senders = 3;
  auto tier = store::RemoteTier::Create(o).value();
  for (const store::ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  for (const char* id : {"first.txt", "second.txt", "third.txt"}) {
    store::DocumentRecord d;
    d.ns_hash = keys::NamespaceHash(kNs);
    d.model = ref_.m.fingerprint;
    d.doc_id = id;
    d.version = 1;
    d.tokens = chunks_.size() * 8;
    d.keys = keys_;
    tier->Document(store::DocumentOp::kPut, d, 0);
  }
  auto flushed = std::async(std::launch::async, [&] { tier->Flush(); });
  ASSERT_EQ(flushed.wait_for(std::chrono::seconds(20)), std::future_status::ready) << "a flush did not return";
  const store::RemoteCounters rc = tier->remote_counters();
  EXPECT_EQ(rc.puts_sent, chunks_.size());
  EXPECT_EQ(rc.documents_sent, 3u);
  Client c(server_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kToken);
  std::vector<ListedDoc> docs;
  ASSERT_EQ(KnowledgeList(c, s, kNs, &docs), wire::node::ErrorCode::OK);
  ASSERT_EQ(docs.size(), 3u);
  for (const ListedDoc& d : docs) EXPECT_EQ(d.chunks_held, chunks_.size()) << d.doc_id;
}

// A runtime's knowledge items reach the node's registry: a put registers the
// document (its stored keys, after its chunks), a pin and an unpin follow
// it there, another engine lists it, and a delete unregisters it and erases
// its chunks on the node.
TEST_F(RemoteReadTest, ARuntimesKnowledgeItemsAreRegisteredOnTheNode) {
  auto rt = RemoteRuntime(server_->bound().rpc[0], kToken);
  const size_t T = ref_.tokens.size();
  std::vector<float> kv = ref_.canonical;
  auto views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{Canonical(kv)}, T).value();
  const std::span<const std::int32_t> tokens(reinterpret_cast<const std::int32_t*>(ref_.tokens.data()), T);
  ASSERT_TRUE(rt->knowledge().Put(ref_.m, kNs, "lily.txt", 3, R"({"source":"test"})", tokens, views).ok());
  auto& chain = rt->store().chain();
  chain.Flush();
  const auto& tier = dynamic_cast<const store::RemoteTier&>(chain.tier(0));
  EXPECT_EQ(tier.remote_counters().documents_sent, 1u);

  Client c(server_->bound().rpc[0]);
  Session::Client s = c.MustLogin(kToken);
  std::vector<ListedDoc> docs;
  ASSERT_EQ(KnowledgeList(c, s, kNs, &docs), wire::node::ErrorCode::OK);
  ASSERT_EQ(docs.size(), 1u);
  const size_t chunks = (T + 7) / 8;
  EXPECT_EQ(docs[0].doc_id, "lily.txt");
  EXPECT_EQ(docs[0].version, 3u);
  EXPECT_EQ(docs[0].metadata, R"({"source":"test"})");
  EXPECT_EQ(docs[0].tokens, T);
  EXPECT_EQ(docs[0].model, std::vector<std::uint8_t>(ref_.m.fingerprint.begin(), ref_.m.fingerprint.end()));
  EXPECT_EQ(docs[0].chunks, chunks);
  EXPECT_EQ(docs[0].chunks_held, chunks);  // its chunks went before it
  EXPECT_FALSE(docs[0].pinned);
  EXPECT_EQ(server_->server().service().Stats().tiers[0][TierStat::kObjects], chunks);

  const Status pinned = rt->knowledge().Pin(ref_.m, kNs, "lily.txt", true, std::int64_t{3600} * 1000000000);
  ASSERT_TRUE(pinned.ok()) << pinned.message();
  chain.Flush();
  ASSERT_EQ(KnowledgeList(c, s, kNs, &docs), wire::node::ErrorCode::OK);
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_TRUE(docs[0].pinned);
  EXPECT_GT(docs[0].pin_expires_ms, 0u);  // the TTL travelled: a deadline on the node's clock
  ASSERT_TRUE(rt->knowledge().Pin(ref_.m, kNs, "lily.txt", false, 0).ok());
  chain.Flush();
  ASSERT_EQ(KnowledgeList(c, s, kNs, &docs), wire::node::ErrorCode::OK);
  EXPECT_FALSE(docs.at(0).pinned);

  ASSERT_TRUE(rt->knowledge().Delete(ref_.m, kNs, "lily.txt").ok());
  chain.Flush();
  ASSERT_EQ(KnowledgeList(c, s, kNs, &docs), wire::node::ErrorCode::OK);
  EXPECT_TRUE(docs.empty());
  EXPECT_EQ(server_->server().service().Stats()[NodeStat::kDocuments], 0u);
  EXPECT_EQ(server_->server().service().Stats().tiers[0][TierStat::kObjects], 0u);  // its chunks erased there too
  EXPECT_EQ(tier.remote_counters().documents_sent, 4u);
  EXPECT_EQ(tier.remote_counters().documents_refused, 0u);
}

// Through a runtime: a retrieve of whole chunks from the node is one call
// (the lookup, with the gets sent beside it); the chain's probes around each
// get are answered without asking again; the KV comes back bit for bit.
TEST_F(RemoteReadTest, ARetrieveOfWholeChunksIsOneCall) {
  const size_t T = chunks_.size() * 8;  // whole 8-token chunks only: no tail pieces
  auto writer = RemoteRuntime(server_->bound().rpc[0], kToken);
  std::vector<float> in = ref_.canonical;
  auto views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{Canonical(in)}, ref_.tokens.size()).value();
  ASSERT_TRUE(writer->Store(ref_.m, kNs, ref_.Keys(), views).ok());
  writer->store().chain().Flush();

  auto reader = RemoteRuntime(server_->bound().rpc[0], kToken);
  store::TokenKeys keys = ref_.Keys();
  keys.tokens = keys.tokens.subspan(0, T);
  std::vector<float> out(ref_.canonical.size(), -7.0f);
  auto out_views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{Canonical(out)}, ref_.tokens.size()).value();
  const auto& tier = dynamic_cast<const store::RemoteTier&>(reader->store().chain().tier(0));
  const std::uint64_t calls_before = tier.remote_counters().calls;
  const store::KvStore::Retrieved got = reader->Retrieve(ref_.m, kNs, keys, out_views).value();
  EXPECT_EQ(got.tokens, T);
  EXPECT_EQ(tier.remote_counters().calls, calls_before + 1);
  EXPECT_EQ(tier.remote_counters().reads_ahead_used, chunks_.size());
  // Bit for bit: per layer and k|v, the first T tokens' rows (32 floats).
  const size_t all = ref_.tokens.size(), row = 32;
  for (size_t lk = 0; lk < 10; ++lk) {
    for (size_t i = 0; i < T * row; ++i) ASSERT_EQ(out[lk * all * row + i], ref_.canonical[lk * all * row + i]) << lk << " " << i;
  }
}

// A node that is there and never answers (a hung kdnd, a black hole on the
// path): a TCP listener that never accepts. The kernel completes each
// connection and takes what the tier writes; no reply ever comes.
class BlackHole {
 public:
  BlackHole() { fd_ = ListenLoopback(&port_, 128); }
  ~BlackHole() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  std::uint16_t port_ = 0;
};

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One deadline per call: against a node that never answers, a lookup and a
// retrieve (several round trips each: the batched lookup, a probe or get
// per chunk, reconnects) wait at most about one timeout_ms, not one per
// round trip. The node is then marked down and calls miss at once; after
// retry_ms one call probes it; once a node answers at that address, a probe
// finds it and the tier serves again by itself.
TEST_F(RemoteReadTest, ANodeThatNeverAnswersCostsOneDeadlinePerCallThenIsSkippedUntilItAnswers) {
  constexpr std::uint32_t kTimeoutMs = 400;
  auto hole = std::make_unique<BlackHole>();
  const std::string address = hole->address();
  auto rt = RemoteRuntime(address, kToken, "", kTimeoutMs);
  ASSERT_NE(rt, nullptr);
  const auto& tier = dynamic_cast<const store::RemoteTier&>(rt->store().chain().tier(0));
  const size_t T = ref_.tokens.size();
  std::vector<float> out(ref_.canonical.size());
  auto out_views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{Canonical(out)}, T).value();

  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rt->store().Lookup(ref_.m, kNs, ref_.Keys()).tokens, 0u);
  const double lookup_ms = MsSince(t0);
  EXPECT_GE(lookup_ms, kTimeoutMs * 0.9);  // it did wait for an answer
  EXPECT_LT(lookup_ms, kTimeoutMs * 1.75) << "one lookup waited " << lookup_ms << " ms";
  store::RemoteCounters c = tier.remote_counters();
  EXPECT_GE(c.timeouts, 1u);
  EXPECT_EQ(c.marked_down, 1u);

  // Marked down: the next calls miss at once.
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rt->Retrieve(ref_.m, kNs, ref_.Keys(), out_views).value().tokens, 0u);
  EXPECT_EQ(rt->store().Lookup(ref_.m, kNs, ref_.Keys()).tokens, 0u);
  EXPECT_LT(MsSince(t0), kTimeoutMs * 0.5);
  EXPECT_GT(tier.remote_counters().down_skips, c.down_skips);

  // After retry_ms (1 s by default) one call probes, and waits its
  // deadline once: a retrieve that gets no answer costs one timeout too.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rt->Retrieve(ref_.m, kNs, ref_.Keys(), out_views).value().tokens, 0u);
  const double retrieve_ms = MsSince(t0);
  EXPECT_LT(retrieve_ms, kTimeoutMs * 1.75) << "one retrieve waited " << retrieve_ms << " ms";
  c = tier.remote_counters();
  EXPECT_EQ(c.marked_down, 2u);

  // A node answers at that address now: the KV stored there is found by
  // the same runtime once its probe goes through (down for 2 s now).
  hole->Close();
  ServerConfig config;
  config.listen = {address};
  store::TierSpec host;
  host.capacity_bytes = 64 << 20;
  config.tiers = {host};
  config.tokens = {{"a", kToken, {kNs}, false}};
  RunningServer node(config);
  ASSERT_EQ(node.bound().rpc.size(), 1u);
  {
    auto writer = RemoteRuntime(address, kToken);
    std::vector<float> in = ref_.canonical;
    auto views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{Canonical(in)}, T).value();
    ASSERT_TRUE(writer->Store(ref_.m, kNs, ref_.Keys(), views).ok());
    writer->store().chain().Flush();
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::uint64_t found = 0;
  while (found != T && std::chrono::steady_clock::now() < until) {
    found = rt->store().Lookup(ref_.m, kNs, ref_.Keys()).tokens;
    if (found != T) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  c = tier.remote_counters();
  EXPECT_EQ(found, T) << "calls " << c.calls << " failed " << c.failed_calls << " timeouts " << c.timeouts << " connects "
                      << c.connects << " connect_failures " << c.connect_failures << " marked_down " << c.marked_down
                      << " down_skips " << c.down_skips << " past_deadline " << c.past_deadline;
  EXPECT_EQ(rt->Retrieve(ref_.m, kNs, ref_.Keys(), out_views).value().tokens, T);
  EXPECT_EQ(tier.remote_counters().marked_down, 2u);
  node.Stop();
}

// Which timeouts mark a node down: a round trip that goes out a few
// milliseconds after its call began (the call's own work before it; a
// loaded machine) and gets no answer still had about the whole timeout, and
// marks the node down; one that had a fifth of it left (earlier round trips
// of its call took the rest) says little about the node and does not.
TEST_F(RemoteReadTest, ATimeoutMarksTheNodeDownOnlyWhenTheRoundTripHadMostOfTheTimeout) {
  constexpr std::uint32_t kTimeoutMs = 300;
  BlackHole hole;
  auto make = [&] {
    store::RemoteTierOptions o;
    o.address = hole.address();
    o.token = kToken;
    o.timeout_ms = kTimeoutMs;
    o.retry_ms = 60000;
    return store::RemoteTier::Create(o).value();
  };
  const auto now_ms = [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);
  {
    auto tier = make();
    ctx.started_ms = now_ms() - 40;  // the call began 40 ms ago
    EXPECT_FALSE(tier->Contains(keys_[0], ctx));
    EXPECT_EQ(tier->remote_counters().timeouts, 1u);
    EXPECT_EQ(tier->remote_counters().marked_down, 1u);
    store::ReadContext next;
    next.ns = ctx.ns;
    EXPECT_FALSE(tier->Contains(keys_[0], next));  // a new call: skipped now
    EXPECT_GE(tier->remote_counters().down_skips, 1u);
  }
  {
    auto tier = make();
    ctx.started_ms = now_ms() - kTimeoutMs * 4 / 5;  // a fifth of the call's timeout left
    EXPECT_FALSE(tier->Contains(keys_[0], ctx));
    EXPECT_EQ(tier->remote_counters().timeouts, 1u);
    EXPECT_EQ(tier->remote_counters().marked_down, 0u);
  }
}

// Fault injection: a node of protocol 3 (before Session.report). It logs
// any token in and answers lookups (nothing held); report is not there, so
// Cap'n Proto answers it UNIMPLEMENTED, as an older kdnd does. Served over
// a unix socket from a thread of its own until Stop().
class OldSession final : public wire::node::Session::Server {
 protected:
  kj::Promise<void> lookup(LookupContext context) override {
    context.getResults().initResults(context.getParams().getRequests().size());  // prefix 0 each
    return kj::READY_NOW;
  }
};
class OldNode final : public wire::node::KdnNode::Server {
 protected:
  kj::Promise<void> login(LoginContext context) override {
    context.getResults().setSession(kj::heap<OldSession>());
    return kj::READY_NOW;
  }
};
class OldNodeThread {
 public:
  explicit OldNodeThread(std::string path) : address_("unix:" + path) {
    std::promise<void> up;
    auto ready = up.get_future();
    thread_ = std::thread([this, &up] {
      capnp::EzRpcServer server(kj::heap<OldNode>(), address_);
      auto& ws = server.getWaitScope();
      server.getPort().wait(ws);
      up.set_value();
      while (!stop_) server.getIoProvider().getTimer().afterDelay(10 * kj::MILLISECONDS).wait(ws);
    });
    ready.wait();
  }
  ~OldNodeThread() {
    stop_ = true;
    thread_.join();
  }
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

store::Tier::RequestOutcome Outcome(bool load, std::uint64_t tokens, std::uint64_t hits) {
  store::Tier::RequestOutcome o;
  o.load = load;
  o.tokens = tokens;
  o.hit_tokens = hits;
  return o;
}

// Against a node without Session.report (protocol < 4) the first report is
// answered UNIMPLEMENTED: the tier stops reporting (counted once), and its
// lookups go on as before.
TEST_F(RemoteReadTest, ANodeWithoutReportsIsToldNothingMoreAndStillServes) {
  OldNodeThread old((dir_ / "old.sock").string());
  store::RemoteTierOptions o;
  o.address = old.address();
  o.token = kToken;
  o.retry_ms = 100;
  auto created = store::RemoteTier::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().message();
  std::unique_ptr<store::RemoteTier> tier = std::move(created).value();
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);
  tier->Report(Outcome(false, 48, 16), ctx);
  tier->Flush();
  store::RemoteCounters rc = tier->remote_counters();
  EXPECT_EQ(rc.reports_sent, 0u);
  EXPECT_EQ(rc.reports_unsupported, 1u);
  // Later requests are not reported (nothing queued, nothing sent), and the
  // node still answers lookups: a miss, not an error.
  const std::uint64_t calls = rc.calls;
  for (int i = 0; i < 5; ++i) tier->Report(Outcome(true, 48, 16), ctx);
  tier->Flush();
  EXPECT_FALSE(tier->Contains(keys_[0], ctx));
  rc = tier->remote_counters();
  EXPECT_EQ(rc.reports_unsupported, 1u);
  EXPECT_EQ(rc.reports_sent, 0u);
  EXPECT_GT(rc.calls, calls);  // the lookup went to the node
  EXPECT_EQ(rc.failed_calls, 1u);  // the one report
}

// Reports made while the node is unreachable wait, and reach it once it is
// back (a restart at the same address): the node counts each engine request
// once.
TEST_F(RemoteReadTest, ReportsMadeWhileTheNodeIsDownReachItWhenItIsBack) {
  const std::string address = server_->bound().rpc[0];
  ServerConfig c;
  c.listen = {address};
  store::TierSpec host;
  host.capacity_bytes = 64 << 20;
  c.tiers = {host};
  c.tokens = {{"a", kToken, {kNs}, false}};
  server_.reset();  // down
  store::RemoteTierOptions o;
  o.address = address;
  o.token = kToken;
  o.timeout_ms = 300;
  o.retry_ms = 50;
  auto created = store::RemoteTier::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().message();
  std::unique_ptr<store::RemoteTier> tier = std::move(created).value();
  store::ReadContext ctx;
  ctx.ns = keys::NamespaceHash(kNs);
  for (int i = 0; i < 3; ++i) tier->Report(Outcome(false, 40, 8 * i), ctx);
  tier->Report(Outcome(true, 40, 24), ctx);
  tier->Flush();  // a send fails: the reports wait
  EXPECT_EQ(tier->remote_counters().reports_sent, 0u);
  server_ = std::make_unique<RunningServer>(c);  // back, at the same address
  ASSERT_EQ(server_->bound().rpc[0], address);
  const NodeService& node = server_->server().service();
  for (int i = 0; i < 100 && node.Stats()[NodeStat::kEngineLookups] == 0; ++i) {
    tier->Flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const NodeStats s = node.Stats();
  EXPECT_EQ(s[NodeStat::kEngineLookups], 3u);
  EXPECT_EQ(s[NodeStat::kEngineLookupTokens], 120u);
  EXPECT_EQ(s[NodeStat::kEngineLookupHitTokens], 24u);
  EXPECT_EQ(s[NodeStat::kEngineLoads], 1u);
  EXPECT_EQ(s[NodeStat::kEngineLoadTokens], 40u);
  EXPECT_EQ(s[NodeStat::kEngineLoadHitTokens], 24u);
  EXPECT_GE(tier->remote_counters().reports_sent, 1u);
}

}  // namespace
}  // namespace kdn::server
