"""The static memory plan of compiled functions: values share memory only when one is finished
before the other starts, along data dependencies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laneflow.graph.memory_plan import Value, happens_before, plan_memory


def test_a_chain_needs_two_regions_whatever_its_length():
    n = 20
    deps = [[]] + [[j - 1] for j in range(1, n)]
    values = {j: Value(1000, j, [j + 1] if j + 1 < n else []) for j in range(n)}
    plan = plan_memory(values, deps)
    assert len(plan.region_bytes) == 2
    assert plan.region_of[0] != plan.region_of[1] and plan.region_of[0] == plan.region_of[2]


def test_parallel_branches_never_share():
    # 0 -> (1, 2, 3 independent) -> 4 joins them
    deps = [[], [0], [0], [0], [1, 2, 3]]
    values = {0: Value(8, 0, [1, 2, 3]), 1: Value(8, 1, [4]), 2: Value(8, 2, [4]), 3: Value(8, 3, [4])}
    plan = plan_memory(values, deps)
    assert len({plan.region_of[v] for v in (1, 2, 3)}) == 3


def test_regions_grow_to_their_largest_value_and_prefer_a_fitting_one():
    deps = [[], [0], [1], [2]]
    values = {0: Value(100, 0, [1]), 1: Value(5000, 1, [2]), 2: Value(300, 2, [3])}
    plan = plan_memory(values, deps, align=1)
    assert plan.region_of[2] == plan.region_of[0] and plan.region_bytes[plan.region_of[0]] == 300


def test_steps_out_of_order_are_refused():
    with pytest.raises(ValueError, match="dependency order"):
        happens_before([[1], []])


@st.composite
def programs(draw):
    n = draw(st.integers(1, 25))
    deps, values = [], {}
    for j in range(n):
        ins = draw(st.lists(st.integers(0, max(j - 1, 0)), max_size=3, unique=True)) if j else []
        deps.append(sorted(ins))
        for i in ins:
            values[i].users.append(j)
        values[j] = Value(draw(st.integers(1, 4096)), j)
    return deps, values


def _closure(deps):
    before = [set() for _ in deps]
    for j, ds in enumerate(deps):
        for i in ds:
            before[j] |= before[i] | {i}
    return before


@settings(max_examples=300, deadline=None)
@given(programs())
def test_values_in_one_region_are_never_live_at_the_same_time(prog):
    deps, values = prog
    plan = plan_memory(values, deps)
    before = _closure(deps)

    def finished_before(a, b):
        return all(s in before[b.producer] for s in [a.producer, *a.users])

    by_region = {}
    for vid, r in plan.region_of.items():
        by_region.setdefault(r, []).append(values[vid])
    for members in by_region.values():
        for x in members:
            for y in members:
                if x is not y:
                    assert finished_before(x, y) or finished_before(y, x)
    for vid, r in plan.region_of.items():
        assert plan.region_bytes[r] >= values[vid].nbytes
    assert plan.arena_bytes <= sum(-(-v.nbytes // 256) * 256 for v in values.values())
