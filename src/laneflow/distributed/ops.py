"""Collectives as lazy ops: each is one command on its group's communication lane.

A collective is issued when it is called (scheduled at once, as ``lf.async_eval`` would): the order
in which a rank's collectives reach the transport is then the order its program called them, whatever
it later evaluates or drops, so ranks running the same program always agree. Inside ``lf.compile`` a
collective is traced as a step like any other op and runs, at every call, as a command on the
communication lane (not inside the CUDA graph).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes as dt
from ..array import Array
from ..graph import tracer as _tracer
from ..graph.node import Primitive
from ..ops.core import as_int, normalize_axis, operand, outputs, stream_of
from .group import DistributedError, Group
from .transports import check_reduction

REDUCTIONS = ("sum", "prod", "max", "min", "avg")
#: largest user tag of send / recv (MPI guarantees tags up to 32767; laneflow uses two per user tag)
MAX_TAG = 16383


class Collective(Primitive):
    """One collective of ``group``: ``reduction`` (all_reduce, reduce_scatter), ``root`` (the root of a
    broadcast, the peer of a send or recv), ``tag`` (send / recv)."""

    kind = "collective"
    cacheable = False  # a transport is state, not a parameter: never keyed by the plan cache

    def __init__(self, name: str, group: Group, transport: Any, reduction: str | None = None,
                 root: int | None = None, tag: int = 0):
        super().__init__(name)
        self.group, self.transport = group, transport
        self.reduction, self.root, self.tag = reduction, root, tag

    def lane_for(self, stream: Any) -> Any:
        """The lane the command must run on: the group's communication lane of the stream's device."""
        return self.group.lane(stream)

    def run(self, lane: Any, ins: list, outs: list) -> None:
        self.transport.run(lane, self, ins, outs)


def _group(group: Group | None, op: str) -> Group:
    if group is None:
        from . import _state
        group = _state.WORLD
        if group is None:
            raise DistributedError(f"{op}: lf.distributed.init() has not been called in this process")
    elif not isinstance(group, Group):
        raise TypeError(f"{op}: group must be an lf.distributed.Group or None, got {type(group).__name__}")
    return group


def _issue(arrays: tuple) -> None:
    """Schedule a collective now (not while tracing for lf.compile: the trace records it)."""
    if not _tracer.tracing():
        from ..evaluation import async_eval
        async_eval(list(arrays))


def _collective(op: str, x: Any, group: Group | None, stream: Any, spec, reduction=None, root=None,
                tag: int = 0) -> Array:
    g = _group(group, op)
    st = stream_of(stream, op)
    d = operand(x, st, op) if x is not None else None
    prim = Collective(op, g, g.transport(st.device, op), reduction, root, tag)
    out = outputs(prim, [d] if d is not None else [], [spec(d)], st)[0]
    _issue((out,))
    return out


def _reduction(op: str, reduction: Any, dtype: np.dtype) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: op must be one of {', '.join(map(repr, REDUCTIONS))}, got {reduction!r}")
    check_reduction(op, reduction, dtype)
    return reduction


def _rank_arg(value: Any, what: str, g: Group, op: str) -> int:
    r = as_int(value, what, op)
    if not 0 <= r < g.size:
        raise ValueError(f"{op}: {what} {r} is not a rank of the group (ranks 0 to {g.size - 1})")
    return r


def all_reduce(x: Any, op: str = "sum", *, group: Group | None = None, stream: Any = None) -> Array:
    """The elementwise reduction (``op``: "sum", "prod", "max", "min", "avg") of ``x`` over every rank of
    the group; every rank gets the result. Half types reduce in float32 and round once.

    >>> g = lf.distributed.all_reduce(grad)          # the sum of every rank's grad
    """
    st = stream_of(stream, "all_reduce")
    d = operand(x, st, "all_reduce")
    red = _reduction("all_reduce", op, d.dtype)
    return _collective("all_reduce", Array._wrap(d), group, st, lambda d: (d.shape, d.dtype), red)


def all_gather(x: Any, *, axis: int = 0, group: Group | None = None, stream: Any = None) -> Array:
    """Every rank's ``x`` concatenated along ``axis``, in rank order (every rank's ``x`` has the same
    shape and dtype)."""
    g = _group(group, "all_gather")
    st = stream_of(stream, "all_gather")
    d = operand(x, st, "all_gather")
    if not d.shape:
        raise ValueError("all_gather: x is 0-d; gather along a new axis with lf.expand_dims(x, 0) first")
    ax = normalize_axis(axis, len(d.shape), "all_gather")
    from .. import _ops_namespace as lfo
    x0 = Array._wrap(d) if ax == 0 else lfo.moveaxis(Array._wrap(d), ax, 0)
    out = _collective("all_gather", x0, g, st, lambda d: ((g.size * d.shape[0], *d.shape[1:]), d.dtype))
    return out if ax == 0 else lfo.moveaxis(out, 0, ax)


def reduce_scatter(x: Any, op: str = "sum", *, axis: int = 0, group: Group | None = None,
                   stream: Any = None) -> Array:
    """The reduction of every rank's ``x`` (as :func:`all_reduce`), split into ``group.size`` equal
    blocks along ``axis``; rank r gets block r. ``x.shape[axis]`` must divide by the group's size."""
    g = _group(group, "reduce_scatter")
    st = stream_of(stream, "reduce_scatter")
    d = operand(x, st, "reduce_scatter")
    red = _reduction("reduce_scatter", op, d.dtype)
    if not d.shape:
        raise ValueError("reduce_scatter: x is 0-d; it needs an axis to split")
    ax = normalize_axis(axis, len(d.shape), "reduce_scatter")
    if d.shape[ax] % g.size:
        raise ValueError(f"reduce_scatter: x of shape {d.shape} cannot be split along axis {ax} into {g.size} "
                         f"equal blocks ({d.shape[ax]} is not a multiple of the group size {g.size})")
    from .. import _ops_namespace as lfo
    x0 = Array._wrap(d) if ax == 0 else lfo.moveaxis(Array._wrap(d), ax, 0)
    out = _collective("reduce_scatter", x0, g, st,
                      lambda d: ((d.shape[0] // g.size, *d.shape[1:]), d.dtype), red)
    return out if ax == 0 else lfo.moveaxis(out, 0, ax)


def broadcast(x: Any, root: int = 0, *, group: Group | None = None, stream: Any = None) -> Array:
    """Rank ``root``'s ``x`` on every rank (the others pass an array of the same shape and dtype; its
    values are not read)."""
    g = _group(group, "broadcast")
    r = _rank_arg(root, "root", g, "broadcast")
    return _collective("broadcast", x, g, stream, lambda d: (d.shape, d.dtype), None, r)


def _tag(tag: Any, op: str) -> int:
    t = as_int(tag, "tag", op)
    if not 0 <= t <= MAX_TAG:
        raise ValueError(f"{op}: tag {t} is out of range (0 to {MAX_TAG})")
    return t


def send(x: Any, dst: int, *, tag: int = 0, group: Group | None = None, stream: Any = None) -> None:
    """Send ``x`` to rank ``dst`` (which calls :func:`recv` with this rank, the same tag, shape and
    dtype). Issued at once; returns nothing."""
    g = _group(group, "send")
    r = _rank_arg(dst, "dst", g, "send")
    if r == g.rank:
        raise ValueError(f"send: dst {r} is this rank; a rank cannot send to itself")
    _collective("send", x, g, stream, lambda d: ((0,), dt.uint8), None, r, _tag(tag, "send"))


def recv(shape: Any, dtype: Any, src: int, *, tag: int = 0, group: Group | None = None,
         stream: Any = None) -> Array:
    """The array of ``shape`` and ``dtype`` that rank ``src`` sends with ``tag``."""
    from ..ops.core import check_shape
    g = _group(group, "recv")
    r = _rank_arg(src, "src", g, "recv")
    if r == g.rank:
        raise ValueError(f"recv: src {r} is this rank; a rank cannot receive from itself")
    shp, dty = check_shape(shape, "recv"), dt.dtype(dtype)
    return _collective("recv", None, g, stream, lambda d: (shp, dty), None, r, _tag(tag, "recv"))


def barrier(*, group: Group | None = None, stream: Any = None) -> None:
    """Wait on the host until every rank of the group has reached this barrier (and this rank's earlier
    collectives on the stream's device have run)."""
    from ..evaluation import eval as _eval
    token = _collective("barrier", None, _group(group, "barrier"), stream, lambda d: ((0,), dt.uint8))
    _eval(token)
