"""Index plans shared by the kernels: broadcasting strides, collapsing of dimensions, views of
basic indexing, and the kept/reduced split of reductions. Pure Python, no CUDA.
"""

from __future__ import annotations

from ....shapes import basic_index_view, contiguous_strides

MAXD = 8


def broadcast_strides(in_shape: tuple, out_shape: tuple) -> tuple:
    """Element strides of a contiguous array of in_shape read as out_shape (0 on broadcast dims)."""
    nd = len(out_shape)
    cs = contiguous_strides(in_shape)
    pad = nd - len(in_shape)
    out = []
    for d in range(nd):
        k = d - pad
        if k < 0 or in_shape[k] == 1:
            out.append(0)
        else:
            out.append(cs[k])
    return tuple(out)


def collapse(shape: tuple, stride_sets: list) -> tuple[tuple, list]:
    """Drop size-1 dims and merge neighbours that are contiguous in every stride set."""
    dims = [(s, [st[d] for st in stride_sets]) for d, s in enumerate(shape) if s != 1]
    merged: list = []
    for s, sts in dims:
        if merged:
            ps, psts = merged[-1]
            if all(p == q * s for p, q in zip(psts, sts)):
                merged[-1] = (ps * s, sts)
                continue
        merged.append((s, sts))
    new_shape = tuple(s for s, _ in merged)
    new_sets = [tuple(sts[k] for _, sts in merged) for k in range(len(stride_sets))]
    return new_shape, new_sets


def classify(strides: tuple, shape: tuple) -> str:
    """'c' contiguous over the (collapsed) output, 's' one element, 'g' general."""
    if all(s == 0 for s in strides):
        return "s"
    if strides == contiguous_strides(shape):
        return "c"
    return "g"


def operand_layout(arrays: list, shape: tuple) -> tuple | None:
    """(collapsed shape, collapsed strides per array, kind per array (:func:`classify`)) of arrays
    broadcast against an output of ``shape``; None when more than MAXD dimensions stay unmerged."""
    sets = [broadcast_strides(a.shape, shape) for a in arrays]
    cshape, csets = collapse(shape, sets)
    if len(cshape) > MAXD:
        return None
    return cshape, csets, tuple(classify(cs, cshape) for cs in csets)


def basic_view(shape: tuple, entries: tuple) -> tuple[tuple, tuple, int]:
    """(shape, element strides, element offset) of ``x[entries]`` for ints, slices and None."""
    return basic_index_view(shape, contiguous_strides(shape), 0, entries)


#: entries a per-key plan cache of the kernel modules holds before it starts over (a program making
#: ever-new shapes must not grow it without bound)
MAX_PLANS = 4096


def keep(cache: dict, key, plan):
    """``cache[key] = plan``, the cache emptied first when it is full; returns ``plan``. The kernel
    modules' plans per launch key (elementwise, fused, row-fused, reductions) are kept so."""
    if len(cache) > MAX_PLANS:
        cache.clear()
    cache[key] = plan
    return plan


class ReducePlan:
    """Input dims split into kept and reduced groups (size-1 dims dropped, neighbours merged).

    ``inner``: the innermost group is reduced (one block per output reads contiguous runs);
    otherwise one thread per output walks the reduced elements and neighbouring threads read
    neighbouring memory.
    """

    def __init__(self, shape: tuple, axes: tuple):
        groups: list = []
        for d, s in enumerate(shape):
            if s == 1:
                continue
            r = d in axes
            if groups and groups[-1][1] == r:
                groups[-1][0] *= s
            else:
                groups.append([s, r])
        sizes = [g[0] for g in groups]
        strides = contiguous_strides(tuple(sizes))
        self.kshape = tuple(s for s, g in zip(sizes, groups) if not g[1])
        self.kstride = tuple(st for st, g in zip(strides, groups) if not g[1])
        self.rshape = tuple(s for s, g in zip(sizes, groups) if g[1])
        self.rstride = tuple(st for st, g in zip(strides, groups) if g[1])
        n = 1
        for s in self.kshape:
            n *= s
        self.nout = n
        r = 1
        for s in self.rshape:
            r *= s
        self.R = r
        self.inner = bool(groups) and groups[-1][1] or not self.kshape
        if len(self.kshape) > MAXD or len(self.rshape) > MAXD:
            raise ValueError("reduction over an array with more than 8 alternating kept/reduced groups")


def offset_code(var: str, index: str, shape_param: str, stride_param: str, nd: int, idx_t: str) -> str:
    """C statements adding to ``var`` the offset of linear ``index`` over nd dims (row-major)."""
    if nd == 0:
        return ""
    if nd == 1:
        return f"  {var} += ({idx_t})({index}) * ({idx_t}){stride_param}.v[0];\n"
    lines = [f"  {{ {idx_t} rem_ = ({idx_t})({index});\n"]
    for d in range(nd - 1, -1, -1):
        if d == 0:
            lines.append(f"    {var} += rem_ * ({idx_t}){stride_param}.v[0];\n")
        else:
            lines.append(f"    {{ {idx_t} c_ = rem_ % ({idx_t}){shape_param}.v[{d}]; rem_ /= ({idx_t}){shape_param}.v[{d}];"
                         f" {var} += c_ * ({idx_t}){stride_param}.v[{d}]; }}\n")
    lines.append("  }\n")
    return "".join(lines)
