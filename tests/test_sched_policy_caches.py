"""The per-node caches behind fgd-reserve's tie-break give what working everything out afresh gives.

``WholeNodeReserve`` keeps its hosts per node (``_HostTable``) and ``AlignmentScore`` the nodes'
free vectors (``_FreeVectors``), both refreshed from the cluster's log of changes
(``ClusterState.changed_since``, ``NodeChanges``): node by node when few changed, all at once when
many did or the log no longer reaches back. A random walk of placements and releases compares them,
pod by pod, with a fresh plugin bound to the same cluster, on every path.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core import policies
from scheduler.core import state as state_module
from scheduler.core.policies import ONE_BY_ONE, AlignmentScore, WholeNodeReserve
from scheduler.core.request import PodRequest
from scheduler.core.state import Allocation, ClusterState, GpuGrant, GpuState, NodeChanges, NodeState

RNG = random.Random(0)


def cluster_of(n: int, seed: int) -> ClusterState:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        gpus = rng.choice((0, 2, 4, 8, 8))
        cpu = rng.choice((32_000, 64_000, 96_000, 128_000))
        nodes.append(NodeState(f"n{i}", cpu, 512_000, [GpuState(g, f"n{i}-g{g}", "G") for g in range(gpus)]))
    return ClusterState(nodes)


def random_change(cluster: ClusterState, rng: random.Random, k: int) -> None:
    """Place a random pod on a random node (whole GPUs, a share or CPU only; CPU may be overbooked),
    or release one placed before."""
    if cluster.where and rng.random() < 0.3:
        cluster.forget(rng.choice(sorted(cluster.where)))
        return
    i = rng.randrange(len(cluster))
    node = cluster.nodes[i]
    free = [g for g in node.gpus if g.free_milli == 1000]
    grants: tuple[GpuGrant, ...] = ()
    if free and rng.random() < 0.5:
        grants = tuple(GpuGrant(g.index, g.id) for g in free[: rng.randint(1, len(free))])
    elif node.gpus and rng.random() < 0.5:
        g = rng.choice(node.gpus)
        if g.free_milli >= 100:
            grants = (GpuGrant(g.index, g.id, rng.randrange(100, g.free_milli + 1, 100)),)
    cpu = rng.choice((0, 1000, 8000, 40_000))
    cluster.book(Allocation(node.name, f"p{k}", cpu_milli=cpu, memory_mib=rng.choice((0, 4096)), gpus=grants))


WORKLOAD = [
    PodRequest("whole", cpu_milli=8000, memory_mib=1000, gpu_count=8),
    PodRequest("whole-big", cpu_milli=60_000, memory_mib=1000, gpu_count=8),
    *[PodRequest(f"s{i}", cpu_milli=2000, gpu_count=1, gpu_milli=500) for i in range(20)],
    *[PodRequest(f"g{i}", cpu_milli=4000, gpu_count=2) for i in range(10)],
]
PODS = [
    PodRequest("share", cpu_milli=2000, gpu_count=1, gpu_milli=300),
    PodRequest("one", cpu_milli=8000, gpu_count=1),
    PodRequest("four", cpu_milli=30_000, memory_mib=2048, gpu_count=4),
    PodRequest("cpu", cpu_milli=16_000),
]


@pytest.mark.parametrize(("burst", "one_by_one"), [(1, ONE_BY_ONE), (3, ONE_BY_ONE), (3, 0)])
def test_cached_reserve_and_alignment_match_fresh_ones(
    burst: int, one_by_one: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``burst`` changes between looks, worked out node by node or (``ONE_BY_ONE`` 0) all at once."""
    monkeypatch.setattr(policies, "ONE_BY_ONE", one_by_one)
    rng = random.Random(0)
    cluster = cluster_of(40, 0)
    reserve = WholeNodeReserve(keep=3, adaptive=True)
    reserve.bind(cluster, WORKLOAD)
    align = AlignmentScore()
    align.bind(cluster, WORKLOAD, RNG)
    broke = 0
    scarce = set()  # whether the 8-GPU shape was down to its kept hosts, at the steps seen
    for step in range(150):
        for k in range(burst):
            random_change(cluster, rng, step * 1000 + k)
        idx = np.array(sorted(rng.sample(range(len(cluster)), 25)))
        fresh_reserve = WholeNodeReserve(keep=3, adaptive=True)
        fresh_reserve.bind(cluster, WORKLOAD)
        hosts = int(np.count_nonzero(fresh_reserve.hosts(cluster, slice(None))[0]))
        scarce.add(hosts <= fresh_reserve.keep_for(0, int(cluster.gpu_free_total.sum())))
        fresh_align = AlignmentScore()
        fresh_align.bind(cluster, WORKLOAD, RNG)
        for pod in PODS:
            got = reserve.penalty(pod, cluster, idx)
            assert got.tolist() == fresh_reserve.penalty(pod, cluster, idx).tolist()
            broke += int(got.sum())
            for step_of in (0.0, 0.2):
                assert np.array_equal(
                    align.aligned(pod, cluster, idx, step_of), fresh_align.aligned(pod, cluster, idx, step_of)
                )
    assert broke > 0 and scarce == {True, False}  # hosts plenty and scarce, placements breaking them


def test_node_by_node_cosine_is_the_vector_one_to_the_last_bit() -> None:
    """``free_vector_at`` (Python) against ``free_vectors`` (numpy), overbooked nodes included."""
    rng = random.Random(7)
    cluster = cluster_of(60, 7)
    for k in range(400):
        random_change(cluster, rng, k)
    align = AlignmentScore()
    align.bind(cluster, WORKLOAD, RNG)
    vectors = align.free_vectors(cluster, slice(None))
    assert (cluster.cpu_free < 0).any()  # overbooked CPU: negative free vectors are covered
    for i in range(len(cluster)):
        at = align.free_vector_at(cluster, i)
        assert [v.hex() for v in at] == [float(v).hex() for v in vectors[:, i]]


def test_node_changes_gives_each_changed_node_once_and_none_past_the_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(state_module, "CHANGE_LOG", 4)
    cluster = cluster_of(10, 3)
    changes = NodeChanges(cluster)
    assert changes.moved() == []
    for uid, node in (("a", "n5"), ("b", "n2"), ("c", "n5")):
        cluster.book(Allocation(node, uid, cpu_milli=1000))
    assert changes.moved() == [2, 5]
    assert changes.moved() == []
    for k in range(12):  # more than the log keeps (between 4 and 8 changes)
        cluster.book(Allocation("n1", f"x{k}", cpu_milli=1))
    assert changes.moved() is None
    cluster.forget("a")
    assert changes.moved() == [5]
    assert changes.follows(cluster) and not changes.follows(cluster_of(10, 3))
    assert cluster.changed_since(cluster.generation) == []
    assert cluster.changed_since(cluster.generation + 1) is None
