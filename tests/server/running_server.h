// SPDX-License-Identifier: Apache-2.0
// A kdnd (server::Server) on a thread of this process, for tests that talk
// to it over real RPC on loopback, and runtimes whose tier is that node.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "server/server.h"
#include "core/runtime/runtime.h"

namespace kdn::server::testing_support {

// A kdnd on a thread of this process.
class RunningServer {
 public:
  explicit RunningServer(const ServerConfig& config) {
    auto s = Server::Create(config);
    EXPECT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    thread_ = std::thread([this] { status_ = server_->Run(nullptr, false); });
    bound_ = server_->WaitReady();
  }
  ~RunningServer() { Stop(); }
  void Stop() {
    if (!thread_.joinable()) return;
    server_->Shutdown();
    thread_.join();
  }
  const BoundAddresses& bound() const { return bound_; }
  Server& server() { return *server_; }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  BoundAddresses bound_;
  Status status_;
};

// A runtime whose only tier is the node at `address` (8-token chunks).
inline std::shared_ptr<store::Runtime> RemoteRuntime(const std::string& address, const std::string& token,
                                              const std::string& codec = "", std::uint32_t timeout_ms = 2000,
                                              const std::string& tls_ca_file = "", const std::string& tls_name = "",
                                              const std::string& secret_file = "",
                                              const std::string& encryption_key_file = "") {
  store::StoreOptions o;
  o.chunk_tokens = 8;
  o.secret_file = secret_file;
  o.encryption_key_file = encryption_key_file;
  store::TierSpec remote;
  remote.kind = store::TierSpec::Kind::kRemote;
  remote.address = address;
  remote.token = token;
  remote.codec = codec;
  remote.timeout_ms = timeout_ms;
  remote.tls_ca_file = tls_ca_file;
  remote.tls_server_name = tls_name;
  o.tiers = {remote};
  auto rt = store::Runtime::Create(o, 2);
  EXPECT_TRUE(rt.ok()) << rt.status().message();
  return rt.ok() ? std::move(rt).value() : nullptr;
}

// A view over a canonical f32 buffer.
inline store::ViewSpec Canonical(std::vector<float>& kv) {
  store::ViewSpec s;
  s.data = kv.data();
  s.size_bytes = kv.size() * 4;
  return s;
}

}  // namespace kdn::server::testing_support
