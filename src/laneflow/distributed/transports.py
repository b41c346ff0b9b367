"""What moves a group's arrays: the shared parts of every transport, and the group of one.

A transport's ``run(lane, prim, ins, outs)`` is the body of a collective's command on the group's
communication lane, given the backend's data handles (numpy arrays on the CPU, device arrays on a GPU).
"""

from __future__ import annotations

import time

import numpy as np

from .. import dtypes as dt
from ..ops.primitives import Copy
from .group import DistributedError

#: dtypes reduced in float32 (MPI has no half types; the result is rounded once, back to the dtype)
HALF = frozenset((dt.float16, dt.bfloat16))
#: seconds a wait polls without sleeping before it backs off (20 us doubling to 200 us between polls:
#: MPI progresses only while polled, and a spinning communication thread takes a core from compute)
SPIN_S = 0.001


def poll(test, group, op: str, seq: int) -> None:
    """Wait for ``test()`` to say done, at most the group's timeout; past it the group is broken (a
    transport's request can no longer be trusted) and the op fails naming what may have happened."""
    if test():
        return
    timeout = group.timeout
    start = time.monotonic()
    deadline = start + timeout
    spin_until = start + SPIN_S
    nap = 2e-5
    while not test():
        now = time.monotonic()
        if now < spin_until:  # a short wait is polled without sleeping (MPI's blocking calls spin too)
            continue
        if now > deadline:
            group.broken = f"{op} (collective #{seq}) timed out"
            raise DistributedError(
                f"{op}: not every rank of the group took part within {timeout:g} s (collective #{seq}). A "
                "peer may have died or hung, or the ranks called different numbers of collectives. The "
                "group is now broken; restart the processes (lf.distributed.init(timeout=...) sets the limit)")
        time.sleep(nap)
        nap = min(nap * 2, 2e-4)


def check_reduction(op: str, reduction: str, dtype: np.dtype) -> None:
    """Refuse, at construction, reductions a dtype has no meaning for (the same words everywhere)."""
    if dtype == dt.bool_ and reduction not in ("max", "min"):
        raise TypeError(f"{op}: reduction {reduction!r} of a bool array; use 'max' (any rank true) or 'min' (all true)")
    if dtype.kind == "c" and reduction in ("max", "min"):
        raise TypeError(f"{op}: reduction {reduction!r} of a complex array (complex numbers have no order)")
    if reduction == "avg" and dtype.kind not in "fc" and dtype not in HALF:
        raise TypeError(f"{op}: reduction 'avg' of a {dtype} array; use 'sum' and divide, or cast to a float dtype")


class LocalTransport:
    """A group of one process: every collective is a copy of its input (``all_reduce`` of one rank is
    the rank's value), done by the backend's copy kernel, so code written for many ranks runs unchanged."""

    name = "local"
    capturable = True  # a copy kernel: a CUDA graph holds it

    def __init__(self, backend):
        self.copy = backend.kernel("copy")
        self.prim = Copy("distributed copy")

    def run(self, lane, prim, ins, outs) -> None:
        if ins and outs and outs[0] is not None:
            self.copy(lane, self.prim, ins[:1], outs[:1])
