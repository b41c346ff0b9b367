"""Row programs (graph/rowfusion.py): last-axis reductions with their elementwise neighbours in one kernel.

One block per row (a grid-stride loop over rows). The steps are split by *level*: inputs are at level
0; an elementwise step is at the level of its latest operand; a reduction of a value at level L is
accumulated while the block walks the row at *phase* L and is known from level L + 1 on; a softmax of
a value at level L takes two phases (the row maximum at L, the sum of exponentials at L + 1) and is
known from level L + 2. The kernel walks the row once per phase, computing in each element the
full-shape steps that phase's accumulators need (recomputed from the inputs rather than kept: a row
is read from L1/L2 again, which costs less than registers or shared memory sized by the row), then
reduces the accumulators across the block (warp shuffles, then shared memory) and computes the
per-row steps that just became known. A last walk writes the root (or thread 0 writes a per-row root).

Elementwise steps are generated exactly as the fused elementwise kernel generates them (each step
rounded to its dtype, ``--fmad=false``), reductions with the accumulator, identity, combine and
final step of the reduce kernels (``reduce.py``), softmax with the softmax kernel's expression; only
the order in which a reduction adds up its elements differs from the unfused kernels.
"""

from __future__ import annotations

import numpy as np

from .... import dtypes as dt
from ....shapes import contiguous_strides
from . import cdefs as C
from .elementwise import _COMPARE, _converter, _py_type, _result_dtype, _widen_for_big_scalars, expr, loop_dtypes
from .fused import _scalar_key
from .plan import broadcast_strides, collapse, keep, offset_code
from .reduce import _acc_dtype, _combine, _epilogue, _ident, _transform, acc_c

_plans: dict = {}


def _step_dtypes(steps: tuple, in_dts: tuple) -> list:
    """Per step, the dtype of each operand (a Python type for a scalar)."""
    return [tuple((in_dts[o] if o >= 0 else steps[-o - 1][3]) if o.__class__ is int else _py_type(o.value) for o in ops)
            for _, _, ops, _, _ in steps]


def _levels(steps: tuple) -> tuple[list, list]:
    """(level per step, accumulators): an accumulator is (step, part, phase) with part "r" (a
    reduction), "m" / "s" (a softmax's maximum / sum of exponentials)."""
    level: list = []
    accs: list = []
    for j, (kind, _, ops, _, _) in enumerate(steps):
        lv = max((level[-o - 1] for o in ops if o.__class__ is int and o < 0), default=0)
        if kind == "reduce":
            accs.append((j, "r", lv))
            lv += 1
        elif kind == "softmax":
            accs.append((j, "m", lv))
            accs.append((j, "s", lv + 1))
            lv += 2
        level.append(lv)
    return level, accs


class _Gen:
    """C source of one row program."""

    def __init__(self, steps: tuple, in_dts: tuple, in_kinds: tuple, out_dt, nd: int):
        self.steps, self.in_dts, self.in_kinds, self.nd = steps, in_dts, in_kinds, nd
        self.op_dts = _step_dtypes(steps, in_dts)
        self.loops = []
        for (kind, op, ops, dtype, _), pattern in zip(steps, self.op_dts):
            if kind in ("elementwise", "astype"):
                loop, out_loop = loop_dtypes(op, pattern, dtype)
                loop = list(loop)
                if op in _COMPARE:
                    loop = _widen_for_big_scalars(ops, loop)
                self.loops.append((tuple(loop), out_loop))
            else:
                self.loops.append(None)
        self.level, self.accs = _levels(steps)
        self.out_dt = out_dt
        #: loop dtype of each scalar, in parameter order
        self.scalar_lts = [self.loops[j][0][q] for j, (_, _, ops, _, _) in enumerate(steps)
                           for q, o in enumerate(ops) if o.__class__ is not int]

    # -- values --------------------------------------------------------------------------------
    def input_ref(self, k: int) -> str:
        kd = self.in_kinds[k]
        idx = {"c": "row * N + c", "w": "c", "r": "row", "s": "0", "G": f"g{k} + c * ls{k}", "R": f"g{k}"}[kd]
        return C.load(f"a{k}[{idx}]", self.in_dts[k])

    def operand(self, j: int, q: int, lt) -> str:
        o = self.steps[j][2][q]
        if o >= 0:
            return C.conv(self.input_ref(o), self.in_dts[o], lt)
        src = self.steps[-o - 1][3]
        return C.conv(C.load(f"w{-o - 1}", src), src, lt)

    def softmax_x(self, j: int) -> tuple[str, str]:
        """(work C type, the operand as a work value) of softmax step j."""
        dtype = self.steps[j][3]
        W = "double" if dtype == dt.float64 else "float"
        return W, self.operand(j, 0, dt.float64 if W == "double" else dt.float32)

    def value(self, j: int, scal: dict) -> str:
        """C statement defining ``w{j}`` (storage type) for an elementwise or softmax step."""
        kind, op, ops, dtype, _ = self.steps[j]
        st = C.storage(dtype)
        if kind == "softmax":
            W, x = self.softmax_x(j)
            wdt = dt.float64 if W == "double" else dt.float32
            return f"{st} w{j} = {C.store(C.conv(f'(lf_exp({x} - m{j}) / s{j})', wdt, dtype), dtype)};"
        loop, out_loop = self.loops[j]
        vals = []
        for q, o in enumerate(ops):
            if o.__class__ is not int:
                vals.append(scal[(j, q)])
            else:
                vals.append(self.operand(j, q, loop[q]))
        e = expr(op, vals, list(loop), out_loop)
        return f"{st} w{j} = {C.store(C.conv(e, _result_dtype(op, list(loop), out_loop), dtype), dtype)};"

    def cone(self, targets: list, known: set) -> list:
        """Full-shape steps (in order) needed inside a row walk to compute ``targets``' operands."""
        need: set = set()
        stack = list(targets)
        while stack:
            j = stack.pop()
            for o in self.steps[j][2]:
                if o.__class__ is int and o < 0:
                    i = -o - 1
                    if i not in need and i not in known:
                        need.add(i)
                        stack.append(i)
        return sorted(need)

    # -- the kernel ----------------------------------------------------------------------------
    def source(self) -> tuple[str, str, str]:
        steps = self.steps
        sig = [f"{C.storage(self.out_dt)}* __restrict__ out"]
        params = ["p"]
        for k, d in enumerate(self.in_dts):
            sig.append(f"const {C.storage(d)}* __restrict__ a{k}")
            params.append("p")
        scal: dict = {}
        for j, (kind, _, ops, _, _) in enumerate(steps):
            for q, o in enumerate(ops):
                if o.__class__ is not int:
                    lt = self.loops[j][0][q]
                    name = f"s{len(scal)}"
                    scal[(j, q)] = name
                    sig.append(f"{C.compute(lt)} {name}")
                    params.append(C.PARAM[C.dname(lt)])
        sig += ["long long rows", "long long N"]
        params += ["q", "q"]
        general = [k for k, kd in enumerate(self.in_kinds) if kd in "GR"]
        if general:
            sig.append("Dims ps")
            params.append("D")
            for k in general:
                sig += [f"Dims pst{k}", f"long long ls{k}"]
                params += ["D", "q"]
        body: list = []
        add = body.append
        add("  const long long count = N;\n  const double dcount = (double)N;\n")
        # one shared array per accumulator type for the block reductions
        for a, (j, part, _) in enumerate(self.accs):
            add(f"  __shared__ {self._acc_type(j, part)} sh{a}[32];\n")
        add("  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {\n")
        for k in general:
            add(f"    long long g{k} = 0;\n{offset_code(f'g{k}', 'row', 'ps', f'pst{k}', self.nd, 'long long')}")
        known: set = set()  # steps whose values the row scope holds
        n_phases = max((ph for _, _, ph in self.accs), default=-1) + 1
        self._row_steps(0, known, scal, add)
        for ph in range(n_phases):
            mine = [(a, j, part) for a, (j, part, p) in enumerate(self.accs) if p == ph]
            for a, j, part in mine:
                A, init = self._acc_init(j, part)
                add(f"    {A} acc{a} = {init};\n")
            targets = [j for _, j, _ in mine]
            add("    for (long long c = threadIdx.x; c < N; c += blockDim.x) {\n")
            for i in self.cone(targets, known):
                add(f"      {self.value(i, scal)}\n")
            for a, j, part in mine:
                add(f"      {self._accumulate(a, j, part)}\n")
            add("    }\n")
            for a, j, part in mine:
                add(self._block_reduce(a, j, part))
            for a, j, part in mine:
                add(f"    {self._finish(a, j, part, known)}\n")
            self._row_steps(ph + 1, known, scal, add)
        root = len(steps) - 1
        if root in known:
            add(f"    if (threadIdx.x == 0) out[row] = w{root};\n")
        else:
            add("    for (long long c = threadIdx.x; c < N; c += blockDim.x) {\n")
            for i in self.cone([root], known) + [root]:
                add(f"      {self.value(i, scal)}\n")
            add(f"      out[row * N + c] = w{root};\n    }}\n")
        add("    __syncthreads();\n  }\n")
        name = "lf_rowfused"
        src = f'extern "C" __global__ void __launch_bounds__(1024) {name}({", ".join(sig)}) {{\n{"".join(body)}}}\n'
        return src, name, "".join(params)

    def _row_steps(self, lv: int, known: set, scal: dict, add) -> None:
        """Per-row elementwise steps that become known at level ``lv``, computed by every thread."""
        for j, (kind, _, _, _, full) in enumerate(self.steps):
            if not full and kind in ("elementwise", "astype") and self.level[j] == lv and j not in known:
                add(f"    {self.value(j, scal)}\n")
                known.add(j)

    def _acc_type(self, j: int, part: str) -> str:
        if part == "r":
            op = self.steps[j][1].name
            return acc_c(_acc_dtype(op, self.op_dts[j][0], self.steps[j][3]))
        return self.softmax_x(j)[0]

    def _acc_init(self, j: int, part: str) -> tuple[str, str]:
        A = self._acc_type(j, part)
        if part == "r":
            op = self.steps[j][1].name
            return A, _ident(op, _acc_dtype(op, self.op_dts[j][0], self.steps[j][3]))
        return A, "(-INFINITY)" if part == "m" else "0"

    def _combine(self, j: int, part: str, a: str, b: str) -> str:
        if part == "r":
            op = self.steps[j][1].name
            return _combine(op, _acc_dtype(op, self.op_dts[j][0], self.steps[j][3]), a, b)
        W = self._acc_type(j, part)
        return f"lf_max_nan<{W}>({a}, {b})" if part == "m" else f"({a} + {b})"

    def _accumulate(self, a: int, j: int, part: str) -> str:
        if part == "r":
            op = self.steps[j][1].name
            in_dt = self.op_dts[j][0]
            acc_dt = _acc_dtype(op, in_dt, self.steps[j][3])
            o = self.steps[j][2][0]
            raw = self.input_ref(o) if o >= 0 else C.load(f"w{-o - 1}", in_dt)
            v = _transform(op, in_dt, acc_dt, raw)
        else:
            _, x = self.softmax_x(j)
            v = x if part == "m" else f"lf_exp({x} - m{j})"
        return f"acc{a} = {self._combine(j, part, f'acc{a}', f'({v})')};"

    def _block_reduce(self, a: int, j: int, part: str) -> str:
        A = self._acc_type(j, part)
        v = f"acc{a}"
        comb = self._combine(j, part, v, "t_")
        ident = self._acc_init(j, part)[1]
        return (f"    for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {A} t_ = __shfl_down_sync(0xffffffffu, {v}, s_); {v} = {comb}; }}\n"
                f"    if ((threadIdx.x & 31) == 0) sh{a}[threadIdx.x >> 5] = {v};\n    __syncthreads();\n"
                f"    if (threadIdx.x < 32) {{ {v} = threadIdx.x < (blockDim.x >> 5) ? sh{a}[threadIdx.x] : ({A}){ident};\n"
                f"      for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {A} t_ = __shfl_down_sync(0xffffffffu, {v}, s_); {v} = {comb}; }}\n"
                f"      if (threadIdx.x == 0) sh{a}[0] = {v}; }}\n    __syncthreads();\n    {v} = sh{a}[0];\n"
                f"    __syncthreads();\n")

    def _finish(self, a: int, j: int, part: str, known: set) -> str:
        if part == "r":
            op = self.steps[j][1].name
            in_dt = self.op_dts[j][0]
            dtype = self.steps[j][3]
            acc_dt = _acc_dtype(op, in_dt, dtype)
            known.add(j)
            return f"{C.storage(dtype)} w{j} = {C.store(_epilogue(op, acc_dt, dtype, f'acc{a}'), dtype)};"
        A = self._acc_type(j, part)
        return f"const {A} {part}{j} = acc{a};"


def _same(st: tuple, ref: tuple, shape: tuple) -> bool:
    """Strides equal wherever the dim is not of size 1 (where any stride reads the same element)."""
    return all(a == b or n == 1 for a, b, n in zip(st, ref, shape))


def _classify(a, full: tuple) -> tuple[str, tuple]:
    """How input ``a`` is read against the full shape: (kind, its broadcast strides over ``full``):
    "c" the full shape, "w" one row for all rows (a weight), "r" one element per row, "s" one
    element, "G"/"R" general strides over the rows (full / per-row)."""
    st = broadcast_strides(a.shape, full)
    lead, last = st[:-1], st[-1]
    n = full[-1]
    if not any(st):
        return "s", st
    if _same(st, contiguous_strides(full), full):
        return "c", st
    if not any(lead) and (last == 1 or n == 1):
        return "w", st
    if (last == 0 or n == 1) and _same(lead, contiguous_strides(full[:-1]), full[:-1]):
        return "r", st
    return ("R" if last == 0 else "G"), st


def _shape_of(steps: tuple) -> tuple:
    """The steps with scalars as their kernel-shaping types and primitives as names: a kernel key."""
    return tuple((k, op if k in ("elementwise", "astype") else op.name if k == "reduce" else "softmax",
                  tuple(o if o.__class__ is int else _scalar_key(op, o.value) for o in ops), d, f)
                 for k, op, ops, d, f in steps)


def _threads(n: int) -> int:
    return 32 if n <= 64 else 64 if n <= 256 else 128 if n <= 1024 else 256 if n <= 4096 else 512


def rowfused(lane, prim, ins, outs) -> None:
    out = outs[0]
    n = prim.n
    lead = out.shape[:-1]
    rows = 1
    for s in lead:
        rows *= s
    if rows == 0 or n == 0 and out.shape[-1] != 1:
        return
    full = lead + (n,)
    steps = prim.steps
    key = (_shape_of(steps), tuple(a.dtype for a in ins), tuple(a.shape for a in ins), full, out.dtype, lane.ctx)
    plan = _plans.get(key)
    if plan is None:
        plan = keep(_plans, key, _plan(lane.ctx, steps, ins, full, out.dtype))
    kern, convs, tail = plan
    args = [out.ptr]
    args.extend(a.ptr for a in ins)
    scalars = [o.value for _, _, ops, _, _ in steps for o in ops if o.__class__ is not int]
    args.extend(c(v) for c, v in zip(convs, scalars))
    args.append(rows)
    args.append(n)
    args.extend(tail)
    ctx = lane.ctx
    grid = (int(min(rows, ctx.sm_count * 32)), 1, 1)
    threads = _threads(n)
    if rows < 2 * ctx.sm_count and n > 64:  # few rows (a decode step): twice the threads, shorter walks
        threads = min(2 * threads, 512)
    kern.launch(lane.handle, grid, (threads, 1, 1), args)


def _plan(ctx, steps: tuple, ins: list, full: tuple, out_dt) -> tuple:
    """(kernel, scalar converters, tail arguments) of one row program over these input shapes."""
    cls = [_classify(a, full) for a in ins]
    kinds = tuple(k for k, _ in cls)
    general = [k for k, kd in enumerate(kinds) if kd in "GR"]
    lead = full[:-1]
    tail: list = []
    nd = 0
    if general:
        pshape, psets = collapse(lead, [cls[k][1][:-1] for k in general])
        if not pshape:
            pshape, psets = (1,), [(0,) for _ in general]
        nd = len(pshape)
        tail.append(pshape)
        for k, ps in zip(general, psets):
            tail += [ps, cls[k][1][-1]]
    in_dts = tuple(a.dtype for a in ins)
    gen = _Gen(steps, in_dts, kinds, out_dt, nd)
    spec = ("rowfused", _shape_of(steps), in_dts, kinds, nd, np.dtype(out_dt))
    kern = ctx.modules.get(spec, gen.source)
    return kern, tuple(_converter(lt) for lt in gen.scalar_lts), tuple(tail)
