// SPDX-License-Identifier: Apache-2.0
// kdnd: serves a node (server/server.h) as its configuration file says.
//
//   kdnd --config /etc/kdn/kdnd.toml [--ready-file F] [--check]
//   kdnd token new [--file F]
//
// The file must not be readable by group or others (it holds tokens), nor
// the TLS key it names.
// --ready-file: once every address is bound, writes them there (one per line:
// "rpc <address>", "metrics <address>"), atomically; for scripts and tests
// that start kdnd on port 0. SIGHUP reloads the tokens from the file.
// --check: validates the configuration (and what
// a start needs of the machine: server::CheckStartable) and exits; a start
// runs the same checks first, so it fails with the same words.
// token new: prints a new random token (128 bits as 32 hex digits), or
// writes it to a new file of mode 0600 (--file), for a [[token]] token_file.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>

#include "server/config.h"
#include "server/server.h"

int main(int argc, char** argv) {
  kdn::server::Server::CaptureSignals();  // before any thread starts
  CLI::App app{"kdnd: shares KV caches among engines over Cap'n Proto RPC"};
  std::string config_path, ready_file, token_file;
  bool check = false;
  app.add_option("--config", config_path, "configuration file (TOML)");
  app.add_option("--ready-file", ready_file, "write the bound addresses here once serving");
  app.add_flag("--check", check, "validate the configuration and exit");
  CLI::App* token = app.add_subcommand("token", "bearer tokens for [[token]]");
  token->require_subcommand(1);
  CLI::App* token_new = token->add_subcommand("new", "a new random token (128 bits), printed or written to --file");
  token_new->add_option("--file", token_file, "write it to this new file (mode 0600) instead of printing it");
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);

  if (token_new->parsed()) {
    unsigned char bytes[16];
    std::ifstream random("/dev/urandom", std::ios::binary);
    if (!random.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
      std::fprintf(stderr, "kdnd: cannot read /dev/urandom\n");
      return 1;
    }
    std::string hex;
    for (unsigned char b : bytes) {
      static const char kDigits[] = "0123456789abcdef";
      hex += kDigits[b >> 4];
      hex += kDigits[b & 15];
    }
    if (token_file.empty()) {
      std::printf("%s\n", hex.c_str());
      return 0;
    }
    const int fd = ::open(token_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
      std::fprintf(stderr, "kdnd: cannot create %s: %s%s\n", token_file.c_str(), std::strerror(errno),
                   errno == EEXIST ? " (a token file is never overwritten: remove it first)" : "");
      return 1;
    }
    hex += "\n";
    const bool written = ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size()) && ::fsync(fd) == 0;
    ::close(fd);
    if (!written) {
      std::fprintf(stderr, "kdnd: cannot write %s\n", token_file.c_str());
      ::unlink(token_file.c_str());
      return 1;
    }
    std::printf("kdnd: a new token in %s (mode 0600); name it in a [[token]] as token_file\n", token_file.c_str());
    return 0;
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "kdnd: --config is required (kdnd --config FILE; kdnd --help)\n");
    return 2;
  }

  auto config = kdn::server::LoadConfig(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "kdnd: %s\n", config.status().message().c_str());
    return 2;
  }
  // What a start needs of the machine (directories that exist and take
  // files), checked before anything is bound: --check and a start say the same.
  if (kdn::Status st = kdn::server::CheckStartable(*config); !st.ok()) {
    std::fprintf(stderr, "kdnd: %s: %s\n", config_path.c_str(), st.message().c_str());
    return 2;
  }
  if (check) {
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
