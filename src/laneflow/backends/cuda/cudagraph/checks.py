"""Check slots of a compiled CUDA graph: failures only the device sees, reported per call.

A captured kernel that checks its values on the device (cuSOLVER's devInfo scan) writes a slot of the
graph at every run (``checks.deferred(..., overwrites=True)``). Each launch copies those slots, in
stream order, into fresh ones attached to that call's values (:func:`launch_checks`), so a failure
is raised for its own call only, even when a later launch rewrites the graph's slots first.
"""

from __future__ import annotations

from cuda.bindings import driver as cu

from ..checks import SLOT_WORDS, SlotCheck, slots_of
from ..driver import check


def release_temps(ctx, temps, last) -> None:
    """A dropped graph's scratch and check slots go back once its last launch (``last``) is done."""
    after = (last,) if last is not None else ()
    for p in temps.ptrs:
        ctx.memory.pending.append((p, None, after, 0))  # graph memory: never a lane's free list
    temps.ptrs = set()
    if temps.checks:
        slots = slots_of(ctx)
        for slot, _explain in temps.checks:
            slots.give_back(slot, last.lane if last is not None else None, last.seq if last is not None else 0)
        temps.checks = []


def launch_checks(lane, checks: list) -> None:
    """After a launch on ``lane``: copy each check slot the graph's kernels wrote into a fresh slot,
    in stream order, and attach it to the launch (``lane.defer``), so this call's values are checked
    with what this launch wrote even when a later launch rewrites the graph's slots first."""
    slots = slots_of(lane.ctx)
    s = lane.stream
    for slot, explain in checks:
        fresh = slots.take()
        err, = cu.cuMemcpyAsync(slots.device_ptr(fresh), slots.device_ptr(slot), SLOT_WORDS * 8, s)
        if err:
            slots.give_back(fresh, None, 0)
            check((err,), "cuMemcpyAsync (graph check slot)")
        lane.defer(SlotCheck(slots, fresh, explain))
