# SPDX-License-Identifier: Apache-2.0
"""The SWIG module, imported first: on a Python other than the one the
extension was built for, the import fails saying so; with a libkdn older
than the C ABI this package covers (1.9), it fails saying that.

The extension's name carries the ABI it was built for
(_kdn_swig.cpython-311-x86_64-linux-gnu.so). Another Python looks for its own
name, finds none, and says only "cannot import name '_kdn_swig'".
"""
import glob
import os
import sys
import sysconfig


def _load():
    try:
        from . import kdn_swig
        return kdn_swig
    except ImportError as e:
        here = os.path.dirname(os.path.abspath(__file__))
        built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(here, "_kdn_swig.*")))
        wanted = "_kdn_swig" + (sysconfig.get_config_var("EXT_SUFFIX") or "")
        if not built or wanted in built:
            raise  # another cause (a missing libkdn.so.1 says so itself)
        raise ImportError(
            f"kdn's extension {', '.join(built)} is for another Python than this one ({sys.executable}, Python "
            f"{sys.version_info[0]}.{sys.version_info[1]}, which loads {wanted}): use the Python kdn was built for "
            f"(CMake's Python3_EXECUTABLE, /usr/bin/python3 by default), or build kdn for this one "
            f"(-DPython3_EXECUTABLE={sys.executable})", name="kdn") from e


# The C ABI level this package uses: libkdn 1.9 or a later 1.x serves it.
BINDING_VERSION_MAJOR, BINDING_VERSION_MINOR = 1, 9


def check_library_version(number):
    """None when a libkdn of version number `number` (MAJOR * 10000 + MINOR
    * 100 + PATCH) can serve this package: the same major version and a
    minor no older than BINDING_VERSION_MINOR; else why not (ImportError)."""
    major, minor, patch = number // 10000, number // 100 % 100, number % 100
    if major == BINDING_VERSION_MAJOR and minor >= BINDING_VERSION_MINOR:
        return None
    return ImportError(
        f"libkdn {major}.{minor}.{patch} is not usable by this Python binding: it needs libkdn "
        f"{BINDING_VERSION_MAJOR}.{BINDING_VERSION_MINOR} or a later {BINDING_VERSION_MAJOR}.x "
        f"(libkdn.so.{BINDING_VERSION_MAJOR})", name="kdn")


native = _load()
_mismatch = check_library_version(native.version_number())
if _mismatch is not None:
    raise _mismatch
