"""The node agent's NodeGpuMetric publisher (crishim/metricspublisher.py) and the contract it writes
(kubegpu/livemetrics.py): when it writes, what it writes, and what a reader accepts."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from crishim.gpumetrics import GpuTelemetrySampler
from crishim.metricspublisher import MetricsPublisher, PublishPolicy, publish_reason
from devices.model import DeviceKind
from devices.sim import SimPlugin
from kubegpu import livemetrics
from kubegpu.livemetrics import GpuReport

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def gpu(gid: str = "g0", util: float | None = 10.0, used: int | None = 1000, **kw: Any) -> GpuReport:
    return GpuReport(gid, int(gid[1:]), util, used, 16_000, **kw)


POLICY = PublishPolicy(interval=30, refresh=300, utilization_points=5, memory_percent=5)


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        ({"g0": gpu(util=14.9)}, ""),  # moved 4.9 points
        ({"g0": gpu(util=15.0)}, "utilization"),
        ({"g0": gpu(util=5.0)}, "utilization"),
        ({"g0": gpu(used=1799)}, ""),  # 799 MiB of 16,000: under 5 %
        ({"g0": gpu(used=1800)}, "memory"),
        ({"g0": gpu(util=None, used=None, lost=True)}, "health"),
        ({"g0": gpu(xid=79)}, "health"),
        ({"g0": gpu(ecc_uncorrected=1)}, "health"),
        ({"g0": gpu(), "g1": gpu("g1")}, "gpus"),
    ],
)
def test_it_writes_only_what_moved_beyond_a_threshold(now: dict[str, GpuReport], reason: str) -> None:
    assert publish_reason({"g0": gpu()}, now, 10.0, POLICY) == reason


def test_a_small_move_must_hold_for_two_comparisons_a_large_one_is_written_at_once() -> None:
    written = {"g0": gpu(util=10.0, used=1000)}
    wobble = {"g0": gpu(util=10.0, used=1000)}  # the previous comparison: back where it was written
    assert publish_reason(written, {"g0": gpu(util=16.0)}, 10.0, POLICY, previous=wobble) == ""
    assert publish_reason(written, {"g0": gpu(util=16.0)}, 10.0, POLICY, previous={"g0": gpu(util=15.0)}) == (
        "utilization"
    )
    assert publish_reason(written, {"g0": gpu(util=20.0)}, 10.0, POLICY, previous=wobble) == "utilization"
    assert publish_reason(written, {"g0": gpu(used=2000)}, 10.0, POLICY, previous=wobble) == ""  # 6 %
    assert publish_reason(written, {"g0": gpu(used=2000)}, 10.0, POLICY, previous={"g0": gpu(used=1900)}) == (
        "memory"
    )
    assert publish_reason(written, {"g0": gpu(used=2600)}, 10.0, POLICY, previous=wobble) == "memory"  # 10 %
    assert publish_reason(written, {"g0": gpu(xid=79)}, 10.0, POLICY, previous=wobble) == "health"


def test_it_writes_first_and_after_the_refresh_bound() -> None:
    assert publish_reason(None, {"g0": gpu()}, 0.0, POLICY) == "first"
    assert publish_reason({"g0": gpu()}, {"g0": gpu()}, 299.9, POLICY) == ""
    assert publish_reason({"g0": gpu()}, {"g0": gpu()}, 300.0, POLICY) == "refresh"


class FakeCustom:
    """CustomObjectsApi's cluster-scoped calls over a dict, counting writes."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def patch_cluster_custom_object(self, group, version, plural, name, body, _content_type=None):  # noqa: ANN001, ANN201
        assert (group, version, plural) == ("kubegpu.io", "v1alpha1", "nodegpumetrics")
        assert _content_type == "application/merge-patch+json"
        self.calls.append("patch")
        if name not in self.objects:
            raise ApiException(status=404)
        self.objects[name] = {**self.objects[name], "status": body["status"], "spec": body["spec"]}

    def create_cluster_custom_object(self, group, version, plural, body):  # noqa: ANN001, ANN201
        self.calls.append("create")
        self.objects[body["metadata"]["name"]] = json.loads(json.dumps(body))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sampler_on(tmp_path: Path) -> tuple[GpuTelemetrySampler, Path, list[dt.datetime]]:
    """A real sampler over the sim plugin (2 GPUs of a shipped topology), its metrics file, and a
    wall clock the test moves."""
    plugin = SimPlugin("dgx1-v100", "node-p", state_dir=tmp_path, create_nodes=False)
    gpus = [d for d in plugin.discover().by_kind(DeviceKind.GPU)][:2]
    when = [T0]
    sampler = GpuTelemetrySampler(
        "node-p", [plugin], lambda: gpus, lambda: [], interval=1, clock=lambda: when[0]
    )
    return sampler, tmp_path / "metrics.json", when


def test_the_publisher_writes_the_smoothed_round_and_keeps_quiet_while_nothing_moves(tmp_path: Path) -> None:
    sampler, metrics, when = sampler_on(tmp_path)
    custom = FakeCustom()
    core = SimpleNamespace(read_node=lambda name: SimpleNamespace(metadata=SimpleNamespace(uid="uid-1")))
    clock = Clock()
    publisher = MetricsPublisher(
        custom, core, "node-p", lambda: sampler.rows, lambda: sampler.sampled_at, POLICY, clock=clock
    )
    assert publisher.sync_once() == ""  # nothing sampled yet: nothing to say
    metrics.write_text(json.dumps({"gpu0": {"utilization": 80, "memoryUsedMiB": 4000, "xid": 0}}))
    asyncio.run(sampler.sample_once())
    assert publisher.sync_once() == "first" and custom.calls == ["patch", "create"]
    stored = custom.objects["node-p"]
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-p", "uid": "uid-1"}
    ]
    assert stored["spec"] == {"reportIntervalSeconds": 30, "refreshSeconds": 300}
    report = livemetrics.parse(stored)
    assert report.update_time == T0 and report.node == "node-p"
    g0, g1 = sorted(report.gpus.values(), key=lambda g: g.index)
    assert (g0.utilization, g0.memory_used_mib, g0.xid, g0.memory_total_mib) == (80.0, 4000, 0, 16_384)
    assert (g1.utilization, g1.memory_used_mib, g1.xid) == (0.0, 0, None)
    assert publisher.sync_once() == ""  # the same round: never republished as new
    # the next rounds move the average 80 -> 80 + 0.3 x (84 - 80) = 81.2: under the threshold
    metrics.write_text(json.dumps({"gpu0": {"utilization": 84, "memoryUsedMiB": 4000}}))
    when[0] = T0 + dt.timedelta(seconds=15)
    asyncio.run(sampler.sample_once())
    clock.now = 30.0
    assert publisher.sync_once() == "" and publisher.writes == 1
    # a GPU goes unfit: written at once
    metrics.write_text(json.dumps({"gpu0": {"utilization": 84, "memoryUsedMiB": 4000}, "gpu1": {"xid": 79}}))
    when[0] = T0 + dt.timedelta(seconds=30)
    asyncio.run(sampler.sample_once())
    clock.now = 60.0
    assert publisher.sync_once() == "health" and custom.calls[-1] == "patch" and publisher.writes == 2
    assert livemetrics.parse(custom.objects["node-p"]).update_time == T0 + dt.timedelta(seconds=30)
    # quiet: rewritten after the refresh bound, with the time of the round it says
    when[0] = T0 + dt.timedelta(seconds=400)
    asyncio.run(sampler.sample_once())
    clock.now = 359.0
    assert publisher.sync_once() == ""
    clock.now = 360.0
    assert publisher.sync_once() == "refresh" and publisher.writes == 3


def test_a_failing_sampler_is_never_republished_as_fresh(tmp_path: Path) -> None:
    sampler, metrics, when = sampler_on(tmp_path)
    custom = FakeCustom()
    core = SimpleNamespace(read_node=lambda name: (_ for _ in ()).throw(RuntimeError("no node")))
    clock = Clock()
    publisher = MetricsPublisher(
        custom, core, "node-p", lambda: sampler.rows, lambda: sampler.sampled_at, POLICY, clock=clock
    )
    asyncio.run(sampler.sample_once())
    assert publisher.sync_once() == "first"
    assert "ownerReferences" not in custom.objects["node-p"]["metadata"]  # the Node could not be read
    metrics.write_text("{not json")
    when[0] = T0 + dt.timedelta(seconds=600)
    asyncio.run(sampler.sample_once())
    assert sampler.last_error and sampler.sampled_at == T0
    clock.now = 10_000.0
    assert publisher.sync_once() == "" and publisher.writes == 1


def test_a_lost_gpu_publishes_no_readings_only_that_it_is_lost(tmp_path: Path) -> None:
    sampler, metrics, _ = sampler_on(tmp_path)
    metrics.write_text(json.dumps({"gpu0": {"lost": True}}))
    asyncio.run(sampler.sample_once())
    custom = FakeCustom()
    core = SimpleNamespace(read_node=lambda name: SimpleNamespace(metadata=SimpleNamespace(uid="u")))
    MetricsPublisher(
        custom, core, "node-p", lambda: sampler.rows, lambda: sampler.sampled_at, POLICY
    ).sync_once()
    first = custom.objects["node-p"]["status"]["gpus"][0]
    assert first == {"id": first["id"], "index": 0, "memoryTotalMiB": 16_384, "lost": True}


# -- the contract, as a reader sees it ---------------------------------------------------------------


def test_parse_reads_back_what_document_writes() -> None:
    gpus = [gpu(xid=0, ecc_uncorrected=0, temperature_c=40.5, power_w=200.0), gpu("g1", lost=True)]
    doc = livemetrics.document("n", gpus, T0, 30, 300, owner_uid="u")
    report = livemetrics.parse(json.loads(json.dumps(doc)))
    assert report.node == "n" and report.update_time == T0 and list(report.gpus.values()) == gpus
    doc["status"]["updateTime"] = "2026-03-01T12:00:00.250+01:00"  # any RFC 3339 time
    assert livemetrics.parse(doc).update_time == dt.datetime(2026, 3, 1, 11, 0, 0, 250_000, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"status": None}, "status is missing"),
        ({"updateTime": "yesterday"}, "updateTime"),
        ({"updateTime": "2026-03-01T12:00:00"}, "updateTime"),  # no time zone
        ({"gpus": {"g0": {}}}, "list"),
        ({"gpu": {"utilization": 101}}, r"utilization=101 is outside 0..100"),
        ({"gpu": {"utilization": "hot"}}, "not a number"),
        ({"gpu": {"memoryUsedMiB": -1}}, "memoryUsedMiB"),
        ({"gpu": {"memoryUsedMiB": 1.5}}, "memoryUsedMiB"),
        ({"gpu": {"xid": True}}, "xid"),
        ({"gpu": {"lost": "yes"}}, "lost"),
        ({"gpu": {"id": ""}}, "id"),
        ({"gpu": {"index": -1}}, "index"),
        ({"twice": True}, "listed twice"),
    ],
)
def test_parse_names_what_no_node_could_report(change: dict[str, Any], says: str) -> None:
    doc = livemetrics.document("n", [gpu()], T0, 30, 300)
    status = doc["status"]
    if "status" in change:
        doc["status"] = change["status"]
    if "updateTime" in change:
        status["updateTime"] = change["updateTime"]
    if "gpus" in change:
        status["gpus"] = change["gpus"]
    if "gpu" in change:
        status["gpus"][0].update(change["gpu"])
    if "twice" in change:
        status["gpus"].append(dict(status["gpus"][0]))
    with pytest.raises(ValueError, match=says):
        livemetrics.parse(doc)


def test_the_flags_build_the_publisher(tmp_path: Path) -> None:
    from kubernetes import client

    from crishim.assemble import build_metrics_publisher
    from kubegpu.cli import build_parser

    sampler, _, _ = sampler_on(tmp_path)
    base = ["crishim", "--device-plugin", "sim", "--node-name", "node-p", "--advertise"]
    args = build_parser().parse_args(base)
    built = build_metrics_publisher(args, sampler, client.ApiClient())
    assert built is not None and built.policy == PublishPolicy(30.0, 300.0, 5.0, 5.0)
    flags = ["--metrics-publish-interval", "10", "--metrics-publish-refresh", "120"]
    flags += ["--metrics-utilization-threshold", "2.5", "--metrics-memory-threshold", "10"]
    built = build_metrics_publisher(build_parser().parse_args(base + flags), sampler, client.ApiClient())
    assert built is not None and built.policy == PublishPolicy(10.0, 120.0, 2.5, 10.0)
    off = build_parser().parse_args([*base, "--metrics-publish-interval", "0"])
    assert build_metrics_publisher(off, sampler, client.ApiClient()) is None
    assert build_metrics_publisher(args, None, client.ApiClient()) is None  # --telemetry-interval 0
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--metrics-utilization-threshold", "101"])
