// SPDX-License-Identifier: Apache-2.0
#include "bench/adaptive_bench.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_kv.h"
#include "bench/bench_net.h"
#include "bench/bench_util.h"
#include "lab/codec/eval.h"
#include "core/codec/tc_profile.h"
#include "kernels/common/half.h"
#include "lab/model/transformer.h"
#include "refengine/model_loader.h"
#include "core/tiers/leveled_tier.h"
#include "core/runtime/runtime.h"

namespace kdn::bench {
namespace {

constexpr const char* kTool = "kdn bench adaptive";
constexpr int kCached = 448;    // tokens of a context whose KV is kept (7 chunks)
constexpr int kContinue = 32;   // continued positions compared
constexpr std::uint32_t kChunk = 64;

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Context {
  std::vector<int> tokens;            // kCached + 1 + kContinue - 1
  std::vector<std::uint16_t> kv16;    // the cached tokens' KV, canonical f16
  std::vector<float> ref_logits;      // [kContinue][vocab] from the full prefill
  double prefill_ms = 0;              // the full prefill of kCached + 1 tokens
};

struct Side {
  std::string name;        // "adaptive", "fixed_zstd", ...
  std::string ns;
  std::vector<std::string> levels;  // adaptive: every level; fixed: empty
  std::string codec;                 // fixed: the one codec
};

store::TierSpec RemoteSpec(const std::string& address, const Side& s) {
  store::TierSpec t;
  t.kind = store::TierSpec::Kind::kRemote;
  t.address = address;
  t.token = kNodeToken;
  t.timeout_ms = 30000;
  if (s.levels.empty()) {
    t.codec = s.codec;
  } else {
    t.levels = s.levels;
  }
  return t;
}

Result<std::shared_ptr<store::Runtime>> SideRuntime(const std::string& address, const Side& s) {
  store::StoreOptions o;
  o.chunk_tokens = kChunk;
  o.tiers = {RemoteSpec(address, s)};
  return store::Runtime::Create(o, 1);
}

// One request: the cached prefix fetched (with the side's target), the
// chunks left to recompute prefilled, the next token run. TTFT in ms; the
// continued positions' KL against the full prefill; tokens recomputed.
struct Outcome {
  double ttft_ms = 0, kl = 0;
  std::uint64_t recomputed = 0;
};

Result<Outcome> Request(store::Runtime& rt, const store::ModelKv& m, const std::string& ns, const Context& c,
                        model::Transformer& t, model::KvCache& cache, std::int64_t target_ns) {
  Outcome out;
  const std::vector<std::int32_t> cached(c.tokens.begin(), c.tokens.begin() + kCached);
  const std::int64_t t0 = NowNs();
  store::Fetch f;
  {
    store::DeliveryTarget target;  // none when target_ns is 0
    if (target_ns > 0) target.deadline_ns = t0 + target_ns;
    f = rt.store().FetchPrefix(m, ns, Keys(cached), store::TieredStore::Form::kCanonical, target);
  }
  // The fetched chunks into the transformer's cache (f16 -> f32).
  const int kv_dim = cache.kv_dim();
  std::vector<bool> have(kCached, false);
  for (const store::FetchedChunk& fc : f.chunks) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(fc.lease.chunk()->payload.data());
    const size_t n = fc.tokens;
    for (int l = 0; l < cache.layers(); ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const std::uint16_t* src = h + (static_cast<size_t>(l) * 2 + static_cast<size_t>(kv)) * n * static_cast<size_t>(kv_dim);
        for (size_t i = 0; i < n; ++i) {
          float* dst = kv == 0 ? cache.k(l, static_cast<int>(fc.begin + i)) : cache.v(l, static_cast<int>(fc.begin + i));
          for (int d = 0; d < kv_dim; ++d) dst[d] = kernels::half_to_float(src[i * static_cast<size_t>(kv_dim) + static_cast<size_t>(d)]);
        }
      }
    }
    for (size_t i = 0; i < n; ++i) have[fc.begin + i] = true;
  }
  f.chunks.clear();  // the leases go
  // What did not come: recomputed in order, each run at its positions.
  for (int b = 0; b < kCached;) {
    if (have[static_cast<size_t>(b)]) {
      ++b;
      continue;
    }
    int e = b;
    while (e < kCached && !have[static_cast<size_t>(e)]) ++e;
    const std::vector<int> run(c.tokens.begin() + b, c.tokens.begin() + e);
    KDN_RETURN_IF_ERROR(t.Forward(run, b, cache, nullptr));
    out.recomputed += static_cast<std::uint64_t>(e - b);
    b = e;
  }
  std::vector<float> logits;
  KDN_RETURN_IF_ERROR(t.Forward(std::vector<int>{c.tokens[kCached]}, kCached, cache, &logits));
  out.ttft_ms = static_cast<double>(NowNs() - t0) / 1e6;
  // Quality: the continued positions, teacher-forced, against the full prefill.
  std::vector<int> forced(c.tokens.begin() + kCached + 1, c.tokens.end());
  std::vector<float> all;
  std::vector<int> greedy;
  KDN_RETURN_IF_ERROR(codec::Continue(t, cache, c.tokens[kCached], kCached + 1, kContinue, &forced, &all, &greedy));
  const size_t vocab = all.size() / kContinue;
  double kl = 0;
  for (int k = 0; k < kContinue; ++k) {
    kl += codec::KlDivergence(std::span<const float>(all.data() + static_cast<size_t>(k) * vocab, vocab),
                              std::span<const float>(c.ref_logits.data() + static_cast<size_t>(k) * vocab, vocab));
  }
  out.kl = kl / kContinue;
  return out;
}

}  // namespace

int RunAdaptiveBench(const AdaptiveBenchOptions& o) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "%s: %s\n", kTool, m.c_str());
    return 2;
  };
  auto loaded = refengine::LoadModel("", "", /*allow_random=*/false);
  if (!loaded.ok()) return fail(loaded.status().message());
  const model::ModelConfig& cfg = loaded->weights->config();
  std::ifstream in(TextPath("heldout.txt"), std::ios::binary);
  if (!in) return fail("cannot read " + TextPath("heldout.txt"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int> stream = codec::TokenizeStories(*loaded->tokenizer, text);
  const int contexts = o.quick ? 2 : o.contexts;
  const size_t span = kCached + kContinue;  // tokens per context (the last forced token is not run)
  if (stream.size() < span * static_cast<size_t>(contexts)) return fail("the held-out text is too short");
  const std::string profile = (std::filesystem::path(refengine::DefaultModelsDir()) / "stories260K.kdntc").string();
  auto prof = codec::LoadTcProfile(profile);
  if (!prof.ok() || (*prof)->fingerprints.size() < 2) return fail("the tc profile " + profile + " does not load");

  // The model's KV as the store keeps it: f16, named as the profile names it.
  store::ModelKv m;
  m.shape = {static_cast<std::uint32_t>(cfg.n_layers), static_cast<std::uint32_t>(cfg.n_kv_heads),
             static_cast<std::uint32_t>(cfg.head_dim()), 2};
  m.dtype = 1;
  std::memcpy(m.fingerprint.data(), (*prof)->fingerprints[1].data(), 32);

  // Contexts: exact KV and the full prefill's logits.
  model::Transformer t(*loaded->weights);
  model::KvCache cache = t.NewCache();
  std::vector<Context> ctx(static_cast<size_t>(contexts));
  const size_t stride = (stream.size() - span) / static_cast<size_t>(std::max(1, contexts - 1));
  std::vector<double> prefill_ms;
  for (int i = 0; i < contexts; ++i) {
    Context& c = ctx[static_cast<size_t>(i)];
    c.tokens.assign(stream.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(i) * stride),
                    stream.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(i) * stride + span));
    c.tokens[0] = model::kBos;
    for (int r = 0; r < 3; ++r) {  // the full prefill: what recompute costs (median of 3)
      const std::int64_t t0 = NowNs();
      std::vector<float> logits;
      if (Status st = t.Forward(std::vector<int>(c.tokens.begin(), c.tokens.begin() + kCached + 1), 0, cache, &logits);
          !st.ok()) {
        return fail(st.message());
      }
      prefill_ms.push_back(static_cast<double>(NowNs() - t0) / 1e6);
    }
    // The reference: the full prefill's own continuation (what recompute gives).
    std::vector<int> forced(c.tokens.begin() + kCached + 1, c.tokens.end());
    std::vector<int> greedy;
    if (Status st = codec::Continue(t, cache, c.tokens[kCached], kCached + 1, kContinue, &forced, &c.ref_logits, &greedy);
        !st.ok()) {
      return fail(st.message());
    }
    c.kv16 = ToHalf(cache.Export(0, kCached));  // what an engine holds and kdn keeps
  }
  const double prefill = Median(prefill_ms);
  const std::int64_t target_ns = static_cast<std::int64_t>(o.target_frac * prefill * 1e6);
  const std::uint64_t prefill_ns_per_token = static_cast<std::uint64_t>(prefill * 1e6 / (kCached + 1));

  const std::vector<std::string> levels = {"zstd", "kdn:hifi", "kdn:balanced", "tc:balanced,profile=" + profile};
  std::vector<Side> sides;
  sides.push_back({"adaptive", "adaptive", levels, ""});
  const char* names[] = {"zstd", "kdn_hifi", "kdn_balanced", "tc_balanced"};
  for (size_t i = 0; i < levels.size(); ++i) {
    sides.push_back({std::string("fixed_") + names[i], std::string("fixed-") + names[i], {}, levels[i]});
  }

  Node node;
  if (Status st = node.Start(); !st.ok()) return fail("kdnd: " + st.message());
  // Stored once per side, straight to the node.
  for (const Side& s : sides) {
    auto rt = SideRuntime(node.address(), s);
    if (!rt.ok()) return fail(rt.status().message());
    for (const Context& c : ctx) {
      auto views = CanonicalViews(m, const_cast<std::uint16_t*>(c.kv16.data()), kCached);
      if (!views.ok()) return fail(views.status().message());
      const std::vector<std::int32_t> cached(c.tokens.begin(), c.tokens.begin() + kCached);
      auto stored = (*rt)->Store(m, s.ns, Keys(cached), *views);
      if (!stored.ok() || *stored != static_cast<std::uint64_t>(kCached)) return fail("cannot store a context (" + s.name + ")");
    }
    (*rt)->store().chain().Flush();
  }

  struct Link {
    std::string name;
    double gbit, drop_to_gbit;  // drop_to_gbit > 0: 1 ms into each request
  };
  std::vector<Link> links = {{"0.002gbit", 0.002, 0}, {"0.01gbit", 0.01, 0}, {"0.1gbit", 0.1, 0},
                             {"1gbit", 1, 0},          {"10gbit", 10, 0},    {"1to0.1gbit", 1, 0.1}};
  if (o.quick) links = {{"0.1gbit", 0.1, 0}, {"1to0.1gbit", 1, 0.1}};

  Records records;
  std::printf("%s: %d contexts of %d cached tokens (chunks of %u), full prefill %.2f ms (median), target %.2f ms\n",
              kTool, contexts, kCached, kChunk, prefill, static_cast<double>(target_ns) / 1e6);
  nlohmann::json common{{"model", "stories260K"},
                        {"text", "bench/texts/heldout.txt"},
                        {"contexts", contexts},
                        {"cached_tokens", kCached},
                        {"chunk_tokens", kChunk},
                        {"continued_positions", kContinue},
                        {"kv", "f16, the full prefill's, as an engine holds it"},
                        {"prefill_ms", prefill},
                        {"target_ms", static_cast<double>(target_ns) / 1e6},
                        {"target_is", std::to_string(o.target_frac) + " x the full prefill's TTFT"},
                        {"levels", levels},
                        {"link", "a TCP proxy in the bench between the runtime and kdnd (both on loopback): node-to-client "
                                 "bytes paced by a token bucket; the drop link changes its rate 1 ms into each request"}};
  records.Add("adaptive_recompute_ttft_ms", prefill, "ms", common);
  for (const Link& link : links) {
    ShapingProxy proxy(node.port(), link.gbit * 1e9);
    if (!proxy.ok()) return fail("cannot start the shaping proxy");
    struct Result1 {
      std::vector<double> ttft;
      double kl = 0;
      std::uint64_t recomputed = 0;
      std::vector<std::uint64_t> fetched;
    };
    std::map<std::string, Result1> results;
    for (const Side& s : sides) {
      auto rt = SideRuntime(proxy.address(), s);
      if (!rt.ok()) return fail(rt.status().message());
      (void)(*rt)->store().ReportPrefill(m, kCached + 1, prefill_ns_per_token * (kCached + 1));
      auto* leveled = dynamic_cast<store::LeveledTier*>(&(*rt)->store().chain().tier(0));
      std::vector<std::uint64_t> before;
      Result1& r = results[s.name];
      // One warm-up request (the connection; the adaptive side's first
      // estimate of the link), then every context.
      for (int i = -1; i < contexts; ++i) {
        const Context& c = ctx[static_cast<size_t>(std::max(i, 0))];
        if (link.drop_to_gbit > 0) {
          proxy.Schedule(link.gbit * 1e9, NowNs() + 1'000'000, link.drop_to_gbit * 1e9);
        }
        auto got = Request(**rt, m, s.ns, c, t, cache, s.levels.empty() ? 0 : target_ns);
        if (!got.ok()) return fail(got.status().message());
        if (i < 0) {
          if (leveled) before = leveled->Counters().fetched;  // the warm-up's probe not counted
          continue;
        }
        r.ttft.push_back(got->ttft_ms);
        r.kl += got->kl / contexts;
        r.recomputed += got->recomputed;
      }
      if (leveled) {
        r.fetched = leveled->Counters().fetched;
        for (size_t l = 0; l < r.fetched.size(); ++l) r.fetched[l] -= before[l];
      }
    }
    for (const Side& s : sides) {
      const Result1& r = results[s.name];
      nlohmann::json p = common;
      p["link_gbit"] = link.gbit;
      if (link.drop_to_gbit > 0) p["drops_to_gbit"] = link.drop_to_gbit;
      p["tokens_recomputed_per_request"] = static_cast<double>(r.recomputed) / contexts;
      p["kl_mean"] = r.kl;
      if (!s.levels.empty()) {
        p["chunks_per_level"] = r.fetched;
        p["ttft_max_ms"] = *std::max_element(r.ttft.begin(), r.ttft.end());
        p["requests_within_target"] =
            std::count_if(r.ttft.begin(), r.ttft.end(), [&](double v) { return v <= static_cast<double>(target_ns) / 1e6; });
      } else {
        p["codec"] = s.codec;
      }
      const double ttft = Median(r.ttft);
      records.Add(s.name + "_" + link.name + "_ttft_ms", ttft, "ms", p, "recompute", prefill);
      records.Add(s.name + "_" + link.name + "_kl", r.kl, "nats", p);
    }
  }
  return records.Finish(o.json_path, kTool);
}

}  // namespace kdn::bench
