"""Test hooks for users and laneflow's own tests."""

from .runtime.delays import inject_delays  # noqa: F401
