"""CPU kernels: numpy implementations of every primitive kind.

Each kernel is ``kernel(lane, prim, inputs, outputs)`` with numpy arrays, and writes its result into
the output arrays (which the scheduler allocated, or which alias a donated input). float16 and
bfloat16 accumulate in float32 (reductions, matmul, softmax), as the CUDA kernels do. Kernels run
on the lanes' worker threads, whose numpy error state is "ignore" (set once per thread in
``cpu/lanes.py``): overflow and invalid values give inf and NaN without warnings, as on the GPU,
and no kernel pays for an ``np.errstate`` block.
"""

from __future__ import annotations

import numpy as np

from ...dtypes import bfloat16, float16, float32, float64, inside_range
from ...shapes import is_contiguous
from ...ops.table import compute_in as _compute
from . import dense, philox, prepared
from .linalg import linalg
# (UFUNCS and SPECIAL: the elementwise ops' numpy computations, read here by the op table's tests)
from .prepared import COMPLEX_SPECIAL, SPECIAL, UFUNCS, _accumulator, c_contiguous, kernel, reduce  # noqa: F401

# The kinds the CPU executor prepares for their operands (prepared.py, dense.py): ``kernel.prepare``.
elementwise = kernel(prepared.elementwise, prepared.prepare_elementwise)
astype = kernel(prepared.astype, prepared.prepare_astype)
fused = kernel(prepared.fused, prepared.prepare_fused)
rowfused = kernel(prepared.rowfused, prepared.prepare_rowfused)
softmax = kernel(prepared.softmax, prepared.prepare_softmax)
matmul = kernel(dense.matmul, dense.prepare_matmul)
norm = kernel(dense.norm, dense.prepare_norm)
attention = kernel(dense.attention, dense.prepare_attention)


def argreduce(lane, prim, ins, outs):
    f = np.argmax if prim.name == "argmax" else np.argmin
    np.copyto(outs[0], f(ins[0], axis=prim.axis, keepdims=prim.keepdims), casting="unsafe")


def sort(lane, prim, ins, outs):
    """Stable sort or argsort; a descending one keeps equal elements in their order (NaN first)."""
    x, ax = ins[0], prim.axis
    if prim.descending:
        n = x.shape[ax]
        idx = (n - 1) - np.flip(np.argsort(np.flip(x, ax), axis=ax, kind="stable"), ax)
    else:
        idx = np.argsort(x, axis=ax, kind="stable")
    np.copyto(outs[0], idx if prim.arg else np.take_along_axis(x, idx, ax), casting="unsafe")


def searchsorted(lane, prim, ins, outs):
    np.copyto(outs[0], np.searchsorted(ins[0], ins[1], side="right" if prim.right else "left"), casting="unsafe")


def scan(lane, prim, ins, outs):
    out, ax = outs[0], prim.axis
    r = (np.cumsum if prim.op == "sum" else np.cumprod)(ins[0], axis=ax, dtype=_accumulator(out.dtype))
    if prim.include_initial:
        # (a slice, not an index: an index into a 1-d output is a numpy scalar copyto cannot write)
        np.copyto(out[(slice(None),) * ax + (slice(0, 1),)], 0 if prim.op == "sum" else 1, casting="unsafe")
        out = out[(slice(None),) * ax + (slice(1, None),)]
    np.copyto(out, r, casting="unsafe")


def slogdet(lane, prim, ins, outs):
    """Sign, log |det| and det of square matrices (outs[3], the CUDA kernel's workspace, is unused)."""
    sign, logabs = np.linalg.slogdet(ins[0])
    np.copyto(outs[0], sign, casting="unsafe")
    np.copyto(outs[1], logabs, casting="unsafe")
    np.copyto(outs[2], np.linalg.det(ins[0]), casting="unsafe")


def logsumexp(lane, prim, ins, outs):
    x = c_contiguous(_compute(ins[0], outs[0].dtype))
    m = np.max(x, axis=prim.axes, keepdims=True, initial=-np.inf)  # over an empty axis: log(0) = -inf
    m = np.where(np.isfinite(m), m, 0)
    r = np.log(np.sum(np.exp(x - m), axis=prim.axes, keepdims=True)) + m
    if not prim.keepdims:
        r = np.squeeze(r, axis=prim.axes)
    np.copyto(outs[0], r, casting="unsafe")


def matmul_group(lane, prim, ins, outs):
    """A group of independent matmuls (graph/grouping.py): ``outs[i] = ins[i] @ ins[n + i]``. The CPU
    backend does not group by default; this runs when a test turns grouping on."""
    n = len(outs)
    for i in range(n):
        matmul(lane, prim, (ins[i], ins[n + i]), (outs[i],))


def reshape(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0].reshape(prim.shape))


def transpose(lane, prim, ins, outs):
    x, out = ins[0], outs[0]
    if prim.perm == (1, 0) and x.size >= 1 << 14:
        _transpose_rows(x, out)
    else:
        np.copyto(out, x.transpose(prim.perm))


def _transpose_rows(x, out) -> None:
    """``out = x.T`` a block of x's rows at a time (about 8192 elements: a block of either side stays
    in the cache). numpy's copy of the whole transposed view walks one side with a large stride:
    2-4x slower for a (1024, 64) or (512, 512) float32 matrix. A copy: the same values."""
    n = 8192 // x.shape[1]
    b = 16 if n < 16 else min(256, 1 << (n.bit_length() - 1))
    for i in range(0, x.shape[0], b):
        np.copyto(out[:, i:i + b], x[i:i + b].T)


def broadcast_to(lane, prim, ins, outs):
    np.copyto(outs[0], np.broadcast_to(ins[0], prim.shape))


def concatenate(lane, prim, ins, outs):
    np.concatenate(ins, axis=prim.axis, out=outs[0], casting="unsafe")


def _index(prim, ins, first):
    return tuple(ins[first + e[1]] if e.__class__ is tuple else e for e in prim.index)


def getitem(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0][_index(prim, ins, 1)])


def setitem(lane, prim, ins, outs):
    out, base, value = outs[0], ins[0], ins[1]
    if out is not base:
        np.copyto(out, base)
    out[_index(prim, ins, 2)] = value


def _dynamic_window(static, arrays, shape, sizes) -> tuple:
    """Slices of a dynamic slice: each start clamped into ``[0, dim - size]`` (JAX's rule)."""
    it = iter(arrays)
    out = []
    for s, n, z in zip(static, shape, sizes):
        if s is None:
            s = min(max(int(next(it)), 0), n - z)
        out.append(slice(s, s + z))
    return tuple(out)


def dynamic_slice(lane, prim, ins, outs):
    np.copyto(outs[0], ins[0][_dynamic_window(prim.static, ins[1:], ins[0].shape, prim.sizes)])


def dynamic_update_slice(lane, prim, ins, outs):
    out, base, update = outs[0], ins[0], ins[1]
    if out is not base:
        np.copyto(out, base)
    out[_dynamic_window(prim.static, ins[2:], base.shape, update.shape)] = update


def take(lane, prim, ins, outs):
    np.copyto(outs[0], np.take(ins[0], ins[1], axis=prim.axis), casting="unsafe")


def full(lane, prim, ins, outs):
    outs[0].fill(prim.value)


def arange(lane, prim, ins, outs):
    out = outs[0]
    n = out.shape[0]
    if out.dtype.kind in "iub":
        np.copyto(out, prim.start + prim.step * np.arange(n, dtype=np.int64), casting="unsafe")
    else:
        np.copyto(out, prim.start + prim.step * np.arange(n, dtype=np.float64), casting="unsafe")


def linspace(lane, prim, ins, outs):
    out = outs[0]
    y = np.linspace(prim.start, prim.stop, out.shape[0], endpoint=prim.endpoint)
    if out.dtype.kind in "iu":
        np.floor(y, out=y)  # integer results round towards -inf, as in numpy >= 2
    np.copyto(out, y, casting="unsafe")


def eye(lane, prim, ins, outs):
    out = outs[0]
    np.copyto(out, np.eye(out.shape[0], out.shape[1], prim.k), casting="unsafe")


_SIGNIFICAND_BITS = {float64: 53, float32: 24, float16: 11, bfloat16: 8}


def random(lane, prim, ins, outs):
    out = outs[0]
    k0, k1 = (int(v) for v in ins[0])
    if prim.dist == "uniform":
        u = philox.uniform01(out.size, k0, k1, _SIGNIFICAND_BITS[out.dtype])
        r = (prim.a + (prim.b - prim.a) * u).astype(out.dtype)
        r = np.clip(r, *inside_range(out.dtype, prim.a, prim.b))  # rounding to dtype must not reach high
    else:
        wide = float64 if out.dtype == float64 else float32
        r = prim.a + prim.b * philox.normal(out.size, k0, k1, wide)
    np.copyto(out, r.reshape(out.shape), casting="unsafe")


def random_split(lane, prim, ins, outs):
    k0, k1 = (int(v) for v in ins[0])
    np.copyto(outs[0], philox.split(k0, k1, prim.num))


def as_view(data: np.ndarray, shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    """``data``'s memory read as (shape, element strides, element offset): a numpy view, no copy
    (``np.ndarray`` over the buffer: as_strided costs ten times as much per call)."""
    flat = data.reshape(-1)
    if is_contiguous(shape, strides):
        n = 1
        for s in shape:
            n *= s
        return flat[offset:offset + n].reshape(shape)
    it = data.dtype.itemsize
    return np.ndarray(shape, data.dtype, flat, offset * it, tuple(s * it for s in strides))


def strided(lane, prim, ins, outs):
    np.copyto(outs[0].reshape(prim.shape), as_view(ins[0], prim.shape, prim.strides, prim.offset))


def _prepare_strided(prim, ins, outs, scratch):
    """The strided copy of an input already read through its view (``strided.views``): a CPU plan
    makes the view of an input that does not change from call to call once."""
    shape = prim.shape
    return lambda ins, outs: np.copyto(outs[0].reshape(shape), ins[0])


strided.prepare = _prepare_strided
strided.views = lambda prim: ((prim.shape, prim.strides, prim.offset),)


def collective(lane, prim, ins, outs):
    """``lf.distributed``'s collectives: the group's transport runs them (``distributed/transports.py``)."""
    prim.run(lane, ins, outs)


def copy(lane, prim, ins, outs):
    src = ins[0]
    if isinstance(src, np.ndarray):
        np.copyto(outs[0], src)
    else:  # a device buffer handle: its writer has finished (this lane waited for it)
        src.copy_to_host(outs[0])


#: The CPU kernel of every primitive kind of the op table (``ops/table.py: KINDS``), registered here
#: and only here. ``constant`` needs none: its data is the buffer (``Backend.upload``).
KERNELS = {
    "elementwise": elementwise, "astype": astype, "fused": fused, "rowfused": rowfused,
    "reduce": reduce, "argreduce": argreduce, "softmax": softmax, "logsumexp": logsumexp,
    "sort": sort, "searchsorted": searchsorted, "scan": scan, "slogdet": slogdet,
    "norm": norm, "attention": attention, "matmul": matmul, "matmul_group": matmul_group,
    "reshape": reshape, "transpose": transpose, "broadcast_to": broadcast_to, "strided": strided,
    "concatenate": concatenate,
    "getitem": getitem, "setitem": setitem, "take": take,
    "dynamic_slice": dynamic_slice, "dynamic_update_slice": dynamic_update_slice,
    "full": full, "arange": arange, "linspace": linspace, "eye": eye,
    "random": random, "random_split": random_split, "copy": copy, "linalg": linalg, "collective": collective,
}

#: Primitive kinds of the op table this backend does not run, with the reason (MLX's ``NO_CPU``).
UNSUPPORTED = {"constant": "no kernel: host data is the buffer itself",
               "custom": "user CUDA kernels (lf.cuda.kernel) run on GPU streams only"}
