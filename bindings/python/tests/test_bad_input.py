# SPDX-License-Identifier: Apache-2.0
"""Bad input gives a Python exception, never a crash (plan14 section 7: the
same cases, under the same names, in every language; the editor that raises
is test_bad_editor_raises in test_editor.py)."""
import unittest

import numpy as np

import kdn
from _common import CHUNK, DIM, LAYERS, NS, ROW, canonical_kv, model, runtime, tokens


class BadInputTest(unittest.TestCase):
    def setUp(self):
        self.rt = runtime()
        self.m = model(self.rt)
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)
        self.m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))

    def test_bad_small_buffer(self):
        small = bytearray(b"\x7f" * (CHUNK * self.m.kv_bytes_per_token - 4))
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.retrieve(NS, tokens(CHUNK), small)
        self.assertEqual(small, bytearray(b"\x7f" * len(small)))  # checked before any write
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.store(NS, tokens(CHUNK, 50), bytes(len(small)))
        with self.assertRaises(kdn.InvalidArgumentError):  # a layer offset past the end
            self.m.retrieve(NS, tokens(CHUNK), bytearray(CHUNK * self.m.kv_bytes_per_token),
                            kdn.KvView(layer_offsets=[(0, 10 ** 6)] * LAYERS, layer_elements=CHUNK * ROW))
        self.assertEqual(self.m.lookup(NS, tokens(CHUNK, 50)).cached_tokens, 0)

    def test_bad_readonly_buffer(self):
        n = CHUNK * self.m.kv_bytes_per_token
        frozen = np.zeros(n // 4, np.float32)
        frozen.flags.writeable = False
        for ro in (bytes(n), memoryview(bytes(n)), frozen):
            with self.assertRaises(kdn.InvalidArgumentError):
                self.m.retrieve(NS, tokens(CHUNK), ro)
            with self.assertRaises(kdn.InvalidArgumentError):
                self.m.load_async(NS, tokens(CHUNK), ro)

    def test_bad_dtype(self):
        half = np.zeros(CHUNK * self.m.kv_bytes_per_token // 2, np.float16)  # the right size in bytes
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.retrieve(NS, tokens(CHUNK), half)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.store(NS, tokens(CHUNK), half)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.retrieve(NS, tokens(CHUNK), np.zeros(CHUNK * self.m.kv_bytes_per_token // 8, np.float64))
        with model(self.rt, kdn.DType.BF16, "bf16") as bf16:
            with self.assertRaises(kdn.InvalidArgumentError):
                bf16.store(NS, tokens(CHUNK), np.zeros(CHUNK * bf16.kv_bytes_per_token // 4, np.float32))
        with self.assertRaises(kdn.InvalidArgumentError):  # an unknown dtype
            self.rt.model(num_layers=1, num_kv_heads=1, head_dim=4, dtype=9, fingerprint="x")

    def test_bad_closed_handle(self):
        rt = runtime()
        m = model(rt)
        m.close()
        with self.assertRaises(kdn.ClosedError):
            m.retrieve(NS, tokens(CHUNK), bytearray(64))
        with self.assertRaises(kdn.ClosedError):
            m.lookup(NS, tokens(CHUNK))
        with self.assertRaises(kdn.ClosedError):
            m.kv_bytes_per_token
        with self.assertRaises(kdn.ClosedError):
            m.report_prefill(CHUNK, 1000)
        rt.close()
        rt.close()
        with self.assertRaises(kdn.ClosedError) as cm:
            rt.stats()
        self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaises(kdn.ClosedError):
            model(rt)

    def test_bad_null_argument(self):
        n = CHUNK * self.m.kv_bytes_per_token
        cases = [
            lambda: self.m.retrieve(None, tokens(CHUNK), bytearray(n)),
            lambda: self.m.retrieve(NS, None, bytearray(n)),
            lambda: self.m.retrieve(NS, tokens(CHUNK), None),
            lambda: self.m.lookup(NS, None),
            lambda: self.m.retrieve(NS, tokens(CHUNK), bytearray(n), "not a view"),
            lambda: self.m.knowledge_info(NS, None),
            lambda: self.rt.model(None),
            lambda: self.rt.model(num_layers=1),
            lambda: kdn.Runtime(tiers=[None]),
            lambda: kdn.Runtime(chunk_tokens=None),
            lambda: self.m.retrieve("", tokens(CHUNK), bytearray(n)),  # kdn's own check
            lambda: self.rt.model(num_layers=1, num_kv_heads=1, head_dim=4, fingerprint=""),
        ]
        for i, case in enumerate(cases):
            with self.subTest(case=i), self.assertRaises(kdn.InvalidArgumentError):
                case()

    def test_bad_negative_token(self):
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.lookup(NS, [1, -5, 3])
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.store(NS, np.array([3, -1] * 8, np.int32), canonical_kv(CHUNK))
        with self.assertRaises(kdn.InvalidArgumentError):  # not an int32
            self.m.lookup(NS, [1, 2 ** 40])
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.lookup(NS, [1.5, 2])
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.lookup(NS, np.zeros(4, np.float32))

    def test_bad_tier_config(self):
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[kdn.Tier.host(0)])
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[kdn.Tier.host(1 << 20, codec="nope")])
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[kdn.Tier.host(-1)])
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[kdn.Tier(kind=77)])

    def test_bad_redis_address(self):
        # Refused when the runtime is created; no server is contacted.
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            kdn.Runtime(tiers=[kdn.Tier.redis("not-an-address")])
        self.assertIn("not-an-address", str(cm.exception))

    def test_bad_redis_fields_on_host_tier(self):
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            kdn.Runtime(tiers=[kdn.Tier.host(1 << 20, user="kdn")])
        self.assertIn("redis", str(cm.exception))
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[kdn.Tier.host(1 << 20, ttl_ms=60000)])
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(tiers=[kdn.Tier.redis("127.0.0.1:1", ttl_ms=-1)])

    def test_bad_report_prefill(self):
        for tokens_, elapsed_ns in [(0, 5_000_000), (CHUNK, 0), (2, (2 * 3600 + 1) * 10**9), (-1, 1000),
                                    (CHUNK, -1), (CHUNK, 2**64), (CHUNK, 1.5)]:
            with self.subTest(tokens=tokens_, elapsed_ns=elapsed_ns):
                with self.assertRaises(kdn.InvalidArgumentError) as cm:
                    self.m.report_prefill(tokens_, elapsed_ns)
                self.assertIsInstance(cm.exception, kdn.CallerError)
        s = self.rt.stats()
        self.assertEqual((s.prefill_tokens, s.prefill_ns), (0, 0))

    def test_bad_unknown_document(self):
        out = bytearray(CHUNK * self.m.kv_bytes_per_token)
        with self.assertRaises(kdn.NotFoundError) as cm:
            self.m.knowledge_fetch(NS, "no such doc", out, kdn.KvView(num_tokens=CHUNK))
        self.assertIsInstance(cm.exception, LookupError)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.knowledge_info(NS, "d" * 256)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.knowledge_put(NS, "d" * 256, tokens(CHUNK), canonical_kv(CHUNK))

    def test_bad_fetch_buffer_too_small(self):
        n = 3 * CHUNK
        self.m.knowledge_put(NS, "doc", tokens(n), canonical_kv(n))
        room = CHUNK
        out = bytearray(room * self.m.kv_bytes_per_token)
        with self.assertRaises(kdn.BufferTooSmallError) as cm:
            self.m.knowledge_fetch(NS, "doc", out, kdn.KvView(num_tokens=room))
        self.assertEqual(cm.exception.needed, n)
        self.assertEqual(out, bytearray(len(out)))  # nothing written
        with self.assertRaises(kdn.InvalidArgumentError):  # no room stated at all
            self.m.knowledge_fetch(NS, "doc", out, None)
        big = np.zeros((LAYERS, 2, cm.exception.needed, ROW), np.float32)
        self.assertEqual(self.m.knowledge_fetch(NS, "doc", big, kdn.KvView(num_tokens=n)).result.tokens, n)

    def test_bad_paged_view_blocks(self):
        # A block count that overflows (num_blocks x block elements past 2^64)
        # or whose blocks do not fit the buffer: refused before kdn reads or
        # writes a byte (regression: kdn was handed layer pointers past the end).
        n = 2 * CHUNK
        block = 8
        per_cache = 4 * block * ROW
        buf = np.full(LAYERS * 2 * per_cache, 3.0, np.float32)
        offsets = [(2 * layer * per_cache, (2 * layer + 1) * per_cache) for layer in range(LAYERS)]
        cases = [
            (2 ** 58 + 1, [0, 2 ** 31 - 1, 1, 2]),  # x 64 elements a block: 2^64 + 64, taken for 64
            (2 ** 62, [0, 1, 2, 3]),
            (2 ** 64 - 1, [0, 1, 2, 3]),
            (LAYERS * 2 * 4 + 1, [0, 1, 2, LAYERS * 2 * 4]),  # one block more than the whole buffer
        ]
        for layout in (kdn.Layout.PAGED_NHD, kdn.Layout.PAGED_HND):
            for num_blocks, table in cases:
                view = kdn.KvView.paged(layout, block, table, offsets, num_blocks)
                with self.subTest(layout=layout, num_blocks=num_blocks):
                    with self.assertRaisesRegex(kdn.InvalidArgumentError, "paged view"):
                        self.m.retrieve(NS, tokens(n), buf, view)
                    with self.assertRaisesRegex(kdn.InvalidArgumentError, "paged view"):
                        self.m.store(NS, tokens(n, 300), buf, view)
        self.assertTrue((buf == 3.0).all())
        self.assertEqual(self.m.lookup(NS, tokens(n, 300)).cached_tokens, 0)

    def test_bad_layer_offsets_not_one_per_layer(self):
        # Offsets for fewer (or more) layers than the view names: refused
        # (regression: kdn read the pointer array past its end).
        per = CHUNK * ROW
        buf = np.zeros(2 * LAYERS * per, np.float32)
        for offsets, layers in (([(0, per)], None), ([(0, per)] * (LAYERS + 1), None), ([(0, per)], [1, 0])):
            view = kdn.KvView(layer_offsets=offsets, layers=layers, layer_elements=per, stride_token=ROW,
                              stride_head=DIM, stride_dim=1)
            with self.subTest(offsets=len(offsets), layers=layers):
                with self.assertRaisesRegex(kdn.InvalidArgumentError, "layer offsets"):
                    self.m.retrieve(NS, tokens(CHUNK), buf, view)
                with self.assertRaisesRegex(kdn.InvalidArgumentError, "layer offsets"):
                    self.m.knowledge_put(NS, "offsets", tokens(CHUNK), buf, view)
        self.assertTrue((buf == 0).all())

    def test_bad_fetch_room_larger_than_buffer(self):
        # A fetch whose stated room exceeds the buffer: refused before kdn
        # writes (regression: kdn wrote the document's KV past the buffer).
        n = 3 * CHUNK
        self.m.knowledge_put(NS, "roomy", tokens(n), canonical_kv(n))
        out = bytearray(CHUNK * self.m.kv_bytes_per_token)
        for room in (n, 2 ** 40, 2 ** 63):
            with self.subTest(room=room):
                with self.assertRaisesRegex(kdn.InvalidArgumentError, "room"):
                    self.m.knowledge_fetch(NS, "roomy", out, kdn.KvView(num_tokens=room))
        self.assertEqual(out, bytearray(len(out)))

    def test_bad_batch_request(self):
        got = self.m.lookup_batch(NS, [tokens(CHUNK), [4, -4, 4], tokens(CHUNK)])
        self.assertEqual([r.status for r in got], [kdn.Status.OK, kdn.Status.INVALID_ARGUMENT, kdn.Status.OK])
        self.assertEqual([r.cached_tokens for r in got], [CHUNK, 0, CHUNK])

    def test_bad_wait_after_close(self):
        op = self.m.load_async(NS, tokens(CHUNK), bytearray(CHUNK * self.m.kv_bytes_per_token))
        op.close()
        op.close()
        for call in (op.wait, op.poll, op.cancel, op.result, lambda: op.wait_layer(0)):
            with self.assertRaises(kdn.ClosedError):
                call()

    def test_bad_non_contiguous_buffer(self):
        wide = np.zeros((CHUNK * self.m.kv_bytes_per_token // 4, 2), np.float32)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.retrieve(NS, tokens(CHUNK), wide[:, 0])
        self.assertTrue((wide == 0).all())

    def test_bad_op_arguments(self):
        with self.m.save_async(NS, tokens(CHUNK, 900), canonical_kv(CHUNK)) as op:
            with self.assertRaises(kdn.InvalidArgumentError):
                op.layer_ready(LAYERS)  # no such layer
            with self.assertRaises(OverflowError):
                op.layer_ready(-1)


if __name__ == "__main__":
    unittest.main()
