// SPDX-License-Identifier: Apache-2.0
// kdnd: serves a node (server/server.h) as its configuration file says.
//
//   kdnd --config /etc/kdn/kdnd.toml [--ready-file F] [--check]
//
// The file must not be readable by group or others (it holds tokens), nor
// the TLS key it names.
// --ready-file: once every address is bound, writes them there (one per line:
// "rpc <address>", "metrics <address>"), atomically; for scripts and tests
// that start kdnd on port 0. SIGHUP reloads the tokens from the file.
// --check: validates the configuration (and what
// a start needs of the machine: server::CheckStartable) and exits.
#include <cstdio>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>

#include "server/config.h"
#include "server/server.h"

int main(int argc, char** argv) {
  kdn::server::Server::CaptureSignals();  // before any thread starts
  CLI::App app{"kdnd: shares KV caches among engines over Cap'n Proto RPC"};
  std::string config_path, ready_file;
  bool check = false;
  app.add_option("--config", config_path, "configuration file (TOML)")->required();
  app.add_option("--ready-file", ready_file, "write the bound addresses here once serving");
  app.add_flag("--check", check, "validate the configuration and exit");
  CLI11_PARSE(app, argc, argv);

  auto config = kdn::server::LoadConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "kdnd: %s\n", config.status().message().c_str());
    return 2;
  }
  if (check) {
    if (kdn::Status st = kdn::server::CheckStartable(*config); !st.ok()) {
      std::fprintf(stderr, "kdnd: %s: %s\n", config_path.c_str(), st.message().c_str());
      return 2;
    }
    std::printf("kdnd: %s is valid (%zu listen addresses, %zu tiers, %zu tokens)\n", config_path.c_str(),
                config->listen.size(), config->tiers.size(), config->tokens.size());
    return 0;
  }
  auto server = kdn::server::Server::Create(*config);
  if (!server.ok()) {
    std::fprintf(stderr, "kdnd: %s\n", server.status().message().c_str());
    return 1;
  }
  // SIGHUP: the tokens again, from the same file, checked as at start.
  (*server)->SetTokenSource([config_path]() -> kdn::Result<std::vector<kdn::server::TokenGrant>> {
    auto again = kdn::server::LoadConfig(config_path);
    if (!again.ok()) return again.status();
    return std::move(again->tokens);
  });
  kdn::Status st = (*server)->Run(
      [&](const kdn::server::BoundAddresses& bound) {
        std::string lines;
        for (const std::string& a : bound.rpc) lines += "rpc " + a + "\n";
        if (!bound.metrics.empty()) lines += "metrics " + bound.metrics + "\n";
        std::fputs(("kdnd: serving\n" + lines).c_str(), stdout);
        std::fflush(stdout);
        if (!ready_file.empty()) {
          const std::string tmp = ready_file + ".tmp";
          { std::ofstream(tmp) << lines; }
          std::rename(tmp.c_str(), ready_file.c_str());
        }
      },
      /*handle_signals=*/true);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  std::fputs("kdnd: stopped\n", stdout);
  return 0;
}
