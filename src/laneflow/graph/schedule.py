"""Evaluation: order pending nodes, allocate outputs, and hand each node to its stream's encoder.

All scheduling happens under one process-wide lock (execution does not), which is what makes one
stream safe to share between host threads. Host reads wait only for the writers they need.
"""

from __future__ import annotations

import gc

from typing import Sequence

from ..errors import LaneflowError
from ..runtime.encoder import LOCK  # noqa: F401 - the one scheduling lock (Stream.close takes it too)
from ..runtime.lane import Command
from . import csubmit
from .epilogue import fold as fold_epilogues
from .fusion import FusedNode, fuse
from .rowfusion import ROOT_KINDS as ROW_ROOTS, fuse_rows
from .grouping import Group, group_matmuls
from .node import ArrayData, LazyData, reads_view
from .views import LAYOUT, fold


def toposort(roots: Sequence[ArrayData]) -> list[ArrayData]:
    """Pending nodes reachable from roots, inputs before users. Iterative: deep chains are fine."""
    # (LazyData: a compiled call's value, evaluated; its type is checked first so that evaluating
    # its outputs does not make buffers nobody needs)
    if len(roots) == 1:  # the common eager case: one new node over evaluated inputs
        root = roots[0]
        if type(root) is LazyData or root.buffer is not None:
            return []
        for i in root.inputs:
            if i.buffer is None:
                break
        else:
            return [root]
    # Many independent nodes over evaluated inputs (a grouped matmul's members): no search needed.
    flat: list[ArrayData] = []
    for root in roots:
        if type(root) is LazyData or root.buffer is not None:
            continue
        for i in root.inputs:
            if i.buffer is None:
                break
        else:
            flat.append(root)
            continue
        break
    else:
        if len(set(map(id, flat))) == len(flat):
            return flat
    # The search in C (csubmit.c: the same order; None for a graph it does not cover), else below.
    c = _c_toposort[0]
    if c is _UNSET:
        c = _from_c(_c_toposort, "toposort")
    if c is not None:
        got = c(roots, LazyData)
        if got is not None:
            return got
    # Iterative depth-first search over nodes (hashed by identity): a node is emitted once all its
    # pending inputs are; each stack entry is (node, index of the next input to visit).
    order: list[ArrayData] = []
    seen: set = set()
    add, emit = seen.add, order.append
    for root in roots:
        if type(root) is LazyData or root.buffer is not None or root in seen:
            continue
        add(root)
        stack = [(root, root.inputs, 0)]
        while stack:
            d, ins, k = stack[-1]
            n = len(ins)
            while k < n:
                i = ins[k]
                k += 1
                if i not in seen and type(i) is not LazyData and i.buffer is None:
                    add(i)
                    stack[-1] = (d, ins, k)
                    stack.append((i, i.inputs, 0))
                    break
            else:
                stack.pop()
                emit(d)
    return order


_UNSET = object()
#: csubmit's toposort (looked up at the first search: None without the C module, or LANEFLOW_CSUBMIT=0);
#: tests set None to compare the Python search
_c_toposort: list = [_UNSET]


def _from_c(cell: list, name: str):
    """csubmit's function ``name``, kept in ``cell`` (None without the C module, or LANEFLOW_CSUBMIT=0)."""
    mod = csubmit.load()
    cell[0] = None if mod is None else getattr(mod, name)
    return cell[0]


def schedule(roots: Sequence[ArrayData]) -> None:
    """Submit every pending node needed by roots, one command each (no plan cache: evaluations go
    through ``graph/eval_cache.py: schedule``). Returns without waiting for the work."""
    with LOCK:
        execute(toposort(roots))


#: False: every node takes the Python path below, never ``csubmit.c`` (tests compare the two)
C_SUBMIT = True


def execute(order: list) -> None:
    """Submit the pending nodes ``order`` (inputs first): the passes, then one command per item.
    The caller holds ``LOCK`` (``schedule`` here, ``eval_cache.schedule``)."""
    # A long graph is thousands of live objects, and making its commands allocates more: Python's
    # cyclic collector would run full passes over the whole heap meanwhile (with a million other
    # objects alive, as when PyTorch or JAX is imported: +1.75 us per op over a 10,000-op chain,
    # tools/probe_dispatch.py --heap on the CPU VM). Nothing here makes cycles: it waits till the end.
    # The switch is process-wide: a thread that turns the GC off meanwhile finds it on again after.
    pause = len(order) > 64 and gc.isenabled()
    try:
        if pause:
            gc.disable()
        items = passes(order) if len(order) > 1 else None
        seq = order if items is None else items
        run = csubmit.runner() if C_SUBMIT and seq.__class__ is list else None
        i, n = 0, len(seq)
        while i < n:
            if run is not None:  # plain nodes through the C submit path until one it declines
                i = run(seq, i)
                if i == n:
                    break
            d = seq[i]
            i += 1
            t = type(d)
            if t is Group:
                _schedule_group(d)
            elif t is FusedNode:
                _schedule_fused(d)
            elif d.buffer is None:  # a sibling may have produced it already
                schedule_one(d)  # (the C path, when there is one, has declined it)
    finally:
        if pause:
            gc.enable()


def passes(order: list) -> list | None:
    """The scheduling passes over pending nodes in dependency order: matmul grouping, matmul
    epilogues (``graph/epilogue.py``), row programs (``graph/rowfusion.py``), elementwise fusion, then
    layout folding (``graph/views.py``). Returns the new item list, or None when none changed anything.
    Eager evaluation and compiled plans both run this, so both run the same kernels. A pass with none of
    the kinds it works on among the nodes is skipped (a chain of adds has no matmul to group and no
    layout to fold: each of those scans cost about 30-40 ns a node on the CPU VM)."""
    k = _kinds(order)  # (None: not known, every pass runs)
    mm = k is None or "matmul" in k
    items = group_matmuls(order) if mm else None
    absorbed = fold_epilogues(order if items is None else items) if mm else None
    items = absorbed if absorbed is not None else items
    rows = fuse_rows(order if items is None else items) if k is None or not k.isdisjoint(ROW_ROOTS) else None
    items = rows if rows is not None else items
    fused = fuse(order if items is None else items)
    items = fused if fused is not None else items
    folded = fold(order if items is None else items) if k is None or not k.isdisjoint(LAYOUT) else None
    return folded if folded is not None else items


def _kinds(order: list) -> set | None:
    """The kinds of the primitives of ``order`` (csubmit.c), or None (not known: no C module, or an item
    that is not a plain node). A primitive's kind is read from its class: a primitive must not set
    ``kind`` per instance (none does; a pass could be skipped wrongly)."""
    c = _c_kinds[0]
    if c is _UNSET:
        c = _from_c(_c_kinds, "kinds")
    return None if c is None or order.__class__ is not list else c(order)


#: csubmit's kinds (looked up at the first use; None: every pass runs; tests set None to compare)
_c_kinds: list = [_UNSET]


def _check_open(members, op: str) -> None:
    for m in members:
        if m.stream._closed:
            raise LaneflowError(f"{op}: its stream {m.stream} was closed before the op was evaluated")


def _schedule_group(g: Group) -> None:
    _check_open(g.members, "matmul")
    _finish(g.members, submit(g.prim, g.stream, [i.buffer for i in g.inputs], g.members))


def _schedule_fused(f: FusedNode) -> None:
    """One kernel for the group; the absorbed nodes never get buffers (nothing can see them) and only
    give up their inputs."""
    _check_open(f.members, f.prim.name)
    root = f.root
    _finish((root,), submit(f.prim, f.stream, [i.buffer for i in f.inputs], (root,)))
    for m in f.members:
        if m is not root:
            for i in m.inputs:
                i.users -= 1
            m.inputs = ()


def _donor(d: ArrayData) -> ArrayData | None:
    if not d.inputs:
        return None
    src = d.inputs[0]
    buf = src.buffer
    if (src.users == 1 and src.arrays == 0 and not buf.exported and src.siblings is None
            and src.shape == d.shape and src.dtype == d.dtype and not reads_view(d.prim, 0)):
        return src
    return None


def schedule_one(d: ArrayData) -> None:
    prim = d.prim
    if prim.kind == "placeholder":
        raise prim.error()
    stream = d.stream
    outs = d.siblings or (d,)
    ins = d.inputs
    donor = _donor(d) if prim.donates else None
    # The donor keeps its (now overwritten) buffer reference: nothing can see it, except an op another
    # host thread builds from the same binding while this thread assigns into it. That is a race in
    # any array library; here the late reader is ordered after the write (RAW) instead of crashing.
    out_bufs = submit(prim, stream, [i.buffer for i in ins], outs, donor.buffer if donor is not None else None)
    _finish(outs, out_bufs)


def submit(prim, stream, in_bufs: list, outs, donated=None) -> list:
    """Allocate the outputs of one primitive and encode its command on ``stream``; returns the buffers.

    ``outs`` give each output's device, shape and dtype. ``donated`` is an input buffer to reuse as
    output 0 (an in-place write). Shared by eager evaluation and compiled replay.
    """
    if stream._closed:
        raise LaneflowError(f"{prim.name}: its stream {stream} was closed before the op was evaluated")
    backend = stream.backend
    if prim.kind == "constant":
        buf, copy = backend.upload(stream.device, prim.value)
        prim.value = None
        if copy is not None:
            stream.encoder.encode(prim.name, copy, (), (buf,))
        return [buf]
    # Outputs of a primitive that asks for it (a grouped matmul's) share one allocation; other
    # multi-output ops (svd: u, s, vh) keep one each, as their outputs live apart.
    many = getattr(backend, "allocate_many", None) if prim.one_allocation else None
    if many is not None:
        out_bufs = many(outs[0].device, [(o.shape, o.dtype) for o in outs], prim.name)
    else:
        out_bufs = []
        for k, o in enumerate(outs):
            if k == 0 and donated is not None:
                out_bufs.append(donated)
            else:
                out_bufs.append(backend.allocate(o.device, o.shape, o.dtype, prim.name))
    encode_call(prim, stream, in_bufs, [b.data for b in in_bufs], out_bufs, [b.data for b in out_bufs])
    return out_bufs


def encode_call(prim, stream, in_bufs: list, in_data: list, out_bufs: list, out_data: list) -> None:
    """Encode one primitive's command: the encoder orders it by the buffers, the kernel gets the data
    handles (the buffers' own data, or views of them, e.g. a compiled plan's memory regions)."""
    if len(in_bufs) < 2:
        reads = in_bufs
    elif len(in_bufs) > 8:  # a grouped command: many inputs
        reads = list({id(b): b for b in in_bufs}.values())
    else:
        reads = []
        for b in in_bufs:
            for r in reads:
                if r is b:
                    break
            else:
                reads.append(b)
    pin = prim.lane_for
    stream.encoder.submit(Command(prim.name, stream.backend.kernel_of(prim), reads, out_bufs, prim, in_data, out_data),
                          None if pin is None else pin(stream))


def _finish(outs, bufs) -> None:
    for o, b in zip(outs, bufs):
        for i in o.inputs:  # every sibling counted its inputs' use once
            i.users -= 1
        o.buffer = b
        o.prim = None
        o.inputs = ()
        o.siblings = None


def resolve_checks(buf) -> LaneflowError | None:
    """After the buffer's writer finished: the first failure its deferred checks report (kept as the
    buffer's error, so later evals raise it without reading again), or None (the checks are dropped)."""
    checks = buf.checks  # one snapshot: another thread may resolve and clear them meanwhile
    if checks is None:
        return buf.error
    err = None
    for c in checks:
        err = c.error()
        if err is not None:
            buf.error = err
            break
    if buf.checks is checks:
        buf.checks = None
    return err


def wait(d: ArrayData, timeout: float | None = None) -> None:
    """Block until d's buffer is written; raise the error of the op that failed to produce it."""
    buf = d.buffer
    w = buf.writer
    if w is not None and not w.lane.host_wait(w.seq, timeout):
        raise TimeoutError(f"waiting for {w.lane.name} command {w.seq} timed out after {timeout} s")
    err = buf.error
    if err is None and buf.checks is not None:
        err = resolve_checks(buf)
    if err is not None:
        # The same error object is raised at every eval that needs it: drop the frames of earlier
        # raises, or its traceback (and every local it references) would grow with each one.
        raise err.with_traceback(None)
