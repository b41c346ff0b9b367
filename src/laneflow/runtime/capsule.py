"""DLPack capsules built and opened with ctypes, for memory numpy cannot describe (GPU pointers).

Why ctypes: laneflow owns its device memory and must hand it out (and take other libraries' memory
in) without PyTorch, CuPy or JAX in the runtime. The structs follow ``dlpack.h`` (1.0 layout for the
versioned struct, the legacy struct for unversioned consumers).

Producer: :func:`make_capsule` keeps ``owner`` (laneflow's buffer) alive until the consumer calls
the deleter, or until an unconsumed capsule is garbage collected (numpy's C destructor and deleter:
no Python code runs from C).
Consumer: :func:`open_capsule` renames the capsule to "used" (so nobody consumes it twice) and
returns a :class:`Tensor` whose :meth:`~Tensor.release` calls the producer's deleter exactly once.
"""

from __future__ import annotations

import ctypes as C
import threading
from typing import Any

import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
FLAG_READ_ONLY, FLAG_IS_COPIED = 1, 2
VERSION = (1, 0)


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int32), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32), ("dtype", DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", C.c_void_p), ("deleter", C.c_void_p)]


class DLPackVersion(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32)]


class DLManagedTensorVersioned(C.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", C.c_void_p), ("deleter", C.c_void_p),
                ("flags", C.c_uint64), ("dl_tensor", DLTensor)]


# (kind, itemsize) <-> (DLPack type code, bits). bfloat16 is its own code; bool is kDLBool; complex is
# kDLComplex with the bits of both parts (complex64: 64).
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_BFLOAT = 4


def dl_dtype(dtype: np.dtype) -> tuple[int, int]:
    if dtype.name == "bfloat16":
        return _BFLOAT, 16
    code = _CODES.get(dtype.kind)
    if code is None:
        raise BufferError(f"__dlpack__: dtype {dtype} has no DLPack type code")
    return code, dtype.itemsize * 8


def np_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    if lanes != 1:
        raise BufferError(f"from_dlpack: vector dtypes (lanes={lanes}) are not supported")
    if code == _BFLOAT and bits == 16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if code == 6 and bits == 8:
        return np.dtype(np.bool_)
    kind = {0: "i", 1: "u", 2: "f", 5: "c"}.get(code)
    if kind is None or bits % 8:
        raise BufferError(f"from_dlpack: DLPack dtype (code {code}, {bits} bits) is not supported")
    return np.dtype(f"{kind}{bits // 8}")


# -- CPython capsule API -------------------------------------------------------------------------------
def _fn(name: str, restype, *argtypes):
    # Each its own prototype: C.pythonapi caches one object per name, so setting argtypes twice clashes.
    return C.PYFUNCTYPE(restype, *argtypes)((name, C.pythonapi))


_is_valid = _fn("PyCapsule_IsValid", C.c_int, C.py_object, C.c_char_p)
_get_ptr = _fn("PyCapsule_GetPointer", C.c_void_p, C.py_object, C.c_char_p)
_set_name = _fn("PyCapsule_SetName", C.c_int, C.py_object, C.c_char_p)

_live = [0]  # exported capsules whose owner is still held (tests check that none leak)
_live_lock = threading.Lock()


class _Hold(bytearray):
    """A few bytes for numpy's placeholder array, and the reference that keeps ``owner`` alive."""

    def __init__(self, n: int, owner: Any):
        super().__init__(n)
        self.owner = owner
        with _live_lock:
            _live[0] += 1

    def __del__(self) -> None:
        with _live_lock:
            _live[0] -= 1


def make_capsule(ptr: int, shape: tuple, dtype: np.dtype, device: tuple[int, int], owner: Any, *,
                 versioned: bool, read_only: bool = True, copied: bool = False) -> Any:
    """A DLPack capsule over ``ptr`` (compact row-major); ``owner`` lives until the deleter runs.

    numpy builds the capsule (a tiny zero-stride placeholder array whose base holds ``owner``) and we
    rewrite its pointer, device, dtype, strides and flags. So the capsule destructor and the deleter
    are numpy's C functions: Python callbacks called from C could run while an exception is pending
    (a consumer failing half-way), which corrupts the interpreter's error state."""
    code, bits = dl_dtype(dtype)
    shape = tuple(int(n) for n in shape)
    nd = len(shape)
    # (numpy has no 16-byte unsigned type: complex stands in for itself)
    stand_in = np.dtype(dtype) if dtype.kind in "bc" else np.dtype(f"u{dtype.itemsize}")
    hold = _Hold(max(8, dtype.itemsize), owner)
    one = np.frombuffer(hold, dtype=stand_in, count=1)
    placeholder = np.lib.stride_tricks.as_strided(one.reshape(()), shape=shape, strides=(0,) * nd)
    del hold, one
    capsule = placeholder.__dlpack__(max_version=VERSION) if versioned else placeholder.__dlpack__()
    name = b"dltensor_versioned" if versioned else b"dltensor"
    addr = _get_ptr(capsule, name)
    m = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_address(addr)
    t = m.dl_tensor
    if t.ndim != nd:
        raise BufferError("__dlpack__: unexpected capsule layout from numpy")
    t.data = ptr or None
    t.byte_offset = 0
    t.device = DLDevice(device[0], device[1])
    t.dtype = DLDataType(code, bits, 1)
    if t.strides:
        stride = 1
        for i in range(nd - 1, -1, -1):
            t.strides[i] = stride
            stride *= max(1, shape[i])
    if versioned:
        m.flags = (FLAG_READ_ONLY if read_only else 0) | (FLAG_IS_COPIED if copied else 0)
    return capsule


def live_exports() -> int:
    """Capsules whose memory is still held for a consumer (tests check that none leak)."""
    return _live[0]


class Tensor:
    """An opened DLPack capsule: pointer, shape, element strides (None: compact), dtype, device."""

    __slots__ = ("__weakref__", "_deleter", "_managed", "device", "dtype", "ptr", "read_only", "shape", "strides")

    def __init__(self, managed: int, deleter: int, t: DLTensor, read_only: bool):
        self._managed, self._deleter = managed, deleter
        self.read_only = read_only
        self.device = (int(t.device.device_type), int(t.device.device_id))
        self.dtype = np_dtype(t.dtype.code, t.dtype.bits, t.dtype.lanes)
        nd = int(t.ndim)
        self.shape = tuple(int(t.shape[i]) for i in range(nd))
        self.strides = tuple(int(t.strides[i]) for i in range(nd)) if t.strides else None
        self.ptr = (t.data or 0) + int(t.byte_offset)

    @property
    def contiguous(self) -> bool:
        """Compact row-major (dimensions of size 1 may have any stride)."""
        if self.strides is None:
            return True
        want = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != want:
                return 0 in self.shape
            want *= n
        return True

    def release(self) -> None:
        """Call the producer's deleter (once): the producer may then free or reuse the memory."""
        managed, deleter = self._managed, self._deleter
        self._managed = self._deleter = 0
        if managed and deleter:
            # PYFUNCTYPE keeps the GIL held: some producers' deleters touch Python objects without taking it.
            C.PYFUNCTYPE(None, C.c_void_p)(deleter)(managed)


def open_capsule(capsule: Any) -> Tensor:
    """Take ownership of an unconsumed DLPack capsule (versioned or legacy)."""
    if _is_valid(capsule, b"dltensor_versioned"):
        managed = _get_ptr(capsule, b"dltensor_versioned")
        m = DLManagedTensorVersioned.from_address(managed)
        if m.version.major > VERSION[0]:
            raise BufferError(f"from_dlpack: the producer's DLPack {m.version.major}.{m.version.minor} is newer "
                              f"than the {VERSION[0]}.x laneflow reads")
        _set_name(capsule, b"used_dltensor_versioned")
        read_only = bool(m.flags & FLAG_READ_ONLY)
    elif _is_valid(capsule, b"dltensor"):
        managed = _get_ptr(capsule, b"dltensor")
        m = DLManagedTensor.from_address(managed)
        _set_name(capsule, b"used_dltensor")
        read_only = False
    else:
        raise BufferError("from_dlpack: not an unconsumed DLPack capsule (a capsule can be consumed only once)")
    deleter = m.deleter or 0
    try:
        return Tensor(managed, deleter, m.dl_tensor, read_only)
    except BaseException:
        if deleter:
            C.PYFUNCTYPE(None, C.c_void_p)(deleter)(managed)
        raise
