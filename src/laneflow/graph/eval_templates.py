"""Templates of the plan cache (``graph/eval_cache.py``): a cached graph recognised again without
searching it or making its key.

A forward evaluated again and again builds, each time, a graph of the same structure from new nodes.
The cache's key needs a search of that graph and a key made and hashed from it (``eval_cache._walk``);
a template instead holds the key's per-node entries in the walk's order, and a new graph is checked
against them position by position (``match``): its nodes are placed where the template's references
say their users read them, then compared all at once with the nodes of the graph the template was
made from (the same shared primitives, users, shapes: one C loop), and against the key's entries only
where they differ (a primitive made anew, a node an array holds). Templates are filed under their roots'
signature (each root's primitive key and shape), up to :data:`PER_SIGNATURE` per signature, the plans
those roots hit most recently first (a program alternating between graphs that end alike: one model on
two streams, or two variants of a model); a failed check falls back to the walk.
"""

from __future__ import annotations

from itertools import chain, compress
from operator import attrgetter, ne

#: What a hit compares of every node, and of every leaf, in one pass over them (C loops, not Python)
_NODE = attrgetter("prim", "stream", "users", "arrays", "shape", "dtype", "siblings")
_LEAF = attrgetter("shape", "dtype", "device")


class Template:
    """A cached graph as a hit finds it again without searching (``match``): per position of the
    walk's order, the node's key entry, whose references say where its inputs are; which positions
    the roots hold; the leaves' metadata; the scalar values read or checked. Kept per root signature
    (``TEMPLATES``): a forward evaluated again and again reaches its plan in one check per node and
    input, with no dictionary of nodes, no new key and no hash of it."""

    __slots__ = ("entry", "sig", "ents", "root_pos", "leaf_meta", "sc_pos", "fixed", "refs", "nodes",
                 "place", "leaf_place", "flat", "counts")

    def __init__(self, entry, sig: tuple, root_pos: list, sc_pos: list, order: list):
        ents, fixed, meta = entry.key
        self.entry, self.sig, self.ents, self.fixed, self.leaf_meta = entry, sig, ents, fixed, list(meta)
        self.root_pos, self.sc_pos = root_pos, sc_pos
        self.refs = refs = [e[4] for e in ents]
        self.place, self.leaf_place, self.flat, self.counts = _placing(refs, root_pos, len(meta))
        # the nodes' attributes as this graph had them: a later graph built by the same code has the
        # same primitives (``ops.core.shared``), users and array counts, and is checked by comparing
        # these alone; any difference falls back to the check of each key entry (``_check``)
        self.nodes = list(map(_NODE, order))


#: root signature (each root's primitive key and shape) -> the templates of the plans it hit, latest first
TEMPLATES: dict = {}
#: templates kept per signature: ``bench gpt2`` alternates four eager rows (two models, each on a 1-lane
#: and a multi-lane stream) whose logits end alike; with one template per signature every hit of the
#: CPU rows fell back to the walk (about 100 us of 780 on the CPU VM, lf.nn B=1)
PER_SIGNATURE = 8


def signature(roots) -> tuple | None:
    sig = []
    for r in roots:
        p = r.prim
        if p is None:
            return None
        ck = cache_info(p)
        if ck is None:
            return None
        sig.append((ck[0], r.shape))
    return tuple(sig)


def cache_info(p) -> tuple | None:
    """``p``'s ``(cache key, scalars)``, or None for a primitive the cache cannot key (or host data)."""
    try:
        return p._ck
    except AttributeError:
        if p.kind == "constant" or not p.cacheable:
            return None
        return p.cache_info()


def remember(entry, roots, order: list, dep: list, bound: int) -> None:
    """File ``entry``'s template under its roots (made from this graph, before it is let go, the first
    time): the next evaluation with these roots tries it first. Roots must be pending and distinct."""
    t = entry.template
    if t is None:
        if any(r.prim is None for r in roots) or len(set(map(id, roots))) != len(roots):
            return
        sig = signature(roots)
        if sig is None:
            return
        at = {id(d): k for k, d in enumerate(order)}
        sc_pos = [k for k, d in enumerate(order) if dep[k] and d.prim._ck[1]]
        t = entry.template = Template(entry, sig, [at[id(r)] for r in roots], sc_pos, order)
    kept = TEMPLATES.get(t.sig)
    if kept is None:
        if len(TEMPLATES) >= bound:
            TEMPLATES.clear()
        TEMPLATES[t.sig] = [t]
    else:
        _first(kept, t)


def _first(kept: list, t: Template) -> None:
    """``t`` to the front of its signature's list, which keeps at most PER_SIGNATURE."""
    if kept[0] is t:
        return
    for k, x in enumerate(kept):
        if x is t:
            del kept[k]
            break
    kept.insert(0, t)
    del kept[PER_SIGNATURE:]


def forget(entry) -> None:
    """An evicted entry's template goes too (it would keep the plan and its memory alive)."""
    entry.alive = False
    t = entry.template
    kept = TEMPLATES.get(t.sig) if t is not None else None
    if kept is not None:
        kept[:] = [x for x in kept if x is not t]
        if not kept:
            del TEMPLATES[t.sig]


def find(roots) -> "tuple[Template, tuple] | None":
    """The template whose graph the graph of ``roots`` repeats, and ``match``'s result for it: the
    signature's templates tried latest first (one of another stream is passed over at once)."""
    if len(roots) == 1:  # (one new node over evaluated inputs: the usual uncached eager eval)
        for i in roots[0].inputs:
            if i.prim is not None:
                break
        else:
            return None
    if not TEMPLATES:
        return None
    sig = signature(roots)
    try:
        kept = TEMPLATES.get(sig) if sig is not None else None
    except TypeError:  # a parameter that does not hash (a primitive of a user's)
        return None
    if kept is None:
        return None
    stream = roots[0].stream
    for t in kept:
        if t.entry.alive and t.nodes[t.root_pos[0]][1] is stream and _near(t, roots):
            m = match(t, roots)
            if m is not None:
                _first(kept, t)
                return t, m
    return None


def _near(t: Template, roots) -> bool:
    """A cheap first look: the roots' pending inputs have the classes of primitive and the shapes that
    the template's graph had there (what ``match`` would find out only after placing every node)."""
    nodes, refs_of = t.nodes, t.refs
    for r, k in zip(roots, t.root_pos):
        for x, j in zip(r.inputs, refs_of[k]):
            if j >= 0:
                p, was = x.prim, nodes[j]
                if p is None or p.__class__ is not was[0].__class__ or x.shape != was[4]:
                    return False
    return True


def _placing(refs: list, root_pos: list, n_leaves: int) -> tuple:
    """How ``match`` finds a graph's nodes from its roots: ``place``, (position, user position, input
    slot) of every node but the roots, in an order where each user is found before its inputs (the
    walk's order puts inputs first, so users from the last position down; a node is read at its first
    such reference); ``leaf_place``, (user position, slot) per leaf; ``flat``, every reference of every
    node in order as an index into nodes + leaves; ``counts``, each node's number of inputs."""
    n = len(refs)
    found = set(root_pos)
    place, leaf_at = [], [None] * n_leaves
    for k in range(n - 1, -1, -1):
        for s, j in enumerate(refs[k]):
            if j >= 0:
                if j not in found:
                    found.add(j)
                    place.append((j, k, s))
            elif leaf_at[-1 - j] is None:
                leaf_at[-1 - j] = (k, s)
    flat = [j if j >= 0 else n - 1 - j for r in refs for j in r]
    return place, leaf_at, flat, [len(r) for r in refs]


_INPUTS = attrgetter("inputs")
_PRIM = attrgetter("prim")


def match(t: Template, roots) -> tuple | None:
    """``(order, leaves, scalars)`` when the graph of ``roots`` has ``t``'s structure (what ``_walk``
    would key alike), else None. The roots are put at their positions, and every other node and leaf
    is read from the input of a user found before it (``t.place``, ``t.leaf_place``); then every
    node's inputs must be exactly the nodes and leaves the template's references name (compared as
    one list, in C), every node must agree with its entry, every leaf be evaluated and agree with its
    metadata, and all be distinct, as they are in the walk."""
    nodes: list = [None] * len(t.refs)
    for r, k in zip(roots, t.root_pos):
        nodes[k] = r
    try:
        for j, k, s in t.place:
            nodes[j] = nodes[k].inputs[s]
        leaves = [nodes[k].inputs[s] for k, s in t.leaf_place]
    except IndexError:  # a node with fewer inputs than the template's
        return None
    ins = list(map(_INPUTS, nodes))
    if list(map(len, ins)) != t.counts:
        return None
    pool = nodes + leaves
    if list(chain.from_iterable(ins)) != list(map(pool.__getitem__, t.flat)):
        return None
    if list(map(_PRIM, leaves)).count(None) != len(leaves):
        return None  # a pending value where the template has a leaf
    now = list(map(_NODE, nodes))
    if now != t.nodes and not _check(t, nodes, now):
        return None
    n = len(nodes)
    if len(set(map(id, nodes))) != n or len(set(map(id, leaves))) != len(leaves):
        return None
    if list(map(_LEAF, leaves)) != t.leaf_meta:
        return None
    for k, vals in t.fixed:
        if tuple([x.value for x in nodes[k].prim._ck[1]]) != vals:
            return None
    return nodes, leaves, scalars_of(t, nodes)


def scalars_of(t: Template, nodes: list) -> list:
    """The scalar values the plan reads from the graph ``nodes`` (placed in ``t``'s order)."""
    scalars: list = []
    for k in t.sc_pos:
        scalars.extend([x.value for x in nodes[k].prim._ck[1]])
    return scalars


def _check(t: Template, nodes: list, now: list) -> bool:
    """Whether every node that differs from the template's graph (``now``: as ``t.nodes``) still
    agrees with its key entry: the primitive's key, shape, dtype, stream, users and whether an array
    holds it (the nodes' inputs were placed by ``match``)."""
    for k in compress(range(len(now)), map(ne, now, t.nodes)):
        d = nodes[k]
        pk, shape, dtype, stream, refs, users, seen = t.ents[k]
        p = d.prim
        if p is None or d.siblings is not None:
            return False
        try:
            ck = p._ck[0]
        except AttributeError:
            ck = cache_info(p)
            if ck is None:
                return False
            ck = ck[0]
        if (d.stream is not stream or d.users != users or (d.arrays > 0) is not seen or d.shape != shape
                or (ck is not pk and ck != pk) or (d.dtype is not dtype and d.dtype != dtype)):
            return False
    return True
