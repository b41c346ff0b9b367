"""laneflow's exception types.

Argument errors (bad shapes, dtypes, devices, streams) are the built-in ValueError/TypeError/IndexError
and are raised when an op is constructed. Errors that happen while work runs are raised at the eval (or
host read) that needs the failing result, as :class:`ExecutionError`, naming the op that failed.
"""

from __future__ import annotations


class LaneflowError(Exception):
    """Base class of laneflow's own errors."""


class ExecutionError(LaneflowError):
    """A command failed while it ran. ``op`` names the op; ``where`` its inputs, outputs and lane (as
    shapes and dtypes, when known); ``__cause__`` holds the original error."""

    def __init__(self, op: str, cause: BaseException, where: str = ""):
        self.op, self.where = op, where
        at = f" ({where})" if where else ""
        super().__init__(f"{op}: failed while running{at}: {type(cause).__name__}: {cause}")
        self.__cause__ = cause


class OutOfMemoryError(LaneflowError, MemoryError):
    """An allocation did not fit. Carries the requested and free bytes."""

    def __init__(self, op: str, requested: int, free: int | None, device: str = ""):
        self.op, self.requested, self.free = op, requested, free
        free_s = "unknown" if free is None else f"{free} bytes"
        super().__init__(
            f"{op}: out of memory on {device or 'device'}: requested {requested} bytes, free {free_s}; "
            "free arrays you no longer need (del, or lf.eval fewer outputs at once) and try again"
        )


class LinAlgError(LaneflowError, ValueError):
    """A linear-algebra op met a matrix it cannot handle (singular, not positive definite)."""


#: Linear-algebra routines that refuse inf or NaN on every backend: OpenBLAS's SVD of
#: ``diag([inf, 1, 1])`` never returns, and an iterative eigensolver has nothing finite to converge to.
FINITE_ONLY = frozenset(("svd", "eigh"))


def non_finite_input(op: str, shape: tuple, dtype) -> LinAlgError:
    """The error of a :data:`FINITE_ONLY` routine given inf or NaN (the same words on every backend)."""
    return LinAlgError(f"{op}: the input {tuple(shape)} {dtype} holds inf or NaN; {op} needs finite values "
                       "(check the values that produced it, e.g. with lf.isfinite)")


class CompileError(LaneflowError):
    """A function given to ``lf.compile`` does something a traced function cannot do; the message
    names the op and the fix."""


class PrecisionWarning(UserWarning):
    """A value made a computation wider than its arrays: a numpy float64 scalar turned a float16 or
    bfloat16 graph on the GPU into float64 (numpy 2's rule: numpy scalars are not weak). Shown once."""
