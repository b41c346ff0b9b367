"""``lf.cuda``: CUDA-specific controls. Importable without a GPU; the functions that need the CUDA
backend say so when it is missing."""

from __future__ import annotations

from typing import Any

from . import dtypes as dt
from .interop.dlpack import from_cuda_array_interface as _from_cai
from .ops.core import check_shape, operand, stream_of
from .ops.custom import CustomCall, custom_call
from .runtime.backend import loaded
from .runtime.handle_pool import (
    POLICIES,
    handle_policy,
    handles_per_device,
    reset_handle_stats,
    set_handle_policy,
    set_handles_per_device,
)
from .runtime.handle_pool import (
    handle_stats as _pool_stats,
)


def handle_stats() -> dict[str, Any]:
    """Library handles and their memory, so the handle-per-device vs per-stream question has evidence.

    ``handles_created`` / ``handles_live`` per library (cublas, cublasLt, cusolverDn); ``handle_bytes``
    (device bytes the live handles hold: measured with cuMemGetInfo around the first create of each
    library, see ``handle_bytes_how``) and ``workspace_bytes`` / ``workspaces`` (the per-lane
    workspaces); ``set_stream_issued`` / ``set_stream_elided`` in total and per library under
    ``by_library``; ``devices``: per GPU already in use, the handles and workspace bytes of each pool.
    Never starts the GPU backend.
    """
    out = _pool_stats()
    devices: dict = {}
    gpu = loaded("gpu")
    for index, ctx in sorted(getattr(gpu, "_contexts", {}).items()):
        group = getattr(ctx, "handles", None)
        if group is None:
            continue
        devices[f"gpu:{index}"] = {name: {"handles": p.handles(), "workspace_bytes": p.workspace_bytes()}
                                   for name, p in list(group.pools.items())}
    out["devices"] = devices
    return out


def set_allow_tf32(allow: bool) -> None:
    """Let float32 matmuls use TF32 tensor cores (about 1e-3 relative error). Off by default;
    ``LANEFLOW_ALLOW_TF32=1`` turns it on for the process."""
    from .backends.cuda.matmul import set_allow_tf32 as _set

    _set(allow)


def attention_stats() -> dict[str, Any]:
    """Which implementation ran ``lf.nn.scaled_dot_product_attention`` on the GPU since the last reset:
    ``cudnn`` and ``nvrtc`` call counts, ``fallbacks`` (why calls that could have used cuDNN did not,
    with counts), ``cudnn_unavailable`` (None, or why cuDNN cannot load) and ``mode``
    (``LANEFLOW_ATTENTION``: auto, cudnn or nvrtc). Counts commands run, not CUDA-graph replays."""
    from .backends.cuda.attention_choice import stats

    return stats()


def reset_attention_stats() -> None:
    """Zero the counts of :func:`attention_stats`."""
    from .backends.cuda.attention_choice import reset_stats

    reset_stats()


__all__ = ["POLICIES", "attention_stats", "handle_policy", "handle_stats", "handles_per_device",
           "reset_attention_stats", "reset_handle_stats", "set_allow_tf32", "set_handle_policy",
           "set_handles_per_device"]


# -- custom kernels: lf.cuda.kernel -------------------------------------------------------------------

import numpy as _np

# Scalar parameter types: name -> (launch code, numpy type for range checks). Sized names only: C's
# "int"/"float" and numpy's "int"/"float" disagree, so neither spelling is accepted.
_SCALARS = {"bool": ("?", _np.bool_), "int8": ("b", _np.int8), "uint8": ("B", _np.uint8),
            "int16": ("h", _np.int16), "uint16": ("H", _np.uint16), "int32": ("i", _np.int32),
            "uint32": ("I", _np.uint32), "int64": ("q", _np.int64), "uint64": ("Q", _np.uint64),
            "float32": ("f", _np.float32), "float64": ("d", _np.float64)}


def _scalar_type(t, kname: str) -> str:
    if isinstance(t, str):
        name = t
    elif isinstance(t, type) and not issubclass(t, _np.generic):
        name = None  # Python's float and int: sizes C and numpy disagree on; spell them out
    else:
        try:
            name = _np.dtype(t).name
        except TypeError:
            name = None
    if name not in _SCALARS:
        raise TypeError(f"cuda.kernel {kname}: scalar type {t!r} is not one of {', '.join(_SCALARS)} "
                        "(sized names: the C type of int64 is long long, of float32 float)")
    return name


def _dims3(v, what: str, kname: str) -> tuple:
    if isinstance(v, (int, _np.integer)) and not isinstance(v, bool):
        v = (int(v),)
    if not isinstance(v, (tuple, list)) or not 1 <= len(v) <= 3 or \
            any(isinstance(x, bool) or not isinstance(x, (int, _np.integer)) or x < 1 for x in v):
        raise ValueError(f"cuda.kernel {kname}: {what} must be a positive int or a tuple of 1 to 3 positive ints, "
                         f"got {v!r}")
    return tuple(int(x) for x in v) + (1,) * (3 - len(v))


class Kernel:
    """A user CUDA kernel, callable like an op (see :func:`kernel`)."""

    def __init__(self, source: str, name: str, num_inputs: int, num_outputs: int, scalars: tuple):
        self.source, self.name = source, name
        self.num_inputs, self.num_outputs = num_inputs, num_outputs
        self.scalar_types = scalars
        self.params = "p" * (num_inputs + num_outputs) + "".join(_SCALARS[s][0] for s in scalars)
        self.op = f"cuda.kernel:{name}"

    def __repr__(self) -> str:
        return (f"lf.cuda.kernel({self.name!r}, num_inputs={self.num_inputs}, num_outputs={self.num_outputs}, "
                f"scalars={self.scalar_types})")

    def _scalars(self, values) -> tuple:
        values = tuple(values)
        if len(values) != len(self.scalar_types):
            raise TypeError(f"cuda.kernel {self.name}: expected {len(self.scalar_types)} scalars "
                            f"{self.scalar_types}, got {len(values)}")
        out = []
        for i, (t, v) in enumerate(zip(self.scalar_types, values)):
            typ = _SCALARS[t][1]
            if t == "bool":
                out.append(bool(v))
            elif _np.dtype(typ).kind in "iu":
                if isinstance(v, (bool, _np.bool_)) or not isinstance(v, (int, _np.integer)):
                    raise TypeError(f"cuda.kernel {self.name}: scalar {i} ({t}) must be an int, got {v!r}")
                info = _np.iinfo(typ)
                if not info.min <= int(v) <= info.max:
                    raise OverflowError(f"cuda.kernel {self.name}: scalar {i} = {int(v)} does not fit {t}")
                out.append(int(v))
            else:
                if not isinstance(v, (int, float, _np.integer, _np.floating)) or isinstance(v, bool):
                    raise TypeError(f"cuda.kernel {self.name}: scalar {i} ({t}) must be a number, got {v!r}")
                out.append(float(typ(v)))  # rounded to the declared type, as the kernel will see it
        return tuple(out)

    def _outputs(self, outputs, out_like) -> list:
        if (outputs is None) == (out_like is None):
            raise TypeError(f"cuda.kernel {self.name}: give outputs=[(shape, dtype), ...] or out_like=array(s), "
                            "exactly one of them")
        if out_like is not None:
            like = list(out_like) if isinstance(out_like, (list, tuple)) else [out_like]
            specs = []
            for a in like:
                if not hasattr(a, "shape") or not hasattr(a, "dtype"):
                    raise TypeError(f"cuda.kernel {self.name}: out_like entries need .shape and .dtype, got "
                                    f"{type(a).__name__}")
                specs.append((a.shape, a.dtype))
        else:
            if not isinstance(outputs, (list, tuple)) or not all(isinstance(o, (list, tuple)) and len(o) == 2
                                                                 for o in outputs):
                raise TypeError(f"cuda.kernel {self.name}: outputs must be a list of (shape, dtype) pairs, "
                                f"got {outputs!r}")
            specs = list(outputs)
        if len(specs) != self.num_outputs:
            raise TypeError(f"cuda.kernel {self.name}: declared {self.num_outputs} output(s), got {len(specs)}")
        out = []
        for shape, dtype in specs:
            try:
                d = dt.dtype(dtype)
            except TypeError as e:
                raise TypeError(f"cuda.kernel {self.name}: {e}") from None
            out.append((check_shape(shape, self.op), d))
        return out

    def __call__(self, *inputs, outputs=None, out_like=None, grid, block, scalars=(), shared_mem: int = 0,
                 stream=None):
        """Add one launch to the graph; returns the output Array (a tuple when it has several).

        ``inputs``: lf.Arrays (or host data), passed as ``const T*`` in order; ``outputs``: a list of
        ``(shape, dtype)`` or ``out_like=`` array(s); outputs start uninitialised (as ``np.empty``) and
        the kernel must write every element. ``grid``/``block``: 1 to 3 ints; ``scalars``: values of the
        declared scalar parameters. Runs at eval like any op, on the lane the encoder picks.
        """
        st = stream_of(stream, self.op)
        if st.device.type != "gpu":
            raise ValueError(f"cuda.kernel {self.name}: a CUDA kernel runs on a GPU, but this call would run on "
                             f"{st.device}; pass stream=lf.gpu (or a GPU stream), or make lf.gpu the default "
                             "device with lf.set_default_device(lf.gpu)")
        if len(inputs) != self.num_inputs:
            raise TypeError(f"cuda.kernel {self.name}: declared {self.num_inputs} input(s), got {len(inputs)}")
        specs = self._outputs(outputs, out_like)
        g, b = _dims3(grid, "grid", self.name), _dims3(block, "block", self.name)
        if b[0] * b[1] * b[2] > 1024 or b[2] > 64:
            raise ValueError(f"cuda.kernel {self.name}: block {b} has more than 1024 threads (or z > 64)")
        if g[0] >= 2**31 or g[1] >= 2**16 or g[2] >= 2**16:
            raise ValueError(f"cuda.kernel {self.name}: grid {g} is larger than CUDA allows")
        if isinstance(shared_mem, bool) or not isinstance(shared_mem, (int, _np.integer)) or shared_mem < 0:
            raise ValueError(f"cuda.kernel {self.name}: shared_mem must be a non-negative int, got {shared_mem!r}")
        values = self._scalars(scalars)
        ins = [operand(x, st, self.op) for x in inputs]
        from .backends.cuda import custom as _custom  # the optional dependency (cuda-bindings)

        ctx = st.backend.context(st.device.index)
        kern = _custom.load(ctx, self.source, self.name, self.params)
        run = _custom.launcher(ctx, kern, g, b, int(shared_mem), values)
        outs = custom_call(CustomCall(self.op, run), [i for i in ins], specs, st)
        return outs[0] if self.num_outputs == 1 else outs


def kernel(source: str, name: str, *, num_inputs: int, num_outputs: int = 1, scalars=()) -> Kernel:
    """A user CUDA kernel that runs as a laneflow op: lazy, tracked by the encoder like built-in ops
    (hazards, lanes, waits, ``lf.compile``), compiled by NVRTC with the on-disk kernel cache.

    ``source`` is complete CUDA C++ (no headers needed) defining ``extern "C" __global__ void name(...)``
    whose parameters are, in order: ``num_inputs`` input pointers (read-only), ``num_outputs`` output
    pointers, then one parameter per entry of ``scalars`` (sized type names: ``"int32"`` is ``int``,
    ``"int64"`` ``long long``, ``"float32"`` ``float``, ``"float64"`` ``double``, ...). The fixed layout
    lets each launch fill one pre-packed parameter block. Compile errors raise at the first call and show
    the offending source lines. Calls need a GPU stream: on the CPU they raise ValueError.

    >>> scale = lf.cuda.kernel(src, "scale", num_inputs=1, scalars=("int64", "float32"))
    >>> y = scale(x, out_like=x, grid=(n + 255) // 256, block=256, scalars=(n, 2.0))
    """
    if not isinstance(source, str) or not isinstance(name, str) or not name.isidentifier():
        raise TypeError("cuda.kernel: source must be a str and name a C identifier")
    for what, v, lo in (("num_inputs", num_inputs, 0), ("num_outputs", num_outputs, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"cuda.kernel {name}: {what} must be an int >= {lo}, got {v!r}")
    if isinstance(scalars, (str, bytes)):
        scalars = (scalars,)
    return Kernel(source, name, num_inputs, num_outputs, tuple(_scalar_type(t, name) for t in scalars))


def from_cuda_array_interface(obj, *, stream=None):
    """An lf.Array over an object's ``__cuda_array_interface__`` memory (v3; zero-copy when compact),
    ordered after the work pending on its ``stream`` (``lf.from_dlpack`` falls back to this)."""
    return _from_cai(obj, stream)


__all__ += ["Kernel", "from_cuda_array_interface", "kernel"]
