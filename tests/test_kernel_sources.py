"""The CUDA kernel templates produce source NVRTC accepts, on any machine: NVRTC needs no GPU, so
CI compiles a sample of the generated kernels (single-op elementwise for every function, fused groups
from random expression trees, the grouped-matmul pointer kernel, integer matmul) for sm_90. Running
them is the GPU suite's job. Skips when NVRTC is not installed (the dev extra installs it)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import laneflow as lf

nvrtc_mod = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")


def _nvrtc_usable() -> bool:
    try:
        return nvrtc_mod.nvrtcVersion()[0] == nvrtc_mod.nvrtcResult.NVRTC_SUCCESS
    except Exception:  # noqa: BLE001 - the library is missing: skip
        return False


pytestmark = pytest.mark.skipif(not _nvrtc_usable(), reason="NVRTC library not found (pip install -e '.[dev]')")


def _compile(src: str, name: str) -> None:
    from laneflow.backends.cuda import nvrtc
    from laneflow.backends.cuda.kernels.cdefs import PREAMBLE

    nvrtc._nvrtc(PREAMBLE + src, nvrtc._target((9, 0)), name)


def _elementwise_cases():
    from laneflow.backends.cuda.kernels import elementwise as E

    f32 = np.dtype(np.float32)
    from laneflow.ops.table import ELEMENTWISE

    for row in ELEMENTWISE.values():
        if row.name.startswith("bitwise"):  # integer (and bool) ops: every width, signed and unsigned
            for d in (np.int8, np.uint8, np.int32, np.uint32, np.int64) + (() if "shift" in row.name else (np.bool_,)):
                yield row.name, np.dtype(d), row.arity == 1
        elif row.name not in ("where", "identity"):  # (where: its own test below)
            yield row.name, f32, row.arity == 1
    for fn in ("ceil", "trunc", "sign", "signbit", "isinf", "reciprocal"):
        yield fn, np.dtype(np.int64), True
    for fn in ("add", "floor_divide", "remainder", "power", "maximum"):
        yield fn, np.dtype(np.int32), False
    yield "add", np.dtype(lf.bfloat16), False
    yield "sign", np.dtype(lf.bfloat16), True
    yield "multiply", np.dtype(np.float16), False
    yield "logical_and", np.dtype(np.bool_), False
    for d in (np.float16, lf.bfloat16, np.float64):  # half types step their 16-bit word (lf_nextafter16)
        yield "nextafter", np.dtype(d), False


@pytest.mark.parametrize("fn,dtype,unary", list(_elementwise_cases()), ids=lambda v: str(v))
def test_elementwise_kernels_compile(fn, dtype, unary):
    from laneflow.backends.cuda.kernels import elementwise as E

    if unary:
        kinds, in_dts, ops = ("c",), (dtype,), (dtype,)
    else:
        kinds, in_dts, ops = ("c", "S"), (dtype,), (dtype, float if dtype.kind == "f" or dtype == lf.bfloat16 else int)
    loop, out_loop = E.loop_dtypes(fn, ops, dtype)
    out = E._result_dtype(fn, list(loop), out_loop)
    sc = tuple(loop[j] for j, k in enumerate(kinds) if k == "S")
    src, name, _ = E._build(fn, kinds, in_dts, list(loop), sc, out, out_loop, 0, False)
    _compile(src, name)
    src, name, params = E._build(fn, kinds, in_dts, list(loop), sc, out, out_loop, 0, False, vec=True)
    assert params.endswith("q") and "cols" not in src  # no rows or columns: only n follows
    _compile(src, name)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "bool_"])
def test_vector_kernels_with_row_and_column_operands_compile(dtype):
    """A where() reading a contiguous mask, a column (x - max(x, keepdims)) and a row (a bias) as one
    vector kernel, for storage types of 1, 2, 4 and 8 bytes."""
    from laneflow import dtypes as dt
    from laneflow.backends.cuda.kernels import elementwise as E
    from laneflow.backends.cuda.kernels.plan import broadcast_strides, classify, collapse

    d = np.dtype(getattr(dt, dtype))
    out_shape = (6, 8)
    sets = [broadcast_strides(sh, out_shape) for sh in ((6, 8), (6, 1), (8,))]
    cshape, csets = collapse(out_shape, sets)
    kinds = tuple(classify(c, cshape) for c in csets)
    vk = E.vector_kinds(kinds, csets, cshape, 48)
    assert kinds == ("c", "g", "g") and vk == ("c", "k", "r")
    assert E.vector_kinds(kinds, csets, (6, 6), 36) is None  # columns not a multiple of VEC
    loop, out_loop = E.loop_dtypes("where", (np.dtype(np.bool_), d, d), d)
    src, name, params = E._build("where", vk, (np.dtype(np.bool_), d, d), list(loop), (), d, out_loop, 0, False,
                                 vec=True)
    assert params == "ppppqq"
    _compile(src, name)


@pytest.mark.parametrize("seed", range(16))
def test_fused_kernels_of_random_expressions_compile(seed, monkeypatch):
    import test_fusion as tf
    from laneflow.backends.cpu import kernels as cpu_kernels
    from laneflow.backends.cuda.kernels import fused as F
    from laneflow.graph import fusion

    monkeypatch.setattr(fusion, "_enabled", True)
    seen = []
    run = cpu_kernels.KERNELS["fused"]

    def record(lane, prim, ins, outs):
        seen.append((prim.steps, [SimpleNamespace(shape=a.shape, size=a.size, dtype=a.dtype) for a in ins],
                     SimpleNamespace(shape=outs[0].shape, size=outs[0].size, dtype=outs[0].dtype)))
        run(lane, prim, ins, outs)

    monkeypatch.setitem(cpu_kernels.KERNELS, "fused", record)
    r = np.random.default_rng(seed)
    if seed < 6:
        dts = [np.dtype([np.float32, np.float64, np.dtype(lf.bfloat16), np.int32][seed % 4])] * 3
    else:  # mixed dtypes: promotion inside the fused steps
        dts = [np.dtype(tf._MIXED[int(k)]) for k in r.integers(0, len(tf._MIXED), 3)]
    integer = all(d.kind in "iu" for d in dts)
    trees = [tf._random_tree(r, 6, 3, integer) for _ in range(3)]
    shapes = ((7, 16), (7, 1), (16,)) if seed >= 12 else ((16,),) * 3  # broadcast inputs: strided reads
    inputs = [r.uniform(-1, 1, sh).astype(d) for sh, d in zip(shapes, dts)]
    with np.errstate(all="ignore"):
        try:
            tf._run(lf.cpu, lambda *xs: [tf._evaluate(t, xs) for t in trees], inputs)
        except (TypeError, OverflowError, ValueError):
            pytest.skip("this random expression is refused by the ops themselves")
    if seed >= 6 and not seen:
        pytest.skip("no fused group in this mixed-dtype expression")
    assert seen, "no fused group formed"
    for steps, ins, out in seen:
        in_dts = tuple(a.dtype for a in ins)
        kinds, nd, _, vk, _ = F._geometry(ins, out)
        loops = F._loops(steps, in_dts)
        src, name, _ = F._build(steps, loops, in_dts, out.dtype, False, kinds, nd)
        _compile(src, name)
        if vk is not None:  # rows and columns of 16: the vector kernel serves too
            src, name, _ = F._build(steps, loops, in_dts, out.dtype, False, vk, 0, vec=True)
            _compile(src, name)


def test_grouped_matmul_pointer_kernel_and_integer_matmul_compile():
    from laneflow.backends.cuda import matmul as M

    _compile(M._PTR_SRC, "lf_store_ptrs")
    from laneflow.backends.cuda.kernels import pointers as PT

    _compile(*PT._build()[:2])  # batched linalg's strided pointer arrays
    src, name, _ = M._build_int(np.dtype(np.int32))
    _compile(src, name)


@pytest.mark.parametrize("op", ["softmax", "logsumexp"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_one_warp_per_row_softmax_kernels_compile(op, dtype):
    from laneflow import dtypes as dt
    from laneflow.backends.cuda.kernels import reduce as R

    d = getattr(dt, dtype)
    for vpl in (1, 8, 64 if dtype != "float64" else 32):
        src, name, _ = R._build_warp_rows(op, d, d, vpl)
        _compile(src, name)
        if dtype == "float32" and vpl > 1:  # four elements per access
            src, name, _ = R._build_warp_rows(op, d, d, vpl, vec=4)
            _compile(src, name)


_WORKLOAD = r'''
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install(real_nvrtc=True)
import numpy as np
import laneflow as lf
from laneflow.backends.cuda import nvrtc
from laneflow.backends.cuda.backend import CUDABackend
from laneflow.graph import fusion

compiled = []
real = nvrtc._nvrtc
nvrtc._nvrtc = lambda source, target, name: (compiled.append(name), real(source, target, name))[1]
fusion.set_enabled(True)
CUDABackend.fuses_elementwise = True
rng = np.random.default_rng(0)
s = lf.new_stream(lf.gpu, lanes=2)
with lf.stream(s):
    outs = []
    for dt in (lf.float32, lf.bfloat16, lf.float16, lf.float64, lf.int32, lf.int8, lf.uint8, lf.bool_):
        x = lf.array(rng.uniform(-3, 3, (4, 6, 5)).astype(dt))
        y = lf.array(rng.uniform(-3, 3, (6, 1)).astype(dt))
        outs += [x + y, x * 2, x > 1, lf.where(x > 0, x, y), x.astype(lf.float32), lf.maximum(x, y)]
        outs += [lf.sum(x, axis=0), lf.sum(x, axis=-1), lf.max(x), lf.min(x, axis=1, keepdims=True),
                 lf.argmax(x, axis=1), lf.argmin(x)]
        outs += [lf.transpose(x, (2, 0, 1)), x.reshape(6, 20), lf.broadcast_to(y, (3, 6, 5)),
                 lf.concatenate([x, x], axis=1), x[1:3, ::2, 1], lf.take(x, lf.array([0, 2, 3]), axis=1)]
        if dt not in (lf.bool_,):
            outs += [lf.prod(x, axis=2), lf.mean(x, axis=(0, 2)), lf.abs(x) // 2 if dt not in (lf.uint8,) else x // 2]
            z = x.astype(dt)
            z[0, 1:3] = 7
            outs.append(z)
        if dt in (lf.float32, lf.bfloat16, lf.float16, lf.float64):
            outs.append(((x * 2).astype(lf.float64) + 1).astype(lf.int32).astype(dt) - x)  # casts inside a fused group
            outs.append(lf.tanh(x / lf.max(x)) * 2 + 1)  # a single-element input of a fused group
            outs.append((x - lf.mean(x, axis=-1, keepdims=True)) * y + 1)  # broadcast inputs of a fused group
            outs += [lf.var(x, axis=1), lf.std(x), lf.softmax(x, axis=-1), lf.logsumexp(x, axis=0),
                     lf.tanh(lf.exp(x) * 0.5 + lf.sin(x)) - lf.sqrt(lf.abs(x)), lf.sigmoid(x), lf.rsqrt(lf.abs(x) + 1)]
    outs += [lf.arange(10, dtype=lf.int32), lf.linspace(0.0, 1.0, 7), lf.eye(4, 5, 1), lf.full((3, 3), 2.5),
             lf.random.uniform((8,), key=lf.random.key(1)), lf.random.normal((4, 4), lf.float64, key=lf.random.key(2))]
    a = lf.array(rng.integers(-5, 5, (3, 4)).astype(np.int32))
    outs.append(a @ lf.array(rng.integers(-5, 5, (4, 2)).astype(np.int32)))
    outs.append(a ** (a + 5))  # an exponent computed on the device: the negative-exponent scan kernel
    lf.eval(*outs)
print("kernels compiled:", len(compiled), "names:", len(set(compiled)))
'''


def test_every_kernel_a_broad_workload_generates_compiles(tmp_path):
    """The CUDA backend under the no-op driver, with real NVRTC: every kernel a program touching every
    op family (and fused groups) would launch is compiled for sm_90. Catches template edits that
    break the generated source, with no GPU."""
    from conftest import run_under_fake_driver

    pytest.importorskip("cuda.bindings.driver")
    p = run_under_fake_driver(_WORKLOAD, tmp_path, timeout=600)
    assert p.returncode == 0 and "kernels compiled:" in p.stdout, p.stdout[-3000:] + p.stderr[-6000:]
    n = int(p.stdout.rsplit("kernels compiled:", 1)[1].split()[0])
    assert n >= 100, p.stdout


class _Kernels:
    """A device context's kernel store, recording which kernel each launch took (no GPU)."""

    def __init__(self):
        self.built: list = []
        self.launched: list = []

    def get(self, spec, build):
        self.built.append(spec[0])
        outer = self

        class K:
            def launch(self, stream, grid, block, args):
                outer.launched.append((spec[0], tuple(args)))
        return K()


class _Ctx:
    """A device context as the kernels see it (hashable: plans are keyed by it)."""

    def __init__(self, modules):
        self.modules, self.sm_count = modules, 132


def _arr(shape, ptr, dtype=np.float32):
    return SimpleNamespace(shape=shape, size=int(np.prod(shape)), dtype=np.dtype(dtype), ptr=ptr, host=None)


def test_the_vector_kernel_serves_aligned_launches_and_the_grid_stride_kernel_the_others():
    """Kernel choice per launch (elementwise.run and fused.fused): a row broadcast over 16-byte aligned
    pointers takes the vector kernel with ``cols`` and ``n`` as its tail; a pointer one element off
    (a view imported through DLPack, say), an odd width or an element count not a multiple of 4
    takes the grid-stride kernel; each kernel is compiled on its first launch only."""
    from laneflow.backends.cuda.kernels import elementwise as E
    from laneflow.backends.cuda.kernels import fused as F

    mods = _Kernels()
    lane = SimpleNamespace(ctx=_Ctx(mods), stream=0, handle=0)
    E._plans.clear()
    out, x, v = _arr((64, 16), 1 << 20), _arr((64, 16), 2 << 20), _arr((16,), 3 << 20)
    E.run(lane, "multiply", (0, 1), [x, v], out)
    assert mods.built == ["ewv"] and mods.launched[-1][1][-2:] == (16, 1024), mods.launched
    v.ptr += 4                                             # one float in: not 16-byte aligned
    E.run(lane, "multiply", (0, 1), [x, v], out)
    assert mods.built == ["ewv", "ew"] and mods.launched[-1][0] == "ew"
    assert mods.launched[-1][1][-1] == 1024                # ..., shape, strides of v, n
    v.ptr -= 4
    E.run(lane, "multiply", (0, 1), [x, v], out)           # aligned again: the vector kernel, no new build
    assert mods.built == ["ewv", "ew"] and mods.launched[-1][0] == "ewv"
    E.run(lane, "add", (0, 1), [_arr((6, 6), 4 << 20), _arr((6,), 5 << 20)], _arr((6, 6), 6 << 20))
    assert mods.built[-1] == "ew"                          # rows of 6: no vector kernel
    E.run(lane, "add", (0, 1), [_arr((7,), 4 << 20), _arr((7,), 5 << 20)], _arr((7,), 6 << 20))
    assert mods.built[-1] == "ew"                          # 7 elements

    # fused: the same choice, made per launch (a plan without shapes serves every size)
    from laneflow.ops.primitives import Scalar

    prim = SimpleNamespace(steps=(("multiply", (0, Scalar(2.0)), np.dtype(np.float32)),
                                  ("add", (-1, 1), np.dtype(np.float32))))
    F._plans.clear()
    mods.built.clear()
    F.fused(lane, prim, [_arr((64, 16), 7 << 20), _arr((64, 16), 8 << 20)], [_arr((64, 16), 9 << 20)])
    F.fused(lane, prim, [_arr((9,), 7 << 20), _arr((9,), 8 << 20)], [_arr((9,), 9 << 20)])
    F.fused(lane, prim, [_arr((64, 16), 7 << 20), _arr((64, 16), (8 << 20) + 8)], [_arr((64, 16), 9 << 20)])
    assert mods.built == ["fusedv", "fused"], mods.built   # compiled once each
    assert [k for k, _ in mods.launched[-3:]] == ["fusedv", "fused", "fused"], mods.launched[-3:]


def _row_programs(dtype):
    """The row programs (graph/rowfusion.py) of a few plain-op graphs, formed on CPU arrays."""
    from laneflow.graph import schedule
    from laneflow.graph.rowfusion import RowFused

    x = lf.array(np.linspace(-1, 1, 6 * 4 * 40).reshape(6, 4, 40).astype(dtype))
    w = lf.array(np.ones(40, dtype))
    m = lf.array(np.zeros((4, 40), dtype))
    c = lf.array(np.ones((6, 4, 1), dtype))
    lf.eval(x, w, m, c)

    def layer_norm(x):  # (xc must die before the eval: a live array keeps its value out of a group)
        xc = x - x.mean(axis=-1, keepdims=True)
        return xc / lf.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5) * w + 0.5
    roots = [layer_norm(x),
             lf.softmax(x * 0.125 + m, axis=-1),  # scale and mask
             lf.exp(x - x.max(axis=-1, keepdims=True)) / c,  # a per-row input
             (x * x).sum(axis=-1, keepdims=True) * (x.min(axis=-1, keepdims=True) - 1)]  # per-row roots
    for r in roots:
        items = schedule.passes(schedule.toposort([r._data]))
        found = [it for it in items or () if isinstance(getattr(it, "prim", None), RowFused)]
        assert len(found) == 1, r
        yield found[0]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("general", [False, True])
def test_row_program_kernels_compile(dtype, general, monkeypatch):
    """Row programs of a layer norm, a masked softmax, a per-row input and per-row roots, for each
    float dtype, with inputs read as rows/columns/weights and through general strides."""
    from laneflow import dtypes as dt
    from laneflow.backends.cuda.kernels import rowfused as R
    from laneflow.graph import fusion

    monkeypatch.setattr(fusion, "_enabled", True)
    d = np.dtype(getattr(dt, dtype))
    for node in _row_programs(d):
        full = node.root.shape[:-1] + (node.prim.n,)
        kinds = tuple(("G" if k in "cw" else "R") if general else k
                      for k in (R._classify(i, full)[0] for i in node.inputs))
        gen = R._Gen(node.prim.steps, tuple(i.dtype for i in node.inputs), kinds, node.root.dtype, 2)
        src, name, params = gen.source()
        n_general = sum(k in "GR" for k in kinds)
        assert params.count("D") == (1 + n_general if n_general else 0)
        _compile(src, name)


@pytest.mark.parametrize("update", [False, True])
def test_dynamic_slice_kernels_compile(update):
    """Starts read on the device (int32, int64, uint8 start arrays) mixed with static ones, 0 to 4 dims."""
    from laneflow.backends.cuda.kernels import dynamic as D

    for dtype, start_dts, dyn in ((np.float32, (), ()), (lf.bfloat16, (np.int32,), (0,)),
                                  (np.float64, (np.int64, np.uint8), (-1, 0, 1)),
                                  (np.int8, (np.int32,), (-1, -1, 0, -1))):
        src, name, codes = D._build(np.dtype(dtype), tuple(np.dtype(d) for d in start_dts), dyn, len(dyn), update)
        assert codes == "pp" + "p" * len(start_dts) + "DDDDq"  # window, shape, starts, update strides
        _compile(src, name)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "uint32", "int64", "bool_"])
def test_sort_search_and_scan_kernels_compile(dtype):
    from laneflow.backends.cuda.kernels import sort as S

    d = np.dtype(getattr(lf, dtype))
    for arg in (False, True):
        for descending in (False, True):
            _compile(*S._build_sort(d, arg, descending)[:2])
    for right in (False, True):
        _compile(*S._build_search(d, right)[:2])
    out = np.dtype(np.int64) if d.kind in "biu" else d
    for op in ("sum", "prod"):
        for initial in (False, True):
            _compile(*S._build_scan(d, out, op, initial)[:2])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_slogdet_kernel_compiles(dtype):
    from laneflow.backends.cuda.kernels import lu

    _compile(*lu._build(np.dtype(dtype))[:2])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_solver_check_kernels_compile(dtype):
    """The solver's status scan (one block, the first failing matrix wins) and the inf/NaN scan of svd and
    eigh, with the small triangle and identity kernels."""
    from laneflow.backends.cuda import linalg as S

    for src, name, _sig in (S._build_scan(), S._build_finite(np.dtype(dtype)), S._build_tri(np.dtype(dtype)),
                            S._build_eye(np.dtype(dtype))):
        _compile(src, name)


def _complex_rows():
    from laneflow.ops.table import ELEMENTWISE

    for row in ELEMENTWISE.values():
        if row.real_only or row.name.startswith("bitwise") or row.name in (
                "logical_not", "where", "identity"):
            continue
        yield row.name, row.arity == 1


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("fn,unary", list(_complex_rows()), ids=lambda v: str(v))
def test_complex_elementwise_kernels_compile(fn, unary, dtype):
    """Every op the CUDA backend computes on complex values, as the grid-stride and the vector kernel;
    binary ops with a Python complex scalar (a packed ``lf_c64``/``lf_c128`` kernel parameter)."""
    from laneflow.backends.cuda.kernels import elementwise as E

    d = np.dtype(dtype)
    kinds, ops = (("c",), (d,)) if unary else (("c", "S"), (d, complex))
    loop, out_loop = E.loop_dtypes(fn, ops, d)
    if not fn.startswith("logical"):  # (logical ops test truth in bool loops)
        assert np.dtype(loop[0]).kind == "c", (fn, loop)  # the loop runs in complex
    out = E._result_dtype(fn, list(loop), out_loop)
    sc = tuple(loop[j] for j, k in enumerate(kinds) if k == "S")
    for vec in (False, True):
        src, name, params = E._build(fn, kinds, (d,), list(loop), sc, out, out_loop, 0, False, vec=vec)
        if not unary and np.dtype(loop[1]).kind == "c":
            assert params[2] == {"complex64": "F", "complex128": "Z"}[dtype], params
        _compile(src, name)


def test_real_only_ops_have_no_complex_cuda_kernel():
    from laneflow.backends.cuda.kernels import elementwise as E
    from laneflow.errors import LaneflowError

    c = np.dtype(np.complex64)
    with pytest.raises(LaneflowError, match=r"erf: .*no kernel for complex64"):
        E.expr("erf", ["v0"], [c], c)
    with pytest.raises(LaneflowError, match=r"maximum: .*complex64"):
        E.expr("maximum", ["v0", "v1"], [c, c], c)


@pytest.mark.parametrize("src,dst", [("float32", "complex64"), ("int64", "complex128"), ("bool_", "complex64"),
                                     ("complex64", "complex128"), ("complex128", "complex64"),
                                     ("float16", "complex64"), ("complex64", "bool_")])
def test_complex_casts_compile(src, dst):
    """astype's kernels into, out of (to bool) and between the complex dtypes."""
    from laneflow.backends.cuda.kernels import elementwise as E

    s, d = np.dtype(getattr(lf, src)), np.dtype(getattr(lf, dst))
    src_code, name, _ = E._build("identity", ("c",), (s,), [d], (), d, d, 0, False)
    _compile(src_code, name)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_reduction_scan_fill_and_slogdet_kernels_compile(dtype):
    """sum, prod and mean of complex values (block and per-thread layouts, split partials and their
    combine pass: the warp shuffle of an lf_cx), cumulative sums and products, a filled complex
    array, and the LU slogdet of complex matrices (real log |det|)."""
    from laneflow.backends.cuda.kernels import copy as CP
    from laneflow.backends.cuda.kernels import lu
    from laneflow.backends.cuda.kernels import reduce as R
    from laneflow.backends.cuda.kernels import sort as S

    d = np.dtype(dtype)
    for op, fold in (("sum", "sum"), ("prod", "prod"), ("mean", "sum")):
        for inner in (True, False):
            for partial in (False, True):
                _compile(*R._build(op, fold, inner, d, d, d, 1, 1, partial, False)[:2])
        _compile(*R._build(op, fold, False, d, d, d, 1, 1, False, True)[:2])
    for op in ("sum", "prod"):
        for initial in (False, True):
            _compile(*S._build_scan(d, d, op, initial)[:2])
    src, name, params = CP._build_fill("full", d)
    assert params[1] == ("F" if dtype == "complex64" else "Z")
    _compile(src, name)
    _compile(*lu._build(d)[:2])


@pytest.mark.parametrize("fn,part", [("imag", "lf_cim"), ("real", "lf_cre")])
@pytest.mark.parametrize("dtype,real", [(np.complex64, np.float32), (np.complex128, np.float64)])
def test_complex_parts_read_the_complex_value(fn, part, dtype, real):
    """real and imag have no numpy ufunc: their loop must keep the complex operand (a loop in the output's
    real dtype casts it first, and imag then read zeros: seen on the H200, 2026-12-04)."""
    from laneflow.backends.cuda.kernels import elementwise as E

    d, r = np.dtype(dtype), np.dtype(real)
    loop, out_loop = E.loop_dtypes(fn, (d,), r)
    assert loop == [d] and out_loop == r
    src, name, _ = E._build(fn, ("c",), (d,), list(loop), (), r, out_loop, 0, False)
    assert f"{part}(" in src
    _compile(src, name)


@pytest.mark.parametrize("split", [1, 8])
def test_attention_kernels_compile(split):
    """One warp per query row, and split mode (a block of warps sharing one row's keys, merged at the end)."""
    from laneflow.backends.cuda.kernels import attention as A

    for dtype, mask_dt, mask, causal, D, Dv in ((lf.bfloat16, None, None, True, 64, 64),
                                                (np.float32, np.dtype(np.bool_), "bool", False, 64, 32),
                                                (np.float64, np.dtype(np.float64), "additive", False, 80, 96)):
        src, name, codes = A._build(np.dtype(dtype), mask_dt, mask, causal, D, Dv, split)
        assert ("sa_" in src) == (split > 1)
        _compile(src, name)


@pytest.mark.parametrize("tpr", [32, 256])
def test_norm_kernels_compile(tpr):
    from laneflow.backends.cuda.kernels import norm as N

    for op, vpl in (("layer_norm", 4), ("rms_norm", 0), ("layer_norm", 32)):
        _compile(*N._build(op, lf.bfloat16, lf.bfloat16, lf.bfloat16 if op == "layer_norm" else None, lf.bfloat16,
                           tpr, vpl)[:2])


def test_check_slot_kernels_compile():
    """The kernels of check slots inside CUDA graphs: zeroing a slot before an index kernel, and the
    per-launch copy of a graph's slots (eight a launch, a count and sixteen pointers)."""
    from laneflow.backends.cuda import checks
    from laneflow.backends.cuda.cudagraph import checks as graph_checks

    for make in (checks._zero_kernel, graph_checks._copy_kernel):
        src, name, params = make()
        signature = src[src.index(name) + len(name) + 1:src.index(")")]
        assert signature.count(",") + 1 == len(params), (name, params, signature)  # the launch packs what it takes
        _compile(src, name)
