// SPDX-License-Identifier: Apache-2.0
// Namespace quotas on kdnd's tiers (issue 37, item 1): two tenants store
// through their runtimes into one node whose host tier gives one of them a
// quota; the quota'd tenant keeps only its newest chunks there, the other
// loses none; the node's stats and /metrics say so per namespace.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "running_server.h"
#include "core/engine/kv_views.h"
#include "core/keys/hash.h"
#include "server/metrics.h"
#include "server/server.h"

namespace kdn::server {
namespace {

using testing_support::RemoteRuntime;
using testing_support::RunningServer;

constexpr const char* kQuotaTokenA = "token-for-quota-a-0001";
constexpr const char* kQuotaTokenB = "token-for-quota-b-0002";

TEST(QuotasThroughKdnd, ATenantOverItsQuotaOnTheNodeEvictsOnlyItsOwnChunks) {
  ServerConfig c;
  c.listen = {"127.0.0.1:0"};
  store::TierSpec host;
  host.capacity_bytes = 64 * 4096;  // 64 chunks: each takes one 4 KiB page
  host.high_watermark = host.low_watermark = 1.0;
  host.quotas = {{"tenant-a", 4 * 4096}};
  c.tiers = {host};
  c.tokens = {{"a", kQuotaTokenA, {"tenant-a"}, false}, {"b", kQuotaTokenB, {"tenant-b"}, false}};
  RunningServer node(c);
  ASSERT_FALSE(node.bound().rpc.empty());

  store::ModelKv model;
  keys::ModelIdentity id;
  id.layers = 2;
  id.kv_heads = 2;
  id.head_dim = id.rotary_dim = 4;
  id.fingerprint = "quotas-through-kdnd";
  model.fingerprint = keys::ModelFingerprint(id);
  model.shape = {2, 2, 4, 4};
  std::vector<float> kv(2 * 2 * 8 * 2 * 4);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i) + 0.5f;
  store::ViewSpec spec = testing_support::Canonical(kv);
  auto views = store::ResolvedViews::Resolve(model, std::vector<store::ViewSpec>{spec}, 8);
  ASSERT_TRUE(views.ok()) << views.status().message();
  auto prompt = [](int i) {
    std::vector<std::int32_t> t(8);
    for (int j = 0; j < 8; ++j) t[static_cast<size_t>(j)] = 1 + i * 8 + j;
    return t;
  };
  auto a = RemoteRuntime(node.bound().rpc[0], kQuotaTokenA, "raw");
  auto b = RemoteRuntime(node.bound().rpc[0], kQuotaTokenB, "raw");
  ASSERT_TRUE(a && b);
  constexpr int kPrompts = 16;  // one chunk each
  for (int i = 0; i < kPrompts; ++i) {
    const auto t = prompt(i);
    store::TokenKeys k;
    k.tokens = t;
    ASSERT_TRUE(a->Store(model, "tenant-a", k, *views).ok());
    ASSERT_TRUE(b->Store(model, "tenant-b", k, *views).ok());
    a->store().chain().Flush();  // in order: the node sees a's chunks oldest first
    b->store().chain().Flush();
  }
  for (int i = 0; i < kPrompts; ++i) {
    const auto t = prompt(i);
    store::TokenKeys k;
    k.tokens = t;
    EXPECT_EQ(a->store().Lookup(model, "tenant-a", k).tokens, i >= kPrompts - 4 ? 8u : 0u) << "tenant a, prompt " << i;
    EXPECT_EQ(b->store().Lookup(model, "tenant-b", k).tokens, 8u) << "tenant b, prompt " << i;
  }
  const NodeStats s = node.server().service().Stats();
  ASSERT_EQ(s.quotas.size(), 1u);
  EXPECT_EQ(s.quotas[0].ns, "tenant-a");
  EXPECT_EQ(s.quotas[0].objects, 4u);
  EXPECT_EQ(s.quotas[0].used_bytes, 4u * 4096);
  EXPECT_EQ(s.quotas[0].quota_evictions, kPrompts - 4u);
  EXPECT_EQ(s.quotas[0].room_evictions, 0u);
  const std::string page = RenderPrometheus(s);
  EXPECT_NE(page.find("kdn_namespace_used_bytes{index=\"0\",tier=\"host\",namespace=\"tenant-a\"} 16384\n"),
            std::string::npos)
      << page;
  node.Stop();
}

}  // namespace
}  // namespace kdn::server
