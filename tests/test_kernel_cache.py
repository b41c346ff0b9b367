"""The kernel disk cache (backends/cuda/nvrtc.py) loads only what this user's process signed, from a
directory no other user can write: tampered entries (with a recomputed digest), loosened or linked
entries, a loosened parent and a symlinked directory are each refused and the kernel compiled again.
NVRTC needs no GPU, so this runs wherever NVRTC is installed (the dev extra)."""

from __future__ import annotations

import hashlib
import os
import stat
import warnings

import pytest

nvrtc_mod = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings is not installed")
from laneflow import disk_cache  # noqa: E402
from laneflow.backends.cuda import nvrtc  # noqa: E402

try:
    _USABLE = nvrtc_mod.nvrtcVersion()[0] == nvrtc_mod.nvrtcResult.NVRTC_SUCCESS
except Exception:  # noqa: BLE001 - the library is missing
    _USABLE = False
pytestmark = pytest.mark.skipif(not _USABLE, reason="NVRTC library not found (pip install -e '.[dev]')")

CC = (9, 0)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, an empty memory cache and a counter of real compiles."""
    d = tmp_path / "kc"
    monkeypatch.setenv("LANEFLOW_KERNEL_CACHE", str(d))
    monkeypatch.setattr(nvrtc, "_mem", {})
    monkeypatch.setattr(disk_cache, "_warned", set())
    calls = []
    real = nvrtc._nvrtc
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda *a: (calls.append(a), real(*a))[1])
    return d, calls


def _src(n: int) -> str:
    return 'extern "C" __global__ void lf_t(int* x) { x[0] = %d; }' % n


def _again(src: str):
    nvrtc._mem.clear()
    return nvrtc.compile(src, CC, "lf_t")


def test_entries_are_signed_and_a_good_one_is_loaded(cache):
    d, calls = cache
    k, image = nvrtc.compile(_src(1), CC, "lf_t")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / k).st_mode) == 0o600 and stat.S_IMODE(os.stat(d / ".key").st_mode) == 0o600
    assert _again(_src(1)) == (k, image) and len(calls) == 1  # loaded, not compiled


def test_a_swapped_image_with_a_recomputed_digest_is_refused(cache):
    d, calls = cache
    k1, img1 = nvrtc.compile(_src(2), CC, "lf_t")
    k2, img2 = nvrtc.compile(_src(3), CC, "lf_t")
    # what the old format allowed: the other kernel's image under this name, with its SHA-256 beside it
    (d / k1).write_bytes(disk_cache.MAGIC + hashlib.sha256(img2).digest() + img2)
    # and an entry moved from another name, signed for that name
    assert _again(_src(2)) == (k1, img1) and len(calls) == 3
    (d / k1).write_bytes((d / k2).read_bytes())
    assert _again(_src(2)) == (k1, img1) and len(calls) == 4
    # signed with another key: refused too
    other = os.urandom(32)
    (d / k1).write_bytes(disk_cache.MAGIC + disk_cache.sign(other, k1, img2) + img2)
    assert _again(_src(2)) == (k1, img1) and len(calls) == 5


def test_a_loosened_or_linked_entry_is_refused_with_one_warning(cache):
    d, calls = cache
    k, img = nvrtc.compile(_src(4), CC, "lf_t")
    os.chmod(d / k, 0o644)
    with pytest.warns(RuntimeWarning, match="open to others"):
        assert _again(_src(4)) == (k, img)
    assert len(calls) == 2 and stat.S_IMODE(os.stat(d / k).st_mode) == 0o600  # rewritten as ours
    target = d / "elsewhere"
    target.write_bytes((d / k).read_bytes())
    os.chmod(target, 0o600)
    (d / k).unlink()
    (d / k).symlink_to(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the warning was given once already
        assert _again(_src(4)) == (k, img)
    assert len(calls) == 3 and not (d / k).is_symlink()


def test_a_loosened_parent_or_a_symlinked_directory_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setattr(disk_cache, "_warned", set())
    open_parent = tmp_path / "open"
    open_parent.mkdir()
    os.chmod(open_parent, 0o777)  # writable by others, no sticky bit
    monkeypatch.setenv("LANEFLOW_KERNEL_CACHE", str(open_parent / "kc"))
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        assert disk_cache.cache_dir() is None
    os.chmod(open_parent, 0o1777)  # sticky, as /tmp: others cannot rename or remove our entries
    assert disk_cache.cache_dir() == open_parent / "kc"
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("LANEFLOW_KERNEL_CACHE", str(link))
    with pytest.warns(RuntimeWarning, match="symbolic link"):
        assert disk_cache.cache_dir() is None
    monkeypatch.setattr(nvrtc, "_mem", {})
    k, img = nvrtc.compile(_src(5), CC, "lf_t")  # still compiles, from memory only
    assert img and not (real / k).exists()
