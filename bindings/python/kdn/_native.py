# SPDX-License-Identifier: Apache-2.0
"""The SWIG module, imported first: on a Python other than the one the
extension was built for, the import fails saying so.

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


native = _load()
