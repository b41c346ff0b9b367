"""What a rank says about a collective before it runs it, so ranks that disagree fail with a message
instead of exchanging garbage or hanging: a row of int64s per rank (call number, op, reduction, root,
dtype, shape), gathered and compared."""

from __future__ import annotations

import numpy as np

from .. import dtypes as dt
from .group import DistributedError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
REDUCTIONS = (None, "sum", "prod", "max", "min", "avg")
_DTYPES = tuple(dt.DTYPES)
MAX_DIMS = 8
WIDTH = 6 + MAX_DIMS


def row(seq: int, op: str, reduction: str | None, root: int | None, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """This rank's row for the ``seq``-th collective of its group."""
    r = np.zeros(WIDTH, np.int64)
    dims = list(shape[:MAX_DIMS - 1]) + ([int(np.prod(shape[MAX_DIMS - 1:], dtype=np.int64))]
                                          if len(shape) >= MAX_DIMS else [])
    r[:6] = (seq, OPS.index(op), REDUCTIONS.index(reduction), -1 if root is None else root,
             _DTYPES.index(np.dtype(dtype)) if np.dtype(dtype) in _DTYPES else -1, len(shape))
    r[6:6 + len(dims)] = dims
    return r


def array_of(r: np.ndarray) -> str:
    """The array a row describes: '(4, 3) float32'."""
    dtc, ndim = int(r[4]), int(r[5])
    shape = tuple(int(v) for v in r[6:6 + min(ndim, MAX_DIMS)])
    return f"{shape} {_DTYPES[dtc] if 0 <= dtc < len(_DTYPES) else '?'}"


def describe(r: np.ndarray) -> str:
    """A row in words: 'all_reduce(sum) of (4, 3) float32' (call number and root included)."""
    seq, op, red, root = (int(v) for v in r[:4])
    name = OPS[op] if 0 <= op < len(OPS) else f"op #{op}"
    if REDUCTIONS[red] if 0 <= red < len(REDUCTIONS) else None:
        name += f"({REDUCTIONS[red]})"
    if root >= 0:
        name += f" from root {root}"
    return f"{name} of {array_of(r)} (collective #{seq} of its group)"


def disagreement(rows: np.ndarray, rank: int) -> str | None:
    """None when every rank's row equals this rank's; else a sentence naming the first that differs."""
    mine = rows[rank]
    for r, other in enumerate(rows):
        if r != rank and not np.array_equal(other, mine):
            return (f"rank {r} called {describe(other)} where rank {rank} called {describe(mine)}; every rank "
                    "must call the same collectives, with the same shapes and dtypes, in the same order")
    return None


def agree(rows: np.ndarray, rank: int, op: str) -> None:
    """Raise :class:`DistributedError` naming both calls when another rank's row differs from this one's."""
    msg = disagreement(rows, rank)
    if msg is not None:
        raise DistributedError(f"{op}: {msg}")
