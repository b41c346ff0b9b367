"""Capture: a compiled plan's steps recorded into one multi-lane CUDA graph.

The plan's steps are captured once (stream capture over up to :data:`MAX_BRANCHES` private capture
streams): each step runs the ordinary kernel function on a capture lane, a step that depends on a step
of another capture lane waits on an event recorded after it, so the graph's edges are exactly the
plan's data dependencies and independent steps become parallel branches. Scratch a kernel asks for
while it is captured is memory the graph owns (:class:`Temps`); library workspaces exist before the
capture starts (:func:`prewarm_libraries`).
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver as cu

from ..driver import check
from ..handles import device_handles

#: Most parallel branches a captured graph gets (capture streams per plan). Measured on an H200
#: (tools/graph_probe.py, 32 independent 16x4096 @ 4096x1024 bf16 GEMMs, device time per launch):
#: 4 branches 94.8 us, 8 branches 82.8 us, 16 branches 107.4 us, 32 branches 269.2 us.
MAX_BRANCHES = 8
_NO_TIMING = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value
_RELAXED = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


class CaptureUnsupported(Exception):
    """This plan cannot become a CUDA graph; the caller replays its commands instead."""


class Temps:
    """Scratch a kernel asks for while being captured (reduction partials, materialised operands): real
    pool memory owned by the graph, freed when the graph is."""

    def __init__(self, mem):
        self.mem = mem
        self.ptrs: set[int] = set()
        self.checks: list = []      # (check slot of the graph, explain) of captured kernels (checks.deferred)

    def alloc(self, nbytes: int) -> int:
        mem = self.mem
        err, ptr = cu.cuMemAllocFromPoolAsync(nbytes, mem.pool, mem.free_stream)
        if err:
            raise CaptureUnsupported(f"scratch of {nbytes} bytes: {err}")
        check(cu.cuStreamSynchronize(mem.free_stream), "cuStreamSynchronize (graph scratch)")
        self.ptrs.add(int(ptr))
        return int(ptr)


def assign_branches(deps: list[list[int]], limit: int) -> tuple[list[int], int]:
    """Give each step a branch: continue the branch of a dependency that ends there, else the branch
    that has been idle the longest (by dependency level). Returns (branch per step, branch count)."""
    level: list[int] = []
    branch_of: list[int] = []
    tails: list[int] = []        # last step of each branch
    for j, ds in enumerate(deps):
        lvl = 1 + max((level[d] for d in ds), default=-1)
        level.append(lvl)
        chosen = None
        for d in ds:
            b = branch_of[d]
            if tails[b] == d:
                chosen = b
                break
        if chosen is None:
            free = [b for b, t in enumerate(tails) if level[t] < lvl]
            if len(tails) < limit and not free:
                tails.append(-1)
                chosen = len(tails) - 1
            else:  # the branch idle longest; ties go to the oldest tail, so independent steps rotate
                chosen = min(free or range(len(tails)), key=lambda b: (level[tails[b]], tails[b]))
        tails[chosen] = j
        branch_of.append(chosen)
    return branch_of, max(1, len(tails))


#: The library pools whose workspaces a step of each kind uses (other kinds use none; linalg and user
#: kernels: any pool, so every pool is warmed).
_POOLS_OF = {"matmul": ("cublasLt",), "matmul_group": ("cublas",), "attention": ("cudnn",)}


def prewarm_libraries(ctx, lanes, kinds=None) -> None:
    """Library workspaces of the capture lanes exist before capture (allocating inside it would put
    allocation nodes into the graph), and are valid on every stream. Only the pools the steps' kinds
    use (``kinds``; None: all): a workspace lives as long as the graph's lanes, and a graph without
    a matmul (a cached eager step) must not pin 32 MiB of cuBLASLt workspace per lane."""
    names = None
    if kinds is not None and "linalg" not in kinds and "custom" not in kinds:
        names = {n for k in kinds for n in _POOLS_OF.get(k, ())}
    group = getattr(ctx, "handles", None)  # every library pool of the device (handles.DeviceHandles)
    for name, pool in list(group.pools.items()) if group is not None else ():
        if names is not None and name not in names:
            continue
        for lane in lanes:
            with pool.use(lane):
                pass
    for lane in lanes:
        check(cu.cuStreamSynchronize(lane.stream), "cuStreamSynchronize (capture lanes)")


def capture(g, o) -> None:
    """Capture graph ``g``'s steps into a CUDA graph for output set ``o`` and instantiate it (or update
    ``o``'s executable in place). Calls ``g._data`` and ``g._slot_view`` for each step's operands (the race
    model in tests wraps them)."""
    ctx, mem = g.ctx, g.ctx.memory
    steps = g.steps
    lanes = g._capture_lanes()
    ctx.ensure_current()
    if g.has_linalg:  # the graphs' cuSOLVER pool and the cuBLAS pool (batched LU) exist before capture
        device_handles(ctx).pool("cusolverDn-graph")
        device_handles(ctx).pool("cublas")
    prewarm_libraries(ctx, lanes, {step.prim.kind for step in steps})
    temps = Temps(mem)
    events = []

    def event():
        ev = check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate (capture)")
        events.append(ev)
        return ev

    s0 = lanes[0].stream
    check(cu.cuStreamBeginCapture(s0, _RELAXED), "cuStreamBeginCapture")
    graph = None
    failure: BaseException | None = None
    mem.capture = temps
    try:
        fork = event()
        check(cu.cuEventRecord(fork, s0), "cuEventRecord (fork)")
        for lane in lanes[1:]:
            check(cu.cuStreamWaitEvent(lane.stream, fork, 0), "cuStreamWaitEvent (fork)")
        done: dict[int, Any] = {}
        waited = [dict() for _ in lanes]  # branch -> other branch -> latest step waited for
        for j, step in enumerate(steps):
            b = g.branch_of[j]
            lane = lanes[b]
            for d in g.deps[j]:
                bd = g.branch_of[d]
                if bd != b and waited[b].get(bd, -1) < d:
                    check(cu.cuStreamWaitEvent(lane.stream, done[d], 0), "cuStreamWaitEvent (capture)")
                    waited[b][bd] = d
            ins = [g._data(kind, v, o) for kind, v in step.srcs]
            outs = [g._slot_view(slot, o) for slot in step.slots]
            g.backend.kernel_of(step.prim)(lane, step.prim, ins, outs)
            if j in g.signals:
                ev = done[j] = event()
                check(cu.cuEventRecord(ev, lane.stream), "cuEventRecord (capture)")
    except BaseException as e:  # noqa: BLE001 - end the capture whatever happened, then report
        failure = e
    finally:
        mem.capture = None
        # Join every forked lane back to the origin, also after a failure: an unjoined fork would leave
        # the capture sequence (and those streams) in an unusable state for laneflow and for other
        # libraries that capture graphs in this process.
        for lane in lanes[1:]:
            ev = event()
            e1, = cu.cuEventRecord(ev, lane.stream)
            e2, = cu.cuStreamWaitEvent(s0, ev, 0)
            if (e1 or e2) and failure is None:
                failure = CaptureUnsupported(f"joining the capture lanes: {e1 or e2!r}")
        err, graph = cu.cuStreamEndCapture(s0)
        for ev in events:
            cu.cuEventDestroy(ev)
    if failure is not None or err:
        if graph is not None and not err:
            cu.cuGraphDestroy(graph)
        g._drop_lanes()
        g._free_temps(temps)
        raise CaptureUnsupported(f"stream capture failed: {failure or err!r}") from failure
    try:
        g.nodes = int(cu.cuGraphGetNodes(graph)[-1])
    except Exception:  # noqa: BLE001 - a count for stats only
        pass
    try:
        if o.exec is not None:
            err, _info = cu.cuGraphExecUpdate(o.exec, graph)
            if err:
                cu.cuGraphExecDestroy(o.exec)
                o.exec = None
            else:
                g.updates += 1
        if o.exec is None:
            # No cuGraphUpload on the capture lane: the first launch uploads in its own stream. A
            # graph uploaded on one stream and launched on another at once sometimes never finished
            # its first launch under load (2026-12-05, H100: 19 of ~150 runs of test_compile*.py in six
            # processes failed, each log read a hang; ``tools/hang_diag.py`` showed only the launching
            # stream busy, at that launch; none of 174 runs without the upload hung).
            o.exec = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    except BaseException:
        g._free_temps(temps)
        raise
    finally:
        cu.cuGraphDestroy(graph)
    g.captures += 1
    o.stale = False
    old, o.temps = o.temps, temps
    if old is not None:  # the previous graph's scratch, once its last launch is done
        g._free_temps(old)
