// SPDX-License-Identifier: Apache-2.0
// The kdn command: generate, demo, bench, disk, codec.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/bindings_bench.h"
#include "bench/blend_bench.h"
#include "bench/codec_bench.h"
#include "blend_cmd.h"
#ifdef KDN_WITH_LLAMACPP
#include "llama_command.h"
#include "llama_rag.h"
#endif
#include "codec_cmd.h"
#include "demo.h"
#include "disk_cmd.h"
#include "ingest_cmd.h"
#include "bench/foundation_bench.h"
#include "bench/eviction_bench.h"
#include "bench/ingest_bench.h"
#include "bench/rag_bench.h"
#include "bench/adaptive_bench.h"
#include "bench/gpu_bench.h"
#include "kdn/kdn.h"
#include "lab/model/transformer.h"
#include "refengine/model_loader.h"
#include "bench/redis_bench.h"
#include "bench/remote_bench.h"
#include "bench/store_bench.h"

namespace {

using namespace kdn;

// Sampling for `kdn generate --stories`: softmax at `temperature`, then the
// smallest set of the most likely tokens whose probability reaches top_p
// (nucleus sampling), one draw from `rng`.
int SampleTopP(const std::vector<float>& logits, double temperature, double top_p, std::mt19937_64& rng) {
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<double, int>> p;
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double e = std::exp((static_cast<double>(logits[i]) - top) / temperature);
    p.emplace_back(e, static_cast<int>(i));
    sum += e;
  }
  std::sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  size_t keep = 0;
  double mass = 0;
  while (keep < p.size() && mass < top_p * sum) mass += p[keep++].first;
  const double u = std::uniform_real_distribution<double>(0.0, mass)(rng);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i].first;
    if (u < acc) return p[i].second;
  }
  return p[keep - 1].second;
}

// `kdn generate --stories N`: N stories sampled from BOS, each until the
// model's BOS or EOS or its context, printed one paragraph each (blank lines
// inside a story folded to one newline), separated by blank lines: how
// bench/texts/heldout.txt was made (seed 11) and heldout2.txt (seed 12).
int GenerateStories(const refengine::LoadedModel& loaded, int stories, double temperature, double top_p,
                    std::uint64_t seed) {
  const model::Tokenizer& tok = *loaded.tokenizer;
  model::Transformer t(*loaded.weights);
  std::mt19937_64 rng(seed);
  const int ctx = t.config().seq_len;
  for (int n = 0; n < stories; ++n) {
    model::KvCache cache = t.NewCache();
    std::vector<float> logits;
    std::vector<int> out, in = {1};  // BOS
    for (int pos = 0; pos < ctx; ++pos) {
      if (Status st = t.Forward(in, pos, cache, &logits); !st.ok()) {
        std::fprintf(stderr, "kdn generate: %s\n", st.message().c_str());
        return 2;
      }
      const int next = SampleTopP(logits, temperature, top_p, rng);
      if (next == 1 || next == 2) break;  // BOS or EOS: the story ends
      out.push_back(next);
      in.assign(1, next);
    }
    std::string text = tok.DecodeAll(out, 1);
    while (!text.empty() && (text.front() == ' ' || text.front() == '\n')) text.erase(text.begin());
    while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.pop_back();
    for (size_t at; (at = text.find("\n\n")) != std::string::npos;) text.erase(at, 1);
    std::printf("%s\n\n", text.c_str());
  }
  return 0;
}

// `kdn generate`: greedy decoding with the reference transformer.
int Generate(const refengine::LoadedModel& loaded, const std::string& prompt, int steps, bool ids,
             const std::string& dump_prefix) {
  const model::Tokenizer& tok = *loaded.tokenizer;
  model::Transformer t(*loaded.weights);
  model::KvCache cache = t.NewCache();
  std::vector<int> tokens = tok.Encode(prompt, /*bos=*/true);
  const int ctx = t.config().seq_len;
  if (static_cast<int>(tokens.size()) > ctx) {
    std::fprintf(stderr, "kdn generate: the prompt has %zu tokens, the model's context is %d\n", tokens.size(), ctx);
    return 2;
  }
  if (static_cast<int>(tokens.size()) + steps - 1 > ctx) {
    const int fit = ctx - static_cast<int>(tokens.size()) + 1;
    std::fprintf(stderr, "kdn generate: only %d of %d steps fit the context of %d\n", fit, steps, ctx);
    steps = fit;
  }
  std::vector<float> logits;
  std::vector<int> out;
  int pos = 0;
  // Prefill the prompt in one batch, then one token per step.
  std::vector<int> in = tokens;
  for (int s = 0; s < steps; ++s) {
    if (Status st = t.Forward(in, pos, cache, &logits); !st.ok()) {
      std::fprintf(stderr, "kdn generate: %s\n", st.message().c_str());
      return 2;
    }
    pos += static_cast<int>(in.size());
    const int next = model::Argmax(logits);
    out.push_back(next);
    in.assign(1, next);
  }
  if (ids) {
    for (size_t i = 0; i < out.size(); ++i) std::printf(i ? " %d" : "%d", out[i]);
    std::printf("\n");
  } else {
    std::printf("%s%s\n", prompt.c_str(), tok.DecodeAll(out, tokens.back()).c_str());
  }
  if (!dump_prefix.empty()) {
    // Every processed position: BOS, the prompt, and the generated tokens but the last.
    const model::ModelConfig& c = t.config();
    const std::vector<float> kv = cache.Export(0, pos);  // [layer][k|v][pos][kv_dim]
    const size_t run = static_cast<size_t>(pos) * c.kv_dim();
    for (int which = 0; which < 2; ++which) {
      const std::string path = dump_prefix + (which == 0 ? ".k.f32" : ".v.f32");
      std::ofstream f(path, std::ios::binary);
      for (int l = 0; l < c.n_layers; ++l) {
        f.write(reinterpret_cast<const char*>(kv.data() + (static_cast<size_t>(l) * 2 + which) * run),
                static_cast<std::streamsize>(run * sizeof(float)));
      }
      if (!f) {
        std::fprintf(stderr, "kdn generate: cannot write %s\n", path.c_str());
        return 2;
      }
    }
    // The token id at each dumped position (int32, little-endian).
    std::vector<std::int32_t> processed(tokens.begin(), tokens.end());
    processed.insert(processed.end(), out.begin(), out.end());
    processed.resize(static_cast<size_t>(pos));
    const std::string path = dump_prefix + ".tokens.i32";
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(processed.data()),
            static_cast<std::streamsize>(processed.size() * sizeof(std::int32_t)));
    if (!f) {
      std::fprintf(stderr, "kdn generate: cannot write %s\n", path.c_str());
      return 2;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kdn: a Knowledge Delivery Network runtime for LLM serving engines"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(kdn_version()));

  std::string model, tokenizer, prompt, dump;
  int steps = 0, stories = 0;
  double temperature = 1.0, top_p = 0.9;
  std::uint64_t seed = 11;
  bool ids = false;
  auto* gen = app.add_subcommand("generate", "Greedy generation with the reference transformer (or sampled stories)");
  gen->add_option("--model", model, "llama2.c checkpoint")->required();
  gen->add_option("--tokenizer", tokenizer, "tokenizer file (tok512.bin format)")->required();
  gen->add_option("--prompt", prompt, "prompt text (default: none, start from BOS)");
  auto* steps_opt = gen->add_option("--steps", steps, "tokens to generate after the prompt")->check(CLI::Range(1, 1 << 20));
  auto* stories_opt = gen->add_option("--stories", stories, "instead: this many stories sampled from BOS (top-p), a paragraph each")
                          ->check(CLI::Range(1, 100000));
  stories_opt->excludes(steps_opt);
  gen->add_option("--temperature", temperature, "--stories: sampling temperature (default 1)")->check(CLI::Range(1e-3, 100.0));
  gen->add_option("--top-p", top_p, "--stories: nucleus mass (default 0.9)")->check(CLI::Range(1e-6, 1.0));
  gen->add_option("--seed", seed, "--stories: the sampler's seed (std::mt19937_64; default 11)");
  gen->add_flag("--ids", ids, "print token ids instead of text");
  gen->add_option("--dump-kv", dump, "write PREFIX.k.f32 and PREFIX.v.f32 ([layer][pos][kv_head][head_dim]) and PREFIX.tokens.i32 (the id at each pos)");

  kdn::tools::DemoOptions demo;
  auto* dm = app.add_subcommand("demo", "Store documents' KV and reuse it: TTFT cold vs with kdn");
  dm->add_option("--model", demo.model, "llama2.c checkpoint (default: the reference model, else a random one)");
  dm->add_option("--tokenizer", demo.tokenizer, "tokenizer file");
  dm->add_option("--chunk-tokens", demo.chunk_tokens, "tokens per stored chunk")->check(CLI::Range(1, 65536));
  dm->add_option("--steps", demo.steps, "continuation tokens compared per query")->check(CLI::Range(1, 256));
  dm->add_option("--repeats", demo.repeats, "timed runs per query")->check(CLI::Range(1, 1000));
  auto* remote_flag =
      dm->add_flag("--remote", demo.remote, "two engines in two processes share the KV through a kdnd (one this starts)");
  auto* node_opt = dm->add_option("--node", demo.node, "with --remote: a running kdnd's address (host:port or unix:PATH)")
                       ->needs(remote_flag);
  node_opt->needs(
      dm->add_option("--token-file", demo.token_file, "with --node: a file holding a token of the node (kdnd token new)"));
  dm->add_option("--namespace", demo.ns, "with --node: the namespace the token grants (default: demo)");
  dm->add_option("--remote-join", demo.join_address, "(internal) the second engine of --remote: the kdnd's address")
      ->group("");

  kdn::tools::IngestCmdOptions ing;
  auto* ingc = app.add_subcommand("ingest", "Every text file under a directory becomes a knowledge item of a store (resumable)");
  ingc->add_option("--dir", ing.dir, "the documents (every file under it; names starting with '.' left out)")->required();
  ingc->add_option("--store", ing.store, "the store's directory: a disk tier, and its index of documents (knowledge.kdnidx)")
      ->required();
  ingc->add_option("--model", ing.model, "llama2.c checkpoint (default: the reference model)");
  ingc->add_option("--tokenizer", ing.tokenizer, "tokenizer file");
  ingc->add_option("--namespace", ing.ns, "kdn namespace of the items (default: docs)");
  ingc->add_option("--pin", ing.pin_s, "pin every item for this many seconds (0: until unpinned)")->check(CLI::NonNegativeNumber);
  ingc->add_option("--engine", ing.engine, "what prefills: ref (the reference transformer)")->check(CLI::IsMember({"ref", "llama"}));
  ingc->add_option("--workers", ing.workers, "engines prefilling at once (default: one per core)")->check(CLI::Range(1, 256));
  ingc->add_option("--max-tokens", ing.max_tokens, "tokens per knowledge item at most; longer files are cut into PATH#1, PATH#2, ... (default: the model's context)")
      ->check(CLI::Range(1, 1 << 24));
  ingc->add_option("--capacity", ing.capacity, "the disk tier's capacity in bytes (default 16 GiB)")->check(CLI::Range(std::uint64_t{1} << 20, std::uint64_t{1} << 50));
  ingc->add_option("--codec", ing.codec, "the disk tier's codec (default zstd, lossless)");
  ingc->add_option("--chunk-tokens", ing.chunk_tokens, "tokens per stored chunk: the engines' runtimes must use the same (default 256)")
      ->check(CLI::Range(1, 65536));
  ingc->add_flag("--prune", ing.prune, "delete the namespace's items whose file is gone from --dir");
  ingc->add_option("--progress", ing.progress, "auto (a bar on a terminal), bar, lines")->check(CLI::IsMember({"auto", "bar", "lines"}));
  ingc->add_option("--json", ing.json_path, "also write the summary as JSON");

  auto* bench = app.add_subcommand("bench", "Benchmarks (JSON records)");
  bench->require_subcommand(1);
  kdn::bench::FoundationOptions fo;
  auto* found = bench->add_subcommand("foundation", "TTFT cold vs warm; host retrieve vs memcpy");
  found->add_option("--json", fo.json_path, "output file")->required();
  found->add_option("--model", fo.model, "llama2.c checkpoint (default: the reference model)");
  found->add_option("--tokenizer", fo.tokenizer, "tokenizer file");
  found->add_option("--repeats", fo.repeats, "timed runs per measure")->check(CLI::Range(1, 100000));
  found->add_flag("--quick", fo.quick, "few repeats (a smoke test, not a measurement)");
  kdn::bench::StoreBenchOptions so;
  auto* storeb = bench->add_subcommand("store", "Host get, disk read/write, key hashing, lookup, hit rates");
  storeb->add_option("--json", so.json_path, "output file")->required();
  storeb->add_option("--dir", so.dir, "scratch directory for the disk measures (default: the temp dir)");
  storeb->add_option("--repeats", so.repeats, "timed runs per measure")->check(CLI::Range(1, 100000));
  storeb->add_flag("--quick", so.quick, "small sizes and few repeats (a smoke test, not a measurement)");
  storeb->add_flag("--allow-memory-fs", so.allow_memory_fs,
                   "run even when the scratch directory is on tmpfs or another memory filesystem (refused otherwise)");
  kdn::bench::RemoteBenchOptions rbo;
  auto* remoteb = bench->add_subcommand("remote", "Remote tier vs raw TCP: put/get, delivery over a shaped link, TTFT");
  remoteb->add_option("--json", rbo.json_path, "output file")->required();
  remoteb->add_option("--repeats", rbo.repeats, "timed runs per measure")->check(CLI::Range(1, 100000));
  remoteb->add_flag("--quick", rbo.quick, "few chunks and repeats (a smoke test, not a measurement)");
  remoteb->add_flag("--put-get-only", rbo.put_get_only, "only the put/get records against raw TCP (no delivery or TTFT)");
  kdn::bench::RedisBenchOptions rdo;
  auto* redisb = bench->add_subcommand("redis", "Redis tier vs raw hiredis (single node, cluster): put/get, lookup, delivery");
  redisb->add_option("--json", rdo.json_path, "output file")->required();
  redisb->add_option("--repeats", rdo.repeats, "timed runs per measure")->check(CLI::Range(1, 100000));
  redisb->add_flag("--quick", rdo.quick, "few chunks and repeats (a smoke test, not a measurement)");
  kdn::bench::CodecBenchOptions cbo;
  auto* codecb = bench->add_subcommand("codec", "KV codecs on the reference model: ratio, KL, GB/s vs zstd; a PNG");
  codecb->add_option("--json", cbo.json_path, "output file")->required();
  codecb->add_option("--png", cbo.png_path, "ratio-against-KL plot (default: the JSON file with .png)");
  codecb->add_option("--model", cbo.model, "llama2.c checkpoint (default: the reference model)");
  codecb->add_option("--tokenizer", cbo.tokenizer, "tokenizer file");
  codecb->add_option("--text", cbo.text, "text cut into contexts (default: bench/texts/heldout.txt, held out from the presets' tuning)");
  codecb->add_option("--context", cbo.context, "tokens per quality context, BOS included (default 256, the store's chunk; 128 quick; 448 figures are added beside)")
      ->check(CLI::Range(2, 1 << 20));
  codecb->add_option("--continue", cbo.continue_tokens, "continued tokens per context (default 64; 16 with --quick)")
      ->check(CLI::Range(1, 1 << 20));
  codecb->add_option("--contexts", cbo.contexts, "at most this many contexts (default: all; 3 with --quick)")
      ->check(CLI::Range(1, 1 << 20));
  codecb->add_option("--repeats", cbo.repeats, "timed runs per speed measure, at least")->check(CLI::Range(1, 100000));
  codecb->add_option("--threads", cbo.threads, "threads for the quality evaluations (default: all cores)")
      ->check(CLI::Range(1, 1024));
  codecb->add_flag("--quick", cbo.quick, "few contexts and repeats (a smoke test, not a measurement)");

  kdn::bench::GpuBenchOptions gbo;
  auto* gpub = bench->add_subcommand("gpu", "GPU decode per codec vs the PCIe copy of the raw bytes (needs a CUDA GPU)");
  gpub->add_option("--json", gbo.json_path, "output file")->required();
  gpub->add_option("--repeats", gbo.repeats, "timed runs per measure (median)")->check(CLI::Range(1, 100000));
  gpub->add_flag("--emulated", gbo.emulated,
                 "delivery on the emulated device (host memory, the kernels' CPU paths): a check, not a GPU measure");
  gpub->add_option("--shape", gbo.shape,
                   "ref: the reference model's real KV; llama-8b: Llama-3.1-8B's shape, synthetic KV (default ref)")
      ->check(CLI::IsMember({"ref", "llama-8b"}));
  gpub->add_option("--tokens", gbo.tokens, "tokens per request with --shape llama-8b (default 4096 16384)")
      ->check(CLI::Range(256, 1 << 20));

  kdn::bench::EvictionBenchOptions ebo;
  auto* evictb = bench->add_subcommand(
      "eviction", "Eviction policies by prefill time saved per GB: cost-aware vs LRU and S3-FIFO (simulated traces)");
  evictb->add_option("--json", ebo.json_path, "output file")->required();
  evictb->add_flag("--quick", ebo.quick, "fewer requests and capacities (a smoke test, not a measurement)");
  evictb->add_option("--seed", ebo.seed, "the traces' seed (default 1818; the cost policy was tuned on 18)");

  kdn::bench::IngestBenchOptions ibo;
  auto* ingestb = bench->add_subcommand("ingest", "kdn ingest's tokens/s against the same engines' prefill alone; time to inject the reference corpus");
  ingestb->add_option("--json", ibo.json_path, "output file")->required();
  ingestb->add_option("--model", ibo.model, "llama2.c checkpoint (default: the reference model)");
  ingestb->add_option("--tokenizer", ibo.tokenizer, "tokenizer file");
  ingestb->add_option("--dir", ibo.dir, "documents to ingest (default: the reference corpus, one file per story of bench/texts)");
  ingestb->add_option("--scratch", ibo.scratch, "where the stores go (default: the temp dir)");
  ingestb->add_option("--workers", ibo.workers, "engines at once (default: one per core)")->check(CLI::Range(1, 256));
  ingestb->add_option("--repeats", ibo.repeats, "runs of each side (median)")->check(CLI::Range(1, 1000));
  ingestb->add_flag("--quick", ibo.quick, "one run of each on 8 documents (a smoke test, not a measurement)");

  kdn::bench::AdaptiveBenchOptions abo;
  auto* adaptiveb = bench->add_subcommand(
      "adaptive", "Bandwidth-adaptive delivery through a shaped link: TTFT and KL against fixed levels and recompute");
  adaptiveb->add_option("--json", abo.json_path, "output file")->required();
  adaptiveb->add_option("--contexts", abo.contexts, "held-out contexts per link and side (default 8)")->check(CLI::Range(1, 1000));
  adaptiveb->add_option("--target", abo.target_frac, "the TTFT target as a fraction of the full prefill's (default 0.5)")
      ->check(CLI::Range(0.01, 10.0));
  adaptiveb->add_flag("--quick", abo.quick, "2 contexts, 2 links (a smoke test, not a measurement)");

  kdn::bench::BlendBenchOptions bbo;
  auto* blendb = bench->add_subcommand("blend", "Blending at ratios 0..100%: KL, top-1, TTFT vs full prefill; a PNG");
  blendb->add_option("--json", bbo.json_path, "output file")->required();
  blendb->add_option("--png", bbo.png_path, "KL-against-ratio plot (default: the JSON file with .png)");
  blendb->add_option("--model", bbo.model, "llama2.c checkpoint (default: the reference model)");
  blendb->add_option("--tokenizer", bbo.tokenizer, "tokenizer file");
  blendb->add_option("--text", bbo.text, "text cut into chunks (default: bench/texts/stories.txt)");
  blendb->add_option("--contexts", bbo.contexts, "at most this many contexts (default: all; 4 with --quick)");
  blendb->add_flag("--quick", bbo.quick, "few contexts (a smoke test, not a measurement)");

  kdn::bench::RagBenchOptions rgo;
  bool rag_reference_only = false;
  auto* ragb = bench->add_subcommand(
      "rag", "The KDN paper's Table 1 at this model's scale: in-context, prefix reuse, blending, warm; delay, cost, quality");
  ragb->add_option("--json", rgo.json_path, "output file")->required();
  ragb->add_option("--png", rgo.png_path, "delay and cost per mode (default: the JSON file with .png)");
  ragb->add_option("--model", rgo.model, "llama2.c checkpoint (default: the reference model)");
  ragb->add_option("--tokenizer", rgo.tokenizer, "tokenizer file");
  ragb->add_option("--scratch", rgo.scratch, "where the stores go (default: the temp dir)");
  ragb->add_option("--requests", rgo.requests, "requests per engine (default 48; 8 with --quick)")->check(CLI::Range(1, 100000));
  ragb->add_option("--documents", rgo.documents, "documents per request (default 5)")->check(CLI::Range(1, 64));
  ragb->add_option("--document-tokens", rgo.document_tokens, "tokens per document at most (default 64)")
      ->check(CLI::Range(2, 512));
  ragb->add_option("--history-tokens", rgo.history_tokens, "chat history per request (default 80)")->check(CLI::Range(1, 512));
  ragb->add_option("--generate", rgo.generate, "tokens generated per request (default 16)")->check(CLI::Range(1, 512));
  ragb->add_option("--zipf", rgo.zipf, "documents' popularity exponent (default 1.0)")->check(CLI::Range(0.0, 10.0));
  ragb->add_option("--seed", rgo.seed, "the requests' seed (default 35)");
  ragb->add_option("--cpu-price", rgo.cpu_usd_per_core_hour, "USD per core-hour (default 0.0446)");
  ragb->add_flag("--reference-only", rag_reference_only, "the reference engine alone (not llama.cpp)");
  ragb->add_flag("--quick", rgo.quick, "6 stories, 8 requests (a smoke test, not a measurement)");

  kdn::tools::DiskCommand disk(app);  // `kdn disk fill`, `kdn disk verify`
  kdn::tools::CodecCommand codec(app);  // `kdn codec eval`
  kdn::tools::BlendCommand blend(app);  // `kdn blend eval`
  kdn::bench::BindingsBenchOptions bio;
  auto* bindingsb = bench->add_subcommand("bindings", "Go, Java, Python and Rust against the same calls from C: 32 MiB retrieve GB/s, lookup us");
  bindingsb->add_option("--json", bio.json_path, "JSON records")->required();
  bindingsb->add_option("--repeats", bio.repeats, "retrieves timed per side (median)");
  bindingsb->add_option("--lang", bio.languages, "only these (rust, go, java, python); default: every one built");
  bindingsb->add_option("--bindings-dir", bio.bindings_dir, "the build's bindings/ (default: this build's)");
#ifdef KDN_WITH_LLAMACPP
  kdn::llamacpp::LlamaCommand llama(app);  // `kdn llama`
  kdn::llamacpp::LlamaBenchCommand llamab(*bench);  // `kdn bench llama`
#else
  auto* llama = app.add_subcommand("llama", "A prompt on llama.cpp: not in this build (scripts/fetch-llamacpp)");
  llama->allow_extras();
#endif

  CLI11_PARSE(app, argc, argv);
  if (disk.chosen()) return disk.Run();
  if (codec.chosen()) return codec.Run();
  if (blend.chosen()) return blend.Run();
#ifdef KDN_WITH_LLAMACPP
  if (llama.chosen()) return llama.Run();
  if (llamab.chosen()) return llamab.Run();
#else
  if (*llama) {
    std::fprintf(stderr, "kdn llama: this kdn was built without llama.cpp: run scripts/fetch-llamacpp, then build again\n");
    return 2;
  }
#endif
  if (*gen) {
    if (steps == 0 && stories == 0) {
      std::fprintf(stderr, "kdn generate: --steps N (or --stories N) is required\n");
      return 2;
    }
    auto loaded = refengine::LoadModel(model, tokenizer, /*allow_random=*/false);
    if (!loaded.ok()) {
      std::fprintf(stderr, "kdn generate: %s\n", loaded.status().message().c_str());
      return 2;
    }
    if (stories > 0) return GenerateStories(*loaded, stories, temperature, top_p, seed);
    return Generate(*loaded, prompt, steps, ids, dump);
  }
  if (*dm && !demo.join_address.empty()) return kdn::tools::RunRemoteJoin(demo);
  if (*dm && demo.remote) return kdn::tools::RunRemoteDemo(demo, argv[0]);
  if (*dm) return kdn::tools::RunDemo(demo);
  if (*ingc) return kdn::tools::RunIngest(ing);
  if (*found) return kdn::bench::RunFoundation(fo);
  if (*storeb) return kdn::bench::RunStoreBench(so);
  if (*remoteb) return kdn::bench::RunRemoteBench(rbo);
  if (*redisb) return kdn::bench::RunRedisBench(rdo);
  if (*codecb) return kdn::bench::RunCodecBench(cbo);
  if (*blendb) return kdn::bench::RunBlendBench(bbo);
  if (*gpub) return kdn::bench::RunGpuBench(gbo);
  if (*evictb) return kdn::bench::RunEvictionBench(ebo);
  if (*ingestb) return kdn::bench::RunIngestBench(ibo);
  if (*ragb) {
#ifdef KDN_WITH_LLAMACPP
    if (!rag_reference_only) rgo.engines.push_back({"llama.cpp", kdn::llamacpp::RagEngineFactory()});
#endif
    (void)rag_reference_only;
    return kdn::bench::RunRagBench(rgo);
  }
  if (*adaptiveb) return kdn::bench::RunAdaptiveBench(abo);
  if (*bindingsb) return kdn::bench::RunBindingsBench(bio);
  return 1;
}
