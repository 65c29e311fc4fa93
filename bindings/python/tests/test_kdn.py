# SPDX-License-Identifier: Apache-2.0
"""The binding's API: runtimes, models, store / retrieve / lookup, views,
async ops, knowledge items, statistics, enums and errors."""
import array
import builtins
import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import unittest

import numpy as np

import kdn
from _common import CHUNK, DIM, HEADS, LAYERS, NS, ROW, canonical_kv, model, runtime, tokens


class VersionTest(unittest.TestCase):
    def test_version(self):
        self.assertRegex(kdn.version(), r"^\d+\.\d+\.\d+$")
        major, minor, patch = map(int, kdn.version().split("."))
        self.assertEqual(kdn.version_number(), major * 10000 + minor * 100 + patch)
        self.assertGreaterEqual(kdn.version_number(), 10900)  # the C ABI level the package covers
        self.assertEqual(kdn.__version__, kdn.version())
        self.assertEqual(kdn.status_string(kdn.Status.NOT_FOUND), "KDN_ERR_NOT_FOUND")


class EnumTest(unittest.TestCase):
    def test_unknown_values_are_kept(self):
        for enum in (kdn.Status, kdn.DType, kdn.TierKind, kdn.EvictionPolicy, kdn.Layout, kdn.OpState,
                     kdn.LatencyKind, kdn.RopeStyle, kdn.DeviceMode, kdn.MemoryKind, kdn.RopeScaling,
                     kdn.SegmentKind, kdn.CacheKind):
            v = enum(1234)
            self.assertEqual(v, 1234)
            self.assertEqual(v.name, "UNKNOWN_1234")
            self.assertIsInstance(v, enum)
        self.assertIs(kdn.DType(2), kdn.DType.BF16)
        self.assertEqual(kdn.DType.F32.itemsize, 4)
        with self.assertRaises(ValueError):
            kdn.DType("F32")


class ErrorTest(unittest.TestCase):
    def test_hierarchy(self):
        self.assertTrue(issubclass(kdn.InvalidArgumentError, (kdn.CallerError, ValueError)))
        self.assertTrue(issubclass(kdn.ClosedError, kdn.InvalidArgumentError))
        self.assertTrue(issubclass(kdn.BufferTooSmallError, kdn.CallerError))
        self.assertTrue(issubclass(kdn.NotFoundError, LookupError))
        self.assertTrue(issubclass(kdn.TimeoutError, (kdn.RetryableError, builtins.TimeoutError)))
        self.assertTrue(issubclass(kdn.UnavailableError, (kdn.RetryableError, ConnectionError)))
        self.assertTrue(issubclass(kdn.BusyError, kdn.RetryableError))
        self.assertTrue(issubclass(kdn.NoMemoryError, MemoryError))
        self.assertTrue(issubclass(kdn.UnsupportedError, NotImplementedError))
        for cls in (kdn.CorruptError, kdn.InternalError, kdn.CancelledError, kdn.VersionError):
            self.assertTrue(issubclass(cls, kdn.Error))

    def test_error_carries_status_and_message(self):
        with runtime() as rt, model(rt) as m:
            with self.assertRaises(kdn.NotFoundError) as cm:
                m.knowledge_info(NS, "absent")
        e = cm.exception
        self.assertEqual(e.status, kdn.Status.NOT_FOUND)
        self.assertIn("absent", e.message)
        self.assertEqual(str(e), e.message)
        t = kdn.TimeoutError("late")  # an OSError underneath: one argument, no errno
        self.assertEqual(str(t), "late")
        self.assertEqual(t.status, kdn.Status.TIMEOUT)


class RuntimeTest(unittest.TestCase):
    def test_context_managers_and_close(self):
        with runtime() as rt:
            self.assertFalse(rt.closed)
            with model(rt) as m:
                self.assertFalse(m.closed)
                self.assertEqual(m.kv_bytes_per_token, LAYERS * 2 * ROW * 4)
                self.assertEqual(m.kv_bytes_per_token, m.spec.kv_bytes_per_token)
                self.assertRegex(m.fingerprint, r"^[0-9a-f]{64}$")
                self.assertIs(m.runtime, rt)
            self.assertTrue(m.closed)
            m.close()  # idempotent
        self.assertTrue(rt.closed)
        rt.close()

    def test_model_outlives_its_runtime(self):
        rt = runtime()
        m = model(rt)
        rt.close()
        kv = canonical_kv(CHUNK)
        self.assertEqual(m.store(NS, tokens(CHUNK), kv).tokens, CHUNK)
        self.assertEqual(m.lookup(NS, tokens(CHUNK)).cached_tokens, CHUNK)
        m.close()

    def test_same_spec_shares_kv_another_fingerprint_does_not(self):
        with runtime() as rt, model(rt) as a, model(rt) as b, model(rt, fingerprint="other") as c:
            a.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
            self.assertEqual(a.fingerprint, b.fingerprint)
            self.assertEqual(b.lookup(NS, tokens(CHUNK)).cached_tokens, CHUNK)
            self.assertNotEqual(a.fingerprint, c.fingerprint)
            self.assertEqual(c.lookup(NS, tokens(CHUNK)).cached_tokens, 0)

    def test_model_spec_object(self):
        spec = kdn.ModelSpec(num_layers=3, num_kv_heads=1, head_dim=2, dtype=kdn.DType.F16, fingerprint=b"\x00bytes",
                             rope_style=kdn.RopeStyle.NEOX)
        with runtime() as rt, rt.model(spec) as m:
            self.assertEqual(m.kv_bytes_per_token, 3 * 2 * 1 * 2 * 2)
            self.assertIs(m.spec, spec)

    def test_latent_model(self):
        # A latent (MLA) model: one vector of latent_dim per token and layer,
        # its buffers [layer][token][latent]; stored and retrieved bit for bit,
        # apart from a K/V model of the same bytes; a bad spec refused.
        spec = kdn.ModelSpec(num_layers=3, num_kv_heads=0, head_dim=0, fingerprint="mla",
                             cache_kind=kdn.CacheKind.LATENT, latent_dim=8, latent_rope_dim=2)
        with runtime() as rt, rt.model(spec) as m, model(rt, fingerprint="mla") as kv:
            self.assertEqual(m.kv_bytes_per_token, 3 * 8 * 4)
            self.assertEqual(spec.kv_bytes_per_token, 3 * 8 * 4)
            data = np.arange(3 * CHUNK * 8, dtype=np.float32).reshape(3, CHUNK, 8)
            self.assertEqual(m.store(NS, tokens(CHUNK), data).tokens, CHUNK)
            out = np.zeros_like(data)
            self.assertEqual(m.retrieve(NS, tokens(CHUNK), out).tokens, CHUNK)
            self.assertTrue(np.array_equal(out, data))
            self.assertNotEqual(m.fingerprint, kv.fingerprint)
            self.assertEqual(kv.lookup(NS, tokens(CHUNK)).cached_tokens, 0)
            with self.assertRaises(kdn.InvalidArgumentError):  # one latent too few
                m.store(NS, tokens(CHUNK), np.zeros((3, CHUNK - 1, 8), np.float32))
        with runtime() as rt, self.assertRaises(kdn.InvalidArgumentError):
            rt.model(dataclasses.replace(spec, latent_dim=7))

    def test_latent_model_blends(self):
        # Blending a latent model (since 1.12): the callback's k holds each
        # position's whole latent, v is None; ratio 0 places the document's
        # content dims as stored (only its 2 RoPE dims move), ratio 1 is
        # what the callback wrote everywhere.
        spec = kdn.ModelSpec(num_layers=3, num_kv_heads=0, head_dim=0, fingerprint="mla-blend",
                             cache_kind=kdn.CacheKind.LATENT, latent_dim=8, latent_rope_dim=2)
        doc, fresh = tokens(CHUNK), [7, 8, 9]
        total = CHUNK + len(fresh)
        shapes = []

        def layer_fn(layer, positions, toks, hidden, k, v):
            shapes.append((np.asarray(k).shape, v))
            K = np.asarray(k)
            for p in np.asarray(positions):
                K[p] = layer * 1000 + p + np.arange(8, dtype=np.float32) * 0.5
            np.asarray(hidden)[:] = 1.0

        with runtime() as rt, rt.model(spec) as m:
            data = np.arange(3 * CHUNK * 8, dtype=np.float32).reshape(3, CHUNK, 8) / 7
            m.knowledge_put(NS, "doc", doc, data)
            want = np.stack([[layer * 1000 + p + np.arange(8) * 0.5 for p in range(total)] for layer in range(3)])
            out = np.zeros((3, total, 8), np.float32)
            report = m.blend(NS, ["doc", fresh], out, layer_fn=layer_fn, hidden_dim=4, ratio=1.0)
            self.assertEqual(report.positions, total)
            self.assertTrue(np.array_equal(out, want.astype(np.float32)))
            self.assertEqual(shapes[0], ((total, 8), None))
            out = np.zeros((3, total, 8), np.float32)
            m.blend(NS, ["doc", fresh], out, layer_fn=layer_fn, hidden_dim=4, ratio=0.0)
            self.assertTrue(np.array_equal(out[:, :CHUNK, :6], data[:, :, :6]))  # content dims as stored
            self.assertTrue(np.array_equal(out[:, CHUNK:], want[:, CHUNK:].astype(np.float32)))

    def test_sliding_window_model(self):
        # A sliding-window layer (since 1.12): loaded only where its last
        # tokens need it, the full layer whole; not the same model's identity
        # without the window; a bad state size refused.
        spec = kdn.ModelSpec(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, fingerprint="sliding",
                             layer_windows=(4, 0))
        with runtime() as rt, rt.model(spec) as m, model(rt, fingerprint="sliding") as plain:
            n = 3 * CHUNK
            data = canonical_kv(n, seed=1) + 1.0
            self.assertEqual(m.store(NS, tokens(n), data).tokens, n)
            self.assertEqual(m.lookup(NS, tokens(n)).cached_tokens, n)
            self.assertEqual(plain.lookup(NS, tokens(n)).cached_tokens, 0)
            out = np.zeros_like(data)
            self.assertEqual(m.retrieve(NS, tokens(n), out).tokens, n)
            # Layer 0 (window 4) gets its window, the last 4 tokens, only
            # (nothing older is read or written); layer 1 every token.
            self.assertTrue(np.array_equal(out[1], data[1]))
            self.assertTrue(np.array_equal(out[0][:, n - 4:], data[0][:, n - 4:]))
            self.assertFalse(out[0][:, :n - 4].any())
        with runtime() as rt, self.assertRaises(kdn.InvalidArgumentError):
            rt.model(dataclasses.replace(spec, num_state_layers=1, state_bytes=6))

    def test_tiers_disk_and_codec(self):
        with tempfile.TemporaryDirectory() as d:
            tiers = [kdn.Tier.host(CHUNK * LAYERS * 2 * ROW * 4, codec="zstd", policy=kdn.EvictionPolicy.S3FIFO),
                     kdn.Tier.disk(os.path.join(d, "kv"), 8 << 20)]
            with runtime(tiers=tiers, hash_seed=7, worker_threads=1) as rt, model(rt) as m:
                self.assertEqual(rt.tier_count, 2)
                ts = rt.tier_stats()
                self.assertEqual([t.kind for t in ts], [kdn.TierKind.HOST, kdn.TierKind.DISK])
                self.assertTrue(ts[0].codec.startswith("zstd"), ts[0].codec)
                self.assertEqual(ts[1].capacity_bytes, 8 << 20)
                self.assertEqual([(t.high_watermark, t.low_watermark) for t in ts], [(0.95, 0.85)] * 2)  # defaults
                for i in range(3):  # more than the host tier holds: some go to disk
                    m.store(NS, tokens(CHUNK, 100 * i), canonical_kv(CHUNK, i))
                for i in range(3):
                    out = np.zeros((LAYERS, 2, CHUNK, HEADS, DIM), np.float32)
                    self.assertEqual(m.retrieve(NS, tokens(CHUNK, 100 * i), out).tokens, CHUNK)
                    np.testing.assert_array_equal(out, canonical_kv(CHUNK, i))
                self.assertEqual(rt.stats().capacity_bytes, ts[0].capacity_bytes + (8 << 20))

    def test_unreachable_remote_tier_misses(self):
        tiers = [kdn.Tier.host(1 << 20), kdn.Tier.remote("127.0.0.1:1", token="secret", timeout_ms=200)]
        with runtime(tiers=tiers) as rt, model(rt) as m:
            self.assertEqual(m.store(NS, tokens(CHUNK), canonical_kv(CHUNK)).tokens, CHUNK)
            self.assertEqual(m.lookup(NS, tokens(CHUNK, 5)).cached_tokens, 0)  # a miss, not an error
            remote = rt.tier_stats(1)
            self.assertEqual((remote.kind, remote.name), (kdn.TierKind.REMOTE, "remote"))
            self.assertEqual(remote.remote_failed_calls, remote.remote_calls)
            self.assertEqual((remote.high_watermark, remote.low_watermark), (0.0, 0.0))  # a remote tier has none

    def test_stats_latency(self):
        with runtime() as rt, model(rt) as m:
            m.store(NS, tokens(2 * CHUNK), canonical_kv(2 * CHUNK))
            m.lookup(NS, tokens(2 * CHUNK))
            m.retrieve(NS, tokens(2 * CHUNK), np.zeros(2 * CHUNK * LAYERS * 2 * ROW, np.float32))
            s = rt.stats()
            self.assertEqual((s.stores, s.lookups, s.retrieves, s.hits, s.chunks), (1, 1, 1, 2, 2))
            self.assertEqual(s.tokens_stored, 2 * CHUNK)
            self.assertEqual(s.bytes_served, 2 * CHUNK * m.kv_bytes_per_token)
            lat = rt.latency(kdn.LatencyKind.LOAD)
            self.assertEqual(lat.count, 1)
            self.assertGreater(lat.max_us, 0)
            self.assertEqual(rt.latency(kdn.LatencyKind.STORE).count, 1)
            self.assertIsInstance(rt.tier_stats(0), kdn.TierStats)

    def test_reported_prefill_prices_loads(self):
        with runtime() as rt, model(rt) as m:
            m.store(NS, tokens(2 * CHUNK), canonical_kv(2 * CHUNK))
            n, t = 24, 1_000_003  # t / n is not a whole number of ns
            m.report_prefill(n, t)
            # A whole hit, then a request a chunk longer than what is cached.
            for length in (2 * CHUNK, 3 * CHUNK):
                out = np.zeros(length * LAYERS * 2 * ROW, np.float32)
                self.assertEqual(m.retrieve(NS, tokens(length), out).tokens, 2 * CHUNK)
            self.assertEqual(m.lookup(NS, tokens(3 * CHUNK)).cached_tokens, 2 * CHUNK)  # no load: counted apart
            s = rt.stats()
            self.assertEqual((s.lookup_tokens, s.lookup_hit_tokens), (3 * CHUNK, 2 * CHUNK))
            self.assertEqual((s.prefill_tokens, s.prefill_ns), (n, t))
            self.assertEqual((s.tokens_served, s.tokens_requested), (4 * CHUNK, 5 * CHUNK))
            self.assertGreaterEqual(s.tokens_requested, s.tokens_served)
            exact = s.tokens_served * t // n
            self.assertLessEqual(abs(s.ttft_saved_ns - exact), 2, (s.ttft_saved_ns, exact))  # two loads
            self.assertEqual(s.tokens_served_unpriced, 0)
            self.assertGreater(s.delivery_ns, 0)


class KvTest(unittest.TestCase):
    def setUp(self):
        self.rt = runtime()
        self.m = model(self.rt)
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)

    def test_store_retrieve_lookup_zero_copy(self):
        kv = canonical_kv(3 * CHUNK)
        r = self.m.store(NS, tokens(3 * CHUNK), kv)
        self.assertEqual((r.state, r.status, r.tokens, r.lossy), (kdn.OpState.DONE, kdn.Status.OK, 3 * CHUNK, False))
        self.assertEqual(self.m.lookup(NS, tokens(3 * CHUNK)).cached_tokens, 3 * CHUNK)
        self.assertEqual(self.m.lookup(NS, list(range(40))).cached_tokens, 2 * CHUNK)
        out = np.zeros_like(kv)
        address = out.__array_interface__["data"][0]
        got = self.m.retrieve(NS, tokens(3 * CHUNK), out)
        self.assertEqual((got.tokens, got.covered), (3 * CHUNK, 3 * CHUNK))
        self.assertEqual(out.__array_interface__["data"][0], address)
        np.testing.assert_array_equal(out, kv)  # written in place: no copy back

    def test_buffer_kinds(self):
        kv = canonical_kv(CHUNK)
        raw = kv.tobytes()
        self.m.store(NS, list(range(CHUNK)), raw)  # bytes: fine for a store (read only)
        for out in (bytearray(len(raw)), memoryview(bytearray(len(raw))), np.zeros(len(raw), np.uint8),
                    np.zeros(kv.shape, np.float32), array.array("f", bytes(len(raw)))):
            self.assertEqual(self.m.retrieve(NS, array.array("i", range(CHUNK)), out).tokens, CHUNK)
            self.assertEqual(bytes(memoryview(out).cast("B")), raw)

    def test_miss_is_not_an_error(self):
        out = bytearray(CHUNK * self.m.kv_bytes_per_token)
        got = self.m.retrieve(NS, tokens(CHUNK, 500), out)
        self.assertEqual((got.tokens, got.status), (0, kdn.Status.OK))
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK, 500)), kdn.LookupResult(kdn.Status.OK, 0, (0,)))
        self.assertEqual(self.m.lookup("other namespace", tokens(CHUNK)).cached_tokens, 0)

    def test_request_reuse_and_namespaces(self):
        req = kdn.Request(tokens(2 * CHUNK))
        self.assertEqual(len(req), 2 * CHUNK)
        self.m.store(b"bytes-ns", req, canonical_kv(2 * CHUNK))
        self.assertEqual(self.m.lookup(b"bytes-ns", req).cached_tokens, 2 * CHUNK)
        self.assertEqual(self.m.lookup("bytes-ns", req).cached_tokens, 2 * CHUNK)  # the same UTF-8 bytes
        half = kdn.Request(np.arange(CHUNK, dtype=np.int64))  # copied from int64, the same ids
        self.assertEqual(self.m.lookup("bytes-ns", half).cached_tokens, CHUNK)

    def test_request_is_immutable(self):
        # Calls read a Request without the GIL, from many threads at once:
        # nothing may change its tokens under them. It has no mutator, and
        # the ids it was made from are copied in.
        public = sorted(name for name in dir(kdn.Request) if not name.startswith("_"))
        self.assertEqual(public, ["from_block_hashes", "salt", "ttft_target_us", "uses_hashes"])
        with self.assertRaises(AttributeError):
            kdn.Request(tokens(4)).ttft_target_us = 5  # a read-only property
        with self.assertRaises(AttributeError):
            kdn.Request(tokens(4)).salt = b"other"
        ids = tokens(2 * CHUNK)
        req = kdn.Request(ids)
        ids[:] = 7  # the caller reuses its array
        self.m.store(NS, req, canonical_kv(2 * CHUNK))
        self.assertEqual(self.m.lookup(NS, tokens(2 * CHUNK)).cached_tokens, 2 * CHUNK)
        with self.assertRaises(AttributeError):
            req.tokens = ids

    def test_block_hashes(self):
        hashes = bytes(range(32)) * 2  # 4 blocks of 16-byte hashes, 4 tokens each: one chunk of 16
        req = kdn.Request.from_block_hashes(hashes, 16, 4)
        self.assertTrue(req.uses_hashes)
        self.assertEqual(len(req), 4)
        kv = canonical_kv(CHUNK)
        self.assertEqual(self.m.store(NS, req, kv).tokens, CHUNK)
        self.assertEqual(self.m.lookup(NS, req).cached_tokens, CHUNK)
        out = np.zeros_like(kv)
        self.assertEqual(self.m.retrieve(NS, req, out).tokens, CHUNK)
        np.testing.assert_array_equal(out, kv)
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Request.from_block_hashes(b"123", 2, 4)

    def test_lookup_batch(self):
        self.m.store(NS, tokens(2 * CHUNK), canonical_kv(2 * CHUNK))
        got = self.m.lookup_batch(NS, [tokens(2 * CHUNK), kdn.Request(tokens(CHUNK)), [7] * 3, tokens(CHUNK, 1)])
        self.assertEqual([r.cached_tokens for r in got], [2 * CHUNK, CHUNK, 0, 0])
        self.assertTrue(all(r.status == kdn.Status.OK for r in got))

    def test_strided_view(self):
        # The engine's layout: K of every layer, then V of every layer, each
        # [layer][token][head][dim] (as kdn generate --dump-kv writes them).
        n = 2 * CHUNK
        canon = canonical_kv(n)
        engine = np.ascontiguousarray(canon.transpose(1, 0, 2, 3, 4))  # [k|v][layer][token][head][dim]
        view = kdn.KvView(stride_layer=n * ROW, stride_kv=LAYERS * n * ROW, stride_token=ROW, stride_head=DIM,
                          stride_dim=1)
        self.assertIn("stride_layer", repr(view))
        self.assertEqual(self.m.store(NS, tokens(n), engine, view).tokens, n)
        out = np.zeros_like(canon)
        self.m.retrieve(NS, tokens(n), out)
        np.testing.assert_array_equal(out, canon)
        back = np.zeros_like(engine)
        self.m.retrieve(NS, tokens(n), back, view)
        np.testing.assert_array_equal(back, engine)

    def test_layer_offsets_and_layer_order(self):
        n = CHUNK
        canon = canonical_kv(n)
        self.m.store(NS, tokens(n), canon)
        # The view's layers in reverse model order, each K and V at an offset
        # of its own in one buffer, with a gap kdn must not touch.
        per = n * ROW
        buf = np.full(5 * per, -1, np.float32)
        view = kdn.KvView(layers=[1, 0], layer_offsets=[(4 * per, 0), (per, 3 * per)], layer_elements=per,
                          stride_token=ROW, stride_head=DIM, stride_dim=1)
        self.assertEqual(self.m.retrieve(NS, tokens(n), buf, view).tokens, n)
        parts = buf.reshape(5, n, HEADS, DIM)
        np.testing.assert_array_equal(parts[4], canon[1, 0])
        np.testing.assert_array_equal(parts[0], canon[1, 1])
        np.testing.assert_array_equal(parts[1], canon[0, 0])
        np.testing.assert_array_equal(parts[3], canon[0, 1])
        self.assertTrue((parts[2] == -1).all())

    def test_paged_views(self):
        n, block = 2 * CHUNK, 8
        canon = canonical_kv(n)
        self.m.store(NS, tokens(n), canon)
        table = [5, 0, 3, 1]
        blocks = 6
        for layout in (kdn.Layout.PAGED_NHD, kdn.Layout.PAGED_HND):
            per_cache = blocks * block * ROW
            buf = np.zeros(LAYERS * 2 * per_cache, np.float32)
            offsets = [(2 * l * per_cache, (2 * l + 1) * per_cache) for l in range(LAYERS)]
            view = kdn.KvView.paged(layout, block, table, offsets, blocks)
            self.assertEqual(self.m.retrieve(NS, tokens(n), buf, view).tokens, n)
            caches = buf.reshape(LAYERS, 2, blocks, block, HEADS, DIM) if layout == kdn.Layout.PAGED_NHD else \
                buf.reshape(LAYERS, 2, blocks, HEADS, block, DIM).transpose(0, 1, 2, 4, 3, 5)
            for t in range(n):
                np.testing.assert_array_equal(caches[:, :, table[t // block], t % block], canon[:, :, t])
            # And back: a store from the paged cache under other tokens.
            self.assertEqual(self.m.store(NS, tokens(n, 1000 + layout), buf, view).tokens, n)
            out = np.zeros_like(canon)
            self.m.retrieve(NS, tokens(n, 1000 + layout), out)
            np.testing.assert_array_equal(out, canon)

    def test_bf16_as_uint16(self):
        with model(self.rt, kdn.DType.BF16, "bf16") as m:
            kv = np.arange(CHUNK * m.kv_bytes_per_token // 2, dtype=np.uint16)
            m.store(NS, tokens(CHUNK), kv)
            out = np.zeros_like(kv)
            self.assertEqual(m.retrieve(NS, tokens(CHUNK), out).tokens, CHUNK)
            np.testing.assert_array_equal(out, kv)


class SaltTest(unittest.TestCase):
    """C ABI 1.13: a salt enters every chunk key of a request (vLLM's
    cache_salt): only the same salt finds salted KV, and unsalted KV never
    answers a salted request."""

    def setUp(self):
        self.rt = runtime()
        self.m = model(self.rt)
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)

    def test_request_salt(self):
        self.assertIsNone(kdn.Request(tokens(4)).salt)
        self.assertIsNone(kdn.Request(tokens(4), salt=b"").salt)  # empty: none
        self.assertEqual(kdn.Request(tokens(4), salt="usér").salt, "usér".encode("utf-8"))
        for salt in (bytearray(b"ab"), memoryview(b"ab"), np.frombuffer(b"ab", np.uint8)):
            self.assertEqual(kdn.Request(tokens(4), salt=salt).salt, b"ab")  # any bytes-like, copied
        self.assertNotIn("secret", repr(kdn.Request(tokens(4), salt="secret")))
        self.assertIn("salted", repr(kdn.Request(tokens(4), salt="secret")))
        for bad in (5, ["a"], "\ud800"):  # not bytes-like; a str that is not UTF-8
            with self.assertRaises(kdn.InvalidArgumentError):
                kdn.Request(tokens(4), salt=bad)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.lookup(NS, tokens(4), salt=5)

    def test_salted_store_is_found_by_its_salt_only(self):
        n = 2 * CHUNK
        kv = canonical_kv(n)
        alice = kdn.Request(tokens(n), salt=b"alice")
        self.assertEqual(self.m.store(NS, alice, kv).tokens, n)
        self.assertEqual(self.m.lookup(NS, tokens(n)).cached_tokens, 0)  # unsalted: no hit
        self.assertEqual(self.m.lookup(NS, alice).cached_tokens, n)
        self.assertEqual(self.m.lookup(NS, tokens(n), salt="alice").cached_tokens, n)  # str: its UTF-8 bytes
        self.assertEqual(self.m.lookup(NS, tokens(n), salt=b"bob").cached_tokens, 0)
        self.assertEqual(self.m.lookup(NS, alice, salt=b"bob").cached_tokens, 0)  # the call's salt wins
        self.assertEqual(self.m.lookup(NS, alice, salt=b"").cached_tokens, 0)  # b"": none
        self.assertEqual(alice.salt, b"alice")  # the Request itself is unchanged
        got = self.m.lookup_batch(NS, [alice, tokens(n), kdn.Request(tokens(n), salt=b"bob"),
                                       kdn.Request.from_block_hashes(bytes(64), 16, 4, salt=b"alice")])
        self.assertEqual([r.cached_tokens for r in got], [n, 0, 0, 0])

        out = np.zeros_like(kv)
        got = self.m.retrieve(NS, tokens(n), out, salt=b"alice")
        self.assertEqual((got.tokens, got.covered), (n, n))
        self.assertEqual(out.tobytes(), kv.tobytes())  # bit for bit
        out[:] = 0
        self.assertEqual(self.m.retrieve(NS, alice, out, ttft_target_us=10**6).tokens, n)  # the copy keeps the salt
        self.assertEqual(out.tobytes(), kv.tobytes())
        out[:] = 0
        self.assertEqual(self.m.retrieve(NS, tokens(n), out, salt=b"bob").tokens, 0)
        self.assertEqual(self.m.retrieve(NS, tokens(n), out).tokens, 0)
        self.assertFalse(out.any())

    def test_unsalted_kv_does_not_answer_a_salted_request(self):
        self.m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK)).cached_tokens, CHUNK)
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK), salt=b"alice").cached_tokens, 0)
        out = bytearray(CHUNK * self.m.kv_bytes_per_token)
        self.assertEqual(self.m.retrieve(NS, kdn.Request(tokens(CHUNK), salt=b"alice"), out).tokens, 0)

    def test_block_hashes_with_a_salt(self):
        hashes = bytes(range(64))  # 4 blocks of 16-byte hashes, 4 tokens each: one chunk
        kv = canonical_kv(CHUNK)
        self.assertEqual(self.m.store(NS, kdn.Request.from_block_hashes(hashes, 16, 4, salt="s"), kv).tokens, CHUNK)
        self.assertEqual(self.m.lookup(NS, kdn.Request.from_block_hashes(hashes, 16, 4)).cached_tokens, 0)
        out = np.zeros_like(kv)
        self.assertEqual(self.m.retrieve(NS, kdn.Request.from_block_hashes(hashes, 16, 4), out, salt=b"s").tokens,
                         CHUNK)
        np.testing.assert_array_equal(out, kv)

    def test_async_save_and_load_with_a_salt(self):
        n = 2 * CHUNK
        kv = canonical_kv(n)
        salt = bytearray(b"tenant-7")
        with self.m.save_async(NS, tokens(n), kv, salt=salt) as op:
            salt[:] = b"changed!"  # copied in: the op does not read the caller's object
            for layer in range(LAYERS):
                op.layer_ready(layer)
            self.assertTrue(op.wait(timeout=10))
            self.assertEqual(op.result().tokens, n)
        self.assertEqual(self.m.lookup(NS, tokens(n)).cached_tokens, 0)
        self.assertEqual(self.m.lookup(NS, tokens(n), salt=b"tenant-7").cached_tokens, n)
        out = bytearray(kv.nbytes)
        req = kdn.Request(tokens(n), salt=b"tenant-7")
        with self.m.load_async(NS, req, out) as op:
            del req  # the op copied the request, salt included
            for layer in range(LAYERS):
                self.assertTrue(op.wait_layer(layer, timeout=10))
            self.assertTrue(op.wait())
            self.assertEqual(op.result().tokens, n)
        self.assertEqual(bytes(out), kv.tobytes())
        with self.m.load_async(NS, tokens(n), bytearray(kv.nbytes), salt=b"tenant-8") as op:
            self.assertTrue(op.wait(10))
            self.assertEqual(op.result().tokens, 0)

    def test_salt_over_4096_bytes_is_refused(self):
        kv = canonical_kv(CHUNK)
        out = bytearray(kv.nbytes)
        longest = bytes(4096)
        self.assertEqual(self.m.store(NS, tokens(CHUNK), kv, salt=longest).tokens, CHUNK)
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK), salt=longest).cached_tokens, CHUNK)
        too_long = bytes(4097)
        for call in (lambda: self.m.lookup(NS, tokens(CHUNK), salt=too_long),
                     lambda: self.m.lookup(NS, kdn.Request(tokens(CHUNK), salt=too_long))):
            with self.assertRaises(kdn.InvalidArgumentError):  # the request's status (a lookup is batched)
                call()
        for call in (lambda: self.m.store(NS, tokens(CHUNK), kv, salt=too_long),
                     lambda: self.m.retrieve(NS, tokens(CHUNK), out, salt="x" * 4097),
                     lambda: self.m.load_async(NS, tokens(CHUNK), out, salt=too_long),
                     lambda: self.m.save_async(NS, tokens(CHUNK), kv, salt=too_long)):
            with self.assertRaises(kdn.InvalidArgumentError) as cm:
                call()
            self.assertIn("salt", str(cm.exception))
        out.extend(b"x")  # a refused op left no buffer exported
        got = self.m.lookup_batch(NS, [kdn.Request(tokens(CHUNK), salt=too_long), kdn.Request(tokens(CHUNK))])
        self.assertEqual([r.status for r in got], [kdn.Status.INVALID_ARGUMENT, kdn.Status.OK])


class RecurrentTest(unittest.TestCase):
    """A model with recurrent layers (since 1.12): their states travel with
    each call (`states`), and a prefix counts only where the state at its
    end was stored."""

    STATE_BYTES = 12

    def setUp(self):
        self.rt = runtime()
        self.m = self.rt.model(kdn.ModelSpec(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM,
                                             fingerprint="recurrent", num_state_layers=2,
                                             state_bytes=self.STATE_BYTES))
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)
        self.kv = canonical_kv(3 * CHUNK, seed=2) + 1.0  # the KV of 48 tokens; a prefix's is its first tokens'

    def prefix_kv(self, n):
        return np.ascontiguousarray(self.kv[:, :, :n])

    @staticmethod
    def new_states():
        return [bytearray(RecurrentTest.STATE_BYTES) for _ in range(2)]

    def test_store_lookup_retrieve(self):
        # Two snapshots: at 16 (the rows of a 2-D float32 array) and at 32 (bytearrays).
        states16 = np.arange(6, dtype=np.float32).reshape(2, 3) + 100.0
        states32 = [bytearray(range(1, 13)), bytearray(range(101, 113))]
        self.assertEqual(self.m.store(NS, tokens(CHUNK), self.prefix_kv(CHUNK), states=states16).tokens, CHUNK)
        self.assertEqual(self.m.store(NS, tokens(2 * CHUNK), self.prefix_kv(2 * CHUNK), states=states32).tokens,
                         2 * CHUNK)
        n = 2 * CHUNK + 8  # a request of 40 tokens sharing both
        self.assertEqual(self.m.lookup(NS, tokens(n)).cached_tokens, 2 * CHUNK)
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK + 8)).cached_tokens, CHUNK)

        out = np.full((LAYERS, 2, n, HEADS, DIM), np.nan, np.float32)
        got = self.new_states()
        r = self.m.retrieve(NS, tokens(n), out, states=got)
        self.assertEqual(r.tokens, 2 * CHUNK)
        np.testing.assert_array_equal(out[:, :, :2 * CHUNK], self.kv[:, :, :2 * CHUNK])  # bit for bit
        self.assertTrue(np.isnan(out[:, :, 2 * CHUNK:]).all())  # nothing past the prefix
        self.assertEqual(got, states32)

        # The shorter request gets the snapshot at 16, into numpy rows (a 2-D array).
        out = np.zeros((LAYERS, 2, CHUNK + 8, HEADS, DIM), np.float32)
        rows = np.zeros((2, 3), np.float32)
        self.assertEqual(self.m.retrieve(NS, tokens(CHUNK + 8), out, states=rows).tokens, CHUNK)
        np.testing.assert_array_equal(rows, states16)
        np.testing.assert_array_equal(out[:, :, :CHUNK], self.kv[:, :, :CHUNK])

        # A retrieve of a miss writes no state.
        miss = [bytearray(b"\xaa" * self.STATE_BYTES) for _ in range(2)]
        self.assertEqual(self.m.retrieve(NS, tokens(n, 9000), np.zeros((LAYERS, 2, n, HEADS, DIM), np.float32),
                                         states=miss).tokens, 0)
        self.assertEqual(miss, [bytearray(b"\xaa" * self.STATE_BYTES)] * 2)

    def test_kv_without_state_is_no_hit(self):
        n = 2 * CHUNK
        self.m.store(NS, tokens(n, 500), self.prefix_kv(n))  # no states: the KV alone
        self.assertEqual(self.m.lookup(NS, tokens(n, 500)).cached_tokens, 0)
        got = self.new_states()
        self.assertEqual(self.m.retrieve(NS, tokens(n, 500), np.zeros_like(self.prefix_kv(n)), states=got).tokens,
                         0)
        self.assertEqual(got, self.new_states())
        # Read-only states (bytes) are fine for a store, which only reads them.
        states = [bytes(range(12)), bytes(range(12, 24))]
        self.assertEqual(self.m.store(NS, tokens(n, 500), self.prefix_kv(n), states=states).tokens, n)
        self.assertEqual(self.m.lookup(NS, tokens(n, 500)).cached_tokens, n)
        self.m.retrieve(NS, tokens(n, 500), np.zeros_like(self.prefix_kv(n)), states=got)
        self.assertEqual([bytes(g) for g in got], states)

    def test_bad_states(self):
        n = CHUNK
        kv = self.prefix_kv(n)
        self.m.store(NS, tokens(n), kv, states=self.new_states())
        out = np.zeros_like(kv)
        # kdn's own refusal: a retrieve or load of a recurrent model needs the states.
        with self.assertRaisesRegex(kdn.InvalidArgumentError, "state"):
            self.m.retrieve(NS, tokens(n), out)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.load_async(NS, tokens(n), out)
        # A state shorter than state_bytes, for any call.
        short = [bytearray(8), bytearray(self.STATE_BYTES)]
        for call in (lambda: self.m.retrieve(NS, tokens(n), out, states=short),
                     lambda: self.m.store(NS, tokens(n), kv, states=short),
                     lambda: self.m.load_async(NS, tokens(n), out, states=short),
                     lambda: self.m.save_async(NS, tokens(n), kv, states=short)):
            with self.assertRaises(kdn.InvalidArgumentError) as e:
                call()
            self.assertIn("recurrent state 0 is 8 bytes, shorter than the model's state_bytes (12)", str(e.exception))
        self.assertFalse(out.any())  # nothing written
        # One state per recurrent layer.
        with self.assertRaisesRegex(kdn.InvalidArgumentError, "passes 1 recurrent states, but the model has 2"):
            self.m.retrieve(NS, tokens(n), out, states=[bytearray(self.STATE_BYTES)])
        # Writable for the calls that write; buffers; not a single buffer.
        with self.assertRaisesRegex(kdn.InvalidArgumentError, r"states\[1\] is read-only"):
            self.m.retrieve(NS, tokens(n), out, states=[bytearray(12), bytes(12)])
        with self.assertRaisesRegex(kdn.InvalidArgumentError, r"states\[0\] must be a buffer"):
            self.m.retrieve(NS, tokens(n), out, states=[12, 12])
        with self.assertRaisesRegex(kdn.InvalidArgumentError, "not a single buffer"):
            self.m.retrieve(NS, tokens(n), out, states=bytearray(24))
        # A model without recurrent layers takes none.
        with model(self.rt) as plain, self.assertRaisesRegex(kdn.InvalidArgumentError, "no recurrent layers"):
            plain.store(NS, tokens(n), kv, states=self.new_states())

    def test_kv_by_address(self):
        # KV that reaches kdn by address (a DLPack CPU tensor, as torch's): host memory, with the states.
        from _devarrays import DLPackOnly
        n = 2 * CHUNK
        states = [bytearray(b"\x33" * 12), bytearray(b"\x44" * 12)]
        self.assertEqual(self.m.store(NS, tokens(n, 300), DLPackOnly(self.prefix_kv(n)), states=states).tokens, n)
        self.assertEqual(self.m.lookup(NS, tokens(n, 300)).cached_tokens, n)
        out = DLPackOnly(np.zeros_like(self.prefix_kv(n)))
        got = self.new_states()
        self.assertEqual(self.m.retrieve(NS, tokens(n, 300), out, states=got).tokens, n)
        np.testing.assert_array_equal(out.a, self.prefix_kv(n))
        self.assertEqual(got, states)
        with self.m.load_async(NS, tokens(n, 300), DLPackOnly(np.zeros_like(self.prefix_kv(n))),
                               states=self.new_states()) as op:
            self.assertTrue(op.wait(timeout=10))
            self.assertEqual(op.result().tokens, n)

    def test_save_and_load_async(self):
        n = 2 * CHUNK
        states = [bytearray(b"\x11" * 12), bytearray(b"\x22" * 12)]
        with self.m.save_async(NS, tokens(n, 70), self.prefix_kv(n), states=states) as op:
            with self.assertRaises(BufferError):
                states[0].extend(b"x")  # kdn reads it when the layers are ready: it cannot move
            for layer in range(LAYERS):
                op.layer_ready(layer)
            self.assertTrue(op.wait(timeout=10))
            self.assertEqual(op.result().tokens, n)
        states[0].extend(b"x")  # released with the op
        self.assertEqual(self.m.lookup(NS, tokens(n + 5, 70)).cached_tokens, n)
        out = bytearray(self.prefix_kv(n).nbytes)
        got = self.new_states()
        with self.m.load_async(NS, tokens(n, 70), out, states=got) as op:
            with self.assertRaises(BufferError):
                got[1].extend(b"x")
            self.assertTrue(op.wait(timeout=10))
            r = op.result()
            self.assertEqual((r.state, r.tokens), (kdn.OpState.DONE, n))
        self.assertEqual(bytes(out), self.prefix_kv(n).tobytes())
        self.assertEqual(got, [bytearray(b"\x11" * 12), bytearray(b"\x22" * 12)])
        got[1].extend(b"x")


class AsyncTest(unittest.TestCase):
    def setUp(self):
        self.rt = runtime()
        self.m = model(self.rt)
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)

    def test_save_then_load_layer_by_layer(self):
        n = 2 * CHUNK
        kv = canonical_kv(n)
        with self.m.save_async(NS, tokens(n), kv) as op:
            for layer in range(LAYERS):
                op.layer_ready(layer)
            self.assertTrue(op.wait(timeout=10))
            self.assertEqual(op.poll(), kdn.OpState.DONE)
            self.assertTrue(op.done)
            self.assertEqual(op.result().tokens, n)
        self.assertTrue(op.closed)
        out = bytearray(kv.nbytes)
        with self.m.load_async(NS, tokens(n), out) as op:
            for layer in range(LAYERS):
                self.assertTrue(op.wait_layer(layer, timeout=10))
            self.assertTrue(op.wait())
            r = op.result()
            self.assertEqual((r.state, r.tokens, r.num_failed), (kdn.OpState.DONE, n, 0))
            self.assertEqual(op.failed_ranges(), [])
        self.assertEqual(bytes(out), kv.tobytes())

    def test_op_keeps_the_buffer_exported_until_closed(self):
        out = bytearray(CHUNK * self.m.kv_bytes_per_token)
        op = self.m.load_async(NS, tokens(CHUNK), out)
        with self.assertRaises(BufferError):
            out.extend(b"x")  # kdn may still write there: it cannot move
        op.wait()
        op.close()
        out.extend(b"x")

    def test_save_waits_for_its_layers(self):
        op = self.m.save_async(NS, tokens(CHUNK), canonical_kv(CHUNK))
        self.assertFalse(op.wait(timeout=0.05))  # no layer is ready: it cannot end
        self.assertEqual(op.poll(), kdn.OpState.PENDING)
        self.assertEqual(op.result().state, kdn.OpState.PENDING)
        op.cancel()
        op.close()  # cancels, waits, frees: nothing was saved
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK)).cached_tokens, 0)

    def test_cancel_a_load(self):
        self.m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
        with self.m.load_async(NS, tokens(CHUNK), np.zeros(CHUNK * LAYERS * 2 * ROW, np.float32)) as op:
            op.cancel()
            try:
                self.assertTrue(op.wait(timeout=10))  # it ended before the cancel reached it
                self.assertEqual(op.poll(), kdn.OpState.DONE)
            except kdn.CancelledError:
                self.assertEqual(op.poll(), kdn.OpState.CANCELLED)
                self.assertEqual(op.result().status, kdn.Status.CANCELLED)

    def test_load_of_a_miss(self):
        out = np.zeros(CHUNK * LAYERS * 2 * ROW, np.float32)
        with self.m.load_async(NS, tokens(CHUNK, 77), out) as op:
            self.assertTrue(op.wait(10))
            self.assertEqual(op.result().tokens, 0)


class KnowledgeTest(unittest.TestCase):
    def test_put_info_list_pin_fetch_expire_delete(self):
        n = 3 * CHUNK
        kv = canonical_kv(n)
        ids = tokens(n, 40)
        with runtime() as rt, model(rt) as m:
            m.knowledge_put(NS, "story", ids, kv, version=3, metadata='{"title": "x"}')
            m.knowledge_put(NS, "another", ids[:CHUNK], kv[:, :, :CHUNK].copy())
            info = m.knowledge_info(NS, "story")
            self.assertEqual((info.doc_id, info.version, info.num_tokens, info.chunks, info.chunks_present,
                              info.pinned, info.expires_in_ms, info.hits), ("story", 3, n, 3, 3, False, -1, 0))
            self.assertEqual([d.doc_id for d in m.knowledge_list(NS)], ["another", "story"])
            self.assertEqual(m.knowledge_list("empty namespace"), [])
            m.knowledge_pin(NS, "story")
            info = m.knowledge_info(NS, "story")
            self.assertEqual((info.pinned, info.pin_expires_in_ms), (True, -1))
            self.assertGreater(rt.stats().pins_active, 0)
            m.knowledge_unpin(NS, "story")
            self.assertFalse(m.knowledge_info(NS, "story").pinned)
            m.knowledge_pin(NS, "another", ttl_ms=60000)  # a pin with a TTL says when it ends
            self.assertTrue(50000 < m.knowledge_info(NS, "another").pin_expires_in_ms <= 60000)
            m.knowledge_unpin(NS, "another")
            out = np.zeros_like(kv)
            got = m.knowledge_fetch(NS, "story", out, kdn.KvView(num_tokens=n))
            self.assertEqual(got.result.tokens, n)
            self.assertEqual(got.tokens.tolist(), ids.tolist())
            np.testing.assert_array_equal(out, kv)
            self.assertEqual(m.knowledge_info(NS, "story").hits, 3)  # each chunk fetched (since 1.4)
            m.knowledge_put(NS, b"\xff binary id", ids[:CHUNK], kv[:, :, :CHUNK].copy())
            binary = m.knowledge_list(NS)[-1].doc_id  # last in byte order; not UTF-8: kept by surrogateescape
            self.assertEqual(binary.encode("utf-8", "surrogateescape"), b"\xff binary id")
            self.assertEqual(m.knowledge_info(NS, binary).num_tokens, CHUNK)
            m.knowledge_delete(NS, binary)
            m.knowledge_expire(NS, "story", ttl_ms=60000)
            self.assertGreater(m.knowledge_info(NS, "story").expires_in_ms, 0)
            m.knowledge_delete(NS, "another")
            with self.assertRaises(kdn.NotFoundError):
                m.knowledge_info(NS, "another")
            m.knowledge_expire(NS, "story")  # now
            with self.assertRaises(kdn.NotFoundError):
                m.knowledge_fetch(NS, "story", out, kdn.KvView(num_tokens=n))


class ThreadTest(unittest.TestCase):
    def test_many_threads_one_model(self):
        # Calls release the GIL: threads run kdn calls at once, and the
        # mover thread takes the GIL for the editor meanwhile.
        edits = []
        errors = []

        def worker(m, base):
            try:
                for i in range(20):
                    ids = tokens(CHUNK, base + 1000 * i)
                    kv = canonical_kv(CHUNK, base + i)
                    m.store(NS, ids, kv)
                    out = np.zeros_like(kv)
                    if m.retrieve(NS, ids, out).tokens != CHUNK or not np.array_equal(out[1], kv[1]):
                        errors.append(f"thread {base}: retrieve {i}")
                    if m.lookup(NS, ids).cached_tokens != CHUNK:
                        errors.append(f"thread {base}: lookup {i}")
            except Exception as e:  # reported below
                errors.append(repr(e))

        with runtime(tiers=[kdn.Tier.host(16 << 20)], editor=lambda info, kv: edits.append(1) or False) as rt, \
                model(rt) as m:
            threads = [threading.Thread(target=worker, args=(m, t)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(rt.stats().stores, 80)


class ExitTest(unittest.TestCase):
    def test_handles_left_open_are_closed_at_exit(self):
        # A runtime with an editor, a model and an op never closed: the
        # interpreter exits cleanly (the backstop closes them in order).
        code = (
            "import numpy as np, kdn\n"
            "rt = kdn.Runtime(chunk_tokens=16, editor=lambda info, kv: False)\n"
            "m = rt.model(num_layers=1, num_kv_heads=1, head_dim=4, fingerprint='exit')\n"
            "m.store('ns', list(range(64)), np.zeros(64 * 8, np.float32))\n"
            "op = m.load_async('ns', list(range(64)), np.zeros(64 * 8, np.float32))\n"
            "print('left open')\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "left open")
        self.assertEqual(out.stderr, "")


if __name__ == "__main__":
    unittest.main()
