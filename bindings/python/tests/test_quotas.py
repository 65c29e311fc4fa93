# SPDX-License-Identifier: Apache-2.0
"""Namespace quotas per tier (C ABI 1.13), through the package: Tier(quotas=)
and Runtime.quota_stats. A namespace over its quota in a tier evicts only its
own coldest chunks; the others keep theirs."""
import hashlib
import struct
import unittest

import kdn
from _common import CHUNK, LAYERS, ROW, canonical_kv, model, runtime, tokens

PAGE = 4096
# A memory tier holds each chunk in whole 4 KiB pages.
CHUNK_HELD = -(-(CHUNK * LAYERS * 2 * ROW * 4) // PAGE) * PAGE


def ns_hash(ns):
    """kdn's hash of a namespace (core/keys/hash.cc NamespaceHash): SHA-256
    of "kdn-namespace-v1" and the namespace, each after its length (u64 LE)."""
    parts = (b"kdn-namespace-v1", ns)
    return hashlib.sha256(b"".join(struct.pack("<Q", len(p)) + p for p in parts)).digest()


def prompt(i):
    """The i-th one-chunk prompt: distinct from every other from its first chunk on."""
    return tokens(CHUNK, start=1000 * (i + 1))


def quota_runtime(quotas, kind=kdn.TierKind.HOST, **kwargs):
    """One tier with room for 20 chunks, no watermark (evictions happen at
    capacity only), and these quotas."""
    tier = kdn.Tier(kind, 20 * CHUNK_HELD, high_watermark=1.0, low_watermark=1.0, quotas=quotas, **kwargs)
    return runtime(tiers=[tier])


class QuotaTest(unittest.TestCase):
    def test_a_tenant_over_its_quota_evicts_only_its_own(self):
        with quota_runtime({"tenant-a": 4 * CHUNK_HELD}) as rt, model(rt) as m:
            self.assertEqual(rt.quota_stats(0), [kdn.QuotaStats("tenant-a", ns_hash(b"tenant-a"),
                                                                4 * CHUNK_HELD, 0, 0, 0, 0, 0)])
            for i in range(10):
                self.assertEqual(m.store("tenant-a", prompt(i), canonical_kv(CHUNK, i)).tokens, CHUNK)
                self.assertEqual(m.store("tenant-b", prompt(i), canonical_kv(CHUNK, i)).tokens, CHUNK)
            found_a = [i for i in range(10) if m.lookup("tenant-a", prompt(i)).cached_tokens == CHUNK]
            found_b = [i for i in range(10) if m.lookup("tenant-b", prompt(i)).cached_tokens == CHUNK]
            self.assertEqual(found_a, [6, 7, 8, 9])  # a's four newest
            self.assertEqual(found_b, list(range(10)))  # none of b's went
            (q,) = rt.quota_stats(0)
            self.assertIsInstance(q, kdn.QuotaStats)
            self.assertEqual(q.ns, "tenant-a")
            self.assertEqual(q.ns_hash, ns_hash(b"tenant-a"))
            self.assertEqual((q.quota_bytes, q.used_bytes), (4 * CHUNK_HELD, 4 * CHUNK_HELD))
            self.assertEqual((q.objects, q.quota_evictions, q.room_evictions, q.refused), (4, 6, 0, 0))
            t = rt.tier_stats(0)
            self.assertEqual((t.objects, t.evictions, t.used_bytes), (14, 6, 14 * CHUNK_HELD))
            with self.assertRaises(kdn.InvalidArgumentError):
                rt.quota_stats(1)  # no such tier
            with self.assertRaises(kdn.InvalidArgumentError):
                rt.quota_stats(-1)

    def test_quotas_as_pairs_keep_their_order(self):
        quotas = [(b"tenant-z", 2 * CHUNK_HELD), ("tenant-y", CHUNK_HELD // 2)]
        with quota_runtime(quotas) as rt, model(rt) as m:
            m.store("tenant-y", prompt(0), canonical_kv(CHUNK))  # larger than its quota: refused here
            self.assertEqual(m.lookup("tenant-y", prompt(0)).cached_tokens, 0)
            z, y = rt.quota_stats()
            self.assertEqual((z.ns, z.ns_hash, z.quota_bytes), (b"tenant-z", ns_hash(b"tenant-z"),
                                                                2 * CHUNK_HELD))
            self.assertEqual((y.ns, y.quota_bytes, y.objects, y.refused), ("tenant-y", CHUNK_HELD // 2, 0, 1))
        with runtime() as rt:
            self.assertEqual(rt.quota_stats(0), [])  # no quotas: none

    def test_bad_quotas_are_refused(self):
        # One quota per namespace: a str and its UTF-8 bytes are the same one.
        for quotas in ([("tenant-a", 1 << 20), ("tenant-a", 2 << 20)], {"tenant-a": 1 << 20, b"tenant-a": 2 << 20}):
            with self.assertRaises(kdn.InvalidArgumentError) as cm:
                quota_runtime(quotas)
            self.assertIn("two quotas", str(cm.exception))
        for quotas in ("tenant-a", [("tenant-a",)], [(7, 1 << 20)], {"tenant-a": -1}, {"tenant-a": "1M"},
                       {"tenant-a": True}, {"": 1 << 20}, 5):
            with self.assertRaises(kdn.InvalidArgumentError, msg=repr(quotas)):
                quota_runtime(quotas)
        with self.assertRaises(kdn.InvalidArgumentError) as cm:  # a kdnd has its own quotas
            runtime(tiers=[kdn.Tier.remote("127.0.0.1:1", token="t", quotas={"tenant-a": 1 << 20})])
        self.assertIn("kdnd", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
