"""The floor of GPT-2 small's eager Python: the same forward (models/gpt2.py) over stub arrays whose ops only
make an object with a shape. What any eager op layer, however cheap, adds to; issue 15's cache-hit target
is measured against it (docs/perf/HISTORY.md section 21).

    python tools/gpt2_python_floor.py
"""
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from laneflow.models import gpt2

class S:
    __slots__ = ("shape",)
    def __init__(self, shape): self.shape = shape
    def reshape(self, *s): return S(s[0] if len(s) == 1 and isinstance(s[0], tuple) else s)
    def transpose(self, *p): return S(tuple(self.shape[i] for i in p))
    def swapaxes(self, a, b): return S(self.shape)
    def __matmul__(self, o): return S(self.shape[:-1] + o.shape[-1:])
    def __add__(self, o): return S(self.shape)
    __radd__ = __mul__ = __rmul__ = __sub__ = __add__
    def __getitem__(self, k): return S(self.shape)
    @property
    def T(self): return S(self.shape[::-1])

ops = gpt2.Ops(lambda w, ids: S(ids.shape + (w.shape[1],)), lambda x, w, b, e: S(x.shape), lambda t: None,
               lambda q, k, v, s, m: S(q.shape), lambda x: S(x.shape))
cfg = gpt2.GPT2Config()
params = {k: S(v) for k, v in gpt2.param_shapes(cfg).items()}
ids = S((1, 16))
for _ in range(50): gpt2.forward(params, ids, cfg, ops)
t = time.perf_counter()
for _ in range(500): gpt2.forward(params, ids, cfg, ops)
print(f"GPT-2 small forward over stub arrays: {(time.perf_counter() - t) / 500 * 1e6:.0f} us")
