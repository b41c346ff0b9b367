"""Compiled kernels and their launch: one pre-packed parameter block per kernel.

A :class:`Kernel` knows its parameter types. Its arguments are packed with one ``struct.pack_into``
into a block that lives as long as the kernel, and ``cuLaunchKernel`` gets the address of a
pointer array into that block (built once), never the ``(args, types)`` tuple form. The driver
copies the arguments at launch, so the block is reused at once. Launches happen under the
scheduler's lock, so one block per kernel is enough.

Parameter type codes: ``p`` pointer, ``?`` bool, ``b``/``B`` int8/uint8, ``h``/``H`` int16/uint16,
``i``/``I`` int32/uint32, ``q``/``Q`` int64/uint64, ``f`` float, ``d`` double, ``F``/``Z`` a complex64 /
complex128 (``lf_c64``/``lf_c128``, passed as the value's 8 / 16 bytes), ``D`` a ``Dims`` struct (eight
int64, passed as a tuple of up to eight ints).
"""

from __future__ import annotations

import struct
import threading
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu

from ..driver import DeviceContext, check, fail
from .. import nvrtc
from .cdefs import PREAMBLE

_FMT = {"p": ("Q", 8), "?": ("?", 1), "b": ("b", 1), "B": ("B", 1), "h": ("h", 2), "H": ("H", 2),
        "i": ("i", 4), "I": ("I", 4), "q": ("q", 8), "Q": ("Q", 8), "f": ("f", 4), "d": ("d", 8),
        "F": ("8s", 8), "Z": ("16s", 16), "D": ("8q", 8)}
_DSIZE = {"D": 64}


class Kernel:
    """A loaded kernel function with its parameter layout."""

    __slots__ = ("fn", "name", "params", "_pack", "_block", "_argv", "_argv_addr", "_dims", "attrs", "_prefix",
                 "_launch", "_f")

    def __init__(self, fn: Any, name: str, params: str, calls: Any):
        self.fn = fn
        self._launch = calls.launch  # the device's per-command driver calls (fastcall.Calls)
        self._f = int(fn) if calls.via == "C shim" else fn  # (the shim reads a plain int fastest)
        self.name = name
        self.params = params
        fmt, offsets = _layout(params)
        st = struct.Struct(fmt)
        self._pack = st.pack_into
        self._block = np.zeros(max(8, st.size), np.uint8)
        base = self._block.ctypes.data
        self._argv = np.array([base + o for o in offsets] or [0], np.uint64)
        self._argv_addr = self._argv.ctypes.data
        self._dims = [i for i, c in enumerate(params) if c == "D"]
        self.attrs: dict = {}
        self._prefix: dict = {}

    def launch_prefix(self, stream: int, grid: tuple, block: tuple, args: tuple, smem: int = 0) -> None:
        """Launch with only the first ``len(args)`` parameters packed; the rest of the block keeps
        older bytes. For a kernel that reads a prefix of a long parameter list (``matmul_group``'s
        pointer block), so a short call does not pack the whole list. ``stream``: the raw handle
        (``lane.handle``)."""
        pack = self._prefix.get(len(args))
        if pack is None:
            pack = self._prefix[len(args)] = struct.Struct(_layout(self.params[:len(args)])[0]).pack_into
        pack(self._block, 0, *args)
        gx, gy, gz = grid
        bx, by, bz = block
        err = self._launch(self._f, gx, gy, gz, bx, by, bz, smem, stream, self._argv_addr)
        if err:
            fail(err, f"launching {self.name}")

    def launch(self, stream: int, grid: tuple, block: tuple, args: tuple, smem: int = 0) -> None:
        """Pack ``args`` into the kernel's parameter block and launch it on stream handle ``stream``."""
        if self._dims:
            flat = []
            for i, a in enumerate(args):
                if i in self._dims:
                    a = tuple(a)
                    flat.extend(a)
                    flat.extend((0,) * (8 - len(a)))
                else:
                    flat.append(a)
            self._pack(self._block, 0, *flat)
        else:
            self._pack(self._block, 0, *args)
        gx, gy, gz = grid
        bx, by, bz = block
        err = self._launch(self._f, gx, gy, gz, bx, by, bz, smem, stream, self._argv_addr)
        if err:
            fail(err, f"launching {self.name}")


def _layout(params: str) -> tuple[str, list[int]]:
    """The struct format of a parameter block (C alignment of each parameter) and each one's offset."""
    fmt = "="
    offsets = []
    off = 0
    for code in params:
        f, align = _FMT[code]
        size = _DSIZE.get(code, struct.calcsize("=" + f))
        pad = (-off) % align
        if pad:
            fmt += f"{pad}x"
            off += pad
        offsets.append(off)
        fmt += f
        off += size
    return fmt, offsets


class Modules:
    """Per-device kernel store: spec -> Kernel, compiling (NVRTC, cached) and loading on a miss."""

    def __init__(self, ctx: DeviceContext):
        self.ctx = ctx
        self._kernels: dict = {}
        self._modules: dict = {}
        self._lock = threading.Lock()

    def get(self, spec: tuple, build: Callable[[], tuple[str, str, str]], preamble: bool = True) -> Kernel:
        """The kernel for ``spec``; ``build()`` returns (source body, kernel name, parameter codes). The
        body is compiled after laneflow's :data:`~.cdefs.PREAMBLE` unless ``preamble`` is False."""
        k = self._kernels.get(spec)
        if k is not None:
            return k
        with self._lock:
            k = self._kernels.get(spec)
            if k is None:
                body, name, params = build()
                k = self._load(PREAMBLE + body if preamble else body, name, params)
                self._kernels[spec] = k
        return k

    def source(self, source: str, name: str, params: str) -> Kernel:
        """A kernel from complete user source, compiled as written (no preamble: compiler line numbers
        are the user's), cached by its text."""
        return self.get(("user", source, name, params), lambda: (source, name, params), preamble=False)

    def _load(self, source: str, name: str, params: str) -> Kernel:
        ctx = self.ctx
        key, image = nvrtc.compile(source, ctx.cc, name)
        mod = self._modules.get(key)
        if mod is None:
            ctx.ensure_current()
            mod = check(cu.cuModuleLoadData(image), f"cuModuleLoadData({name})")
            self._modules[key] = mod
        fn = check(cu.cuModuleGetFunction(mod, name.encode()), f"cuModuleGetFunction({name})")
        return Kernel(fn, name, params, ctx.calls)


def grid_1d(ctx: DeviceContext, n: int, threads: int = 256, per_sm: int = 16) -> tuple:
    """Blocks for a grid-stride loop over n items."""
    blocks = (n + threads - 1) // threads
    return (max(1, min(blocks, ctx.sm_count * per_sm)), 1, 1)
