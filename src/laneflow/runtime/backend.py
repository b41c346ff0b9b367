"""The contract a backend implements, and the registry that finds the backend of a device type.

Ops, the scheduler, the encoder and ``lf.compile`` are written once, above this contract; a backend
(``backends/cpu``, ``backends/cuda``) subclasses :class:`Backend`. What every backend must provide is
abstract; what only some offer (one allocation for many outputs, a compiled plan's static memory and
whole-plan executor, zero-copy interop with another library) has a default here that says "not
offered", so callers never probe with ``getattr``.

Kernels are looked up by a primitive's ``kind`` (``ops/table.py: KINDS``) and called as
``kernel(lane, prim, inputs, outputs)`` with the backend's data handles. A data handle of a device
buffer is a :class:`DeviceData`: a CPU lane copies it to host memory through ``copy_to_host`` (the
``Copy`` kernel between devices).
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import numpy as np

from ..errors import LaneflowError
from .buffer import Buffer
from .lane import Lane


class DeviceData(Protocol):
    """A device buffer's data handle as another backend's kernels see it (the CPU's copy kernel)."""

    shape: tuple
    dtype: np.dtype
    nbytes: int

    def copy_to_host(self, out: np.ndarray) -> None:
        """Copy the contents (whose writer has finished) into host memory ``out``."""


class PlanExecutor(Protocol):
    """What :meth:`Backend.graph_plan` returns: a compiled plan as one unit (a CUDA graph)."""

    def run(self, datas: list, stream: Any) -> Any | None:
        """Launch one call (under the scheduling lock): a lease the call's values are made from, or
        None when this call must run as commands."""

    def stats(self) -> dict:
        """How the plan runs (``mode``, nodes, branches, captures...), for ``CompiledFunction.stats``."""


class Timer(Protocol):
    """Device-event timing of a stream's work: ``start()``, then ``stop()`` returns seconds."""

    def start(self) -> None: ...

    def stop(self) -> float: ...


@dataclass(frozen=True)
class Limits:
    """What a backend can take, read by the scheduling passes."""

    #: most matmuls in one grouped command (``graph/grouping.py``); 0: the backend does not group
    max_matmul_group: int = 0
    #: largest array (elements) whose elementwise ops fuse (``graph/fusion.py``); None: any size;
    #: 0: the backend does not fuse
    fuse_max_elements: int | None = 0


class DeviceUnavailableError(LaneflowError):
    """A device was asked for that this machine or installation cannot run: no driver, no CUDA
    libraries, no such GPU. The message says what is missing and what to do."""


class Backend(abc.ABC):
    """A device family (cpu, gpu): lanes, memory and kernels."""

    name: str = "?"
    default_lanes: int = 1
    #: True when ``to_host`` returns a view of the buffer's memory (the CPU): a value read on the host
    #: is then never reused in place. False when it returns a copy (the GPU).
    host_view: bool = True
    #: True when ``allocate_region`` and ``view`` give a compiled plan's intermediates static memory
    #: (``graph/memory_plan.py``); without them a replay allocates every intermediate afresh.
    plans_memory: bool = False
    limits: Limits = Limits()

    # -- devices and lanes ------------------------------------------------------------------------
    def check_device(self, device: Any) -> None:
        """Raise ValueError when ``device`` (e.g. gpu index 3) does not exist on this machine, saying
        which devices do (``backend_for`` puts the op's name in front)."""

    @abc.abstractmethod
    def create_lanes(self, device: Any, stream_id: int, count: int) -> list[Lane]:
        """``count`` new lanes of one stream on ``device``."""

    # -- memory -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def allocate(self, device: Any, shape: tuple, dtype: np.dtype, op: str) -> Buffer:
        """A new buffer for an op's output (stream-ordered on backends that support it)."""

    def allocate_many(self, device: Any, specs: list, op: str) -> list[Buffer]:
        """Buffers for the outputs ``specs`` ((shape, dtype) each) of one command; one allocation where
        the backend can (the CUDA backend: ``memory.Slab``)."""
        return [self.allocate(device, shape, dtype, op) for shape, dtype in specs]

    def allocate_region(self, device: Any, nbytes: int, op: str) -> Buffer:
        """Raw memory for a compiled plan's region (only where ``plans_memory``)."""
        raise NotImplementedError(f"the {self.name} backend has no plan memory")

    def view(self, region: Buffer, shape: tuple, dtype: np.dtype) -> Any:
        """A kernel's data handle for the start of ``region`` as an array of ``shape`` and ``dtype``."""
        raise NotImplementedError(f"the {self.name} backend has no plan memory")

    @abc.abstractmethod
    def upload(self, device: Any, host: np.ndarray) -> tuple[Buffer, Callable | None]:
        """Buffer for host data. Returns the buffer and, if a copy must run on a lane, its function."""

    @abc.abstractmethod
    def to_host(self, buffer: Buffer, shape: tuple, dtype: np.dtype) -> np.ndarray:
        """Host view or copy of a buffer whose writer has finished."""

    def memory_stats(self, device: Any = None) -> dict:
        """Pool figures of a device (used and reserved bytes...), where the backend keeps a pool."""
        return {}

    # -- kernels ----------------------------------------------------------------------------------
    #: Primitive kinds whose kernels read inputs through strided (non-contiguous) views
    #: (``graph/views.py``); any kernel of a folding kind takes a contiguous view.
    strided_kinds: frozenset = frozenset()
    #: The dtypes whose matmul kernels run ``MatmulEpilogue`` primitives (a bias, a residual, a tanh
    #: GELU computed in the product: ``graph/epilogue.py``); empty: none.
    matmul_epilogues: frozenset = frozenset()

    @abc.abstractmethod
    def kernel(self, kind: str) -> Callable:
        """The kernel of a primitive kind; raises LaneflowError for a kind the backend lacks."""

    def strided_view(self, data: Any, view: tuple) -> Any:
        """A kernel's data handle reading ``data`` (an input's handle) through ``view``: (shape,
        element strides, element offset), contiguous or (for :attr:`strided_kinds`) not."""
        raise NotImplementedError(f"the {self.name} backend has no views")

    def kernel_of(self, prim: Any) -> Callable:
        """The kernel that runs ``prim``: its kind's kernel, reading the inputs that ``prim.in_views``
        names through views of them (``graph/views.py``). Every place that runs a primitive asks here."""
        kern = self.kernel(prim.kind)
        vs = prim.__dict__.get("in_views")
        if vs is None:
            return kern
        view = self.strided_view

        def viewed(lane, prim, ins, outs, kern=kern, vs=vs, view=view):
            kern(lane, prim, [d if v is None else view(d, v) for d, v in zip(ins, vs)], outs)

        return viewed

    @property
    def fuses_elementwise(self) -> bool:
        """Whether chains of elementwise ops fuse into one command (``graph/fusion.py``)."""
        return self.limits.fuse_max_elements != 0

    @property
    def fuse_max_elements(self) -> int | None:
        return self.limits.fuse_max_elements

    def groups_matmul(self, dtype: np.dtype) -> bool:
        """Whether independent same-shape matmuls of ``dtype`` run as one grouped command (kernel kind
        ``"matmul_group"``, at most ``limits.max_matmul_group`` of them; ``graph/grouping.py``)."""
        return False

    def runs_linalg_batched(self, name: str, in_shapes: list, out_shapes: list) -> bool:
        """Whether factorization ``name`` (``ops/linalg.py``) with these shapes runs its whole batch as
        one batched library call; ``ops/linalg.py`` then keeps it one command instead of one per lane."""
        return False

    def graph_plan(self, plan: Any, stream: Any) -> PlanExecutor | None:
        """A compiled plan (``graph/plan.py``) as one executor, or None when the backend has none; it
        may raise when this plan cannot become one (the plan then replays its commands)."""
        return None

    def event_timer(self, stream: Any) -> Timer | None:
        """A device-event timer of ``stream``'s work (``laneflow bench``), or None: time on the host."""
        return None

    # -- interop ----------------------------------------------------------------------------------
    def dlpack_device(self, device: Any) -> tuple[int, int]:
        """``(DLPack device type, index)`` of this backend's device."""
        raise BufferError(f"the {self.name} backend has no DLPack device")

    def export_dlpack(self, buf: Buffer, shape: tuple, dtype: np.dtype, device: Any, *, stream: Any,
                      versioned: bool, copied: bool) -> Any:
        """A DLPack capsule over an evaluated, exported device buffer (backends whose memory numpy
        cannot describe; ``host_view`` backends export through numpy)."""
        raise BufferError(f"__dlpack__: the {self.name} backend cannot export its memory")

    def import_dlpack(self, obj: Any, stream: Any) -> tuple[Buffer, np.dtype, tuple]:
        """(buffer, dtype, shape) over another library's DLPack tensor on this backend's device, its
        writer a command on ``stream`` ordered after the producer's work. Under the scheduling lock."""
        raise BufferError(f"from_dlpack: the {self.name} backend cannot import device memory")

    def read_array_interface(self, obj: Any, op: str) -> tuple[int, Any]:
        """(device index, fields) of an object's ``__cuda_array_interface__``, for
        :meth:`import_array_interface`."""
        raise BufferError(f"{op}: the {self.name} backend has no CUDA array interface")

    def import_array_interface(self, obj: Any, stream: Any, fields: Any) -> tuple[Buffer, np.dtype, tuple]:
        """(buffer, dtype, shape) over an object's CUDA array interface memory (as import_dlpack)."""
        raise BufferError(f"from_cuda_array_interface: the {self.name} backend has no CUDA array interface")

    def array_interface(self, buf: Buffer, shape: tuple, dtype: np.dtype) -> dict:
        """``__cuda_array_interface__`` of an evaluated, exported buffer (AttributeError elsewhere)."""
        raise AttributeError(f"__cuda_array_interface__: not an array on a CUDA device ({self.name})")


# -- the registry ----------------------------------------------------------------------------------

_factories: dict[str, Callable[[], Backend]] = {}
_backends: dict[str, Backend] = {}
_failures: dict[str, BaseException] = {}
_lock = threading.Lock()


def register(device_type: str, factory: Callable[[], Backend]) -> None:
    """Make ``factory()`` the backend of ``device_type`` ("cpu", "gpu"), created on first use. A
    factory that fails raises :class:`DeviceUnavailableError` (or its own LaneflowError) saying why."""
    with _lock:
        _factories[device_type] = factory
        _backends.pop(device_type, None)
        _failures.pop(device_type, None)


def backend_for(device: Any, op: str | None = None) -> Backend:
    """The backend that runs ``device``; raises :class:`DeviceUnavailableError` (naming ``op``) when it
    cannot run here, ValueError for a device index this machine lacks."""
    t = device.type
    b = _backends.get(t)
    if b is None:
        b = _create(t, op)
    try:
        b.check_device(device)
    except ValueError as e:
        raise ValueError(f"{op}: {e}" if op else str(e)) from None
    return b


def _create(t: str, op: str | None) -> Backend:
    with _lock:
        b = _backends.get(t)
        if b is not None:
            return b
        err = _failures.get(t)
        if err is None:
            factory = _factories.get(t)
            if factory is None:
                raise DeviceUnavailableError(f"{op or t}: no laneflow backend is registered for device type {t!r}")
            try:
                b = _backends[t] = factory()
                return b
            except Exception as e:  # noqa: BLE001 - kept: every later use gets the same answer at once
                # kept without its traceback: its frames would hold the first caller's locals (the
                # user's arrays) alive for the rest of the process
                err = _failures[t] = DeviceUnavailableError(str(e))
    msg = str(err)
    raise DeviceUnavailableError(f"{op}: {msg}" if op else msg) from None


def loaded(device_type: str) -> Backend | None:
    """The backend of ``device_type`` if it was created already (never creates one)."""
    return _backends.get(device_type)
