"""``lf.linalg``: the array API's linalg extension (numpy's names and semantics where they agree).

Factorizations (cholesky, solve, inv, qr, eigh, svd) are ``ops/linalg.py``; determinants, norms and
the products and helpers are ``ops/linalg_api.py``. ``qr``, ``eigh``, ``svd`` and ``slogdet`` return
named tuples (``QRResult``...), which unpack as the plain tuples they were.
"""

from .ops.linalg import inv, solve  # noqa: F401
from .ops.linalg_api import (  # noqa: F401
    EighResult, QRResult, SlogdetResult, SVDResult, cholesky, cross, det, diagonal, eigh, eigvalsh, matrix_norm,
    matrix_power, matrix_rank, outer, pinv, qr, slogdet, svd, svdvals, tensordot, trace, vecdot, vector_norm,
)
from .ops.manipulation import matrix_transpose  # noqa: F401
from .ops.matmul import matmul  # noqa: F401

__all__ = ["matmul", "cholesky", "solve", "inv", "qr", "eigh", "svd", "cross", "det", "diagonal", "eigvalsh",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv", "slogdet", "svdvals",
           "tensordot", "trace", "vecdot", "vector_norm", "EighResult", "QRResult", "SlogdetResult", "SVDResult"]
