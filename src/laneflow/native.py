"""laneflow's small C extensions, built with the system C compiler on first use and kept in the signed
disk cache (``disk_cache.py``), so later processes only load them: the CUDA driver shim
(``backends/cuda/cshim.c``) and the tape's node maker (``ops/ctape.c``).

Each is optional: without a C compiler or Python's headers (``python3-dev``), the Python path runs,
and the caller says why (``python -m laneflow info``). A build is cached only once it has loaded, under
a key of its source, the Python it is built for and the compiler command (an entry this Python cannot
load is built again, and replaced).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence


#: The header the extensions share (``#include "../native.h"``): part of every cache key.
HEADER = Path(__file__).with_name("native.h")


class NotBuilt(Exception):
    """The extension cannot be built here (its message says why)."""


class Once:
    """An extension opened once per process and key (``open_(key)``: built or loaded, and set up), or the
    reason it is not used: a :class:`NotBuilt`'s message, or any other failure, named with ``what``."""

    def __init__(self, what: str, open_: Callable[[Any], ModuleType]):
        self.what, self.open = what, open_
        self.lock = threading.Lock()
        self.state: dict = {}  # key -> the module, or why it is not used (a str)

    def get(self, key: Any = None) -> ModuleType | None:
        got = self.state.get(key)
        if got is None:
            with self.lock:
                got = self.state.get(key)
                if got is None:
                    try:
                        got = self.open(key)
                    except NotBuilt as e:
                        got = str(e)
                    except Exception as e:  # noqa: BLE001 - any failure means the Python path, said why
                        got = f"{self.what} did not load ({type(e).__name__}: {str(e)[:200]})"
                    self.state[key] = got
        return None if got.__class__ is str else got

    def why_not(self, key: Any = None) -> str | None:
        """Why it is not used for ``key`` (None: it is, or it was not asked for yet)."""
        got = self.state.get(key)
        return got if got.__class__ is str else None


def suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def cc() -> str:
    return os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"


def key(prefix: str, source: bytes) -> str:
    """A cache entry's name: ``prefix``, then a hash of the source, the Python and the compiler command."""
    h = hashlib.sha256(source)
    h.update(HEADER.read_bytes())  # (the header the sources include: native.h)
    for part in (sys.version, suffix(), platform.machine(), cc()):
        h.update(b"\0" + part.encode())
    return f"{prefix}-{h.hexdigest()[:40]}"


def load(name: str, image: bytes, entry: str) -> ModuleType:
    """The extension module ``name`` in ``image`` (written to a private temporary directory, loaded,
    removed); ImportError when it is not one (no ``entry`` function: another source or compiler).

    ``LANEFLOW_NATIVE_KEEP=<directory>`` writes it there instead and leaves it, so that a native profiler
    (``py-spy record --native``, ``perf``) can read its symbols from the file: for profiling only."""
    keep = os.environ.get("LANEFLOW_NATIVE_KEEP")
    with tempfile.TemporaryDirectory(prefix="laneflow-native-") as d:  # (mode 0700: ours alone)
        if keep:
            os.makedirs(keep, exist_ok=True)
        path = os.path.join(keep or d, name + suffix())
        with open(path, "wb") as f:
            f.write(image)
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)  # (dlopen: the file may go once it is mapped)
    if not hasattr(mod, entry):
        raise ImportError(f"the built module has no {entry} (another source or compiler?)")
    return mod


def compile(name: str, source: Path, what: str, link: Sequence[str] = ()) -> bytes:  # noqa: A001
    """The shared object of ``source`` (module ``name``), built with the system C compiler; NotBuilt
    (naming ``what``) when that cannot be done here."""
    cmd0 = shlex.split(cc())
    if not cmd0 or shutil.which(cmd0[0]) is None:
        raise NotBuilt(f"no C compiler ({cmd0[0] if cmd0 else 'CC is empty'}); set CC to build {what}")
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        raise NotBuilt(f"Python's headers are missing ({include}/Python.h: install python3-dev)")
    with tempfile.TemporaryDirectory(prefix="laneflow-native-build-") as d:
        out = os.path.join(d, name + suffix())
        cmd = [*cmd0, "-shared", "-fPIC", "-O2", "-I", include, str(source), "-o", out, *link]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NotBuilt(f"the C compiler failed to run ({e})") from None
        if r.returncode != 0:
            last = (r.stderr or r.stdout).strip().splitlines()[-3:] or [f"exit status {r.returncode}"]
            raise NotBuilt(f"building {what} failed: {' / '.join(last)}")
        with open(out, "rb") as f:
            return f.read()


def build(prefix: str, name: str, source: Path, what: str, entry: str, switch: str) -> ModuleType:
    """The extension module ``name`` of ``source`` from the signed disk cache (entry ``prefix`` and a hash
    of the source, ``native.h``, the Python and the compiler), else built and cached once it loads
    (``entry``: a function it must have). NotBuilt, naming ``what``, when it cannot be built here, or when
    the environment variable ``switch`` is ``0``."""
    if os.environ.get(switch, "1") == "0":
        raise NotBuilt(f"{switch}=0")
    from . import disk_cache  # (imported here: disk_cache's docstring names this module, nothing more)

    return disk_cache.cached(key(prefix, source.read_bytes()), lambda: compile(name, source, what),
                             lambda image: load(name, image, entry), unusable=(ImportError,))
