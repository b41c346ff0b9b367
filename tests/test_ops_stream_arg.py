"""Every op takes ``stream=`` (a Stream or a Device), runs there, and gives the same values as without it."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array

# name -> call(x, stream): x is a (3, 4) float32 array with positive entries
CALLS = {
    "add": lambda x, s: lf.add(x, 1.0, stream=s), "subtract": lambda x, s: lf.subtract(x, x, stream=s),
    "multiply": lambda x, s: lf.multiply(x, 2, stream=s), "divide": lambda x, s: lf.divide(x, 3.0, stream=s),
    "floor_divide": lambda x, s: lf.floor_divide(x, 0.5, stream=s), "power": lambda x, s: lf.power(x, 2, stream=s),
    "maximum": lambda x, s: lf.maximum(x, 1.0, stream=s), "minimum": lambda x, s: lf.minimum(x, 1.0, stream=s),
    "negative": lambda x, s: lf.negative(x, stream=s), "abs": lambda x, s: lf.abs(x, stream=s),
    "sign": lambda x, s: lf.sign(x, stream=s), "exp": lambda x, s: lf.exp(x, stream=s),
    "log": lambda x, s: lf.log(x, stream=s), "log1p": lambda x, s: lf.log1p(x, stream=s),
    "sqrt": lambda x, s: lf.sqrt(x, stream=s), "rsqrt": lambda x, s: lf.rsqrt(x, stream=s),
    "square": lambda x, s: lf.square(x, stream=s), "sin": lambda x, s: lf.sin(x, stream=s),
    "cos": lambda x, s: lf.cos(x, stream=s), "tanh": lambda x, s: lf.tanh(x, stream=s),
    "sigmoid": lambda x, s: lf.sigmoid(x, stream=s), "erf": lambda x, s: lf.erf(x, stream=s),
    "where": lambda x, s: lf.where(x > 1, x, 0.0, stream=s), "clip": lambda x, s: lf.clip(x, 0.5, 1.5, stream=s),
    "equal": lambda x, s: lf.equal(x, x, stream=s), "not_equal": lambda x, s: lf.not_equal(x, 1.0, stream=s),
    "less": lambda x, s: lf.less(x, 1.0, stream=s), "less_equal": lambda x, s: lf.less_equal(x, 1.0, stream=s),
    "greater": lambda x, s: lf.greater(x, 1.0, stream=s),
    "greater_equal": lambda x, s: lf.greater_equal(x, 1.0, stream=s),
    "logical_and": lambda x, s: lf.logical_and(x, x > 1, stream=s),
    "logical_or": lambda x, s: lf.logical_or(x > 1, x < 0.5, stream=s),
    "logical_not": lambda x, s: lf.logical_not(x > 1, stream=s), "isnan": lambda x, s: lf.isnan(x, stream=s),
    "isfinite": lambda x, s: lf.isfinite(x, stream=s),
    "sum": lambda x, s: lf.sum(x, 0, stream=s), "mean": lambda x, s: lf.mean(x, stream=s),
    "max": lambda x, s: lf.max(x, 1, stream=s), "min": lambda x, s: lf.min(x, stream=s),
    "prod": lambda x, s: lf.prod(x, 1, stream=s), "var": lambda x, s: lf.var(x, stream=s),
    "std": lambda x, s: lf.std(x, 0, stream=s), "argmax": lambda x, s: lf.argmax(x, 1, stream=s),
    "argmin": lambda x, s: lf.argmin(x, stream=s), "any": lambda x, s: lf.any(x > 1, stream=s),
    "all": lambda x, s: lf.all(x > 0, 0, stream=s), "softmax": lambda x, s: lf.softmax(x, stream=s),
    "logsumexp": lambda x, s: lf.logsumexp(x, 1, stream=s),
    "reshape": lambda x, s: lf.reshape(x, (2, 6), stream=s), "transpose": lambda x, s: lf.transpose(x, stream=s),
    "swapaxes": lambda x, s: lf.swapaxes(x, 0, 1, stream=s), "expand_dims": lambda x, s: lf.expand_dims(x, 1, stream=s),
    "squeeze": lambda x, s: lf.squeeze(x[:1], stream=s), "broadcast_to": lambda x, s: lf.broadcast_to(x, (2, 3, 4), stream=s),
    "flatten": lambda x, s: lf.flatten(x, stream=s), "concatenate": lambda x, s: lf.concatenate([x, x], 1, stream=s),
    "stack": lambda x, s: lf.stack([x, x], stream=s), "take": lambda x, s: lf.take(x, [2, 0], 1, stream=s),
    "astype": lambda x, s: lf.astype(x, lf.float16, stream=s), "matmul": lambda x, s: lf.matmul(x, x.T, stream=s),
    "getitem": lambda x, s: lf.getitem(x, (slice(1, None), [0, 3]), stream=s),
    "setitem": lambda x, s: lf.setitem(x, (0, slice(None)), 7.0, stream=s),
    "array": lambda x, s: lf.array([1, 2], stream=s), "zeros": lambda x, s: lf.zeros((2,), stream=s),
    "ones": lambda x, s: lf.ones((2,), stream=s), "full": lambda x, s: lf.full((2,), 3, stream=s),
    "zeros_like": lambda x, s: lf.zeros_like(x, stream=s), "ones_like": lambda x, s: lf.ones_like(x, stream=s),
    "full_like": lambda x, s: lf.full_like(x, 2.0, stream=s), "arange": lambda x, s: lf.arange(5, stream=s),
    "linspace": lambda x, s: lf.linspace(0, 1, 5, stream=s), "eye": lambda x, s: lf.eye(3, stream=s),
    "random.normal": lambda x, s: lf.random.normal((4,), key=lf.random.key(0), stream=s),
    "random.uniform": lambda x, s: lf.random.uniform((4,), key=lf.random.key(0), stream=s),
    "random.split": lambda x, s: lf.random.split(lf.random.key(0), stream=s),
}


@pytest.mark.parametrize("op", list(CALLS))
def test_every_op_takes_stream_and_runs_there(device, rng, op):
    x_host = np.abs(random_array(rng, (3, 4), lf.float32)) + 0.25
    s = lf.new_stream(device, lanes=2)
    with lf.stream(device):
        x = lf.array(x_host)
        on_s, as_device, default = CALLS[op](x, s), CALLS[op](x, device), CALLS[op](x, None)
    assert on_s.stream is s, f"{op} ran on {on_s.stream}, not on the stream it was given"
    assert as_device.stream is lf.default_stream(device)
    assert on_s.device == device
    want = np.asarray(default)
    for r in (on_s, as_device):
        assert r.dtype == default.dtype and r.shape == default.shape
        assert np.array_equal(np.asarray(r), want, equal_nan=True)


def test_split_takes_stream_for_every_part(device, rng):
    s = lf.new_stream(device, lanes=2)
    with lf.stream(device):
        x = lf.array(random_array(rng, (6, 2), lf.int32))
    parts = lf.split(x, 3, stream=s)
    assert all(p.stream is s for p in parts)
    assert np.array_equal(np.concatenate([np.asarray(p) for p in parts]), np.asarray(x))
