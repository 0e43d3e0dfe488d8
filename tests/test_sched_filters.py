"""Filters: who fits, why the others do not, and the aggregated "0/N nodes are available" message."""

from __future__ import annotations

import numpy as np

from scheduler.core import (
    Allocation,
    ClusterState,
    GpuGrant,
    GpuState,
    NodeState,
    PodRequest,
    Taint,
    TaintEffect,
    Toleration,
    TopologyWish,
    Wish,
    failed_nodes,
    run_filters,
    unschedulable_message,
)


def gpus(name: str, n: int, model: str = "A100", memory: int = 0) -> list[GpuState]:
    return [GpuState(i, f"{name}-g{i}", model, memory) for i in range(n)]


def test_message_aggregates_reasons_per_node() -> None:
    """8 nodes have no free GPU, 4 have 4 free GPUs without NVLink: a 4-GPU NVLink pod fits none."""
    nodes = [NodeState(f"busy{i}", 64_000, 256_000, gpus(f"busy{i}", 2)) for i in range(8)]
    nodes += [NodeState(f"pcie{i}", 64_000, 256_000, gpus(f"pcie{i}", 4)) for i in range(4)]
    cluster = ClusterState(nodes)
    for i in range(8):
        name = f"busy{i}"
        grants = (GpuGrant(0, f"{name}-g0"), GpuGrant(1, f"{name}-g1"))
        cluster.assume(Allocation(name, f"hog{i}", gpus=grants, gpu_tag="2-gpu"))
    pod = PodRequest("train", cpu_milli=8000, gpu_count=4, topology=TopologyWish(nvlink=Wish.REQUIRE))
    idx, why = run_filters(pod, cluster)
    assert len(idx) == 0
    assert unschedulable_message(len(cluster), why) == (
        "0/12 nodes are available: 8 Insufficient nvidia.com/gpu, 4 no NVLink-connected set of 4 GPUs."
    )
    idx, why = run_filters(pod, cluster, explain=False)
    assert len(idx) == 0 and not why


def test_cpu_and_memory_are_both_named() -> None:
    cluster = ClusterState([NodeState("small", 1000, 1000, [])])
    idx, why = run_filters(PodRequest("big", cpu_milli=2000, memory_mib=2000), cluster)
    assert len(idx) == 0 and why == {"Insufficient cpu": 1, "Insufficient memory": 1}


def test_share_fit_and_model_constraint() -> None:
    a = NodeState("a", 8000, 8000, gpus("a", 1, "T4"))
    b = NodeState("b", 8000, 8000, gpus("b", 2, "A100"))
    cluster = ClusterState([a, b])
    cluster.assume(Allocation("b", "x", gpus=(GpuGrant(0, "b-g0", 900), GpuGrant(1, "b-g1", 900))))
    share = PodRequest("s", gpu_count=1, gpu_milli=200)
    idx, why = run_filters(share, cluster)
    assert list(idx) == [0] and not why  # reasons are counted only when no node fits
    assert failed_nodes(share, cluster) == {"b": "no GPU with 200 milli free"}
    t4_only = PodRequest("m", gpu_count=1, gpu_models=frozenset({"A100"}))
    idx, why = run_filters(t4_only, cluster)
    assert len(idx) == 0 and why == {"no GPU of model A100": 1, "Insufficient nvidia.com/gpu": 1}
    small = PodRequest("t", gpu_count=1, gpu_milli=100, gpu_models=frozenset({"A100"}))
    assert list(run_filters(small, cluster)[0]) == [1]


def test_share_by_memory_uses_gpu_memory() -> None:
    n = NodeState("m", 8000, 8000, gpus("m", 2, "A100", memory=40_000))
    cluster = ClusterState([n])
    cluster.assume(
        Allocation("m", "x", gpus=(GpuGrant(0, "m-g0", 500, 20_000), GpuGrant(1, "m-g1", 900, 36_000)))
    )
    fits = PodRequest("a", gpu_count=1, gpu_memory_mib=20_000)
    too_big = PodRequest("b", gpu_count=1, gpu_memory_mib=20_001)
    assert list(run_filters(fits, cluster)[0]) == [0]
    idx, why = run_filters(too_big, cluster)
    assert len(idx) == 0 and why == {"no GPU with 20001 MiB free": 1}


def test_node_selector_and_taints() -> None:
    a = NodeState("a", 8000, 8000, [], labels={"pool": "train"})
    b = NodeState("b", 8000, 8000, [], labels={"pool": "train"}, taints=[Taint("gpu", "reserved")])
    c = NodeState("c", 8000, 8000, [], labels={"pool": "infer"})
    d = NodeState(
        "d",
        8000,
        8000,
        [],
        labels={"pool": "train"},
        taints=[Taint("soft", "", TaintEffect.PREFER_NO_SCHEDULE)],
    )
    cluster = ClusterState([a, b, c, d])
    pod = PodRequest("p", node_selector={"pool": "train"})
    idx, why = run_filters(pod, cluster)
    assert list(idx) == [0, 3]
    assert failed_nodes(pod, cluster) == {
        "b": "node(s) had untolerated taint {gpu: reserved}",
        "c": "node(s) didn't match Pod's node affinity/selector",
    }
    assert failed_nodes(pod, cluster, among=np.array([1])) == {
        "b": "node(s) had untolerated taint {gpu: reserved}"
    }
    nowhere = PodRequest("n", node_selector={"pool": "none"})
    assert run_filters(nowhere, cluster)[1] == {"node(s) didn't match Pod's node affinity/selector": 4}
    tolerant = PodRequest(
        "q", node_selector={"pool": "train"}, tolerations=(Toleration("gpu", "Equal", "reserved"),)
    )
    assert list(run_filters(tolerant, cluster)[0]) == [0, 1, 3]
    anything = PodRequest("r", tolerations=(Toleration(operator="Exists"),))
    assert list(run_filters(anything, cluster)[0]) == [0, 1, 2, 3]


def test_whole_gpus_count_only_fully_free_ones() -> None:
    n = NodeState("n", 64_000, 64_000, gpus("n", 4))
    cluster = ClusterState([n])
    cluster.assume(Allocation("n", "s", gpus=(GpuGrant(2, "n-g2", 10),)))
    assert len(run_filters(PodRequest("three", gpu_count=3), cluster)[0]) == 1
    idx, why = run_filters(PodRequest("four", gpu_count=4), cluster)
    assert len(idx) == 0 and why == {"Insufficient nvidia.com/gpu": 1}
    assert isinstance(idx, np.ndarray)


UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", TaintEffect.NO_SCHEDULE)


def test_a_cordoned_node_takes_only_pods_tolerating_the_unschedulable_taint() -> None:
    """kube-scheduler's NodeUnschedulable: ``spec.unschedulable`` refuses a pod unless it tolerates
    ``node.kubernetes.io/unschedulable:NoSchedule``; the node counts under that rule first, before
    its taints or resources, with kube-scheduler's words."""
    cordoned = NodeState("c", 1000, 1000, gpus("c", 1), taints=[Taint("dedicated", "x")], unschedulable=True)
    cluster = ClusterState([cordoned, NodeState("full", 0, 0, gpus("full", 0))])
    plain = PodRequest("p", cpu_milli=100, gpu_count=1)
    idx, why = run_filters(plain, cluster)
    assert len(idx) == 0
    assert unschedulable_message(len(cluster), why) == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) were unschedulable."
    )
    assert failed_nodes(plain, cluster)["c"] == "node(s) were unschedulable"
    for toleration in (
        Toleration("node.kubernetes.io/unschedulable", "Exists", "", "NoSchedule"),
        Toleration("node.kubernetes.io/unschedulable", "Exists"),
        Toleration("node.kubernetes.io/unschedulable", "Equal", "", "NoSchedule"),
        Toleration("", "Exists"),
    ):
        both = (toleration, Toleration("dedicated", "Exists"))
        tolerating = PodRequest("t", cpu_milli=100, gpu_count=1, tolerations=both)
        assert run_filters(tolerating, cluster)[0].tolist() == [0], toleration
    for toleration in (
        Toleration("node.kubernetes.io/unschedulable", "Exists", "", "NoExecute"),
        Toleration("node.kubernetes.io/unschedulable", "Equal", "yes", "NoSchedule"),
    ):
        refused = PodRequest("r", cpu_milli=100, gpu_count=1, tolerations=(toleration,))
        assert run_filters(refused, cluster)[1]["node(s) were unschedulable"] == 1, toleration
    assert UNSCHEDULABLE_TAINT not in cordoned.taints  # the rule is the cordon's, not a taint
