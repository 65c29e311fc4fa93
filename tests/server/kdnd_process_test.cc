// kdnd as a process: started from a configuration file, stopped by SIGTERM
// (drained: what its disk tier was given survives into the next kdnd) and
// killed by SIGKILL in the middle of an engine's work (the engine sees
// misses, keeps answering correctly, and hits again once kdnd is back).
// KV comes from the reference model; engines are runtimes with a remote tier.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "reference_kv.h"
#include "store/runtime.h"

namespace kdn::server {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "token-for-tenant-a-0001";

class Kdnd {
 public:
  // Starts kdnd on `config`; waits (bounded) until it serves.
  explicit Kdnd(const fs::path& config) {
    ready_ = config.string() + ".ready";
    fs::remove(ready_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string log = config.string() + ".log";
      FILE* f = std::freopen(log.c_str(), "a", stdout);
      (void)f;
      ::dup2(::fileno(stdout), 2);
      ::execl(KDND_PATH, KDND_PATH, "--config", config.c_str(), "--ready-file", ready_.c_str(), nullptr);
      ::_exit(127);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!fs::exists(ready_) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ifstream in(ready_);
    std::string kind, addr;
    while (in >> kind >> addr) {
      if (kind == "rpc" && rpc_.empty()) rpc_ = addr;
    }
  }
  ~Kdnd() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  const std::string& rpc() const { return rpc_; }
  // Sends `sig` and returns the exit status (bounded wait; -1 on a hang).
  int Signal(int sig) {
    ::kill(pid_, sig);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    int status = 0;
    while (Clock::now() < deadline) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  std::string ready_, rpc_;
};

fs::path WriteConfig(const fs::path& dir, const std::string& listen) {
  const fs::path path = dir / "kdnd.toml";
  std::ofstream(path) << "[server]\n"
                      << "listen = [\"" << listen << "\"]\n"
                      << "[[tier]]\nkind = \"host\"\ncapacity = \"16MiB\"\nwrite_through = true\n"
                      << "[[tier]]\nkind = \"disk\"\ncapacity = \"64MiB\"\npath = \"" << (dir / "disk").string() << "\"\n"
                      << "[[token]]\ntoken = \"" << kToken << "\"\nnamespaces = [\"tenant-a\"]\n";
  ::chmod(path.c_str(), 0600);
  return path;
}

std::shared_ptr<store::Runtime> Engine(const std::string& address) {
  store::StoreOptions o;
  o.chunk_tokens = 8;
  store::TierSpec host;  // the engine's own memory first, as engines have it
  host.capacity_bytes = 8 << 20;
  store::TierSpec remote;
  remote.kind = store::TierSpec::Kind::kRemote;
  remote.address = address;
  remote.token = kToken;
  remote.timeout_ms = 1000;
  host.write_through = true;  // every chunk it stores goes to the node too
  o.tiers = {host, remote};
  return store::Runtime::Create(o, 2).value();
}

store::ViewSpec View(std::vector<float>& kv) {
  store::ViewSpec s;
  s.data = kv.data();
  s.size_bytes = kv.size() * 4;
  return s;
}

class KdndProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    dir_ = fs::temp_directory_path() / ("kdnd-process-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ref_ = testing::PrefillReference("Lily and Ben went to the park. They saw a big tree and a small bird on it.");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Stores the reference KV through an engine and waits for the node to have it.
  void Store(store::Runtime& engine) {
    std::vector<float> in = ref_.canonical;
    auto views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{View(in)}, ref_.tokens.size()).value();
    ASSERT_EQ(engine.Store(ref_.m, "tenant-a", ref_.Keys(), views).value(), ref_.tokens.size());
    engine.store().chain().Flush();
  }
  // What a fresh engine (nothing in its own memory) retrieves: tokens, and
  // whether the KV equals the reference's.
  std::pair<std::uint64_t, bool> FreshRetrieve(const std::string& address) {
    auto engine = Engine(address);
    std::vector<float> out(ref_.canonical.size(), 0.0f);
    auto views = store::ResolvedViews::Resolve(ref_.m, std::vector<store::ViewSpec>{View(out)}, ref_.tokens.size()).value();
    const auto got = engine->Retrieve(ref_.m, "tenant-a", ref_.Keys(), views).value();
    const size_t row = 32, T = ref_.tokens.size();
    bool same = true;
    for (size_t lk = 0; lk < 10 && got.tokens > 0; ++lk) {
      same = same && std::equal(out.begin() + static_cast<std::ptrdiff_t>(lk * T * row),
                                out.begin() + static_cast<std::ptrdiff_t>((lk * T + got.tokens) * row),
                                ref_.canonical.begin() + static_cast<std::ptrdiff_t>(lk * T * row));
    }
    return {got.tokens, same};
  }

  fs::path dir_;
  testing::ReferenceKv ref_;
};

TEST_F(KdndProcess, SigtermDrainsAndTheNextKdndServesWhatItsDiskHeld) {
  const fs::path config = WriteConfig(dir_, "127.0.0.1:0");
  std::string first_address;
  {
    Kdnd node(config);
    ASSERT_FALSE(node.rpc().empty()) << "kdnd did not start";
    first_address = node.rpc();
    auto engine = Engine(node.rpc());
    Store(*engine);
    EXPECT_EQ(FreshRetrieve(node.rpc()), std::make_pair(std::uint64_t{ref_.tokens.size()}, true));
    const int status = node.Signal(SIGTERM);
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  Kdnd again(config);
  ASSERT_FALSE(again.rpc().empty());
  EXPECT_EQ(FreshRetrieve(again.rpc()), std::make_pair(std::uint64_t{ref_.tokens.size()}, true));
}

TEST_F(KdndProcess, KillNineMidRunCostsMissesOnlyAndHitsComeBackAfterARestart) {
  const std::string address = "unix:" + (dir_ / "kdnd.sock").string();
  const fs::path config = WriteConfig(dir_, address);
  auto node = std::make_unique<Kdnd>(config);
  ASSERT_FALSE(node->rpc().empty());
  auto engine = Engine(address);
  Store(*engine);
  // Make sure the write-through copy reached the node's disk before the kill.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Killed while an engine keeps working: its retrieves answer (from its own
  // memory, or as misses from the node), none fails, none hangs.
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, calls{0};
  std::thread worker([&] {
    while (!stop) {
      auto [tokens, same] = FreshRetrieve(address);
      if (!same) ++failures;
      (void)tokens;
      ++calls;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto killed_at = Clock::now();
  node.reset();  // SIGKILL
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(FreshRetrieve(address).first, 0u);  // a miss, not an error
  EXPECT_LT(Clock::now() - killed_at, std::chrono::seconds(5));
  node = std::make_unique<Kdnd>(config);
  ASSERT_FALSE(node->rpc().empty());
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  std::pair<std::uint64_t, bool> back{0, false};
  while (back.first != ref_.tokens.size() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    back = FreshRetrieve(address);
  }
  stop = true;
  worker.join();
  EXPECT_EQ(back, std::make_pair(std::uint64_t{ref_.tokens.size()}, true));
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(calls.load(), 0);
}

}  // namespace
}  // namespace kdn::server
