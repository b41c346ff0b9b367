"""Invalid calls raise at op construction with the right exception type and a message that names the op
(and the shapes, dtypes or values involved); failures while running raise lf.ExecutionError at the eval
that needs the result, naming the failing op, and leave the runtime usable."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf


@pytest.fixture
def x(device):
    with lf.stream(device):
        return lf.ones((2, 3))


# (id, call taking the (2, 3) float64 array x, exception type, regex the message must match)
INVALID = [
    # shapes: broadcasting, matmul, reshape, concatenate, stack, split, broadcast_to
    ("add-broadcast", lambda x: x + lf.ones((4,)), ValueError, r"add: .*\(2, 3\).*\(4,\)"),
    ("where-broadcast", lambda x: lf.where(lf.ones((3, 2)) > 0, x, 0.0), ValueError, r"where: .*\(3, 2\).*\(2, 3\)"),
    ("matmul-inner", lambda x: x @ lf.ones((4, 5)), ValueError, r"matmul: .*\(2, 3\) float64.*\(4, 5\) float64"),
    ("matmul-0d", lambda x: lf.matmul(lf.array(1.0), x), ValueError, r"matmul: .*at least 1-D.*\(\)"),
    ("matmul-batch", lambda x: lf.ones((2, 2, 3)) @ lf.ones((3, 3, 4)), ValueError, r"matmul: batch.*\(2, 2, 3\).*\(3, 3, 4\)"),
    ("reshape-size", lambda x: x.reshape(4), ValueError, r"reshape: .*\(2, 3\).*\(4,\)"),
    ("reshape-two-unknowns", lambda x: x.reshape(-1, -1), ValueError, r"reshape: .*\(-1, -1\)"),
    ("reshape-ambiguous-empty", lambda x: lf.zeros((0, 3)).reshape(0, -1), ValueError, r"reshape: .*\(0, 3\)"),
    ("reshape-float-size", lambda x: x.reshape(1.5, 4), TypeError, r"reshape: .*1\.5"),
    ("concatenate-shapes", lambda x: lf.concatenate([x, lf.ones((3, 4))]), ValueError, r"concatenate: .*\(2, 3\).*\(3, 4\)"),
    ("concatenate-ndim", lambda x: lf.concatenate([x, lf.ones((3,))]), ValueError, r"concatenate: .*\(2, 3\).*\(3,\)"),
    ("concatenate-empty", lambda x: lf.concatenate([]), ValueError, r"concatenate: .*non-empty"),
    ("concatenate-0d", lambda x: lf.concatenate([lf.array(1.0), lf.array(2.0)]), ValueError, r"concatenate: zero-dim"),
    ("stack-shapes", lambda x: lf.stack([x, lf.ones((3, 2))]), ValueError, r"stack: .*\(2, 3\).*\(3, 2\)"),
    ("split-unequal", lambda x: lf.split(x, 2, axis=1), ValueError, r"split: axis 1 of size 3.*2"),
    ("split-0d", lambda x: lf.split(lf.array(1.0), 1), ValueError, r"split: .*0-d"),
    ("split-float-index", lambda x: lf.split(x, [1.5]), TypeError, r"split: .*1\.5"),
    ("broadcast_to", lambda x: lf.broadcast_to(x, (3, 3)), ValueError, r"broadcast_to: .*\(2, 3\).*\(3, 3\)"),
    ("broadcast_to-fewer-dims", lambda x: lf.broadcast_to(x, (3,)), ValueError, r"broadcast_to: .*\(2, 3\).*\(3,\)"),
    ("zeros-negative", lambda x: lf.zeros((-1, 2)), ValueError, r"zeros: negative dimension.*\(-1, 2\)"),
    ("zeros-float-size", lambda x: lf.zeros((1.5,)), TypeError, r"zeros: .*1\.5"),
    # axes
    ("sum-axis", lambda x: lf.sum(x, axis=2), ValueError, r"sum: axis 2 .*2 dimensions"),
    ("max-negative-axis", lambda x: lf.max(x, axis=-3), ValueError, r"max: axis -3"),
    ("mean-repeated-axis", lambda x: lf.mean(x, axis=(1, -1)), ValueError, r"mean: repeated axis"),
    ("sum-float-axis", lambda x: lf.sum(x, axis=1.5), TypeError, r"sum: axis must be an int"),
    ("argmax-axis", lambda x: lf.argmax(x, axis=2), ValueError, r"argmax: axis 2"),
    ("softmax-axis", lambda x: lf.softmax(x, axis=2), ValueError, r"softmax: axis 2"),
    ("logsumexp-repeated", lambda x: lf.logsumexp(x, axis=(0, 0)), ValueError, r"logsumexp: repeated axis"),
    ("transpose-not-permutation", lambda x: lf.transpose(x, (0, 0)), ValueError, r"transpose: .*\(0, 0\).*\(2, 3\)"),
    ("squeeze-not-one", lambda x: lf.squeeze(x, 0), ValueError, r"squeeze: axis 0 of \(2, 3\) float64 has size 2"),
    ("expand_dims-axis", lambda x: lf.expand_dims(x, 5), ValueError, r"expand_dims: axis 5"),
    ("swapaxes-axis", lambda x: lf.swapaxes(x, 0, 2), ValueError, r"swapaxes: axis 2"),
    ("flatten-order", lambda x: lf.flatten(lf.ones((2, 3, 4)), 2, 1), ValueError, r"flatten: start_axis 2"),
    ("take-axis", lambda x: lf.take(x, [0], axis=2), ValueError, r"take: axis 2"),
    ("concatenate-axis", lambda x: lf.concatenate([x, x], axis=2), ValueError, r"concatenate: axis 2"),
    # empty reductions without an identity
    ("max-empty", lambda x: lf.max(lf.zeros((0, 2)), axis=0), ValueError, r"max: .*\(0, 2\)"),
    ("argmin-empty", lambda x: lf.argmin(lf.zeros((0,))), ValueError, r"argmin: .*empty.*\(0,\)"),
    ("var-ddof", lambda x: lf.var(x, ddof=-1), ValueError, r"var: ddof"),
    # dtypes
    ("zeros-clongdouble", lambda x: lf.zeros((2,), np.clongdouble), TypeError, r"zeros: .*clongdouble"),
    ("ones-str", lambda x: lf.ones((2,), str), TypeError, r"ones: .*str"),
    ("astype-str", lambda x: x.astype("str"), TypeError, r"astype: .*'str'"),
    ("astype-int16", lambda x: x.astype(np.int16), TypeError, r"astype: .*int16"),
    ("array-strings", lambda x: lf.array(["a", "b"]), TypeError, r"array: .*<U1"),
    ("array-strings", lambda x: lf.array(np.array(["a"])), TypeError, r"array: .*<U1"),
    ("array-ragged", lambda x: lf.array([[1, 2], [3]]), ValueError, r"array: "),
    ("array-uint64-too-big", lambda x: lf.array(np.array([2**63], np.uint64)), OverflowError, r"array: .*uint64"),
    ("add-str", lambda x: lf.add(x, "a"), TypeError, r"add: .*str"),
    ("add-string-host-data", lambda x: lf.add(x, np.array(["ab"])), TypeError, r"add: .*<U2"),
    ("stack-empty", lambda x: lf.stack([]), ValueError, r"stack: .*non-empty"),
    ("exp-None", lambda x: lf.exp(None), TypeError, r"exp: .*NoneType"),
    ("subtract-bool", lambda x: lf.subtract(x > 0, x > 0), TypeError, r"subtract: .*bool"),
    ("negative-bool", lambda x: -(x > 0), TypeError, r"negative: .*bool"),
    ("sign-bool", lambda x: lf.sign(x > 0), TypeError, r"sign: .*bool"),
    ("invert-float", lambda x: ~x, TypeError, r"bitwise_invert: .*float64"),
    ("and-float", lambda x: lf.array([1.0]) & lf.array([3.0]), TypeError, r"bitwise_and: .*float64"),
    ("random-int-dtype", lambda x: lf.random.normal((2,), dtype=lf.int32), TypeError, r"random.normal: .*int32"),
    ("random-bool-dtype", lambda x: lf.random.uniform((2,), dtype=bool), TypeError, r"random.uniform: .*bool"),
    # Python scalars that do not fit the array's integer dtype (numpy 2 refuses them too)
    ("int8-plus-1000", lambda x: lf.array([1], dtype=lf.int8) + 1000, OverflowError, r"add: .*1000.*int8"),
    ("1000-plus-int8", lambda x: 1000 + lf.array([1], dtype=lf.int8), OverflowError, r"add: .*1000.*int8"),
    ("uint8-times-minus-1", lambda x: lf.array([1], dtype=lf.uint8) * -1, OverflowError, r"multiply: .*-1.*uint8"),
    ("where-1000-int8", lambda x: lf.where(x[0] > 0, lf.array([1, 2, 3], dtype=lf.int8), 1000), OverflowError,
     r"where: .*1000.*int8"),
    ("full-300-int8", lambda x: lf.full((2,), 300, lf.int8), OverflowError, r"full: .*300.*int8"),
    ("int-power-negative-scalar", lambda x: lf.array([2, 3]) ** -1, ValueError, r"power: .*negative.*int64"),
    # streams and devices
    ("stream-42", lambda x: lf.add(x, 1, stream=42), TypeError, r"add: stream= .*int"),
    ("stream-tpu", lambda x: lf.exp(x, stream="tpu"), ValueError, r"exp: .*'tpu'"),
    ("device-tpu", lambda x: lf.array([1], device="tpu"), ValueError, r"array: bad device='tpu'"),
    ("device-negative-index", lambda x: lf.zeros((2,), device="gpu:-1"), ValueError, r"zeros: bad device='gpu:-1'"),
    ("device-and-stream", lambda x: lf.array([1], device=lf.cpu, stream=lf.default_stream(lf.cpu)), ValueError,
     r"array: give device= or stream="),
    ("Device-gpu-minus-1", lambda x: lf.Device("gpu", -1), ValueError, r"Device: index .*-1"),
    ("Device-tpu", lambda x: lf.Device("tpu"), ValueError, r"Device: unknown device type 'tpu'"),
    ("Device-cpu-1", lambda x: lf.Device("cpu", 1), ValueError, r"Device: .*cpu.*1"),
    ("lanes-0", lambda x: lf.new_stream(lf.cpu, lanes=0), ValueError, r"new_stream: lanes .*1 to 64.*0"),
    ("lanes-65", lambda x: lf.new_stream(lf.cpu, lanes=65), ValueError, r"new_stream: lanes .*65"),
    ("lanes-1.5", lambda x: lf.new_stream(lf.cpu, lanes=1.5), ValueError, r"new_stream: lanes .*1\.5"),
    ("lanes-True", lambda x: lf.new_stream(lf.cpu, lanes=True), ValueError, r"new_stream: lanes .*True"),
    ("new_stream-tpu", lambda x: lf.new_stream("tpu"), ValueError, r"new_stream: .*'tpu'"),
    ("stream-context-42", lambda x: lf.stream(42).__enter__(), TypeError, r"stream: .*int"),
    ("synchronize-42", lambda x: lf.synchronize(42), TypeError, r"synchronize: .*int"),
    # indices
    ("getitem-too-many", lambda x: x[0, 0, 0], IndexError, r"getitem: too many indices .*\(2, 3\)"),
    ("getitem-int-out-of-range", lambda x: x[2], IndexError, r"getitem: index 2 .*axis 0 with size 2"),
    ("getitem-negative-out-of-range", lambda x: x[0, -4], IndexError, r"getitem: index -4 .*axis 1 with size 3"),
    ("getitem-list-out-of-range", lambda x: x[[0, 5]], IndexError, r"getitem: index 5 .*axis 0 with size 2"),
    ("getitem-later-axis-out-of-range", lambda x: x[:, [0, 3]], IndexError, r"getitem: index 3 .*axis 1 with size 3"),
    ("getitem-float-array", lambda x: x[lf.array([0.0, 1.0])], IndexError, r"getitem: .*integer dtype.*float64"),
    ("getitem-float-list", lambda x: x[[0.5]], IndexError, r"getitem: .*integer dtype.*float64"),
    ("getitem-float", lambda x: x[1.5], IndexError, r"getitem: .*1\.5"),
    # a laneflow bool mask is read on the host (eager only), then checked as a numpy one
    ("getitem-bool-lf-mask-shape", lambda x: x[lf.array([True, False, True])], IndexError,
     r"getitem: boolean index .*\(3,\)"),
    ("getitem-0d-bool-array", lambda x: x[np.array(False)], TypeError, r"getitem: a boolean scalar"),
    ("getitem-mask-shape", lambda x: x[np.array([True, False, True])], IndexError, r"getitem: boolean index .*\(3,\)"),
    ("getitem-two-ellipses", lambda x: x[..., ...], IndexError, r"getitem: .*single ellipsis"),
    ("take-float-indices", lambda x: lf.take(x, [0.5]), IndexError, r"take: .*integer dtype"),
    ("take-host-out-of-range", lambda x: lf.take(x, [6]), IndexError, r"take: index 6 .*size 6"),
    ("take-host-out-of-range-axis", lambda x: lf.take(x, [-3], axis=0), IndexError, r"take: index -3 .*axis 0 of size 2"),
    # slice assignment
    ("setitem-broadcast", lambda x: x.__setitem__(0, lf.ones((2,))), ValueError, r"setitem: .*\(2,\).*\(3,\)"),
    ("setitem-broadcast-host", lambda x: x.__setitem__(slice(None), np.ones((3, 3))), ValueError,
     r"setitem: .*\(3, 3\).*\(2, 3\)"),
    ("setitem-str", lambda x: x.__setitem__(0, "a"), TypeError, r"setitem: .*'a'"),
    ("setitem-complex", lambda x: x.__setitem__(0, 1 + 2j), TypeError, r"setitem: .*complex"),
    ("setitem-bool-lf-mask-shape", lambda x: x.__setitem__(lf.array([[True] * 2] * 2), 0.0), IndexError,
     r"setitem: boolean index"),
    ("setitem-float-index", lambda x: x.__setitem__(lf.array([0.0]), 0.0), IndexError, r"setitem: .*integer dtype"),
    ("setitem-overflow", lambda x: lf.array([1, 2], dtype=lf.int8).__setitem__(0, 1000), OverflowError,
     r"setitem: .*1000.*int8"),
    ("setitem-out-of-range", lambda x: x.__setitem__((0, 3), 1.0), IndexError, r"setitem: index 3"),
    ("setitem-list-out-of-range", lambda x: x.__setitem__([0, 2], 1.0), IndexError, r"setitem: index 2"),
    # creation and random arguments
    ("linspace-negative-num", lambda x: lf.linspace(0, 1, -1), ValueError, r"linspace: num .*-1"),
    ("linspace-float-num", lambda x: lf.linspace(0, 1, 2.5), ValueError, r"linspace: num .*2\.5"),
    ("eye-negative", lambda x: lf.eye(-1), ValueError, r"eye: n .*-1"),
    ("eye-float", lambda x: lf.eye(2.5), ValueError, r"eye: n .*2\.5"),
    ("eye-bad-m", lambda x: lf.eye(2, -3), ValueError, r"eye: m .*-3"),
    ("eye-float-k", lambda x: lf.eye(2, k=0.5), TypeError, r"eye: k .*0\.5"),
    ("arange-step-0", lambda x: lf.arange(0, 5, 0), ValueError, r"arange: step"),
    ("arange-str", lambda x: lf.arange("a"), TypeError, r"arange: .*'a'"),
    ("full-nonscalar", lambda x: lf.full((2,), [1, 2]), ValueError, r"full: fill_value .*\(2,\)"),
    ("random-key-float", lambda x: lf.random.key(1.5), TypeError, r"random.key: seed"),
    ("random-split-0", lambda x: lf.random.split(lf.random.key(0), 0), ValueError, r"random.split: num .*0"),
    ("random-bad-key", lambda x: lf.random.normal((2,), key=lf.array([1.0, 2.0])), ValueError,
     r"random.normal: key .*float64"),
    ("random-negative-shape", lambda x: lf.random.uniform((-1,)), ValueError, r"random.uniform: negative .*\(-1,\)"),
    ("random-negative-scale", lambda x: lf.random.normal((2,), scale=-1.0), ValueError, r"random.normal: scale"),
    ("uniform-high-below-low", lambda x: lf.random.uniform((2,), low=1.0, high=0.0), ValueError,
     r"random.uniform: high"),
    # host conversions and misc
    ("item-size", lambda x: x.item(), ValueError, r"item: .*\(2, 3\)"),
    ("bool-ambiguous", lambda x: bool(x), ValueError, r"bool: .*\(2, 3\)"),
    ("eval-non-array", lambda x: lf.eval(x, 3), TypeError, r"eval: .*int"),
    ("Array-constructor", lambda x: lf.Array(), TypeError, r"lf\.array"),
]


@pytest.mark.parametrize("call,exc,pattern", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_call_raises_naming_the_op(device, x, call, exc, pattern):
    with lf.stream(device):
        with pytest.raises(exc, match=pattern):
            call(x)


def test_an_invalid_call_leaves_its_inputs_usable(device, x):
    with lf.stream(device):
        with pytest.raises(ValueError, match="matmul"):
            x @ lf.ones((4, 5))
        y = x @ lf.ones((3, 2))
    assert np.array_equal(np.asarray(y), np.full((2, 2), 3.0))


# -- errors while running ----------------------------------------------------------------------------


def test_integer_power_with_a_negative_exponent_array_fails_at_eval_naming_power(device):
    with lf.stream(device):
        base = lf.array([2, 3, 4], dtype=lf.int32)
        p = lf.power(base, lf.array([1, -1, 2], dtype=lf.int32))  # construction succeeds: values unknown
        dependent = (p + 1).sum()
        independent = base * 2
    with pytest.raises(lf.ExecutionError, match="power") as info:
        lf.eval(p)
    assert info.value.op == "power" and info.value.__cause__ is not None
    with pytest.raises(lf.ExecutionError, match="power"):
        lf.eval(dependent)  # a dependent op raises the failing op's error
    with pytest.raises(lf.ExecutionError, match="power"):
        np.asarray(p)  # so does a host read
    with pytest.raises(lf.ExecutionError, match="power"):
        dependent.item()
    assert np.array_equal(np.asarray(independent), [4, 6, 8])
    # the runtime stays usable: the same inputs, new work, the same stream
    with lf.stream(device):
        ok = lf.power(base, 2) + lf.sum(base)
    lf.eval(ok)
    assert np.array_equal(np.asarray(ok), [13, 18, 25])


def test_take_with_out_of_range_laneflow_indices_fails_at_eval_naming_take(device):
    with lf.stream(device):
        data = lf.array([1.0, 2.0, 3.0])
        t = lf.take(data, lf.array([0, 5]))
        later = t * 2
        fine = data + 1
    with pytest.raises(lf.ExecutionError, match="take"):
        lf.eval(later, fine)
    with pytest.raises(lf.ExecutionError, match="take"):
        lf.eval(t)
    assert "take" in repr(t)  # repr does not raise; it shows the error
    assert np.array_equal(np.asarray(fine), [2.0, 3.0, 4.0])
    with lf.stream(device):
        again = lf.take(data, lf.array([2, -3]))
    assert np.array_equal(np.asarray(again), [3.0, 1.0])


def test_out_of_range_laneflow_index_arrays_fail_at_eval_in_getitem_and_setitem(device):
    with lf.stream(device):
        a = lf.array([1, 2, 3])
        g = a[lf.array([3])]
        b = lf.array([1, 2, 3])
        b[lf.array([7])] = 0
    with pytest.raises(lf.ExecutionError, match="getitem"):
        lf.eval(g)
    with pytest.raises(lf.ExecutionError, match="setitem"):
        lf.eval(b)
    with pytest.raises(lf.ExecutionError, match="setitem"):
        np.asarray(b)  # the array's value is the failed one: it keeps raising
    with lf.stream(device):
        b[0] = 9  # a further update of the failed value depends on it, so it fails too
        b2 = lf.array([4, 5, 6])
        b2[lf.array([1])] = 0
        c = a + 1
    with pytest.raises(lf.ExecutionError, match="setitem"):
        lf.eval(b)
    assert np.array_equal(np.asarray(b2), [4, 0, 6])
    assert np.array_equal(np.asarray(c), [2, 3, 4])


def test_an_execution_error_crosses_streams(device):
    other = lf.new_stream(device, lanes=2)
    with lf.stream(device):
        p = lf.power(lf.array([2, 3]), lf.array([-1, 1]))
    q = lf.exp(p.astype(lf.float32), stream=other)
    with pytest.raises(lf.ExecutionError, match="power"):
        lf.eval(q)
    r = lf.exp(lf.array([0.0], device=device), stream=other)
    assert np.asarray(r).tolist() == [1.0]


def test_execution_error_is_a_laneflow_error(device):
    with lf.stream(device):
        p = lf.power(lf.array([2]), lf.array([-2]))
    with pytest.raises(lf.LaneflowError):
        lf.eval(p)


def test_a_backend_that_cannot_start_keeps_no_callers_frame_alive(monkeypatch):
    """The failure is remembered (every later use gets the same answer), but not its traceback: that
    would hold the first caller's locals, a user's arrays, for the rest of the process."""
    import gc
    import weakref

    from laneflow.runtime import backend as registry

    def broken():
        raise RuntimeError("no driver here")

    monkeypatch.setitem(registry._factories, "gpu", broken)
    monkeypatch.setattr(registry, "_backends", {})
    monkeypatch.setattr(registry, "_failures", {})

    class Held:
        pass

    def caller():
        held = Held()
        with pytest.raises(registry.DeviceUnavailableError, match="no driver here"):
            registry.backend_for(lf.Device("gpu"), "probe")
        return weakref.ref(held)

    ref = caller()
    gc.collect()
    assert ref() is None
    with pytest.raises(registry.DeviceUnavailableError, match="probe2: no driver here"):
        registry.backend_for(lf.Device("gpu"), "probe2")


def test_a_run_time_error_names_the_op_its_shapes_dtypes_and_lane(device):
    # On the GPU the bad index is found by the kernel and read from a check slot at the host wait.
    with lf.stream(device):
        x = lf.array(np.arange(4.0))
        i = lf.array(np.array([5])) + 0  # computed: checked when the command runs
        with pytest.raises(lf.ExecutionError) as info:
            np.asarray(x[i])
    msg = str(info.value)
    assert msg.startswith("getitem: failed while running (inputs (4,) float64, (1,) int64; outputs (1,) float64; "
                          f"on lane {device.type}:"), msg
    assert "IndexError" in msg and "index 5 is out of bounds" in msg and info.value.op == "getitem"
    with lf.stream(device):
        assert float(lf.sum(x)) == 6.0  # the runtime stays usable


def test_a_run_time_error_of_a_cached_plan_names_shapes_dtypes_and_lane_too():
    """A repeated eval replays the plan cache's executor (one command for the plan on the CPU); its
    error names the failing step's values as a command's does."""
    msgs = []
    with lf.stream(lf.cpu):
        x = lf.array(np.arange(4.0))
        for _ in range(3):
            i = lf.array(np.array([7])) + 0
            with pytest.raises(lf.ExecutionError) as info:
                lf.eval(x[i] * 2.0)
            msgs.append(str(info.value))
    for msg in msgs:
        assert msg.startswith("getitem: failed while running (inputs (4,) float64, (1,) int64; outputs (1,) float64; "
                              "on lane cpu:"), msg
