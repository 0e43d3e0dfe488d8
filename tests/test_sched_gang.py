"""The scheduling core's gang planner (scheduler/core/gang.py): whole or nothing, fewest nodes,
one topology domain, elastic extras, and the cluster left as it was."""

from __future__ import annotations

import random

import pytest

from scheduler.core import ClusterState, GpuState, NodeState, PodRequest, make_policy
from scheduler.core.gang import (
    MAX_DOMAINS,
    GroupPlacement,
    GroupRequest,
    GroupUnschedulable,
    member_order,
    schedule_group,
)
from scheduler.core.schedule import Placement

ZONE = "topology.kubernetes.io/zone"
RACK = "example.com/rack"


def node(
    name: str, gpus: int = 8, zone: str | None = None, rack: str | None = None, cpu: int = 64_000
) -> NodeState:
    labels = {"kubernetes.io/hostname": name}
    if zone:
        labels[ZONE] = zone
    if rack:
        labels[RACK] = rack
    return NodeState(name, cpu, 512_000, [GpuState(i, f"{name}-g{i}", "H100", 81920) for i in range(gpus)],
                     labels=labels)


def members(group: str, count: int, gpus: int, cpu: int = 1000) -> tuple[PodRequest, ...]:
    return tuple(PodRequest(f"ml/{group}-{i}", uid=f"{group}-{i}", cpu_milli=cpu, gpu_count=gpus)
                 for i in range(count))


def plan(
    group: GroupRequest, cluster: ClusterState, policy: str = "topology"
) -> GroupPlacement | GroupUnschedulable:
    chosen = make_policy(policy)
    chosen.bind(cluster, list(group.members), random.Random(0))
    return schedule_group(group, cluster, chosen, random.Random(1))


def snapshot(cluster: ClusterState) -> tuple:
    return (
        dict(cluster.where),
        cluster.gpu_free.tolist(),
        cluster.cpu_free.tolist(),
        cluster.allocated_gpu_milli(),
    )


def assume_all(cluster: ClusterState, result: GroupPlacement) -> None:
    for placement in result.placements:
        cluster.assume(placement.allocation)


def test_a_group_that_fits_only_across_two_nodes_gets_both_and_the_cluster_is_untouched() -> None:
    cluster = ClusterState([node("n1"), node("n2")])
    before = snapshot(cluster)
    result = plan(GroupRequest("ml/train", 2, members("w", 2, 8)), cluster)
    assert isinstance(result, GroupPlacement)
    assert sorted(result.nodes) == ["n1", "n2"]
    assert snapshot(cluster) == before  # the planner undid its assumptions
    assume_all(cluster, result)  # and its allocations are consistent with each other
    assert cluster.gpu_free.sum() == 0


def test_nothing_is_placed_when_the_minimum_does_not_fit_and_the_reason_names_the_member() -> None:
    cluster = ClusterState([node("n1"), node("n2", gpus=4)])
    before = snapshot(cluster)
    result = plan(GroupRequest("ml/train", 2, members("w", 2, 8)), cluster)
    assert isinstance(result, GroupUnschedulable)
    assert (result.placed, result.blocked) == (1, "ml/w-1")
    assert result.message().startswith("pod group ml/train: only 1 of its 2 minimum members fit together")
    assert "0/2 nodes are available" in result.message()
    assert snapshot(cluster) == before


def test_a_group_waits_for_members_that_do_not_exist_yet() -> None:
    result = plan(GroupRequest("ml/train", 4, members("w", 3, 1)), ClusterState([node("n1")]))
    assert isinstance(result, GroupUnschedulable)
    assert result.message() == "pod group ml/train has 3 of its 4 minimum members; waiting for the others"


def test_members_share_nodes_before_they_spread() -> None:
    """Four 2-GPU members on four empty 8-GPU nodes: one node, not four."""
    cluster = ClusterState([node(f"n{i}") for i in range(4)])
    result = plan(GroupRequest("ml/train", 4, members("w", 4, 2)), cluster, policy="spread")
    assert isinstance(result, GroupPlacement)
    assert len(result.nodes) == 1


def test_a_group_stays_inside_one_zone_when_one_holds_it() -> None:
    # three 4-GPU members: zone a has 8 GPUs free (two half-used nodes), zone b 12 (8 + 4)
    cluster = ClusterState([node("a1", zone="a"), node("a2", zone="a"), node("b1", zone="b"),
                            node("b2", gpus=4, zone="b")])
    for n in ("a1", "a2"):
        cluster.assume(plan_one(cluster, f"busy-{n}", 4, n))
    result = plan(GroupRequest("ml/train", 3, members("w", 3, 4)), cluster)
    assert isinstance(result, GroupPlacement)
    assert result.domain == "b" and sorted(result.nodes) == ["b1", "b2"]
    # with zone b's small node gone the group fits in no zone: all nodes, the fewest of them
    cluster = ClusterState([node("a1", zone="a"), node("a2", zone="a"), node("b1", zone="b")])
    for n in ("a1", "a2"):
        cluster.assume(plan_one(cluster, f"busy-{n}", 4, n))
    result = plan(GroupRequest("ml/train", 3, members("w", 3, 4)), cluster)
    assert isinstance(result, GroupPlacement)
    assert result.domain is None and len(result.nodes) == 2 and "b1" in result.nodes


def plan_one(cluster: ClusterState, uid: str, gpus: int, on: str):  # noqa: ANN201
    from scheduler.core.allocate import allocate

    alloc = allocate(PodRequest(uid, uid=uid, gpu_count=gpus), cluster.node(on))
    assert alloc is not None
    return alloc


def test_the_plan_on_fewer_nodes_wins_between_domains() -> None:
    # zone a holds the group on two nodes (4 + 4), zone b on one node (8)
    small = [node(f"a{i}", gpus=4, zone="a") for i in (1, 2, 3)]
    cluster = ClusterState([*small, node("b1", gpus=8, zone="b")])
    result = plan(GroupRequest("ml/train", 2, members("w", 2, 4)), cluster)
    assert isinstance(result, GroupPlacement)
    assert result.nodes == ("b1",) and result.domain == "b"


def test_a_group_too_big_for_any_zone_is_planned_over_the_cluster() -> None:
    cluster = ClusterState([node("a1", zone="a"), node("b1", zone="b")])
    result = plan(GroupRequest("ml/train", 2, members("w", 2, 8)), cluster)
    assert isinstance(result, GroupPlacement)
    assert result.domain is None and sorted(result.nodes) == ["a1", "b1"]


def test_another_domain_label_can_be_chosen() -> None:
    cluster = ClusterState([node("r1a", rack="r1"), node("r2a", rack="r2"), node("r2b", rack="r2")])
    cluster.assume(plan_one(cluster, "busy", 8, "r1a"))
    result = plan(GroupRequest("ml/train", 2, members("w", 2, 8), domain_key=RACK), cluster)
    assert isinstance(result, GroupPlacement)
    assert result.domain == "r2" and sorted(result.nodes) == ["r2a", "r2b"]


def test_elastic_extras_are_placed_when_they_fit_and_never_hold_back_the_minimum() -> None:
    cluster = ClusterState([node("n1"), node("n2")])
    result = plan(GroupRequest("ml/train", 2, members("w", 3, 8)), cluster)
    assert isinstance(result, GroupPlacement)
    assert len(result.placements) == 2 and result.waiting == ("w-2",)
    bigger = ClusterState([node("n1"), node("n2"), node("n3")])
    result = plan(GroupRequest("ml/train", 2, members("w", 3, 8)), bigger)
    assert isinstance(result, GroupPlacement) and len(result.placements) == 3 and not result.waiting


def test_any_min_member_members_make_the_minimum_not_the_first_ones() -> None:
    """An elastic group of one 16-GPU-wanting pod (never fits) and two 4-GPU pods, minimum 2."""
    cluster = ClusterState([node("n1")])
    group = GroupRequest("ml/train", 2, (PodRequest("ml/huge", uid="huge", gpu_count=16),
                                         *members("w", 2, 4)))
    result = plan(group, cluster)
    assert isinstance(result, GroupPlacement)
    assert sorted(p.allocation.pod_uid for p in result.placements) == ["w-0", "w-1"]
    assert result.waiting == ("huge",)


def test_extras_that_miss_the_chosen_zone_go_elsewhere() -> None:
    cluster = ClusterState([node("a1", zone="a"), node("a2", zone="a"), node("b1", gpus=4, zone="b")])
    result = plan(GroupRequest("ml/train", 2, members("w", 3, 8)), cluster)
    assert isinstance(result, GroupPlacement)
    assert result.domain == "a" and result.waiting == ("w-2",)  # b1 has only 4 GPUs
    cluster = ClusterState([node("a1", zone="a"), node("a2", zone="a"), node("b1", zone="b")])
    result = plan(GroupRequest("ml/train", 2, members("w", 3, 8)), cluster)
    assert isinstance(result, GroupPlacement) and not result.waiting
    assert sorted(result.nodes) == ["a1", "a2", "b1"]


def test_members_never_share_a_gpu_and_the_biggest_go_first() -> None:
    cluster = ClusterState([node("n1", gpus=8)])
    group = GroupRequest("ml/mixed", 3, (PodRequest("ml/s", uid="s", gpu_count=1),
                                         PodRequest("ml/m", uid="m", gpu_count=3),
                                         PodRequest("ml/l", uid="l", gpu_count=4)))
    assert [m.uid for m in member_order(group.members)] == ["l", "m", "s"]
    result = plan(group, cluster)
    assert isinstance(result, GroupPlacement)
    devices = [d for p in result.placements for d in p.allocation.device_ids()]
    assert len(devices) == len(set(devices)) == 8


def test_only_the_largest_domains_are_tried() -> None:
    nodes = [node(f"z{i}", gpus=1, zone=f"z{i}") for i in range(MAX_DOMAINS + 4)]
    nodes.append(node("big", gpus=8, zone="zz"))
    result = plan(GroupRequest("ml/train", 2, members("w", 2, 1)), ClusterState(nodes))
    assert isinstance(result, GroupPlacement) and result.domain == "zz"


@pytest.mark.parametrize("bad", [0, -1])
def test_a_group_needs_a_positive_minimum_and_distinct_members(bad: int) -> None:
    with pytest.raises(ValueError, match="min_member"):
        GroupRequest("g", bad, members("w", 1, 1))
    twice = members("w", 1, 1) * 2
    with pytest.raises(ValueError, match="twice"):
        GroupRequest("g", 1, twice)


@pytest.mark.parametrize("seed", range(30))
def test_random_groups_are_whole_or_absent_and_never_overbook(seed: int) -> None:
    rng = random.Random(seed)
    cluster = ClusterState([node(f"n{i}", gpus=rng.choice([2, 4, 8]), zone=rng.choice(["a", "b", None]))
                            for i in range(rng.randint(1, 6))])
    for g in range(6):
        count = rng.randint(1, 5)
        gpus = rng.choice([1, 2, 4, 8])
        group = GroupRequest(f"ml/g{g}", rng.randint(1, count), members(f"g{g}", count, gpus))
        before = snapshot(cluster)
        result = plan(group, cluster, policy=rng.choice(["topology", "spread", "fgd-reserve"]))
        assert snapshot(cluster) == before
        if isinstance(result, GroupPlacement):
            assert len(result.placements) >= group.min_member
            assert len(result.placements) + len(result.waiting) == count
            assume_all(cluster, result)  # raises AllocationConflict on any double booking
            assert all(isinstance(p, Placement) for p in result.placements)
        else:
            assert result.placed < group.min_member
    for n in cluster.nodes:
        assert all(g.free_milli >= 0 for g in n.gpus)
