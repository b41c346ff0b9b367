"""The private disk cache that NVRTC's kernel images (``backends/cuda/nvrtc.py``) and laneflow's built
C extensions (``native.py``: the driver shim, the tape's node maker) live in: one directory per user,
signed entries.

The directory is ``$LANEFLOW_KERNEL_CACHE`` or, by default, the user's cache directory
(``$XDG_CACHE_HOME/laneflow/kernels``, else ``~/.cache/laneflow/kernels``), created with mode 0700;
``LANEFLOW_KERNEL_CACHE=""`` turns it off.

What is guaranteed: a loaded entry was written by a process of this user holding the cache's secret.
- The directory is used only when it is no symlink, it and every parent are owned by this user or
  root, and none is writable by group or others unless it has the sticky bit (``/tmp``: others cannot
  rename or remove what is ours), as ssh checks a home directory. Otherwise the cache is off, with
  one warning.
- Each entry carries an HMAC-SHA256 of its name and contents under a 32-byte per-user secret
  (``.key`` in the directory, mode 0600, created once). An entry that is truncated, corrupt,
  re-signed without the secret, a symlink, not ours, or readable or writable by others is not loaded:
  it is made again and rewritten (one warning for a loosened or foreign entry). Someone who can write
  as this user can still replace both the key and the entries; the cache defends against other
  users, not against the user.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

MAGIC = b"LFCUBIN2"  # (version 1 entries carried a plain SHA-256: compiled again)
_KEY_FILE = ".key"
_warned: set = set()


def _warn_once(what: str, msg: str) -> None:
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"laneflow: {msg}", RuntimeWarning, stacklevel=4)

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
_secret_lock = threading.Lock()


def secret(d: Path) -> bytes | None:
    """The per-user secret that signs the entries, created once (mode 0600) and read once per
    directory per process; None when unusable. (Under a lock: NVRTC and the shim may ask at once,
    and a read while another thread creates the key would find it empty.)"""
    k = _secrets.get(d)
    if k is None:
        with _secret_lock:
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


def sign(secret: bytes, name: str, image: bytes) -> bytes:
    return hmac.new(secret, name.encode() + b"\0" + image, hashlib.sha256).digest()



def read(path: Path, secret: bytes) -> bytes | None:
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
    if len(data) < 40 or data[:8] != MAGIC:
        return None
    mac, image = data[8:40], data[40:]
    if not hmac.compare_digest(mac, sign(secret, path.name, image)):
        return None  # corrupt, or written without the secret: compile again
    return image


def write(path: Path, image: bytes, secret: bytes) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # (mkstemp: mode 0600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + sign(secret, path.name, image) + image)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)  # replaces a link or a loosened entry by a file of ours
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        warnings.warn(f"laneflow: could not write the kernel cache entry {path.name} ({e})", RuntimeWarning,
                      stacklevel=4)


def cached(name: str, make: Callable[[], bytes], use: Callable[[bytes], Any] = bytes,
           unusable: tuple = ()) -> Any:
    """``use(image)`` of the entry ``name``: the cached image when there is one and ``use`` takes it
    (raising one of ``unusable`` says it does not: it is made again and replaced), else ``make()``'s,
    kept only once ``use`` has taken it (a made image that fails is never cached)."""
    d = cache_dir()
    key = secret(d) if d is not None else None
    if key is not None:
        image = read(d / name, key)
        if image is not None:
            try:
                return use(image)
            except unusable:
                pass
    image = make()
    out = use(image)
    if key is not None:
        write(d / name, image, key)
    return out
