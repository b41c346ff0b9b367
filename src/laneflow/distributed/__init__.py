"""``lf.distributed``: collectives between processes (and GPUs) as lazy ops on a communication lane.

>>> import laneflow as lf
>>> g = lf.distributed.init()                  # reads torchrun's or mpirun's variables
>>> total = lf.distributed.all_reduce(x)       # issued now; runs beside the compute lanes

``init()`` reads the launcher's conventions (``launch.py``): torchrun's ``RANK``/``WORLD_SIZE``/
``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT``, Open MPI's ``OMPI_COMM_WORLD_*``, MPICH's ``PMI_*``,
Slurm's ``SLURM_*``. Without a launcher it is one process, rank 0 of 1, and every collective is a copy.

Transports: CPU arrays go through MPI (mpi4py; ``pip install 'laneflow[distributed]'`` brings it and
the MPICH wheel, whose ``mpiexec`` launches the processes). GPU arrays go through NCCL (nccl4py's
bindings, ``pip install 'laneflow[nccl]'``; ``nccl.py``), one communicator per group and GPU, with a
watchdog that aborts it when a collective outlives the timeout. Collectives are issued when called, in call order, on one communication lane per group and
device (``group.py`` says why); every rank must call the same collectives with the same shapes and
dtypes in the same order, which each collective checks before it runs (``signature.py``), failing with
:class:`DistributedError` naming both calls. A collective that waits for a peer longer than
``timeout`` (default 300 s, ``LANEFLOW_DIST_TIMEOUT``) fails the same way, and the group is broken.
"""

from __future__ import annotations

import os
from typing import Mapping

from ..runtime.backend import backend_for
from . import _state
from .group import DistributedError, Group
from .launch import LaunchInfo, detect
from .ops import all_gather, all_reduce, barrier, broadcast, recv, reduce_scatter, send
from .rendezvous import RendezvousError

BACKENDS = ("auto", "mpi", "local")
GPU_BACKENDS = ("auto", "nccl", "local")


def init(backend: str = "auto", *, gpu: str = "auto", timeout: float | None = None, check: bool = True,
         env: Mapping[str, str] | None = None) -> Group:
    """The world group of this launch, made on the first call (later calls return it).

    ``backend``: "auto" (MPI when an MPI launcher started this process, else a group of one),
    "mpi" (MPI even without a launcher's variables: a singleton MPI process is rank 0 of 1) or
    "local" (one process). ``gpu``: what moves GPU arrays: "auto" (NCCL when the group has more than
    one rank, copies in a group of one), "nccl" (NCCL even in a group of one: one process on one GPU
    exercises the whole path) or "local" (a group of one only). ``timeout``: seconds a collective waits for the other ranks before it fails
    (default ``LANEFLOW_DIST_TIMEOUT`` or 300). ``check``: before each collective the ranks compare
    what they were asked (a small gather: one more round trip per collective; ``check=False`` or
    ``LANEFLOW_DIST_CHECK=0`` skips it, and ranks that disagree then exchange wrong data or time out).
    ``env``: the variables to read (default os.environ).
    """
    if _state.WORLD is not None:
        return _state.WORLD
    if backend not in BACKENDS:
        raise ValueError(f"distributed.init: backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if timeout is None:
        raw = os.environ.get("LANEFLOW_DIST_TIMEOUT", "300")
        try:
            timeout = float(raw)
        except ValueError:
            raise ValueError(f"distributed.init: LANEFLOW_DIST_TIMEOUT={raw!r} is not a number of seconds") from None
    if not timeout > 0:
        raise ValueError(f"distributed.init: timeout must be positive seconds, got {timeout!r}")
    if gpu not in GPU_BACKENDS:
        raise ValueError(f"distributed.init: gpu must be one of {', '.join(map(repr, GPU_BACKENDS))}, got {gpu!r}")
    info = detect(env)
    use_mpi = backend == "mpi" or (backend == "auto" and info.under_mpi)
    if use_mpi and info.launcher == "none":
        from .mpi import world
        c = world().COMM_WORLD
        info = LaunchInfo("mpi", c.Get_rank(), c.Get_size(), c.Get_rank(), c.Get_size())
    if backend == "local" and info.world_size != 1:
        raise DistributedError(f"distributed.init: backend 'local' is one process, but the {info.launcher} launch "
                               f"has {info.world_size} ranks; use backend='auto'")
    group = Group(info, timeout, "mpi" if use_mpi else "local")
    group.check = bool(check) and os.environ.get("LANEFLOW_DIST_CHECK", "1") != "0"
    if gpu == "local" and info.world_size != 1:
        raise DistributedError(f"distributed.init: gpu='local' is one process, but the {info.launcher} launch "
                               f"has {info.world_size} ranks; use gpu='auto' (NCCL)")
    side = None
    if use_mpi:
        from .mpi import MPITransport
        group.transports["cpu"] = MPITransport(group)
        side = group.transports["cpu"].comm.Dup()  # NCCL's unique ids and signatures, apart from the CPU lane's calls
    elif info.world_size == 1:
        group.makers["cpu"] = _local
    if gpu == "nccl" or (gpu == "auto" and info.world_size > 1):
        group.makers["gpu"] = lambda dev: _nccl(group, dev, side)
    else:
        group.makers["gpu"] = _local
    _state.WORLD = group
    return group


def _local(dev):
    from .transports import LocalTransport
    return LocalTransport(backend_for(dev))


def _nccl(group: Group, dev, side):
    from .nccl import NCCLTransport
    return NCCLTransport(group, dev, side)


def is_initialized() -> bool:
    """Whether :func:`init` has made the world group."""
    return _state.WORLD is not None


def world() -> Group:
    """The world group (raises when :func:`init` was not called)."""
    if _state.WORLD is None:
        raise DistributedError("lf.distributed.init() has not been called in this process")
    return _state.WORLD


def get_rank() -> int:
    """This process's rank in the world group."""
    return world().rank


def get_world_size() -> int:
    """The number of ranks in the world group."""
    return world().size


def destroy() -> None:
    """Finish pending collectives, release the world group; :func:`init` may be called again."""
    g, _state.WORLD = _state.WORLD, None
    if g is not None:
        g.destroy()


__all__ = ["init", "destroy", "is_initialized", "world", "get_rank", "get_world_size", "Group", "LaunchInfo",
           "DistributedError", "RendezvousError", "detect", "all_reduce", "all_gather", "reduce_scatter",
           "broadcast", "send", "recv", "barrier"]
