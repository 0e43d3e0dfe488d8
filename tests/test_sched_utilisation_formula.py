"""The utilization policy's formula value by value (scheduler/core/utilization.py, docs/utilisation.md):
``static x S + live x (100 - busy) + allocation x 100 x (1 - allocated)``, with ``allocated`` the
mean of the CPU and GPU shares booked once the pod is placed (CPU alone on a node without GPUs),
and for a GPU share the same per GPU, -inf where the share does not fit. A mutation run showed the
ranking tests alone left the arithmetic, the clipping and the share path's "does not fit" untested."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core import ClusterState, PodRequest
from scheduler.core.state import LiveGpu
from scheduler.core.utilization import UtilizationScore
from tests.test_sched_utilisation import live, node

WEIGHTS = {"static": 0.5, "live": 2.0, "allocation": 3.0}


def scores(cluster: ClusterState, pod: PodRequest) -> np.ndarray:
    return UtilizationScore(**WEIGHTS).score(pod, cluster, cluster.all_indices)


def test_whole_pods_score_by_the_three_terms() -> None:
    cluster = ClusterState(
        [node("a", gpus=4, cpu=8000, static=40.0), node("b", gpus=0, cpu=4000, static=10.0)]
    )
    cluster.set_live("a", live("a", 4, util=30.0))
    pod = PodRequest("p", cpu_milli=2000, gpu_count=1)
    a_alloc = (2000 / 8000 + 1 / 4) / 2
    a = 0.5 * 40.0 + 2.0 * (100.0 - 30.0) + 3.0 * 100.0 * (1.0 - a_alloc)
    got = scores(cluster, PodRequest("p", cpu_milli=2000, gpu_count=1))
    assert got[0] == pytest.approx(a)
    cpu_only = PodRequest("c", cpu_milli=1000)
    b_alloc = 1000 / 4000  # no GPUs: CPU alone, not halved with a GPU share of 0
    b = 0.5 * 10.0 + 2.0 * (100.0 - cluster.node_util[1]) + 3.0 * 100.0 * (1.0 - b_alloc)
    assert scores(cluster, cpu_only)[1] == pytest.approx(b)
    assert pod.total_gpu_milli == 1000


def test_a_pod_larger_than_what_is_free_counts_the_node_as_full_not_more() -> None:
    cluster = ClusterState([node("a", gpus=2, cpu=4000), node("z", gpus=1, cpu=1)])
    big = PodRequest("big", cpu_milli=6000, gpu_count=3)  # more than a has: clipped at 1, not 1.5
    full = 0.5 * 100.0 + 2.0 * (100.0 - cluster.node_util[0]) + 0.0
    assert scores(cluster, big)[0] == pytest.approx(full)
    tiny = PodRequest("t", cpu_milli=1)  # a 1-milli node: booked 1 of 1, not 1 of 2
    z = 0.5 * 100.0 + 2.0 * (100.0 - cluster.node_util[1]) + 3.0 * 100.0 * (1.0 - (1.0 + 0.0) / 2)
    assert scores(cluster, tiny)[1] == pytest.approx(z)


def test_a_share_scores_each_gpu_and_never_one_it_does_not_fit() -> None:
    cluster = ClusterState([node("a", gpus=3, cpu=8000, static=20.0)])
    cluster.set_live(
        "a", {"a-g0": LiveGpu(10.0, None), "a-g1": LiveGpu(50.0, None), "a-g2": LiveGpu(90.0, None)}
    )
    first = PodRequest("s1", cpu_milli=1000, gpu_count=1, gpu_milli=600)
    cluster.assume(_share(cluster, first, 0))
    share = PodRequest("s2", cpu_milli=2000, gpu_count=1, gpu_milli=500)
    plugin = UtilizationScore(**WEIGHTS)
    row = plugin._share_scores(share, cluster, np.array([0]))[0]
    assert row[0] == -np.inf  # 600 + 500 > 1000: it does not fit GPU 0
    cpu = (1000 + 2000) / 8000
    for gpu, busy in ((1, 50.0), (2, 90.0)):
        allocated = (cpu + 500 / 1000) / 2
        want = 0.5 * 20.0 + 2.0 * (100.0 - busy) + 3.0 * 100.0 * (1.0 - allocated)
        assert row[gpu] == pytest.approx(want)
    assert plugin.share_gpu(share, cluster, 0) == 1  # the cooler GPU it fits
    assert plugin.score(share, cluster, np.array([0]))[0] == pytest.approx(row[1])
    whole_share = PodRequest("s3", cpu_milli=1000, gpu_count=1, gpu_milli=900)
    for g in (1, 2):
        cluster.assume(_share(cluster, PodRequest(f"f{g}", cpu_milli=1, gpu_count=1, gpu_milli=300), g))
    assert plugin.share_gpu(whole_share, cluster, 0) is None  # it fits no GPU: no GPU chosen


def _share(cluster: ClusterState, pod: PodRequest, gpu: int):  # noqa: ANN202
    from scheduler.core.allocate import allocate

    alloc = allocate(pod, cluster.nodes[0], gpu)
    assert alloc is not None
    return alloc


def test_a_share_that_fills_its_gpu_counts_it_fully_booked() -> None:
    cluster = ClusterState([node("a", gpus=1, cpu=8000)])
    cluster.assume(_share(cluster, PodRequest("s1", cpu_milli=1000, gpu_count=1, gpu_milli=600), 0))
    share = PodRequest("s2", cpu_milli=1000, gpu_count=1, gpu_milli=400)  # leaves 0 milli free
    row = UtilizationScore(**WEIGHTS)._share_scores(share, cluster, np.array([0]))[0]
    allocated = (2000 / 8000 + 1.0) / 2
    want = 0.5 * 100.0 + 2.0 * (100.0 - cluster.gpu_busy[0, 0]) + 3.0 * 100.0 * (1.0 - allocated)
    assert row[0] == pytest.approx(want, abs=1e-9)
