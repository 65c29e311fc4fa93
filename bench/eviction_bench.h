// SPDX-License-Identifier: Apache-2.0
// `kdn bench eviction`: eviction policies by the prefill time they save per
// GB of cache (issue 18, part 2): the cost-aware policy against LRU and
// S3-FIFO at the same capacities, on traces simulated as kdn's store serves
// them (lab/sim/cache_sim.h: prefix reuse, chunks of 256 tokens).
// Thread-safety: RunEvictionBench is a whole command; run one at a time.
#pragma once

#include <string>

namespace kdn::bench {

struct EvictionBenchOptions {
  std::string json_path;
  bool quick = false;  // fewer requests and capacities (a smoke test)
  // The traces' seed: 1818 by default, held out; the cost policy's one
  // parameter was chosen on seed 18.
  std::uint64_t seed = 1818;
};

// Two workloads (see the .cc): "zipf", documents of 8 chunks with 80/20
// popularity; "mixed", short chats (2 chunks) with long documents (64
// chunks, 16k tokens). Per workload, capacity and policy:
//   evict_<workload>_<policy>_<N>gb   prefill work saved per request per GB
//                                     of cache (token-equivalents: a token
//                                     at an empty context = 1, attention
//                                     priced by store/policy.h PrefillCost),
//                                     against LRU's in the same run; the
//                                     cost policy also against S3-FIFO's
//                                     (evict_<workload>_cost_vs_s3fifo_<N>gb)
// with params: the share of prefill work saved and of tokens hit.
int RunEvictionBench(const EvictionBenchOptions& options);

}  // namespace kdn::bench
