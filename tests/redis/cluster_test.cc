// SPDX-License-Identifier: Apache-2.0
// The Redis client against a real Redis Cluster (3 masters + 3 replicas on
// loopback, made by redis-cli --cluster create; see redis/local_servers.h): the
// slot map, redirects, a resharding under reads, a master's failover, and
// many threads at once.
#include <gtest/gtest.h>

#include "test_redis.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/redis/client.h"
#include "core/redis/local_servers.h"
#include "test_util.h"

namespace kdn::redis {
namespace {

using local::Cluster;
using local::Raw;
using Ms = std::chrono::milliseconds;

using testing::Bytes;
using testing::ElapsedMs;
using testing::Str;

class RedisClientCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_REDIS_SERVER(local::HaveRedis());
    const auto t0 = std::chrono::steady_clock::now();
    cluster_ = std::make_unique<Cluster>();
    ASSERT_TRUE(cluster_->error().empty()) << cluster_->error();
    std::printf("cluster up in %lld ms\n", ElapsedMs(t0));
  }

  // A client that knows only node `seed`.
  std::unique_ptr<Client> Connect(size_t seed = 0, std::uint32_t timeout_ms = 1000) {
    Options o;
    o.seeds = {cluster_->node(seed).addr()};
    o.command_timeout_ms = timeout_ms;
    o.connect_timeout_ms = 300;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Keys "key:<i>" -> "value:<i>:<tag>" (i < n), all set.
  void Fill(Client& c, int n, const std::string& tag = "") {
    keys_.clear();
    values_.clear();
    for (int i = 0; i < n; ++i) {
      keys_.push_back("key:" + std::to_string(i));
      values_.push_back("value:" + std::to_string(i) + ":" + tag);
    }
    std::vector<KeyValue> items;
    for (size_t i = 0; i < keys_.size(); ++i) items.push_back({keys_[i], Bytes(values_[i])});
    for (const Status& s : c.Set(items)) ASSERT_TRUE(s.ok()) << s.message();
  }
  std::vector<std::string_view> Keys() const { return {keys_.begin(), keys_.end()}; }

  // The node index serving `key`'s slot, per the servers.
  size_t OwnerOf(const std::string& key) {
    const std::string slot = Raw(cluster_->node(0).port()).Cmd({"CLUSTER", "KEYSLOT", key});
    for (size_t i = 0; i < cluster_->size(); ++i) {
      if (!cluster_->node(i).running()) continue;
      Raw r(cluster_->node(i).port());
      if (r.Cmd({"INFO", "replication"}).find("role:master") == std::string::npos) continue;
      if (r.Cmd({"CLUSTER", "COUNTKEYSINSLOT", slot}) != "0") return i;
    }
    return cluster_->size();
  }

  std::unique_ptr<Cluster> cluster_;
  std::vector<std::string> keys_, values_;
};

TEST_F(RedisClientCluster, KeysSpreadOverAllMasters) {
  auto c = Connect(3);  // a replica as the only seed: the rest is learned
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->cluster());
  const std::vector<std::string> masters = c->masters();
  ASSERT_EQ(masters.size(), 3u);
  Fill(*c, 3000);
  std::uint64_t total = 0;
  for (const std::string& m : masters) {
    const size_t i = cluster_->IndexOf(m);
    ASSERT_LT(i, cluster_->size()) << m;
    const std::string n = Raw(cluster_->node(i).port()).Cmd({"DBSIZE"});
    EXPECT_GT(std::stoull(n), 600u) << m;  // ~1000 each
    total += std::stoull(n);
  }
  EXPECT_EQ(total, 3000u);
  // Our slots are the servers' slots.
  Raw r(cluster_->node(0).port());
  for (const char* k : {"foo", "bar", "{user1000}.following", "123456789", "key:17"}) {
    EXPECT_EQ(r.Cmd({"CLUSTER", "KEYSLOT", k}), std::to_string(KeySlot(k))) << k;
  }
  auto got = c->Get(Keys());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status().message();
    ASSERT_TRUE(got[i]->has_value()) << keys_[i];
    EXPECT_EQ(Str(**got[i]), values_[i]);
  }
  auto ex = c->Exists(Keys());
  for (auto& e : ex) EXPECT_TRUE(e.ok() && *e);
  auto del = c->Del(Keys());
  for (auto& d : del) EXPECT_TRUE(d.ok() && *d);
  const Counters n = c->counters();
  EXPECT_EQ(n.moved + n.ask, 0u);
  EXPECT_EQ(n.commands, 4u * 3000u);
  EXPECT_GE(n.connects, 4u);  // the seed, then the 3 masters
}

TEST_F(RedisClientCluster, FollowsAskThenMoved) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const std::string k1 = "moveme", k2 = "{moveme}.2", k3 = "{moveme}.3";
  std::vector<KeyValue> items = {{k1, Bytes("one")}, {k2, Bytes("two")}};
  for (const Status& s : c->Set(items)) ASSERT_TRUE(s.ok()) << s.message();
  const size_t src = OwnerOf(k1);
  ASSERT_LT(src, cluster_->size());
  size_t dst = cluster_->size();
  for (const std::string& m : c->masters()) {
    const size_t i = cluster_->IndexOf(m);
    if (i != src) dst = i;
  }
  ASSERT_LT(dst, cluster_->size());
  const std::string slot = std::to_string(KeySlot(k1));
  const std::string src_id = cluster_->Id(src), dst_id = cluster_->Id(dst);
  Raw rs(cluster_->node(src).port()), rd(cluster_->node(dst).port());
  // Migrating: k1 moves to dst, k2 stays on src for now.
  ASSERT_EQ(rd.Cmd({"CLUSTER", "SETSLOT", slot, "IMPORTING", src_id}), "OK");
  ASSERT_EQ(rs.Cmd({"CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id}), "OK");
  ASSERT_EQ(rs.Cmd({"MIGRATE", "127.0.0.1", std::to_string(cluster_->node(dst).port()), "", "0", "5000", "KEYS", k1}),
            "OK");
  auto g = c->Get(std::vector<std::string_view>{k1, k2});
  ASSERT_TRUE(g[0].ok() && g[0]->has_value()) << g[0].status().message();
  EXPECT_EQ(Str(**g[0]), "one");
  ASSERT_TRUE(g[1].ok() && g[1]->has_value()) << g[1].status().message();
  EXPECT_EQ(Str(**g[1]), "two");
  EXPECT_GE(c->counters().ask, 1u);
  // A new key of a migrating slot goes to the target (ASK).
  std::vector<KeyValue> three = {{k3, Bytes("three")}};
  ASSERT_TRUE(c->Set(three)[0].ok());
  EXPECT_EQ(rd.Cmd({"CLUSTER", "COUNTKEYSINSLOT", slot}), "2");
  EXPECT_EQ(c->counters().moved, 0u);
  // Done: the slot belongs to dst everywhere; the client's map is stale.
  ASSERT_EQ(rs.Cmd({"MIGRATE", "127.0.0.1", std::to_string(cluster_->node(dst).port()), "", "0", "5000", "KEYS", k2}),
            "OK");
  for (size_t i = 0; i < cluster_->size(); ++i) {
    Raw r(cluster_->node(i).port());
    if (r.Cmd({"INFO", "replication"}).find("role:master") == std::string::npos) continue;
    ASSERT_EQ(r.Cmd({"CLUSTER", "SETSLOT", slot, "NODE", dst_id}), "OK");
  }
  const std::uint64_t refreshes = c->counters().slot_map_refreshes;
  std::this_thread::sleep_for(Ms(150));  // past the refresh rate limit
  g = c->Get(std::vector<std::string_view>{k1, k2, k3});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(g[i].ok() && g[i]->has_value()) << i << g[i].status().message();
  EXPECT_EQ(Str(**g[0]), "one");
  EXPECT_EQ(Str(**g[1]), "two");
  EXPECT_EQ(Str(**g[2]), "three");
  const Counters n = c->counters();
  EXPECT_GE(n.moved, 1u);
  EXPECT_GT(n.slot_map_refreshes, refreshes);  // a MOVED schedules a full refresh
  // The map is right now: no more redirects.
  const std::uint64_t moved = n.moved;
  std::this_thread::sleep_for(Ms(150));
  g = c->Get(std::vector<std::string_view>{k1, k2, k3});
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(g[i].ok() && g[i]->has_value());
  EXPECT_EQ(c->counters().moved, moved);
}

TEST_F(RedisClientCluster, ReshardDuringReads) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  Fill(*c, 12000);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> wrong{0}, errors{0}, hits{0}, passes{0};
  std::thread reader([&] {
    const std::vector<std::string_view> keys = Keys();
    while (!stop.load()) {
      for (size_t at = 0; at < keys.size(); at += 500) {
        const auto batch = std::span<const std::string_view>(keys).subspan(at, std::min<size_t>(500, keys.size() - at));
        auto got = c->Get(batch);
        for (size_t i = 0; i < got.size(); ++i) {
          if (!got[i].ok()) {
            ++errors;
          } else if (!got[i]->has_value() || Str(**got[i]) != values_[at + i]) {
            ++wrong;
          } else {
            ++hits;
          }
        }
      }
      ++passes;
    }
  });
  const std::string from = cluster_->Id(cluster_->IndexOf(c->masters()[0]));
  const std::string to = cluster_->Id(cluster_->IndexOf(c->masters()[1]));
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = local::RunProgram({"/usr/bin/redis-cli", "--cluster", "reshard", cluster_->node(0).addr(),
                                      "--cluster-from", from, "--cluster-to", to, "--cluster-slots", "1500",
                                      "--cluster-yes"},
                                     &out, (cluster_->dir() / "reshard.log").string());
  const auto reshard_ms = ElapsedMs(t0);
  std::this_thread::sleep_for(Ms(200));
  const std::uint64_t passes_then = passes.load();
  while (passes.load() < passes_then + 2) std::this_thread::sleep_for(Ms(10));
  stop = true;
  reader.join();
  ASSERT_EQ(rc, 0) << out;
  std::printf("reshard of 1500 slots: %lld ms; reads: %llu hits, %llu errors, %llu passes\n",
              static_cast<long long>(reshard_ms), static_cast<unsigned long long>(hits.load()),
              static_cast<unsigned long long>(errors.load()), static_cast<unsigned long long>(passes.load()));
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_LT(errors.load(), hits.load() / 100);  // errors only transiently, if at all
  const Counters n = c->counters();
  EXPECT_GE(n.moved, 1u);
  // After: every key reads back, without redirects.
  auto got = c->Get(Keys());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok() && got[i]->has_value()) << keys_[i] << " " << got[i].status().message();
    EXPECT_EQ(Str(**got[i]), values_[i]);
  }
  std::this_thread::sleep_for(Ms(150));
  const std::uint64_t redirects = c->counters().moved + c->counters().ask;
  got = c->Get(Keys());
  for (auto& g : got) EXPECT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ(c->counters().moved + c->counters().ask, redirects);
}

TEST_F(RedisClientCluster, MasterKilledThenFailover) {
  const std::uint32_t timeout_ms = 500;
  auto c = Connect(0, timeout_ms);
  ASSERT_NE(c, nullptr);
  Fill(*c, 3000);
  const std::string victim_addr = c->masters()[0];
  const size_t victim = cluster_->IndexOf(victim_addr);
  ASSERT_LT(victim, cluster_->size());
  // Its replica has every write before the kill.
  std::string repl = Raw(cluster_->node(victim).port()).Cmd({"INFO", "replication"});
  const size_t at = repl.find("slave0:ip=127.0.0.1,port=");
  ASSERT_NE(at, std::string::npos) << repl;
  const int replica_port = std::stoi(repl.substr(at + std::strlen("slave0:ip=127.0.0.1,port=")));
  const std::string master_keys = Raw(cluster_->node(victim).port()).Cmd({"DBSIZE"});
  ASSERT_GT(std::stoi(master_keys), 500);
  const auto sync_until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Raw(replica_port).Cmd({"DBSIZE"}) != master_keys && std::chrono::steady_clock::now() < sync_until) {
    std::this_thread::sleep_for(Ms(10));
  }
  ASSERT_EQ(Raw(replica_port).Cmd({"DBSIZE"}), master_keys);

  cluster_->node(victim).Kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  long long slowest = 0, first_full_ms = -1;
  std::uint64_t failed_batches = 0, wrong = 0;
  while (ElapsedMs(killed) < 20000) {
    const auto t0 = std::chrono::steady_clock::now();
    auto got = c->Get(Keys());
    slowest = std::max(slowest, ElapsedMs(t0));
    size_t ok = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!got[i].ok()) {
        EXPECT_TRUE(got[i].status().code() == Code::kUnavailable || got[i].status().code() == Code::kTimeout)
            << got[i].status().message();
        continue;
      }
      if (!got[i]->has_value() || Str(**got[i]) != values_[i]) {
        ++wrong;
      } else {
        ++ok;
      }
    }
    if (ok == got.size()) {
      first_full_ms = ElapsedMs(killed);
      break;
    }
    ++failed_batches;
    std::this_thread::sleep_for(Ms(20));
  }
  std::printf("failover: all keys back %lld ms after the kill; %llu failed batches, slowest batch %lld ms\n",
              first_full_ms, static_cast<unsigned long long>(failed_batches), slowest);
  EXPECT_EQ(wrong, 0u);
  ASSERT_GE(first_full_ms, 0) << "the keys never came back from the replica";
  EXPECT_GE(failed_batches, 1u);  // the kill was seen
  // A dead master costs its keys at most about one timeout per batch.
  EXPECT_LE(slowest, 2 * timeout_ms + 300);
  const std::vector<std::string> masters = c->masters();
  EXPECT_EQ(std::count(masters.begin(), masters.end(), victim_addr), 0);
  EXPECT_EQ(std::count(masters.begin(), masters.end(), "127.0.0.1:" + std::to_string(replica_port)), 1);
  const Counters n = c->counters();
  EXPECT_GE(n.io_errors + n.connect_failures, 1u);
  EXPECT_GE(n.slot_map_refreshes, 2u);
  // And it takes writes again.
  std::vector<KeyValue> items = {{keys_[0], Bytes("after")}};
  EXPECT_TRUE(c->Set(items)[0].ok());
}

TEST_F(RedisClientCluster, StoppedMasterTimesOutOthersServe) {
  const std::uint32_t timeout_ms = 300;
  auto c = Connect(0, timeout_ms);
  ASSERT_NE(c, nullptr);
  Fill(*c, 600);
  const std::string victim_addr = c->masters()[1];
  const size_t victim = cluster_->IndexOf(victim_addr);
  cluster_->node(victim).Signal(SIGSTOP);
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    auto got = c->Get(Keys());
    const auto ms = ElapsedMs(t0);
    size_t timeouts = 0, hits = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i].ok()) {
        ASSERT_TRUE(got[i]->has_value());
        EXPECT_EQ(Str(**got[i]), values_[i]);
        ++hits;
      } else {
        EXPECT_EQ(got[i].status().code(), Code::kTimeout) << got[i].status().message();
        ++timeouts;
      }
    }
    EXPECT_GT(timeouts, 100u);
    EXPECT_GT(hits, 300u);
    EXPECT_LT(ms, timeout_ms + 400) << "round " << round;
  }
  cluster_->node(victim).Signal(SIGCONT);
}

TEST_F(RedisClientCluster, ClusterDownIsUnavailableAtOnce) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  Fill(*c, 300);
  // The master of key:0's slot stops serving it (as in a cluster that lost
  // the slot): CLUSTERDOWN, an error for those keys, no retry loop.
  const size_t owner = OwnerOf(keys_[0]);
  ASSERT_LT(owner, cluster_->size());
  const std::string slot = std::to_string(KeySlot(keys_[0]));
  Raw r(cluster_->node(owner).port());
  ASSERT_EQ(r.Cmd({"CLUSTER", "DELSLOTS", slot}), "OK");
  const std::uint64_t errors = c->counters().server_errors, commands = c->counters().commands;
  const auto t0 = std::chrono::steady_clock::now();
  auto got = c->Get(std::vector<std::string_view>{keys_[0]});
  EXPECT_LT(ElapsedMs(t0), 200);
  EXPECT_EQ(got[0].status().code(), Code::kUnavailable) << got[0].status().message();
  EXPECT_NE(got[0].status().message().find("CLUSTERDOWN"), std::string::npos) << got[0].status().message();
  EXPECT_EQ(c->counters().server_errors, errors + 1);
  EXPECT_EQ(c->counters().commands, commands + 1);
  ASSERT_EQ(r.Cmd({"CLUSTER", "ADDSLOTS", slot}), "OK");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool back = false;
  while (!back && std::chrono::steady_clock::now() < until) {
    got = c->Get(std::vector<std::string_view>{keys_[0]});
    back = got[0].ok() && got[0]->has_value() && Str(**got[0]) == values_[0];
    if (!back) std::this_thread::sleep_for(Ms(20));
  }
  EXPECT_TRUE(back);
}

TEST_F(RedisClientCluster, EightThreadsAtOnce) {
  Options o;
  o.seeds = {cluster_->node(0).addr()};
  o.connections_per_node = 3;
  o.command_timeout_ms = 5000;
  auto r = Client::Connect(o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  Client& c = **r;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 40; ++round) {
        std::vector<std::string> keys, values;
        for (int i = 0; i < 64; ++i) {
          keys.push_back("t" + std::to_string(t) + ":" + std::to_string(i));
          values.push_back(std::to_string(round) + ":" + std::string(static_cast<size_t>(i) * 37, 'x'));
        }
        std::vector<KeyValue> items;
        std::vector<std::string_view> kv;
        for (size_t i = 0; i < keys.size(); ++i) {
          items.push_back({keys[i], Bytes(values[i])});
          kv.push_back(keys[i]);
        }
        for (const Status& s : c.Set(items)) failures += s.ok() ? 0 : 1;
        auto got = c.Get(kv);
        for (size_t i = 0; i < got.size(); ++i) {
          if (!got[i].ok() || !got[i]->has_value() || Str(**got[i]) != values[i]) ++failures;
        }
        if (round % 2 == 1) {
          for (auto& d : c.Del(kv)) failures += (d.ok() && *d) ? 0 : 1;
          for (auto& e : c.Exists(kv)) failures += (e.ok() && !*e) ? 0 : 1;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(c.counters().connects, 1u + 3u * 3u);  // the seed's, then at most 3 per master
  EXPECT_EQ(c.counters().moved + c.counters().ask, 0u);
}

}  // namespace
}  // namespace kdn::redis
