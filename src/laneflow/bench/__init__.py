"""Benchmarks: ``python -m laneflow bench <suite>`` (see :mod:`laneflow.bench.cli`).

laneflow and every importable peer (PyTorch, JAX, CuPy, MLX; numpy on the CPU) run the same
workloads in one process; results are checked against numpy and reported next to the workload's
byte and FLOP floor measured on the same device.
"""

from .harness import SUITES, Case, Impl, Result, Spread, measure, run_impl, suite  # noqa: F401
