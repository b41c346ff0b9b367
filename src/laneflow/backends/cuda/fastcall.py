"""The driver calls every command makes, with as little Python around them as possible.

A tiny op costs laneflow a kernel launch, an event record, and often a stream-ordered allocation and
free. Through cuda-bindings each call converts its arguments to typed objects and its result to a
``CUresult`` enum; through ``ctypes`` on the driver library itself it passes plain integers (the
handles' addresses) and gets an ``int`` back. :func:`calls` gives one object with those few calls,
bound to ctypes when laneflow talks to the real driver (``libcuda``), and to the module ``cu`` of
``driver.py`` otherwise (the fake driver in tests patches that module, so it sees every call).
``LANEFLOW_FAST_DRIVER=0`` uses cuda-bindings for them too; ``tools/probe_driver_calls.py`` measures
both on a GPU.

Every function returns the ``CUresult`` as an int (0: success); handles are passed as ints
(``int(stream)``, ``int(event)``, ``int(function)``, ``int(pool)``).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from cuda.bindings import driver as _real

_ENABLED = os.environ.get("LANEFLOW_FAST_DRIVER", "1") != "0"


class Calls:
    """The per-command driver calls. ``launch(f, gx, gy, gz, bx, by, bz, smem, stream, argv)``,
    ``record(event, stream)``, ``query(event)``, ``wait_event(stream, event)``,
    ``alloc(nbytes, pool, stream) -> (err, ptr)``, ``free(ptr, stream)``,
    ``copy_dtod(dst, src, nbytes, stream)``, ``copy_htod(dst, host_addr, nbytes, stream)``."""

    fast = False


def _through(cu) -> Calls:
    """The calls through a cuda-bindings-like module (the real one, or the tests' fake)."""
    c = Calls()
    c.launch = lambda f, gx, gy, gz, bx, by, bz, smem, s, argv: int(cu.cuLaunchKernel(f, gx, gy, gz, bx, by, bz,
                                                                                     smem, s, argv, 0)[0])
    c.record = lambda ev, s: int(cu.cuEventRecord(ev, s)[0])
    c.query = lambda ev: int(cu.cuEventQuery(ev)[0])
    c.wait_event = lambda s, ev: int(cu.cuStreamWaitEvent(s, ev, 0)[0])

    def alloc(nbytes, pool, s):
        err, ptr = cu.cuMemAllocFromPoolAsync(nbytes, pool, s)
        return int(err), int(ptr) if not err else 0

    c.alloc = alloc
    c.free = lambda ptr, s: int(cu.cuMemFreeAsync(ptr, s)[0])
    c.copy_dtod = lambda dst, src, n, s: int(cu.cuMemcpyDtoDAsync(dst, src, n, s)[0])
    c.copy_htod = lambda dst, src, n, s: int(cu.cuMemcpyHtoDAsync(dst, src, n, s)[0])
    return c


def _ctypes() -> Calls | None:
    """The calls straight into libcuda, or None when it cannot be loaded here."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    vp, u32, sz, i32 = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t, ctypes.c_int

    def fn(name: str, *argtypes):
        f = getattr(lib, name)
        f.argtypes, f.restype = list(argtypes), i32
        return f

    launch = fn("cuLaunchKernel", vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp)
    record = fn("cuEventRecord", vp, vp)
    query = fn("cuEventQuery", vp)
    wait = fn("cuStreamWaitEvent", vp, vp, u32)
    alloc = fn("cuMemAllocFromPoolAsync", ctypes.POINTER(ctypes.c_uint64), sz, vp, vp)
    free = fn("cuMemFreeAsync", ctypes.c_uint64, vp)
    dtod = fn("cuMemcpyDtoDAsync_v2", ctypes.c_uint64, ctypes.c_uint64, sz, vp)
    htod = fn("cuMemcpyHtoDAsync_v2", ctypes.c_uint64, vp, sz, vp)
    out = ctypes.c_uint64(0)
    ref = ctypes.byref(out)
    c = Calls()
    c.fast = True
    c.launch = lambda f, gx, gy, gz, bx, by, bz, smem, s, argv: launch(f, gx, gy, gz, bx, by, bz, smem, s, argv, None)
    c.record = record
    c.query = query
    c.wait_event = lambda s, ev: wait(s, ev, 0)

    def alloc_async(nbytes, pool, s):  # under the device lock or the scheduling lock: one out-word is enough
        err = alloc(ref, nbytes, pool, s)
        return err, out.value if not err else 0

    c.alloc = alloc_async
    c.free = free
    c.copy_dtod = dtod
    c.copy_htod = htod
    return c


_calls: list = [None, None]  # (the cu module they were made for, Calls)


def calls(cu: Any) -> Calls:
    """The per-command calls for driver module ``cu`` (``driver.py``'s, which the fake driver patches)."""
    made_for, c = _calls
    if c is None or made_for is not cu:
        c = (_ctypes() if cu is _real and _ENABLED else None) or _through(cu)
        _calls[0], _calls[1] = cu, c
    return c
