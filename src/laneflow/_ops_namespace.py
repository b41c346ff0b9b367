"""Every op in one namespace (what ``Array`` methods and ``laneflow/__init__`` draw on)."""

from .ops.creation import arange, array, asarray, eye, full, full_like, linspace, ones, ones_like, zeros, zeros_like  # noqa: F401
from .ops.elementwise import *  # noqa: F401,F403 - every op of the op table (ops/table.py), power, where, clip
from .ops.elementwise import GENERATED as _GENERATED
from .ops.dynamic import dynamic_slice, dynamic_update_slice  # noqa: F401
from .ops.index import getitem, setitem, take  # noqa: F401
from .ops.matmul import matmul  # noqa: F401
from .ops.reduce import all, any, argmax, argmin, logsumexp, max, mean, min, prod, softmax, std, sum, var  # noqa: F401
from .ops.shape import (  # noqa: F401
    astype, broadcast_to, concatenate, expand_dims, flatten, reshape, split, squeeze, stack, swapaxes, transpose,
)

from .ops.elementwise import bool_only as _bool_only  # noqa: E402


def and_(a, b):
    """``a & b`` on bool arrays."""
    return _bool_only("&", _GENERATED["logical_and"], a, b)


def or_(a, b):
    """``a | b`` on bool arrays."""
    return _bool_only("|", _GENERATED["logical_or"], a, b)


def invert(a):
    """``~a`` on bool arrays."""
    return _bool_only("~", _GENERATED["logical_not"], a)
