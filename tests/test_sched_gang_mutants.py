"""The gang planner's behaviours that a mutation run of scheduler/core/gang.py found untested
(docs/testing.md, "gang.py"): the order of the fewest-nodes search, its pool on large clusters,
the greedy plan kept when the search cannot beat it, members already placed, domain ties, the
failure's figures and reasons, the placement facts kept by preemption and ``fits_alone``, and the
edges of ``resource_gap``, ``capacity_gap`` and ``never_fits``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from scheduler.core import ClusterState, GpuState, NodeState, PodRequest, make_policy
from scheduler.core.allocate import allocate
from scheduler.core.filters import DEFAULT_FILTERS
from scheduler.core.gang import (
    GroupPlacement,
    GroupRequest,
    GroupUnschedulable,
    GroupVictims,
    OnlyNodes,
    capacity_gap,
    fits_alone,
    group_preemption,
    member_order,
    never_fits,
    resource_gap,
    schedule_group,
)
from scheduler.core.placement import placement_of
from scheduler.core.request import Toleration
from scheduler.core.schedule import Unschedulable, run_filters, schedule_one
from scheduler.core.state import MIB, Allocation, GpuGrant

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def node(name: str, gpus: int = 8, zone: str | None = None, cpu: int = 64_000, **labels: str) -> NodeState:
    all_labels = {HOST: name, **labels}
    if zone is not None:
        all_labels[ZONE] = zone
    return NodeState(name, cpu, 512_000, [GpuState(i, f"{name}-g{i}", "H100", 81920) for i in range(gpus)],
                     labels=all_labels)


def member(k: int, gpus: int, cpu: int = 100, **fields: Any) -> PodRequest:
    return PodRequest(f"ml/m-{k}", uid=f"m-{k}", cpu_milli=cpu, gpu_count=gpus, **fields)


def group_of(gpus: list[int], min_member: int | None = None, zoned: bool = True) -> GroupRequest:
    members = tuple(member(k, g) for k, g in enumerate(gpus))
    return GroupRequest("ml/g", len(gpus) if min_member is None else min_member, members,
                        domain_key=ZONE if zoned else None)


def plan(group: GroupRequest, cluster: ClusterState, policy: str = "binpack", **kw: Any) -> Any:
    chosen = make_policy(policy)
    chosen.bind(cluster, list(group.members), random.Random(0))
    return schedule_group(group, cluster, chosen, random.Random(1), **kw)


def book_on(cluster: ClusterState, pod: PodRequest, name: str, facts: Any = None) -> Allocation:
    alloc = allocate(pod, cluster.nodes[cluster.index[name]])
    assert alloc is not None
    cluster.assume(alloc, facts)
    return alloc


def where(result: GroupPlacement) -> dict[str, str]:
    return {p.allocation.pod_uid: p.node for p in result.placements}


# -- the fewest-nodes search: its order ------------------------------------------------------------


def test_the_search_tries_the_freest_new_node_first_ties_in_node_order_then_the_policys_group_node() -> None:
    """binpack's greedy pass puts the 4-GPU member on n3 (a full fit), the 3-GPU one on n0 and the
    share on a third node; the free GPUs say two nodes could do, so the search runs. It takes the
    new node with the most free GPUs first (n2, 6), then for the 3-GPU member the first of the two
    4-GPU nodes in the cluster's order (n3: a sort that is not stable would make the plan depend on
    numpy's sorting algorithm), and puts the share on the group's node binpack scores best (n3, the
    fuller), meeting the bound of two nodes."""
    cluster = ClusterState([node("n0", 3), node("n1", 3), node("n2", 6), node("n3", 4), node("n4", 4)])
    share = PodRequest("ml/m-0", uid="m-0", gpu_count=1, gpu_milli=300)
    group = GroupRequest("ml/g", 3, (share, member(1, 3), member(2, 4)), domain_key=None)
    result = plan(group, cluster)
    assert isinstance(result, GroupPlacement), result
    assert where(result) == {"m-2": "n2", "m-1": "n3", "m-0": "n3"}


def test_a_greedy_plan_the_search_cannot_beat_is_kept() -> None:
    """Three 3-GPU and three 2-GPU members on 4-GPU nodes: a 3 and a 2 never share a node, so five
    nodes are the fewest although the free GPUs say four could do. The search runs and finds
    nothing better, so the greedy pass's plan (the same as the elastic group's, which is never
    searched) is the plan, not the search's own five-node plan."""
    cluster = ClusterState([node(f"n{i}", 4) for i in range(7)])
    required = plan(group_of([3, 3, 3, 2, 2, 2], zoned=False), cluster)
    greedy = plan(group_of([3, 3, 3, 2, 2, 2], 1, zoned=False), cluster)
    assert isinstance(required, GroupPlacement) and isinstance(greedy, GroupPlacement)
    assert greedy.waiting == () and len(greedy.nodes) == 5
    assert decisions(required) == decisions(greedy)


def decisions(result: GroupPlacement) -> list[tuple[str, Allocation]]:
    return [(p.node, p.allocation) for p in result.placements]


def test_a_greedy_plan_with_a_share_that_the_search_cannot_beat_is_kept() -> None:
    """A member placed already in zone zb, zone za with 8 CPUs a node: two members asking 4 CPUs
    and a share need both za nodes; spread's greedy plan does that, and the search, which the free
    figures let run, finds nothing on fewer nodes, so the greedy plan stands (not the search's own
    plan on as many nodes)."""
    cluster = ClusterState([node("n0", 6, "zb", cpu=8000), node("n1", 4, cpu=8000), node("n2", 8, cpu=8000),
                            node("n3", 8, "za", cpu=8000), node("n4", 4, "za", cpu=8000)])
    book_on(cluster, PodRequest("bg/0", uid="bg-0", gpu_count=2), "n0")
    book_on(cluster, PodRequest("bg/1", uid="bg-1", cpu_milli=1000, gpu_count=2), "n3")
    first = member(0, 2, 1000)
    book_on(cluster, first, "n0")
    share = PodRequest("ml/m-3", uid="m-3", cpu_milli=100, gpu_count=1, gpu_milli=500)
    members = (first, member(1, 1, 4000), member(2, 1, 4000), share)
    result = plan(GroupRequest("ml/g", 4, members), cluster, "spread")
    assert isinstance(result, GroupPlacement) and result.domain == "za"
    # spread's choices: the freer n3 first, n4 for the member n3's CPU no longer holds, n3 again
    assert where(result) == {"m-1": "n3", "m-2": "n4", "m-3": "n3"}


def test_the_search_never_takes_a_plan_on_as_many_nodes_as_its_best() -> None:
    """Two 8-GPU nodes with 8 CPUs, and three smaller nodes: members of 3 GPUs + 4 CPUs, 2 + 4,
    2 + 0.1 and 1 + 1 need two nodes (9.1 CPUs), which the topology policy's greedy pass misses;
    the search must only ever accept plans on fewer nodes than its best so far."""
    cluster = ClusterState([node("n0", 8, cpu=8000), node("n1", 8, cpu=8000), node("n2", 3, cpu=64_000),
                            node("n3", 4, cpu=8000), node("n4", 2, cpu=16_000)])
    book_on(cluster, PodRequest("bg/0", uid="bg-0", gpu_count=2), "n2")
    members = (member(0, 2, 100), member(1, 3, 4000), member(2, 2, 4000), member(3, 1, 1000))
    result = plan(GroupRequest("ml/g", 4, members, domain_key=None), cluster, "topology")
    assert isinstance(result, GroupPlacement) and sorted(result.nodes) == ["n0", "n1"]


def fewest_nodes(
    free: list[tuple[int, int]], demands: list[tuple[int, int]], used: frozenset[int] = frozenset()
) -> int | None:
    """The fewest nodes (counting ``used``) that hold every demand (whole GPUs, CPU), by brute force."""
    best: int | None = None

    def walk(k: int, room: list[int], on: frozenset[int]) -> None:
        nonlocal best
        if best is not None and len(on) >= best:
            return
        if k == len(demands):
            best = len(on)
            return
        gpus, cpu = demands[k]
        for i, (left_gpus, left_cpu) in enumerate(room):
            if left_gpus >= gpus and left_cpu >= cpu:
                room[i] = (left_gpus - gpus, left_cpu - cpu)
                walk(k + 1, room, on | {i})
                room[i] = (left_gpus, left_cpu)

    walk(0, list(free), used)
    return best


def random_case(seed: int) -> tuple[ClusterState, GroupRequest, str, list[tuple[int, int]], frozenset[int]]:
    """2-5 nodes partly used, some short of CPU; 2-5 members (whole GPUs and CPU, sometimes one
    asking no GPU), sometimes one member placed already; the nodes all in one zone or in none."""
    rng = random.Random(seed)
    zoned = rng.random() < 0.5
    zone = "z" if zoned else None
    nodes = [node(f"n{i}", rng.choice((2, 4, 6, 8)), zone, cpu=rng.choice((8000, 64_000)))
             for i in range(rng.randint(2, 5))]
    cluster = ClusterState(nodes)
    for k in range(rng.randint(0, 2)):
        target = rng.choice(nodes)
        take = rng.randint(1, 2)
        if cluster.gpu_full_free[cluster.index[target.name]] >= take:
            book_on(cluster, PodRequest(f"bg/{k}", uid=f"bg-{k}", gpu_count=take), target.name)
    members = [member(k, rng.choice((1, 2, 3, 4)), rng.choice((100, 1000, 4000)))
               for k in range(rng.randint(2, 5))]
    if rng.random() < 0.3:
        members.append(member(len(members), 0))
    used: frozenset[int] = frozenset()
    if rng.random() < 0.3:
        first = members[0]
        fits = [n.name for n in nodes if cluster.gpu_full_free[cluster.index[n.name]] >= first.whole_gpus]
        if fits:
            name = rng.choice(fits)
            book_on(cluster, first, name)
            used = frozenset({cluster.index[name]})
    pending = [m for m in members if m.uid not in cluster.where]
    group = GroupRequest("ml/g", len(members), tuple(members), domain_key=ZONE if zoned else None)
    policy = rng.choice(("binpack", "topology", "spread", "gpupacking"))
    return cluster, group, policy, [(m.whole_gpus, m.cpu_milli) for m in pending], used


@pytest.mark.parametrize("seeds", [range(0, 150), range(150, 300)])
def test_every_required_group_gets_the_fewest_nodes_and_the_greedy_plan_when_that_is_fewest(
    seeds: range,
) -> None:
    """Random small clusters with pods already running, nodes short of CPU, a member sometimes
    placed already and a member sometimes asking for no GPU: the group is placed exactly when
    brute force finds a plan, on the fewest nodes, and when the greedy pass (the elastic group's
    plan) is on the fewest nodes, that is the plan."""
    wrong = []
    for seed in seeds:
        cluster, group, policy, demands, used = random_case(seed)
        free = [(int(g), int(c)) for g, c in zip(cluster.gpu_full_free, cluster.cpu_free, strict=True)]
        best = fewest_nodes(free, demands, used)
        got = plan(group, cluster, policy)
        placed = None
        if isinstance(got, GroupPlacement):
            placed = len({cluster.index[n] for n in got.nodes} | used)
        if placed != best:
            wrong.append(f"seed {seed}: brute force {best}, planner {placed}")
            continue
        if best is None:
            continue
        elastic = GroupRequest(group.name, 1, group.members, group.domain_key)
        greedy = plan(elastic, cluster, policy)
        assert isinstance(greedy, GroupPlacement)
        greedy_nodes = len({cluster.index[n] for n in greedy.nodes} | used)
        if not greedy.waiting and greedy_nodes == best:
            if decisions(got) != decisions(greedy):
                wrong.append(f"seed {seed}: the greedy plan is on the fewest nodes but another was returned")
    assert wrong == []


# -- the search's pool on clusters of more than SEARCH_POOL nodes ----------------------------------


def large(fillers: int = 70, filler_gpus: int = 2, **filler_labels: str) -> list[NodeState]:
    return [node(f"f{i:02d}", filler_gpus, **filler_labels) for i in range(fillers)]


def test_the_search_pool_takes_the_nodes_with_the_most_free_gpus() -> None:
    """70 2-GPU nodes beside a 6- and a 4-GPU node: binpack's greedy pass uses three nodes for
    members of 3, 3, 2 and 2 GPUs; the search finds the 6- and 4-GPU nodes, which only a pool
    ranked by the most free GPUs holds."""
    cluster = ClusterState([*large(), node("b6", 6), node("b4", 4)])
    result = plan(group_of([3, 3, 2, 2], zoned=False), cluster)
    assert isinstance(result, GroupPlacement) and sorted(result.nodes) == ["b4", "b6"]


def test_the_search_pool_of_a_group_of_many_kinds_still_finds_the_plan() -> None:
    """The same cluster, and nine kinds of member (each tolerates another taint): past SEARCH_KINDS
    every node counts as usable, and the pool is ranked by free GPUs alone."""
    cluster = ClusterState([*large(), node("b6", 6), node("b4", 4)])
    gpus = [3, 3, 2, 2, 0, 0, 0, 0, 0]
    members = tuple(member(k, g, tolerations=(Toleration(f"k{k}", "Exists"),)) for k, g in enumerate(gpus))
    result = plan(GroupRequest("ml/g", 9, members, domain_key=None), cluster)
    assert isinstance(result, GroupPlacement) and sorted(result.nodes) == ["b4", "b6"]


def test_the_search_pool_ranks_nodes_usable_by_each_node_selector_first() -> None:
    """The 3-GPU members select pool=big (only b6), the 2-GPU ones pool=small (b4 and 70 2-GPU
    nodes): the pool must rank the nodes usable by each kind first, or b6 falls out of it."""
    cluster = ClusterState([*large(pool="small"), node("b6", 6, pool="big"), node("b4", 4, pool="small")])
    members = (
        member(0, 3, node_selector={"pool": "big"}),
        member(1, 3, node_selector={"pool": "big"}),
        member(2, 2, node_selector={"pool": "small"}),
        member(3, 2, node_selector={"pool": "small"}),
    )
    result = plan(GroupRequest("ml/g", 4, members, domain_key=None), cluster)
    assert isinstance(result, GroupPlacement) and where(result) == {
        "m-0": "b6", "m-1": "b6", "m-2": "b4", "m-3": "b4"}


def affine(k: int, gpus: int, pool: str) -> PodRequest:
    doc = {
        "metadata": {"name": f"m-{k}", "namespace": "ml", "uid": f"m-{k}"},
        "spec": {"containers": [{"name": "c"}], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": [pool]}]}]}}}},
    }
    return PodRequest(f"ml/m-{k}", uid=f"m-{k}", cpu_milli=100, gpu_count=gpus, placement=placement_of(doc))


def test_the_search_pool_ranks_nodes_usable_by_each_node_affinity_first() -> None:
    """As above with required node affinity instead of a node selector."""
    cluster = ClusterState([*large(pool="small"), node("b6", 6, pool="big"), node("b4", 4, pool="small")])
    members = (affine(0, 3, "big"), affine(1, 3, "big"), affine(2, 2, "small"), affine(3, 2, "small"))
    result = plan(GroupRequest("ml/g", 4, members, domain_key=None), cluster)
    assert isinstance(result, GroupPlacement) and where(result) == {
        "m-0": "b6", "m-1": "b6", "m-2": "b4", "m-3": "b4"}


def test_the_search_pool_holds_the_groups_own_nodes_however_few_gpus_they_have_free() -> None:
    """A member placed already on x (4 of its 8 GPUs free, fewer than each of 70 6-GPU nodes);
    binpack's greedy pass needs three nodes for 3, 3, 2 and 2 GPUs more; two (x and one other)
    suffice only if the search may use x, which ranks last by free GPUs."""
    cluster = ClusterState([*large(filler_gpus=6), node("x", 8)])
    book_on(cluster, PodRequest("bg/x", uid="bg-x", gpu_count=4), "x")
    first = member(0, 0)
    book_on(cluster, first, "x")
    members = (first, member(1, 3), member(2, 3), member(3, 2), member(4, 2))
    result = plan(GroupRequest("ml/g", 5, members, domain_key=None), cluster)
    assert isinstance(result, GroupPlacement)
    on_x = {uid for uid, name in where(result).items() if name == "x"}
    assert len(set(result.nodes) | {"x"}) == 2 and {"m-3", "m-4"} <= on_x


# -- members already placed, elastic groups ----------------------------------------------------------


def test_an_elastic_groups_members_follow_a_member_placed_already() -> None:
    """A member bound already on n1: the others (extras beyond the minimum, so no search) go to the
    group's node while it has room, though spread prefers the empty n0."""
    cluster = ClusterState([node("n0"), node("n1")])
    members = [member(k, 1) for k in range(3)]
    book_on(cluster, members[0], "n1")
    result = plan(GroupRequest("ml/g", 2, tuple(members), domain_key=None), cluster, "spread")
    assert isinstance(result, GroupPlacement) and where(result) == {"m-1": "n1", "m-2": "n1"}


def test_an_elastic_group_is_not_searched_for_fewer_nodes() -> None:
    """Extras beyond the minimum get the greedy pass only: binpack puts 3 on the 4-GPU node, 3 on the
    6-GPU node, 2 beside it and the last 2 on the 2-GPU node, three nodes (as 3+3 and 2+2 all four
    would take two)."""
    cluster = ClusterState([node("n0", 6), node("n1", 4), node("n2", 2)])
    result = plan(group_of([3, 3, 2, 2], 2, zoned=False), cluster)
    assert isinstance(result, GroupPlacement) and result.waiting == ()
    assert where(result) == {"m-0": "n1", "m-1": "n0", "m-2": "n0", "m-3": "n2"}


def test_a_group_whose_minimum_is_placed_already_leaves_an_extra_that_does_not_fit_waiting() -> None:
    cluster = ClusterState([node("n0"), node("n1")])
    members = [member(0, 1), member(1, 16)]
    book_on(cluster, members[0], "n0")
    result = plan(GroupRequest("ml/g", 1, tuple(members), domain_key=None), cluster)
    assert isinstance(result, GroupPlacement) and (result.placements, result.waiting) == ((), ("m-1",))


def test_the_failure_counts_the_members_placed_already_and_names_the_next() -> None:
    cluster = ClusterState([node("n0"), node("n1")])
    members = [member(0, 1), member(1, 8), member(2, 8)]
    book_on(cluster, members[0], "n0")
    result = plan(GroupRequest("ml/g", 3, tuple(members), domain_key=None), cluster)
    assert isinstance(result, GroupUnschedulable)
    assert (result.placed, result.blocked, result.members) == (2, "ml/m-2", 3)
    assert "only 2 of its 3 minimum members fit together; member ml/m-2:" in result.message()


def test_a_group_with_too_few_members_reports_what_is_placed_and_the_cluster() -> None:
    cluster = ClusterState([node("n0"), node("n1"), node("n2")])
    members = [member(0, 1), member(1, 1)]
    book_on(cluster, members[0], "n0")
    result = plan(GroupRequest("ml/g", 3, tuple(members), domain_key=None), cluster)
    assert isinstance(result, GroupUnschedulable)
    assert (result.members, result.placed, result.total_nodes) == (2, 1, 3)


# -- the greedy pass stops when the minimum is out of reach ---------------------------------------------


def test_the_plan_stops_at_the_first_member_that_leaves_the_minimum_out_of_reach() -> None:
    """4, 2 and 1 GPUs, all required, on a 4-GPU and a 1-GPU node: the 2-GPU member fits nowhere,
    so the plan stops there; the 1-GPU member is not placed and not counted."""
    cluster = ClusterState([node("n0", 4), node("n1", 1)])
    result = plan(group_of([4, 2, 1], zoned=False), cluster)
    assert isinstance(result, GroupUnschedulable)
    assert (result.placed, result.blocked) == (1, "ml/m-1")


def test_the_failure_gives_the_blocked_members_reasons() -> None:
    cluster = ClusterState([node("n0", 4), node("n1", 4)])
    group = group_of([8, 8], zoned=False)
    result = plan(group, cluster)
    assert isinstance(result, GroupUnschedulable)
    alone = schedule_one(group.members[0], cluster, make_policy("binpack"), random.Random(1))
    assert isinstance(alone, Unschedulable) and alone.reasons
    assert result.reasons == dict(alone.reasons) and result.total_nodes == 2
    assert result.message().endswith(f"member ml/m-0: {alone.message()}")


def test_only_nodes_counts_the_nodes_it_rejects_under_its_reason() -> None:
    cluster = ClusterState([node("n0"), node("n1"), node("n2")])
    keep = OnlyNodes(cluster.all_indices == 1, "not this one")
    idx, why = run_filters(member(0, 1), cluster, [*DEFAULT_FILTERS, keep])
    assert idx.tolist() == [1] and why == {}
    idx, why = run_filters(member(0, 16), cluster, [keep, *DEFAULT_FILTERS])
    assert idx.tolist() == [] and why["not this one"] == 2


def test_members_are_ordered_by_gpus_then_gpu_share_then_cpu_then_memory() -> None:
    small_share = PodRequest("s", uid="s", gpu_count=1, gpu_milli=300)
    big_share = PodRequest("b", uid="b", gpu_count=1, gpu_milli=700)
    cpu_low = PodRequest("c1", uid="c1", cpu_milli=1000)
    cpu_high = PodRequest("c2", uid="c2", cpu_milli=2000)
    mem_low = PodRequest("m1", uid="m1", memory_mib=100)
    mem_high = PodRequest("m2", uid="m2", memory_mib=200)
    ordered = member_order([mem_low, cpu_low, small_share, mem_high, cpu_high, big_share])
    assert [m.uid for m in ordered] == ["b", "s", "c2", "c1", "m2", "m1"]


# -- domains ----------------------------------------------------------------------------------------------


def test_one_zone_is_a_domain_too() -> None:
    cluster = ClusterState([node("n0", zone="z1"), node("n1", zone="z1"), node("n2")])
    result = plan(group_of([1, 1]), cluster)
    assert isinstance(result, GroupPlacement) and result.domain == "z1"


def test_domains_with_as_many_free_gpus_are_tried_in_name_order() -> None:
    cluster = ClusterState(
        [node("b0", zone="zb"), node("b1", zone="zb"), node("a0", zone="za"), node("a1", zone="za")]
    )
    result = plan(group_of([1, 1]), cluster)
    assert isinstance(result, GroupPlacement) and result.domain == "za"


def test_between_domains_whose_plans_use_as_many_nodes_the_larger_wins() -> None:
    cluster = ClusterState([node("b0", zone="zb"), node("b1", zone="zb"),
                            node("a0", zone="za"), node("a1", zone="za"), node("a2", zone="za")])
    result = plan(group_of([8, 8]), cluster)
    assert isinstance(result, GroupPlacement) and result.domain == "za" and len(result.nodes) == 2


def test_the_domain_plan_placing_the_extra_wins_over_one_placing_none() -> None:
    """The group's minimum is placed already (m-0 on b0, zb); its extra fits only the larger zone's
    a0. za's plan places it, zb's places none (a plan on no new node): za's wins, for more members
    placed. (Since c0ec0ef a0, a node the group did not use, no longer ends the domain search: zb
    is tried too; only a plan with no member waiting and no new node ends it.)"""
    cluster = ClusterState([node("a0", 8, zone="za"), node("b0", 2, zone="zb"), node("b1", 2, zone="zb"),
                            node("b2", 2, zone="zb")])
    members = [member(0, 0), member(1, 4)]
    book_on(cluster, members[0], "b0")
    result = plan(GroupRequest("ml/g", 1, tuple(members)), cluster)
    assert isinstance(result, GroupPlacement) and result.domain == "za" and where(result) == {"m-1": "a0"}


def test_a_member_follows_the_placed_ones_into_their_domain_where_both_domains_hold_it() -> None:
    """One member of a two-member group is placed on b0 (zone zb); the other fits a0 (za) and b0
    alike, and the two zones have as many free GPUs. Fewest nodes counts the group's nodes, the
    placed member's too: the member goes to b0, not to a0 in the other zone (it did, as each
    zone's plan placed it on one new node, and za came first)."""
    cluster = ClusterState([node("a0", 2, zone="za"), node("b0", 4, zone="zb")])
    members = [member(0, 2), member(1, 2)]
    book_on(cluster, members[0], "b0")
    result = plan(GroupRequest("ml/g", 2, tuple(members)), cluster)
    assert isinstance(result, GroupPlacement) and result.domain == "zb" and where(result) == {"m-1": "b0"}


REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def worker(k: int) -> PodRequest:
    doc = {
        "metadata": {"name": f"w-{k}", "namespace": "ml", "uid": f"w-{k}", "labels": {"app": "w"}},
        "spec": {"containers": [{"name": "c"}], "affinity": {"podAntiAffinity": {REQUIRED: [
            {"labelSelector": {"matchLabels": {"app": "w"}}, "topologyKey": HOST}]}}},
    }
    return PodRequest(f"ml/w-{k}", uid=f"w-{k}", gpu_count=1, placement=placement_of(doc))


def test_extras_placed_outside_the_domain_see_the_members_placed_in_it() -> None:
    """One worker per node: zone za holds one, so two extras go elsewhere, and must see the worker
    in za (binpack would otherwise put one beside it, on the busier node)."""
    cluster = ClusterState([node("a0", zone="za"), node("b0", zone="zb"), node("b1", zone="zb")])
    cluster.enable_placement()
    group = GroupRequest("ml/g", 1, tuple(worker(k) for k in range(3)))
    result = plan(group, cluster)
    assert isinstance(result, GroupPlacement) and result.waiting == ()
    assert sorted(result.nodes) == ["a0", "b0", "b1"]


# -- preemption and fits_alone leave the cluster (and its placement view) as it was -----------------------


def labelled(uid: str, gpus: int) -> tuple[PodRequest, Any]:
    doc = {"metadata": {"name": uid, "namespace": "other", "uid": uid, "labels": {"app": uid}},
           "spec": {"containers": [{"name": "c"}]}}
    placement = placement_of(doc)
    return PodRequest(f"other/{uid}", uid=uid, gpu_count=gpus, placement=placement), placement.facts


def test_group_preemption_names_its_victims_and_keeps_the_others_placement_facts() -> None:
    cluster = ClusterState([node("n0"), node("n1")])
    view = cluster.enable_placement()
    victim, victim_facts = labelled("victim", 8)
    bystander, bystander_facts = labelled("bystander", 8)
    book_on(cluster, victim, "n1", victim_facts)
    book_on(cluster, bystander, "n0", bystander_facts)
    only_n1 = OnlyNodes(cluster.all_indices == 1, "not n1")
    policy = make_policy("binpack")
    group = group_of([8], zoned=False)
    got = group_preemption(group, cluster, policy, random.Random(1), ["victim", "bystander"],
                           filters=(*DEFAULT_FILTERS, only_n1))
    assert isinstance(got, GroupVictims) and got.victims == ("victim",)
    assert [p.node for p in got.plan.placements] == ["n1"]
    assert view.index.facts["victim"] == victim_facts and view.index.facts["bystander"] == bystander_facts


def test_group_preemption_is_none_when_the_candidates_can_all_stay() -> None:
    """The candidate asks for CPU only: it fits beside the planned member, so nobody is evicted."""
    cluster = ClusterState([node("n0")])
    book_on(cluster, PodRequest("other/p", uid="p", cpu_milli=1000), "n0")
    group = group_of([8], zoned=False)
    got = group_preemption(group, cluster, make_policy("binpack"), random.Random(1), ["p"])
    assert got is None and "p" in cluster.where


def test_group_preemption_and_fits_alone_work_without_a_placement_view() -> None:
    cluster = ClusterState([node("n0")])
    book_on(cluster, PodRequest("other/p", uid="p", gpu_count=8), "n0")
    group = group_of([8], zoned=False)
    got = group_preemption(group, cluster, make_policy("binpack"), random.Random(1), ["p"])
    assert isinstance(got, GroupVictims) and got.victims == ("p",)
    assert fits_alone(group, cluster, make_policy("binpack"), random.Random(1))
    assert cluster.where == {"p": 0}


def test_fits_alone_keeps_the_other_pods_placement_facts() -> None:
    cluster = ClusterState([node("n0")])
    view = cluster.enable_placement()
    other, facts = labelled("other", 8)
    book_on(cluster, other, "n0", facts)
    assert fits_alone(group_of([8], zoned=False), cluster, make_policy("binpack"), random.Random(1))
    assert view.index.facts["other"] == facts


# -- never_fits, capacity_gap, resource_gap ----------------------------------------------------------------


def test_nothing_fits_a_cluster_without_nodes() -> None:
    group = group_of([1, 1], zoned=False)
    assert never_fits(group, ClusterState([])) == (
        "2 of its members ask for more GPUs than any node has (0), and it needs 2")


def counted(name: str, max_pods: int | None) -> NodeState:
    gpus = [GpuState(j, f"{name}-g{j}", "A100") for j in range(4)]
    return NodeState(name, 4000, 1024, gpus, max_pods=max_pods)


def test_capacity_gap_of_pods_on_nodes_with_and_without_a_limit() -> None:
    assert capacity_gap(ClusterState([counted("n0", 0), counted("n1", 3)]), {"pods": 4}) == {"pods": 1}
    unlimited = ClusterState([counted("n0", 3), counted("n1", None)])
    assert capacity_gap(unlimited, {"pods": 1000, "x.io/y": 1}) == {"x.io/y": 1}


def test_resource_gap_of_pods_on_a_node_without_a_limit() -> None:
    state = ClusterState([counted("n0", 3), counted("n1", None)])
    assert resource_gap(state, {"pods": 1000}) == {}


def test_resource_gap_counts_every_member_on_every_node_the_group_holds() -> None:
    state = ClusterState([counted("n0", 10), counted("n1", 10)])
    grant = (GpuGrant(0, "n0-g0", 1000),)
    state.assume(Allocation("n1", "m0", "ns/m0", cpu_milli=1000))
    state.assume(Allocation("n0", "m1", "ns/m1", cpu_milli=1000, memory_mib=1, gpus=grant))
    state.assume(Allocation("n0", "m2", "ns/m2", cpu_milli=1000))
    state.assume(Allocation("n0", "other", "ns/other", cpu_milli=1000))
    wanted = {"cpu": 8000, "x.io/y": 1, "memory": 2048 * MIB}
    assert resource_gap(state, wanted, ["m0", "m1", "m2"]) == {"cpu": 1000, "x.io/y": 1}


def test_the_search_pool_of_exactly_search_kinds_kinds_still_ranks_usable_nodes_first() -> None:
    """Eight kinds of member asking for H100s (each tolerates another taint), 70 empty A100 nodes
    listed first: up to SEARCH_KINDS kinds the pool takes the H100 nodes first, so the search
    finds the two-node plan (both 4s on the 8-GPU node) that the greedy pass misses."""
    h100 = frozenset({"H100"})
    a100 = [NodeState(f"a{i:02d}", 64_000, 512_000, [GpuState(g, f"a{i}-g{g}", "A100") for g in range(8)])
            for i in range(70)]
    cluster = ClusterState([*a100, node("b0", 4), node("b1", 8), node("b2", 6)])
    gpus = [4, 4, 1, 1, 1, 1, 1, 1]
    members = tuple(member(k, g, gpu_models=h100, tolerations=(Toleration(f"k{k}", "Exists"),))
                    for k, g in enumerate(gpus))
    result = plan(GroupRequest("ml/g", 8, members, domain_key=None), cluster, "topology")
    assert isinstance(result, GroupPlacement) and sorted(result.nodes) == ["b1", "b2"]


def test_a_member_follows_the_placed_ones_into_their_domain_where_it_needs_a_new_node_in_either() -> None:
    """Failed before 4a3b7ca (review23b).
    docs/gang.md says a member planned after others were placed "follows them
    into their domain where it fits there as well". za (a1: 8 GPUs, a2: 4) holds the three 4-GPU
    members on two nodes, zb (three 4-GPU nodes and a 2-GPU one: more free GPUs) on three, so the
    group is planned into za (a2, a1, a1). With m-1 and m-2 placed on a1 (e.g. the extender's
    choose, which kube-scheduler asks a member at a time, or m-0 deleted and re-created), m-0
    needs a new node in either zone: both plans count two nodes for the group, the tie goes to the
    larger zone, zb, and the gang is split over two zones though a2 holds m-0 in its own."""

    def cluster_of() -> ClusterState:
        zoned = [("a1", 8, "za"), ("a2", 4, "za"), ("b1", 4, "zb"), ("b2", 4, "zb"), ("b3", 4, "zb")]
        return ClusterState([*(node(n, g, zone=z) for n, g, z in zoned), node("b4", 2, zone="zb")])

    members = [member(0, 4), member(1, 4), member(2, 4)]
    whole = plan(GroupRequest("ml/g", 3, tuple(members)), cluster_of())
    assert isinstance(whole, GroupPlacement) and whole.domain == "za", whole
    assert where(whole) == {"m-0": "a2", "m-1": "a1", "m-2": "a1"}
    cluster = cluster_of()
    book_on(cluster, members[1], "a1")
    book_on(cluster, members[2], "a1")
    result = plan(GroupRequest("ml/g", 3, tuple(members)), cluster)
    assert isinstance(result, GroupPlacement) and where(result) == {"m-0": "a2"}, result
