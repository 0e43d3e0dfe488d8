"""Hostile review of issue #24's utilisation-aware placement: defects found and their regressions.

Each test names the defect it guards against; each failed before its fix. The scheduler side is
driven in memory (tests/support/schedworld) and, where the boundary matters, against a real
kube-apiserver with the real publisher (the fixtures of tests/test_utilisation_api.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client as k8s

from crishim.gpumetrics import GpuTelemetrySampler
from crishim.metricspublisher import MetricsPublisher, PublishPolicy, report_of
from devices.model import DeviceKind
from kubegpu import livemetrics, nrt
from kubegpu.devenv.manifests import apply_manifests
from scheduler.live.utilisation import unfit_reason
from tests.support.schedworld import node_json
from tests.test_devices_nvidia import FakeNVMLError, fixture
from tests.test_devices_nvidia_xid import EventNvml, plugin_on
from tests.test_nrt_api import CRD as NRT_CRD
from tests.test_nrt_api import Node as NrtNode
from tests.test_nrt_api import api, plane, serves
from tests.test_sched_utilisation_live import logged, metrics, setup
from tests.test_scheduler_api import Trial
from tests.test_utilisation_api import GpuNode, every_gpu, metrics_crd, trial, wait_for

__all__ = ["api", "metrics_crd", "plane", "trial"]  # the real-apiserver fixtures, used by name


# -- updateTime at the ends of the calendar ------------------------------------------------------------


@pytest.mark.parametrize(
    "update_time",
    ["9999-12-31T23:59:59Z", "9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"],
)
def test_an_update_time_at_the_end_of_the_calendar_is_unreadable_not_a_crash(
    update_time: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect: ``livemetrics.parse`` let ``OverflowError`` out (converting a time at year 9999 or 1
    to UTC) and the cache overflowed adding the staleness bound to a time near year 9999; the
    exception left ``apply_metrics``/``replace_metrics``, so one such object (any agent may write
    any node's) broke every list of NodeGpuMetrics. It must be an unreadable report, logged."""
    _world, scheduler, *_ = setup([node_json("n1", 1), node_json("n2", 1)], policy="utilization")
    bad = metrics("n1", 1, util=5.0)
    bad["status"]["updateTime"] = update_time
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        scheduler.replace_gpu_metrics([bad, metrics("n2", 1, util=20.0)])
    assert scheduler.cache.view().node_util.tolist() == [100.0, 20.0]
    unreadable = logged(caplog, "node.metrics_unreadable")
    assert [f["node"] for f in unreadable] == ["n1"] and "updateTime" in unreadable[0]["reason"]


# -- staleness at its exact bound ---------------------------------------------------------------------


def test_readings_viewed_exactly_at_their_staleness_bound_still_go_stale_later() -> None:
    """Defect: ``expire_metrics`` dropped a report's expiry entry when the clock reached it exactly
    (``stale_at <= now``) while ``distrust`` still called the report fresh at that instant (age ==
    bound); with its entry gone nothing looked at it again: readings trusted forever."""
    _world, scheduler, *_ = setup([node_json("n1", 1)], policy="utilization", utilization_stale_seconds=600)
    doc = metrics("n1", 1, util=5.0)
    sampled = dt.datetime.fromisoformat(doc["status"]["updateTime"])
    cache = scheduler.cache
    cache.now = lambda: sampled
    scheduler.apply_gpu_metrics("ADDED", doc)
    assert cache.view().node_util.tolist() == [5.0]
    cache.now = lambda: sampled + dt.timedelta(seconds=600)
    assert cache.view().node_util.tolist() == [5.0]  # at most 600 s old: fresh (docs/utilisation.md)
    cache.now = lambda: sampled + dt.timedelta(days=3)
    assert cache.view().node_util.tolist() == [100.0]


# -- against a real apiserver ------------------------------------------------------------------------


@pytest.mark.apiserver
def test_one_object_with_a_far_future_update_time_does_not_blind_the_scheduler(
    trial: Trial, admin_api: k8s.ApiClient
) -> None:
    """Defect: a NodeGpuMetric whose updateTime the apiserver accepts (``9999-12-31T23:59:59Z`` is a
    valid date-time) made the scheduler's list of NodeGpuMetrics raise, so its watch never synced
    and re-listed forever: no node's readings reached placement. Now that object is unreadable
    (its node's readings unknown) and the others are used: the pod lands on the cool node."""
    custom = k8s.CustomObjectsApi(admin_api)
    hot, cool = GpuNode(trial, admin_api, "hot"), GpuNode(trial, admin_api, "cool")
    bad_name = f"skewed-{trial.run}"
    bad: dict[str, Any] = livemetrics.document(bad_name, [], dt.datetime.now(dt.UTC), 30, 300)
    bad["status"]["updateTime"] = "9999-12-31T23:59:59Z"
    custom.create_cluster_custom_object(livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL, bad)
    try:
        hot.publish(every_gpu(utilization=95))
        cool.publish(every_gpu(utilization=5))
        scheduler = trial.scheduler(policy="utilization")
        wait_for(lambda: {hot.name, cool.name} <= set(scheduler.cache.metrics), "the scheduler sees both")
        bound = trial.bound([trial.pod(f"p{k}", 1) for k in range(2)])
        assert {pod.spec.node_name for pod in bound.values()} == {cool.name}
    finally:
        custom.delete_cluster_custom_object(
            livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL, bad_name
        )


# -- the publisher's refused writes (real apiserver) -------------------------------------------------


class _Counting:
    """A CustomObjectsApi that counts the publisher's patches and may act before its creates."""

    def __init__(self, api: k8s.CustomObjectsApi, before_create: Any = None) -> None:
        self.api = api
        self.patches = 0
        self.before_create = before_create

    def __getattr__(self, name: str) -> Any:  # every other call as the real client makes it
        return getattr(self.api, name)

    def patch_cluster_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        self.patches += 1
        return self.api.patch_cluster_custom_object(*args, **kwargs)

    def create_cluster_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        if self.before_create is not None:
            self.before_create()
            self.before_create = None
        return self.api.create_cluster_custom_object(*args, **kwargs)


@pytest.mark.apiserver
def test_a_refused_write_is_logged_once_with_the_apiservers_reason(
    trial: Trial,
    admin_api: k8s.ApiClient,
    service_account_client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defect: the publish loop logged ``str(ApiException)``: its first 400 characters are the
    status, the reason and the response headers (``Audit-Id``, ``Date``: new on every request), so a
    write the apiserver refuses (403 here: an agent without RBAC) was logged every interval, never
    "once per distinct error", and the apiserver's message saying why was cut off."""
    node = GpuNode(trial, admin_api, "refused")
    (node.state / "metrics.json").write_text(json.dumps(every_gpu(utilization=10)))
    asyncio.run(node.sampler.sample_once())
    agent = service_account_client(trial.namespace, "no-rbac")
    counting = _Counting(k8s.CustomObjectsApi(agent))
    publisher = MetricsPublisher(
        counting,
        trial.core,
        node.name,
        lambda: node.sampler.rows,
        lambda: node.sampler.sampled_at,
        PublishPolicy(interval=0.05),
    )
    with caplog.at_level(logging.WARNING, logger="kubegpu.crishim.metricspublisher"):
        publisher.start()
        try:
            wait_for(lambda: counting.patches >= 4, "the publisher tries four times")
        finally:
            publisher.stop()
    failed = [
        getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "node.metrics_publish_failed"
    ]
    assert len(failed) == 1, failed
    assert "403" in failed[0]["error"] and "cannot patch resource" in failed[0]["error"], failed[0]
    assert "Audit-Id" not in failed[0]["error"]


@pytest.mark.apiserver
def test_a_create_that_loses_a_race_is_followed_by_a_write(trial: Trial, admin_api: k8s.ApiClient) -> None:
    """Defect: when the object was absent (patch 404) and another writer created it before the
    publisher's create (409), the publisher counted its readings as written: the object kept the
    other writer's content (here a GPU fault on every GPU) until a threshold moved or the refresh
    (300 s) came. Now it writes its readings over it at once."""
    node = GpuNode(trial, admin_api, "raced")
    custom = k8s.CustomObjectsApi(admin_api)

    def other_writer() -> None:
        gpus = [livemetrics.GpuReport(f"x{i}", i, 50.0, xid=79) for i in range(4)]
        doc = livemetrics.document(node.name, gpus, dt.datetime.now(dt.UTC), 30, 300)
        custom.create_cluster_custom_object(livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL, doc)

    node.publisher._custom = _Counting(custom, other_writer)
    try:
        assert node.publish(every_gpu(utilization=10)) == "first"
        stored = custom.get_cluster_custom_object(
            livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL, node.name
        )
        assert [(g["utilization"], g.get("xid", 0)) for g in stored["status"]["gpus"]] == [(10.0, 0)] * 4
    finally:
        custom.delete_cluster_custom_object(
            livemetrics.GROUP, livemetrics.VERSION, livemetrics.PLURAL, node.name
        )


# -- NodeResourceTopology: another writer's object (real apiserver) -----------------------------------


@pytest.mark.apiserver
def test_an_nrt_object_another_writer_created_in_the_race_is_left_alone(
    api: k8s.ApiClient, tmp_path: Path
) -> None:
    """Defect: when the NRT object was absent at the publisher's read and another writer (NFD's
    topology updater) created it before the publisher's create (409), the publisher counted its
    content as written and took the object for its own: at the next change it merge-patched
    NFD's object (its zones and the managed-by label), which docs/nrt.md says is left alone."""
    apply_manifests(api, [NRT_CRD])
    wait_for(lambda: serves(api, "v1alpha2"), "the CRD is served")
    custom = k8s.CustomObjectsApi(api)
    node = NrtNode(api, tmp_path, "gpu-nfd-race")
    theirs = {
        "apiVersion": nrt.API_VERSION,
        "kind": nrt.KIND,
        "metadata": {"name": node.name, "labels": {"app.kubernetes.io/managed-by": "nfd-topology-updater"}},
        "zones": [{"name": "node-0", "type": "Node", "resources": []}],
    }
    node.publisher._custom = _Counting(
        custom, lambda: custom.create_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, theirs)
    )
    before = None
    try:
        node.publisher.sync_once()  # absent when read; NFD's when created: a 409
        before = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)
        node.held |= {node.gpus[0]}
        node.publisher.refresh = 0.0  # looked at again at once
        node.publisher.sync_once()
        after = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)
        assert after == before
    finally:
        custom.delete_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)


def test_a_node_clock_far_ahead_does_not_grow_the_expiry_queue_without_bound() -> None:
    """Defect: every report pushed an expiry entry (its updateTime plus the staleness bound) that was
    dropped only once that time came; a node whose clock is a year ahead (its reports distrusted as
    from the future) left one entry per write for a year: the scheduler's memory grew with every
    write. Superseded entries are now dropped when they outnumber the reports held."""
    _world, scheduler, *_ = setup([node_json("n1", 1), node_json("n2", 1)], policy="utilization")
    for k in range(2000):
        scheduler.apply_gpu_metrics("MODIFIED", metrics("n1", 1, util=5.0, ago=-365 * 86400 - k))
        scheduler.apply_gpu_metrics("MODIFIED", metrics("n2", 1, util=float(k % 100)))
    assert len(scheduler.cache._expiry) <= 100
    assert scheduler.cache.view().node_util.tolist() == [100.0, 99.0]  # n1 from the future: unknown


# -- the nvidia plugin: a faulted GPU NVML cannot sample --------------------------------------------


class _FailingNvml(EventNvml):
    """The fake NVML with events, where the GPUs in ``failing`` answer sampling calls with an error
    other than GPU_IS_LOST (NVML_ERROR_UNKNOWN), as a GPU does after some faults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failing: set[int] = set()

    def _live(self, name: str, handle: Any) -> int:
        index = super()._live(name, handle)
        if index in self.failing:
            raise FakeNVMLError(999)
        return index


def test_a_gpu_with_a_fault_xid_that_nvml_cannot_sample_stays_out_of_placement() -> None:
    """Defect: a GPU NVML could not sample (an error other than GPU_IS_LOST) was left out of the
    round, and so out of the XID watch's answer and of the published report; the scheduler reads a
    GPU a report does not list as unknown, in placement: a GPU with XID 48 (double-bit ECC) whose
    queries then failed went back into placement. It is now reported lost with its XID."""
    fake = _FailingNvml(fixture("pcie-4gpu"), unsupported=("ecc",))
    plugin = plugin_on(fake)
    gpus = list(plugin.discover().by_kind(DeviceKind.GPU))
    sampler = GpuTelemetrySampler("node-x", [plugin], lambda: gpus, lambda: [], interval=1)

    def unfit() -> dict[int, str]:
        asyncio.run(sampler.sample_once())
        assert not sampler.last_error, sampler.last_error
        return {row.device.index: unfit_reason(report_of(row)) for row in sampler.rows}

    assert unfit() == dict.fromkeys(range(4), "")
    fake.xid(2, 48)
    fake.failing.add(2)
    assert unfit()[2] != ""
    fake.failing.add(1)  # an NVML error alone, no fault: left out as before (unknown)
    assert 1 not in unfit()


# -- counters beyond the reader's bounds ---------------------------------------------------------------


@pytest.mark.parametrize("field", ["xid", "ecc_uncorrected"])
def test_a_huge_health_counter_keeps_its_gpu_out_not_its_node_unreadable(field: str) -> None:
    """Defect: the reader capped ``xid`` at 2^31 and ``eccUncorrected`` at 2^62, which neither the
    agent nor the CRD bound (any whole number the apiserver stores, int64): a report with a larger
    value was unreadable as a whole, its node's readings unknown, and so every GPU of it in
    placement, the faulted one included (fail open). A counter is now read up to int64's top."""
    _world, scheduler, *_ = setup([node_json("n1", 2)], policy="utilization")
    doc = metrics("n1", 2, util=5.0)
    doc["status"]["gpus"][0][{"xid": "xid", "ecc_uncorrected": "eccUncorrected"}[field]] = (1 << 63) - 1
    scheduler.apply_gpu_metrics("ADDED", doc)
    node = scheduler.cache.view().nodes[0]
    assert [g.healthy for g in node.gpus] == [False, True]


def test_an_unreadable_report_does_not_put_a_faulted_gpu_back_into_placement(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defect: a report the scheduler could not read dropped the node's last report whole, so a GPU
    it had said unfit (XID 79) went back into placement, though nothing said it was fixed; a dying
    GPU is just the one whose sensors give garbage (a temperature of 5000 here). As for a stale
    report, an old word that a GPU is broken now holds until a readable report says otherwise;
    the readings themselves are unknown."""
    _world, scheduler, *_ = setup([node_json("n1", 2)], policy="utilization")
    scheduler.apply_gpu_metrics("ADDED", metrics("n1", 2, util=5.0))
    faulted = metrics("n1", 2, util=5.0)
    faulted["status"]["gpus"][0]["xid"] = 79
    scheduler.apply_gpu_metrics("MODIFIED", faulted)
    assert [g.healthy for g in scheduler.cache.view().nodes[0].gpus] == [False, True]
    garbage = metrics("n1", 2, util=5.0)
    garbage["status"]["gpus"][0].update(xid=79, temperatureC=5000)
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        scheduler.apply_gpu_metrics("MODIFIED", garbage)
    cluster = scheduler.cache.view()
    assert [g.healthy for g in cluster.nodes[0].gpus] == [False, True]
    assert cluster.node_util.tolist() == [100.0]  # the readings: unknown
    assert [f["node"] for f in logged(caplog, "node.metrics_unreadable")] == ["n1"]
    scheduler.apply_gpu_metrics("MODIFIED", metrics("n1", 2, util=5.0))  # a readable report: fixed
    assert [g.healthy for g in scheduler.cache.view().nodes[0].gpus] == [True, True]


@pytest.mark.apiserver
def test_an_nrt_object_another_writer_took_over_is_left_alone(api: k8s.ApiClient, tmp_path: Path) -> None:
    """Defect: the publisher checked whose the object is only before its first write; once it had
    written, another writer replacing the object (NFD's topology updater, its own label) had it
    merge-patched back at kubegpu's next change or refresh. Its patches now carry the
    resourceVersion of its own last write: a write by anyone else in between makes the patch fail
    (409), and the object is read again and left alone when it is not kubegpu's."""
    apply_manifests(api, [NRT_CRD])
    wait_for(lambda: serves(api, "v1alpha2"), "the CRD is served")
    custom = k8s.CustomObjectsApi(api)
    node = NrtNode(api, tmp_path, "gpu-nfd-later")
    try:
        assert node.publisher.sync_once() == "created"
        current = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)
        theirs = {
            "apiVersion": nrt.API_VERSION,
            "kind": nrt.KIND,
            "metadata": {
                "name": node.name,
                "resourceVersion": current["metadata"]["resourceVersion"],
                "labels": {"app.kubernetes.io/managed-by": "nfd-topology-updater"},
            },
            "zones": [{"name": "node-0", "type": "Node", "resources": []}],
        }
        custom.replace_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name, theirs)
        before = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)
        node.held |= {node.gpus[0]}
        for _ in range(2):
            node.publisher.sync_once()
        after = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)
        assert after == before
        # an object still kubegpu's that someone else touched (a label added) is written as before
        custom.patch_cluster_custom_object(
            nrt.GROUP,
            nrt.VERSION,
            nrt.PLURAL,
            node.name,
            {"metadata": {"labels": {"app.kubernetes.io/managed-by": "kubegpu", "team": "a"}}},
        )
        node.publisher._foreign_since = None
        node.publisher.refresh = 0.0
        for _ in range(2):
            node.publisher.sync_once()
        ours = custom.get_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)
        assert [z["name"] for z in ours["zones"]] == ["node-0", "node-1"]
    finally:
        custom.delete_cluster_custom_object(nrt.GROUP, nrt.VERSION, nrt.PLURAL, node.name)


def test_a_gauge_the_scheduler_would_refuse_is_left_out_not_the_whole_report() -> None:
    """The agent published what NVML said; an NVML glitch (10^6 W, 5,000 C, a NaN utilisation)
    made the whole NodeGpuMetric unreadable to the scheduler, and the node's readings unknown until
    the next good report. The publisher now leaves such a reading out; the GPU's XID still goes."""
    import datetime as dt

    from crishim.metricspublisher import report_of
    from kubegpu import livemetrics

    glitch = livemetrics.GpuReport(
        "GPU-0", 0, utilization=float("nan"), memory_used_mib=100, temperature_c=5000.0, power_w=1e6, xid=79
    )
    kept = livemetrics.publishable(glitch)
    assert (kept.utilization, kept.temperature_c, kept.power_w) == (None, None, None)
    assert (kept.memory_used_mib, kept.xid) == (100, 79)
    body = livemetrics.document("n1", [kept], dt.datetime.now(dt.UTC), 30.0, 300.0)
    gpu = livemetrics.parse(body).gpus["GPU-0"]
    assert gpu.xid == 79 and gpu.power_w is None
    assert livemetrics.publishable(kept) is kept  # nothing left to leave out
    # the publisher's own report of a sampled round goes through it
    average = SimpleNamespace(
        lost=False,
        utilization=40.0,
        memory_used_mib=100.0,
        memory_total_mib=1000,
        temperature_c=5000.0,
        power_w=1e6,
        ecc_uncorrected=None,
        xid=79,
    )
    row = SimpleNamespace(average=average, device=SimpleNamespace(id="GPU-0", index=0))
    published = report_of(row)  # type: ignore[arg-type]
    assert (published.temperature_c, published.power_w, published.utilization, published.xid) == (
        None,
        None,
        40.0,
        79,
    )
