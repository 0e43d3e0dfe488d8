"""The default's FGD in bands of 1 where CPU runs out far ahead of GPUs (``FineBands``, ``DemandTally``),
ported from bench/placement_variants.py's ``fine-ratio13-cu07`` (issue 26, 2026-11-29): which bands FGD
scores the next pod in, from the workload until the arrivals warm up, then from the arrivals alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core import policies as P
from scheduler.core.request import PodRequest
from scheduler.core.state import ClusterState
from scheduler.sim.trace import NodeSpec, build_cluster

A = frozenset({"A"})
FINE = P.FineBands(step=1, ratio=1.3, until_cpu=0.7, warm_up=0.1)


def pod(
    name: str, gpus: int = 1, cpu: int = 1000, milli: int = 1000, models: frozenset[str] = frozenset()
) -> PodRequest:
    return PodRequest(
        name, cpu_milli=cpu, memory_mib=1024, gpu_count=gpus, gpu_milli=milli, gpu_models=models
    )


def cluster() -> ClusterState:
    """Ten nodes of 8 GPUs and 80 CPUs: 80 GPUs, 800 CPUs (a pod of 10 CPUs a GPU asks both alike)."""
    return build_cluster([NodeSpec(f"n{i}", 80_000, 640_000, 8, "A") for i in range(10)])


def fgd(fine: P.FineBands | None = FINE, step: int = 3, spec_step: int | None = None) -> P.FGDScore:
    return P.FGDScore(step=step, whole_node_typical=False, spec_step=spec_step, fine=fine)


def bound(plugin: P.FGDScore, workload: list[PodRequest]) -> P.FGDScore:
    plugin.bind(cluster(), workload, random.Random(1))
    return plugin


def test_the_workload_decides_until_the_arrivals_warm_up_then_the_arrivals_do() -> None:
    # the workload asks CPU at 2 times its GPU share (20 CPUs a GPU against the cluster's 10): fine at once
    cpu_heavy = [pod(f"w{k}", cpu=20_000) for k in range(10)]
    plugin = bound(fgd(), cpu_heavy)
    assert plugin.step == 1
    # arrivals asking CPU as the cluster has it (ratio 1): still the workload's until 0.1 of the cluster
    for k in range(7):  # 7 GPUs, 70 CPUs: below 8 GPUs / 80 CPUs
        plugin.observe(pod(f"a{k}", cpu=10_000))
    assert plugin.step == 1
    plugin.observe(pod("a7", cpu=10_000))  # 8 GPUs: warm; the arrivals' ratio 1 <= 1.3
    assert plugin.step == 3
    # CPU-only arrivals raise the ratio above 1.3 again: fine
    plugin.observe(pod("c0", gpus=0, cpu=30_000))  # 110 CPUs / 800 over 8 / 80 = 1.375
    assert plugin.step == 1
    # a balanced workload keeps the plugin's own bands from the start
    assert bound(fgd(), [pod(f"w{k}", cpu=10_000) for k in range(10)]).step == 3


def test_whole_node_pods_count_in_the_workloads_demand() -> None:
    """FGD leaves whole-node pods out of its typical pods, but their GPUs are demand all the same: a
    workload of CPU-only pods and 8-GPU pods that together ask CPU and GPUs alike is not CPU-heavy (the
    port once tallied the typical pods only and read this one as all CPU)."""
    workload = [pod(f"c{k}", gpus=0, cpu=80_000) for k in range(5)]
    workload += [pod(f"w{k}", gpus=8, cpu=1000) for k in range(5)]  # 400 CPUs and 40 GPUs asked: ratio 1
    assert bound(fgd(), workload).step == 3


def test_the_fine_bands_end_once_their_share_of_the_cpu_was_asked() -> None:
    plugin = bound(fgd(), [pod("w", cpu=20_000)])
    plugin.observe(pod("g", gpus=8, cpu=80_000))  # warm: 8 GPUs, 80 CPUs (ratio 1)
    assert plugin.step == 3
    for k in range(4):  # 480 CPUs: 0.6 of the cluster, ratio 6
        plugin.observe(pod(f"c{k}", gpus=0, cpu=100_000))
    assert plugin.step == 1
    plugin.observe(pod("c4", gpus=0, cpu=79_999))  # 559.999 CPUs: just under 0.7
    assert plugin.step == 1
    plugin.observe(pod("c5", gpus=0, cpu=1))  # 560 CPUs: 0.7 of the cluster's 800
    assert plugin.step == 3
    plugin.observe(pod("c6", gpus=0, cpu=100_000))  # over: own bands for the rest of the run
    assert plugin.step == 3


def test_a_restricted_pod_ends_the_fine_bands_for_good() -> None:
    plugin = bound(fgd(spec_step=None), [pod("w", cpu=20_000)])
    assert plugin.step == 1
    plugin.observe(pod("named-no-gpu", gpus=0, cpu=1000, models=A))  # no GPUs asked: not restricted
    assert plugin.step == 1
    plugin.observe(pod("r", cpu=30_000, models=A))
    assert plugin.step == 3
    plugin.observe(pod("c", gpus=0, cpu=100_000))
    assert plugin.step == 3
    # with spec_step: the spec bands from then on
    spec = bound(fgd(spec_step=8), [pod("w", cpu=20_000)])
    spec.observe(pod("r", cpu=30_000, models=A))
    assert spec.step == 8
    # a new bind starts afresh
    spec.bind(cluster(), [pod("w", cpu=20_000)], random.Random(1))
    assert spec.step == 1


def test_a_change_of_bands_starts_the_scores_afresh() -> None:
    plugin = bound(fgd(), [pod("w", cpu=20_000)])
    state = cluster()
    idx = np.arange(len(state))
    fine_scores = plugin.score(pod("p", cpu=5_000), state, idx)
    assert plugin._memo and plugin._cache
    plugin.observe(pod("r", models=A))  # restricted: back to bands of 3
    assert plugin.step == 3 and not plugin._memo and not plugin._cache
    coarse = plugin.score(pod("p", cpu=5_000), state, idx)
    assert (coarse == fine_scores // 3).all()


def test_without_fine_the_plugin_keeps_its_bands_whatever_arrives() -> None:
    plugin = bound(fgd(fine=None), [pod("w", cpu=20_000)])
    assert plugin.step == 3
    for k in range(4):
        plugin.observe(pod(f"c{k}", gpus=0, cpu=100_000))
    assert plugin.step == 3


@pytest.mark.parametrize(
    ("cpu", "gpu", "ratio"), [(0, 0, float("inf")), (400_000, 40_000, 1.0), (800_000, 0, float("inf"))]
)
def test_the_demand_ratio_is_the_cpu_share_over_the_gpu_share(cpu: int, gpu: int, ratio: float) -> None:
    tally = P.DemandTally(warm_up=0.0)
    tally.bind(cluster(), [])
    tally.asked = [cpu, gpu]
    assert tally.cpu_over_gpu() == ratio


def test_the_default_scores_in_fine_bands_by_the_ported_rule() -> None:
    policy = P.fgd_reserve()
    plugin = next(p for p, _ in policy.plugins if isinstance(p, P.FGDScore))
    assert plugin.fine is P.FINE_BANDS == P.FineBands(step=1, ratio=1.3, until_cpu=0.7, warm_up=0.1)
    assert plugin.base_step == P.FGD_STEP == 3
    tie = policy.tie_break
    assert isinstance(tie, P.ReserveThenAlign) and P.FINE_BANDS.warm_up == tie.WARM_UP
    assert next(p for p, _ in P.fgd_reserve(fine=None).plugins if isinstance(p, P.FGDScore)).fine is None


def test_the_live_default_topology_keeps_fgds_own_bands() -> None:
    """``topology`` (the live scheduler's default) keeps every adaptive part of ``fgd-reserve`` off: it was
    measured under random ties without them, and the live scheduler never calls ``observe``, so a gate
    read from the pods it knows at bind would hold for as long as the binding. A CPU-heavy workload
    leaves its FGD in ``TOPOLOGY_FGD_STEP``."""
    policy = P.topology_policy()
    plugin = next(p for p, _ in policy.plugins if isinstance(p, P.FGDScore))
    assert plugin.fine is None
    plugin.bind(cluster(), [pod(f"w{k}", cpu=20_000) for k in range(10)], random.Random(1))
    assert plugin.step == P.TOPOLOGY_FGD_STEP
    plugin.observe(pod("c", gpus=0, cpu=100_000))
    assert plugin.step == P.TOPOLOGY_FGD_STEP
