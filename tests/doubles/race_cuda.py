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
    for k, v in b.items():
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


FAKES.update({
    "cuMemAllocFromPoolAsync": cu_alloc, "cuMemFreeAsync": cu_free, "cuEventRecord": ev_record,
    "cuStreamWaitEvent": ev_wait, "cuEventQuery": ev_query, "cuEventSynchronize": ev_sync,
    "cuStreamSynchronize": stream_sync, "cuCtxSynchronize": ctx_sync, "cuStreamBeginCapture": begin_capture,
    "cuStreamEndCapture": end_capture, "cuGraphLaunch": graph_launch, "cuMemcpyDtoDAsync": dtod,
    "cuMemcpyDtoH": dtoh,
})


def install():
    fake_cuda.install()
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
