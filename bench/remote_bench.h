// SPDX-License-Identifier: Apache-2.0
// `kdn bench remote`: a runtime's remote tier against a kdnd (server/) run
// in-process on loopback, each measure beside a baseline that does the same
// work under the same guarantee in the same run.
// Thread-safety: RunRemoteBench is a plain function; it starts and stops
// its own threads (the node, a shaping proxy, raw TCP peers).
#pragma once

#include <string>

namespace kdn::bench {

struct RemoteBenchOptions {
  std::string json_path;
  int repeats = 0;  // 0: 5, or 2 with quick
  bool quick = false;
  // Only the put/get records (no model prefill, no shaped links): for
  // working on the transfer path itself.
  bool put_get_only = false;
};

// The measures (JSON records as DESIGN.md "Benchmarks" has them):
// - remote_put_gbps_{ref,32mib}: RemoteTier Put of N chunks + Flush (GB/s of
//   envelope bytes), against a raw TCP stream of the same bytes to a
//   receiver that acknowledges once it holds them all.
// - remote_get_gbps_{ref,32mib}: RemoteTier::Get of each chunk, against raw
//   TCP request/response of the same bytes (a 32-byte key out, the chunk
//   back), one round trip per chunk on both sides.
// - remote_delivery_*: the reference model's real KV (f16) retrieved by a
//   runtime whose only tier is the node, reached through a TCP proxy that
//   paces node-to-client bytes to 1 and 10 Gbit/s, kept as kdn:balanced and
//   raw; beside them the link's own rate (a raw stream through the same
//   proxy) and the codec's decode rate alone.
// - remote_ttft_ms_{raw,kdn,recompute}: time to first token of the model's
//   longest request with its KV delivered over the 1 Gbit/s link (raw,
//   kdn:balanced), against recomputing it.
// The delivery and TTFT records need the reference model (skipped, with a
// warning, without it). Returns an exit code.
int RunRemoteBench(const RemoteBenchOptions& options);

}  // namespace kdn::bench
