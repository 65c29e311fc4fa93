// SPDX-License-Identifier: Apache-2.0
// Runs a command line through the shell and collects what it prints, for
// tests that run the kdn command as a user does.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace kdn::testing {

struct CliRun {
  int code = -1;    // exit status; -1 when it did not exit normally
  std::string out;  // what it printed on stdout (and stderr, when redirected there)
};

// `command` runs in /bin/sh; add "2>&1" to it to capture stderr too.
inline CliRun RunShell(const std::string& command) {
  CliRun r;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kdn::testing
