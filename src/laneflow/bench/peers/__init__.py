"""Peers: the same workloads through PyTorch, JAX, CuPy, MLX (and numpy on the CPU), in this process.

Each peer is one small module that imports its framework lazily and offers, per workload kind, a
function ``kind(case, device, lanes) -> list[Impl]`` (kinds: dispatch, experts, branches, kernels,
fences, handles). ``check(device)`` raises :class:`PeerUnavailable` with a one-line reason when the
framework is not importable or cannot use the device; the harness then reports the peer as skipped.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: Peers in the order they are shown.
PEERS = ("torch", "jax", "cupy", "mlx", "numpy")


class PeerUnavailable(Exception):
    """The peer cannot run here (not installed, no GPU, no such dtype...)."""


def load(name: str) -> ModuleType:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")
    return importlib.import_module(f"{__name__}.{name}_peer")


def require(module: str, what: str | None = None) -> ModuleType:
    """Import a framework or raise PeerUnavailable('not installed')."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise PeerUnavailable(f"{what or module} not installed ({e.name or e})") from None
    except Exception as e:  # noqa: BLE001 - a broken install is also "not usable"
        raise PeerUnavailable(f"{what or module} failed to import: {str(e)[:120]}") from None
