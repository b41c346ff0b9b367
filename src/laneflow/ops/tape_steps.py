"""A tape's calls compiled to Python functions, one per call (``ops/tape_record.py`` records, this replays).

Replaying a recorded call interpreted, reading its record (which arguments are arrays, where they come
from, which are static, what nodes to make), cost as much as the op it skips: GPT-2 small's ops are
already about 1.5 us a call. So each call of a tape becomes one function, written out as source when
the tape is confirmed: its checks unrolled (this op, these positional and keyword arguments, this
thread and stream, each array the recorded result or a leaf, each static argument equal and of the same
classes), then its nodes made with their primitives, shapes and dtypes as constants, then the result.
A step function ends by making the next call's function the replayer's ``call``; a check that fails
hands the call to ``Replayer.diverge`` (the op then runs as usual).

The source of every function is kept (``Steps.source``) for reading and for the tests. Each call is first
a :class:`Plan` (data); where the C module builds (``ctape.py``) a step is that plan interpreted in C, the
same checks in the same order, else the Python function written out from it.
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
        plans = []
        watched = False
        for c in tape.calls:
            watch = not watched and bool(c.nodes)
            watched = watched or watch
            plans.append(plan(c, tape, first_use, watch))
        funcs: list = [None] * len(plans)
        step = _GLOBALS.get("CSTEP") if _GLOBALS.get("C") else None
        if step is not None:
            _init_steps(type(tape), type(rp))
        nxt = None
        for i in range(len(plans) - 1, -1, -1):
            f = None
            if step is not None:
                try:
                    f = step(rp, nxt, _cspec(plans[i]))
                except ValueError:  # (a call with more values than the C step holds: in Python)
                    f = None
            if f is None:
                src, consts = _python(plans[i], _GLOBALS.get("C"))
                factory = _FACTORIES.get(src)
                if factory is None:
                    factory = _factory(src)
                f = factory(rp, nxt, *consts)
            funcs[i] = nxt = f
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


#: the kinds of a static argument's check (:func:`check_of`)
IS, EQ, TUPLE, SLICE, SAME_AS = range(5)


def check_of(v: Any, depth: int = 0) -> tuple:
    """How a replay tests that a static argument is still ``v``, as :func:`same` says, for the common kinds
    without calling ``same`` (a call per float or index tuple cost about a microsecond): ``(IS, v)``
    None, Ellipsis and the bools by identity; ``(EQ, class, v)`` ints and strings, floats other than
    zeros and NaNs (equal values of those have equal bits), dtypes, streams, devices and classes by
    class and equality; ``(TUPLE, checks)`` and ``(SLICE, (start, stop, step))`` element by element
    (classes first: an element may be an array, whose ``!=`` is elementwise); else ``(SAME_AS, v)``,
    which calls ``same``. The Python steps write a check out (:func:`_differs`); the C steps
    (``ctape.c``) interpret it."""
    c = v.__class__
    if any(v is s for s in _SINGLETONS):
        return (IS, v)
    if c is int or c is str or (c is float and v == v and v != 0.0):
        return (EQ, c, v)
    if c is tuple and depth < 3 and len(v) <= 8:
        return (TUPLE, tuple(check_of(e, depth + 1) for e in v))
    if c is slice and depth < 3:
        return (SLICE, tuple(check_of(getattr(v, f), depth + 1) for f in ("start", "stop", "step")))
    if plain(v) == 1:
        return (EQ, c, v)
    return (SAME_AS, v)


def _differs(x: str, check: tuple, const) -> str:
    """Source of a test that the static argument ``x`` (an expression) fails ``check`` (:func:`check_of`)."""
    how = check[0]
    if how == IS:
        return f"{x} is not {check[1]!r}"
    if how == EQ:
        c, v = check[1], check[2]
        name = c.__name__ if c is int or c is str or c is float else const(c)
        return f"({x}.__class__ is not {name} or {x} != {const(v)})"
    if how == TUPLE:
        parts = [f"{x}.__class__ is not tuple", f"len({x}) != {len(check[1])}"]
        parts += [_differs(f"{x}[{m}]", e, const) for m, e in enumerate(check[1])]
        return f"({' or '.join(parts)})"
    if how == SLICE:
        parts = [f"{x}.__class__ is not slice"]
        parts += [_differs(f"{x}.{f}", e, const) for f, e in zip(("start", "stop", "step"), check[1])]
        return f"({' or '.join(parts)})"
    return f"not SAME({x}, {const(check[1])})"


def _maker() -> None:
    """The C node maker (``ctape.py``) in the steps' globals, asked for once: a step then makes each node
    and its array in one call (``MKA``, ``MKN``); without it, in Python."""
    if "C" not in _GLOBALS:
        from . import ctape  # (the first tape builds or loads it)
        mod = ctape.load()
        if mod is not None:
            _GLOBALS["MKN"], _GLOBALS["MKA"], _GLOBALS["CM"] = mod.node, mod.array, mod.same_counts
            # the steps themselves in C (Plan interpreted: ctape.c), unless LANEFLOW_CSTEPS=0 (then
            # Python steps that make their nodes in C)
            _GLOBALS["CSTEP"] = mod.step if ctape.steps_on() else None
        _GLOBALS["C"] = mod is not None


_STEP_TYPES: list = []


def _init_steps(tape_type: type, replayer_type: type) -> None:
    """Tell the C steps the replayer's and tape's classes (their slots) and the steps' globals, once."""
    if _STEP_TYPES != [tape_type, replayer_type]:
        from . import ctape
        ctape.load().init_steps(replayer_type, tape_type, _GLOBALS["TR"], _GLOBALS["W"], _GLOBALS["FIRST"],
                                _GLOBALS["MO"], _GLOBALS["CS"], MISS, same)
        _STEP_TYPES[:] = [tape_type, replayer_type]


def _cspec(p: Plan) -> tuple:
    """A plan as the C step takes it (``ctape.step``): ints where it reads ints."""
    return (p.fn, p.npos, p.names, p.where[0], p.where[1],
            tuple((pos, int(cls is list), n) for pos, cls, n in p.containers),
            tuple((pos, -1 if sub is None else sub, how, arg) for pos, sub, how, arg in p.arrays),
            tuple((pos, -1 if sub is None else sub, check) for pos, sub, check in p.static),
            tuple((x.__class__ is int, x) for x in p.extra),
            tuple((prim, prim.__class__ is HostData, spec, ins, -1 if first is None else first)
                  for prim, spec, ins, first in p.nodes),
            p.groups, p.watch,
            tuple((o[0], o[1], int(o[2]) if len(o) > 2 else 0) for o in p.outs),
            0 if p.kind is None else 1 if p.kind is tuple else 2)


def _factory(src: str):
    ns: dict = {}
    exec(compile(src, "<tape step>", "exec"), _GLOBALS, ns)  # noqa: S102 - source made here, from constants' names
    f = ns["factory"]
    if len(_FACTORIES) < 4096:
        _FACTORIES[src] = f
    return f


class Plan:
    """One call's step, as data (:func:`plan`): what the Python source (:func:`_python`) writes out and
    the C steps (``ctape.c``) interpret.

    - ``fn``, ``npos``, ``names``: the op, its positional count, its keywords' names;
    - ``where``: ``(DEPTH, depth)`` the stream the replay began on, read off the thread's stream scopes
      (``R.stack``), or ``(CURRENT, stream)``: ``current_stream()`` is that stream;
    - ``containers``: (position, list or tuple, length);
    - ``arrays``: (position, element or None, how, arg), how ``MADE`` (arg a tape position), ``HERE``
      (the same leaf as this call's array ``arg``), ``BOUND`` (leaf slot ``arg`` bound earlier in the
      replay), ``FIRST`` (the leaf of slot ``arg``, first used here: the recorded one, or bound now);
    - ``static``: (position, element or None, check) (:func:`check_of`);
    - ``extra``: a tape position (int) or an evaluated node held as is;
    - ``nodes``: (primitive, spec, inputs, first), ``spec`` (shape, dtype, stream, device, arrays held),
      ``inputs`` indices into the call's values (its arrays, extras, then its nodes), ``first`` the
      result made with the node (an Array bound to it) or None;
    - ``groups``: value indices of sibling groups; ``watch``: the speculative launch's first node check;
    - ``outs``: (``ARG``, position), (``MADE_OUT``, node: the result made with it), or (``VALUE``, value index, whether its
      array count rises); ``kind``: None (one array), tuple or list."""

    __slots__ = ("fn", "npos", "names", "where", "containers", "arrays", "static", "extra", "nodes", "groups",
                 "watch", "outs", "kind", "again")


#: Plan.where
DEPTH, CURRENT = 0, 1
#: Plan.arrays' how
MADE, HERE, BOUND, FIRST = range(4)
#: Plan.outs' kinds
ARG, MADE_OUT, VALUE = range(3)


def plan(c, tape, first_use: set, watch: bool) -> Plan:
    """Call ``c``'s step as data; ``first_use``: the leaf slots earlier calls of the tape use (updated)."""
    p = Plan()
    p.fn, p.npos, p.names, p.kind, p.watch = c.fn, c.n - len(c.names), tuple(c.names), c.kind, watch
    if c.stream is tape.stream and c.depth == tape.depth:  # the stream the step began on: read off its scopes
        p.where = (DEPTH, tape.depth)
    else:
        p.where = (CURRENT, c.stream)
    p.containers = tuple(c.containers)
    arrays, here = [], {}
    for j, (pos, sub, ref) in enumerate(c.arrays):
        if ref >= 0:
            arrays.append((pos, sub, MADE, ref))
        else:
            slot = -1 - ref
            if slot in here:  # (the same leaf again in this call: as its first use here)
                arrays.append((pos, sub, HERE, here[slot]))
            elif slot in first_use:
                arrays.append((pos, sub, BOUND, slot))
            else:
                first_use.add(slot)
                arrays.append((pos, sub, FIRST, slot))
            here.setdefault(slot, j)
    p.arrays = tuple(arrays)
    p.static = tuple((pos, sub, check_of(v)) for pos, sub, v, _ in c.static)
    p.extra = tuple(c.extra)
    base = len(arrays) + len(p.extra)
    held = [0] * len(c.nodes)  # the arrays the call returns bound to each node
    for k in c.outs:
        if k >= base:
            held[k - base] += 1
    # the result that is each node's first (made with its node in one call of the C maker), and the
    # nodes the call's code reads again (inputs of its later nodes, groups, the watched first node)
    first_out: dict = {}
    for m, k in enumerate(c.outs):
        if k >= base:
            first_out.setdefault(k - base, m)
    again = {k - base for _, _, _, _, ins in c.nodes for k in ins if k >= base}
    again.update(k - base for g in c.groups for k in g)
    again.update(k - base for m, k in enumerate(c.outs) if k >= base and first_out[k - base] != m)
    if watch:
        again.add(0)
    p.again = frozenset(again)
    p.nodes = tuple((prim, (shape, dtype, stream, stream.device, held[j]), tuple(ins), first_out.get(j))
                    for j, (prim, shape, dtype, stream, ins) in enumerate(c.nodes))
    p.groups = tuple(tuple(g) for g in c.groups)
    outs = []
    for m, k in enumerate(c.outs):
        if k < 0:
            outs.append((ARG, -1 - k))
        elif k >= base and first_out[k - base] == m:
            outs.append((MADE_OUT, k - base))
        else:
            outs.append((VALUE, k, k < base))  # (a node of this call counts its arrays from the start)
    p.outs = tuple(outs)
    return p


def _source(c, tape, first_use: set, watch: bool) -> tuple:
    """The source of call ``c``'s factory and its constants (:func:`_python`)."""
    return _python(plan(c, tape, first_use, watch), _GLOBALS.get("C"))


def _python(p: Plan, maker: bool) -> tuple:
    """The source of a step's factory, ``factory(R, NEXT, k0, k1, ...)`` (``R``: the replayer; NEXT: the
    next call's function, None after the last), and the constants ``k0, k1, ...``; ``maker``: nodes
    made by the C node maker (``MKA``, ``MKN``), else in Python."""
    consts: list = []

    def const(v: Any) -> str:
        consts.append(v)
        return f"k{len(consts) - 1}"

    out = ["    def s(fn, args, kw):"]
    npos = p.npos
    fail = "return R.diverge(fn, args, kw)"
    kwcheck = "kw" if not p.names else f"len(kw) != {len(p.names)}"
    mode, arg = p.where
    if mode == DEPTH:
        where = f"len(R.stack) != {arg} or R.stack[-1] is not R.st" if arg else "R.stack or CS() is not R.st"
    else:
        where = f"CS() is not {const(arg)}"
    out.append(f"        if (fn is not {const(p.fn)} or len(args) != {npos} or {kwcheck} or gi() != R.thread or TR[0]"
               f" or {where}):")
    out.append(f"            {fail}")
    if npos == 1:
        out.append("        v0, = args")
    elif npos:
        out.append(f"        {', '.join(f'v{k}' for k in range(npos))} = args")
    for j, name in enumerate(p.names):
        out.append(f"        v{npos + j} = kw.get({const(name)}, MISS)")
    if p.arrays or p.extra or p.nodes:
        out.append("        M = R.made")
    for pos, cls, n in p.containers:  # (before reading their elements)
        out.append(f"        if v{pos}.__class__ is not {'list' if cls is list else 'tuple'} or len(v{pos}) != {n}:")
        out.append(f"            {fail}")
    env, conds, firsts = [], [], []
    for j, (pos, sub, how, ref) in enumerate(p.arrays):
        v = f"v{pos}" if sub is None else f"v{pos}[{sub}]"
        out.append(f"        if {v}.__class__ is not A:")
        out.append(f"            {fail}")
        out.append(f"        e{j} = {v}._data")
        if how == MADE:
            conds.append(f"e{j} is not M[{const(ref)}]")
        elif how == HERE:
            conds.append(f"e{j} is not e{ref}")
        elif how == BOUND:
            conds.append(f"e{j} is not R.bound[{const(ref)}]")
        else:
            k = const(ref)
            firsts.append((j, k))
            conds.append(f"(e{j} is not R.tape.leaves[{k}] and not R.bind({k}, e{j}))")
        env.append(f"e{j}")
    for pos, sub, check in p.static:
        conds.append(_differs(f"v{pos}" if sub is None else f"v{pos}[{sub}]", check, const))
    if conds:
        out.append(f"        if {' or '.join(conds)}:")
        out.append(f"            {fail}")
    for j, k in firsts:
        out.append(f"        R.bound[{k}] = e{j}")
    for t, x in enumerate(p.extra):
        out.append(f"        x{t} = M[{const(x)}]" if x.__class__ is int else f"        x{t} = {const(x)}")
        env.append(f"x{t}")
    for j, (prim, spec, ins, first) in enumerate(p.nodes):
        n = f"n{j}"
        pr = f"{const(prim)}.make()" if prim.__class__ is HostData else const(prim)
        if maker:
            args = "".join(f", {env[k]}" for k in ins)
            if first is not None:
                out.append(f"        r{first} = MKA(M, {const(spec)}, {pr}{args})")
                if j in p.again:
                    out.append(f"        {n} = r{first}._data")
            else:
                out.append(f"        {n} = MKN(M, {const(spec)}, {pr}{args})")
            env.append(n)
            continue
        shape, dtype, stream, device, held = spec
        # ArrayData.__init__ written out (a frame less per node): the same fields, in its order
        out.append(f"        {n} = NEW(AD)")
        out.append(f"        {n}.shape = {const(shape)}")
        out.append(f"        {n}.dtype = {const(dtype)}")
        out.append(f"        {n}.stream = {const(stream)}")
        out.append(f"        {n}.device = {const(device)}")
        out.append(f"        {n}.prim = {pr}")
        out.append(f"        {n}.inputs = ({''.join(f'{env[k]}, ' for k in ins)})")
        out.append(f"        {n}.siblings = {n}.buffer = None")
        out.append(f"        {n}.users = 0")
        out.append(f"        {n}.arrays = {held}")
        for k in ins:
            out.append(f"        {env[k]}.users += 1")
        out.append(f"        M.append({n})")
        env.append(n)
    for g in p.groups:
        out.append(f"        MO([{', '.join(env[k] for k in g)}])")
    if p.watch:
        out.append("        if W[0]:")
        out.append("            FIRST(n0)")
    results = []
    for o in p.outs:
        if o[0] == ARG:
            results.append(f"v{o[1]}")
            continue
        m = len(results)
        if o[0] == MADE_OUT and maker:
            results.append(f"r{m}")
            continue
        k = o[1] if o[0] == VALUE else len(p.arrays) + len(p.extra) + o[1]
        out.append(f"        r{m} = NEW(A)")
        out.append(f"        r{m}._data = {env[k]}")
        if o[0] == VALUE and o[2]:
            out.append(f"        {env[k]}.arrays += 1")
        results.append(f"r{m}")
    out.append("        if NEXT is None:")
    out.append("            R.done = True")
    out.append("            R.call = R.diverge")
    out.append("        else:")
    out.append("            R.call = NEXT")
    if p.kind is None:
        out.append(f"        return {results[0]}")
    elif p.kind is tuple:
        out.append(f"        return ({''.join(r + ', ' for r in results)})")
    else:
        out.append(f"        return [{', '.join(results)}]")
    params = "".join(f", k{m}" for m in range(len(consts)))
    return "\n".join([f"def factory(R, NEXT{params}):", *out, "    return s", ""]), consts

