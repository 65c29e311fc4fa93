# SPDX-License-Identifier: Apache-2.0
"""GPU arrays as KV memory (since 1.5): objects with __cuda_array_interface__
and DLPack producers, on the emulated device (host memory standing in for
the GPU's), carrying the reference model's real KV: what goes through them
equals, bit for bit, what goes through numpy arrays; the DLPack contract is
kept (capsule renamed, deleter called once kdn is done); wrong element
types, shapes, strides and devices are refused before kdn sees them."""
import sys
import unittest

import numpy as np

import kdn
from _devarrays import KDL_ROCM, CudaArray, DLPackCuda, DLPackOnly, capsule_name_is
import _refmodel

LAYERS, HEADS, DIM, POSITIONS = 5, 4, 8, 48
TOKEN = HEADS * DIM
# The engine's KV as kdn generate --dump-kv writes it: K of every layer, then
# V ([k|v][layer][position][head][dim]), described by strides.
WHERE = dict(stride_layer=POSITIONS * TOKEN, stride_kv=LAYERS * POSITIONS * TOKEN, stride_token=TOKEN,
             stride_head=DIM, stride_dim=1)


def reference():
    if not _refmodel.present():
        if _refmodel.required():
            raise AssertionError(f"reference model missing at {_refmodel.MODELS} and KDN_REQUIRE_MODELS=1")
        raise unittest.SkipTest(f"reference model not found at {_refmodel.MODELS} (set KDN_MODELS)")
    ids, k, v = _refmodel.reference_kv()
    return ids, np.stack([k, v])


def runtime(device=kdn.DeviceMode.EMULATED, **kwargs):
    return kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(16 << 20)], device=device, **kwargs)


def model(rt, dtype=kdn.DType.F32):
    return rt.model(num_layers=LAYERS, num_kv_heads=HEADS, head_dim=DIM, dtype=dtype, fingerprint="stories260K")


def canonical(fill=np.nan, dtype=np.float32):
    return np.full((LAYERS, 2, POSITIONS, HEADS, DIM), fill, dtype)


def bits(a):
    return a.view(np.uint32 if a.itemsize == 4 else np.uint16)


class RoundTripTest(unittest.TestCase):
    """Store from one kind of array, retrieve into another; compare with the
    numpy path."""

    @classmethod
    def setUpClass(cls):
        cls.ids, cls.engine = reference()

    def setUp(self):
        self.rt = runtime()
        self.m = model(self.rt)
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)
        # The numpy path: what every other path must equal.
        self.assertEqual(self.m.store("host", self.ids, self.engine, kdn.KvView(**WHERE)).tokens, POSITIONS)
        self.want = canonical()
        self.assertEqual(self.m.retrieve("host", self.ids, self.want).tokens, POSITIONS)
        np.testing.assert_array_equal(self.want, self.engine.transpose(1, 0, 2, 3, 4))

    def test_cuda_array_interface(self):
        src = self.engine.copy()
        got = self.m.store("cai", self.ids, CudaArray(src, stream=7), kdn.KvView(**WHERE))
        self.assertEqual((got.tokens, got.state), (POSITIONS, kdn.OpState.DONE))
        self.assertEqual(self.m.lookup("cai", self.ids).cached_tokens, POSITIONS)
        out = canonical()
        got = self.m.retrieve("cai", self.ids, CudaArray(out, stream=7))
        self.assertEqual((got.tokens, got.covered), (POSITIONS, POSITIONS))
        np.testing.assert_array_equal(bits(out), bits(self.want))
        # It went through the device path: the tier measured its delivery
        # into device views (and into host views for the numpy retrieve).
        t = self.rt.tier_stats(0)
        self.assertGreater(t.device_delivery_ns_per_token, 0.0)
        self.assertGreater(t.delivery_ns_per_token, 0.0)
        # Version 2 (no stream), and a read-only array to store from.
        out2 = canonical()
        self.assertEqual(self.m.store("cai2", self.ids, CudaArray(src, version=2, readonly=True),
                                      kdn.KvView(**WHERE)).tokens, POSITIONS)
        self.assertEqual(self.m.retrieve("cai2", self.ids, CudaArray(out2, version=2)).tokens, POSITIONS)
        np.testing.assert_array_equal(bits(out2), bits(self.want))
        # A device retrieve and a host store mix: the numpy store's KV into a device array.
        out3 = canonical()
        self.assertEqual(self.m.retrieve("host", self.ids, CudaArray(out3)).tokens, POSITIONS)
        np.testing.assert_array_equal(bits(out3), bits(self.want))

    def test_dlpack_cuda(self):
        src = DLPackCuda(self.engine.copy())
        before = sys.getrefcount(src.a)
        self.assertEqual(self.m.store("dl", self.ids, src, kdn.KvView(**WHERE)).tokens, POSITIONS)
        out = DLPackCuda(canonical())
        self.assertEqual(self.m.retrieve("dl", self.ids, out, stream=0x5000).tokens, POSITIONS)
        np.testing.assert_array_equal(bits(out.a), bits(self.want))
        # The contract: the capsule was consumed (renamed) and its deleter
        # ran (numpy's, which releases the array it held).
        for producer in (src, out):
            self.assertEqual(len(producer.capsules), 1)
            self.assertTrue(capsule_name_is(producer.capsules[0], b"used_dltensor"))
        self.assertEqual(sys.getrefcount(src.a), before)
        # The producer was asked for its tensor on the call's stream; none
        # named: the legacy default stream (1), as DLPack's consumers do.
        self.assertEqual(src.streams, [1])
        self.assertEqual(out.streams, [0x5000])

    def test_numpy_dlpack_is_host_memory(self):
        # numpy's own producer (kDLCPU) behind an object without the buffer
        # protocol, as a torch CPU tensor is: a host view, on a runtime
        # without a device too.
        self.assertEqual(np.asarray(self.engine).__dlpack_device__(), (1, 0))
        with runtime(kdn.DeviceMode.NONE) as rt, model(rt) as m:
            src = DLPackOnly(self.engine.copy())
            before = sys.getrefcount(src.a)
            self.assertEqual(m.store("cpu", self.ids, src, kdn.KvView(**WHERE)).tokens, POSITIONS)
            out = DLPackOnly(canonical())
            self.assertEqual(m.retrieve("cpu", self.ids, out).tokens, POSITIONS)
            np.testing.assert_array_equal(bits(out.a), bits(self.want))
            self.assertTrue(capsule_name_is(src.capsules[0], b"used_dltensor"))
            self.assertEqual(sys.getrefcount(src.a), before)
            with self.assertRaises(kdn.InvalidArgumentError) as cm:  # host memory has no stream
                m.retrieve("cpu", self.ids, DLPackOnly(canonical()), stream=3)
            self.assertIn("stream", str(cm.exception))
            self.assertEqual(rt.tier_stats(0).device_delivery_ns_per_token, 0.0)

    def test_async_ops_hold_the_tensor_until_closed(self):
        out = DLPackCuda(canonical())
        before = sys.getrefcount(out.a)
        with self.m.load_async("host", self.ids, out) as op:
            self.assertTrue(op.wait(10))
            for layer in range(LAYERS):
                self.assertTrue(op.wait_layer(layer, 10))
            self.assertEqual(op.result().tokens, POSITIONS)
            self.assertGreater(sys.getrefcount(out.a), before)  # the DLPack tensor is still held
        self.assertEqual(sys.getrefcount(out.a), before)  # closed: given back (the deleter ran)
        np.testing.assert_array_equal(bits(out.a), bits(self.want))
        # A save from a device array, layer by layer, then a load of it.
        src = CudaArray(self.engine.copy())
        with self.m.save_async("saved", self.ids, src, kdn.KvView(**WHERE)) as op:
            for layer in range(LAYERS):
                op.layer_ready(layer)
            self.assertTrue(op.wait(10))
            self.assertEqual(op.result().tokens, POSITIONS)
        back = canonical()
        with self.m.load_async("saved", self.ids, CudaArray(back), ttft_target_us=50_000) as op:
            self.assertTrue(op.wait(10))
        np.testing.assert_array_equal(bits(back), bits(self.want))

    def test_f16_and_bf16_element_types(self):
        half = self.engine.astype(np.float16)
        with model(self.rt, kdn.DType.F16) as m:
            self.assertEqual(m.store("f16", self.ids, CudaArray(half), kdn.KvView(**WHERE)).tokens, POSITIONS)
            out = canonical(0, np.uint16)  # float16 as 16-bit ints, as buffers may be
            self.assertEqual(m.retrieve("f16", self.ids, CudaArray(out)).tokens, POSITIONS)
            np.testing.assert_array_equal(out, half.transpose(1, 0, 2, 3, 4).view(np.uint16))
            with self.assertRaises(kdn.InvalidArgumentError):
                m.retrieve("f16", self.ids, CudaArray(canonical()))  # float32 into an F16 model
        # bfloat16 (DLPack type code kDLBfloat): its bits as uint16.
        bf16 = (self.engine.view(np.uint32) >> 16).astype(np.uint16)
        with model(self.rt, kdn.DType.BF16) as m:
            self.assertEqual(m.store("bf16", self.ids, DLPackCuda(bf16, bfloat16=True),
                                     kdn.KvView(**WHERE)).tokens, POSITIONS)
            out = DLPackCuda(canonical(0, np.uint16), bfloat16=True)
            self.assertEqual(m.retrieve("bf16", self.ids, out).tokens, POSITIONS)
            np.testing.assert_array_equal(out.a, bf16.transpose(1, 0, 2, 3, 4))
            # torch has no __cuda_array_interface__ typestr for bfloat16 and
            # raises there: its DLPack describes the tensor instead.
            class TorchBf16(DLPackCuda):
                @property
                def __cuda_array_interface__(self):
                    raise TypeError("Got unsupported ScalarType BFloat16")
            out = TorchBf16(canonical(0, np.uint16), bfloat16=True)
            self.assertEqual(m.retrieve("bf16", self.ids, out).tokens, POSITIONS)
            np.testing.assert_array_equal(out.a, bf16.transpose(1, 0, 2, 3, 4))
            self.assertEqual(len(out.capsules), 1)
            bad = DLPackCuda(canonical(0, np.float16))
            before = sys.getrefcount(bad.a)
            with self.assertRaises(kdn.InvalidArgumentError) as cm:  # float16 is not bfloat16
                m.retrieve("bf16", self.ids, bad)
            self.assertIn("BF16", str(cm.exception))
            self.assertEqual(sys.getrefcount(bad.a), before)  # refused after it was consumed: deleted too


class RefusedTest(unittest.TestCase):
    """What is checked before kdn sees the memory, and what kdn refuses."""

    @classmethod
    def setUpClass(cls):
        cls.ids, cls.engine = reference()

    def setUp(self):
        self.rt = runtime()
        self.m = model(self.rt)
        self.addCleanup(self.rt.close)
        self.addCleanup(self.m.close)
        self.m.store("ns", self.ids, self.engine, kdn.KvView(**WHERE))

    def refused(self, array, *, error=kdn.InvalidArgumentError, text="", call="retrieve", **kwargs):
        with self.assertRaises(error) as cm:
            if call == "retrieve":
                self.m.retrieve("ns", self.ids, array, **kwargs)
            else:
                self.m.store("other", self.ids, array, **kwargs)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def test_element_types(self):
        e = self.refused(CudaArray(canonical().astype(np.float64)), text="F32")
        self.assertIsInstance(e, ValueError)
        self.refused(CudaArray(canonical(), typestr=">f4"), text="little-endian")
        self.refused(CudaArray(canonical(), typestr="<c8"), text="F32")
        # bytes fit any model, as in the buffer path
        raw = canonical().view(np.uint8)
        self.assertEqual(self.m.retrieve("ns", self.ids, CudaArray(raw), kdn.KvView()).tokens, POSITIONS)

    def test_strides_and_shapes(self):
        # Not C-contiguous: K and V of each layer interleaved by token.
        t = np.zeros((LAYERS, POSITIONS, 2, HEADS, DIM), np.float32).transpose(0, 2, 1, 3, 4)
        strides = tuple(s for s in t.strides)
        self.refused(CudaArray(t, strides=strides), text="C-contiguous")
        # Explicit C strides, and any stride on a dimension of one element, are fine.
        c = canonical()
        self.assertEqual(self.m.retrieve("ns", self.ids, CudaArray(c, strides=c.strides)).tokens, POSITIONS)
        one = canonical()[None]
        odd = (12345,) + one.strides[1:]
        self.assertEqual(self.m.retrieve("ns", self.ids, CudaArray(one, strides=odd), kdn.KvView()).tokens,
                         POSITIONS)
        # The canonical view and a 5-dimensional array of another shape.
        self.refused(CudaArray(np.zeros((LAYERS, 2, POSITIONS, DIM, HEADS), np.float32)), text="canonical layout")
        self.refused(CudaArray(np.zeros((LAYERS, 2, 64, HEADS, DIM), np.float32)), text="(5, 2, 48, 4, 8)")
        # With its own view the array's shape is the engine's business.
        flat = np.zeros(LAYERS * 2 * 64 * TOKEN, np.float32)
        self.assertEqual(self.m.retrieve("ns", self.ids, CudaArray(flat), kdn.KvView(num_tokens=64)).tokens,
                         POSITIONS)
        # Too small for the request: kdn's own bound check.
        self.refused(CudaArray(np.zeros(100, np.float32)))

    def test_read_only_and_streams(self):
        self.refused(CudaArray(canonical(), readonly=True), text="read-only")
        self.refused(CudaArray(canonical(), stream=0), text="stream 0")
        self.refused(CudaArray(canonical(), stream=5), text="one stream per call", stream=6)
        self.refused(canonical(), text="stream is for device memory", stream=6)
        self.refused(CudaArray(canonical()), text="CUDA stream", stream="default")
        # The same stream named twice is fine.
        self.assertEqual(self.m.retrieve("ns", self.ids, CudaArray(canonical(), stream=5), stream=5).tokens,
                         POSITIONS)

    def test_devices(self):
        self.refused(DLPackCuda(canonical(), device_id=1), text="device 1")
        rocm = DLPackCuda(canonical(), device_type=KDL_ROCM)
        self.refused(rocm, error=kdn.UnsupportedError, text="kDLROCM")
        self.assertEqual(rocm.capsules, [])  # refused before a tensor was asked for
        # A runtime without a device: kdn refuses device memory
        # (KDN_ERR_UNSUPPORTED), and the DLPack tensor is given back.
        with runtime(kdn.DeviceMode.NONE) as rt, model(rt) as m:
            with self.assertRaises(kdn.UnsupportedError) as cm:
                m.store("ns", self.ids, CudaArray(self.engine), kdn.KvView(**WHERE))
            self.assertEqual(cm.exception.status, kdn.Status.UNSUPPORTED)
            self.assertIn("no device", str(cm.exception))
            self.assertIsInstance(cm.exception, NotImplementedError)
            out = DLPackCuda(canonical())
            before = sys.getrefcount(out.a)
            with self.assertRaises(kdn.UnsupportedError):
                m.retrieve("ns", self.ids, out)
            self.assertEqual(sys.getrefcount(out.a), before)
            with self.assertRaises(kdn.UnsupportedError):
                m.load_async("ns", self.ids, out).close()
            self.assertEqual(sys.getrefcount(out.a), before)
        # The knowledge calls take host buffers only.
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            self.m.knowledge_put("ns", "doc", self.ids, CudaArray(self.engine), kdn.KvView(**WHERE))
        self.assertIn("knowledge", str(cm.exception))

    def test_malformed_interfaces(self):
        class Bad:
            __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4"}  # no data
        self.refused(Bad(), text="malformed")

        class NotACapsule:
            def __dlpack_device__(self):
                return (2, 0)

            def __dlpack__(self, stream=None):
                return b"not a capsule"
        self.refused(NotACapsule(), text="capsule")
        used = DLPackCuda(canonical())
        self.m.retrieve("ns", self.ids, used)
        used.__dlpack__ = lambda stream=None: used.capsules[0]  # hands out the consumed capsule again
        self.refused(used, text="unused DLPack capsule")


class StreamMappingTest(unittest.TestCase):
    """The stream each kind of array gives the view's cuda_stream (with the
    emulated device kdn accepts and ignores any: seen here, before kdn)."""

    def test_streams(self):
        with runtime() as rt, model(rt) as m:
            def native(obj, stream=None):
                f = kdn._arrays.foreign(obj, m, True, None, stream, kdn.kdn_swig.Memory)
                with f:
                    return f.native.kind, f.native.cuda_stream, f.native.bytes

            a = canonical()
            self.assertEqual(native(CudaArray(a, stream=0x1234)), (int(kdn.MemoryKind.DEVICE), 0x1234, a.nbytes))
            self.assertEqual(native(CudaArray(a, stream=None)), (1, 0, a.nbytes))
            self.assertEqual(native(CudaArray(a, stream=0x1234, version=2)), (1, 0, a.nbytes))  # v2 has none

            class TorchLikeStream:
                cuda_stream = 0x77

            class CupyLikeStream:
                ptr = 0x78
            self.assertEqual(native(CudaArray(a), TorchLikeStream()), (1, 0x77, a.nbytes))
            self.assertEqual(native(CudaArray(a), CupyLikeStream()), (1, 0x78, a.nbytes))
            self.assertEqual(native(DLPackCuda(a)), (1, 1, a.nbytes))
            self.assertEqual(native(DLPackCuda(a), 2), (1, 2, a.nbytes))
            self.assertEqual(native(DLPackOnly(a)), (int(kdn.MemoryKind.HOST), 0, a.nbytes))
            self.assertIsNone(kdn._arrays.foreign(a, m, True, None, None, kdn.kdn_swig.Memory))  # a buffer


if __name__ == "__main__":
    unittest.main()
