# SPDX-License-Identifier: Apache-2.0
"""kdn's Python binding bench, run by `kdn bench bindings` beside the same
calls from C (bench/bindings_bench.cc): a 32 MiB retrieve into a numpy
array, and the per-call time of a 256-token lookup.

Fixed parameters, the same in every language: chunk_tokens 256, one 256 MiB
host tier; 32 layers x 8 KV heads x 128 dims, BF16 (numpy uint16), the
fingerprint "bench-8b"; tokens i % 32000 for i < 256 (one 32 MiB chunk).
Prints one line of JSON: {"retrieve_gbps": x, "lookup_us": y}.
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import kdn

CHUNK_BYTES = 33554432
LOOKUPS_PER_BATCH = 20000
BATCHES = 5


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed retrieves (the median is reported)")
    args = parser.parse_args()
    with kdn.Runtime(chunk_tokens=256, tiers=[kdn.Tier.host(256 << 20)]) as rt, \
            rt.model(num_layers=32, num_kv_heads=8, head_dim=128, dtype=kdn.DType.BF16, fingerprint="bench-8b") as m:
        # Built once and reused, as an engine would: no per-call conversions.
        request = kdn.Request(np.arange(256, dtype=np.int32) % 32000)
        view = kdn.KvView()  # canonical: data, strides 0, the buffer's size
        src = (np.arange(CHUNK_BYTES // 2, dtype=np.uint32) * 2654435761 >> 16).astype(np.uint16)
        if m.store("bench", request, src, view).tokens != 256:
            sys.exit("bench: the store did not keep the chunk")
        dst = np.empty(CHUNK_BYTES // 2, dtype=np.uint16)
        if m.retrieve("bench", request, dst, view).tokens != 256 or not np.array_equal(src, dst):  # warm-up
            sys.exit("bench: the retrieve returned wrong bytes")
        times = []
        for _ in range(max(1, args.repeats)):
            start = time.perf_counter()
            m.retrieve("bench", request, dst, view)
            times.append(time.perf_counter() - start)
        retrieve_gbps = CHUNK_BYTES / statistics.median(times) / 1e9

        lookup = m.lookup
        if lookup("bench", request).cached_tokens != 256:
            sys.exit("bench: the lookup missed")
        batches = []
        for _ in range(BATCHES):
            start = time.perf_counter()
            for _ in range(LOOKUPS_PER_BATCH):
                lookup("bench", request)
            batches.append((time.perf_counter() - start) / LOOKUPS_PER_BATCH * 1e6)
        lookup_us = statistics.median(batches)
    print(json.dumps({"retrieve_gbps": round(retrieve_gbps, 3), "lookup_us": round(lookup_us, 3)}))


if __name__ == "__main__":
    main()
