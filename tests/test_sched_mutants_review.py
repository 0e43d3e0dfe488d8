"""Mutants the 2026-11-28 re-measure counted as equivalent and a hostile review told apart:
``ReserveThenAlign``'s constructor defaults (a public contract: tests build it with them), the
placements a gang's search returns (``place_on``'s score 0.0 on 1 feasible node) and
``_search_fewest``'s budget, which decides the plan when the search needs more than half of
``SEARCH_BUDGET`` (docs/testing.md)."""

import random

import numpy as np

from scheduler.core import Allocation, ClusterState, GpuGrant, GpuState, NodeState, PodRequest, make_policy
from scheduler.core.gang import GroupRequest, schedule_group
from scheduler.core.policies import ReserveThenAlign


def test_reserve_then_align_defaults() -> None:
    tie = ReserveThenAlign()
    assert tie.step == 0.2
    assert tie.waste_band == 0
    assert tie.reserve.adaptive is False
    assert tie.balance is None
    assert tie.cpu_bound_exact is False


def test_default_step_bands_the_alignment_in_fifths() -> None:
    """With the default step (0.2) a CPU-only pod's cosine is banded: 1.0 on a node without GPUs
    (band 5), 0.707 on an idle GPU node (band 3)."""
    cluster = ClusterState(
        [NodeState("cpu", 64_000, 64_000), NodeState("gpu", 64_000, 64_000, [GpuState(0, "gpu-g0", "A")])]
    )
    tie = ReserveThenAlign()
    tie.bind(cluster, [], random.Random(0))
    assert tie.score(PodRequest("c", cpu_milli=1000), cluster, np.arange(2)).tolist() == [5.0, 3.0]


# per node (20 nodes of 8 GPUs, 64 CPUs): the GPUs already taken by single-GPU pods
TAKEN = {
    0: [3, 6],
    1: [0, 1, 2, 4, 5, 6, 7],
    2: [0, 1, 3, 5, 7],
    3: [0, 2, 4, 5, 6],
    4: [1, 7],
    5: [0, 1, 2, 3, 4, 5, 7],
    6: [0, 1, 2, 3, 5, 6, 7],
    7: [0, 1, 2, 3, 4, 7],
    8: [1, 6, 7],
    9: [0, 1, 2, 3, 4, 5, 6],
    10: [1, 2, 3, 4, 5, 6, 7],
    11: [0, 2, 4, 6, 7],
    12: [6],
    13: [2, 3, 4],
    14: [1, 2, 3, 4, 5, 6, 7],
    15: [3],
    16: [2, 3, 4, 5, 7],
    17: [1],
    18: [1, 2],
    19: [1, 3, 4, 5, 6, 7],
}
SIZES = [3, 3, 3, 5, 5, 5, 2, 2, 5, 5, 3]  # the gang's members, whole GPUs each


def _plan():
    nodes = [
        NodeState(f"n{i}", 64000, 256000, [GpuState(j, f"n{i}-g{j}", "A") for j in range(8)]) for i in TAKEN
    ]
    cluster = ClusterState(nodes)
    policy = make_policy("fgd-reserve")
    policy.bind(cluster, [], random.Random(0))
    for i, taken in TAKEN.items():
        for j in taken:
            grant = GpuGrant(j, nodes[i].gpus[j].id, 1000, 0)
            cluster.assume(Allocation(nodes[i].name, f"f{i}-{j}", cpu_milli=0, gpus=(grant,)))
    members = tuple(PodRequest(f"m{j}", uid=f"m{j}", gpu_count=k) for j, k in enumerate(SIZES))
    return schedule_group(GroupRequest("g", len(SIZES), members, None), cluster, policy, random.Random(125))


def test_the_fewest_nodes_search_finds_a_7_node_plan_within_its_budget() -> None:
    assert len(_plan().nodes) == 7


def test_the_search_placements_are_place_on_s_score_0_on_1_node() -> None:
    """Every placement of this plan comes from the search (``place_on``): score 0.0, 1 feasible node."""
    assert {(p.score, p.feasible) for p in _plan().placements} == {(0.0, 1)}
