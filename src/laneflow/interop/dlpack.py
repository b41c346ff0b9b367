"""DLPack on the CPU. Exported memory is marked so laneflow never writes it in place afterwards.

Memory is shared, not copied, in both directions: ``lf.from_dlpack(t)`` sees later writes the
producer makes to ``t`` (that is the DLPack contract); copy with ``lf.array(t)`` to get a value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_KDL_CPU, _KDL_CUDA = 1, 2


def device_tuple(device) -> tuple[int, int]:
    return (_KDL_CPU, 0) if device.type == "cpu" else (_KDL_CUDA, device.index)


def export(x, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: bool | None = None):
    if x.device.type != "cpu":
        raise BufferError(f"__dlpack__: DLPack export from {x.device} is not available in this build")
    host = x._host()
    kw = {}
    if max_version is not None:
        kw["max_version"] = max_version
    if dl_device is not None:
        kw["dl_device"] = dl_device
    if copy is not None:
        kw["copy"] = copy
    return host.__dlpack__(**kw)


def from_dlpack(obj: Any, *, stream: Any = None):
    """An lf.Array over another library's memory (zero-copy on the CPU)."""
    from ..array import Array
    from ..graph.node import ArrayData
    from ..ops.core import stream_of
    from ..dtypes import dtype as _dtype

    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(obj).__name__} does not implement __dlpack__")
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (_KDL_CPU, 0)
    if dev[0] != _KDL_CPU:
        raise BufferError(f"from_dlpack: device type {dev[0]} is not supported in this build (CPU only)")
    host = np.from_dlpack(obj)
    try:
        dtype = _dtype(host.dtype)
    except TypeError as e:
        raise TypeError(f"from_dlpack: {e}") from None
    if not host.flags.c_contiguous:
        host = np.ascontiguousarray(host)
    st = stream_of(stream if stream is not None else "cpu", "from_dlpack")
    from ..runtime.buffer import Buffer

    d = ArrayData(host.shape, dtype, st, None)
    d.buffer = Buffer(st.device, host.nbytes, host)
    d.buffer.exported = True
    return Array._wrap(d)
