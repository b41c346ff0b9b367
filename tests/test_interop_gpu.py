"""GPU interop: DLPack (both directions, stream-correct) and ``__cuda_array_interface__`` v3 with PyTorch,
CuPy and JAX. Pointer equality proves zero copy; values are checked against numpy on random inputs;
the stream tests make the producer's stream busy (a spin) before it writes, so a consumer that did
not wait would read the wrong values. Each partner's tests skip when it is absent or has no GPU.
The DLPack capsule mechanics (ctypes structs, deleters) are checked on the CPU too."""

from __future__ import annotations

import gc
import os
import weakref

import numpy as np
import pytest
from conftest import random_array

import laneflow as lf
from laneflow.runtime import capsule as cap

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX must not take the GPU's memory

_NO_GPU = "no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing"
gpu = pytest.mark.skipif(not lf.gpu_available(), reason=_NO_GPU)


def _partner(name: str):
    """The partner module with a usable GPU, or skip with a one-line reason."""
    if not lf.gpu_available():
        pytest.skip(_NO_GPU)
    try:
        if name == "torch":
            import torch

            if not torch.cuda.is_available():
                pytest.skip("PyTorch sees no GPU")
            return torch
        if name == "cupy":
            import cupy

            cupy.cuda.runtime.getDeviceCount()
            return cupy
        import jax

        if not jax.devices("gpu"):
            pytest.skip("JAX sees no GPU")
        return jax
    except ImportError:
        pytest.skip(f"{name} is not installed")
    except Exception as e:  # noqa: BLE001 - a partner without a working GPU
        pytest.skip(f"{name} has no usable GPU ({type(e).__name__})")


def _ptr(x) -> int:
    return x.__cuda_array_interface__["data"][0]


SLOW_COPY = r"""
extern "C" __global__ void slow_copy(const float* x, float* y, long long n, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = x[i];
}
"""


def _slow_lf(xh: np.ndarray):
    """``xh`` on the GPU, written by a kernel that first spins about 50 ms (the producer is busy)."""
    k = lf.cuda.kernel(SLOW_COPY, "slow_copy", num_inputs=1, scalars=("int64", "int64"))
    x = lf.array(xh, device=lf.gpu)
    y = k(x, out_like=x, grid=64, block=256, scalars=(x.size, 100_000_000))
    lf.async_eval(y)  # enqueued: the spin runs while the consumer takes the array
    return y


# -- capsule mechanics (CPU) ------------------------------------------------------------------------


class _Producer:
    def __init__(self, a: np.ndarray, owner, versioned: bool):
        self.a, self.owner, self.versioned = a, owner, versioned

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        return cap.make_capsule(self.a.ctypes.data, self.a.shape, self.a.dtype, (cap.KDL_CPU, 0), self.owner,
                                versioned=self.versioned)

    def __dlpack_device__(self):
        return (cap.KDL_CPU, 0)


class _Owner:
    pass


@pytest.mark.parametrize("versioned", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "uint8", "float16", "complex64", "complex128"])
def test_capsules_round_trip_through_numpy_and_release_their_owner(rng, versioned, dtype):
    base = cap.live_exports()
    a = random_array(rng, (3, 5), lf.dtype(dtype))
    owner = _Owner()
    alive = weakref.ref(owner)
    got = np.from_dlpack(_Producer(a, owner, versioned))
    del owner
    assert alive() is not None and got.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(got, a)
    if versioned:
        assert not got.flags.writeable  # laneflow exports read-only
    del got
    gc.collect()
    assert alive() is None and cap.live_exports() == base


@pytest.mark.parametrize("versioned", [True, False])
def test_bfloat16_capsules_open_and_a_failing_consumer_keeps_its_error(rng, versioned):
    base = cap.live_exports()
    a = random_array(rng, (4, 2), lf.bfloat16)
    owner = _Owner()
    alive = weakref.ref(owner)
    t = cap.open_capsule(_Producer(a, owner, versioned).__dlpack__())
    assert t.dtype == lf.bfloat16 and t.ptr == a.ctypes.data and t.shape == (4, 2) and t.contiguous
    assert t.read_only == versioned
    t.release()
    with pytest.raises((RuntimeError, BufferError), match="dtype"):  # numpy has no bfloat16: its own error comes through
        np.from_dlpack(_Producer(a, owner, versioned))
    del owner
    gc.collect()
    assert alive() is None and cap.live_exports() == base


def test_an_unconsumed_capsule_releases_its_owner():
    base = cap.live_exports()
    owner = _Owner()
    alive = weakref.ref(owner)
    c = cap.make_capsule(0, (0,), np.dtype(np.float32), (cap.KDL_CPU, 0), owner, versioned=True)
    del owner
    assert alive() is not None
    del c
    gc.collect()
    assert alive() is None and cap.live_exports() == base


def test_opening_a_capsule_reads_it_and_calls_the_deleter_once(rng):
    a = random_array(rng, (4, 6), np.float64)
    alive = weakref.ref(a)
    t = cap.open_capsule(a[:, ::2].__dlpack__(max_version=(1, 0)))
    assert t.ptr == a.ctypes.data and t.shape == (4, 3) and t.strides == (6, 2)
    assert t.dtype == np.float64 and t.device == (cap.KDL_CPU, 0) and not t.contiguous
    del a
    gc.collect()
    assert alive() is not None  # the capsule's producer still holds it
    t.release()
    t.release()
    gc.collect()
    assert alive() is None
    with pytest.raises(BufferError, match="consumed only once"):
        cap.open_capsule(object())


def test_cpu_arrays_have_no_cuda_array_interface():
    x = lf.array([1.0, 2.0], device=lf.cpu)
    assert not hasattr(x, "__cuda_array_interface__")
    assert x.__dlpack_device__() == (1, 0)


def test_dlpack_stream_numbers_follow_the_spec():
    from laneflow.backends.cuda.interop import stream_handle as _stream_handle

    assert _stream_handle(None, "t") == 1 and _stream_handle(2, "t") == 2 and _stream_handle(-1, "t") is None
    assert _stream_handle(0x7F00AB, "t") == 0x7F00AB
    with pytest.raises(ValueError, match="ambiguous"):
        _stream_handle(0, "t")
    with pytest.raises(TypeError):
        _stream_handle(1.5, "t")


# -- laneflow itself on the GPU ------------------------------------------------------------------------


@gpu
def test_gpu_export_and_import_within_laneflow_is_zero_copy(rng):
    xh = random_array(rng, (37, 5), np.float32)
    x = lf.exp(lf.array(xh, device=lf.gpu))
    assert x.__dlpack_device__() == (2, 0)
    y = lf.from_dlpack(x)
    assert _ptr(y) == _ptr(x)
    np.testing.assert_allclose(np.asarray(y + 1), np.exp(xh) + 1, rtol=1e-6)
    cai = x.__cuda_array_interface__
    assert cai["version"] == 3 and cai["typestr"] == "<f4" and cai["shape"] == (37, 5)
    host = np.from_dlpack(_HostCopy(x))  # dl_device=(kDLCPU, 0): a host copy
    np.testing.assert_allclose(host, np.exp(xh), rtol=1e-6)


class _HostCopy:
    def __init__(self, x):
        self.x = x

    def __dlpack__(self, **kw):
        return self.x.__dlpack__(dl_device=(1, 0), **{k: v for k, v in kw.items() if k != "dl_device"})

    def __dlpack_device__(self):
        return (1, 0)


@gpu
def test_exported_memory_is_never_written_by_laneflow_again(rng):
    xh = random_array(rng, (1000,), np.float32)
    x = lf.exp(lf.array(xh, device=lf.gpu))
    c = x.__dlpack__(max_version=(1, 0))
    t = cap.open_capsule(c)  # a consumer holding laneflow's memory
    x += 1  # without the export mark, this add would reuse x's buffer in place
    x[3] = 5
    lf.eval(x)
    view = lf.cuda.from_cuda_array_interface(_CAI(t.ptr, t.shape, t.dtype))
    np.testing.assert_allclose(np.asarray(view), np.exp(xh), rtol=1e-6)
    t.release()


class _CAI:
    def __init__(self, ptr, shape, dtype, stream=None, strides=None, owner=None):
        self.owner = owner
        self.__cuda_array_interface__ = {"data": (ptr, True), "shape": shape, "typestr": np.dtype(dtype).str,
                                         "version": 3, "strides": strides, "stream": stream}


# -- PyTorch -------------------------------------------------------------------------------------------


def test_torch_zero_copy_round_trip(rng):
    torch = _partner("torch")
    xh = random_array(rng, (64, 33), np.float32)
    x = lf.sin(lf.array(xh, device=lf.gpu))
    t = torch.from_dlpack(x)
    assert t.data_ptr() == _ptr(x) and t.device.type == "cuda"
    np.testing.assert_allclose(t.cpu().numpy(), np.sin(xh), rtol=1e-6)
    th = torch.from_numpy(random_array(rng, (17, 9), np.float64)).cuda()
    y = lf.from_dlpack(th)
    assert _ptr(y) == th.data_ptr()
    np.testing.assert_allclose(np.asarray(lf.sqrt(lf.abs(y))), np.sqrt(np.abs(th.cpu().numpy())), rtol=1e-12)
    bf = torch.randn(8, 8, device="cuda").to(torch.bfloat16)
    z = lf.from_dlpack(bf)
    assert z.dtype == lf.bfloat16 and _ptr_dl(z) == bf.data_ptr()
    np.testing.assert_array_equal(np.asarray(z).astype(np.float32), bf.float().cpu().numpy())
    back = torch.from_dlpack(z)
    assert back.data_ptr() == bf.data_ptr() and back.dtype == torch.bfloat16


def _ptr_dl(x) -> int:
    t = cap.open_capsule(x.__dlpack__(max_version=(1, 0)))
    try:
        return t.ptr
    finally:
        t.release()


def test_torch_producer_busy_then_writes_laneflow_reads_the_written_values(rng):
    torch = _partner("torch")
    for _ in range(2):
        xh = random_array(rng, (1 << 16,), np.float32)
        src = torch.from_numpy(xh).cuda()
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # the producer's stream is busy for tens of ms
        t = src * 3  # written only after the sleep
        y = lf.from_dlpack(t)
        got = np.asarray(lf.multiply(y, 2, stream=lf.new_stream(lf.gpu, lanes=4)))
        np.testing.assert_array_equal(got, xh * 3 * 2)


def test_laneflow_producer_busy_then_writes_torch_reads_the_written_values(rng):
    torch = _partner("torch")
    xh = random_array(rng, (1 << 16,), np.float32)
    y = _slow_lf(xh)
    t = torch.from_dlpack(y)  # torch's stream waits for the slow kernel's event
    np.testing.assert_array_equal((t * 2).cpu().numpy(), xh * 2)
    y2 = lf.array(xh, device=lf.gpu) + 1
    lf.eval(y2)
    t2 = torch.as_tensor(y2, device="cuda")  # through __cuda_array_interface__
    assert t2.data_ptr() == _ptr(y2)
    np.testing.assert_array_equal(t2.cpu().numpy(), xh + 1)


def test_imported_torch_memory_is_never_written_by_laneflow(rng):
    torch = _partner("torch")
    xh = random_array(rng, (500,), np.float32)
    t = torch.from_numpy(xh.copy()).cuda()
    y = lf.from_dlpack(t)
    y += 1  # the imported buffer must not be donated to this add
    y[0] = -7
    np.testing.assert_array_equal(np.asarray(y)[1:], xh[1:] + 1)
    np.testing.assert_array_equal(t.cpu().numpy(), xh)


def test_torch_memory_is_released_once_laneflow_is_done(rng):
    torch = _partner("torch")
    from laneflow.runtime.backend import backend_for

    base = cap.live_exports()
    t = torch.from_numpy(random_array(rng, (1 << 20,), np.float32)).cuda()
    y = lf.from_dlpack(t)
    z = y * 2
    del t
    gc.collect()
    lf.eval(z)
    held = torch.cuda.memory_allocated()  # still includes the 4 MiB laneflow imported
    del y, z
    gc.collect()
    lf.synchronize()
    assert backend_for(lf.gpu).context(0).memory.collect_foreign() == 0
    gc.collect()
    assert held - torch.cuda.memory_allocated() >= 4 << 20  # the DLPack deleter ran
    x = lf.ones((1 << 20,), device=lf.gpu)
    t2 = torch.from_dlpack(x)
    del x
    assert cap.live_exports() == base + 1
    del t2
    gc.collect()
    assert cap.live_exports() == base


# -- CuPy ----------------------------------------------------------------------------------------------


def test_cupy_zero_copy_round_trip_and_cuda_array_interface(rng):
    cp = _partner("cupy")
    xh = random_array(rng, (128, 7), np.int32)
    x = lf.array(xh, device=lf.gpu) * 3
    c = cp.from_dlpack(x)
    assert c.data.ptr == _ptr(x)
    np.testing.assert_array_equal(cp.asnumpy(c), xh * 3)
    c2 = cp.asarray(x)  # __cuda_array_interface__
    assert c2.data.ptr == _ptr(x)
    np.testing.assert_array_equal(cp.asnumpy(c2 + 1), xh * 3 + 1)
    ch = cp.asarray(random_array(rng, (33, 4), np.float32))
    y = lf.from_dlpack(ch)
    assert _ptr(y) == ch.data.ptr
    np.testing.assert_allclose(np.asarray(lf.exp(y)), np.exp(cp.asnumpy(ch)), rtol=1e-6)
    only_cai = _CAI(ch.data.ptr, ch.shape, ch.dtype, owner=ch)
    z = lf.from_dlpack(only_cai)
    assert _ptr(z) == ch.data.ptr
    np.testing.assert_array_equal(np.asarray(z), cp.asnumpy(ch))


def test_cupy_strided_and_stream_ordered_imports(rng):
    cp = _partner("cupy")
    base = random_array(rng, (64, 40), np.float64)
    ch = cp.asarray(base)
    y = lf.from_dlpack(ch[:, ::3].T)  # not contiguous: laneflow copies it on its lane
    np.testing.assert_array_equal(np.asarray(y), base[:, ::3].T)
    spin = cp.RawKernel('extern "C" __global__ void spin(long long c) '
                        '{ long long t0 = clock64(); while (clock64() - t0 < c) { } }', "spin")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        spin((1,), (1,), (np.int64(100_000_000),))  # the producer's stream is busy for tens of ms
        out = ch * 2  # written only after the spin
        z = lf.from_dlpack(out)  # cupy passes its current stream s: laneflow's lane waits on s
        z2 = lf.from_dlpack(_CAI(out.data.ptr, out.shape, out.dtype, stream=s.ptr, owner=out))
    np.testing.assert_array_equal(np.asarray(z), base * 2)
    np.testing.assert_array_equal(np.asarray(z2), base * 2)
    with s:
        spin((1,), (1,), (np.int64(100_000_000),))
        out2 = ch * 3
    z3 = lf.from_dlpack(_CAI(out2.data.ptr, out2.shape, out2.dtype, stream=s.ptr, owner=out2))
    np.testing.assert_array_equal(np.asarray(z3), base * 3)
    x = _slow_lf(base[0].astype(np.float32))
    c = cp.from_dlpack(x)
    np.testing.assert_array_equal(cp.asnumpy(c * 1), base[0].astype(np.float32))


# -- JAX -----------------------------------------------------------------------------------------------


def test_jax_zero_copy_round_trip(rng):
    jax = _partner("jax")
    import jax.numpy as jnp

    xh = random_array(rng, (256, 3), np.float32)
    x = lf.tanh(lf.array(xh, device=lf.gpu))
    j = jax.dlpack.from_dlpack(x)
    assert j.unsafe_buffer_pointer() == _ptr(x)
    np.testing.assert_allclose(np.asarray(j * 2), np.tanh(xh) * 2, rtol=1e-6)
    jh = jnp.asarray(random_array(rng, (40, 6), np.float32), device=jax.devices("gpu")[0])
    y = lf.from_dlpack(jh)
    assert _ptr(y) == jh.unsafe_buffer_pointer()
    np.testing.assert_allclose(np.asarray(y - 1), np.asarray(jh) - 1, rtol=1e-6)
    xs = _slow_lf(xh)
    j2 = jax.dlpack.from_dlpack(xs)  # JAX's stream waits for the slow kernel
    np.testing.assert_array_equal(np.asarray(j2 + 0), xh)
