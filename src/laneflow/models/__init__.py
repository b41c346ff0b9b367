"""Models written with laneflow's ops: the workloads the benchmarks and the issues measure."""

from . import gpt2  # noqa: F401

__all__ = ["gpt2"]
