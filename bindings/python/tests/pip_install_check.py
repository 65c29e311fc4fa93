# SPDX-License-Identifier: Apache-2.0
"""bindings.python.pip_install: the wheel the build wrote installs with pip,
offline, into a plain venv (no system site-packages: no numpy, no setuptools,
no wheel package), and runs from there with nothing of the build tree: the
package, its extension and libkdn.so.1 are the venv's.

Usage: pip_install_check.py WHEEL BUILD_DIR
The venv is made outside the build tree (under TMPDIR), so that nothing the
installed kdn loads may come from BUILD_DIR. Also: pip refuses the wheel for
another Python (its tag is this Python's).
"""
import os
import subprocess
import sys
import tempfile


def main():
    wheel, build = sys.argv[1], os.path.realpath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="kdn-pip-") as work:
        check(wheel, build, work)


def check(wheel, build, work):
    venv = os.path.join(work, "venv")
    # A plain venv, as a user makes one (ensurepip puts pip in it).
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    # Nothing of the caller's: no PYTHONPATH into the build tree, no pip
    # configuration (find-links, an index), no library path.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PIP_")
           and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONPYCACHEPREFIX", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONNOUSERSITE="1")
    pip = [python, "-m", "pip"]
    subprocess.run(pip + ["install", "-q", "--no-index", wheel], check=True, env=env)

    # The wheel's tag is this Python's: pip says so on another one (asked of
    # this pip for Python 3.99, as another interpreter's pip would answer).
    other = subprocess.run(pip + ["install", "--dry-run", "--no-index", "--only-binary=:all:", "--python-version",
                                  "3.99", "--target", os.path.join(work, "other"), wheel],
                           env=env, capture_output=True, text=True)
    assert other.returncode != 0 and "is not a supported wheel on this platform" in other.stderr, other

    probe = r"""
import os, sys
build = sys.argv[1]
prefix = os.path.realpath(sys.prefix)
import kdn
here = os.path.dirname(os.path.realpath(kdn.__file__))
assert here.startswith(prefix + os.sep), f"kdn imported from {here}, not the venv {prefix}"
for name, module in sys.modules.items():
    path = getattr(module, "__file__", None) or ""
    assert not os.path.realpath(path).startswith(build + os.sep), f"{name} from the build tree: {path}"
# What the process mapped: the extension and libkdn.so.1 both the venv's copies.
with open("/proc/self/maps") as f:
    mapped = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
mapped = {os.path.realpath(p) for p in mapped if p.startswith("/")}
libkdn = [p for p in mapped if os.path.basename(p).startswith("libkdn.so")]
assert libkdn == [os.path.join(here, "libkdn.so.1")], f"libkdn loaded from {libkdn}, not {here}"
assert any(os.path.basename(p).startswith("_kdn_swig.") and os.path.dirname(p) == here for p in mapped), mapped
inside = sorted(p for p in mapped if p.startswith(build + os.sep))
assert not inside, f"mapped from the build tree: {inside}"
# numpy is optional: the venv has none, and kdn works on bytes and bytearray.
assert "numpy" not in sys.modules
try:
    import numpy
    raise AssertionError(f"numpy importable in the plain venv: {numpy.__file__}")
except ImportError:
    pass
with kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(1 << 20)]) as rt, \
        rt.model(num_layers=1, num_kv_heads=1, head_dim=4, fingerprint="pip") as m:
    assert m.lookup("ns", list(range(16))).cached_tokens == 0
    kv = bytes(i % 251 for i in range(16 * m.kv_bytes_per_token))
    assert m.store("ns", list(range(16)), kv).tokens == 16
    assert m.lookup("ns", list(range(16))).cached_tokens == 16
    out = bytearray(len(kv))
    assert m.retrieve("ns", list(range(16)), out).tokens == 16 and out == kv
assert "numpy" not in sys.modules
print("kdn", kdn.version(), "installed at", here, "with", libkdn[0])
"""
    with tempfile.TemporaryDirectory() as elsewhere:  # not the build tree, not the sources
        if subprocess.run([python, "-c", probe, build], cwd=elsewhere, env=env).returncode != 0:
            sys.exit("pip_install_check.py: kdn installed in the venv failed its checks (above)")


if __name__ == "__main__":
    main()
