"""What the mutation run of the live scheduler's changed functions showed untested (docs/testing.md,
"RDMA and the utilisation readings"): a bound pod's RDMA VFs as signed, the message of a bandwidth
without interfaces, the extender's victims when the pod's other rules need more of them, and the
cache's NodeGpuMetric bookkeeping driven directly (return values, what outlives an unreadable
report, the log once per problem, the expiry queue's compaction and expiry)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest

from kubegpu import livemetrics
from kubegpu.livemetrics import GpuReport
from scheduler.core.rdma import VfGrant
from scheduler.core.state import Allocation
from scheduler.live.cache import Cache
from scheduler.live.podspec import PodSpecError, pod_request
from scheduler.live.translate import PodUsage, allocation_contract, fact_allocation
from tests.support.schedworld import GPU_MEMORY_MIB, KEYS, beating_at, gpu_id, node_json
from tests.test_sched_extender import holder, kube_pod, preempt, setup

# --- translate and podspec --------------------------------------------------------------------


def test_a_bound_pods_vfs_are_read_back_as_they_were_signed() -> None:
    vfs = (VfGrant("mlx5_0-vf1", "mlx5_0", 25_000, 50_000), VfGrant("mlx5_1-vf0", "mlx5_1", 0, 0))
    alloc = Allocation(node="n1", pod_uid="u", pod_name="ns/p", rdma=vfs)
    signed = allocation_contract(alloc)
    assert [(r.device, r.pf, r.min_mbps, r.max_mbps) for r in signed.rdma] == [
        ("mlx5_0-vf1", "mlx5_0", 25_000, 50_000),
        ("mlx5_1-vf0", "mlx5_1", 0, 0),
    ]
    assert fact_allocation("n1", "u", "ns/p", PodUsage(0, 0, 0), signed).rdma == vfs


def test_a_bandwidth_without_interfaces_says_what_is_missing() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "annotations": {"kubegpu.io/rdma-bandwidth": "1Gbps"},
        },
        "spec": {"containers": [{"name": "a", "image": "x"}]},
    }
    with pytest.raises(PodSpecError) as caught:
        pod_request(pod)
    assert str(caught.value).endswith(
        "annotation kubegpu.io/rdma-bandwidth needs kubegpu.io/rdma-interfaces"
        " or resource kubegpu.io/rdma (how many interfaces)"
    )


# --- the extender's preempt verb --------------------------------------------------------------


def test_preempt_keeps_the_victims_the_pods_other_rules_need() -> None:
    """One GPU is wanted and evicting w1 (the least important) would free it, but the pod must not
    share a node with app=db (required anti-affinity), which w0 is: w0 goes instead, which frees a
    GPU too; a pod without that rule keeps the cheaper w1."""
    world, _scheduler, _jobs, _core, feed, extender = setup(
        node_json("n1", 2, labels={"kubernetes.io/hostname": "n1"})
    )
    world.put_pod(holder("w0", "n1", [0], 500, labels={"app": "db"}))
    world.put_pod(holder("w1", "n1", [1], 100))
    pod = kube_pod("high", 1, priority=1000)
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    plain = kube_pod("plain", 1, priority=1000)
    world.put_pod(pod)
    world.put_pod(plain)
    feed.sync()
    assert preempt(extender, plain, {"n1": (["w0", "w1"], 0)}) == {"n1": (["w1"], 0)}
    assert preempt(extender, pod, {"n1": (["w0", "w1"], 0)}) == {"n1": (["w0"], 0)}


# --- the cache's GPU readings -----------------------------------------------------------------

START = dt.datetime.now(dt.UTC).replace(microsecond=0)


class Clock:
    def __init__(self) -> None:
        self.at = START

    def __call__(self) -> dt.datetime:
        return self.at


def metrics_cache(*nodes: dict[str, Any]) -> tuple[Cache, Clock]:
    clock = Clock()
    cache = Cache("kubegpu", lambda: KEYS, now=clock, metrics_stale_after=600)
    cache.replace_nodes([beating_at(n, START) for n in nodes])
    cache.view()
    return cache, clock


def report(node: str, gpus: list[GpuReport], at: dt.datetime) -> dict[str, Any]:
    return livemetrics.document(node, gpus, at, 30, 300)


UNREADABLE = {"metadata": {"name": "n1"}}  # no status


def logged(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == message]


def test_events_that_change_nothing_wake_nothing() -> None:
    cache, _clock = metrics_cache(node_json("n1", 1))
    assert cache.apply_metrics("DELETED", UNREADABLE) is False  # nothing was held
    assert cache.apply_metrics("ADDED", UNREADABLE) is False  # unreadable, nothing was held
    assert cache.expire_metrics() is False  # nothing is due
    assert cache.metrics == {}


def test_an_unreadable_report_keeps_only_the_health_of_the_gpus_it_said_unfit() -> None:
    cache, clock = metrics_cache(node_json("n1", 3))
    gpus = [
        GpuReport(gpu_id("n1", 0), 0, 10.0, 5, GPU_MEMORY_MIB, ecc_uncorrected=2),
        GpuReport(gpu_id("n1", 1), 1, None, None, GPU_MEMORY_MIB, lost=True),
        GpuReport(gpu_id("n1", 2), 2, 10.0, 5, GPU_MEMORY_MIB, xid=13),
    ]
    cache.apply_metrics("ADDED", report("n1", gpus, clock.at))
    cache.apply_metrics("MODIFIED", UNREADABLE)
    assert cache.metrics["n1"].gpus == {
        gpu_id("n1", 0): GpuReport(gpu_id("n1", 0), 0, ecc_uncorrected=2),
        gpu_id("n1", 1): GpuReport(gpu_id("n1", 1), 1, lost=True),
    }


def test_the_same_problem_is_logged_again_after_a_readable_report_or_a_deletion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache, clock = metrics_cache(node_json("n1", 1))
    readable = report("n1", [GpuReport(gpu_id("n1", 0), 0, 10.0, 5, GPU_MEMORY_MIB)], clock.at)
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        cache.apply_metrics("ADDED", UNREADABLE)
        cache.apply_metrics("MODIFIED", UNREADABLE)  # the same problem: logged once
        assert len(logged(caplog, "node.metrics_unreadable")) == 1
        cache.apply_metrics("MODIFIED", readable)
        cache.apply_metrics("MODIFIED", UNREADABLE)
        assert len(logged(caplog, "node.metrics_unreadable")) == 2
        cache.apply_metrics("DELETED", UNREADABLE)
        cache.apply_metrics("ADDED", UNREADABLE)
        assert len(logged(caplog, "node.metrics_unreadable")) == 3


def test_readings_expire_after_the_queue_is_compacted_and_expiry_reports_the_room() -> None:
    """A node writing many reports: compacting the queue keeps exactly its last report's entry, which
    still goes stale; readings saying the GPU's memory is full keep a pod off it until then, so expiry
    frees room."""
    cache, clock = metrics_cache(node_json("n1", 1), node_json("n2", 1))
    full = [GpuReport(gpu_id("n1", 0), 0, 90.0, GPU_MEMORY_MIB, GPU_MEMORY_MIB)]
    for k in range(100):
        cache.apply_metrics("MODIFIED", report("n1", full, START + dt.timedelta(seconds=k)))
    cache.apply_metrics("ADDED", report("n2", [], START))
    cache.apply_metrics("DELETED", {"metadata": {"name": "n2"}})  # its entry is stale now
    last = START + dt.timedelta(seconds=99)
    cache._compact_expiry()
    assert cache._expiry == [(last + dt.timedelta(seconds=600), "n1", last)]
    clock.at = last + dt.timedelta(seconds=600)
    assert cache.expire_metrics() is False  # at the bound itself a report is still fresh
    assert cache.metrics["n1"].update_time == last
    clock.at = last + dt.timedelta(seconds=601)
    assert cache.expire_metrics() is True
    assert cache._expiry == []


def test_a_deleted_reports_expiry_entry_comes_due_quietly() -> None:
    cache, clock = metrics_cache(node_json("n1", 1))
    cache.apply_metrics("ADDED", report("n1", [GpuReport(gpu_id("n1", 0), 0, 1.0, 1, GPU_MEMORY_MIB)], START))
    cache.apply_metrics("DELETED", UNREADABLE)
    clock.at = START + dt.timedelta(seconds=601)
    assert cache.expire_metrics() is False
    assert cache._expiry == []
