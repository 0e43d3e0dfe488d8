"""Hostile review of the gang planner's fewest-nodes search (scheduler/core/gang.py
``_search_fewest``): it must respect everything the greedy pass respects."""

from __future__ import annotations

import random

import pytest

from scheduler.core import ClusterState, GpuState, NodeState, PodRequest, make_policy
from scheduler.core.allocate import allocate
from scheduler.core.gang import GroupPlacement, GroupRequest, schedule_group

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def node(name: str, gpus: int, zone: str) -> NodeState:
    return NodeState(name, 64_000, 512_000, [GpuState(i, f"{name}-g{i}", "H100", 81920) for i in range(gpus)],
                     labels={HOST: name, ZONE: zone})


def member(k: int, gpus: int) -> PodRequest:
    return PodRequest(f"ml/m-{k}", uid=f"m-{k}", cpu_milli=100, gpu_count=gpus)


def book_on(cluster: ClusterState, pod: PodRequest, name: str) -> None:
    alloc = allocate(pod, cluster.nodes[cluster.index[name]])
    assert alloc is not None
    cluster.assume(alloc)


def test_the_search_keeps_the_group_inside_the_domain_it_plans_in() -> None:
    """A member already placed on a node outside the domain being tried (zone z1, the group's
    first member bound there before its zone filled up): the greedy pass never uses that node
    while planning in z2, but the search took the group's nodes (``used_before``) into its pool
    unfiltered and put a member there, returning a plan that says domain z2 with a member in z1."""
    cluster = ClusterState([node("a", 8, "z1"), node("b", 4, "z2"), node("c", 4, "z2")])
    book_on(cluster, PodRequest("other/filler", uid="filler", gpu_count=4), "a")
    members = [member(k, 2) for k in range(4)]
    book_on(cluster, members[0], "a")  # a has 2 GPUs free now, z2 has 8
    group = GroupRequest("ml/g", 4, tuple(members))
    for name in ("binpack", "topology", "spread"):
        policy = make_policy(name)
        policy.bind(cluster, list(group.members), random.Random(0))
        result = schedule_group(group, cluster, policy, random.Random(1))
        assert isinstance(result, GroupPlacement), (name, result)
        zones = {cluster.nodes[cluster.index[p.node]].labels[ZONE] for p in result.placements}
        assert (result.domain, zones) == ("z2", {"z2"}), (name, [p.node for p in result.placements])


def test_the_search_looks_at_the_nodes_the_group_can_use_not_at_the_freest_ones() -> None:
    """The search's pool was the SEARCH_POOL nodes with the most free GPUs, before any filter: on
    a cluster with 70 empty A100 nodes and three H100 nodes (4, 8 and 6 GPUs), a group of two
    4-GPU members that asks for H100s had no usable node in its pool, so the greedy pass's split
    over the 4- and 6-GPU nodes stood although the 8-GPU node holds both (as it does without the
    A100 nodes)."""
    h100 = [node("b0", 4, "z1"), node("b1", 8, "z1"), node("b2", 6, "z1")]
    a100 = [NodeState(f"a{i}", 64_000, 512_000, [GpuState(g, f"a{i}-g{g}", "A100", 81920) for g in range(8)],
                      labels={HOST: f"a{i}", ZONE: "z1"}) for i in range(70)]
    members = tuple(
        PodRequest(f"ml/m-{k}", uid=f"m-{k}", cpu_milli=100, gpu_count=4, gpu_models=frozenset({"H100"}))
        for k in range(2)
    )
    group = GroupRequest("ml/g", 2, members)
    for nodes in (h100, a100 + h100):
        cluster = ClusterState(nodes)
        policy = make_policy("topology")
        policy.bind(cluster, list(members), random.Random(0))
        result = schedule_group(group, cluster, policy, random.Random(1))
        assert isinstance(result, GroupPlacement) and result.nodes == ("b1",), (len(nodes), result)


def test_no_search_for_share_or_cpu_only_members_whose_greedy_plan_is_on_the_fewest_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound counted whole GPUs only: for a group without whole-GPU members it was 1 node, so
    every such group the greedy pass spread over several nodes (0.6-GPU shares on 1-GPU nodes,
    40-CPU members on 64-CPU nodes: one a node, no plan does better) ran the search to its whole
    budget, in every domain tried, to beat a plan nothing beats. GPU milli and CPU bound it too."""
    from scheduler.core import gang

    monkeypatch.setattr(gang, "place_on", lambda *a: pytest.fail("searched"))
    one_gpu = ClusterState([node(f"n{i}", 1, "z1") for i in range(20)])
    shares = GroupRequest("ml/s", 6, tuple(
        PodRequest(f"ml/s-{k}", uid=f"s-{k}", cpu_milli=100, gpu_count=1, gpu_milli=600) for k in range(6)))
    cpus = GroupRequest("ml/c", 5, tuple(
        PodRequest(f"ml/c-{k}", uid=f"c-{k}", cpu_milli=40_000) for k in range(5)))
    for group, cluster, nodes in ((shares, one_gpu, 6), (cpus, one_gpu, 5)):
        policy = make_policy("topology")
        policy.bind(cluster, list(group.members), random.Random(0))
        result = schedule_group(group, cluster, policy, random.Random(1))
        assert isinstance(result, GroupPlacement) and len(result.nodes) == nodes, result
