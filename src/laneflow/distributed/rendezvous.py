"""Rank 0's bytes to every rank over TCP: the NCCL unique-id exchange of a torchrun-style launch.

The one home-made piece of transport in laneflow. Under an MPI launch the unique id goes through MPI's
broadcast instead. Rank 0 listens on ``MASTER_ADDR:port``, each other rank connects (retrying until the
deadline: rank 0 may start later), says who it is, and gets the payload once every rank has come. A
rank that does not come, a stranger, or a rank of another launch fails the exchange within the timeout
with a message naming what was missing.

The port: ``LANEFLOW_RDZV_PORT`` if set, else ``MASTER_PORT`` + 1 (torchrun's own store, or
``torch.distributed``'s, may hold ``MASTER_PORT`` itself).
"""

from __future__ import annotations

import socket
import struct
import time

from ..errors import LaneflowError

_MAGIC = b"LFRDZV1\0"
_HELLO = struct.Struct("!8sII32s")  # magic, rank, world size, key (padded)


class RendezvousError(LaneflowError):
    """The exchange did not complete: a rank missing, a stranger, a timeout. The message says which."""


def _key(key: str) -> bytes:
    raw = key.encode()[:32]
    return raw + b"\0" * (32 - len(raw))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        c = sock.recv(n - got)
        if not c:
            raise ConnectionError("the peer closed the connection")
        chunks.append(c)
        got += len(c)
    return b"".join(chunks)


def port(info, env=None) -> int:
    """The exchange's port for a launch: ``LANEFLOW_RDZV_PORT`` if set, else ``MASTER_PORT`` + 1."""
    import os
    raw = (os.environ if env is None else env).get("LANEFLOW_RDZV_PORT")
    if raw:
        try:
            return int(raw)
        except ValueError:
            raise RendezvousError(f"distributed rendezvous: LANEFLOW_RDZV_PORT={raw!r} is not a port number") from None
    if info.master_port is None:
        raise RendezvousError("distributed rendezvous: no MASTER_PORT in this launch; set LANEFLOW_RDZV_PORT "
                              "(the same free port on every rank)")
    return info.master_port + 1


def exchange(addr: str, port: int, rank: int, world_size: int, payload: bytes | None, *, key: str = "nccl",
             timeout: float = 300.0) -> bytes:
    """Rank 0 passes ``payload`` and gets it back; every other rank passes None and gets rank 0's.
    ``key`` tells exchanges of one launch apart (a communicator per device)."""
    if world_size == 1:
        if payload is None:
            raise ValueError("rendezvous.exchange: rank 0 must give the payload")
        return payload
    deadline = time.monotonic() + timeout
    if rank == 0:
        if payload is None:
            raise ValueError("rendezvous.exchange: rank 0 must give the payload")
        return _serve(addr, port, world_size, payload, _key(key), deadline, timeout)
    return _fetch(addr, port, rank, world_size, _key(key), deadline, timeout)


def _serve(addr, port, world_size, payload, key, deadline, timeout) -> bytes:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((addr, port))
    except OSError as e:
        srv.close()
        raise RendezvousError(f"distributed rendezvous: rank 0 cannot listen on {addr}:{port} ({e}); set "
                              "LANEFLOW_RDZV_PORT to a free port (the same on every rank)") from None
    srv.listen(world_size)
    peers: dict[int, socket.socket] = {}
    try:
        while len(peers) < world_size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, world_size)) - set(peers))
                raise RendezvousError(f"distributed rendezvous: ranks {missing} did not reach rank 0 at "
                                      f"{addr}:{port} within {timeout:g} s (did they start, with the same "
                                      "MASTER_ADDR and MASTER_PORT?)")
            srv.settimeout(min(left, 1.0))
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                magic, r, w, k = _HELLO.unpack(_recv_exact(conn, _HELLO.size))
            except (OSError, ConnectionError, struct.error):
                conn.close()
                continue  # a stranger or a port scan: not one of ours
            if magic != _MAGIC or k != key:
                conn.close()
                continue
            if w != world_size or not 0 < r < world_size or r in peers:
                conn.close()
                raise RendezvousError(f"distributed rendezvous: rank 0 (world size {world_size}) was reached by "
                                      f"rank {r} of world size {w}: the ranks disagree on WORLD_SIZE or RANK")
            peers[r] = conn
        msg = struct.pack("!I", len(payload)) + payload
        for conn in peers.values():
            conn.sendall(msg)
        return payload
    finally:
        for conn in peers.values():
            conn.close()
        srv.close()


def _fetch(addr, port, rank, world_size, key, deadline, timeout) -> bytes:
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RendezvousError(f"distributed rendezvous: rank {rank} could not get the id from rank 0 at "
                                  f"{addr}:{port} within {timeout:g} s (is rank 0 running, and is "
                                  "MASTER_ADDR its address?)")
        try:
            conn = socket.create_connection((addr, port), timeout=min(left, 5.0))
        except OSError:
            time.sleep(min(delay, max(left, 0)))
            delay = min(delay * 2, 1.0)
            continue
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            conn.sendall(_HELLO.pack(_MAGIC, rank, world_size, key))
            (n,) = struct.unpack("!I", _recv_exact(conn, 4))
            return _recv_exact(conn, n)
        except socket.timeout:
            raise RendezvousError(f"distributed rendezvous: rank {rank} reached rank 0 at {addr}:{port}, but not "
                                  f"every rank did within {timeout:g} s") from None
        except (OSError, ConnectionError):
            time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 1.0)
        finally:
            conn.close()
