// SPDX-License-Identifier: Apache-2.0
// The one kdnd client (core/wire/node_client.h) that the remote tier and the
// dashboard share, against a real node over loopback: logging in, a bad
// token as a typed refusal (a Status and a message, not a broken link), the
// endpoint's checks, and the TLS name of an IPv6 address.
#include "core/wire/node_client.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "running_server.h"
#include "rpc_client.h"

namespace kdn::server {
namespace {

namespace fs = std::filesystem;
using testing_support::RunningServer;
using testing_support::ThreadIo;

constexpr const char* kToken = "token-of-the-node-client-test";

ServerConfig Config() {
  ServerConfig c;
  c.listen = {"127.0.0.1:0"};
  store::TierSpec host;
  host.capacity_bytes = 8 << 20;
  c.tiers = {host};
  c.tokens = {{"ops", kToken, {"*"}, true}};
  return c;
}

// How connecting ended: null when it logged in.
kj::Maybe<kj::Exception> ConnectFailure(wire::NodeConnector& connector) {
  kj::AsyncIoContext& io = ThreadIo();
  return kj::runCatchingExceptions([&] { (void)connector.Connect(io.provider->getNetwork()).wait(io.waitScope); });
}

TEST(NodeClient, LogsInAndTheSessionServes) {
  RunningServer node(Config());
  auto connector = wire::NodeConnector::Create({node.bound().rpc[0], kToken, "", ""});
  ASSERT_TRUE(connector.ok()) << connector.status().message();
  kj::AsyncIoContext& io = ThreadIo();
  kj::Own<wire::NodeConnection> conn = (*connector)->Connect(io.provider->getNetwork()).wait(io.waitScope);
  auto stats = conn->session().statsRequest().send().wait(io.waitScope);
  EXPECT_EQ(stats.getError().getCode(), wire::node::ErrorCode::OK);
  EXPECT_EQ(stats.getStats().getTiers().size(), 1u);
}

TEST(NodeClient, ABadTokenIsARefusalWithAStatus) {
  RunningServer node(Config());
  auto connector = wire::NodeConnector::Create({node.bound().rpc[0], "not-a-token-of-this-node", "", ""});
  ASSERT_TRUE(connector.ok());
  const kj::Maybe<kj::Exception> failure = ConnectFailure(**connector);
  const kj::Exception* e = nullptr;
  KJ_IF_MAYBE(x, failure) { e = x; }
  ASSERT_NE(e, nullptr) << "a bad token logged in";
  EXPECT_TRUE(wire::IsRefusal(*e)) << e->getDescription().cStr();
  EXPECT_EQ(wire::DescribeFailure(*e, 1000), "kdnd refused login: bad token");

  // The same mapping for any call's typed error.
  capnp::MallocMessageBuilder m;
  auto err = m.initRoot<wire::node::Error>();
  err.setCode(wire::node::ErrorCode::PERMISSION_DENIED);
  err.setMessage("this token has no stats grant");
  const Status st = wire::RefusalStatus("stats", err.asReader());
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_EQ(st.message(), "kdnd refused stats: permission denied: this token has no stats grant");
  err.setCode(wire::node::ErrorCode::TOO_LARGE);
  EXPECT_EQ(wire::RefusalStatus("put", err.asReader()).code(), Code::kTooLarge);
  err.setCode(wire::node::ErrorCode::OK);
  EXPECT_TRUE(wire::RefusalStatus("put", err.asReader()).ok());
}

TEST(NodeClient, NobodyListeningIsATransportFailureNotARefusal) {
  std::string address;
  {
    RunningServer node(Config());
    address = node.bound().rpc[0];
  }
  auto connector = wire::NodeConnector::Create({address, kToken, "", ""});
  ASSERT_TRUE(connector.ok());
  const kj::Maybe<kj::Exception> failure = ConnectFailure(**connector);
  const kj::Exception* e = nullptr;
  KJ_IF_MAYBE(x, failure) { e = x; }
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE(wire::IsRefusal(*e));
  EXPECT_EQ(wire::DescribeFailure(*e, 1000), "connection refused");
}

TEST(NodeClient, TheEndpointIsChecked) {
  EXPECT_EQ(wire::NodeConnector::Create({"", kToken, "", ""}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(wire::NodeConnector::Create({"127.0.0.1:1", "", "", ""}).status().code(), Code::kInvalidArgument);
  // The address is checked when the tier is made, not when it first
  // fails to connect.
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1", "*:7450", "[::1:7450", "unix:", "a b:1"}) {
    const auto r = wire::NodeConnector::Create({bad, kToken, "", ""});
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().message();
  }
  for (const char* good : {"127.0.0.1:7450", "[::1]:7450", "kdnd.internal:7450", "unix:/run/kdn/kdnd.sock"}) {
    EXPECT_TRUE(wire::NodeConnector::Create({good, kToken, "", ""}).ok()) << good;
  }
  const auto missing = wire::NodeConnector::Create({"127.0.0.1:1", kToken, "/no/such/ca.pem", ""});
  EXPECT_EQ(missing.status().code(), Code::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("/no/such/ca.pem"), std::string::npos);
  const fs::path bad = fs::temp_directory_path() / ("kdn-node-client-bad-" + std::to_string(::getpid()) + ".pem");
  {
    std::FILE* f = std::fopen(bad.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n", f);
    std::fclose(f);
  }
  const auto garbled = wire::NodeConnector::Create({"127.0.0.1:1", kToken, bad.string(), ""});
  fs::remove(bad);
  EXPECT_EQ(garbled.status().code(), Code::kInvalidArgument);
  EXPECT_NE(garbled.status().message().find("bad TLS CA file"), std::string::npos) << garbled.status().message();
}

// The remote tier took "[::1]" (brackets and all) as the name a node's
// certificate must carry; the dashboard stripped them. One rule now.
TEST(NodeClient, TheTlsNameOfAnAddressIsItsHost) {
  EXPECT_EQ(wire::TlsServerName({"kdn.example:7070", kToken, "ca.pem", ""}), "kdn.example");
  EXPECT_EQ(wire::TlsServerName({"[::1]:7070", kToken, "ca.pem", ""}), "::1");
  EXPECT_EQ(wire::TlsServerName({"[::1]:7070", kToken, "ca.pem", "node.internal"}), "node.internal");
}

}  // namespace
}  // namespace kdn::server
