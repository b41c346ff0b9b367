"""Reading and writing safetensors files as numpy arrays, bfloat16 included.

numpy has no bfloat16; laneflow's is ``ml_dtypes.bfloat16``. ``safetensors.numpy.load`` (from bytes)
fails on a BF16 tensor (``KeyError: 'BF16'``), and ``safe_open(framework="np")`` returns one only
because it asks numpy for the dtype named ``"bfloat16"``, which exists once ml_dtypes is imported
(laneflow imports it). This module checks every tensor's dtype against the file's header, so a
bfloat16 tensor is never read as something else.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import ml_dtypes
import numpy as np

#: safetensors dtype codes laneflow reads -> numpy dtypes
DTYPES = {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
          "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
          "U32": np.dtype(np.uint32), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_)}


def _safetensors() -> Any:
    try:
        import safetensors
    except ImportError:
        raise ImportError("reading and writing checkpoints needs the safetensors package: "
                          "pip install 'laneflow[models]' (or pip install safetensors)") from None
    return safetensors


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file, by name, as numpy arrays of the header's dtype.

    Raises FileNotFoundError for a missing file and ValueError naming the file for one that is not a
    safetensors file or holds a dtype laneflow has no numpy type for.
    """
    st = _safetensors()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no safetensors file at {path}")
    out: dict[str, np.ndarray] = {}
    try:
        f = st.safe_open(path, framework="np")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for a bad header
        raise ValueError(f"{path} is not a safetensors file ({type(e).__name__}: {e})") from None
    with f:
        for name in f.keys():
            code = f.get_slice(name).get_dtype()
            want = DTYPES.get(code)
            if want is None:
                raise ValueError(f"{path}: tensor {name} has dtype {code}, which laneflow cannot read")
            try:
                a = f.get_tensor(name)
            except (TypeError, KeyError):  # a safetensors build that cannot make this numpy dtype
                a = _raw(st, path)[name]
            if a.dtype != want:
                if a.dtype.itemsize != want.itemsize:
                    raise ValueError(f"{path}: tensor {name} is {code} in the header but read as {a.dtype}")
                a = a.view(want)  # the bytes are right, the label is not (a BF16 tensor as uint16)
            out[name] = a
    return out


def _raw(st: Any, path: str) -> dict[str, np.ndarray]:
    """The file's tensors from their raw bytes (reads the whole file; a fallback only)."""
    with open(path, "rb") as fh:
        items = st.deserialize(fh.read())
    return {k: np.frombuffer(v["data"], DTYPES[v["dtype"]]).reshape(v["shape"]) for k, v in items}


def write(arrays: Mapping[str, Any], path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``arrays`` (numpy, laneflow or anything ``np.asarray`` takes) to a safetensors file."""
    st = _safetensors()
    import safetensors.numpy  # noqa: F401 - the writer for numpy arrays

    host = {}
    for name, a in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"safetensors names must be strings, got {name!r}")
        h = np.ascontiguousarray(np.asarray(a))
        if h.dtype.name not in {d.name for d in DTYPES.values()}:
            raise ValueError(f"cannot write tensor {name} of dtype {h.dtype} to {os.fspath(path)}")
        host[name] = h
    st.numpy.save_file(host, os.fspath(path), metadata=dict(metadata or {}))
