"""Run-time compilation of CUDA C++ with NVRTC, cached in memory and on disk.

A compiled kernel is keyed by its source, the target architecture, the NVRTC version and the options.
The disk cache (``disk_cache.py``) lives in ``$LANEFLOW_KERNEL_CACHE`` or, by default, in the user's
cache directory (``$XDG_CACHE_HOME/laneflow/kernels``, else ``~/.cache/laneflow/kernels``), created with
mode 0700; its entries are signed, and it defends against other users, not against the user.
"""

from __future__ import annotations

import hashlib
import re
import threading

from cuda.bindings import nvrtc

from ...errors import LaneflowError
from ... import disk_cache

# --fmad=false: a fused kernel must round every step as the separate kernels do (a*b+c contracted into one
# fma differs from mul-then-add in the last bit), and numpy never contracts either. The kernels are bound by
# memory bandwidth, so the lost fma costs nothing measurable (bench kernels, H200).
_OPTIONS = ("-std=c++17", "--fmad=false")
_mem: dict[str, bytes] = {}
_lock = threading.Lock()
_version: tuple[int, int] | None = None
_archs: list[int] | None = None


class KernelCompileError(LaneflowError):
    """NVRTC rejected a kernel. The message shows the compiler's log and the offending source lines."""


def _check(res: tuple, what: str):
    err = res[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        e, msg = nvrtc.nvrtcGetErrorString(err)
        raise LaneflowError(f"{what}: {msg.decode() if isinstance(msg, bytes) else msg}")
    return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)


def version() -> tuple[int, int]:
    global _version
    if _version is None:
        major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
        _version = (int(major), int(minor))
    return _version


def _target(cc: tuple[int, int]) -> str:
    """``sm_XY`` when NVRTC can emit machine code for it, else PTX for the newest arch it knows."""
    global _archs
    if _archs is None:
        try:
            _archs = [int(a) for a in _check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")]
        except LaneflowError:
            _archs = []
    want = cc[0] * 10 + cc[1]
    if not _archs or want in _archs:
        return f"sm_{want}"
    older = [a for a in _archs if a <= want]
    return f"compute_{max(older) if older else min(_archs)}"


def key(source: str, cc: tuple[int, int]) -> str:
    h = hashlib.sha256()
    for part in (source, _target(cc), "%d.%d" % version(), " ".join(_OPTIONS)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile(source: str, cc: tuple[int, int], name: str = "kernel") -> tuple[str, bytes]:  # noqa: A001
    """(cache key, cubin or PTX) for ``source`` on compute capability ``cc``."""
    k = key(source, cc)
    hit = _mem.get(k)
    if hit is not None:
        return k, hit
    with _lock:
        hit = _mem.get(k)
        if hit is not None:
            return k, hit
        image = disk_cache.cached(k, lambda: _nvrtc(source, _target(cc), name))
        _mem[k] = image
        return k, image


def _nvrtc(source: str, target: str, name: str) -> bytes:
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []),
                  "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={target}".encode(), *(o.encode() for o in _OPTIONS)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileError(_explain(name, source, _log(prog)))
        if target.startswith("sm_"):
            size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
            buf = b" " * size
            _check(nvrtc.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
        else:
            size = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
            buf = b" " * size
            _check(nvrtc.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
        return bytes(buf)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(prog) -> str:
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = b" " * size
    _check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return buf.rstrip(b"\0 ").decode(errors="replace")


def _explain(name: str, source: str, log: str) -> str:
    """The compiler log followed by each offending line of the source, with two lines of context."""
    lines = source.splitlines()
    shown = []
    for m in re.finditer(r"\((\d+)\): (?:error|catastrophic error)", log):
        n = int(m.group(1))
        if n in shown:
            continue
        shown.append(n)
        if len(shown) > 5:
            break
    parts = [f"NVRTC could not compile kernel {name}:", log.strip()]
    for n in shown:
        lo, hi = max(1, n - 2), min(len(lines), n + 2)
        parts.append(f"--- {name}.cu, line {n} ---")
        for i in range(lo, hi + 1):
            parts.append(f"{'>' if i == n else ' '}{i:5d} | {lines[i - 1]}")
    return "\n".join(parts)
