"""Indexing: getitem, setitem and take.

Basic indices (ints, slices, None) are a strided view, copied by the strided-copy kernel.
Integer index arrays follow numpy's advanced indexing: the arrays (and ints, when arrays are
present) broadcast to one shape B; B's dims replace the indexed dims in place when the advanced
indices are adjacent, else they come first. One gather (or scatter) kernel computes, per element,
the source offset from the slice dims and from each index array (negative indices wrap).
Index arrays the host still holds (uploaded constants) are bounds-checked before the launch,
raising IndexError as numpy does; indices computed on the GPU are checked by the kernel, which skips
an out-of-range element and records it in a check slot, raised at the eval (``..checks``).
"""

from __future__ import annotations

import numpy as np

from ....errors import ExecutionError, LaneflowError
from ..checks import SLOT_WORDS, deferred, slots_of
from . import cdefs as C
from .copy import strided_copy
from .launch import grid_1d
from .plan import MAXD, basic_view, broadcast_strides, contiguous_strides


def _is_array(e) -> bool:
    return e.__class__ is tuple


class _Advanced:
    """Output dims of x[entries] with index arrays, and how each reads the input."""

    def __init__(self, shape: tuple, entries: tuple, arrays: list):
        strides = contiguous_strides(shape)
        bshape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
        adv_pos = [k for k, e in enumerate(entries) if _is_array(e) or (e is not None and not isinstance(e, slice))]
        adjacent = adv_pos == list(range(adv_pos[0], adv_pos[-1] + 1))
        self.base = 0
        self.odims: list = []  # (size, input stride coefficient, B-dim index or -1)
        self.arrays: list = []  # (array, input dim size, input stride)
        bdims = [(s, 0, j) for j, s in enumerate(bshape)]
        placed = False
        if not adjacent:
            self.odims.extend(bdims)
            placed = True
        d = 0
        for k, e in enumerate(entries):
            if e is None:
                self.odims.append((1, 0, -1))
            elif isinstance(e, slice):
                start, stop, step = e.indices(shape[d])
                n = len(range(start, stop, step))
                self.odims.append((n, strides[d] * step, -1))
                if n:
                    self.base += start * strides[d]
                d += 1
            else:
                if not placed:
                    self.odims.extend(bdims)
                    placed = True
                if _is_array(e):
                    self.arrays.append((arrays[e[1]], shape[d], strides[d]))
                else:
                    i = int(e)
                    self.base += (i + shape[d] if i < 0 else i) * strides[d]
                d += 1
        for k in range(d, len(shape)):
            self.odims.append((shape[k], strides[k], -1))
        self.bshape = tuple(bshape)
        self.shape = tuple(s for s, _, _ in self.odims)
        if len(self.odims) > MAXD or len(self.bshape) > MAXD:
            raise LaneflowError(f"indexing: more than {MAXD} dimensions")


def _check_bounds(op: str, arrays: list) -> None:
    for a, size, _ in arrays:
        h = a.host
        if h is not None and h.size:
            lo, hi = int(h.min()), int(h.max())
            if lo < -size or hi >= size:
                bad = hi if hi >= size else lo
                raise IndexError(f"index {bad} is out of bounds for axis with size {size}")


def _build_gather(scatter: bool, dt, idx_dts: tuple, bmap: tuple, nd: int, nb: int):
    name = "lf_scatter" if scatter else "lf_gather"
    st = C.storage(dt)
    sig = [f"{st}* __restrict__ out", f"const {st}* __restrict__ in", "Dims oshape", "Dims coef", "long long base"]
    params = "ppDDq"
    for k, idt in enumerate(idx_dts):
        sig += [f"const {C.storage(idt)}* __restrict__ ix{k}", f"Dims ast{k}", f"long long lim{k}", f"long long ist{k}"]
        params += "pDqq"
    if scatter:
        sig.append("Dims vst")
        params += "D"
    sig += ["long long n", "unsigned long long* err"]
    params += "qp"
    lines = [f'extern "C" __global__ void __launch_bounds__(256) {name}({", ".join(sig)}) {{\n',
             "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
             " i += (long long)blockDim.x * gridDim.x) {\n",
             "    long long off = base, rem_ = i, voff = 0; int bad_ = 0;\n"]
    lines.append("    long long " + ", ".join(f"b{j} = 0" for j in range(max(nb, 1))) + ";\n")
    for d in range(nd - 1, -1, -1):
        lines.append(f"    {{ long long c_ = rem_ % oshape.v[{d}]; rem_ /= oshape.v[{d}]; off += c_ * coef.v[{d}];")
        if bmap[d] >= 0:
            lines.append(f" b{bmap[d]} = c_;")
        if scatter:
            lines.append(f" voff += c_ * vst.v[{d}];")
        lines.append(" }\n")
    for k in range(len(idx_dts)):
        aoff = " + ".join(f"b{j} * ast{k}.v[{j}]" for j in range(nb)) or "0"
        # Out of range: record the first bad index in the check slot (read at the host wait) and skip
        # the element; the command's outputs raise IndexError at the eval that needs them.
        # Plain stores to pinned host memory (no system-scope atomics needed): a flag and a bad value
        # per index array; racing threads all write bad values of the same array.
        w = 2 * min(k, CHECK_ARRAYS - 1)
        lines.append(f"    {{ long long r_ = (long long)ix{k}[{aoff}], v_ = r_; if (v_ < 0) v_ += lim{k};"
                     f" if (v_ < 0 || v_ >= lim{k}) {{ err[{w}] = 1ULL; err[{w + 1}] = (unsigned long long)r_;"
                     f" bad_ = 1; }} else off += v_ * ist{k}; }}\n")
    lines.append("    if (bad_) continue;\n")
    if scatter:
        lines.append("    out[off] = in[voff];\n")
    else:
        lines.append("    out[i] = in[off];\n")
    lines.append("  }\n}\n")
    return "".join(lines), name, params


#: Index arrays with their own (flag, value) words in a check slot; later arrays share the last pair.
CHECK_ARRAYS = SLOT_WORDS // 2


def _index_error(op: str, adv: _Advanced):
    lims = [lim for _, lim, _ in adv.arrays]

    def explain(words):
        for k in range(CHECK_ARRAYS):
            if words[2 * k]:
                break
        else:
            return None
        bad = int(np.int64(np.uint64(words[2 * k + 1])))  # the index as the kernel read it (signed)
        lim = lims[k] if len(lims) <= CHECK_ARRAYS or k < CHECK_ARRAYS - 1 else None
        size = f"size {lim}" if lim is not None else "its size"
        return ExecutionError(op, IndexError(f"index {bad} is out of bounds for axis with {size}"))
    return explain


def _launch_adv(lane, op: str, scatter: bool, out_ptr: int, in_ptr: int, dt, adv: _Advanced,
                vst: tuple | None) -> None:
    n = 1
    for s in adv.shape:
        n *= s
    if n == 0:
        return
    nd = len(adv.odims)
    nb = len(adv.bshape)
    bmap = tuple(j for _, _, j in adv.odims)
    idx_dts = tuple(a.dtype for a, _, _ in adv.arrays)
    spec = ("gather", scatter, dt, idx_dts, bmap, nd, nb)
    kern = lane.ctx.modules.get(spec, lambda: _build_gather(scatter, dt, idx_dts, bmap, nd, nb))
    args = [out_ptr, in_ptr, adv.shape, tuple(c for _, c, _ in adv.odims), adv.base]
    for a, lim, ist in adv.arrays:
        args += [a.ptr, broadcast_strides(a.shape, adv.bshape), lim, ist]
    if scatter:
        args.append(vst)
    if any(a.host is None for a, _, _ in adv.arrays):
        slot = deferred(lane, _index_error(op, adv), op)
    else:  # every index array was checked on the host (_check_bounds): the slot is never read
        slot = slots_of(lane.ctx).scratch_ptr()
    args += [n, slot]
    kern.launch(lane.handle, grid_1d(lane.ctx, n), (256, 1, 1), tuple(args))


def getitem(lane, prim, ins, outs) -> None:
    src, out = ins[0], outs[0]
    entries = prim.index
    if not any(_is_array(e) for e in entries):
        shape, strides, off = basic_view(src.shape, entries)
        strided_copy(lane, out.ptr, out.dtype, src.ptr + off * src.dtype.itemsize, src.dtype, shape, strides,
                     contiguous_strides(shape))
        return
    adv = _Advanced(src.shape, entries, ins[1:])
    _check_bounds("getitem", adv.arrays)
    _launch_adv(lane, "getitem", False, out.ptr, src.ptr, src.dtype, adv, None)


def setitem(lane, prim, ins, outs) -> None:
    base, value, out = ins[0], ins[1], outs[0]
    if out.ptr != base.ptr and out.nbytes:
        strided_copy(lane, out.ptr, out.dtype, base.ptr, base.dtype, (out.size,), (1,), (1,))
    entries = prim.index
    if not any(_is_array(e) for e in entries):
        shape, strides, off = basic_view(out.shape, entries)
        strided_copy(lane, out.ptr + off * out.dtype.itemsize, out.dtype, value.ptr, value.dtype, shape,
                     broadcast_strides(value.shape, shape), strides)
        return
    adv = _Advanced(out.shape, entries, ins[2:])
    _check_bounds("setitem", adv.arrays)
    _launch_adv(lane, "setitem", True, out.ptr, value.ptr, out.dtype, adv, broadcast_strides(value.shape, adv.shape))


def take(lane, prim, ins, outs) -> None:
    src, idx, out = ins[0], ins[1], outs[0]
    if prim.axis is None:
        shape, entries = (src.size,), (("array", 0),)
    else:
        shape, entries = src.shape, (slice(None),) * prim.axis + (("array", 0),)
    adv = _Advanced(shape, entries, [idx])
    _check_bounds("take", adv.arrays)
    _launch_adv(lane, "take", False, out.ptr, src.ptr, src.dtype, adv, None)
