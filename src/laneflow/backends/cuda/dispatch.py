"""Which CUDA kernel runs each primitive kind: ``KERNELS[kind](lane, prim, inputs, outputs)``.

Inputs and outputs are :class:`~laneflow.backends.cuda.memory.DeviceArray` handles (the copy
kernel also takes a numpy array: a host-to-device copy). Each kernel enqueues its work on
``lane.stream`` and returns at once. Every kind of the op table (``ops/table.py: KINDS``) is either
here or in :data:`UNSUPPORTED` (``tests/test_op_table.py`` checks).
"""

from __future__ import annotations

from . import attention_choice as _attention
from . import custom as _custom
from . import matmul as _matmul
from . import linalg_batched as _linalg
from .kernels import copy as _copy
from .kernels import dynamic as _dynamic
from .kernels import elementwise as _ew
from .kernels import fused as _fused
from .kernels import index as _index
from .kernels import norm as _norm
from .kernels import random as _random
from .kernels import reduce as _reduce
from .kernels import rowfused as _rowfused
from .kernels import lu as _lu
from .kernels import sort as _sort

#: The CUDA kernel of every primitive kind of the op table (``ops/table.py: KINDS``), registered here
#: and only here. ``constant`` needs none: ``Backend.upload`` copies host data.
KERNELS = {
    "elementwise": _ew.elementwise,
    "astype": _ew.astype,
    "fused": _fused.fused,
    "rowfused": _rowfused.rowfused,
    "reduce": _reduce.reduce,
    "argreduce": _reduce.argreduce,
    "sort": _sort.sort,
    "searchsorted": _sort.searchsorted,
    "scan": _sort.scan,
    "softmax": _reduce.softmax,
    "logsumexp": _reduce.logsumexp,
    "norm": _norm.norm,
    "attention": _attention.attention,
    "matmul": _matmul.matmul,
    "matmul_group": _matmul.matmul_group,
    "reshape": _copy.reshape,
    "transpose": _copy.transpose,
    "broadcast_to": _copy.broadcast_to,
    "strided": _copy.strided,
    "concatenate": _copy.concatenate,
    "getitem": _index.getitem,
    "setitem": _index.setitem,
    "take": _index.take,
    "dynamic_slice": _dynamic.dynamic_slice,
    "dynamic_update_slice": _dynamic.dynamic_update_slice,
    "full": _copy.full,
    "arange": _copy.arange,
    "linspace": _copy.linspace,
    "eye": _copy.eye,
    "random": _random.random,
    "random_split": _random.random_split,
    "copy": _copy.copy,
    "linalg": _linalg.linalg,
    "slogdet": _lu.slogdet,
    "custom": _custom.custom,
    "collective": _custom.custom,  # (lf.distributed: the primitive's transport runs it, as a user kernel's launcher)
}

#: Primitive kinds of the op table this backend does not run, with the reason (MLX's ``NO_GPU``).
UNSUPPORTED = {"constant": "no kernel: Backend.upload copies host data"}
