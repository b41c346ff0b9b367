"""``lf.linalg``: matrix factorizations and solves (numpy's names and semantics)."""

from .ops.matmul import matmul  # noqa: F401
from .ops.linalg import cholesky, eigh, inv, qr, solve, svd  # noqa: F401

__all__ = ["matmul", "cholesky", "solve", "inv", "qr", "eigh", "svd"]
