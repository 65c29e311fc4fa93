# SPDX-License-Identifier: Apache-2.0
"""The editor: Python code kdn's mover thread calls (a SWIG director, under
the GIL) on each stored chunk."""
import gc
import sys
import threading
import time
import unittest

import numpy as np

import kdn
from _common import CHUNK, DIM, HEADS, LAYERS, NS, canonical_kv, model, runtime, tokens


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


class AddOne(kdn.Editor):
    """Adds 1 to V of layer 0 in every chunk."""

    def __init__(self):
        self.calls = []
        self.threads = set()

    def edit(self, info, kv):
        self.threads.add(threading.get_ident())
        self.calls.append(info)
        a = np.frombuffer(kv, np.float32).reshape(info.num_layers, 2, info.num_tokens, info.num_kv_heads,
                                                  info.head_dim)
        a[0, 1] += 1.0
        return True


class EditorTest(unittest.TestCase):
    def test_editor_subclass_edits_kv_on_the_mover_thread(self):
        editor = AddOne()
        n = 2 * CHUNK
        kv = canonical_kv(n)
        with runtime(editor=editor) as rt, model(rt) as m:
            m.store(NS, tokens(n), kv)
            self.assertTrue(wait_for(lambda: rt.stats().edits == 2), rt.stats())
            self.assertEqual(len(editor.calls), 2)
            info = editor.calls[0]
            self.assertIsInstance(info, kdn.ChunkInfo)
            self.assertEqual((info.num_layers, info.num_kv_heads, info.head_dim, info.num_tokens, info.dtype),
                             (LAYERS, HEADS, DIM, CHUNK, kdn.DType.F32))
            self.assertEqual(sorted(c.first_position for c in editor.calls), [0, CHUNK])
            self.assertNotIn(threading.get_ident(), editor.threads)  # kdn's thread, not ours
            out = np.zeros_like(kv)
            self.assertEqual(m.retrieve(NS, tokens(n), out).tokens, n)
            want = kv.copy()
            want[0, 1] += 1.0
            np.testing.assert_array_equal(out, want)
            self.assertEqual(rt.stats().edited_served, 2)

    def test_callable_editor_that_changes_nothing(self):
        seen = []

        def look(info, kv):
            seen.append(len(kv))
            kv[:] = bytes(len(kv))  # scribbles, but says it changed nothing
            return False

        kv = canonical_kv(CHUNK)
        with runtime(editor=look) as rt, model(rt) as m:
            m.store(NS, tokens(CHUNK), kv)
            self.assertTrue(wait_for(lambda: len(seen) == 1))
            self.assertEqual(seen, [kv.nbytes])
            time.sleep(0.05)
            self.assertEqual(rt.stats().edits, 0)

    def test_kv_view_is_released_after_the_call(self):
        kept = []
        with runtime(editor=lambda info, kv: kept.append(kv)) as rt, model(rt) as m:
            m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
            self.assertTrue(wait_for(lambda: kept))
        with self.assertRaises(ValueError):  # released: no access to kdn's memory after the call
            kept[0][0]

    def test_array_kept_past_the_call_never_aliases_kdn_memory(self):
        # numpy.frombuffer(kv) kept by the editor: an export Python cannot
        # revoke. It must not reach kdn's memory after the call (it did: a
        # write through it changed the stored chunk, or freed memory).
        kept = []

        def edit(info, kv):
            a = np.frombuffer(kv, np.float32)
            a += 1.0
            kept.append(a)
            return True

        n = 2 * CHUNK
        kv = canonical_kv(n)
        with runtime(editor=edit) as rt, model(rt) as m:
            m.store(NS, tokens(n), kv)
            self.assertTrue(wait_for(lambda: rt.stats().edits == 2), rt.stats())
            for a in kept:
                a[:] = -7.0  # after the call
            out = np.zeros_like(kv)
            self.assertEqual(m.retrieve(NS, tokens(n), out).tokens, n)
            np.testing.assert_array_equal(out, kv + 1.0)  # the edit made during the call, nothing after

    def test_runtime_dropped_without_close(self):
        editor = AddOne()
        rt = runtime(editor=editor)
        m = model(rt)
        m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
        self.assertTrue(wait_for(lambda: editor.calls))  # the chunk was edited while both lived
        del rt, m
        gc.collect()  # closed by the backstop, the model first: the editor outlived both
        self.assertEqual(len(editor.calls), 1)

    def test_editor_calling_kdn_is_refused_not_deadlocked(self):
        handles = []
        seen = []

        def reenter(info, kv):
            try:
                handles[0].lookup(NS, tokens(CHUNK))
                seen.append("returned")
            except kdn.InvalidArgumentError as e:  # kdn refuses: it could wait for this very thread
                seen.append(e.status)
            return False

        with runtime(editor=reenter, tiers=kdn.Tier.host(1 << 20)) as rt, model(rt) as m:
            handles.append(m)
            m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
            self.assertTrue(wait_for(lambda: seen))
            self.assertEqual(seen, [kdn.Status.INVALID_ARGUMENT])
            self.assertEqual(m.lookup(NS, tokens(CHUNK)).cached_tokens, CHUNK)

    def test_editor_must_be_callable(self):
        with self.assertRaises(kdn.InvalidArgumentError):
            kdn.Runtime(editor=42)


class RaisingEditorTest(unittest.TestCase):
    def test_bad_editor_raises(self):
        """An editor that raises: reported via sys.unraisablehook, the chunk
        stays as stored, no edit is counted, and the runtime goes on."""
        reported = []
        done = threading.Event()

        def hook(unraisable):
            reported.append((unraisable.exc_type, str(unraisable.exc_value)))
            done.set()

        def boom(info, kv):
            kv[:8] = b"\xff" * 8  # scribbles first: kdn must drop it
            raise RuntimeError("editor failed on purpose")

        old = sys.unraisablehook
        sys.unraisablehook = hook
        try:
            kv = canonical_kv(CHUNK)
            with runtime(editor=boom) as rt, model(rt) as m:
                m.store(NS, tokens(CHUNK), kv)
                self.assertTrue(done.wait(10))
                out = np.zeros_like(kv)
                self.assertEqual(m.retrieve(NS, tokens(CHUNK), out).tokens, CHUNK)
                np.testing.assert_array_equal(out, kv)
                self.assertEqual(rt.stats().edits, 0)
                # Still working: another store, lookup and retrieve.
                m.store(NS, tokens(CHUNK, 100), kv)
                self.assertTrue(wait_for(lambda: len(reported) == 2))
                self.assertEqual(m.lookup(NS, tokens(CHUNK, 100)).cached_tokens, CHUNK)
        finally:
            sys.unraisablehook = old
        self.assertEqual(reported[0], (RuntimeError, "editor failed on purpose"))

    def test_editor_returning_garbage(self):
        # A return value that is not a bool: its truth value is used.
        with runtime(editor=lambda info, kv: "yes") as rt, model(rt) as m:
            m.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
            self.assertTrue(wait_for(lambda: rt.stats().edits == 1))


if __name__ == "__main__":
    unittest.main()
