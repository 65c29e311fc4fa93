// SPDX-License-Identifier: Apache-2.0
#include "ingest_cmd.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "refengine/ingest.h"

namespace kdn::tools {
namespace {

using refengine::FileOutcome;

std::atomic<bool> g_stop{false};
std::atomic<int> g_interrupts{0};

void OnInterrupt(int) {
  if (g_interrupts.fetch_add(1) == 0) {
    g_stop.store(true);
    const char msg[] = "\nkdn ingest: stopping after the files in progress (Ctrl-C again to quit now)\n";
    (void)!::write(2, msg, sizeof msg - 1);
    return;
  }
  ::_exit(130);  // the index was saved within 200 ms of each put; the file in progress is put again next run
}

std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

// The progress bar (one line on stderr, redrawn at most 10 times a second)
// or plain lines (stdout, one per file).
class Progress {
 public:
  explicit Progress(bool bar) : bar_(bar) {}
  void Event(const refengine::FileEvent& ev, const refengine::IngestProgress& p) {
    const bool noteworthy = ev.outcome != FileOutcome::kIngested && ev.outcome != FileOutcome::kReplaced &&
                            ev.outcome != FileOutcome::kUnchanged;
    if (!bar_) {
      std::printf("[%llu/%llu] %s %s", static_cast<unsigned long long>(p.files_done),
                  static_cast<unsigned long long>(p.files_total), refengine::OutcomeName(ev.outcome), refengine::PrintableName(ev.path).c_str());
      if (!refengine::Skipped(ev.outcome)) {
        std::printf(" (%llu tokens, %u item%s)", static_cast<unsigned long long>(ev.tokens), ev.parts,
                    ev.parts == 1 ? "" : "s");
      }
      if (!ev.detail.empty()) std::printf(": %s", ev.detail.c_str());
      std::printf("\n");
      std::fflush(stdout);
      return;
    }
    if (noteworthy) {
      std::fprintf(stderr, "\r\033[Kskipped %s: %s%s%s\n", refengine::PrintableName(ev.path).c_str(),
                   refengine::OutcomeName(ev.outcome),
                   ev.detail.empty() ? "" : ", ", ev.detail.c_str());
    }
    const double now = p.elapsed_s;
    if (!noteworthy && now - drawn_ < 0.1 && p.files_done != p.files_total) return;
    drawn_ = now;
    constexpr int kWidth = 28;
    const double frac = p.bytes_total == 0 ? 1.0 : static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total);
    std::string bar(static_cast<size_t>(kWidth), ' ');
    for (int i = 0; i < static_cast<int>(frac * kWidth + 0.5) && i < kWidth; ++i) bar[static_cast<size_t>(i)] = '#';
    const double tps = now > 0 ? static_cast<double>(p.tokens_done) / now : 0;
    const double eta = frac > 0 ? now * (1 - frac) / frac : NAN;
    std::fprintf(stderr, "\r\033[K[%s] %llu/%llu documents  %llu tokens  %.0f tokens/s  ETA %s", bar.c_str(),
                 static_cast<unsigned long long>(p.files_done), static_cast<unsigned long long>(p.files_total),
                 static_cast<unsigned long long>(p.tokens_done), tps, Duration(eta).c_str());
    std::fflush(stderr);
  }
  void Done() {
    if (bar_) std::fprintf(stderr, "\n");
  }

 private:
  bool bar_;
  double drawn_ = -1;
};

}  // namespace

int RunIngest(const IngestCmdOptions& o) {
  if (o.engine != "ref") {
    std::fprintf(stderr,
                 "kdn ingest: --engine %s: only the reference engine ingests so far (the llama.cpp connector "
                 "loads and saves an engine's KV, it does not put knowledge items yet)\n",
                 o.engine.c_str());
    return 1;
  }
  auto loaded = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) {
    std::fprintf(stderr, "kdn ingest: %s\n", loaded.status().message().c_str());
    return 1;
  }
  refengine::StoreOptions so;
  so.dir = o.store;
  so.capacity = o.capacity;
  so.codec = o.codec;
  so.chunk_tokens = o.chunk_tokens;
  auto opened = refengine::OpenStore(so);
  if (!opened.ok()) {
    std::fprintf(stderr, "kdn ingest: %s\n", opened.status().message().c_str());
    return 1;
  }
  kdn_runtime* rt = *opened;

  refengine::IngestOptions io;
  io.dir = o.dir;
  io.ns = o.ns;
  io.pin_ttl_ms = o.pin_s < 0 ? -1 : static_cast<std::int64_t>(std::llround(o.pin_s * 1000));
  io.workers = o.workers;
  io.max_tokens = o.max_tokens;
  io.prune = o.prune;
  const bool bar = o.progress == "bar" || (o.progress == "auto" && ::isatty(2));
  Progress progress(bar);
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  auto sum = refengine::Ingest(*loaded, rt, io, &g_stop,
                               [&](const refengine::FileEvent& ev, const refengine::IngestProgress& p) {
                                 progress.Event(ev, p);
                               });
  progress.Done();

  kdn_runtime_destroy(rt);  // finishes the disk writes, saves the index (knowledge.kdnidx)
  // What the store holds now: the directory opened again, as an engine would.
  kdn_tier_stats ts = KDN_TIER_STATS_INIT;
  bool have_stats = false;
  so.host_bytes = 1 << 20;
  if (auto again = refengine::OpenStore(so); again.ok()) {
    have_stats = kdn_runtime_get_tier_stats(*again, 1, &ts) == KDN_OK;
    kdn_runtime_destroy(*again);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (!sum.ok()) {
    std::fprintf(stderr, "kdn ingest: %s\n", sum.status().message().c_str());
    return 1;
  }
  const refengine::IngestSummary& s = *sum;
  const auto n = [&](FileOutcome oc) { return static_cast<unsigned long long>(s.by_outcome[static_cast<int>(oc)]); };
  const std::uint64_t skipped = s.files - n(FileOutcome::kIngested) - n(FileOutcome::kReplaced) - n(FileOutcome::kUnchanged);
  std::printf("kdn ingest: %llu documents: %llu ingested, %llu replaced, %llu unchanged, %llu skipped",
              static_cast<unsigned long long>(s.files), n(FileOutcome::kIngested), n(FileOutcome::kReplaced),
              n(FileOutcome::kUnchanged), static_cast<unsigned long long>(skipped));
  if (skipped != 0) {
    std::printf(" (");
    bool first = true;
    for (int i = static_cast<int>(FileOutcome::kEmpty); i <= static_cast<int>(FileOutcome::kFailed); ++i) {
      if (s.by_outcome[i] == 0) continue;
      std::printf("%s%llu %s", first ? "" : ", ", static_cast<unsigned long long>(s.by_outcome[i]),
                  refengine::OutcomeName(static_cast<FileOutcome>(i)));
      first = false;
    }
    std::printf(")");
  }
  std::printf("\n");
  const double tps = s.wall_s > 0 ? static_cast<double>(s.tokens) / s.wall_s : 0;
  std::printf("  %llu knowledge items, %llu tokens in %.2f s (%.0f tokens/s on %d workers; prefill %.2f s, "
              "storing %.2f s, summed over the workers)\n",
              static_cast<unsigned long long>(s.items), static_cast<unsigned long long>(s.tokens), s.wall_s, tps,
              s.workers, static_cast<double>(s.prefill_ns) / 1e9, static_cast<double>(s.put_ns) / 1e9);
  if (s.deleted != 0) std::printf("  %llu items of older versions or gone files deleted\n", static_cast<unsigned long long>(s.deleted));
  if (have_stats) {
    std::printf("  store %s (disk, %s): %llu chunks, %s of %s\n", o.store.c_str(), ts.codec,
                static_cast<unsigned long long>(ts.objects), Bytes(static_cast<double>(ts.used_bytes)).c_str(),
                Bytes(static_cast<double>(ts.capacity_bytes)).c_str());
  }
  if (s.interrupted) {
    std::printf("  stopped: %llu documents not looked at; run the same command again to go on\n",
                static_cast<unsigned long long>(s.left));
  }
  if (!o.json_path.empty()) {
    nlohmann::json j{{"documents", s.files},
                     {"items", s.items},
                     {"tokens", s.tokens},
                     {"bytes", s.bytes},
                     {"deleted", s.deleted},
                     {"wall_s", s.wall_s},
                     {"prefill_s", static_cast<double>(s.prefill_ns) / 1e9},
                     {"put_s", static_cast<double>(s.put_ns) / 1e9},
                     {"workers", s.workers},
                     {"interrupted", s.interrupted},
                     {"left", s.left}};
    for (int i = 0; i <= static_cast<int>(FileOutcome::kFailed); ++i) {
      j["outcomes"][refengine::OutcomeName(static_cast<FileOutcome>(i))] = s.by_outcome[i];
    }
    if (have_stats) {
      j["store"] = {{"objects", ts.objects}, {"used_bytes", ts.used_bytes}, {"codec", ts.codec}};
    }
    std::ofstream f(o.json_path);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "kdn ingest: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  if (s.interrupted) return 130;
  return n(FileOutcome::kFailed) != 0 ? 1 : 0;
}

}  // namespace kdn::tools
