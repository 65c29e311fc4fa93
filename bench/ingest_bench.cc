// SPDX-License-Identifier: Apache-2.0
#include "bench/ingest_bench.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/bench_util.h"
#include "refengine/ingest.h"

namespace kdn::bench {
namespace {

namespace fs = std::filesystem;
constexpr const char* kTool = "kdn bench ingest";

std::string TextsDir() {
  const std::string built = KDN_BENCH_TEXTS_DIR;
  std::error_code ec;
  return fs::exists(built + "/stories.txt", ec) ? built : "bench/texts";
}

// The reference corpus into `dir`; how many files.
Result<int> WriteCorpus(const fs::path& dir, int limit) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::Internal("cannot create " + dir.string() + ": " + ec.message());
  int n = 0;
  for (const char* name : {"stories", "heldout", "calibration"}) {
    std::ifstream in(TextsDir() + "/" + name + ".txt");
    if (!in) return Status::NotFound(std::string("no ") + TextsDir() + "/" + name + ".txt");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    size_t at = 0, k = 0;
    while (at < text.size() && n < limit) {
      size_t end = text.find("\n\n", at);
      if (end == std::string::npos) end = text.size();
      std::string para = text.substr(at, end - at);
      at = end + 2;
      if (para.find_first_not_of(" \n\t") == std::string::npos) continue;
      char file[64];
      std::snprintf(file, sizeof file, "%s/%03zu.txt", name, k++);
      fs::create_directories((dir / file).parent_path(), ec);
      std::ofstream out(dir / file);
      out << para << "\n";
      if (!out) return Status::Internal("cannot write " + (dir / file).string());
      ++n;
    }
  }
  return n;
}

struct Run {
  refengine::IngestSummary sum;
  double wall_s = 0;
};

Result<Run> IngestOnce(const refengine::LoadedModel& model, const std::string& docs, const fs::path& store, bool put,
                       int workers) {
  refengine::StoreOptions so;
  so.dir = store.string();
  so.capacity = std::uint64_t{8} << 30;
  auto opened = refengine::OpenStore(so);
  if (!opened.ok()) return opened.status();
  kdn_runtime* rt = *opened;
  refengine::IngestOptions io;
  io.dir = docs;
  io.ns = "bench";
  io.workers = workers;
  io.store = put;
  const auto t0 = std::chrono::steady_clock::now();
  auto sum = refengine::Ingest(model, rt, io, nullptr, {});
  kdn_runtime_destroy(rt);  // the disk writes and the index's last save are part of the cost
  Run r;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!sum.ok()) return sum.status();
  r.sum = *sum;
  return r;
}

}  // namespace

int RunIngestBench(const IngestBenchOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "%s: %s\n", kTool, m.c_str());
    return 2;
  };
  auto model = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!model.ok()) return fail(model.status().message());
  const fs::path scratch = fs::path(o.scratch.empty() ? fs::temp_directory_path().string() : o.scratch) /
                           ("kdn-bench-ingest-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(scratch, ec);
  std::string docs = o.dir;
  if (docs.empty()) {
    auto n = WriteCorpus(scratch / "corpus", o.quick ? 8 : 1 << 30);
    if (!n.ok()) return fail(n.status().message());
    docs = (scratch / "corpus").string();
  }
  const int repeats = o.quick ? 1 : o.repeats;
  std::vector<double> prefill_tps, ingest_tps, ingest_wall;
  double resume_s = 0;
  refengine::IngestSummary last;
  for (int r = 0; r < repeats; ++r) {
    auto pre = IngestOnce(*model, docs, scratch / ("prefill-" + std::to_string(r)), false, o.workers);
    if (!pre.ok()) return fail(pre.status().message());
    const fs::path store = scratch / ("store-" + std::to_string(r));
    auto ing = IngestOnce(*model, docs, store, true, o.workers);
    if (!ing.ok()) return fail(ing.status().message());
    if (ing->sum.tokens != pre->sum.tokens) return fail("the two sides prefilled different tokens");
    prefill_tps.push_back(static_cast<double>(pre->sum.tokens) / pre->wall_s);
    ingest_tps.push_back(static_cast<double>(ing->sum.tokens) / ing->wall_s);
    ingest_wall.push_back(ing->wall_s);
    last = ing->sum;
    if (r == 0) {
      auto again = IngestOnce(*model, docs, store, true, o.workers);
      if (!again.ok()) return fail(again.status().message());
      if (again->sum.items != 0) return fail("the second run over the same store put items again");
      resume_s = again->wall_s;
    }
    fs::remove_all(scratch / ("prefill-" + std::to_string(r)), ec);
    fs::remove_all(store, ec);
  }
  fs::remove_all(scratch, ec);

  const double pre = Median(prefill_tps), ing = Median(ingest_tps);
  nlohmann::json params{{"documents", last.files},
                        {"items", last.items},
                        {"tokens", last.tokens},
                        {"workers", last.workers},
                        {"repeats", repeats},
                        {"corpus", o.dir.empty() ? "reference (bench/texts, one file per story)" : o.dir},
                        {"store", "host tier written through to a disk tier (zstd, fdatasync per chunk: the defaults), every write and the index saved before the time stops"},
                        {"engine", "reference transformer, one thread per worker"}};
  if (o.quick) params["quick"] = true;
  Records records;
  std::printf("%s: %llu documents, %llu tokens, %d workers, %d runs of each side\n", kTool,
              static_cast<unsigned long long>(last.files), static_cast<unsigned long long>(last.tokens), last.workers,
              repeats);
  records.Add("ingest_prefill_only_tokens_per_s", pre, "tok/s", params);
  records.Add("ingest_tokens_per_s", ing, "tok/s", params, "prefill_only", pre);
  records.Add("ingest_store_overhead", 1.0 - ing / pre, "frac", params);
  records.Add("ingest_reference_corpus_s", Median(ingest_wall), "s", params);
  records.Add("ingest_resume_s", resume_s, "s", params);
  return records.Finish(o.json_path, kTool);
}

}  // namespace kdn::bench
