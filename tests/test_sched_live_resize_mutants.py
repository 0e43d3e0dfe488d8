"""What the mutation run of the live scheduler's functions changed since their last measurement
showed untested (docs/testing.md, "Then the functions changed before 4d9596d"): the kubelet's
reported resources read entry by entry, the resize condition among others, a victim's other
resources and host ports as preemption sees them, a node's static-score label and zero
allocatables, and the cache's readings: their log lines, what they wake, and the static-score
problem logged once."""

from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal
from typing import Any

import pytest

from kubegpu import livemetrics
from kubegpu.livemetrics import GpuReport
from scheduler.core.request import HostPort
from scheduler.core.state import Allocation
from scheduler.live.cache import Cache
from scheduler.live.podspec import container_statuses, resize_infeasible
from scheduler.live.preemption import running_pod
from scheduler.live.translate import STATIC_SCORE_LABEL, node_facts, static_score
from tests.support.schedworld import GPU_MEMORY_MIB, KEYS, beating_at, gpu_id, node_json


def test_an_unreadable_reported_quantity_leaves_the_others_and_zero_is_a_quantity() -> None:
    pod = {
        "status": {
            "containerStatuses": [
                {
                    "name": "app",
                    "resources": {"requests": {"cpu": "lots", "memory": "1Gi", "example.com/foo": "0"}},
                    "allocatedResources": {"cpu": "-1", "memory": "2Gi"},
                }
            ]
        }
    }
    running, allocated = container_statuses(pod)["app"]
    assert running == {"memory": Decimal(2**30), "example.com/foo": Decimal(0)}
    assert allocated == {"memory": Decimal(2**31)}


def test_the_resize_condition_is_found_among_others_and_a_pod_may_have_no_status() -> None:
    others = [{"type": "PodScheduled", "status": "True", "reason": "Infeasible"}, "not a condition"]
    refused = {"type": "PodResizePending", "status": "True", "reason": "Infeasible"}
    assert resize_infeasible({"status": {"conditions": [*others, refused]}})
    assert not resize_infeasible({"status": {"conditions": others}})
    assert not resize_infeasible({"status": {"conditions": [{**refused, "reason": "Deferred"}]}})
    assert not resize_infeasible({})
    assert not resize_infeasible({"status": "pending"})


def test_a_victim_frees_its_other_resources_memory_in_bytes_and_host_ports() -> None:
    port = HostPort("TCP", "0.0.0.0", 8080)
    alloc = Allocation(
        node="n1",
        pod_uid="u",
        pod_name="ns/p",
        memory_mib=512,
        resources=(("example.com/foo", 2),),
        host_ports=(port,),
    )
    victim = running_pod(alloc, {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {}})
    assert victim.resources == {"example.com/foo": 2, "memory": 512 * 2**20}
    assert victim.host_ports == (port,)


def test_statuses_of_init_containers_count_and_an_entry_without_resources_is_skipped() -> None:
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "starting"},  # no resources reported yet
                {"name": "app", "resources": {"requests": {"cpu": "2"}}},
            ],
            "initContainerStatuses": [{"name": "sidecar", "resources": {"requests": {"cpu": "1"}}}],
        }
    }
    assert container_statuses(pod) == {
        "app": ({"cpu": Decimal(2)}, {}),
        "sidecar": ({"cpu": Decimal(1)}, {}),
    }


# --- translate: a node's figures and labels ---------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "score", "ignored"),
    [("0", 0.0, False), ("0.5", 0.5, False), ("100", 100.0, False), ("100.5", 100.0, True)],
)
def test_the_static_score_label_takes_0_to_100_inclusive(raw: str, score: float, ignored: bool) -> None:
    value, problem = static_score({STATIC_SCORE_LABEL: raw})
    assert value == score and bool(problem) == ignored


def test_an_allocatable_of_zero_is_zero() -> None:
    node = node_json("n1", 1)
    node["status"]["allocatable"]["example.com/foo"] = "0"
    node["status"]["allocatable"]["memory"] = "0"
    facts = node_facts(node)
    assert facts.allocatable["example.com/foo"] == 0 and facts.allocatable["memory"] == 0
    node["status"]["allocatable"]["example.com/foo"] = "lots"
    assert node_facts(node).problem == "node's allocatable example.com/foo is unreadable ('lots')"


# --- the cache: readings, their log lines and what they wake ----------------------------------

START = dt.datetime.now(dt.UTC).replace(microsecond=0)


def metrics_cache(*nodes: dict[str, Any]) -> Cache:
    cache = Cache("kubegpu", lambda: KEYS, now=lambda: START, metrics_stale_after=600)
    cache.replace_nodes([beating_at(n, START) for n in nodes])
    cache.view()
    return cache


def report(node: str, gpus: list[GpuReport], ago: float = 0.0) -> dict[str, Any]:
    return livemetrics.document(node, gpus, START - dt.timedelta(seconds=ago), 30, 300)


def events(caplog: pytest.LogCaptureFixture, message: str) -> list[tuple[str, dict[str, Any]]]:
    return [(r.levelname, getattr(r, "fields", {})) for r in caplog.records if r.getMessage() == message]


def test_gpus_out_of_and_back_in_placement_are_logged_once_each_with_node_and_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = metrics_cache(node_json("n1", 1))
    gid = gpu_id("n1", 0)
    broken = report("n1", [GpuReport(gid, 0, 10.0, 5, GPU_MEMORY_MIB, xid=79)])
    fine = report("n1", [GpuReport(gid, 0, 10.0, 5, GPU_MEMORY_MIB)])
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        cache.apply_metrics("ADDED", broken)
        cache.apply_metrics("MODIFIED", fine)
        cache.apply_metrics("MODIFIED", fine)
        cache.apply_metrics("MODIFIED", report("n1", [GpuReport(gid, 0, 10.0, 5, GPU_MEMORY_MIB)], ago=900))
    assert events(caplog, "gpu.out_of_placement") == [
        ("WARNING", {"node": "n1", "device": gid, "reason": "XID 79"})
    ]
    assert events(caplog, "gpu.back_in_placement") == [("INFO", {"node": "n1", "device": gid})]
    ((level, fields),) = events(caplog, "node.metrics_ignored")
    assert level == "WARNING" and fields["node"] == "n1"


def test_readings_on_a_view_about_to_be_rebuilt_wake_the_queue() -> None:
    cache = metrics_cache(node_json("n1", 1))
    cache.dirty = True  # an event changed something: the next view is rebuilt with the readings
    full = [GpuReport(gpu_id("n1", 0), 0, 10.0, 5, GPU_MEMORY_MIB)]
    assert cache.apply_metrics("ADDED", report("n1", full)) is True


def test_a_relist_of_readings_says_whether_it_may_let_something_fit() -> None:
    cache = metrics_cache(node_json("n1", 1))
    assert cache.replace_metrics([]) is False
    full = [GpuReport(gpu_id("n1", 0), 0, 90.0, GPU_MEMORY_MIB, GPU_MEMORY_MIB)]
    cache.replace_metrics([report("n1", full)])
    assert cache.replace_metrics([]) is True  # its report is gone: the memory guard falls back to the books
    free = [GpuReport(gpu_id("n1", 0), 0, 0.0, 0, GPU_MEMORY_MIB)]
    cache.replace_metrics([report("n1", full)])
    assert cache.replace_metrics([report("n1", free)]) is True


def test_an_ignored_static_score_label_is_logged_once_per_problem(caplog: pytest.LogCaptureFixture) -> None:
    """Once while the node keeps the label, and again after the node was gone and came back."""
    labelled = node_json("n1", 1, labels={STATIC_SCORE_LABEL: "high"})
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        cache = metrics_cache(labelled, node_json("n2", 1))
        for _ in range(2):
            cache.dirty = True
            cache.view()
        assert [f["node"] for _, f in events(caplog, "node.static_score_ignored")] == ["n1"]
        cache.replace_nodes([node_json("n2", 1)])
        cache.view()
        cache.replace_nodes([labelled, node_json("n2", 1)])
        cache.view()
        cache.dirty = True
        cache.view()
    assert [f["node"] for _, f in events(caplog, "node.static_score_ignored")] == ["n1", "n1"]


def test_a_node_whose_readings_were_dropped_is_not_said_to_be_trusted_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stale report is ignored (logged); an unreadable successor drops it; a fresh report later is
    the node's first trusted one, not a return to trust."""
    cache = metrics_cache(node_json("n1", 1))
    gpus = [GpuReport(gpu_id("n1", 0), 0, 10.0, 5, GPU_MEMORY_MIB)]
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler.cache"):
        cache.apply_metrics("ADDED", report("n1", gpus, ago=900))
        cache.apply_metrics("MODIFIED", {"metadata": {"name": "n1"}})  # unreadable: readings dropped
        cache.apply_metrics("MODIFIED", report("n1", gpus))
        assert len(events(caplog, "node.metrics_ignored")) == 1
        assert events(caplog, "node.metrics_trusted") == []
        cache.apply_metrics("MODIFIED", report("n1", gpus, ago=900))
        cache.apply_metrics("MODIFIED", report("n1", gpus))
    assert [f for _, f in events(caplog, "node.metrics_trusted")] == [{"node": "n1"}]
