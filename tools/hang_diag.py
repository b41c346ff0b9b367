"""A pytest plugin for diagnosing GPU hangs: when one test has run longer than HANG_DIAG_S seconds
(default 45), print what every CUDA stream laneflow holds is doing, then let the test go on (pytest-timeout
still ends it). Load it with ``PYTHONPATH=tools pytest -p hang_diag ...``.

What it prints, found through the garbage collector (nothing in laneflow registers for it):
- each CUDA lane (user lanes and compiled graphs' capture lanes): ``cuStreamQuery`` of its stream (busy or
  idle), its fence (commands enqueued, known done, marks outstanding and which of their events are done);
- each device memory manager's free stream;
- each pinned host word a GPU stream may wait on (``hostsync``) next to its CPU lane's fence;
- every thread's stack.
A stream that stays busy while nothing it waits on is busy points at a kernel that does not end; a busy
free stream or a host word behind its CPU lane's fence points at a wait that is never satisfied.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import traceback

_state = {"test": None, "since": 0.0, "dumped": None}


def _query(fn, handle) -> str:
    try:
        err, = fn(handle)
        return "idle/done" if int(err) == 0 else ("BUSY" if int(err) == 600 else f"error {int(err)}")
    except Exception as e:  # noqa: BLE001 - a diagnostic: report and go on
        return f"query failed: {e!r}"


def dump(out=sys.stderr) -> None:
    from laneflow.backends.cuda import hostsync, lanes, memory

    cu = lanes.cu  # (the driver laneflow calls: the tests' fake driver where it is installed)

    p = lambda *a: print(*a, file=out, flush=True)  # noqa: E731
    p(f"===== hang_diag: {_state['test']} running for {time.monotonic() - _state['since']:.0f} s =====")
    objs = gc.get_objects()
    for o in objs:
        try:
            if isinstance(o, lanes.CudaLane):
                if o.closed or o.closing:  # its stream is (or is about to be) destroyed: a query would crash
                    p(f"lane stream_id={o.stream_id} index={o.index} closed")
                    continue
                f = o.fence
                marks = list(getattr(f, "_marks", ()))
                mstate = [(s, _query(cu.cuEventQuery, ev)) for s, ev in marks[:8]]
                p(f"lane stream_id={o.stream_id} index={o.index} closed={o.closed} stream={int(o.stream) if o.stream else 0:#x}"
                  f" query={_query(cu.cuStreamQuery, o.stream) if o.stream else '-'} last={getattr(f, '_last', '?')}"
                  f" done={getattr(f, '_done', '?')} marked={getattr(f, '_marked', '?')} syncing={getattr(f, '_syncing', '?')}"
                  f" marks={len(marks)} first={mstate}")
            elif isinstance(o, memory.Memory):
                p(f"memory free_stream={int(o.free_stream):#x} query={_query(cu.cuStreamQuery, o.free_stream)}"
                  f" pending={len(getattr(o, 'pending', ()) or ())} waiting={len(getattr(o, 'waiting', ()) or ())}")
            elif isinstance(o, hostsync.HostSignals):
                for lane, (view, i, _addr) in list(o._slots.items()):
                    p(f"host word of cpu lane {getattr(lane, 'name', lane)}: word={int(view[i])}"
                      f" fence={lane.fence.value} idle helpers={len(o._idle)}")
        except Exception as e:  # noqa: BLE001
            p(f"({type(o).__name__}: {e!r})")
    p("----- threads -----")
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        p(f"thread {names.get(ident, ident)}:")
        p("".join(traceback.format_stack(frame)).rstrip())
    p("===== hang_diag end =====")


def _watch() -> None:
    limit = float(os.environ.get("HANG_DIAG_S", "45"))
    while True:
        time.sleep(1.0)
        t = _state["test"]
        if t is not None and _state["dumped"] != t and time.monotonic() - _state["since"] > limit:
            _state["dumped"] = t
            try:
                dump()
            except Exception as e:  # noqa: BLE001
                print(f"hang_diag failed: {e!r}", file=sys.stderr, flush=True)


def pytest_configure(config) -> None:
    threading.Thread(target=_watch, name="hang-diag", daemon=True).start()


def pytest_runtest_protocol(item, nextitem):
    _state["test"], _state["since"] = item.nodeid, time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    _state["test"] = None
