# SPDX-License-Identifier: Apache-2.0
"""Blending (kdn_kv_blend, experimental) from Python, with a real layer
callback: the reference model's forward pass in numpy (_refmodel), which the
tests first check against the repository's reference KV. Two documents put
as knowledge items (their KV computed alone) and a query are blended: with
ratio 1 the result is the full prefill, bit for bit; with 0.25 the callback
runs where kdn says, what it writes lands in the view, the rest is the
documents' KV placed, and the query's KV is closer to the full prefill's
than naive reuse's. Exceptions raised in the callback come back to the
caller; device views (emulated) get what host views get.

1.9 (BlendPassTest): a KV pass (kv_fn) gives the same KV for less work,
the default ratio resolves by method, first_tokens anchors each document,
match() finds the documents in a context's tokens, blend_tokens() of
that context equals blend() of the same documents as segments, and the
accuracy gate (gate_file) lets a measured method blend and recomputes the
whole context for one it has no good record of."""
import os
import tempfile
import threading
import traceback
import unittest

import numpy as np

import kdn
from _devarrays import CudaArray, DLPackCuda
import _refmodel

NS = "blend"
LAYERS, HEADS, DIM = 5, 4, 8


def ids(salt, n):
    """n ids of the reference run, from a place that depends on salt (as the C test's Ids)."""
    return [_refmodel.REFERENCE_IDS[(salt * 7 + i) % len(_refmodel.REFERENCE_IDS)] for i in range(n)]


DOC_A, DOC_B, QUERY = ids(1, 19), ids(2, 23), ids(3, 5)
CONTEXT = [_refmodel.BOS] + DOC_B + DOC_A + QUERY  # BOS, doc-b, doc-a, the query
TOTAL = len(CONTEXT)  # 48
SEGMENTS = [[_refmodel.BOS], "doc-b", kdn.Segment.document("doc-a"), kdn.Segment.of_tokens(QUERY)]
FRESH = [0] + list(range(TOTAL - len(QUERY), TOTAL))  # BOS and the query


class KvPass:
    """The engine's KV pass (a blend's kv_fn, 1.9): the reference model's K
    and V of a layer alone, recording each call."""

    def __init__(self, ref, fail_at=None, error=None):
        self.ref = ref
        self.fail_at = fail_at
        self.error = error
        self.calls = []  # (layer, positions, tokens, hidden shape)

    def __call__(self, layer, positions, tokens, hidden, k, v):
        pos = np.asarray(positions)
        self.calls.append((layer, pos.copy(), None if tokens is None else list(tokens), hidden.shape))
        if layer == self.fail_at:
            raise self.error
        h = np.asarray(hidden)
        if layer == 0:
            h[:] = self.ref.embed(np.asarray(tokens))
        self.ref.kv(layer, pos, h, np.asarray(k), np.asarray(v))


class Engine:
    """The engine side of a blend: the reference model's layer, recording
    each call and what it wrote."""

    def __init__(self, ref, fail_at=None, error=None):
        self.ref = ref
        self.fail_at = fail_at
        self.error = error
        self.calls = []  # (layer, positions, tokens, hidden shape, k shape)
        self.wrote = {}  # layer -> (positions, K rows, V rows) the callback wrote

    def __call__(self, layer, positions, tokens, hidden, k, v):
        pos = np.asarray(positions)
        self.calls.append((layer, pos.copy(), None if tokens is None else list(tokens), hidden.shape, k.shape))
        if layer == self.fail_at:
            raise self.error
        h, kk, vv = np.asarray(hidden), np.asarray(k), np.asarray(v)
        if layer == 0:
            h[:] = self.ref.embed(np.asarray(tokens))
        self.ref.layer(layer, pos, h, kk, vv)
        self.wrote[layer] = (pos.copy(), kk[pos].copy(), vv[pos].copy())


def canonical():
    return np.full((LAYERS, 2, TOTAL, HEADS, DIM), -1.0, np.float32)


class BlendFixture(unittest.TestCase):
    """The reference model, the documents put, and a blend of SEGMENTS."""

    @classmethod
    def setUpClass(cls):
        if not _refmodel.present():
            if _refmodel.required():
                raise AssertionError(f"reference model missing at {_refmodel.MODELS} and KDN_REQUIRE_MODELS=1")
            raise unittest.SkipTest(f"reference model not found at {_refmodel.MODELS} (set KDN_MODELS)")
        cls.ref = _refmodel.RefModel()
        cls.full = cls.ref.prefill(CONTEXT)
        cls.alone = {"doc-a": cls.ref.prefill(DOC_A), "doc-b": cls.ref.prefill(DOC_B)}

    def setUp(self):
        self.rt = kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(16 << 20)], device=kdn.DeviceMode.EMULATED)
        self.m = self.rt.model(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, fingerprint="stories260K")
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)
        self.m.knowledge_put(NS, "doc-a", DOC_A, self.alone["doc-a"])
        self.m.knowledge_put(NS, "doc-b", DOC_B, self.alone["doc-b"])

    def blend(self, out=None, engine=None, model=None, **kwargs):
        engine = engine or Engine(self.ref)
        out = canonical() if out is None else out
        kwargs.setdefault("ratio", 0.25)
        report = (model or self.m).blend(NS, SEGMENTS, out, layer_fn=engine, hidden_dim=self.ref.dim, **kwargs)
        return report, out, engine


class BlendTest(BlendFixture):
    def test_the_forward_pass_is_the_reference_models(self):
        tokens, k, v = _refmodel.reference_kv()
        kv = self.ref.prefill(tokens)
        np.testing.assert_allclose(kv[:, 0], k, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(kv[:, 1], v, rtol=1e-4, atol=1e-4)

    def test_full_recompute_is_a_prefill(self):
        report, out, engine = self.blend(ratio=1.0)
        # (1.9's fields: nothing anchored, no KV pass, the ratio asked, CacheBlend's one check layer)
        self.assertEqual(report, kdn.BlendReport(TOTAL, 42, 6, 42, 1.0, 0, 0, 1.0, 1))
        np.testing.assert_array_equal(out, self.full)
        self.assertEqual([c[0] for c in engine.calls], list(range(LAYERS)))
        for layer, pos, tokens, hidden_shape, k_shape in engine.calls:
            self.assertEqual(pos.tolist(), list(range(TOTAL)))
            self.assertEqual(tokens, CONTEXT if layer == 0 else None)
            self.assertEqual(hidden_shape, (TOTAL, self.ref.dim))
            self.assertEqual(k_shape, (TOTAL, HEADS * DIM))

    def test_cacheblend(self):
        report, out, engine = self.blend(ratio=0.25)
        self.assertEqual(report[:4], (TOTAL, 42, 6, 11))  # 25% of the 42 cached positions, rounded
        self.assertGreater(report.recompute_fraction, 0.25)
        self.assertLess(report.recompute_fraction, 1.0)
        # Layers 0..1 (the check layer) run every position; after it, the
        # fresh positions and the 11 selected.
        counts = [len(c[1]) for c in engine.calls]
        self.assertEqual(counts, [TOTAL, TOTAL, 17, 17, 17])
        selected = sorted(set(engine.calls[2][1].tolist()) - set(FRESH))
        self.assertEqual(len(selected), 11)
        for layer in (3, 4):
            self.assertEqual(engine.calls[layer][1].tolist(), engine.calls[2][1].tolist())
        self.assertTrue(set(FRESH) <= set(engine.calls[2][1].tolist()))
        self.assertEqual(engine.calls[0][2], CONTEXT)
        # What the callback wrote is in the view, bit for bit.
        for layer, (pos, k_rows, v_rows) in engine.wrote.items():
            np.testing.assert_array_equal(out[layer, 0, pos].reshape(len(pos), -1), k_rows)
            np.testing.assert_array_equal(out[layer, 1, pos].reshape(len(pos), -1), v_rows)
        # Layers 0 and 1 ran every position as a prefill does: equal to it.
        np.testing.assert_array_equal(out[:2], self.full[:2])
        # Past the check layer the others keep the documents' KV, placed:
        # V as computed alone, K rotated to the new positions.
        placed = {1 + i: ("doc-b", i) for i in range(len(DOC_B))}
        placed.update({1 + len(DOC_B) + i: ("doc-a", i) for i in range(len(DOC_A))})
        kept = [p for p in placed if p not in selected]
        self.assertEqual(len(kept), 31)
        for p in kept:
            doc, i = placed[p]
            np.testing.assert_array_equal(out[2:, 1, p], self.alone[doc][2:, 1, i])
            rotated = self.alone[doc][2:, 0, i].reshape(LAYERS - 2, HEADS * DIM).copy()
            self.ref._rope(rotated, [p - i] * (LAYERS - 2), HEADS)  # RoPE composes: R(p) = R(p - i) R(i)
            np.testing.assert_allclose(out[2:, 0, p].reshape(LAYERS - 2, -1), rotated, rtol=1e-5, atol=1e-5)
        # The point of it: the query's KV in the last layer is nearer the
        # full prefill's than with naive reuse (ratio 0: nothing cached recomputed).
        naive, naive_out, _ = self.blend(ratio=0.0)
        self.assertEqual(naive.selected, 0)
        q = slice(TOTAL - len(QUERY), TOTAL)
        err = np.abs(out[-1, :, q] - self.full[-1, :, q]).max()
        naive_err = np.abs(naive_out[-1, :, q] - self.full[-1, :, q]).max()
        self.assertLess(err, naive_err)

    def test_options(self):
        # Two check layers: gradual selection, ratio^(1/2) after the first.
        _, _, engine = self.blend(ratio=0.25, check_layers=[1, 2])
        self.assertEqual([len(c[1]) for c in engine.calls], [TOTAL, TOTAL, 21 + 6, 17, 17])
        # A threshold of 0 selects every cached position (all deviate >= 0).
        report, out, _ = self.blend(threshold=0.0)
        self.assertEqual(report.selected, 42)
        np.testing.assert_array_equal(out, self.full)
        # Linear RoPE scaling by 1 is no scaling.
        _, plain, _ = self.blend()
        _, scaled, _ = self.blend(rope_scaling=kdn.RopeScaling.LINEAR, rope_factor=1.0)
        np.testing.assert_array_equal(plain, scaled)
        # The blend's saving is priced into TTFT saved (1.4): positions x the
        # work not recomputed x the reported prefill time per token.
        self.m.report_prefill(10, 10_000)  # 1,000 ns per token
        before = self.rt.stats().ttft_saved_ns
        report, _, _ = self.blend()
        self.assertAlmostEqual(self.rt.stats().ttft_saved_ns - before, 1000 * TOTAL * (1 - report.recompute_fraction),
                               delta=1.0)
        self.assertGreater(self.m.knowledge_info(NS, "doc-a").hits, 0)

    def test_device_views(self):
        # Emulated device memory, through both kinds of GPU array: the same
        # KV as the host view's.
        _, host, _ = self.blend()
        cai = canonical()
        report, _, _ = self.blend(CudaArray(cai, stream=9))
        self.assertEqual(report.selected, 11)
        np.testing.assert_array_equal(cai, host)
        dl = DLPackCuda(canonical())
        self.blend(dl)
        np.testing.assert_array_equal(dl.a, host)
        self.assertEqual(dl.streams, [1])
        # Without a device: kdn refuses the device view, the callback never runs.
        with kdn.Runtime(device=kdn.DeviceMode.NONE) as rt, \
                rt.model(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, fingerprint="stories260K") as m:
            engine = Engine(self.ref)
            with self.assertRaises(kdn.UnsupportedError):
                m.blend(NS, [QUERY], CudaArray(canonical()), layer_fn=engine, hidden_dim=self.ref.dim)
            self.assertEqual(engine.calls, [])

    def test_an_exception_in_the_callback_is_raised_by_blend(self):
        class Boom(Exception):
            pass

        boom = Boom("layer 2 failed")
        engine = Engine(self.ref, fail_at=2, error=boom)
        try:
            self.blend(engine=engine)
            self.fail("blend did not raise")
        except Boom as e:
            self.assertIs(e, boom)
            frames = [f.name for f in traceback.extract_tb(e.__traceback__)]
        self.assertEqual([c[0] for c in engine.calls], [0, 1, 2])  # the blend stopped there
        # The traceback runs from this test through blend into the callback.
        self.assertEqual(frames[0], "test_an_exception_in_the_callback_is_raised_by_blend")
        self.assertIn("blend", frames)
        self.assertEqual(frames[-1], "__call__")
        # kdn's errors and BaseExceptions alike; the model goes on working.
        for error in (kdn.BusyError("not now"), KeyboardInterrupt(), SystemExit(3)):
            with self.assertRaises(type(error)) as cm:
                self.blend(engine=Engine(self.ref, fail_at=0, error=error))
            self.assertIs(cm.exception, error)
        report, out, _ = self.blend()
        self.assertEqual(report.selected, 11)
        # An exception thrown after a view was released (the callback kept
        # it) is the same: ValueError, raised by blend.
        kept = []

        def keeps(layer, positions, tokens, hidden, k, v):
            if kept:
                kept[0].tolist()  # last call's view: released when that call returned
            kept.append(k)
            Engine(self.ref)(layer, positions, tokens, hidden, k, v)
        with self.assertRaises(ValueError) as cm:
            self.blend(engine=keeps)
        self.assertIn("released", str(cm.exception))
        # An array the callback kept is of a copy: valid, never kdn's memory.
        arrays = []

        def keeps_arrays(layer, positions, tokens, hidden, k, v):
            arrays.append(np.asarray(k))
            Engine(self.ref)(layer, positions, tokens, hidden, k, v)
        _, out, _ = self.blend(engine=keeps_arrays)
        self.assertEqual(len(arrays), LAYERS)
        np.testing.assert_array_equal(arrays[-1][FRESH], out[-1, 0, FRESH].reshape(len(FRESH), -1))

    def test_refused(self):
        engine = Engine(self.ref)
        with self.assertRaises(kdn.NotFoundError):
            self.m.blend(NS, ["doc-x", QUERY], canonical(), layer_fn=engine, hidden_dim=self.ref.dim)
        short = np.zeros((LAYERS, 2, TOTAL - 1, HEADS, DIM), np.float32)  # room for 47
        with self.assertRaises(kdn.BufferTooSmallError):
            self.m.blend(NS, SEGMENTS, short, layer_fn=engine, hidden_dim=self.ref.dim)
        with self.assertRaises(kdn.InvalidArgumentError):  # another shape than the model's
            self.m.blend(NS, SEGMENTS, np.zeros((LAYERS, 2, TOTAL, DIM, HEADS), np.float32), layer_fn=engine,
                         hidden_dim=self.ref.dim)
        for bad in (dict(ratio=2.0), dict(hidden_dim=0), dict(layer_fn=None), dict(check_layers=[9])):
            args = dict(layer_fn=engine, hidden_dim=self.ref.dim)
            args.update(bad)
            with self.assertRaises(kdn.InvalidArgumentError, msg=bad):
                self.m.blend(NS, SEGMENTS, canonical(), **args)
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            self.m.blend(NS, [b"doc-a"], canonical(), layer_fn=engine, hidden_dim=self.ref.dim)
        self.assertIn("ambiguous", str(cm.exception))
        with self.assertRaises(kdn.InvalidArgumentError):  # kdn writes into it
            self.m.blend(NS, SEGMENTS, bytes(canonical().nbytes), layer_fn=engine, hidden_dim=self.ref.dim)
        self.assertEqual(engine.calls, [])
        # Raw bytes fit, with a view stating the room.
        raw = bytearray(canonical().nbytes)
        report = self.m.blend(NS, SEGMENTS, raw, kdn.KvView(num_tokens=TOTAL), layer_fn=engine,
                              hidden_dim=self.ref.dim, ratio=1.0)
        self.assertEqual(report.positions, TOTAL)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(self.full.shape), self.full)

    def test_close_inside_the_callback_waits_for_the_blend(self):
        engine = Engine(self.ref)

        def closes(layer, *args):
            if layer == 1:
                self.m.close()  # handed to the closer thread: this blend holds the model
                self.assertTrue(self.m.closed)
            engine(layer, *args)
        report, out, _ = self.blend(engine=closes, ratio=1.0)
        self.assertEqual(report.positions, TOTAL)
        np.testing.assert_array_equal(out, self.full)
        with self.assertRaises(kdn.ClosedError):
            self.m.lookup(NS, CONTEXT)

    def test_threads(self):
        # Blends on two threads at once: kdn runs without the GIL, each
        # callback takes it on its own thread; the results are the same.
        _, want, _ = self.blend()
        outs, errors = [canonical(), canonical()], []

        def run(out):
            try:
                self.blend(out)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
        threads = [threading.Thread(target=run, args=(o,)) for o in outs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        for out in outs:
            np.testing.assert_array_equal(out, want)


# A context given as its tokens (1.9): BOS, doc-b, tokens of no document,
# doc-a, a question (QUERY's last 3 tokens are doc-a's last chunk: a match).
BETWEEN, QUESTION = ids(4, 3), ids(5, 5)
TEXT = [_refmodel.BOS] + DOC_B + BETWEEN + DOC_A + QUESTION
TEXT_SEGMENTS = [[_refmodel.BOS], "doc-b", BETWEEN, "doc-a", QUESTION]  # the same, as segments
DOC_B_AT, DOC_A_AT = (1, 1 + len(DOC_B)), (1 + len(DOC_B) + len(BETWEEN), 1 + len(DOC_B) + len(BETWEEN) + len(DOC_A))
KV_COST = 0.05  # the KV pass's work per position over a whole layer's (as the C test's)


class BlendPassTest(BlendFixture):
    """What C ABI 1.9 added to blending, through the package, with the
    reference model's layer and KV pass behind the callbacks (the
    documents and context of BlendTest)."""

    def blend(self, out=None, engine=None, model=None, **kwargs):
        kwargs.setdefault("ratio", None)  # the method's default, unless a test names one
        return super().blend(out, engine, model, **kwargs)

    def by_pass(self, **kwargs):
        """A blend with the KV pass: (report, KV, engine, KV pass)."""
        kv = KvPass(self.ref)
        report, out, engine = self.blend(kv_fn=kv, kv_cost=KV_COST, **kwargs)
        return report, out, engine, kv

    def test_a_kv_pass_gives_the_same_kv_for_less_work(self):
        report, by_pass, engine, kv = self.by_pass()
        # The default with a KV pass: 0.28 over check layers 1 and 2.
        self.assertAlmostEqual(report.ratio, 0.28, places=6)
        self.assertEqual(report.num_check_layers, 2)
        self.assertEqual(report.selected, 12)  # 42 x 0.28, rounded
        self.assertEqual(report.kv_passes, 42 + 22)  # every candidate at layer 1; 42 x 0.28^(1/2) at layer 2
        self.assertEqual(report.anchored, 0)
        # The KV pass ran at the check layers, on the candidates, without tokens past layer 0.
        self.assertEqual([(c[0], len(c[1])) for c in kv.calls], [(1, 42), (2, 22)])
        self.assertTrue(all(c[2] is None and c[3] == (len(c[1]), self.ref.dim) for c in kv.calls))
        self.assertFalse(set(kv.calls[0][1].tolist()) & set(FRESH))
        # Whole layers for every position at layer 0, then the fresh and kept ones.
        self.assertEqual([len(c[1]) for c in engine.calls], [TOTAL, 6 + 22, 6 + 12, 6 + 12, 6 + 12])
        # Work: whole rows 48 + 28 + 3 x 18, KV-pass rows 64 at KV_COST, over 5 layers x 48 positions.
        self.assertAlmostEqual(report.recompute_fraction, (48 + 28 + 3 * 18 + KV_COST * 64) / (LAYERS * TOTAL),
                               places=6)
        # The same blend with whole check layers: the same KV, bit for bit, for more work.
        whole, out, whole_engine = self.blend(ratio=0.28, check_layers=[1, 2])
        self.assertEqual(whole.kv_passes, 0)
        self.assertEqual(whole.selected, report.selected)
        self.assertEqual([len(c[1]) for c in whole_engine.calls], [TOTAL, TOTAL, 6 + 22, 6 + 12, 6 + 12])
        np.testing.assert_array_equal(by_pass, out)
        self.assertLess(report.recompute_fraction, whole.recompute_fraction)
        # And it is a blend: the query's last-layer KV nearer the full prefill's than naive reuse's.
        naive, naive_out, _ = self.blend(ratio=0.0)
        q = slice(TOTAL - len(QUERY), TOTAL)
        self.assertLess(np.abs(by_pass[-1, :, q] - self.full[-1, :, q]).max(),
                        np.abs(naive_out[-1, :, q] - self.full[-1, :, q]).max())

    def test_the_default_ratio_resolves_by_method(self):
        # Omitted (and None): CacheBlend's 0.15 at check layer 1 without a KV pass ...
        engine = Engine(self.ref)
        report = self.m.blend(NS, SEGMENTS, canonical(), layer_fn=engine, hidden_dim=self.ref.dim)
        self.assertAlmostEqual(report.ratio, 0.15, places=6)
        self.assertEqual((report.num_check_layers, report.selected, report.kv_passes), (1, 6, 0))  # 42 x 0.15
        self.assertEqual(self.blend()[0], report)
        # ... 0.28 over check layers 1 and 2 with one.
        kv = KvPass(self.ref)
        report = self.m.blend(NS, SEGMENTS, canonical(), layer_fn=Engine(self.ref), hidden_dim=self.ref.dim,
                              kv_fn=kv, kv_cost=KV_COST)
        self.assertAlmostEqual(report.ratio, 0.28, places=6)
        self.assertEqual((report.num_check_layers, report.selected), (2, 12))
        # A ratio named is the ratio used, over the method's check layers.
        report, _, _, _ = self.by_pass(ratio=0.5)
        self.assertEqual((report.ratio, report.num_check_layers, report.selected), (0.5, 2, 21))
        report, _, _ = self.blend(ratio=0.5)
        self.assertEqual((report.ratio, report.num_check_layers, report.selected), (0.5, 1, 21))

    def test_first_tokens_anchor_each_document(self):
        anchors = {1, 2, 3, 24, 25, 26}  # doc-b's first 3 positions in SEGMENTS, doc-a's
        for with_pass in (False, True):
            if with_pass:
                report, out, engine, kv = self.by_pass(first_tokens=3)
                plain = self.by_pass()[2]
                # The anchors are no candidates: the KV pass runs on the other 36.
                self.assertEqual(len(kv.calls[0][1]), 42 - 6)
                self.assertFalse(anchors & set(kv.calls[0][1].tolist()))
            else:
                report, out, engine = self.blend(first_tokens=3)
                plain = self.blend()[2]
            self.assertEqual(report.anchored, 3 * 2, with_pass)  # 3 x 2 documents
            for layer, pos, *_ in engine.calls:  # every layer recomputes them
                self.assertTrue(anchors <= set(pos.tolist()), (with_pass, layer))
            # Past the check layers: the fresh, the anchored and the selected (of the others).
            self.assertEqual(len(engine.calls[-1][1]), 6 + report.anchored + report.selected, with_pass)
            self.assertEqual(report.selected, round(36 * report.ratio), with_pass)
            # Without first_tokens they are not all recomputed.
            self.assertFalse(anchors <= set(plain.calls[-1][1].tolist()), with_pass)

    def test_match_finds_the_documents_in_a_context(self):
        self.assertEqual(len(TEXT), 51)
        self.assertEqual(self.m.match(NS, TEXT), [DOC_B_AT, DOC_A_AT])
        self.assertEqual(self.m.match(NS, TEXT), [(1, 24), (27, 46)])
        # Any form of tokens: an int32 array, a Request.
        self.assertEqual(self.m.match(NS, np.array(TEXT, np.int32)), [(1, 24), (27, 46)])
        self.assertEqual(self.m.match(NS, kdn.Request(TEXT)), [(1, 24), (27, 46)])
        # At any offset. doc-a's last chunk (3 tokens of 19, with 16-token
        # chunks) counts only right after its first chunk: alone, a few
        # tokens recur by chance (QUERY ends with those 3, doc-b holds them).
        self.assertEqual(DOC_A[16:], QUERY[2:])
        self.assertEqual(self.m.match(NS, QUESTION + DOC_A), [(5, 24)])
        self.assertEqual(self.m.match(NS, QUESTION + QUERY), [])
        self.assertEqual(self.m.match(NS, QUESTION + DOC_A[:16]), [(5, 21)])
        self.assertEqual(self.m.match(NS, QUESTION + BETWEEN), [])
        # Another namespace holds none of them.
        self.assertEqual(self.m.match("another", TEXT), [])
        # A document deleted is no longer found: its tokens are the engine's
        # to compute (doc-a's last 3 tokens inside it are not matched alone).
        self.m.knowledge_delete(NS, "doc-b")
        self.assertEqual(DOC_B[9:12], DOC_A[16:])
        self.assertEqual(self.m.match(NS, TEXT), [(27, 46)])

    def test_blend_tokens_is_blend_of_the_documents_as_segments(self):
        total = len(TEXT)
        for kv_fn in (None, KvPass(self.ref)):
            kwargs = dict(layer_fn=Engine(self.ref), hidden_dim=self.ref.dim)
            if kv_fn is not None:
                kwargs.update(kv_fn=kv_fn, kv_cost=KV_COST)
            by_text = np.full((LAYERS, 2, total, HEADS, DIM), -1.0, np.float32)
            by_segments = np.full((LAYERS, 2, total, HEADS, DIM), -2.0, np.float32)
            rt = self.m.blend_tokens(NS, TEXT, by_text, **kwargs)
            rs = self.m.blend(NS, TEXT_SEGMENTS, by_segments, **kwargs)
            self.assertEqual((rt.positions, rt.cached_positions, rt.fresh_positions), (total, 42, 9))
            self.assertEqual(rt, rs)
            np.testing.assert_array_equal(by_text, by_segments)
        # Into a raw buffer with a view stating its room, at ratio 1: the full prefill.
        raw = bytearray(total * self.m.kv_bytes_per_token)
        report = self.m.blend_tokens(NS, kdn.Request(TEXT), raw, kdn.KvView(num_tokens=total),
                                     layer_fn=Engine(self.ref), hidden_dim=self.ref.dim, ratio=1.0)
        self.assertEqual(report.selected, 42)
        np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(LAYERS, 2, total, HEADS, DIM),
                                      self.ref.prefill(TEXT))
        # A document gone: its tokens computed now.
        self.m.knowledge_delete(NS, "doc-b")
        report = self.m.blend_tokens(NS, TEXT, np.zeros((LAYERS, 2, total, HEADS, DIM), np.float32),
                                     layer_fn=Engine(self.ref), hidden_dim=self.ref.dim)
        self.assertEqual((report.cached_positions, report.fresh_positions), (19, total - 19))
        # Emulated device memory: what the host buffer got.
        self.m.knowledge_put(NS, "doc-b", DOC_B, self.alone["doc-b"])
        host = np.zeros((LAYERS, 2, total, HEADS, DIM), np.float32)
        dev = np.zeros_like(host)
        self.m.blend_tokens(NS, TEXT, host, layer_fn=Engine(self.ref), hidden_dim=self.ref.dim)
        report = self.m.blend_tokens(NS, TEXT, CudaArray(dev, stream=9), layer_fn=Engine(self.ref),
                                     hidden_dim=self.ref.dim)
        self.assertEqual(report.cached_positions, 42)
        np.testing.assert_array_equal(dev, host)

    def test_refused(self):
        engine, kv = Engine(self.ref), KvPass(self.ref)
        # kdn's own message: a KV pass without its cost, or a cost outside (0, 1].
        for cost in (None, 0.0, 1.5):
            with self.assertRaises(kdn.InvalidArgumentError, msg=cost) as cm:
                self.m.blend(NS, SEGMENTS, canonical(), layer_fn=engine, hidden_dim=self.ref.dim, kv_fn=kv,
                             kv_cost=cost)
            self.assertEqual(str(cm.exception), "blend options: with kv_fn, kv_cost (its work per position over a "
                                                "whole layer's) must be in (0, 1]")
            self.assertEqual(cm.exception.status, kdn.Status.INVALID_ARGUMENT)
            with self.assertRaises(kdn.InvalidArgumentError) as cm:
                self.m.blend_tokens(NS, TEXT, canonical(), layer_fn=engine, hidden_dim=self.ref.dim, kv_fn=kv,
                                    kv_cost=cost)
            self.assertIn("kv_cost", str(cm.exception))
        # The binding's: a cost without a pass, a pass that is not callable, a negative first_tokens.
        for bad in (dict(kv_cost=0.1), dict(kv_fn=3, kv_cost=0.1), dict(first_tokens=-1), dict(ratio="x")):
            with self.assertRaises(kdn.InvalidArgumentError, msg=bad):
                self.m.blend(NS, SEGMENTS, canonical(), layer_fn=engine, hidden_dim=self.ref.dim, **bad)
        with self.assertRaises(kdn.InvalidArgumentError) as cm:  # kdn's: ratio outside [0, 1] (-1 is the default)
            self.m.blend(NS, SEGMENTS, canonical(), layer_fn=engine, hidden_dim=self.ref.dim, ratio=-0.5)
        self.assertEqual(cm.exception.status, kdn.Status.INVALID_ARGUMENT)
        self.assertEqual((engine.calls, kv.calls), ([], []))
        # match and blend_tokens: no tokens, block hashes, room for fewer than the context.
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.match(NS, [])
        hashes = kdn.Request.from_block_hashes(bytes(64), 32, 16)
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            self.m.match(NS, hashes)
        self.assertIn("block hashes", str(cm.exception))
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.blend_tokens(NS, hashes, canonical(), layer_fn=engine, hidden_dim=self.ref.dim)
        with self.assertRaises(kdn.InvalidArgumentError):
            self.m.blend_tokens(NS, [], canonical(), layer_fn=engine, hidden_dim=self.ref.dim)
        with self.assertRaises(kdn.Error):
            self.m.blend_tokens(NS, TEXT, bytearray(canonical().nbytes), kdn.KvView(num_tokens=TOTAL),
                                layer_fn=engine, hidden_dim=self.ref.dim)
        self.assertEqual(engine.calls, [])
        # A closed model.
        self.m.close()
        with self.assertRaises(kdn.ClosedError):
            self.m.match(NS, TEXT)

    def test_an_exception_in_the_kv_pass_is_raised_by_blend(self):
        class Boom(Exception):
            pass

        boom = Boom("KV pass failed")
        kv = KvPass(self.ref, fail_at=2, error=boom)
        with self.assertRaises(Boom) as cm:
            self.blend(kv_fn=kv, kv_cost=KV_COST)
        self.assertIs(cm.exception, boom)
        self.assertEqual([c[0] for c in kv.calls], [1, 2])  # the blend stopped there
        with self.assertRaises(Boom):
            self.m.blend_tokens(NS, TEXT, np.zeros((LAYERS, 2, len(TEXT), HEADS, DIM), np.float32),
                                layer_fn=Engine(self.ref), hidden_dim=self.ref.dim,
                                kv_fn=KvPass(self.ref, fail_at=1, error=boom), kv_cost=KV_COST)
        report, _, _, _ = self.by_pass()  # and the model goes on
        self.assertEqual(report.selected, 12)

    def test_the_gate_blends_only_a_method_measured_good_enough(self):
        # A calibration file (as `kdn blend calibrate` writes): this model's
        # default KV-pass method measured good, CacheBlend's default not.
        fd, gate = tempfile.mkstemp(suffix=".gate")
        self.addCleanup(os.remove, gate)
        with os.fdopen(fd, "w") as f:
            f.write("# fingerprint method kl_ratio ...\n"
                    f"{self.m.fingerprint} ratio=0.28 checks=1,2 kv_pass=1 first=0 kl_ratio=0.11 top1=0.97 f=0.4 "
                    f"contexts=8\n"
                    f"{self.m.fingerprint} ratio=0.15 checks=1 kv_pass=0 first=0 kl_ratio=0.31 top1=0.9 f=0.2 "
                    f"contexts=8\n")
        # With kv_fn and the defaults (max_kl_ratio 0.2): 0.11 passes, the blend runs as without a gate.
        report, out, _, _ = self.by_pass(gate_file=gate)
        plain, plain_out, _, _ = self.by_pass()
        self.assertFalse(report.gated)
        self.assertAlmostEqual(report.gate_kl_ratio, 0.11, places=6)
        self.assertEqual(report[:9], plain[:9])
        self.assertEqual((plain.gated, plain.gate_kl_ratio), (False, -1.0))  # no gate
        np.testing.assert_array_equal(out, plain_out)
        self.assertLess(report.recompute_fraction, 1.0)
        # Without kv_fn (CacheBlend, 0.31 > 0.2): gated, every position recomputed, the KV the full prefill's.
        for path in (gate, gate.encode()):  # a str or bytes path
            report, out, engine = self.blend(gate_file=path)
            self.assertTrue(report.gated)
            self.assertAlmostEqual(report.gate_kl_ratio, 0.31, places=6)
            self.assertEqual(report.recompute_fraction, 1.0)
            self.assertEqual([len(c[1]) for c in engine.calls], [TOTAL] * LAYERS)
            np.testing.assert_array_equal(out, self.full)
        # A looser bound lets it blend; a method the file has no record of is gated (-1).
        report, _, _ = self.blend(gate_file=gate, max_kl_ratio=0.35)
        self.assertEqual((report.gated, report.selected), (False, 6))
        self.assertAlmostEqual(report.gate_kl_ratio, 0.31, places=6)
        report, out, _ = self.blend(gate_file=gate, ratio=0.5)
        self.assertEqual((report.gated, report.gate_kl_ratio, report.recompute_fraction), (True, -1.0, 1.0))
        np.testing.assert_array_equal(out, self.full)
        # blend_tokens takes the gate too: 0.11 above a bound of 0.1 is gated.
        out = np.zeros((LAYERS, 2, len(TEXT), HEADS, DIM), np.float32)
        report = self.m.blend_tokens(NS, TEXT, out, layer_fn=Engine(self.ref), hidden_dim=self.ref.dim,
                                     kv_fn=KvPass(self.ref), kv_cost=KV_COST, gate_file=gate, max_kl_ratio=0.1)
        self.assertTrue(report.gated)
        self.assertAlmostEqual(report.gate_kl_ratio, 0.11, places=6)
        np.testing.assert_array_equal(out, self.ref.prefill(TEXT))
        # A file that is not there, or not a gate file: InvalidArgumentError, nothing blended.
        missing = gate + ".missing"
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            self.blend(gate_file=missing)
        self.assertIn(missing, str(cm.exception))
        with self.assertRaises(kdn.InvalidArgumentError):
            self.blend(gate_file="")
        bad = gate + ".bad"
        with open(bad, "w") as f:
            f.write("not-a-fingerprint ratio=0.15 checks=1 kl_ratio=0.1\n")
        self.addCleanup(os.remove, bad)
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            self.blend(gate_file=bad)
        self.assertIn("fingerprint", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
