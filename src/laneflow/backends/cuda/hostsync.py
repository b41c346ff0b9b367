"""GPU waits on CPU lanes without spinning a kernel or blocking the encoder.

Each CPU lane that a GPU stream waits on gets one 64-bit word of pinned, device-mapped host memory
that mirrors its fence. The stream waits with ``cuStreamWaitValue64(word >= seq)`` (done by the
GPU's front end, no SM is used) and a helper thread, parked on the CPU fence's condition variable,
writes the word once the CPU lane has passed the point. Helper threads are pooled; one is started
only when none is idle, so waits never queue behind each other (which could deadlock).
On a device without 64-bit stream memory operations the encoder waits on the host instead.

The encoder also waits on the host when the CPU lane's work up to the point may call the driver (a
copy from device memory, a wait for a GPU lane: ``ThreadLane.driver_seq``). A stream parked on a host
word is, to the driver, a kernel that has not finished, and some driver calls synchronise the whole
context: loading a module (``cuModuleLoadData``; libraries load their kernels lazily on first use)
waits for every stream while holding a lock that the CPU lane's ``cuMemcpyDtoH`` then waits for, and
the word is never written. The H200 suite hung this way (2026-12-04: the main thread in
``cuModuleLoadData``, a CPU lane in ``cuMemcpyDtoH``, the helper parked on the CPU fence). A CPU lane
doing only host work always reaches its point, so a device-side wait for it is safe. Not counted as a
driver call: a CPU command polling the GPU checks its inputs inherited (``cuEventQuery``, which does not
block; whether it can wait for a loading module is not known).
"""

from __future__ import annotations

import ctypes
import queue
import threading
import weakref
from typing import Any

import numpy as np
from cuda.bindings import driver as cu

from .driver import DeviceContext, check

_WORDS = 512  # words per pinned page
_GEQ = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value


class HostSignals:
    def __init__(self, ctx: DeviceContext):
        self.ctx = ctx
        self._lock = threading.Lock()
        self._pages: list = []
        self._next = _WORDS
        self._slots = weakref.WeakKeyDictionary()  # cpu lane -> (view, index, device address)
        self._idle: list = []

    def gpu_wait(self, stream: Any, point: Any) -> None:
        lane, seq = point.lane, point.seq
        if not self.ctx.stream_mem_ops or getattr(lane, "driver_seq", 0) > lane.fence.value:
            lane.host_wait(seq)
            return
        view, i, addr = self._slot(lane)
        if int(view[i]) >= seq:
            return
        check(cu.cuStreamWaitValue64(stream, addr, seq, _GEQ), "cuStreamWaitValue64")
        self._run(lambda: self._publish(lane, view, i, seq))

    def _publish(self, lane, view, i, seq) -> None:
        lane.host_wait(seq)
        v = max(seq, lane.fence.value)
        with self._lock:
            if int(view[i]) < v:
                view[i] = v

    def _slot(self, lane):
        with self._lock:
            s = self._slots.get(lane)
            if s is None:
                if self._next == _WORDS:
                    self.ctx.ensure_current()
                    flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
                    host = check(cu.cuMemHostAlloc(_WORDS * 8, flags), "cuMemHostAlloc")
                    dev = check(cu.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer")
                    view = np.ctypeslib.as_array(ctypes.cast(int(host), ctypes.POINTER(ctypes.c_uint64)),
                                                 shape=(_WORDS,))
                    view[:] = 0
                    self._pages.append((host, int(dev), view))
                    self._next = 0
                host, dev, view = self._pages[-1]
                i = self._next
                self._next += 1
                view[i] = lane.fence.value
                s = self._slots[lane] = (view, i, dev + 8 * i)
            return s

    def _run(self, job) -> None:
        with self._lock:
            w = self._idle.pop() if self._idle else None
        if w is None:
            w = _Helper(self)
        w.jobs.put(job)


class _Helper(threading.Thread):
    def __init__(self, owner: HostSignals):
        super().__init__(name="laneflow-cuda-hostwait", daemon=True)
        self.owner = owner
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.start()

    def run(self) -> None:
        owner = self.owner
        while True:
            try:
                job = self.jobs.get(timeout=30.0)
            except queue.Empty:
                with owner._lock:
                    if self.jobs.empty() and self in owner._idle:
                        owner._idle.remove(self)
                        return
                continue
            try:
                job()
            except Exception:  # noqa: BLE001 - a failed CPU command still signals its fence
                pass
            with owner._lock:
                owner._idle.append(self)
