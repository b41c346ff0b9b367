"""Backends: each implements :class:`laneflow.runtime.backend.Backend` for one device family."""
