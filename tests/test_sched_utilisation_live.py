"""The live scheduler and its nodes' published GPU readings (NodeGpuMetric, docs/utilisation.md):
what is trusted, staleness, the memory guard and unfit GPUs in FailedScheduling, the static score
label and the configuration keys; driven with scripted watch events (tests/support/schedworld)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
from typing import Any

import pytest

from kubegpu import livemetrics
from kubegpu.livemetrics import GpuReport, NodeReport
from scheduler.core.state import LiveGpu
from scheduler.live.config import ConfigError, SchedulerConfig, load_config, validate
from scheduler.live.translate import node_facts
from scheduler.live.utilisation import distrust, live_readings, unfit_reason
from tests.support.schedworld import GPU_MEMORY_MIB, World, drive, gpu_id, make_scheduler, node_json, pod_json
from tests.test_sched_cache import Feed

NOW = dt.datetime.now(dt.UTC)


def metrics(node: str, gpus: int, util: float = 0.0, used: int = 0, ago: float = 0.0, **fields: Any) -> dict:
    """The NodeGpuMetric ``node``'s agent would write, sampled ``ago`` seconds before now."""
    reports = [GpuReport(gpu_id(node, i), i, util, used, GPU_MEMORY_MIB, **fields) for i in range(gpus)]
    return livemetrics.document(node, reports, dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago), 30, 300)


def setup(nodes: list[dict], **overrides: Any):
    world = World()
    for node in nodes:
        world.put_node(node)
    scheduler, jobs, core, clock = make_scheduler(world, **overrides)
    feed = Feed(world, scheduler)
    feed.relist()
    return world, scheduler, jobs, core, clock, feed


def logged(caplog: pytest.LogCaptureFixture, message: str) -> list[dict[str, Any]]:
    return [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == message]


# -- what the scheduler trusts (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, ""),
        ({"xid": 0, "ecc_uncorrected": 0}, ""),
        ({"xid": 13}, ""),  # application errors, as NVIDIA's device plugin skips them
        ({"xid": 31}, ""),
        ({"xid": 43}, ""),
        ({"xid": 45}, ""),
        ({"xid": 68}, ""),
        ({"xid": 109}, ""),
        ({"xid": 79}, "XID 79"),
        ({"xid": 48}, "XID 48"),
        ({"ecc_uncorrected": 2}, "2 uncorrectable ECC error(s) since the driver loaded"),
        ({"lost": True, "utilization": None}, "lost (the driver lost the GPU)"),
    ],
)
def test_which_reports_take_a_gpu_out_of_placement(fields: dict[str, Any], reason: str) -> None:
    assert unfit_reason(GpuReport(**{"id": "g", "index": 0, "utilization": 5.0, **fields})) == reason


def test_stale_and_future_reports_are_not_trusted_but_an_unfit_gpu_stays_out() -> None:
    report = NodeReport(
        "n", NOW, {"g": GpuReport("g", 0, 40.0, 100, xid=79), "h": GpuReport("h", 1, 10.0, 5)}
    )
    assert distrust(report, NOW + dt.timedelta(seconds=600), 600) == ""
    assert distrust(report, NOW + dt.timedelta(seconds=601), 600) == "sampled 601s ago (stale after 600s)"
    assert distrust(report, NOW - dt.timedelta(seconds=301), 600).endswith(
        "in the future of the scheduler's clock"
    )
    assert live_readings(report, trusted=True) == {"g": LiveGpu(40.0, 100, "XID 79"), "h": LiveGpu(10.0, 5)}
    assert live_readings(report, trusted=False) == {"g": LiveGpu(unfit="XID 79"), "h": LiveGpu()}


# -- placement ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides", [{"policy": "utilization"}, {"policy": "topology", "utilization_weight": 1.0}]
)
def test_of_two_nodes_equal_by_allocation_the_pod_goes_to_the_cool_one(overrides: dict[str, Any]) -> None:
    for hot, cool in (("n1", "n2"), ("n2", "n1")):
        world, scheduler, jobs, _core, clock, feed = setup(
            [node_json("n1", 2), node_json("n2", 2)], **overrides
        )
        scheduler.replace_gpu_metrics([metrics(hot, 2, util=90.0), metrics(cool, 2, util=10.0)])
        for k in range(3):
            world.put_pod(pod_json(f"p{k}", 1, cpu="1"))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        assert [world.node_of(f"p{k}") for k in range(3)] == [cool] * 2 + [hot], overrides


def test_stale_readings_are_ignored_and_the_log_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """n1's report says it is idle but was sampled 700 s ago (bound 600 s): never trusted, it counts as
    100 % busy, so the pod goes to n2, which reports 90 %."""
    world, scheduler, jobs, _core, clock, feed = setup(
        [node_json("n1", 2), node_json("n2", 2)], policy="utilization", utilization_stale_seconds=600
    )
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        scheduler.replace_gpu_metrics([metrics("n1", 2, util=0.0, ago=700), metrics("n2", 2, util=90.0)])
        world.put_pod(pod_json("p", 1))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n2"
    (ignored,) = logged(caplog, "node.metrics_ignored")
    assert ignored["node"] == "n1" and re.fullmatch(
        r"sampled 70[01]s ago \(stale after 600s\)", ignored["reason"]
    )


def test_readings_that_age_while_held_become_unknown(caplog: pytest.LogCaptureFixture) -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 2)], policy="utilization")
    scheduler.replace_gpu_metrics([metrics("n1", 2, util=20.0, used=1000, ago=590)])
    cluster = scheduler.cache.view()
    assert (
        cluster.node_util.tolist() == [20.0]
        and cluster.gpu_live_free[0].tolist() == [GPU_MEMORY_MIB - 1000] * 2
    )
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=15)
    scheduler.cache.now = lambda: later
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        cluster = scheduler.cache.view()
    assert cluster.node_util.tolist() == [100.0] and not (cluster.gpu_live_free < 1 << 40).any()
    assert [f["node"] for f in logged(caplog, "node.metrics_ignored")] == ["n1"]
    # a fresh report is trusted again, and says so
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        scheduler.apply_gpu_metrics("MODIFIED", metrics("n1", 2, util=30.0, ago=-15))
    assert scheduler.cache.view().node_util.tolist() == [30.0]
    assert logged(caplog, "node.metrics_trusted") == [{"node": "n1"}]


def test_the_memory_guard_is_named_in_failed_scheduling_and_lifts_when_memory_frees() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 1)], policy="topology")
    scheduler.replace_gpu_metrics([metrics("n1", 1, util=5.0, used=GPU_MEMORY_MIB - 2000)])
    world.put_pod(pod_json("share", annotations={"kubegpu.io/gpu-memory-mib": "4096"}))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("share") is None
    assert core.failed_events("share") == [
        "0/1 nodes are available: 1 GPU memory in use leaves too little for the share (live)."
    ]
    scheduler.apply_gpu_metrics("MODIFIED", metrics("n1", 1, util=5.0, used=1000))
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("share") == "n1"


def test_an_unfit_gpu_leaves_placement_within_one_report_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 2)], policy="topology")
    world.put_pod(pod_json("first", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    held = world.node_of("first")
    assert held == "n1"
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        scheduler.apply_gpu_metrics("ADDED", metrics("n1", 2, xid=79))
        world.put_pod(pod_json("second", 1))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
    assert world.node_of("second") is None and world.node_of("first") == "n1"  # its pod is not touched
    assert core.failed_events("second")[-1] == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    out = logged(caplog, "gpu.out_of_placement")
    assert sorted(f["device"] for f in out) == [gpu_id("n1", 0), gpu_id("n1", 1)]
    assert {f["reason"] for f in out} == {"XID 79"}
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        scheduler.apply_gpu_metrics("MODIFIED", metrics("n1", 2, xid=0))
        drive(scheduler, jobs, feed, clock)
    assert world.node_of("second") == "n1" and not world.double_booked()
    assert len(logged(caplog, "gpu.back_in_placement")) == 2


def test_a_deleted_or_unreadable_report_leaves_the_readings_unknown(caplog: pytest.LogCaptureFixture) -> None:
    _world, scheduler, *_ = setup([node_json("n1", 1), node_json("n2", 1)], policy="utilization")
    scheduler.replace_gpu_metrics([metrics("n1", 1, util=50.0, xid=79), metrics("n2", 1, util=20.0)])
    assert scheduler.cache.view().node_util.tolist() == [50.0, 20.0]
    broken = metrics("n2", 1, util=20.0)
    broken["status"]["gpus"][0]["utilization"] = 250
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        scheduler.apply_gpu_metrics("MODIFIED", broken)
        scheduler.apply_gpu_metrics("MODIFIED", broken)  # logged once
    assert scheduler.cache.view().node_util.tolist() == [50.0, 100.0]
    assert logged(caplog, "node.metrics_unreadable") == [
        {"node": "n2", "reason": "status.gpus[0].utilization=250 is outside 0..100"}
    ]
    scheduler.replace_gpu_metrics([])  # n1's object deleted (its Node kept): unknown, back in placement
    cluster = scheduler.cache.view()
    assert cluster.node_util.tolist() == [100.0, 100.0] and cluster.gpu_free[0].tolist() == [1000]


def test_a_rebuilt_view_keeps_the_readings() -> None:
    world, scheduler, *_ = setup([node_json("n1", 1)], policy="utilization")
    scheduler.replace_gpu_metrics([metrics("n1", 1, util=40.0, used=3000, xid=79)])
    rebuilds = scheduler.cache.rebuilds
    scheduler.apply_node("MODIFIED", node_json("n1", 1, labels={"zone": "b"}))
    cluster = scheduler.cache.view()
    assert scheduler.cache.rebuilds == rebuilds + 1
    assert cluster.node_util.tolist() == [40.0] and cluster.gpu_free[0].tolist() == [-1]


def test_the_static_score_label(caplog: pytest.LogCaptureFixture) -> None:
    label = "kubegpu.io/static-score"
    assert node_facts(node_json("n", 1, labels={label: "35.5"})).static_score == 35.5
    for bad in ("high", "101", "-1", "nan"):
        facts = node_facts(node_json("n", 1, labels={label: bad}))
        assert facts.static_score == 100.0 and facts.static_problem and not facts.problem
    nodes = [node_json("low", 1, labels={label: "10"}), node_json("odd", 1, labels={label: "x"})]
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        world, scheduler, jobs, _core, clock, feed = setup(nodes, policy="utilization")
        world.put_pod(pod_json("p", 1))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "odd"  # unreadable: the default, 100
    assert logged(caplog, "node.static_score_ignored") == [
        {"node": "odd", "reason": "label kubegpu.io/static-score='x' is not a number 0..100"}
    ]


# -- configuration -----------------------------------------------------------------------------------------


def test_the_configuration_keys(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "c.yaml"
    path.write_text("utilizationWeight: 2\nutilizationStaleSeconds: 120\npolicy: utilization\n")
    config = load_config(path)
    assert (config.utilization_weight, config.utilization_stale_seconds, config.policy) == (
        2.0,
        120.0,
        "utilization",
    )
    validate(config)
    assert (SchedulerConfig().utilization_weight, SchedulerConfig().utilization_stale_seconds) == (0.0, 600.0)
    for weight in (-0.5, math.nan, math.inf, 1001.0):
        with pytest.raises(ConfigError, match="utilizationWeight must be 0 to 1000"):
            validate(SchedulerConfig(utilization_weight=weight))
    with pytest.raises(ConfigError, match="utilizationStaleSeconds must be more than 0"):
        validate(SchedulerConfig(utilization_stale_seconds=0.0))
    path.write_text("utilizationWeight: heavy\n")
    with pytest.raises(ConfigError, match="utilizationWeight must be float"):
        load_config(path)


def test_a_group_waiting_for_gpus_taken_out_is_placed_when_they_come_back() -> None:
    from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL

    world, scheduler, jobs, core, clock, feed = setup(
        [node_json("n1", 4), node_json("n2", 4)], policy="topology"
    )
    scheduler.replace_gpu_metrics([metrics("n2", 4, xid=79)])
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup"}
    world.put_group(
        PLUGINS_API, {**group, "metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 2}}
    )
    for name in ("a", "b"):
        world.put_pod(pod_json(name, 4, labels={PLUGINS_LABEL: "g"}))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert [world.node_of(n) for n in ("a", "b")] == [None, None]
    scheduler.apply_gpu_metrics("MODIFIED", metrics("n2", 4, xid=0))
    drive(scheduler, jobs, feed, clock)
    assert sorted(str(world.node_of(n)) for n in ("a", "b")) == ["n1", "n2"]
