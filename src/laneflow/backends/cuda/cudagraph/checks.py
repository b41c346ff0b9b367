"""Check slots of a compiled CUDA graph: failures only the device sees, reported per call.

A captured kernel that checks its values on the device (cuSOLVER's devInfo scan) writes a slot of the
graph at every run (``checks.deferred(..., overwrites=True)``). Each launch copies those slots, in
stream order (a small kernel), into fresh ones attached to that call's values (:func:`launch_checks`), so a failure
is raised for its own call only, even when a later launch rewrites the graph's slots first.
"""

from __future__ import annotations

from ..checks import SLOT_WORDS, SlotCheck, slots_of

#: slot copies per launch of the copy kernel (its parameters: a count, then destinations, then sources)
_PAIRS = 8


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
    with what this launch wrote even when a later launch rewrites the graph's slots first.

    The copy is a kernel (up to eight slots a launch), not ``cuMemcpyAsync``: slots are pinned host
    memory, and a host-to-host async copy runs on the host once the stream has drained, so each call
    of a compiled function waited for its own graph to finish (a decode loop's host and device work
    never overlapped; found on the H200 with ``tools/probe_decode_host.py --profile``)."""
    slots = slots_of(lane.ctx)
    kern = lane.ctx.modules.get(("copy slots", SLOT_WORDS, _PAIRS), _copy_kernel)
    for i in range(0, len(checks), _PAIRS):
        part = checks[i:i + _PAIRS]
        fresh = [slots.take() for _ in part]
        dst = [slots.device_ptr(f) for f in fresh]
        src = [slots.device_ptr(slot) for slot, _ in part]
        pad = [0] * (_PAIRS - len(part))
        try:
            kern.launch(lane.handle, (1, 1, 1), (SLOT_WORDS, _PAIRS, 1), (len(part), *dst, *pad, *src, *pad))
        except BaseException:
            for f in fresh:
                slots.give_back(f, None, 0)
            raise
        for f, (_, explain) in zip(fresh, part):
            lane.defer(SlotCheck(slots, f, explain))


def _copy_kernel() -> tuple[str, str, str]:
    ptrs = ", ".join(f"unsigned long long* d{i}" for i in range(_PAIRS))
    cptrs = ", ".join(f"const unsigned long long* s{i}" for i in range(_PAIRS))
    dl = ", ".join(f"d{i}" for i in range(_PAIRS))
    sl = ", ".join(f"s{i}" for i in range(_PAIRS))
    src = (f'extern "C" __global__ void lf_copy_slots(int n, {ptrs}, {cptrs}) {{\n'
           f"  unsigned long long* d[{_PAIRS}] = {{{dl}}};\n"
           f"  const unsigned long long* s[{_PAIRS}] = {{{sl}}};\n"
           f"  int k = threadIdx.y;\n"
           f"  if (k < n && threadIdx.x < {SLOT_WORDS}) d[k][threadIdx.x] = s[k][threadIdx.x];\n}}\n")
    return src, "lf_copy_slots", "i" + "p" * (2 * _PAIRS)
