// SPDX-License-Identifier: Apache-2.0
// `kdn bench redis`: the Redis tier (tiers/redis_tier.h) against redis-server
// processes it starts on loopback (a single node and a 3-master cluster) and
// stops, each measure beside raw hiredis doing the same work in the same run.
// Thread-safety: RunRedisBench is a plain function; it owns the servers it
// starts (they die with it, also on error or when it is killed).
#pragma once

#include "bench/remote_bench.h"

namespace kdn::bench {

// The same options as `kdn bench remote` (repeats 0: 5, or 2 with quick).
using RedisBenchOptions = RemoteBenchOptions;

// The measures (JSON records as DESIGN.md "Benchmarks" has them), each for a
// single node and for the cluster ({single,cluster}):
// - redis_put_gbps_{ref,32mib}_*: RedisTier::Put of N chunks (GB/s of
//   envelope bytes: the tier's codec is the chain's business, these are raw
//   chunks), against raw hiredis SET of the same envelope bytes under the
//   same keys, one SET per call as the tier's put is, sent to the key's slot
//   master (a map from one CLUSTER SLOTS reply).
// - redis_get_gbps_{ref,32mib}_*: RedisTier::Get of each chunk, against raw
//   hiredis GET of the same keys, one per call. (The ref chunks' runs are
//   short: three times the repeats.)
// - redis_lookup_us_512_*: KvStore::Lookup of a 512-chunk prefix through a
//   runtime whose only tier is the redis tier (one pipelined EXISTS per
//   node), against raw hiredis pipelined EXISTS of the same 512 keys.
// - redis_delivery_gbps_{balanced,raw}: the reference model's real KV (f16)
//   retrieved by such a runtime (single node) with codec kdn:balanced and
//   raw: uncompressed KV bytes per second, against raw hiredis pipelined GET
//   of the raw chunks (per window, as a retrieve reads them); the size ratio
//   in params. Needs the reference model (skipped, with a warning, without
//   it; the ref chunks are then a pattern).
// Returns an exit code: 0, 1 when a side returned wrong data, 2 when the
// servers or the runtime could not be set up.
int RunRedisBench(const RedisBenchOptions& options);

}  // namespace kdn::bench
