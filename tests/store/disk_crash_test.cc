// SPDX-License-Identifier: Apache-2.0
// store.disk_crash: the disk tier survives being killed at any moment.
//
// Loop: start `kdn disk fill` on one directory (capacity smaller than what
// it writes, so it also evicts), SIGKILL it after a random delay (from a few
// ms, inside process start and the tier's Open, to ~200 ms, deep into
// writes, renames and evictions), then run `kdn disk verify --json` as a
// restart would and check that
//   - no object read back holds wrong bytes (returned_corrupt == 0),
//   - the usage found is within the capacity,
//   - the index is consistent: objects == intact + corrupt_detected.
// Every fifth iteration also damages one object file (a flipped bit or a
// truncation) before verifying, as a failing disk would: verify must report
// exactly one corrupt object then, and zero otherwise would be fine too (a
// kill cannot produce a partial object).
// Every iteration uses one seed, so objects of earlier runs stay verifiable.
// With CODEC (a codec spec), fill stores its chunks encoded and verify
// decodes them (kdn disk fill/verify --codec).
//
// Usage: disk_crash_test PATH_TO_KDN [ITERATIONS [CODEC]]
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kSeed = "7";
constexpr const char* kChunks = "400";
constexpr const char* kChunkBytes = "65536";   // small: many writes per run
constexpr std::uint64_t kCapacity = 3 << 20;   // ~47 objects of 64 KiB; a run writes up to 400
constexpr double kBudgetSeconds = 50;          // stop early (past 50 iterations) to stay near a minute

// Starts `kdn disk fill` in the background; its progress lines go to /dev/null.
pid_t StartFill(const std::string& kdn, const std::string& dir, const char* fsync, const std::string& codec) {
  const std::string capacity = std::to_string(kCapacity);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, STDERR_FILENO);
    const char* argv[] = {kdn.c_str(),   "disk",       "fill",         "--dir",   dir.c_str(),
                          "--chunks",    kChunks,      "--chunk-bytes", kChunkBytes, "--seed",
                          kSeed,         "--capacity", capacity.c_str(), "--fsync", fsync,
                          "--codec",     codec.c_str(), nullptr};
    ::execv(kdn.c_str(), const_cast<char* const*>(argv));
    std::_Exit(127);
  }
  return pid;
}

struct Verified {
  int exit_code = -1;
  nlohmann::json report;
};

Verified RunVerify(const std::string& kdn, const std::string& dir, const std::string& codec) {
  const std::string cmd = kdn + " disk verify --dir " + dir + " --seed " + kSeed + " --capacity " +
                          std::to_string(kCapacity) + " --codec " + codec + " --json";
  Verified v;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return v;
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(p);
  v.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  v.report = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  return v;
}

// Damages one object file behind the tier's back (a flipped byte or a
// truncation), as a failing disk would: verify must then detect it, which
// shows its checks are not vacuous. Returns false when there is no object.
bool DamageOneObject(const std::string& dir, std::mt19937& rng) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(fs::path(dir) / "objects", ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (files.empty()) return false;
  const fs::path victim = files[rng() % files.size()];
  const std::uintmax_t size = fs::file_size(victim, ec);
  if (ec || size == 0) return false;
  if (rng() % 2) {
    fs::resize_file(victim, rng() % size, ec);
    return !ec;
  }
  std::FILE* f = std::fopen(victim.c_str(), "r+b");
  if (!f) return false;
  const long off = static_cast<long>(rng() % size);
  std::fseek(f, off, SEEK_SET);
  const int c = std::fgetc(f);
  std::fseek(f, off, SEEK_SET);
  std::fputc(c ^ (1 << (rng() % 8)), f);
  std::fclose(f);
  return true;
}

size_t FilesIn(const fs::path& dir) {
  std::error_code ec;
  size_t n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PATH_TO_KDN [ITERATIONS [CODEC]]\n", argv[0]);
    return 2;
  }
  const std::string kdn = argv[1];
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 100;
  const std::string codec = argc > 3 ? argv[3] : "raw";
  const int min_iterations = std::min(iterations, 50);
  char tmpl[] = "/tmp/kdn-disk-crash-XXXXXX";
  if (!::mkdtemp(tmpl)) return 2;
  const std::string dir = tmpl;

  const unsigned rng_seed = std::random_device{}();
  std::printf("disk_crash: %s, codec %s, rng seed %u\n", dir.c_str(), codec.c_str(), rng_seed);
  std::mt19937 rng(rng_seed);
  const char* policies[] = {"none", "data", "full"};
  const auto start = Clock::now();
  int done = 0, killed = 0, failures = 0, temp_left = 0, damaged_total = 0;
  std::uint64_t objects = 0, corrupt = 0;
  for (int i = 0; i < iterations; ++i) {
    if (i >= min_iterations && std::chrono::duration<double>(Clock::now() - start).count() > kBudgetSeconds) break;
    // A quarter of the kills land early (start-up, Open's cleanup and
    // trimming), the rest anywhere in the run.
    const int delay_ms = i % 4 == 0 ? 1 + static_cast<int>(rng() % 15) : 15 + static_cast<int>(rng() % 186);
    const char* policy = policies[i % 3];
    const pid_t pid = StartFill(kdn, dir, policy, codec);
    if (pid < 0) return 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const bool was_killed = WIFSIGNALED(status);
    killed += was_killed ? 1 : 0;
    const size_t temps = FilesIn(fs::path(dir) / "tmp");  // a write the kill interrupted
    temp_left += temps > 0 ? 1 : 0;

    const bool damaged = i % 5 == 4 && DamageOneObject(dir, rng);
    damaged_total += damaged ? 1 : 0;

    const Verified v = RunVerify(kdn, dir, codec);
    const nlohmann::json& r = v.report;
    bool ok = v.exit_code == 0 && r.is_object();
    if (ok) {
      const auto get = [&](const char* k) { return r.value(k, std::uint64_t{0}); };
      ok = get("returned_corrupt") == 0 && get("usage_bytes") <= get("capacity_bytes") &&
           get("capacity_bytes") == kCapacity && get("objects") == get("intact") + get("corrupt_detected") &&
           (!damaged || get("corrupt_detected") == 1);
      objects += get("objects");
      corrupt += get("corrupt_detected");
    }
    if (!ok) {
      ++failures;
      std::printf("FAIL iteration %d (kill after %d ms, fsync %s, %s%s): verify exit %d, report %s\n", i, delay_ms,
                  policy, was_killed ? "killed" : "had finished", damaged ? ", one object damaged" : "",
                  v.exit_code, r.dump().c_str());
    }
    ++done;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("disk_crash: %d iterations in %.1f s: %d fills killed mid-run (%d with a write in flight), "
              "%d had finished; %llu objects verified, %llu corrupt detected (%d objects damaged on purpose), "
              "%d failures\n",
              done, seconds, killed, temp_left, done - killed, static_cast<unsigned long long>(objects),
              static_cast<unsigned long long>(corrupt), damaged_total, failures);
  fs::remove_all(dir);
  return failures == 0 && done >= min_iterations ? 0 : 1;
}
