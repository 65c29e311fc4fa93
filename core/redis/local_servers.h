// SPDX-License-Identifier: Apache-2.0
// Real redis-server processes on loopback, for the tests (tests/redis,
// tests/store) and `kdn bench redis`: one node, or a cluster of masters (3
// by default, with a replica each) made by `redis-cli --cluster create`, on
// free loopback ports, in a temporary directory. The servers die with their
// owner (SIGKILL in the destructors; PR_SET_PDEATHSIG if the process itself
// dies). Header-only and not part of kdn_core: only what starts servers
// includes it (Debian's redis-server and redis-tools at /usr/bin).
// Thread-safety: none (one thread owns them).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace kdn::redis::local {

// Where redis-server and redis-cli are: KDN_REDIS_BIN_DIR, else /usr/bin.
inline std::string RedisBin(const char* program) {
  const char* dir = std::getenv("KDN_REDIS_BIN_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/usr/bin") + "/" + program;
}
inline bool HaveRedis() {
  return access(RedisBin("redis-server").c_str(), X_OK) == 0 && access(RedisBin("redis-cli").c_str(), X_OK) == 0;
}

// A raw hiredis connection, for what a test checks behind the client's back.
struct Raw {
  redisContext* c = nullptr;
  Raw(int port, int timeout_ms = 2000) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c != nullptr && c->err == 0) redisSetTimeout(c, tv);
  }
  ~Raw() {
    if (c != nullptr) redisFree(c);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  bool ok() const { return c != nullptr && c->err == 0; }
  // The reply as text ("(nil)", an integer, a status, an error prefixed
  // "ERR:"), or "" when the connection failed.
  std::string Cmd(const std::vector<std::string>& args) {
    if (!ok()) return "";
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) return "";
    std::string out;
    switch (r->type) {
      case REDIS_REPLY_STRING:
      case REDIS_REPLY_STATUS: out.assign(r->str, r->len); break;
      case REDIS_REPLY_ERROR: out = "ERR:" + std::string(r->str, r->len); break;
      case REDIS_REPLY_INTEGER: out = std::to_string(r->integer); break;
      case REDIS_REPLY_NIL: out = "(nil)"; break;
      default: out = "(array)"; break;
    }
    freeReplyObject(r);
    return out;
  }
};

inline bool PortFree(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

// A free port P (and P + 10000, the cluster bus, when `bus`).
inline int FreePort(bool bus) {
  static std::mt19937 rng(static_cast<unsigned>(getpid()) * 7919u + static_cast<unsigned>(time(nullptr)));
  for (int i = 0; i < 1000; ++i) {
    const int p = 20000 + static_cast<int>(rng() % 35000);
    if (PortFree(p) && (!bus || PortFree(p + 10000))) return p;
  }
  return 0;
}

// Runs a program to its end; its exit status, its output in *out.
inline int RunProgram(const std::vector<std::string>& args, std::string* out, const std::string& log) {
  std::string cmd;
  for (const auto& a : args) cmd += "'" + a + "' ";
  cmd += "> '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  if (out != nullptr) {
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
  }
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class Server {
 public:
  // Starts redis-server on a free port with `extra` configuration
  // ("--name value" pairs); waits until PING answers (or NOAUTH does).
  explicit Server(const std::filesystem::path& dir, std::vector<std::string> extra = {}, bool cluster = false)
      : dir_(dir) {
    std::filesystem::create_directories(dir_);
    for (int attempt = 0; attempt < 5 && pid_ <= 0; ++attempt) {
      port_ = FreePort(cluster);
      std::vector<std::string> args = {RedisBin("redis-server"), "--port", std::to_string(port_), "--bind",
                                       "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no",
                                       "--dir", dir_.string(), "--logfile", (dir_ / "redis.log").string()};
      if (cluster) {
        // A replica's first sync starts at once (the default waits 5 s for
        // more replicas to share a diskless transfer).
        for (const char* a : {"--repl-diskless-sync-delay", "0", "--cluster-enabled", "yes", "--cluster-node-timeout",
                              "1000", "--cluster-config-file"}) {
          args.push_back(a);
        }
        args.push_back((dir_ / "nodes.conf").string());
      }
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const pid_t parent = getpid();
      const pid_t pid = fork();
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(1);
        const int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        execv(argv[0], argv.data());
        _exit(127);
      }
      pid_ = pid;
      if (!WaitReady()) {
        Kill(SIGKILL);
        pid_ = -1;
      }
    }
  }
  ~Server() { Kill(SIGKILL); }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  bool running() const { return pid_ > 0; }
  int port() const { return port_; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::filesystem::path& dir() const { return dir_; }

  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    if (sig == SIGKILL) {
      kill(pid_, SIGCONT);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  bool WaitReady() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      Raw r(port_, 500);
      if (r.ok()) {
        const std::string pong = r.Cmd({"PING"});
        if (pong == "PONG" || pong.rfind("ERR:NOAUTH", 0) == 0) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// A temporary directory, removed with its contents.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "kdn-redis-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// `masters` masters with `replicas_per_master` replicas each (3 + 3 by
// default); `extra` configures every node as Server's does.
class Cluster {
 public:
  explicit Cluster(int masters = 3, int replicas_per_master = 1, const std::vector<std::string>& extra = {})
      : replicas_(replicas_per_master > 0) {
    const int total = masters * (1 + replicas_per_master);
    for (int i = 0; i < total; ++i) {
      servers_.push_back(std::make_unique<Server>(tmp_.path / ("n" + std::to_string(i)), extra, true));
      if (!servers_.back()->running()) {
        error_ = "a cluster node did not start";
        return;
      }
    }
    std::vector<std::string> args = {RedisBin("redis-cli"), "--cluster", "create"};
    for (auto& s : servers_) args.push_back(s->addr());
    args.insert(args.end(), {"--cluster-replicas", std::to_string(replicas_per_master), "--cluster-yes"});
    std::string out;
    if (RunProgram(args, &out, (tmp_.path / "create.log").string()) != 0) {
      error_ = "redis-cli --cluster create failed: " + out;
      return;
    }
    if (!WaitHealthy(std::chrono::seconds(20))) error_ = "the cluster did not become healthy";
  }

  const std::string& error() const { return error_; }
  Server& node(size_t i) { return *servers_[i]; }
  size_t size() const { return servers_.size(); }
  const std::filesystem::path& dir() const { return tmp_.path; }

  // Every live node says cluster_state:ok and sees the same masters with
  // a replica attached each (when the cluster was made with replicas).
  bool WaitHealthy(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      bool ok = true;
      for (auto& s : servers_) {
        if (!s->running()) continue;
        Raw r(s->port(), 500);
        const std::string info = r.Cmd({"CLUSTER", "INFO"});
        if (info.find("cluster_state:ok") == std::string::npos) ok = false;
        const std::string repl = r.Cmd({"INFO", "replication"});
        if (replicas_ && repl.find("role:master") != std::string::npos &&
            repl.find("connected_slaves:0") != std::string::npos && LiveNodes() == size()) {
          ok = false;
        }
        if (repl.find("role:slave") != std::string::npos && repl.find("master_link_status:up") == std::string::npos) {
          ok = false;
        }
      }
      if (ok) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  size_t LiveNodes() const {
    size_t n = 0;
    for (auto& s : servers_) n += s->running() ? 1 : 0;
    return n;
  }

  // The node id of a node (CLUSTER MYID).
  std::string Id(size_t i) { return Raw(servers_[i]->port()).Cmd({"CLUSTER", "MYID"}); }

  // The index of the node at "127.0.0.1:port", or size().
  size_t IndexOf(const std::string& addr) const {
    for (size_t i = 0; i < servers_.size(); ++i) {
      if (servers_[i]->addr() == addr) return i;
    }
    return servers_.size();
  }

  // Whether node i is a master now.
  bool IsMaster(size_t i) {
    return Raw(servers_[i]->port()).Cmd({"ROLE"}) == "(array)" &&
           Raw(servers_[i]->port()).Cmd({"INFO", "replication"}).find("role:master") != std::string::npos;
  }

 private:
  TempDir tmp_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::string error_;
  bool replicas_ = true;
};

}  // namespace kdn::redis::local
