// SPDX-License-Identifier: Apache-2.0
// `kdn demo --remote`: two engines in two processes share one kdnd. This
// process starts a kdnd (a temporary directory, a Unix socket, a fresh
// token), ingests the stories through a runtime whose tiers are its own
// memory and the node (write-through), and closes that runtime, which sends
// everything queued. Then a second process (`kdn demo --remote-join`), an
// engine that has never seen the stories, answers follow-up questions: cold,
// and with the KV the first one stored, fetched from the node. Its TTFT
// drops to retrieval time and its continuations are the cold ones.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "demo.h"
#include "refengine/ref_engine.h"
#include "refengine/stories.h"

namespace kdn::tools {
namespace {

namespace fs = std::filesystem;
using refengine::FromKdn;
using refengine::kStories;
using refengine::LoadedModel;
using refengine::LoadModel;
using refengine::RefEngine;

std::string SelfDir() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).parent_path().string();
}

// kdnd: $KDN_KDND, else beside this binary (build/server/kdnd, or bin/kdnd).
std::string FindKdnd() {
  if (const char* env = std::getenv("KDN_KDND"); env && *env) return env;
  for (const std::string& p : {SelfDir() + "/server/kdnd", SelfDir() + "/kdnd"}) {
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

std::string RandomToken() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char b[24];
  in.read(reinterpret_cast<char*>(b), sizeof b);
  std::string hex;
  for (unsigned char c : b) {
    static const char* d = "0123456789abcdef";
    hex += d[c >> 4];
    hex += d[c & 15];
  }
  return hex;
}

pid_t Spawn(const std::vector<std::string>& args) {
  std::fflush(stdout);  // the child's lines after ours
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Dies with the demo (Ctrl-C, a crash): no kdnd or engine is left behind.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A runtime whose tiers are host memory (copying each new chunk to the node)
// and the node; or, without host, the node alone (so that every retrieve is
// served by the node: what the second engine's timings show).
kdn_status RemoteRuntime(const std::string& address, const std::string& token, unsigned chunk_tokens, bool host,
                         kdn_runtime** out) {
  kdn_tier_config tiers[2] = {KDN_TIER_CONFIG_INIT, KDN_TIER_CONFIG_INIT};
  tiers[0].capacity_bytes = std::uint64_t{256} << 20;
  tiers[0].write_through = 1;
  tiers[1].kind = KDN_TIER_REMOTE;
  tiers[1].address = address.data();
  tiers[1].address_len = address.size();
  tiers[1].token = token.data();
  tiers[1].token_len = token.size();
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = chunk_tokens;
  ro.tiers = host ? tiers : tiers + 1;
  ro.num_tiers = host ? 2 : 1;
  return kdn_runtime_create(&ro, out);
}

std::vector<int> StoryTokens(const LoadedModel& m, size_t i, int ctx) {
  std::vector<int> t = m.tokenizer->Encode(kStories[i].text, /*bos=*/true);
  if (static_cast<int>(t.size()) > ctx - 64) t.resize(static_cast<size_t>(ctx - 64));
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int RunRemoteJoin(const DemoOptions& o) {
  auto loaded = LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kdn demo --remote-join: %s\n", loaded.status().message().c_str());
    return 2;
  }
  const LoadedModel& m = *loaded;
  std::string token;
  std::ifstream(o.token_file) >> token;
  kdn_runtime* rt = nullptr;
  if (kdn_status s = RemoteRuntime(o.join_address, token, o.chunk_tokens, /*host=*/false, &rt); s != KDN_OK) {
    std::fprintf(stderr, "kdn demo --remote-join: %s\n", FromKdn(s, "kdn_runtime_create").message().c_str());
    return 2;
  }
  int code = 0;
  {
    auto engine = RefEngine::Create(m, rt);
    if (!engine.ok()) {
      kdn_runtime_destroy(rt);
      return 2;
    }
    const int ctx = (*engine)->config().seq_len;
    std::printf("  [engine 2, pid %d] never saw the stories; asks follow-up questions (its only tier: kdnd)\n",
                static_cast<int>(::getpid()));
    double cold_sum = 0, warm_sum = 0;
    std::uint64_t from_node = 0;
    for (size_t i = 0; i < std::size(kStories) && code == 0; ++i) {
      for (const char* q : kStories[i].questions) {
        std::vector<int> t = StoryTokens(m, i, ctx);
        const std::vector<int> suffix = m.tokenizer->Encode(q, /*bos=*/false);
        t.insert(t.end(), suffix.begin() + (suffix.size() > 1 ? 1 : 0), suffix.end());
        if (static_cast<int>(t.size()) + o.steps > ctx) continue;
        std::vector<double> cold, warm;
        refengine::Answer ca, wa;
        for (int r = 0; r < o.repeats; ++r) {
          auto c = (*engine)->Cold(t, o.steps);
          auto w = (*engine)->Warm(o.ns, t, o.steps);
          if (!c.ok() || !w.ok()) {
            code = 2;
            break;
          }
          cold.push_back(c->ttft_ms);
          warm.push_back(w->ttft_ms);
          ca = std::move(*c);
          wa = std::move(*w);
        }
        if (code != 0) break;
        const bool same = ca.continuation == wa.continuation;
        if (!same) code = 1;
        std::printf("    %-22s +%-28s %4zu tok, from kdnd %4llu, TTFT cold %7.3f ms, kdn %7.3f ms, %5.1fx, continuation %s\n",
                    kStories[i].title, q, t.size(), static_cast<unsigned long long>(wa.reused_tokens), Median(cold),
                    Median(warm), Median(cold) / Median(warm), same ? "identical" : "DIFFERENT");
        cold_sum += Median(cold);
        warm_sum += Median(warm);
        from_node += wa.reused_tokens;
      }
    }
    // Identical continuations prove nothing when every query was a miss (a
    // token of another namespace, a node that dropped the writes).
    if (code == 0 && from_node == 0) {
      std::fprintf(stderr, "kdn demo --remote: engine 2 got no KV from kdnd (does the token grant namespace %s?)\n",
                   o.ns.c_str());
      code = 1;
    }
    if (code == 0) {
      std::printf("  [engine 2] total TTFT: cold %.3f ms, with the KV engine 1 stored in kdnd %.3f ms (%.1fx)\n", cold_sum,
                  warm_sum, cold_sum / warm_sum);
    }
  }
  kdn_runtime_destroy(rt);
  return code;
}

int RunRemoteDemo(const DemoOptions& o, const std::string& argv0) {
  std::error_code exe_error;
  std::string self = fs::read_symlink("/proc/self/exe", exe_error).string();
  if (self.empty()) self = argv0;
  const std::string kdnd = o.node.empty() ? FindKdnd() : "";
  if (o.node.empty() && kdnd.empty()) {
    std::fprintf(stderr, "kdn demo --remote: kdnd not found beside %s (build it, or set KDN_KDND)\n", self.c_str());
    return 2;
  }
  auto loaded = LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kdn demo --remote: %s (it needs the reference model)\n", loaded.status().message().c_str());
    return 2;
  }
  const LoadedModel& m = *loaded;
  std::printf("kdn %s demo --remote: two engines in two processes share one kdnd\n", kdn_version());
  std::printf("model: %s\n", m.description.c_str());
  // Your kdnd (--node, --token-file), or one started here in a temporary
  // directory with a fresh token.
  fs::path dir, token_file;
  std::string address = o.node, token;
  pid_t node = 0;
  int code = 0;
  if (!o.node.empty()) {
    token_file = o.token_file;
    std::ifstream(token_file) >> token;
    if (token.empty()) {
      std::fprintf(stderr, "kdn demo --remote: no token in %s (kdnd token new --file FILE makes one)\n",
                   token_file.c_str());
      return 2;
    }
    std::printf("  [kdnd] %s, namespace %s\n", address.c_str(), o.ns.c_str());
  } else {
    char tmpl[] = "/tmp/kdn-demo-remote.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 2;
    dir = tmpl;
    token = RandomToken();
    address = "unix:" + (dir / "kdnd.sock").string();
    token_file = dir / "token";
    const fs::path config = dir / "kdnd.toml", ready = dir / "ready";
    std::ofstream(token_file) << token << "\n";
    std::ofstream(config) << "[server]\nlisten = [\"" << address << "\"]\n"
                          << "[[tier]]\nkind = \"host\"\ncapacity = \"512MiB\"\n"
                          << "[[token]]\ntoken_file = \"token\"\nnamespaces = [\"" << o.ns << "\"]\n";
    ::chmod(config.c_str(), 0600);
    ::chmod(token_file.c_str(), 0600);
    node = Spawn({kdnd, "--config", config.string(), "--ready-file", ready.string()});
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (node > 0 && !fs::exists(ready) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (node <= 0 || !fs::exists(ready)) {
      std::fprintf(stderr, "kdn demo --remote: kdnd did not start\n");
      code = 2;
    } else {
      std::printf("  [kdnd, pid %d] serving on %s\n", static_cast<int>(node), address.c_str());
    }
  }
  if (code == 0) {
    kdn_runtime* rt = nullptr;
    if (kdn_status s = RemoteRuntime(address, token, o.chunk_tokens, /*host=*/true, &rt); s != KDN_OK) {
      std::fprintf(stderr, "kdn demo --remote: %s\n", FromKdn(s, "kdn_runtime_create").message().c_str());
      code = 2;
    } else {
      {
        auto engine = RefEngine::Create(m, rt);
        if (!engine.ok()) {
          code = 2;
        } else {
          const int ctx = (*engine)->config().seq_len;
          std::printf("  [engine 1, pid %d] ingests %zu stories (prefill, store; each chunk copied to kdnd)\n",
                      static_cast<int>(::getpid()), std::size(kStories));
          for (size_t i = 0; i < std::size(kStories) && code == 0; ++i) {
            auto stored = (*engine)->Ingest(o.ns, StoryTokens(m, i, ctx));
            if (!stored.ok()) code = 2;
          }
        }
      }
      kdn_runtime_destroy(rt);  // sends what is still queued for the node
    }
  }
  if (code == 0) {
    const pid_t joiner = Spawn({self, "demo", "--remote-join", address, "--token-file", token_file.string(), "--chunk-tokens",
                                std::to_string(o.chunk_tokens), "--steps", std::to_string(o.steps), "--repeats",
                                std::to_string(o.repeats), "--namespace", o.ns});
    code = joiner > 0 ? Wait(joiner) : 2;
  }
  if (node > 0) {
    ::kill(node, SIGTERM);
    Wait(node);
  }
  std::error_code ec;
  if (!dir.empty()) fs::remove_all(dir, ec);
  std::printf("kdn demo --remote: %s\n", code == 0 ? "identical continuations, KV shared through kdnd" : "FAILED");
  return code;
}

}  // namespace kdn::tools
