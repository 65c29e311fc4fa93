// A kdnd (server::Server) on a thread of this process, for tests that talk
// to it over real RPC on loopback.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "server/server.h"

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

}  // namespace kdn::server::testing_support
