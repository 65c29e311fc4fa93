# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for GPU arrays over host memory, for runtimes on the emulated
device (kdn.DeviceMode.EMULATED: device memory is host memory there, so a
"device pointer" is a host address).

- CudaArray: __cuda_array_interface__ (version 3, or 2 without a stream)
  over a numpy array's memory, as CuPy, torch and numba present theirs.
- DLPackCuda: __dlpack__ / __dlpack_device__ reporting kDLCUDA over a numpy
  array's memory: numpy's own DLPack capsule with its device type (and, to
  stand for bfloat16, its type code) rewritten, so the deleter that runs is
  numpy's (which releases the array: sys.getrefcount shows it ran).
- DLPackOnly: numpy's own DLPack producer (kDLCPU) and nothing else (no
  buffer protocol), as a torch CPU tensor presents itself.
"""
import ctypes

from kdn import _arrays

_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid.restype = ctypes.c_int
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_get_pointer.restype = ctypes.c_void_p

KDL_CPU, KDL_CUDA, KDL_ROCM = 1, 2, 10
KDL_BFLOAT = 4


def capsule_name_is(capsule, name):
    return bool(_is_valid(capsule, name))


class CudaArray:
    """__cuda_array_interface__ over `a`'s memory."""

    def __init__(self, a, *, stream=None, readonly=False, version=3, typestr=None, strides=None, shape=None):
        self.a = a
        self.stream = stream
        self.readonly = readonly
        self.version = version
        self.typestr = typestr
        self.strides = strides
        self.shape = shape

    @property
    def __cuda_array_interface__(self):
        d = {"shape": self.shape or self.a.shape, "typestr": self.typestr or self.a.dtype.str,
             "data": (self.a.ctypes.data, self.readonly), "strides": self.strides, "version": self.version}
        if self.version >= 3:
            d["stream"] = self.stream
        return d


class DLPackCuda:
    """A DLPack producer of kDLCUDA tensors over `a`'s memory."""

    def __init__(self, a, *, device_id=0, device_type=KDL_CUDA, bfloat16=False):
        self.a = a
        self.device_id = device_id
        self.device_type = device_type
        self.bfloat16 = bfloat16
        self.streams = []  # the stream= of each __dlpack__ call
        self.capsules = []  # every capsule handed out

    def __dlpack_device__(self):
        return (self.device_type, self.device_id)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        capsule = self.a.__dlpack__()
        managed = _arrays._DLManagedTensor.from_address(_get_pointer(capsule, b"dltensor"))
        managed.dl_tensor.device.device_type = self.device_type
        managed.dl_tensor.device.device_id = self.device_id
        if self.bfloat16:
            managed.dl_tensor.dtype.code = KDL_BFLOAT
        self.capsules.append(capsule)
        return capsule


class DLPackOnly:
    """numpy's DLPack producer alone (kDLCPU)."""

    def __init__(self, a):
        self.a = a
        self.capsules = []

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()

    def __dlpack__(self, stream=None):
        capsule = self.a.__dlpack__(stream=stream)
        self.capsules.append(capsule)
        return capsule
