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
from ..ops.core import as_int, check_shape, normalize_axis, operand, outputs, stream_of
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

    @property
    def capturable(self) -> bool:
        """Whether lf.compile's CUDA graphs may hold this collective (its transport says)."""
        return getattr(self.transport, "capturable", False)

    def run(self, lane: Any, ins: list, outs: list) -> None:
        self.transport.run(lane, self, ins, outs)

    def ready(self) -> None:
        """Raise when this collective's transport can run no more collectives (a broken group, an
        aborted communicator): a compiled launch checks it first, as an eager collective does."""
        usable = getattr(self.transport, "_usable", None)
        if usable is not None:
            usable(f"compiled {self.name}")

    def watch(self, lane: Any) -> None:
        """After a CUDA graph holding collectives of this transport is launched on ``lane``: let the
        transport follow the launch (NCCL's watchdog); nothing for transports without one."""
        follow = getattr(self.transport, "follow_launch", None)
        if follow is not None:
            follow(lane)


def _group(group: Group | None, op: str) -> Group:
    if group is None:
        from . import _state
        group = _state.WORLD
        if group is None:
            raise DistributedError(f"{op}: lf.distributed.init() has not been called in this process")
    elif not isinstance(group, Group):
        raise TypeError(f"{op}: group must be an lf.distributed.Group or None, got {type(group).__name__}")
    return group


def _issue(out: Array, d: Any) -> None:
    """Schedule a collective now (not while tracing for lf.compile: the trace records it): its input's
    graph first, on its own, so that graph (a gradient, computed again each step) stays one the plan
    cache replays (a graph holding a collective is never cached), then the collective alone."""
    if not _tracer.tracing():
        from ..evaluation import async_eval
        if d is not None and d.prim is not None:
            async_eval(Array._wrap(d))
        async_eval(out)


def _collective(op: str, g: Group, st: Any, d: Any, shape: tuple, dtype: np.dtype, reduction=None,
                root=None, tag: int = 0) -> Array:
    """The node of one collective reading ``d`` (an ArrayData, or None) on ``st``, issued at once."""
    prim = Collective(op, g, g.transport(st.device, op), reduction, root, tag)
    out = outputs(prim, [d] if d is not None else [], [(shape, dtype)], st)[0]
    _issue(out, d)
    return out


def _args(op: str, x: Any, group: Group | None, stream: Any) -> tuple:
    """(group, stream, x's ArrayData on the stream's device): every collective's arguments, resolved once."""
    g = _group(group, op)
    st = stream_of(stream, op)
    return g, st, operand(x, st, op)


def _axis_first(op: str, d: Any, axis: Any) -> tuple:
    """(axis, d with that axis moved to the front): MPI and NCCL gather and scatter along axis 0."""
    if not d.shape:
        raise ValueError(f"{op}: x is 0-d; it needs an axis (lf.expand_dims(x, 0) makes one)")
    ax = normalize_axis(axis, len(d.shape), op)
    if ax == 0:
        return 0, d
    from .. import _ops_namespace as lfo
    return ax, lfo.moveaxis(Array._wrap(d), ax, 0)._data


def _axis_back(out: Array, ax: int) -> Array:
    if ax == 0:
        return out
    from .. import _ops_namespace as lfo
    return lfo.moveaxis(out, 0, ax)


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
    the group; every rank gets the result. Half types reduce in float32 and round once through MPI (CPU
    arrays); NCCL (GPU arrays) reduces them in their own type, as torch.distributed does.

    >>> g = lf.distributed.all_reduce(grad)          # the sum of every rank's grad
    """
    g, st, d = _args("all_reduce", x, group, stream)
    red = _reduction("all_reduce", op, d.dtype)
    return _collective("all_reduce", g, st, d, d.shape, d.dtype, red)


def all_gather(x: Any, *, axis: int = 0, group: Group | None = None, stream: Any = None) -> Array:
    """Every rank's ``x`` concatenated along ``axis``, in rank order (every rank's ``x`` has the same
    shape and dtype)."""
    g, st, d = _args("all_gather", x, group, stream)
    ax, d0 = _axis_first("all_gather", d, axis)
    out = _collective("all_gather", g, st, d0, (g.size * d0.shape[0], *d0.shape[1:]), d0.dtype)
    return _axis_back(out, ax)


def reduce_scatter(x: Any, op: str = "sum", *, axis: int = 0, group: Group | None = None,
                   stream: Any = None) -> Array:
    """The reduction of every rank's ``x`` (as :func:`all_reduce`), split into ``group.size`` equal
    blocks along ``axis``; rank r gets block r. ``x.shape[axis]`` must divide by the group's size."""
    g, st, d = _args("reduce_scatter", x, group, stream)
    red = _reduction("reduce_scatter", op, d.dtype)
    ax, d0 = _axis_first("reduce_scatter", d, axis)
    if d0.shape[0] % g.size:
        raise ValueError(f"reduce_scatter: x of shape {d.shape} cannot be split along axis {ax} into {g.size} "
                         f"equal blocks ({d0.shape[0]} is not a multiple of the group size {g.size})")
    out = _collective("reduce_scatter", g, st, d0, (d0.shape[0] // g.size, *d0.shape[1:]), d0.dtype, red)
    return _axis_back(out, ax)


def broadcast(x: Any, root: int = 0, *, group: Group | None = None, stream: Any = None) -> Array:
    """Rank ``root``'s ``x`` on every rank (the others pass an array of the same shape and dtype; its
    values are not read)."""
    g, st, d = _args("broadcast", x, group, stream)
    r = _rank_arg(root, "root", g, "broadcast")
    return _collective("broadcast", g, st, d, d.shape, d.dtype, None, r)


def _tag(tag: Any, op: str) -> int:
    t = as_int(tag, "tag", op)
    if not 0 <= t <= MAX_TAG:
        raise ValueError(f"{op}: tag {t} is out of range (0 to {MAX_TAG})")
    return t


def send(x: Any, dst: int, *, tag: int = 0, group: Group | None = None, stream: Any = None) -> None:
    """Send ``x`` to rank ``dst`` (which calls :func:`recv` with this rank, the same tag, shape and
    dtype). Issued at once; returns nothing."""
    g, st, d = _args("send", x, group, stream)
    r = _rank_arg(dst, "dst", g, "send")
    if r == g.rank:
        raise ValueError(f"send: dst {r} is this rank; a rank cannot send to itself")
    _collective("send", g, st, d, (0,), dt.uint8, None, r, _tag(tag, "send"))


def recv(shape: Any, dtype: Any, src: int, *, tag: int = 0, group: Group | None = None,
         stream: Any = None) -> Array:
    """The array of ``shape`` and ``dtype`` that rank ``src`` sends with ``tag``."""
    g = _group(group, "recv")
    r = _rank_arg(src, "src", g, "recv")
    if r == g.rank:
        raise ValueError(f"recv: src {r} is this rank; a rank cannot receive from itself")
    return _collective("recv", g, stream_of(stream, "recv"), None, check_shape(shape, "recv"), dt.dtype(dtype),
                       None, r, _tag(tag, "recv"))


def barrier(*, group: Group | None = None, stream: Any = None) -> None:
    """Wait on the host until every rank of the group has reached this barrier (and this rank's earlier
    collectives on the stream's device have run)."""
    from ..evaluation import eval as _eval
    g = _group(group, "barrier")
    _eval(_collective("barrier", g, stream_of(stream, "barrier"), None, (0,), dt.uint8))
