"""Cases the 2026-11-28 mutation re-measure of the scheduling core found untested (docs/testing.md,
"The functions changed since dcecd54, a7ceda5 and 381e807"): the NIC nearness score's values, the
score memo across pods and clusters, the utilisation policies' weights, the adaptive fgd-reserve's
rules, preemption of pods holding other resources, host ports and RDMA interfaces, and the RDMA
books' shortage once some grants are given back. Every test passed on the code as it was."""

from __future__ import annotations

import random

import numpy as np

from scheduler.core import (
    Allocation,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    PodRequest,
    make_policy,
    schedule_one,
)
from scheduler.core.policies import NicNearnessScore, ReserveThenAlign, TopologyScore
from scheduler.core.preempt import GpuSlot, NodeOffer, RunningPod, Victims, select_victims
from scheduler.core.rdma import NO_BANDWIDTH, NO_FREE_VFS, NicState, PfState, RdmaRequest, VfGrant
from scheduler.core.request import HostPort
from scheduler.core.utilization import UtilizationScore
from tests.support.rdmainv import Pf, rdma_inventory


def eight_gpus(name: str) -> NodeState:
    return NodeState(name, 96_000, 512_000, [GpuState(j, f"{name}-g{j}", "A") for j in range(8)])


def rdma_node(name: str, gpu_numas: list[int], pfs: list[Pf]) -> NodeState:
    return NodeState.from_inventory(name, 64_000, 512_000, rdma_inventory(name, gpu_numas, pfs))


# --- NicNearnessScore and the score memo --------------------------------------------------------


def test_nearness_values_per_tier_and_per_interface() -> None:
    """100 x (1 - distance / (2 x interfaces)): a VF on the GPUs' NUMA node 0 (not their switch)
    is 1 away, so one interface scores 50; of two interfaces one beside the GPU (0) and one on the
    other socket (2) score 50 too, and one on the other socket alone scores 0."""
    numa0 = rdma_node("numa0", [0, 0], [Pf("mlx5_0", 200, 0, (), vfs=4)])  # NUMA node 0, no GPU on its switch
    split = rdma_node("split", [0, 0], [Pf("mlx5_0", 200, 0, (0, 1), vfs=1), Pf("mlx5_1", 200, 1, (), vfs=4)])
    cluster = ClusterState([numa0, split])
    score = NicNearnessScore()
    score.bind(cluster, [], random.Random(0))
    one = PodRequest("one", gpu_count=1, rdma=RdmaRequest(1))
    two = PodRequest("two", gpu_count=1, rdma=RdmaRequest(2))
    assert NicNearnessScore.node_score(one, cluster, 0) == 50.0
    assert NicNearnessScore.node_score(one, cluster, 1) == 100.0
    assert NicNearnessScore.node_score(two, cluster, 1) == 50.0
    far = ClusterState([rdma_node("far", [0], [Pf("mlx5_1", 200, 1, (), vfs=4)])])
    assert NicNearnessScore.node_score(two, far, 0) == 0.0
    # the memo is per request: the same nodes score each pod by its own interfaces
    assert score.score(one, cluster, cluster.all_indices).tolist() == [50.0, 100.0]
    assert score.score(two, cluster, cluster.all_indices).tolist() == [50.0, 50.0]
    assert score.score(one, cluster, cluster.all_indices).tolist() == [50.0, 100.0]


def test_nearness_of_a_node_that_cannot_take_the_pod_is_0() -> None:
    """The filters keep such nodes away; asked anyway, the score prefers nothing."""
    cluster = ClusterState([rdma_node("n", [0], [Pf("mlx5_0", 200, 0, (0,), vfs=1)])])
    assert NicNearnessScore.node_score(PodRequest("p", gpu_count=1, rdma=RdmaRequest(2)), cluster, 0) == 0.0
    assert NicNearnessScore.node_score(PodRequest("p", gpu_count=2, rdma=RdmaRequest(1)), cluster, 0) == 0.0


def test_the_memo_follows_a_cluster_of_another_size() -> None:
    """A plugin bound once and then asked about a cluster with more nodes scores every node (its memo
    is per cluster size, not indexed past its end)."""
    pod = PodRequest("p", gpu_count=1, rdma=RdmaRequest(1))
    small = ClusterState([rdma_node("a", [0], [Pf("mlx5_0", 200, 0, (0,))])])
    large = ClusterState(
        [rdma_node("a", [0], [Pf("mlx5_0", 200, 0, (0,))]), rdma_node("b", [0], [Pf("mlx5_0", 200, 1, ())])]
    )
    score = NicNearnessScore()
    score.bind(small, [pod], random.Random(0))
    assert score.score(pod, small, small.all_indices).tolist() == [100.0]
    assert score.score(pod, large, large.all_indices).tolist() == [100.0, 0.0]
    assert score.score(pod, small, small.all_indices).tolist() == [100.0]
    topology = TopologyScore()
    topology.bind(small, [pod], random.Random(0))
    two = PodRequest("q", gpu_count=2)
    assert topology.score(two, small, small.all_indices).tolist() == [0.0]
    assert len(topology.score(two, large, large.all_indices)) == 2


# --- the utilisation policies ---------------------------------------------------------------------


def test_the_utilization_policy_scores_a_node_by_the_utilisation_score_itself() -> None:
    """Its one plugin weighs 1: the placement's score is the plugin's, which node-affinity and spread
    preferences are added to on the same scale."""
    nodes = [NodeState(f"n{i}", 64_000, 512_000, []) for i in range(2)]
    cluster = ClusterState(nodes)
    pod = PodRequest("p", cpu_milli=8000)
    policy = make_policy("utilization")
    policy.bind(cluster, [pod], random.Random(0))
    plugin = UtilizationScore()
    plugin.bind(cluster, [pod], random.Random(0))
    expected = plugin.score(pod, cluster, cluster.all_indices)
    assert np.array_equal(policy.score(pod, cluster, cluster.all_indices), expected)
    placement = schedule_one(pod, cluster, policy, random.Random(0))
    assert placement.score == float(expected.max())  # type: ignore[union-attr]
    assert policy.description == (
        "static node score, live GPU utilisation and allocation after placement (docs/utilisation.md)"
    )


def test_a_nearness_score_not_yet_bound_scores_too() -> None:
    pod = PodRequest("p", gpu_count=1, rdma=RdmaRequest(1))
    cluster = ClusterState([rdma_node("a", [0], [Pf("mlx5_0", 200, 0, (0,))])])
    assert NicNearnessScore().score(pod, cluster, cluster.all_indices).tolist() == [100.0]


def test_the_topology_policy_keeps_fgd_reserve_as_it_was_before_the_adaptive_rules() -> None:
    """Its tie-breaker keeps whole-node hosts in proportion (not ``RESERVE_KEEP``), without the
    adaptive reserve, the model balance or the exact alignment; the topology score and the NIC
    nearness weigh alike (a point of one as a point of the other)."""
    from scheduler.core.policies import ReserveThenAlign, WholeNodeReserve

    policy = make_policy("topology")
    tie = policy.tie_break
    assert isinstance(tie, ReserveThenAlign)
    assert tie.reserve.fixed is None and not tie.reserve.adaptive
    assert tie.balance is None and not tie.cpu_bound_exact
    assert tie.waste_band == 10 and tie.step == 0.2
    assert [(plugin.name, weight) for plugin, weight in policy.plugins[:2]] == [
        ("topology", 1000.0),
        ("nic-nearness", 1000.0),
    ]
    assert policy.description == (
        "multi-GPU pods where their GPUs connect best, RDMA interfaces nearest their GPUs, then fgd-reserve"
    )
    # in proportion: 10 of 20 eight-GPU nodes' worth of demand is whole-node pods -> keep 10, not 3
    cluster = ClusterState([eight_gpus(f"g{i}") for i in range(20)])
    workload = [PodRequest(f"big{i}", cpu_milli=64_000, gpu_count=8) for i in range(10)]
    workload += [PodRequest(f"one{i}", cpu_milli=4000, gpu_count=1) for i in range(80)]
    policy.bind(cluster, workload, random.Random(0))
    assert tie.reserve.keep == 10 > WholeNodeReserve.MIN_KEEP


# --- preemption of pods holding other resources, host ports and the pod count --------------------


def four_gpus(*extra: RunningPod, max_pods: int | None = None) -> NodeOffer:
    """Four GPUs: ``x`` (the oldest, so the most important) holds GPUs 0 and 1, ``y1`` and ``y2``
    one each; all of priority 1. ``extra`` pods hold no GPU."""
    slots = tuple(GpuSlot(f"g{i}", "A100", 81920) for i in range(4))
    x = RunningPod("x", "default/x", priority=1, start_time=1.0, gpus={"g0": (1000, 0), "g1": (1000, 0)})
    y1 = RunningPod("y1", "default/y1", priority=1, start_time=2.0, gpus={"g2": (1000, 0)})
    y2 = RunningPod("y2", "default/y2", priority=1, start_time=3.0, gpus={"g3": (1000, 0)})
    return NodeOffer(
        "n",
        64_000,
        512_000,
        slots,
        (x, y1, y2, *extra),
        max_pods=max_pods,
        allocatable={"example.com/foo": 1},
    )


def victim_uids(victims: Victims | None) -> set[str]:
    assert victims is not None
    return {p.uid for p in victims.pods}


def test_the_holder_of_a_host_port_joins_the_cheapest_gpu_victims() -> None:
    """Two GPUs: evicting ``x`` (one victim) beats ``y1`` and ``y2``; the port's holder, which holds
    nothing else, goes too. (Kube-scheduler's reprieve would keep the older ``x`` and evict both.)"""
    holder = RunningPod("port", "default/port", priority=1, start_time=4.0, host_ports=(HostPort.of(8080),))
    pod = PodRequest("p", uid="p", gpu_count=2, host_ports=(HostPort.of(8080),))
    assert victim_uids(select_victims(pod, 5, four_gpus(holder))) == {"x", "port"}


def test_the_holder_of_an_extended_resource_joins_the_cheapest_gpu_victims() -> None:
    holder = RunningPod("foo", "default/foo", priority=1, start_time=4.0, resources={"example.com/foo": 1})
    pod = PodRequest("p", uid="p", gpu_count=2, resources=(("example.com/foo", 1),))
    assert victim_uids(select_victims(pod, 5, four_gpus(holder))) == {"x", "foo"}


def test_a_pod_holding_nothing_is_evicted_for_the_pod_count() -> None:
    """At the node's pod limit the cheapest victim is the lowest-priority pod, though it holds no
    CPU, memory or device; the more important pod that holds CPU stays."""
    empty = RunningPod("empty", "default/empty", priority=1, start_time=4.0)
    busy = RunningPod("busy", "default/busy", priority=2, start_time=4.0, cpu_milli=1000)
    slots = (GpuSlot("g0", "A100", 81920),)
    offer = NodeOffer("n", 64_000, 512_000, slots, (empty, busy), max_pods=2)
    assert victim_uids(select_victims(PodRequest("p", uid="p", cpu_milli=100), 5, offer)) == {"empty"}


# --- fgd-reserve's adaptive rules ------------------------------------------------------------------


def test_cpu_bound_adds_up_the_cpu_of_every_arrival() -> None:
    """Two CPU pods of 6.25 % of the CPU each: the first is too little to decide (the workload's
    GPU-heavy shape does), both together are 12.5 %, past ``WARM_UP``, and all CPU."""
    cluster = ClusterState([NodeState("n", 64_000, 512_000, [GpuState(j, f"g{j}", "A") for j in range(8)])])
    tie = ReserveThenAlign(0.2, cpu_bound_exact=True)
    tie.bind(cluster, [PodRequest("g", cpu_milli=1000, gpu_count=4)], random.Random(0))
    cpu_pod = PodRequest("c", cpu_milli=4000)
    tie.observe(cpu_pod)
    assert not tie.cpu_bound()
    tie.observe(cpu_pod)
    assert tie.cpu_bound()


def test_a_pod_restricting_models_without_asking_gpus_leaves_the_model_balance_off() -> None:
    from scheduler.core.policies import ModelBalance

    nodes = [
        NodeState(f"{m}{i}", 64_000, 512_000, [GpuState(j, f"{m}{i}-g{j}", m.upper()) for j in range(2)])
        for m in "ab"
        for i in range(2)
    ]
    cluster = ClusterState(nodes)
    balance = ModelBalance(0.2)
    balance.bind(cluster)
    balance.observe(PodRequest("cpu", cpu_milli=1000, gpu_models=frozenset({"A"})))
    assert balance.bands(PodRequest("any", gpu_count=1), cluster, cluster.all_indices) is None


def eight_gpu_tie(prior: PodRequest) -> ReserveThenAlign:
    """A ``ReserveThenAlign`` bound to one node of 64 CPUs and 8 GPUs and a workload of ``prior``
    (what decides until the arrivals reach ``WARM_UP``)."""
    cluster = ClusterState([NodeState("n", 64_000, 512_000, [GpuState(j, f"g{j}", "A") for j in range(8)])])
    tie = ReserveThenAlign(0.2, cpu_bound_exact=True)
    tie.bind(cluster, [prior], random.Random(0))
    return tie


CPU_HEAVY = PodRequest("c", cpu_milli=1000)
GPU_HEAVY = PodRequest("g", cpu_milli=1000, gpu_count=8)


def arrived(prior: PodRequest, *pods: PodRequest) -> bool:
    tie = eight_gpu_tie(prior)
    for pod in pods:
        tie.observe(pod)
    return tie.cpu_bound()


def test_cpu_bound_warms_up_at_exactly_a_tenth_of_the_cpu_or_the_gpus() -> None:
    assert arrived(GPU_HEAVY, PodRequest("c", cpu_milli=6400))  # exactly 10 % of the CPU: warm, all CPU
    assert not arrived(GPU_HEAVY, PodRequest("c", cpu_milli=6399))  # just short: the workload decides
    assert not arrived(CPU_HEAVY, PodRequest("g", gpu_count=1, gpu_milli=800))  # 10 % of the GPU milli
    assert arrived(CPU_HEAVY, PodRequest("g", gpu_count=1, gpu_milli=799))


def test_cpu_bound_compares_shares_of_capacity_not_amounts() -> None:
    """Equal shares are not CPU-bound; 8 CPUs (12.5 %) against 4 GPUs (50 %) is GPU-bound although
    8,000 CPU milli are more than 4,000 GPU milli."""
    assert not arrived(CPU_HEAVY, PodRequest("e", cpu_milli=6400, gpu_count=1, gpu_milli=800))
    assert not arrived(CPU_HEAVY, PodRequest("g", cpu_milli=8000, gpu_count=4))
    assert arrived(GPU_HEAVY, PodRequest("c", cpu_milli=8000, gpu_count=1, gpu_milli=999))


def test_a_model_balance_not_yet_bound_has_no_effect() -> None:
    from scheduler.core.policies import ModelBalance

    cluster = ClusterState([eight_gpus("n")])
    balance = ModelBalance(0.2)
    balance.observe(PodRequest("a", gpu_count=1, gpu_models=frozenset({"A"})))
    assert balance.bands(PodRequest("any", gpu_count=1), cluster, cluster.all_indices) is None


def test_the_waste_band_breaks_ties_of_shares_only() -> None:
    """Pods of whole GPUs and of none are tied by the reserve and the alignment alone: the
    remainders a share would leave (which differ from node to node here) do not count for them."""
    nodes = [
        NodeState(f"n{i}", 64_000, 512_000, [GpuState(j, f"n{i}-g{j}", "A") for j in range(2)])
        for i in range(3)
    ]
    cluster = ClusterState(nodes)
    for i, milli in enumerate((300, 550, 900)):
        grants = (GpuGrant(0, f"n{i}-g0", milli),)
        cluster.assume(Allocation(f"n{i}", f"s{i}", cpu_milli=1000, gpus=grants, gpu_tag="share"))
    workload = [PodRequest(f"s{m}", cpu_milli=1000, gpu_count=1, gpu_milli=m) for m in (450, 700)]
    with_waste, without = ReserveThenAlign(0.2, 3, 10), ReserveThenAlign(0.2, 3, 0)
    for tie in (with_waste, without):
        tie.bind(cluster, workload, random.Random(0))
    idx = cluster.all_indices
    for pod in (PodRequest("w", cpu_milli=4000, gpu_count=1), PodRequest("c", cpu_milli=4000)):
        assert with_waste.score(pod, cluster, idx).tolist() == without.score(pod, cluster, idx).tolist()
    share = workload[0]  # least waste: n0 100 (on its free GPU), n1 0, n2 100
    assert with_waste.score(share, cluster, idx).argmax() == 1
    assert with_waste.score(share, cluster, idx).tolist() != without.score(share, cluster, idx).tolist()


# --- the RDMA books once some grants are given back (NicState.shortage_without) -------------------


def two_vf_pf() -> NicState:
    """One 100 Gbit/s PF with two VFs: ``vf0`` booked twice (overbooked) at 30 Gbit/s each, ``vf1``
    once at 39.999 Gbit/s; 1 Mbit/s is left."""
    nics = NicState([PfState("pf", 100_000, vfs=("vf0", "vf1"))])
    nics.apply([VfGrant("vf0", "pf", 30_000), VfGrant("vf0", "pf", 30_000), VfGrant("vf1", "pf", 39_999)], 1)
    return nics


def test_a_vf_booked_twice_is_free_only_once_both_holders_are_released() -> None:
    nics, first, second = two_vf_pf(), VfGrant("vf0", "pf", 30_000), VfGrant("vf0", "pf", 30_000)
    assert nics.shortage(RdmaRequest(1)) == NO_FREE_VFS
    assert nics.shortage_without(RdmaRequest(1), [first]) == NO_FREE_VFS  # still held by the other
    assert nics.shortage_without(RdmaRequest(1), [first, second]) == ""
    assert nics.shortage_without(RdmaRequest(2), [first, second]) == NO_FREE_VFS
    assert nics.shortage_without(RdmaRequest(2), [first, second, VfGrant("vf1", "pf", 39_999)]) == ""


def test_the_bandwidth_released_is_exactly_what_the_grants_reserved() -> None:
    nics, vf1 = two_vf_pf(), VfGrant("vf1", "pf", 39_999)
    assert nics.shortage_without(RdmaRequest(1, 40_000), [vf1]) == ""  # 1 + 39,999 left
    assert nics.shortage_without(RdmaRequest(1, 40_001), [vf1]) == NO_BANDWIDTH
    nics.apply([vf1], -1)  # vf1 free and exactly 40,000 Mbit/s left, nothing released
    assert nics.shortage(RdmaRequest(1, 40_000)) == ""
    assert nics.shortage(RdmaRequest(1, 40_001)) == NO_BANDWIDTH


def balance_cluster() -> ClusterState:
    """``a0`` (model A, 2 of 8 GPUs used: no whole-node host) and ``b0``, ``b1`` (model B, idle:
    the last two hosts of an 8-GPU pod)."""
    nodes = [
        NodeState(name, 96_000, 512_000, [GpuState(j, f"{name}-g{j}", model) for j in range(8)])
        for name, model in (("a0", "A"), ("b0", "B"), ("b1", "B"))
    ]
    cluster = ClusterState(nodes)
    grants = tuple(GpuGrant(j, f"a0-g{j}", 1000) for j in range(2))
    cluster.assume(Allocation("a0", "u", cpu_milli=1000, gpus=grants, gpu_tag="1-gpu"))
    return cluster


def test_the_model_balance_outweighs_the_reserve_and_the_waste_on_any_nodes() -> None:
    """Once a pod restricted to model A arrived, a share free to use any model goes to model B's
    nodes, though they are the last whole-node hosts (which the reserve would keep) and whatever
    the waste and reserve terms add up to; on any subset of the nodes too."""
    cluster = balance_cluster()
    share = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=500)
    workload = [PodRequest("big", cpu_milli=64_000, gpu_count=8), share]
    tie = ReserveThenAlign(0.2, keep=2, waste_band=10, balance=0.2)
    tie.bind(cluster, workload, random.Random(0))
    plain = ReserveThenAlign(0.2, keep=2, waste_band=10)
    plain.bind(cluster, workload, random.Random(0))
    tie.observe(PodRequest("a", cpu_milli=1000, gpu_count=1, gpu_models=frozenset({"A"})))
    idx = cluster.all_indices
    assert plain.score(share, cluster, idx).argmax() == 0  # the reserve alone keeps b0 and b1
    scores = tie.score(share, cluster, idx)
    assert scores[1] == scores[2] > scores[0]
    some = np.array([0, 2])
    assert tie.score(share, cluster, some).argmax() == 1


def used_evenly(specs: list[tuple[str, int, int, int]]) -> ClusterState:
    """Nodes ``(name, GPUs, milli used on each GPU, CPU milli used)`` of 64 CPUs and model A."""
    cluster = ClusterState(
        [
            NodeState(name, 64_000, 512_000, [GpuState(j, f"{name}-g{j}", "A") for j in range(gpus)])
            for name, gpus, _, _ in specs
        ]
    )
    for name, gpus, milli, cpu in specs:
        if milli:
            grants = tuple(GpuGrant(j, f"{name}-g{j}", milli) for j in range(gpus))
            cluster.assume(Allocation(name, f"u-{name}", cpu_milli=cpu, gpus=grants, gpu_tag="share"))
    return cluster


SHARE = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=500)
WITH_WHOLE_NODE = [PodRequest("big", cpu_milli=64_000, gpu_count=8), SHARE]


def test_remainders_within_one_waste_band_leave_the_alignment_to_decide() -> None:
    """The share leaves 9 milli on ``x`` and none on ``y``: one band of 10, so the better aligned
    ``x`` wins."""
    cluster = used_evenly([("x", 1, 491, 60_000), ("y", 1, 500, 2000)])
    tie = ReserveThenAlign(0.2, 2, 10)
    tie.bind(cluster, WITH_WHOLE_NODE, random.Random(0))
    idx = cluster.all_indices
    assert tie.aligned(SHARE, cluster, idx, 0.2).tolist() == [4.0, 2.0]
    assert tie.score(SHARE, cluster, idx).tolist() == [4.0, 2.0]


def test_the_reserve_outweighs_any_waste() -> None:
    """``a0`` is no whole-node host and its GPUs would keep 350 unfillable milli; ``b0`` and ``b1``,
    the last two hosts, would keep none: the reserve sends the share to ``a0`` all the same."""
    cluster = used_evenly([("a0", 8, 150, 1000), ("b0", 8, 0, 0), ("b1", 8, 0, 0)])
    tie = ReserveThenAlign(0.2, 2, 10)
    tie.bind(cluster, WITH_WHOLE_NODE, random.Random(0))
    scores = tie.score(SHARE, cluster, cluster.all_indices)
    assert scores.argmax() == 0 and scores[1] == scores[2]


def test_fgd_reserve_by_default_has_every_adaptive_rule() -> None:
    """``make_policy("fgd-reserve")`` (the simulator's default): 3 hosts kept per shape at least, more
    while the whole-node pods seen need them, the model guard above FGD, the model balance by need in
    bands of 0.2, and the alignment exact while CPU is the scarcer resource."""
    from scheduler.core.policies import ModelGuard, ModelNeed

    policy = make_policy("fgd-reserve")
    tie = policy.tie_break
    assert isinstance(tie, ReserveThenAlign)
    assert tie.reserve.fixed == 3 and tie.reserve.adaptive
    assert isinstance(tie.balance, ModelNeed) and tie.balance.band == 0.2 and tie.balance.horizon == 1.0
    assert any(isinstance(plugin, ModelGuard) for plugin, _ in policy.plugins)
    assert tie.cpu_bound_exact and tie.waste_band == 10 and tie.step == 0.2
    assert policy.description == (
        "shares complete GPUs first; GPU models kept for their restricted pods; FGD in bands; ties balance"
        " restricted GPU models, keep the last hosts"
        " of whole-node pods, then the least unfillable share remainder, then CPU/GPU alignment (ours)"
    )


def test_a_reserve_binds_to_a_cluster_without_nodes() -> None:
    """The live scheduler may bind its policy before any node is known."""
    policy = make_policy("fgd-reserve")
    policy.bind(ClusterState([]), [PodRequest("big", gpu_count=8)], random.Random(0))
    assert policy.tie_break.reserve.shapes == []  # type: ignore[union-attr]


def test_a_shape_without_hosts_among_the_nodes_asked_does_not_end_the_reserve() -> None:
    """Shapes (8 GPUs, 64 CPUs, 400 GB) and (8 GPUs, 90 CPUs): ``c`` has too little memory for the
    first but is one of the last two hosts of the second, so a small pod there is penalised when
    only ``c`` is asked about too."""
    from scheduler.core.policies import WholeNodeReserve

    cluster = ClusterState(
        [
            NodeState(name, 96_000, memory, [GpuState(j, f"{name}-g{j}", "A") for j in range(8)])
            for name, memory in (("a", 512_000), ("c", 300_000))
        ]
    )
    reserve = WholeNodeReserve(keep=2)
    big = PodRequest("big", cpu_milli=64_000, memory_mib=400_000, gpu_count=8)
    reserve.bind(cluster, [big, PodRequest("huge", cpu_milli=90_000, gpu_count=8)])
    assert reserve.shapes == [(8, 64_000, 400_000), (8, 90_000, 0)]
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    assert reserve.penalty(one, cluster, cluster.all_indices).tolist() == [2, 1]  # a: a host of both
    assert reserve.penalty(one, cluster, np.array([1])).tolist() == [1]


def test_a_share_of_1_milli_completes_a_gpu() -> None:
    from scheduler.core.policies import ShareCompletionScore

    cluster = used_evenly([("n", 1, 999, 0), ("m", 1, 500, 0)])
    pod = PodRequest("tiny", gpu_count=1, gpu_milli=1)
    assert scores_of(ShareCompletionScore(110), pod, cluster) == [2.0, 0.0]


def scores_of(plugin, pod: PodRequest, cluster: ClusterState) -> list[float]:
    plugin.bind(cluster, [pod], random.Random(0))
    return plugin.score(pod, cluster, cluster.all_indices).tolist()


def test_a_tie_breaker_not_yet_bound_scores_by_alignment() -> None:
    """Unbound (no workload, no arrivals), the exact-alignment rule reads no capacity and the score
    is the alignment bands (``AlignmentScore`` binds itself to the cluster)."""
    cluster = used_evenly([("x", 1, 0, 0), ("y", 1, 500, 30_000)])
    pod = PodRequest("p", cpu_milli=8000, gpu_count=1)
    tie = ReserveThenAlign(0.2, cpu_bound_exact=True)
    bands = ReserveThenAlign(0.2).aligned(pod, cluster, cluster.all_indices, 0.2)
    assert tie.score(pod, cluster, cluster.all_indices).tolist() == bands.tolist()


def test_an_adaptive_reserve_in_proportion_keeps_at_least_the_floor() -> None:
    """``keep=None`` with ``adaptive``: the floor under the adaptive count is ``MIN_KEEP``; unbound,
    the reserve penalises nothing."""
    from scheduler.core.policies import WholeNodeReserve

    cluster = ClusterState([eight_gpus(f"n{i}") for i in range(4)])
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    assert (
        WholeNodeReserve(None, adaptive=True).penalty(one, cluster, cluster.all_indices).tolist() == [0] * 4
    )
    reserve = WholeNodeReserve(None, adaptive=True)
    reserve.bind(cluster, [PodRequest("big", cpu_milli=64_000, gpu_count=8), one])
    assert reserve.keep_for(0, 0) == WholeNodeReserve.MIN_KEEP
    assert reserve.keep_for(0, 32_000) == 4  # 8 of the 9 GPUs asked need a host: ceil(8/9 x 4 nodes)


def test_a_pod_asking_neither_cpu_nor_gpus_is_aligned_0_everywhere() -> None:
    from scheduler.core.policies import AlignmentScore

    cluster = used_evenly([("x", 1, 0, 0), ("y", 1, 500, 30_000), ("z", 2, 1000, 64_000)])
    pod = PodRequest("m", memory_mib=1024)
    assert scores_of(AlignmentScore(), pod, cluster) == [0.0, 0.0, 0.0]
    assert scores_of(AlignmentScore(step=0.2), pod, cluster) == [0.0, 0.0, 0.0]


def test_a_policy_with_live_utilisation_says_so_in_its_description() -> None:
    base = make_policy("fgd-reserve")
    weighted = make_policy("fgd-reserve", utilization_weight=2.5)
    assert weighted.description == f"{base.description}; plus 2.5 x live GPU utilisation"
    assert make_policy("fgd-reserve", utilization_weight=0).description == base.description


def test_an_unknown_policy_names_the_known_ones() -> None:
    import pytest

    from scheduler.core import policy_names

    with pytest.raises(KeyError) as raised:
        make_policy("nope")
    assert raised.value.args[0] == f"unknown policy 'nope' (known: {', '.join(policy_names())})"


def test_a_policy_tells_every_plugin_and_its_tie_breaker_of_an_arrival() -> None:
    """No score plugin of the core adapts to arrivals yet (only the tie-breaker does); one that does
    is told of each pod as the tie-breaker is."""
    from scheduler.core.scoring import Policy, ScorePlugin

    class Seen(ScorePlugin):
        def __init__(self) -> None:
            self.pods: list[PodRequest] = []

        def observe(self, pod: PodRequest) -> None:
            self.pods.append(pod)

    first, second, tie = Seen(), Seen(), Seen()
    policy = Policy("p", ((first, 1.0), (second, 2.0)), tie_break=tie)
    pod = PodRequest("a", cpu_milli=1000)
    policy.observe(pod)
    assert first.pods == second.pods == tie.pods == [pod]
