"""The live scheduler's cache, queue and binds against an in-memory apiserver (tests/support/schedworld).

Each test reproduces one way a device could be handed out twice, a pod could be stuck, or a
Kubernetes rule could be broken (issue 9), driving the real ``Scheduler`` with scripted watch
events and Binding answers.
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest

import scheduler.live.scheduler as live
import scheduler.live.translate as translate
from crishim.advertiser import INVENTORY_ANNOTATION
from kubegpu import allocation as contract
from scheduler.live.config import LeaderElection
from tests.fixtures.keys import SIGNING
from tests.support.schedworld import (
    KEYS,
    Clock,
    Feed,
    World,
    drive,
    gpu_id,
    inventory_json,
    make_scheduler,
    node_json,
    pod_json,
)


def setup(nodes: list[dict], **overrides):
    world = World()
    for node in nodes:
        world.put_node(node)
    scheduler, jobs, core, clock = make_scheduler(world, **overrides)
    feed = Feed(world, scheduler)
    feed.relist()
    return world, scheduler, jobs, core, clock, feed


def signed(pod: dict, node: str, devices: list[str], container: str = "app") -> dict:
    """``pod`` bound to ``node`` with a valid allocation of ``devices`` (as another binder leaves it)."""
    pod = copy.deepcopy(pod)
    pod["spec"]["nodeName"] = node
    allocation = contract.Allocation(
        node, pod["metadata"]["uid"], {container: contract.ContainerAllocation(tuple(devices))}
    )
    pod["metadata"]["annotations"][contract.ANNOTATION] = contract.sign(allocation, "k1", SIGNING["k1"])
    return pod


# --- item 1: bound pods are facts -----------------------------------------------------------------


def test_a_bound_pod_keeps_its_gpus_when_the_nodes_cpu_drops() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 4, cpu="64")])
    world.put_pod(pod_json("big", 4, cpu="8"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("big") == "n1"
    world.put_node(node_json("n1", 4, cpu="4"))  # allocatable CPU drops below what big uses
    world.put_pod(pod_json("next", 1, cpu="100m"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("next") is None and not world.double_booked()


def test_after_a_restart_bound_gpus_are_booked_whatever_comes_first_in_the_list() -> None:
    world = World()
    world.put_node(node_json("n1", 4, cpu="8"))
    # Another scheduler's CPU-only pod takes all the CPU and is listed first; then a kubegpu pod
    # holding all 4 GPUs: the node is over-committed on CPU, which must not free the GPUs.
    world.put_pod(pod_json("cpu-hog", cpu="8", scheduler="default-scheduler", node="n1"))
    world.put_pod(signed(pod_json("holder", 4, cpu="1"), "n1", [gpu_id("n1", i) for i in range(4)]))
    world.put_pod(pod_json("next", 1, cpu="0"))
    scheduler, jobs, _core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("next") is None and not world.double_booked()


# --- item 2: devices by id ------------------------------------------------------------------------


def test_a_gpu_vanishing_while_a_bind_is_in_flight_keeps_the_others_booked() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 5)])
    world.put_pod(pod_json("a", 3))
    feed.sync()
    assert scheduler.schedule_next(0) and len(jobs.binds()) == 1  # decided, the bind in flight
    # GPU-0 drops out of the inventory: indices shift (GPU-1 is now index 0).
    world.put_node(node_json("n1", [(gpu_id("n1", i), True) for i in (1, 2, 3, 4)]))
    world.put_pod(pod_json("b", 1))
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    jobs.run_all()
    feed.sync()
    assert not world.double_booked(), world.device_holders()
    assert world.devices_of("a") == [gpu_id("n1", i) for i in range(3)]
    assert world.devices_of("b") == [gpu_id("n1", 3)]
    # GPU-0 comes back: a holds it, so nothing is left for c.
    world.put_node(node_json("n1", 5))
    world.put_pod(pod_json("c", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("c") is None and not world.double_booked()


# --- item 3 and 6: bind answers -------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["connection", "timeout", "500", "429", "403"])
def test_a_bind_that_was_not_stored_is_retried_never_left_assumed(outcome: str) -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 4)])
    answers = iter([outcome])
    core.bind_outcome = lambda ns, name, body: next(answers, "ok")
    world.put_pod(pod_json("p", 2))
    feed.sync()
    assert scheduler.schedule_next(0)
    jobs.run_all()
    assert not jobs.errors, jobs.errors  # nothing escapes into a future nobody reads
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1"
    assert scheduler.assumed == {}
    assert [o for _, _, o in core.binds] == [outcome, "ok"]


@pytest.mark.parametrize("outcome", ["500-after-commit", "504-after-commit", "timeout-after-commit"])
def test_a_failed_bind_that_was_stored_keeps_its_devices(outcome: str) -> None:
    """The apiserver stored the Binding and then answered 5xx (or the answer was lost)."""
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 2)])
    answers = iter([outcome])
    core.bind_outcome = lambda ns, name, body: next(answers, "ok")
    world.put_pod(pod_json("a", 1))
    world.put_pod(pod_json("b", 1))
    world.put_pod(pod_json("c", 1))
    feed.sync()
    assert scheduler.schedule_next(0)
    jobs.run_all()  # a: stored, then the error; the watch has not shown it bound yet
    while scheduler.schedule_next(0):
        pass
    jobs.run_all()
    assert not world.double_booked(), world.device_holders()
    drive(scheduler, jobs, feed, clock)
    assert not world.double_booked(), world.device_holders()
    assert sorted(n for n in ("a", "b", "c") if world.node_of(n)) == ["a", "b"]
    assert scheduler.assumed == {} and not jobs.errors


def test_a_bind_stored_while_the_read_back_fails_is_resolved_once_the_api_answers() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 1)])
    core.bind_outcome = lambda ns, name, body: "timeout-after-commit"
    core.read_error = lambda: ConnectionResetError("apiserver unreachable")
    world.put_pod(pod_json("a", 1))
    feed.sync()
    scheduler.schedule_next(0)
    jobs.run_all()
    feed.skip("pods")  # the watch broke: the bound event is lost
    for _ in range(5):
        clock.advance(30)
        scheduler.schedule_next(0)
        jobs.run_all()
    assert list(scheduler.assumed) == ["uid-a"]  # kept while nothing is known
    core.read_error = None
    clock.advance(30)
    scheduler.schedule_next(0)
    jobs.run_all()
    assert scheduler.assumed == {} and scheduler.cluster is not None
    assert scheduler.cluster.allocation("uid-a") is not None  # booked from the pod as read


# --- item 6: another replica, leadership ----------------------------------------------------------


def test_when_another_replica_bound_the_pod_its_annotation_replaces_our_assumption() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 2)])
    world.put_pod(pod_json("p", 1))
    feed.sync()
    scheduler.schedule_next(0)  # we assume p on GPU-0 (lowest index); our bind is in flight
    world.put_pod(signed(world.find("ns", "p"), "n1", [gpu_id("n1", 1)]))  # the other replica won
    feed.sync()
    jobs.run_all()  # our bind: 409
    world.put_pod(pod_json("q", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.devices_of("p") == [gpu_id("n1", 1)]
    assert world.devices_of("q") == [gpu_id("n1", 0)]
    assert not world.double_booked()


def test_a_former_leaders_bind_landing_after_the_new_leader_listed() -> None:
    """A checked is_leader, then its POST was slow; B took over and listed before it landed."""
    world = World()
    world.put_node(node_json("n1", 2))
    world.put_pod(pod_json("p", 1))
    old, old_jobs, _old_core, _ = make_scheduler(world)
    old_feed = Feed(world, old)
    old_feed.relist()
    clock = Clock()
    election = LeaderElection(enabled=True)
    new, new_jobs, _new_core, _ = make_scheduler(world, clock=clock, leader_election=election)
    new.leading.clear()
    new_feed = Feed(world, new)
    new_feed.relist()  # the standby's caches: p pending, both GPUs free
    assert old.schedule_next(0)  # the old leader decides p, checks its lease, POSTs...
    new.became_leader()  # ... the lease expires and the new leader takes over ...
    old_jobs.run_all()  # ... and the old leader's Binding lands.
    world.put_pod(pod_json("q", 1))
    new_feed.sync("pods", limit=0)  # the new leader's watch lags
    new.apply_pod("ADDED", copy.deepcopy(world.find("ns", "q")))
    for _ in range(3):
        clock.advance(new.config.bind_timeout_seconds)
        while new.schedule_next(0):
            pass
        new_jobs.run_all()
    assert world.node_of("q") == "n1"
    assert not world.double_booked(), world.device_holders()


# --- item 4: relists ------------------------------------------------------------------------------


def test_a_relist_drops_the_assumptions_of_pods_gone_meanwhile() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 4)])
    world.put_pod(pod_json("a", 4))
    feed.sync()
    scheduler.schedule_next(0)
    jobs.run_all()  # bound; the watch is down: neither the bind nor the delete is seen
    world.delete_pod("uid-a")
    feed.skip("pods")
    feed.relist("pods")
    world.put_pod(pod_json("b", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("b") == "n1"
    assert "uid-a" not in scheduler.assumed


# --- item 5: malformed nodes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "null",
        "[]",
        '{"topology": []}',
        '{"version": 1, "topology": []}',
        '{"version": 1, "devices": "x"}',
        '{"version": 1, "devices": [null]}',
        '{"version": 1, "devices": [{"id": "g"}]}',
        '{"version": 1, "devices": [{"id": "g", "kind": "gpu", "index": "zero"}]}',
        '{"version": 1, "devices": [], "topology": {"nvlink": [[1]]}}',
        '{"version": 1, "devices": [], "topology": {"nicGpus": 5}}',
        "",
        "{",
        "7",
        json.dumps(
            {
                "version": 1,
                "devices": [
                    {"id": "dup", "kind": "gpu", "index": 0, "model": "A100"},
                    {"id": "dup", "kind": "gpu", "index": 1, "model": "A100"},
                ],
            }
        ),
    ],
)
def test_a_malformed_inventory_costs_only_its_node(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    bad = node_json("bad", 8, inventory=raw)
    world, scheduler, jobs, core, clock, feed = setup([bad, node_json("good", 1)])
    world.put_pod(pod_json("one", 1))
    world.put_pod(pod_json("two", 1))
    feed.sync()
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        drive(scheduler, jobs, feed, clock)
    assert world.node_of("one") == "good" or world.node_of("two") == "good"
    waiting = "two" if world.node_of("one") else "one"
    message = core.failed_events(waiting)[0]
    assert "1 node's device inventory is unreadable" in message, message
    assert any(
        r.getMessage() == "node.excluded" and r.fields["node"] == "bad"  # type: ignore[attr-defined]
        for r in caplog.records
    )
    # A watch event with the same bad node must not break anything either.
    world.put_node(bad)
    feed.sync()
    # Fixed: the node is used again.
    world.put_node(node_json("bad", 8))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of(waiting) == "bad"


def test_a_node_object_of_the_wrong_shape_costs_only_itself() -> None:
    weird = node_json("weird", 4)
    weird["metadata"]["annotations"] = ["not", "a", "map"]
    world, scheduler, jobs, _core, clock, feed = setup([weird, node_json("good", 1)])
    world.put_pod(pod_json("p", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "good"
    assert "node object unreadable" in scheduler.cache.excluded["weird"]


# --- items 7, 8, 9: Kubernetes' rules --------------------------------------------------------------


def test_init_container_gpus_are_allocated_and_signed() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 4)])
    init = [{"name": "warmup", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
    world.put_pod(pod_json("p", 1, init=init))
    world.put_pod(pod_json("q", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    raw = world.find("ns", "p")["metadata"]["annotations"][contract.ANNOTATION]
    containers = contract.verify(raw, KEYS).containers
    assert len(containers["warmup"].devices) == 3 and len(containers["app"].devices) == 1
    assert set(containers["app"].devices) <= set(containers["warmup"].devices)
    assert world.node_of("q") == "n1" and not world.double_booked()


def test_sidecars_and_overhead_count_for_bound_pods() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 0, cpu="4")])
    bound = pod_json("other", cpu="1", scheduler="default-scheduler", node="n1")
    bound["spec"]["initContainers"] = [
        {"name": "proxy", "image": "x", "restartPolicy": "Always", "resources": {"requests": {"cpu": "2"}}}
    ]
    bound["spec"]["overhead"] = {"cpu": "500m"}
    world.put_pod(bound)  # 1 + 2 + 0.5 = 3.5 of the 4 CPUs
    world.put_pod(pod_json("p", cpu="1"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") is None


def test_allocatable_pods_is_respected() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 8, pods="2")])
    for index in range(5):
        world.put_pod(pod_json(f"p{index}", cpu="100m"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert sum(1 for i in range(5) if world.node_of(f"p{i}")) == 2


def test_gpus_of_pods_bound_by_other_schedulers_count() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 4)])
    world.put_pod(pod_json("theirs", 3, scheduler="default-scheduler", node="n1"))
    world.put_pod(pod_json("two", 2))
    world.put_pod(pod_json("one", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("two") is None and world.node_of("one") == "n1"
    assert "1 Insufficient nvidia.com/gpu" in core.failed_events("two")[0]


# --- item 11: the queue ---------------------------------------------------------------------------


def test_freed_gpus_go_to_the_oldest_waiting_pod_and_priority_comes_first() -> None:
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 4)])
    world.put_pod(pod_json("holder", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    stamps = [f"2026-02-01T00:00:{s:02d}Z" for s in range(12)]
    order = [7, 3, 9, 0, 5, 1, 8, 2, 6, 4]  # created out of name order
    for index, stamp in enumerate(order):
        world.put_pod(pod_json(f"w{index}", 4, created=stamps[stamp]))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.delete_pod("uid-holder")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    bound = [f"w{i}" for i in range(10) if world.node_of(f"w{i}")]
    assert bound == [f"w{order.index(0)}"]  # the one created first
    world.delete_pod(f"uid-{bound[0]}")
    world.put_pod(pod_json("urgent", 4, priority=1000, created=stamps[11]))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("urgent") == "n1"


def test_no_polling_while_pods_wait_in_backoff() -> None:
    """The scheduling thread sleeps until the next pod is ready, not in short polls."""
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 1)], backoff_initial_seconds=8.0)
    core.bind_outcome = lambda ns, name, body: "403"
    world.put_pod(pod_json("p", 1))
    feed.sync()
    scheduler.schedule_next(0)
    jobs.run_all()  # refused: p backs off for 8 s
    waits: list[float | None] = []
    real_wait = scheduler.cond.wait

    def record(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return real_wait(0)

    scheduler.cond.wait = record  # type: ignore[method-assign]
    clock.advance(3)
    assert not scheduler.schedule_next(timeout=60)
    assert waits == [pytest.approx(5.0)]


# --- the audit's survivors: cordons, 404/409 answers, repeated events -------------------------------


def test_a_nodes_status_update_keeps_its_inventory_so_a_rebuild_finds_its_link_matrix() -> None:
    """A heartbeat (or any update that leaves the node's facts equal) keeps the inventory object the
    view was built from; after another node's change rebuilds the view, the node's GPU link matrix is
    found again rather than built (0.1 ms a node; a cluster of 5,000 nodes rebuilds them all)."""
    world, scheduler, _jobs, _core, _clock, feed = setup([node_json("n1", 4), node_json("n2", 4)])
    cache = scheduler.cache
    inventory = cache.facts["n1"].inventory
    links = scheduler._view().nodes[cache.cluster.index["n1"]].links()
    world.put_node(node_json("n1", 4))  # a new heartbeat, the same inventory
    feed.sync()
    assert cache.facts["n1"].inventory is inventory
    world.put_node(node_json("n2", 4, labels={"zone": "b"}))  # another node changes: a rebuild
    feed.sync()
    rebuilds = cache.rebuilds
    view = scheduler._view()
    assert cache.rebuilds == rebuilds + 1
    assert view.nodes[view.index["n1"]].links() is links
    world.put_node(node_json("n1", 4, labels={"zone": "b"}))  # its own facts change: new facts
    feed.sync()
    assert cache.facts["n1"].labels == {"zone": "b"} and cache.facts["n1"].inventory == inventory


def test_cordoned_nodes_take_no_pods() -> None:
    """kube-scheduler's NodeUnschedulable rule and words; a pod tolerating the unschedulable taint
    still goes there (DaemonSet pods do)."""
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 4, cordoned=True)])
    world.put_pod(pod_json("p", 1))
    tolerating = pod_json("t", 1)
    tolerating["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    ]
    world.put_pod(tolerating)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("t") == "n1"
    assert world.node_of("p") is None
    assert core.failed_events("p")[0] == "0/1 nodes are available: 1 node(s) were unschedulable."
    world.put_node(node_json("n1", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1"


def test_a_404_bind_is_not_retried() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 4)])
    world.put_pod(pod_json("p", 1))
    feed.sync()
    scheduler.schedule_next(0)
    world.delete_pod("uid-p")  # gone before the POST: 404
    jobs.run_all()
    for _ in range(3):  # well past any backoff, before the watch shows the delete
        clock.advance(60)
        while scheduler.schedule_next(0):
            pass
        jobs.run_all()
    assert [o for _, _, o in core.binds] == ["ok"] and core.reads == 0
    assert scheduler.assumed == {}


def test_a_409_bind_is_not_retried() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 4)])
    world.put_pod(pod_json("p", 1))
    feed.sync()
    scheduler.schedule_next(0)
    world.put_pod(signed(world.find("ns", "p"), "n1", [gpu_id("n1", 3)]))  # someone else bound it
    jobs.run_all()  # 409
    for _ in range(3):
        clock.advance(60)
        while scheduler.schedule_next(0):
            pass
        jobs.run_all()
    assert [o for _, _, o in core.binds] == ["ok"]  # the one POST, answered 409
    assert scheduler.assumed == {}
    assert scheduler.cluster is not None
    assert scheduler.cluster.allocation("uid-p").device_ids() == (gpu_id("n1", 3),)


def test_the_same_event_is_not_posted_again_within_30_seconds() -> None:
    world, scheduler, jobs, core, clock, feed = setup([node_json("n1", 1)])
    world.put_pod(pod_json("p", 2))
    feed.sync()
    for step in range(6):  # a node change every 5 s makes p retry each time
        world.put_node(node_json("n1", 1, labels={"step": str(step)}))
        feed.sync()
        drive(scheduler, jobs, feed, Clock())  # its own clock: only ours measures the 30 s
        clock.advance(5)
    assert len(core.failed_events("p")) == 1  # retried at 5, 10, 15 and 25 s: not posted again
    clock.advance(10)  # past 30 s and past p's backoff
    world.put_node(node_json("n1", 1, labels={"step": "last"}))
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    jobs.run_all()
    assert len(core.failed_events("p")) == 2


def test_a_pods_own_status_update_does_not_release_it_from_the_unschedulable_queue() -> None:
    world, scheduler, jobs, _core, _clock, feed = setup([node_json("n1", 1)])
    world.put_pod(pod_json("p", 2))
    feed.sync()
    scheduler.schedule_next(0)
    jobs.run_all()
    pod = world.find("ns", "p")
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
    world.put_pod(pod)
    feed.sync()
    assert scheduler.queue.where("uid-p") == "parked"


def test_nics_in_an_allocation_are_not_reported_missing(caplog: pytest.LogCaptureFixture) -> None:
    node = node_json("n1", 2)
    node["metadata"]["annotations"][INVENTORY_ANNOTATION] = inventory_json(
        [(gpu_id("n1", 0), True), (gpu_id("n1", 1), True)], nics=["mlx5_0"]
    )
    world = World()
    world.put_node(node)
    world.put_pod(signed(pod_json("p", 1), "n1", [gpu_id("n1", 0), "mlx5_0"]))
    scheduler, jobs, _core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    with caplog.at_level(logging.WARNING, logger="kubegpu.scheduler.cache"):
        feed.relist()
        world.put_pod(pod_json("q", 2))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
    assert world.node_of("q") is None
    assert not [r for r in caplog.records if "allocation_" in r.getMessage()]


def test_a_bound_pods_devices_stay_booked_when_its_annotation_is_tampered_with() -> None:
    """Its containers got the devices the first valid annotation named; a later edit frees none.
    (Shares: the kubelet's GPU count does not protect them.)"""
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 1)])
    world.put_pod(pod_json("p", annotations={"kubegpu.io/gpu-milli": "600"}))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1"
    for value in ("garbage", None):
        pod = world.find("ns", "p")
        if value is None:
            del pod["metadata"]["annotations"][contract.ANNOTATION]
        else:
            pod["metadata"]["annotations"][contract.ANNOTATION] = value
        world.put_pod(pod)
        world.put_pod(pod_json(f"q-{value}", annotations={"kubegpu.io/gpu-milli": "600"}))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        assert world.node_of(f"q-{value}") is None


@pytest.mark.parametrize(
    ("node", "uid", "reason"),
    [
        ("n1", "uid-p", ""),
        ("n1", "uid-someone-else", "allocation ignored: it is for another node or pod"),
        ("n2", "uid-p", "allocation ignored: it is for another node or pod"),
    ],
)
def test_only_an_allocation_signed_for_this_pod_on_this_node_is_verified(
    node: str, uid: str, reason: str
) -> None:
    value = contract.sign(
        contract.Allocation(node, uid, {"app": contract.ContainerAllocation(("GPU-a",))}), "k1", SIGNING["k1"]
    )
    signed, problem = translate.verified_allocation(value, KEYS, "n1", "uid-p")
    assert problem == reason
    assert (signed is not None) == (not reason)
    assert translate.verified_allocation(None, KEYS, "n1", "uid-p") == (None, "")
    assert translate.verified_allocation("x", KEYS, "n1", "uid-p")[1].startswith("allocation ignored: ")


@pytest.mark.parametrize("copied_from", ["another pod", "another node"])
def test_a_pod_carrying_an_allocation_signed_for_another_pod_or_node_books_no_devices(
    copied_from: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A valid allocation copied onto a pod it was not made for (another scheduler, or a user,
    bound the pod with it) names devices that pod does not hold: they stay free for ours."""
    world, scheduler, jobs, _core, clock, feed = setup([node_json("n1", 1), node_json("n2", 0)])
    thief = pod_json("thief", scheduler="default-scheduler", node="n1")
    signed_for = ("n1", "uid-victim") if copied_from == "another pod" else ("n2", "uid-thief")
    allocation = contract.Allocation(*signed_for, {"app": contract.ContainerAllocation((gpu_id("n1", 0),))})
    thief["metadata"]["annotations"][contract.ANNOTATION] = contract.sign(allocation, "k1", SIGNING["k1"])
    world.put_pod(thief)
    world.put_pod(pod_json("p", 1))
    caplog.set_level(logging.INFO)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1" and world.devices_of("p") == [gpu_id("n1", 0)]
    booked = scheduler.cache.view().allocation("uid-thief")
    assert booked is not None and booked.gpus == () and booked.cpu_milli == 1000
    logged = [getattr(r, "fields", {}) for r in caplog.records if r.getMessage() == "pod.allocation_problem"]
    assert [(f["pod"], f["reason"]) for f in logged] == [
        ("ns/thief", "allocation ignored: it is for another node or pod")
    ]


def test_a_new_leader_lists_before_it_decides_and_retries_a_failed_list_after_a_backoff() -> None:
    world = World()
    world.put_node(node_json("n1", 1))
    world.put_pod(pod_json("p", 1))
    scheduler, jobs, core, clock = make_scheduler(world, leader_election=LeaderElection(enabled=True))
    Feed(world, scheduler).relist()
    scheduler.became_leader()
    assert not scheduler.schedule_next(0) and not jobs.pending  # still within the fence
    clock.advance(scheduler.config.bind_timeout_seconds)
    core.list_error = lambda: ConnectionRefusedError("apiserver down")
    lists = []
    real = core.list_pod_for_all_namespaces

    def counted(**kwargs):
        lists.append(clock.now)
        return real(**kwargs)

    core.list_pod_for_all_namespaces = counted  # type: ignore[method-assign]
    scheduler.pod_reflector._list_call = counted
    for _ in range(5):
        assert not scheduler.schedule_next(0)
    assert len(lists) == 1  # not again before the backoff
    core.list_error = None
    clock.advance(scheduler.config.backoff_initial_seconds)
    while scheduler.schedule_next(0):
        pass
    assert len(lists) == 2 and len(jobs.binds()) == 1


def test_the_contract_lets_only_init_containers_reuse_a_whole_device() -> None:
    def doc(init: object) -> dict:
        return {
            "version": 1,
            "node": "n",
            "podUID": "u",
            "containers": {
                "warm": {"devices": ["g0"], "init": init},
                "app": {"devices": ["g0"]},
            },
        }

    assert contract.parse_document(doc(True)).containers["warm"].init
    with pytest.raises(contract.AllocationError, match="given whole to one of app, warm"):
        contract.parse_document(doc(False))
    with pytest.raises(contract.AllocationError, match="init must be true or false"):
        contract.parse_document(doc("yes"))
    two_apps = doc(True)
    two_apps["containers"]["side"] = {"devices": ["g0"]}
    with pytest.raises(contract.AllocationError, match="given whole to one of app, side"):
        contract.parse_document(two_apps)


def test_a_pod_with_a_malformed_toleration_gets_an_event_and_the_others_are_placed() -> None:
    world = World()
    world.put_node(node_json("n1", gpus=4))
    scheduler, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    bad = pod_json("bad", 1)
    bad["spec"]["tolerations"] = [{"key": "a", "operator": {"": None}}]
    world.put_pod(bad)
    world.put_pod(pod_json("good", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert not jobs.errors
    assert world.node_of("good") == "n1" and world.node_of("bad") is None
    assert any("spec.tolerations[0]" in m for m in core.failed_events("bad"))


def test_an_error_deciding_one_pod_costs_only_that_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever raises while deciding a pod (a bug, an input nobody foresaw) must not stop the
    scheduling loop (scheduler.run on the main thread would exit): the pod is told and parked."""
    world = World()
    world.put_node(node_json("n1", gpus=4))
    scheduler, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    real = live.schedule_one

    def schedule_one(request: Any, *args: Any) -> Any:
        if request.uid == "uid-cursed":
            raise KeyError("surprise")
        return real(request, *args)

    monkeypatch.setattr(live, "schedule_one", schedule_one)
    world.put_pod(pod_json("cursed", 1, priority=10))
    world.put_pod(pod_json("fine", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock, decide_errors=True)
    assert world.node_of("fine") == "n1" and world.node_of("cursed") is None
    assert any("could not decide" in m and "surprise" in m for m in core.failed_events("cursed"))
    assert scheduler.queue.where("uid-cursed") in ("parked", "backoff", "active")
