"""Failures only the GPU can see (an index array computed on the device out of range, cuSOLVER's
``devInfo``), reported without a host wait in the command.

A kernel that can fail gets a *slot*: a few 64-bit words of pinned, device-mapped host memory, zeroed
by the host before the launch. The kernel writes there (an index kernel stores a flag and a bad
index; a solver command copies its ``devInfo`` words in with one async copy), the command attaches a
:class:`~laneflow.runtime.lane.DeferredCheck` to its outputs, and the host reads the slot only at the
wait that needs a value computed from them, after the command has finished. The lane never waits.

A slot returns to the pool once its check object is gone *and* its command is known finished (the
GPU may still write to it before that). Inside a CUDA graph (``lf.compile``) no command is running
while kernels are captured: a kernel that writes its slot at every run (cuSOLVER's devInfo scan) gets
a slot of the graph, copied at each launch into a fresh one that launch's values are checked with; one
that writes only on failure (index kernels) gets a graph slot too, zeroed by a small kernel captured
just before it, so every run starts clean (index arrays the host can see are checked there when a call
binds them, ``cudagraph/binding.py``, and the kernel needs no slot).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable

import numpy as np
from cuda.bindings import driver as cu

from ...errors import LaneflowError
from ...runtime.lane import DeferredCheck
from .driver import DeviceContext, check

#: 64-bit words per slot: an index kernel writes (flag, bad value) per index array; a solver command
#: copies its devInfo words (int32) into them.
SLOT_WORDS = 8
_PAGE_SLOTS = 1024


class CheckSlots:
    """The pinned slots of one device."""

    def __init__(self, ctx: DeviceContext):
        self.ctx = ctx
        self._lock = threading.RLock()  # give_back may run in GC while take() holds it
        self._free: list[int] = []
        self._retiring: list = []        # (slot, lane, seq): the check is gone, the command may not be
        self._pages: list = []           # (host address, device address, words view) per page
        self.scratch = None

    def take(self) -> int:
        """A zeroed slot (index into the pages)."""
        with self._lock:
            if not self._free and self._retiring:
                retiring, self._retiring = self._retiring, []  # a give_back from GC meanwhile lands in the new list
                for slot, lane, seq in retiring:
                    if lane is None or lane.fence.known(seq) or lane.fence.value >= seq:
                        self._free.append(slot)
                    else:
                        self._retiring.append((slot, lane, seq))
            if not self._free:
                self._new_page()
            slot = self._free.pop()
        self.words(slot)[:] = 0
        return slot

    def give_back(self, slot: int, lane, seq: int) -> None:
        with self._lock:  # may run inside GC on any thread: only list work here
            self._retiring.append((slot, lane, seq))

    def words(self, slot: int) -> np.ndarray:
        page, i = divmod(slot, _PAGE_SLOTS)
        view = self._pages[page][2]
        return view[i * SLOT_WORDS:(i + 1) * SLOT_WORDS]

    def device_ptr(self, slot: int) -> int:
        page, i = divmod(slot, _PAGE_SLOTS)
        return self._pages[page][1] + 8 * SLOT_WORDS * i

    def scratch_ptr(self) -> int:
        """A slot for kernels captured into a CUDA graph: written, never read."""
        if self.scratch is None:
            self.scratch = self.take()
        return self.device_ptr(self.scratch)

    def _new_page(self) -> None:
        self.ctx.ensure_current()
        flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
        nbytes = _PAGE_SLOTS * SLOT_WORDS * 8
        host = check(cu.cuMemHostAlloc(nbytes, flags), "cuMemHostAlloc (check slots)")
        dev = check(cu.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer (check slots)")
        view = np.ctypeslib.as_array(ctypes.cast(int(host), ctypes.POINTER(ctypes.c_uint64)),
                                     shape=(_PAGE_SLOTS * SLOT_WORDS,))
        base = len(self._pages) * _PAGE_SLOTS
        self._pages.append((int(host), int(dev), view))
        self._free.extend(range(base + _PAGE_SLOTS - 1, base - 1, -1))


class SlotCheck(DeferredCheck):
    """A deferred check reading one slot; ``explain(words)`` turns the slot's words into an error."""

    __slots__ = ("slots", "slot", "lane", "seq")

    def __init__(self, slots: CheckSlots, slot: int, explain: Callable):
        words = slots.words(slot)
        super().__init__(lambda: explain(words))
        self.slots, self.slot, self.lane, self.seq = slots, slot, None, 0

    def bind(self, lane, seq: int) -> None:
        self.lane, self.seq = lane, seq

    def passed(self, poll: bool = False) -> bool:
        if self._read is None:
            return self._error is None
        lane = self.lane
        if lane is None or not (lane.fence.known(self.seq) or (poll and lane.fence.value >= self.seq)):
            return False
        return self.error() is None  # the command finished: its slot holds its final words

    def __del__(self) -> None:
        try:
            self.slots.give_back(self.slot, self.lane, self.seq)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def slots_of(ctx: DeviceContext) -> CheckSlots:
    s = getattr(ctx, "check_slots", None)
    if s is None:
        s = ctx.check_slots = CheckSlots(ctx)
    return s


def deferred(lane, explain: Callable, op: str = "kernel", overwrites: bool = False) -> int:
    """A slot for the running command's kernel on ``lane`` (device address), checked at the host wait
    by ``explain(words) -> error | None``.

    Inside a CUDA-graph capture: a kernel that ``overwrites`` its slot at every run (writes word 0
    whether it found a failure or not) gets a slot of the graph; each launch copies it into a fresh
    slot checked at that launch's host wait (``graph._launch``). Other kernels (which only write on
    failure) are refused there, so the compiled plan replays its commands and the failure is still
    reported."""
    slots = slots_of(lane.ctx)
    if lane.checks is None:
        temps = lane.ctx.memory.capture
        found = getattr(temps, "checks", None)
        if found is None:
            raise LaneflowError(f"{op}: checks its values on the device (indices, exponents, solver status) "
                                "outside a command or a graph capture, where nothing would report it")
        slot = slots.take()
        found.append((slot, explain))
        ptr = slots.device_ptr(slot)
        if not overwrites:  # the kernel writes only on failure: each run of the graph zeroes it first
            kern = lane.ctx.modules.get(("zero slot", SLOT_WORDS), _zero_kernel)
            kern.launch(lane.handle, (1, 1, 1), (SLOT_WORDS, 1, 1), (ptr,))
        return ptr
    slot = slots.take()
    lane.defer(SlotCheck(slots, slot, explain))
    return slots.device_ptr(slot)


def _zero_kernel() -> tuple[str, str, str]:
    src = (f'extern "C" __global__ void lf_zero_slot(unsigned long long* __restrict__ w) {{\n'
           f"  if (threadIdx.x < {SLOT_WORDS}) w[threadIdx.x] = 0ULL;\n}}\n")
    return src, "lf_zero_slot", "p"
