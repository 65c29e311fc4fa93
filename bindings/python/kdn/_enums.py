# SPDX-License-Identifier: Apache-2.0
"""kdn's enums as IntEnums.

kdn's enums are open: a newer library may return a value this package does
not name. Every enum here turns such a value into a pseudo-member named
``UNKNOWN_<value>`` instead of raising, so results from a newer library can
still be read. (An unknown value passed *to* kdn is refused by kdn itself
with InvalidArgumentError.)
"""
import enum

__all__ = [
    "Status", "DType", "TierKind", "EvictionPolicy", "Layout", "OpState", "LatencyKind", "RopeStyle", "DeviceMode",
    "MemoryKind", "RopeScaling", "SegmentKind", "CacheKind",
]


class _OpenEnum(enum.IntEnum):
    @classmethod
    def _missing_(cls, value):
        if isinstance(value, int) and not isinstance(value, bool):
            member = int.__new__(cls, value)
            member._name_ = f"UNKNOWN_{value}"
            member._value_ = value
            return member
        return None


class Status(_OpenEnum):
    """A call's status (kdn_status_code). Failures raise kdn.Error; a status
    is seen as a value only in batched lookups and results."""
    OK = 0
    INVALID_ARGUMENT = -1
    NOT_FOUND = -2
    BUSY = -3
    UNAVAILABLE = -4
    CORRUPT = -5
    UNSUPPORTED = -6
    NO_MEMORY = -7
    INTERNAL = -8
    TIMEOUT = -9
    CANCELLED = -10
    VERSION = -11
    BUFFER_TOO_SMALL = -12


class DType(_OpenEnum):
    """The element type of a model's KV."""
    F32 = 0
    F16 = 1
    BF16 = 2

    @property
    def itemsize(self):
        """Bytes per element."""
        return 4 if self == DType.F32 else 2


class TierKind(_OpenEnum):
    """The kinds of tier, fastest first."""
    HOST = 0
    DEVICE = 1
    DISK = 2
    REMOTE = 3
    REDIS = 4  # since 1.3


class EvictionPolicy(_OpenEnum):
    LRU = 0
    S3FIFO = 1
    COST = 2  # cost-aware (GreedyDual-Size-Frequency), since 1.5


class Layout(_OpenEnum):
    """How a KV view lays out each layer: CONTIGUOUS (strided), or paged
    (vLLM's NHD: [block][slot][head][dim]; HND: [block][head][slot][dim])."""
    CONTIGUOUS = 0
    PAGED_NHD = 1
    PAGED_HND = 2


class OpState(_OpenEnum):
    """Where an operation is."""
    PENDING = 0
    DONE = 1
    FAILED = 2
    CANCELLED = 3


class LatencyKind(_OpenEnum):
    LOOKUP = 0
    LOAD = 1
    STORE = 2


class RopeStyle(_OpenEnum):
    INTERLEAVED = 0
    NEOX = 1


class CacheKind(_OpenEnum):
    """What each layer of a model caches per token (kdn_cache_kind, since 1.11)."""
    KV = 0      # K and V heads
    LATENT = 1  # one latent vector of latent_dim (MLA: DeepSeek-V2/V3, Kimi)


class DeviceMode(_OpenEnum):
    """The GPU a runtime delivers KV to (since 1.5; Runtime(device=...))."""
    AUTO = 0  #: the CUDA device device_ordinal when kdn has CUDA and the machine a usable GPU; else none
    NONE = 1  #: no device: device arrays are refused (UnsupportedError)
    EMULATED = 2  #: host memory stands in for the GPU's (develop and test GPU integrations without one)
    CUDA = 3  #: the CUDA device device_ordinal; Runtime() fails (UnsupportedError) without one


class MemoryKind(_OpenEnum):
    """Where a call's KV memory is (since 1.5): host memory, or the
    runtime's device's (a GPU array: __cuda_array_interface__ or DLPack)."""
    HOST = 0
    DEVICE = 1


class RopeScaling(_OpenEnum):
    """How a blend re-rotates keys (Model.blend, experimental)."""
    NONE = 0
    LINEAR = 1  #: positions divided by rope_factor
    NTK = 2  #: theta * rope_factor^(r / (r - 2))


class SegmentKind(_OpenEnum):
    """A piece of a blended context (kdn.Segment)."""
    DOCUMENT = 0  #: a knowledge item by doc_id
    TOKENS = 1  #: tokens computed now (the query, anything not cached)
