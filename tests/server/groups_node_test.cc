// SPDX-License-Identifier: Apache-2.0
// A model kept in layer groups (engine/groups.h: sliding windows, recurrent
// layers) shared through kdnd: the engine's runtime stores its groups'
// chunks and its recurrent state's snapshots on the node as it stores any
// chunk; after the node restarts from its disk tier, a new engine's lookup
// and retrieve follow the one rule for hits (issue 36).
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "running_server.h"
#include "core/engine/groups.h"
#include "core/engine/kv_views.h"
#include "core/keys/hash.h"
#include "server/server.h"

namespace kdn::server {
namespace {

namespace fs = std::filesystem;
using testing_support::RemoteRuntime;
using testing_support::RunningServer;

constexpr const char* kGroupsToken = "token-for-groups-0001";
constexpr std::uint64_t kGroupsTokens = 40;  // five chunks of 8 (RemoteRuntime's)
constexpr std::uint32_t kGroupsLayers = 3, kGroupsHeads = 2, kGroupsDim = 4, kGroupsState = 16;

ServerConfig GroupsNodeConfig(const fs::path& dir) {
  ServerConfig c;
  c.listen = {"127.0.0.1:0"};
  store::TierSpec host;
  host.capacity_bytes = 16 << 20;
  host.write_through = true;
  store::TierSpec disk;
  disk.kind = store::TierSpec::Kind::kDisk;
  disk.capacity_bytes = 64 << 20;
  disk.path = (dir / "disk").string();
  c.tiers = {host, disk};
  c.tokens = {{"a", kGroupsToken, {"tenant-a"}, false}};
  return c;
}

std::vector<float> GroupsStateAt(std::uint64_t b) {
  std::vector<float> s(kGroupsState);
  for (std::uint32_t i = 0; i < kGroupsState; ++i) s[i] = static_cast<float>(b) * 100.0f + static_cast<float>(i);
  return s;
}

class GroupsThroughKdnd : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("kdn-groups-node-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(GroupsThroughKdnd, ChunksAndSnapshotsSurviveANodeRestartAndFollowTheRule) {
  store::ModelKv model;
  keys::ModelIdentity id;
  id.layers = kGroupsLayers;
  id.kv_heads = kGroupsHeads;
  id.head_dim = id.rotary_dim = kGroupsDim;
  id.fingerprint = "groups-through-kdnd";
  id.layer_windows = {4, 0, 4};
  id.state_layers = 1;
  id.state_bytes = kGroupsState * 4;
  model.fingerprint = keys::ModelFingerprint(id);
  model.shape = {kGroupsLayers, kGroupsHeads, kGroupsDim, 4};
  // Layers 0 and 2 attend to their last 4 tokens; one recurrent layer.
  const std::vector<std::uint32_t> windows = {4, 0, 4};
  auto grouped = store::GroupedModel::Make(model, windows, 1, kGroupsState * 4);
  ASSERT_TRUE(grouped.ok()) << grouped.status().message();
  std::vector<std::int32_t> tokens(kGroupsTokens);
  for (std::uint64_t i = 0; i < kGroupsTokens; ++i) tokens[i] = static_cast<std::int32_t>(1 + (i * 37) % 400);
  std::vector<float> kv(kGroupsLayers * 2 * kGroupsTokens * kGroupsHeads * kGroupsDim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>(i) + 1.0f;
  // Views over the canonical buffer of all 40 tokens, whatever a call's length.
  auto views = [&](std::vector<float>& buffer, std::uint64_t n) {
    store::ViewSpec s = testing_support::Canonical(buffer);
    s.num_tokens = kGroupsTokens;
    auto r = store::ResolvedViews::Resolve(model, std::vector<store::ViewSpec>{s}, n);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return std::move(r).value();
  };
  auto keys_of = [&](std::uint64_t n) {
    store::TokenKeys k;
    k.tokens = std::span<const std::int32_t>(tokens.data(), n);
    return k;
  };
  {
    // The engine stores at every chunk boundary of its prefill, with the
    // recurrent layer's state there.
    RunningServer node(GroupsNodeConfig(dir));
    auto rt = RemoteRuntime(node.bound().rpc[0], kGroupsToken);
    ASSERT_NE(rt, nullptr);
    for (std::uint64_t b = 8; b <= kGroupsTokens; b += 8) {
      std::vector<float> state = GroupsStateAt(b);
      void* s = state.data();
      const auto v = views(kv, b);
      auto stored = store::GroupedStore(rt->store(), *grouped, "tenant-a", keys_of(b), v.groups(),
                                        std::span<void* const>(&s, 1));
      ASSERT_TRUE(stored.ok()) << stored.status().message();
      EXPECT_EQ(*stored, b);
    }
  }
  // The node restarts from its disk tier; a new engine asks it.
  RunningServer node(GroupsNodeConfig(dir));
  auto rt = RemoteRuntime(node.bound().rpc[0], kGroupsToken);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(store::GroupedLookup(rt->store(), *grouped, "tenant-a", keys_of(kGroupsTokens)).tokens, kGroupsTokens);
  std::vector<float> out(kv.size(), 0.0f);
  std::vector<float> state(kGroupsState, -1.0f);
  void* s = state.data();
  const auto v = views(out, kGroupsTokens);
  auto got = store::GroupedRetrieve(rt->store(), *grouped, "tenant-a", keys_of(kGroupsTokens), v.groups(),
                                    std::span<void* const>(&s, 1));
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->tokens, kGroupsTokens);
  EXPECT_EQ(state, GroupsStateAt(kGroupsTokens));  // the snapshot at 40, exact
  // Canonical [layer][k|v][token][head][dim]: the sliding layers (0, 2) got
  // their window (tokens 36..39) only; layer 1 all.
  const size_t row = kGroupsHeads * kGroupsDim;
  for (size_t l = 0; l < kGroupsLayers; ++l) {
    for (size_t k = 0; k < 2; ++k) {
      for (size_t t = 0; t < kGroupsTokens; ++t) {
        const size_t at = ((l * 2 + k) * kGroupsTokens + t) * row;
        const float want = l != 1 && t < 36 ? 0.0f : kv[at];
        ASSERT_EQ(out[at], want) << "layer " << l << " kv " << k << " token " << t;
      }
    }
  }
  // A request that shares 36 tokens: 32, the last boundary with a snapshot.
  std::vector<std::int32_t> other(tokens.begin(), tokens.begin() + 36);
  for (int i = 0; i < 12; ++i) other.push_back(450 + i);
  store::TokenKeys other_keys;
  other_keys.tokens = other;
  EXPECT_EQ(store::GroupedLookup(rt->store(), *grouped, "tenant-a", other_keys).tokens, 32u);
}

}  // namespace
}  // namespace kdn::server
