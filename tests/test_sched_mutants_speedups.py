"""Cases the mutation run over issue 26's speed-ups found untested (docs/testing.md, "the speed-ups
of issue 26").

Issue 26 made ``fgd-reserve``'s scoring cheaper without moving a decision: ``Policy.score`` skips
the plugins that do not apply to a pod (``ScorePlugin.applies``), ``WholeNodeReserve`` and
``AlignmentScore`` keep per-node tables refreshed from the cluster's log of changes
(``ClusterState.changed_since``, ``NodeChanges``), ``ShareSlots.least_mapped`` refreshes its
summaries only after rows were taken. Each test here compares a fast path with what working it
out plainly gives, on the inputs a surviving mutant got wrong.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from scheduler.core import state as state_module
from scheduler.core.policies import (
    ONE_BY_ONE,
    AlignmentScore,
    NicNearnessScore,
    TopologyScore,
    WholeNodeReserve,
    fgd_reserve,
    make_policy,
)
from scheduler.core.request import MILLI, PodRequest, TopologyWish, Wish
from scheduler.core.scoring import Policy
from scheduler.core.state import Allocation, ClusterState, GpuGrant, GpuState, NodeChanges, NodeState
from scheduler.core.topology import load_machine
from tests import test_sched_policy_caches as caches

DGX = Path(__file__).resolve().parent.parent / "scheduler" / "data" / "topologies" / "dgx1-v100.json"


def mixed_cluster() -> ClusterState:
    """A DGX-1 (NVLinked GPUs), a PCIe-only 8-GPU node, two 4-GPU nodes with some GPUs partly used
    and a CPU-only node."""
    nodes = [
        NodeState.from_inventory("linked", 80_000, 512_000, load_machine(DGX, prefix="l-gpu")),
        NodeState("plain", 80_000, 512_000, [GpuState(i, f"p-gpu{i}", "V100", numa=0) for i in range(8)]),
        NodeState("four-a", 64_000, 256_000, [GpuState(i, f"a-gpu{i}", "T4") for i in range(4)]),
        NodeState("four-b", 32_000, 256_000, [GpuState(i, f"b-gpu{i}", "T4") for i in range(4)]),
        NodeState("cpu", 96_000, 256_000, []),
    ]
    cluster = ClusterState(nodes)
    cluster.book(Allocation("four-a", "a1", cpu_milli=4000, gpus=(GpuGrant(0, "a-gpu0", 600),)))
    cluster.book(Allocation("four-b", "b1", cpu_milli=4000, gpus=(GpuGrant(1, "b-gpu1", 950),)))
    pair_of_gpus = (GpuGrant(0, "p-gpu0"), GpuGrant(1, "p-gpu1"))
    cluster.book(Allocation("plain", "p1", cpu_milli=8000, gpus=pair_of_gpus))
    return cluster


PODS = [
    PodRequest("share-1", cpu_milli=1000, gpu_count=1, gpu_milli=1),  # the smallest share
    PodRequest("share-50", cpu_milli=1000, gpu_count=1, gpu_milli=50),
    PodRequest("share-400", cpu_milli=2000, gpu_count=1, gpu_milli=400),
    PodRequest("one", cpu_milli=4000, gpu_count=1),
    PodRequest("two", cpu_milli=4000, gpu_count=2, topology=TopologyWish(nvlink=Wish.PREFER)),
    PodRequest("two-plain", cpu_milli=4000, gpu_count=2),
    PodRequest("three", cpu_milli=4000, gpu_count=3),
    PodRequest("eight", cpu_milli=8000, gpu_count=8),
    PodRequest("cpu", cpu_milli=16_000),
]


def weighted_sum(policy: Policy, pod: PodRequest, cluster: ClusterState, idx: np.ndarray) -> np.ndarray:
    """The policy's score worked out plainly: every plugin, applying or not, weighted and summed."""
    total = np.zeros(len(idx))
    for plugin, weight in policy.plugins:
        total += weight * plugin.score(pod, cluster, idx)
    return total


@pytest.mark.parametrize("name", ["fgd-reserve", "topology", "fgd-align", "fgd", "bestfit"])
@pytest.mark.parametrize("live", [0.0, 3.0])
def test_a_policy_scores_the_weighted_sum_of_all_its_plugins(name: str, live: float) -> None:
    """Leaving out the plugins that do not apply changes no score: a 2-GPU pod still gets the
    topology score, the smallest share (1 milli) still the share completion score."""
    cluster = mixed_cluster()
    policy = make_policy(name, utilization_weight=live)
    policy.bind(cluster, PODS, random.Random(0))
    for pod in PODS:
        idx = np.array([i for i in range(len(cluster)) if cluster.gpu_count[i] >= pod.gpu_count])
        got = policy.score(pod, cluster, idx)
        assert got.dtype == np.float64
        assert np.array_equal(got, weighted_sum(policy, pod, cluster, idx)), pod.name


def test_the_plugins_that_apply_to_the_small_pods_score_them() -> None:
    """The reason the sums above must hold: the topology score is not 0 for a 2-GPU pod, the share
    completion not 0 for a 1-milli share."""
    cluster = mixed_cluster()
    idx = cluster.all_indices
    topology = make_policy("topology")
    topology.bind(cluster, PODS, random.Random(0))
    by_name = {plugin.name: plugin for plugin, _ in topology.plugins}
    two = next(p for p in PODS if p.name == "two")
    assert by_name["topology"].applies(two) and by_name["topology"].score(two, cluster, idx).any()
    reserve = make_policy("fgd-reserve")
    reserve.bind(cluster, PODS, random.Random(0))
    completion = reserve.plugins[0][0]
    share = PODS[0]
    assert completion.applies(share) and completion.score(share, cluster, idx).any()


# --- fgd-reserve's tie-breaker: its terms in order, however large each gets -------------------------


def node(name: str, gpus: int, cpu: int = 64_000, model: str = "G") -> NodeState:
    return NodeState(name, cpu, 512_000, [GpuState(g, f"{name}-g{g}", model) for g in range(gpus)])


def lexicographic_keys(
    policy: Policy, pod: PodRequest, cluster: ClusterState, idx: np.ndarray
) -> list[tuple[float, ...]]:
    """``ReserveThenAlign``'s documented order, term by term (higher is better): the model balance's
    band, then fewer broken whole-node hosts, then the unfillable remainder's band, then the
    alignment band."""
    rta = policy.tie_break
    exact = rta.cpu_bound_exact and rta.step and rta.cpu_bound()
    align = rta.aligned(pod, cluster, idx, 0.0 if exact else rta.step)
    waste = np.zeros(len(idx))
    if rta.waste_band and pod.is_share and pod.gpu_milli:
        waste = cluster.share_view(pod).least_mapped(rta.waste, MILLI + 1)[idx] // rta.waste_band
    penalty = rta.reserve.penalty(pod, cluster, idx)
    balance = rta.balance.bands(pod, cluster, idx) if rta.balance is not None else None
    balance = np.zeros(len(idx)) if balance is None else balance
    return [(b, -p, -w, a) for b, p, w, a in zip(balance, penalty, waste, align, strict=True)]


def assert_scores_follow_the_keys(policy: Policy, pod: PodRequest, cluster: ClusterState) -> np.ndarray:
    idx = cluster.all_indices
    scores = policy.tie_break.score(pod, cluster, idx)
    keys = lexicographic_keys(policy, pod, cluster, idx)
    for i in range(len(idx)):
        for j in range(len(idx)):
            names = (cluster.nodes[i].name, cluster.nodes[j].name)
            assert (scores[i] > scores[j]) == (keys[i] > keys[j]), names
    return scores


WHOLE_NODE = PodRequest("whole", gpu_count=8)  # a whole-node shape without CPU or memory
# the workload's only share size: remainders below 990 stay unfilled
SHARE_990 = PodRequest("s990", cpu_milli=1000, gpu_count=1, gpu_milli=990)
TINY = PodRequest("tiny", gpu_count=1, gpu_milli=10)  # a share asking no CPU


def test_a_broken_whole_node_host_outweighs_the_largest_unfillable_remainder() -> None:
    """The last 8-GPU host (CPU all booked: perfectly aligned for a share without CPU) against a
    1-GPU node where the share leaves 985 milli no workload share fills (band 98 of at most 100): the
    tie-breaker keeps the host, whatever the alignment says."""
    cluster = ClusterState([node("host", 8), node("single", 1)])
    cluster.book(Allocation("host", "cpu-hog", cpu_milli=64_000))
    cluster.book(Allocation("single", "used", gpus=(GpuGrant(0, "single-g0", 5),)))
    policy = make_policy("fgd-reserve")
    policy.bind(cluster, [WHOLE_NODE, SHARE_990, SHARE_990], random.Random(0))
    keys = lexicographic_keys(policy, TINY, cluster, cluster.all_indices)
    assert [k[1:3] for k in keys] == [(-1, 0), (0, -98)] and keys[0][3] > keys[1][3]
    scores = assert_scores_follow_the_keys(policy, TINY, cluster)
    assert scores[1] > scores[0]


def test_unfillable_remainders_in_one_band_tie_and_the_alignment_decides() -> None:
    """989 and 980 milli left unfillable are one band (98): the better aligned node wins, though its
    remainder is larger."""
    cluster = ClusterState([node("aligned", 1), node("roomy", 1)])
    cluster.book(Allocation("aligned", "cpu-hog", cpu_milli=64_000, gpus=(GpuGrant(0, "aligned-g0", 1),)))
    cluster.book(Allocation("roomy", "used", gpus=(GpuGrant(0, "roomy-g0", 10),)))
    policy = make_policy("fgd-reserve")
    policy.bind(cluster, [SHARE_990, SHARE_990], random.Random(0))
    keys = lexicographic_keys(policy, TINY, cluster, cluster.all_indices)
    assert keys[0][2] == keys[1][2] == -98 and keys[0][3] > keys[1][3]
    scores = assert_scores_follow_the_keys(policy, TINY, cluster)
    assert scores[0] > scores[1]


@pytest.mark.parametrize(
    ("parts", "y_band"),
    [({"guard_fill": None, "need_horizon": None}, 4), ({}, 0)],
    ids=["by-free-share", "by-need"],
)
def test_the_model_balance_outweighs_a_broken_host_and_a_large_remainder(parts: dict, y_band: int) -> None:
    """Once a pod restricted to model Y arrived, a share free to use any model goes to the unrestricted
    model X's last 8-GPU host (band 5) rather than to Y's node, though it breaks the host: Y's band is
    4 by its free share (999 of 1000 milli; the default before 2026-11-29), 0 by need (the default:
    the pod arrived restricted to Y asked all the GPU milli arrived, so Y's need is the cluster's 9
    GPUs over its 1, and 0.999 / 9 is below one band of 0.2)."""
    cluster = ClusterState([node("x-host", 8, model="X"), node("y-node", 1, model="Y")])
    cluster.book(Allocation("y-node", "used", gpus=(GpuGrant(0, "y-node-g0", 1),)))
    policy = fgd_reserve(**parts)
    policy.bind(cluster, [WHOLE_NODE, SHARE_990, SHARE_990], random.Random(0))
    policy.observe(PodRequest("only-y", gpu_count=1, gpu_models=frozenset({"Y"})))
    keys = lexicographic_keys(policy, TINY, cluster, cluster.all_indices)
    assert [k[:3] for k in keys] == [(5, -1, 0), (y_band, 0, -98)]
    scores = assert_scores_follow_the_keys(policy, TINY, cluster)
    assert scores[0] > scores[1]


# --- the whole-node reserve's host table ------------------------------------------------------------


def test_a_node_with_exactly_a_shapes_gpus_cpu_and_memory_free_hosts_it_node_by_node_too() -> None:
    """``hosts_at`` (a changed node, in Python) and ``hosts`` (numpy) agree at each bound: a node with
    exactly the shape's free GPUs, CPU and memory hosts it, one short of any of them does not; the
    cached penalty after such a change is the fresh one."""
    shape = PodRequest("whole", cpu_milli=8000, memory_mib=1000, gpu_count=4)
    nodes = [node(f"n{k}", 4, cpu=16_000) for k in range(5)]
    cluster = ClusterState(nodes)
    reserve = WholeNodeReserve(keep=3)
    reserve.bind(cluster, [shape])
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    reserve.penalty(one, cluster, cluster.all_indices)  # the table, before the changes below
    cluster.book(Allocation("n0", "exact", cpu_milli=8000, memory_mib=511_000))  # all three exactly
    cluster.book(Allocation("n1", "cpu-short", cpu_milli=8001, memory_mib=511_000))
    cluster.book(Allocation("n2", "memory-short", cpu_milli=8000, memory_mib=511_001))
    cluster.book(Allocation("n3", "gpu-short", cpu_milli=8000, gpus=(GpuGrant(0, "n3-g0", 1),)))
    assert cluster.mem_free[0] == 1000 and cluster.cpu_free[0] == 8000 and cluster.gpu_full_free[0] == 4
    vector = reserve.hosts(cluster, slice(None))
    assert vector[0].tolist() == [True, False, False, False, True]
    assert [reserve.hosts_at(cluster, i) for i in range(len(cluster))] == [(bool(v),) for v in vector[0]]
    fresh = WholeNodeReserve(keep=3)
    fresh.bind(cluster, [shape])
    idx = cluster.all_indices
    assert (
        reserve.penalty(one, cluster, idx).tolist()
        == fresh.penalty(one, cluster, idx).tolist()
        == [1.0, 0.0, 0.0, 0.0, 1.0]
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_the_caches_follow_bursts_of_every_size_and_a_log_that_no_longer_reaches_back(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two looks: one or a few changes (node by node), more than ``ONE_BY_ONE`` within the
    log (the changed rows at once), or more than the log keeps (every row), in a random order, so
    each path follows each other; the cached reserve and alignment give the fresh ones' values."""
    monkeypatch.setattr(state_module, "CHANGE_LOG", 48)  # keeps 48 to 96 changes
    rng = random.Random(seed)
    cluster = caches.cluster_of(40, seed)
    reserve = WholeNodeReserve(keep=3, adaptive=True)
    reserve.bind(cluster, caches.WORKLOAD)
    align = AlignmentScore()
    align.bind(cluster, caches.WORKLOAD, rng)
    paths = set()
    for step in range(40):
        burst = rng.choice((1, 2, 5, ONE_BY_ONE + 8, 60, 200))
        before = cluster.generation
        for k in range(burst):
            caches.random_change(cluster, rng, step * 1000 + k)
        rows = cluster.changed_since(before)
        paths.add("all" if rows is None else "some" if len(set(rows)) > ONE_BY_ONE else "one by one")
        idx = np.array(sorted(rng.sample(range(len(cluster)), 25)))
        fresh_reserve = WholeNodeReserve(keep=3, adaptive=True)
        fresh_reserve.bind(cluster, caches.WORKLOAD)
        fresh_align = AlignmentScore()
        fresh_align.bind(cluster, caches.WORKLOAD, rng)
        for pod in caches.PODS:
            assert (
                reserve.penalty(pod, cluster, idx).tolist()
                == fresh_reserve.penalty(pod, cluster, idx).tolist()
            )
            assert np.array_equal(
                align.aligned(pod, cluster, idx, 0.0), fresh_align.aligned(pod, cluster, idx, 0.0)
            )
    assert paths == {"all", "some", "one by one"}


def test_a_reserve_asked_about_another_cluster_starts_its_table_afresh() -> None:
    """The same plugin asked about a second cluster of the same size (the simulator's runs, a copy of
    the live state) reads that cluster's hosts, not the table it kept for the first, and back."""
    shape = PodRequest("whole", cpu_milli=8000, gpu_count=4)
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    first = ClusterState([node(f"n{k}", 4) for k in range(4)])
    second = ClusterState([node(f"n{k}", 4) for k in range(4)])
    for k in (0, 1, 2):
        second.book(Allocation(f"n{k}", f"p{k}", gpus=(GpuGrant(0, f"n{k}-g0"),)))  # one host left
    reserve = WholeNodeReserve(keep=1)
    reserve.bind(first, [shape])
    idx = first.all_indices
    assert reserve.penalty(one, first, idx).tolist() == [0.0] * 4  # four hosts: none scarce
    assert reserve.penalty(one, second, idx).tolist() == [0.0, 0.0, 0.0, 1.0]
    assert reserve.penalty(one, first, idx).tolist() == [0.0] * 4


def test_a_shape_without_hosts_does_not_hide_the_next_one() -> None:
    """Shapes in order (GPUs, CPU, memory): the first needs more memory than any node has (no host
    left to break), the next, more CPU and less memory, is down to its last host."""
    needs_memory = PodRequest("memory", cpu_milli=1000, memory_mib=600_000, gpu_count=4)
    needs_cpu = PodRequest("cpu", cpu_milli=40_000, memory_mib=1000, gpu_count=4)
    cluster = ClusterState([node("small", 4, cpu=16_000), node("big", 4, cpu=64_000)])
    reserve = WholeNodeReserve(keep=1)
    reserve.bind(cluster, [needs_memory, needs_cpu])
    assert reserve.shapes == [(4, 1000, 600_000), (4, 40_000, 1000)]
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    assert reserve.penalty(one, cluster, cluster.all_indices).tolist() == [0.0, 1.0]


def test_the_nodes_asked_about_may_host_only_a_later_shape() -> None:
    """Two scarce shapes, the first hosted only by a node not asked about: the second's last host,
    asked about, is still kept."""
    needs_memory = PodRequest("memory", cpu_milli=1000, memory_mib=400_000, gpu_count=4)
    needs_cpu = PodRequest("cpu", cpu_milli=40_000, memory_mib=1000, gpu_count=4)
    cluster = ClusterState([node("memory-rich", 4, cpu=16_000), node("cpu-rich", 4, cpu=64_000)])
    cluster.book(Allocation("cpu-rich", "m", memory_mib=200_000))
    reserve = WholeNodeReserve(keep=1)
    reserve.bind(cluster, [needs_memory, needs_cpu])
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    assert reserve.hosts(cluster, slice(None)).tolist() == [[True, False], [False, True]]
    assert reserve.penalty(one, cluster, np.array([1])).tolist() == [1.0]


def test_an_adaptive_reserve_keeps_exactly_as_many_hosts_as_the_demand_asks() -> None:
    """Adaptive: with only whole-node pods expected, all four idle 4-GPU nodes are to be kept
    (``keep_for`` 4, above ``keep``): four hosts are not more than that, so every one is scarce."""
    shape = PodRequest("whole", cpu_milli=1000, gpu_count=4)
    cluster = ClusterState([node(f"n{k}", 4) for k in range(4)])
    reserve = WholeNodeReserve(keep=1, adaptive=True)
    reserve.bind(cluster, [shape])
    assert reserve.keep_for(0, int(cluster.gpu_free_total.sum())) == 4
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    assert reserve.penalty(one, cluster, cluster.all_indices).tolist() == [1.0] * 4


def test_an_adaptive_reserve_with_hosts_to_spare_for_one_shape_still_keeps_the_next() -> None:
    """Adaptive, two shapes: the small-CPU one has five hosts, more than its demand asks to keep (2),
    the large-CPU one its last host, which a 1-GPU pod would break."""
    small = PodRequest("small", cpu_milli=1000, memory_mib=1000, gpu_count=4)
    large = PodRequest("large", cpu_milli=40_000, memory_mib=1000, gpu_count=4)
    shares = [PodRequest(f"s{k}", cpu_milli=1000, gpu_count=1, gpu_milli=500) for k in range(40)]
    cluster = ClusterState([*(node(f"n{k}", 4, cpu=16_000) for k in range(4)), node("cpu-rich", 4)])
    reserve = WholeNodeReserve(keep=1, adaptive=True)
    reserve.bind(cluster, [small, large, *shares])
    free = int(cluster.gpu_free_total.sum())
    assert reserve.shapes == [(4, 1000, 1000), (4, 40_000, 1000)]
    assert (reserve.keep_for(0, free), reserve.keep_for(1, free)) == (2, 1)
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    assert reserve.penalty(one, cluster, cluster.all_indices).tolist() == [0.0] * 4 + [1.0]


# --- the cluster's log of changes --------------------------------------------------------------------


def test_two_changes_come_back_once_each_and_ascending() -> None:
    """``NodeChanges.moved``: each changed node once, ascending, for two changes as for more (a node
    changed twice, two nodes changed in descending order)."""
    cluster = caches.cluster_of(8, 1)
    changes = NodeChanges(cluster)
    cluster.book(Allocation("n5", "a", cpu_milli=1000))
    cluster.book(Allocation("n2", "b", cpu_milli=1000))
    assert cluster.changed_since(cluster.generation - 2) == [5, 2]
    assert changes.moved() == [2, 5]
    cluster.book(Allocation("n3", "c", cpu_milli=1000))
    cluster.book(Allocation("n3", "c", cpu_milli=2000))
    assert changes.moved() == [3]
    cluster.forget("a")
    assert changes.moved() == [5]


def test_the_alignment_asked_about_another_cluster_reads_its_free_vectors() -> None:
    """As the reserve: the alignment's free vectors belong to one cluster; another of the same size
    and capacities, with other pods on it, gets its own cosines, and the first keeps its."""
    first = ClusterState([node(f"n{k}", 4) for k in range(4)])
    second = ClusterState([node(f"n{k}", 4) for k in range(4)])
    second.book(Allocation("n0", "cpu", cpu_milli=60_000))
    second.book(Allocation("n1", "gpus", gpus=(GpuGrant(0, "n1-g0"), GpuGrant(1, "n1-g1"))))
    pod = PodRequest("pod", cpu_milli=8000, gpu_count=1)
    align = AlignmentScore()
    align.bind(first, [pod], random.Random(0))
    idx = first.all_indices
    on_first = align.aligned(pod, first, idx, 0.0)
    fresh = AlignmentScore()
    fresh.bind(second, [pod], random.Random(0))
    assert np.array_equal(align.aligned(pod, second, idx, 0.0), fresh.aligned(pod, second, idx, 0.0))
    assert not np.array_equal(on_first, fresh.aligned(pod, second, idx, 0.0))
    assert np.array_equal(align.aligned(pod, first, idx, 0.0), on_first)


def test_a_pod_asking_neither_cpu_nor_gpu_is_aligned_nowhere() -> None:
    """Documented: 0 for a pod that asks for neither (a zero norm), every time, whichever path (most
    nodes or a few), also right after cosines that are not 0 (no value of an earlier call shows)."""
    cluster = caches.cluster_of(300, 2)  # arrays above numpy's small-buffer cache
    align = AlignmentScore()
    align.bind(cluster, caches.WORKLOAD, random.Random(0))
    nothing = PodRequest("nothing")
    for size in range(300, 0, -13):
        idx = np.arange(size)
        for pod in caches.PODS:
            assert align.aligned(pod, cluster, idx, 0.0).any()
            assert align.aligned(nothing, cluster, idx, 0.0).tolist() == [0.0] * size
            assert align.aligned(nothing, cluster, idx, 0.2).tolist() == [0.0] * size


def test_a_share_by_memory_hands_out_its_milli_read_only() -> None:
    """``ShareSlots``: every array it hands out is a read-only view, the per-slot milli of a share by
    memory too."""
    cluster = ClusterState([NodeState("n", 8000, 64_000, [GpuState(0, "n-g0", "G", memory_mib=16_384)])])
    view = cluster.share_view(PodRequest("mem", gpu_count=1, gpu_memory_mib=4096))
    assert isinstance(view.milli, np.ndarray) and view.milli.tolist() == [[250]]
    for array in (view.milli, view.fits, view.left, view.least_left):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 0


def test_an_adaptive_reserve_without_a_fixed_count_keeps_min_keep_at_least() -> None:
    """``keep=None`` with ``adaptive``: at least ``MIN_KEEP`` (2) hosts are kept however little the
    demand asks for; two 4-GPU hosts left of four are both scarce, three would not be."""
    shape = PodRequest("whole", cpu_milli=1000, gpu_count=4)
    shares = [PodRequest(f"s{k}", cpu_milli=1000, gpu_count=1, gpu_milli=500) for k in range(200)]
    cluster = ClusterState([node(f"n{k}", 4) for k in range(4)])
    reserve = WholeNodeReserve(keep=None, adaptive=True)
    reserve.bind(cluster, [shape, *shares])
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    cluster.book(Allocation("n0", "p0", gpus=(GpuGrant(0, "n0-g0"),)))
    assert reserve.keep_for(0, int(cluster.gpu_free_total.sum())) == WholeNodeReserve.MIN_KEEP == 2
    assert reserve.penalty(one, cluster, cluster.all_indices).tolist() == [0.0] * 4  # three hosts
    cluster.book(Allocation("n1", "p1", gpus=(GpuGrant(0, "n1-g0"),)))
    assert reserve.penalty(one, cluster, cluster.all_indices).tolist() == [0.0, 0.0, 1.0, 1.0]


def test_the_alignment_reads_a_node_of_one_milli_cpu_in_its_own_capacity() -> None:
    """Fractions of the node's own capacity, down to a node of 1 milli CPU: its free vector is (1, 1),
    so a GPU pod asking no CPU meets it at 45 degrees."""
    cluster = ClusterState([NodeState("tiny", 1, 1024, [GpuState(0, "tiny-g0", "G")]), node("big", 1)])
    align = AlignmentScore()
    align.bind(cluster, [], random.Random(0))
    gpu_only = PodRequest("gpu-only", gpu_count=1)
    assert align.aligned(gpu_only, cluster, np.array([0]), 0.0).tolist() == [round(2**-0.5, 6)]


def test_a_policy_none_of_whose_plugins_applies_scores_zero_everywhere() -> None:
    """A policy of the topology and NIC scores alone, for a 1-GPU pod without interfaces: neither
    applies, the score is 0 on every node asked about."""
    cluster = mixed_cluster()
    policy = Policy("links", ((TopologyScore(), 1000.0), (NicNearnessScore(), 1000.0)))
    policy.bind(cluster, PODS, random.Random(0))
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    assert policy.score(one, cluster, np.array([0, 1, 3])).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("weight", [2.0, 0.5, -1.0])
def test_every_weight_multiplies_its_plugin(weight: float) -> None:
    """``topology``'s plugins, each weighed ``weight`` instead: still the plain weighted sum."""
    cluster = mixed_cluster()
    base = make_policy("topology")
    policy = Policy("reweighed", tuple((plugin, weight) for plugin, _ in base.plugins))
    policy.bind(cluster, PODS, random.Random(0))
    for pod in PODS:
        idx = np.array([i for i in range(len(cluster)) if cluster.gpu_count[i] >= pod.gpu_count])
        assert np.array_equal(policy.score(pod, cluster, idx), weighted_sum(policy, pod, cluster, idx)), (
            pod.name
        )


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_least_mapped_takes_the_least_over_the_fitting_slots_of_an_integer_or_float_table(
    dtype: type,
) -> None:
    """``ShareSlots.least_mapped`` (``_least_of`` and its largest value per dtype) against the
    least worked out slot by slot, for a table of integers and one of floats (negative values
    included: the start of the minimum must lie above every value, not at 0)."""
    rng = random.Random(5)
    cluster = caches.cluster_of(30, 5)
    for k in range(120):
        caches.random_change(cluster, rng, k)
    pod = PodRequest("share", cpu_milli=1000, gpu_count=1, gpu_milli=300)
    table = np.array([rng.randint(-50, 50) for _ in range(MILLI + 1)], dtype=dtype)
    view = cluster.share_view(pod)
    got = view.least_mapped(table, MILLI + 1)
    for i in range(len(cluster)):
        fitting = [
            table[min(max(int(left), 0), MILLI)]
            for left, fits in zip(view.left[i], view.fits[i], strict=True)
            if fits
        ]
        assert got[i] == (min(fitting) if fitting else MILLI + 1), i
    assert (got < 0).any() and (got == MILLI + 1).any()
