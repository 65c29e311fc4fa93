// SPDX-License-Identifier: Apache-2.0
#include "bench/eviction_bench.h"

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "lab/sim/cache_sim.h"
#include "core/store/policy.h"

namespace kdn::bench {
namespace {

struct Workload {
  std::string name;
  store::MixedWorkload w;
  std::vector<double> capacities_gb;
  std::string why;
};

std::vector<Workload> Workloads(bool quick, std::uint64_t seed) {
  const std::uint64_t requests = quick ? 20000 : 200000;
  std::vector<Workload> out;
  // Documents of 2,048 tokens (8 chunks), 80% of the requests to the top
  // 20% of 1,000 (the store bench's hit-rate workload, priced).
  Workload zipf;
  zipf.name = "zipf";
  zipf.w.families = {{"documents", 1000, 2048, store::kZipfExponent8020, 1.0}};
  zipf.w.requests = requests;
  zipf.w.seed = seed;
  zipf.capacities_gb = {64, 256};  // the working set: 1000 x 2048 x 128 KiB = 250 GiB
  if (!quick) zipf.capacities_gb = {32, 64, 128, 256};
  zipf.why = "1000 documents of 2048 tokens, 80/20 popularity; working set 250 GiB";
  out.push_back(zipf);
  // Short chats and long documents: 80% of the requests are chats of 512
  // tokens among 50,000 (mild skew: most are seen a few times), 20% read
  // one of 200 documents of 16,384 tokens (Zipf 1.0).
  Workload mixed;
  mixed.name = "mixed";
  mixed.w.families = {{"chats", 50000, 512, 0.6, 0.8}, {"documents", 200, 16384, 1.0, 0.2}};
  mixed.w.requests = requests;
  mixed.w.seed = seed;
  mixed.capacities_gb = {64, 256};
  if (!quick) mixed.capacities_gb = {32, 64, 128, 256};
  mixed.why = "80% chats of 512 tokens among 50000 (Zipf 0.6), 20% documents of 16384 tokens among 200 (Zipf 1.0); "
              "working set 3.1 + 0.4 TiB";
  out.push_back(mixed);
  return out;
}

}  // namespace

int RunEvictionBench(const EvictionBenchOptions& o) {
  Records records;
  const store::PolicyKind kinds[] = {store::PolicyKind::kLru, store::PolicyKind::kS3Fifo, store::PolicyKind::kCost};
  for (const Workload& wl : Workloads(o.quick, o.seed)) {
    const std::vector<store::SimSequence> trace = store::MixedRequests(wl.w);
    for (double gb : wl.capacities_gb) {
      const auto bytes = static_cast<std::uint64_t>(gb * (1ull << 30));
      double per_gb[3] = {0, 0, 0};
      store::PrefixSimResult res[3];
      for (int k = 0; k < 3; ++k) {
        res[k] = store::SimulatePrefixReuse(kinds[k], bytes, wl.w, trace);
        per_gb[k] = res[k].requests ? res[k].saved / static_cast<double>(res[k].requests) / gb : 0.0;
      }
      const std::string cap = std::to_string(static_cast<int>(gb)) + "gb";
      const std::string lru = "evict_" + wl.name + "_lru_" + cap;
      for (int k = 0; k < 3; ++k) {
        nlohmann::json p = {{"workload", wl.why},
                            {"capacity_gib", gb},
                            {"policy", store::PolicyName(kinds[k])},
                            {"requests", wl.w.requests},
                            {"seed", wl.w.seed},
                            {"cost_policy_tuned_on_seed", 18},
                            {"warmup_requests", wl.w.requests / 10},
                            {"chunk_tokens", wl.w.chunk_tokens},
                            {"bytes_per_token", wl.w.bytes_per_token},
                            {"attention_parity_tokens", store::kAttentionParityTokens},
                            {"saved_work_share", res[k].saved_share()},
                            {"token_hit_share", res[k].tokens ? static_cast<double>(res[k].hit_tokens) /
                                                                    static_cast<double>(res[k].tokens)
                                                              : 0.0},
                            {"simulated", "the store's prefix reuse and eviction, simulated (lab/sim/cache_sim.h)"}};
        const std::string name = "evict_" + wl.name + "_" + store::PolicyName(kinds[k]) + "_" + cap;
        const std::string unit = "tok-eq/req/GiB";
        if (k == 0) {
          records.Add(name, per_gb[k], unit, p);
        } else {
          records.Add(name, per_gb[k], unit, p, lru, per_gb[0]);
        }
        if (kinds[k] == store::PolicyKind::kCost) {
          records.Add("evict_" + wl.name + "_cost_vs_s3fifo_" + cap, per_gb[k], unit, p,
                      "evict_" + wl.name + "_s3fifo_" + cap, per_gb[1]);
        }
      }
    }
  }
  return records.Finish(o.json_path, "kdn bench eviction");
}

}  // namespace kdn::bench
