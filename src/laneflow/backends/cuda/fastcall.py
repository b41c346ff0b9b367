"""The driver calls every command makes, in one place: a kernel launch, an event record and query, a
stream wait, a stream-ordered allocation and free, a device copy.

:func:`calls` binds them to the module ``cu`` of ``driver.py``: with the real driver, to the C shim
(``cshim.py``) when it builds, else through cuda-bindings; the fake driver in tests replaces that module,
so it sees every call. Every function returns the ``CUresult`` as an int (0: success).

Calling libcuda through ``ctypes`` instead was measured and is slower (H200, 2026-12-02,
``tools/probe_driver_calls.py``, log ``docs/perf/probe-driver-calls-h200-2026-12-02.txt``): per call
cuLaunchKernel 7.44 us against cuda-bindings' 5.92, an allocation and free 3.94 against 3.00, an event
record 0.62 against 0.99; the tiny add chain cost 18.8 us per op that way against 16.0. ctypes'
argument conversion for an 11-argument launch costs more than cuda-bindings' typed wrappers.
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as _real

from . import cshim


class Calls:
    """The per-command driver calls. ``launch(f, gx, gy, gz, bx, by, bz, smem, stream, argv)``,
    ``record(event, stream)``, ``query(event)``, ``wait_event(stream, event)``,
    ``alloc(nbytes, pool, stream) -> (err, ptr)``, ``free(ptr, stream)``,
    ``copy_dtod(dst, src, nbytes, stream)``, ``copy_htod(dst, host_addr, nbytes, stream)``."""


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
    c.via = "cuda-bindings"
    return c


def _shim(mod) -> Calls:
    """The calls straight into the driver (``cshim.c``): each is one C function, no Python frame."""
    c = Calls()
    for name in ("launch", "record", "query", "wait_event", "alloc", "free", "copy_dtod", "copy_htod"):
        setattr(c, name, getattr(mod, name))
    c.via = "C shim"
    return c


_calls: list = [None, None]  # (the cu module they were made for, Calls)


def calls(cu: Any) -> Calls:
    """The per-command calls for driver module ``cu`` (``driver.py``'s, which the fake driver patches)."""
    made_for, c = _calls
    if c is None or made_for is not cu:
        mod = cshim.load() if cu is _real else None
        c = _shim(mod) if mod is not None else _through(cu)
        _calls[0], _calls[1] = cu, c
    return c
