"""lf.nn.scaled_dot_product_attention: one flash-style NVRTC kernel, scores never stored.

One warp per query row (four rows per block; grid (rows / 4, Hq, B)); with few query rows (a decode
step) a block of eight warps per row, which split its keys and merge their states at the end. The warp holds the scaled
query in shared memory and walks the visible keys 32 at a time: lane j scores key j (its dot product
with the query, then the mask), the warp takes the chunk's maximum and sum with shuffles, rescales its
running output (online softmax: running max ``m``, running sum ``l``) and adds the chunk's weighted
values, each lane owning ``Dv / 32`` output columns. Scores, weights and the output accumulate in
float32 (float64 for float64). A query that sees no key writes zeros.

q, k, v and the mask are read through any element strides (``StridedArray``: the heads of a fused
QKV projection, ``x.reshape(b, t, h, d).transpose(0, 2, 1, 3)``, need no copy); a mask dimension of
size 1 is broadcast. Grouped-query attention maps query head h to key/value head ``h // group``.

This is the kernel for the short sequences of GPT-2-sized models and for decode steps (Tq = 1); it
reads each key row once per query row, so long prefills (thousands of tokens) are far from cuDNN's
fused attention there (docs/cuda-notes.md).
"""

from __future__ import annotations

from ....dtypes import float64
from ....shapes import contiguous_strides
from . import cdefs as C

_WARPS = 4
#: Split mode (few query rows: a decode step, Tq = 1): one block of _SPLIT warps per query row, warp w
#: walking key chunks w, w + _SPLIT, ..., and the warps' (max, sum, output) states merged in shared
#: memory at the end. With one warp per row a GPT-2 decode step's 12 rows walked 256 keys each in
#: series: 58 us a call on the H200 (tools/op_times.py decode-nn, 2026-12-04).
_SPLIT = 8
#: Query rows (B x Hq x Tq) below which a launch splits the keys; over it, rows fill the GPU as they are.
_SPLIT_ROWS_PER_SM = 2


def _build(dt, mask_dt, mask: str | None, causal: bool, D: int, Dv: int, split: int = 1):
    """Kernel source; ``split`` > 1: that many warps share one query row's keys (split mode)."""
    W = "double" if dt == float64 else "float"
    T = C.storage(dt)
    dpl, vpl = max(1, -(-D // 32)), max(1, -(-Dv // 32))
    sig = [f"{T}* __restrict__ out", f"const {T}* __restrict__ q", f"const {T}* __restrict__ k",
           f"const {T}* __restrict__ v"]
    codes = "pppp"
    if mask is not None:
        sig.append(f"const {C.storage(mask_dt)}* __restrict__ msk")
        codes += "p"
    sig += ["long long Hq", "long long Tq", "long long Tk", "long long group"]
    sig += [f"long long {t}{a}" for t in "qkvm" for a in "bhtd"]
    sig.append(f"{W} scale")
    codes += "qqqq" + "q" * 16 + ("d" if W == "double" else "f")
    ld = lambda e, d: f"(({W}){C.load(e, d)})"  # noqa: E731
    score = ""
    if mask == "bool":
        score = "        if (!msk[mb_ + j * md]) s = -INFINITY;\n"
    elif mask == "additive":
        score = f"        s += {ld('msk[mb_ + j * md]', mask_dt)};\n"
    jmax = "(Tk < i + Tk - Tq + 1 ? Tk : i + Tk - Tq + 1)" if causal else "Tk"
    nw = split if split > 1 else _WARPS
    first, stride = ("w * 32", f"{32 * split}") if split > 1 else ("0", "32")
    src = f"""
extern "C" __global__ void __launch_bounds__({nw * 32}) lf_attn({", ".join(sig)}) {{
  __shared__ {W} qs[{nw}][{dpl * 32}];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const long long i = {"blockIdx.x" if split > 1 else f"(long long)blockIdx.x * {_WARPS} + w"};
  if (i >= Tq) return;
  const long long h = blockIdx.y, b = blockIdx.z, kh = h / group;
  const {T}* qr = q + b * qb + h * qh + i * qt;
  #pragma unroll
  for (int t = 0; t < {dpl}; ++t) {{ int d = lane + 32 * t; qs[w][d] = d < {D} ? {ld('qr[d * qd]', dt)} * scale : ({W})0; }}
  __syncwarp();
  const {T}* kbase = k + b * kb + kh * kh_;
  const {T}* vbase = v + b * vb + kh * vh;
  const long long mb_ = {"b * mb + h * mh + i * mt" if mask is not None else "0"};
  const long long jmax = {jmax};
  {W} m = -INFINITY, l = 0, acc[{vpl}];
  #pragma unroll
  for (int t = 0; t < {vpl}; ++t) acc[t] = 0;
  for (long long j0 = {first}; j0 < jmax; j0 += {stride}) {{
    const long long j = j0 + lane;
    {W} s = -INFINITY;
    if (j < jmax) {{
      const {T}* kr = kbase + j * kt;
      {W} dot = 0;
      #pragma unroll 16
      for (int d = 0; d < {D}; ++d) dot += qs[w][d] * {ld('kr[d * kd]', dt)};
      s = dot;
{score}    }}
    {W} cm = s;
    for (int o_ = 16; o_ > 0; o_ >>= 1) {{ {W} t_ = __shfl_xor_sync(0xffffffffu, cm, o_); cm = t_ > cm ? t_ : cm; }}
    const {W} nm = cm > m ? cm : m;
    if (nm == -INFINITY) continue;
    const {W} p = s == -INFINITY ? ({W})0 : lf_exp(s - nm);
    const {W} corr = m == -INFINITY ? ({W})0 : lf_exp(m - nm);
    {W} ps = p;
    for (int o_ = 16; o_ > 0; o_ >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o_);
    l = l * corr + ps;
    #pragma unroll
    for (int t = 0; t < {vpl}; ++t) acc[t] *= corr;
    const int cnt = jmax - j0 < 32 ? (int)(jmax - j0) : 32;
    for (int jj = 0; jj < cnt; ++jj) {{
      const {W} pj = __shfl_sync(0xffffffffu, p, jj);
      const {T}* vr = vbase + (j0 + jj) * vt;
      #pragma unroll
      for (int t = 0; t < {vpl}; ++t) {{ int d = lane + 32 * t; if (d < {Dv}) acc[t] += pj * {ld('vr[d * vd]', dt)}; }}
    }}
    m = nm;
  }}
  {T}* orow = out + ((b * Hq + h) * Tq + i) * {Dv};
{_merge(W, vpl, split) if split > 1 else ""}  #pragma unroll
  for (int t = 0; t < {vpl}; ++t) {{ int d = lane + 32 * t; if (d < {Dv}) orow[d] = {C.store(f"(l > 0 ? acc[t] / l : ({W})0)", dt)}; }}
}}
"""
    # (k's head stride is named kh_ in the body: kh is the key/value head index)
    src = src.replace("long long kh,", "long long kh_,", 1)
    return src, "lf_attn", codes


def _merge(W: str, vpl: int, split: int) -> str:
    """Split mode's end: every warp's (max, sum, output) into shared memory; warp 0 rescales each to the
    common maximum and adds them up (a warp that saw no visible key has max -inf and adds nothing)."""
    return f"""  __shared__ {W} sm_[{split}], sl_[{split}], sa_[{split}][{vpl * 32}];
  if (lane == 0) {{ sm_[w] = m; sl_[w] = l; }}
  #pragma unroll
  for (int t = 0; t < {vpl}; ++t) sa_[w][lane + 32 * t] = acc[t];
  __syncthreads();
  if (w != 0) return;
  {W} M = -INFINITY;
  for (int u = 0; u < {split}; ++u) M = sm_[u] > M ? sm_[u] : M;
  l = 0;
  #pragma unroll
  for (int t = 0; t < {vpl}; ++t) acc[t] = 0;
  for (int u = 0; u < {split}; ++u) {{
    if (sm_[u] == -INFINITY) continue;
    const {W} c_ = lf_exp(sm_[u] - M);
    l += sl_[u] * c_;
    #pragma unroll
    for (int t = 0; t < {vpl}; ++t) acc[t] += sa_[u][lane + 32 * t] * c_;
  }}
"""


def _strides(x) -> tuple:
    """Element strides of a 4-D input (a view's own, or contiguous), 0 along size-1 dimensions."""
    st = getattr(x, "strides", None)
    if st is None:
        st = contiguous_strides(x.shape)
    return tuple(0 if n == 1 else s for n, s in zip(x.shape, st))


def attention(lane, prim, ins, outs) -> None:
    q, k, v = ins[:3]
    out = outs[0]
    if out.size == 0:
        return
    B, Hq, Tq, D = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    m = ins[3] if prim.mask is not None else None
    ctx = lane.ctx
    split = _SPLIT if B * Hq * Tq < _SPLIT_ROWS_PER_SM * ctx.sm_count and Tk > 32 else 1
    spec = ("attn", q.dtype, None if m is None else m.dtype, prim.mask, prim.causal, D, Dv, split)
    kern = ctx.modules.get(spec, lambda: _build(q.dtype, None if m is None else m.dtype, prim.mask, prim.causal,
                                                D, Dv, split))
    ms = _strides(m) if m is not None else (0, 0, 0, 0)
    args = [out.ptr, q.ptr, k.ptr, v.ptr] + ([m.ptr] if m is not None else [])
    args += [Hq, Tq, Tk, Hq // Hkv, *_strides(q), *_strides(k), *_strides(v), *ms, prim.scale]
    if split > 1:
        kern.launch(lane.handle, (Tq, Hq, B), (split * 32, 1, 1), tuple(args))
    else:
        kern.launch(lane.handle, (-(-Tq // _WARPS), Hq, B), (_WARPS * 32, 1, 1), tuple(args))
