"""Library handles (cuBLAS, cuBLASLt, cuSOLVER...) shared per device, with a workspace per lane.

The question this answers: should a handle belong to a stream or to a device? A cuBLAS handle holds
64 MiB of device memory and a cuSOLVER handle 96 MiB on an H200, so one handle per stream multiplies
memory by the number of streams. The policies:

- ``device`` (default): one handle per device. Before a use, the handle is bound to the caller's lane
  and that lane's workspace only when they differ from what is bound, under a lock held only while
  the call is enqueued. Two lanes never share a workspace, so they never race on one. A library whose
  handle has device-side state of its own that no per-lane workspace covers (cuSOLVER: its internal
  cuBLAS handle; one cuSOLVER handle run on two streams at once gives run-to-run different results)
  declares ``exclusive``: when its handle moves to another lane, the pool has the new lane wait, on the
  device, for the work the previous lane has queued (:meth:`HandleLibrary.hand_over`), so the calls of
  one handle never overlap and the host never waits.
- ``thread``: one handle per device per host thread (PyTorch's design).
- ``stream``: one handle per lane (JAX's design).

Select with ``lf.cuda.set_handle_policy(name)`` or the environment variable ``LANEFLOW_HANDLE_POLICY``
(read at the first use, and again whenever :func:`handle_policy` or :func:`set_handle_policy` is called).
The ``device`` policy may keep a few handles of one library per device instead of one
(:func:`set_handles_per_device`, ``LANEFLOW_CUSOLVERDN_HANDLES=2``): for cuSOLVER, whose shared handle runs
one call at a time, that many solver calls can overlap, for that many times the handle memory.
A backend supplies a :class:`HandleLibrary` adapter per library; this module knows no CUDA.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter
from typing import Any, Protocol

POLICIES = ("device", "thread", "stream")
_policy: str | None = None
_env_policy: str | None = None  # LANEFLOW_HANDLE_POLICY as last read (the hot path reads no environment)
_pools: "weakref.WeakSet[HandlePool]" = weakref.WeakSet()  # their lane -> entry caches are dropped then
_pools_lock = threading.Lock()  # guards _pools and _changes
_changes = 0  # policy changes so far: an entry looked up across one is not cached


def _policy_changed() -> None:
    """The policy in force may have changed: pools look their lanes' entries up afresh."""
    global _changes
    with _pools_lock:
        _changes += 1
        pools = list(_pools)
    for pool in pools:
        pool._fast.clear()


def handle_policy() -> str:
    """The policy in force: set by :func:`set_handle_policy`, else ``LANEFLOW_HANDLE_POLICY``, else device."""
    global _env_policy
    if _policy is not None:
        return _policy
    env = os.environ.get("LANEFLOW_HANDLE_POLICY", "device")
    if env not in POLICIES:
        raise ValueError(f"LANEFLOW_HANDLE_POLICY must be one of {POLICIES}, got {env!r}")
    if env != _env_policy:
        _env_policy = env
        _policy_changed()
    return env


def set_handle_policy(policy: str | None) -> None:
    """Choose how library handles are shared (``None`` returns to the environment/default)."""
    global _policy, _env_policy
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"set_handle_policy: policy must be one of {POLICIES}, got {policy!r}")
    _policy = policy
    _env_policy = None
    _policy_changed()


_per_device: dict[str, int] = {}  # library name -> handles per device under the device policy (set)


def handles_per_device(library: str) -> int:
    """How many handles of ``library`` the ``device`` policy keeps per device (default 1): set by
    :func:`set_handles_per_device`, else ``LANEFLOW_<LIBRARY>_HANDLES`` (e.g. ``LANEFLOW_CUSOLVERDN_HANDLES``,
    read when a pool is made or the setting changes)."""
    n = _per_device.get(library)
    if n is None:
        env = f"LANEFLOW_{library.upper()}_HANDLES"
        raw = os.environ.get(env, "1")
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{env} must be a whole number >= 1, got {raw!r}")
    return n


def set_handles_per_device(library: str, count: int | None) -> None:
    """Keep ``count`` handles of ``library`` per device under the ``device`` policy (``None``: back to the
    environment/default of 1). Lane ``i`` of every stream uses handle ``i % count``. For an ``exclusive``
    library (cuSOLVER), whose handle runs one call at a time, this is the number of solver calls that
    can overlap, for ``count`` times the handle memory; pools made before keep their handles until the
    setting changes (then every pool looks its handles up afresh)."""
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise ValueError(f"set_handles_per_device: count must be an int >= 1 or None, got {count!r}")
    if count is None:
        _per_device.pop(library, None)
    else:
        _per_device[library] = count
    with _pools_lock:
        pools = list(_pools)
    for pool in pools:
        if pool.library.name == library:
            pool.per_device = handles_per_device(library)
    _policy_changed()


def _policy_now() -> str:
    p = _policy
    if p is None:
        p = _env_policy
        if p is None:
            p = handle_policy()
    return p


class HandleLibrary(Protocol):
    """What a backend implements for one library.

    Optional: ``free_workspace(lane, workspace)`` (needed when a caller asks for a larger workspace
    with ``use(lane, need=...)``, and by :meth:`HandlePool.close`), ``handle_bytes_how``
    ("measured" or "estimate", shown by :func:`handle_stats`), and for an ``exclusive`` library
    ``hand_over(order, previous_lane, lane) -> order`` and ``end_order(order)``: ``order`` is the
    library's own per-handle state (None at first); ``hand_over`` makes ``lane`` wait on the device
    for what ``previous_lane`` has queued (either may be None: a lane going away records, the next
    lane waits).
    """

    name: str
    #: True when the library keeps a stream inside the handle (cuBLAS, cuSOLVER); False when the
    #: stream is passed per call (cuBLASLt), so no set-stream is ever needed.
    binds_stream: bool
    #: True when calls of one handle must not overlap on the device, whatever their workspaces.
    exclusive: bool = False

    def create(self, device: Any) -> Any: ...

    def destroy(self, handle: Any) -> None: ...

    def set_stream(self, handle: Any, lane: Any) -> None: ...

    def workspace_bytes(self, device: Any) -> int: ...

    def allocate_workspace(self, lane: Any, nbytes: int) -> Any: ...

    def set_workspace(self, handle: Any, workspace: Any, nbytes: int) -> None: ...

    def handle_bytes(self, device: Any) -> int: ...


class HandleStats:
    __slots__ = (
        "by_library",
        "created",
        "destroyed",
        "handle_bytes",
        "handle_bytes_how",
        "stream_bound",
        "workspace_bytes",
        "workspaces",
    )

    def __init__(self) -> None:
        self.created: Counter = Counter()
        self.destroyed: Counter = Counter()
        self.handle_bytes: Counter = Counter()
        self.handle_bytes_how: dict = {}
        self.workspace_bytes: Counter = Counter()
        self.workspaces: Counter = Counter()
        self.by_library: dict = {}  # name -> [set-stream issued, elided, workspace binds]
        self.stream_bound: dict = {}  # name -> whether the library keeps a stream in its handles

    def counters(self, name: str, binds_stream: bool) -> list:
        c = self.by_library.get(name)
        if c is None:
            c = self.by_library[name] = [0, 0, 0]
            self.stream_bound[name] = binds_stream
        return c

    def snapshot(self) -> dict[str, Any]:
        libs = {k: {"set_stream_issued": v[0], "set_stream_elided": v[1] if self.stream_bound[k] else 0,
                    "workspace_binds": v[2]} for k, v in self.by_library.items()}
        return {
            "handles_created": dict(self.created),
            "handles_live": {k: v - self.destroyed[k] for k, v in self.created.items()},
            "handle_bytes": dict(self.handle_bytes),
            "handle_bytes_how": dict(self.handle_bytes_how),
            "workspace_bytes": dict(self.workspace_bytes),
            "workspaces": dict(self.workspaces),
            "set_stream_issued": sum(v["set_stream_issued"] for v in libs.values()),
            "set_stream_elided": sum(v["set_stream_elided"] for v in libs.values()),
            "workspace_binds": sum(v["workspace_binds"] for v in libs.values()),
            "by_library": libs,
        }


STATS = HandleStats()


class _Entry:
    """One handle. Also the context manager :meth:`HandlePool.use` returns (a class, not a generator:
    it keeps the pool's host cost per call to a lock and a few attribute reads)."""

    __slots__ = ("counters", "current", "handle", "lane", "lock", "nbytes", "order", "ready", "ready_size",
                 "sizes", "workspace", "workspaces")

    def __init__(self, handle: Any, nbytes: int, counters: list):
        self.handle = handle
        self.nbytes = nbytes       # device bytes the handle holds (counted in the stats)
        self.lock = threading.Lock()
        self.lane = None           # the lane the handle's stream is bound to
        self.workspace = None      # the workspace bound to the handle
        self.workspaces: dict = {}  # lane -> its workspace (kept while the pool lives: graphs may use it)
        self.sizes: dict = {}      # lane -> bytes of its workspace
        self.current: tuple = (handle, None)
        self.counters = counters
        self.ready = None          # the lane the handle is fully bound to (stream and workspace)
        self.ready_size = 0        # bytes of that lane's workspace
        self.order = None          # an exclusive library's hand-over state (its event)

    def __enter__(self) -> tuple[Any, Any]:
        return self.current

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.lock.release()


class HandlePool:
    """Handles of one library, keyed by the policy in force at each use."""

    def __init__(self, library: HandleLibrary, policy: str | None = None):
        """``policy``: this pool's own, fixed policy (None: the one in force at each use)."""
        if policy is not None and policy not in POLICIES:
            raise ValueError(f"HandlePool: policy must be one of {POLICIES} or None, got {policy!r}")
        self.library = library
        self.policy = policy
        self._entries: dict = {}
        self._lock = threading.Lock()
        self._counters = STATS.counters(library.name, library.binds_stream)
        self._fast: dict = {}  # lane -> entry, for the device and stream policies (cleared on a policy change)
        self._exclusive = bool(getattr(library, "exclusive", False))
        #: handles per device under the device policy (lane i uses handle i % per_device)
        self.per_device = handles_per_device(library.name)
        with _pools_lock:
            _pools.add(self)

    def _key(self, lane: Any, policy: str) -> tuple:
        if policy == "device":
            n = self.per_device
            return ("device", lane.device) if n == 1 else ("device", lane.device, lane.index % n)
        if policy == "thread":
            return ("thread", lane.device, threading.get_ident())
        return ("stream", lane.id)

    def _entry(self, lane: Any) -> _Entry:
        changes = _changes
        policy = self.policy or _policy_now()
        key = self._key(lane, policy)
        e = self._entries.get(key)
        if e is None:
            with self._lock:
                e = self._entries.get(key)
                if e is None:
                    lib = self.library
                    h = lib.create(lane.device)
                    e = _Entry(h, lib.handle_bytes(lane.device), self._counters)
                    self._entries[key] = e
                    STATS.created[lib.name] += 1
                    STATS.handle_bytes[lib.name] += e.nbytes
                    STATS.handle_bytes_how[lib.name] = getattr(lib, "handle_bytes_how", "estimate")
        if policy != "thread":
            with _pools_lock:
                if _changes == changes:  # else the policy changed meanwhile: look it up again next time
                    self._fast[lane] = e
        return e

    def use(self, lane: Any, need: int = 0) -> _Entry:
        """``with pool.use(lane) as (handle, workspace):`` enqueue one library call on ``lane``.

        The handle is bound to the lane's stream and the lane's own workspace (at least ``need``
        bytes; a smaller one is replaced, in the lane's stream order) and stays locked until the
        ``with`` block ends, so no other thread rebinds it while the call is enqueued. When the
        handle is already bound to this lane, a use costs a dict lookup and the lock.

        Hot paths may skip the ``with`` protocol (two Python-level calls): ``e = pool.use(lane)``,
        then ``handle, workspace = e.current`` and ``e.lock.release()`` in a ``finally``.
        """
        e = self._fast.get(lane)
        if e is None:
            e = self._entry(lane)
        e.lock.acquire()
        if e.ready is lane and need <= e.ready_size:
            e.counters[1] += 1  # set-stream (and workspace bind) elided
            return e
        try:
            self._bind(e, lane, need)
        except BaseException:
            e.lock.release()
            raise
        return e

    def _bind(self, e: _Entry, lane: Any, need: int) -> None:
        lib = self.library
        e.ready = None
        ws = e.workspaces.get(lane)
        if ws is None or (need and e.sizes[lane] < need):
            ws = self._grow(e, lane, ws, need)
        if lib.binds_stream:
            if e.lane is not lane:
                if self._exclusive and (e.lane is not None or e.order is not None):
                    e.order = lib.hand_over(e.order, e.lane, lane)
                lib.set_stream(e.handle, lane)
                e.counters[0] += 1
                e.lane = lane
                e.workspace = None  # cublasSetStream resets the workspace: bind it again
            else:
                e.counters[1] += 1
        if ws is not None and e.workspace is not ws:
            lib.set_workspace(e.handle, ws, e.sizes[lane])
            e.counters[2] += 1
            e.workspace = ws
        e.current = (e.handle, ws)
        e.ready = lane
        e.ready_size = e.sizes.get(lane, 0)

    def _grow(self, e: _Entry, lane: Any, old: Any, need: int) -> Any:
        lib = self.library
        nbytes = lib.workspace_bytes(lane.device)
        if need > nbytes:
            nbytes = max(need, 2 * e.sizes.get(lane, 0))  # grow geometrically: few replacements
        if not nbytes:
            return None
        ws = lib.allocate_workspace(lane, nbytes)
        if old is not None:
            lib.free_workspace(lane, old)  # ordered on the lane: its earlier calls finish first
            STATS.workspace_bytes[lib.name] -= e.sizes[lane]
            STATS.workspaces[lib.name] -= 1
            if e.workspace is old:
                e.workspace = None
        e.workspaces[lane] = ws
        e.sizes[lane] = nbytes
        STATS.workspace_bytes[lib.name] += nbytes
        STATS.workspaces[lib.name] += 1
        return ws

    def handles(self) -> int:
        return len(self._entries)

    def workspace_bytes(self) -> int:
        """Device bytes this pool's workspaces hold now."""
        return sum(sum(e.sizes.values()) for e in list(self._entries.values()))

    def forget_lane(self, lane: Any, free_workspace: Any) -> None:
        """A lane is going away: free its workspaces (``free_workspace(ws)``, ordered on that lane by the
        caller) and destroy a handle that belonged to it alone (the ``stream`` policy)."""
        lib = self.library
        with self._lock:
            self._fast.pop(lane, None)
            for key, e in list(self._entries.items()):
                own = key == ("stream", lane.id)  # a handle of this lane alone: destroyed below
                with e.lock:
                    if e.ready is lane:
                        e.ready = None
                    ws = e.workspaces.pop(lane, None)
                    if ws is not None:
                        free_workspace(ws)
                        STATS.workspace_bytes[lib.name] -= e.sizes.pop(lane)
                        STATS.workspaces[lib.name] -= 1
                        if e.workspace is ws:
                            e.workspace = None
                    if e.lane is lane:
                        if self._exclusive and not own:  # its queued calls still run: the next lane waits
                            e.order = lib.hand_over(e.order, lane, None)
                        e.lane = None
                if own:
                    del self._entries[key]
                    if e.order is not None:
                        lib.end_order(e.order)
                    lib.destroy(e.handle)
                    STATS.destroyed[lib.name] += 1
                    STATS.handle_bytes[lib.name] -= e.nbytes

    def close(self, free_workspaces: bool = False) -> None:
        """Destroy every handle (after the device work using them has finished); with
        ``free_workspaces`` also free every workspace through ``library.free_workspace``."""
        lib = self.library
        with self._lock:
            self._fast.clear()
            for e in self._entries.values():
                with e.lock:
                    e.ready = None
                    if free_workspaces:
                        for lane, ws in e.workspaces.items():
                            lib.free_workspace(lane, ws)
                            STATS.workspace_bytes[lib.name] -= e.sizes[lane]
                            STATS.workspaces[lib.name] -= 1
                        e.workspaces.clear()
                        e.sizes.clear()
                    if e.order is not None:
                        lib.end_order(e.order)
                        e.order = None
                    lib.destroy(e.handle)
                    STATS.destroyed[lib.name] += 1
                    STATS.handle_bytes[lib.name] -= e.nbytes
            self._entries.clear()


def handle_stats() -> dict[str, Any]:
    """Handles created and live per library, device bytes held by handles (measured or estimated, see
    ``handle_bytes_how``) and by workspaces, and the set-stream calls issued and elided, in total and
    per library (``lf.cuda.handle_stats()``)."""
    return STATS.snapshot()


def reset_handle_stats() -> None:
    """Zero the set-stream counters (handles and bytes still held keep being counted)."""
    for c in STATS.by_library.values():
        c[0] = c[1] = c[2] = 0
