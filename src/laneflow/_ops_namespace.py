"""Every op in one namespace (what ``Array`` methods and ``laneflow/__init__`` draw on)."""

from .ops.creation import arange, array, asarray, empty, empty_like, eye, from_dlpack, full, full_like, linspace, ones, ones_like, zeros, zeros_like  # noqa: F401
from .ops.elementwise import *  # noqa: F401,F403 - every op of the op table (ops/table.py), power, where, clip
from .ops.elementwise import GENERATED as _GENERATED
from .ops.dynamic import dynamic_slice, dynamic_update_slice  # noqa: F401
from .ops.index import getitem, setitem, take  # noqa: F401
from .ops.matmul import matmul  # noqa: F401
from .ops.reduce import all, any, argmax, argmin, logsumexp, max, mean, min, prod, softmax, std, sum, var  # noqa: F401
from .ops.shape import (  # noqa: F401
    astype, broadcast_to, concatenate, expand_dims, flatten, reshape, split, squeeze, stack, swapaxes, transpose,
)
from .ops.manipulation import (  # noqa: F401
    broadcast_arrays, concat, flip, matrix_transpose, meshgrid, moveaxis, permute_dims, repeat, roll, tile, tril, triu,
    unstack,
)
from .ops.datadep import nonzero, unique_all, unique_counts, unique_inverse, unique_values  # noqa: F401
from .ops.along_axis import count_nonzero, diff, take_along_axis  # noqa: F401
from .ops.sorting import argsort, cumulative_prod, cumulative_sum, searchsorted, sort  # noqa: F401
from .ops.linalg_api import tensordot, vecdot  # noqa: F401

# Trace-guided replay (graph/tape.py, ops/tape.py): the pure ops are recorded and replayed at the
# public entry (lf.<op> and the Array methods, which call these). Not taped: creation from host data,
# random numbers, data-dependent shapes, and anything that evaluates.
from .ops.tape import taped as _taped  # noqa: E402

_TAPED = (*_GENERATED, "power", "where", "clip", "round", "real", "imag", "conj",
          "getitem", "setitem", "take", "matmul", "tensordot", "vecdot",
          "all", "any", "argmax", "argmin", "logsumexp", "max", "mean", "min", "prod", "softmax", "std", "sum", "var",
          "astype", "broadcast_to", "concatenate", "expand_dims", "flatten", "reshape", "split", "squeeze", "stack",
          "swapaxes", "transpose", "concat", "flip", "matrix_transpose", "moveaxis", "permute_dims", "repeat", "roll",
          "tile", "tril", "triu", "unstack", "take_along_axis", "diff", "cumulative_sum", "cumulative_prod",
          "broadcast_arrays", "meshgrid", "dynamic_slice", "dynamic_update_slice",
          "arange", "zeros", "ones", "full", "eye", "zeros_like", "ones_like", "full_like", "empty", "empty_like")
for _name in _TAPED:
    globals()[_name] = _taped(globals()[_name])
del _name
