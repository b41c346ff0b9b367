"""Shared fixtures. Every behaviour test takes ``device`` and runs once per backend; without a usable
GPU the gpu cases skip with a one-line reason. Inputs come from ``rng``, freshly seeded per test
(the seed is printed, so pytest shows it with a failure and ``LANEFLOW_TEST_SEED`` replays it).
"""

from __future__ import annotations

import os
import secrets

import numpy as np
import pytest

import laneflow as lf

_GPU_REASON = "no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing"


def pytest_addoption(parser):
    parser.addoption("--fuzz-programs", type=int, default=None,
                     help="programs per differential-fuzz test (default 300 on CPU; e.g. 10000)")


def pytest_configure(config):
    n = config.getoption("--fuzz-programs")
    if n is not None:  # read by tests/test_fuzz.py when it is imported (after this hook)
        os.environ["LANEFLOW_FUZZ_PROGRAMS"] = str(n)


@pytest.fixture(params=["cpu", "gpu"])
def device(request):
    """The backend under test, also made the default device for the test: an op given no stream runs
    on the default one, which on a GPU machine is the GPU, so a cpu case would otherwise test the GPU
    for every op its arrays do not pin (seen on the H200, 2026-12-04)."""
    if request.param == "gpu" and not lf.gpu_available():
        pytest.skip(_GPU_REASON)
    import laneflow.defaults as streams

    dev = lf.Device(request.param)
    old = streams._default_device
    lf.set_default_device(dev)
    yield dev
    streams._default_device = old


@pytest.fixture
def two_gpus():
    """(gpu:0, gpu:1), for tests of arrays spread over two GPUs; skips unless two are usable."""
    n = 0
    if lf.gpu_available():
        from laneflow.runtime.backend import backend_for

        n = backend_for(lf.gpu).count
    if n < 2:
        pytest.skip(f"needs two GPUs; {n} usable here")
    return lf.Device("gpu", 0), lf.Device("gpu", 1)


@pytest.fixture
def cpu_default_device():
    """For tests about CPU lanes: make the CPU the default device even where a GPU is present."""
    import laneflow.defaults as streams

    old = streams._default_device
    lf.set_default_device(lf.cpu)
    yield
    streams._default_device = old


@pytest.fixture
def no_fusion(monkeypatch):
    """Elementwise fusion off (graph/fusion.py): for tests that count commands or trace events per op."""
    from laneflow.graph import fusion

    monkeypatch.setattr(fusion, "_enabled", False)


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(os.environ.get("LANEFLOW_TEST_SEED", secrets.randbits(32)))
    print(f"LANEFLOW_TEST_SEED={seed}")
    return np.random.default_rng(seed)


def run_under_fake_driver(script: str, cwd, timeout: int):
    """``script`` in a fresh interpreter with ``tests/doubles/`` as its argv[1] (it installs
    ``doubles/fake_cuda.py``: the fake driver must never meet a real one), laneflow importable, no disk
    kernel cache."""
    import subprocess
    import sys

    doubles = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles")
    src = os.path.dirname(os.path.dirname(lf.__file__))
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""), LANEFLOW_KERNEL_CACHE="")
    return subprocess.run([sys.executable, "-c", script, doubles], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=str(cwd), check=False)


def run_laneflow_script(script: str, tmp_path, unset: tuple = (), **env) -> str:
    """``script`` in a fresh interpreter, laneflow importable, the disk cache in ``tmp_path / "kc"``,
    the variables ``unset`` removed and ``env`` set; its stdout (the test fails if it fails). For the
    C extensions (``native.py``), which are built or loaded once per process."""
    import subprocess
    import sys

    src = os.path.dirname(os.path.dirname(lf.__file__))
    e = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""),
             LANEFLOW_KERNEL_CACHE=str(tmp_path / "kc"))
    for k in unset:
        e.pop(k, None)
    e.update(env)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=e, timeout=180,
                       cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def stack_inputs(rng, device, x_shape: tuple, layers: int):
    """A residual stack's inputs (``tests/test_early_launch.py``, ``tests/test_speculate.py``): x of
    ``x_shape`` and ``layers`` 8x8 weights, drawn in that order, evaluated on a new 2-lane stream of
    ``device``. Returns ``(stream, x, weights, x as numpy, weights as numpy)``."""
    xn = rng.standard_normal(x_shape)
    wn = [rng.standard_normal((8, 8)) / 3 for _ in range(layers)]
    st = lf.new_stream(device, lanes=2)
    x = lf.array(xn, stream=st)
    ws = [lf.array(w, stream=st) for w in wn]
    lf.eval(x, *ws)
    return st, x, ws, xn, wn


def run_threads(target, n: int) -> None:
    """Run ``target(k)`` on n host threads at once and wait for all of them."""
    import threading

    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def repeat_in_threads(device, prepare, ref: list, reps: int, check_every: int, threads: int = 4) -> None:
    """On ``threads`` host threads at once, each with its own 2-lane stream ``s``: ``step =
    prepare(s)``, then ``reps`` times the arrays ``step()`` gives are evaluated, and compared exactly
    with ``ref`` every ``check_every`` repetitions. The first failure in any thread is raised here."""
    errors: list = []

    def work(t):
        try:
            s = lf.new_stream(device, lanes=2)
            step = prepare(s)
            for rep in range(reps):
                outs = step()
                lf.eval(*outs)
                if rep % check_every == 0:
                    for k, o in enumerate(outs):
                        np.testing.assert_array_equal(np.asarray(o), ref[k])
            s.close()
        except Exception as e:  # noqa: BLE001 - reported below, from the test's thread
            errors.append(e)

    run_threads(work, threads)
    assert not errors, errors[0]


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Fresh random data of a dtype: never zeros; floats in a range every dtype holds exactly enough."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo, hi = (0, 100) if dtype.kind == "u" else (-50, 50)
        return rng.integers(lo, hi, size=shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.uniform(-2.0, 2.0, size=shape) + 1j * rng.uniform(-2.0, 2.0, size=shape)).astype(dtype)
    return rng.uniform(-2.0, 2.0, size=shape).astype(dtype)
