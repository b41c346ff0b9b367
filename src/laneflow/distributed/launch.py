"""Who am I in a multi-process launch: rank, world size and local rank from the launchers' conventions.

Read in this order (the first launcher whose variables are set wins):

- torchrun (and ``torch.distributed.launch``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
- Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``;
- MPICH's ``mpiexec`` (Hydra; the ``mpich`` wheel of the ``distributed`` extra): ``PMI_RANK``,
  ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``;
- Slurm's ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``.

None of them: one process, rank 0 of 1.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

#: (launcher, rank, size, local rank, local size) variable names, in the order they are tried
CONVENTIONS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)
#: launchers that start processes under MPI (mpi4py's communicator spans them)
MPI_LAUNCHERS = frozenset(("openmpi", "mpich"))


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place in the launch. ``launcher`` is "torchrun", "openmpi", "mpich", "slurm" or
    "none"; ``master_addr``/``master_port`` are torchrun's rendezvous point (None elsewhere)."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def under_mpi(self) -> bool:
        """Whether an MPI launcher started this process (MPI's communicator then spans the launch)."""
        return self.launcher in MPI_LAUNCHERS


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"distributed.init: environment variable {name} is not set")
        return default
    try:
        return int(raw.split("(")[0].split(",")[0])  # Slurm writes "2(x3)" and "2,1" per node
    except ValueError:
        raise ValueError(f"distributed.init: environment variable {name}={raw!r} is not an integer") from None


def detect(env: Mapping[str, str] | None = None) -> LaunchInfo:
    """The launch this process belongs to, from ``env`` (default ``os.environ``). Raises ValueError,
    naming the variable, when a launcher's variables are malformed or inconsistent."""
    env = os.environ if env is None else env
    for launcher, r, s, lr, ls in CONVENTIONS:
        if r not in env or s not in env:
            continue
        rank, size = _int(env, r), _int(env, s)
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"distributed.init: {r}={rank} and {s}={size} do not describe a rank of the launch "
                             f"(need 0 <= {r} < {s})")
        local = _int(env, lr, rank if size == 1 else 0) if lr in env else (rank if launcher != "slurm" else 0)
        local_size = _int(env, ls, size) if ls in env else size
        addr = port = None
        if launcher == "torchrun":
            addr = env.get("MASTER_ADDR") or None
            if env.get("MASTER_PORT"):
                port = _int(env, "MASTER_PORT")
                if not 0 < port < 65536:
                    raise ValueError(f"distributed.init: MASTER_PORT={port} is not a TCP port")
            if size > 1 and (addr is None or port is None):
                raise ValueError("distributed.init: torchrun-style launch (RANK, WORLD_SIZE set) without "
                                 "MASTER_ADDR and MASTER_PORT; set both to rank 0's address and a free port")
        return LaunchInfo(launcher, rank, size, local, local_size, addr, port)
    return LaunchInfo("none", 0, 1, 0, 1)
