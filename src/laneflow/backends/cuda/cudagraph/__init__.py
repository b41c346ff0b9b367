"""The CUDA-graph back end of ``lf.compile``: a compiled plan as one multi-lane CUDA graph.

Split by concern: ``executor.py`` (the :class:`GraphPlan` a call launches), ``capture.py`` (stream
capture of the steps into branches), ``binding.py`` (arguments read in place or staged),
``outputs.py`` (output sets and the leases of a call's values) and ``checks.py`` (per-launch check
slots). The front end (tracing, the signature cache) is ``laneflow/jit.py``; the plan it records is
``graph/plan.py``.
"""

from .capture import MAX_BRANCHES, CaptureUnsupported
from .executor import GraphPlan
from .outputs import OUTPUT_SETS, allocate_region

__all__ = ["GraphPlan", "CaptureUnsupported", "allocate_region", "MAX_BRANCHES", "OUTPUT_SETS"]
