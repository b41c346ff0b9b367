"""Static memory plan for a compiled function's intermediates.

Each intermediate value of a plan gets a *region*; two values share a region only when every use of
the earlier one happens before the later one is produced, along the plan's data dependencies. Data
dependencies are exactly what the encoder turns into waits, so values that share a region can never
be live on two lanes at the same time, whatever lanes the steps land on (the rule issue 5 asks for:
no two branches that can run at the same time hold both). Values returned to the caller are left out:
they get fresh memory so they stay valid after the next call.

The plan is backend-neutral: a backend turns regions into memory once (an arena) and hands each step
views of it. Region reuse across calls is ordered by the encoder because every region is one buffer
with one hazard state.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Value:
    """An intermediate: its size, the step that produces it and the steps that read it."""

    nbytes: int
    producer: int
    users: list[int] = field(default_factory=list)


@dataclass
class MemoryPlan:
    region_of: dict[int, int]        # value id -> region index
    region_bytes: list[int]          # size of each region

    @property
    def arena_bytes(self) -> int:
        return sum(self.region_bytes)


def happens_before(deps: list[list[int]]) -> list[int]:
    """For each step, a bitset (int) of the steps that must finish before it starts."""
    reach: list[int] = []
    for j, ds in enumerate(deps):
        r = 0
        for i in ds:
            if i >= j:
                raise ValueError(f"step {j} depends on a later step {i}: steps must be in dependency order")
            r |= reach[i] | (1 << i)
        reach.append(r)
    return reach


def plan_memory(values: dict[int, Value], deps: list[list[int]], align: int = 256) -> MemoryPlan:
    """Assign values to regions, first fit in production order, sharing only when it is safe."""
    reach = happens_before(deps)
    touched: list[int] = []  # per region: bitset of the steps that produce or read any of its values
    sizes: list[int] = []
    region_of: dict[int, int] = {}
    for vid in sorted(values, key=lambda v: (values[v].producer, v)):
        v = values[vid]
        need = -(-max(v.nbytes, 1) // align) * align
        # a region is free for v when every step touching its values happens before v's producer
        outside = ~reach[v.producer]
        fits = [k for k, t in enumerate(touched) if not t & outside]
        big = [k for k in fits if sizes[k] >= need]
        if big:
            chosen = min(big, key=lambda k: sizes[k])      # the smallest free region that is large enough
        elif fits:
            chosen = max(fits, key=lambda k: sizes[k])     # else grow the largest free one
        else:
            touched.append(0)
            sizes.append(0)
            chosen = len(touched) - 1
        bits = 1 << v.producer
        for u in v.users:
            bits |= 1 << u
        touched[chosen] |= bits
        sizes[chosen] = max(sizes[chosen], need)
        region_of[vid] = chosen
    return MemoryPlan(region_of, sizes)
