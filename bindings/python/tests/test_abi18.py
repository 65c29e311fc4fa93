# SPDX-License-Identifier: Apache-2.0
"""What C ABI 1.5 to 1.8 added, through the package: the device modes, the
cost-aware eviction policy, quality levels and TTFT targets, chunks left to
recompute when their tier is slower than prefill (and the counters that
measure it), and the deployment secret that seals disk and redis tiers."""
import os
import tempfile
import unittest

import numpy as np

import kdn
from _common import CHUNK, NS, canonical_kv, model, runtime, tokens

POSITIONS = 3 * CHUNK


class DeviceModeTest(unittest.TestCase):
    def test_modes(self):
        with runtime(device=kdn.DeviceMode.EMULATED, tiers=[kdn.Tier.device(4 << 20)]) as rt, model(rt) as m:
            self.assertIs(rt.device, kdn.DeviceMode.EMULATED)
            self.assertEqual(rt.tier_stats(0).kind, kdn.TierKind.DEVICE)
            kv = canonical_kv(POSITIONS)
            self.assertEqual(m.store(NS, tokens(POSITIONS), kv).tokens, POSITIONS)
            out = np.zeros_like(kv)
            self.assertEqual(m.retrieve(NS, tokens(POSITIONS), out).tokens, POSITIONS)
            np.testing.assert_array_equal(out, kv)
        try:  # a GPU machine makes it; this one (none) refuses it
            kdn.Runtime(device=kdn.DeviceMode.CUDA).close()
        except kdn.UnsupportedError as e:
            self.assertIn("CUDA", str(e))
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            kdn.Runtime(device_ordinal=-1)
        self.assertIn("device_ordinal", str(cm.exception))
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(device=9)  # not a mode: kdn refuses it
        self.assertEqual(kdn.DeviceMode(9).name, "UNKNOWN_9")


class EvictionCostTest(unittest.TestCase):
    def test_cost_aware_policy_evicts(self):
        # 8 pages of 4 KiB (a chunk of this model is 2 KiB, held in a page):
        # 8 requests of 2 chunks do not fit.
        tier = kdn.Tier.host(32 << 10, policy=kdn.EvictionPolicy.COST)
        with runtime(tiers=[tier]) as rt, model(rt) as m:
            m.report_prefill(100, 100_000)  # what the policy prices chunks by
            for i in range(8):
                m.store(NS, tokens(2 * CHUNK, start=1000 * i), canonical_kv(2 * CHUNK, seed=i))
            t = rt.tier_stats(0)
            self.assertGreater(t.evictions, 0)
            self.assertLessEqual(t.used_bytes, t.capacity_bytes)
            self.assertEqual(rt.stats().evictions, t.evictions)
            self.assertEqual(m.lookup(NS, tokens(2 * CHUNK, start=7000)).cached_tokens, 2 * CHUNK)
            self.assertEqual(m.lookup(NS, tokens(2 * CHUNK, start=0)).cached_tokens, 0)


class LevelsTest(unittest.TestCase):
    """Quality levels (1.6): remote and redis tiers only, without a codec,
    none empty, each a codec. No node needs to answer to make the runtime."""

    def remote(self, **kwargs):
        return kdn.Tier.remote("127.0.0.1:1", token="t", timeout_ms=100, **kwargs)

    def test_levels(self):
        for tier, text in ((kdn.Tier.host(1 << 20, levels="zstd;kdn:balanced"), "levels"),
                           (self.remote(levels="zstd;kdn:balanced", codec="zstd"), "codec"),
                           (self.remote(levels="zstd;;kdn:balanced"), "level"),
                           (self.remote(levels=["zstd", "no-such-codec"]), "no-such-codec")):
            with self.assertRaises(kdn.InvalidArgumentError, msg=tier) as cm:
                kdn.Runtime(tiers=[tier])
            self.assertIn(text, str(cm.exception))
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[self.remote(levels=["zstd;kdn:hifi"])])  # one spec per list item
        for levels in ("zstd; kdn:hifi ;kdn:balanced", ["zstd", "kdn:hifi", "kdn:balanced"],
                       (b"zstd", b"kdn:balanced")):
            with kdn.Runtime(chunk_tokens=CHUNK, tiers=[kdn.Tier.host(1 << 20), self.remote(levels=levels)]) as rt:
                self.assertEqual([t.kind for t in rt.tier_stats()], [kdn.TierKind.HOST, kdn.TierKind.REMOTE])


class TtftTargetTest(unittest.TestCase):
    def test_targets(self):
        with runtime() as rt, model(rt) as m:
            kv = canonical_kv(POSITIONS)
            m.store(NS, tokens(POSITIONS), kv)
            req = kdn.Request(tokens(POSITIONS), ttft_target_us=20_000)
            self.assertEqual(req.ttft_target_us, 20_000)
            self.assertEqual(kdn.Request(tokens(4)).ttft_target_us, 0)
            # No tier with levels: the target changes nothing.
            for r, kwargs in ((req, {}), (tokens(POSITIONS), dict(ttft_target_us=5)), (req, dict(ttft_target_us=0))):
                out = np.zeros_like(kv)
                self.assertEqual(m.retrieve(NS, r, out, **kwargs).tokens, POSITIONS)
                np.testing.assert_array_equal(out, kv)
            self.assertEqual(req.ttft_target_us, 20_000)  # the keyword made a copy
            # Over an hour is a unit mistake; negative is no time at all.
            hour = 3601 * 10 ** 6
            with self.assertRaises(kdn.InvalidArgumentError) as cm:
                m.retrieve(NS, kdn.Request(tokens(POSITIONS), ttft_target_us=hour), np.zeros_like(kv))
            self.assertIn("ttft_target_us", str(cm.exception))
            with self.assertRaises(kdn.InvalidArgumentError):
                m.load_async(NS, req, np.zeros_like(kv), ttft_target_us=hour)
            with self.assertRaises(kdn.InvalidArgumentError):
                kdn.Request(tokens(4), ttft_target_us=-1)
            with self.assertRaises(kdn.InvalidArgumentError):
                m.retrieve(NS, req, np.zeros_like(kv), ttft_target_us="soon")
            hashes = kdn.Request.from_block_hashes(bytes(64), 16, 4, ttft_target_us=7)
            self.assertEqual((hashes.ttft_target_us, len(hashes)), (7, 4))


class SlowerThanPrefillTest(unittest.TestCase):
    """A load measures its tier's delivery; once the engine reports a
    prefill 100x faster, a load leaves the tier's chunks to recompute (none
    written, counted), unless load_slower_than_prefill is set."""

    def test_recompute(self):
        kv = canonical_kv(POSITIONS)
        ids = tokens(POSITIONS)
        with tempfile.TemporaryDirectory() as d:
            disk = kdn.Tier.disk(d, 64 << 20, codec="zstd")
            with runtime(tiers=[disk]) as rt, model(rt) as m:
                self.assertEqual(m.store(NS, ids, kv).tokens, POSITIONS)
                out = np.zeros_like(kv)
                self.assertEqual(m.retrieve(NS, ids, out).tokens, POSITIONS)  # no report yet: loaded, measured
                t = rt.tier_stats(0)
                self.assertGreater(t.delivery_ns_per_token, 0.0)
                self.assertEqual((t.device_delivery_ns_per_token, t.recompute_chunks), (0.0, 0))
                m.report_prefill(1_000_000, int((t.delivery_ns_per_token / 100 + 1) * 1e6))
                out = np.full_like(kv, -1.0)
                got = m.retrieve(NS, ids, out)
                self.assertEqual((got.tokens, got.covered), (0, POSITIONS))
                self.assertTrue((out == -1.0).all())
                self.assertEqual(rt.stats().recompute_tokens, POSITIONS)
                self.assertEqual(rt.tier_stats(0).recompute_chunks, POSITIONS // CHUNK)
                with m.load_async(NS, ids, out) as op:  # an op reports them as a failed range
                    self.assertTrue(op.wait(10))
                    self.assertEqual(op.result().tokens, 0)
                    self.assertEqual(op.failed_ranges(), [(0, POSITIONS)])
            with runtime(tiers=[disk], load_slower_than_prefill=True) as rt, model(rt) as m:
                m.report_prefill(1_000_000, 1_000_000)  # 1 ns per token
                for _ in range(2):
                    out = np.zeros_like(kv)
                    self.assertEqual(m.retrieve(NS, ids, out).tokens, POSITIONS)
                    np.testing.assert_array_equal(out, kv)
                self.assertEqual(rt.stats().recompute_tokens, 0)


class SecretFileTest(unittest.TestCase):
    """The deployment secret (1.8) seals a disk tier's chunks: a runtime
    with the secret reads them, one with another secret gets misses (counted
    as auth_failures); files open to others or too short are refused."""

    def test_secret(self):
        with tempfile.TemporaryDirectory() as d:
            def secret(name, data, mode=0o600):
                path = os.path.join(d, name)
                with open(path, "wb") as f:
                    f.write(data)
                os.chmod(path, mode)
                return path

            ours = secret("ours", b"secret-of-this-deployment-32-bytes-at-least")
            theirs = secret("theirs", b"secret-of-another-deployment-32-bytes-at-least")
            tiers = [kdn.Tier.disk(os.path.join(d, "kv"), 64 << 20)]
            for bad, text in ((secret("open", b"secret-of-this-deployment-32-bytes-at-least", 0o644), "chmod"),
                              (secret("short", b"too short"), ""), (os.path.join(d, "missing"), "")):
                with self.assertRaises(kdn.InvalidArgumentError) as cm:
                    runtime(tiers=tiers, secret_file=bad)
                self.assertIn(text, str(cm.exception))
            with self.assertRaises(kdn.InvalidArgumentError):
                runtime(tiers=tiers, secret_file="")
            kv = canonical_kv(POSITIONS)
            ids = tokens(POSITIONS)

            def read(secret_file):
                with runtime(tiers=tiers, secret_file=secret_file) as rt, model(rt) as m:
                    out = np.zeros_like(kv)
                    got = m.retrieve(NS, ids, out).tokens
                    return got, rt.tier_stats(0).auth_failures, out

            with runtime(tiers=tiers, secret_file=ours.encode()) as rt, model(rt) as m:  # bytes paths too
                self.assertEqual(m.store(NS, ids, kv).tokens, POSITIONS)
            got, failures, out = read(ours)
            self.assertEqual((got, failures), (POSITIONS, 0))
            np.testing.assert_array_equal(out, kv)
            got, failures, _ = read(theirs)
            self.assertEqual(got, 0)
            self.assertGreaterEqual(failures, 1)


if __name__ == "__main__":
    unittest.main()
