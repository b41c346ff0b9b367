"""Run-time compilation of CUDA C++ with NVRTC, cached in memory and on disk.

A compiled kernel is keyed by its source, the target architecture, the NVRTC version and the options.
The disk cache lives in ``$LANEFLOW_KERNEL_CACHE`` or, by default, in the user's cache directory
(``$XDG_CACHE_HOME/laneflow/kernels``, else ``~/.cache/laneflow/kernels``), created with mode 0700.

What is guaranteed: a loaded binary was written by a process of this user holding the cache's secret.
- The directory is used only when it is no symlink, it and every parent are owned by this user or
  root, and none is writable by group or others unless it has the sticky bit (``/tmp``: others cannot
  rename or remove what is ours), as ssh checks a home directory. Otherwise the cache is off, with
  one warning.
- Each entry carries an HMAC-SHA256 of its name and binary under a 32-byte per-user secret
  (``.key`` in the directory, mode 0600, created once). An entry that is truncated, corrupt,
  re-signed without the secret, a symlink, not ours, or readable or writable by others is not loaded:
  it is compiled again and rewritten (one warning for a loosened or foreign entry). Someone who can
  write as this user can still replace both the key and the entries; the cache defends against other
  users, not against the user.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import tempfile
import threading
import warnings
from pathlib import Path

from cuda.bindings import nvrtc

from ...errors import LaneflowError

_MAGIC = b"LFCUBIN2"  # (version 1 entries carried a plain SHA-256: compiled again)
_KEY_FILE = ".key"
_warned: set = set()


def _warn_once(what: str, msg: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"laneflow: {msg}", RuntimeWarning, stacklevel=4)
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


def cache_dir() -> Path | None:
    """The private disk-cache directory, created on first use; None when no safe one is available."""
    env = os.environ.get("LANEFLOW_KERNEL_CACHE")
    if env == "":
        return None  # disk cache switched off
    if env:
        path = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "laneflow" / "kernels"
    try:
        path = Path(os.path.abspath(path))
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.is_symlink():
            raise PermissionError(f"{path} is a symbolic link")
        _check_owner_chain(path)
        st = path.lstat()
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        return path
    except OSError as e:
        _warn_once(f"dir {path}", f"kernel disk cache disabled ({e})")
        return None


def _check_owner_chain(path: Path) -> None:
    """``path`` and its parents: each owned by this user or root, none writable by group or others
    unless sticky (ssh's rule for a home directory, with /tmp allowed)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for p in (path, *path.parents):
        st = p.stat()
        if uid is not None and st.st_uid not in (uid, 0):
            raise PermissionError(f"{p} belongs to another user")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            raise PermissionError(f"{p} is writable by other users")


_secrets: dict = {}


def _secret(d: Path) -> bytes | None:
    """The per-user secret that signs the entries, created once (mode 0600) and read once per
    directory per process; None when unusable."""
    k = _secrets.get(d)
    if k is None:
        k = _secrets[d] = _load_secret(d)
    return k or None


def _load_secret(d: Path) -> bytes:
    p = d / _KEY_FILE
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
    try:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_mode & 0o077:
            _warn_once(f"key {p}", f"kernel disk cache disabled: its key {p} is a link, not ours, or open to others")
            return b""
        k = p.read_bytes()
        return k if len(k) == 32 else b""
    except OSError:
        return b""


def _sign(secret: bytes, name: str, image: bytes) -> bytes:
    return hmac.new(secret, name.encode() + b"\0" + image, hashlib.sha256).digest()


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
        d = cache_dir()
        secret = _secret(d) if d is not None else None
        image = _read(d / k, secret) if secret is not None else None
        if image is None:
            image = _nvrtc(source, _target(cc), name)
            if secret is not None:
                _write(d / k, image, secret)
        _mem[k] = image
        return k, image


def _read(path: Path, secret: bytes) -> bytes | None:
    """The binary of a cache entry, or None: missing, not a plain file of ours closed to others,
    truncated, or not signed with ``secret``."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if (not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid())
            or st.st_mode & 0o077):
        _warn_once(f"entry {path.parent}", f"kernel cache entry {path.name} is a link, not ours, or open to "
                   "others: not loaded (compiled again)")
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 40 or data[:8] != _MAGIC:
        return None
    mac, image = data[8:40], data[40:]
    if not hmac.compare_digest(mac, _sign(secret, path.name, image)):
        return None  # corrupt, or written without the secret: compile again
    return image


def _write(path: Path, image: bytes, secret: bytes) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # (mkstemp: mode 0600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + _sign(secret, path.name, image) + image)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)  # replaces a link or a loosened entry by a file of ours
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        warnings.warn(f"laneflow: could not write the kernel cache entry {path.name} ({e})", RuntimeWarning,
                      stacklevel=4)


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
