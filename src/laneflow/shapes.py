"""Shape rules shared by op construction and the backends' kernels, in pure Python (no laneflow
imports: any layer may use them)."""

from __future__ import annotations


def broadcast_shapes(shapes: list) -> tuple:
    """numpy's broadcasting of shapes (ValueError when they do not broadcast), without numpy: the
    all-equal case at once, other combinations remembered (a model repeats a few)."""
    first = shapes[0]
    for s in shapes:
        if s != first:
            key = tuple(shapes)
            r = _BROADCAST.get(key)
            if r is None:
                r = _broadcast(key)
                if len(_BROADCAST) < 4096:
                    _BROADCAST[key] = r
            return r
    return first


_BROADCAST: dict = {}


def _broadcast(shapes: tuple) -> tuple:
    nd = max(len(s) for s in shapes)
    out = []
    for k in range(-nd, 0):
        size = 1
        for s in shapes:
            if len(s) >= -k:
                d = s[k]
                if d != 1:
                    if size != 1 and d != size:
                        raise ValueError(f"shapes {', '.join(map(str, shapes))} cannot be broadcast together")
                    size = d
        out.append(size)
    return tuple(out)
