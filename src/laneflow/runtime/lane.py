"""Lanes, points on a lane's timeline, and commands.

A lane is one backend execution queue (a CUDA stream, or a CPU worker thread). Commands submitted to
a lane run in submission order; the n-th command on a lane has sequence number n (from 1). A
:class:`Point` names "command n of lane L" together with the lane's vector clock at that moment,
which is what makes implied waits visible to the encoder.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Sequence

from ..errors import ExecutionError, LaneflowError
from .fence import Fence
from .stats import STATS

_lane_ids = itertools.count(1)
_RESOLVE = threading.Lock()


class _Caller(threading.local):
    """Per host thread: the commands this thread will run itself once it leaves the scheduling lock
    (``collect``, a list while ``lf.eval`` schedules, else None). See :meth:`Lane.run_deferred`."""

    collect: list | None = None


#: Where ``lf.eval`` collects the commands a lane left for it to run inline (``runtime/lane.py``).
CALLER = _Caller()


class not_waiting:
    """``with not_waiting():`` scheduling by a caller that will not wait for the work (``lf.async_eval``,
    an early or speculative launch): no command is left for this thread to run (``CALLER.collect``)."""

    __slots__ = ("outer",)

    def __enter__(self) -> None:
        self.outer = CALLER.collect
        CALLER.collect = None

    def __exit__(self, *exc: object) -> None:
        CALLER.collect = self.outer


def run_collected(collected: list) -> None:
    """Run the commands lanes deferred to this thread (``lf.eval``, after scheduling and before
    waiting): each runs here unless a later submission handed it back to its lane's own queue."""
    for lane, cmd in collected:
        lane.run_deferred(cmd)


class Point:
    """Command ``seq`` of ``lane``; ``clock`` maps other lanes to the sequence numbers it had waited for."""

    __slots__ = ("lane", "seq", "clock")

    def __init__(self, lane: "Lane", seq: int, clock: dict):
        self.lane, self.seq, self.clock = lane, seq, clock

    def __repr__(self) -> str:
        return f"Point({self.lane.name}#{self.seq})"


class DeferredCheck:
    """A failure only the device can see, known once the command has run: ``read()`` returns the error
    (or None) and may be called only after the command finished. Values a failing command produced,
    and everything computed from them, raise it at the host wait that needs them (``lf.eval``, a host
    read), as a failure detected on the host would."""

    __slots__ = ("_read", "_error", "where", "__weakref__")

    def __init__(self, read: Callable[[], LaneflowError | None]):
        self._read = read
        self._error = None
        #: the command's shapes, dtypes and lane (a ``site`` tuple), set when it runs; "" until then
        self.where: Any = ""

    def error(self) -> LaneflowError | None:
        if self._read is not None:
            with _RESOLVE:  # two threads evaluating one value: one reads, both see its answer
                read = self._read
                if read is not None:
                    err = read()
                    if isinstance(err, ExecutionError) and not err.where and self.where:
                        err = ExecutionError(err.op, err.__cause__, site_text(self.where))
                    self._error = err
                    self._read = None
        return self._error

    def bind(self, lane: "Lane", seq: int) -> None:
        """Called once the command is submitted: which point the check belongs to."""

    def passed(self, poll: bool = False) -> bool:
        """True when the check is known to have passed without waiting for the device: already read
        and clean, or (a backend's check that knows its command) its command finished and the read
        clean. ``poll``: the backend may ask the device whether the command finished (no wait)."""
        return self._read is None and self._error is None


#: Checks a buffer may carry before merging asks the device which of their commands have finished.
_POLL_AFTER = 4


def _merge(a: tuple | None, b: tuple) -> tuple | None:
    """The checks of ``a`` and ``b``, each once, less those known to have passed: a buffer written in
    place call after call (a donated KV cache that no one reads on the host) would otherwise carry
    every earlier call's checks, and merging them would grow with every call."""
    out = list(a) if a else []
    for c in b:
        if c.passed(len(out) >= _POLL_AFTER):
            continue
        if not any(c is x for x in out):
            out.append(c)
    return tuple(out) if out else None


def describe(ins: Sequence, outs: Sequence, lane: Any) -> str:
    """``inputs (4,) float64, (1,) int64; outputs (1,) float64; on lane cpu:0/s1.0``: what an error
    message says about the values a failing step read and wrote (any objects with shape and dtype)."""
    return site_text(site(ins, outs, lane))


def site(ins: Sequence, outs: Sequence, lane: Any) -> tuple:
    """What :func:`describe` says, kept as shapes and dtypes (no text, no reference to the values):
    a device-side check keeps this at submission and makes the words only if it fails."""
    return ([(getattr(d, "shape", None), getattr(d, "dtype", None)) for d in ins],
            [(getattr(d, "shape", None), getattr(d, "dtype", None)) for d in outs], getattr(lane, "name", lane))


def site_text(where: tuple) -> str:
    def desc(vals) -> str:
        return ", ".join("?" if shape is None else f"{tuple(shape)} {dtype}" for shape, dtype in vals) or "none"
    ins, outs, lane = where
    return f"inputs {desc(ins)}; outputs {desc(outs)}; on lane {lane}"


class Command:
    """One unit of backend work with the buffers it reads and writes.

    ``fn(lane)`` does the work (on the CPU it computes; on CUDA it enqueues); a primitive's command
    instead holds its kernel as ``fn`` and the kernel's arguments in ``prim``, ``ins`` and ``outs``
    (``fn(lane, prim, ins, outs)``), so no closure is made per command. If an input carries an error
    from a failed command, the work is skipped and the error passes to the outputs, so it is raised at
    the eval that needs it and the lane itself keeps working.
    """

    __slots__ = ("op", "fn", "reads", "writes", "seq", "prim", "ins", "outs")
    #: May run on the thread that waits for it (a whole plan's one command, ``HostCommand``): see
    #: :meth:`Lane.run_deferred`.
    inline = False
    #: Whether it reads memory of a device other than the CPU (a CPU lane then calls the driver:
    #: ``ThreadLane.driver_seq``); None: the CPU lane looks at ``reads``.
    device_reads: bool | None = None

    def __init__(self, op: str, fn: Callable, reads: Sequence, writes: Sequence, prim: Any = None,
                 ins: list | None = None, outs: list | None = None):
        self.op, self.fn, self.reads, self.writes, self.seq = op, fn, reads, writes, 0
        self.prim, self.ins, self.outs = prim, ins, outs

    def site(self, lane: "Lane") -> tuple:
        """:meth:`where` as :func:`site` keeps it (a kernel's own typed views)."""
        if self.prim is not None and self.ins is not None:
            return site(self.ins, self.outs, lane)
        return site([getattr(b, "data", None) for b in self.reads], [getattr(b, "data", None) for b in self.writes], lane)

    def where(self, lane: "Lane") -> str:
        """The command's inputs and outputs (shapes and dtypes of their data) and its lane, for an error
        message: computed only when the command failed (or, for a command with device-side checks,
        once when it is submitted)."""
        return site_text(self.site(lane))

    def run(self, lane: "Lane") -> None:
        err = None
        inherited = None
        seen = None
        for b in self.reads:
            if b.error is not None:
                err = b.error
                break
            cs = b.checks
            if cs is not None and cs is not seen:  # pending device-side checks pass on to what is computed from it
                inherited = _merge(inherited, cs)
                seen = cs  # buffers written together share one tuple (a call's outputs): merged once
        else:
            found = lane.checks = []
            try:
                if self.prim is None:
                    self.fn(lane)
                else:
                    self.fn(lane, self.prim, self.ins, self.outs)
            except Exception as e:  # noqa: BLE001 - any kernel failure becomes the op's error
                err = self.error_of(e, lane)
            finally:
                lane.checks = None
                if found:  # also after a failure: a kernel may have been launched
                    self._bind(lane, found)
            if err is None:
                if found:
                    inherited = _merge(inherited, tuple(found))
                for b in self.writes:
                    b.checks = inherited  # a write replaces the contents: only these checks apply now
                    if b.error is not None:
                        b.error = None     # a buffer rewritten (a compiled plan's region) is good again
                return
        for b in self.writes:
            b.error = err
            b.checks = None

    def _bind(self, lane: "Lane", found: list) -> None:
        # A kernel's error is read later, when its buffers may be gone: its shapes now (a few; a CUDA
        # graph's launch, reading every weight, names the op inside instead).
        where = self.site(lane) if self.prim is not None else ""
        for c in found:
            c.bind(lane, self.seq)
            c.where = where

    def bind_found(self, lane: "Lane", found: list, ok: bool) -> tuple | None:
        """The device-side checks the kernel registered (``found``) bound to this command, as :meth:`run`
        binds them (also after a failure); returns the outputs' checks when the kernel succeeded (``ok``)
        and the command inherits none, else None. The C enqueue (``backends/cuda/cenqueue.c``) calls it,
        after the kernel, when ``found`` is not empty."""
        self._bind(lane, found)
        return _merge(None, tuple(found)) if ok else None

    def error_of(self, e: Exception, lane: "Lane") -> LaneflowError:
        """The error the outputs get when the work raised ``e``: itself when it is laneflow's, else an
        :class:`ExecutionError` naming the op and its shapes."""
        return e if isinstance(e, LaneflowError) else ExecutionError(self.op, e, self.where(lane))

    def fail(self, e: Exception, lane: "Lane") -> None:
        """The work raised ``e``: every output carries its error (``error_of``). The C enqueue
        (``backends/cuda/cenqueue.c``) calls it as :meth:`run` fails its outputs."""
        err = self.error_of(e, lane)
        for b in self.writes:
            b.error = err
            b.checks = None

    def __repr__(self) -> str:
        return f"Command({self.op}#{self.seq})"


class HostCommand(Command):
    """A command that may run on the host thread about to wait for it, when its lane has nothing else
    to do (the CPU's whole-plan command: handing it to the worker thread and waiting costs a thread
    switch each way, on the order of the work of a small step)."""

    __slots__ = ("device_reads",)
    inline = True

    def __init__(self, op: str, fn: Callable, reads: Sequence, writes: Sequence, device_reads: bool | None = None):
        super().__init__(op, fn, reads, writes)
        self.device_reads = device_reads  # known to the plan that makes it: its reads need no scan


class Lane:
    """Base class of a backend lane. Backends implement ``_enqueue``, ``_enqueue_wait`` and ``fence``.

    The encoder owns ``submitted`` (last sequence number given out) and ``clock`` (the vector clock:
    for each other lane, the highest sequence number this lane has already waited for). ``clock`` is
    replaced, never mutated, so points can share it.
    """

    fence: Fence
    #: While a command runs: where its kernels put their :class:`DeferredCheck` objects (``defer``).
    checks: list | None = None
    #: ``submitted`` at the last ``lf.reset_stats()`` (``runtime/stats.py`` counts from it)
    stats_base = 0

    def __init__(self, device: Any, stream_id: int, index: int):
        self.id = next(_lane_ids)
        self.device = device
        self.stream_id = stream_id
        self.index = index
        self.name = f"{device}/s{stream_id}.{index}"
        self.submitted = 0
        self.clock: dict[Lane, int] = {}
        STATS.track(self)

    def __del__(self) -> None:
        try:
            STATS.gone(self)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- what the encoder calls ---------------------------------------------------------------
    def submit(self, cmd: Command) -> None:
        self._enqueue(cmd)

    def wait(self, point: Point) -> None:
        """Make later commands on this lane wait for ``point`` (never a host wait on the GPU)."""
        self._enqueue_wait(point)

    def defer(self, check: DeferredCheck) -> bool:
        """Attach a device-side check to the running command's outputs. False when no command is
        running (a kernel being captured into a CUDA graph): the check cannot be reported."""
        checks = self.checks
        if checks is None:
            return False
        checks.append(check)
        return True

    def pending(self) -> int:
        """Commands submitted but not yet known to be finished (the lane's load)."""
        return self.submitted - self.fence.value

    def host_wait(self, seq: int, timeout: float | None = None) -> bool:
        return self.fence.wait(seq, timeout)

    def close(self) -> None:
        """Release the lane's resources once everything submitted has run."""

    def run_deferred(self, cmd: Command) -> None:
        """Run ``cmd``, which ``_enqueue`` left to the submitting thread (``CALLER.collect``), unless it
        was handed to the lane's queue meanwhile. Lanes that never defer have nothing to do."""

    # -- backend part ---------------------------------------------------------------------------
    def _enqueue(self, cmd: Command) -> None:
        raise NotImplementedError

    def _enqueue_wait(self, point: Point) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Lane {self.name} submitted={self.submitted}>"

    # Lanes hash and compare by identity (object's defaults, which are fast: they key hot dicts).
