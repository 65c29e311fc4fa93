# SPDX-License-Identifier: Apache-2.0
"""KV memory that is not a Python buffer: GPU arrays and DLPack tensors.

Engines keep KV in torch or CuPy tensors on the GPU. The KV calls take, besides
anything with the buffer protocol:

- objects with ``__cuda_array_interface__`` (versions 2 and 3: shape,
  typestr, data = (pointer, read-only), strides, optional stream): device
  memory of the runtime's device;
- DLPack producers (``__dlpack__`` and ``__dlpack_device__``): kDLCUDA
  (and managed) memory as device memory, kDLCPU (and CUDA host) memory as
  host memory. The capsule is consumed as the DLPack contract says: renamed
  "used_dltensor", and its DLManagedTensor's deleter called once kdn is done
  with the memory (after a call; an op: when it is closed).

Each is checked against the model (element type, C-contiguous strides, the
canonical layout's shape) before kdn sees it, and becomes a _Foreign: the
address, length, memory kind and CUDA stream passed down, and what keeps the
memory alive until it is released.

numpy is not needed: the structures are read with ctypes.
"""
import ctypes

from ._enums import DType, MemoryKind
from ._errors import InvalidArgumentError, UnsupportedError

__all__ = ["foreign", "cuda_interface", "stream_handle"]


# ---- DLPack's C structures (dlpack.h, the unversioned ABI of DLPack 0.x,
# which every producer still offers), written from the specification.

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # in elements; NULL: C-contiguous
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


# PYFUNCTYPE: the deleter runs holding the GIL (producers' deleters release
# Python objects: numpy's Py_DECREFs its array).
_DELETER = ctypes.PYFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# DLDeviceType values.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "kDLCPU", 2: "kDLCUDA", 3: "kDLCUDAHost", 4: "kDLOpenCL", 7: "kDLVulkan", 8: "kDLMetal",
                    9: "kDLVPI", 10: "kDLROCM", 11: "kDLROCMHost", 12: "kDLExtDev", 13: "kDLCUDAManaged",
                    14: "kDLOneAPI", 15: "kDLWebGPU", 16: "kDLHexagon"}
# DLDataTypeCode values.
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT = 0, 1, 2, 4

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_is_valid.restype = ctypes.c_int
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name.restype = ctypes.c_int

_DLTENSOR = b"dltensor"
# PyCapsule_SetName keeps the pointer: the name must live as long as any
# capsule renamed with it (a module constant: until the interpreter ends).
_USED_NAME = ctypes.create_string_buffer(b"used_dltensor")

# Element types each model dtype takes, as (kind, bytes): the buffer path's
# rules (float32 for F32; float16 or 16-bit ints for F16; 16-bit ints or
# bfloat16 for BF16; bytes for any).
_RAW = frozenset((("u", 1), ("i", 1)))
_ELEMENTS = {
    DType.F32: _RAW | {("f", 4)},
    DType.F16: _RAW | {("f", 2), ("u", 2), ("i", 2)},
    DType.BF16: _RAW | {("u", 2), ("i", 2), ("bf", 2)},
}
_DL_KINDS = {_DL_INT: "i", _DL_UINT: "u", _DL_FLOAT: "f", _DL_BFLOAT: "bf"}


class _Foreign:
    """Memory kdn reads or writes by address, for one call or one op.
    `native` is the kdn_swig.Memory the call passes down; release() (once
    kdn is done with the memory) calls a DLPack tensor's deleter and drops
    the reference to the producer. A context manager for synchronous calls."""

    __slots__ = ("native", "kind", "nbytes", "shape", "_owner", "_managed")

    def __init__(self, native, kind, nbytes, shape, owner, managed=None):
        self.native = native
        self.kind = kind
        self.nbytes = nbytes
        self.shape = shape
        self._owner = owner
        self._managed = managed

    def release(self):
        managed, self._managed = self._managed, None
        self._owner = None
        if managed is not None and managed.deleter:
            managed.deleter(ctypes.pointer(managed))  # the producer frees it: `managed` is dead after this

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def stream_handle(stream):
    """A CUDA stream as the integer cudaStream_t: an int, or an object with
    `cuda_stream` (torch.cuda.Stream) or `ptr` (cupy.cuda.Stream); None: 0."""
    if stream is None:
        return 0
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            stream = handle
            break
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise InvalidArgumentError(f"stream must be a CUDA stream (an int cudaStream_t, or a torch or CuPy stream), "
                                   f"not {stream!r}")
    return stream


def _check_elements(kind, size, model, what):
    dtype = DType(model.spec.dtype)
    if (kind, size) not in _ELEMENTS.get(dtype, _RAW):
        want = {DType.F32: "float32", DType.F16: "float16 (or 16-bit ints)",
                DType.BF16: "bfloat16 (or 16-bit ints)"}.get(dtype, "bytes")
        raise InvalidArgumentError(f"{what} has elements of {size * 8}-bit kind {kind!r}, but the model's KV is "
                                   f"{dtype.name}: use {want} elements, or bytes")


def _check_contiguous(shape, strides, itemsize, what):
    """strides in bytes (None: C-contiguous); dimensions of one element may
    have any stride (numpy and torch give them any)."""
    if strides is None:
        return
    if len(strides) != len(shape):
        raise InvalidArgumentError(f"{what}: {len(strides)} strides for {len(shape)} dimensions")
    want = itemsize
    for extent, stride in zip(reversed(shape), reversed(strides)):
        if extent != 1 and stride != want:
            raise InvalidArgumentError(f"{what} is not C-contiguous (shape {tuple(shape)}, strides {tuple(strides)} "
                                       f"bytes): kdn addresses it from its first element by the view's strides; "
                                       f"pass a contiguous copy, or describe the layout with a KvView over the "
                                       f"whole allocation")
        want *= extent


def _check_shape(shape, model, tokens, what):
    """With the canonical view, a 5-dimensional array must be the model's
    [layer][k|v][token][kv_head][head_dim] for the request's tokens (a
    mismatch would otherwise be read as another layout)."""
    if len(shape) != 5:
        return
    s = model.spec
    want = (s.num_layers, 2, tokens if tokens is not None else shape[2], s.num_kv_heads, s.head_dim)
    if tuple(shape) != want:
        raise InvalidArgumentError(
            f"{what} has shape {tuple(shape)}, but the canonical layout [layer][k|v][token][kv_head][head_dim] of "
            f"this model for {'these' if tokens is not None else 'its'} tokens is {want} (or pass a KvView)")


def cuda_interface(obj):
    """obj's __cuda_array_interface__, or None when it has none. A producer
    that cannot describe this array there (torch has no typestr for
    bfloat16, and raises) but offers DLPack: None too, DLPack describes it."""
    try:
        return obj.__cuda_array_interface__
    except AttributeError:  # none (torch: also a CPU tensor)
        return None
    except (TypeError, ValueError, RuntimeError):
        if hasattr(obj, "__dlpack__"):
            return None
        raise


def _cuda_array(cai, model, writable, canonical_tokens, stream, what):
    try:
        shape = tuple(int(n) for n in cai["shape"])
        typestr = cai["typestr"]
        address, readonly = cai["data"]
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: a malformed __cuda_array_interface__ ({e!r})") from e
    version = cai.get("version", 0)
    if cai.get("mask") is not None:
        raise InvalidArgumentError(f"{what}: a masked array (__cuda_array_interface__ mask) is not KV")
    if not isinstance(typestr, str) or len(typestr) < 3 or typestr[0] not in "<|=" or not typestr[2:].isdigit():
        raise InvalidArgumentError(f"{what}: typestr {typestr!r} is not a little-endian element type")
    kind, size = typestr[1], int(typestr[2:])
    _check_elements(kind, size, model, what)
    strides = cai.get("strides")
    _check_contiguous(shape, None if strides is None else tuple(int(n) for n in strides), size, what)
    if canonical_tokens is not False:
        _check_shape(shape, model, canonical_tokens, what)
    if writable and readonly:
        raise InvalidArgumentError(f"{what} is read-only (__cuda_array_interface__ data): kdn writes into it")
    own = cai.get("stream") if version >= 3 else None
    if own == 0:
        raise InvalidArgumentError(f"{what}: __cuda_array_interface__ stream 0 is ambiguous (the spec disallows it)")
    handle = stream_handle(stream)
    own = stream_handle(own)
    if handle and own and handle != own:
        raise InvalidArgumentError(f"{what} is produced on stream {own:#x}, not on the stream={handle:#x} the call "
                                   f"names: kdn follows one stream per call")
    nbytes = size
    for n in shape:
        nbytes *= n
    return MemoryKind.DEVICE, int(address or 0), nbytes, shape, handle or own, None


def _dlpack(obj, model, writable, canonical_tokens, stream, device_ordinal, what):
    try:
        device_type, device_id = (int(n) for n in obj.__dlpack_device__())
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{what}: __dlpack_device__() is not (device_type, device_id) ({e!r})") from e
    if device_type in (_DL_CPU, _DL_CUDA_HOST):
        kind = MemoryKind.HOST
        if stream is not None:
            raise InvalidArgumentError(f"{what} is host memory ({_DL_DEVICE_NAMES[device_type]}): a stream is only "
                                       f"for device memory")
        capsule = obj.__dlpack__()
        handle = 0
    elif device_type in (_DL_CUDA, _DL_CUDA_MANAGED):
        kind = MemoryKind.DEVICE
        if device_id != device_ordinal:
            raise InvalidArgumentError(f"{what} is on CUDA device {device_id}, but the runtime delivers to device "
                                       f"{device_ordinal} (Runtime(device_ordinal=...))")
        # The stream kdn's work follows; none named: the legacy default
        # stream, which DLPack producers assume when the consumer names none
        # (cudaStreamLegacy is the handle 1).
        handle = stream_handle(stream) or 1
        capsule = obj.__dlpack__(stream=handle)
    else:
        name = _DL_DEVICE_NAMES.get(device_type, f"device type {device_type}")
        raise UnsupportedError(f"{what} is {name} memory: kdn takes CUDA (device) and CPU (host) memory")
    if type(capsule).__name__ != "PyCapsule" or not _capsule_is_valid(capsule, _DLTENSOR):
        raise InvalidArgumentError(f"{what}: __dlpack__() returned {type(capsule).__name__}, not an unused DLPack "
                                   f"capsule (named \"dltensor\")")
    managed = _DLManagedTensor.from_address(_capsule_get_pointer(capsule, _DLTENSOR))
    _capsule_set_name(capsule, _USED_NAME)  # consumed: from here on the deleter is ours to call
    try:
        t = managed.dl_tensor
        if t.device.device_type != device_type:
            raise InvalidArgumentError(f"{what}: the tensor's device type {t.device.device_type} is not the "
                                       f"{device_type} __dlpack_device__() reported")
        if t.dtype.lanes != 1:
            raise InvalidArgumentError(f"{what}: elements of {t.dtype.lanes} lanes are not KV")
        kind_code = _DL_KINDS.get(t.dtype.code, f"code {t.dtype.code}")
        if t.dtype.bits % 8:
            raise InvalidArgumentError(f"{what}: {t.dtype.bits}-bit elements are not KV")
        size = t.dtype.bits // 8
        _check_elements(kind_code, size, model, what)
        if t.ndim < 0 or (t.ndim and not t.shape):
            raise InvalidArgumentError(f"{what}: a DLPack tensor of {t.ndim} dimensions without a shape")
        shape = tuple(t.shape[i] for i in range(t.ndim))
        strides = tuple(t.strides[i] * size for i in range(t.ndim)) if t.strides else None
        _check_contiguous(shape, strides, size, what)
        if canonical_tokens is not False:
            _check_shape(shape, model, canonical_tokens, what)
        nbytes = size
        for n in shape:
            nbytes *= n
        address = (t.data or 0) + t.byte_offset
    except BaseException:
        if managed.deleter:
            managed.deleter(ctypes.pointer(managed))
        raise
    return kind, address, nbytes, shape, handle, managed


def foreign(obj, model, writable, canonical_tokens, stream, native_memory, what="the KV array", cai=None):
    """obj as a _Foreign when it is a GPU array or a DLPack producer without
    the buffer protocol; None when it is neither (the caller takes it as a
    buffer). canonical_tokens: False when the call has its own view, else the
    tokens the canonical layout is for (None: any). cai: obj's
    cuda_interface() when the caller has it already."""
    if cai is None:
        cai = cuda_interface(obj)
    if cai is not None:
        got = _cuda_array(cai, model, writable, canonical_tokens, stream, what)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__") and not _is_buffer(obj):
        got = _dlpack(obj, model, writable, canonical_tokens, stream, model.runtime.device_ordinal, what)
    else:
        return None
    kind, address, nbytes, shape, handle, managed = got
    m = native_memory()
    m.address = address
    m.bytes = nbytes
    m.kind = int(kind)
    m.cuda_stream = handle
    return _Foreign(m, kind, nbytes, shape, obj, managed)


def _is_buffer(obj):
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False
