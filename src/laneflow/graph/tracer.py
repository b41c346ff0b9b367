"""The state of an ``lf.compile`` trace in progress, per host thread.

``lf.compile`` (``laneflow/jit.py``) runs a function on :class:`Placeholder` arrays; while it does,
arrays note their creation here, so that assigning into an array the function did not create (an
argument, a captured array) is refused, and host reads of a placeholder say what to do. This module
sits below ``array.py``, which calls it on every new array and every rebinding.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import CompileError
from .node import Primitive

_state = threading.local()

#: How many traces run right now, in any thread. Arrays note their creation only while one runs, so
#: outside compile this costs one global read per array.
ACTIVE = [0]


class Placeholder(Primitive):
    """An argument of a function being traced: has a shape and dtype, never a value."""

    kind = "placeholder"

    def __init__(self, index: int, fn_name: str):
        super().__init__(f"argument {index}")
        self.index, self.fn_name = index, fn_name

    def error(self) -> CompileError:
        return CompileError(f"compile: {self.fn_name} needs the value of {self.name} while being traced (a host read "
                            "such as item(), tolist(), np.asarray() or lf.eval inside the function); move it out of "
                            "the compiled function or pass the value as a static (non-array) argument")


def tracing() -> bool:
    """Whether this thread is tracing a function for ``lf.compile``."""
    return getattr(_state, "depth", 0) > 0


class Trace:
    """One trace on this thread (a context manager): the function's name, its parameters by id, and
    the arrays created while it runs."""

    def __init__(self, fn_name: str, params: list):
        self.fn_name = fn_name
        self.params = {id(p): i for i, p in enumerate(params)}

    def __enter__(self) -> "Trace":
        _state.created, _state.fn_name, _state.params = set(), self.fn_name, self.params
        _state.depth = getattr(_state, "depth", 0) + 1
        ACTIVE[0] += 1
        return self

    def __exit__(self, *exc: object) -> None:
        ACTIVE[0] -= 1
        _state.depth -= 1
        _state.created = _state.params = None


def note_created(array: Any) -> None:
    created = getattr(_state, "created", None)
    if created is not None:
        created.add(id(array))


def check_rebind(array: Any) -> None:
    """Refuse ``x[...] = v`` / ``x += v`` inside a traced function on an array it did not create."""
    created = getattr(_state, "created", None)
    if created is None or id(array) in created:
        return
    name = _state.fn_name
    i = _state.params.get(id(array))
    if i is not None:
        raise CompileError(f"compile: {name} assigns into its argument {i} (x[...] = v); compiled functions "
                           "cannot change their arguments: return the new value instead")
    raise CompileError(f"compile: {name} assigns into an array it did not create (a captured array: x[...] = v "
                       "or x += v); that change would happen once, while tracing, not on every call: pass the "
                       "array as an argument and return its new value")
