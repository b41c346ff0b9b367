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


def contiguous_strides(shape: tuple) -> tuple:
    st = []
    acc = 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def is_contiguous(shape: tuple, strides: tuple) -> bool:
    """Row-major contiguous, ignoring size-1 dims (their stride never moves the address)."""
    acc = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if s == 0:
            return True
        if s != 1:
            if st != acc:
                return False
            acc *= s
    return True


def basic_index_view(shape: tuple, strides: tuple, offset: int, entries: tuple) -> tuple:
    """(shape, strides, offset) of a view indexed by ints, slices and None (Ellipsis expanded)."""
    out_shape, out_strides = [], []
    d = 0
    for e in entries:
        if e is None:
            out_shape.append(1)
            out_strides.append(0)
        elif e.__class__ is slice:
            start, stop, step = e.indices(shape[d])
            n = len(range(start, stop, step))
            out_shape.append(n)
            out_strides.append(strides[d] * step)
            if n:
                offset += start * strides[d]
            d += 1
        else:
            i = int(e)
            if i < 0:
                i += shape[d]
            offset += i * strides[d]
            d += 1
    out_shape.extend(shape[d:])
    out_strides.extend(strides[d:])
    return tuple(out_shape), tuple(out_strides), offset
