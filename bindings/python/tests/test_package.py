# SPDX-License-Identifier: Apache-2.0
"""The package as built (what the wheel holds): the extension loads the
package's own libkdn.so.1 (RUNPATH $ORIGIN), numpy is optional, and on a
Python the extension was not built for, `import kdn` says so."""
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest

import kdn

PKG = os.path.dirname(os.path.realpath(kdn.__file__))
EXT = "_kdn_swig" + sysconfig.get_config_var("EXT_SUFFIX")


def mapped_files():
    with open("/proc/self/maps") as f:
        fields = (line.split(None, 5) for line in f)
        return {os.path.realpath(p[5].strip()) for p in fields if len(p) == 6 and p[5].startswith("/")}


class PackageTest(unittest.TestCase):
    def test_files(self):
        self.assertEqual(sorted(n for n in os.listdir(PKG) if not n.startswith((".", "__pycache__"))),
                         sorted(["__init__.py", "_arrays.py", "_enums.py", "_errors.py", "_native.py", "_runtime.py", "_types.py",
                                 "kdn_swig.py", EXT, "libkdn.so.1"]))

    def test_libkdn_is_the_package_copy(self):
        libkdn = {p for p in mapped_files() if os.path.basename(p).startswith("libkdn.so")}
        self.assertEqual(libkdn, {os.path.join(PKG, "libkdn.so.1")})

    @unittest.skipUnless(shutil.which("readelf"), "no readelf")
    def test_run_paths(self):
        def dynamic(name):
            dyn = subprocess.run(["readelf", "-d", os.path.join(PKG, name)], capture_output=True, text=True,
                                 check=True).stdout
            paths = [line.split("[", 1)[1].rstrip("]") for line in dyn.splitlines()
                     if "(RUNPATH)" in line or "(RPATH)" in line]
            return dyn, paths

        # The extension finds libkdn beside itself, and only there.
        dyn, paths = dynamic(EXT)
        self.assertEqual(paths, ["$ORIGIN"])
        self.assertIn("Shared library: [libkdn.so.1]", dyn)
        # libkdn's copy: absolute directories only (an empty entry, CMake's
        # padding in the build's libkdn, would mean the current directory),
        # none into the build tree.
        _, paths = dynamic("libkdn.so.1")
        build = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(PKG))))
        for d in (d for p in paths for d in p.split(":")):
            self.assertTrue(os.path.isabs(d), paths)
            self.assertFalse(os.path.realpath(d).startswith(build + os.sep), paths)

    def test_numpy_is_optional(self):
        # numpy made unimportable: kdn imports and works on bytes, bytearray
        # and array.array.
        code = (
            "import sys\n"
            "sys.modules['numpy'] = None\n"
            "import array, kdn\n"
            "with kdn.Runtime(chunk_tokens=16) as rt, rt.model(num_layers=1, num_kv_heads=1, head_dim=4,\n"
            "                                                  fingerprint='no-numpy') as m:\n"
            "    kv = bytes(i % 251 for i in range(16 * m.kv_bytes_per_token))\n"
            "    assert m.store('ns', array.array('i', range(16)), kv).tokens == 16\n"
            "    out = bytearray(len(kv))\n"
            "    assert m.retrieve('ns', list(range(16)), out).tokens == 16 and out == kv\n"
            "    f = array.array('f', bytes(len(kv)))\n"
            "    assert m.retrieve('ns', list(range(16)), f).tokens == 16 and f.tobytes() == kv\n"
            "print('ok without numpy')\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "ok without numpy")

    def test_library_version_is_checked(self):
        from kdn import _native
        self.assertIsNone(_native.check_library_version(kdn.version_number()))
        for ok in (10900, 10901, 11000, 19999):
            self.assertIsNone(_native.check_library_version(ok), ok)
        for old, text in ((10803, "1.8.3"), (10700, "1.7.0"), (10402, "1.4.2"), (20000, "2.0.0"), (9900, "0.99.0")):
            e = _native.check_library_version(old)
            self.assertIsInstance(e, ImportError)
            self.assertEqual(str(e), f"libkdn {text} is not usable by this Python binding: it needs libkdn 1.9 or "
                                     f"a later 1.x (libkdn.so.1)")
        # The import itself refuses an older library: the extension loaded
        # first with its version_number() made 1.8's, then the package.
        code = ("import sys, types\n"
                f"pkg = types.ModuleType('kdn'); pkg.__path__ = [{PKG!r}]; sys.modules['kdn'] = pkg\n"
                "import kdn.kdn_swig as s\n"
                "s.version_number = lambda: 10803\n"
                "del sys.modules['kdn']\n"
                "import kdn\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertEqual(out.stderr.strip().splitlines()[-1],
                         "ImportError: libkdn 1.8.3 is not usable by this Python binding: it needs libkdn 1.9 or a "
                         "later 1.x (libkdn.so.1)", out.stderr)

    def test_another_python_is_told_which(self):
        # The package with its extension renamed as another Python's: this
        # Python finds no extension of its own and must say why.
        with tempfile.TemporaryDirectory() as tmp:
            pkg = os.path.join(tmp, "kdn")
            shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
            other = "_kdn_swig.cpython-399-x86_64-linux-gnu.so"
            os.rename(os.path.join(pkg, EXT), os.path.join(pkg, other))
            env = dict(os.environ, PYTHONPATH=tmp)
            out = subprocess.run([sys.executable, "-c", "import kdn"], capture_output=True, text=True, env=env,
                                 cwd=tmp, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        last = out.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith(f"ImportError: kdn's extension {other} is for another Python than this one "
                                        f"({sys.executable}, Python {sys.version_info[0]}.{sys.version_info[1]}, "
                                        f"which loads {EXT})"), out.stderr)
        self.assertIn(f"-DPython3_EXECUTABLE={sys.executable}", last)


if __name__ == "__main__":
    unittest.main()
