"""The scheduling core's contracts, case by case: weighted policies, ties, explanations, device
choice, the request rule and the state's bookkeeping. Written to tell right from wrong (each
assertion fails for a plausible small bug; see docs/testing.md, mutation testing)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core import (
    MILLI,
    Allocation,
    AllocationConflict,
    ClusterState,
    ContainerRequest,
    GpuGrant,
    GpuState,
    NodeState,
    Placement,
    PodRequest,
    Policy,
    ScorePlugin,
    Taint,
    TaintEffect,
    Toleration,
    TopologyWish,
    Unschedulable,
    Wish,
    allocate,
    failed_nodes,
    make_policy,
    run_filters,
    schedule_one,
    unschedulable_message,
)
from scheduler.core.allocate import best_fit_share_gpu, split_containers
from scheduler.core.request import ContainerKind, container_gpus, effective_request
from scheduler.core.schedule import pick


def node(name: str, gpus: int = 2, cpu: int = 8000, mem: int = 8000, memory_mib: int = 0, **kw) -> NodeState:
    return NodeState(
        name, cpu, mem, [GpuState(i, f"{name}-g{i}", "A100", memory_mib) for i in range(gpus)], **kw
    )


class Fixed(ScorePlugin):
    """Scores from a table (node name -> score); remembers what it was given."""

    def __init__(self, table: dict[str, float], share: int | None = None) -> None:
        self.table = table
        self.share = share
        self.bound: tuple = ()
        self.scored: list[list[str]] = []

    def bind(self, cluster, workload, rng) -> None:
        self.bound = (cluster, tuple(workload), rng)

    def score(self, pod, cluster, idx) -> np.ndarray:
        names = [cluster.nodes[i].name for i in idx.tolist()]
        self.scored.append(names)
        return np.array([self.table[n] for n in names], dtype=float)

    def share_gpu(self, pod, cluster, i) -> int | None:
        return self.share


# --- the GPU filter ---------------------------------------------------------------------------------


def test_a_milli_share_needs_its_part_of_the_gpus_memory() -> None:
    """A 300-milli share of a 40 GB GPU takes 12000 MiB: a GPU with 4000 MiB free cannot take it."""
    n = node("n", gpus=1, memory_mib=40_000)
    cluster = ClusterState([n])
    cluster.assume(Allocation("n", "hog", gpus=(GpuGrant(0, "n-g0", 100, 36_000),), gpu_tag="share-gpu"))
    assert n.gpus[0].free_milli == 900 and n.gpus[0].free_memory_mib == 4000
    idx, why = run_filters(PodRequest("s", gpu_count=1, gpu_milli=300), cluster)
    assert idx.tolist() == [] and why == {"no GPU with 300 milli free": 1}
    assert run_filters(PodRequest("small", gpu_count=1, gpu_milli=100), cluster)[0].tolist() == [0]
    assert allocate(PodRequest("s", gpu_count=1, gpu_milli=300), n) is None


def test_a_share_by_memory_and_models_on_mixed_nodes() -> None:
    small = NodeState("t4", 8000, 8000, [GpuState(0, "t", "T4", 16_000)])
    big = NodeState("a100", 8000, 8000, [GpuState(0, "a", "A100", 80_000)])
    cluster = ClusterState([small, big])
    by_memory = PodRequest("m", gpu_count=1, gpu_memory_mib=20_000)
    assert run_filters(by_memory, cluster)[0].tolist() == [1]
    only_t4 = PodRequest("t", gpu_count=1, gpu_milli=100, gpu_models=frozenset({"T4"}))
    idx, why = run_filters(only_t4, cluster)
    assert idx.tolist() == [0]
    wrong = PodRequest("x", gpu_count=1, gpu_milli=100, gpu_models=frozenset({"H100"}))
    assert run_filters(wrong, cluster)[1] == {"no GPU of model H100": 2}
    whole_t4 = PodRequest("w", gpu_count=1, gpu_models=frozenset({"T4"}))
    assert run_filters(whole_t4, cluster)[0].tolist() == [0]
    cluster.assume(Allocation("t4", "u", gpus=(GpuGrant(0, "t", 500, 8000),), gpu_tag="share-gpu"))
    assert run_filters(whole_t4, cluster)[1] == {"no GPU of model T4": 1, "Insufficient nvidia.com/gpu": 1}
    assert run_filters(by_memory, cluster)[1] == {}  # a100 still fits
    assert failed_nodes(by_memory, cluster) == {"t4": "no GPU with 20000 MiB free"}


def test_failed_nodes_name_every_reason_of_each_node() -> None:
    tainted = node("tainted", taints=(Taint("gpu", "x"),))
    labelled = NodeState("labelled", 1000, 1000, [], labels={"pool": "a"})
    cluster = ClusterState([tainted, labelled, node("free")])
    pod = PodRequest("p", cpu_milli=2000, memory_mib=2000, gpu_count=1, node_selector={"pool": "a"})
    assert failed_nodes(pod, cluster) == {
        "tainted": "node(s) didn't match Pod's node affinity/selector",
        "labelled": "Insufficient cpu, Insufficient memory",
        "free": "node(s) didn't match Pod's node affinity/selector",
    }
    assert failed_nodes(pod, cluster, among=np.array([1])) == {
        "labelled": "Insufficient cpu, Insufficient memory"
    }
    tolerant = PodRequest("t", gpu_count=1, tolerations=(Toleration("gpu", "Equal", "y"),))
    assert failed_nodes(tolerant, cluster) == {
        "tainted": "node(s) had untolerated taint {gpu: x}",
        "labelled": "Insufficient nvidia.com/gpu",
    }
    assert unschedulable_message(3, {}) == "0/3 nodes are available."


def test_required_topology_is_explained_with_every_wish() -> None:
    cluster = ClusterState([node("n", gpus=4)])
    wish = TopologyWish(nvlink=Wish.REQUIRE, same_numa=Wish.REQUIRE, same_pcie_switch=Wish.REQUIRE)
    idx, why = run_filters(PodRequest("p", gpu_count=2, topology=wish), cluster)
    assert idx.tolist() == []
    assert why == {"no NVLink-connected same-PCIe-switch single-NUMA set of 2 GPUs": 1}
    prefer = TopologyWish(nvlink=Wish.PREFER)
    assert run_filters(PodRequest("p", gpu_count=2, topology=prefer), cluster)[0].tolist() == [0]
    assert wish.required() and wish.any() and prefer.any() and not prefer.required()
    assert not TopologyWish().any()


def test_taints_and_tolerations() -> None:
    no_exec = Taint("k", "v", TaintEffect.NO_EXECUTE)
    prefer = Taint("soft", "", TaintEffect.PREFER_NO_SCHEDULE)
    n = node("n", taints=(no_exec, prefer))
    assert n.schedulable_taints() == (no_exec,)
    assert str(no_exec) == "{k: v}" and str(prefer) == "{soft}"
    assert Toleration("k", "Equal", "v").tolerates(no_exec)
    assert not Toleration("k", "Equal", "w").tolerates(no_exec)
    assert Toleration("k", "Exists").tolerates(no_exec)
    assert Toleration("", "Exists").tolerates(no_exec)
    assert not Toleration("other", "Exists").tolerates(no_exec)
    assert not Toleration("k", "Equal", "v", effect="NoSchedule").tolerates(no_exec)
    assert Toleration("k", "Equal", "v", effect="NoExecute").tolerates(no_exec)
    cluster = ClusterState([n, node("plain")])
    assert run_filters(PodRequest("p"), cluster)[0].tolist() == [1]
    assert run_filters(PodRequest("p", tolerations=(Toleration("k", "Exists"),)), cluster)[0].tolist() == [
        0,
        1,
    ]


# --- policies and the decision ------------------------------------------------------------------------


def test_weighted_policy_sums_and_scales() -> None:
    cluster = ClusterState([node("a"), node("b"), node("c")])
    first, second = Fixed({"a": 1, "b": 2, "c": 3}), Fixed({"a": 10, "b": 0, "c": 1})
    both = Policy("both", ((first, 2.0), (second, 0.5)))
    assert both.score(PodRequest("p"), cluster, cluster.all_indices).tolist() == [7.0, 4.0, 6.5]
    single = Policy("single", ((Fixed({"a": 1, "b": 2, "c": 3}), 3.0),))
    assert single.score(PodRequest("p"), cluster, np.array([2, 0])).tolist() == [9.0, 3.0]
    unit = Policy("unit", ((Fixed({"a": 1, "b": 2, "c": 3}), 1.0),))
    assert unit.score(PodRequest("p"), cluster, np.array([1])).tolist() == [2.0]


def test_bind_reaches_every_plugin_and_the_tie_breaker() -> None:
    cluster = ClusterState([node("a")])
    plugin, breaker = Fixed({"a": 0}), Fixed({"a": 0})
    policy = Policy("p", ((plugin, 1.0),), tie_break=breaker)
    rng = random.Random(5)
    workload = [PodRequest("w")]
    policy.bind(cluster, workload, rng)
    assert plugin.bound == (cluster, tuple(workload), rng) == breaker.bound
    policy.bind(cluster, workload)
    assert isinstance(breaker.bound[2], random.Random)


def test_the_heaviest_plugin_with_an_opinion_picks_the_shares_gpu() -> None:
    cluster = ClusterState([node("a", gpus=3)])
    light, heavy, silent = Fixed({"a": 0}, share=0), Fixed({"a": 0}, share=2), Fixed({"a": 0})
    policy = Policy("p", ((light, 1.0), (heavy, 5.0), (silent, 9.0)))
    assert policy.share_gpu(PodRequest("s", gpu_count=1, gpu_milli=100), cluster, 0) == 2
    result = schedule_one(PodRequest("s", gpu_count=1, gpu_milli=100), cluster, policy, random.Random(0))
    assert isinstance(result, Placement) and result.allocation.gpus[0].id == "a-g2"
    assert (
        Policy("none", ((silent, 1.0),)).share_gpu(PodRequest("s", gpu_count=1, gpu_milli=1), cluster, 0)
        is None
    )


def test_schedule_one_reports_score_feasible_and_uses_the_tie_breaker_on_ties_only() -> None:
    cluster = ClusterState([node("a"), node("b"), node("c"), node("full", gpus=0)])
    main = Fixed({"a": 5, "b": 5, "c": 1})
    breaker = Fixed({"a": 1, "b": 2, "c": 100})
    policy = Policy("p", ((main, 1.0),), tie_break=breaker)
    result = schedule_one(PodRequest("p", gpu_count=1), cluster, policy, random.Random(0))
    assert isinstance(result, Placement)
    assert (result.node, result.score, result.feasible) == ("b", 5.0, 3)  # 3 nodes passed the filters
    assert breaker.scored == [["a", "b"]]  # never c, which is not tied for the best
    alone = Fixed({"a": 3, "b": 5, "c": 1})
    result = schedule_one(
        PodRequest("p", gpu_count=1),
        cluster,
        Policy("q", ((alone, 1.0),), tie_break=breaker),
        random.Random(0),
    )
    assert (result.node, result.score, result.feasible) == ("b", 5.0, 3)
    assert breaker.scored == [["a", "b"]]  # no tie: not asked again


def test_ties_follow_the_node_order_and_explanations_can_be_skipped() -> None:
    cluster = ClusterState([node("a"), node("b"), node("c")])
    flat = Policy(
        "flat", ((Fixed({"a": 1, "b": 1, "c": 1}), 1.0),), tie_break=Fixed({"a": 0, "b": 0, "c": 0})
    )
    cluster.set_tie_order([2, 0, 1])
    assert schedule_one(PodRequest("p"), cluster, flat, random.Random(0)).node == "c"
    cluster.set_tie_order([1, 2, 0])
    assert schedule_one(PodRequest("p"), cluster, flat, random.Random(0)).node == "b"
    big = PodRequest("big", cpu_milli=10**6)
    quiet = schedule_one(big, cluster, flat, random.Random(0), explain=False)
    assert isinstance(quiet, Unschedulable) and quiet.total_nodes == 3 and quiet.reasons == {}
    loud = schedule_one(big, cluster, flat, random.Random(0))
    assert loud.reasons == {"Insufficient cpu": 3}


def test_pick() -> None:
    idx, scores = np.array([4, 7, 9]), np.array([1.0, 3.0, 2.0])
    assert pick(idx, scores, random.Random(0)) == (7, 3.0)
    assert pick(np.array([5]), np.array([0.5]), random.Random(0)) == (5, 0.5)
    tied = np.array([2.0, 2.0, 1.0])
    rank = np.array([0, 0, 0, 0, 2, 0, 0, 1, 0, 0])  # node 7 before node 4
    assert pick(idx, tied, random.Random(0), rank) == (7, 2.0)
    seen = {pick(idx, tied, random.Random(s))[0] for s in range(30)}
    assert seen == {4, 7}


def test_a_filter_that_lies_is_a_bug_named_as_such() -> None:
    """Without the GPU filter the chosen node cannot take the pod: a bug, said as such."""
    cluster = ClusterState([node("a", gpus=1)])
    cluster.assume(Allocation("a", "x", gpus=(GpuGrant(0, "a-g0", 950),), gpu_tag="share-gpu"))
    policy = Policy("p", ((Fixed({"a": 0}), 1.0),))
    share = PodRequest("s", gpu_count=1, gpu_milli=100)
    with pytest.raises(RuntimeError, match="pod s passed the filters on a but does not fit"):
        schedule_one(share, cluster, policy, random.Random(0), filters=())


# --- allocation ---------------------------------------------------------------------------------------


def test_allocations_carry_everything_the_pod_asked() -> None:
    n = node("n", gpus=4, memory_mib=16_000)
    pod = PodRequest(
        "ns/p",
        uid="u",
        cpu_milli=1500,
        memory_mib=700,
        gpu_count=3,
        containers=(
            ContainerRequest("warm", 3, ContainerKind.INIT),
            ContainerRequest("app", 2),
            ContainerRequest("log", 1),
        ),
    )
    alloc = allocate(pod, n)
    assert alloc is not None
    assert (alloc.node, alloc.pod_uid, alloc.pod_name, alloc.cpu_milli, alloc.memory_mib) == (
        "n",
        "u",
        "ns/p",
        1500,
        700,
    )
    assert alloc.gpus == tuple(GpuGrant(i, f"n-g{i}", MILLI, 16_000) for i in range(3))
    assert alloc.gpu_tag == "3-gpu" and alloc.init_containers == frozenset({"warm"})
    assert alloc.charged_gpus == 3 and alloc.gpu_milli == 3000
    assert alloc.containers == {"warm": ("n-g0", "n-g1", "n-g2"), "app": ("n-g0", "n-g1"), "log": ("n-g2",)}
    assert Allocation.from_dict(alloc.to_dict()) == alloc
    assert Allocation.from_dict({"node": "n", "podUID": "u"}) == Allocation("n", "u")


def test_a_share_honours_an_override_when_it_fits() -> None:
    n = node("n", gpus=3)
    n.gpus[0].free_milli, n.gpus[1].free_milli = 200, 600
    share = PodRequest("s", gpu_count=1, gpu_milli=500)
    assert best_fit_share_gpu(share, n) == 1
    fallback = allocate(share, n, share_gpu=0)  # does not fit: the best fit instead
    assert fallback is not None and fallback.gpus == (GpuGrant(1, "n-g1", 500, 0),)
    chosen = allocate(share, n, share_gpu=2)
    assert chosen is not None and chosen.gpus == (GpuGrant(2, "n-g2", 500, 0),)
    assert chosen.charged_gpus == 0 and chosen.shares() == {"n-g2": (500, 0)}
    n.gpus[2].healthy = False
    assert allocate(share, n, share_gpu=2).gpus[0].id == "n-g1"
    assert allocate(PodRequest("x", gpu_count=1, gpu_milli=900), n) is None
    assert allocate(PodRequest("y", gpu_count=1, gpu_milli=700), n, share_gpu=1) is None


def test_container_layout_rules() -> None:
    whole = PodRequest("p", gpu_count=2, containers=(ContainerRequest("a", 1), ContainerRequest("b", 0)))
    with pytest.raises(ValueError, match="need 1 GPUs, not 2"):
        split_containers(whole, (GpuGrant(0, "x"), GpuGrant(1, "y")))
    assert split_containers(PodRequest("p", gpu_count=1), (GpuGrant(0, "x"),)) == {}
    share = PodRequest(
        "s", gpu_count=1, gpu_milli=10, containers=(ContainerRequest("a"), ContainerRequest("b"))
    )
    assert split_containers(share, (GpuGrant(0, "x", 10),)) == {"a": ("x",), "b": ("x",)}
    assert split_containers(share, ()) == {}
    sidecars = (
        ContainerRequest("s1", 1, ContainerKind.SIDECAR),
        ContainerRequest("i1", 2, ContainerKind.INIT),
        ContainerRequest("s2", 1, ContainerKind.SIDECAR),
        ContainerRequest("app", 1),
    )
    assert container_gpus(sidecars) == 3
    laid = split_containers(
        PodRequest("q", gpu_count=3, containers=sidecars), tuple(GpuGrant(i, f"g{i}") for i in range(3))
    )
    assert laid == {"s1": ("g0",), "i1": ("g1", "g2"), "s2": ("g1",), "app": ("g2",)}


def test_effective_request() -> None:
    assert effective_request([1, 2], []) == 3
    assert effective_request([1], [(5, False)]) == 5
    assert effective_request([1], [(2, True), (5, False)]) == 7
    assert effective_request([1], [(5, False), (2, True)]) == 5
    assert effective_request([4], [(2, True), (3, False)], overhead=1) == 7
    assert effective_request([], []) == 0


# --- state bookkeeping --------------------------------------------------------------------------------


def test_arrays_and_summaries_follow_every_change() -> None:
    a = node("a", gpus=2, cpu=4000, mem=4000, memory_mib=1000, max_pods=5, gpu_resource=2)
    b = NodeState("b", 2000, 2000, [], labels={"z": "1"})
    cluster = ClusterState([a, b])
    assert cluster.total_gpus() == 2 and cluster.max_gpus == 2 and len(cluster) == 2
    assert cluster.node("b") is b and cluster.allocation("nope") is None
    assert cluster.any_pod_limit and cluster.any_gpu_resource_limit and cluster.any_gpu_memory
    assert cluster.gpu_memory_known.tolist() == [True, False]
    before = cluster.generation
    alloc = Allocation(
        "a", "u", cpu_milli=1000, memory_mib=500, gpus=(GpuGrant(1, "a-g1", 250, 100),), gpu_tag="share-gpu"
    )
    cluster.assume(alloc)
    assert cluster.generation == before + 1 and cluster.version[0] == 1 and cluster.version[1] == 0
    assert (cluster.cpu_free[0], cluster.mem_free[0], cluster.pods_free[0]) == (3000, 3500, 4)
    assert cluster.gpu_resource_free[0] == 2  # a share is not counted by the kubelet
    assert cluster.gpu_free[0].tolist() == [1000, 750] and cluster.gpu_mem_free[0].tolist() == [1000, 900]
    assert (cluster.gpu_free_total[0], cluster.gpu_full_free[0], cluster.gpu_max_free[0]) == (1750, 1, 1000)
    assert cluster.gpu_key[0] == (1000, 750) and cluster.gpu_rows[0] == [1000, 750]
    assert cluster.allocated_gpu_milli() == 250 and cluster.allocation("u") == alloc
    assert cluster.tag_count("share-gpu").tolist() == [1, 0] and cluster.tag_kinds.tolist() == [1, 0]
    assert cluster.tag_count("never").tolist() == [0, 0]
    assert (
        a.pods_free == 4 and a.gpu_resource_free == 2 and b.pods_free is None and b.gpu_resource_free is None
    )
    assert repr(a) == "NodeState(a, cpu 3000/4000, gpu free [1000,750])"
    a.gpus[0].healthy = False
    cluster._sync(0)
    assert cluster.gpu_free[0].tolist() == [-1, 750] and cluster.gpu_max_free[0] == 750
    assert cluster.gpu_full_free[0] == 0 and cluster.gpu_free_total[0] == 750
    assert cluster.forget("u") == alloc and cluster.allocated_gpu_milli() == 0
    assert cluster.tag_kinds.tolist() == [0, 0] and cluster.pods_free[0] == 5
    assert cluster.tag_count("share-gpu").tolist() == [0, 0]
    assert b.free_gpu_indices() == [] and a.free_gpu_indices() == [1]
    assert a.free_gpu_indices(PodRequest("p", gpu_count=1, gpu_models=frozenset({"H100"}))) == []
    assert a.models() == frozenset({"A100"})
    with pytest.raises(AllocationConflict, match="unknown node x"):
        cluster.book(Allocation("x", "y"))


def test_node_checks_name_what_is_wrong() -> None:
    n = node("n", gpus=2, memory_mib=1000)
    with pytest.raises(AllocationConflict, match="allocation for node m applied to n"):
        n.check(Allocation("m", "u"))
    with pytest.raises(AllocationConflict, match="GPU n-g0 granted twice"):
        n.check(Allocation("n", "u", gpus=(GpuGrant(0, "n-g0", 100), GpuGrant(0, "n-g0", 100))))
    n.gpus[1].healthy = False
    with pytest.raises(AllocationConflict, match="GPU n-g1 is unhealthy"):
        n.check(Allocation("n", "u", gpus=(GpuGrant(1, "n-g1"),)))
    n.gpus[0].free_memory_mib = 500
    with pytest.raises(AllocationConflict, match="GPU n-g0 has not enough free"):
        n.check(Allocation("n", "u", gpus=(GpuGrant(0, "n-g0", 100, 600),)))
    with pytest.raises(AllocationConflict, match="GPU n-g0 has not enough free"):
        n.check(Allocation("n", "u", gpus=(GpuGrant(0, "n-g0"),)))  # whole: all its memory
    n.check(Allocation("n", "u", gpus=(GpuGrant(0, "n-g0", 100, 500),)))
    with pytest.raises(ValueError, match="indexed 0..n-1"):
        NodeState("bad", 1, 1, [GpuState(1, "g")])
    with pytest.raises(ValueError, match="two GPUs share an id"):
        NodeState("bad", 1, 1, [GpuState(0, "g"), GpuState(1, "g")])
    with pytest.raises(ValueError, match="duplicate node name a"):
        ClusterState([node("a"), node("a")])


def test_requests_normalise_and_refuse_nonsense() -> None:
    for field in ("gpu_count", "gpu_milli", "gpu_memory_mib"):
        with pytest.raises(ValueError, match="negative GPU request"):
            PodRequest("p", **{field: -1})
    by_memory = PodRequest("m", gpu_count=1, gpu_memory_mib=100)
    assert by_memory.gpu_milli == 0 and by_memory.is_share and by_memory.total_gpu_milli == 0
    assert PodRequest("w", gpu_count=2).total_gpu_milli == 2000
    a = PodRequest("a", cpu_milli=1, gpu_count=2, topology=TopologyWish(nvlink=Wish.PREFER))
    assert a.shape() != PodRequest("b", cpu_milli=1, gpu_count=2).shape()
    one = PodRequest("c", gpu_count=1, topology=TopologyWish(nvlink=Wish.PREFER))
    assert one.shape() == PodRequest("d", gpu_count=1).shape()  # a wish about one GPU means nothing
    assert PodRequest("e", node_selector={"a": "1"}).shape() != PodRequest("f").shape()
    assert PodRequest("g", uid="x").uid == "x"
    assert PodRequest("h", gpu_models=frozenset({"T4"})).allows_model("T4")
    assert not PodRequest("h", gpu_models=frozenset({"T4"})).allows_model("A100")
    assert PodRequest("i").allows_model("anything")


# --- the second round: what mutation testing showed the tests above could not tell apart ----------


class ByCpu(ScorePlugin):
    """Scores every node with the pod's CPU request (so a wrong pod shows)."""

    def score(self, pod, cluster, idx) -> np.ndarray:
        return np.full(len(idx), float(pod.cpu_milli))


def test_weighted_scores_come_from_the_pod_being_scheduled() -> None:
    cluster = ClusterState([node("a")])
    policy = Policy("w", ((ByCpu(), 2.0),))
    assert policy.score(PodRequest("p", cpu_milli=7), cluster, cluster.all_indices).tolist() == [14.0]


def test_reasons_name_only_what_fails_at_the_exact_boundary() -> None:
    """A node with exactly the CPU, pods and memory asked for is short of nothing."""
    exact = node("exact", gpus=0, cpu=1000, mem=500, max_pods=2)
    short = node("short", gpus=0, cpu=1000, mem=100, max_pods=1)
    cluster = ClusterState([exact, short])
    cluster.book(Allocation("short", "x", cpu_milli=0))  # its one pod slot is taken
    pod = PodRequest("p", cpu_milli=1000, memory_mib=500)
    assert run_filters(pod, cluster)[0].tolist() == [0]
    cluster.book(Allocation("exact", "y", memory_mib=1))
    idx, why = run_filters(pod, cluster)
    assert idx.tolist() == [] and why == {"Insufficient memory": 2, "Too many pods": 1}
    assert failed_nodes(pod, cluster) == {
        "exact": "Insufficient memory",
        "short": "Too many pods, Insufficient memory",
    }
    nothing = PodRequest("n")
    assert failed_nodes(nothing, cluster) == {"short": "Too many pods"}
    assert run_filters(nothing, cluster)[1] == {}  # exact still fits, so nothing is explained


def test_taint_reasons_are_counted_per_taint() -> None:
    a, b = node("a", taints=(Taint("x"),)), node("b", taints=(Taint("y", "1"),))
    cluster = ClusterState([a, b, node("c", taints=(Taint("x"),))])
    idx, why = run_filters(PodRequest("p"), cluster)
    assert idx.tolist() == []
    assert why == {"node(s) had untolerated taint {x}": 2, "node(s) had untolerated taint {y: 1}": 1}


def test_the_message_orders_reasons_by_count_then_name() -> None:
    assert unschedulable_message(6, {"b": 1, "a": 1, "c": 4}) == "0/6 nodes are available: 4 c, 1 a, 1 b."
    assert unschedulable_message(3, {"a": 1, "z": 2}) == "0/3 nodes are available: 2 z, 1 a."


def test_model_names_are_joined_in_order() -> None:
    cluster = ClusterState([node("a")])
    pod = PodRequest("p", gpu_count=1, gpu_models=frozenset({"T4", "L4"}))
    assert run_filters(pod, cluster)[1] == {"no GPU of model L4|T4": 1}
    assert failed_nodes(pod, cluster) == {"a": "no GPU of model L4|T4"}
    share = PodRequest("s", gpu_count=1, gpu_milli=10, gpu_models=frozenset({"T4", "L4"}))
    assert run_filters(share, cluster)[1] == {"no GPU of model L4|T4": 1}


def test_share_arithmetic_on_known_and_unknown_gpu_memory() -> None:
    known = NodeState("k", 8000, 8000, [GpuState(0, "k0", "A100", 40_000)])
    unknown = NodeState("u", 8000, 8000, [GpuState(0, "u0", "A100", 0)])
    cluster = ClusterState([known, unknown])
    # 10001 MiB of 40000 is 250.025 milli, charged 251: a GPU with 250 milli free cannot take it.
    cluster.book(Allocation("k", "x", gpus=(GpuGrant(0, "k0", 750, 0),), gpu_tag="share-gpu"))
    by_memory = PodRequest("m", gpu_count=1, gpu_memory_mib=10_001)
    assert known.gpus[0].share_for(by_memory) == (251, 10_001)
    assert unknown.gpus[0].share_for(by_memory) == (MILLI, 10_001)  # unknown memory: the whole GPU
    assert run_filters(by_memory, cluster)[0].tolist() == [1]  # only as the unknown node's whole GPU
    assert run_filters(PodRequest("f", gpu_count=1, gpu_memory_mib=10_000), cluster)[0].tolist() == [0, 1]
    cluster.book(Allocation("u", "y", gpus=(GpuGrant(0, "u0", 1, 0),), gpu_tag="share-gpu"))
    assert run_filters(by_memory, cluster)[0].tolist() == []
    # A milli share takes its fraction of the memory, rounded down: 300 of 40001 MiB is 12000 MiB.
    odd = NodeState("o", 8000, 8000, [GpuState(0, "o0", "A100", 40_001)])
    cluster = ClusterState([odd])
    cluster.book(Allocation("o", "z", gpus=(GpuGrant(0, "o0", 100, 28_001),), gpu_tag="share-gpu"))
    assert odd.gpus[0].free_memory_mib == 12_000
    milli = PodRequest("s", gpu_count=1, gpu_milli=300)
    assert odd.gpus[0].share_for(milli) == (300, 12_000) and odd.gpus[0].fits_share(milli)
    assert run_filters(milli, cluster)[0].tolist() == [0]
    alloc = allocate(milli, odd)
    assert alloc is not None and alloc.gpus == (GpuGrant(0, "o0", 300, 12_000),)
    cluster.book(Allocation("o", "w", gpus=(GpuGrant(0, "o0", 1, 1),), gpu_tag="share-gpu"))
    assert not odd.gpus[0].fits_share(milli) and run_filters(milli, cluster)[0].tolist() == []


def test_a_models_share_needs_room_on_a_gpu_of_that_model() -> None:
    mixed = NodeState("m", 8000, 8000, [GpuState(0, "t", "T4", 16_000), GpuState(1, "a", "A100", 80_000)])
    cluster = ClusterState([mixed])
    cluster.book(Allocation("m", "x", gpus=(GpuGrant(0, "t", 900, 0),), gpu_tag="share-gpu"))
    t4 = PodRequest("s", gpu_count=1, gpu_milli=200, gpu_models=frozenset({"T4"}))
    assert run_filters(t4, cluster)[0].tolist() == []
    assert allocate(t4, mixed) is None
    small = PodRequest("s", gpu_count=1, gpu_milli=100, gpu_models=frozenset({"T4"}))
    assert mixed.gpus[0].fits_share(small) and not mixed.gpus[1].fits_share(small)
    assert allocate(small, mixed).gpus[0].id == "t"
    whole = PodRequest("w", gpu_count=1, gpu_models=frozenset({"A100"}))
    assert mixed.free_gpu_indices(whole) == [1] and allocate(whole, mixed).gpus[0].id == "a"


def test_required_topology_counts_only_gpus_of_the_pods_models() -> None:
    """Two NVLinked A100s and two unlinked T4s: two T4s with NVLink required do not fit."""
    from devices.model import Topology, pair

    gpus = [GpuState(0, "a0", "A100", numa=0), GpuState(1, "a1", "A100", numa=0)]
    gpus += [GpuState(2, "t0", "T4", numa=0), GpuState(3, "t1", "T4", numa=1)]
    n = NodeState("n", 8000, 8000, gpus, topology=Topology(nvlinks={pair("a0", "a1"): 2}))
    cluster = ClusterState([n])
    linked = TopologyWish(nvlink=Wish.REQUIRE)
    t4 = PodRequest("p", gpu_count=2, gpu_models=frozenset({"T4"}), topology=linked)
    assert run_filters(t4, cluster)[1] == {"no NVLink-connected set of 2 GPUs": 1}
    a100 = PodRequest("q", gpu_count=2, gpu_models=frozenset({"A100"}), topology=linked)
    assert allocate(a100, n).device_ids() == ("a0", "a1")
    # One NUMA node required: never the NVLinked pair when it spans two.
    split = NodeState(
        "s",
        8000,
        8000,
        [GpuState(0, "x0", numa=0), GpuState(1, "x1", numa=1), GpuState(2, "x2", numa=1)],
        topology=Topology(nvlinks={pair("x0", "x1"): 4}),
    )
    numa = PodRequest("r", gpu_count=2, topology=TopologyWish(same_numa=Wish.REQUIRE))
    assert allocate(numa, split).device_ids() == ("x1", "x2")
    assert allocate(PodRequest("r", gpu_count=2), split).device_ids() == ("x0", "x1")


def test_dicts_round_trip_every_field() -> None:
    alloc = Allocation(
        "n",
        "u",
        "ns/p",
        1,
        2,
        (GpuGrant(3, "g", 250, 7),),
        {"c": ("g",)},
        "share-gpu",
        gpu_resource=4,
        init_containers=frozenset({"i"}),
    )
    doc = alloc.to_dict()
    assert doc == {
        "node": "n",
        "podUID": "u",
        "podName": "ns/p",
        "cpuMilli": 1,
        "memoryMiB": 2,
        "gpus": [{"index": 3, "id": "g", "milli": 250, "memoryMiB": 7}],
        "containers": {"c": ["g"]},
        "gpuTag": "share-gpu",
        "gpuResource": 4,
        "initContainers": ["i"],
    }
    assert Allocation.from_dict(doc) == alloc and Allocation.from_dict(doc).gpu_resource == 4
    minimal = Allocation.from_dict({"node": "n", "podUID": "u", "gpus": [{"index": 0, "id": "g"}]})
    assert minimal.gpus == (GpuGrant(0, "g", MILLI, 0),) and minimal.gpu_resource is None
    assert minimal.charged_gpus == 1 and Allocation("n", "u", gpu_resource=0).charged_gpus == 0


def test_a_node_from_its_inventory_keeps_every_fact() -> None:
    from devices.model import Device, DeviceKind, NodeInventory

    inventory = NodeInventory(
        (
            Device("g1", DeviceKind.GPU, 1, "H100", 80_000, numa_node=1, healthy=False),
            Device("g0", DeviceKind.GPU, 0, "A100", 40_000, numa_node=0),
            Device("nic", DeviceKind.RDMA, 0, "CX7"),
        )
    )
    n = NodeState.from_inventory(
        "n", 1000, 2000, inventory, labels={"a": "b"}, taints=(Taint("t"),), max_pods=3, gpu_resource=1
    )
    assert [(g.index, g.id, g.model, g.memory_mib, g.numa, g.healthy) for g in n.gpus] == [
        (0, "g0", "A100", 40_000, 0, True),
        (1, "g1", "H100", 80_000, 1, False),
    ]
    assert (n.labels, n.taints, n.max_pods, n.gpu_resource) == ({"a": "b"}, (Taint("t"),), 3, 1)
    assert (n.cpu_capacity, n.memory_capacity) == (1000, 2000)


def test_checks_at_the_boundary_and_their_messages() -> None:
    n = node("n", gpus=1, cpu=1000, mem=500)
    cluster = ClusterState([n])
    cluster.assume(Allocation("n", "a", cpu_milli=1000, memory_mib=500))  # exactly what is free
    with pytest.raises(AllocationConflict, match=r"^pod a already allocated on n$"):
        n.check(Allocation("n", "a"))
    with pytest.raises(KeyError, match="pod b has no allocation"):
        cluster.forget("b")


def test_layouts_with_several_sidecars_and_app_containers() -> None:
    containers = (
        ContainerRequest("s1", 1, ContainerKind.SIDECAR),
        ContainerRequest("s2", 1, ContainerKind.SIDECAR),
        ContainerRequest("init", 1, ContainerKind.INIT),
        ContainerRequest("a", 1),
        ContainerRequest("b", 1),
    )
    assert container_gpus(containers) == 4
    grants = tuple(GpuGrant(i, f"g{i}") for i in range(4))
    assert split_containers(PodRequest("p", gpu_count=4, containers=containers), grants) == {
        "s1": ("g0",),
        "s2": ("g1",),
        "init": ("g2",),
        "a": ("g2",),
        "b": ("g3",),
    }
    assert effective_request([1], [(1, True), (2, True)]) == 4


def test_bookings_accumulate_per_node_and_over_the_cluster() -> None:
    n = node("n", gpus=3, cpu=8000, mem=8000, memory_mib=1000, gpu_resource=3)
    cluster = ClusterState([n, NodeState("empty", 1000, 1000, [])])
    assert cluster.max_gpus == 3 and ClusterState([]).max_gpus == 0
    assert cluster.cpu_capacity.tolist() == [8000, 1000] and cluster.mem_capacity.tolist() == [8000, 1000]
    assert cluster.gpu_max_free.tolist() == [MILLI, -1] and cluster.gpu_key[1] == ()
    cluster.assume(Allocation("n", "a", memory_mib=100, gpus=(GpuGrant(0, "n-g0"),), gpu_tag="1-gpu"))
    cluster.book(Allocation("n", "b", memory_mib=200, gpus=(GpuGrant(-1, "n-g1"),), gpu_tag="1-gpu"))
    cluster.assume(Allocation("n", "c", memory_mib=300))  # CPU-only: no GPU shape
    assert n.memory_used == 600 and n.gpu_resource_used == 2 and n.tags == {"1-gpu": 2}
    assert cluster.allocated_gpu_milli() == 2000 and cluster.tag_kinds[0] == 1
    # A whole GPU takes all its memory, whatever its grant says.
    assert [g.free_memory_mib for g in n.gpus] == [0, 0, 1000]
    cluster.book(Allocation("n", "d", gpus=(GpuGrant(2, "n-g2", MILLI, 0),), gpu_tag="1-gpu"))
    assert cluster.gpu_max_free[0] == 0 and cluster.gpu_key[0] == (0, 0, 0)
    assert cluster.gpu_free_total[0] == 0 and cluster.gpu_full_free[0] == 0
    cluster.forget("b")
    assert n.memory_used == 400 and n.gpu_resource_used == 2 and n.tags == {"1-gpu": 2}
    assert cluster.allocated_gpu_milli() == 2000 and n.gpus[1].free_memory_mib == 1000


def test_a_gpu_can_start_with_no_memory_free() -> None:
    assert GpuState(0, "g", memory_mib=100, free_memory_mib=0).free_memory_mib == 0
    assert GpuState(0, "g", memory_mib=100).free_memory_mib == 100


def test_a_memory_share_on_gpus_of_unknown_memory_needs_a_whole_gpu() -> None:
    cluster = ClusterState([node("n", gpus=1)])
    cluster.assume(Allocation("n", "x", gpus=(GpuGrant(0, "n-g0", 10),), gpu_tag="share-gpu"))
    by_memory = PodRequest("m", gpu_count=1, gpu_memory_mib=10)
    assert run_filters(by_memory, cluster)[1] == {"no GPU with 10 MiB free": 1}


def test_each_resource_is_named_only_when_it_is_short() -> None:
    cpu_short = node("cpu", gpus=0, cpu=500, mem=1000)
    mem_short = node("mem", gpus=0, cpu=1000, mem=500)
    cluster = ClusterState([cpu_short, mem_short])
    pod = PodRequest("p", cpu_milli=1000, memory_mib=1000)
    assert failed_nodes(PodRequest("p", cpu_milli=1000, memory_mib=1000), cluster) == {
        "cpu": "Insufficient cpu",
        "mem": "Insufficient memory",
    }
    assert run_filters(pod, cluster)[1] == {"Insufficient cpu": 1, "Insufficient memory": 1}
    # Over-committed CPU does not count against a pod that asks for none.
    hog = Allocation("mem", "hog", cpu_milli=2000)
    cluster.book(hog)
    no_cpu = PodRequest("n", memory_mib=1000)
    assert failed_nodes(no_cpu, cluster) == {"mem": "Insufficient memory"}
    too_big = PodRequest("b", memory_mib=2000)
    assert run_filters(too_big, cluster)[1] == {"Insufficient memory": 2}


# --- the live policies, as docs/scheduler.md describes them ---------------------------------------


def test_spread_is_least_allocated_hand_computed() -> None:
    """(CPU left / largest CPU x 0.5 + GPU milli left / largest GPU milli x 0.5) x 100, floored."""
    from scheduler.core.policies import SpreadScore

    a, b = node("a", gpus=4, cpu=10_000), node("b", gpus=2, cpu=8000)
    cluster = ClusterState([a, b])
    cluster.assume(
        Allocation("a", "x", cpu_milli=6000, gpus=(GpuGrant(0, "a-g0", 500),), gpu_tag="share-gpu")
    )
    plugin = SpreadScore()
    plugin.bind(cluster, [], random.Random(0))
    assert (plugin.max_cpu, plugin.max_gpu_milli) == (10_000.0, 4000.0)
    pod = PodRequest("p", cpu_milli=1000, gpu_count=1)
    # a: (3000/10000 x .5 + 2500/4000 x .5) x 100 = 46.25 -> 46
    # b: (7000/10000 x .5 + 1000/4000 x .5) x 100 = 47.5 -> 47
    assert plugin.score(pod, cluster, cluster.all_indices).tolist() == [46.0, 47.0]
    assert make_policy("spread").plugins[0][1] == 1.0


def test_the_topology_policy_puts_multi_gpu_pods_where_their_gpus_connect_best() -> None:
    """A 4-GPU pod: on the DGX-1 the best free set is NVLinked; on the PCIe-only node nothing is.
    The topology score outweighs FGD (x1000); a 1-GPU pod is placed by fgd-align alone."""
    from pathlib import Path

    from scheduler.core.topology import load_machine

    dgx = Path(__file__).resolve().parent.parent / "scheduler" / "data" / "topologies" / "dgx1-v100.json"
    linked = NodeState.from_inventory("linked", 80_000, 512_000, load_machine(dgx, prefix="l-gpu"))
    plain = NodeState("plain", 80_000, 512_000, [GpuState(i, f"p-gpu{i}", "V100", numa=0) for i in range(8)])
    cluster = ClusterState([plain, linked])
    cluster.set_tie_order([0, 1])
    four = PodRequest("four", cpu_milli=1000, gpu_count=4, topology=TopologyWish(nvlink=Wish.PREFER))
    topology = make_policy("topology")
    topology.bind(cluster, [four], random.Random(0))
    scores = topology.score(four, cluster, cluster.all_indices)
    assert scores[1] > scores[0] + 1000  # the topology score decides, not FGD
    result = schedule_one(four, cluster, topology, random.Random(0))
    assert isinstance(result, Placement) and result.node == "linked"
    one = PodRequest("one", cpu_milli=1000, gpu_count=1)
    align = make_policy("fgd-align")
    align.bind(cluster, [one], random.Random(0))
    topology.bind(cluster, [one], random.Random(0))
    assert (
        schedule_one(one, cluster, topology, random.Random(0)).node
        == schedule_one(one, cluster, align, random.Random(0)).node
    )
    assert (
        topology.score(one, cluster, cluster.all_indices).tolist()
        == align.score(one, cluster, cluster.all_indices).tolist()
    )


@pytest.mark.parametrize("seed", range(6))
def test_fgd_places_a_memory_share_like_the_same_share_by_milli(seed: int) -> None:
    """On GPUs of one memory size, a share of m MiB is a share of ceil(m x 1000 / size) milli: FGD
    must score every node and pick every GPU the same way for both (two code paths)."""
    rng = random.Random(seed)
    nodes = []
    for n in range(4):
        state = node(f"n{n}", gpus=4, cpu=64_000, mem=256_000, memory_mib=40_000)
        for gpu in state.gpus:
            gpu.free_milli = rng.choice([1000, 1000, 750, 500, 250, 0])
            gpu.free_memory_mib = 40_000  # no memory pressure: the two forms fit the same GPUs
        nodes.append(state)
    cluster = ClusterState(nodes)
    memory = rng.choice([4000, 10_000, 20_000])
    by_memory = PodRequest("m", cpu_milli=2000, gpu_count=1, gpu_memory_mib=memory)
    by_milli = PodRequest("k", cpu_milli=2000, gpu_count=1, gpu_milli=-(-memory * MILLI // 40_000))
    workload = [by_milli, PodRequest("w", cpu_milli=4000, gpu_count=1), PodRequest("c", cpu_milli=8000)]
    first, second = make_policy("fgd"), make_policy("fgd")
    first.bind(cluster, workload, random.Random(0))
    second.bind(cluster, workload, random.Random(0))
    idx, _ = run_filters(by_memory, cluster)
    assert idx.tolist() == run_filters(by_milli, cluster)[0].tolist()
    assert first.score(by_memory, cluster, idx).tolist() == second.score(by_milli, cluster, idx).tolist()
    for i in idx.tolist():
        assert first.share_gpu(by_memory, cluster, i) == second.share_gpu(by_milli, cluster, i), i


def test_whole_gpus_of_a_model_skip_a_free_gpu_of_another() -> None:
    mixed = NodeState("m", 8000, 8000, [GpuState(0, "t", "T4"), GpuState(1, "a", "A100")])
    alloc = allocate(PodRequest("w", gpu_count=1, gpu_models=frozenset({"A100"})), mixed)
    assert alloc is not None and alloc.device_ids() == ("a",)
