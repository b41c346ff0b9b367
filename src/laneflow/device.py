"""Devices: ``lf.cpu``, ``lf.gpu`` (index 0) and ``lf.Device("gpu", 1)``."""

from __future__ import annotations

from typing import Any

_TYPES = ("cpu", "gpu")


class Device:
    """A place where buffers live and commands run. Devices compare by (type, index).

    ``Device("gpu", i)`` is the i-th GPU this process sees (``CUDA_VISIBLE_DEVICES`` picks and orders
    them). An op on one device using an array of another gets a copy to its device, run on its own
    stream after a device-side fence (between GPUs a peer copy; no host wait). A GPU index past the
    visible ones is refused at its first use (an op, ``new_stream``, ``set_default_device``) with a
    ValueError naming the op, the index, the count and ``CUDA_VISIBLE_DEVICES``."""

    __slots__ = ("type", "index", "_hash")

    def __new__(cls, type: str, index: int = 0, *args: Any, **kwargs: Any) -> "Device":
        # One object per device: ``Device("gpu", 0)``, ``"gpu"`` and ``lf.gpu`` are the same object, so the
        # hot paths' identity checks (``x.device is stream.device``, in Python and in C) hold without
        # calling __eq__ (a Python call each: several an op where a stream was made from a string).
        if type not in _TYPES:
            raise ValueError(f"Device: unknown device type {type!r}; expected one of {_TYPES}")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"Device: index must be a non-negative int, got {index!r}")
        if type == "cpu" and index != 0:
            raise ValueError(f"Device: there is one cpu device (index 0), got index {index}")
        index = int(index)  # (an int subclass keys as its value)
        if cls is not Device:  # a subclass may hold state or take arguments of its own: an object a call, as
            return _made(object.__new__(cls), type, index)  # before (it compares equal, by __eq__)
        if args or kwargs:
            raise TypeError(f"Device() takes a type and an index, got {len(args)} more argument(s)"
                            f"{' and ' + ', '.join(kwargs) if kwargs else ''}")
        d = _DEVICES.get((type, index))
        if d is None:
            d = _DEVICES.setdefault((type, index), _made(object.__new__(cls), type, index))  # (two threads: one)
        return d

    def __init__(self, type: str, index: int = 0, *args: Any, **kwargs: Any) -> None:
        pass  # (made in __new__; here so that a subclass's ``super().__init__(type, index)`` still works)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Device is immutable")

    def __reduce__(self):
        return (Device, (self.type, self.index))

    def __eq__(self, other: object) -> bool:
        return other is self or (isinstance(other, Device) and other.type == self.type and other.index == self.index)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Device({self.type!r}, {self.index})"

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"


def _made(d: Device, type: str, index: int) -> Device:
    object.__setattr__(d, "type", type)
    object.__setattr__(d, "index", index)
    object.__setattr__(d, "_hash", hash((type, index)))  # devices key hot dicts (compile caches)
    return d


_DEVICES: dict = {}  # (type, index) -> the one Device
cpu = Device("cpu", 0)
gpu = Device("gpu", 0)


def as_device(obj: Any, what: str = "device") -> Device:
    """Accept a Device or a string such as ``"cpu"``, ``"gpu"``, ``"gpu:1"``."""
    if isinstance(obj, Device):
        return obj
    if isinstance(obj, str):
        t, _, i = obj.partition(":")
        try:
            return Device(t, int(i) if i else 0)
        except ValueError as e:
            raise ValueError(f"{what}: {e}") from None
    raise TypeError(f"{what}: expected a Device (lf.cpu, lf.gpu) or a string like 'gpu:0', got {type(obj).__name__}")
