"""A battery of invalid calls over the public API: each raises the documented exception type with a
message naming the op, and the runtime stays usable: an independent computation afterwards equals
numpy's. Cases are crossed with dtypes, giving well over a hundred calls."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf

_A = lambda d: lf.ones((2, 3), dtype=d)  # noqa: E731
_B = lambda d: lf.ones((4, 5), dtype=d)  # noqa: E731

#: (name in the message, exception type, the call given a dtype)
CASES = [
    ("add", ValueError, lambda d: lf.add(_A(d), _B(d))),
    ("matmul", ValueError, lambda d: lf.matmul(_A(d), _A(d))),
    ("reshape", ValueError, lambda d: _A(d).reshape(4, 2)),
    ("sum", ValueError, lambda d: lf.sum(_A(d), axis=5)),
    ("transpose", ValueError, lambda d: lf.transpose(_A(d), (0, 0))),
    ("concatenate", ValueError, lambda d: lf.concatenate([_A(d), _B(d)])),
    ("take", IndexError, lambda d: lf.take(_A(d), [7], axis=0)),
    ("getitem", IndexError, lambda d: _A(d)[5]),
    ("softmax", ValueError, lambda d: lf.softmax(_A(d), axis=3)),
    ("cholesky", (ValueError, TypeError), lambda d: lf.linalg.cholesky(_A(d))),
    ("layer_norm", (ValueError, TypeError), lambda d: lf.nn.layer_norm(_A(d), lf.ones(4, dtype=d))),
    ("split", ValueError, lambda d: lf.split(_A(d), 4, axis=1)),
    ("broadcast_to", ValueError, lambda d: lf.broadcast_to(_A(d), (3, 3))),
    ("dynamic_slice", ValueError, lambda d: lf.dynamic_slice(_A(d), (0,), (1, 1))),
    ("dynamic_update_slice", ValueError, lambda d: lf.dynamic_update_slice(_A(d), _B(d), (0, 0))),
    ("stack", ValueError, lambda d: lf.stack([_A(d), _B(d)])),
    ("expand_dims", ValueError, lambda d: lf.expand_dims(_A(d), 5)),
    ("squeeze", ValueError, lambda d: lf.squeeze(_A(d), 0)),
    ("clip", TypeError, lambda d: lf.clip(_A(d), "x", 1)),
    ("where", ValueError, lambda d: lf.where(lf.ones((3, 3)) > 0, _A(d), _B(d))),
    ("argmax", ValueError, lambda d: lf.argmax(_A(d), axis=4)),
    ("scaled_dot_product_attention", (ValueError, TypeError), lambda d: lf.nn.scaled_dot_product_attention(_A(d), _A(d), _A(d))),
    ("var", ValueError, lambda d: lf.var(_A(d), ddof=-1)),
    ("swapaxes", ValueError, lambda d: lf.swapaxes(_A(d), 0, 3)),
    ("bitwise_and", TypeError, lambda d: _A(d) & _A(d).astype(lf.float32)),  # & of floats: the op behind & named
    ("setitem", ValueError, lambda d: lf.setitem(_A(d), 0, lf.ones((5,), dtype=d))),
]
DTYPES = ["float32", "float64", "int32", "bfloat16"]
#: calls that do not depend on a dtype
PLAIN = [
    ("zeros", ValueError, lambda: lf.zeros((-1,))),
    ("astype", TypeError, lambda: lf.ones(2).astype(np.clongdouble)),
    ("arange", ValueError, lambda: lf.arange(0, 10, 0)),
    ("eye", ValueError, lambda: lf.eye(-2)),
    ("random.normal", ValueError, lambda: lf.random.normal((2,), key=5.5)),
    ("full", TypeError, lambda: lf.full((2,), "x")),
    ("array", TypeError, lambda: lf.array(["a"])),
    ("compile", TypeError, lambda: lf.compile(3)),
    ("compile", TypeError, lambda: lf.compile(lambda x: x, donate_argnums=(-1,))),
    ("new_stream", (ValueError, TypeError), lambda: lf.new_stream(lf.cpu, lanes=0)),
]


def _still_usable(rng):
    x = rng.standard_normal((5, 7))
    terms = np.tanh(x) * 2
    # a row's sum may cancel to near zero (the H200 run saw 4.9e-5 off by 1 ulp of its terms): the
    # tolerance is in units of the terms' size, not of the sum's
    np.testing.assert_allclose(np.asarray(lf.sum(lf.tanh(lf.array(x)) * 2, axis=1)), terms.sum(axis=1),
                               rtol=1e-12, atol=1e-13 * np.abs(terms).sum(axis=1).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_invalid_calls_raise_naming_the_op_and_leave_the_runtime_usable(case, dtype, rng):
    name, exc, call = case
    d = np.dtype(lf.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    with pytest.raises(exc) as info:
        r = call(d)
        lf.eval(r)  # (an error at run time counts too)
    assert name in str(info.value), str(info.value)
    _still_usable(rng)


@pytest.mark.parametrize("case", PLAIN, ids=[c[0] for c in PLAIN])
def test_invalid_plain_calls(case, rng):
    name, exc, call = case
    with pytest.raises(exc) as info:
        call()
    assert name in str(info.value), str(info.value)
    _still_usable(rng)


def test_the_battery_is_over_a_hundred_calls():
    assert len(CASES) * len(DTYPES) + len(PLAIN) >= 100
