// SPDX-License-Identifier: Apache-2.0
#include "bench/rag_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <span>
#include <sstream>

#include "bench/bench_util.h"
#include "bench/plot.h"
#include "lab/codec/eval.h"
#include "refengine/ingest.h"  // first to include kdn.h (experimental calls)
#include "refengine/model_loader.h"
#include "refengine/ref_engine.h"

namespace kdn::bench {

const char* RagModeName(RagMode mode) {
  switch (mode) {
    case RagMode::kInContext:
      return "in_context";
    case RagMode::kPrefix:
      return "prefix";
    case RagMode::kBlend:
      return "blend";
    case RagMode::kWarm:
      return "warm";
    case RagMode::kKnowledgeCached:
      return "knowledge_cached";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;
constexpr const char* kTool = "kdn bench rag";
constexpr const char* kNs = "kb";
// The question after each history (not the blender's tuning suffix).
constexpr const char* kQuestion = "\nWhat did they do next?";
constexpr std::uint32_t kChunkTokens = kRagChunkTokens;

// The paper's Table 1 (Llama 3.1 70B on 2 A40s, AWS prices; 8K tokens of
// knowledge + 2K of history per request), quoted.
struct PaperRow {
  const char* what;
  const char* inject;
  double usd;
  double delay_s;
};
constexpr PaperRow kPaper[] = {{"fine-tuning", "10 hours (estimated)", 0.0052, 2.63},
                               {"in-context learning", "0", 0.0149, 10.91},
                               {"KV-cache learning with a KDN", "0.25 hours", 0.0059, 2.97}};
constexpr double kPaperPromptTokens = 8192 + 2048;
constexpr double kPaperKnowledgeTokens = 2e6;

std::string TextsDir() {
  const std::string built = KDN_BENCH_TEXTS_DIR;
  std::error_code ec;
  return fs::exists(built + "/heldout.txt", ec) ? built : "bench/texts";
}

Result<std::string> ReadText(const std::string& name) {
  std::ifstream in(TextsDir() + "/" + name);
  if (!in) return Status::NotFound("cannot read " + TextsDir() + "/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The knowledge base: one file per story of the held-out texts.
Result<int> WriteKnowledgeBase(const fs::path& dir, int per_text) {
  int n = 0;
  for (const char* name : {"heldout", "heldout2"}) {
    Result<std::string> text = ReadText(std::string(name) + ".txt");
    if (!text.ok()) return text.status();
    std::error_code ec;
    fs::create_directories(dir / name, ec);
    if (ec) return Status::Internal("cannot create " + (dir / name).string() + ": " + ec.message());
    size_t at = 0;
    int k = 0;
    while (at < text->size() && k < per_text) {
      size_t end = text->find("\n\n", at);
      if (end == std::string::npos) end = text->size();
      const std::string para = text->substr(at, end - at);
      at = end + 2;
      if (para.find_first_not_of(" \n\t") == std::string::npos) continue;
      char file[32];
      std::snprintf(file, sizeof file, "%03d.txt", k++);
      std::ofstream out(dir / name / file);
      out << para << "\n";
      if (!out) return Status::Internal("cannot write " + (dir / name / file).string());
      ++n;
    }
  }
  return n;
}

double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - static_cast<double>(lo));
}

}  // namespace

Result<kdn_runtime*> RagHostStore() {
  kdn_tier_config host = KDN_TIER_CONFIG_INIT;
  host.kind = KDN_TIER_HOST;
  host.capacity_bytes = std::uint64_t{256} << 20;
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = kChunkTokens;
  ro.tiers = &host;
  ro.num_tiers = 1;
  ro.device = KDN_DEVICE_NONE;
  kdn_runtime* rt = nullptr;
  KDN_RETURN_IF_ERROR(refengine::FromKdn(kdn_runtime_create(&ro, &rt), "a host store"));
  return rt;
}

// {"memory_bytes", "disk_bytes", "tiers", "tokens_served", "tokens_requested"}
// of a runtime (null: none, 0 bytes).
nlohmann::json RagStoreJson(kdn_runtime* rt) {
  nlohmann::json j = {{"memory_bytes", 0}, {"disk_bytes", 0}, {"tiers", nlohmann::json::array()},
                      {"tokens_served", 0}, {"tokens_requested", 0}};
  if (rt == nullptr) return j;
  std::uint64_t mem = 0, disk = 0;
  for (std::uint32_t i = 0;; ++i) {
    kdn_tier_stats t = KDN_TIER_STATS_INIT;
    if (kdn_runtime_get_tier_stats(rt, i, &t) != KDN_OK) break;
    (t.kind == KDN_TIER_DISK ? disk : mem) += t.used_bytes;
    j["tiers"].push_back({{"name", t.name}, {"codec", t.codec}, {"hits", t.hits}, {"misses", t.misses},
                          {"bytes_out", t.bytes_out}, {"used_bytes", t.used_bytes}, {"objects", t.objects}});
  }
  kdn_stats s = KDN_STATS_INIT;
  if (kdn_runtime_get_stats(rt, &s) == KDN_OK) {
    j["tokens_served"] = s.tokens_served;
    j["tokens_requested"] = s.tokens_requested;
    j["bytes_served"] = s.bytes_served;
  }
  j["memory_bytes"] = mem;
  j["disk_bytes"] = disk;
  return j;
}

namespace {

// The reference engine: one RefEngine (one thread) per mode's store.
class RefRagEngine : public RagEngine {
 public:
  static Result<std::unique_ptr<RefRagEngine>> Create(const refengine::LoadedModel& model, const fs::path& kb_store,
                                                       const RagInjected& injected) {
    std::unique_ptr<RefRagEngine> e(new RefRagEngine(injected));
    refengine::StoreOptions so;
    so.dir = kb_store.string();
    so.chunk_tokens = kChunkTokens;
    auto kb = refengine::OpenStore(so);
    if (!kb.ok()) return kb.status();
    e->rt_[static_cast<int>(RagMode::kBlend)] = *kb;
    for (RagMode m : {RagMode::kInContext, RagMode::kPrefix, RagMode::kWarm, RagMode::kKnowledgeCached}) {
      auto rt = RagHostStore();
      if (!rt.ok()) return rt.status();
      e->rt_[static_cast<int>(m)] = *rt;
    }
    for (int m = 0; m < kRagModes; ++m) {
      auto engine = refengine::RefEngine::Create(model, e->rt_[m], /*threads=*/1);
      if (!engine.ok()) return engine.status();
      e->engines_[m] = std::move(engine).value();
    }
    return e;
  }
  ~RefRagEngine() override {
    for (auto& e : engines_) e.reset();
    for (kdn_runtime* rt : rt_) {
      if (rt != nullptr) kdn_runtime_destroy(rt);
    }
  }

  refengine::RefEngine& blend_engine() { return *engines_[static_cast<int>(RagMode::kBlend)]; }

  std::string name() const override { return "reference"; }
  std::string description() const override {
    return "kdn's reference transformer (stories260K: 5 layers, dim 64, f32 KV), one thread";
  }
  std::string blend_method() const override {
    return "kdn_kv_blend at kdn's default (KV passes at check layers 1 and 2, 28% selected)";
  }
  Result<RagInjected> Inject(const std::vector<RagDocument>&) override { return injected_; }
  Status Prepare(RagMode mode, const RagRequest& r, const std::vector<RagDocument>&) override {
    if (mode != RagMode::kWarm && mode != RagMode::kKnowledgeCached) return Status::Ok();
    const std::vector<int> part =
        mode == RagMode::kWarm ? r.prompt
                               : std::vector<int>(r.prompt.begin(), r.prompt.end() - static_cast<std::ptrdiff_t>(r.tail.size()));
    auto stored = engines_[static_cast<int>(mode)]->Ingest("warm", part);
    return stored.ok() ? Status::Ok() : stored.status();
  }
  Result<RagServed> Serve(RagMode mode, const RagRequest& r, const std::vector<RagDocument>& kb, int generate,
                          const std::vector<int>* forced) override {
    refengine::RefEngine& e = *engines_[static_cast<int>(mode)];
    if (forced != nullptr) e.ForceContinuation(*forced);
    Result<refengine::Answer> a = Status::Internal("no mode");
    RagServed out;
    switch (mode) {
      case RagMode::kInContext:
        a = e.Cold(r.prompt, generate);
        break;
      case RagMode::kPrefix:
        a = e.Serve("rag", r.prompt, generate);
        break;
      case RagMode::kWarm:
      case RagMode::kKnowledgeCached:
        a = e.Warm("warm", r.prompt, generate);
        break;
      case RagMode::kBlend: {
        std::vector<std::string> ids;
        for (int d : r.documents) ids.push_back(kb[static_cast<size_t>(d)].id);
        std::vector<int> prompt;
        kdn_blend_report report = KDN_BLEND_REPORT_INIT;
        a = e.Blended(kNs, ids, r.tail, refengine::RefEngine::BlendMethod{}, generate, &prompt, &report);
        if (a.ok() && prompt != r.prompt) return Status::Internal("the blended prompt is not the request's");
        out.recompute_fraction = report.recompute_fraction;
        break;
      }
    }
    if (!a.ok()) return a.status();
    out.ttft_ms = a->ttft_ms;
    out.engine_ms = a->engine_ms;
    out.reused_tokens = a->reused_tokens;
    out.step_logits = std::move(a->step_logits);
    out.continuation = std::move(a->continuation);
    return out;
  }
  nlohmann::json Store(RagMode mode) override {
    // In-context keeps nothing (its runtime only meters the prefills).
    return RagStoreJson(mode == RagMode::kInContext ? nullptr : rt_[static_cast<int>(mode)]);
  }

 private:
  explicit RefRagEngine(const RagInjected& injected) : injected_(injected) {}
  RagInjected injected_;
  kdn_runtime* rt_[kRagModes] = {};
  std::unique_ptr<refengine::RefEngine> engines_[kRagModes];
};

struct IngestRun {
  refengine::IngestSummary sum;
  std::vector<std::string> ids;
  double wall_s = 0;
};

// `kdn ingest`'s code over `docs` into a store at `store` (put = false: the
// prefill alone), the store closed (its disk writes done) before the time stops.
Result<IngestRun> IngestOnce(const refengine::LoadedModel& model, const fs::path& docs, const fs::path& store,
                             std::uint32_t max_tokens, bool put) {
  refengine::StoreOptions so;
  so.dir = store.string();
  so.chunk_tokens = kChunkTokens;
  auto opened = refengine::OpenStore(so);
  if (!opened.ok()) return opened.status();
  refengine::IngestOptions io;
  io.dir = docs.string();
  io.ns = kNs;
  io.workers = 1;
  io.max_tokens = max_tokens;
  io.store = put;
  IngestRun run;
  const auto t0 = std::chrono::steady_clock::now();
  auto sum = refengine::Ingest(model, *opened, io, nullptr, [&](const refengine::FileEvent& ev, const refengine::IngestProgress&) {
    if (refengine::Skipped(ev.outcome)) return;
    if (ev.parts <= 1) {
      run.ids.push_back(ev.path);
    } else {
      for (std::uint32_t k = 1; k <= ev.parts; ++k) run.ids.push_back(ev.path + "#" + std::to_string(k));
    }
  });
  kdn_runtime_destroy(*opened);
  run.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!sum.ok()) return sum.status();
  run.sum = *sum;
  std::sort(run.ids.begin(), run.ids.end());
  return run;
}

// The requests: Zipf over the documents (ranks a seeded permutation),
// `documents` distinct per request in the order drawn; histories as windows
// of `history`, each request its own, of o.history_tokens (0: a quarter of
// the knowledge's mean, the paper's 8K : 2K).
struct Workload {
  std::vector<RagRequest> requests;
  int history_tokens = 0;
  double knowledge_mean = 0;
};
Result<Workload> MakeRequests(const RagBenchOptions& o, int n, const std::vector<RagDocument>& kb,
                              const std::vector<int>& history, const std::vector<int>& question) {
  if (static_cast<int>(kb.size()) < o.documents) return Status::InvalidArgument("fewer documents than a request retrieves");
  std::mt19937_64 rng(o.seed);
  std::vector<int> rank(kb.size());
  for (size_t i = 0; i < rank.size(); ++i) rank[i] = static_cast<int>(i);
  std::shuffle(rank.begin(), rank.end(), rng);
  std::vector<double> weight(kb.size());
  for (size_t i = 0; i < kb.size(); ++i) weight[i] = 1.0 / std::pow(static_cast<double>(i + 1), o.zipf);
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  Workload w;
  size_t knowledge = 0;
  for (int q = 0; q < n; ++q) {
    RagRequest r;
    std::set<int> seen;
    while (static_cast<int>(r.documents.size()) < o.documents) {
      const int d = rank[static_cast<size_t>(pick(rng))];
      if (seen.insert(d).second) r.documents.push_back(d);
    }
    r.prompt.assign(1, 1);
    for (int d : r.documents) {
      const std::vector<int>& t = kb[static_cast<size_t>(d)].tokens;
      r.prompt.insert(r.prompt.end(), t.begin(), t.end());
      knowledge += t.size();
    }
    w.requests.push_back(std::move(r));
  }
  w.knowledge_mean = static_cast<double>(knowledge) / n;
  w.history_tokens = o.history_tokens > 0 ? o.history_tokens : std::max(1, static_cast<int>(std::lround(w.knowledge_mean / 4)));
  const size_t h = static_cast<size_t>(w.history_tokens);
  if (history.size() < h) return Status::InvalidArgument("the history text is shorter than one history");
  // Windows of the history text: as many distinct ones as it has, then
  // shifted by half a history.
  const size_t windows = history.size() / h;
  for (size_t q = 0; q < w.requests.size(); ++q) {
    RagRequest& r = w.requests[q];
    const size_t win = q % windows, round = q / windows;
    const size_t at = std::min(win * h + (round * h / 2) % h, history.size() - h);
    r.tail.assign(history.begin() + static_cast<std::ptrdiff_t>(at), history.begin() + static_cast<std::ptrdiff_t>(at + h));
    r.tail.insert(r.tail.end(), question.begin(), question.end());
    r.prompt.insert(r.prompt.end(), r.tail.begin(), r.tail.end());
  }
  return w;
}

struct ModeStats {
  std::vector<double> delay_ms, ttft_ms, cpu_ms, engine_ms;
  std::uint64_t prompt_tokens = 0, reused = 0, served = 0;
  double recompute_sum = 0;
  double kl_sum = 0, kl_max = 0;
  std::uint64_t top1 = 0, positions = 0;  // over every generated position
  int same_continuation = 0;
  nlohmann::json store;
  double storage_usd = 0, cost_usd = 0, cpu_usd = 0;
  double kdn_cpu_ms = 0;  // per request: the CPU time less the model's forward passes
  double kdn_usd = 0;     // per request: that CPU time's price and the storage
};

struct EngineRun {
  std::string name, description, blend_method;
  RagInjected injected;
  ModeStats modes[kRagModes];
  double run_s = 0;
};

Result<EngineRun> RunEngine(RagEngine& engine, const RagBenchOptions& o, const std::vector<RagDocument>& kb,
                            const std::vector<RagRequest>& requests) {
  EngineRun run;
  run.name = engine.name();
  run.description = engine.description();
  run.blend_method = engine.blend_method();
  Result<RagInjected> injected = engine.Inject(kb);
  if (!injected.ok()) return injected.status();
  run.injected = *injected;
  std::printf("%s: %s: %zu requests, %d modes each\n", kTool, run.name.c_str(), requests.size(), kRagModes);
  // The reference for quality, untimed: each request in context, greedy
  // (also the warm-up).
  std::vector<RagServed> reference;
  for (const RagRequest& r : requests) {
    auto w = engine.Serve(RagMode::kInContext, r, kb, o.generate, nullptr);
    if (!w.ok()) return w.status();
    reference.push_back(std::move(w).value());
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t q = 0; q < requests.size(); ++q) {
    const RagRequest& r = requests[q];
    const RagServed& base = reference[q];
    // The modes in turn, the order rotated per request (no mode always
    // first after another's work); each fed the reference's continuation.
    for (int i = 0; i < kRagModes; ++i) {
      const int m = static_cast<int>((q + static_cast<size_t>(i)) % kRagModes);
      const RagMode mode = static_cast<RagMode>(m);
      KDN_RETURN_IF_ERROR(engine.Prepare(mode, r, kb));
      const double c0 = ProcessCpuMs(), w0 = NowMs();
      Result<RagServed> s = engine.Serve(mode, r, kb, o.generate, &base.continuation);
      const double w1 = NowMs(), c1 = ProcessCpuMs();
      if (!s.ok()) {
        return Status(s.status().code(), std::string(RagModeName(mode)) + ", request " + std::to_string(q) + ": " +
                                             s.status().message());
      }
      ModeStats& st = run.modes[m];
      st.delay_ms.push_back(w1 - w0);
      st.ttft_ms.push_back(s->ttft_ms);
      st.cpu_ms.push_back(c1 - c0);
      st.engine_ms.push_back(s->engine_ms);
      st.prompt_tokens += r.prompt.size();
      st.reused += s->reused_tokens;
      st.recompute_sum += s->recompute_fraction;
      ++st.served;
      // Quality: at each position, against the reference's distribution.
      const size_t positions = base.continuation.size();
      if (s->continuation.size() != positions || s->step_logits.size() != base.step_logits.size()) {
        return Status::Internal(std::string(RagModeName(mode)) + ": request " + std::to_string(q) +
                                " decoded another number of positions than in context");
      }
      const size_t vocab = base.step_logits.size() / std::max<size_t>(positions, 1);
      bool all = true;
      for (size_t p = 0; p < positions; ++p) {
        const std::span<const float> x(base.step_logits.data() + p * vocab, vocab),
            y(s->step_logits.data() + p * vocab, vocab);
        const double kl = codec::KlDivergence(x, y);
        st.kl_sum += kl;
        st.kl_max = std::max(st.kl_max, kl);
        const bool agree = s->continuation[p] == base.continuation[p];
        st.top1 += agree;
        all = all && agree;
        ++st.positions;
      }
      st.same_continuation += all;
    }
  }
  run.run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int m = 0; m < kRagModes; ++m) {
    ModeStats& st = run.modes[m];
    st.store = engine.Store(static_cast<RagMode>(m));
    // Storage: the bytes the mode's store holds at the end, for the run's
    // length, shared by its requests.
    const double month_s = 30.0 * 24 * 3600;
    const double gb_months = run.run_s / month_s / 1e9;
    st.storage_usd = (st.store["memory_bytes"].get<double>() * o.memory_usd_per_gb_month +
                      st.store["disk_bytes"].get<double>() * o.disk_usd_per_gb_month) *
                     gb_months / static_cast<double>(st.served);
    double cpu = 0, kdn = 0;
    for (size_t i = 0; i < st.cpu_ms.size(); ++i) {
      cpu += st.cpu_ms[i];
      kdn += std::max(0.0, st.cpu_ms[i] - st.engine_ms[i]);
    }
    st.cpu_usd = cpu / static_cast<double>(st.served) / 3.6e6 * o.cpu_usd_per_core_hour;
    st.cost_usd = st.cpu_usd + st.storage_usd;
    st.kdn_cpu_ms = kdn / static_cast<double>(st.served);
    st.kdn_usd = st.kdn_cpu_ms / 3.6e6 * o.cpu_usd_per_core_hour + st.storage_usd;
  }
  return run;
}

std::string Fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int RunRagBench(const RagBenchOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "%s: %s\n", kTool, m.c_str());
    return 2;
  };
  if (o.documents < 1 || o.document_tokens < 1 || o.history_tokens < 0 || o.generate < 1 || o.requests < 0) {
    return fail("--documents, --document-tokens, --history-tokens and --generate must be positive");
  }
  auto model = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!model.ok()) return fail(model.status().message());
  const int context = model->weights->config().seq_len;
  const fs::path scratch = fs::path(o.scratch.empty() ? fs::temp_directory_path().string() : o.scratch) /
                           ("kdn-bench-rag-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(scratch, ec);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(p, e);
    }
  } cleanup{scratch};

  // The knowledge base, ingested: the time to inject.
  auto files = WriteKnowledgeBase(scratch / "kb", o.quick ? 3 : 1 << 30);
  if (!files.ok()) return fail(files.status().message());
  const auto max_tokens = static_cast<std::uint32_t>(o.document_tokens);
  auto prefill_only = IngestOnce(*model, scratch / "kb", scratch / "prefill-only", max_tokens, false);
  if (!prefill_only.ok()) return fail(prefill_only.status().message());
  auto ingested = IngestOnce(*model, scratch / "kb", scratch / "store", max_tokens, true);
  if (!ingested.ok()) return fail(ingested.status().message());
  RagInjected ref_injected;
  ref_injected.wall_s = ingested->wall_s;
  ref_injected.prefill_s = prefill_only->wall_s;
  ref_injected.tokens = ingested->sum.tokens;
  std::printf("%s: knowledge base: %d stories of bench/texts/heldout*.txt, %llu items of <= %d tokens, %llu tokens; "
              "kdn ingest %.2f s (prefill alone %.2f s)\n",
              kTool, *files, static_cast<unsigned long long>(ingested->sum.items), o.document_tokens,
              static_cast<unsigned long long>(ingested->sum.tokens), ingested->wall_s, prefill_only->wall_s);

  auto ref = RefRagEngine::Create(*model, scratch / "store", ref_injected);
  if (!ref.ok()) return fail(ref.status().message());
  std::vector<RagDocument> kb;
  for (const std::string& id : ingested->ids) {
    auto t = (*ref)->blend_engine().DocumentTokens(kNs, id);
    if (!t.ok()) return fail("document " + id + ": " + t.status().message());
    kb.push_back({id, std::move(t).value()});
  }
  auto history_text = ReadText("calibration.txt");
  if (!history_text.ok()) return fail(history_text.status().message());
  std::vector<int> history;
  for (int t : codec::TokenizeStories(*model->tokenizer, *history_text)) {
    if (t != 1) history.push_back(t);  // one running chat, no BOS inside it
  }
  const std::vector<int> question = model->tokenizer->Encode(kQuestion, /*bos=*/false);
  const int n = o.requests > 0 ? o.requests : (o.quick ? 8 : 48);
  auto workload = MakeRequests(o, n, kb, history, question);
  if (!workload.ok()) return fail(workload.status().message());
  const std::vector<RagRequest>* requests = &workload->requests;
  size_t longest = 0, all = 0;
  for (const RagRequest& r : *requests) {
    longest = std::max(longest, r.prompt.size());
    all += r.prompt.size();
  }
  if (longest + static_cast<size_t>(o.generate) > static_cast<size_t>(context)) {
    return fail("a request's prompt (" + std::to_string(longest) + " tokens) and --generate exceed the model's context (" +
                std::to_string(context) + ")");
  }
  const int history_tokens = workload->history_tokens;
  const double mean_knowledge = workload->knowledge_mean, mean_history = static_cast<double>(history_tokens),
               mean_prompt = static_cast<double>(all) / n;
  const double scale = kPaperPromptTokens / (mean_knowledge + mean_history);
  std::printf("%s: %d requests: %d documents (%.0f tokens of knowledge) + %d tokens of history + %zu of question, "
              "then %d generated; the paper's 8K + 2K scaled down %.1fx\n",
              kTool, n, o.documents, mean_knowledge, history_tokens, question.size(), o.generate, scale);

  std::vector<EngineRun> runs;
  {
    auto r = RunEngine(**ref, o, kb, *requests);
    if (!r.ok()) return fail("reference engine: " + r.status().message());
    runs.push_back(std::move(r).value());
  }
  ref->reset();
  for (const auto& [name, factory] : o.engines) {
    const fs::path dir = scratch / ("engine-" + std::to_string(runs.size()));
    fs::create_directories(dir, ec);
    auto e = factory(dir.string());
    if (!e.ok()) return fail(name + ": " + e.status().message());
    auto r = RunEngine(**e, o, kb, *requests);
    if (!r.ok()) return fail(name + ": " + r.status().message());
    runs.push_back(std::move(r).value());
  }

  // Records.
  Records rec;
  rec.set_print_params(false);  // long (each mode's store); the table below is the summary
  nlohmann::json common = {{"requests", n},
                           {"documents_per_request", o.documents},
                           {"document_tokens_max", o.document_tokens},
                           {"knowledge_tokens_mean", mean_knowledge},
                           {"history_tokens", history_tokens},
                           {"question_tokens", question.size()},
                           {"prompt_tokens_mean", mean_prompt},
                           {"generate", o.generate},
                           {"zipf", o.zipf},
                           {"seed", o.seed},
                           {"knowledge_base_items", kb.size()},
                           {"knowledge_base_tokens", ingested->sum.tokens},
                           {"scale_vs_paper_prompt", scale},
                           {"text", "bench/texts/heldout.txt + heldout2.txt (knowledge), calibration.txt (histories); "
                                    "the blender's defaults were tuned on stories.txt"},
                           {"chunk_tokens", kChunkTokens},
                           {"cpu_usd_per_core_hour", o.cpu_usd_per_core_hour},
                           {"memory_usd_per_gb_month", o.memory_usd_per_gb_month},
                           {"disk_usd_per_gb_month", o.disk_usd_per_gb_month},
                           {"machine", "this machine's CPU (no GPU)"}};
  if (o.quick) common["quick"] = true;
  const RagMode kdn_mode = RagMode::kBlend;
  for (const EngineRun& run : runs) {
    const std::string e = "rag_" + std::string(run.name == "llama.cpp" ? "llamacpp" : run.name);
    nlohmann::json p = common;
    p["engine"] = run.description;
    p["run_s"] = run.run_s;
    const ModeStats& base = run.modes[static_cast<int>(RagMode::kInContext)];
    const double base_delay = Median(base.delay_ms), base_cost = base.cost_usd;
    for (int m = 0; m < kRagModes; ++m) {
      const ModeStats& st = run.modes[m];
      const std::string k = e + "_" + RagModeName(static_cast<RagMode>(m));
      nlohmann::json pm = p;
      pm["mode"] = RagModeName(static_cast<RagMode>(m));
      if (static_cast<RagMode>(m) == RagMode::kBlend) pm["method"] = run.blend_method;
      pm["store"] = st.store;
      pm["served"] = st.served;
      const bool b = m != static_cast<int>(RagMode::kInContext);
      rec.Add(k + "_delay_ms", Median(st.delay_ms), "ms", pm, b ? "in_context" : "", base_delay);
      rec.Add(k + "_delay_p90_ms", Quantile(st.delay_ms, 0.9), "ms", pm, b ? "in_context" : "",
              Quantile(base.delay_ms, 0.9));
      rec.Add(k + "_ttft_ms", Median(st.ttft_ms), "ms", pm, b ? "in_context" : "", Median(base.ttft_ms));
      rec.Add(k + "_cost_usd", st.cost_usd, "usd", pm, b ? "in_context" : "", base_cost);
      rec.Add(k + "_storage_usd", st.storage_usd, "usd", pm);
      double cpu = 0;
      for (double c : st.cpu_ms) cpu += c;
      rec.Add(k + "_cpu_ms", cpu / static_cast<double>(st.served), "ms", pm);
      double engine = 0;
      for (double c : st.engine_ms) engine += c;
      rec.Add(k + "_engine_ms", engine / static_cast<double>(st.served), "ms", pm);
      rec.Add(k + "_kdn_cpu_ms", st.kdn_cpu_ms, "ms", pm);
      rec.Add(k + "_kdn_usd", st.kdn_usd, "usd", pm);
      rec.Add(k + "_top1", static_cast<double>(st.top1) / static_cast<double>(st.positions), "frac", pm);
      rec.Add(k + "_kl", st.kl_sum / static_cast<double>(st.positions), "nats", pm);
      rec.Add(k + "_kl_max", st.kl_max, "nats", pm);
      rec.Add(k + "_same_continuation", static_cast<double>(st.same_continuation) / static_cast<double>(st.served),
              "frac", pm);
      rec.Add(k + "_reused_fraction", static_cast<double>(st.reused) / static_cast<double>(st.prompt_tokens), "frac",
              pm);
      if (static_cast<RagMode>(m) == RagMode::kBlend) {
        rec.Add(k + "_recompute_fraction", st.recompute_sum / static_cast<double>(st.served), "frac", pm);
      }
    }
    rec.Add(e + "_inject_s", run.injected.wall_s, "s", p, "prefill_only", run.injected.prefill_s);
    rec.Add(e + "_inject_tokens_per_s", static_cast<double>(run.injected.tokens) / run.injected.wall_s, "tok/s", p);
    nlohmann::json pp = p;
    pp["basis"] = "this run's ingest rate, linear in tokens, at the paper's 2M tokens of knowledge";
    rec.Add(e + "_inject_2m_tokens_h",
            kPaperKnowledgeTokens / (static_cast<double>(run.injected.tokens) / run.injected.wall_s) / 3600, "h", pp,
            "", 0, /*projected=*/true);
  }

  // The table, in the paper's shape (Markdown).
  std::printf("\n| %s | time to inject | cost per request | response delay per request: median, p90 | top-1, KL vs "
              "in-context | prompt KV reused |\n|---|---|---|---|---|---|\n",
              "");
  for (const PaperRow& r : kPaper) {
    std::printf("| paper (quoted): %s | %s | $%.4f (%.2fx) | %.2f s (%.2fx) | | |\n", r.what, r.inject, r.usd,
                r.usd / kPaper[1].usd, r.delay_s, r.delay_s / kPaper[1].delay_s);
  }
  const char* names[kRagModes] = {"in-context", "KDN prefix reuse", "KDN blending", "bound: warm (whole prompt cached)",
                                  "bound: knowledge cached in place"};
  const int order[kRagModes] = {0, 1, 2, 4, 3};
  for (const EngineRun& run : runs) {
    const ModeStats& base = run.modes[0];
    const double base_delay = Median(base.delay_ms);
    for (int m : order) {
      const ModeStats& st = run.modes[m];
      const std::string inject = m == 0   ? "0"
                                 : m == 1 ? "0 (cached as served)"
                                 : m == 2 ? Fmt("%.2f s", run.injected.wall_s) + Fmt(" (prefill alone %.2f s)", run.injected.prefill_s)
                                          : "(untimed)";
      const double delay = Median(st.delay_ms);
      std::printf("| %s: %s | %s | $%.2e (%.2fx; kdn %.0f%%) | %.1f ms, %.1f (%.2fx) | %.3f, %.2g | %.0f%% |\n",
                  run.name.c_str(), names[m], inject.c_str(), st.cost_usd, st.cost_usd / base.cost_usd,
                  100.0 * st.kdn_usd / st.cost_usd, delay,
                  Quantile(st.delay_ms, 0.9), delay / base_delay, static_cast<double>(st.top1) / st.positions,
                  st.kl_sum / st.positions, 100.0 * st.reused / st.prompt_tokens);
    }
  }
  std::printf("\nThis run: %d requests per mode; %.0f-token prompts (%.0f of knowledge in %d documents, %d of history, "
              "%zu of question; 1/%.1f of the paper's 10K), %d tokens generated; the CPU priced at $%.4f per core-hour, "
              "memory $%.2f and disk $%.2f per GB-month; this machine's CPU, no GPU.\n",
              n, mean_prompt, mean_knowledge, o.documents, history_tokens, question.size(), scale, o.generate,
              o.cpu_usd_per_core_hour, o.memory_usd_per_gb_month, o.disk_usd_per_gb_month);
  for (const EngineRun& run : runs) {
    const ModeStats& base = run.modes[0];
    const ModeStats& k = run.modes[static_cast<int>(kdn_mode)];
    const ModeStats& px = run.modes[static_cast<int>(RagMode::kPrefix)];
    const ModeStats& kc = run.modes[static_cast<int>(RagMode::kKnowledgeCached)];
    const double base_delay = Median(base.delay_ms);
    const double dr = Median(k.delay_ms) / base_delay, cr = k.cost_usd / base.cost_usd;
    const double top1 = static_cast<double>(k.top1) / k.positions;
    std::printf("%s (%s): blending is %s (%.2f of a full prefill's work recomputed).\n", run.name.c_str(),
                run.description.c_str(), run.blend_method.c_str(), k.recompute_sum / k.served);
    std::printf("  goals, KDN blending against in-context: delay %.2fx (paper 0.27x): %s; cost %.2fx (paper 0.40x): %s; "
                "blending top-1 %.3f (>= 0.9): %s; prefix reuse exact (KL max %.2g, %d/%llu continuations the same): %s. "
                "The bound with the knowledge cached in place: delay %.2fx, cost %.2fx.\n",
                dr, dr <= 1 / 3.7 ? "met" : "not met", cr, cr <= 1 / 2.5 ? "met" : "not met", top1,
                top1 >= 0.9 ? "met" : "not met", px.kl_max, px.same_continuation,
                static_cast<unsigned long long>(px.served),
                px.kl_max < 1e-9 && px.same_continuation == static_cast<int>(px.served) ? "yes" : "no",
                Median(kc.delay_ms) / base_delay, kc.cost_usd / base.cost_usd);
    std::string tiers;
    for (int m = 1; m < kRagModes; ++m) {
      const nlohmann::json& st = run.modes[m].store;
      tiers += std::string(m > 1 ? "; " : "") + RagModeName(static_cast<RagMode>(m)) + ":";
      for (const auto& t : st["tiers"]) {
        tiers += " " + t["name"].get<std::string>() +
                 Fmt(" %.0f hits", t["hits"].get<double>()) + Fmt(" %.2f MB out", t["bytes_out"].get<double>() / 1e6) +
                 Fmt(" %.2f MB held", t["used_bytes"].get<double>() / 1e6);
      }
    }
    std::printf("  stores: %s\n", tiers.c_str());
  }
  std::printf("GPU rows: not in this run (no GPU; docs/rag.md says how they are made).\n\n");

  // The PNG: response delay and cost per mode, relative to in-context.
  std::string png = o.png_path;
  if (png.empty()) png = fs::path(o.json_path).replace_extension(".png").string();
  std::string data = "$d << EOD\n";
  for (int m : order) {
    const char* label[kRagModes] = {"in-context", "prefix reuse", "blending", "warm (bound)", "knowledge cached (bound)"};
    data += std::string("\"") + label[m] + "\"";
    for (const EngineRun& run : runs) {
      data += Fmt(" %.4f", Median(run.modes[m].delay_ms) / Median(run.modes[0].delay_ms));
      data += Fmt(" %.4f", run.modes[m].cost_usd / run.modes[0].cost_usd);
    }
    data += "\n";
  }
  data += "EOD\n";
  std::string plot = "plot ";
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i) plot += ", ";
    plot += "$d using " + std::to_string(2 + 2 * i) + ":xtic(1) title " + GnuplotQuote(runs[i].name + ": delay") +
            ", '' using " + std::to_string(3 + 2 * i) + " title " + GnuplotQuote(runs[i].name + ": cost");
  }
  const std::string body = data + "set title " +
                           GnuplotQuote("kdn bench rag: response delay and cost per request, relative to in-context (" +
                                        Fmt("%.0f-token prompts, this CPU)", mean_prompt) +
                                        "\ndashed: the paper's KDN row, delay 0.27x and cost 0.40x of in-context") +
                           "\nset style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8 "
                           "border -1\nset yrange [0:*]\nset ylabel 'x in-context (lower is better)'\nset grid y\n"
                           "set key top right\nset arrow from graph 0, first 0.27 to graph 1, first 0.27 nohead dt 2\n"
                           "set arrow from graph 0, first 0.40 to graph 1, first 0.40 nohead dt 3\n" +
                           plot + "\n";
  DrawPng(png, body, kTool);
  return rec.Finish(o.json_path, kTool);
}

}  // namespace kdn::bench
