"""A numpy float64 scalar promotes as numpy 2 says (it is not weak), and on the GPU laneflow warns once
when it turns a float16/bfloat16 computation into float64 (the ``x * (1 / np.sqrt(d))`` trap)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import run_under_fake_driver

import laneflow as lf
from laneflow.ops import elementwise


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(elementwise, "_warned_upcast", False)


@pytest.mark.parametrize("half", [lf.float16, lf.bfloat16])
def test_a_numpy_float64_scalar_promotes_like_numpy_and_warns_once_on_the_gpu(device, rng, half, fresh_warning):
    xn = rng.standard_normal((4, 3)).astype(np.float32).astype(half)
    scale = np.float64(1 / np.sqrt(3.0))
    with lf.stream(device):
        x = lf.array(xn)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            y = x * scale
            z = scale * x + 1.0              # a second time: no second warning
            w = x * float(scale)             # a Python float is weak: stays half, never warns
            v = x * np.float32(scale)        # a float32 numpy scalar: float32, no warning
    assert y.dtype == np.result_type(np.float16, scale) == np.float64
    assert z.dtype == np.float64 and w.dtype == half and v.dtype == np.float32
    ref = xn.astype(np.float64) * scale
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(w).astype(np.float64), ref, rtol=1e-2)
    ours = [m for m in seen if issubclass(m.category, lf.PrecisionWarning)]
    if device.type == "gpu":
        assert len(ours) == 1, [str(m.message) for m in seen]
        msg = str(ours[0].message)
        assert "multiply" in msg and str(np.dtype(half)) in msg and repr(float(scale)) in msg, msg
        assert "float(value)" in msg, msg
        assert ours[0].filename == __file__, ours[0].filename  # points at the user's line
    else:
        assert ours == [], [str(m.message) for m in ours]


def test_a_float32_graph_is_not_warned_about(device, fresh_warning):
    with lf.stream(device):
        x = lf.ones((3,), dtype=lf.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = x * np.float64(0.5)          # float32 with a float64 scalar: float64, as numpy, silent
    assert y.dtype == np.float64


def test_the_warning_on_the_fake_gpu_driver(tmp_path):
    """The GPU branch on any machine: the fake driver runs op construction for lf.gpu."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")
    script = r'''
import sys, warnings
sys.path.insert(0, sys.argv[1])
import fake_cuda
fake_cuda.install()
import numpy as np
import laneflow as lf
with lf.stream(lf.gpu):
    x = lf.ones((2, 8), dtype=lf.bfloat16)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        y = (x @ lf.ones((8, 8), dtype=lf.bfloat16)) * np.float64(0.125)
        y2 = x / np.sqrt(np.float64(8.0))
assert y.dtype == np.float64 and y2.dtype == np.float64, (y.dtype, y2.dtype)
ours = [m for m in seen if issubclass(m.category, lf.PrecisionWarning)]
assert len(ours) == 1, [str(m.message) for m in seen]
print(ours[0].filename, ours[0].lineno, str(ours[0].message))
'''
    r = run_under_fake_driver(script, tmp_path, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    where, line, msg = r.stdout.split(" ", 2)
    expected = next(i for i, t in enumerate(script.split("\n"), 1) if "np.float64(0.125)" in t)
    assert where == "<string>" and int(line) == expected, r.stdout
    assert msg.startswith("multiply: the numpy float64 scalar 0.125 makes this bfloat16 computation float64"), msg
