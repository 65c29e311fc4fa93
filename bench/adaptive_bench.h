// SPDX-License-Identifier: Apache-2.0
// `kdn bench adaptive`: bandwidth-adaptive delivery (tiers/leveled_tier.h)
// through the bench's shaping proxy, against fixed-level delivery and
// against recomputing (issue 18, part 3).
// Thread-safety: RunAdaptiveBench is a whole command; run one at a time.
#pragma once

#include <string>

namespace kdn::bench {

struct AdaptiveBenchOptions {
  std::string json_path;
  int contexts = 8;           // held-out contexts per link and side
  double target_frac = 0.5;   // the TTFT target: this fraction of a full prefill's TTFT
  bool quick = false;         // 2 contexts, 2 links (a smoke test)
};

// The reference model's KV of held-out contexts (448 tokens, f16, chunks of
// 64 tokens) kept by a kdnd on a thread of this process; each side's
// runtime reaches it through a ShapingProxy at 0.1, 1 and 10 Gbit/s, at
// 0.01 and 0.002 Gbit/s (where no level can meet the target: the coarsest
// level, then recompute), and on a link that drops from 1 to 0.1 Gbit/s
// 1 ms into each request. Sides:
//   adaptive     levels zstd; kdn:hifi; kdn:balanced; tc:balanced (the
//                model's profile), ttft_target = target_frac x the full
//                prefill's TTFT
//   fixed_<c>    one codec c for every chunk (a remote tier with codec c)
//   recompute    the full prefill (no kdn)
// Per request: the cached 448 tokens fetched (FetchPrefix, as a load op),
// the chunks left to recompute prefilled at their positions, then the
// 449th token run: TTFT = request start to its logits; then 32 continued
// positions teacher-forced: KL against the full prefill's logits.
// Records adaptive_<link>_ttft_ms (baseline: recompute's), adaptive_<link>_kl,
// fixed_<c>_<link>_ttft_ms / _kl, with the levels used and the tokens
// recomputed in params.
int RunAdaptiveBench(const AdaptiveBenchOptions& options);

}  // namespace kdn::bench
