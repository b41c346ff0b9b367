"""CUDA kernels by primitive kind: ``KERNELS[kind](lane, prim, inputs, outputs)``.

Inputs and outputs are :class:`~laneflow.backends.cuda.memory.DeviceArray` handles (the copy
kernel also takes a numpy array: a host-to-device copy). Each kernel enqueues its work on
``lane.stream`` and returns at once.
"""

from __future__ import annotations

from .. import matmul as _matmul
from .. import solver as _linalg
from . import copy as _copy
from . import elementwise as _ew
from . import fused as _fused
from . import index as _index
from . import random as _random
from . import reduce as _reduce

KERNELS = {
    "elementwise": _ew.elementwise,
    "astype": _ew.astype,
    "fused": _fused.fused,
    "reduce": _reduce.reduce,
    "argreduce": _reduce.argreduce,
    "softmax": _reduce.softmax,
    "logsumexp": _reduce.logsumexp,
    "matmul": _matmul.matmul,
    "matmul_group": _matmul.matmul_group,
    "reshape": _copy.reshape,
    "transpose": _copy.transpose,
    "broadcast_to": _copy.broadcast_to,
    "concatenate": _copy.concatenate,
    "getitem": _index.getitem,
    "setitem": _index.setitem,
    "take": _index.take,
    "full": _copy.full,
    "arange": _copy.arange,
    "linspace": _copy.linspace,
    "eye": _copy.eye,
    "random": _random.random,
    "random_split": _random.random_split,
    "copy": _copy.copy,
    "linalg": _linalg.linalg,
}
