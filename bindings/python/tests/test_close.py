# SPDX-License-Identifier: Apache-2.0
"""close() from any thread at any time: calls in flight on the handle are
waited for (a wait on an op ends at once with ClosedError), later calls raise
ClosedError; a close on kdn's mover thread (inside an editor) is done on
another thread."""
import subprocess
import sys
import threading
import time
import unittest
from unittest import mock

import kdn
from _common import CHUNK, NS, canonical_kv, model, runtime, tokens


class CloseWhileInFlightTest(unittest.TestCase):
    def test_close_an_op_while_threads_wait_on_it(self):
        # A save none of whose layers is ready cannot end: the waiters block
        # in kdn until the close. They must leave with ClosedError before the
        # op is freed (it was freed under them: a use after free).
        with runtime() as rt, model(rt) as m:
            for round_ in range(3):
                op = m.save_async(NS, tokens(CHUNK, 100 * round_), canonical_kv(CHUNK))
                got = []
                entered = threading.Barrier(4)

                def waiter(call):
                    entered.wait()
                    try:
                        got.append(call())
                    except Exception as e:  # checked below
                        got.append(e)

                threads = [threading.Thread(target=waiter, args=(call,))
                           for call in (op.wait, lambda: op.wait(timeout=60), lambda: op.wait(None))]
                for t in threads:
                    t.start()
                entered.wait()
                time.sleep(0.1)  # the waiters are inside kdn's waits
                start = time.monotonic()
                op.close()
                took = time.monotonic() - start
                for t in threads:
                    t.join(10)
                self.assertFalse(any(t.is_alive() for t in threads), "a wait outlived the close")
                self.assertEqual(len(got), 3, got)
                for e in got:
                    self.assertIsInstance(e, kdn.ClosedError)
                    self.assertIn("closed", str(e))
                self.assertLess(took, 5.0)
                self.assertTrue(op.closed)
                with self.assertRaises(kdn.ClosedError):
                    op.wait()
                self.assertEqual(m.lookup(NS, tokens(CHUNK, 100 * round_)).cached_tokens, 0)

    def test_wait_with_a_timeout_still_times_out(self):
        # Waits run in slices now: the limit is kept, neither cut short nor
        # stretched into a hang.
        with runtime() as rt, model(rt) as m, m.save_async(NS, tokens(CHUNK), canonical_kv(CHUNK)) as op:
            start = time.monotonic()
            self.assertFalse(op.wait(timeout=0.15))
            self.assertGreaterEqual(time.monotonic() - start, 0.14)
            self.assertFalse(op.wait(timeout=0))

    def test_close_while_threads_loop_calls(self):
        # Threads loop lookups (on the model) and stats (on the runtime)
        # while the main thread closes the runtime, then the model: no
        # crash, model calls go on after the runtime's close (the model
        # keeps kdn's runtime alive), and every loop ends with ClosedError.
        n = 64 * CHUNK  # long requests: each lookup stays a while inside kdn
        for round_ in range(5):
            rt = runtime()
            m = model(rt)
            m.store(NS, tokens(n), canonical_kv(n))
            req = kdn.Request(tokens(n))
            ended = {}
            calls = {}
            running = threading.Barrier(5)

            def loop(name, call):
                calls[name] = 0
                try:
                    call()
                    calls[name] += 1
                    running.wait(10)
                    while True:
                        call()
                        calls[name] += 1
                except kdn.ClosedError as e:
                    ended[name] = e
                except Exception as e:  # checked below
                    ended[name] = e

            loops = {
                "lookup": lambda: m.lookup(NS, req),
                "batch": lambda: m.lookup_batch(NS, [req] * 8),
                "stats": rt.stats,
                "tier_stats": lambda: rt.tier_stats(0),
            }
            threads = [threading.Thread(target=loop, args=item) for item in loops.items()]
            for t in threads:
                t.start()
            running.wait(10)
            time.sleep(0.01)
            rt.close()
            before = calls["lookup"]
            # The model's calls go on after the runtime's close.
            deadline = time.monotonic() + 10
            while calls["lookup"] <= before + 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            after = calls["lookup"]
            m.close()
            for t in threads:
                t.join(10)
            self.assertFalse(any(t.is_alive() for t in threads))
            for name in loops:
                self.assertIsInstance(ended.get(name), kdn.ClosedError, (round_, name, ended.get(name)))
            self.assertGreater(after, before, "the model's calls stopped with the runtime's close")


# Run in a fresh interpreter: without the fix kdn destroys the runtime on its
# own mover thread (an abort), and the finalizers must be the last references.
_DROPPED_IN_EDITOR = r"""
import threading, time, numpy as np, kdn
from kdn import kdn_swig

closes = []
for cls in (kdn_swig.Runtime, kdn_swig.Model):
    def close(self, orig=cls.close, name=cls.__name__):
        orig(self)
        closes.append((name, threading.get_ident()))
    cls.close = close

held = []
ready, done = threading.Event(), threading.Event()
mover = []

def edit(info, kv):
    mover.append(threading.get_ident())
    ready.wait(10)
    held.clear()  # the last references: the finalizers of the model and the runtime run here
    done.set()
    return False

rt = kdn.Runtime(chunk_tokens=16, editor=edit)
m = rt.model(num_layers=1, num_kv_heads=1, head_dim=4, fingerprint="fin")
m.store("ns", list(range(16)), np.zeros(16 * 8, np.float32))
held += [m, rt]
del m, rt
ready.set()
assert done.wait(10), "the editor did not run"
deadline = time.monotonic() + 10
while len(closes) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
names = sorted(name for name, _ in closes)
assert names == ["Model", "Runtime"], closes
assert all(thread != mover[0] for _, thread in closes), "closed on kdn's mover thread"
print("closed off the mover thread")
"""


class CloseInEditorTest(unittest.TestCase):
    def test_editor_drops_the_last_references(self):
        out = subprocess.run([sys.executable, "-c", _DROPPED_IN_EDITOR], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "closed off the mover thread")
        self.assertEqual(out.stderr, "")

    def test_editor_closes_an_op_and_a_model(self):
        # An explicit close inside the editor: handed over as well (an op's
        # or a model's close waits, and kdn's mover thread must not); the
        # handles read as closed at once, and are closed soon after.
        seen = []
        handles = []
        editing = threading.Event()
        native_closes = []
        mover = []
        orig_close = kdn.kdn_swig.Op.close

        def recording_close(h):
            native_closes.append(threading.get_ident())
            orig_close(h)

        patcher = mock.patch.object(kdn.kdn_swig.Op, "close", recording_close)
        patcher.start()
        self.addCleanup(patcher.stop)

        def edit(info, kv):
            mover.append(threading.get_ident())
            if handles:
                op, m = handles.pop()
                op.close()
                m.close()
                seen.append((op.closed, m.closed))
            editing.set()
            return False

        with runtime(editor=edit) as rt:
            m = model(rt)
            m2 = model(rt, fingerprint="other")
            buf = bytearray(canonical_kv(CHUNK).tobytes())
            op = m.save_async(NS, tokens(CHUNK, 500), buf)
            handles.append((op, m))
            m2.store(NS, tokens(CHUNK), canonical_kv(CHUNK))
            self.assertTrue(editing.wait(10))
            self.assertEqual(seen, [(True, True)])

            def op_released():  # the op is freed and its buffer released: it can grow again
                try:
                    buf.extend(b"x")
                    return True
                except BufferError:
                    return False

            deadline = time.monotonic() + 10
            while not (op_released() and m._h.is_closed()) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertTrue(op_released())
            self.assertTrue(m._h.is_closed())
            self.assertEqual(len(native_closes), 1)
            self.assertNotEqual(native_closes[0], mover[0])
            with self.assertRaises(kdn.ClosedError):
                m.lookup(NS, tokens(CHUNK))
            self.assertEqual(m2.lookup(NS, tokens(CHUNK)).cached_tokens, CHUNK)
            m2.close()


if __name__ == "__main__":
    unittest.main()
