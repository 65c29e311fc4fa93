# SPDX-License-Identifier: Apache-2.0
"""kdn from Python: keep the KV cache of a prompt, find it again, read it back,
check every byte, keep it as a knowledge item, print the runtime's statistics.

The KV is real: the reference model's (stories260K: 5 layers, 4 KV heads of
8 dims, float32) for a prompt, as `kdn generate --dump-kv PREFIX` wrote it:
PREFIX.k.f32 and .v.f32 ([layer][position][head][dim]) and .tokens.i32.
Run: PYTHONPATH=<build>/bindings/python/pkg /usr/bin/python3 example.py PREFIX
(the Python kdn was built for, CMake's Python3_EXECUTABLE; kdn itself does
not need numpy, this example does), or with kdn's wheel installed in a venv.
"""
import sys

import numpy as np

import kdn

LAYERS, HEADS, HEAD_DIM, POSITIONS = 5, 4, 8, 48
TOKEN = HEADS * HEAD_DIM              # one token's K (or V) in one layer, in elements
FILE = LAYERS * POSITIONS * TOKEN     # one of the two files
NS = "example"


def check(ok, what):
    if not ok:
        sys.exit(f"check failed: {what}")


def main(prefix):
    # The engine's KV, K file then V file, read into one array (no copy after).
    engine = np.empty(2 * FILE, np.float32)
    for i, part in enumerate(("k", "v")):
        with open(f"{prefix}.{part}.f32", "rb") as f:
            if f.readinto(engine[i * FILE:(i + 1) * FILE]) != FILE * 4:
                sys.exit(f"{prefix}.{part}.f32: not {POSITIONS} positions of the reference model's KV")
    prompt = np.fromfile(f"{prefix}.tokens.i32", np.int32)
    check(len(prompt) == POSITIONS, f"{prefix}.tokens.i32 holds {POSITIONS} ids")
    print(f"kdn {kdn.version()}")

    with kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(16 << 20)]) as rt, \
            rt.model(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=HEAD_DIM, dtype=kdn.DType.F32,
                     fingerprint="stories260K") as model:
        # Store: the KV where the engine keeps it, described by strides (elements).
        where = kdn.KvView(stride_layer=POSITIONS * TOKEN, stride_kv=FILE, stride_token=TOKEN,
                           stride_head=HEAD_DIM, stride_dim=1)
        stored = model.store(NS, prompt, engine, where)
        print(f"stored: {stored.tokens} tokens cached (3 chunks of 16)")

        found = model.lookup_batch(NS, [prompt, prompt[:40]])
        for n, r in zip((POSITIONS, 40), found):
            print(f"lookup of {n} tokens: {r.cached_tokens} cached")
        check([r.cached_tokens for r in found] == [48, 32], "48 and 32 tokens cached")

        # Retrieve into the canonical layout [layer][k|v][position][head][dim].
        canonical = np.zeros((LAYERS, 2, POSITIONS, HEADS, HEAD_DIM), np.float32)
        got = model.retrieve(NS, prompt, canonical)
        check(got.tokens == POSITIONS, "the whole prompt retrieved")
        as_files = engine.reshape(2, LAYERS, POSITIONS, HEADS, HEAD_DIM).transpose(1, 0, 2, 3, 4)
        check(np.array_equal(canonical.view(np.uint32), as_files.view(np.uint32)), "retrieved KV equals the files")
        print(f"retrieved KV: all {canonical.nbytes} bytes equal to the stored KV")

        # The prompt as a knowledge item: put under a name, listed, fetched back.
        model.knowledge_put(NS, "story", prompt, engine, where, version=1, metadata="{}")
        for doc in model.knowledge_list(NS):
            print(f"knowledge: {doc.doc_id}, version {doc.version}, {doc.num_tokens} tokens, "
                  f"{doc.chunks_present} of {doc.chunks} chunks held")
        fetched = np.zeros_like(canonical)
        doc = model.knowledge_fetch(NS, "story", fetched, kdn.KvView(num_tokens=POSITIONS))
        check(doc.tokens.tolist() == prompt.tolist() and np.array_equal(fetched, canonical), "the fetched document")
        print("knowledge fetch: tokens and KV equal to what was put")

        s = rt.stats()
        print(f"stats: {s.lookups} lookups, {s.stores} stores, {s.retrieves} retrieves, {s.hits} chunk hits, "
              f"{s.misses} misses")
        print(f"       {s.tokens_stored} tokens stored, {s.tokens_served} served; {s.chunks} chunks held, "
              f"{s.used_bytes / 2**20:.2f} of {s.capacity_bytes / 2**20:.2f} MiB")
        loads = rt.latency(kdn.LatencyKind.LOAD)
        print(f"       loads: {loads.count}, p50 {loads.p50_us:.1f} us, max {loads.max_us:.1f} us")
        for i, t in enumerate(rt.tier_stats()):
            print(f"tier {i}: {t.name} (codec {t.codec}): {t.objects} objects, {t.hits} hits, "
                  f"{t.used_bytes / 2**20:.2f} of {t.capacity_bytes / 2**20:.2f} MiB")
    print("ok")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: example.py PREFIX  (what kdn generate --dump-kv PREFIX wrote)")
    main(sys.argv[1])
