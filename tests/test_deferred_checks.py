"""Failures only the device can see, reported at the host wait: an index array computed on the device
out of range, a singular or non-positive-definite matrix in a batched solve. The value that failed and
everything computed from it raise at eval (as on the CPU, where the kernel raises while it runs); other
values are unaffected; the runtime stays usable; a check is read once."""

from __future__ import annotations

import numpy as np
import pytest

import laneflow as lf
from laneflow.runtime.lane import DeferredCheck


def test_device_computed_indices_out_of_range_raise_at_eval(device, rng):
    with lf.stream(lf.new_stream(device, lanes=2)):
        xn = rng.standard_normal(10)
        x = lf.array(xn)
        idx = lf.arange(6, dtype=lf.int64) * 3          # 0, 3, ..., 15: computed on the device
        bad = lf.take(x, idx)
        later = bad * 2.0 + 1.0                        # computed from the failing value
        fine = x * 2.0
        with pytest.raises(lf.ExecutionError, match="take.*index 12 is out of bounds|take.*index 15 is out of bounds"):
            lf.eval(later)
        with pytest.raises(lf.ExecutionError, match="out of bounds"):
            lf.eval(bad)
        np.testing.assert_array_equal(np.asarray(fine), xn * 2.0)
        ok = lf.take(x, lf.arange(5, dtype=lf.int64) * 2)  # in range: no error, values right
        np.testing.assert_array_equal(np.asarray(ok), xn[::2])
        neg = lf.take(x, lf.arange(3, dtype=lf.int64) - 3)  # -3, -2, -1: valid negative indices
        np.testing.assert_array_equal(np.asarray(neg), xn[-3:])


def test_device_computed_gather_and_scatter_indices_are_checked(device, rng):
    with lf.stream(device):
        xn = rng.standard_normal((4, 5))
        x = lf.array(xn)
        rows = lf.arange(3, dtype=lf.int64) * 2                # 0, 2, 4: 4 is out of range for 4 rows
        with pytest.raises(lf.ExecutionError, match="getitem.*index 4 is out of bounds"):
            lf.eval(x[rows])
        cols = lf.arange(3, dtype=lf.int64) - 7                # -7, -6, -5: -7 and -6 are out of range
        y = lf.array(xn)
        y[1, cols] = 0.0
        with pytest.raises(lf.ExecutionError, match="setitem.*out of bounds"):
            lf.eval(y)
        good = lf.arange(3, dtype=lf.int64) + 1
        np.testing.assert_array_equal(np.asarray(x[good]), xn[1:4])


def test_a_failing_matrix_in_a_batch_raises_linalg_error_at_eval_and_others_are_unaffected(device, rng):
    with lf.stream(lf.new_stream(device, lanes=2)):
        a = rng.standard_normal((3, 4, 4))
        spd = a @ np.swapaxes(a, -1, -2) + 4 * np.eye(4)
        bad = spd.copy()
        bad[1] = -np.eye(4)
        c = lf.linalg.cholesky(lf.array(bad))
        after = c.sum()
        good = lf.linalg.cholesky(lf.array(spd))
        with pytest.raises(lf.LinAlgError, match="cholesky.*not positive definite"):
            lf.eval(after)
        with pytest.raises(lf.LinAlgError):
            lf.eval(c)
        np.testing.assert_allclose(np.asarray(good), np.linalg.cholesky(spd), rtol=1e-10, atol=1e-12)
        sing = lf.linalg.solve(lf.array(np.ones((3, 3))), lf.array(np.ones(3)))
        with pytest.raises(lf.LinAlgError, match="solve.*Singular matrix"):
            lf.eval(sing)


def test_deferred_checks_pass_on_once_and_are_read_once(rng):
    """The mechanism itself, on CPU lanes: a kernel defers a check; dependents inherit it without
    duplicates; the check is read at the first wait only."""
    from laneflow.graph import schedule as sched
    from laneflow.graph.node import ArrayData

    s = lf.new_stream(lf.cpu, lanes=2)
    reads = []

    def failing():
        reads.append(1)
        return lf.LaneflowError("deferred failure")

    be = s.backend
    a = be.allocate(lf.cpu, (3,), np.dtype(np.float64), "t")
    b = be.allocate(lf.cpu, (3,), np.dtype(np.float64), "t")
    c = be.allocate(lf.cpu, (3,), np.dtype(np.float64), "t")
    check = DeferredCheck(failing)

    def produce(lane):
        a.data[:] = 1.0
        assert lane.defer(check)

    def combine(lane):
        c.data[:] = a.data + a.data

    with sched.LOCK:
        s.encoder.encode("produce", produce, [], [a])
        s.encoder.encode("copy", lambda lane: b.data.__setitem__(slice(None), a.data), [a], [b])
        s.encoder.encode("combine", combine, [a, a], [c])
    for buf in (a, b, c):
        d = ArrayData((3,), np.dtype(np.float64), s, None)
        d.buffer = buf
        with pytest.raises(lf.LaneflowError, match="deferred failure"):
            sched.wait(d)
        with pytest.raises(lf.LaneflowError, match="deferred failure"):
            sched.wait(d)        # kept as the buffer's error
    assert len(reads) == 1       # one read, shared by every value that depends on it
    assert c.checks is None and c.error is not None
    s.close()


def test_a_failing_matrix_is_named_by_its_index_in_the_whole_batch_when_split_over_lanes(rng):
    if not lf.gpu_available():
        pytest.skip("no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")
    a = rng.standard_normal((6, 8, 8))
    spd = a @ np.swapaxes(a, -1, -2) + 8 * np.eye(8)
    spd[4] = -np.eye(8)
    with lf.stream(lf.new_stream(lf.gpu, lanes=4)):
        c = lf.linalg.cholesky(lf.array(spd))
        with pytest.raises(lf.LinAlgError, match=r"matrix 4 of the batch"):
            lf.eval(c)


def test_a_buffer_written_in_place_again_and_again_does_not_pile_up_passed_checks():
    """A donated KV cache is read and written by every call of a compiled step: checks read and passed
    are not carried on, so a buffer holds only the checks still unread (a decode loop of 40 steps
    carried 40 of them, and each command's merge grew with the loop)."""
    from laneflow.graph import schedule as sched
    from laneflow.graph.node import ArrayData

    s = lf.new_stream(lf.cpu, lanes=1)
    be = s.backend
    cache = be.allocate(lf.cpu, (3,), np.dtype(np.float64), "t")
    out = be.allocate(lf.cpu, (3,), np.dtype(np.float64), "t")
    cache.data[:] = 0.0
    carried = []
    for step in range(40):
        check = DeferredCheck(lambda: None)

        def update(lane, check=check):
            cache.data[:] += 1.0
            out.data[:] = cache.data
            assert lane.defer(check)

        with sched.LOCK:
            s.encoder.encode("update", update, [cache], [cache, out])
        d = ArrayData((3,), np.dtype(np.float64), s, None)
        d.buffer = out
        sched.wait(d)  # reads this step's check (it passes)
        carried.append(len(cache.checks or ()))
    assert max(carried) <= 2, carried
    np.testing.assert_array_equal(cache.data, 40.0)
    s.close()


def test_unread_checks_of_finished_commands_are_not_carried_on_but_failures_are():
    """A decode loop never reads its cache on the host: a check whose command has finished and whose
    words are clean is dropped when the next write merges checks (``DeferredCheck.passed``), so the
    cache carries only the few still in flight (on an H200 each call's merge grew with the loop:
    18 ms a call after a thousand calls on the fake driver); a failing one stays to be raised."""
    from laneflow.graph import schedule as sched
    from laneflow.graph.node import ArrayData
    from laneflow.runtime import lane as lane_mod

    class Finished(DeferredCheck):
        __slots__ = ("done",)

        def __init__(self, read):
            super().__init__(read)
            self.done = False

        def passed(self, poll: bool = False) -> bool:
            return super().passed(poll) or (self.done and self.error() is None)

    s = lf.new_stream(lf.cpu, lanes=1)
    be = s.backend
    cache = be.allocate(lf.cpu, (3,), np.dtype(np.float64), "t")
    cache.data[:] = 0.0
    issued, carried = [], []
    for step in range(60):
        check = Finished((lambda: lf.LaneflowError("step 50 failed")) if step == 50 else (lambda: None))
        issued.append(check)

        def update(lane, check=check):
            cache.data[:] += 1.0
            assert lane.defer(check)

        with sched.LOCK:
            s.encoder.encode("update", update, [cache], [cache])
        s.synchronize()
        for c in issued[:-2]:  # all but the last two calls' commands have "finished"
            c.done = True
        carried.append(len(cache.checks or ()))
    assert max(carried) <= lane_mod._POLL_AFTER + 2, carried
    d = ArrayData((3,), np.dtype(np.float64), s, None)
    d.buffer = cache
    with pytest.raises(lf.LaneflowError, match="step 50 failed"):
        sched.wait(d)
    s.close()


def test_a_compiled_step_with_device_checks_keeps_its_donated_buffer_checks_bounded(device):
    """The same on the real path: a compiled step gathering at a device position (a checked index)
    and writing a donated buffer, called many times without a host read of the buffer."""
    f = lf.compile(lambda buf, table, pos: lf.dynamic_update_slice(buf, lf.take(table, pos, axis=0)[None], (pos, 0)),
                   donate_argnums=(0,))
    with lf.stream(lf.new_stream(device, lanes=2)):
        table = lf.array(np.arange(12.0).reshape(6, 2))
        buf = lf.zeros((6, 2))
        sizes = []
        for k in range(120):
            buf = f(buf, table, lf.array(np.int64(k % 6)))
            sizes.append(len(buf._data.buffer.checks or ()) if buf._data.buffer is not None else 0)
        np.testing.assert_array_equal(np.asarray(buf), np.arange(12.0).reshape(6, 2))
    # a check is known to have passed once an event after its command has: a CUDA lane records one
    # every MARK_EVERY commands by itself (lazy events), so up to that many ride along between two
    bound = 8
    if device.type == "gpu":
        from laneflow.backends.cuda import lanes

        bound += lanes.MARK_EVERY
    assert max(sizes[60:]) <= bound, sizes
