"""The CUDA kernel templates produce source NVRTC accepts, on any machine: NVRTC needs no GPU, so
CI compiles a sample of the generated kernels (single-op elementwise for every function, fused groups
from random expression trees, the grouped-matmul pointer kernel, integer matmul) for sm_90. Running
them is the GPU suite's job. Skips when NVRTC is not installed (the dev extra installs it)."""

from __future__ import annotations

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
    for fn in sorted(E._UFUNC):
        unary = fn in ("negative", "abs", "sign", "exp", "log", "log1p", "sqrt", "square", "sin", "cos", "tanh",
                       "logical_not", "isnan", "isfinite")
        yield fn, f32, unary
    for fn in ("add", "floor_divide", "remainder", "power", "maximum"):
        yield fn, np.dtype(np.int32), False
    yield "add", np.dtype(lf.bfloat16), False
    yield "multiply", np.dtype(np.float16), False
    yield "logical_and", np.dtype(np.bool_), False


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


@pytest.mark.parametrize("seed", range(6))
def test_fused_kernels_of_random_expressions_compile(seed, monkeypatch):
    import test_fusion as tf
    from laneflow.backends.cpu import backend as cpu_backend
    from laneflow.backends.cuda.kernels import fused as F
    from laneflow.graph import fusion

    monkeypatch.setattr(fusion, "_enabled", True)
    seen = []
    run = cpu_backend._KERNELS["fused"]

    def record(lane, prim, ins, outs):
        seen.append((prim.steps, tuple(a.dtype for a in ins), outs[0].dtype))
        run(lane, prim, ins, outs)

    monkeypatch.setitem(cpu_backend._KERNELS, "fused", record)
    r = np.random.default_rng(seed)
    dtype = [np.float32, np.float64, np.dtype(lf.bfloat16), np.int32][seed % 4]
    trees = [tf._random_tree(r, 6, 3, dtype == np.int32) for _ in range(3)]
    inputs = [r.uniform(-1, 1, 16).astype(dtype) for _ in range(3)]
    with np.errstate(all="ignore"):
        tf._run(lf.cpu, lambda *xs: [tf._evaluate(t, xs) for t in trees], inputs)
    assert seen, "no fused group formed"
    for steps, in_dts, out_dt in seen:
        src, name, _ = F._build(steps, F._loops(steps, in_dts), in_dts, out_dt, False)
        _compile(src, name)


def test_grouped_matmul_pointer_kernel_and_integer_matmul_compile():
    from laneflow.backends.cuda import matmul as M

    _compile(M._PTR_SRC, "lf_store_ptrs")
    src, name, _ = M._build_int(np.dtype(np.int32))
    _compile(src, name)
