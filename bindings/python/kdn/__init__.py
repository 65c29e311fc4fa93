# SPDX-License-Identifier: Apache-2.0
"""kdn: the Knowledge Delivery Network runtime (KV cache store) for Python.

A thin, zero-copy layer over kdn's C ABI (through a SWIG module and the C++
layer bindings/swig/kdn_binding.hpp)::

    import numpy as np, kdn

    with kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(16 << 20)]) as rt, \\
         rt.model(num_layers=5, num_kv_heads=4, head_dim=8, dtype=kdn.DType.F32, fingerprint="m") as m:
        kv = np.zeros(48 * m.kv_bytes_per_token // 4, np.float32)   # canonical layout
        m.store("tenant", tokens, kv)
        got = m.retrieve("tenant", tokens, kv)   # got.tokens == 0 on a miss
        m.lookup("tenant", tokens).cached_tokens

Errors are exceptions (kdn.Error and one subclass per status); a cache miss
is not an error. Runtime, Model and Op are context managers. KV memory is any
buffer (numpy arrays, bytearray, ...) or, since 1.5, a GPU array
(__cuda_array_interface__ or DLPack: torch, CuPy) on the runtime's device.

The package covers kdn's C ABI 1.9 (and the experimental editor and
blending); it needs libkdn 1.9 or a later 1.x, and its wheel carries one.
"""
from ._native import native as _s  # first: on the wrong Python, fails saying so
from ._enums import (CacheKind, DeviceMode, DType, EvictionPolicy, LatencyKind, Layout, MemoryKind, OpState,
                     RopeScaling, RopeStyle, SegmentKind, Status, TierKind)
from ._errors import (BufferTooSmallError, BusyError, CallerError, CancelledError, ClosedError, CorruptError, Error,
                      InternalError, InvalidArgumentError, NoMemoryError, NotFoundError, RetryableError, TimeoutError,
                      UnavailableError, UnsupportedError, VersionError)
from ._runtime import Editor, KvView, Model, Op, Request, Runtime
from ._types import (RESULT_LOSSY, BlendReport, ChunkInfo, DocumentInfo, FetchResult, KvResult, Latency, LookupResult,
                     ModelSpec, QuotaStats, Segment, Stats, Tier, TierStats)


def version():
    """The library's version, "MAJOR.MINOR.PATCH"."""
    return _s.version()


def version_number():
    """The library's version as MAJOR * 10000 + MINOR * 100 + PATCH (a
    feature added in 1.N is there when it is >= 10000 + 100 * N)."""
    return _s.version_number()


def status_string(status):
    """kdn's name for a status ("KDN_ERR_NOT_FOUND")."""
    return _s.status_string(int(status))


__version__ = _s.version()

__all__ = [
    "Runtime", "Model", "Op", "Request", "KvView", "Editor", "Tier", "ModelSpec", "KvResult", "LookupResult",
    "DocumentInfo", "FetchResult", "Stats", "Latency", "TierStats", "QuotaStats", "ChunkInfo", "RESULT_LOSSY", "DType",
    "TierKind",
    "EvictionPolicy", "Layout", "OpState", "LatencyKind", "RopeStyle", "CacheKind", "Status", "DeviceMode", "MemoryKind",
    "RopeScaling", "SegmentKind", "Segment", "BlendReport", "Error", "CallerError",
    "RetryableError", "InvalidArgumentError", "ClosedError", "VersionError", "BufferTooSmallError", "NotFoundError",
    "BusyError", "UnavailableError", "TimeoutError", "CorruptError", "UnsupportedError", "NoMemoryError",
    "InternalError", "CancelledError", "version", "version_number", "status_string",
]
