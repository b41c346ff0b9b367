"""DLPack for laneflow arrays (CPU here; GPU in :mod:`.gpu`). Exported memory is marked so laneflow
never writes it in place afterwards.

``lf.from_dlpack(t)`` shares ``t``'s memory and sees later writes the producer makes to it (that is
the DLPack contract); copy with ``lf.array(t)`` to get a value. An export shares laneflow's memory
read-only with a versioned (DLPack >= 1.0) consumer. On the CPU a legacy consumer, which cannot be told
the memory is read-only, gets a private copy; on the GPU it shares the memory too (JAX needs that;
copying every export would cost memory and bandwidth), and must not write it.

GPU arrays export zero-copy (device type kDLCUDA = 2) and import CUDA producers zero-copy, stream-correct
per the DLPack spec; objects with only ``__cuda_array_interface__`` (v3) import too. See :mod:`.gpu`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_MANAGED = 1, 2, 13


def device_tuple(device) -> tuple[int, int]:
    return (_KDL_CPU, 0) if device.type == "cpu" else (_KDL_CUDA, device.index)


def export(x, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None):
    if x.device.type != "cpu":
        if dl_device is not None and tuple(dl_device) != device_tuple(x.device):
            if tuple(dl_device) != (_KDL_CPU, 0):
                raise BufferError(f"__dlpack__: cannot export a {x.device} array to DLPack device {tuple(dl_device)}")
            if copy is False:
                raise BufferError("__dlpack__: exporting a GPU array to the CPU needs a copy, but copy=False was given")
            host = np.array(x._host())  # a private host copy the consumer owns
            return host.__dlpack__(**({"max_version": max_version} if max_version is not None else {}))
        from .gpu import export_dlpack

        return export_dlpack(x, stream=stream, max_version=max_version, copy=copy)
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


def from_dlpack(obj: Any, *, stream: Any = None):
    """An lf.Array over another library's memory: zero-copy for CPU and CUDA producers (a strided GPU
    tensor is copied). ``stream=`` picks the laneflow stream (default: the device's default stream);
    a CUDA producer orders its pending work before that stream's lanes, without a host wait. Objects
    with only ``__cuda_array_interface__`` (v3) are accepted too."""
    from ..array import Array
    from ..dtypes import dtype as _dtype
    from ..graph.node import ArrayData
    from ..ops.core import stream_of

    if not hasattr(obj, "__dlpack__"):
        if hasattr(obj, "__cuda_array_interface__"):
            from .gpu import from_cuda_array_interface

            return from_cuda_array_interface(obj, stream)
        raise TypeError(f"from_dlpack: {type(obj).__name__} implements neither __dlpack__ nor __cuda_array_interface__")
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_KDL_CPU, 0)
    if dev[0] in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        from .gpu import from_dlpack_gpu

        return from_dlpack_gpu(obj, dev, stream)
    if dev[0] != _KDL_CPU:
        raise BufferError(f"from_dlpack: DLPack device type {dev[0]} is not supported (CPU and CUDA are)")
    host = np.from_dlpack(obj)
    try:
        dtype = _dtype(host.dtype)
    except TypeError as e:
        raise TypeError(f"from_dlpack: {e}") from None
    if not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)
    st = stream_of(stream if stream is not None else "cpu", "from_dlpack")
    if st.device.type != "cpu":  # host memory for a GPU stream: one copy there (not zero-copy)
        from ..ops.creation import array

        return array(host, dtype=dtype, stream=st)
    from ..runtime.buffer import Buffer

    d = ArrayData(host.shape, dtype, st, None)
    d.buffer = Buffer(st.device, host.nbytes, host)
    d.buffer.exported = True
    return Array._wrap(d)
