"""CPU collectives between processes through MPI (mpi4py), as MLX's MPI backend does.

Every call is non-blocking (``Iallreduce``...) and polled against the group's timeout, so a dead or
absent peer fails the op instead of hanging it. Before each collective the ranks gather a signature
row (``signature.py``) and refuse to run a collective they disagree on. Half types are reduced in
float32 (MPI has none) and rounded once; bools reduce as bytes (max: any, min: all).

mpi4py initialises MPI with ``MPI_THREAD_MULTIPLE``; laneflow calls it from the communication lane's
worker thread and, for ``init``'s checks and ``barrier``, the host thread.
"""

from __future__ import annotations

import atexit
import os

import numpy as np

from .. import dtypes as dt
from .group import DistributedError
from .signature import WIDTH, agree, array_of, row
from .transports import HALF, poll

_GROUPS: list = []
#: seconds a rank whose group broke waits at exit before aborting the launch
ABORT_GRACE_S = 2.0


def world():
    """mpi4py's COMM_WORLD (importing mpi4py initialises MPI)."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError("distributed.init: MPI was asked for, but mpi4py does not import "
                               f"({e}); pip install 'laneflow[distributed]' (mpi4py and the mpich wheel)") from None
    return MPI


def mpiexec() -> str | None:
    """The ``mpiexec`` that launches processes for this Python (the mpich wheel's, beside the
    interpreter, else the first on PATH), or None when it or mpi4py is missing. Does not start MPI."""
    import importlib.util
    import shutil
    import sys
    from pathlib import Path
    if importlib.util.find_spec("mpi4py") is None:
        return None
    here = Path(sys.executable).with_name("mpiexec")
    return str(here) if here.exists() else shutil.which("mpiexec")


def launch(n: int) -> tuple[list[str], dict[str, str]] | None:
    """How to start ``n`` ranks: the command's head (``mpiexec -n n``; append the program) and the
    environment it needs on top of the caller's, or None when :func:`mpiexec` finds none.

    Open MPI's ``mpiexec`` (a system MPI) refuses to start as root, as in a container, unless asked
    to (its documented ``OMPI_ALLOW_RUN_AS_ROOT`` pair), and refuses more ranks than the machine has
    cores unless oversubscription is allowed (``rmaps_base_oversubscribe`` in Open MPI 4, the default
    mapping policy ``:oversubscribe`` in 5's PRRTE); MPICH's needs neither. Which one it is comes from
    ``mpiexec --version``, asked once per process. A variable the caller's environment sets already
    is left as it is."""
    exe = mpiexec()
    if exe is None:
        return None
    env = {}
    if _is_open_mpi(exe):
        env = {k: v for k, v in _OPEN_MPI_ENV.items() if k not in os.environ}
    return [exe, "-n", str(n)], env


_OPEN_MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                 "OMPI_MCA_rmaps_base_oversubscribe": "true",
                 "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}


def describe() -> str:
    """Which ``mpiexec`` launches ranks here, and whose (``laneflow info``)."""
    exe = mpiexec()
    if exe is None:
        return "none (pip install 'laneflow[distributed]': mpi4py and the mpich wheel)"
    return f"{exe} ({'Open MPI: may start as root and oversubscribe' if _is_open_mpi(exe) else 'MPICH or other'})"


_VENDOR: dict[str, bool] = {}


def _is_open_mpi(exe: str) -> bool:
    found = _VENDOR.get(exe)
    if found is None:
        import subprocess
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
            text = out.stdout + out.stderr
        except (OSError, subprocess.SubprocessError):
            text = ""
        found = _VENDOR[exe] = "Open MPI" in text or "OpenRTE" in text  # (4.x says "mpiexec (OpenRTE)")
    return found


def _bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a contiguous array (outputs are; inputs are made so), as MPI moves them."""
    return a.reshape(-1).view(np.uint8)


def _work(dtype: np.dtype) -> np.dtype:
    """The dtype MPI reduces ``dtype`` in."""
    if dtype in HALF:
        return dt.float32
    if dtype == dt.bool_:
        return np.dtype(np.uint8)
    return dtype


class MPITransport:
    """A group's CPU transport over an MPI communicator (COMM_WORLD by default)."""

    name = "mpi"

    def __init__(self, group, comm=None):
        MPI = self.MPI = world()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.group = group
        self.seq = 0  # collectives run so far (only the communication lane runs them)
        self.ops = {"sum": MPI.SUM, "avg": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
        if self.comm.Get_size() != group.size or self.comm.Get_rank() != group.rank:
            raise DistributedError(f"distributed.init: MPI says rank {self.comm.Get_rank()} of "
                                   f"{self.comm.Get_size()}, the launcher's variables rank {group.rank} of "
                                   f"{group.size}; launch with mpirun/mpiexec alone")
        if not _GROUPS:
            atexit.register(_abort_if_broken)
        _GROUPS.append(group)

    def _wait(self, req, op: str) -> None:
        poll(req.Test, self.group, op, self.seq)

    def _agree(self, op: str, reduction, root, shape, dtype) -> None:
        self.seq += 1
        g = self.group
        if g.size > 1 and g.check:
            gather_rows(self.comm, g, self.seq, op, reduction, root, shape, dtype)

    def run(self, lane, prim, ins, outs) -> None:
        op = prim.name
        if op in ("send", "recv"):
            return self._p2p(prim, ins, outs)
        x = np.ascontiguousarray(ins[0]) if ins else None
        shape, dtype = (x.shape, x.dtype) if x is not None else ((), dt.bool_)
        self._agree(op, prim.reduction, prim.root, shape, dtype)
        comm = self.comm
        if op == "barrier":
            self._wait(comm.Ibarrier(), op)
            return
        out = outs[0]
        if op == "all_gather" or op == "broadcast":
            if op == "broadcast":
                if self.group.rank == prim.root:
                    np.copyto(out, x)
                self._wait(comm.Ibcast(_bytes(out), root=prim.root), op)
            else:
                self._wait(comm.Iallgather(_bytes(x), _bytes(out)), op)
            return
        work = _work(dtype)
        send = x.astype(work, copy=False)
        recv = out if work == dtype else np.empty(out.shape, work)
        mop = self.ops[prim.reduction]
        if op == "all_reduce":
            self._wait(comm.Iallreduce(send, recv, mop), op)
        else:  # reduce_scatter: equal blocks along axis 0, rank r keeps block r
            self._wait(comm.Ireduce_scatter_block(send, recv, mop), op)
        if prim.reduction == "avg":
            np.divide(recv, self.group.size, out=recv, casting="unsafe")
        if recv is not out:
            np.copyto(out, recv, casting="unsafe")

    def _p2p(self, prim, ins, outs) -> None:
        """send / recv: a header (dtype, shape) then the bytes, on tags 2t+1 and 2t; a receiver that
        expected another shape or dtype takes the bytes anyway (so the sender is not left waiting) and
        fails naming both."""
        comm, op, tag = self.comm, prim.name, prim.tag
        if op == "send":
            x = np.ascontiguousarray(ins[0])
            head = row(0, "broadcast", None, None, x.shape, x.dtype)
            self._wait(comm.Isend(head, dest=prim.root, tag=2 * tag + 1), op)
            self._wait(comm.Isend(_bytes(x), dest=prim.root, tag=2 * tag), op)
            return
        out = outs[0]
        head = np.empty(WIDTH, np.int64)
        self._wait(comm.Irecv(head, source=prim.root, tag=2 * tag + 1), op)
        want = row(0, "broadcast", None, None, out.shape, out.dtype)
        if np.array_equal(head, want):
            self._wait(comm.Irecv(_bytes(out), source=prim.root, tag=2 * tag), op)
            return
        nbytes = int(np.prod(head[6:6 + int(head[5])], dtype=np.int64)) * 16  # (large enough for any dtype)
        self._wait(comm.Irecv(np.empty(nbytes, np.uint8), source=prim.root, tag=2 * tag), op)
        raise DistributedError(f"recv: rank {prim.root} sent {array_of(head)} with tag {tag}, this rank expected "
                               f"{array_of(want)}; give recv the sender's shape and dtype")

    def close(self) -> None:
        pass


def gather_rows(comm, group, seq: int, op: str, reduction, root, shape, dtype) -> None:
    """Every rank's signature row of its ``seq``-th collective, gathered over the MPI communicator
    ``comm`` (polled against the group's timeout); raises when they disagree."""
    rows = np.empty((group.size, WIDTH), np.int64)
    poll(comm.Iallgather(row(seq, op, reduction, root, shape, dtype), rows).Test, group, op, seq)
    agree(rows, group.rank, op)


def _abort_if_broken() -> None:
    """At exit: a group whose collective timed out holds a request MPI_Finalize may wait on forever;
    abort the launch instead (mpiexec then stops every rank)."""
    for g in _GROUPS:
        if g.broken is not None:
            try:
                import sys
                import time
                sys.stdout.flush()
                sys.stderr.flush()
                time.sleep(ABORT_GRACE_S)  # the other ranks' own timeouts end about now: let them report
                world().COMM_WORLD.Abort(1)
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
