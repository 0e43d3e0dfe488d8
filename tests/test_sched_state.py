"""Requests, node and cluster state: assume/forget, the array mirror, allocations and shares."""

from __future__ import annotations

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
    PodRequest,
    allocate,
    best_fit_share_gpu,
    run_filters,
)


def node(
    name: str = "n1", gpus: int = 4, cpu: int = 32_000, mem: int = 128_000, memory_mib: int = 0
) -> NodeState:
    return NodeState(name, cpu, mem, [GpuState(i, f"{name}-g{i}", "A100", memory_mib) for i in range(gpus)])


def test_request_normalises_whole_and_share() -> None:
    whole = PodRequest("w", gpu_count=2)
    assert (whole.gpu_milli, whole.is_share, whole.whole_gpus, whole.total_gpu_milli) == (
        MILLI,
        False,
        2,
        2000,
    )
    assert whole.gpu_tag == "2-gpu" and whole.uid == "w"
    share = PodRequest("s", gpu_count=1, gpu_milli=250)
    assert share.is_share and share.whole_gpus == 0 and share.gpu_tag == "share-gpu"
    by_memory = PodRequest("m", gpu_count=1, gpu_memory_mib=4096)
    assert by_memory.is_share and by_memory.gpu_milli == 0
    assert PodRequest("c", cpu_milli=500).gpu_tag == "no-gpu"
    assert whole.shape() == PodRequest("other-name", gpu_count=2).shape()
    with pytest.raises(ValueError, match="share of one GPU"):
        PodRequest("bad", gpu_count=2, gpu_milli=500)
    with pytest.raises(ValueError, match="whole GPUs"):
        PodRequest("bad", gpu_count=1, gpu_milli=1500)


def test_share_by_milli_or_memory() -> None:
    gpu = GpuState(0, "g", "A100", memory_mib=40_000)
    assert gpu.share_for(PodRequest("a", gpu_count=1, gpu_milli=250)) == (250, 10_000)
    assert gpu.share_for(PodRequest("b", gpu_count=1, gpu_memory_mib=10_001)) == (251, 10_001)
    unknown = GpuState(0, "g", "T4")
    assert unknown.share_for(PodRequest("a", gpu_count=1, gpu_milli=250)) == (250, 0)


def test_assume_and_forget_keep_arrays_in_sync() -> None:
    n1, n2 = node("n1"), node("n2", gpus=2)
    cluster = ClusterState([n1, n2])
    assert list(cluster.gpu_count) == [4, 2] and cluster.max_gpus == 4
    assert list(cluster.gpu_free[1]) == [MILLI, MILLI, -1, -1]
    share = PodRequest("s", cpu_milli=4000, memory_mib=1000, gpu_count=1, gpu_milli=300)
    alloc = allocate(share, n1)
    assert alloc is not None and alloc.gpus == (GpuGrant(0, "n1-g0", 300, 0),)
    version = int(cluster.version[0])
    cluster.assume(alloc)
    assert cluster.version[0] == version + 1
    assert (cluster.cpu_free[0], cluster.mem_free[0]) == (28_000, 127_000)
    assert list(cluster.gpu_free[0]) == [700, MILLI, MILLI, MILLI]
    assert (cluster.gpu_free_total[0], cluster.gpu_full_free[0], cluster.gpu_max_free[0]) == (3700, 3, MILLI)
    assert cluster.gpu_key[0] == (MILLI, MILLI, MILLI, 700)
    assert cluster.tag_count("share-gpu")[0] == 1 and cluster.tag_kinds[0] == 1
    assert cluster.allocated_gpu_milli() == 300
    assert cluster.forget("s") == alloc
    assert list(cluster.gpu_free[0]) == [MILLI] * 4 and cluster.tag_kinds[0] == 0
    assert cluster.allocated_gpu_milli() == 0 and n1.allocations == {}


def test_best_fit_share_prefers_the_fullest_gpu_that_fits() -> None:
    n = node(gpus=3)
    n.gpus[0].free_milli, n.gpus[1].free_milli, n.gpus[2].free_milli = 500, 300, 1000
    assert best_fit_share_gpu(PodRequest("a", gpu_count=1, gpu_milli=250), n) == 1
    assert best_fit_share_gpu(PodRequest("b", gpu_count=1, gpu_milli=400), n) == 0
    assert best_fit_share_gpu(PodRequest("c", gpu_count=1, gpu_milli=900), n) == 2


def test_conflicts_are_refused() -> None:
    n = node(gpus=1)
    cluster = ClusterState([n])
    cluster.assume(Allocation("n1", "a", gpus=(GpuGrant(0, "n1-g0", 600),), gpu_tag="share-gpu"))
    with pytest.raises(AllocationConflict, match="not enough free"):
        cluster.assume(Allocation("n1", "b", gpus=(GpuGrant(0, "n1-g0", 600),)))
    with pytest.raises(AllocationConflict, match="already allocated"):
        cluster.assume(Allocation("n1", "a"))
    with pytest.raises(AllocationConflict, match="no GPU"):
        cluster.assume(Allocation("n1", "c", gpus=(GpuGrant(0, "other-gpu"),)))
    with pytest.raises(AllocationConflict, match="CPU/memory"):
        cluster.assume(Allocation("n1", "d", cpu_milli=64_000))
    with pytest.raises(AllocationConflict, match="unknown node"):
        cluster.assume(Allocation("nope", "e"))
    with pytest.raises(KeyError):
        cluster.forget("never")


def test_unhealthy_gpus_are_not_offered() -> None:
    n = node(gpus=2)
    n.gpus[1].healthy = False
    cluster = ClusterState([n])
    assert (cluster.gpu_full_free[0], list(cluster.gpu_free[0])) == (1, [MILLI, -1])
    assert allocate(PodRequest("p", gpu_count=2), n) is None


def test_allocation_round_trips_and_splits_containers() -> None:
    n = node(gpus=4)
    pod = PodRequest(
        "job",
        uid="uid-1",
        cpu_milli=1000,
        gpu_count=3,
        containers=(ContainerRequest("main", 2), ContainerRequest("side", 1), ContainerRequest("log", 0)),
    )
    alloc = allocate(pod, n)
    assert alloc is not None
    assert alloc.containers == {"main": ("n1-g0", "n1-g1"), "side": ("n1-g2",)}
    assert Allocation.from_dict(alloc.to_dict()) == alloc
    share = allocate(PodRequest("s", gpu_count=1, gpu_milli=250, containers=(ContainerRequest("a"),)), n)
    assert share is not None and share.containers == {"a": ("n1-g0",)}
    assert share.shares() == {"n1-g0": (250, 0)}


def test_label_and_model_masks() -> None:
    a = NodeState("a", 1000, 1000, [GpuState(0, "a0", "T4")], labels={"zone": "x"})
    b = NodeState("b", 1000, 1000, [GpuState(0, "b0", "A100"), GpuState(1, "b1", "T4")])
    cluster = ClusterState([a, b])
    assert list(cluster.label_mask({"zone": "x"})) == [True, False]
    assert list(cluster.model_mask(frozenset({"A100"}))) == [False, True]
    assert cluster.gpu_model_mask(frozenset({"T4"})).tolist() == [[True, False], [False, True]]


def test_assume_refuses_a_pod_already_booked_on_another_node() -> None:
    """The cluster-level check: the node-level one cannot see a booking on another node."""
    cluster = ClusterState([node("n1"), node("n2")])
    cluster.assume(Allocation("n1", "a", gpus=(GpuGrant(0, "n1-g0"),)))
    with pytest.raises(AllocationConflict, match=r"^pod a is already allocated on node n1$"):
        cluster.assume(Allocation("n2", "a", gpus=(GpuGrant(0, "n2-g0"),)))
    assert list(cluster.gpu_full_free) == [3, 4]


def test_book_records_a_bound_pod_whatever_the_node_has_left() -> None:
    """Bound pods are facts: their devices are booked even when CPU or GPUs are over-committed."""
    n = node(gpus=4, cpu=4000)
    cluster = ClusterState([n])
    fact = Allocation("n1", "big", cpu_milli=8000, gpus=tuple(GpuGrant(i, f"n1-g{i}") for i in range(4)))
    with pytest.raises(AllocationConflict):
        cluster.assume(fact)
    assert cluster.book(fact) == []
    assert cluster.cpu_free[0] == -4000 and cluster.gpu_full_free[0] == 0
    assert run_filters(PodRequest("next", gpu_count=1), cluster)[0].tolist() == []
    # A second fact naming the same GPU: booked too, reported, shown as 0 free (never negative).
    problems = cluster.book(Allocation("n1", "dup", gpus=(GpuGrant(0, "n1-g0", 500),), gpu_tag="share-gpu"))
    assert problems == ["GPU n1-g0 is booked beyond its capacity"]
    assert n.gpu_by_id["n1-g0"].free_milli == -500 and cluster.gpu_free[0, 0] == 0
    cluster.forget("big")
    assert n.gpu_by_id["n1-g0"].free_milli == 500 and cluster.cpu_free[0] == 4000
    # Booking a pod again replaces its earlier booking.
    cluster.book(Allocation("n1", "dup", gpus=(GpuGrant(1, "n1-g1"),)))
    assert n.gpu_by_id["n1-g0"].free_milli == MILLI and n.gpu_by_id["n1-g1"].free_milli == 0


def test_devices_are_booked_by_id_not_index() -> None:
    """GPU-0 vanished and the indices shifted: an allocation made before still books its GPUs."""
    before = Allocation("n1", "a", gpus=tuple(GpuGrant(i, f"n1-g{i}") for i in range(3)))
    shifted = NodeState("n1", 32_000, 128_000, [GpuState(i, f"n1-g{i + 1}", "A100") for i in range(3)])
    cluster = ClusterState([shifted])
    with pytest.raises(AllocationConflict, match="no GPU n1-g0"):
        cluster.assume(before)
    assert cluster.book(before) == ["GPU n1-g0 is not listed by node n1"]
    assert [g.free_milli for g in shifted.gpus] == [0, 0, MILLI]  # g1, g2 held; g3 free
    assert allocate(PodRequest("b", gpu_count=2), shifted) is None
    cluster.forget("a")
    assert [g.free_milli for g in shifted.gpus] == [MILLI] * 3


def test_pods_limit_and_the_kubelets_gpu_count() -> None:
    """status.allocatable.pods and the GPU resource count are checked like the kubelet does."""
    a = NodeState("a", 32_000, 128_000, [GpuState(i, f"a{i}") for i in range(4)], max_pods=1, gpu_resource=4)
    b = NodeState("b", 32_000, 128_000, [GpuState(i, f"b{i}") for i in range(4)], gpu_resource=4)
    cluster = ClusterState([a, b])
    # A pod of another scheduler on each: no kubegpu device, but it counts.
    cluster.book(Allocation("a", "cpu-only"))
    cluster.book(Allocation("b", "foreign", gpu_resource=3))
    idx, why = run_filters(PodRequest("p", gpu_count=2), cluster)
    assert idx.tolist() == [] and why == {"Too many pods": 1, "Insufficient nvidia.com/gpu": 1}
    assert run_filters(PodRequest("one", gpu_count=1), cluster)[0].tolist() == [1]
    assert run_filters(PodRequest("share", gpu_count=1, gpu_milli=500), cluster)[0].tolist() == [1]
    with pytest.raises(AllocationConflict, match="maximum number of pods"):
        cluster.assume(Allocation("a", "x"))
    with pytest.raises(AllocationConflict, match="admits only 1 more GPUs"):
        cluster.assume(Allocation("b", "y", gpus=(GpuGrant(0, "b0"), GpuGrant(1, "b1"))))
    cluster.forget("foreign")
    assert run_filters(PodRequest("p", gpu_count=2), cluster)[0].tolist() == [1]


def test_a_pod_asking_nothing_fits_a_node_that_bound_pods_over_commit() -> None:
    """kube-scheduler checks a resource only when the pod asks for it (the randomized test found
    the over-committed case: free CPU and GPU count below zero refused every pod)."""
    n = NodeState("n", 4000, 1000, [GpuState(0, "g0")], gpu_resource=1)
    cluster = ClusterState([n])
    cluster.book(Allocation("n", "hog", cpu_milli=8000, memory_mib=2000, gpu_resource=3))
    nothing = PodRequest("nothing")
    assert run_filters(nothing, cluster)[0].tolist() == [0]
    cluster.assume(Allocation("n", "nothing"))
    _idx, why = run_filters(PodRequest("cpu", cpu_milli=1), cluster)
    assert why == {"Insufficient cpu": 1}


def test_share_slots_agree_with_each_gpus_own_share_rule() -> None:
    """``ClusterState.share_view`` (whole rows at once, what the GPU filter and the share policies
    use) says of every GPU slot exactly what ``GpuState.fits_share`` and ``share_for`` say of that GPU:
    random nodes mixing known and unknown memory, models, enforced shares, unhealthy and part-used
    GPUs; random shares by milli and by memory, with and without models and enforcement."""
    import random

    import numpy as np

    rng = random.Random(7)
    for trial in range(60):
        nodes = []
        for n in range(rng.randint(1, 6)):
            gpus = []
            for i in range(rng.randint(0, 8)):
                memory = rng.choice([0, 16_384, 40_960, 81_920])
                gpu = GpuState(i, f"t{trial}n{n}g{i}", rng.choice(["A100", "H100"]), memory,
                               healthy=rng.random() > 0.15, share_enforced=rng.random() < 0.4)
                gpu.free_milli = rng.choice([0, 1, 90, 250, 500, 999, 1000, rng.randint(0, 1000)])
                # often exactly what a share below takes: the boundaries are where rules go wrong
                exact = [memory * m // MILLI for m in (250, 500, 999)] + [2048, 20_480]
                gpu.free_memory_mib = min(memory, rng.choice([rng.randint(0, memory), *exact]))
                gpus.append(gpu)
            nodes.append(NodeState(f"t{trial}n{n}", 64_000, 256_000, gpus))
        cluster = ClusterState(nodes)
        idx = cluster.all_indices
        for _ in range(20):
            by_memory = rng.random() < 0.4
            pod = PodRequest(
                "s",
                gpu_count=1,
                gpu_milli=0 if by_memory else rng.choice([250, 500, 999, rng.randint(1, 999)]),
                gpu_memory_mib=rng.choice([1, 2048, 20_480, 60_000]) if by_memory else 0,
                gpu_models=frozenset(rng.sample(["A100", "H100", "V100"], rng.randint(0, 2))),
                enforced_share=rng.random() < 0.3,
            )
            view = cluster.share_view(pod)
            fits, milli, left = view.fits[idx], view.milli, view.left[idx]
            for row, node_state in enumerate(nodes):
                for gpu in node_state.gpus:
                    expected = gpu.fits_share(pod)
                    assert bool(fits[row, gpu.index]) == expected, (trial, pod, gpu)
                    take = milli if isinstance(milli, int) else int(milli[idx[row], gpu.index])
                    if expected:
                        assert take == gpu.share_for(pod)[0]
                        assert left[row, gpu.index] == gpu.free_milli - gpu.share_for(pod)[0]
                    else:
                        assert left[row, gpu.index] == -1
                assert not np.any(fits[row, len(node_state.gpus):])  # slots past the node's GPUs
