"""A compiled plan replayed as one multi-lane CUDA graph (``lf.compile`` on the GPU).

The plan's steps are captured once (stream capture over up to :data:`MAX_BRANCHES` private capture
streams): each step runs the ordinary kernel function on a capture lane, a step that depends on a step
of another capture lane waits on an event recorded after it, so the graph's edges are exactly the
plan's data dependencies and independent steps become parallel branches. A call is then one command on
lane 0 of the caller's stream: the encoder orders it after the writers of the arguments (and after the
readers of the memory it overwrites), and its work is a few argument copies plus ``cuGraphLaunch``.

Memory is fixed at capture, so no call allocates:

- intermediates live in the plan's regions (the static memory plan, ``graph/memory_plan.py``);
- returned values live in one *output region* (one per output set: :data:`OUTPUT_SETS`). A call's
  values are :class:`~laneflow.graph.node.LazyData` sharing one :class:`_Lease`; a value's buffer
  and device handle are made when something first uses it. When a set is needed again while the
  values of its last call are still alive, the whole region is first copied to a block of its own
  (one copy; the values' ``ptr`` change, their contents do not), so outputs stay valid after the
  next call and a loop that drops them (the usual case) copies nothing. An output exported
  zero-copy (DLPack) cannot move: the plan then gives that region to the exported arrays and takes
  a new one (one re-capture).
- arguments are read where they are (*direct*) while each call passes the same buffer (weights, say);
  an argument that changes between calls is copied into a static staging buffer (*staged*, one device
  copy per call: one driver call, where patching would touch every kernel node that reads the
  argument; the two have not been timed against each other yet). The plan keeps a direct
  argument's buffer alive, so its address cannot be reused under the graph. A staged argument larger
  than :data:`STAGE_LIMIT` is re-bound by a new capture (``cuGraphExecUpdate``) instead of copied.

What cannot be captured (a kernel that reads host memory, a library call that synchronises) makes the
plan fall back to replaying its commands through the lanes; ``CompiledFunction.stats()`` says which.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

from cuda.bindings import driver as cu

from ...runtime.buffer import Buffer
from ...errors import OutOfMemoryError
from ...runtime.encoder import LOCK
from ...ops.table import validated_on_host
from .checks import SLOT_WORDS, SlotCheck, slots_of
from .driver import check
from .handles import device_handles
from .lanes import CudaLane
from .memory import DeviceArray, ViewArray

#: Most parallel branches a captured graph gets (capture streams per plan). Measured on an H200
#: (tools/graph_probe.py, 32 independent 16x4096 @ 4096x1024 bf16 GEMMs, device time per launch):
#: 4 branches 94.8 us, 8 branches 82.8 us, 16 branches 107.4 us, 32 branches 269.2 us.
MAX_BRANCHES = 8
#: Output regions per plan (each with its own executable graph): two let ``y = f(x)`` in a loop keep
#: the previous result alive while the next is computed without copying it.
OUTPUT_SETS = 2
#: Arguments up to this size that change between calls are copied into staging memory; larger ones
#: trigger a re-capture with their new address.
STAGE_LIMIT = 64 << 20
_ALIGN = 256
_NO_TIMING = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value
_RELAXED = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED


class CaptureUnsupported(Exception):
    """This plan cannot become a CUDA graph; the caller replays its commands instead."""


class OutArray(DeviceArray):
    """A returned value's device handle, in a plan's output region or in the memory its outputs moved
    to; ``owner`` keeps that memory alive."""

    __slots__ = ("owner",)


class OutBuffer(Buffer):
    """A returned value's buffer (made on first use, ``_Lease.materialize``). Its memory belongs to the
    output region (its death frees nothing, ``_out_released``); ``lease`` keeps the call's lease alive
    while the buffer is (a graph reading it as a direct argument, a command in flight, a value written
    into it in place)."""

    __slots__ = ("lease",)


def allocate_region(ctx, device, nbytes: int, op: str) -> Buffer:
    """Memory for a plan region, usable on every stream at once (allocated on the pool's free stream,
    which is then synchronised: a one-time cost per plan)."""
    mem = ctx.memory
    h = DeviceArray(ctx, (max(nbytes, 1),), _u8())
    with ctx.lock:
        ctx.ensure_current()
        h.ptr = mem.raw_alloc(h.nbytes, mem.free_stream, op)
        check(cu.cuStreamSynchronize(mem.free_stream), "cuStreamSynchronize (region)")
    return Buffer(device, h.nbytes, h, mem.release)


def _u8():
    import numpy as np

    return np.dtype(np.uint8)


class _Temps:
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


class GraphPlan:
    """The CUDA graph of one compiled signature. Built by :meth:`CUDABackend.graph_plan`."""

    def __init__(self, backend, plan, stream):
        steps = plan.steps
        device = stream.device
        for step in steps:
            if step.stream.backend is not backend or step.stream.device != device:
                raise CaptureUnsupported("steps run on more than one device or backend")
        # The graph keeps the plan's steps, never the plan (which owns the graph).
        self.backend, self.steps, self.stream, self.device = backend, steps, stream, device
        self.ctx = backend.context(device.index)
        self.name = "compiled graph"
        # -- dependencies and branches ----------------------------------------------------------
        self.deps = deps = plan.deps
        # Arguments whose values some kernel validates on the host when it can see them (index bounds,
        # integer powers): a call passing such a value with a host copy runs as commands, so it raises
        # exactly as eager does; the graph has no host to check with.
        self.host_checked = sorted({v for step in steps for pos, (kind, v) in enumerate(step.srcs)
                                    if kind == "arg" and validated_on_host(step.prim, pos)})
        self.consts = []  # captured values the graph reads: ordered after their (one-time) writers
        for step in steps:
            for kind, v in step.srcs:
                if kind == "const" and not any(v.buffer is c for c in self.consts):
                    self.consts.append(v.buffer)
        self.const_ptrs = [c.data.ptr for c in self.consts]
        self._movable_consts = [i for i, c in enumerate(self.consts) if c.__class__ is OutBuffer]
        self.branch_of, self.branches = _assign_branches(deps, MAX_BRANCHES)
        self.signals = set()  # steps another branch waits for
        for j, ds in enumerate(deps):
            for d in ds:
                if self.branch_of[d] != self.branch_of[j]:
                    self.signals.add(d)
        # -- memory ------------------------------------------------------------------------------
        self.spec_of = {slot: spec for step in steps for slot, spec in zip(step.slots, step.specs)}
        returned = []
        for ref, *_ in plan.outputs:
            if ref[0] == "slot" and ref[1] not in returned:
                returned.append(ref[1])
        self.returned = returned
        # Intermediates: the plan's arena (made by its first, command-list replay), shared with it.
        self.regions: list[Buffer] = []
        self.views: dict[int, ViewArray] = {}
        for slot, (region, view) in (plan.arena or {}).items():
            self.views[slot] = view
            if not any(region is r for r in self.regions):
                self.regions.append(region)
        self.out_offsets: dict[int, int] = {}
        total = 0
        for slot in returned:
            self.out_offsets[slot] = total
            total += -(-max(self.spec_of[slot].nbytes, 1) // _ALIGN) * _ALIGN
        self.out_bytes = total
        self.out_specs = []  # (slot, shape, dtype, nbytes, size, offset) of each returned value
        for slot in returned:
            spec = self.spec_of[slot]
            n = spec.nbytes
            self.out_specs.append((slot, spec.shape, spec.dtype, n, n // spec.dtype.itemsize if spec.dtype.itemsize else 0,
                                   self.out_offsets[slot]))
        self.spec_index = {t[0]: t for t in self.out_specs}  # slot -> its out_specs entry (a value's spec)
        self.sets: list[_OutSet] = []
        # -- arguments ---------------------------------------------------------------------------
        self.bound: list[Buffer | None] = []      # direct arguments: the buffer the graph reads
        self.bound_ptrs: list[int] = []           # ... at this address
        self.staged: dict[int, Buffer] = {}       # staged arguments: their staging buffer
        self.arg_nbytes: list[int] = []
        self.lanes: list = []
        self.captures = self.updates = self.evacuated = self.launches = self.host_calls = 0
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
                "launches": self.launches, "staged_args": sorted(self.staged), "evacuated": self.evacuated,
                "host_checked_calls": self.host_calls, "output_sets": len(self.sets),
                "arena_bytes": sum(r.nbytes for r in self.regions), "output_bytes": self.out_bytes}

    def run(self, datas: list, stream) -> _Lease | None:
        """Launch for one call (under the scheduler lock); returns the call's :class:`_Lease` (its
        values are made from it, ``compile._replay``), or None when this call must run as commands.
        ``datas`` may be the very list of the last launch (``CompiledFunction`` passes it again for
        the same values): their buffers are then the same (an evaluated value's buffer never changes;
        only a compiled output's address can move, checked below)."""
        last = self._last_args
        bufs = last if datas is self._last_datas and last is not None else [d.buffer for d in datas]
        for i in self.host_checked:
            if bufs[i].data.host is not None:
                self.host_calls += 1
                return None
        if not self.arg_nbytes:
            for b in bufs:
                if not isinstance(b.data, DeviceArray) or b.device != self.device:
                    raise CaptureUnsupported("an argument is not on this GPU")
            self.arg_nbytes = [b.nbytes for b in bufs]
            self.arg_specs = [(d.shape, d.dtype) for d in datas]
            self.bound = list(bufs)
            self.bound_ptrs = [b.data.ptr for b in bufs]
            self._movable = [i for i, b in enumerate(bufs) if b.__class__ is OutBuffer]
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
                for o in self.sets:
                    o.stale = True
                break
        o = self._choose_set(stream)
        if o is None:
            return None  # no memory to free an output set: this call runs as commands
        if self._movable:  # an argument may be this plan's own output, just moved by _choose_set
            self._bind(bufs)
        if o.exec is None or o.stale:
            self._capture(o)
        self._last_datas = None  # in step with _last_args, which _launch sets
        lease = self._launch(o, stream, bufs)
        self._last_datas = datas
        return lease

    def _bind(self, bufs: list) -> None:
        """Bind the arguments: the buffers bound last time read where they are (the common call, a
        list compare in C, and no bound output moved: only a compiled function's output can move,
        ``_evacuate``; other memory stays while it is alive); a different buffer, or one moved, is
        staged (or bound anew above STAGE_LIMIT), and every graph must be captured again."""
        bound = self.bound
        ptrs = self.bound_ptrs
        same = bufs is self._last_args or bufs == bound
        if same:
            for i in self._movable:
                if bufs[i].data.ptr != ptrs[i]:
                    same = False
                    break
        if same:
            return
        for i, b in enumerate(bufs):
            old = bound[i]
            if old is not None and (b is not old or b.data.ptr != ptrs[i]):
                if self.arg_nbytes[i] <= STAGE_LIMIT:
                    self.staged[i] = self.backend.allocate_region(self.device, self.arg_nbytes[i], "compile input")
                    bound[i] = None
                    self._static_writes = None
                else:
                    bound[i] = b
                    ptrs[i] = b.data.ptr
                    if b.__class__ is OutBuffer and i not in self._movable:
                        self._movable.append(i)
                for o in self.sets:
                    o.stale = True

    # -- output sets -----------------------------------------------------------------------------
    def _choose_set(self, stream) -> _OutSet:
        """A set whose outputs were all dropped; else a new one (up to OUTPUT_SETS: a loop that keeps
        the previous result while computing the next alternates between two); else the least recently
        launched set, after moving its outputs that are still alive."""
        sets = self.sets
        for o in sets:
            if not o.busy:
                return o
        if len(sets) < OUTPUT_SETS:
            try:
                o = _OutSet(self)
            except OutOfMemoryError:
                return None  # no memory for a second set now: this call runs as commands
            sets.append(o)
            return o
        o = min(sets, key=lambda o: o.launched)
        return o if self._evacuate(o, stream) else None

    def _evacuate(self, o: _OutSet, stream) -> bool:
        """Move the outputs of set ``o``'s last call, still alive, to memory of their own: the whole
        region in one copy (one allocation, one driver call; the values are a call's outputs, usually
        all kept or all dropped). An exported output cannot move: the region is left to the outputs,
        as it is when the move cannot run. False when neither is possible (no memory): the set is
        left as it was, and this call runs as commands."""
        lease = o.lease() if o.lease is not None else None
        if lease is None:
            # The values died, but their lease has not handed on their readers yet (the cyclic GC
            # clears weak references before it runs finalisers, maybe on another thread): their
            # readers are unknown, so wait for the device to be idle (rare).
            self.ctx.synchronize()
            o.lease, o.busy = None, 0
            return True
        mats = [b for b in (r() for r in lease.mats) if b is not None]
        if len(mats) + len(lease.deaths) < len(lease.mats):
            # a made buffer is dying in a cycle on another thread (its weak reference cleared, its
            # finaliser not run yet): its points are unknown, so wait for the device first (rare)
            self.ctx.synchronize()
        if any(b.exported for b in mats):
            return _give_region(o, lease)  # exported memory cannot move: leave the region to it
        region = o.region
        n = self.out_bytes
        h = DeviceArray(self.ctx, (max(n, 1),), _u8())
        block = Buffer(self.device, h.nbytes, h, self.ctx.memory.release)  # the lease frees it once moved
        cpu_readers = [p for b in mats for p in b.readers.values() if not isinstance(p.lane, CudaLane)]
        old_base = lease.base

        def move(lane, h=h, region=region, lease=lease, mats=mats, n=n):
            # h.ptr: the block's memory, allocated on this lane as the command's write
            for p in cpu_readers:  # a CPU worker reads h.ptr when it runs: let it finish first
                p.lane.host_wait(p.seq)
            if n:
                check(cu.cuMemcpyDtoDAsync(h.ptr, region.data.ptr, n, lane.stream), "cuMemcpyDtoDAsync (outputs)")

        # reads the made buffers too (those without an error: one would stop the move): one written
        # in place since is copied after that write
        point = stream.encoder.encode("compiled output move", move, [region, *[b for b in mats if b.error is None]],
                                      [block], lane=stream.lanes[0])
        if block.error is not None or not h.ptr:
            # The move did not run (out of memory, a failed read): the values stay where they are
            # and keep the region; the set takes a new one.
            return _give_region(o, lease)
        block.release = None  # moved: freed by the lease, after the values' last points (``finish``)
        # readers of the old place (and the writer of a value written there in place since): the
        # region's next write waits for them
        o.dead.append(lease.points() + lease.points_apart(mats))
        o.lease, o.busy = None, 0
        self.evacuated += len(self.out_specs)
        base = lease.base = h.ptr
        # later readers of the moved values are readers of the block: its free waits for them
        lease.block, lease.point, lease.readers, lease.apart = block, point, block.readers, []
        for b in mats:
            b.data.ptr = base + b.data.ptr - old_base
            b.data.owner = block
            b.writer, b.readers = point, block.readers
        return True

    def _launch(self, o: _OutSet, stream, bufs: list) -> _Lease:
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
        writers = [b.writer for b in reads]
        if writers == self._read_writers:  # Points compare by identity
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
            self._static_writes = [*self.regions, *self.staged.values()]
            if self.has_linalg:  # captured cuSOLVER calls: launches of such graphs one after another
                self._static_writes.append(device_handles(ctx).graph_token)
            self._copies = [(self.staged[i].data.ptr, i, self.arg_nbytes[i]) for i in self.staged
                            if self.arg_nbytes[i]]
        copies = self._copies  # (errors of the writes: Command.run sets or clears them)
        checks = o.temps.checks if o.temps is not None else ()

        def launch(lane, copies=copies, bufs=bufs, exec_=exec_, checks=checks):
            s = lane.stream
            for dst, i, n in copies:
                err, = cu.cuMemcpyDtoDAsync(dst, bufs[i].data.ptr, n, s)
                if err:
                    check((err,), "cuMemcpyDtoDAsync (compiled input)")
            err, = cu.cuGraphLaunch(exec_, s)
            if err:
                check((err,), "cuGraphLaunch")
            if checks:
                _launch_checks(lane, checks)

        o.launched = self.launches = self.launches + 1
        point = self.last_point = stream.encoder.encode(self.name, launch, reads, [*self._static_writes, region],
                                                        lane=lane, settled=settled)
        # The values are made by compile._replay from the lease (their buffers only on first use):
        # the launch is simply their writer, and what it left (Command.run already ran) their error.
        lease = _Lease.__new__(_Lease)
        lease.set, lease.region, lease.base, lease.point = o.ref, region, base, point
        lease.error, lease.checks, lease.readers, lease.mats, lease.block = region.error, region.checks, {}, [], None
        lease.specs, lease.ctx, lease.device, lease.apart, lease.seq = self.spec_index, ctx, self.device, [], o.launched
        lease.deaths, lease.done, lease.owned = [], False, False
        o.lease = weakref.ref(lease)
        o.busy = o.launched  # until the lease's finaliser has queued its readers
        return lease

    # -- capture ---------------------------------------------------------------------------------
    def _capture_lanes(self) -> list:
        while len(self.lanes) < self.branches:
            self.lanes.append(CudaLane(self.ctx, self.device, -1, len(self.lanes)))
        return self.lanes

    def _data(self, kind: str, v: Any, o: _OutSet):
        if kind == "slot":
            return self._slot_view(v, o)
        if kind == "const":
            return v.buffer.data
        st = self.staged.get(v)
        b = st if st is not None else self.bound[v]
        shape, dtype = self.arg_specs[v]
        return ViewArray(self.ctx, shape, dtype, b.data.ptr)

    def _slot_view(self, slot: int, o: _OutSet) -> ViewArray:
        v = self.views.get(slot)
        if v is None:
            spec = self.spec_of[slot]
            v = ViewArray(self.ctx, spec.shape, spec.dtype, o.region.data.ptr + self.out_offsets[slot])
        return v

    def _capture(self, o: _OutSet) -> None:
        """Capture the steps into a graph and instantiate it (or update the executable in place)."""
        ctx, mem = self.ctx, self.ctx.memory
        steps = self.steps
        lanes = self._capture_lanes()
        ctx.ensure_current()
        if self.has_linalg:  # the graphs' cuSOLVER pool exists (and its handle, below) before capture
            device_handles(ctx).pool("cusolverDn-graph")
        _prewarm_libraries(ctx, lanes)
        temps = _Temps(mem)
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
                b = self.branch_of[j]
                lane = lanes[b]
                for d in self.deps[j]:
                    bd = self.branch_of[d]
                    if bd != b and waited[b].get(bd, -1) < d:
                        check(cu.cuStreamWaitEvent(lane.stream, done[d], 0), "cuStreamWaitEvent (capture)")
                        waited[b][bd] = d
                ins = [self._data(kind, v, o) for kind, v in step.srcs]
                outs = [self._slot_view(slot, o) for slot in step.slots]
                self.backend.kernel(step.prim.kind)(lane, step.prim, ins, outs)
                if j in self.signals:
                    ev = done[j] = event()
                    check(cu.cuEventRecord(ev, lane.stream), "cuEventRecord (capture)")
            for lane in lanes[1:]:
                ev = event()
                check(cu.cuEventRecord(ev, lane.stream), "cuEventRecord (join)")
                check(cu.cuStreamWaitEvent(s0, ev, 0), "cuStreamWaitEvent (join)")
        except BaseException as e:  # noqa: BLE001 - end the capture whatever happened, then report
            failure = e
        finally:
            mem.capture = None
            err, graph = cu.cuStreamEndCapture(s0)
            for ev in events:
                cu.cuEventDestroy(ev)
        if failure is not None or err:
            if graph is not None and not err:
                cu.cuGraphDestroy(graph)
            self._drop_lanes()
            self._free_temps(temps)
            raise CaptureUnsupported(f"stream capture failed: {failure or err!r}") from failure
        try:
            self.nodes = int(cu.cuGraphGetNodes(graph)[-1])
        except Exception:  # noqa: BLE001 - a count for stats only
            pass
        try:
            if o.exec is not None:
                err, _info = cu.cuGraphExecUpdate(o.exec, graph)
                if err:
                    cu.cuGraphExecDestroy(o.exec)
                    o.exec = None
                else:
                    self.updates += 1
            if o.exec is None:
                o.exec = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
                check(cu.cuGraphUpload(o.exec, s0), "cuGraphUpload")
        except BaseException:
            self._free_temps(temps)
            raise
        finally:
            cu.cuGraphDestroy(graph)
        self.captures += 1
        o.stale = False
        old, o.temps = o.temps, temps
        if old is not None:  # the previous graph's scratch, once its last launch is done
            self._free_temps(old)

    # -- teardown --------------------------------------------------------------------------------
    def _free_temps(self, temps: _Temps) -> None:
        _release_temps(self.ctx, temps, self.last_point)

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
        self.execs = [o.exec for o in g.sets if o.exec is not None]
        self.temps = [o.temps for o in g.sets if o.temps is not None]

    def destroy(self) -> None:
        self.ctx.ensure_current()
        for ex in self.execs:
            cu.cuGraphExecDestroy(ex)  # an in-flight launch completes first
        for t in self.temps:
            _release_temps(self.ctx, t, self.last)
        for lane in self.lanes:
            if self.last is not None:
                lane._enqueue_wait(self.last)
            lane.destroy()


class _OutSet:
    """One output region and the executable graph that writes it. ``lease`` refers (weakly) to the
    lease of the last call launched on it: the set is free once that lease died, i.e. every value
    and buffer of the call did. ``dead`` holds the reader points of calls whose values died, which
    the region's next writer waits for."""

    def __init__(self, g: GraphPlan):
        self.g = weakref.ref(g)
        self.ref = weakref.ref(self)
        self.backend, self.device, self.nbytes = g.backend, g.device, g.out_bytes
        self.exec = None
        self.temps: _Temps | None = None
        self.stale = False
        self.launched = 0
        self.lane = None  # the lane its launches go to
        self.lease = None  # weakref to the last call's _Lease
        self.busy = 0      # the launch number of the call whose values may be alive (0: free)
        self.dead: collections.deque = collections.deque()
        self.region: Buffer = None  # type: ignore[assignment]
        self.new_region()

    def new_region(self) -> None:
        """Fresh memory for this set's outputs (the old region stays with the outputs that hold it).
        Allocates first: when there is no memory for it, nothing has changed."""
        region = self.backend.allocate_region(self.device, self.nbytes, "compiled outputs")
        if self.region is not None:
            self.drain()  # the old region's free waits for readers of outputs dropped so far
        self.region = region
        self.lease = None
        self.busy = 0
        self.dead = collections.deque()
        self.stale = True

    def drain(self) -> None:
        """Readers of dropped outputs become readers of the region: its next write (or its free)
        waits for them."""
        dead, readers = self.dead, self.region.readers
        while dead:
            _add_readers(readers, dead.popleft())

    def __del__(self) -> None:
        try:
            self.drain()  # before the region is released (Memory.release reads its readers)
            lease = self.lease() if self.lease is not None else None
            if lease is not None and lease.region is self.region and lease.block is None and not lease.owned:
                lease.own(self.region)  # values still live in it (a dropped plan): the lease frees it
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _Lease:
    """The values of one compiled call (shared by them, ``LazyData.lease``): where they live
    (``base``: the output region, or the block they moved to), their writer and error, and ``readers``
    (lane -> latest point), one dict for all their buffers, as if they were one buffer; ``apart``
    collects the points of made buffers that left that shared state (written in place), appended by
    any thread. When the lease dies (every value and buffer of the call did), its points are handed
    to the memory's next writer: the set's next launch, or the region's free when the plan gave the
    region away. Two Python objects per value (Array, LazyData) instead of four, and no finaliser
    per value."""

    __slots__ = ("set", "region", "base", "point", "error", "checks", "readers", "mats", "block", "specs",
                 "ctx", "device", "apart", "seq", "deaths", "done", "owned", "__weakref__")

    def materialize(self, d) -> OutBuffer:
        """The buffer of value ``d`` (first use: an op reads it, a host read, an export). Under the
        scheduler lock, which a move of the values (``GraphPlan._evacuate``) holds too: a buffer is
        made either before a move (and moved with it) or after (at the new place), and once."""
        with LOCK:
            b = d.made()
            if b is not None:
                return b
            _, shape, dtype, n, size, offset = d.spec
            h = OutArray.__new__(OutArray)
            h.ctx, h.shape, h.dtype, h.host, h.size, h.nbytes = self.ctx, shape, dtype, None, size, n
            h.ptr, h.owner = self.base + offset, self.block if self.block is not None else self.region
            b = OutBuffer.__new__(OutBuffer)
            b.device, b.nbytes, b.data, b.writer, b.readers = self.device, n, h, self.point, self.readers
            b.error, b.exported, b.release, b.checks, b.lease = self.error, False, _out_released, self.checks, self
            self.mats.append(weakref.ref(b))
            d.buffer = b
            return b

    def own(self, region: Buffer) -> None:
        """Take ``region`` (this call's values live in it and its set has let go of it): freed by
        ``finish`` with every point, not by the region's own finaliser."""
        region.release = None
        self.owned = True

    def points(self) -> list:
        """The points the memory's next writer must wait for (the shared readers, and those apart)."""
        return [*self.readers.values(), *self.apart]

    def points_apart(self, mats: list) -> list:
        """Writer and reader points of made buffers, alive, that left the shared state."""
        pts = []
        for b in mats:
            if b.readers is not self.readers or b.writer is not self.point:
                pts.extend(p for p in (b.writer, *b.readers.values()) if p is not None)
        return pts

    def __del__(self) -> None:
        # Any thread, maybe inside GC. Normally the made buffers (which hold the lease) died first;
        # in a reference cycle the collector may finalise them after the lease: the last one out
        # hands the points on (``finish``).
        try:
            self.done = True
            if len(self.deaths) >= len(self.mats):
                self.finish()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def finish(self) -> None:
        """Every value and made buffer of the call died: hand their points on, only queueing (any
        thread, maybe inside GC). The set's next launch waits for them, or the free of the region it
        gave away, or the free of the block the values moved to."""
        if self.mats is None:
            return
        pts = self.points()
        self.mats = None  # once
        block = self.block
        if block is not None:  # moved values: free their block after its writer and every reader
            h = block.data
            if h.ptr:
                self.ctx.memory.pending.append((h.ptr, block.writer, tuple(pts)))
                h.ptr = 0
            return
        region = self.region
        if self.owned:  # a region left to the values (exported, no move, a dropped plan's set)
            h = region.data
            if h.ptr:
                self.ctx.memory.pending.append((h.ptr, region.writer, (*region.readers.values(), *pts)))
                h.ptr = 0
            return
        o = self.set()
        if o is not None and o.region is region:
            if pts:
                o.dead.append(pts)
            if o.busy == self.seq:
                o.busy = 0  # after queueing: a set seen free has its readers queued
        elif pts:
            _add_readers(region.readers, pts)


def _give_region(o: _OutSet, lease: _Lease) -> bool:
    """Leave set ``o``'s region to the values of ``lease`` that live in it and give the set a new one
    (one capture more); False when there is no memory for it (nothing changed). The lease frees the
    region after its values' last points (``finish``), not the region's own finaliser: in a reference
    cycle that could run first."""
    region = o.region
    try:
        o.new_region()
    except OutOfMemoryError:
        return False
    lease.own(region)
    return True


def _out_released(b: OutBuffer) -> None:
    """A made buffer died (any thread, maybe inside GC): if it left the call's shared state (written
    in place), its points are set apart on the lease (an append: the shared readers dict may be
    written by the encoder on another thread meanwhile), for the memory's next writer."""
    lease = b.lease
    if b.readers is not lease.readers or b.writer is not lease.point:
        lease.apart.extend(lease.points_apart([b]))
    lease.deaths.append(None)  # a count (an append: finalisers may run on several threads)
    if lease.done and lease.mats is not None and len(lease.deaths) >= len(lease.mats):
        lease.finish()  # the lease was finalised first (a reference cycle): this is the last one out


def _add_readers(readers: dict, points) -> None:
    """Merge points into a buffer's readers (lane -> latest point), as if they had read it."""
    for p in points:
        cur = readers.get(p.lane)
        if cur is None or cur.seq < p.seq:
            readers[p.lane] = p


def _prewarm_libraries(ctx, lanes) -> None:
    """Library workspaces of the capture lanes exist before capture (allocating inside it would put
    allocation nodes into the graph), and are valid on every stream."""
    group = getattr(ctx, "handles", None)  # every library pool of the device (handles.DeviceHandles)
    for pool in list(group.pools.values()) if group is not None else ():
        for lane in lanes:
            with pool.use(lane):
                pass
    for lane in lanes:
        check(cu.cuStreamSynchronize(lane.stream), "cuStreamSynchronize (capture lanes)")


def _assign_branches(deps: list[list[int]], limit: int) -> tuple[list[int], int]:
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


def _release_temps(ctx, temps: _Temps, last) -> None:
    """A dropped graph's scratch and check slots go back once its last launch (``last``) is done."""
    after = (last,) if last is not None else ()
    for p in temps.ptrs:
        ctx.memory.pending.append((p, None, after))
    temps.ptrs = set()
    if temps.checks:
        slots = slots_of(ctx)
        for slot, _explain in temps.checks:
            slots.give_back(slot, last.lane if last is not None else None, last.seq if last is not None else 0)
        temps.checks = []


def _launch_checks(lane, checks: list) -> None:
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
