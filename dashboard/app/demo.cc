// SPDX-License-Identifier: Apache-2.0
#include "demo.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "lab/model/transformer.h"
#include "refengine/ref_engine.h"
#include "server/config.h"
#include "server/server.h"
#include "refengine/stories.h"

#ifndef KDN_DASHBOARD_TEXTS
#define KDN_DASHBOARD_TEXTS ""
#endif

namespace kdn::dash {
namespace {

namespace fs = std::filesystem;
using refengine::LoadedModel;
using refengine::RefEngine;

const char kNamespace[] = "demo";
constexpr int kKnowledgeItems = 8;  // the first passages, registered as documents

// A fresh secret for each run (kdnd takes 16 characters or more).
std::string NewToken(std::mt19937_64& rng) {
  static const char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string t;
  for (int i = 0; i < 40; ++i) t += kDigits[rng() % 36];
  return t;
}

// Paragraphs (separated by blank lines) of a text file; empty when unreadable.
std::vector<std::string> Paragraphs(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  std::string line, cur;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += (cur.empty() ? "" : " ") + line;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// The reference model's prefill time per token: the median of five full
// prefills of the longest document, on this machine, now.
double MeasurePrefillUsPerToken(const LoadedModel& m, const std::vector<std::vector<int>>& docs) {
  const std::vector<int>* longest = &docs.front();
  for (const auto& d : docs) {
    if (d.size() > longest->size()) longest = &d;
  }
  model::Transformer t(*m.weights, 1);
  std::vector<double> us;
  for (int i = 0; i < 5; ++i) {
    model::KvCache cache = t.NewCache();
    const auto t0 = std::chrono::steady_clock::now();
    if (!t.Forward(*longest, 0, cache, nullptr).ok()) return 0;
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2] / static_cast<double>(longest->size());
}

}  // namespace

struct Demo::Impl {
  DemoOptions options;
  LoadedModel model;
  std::vector<std::vector<int>> docs;  // with BOS: prompts and stored prefixes
  double prefill_us = 0;
  fs::path dir;
  std::string dir_name;  // dir, for directory()
  std::string address, workload_token, stats_token;
  std::unique_ptr<server::Server> server;
  kdn_runtime* runtime = nullptr;  // in process: the workload's, with its own tiers
  std::unique_ptr<RefEngine> engine;  // in process: made by Start, used by the workload
  std::thread server_thread, workload;
  std::atomic<bool> stop{false};
  DemoCounters counters;

  // Everything that writes into `dir` is gone before it is removed: the
  // workload, then the runtime (its disk tier), then the node, destroyed
  // here and not after this body as a member: its knowledge registry and
  // disk tier write their last state when destroyed (the registry saves
  // again what changed since the drain's save), and a save into a removed
  // directory fails ("cannot create .../knowledge.kdnreg.tmp").
  ~Impl() {
    stop = true;
    if (workload.joinable()) workload.join();
    engine.reset();
    kdn_runtime_destroy(runtime);
    runtime = nullptr;
    if (server) server->Shutdown();
    if (server_thread.joinable()) server_thread.join();
    server.reset();
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }

  void Workload();
  // Registers the knowledge items, then serves requests until stopped.
  void Run(RefEngine& engine);
  void Serve(RefEngine& engine, const std::vector<std::string>& ids);
};

namespace {

// In process: the host tier over the disk tier, in this runtime.
kdn_runtime* LocalRuntime(const DemoOptions& options, const fs::path& disk, std::string* error) {
  const std::string path = disk.string();
  kdn_tier_config tiers[2] = {KDN_TIER_CONFIG_INIT, KDN_TIER_CONFIG_INIT};
  tiers[0].kind = KDN_TIER_HOST;
  tiers[0].capacity_bytes = options.host_bytes;
  tiers[1].kind = KDN_TIER_DISK;
  tiers[1].capacity_bytes = options.disk_bytes;
  tiers[1].path = path.data();
  tiers[1].path_len = path.size();
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = options.chunk_tokens;
  ro.tiers = tiers;
  ro.num_tiers = 2;
  kdn_runtime* rt = nullptr;
  if (kdn_status s = kdn_runtime_create(&ro, &rt); s != KDN_OK) {
    *error = refengine::FromKdn(s, "kdn_runtime_create").message();
    return nullptr;
  }
  return rt;
}

}  // namespace

void Demo::Impl::Workload() {
  if (engine) return Run(*engine);
  kdn_tier_config node = KDN_TIER_CONFIG_INIT;
  node.kind = KDN_TIER_REMOTE;
  node.address = address.data();
  node.address_len = address.size();
  node.token = workload_token.data();
  node.token_len = workload_token.size();
  kdn_runtime_options ro = KDN_RUNTIME_OPTIONS_INIT;
  ro.chunk_tokens = options.chunk_tokens;
  ro.tiers = &node;
  ro.num_tiers = 1;
  kdn_runtime* rt = nullptr;
  if (kdn_status s = kdn_runtime_create(&ro, &rt); s != KDN_OK) {
    std::fprintf(stderr, "kdn-dashboard --demo: %s\n", refengine::FromKdn(s, "kdn_runtime_create").message().c_str());
    return;
  }
  {
    auto made = RefEngine::Create(model, rt, 1);
    if (made.ok()) {
      Run(**made);
    } else {
      std::fprintf(stderr, "kdn-dashboard --demo: %s\n", made.status().message().c_str());
    }
  }
  kdn_runtime_destroy(rt);  // sends what is still queued to the node
}

void Demo::Impl::Run(RefEngine& engine) {
  kdn_model* pins = engine.model();
  std::vector<std::string> ids;
  for (int i = 0; i < kKnowledgeItems && i < static_cast<int>(docs.size()) && !stop; ++i) {
    ids.push_back("passage-" + std::to_string(i));
    // A knowledge item's KV is computed alone, from position 0, without BOS.
    const std::vector<int> tokens(docs[static_cast<size_t>(i)].begin() + 1, docs[static_cast<size_t>(i)].end());
    if (Status s = engine.PutDocument(kNamespace, ids.back(), tokens); !s.ok()) {
      std::fprintf(stderr, "kdn-dashboard --demo: knowledge put: %s\n", s.message().c_str());
      ++counters.errors;
    }
  }
  if (pins != nullptr && ids.size() >= 2) {
    kdn_knowledge_pin(pins, kNamespace, sizeof kNamespace - 1, ids[0].data(), ids[0].size(), 0);
    kdn_knowledge_pin(pins, kNamespace, sizeof kNamespace - 1, ids[1].data(), ids[1].size(), 15 * 60 * 1000);
  }
  Serve(engine, ids);
}

// Requests until stopped: Zipf-chosen documents (rank 1 the most asked).
void Demo::Impl::Serve(RefEngine& engine, const std::vector<std::string>& ids) {
  std::mt19937_64 rng(16);
  std::vector<double> weights;
  for (size_t k = 0; k < docs.size(); ++k) weights.push_back(1.0 / std::pow(static_cast<double>(k + 1), options.zipf_s));
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  std::discrete_distribution<size_t> pick_item(weights.begin(), weights.begin() + static_cast<long>(ids.size()));
  std::uniform_real_distribution<double> coin(0, 1);
  const std::vector<int> question = model.tokenizer->Encode(" Who was in the story?", false);
  while (!stop) {
    Status status;
    if (ids.size() >= 2 && coin(rng) < 0.2) {
      // RAG: two knowledge items in either order, then the question.
      const size_t a = pick_item(rng);
      size_t b = pick_item(rng);
      if (b == a) b = (a + 1) % ids.size();
      std::vector<int> prompt;
      kdn_blend_report report = KDN_BLEND_REPORT_INIT;
      auto answer = engine.Blended(kNamespace, {ids[a], ids[b]}, question, 0.15, 1, &prompt, &report);
      status = answer.status();
      if (answer.ok()) ++counters.blends;
      if (status.code() == Code::kNotFound) {
        // A passage's chunks were evicted: the engine puts it again, as a
        // RAG engine does with a retrieved passage it finds cold (only the
        // cold one: a put replaces the document, and with it its pin).
        status = Status::Ok();
        for (size_t k : {a, b}) {
          kdn_document_info info = KDN_DOCUMENT_INFO_INIT;
          const kdn_status held = kdn_knowledge_get_info(engine.model(), kNamespace, sizeof kNamespace - 1,
                                                         ids[k].data(), ids[k].size(), &info);
          if (held == KDN_OK && info.chunks_present == info.chunks) continue;
          const std::vector<int>& d = docs[k];
          if (status.ok()) status = engine.PutDocument(kNamespace, ids[k], std::vector<int>(d.begin() + 1, d.end()));
          if (status.ok()) ++counters.stores;
        }
      }
    } else {
      // A document as the prompt, as a serving engine takes it: looked up
      // and retrieved (a miss the first time, or after its chunks were
      // evicted), the rest prefilled, then stored when kdn lacked some of it.
      const size_t i = pick(rng);
      auto answer = engine.Serve(kNamespace, docs[i], 1);
      status = answer.status();
      if (answer.ok() && answer->cached_after > answer->reused_tokens) ++counters.stores;
    }
    ++counters.requests;
    if (!status.ok()) {
      if (counters.errors.fetch_add(1) < 3) std::fprintf(stderr, "kdn-dashboard --demo: %s\n", status.message().c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the node is away: do not spin
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(options.pause_ms));
  }
}

Demo::Demo(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Demo::~Demo() = default;

std::unique_ptr<Demo> Demo::Start(const DemoOptions& options, std::string* error) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  auto loaded = refengine::LoadModel("", "", /*allow_random=*/false);
  if (!loaded.ok()) {
    *error = "the demo needs the reference model (models/stories260K.bin and tok512.bin; set KDN_MODELS): " +
             loaded.status().message();
    return nullptr;
  }
  impl->model = std::move(loaded).value();
  const LoadedModel& m = impl->model;
  const int ctx = m.weights->config().seq_len;

  std::vector<std::string> texts = Paragraphs(options.texts.empty() ? KDN_DASHBOARD_TEXTS : options.texts);
  if (texts.empty() && !options.texts.empty()) {
    *error = options.texts + ": no paragraphs to use as documents (cannot read it, or it is empty)";
    return nullptr;
  }
  if (texts.empty()) {  // an installed binary, away from the source tree
    for (const auto& story : refengine::kStories) texts.push_back(story.text);
  }
  for (const std::string& text : texts) {
    std::vector<int> t = m.tokenizer->Encode(text, /*bos=*/true);
    const size_t keep = std::min<size_t>(options.document_tokens, static_cast<size_t>(ctx - 16));
    if (t.size() > keep) t.resize(keep);
    if (t.size() > options.chunk_tokens) impl->docs.push_back(std::move(t));
  }
  if (impl->docs.size() < 2) {
    *error = "the demo's texts give fewer than two documents longer than a chunk";
    return nullptr;
  }
  impl->prefill_us = MeasurePrefillUsPerToken(m, impl->docs);

  char tmpl[] = "/tmp/kdn-dashboard-demo.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    *error = std::string("cannot make a directory in /tmp: ") + std::strerror(errno);
    return nullptr;
  }
  impl->dir = tmpl;
  impl->dir_name = tmpl;
  Impl* raw = impl.get();
  if (options.in_process) {
    impl->runtime = LocalRuntime(options, impl->dir / "disk", error);
    if (impl->runtime == nullptr) return nullptr;
    auto engine = RefEngine::Create(impl->model, impl->runtime, 1);
    if (!engine.ok()) {
      *error = engine.status().message();
      return nullptr;
    }
    impl->engine = std::move(engine).value();
    impl->workload = std::thread([raw] { raw->Workload(); });
    return std::unique_ptr<Demo>(new Demo(std::move(impl)));
  }
  std::mt19937_64 rng(std::random_device{}());
  impl->workload_token = NewToken(rng);
  impl->stats_token = NewToken(rng);
  std::ostringstream toml;
  toml << "[server]\nlisten = [\"127.0.0.1:0\"]\nprefill_us_per_token = " << impl->prefill_us << "\n"
       << "[[tier]]\nkind = \"host\"\ncapacity = " << options.host_bytes << "\n"
       << "[[tier]]\nkind = \"disk\"\ncapacity = " << options.disk_bytes << "\npath = \""
       << (impl->dir / "disk").string() << "\"\nfsync = false\n"
       << "[[token]]\nname = \"workload\"\ntoken = \"" << impl->workload_token << "\"\nnamespaces = [\"" << kNamespace
       << "\"]\n"
       << "[[token]]\nname = \"dashboard\"\ntoken = \"" << impl->stats_token << "\"\nnamespaces = [\"" << kNamespace
       << "\"]\nstats = true\n";
  auto config = server::ParseConfig(toml.str(), "the demo's kdnd config");
  if (!config.ok()) {
    *error = config.status().message();
    return nullptr;
  }
  auto created = server::Server::Create(*config);
  if (!created.ok()) {
    *error = "kdnd: " + created.status().message();
    return nullptr;
  }
  impl->server = std::move(created).value();
  impl->server_thread = std::thread([raw] {
    if (Status s = raw->server->Run(nullptr, /*handle_signals=*/false); !s.ok()) {
      std::fprintf(stderr, "kdn-dashboard --demo: kdnd: %s\n", s.message().c_str());
    }
  });
  const server::BoundAddresses bound = impl->server->WaitReady();
  if (bound.rpc.empty()) {
    *error = "kdnd did not start (see above)";
    return nullptr;
  }
  impl->address = bound.rpc.front();
  impl->workload = std::thread([raw] { raw->Workload(); });
  return std::unique_ptr<Demo>(new Demo(std::move(impl)));
}

const std::string& Demo::address() const { return impl_->address; }
const std::string& Demo::stats_token() const { return impl_->stats_token; }
kdn_runtime* Demo::runtime() const { return impl_->runtime; }
const kdn_model* Demo::model() const { return impl_->engine ? impl_->engine->model() : nullptr; }
const char* Demo::knowledge_namespace() { return kNamespace; }
double Demo::prefill_us_per_token() const { return impl_->prefill_us; }
const DemoCounters& Demo::counters() const { return impl_->counters; }
server::Server* Demo::node() const { return impl_->server.get(); }
const std::string& Demo::directory() const { return impl_->dir_name; }

std::string Demo::describe() const {
  char line[512];
  const std::string where = impl_->runtime != nullptr ? "a runtime in this process" : "kdnd on " + impl_->address;
  std::snprintf(line, sizeof line,
                "%s (host tier %.1f MiB over disk tier %.1f MiB), %zu documents, prefill %.2f us/token "
                "measured (%s)",
                where.c_str(), static_cast<double>(impl_->options.host_bytes) / (1 << 20),
                static_cast<double>(impl_->options.disk_bytes) / (1 << 20), impl_->docs.size(), impl_->prefill_us,
                impl_->model.description.c_str());
  return line;
}

}  // namespace kdn::dash
