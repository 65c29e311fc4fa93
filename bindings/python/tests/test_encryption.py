# SPDX-License-Identifier: Apache-2.0
"""Encryption at rest (C ABI 1.14) through the package: with master keys
(encryption_key_file, encryption_key_env) a disk tier's chunks are
AES-256-GCM encrypted, so its files hold none of the KV in the clear; a
runtime without the keys, or with another key, gets misses counted as
auth_failures; bad key sources are refused."""
import os
import tempfile
import unittest

import numpy as np

import kdn
from _common import CHUNK, HEADS, DIM, LAYERS, NS, model, runtime, tokens

POSITIONS = 4 * CHUNK
BLOCK = 32  # the search's unit: one token's K or V in one layer (f32, HEADS x DIM)
assert HEADS * DIM * 4 == BLOCK


def real_kv(positions, seed):
    """KV as a model makes it: normally distributed f32, in the canonical
    layout, no two 32-byte blocks alike."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((LAYERS, 2, positions, HEADS, DIM)) * 1.7).astype(np.float32)


def blocks_in_clear(directory, kv):
    """How many of kv's 32-byte blocks appear in a file under `directory`."""
    data = []
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                data.append(f.read())
    raw = kv.tobytes()
    return sum(any(raw[i:i + BLOCK] in d for d in data) for i in range(0, len(raw), BLOCK))


def files_bytes(directory):
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(directory) for name in names)


class EncryptionTest(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.d = self._dir.name
        self.kv = real_kv(POSITIONS, 14)
        self.ids = tokens(POSITIONS, 7)

    def tearDown(self):
        self._dir.cleanup()

    def key_file(self, name, *keys, mode=0o600):
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            f.write("".join(k + "\n" for k in keys))
        os.chmod(path, mode)
        return path

    def tiers(self, name):
        # "raw": the chunks' bytes as given (disk tiers default to zstd, which would hide them anyway).
        return [kdn.Tier.disk(os.path.join(self.d, name), 64 << 20, codec="raw")]

    def store(self, name, **keys):
        with runtime(tiers=self.tiers(name), **keys) as rt, model(rt) as m:
            self.assertEqual(m.store(NS, self.ids, self.kv).tokens, POSITIONS)
            self.assertEqual(rt.tier_stats(0).auth_failures, 0)

    def read(self, name, **keys):
        """(tokens retrieved, the buffer, the disk tier's auth_failures)."""
        with runtime(tiers=self.tiers(name), **keys) as rt, model(rt) as m:
            out = np.zeros_like(self.kv)
            got = m.retrieve(NS, self.ids, out).tokens
            return got, out, rt.tier_stats(0).auth_failures

    def assert_whole(self, read):
        got, out, failures = read
        self.assertEqual((got, failures), (POSITIONS, 0))
        np.testing.assert_array_equal(out, self.kv)

    def assert_miss(self, read):
        got, out, failures = read
        self.assertEqual(got, 0)
        self.assertFalse(out.any())  # untouched
        self.assertGreaterEqual(failures, 1)

    def test_key_file(self):
        mine = os.urandom(32).hex()
        keys = self.key_file("keys", mine)
        blocks = self.kv.nbytes // BLOCK

        # Without keys the search finds every block of the KV in the tier's files: it works.
        self.store("plain")
        self.assertEqual(blocks_in_clear(os.path.join(self.d, "plain"), self.kv), blocks)

        # With them: stored, read back whole, none of it in the clear.
        self.store("kv", encryption_key_file=keys)
        self.assertGreaterEqual(files_bytes(os.path.join(self.d, "kv")), self.kv.nbytes)
        self.assertEqual(blocks_in_clear(os.path.join(self.d, "kv"), self.kv), 0)
        self.assert_whole(self.read("kv", encryption_key_file=keys))
        self.assert_whole(self.read("kv", encryption_key_file=keys.encode()))  # bytes paths too
        # A rotated ring (a new key first, the old kept) still reads it.
        rotated = self.key_file("rotated", os.urandom(32).hex(), mine)
        self.assert_whole(self.read("kv", encryption_key_file=rotated))

        # Without keys: misses, counted as auth failures (and the chunks dropped).
        self.assert_miss(self.read("kv"))
        # Stored again: another key gets nothing either.
        self.store("kv", encryption_key_file=keys)
        self.assert_miss(self.read("kv", encryption_key_file=self.key_file("other", os.urandom(32).hex())))

    def test_key_env(self):
        mine = os.urandom(32).hex()
        name = "KDN_PY_TEST_MASTER_KEYS"
        self.assertNotIn(name, os.environ)
        os.environ[name] = mine + "\n"
        try:
            self.store("kv", encryption_key_env=name)
            self.assertEqual(blocks_in_clear(os.path.join(self.d, "kv"), self.kv), 0)
            self.assert_whole(self.read("kv", encryption_key_env=name))
            # The same key from a file reads what the variable's encrypted.
            self.assert_whole(self.read("kv", encryption_key_file=self.key_file("keys", mine)))
            # Another key in the variable does not.
            os.environ[name] = os.urandom(32).hex()
            self.assert_miss(self.read("kv", encryption_key_env=name))
        finally:
            del os.environ[name]
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            runtime(tiers=self.tiers("kv"), encryption_key_env=name)
        self.assertIn(name, str(cm.exception))
        self.assertIn("not set", str(cm.exception))

    def test_bad_sources(self):
        tiers = self.tiers("kv")
        # Readable by others.
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            runtime(tiers=tiers, encryption_key_file=self.key_file("open", os.urandom(32).hex(), mode=0o644))
        self.assertIn("chmod", str(cm.exception))
        # Both sources at once.
        name = "KDN_PY_TEST_MASTER_KEYS_BOTH"
        os.environ[name] = os.urandom(32).hex()
        try:
            with self.assertRaises(kdn.InvalidArgumentError) as cm:
                runtime(tiers=tiers, encryption_key_file=self.key_file("keys", os.urandom(32).hex()),
                        encryption_key_env=name)
            self.assertIn("not both", str(cm.exception))
        finally:
            del os.environ[name]
        # A line that is not a key (63 hex digits): refused, and never repeated in the message.
        short = os.urandom(32).hex()[1:]
        with self.assertRaises(kdn.InvalidArgumentError) as cm:
            runtime(tiers=tiers, encryption_key_file=self.key_file("bad", os.urandom(32).hex(), short))
        self.assertIn("line 2", str(cm.exception))
        self.assertNotIn(short, str(cm.exception))
        # Not there; empty; not a path or a name.
        with self.assertRaises(kdn.InvalidArgumentError):
            runtime(tiers=tiers, encryption_key_file=os.path.join(self.d, "missing"))
        for bad in ({"encryption_key_file": ""}, {"encryption_key_env": ""}, {"encryption_key_file": 5},
                    {"encryption_key_env": 5}):
            with self.assertRaises(kdn.InvalidArgumentError, msg=bad):
                runtime(tiers=tiers, **bad)


if __name__ == "__main__":
    unittest.main()
