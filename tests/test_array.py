"""lf.Array: properties, host conversions, Python protocols, operators (also reflected and with numpy
on the left), astype, and value semantics (DESIGN.md "Values, not views")."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import laneflow as lf
from conftest import random_array
from opcheck import DTYPES, assert_close, assert_same, expected_dtype, is_float, name, up


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_array_properties_describe_the_value(device, rng, dtype):
    for shape in [(), (0,), (5,), (2, 3, 4), (3, 0, 2)]:
        with lf.stream(device):
            a = lf.array(random_array(rng, shape, dtype))
        assert a.shape == shape and isinstance(a.shape, tuple)
        assert a.dtype == dtype and isinstance(a.dtype, np.dtype)
        assert a.ndim == len(shape)
        assert a.size == int(np.prod(shape))
        assert a.nbytes == a.size * np.dtype(dtype).itemsize
        assert a.device == device


def test_properties_do_not_need_evaluation(device, rng):
    with lf.stream(device):
        x = lf.array(random_array(rng, (64, 32), lf.float32))
        y = lf.exp(x @ x.T).sum(axis=0, keepdims=True)
    assert (y.shape, y.dtype, y.ndim, y.size, y.device) == ((1, 64), lf.float32, 2, 64, device)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_item_returns_a_python_scalar(device, rng, dtype):
    x = np.array(random_array(rng, (), dtype))
    with lf.stream(device):
        a, b = lf.array(x), lf.array(x.reshape(1, 1))
    want = x.item() if np.dtype(dtype) != lf.bfloat16 else float(x)
    for v in (a.item(), b.item()):
        assert type(v) is type(want) and v == want
    assert float(a) == float(x) and int(a) == int(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_tolist_gives_nested_python_lists(device, rng, dtype):
    for shape in [(), (3,), (2, 3), (2, 0)]:
        x = np.array(random_array(rng, shape, dtype))
        with lf.stream(device):
            got = lf.array(x).tolist()
        assert got == x.tolist()


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_numpy_conversion_gives_the_values(device, rng, dtype):
    x = random_array(rng, (3, 4), dtype)
    with lf.stream(device):
        a = lf.array(x) + lf.zeros((), dtype)  # a computed value, not just an upload
    host = np.asarray(a)
    assert host.dtype == dtype and np.array_equal(host.astype(np.float64), up(x).astype(np.float64))
    as_f64 = np.asarray(a, dtype=np.float64)
    assert as_f64.dtype == np.float64 and np.array_equal(as_f64, up(x).astype(np.float64))
    copied = np.array(a, copy=True)
    assert copied.flags.writeable
    copied[...] = 0  # a private copy: the array keeps its values
    assert np.array_equal(np.asarray(a).astype(np.float64), up(x).astype(np.float64))


def test_numpy_view_is_read_only(device, rng):
    with lf.stream(device):
        a = lf.array(random_array(rng, (4,), lf.float32))
    host = np.asarray(a)
    assert not host.flags.writeable
    with pytest.raises(ValueError):
        host[0] = 1.0


def test_repr_and_str_show_values_dtype_and_device(device):
    with lf.stream(device):
        a = lf.array(np.array([[1.5, -2.0], [3.0, 4.25]], np.float32))
        s = lf.array(7, dtype=lf.int8)
    r = repr(a)
    assert r.startswith("array(") and "1.5" in r and "4.25" in r and "float32" in r and str(device) in r
    assert "7" in repr(s) and "int8" in repr(s)
    assert str(a) == str(np.asarray(a))


def test_len_and_iteration_go_over_the_first_axis(device, rng):
    x = random_array(rng, (3, 2), lf.int32)
    with lf.stream(device):
        a = lf.array(x)
        rows = list(a)
    assert len(a) == 3 and len(rows) == 3
    for got, want in zip(rows, x):
        assert_same(got, want)
    with lf.stream(device):
        empty = lf.zeros((0, 3))
    assert len(empty) == 0 and list(empty) == []


def test_len_and_iteration_of_a_0d_array_raise_type_error(device):
    with lf.stream(device):
        a = lf.array(1.0)
    with pytest.raises(TypeError, match="len"):
        len(a)
    with pytest.raises(TypeError, match="iteration"):
        iter(a)


@pytest.mark.parametrize("value,truth", [(0, False), (3, True), (0.0, False), (-0.5, True), (True, True),
                                         ([[0]], False), ([2], True)])
def test_bool_of_a_size_1_array_is_its_truth_value(device, value, truth):
    with lf.stream(device):
        a = lf.array(value)
    assert bool(a) is truth


def test_arrays_are_not_hashable(device):
    with lf.stream(device):
        a = lf.array([1, 2])
    with pytest.raises(TypeError):
        hash(a)


# -- operators ---------------------------------------------------------------------------------------

BINARY_OPERATORS = [
    (operator.add, np.add), (operator.sub, np.subtract), (operator.mul, np.multiply),
    (operator.truediv, np.divide), (operator.floordiv, np.floor_divide), (operator.mod, np.remainder),
    (operator.pow, np.power), (operator.eq, np.equal), (operator.ne, np.not_equal), (operator.lt, np.less),
    (operator.le, np.less_equal), (operator.gt, np.greater), (operator.ge, np.greater_equal),
]


def _operands(rng, dtype, op):
    a, b = random_array(rng, (3, 4), dtype), random_array(rng, (4,), dtype)
    if op in (operator.truediv, operator.floordiv, operator.mod):
        b = np.where(b == 0, np.ones((), dtype), b).astype(dtype)
    if op is operator.pow:
        b = rng.integers(0, 4, size=b.shape).astype(dtype) if not is_float(dtype) else np.abs(b)
        a = np.abs(a) if is_float(dtype) else a
    return a, b


@pytest.mark.parametrize("dtype", [lf.int8, lf.uint8, lf.int64, lf.bfloat16, lf.float32, lf.float64], ids=name)
@pytest.mark.parametrize("op,npfn", BINARY_OPERATORS, ids=lambda f: getattr(f, "__name__", ""))
def test_binary_operators_with_arrays_scalars_and_numpy_on_either_side(device, rng, op, npfn, dtype):
    a, b = _operands(rng, dtype, op)
    s = 2
    out = expected_dtype(npfn, np.dtype(dtype), np.dtype(dtype))
    with lf.stream(device):
        x, y = lf.array(a), lf.array(b)
        both, right_scalar, left_scalar = op(x, y), op(x, s), op(s, y)
        numpy_left, numpy_right = op(a, y), op(x, b)
    with np.errstate(all="ignore"):
        want = npfn(up(a), up(b))
        assert_close(both, want, out, ulps=8)
        assert_close(right_scalar, npfn(up(a), s), expected_dtype(npfn, np.dtype(dtype), s), ulps=8)
        assert_close(left_scalar, npfn(s, up(b)), expected_dtype(npfn, s, np.dtype(dtype)), ulps=8)
    assert isinstance(numpy_left, lf.Array), "numpy on the left must defer to lf.Array"
    assert_close(numpy_left, want, out, ulps=8)
    assert_close(numpy_right, want, out, ulps=8)


def test_float_and_numpy_scalar_operators_on_the_left(device, rng):
    x = random_array(rng, (5,), lf.float32)
    with lf.stream(device):
        a = lf.array(x)
        r1, r2, r3, r4 = 1.5 - a, np.float32(2) * a, 2.0 / a, np.float64(1) + a
    assert isinstance(r2, lf.Array) and isinstance(r4, lf.Array)
    assert_close(r1, 1.5 - x)
    assert_close(r2, np.float32(2) * x)
    assert_close(r3, 2.0 / x)
    assert_close(r4, np.float64(1) + x)


@pytest.mark.parametrize("dtype", [lf.int32, lf.float16, lf.float64], ids=name)
def test_matmul_operator_with_numpy_on_either_side(device, rng, dtype):
    a, b = random_array(rng, (2, 3), dtype), random_array(rng, (3, 4), dtype)
    with lf.stream(device):
        x, y = lf.array(a), lf.array(b)
        r1, r2, r3 = x @ y, a @ y, x @ b
    want = np.matmul(up(a).astype(np.float64), up(b).astype(np.float64))
    for r in (r1, r2, r3):
        assert isinstance(r, lf.Array)
        assert_close(r, want, dtype, ulps=16)


@pytest.mark.parametrize("dtype", [lf.int8, lf.uint8, lf.int64, lf.float16, lf.float64], ids=name)
def test_unary_operators(device, rng, dtype):
    x = random_array(rng, (6,), dtype)
    with lf.stream(device):
        a = lf.array(x)
        neg, pos, ab = -a, +a, abs(a)
    with np.errstate(all="ignore"):
        assert_same(neg, -up(x), dtype)
    assert_same(pos, x)
    assert_same(ab, np.abs(up(x)), dtype)


def test_logical_operators_on_bool_arrays(device, rng):
    p, q = random_array(rng, (8,), lf.bool_), random_array(rng, (8,), lf.bool_)
    with lf.stream(device):
        a, b = lf.array(p), lf.array(q)
        r = (a & b, a | b, ~a, a & True, False | b, p & b, a | q)
    for got, want in zip(r, (p & q, p | q, ~p, p & True, False | q, p & q, p | q)):
        assert_same(got, want)


def test_comparison_operators_return_arrays_not_bools(device):
    with lf.stream(device):
        a = lf.array([1, 2, 3])
        eq = a == 2
    assert isinstance(eq, lf.Array)
    assert_same(eq, np.array([False, True, False]))


@pytest.mark.parametrize("dtype", DTYPES, ids=name)
def test_astype_method(device, rng, dtype):
    x = random_array(rng, (2, 3), lf.float32)
    x = np.abs(x) if np.dtype(dtype).kind == "u" else x
    with lf.stream(device):
        got = lf.array(x).astype(dtype)
    assert_same(got, x.astype(dtype))


# -- value semantics ---------------------------------------------------------------------------------


def test_a_slice_is_a_value_not_a_view(device, rng):
    x = random_array(rng, (4,), lf.float64)
    with lf.stream(device):
        a = lf.array(x)
        y = a[0:2]
        a[0] = 5.0
    assert_same(y, x[0:2])
    want = x.copy()
    want[0] = 5.0
    assert_same(a, want)


@pytest.mark.parametrize("evaluate_first", [False, True], ids=["lazy", "evaluated"])
def test_results_computed_before_an_assignment_keep_the_old_value(device, rng, evaluate_first):
    x = random_array(rng, (3, 3), lf.int32)
    with lf.stream(device):
        a = lf.array(x)
        z, t, s = a + 1, a.T, a.sum()
        if evaluate_first:
            lf.eval(z, t, s)
        a[1] = 100
        a[:, 0] = -1
        after = a + 1
    assert_same(z, x + 1)
    assert_same(t, x.T)
    assert_same(s, x.sum())
    want = x.copy()
    want[1], want[:, 0] = 100, -1
    assert_same(after, want + 1)


def test_every_name_bound_to_the_array_sees_the_assignment(device, rng):
    x = random_array(rng, (3,), lf.float32)
    with lf.stream(device):
        a = lf.array(x)
        alias = a
        holder = {"k": a}
        a[1] = 9.0
    want = x.copy()
    want[1] = 9.0
    assert alias is a
    assert_same(alias, want)
    assert_same(holder["k"], want)


def test_numpy_view_taken_before_an_assignment_does_not_change(device, rng):
    x = random_array(rng, (4,), lf.float32)
    with lf.stream(device):
        a = lf.array(x) * 1  # computed on the device
        host = np.asarray(a)
        a[...] = 0.0
        a[2] = 7.0
    assert np.array_equal(host, x * 1)
    assert_same(a, np.array([0, 0, 7, 0], np.float32))


def test_a_copy_made_with_lf_array_is_independent(device, rng):
    x = random_array(rng, (3,), lf.int64)
    with lf.stream(device):
        a = lf.array(x)
        b = lf.array(a)
        b[0] = 42
        a[1] = -42
    assert_same(a, np.array([x[0], -42, x[2]]))
    assert_same(b, np.array([42, x[1], x[2]]))


def test_repeated_assignments_in_a_loop_apply_in_program_order(device):
    with lf.stream(device):
        a = lf.zeros((8,), lf.int64)
        snapshots = []
        for i in range(8):
            a[i] = i * i
            a[: i] = a[: i] + 1
            snapshots.append(a[: i + 1].sum())
    want = np.zeros(8, np.int64)
    wants = []
    for i in range(8):
        want[i] = i * i
        want[:i] += 1
        wants.append(want[: i + 1].sum())
    assert_same(a, want)
    for got, w in zip(snapshots, wants):
        assert_same(got, w)


def test_value_semantics_hold_across_streams(device, rng):
    x = random_array(rng, (256,), lf.float32)
    other = lf.new_stream(device, lanes=2)
    with lf.stream(device):
        a = lf.array(x)
        y = lf.exp(a, stream=other)  # reads a on another stream
        a[:] = 0.0  # a later write must not change what y reads
        z = lf.sum(a)
    assert_close(y, np.exp(x))
    assert_same(z, np.array(0.0, np.float32))


def test_eval_accepts_nested_containers_and_returns_none(device, rng):
    with lf.stream(device):
        a = lf.array(random_array(rng, (3,), lf.float32))
        b, c = a + 1, a * 2
        assert lf.eval([b, {"c": c}], (a,)) is None
    assert_same(b, np.asarray(a) + 1)
    assert_same(c, np.asarray(a) * 2)


def test_dlpack_device_and_numpy_from_dlpack(device, rng):
    x = random_array(rng, (2, 3), lf.float32)
    with lf.stream(device):
        a = lf.array(x) + 1
        back = lf.from_dlpack(x)
    assert a.__dlpack_device__() == ((1, 0) if device.type == "cpu" else (2, device.index))  # kDLCPU, kDLCUDA
    assert_same(back, x)
    if device.type == "cpu":
        assert np.array_equal(np.from_dlpack(a), x + 1)


def test_numpy_copy_false_refuses_a_dtype_change(device):
    with lf.stream(device):
        a = lf.array([1.0, 2.0])
    assert not np.asarray(a, copy=False).flags.writeable
    with pytest.raises(ValueError, match="copy"):
        np.asarray(a, dtype=np.float32, copy=False)
    assert np.asarray(a, dtype=np.float32).dtype == np.float32


@pytest.mark.parametrize("make", [
    lambda a: a.reshape(a.shape), lambda a: a.astype(a.dtype), lambda a: a.transpose((0, 1)),
    lambda a: lf.broadcast_to(a, a.shape), lambda a: a[:], lambda a: a[...], lambda a: lf.array(a),
    lambda a: lf.squeeze(a), lambda a: lf.expand_dims(a, 0)[0],
], ids=["reshape", "astype", "transpose", "broadcast_to", "slice", "ellipsis", "array", "squeeze", "expand_dims"])
def test_ops_that_change_nothing_still_give_independent_values(device, rng, make):
    x = random_array(rng, (3, 4), lf.float32)
    with lf.stream(device):
        a = lf.array(x)
        b = make(a)
        b[0, 0] = 100.0
        a[1, 1] = -100.0
    wa, wb = x.copy(), x.copy()
    wa[1, 1], wb[0, 0] = -100.0, 100.0
    assert_same(a, wa)
    assert_same(b, wb)


@pytest.mark.parametrize("dtype", [lf.int8, lf.bfloat16, lf.float64], ids=name)
def test_assignments_that_read_the_array_they_write(device, rng, dtype):
    x = random_array(rng, (6, 3), dtype)
    with lf.stream(device):
        a = lf.array(x)
        a[1:] = a[:-1]  # overlapping shift: the right side is the value before the assignment
        a[0] = a[5]
        a[:, 0] = a[:, 2] * 2
        a[[0, 2]] = a[[2, 0]]
    want = x.copy()
    want[1:] = want[:-1].copy()
    want[0] = want[5]
    want[:, 0] = up(want[:, 2]) * 2
    want[[0, 2]] = want[[2, 0]].copy()
    assert_same(a, want)


def test_augmented_assignment_updates_the_object_like_numpy(device, rng):
    xn = rng.standard_normal(5)
    with lf.stream(device):
        x = lf.array(xn)
        alias = x
        before = x * 1.0
        x += 2.0
        x *= lf.array(xn)
        ref = xn.copy()
        ref_alias = ref
        ref += 2.0
        ref *= xn
    assert alias is x
    np.testing.assert_array_equal(np.asarray(alias), ref_alias)
    np.testing.assert_array_equal(np.asarray(before), xn)


def test_augmented_assignment_keeps_dtype_and_shape_or_refuses(device):
    with lf.stream(device):
        x = lf.array([1.0, 2.0], dtype=lf.float32)
        x += lf.array([1.0, 1.0])          # float64 result cast back (same kind)
        assert x.dtype == lf.float32 and x.tolist() == [2.0, 3.0]
        i = lf.array([1, 2])
        with pytest.raises(TypeError, match=r"\+=: cannot cast the float64 result"):
            i += 1.5
        with pytest.raises(ValueError, match=r"\+=: the result of shape \(2, 2\)"):
            i += lf.array([[1], [2]])


def test_arrays_and_devices_pickle_by_value(device, rng):
    import pickle

    xn = rng.standard_normal((3, 4)).astype(np.float32)
    with lf.stream(device):
        x = lf.array(xn) * 2
    y = pickle.loads(pickle.dumps(x))
    assert y is not x and y.device == device and y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y), xn * 2)
    assert pickle.loads(pickle.dumps(lf.Device("cpu"))) == lf.cpu


def test_a_device_is_one_object_however_it_is_named():
    """Devices are interned: the hot paths compare them by identity (in Python and in C) and fall back to
    ``__eq__`` only for an equal object of a subclass."""
    import copy
    import pickle

    for d in (lf.cpu, lf.gpu, lf.Device("gpu", 3)):
        assert lf.Device(d.type, d.index) is d and lf.Device(d.type, np.int64(d.index).item()) is d
        assert pickle.loads(pickle.dumps(d)) is d and copy.copy(d) is d and copy.deepcopy(d) is d
    assert lf.new_stream("cpu", lanes=1).device is lf.cpu
    assert lf.Device("gpu", 1) is not lf.Device("gpu", 2) and lf.Device("gpu", 1) != lf.gpu
    with pytest.raises(ValueError, match="index must be a non-negative int"):
        lf.Device("gpu", True)


def test_a_device_subclass_makes_its_own_objects():
    """Only Device itself is interned: a subclass may take arguments and hold state of its own (as before
    interning), and its objects equal the interned device."""
    from laneflow.device import Device

    class Named(Device):
        __slots__ = ()

        def __init__(self, type, index=0):
            super().__init__(type, index)

    class Tagged(Device):
        __slots__ = ("tag",)

        def __init__(self, type, index=0, tag=None):
            super().__init__(type, index)
            object.__setattr__(self, "tag", tag)

    n = Named("gpu", 1)
    assert n == lf.Device("gpu", 1) and n is not lf.Device("gpu", 1) and type(n) is Named
    a, b = Tagged("gpu", 1, tag="a"), Tagged("gpu", 1, tag="b")
    assert a is not b and (a.tag, b.tag) == ("a", "b") and a == b
    with pytest.raises(TypeError, match="takes a type and an index"):
        lf.Device("gpu", 1, "extra")
