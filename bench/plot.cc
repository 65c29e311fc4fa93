// SPDX-License-Identifier: Apache-2.0
#include "bench/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

extern char** environ;

namespace kdn::bench {
namespace {

// Runs gnuplot on `script`; false when it is missing (*missing) or fails.
bool RunGnuplot(const std::string& script_path, bool* missing) {
  pid_t pid = 0;
  char arg0[] = "gnuplot";
  std::string path = script_path;
  char* argv[] = {arg0, path.data(), nullptr};
  const int rc = posix_spawnp(&pid, "gnuplot", nullptr, nullptr, argv, environ);
  if (rc != 0) {
    *missing = rc == ENOENT;
    return false;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::string GnuplotQuote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
  }
  return out + "\"";
}

bool DrawPng(const std::string& png, const std::string& body, const std::string& tool) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "kdn_plot_XXXXXX").string();
  const int fd = mkstemp(tmpl.data());
  if (fd < 0) {
    std::fprintf(stderr, "%s: warning: cannot write a gnuplot script; no PNG\n", tool.c_str());
    return false;
  }
  close(fd);
  {
    // pngcairo draws better; a gnuplot built without cairo only has png.
    std::ofstream f(tmpl);
    f << "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
         "  set terminal pngcairo size 1200,800 noenhanced font ',10'\n"
         "} else {\n"
         "  set terminal png size 1200,800 noenhanced\n"
         "}\n"
      << "set output " << GnuplotQuote(png) << "\n"
      << body;
  }
  std::fflush(stdout);  // gnuplot's messages, if any, after ours
  bool missing = false;
  const bool done = RunGnuplot(tmpl, &missing);
  std::remove(tmpl.c_str());
  if (missing) {
    std::fprintf(stderr, "%s: warning: gnuplot not found (Debian: gnuplot-nox); no PNG\n", tool.c_str());
  } else if (!done) {
    std::fprintf(stderr, "%s: warning: gnuplot failed; no PNG\n", tool.c_str());
  } else {
    std::printf("wrote %s\n", png.c_str());
  }
  return done;
}

}  // namespace kdn::bench
