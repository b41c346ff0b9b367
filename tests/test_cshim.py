"""The C driver shim (backends/cuda/cshim.c, built by cshim.py) passes each argument to the driver as
given and returns the driver's result: checked against a stand-in libcuda (tests/doubles/fake_libcuda.c)
that records what it got. Each case runs in a fresh interpreter, since the shim's entry points are
process-wide (on a GPU machine the suite's own shim points at the real driver)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig

import pytest

from conftest import run_laneflow_script

pytest.importorskip("cuda.bindings", reason="the shim ships with the CUDA backend (pip install -e .[cuda])")

_DOUBLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doubles")
_CC = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
if shutil.which(_CC.split()[0]) is None or not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
    pytest.skip("no C compiler or no Python headers: the shim cannot be built here", allow_module_level=True)


@pytest.fixture
def fake_lib(tmp_path):
    out = tmp_path / "libfakecuda.so"
    subprocess.run([*_CC.split(), "-shared", "-fPIC", "-O0", os.path.join(_DOUBLES, "fake_libcuda.c"), "-o", str(out)],
                   check=True, capture_output=True, timeout=120)
    return str(out)


def _run(script: str, tmp_path, **env):
    return run_laneflow_script(script, tmp_path, unset=("LANEFLOW_CSHIM",), **env)


_CALLS = r"""
import ctypes, sys
import numpy as np
from laneflow.backends.cuda import cshim
lib_path = sys.argv[1] if len(sys.argv) > 1 else LIB
m = cshim.load(LIB)
assert m is not None, cshim.why_not(LIB)
lib = ctypes.CDLL(LIB)
got = (ctypes.c_ulonglong * 16).in_dll(lib, "lf_fake_args")
calls = ctypes.c_int.in_dll(lib, "lf_fake_calls")
result = ctypes.c_int.in_dll(lib, "lf_fake_result")

class Handle:  # a cuda-bindings handle: an object with __index__
    def __init__(self, v): self.v = v
    def __index__(self): return self.v

block = np.array([0x1234567890ABCDEF], np.uint64)
argv = np.array([block.ctypes.data], np.uint64)
big = 2**64 - 2
assert m.launch(Handle(0xF00D), 1, 2, 3, 128, 4, 5, 96, big, argv.ctypes.data) == 0
assert list(got[:12]) == [0xF00D, 1, 2, 3, 128, 4, 5, 96, big, argv.ctypes.data, 0, 0x1234567890ABCDEF], list(got[:12])
assert m.record(Handle(7), 9) == 0 and list(got[:2]) == [7, 9]
assert m.query(11) == 0 and got[0] == 11
assert m.wait_event(5, Handle(6)) == 0 and list(got[:3]) == [5, 6, 0]
assert m.alloc(4096, Handle(3), 8) == (0, 0xdeadbeef000) and list(got[:3]) == [4096, 3, 8]
assert m.free(0xdeadbeef000, 8) == 0 and list(got[:2]) == [0xdeadbeef000, 8]
assert m.copy_dtod(100, 200, 300, 4) == 0 and list(got[:4]) == [100, 200, 300, 4]
host = np.array([42, 1], np.uint8)
assert m.copy_htod(100, host.ctypes.data, 2, 4) == 0 and list(got[:5]) == [100, host.ctypes.data, 2, 4, 42]
n = calls.value
result.value = 700  # the driver's error comes back as it is
assert m.launch(1, 1, 1, 1, 1, 1, 1, 0, 0, argv.ctypes.data) == 700
assert m.alloc(16, 1, 0) == (700, 0)  # (no pointer with an error)
assert m.record(1, 0) == 700 and calls.value == n + 3
for bad, exc in [(lambda: m.launch(1, 2**32, 1, 1, 1, 1, 1, 0, 0, 0), OverflowError),
                 (lambda: m.launch(1, -1, 1, 1, 1, 1, 1, 0, 0, 0), OverflowError),
                 (lambda: m.launch(1, 1, 1, 1, 1, 1, 1, 0, 0), TypeError),
                 (lambda: m.record(1.5, 0), TypeError),
                 (lambda: m.free(object(), 0), TypeError)]:
    try:
        bad()
    except exc:
        pass
    else:
        raise AssertionError(f"no {exc.__name__}")
assert calls.value == n + 3  # (a rejected call never reached the driver)
print("ok", calls.value)
"""


def test_the_shim_passes_every_argument_and_returns_the_drivers_result(tmp_path, fake_lib):
    out = _run(f"LIB = {fake_lib!r}\n" + _CALLS, tmp_path)
    assert out.startswith("ok"), out


_CACHED = r"""
from laneflow.backends.cuda import cshim
def boom():
    raise AssertionError("compiled again")
if MODE == "cached":
    cshim._compile = boom
m = cshim.load(LIB)
assert m is not None, cshim.why_not(LIB)
assert m.query(3) == 0
print("ok")
"""


def test_a_later_process_loads_the_built_shim_from_the_signed_cache(tmp_path, fake_lib):
    assert _run(f"LIB = {fake_lib!r}\nMODE = 'build'\n" + _CACHED, tmp_path).startswith("ok")
    entries = [p for p in os.listdir(tmp_path / "kc") if p.startswith("cshim-")]
    assert len(entries) == 1
    assert _run(f"LIB = {fake_lib!r}\nMODE = 'cached'\n" + _CACHED, tmp_path).startswith("ok")
    # an entry changed on disk is not loaded: it is built again (and then it works)
    p = tmp_path / "kc" / entries[0]
    data = bytearray(p.read_bytes())
    data[-100] ^= 0xFF
    p.write_bytes(bytes(data))
    os.chmod(p, 0o600)
    assert _run(f"LIB = {fake_lib!r}\nMODE = 'build'\n" + _CACHED, tmp_path).startswith("ok")


_WHY = r"""
from laneflow.backends.cuda import cshim
assert cshim.load(LIB) is None
print(cshim.why_not(LIB))
"""


def test_without_the_shim_the_reason_is_said(tmp_path, fake_lib):
    assert "LANEFLOW_CSHIM=0" in _run(f"LIB = {fake_lib!r}\n" + _WHY, tmp_path, LANEFLOW_CSHIM="0")
    out = _run(f"LIB = {fake_lib!r}\n" + _WHY, tmp_path, CC="no-such-compiler-here")
    assert "no C compiler (no-such-compiler-here)" in out, out
    out = _run(f"LIB = {str(tmp_path / 'missing.so')!r}\n" + _WHY, tmp_path)
    assert "entry points were not found" in out and "missing.so" in out, out


_BADCC = """#!/bin/sh
# a compiler that succeeds but whose output this Python cannot load (a cross compiler, another
# Python's headers): a shared object without the module's init function
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo 'int unrelated(void) {{ return 0; }}' > "$out.c" && exec {cc} -shared -fPIC "$out.c" -o "$out"
"""


def test_a_build_that_does_not_load_falls_back_and_is_not_cached(tmp_path, fake_lib):
    bad = tmp_path / "badcc.sh"
    bad.write_text(_BADCC.format(cc=_CC))
    bad.chmod(0o755)
    out = _run(f"LIB = {fake_lib!r}\n" + _WHY, tmp_path, CC=str(bad))
    assert "did not load" in out, out
    assert not [p for p in os.listdir(tmp_path / "kc") if p.startswith("cshim-")]
    # a signed entry that does not load (here: put there under the right key) is built again and replaced
    script = (f"LIB = {fake_lib!r}\n" "from laneflow import disk_cache\nfrom laneflow.backends.cuda import cshim\n"
              "d = disk_cache.cache_dir(); name = cshim._key(cshim.SOURCE.read_bytes())\n"
              "disk_cache.write(d / name, open(BAD, 'rb').read(), disk_cache.secret(d))\n"
              "m = cshim.load(LIB)\nassert m is not None and m.query(3) == 0, cshim.why_not(LIB)\n"
              "assert cshim._load(disk_cache.read(d / name, disk_cache.secret(d))) is not None\nprint('ok')\n")
    so = tmp_path / "unloadable.so"
    subprocess.run([str(bad), "-o", str(so)], check=True, timeout=120)
    assert _run(f"BAD = {str(so)!r}\n" + script, tmp_path).startswith("ok")
