"""cuBLASLt through the HandlePool on the GPU: handles per policy, identical results under sharing."""

from __future__ import annotations


import numpy as np
import pytest

import laneflow as lf
from conftest import run_threads

pytestmark = pytest.mark.skipif(not lf.gpu_available(), reason="no usable GPU: laneflow's CUDA backend or an NVIDIA driver is missing")


@pytest.fixture(autouse=True)
def policy_reset():
    lf.cuda.set_handle_policy(None)
    yield
    lf.cuda.set_handle_policy(None)


def _gemms(rng, n=8):
    a = [lf.array(rng.standard_normal((64, 64)).astype(np.float32), device=lf.gpu) for _ in range(n)]
    lf.eval(*a)
    return a


def _created():
    return lf.cuda.handle_stats()["handles_created"].get("cublasLt", 0)


def test_device_policy_uses_one_handle_whatever_the_lanes_and_streams(rng):
    a = _gemms(rng)
    lf.eval(lf.matmul(a[0], a[1], stream=lf.gpu))   # the device's handle exists now
    before = _created()
    streams = [lf.new_stream(lf.gpu, lanes=4) for _ in range(2)]
    outs = [lf.matmul(a[i % 8], a[(i + 1) % 8], stream=streams[i % 2]) for i in range(32)]
    lf.eval(*outs)
    assert _created() == before
    for s in streams:
        s.close()


def test_stream_policy_creates_a_handle_per_lane(rng):
    lf.cuda.set_handle_policy("stream")
    a = _gemms(rng)
    before = _created()
    s = lf.new_stream(lf.gpu, lanes=4)
    outs = [lf.matmul(a[i], a[(i + 1) % 8], stream=s) for i in range(8)]
    lf.eval(*outs)
    used = len({o._data.buffer.writer.lane.id for o in outs})
    assert _created() - before == used >= 2
    s.close()


def test_eight_lanes_by_500_gemms_sharing_one_handle_equal_one_lane(rng):
    a = _gemms(rng)
    one = lf.new_stream(lf.gpu, lanes=1)
    many = lf.new_stream(lf.gpu, lanes=8)
    pairs = [(i % 8, (i * 3 + 1) % 8) for i in range(4000)]
    ref = [lf.matmul(a[i], a[j], stream=one) for i, j in pairs]
    got = [lf.matmul(a[i], a[j], stream=many) for i, j in pairs]
    lf.eval(*ref, *got)
    assert len({o._data.buffer.writer.lane.id for o in got}) == 8
    for r, g in zip(ref[::97], got[::97]):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    one.close(), many.close()


def test_four_host_threads_sharing_the_device_handle_get_identical_results(rng):
    a = _gemms(rng)
    ref = [np.asarray(lf.matmul(a[k], a[(k + 1) % 8], stream=lf.gpu)) for k in range(8)]
    errors = []

    def work(t):
        try:
            s = lf.new_stream(lf.gpu, lanes=2)
            for rep in range(50):
                outs = [lf.matmul(a[k], a[(k + 1) % 8], stream=s) for k in range(8)]
                lf.eval(*outs)
                if rep % 10 == 0:
                    for k, o in enumerate(outs):
                        np.testing.assert_array_equal(np.asarray(o), ref[k])
            s.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_threads(work, 4)
    assert not errors, errors[0]
