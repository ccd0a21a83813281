"""A CUDA array for the CUDA emulator (tests/emulator/cuda.c), with just
what a DLPack producer like torch has: ``__dlpack__``/``__dlpack_device__``,
``new_empty``, ``shape`` and ``dtype``. Its memory comes from the emulated
driver (``cuMemAlloc``; the emulator's device memory is host memory, run by
per-stream worker threads in stream order). It is a stand-in for torch on CI
machines without a GPU, held to the same driver calls torch would make; on a
GPU machine the tests use torch itself (RANKMESH_TEST_CUDA=torch)."""

import ctypes
import math

import numpy as np

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

_KDL_CUDA = 2


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
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def _code(dtype):
    dt = np.dtype(dtype)
    if ml_dtypes is not None and dt == np.dtype(ml_dtypes.bfloat16):
        return 4
    return {"f": 2, "i": 0, "u": 1, "b": 6}[dt.kind]


def dltensor_capsule(ptr, device, shape, dtype, keep, device_type=None):
    """A "dltensor" capsule of a contiguous array at `ptr` on DLPack device
    `(device_type, device)` (CUDA unless said); the ctypes structures it
    points into are appended to `keep`, which the caller holds as long as
    the capsule."""
    dtype = np.dtype(dtype)
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    m = _DLManagedTensor()
    m.dl_tensor.data = ptr
    m.dl_tensor.device = _DLDevice(_KDL_CUDA if device_type is None else device_type, device)
    m.dl_tensor.ndim = len(shape)
    m.dl_tensor.dtype = _DLDataType(_code(dtype), dtype.itemsize * 8, 1)
    m.dl_tensor.shape = dims
    m.dl_tensor.strides = None
    m.dl_tensor.byte_offset = 0
    keep.extend((dims, m))
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(m), b"dltensor", None)


_driver = None


def driver():
    """The emulated libcuda (found on LD_LIBRARY_PATH), initialised."""
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        assert lib.cuInit(0) == 0
        _driver = lib
    return _driver


def _check(rc, what):
    assert rc == 0, f"{what}: CUDA error {rc}"


class EmulatedCudaArray:
    def __init__(self, shape, dtype, device):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        lib = driver()
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        ptr = ctypes.c_uint64()
        _check(lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(self.nbytes, 1))), "cuMemAlloc")
        self.ptr = ptr.value
        self.exports = 0

    @classmethod
    def from_numpy(cls, a, device):
        a = np.ascontiguousarray(a)
        x = cls(a.shape, a.dtype, device)
        lib = driver()
        _check(lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(x.ptr), a.ctypes.data_as(ctypes.c_void_p),
                                        ctypes.c_size_t(a.nbytes), None), "cuMemcpyHtoDAsync")
        _check(lib.cuStreamSynchronize(None), "cuStreamSynchronize")
        return x

    def numpy(self):
        """A host copy, after the work enqueued on the legacy stream (where
        rankmesh enqueues for a producer it does not know) has run."""
        out = np.empty(self.shape, self.dtype)
        lib = driver()
        _check(lib.cuMemcpyDtoHAsync_v2(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(self.ptr),
                                        ctypes.c_size_t(self.nbytes), None), "cuMemcpyDtoHAsync")
        _check(lib.cuStreamSynchronize(None), "cuStreamSynchronize")
        return out

    def new_empty(self, shape):
        return EmulatedCudaArray(shape, self.dtype, self.device)

    def __dlpack_device__(self):
        return (_KDL_CUDA, self.device)

    def __dlpack__(self, stream=None):
        self.exports += 1
        self.last_stream = stream
        # Kept with the array: the capsule points into them.
        self._keep = []
        return dltensor_capsule(self.ptr, self.device, self.shape, self.dtype, self._keep)
