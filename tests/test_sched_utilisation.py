"""Utilisation-aware placement in the core: live readings, the ``utilization`` policy and weight,
the memory guard for shares, GPUs a node reports unfit (docs/utilisation.md)."""

from __future__ import annotations

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
    failed_nodes,
    make_policy,
    policy_names,
    schedule_one,
)
from scheduler.core.filters import LIVE_MEMORY
from scheduler.core.state import LiveGpu
from scheduler.core.utilization import UtilizationScore

MEMORY = 16_384


def node(
    name: str, gpus: int = 2, cpu: int = 32_000, memory: int = MEMORY, static: float = 100.0
) -> NodeState:
    return NodeState(
        name,
        cpu,
        256_000,
        [GpuState(i, f"{name}-g{i}", "V100", memory) for i in range(gpus)],
        static_score=static,
    )


def live(node_name: str, gpus: int, util: float | None = None, used: int | None = None) -> dict[str, LiveGpu]:
    return {f"{node_name}-g{i}": LiveGpu(util, used) for i in range(gpus)}


def place(cluster: ClusterState, pod: PodRequest, policy: str = "utilization", seed: int = 0, **kw: float):
    chosen = make_policy(policy, **kw)
    chosen.bind(cluster, [pod], random.Random(seed))
    return schedule_one(pod, cluster, chosen, random.Random(seed))


WHOLE = PodRequest("whole", cpu_milli=1000, gpu_count=1)
SHARE = PodRequest("share", cpu_milli=1000, gpu_count=1, gpu_memory_mib=4096)


# -- the policy ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pod", [WHOLE, SHARE, PodRequest("cpu", cpu_milli=1000)], ids=["whole", "share", "cpu"]
)
def test_of_two_nodes_equal_by_allocation_the_cool_one_wins(pod: PodRequest) -> None:
    for hot, cool in (("a", "b"), ("b", "a")):
        cluster = ClusterState([node("a"), node("b")])
        cluster.set_live(hot, live(hot, 2, util=90.0, used=1000))
        cluster.set_live(cool, live(cool, 2, util=10.0, used=1000))
        results = {place(cluster, pod, seed=s).node for s in range(10)}
        assert results == {cool}, (pod.name, hot)


def test_the_score_is_the_documented_formula() -> None:
    """0.2 x static + 0.5 x (100 - utilisation) + 0.3 x 100 x (1 - (CPU + GPU booked after) / 2)."""
    cluster = ClusterState([node("a", gpus=4, cpu=10_000, static=60.0), node("b", gpus=2)])
    cluster.assume(Allocation("a", "u", cpu_milli=4000, gpus=(GpuGrant(0, "a-g0"),), gpu_tag="1-gpu"))
    cluster.set_live("a", {"a-g0": LiveGpu(80.0), "a-g1": LiveGpu(20.0), "a-g2": LiveGpu(50.0)})
    pod = PodRequest("p", cpu_milli=1000, gpu_count=1)
    got = UtilizationScore().score(pod, cluster, np.array([0, 1]))
    # a: utilisation 80, 20, 50 and unknown (100): mean 62.5; CPU 5/10 and GPU 2/4 booked after.
    want_a = 0.2 * 60 + 0.5 * (100 - 62.5) + 0.3 * 100 * (1 - (0.5 + 0.5) / 2)
    # b: no readings at all (100 %); CPU 1/32 and GPU 1/2 booked after.
    want_b = 0.2 * 100 + 0.5 * 0 + 0.3 * 100 * (1 - (1 / 32 + 0.5) / 2)
    assert got == pytest.approx([want_a, want_b])


def test_a_share_is_scored_on_the_gpu_it_would_share_and_takes_the_coolest() -> None:
    cluster = ClusterState([node("a", gpus=3)])
    cluster.set_live("a", {"a-g0": LiveGpu(70.0, 0), "a-g1": LiveGpu(5.0, 0), "a-g2": LiveGpu(40.0, 0)})
    result = place(cluster, SHARE)
    assert isinstance(result, Placement) and [g.id for g in result.allocation.gpus] == ["a-g1"]
    cluster.set_live("a", {"a-g0": LiveGpu(70.0, 0), "a-g1": LiveGpu(95.0, 0), "a-g2": LiveGpu(40.0, 0)})
    result = place(cluster, SHARE)
    assert isinstance(result, Placement) and [g.id for g in result.allocation.gpus] == ["a-g2"]


def test_unknown_utilisation_is_never_trusted_to_be_cool() -> None:
    """A node that reports nothing (or whose report the caller dropped as stale) counts as 100 %
    busy: a node reporting 90 % is preferred to it."""
    cluster = ClusterState([node("silent"), node("busy")])
    cluster.set_live("busy", live("busy", 2, util=90.0))
    assert {place(cluster, WHOLE, seed=s).node for s in range(10)} == {"busy"}
    cluster.set_live("busy", {})  # its report dropped: both unknown, so allocation decides (equal)
    assert np.isnan(cluster.gpu_util[1]).all() and cluster.node_util.tolist() == [100.0, 100.0]
    assert {place(cluster, WHOLE, seed=s).node for s in range(20)} == {"silent", "busy"}


def test_the_static_score_counts() -> None:
    cluster = ClusterState([node("low", static=10.0), node("high", static=90.0)])
    assert {place(cluster, WHOLE, seed=s).node for s in range(10)} == {"high"}


def test_the_weight_adds_the_live_term_to_another_policy() -> None:
    cluster = ClusterState([node("a"), node("b")])
    cluster.set_live("a", live("a", 2, util=80.0))
    cluster.set_live("b", live("b", 2, util=20.0))
    base = make_policy("fgd-reserve")
    assert len(make_policy("fgd-reserve", utilization_weight=0.0).plugins) == len(base.plugins)
    without = {place(cluster, WHOLE, "fgd-reserve", seed=s).node for s in range(20)}
    assert without == {"a", "b"}  # equal for fgd-reserve: ties at random
    weighted = {place(cluster, WHOLE, "fgd-reserve", seed=s, utilization_weight=0.5).node for s in range(20)}
    assert weighted == {"b"}
    policy = make_policy("fgd-reserve", utilization_weight=0.5)
    base.bind(cluster, [WHOLE], random.Random(0))
    policy.bind(cluster, [WHOLE], random.Random(0))
    assert policy.name == "fgd-reserve" and policy.tie_break is not None
    assert policy.score(WHOLE, cluster, np.array([0, 1])).tolist() == pytest.approx(
        (base.score(WHOLE, cluster, np.array([0, 1])) + 0.5 * np.array([20.0, 80.0])).tolist()
    )


def test_utilisation_readings_alone_keep_the_node_version() -> None:
    """Utilisation moves every publish: it must not throw away the memoised scores; memory in use
    and health change what fits, so they do."""
    cluster = ClusterState([node("a")])
    before = int(cluster.version[0])
    cluster.set_live("a", live("a", 2, util=50.0))
    assert int(cluster.version[0]) == before and cluster.node_util[0] == 50.0
    cluster.set_live("a", live("a", 2, util=50.0, used=100))
    assert int(cluster.version[0]) == before + 1
    assert cluster.set_live("nope", {}) is False


def test_bookings_keep_the_live_readings() -> None:
    cluster = ClusterState([node("a")])
    cluster.set_live("a", live("a", 2, util=30.0, used=2000))
    cluster.assume(Allocation("a", "u", gpus=(GpuGrant(0, "a-g0"),), gpu_tag="1-gpu"))
    assert cluster.gpu_util[0].tolist() == [30.0, 30.0]
    assert cluster.gpu_live_free[0].tolist() == [MEMORY - 2000, MEMORY - 2000]


# -- the memory guard ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [*policy_names()])
def test_a_share_never_goes_where_memory_in_use_leaves_too_little(policy: str) -> None:
    """GPU 0 is empty by the books but a process outside Kubernetes holds 14 GiB of its 16."""
    cluster = ClusterState([node("a", gpus=2)])
    cluster.assume(Allocation("a", "half", gpus=(GpuGrant(1, "a-g1", 500, 8192),), gpu_tag="share-gpu"))
    cluster.set_live("a", {"a-g0": LiveGpu(0.0, 14_336), "a-g1": LiveGpu(0.0, 8192)})
    for pod in (SHARE, PodRequest("milli", cpu_milli=1000, gpu_count=1, gpu_milli=300)):
        result = place(cluster, pod, policy)
        assert isinstance(result, Placement), (policy, pod.name)
        assert [g.id for g in result.allocation.gpus] == ["a-g1"], (policy, pod.name)


def test_the_guard_is_the_reason_in_the_message() -> None:
    guarded = node("guarded", gpus=1)
    full = node("full", gpus=1)
    cluster = ClusterState([guarded, full])
    cluster.assume(Allocation("full", "f", gpus=(GpuGrant(0, "full-g0", 900, 14_000),), gpu_tag="share-gpu"))
    cluster.set_live("guarded", {"guarded-g0": LiveGpu(10.0, 13_000)})
    result = place(cluster, SHARE)
    assert isinstance(result, Unschedulable)
    assert result.message() == (f"0/2 nodes are available: 1 {LIVE_MEMORY}, 1 no GPU with 4096 MiB free.")
    assert failed_nodes(SHARE, cluster) == {"guarded": LIVE_MEMORY, "full": "no GPU with 4096 MiB free"}
    # the memory freed: the share fits, and the change says so (parked pods may be tried again)
    assert cluster.set_live("guarded", {"guarded-g0": LiveGpu(10.0, 1000)}) is True
    assert place(cluster, SHARE).node == "guarded"


def test_the_guard_needs_a_reading() -> None:
    cluster = ClusterState([node("a", gpus=1)])
    cluster.set_live("a", {"a-g0": LiveGpu(10.0, None)})
    assert not cluster.any_live_memory and isinstance(place(cluster, SHARE), Placement)


# -- GPUs a node reports unfit --------------------------------------------------------------------------


def test_an_unfit_gpu_leaves_placement_and_comes_back_without_touching_its_pods() -> None:
    cluster = ClusterState([node("a", gpus=2)])
    cluster.assume(Allocation("a", "old", gpus=(GpuGrant(0, "a-g0", 300, 4000),), gpu_tag="share-gpu"))
    assert cluster.set_live("a", {"a-g1": LiveGpu(0.0, 0, "XID 79: GPU has fallen off the bus")}) is False
    gpu = cluster.nodes[0].gpus[1]
    assert not gpu.healthy and gpu.unfit.startswith("XID 79")
    assert cluster.gpu_free[0].tolist() == [700, -1]
    result = place(cluster, WHOLE)
    assert isinstance(result, Unschedulable) and result.message() == (
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    )
    assert place(cluster, SHARE).allocation.gpus[0].id == "a-g0"
    # the unfit GPU's pods keep their booking; a pod on it is never moved or released
    cluster.set_live(
        "a", {"a-g0": LiveGpu(0.0, 0, "uncorrectable ECC errors: 2"), "a-g1": LiveGpu(0.0, 0, "XID 79")}
    )
    assert cluster.allocation("old") is not None and cluster.nodes[0].gpus[0].free_milli == 700
    assert isinstance(place(cluster, SHARE), Unschedulable)
    assert cluster.set_live("a", {}) is True  # both healthy again
    assert cluster.gpu_free[0].tolist() == [700, 1000]
    assert place(cluster, WHOLE).allocation.gpus[0].id == "a-g1"


def test_the_inventory_health_still_rules() -> None:
    """A GPU the inventory lists unhealthy stays out whatever the live report says."""
    sick = NodeState("s", 8000, 8000, [GpuState(0, "s-g0", "V100", MEMORY, healthy=False)])
    cluster = ClusterState([sick])
    cluster.set_live("s", {"s-g0": LiveGpu(0.0, 0)})
    assert cluster.gpu_free[0].tolist() == [-1] and isinstance(place(cluster, WHOLE), Unschedulable)
