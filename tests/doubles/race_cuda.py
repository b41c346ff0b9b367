"""A happens-before checker for the CUDA backend's host-side ordering, on top of ``fake_cuda`` (no GPU).

It models what a real GPU would do with the commands laneflow enqueues: each stream has a vector
clock; events, stream waits and host synchronisations (event, stream, context) carry clocks; memory is
allocated and freed in stream order and never reused; and the GPU never finishes anything unless
the host learns it did (``cuEventQuery`` succeeds at random, ``RACE_PDONE``). It records the memory
each command reads and writes (its declared buffers), each graph launch (the pointers captured into
the graph) and the device copies of compiled calls (staging, moving kept outputs), and reports
accesses to the same bytes, one a write, that are not ordered; use after free; a free not ordered
after every access; a double free. Each library call through a handle pool writes its workspace on
its lane's stream, so two lanes sharing a workspace show up as a race. ``consumer_read`` stands for another library reading memory on
its own stream (DLPack). CPU lanes are modelled too: a CPU lane's command reading device memory
(a copy to the host) carries the clock "cpu:<lane>" at its sequence number; a GPU stream waiting for a
CPU lane (``HostSignals.gpu_wait``) and the host learning that a CPU lane passed a point (its fence)
carry it on. Accesses are recorded in host order, not run order, so a race is two accesses neither of
which is ordered before the other.

    import race_cuda; race_cuda.install()   # instead of fake_cuda.install(), before using laneflow
    ...                                     # run laneflow code
    race_cuda.finish()                      # prints the errors (race_cuda.errors) or "clean"

``install(execute_streams=True)`` models the device's progress too (streams run their event records
and waits in order; host waits block), so a wait for work that can never run is reported as a HANG
(``race_cuda.hangs``) instead of freezing the test.

Used by ``tests/test_fake_gpu_races.py``; values are garbage, as with ``fake_cuda``.
"""

from __future__ import annotations

import bisect
import os
import random
import threading
import traceback

import fake_cuda
from fake_cuda import FAKES, OK

real = fake_cuda.real
NOT_READY = real.CUresult.CUDA_ERROR_NOT_READY
rng = random.Random(int(os.environ.get("RACE_SEED", "1")))
P_DONE = float(os.environ.get("RACE_PDONE", "0.3"))

streams = {}     # key -> [n, vc]
host_done = {}
events = {}
allocs = {}      # base -> dict(size, op, freed, acc)
bases = []
errors = []
capturing = [False]
special = [0]
exec_acc = {}
_cap_list = [None]
_ids = fake_cuda._ids
_ptrs = fake_cuda._ptrs
host_n = [0]
oom = [0]
fail_next = [0]
fail_min = [0]


def merge(a, b):
    for k, v in list(b.items()):  # (a snapshot: another thread may learn more of host_done meanwhile)
        if a.get(k, 0) < v:
            a[k] = v


def st(s):
    k = int(s)
    x = streams.get(k)
    if x is None:
        x = streams[k] = [0, {}]
    return k, x


def new_op(s, what):
    k, x = st(s)
    merge(x[1], host_done)
    x[0] += 1
    x[1][k] = x[0]
    return (k, x[0], dict(x[1]), what)


_cpu = threading.local()  # the CPU-lane command a worker thread is running: (lane name, seq)


def host_op(what):
    """An access by the host: by the main thread (clock "host"), or by a CPU lane's command (clock
    "cpu:<lane>" at the command's sequence number, which a GPU stream's wait on that CPU lane
    carries: ``HostSignals.gpu_wait``)."""
    cur = getattr(_cpu, "cmd", None)
    vc = dict(host_done)
    if cur is not None:
        key = "cpu:" + cur[0]
        vc[key] = cur[1]
        return (key, cur[1], vc, what)
    host_n[0] += 1
    vc["host"] = host_n[0]
    host_done["host"] = host_n[0]
    return ("host", host_n[0], vc, what)


def hb(a, b):
    return b[2].get(a[0], 0) >= a[1]


def report(msg):
    stack = "".join(traceback.format_stack(limit=14)[:-2])
    errors.append(msg + "\n" + stack)


def find(ptr):
    i = bisect.bisect_right(bases, ptr) - 1
    if i < 0:
        return None
    a = allocs[bases[i]]
    if ptr < bases[i] + a["size"]:
        return bases[i], a
    return None


def access(op, ptr, n, kind, what=""):
    ptr, n = int(ptr), int(n)
    if not ptr or n <= 0:
        return
    f = find(ptr)
    if f is None:
        return
    base, a = f
    if a["freed"] is not None:
        report(f"USE AFTER FREE: {kind} {what} at {ptr:#x}+{n} (alloc {base:#x}) by {op[3]} after free {a['freed'][3]}")
        return
    if not hb(a["op"], op):
        report(f"USE BEFORE ALLOC ORDERED: {kind} {what} at {ptr:#x} by {op[3]}")
    lo, hi = ptr, ptr + n
    for (p_lo, p_hi, pk, pop) in a["acc"]:
        # recorded in host order, not run order (a CPU lane runs later what a stream waits for):
        # a race when neither access is ordered before the other
        if (p_lo < hi and lo < p_hi and (pk == "w" or kind == "w") and pop is not op and not hb(pop, op)
                and not hb(op, pop)):
            report(f"RACE: {kind} {what} [{lo:#x},{hi:#x}) by {op[3]}@{op[0]}#{op[1]} vs earlier {pk} by "
                   f"{pop[3]}@{pop[0]}#{pop[1]}")
            break
    a["acc"].append((lo, hi, kind, op))
    if len(a["acc"]) > 400:
        a["acc"] = a["acc"][-200:]


def cu_alloc(n, pool, s):
    if fail_next[0] > 0 and n >= fail_min[0]:
        fail_next[0] -= 1
        return (real.CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0)
    if oom[0] and n >= oom[0]:
        return (real.CUresult.CUDA_ERROR_OUT_OF_MEMORY, 0)
    ptr = next(_ptrs)
    n = int(n)
    # never reuse addresses; keep alignment-sized gaps
    for _ in range((n >> 20) + 1):
        next(_ptrs)
    op = new_op(s, "alloc")
    allocs[ptr] = {"size": max(n, 1), "op": op, "freed": None, "acc": []}
    bisect.insort(bases, ptr)
    return (OK, ptr)


def cu_free(p, s):
    p = int(p)
    a = allocs.get(p)
    op = new_op(s, "free")
    if a is None:
        report(f"FREE of unknown {p:#x}")
        return (OK,)
    if a["freed"] is not None:
        report(f"DOUBLE FREE {p:#x}")
        return (OK,)
    for (lo, hi, k, pop) in a["acc"]:
        if not hb(pop, op):
            report(f"FREE BEFORE ACCESS ORDERED: {p:#x} free on {op[0]} vs {k} by {pop[3]}@{pop[0]}#{pop[1]}")
            break
    a["freed"] = op
    return (OK,)


def ev_record(ev, s):
    if capturing[0]:
        return (OK,)
    k, x = st(s)
    merge(x[1], host_done)
    events[int(ev)] = dict(x[1])
    return (OK,)


def ev_wait(s, ev, flags):
    if capturing[0]:
        return (OK,)
    k, x = st(s)
    vc = events.get(int(ev))
    if vc is not None:
        merge(x[1], vc)
    return (OK,)


def done(vc):
    return all(host_done.get(k, 0) >= v for k, v in vc.items())


def ev_query(ev):
    vc = events.get(int(ev), {})
    if done(vc):
        return (OK,)
    if rng.random() < P_DONE:
        merge(host_done, vc)
        return (OK,)
    return (NOT_READY,)


def ev_sync(ev):
    merge(host_done, events.get(int(ev), {}))
    return (OK,)


def stream_sync(s):
    k, x = st(s)
    merge(host_done, x[1])
    return (OK,)


def ctx_sync():
    for k, x in streams.items():
        merge(host_done, x[1])
    return (OK,)


def begin_capture(s, mode):
    capturing[0] = True
    return (OK,)


def end_capture(s):
    capturing[0] = False
    return (OK, next(_ids))


def graph_launch(ex, s):
    op = new_op(s, "cuGraphLaunch")
    for (p, n, k) in exec_acc.get(int(ex), ()):
        access(op, p, n, k, "graph")
    return (OK,)


def dtod(dst, src, n, s):
    if capturing[0] or not special[0]:
        return (OK,)
    op = new_op(s, "memcpyDtoD")
    access(op, src, n, "r", "copy src")
    access(op, dst, n, "w", "copy dst")
    return (OK,)


def dtoh(host, src, n):
    op = host_op("memcpyDtoH")
    access(op, src, n, "r", "host read")
    return (OK,)


def consumer_read(stream_handle, ptr, n):
    op = new_op(stream_handle, "consumer read")
    access(op, ptr, n, "r", "consumer")


# -- the device's progress (``install(execute_streams=True)``): what a blocking wait really waits for ----------
#
# Each stream runs its event records and its waits in order: an event record completes when the
# stream reaches it; ``cuStreamWaitEvent`` waits for the event's most recent record *at the time of
# the call* (re-recording the event later does not move that wait); ``cuStreamWaitValue64`` waits for
# the 64-bit host word to reach its value. ``cuEventQuery`` / ``cuEventSynchronize`` look at the
# event's most recent record at the time of the call. Streams advance a step at random (``RACE_PDONE``)
# whenever the host calls the driver, so work finishes at unpredictable times; a blocking call keeps
# advancing them and, when what it waits for has not happened after ``RACE_HANG_S`` seconds, reports a HANG (with what
# every blocked stream waits for) and returns an error instead of blocking forever.

HANG_S = float(os.environ.get("RACE_HANG_S", "3"))
_xlock = threading.RLock()
_queue = {}      # stream key -> list of pending ("rec", ev, n) | ("wev", ev, n) | ("wval", addr, value)
_rec_n = {}      # event -> number of its most recent record
_ran = {}        # event -> numbers of its records that have run
hangs = []
_TIMEOUT = real.CUresult.CUDA_ERROR_LAUNCH_TIMEOUT


def _word(addr):
    import ctypes
    return ctypes.c_uint64.from_address(addr).value


def _ready(op):
    kind = op[0]
    if kind == "rec":
        return True
    if kind == "wev":
        return op[2] in _ran.get(op[1], ())
    return _word(op[1]) >= op[2]


def _run(op):
    if op[0] == "rec":
        _ran.setdefault(op[1], set()).add(op[2])


def advance(p=None):
    """Let every stream run what it can, each step with probability ``p`` (default RACE_PDONE)."""
    p = P_DONE if p is None else p
    with _xlock:
        moved = True
        while moved:
            moved = False
            for q in _queue.values():
                while q and _ready(q[0]) and (p >= 1.0 or rng.random() < p):
                    _run(q.pop(0))
                    moved = True
            if p < 1.0:
                break


def _push(s, op):
    with _xlock:
        _queue.setdefault(int(s), []).append(op)
    advance()


def _ev_done(ev, n):
    return n == 0 or n in _ran.get(ev, ())


def _blocked():
    out = []
    for k, q in _queue.items():
        if q:
            op = q[0]
            what = (f"event {op[1]:#x} record {op[2]}" if op[0] == "wev" else f"word {op[1]:#x} >= {op[2]} "
                    f"(now {_word(op[1])})")
            out.append(f"stream {k:#x} waits for {what}, {len(q) - 1} ops behind")
    return out


def _block_until(cond, what):
    import sys
    import time
    deadline = time.monotonic() + HANG_S
    pause = 1e-5
    while True:
        with _xlock:
            advance(1.0)
            if cond():
                return True
        if time.monotonic() > deadline:
            frames = sys._current_frames()
            stacks = "".join(f"--- thread {t.name}\n" + "".join(traceback.format_stack(frames[t.ident], limit=8))
                             for t in threading.enumerate() if t.ident in frames)
            with _xlock:
                blocked = "; ".join(_blocked())
            msg = f"HANG: {what} never completes; " + blocked + "\n" + stacks
            hangs.append(msg)
            errors.append(msg)
            return False
        time.sleep(pause)
        pause = min(pause * 2, 2e-3)


def x_record(ev, s):
    r = ev_record(ev, s)
    if not capturing[0]:
        with _xlock:
            ev = int(ev)
            n = _rec_n[ev] = _rec_n.get(ev, 0) + 1
        _push(s, ("rec", ev, n))
    return r


def x_wait_event(s, ev, flags):
    r = ev_wait(s, ev, flags)
    if not capturing[0]:
        with _xlock:
            n = _rec_n.get(int(ev), 0)
        if n:
            _push(s, ("wev", int(ev), n))
    return r


def x_wait_value(s, addr, value, flags):
    if not capturing[0]:
        _push(s, ("wval", int(addr), int(value)))
    return (OK,)


def x_query(ev):
    ev_i = int(ev)
    advance()
    with _xlock:
        ok = _ev_done(ev_i, _rec_n.get(ev_i, 0))
    if not ok:
        return (NOT_READY,)
    merge(host_done, events.get(ev_i, {}))
    return (OK,)


def x_sync(ev):
    ev_i = int(ev)
    with _xlock:
        n = _rec_n.get(ev_i, 0)
    if not _block_until(lambda: _ev_done(ev_i, n), f"cuEventSynchronize(event {ev_i:#x} record {n})"):
        return (_TIMEOUT,)
    return ev_sync(ev)


def x_stream_sync(s):
    k = int(s)
    if not _block_until(lambda: not _queue.get(k), f"cuStreamSynchronize({k:#x})"):
        return (_TIMEOUT,)
    return stream_sync(s)


def x_ctx_sync():
    if not _block_until(lambda: not any(_queue.values()), "cuCtxSynchronize"):
        return (_TIMEOUT,)
    return ctx_sync()


FAKES.update({
    "cuMemAllocFromPoolAsync": cu_alloc, "cuMemFreeAsync": cu_free, "cuEventRecord": ev_record,
    "cuStreamWaitEvent": ev_wait, "cuEventQuery": ev_query, "cuEventSynchronize": ev_sync,
    "cuStreamSynchronize": stream_sync, "cuCtxSynchronize": ctx_sync, "cuStreamBeginCapture": begin_capture,
    "cuStreamEndCapture": end_capture, "cuGraphLaunch": graph_launch, "cuMemcpyDtoDAsync": dtod,
    "cuMemcpyDtoH": dtoh,
})


# Loading a module synchronises the context: the driver waits for every stream while holding a lock
# that a synchronous copy to the host (a CPU lane's ``cuMemcpyDtoH``) also takes. What the H200 showed
# on 2026-12-04: the main thread in cuModuleLoadData, a CPU lane in cuMemcpyDtoH, a stream parked on
# that CPU lane's word (``backends/cuda/hostsync.py``).
_driver_lock = threading.RLock()


def x_module_load(image):
    with _driver_lock:
        if not _block_until(lambda: not any(_queue.values()), "cuModuleLoadData (synchronises the context)"):
            return (_TIMEOUT, None)
        return _module_load(image)


def x_dtoh(dst, src, n):
    with _driver_lock:
        return dtoh(dst, src, n)


_module_load = FAKES["cuModuleLoadData"]


def install(execute_streams: bool = False, devices: int | None = None):
    """``execute_streams``: model the device's progress too (blocking waits block; hangs are reported).
    ``devices``: GPUs the fake driver reports (``fake_cuda.install``; more than one checks contexts)."""
    if execute_streams:
        FAKES.update({"cuEventRecord": x_record, "cuStreamWaitEvent": x_wait_event, "cuStreamWaitValue64": x_wait_value,
                      "cuEventQuery": x_query, "cuEventSynchronize": x_sync, "cuStreamSynchronize": x_stream_sync,
                      "cuCtxSynchronize": x_ctx_sync, "cuModuleLoadData": x_module_load, "cuMemcpyDtoH": x_dtoh})
    # Accesses are recorded where Command.run runs a command; the lanes' C enqueue (cenqueue.c) runs the
    # kernel without it, so every command takes the Python enqueue here (test_fake_gpu_host_path compares
    # the two paths). Read when the CUDA backend is made, after this.
    os.environ["LANEFLOW_CENQUEUE"] = "0"
    fake_cuda.install(devices=devices)
    from laneflow.runtime import lane as L
    from laneflow.backends.cuda.cudagraph import executor as G
    from laneflow.backends.cuda.lanes import CudaLane
    from laneflow.backends.cuda.memory import DeviceArray

    orig_run = L.Command.run

    def run(self, lane):
        if not isinstance(lane, CudaLane):  # a CPU lane's worker thread: its host accesses carry the command
            _cpu.cmd = (lane.name, self.seq)
            try:
                return orig_run(self, lane)
            finally:
                _cpu.cmd = None
        if not capturing[0]:
            if self.op in ("compiled graph", "compiled output move"):
                special[0] += 1
                try:
                    return orig_run(self, lane)
                finally:
                    special[0] -= 1
            op = new_op(lane.stream, self.op)
            for b in self.reads:
                if isinstance(b.data, DeviceArray):
                    access(op, b.data.ptr, b.nbytes, "r", f"cmd read {self.op}")
            for b in self.writes:
                if isinstance(b.data, DeviceArray):
                    access(op, b.data.ptr, b.nbytes, "w", f"cmd write {self.op}")
        return orig_run(self, lane)

    L.Command.run = run

    orig_data, orig_slot, orig_cap = G.GraphPlan._data, G.GraphPlan._slot_view, G.GraphPlan._capture

    def _data(self, kind, v, o):
        r = orig_data(self, kind, v, o)
        if _cap_list[0] is not None:
            _cap_list[0].append((r.ptr, r.nbytes, "r"))
        return r

    def _slot_view(self, slot, o):
        r = orig_slot(self, slot, o)
        if _cap_list[0] is not None:
            _cap_list[0].append((r.ptr, r.nbytes, "w"))
        return r

    def _capture(self, o):
        _cap_list[0] = []
        try:
            orig_cap(self, o)
            exec_acc[int(o.exec)] = _cap_list[0]
        finally:
            _cap_list[0] = None

    G.GraphPlan._data, G.GraphPlan._slot_view, G.GraphPlan._capture = _data, _slot_view, _capture

    # a library call (cuBLASLt, cuBLAS, cuSOLVER) writes the workspace it is given, on the lane's stream
    from laneflow.runtime import handle_pool as hp

    orig_use = hp.HandlePool.use

    def use(self, lane, need=0):
        e = orig_use(self, lane, need)
        ws = e.current[1]
        if ws is not None and isinstance(lane, CudaLane) and not capturing[0]:
            op = new_op(lane.stream, f"{self.library.name} call")
            access(op, ws[0], ws[1], "w", f"{self.library.name} workspace")
        return e

    hp.HandlePool.use = use

    # a GPU stream waiting for a CPU lane (a word of pinned memory, cuStreamWaitValue64, or a host
    # wait where stream memory operations are missing): later work on the stream follows that
    # lane's commands up to the point
    from laneflow.backends.cuda import hostsync as HS

    orig_gpu_wait = HS.HostSignals.gpu_wait

    def gpu_wait(self, stream, point):
        if not capturing[0]:
            k, x = st(stream)
            key = "cpu:" + point.lane.name
            if x[1].get(key, 0) < point.seq:
                x[1][key] = point.seq
        return orig_gpu_wait(self, stream, point)

    HS.HostSignals.gpu_wait = gpu_wait

    # the host learning that a CPU lane passed a point (a wait on its fence, or reading its value):
    # what the host does next follows that lane's commands up to there
    from laneflow.backends.cpu.lanes import ThreadLane
    from laneflow.runtime.fence import ThreadFence

    names: dict = {}
    orig_init = ThreadLane.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        names[id(self.fence)] = "cpu:" + self.name

    def learned(fence, v):
        key = names.get(id(fence))
        if key is not None and host_done.get(key, 0) < v:
            host_done[key] = v

    value_prop = ThreadFence.value

    def value(self):
        v = value_prop.fget(self)
        learned(self, v)
        return v

    orig_wait = ThreadFence.wait

    def wait(self, v, timeout=None):
        ok = orig_wait(self, v, timeout)
        if ok:
            learned(self, v)
        return ok

    ThreadLane.__init__ = init
    ThreadFence.value = property(value)
    ThreadFence.wait = wait


def finish(label="race check"):
    import gc
    gc.collect()
    if errors:
        seen = set()
        for e in errors:
            head = e.split("\n")[0]
            key = head.split(" at ")[0][:60] + head[-40:]
            if key in seen:
                continue
            seen.add(key)
            print("ERROR", e)
        print(f"{label}: {len(errors)} errors")
    else:
        print(f"{label}: clean")


def live_sizes():
    import collections
    return collections.Counter(a["size"] for a in allocs.values() if a["freed"] is None)
