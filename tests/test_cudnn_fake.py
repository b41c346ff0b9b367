"""The cuDNN attention path's host side under the fake driver and a fake cuDNN frontend
(``tests/doubles/fake_cudnn.py``): one handle per device bound to the lane's stream, one graph per
spec, raw pointers and a pool workspace per call, graph-owned workspace inside a CUDA-graph capture, the
causal alignment keywords, and a refused spec cached and sent to the NVRTC kernel. Values are garbage
(nothing runs); what is checked is what laneflow asks of cuDNN. In a subprocess, as test_fake_gpu.py."""

from __future__ import annotations

import pytest
from conftest import run_under_fake_driver

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed (pip install -e '.[dev]')")

_SCRIPT = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
import fake_cuda, fake_cudnn
fake_cuda.install()
fake_cudnn.install()
import numpy as np
import laneflow as lf
import laneflow.graph.plan as P
from laneflow.backends.cuda import cudnn_attention as C
P.GRAPH_MODE = "strict"
os.environ["LANEFLOW_ATTENTION"] = "cudnn"
CALLS = fake_cudnn.CALLS
bf = lf.bfloat16

def arrs(*shapes):
    return [lf.array(np.zeros(s, bf)) for s in shapes]

def of(kind):
    return [c[1] for c in CALLS if c[0] == kind]

s = lf.new_stream(lf.gpu, lanes=1)
lane = s.lanes[0]
with lf.stream(s):
    q, k, v = arrs((1, 12, 16, 64), (1, 12, 16, 64), (1, 12, 16, 64))
    for _ in range(3):
        lf.eval(lf.nn.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert of("create_handle") == [of("create_handle")[0]], CALLS          # one handle per device
    assert len(of("pygraph")) == 1 and of("pygraph") == ["BFLOAT16"], CALLS  # one graph per spec
    (sd,) = of("sdpa")
    assert sd["use_causal_mask"] is True and "diagonal_alignment" not in sd, sd   # square: top-left
    assert sd["q"] == ([1, 12, 16, 64], [12288, 1024, 64, 1]) and sd["attn_scale"] == 0.125, sd
    ex = [c for c in CALLS if c[0] == "execute"]
    assert len(ex) == 3 and all(e[1] == lane.handle for e in ex), (ex, lane.handle)
    assert len({e[2] for e in ex}) == 1                                    # the lane's pool workspace
    assert lf.cuda.attention_stats()["cudnn"] == 3
    ws = lf.cuda.handle_stats()["workspace_bytes"]["cudnn"]
    assert ws >= 4096, lf.cuda.handle_stats()

    # bottom-right alignment for Tq < Tk; no mask at all for a decode step
    q2, k2 = arrs((1, 2, 8, 64), (1, 2, 40, 64))
    lf.eval(lf.nn.scaled_dot_product_attention(q2, k2, k2, is_causal=True))
    assert of("sdpa")[-1]["diagonal_alignment"] == "BOTTOM_RIGHT" and of("sdpa")[-1]["diagonal_band_right_bound"] == 0
    assert "use_causal_mask" not in of("sdpa")[-1]
    q3, = arrs((1, 2, 1, 64))
    lf.eval(lf.nn.scaled_dot_product_attention(q3, k2, k2, is_causal=True))
    assert not ({"use_causal_mask", "diagonal_alignment"} & set(of("sdpa")[-1])), of("sdpa")[-1]

    # a spec cuDNN refuses: NVRTC runs it, and the refusal is cached (built once)
    fake_cudnn.REFUSE.add((24, 24))
    q4, = arrs((1, 2, 24, 64))
    lf.cuda.reset_attention_stats()
    n = len(of("pygraph"))
    for _ in range(2):
        lf.eval(lf.nn.scaled_dot_product_attention(q4, q4, q4))
    st = lf.cuda.attention_stats()
    assert len(of("pygraph")) == n + 1 and st["nvrtc"] == 2 and st["cudnn"] == 0, (st, CALLS[-3:])
    assert all("fake cuDNN refuses" in r for r in st["fallbacks"]), st

    # inside lf.compile: the first call builds (eager), the capture executes on a capture lane with a
    # workspace the graph owns, replays make no cuDNN call
    f = lf.compile(lambda q, k, v: lf.nn.scaled_dot_product_attention(q, k, v, is_causal=True) * 2.0)
    n_ex = len(of("execute"))
    for _ in range(4):
        lf.eval(f(q, k, v))
    (fs,) = f.stats()
    assert fs["mode"] == "cuda graph" and fs["captures"] == 1, fs
    ex = [c for c in CALLS if c[0] == "execute"][n_ex:]
    assert len(ex) == 2 and ex[0][1] == lane.handle and ex[1][1] != lane.handle, ex
    assert ex[1][2] and ex[1][2] != ex[0][2], ex                           # graph-owned workspace
    assert of("create_handle") == [of("create_handle")[0]]                 # still one handle

    # LANEFLOW_CUDNN_CAPTURE=0: the capture runs the NVRTC kernel
    os.environ["LANEFLOW_CUDNN_CAPTURE"] = "0"
    g = lf.compile(lambda q, k, v: lf.nn.scaled_dot_product_attention(q, k, v, is_causal=True) + 1.0)
    n_ex = len(of("execute"))
    for _ in range(3):
        lf.eval(g(q, k, v))
    assert g.stats()[0]["mode"] == "cuda graph" and len(of("execute")) == n_ex + 1  # the eager call only
print("OK")
'''


def test_cudnn_path_host_side_under_fake_driver_and_frontend(tmp_path):
    r = run_under_fake_driver(_SCRIPT, tmp_path, timeout=240)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
