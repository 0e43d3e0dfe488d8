"""kube-scheduler's conventions in the live scheduler, in memory (issue 23): the ``Scheduled`` Event
after a stored Binding, events.k8s.io/v1 Events reported as kube-scheduler reports them, the
``PodScheduled`` condition's reason and generation, and kube-scheduler's metric names. The same
against the real kube-scheduler on a real apiserver: tests/test_sched_events_api.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from scheduler.live import events
from scheduler.live import scheduler as live
from tests.support.schedworld import Feed, World, drive, make_scheduler, node_json, pod_json


def setup(nodes: int = 1) -> tuple[Any, Any, Any, Any, World, Feed]:
    world = World()
    for i in range(nodes):
        world.put_node(node_json(f"n{i + 1}", gpus=4))
    scheduler, jobs, core, clock = make_scheduler(world, identity="replica-a")
    feed = Feed(world, scheduler)
    feed.relist()
    return scheduler, jobs, core, clock, world, feed


def sample(scheduler: Any, name: str, **labels: str) -> float:
    return scheduler.metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_stored_binding_gets_kube_schedulers_scheduled_event_from_a_job_of_its_own() -> None:
    scheduler, jobs, core, _clock, world, feed = setup()
    world.put_pod(pod_json("p", 1))
    feed.sync()
    assert scheduler.schedule_next(0)
    [bind] = jobs.binds()
    jobs.run(bind)
    assert world.node_of("p") == "n1"
    assert not [e for e in core.posted if e["reason"] == "Scheduled"]  # not posted by the Binding's job
    assert [fn.__name__ for fn, _ in jobs.pending] == ["_post_scheduled"]
    jobs.run_all()
    [event] = [e for e in core.posted if e["reason"] == "Scheduled"]
    assert event["apiVersion"] == "events.k8s.io/v1" and event["metadata"]["namespace"] == "ns"
    assert event["metadata"]["name"].startswith("p.")
    note = "Successfully assigned ns/p to n1"
    assert (event["type"], event["action"], event["note"]) == ("Normal", "Binding", note)
    assert (event["reportingController"], event["reportingInstance"]) == ("kubegpu", "kubegpu-replica-a")
    regarding = {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "uid-p"}
    assert event["regarding"] == {**regarding, "resourceVersion": event["regarding"]["resourceVersion"]}
    assert event["eventTime"].endswith("Z") and "." in event["eventTime"]  # a MicroTime
    assert not {"count", "firstTimestamp", "lastTimestamp", "source", "involvedObject"} & set(event)


def test_a_binding_not_stored_gets_no_scheduled_event() -> None:
    scheduler, jobs, core, _clock, world, feed = setup()
    core.bind_outcome = lambda ns, name, body: "403"
    world.put_pod(pod_json("p", 1))
    feed.sync()
    assert scheduler.schedule_next(0)
    jobs.run_all()
    assert world.node_of("p") is None
    assert not [e for e in core.posted if e["reason"] == "Scheduled"]


def test_failed_scheduling_is_an_events_v1_event_and_the_condition_names_the_generation() -> None:
    scheduler, jobs, core, _clock, world, feed = setup()
    pod = pod_json("big", 8)
    pod["metadata"]["generation"] = 3
    world.put_pod(pod)
    feed.sync()
    assert scheduler.schedule_next(0)
    jobs.run_all()
    [event] = [e for e in core.posted if e["reason"] == "FailedScheduling"]
    kind = ("events.k8s.io/v1", "Warning", "Scheduling")
    assert (event["apiVersion"], event["type"], event["action"]) == kind
    assert event["note"].startswith("0/1 nodes are available: ")
    [patch] = core.status_patches
    [condition] = patch["status"]["conditions"]
    said = (condition["type"], condition["status"], condition["reason"])
    assert said == ("PodScheduled", "False", "Unschedulable")
    assert condition["message"] == event["note"] and condition["observedGeneration"] == 3


def test_an_error_while_deciding_is_a_scheduler_error(monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler, jobs, core, clock, world, feed = setup()

    def schedule_one(*_: Any, **__: Any) -> Any:
        raise KeyError("surprise")

    monkeypatch.setattr(live, "schedule_one", schedule_one)
    world.put_pod(pod_json("cursed", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock, decide_errors=True)
    conditions = [c for p in core.status_patches for c in p["status"]["conditions"]]
    assert conditions and {c["reason"] for c in conditions} == {"SchedulerError"}
    assert sample(scheduler, "scheduler_schedule_attempts_total", result="error", profile="kubegpu") >= 1


def test_kube_schedulers_metric_names_count_each_attempt_by_its_end() -> None:
    """scheduled when the Binding is stored, error when it is not (kube-scheduler's binding
    cycle), unschedulable; each with its duration, the queues as pending_pods."""
    scheduler, jobs, core, _clock, world, feed = setup()
    core.bind_outcome = lambda ns, name, body: "403" if name == "refused" else "ok"
    for name, gpus in (("fits", 1), ("refused", 1), ("big", 8)):
        world.put_pod(pod_json(name, gpus))
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    assert sample(scheduler, "scheduler_schedule_attempts_total", result="scheduled", profile="kubegpu") == 0
    jobs.run_all()
    counts = {
        result: sample(scheduler, "scheduler_schedule_attempts_total", result=result, profile="kubegpu")
        for result in ("scheduled", "unschedulable", "error")
    }
    assert counts == {"scheduled": 1, "unschedulable": 1, "error": 1}
    for result, count in counts.items():
        labels = {"result": result, "profile": "kubegpu"}
        assert sample(scheduler, "scheduler_scheduling_attempt_duration_seconds_count", **labels) == count
        bucket = "scheduler_scheduling_attempt_duration_seconds_bucket"
        assert sample(scheduler, bucket, le="16.384", **labels) == count  # kube-scheduler's largest
    assert sample(scheduler, "scheduler_scheduling_algorithm_duration_seconds_count") == 3
    assert sample(scheduler, "scheduler_pod_scheduling_attempts_count") == 1
    assert sample(scheduler, "scheduler_preemption_attempts_total") >= 1  # the unschedulable pod tried
    assert sample(scheduler, "scheduler_pending_pods", queue="unschedulable") >= 1
    assert sample(scheduler, "kubegpu_scheduler_attempts_total", result="scheduled") == 2  # by decision
    pending = [line for line in scheduler.metrics.render().decode().splitlines()
               if line.startswith("scheduler_pending_pods{")]
    assert {line.split('"')[1] for line in pending} == {"active", "backoff", "unschedulable"}


def test_notes_are_cut_to_the_apis_limit_as_kube_scheduler_cuts_them() -> None:
    assert events.truncate_note("x" * 1024) == "x" * 1024
    cut = events.truncate_note("é" * 600)  # 1200 bytes
    assert cut.endswith(" ...") and len(cut.encode()) <= 1024 and cut[:-4] == "é" * 510


def test_an_event_name_that_would_be_invalid_is_a_uuid() -> None:
    assert events.event_name("p", 0x1234abcd) == "p.1234abcd"
    long = events.event_name("a" * 253, 1)  # a valid pod name, 255 characters with the suffix
    assert str(uuid.UUID(long)) == long
