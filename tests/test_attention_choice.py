"""The GPU's choice between cuDNN's fused SDPA and the NVRTC attention kernel, on any machine: the
``LANEFLOW_ATTENTION`` modes, auto's shape rule, which calls cuDNN can take (and why not), the cache key
of a cuDNN graph, and the dispatch that falls back to the NVRTC kernel. No GPU and no cuDNN needed:
operands are stand-ins with shape, dtype, strides and a pointer."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")

import laneflow as lf  # noqa: E402
from laneflow.backends.cuda import attention_choice as A  # noqa: E402
from laneflow.backends.cuda import cudnn_attention as C  # noqa: E402
from laneflow.ops.primitives import Attention  # noqa: E402

BF16, F16, F32 = np.dtype(lf.bfloat16), np.dtype(np.float16), np.dtype(np.float32)


class Arr:
    """What the choice reads of a DeviceArray (``strides`` only for a view)."""

    def __init__(self, shape, dtype=BF16, strides=None, ptr=0x10000):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr
        self.size = int(np.prod(shape))
        if strides is not None:
            self.strides = tuple(strides)


def qkv(B=1, Hq=12, Hkv=None, Tq=16, Tk=None, D=64, Dv=None, dtype=BF16):
    Hkv, Tk, Dv = Hkv or Hq, Tk or Tq, Dv or D
    return Arr((B, Hq, Tq, D), dtype), Arr((B, Hkv, Tk, D), dtype), Arr((B, Hkv, Tk, Dv), dtype)


def prim(causal=False, mask=None, scale=0.125):
    return Attention(scale, causal, mask)


@pytest.fixture
def cudnn_present(monkeypatch):
    """Pretend the frontend and library loaded (the choice only asks whether they did)."""
    monkeypatch.setattr(C, "unavailable_reason", lambda: None)
    monkeypatch.setattr(C, "_capture_failure", None)
    monkeypatch.delenv("LANEFLOW_CUDNN_CAPTURE", raising=False)


# -- which calls cuDNN can take ---------------------------------------------------------------------

@pytest.mark.parametrize("Tq, Tk, causal, expect", [
    (16, 16, True, "top_left"),          # square: top-left and bottom-right are one mask
    (3, 9, True, "bottom_right"),        # laneflow's alignment, cuDNN's BOTTOM_RIGHT diagonal
    (1, 256, True, "none"),              # a decode step sees every key: no mask at all
    (16, 16, False, "none"),
])
def test_causal_alignment_maps_to_the_cudnn_mask_that_sees_the_same_keys(Tq, Tk, causal, expect):
    spec = C.spec_of(prim(causal), *qkv(Tq=Tq, Tk=Tk))
    assert isinstance(spec, C.SdpaSpec) and spec.causal == expect


@pytest.mark.parametrize("what, args, kw, words", [
    ("float32", qkv(dtype=F32), {}, "float16 or bfloat16"),
    ("float64", qkv(dtype=np.float64), {}, "float16 or bfloat16"),
    ("bool mask", qkv(), {"mask": "bool"}, "bool mask"),
    ("additive mask", qkv(), {"mask": "additive"}, "additive mask"),
    ("causal, Tq > Tk", qkv(Tq=9, Tk=3), {"causal": True}, "Tq > Tk"),
    ("head dim 12", qkv(D=12), {}, "multiples of 8"),
    ("head dim 512", qkv(D=512), {}, "at most 256"),
    ("no keys", (Arr((1, 2, 4, 64)), Arr((1, 2, 0, 64)), Arr((1, 2, 0, 64))), {}, "no keys"),
])
def test_calls_cudnn_cannot_take_say_why_naming_op_shapes_and_dtype(what, args, kw, words):
    why = C.spec_of(prim(**kw), *args)
    assert isinstance(why, str) and words in why, why
    assert why.startswith("scaled_dot_product_attention q(") and str(args[0].dtype) in why


def test_strided_heads_of_a_fused_qkv_projection_go_to_cudnn_with_their_strides():
    B, T, H, dh = 2, 8, 4, 64
    st = (T * 3 * H * dh, dh, 3 * H * dh, 1)  # x.reshape(B, T, H, dh).transpose(0, 2, 1, 3) of (B, T, 3d)
    q = Arr((B, H, T, dh), strides=st)
    spec = C.spec_of(prim(True), q, q, q)
    assert isinstance(spec, C.SdpaSpec) and spec.q_strides == st == spec.k_strides


def test_views_cudnn_cannot_read_stay_on_nvrtc():
    q = Arr((1, 2, 4, 64), strides=(512, 256, 1, 4))  # head dim not contiguous
    assert "head dim is not contiguous" in C.spec_of(prim(), q, *qkv(Hq=2, Tq=4)[1:])
    q = Arr((1, 2, 4, 64), strides=(4 * 65 * 2, 4 * 65, 65, 1))  # rows 130 bytes apart
    assert "multiples of 16 bytes" in C.spec_of(prim(), q, *qkv(Hq=2, Tq=4)[1:])


def test_size_one_dims_get_a_nonzero_stride_and_grouped_heads_are_kept():
    q = Arr((1, 8, 1, 64), strides=(0, 64, 0, 1))
    k, v = Arr((1, 2, 40, 64)), Arr((1, 2, 40, 64))
    spec = C.spec_of(prim(True), q, k, v)
    assert spec.q_strides == (512, 64, 64, 1) and (spec.Hq, spec.Hkv, spec.Tq, spec.Tk) == (8, 2, 1, 40)


def test_the_graph_key_tells_apart_what_a_cudnn_graph_is_built_for():
    base = C.spec_of(prim(True), *qkv())
    assert base == C.spec_of(prim(True), *qkv()) and hash(base) == hash(C.spec_of(prim(True), *qkv()))
    others = [C.spec_of(prim(False), *qkv()), C.spec_of(prim(True, scale=0.5), *qkv()),
              C.spec_of(prim(True), *qkv(dtype=F16)), C.spec_of(prim(True), *qkv(B=2)),
              C.spec_of(prim(True), *qkv(Hkv=4)), C.spec_of(prim(True), *qkv(Tq=16, Tk=32)),
              C.spec_of(prim(True), *qkv(Dv=32))]
    strided = Arr((1, 12, 16, 64), strides=(16 * 3 * 768, 64, 3 * 768, 1))
    others.append(C.spec_of(prim(True), strided, *qkv()[1:]))
    assert all(isinstance(o, C.SdpaSpec) for o in others)
    assert len({base, *others}) == len(others) + 1


def test_misaligned_pointers_are_refused():
    assert C.misaligned(Arr((1,), ptr=0x1000), Arr((1,), ptr=0x2010)) is None
    assert "not 16-byte aligned" in C.misaligned(Arr((1,), ptr=0x1000), Arr((1,), ptr=0x1008))


# -- the mode and auto's rule ----------------------------------------------------------------------

def test_mode_comes_from_the_environment_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.delenv("LANEFLOW_ATTENTION", raising=False)
    assert A.attention_mode() == "auto"
    for m in A.MODES:
        monkeypatch.setenv("LANEFLOW_ATTENTION", m)
        assert A.attention_mode() == m
    monkeypatch.setenv("LANEFLOW_ATTENTION", "flash")
    with pytest.raises(ValueError, match="LANEFLOW_ATTENTION.*'flash'"):
        A.attention_mode()


def test_auto_rule_switches_at_the_documented_number_of_scores():
    n = A.AUTO_CUDNN_MIN_SCORES
    assert A.auto_prefers_cudnn(n, 1) and A.auto_prefers_cudnn(1, n)
    assert not A.auto_prefers_cudnn(n - 1, 1) and not A.auto_prefers_cudnn(16, 16)


def test_choose_follows_the_mode(cudnn_present):
    small, big = qkv(Tq=16), qkv(Tq=1024)
    assert A.choose("nvrtc", prim(True), *big, False) == ("nvrtc", None)
    assert A.choose("auto", prim(True), *small, False) == ("nvrtc", None)  # short: not wanted
    path, spec = A.choose("auto", prim(True), *big, False)
    assert path == "cudnn" and spec == C.spec_of(prim(True), *big)
    assert A.choose("cudnn", prim(True), *small, False)[0] == "cudnn"  # forced: any supported size


def test_choose_falls_back_with_a_reason_when_cudnn_cannot_run(cudnn_present, monkeypatch):
    path, why = A.choose("cudnn", prim(), *qkv(dtype=F32), False)
    assert path == "nvrtc" and "float16 or bfloat16" in why
    monkeypatch.setattr(C, "unavailable_reason", lambda: "cuDNN is unavailable (test)")
    assert A.choose("cudnn", prim(), *qkv(), False) == ("nvrtc", "cuDNN is unavailable (test)")
    assert A.choose("auto", prim(), *qkv(Tq=1024), False) == ("nvrtc", "cuDNN is unavailable (test)")


def test_captures_use_cudnn_unless_turned_off_or_broken(cudnn_present, monkeypatch):
    args = (prim(True),) + qkv()
    assert A.choose("cudnn", *args, True)[0] == "cudnn"
    monkeypatch.setenv("LANEFLOW_CUDNN_CAPTURE", "0")
    assert A.choose("cudnn", *args, True) == ("nvrtc", "LANEFLOW_CUDNN_CAPTURE=0")
    assert A.choose("cudnn", *args, False)[0] == "cudnn"  # eager calls are unaffected
    monkeypatch.delenv("LANEFLOW_CUDNN_CAPTURE")
    monkeypatch.setattr(C, "_capture_failure", "failed under capture (test)")
    assert A.choose("cudnn", *args, True) == ("nvrtc", "failed under capture (test)")


def test_the_fake_driver_keeps_cudnn_off(monkeypatch):
    monkeypatch.setattr(C, "DISABLED", "the fake driver runs no cuDNN")
    assert C.unavailable_reason() == "the fake driver runs no cuDNN"


# -- the dispatch ----------------------------------------------------------------------------------

class Lane:
    class ctx:
        class memory:
            capture = None


def _dispatch(monkeypatch, run_result, mode="cudnn", dtype=BF16):
    ran = []
    monkeypatch.setenv("LANEFLOW_ATTENTION", mode)
    monkeypatch.setattr(C, "run", lambda lane, spec, q, k, v, out, capturing: (ran.append("cudnn"), run_result)[1])
    monkeypatch.setattr(A._nvrtc, "attention", lambda lane, p, ins, outs: ran.append("nvrtc"))
    q, k, v = qkv(dtype=dtype)
    A.reset_stats()
    A.attention(Lane, prim(True), [q, k, v], [Arr((1, 12, 16, 64), dtype)])
    return ran, A.stats()


def test_dispatch_runs_cudnn_and_counts_it(cudnn_present, monkeypatch):
    ran, st = _dispatch(monkeypatch, None)
    assert ran == ["cudnn"] and st["cudnn"] == 1 and st["nvrtc"] == 0 and st["fallbacks"] == {}


def test_dispatch_falls_back_to_nvrtc_when_cudnn_refuses_and_records_why(cudnn_present, monkeypatch):
    ran, st = _dispatch(monkeypatch, "cuDNN refused (test)")
    assert ran == ["cudnn", "nvrtc"] and st["nvrtc"] == 1 and st["fallbacks"] == {"cuDNN refused (test)": 1}
    ran, st = _dispatch(monkeypatch, None, dtype=F32)
    assert ran == ["nvrtc"] and st["cudnn"] == 0 and "float16 or bfloat16" in next(iter(st["fallbacks"]))
    ran, st = _dispatch(monkeypatch, None, mode="nvrtc")
    assert ran == ["nvrtc"] and st["fallbacks"] == {}
