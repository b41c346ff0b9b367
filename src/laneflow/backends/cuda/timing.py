"""Device-event timing of a stream's work, for benchmarks (``CUDABackend.event_timer``).

``start()`` waits until the stream is idle and records a timing event on its first lane, which then
completes at once; ``stop()`` records an event on every lane and returns the time from the start
event to the last lane's end, so work spread over lanes is timed end to end on the GPU's clock.

``stop()`` first hands the device's deferred frees to the driver (``Memory.collect``, which the next
command would do): the values a timed run let go are freed within its own time. Without it the next
command on the device paid for them, i.e. the next bench row: after ``bench gpt2``'s uncached row,
whose forward drops hundreds of buffers, the following row was about 0.2 ms slower on the H200 than
the same row placed elsewhere (``tools/probe_speculate.py --alternate --rows ...``, 2026-12-04).
"""

from __future__ import annotations

from cuda.bindings import driver as cu

from .driver import check

_elapsed_ms = getattr(cu, "cuEventElapsedTime", None) or getattr(cu, "cuEventElapsedTime_v2")


class StreamEventTimer:
    def __init__(self, stream) -> None:
        self.stream = stream
        ctx = stream.lanes[0].ctx
        ctx.ensure_current()
        self.ctx = ctx
        self.begin = check(cu.cuEventCreate(0), "cuEventCreate")
        self.ends = [check(cu.cuEventCreate(0), "cuEventCreate") for _ in stream.lanes]

    def start(self) -> None:
        self.stream.synchronize()
        self.ctx.ensure_current()
        check(cu.cuEventRecord(self.begin, self.stream.lanes[0].stream), "cuEventRecord")

    def stop(self) -> float:
        self.ctx.ensure_current()
        mem = self.ctx.memory
        if mem.pending or mem.waiting:
            mem.collect(retire=False)
        for ev, lane in zip(self.ends, self.stream.lanes):
            check(cu.cuEventRecord(ev, lane.stream), "cuEventRecord")
        longest = 0.0
        for ev in self.ends:
            check(cu.cuEventSynchronize(ev), "cuEventSynchronize")
            longest = max(longest, check(_elapsed_ms(self.begin, ev), "cuEventElapsedTime"))
        return longest / 1e3

    def __del__(self) -> None:
        # Maybe inside GC, while another library captures a CUDA graph: no driver call here; the
        # events are destroyed at laneflow's next safe point (Memory.collect).
        try:
            self.ctx.memory.retired.append(_Events([self.begin, *self.ends]))
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _Events:
    """Timing events to destroy at the next safe point (``Memory.retired``)."""

    def __init__(self, events: list) -> None:
        self.events = events

    def destroy(self) -> None:
        for ev in self.events:
            cu.cuEventDestroy(ev)
