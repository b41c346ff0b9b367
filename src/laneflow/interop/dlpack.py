"""DLPack and ``__cuda_array_interface__`` for laneflow arrays: the generic half.

Exported memory is marked so laneflow never writes it in place afterwards. ``lf.from_dlpack(t)`` shares
``t``'s memory and sees later writes the producer makes to it (that is the DLPack contract); copy with
``lf.array(t)`` to get a value. An export shares laneflow's memory read-only with a versioned
(DLPack >= 1.0) consumer. On the CPU a legacy consumer, which cannot be told the memory is read-only,
gets a private copy; on the GPU it shares the memory too (JAX needs that; copying every export would
cost memory and bandwidth), and must not write it.

This module evaluates arrays, marks buffers exported and wraps imported buffers as arrays; host memory
goes through numpy here. What is device specific (capsules over device pointers, stream ordering,
releasing another library's memory) is the backend's: ``Backend.export_dlpack``, ``import_dlpack`` and
``array_interface`` (the CUDA backend's are ``backends/cuda/interop.py``).

The ``Array`` methods ``__dlpack__``, ``__dlpack_device__`` and ``__cuda_array_interface__`` are
attached here (the layer above ``array.py``), as ``_array_methods.py`` attaches the operators.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from ..array import Array
from ..defaults import resolve_stream
from ..device import Device
from ..dtypes import dtype as _dtype
from ..graph import eval_cache
from ..graph import schedule as _sched
from ..graph.node import ArrayData
from ..ops.core import constant
from ..ops.primitives import Copy
from ..runtime.backend import backend_for
from ..runtime.buffer import Buffer
from ..runtime.encoder import LOCK

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_MANAGED = 1, 2, 13
#: DLPack device types of device memory -> the laneflow device type that holds it
_DEVICE_TYPES = {_KDL_CUDA: "gpu", _KDL_CUDA_MANAGED: "gpu"}


def device_tuple(device) -> tuple[int, int]:
    """``__dlpack_device__``: (DLPack device type, index)."""
    if device.type == "cpu":
        return (_KDL_CPU, 0)
    return backend_for(device, "__dlpack_device__").dlpack_device(device)


def evaluated_buffer(x, op: str, copy: bool) -> tuple[Buffer, tuple, np.dtype]:
    """The buffer of x's value (or of a private device copy), scheduled and marked exported. Under the
    scheduling lock: no other thread may reuse it in place between reading x and marking it."""
    d = x._data
    if copy:
        d = ArrayData(d.shape, d.dtype, d.stream, Copy(f"{op}.copy"), (d,))
    if d.buffer is None:
        eval_cache.schedule((d,))
    buf = d.buffer
    buf.exported = True  # never reused in place from now on
    if buf.error is None and buf.checks is not None:
        # a failure only the device can report (an index computed out of range): the consumer would
        # get unwritten elements, so wait for the value here and raise as an eval would
        _sched.wait(d)
    if buf.error is not None:
        raise buf.error.with_traceback(None)
    return buf, d.shape, d.dtype


def export(x, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None):
    """``Array.__dlpack__``: zero-copy (read-only) unless a copy is asked for or needed."""
    if x.device.type != "cpu":
        backend = backend_for(x.device, "__dlpack__")
        if dl_device is not None and tuple(dl_device) != backend.dlpack_device(x.device):
            if tuple(dl_device) != (_KDL_CPU, 0):
                raise BufferError(f"__dlpack__: cannot export a {x.device} array to DLPack device {tuple(dl_device)}")
            if copy is False:
                raise BufferError("__dlpack__: exporting a GPU array to the CPU needs a copy, but copy=False was given")
            host = np.array(x._host())  # a private host copy the consumer owns
            return host.__dlpack__(**({"max_version": max_version} if max_version is not None else {}))
        versioned = max_version is not None and tuple(max_version)[:1] >= (1,)
        with LOCK:
            buf, shape, dtype = evaluated_buffer(x, "__dlpack__", bool(copy))
            return backend.export_dlpack(buf, shape, dtype, x.device, stream=stream, versioned=versioned,
                                         copied=bool(copy))
    host = x._host()
    kw = {}
    if dl_device is not None:
        kw["dl_device"] = dl_device
    if copy is not None:
        kw["copy"] = copy
    if max_version is not None and tuple(max_version) >= (1, 0):
        # Versioned DLPack can say "read-only": share the memory, the consumer must not write it.
        view = host.view()
        view.flags.writeable = False
        return view.__dlpack__(max_version=max_version, **kw)
    # A legacy consumer cannot be told the memory is read-only and could write into this value:
    # give it a private copy (DLPack allows the producer to copy unless copy=False).
    if copy is False:
        raise BufferError("__dlpack__: a legacy (unversioned) DLPack consumer cannot be given read-only "
                          "memory without a copy, and copy=False was asked; use a DLPack >= 1.0 consumer")
    kw.pop("copy", None)
    return host.copy().__dlpack__(**kw)


_pins: dict[int, tuple] = {}  # id(Array) -> (weakref, [buffers exported through the interface])


def _pin(array, buf) -> None:
    """Keep ``buf`` alive as long as the Array object that exported it (``x[i] = v`` rebinds x)."""
    k = id(array)
    ent = _pins.get(k)
    if ent is None or ent[0]() is not array:
        def gone(r, k=k):
            e = _pins.get(k)
            if e is not None and e[0] is r:
                del _pins[k]

        ent = _pins[k] = (weakref.ref(array, gone), [])
    if not any(b is buf for b in ent[1]):
        ent[1].append(buf)


def cuda_array_interface(x) -> dict:
    """``Array.__cuda_array_interface__`` (version 3) of a GPU array; AttributeError elsewhere (so
    ``hasattr`` is False). Zero-copy; consumers must not write it; ``stream`` is the writer's lane for
    consumers to synchronise on; the memory stays alive as long as this Array object does."""
    if x.device.type != "gpu":
        raise AttributeError(f"__cuda_array_interface__: the array is on {x.device}, not a GPU")
    backend = backend_for(x.device, "__cuda_array_interface__")
    if x.dtype.name == "bfloat16":
        raise AttributeError("__cuda_array_interface__: bfloat16 has no typestr; use DLPack (__dlpack__)")
    with LOCK:
        buf, shape, dtype = evaluated_buffer(x, "__cuda_array_interface__", False)
        _pin(x, buf)
        return backend.array_interface(buf, shape, dtype)


def _wrap(buf: Buffer, shape: tuple, dtype: np.dtype, st) -> Array:
    d = ArrayData(tuple(shape), dtype, st, None)
    d.buffer = buf
    return Array._wrap(d)


def _device_stream(device: Device, stream: Any, op: str):
    st = resolve_stream(stream if stream is not None else device, op)
    if st.device != device:
        raise ValueError(f"{op}: the memory is on {device}, but stream= is on {st.device}; import it on its own "
                         "device, then move it (lf.array(x, device=...))")
    return st


def from_dlpack(obj: Any, *, stream: Any = None) -> Array:
    """An lf.Array over another library's memory: zero-copy for CPU and CUDA producers (a strided GPU
    tensor is copied). ``stream=`` picks the laneflow stream (default: the device's default stream);
    a CUDA producer orders its pending work before that stream's lanes, without a host wait. Objects
    with only ``__cuda_array_interface__`` (v3) are accepted too."""
    if not hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__cuda_array_interface__"):
            return from_cuda_array_interface(obj, stream)
        raise TypeError(f"from_dlpack: {type(obj).__name__} implements neither __dlpack__ nor __cuda_array_interface__")
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_KDL_CPU, 0)
    kind = _DEVICE_TYPES.get(dev[0])
    if kind is not None:
        st = _device_stream(Device(kind, int(dev[1])), stream, "from_dlpack")
        with LOCK:
            buf, dtype, shape = st.backend.import_dlpack(obj, st)
            return _wrap(buf, shape, dtype, st)
    if dev[0] != _KDL_CPU:
        raise BufferError(f"from_dlpack: DLPack device type {dev[0]} is not supported (CPU and CUDA are)")
    host = np.from_dlpack(obj)
    try:
        dtype = _dtype(host.dtype)
    except TypeError as e:
        raise TypeError(f"from_dlpack: {e}") from None
    if not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)
    st = resolve_stream(stream if stream is not None else "cpu", "from_dlpack")
    if st.device.type != "cpu":  # host memory for a GPU stream: one copy there (not zero-copy)
        return Array._wrap(_upload(host, dtype, st))
    buf = Buffer(st.device, host.nbytes, host)
    buf.exported = True
    return _wrap(buf, host.shape, dtype, st)


def _upload(host: np.ndarray, dtype: np.dtype, st) -> ArrayData:
    return constant(host, st, dtype, op="from_dlpack")


def from_cuda_array_interface(obj: Any, stream: Any = None) -> Array:
    """An lf.Array over an object's ``__cuda_array_interface__`` (v3 or later) memory, zero-copy when
    compact; the producer's ``stream`` is ordered before laneflow's lane (no host wait)."""
    op = "from_cuda_array_interface"
    backend = backend_for(Device("gpu", 0), op)
    device_index, fields = backend.read_array_interface(obj, op)
    st = _device_stream(Device("gpu", device_index), stream, op)
    with LOCK:
        buf, dtype, shape = st.backend.import_array_interface(obj, st, fields)
        return _wrap(buf, shape, dtype, st)


def _attach() -> None:
    """The interop methods of ``Array``."""
    Array.__dlpack__ = lambda self, *, stream=None, max_version=None, dl_device=None, copy=None: export(
        self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
    Array.__dlpack__.__doc__ = export.__doc__
    Array.__dlpack_device__ = lambda self: device_tuple(self.device)
    Array.__cuda_array_interface__ = property(cuda_array_interface, doc=cuda_array_interface.__doc__)


_attach()
