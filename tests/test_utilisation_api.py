"""Utilisation-aware placement end to end against a real kube-apiserver (docs/utilisation.md).

Each node is a fake Node advertised by the real advertiser over the sim plugin; its GPUs' readings
come from the sim plugin's ``metrics.json`` through the real sampler (no smoothing, so a test says
exactly what is published) and the real ``MetricsPublisher`` into a ``NodeGpuMetric`` of the CRD in
deploy/crds/; a live kubegpu ``Scheduler`` watches both and binds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from crishim.advertiser import Advertiser
from crishim.gpumetrics import GpuTelemetrySampler
from crishim.metricspublisher import MetricsPublisher
from crishim.rewrite import NodeDevices
from devices.model import DeviceKind
from devices.registry import load_plugins
from kubegpu import livemetrics
from kubegpu.allocation import ANNOTATION
from kubegpu.devenv.controlplane import create_fake_node
from kubegpu.devenv.manifests import apply_manifests
from tests.support.schedtrial import make_trial
from tests.test_scheduler_api import Trial, scheduler_starter, wait_failed_scheduling

pytestmark = pytest.mark.apiserver
CRDS = Path(__file__).resolve().parents[1] / "deploy" / "crds"
TOPOLOGY = "pcie-4gpu"  # 4 GPUs of 23,034 MiB
GPU_MIB = 23_034


@pytest.fixture(scope="module")
def metrics_crd(admin_api: k8s.ApiClient) -> None:
    """The NodeGpuMetric CRD of deploy/crds/, served."""
    apply_manifests(admin_api, [CRDS])
    custom = k8s.CustomObjectsApi(admin_api)
    deadline = time.monotonic() + 30
    while True:
        try:
            custom.list_cluster_custom_object(livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL)
            return
        except k8s.ApiException as error:
            assert error.status == 404 and time.monotonic() < deadline, error
            time.sleep(0.2)


@pytest.fixture
def trial(
    admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path, metrics_crd: None
) -> Iterator[Trial]:
    with scheduler_starter(admin_api) as start:
        yield make_trial(admin_api, kube_namespace, tmp_path, start)


class GpuNode:
    """A fake GPU node with the node agent's advertiser, sampler and metrics publisher."""

    def __init__(self, trial: Trial, admin_api: k8s.ApiClient, prefix: str) -> None:
        self.name = f"{prefix}-{trial.run}"
        self.state = trial.state / self.name
        create_fake_node(
            trial.core, self.name, labels={"run": trial.run}, capacity={"cpu": "64", "memory": "256Gi"}
        )
        plugins = load_plugins(
            ["sim"], {"node_name": self.name, "topology": TOPOLOGY, "state_dir": str(self.state)}
        )
        devices = NodeDevices(plugins, sysfs_root=None)
        devices.discover()
        Advertiser(trial.core, self.name, devices.current_inventory).sync_once()
        gpus = devices.inventory.by_kind(DeviceKind.GPU)
        self.clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)
        self.sampler = GpuTelemetrySampler(
            self.name, plugins, lambda: gpus, lambda: [], alpha=1.0, clock=lambda: self.clock()
        )
        self.publisher = MetricsPublisher(
            k8s.CustomObjectsApi(admin_api),
            trial.core,
            self.name,
            lambda: self.sampler.rows,
            lambda: self.sampler.sampled_at,
        )

    def publish(self, readings: dict[str, dict[str, Any]], sampled_ago: float = 0.0) -> str:
        """Write the sim plugin's metrics file, sample it, publish; returns why it wrote."""
        (self.state / "metrics.json").write_text(json.dumps(readings))
        when = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=sampled_ago)
        self.clock = lambda: when
        asyncio.run(self.sampler.sample_once())
        assert not self.sampler.last_error, self.sampler.last_error
        return self.publisher.sync_once()


def every_gpu(**fields: Any) -> dict[str, dict[str, Any]]:
    return {f"gpu{i}": dict(fields) for i in range(4)}


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize(
    "config", [{"policy": "utilization"}, {"utilization_weight": 1.0}], ids=["utilization", "default+weight"]
)
def test_of_two_nodes_equal_by_allocation_the_pod_lands_on_the_cool_one(
    trial: Trial, admin_api: k8s.ApiClient, config: dict[str, Any]
) -> None:
    hot, cool = GpuNode(trial, admin_api, "hot"), GpuNode(trial, admin_api, "cool")
    assert hot.publish(every_gpu(utilization=95, memoryUsedMiB=2000)) == "first"
    assert cool.publish(every_gpu(utilization=5, memoryUsedMiB=2000)) == "first"
    scheduler = trial.scheduler(**config)
    wait_for(lambda: len(scheduler.cache.metrics) >= 2, "the scheduler sees both reports")
    names = [trial.pod(f"p{k}", 1) for k in range(2)]
    bound = trial.bound(names)
    assert {bound[n].spec.node_name for n in names} == {cool.name}


def test_stale_metrics_are_ignored(
    trial: Trial, admin_api: k8s.ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The cool node's report was sampled an hour ago: not trusted (it counts as 100 % busy), so the
    pod goes to the node that reports 80 %, and the scheduler's log says why."""
    busy, stale = GpuNode(trial, admin_api, "busy"), GpuNode(trial, admin_api, "stale")
    busy.publish(every_gpu(utilization=80))
    stale.publish(every_gpu(utilization=0), sampled_ago=3600)
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        scheduler = trial.scheduler(policy="utilization", utilization_stale_seconds=300)
        wait_for(lambda: len(scheduler.cache.metrics) >= 2, "the scheduler sees both reports")
        bound = trial.bound([trial.pod("p", 1)])
    assert bound["p"].spec.node_name == busy.name
    fields = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "node.metrics_ignored"]
    ignored = [f for f in fields if f["node"] in (busy.name, stale.name)]  # other tests' nodes aside
    # once per view of the readings: the line may repeat (a cache rebuild reads them again)
    assert {f["node"] for f in ignored} == {stale.name}
    assert all("stale after 300s" in f["reason"] for f in ignored)


def test_the_memory_guard(trial: Trial, admin_api: k8s.ApiClient) -> None:
    """Every GPU is free by the books but its memory is used by something outside Kubernetes: the
    share is refused with the guard's reason, and placed once the memory is freed."""
    node = GpuNode(trial, admin_api, "guarded")
    node.publish(every_gpu(utilization=10, memoryUsedMiB=GPU_MIB - 1024))
    scheduler = trial.scheduler()
    wait_for(lambda: node.name in scheduler.cache.metrics, "the scheduler sees the report")
    trial.pod("share", annotations={"kubegpu.io/gpu-memory-mib": "4096"})
    event = wait_failed_scheduling(trial.core, trial.namespace, "share", "GPU memory in use")
    assert "1 GPU memory in use leaves too little for the share (live)" in event.message, event.message
    assert node.publish(every_gpu(utilization=10, memoryUsedMiB=1024)) == "memory"
    assert trial.bound(["share"])["share"].spec.node_name == node.name


def test_a_gpu_going_unhealthy_and_back(trial: Trial, admin_api: k8s.ApiClient) -> None:
    node = GpuNode(trial, admin_api, "flaky")
    node.publish(every_gpu(utilization=10))
    trial.scheduler()
    first = trial.bound([trial.pod("first", 1)])["first"]
    held = first.metadata.annotations[ANNOTATION]
    assert node.publish(every_gpu(utilization=10, xid=79)) == "health"  # fell off the bus, all four
    trial.pod("second", 1)
    event = wait_failed_scheduling(trial.core, trial.namespace, "second", "Insufficient nvidia.com/gpu")
    assert re.search(r"[:,] 1 Insufficient nvidia\.com/gpu[,.]", event.message), event.message  # all 4 out
    again = trial.core.read_namespaced_pod("first", trial.namespace)  # its pod is not touched
    assert again.spec.node_name == node.name and again.metadata.annotations[ANNOTATION] == held
    assert again.metadata.deletion_timestamp is None
    assert node.publish(every_gpu(utilization=10, xid=0)) == "health"
    assert trial.bound(["second"])["second"].spec.node_name == node.name
