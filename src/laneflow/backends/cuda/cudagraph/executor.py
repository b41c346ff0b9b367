"""A compiled plan run as one multi-lane CUDA graph (``lf.compile`` on the GPU): the executor.

The plan (``graph/plan.py``) is captured at its second call (``capture.py``: steps over up to eight
branches, edges the data dependencies) and every later call is one command on lane 0 of the caller's
stream: the encoder orders it after the writers of the arguments (and after the readers of the memory
it overwrites), and its work is a few argument copies plus ``cuGraphLaunch``. Memory is fixed at
capture, so no call allocates: intermediates live in the plan's arena (``graph/memory_plan.py``),
returned values in an output set (``outputs.py``), arguments are read in place or staged
(``binding.py``), and device-side checks get per-launch slots (``checks.py``).

What cannot be captured (a kernel that reads host memory, a library call that synchronises) makes the
plan fall back to replaying its commands through the lanes; ``CompiledFunction.stats()`` says which.
"""

from __future__ import annotations

import weakref
from typing import Any

from cuda.bindings import driver as cu

from ....runtime.buffer import Buffer
from ..driver import check
from ..handles import device_handles
from ..lanes import CudaLane
from ..memory import ViewArray
from . import capture
from .binding import Arguments, host_checks
from .capture import _NO_TIMING, CaptureUnsupported, Temps, assign_branches
from .checks import launch_checks, release_temps
from .outputs import Lease, OutBuffer, OutputSets, OutSet, allocate_static


class GraphPlan:
    """The CUDA graph of one compiled signature. Built by :meth:`CUDABackend.graph_plan`."""

    def __init__(self, backend, plan, stream):
        steps = plan.steps
        device = stream.device
        for step in steps:
            if step.stream.backend is not backend or step.stream.device != device:
                raise CaptureUnsupported(f"a step runs on {step.stream.device}, the call's stream on {device}")
        # The graph keeps the plan's steps, never the plan (which owns the graph).
        self.backend, self.steps, self.stream, self.device = backend, steps, stream, device
        self.ctx = backend.context(device.index)
        self.name = "compiled graph"
        # -- dependencies and branches ----------------------------------------------------------
        self.deps = deps = plan.deps
        # Arguments whose values some kernel validates on the host when it can see them (index bounds,
        # integer powers): a call passing such a value with a host copy runs as commands, so it raises
        # exactly as eager does; the graph has no host to check with.
        self.host_checked = host_checks(steps)
        self._host_passed: dict = {}  # argument position -> the host copy that last passed its check
        self.consts = []  # captured values the graph reads: ordered after their (one-time) writers
        for step in steps:
            for kind, v in step.srcs:
                if kind == "const" and not any(v.buffer is c for c in self.consts):
                    self.consts.append(v.buffer)
        self.const_ptrs = [c.data.ptr for c in self.consts]
        self._movable_consts = [i for i, c in enumerate(self.consts) if c.__class__ is OutBuffer]
        # Pinned steps (lf.distributed's collectives): one after another in the graph, in call order
        # (every rank must reach NCCL's collectives in the same order), and each launch ordered on the
        # GPU with the eager collectives of their communication lanes (``_pinned_launch``).
        pinned = [j for j, step in enumerate(steps) if step.prim.lane_for is not None]
        if pinned:
            deps = [list(ds) for ds in deps]
            for a, b in zip(pinned, pinned[1:]):
                if a not in deps[b]:
                    deps[b].append(a)
            self.deps = deps
        self.pinned = PinnedLanes(self.ctx, [steps[j].prim for j in pinned], stream) if pinned else None
        self.branch_of, self.branches = assign_branches(deps, capture.MAX_BRANCHES)
        self.signals = set()  # steps another branch waits for
        for j, ds in enumerate(deps):
            for d in ds:
                if self.branch_of[d] != self.branch_of[j]:
                    self.signals.add(d)
        # -- memory ------------------------------------------------------------------------------
        self.spec_of = {slot: spec for step in steps for slot, spec in zip(step.slots, step.specs)}
        # Donated arguments written in place (lf.compile(donate_argnums=...)): each has a state buffer
        # of the graph's own, which the graph reads the argument from and writes the new value into;
        # the call's value of that slot is the state buffer itself, so passing it back next call (a KV
        # cache, ``cache = step(cache, ...)``) needs no copy. Another buffer passed is copied in first.
        self.inplace = dict(plan.inplace)  # slot -> argument
        ctx = backend.context(device.index)
        self.states = {arg: allocate_static(ctx, device, self.spec_of[slot].shape, self.spec_of[slot].dtype,
                                            "donated argument") for slot, arg in self.inplace.items()}
        self._owners: dict = {}  # argument -> weakref of the value whose buffer its state buffer is
        returned = []
        for ref, *_ in plan.outputs:
            if ref[0] == "slot" and ref[1] not in returned and ref[1] not in self.inplace:
                returned.append(ref[1])
        self.returned = returned
        # Intermediates: the plan's arena (made by its first, command-list replay), shared with it.
        self.regions: list[Buffer] = []
        self.views: dict[int, ViewArray] = {}
        for slot, (region, view) in (plan.arena or {}).items():
            self.views[slot] = view
            if not any(region is r for r in self.regions):
                self.regions.append(region)
        self.outs = OutputSets(backend, self.ctx, device, returned, self.spec_of)
        # -- arguments ---------------------------------------------------------------------------
        self.args = Arguments()
        self.lanes: list = []
        self.captures = self.updates = self.launches = self.host_calls = 0
        self.nodes = 0
        self.last_point = None
        self._last_args: list | None = None
        self._last_datas: list | None = None  # the argument values of the last launch (a list compile passes again)
        self._reads: list = []
        self._read_writers: list | None = None  # the writers of _reads at a launch that found them clean
        self._static_writes: list | None = None
        self._copies: list = []
        # cuSOLVER calls in the graph: they run on the graphs' own handle, so launches of such graphs
        # go one after another (each writes the device's graph token)
        self.has_linalg = any(step.prim.kind == "linalg" for step in steps)

    # -- public ----------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {"mode": "cuda graph", "steps": len(self.steps), "nodes": self.nodes,
                "branches": self.branches, "captures": self.captures, "updates": self.updates,
                "launches": self.launches, "staged_args": sorted(self.args.staged), "evacuated": self.outs.evacuated,
                "host_checked_calls": self.host_calls, "output_sets": len(self.outs.sets),
                "arena_bytes": sum(r.nbytes for r in self.regions), "output_bytes": self.outs.out_bytes}

    def misses(self, datas: list) -> int:
        """How many of a call's arguments this graph would copy in, not read in place (an argument
        staged already, or a buffer other than the one it reads in place): the plan cache runs a hit on
        its plan's executor that copies least, or makes another (``eval_cache._unit_for``)."""
        bound = self.args.bound
        bufs = [d.buffer for d in datas]
        if bufs == bound:  # (the usual hit: Buffers compare by identity)
            return 0
        return sum(b is None or x is not b for b, x in zip(bound, bufs))

    def inplace_buffer(self, slot: int) -> Buffer:
        """The buffer of a slot written into a donated argument: its state buffer."""
        return self.states[self.inplace[slot]]

    def own(self, slot: int, d) -> None:
        """``d`` (a call's value) holds the state buffer of ``slot``'s argument: no later call may
        overwrite that buffer while ``d`` lives, unless ``d`` is donated back."""
        arg = self.inplace[slot]
        if d.buffer is self.states[arg]:
            self._owners[arg] = weakref.ref(d)

    def _donations(self, datas: list, bufs: list, donated) -> list | None:
        """(state buffer, source buffer) copies this call needs before the launch, with ``bufs``
        reading every donated argument from its state buffer; None when the call must run as commands
        (an argument not donatable, or its state buffer held by another live value)."""
        pre = []
        for arg, st in self.states.items():
            if arg not in donated:
                return None
            b = bufs[arg]
            if b is not st:
                owner = self._owners.get(arg)
                held = owner() if owner is not None else None
                if held is not None and held is not datas[arg]:
                    return None
                pre.append((st, b))
                bufs[arg] = st
        return pre

    def run(self, datas: list, stream, donated: frozenset = frozenset()) -> Lease | None:
        """Launch for one call (under the scheduler lock); returns the call's :class:`_Lease` (its
        values are made from it, ``jit._replay``), or None when this call must run as commands.
        ``datas`` may be the very list of the last launch (``CompiledFunction`` passes it again for
        the same values): their buffers are then the same (an evaluated value's buffer never changes;
        only a compiled output's address can move, checked below). ``donated``: the arguments this
        call gives up (their in-place slots are written into their state buffers)."""
        last = self._last_args
        bufs = last if datas is self._last_datas and last is not None else [d.buffer for d in datas]
        pre: list = []
        if self.states:
            bufs = list(bufs)
            pre = self._donations(datas, bufs, donated)
            if pre is None:
                return None
        passed = self._host_passed
        for i, ok in self.host_checked:
            h = bufs[i].data.host
            if h is not None and h is not passed.get(i):
                if not ok(h):  # as eager mode raises it: this call runs as commands
                    self.host_calls += 1
                    return None
                passed[i] = h  # host copies never change (a write makes a new one): checked once
        args = self.args
        if not args.specs and datas:
            args.first(bufs, datas, self.device)
        if bufs is not last and bufs != last:
            # other arguments than the last call's: let go of those first, so that a previous output
            # passed last time (y = f(y)) does not keep its output set busy while this call picks one
            self._last_args = self._last_datas = self._read_writers = None
            self._reads = []
        last = None
        self._bind(bufs)
        for i in self._movable_consts:
            if self.consts[i].data.ptr != self.const_ptrs[i]:  # a captured value (an output) moved
                self.const_ptrs = [c.data.ptr for c in self.consts]  # every graph reads it at its old address
                self.outs.stale()
                break
        o = self.outs.choose(stream)
        if o is None:
            return None  # no memory to free an output set: this call runs as commands
        if args.movable:  # an argument may be this plan's own output, just moved by choose()
            self._bind(bufs)
        if o.exec is None or o.stale:
            self._capture(o)
        self._last_datas = None  # in step with _last_args, which _launch sets
        lease = self._launch(o, stream, bufs, pre)
        self._last_datas = datas if not self.states else None
        return lease

    def _bind(self, bufs: list) -> None:
        if self.args.bind(bufs, self._last_args, self._stage):
            self._static_writes = None  # a new staging buffer is written by each launch
            self.outs.stale()

    def _stage(self, nbytes: int) -> Buffer:
        return self.backend.allocate_region(self.device, nbytes, "compile input")

    # -- launch ----------------------------------------------------------------------------------
    def _launch(self, o: OutSet, stream, bufs: list, pre: list = ()) -> Lease:
        region = o.region
        o.drain()  # readers of dropped outputs: this write of the region waits for them
        lane = stream.lanes[0]
        o.lane = lane
        ctx = self.ctx
        base = region.data.ptr
        exec_ = o.exec
        if bufs != self._last_args:  # the same argument buffers as last call (weights): reuse the lists
            self._last_args = bufs
            self._reads = list({id(b): b for b in (*self.consts, *bufs)}.values())
            self._read_writers = None
        reads = self._reads
        # Reads with the writers they had at the last launch, which found them without error or
        # pending check: this lane follows those writers already, so the encoder only records the
        # reader entries (tens of arguments: the checks cost about 0.15 us each).
        if pre:  # donated values copied into their state buffers: read this once, without the shortcut
            reads = [*reads, *(b for _, b in pre)]
            self._read_writers = None
        writers = [b.writer for b in reads]
        if writers == self._read_writers and not pre:  # Points compare by identity
            reads, settled = (), reads
        else:
            settled = ()
            clean = True
            for b in reads:
                if b.error is not None or b.checks is not None:
                    clean = False
                    break
            self._read_writers = writers if clean else None
        if self._static_writes is None:
            self._static_writes = [*self.regions, *self.args.staged.values(), *self.states.values()]
            if self.has_linalg:  # captured cuSOLVER calls: launches of such graphs one after another
                self._static_writes.append(device_handles(ctx).graph_token)
            staged, nbytes = self.args.staged, self.args.nbytes
            self._copies = [(staged[i].data.ptr, i, nbytes[i]) for i in staged if nbytes[i]]
        copies = self._copies  # (errors of the writes: Command.run sets or clears them)
        checks = o.temps.checks if o.temps is not None else ()

        pre = [(st.data.ptr, b.data.ptr, st.nbytes) for st, b in pre]

        pinned = self.pinned

        def launch(lane, copies=copies, bufs=bufs, exec_=exec_, checks=checks, pre=pre):
            s = lane.stream
            if pinned is not None:
                pinned.before(s)
            for dst, src, n in pre:
                err, = cu.cuMemcpyDtoDAsync(dst, src, n, s)
                if err:
                    check((err,), "cuMemcpyDtoDAsync (donated input)")
            for dst, i, n in copies:
                err, = cu.cuMemcpyDtoDAsync(dst, bufs[i].data.ptr, n, s)
                if err:
                    check((err,), "cuMemcpyDtoDAsync (compiled input)")
            err, = cu.cuGraphLaunch(exec_, s)
            if err:
                check((err,), "cuGraphLaunch")
            if checks:
                launch_checks(lane, checks)
            if pinned is not None:
                pinned.after(lane)

        o.launched = self.launches = self.launches + 1
        point = self.last_point = stream.encoder.encode(self.name, launch, reads, [*self._static_writes, region],
                                                        lane=lane, settled=settled)
        # The values are made by jit._replay from the lease (their buffers only on first use):
        # the launch is simply their writer, and what it left (Command.run already ran) their error.
        lease = Lease.__new__(Lease)
        lease.set, lease.region, lease.base, lease.point = o.ref, region, base, point
        lease.error, lease.checks, lease.readers, lease.mats, lease.block = region.error, region.checks, {}, [], None
        lease.specs, lease.ctx, lease.device, lease.apart, lease.seq = self.outs.spec_index, ctx, self.device, [], o.launched
        lease.deaths, lease.done, lease.owned = [], False, False
        o.lease = weakref.ref(lease)
        o.busy = o.launched  # until the lease's finaliser has queued its readers
        return lease

    # -- capture ---------------------------------------------------------------------------------
    def _capture_lanes(self) -> list:
        while len(self.lanes) < self.branches:
            self.lanes.append(CudaLane(self.ctx, self.device, -1, len(self.lanes)))
        return self.lanes

    def _data(self, kind: str, v: Any, o: OutSet):
        if kind == "slot":
            return self._slot_view(v, o)
        if kind == "const":
            return v.buffer.data
        shape, dtype = self.args.specs[v]
        return ViewArray(self.ctx, shape, dtype, self.args.address(v))

    def _slot_view(self, slot: int, o: OutSet) -> ViewArray:
        v = self.views.get(slot)
        if v is None and slot in self.inplace:
            spec = self.spec_of[slot]
            return ViewArray(self.ctx, spec.shape, spec.dtype, self.states[self.inplace[slot]].data.ptr)
        if v is None:
            spec = self.spec_of[slot]
            v = ViewArray(self.ctx, spec.shape, spec.dtype, o.region.data.ptr + self.outs.out_offsets[slot])
        return v

    def _capture(self, o: OutSet) -> None:
        capture.capture(self, o)

    # -- teardown --------------------------------------------------------------------------------
    def _free_temps(self, temps: Temps) -> None:
        release_temps(self.ctx, temps, self.last_point)

    def _drop_lanes(self) -> None:
        last = self.last_point
        for lane in self.lanes:
            if last is not None:  # workspaces are freed on the lane: after the graph's last launch
                lane._enqueue_wait(last)
            lane.close()
        self.lanes = []

    def __del__(self) -> None:
        # Any thread, maybe inside GC: hand the driver objects to the next safe point (Memory.collect).
        try:
            self.ctx.memory.retired.append(_Closer(self))
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _Closer:
    """Destroys a dropped graph's executable, scratch and capture lanes at the next safe point; memory
    frees and lane teardown are ordered after the graph's last launch."""

    def __init__(self, g: GraphPlan):
        self.ctx, self.lanes, self.last = g.ctx, g.lanes, g.last_point
        self.execs = [o.exec for o in g.outs.sets if o.exec is not None]
        self.temps = [o.temps for o in g.outs.sets if o.temps is not None]

    def destroy(self) -> None:
        self.ctx.ensure_current()
        for ex in self.execs:
            cu.cuGraphExecDestroy(ex)  # an in-flight launch completes first
        for t in self.temps:
            release_temps(self.ctx, t, self.last)
        for lane in self.lanes:
            if self.last is not None:
                lane._enqueue_wait(self.last)
            lane.destroy()


class PinnedLanes:
    """The communication lanes of a graph's collectives: a launch starts after the work already on
    them and they continue after it (events on the GPU; the host never waits), so a graph's
    collectives and the eager ones of the same communicator run in the order they were called.
    After each launch every primitive's ``watch(lane)`` follows it (the NCCL watchdog)."""

    def __init__(self, ctx, prims: list, stream):
        self.streams = list({lane.handle: lane.stream for lane in (p.lane_for(stream) for p in prims)}.values())
        self.watchers = list({id(p.transport): p for p in prims}.values())
        ctx.ensure_current()
        self.events = [check(cu.cuEventCreate(_NO_TIMING), "cuEventCreate (pinned lanes)") for _ in self.streams]
        self.ctx = ctx

    def before(self, s) -> None:
        for p in self.watchers:  # a broken group or aborted communicator: no launch (its kernels would use it)
            p.ready()
        for h, ev in zip(self.streams, self.events):
            check(cu.cuEventRecord(ev, h), "cuEventRecord (communication lane)")
            check(cu.cuStreamWaitEvent(s, ev, 0), "cuStreamWaitEvent (communication lane)")

    def after(self, lane) -> None:
        s = lane.stream
        for h, ev in zip(self.streams, self.events):
            check(cu.cuEventRecord(ev, s), "cuEventRecord (compiled launch)")
            check(cu.cuStreamWaitEvent(h, ev, 0), "cuStreamWaitEvent (compiled launch)")
        for p in self.watchers:
            p.watch(lane)

    def __del__(self):
        for ev in getattr(self, "events", ()):
            try:
                cu.cuEventDestroy(ev)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass
