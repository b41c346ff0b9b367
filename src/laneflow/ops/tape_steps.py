"""A tape's calls compiled to Python functions, one per call (``ops/tape_record.py`` records, this replays).

Replaying a recorded call interpreted, reading its record (which arguments are arrays, where they come
from, which are static, what nodes to make), cost as much as the op it skips: GPT-2 small's ops are
already about 1.5 us a call. So each call of a tape becomes one function, written out as source when
the tape is confirmed: its checks unrolled (this op, these positional and keyword arguments, this
thread and stream, each array the recorded result or a leaf, each static argument equal and of the same
classes), then its nodes made with their primitives, shapes and dtypes as constants, then the result.
A step function ends by making the next call's function the replayer's ``call``; a check that fails
hands the call to ``Replayer.diverge`` (the op then runs as usual).

The source of every function is kept (``Steps.source``) for reading and for the tests.
"""

from __future__ import annotations

from threading import get_ident
from types import EllipsisType
from typing import Any

import numpy as np

from ..array import Array
from ..defaults import Stream, current_stream
from ..device import Device
from ..graph import speculate as _speculate
from ..graph import tracer as _tracer
from ..graph.node import ArrayData, exact, multi_output
from .primitives import Constant

#: a step's answer while a replay is probed (its first call tried): the call is not this tape's
MISS = object()

_SCALARS = (type(None), bool, int, str, EllipsisType, np.dtype, Stream, Device)
_SINGLETONS = (None, Ellipsis, True, False)


def plain(v: Any) -> int:
    """How a static argument is compared at replay (:func:`_differs`): 1 equal value and class, 3 number
    by number, bit for bit, or element by element (:func:`same`); 0: not static data the tape can
    compare (an array-like, an object of a user's)."""
    c = v.__class__
    if c in _SCALARS or isinstance(v, (np.dtype, Stream, Device)) or c is type:
        return 1
    if c is float or c is complex or isinstance(v, np.generic):
        return 3
    if c is tuple or c is list:
        kinds = [plain(x) for x in v]
        return 0 if 0 in kinds else 3
    if c is slice:
        return 3 if plain(v.start) and plain(v.stop) and plain(v.step) else 0
    return 0


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` are the same static argument: same classes throughout, equal values, floats equal
    bit for bit up to NaN payloads (``-0.0`` is not ``0.0``)."""
    c = a.__class__
    if c is not b.__class__:
        return False
    if c is tuple or c is list:
        return len(a) == len(b) and all(map(same, a, b))
    if c is slice:
        return same(a.start, b.start) and same(a.stop, b.stop) and same(a.step, b.step)
    bits = exact(a)
    if bits is not None:  # floats and complex numbers, numpy's and ml_dtypes' too: bit for bit
        return bits == exact(b)
    return bool(a == b)


def snapshot(v: Any) -> Any:
    """A static argument as it is now (a list the caller may change after the call is copied)."""
    c = v.__class__
    if c is list:
        return [snapshot(x) for x in v]
    if c is tuple:
        return tuple([snapshot(x) for x in v])
    return v


class HostData:
    """A recorded node's host data (a ``Constant``, which its upload empties): each replay makes its
    primitive anew from a copy (a CPU buffer may be the copy itself, and be written in place)."""

    __slots__ = ("value", "name")

    def __init__(self, value: np.ndarray, name: str):
        self.value, self.name = np.array(value, copy=True), name

    def make(self) -> Constant:
        return Constant(self.value.copy(), self.name)


class Steps:
    """The compiled calls of one tape, each a function made by a factory of its call's shape (the source
    with every number and object a parameter, so GPT-2 small's 308 calls need about 15 compiles, kept
    in :data:`_FACTORIES` for every tape); ``first`` is the first call's function. They read the
    replay's state from the tape's one :class:`~laneflow.ops.tape_replay.Replayer` (one replay of a tape runs
    at a time: the tape state is one slot)."""

    __slots__ = ("funcs", "first")

    def __init__(self, tape, rp) -> None:
        _maker()
        first_use: set = set()
        shapes = []
        watched = False
        for c in tape.calls:
            watch = not watched and bool(c.nodes)
            watched = watched or watch
            shapes.append(_source(c, tape, first_use, watch))
        funcs: list = [None] * len(shapes)
        nxt = None
        for i in range(len(shapes) - 1, -1, -1):
            src, consts = shapes[i]
            f = _FACTORIES.get(src)
            if f is None:
                f = _factory(src)
            funcs[i] = nxt = f(rp, nxt, *consts)
        self.funcs, self.first = funcs, funcs[0]

    @staticmethod
    def source(tape, k: int) -> str:
        """The source of the factory of the tape's call ``k`` (for reading, and the tests)."""
        return _source(tape.calls[k], tape, set(), k == 0)[0]


#: factory source -> the compiled factory
_FACTORIES: dict = {}
_GLOBALS = {"A": Array, "AD": ArrayData, "NEW": object.__new__, "MO": multi_output, "SAME": same,
            "TR": _tracer.ACTIVE, "W": _speculate.WATCH, "FIRST": _speculate.first_node, "CS": current_stream,
            "MISS": MISS, "gi": get_ident}


def _differs(x: str, v, const, depth: int) -> str:
    """Source of a test that the static argument ``x`` (an expression) is not ``v``, as :func:`same`
    says, written out for the common kinds (a call of ``same`` per float or index tuple cost about a
    microsecond): None, Ellipsis and the bools by identity; ints and strings by class and value;
    floats other than zeros and NaNs by class and value (equal values of those have equal bits);
    tuples and slices element by element (classes first: an element may be an array, whose ``!=`` is
    elementwise); dtypes, streams, devices and classes by class and equality. Anything else calls
    ``same``."""
    c = v.__class__
    if any(v is s for s in _SINGLETONS):
        return f"{x} is not {v!r}"
    if c is int or c is str or (c is float and v == v and v != 0.0):
        return f"({x}.__class__ is not {c.__name__} or {x} != {const(v)})"
    if c is tuple and depth < 3 and len(v) <= 8:
        parts = [f"{x}.__class__ is not tuple", f"len({x}) != {len(v)}"]
        parts += [_differs(f"{x}[{m}]", e, const, depth + 1) for m, e in enumerate(v)]
        return f"({' or '.join(parts)})"
    if c is slice and depth < 3:
        parts = [f"{x}.__class__ is not slice"]
        parts += [_differs(f"{x}.{f}", getattr(v, f), const, depth + 1) for f in ("start", "stop", "step")]
        return f"({' or '.join(parts)})"
    if plain(v) == 1:
        return f"({x}.__class__ is not {const(c)} or {x} != {const(v)})"
    return f"not SAME({x}, {const(v)})"


def _maker() -> None:
    """The C node maker (``ctape.py``) in the steps' globals, asked for once: a step then makes each node
    and its array in one call (``MKA``, ``MKN``); without it, in Python."""
    if "C" not in _GLOBALS:
        from . import ctape  # (the first tape builds or loads it)
        mod = ctape.load()
        if mod is not None:
            _GLOBALS["MKN"], _GLOBALS["MKA"], _GLOBALS["CM"] = mod.node, mod.array, mod.same_counts
        _GLOBALS["C"] = mod is not None


def _factory(src: str):
    ns: dict = {}
    exec(compile(src, "<tape step>", "exec"), _GLOBALS, ns)  # noqa: S102 - source made here, from constants' names
    f = ns["factory"]
    if len(_FACTORIES) < 4096:
        _FACTORIES[src] = f
    return f


def _source(c, tape, first_use: set, watch: bool) -> tuple:
    """The source of call ``c``'s factory, ``factory(R, NEXT, k0, k1, ...)`` (``R``: the replayer; NEXT:
    the next call's function, None after the last), and the constants ``k0, k1, ...``."""
    consts: list = []

    def const(v: Any) -> str:
        consts.append(v)
        return f"k{len(consts) - 1}"

    out = ["    def s(fn, args, kw):"]
    npos = c.n - len(c.names)
    fail = "return R.diverge(fn, args, kw)"
    kwcheck = "kw" if not c.names else f"len(kw) != {len(c.names)}"
    if c.stream is tape.stream and c.depth == tape.depth:  # the stream the step began on: read off its scopes
        where = (f"len(R.stack) != {tape.depth} or R.stack[-1] is not R.st" if tape.depth
                 else "R.stack or CS() is not R.st")
    else:
        where = f"CS() is not {const(c.stream)}"
    out.append(f"        if (fn is not {const(c.fn)} or len(args) != {npos} or {kwcheck} or gi() != R.thread or TR[0]"
               f" or {where}):")
    out.append(f"            {fail}")
    if npos == 1:
        out.append("        v0, = args")
    elif npos:
        out.append(f"        {', '.join(f'v{k}' for k in range(npos))} = args")
    for j, name in enumerate(c.names):
        out.append(f"        v{npos + j} = kw.get({const(name)}, MISS)")
    if c.arrays or c.extra or c.nodes:
        out.append("        M = R.made")
    for pos, cls, n in c.containers:  # (before reading their elements)
        out.append(f"        if v{pos}.__class__ is not {'list' if cls is list else 'tuple'} or len(v{pos}) != {n}:")
        out.append(f"            {fail}")
    env, conds, firsts, here = [], [], [], {}
    for j, (pos, sub, ref) in enumerate(c.arrays):
        v = f"v{pos}" if sub is None else f"v{pos}[{sub}]"
        out.append(f"        if {v}.__class__ is not A:")
        out.append(f"            {fail}")
        out.append(f"        e{j} = {v}._data")
        if ref >= 0:
            conds.append(f"e{j} is not M[{const(ref)}]")
        else:
            slot = -1 - ref
            if slot in here:  # (the same leaf again in this call: as its first use here)
                conds.append(f"e{j} is not e{here[slot]}")
            elif slot in first_use:
                conds.append(f"e{j} is not R.bound[{const(slot)}]")
            else:
                first_use.add(slot)
                k = const(slot)
                firsts.append((j, k))
                conds.append(f"(e{j} is not R.tape.leaves[{k}] and not R.bind({k}, e{j}))")
            here.setdefault(slot, j)
        env.append(f"e{j}")
    for pos, sub, v, _ in c.static:
        conds.append(_differs(f"v{pos}" if sub is None else f"v{pos}[{sub}]", v, const, 0))
    if conds:
        out.append(f"        if {' or '.join(conds)}:")
        out.append(f"            {fail}")
    for j, k in firsts:
        out.append(f"        R.bound[{k}] = e{j}")
    for t, x in enumerate(c.extra):
        out.append(f"        x{t} = M[{const(x)}]" if x.__class__ is int else f"        x{t} = {const(x)}")
        env.append(f"x{t}")
    base = len(env)
    held = [0] * len(c.nodes)  # the arrays the call returns bound to each node
    for k in c.outs:
        if k >= base:
            held[k - base] += 1
    # the result that is each node's first (made with its node in one call of the C maker), and the
    # nodes the call's code reads again (inputs of its later nodes, groups, the watched first node)
    first_out = {}
    for m, k in enumerate(c.outs):
        if k >= base:
            first_out.setdefault(k - base, m)
    again = {k - base for _, _, _, _, ins in c.nodes for k in ins if k >= base}
    again.update(k - base for g in c.groups for k in g)
    again.update(k - base for m, k in enumerate(c.outs) if k >= base and first_out[k - base] != m)
    if watch:
        again.add(0)
    made_out: set = set()
    for j, (prim, shape, dtype, stream, ins) in enumerate(c.nodes):
        n = f"n{j}"
        p = f"{const(prim)}.make()" if prim.__class__ is HostData else const(prim)
        if _GLOBALS.get("C"):
            spec = const((shape, dtype, stream, stream.device, held[j]))
            args = "".join(f", {env[k]}" for k in ins)
            if j in first_out:
                m = first_out[j]
                made_out.add(m)
                out.append(f"        r{m} = MKA(M, {spec}, {p}{args})")
                if j in again:
                    out.append(f"        {n} = r{m}._data")
            else:
                out.append(f"        {n} = MKN(M, {spec}, {p}{args})")
            env.append(n)
            continue
        # ArrayData.__init__ written out (a frame less per node): the same fields, in its order
        out.append(f"        {n} = NEW(AD)")
        out.append(f"        {n}.shape = {const(shape)}")
        out.append(f"        {n}.dtype = {const(dtype)}")
        out.append(f"        {n}.stream = {const(stream)}")
        out.append(f"        {n}.device = {const(stream.device)}")
        out.append(f"        {n}.prim = {p}")
        out.append(f"        {n}.inputs = ({''.join(f'{env[k]}, ' for k in ins)})")
        out.append(f"        {n}.siblings = {n}.buffer = None")
        out.append(f"        {n}.users = 0")
        out.append(f"        {n}.arrays = {held[j]}")
        for k in ins:
            out.append(f"        {env[k]}.users += 1")
        out.append(f"        M.append({n})")
        env.append(n)
    for g in c.groups:
        out.append(f"        MO([{', '.join(env[k] for k in g)}])")
    if watch:
        out.append("        if W[0]:")
        out.append("            FIRST(n0)")
    results = []
    for m, k in enumerate(c.outs):
        if k < 0:
            results.append(f"v{-1 - k}")
            continue
        if m in made_out:
            results.append(f"r{m}")
            continue
        out.append(f"        r{m} = NEW(A)")
        out.append(f"        r{m}._data = {env[k]}")
        if k < base:  # (a node of this call counts its arrays from the start)
            out.append(f"        {env[k]}.arrays += 1")
        results.append(f"r{m}")
    out.append("        if NEXT is None:")
    out.append("            R.done = True")
    out.append("            R.call = R.diverge")
    out.append("        else:")
    out.append("            R.call = NEXT")
    if c.kind is None:
        out.append(f"        return {results[0]}")
    elif c.kind is tuple:
        out.append(f"        return ({''.join(r + ', ' for r in results)})")
    else:
        out.append(f"        return [{', '.join(results)}]")
    params = "".join(f", k{m}" for m in range(len(consts)))
    return "\n".join([f"def factory(R, NEXT{params}):", *out, "    return s", ""]), consts
