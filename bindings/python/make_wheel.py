# SPDX-License-Identifier: Apache-2.0
"""Writes kdn's wheel from the package CMake assembled, with the standard
library only: a wheel is a zip of the package and a kdn-<ver>.dist-info
folder (METADATA, WHEEL, RECORD, the licence files), so neither setuptools'
bdist_wheel nor the `wheel` package is needed, at build time or by pip.

Run by the Python the extension was built for (CMake's Python3_EXECUTABLE):
the wheel's tags are this interpreter's, so pip installs it only there.

Usage:
  make_wheel.py --tag
      prints the tag (cp311-cp311-linux_x86_64); CMake names the wheel with it
  make_wheel.py --pkg DIR --out DIST/kdn-VER-TAG.whl --version VER --license FILE...
      DIR is the package folder (kdn/*.py, the extension, libkdn.so.1)
"""
import argparse
import base64
import csv
import glob
import hashlib
import io
import os
import sys
import sysconfig
import zipfile

NAME = "kdn"
# Every entry gets this date (zip's earliest), so the same files make the
# same wheel, byte for byte.
EPOCH = (1980, 1, 1, 0, 0, 0)


def tag():
    """The wheel tag of this interpreter, as pip computes it for an extension
    that uses the full C API (not the limited one): python and ABI tags both
    cpXY plus the ABI flags (d: debug build, t: free-threaded)."""
    if sys.implementation.name != "cpython":
        sys.exit(f"make_wheel.py: kdn's extension is built for CPython, not {sys.implementation.name}")
    py = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    abi = py + getattr(sys, "abiflags", "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{py}-{abi}-{plat}"


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def metadata(version):
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return f"""Metadata-Version: 2.1
Name: {NAME}
Version: {version}
Summary: kdn: a KV cache runtime (Python binding of its C ABI)
License: Apache-2.0
Requires-Python: =={py}.*
Description-Content-Type: text/plain

kdn's Python binding, with its extension and a copy of libkdn.so.1 in the
package. Built for CPython {py} ({sys.executable}); the wheel's tag
({tag()}) keeps pip from installing it into any other Python. numpy is
optional: KV buffers are any object with the buffer protocol.
The libraries libkdn links (Cap'n Proto, hiredis, zstd, OpenSSL, xxHash and,
in a CUDA build, CUDA's runtime) come from the system, as for the build.
"""


def wheel_file():
    return f"""Wheel-Version: 1.0
Generator: kdn bindings/python/make_wheel.py
Root-Is-Purelib: false
Tag: {tag()}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", action="store_true")
    ap.add_argument("--pkg")
    ap.add_argument("--out")
    ap.add_argument("--version")
    ap.add_argument("--license", nargs="*", default=[])
    a = ap.parse_args()
    if a.tag:
        print(tag())
        return
    if not (a.pkg and a.out and a.version):
        ap.error("--pkg, --out and --version are needed")

    want = f"{NAME}-{a.version}-{tag()}.whl"
    if os.path.basename(a.out) != want:
        # CMake named the wheel at configure time with another interpreter's tag.
        sys.exit(f"make_wheel.py: {sys.executable} makes {want}, not {os.path.basename(a.out)}: configure again")
    # The extension must be this interpreter's (its suffix names the ABI).
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    if not os.path.exists(os.path.join(a.pkg, "_kdn_swig" + suffix)):
        sys.exit(f"make_wheel.py: no _kdn_swig{suffix} in {a.pkg}: the extension was built for another Python "
                 f"than {sys.executable}")

    files = []  # (name in the wheel, bytes, executable)
    for root, dirs, names in os.walk(a.pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for n in sorted(names):
            if n.startswith("."):  # CMake's stamp
                continue
            path = os.path.join(root, n)
            rel = os.path.relpath(path, os.path.dirname(a.pkg)).replace(os.sep, "/")
            with open(path, "rb") as f:
                files.append((rel, f.read(), n.endswith(".so") or ".so." in n))
    info = f"{NAME}-{a.version}.dist-info"
    files.append((f"{info}/METADATA", metadata(a.version).encode(), False))
    files.append((f"{info}/WHEEL", wheel_file().encode(), False))
    for lic in a.license:
        with open(lic, "rb") as f:
            files.append((f"{info}/{os.path.basename(lic)}", f.read(), False))

    record = io.StringIO()
    w = csv.writer(record, lineterminator="\n")
    for name, data, _ in files:
        w.writerow([name, digest(data), len(data)])
    w.writerow([f"{info}/RECORD", "", ""])
    files.append((f"{info}/RECORD", record.getvalue().encode(), False))

    # A wheel of an older version (or another Python) left in dist/ would
    # be picked by a `pip install dist/kdn-*.whl`: one wheel only.
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for old in glob.glob(os.path.join(os.path.dirname(os.path.abspath(a.out)), f"{NAME}-*.whl")):
        os.remove(old)
    tmp = a.out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:  # the dist-info last, RECORD at the end (as the spec advises)
            zi = zipfile.ZipInfo(name, EPOCH)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = (0o100755 if executable else 0o100644) << 16
            z.writestr(zi, data)
    os.replace(tmp, a.out)  # never a half-written wheel under the final name


if __name__ == "__main__":
    main()
