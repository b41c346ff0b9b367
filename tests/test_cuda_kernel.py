"""User CUDA kernels (``lf.cuda.kernel``): results against numpy on random inputs, the encoder tracking
them like built-in ops, compile errors, lf.compile, and the concurrency proof (two 2 ms clock spins
overlap on two lanes of one stream and serialise on one). Argument checks run everywhere; the rest
needs a GPU and skips without one (one-line reason)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import random_array

import laneflow as lf

gpu = pytest.mark.skipif(not lf.gpu_available(), reason="no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")

AXPY = r"""
extern "C" __global__ void axpy(const float* x, const float* y, float* out, long long n, float a) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    out[i] = a * x[i] + y[i];
}
"""

SPLIT = r"""
extern "C" __global__ void split(const double* x, double* lo, long long* idx, int n, double cut) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { lo[i] = x[i] < cut ? x[i] : cut; idx[i] = (long long)i * 3; }
}
"""

SPIN = r"""
extern "C" __global__ void spin(long long* out, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  out[0] = clock64() - t0;
}
"""


def _axpy():
    return lf.cuda.kernel(AXPY, "axpy", num_inputs=2, scalars=("int64", "float32"))


# -- argument checks (no GPU needed) ------------------------------------------------------------------


def test_calling_a_cuda_kernel_on_the_cpu_names_the_kernel_and_asks_for_the_gpu():
    k = _axpy()
    x = lf.array(np.ones(4, np.float32), device=lf.cpu)
    with pytest.raises(ValueError, match=r"axpy.*lf\.gpu"):
        k(x, x, out_like=x, grid=1, block=4, scalars=(4, 1.0), stream=lf.cpu)


@pytest.mark.parametrize("bad", ["float", "int", "half", "complex64", float, int, object(), "nonsense"])
def test_scalar_types_must_be_sized_names(bad):
    with pytest.raises(TypeError, match="scalar type"):
        lf.cuda.kernel(AXPY, "axpy", num_inputs=2, scalars=("int64", bad))


def test_kernel_declaration_is_checked():
    with pytest.raises(TypeError, match="C identifier"):
        lf.cuda.kernel(AXPY, "not a name", num_inputs=1)
    with pytest.raises(ValueError, match="num_outputs"):
        lf.cuda.kernel(AXPY, "axpy", num_inputs=1, num_outputs=0)
    k = lf.cuda.kernel(AXPY, "axpy", num_inputs=2, scalars=("int64", np.float32))
    assert k.params == "pppqf" and k.scalar_types == ("int64", "float32")


# -- on the GPU ------------------------------------------------------------------------------------------


@gpu
def test_axpy_matches_numpy(rng):
    n = int(rng.integers(1, 5000))
    xh, yh = random_array(rng, (n,), np.float32), random_array(rng, (n,), np.float32)
    a = float(rng.uniform(-3, 3))
    x, y = lf.array(xh, device=lf.gpu), lf.array(yh, device=lf.gpu)
    out = _axpy()(lf.exp(x), y, out_like=x, grid=(n + 127) // 128, block=128, scalars=(n, a))
    assert out.shape == (n,) and out.dtype == lf.float32
    np.testing.assert_allclose(np.asarray(out), np.float32(a) * np.exp(xh) + yh, rtol=1e-5, atol=1e-5)


@gpu
def test_several_outputs_and_host_inputs(rng):
    n = 300
    xh = rng.normal(size=n)
    k = lf.cuda.kernel(SPLIT, "split", num_inputs=1, num_outputs=2, scalars=("int32", "float64"))
    lo, idx = k(xh, outputs=[((n,), lf.float64), ((n,), "int64")], grid=(n + 63) // 64, block=(64, 1), scalars=(n, 0.25),
                stream=lf.gpu)
    np.testing.assert_array_equal(np.asarray(lo), np.minimum(xh, 0.25))
    np.testing.assert_array_equal(np.asarray(idx), np.arange(n) * 3)


@gpu
def test_custom_kernels_chain_with_built_in_ops_across_lanes_in_program_order(rng):
    """A chain mixing user kernels and built-in ops on a 4-lane stream, with random injected delays,
    gives the program-order result: the encoder orders user kernels by their reads and writes."""
    k = _axpy()
    s = lf.new_stream(lf.gpu, lanes=4)
    n = 4096
    xs = [random_array(rng, (n,), np.float32) for _ in range(6)]
    with lf.testing.inject_delays(0.0005, seed=int(rng.integers(1 << 30))), lf.stream(s):
        arrs = [lf.array(x) for x in xs]
        acc, ref = arrs[0], xs[0]
        for i in range(1, 6):
            branch = k(arrs[i], acc, out_like=acc, grid=32, block=128, scalars=(n, 0.5))
            acc = lf.tanh(branch) + acc  # RAW on the kernel's output, and the kernel read acc (WAR)
            ref = np.tanh(np.float32(0.5) * xs[i] + ref) + ref
        got = np.asarray(acc)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@gpu
def test_compile_records_custom_kernels(rng):
    k = _axpy()

    @lf.compile
    def f(x, y):
        return k(x, y * 2, out_like=x, grid=8, block=128, scalars=(x.shape[0], 3.0)) - 1

    for _ in range(3):
        xh, yh = random_array(rng, (1000,), np.float32), random_array(rng, (1000,), np.float32)
        got = f(lf.array(xh, device=lf.gpu), lf.array(yh, device=lf.gpu))
        np.testing.assert_allclose(np.asarray(got), np.float32(3) * xh + 2 * yh - 1, rtol=1e-5, atol=1e-5)
    assert f.cache_size == 1


@gpu
def test_compile_errors_show_the_offending_line_and_call_errors_name_the_kernel():
    bad = 'extern "C" __global__ void broken(const float* x, float* y) {\n  y[0] = x[0] +;\n}\n'
    k = lf.cuda.kernel(bad, "broken", num_inputs=1)
    x = lf.array(np.ones(2, np.float32), device=lf.gpu)
    with pytest.raises(lf.LaneflowError, match=r"(?s)broken.*line 2.*y\[0\] = x\[0\] \+;"):
        k(x, out_like=x, grid=1, block=1)
    missing = lf.cuda.kernel(AXPY, "axpy_typo", num_inputs=2, scalars=("int64", "float32"))
    with pytest.raises(lf.LaneflowError, match="axpy_typo"):
        missing(x, x, out_like=x, grid=1, block=1, scalars=(2, 1.0))
    k = _axpy()
    with pytest.raises(TypeError, match="axpy: declared 2 input"):
        k(x, out_like=x, grid=1, block=1, scalars=(2, 1.0))
    with pytest.raises(OverflowError, match="axpy"):
        k(x, x, out_like=x, grid=1, block=1, scalars=(2**63, 1.0))
    with pytest.raises(ValueError, match="1024 threads"):
        k(x, x, out_like=x, grid=1, block=(64, 32), scalars=(2, 1.0))


# -- the concurrency proof ------------------------------------------------------------------------------


def _clock_khz() -> int:
    from cuda.bindings import driver as cu

    from laneflow.defaults import backend_for

    ctx = backend_for(lf.gpu).context(0)
    attr = getattr(cu.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_CLOCK_RATE", None)
    try:
        return ctx.attribute(attr)
    except Exception:  # noqa: BLE001 - deprecated attribute missing: assume an H100/H200-class clock
        return 1_980_000


def _timed(spin, stream, count: int, cycles: int) -> float:
    outs = [spin(outputs=[((1,), lf.int64)], grid=1, block=1, scalars=(cycles,), stream=stream) for _ in range(count)]
    t = time.perf_counter()
    lf.eval(*outs)
    return time.perf_counter() - t


@gpu
@pytest.mark.alone
def test_two_spinning_custom_kernels_overlap_on_two_lanes_and_serialise_on_one():
    """Each kernel busy-waits about 2 ms of SM clocks. On two lanes of one stream the pair takes under
    1.5x one kernel; on one lane about 2x. Up to three attempts (clocks ramp, machines are shared);
    every attempt's figures are in the failure message."""
    spin = lf.cuda.kernel(SPIN, "spin", num_inputs=0, scalars=("int64",))
    cycles = int(_clock_khz() * 1000 * 0.002)
    one_lane, two_lanes = lf.new_stream(lf.gpu, lanes=1), lf.new_stream(lf.gpu, lanes=2)
    for s in (one_lane, two_lanes):  # warm up: compile, allocate, raise the clocks
        for _ in range(3):
            _timed(spin, s, 2, cycles)
    seen = []
    for _ in range(3):
        single = min(_timed(spin, two_lanes, 1, cycles) for _ in range(3))
        pair = min(_timed(spin, two_lanes, 2, cycles) for _ in range(3))
        serial = min(_timed(spin, one_lane, 2, cycles) for _ in range(3))
        seen.append(f"one kernel {single * 1e3:.2f} ms, two on two lanes {pair * 1e3:.2f} ms, "
                    f"two on one lane {serial * 1e3:.2f} ms")
        if pair < 1.5 * single and serial > 1.7 * single:
            print(seen[-1])
            return
    pytest.fail("no overlap on two lanes or no serialisation on one: " + "; ".join(seen))
