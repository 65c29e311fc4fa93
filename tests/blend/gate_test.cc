// SPDX-License-Identifier: Apache-2.0
// The blend's accuracy gate file (core/blend/gate.h): lines round-trip,
// malformed lines are refused naming the line, and a record matches only
// the method it was measured with.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "core/blend/gate.h"

namespace kdn::blend {
namespace {

namespace fs = std::filesystem;

const std::string kModel(64, 'a');

fs::path Write(const std::string& text) {
  static int n = 0;
  const fs::path p = fs::temp_directory_path() / ("kdn_gate_" + std::to_string(getpid()) + "_" + std::to_string(n++));
  std::ofstream(p) << text;
  return p;
}

TEST(BlendGate, LinesRoundTripAndMatchOnlyTheirMethod) {
  GateRecord a;
  a.fingerprint = kModel;
  a.ratio = 0.28;
  a.check_layers = {1, 2};
  a.kv_pass = true;
  a.kl_ratio = 0.11;
  a.top1 = 0.9875;
  a.f = 0.547;
  a.contexts = 15;
  GateRecord b = a;
  b.ratio = 0.15;
  b.check_layers = {1};
  b.kv_pass = false;
  b.kl_ratio = 0.31;
  const fs::path p = Write("# a comment\n\n" + GateLine(a) + "\n   " + GateLine(b) + "\n");
  auto got = ReadGate(p.string());
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].check_layers, (std::vector<int>{1, 2}));
  EXPECT_TRUE((*got)[0].kv_pass);
  EXPECT_DOUBLE_EQ((*got)[0].kl_ratio, 0.11);
  EXPECT_DOUBLE_EQ((*got)[1].ratio, 0.15);
  EXPECT_EQ((*got)[1].contexts, 15);
  // The default options resolve to a's method on a 5-layer model with a KV pass.
  const BlendOptions defaults;
  EXPECT_EQ(FindGate(*got, kModel, defaults, 5, true), &(*got)[0]);
  EXPECT_EQ(FindGate(*got, kModel, defaults, 5, false), nullptr);  // measured with a KV pass only
  EXPECT_EQ(FindGate(*got, std::string(64, 'b'), defaults, 5, true), nullptr);  // another model
  BlendOptions cacheblend;
  cacheblend.ratio = 0.15f;  // as a float through the C ABI: within 1e-6
  cacheblend.check_layers = {1};
  EXPECT_EQ(FindGate(*got, kModel, cacheblend, 5, false), &(*got)[1]);
  cacheblend.first_tokens = 2;
  EXPECT_EQ(FindGate(*got, kModel, cacheblend, 5, false), nullptr);
  fs::remove(p);
}

TEST(BlendGate, MalformedLinesAreRefusedNamingTheLine) {
  EXPECT_EQ(ReadGate("/nonexistent/gate").status().code(), Code::kNotFound);
  const std::string ok = kModel + " ratio=0.28 checks=1,2 kv_pass=1 first=0 kl_ratio=0.1";
  for (const std::string& bad :
       {std::string("xyz ratio=0.28 checks=1 kl_ratio=0.1"), kModel + " ratio=1.5 checks=1 kl_ratio=0.1",
        kModel + " ratio=0.2 checks= kl_ratio=0.1", kModel + " ratio=0.2 checks=1,x kl_ratio=0.1",
        kModel + " ratio=0.2 checks=1 kl_ratio=-1", kModel + " ratio=0.2 checks=1 kl_ratio=nan",
        kModel + " ratio=0.2 checks=1", kModel + " ratio=0.2 checks=1 kl_ratio=0.1 colour=red",
        kModel + " ratio=0.2 checks=1 kl_ratio=0.1 kv_pass=2", kModel + " ratio=0.2 checks=1 kl_ratio=0.1 top1"}) {
    const fs::path p = Write(ok + "\n" + bad + "\n");
    auto got = ReadGate(p.string());
    EXPECT_EQ(got.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(got.status().message().find("line 2"), std::string::npos) << got.status().message();
    fs::remove(p);
  }
}

}  // namespace
}  // namespace kdn::blend
