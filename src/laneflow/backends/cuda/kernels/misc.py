"""Small utility kernels: a GPU-side sleep (for the delay-injection test hook) and a clock spin
(for concurrency checks). Both run one thread; neither is used on a normal path.
"""

from __future__ import annotations

_SLEEP = r"""
extern "C" __global__ void lf_sleep(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  t = t0;
  while (t - t0 < ns) { __nanosleep(1000); asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }
}
"""

_SPIN = r"""
extern "C" __global__ void lf_spin(long long cycles, long long* out) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
  if (out) out[0] = clock64() - t0;
}
"""


def gpu_sleep(lane, seconds: float) -> None:
    """Delay the lane's stream by ``seconds`` (injected test delays; never on a normal path)."""
    k = lane.ctx.modules.get(("sleep",), lambda: (_SLEEP, "lf_sleep", "Q"))
    k.launch(lane.handle, (1, 1, 1), (1, 1, 1), (int(seconds * 1e9),))


def gpu_spin(lane, cycles: int, out_ptr: int = 0) -> None:
    """Busy-wait one thread for ``cycles`` SM clocks (a test workload for lane concurrency)."""
    k = lane.ctx.modules.get(("spin",), lambda: (_SPIN, "lf_spin", "qp"))
    k.launch(lane.handle, (1, 1, 1), (1, 1, 1), (int(cycles), out_ptr))
