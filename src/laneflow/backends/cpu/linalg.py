"""CPU linear algebra through numpy.linalg; failures become :class:`lf.LinAlgError` naming the op.

svd and eigh refuse inputs with inf or NaN before LAPACK sees them: OpenBLAS's SVD of
``diag([inf, 1, 1])`` never returns (it loops while holding the GIL, freezing the interpreter), and an
iterative eigensolver has nothing finite to converge to. The check is one ``isfinite`` pass inside the
command; the other routines take non-finite inputs as numpy does (NaN results, or numpy's error).
"""

from __future__ import annotations

import numpy as np

from ...errors import FINITE_ONLY, LinAlgError, non_finite_input


#: One matrix through the routine that can fail (solve fails where inv does: a singular matrix).
_ONE = {"cholesky": np.linalg.cholesky, "inv": np.linalg.inv, "solve": np.linalg.inv, "eigh": np.linalg.eigh,
        "svd": lambda m: np.linalg.svd(m, compute_uv=False)}


def _which_matrix(name: str, a: np.ndarray, params: dict) -> str:
    """`` (matrix i of the batch)`` for the first failing matrix of a batch, as the GPU names it (its
    index in the whole batch when ``ops/linalg.py`` split it over lanes); '' for one matrix. Only on
    the error path, so the loop costs nothing when all is well."""
    mats = a.reshape((-1,) + a.shape[-2:])
    total = params.get("total", len(mats))
    one = _ONE.get(name)
    if total < 2 or one is None:
        return ""
    for i, m in enumerate(mats):
        try:
            one(m)
        except np.linalg.LinAlgError:
            return f" (matrix {params.get('first', 0) + i} of the batch)"
    return ""


def linalg(lane, prim, ins, outs):
    name, p = prim.name, prim.params
    if name in FINITE_ONLY and not np.isfinite(ins[0]).all():
        raise non_finite_input(name, ins[0].shape, ins[0].dtype)
    try:
        if name == "cholesky":
            res = (np.linalg.cholesky(ins[0], upper=p["upper"]),)
        elif name == "inv":
            res = (np.linalg.inv(ins[0]),)
        elif name == "solve":
            a, b = ins
            if b.ndim > 1:
                batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                a = np.broadcast_to(a, batch + a.shape[-2:])
                b = np.broadcast_to(b, batch + b.shape[-2:])
            res = (np.linalg.solve(a, b),)
        elif name == "qr":
            res = tuple(np.linalg.qr(ins[0], mode=p.get("mode", "reduced")))
        elif name == "eigh":
            res = tuple(np.linalg.eigh(ins[0], UPLO=p["UPLO"]))
        elif name == "svd":
            r = np.linalg.svd(ins[0], full_matrices=p["full_matrices"], compute_uv=p["compute_uv"])
            res = tuple(r) if p["compute_uv"] else (r,)
        else:
            raise NotImplementedError(name)
    except np.linalg.LinAlgError as e:
        raise LinAlgError(f"{name}: {e}{_which_matrix(name, ins[0], p)}") from e
    for out, r in zip(outs, res):
        np.copyto(out, r, casting="unsafe")
