"""Score plugins at their documented edges: GPU packing's bands at exact fits and integer
percentages, clustering for CPU-only pods, the topology score's wishes, flat machines and per-machine
reference, fgd-reserve's unfillable-remainder tie-break, and the policy registry."""

from __future__ import annotations

import itertools
import random

import numpy as np

from devices.model import PCIeRelation, Topology, pair
from scheduler.core import (
    Allocation,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    PodRequest,
    TopologyWish,
    Wish,
    make_policy,
    policy_names,
)
from scheduler.core.policies import (
    BestFitScore,
    GpuClusteringScore,
    GpuPackingScore,
    ReserveThenAlign,
    TopologyScore,
    _single,
)


def gpu_node(name: str, n: int, enforced: tuple[int, ...] = ()) -> NodeState:
    return NodeState(
        name,
        128_000,
        1_000_000,
        [GpuState(i, f"{name}-g{i}", "G", share_enforced=i in enforced) for i in range(n)],
    )


def use(
    cluster: ClusterState, node: str, uid: str, grants: tuple[tuple[int, int], ...], tag: str = "share-gpu"
) -> None:
    gpus = tuple(GpuGrant(i, f"{node}-g{i}", milli) for i, milli in grants)
    cluster.assume(Allocation(node, uid, gpus=gpus, gpu_tag=tag))


def scores(plugin, pod: PodRequest, cluster: ClusterState, workload=None) -> list[float]:
    plugin.bind(cluster, workload or [pod], random.Random(0))
    return plugin.score(pod, cluster, cluster.all_indices).tolist()


# -- the registry ---------------------------------------------------------------------------------


def test_every_policy_is_named_by_its_registry_key_and_described() -> None:
    for name in policy_names():
        policy = make_policy(name)
        assert policy.name == name and policy.description and policy.plugins
    assert make_policy("fgd-align").tie_break is not None
    built = _single("x", BestFitScore, "best fit")()
    assert built.name == "x" and built.description == "best fit"
    assert (
        len(built.plugins) == 1
        and isinstance(built.plugins[0][0], BestFitScore)
        and built.plugins[0][1] == 1.0
    )
    topology = make_policy("topology")
    assert isinstance(topology.plugins[0][0], TopologyScore) and topology.plugins[0][1] == 1000.0
    assert topology.tie_break is not None


# -- GPU packing ----------------------------------------------------------------------------------


def test_gpu_packing_takes_percentages_in_whole_points() -> None:
    """A share on a used GPU scores 100 - (free %)/10 with both divisions integer: 499 free -> 49 %
    -> 96 (not 95, nor 95.1)."""
    cluster = ClusterState([gpu_node("used", 2)])
    use(cluster, "used", "u", ((0, 501),))  # GPU 0: 499 free
    assert scores(GpuPackingScore(), PodRequest("s", gpu_count=1, gpu_milli=300), cluster) == [96.0]


def test_gpu_packing_an_exact_fit_counts_as_room() -> None:
    cluster = ClusterState([gpu_node("used", 2)])
    use(cluster, "used", "u", ((0, 700),))  # GPU 0: 300 free
    assert scores(GpuPackingScore(), PodRequest("s", gpu_count=1, gpu_milli=300), cluster) == [97.0]


def test_gpu_packing_whole_gpus_on_a_used_node_score_at_least_33() -> None:
    cluster = ClusterState([gpu_node("wide", 24)])
    use(cluster, "wide", "u", ((0, 500),))
    assert scores(GpuPackingScore(), PodRequest("w", gpu_count=20), cluster) == [33.0]
    assert scores(GpuPackingScore(), PodRequest("w", gpu_count=3), cluster) == [47.0]


def test_gpu_packing_enforced_shares_look_only_at_enforcing_gpus() -> None:
    """GPU 0 is partly used but does not enforce shares; GPU 1 enforces and is free: an enforced
    share of 1 milli can only go to GPU 1, a free GPU of a used node (49)."""
    cluster = ClusterState([gpu_node("n", 2, enforced=(1,))])
    use(cluster, "n", "u", ((0, 500),))
    enforced = PodRequest("e", gpu_count=1, gpu_milli=1, enforced_share=True)
    assert scores(GpuPackingScore(), enforced, cluster) == [49.0]
    assert scores(GpuPackingScore(), PodRequest("e", gpu_count=1, gpu_milli=1), cluster) == [95.0]


def test_gpu_clustering_ignores_cpu_only_pods() -> None:
    cluster = ClusterState([gpu_node("a", 8), gpu_node("b", 8)])
    assert scores(GpuClusteringScore(), PodRequest("c", cpu_milli=1000), cluster) == [0.0, 0.0]


# -- topology score -------------------------------------------------------------------------------


def three_gpu_node(name: str) -> NodeState:
    """GPUs 0 and 1 behind one switch and on one NUMA node (50); 0 and 2 NVLinked across (110)."""
    ids = [f"{name}-g{i}" for i in range(3)]
    pcie = {pair(ids[i], ids[j]): PCIeRelation.SYS for i, j in itertools.combinations(range(3), 2)}
    pcie[pair(ids[0], ids[1])] = PCIeRelation.PIX
    gpus = [GpuState(i, ids[i], "G", numa=[0, 0, 1][i]) for i in range(3)]
    return NodeState(name, 64_000, 256_000, gpus, topology=Topology({pair(ids[0], ids[2]): 1}, pcie))


def test_topology_score_counts_preferences_met_and_link_quality() -> None:
    """100 x (PREFER wishes met / PREFER wishes) + int(100 x set score / best idle set score)."""
    cluster = ClusterState([three_gpu_node("t")])
    prefer = TopologyWish(same_numa=Wish.PREFER, same_pcie_switch=Wish.PREFER)
    # the preferred set (0, 1) meets both: 100 + int(100 * 50 / 110) = 145
    assert scores(TopologyScore(), PodRequest("p", gpu_count=2, topology=prefer), cluster) == [145.0]
    # no wish: the best-connected set (0, 2) is the reference itself
    assert scores(TopologyScore(), PodRequest("p", gpu_count=2), cluster) == [100.0]


def test_topology_score_of_a_machine_without_link_facts_is_full() -> None:
    flat = NodeState("flat", 64_000, 256_000, [GpuState(i, f"flat-g{i}", "G") for i in range(4)])
    cluster = ClusterState([flat])
    assert scores(TopologyScore(), PodRequest("p", gpu_count=2), cluster) == [100.0]


def test_topology_score_keeps_one_reference_per_machine_and_shape() -> None:
    """Two different machines in one cluster, two pod sizes scored one after the other: each score
    is the one the node gets alone."""
    from tests.test_sched_topology import dgx1_node

    alone = [
        scores(TopologyScore(), PodRequest("p", gpu_count=2), ClusterState([three_gpu_node("t")]))[0],
        scores(TopologyScore(), PodRequest("p", gpu_count=2), ClusterState([dgx1_node("d")]))[0],
    ]
    mixed = ClusterState([three_gpu_node("t"), dgx1_node("d")])
    mixed.assume(Allocation("d", "x", gpus=(GpuGrant(3, "d-gpu3"),)))  # d: (0, 3) gone, best left 230
    plugin = TopologyScore()
    plugin.bind(mixed, [], random.Random(0))
    two = plugin.score(PodRequest("p", gpu_count=2), mixed, mixed.all_indices).tolist()
    assert two[0] == alone[0] == 100.0
    assert two[1] == 92.0  # (1, 2) or (6, 7)... the look-ahead's 230 of the idle machine's best 250
    three = plugin.score(PodRequest("q", gpu_count=3), mixed, mixed.all_indices).tolist()
    assert three[0] == 100.0 and three != two
    assert alone[1] == 92.0


# -- fgd-reserve's remainder tie-break --------------------------------------------------------------


def test_reserve_then_align_prefers_the_remainder_other_shares_can_fill() -> None:
    """The workload's shares are all 500 milli. On node a the share leaves 500 free (another share
    fills it), on node b 300 (no share fills it): a is preferred; an exact fit (0 left) is as good."""
    cluster = ClusterState([gpu_node("a", 1), gpu_node("b", 1), gpu_node("exact", 1)])
    use(cluster, "b", "u", ((0, 200),))  # 800 free -> 300 left
    use(cluster, "exact", "v", ((0, 500),))  # 500 free -> 0 left
    share = PodRequest("s", gpu_count=1, gpu_milli=500)
    plugin = ReserveThenAlign(step=0.2, keep=3, waste_band=10)
    got = scores(plugin, share, cluster, workload=[share] * 10)
    assert got[0] > got[1] and got[2] > got[1]
    assert np.argmax(got) in (0, 2)


# -- FGD for shares asked by memory ---------------------------------------------------------------


def memory_node(name: str, cpu: int) -> NodeState:
    return NodeState(
        name, cpu, 1_000_000, [GpuState(i, f"{name}-g{i}", "G", memory_mib=16_000) for i in range(2)]
    )


def test_fgd_scores_a_share_by_memory_as_the_same_share_by_milli() -> None:
    """8000 MiB of a 16000 MiB GPU is a 500-milli share: FGD must score it (per GPU, the general
    path) as it scores the 500-milli request (the memoised path), with model-restricted typical
    pods and CPU that typical pods need after placement (node b has 10 CPUs: after a 4-CPU pod the
    8-CPU typical pod no longer fits there)."""
    from scheduler.core.policies import FGDScore

    cluster = ClusterState([memory_node("a", 64_000), memory_node("b", 10_000)])
    use(cluster, "a", "u", ((1, 600),))
    workload = [
        PodRequest(f"t{i}", cpu_milli=8000, gpu_count=1, gpu_milli=500, gpu_models=frozenset({"G"}))
        for i in range(6)
    ]
    workload += [PodRequest(f"w{i}", cpu_milli=2000, gpu_count=1) for i in range(4)]
    by_memory = PodRequest("m", cpu_milli=4000, gpu_count=1, gpu_memory_mib=8000)
    by_milli = PodRequest("s", cpu_milli=4000, gpu_count=1, gpu_milli=500)
    plugin = FGDScore()
    plugin.bind(cluster, workload, random.Random(0))
    got = plugin.score(by_memory, cluster, cluster.all_indices).tolist()
    assert got == plugin.score(by_milli, cluster, cluster.all_indices).tolist()
    assert got[0] != got[1]
    for i in (0, 1):
        assert plugin.share_gpu(by_memory, cluster, i) == plugin.share_gpu(by_milli, cluster, i)


# -- fgd-reserve's whole-node reserve -------------------------------------------------------------


def test_whole_node_reserve_counts_every_scarce_shape_a_placement_breaks() -> None:
    """Four idle-GPU nodes; whole-node shapes (8 GPUs with 8 / 60 CPUs and 1000 / 250,000 MiB).
    The 8-CPU shape has four hosts (more than keep = 1: not scarce). Only n0 has 60 CPUs free
    (exactly) and 250,000 MiB (exactly): it is the last host of the two 60-CPU shapes, and a
    placement there that takes a GPU, a milli CPU or a MiB too many breaks them."""
    from scheduler.core.policies import WholeNodeReserve

    nodes = [
        NodeState(f"n{i}", 64_000, 256_000, [GpuState(g, f"n{i}-g{g}", "G") for g in range(8)])
        for i in range(4)
    ]
    cluster = ClusterState(nodes)
    cluster.assume(Allocation("n0", "a0", cpu_milli=4000, memory_mib=6000))
    for i in (1, 2, 3):
        cluster.assume(Allocation(f"n{i}", f"a{i}", cpu_milli=10_000))
    workload = [
        PodRequest("A", cpu_milli=8000, memory_mib=1000, gpu_count=8),
        PodRequest("B", cpu_milli=60_000, memory_mib=1000, gpu_count=8),
        PodRequest("C", cpu_milli=60_000, memory_mib=250_000, gpu_count=8),
    ] + [PodRequest(f"s{i}", gpu_count=1, gpu_milli=500) for i in range(20)]
    reserve = WholeNodeReserve(keep=1)
    reserve.bind(cluster, workload)
    assert reserve.shapes == [(8, 8000, 1000), (8, 60_000, 1000), (8, 60_000, 250_000)]
    idx = cluster.all_indices

    def penalty(pod: PodRequest) -> list[float]:
        return reserve.penalty(pod, cluster, idx).tolist()

    assert penalty(PodRequest("gpu", gpu_count=1)) == [2, 0, 0, 0]
    assert penalty(PodRequest("share", gpu_count=1, gpu_milli=100)) == [2, 0, 0, 0]
    assert penalty(PodRequest("nothing")) == [0, 0, 0, 0]
    assert penalty(PodRequest("mib", memory_mib=1)) == [1, 0, 0, 0]
    assert penalty(PodRequest("milli", cpu_milli=1)) == [2, 0, 0, 0]
    assert penalty(PodRequest("whole", gpu_count=8, cpu_milli=1)) == [0, 0, 0, 0]  # such pods themselves


# -- share remainders and share completion --------------------------------------------------------


def test_share_waste_with_one_milli_shares_is_nothing() -> None:
    from scheduler.core.policies import share_waste_table

    waste = share_waste_table([PodRequest(f"s{i}", gpu_count=1, gpu_milli=1) for i in range(5)])
    assert waste[1] == 0 and waste[300] == 0 and waste.max() == 0


def test_share_remainders_honour_models_enforcement_and_memory() -> None:
    """Per GPU, the milli a share would leave (-1 where it cannot go): a model-restricted share only
    on its model, an enforced share only on enforcing GPUs, and on GPUs of known memory only where
    the memory fits too."""

    def share_remainders(pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
        return cluster.share_view(pod).left[idx]

    mixed = NodeState(
        "m", 64_000, 256_000, [GpuState(0, "m-g0", "X"), GpuState(1, "m-g1", "Y", share_enforced=True)]
    )
    cluster = ClusterState([mixed])
    use(cluster, "m", "u", ((0, 300), (1, 200)))  # free 700, 800
    idx = cluster.all_indices
    assert share_remainders(PodRequest("p", gpu_count=1, gpu_milli=500), cluster, idx).tolist() == [
        [200, 300]
    ]
    only_x = PodRequest("x", gpu_count=1, gpu_milli=500, gpu_models=frozenset({"X"}))
    assert share_remainders(only_x, cluster, idx).tolist() == [[200, -1]]
    enforced = PodRequest("e", gpu_count=1, gpu_milli=500, enforced_share=True)
    assert share_remainders(enforced, cluster, idx).tolist() == [[-1, 300]]
    # 16 GiB GPUs: GPU 0 has 700 milli but only 4 GiB free (a 500-milli share takes 8 GiB)
    memory = NodeState(
        "g", 64_000, 256_000, [GpuState(i, f"g-g{i}", "G", memory_mib=16_384) for i in range(2)]
    )
    cluster = ClusterState([memory])
    cluster.assume(
        Allocation("g", "v", gpus=(GpuGrant(0, "g-g0", 300, 12_288), GpuGrant(1, "g-g1", 200, 3_277)))
    )
    assert share_remainders(
        PodRequest("p", gpu_count=1, gpu_milli=500), cluster, cluster.all_indices
    ).tolist() == [[-1, 300]]


def test_share_completion_boundaries_and_gpu_choice() -> None:
    """A share completes a GPU when it leaves less than 110 milli (exactly 110 does not); the GPU
    left emptiest wins, the lowest index among equals; shares by memory only are not scored."""
    from scheduler.core.policies import ShareCompletionScore

    cluster = ClusterState([gpu_node("a", 3), gpu_node("b", 1)])
    use(cluster, "a", "u", ((0, 450), (1, 800), (2, 800)))  # a: 550, 200, 200 free
    use(cluster, "b", "v", ((0, 390),))  # b: 610 free
    plugin = ShareCompletionScore(110)
    share = PodRequest("s", gpu_count=1, gpu_milli=500)  # a: 50 left on GPU 0; b: exactly 110 left
    assert scores(plugin, share, cluster) == [1.0 + 60 / 110, 0.0]
    assert plugin.share_gpu(share, cluster, 0) == 0 and plugin.share_gpu(share, cluster, 1) is None
    small = PodRequest("t", gpu_count=1, gpu_milli=150)  # a: 400, 50, 50 left -> GPU 1 (first of equals)
    assert plugin.share_gpu(small, cluster, 0) == 1
    later = ClusterState([gpu_node("c", 2)])
    use(later, "c", "w", ((0, 450), (1, 480)))  # 550, 520 free: a 500 share leaves 50 / 20
    assert plugin.share_gpu(share, later, 0) == 1
    by_memory = PodRequest("m", gpu_count=1, gpu_memory_mib=1000)
    assert (
        scores(plugin, by_memory, cluster) == [0.0, 0.0] and plugin.share_gpu(by_memory, cluster, 0) is None
    )


def test_fgd_reserve_is_composed_as_documented() -> None:
    """Share completion weighted 1000 over the model guard weighted GUARD_WEIGHT over FGD in bands of
    FGD_STEP points (whole-node pods left out of its typical pods), ties to ReserveThenAlign (the model
    balance by need, the reserve, the remainder bands, alignment)."""
    from scheduler.core.policies import (
        ALIGN_STEP,
        COMPLETE_BELOW,
        FGD_STEP,
        GUARD_FILL,
        GUARD_WEIGHT,
        NEED_HORIZON,
        RESERVE_KEEP,
        WASTE_BAND,
        FGDScore,
        ModelGuard,
        ModelNeed,
        ShareCompletionScore,
    )

    policy = make_policy("fgd-reserve")
    (completion, w1), (guard, wg), (fgd, w2) = policy.plugins
    assert (
        isinstance(completion, ShareCompletionScore) and completion.below == COMPLETE_BELOW and w1 == 1000.0
    )
    # above FGD's bands (at most 33 points) and below completion (at least 1000)
    assert isinstance(guard, ModelGuard) and guard.fill == GUARD_FILL and wg == GUARD_WEIGHT
    assert 33.0 < wg * 1.0 < 1000.0
    assert (
        isinstance(fgd, FGDScore) and fgd.step == FGD_STEP and fgd.whole_node_typical is False and w2 == 1.0
    )
    tie = policy.tie_break
    assert isinstance(tie, ReserveThenAlign)
    assert tie.step == ALIGN_STEP and tie.reserve.keep == RESERVE_KEEP and tie.waste_band == WASTE_BAND
    assert isinstance(tie.balance, ModelNeed) and tie.balance.horizon == NEED_HORIZON


# -- plugins used before bind, or on a node not scored yet ----------------------------------------


def test_fgd_share_gpu_on_a_node_not_scored_yet() -> None:
    """The share's GPU is evaluated on demand. Typical pods are 500-milli shares: GPU 1 (300 free)
    can take none of them, so filling it with the 300-milli share removes 300 of fragment, while GPU 0
    (1000 free) would keep it: GPU 1."""
    from scheduler.core.policies import FGDScore

    cluster = ClusterState([gpu_node("a", 2)])
    use(cluster, "a", "u", ((1, 700),))
    share = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=300)
    plugin = FGDScore()
    typical = PodRequest("t", cpu_milli=1000, gpu_count=1, gpu_milli=500)
    plugin.bind(cluster, [typical] * 5, random.Random(0))
    assert plugin.share_gpu(share, cluster, 0) == 1
    assert plugin.share_gpu(PodRequest("w", gpu_count=1), cluster, 0) is None


def test_alignment_binds_itself_to_the_cluster_it_scores() -> None:
    """Scoring without bind (or after the cluster grew) uses the cluster's own capacities."""
    from scheduler.core.policies import AlignmentScore

    cluster = ClusterState([gpu_node("a", 4)])
    pod = PodRequest("p", cpu_milli=64_000, gpu_count=2)
    bound = AlignmentScore()
    bound.bind(cluster, [], random.Random(0))
    expected = bound.score(pod, cluster, cluster.all_indices).tolist()
    assert expected[0] > 0
    assert AlignmentScore().score(pod, cluster, cluster.all_indices).tolist() == expected
    assert AlignmentScore().score(PodRequest("nothing"), cluster, cluster.all_indices).tolist() == [0.0]


# -- the fragmentation measure's helpers ----------------------------------------------------------


def test_after_share_and_after_whole_keep_the_free_values_sorted() -> None:
    from scheduler.core.frag import after_share, after_whole

    assert after_share((1000, 1000, 300), 1000, 100) == (1000, 900, 300)
    assert after_share((1000, 700, 700, 300), 700, 200) == (1000, 700, 500, 300)
    assert after_share((1000, 300), 300, 300) == (1000, 0)
    assert after_whole((1000, 1000, 1000), 1) == (1000, 1000, 0)
    assert after_whole((1000, 1000, 500), 2) == (500, 0, 0)
    assert after_whole((1000, 500), 0) == (1000, 500)


def test_fragment_depends_on_the_typical_pods_models() -> None:
    """A typical 500-milli share of model X: on an X node the 300-milli GPU is its fragment; on a
    Y node it cannot run at all, so every free milli is fragment."""
    from scheduler.core.frag import FragModel, TypicalPod

    model = FragModel([TypicalPod(1000, 500, 1, frozenset({"X"}), 1.0)])
    assert model.frag(frozenset({"X"}), (1000, 300), 2000) == 300
    assert model.frag(frozenset({"Y"}), (1000, 300), 2000) == 1300
    assert model.frag(frozenset({"X"}), (1000, 300), 999) == 1300  # its CPU does not fit


# -- FGD's typical pods, score scale and shares on restricted GPUs --------------------------------


def test_fgd_typical_pods_leave_out_whole_node_pods_only_when_asked() -> None:
    def shapes(plugin, cluster, workload) -> set[int]:
        plugin.bind(cluster, workload, random.Random(0))
        return {t.gpu_count for t in plugin.model.typical}

    from scheduler.core.policies import FGDScore

    eight = ClusterState([gpu_node("a", 8)])
    workload = [PodRequest("w8", gpu_count=8)] * 3 + [PodRequest("w1", gpu_count=1)] * 3
    workload += [PodRequest("s", gpu_count=1, gpu_milli=300)] * 3 + [PodRequest("w4", gpu_count=4)] * 3
    assert FGDScore().whole_node_typical is True
    assert shapes(FGDScore(), eight, workload) == {8, 4, 1}
    assert shapes(FGDScore(whole_node_typical=False), eight, workload) == {4, 1}
    two = ClusterState([gpu_node("b", 2)])
    pairs = [PodRequest("w2", gpu_count=2)] * 3 + [PodRequest("w1", gpu_count=1)] * 3
    assert shapes(FGDScore(whole_node_typical=False), two, pairs) == {1}
    # coverage: the most frequent shapes covering that share of the pods
    assert len(FGDScore(coverage=0.25).model.typical) == 0
    plugin = FGDScore(coverage=0.25)
    plugin.bind(eight, workload, random.Random(0))
    assert len(plugin.model.typical) == 1


def test_fgd_score_scale() -> None:
    """int(100 * sigmoid(decrease / 1000)), in bands of ``step``: a decrease of 1387 is 80.0004."""
    from scheduler.core.policies import FGDScore

    assert FGDScore().to_score(1387) == 80 and FGDScore(step=3).to_score(1387) == 26
    assert FGDScore().to_score(0) == 50 and FGDScore(exact=True).to_score(1387) == 1387


def test_fgd_puts_a_model_restricted_share_on_its_model() -> None:
    """Node of an X and a Y GPU; the Y GPU (300 free) is where a share removes the most fragment,
    but the share asks for X: GPU 0."""
    from scheduler.core.policies import FGDScore

    node = NodeState("m", 64_000, 256_000, [GpuState(0, "m-g0", "X"), GpuState(1, "m-g1", "Y")])
    cluster = ClusterState([node])
    use(cluster, "m", "u", ((1, 700),))
    typical = PodRequest("t", cpu_milli=1000, gpu_count=1, gpu_milli=500)
    plugin = FGDScore()
    plugin.bind(cluster, [typical] * 5, random.Random(0))
    anywhere = PodRequest("a", cpu_milli=1000, gpu_count=1, gpu_milli=300)
    assert plugin.share_gpu(anywhere, cluster, 0) == 1
    only_x = PodRequest("x", cpu_milli=1000, gpu_count=1, gpu_milli=300, gpu_models=frozenset({"X"}))
    assert plugin.share_gpu(only_x, cluster, 0) == 0


def test_fgd_puts_a_share_only_where_its_memory_fits() -> None:
    """16 GiB GPUs; GPU 1 has 300 milli but only 2 GiB free: a 300-milli share (4.8 GiB) goes to GPU 0
    although GPU 1 would be FGD's choice by milli alone."""
    from scheduler.core.policies import FGDScore

    cluster = ClusterState(
        [NodeState("g", 64_000, 256_000, [GpuState(i, f"g-g{i}", "G", memory_mib=16_384) for i in range(2)])]
    )
    cluster.assume(Allocation("g", "v", gpus=(GpuGrant(1, "g-g1", 700, 14_336),)))
    typical = PodRequest("t", cpu_milli=1000, gpu_count=1, gpu_milli=500)
    plugin = FGDScore()
    plugin.bind(cluster, [typical] * 5, random.Random(0))
    share = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=300)
    plugin.score(share, cluster, cluster.all_indices)
    assert plugin.share_gpu(share, cluster, 0) == 0


def test_fgd_keeps_scoring_many_request_shapes() -> None:
    """More shapes than FGDScore.MAX_SHAPES: the oldest arrays are dropped, scores stay right."""
    from scheduler.core.policies import FGDScore

    cluster = ClusterState([gpu_node("a", 2), gpu_node("b", 2)])
    use(cluster, "b", "u", ((0, 1000),))
    plugin = FGDScore()
    plugin.bind(cluster, [PodRequest("t", cpu_milli=1000, gpu_count=1)] * 3, random.Random(0))
    first = plugin.score(PodRequest("p0", cpu_milli=1, gpu_count=1), cluster, cluster.all_indices).tolist()
    for k in range(FGDScore.MAX_SHAPES + 2):
        plugin.score(PodRequest(f"p{k}", cpu_milli=1 + k, gpu_count=1), cluster, cluster.all_indices)
    again = plugin.score(PodRequest("p0", cpu_milli=1, gpu_count=1), cluster, cluster.all_indices).tolist()
    assert (
        again
        == first
        == plugin.score(PodRequest("p0", cpu_milli=1, gpu_count=1), cluster, cluster.all_indices).tolist()
    )


def test_whole_node_reserve_keep_fixed_or_in_proportion() -> None:
    """keep given: that many hosts; None: the whole-node pods' share of the GPU demand times the
    hosts, at least 2. On 2-GPU nodes the whole-node shape is a 2-GPU pod."""
    from scheduler.core.policies import WholeNodeReserve

    cluster = ClusterState([gpu_node(f"n{i}", 2) for i in range(10)])
    workload = [PodRequest("w2", cpu_milli=1000, gpu_count=2)] * 6 + [PodRequest("w1", gpu_count=1)] * 8
    fixed = WholeNodeReserve(keep=1)
    fixed.bind(cluster, workload)
    assert fixed.keep == 1 and fixed.shapes == [(2, 1000, 0)]
    proportional = WholeNodeReserve()
    proportional.bind(cluster, workload)
    assert proportional.keep == 6  # ceil(10 hosts * 12000 / 20000 milli)
