"""A stand-in for ``nvidia-cudnn-frontend`` (``import cudnn``) with the calls laneflow makes, recording them,
so the cuDNN attention path's host logic (handles, stream binding, graph cache, workspaces, capture)
runs under the fake driver (``fake_cuda.py``). Nothing is computed. Only the API of the H200 probe
(``anchors/probe_cudnn_sdpa.py``) and the causal-alignment keywords are modelled.

    import fake_cuda, fake_cudnn; fake_cuda.install(); fake_cudnn.install()
"""

from __future__ import annotations

import itertools
import sys

CALLS: list = []        # (what, details) in call order
REFUSE: set = set()     # (Tq, Tk) shapes whose check_support raises, as cuDNN refusing a graph
_ids = itertools.count(1)


class _Enum:
    def __init__(self, *names):
        for n in names:
            setattr(self, n, n)


data_type = _Enum("BFLOAT16", "HALF", "FLOAT")
heur_mode = _Enum("A", "FALLBACK")
diagonal_alignment = _Enum("TOP_LEFT", "BOTTOM_RIGHT")
__version__ = "fake"


class Handle:
    def __init__(self):
        self.id, self.stream = next(_ids), None


def backend_version():
    return 91900


def create_handle():
    h = Handle()
    CALLS.append(("create_handle", h.id))
    return h


def destroy_handle(h):
    CALLS.append(("destroy_handle", h.id))


def set_stream(handle, stream):
    handle.stream = stream
    CALLS.append(("set_stream", stream))


class _Tensor:
    def __init__(self, name, dim=None, stride=None, data_type=None):
        self.name, self.dim, self.stride, self.data_type = name, dim, stride, data_type

    def set_output(self, v):
        return self

    def set_dim(self, d):
        self.dim = d
        return self

    def set_stride(self, s):
        self.stride = s
        return self

    def set_data_type(self, t):
        self.data_type = t
        return self


class pygraph:
    def __init__(self, io_data_type, intermediate_data_type, compute_data_type, handle):
        self.io, self.shape = io_data_type, None
        CALLS.append(("pygraph", io_data_type))

    def tensor(self, name, dim, stride, data_type):
        return _Tensor(name, dim, stride, data_type)

    def sdpa(self, name, q, k, v, is_inference, attn_scale, **mask):
        self.shape = (q.dim[2], k.dim[2])
        CALLS.append(("sdpa", dict(mask, q=(q.dim, q.stride), k=(k.dim, k.stride), attn_scale=attn_scale)))
        return [_Tensor("o"), None]

    def validate(self):
        pass

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, modes):
        pass

    def check_support(self):
        if self.shape in REFUSE:
            raise RuntimeError(f"fake cuDNN refuses Tq, Tk = {self.shape}")

    def build_plans(self):
        pass

    def get_workspace_size(self):
        return 4096

    def execute(self, pack, workspace, handle):
        assert all(type(p) is int for p in pack.values()) and type(workspace) is int, (pack, workspace)
        CALLS.append(("execute", handle.stream, workspace))


def install() -> None:
    """Make ``import cudnn`` this module and let laneflow's cuDNN path load it."""
    sys.modules["cudnn"] = sys.modules[__name__]
    from laneflow.backends.cuda import cudnn_attention as C

    C.DISABLED, C._loaded, C._frontend, C._why_not = None, False, None, None

