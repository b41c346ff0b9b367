"""The suites; importing this package registers them in :data:`laneflow.bench.harness.SUITES`."""

from . import branches, decode, dispatch, distributed, experts, fences, gpt2, handles, kernels, replay  # noqa: F401

#: The order ``bench all`` runs them in.
ORDER = ("dispatch", "experts", "replay", "branches", "kernels", "handles", "fences", "gpt2", "decode", "distributed")
