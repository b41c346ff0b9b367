"""cuDNN's fused SDPA (``nvidia-cudnn-frontend`` over ``nvidia-cudnn-cu13``) for
``lf.nn.scaled_dot_product_attention``: optional, chosen call by call by ``attention_choice.py``.

Why this shape (the H200 probe ``anchors/probe_cudnn_sdpa.py`` is the API followed here, call for
call): the frontend takes laneflow's raw device pointers in its variant pack and runs on whatever
stream its handle is set to, so laneflow keeps its own memory and lanes. One cuDNN handle per device
through the handle pool (``handles.py``; ``set_stream`` to the lane's stream when the lane changes,
which the frontend's ``Handle`` elides when unchanged) and a workspace per lane from the pool (inside a
CUDA-graph capture: scratch the graph owns). A frontend graph is built once per :class:`SdpaSpec`
(shapes, dtype, strides, causal alignment, scale) and cached on the device; a spec cuDNN refuses is
cached too, with the reason, and runs on the NVRTC kernel.

What runs here: float16/bfloat16 q, k, v with a unit head-dim stride and 16-byte strides and
pointers, head dims multiples of 8 up to 256, no mask, grouped-query heads. Causal attention in
laneflow is bottom-right aligned (query i sees keys j <= i + Tk - Tq): with Tq == Tk that is cuDNN's
``use_causal_mask`` (top-left, what the probe ran), with Tq == 1 it masks nothing, with Tq < Tk it is
``diagonal_alignment=BOTTOM_RIGHT, diagonal_band_right_bound=0`` (the frontend's preferred spelling;
its ``use_causal_mask_bottom_right`` is deprecated), and Tq > Tk (queries that see no key get zeros in
laneflow; cuDNN refuses the shape) stays on the NVRTC kernel. Masks stay on the NVRTC kernel too: a
bool mask is not a cuDNN input, and an additive bias through cuDNN would not keep laneflow's contract
that a query seeing no key gets zeros.

Importing this module needs no GPU and no cuDNN: the frontend is imported at the first call that
wants it; a missing frontend or library makes cuDNN unavailable (:func:`unavailable_reason`), never
an error.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from ...dtypes import bfloat16, float16
from ...shapes import contiguous_strides
from .handles import cudnn_pool, per_device

#: Set (to a reason) to keep cuDNN off whatever is installed: the fake driver of the tests does.
DISABLED: str | None = None

_frontend: Any = None
_why_not: str | None = None
_loaded = False
_load_lock = threading.Lock()
_capture_failure: str | None = None
_DTYPES = {bfloat16: "bfloat16", float16: "float16"}
_MIN_WORKSPACE = 256  # bytes: the probe passed a real (1-byte) buffer even when cuDNN asked for none


class SdpaSpec(NamedTuple):
    """What a cuDNN graph is built for (its cache key): strides in elements, ``causal`` one of
    ``none``, ``top_left``, ``bottom_right`` (cuDNN's masks, already mapped from laneflow's)."""

    dtype: str
    B: int
    Hq: int
    Hkv: int
    Tq: int
    Tk: int
    D: int
    Dv: int
    q_strides: tuple
    k_strides: tuple
    v_strides: tuple
    causal: str
    scale: float


def _frontend_or_none() -> Any:
    global _frontend, _why_not, _loaded
    if _loaded:
        return _frontend
    with _load_lock:
        if not _loaded:
            try:
                import cudnn  # noqa: PLC0415 - optional: the [cudnn] extra

                version = cudnn.backend_version()  # raises when libcudnn was not found
                _frontend, _why_not = cudnn, None
                if not version:
                    _frontend, _why_not = None, "cuDNN reports no backend version"
            except Exception as e:  # noqa: BLE001 - any failure means: not available
                _why_not = (f"cuDNN is unavailable ({type(e).__name__}: {e}); install laneflow[cudnn] "
                            "(nvidia-cudnn-frontend, nvidia-cudnn-cu13)")
            _loaded = True
    return _frontend


def unavailable_reason() -> str | None:
    """None when the frontend and the cuDNN library load, else why not."""
    if DISABLED is not None:
        return DISABLED
    _frontend_or_none()
    return _why_not


def capture_failure() -> str | None:
    """Why cuDNN no longer runs inside CUDA-graph captures in this process (None: it may)."""
    return _capture_failure


def _strides(x: Any) -> tuple:
    """Element strides of a 4-D operand (a view's own, else contiguous); a size-1 dimension's stride,
    which addresses nothing, is made the one a contiguous layout would give it, never 0."""
    st = list(getattr(x, "strides", None) or contiguous_strides(x.shape))
    for i in (2, 1, 0):
        if x.shape[i] == 1 and st[i] == 0:
            st[i] = st[i + 1] * max(1, x.shape[i + 1])
    return tuple(int(s) for s in st)


def _causal_mode(causal: bool, Tq: int, Tk: int) -> str | None:
    if not causal or Tq == 1:  # a decode step sees every key
        return "none"
    if Tq == Tk:
        return "top_left"   # the same mask as bottom-right on a square
    if Tq < Tk:
        return "bottom_right"
    return None


def spec_of(prim: Any, q: Any, k: Any, v: Any) -> SdpaSpec | str:
    """The :class:`SdpaSpec` of a call, or why cuDNN cannot run it (a reason naming the op, shapes and
    dtype). Needs no GPU."""
    where = f"scaled_dot_product_attention q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} {q.dtype}"
    dtype = _DTYPES.get(q.dtype)
    if dtype is None:
        return f"{where}: cuDNN SDPA takes float16 or bfloat16"
    if prim.mask is not None:
        return f"{where}: a {prim.mask} mask runs on the NVRTC kernel"
    B, Hq, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    if Tk == 0:
        return f"{where}: no keys"
    if D % 8 or Dv % 8 or D > 256 or Dv > 256:
        return f"{where}: cuDNN needs head dims that are multiples of 8, at most 256"
    causal = _causal_mode(prim.causal, Tq, Tk)
    if causal is None:
        return f"{where}: causal with Tq > Tk (cuDNN's bottom-right mask needs Tq <= Tk)"
    strides = []
    for name, x in (("q", q), ("k", k), ("v", v)):
        st = _strides(x)
        if st[3] != 1:
            return f"{where}: {name}'s head dim is not contiguous (strides {st})"
        if any(n > 1 and (s <= 0 or s % 8) for n, s in zip(x.shape[:3], st[:3])):  # 8 elements: 16 bytes
            return f"{where}: {name}'s strides {st} are not positive multiples of 16 bytes"
        strides.append(st)
    return SdpaSpec(dtype, B, Hq, Hkv, Tq, Tk, D, Dv, *strides, causal, float(prim.scale))


def misaligned(*arrays: Any) -> str | None:
    """Why these operands' pointers cannot go to cuDNN (not 16-byte aligned), else None."""
    for a in arrays:
        if a.ptr % 16:
            return f"scaled_dot_product_attention: a pointer ({a.ptr:#x}) is not 16-byte aligned for cuDNN"
    return None


# -- graphs, built once per spec and device ----------------------------------------------------------

class _Built:
    __slots__ = ("graph", "q", "k", "v", "o", "workspace")

    def __init__(self, graph: Any, q: Any, k: Any, v: Any, o: Any, workspace: int):
        self.graph, self.q, self.k, self.v, self.o, self.workspace = graph, q, k, v, o, workspace


def _build(cudnn: Any, handle: Any, s: SdpaSpec) -> _Built:
    """The probe's sequence: pygraph, tensors with laneflow's strides, sdpa, output, plans."""
    dt = cudnn.data_type.BFLOAT16 if s.dtype == "bfloat16" else cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    tq = g.tensor(name="q", dim=[s.B, s.Hq, s.Tq, s.D], stride=list(s.q_strides), data_type=dt)
    tk = g.tensor(name="k", dim=[s.B, s.Hkv, s.Tk, s.D], stride=list(s.k_strides), data_type=dt)
    tv = g.tensor(name="v", dim=[s.B, s.Hkv, s.Tk, s.Dv], stride=list(s.v_strides), data_type=dt)
    mask: dict = {}
    if s.causal == "top_left":
        mask["use_causal_mask"] = True
    elif s.causal == "bottom_right":
        mask.update(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0)
    out, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, is_inference=True, attn_scale=s.scale, **mask)
    odim = [s.B, s.Hq, s.Tq, s.Dv]
    out.set_output(True).set_dim(odim).set_stride(list(contiguous_strides(tuple(odim)))).set_data_type(dt)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return _Built(g, tq, tk, tv, out, int(g.get_workspace_size()))


class _DeviceGraphs:
    """One device's graphs: spec -> :class:`_Built`, or the reason cuDNN refused the spec."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs: dict[SdpaSpec, Any] = {}


def _graphs(ctx: Any) -> _DeviceGraphs:
    return per_device(ctx, "cudnn_sdpa", _DeviceGraphs)


def built_specs(ctx: Any) -> dict:
    """The device's cached specs: spec -> workspace bytes, or the reason it was refused (probes, tests)."""
    g = getattr(ctx, "cudnn_sdpa", None)
    if g is None:
        return {}
    with g.lock:
        return {s: (b.workspace if isinstance(b, _Built) else b) for s, b in g.graphs.items()}


def run(lane: Any, spec: SdpaSpec, q: Any, k: Any, v: Any, out: Any, capturing: bool) -> str | None:
    """Enqueue cuDNN's SDPA for ``spec`` on ``lane``; returns None, or why it did not run (the caller
    then runs the NVRTC kernel). Under a capture only a graph built before it is used, and a failure
    turns cuDNN off for later captures (and raises: the capture must be abandoned)."""
    global _capture_failure
    why = misaligned(q, k, v, out)
    if why is not None:
        return why
    cudnn = _frontend_or_none()
    cache = _graphs(lane.ctx)
    built = cache.graphs.get(spec)
    if isinstance(built, str):
        return built
    pool = cudnn_pool(lane.ctx, cudnn)
    if built is None:
        if capturing:
            return "cuDNN graph not built before the CUDA-graph capture"
        with pool.use(lane) as (handle, _ws):
            with cache.lock:
                built = cache.graphs.get(spec)
                if built is None:
                    try:
                        built = _build(cudnn, handle, spec)
                    except Exception as e:  # noqa: BLE001 - cuDNN refused: the NVRTC kernel runs it
                        built = f"cuDNN refused {spec}: {type(e).__name__}: {e}"
                    cache.graphs[spec] = built
        if isinstance(built, str):
            return built
    need = max(built.workspace, _MIN_WORKSPACE)
    pack = {built.q: q.ptr, built.k: k.ptr, built.v: v.ptr, built.o: out.ptr}
    if capturing:
        ws_ptr = lane.ctx.memory.raw_alloc(need, lane.stream, "cuDNN SDPA workspace")  # the graph's
        with pool.use(lane) as (handle, _ws):
            try:
                built.graph.execute(pack, ws_ptr, handle=handle)
            except Exception as e:
                _capture_failure = f"cuDNN SDPA failed under CUDA-graph capture: {type(e).__name__}: {e}"
                raise RuntimeError(_capture_failure) from e
        return None
    with pool.use(lane, need=need) as (handle, ws):
        try:
            built.graph.execute(pack, ws[0], handle=handle)
        except Exception as e:  # noqa: BLE001 - keep laneflow working: this spec goes to NVRTC from now on
            reason = f"cuDNN execute failed for {spec}: {type(e).__name__}: {e}"
            with cache.lock:
                cache.graphs[spec] = reason
            return reason
    return None
