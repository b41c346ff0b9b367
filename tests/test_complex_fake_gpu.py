"""Complex dtypes on the CUDA backend's host side, under the fake driver (``tests/doubles/fake_cuda.py``)
with real NVRTC: every kernel a complex workload launches compiles for sm_90 (fused elementwise groups and
row programs included), cuBLASLt is planned with
the C/Z data, scale and compute types, and cuSOLVER routines refuse complex matrices by name. Values
are garbage (nothing runs); the GPU suite checks them. In a subprocess: the fake driver must never
meet a real one."""

from __future__ import annotations

import pytest
from conftest import run_under_fake_driver

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
nvrtc_mod = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")

_SCRIPT = r'''
import sys
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install(real_nvrtc=True)
import numpy as np
import laneflow as lf

with lf.stream(lf.gpu):
    for cd, fd in ((lf.complex64, np.float32), (lf.complex128, np.float64)):
        z = lf.array((np.ones((4, 8)) + 1j).astype(cd))
        f = lf.array(np.ones((4, 8), fd))
        outs = [lf.exp(z * (0.5 - 1j)) + f, lf.abs(z), lf.real(z), lf.conj(z), lf.sum(z, axis=1), lf.mean(z),
                lf.prod(z, axis=0), lf.astype(f, cd), lf.full((3,), 2 - 1j, dtype=cd), lf.linspace(0, 2, 5, dtype=cd),
                lf.arange(4, dtype=cd), lf.eye(3, dtype=cd), lf.cumulative_sum(z, axis=1),
                lf.linalg.det(z[:, :4]), z == z, lf.sqrt(z) / z,
                (z * z).sum(axis=-1, keepdims=True) * z, lf.sum(z * z, axis=0)]   # row programs, fused groups
        xc = z - z.mean(axis=-1, keepdims=True)
        outs.append(xc * z)
        del xc
        fake_cuda.LT_CALLS.clear()
        outs.append(z @ lf.array(np.ones((8, 5), cd)))
        lf.eval(*outs)
        desc = [a for n, a in fake_cuda.LT_CALLS if n == "matmul_desc_create"]
        lays = [a for n, a in fake_cuda.LT_CALLS if n == "matrix_layout_create"]
        runs = [a for n, a in fake_cuda.LT_CALLS if n == "matmul"]
        want_type = 4 if cd == lf.complex64 else 5                     # CUDA_C_32F, CUDA_C_64F
        want_compute = 68 if cd == lf.complex64 else 70               # COMPUTE_32F, COMPUTE_64F
        assert desc == [(want_compute, want_type)], desc
        assert len(lays) == 3 and all(a[0] == want_type for a in lays), lays
        alpha = np.frombuffer((np.ctypeslib.as_array((__import__("ctypes").c_char * np.dtype(cd).itemsize)
                                                     .from_address(runs[0][2]))).tobytes(), cd)
        assert len(runs) == 1 and alpha[0] == 1, (runs, alpha)         # alpha is a complex one
        p = "c" if cd == lf.complex64 else "z"
        h = lf.array((np.eye(4) * 4 + 1j * np.triu(np.ones((4, 4)), 1) - 1j * np.tril(np.ones((4, 4)), -1)).astype(cd))
        fake_cuda.LIBRARY_CALLS.clear()
        lf.eval(lf.linalg.cholesky(h), lf.linalg.inv(h), lf.linalg.solve(h, z[:, :3]), *lf.linalg.qr(z[:, :3]),
                *lf.linalg.eigh(h), *lf.linalg.svd(z[:3]), *lf.linalg.svd(z[:, :3], full_matrices=False),
                lf.linalg.svdvals(h))
        names = {n for n, _ in fake_cuda.LIBRARY_CALLS}
        want = {p + r for r in ("potrf", "getrf", "getrs", "geqrf", "ungqr", "heevd", "gesvd")}
        assert want <= names and not any(n[:1] in "sd" and n[1:] in ("potrf", "geqrf", "gesvd") for n in names), names
        w = lf.linalg.eigvalsh(h)
        assert w.dtype == (lf.float32 if cd == lf.complex64 else lf.float64)
        try:
            lf.erf(z)
        except TypeError as e:  # a real-only row of the op table: refused when built, on every device
            assert "erf" in str(e) and str(cd) in str(e), e
        else:
            raise AssertionError("erf of a complex array was built")
    f = lf.compile(lambda a, s: (lf.exp(a * (1 - 1j)) @ a.T) * s + lf.sum(a, axis=1, keepdims=True))
    a = lf.array((np.ones((4, 4)) + 2j).astype(np.complex64))
    for _ in range(3):  # traced, captured, replayed: a complex scalar operand and a C matmul in the graph
        lf.eval(f(a, lf.array(np.complex64(0.5 + 1j))))
print("complex ok")
'''


def test_complex_workload_compiles_and_plans_cublaslt_and_cusolver_c_and_z_calls(tmp_path):
    p = run_under_fake_driver(_SCRIPT, tmp_path, timeout=600)
    assert p.returncode == 0 and "complex ok" in p.stdout, p.stdout[-3000:] + p.stderr[-6000:]
