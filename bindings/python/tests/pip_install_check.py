# SPDX-License-Identifier: Apache-2.0
"""bindings.python.pip_install: the package CMake assembled installs with pip,
offline, into a fresh venv, and imports from there (not from the build tree).

Usage: pip_install_check.py <build>/bindings/python/pkg WORKDIR
pip writes build/ and kdn.egg-info into the directory it installs from, so it
installs from a copy made under WORKDIR (never from the sources).
"""
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    pkg, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    src = os.path.join(work, "src")
    shutil.copytree(pkg, src)
    venv = os.path.join(work, "venv")
    # --system-site-packages: numpy and pip come from Debian (--without-pip
    # saves copying pip into the venv: 1 s instead of 5); the venv's own
    # python runs pip, so the install goes into the venv.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", src], check=True,
                   env=env)
    probe = r"""
import os, sys, kdn
here = os.path.realpath(kdn.__file__)
assert here.startswith(os.path.realpath(sys.prefix)), f"kdn imported from {here}, not the venv {sys.prefix}"
with kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(1 << 20)]) as rt, \
        rt.model(num_layers=1, num_kv_heads=1, head_dim=4, fingerprint="pip") as m:
    kv = bytes(i % 251 for i in range(16 * m.kv_bytes_per_token))
    assert m.store("ns", list(range(16)), kv).tokens == 16
    out = bytearray(len(kv))
    assert m.retrieve("ns", list(range(16)), out).tokens == 16 and out == kv
print("kdn", kdn.version(), "installed at", os.path.dirname(here))
"""
    with tempfile.TemporaryDirectory() as elsewhere:  # not the build tree, not the sources
        subprocess.run([python, "-c", probe], check=True, cwd=elsewhere, env=env)


if __name__ == "__main__":
    main()
