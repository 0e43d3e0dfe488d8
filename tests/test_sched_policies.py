"""Each policy's score on hand-computed cases, the fragmentation measure, and schedule_one."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from scheduler.core import (
    Allocation,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    Placement,
    PodRequest,
    Unschedulable,
    make_policy,
    policy_names,
    schedule_one,
)
from scheduler.core.frag import FragModel, TypicalPod, after_share, after_whole, typical_pods
from scheduler.core.policies import (
    AlignmentScore,
    BestFitScore,
    DotProductScore,
    FGDScore,
    GpuClusteringScore,
    GpuPackingScore,
    RandomScore,
)

RNG = random.Random(0)


def gpu_node(name: str, n: int, cpu: int = 128_000, mem: int = 1_000_000) -> NodeState:
    return NodeState(name, cpu, mem, [GpuState(i, f"{name}-g{i}", "G") for i in range(n)])


def use(
    cluster: ClusterState,
    node: str,
    uid: str,
    cpu: int = 0,
    grants: tuple[tuple[int, int], ...] = (),
    tag: str = "share-gpu",
) -> None:
    gpus = tuple(GpuGrant(i, f"{node}-g{i}", milli) for i, milli in grants)
    cluster.assume(Allocation(node, uid, cpu_milli=cpu, gpus=gpus, gpu_tag=tag))


def scores(
    plugin, pod: PodRequest, cluster: ClusterState, workload: list[PodRequest] | None = None
) -> list[float]:
    plugin.bind(cluster, workload or [pod], random.Random(0))
    return plugin.score(pod, cluster, cluster.all_indices).tolist()


# -- the published baselines --------------------------------------------------------------------


def test_bestfit_hand_computed() -> None:
    """(1 - ((64000-32000)/128000 * .5 + (4000-1000)/8000 * .5)) * 100 = 68.75 -> 68."""
    cluster = ClusterState([gpu_node("big", 8), gpu_node("x", 8)])
    use(cluster, "x", "u", cpu=64_000, grants=tuple((i, 1000) for i in range(4)), tag="4-gpu")
    pod = PodRequest("p", cpu_milli=32_000, gpu_count=1)
    # big: (1 - (96000/128000*.5 + 7000/8000*.5)) * 100 = 18.75 -> 18
    assert scores(BestFitScore(), pod, cluster) == [18.0, 68.0]


def test_dotprod_hand_computed() -> None:
    """free (0.5, 0.5) . request (0.25, 0.125) = 0.1875; 100 * (1 - 0.1875 / 2) = 90.6 -> 90."""
    cluster = ClusterState([gpu_node("big", 8), gpu_node("x", 8)])
    use(cluster, "x", "u", cpu=64_000, grants=tuple((i, 1000) for i in range(4)), tag="4-gpu")
    pod = PodRequest("p", cpu_milli=32_000, gpu_count=1)
    # big: (1, 1) . (0.25, 0.125) = 0.375 -> 100 * (1 - 0.1875) = 81.25 -> 81
    assert scores(DotProductScore(), pod, cluster) == [81.0, 90.0]


def test_gpu_packing_bands() -> None:
    cluster = ClusterState([gpu_node("idle", 8), gpu_node("used", 4), gpu_node("idle2", 2)])
    use(cluster, "used", "u", grants=((1, 600),))  # used: free [1000, 400, 1000, 1000]
    share_small = PodRequest("a", gpu_count=1, gpu_milli=300)
    # idle 8: max(33-8, 8) = 25; used: the 400 GPU -> 100 - (40 // 10) = 96; idle 2: max(33-2, 2) = 31
    assert scores(GpuPackingScore(), share_small, cluster) == [25.0, 96.0, 31.0]
    share_big = PodRequest("b", gpu_count=1, gpu_milli=600)  # only a free GPU of the used node: 50-1
    assert scores(GpuPackingScore(), share_big, cluster) == [25.0, 49.0, 31.0]
    two = PodRequest("c", gpu_count=2)  # two free GPUs of a used node: 50 - 2
    assert scores(GpuPackingScore(), two, cluster) == [25.0, 48.0, 31.0]
    assert scores(GpuPackingScore(), PodRequest("cpu", cpu_milli=1), cluster) == [0.0, 0.0, 0.0]


def test_gpu_clustering_bands() -> None:
    cluster = ClusterState(
        [gpu_node("idle", 8), gpu_node("shares", 8), gpu_node("mixed", 8), gpu_node("ones", 8)]
    )
    use(cluster, "shares", "s1", grants=((0, 500),))  # free 7500: fill 25 * 500 // 8000 = 1
    use(cluster, "mixed", "s2", grants=((0, 500),))
    use(cluster, "mixed", "w1", grants=((1, 1000),), tag="1-gpu")  # free 6500: fill 25 * 1500 // 8000 = 4
    use(cluster, "ones", "w2", grants=((0, 1000),), tag="1-gpu")  # free 7000: fill 3
    share = PodRequest("p", gpu_count=1, gpu_milli=200)
    # idle: 0 + 25; shares only: 1 + 75; mixed incl. shares: 4 + 50; only other shapes: 3 + 0
    assert scores(GpuClusteringScore(), share, cluster) == [25.0, 76.0, 54.0, 3.0]
    one = PodRequest("q", gpu_count=1)
    assert scores(GpuClusteringScore(), one, cluster) == [25.0, 1.0, 54.0, 78.0]


def test_random_scores_one_node_and_a_random_fitting_gpu() -> None:
    cluster = ClusterState([gpu_node("a", 2), gpu_node("b", 2), gpu_node("c", 2)])
    use(cluster, "a", "u", grants=((0, 900),))
    plugin = RandomScore()
    picked = set()
    for _ in range(50):
        s = (
            scores(plugin, PodRequest("p", gpu_count=1, gpu_milli=500), cluster)
            if not picked
            else plugin.score(
                PodRequest("p", gpu_count=1, gpu_milli=500), cluster, cluster.all_indices
            ).tolist()
        )
        assert sorted(s) == [0.0, 0.0, 100.0]
        picked.add(s.index(100.0))
    assert picked == {0, 1, 2}
    assert {plugin.share_gpu(PodRequest("p", gpu_count=1, gpu_milli=500), cluster, 0) for _ in range(20)} == {
        1
    }


def test_alignment_hand_computed() -> None:
    """free (0.5, 0.25) vs request (0.1, 0.25): 0.1125 / (0.559017 * 0.269258) = 0.747409."""
    n = NodeState("n", 100_000, 1000, [GpuState(i, f"n-g{i}", "G") for i in range(4)])
    cluster = ClusterState([n])
    use(cluster, "n", "u", cpu=50_000, grants=tuple((i, 1000) for i in range(3)), tag="3-gpu")
    got = scores(AlignmentScore(), PodRequest("p", cpu_milli=10_000, gpu_count=1), cluster)
    assert got == [pytest.approx(0.747409, abs=1e-6)]
    assert scores(AlignmentScore(), PodRequest("nothing"), cluster) == [0.0]


# -- fragmentation and FGD ----------------------------------------------------------------------

WORKLOAD = [
    PodRequest("a1", cpu_milli=4000, gpu_count=1, gpu_milli=500),
    PodRequest("a2", cpu_milli=4000, gpu_count=1, gpu_milli=500),
    PodRequest("b", cpu_milli=8000, gpu_count=1),
    PodRequest("c", cpu_milli=2000),
]


def test_typical_pods_rank_and_normalise() -> None:
    typical = typical_pods(WORKLOAD)
    assert typical == [
        TypicalPod(4000, 500, 1, frozenset(), 0.5),
        TypicalPod(8000, 1000, 1, frozenset(), 0.25),  # ties by count: larger CPU first
        TypicalPod(2000, 0, 0, frozenset(), 0.25),
    ]
    # 50% coverage: the first shape alone reaches it, renormalised to 1
    assert typical_pods(WORKLOAD, coverage=0.5) == [TypicalPod(4000, 500, 1, frozenset(), 1.0)]


def test_fragmentation_of_a_hand_computed_node() -> None:
    """GPUs free [1000, 300], CPU free 6000, total 1300:
    share 500 (f .5): hostable, fragment = the 300 GPU -> 150;
    whole 1000 with 8000 CPU (f .25): CPU lacking, all 1300 -> 325;
    CPU-only (f .25): all 1300 -> 325. Fragmentation 800."""
    model = FragModel(typical_pods(WORKLOAD))
    assert model.frag(frozenset({"G"}), (1000, 300), 6000) == pytest.approx(800)
    assert model.frag(frozenset({"G"}), (1000, 300), 8000) == pytest.approx(150 + 0.25 * 300 + 325)
    assert model.frag(frozenset({"G"}), (0, 0), 6000) == 0
    assert after_share((1000, 300), 300, 200) == (1000, 100)
    assert after_share((1000, 300), 1000, 200) == (800, 300)
    assert after_whole((1000, 1000, 300), 2) == (300, 0, 0)


def fgd_cluster() -> ClusterState:
    node = NodeState("n", 7000, 100_000, [GpuState(0, "n-g0", "G"), GpuState(1, "n-g1", "G")])
    cluster = ClusterState([node])
    use(cluster, "n", "u", cpu=1000, grants=((1, 700),))  # free [1000, 300], CPU 6000
    return cluster


def test_fgd_score_and_gpu_choice_hand_computed() -> None:
    """A 200-milli share with 1000 CPU on the node above:
    on GPU 1 (300 -> 100): frag 50 + 275 + 275 = 600, decrease 200 -> int(100 sigmoid(0.2)) = 54;
    on GPU 0 (1000 -> 800): frag 150 + 275 + 275 = 700, decrease 100 -> int(100 sigmoid(0.1)) = 52."""
    cluster = fgd_cluster()
    pod = PodRequest("p", cpu_milli=1000, gpu_count=1, gpu_milli=200)
    fgd = FGDScore()
    assert scores(fgd, pod, cluster, WORKLOAD) == [54.0]
    assert fgd.share_gpu(pod, cluster, 0) == 1
    assert int(100 / (1 + math.exp(-0.2))) == 54 and int(100 / (1 + math.exp(-0.1))) == 52
    exact = FGDScore(exact=True)
    assert scores(exact, pod, cluster, WORKLOAD) == [pytest.approx(200)]


def test_fgd_memo_follows_node_changes() -> None:
    cluster = fgd_cluster()
    pod = PodRequest("p", cpu_milli=1000, gpu_count=1, gpu_milli=200)
    fgd = FGDScore()
    assert scores(fgd, pod, cluster, WORKLOAD) == [54.0]
    use(cluster, "n", "v", grants=((1, 300),))  # free [1000, 0]: only GPU 0 is left
    # frag before: 0.5*0 + 0.25*1000 + 0.25*1000 = 500; after [800, 0], CPU 5000: 0 + 200 + 200 = 400
    assert fgd.score(pod, cluster, cluster.all_indices).tolist() == [float(int(100 / (1 + math.exp(-0.1))))]
    assert fgd.share_gpu(pod, cluster, 0) == 0


# -- policies and schedule_one ------------------------------------------------------------------


def test_registry_has_every_policy() -> None:
    assert policy_names() == [
        "random",
        "dotprod",
        "gpupacking",
        "gpuclustering",
        "bestfit",
        "binpack",
        "spread",
        "fgd",
        "fgd-align",
        "fgd-reserve",
        "topology",
        "utilization",
    ]
    with pytest.raises(KeyError, match="unknown policy"):
        make_policy("nope")


def test_schedule_one_places_and_explains() -> None:
    cluster = ClusterState([gpu_node("a", 2, cpu=8000), gpu_node("b", 2, cpu=8000)])
    policy = make_policy("bestfit")
    policy.bind(cluster, [], RNG)
    use(cluster, "b", "u", cpu=4000, grants=((0, 1000),), tag="1-gpu")
    result = schedule_one(PodRequest("p", cpu_milli=1000, gpu_count=1), cluster, policy, RNG)
    assert isinstance(result, Placement) and result.node == "b" and result.feasible == 2
    assert [g.index for g in result.allocation.gpus] == [1]
    none = schedule_one(PodRequest("q", cpu_milli=9000, gpu_count=1), cluster, policy, RNG)
    assert isinstance(none, Unschedulable)
    assert none.message() == "0/2 nodes are available: 2 Insufficient cpu."


def test_equal_scores_follow_the_node_order_when_set() -> None:
    cluster = ClusterState([gpu_node(f"n{i}", 1) for i in range(5)])
    policy = make_policy("gpupacking")
    policy.bind(cluster, [], RNG)
    cluster.set_tie_order([3, 1, 4, 0, 2])
    pod = PodRequest("p", gpu_count=1)
    assert schedule_one(pod, cluster, policy, RNG).node == "n3"
    cluster.set_tie_order(None)
    seen = {schedule_one(pod, cluster, policy, random.Random(s)).node for s in range(40)}
    assert seen == {f"n{i}" for i in range(5)}


def test_fgd_align_breaks_fgd_ties_by_alignment() -> None:
    """Two nodes FGD scores equal for a CPU-only pod; the one with more CPU than GPU free wins.

    dense: half its CPU and GPUs free (0.5, 0.5), alignment 0.707; rich: (0.9, 0.5), 0.874.
    """
    cluster = ClusterState([gpu_node("dense", 8, cpu=96_000), gpu_node("rich", 2, cpu=100_000)])
    use(cluster, "dense", "d", cpu=48_000, grants=tuple((i, 1000) for i in range(4)), tag="4-gpu")
    use(cluster, "rich", "r", cpu=10_000, grants=((0, 1000),), tag="1-gpu")
    cluster.set_tie_order([0, 1])  # FGD alone would take "dense", the first in node order
    workload = [PodRequest("g", cpu_milli=8000, gpu_count=1), PodRequest("c", cpu_milli=12_000)]
    pod = PodRequest("cpu-job", cpu_milli=12_000)
    for name, expected in (("fgd", "dense"), ("fgd-align", "rich")):
        policy = make_policy(name)
        policy.bind(cluster, workload, RNG)
        assert schedule_one(pod, cluster, policy, RNG).node == expected, name


def test_scores_are_arrays_over_the_given_nodes() -> None:
    cluster = ClusterState([gpu_node("a", 2), gpu_node("b", 2), gpu_node("c", 2)])
    for name in policy_names():
        policy = make_policy(name)
        policy.bind(cluster, WORKLOAD, random.Random(0))
        got = policy.score(
            PodRequest("p", cpu_milli=1000, gpu_count=1, gpu_milli=300), cluster, np.array([2, 0])
        )
        assert got.shape == (2,), name


def test_fgd_bands_and_alignment_bands() -> None:
    banded = FGDScore(step=3)
    assert FGDScore().to_score(0.0) == 50.0 and banded.to_score(0.0) == 16.0  # 50 // 3
    assert banded.to_score(-60.0) == banded.to_score(0.0)  # 48 and 50: one band
    assert banded.to_score(-100.0) < banded.to_score(0.0)  # 47: the band below
    cluster = ClusterState([gpu_node("dense", 8, cpu=96_000), gpu_node("rich", 2, cpu=100_000)])
    use(cluster, "dense", "d", cpu=48_000, grants=tuple((i, 1000) for i in range(4)), tag="4-gpu")
    use(cluster, "rich", "r", cpu=10_000, grants=((0, 1000),), tag="1-gpu")
    pod = PodRequest("cpu-job", cpu_milli=12_000)
    fine, coarse = scores(AlignmentScore(), pod, cluster), scores(AlignmentScore(step=0.2), pod, cluster)
    assert fine == [0.707107, 0.874157]
    assert coarse == [3.0, 4.0]  # floor(cosine / 0.2)


def reserve_cluster(idle: int) -> ClusterState:
    """``idle`` idle 8-GPU nodes plus a used one; the workload has an 8-GPU, 64-CPU shape."""
    nodes = [gpu_node(f"idle{i}", 8, cpu=96_000) for i in range(idle)] + [gpu_node("used", 8, cpu=96_000)]
    cluster = ClusterState(nodes)
    use(cluster, "used", "u", cpu=4000, grants=((0, 1000),), tag="1-gpu")
    return cluster


# the 8-GPU shape is 1 pod in 61: too rare to be one of FGD's typical pods (95% of the pods)
WHOLE_NODE_WORKLOAD = (
    [PodRequest("big", cpu_milli=64_000, gpu_count=8)]
    + [PodRequest(f"one{i}", cpu_milli=4000, gpu_count=1) for i in range(30)]
    + [PodRequest(f"share{i}", cpu_milli=2000, gpu_count=1, gpu_milli=500) for i in range(20)]
    + [PodRequest(f"cpu{i}", cpu_milli=8000) for i in range(10)]
)


def test_whole_node_reserve_penalises_breaking_the_last_hosts() -> None:
    from scheduler.core.policies import WholeNodeReserve

    reserve = WholeNodeReserve(keep=2)
    many = reserve_cluster(3)
    reserve.bind(many, WHOLE_NODE_WORKLOAD)
    assert reserve.shapes == [(8, 64_000, 0)]
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    assert reserve.penalty(one, many, many.all_indices).tolist() == [0, 0, 0, 0]  # 3 hosts > keep
    few = reserve_cluster(2)
    reserve.bind(few, WHOLE_NODE_WORKLOAD)
    assert reserve.penalty(one, few, few.all_indices).tolist() == [1, 1, 0]  # the used node is no host
    share = PodRequest("share", cpu_milli=2000, gpu_count=1, gpu_milli=500)
    assert reserve.penalty(share, few, few.all_indices).tolist() == [1, 1, 0]
    small_cpu = PodRequest("cpu", cpu_milli=8000)  # 96 - 8 >= 64 CPUs: still a host afterwards
    assert reserve.penalty(small_cpu, few, few.all_indices).tolist() == [0, 0, 0]
    big_cpu = PodRequest("cpu", cpu_milli=40_000)
    assert reserve.penalty(big_cpu, few, few.all_indices).tolist() == [1, 1, 0]
    big = PodRequest("big", cpu_milli=64_000, gpu_count=8)
    assert reserve.penalty(big, few, few.all_indices).tolist() == [0, 0, 0]  # what the hosts are for


def test_fgd_reserve_keeps_a_whole_node_host_where_fgd_breaks_it() -> None:
    """Node order puts an idle node first; a 1-GPU pod ties on FGD: fgd takes the idle node, fgd-reserve
    the used one, so the rare 8-GPU pod still finds a node."""
    cluster = reserve_cluster(2)
    cluster.set_tie_order([0, 1, 2])
    pod = PodRequest("one", cpu_milli=4000, gpu_count=1)
    chosen = {}
    for name in ("fgd", "fgd-reserve"):
        policy = make_policy(name)
        policy.bind(cluster, WHOLE_NODE_WORKLOAD, RNG)
        chosen[name] = schedule_one(pod, cluster, policy, RNG).node
    assert chosen == {"fgd": "idle0", "fgd-reserve": "used"}


def test_whole_node_reserve_keeps_in_proportion_to_the_demand() -> None:
    from scheduler.core.policies import WholeNodeReserve

    cluster = ClusterState([gpu_node(f"n{i}", 8, cpu=96_000) for i in range(50)] + [gpu_node("s", 2)])
    # 8-GPU pods: 10 x 8000 of 800,000 milli demanded = 10% -> 10% of the 50 eight-GPU nodes
    workload = [PodRequest(f"big{i}", cpu_milli=64_000, gpu_count=8) for i in range(10)]
    workload += [PodRequest(f"one{i}", cpu_milli=4000, gpu_count=1) for i in range(720)]
    reserve = WholeNodeReserve()
    reserve.bind(cluster, workload)
    assert reserve.keep == 5
    reserve.bind(cluster, workload[10:])  # no whole-node pods: nothing to keep, the floor stays
    assert reserve.keep == WholeNodeReserve.MIN_KEEP and reserve.shapes == []
    assert WholeNodeReserve(keep=7).keep == 7


def test_adaptive_reserve_keeps_what_the_whole_node_pods_seen_need_of_the_free_gpus() -> None:
    from scheduler.core.policies import WholeNodeReserve

    cluster = ClusterState([gpu_node(f"n{i}", 8, cpu=96_000) for i in range(50)])  # 400 GPUs free
    big = PodRequest("big", cpu_milli=64_000, gpu_count=8)
    huge = PodRequest("huge", cpu_milli=90_000, gpu_count=8)
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    reserve = WholeNodeReserve(keep=1, adaptive=True)
    reserve.bind(cluster, [big, huge] + [one] * 84)  # prior: 8-GPU pods 16 of 100 GPUs asked
    assert reserve.shapes == [(8, 64_000, 0), (8, 90_000, 0)]
    free = 400_000
    # before any arrival, the workload's share: 16% (64-CPU hosts also host the 90-CPU pods), 8%
    assert [reserve.keep_for(k, free) for k in range(2)] == [8, 4]
    for pod in [huge] + [one] * 8:  # seen: 8 of 16 GPUs asked by a pod needing a 90-CPU host
        reserve.observe(pod)
    assert [reserve.keep_for(k, free) for k in range(2)] == [25, 25]
    assert [reserve.keep_for(k, free // 10) for k in range(2)] == [3, 3]  # fewer free GPUs, fewer kept
    assert [reserve.keep_for(k, 0) for k in range(2)] == [1, 1]  # never below the floor
    for _ in range(200):
        reserve.observe(one)
    assert [reserve.keep_for(k, free) for k in range(2)] == [2, 2]
    reserve.bind(cluster, [one])  # a new binding starts afresh, without whole-node shapes
    assert reserve.shapes == [] and reserve.seen_total == 0


def test_adaptive_reserve_penalises_the_last_hosts_it_keeps() -> None:
    from scheduler.core.policies import WholeNodeReserve

    few = reserve_cluster(3)  # 3 idle hosts of the 64-CPU shape, and a used node
    reserve = WholeNodeReserve(keep=0, adaptive=True)
    reserve.bind(few, WHOLE_NODE_WORKLOAD)
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    big = PodRequest("big", cpu_milli=64_000, gpu_count=8)
    reserve.observe(one)
    assert reserve.penalty(one, few, few.all_indices).tolist() == [0, 0, 0, 0]  # none kept
    for _ in range(3):
        reserve.observe(big)  # 24 of 25 GPUs seen were whole-node pods: keep ceil(0.96 * 31) nodes
    assert reserve.penalty(one, few, few.all_indices).tolist() == [1, 1, 1, 0]


def model_cluster() -> ClusterState:
    nodes = [
        NodeState(f"a{i}", 64_000, 1_000_000, [GpuState(j, f"a{i}-g{j}", "A") for j in range(4)])
        for i in range(2)
    ]
    nodes += [
        NodeState(f"b{i}", 64_000, 1_000_000, [GpuState(j, f"b{i}-g{j}", "B") for j in range(4)])
        for i in range(2)
    ]
    return ClusterState(nodes)


def test_model_balance_keeps_the_models_restricted_pods_need_once_they_arrive() -> None:
    from scheduler.core.policies import ModelBalance

    cluster = model_cluster()
    balance = ModelBalance(0.2)
    balance.bind(cluster)
    free_pod = PodRequest("any", cpu_milli=1000, gpu_count=1)
    only_a = PodRequest("a", cpu_milli=1000, gpu_count=1, gpu_models=frozenset({"A"}))
    assert balance.bands(free_pod, cluster, cluster.all_indices) is None  # no restricted pod seen yet
    balance.observe(only_a)
    assert balance.bands(only_a, cluster, cluster.all_indices) is None  # it may only go to A anyway
    assert balance.bands(PodRequest("cpu", cpu_milli=1000), cluster, cluster.all_indices) is None
    assert balance.bands(free_pod, cluster, cluster.all_indices).tolist() == [5, 5, 5, 5]
    use(cluster, "a0", "u1", cpu=1000, grants=((0, 1000), (1, 1000)), tag="1-gpu")  # A: 6 of 8 free
    assert balance.bands(free_pod, cluster, cluster.all_indices).tolist() == [3, 3, 5, 5]  # B untouched: 1


def test_fgd_reserve_sends_free_pods_away_from_a_model_restricted_pods_need() -> None:
    cluster = model_cluster()
    cluster.set_tie_order([0, 1, 2, 3])  # the node order would take a0
    use(cluster, "a0", "u1", cpu=1000, grants=((0, 1000),), tag="1-gpu")
    use(cluster, "b0", "u2", cpu=1000, grants=((0, 1000),), tag="1-gpu")
    free_pod = PodRequest("any", cpu_milli=1000, gpu_count=1)
    only_a = PodRequest("a", cpu_milli=1000, gpu_count=1, gpu_models=frozenset({"A"}))
    chosen = []
    for seen in ([], [only_a]):
        policy = make_policy("fgd-reserve")
        policy.bind(cluster, [free_pod], RNG)  # the workload as bound has no restricted pod
        for pod in seen:
            policy.observe(pod)
        chosen.append(schedule_one(free_pod, cluster, policy, RNG).node)
    assert chosen == ["a0", "b0"]


def test_alignment_is_exact_while_cpu_would_run_out_first() -> None:
    from scheduler.core.policies import ReserveThenAlign

    cluster = ClusterState([gpu_node("n", 8, cpu=64_000)])  # 64 CPUs, 8000 milli of GPU
    tie = ReserveThenAlign(0.2, cpu_bound_exact=True)
    gpu_heavy = [PodRequest("g", cpu_milli=4000, gpu_count=4)]  # 6% of the CPU for 50% of the GPU
    tie.bind(cluster, gpu_heavy, RNG)
    assert not tie.cpu_bound()
    tie.bind(cluster, [PodRequest("c", cpu_milli=40_000, gpu_count=1)], RNG)  # 62% of CPU, 12% of GPU
    assert tie.cpu_bound()
    tie.observe(PodRequest("g", cpu_milli=100, gpu_count=1, gpu_milli=500))  # 6% of the GPUs: too few
    assert tie.cpu_bound()
    tie.observe(gpu_heavy[0])  # 50% of the GPUs asked: the arrivals decide, not the workload bound
    assert not tie.cpu_bound()
    pod = PodRequest("p", cpu_milli=8000, gpu_count=4)
    banded = tie.score(pod, cluster, cluster.all_indices)
    tie.observe(PodRequest("c", cpu_milli=200_000))
    assert tie.cpu_bound()
    exact = tie.score(pod, cluster, cluster.all_indices)
    assert float(banded[0]).is_integer() and not float(exact[0]).is_integer()


def test_share_waste_table_is_what_no_common_share_size_fills() -> None:
    from scheduler.core.policies import share_waste_table

    workload = [PodRequest(f"a{i}", cpu_milli=1000, gpu_count=1, gpu_milli=810) for i in range(60)]
    workload += [PodRequest(f"b{i}", cpu_milli=1000, gpu_count=1, gpu_milli=160) for i in range(39)]
    workload += [PodRequest("rare", cpu_milli=1000, gpu_count=1, gpu_milli=50)]  # 1% of the shares: kept
    workload += [PodRequest("one", cpu_milli=1000, gpu_count=1)]  # whole GPUs are no share size
    waste = share_waste_table(workload)
    assert waste[0] == 0 and waste[40] == 40 and waste[50] == 0 and waste[190] == 30 and waste[970] == 0
    assert waste[1000] == 0 and waste[45] == 45 and len(waste) == 1001  # 1000 = 5 x 160 + 4 x 50
    assert share_waste_table(workload * 3).tolist() == waste.tolist()  # only the distribution counts
    assert share_waste_table(workload, min_share=0.05)[50] == 50  # the rare size left out
    assert share_waste_table([])[300] == 300


def test_share_completion_sends_a_share_where_it_completes_a_gpu() -> None:
    """A 160-milli share ties on nothing: completion takes the node whose GPU has 190 free (30 left), and
    that GPU; a share that completes nothing scores 0 everywhere and leaves the GPU to FGD."""
    from scheduler.core.policies import ShareCompletionScore

    cluster = ClusterState([gpu_node("idle", 2), gpu_node("half", 2), gpu_node("tight", 2)])
    use(cluster, "half", "h", cpu=1000, grants=((0, 500),))
    use(cluster, "tight", "t", cpu=1000, grants=((1, 810),))
    plugin = ShareCompletionScore(110)
    small = PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=160)
    assert scores(plugin, small, cluster) == pytest.approx([0.0, 0.0, 1.0 + 80 / 110])
    assert plugin.share_gpu(small, cluster, 2) == 1
    assert plugin.share_gpu(small, cluster, 0) is None
    fill = PodRequest("f", cpu_milli=1000, gpu_count=1, gpu_milli=500)  # exactly the half-used GPU
    assert scores(plugin, fill, cluster) == pytest.approx([0.0, 2.0, 0.0])
    assert plugin.share_gpu(fill, cluster, 1) == 0
    whole = PodRequest("w", cpu_milli=1000, gpu_count=1)
    assert scores(plugin, whole, cluster) == [0.0, 0.0, 0.0] and plugin.share_gpu(whole, cluster, 2) is None
    policy = make_policy("fgd-reserve")
    policy.bind(cluster, [small, fill], RNG)
    placed = schedule_one(small, cluster, policy, RNG)
    assert isinstance(placed, Placement) and placed.node == "tight"
    assert [g.index for g in placed.allocation.gpus] == [1]


def fifty_idle_nodes() -> tuple[ClusterState, PodRequest, PodRequest]:
    """50 idle 8-GPU nodes (400 GPUs, 400,000 milli), a whole-node pod and a 1-GPU pod."""
    cluster = ClusterState([gpu_node(f"n{i}", 8, cpu=96_000) for i in range(50)])
    big = PodRequest("big", cpu_milli=64_000, gpu_count=8)
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    return cluster, big, one


def test_adaptive_reserve_horizon_scales_the_expected_need() -> None:
    from scheduler.core.policies import WholeNodeReserve

    cluster, big, one = fifty_idle_nodes()
    plain, doubled = (
        WholeNodeReserve(keep=1, adaptive=True),
        WholeNodeReserve(keep=1, adaptive=True, horizon=2.0),
    )
    for reserve in (plain, doubled):
        reserve.bind(cluster, [big] + [one] * 92)  # prior: 8 of 100 GPUs asked need a host
    # 8% of 400 GPUs is 32 GPUs, 4 nodes' worth; twice that with a horizon of 2
    assert (plain.keep_for(0, 400_000), doubled.keep_for(0, 400_000)) == (4, 8)
    assert doubled.keep_for(0, 0) == 1  # the floor stays


def test_adaptive_reserve_weighs_the_workload_until_enough_has_arrived() -> None:
    """``prior_weight``: the workload's share counts as that share of the capacity arrived, so the first
    arrivals, none of them a whole-node pod, do not drop the keep to the floor at once."""
    from scheduler.core.policies import WholeNodeReserve

    cluster, big, one = fifty_idle_nodes()
    seen_only, weighted = (
        WholeNodeReserve(keep=1, adaptive=True),
        WholeNodeReserve(keep=1, adaptive=True, prior_weight=0.1),
    )
    for reserve in (seen_only, weighted):
        reserve.bind(cluster, [big] + [one] * 92)  # prior: 8%
        assert reserve.keep_for(0, 400_000) == 4  # before any arrival: the workload's
        for _ in range(40):  # 40,000 milli seen, none of a whole-node pod
            reserve.observe(one)
    assert seen_only.keep_for(0, 400_000) == 1  # the arrivals alone: no whole-node demand, the floor
    # (0 + 8% x 40,000) / (40,000 + 40,000) = 4% of 400 GPUs = 16 GPUs, 2 nodes' worth
    assert weighted.keep_for(0, 400_000) == 2
    assert weighted.prior_milli == 40_000.0


def test_reserve_by_need_keeps_the_last_big_hosts_from_smaller_whole_node_pods() -> None:
    """``by_need``: an 8-GPU pod of 64 CPUs may not break the last hosts of an 8-GPU, 90-CPU shape it
    does not need (without, a pod of as many whole GPUs as a shape breaks none of it); a pod of that
    shape may."""
    from scheduler.core.policies import WholeNodeReserve

    nodes = [gpu_node(f"big{i}", 8, cpu=96_000) for i in range(2)] + [gpu_node("small", 8, cpu=70_000)]
    cluster = ClusterState(nodes)
    big = PodRequest("big", cpu_milli=64_000, gpu_count=8)
    huge = PodRequest("huge", cpu_milli=90_000, gpu_count=8)
    workload = [big, huge] + [PodRequest(f"one{i}", cpu_milli=4000, gpu_count=1) for i in range(40)]
    old, new = WholeNodeReserve(keep=3), WholeNodeReserve(keep=3, by_need=True)
    for reserve in (old, new):
        reserve.bind(cluster, workload)
    assert old.penalty(big, cluster, cluster.all_indices).tolist() == [0, 0, 0]
    assert new.penalty(big, cluster, cluster.all_indices).tolist() == [1, 1, 0]  # goes to "small"
    assert new.penalty(huge, cluster, cluster.all_indices).tolist() == [0, 0, 0]  # its own hosts
    one = workload[2]
    assert (
        new.penalty(one, cluster, cluster.all_indices).tolist()
        == old.penalty(one, cluster, cluster.all_indices).tolist()
        == [2, 2, 1]
    )


def test_fgd_reserve_keeps_twice_the_need_weighs_the_workload_and_reserves_by_need() -> None:
    from scheduler.core.policies import RESERVE_HORIZON, RESERVE_PRIOR, ReserveThenAlign, fgd_reserve

    tie = fgd_reserve().tie_break
    assert isinstance(tie, ReserveThenAlign)
    assert (tie.reserve.horizon, tie.reserve.prior_weight, tie.reserve.by_need) == (2.0, 0.3, True)
    assert (RESERVE_HORIZON, RESERVE_PRIOR) == (2.0, 0.3)
    live = make_policy("topology").tie_break  # the live default keeps its rule
    assert isinstance(live, ReserveThenAlign)
    assert (live.reserve.horizon, live.reserve.prior_weight, live.reserve.by_need) == (1.0, 0.0, False)


def test_reserve_keeps_more_hosts_with_a_longer_horizon_given_for_one_decision() -> None:
    """``scarce_breaks(..., horizon)``: the horizon given for this decision replaces the reserve's own.
    8% of the 80,000 GPU milli asked need a host: with the own horizon (1) the keep is 1 node, with 10
    it is 8, so 8 hosts left are scarce and 9 are not."""
    from scheduler.core.policies import WholeNodeReserve

    big = PodRequest("big", cpu_milli=64_000, gpu_count=8)
    one = PodRequest("one", cpu_milli=4000, gpu_count=1)
    for hosts_left, scarce in ((8, True), (9, False)):
        cluster = ClusterState([gpu_node(f"n{i}", 8, cpu=96_000) for i in range(10)])  # 80,000 milli
        for i in range(10 - hosts_left):
            use(cluster, f"n{i}", f"p{i}", cpu=40_000)  # CPU taken: no longer a host of "big"
        reserve = WholeNodeReserve(keep=1, adaptive=True)
        reserve.bind(cluster, [big] + [one] * 92)  # prior: 8% of the GPUs asked need a host
        idx = cluster.all_indices
        assert reserve.scarce_breaks(one, cluster, idx) is None  # own horizon: keep 1
        ten = reserve.scarce_breaks(one, cluster, idx, 10.0)
        if scarce:
            assert ten is not None and ten.tolist() == [0.0] * (10 - hosts_left) + [1.0] * hosts_left
        else:
            assert ten is None
        assert reserve.horizon == 1.0  # the reserve's own is untouched


def test_the_cpu_horizon_applies_only_while_cpu_binds() -> None:
    """``ReserveThenAlign(cpu_horizon=...)``: the reserve's horizon for a decision is ``cpu_horizon``
    while the arrivals' CPU is the larger share of capacity, the reserve's own otherwise; with
    ``cpu_bound_exact`` the step is 0 then, without it the step stays."""
    from scheduler.core.policies import ReserveThenAlign

    cluster = ClusterState([NodeState("n", 64_000, 512_000, [GpuState(j, f"g{j}", "A") for j in range(8)])])
    for exact in (True, False):
        tie = ReserveThenAlign(0.2, cpu_bound_exact=exact, cpu_horizon=10.0)
        tie.bind(cluster, [PodRequest("g", cpu_milli=1000, gpu_count=4)], random.Random(0))
        assert tie._step_and_horizon() == (0.2, None)  # GPU-heavy workload: own horizon, bands
        for _ in range(2):
            tie.observe(PodRequest("c", cpu_milli=4000))  # 12.5% of the CPU, no GPU: CPU binds
        assert tie._step_and_horizon() == ((0.0 if exact else 0.2), 10.0)
    plain = ReserveThenAlign(0.2, cpu_bound_exact=True)  # no cpu_horizon: the reserve's own always
    plain.bind(cluster, [PodRequest("c", cpu_milli=60_000)], random.Random(0))
    assert plain._step_and_horizon() == (0.0, None)


def test_fgd_reserve_passes_a_cpu_horizon_and_neither_default_takes_one() -> None:
    """``RESERVE_CPU_HORIZON`` is off (10 put the default below FGD on a CPU-heavy multigpu20 mix);
    ``fgd_reserve(cpu_horizon=...)`` passes one to its tie-breaker."""
    from scheduler.core.policies import RESERVE_CPU_HORIZON, ReserveThenAlign, fgd_reserve

    assert RESERVE_CPU_HORIZON is None
    tie = fgd_reserve().tie_break
    assert isinstance(tie, ReserveThenAlign) and tie.cpu_horizon is None
    tie = fgd_reserve(cpu_horizon=10.0).tie_break
    assert isinstance(tie, ReserveThenAlign) and tie.cpu_horizon == 10.0
    live = make_policy("topology").tie_break
    assert isinstance(live, ReserveThenAlign) and live.cpu_horizon is None


def test_fgd_bands_widen_once_a_restricted_pod_arrived_when_asked() -> None:
    """``fgd_reserve(fgd_spec_step=8)``: the first arrived pod restricted to GPU models widens FGD's
    bands for the rest of the run (a new bind narrows them again); pods without a restriction, or
    restricted without GPUs, do not. Off in the default (``FGD_SPEC_STEP`` None) and in ``topology``
    (``TOPOLOGY_FGD_STEP`` 3)."""
    from scheduler.core.policies import FGD_SPEC_STEP, FGD_STEP, TOPOLOGY_FGD_STEP, FGDScore, fgd_reserve

    def fgd_of(policy) -> FGDScore:
        return next(p for p, _ in policy.plugins if isinstance(p, FGDScore))

    assert (FGD_STEP, FGD_SPEC_STEP, TOPOLOGY_FGD_STEP) == (3, None, 3)
    cluster = ClusterState([gpu_node(f"n{i}", 8) for i in range(4)])
    plain = PodRequest("plain", cpu_milli=1000, gpu_count=1)
    restricted = PodRequest("r", cpu_milli=1000, gpu_count=1, gpu_models=frozenset({"G"}))
    cpu_only = PodRequest("c", cpu_milli=1000, gpu_models=frozenset({"G"}))
    for policy, widened in (
        (fgd_reserve(fgd_spec_step=8), 8),
        (make_policy("fgd-reserve"), 3),
        (make_policy("topology"), 3),
    ):
        policy.bind(cluster, [plain, restricted], RNG)
        fgd = fgd_of(policy)
        policy.observe(plain)
        policy.observe(cpu_only)
        assert fgd.step == 3 and fgd.bounds() == (0.0, 33.0)
        policy.observe(restricted)
        assert fgd.step == widened and fgd.bounds() == (0.0, float(100 // widened))
        policy.bind(cluster, [plain], RNG)
        assert fgd.step == 3


def test_fgd_scores_in_the_wider_bands_after_the_switch() -> None:
    """The per-shape scores and memo hold banded scores: after the switch a pod's scores are those of
    a fresh plugin in the wider bands, not the narrow ones cached before."""
    cluster = ClusterState([gpu_node("a", 8), gpu_node("b", 8)])
    use(cluster, "a", "p", cpu=1000, grants=((0, 500),))
    workload = [PodRequest("s", cpu_milli=1000, gpu_count=1, gpu_milli=500), PodRequest("w", gpu_count=2)]
    pod = PodRequest("q", cpu_milli=1000, gpu_count=1, gpu_milli=300)
    switching = FGDScore(step=3, spec_step=8)
    switching.bind(cluster, workload, RNG)
    narrow = switching.score(pod, cluster, cluster.all_indices).tolist()
    switching.observe(PodRequest("r", gpu_count=1, gpu_models=frozenset({"G"})))
    wide = FGDScore(step=8)
    wide.bind(cluster, workload, RNG)
    after = switching.score(pod, cluster, cluster.all_indices).tolist()
    assert after == wide.score(pod, cluster, cluster.all_indices).tolist()
    assert after != narrow  # so a score kept from before the switch would have shown
