"""A fake of nccl4py's low-level bindings (``nccl.bindings.nccl``) for the fake CUDA driver: every call
is logged in ``CALLS`` as (name, args) and moves nothing. ``install()`` makes ``lf.distributed``'s NCCL
transport use it (call after ``fake_cuda.install()``), so the transport's host logic (which call, which
count, dtype, reduction and stream, the watchdog, capture into graphs) runs on machines without a GPU.
``ASYNC_ERROR`` is what ``comm_get_async_error`` reports (set it to fail the communicator)."""

from __future__ import annotations

CALLS: list = []
ASYNC_ERROR = 0


class UniqueId(bytearray):
    @staticmethod
    def from_buffer(buf) -> "UniqueId":
        return UniqueId(buf)


class FakeNCCL:
    UniqueId = UniqueId

    @staticmethod
    def get_version() -> int:
        return 22803

    @staticmethod
    def get_unique_id() -> UniqueId:
        return UniqueId(b"\1" * 128)

    @staticmethod
    def comm_init_rank(nranks, uid, rank):
        CALLS.append(("comm_init_rank", (nranks, list(uid[:4]), rank)))
        return 0xC0

    @staticmethod
    def comm_get_async_error(comm) -> int:
        return ASYNC_ERROR

    def __getattr__(self, name):  # all_reduce, all_gather, reduce_scatter, broadcast, send, recv,
        def call(*args):          # comm_abort, comm_destroy: logged
            CALLS.append((name, args))
        return call


def install() -> FakeNCCL:
    from laneflow.backends.cuda import driver  # noqa: F401 - the fake driver is installed
    from laneflow.distributed import nccl
    import fake_cuda

    nccl.cu = fake_cuda.FakeDriver() if not isinstance(nccl.cu, fake_cuda.FakeDriver) else nccl.cu
    nccl._lib = FakeNCCL()
    return nccl._lib
