"""Argument binding: how a compiled CUDA graph reads the arguments of each call.

Arguments are read where they are (*direct*) while each call passes the same buffer (weights, say);
an argument that changes between calls is copied into a static staging buffer (*staged*, one device
copy per call: one driver call, where patching would touch every kernel node that reads the argument;
measured on an H200 with ``tools/probe_bind.py``: a staging copy costs 31-47 us of host time per call
against 75-846 us for a re-capture with ``cuGraphExecUpdate``). The plan keeps a direct argument's
buffer alive, so its address cannot be reused under the graph. A staged argument larger than
:data:`STAGE_LIMIT` is re-bound by a new capture instead of copied.
"""

from __future__ import annotations

import math

from ....ops.table import validated_on_host
from ....runtime.buffer import Buffer
from ..memory import DeviceArray
from .capture import CaptureUnsupported
from .outputs import OutBuffer

#: Arguments up to this size that change between calls are copied into staging memory; larger ones
#: trigger a re-capture with their new address.
STAGE_LIMIT = 64 << 20


class Arguments:
    """The binding of a graph's arguments: for each, the buffer read in place (``bound``, at
    ``bound_ptrs``) or its staging buffer (``staged``)."""

    def __init__(self) -> None:
        self.bound: list[Buffer | None] = []      # direct arguments: the buffer the graph reads
        self.bound_ptrs: list[int] = []           # ... at this address
        self.staged: dict[int, Buffer] = {}       # staged arguments: their staging buffer
        self.nbytes: list[int] = []
        self.specs: list[tuple] = []              # (shape, dtype) of each
        self.movable: list[int] = []              # arguments that are compiled outputs (their address can move)

    def first(self, bufs: list, datas: list, device) -> None:
        """Bind the first call's arguments in place."""
        for b in bufs:
            if not isinstance(b.data, DeviceArray) or b.device != device:
                raise CaptureUnsupported("an argument is not on this GPU")
        self.nbytes = [b.nbytes for b in bufs]
        self.specs = [(d.shape, d.dtype) for d in datas]
        self.bound = list(bufs)
        self.bound_ptrs = [b.data.ptr for b in bufs]
        self.movable = [i for i, b in enumerate(bufs) if b.__class__ is OutBuffer]

    def bind(self, bufs: list, last: list | None, allocate) -> bool:
        """Bind a call's argument buffers; True when the binding changed, so every graph must be
        captured again. The buffers bound last time read where they are (the common call: a list
        compare in C, and no bound output moved: only a compiled function's output can move; other
        memory stays while it is alive); a different buffer, or one moved, is staged (``allocate(n)``
        gives staging memory) or, above STAGE_LIMIT, bound anew."""
        bound, ptrs = self.bound, self.bound_ptrs
        same = bufs is last or bufs == bound
        if same:
            for i in self.movable:
                if bufs[i].data.ptr != ptrs[i]:
                    same = False
                    break
        if same:
            return False
        changed = False
        for i, b in enumerate(bufs):
            old = bound[i]
            if old is not None and (b is not old or b.data.ptr != ptrs[i]):
                if self.nbytes[i] <= STAGE_LIMIT:
                    self.staged[i] = allocate(self.nbytes[i])
                    bound[i] = None
                else:
                    bound[i] = b
                    ptrs[i] = b.data.ptr
                    if b.__class__ is OutBuffer and i not in self.movable:
                        self.movable.append(i)
                changed = True
        return changed

    def address(self, i: int) -> int:
        """Where the graph reads argument ``i``: its staging buffer, or the buffer bound in place."""
        st = self.staged.get(i)
        return (st if st is not None else self.bound[i]).data.ptr


def host_checks(steps: list) -> list:
    """(argument index, ``ok(host)``) for the arguments whose values a kernel validates on the host
    when laneflow holds a host copy (the op table's host-validated inputs: index arrays, an integer
    power's exponent). A graph cannot check on the host as its kernels run, so a call checks them when
    it binds them; a call whose check fails runs as commands, which raise exactly as eager mode does."""
    out = []
    for step in steps:
        prim = step.prim
        for pos, (kind, v) in enumerate(step.srcs):
            if kind == "arg" and validated_on_host(prim, pos):
                out.append((v, _check_of(prim, pos, step)))
    return out


def _check_of(prim, pos: int, step):
    kind = prim.kind
    if kind == "elementwise":  # an integer power's exponent: no negative value
        return lambda h: h.dtype.kind not in "iu" or h.size == 0 or h.min() >= 0
    size = _index_size(prim, pos, step)
    if size is None:
        return lambda h: False  # not understood here: every call with a host copy runs as commands
    return lambda h, n=size: h.size == 0 or (-n <= h.min() and h.max() < n)


def _index_size(prim, pos: int, step) -> int | None:
    """The size of the axis an index input ``pos`` indexes (take, getitem, setitem)."""
    shape = _source_shape(step, 0)
    if shape is None:
        return None
    if prim.kind == "take":
        return math.prod(shape) if prim.axis is None else shape[prim.axis]
    first = 1 if prim.kind == "getitem" else 2
    dim = 0
    for e in prim.index:
        if e is None:
            continue
        if e.__class__ is tuple and e[1] == pos - first:
            return shape[dim]
        dim += 1
    return None


def _source_shape(step, k: int):
    return step.in_shapes[k] if k < len(step.in_shapes) else None
