"""Run laneflow's CUDA backend on a machine without a GPU, with every driver call a no-op, to measure
and profile the backend's *Python* host cost per op (the part a GPU run cannot separate from driver
time). Results are garbage: nothing runs. Needs ``cuda-bindings`` importable (types and enums come from
it); NVRTC and cuBLASLt are replaced too.

    python tests/doubles/fake_cuda.py dispatch          # host us per tiny add, eager, on the fake GPU
    python tests/doubles/fake_cuda.py compiled          # host us per compiled call (1 tiny op; CUDA graph path)
    python tests/doubles/fake_cuda.py experts           # host us per compiled call, 32 matmuls, 64 arguments
    python tests/doubles/fake_cuda.py experts-captured  # the same with the 32 weights closed over (32 arguments)
    python tests/doubles/fake_cuda.py experts64         # 64 matmuls, 128 arguments (also experts64-captured)
    python tests/doubles/fake_cuda.py eager-experts     # host us per eager step: 32 matmuls built and evaluated
    ... N LANES                                 # ops/calls measured (default 5000), lanes (default 1)
    ... --profile                               # cProfile of the measured loop

Several GPUs: ``install(devices=N)`` (or ``LANEFLOW_FAKE_GPUS=N``; default 1) reports N devices, and
then also models what a real driver checks per host thread and context (see *Several devices* below):
each thread's current context, the context every stream, event, function and allocation belongs to,
and a call on one of them with another context current fails (``CONTEXT_ERRORS``). ``LOG = []``
records the calls a test checks: peer copies, waits across devices, host synchronisations, peer access.

Compiled modes also print the median host time from the call to its graph launch (the part of a call
the GPU waits for; the output objects are built after the launch).

A real driver call costs roughly 0.5-3 us more than these fakes (measured on the H200 machine).
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import os
import sys
import threading
import time

import numpy as np
from cuda.bindings import driver as real

OK = real.CUresult.CUDA_SUCCESS
_ids = itertools.count(0x1000)
_ptrs = itertools.count(0x7F0000000000, 1 << 20)
_host_words: list = []
_attr = real.CUdevice_attribute
_ATTRS = {
    _attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: 9,
    _attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: 0,
    _attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132,
    _attr.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: 1,
    _attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE: 1980000,
}


def _ok(*_a, **_k):
    return (OK,)


def _handle(*_a, **_k):
    return (OK, next(_ids))


_dead_streams: set = set()  # destroyed streams: a later call on one is what segfaults a real driver


def _stream_destroy(s):
    _dead_streams.add(int(s))
    return (OK,)


def _on_live_stream(name, result=(OK,)):
    def call(*args):
        for a in args:
            if isinstance(a, int) and a in _dead_streams:
                raise AssertionError(f"fake driver: {name} on a destroyed stream {a:#x} (a real driver may crash)")
        return result
    return call


def _error_name(err) -> bytes:
    try:
        return real.CUresult(int(err)).name.encode()
    except ValueError:
        return b"CUDA_ERROR_FAKE"


def _host_alloc(nbytes, *_a):
    buf = ctypes.create_string_buffer(max(int(nbytes), 8))
    _host_words.append(buf)
    return (OK, ctypes.addressof(buf))


FAKES = {
    "cuInit": _ok, "cuDeviceGetCount": lambda: (OK, 1), "cuDeviceGet": _handle,
    "cuDevicePrimaryCtxRetain": _handle, "cuCtxSetCurrent": _ok, "cuCtxSynchronize": _ok,
    "cuDeviceGetAttribute": lambda attr, dev: (OK, _ATTRS.get(attr, 1024)),
    "cuDeviceGetName": lambda n, dev: (OK, b"fake GPU"), "cuGetErrorName": lambda e: (OK, _error_name(e)),
    "cuStreamCreate": _handle, "cuStreamDestroy": _stream_destroy, "cuStreamSynchronize": _ok, "cuStreamWaitEvent": _ok,
    "cuStreamWaitValue64": _ok, "cuEventCreate": _handle, "cuEventRecord": _on_live_stream("cuEventRecord"), "cuEventQuery": _ok,
    "cuStreamQuery": _on_live_stream("cuStreamQuery"),
    "cuEventSynchronize": _ok, "cuEventDestroy": _ok, "cuEventElapsedTime": lambda a, b: (OK, 0.001),
    "cuMemPoolCreate": _handle, "cuMemPoolSetAttribute": _ok, "cuMemPoolGetAttribute": lambda *a: (OK, 0),
    "cuDeviceGetDefaultMemPool": _handle, "cuMemAllocFromPoolAsync": lambda n, pool, s: (OK, next(_ptrs)),
    "cuMemFreeAsync": _ok, "cuMemGetInfo": lambda: (OK, 100 << 30, 140 << 30),
    "cuMemHostAlloc": _host_alloc, "cuMemHostGetDevicePointer": lambda p, f: (OK, p),
    "cuMemcpyHtoDAsync": _ok, "cuMemcpyDtoHAsync": _ok, "cuMemcpyDtoDAsync": _ok, "cuMemcpyPeerAsync": _ok,
    "cuMemcpyAsync": _ok,
    "cuMemcpyDtoH": _ok, "cuMemsetD8Async": _ok, "cuMemsetD16Async": _ok, "cuMemsetD32Async": _ok,
    "cuModuleLoadData": _handle, "cuModuleGetFunction": _handle, "cuFuncSetAttribute": _ok,
    "cuLaunchKernel": _on_live_stream("cuLaunchKernel"), "cuStreamBeginCapture": _ok, "cuStreamEndCapture": _handle,
    "cuGraphInstantiate": _handle, "cuGraphUpload": _ok, "cuGraphLaunch": _ok, "cuGraphDestroy": _ok,
    "cuGraphExecDestroy": _ok, "cuGraphExecUpdate": lambda e, g: (OK, None),
    "cuGraphGetNodes": lambda g, n=0: (OK, None, 1),
}


# -- several devices ---------------------------------------------------------------------------------
#
# With more than one device (``install(devices=N)``) every handle remembers the device whose context
# was current when it was made (streams, events, modules and their functions; pools and allocations
# their device), each host thread has its current context (``cuCtxSetCurrent``), and a call on a
# stream, event, function or device memory with another context current (or none) is a context error:
# it is appended to CONTEXT_ERRORS and fails with CUDA_ERROR_INVALID_CONTEXT. Exceptions, as on a
# real driver: ``cuStreamWaitEvent`` may wait on another context's event; ``cuMemcpyPeerAsync`` names
# both contexts; host waits and queries need no context. Device memory is also checked against the
# stream's device (a copy or kernel within a device never touches another device's memory).

#: Devices reported (``install(devices=N)``; the default comes from ``LANEFLOW_FAKE_GPUS``).
DEVICES = 1
#: What ``cuDeviceCanAccessPeer`` answers for every pair of distinct devices.
CAN_ACCESS_PEER = True
#: None, or a list of (call, fields) the driver appends to: ``cuMemcpyPeerAsync`` (dst, src, stream
#: devices), ``cuStreamWaitEvent`` across devices (stream, event devices), ``cuLaunchKernel`` and
#: ``cuMemcpyDtoDAsync`` (device), host synchronisations (``cuEventSynchronize``,
#: ``cuStreamSynchronize``, ``cuCtxSynchronize``, ``cuMemcpyDtoH``: the device), ``cuDeviceCanAccessPeer``
#: and ``cuCtxEnablePeerAccess`` (device, peer), ``cuCtxSetCurrent`` is not logged.
LOG: list | None = None
#: Context errors seen (a message each); a clean run leaves it empty.
CONTEXT_ERRORS: list = []

_DEV0, _CTX0 = 0x100, 0x200  # device i's handle is _DEV0 + i, its primary context _CTX0 + i
_tls = threading.local()
_owner: dict = {}            # stream, event, module, function, pool handle -> device index
_allocs: list = []           # (base, size, device), bases ascending (addresses are never reused)
_peers: set = set()          # (device, peer) pairs with peer access enabled
INVALID_CONTEXT = real.CUresult.CUDA_ERROR_INVALID_CONTEXT


def _current():
    return getattr(_tls, "device", None)


def _mem_device(ptr):
    """The device of the allocation holding ``ptr`` (None: host or foreign memory)."""
    i = bisect.bisect_right(_allocs, (int(ptr), float("inf"))) - 1
    if i >= 0:
        base, size, dev = _allocs[i]
        if int(ptr) < base + size:
            return dev
    return None


def _log(name, **fields):
    if LOG is not None:
        LOG.append((name, fields))


def _context_error(name, msg):
    CONTEXT_ERRORS.append(f"{name}: {msg} (thread {threading.current_thread().name})")
    return (INVALID_CONTEXT,)


def _on(stream, name, *ptrs):
    """None when ``stream``'s context is current and every pointer (device memory) is on its device,
    else the context error's result."""
    dev = _owner.get(int(stream))
    cur = _current()
    if dev != cur:
        return _context_error(name, f"stream of gpu:{dev} with the context of gpu:{cur} current")
    for p in ptrs:
        pd = _mem_device(p)
        if pd is not None and pd != dev:
            return _context_error(name, f"memory of gpu:{pd} on a stream of gpu:{dev}")
    return None


def _multi_device_fakes(fakes: dict) -> dict:
    """Wrappers of ``fakes`` (the calls as installed, maybe a race model's) that keep and check the
    per-thread, per-context state described above."""
    fakes = dict(fakes)  # the calls wrapped, as they are now
    f = {}

    def made(result):  # a new handle of the current context
        if result[0] == OK:
            _owner[int(result[1])] = _current()
        return result

    def set_current(ctx):
        _tls.device = int(ctx) - _CTX0
        return (OK,)

    def device_get(i):
        return (OK, _DEV0 + i) if 0 <= i < DEVICES else (real.CUresult.CUDA_ERROR_INVALID_DEVICE, 0)

    def alloc(n, pool, s):
        bad = _on(s, "cuMemAllocFromPoolAsync")
        if bad is None and _owner.get(int(pool)) != _owner.get(int(s)):
            bad = _context_error("cuMemAllocFromPoolAsync", f"pool of gpu:{_owner.get(int(pool))} on a stream of "
                                 f"gpu:{_owner.get(int(s))}")
        if bad is not None:
            return bad + (0,)
        r = fakes["cuMemAllocFromPoolAsync"](n, pool, s)
        if r[0] == OK:
            _allocs.append((int(r[1]), max(int(n), 1), _owner[int(s)]))
        return r

    def get_function(mod, name):  # a function belongs to its module's context
        r = fakes["cuModuleGetFunction"](mod, name)
        _owner[int(r[1])] = _owner.get(int(mod))
        return r

    def pool_create(props):
        r = fakes["cuMemPoolCreate"](props)
        _owner[int(r[1])] = int(props.location.id)
        return r

    def default_pool(dev):
        r = fakes["cuDeviceGetDefaultMemPool"](dev)
        _owner[int(r[1])] = int(dev) - _DEV0
        return r

    def on_stream(name, stream_at, ptrs_at=()):
        inner = fakes[name]

        def call(*a):
            bad = _on(a[stream_at], name, *[a[k] for k in ptrs_at])
            return bad if bad is not None else inner(*a)
        return call

    def launch(fn, *a):
        s = a[7]
        bad = _on(s, "cuLaunchKernel")
        if bad is None and _owner.get(int(fn)) != _owner.get(int(s)):
            bad = _context_error("cuLaunchKernel", f"function of gpu:{_owner.get(int(fn))} on a stream of "
                                 f"gpu:{_owner.get(int(s))}")
        if bad is not None:
            return bad
        _log("cuLaunchKernel", device=_owner[int(s)])
        return fakes["cuLaunchKernel"](fn, *a)

    def record(ev, s):
        bad = _on(s, "cuEventRecord")
        if bad is None and _owner.get(int(ev)) != _owner.get(int(s)):
            bad = _context_error("cuEventRecord", f"event of gpu:{_owner.get(int(ev))} on a stream of "
                                 f"gpu:{_owner.get(int(s))}")
        return bad if bad is not None else fakes["cuEventRecord"](ev, s)

    def wait_event(s, ev, flags):
        bad = _on(s, "cuStreamWaitEvent")
        if bad is not None:
            return bad
        sd, ed = _owner.get(int(s)), _owner.get(int(ev))
        if sd != ed:
            _log("cuStreamWaitEvent", stream=sd, event=ed)
        return fakes["cuStreamWaitEvent"](s, ev, flags)

    def dtod(dst, src, n, s):
        bad = _on(s, "cuMemcpyDtoDAsync", dst, src)
        if bad is not None:
            return bad
        _log("cuMemcpyDtoDAsync", device=_owner[int(s)])
        return fakes["cuMemcpyDtoDAsync"](dst, src, n, s)

    def peer(dst, dctx, src, sctx, n, s):
        bad = _on(s, "cuMemcpyPeerAsync")
        if bad is not None:
            return bad
        for what, ptr, ctx in (("destination", dst, dctx), ("source", src, sctx)):
            if _mem_device(ptr) not in (None, int(ctx) - _CTX0):
                return _context_error("cuMemcpyPeerAsync", f"{what} on gpu:{_mem_device(ptr)} named with the "
                                      f"context of gpu:{int(ctx) - _CTX0}")
        _log("cuMemcpyPeerAsync", dst=int(dctx) - _CTX0, src=int(sctx) - _CTX0, stream=_owner[int(s)])
        return fakes["cuMemcpyPeerAsync"](dst, dctx, src, sctx, n, s)

    def dtoh(host, src, n):
        d = _mem_device(src)
        if d is not None and d != _current():
            return _context_error("cuMemcpyDtoH", f"memory of gpu:{d} with the context of gpu:{_current()} current")
        _log("cuMemcpyDtoH", device=d)
        return fakes["cuMemcpyDtoH"](host, src, n)

    def host_wait(name, owner_of):
        inner = fakes[name]

        def call(*a):
            _log(name, device=owner_of(*a))
            return inner(*a)
        return call

    def can_access(dev, peer_dev):
        _log("cuDeviceCanAccessPeer", device=int(dev) - _DEV0, peer=int(peer_dev) - _DEV0)
        return (OK, int(CAN_ACCESS_PEER and dev != peer_dev))

    def enable_peer(peer_ctx, flags):
        pair = (_current(), int(peer_ctx) - _CTX0)
        _log("cuCtxEnablePeerAccess", device=pair[0], peer=pair[1])
        if pair[0] is None:
            return _context_error("cuCtxEnablePeerAccess", "no context current")
        if not CAN_ACCESS_PEER or pair[0] == pair[1]:
            return (real.CUresult.CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,)
        if pair in _peers:
            return (real.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,)
        _peers.add(pair)
        return (OK,)

    f.update({
        "cuDeviceGetCount": lambda: (OK, DEVICES), "cuDeviceGet": device_get,
        "cuDevicePrimaryCtxRetain": lambda dev: (OK, _CTX0 + int(dev) - _DEV0), "cuCtxSetCurrent": set_current,
        "cuCtxGetCurrent": lambda: (OK, 0 if _current() is None else _CTX0 + _current()),
        "cuDeviceGetDefaultMemPool": default_pool,
        "cuStreamCreate": lambda flags: made(fakes["cuStreamCreate"](flags)),
        "cuEventCreate": lambda flags: made(fakes["cuEventCreate"](flags)),
        "cuModuleLoadData": lambda image: made(fakes["cuModuleLoadData"](image)),
        "cuModuleGetFunction": get_function,
        "cuMemPoolCreate": pool_create, "cuMemAllocFromPoolAsync": alloc, "cuLaunchKernel": launch,
        "cuEventRecord": record, "cuStreamWaitEvent": wait_event, "cuMemcpyDtoDAsync": dtod,
        "cuMemcpyPeerAsync": peer, "cuMemcpyDtoH": dtoh,
        "cuMemFreeAsync": on_stream("cuMemFreeAsync", 1, (0,)),
        "cuMemcpyHtoDAsync": on_stream("cuMemcpyHtoDAsync", 3, (0,)),
        "cuMemsetD8Async": on_stream("cuMemsetD8Async", 3, (0,)),
        "cuMemsetD16Async": on_stream("cuMemsetD16Async", 3, (0,)),
        "cuMemsetD32Async": on_stream("cuMemsetD32Async", 3, (0,)),
        "cuStreamWaitValue64": on_stream("cuStreamWaitValue64", 0),
        "cuStreamBeginCapture": on_stream("cuStreamBeginCapture", 0),
        "cuGraphLaunch": on_stream("cuGraphLaunch", 1),
        "cuEventSynchronize": host_wait("cuEventSynchronize", lambda ev: _owner.get(int(ev))),
        "cuStreamSynchronize": host_wait("cuStreamSynchronize", lambda s: _owner.get(int(s))),
        "cuCtxSynchronize": host_wait("cuCtxSynchronize", lambda: _current()),
        "cuDeviceCanAccessPeer": can_access, "cuCtxEnablePeerAccess": enable_peer,
    })
    return f


class FakeDriver:
    """``cuda.bindings.driver`` with the calls laneflow makes replaced by instant successes."""

    def __getattr__(self, name):
        fake = FAKES.get(name)
        return fake if fake is not None else getattr(real, name)


class _FakeLt:
    """Just enough of nvmath's cuBLASLt binding for laneflow's matmul to plan and 'run'."""

    class MatmulPreferenceAttribute:
        MAX_WORKSPACE_BYTES = 1

    class MatrixLayoutAttribute:
        BATCH_COUNT, STRIDED_BATCH_OFFSET = 1, 2

    class MatmulDescAttribute:
        TRANSA, TRANSB, EPILOGUE, BIAS_POINTER = 3, 4, 7, 8

    class Epilogue:
        BIAS, GELU_BIAS = 4, 36

    matmul_heuristic_result_dtype = np.dtype([("algo", "u1", 64), ("workspace_size", "u8")])

    def __getattr__(self, name):
        if name.startswith("get_"):
            return lambda attr: np.dtype(np.int64)
        if name == "matmul_algo_get_heuristic":
            def heur(*a):
                ctypes.c_int32.from_address(int(a[-1])).value = 1
            return heur
        if name in _LT_RECORDED:  # planning and running calls: what a test may check (types, scalars)
            def call(*a):
                LT_CALLS.append((name, a))
                return next(_ids)
            return call
        return lambda *a, **k: next(_ids)


#: The cuBLASLt calls :class:`_FakeLt` records in :data:`LT_CALLS`, in order: (name, args).
_LT_RECORDED = frozenset(("matmul_desc_create", "matrix_layout_create", "matmul"))
LT_CALLS: list = []


class _FakeCublas:
    class ComputeType:
        COMPUTE_64F, COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 70, 68, 77


#: Every call into the fake cuBLAS/cuSOLVER bindings, in order: (name, args). Tests clear and read it
#: (one batched call vs a loop of per-matrix calls, the pointer arrays a call gets).
LIBRARY_CALLS: list = []


class _FakeLegacy:
    """nvmath's cuBLAS/cuSOLVER bindings: handles are numbers, every call succeeds at once and is
    recorded in :data:`LIBRARY_CALLS`; ``*_buffer_size`` queries answer 64 elements."""

    class FillMode:
        LOWER, UPPER = 0, 1

    class Operation:
        N, T = 0, 1

    class EigMode:
        NOVECTOR, VECTOR = 0, 1

    def __getattr__(self, name):
        def call(*a, **k):
            LIBRARY_CALLS.append((name, a))
            return 64 if name.endswith("_buffer_size") else next(_ids)
        return call


def _fake_nvmath() -> None:
    """``nvmath.bindings.{cublas,cusolver,cusolverDn}`` as :class:`_FakeLegacy` (modules that import
    them directly, for enums, must never reach a real library under the fake driver)."""
    import types

    legacy = _FakeLegacy()
    pkg = types.ModuleType("nvmath")
    pkg.__path__ = []
    sub = types.ModuleType("nvmath.bindings")
    sub.__path__ = []
    pkg.bindings = sub
    sys.modules["nvmath"], sys.modules["nvmath.bindings"] = pkg, sub
    for name in ("cublas", "cusolver", "cusolverDn"):
        setattr(sub, name, legacy)
        sys.modules[f"nvmath.bindings.{name}"] = legacy


def install(real_nvrtc: bool = False, devices: int | None = None) -> None:
    """Patch laneflow's CUDA modules to use the fake driver and libraries (before any GPU use).
    ``real_nvrtc``: keep NVRTC (it needs no GPU), so every kernel the backend generates is really
    compiled (tests/test_kernel_sources.py); modules are still loaded by the fake driver. ``devices``:
    how many GPUs it reports (default ``LANEFLOW_FAKE_GPUS`` or 1); with more than one, contexts are
    modelled and checked (*Several devices* above) on top of the calls in FAKES at this moment."""
    import importlib
    import pkgutil

    global DEVICES
    DEVICES = int(os.environ.get("LANEFLOW_FAKE_GPUS", "1")) if devices is None else devices
    if DEVICES > 1:
        FAKES.update(_multi_device_fakes(FAKES))

    import laneflow.backends.cuda as pkg

    fake = FakeDriver()
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        mod = importlib.import_module(m.name)
        if getattr(mod, "cu", None) is real:
            mod.cu = fake
    from laneflow.backends.cuda import cudnn_attention, driver, handles, matmul, nvrtc

    cudnn_attention.DISABLED = "the fake driver runs no cuDNN"

    driver._initialised = False
    if not real_nvrtc:
        nvrtc.compile = lambda source, cc, name="kernel": (name, b"\0")
    matmul._lt = lambda: (_FakeCublas, _FakeLt())
    handles._bindings = lambda name: _FakeLegacy()
    _fake_nvmath()
    from laneflow.runtime import backend as registry

    registry._backends.pop("gpu", None)  # a GPU backend made with the real driver (or its failure) goes
    registry._failures.pop("gpu", None)


def main(argv: list[str]) -> None:
    launches: list = []
    FAKES["cuGraphLaunch"] = lambda *a: (launches.append(time.perf_counter()), (OK,))[1]
    install()
    import laneflow as lf

    which = argv[0] if argv else "dispatch"
    n = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 5000
    s = lf.new_stream(lf.gpu, lanes=int(argv[2]) if len(argv) > 2 and argv[2].isdigit() else 1)
    rng = np.random.default_rng(0)
    with lf.stream(s):
        starts: list = []
        E = 64 if which.startswith("experts64") else 32
        which = which.replace("experts64", "experts")
        if which in ("experts", "experts-captured", "eager-experts"):
            xs = [lf.array(rng.standard_normal((16, 64)).astype(np.float32)) for _ in range(E)]
            ws = [lf.array(rng.standard_normal((64, 32)).astype(np.float32)) for _ in range(E)]
            lf.eval(*xs, *ws)
        if which == "dispatch":
            x0 = lf.array(rng.standard_normal(16).astype(np.float32))

            def work():
                x = x0
                for _ in range(100):
                    x = x + 1.0
                lf.eval(x)
            per = 100
        elif which == "eager-experts":
            def work():
                y = None
                for _ in range(10):
                    y = [xs[i] @ ws[i] for i in range(E)]
                    lf.async_eval(*y)
                return y
            per = 10
        else:
            if which == "experts":
                args = xs + ws
                f = lf.compile(lambda *a: [a[i] @ a[E + i] for i in range(E)])
            elif which == "experts-captured":
                args = xs
                f = lf.compile(lambda *a: [a[i] @ ws[i] for i in range(E)])
            else:
                args = [lf.array(rng.standard_normal(16).astype(np.float32))]
                f = lf.compile(lambda x: x + 1.0)
            lf.eval(*args)

            def work():
                out = None
                for _ in range(100):
                    starts.append(time.perf_counter())
                    out = f(*args)
                return out
            per = 100
        for _ in range(3):
            work()
        if which not in ("dispatch", "eager-experts"):
            print("stats", f.stats())
        starts.clear()
        launches.clear()
        reps = max(1, n // per)
        t = time.perf_counter()
        if "--profile" in argv:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            for _ in range(reps):
                work()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
        else:
            for _ in range(reps):
                work()
        dt = (time.perf_counter() - t) / (reps * per)
        unit = {"dispatch": "op", "eager-experts": "step"}.get(which, "call")
        print(f"{which}: {dt * 1e6:.2f} us host per {unit} (fake driver)")
        if starts and len(launches) == len(starts):
            to_launch = np.median(np.subtract(launches, starts))
            print(f"{which}: {to_launch * 1e6:.2f} us from the call to its graph launch (median)")


if __name__ == "__main__":
    main(sys.argv[1:])
