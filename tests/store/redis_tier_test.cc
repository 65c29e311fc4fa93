// SPDX-License-Identifier: Apache-2.0
// The redis tier (tiers/redis_tier.h) against real redis-server processes
// that the tests start on loopback (core/redis/local_servers.h): a single
// node with an ACL user (put, get, probes, prefetch, erase, TTL, a refused
// AUTH, a value corrupted in the server, a server gone and back, a runtime
// with a host tier over it, the C ABI's KDN_TIER_REDIS), and a cluster of 3
// masters with replicas (keys spread over the masters, a master killed
// mid-run costs misses only and hits come back after failover, two runtimes
// in two processes share it). The chunks are the reference model's KV.
#include "core/tiers/redis_tier.h"

#include <gtest/gtest.h>

#include "test_redis.h"
#include <kdn/kdn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../common/reference_kv.h"
#include "../common/test_models.h"
#include "core/redis/local_servers.h"
#include "../server/running_server.h"
#include "core/keys/hash.h"
#include "server/config.h"
#include "server/service.h"
#include "core/runtime/runtime.h"
#include "core/wire/envelope.h"
#include "core/wire/cipher.h"
#include "core/wire/seal.h"
#include "../common/plaintext.h"

namespace kdn::store {
namespace {

namespace rt = redis::local;

using Clock = std::chrono::steady_clock;
constexpr char kNs[] = "tenant-a";
constexpr char kUser[] = "kdn";
constexpr char kPassword[] = "redis-test-password-0001";
constexpr std::uint32_t kChunk = 8;  // tokens per chunk: the reference text makes several
// The child process of TwoProcessesShareTheCluster finds the cluster here.
constexpr char kSeedsEnv[] = "KDN_REDIS_TEST_SEEDS";

std::vector<std::uint8_t> Bytes(std::string_view s) { return {s.begin(), s.end()}; }

// Chained chunks of the reference text's KV, kChunk tokens each, keyed as a
// runtime keys them (tenant namespace, model fingerprint, tokens).
std::vector<ChunkRef> RefChunks(const testing::ReferenceKv& r) {
  std::vector<ChunkRef> out;
  keys::ChunkKeyer keyer(0, kNs, r.m.fingerprint);
  keys::Digest prev{};
  const size_t T = r.tokens.size(), row = 32;
  for (std::uint32_t begin = 0; begin + kChunk <= T; begin += kChunk) {
    auto c = std::make_shared<Chunk>();
    prev = keyer.Key(prev, std::span<const std::int32_t>(reinterpret_cast<const std::int32_t*>(r.tokens.data()) + begin, kChunk));
    c->meta.key = prev;
    c->meta.model = r.m.fingerprint;
    c->meta.ns_hash = keys::NamespaceHash(kNs);
    c->meta.layers = 5;
    c->meta.kv_heads = 4;
    c->meta.head_dim = 8;
    c->meta.tokens = kChunk;
    c->meta.first_position = begin;
    std::vector<float> slice;
    for (size_t lk = 0; lk < 10; ++lk) {
      slice.insert(slice.end(), r.canonical.begin() + static_cast<std::ptrdiff_t>((lk * T + begin) * row),
                   r.canonical.begin() + static_cast<std::ptrdiff_t>((lk * T + begin + kChunk) * row));
    }
    c->payload = Payload(reinterpret_cast<const std::uint8_t*>(slice.data()), slice.size() * 4);
    out.push_back(std::move(c));
  }
  return out;
}

bool Same(const ChunkRef& a, const ChunkRef& b) {
  return a && b && a->meta == b->meta && a->payload.size() == b->payload.size() &&
         std::memcmp(a->payload.data(), b->payload.data(), a->payload.size()) == 0;
}

std::string Join(const std::vector<std::string>& seeds) {
  std::string s;
  for (const std::string& x : seeds) s += (s.empty() ? "" : ",") + x;
  return s;
}

ViewSpec View(std::vector<float>& kv) {
  ViewSpec s;
  s.data = kv.data();
  s.size_bytes = kv.size() * 4;
  return s;
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    ref_ = testing::PrefillReference(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog.");
    chunks_ = RefChunks(ref_);
    ASSERT_GE(chunks_.size(), 4u);
    for (const ChunkRef& c : chunks_) keys_.push_back(c->meta.key);
  }

  RedisTierOptions Options(const std::vector<std::string>& seeds) const {
    RedisTierOptions o;
    o.client.seeds = seeds;
    o.client.user = user_;
    o.client.password = password_;
    o.client.command_timeout_ms = 1000;
    o.client.connect_timeout_ms = 500;
    o.retry_ms = 100;
    return o;
  }
  std::unique_ptr<RedisTier> Tier(const RedisTierOptions& o) {
    auto t = RedisTier::Create(o);
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? std::move(t).value() : nullptr;
  }
  // A raw client, to look at (and tamper with) what the tier wrote.
  std::unique_ptr<redis::Client> Raw(const std::vector<std::string>& seeds) const {
    redis::Options o;
    o.seeds = seeds;
    o.user = user_;
    o.password = password_;
    auto c = redis::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // A runtime: a host tier over a redis tier (write-through).
  std::shared_ptr<Runtime> MakeRuntime(const std::vector<std::string>& seeds, const std::string& codec = "") const {
    StoreOptions so;
    so.chunk_tokens = kChunk;
    TierSpec host;
    host.capacity_bytes = 16 << 20;
    host.write_through = true;
    TierSpec redis;
    redis.kind = TierSpec::Kind::kRedis;
    redis.address = Join(seeds);
    redis.user = user_;
    redis.token = password_;
    redis.timeout_ms = 1000;
    redis.codec = codec;
    so.tiers = {host, redis};
    auto rt = Runtime::Create(so, 2);
    EXPECT_TRUE(rt.ok()) << rt.status().message();
    return rt.ok() ? std::move(rt).value() : nullptr;
  }
  std::uint64_t StoreAll(Runtime& rt) {
    std::vector<float> in = ref_.canonical;
    auto views = ResolvedViews::Resolve(ref_.m, std::vector<ViewSpec>{View(in)}, ref_.tokens.size()).value();
    auto stored = rt.Store(ref_.m, kNs, ref_.Keys(), views);
    EXPECT_TRUE(stored.ok()) << stored.status().message();
    rt.store().chain().Flush();
    return stored.ok() ? *stored : 0;
  }
  // Retrieves into a zeroed buffer: the prefix, whether lossy, and the KV.
  KvStore::Retrieved RetrieveAll(Runtime& rt, std::vector<float>* out) {
    out->assign(ref_.canonical.size(), 0.0f);
    auto views = ResolvedViews::Resolve(ref_.m, std::vector<ViewSpec>{View(*out)}, ref_.tokens.size()).value();
    auto got = rt.Retrieve(ref_.m, kNs, ref_.Keys(), views);
    EXPECT_TRUE(got.ok()) << got.status().message();
    return got.ok() ? *got : KvStore::Retrieved{};
  }
  // The text's tokens: its whole chunks and the piece after them are stored.
  std::uint64_t Whole() const { return ref_.tokens.size(); }
  std::uint64_t Objects() const { return (ref_.tokens.size() + kChunk - 1) / kChunk; }
  // Every value the single server holds (as its ACL user).
  static std::vector<std::string> AllValues(const std::string& address) {
    rt::Raw raw(std::stoi(address.substr(address.rfind(':') + 1)));
    EXPECT_EQ(raw.Cmd({"AUTH", kUser, kPassword}), "OK");
    std::vector<std::string> names, out;
    if (auto* r = static_cast<redisReply*>(redisCommand(raw.c, "KEYS *"))) {
      if (r->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < r->elements; ++i) names.emplace_back(r->element[i]->str, r->element[i]->len);
      }
      freeReplyObject(r);
    }
    for (const std::string& n : names) out.push_back(raw.Cmd({"GET", n}));
    return out;
  }
  // Empties the single server (as its ACL user).
  static void Flush(const std::string& address) {
    rt::Raw raw(std::stoi(address.substr(address.rfind(':') + 1)));
    EXPECT_EQ(raw.Cmd({"AUTH", kUser, kPassword}), "OK");
    EXPECT_EQ(raw.Cmd({"FLUSHALL"}), "OK");
  }

  testing::ReferenceKv ref_;
  std::vector<ChunkRef> chunks_;
  std::vector<keys::Digest> keys_;
  std::string user_ = kUser, password_ = kPassword;
};

// ---- A single node -------------------------------------------------------------

// A server whose default user is off: only the ACL user kdn (with its
// password) may do anything.
class RedisSingle : public RedisTierTest {
 protected:
  void SetUp() override {
    RedisTierTest::SetUp();
    if (::testing::Test::IsSkipped() || HasFatalFailure()) return;
    KDN_REQUIRE_REDIS_SERVER(rt::HaveRedis());
    server_ = std::make_unique<rt::Server>(
        tmp_.path / "single", std::vector<std::string>{"--user", "default", "off", "--user", kUser, "on",
                                                       std::string(">") + kPassword, "~*", "&*", "+@all"});
    ASSERT_TRUE(server_->running()) << "redis-server did not start";
    seeds_ = {server_->addr()};
  }
  void TearDown() override { server_.reset(); }
  // Through the C ABI: a host tier written through to a redis tier on this
  // server (kdn_tier_config tiers[1]: its address; the rest is the test's),
  // the reference model's spec and a request of its tokens.
  struct CAbi {
    std::string address;
    kdn_tier_config tiers[2];
    kdn_runtime_options options;
    kdn_model_spec spec;
    kdn_request req;
  };
  // A kdn_kv_view of the canonical layout over `kv`.
  static kdn_kv_view CView(std::vector<float>& kv) {
    kdn_kv_view v;
    EXPECT_EQ(kdn_kv_view_init(&v, sizeof v), KDN_OK);
    v.data = kv.data();
    v.size_bytes = kv.size() * 4;
    return v;
  }
  // Through the C ABI: stores the reference KV (`store`) or retrieves it
  // (into *out when given) with a model made on `rt`, then destroys both;
  // the tokens stored or retrieved, and the redis tier's auth failures.
  std::uint64_t RunCAbi(const CAbi& c, kdn_runtime* rt, bool store, std::uint64_t* auth_failures,
                        std::vector<float>* out = nullptr) {
    kdn_model* m = nullptr;
    EXPECT_EQ(kdn_model_create(rt, &c.spec, &m), KDN_OK);
    std::vector<float> kv = store ? ref_.canonical : std::vector<float>(ref_.canonical.size(), 0.0f);
    const kdn_kv_view v = CView(kv);
    kdn_kv_result res;
    EXPECT_EQ(kdn_kv_result_init(&res, sizeof res), KDN_OK);
    const kdn_status st = store ? kdn_kv_store(m, kNs, std::strlen(kNs), &c.req, &v, 1, &res)
                                : kdn_kv_retrieve(m, kNs, std::strlen(kNs), &c.req, &v, 1, &res);
    EXPECT_EQ(st, KDN_OK) << kdn_last_error_message();
    kdn_tier_stats ts;
    EXPECT_EQ(kdn_tier_stats_init(&ts, sizeof ts), KDN_OK);
    const auto deadline = Clock::now() + std::chrono::seconds(10);  // a store's SETs: written through, soon
    do {
      EXPECT_EQ(kdn_runtime_get_tier_stats(rt, 1, &ts), KDN_OK);
    } while (store && ts.remote_calls < Objects() && Clock::now() < deadline);
    if (auth_failures) *auth_failures = ts.auth_failures;
    if (out) *out = std::move(kv);
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
    return res.tokens;
  }
  // A kdnd config: a host tier written through to a redis tier on this
  // server, the token kToken for kNs, and `server_extra` under [server].
  static constexpr char kToken[] = "token-for-tenant-a-0001";
  std::string KdndToml(const std::string& server_extra) const {
    return std::string("[server]\nlisten = [\"127.0.0.1:0\"]\n") + server_extra +
           "[[tier]]\nkind = \"host\"\ncapacity = \"16MiB\"\nwrite_through = true\n" +
           "[[tier]]\nkind = \"redis\"\naddress = \"" + seeds_[0] + "\"\nuser = \"" + kUser +
           "\"\npassword = \"" + kPassword + "\"\ntimeout_ms = 1000\n" + "[[token]]\ntoken = \"" + kToken +
           "\"\nnamespaces = [\"" + kNs + "\"]\n";
  }
  void InitCAbi(CAbi& c) {
    c.address = Join(seeds_);
    ASSERT_EQ(kdn_tier_config_init(&c.tiers[0], sizeof c.tiers[0]), KDN_OK);
    ASSERT_EQ(kdn_tier_config_init(&c.tiers[1], sizeof c.tiers[1]), KDN_OK);
    c.tiers[0].capacity_bytes = 16 << 20;
    c.tiers[0].write_through = 1;
    c.tiers[1].kind = KDN_TIER_REDIS;
    c.tiers[1].address = c.address.data();
    c.tiers[1].address_len = c.address.size();
    c.tiers[1].user = kUser;
    c.tiers[1].user_len = std::strlen(kUser);
    c.tiers[1].token = kPassword;
    c.tiers[1].token_len = std::strlen(kPassword);
    c.tiers[1].timeout_ms = 1000;
    ASSERT_EQ(kdn_runtime_options_init(&c.options, sizeof c.options), KDN_OK);
    c.options.chunk_tokens = kChunk;
    c.options.tiers = c.tiers;
    c.options.num_tiers = 2;
    ASSERT_EQ(kdn_model_spec_init(&c.spec, sizeof c.spec), KDN_OK);
    c.spec.num_layers = 5;
    c.spec.num_kv_heads = 4;
    c.spec.head_dim = 8;
    c.spec.dtype = KDN_DTYPE_F32;
    c.spec.fingerprint = "stories260K";
    c.spec.fingerprint_len = 11;
    ASSERT_EQ(kdn_request_init(&c.req, sizeof c.req), KDN_OK);
    c.req.tokens = reinterpret_cast<const std::int32_t*>(ref_.tokens.data());
    c.req.num_tokens = ref_.tokens.size();
  }
  // A tier with a short command timeout that holds every chunk, its server
  // then stopped (SIGSTOP: connections stay open, replies never come).
  std::unique_ptr<RedisTier> StoppedServersTier() {
    RedisTierOptions o = Options(seeds_);
    o.client.command_timeout_ms = 300;
    auto tier = Tier(o);
    EXPECT_TRUE(tier);
    if (!tier) return nullptr;
    for (const ChunkRef& c : chunks_) EXPECT_TRUE(tier->Put(c).ok());
    server_->Signal(SIGSTOP);
    return tier;
  }
  rt::TempDir tmp_;
  std::unique_ptr<rt::Server> server_;
  std::vector<std::string> seeds_;
};

TEST_F(RedisSingle, PutGetProbeAndEraseOneKeyPerChunk) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  // One key per chunk: the prefix and the chunk key's hex, holding its envelope.
  auto raw = Raw(seeds_);
  ASSERT_TRUE(raw);
  const std::string name = "kdn:" + keys::ToHex(keys_[0]);
  EXPECT_EQ(tier->KeyOf(keys_[0]), name);
  const std::string_view nv = name;
  auto stored = raw->Get(std::span<const std::string_view>(&nv, 1));
  ASSERT_EQ(stored.size(), 1u);
  ASSERT_TRUE(stored[0].ok() && stored[0]->has_value());
  auto envelope = wire::EncodeEnvelope(*chunks_[0]);
  ASSERT_TRUE(envelope.ok());
  ASSERT_EQ((*stored[0])->size, envelope->size());
  EXPECT_EQ(std::memcmp((*stored[0])->data, envelope->data(), envelope->size()), 0);

  for (size_t i = 0; i < chunks_.size(); ++i) {
    EXPECT_TRUE(tier->Contains(keys_[i])) << i;
    auto got = tier->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(Same(*got, chunks_[i])) << i;
  }
  EXPECT_TRUE(tier->Erase(keys_[1]));
  EXPECT_FALSE(tier->Erase(keys_[1]));
  EXPECT_FALSE(tier->Contains(keys_[1]));
  EXPECT_EQ(tier->Get(keys_[1]).status().code(), Code::kNotFound);
  // Putting a present key again is fine (the same bytes).
  EXPECT_TRUE(tier->Put(chunks_[0]).ok());
  EXPECT_EQ(tier->counters().io_errors, 0u);
  EXPECT_EQ(tier->counters().corrupt_detected, 0u);
  // Capacity is the server's: nothing reported, nothing listed.
  EXPECT_EQ(tier->used_bytes(), 0u);
  EXPECT_TRUE(tier->List().empty());
}

TEST_F(RedisSingle, PrefetchAnswersTheProbesAndReadsThatFollow) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  const size_t held = chunks_.size() - 1;
  for (size_t i = 0; i < held; ++i) ASSERT_TRUE(tier->Put(chunks_[i]).ok());

  std::uint64_t before = tier->redis_counters().client.commands;
  tier->Prefetch(keys_, /*will_read=*/false);
  EXPECT_EQ(tier->redis_counters().client.commands, before + keys_.size());  // one pipelined EXISTS each
  for (size_t i = 0; i < keys_.size(); ++i) EXPECT_EQ(tier->Contains(keys_[i]), i < held) << i;
  EXPECT_EQ(tier->redis_counters().client.commands, before + keys_.size());  // no probe asked again
  EXPECT_EQ(tier->redis_counters().prefetch_used, keys_.size());

  before = tier->redis_counters().client.commands;
  const std::uint64_t used = tier->redis_counters().prefetch_used;
  tier->Prefetch(keys_, /*will_read=*/true);  // returns at once: the reads go on behind
  for (size_t i = 0; i < keys_.size(); ++i) {
    EXPECT_EQ(tier->Contains(keys_[i]), i < held) << i;
    auto got = tier->Get(keys_[i]);
    if (i < held) {
      ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
      EXPECT_TRUE(Same(*got, chunks_[i])) << i;
    } else {
      EXPECT_EQ(got.status().code(), Code::kNotFound) << i;
    }
  }
  // Every key read once, by the read-ahead (the absent one included), and
  // every Get served from it.
  const std::uint64_t sent = tier->redis_counters().client.commands - before;
  EXPECT_EQ(sent, keys_.size());
  EXPECT_EQ(tier->redis_counters().prefetch_used - used, keys_.size());
  // Taken: another read asks the server, and still gets it.
  auto again = tier->Get(keys_[0]);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(Same(*again, chunks_[0]));
  EXPECT_EQ(tier->redis_counters().client.commands - before, sent + 1);
}

// A read-ahead returns at once and reads behind the caller: made while the
// server is stopped (SIGSTOP), it has read nothing when it returns; once the
// server answers again, every Get is served by it.
TEST_F(RedisSingle, AReadAheadReadsBehindTheCaller) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  const RedisCounters before = tier->redis_counters();
  server_->Signal(SIGSTOP);
  tier->Prefetch(keys_, /*will_read=*/true);  // would wait out the 2 s timeout if it read here
  server_->Signal(SIGCONT);
  for (size_t i = 0; i < keys_.size(); ++i) {
    auto got = tier->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(Same(*got, chunks_[i])) << i;
  }
  const RedisCounters after = tier->redis_counters();
  EXPECT_EQ(after.prefetch_used - before.prefetch_used, keys_.size());
  EXPECT_EQ(after.client.commands - before.client.commands, keys_.size());
  EXPECT_EQ(after.client.timeouts, before.client.timeouts);
  EXPECT_EQ(tier->counters().io_errors, 0u);
}

// A read-ahead whose server stopped answering: its Gets miss within the
// timeout, once each, and a tier destroyed meanwhile waits for its reader.
TEST_F(RedisSingle, AReadAheadOfAStoppedServerMissesAndEnds) {
  auto tier = StoppedServersTier();
  ASSERT_TRUE(tier);
  const auto t0 = Clock::now();
  tier->Prefetch(keys_, true);
  EXPECT_EQ(tier->Get(keys_[0]).status().code(), Code::kUnavailable);
  EXPECT_GE(tier->counters().io_errors, 1u);
  tier->Prefetch(keys_, true);  // still reading when the tier goes
  tier.reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  server_->Signal(SIGCONT);
}

TEST_F(RedisSingle, AnEraseIsNotUndoneByAPrefetchedAnswer) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  tier->Prefetch(keys_, true);
  EXPECT_TRUE(tier->Erase(keys_[1]));
  EXPECT_FALSE(tier->Contains(keys_[1]));
  EXPECT_EQ(tier->Get(keys_[1]).status().code(), Code::kNotFound);
}

TEST_F(RedisSingle, KeysExpireAfterTheirTtl) {
  RedisTierOptions o = Options(seeds_);
  o.ttl_ms = 300;
  auto tier = Tier(o);
  ASSERT_TRUE(tier);
  ASSERT_TRUE(tier->Put(chunks_[0]).ok());
  EXPECT_TRUE(tier->Contains(keys_[0]));
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_FALSE(tier->Contains(keys_[0]));
  EXPECT_EQ(tier->Get(keys_[0]).status().code(), Code::kNotFound);
  // Without a TTL, a key stays.
  auto lasting = Tier(Options(seeds_));
  ASSERT_TRUE(lasting->Put(chunks_[1]).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_TRUE(lasting->Contains(keys_[1]));
}

TEST_F(RedisSingle, ARefusedAuthIsAnErrorAtCreation) {
  RedisTierOptions o = Options(seeds_);
  o.client.password = "not-the-password";
  auto t = RedisTier::Create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument) << t.status().message();
  EXPECT_EQ(t.status().message().find("not-the-password"), std::string::npos) << t.status().message();
  o.client.password.clear();
  o.client.user.clear();
  t = RedisTier::Create(o);  // no AUTH at all, where the server wants one
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument) << t.status().message();
  o.client.seeds = {"127.0.0.1"};
  EXPECT_EQ(RedisTier::Create(o).status().code(), Code::kInvalidArgument);
}

TEST_F(RedisSingle, AValueCorruptedInTheServerIsAMissCountedAndRemoved) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  auto raw = Raw(seeds_);
  ASSERT_TRUE(raw);
  // Garbage; an envelope cut short; another chunk's envelope (a valid
  // envelope of the wrong key); a payload byte flipped (its checksum).
  auto cut = wire::EncodeEnvelope(*chunks_[1]).value();
  cut.resize(cut.size() / 2);
  auto flipped = wire::EncodeEnvelope(*chunks_[2]).value();
  flipped[flipped.size() - 64] ^= 0x40;
  const std::vector<std::uint8_t> garbage = Bytes("this is not a kdn envelope");
  const std::string k0 = tier->KeyOf(keys_[0]), k1 = tier->KeyOf(keys_[1]), k2 = tier->KeyOf(keys_[2]);
  const std::string k3 = tier->KeyOf(keys_[3]);
  // keys_[3] gets chunk 0's envelope; keys_[0] gets garbage.
  auto zero = wire::EncodeEnvelope(*chunks_[0]).value();
  const std::vector<redis::KeyValue> items = {
      {k0, garbage}, {k1, cut}, {k2, flipped}, {k3, zero}};
  for (const Status& s : raw->Set(items)) ASSERT_TRUE(s.ok()) << s.message();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(tier->Contains(keys_[i])) << i;  // present, until read
    EXPECT_EQ(tier->Get(keys_[i]).status().code(), Code::kNotFound) << i;
  }
  EXPECT_EQ(tier->counters().corrupt_detected, 4u);
  EXPECT_EQ(tier->counters().io_errors, 0u);
  // Removed from the server.
  const std::vector<std::string_view> names = {k0, k1, k2, k3};
  for (const auto& e : raw->Exists(names)) {
    ASSERT_TRUE(e.ok());
    EXPECT_FALSE(*e);
  }
  // The others still read.
  for (size_t i = 4; i < chunks_.size(); ++i) {
    auto got = tier->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << i;
    EXPECT_TRUE(Same(*got, chunks_[i]));
  }
}

// Issue 31 item 1: a forged envelope (the victim's key, model and
// namespace, another payload, its checksums recomputed: all an attacker who
// can write to the server needs) is KV to a tier without a secret (the
// trust model docs/security.md states) and a miss to a tier with one:
// counted as an authentication failure and deleted. A tier with the secret
// reads what it sealed; one with another secret refuses it; one without a
// secret reads sealed values as they are.
TEST_F(RedisSingle, AForgedEnvelopeIsAMissToATierWithASecret) {
  auto secret = wire::ChunkSealer::FromSecret("a deployment secret of at least 32 bytes, 0001");
  auto other = wire::ChunkSealer::FromSecret("a deployment secret of at least 32 bytes, 0002");
  ASSERT_TRUE(secret.ok() && other.ok());
  RedisTierOptions with = Options(seeds_);
  with.sealer = *secret;
  auto sealed = Tier(with);
  auto plain = Tier(Options(seeds_));
  ASSERT_TRUE(sealed && plain);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(sealed->Put(c).ok());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto got = sealed->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(Same(*got, chunks_[i]));
    auto as_is = plain->Get(keys_[i]);  // no secret: the sealed value read as it is
    ASSERT_TRUE(as_is.ok()) << i << ": " << as_is.status().message();
    EXPECT_TRUE(Same(*as_is, chunks_[i]));
  }
  EXPECT_EQ(sealed->counters().auth_failures, 0u);
  // The forgery: chunk 0's key, model and namespace over chunk 1's KV, a
  // well-formed envelope with correct checksums.
  auto forged_chunk = std::make_shared<Chunk>();
  forged_chunk->meta = chunks_[0]->meta;
  forged_chunk->payload = Payload(chunks_[1]->payload.data(), chunks_[1]->payload.size());
  const auto forged = wire::EncodeEnvelope(*forged_chunk).value();
  auto raw = Raw(seeds_);
  ASSERT_TRUE(raw);
  const std::string k0 = sealed->KeyOf(keys_[0]);
  auto plant = [&](const std::vector<std::uint8_t>& value) {
    const redis::KeyValue item{k0, value};
    for (const Status& s : raw->Set(std::span<const redis::KeyValue>(&item, 1))) ASSERT_TRUE(s.ok()) << s.message();
  };
  plant(forged);
  auto fooled = plain->Get(keys_[0]);
  ASSERT_TRUE(fooled.ok()) << "without a secret the forged KV is served (the stated trust model)";
  EXPECT_TRUE(Same(*fooled, forged_chunk));
  plant(forged);
  EXPECT_EQ(sealed->Get(keys_[0]).status().code(), Code::kNotFound);
  EXPECT_EQ(sealed->counters().auth_failures, 1u);
  EXPECT_EQ(sealed->counters().corrupt_detected, 1u);
  const std::vector<std::string_view> names = {k0};
  ASSERT_EQ(raw->Exists(names).size(), 1u);
  EXPECT_FALSE(*raw->Exists(names)[0]) << "the forged value was not deleted";
  // Sealed with another secret; and the honest seal kept over a forged
  // envelope of the same size.
  std::vector<std::uint8_t> theirs = forged;
  theirs.resize(forged.size() + wire::kSealTrailerBytes);
  ASSERT_TRUE((*other)->Seal(theirs.data(), forged.size(), theirs.data() + forged.size()).ok());
  plant(theirs);
  EXPECT_EQ(sealed->Get(keys_[0]).status().code(), Code::kNotFound);
  ASSERT_TRUE(sealed->Put(chunks_[0]).ok());
  const std::vector<std::string_view> one = {k0};
  auto honest = raw->Get(one);
  ASSERT_EQ(honest.size(), 1u);
  ASSERT_TRUE(honest[0].ok() && honest[0]->has_value());
  const redis::Value& hv = **honest[0];
  std::vector<std::uint8_t> swapped = forged;
  swapped.insert(swapped.end(), hv.data + hv.size - wire::kSealTrailerBytes, hv.data + hv.size);
  ASSERT_EQ(swapped.size(), hv.size) << "the forgery has the honest value's size";
  plant(swapped);
  EXPECT_EQ(sealed->Get(keys_[0]).status().code(), Code::kNotFound);
  EXPECT_EQ(sealed->counters().auth_failures, 3u);
  // The other chunks still read.
  for (size_t i = 1; i < chunks_.size(); ++i) EXPECT_TRUE(sealed->Get(keys_[i]).ok()) << i;
}

// Issue 31 item 6: a value of another type under a chunk key (a list) was
// a permanent miss: probes counted it as cached, reads failed, and nothing
// stored over it. Now a read removes it (counted as corrupt) and the next
// put stores the chunk; through a prefetch too.
TEST_F(RedisSingle, AValueOfAnotherTypeIsRemovedAndStoredOver) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  rt::Raw raw(std::stoi(seeds_[0].substr(seeds_[0].rfind(':') + 1)));
  ASSERT_EQ(raw.Cmd({"AUTH", kUser, kPassword}), "OK");
  for (size_t i : {size_t{0}, size_t{1}}) {
    const std::string k = tier->KeyOf(keys_[i]);
    raw.Cmd({"DEL", k});
    raw.Cmd({"RPUSH", k, "not a chunk"});
    ASSERT_EQ(raw.Cmd({"TYPE", k}), "list");
  }
  // A probe does not take it for a chunk (EXISTS did, and the engine then
  // never stored over it), and counts no error.
  const std::uint64_t io_before = tier->counters().io_errors;
  EXPECT_FALSE(tier->Contains(keys_[0]));
  tier->Prefetch(std::vector<keys::Digest>{keys_[0]}, /*will_read=*/false);
  EXPECT_FALSE(tier->Contains(keys_[0]));
  EXPECT_EQ(tier->counters().io_errors, io_before);
  EXPECT_EQ(tier->Get(keys_[0]).status().code(), Code::kNotFound);
  tier->Prefetch(std::vector<keys::Digest>{keys_[1]}, /*will_read=*/true);
  EXPECT_EQ(tier->Get(keys_[1]).status().code(), Code::kNotFound);
  EXPECT_EQ(tier->counters().corrupt_detected, 2u);
  for (size_t i : {size_t{0}, size_t{1}}) {
    EXPECT_EQ(raw.Cmd({"EXISTS", tier->KeyOf(keys_[i])}), "0") << i;
    EXPECT_FALSE(tier->Contains(keys_[i])) << i;
    ASSERT_TRUE(tier->Put(chunks_[i]).ok());
    auto got = tier->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(Same(*got, chunks_[i]));
  }
}

// One tier from several threads at once: puts, probes, prefetches, reads
// and erases of the same keys; every read is the chunk or a miss.
TEST_F(RedisSingle, ConcurrentCallsEachGetAChunkOrAMiss) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        const size_t i = static_cast<size_t>(round + t) % chunks_.size();
        if (!tier->Put(chunks_[i]).ok()) ++wrong;
        tier->Prefetch(keys_, (round & 1) != 0);
        (void)tier->Contains(keys_[(i + 1) % keys_.size()]);
        auto got = tier->Get(keys_[i]);
        if (got.ok()) {
          ++hits;
          if (!Same(*got, chunks_[i])) ++wrong;
        } else if (got.status().code() != Code::kNotFound) {
          ++wrong;
        }
        if (round % 7 == t) (void)tier->Erase(keys_[i]);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
  EXPECT_EQ(tier->counters().io_errors, 0u);
  EXPECT_EQ(tier->counters().corrupt_detected, 0u);
}

// A server that stops answering (SIGSTOP: connections stay open, replies
// never come) costs misses within the command timeout, and counters; when it
// answers again (SIGCONT), reads hit again.
TEST_F(RedisSingle, AServerThatStopsAnsweringCostsMissesThenHitsAgain) {
  auto tier = StoppedServersTier();
  ASSERT_TRUE(tier);
  const auto t0 = Clock::now();
  EXPECT_FALSE(tier->Contains(keys_[0]));
  EXPECT_NE(tier->Get(keys_[1]).status().code(), Code::kOk);
  tier->Prefetch(keys_, true);
  EXPECT_NE(tier->Get(keys_[2]).status().code(), Code::kOk);
  EXPECT_EQ(tier->Put(chunks_[0]).code(), Code::kUnavailable);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));  // within the timeouts, never a hang
  EXPECT_GE(tier->counters().io_errors, 3u);
  EXPECT_GT(tier->redis_counters().client.timeouts, 0u);
  server_->Signal(SIGCONT);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  Result<ChunkRef> got = Status::NotFound("not yet");
  while (!got.ok() && Clock::now() < deadline) {
    got = tier->Get(keys_[3]);
    if (!got.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_TRUE(Same(*got, chunks_[3]));
}

// A server gone for good (SIGKILL): misses and counters, never an error.
TEST_F(RedisSingle, AServerGoneCostsMissesOnly) {
  auto tier = Tier(Options(seeds_));
  ASSERT_TRUE(tier);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(tier->Put(c).ok());
  server_->Kill(SIGKILL);
  const auto t0 = Clock::now();
  for (size_t i = 0; i < keys_.size(); ++i) {
    EXPECT_FALSE(tier->Contains(keys_[i]));
    EXPECT_NE(tier->Get(keys_[i]).status().code(), Code::kOk);
  }
  EXPECT_EQ(tier->Put(chunks_[0]).code(), Code::kUnavailable);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_GE(tier->counters().io_errors, keys_.size());
}

// No server at creation: the tier is made, misses, and connects once one answers.
TEST_F(RedisSingle, ATierMadeBeforeItsServerMissesUntilItAnswers) {
  server_->Signal(SIGSTOP);
  RedisTierOptions o = Options(seeds_);
  o.client.connect_timeout_ms = 200;
  o.client.command_timeout_ms = 200;
  auto tier = Tier(o);  // no answer: made all the same
  ASSERT_TRUE(tier);
  EXPECT_GE(tier->redis_counters().connect_failures, 1u);
  EXPECT_FALSE(tier->Contains(keys_[0]));
  EXPECT_GE(tier->counters().io_errors, 1u);
  server_->Signal(SIGCONT);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  bool stored = false;
  while (!stored && Clock::now() < deadline) {
    stored = tier->Put(chunks_[0]).ok();
    if (!stored) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(stored);
  EXPECT_TRUE(tier->Contains(keys_[0]));
  EXPECT_GE(tier->redis_counters().connects, 1u);
}

// A runtime with a host tier over the redis tier: the KV it stores reaches
// the server, and a second runtime (an empty host tier) reads it from there.
TEST_F(RedisSingle, RuntimesShareKvThroughTheServer) {
  for (const std::string codec : {"zstd", ""}) {  // lossless, then the default (kdn:balanced)
    SCOPED_TRACE(codec);
    auto a = MakeRuntime(seeds_, codec);
    ASSERT_TRUE(a);
    if (codec.empty()) {
      EXPECT_EQ(a->store().options().tiers[1].codec.rfind("kdn", 0), 0u) << a->store().options().tiers[1].codec;
    }
    EXPECT_EQ(StoreAll(*a), ref_.tokens.size());
    EXPECT_EQ(a->store().Lookup(ref_.m, kNs, ref_.Keys()).tokens, Whole());
    auto b = MakeRuntime(seeds_, codec);
    ASSERT_TRUE(b);
    const LookupResult l = b->store().Lookup(ref_.m, kNs, ref_.Keys());
    EXPECT_EQ(l.tokens, Whole());
    ASSERT_EQ(l.tier_tokens.size(), 2u);
    EXPECT_EQ(l.tier_tokens[0], 0u);
    EXPECT_EQ(l.tier_tokens[1], Whole());
    std::vector<float> out;
    const KvStore::Retrieved r = RetrieveAll(*b, &out);
    EXPECT_EQ(r.tokens, Whole());
    EXPECT_EQ(r.lossy, codec.empty());
    // The KV read back: bit for bit through zstd, close through kdn:balanced.
    const size_t T = ref_.tokens.size(), row = 32;
    double err = 0, norm = 0;
    for (size_t lk = 0; lk < 10; ++lk) {
      for (size_t i = lk * T * row; i < (lk * T + Whole()) * row; ++i) {
        err += (out[i] - ref_.canonical[i]) * double(out[i] - ref_.canonical[i]);
        norm += ref_.canonical[i] * double(ref_.canonical[i]);
      }
    }
    if (codec == "zstd") {
      EXPECT_EQ(err, 0.0);
    } else {
      EXPECT_GT(err, 0.0);                      // encoded, not copied
      EXPECT_LT(std::sqrt(err / norm), 0.05);   // and close
    }
    const auto stats = b->store().chain().Stats();
    EXPECT_EQ(stats[1].io_errors, 0u);
    EXPECT_GT(stats[1].hits, 0u);
    Flush(seeds_[0]);  // clean for the next codec
  }
}

// A knowledge item's chunks are deleted together: one DEL batch, after which
// the server holds none of them; an item sharing chunks keeps them.
TEST_F(RedisSingle, AKnowledgeItemsKeysAreDeletedTogether) {
  auto rt = MakeRuntime(seeds_, "zstd");
  ASSERT_TRUE(rt);
  std::vector<float> in = ref_.canonical;
  const size_t T = ref_.tokens.size();
  auto views = ResolvedViews::Resolve(ref_.m, std::vector<ViewSpec>{View(in)}, T).value();
  const std::span<const std::int32_t> ids(reinterpret_cast<const std::int32_t*>(ref_.tokens.data()), T);
  ASSERT_TRUE(rt->knowledge().Put(ref_.m, kNs, "doc", 1, "", ids, views).ok());
  ASSERT_TRUE(rt->knowledge().Put(ref_.m, kNs, "copy", 1, "", ids, views).ok());  // the same chunks
  rt->store().chain().Flush();
  rt::Raw raw(std::stoi(seeds_[0].substr(seeds_[0].rfind(':') + 1)));
  ASSERT_EQ(raw.Cmd({"AUTH", kUser, kPassword}), "OK");
  const std::string held = raw.Cmd({"DBSIZE"});
  ASSERT_GE(std::stoul(held), Objects() - 1) << held;  // whole chunks at least
  const std::string dels = "cmdstat_del:calls=";
  auto del_calls = [&] {
    const std::string info = raw.Cmd({"INFO", "commandstats"});
    const size_t at = info.find(dels);
    return at == std::string::npos ? 0ul : std::stoul(info.substr(at + dels.size()));
  };
  ASSERT_TRUE(rt->knowledge().Delete(ref_.m, kNs, "doc").ok());
  EXPECT_EQ(raw.Cmd({"DBSIZE"}), held);  // "copy" still uses every chunk
  EXPECT_EQ(del_calls(), 0u);
  ASSERT_TRUE(rt->knowledge().Delete(ref_.m, kNs, "copy").ok());
  EXPECT_EQ(raw.Cmd({"DBSIZE"}), "0");
  EXPECT_EQ(del_calls(), std::stoul(held));  // one DEL per key, sent as one batch
  EXPECT_EQ(rt->store().chain().Stats()[1].io_errors, 0u);
}

// A redis tier with quality levels (a LeveledTier around the redis one)
// reports its transport counters through kdn_runtime_get_tier_stats as a
// plain one does: they read 0 while the shim looked for the concrete tier.
TEST_F(RedisSingle, ARedisTierWithLevelsReportsItsTransportCounters) {
  CAbi c;
  ASSERT_NO_FATAL_FAILURE(InitCAbi(c));
  const std::string levels = "raw; kdn:balanced";
  c.tiers[1].levels = levels.data();
  c.tiers[1].levels_len = levels.size();
  kdn_runtime* rt = nullptr;
  ASSERT_EQ(kdn_runtime_create(&c.options, &rt), KDN_OK) << kdn_last_error_message();
  kdn_model* m = nullptr;
  ASSERT_EQ(kdn_model_create(rt, &c.spec, &m), KDN_OK);
  kdn_request& req = c.req;
  std::vector<float> in = ref_.canonical;
  kdn_kv_view v;
  ASSERT_EQ(kdn_kv_view_init(&v, sizeof v), KDN_OK);
  v.data = in.data();
  v.size_bytes = in.size() * 4;
  kdn_kv_result res;
  ASSERT_EQ(kdn_kv_result_init(&res, sizeof res), KDN_OK);
  ASSERT_EQ(kdn_kv_store(m, kNs, std::strlen(kNs), &req, &v, 1, &res), KDN_OK) << kdn_last_error_message();
  // Written through by the mover: a SET per chunk and level, soon.
  kdn_tier_stats ts;
  ASSERT_EQ(kdn_tier_stats_init(&ts, sizeof ts), KDN_OK);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  do {
    ASSERT_EQ(kdn_runtime_get_tier_stats(rt, 1, &ts), KDN_OK);
  } while (ts.remote_calls < Objects() && Clock::now() < deadline);
  EXPECT_EQ(ts.kind, KDN_TIER_REDIS);
  EXPECT_GE(ts.remote_calls, Objects());
  EXPECT_EQ(ts.remote_failed_calls, 0u);
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

// The C ABI: KDN_TIER_REDIS under a host tier, written through, read back by
// a second runtime; its stats; a refused AUTH and a malformed address.
TEST_F(RedisSingle, TheCAbisRedisTier) {
  CAbi c;
  ASSERT_NO_FATAL_FAILURE(InitCAbi(c));
  kdn_tier_config* tiers = c.tiers;
  tiers[1].token = "wrong-password";
  tiers[1].token_len = std::strlen(tiers[1].token);
  tiers[1].codec = "zstd";
  tiers[1].codec_len = 4;
  kdn_runtime_options& ro = c.options;
  kdn_runtime* rt = nullptr;
  EXPECT_EQ(kdn_runtime_create(&ro, &rt), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(rt, nullptr);
  EXPECT_EQ(std::string(kdn_last_error_message()).find("wrong-password"), std::string::npos);
  tiers[1].token = kPassword;
  tiers[1].token_len = std::strlen(kPassword);
  kdn_model_spec& spec = c.spec;
  kdn_request& req = c.req;
  auto view_of = [&](std::vector<float>& kv) {
    kdn_kv_view v;
    EXPECT_EQ(kdn_kv_view_init(&v, sizeof v), KDN_OK);
    v.data = kv.data();
    v.size_bytes = kv.size() * 4;
    return v;
  };

  {
    ASSERT_EQ(kdn_runtime_create(&ro, &rt), KDN_OK) << kdn_last_error_message();
    kdn_model* m = nullptr;
    ASSERT_EQ(kdn_model_create(rt, &spec, &m), KDN_OK);
    std::vector<float> in = ref_.canonical;
    const kdn_kv_view v = view_of(in);
    kdn_kv_result res;
    ASSERT_EQ(kdn_kv_result_init(&res, sizeof res), KDN_OK);
    ASSERT_EQ(kdn_kv_store(m, kNs, std::strlen(kNs), &req, &v, 1, &res), KDN_OK) << kdn_last_error_message();
    EXPECT_EQ(res.tokens, ref_.tokens.size());
    // Written through by the store's mover: a SET per chunk, soon.
    kdn_tier_stats ts;
    ASSERT_EQ(kdn_tier_stats_init(&ts, sizeof ts), KDN_OK);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    do {
      ASSERT_EQ(kdn_runtime_get_tier_stats(rt, 1, &ts), KDN_OK);
    } while (ts.remote_calls < Objects() && Clock::now() < deadline);
    EXPECT_EQ(ts.kind, KDN_TIER_REDIS);
    EXPECT_STREQ(ts.name, "redis");
    EXPECT_EQ(std::string(ts.codec).rfind("zstd", 0), 0u) << ts.codec;
    EXPECT_GE(ts.remote_calls, Objects());
    EXPECT_EQ(ts.remote_failed_calls, 0u);
    EXPECT_EQ(ts.io_errors, 0u);
    EXPECT_EQ(ts.used_bytes, 0u);
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
  }
  {
    ASSERT_EQ(kdn_runtime_create(&ro, &rt), KDN_OK) << kdn_last_error_message();
    kdn_model* m = nullptr;
    ASSERT_EQ(kdn_model_create(rt, &spec, &m), KDN_OK);
    kdn_lookup_result lr;
    ASSERT_EQ(kdn_lookup_result_init(&lr, sizeof lr), KDN_OK);
    ASSERT_EQ(kdn_kv_lookup(m, kNs, std::strlen(kNs), &req, 1, &lr), KDN_OK);
    EXPECT_EQ(lr.cached_tokens, Whole());
    std::vector<float> out(ref_.canonical.size(), 0.0f);
    const kdn_kv_view v = view_of(out);
    kdn_kv_result res;
    ASSERT_EQ(kdn_kv_result_init(&res, sizeof res), KDN_OK);
    ASSERT_EQ(kdn_kv_retrieve(m, kNs, std::strlen(kNs), &req, &v, 1, &res), KDN_OK) << kdn_last_error_message();
    EXPECT_EQ(res.tokens, Whole());
    EXPECT_EQ(res.flags & KDN_RESULT_LOSSY, 0u);  // zstd: lossless
    const size_t T = ref_.tokens.size(), row = 32;
    for (size_t lk = 0; lk < 10; ++lk) {
      ASSERT_EQ(std::memcmp(&out[lk * T * row], &ref_.canonical[lk * T * row], Whole() * row * 4), 0) << lk;
    }
    kdn_tier_stats ts;
    ASSERT_EQ(kdn_tier_stats_init(&ts, sizeof ts), KDN_OK);
    ASSERT_EQ(kdn_runtime_get_tier_stats(rt, 1, &ts), KDN_OK);
    EXPECT_GE(ts.hits, Objects());
    EXPECT_GT(ts.remote_calls, 0u);
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
  }
  tiers[1].address = "127.0.0.1:notaport";
  tiers[1].address_len = std::strlen(tiers[1].address);
  EXPECT_EQ(kdn_runtime_create(&ro, &rt), KDN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kdn_last_error_message()).find("port"), std::string::npos) << kdn_last_error_message();
}

// kdnd with a redis tier (its TOML, as an operator writes it): the chunks an
// engine sends it land in Redis, and a fresh kdnd over the same server (its
// host tier empty) serves them to a fresh engine.
// The secret through the C ABI (kdn_runtime_options.secret_file, 1.8):
// runtimes that share it share KV through the server; one with another
// secret gets misses (counted: kdn_tier_stats.auth_failures); files that are
// missing, open to others or too short are refused at creation.
TEST_F(RedisSingle, TheCAbisSecretFile) {
  CAbi c;
  ASSERT_NO_FATAL_FAILURE(InitCAbi(c));
  c.tiers[0].capacity_bytes = 1 << 20;
  const std::string dir = (tmp_.path / "secrets").string();
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes, mode_t mode) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << bytes;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  };
  const std::string ours = write("ours", "secret-of-this-deployment-32-bytes-at-least", 0600);
  const std::string theirs = write("theirs", "secret-of-another-deployment-32-bytes-at-least", 0600);
  const std::string open_to_all = write("open", "secret-of-this-deployment-32-bytes-at-least", 0644);
  const std::string short_one = write("short", "too short", 0600);
  auto create = [&](const std::string& secret_file, kdn_status want) -> kdn_runtime* {
    c.options.secret_file = secret_file.empty() ? nullptr : secret_file.data();
    c.options.secret_file_len = secret_file.size();
    kdn_runtime* rt = nullptr;
    EXPECT_EQ(kdn_runtime_create(&c.options, &rt), want) << secret_file << ": " << kdn_last_error_message();
    return rt;
  };
  EXPECT_EQ(create(open_to_all, KDN_ERR_INVALID_ARGUMENT), nullptr);
  EXPECT_NE(std::string(kdn_last_error_message()).find("chmod"), std::string::npos) << kdn_last_error_message();
  EXPECT_EQ(create(short_one, KDN_ERR_INVALID_ARGUMENT), nullptr);
  EXPECT_EQ(create(dir + "/missing", KDN_ERR_INVALID_ARGUMENT), nullptr);
  // Store with ours; read with ours, with none (taken as it is) and with theirs.
  auto run = [&](kdn_runtime* rt, bool store, std::uint64_t* auth_failures) {
    return RunCAbi(c, rt, store, auth_failures);
  };
  kdn_runtime* writer = create(ours, KDN_OK);
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(run(writer, true, nullptr), ref_.tokens.size());
  std::uint64_t failures = 0;
  kdn_runtime* reader = create(ours, KDN_OK);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(run(reader, false, &failures), Whole());
  EXPECT_EQ(failures, 0u);
  kdn_runtime* trusting = create("", KDN_OK);
  ASSERT_NE(trusting, nullptr);
  EXPECT_EQ(run(trusting, false, nullptr), Whole()) << "without a secret, sealed chunks are read as they are";
  kdn_runtime* stranger = create(theirs, KDN_OK);
  ASSERT_NE(stranger, nullptr);
  EXPECT_EQ(run(stranger, false, &failures), 0u);
  EXPECT_GE(failures, 1u);
  c.options.secret_file = nullptr;
  c.options.secret_file_len = 5;
  kdn_runtime* rt = nullptr;
  EXPECT_EQ(kdn_runtime_create(&c.options, &rt), KDN_ERR_INVALID_ARGUMENT);
}

TEST_F(RedisSingle, AKdndKeepsItsChunksInRedis) {
  auto config = server::ParseConfig(KdndToml(""), "kdnd.toml");
  ASSERT_TRUE(config.ok()) << config.status().message();
  namespace ts = server::testing_support;
  {
    ts::RunningServer node(*config);
    auto engine = ts::RemoteRuntime(node.bound().rpc[0], kToken, "zstd");
    ASSERT_TRUE(engine);
    EXPECT_EQ(StoreAll(*engine), ref_.tokens.size());
    engine->store().chain().Flush();  // sent to the node
    // The node wrote them through to Redis (its mover: soon), under the
    // keys it files them by (per namespace).
    auto tier = Tier(Options(seeds_));
    std::vector<keys::Digest> filed;
    for (const keys::Digest& k : keys_) filed.push_back(server::ObjectKey(keys::NamespaceHash(kNs), k));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!tier->Contains(filed.back()) && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (size_t i = 0; i < filed.size(); ++i) EXPECT_TRUE(tier->Contains(filed[i])) << i;
    auto got = tier->Get(filed[0]);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(got.value()->meta.tokens, kChunk);
    EXPECT_EQ(got.value()->meta.codec, codec::CodecId::kZstd);  // as the engine encoded it
  }
  ts::RunningServer fresh(*config);
  auto engine = ts::RemoteRuntime(fresh.bound().rpc[0], kToken, "zstd");
  ASSERT_TRUE(engine);
  std::vector<float> out;
  const KvStore::Retrieved r = RetrieveAll(*engine, &out);
  EXPECT_EQ(r.tokens, Whole());
  EXPECT_FALSE(r.lossy);
  const size_t T = ref_.tokens.size(), row = 32;
  for (size_t lk = 0; lk < 10; ++lk) {
    ASSERT_EQ(std::memcmp(&out[lk * T * row], &ref_.canonical[lk * T * row], Whole() * row * 4), 0) << lk;
  }
}

// kdnd with a secret (server.secret_file): its redis tier seals what it
// writes through, and a chunk planted in the server under a key the node
// files (another payload, correct checksums) is a miss, deleted; the same
// plant through a node without a secret is served (the trust model).
TEST_F(RedisSingle, AKdndWithASecretServesNoPlantedChunk) {
  const std::string secret = (tmp_.path / "kdnd.secret").string();
  std::ofstream(secret) << "the node's secret, 32 bytes at the very least";
  ASSERT_EQ(::chmod(secret.c_str(), 0600), 0);
  for (const bool sealed : {true, false}) {
    SCOPED_TRACE(sealed ? "with a secret" : "without");
    Flush(seeds_[0]);
    auto config = server::ParseConfig(KdndToml(sealed ? "secret_file = \"" + secret + "\"\n" : ""), "kdnd.toml");
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->secret_file, sealed ? secret : "");
    namespace ts = server::testing_support;
    std::vector<keys::Digest> filed;
    for (const keys::Digest& k : keys_) filed.push_back(server::ObjectKey(keys::NamespaceHash(kNs), k));
    auto plain = Tier(Options(seeds_));  // reads sealed values as they are
    {
      ts::RunningServer node(*config);
      auto engine = ts::RemoteRuntime(node.bound().rpc[0], kToken, "zstd");
      ASSERT_TRUE(engine);
      EXPECT_EQ(StoreAll(*engine), ref_.tokens.size());
      engine->store().chain().Flush();
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (!plain->Contains(filed.back()) && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    // The plant: chunk 0's filed key and meta over chunk 1's bytes.
    auto honest0 = plain->Get(filed[0]);
    auto honest1 = plain->Get(filed[1]);
    ASSERT_TRUE(honest0.ok() && honest1.ok());
    auto forged = std::make_shared<Chunk>();
    forged->meta = (*honest0)->meta;
    forged->meta.tokens = (*honest1)->meta.tokens;
    forged->payload = Payload((*honest1)->payload.data(), (*honest1)->payload.size());
    const auto bytes = wire::EncodeEnvelope(*forged).value();
    auto raw = Raw(seeds_);
    ASSERT_TRUE(raw);
    const std::string k0 = plain->KeyOf(filed[0]);
    const redis::KeyValue item{k0, bytes};
    for (const Status& st : raw->Set(std::span<const redis::KeyValue>(&item, 1))) ASSERT_TRUE(st.ok());
    ts::RunningServer fresh(*config);  // an empty host tier: chunks come from Redis
    auto engine = ts::RemoteRuntime(fresh.bound().rpc[0], kToken, "zstd");
    ASSERT_TRUE(engine);
    std::vector<float> out;
    const KvStore::Retrieved r = RetrieveAll(*engine, &out);
    if (sealed) {
      EXPECT_EQ(r.tokens, 0u) << "the planted first chunk was served";
      const std::vector<std::string_view> names = {k0};
      EXPECT_FALSE(*raw->Exists(names)[0]) << "the planted value was not deleted";
    } else {
      EXPECT_EQ(r.tokens, Whole()) << "without a secret the node serves what Redis holds";
      const size_t T = ref_.tokens.size(), row = 32;
      EXPECT_NE(std::memcmp(&out[0], &ref_.canonical[0], kChunk * row * 4), 0) << "and the plant is what it serves";
      (void)T;
    }
  }
}

// Encryption at rest (issue 37, item 2; wire/cipher.h). The values a tier
// with master keys SETs hold none of the KV in the clear (searched for block
// by block; a tier without keys shows all of it); a value whose ciphertext
// was changed (its checksums made right) is a miss, counted and deleted; a
// tier without the key misses, counted.
const std::string kRedisKeyA = "8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b8e73b0f7da0e6452";
const std::string kRedisKeyB = "c47b0294dbbbee0fec4757f22ffeee3587ca4730c3d33b691df38bab076bc558";

TEST_F(RedisSingle, AnEncryptingTierStoresNoKvInTheClear) {
  RedisTierOptions with = Options(seeds_);
  with.cipher = wire::ChunkCipher::FromText(kRedisKeyA, "A").value();
  auto sealed = Tier(with);
  auto plain = Tier(Options(seeds_));
  ASSERT_TRUE(sealed && plain);
  auto raw = Raw(seeds_);
  ASSERT_TRUE(raw);
  std::vector<std::string_view> kv;
  for (const ChunkRef& c : chunks_) kv.emplace_back(reinterpret_cast<const char*>(c->payload.data()), c->payload.size());
  auto values = [&] {
    std::vector<std::string> names, out;
    for (const keys::Digest& k : keys_) names.push_back(sealed->KeyOf(k));
    std::vector<std::string_view> views(names.begin(), names.end());
    for (auto& v : raw->Get(views)) {
      if (v.ok() && v->has_value()) out.emplace_back(reinterpret_cast<const char*>((*v)->data), (*v)->size);
    }
    return out;
  };
  // The search's control: a tier without keys stores every block as it is.
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(plain->Put(c).ok());
  size_t blocks = 0;
  EXPECT_EQ(testing::PlaintextBlocksFound(kv, values(), &blocks), blocks);
  ASSERT_GT(blocks, 100u);
  Flush(seeds_[0]);
  for (const ChunkRef& c : chunks_) ASSERT_TRUE(sealed->Put(c).ok());
  ASSERT_EQ(values().size(), chunks_.size());
  EXPECT_EQ(testing::PlaintextBlocksFound(kv, values()), 0u) << "KV in the clear in the server";
  EXPECT_EQ(sealed->Cost(*chunks_[0]), wire::EncodedEnvelopeSize(chunks_[0]->payload.size() + wire::kEncryptionOverhead));
  for (size_t i = 0; i < chunks_.size(); ++i) {
    auto got = sealed->Get(keys_[i]);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().message();
    EXPECT_TRUE(Same(*got, chunks_[i])) << i;
  }
  EXPECT_EQ(sealed->counters().auth_failures, 0u);
  // Without the key (no keys, or another ring): a miss, counted, deleted.
  RedisTierOptions other = Options(seeds_);
  other.cipher = wire::ChunkCipher::FromText(kRedisKeyB, "B").value();
  auto stranger = Tier(other);
  EXPECT_EQ(stranger->Get(keys_[3]).status().code(), Code::kNotFound);
  EXPECT_EQ(stranger->counters().auth_failures, 1u);
  EXPECT_EQ(plain->Get(keys_[2]).status().code(), Code::kNotFound);
  EXPECT_EQ(plain->counters().auth_failures, 1u);
  // The tamper: chunk 0's value with one ciphertext bit flipped, its
  // envelope's checksums recomputed.
  const std::string k0 = sealed->KeyOf(keys_[0]);
  const std::vector<std::string_view> one = {k0};
  auto stored = raw->Get(one);
  ASSERT_TRUE(stored.size() == 1 && stored[0].ok() && stored[0]->has_value());
  auto c = wire::DecodeEnvelope((*stored[0])->data, (*stored[0])->size, &keys_[0]).value();
  Chunk changed;
  changed.meta = c->meta;
  changed.payload = Payload(c->payload.data(), c->payload.size());
  changed.payload[wire::kEncryptedHeaderBytes + 7] ^= 0x20;
  const auto bytes = wire::EncodeEnvelope(changed).value();
  const redis::KeyValue item{k0, bytes};
  for (const Status& st : raw->Set(std::span<const redis::KeyValue>(&item, 1))) ASSERT_TRUE(st.ok());
  EXPECT_EQ(sealed->Get(keys_[0]).status().code(), Code::kNotFound);
  EXPECT_EQ(sealed->counters().auth_failures, 1u);
  EXPECT_FALSE(*raw->Exists(one)[0]) << "the tampered value was not deleted";
  EXPECT_TRUE(sealed->Get(keys_[1]).ok());
}

// The C ABI's master keys (since 1.14): a file or an environment variable.
// Stored with key A (a file): the server's values hold no KV in the clear;
// read back with A from a variable, whole; with key B or no keys, misses
// (counted: kdn_tier_stats.auth_failures); bad sources refused.
TEST_F(RedisSingle, TheCAbisMasterKeys) {
  CAbi c;
  ASSERT_NO_FATAL_FAILURE(InitCAbi(c));
  c.tiers[1].codec = "raw";  // the stored bytes are the KV's own: the search below finds them if in the clear
  c.tiers[1].codec_len = 3;
  const std::string a = (tmp_.path / "a.keys").string(), b = (tmp_.path / "b.keys").string();
  std::ofstream(a) << kRedisKeyA << "\n";
  std::ofstream(b) << kRedisKeyB << "\n";
  ASSERT_EQ(::chmod(a.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(b.c_str(), 0600), 0);
  ::setenv("KDN_TEST_KEYS_A", kRedisKeyA.c_str(), 1);
  std::vector<float> kv_back;
  auto create = [&](const std::string& file, const std::string& env, kdn_status want) -> kdn_runtime* {
    c.options.encryption_key_file = file.empty() ? nullptr : file.data();
    c.options.encryption_key_file_len = file.size();
    c.options.encryption_key_env = env.empty() ? nullptr : env.data();
    c.options.encryption_key_env_len = env.size();
    kdn_runtime* rt = nullptr;
    EXPECT_EQ(kdn_runtime_create(&c.options, &rt), want) << file << env << ": " << kdn_last_error_message();
    return rt;
  };
  auto run = [&](kdn_runtime* rt, bool store, std::uint64_t* auth_failures) {
    const std::uint64_t tokens = RunCAbi(c, rt, store, auth_failures, &kv_back);
    if (!store && tokens == ref_.tokens.size()) {
      EXPECT_EQ(kv_back, ref_.canonical);
    }
    return tokens;
  };
  kdn_runtime* writer = create(a, "", KDN_OK);
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(run(writer, true, nullptr), ref_.tokens.size());
  const std::vector<std::string> values = AllValues(seeds_[0]);
  ASSERT_GE(values.size(), keys_.size());
  std::vector<std::string_view> kv;
  for (const ChunkRef& ch : chunks_) kv.emplace_back(reinterpret_cast<const char*>(ch.get()->payload.data()), ch->payload.size());
  size_t blocks = 0;
  EXPECT_EQ(testing::PlaintextBlocksFound(kv, values, &blocks), 0u) << "KV in the clear in the server";
  ASSERT_GT(blocks, 100u);
  std::uint64_t failures = 0;
  kdn_runtime* reader = create("", "KDN_TEST_KEYS_A", KDN_OK);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(run(reader, false, &failures), Whole());
  EXPECT_EQ(failures, 0u);
  kdn_runtime* stranger = create(b, "", KDN_OK);
  ASSERT_NE(stranger, nullptr);
  EXPECT_EQ(run(stranger, false, &failures), 0u);
  EXPECT_GE(failures, 1u);
  // Refused: both sources, a variable not set, a length without a pointer.
  EXPECT_EQ(create(a, "KDN_TEST_KEYS_A", KDN_ERR_INVALID_ARGUMENT), nullptr);
  EXPECT_EQ(create("", "KDN_TEST_KEYS_NOT_SET", KDN_ERR_INVALID_ARGUMENT), nullptr);
  EXPECT_EQ(std::string(kdn_last_error_message()).find(kRedisKeyA.substr(0, 16)), std::string::npos);
  c.options.encryption_key_file = nullptr;
  c.options.encryption_key_file_len = 3;
  kdn_runtime* rt = nullptr;
  EXPECT_EQ(kdn_runtime_create(&c.options, &rt), KDN_ERR_INVALID_ARGUMENT);
  ::unsetenv("KDN_TEST_KEYS_A");
  // Last, a runtime without keys: the encrypted chunks are misses, counted.
  // (The stranger deleted those it read: stored again first.)
  ::setenv("KDN_TEST_KEYS_A", kRedisKeyA.c_str(), 1);
  kdn_runtime* again = create("", "KDN_TEST_KEYS_A", KDN_OK);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(run(again, true, nullptr), ref_.tokens.size());
  ::unsetenv("KDN_TEST_KEYS_A");
  kdn_runtime* keyless = create("", "", KDN_OK);
  ASSERT_NE(keyless, nullptr);
  EXPECT_EQ(run(keyless, false, &failures), 0u);
  EXPECT_GE(failures, 1u);
}

// kdnd's own tiers, and its clients' (issue 37, item 2): a node with master
// keys (server.encryption_key_file) encrypts what it writes through to Redis
// of the chunks its clients sent in the clear; a client with keys encrypts
// what it sends, so that neither the node's memory nor its Redis holds its
// KV in the clear, and the node stores and serves it as it came. Either way
// the server's values hold none of the KV, and a fresh node (an empty host
// tier) serves it back whole to the client; a client without the key misses.
TEST_F(RedisSingle, AKdndAndItsClientsEncryptWhatTheyStore) {
  const std::string node_keys = (tmp_.path / "node.keys").string(), client_keys = (tmp_.path / "client.keys").string();
  std::ofstream(node_keys) << kRedisKeyA << "\n";
  std::ofstream(client_keys) << kRedisKeyB << "\n";
  ASSERT_EQ(::chmod(node_keys.c_str(), 0600), 0);
  ASSERT_EQ(::chmod(client_keys.c_str(), 0600), 0);
  std::vector<std::string_view> kv;
  for (const ChunkRef& c : chunks_) kv.emplace_back(reinterpret_cast<const char*>(c->payload.data()), c->payload.size());
  std::vector<keys::Digest> filed;
  for (const keys::Digest& k : keys_) filed.push_back(server::ObjectKey(keys::NamespaceHash(kNs), k));
  auto raw = Raw(seeds_);
  ASSERT_TRUE(raw);
  auto plain = Tier(Options(seeds_));
  struct Case {
    const char* name;
    bool node_encrypts, client_encrypts;
  };
  for (const Case& k : {Case{"neither (the search's control)", false, false}, Case{"the node", true, false},
                        Case{"the client", false, true}}) {
    SCOPED_TRACE(k.name);
    Flush(seeds_[0]);
    auto config = server::ParseConfig(
        KdndToml(k.node_encrypts ? "encryption_key_file = \"" + node_keys + "\"\n" : ""), "kdnd.toml");
    ASSERT_TRUE(config.ok()) << config.status().message();
    EXPECT_EQ(config->encryption_key_file, k.node_encrypts ? node_keys : "");
    namespace ts = server::testing_support;
    const std::string keys = k.client_encrypts ? client_keys : "";
    std::vector<std::string> names;
    for (const keys::Digest& f : filed) names.push_back(plain->KeyOf(f));
    std::vector<std::string_view> views(names.begin(), names.end());
    std::vector<std::string> values;
    {
      ts::RunningServer node(*config);
      auto engine = ts::RemoteRuntime(node.bound().rpc[0], kToken, "raw", 2000, "", "", "", keys);
      ASSERT_TRUE(engine);
      EXPECT_EQ(StoreAll(*engine), ref_.tokens.size());
      engine->store().chain().Flush();
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (Clock::now() < deadline) {
        auto e = raw->Exists(views);
        if (std::all_of(e.begin(), e.end(), [](const auto& x) { return x.ok() && *x; })) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      for (auto& v : raw->Get(views)) {
        if (v.ok() && v->has_value()) values.emplace_back(reinterpret_cast<const char*>((*v)->data), (*v)->size);
      }
    }
    ASSERT_EQ(values.size(), filed.size());
    size_t blocks = 0;
    const size_t found = testing::PlaintextBlocksFound(kv, values, &blocks);
    if (k.node_encrypts || k.client_encrypts) {
      EXPECT_EQ(found, 0u) << "KV in the clear in the node's Redis";
    } else {
      EXPECT_EQ(found, blocks);
    }
    ts::RunningServer fresh(*config);  // an empty host tier: chunks come from Redis
    auto engine = ts::RemoteRuntime(fresh.bound().rpc[0], kToken, "raw", 2000, "", "", "", keys);
    ASSERT_TRUE(engine);
    std::vector<float> out;
    EXPECT_EQ(RetrieveAll(*engine, &out).tokens, Whole());
    const size_t row = 32, T = ref_.tokens.size();
    for (size_t lk = 0; lk < 10; ++lk) {
      ASSERT_EQ(std::memcmp(&out[lk * T * row], &ref_.canonical[lk * T * row], Whole() * row * 4), 0) << lk;
    }
    if (k.client_encrypts) {
      // Another client without the key: the node serves the ciphertext, the
      // client's remote tier cannot open it (a miss, counted).
      auto keyless = ts::RemoteRuntime(fresh.bound().rpc[0], kToken, "raw");
      ASSERT_TRUE(keyless);
      EXPECT_EQ(RetrieveAll(*keyless, &out).tokens, 0u);
      EXPECT_GE(keyless->store().chain().Stats()[0].auth_failures, 1u);
    }
  }
}

// ---- A cluster -----------------------------------------------------------------

class RedisCluster : public RedisTierTest {
 protected:
  void SetUp() override {
    RedisTierTest::SetUp();
    if (::testing::Test::IsSkipped() || HasFatalFailure()) return;
    user_.clear();
    password_.clear();
    const bool child = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) == "ChildReads";
    if (child && std::getenv(kSeedsEnv) == nullptr) GTEST_SKIP() << "run by TwoProcessesShareTheCluster";
    if (const char* seeds = std::getenv(kSeedsEnv)) {
      // The child of TwoProcessesShareTheCluster: the parent's cluster.
      auto parsed = ParseRedisSeeds(seeds);
      ASSERT_TRUE(parsed.ok());
      seeds_ = std::move(parsed).value();
      return;
    }
    KDN_REQUIRE_REDIS_SERVER(rt::HaveRedis());
    cluster_ = std::make_unique<rt::Cluster>();
    ASSERT_TRUE(cluster_->error().empty()) << cluster_->error();
    seeds_ = {cluster_->node(0).addr()};  // one seed: the rest are learned
  }
  void TearDown() override { cluster_.reset(); }
  // The indices of the masters now.
  std::vector<size_t> Masters() {
    std::vector<size_t> out;
    for (size_t i = 0; i < cluster_->size(); ++i) {
      if (cluster_->node(i).running() && cluster_->IsMaster(i)) out.push_back(i);
    }
    return out;
  }
  std::uint64_t Keys(size_t node) {
    return std::strtoull(rt::Raw(cluster_->node(node).port()).Cmd({"DBSIZE"}).c_str(), nullptr, 10);
  }
  // Until the replicas hold as many keys as their masters.
  bool WaitForReplication() {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      std::uint64_t masters = 0, all = 0;
      for (size_t i = 0; i < cluster_->size(); ++i) {
        const std::uint64_t n = Keys(i);
        all += n;
        if (cluster_->IsMaster(i)) masters += n;
      }
      if (masters > 0 && all == 2 * masters) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::unique_ptr<rt::Cluster> cluster_;
  std::vector<std::string> seeds_;
};

TEST_F(RedisCluster, KeysSpreadOverTheMasters) {
  if (!cluster_) GTEST_SKIP() << "the child process's half";
  // Many chunks: the reference chunks under 16 prefixes (other keys, the
  // same KV), so that every master gets some.
  std::vector<std::unique_ptr<RedisTier>> tiers;
  for (int p = 0; p < 16; ++p) {
    RedisTierOptions o = Options(seeds_);
    o.key_prefix = "kdn:" + std::to_string(p) + ":";
    tiers.push_back(Tier(o));
    for (const ChunkRef& c : chunks_) ASSERT_TRUE(tiers.back()->Put(c).ok());
  }
  // Each master holds some of them, and together all.
  const std::vector<size_t> masters = Masters();
  ASSERT_EQ(masters.size(), 3u);
  std::uint64_t total = 0;
  for (size_t m : masters) {
    const std::uint64_t n = Keys(m);
    EXPECT_GT(n, 0u) << cluster_->node(m).addr();
    total += n;
  }
  EXPECT_EQ(total, tiers.size() * chunks_.size());
  // And every one reads back.
  for (auto& t : tiers) {
    for (size_t i = 0; i < chunks_.size(); ++i) {
      auto got = t->Get(keys_[i]);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_TRUE(Same(*got, chunks_[i]));
    }
    EXPECT_EQ(t->counters().io_errors, 0u);
  }
}

TEST_F(RedisCluster, AMasterKilledCostsMissesThenHitsAfterFailover) {
  if (!cluster_) GTEST_SKIP() << "the child process's half";
  // Chunks under many prefixes, so every master holds some.
  std::vector<std::unique_ptr<RedisTier>> tiers;
  for (int p = 0; p < 8; ++p) {
    RedisTierOptions o = Options(seeds_);
    o.key_prefix = "kdn:f" + std::to_string(p) + ":";
    o.client.command_timeout_ms = 500;
    tiers.push_back(Tier(o));
    for (const ChunkRef& c : chunks_) ASSERT_TRUE(tiers.back()->Put(c).ok());
  }
  ASSERT_TRUE(WaitForReplication());
  // Reads while a master dies: every Get is a hit or a miss, never anything
  // else, each within the timeouts.
  auto read_all = [&](size_t* hits, size_t* misses) {
    *hits = *misses = 0;
    for (auto& t : tiers) {
      for (size_t i = 0; i < chunks_.size(); ++i) {
        const auto t0 = Clock::now();
        auto got = t->Get(keys_[i]);
        EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
        if (got.ok()) {
          EXPECT_TRUE(Same(*got, chunks_[i]));
          ++*hits;
        } else {
          EXPECT_TRUE(got.status().code() == Code::kNotFound || got.status().code() == Code::kUnavailable)
              << got.status().message();
          ++*misses;
        }
      }
    }
  };
  size_t hits = 0, misses = 0;
  read_all(&hits, &misses);
  EXPECT_EQ(misses, 0u);
  const std::vector<size_t> masters = Masters();
  ASSERT_FALSE(masters.empty());
  cluster_->node(masters[0]).Kill(SIGKILL);
  read_all(&hits, &misses);
  EXPECT_GT(misses, 0u);  // that master's keys
  std::uint64_t io_errors = 0;
  for (auto& t : tiers) io_errors += t->counters().io_errors;
  EXPECT_GT(io_errors, 0u);
  // After failover its replica serves them: all hits again.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    read_all(&hits, &misses);
  } while (misses > 0 && Clock::now() < deadline);
  EXPECT_EQ(misses, 0u) << "no failover within 30 s";
  EXPECT_GT(tiers[0]->redis_counters().client.slot_map_refreshes, 0u);
}

// Slots move while a runtime reads (redis-cli --cluster reshard): every read
// is the KV stored, through MOVED and ASK redirects; no miss after.
TEST_F(RedisCluster, ReadsGoOnThroughAResharding) {
  if (!cluster_) GTEST_SKIP() << "the child process's half";
  // Many keys: the reference chunks under 32 prefixes, so that the moved
  // slots hold some.
  std::vector<std::unique_ptr<RedisTier>> tiers;
  for (int p = 0; p < 32; ++p) {
    RedisTierOptions o = Options(seeds_);
    o.key_prefix = "kdn:r" + std::to_string(p) + ":";
    tiers.push_back(Tier(o));
    for (const ChunkRef& c : chunks_) ASSERT_TRUE(tiers.back()->Put(c).ok());
  }
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> hits{0}, misses{0}, wrong{0}, passes{0};
  std::thread reader([&] {
    while (!stop.load()) {
      for (auto& t : tiers) {
        t->Prefetch(keys_, true);
        for (size_t i = 0; i < keys_.size(); ++i) {
          auto got = t->Get(keys_[i]);
          if (!got.ok()) {
            ++misses;
          } else if (!Same(*got, chunks_[i])) {
            ++wrong;
          } else {
            ++hits;
          }
        }
      }
      ++passes;
    }
  });
  const std::vector<size_t> masters = Masters();
  ASSERT_GE(masters.size(), 2u);
  std::string out;
  const int rc = rt::RunProgram({rt::RedisBin("redis-cli"), "--cluster", "reshard", cluster_->node(0).addr(), "--cluster-from",
                                 cluster_->Id(masters[0]), "--cluster-to", cluster_->Id(masters[1]), "--cluster-slots",
                                 "1500", "--cluster-yes"},
                                &out, (cluster_->dir() / "reshard.log").string());
  const std::uint64_t passes_then = passes.load();
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (passes.load() < passes_then + 2 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop = true;
  reader.join();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  EXPECT_LE(misses.load(), hits.load() / 100);  // misses only transiently, if at all
  std::uint64_t moved = 0;
  for (auto& t : tiers) moved += t->redis_counters().client.moved + t->redis_counters().client.ask;
  EXPECT_GT(moved, 0u);
  // After: every chunk reads back.
  for (auto& t : tiers) {
    for (size_t i = 0; i < keys_.size(); ++i) {
      auto got = t->Get(keys_[i]);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_TRUE(Same(*got, chunks_[i]));
    }
  }
}

// Two runtimes in two processes share the cluster: this one stores, a child
// process (this binary, this suite's ChildReads) reads it all back.
TEST_F(RedisCluster, TwoProcessesShareTheCluster) {
  if (!cluster_) GTEST_SKIP() << "the child process's half";
  auto a = MakeRuntime(seeds_, "zstd");
  ASSERT_TRUE(a);
  ASSERT_EQ(StoreAll(*a), ref_.tokens.size());
  // The child's environment: this one's and the cluster's seeds, made before
  // fork (only exec runs in the child of a threaded process).
  std::vector<std::string> env_strings = {std::string(kSeedsEnv) + "=" + Join(seeds_)};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, kSeedsEnv, std::strlen(kSeedsEnv)) != 0) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  char exe[] = "/proc/self/exe", filter[] = "--gtest_filter=RedisCluster.ChildReads";
  char* argv[] = {exe, filter, nullptr};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execve(exe, argv, envp.data());
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the second process did not read what the first stored";
}

// The child's half of TwoProcessesShareTheCluster (skipped when run alone).
TEST_F(RedisCluster, ChildReads) {
  auto b = MakeRuntime(seeds_, "zstd");
  ASSERT_TRUE(b);
  std::vector<float> out;
  const KvStore::Retrieved r = RetrieveAll(*b, &out);
  ASSERT_EQ(r.tokens, Whole());
  const size_t T = ref_.tokens.size(), row = 32;
  for (size_t lk = 0; lk < 10; ++lk) {
    ASSERT_EQ(std::memcmp(&out[lk * T * row], &ref_.canonical[lk * T * row], Whole() * row * 4), 0) << lk;
  }
}

}  // namespace
}  // namespace kdn::store
