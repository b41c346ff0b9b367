"""laneflow: write sequential array code; independent work runs at the same time on several lanes.

>>> import laneflow as lf
>>> x = lf.random.normal((256, 256), key=lf.random.key(0))
>>> a, b = lf.exp(x), x @ x          # independent: may run on two lanes at once
>>> lf.eval(a, b)
"""

from __future__ import annotations

from . import backends  # noqa: F401 - registers the cpu and gpu backends (runtime/backend.py)
from ._ops_namespace import *  # noqa: F401,F403
from ._ops_namespace import abs, all, any, max, min, sum  # noqa: F401,A004 - numpy's names
from . import cuda, distributed, linalg, nn, random, testing  # noqa: F401,E402 - after the ops they use
from . import _array_methods  # noqa: F401 - attaches the operators and methods to Array
from .array import Array
from .device import Device, cpu, gpu
from .dtypes import (  # noqa: F401
    bfloat16, bool_, complex64, complex128, dtype, float16, float32, float64, int8, int32, int64, result_type, uint8, uint32,
)
from .errors import CompileError, ExecutionError, LaneflowError, LinAlgError, OutOfMemoryError, PrecisionWarning
from .evaluation import (async_eval, eval, plan_cache_info, reset_stats, set_early_launch, set_plan_cache,  # noqa: A004
                         stats)
from .jit import compile  # noqa: A004 - MLX's name
from .runtime.stream import Stream
from .runtime.backend import DeviceUnavailableError
from .defaults import (
    default_device, default_stream, gpu_available, new_stream, set_default_device, stream, synchronize,
)
from .trace import trace
from ._array_api import (  # noqa: F401
    __array_api_version__, __array_namespace_info__, can_cast, finfo, iinfo, isdtype,
)
from ._ops_namespace import round  # noqa: F401,A004 - the array API's name

# The array API standard's names for what laneflow (and numpy) call otherwise; numpy's names stay.
bool = bool_  # noqa: A001
pow = power  # noqa: A001
e, inf, nan, pi = 2.718281828459045, float("inf"), float("nan"), 3.141592653589793
newaxis = None

__version__ = "0.1.0"

__all__ = [
    "Array", "Device", "Stream", "cpu", "gpu", "default_device", "set_default_device", "new_stream",
    "default_stream", "stream", "synchronize", "gpu_available", "eval", "async_eval", "stats", "reset_stats",
    "set_plan_cache", "plan_cache_info", "set_early_launch",
    "compile", "CompileError", "from_dlpack", "LaneflowError", "DeviceUnavailableError", "ExecutionError", "OutOfMemoryError", "LinAlgError", "PrecisionWarning", "cuda", "distributed", "linalg", "nn", "random", "testing",
    "trace",
]
