"""GPU collectives between processes through NCCL (nccl4py's bindings), on laneflow's own pointers
and streams.

One communicator per group and device, made on the first GPU collective of that device: rank 0's
unique id reaches the others through MPI's broadcast under an MPI launch, else through the TCP
exchange of ``rendezvous.py`` (torchrun: ``MASTER_ADDR``, port ``LANEFLOW_RDZV_PORT`` or
``MASTER_PORT`` + 1). Every rank drives one GPU per group (the device of its arrays).

Each collective is one NCCL call enqueued on the communication lane's stream; the host never waits
for it. What the host cannot see (a peer that died in the middle of a collective) the *watchdog*
does: a thread that follows an event recorded after every collective (and after every CUDA graph
launch holding collectives) and, past the group's timeout or on an asynchronous NCCL error, aborts the
communicator (NCCL's kernels then return), breaks the group, and makes the values of the failed
collective, and everything computed from them, raise :class:`DistributedError` at the host wait that
needs them (a deferred check, as index errors found by a kernel are reported).

Signatures (``init(check=True)``): under an MPI launch the ranks gather each collective's signature
row over a duplicate of COMM_WORLD (a host round trip, no GPU wait); without MPI the rows go through
NCCL itself and the host waits for them, which serialises the host with the communication lane:
``check=False`` (or ``LANEFLOW_DIST_CHECK=0``) is the fast setting once a program is known to agree.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
import time

import numpy as np
from cuda.bindings import driver as cu

from .. import dtypes as dt
from ..backends.cuda.driver import check
from ..runtime.lane import DeferredCheck
from .group import DistributedError
from .signature import WIDTH, agree, row
from .transports import poll

#: ncclDataType_t of each dtype NCCL moves natively (bool as bytes; complex as pairs of its float)
_NCCL_DTYPE = {dt.int8: 0, np.dtype(np.uint8): 1, dt.int32: 2, np.dtype(np.uint32): 3, dt.int64: 4,
               np.dtype(np.uint64): 5, dt.float16: 6, dt.float32: 7, dt.float64: 8, dt.bfloat16: 9,
               dt.bool_: 1, dt.complex64: 7, dt.complex128: 8}
_NCCL_OP = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
#: seconds between the watchdog's looks at the pending collectives
WATCH_S = 0.02

_lib = None


def bindings():
    """nccl4py's low-level bindings, libnccl loaded: ``LANEFLOW_NCCL_LIBRARY`` if set, else the one the
    loader finds, else the ``nvidia-nccl`` wheel's (torch and cupy install it beside themselves)."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        from nccl.bindings import nccl as N
    except ImportError as e:
        raise DistributedError(f"GPU collectives need nccl4py, which does not import ({e}); pip install "
                               "'laneflow[nccl]' (nccl4py and the NCCL library)") from None
    tried = []
    for path in _library_candidates():
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError as e:
            tried.append(f"{path}: {e}")
    try:
        N.get_version()
    except Exception as e:  # noqa: BLE001 - the bindings' loader error
        raise DistributedError(f"GPU collectives: nccl4py cannot load libnccl ({e}); tried "
                               f"{'; '.join(tried) or 'the loader path'}. Set LANEFLOW_NCCL_LIBRARY to the "
                               "path of libnccl.so.2, or pip install nvidia-nccl-cu12") from None
    _lib = N
    return N


def _library_candidates() -> list[str]:
    env = os.environ.get("LANEFLOW_NCCL_LIBRARY")
    if env:
        return [env]
    found = []
    for entry in sys.path:
        found.extend(sorted(glob.glob(os.path.join(entry or ".", "nvidia", "nccl", "lib", "libnccl.so*"))))
    return ["libnccl.so.2", *found]


def version() -> str:
    """The loaded NCCL's version, '2.27.3'."""
    v = bindings().get_version()  # major * 10000 + minor * 100 + patch since NCCL 2.9
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def unique_id_bytes(group, device, side, n: int = 0) -> bytes:
    """Rank 0's NCCL unique id on every rank: MPI's broadcast (``side``, a communicator) when there is
    one, else the TCP exchange (torchrun-style launches), else this process's own (a group of one).
    ``n``: the group's communicator count so far, the same on every rank (each rank's ``device`` is
    its own GPU, so it cannot tell the exchanges apart)."""
    N = bindings()
    mine = bytes(memoryview(N.get_unique_id())) if group.rank == 0 else None
    if group.size == 1:
        return mine
    if side is not None:
        return side.bcast(mine, root=0)
    info = group.info
    if info.master_addr is None:
        raise DistributedError(f"GPU collectives: a {info.launcher} launch of {group.size} ranks without MPI has no "
                               "address to exchange NCCL's unique id at; launch with torchrun (MASTER_ADDR, "
                               "MASTER_PORT) or mpirun")
    from .rendezvous import exchange, port
    return exchange(info.master_addr, port(info), group.rank, group.size, mine, key=f"nccl:{n}",
                    timeout=group.timeout)


def _init_rank(N, nranks: int, uid, rank: int):
    """ncclCommInitRank through either form nccl4py has had: returning the communicator (0.6: an
    object the other calls take), or writing its handle where a pointer says (later releases)."""
    try:
        return N.comm_init_rank(nranks, uid, rank)
    except TypeError:
        box = np.zeros(1, np.uint64)
        N.comm_init_rank(box.ctypes.data, nranks, uid, rank)
        return int(box[0])


class NCCLTransport:
    """A group's transport for the arrays of one GPU: an NCCL communicator on it, and its watchdog."""

    name = "nccl"
    #: a collective may be captured into lf.compile's CUDA graphs (NCCL kernels replay in graphs)
    capturable = True

    def __init__(self, group, device, side=None):
        from ..runtime.backend import backend_for
        N = self.N = bindings()
        self.group, self.device, self.side = group, device, side
        self.ctx = backend_for(device).context(device.index)
        self.ctx.ensure_current()
        n = getattr(group, "nccl_comms", 0)
        group.nccl_comms = n + 1
        uid = N.UniqueId.from_buffer(bytearray(unique_id_bytes(group, device, side, n)))
        try:
            self.comm = _init_rank(N, group.size, uid, group.rank)
        except Exception as e:  # noqa: BLE001 - NCCLError
            raise DistributedError(f"GPU collectives on {device}: ncclCommInitRank (rank {group.rank} of "
                                   f"{group.size}) failed: {e}; every rank needs its own GPU and the same "
                                   "NCCL version") from None
        self.seq = 0
        self.failed: dict[int, str] = {}  # seq -> why (watchdog); a broken group fails every later seq too
        self._pending: list = []          # (event, seq, op, deadline) the watchdog follows
        self._free: list = []             # events passed, to record again (list.pop/append: atomic)
        self._cv = threading.Condition()
        self._closed = False
        self._rows = None                 # Buffer of the signature rows (the check through NCCL)
        self._lock = threading.Lock()     # held around every NCCL call and the abort
        self.aborted = False
        self._watch = threading.Thread(target=self._watchdog, name=f"laneflow-nccl-watchdog-{device}", daemon=True)
        self._watch.start()

    # -- the command body ----------------------------------------------------------------------
    def run(self, lane, prim, ins, outs) -> None:
        op = prim.name
        x = ins[0] if ins else None
        out = outs[0] if outs else None
        ref = x if x is not None else out
        shape, dtype = (ref.shape, ref.dtype) if ref is not None else ((), dt.bool_)
        self._usable(op)
        if op in ("send", "recv") and prim.tag:
            raise DistributedError(f"{op}: NCCL has no message tags (tag={prim.tag}); on GPUs a send and its recv "
                                   "pair by order between the two ranks: use tag=0")
        if ref is not None and op != "barrier":  # (the count of a gather or a broadcast is its input's)
            count, ty = self._count(x if op in ("send", "broadcast", "all_gather") else out, op)
            red = self._reduction(op, prim.reduction, dtype) if prim.reduction is not None else 0
        self.seq += 1
        seq = self.seq
        self._agree(lane, seq, op, prim.reduction, prim.root, shape, dtype)
        if ref is not None and ref.size == 0 and op != "barrier":
            return  # nothing to move (every rank agreed on the empty shape)
        N, s = self.N, lane.handle
        with self._lock:
            self._usable(op)
            comm = self.comm
            if op == "barrier":
                scratch = self._scratch(lane)  # a one-byte all-reduce: its completion is the barrier
                N.all_reduce(scratch, scratch, 1, 1, 2, comm, s)
            elif op == "send":
                N.send(x.ptr, count, ty, prim.root, comm, s)
            elif op == "recv":
                N.recv(out.ptr, count, ty, prim.root, comm, s)
            elif op == "broadcast":
                N.broadcast(x.ptr, out.ptr, count, ty, prim.root, comm, s)
            elif op == "all_gather":
                N.all_gather(x.ptr, out.ptr, count, ty, comm, s)
            elif op == "all_reduce":
                N.all_reduce(x.ptr, out.ptr, count, ty, red, comm, s)
            else:
                N.reduce_scatter(x.ptr, out.ptr, count, ty, red, comm, s)
        self._follow(lane, seq, op)

    def _usable(self, what: str) -> None:
        """Raise when the group is broken (by any transport) or this communicator was aborted."""
        if self.group.broken is not None or self.aborted:
            raise DistributedError(f"{what}: this group is broken by an earlier failure "
                                   f"({self.group.broken or 'NCCL communicator aborted'}); restart the processes")

    def _count(self, h, op: str) -> tuple[int, int]:
        ty = _NCCL_DTYPE.get(h.dtype)
        if ty is None:
            names = ", ".join(sorted({str(d) for d in _NCCL_DTYPE}))
            raise DistributedError(f"{op}: NCCL cannot move {h.dtype} arrays (shape {tuple(h.shape)} on {self.device}); "
                                   f"cast to one of {names}")
        return h.size * (2 if h.dtype.kind == "c" else 1), ty

    @staticmethod
    def _reduction(op: str, reduction: str, dtype: np.dtype) -> int:
        if dtype.kind == "c" and reduction == "prod":
            raise DistributedError(f"{op}: reduction 'prod' of a {dtype} array on the GPU (NCCL reduces the "
                                   "real and imaginary parts apart); reduce on the CPU or use 'sum'")
        return _NCCL_OP[reduction]

    def _scratch(self, lane) -> int:
        """The device address of the signature rows (also the barrier's byte): laneflow memory, usable
        on every lane, kept for the communicator's life."""
        if self._rows is None:
            from ..runtime.backend import backend_for
            self._rows = backend_for(self.device).allocate_region(self.device, max(1, self.group.size) * WIDTH * 8,
                                                                  "NCCL signature rows")
        return self._rows.data.ptr

    # -- signatures -----------------------------------------------------------------------------
    def _agree(self, lane, seq: int, op: str, reduction, root, shape, dtype) -> None:
        g = self.group
        if g.size == 1 or not g.check or op in ("send", "recv"):
            return
        if self.side is not None:  # over MPI, on the host
            from .mpi import gather_rows
            gather_rows(self.side, g, seq, op, reduction, root, shape, dtype)
            return
        if lane.checks is None:
            return  # being captured into a CUDA graph: no host wait there (the ranks agreed on the trace)
        # through NCCL: the host waits for the rows, so for the communication lane
        mine = row(seq, op, reduction, root, shape, dtype)
        rows = np.empty((g.size, WIDTH), np.int64)
        base = self._scratch(lane)  # rank r's row at base + r * WIDTH * 8
        check(cu.cuMemcpyHtoDAsync(base + g.rank * WIDTH * 8, mine.ctypes.data, WIDTH * 8, lane.stream),
              f"{op}: signature upload")
        with self._lock:
            self._usable(op)
            self.N.all_gather(base + g.rank * WIDTH * 8, base, WIDTH, 4, self.comm, lane.handle)
        try:  # the gather done before the copy (into pageable memory, it would block inside the driver)
            poll(lambda: cu.cuStreamQuery(lane.stream)[0] == cu.CUresult.CUDA_SUCCESS, g, op, seq)
        except DistributedError:
            self._fail(seq, op, f"the ranks' signatures did not meet within {g.timeout:g} s")
            raise
        check(cu.cuMemcpyDtoHAsync(rows.ctypes.data, base, rows.nbytes, lane.stream), f"{op}: signature read")
        agree(rows, g.rank, op)

    # -- the watchdog ---------------------------------------------------------------------------
    def _follow(self, lane, seq: int, op: str) -> None:
        """Watch what the running command on ``lane`` just enqueued (``seq``): an event after it that
        must pass within the timeout, and a deferred check on the command's outputs. In a graph capture
        no command runs: the executor follows the whole launch instead (``follow_launch``)."""
        if lane.checks is None:
            return
        ev = self._free.pop() if self._free else check(
            cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), f"{op}: watchdog event")
        check(cu.cuEventRecord(ev, lane.stream), f"{op}: watchdog event")
        with self._cv:
            self._pending.append((ev, seq, op, time.monotonic() + self.group.timeout))
            self._cv.notify()
        lane.defer(DeferredCheck(lambda: self.error_of(seq)))

    def follow_launch(self, lane) -> None:
        """A CUDA graph holding this communicator's collectives was just launched on ``lane`` (inside
        its command): follow it as one collective, and fail its values if the watchdog fails it."""
        self.seq += 1
        self._follow(lane, self.seq, "compiled graph")

    def error_of(self, seq: int) -> DistributedError | None:
        why = self.failed.get(seq)
        if why is None and self.failed and seq >= min(self.failed):
            why = next(iter(self.failed.values()))
        return DistributedError(why) if why is not None else None

    def _watchdog(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed and not self._pending:
                    return
                pending = list(self._pending)
            done = []
            try:
                self.ctx.ensure_current()
                asyncerr = self.N.comm_get_async_error(self.comm) if not self.aborted else 0
            except Exception as e:  # noqa: BLE001 - a destroyed communicator at exit
                asyncerr = str(e)
            now = time.monotonic()
            for item in pending:
                ev, seq, op, deadline = item
                r = cu.cuEventQuery(ev)[0]
                if r == cu.CUresult.CUDA_SUCCESS:
                    done.append(item)
                elif r != cu.CUresult.CUDA_ERROR_NOT_READY:
                    self._fail(seq, op, f"the device reported {r.name}")
                    done.append(item)
                elif asyncerr:
                    self._fail(seq, op, f"NCCL reported an asynchronous error ({asyncerr})")
                elif now > deadline:
                    self._fail(seq, op, f"not every rank took part within {self.group.timeout:g} s; a peer may "
                                        "have died or hung, or the ranks called different collectives")
            if done:
                with self._cv:
                    for item in done:
                        self._pending.remove(item)
                        self._free.append(item[0])  # passed: recorded again by a later collective
            time.sleep(WATCH_S)

    def _fail(self, seq: int, op: str, why: str) -> None:
        """Break the group and abort the communicator (once, whoever broke the group first), so the
        stuck NCCL kernels return."""
        msg = (f"{op} (collective #{seq}) on {self.device}: {why}. The group is broken (NCCL communicator "
               "aborted); restart the processes (lf.distributed.init(timeout=...) sets the limit)")
        self.failed.setdefault(seq, msg)
        if self.group.broken is None:
            self.group.broken = f"{op} (collective #{seq}) failed: {why}"
        with self._lock:
            if not self.aborted:
                self.aborted = True
                try:
                    self.N.comm_abort(self.comm)
                except Exception:  # noqa: BLE001 - aborting anyway
                    pass

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._watch.join(timeout=max(5.0, 2 * WATCH_S))
        try:
            self.ctx.ensure_current()
            if not self._watch.is_alive():  # (a watchdog still following stuck kernels keeps its events)
                for ev in [*self._free, *(item[0] for item in self._pending)]:
                    cu.cuEventDestroy(ev)
            if not self.aborted:
                self.N.comm_destroy(self.comm)
        except Exception:  # noqa: BLE001 - at exit
            pass
