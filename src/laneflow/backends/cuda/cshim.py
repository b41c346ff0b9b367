"""The per-command driver calls from C: ``cshim.c``, built with the system C compiler on first use and
kept in the signed disk cache (``native.py``, ``disk_cache.py``), so later processes only load it.

Why: each command calls the driver a few times (a launch, an allocation, an event record), and through
cuda-bindings a launch alone costs about 6 us of host time on the H200's host, ctypes more
(``fastcall.py``). From C, with the parameter block already packed (``kernels/launch.py``), a call is
the driver's own cost plus one function call.

It is optional: without a C compiler or Python's headers (``python3-dev``), or with
``LANEFLOW_CSHIM=0``, the calls go through cuda-bindings as before, and :func:`why_not` says why.
``laneflow info`` shows which path a process uses.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from ... import disk_cache, native

NAME = "_laneflow_cshim"  # (the module name cshim.c's init function is made for)
SOURCE = Path(__file__).with_name("cshim.c")
DRIVER = "libcuda.so.1"


def load(library: str = DRIVER) -> ModuleType | None:
    """The shim, opened on ``library`` (the driver; a test's stand-in), or None when it cannot be
    used (:func:`why_not` says why). Built or loaded once per process and library."""
    return _once.get(library)


def why_not(library: str = DRIVER) -> str | None:
    """Why the shim is not used for ``library`` (None: it is, or it was not asked for yet)."""
    return _once.why_not(library)


_NotBuilt = native.NotBuilt


def _open(library: str) -> ModuleType:
    """The shim from the disk cache, else built (and cached once it has loaded: a build that does not
    load is never kept), opened on ``library``."""
    if os.environ.get("LANEFLOW_CSHIM", "1") == "0":
        raise _NotBuilt("LANEFLOW_CSHIM=0")
    # (an entry this Python cannot load is built again, and replaced)
    mod = disk_cache.cached(_key(SOURCE.read_bytes()), _compile, _load, unusable=(ImportError,))
    try:
        mod.init(library)
    except OSError as e:
        raise _NotBuilt(f"the driver's entry points were not found ({e})") from None
    return mod


def _load(image: bytes) -> ModuleType:
    return native.load(NAME, image, "init")


_once = native.Once("the driver shim", _open)


def _key(source: bytes) -> str:
    return native.key("cshim", source)


def _compile() -> bytes:
    return native.compile(NAME, SOURCE, "the driver shim", ["-ldl"])
