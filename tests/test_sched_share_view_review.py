"""Review of ``ClusterState.share_view`` (per-shape share slots kept row by row): the cases where it
answered differently from each GPU's own rule (``GpuState.fits_share`` / ``share_for``) or from the
code before it, each pinned here.

- ``ShareSlots.least_mapped(table, none)`` capped every node's answer at ``none`` (its reduction
  started from ``none``), so a table with values above ``none`` gave ``none`` for nodes where a
  slot fits; and a table shorter than ``MILLI + 1`` was read at its last entry for the remainders
  beyond it instead of being refused.
- A GPU booked below zero (a grant of no or negative milli recorded by ``book``, which records facts
  unconditionally) keeps more than ``MILLI`` free; ``least_left`` capped at ``MILLI + 1`` (its "none
  fits" value), so the GPU filter turned away a share the GPU's own rule takes, where the code
  before placed it.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core.filters import GpuFit
from scheduler.core.policies import ReserveThenAlign, ShareCompletionScore, make_policy
from scheduler.core.request import MILLI, PodRequest
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import Allocation, ClusterState, GpuGrant, GpuState, NodeState

SHARES = (
    PodRequest("m300", gpu_count=1, gpu_milli=300),
    PodRequest("m700", gpu_count=1, gpu_milli=700),
    PodRequest("mem8g", gpu_count=1, gpu_memory_mib=8_192),
    PodRequest("m200-mps", gpu_count=1, gpu_milli=200, enforced_share=True),
)


def cluster_of_mixed_gpus() -> ClusterState:
    """Nodes with free, partly used, unhealthy, enforcing and memoryless GPUs, and one with none."""
    nodes = [
        NodeState("a", 8_000, 64_000, [GpuState(0, "a0", "A100", 40_960), GpuState(1, "a1", "A100", 40_960)]),
        NodeState(
            "b",
            8_000,
            64_000,
            [GpuState(0, "b0", "T4", 0, share_enforced=True), GpuState(1, "b1", "T4", 16_384, healthy=False)],
        ),
        NodeState("c", 8_000, 64_000),
        NodeState("d", 8_000, 64_000, [GpuState(0, "d0", "H100", 81_920, share_enforced=True)]),
    ]
    return ClusterState(nodes)


def spec_least_mapped(cluster: ClusterState, pod: PodRequest, table: np.ndarray, none: int) -> list[int]:
    """Per node, the least ``table[free - share]`` over the GPUs whose own rule takes the share."""
    out = []
    for node in cluster.nodes:
        values = [int(table[g.free_milli - g.share_for(pod)[0]]) for g in node.gpus if g.fits_share(pod)]
        out.append(min(values, default=none))
    return out


@pytest.mark.parametrize("pod", SHARES, ids=lambda p: p.name)
@pytest.mark.parametrize("none", [MILLI + 1, 0, -1, 5])
def test_least_mapped_is_the_least_table_value_whatever_none_is(pod: PodRequest, none: int) -> None:
    cluster = cluster_of_mixed_gpus()
    tables = [np.arange(MILLI + 1, dtype=np.int64) + 2_000, (np.arange(MILLI + 1, dtype=np.int64) * 7) % 13]
    for step in range(3):
        view = cluster.share_view(pod)
        for table in tables:
            got = view.least_mapped(table, none).tolist()
            assert got == spec_least_mapped(cluster, pod, table, none), (pod.name, none, step)
        # change rows so that the next answers come from rows worked out again
        if step == 0:
            cluster.assume(Allocation("a", f"s{step}", gpus=(GpuGrant(0, "a0", 250, 10_240),)))
        elif step == 1:
            cluster.book(Allocation("d", f"s{step}", gpus=(GpuGrant(0, "d0", 900, 70_000),)))


def test_least_mapped_refuses_a_table_that_does_not_cover_every_remainder() -> None:
    cluster = cluster_of_mixed_gpus()
    view = cluster.share_view(SHARES[0])
    for short in (500, MILLI):
        with pytest.raises(ValueError, match="0..1000"):
            view.least_mapped(np.zeros(short, dtype=np.int64), MILLI + 1)
    assert view.least_mapped(np.zeros(MILLI + 1, dtype=np.int64), MILLI + 1).tolist() == [0, 0, MILLI + 1, 0]


def overbooked_below_zero() -> tuple[ClusterState, NodeState]:
    """A GPU whose booked grant takes negative milli: it keeps 1,500 free."""
    node = NodeState("a", 8_000, 64_000, [GpuState(0, "a0", "A100", 40_960, share_enforced=True)])
    cluster = ClusterState([node, NodeState("b", 8_000, 64_000)])
    cluster.book(Allocation("a", "odd", gpus=(GpuGrant(0, "a0", -500, 0),), gpu_tag="share-gpu"))
    assert node.gpus[0].free_milli == 1_500
    return cluster, node


@pytest.mark.parametrize("pod", SHARES, ids=lambda p: p.name)
def test_a_gpu_with_more_than_a_gpu_free_takes_what_its_own_rule_takes(pod: PodRequest) -> None:
    cluster, node = overbooked_below_zero()
    gpu = node.gpus[0]
    assert gpu.fits_share(pod)
    idx = cluster.all_indices
    assert GpuFit().keep(pod, cluster, idx).tolist() == [True, False]
    assert cluster.share_view(pod).least_left.tolist()[1] == MILLI + 1
    assert cluster.share_view(pod).least_left.tolist()[0] <= MILLI
    # the share policies score it as the code before did (a remainder above every band: nothing)
    completion, tie_break = ShareCompletionScore(110), ReserveThenAlign(0.2, None, 10)
    workload = [*SHARES, PodRequest("w1", gpu_count=1)]
    completion.bind(cluster, workload, random.Random(0))
    tie_break.bind(cluster, workload, random.Random(0))
    assert completion.score(pod, cluster, np.array([0])).tolist() == [0.0]
    left = gpu.free_milli - gpu.share_for(pod)[0]
    if pod.gpu_milli:
        waste = int(tie_break.waste[min(left, MILLI)])
        assert cluster.share_view(pod).least_mapped(tie_break.waste, MILLI + 1).tolist() == [waste, MILLI + 1]
    policy = make_policy("fgd-reserve")
    policy.bind(cluster, workload, random.Random(0))
    result = schedule_one(pod, cluster, policy, random.Random(0))
    assert isinstance(result, Placement) and result.node == "a"
    cluster.assume(result.allocation)
