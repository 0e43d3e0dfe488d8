"""The live scheduler against the in-memory apiserver (tests/support/schedworld.py) in the
interleavings a hostile review of issue 9 tried: binds in flight while the pod is recreated under
the same name, the list is redone or the node is deleted; terminating pods; init containers and
sidecars; preemption against higher priorities, budgets and victims that leave by themselves;
pod affinity to terminating pods; spreading over nodes without the topology label; malformed
placement rules. Each one held when it was tried; these keep it so."""

from __future__ import annotations

import copy
from typing import Any

from tests.support.schedworld import Feed, World, drive, make_scheduler, node_json, pod_json
from tests.test_sched_preempt_live import HOSTNAME, add, by_name, settle, setup


def world_with(*nodes: dict[str, Any]) -> tuple[World, Any, Any, Any, Any, Feed]:
    world = World()
    for node in nodes:
        world.put_node(node)
    scheduler, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    return world, scheduler, jobs, core, clock, feed


def decide_all(scheduler: Any) -> None:
    while scheduler.schedule_next(0):
        pass


def test_a_pod_recreated_under_its_name_while_its_binding_is_in_flight() -> None:
    """The Binding carries the old uid: the apiserver answers 409; whether the deletion is seen
    before the answer or only by the read-back, the new pod is placed and nothing stays booked."""
    for deletion_seen_first in (True, False):
        world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
        world.put_pod(pod_json("p", 4))
        feed.sync()
        decide_all(scheduler)
        world.delete_pod("uid-p")
        world.put_pod(pod_json("p", 2, uid="uid-p2"))
        if deletion_seen_first:
            feed.sync()
        jobs.run_all()
        assert core.binds[0][2] == "ok" and world.node_of("p") is None  # refused: another uid
        drive(scheduler, jobs, feed, clock)
        assert world.node_of("p") == "n1" and len(world.devices_of("p")) == 2
        assert not scheduler.cache.assumed and not scheduler.cache.check_consistency()


def test_a_relist_while_a_binding_is_in_flight_keeps_its_devices_booked() -> None:
    world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
    world.put_pod(pod_json("p", 2))
    feed.sync()
    decide_all(scheduler)
    feed.relist()
    world.put_pod(pod_json("q", 4))
    feed.sync()
    decide_all(scheduler)
    jobs.run_all()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1" and world.node_of("q") is None
    assert not world.double_booked()


def test_a_node_deleted_and_recreated_while_a_binding_is_in_flight() -> None:
    world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
    world.put_pod(pod_json("p", 3))
    feed.sync()
    decide_all(scheduler)
    world.delete_node("n1")
    feed.sync()
    jobs.run_all()  # the apiserver binds to a node name it does not check
    feed.sync()
    world.put_node(node_json("n1", gpus=4))
    world.put_pod(pod_json("q", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1" and world.node_of("q") is None
    assert not world.double_booked()


def test_a_terminating_pod_holds_its_devices_until_it_is_gone() -> None:
    world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
    world.put_pod(pod_json("p", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    terminating = copy.deepcopy(world.find("ns", "p"))
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world.put_pod(terminating)
    world.put_pod(pod_json("q", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("q") is None
    assert scheduler.cluster.placement.index.facts["uid-p"].terminating
    world.delete_pod("uid-p")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("q") == "n1"


def test_an_init_container_asking_more_gpus_than_the_app_holds_them_all() -> None:
    """Kubernetes charges the pod max(init, app): 4 GPUs, also as a fact after a restart."""
    world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
    init = [{"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]
    world.put_pod(pod_json("p", 1, init=init))
    world.put_pod(pod_json("q", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") == "n1" and len(world.devices_of("p")) == 4
    assert world.node_of("q") is None
    restarted, jobs2, _core2, clock2 = make_scheduler(world)
    feed2 = Feed(world, restarted)
    feed2.relist()
    drive(restarted, jobs2, feed2, clock2)
    assert world.node_of("q") is None


def test_sidecar_gpus_add_to_every_later_init_container_and_the_app() -> None:
    world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
    def gpus(count: str) -> dict[str, Any]:
        return {"limits": {"nvidia.com/gpu": count}}

    init = [
        {"name": "side", "image": "x", "restartPolicy": "Always", "resources": gpus("2")},
        {"name": "warm", "image": "x", "resources": gpus("3")},
    ]
    world.put_pod(pod_json("p", 1, init=init))  # max(1 + 2, 3 + 2) = 5 GPUs: fits no node
    world.put_pod(pod_json("q", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("p") is None and world.node_of("q") == "n1"


def test_no_preemption_that_would_need_a_higher_priority_victim() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=4)])
    add(world, feed, pod_json("high", 2, priority=10))
    add(world, feed, pod_json("low", 2, priority=1))
    settle(scheduler, jobs, feed)
    add(world, feed, pod_json("mid", 4, priority=5))
    settle(scheduler, jobs, feed)
    assert core.evictions == [] and "uid-mid" not in scheduler.nominated


def test_a_victim_its_budget_protects_is_passed_over_for_another_node() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=2), node_json("n2", gpus=2)])
    db = pod_json("db", 2, priority=1)
    db["metadata"]["labels"] = {"app": "db"}
    add(world, feed, db)
    add(world, feed, pod_json("batch", 2, priority=1))
    settle(scheduler, jobs, feed)
    scheduler.replace_budgets(
        [
            {
                "metadata": {"name": "keep-db", "namespace": "ns"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": 0},
            }
        ]
    )
    add(world, feed, pod_json("urgent", 2, priority=9))
    settle(scheduler, jobs, feed)
    assert core.evictions == ["batch"]


def test_a_victim_deleted_before_its_eviction_leaves_the_room_to_the_preemptor() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=2)])
    add(world, feed, pod_json("low", 2, priority=1))
    settle(scheduler, jobs, feed)
    add(world, feed, pod_json("high", 2, priority=9))
    decide_all(scheduler)
    world.delete_pod("uid-low")
    jobs.run_all()  # the eviction answers 404
    feed.sync()
    clock.advance(60)
    settle(scheduler, jobs, feed)
    assert by_name(world, "high")["spec"]["nodeName"] == "n1"
    assert not jobs.errors


def test_a_terminating_pod_still_counts_for_pod_affinity() -> None:
    """As in kube-scheduler: pod affinity sees terminating pods (spreading does not)."""
    scheduler, jobs, core, clock, world, feed = setup(
        [node_json(n, gpus=2, labels={HOSTNAME: n}) for n in ("n1", "n2")]
    )
    web = pod_json("web", 1)
    web["metadata"]["labels"] = {"app": "web"}
    add(world, feed, web)
    settle(scheduler, jobs, feed)
    node = by_name(world, "web")["spec"]["nodeName"]
    terminating = copy.deepcopy(by_name(world, "web"))
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    world.put_pod(terminating)
    feed.sync()
    near = pod_json("near", 1)
    near["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOSTNAME}
            ]
        }
    }
    add(world, feed, near)
    settle(scheduler, jobs, feed)
    assert by_name(world, "near")["spec"]["nodeName"] == node


def test_spreading_never_uses_a_node_without_the_topology_label() -> None:
    scheduler, jobs, core, clock, world, feed = setup(
        [
            node_json("n1", gpus=4, labels={"zone": "a"}),
            node_json("n2", gpus=4, labels={"zone": "b"}),
            node_json("n3", gpus=8),
        ]
    )
    for k in range(4):
        pod = pod_json(f"s{k}", 1)
        pod["metadata"]["labels"] = {"app": "s"}
        pod["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "s"}},
            }
        ]
        add(world, feed, pod)
    settle(scheduler, jobs, feed)
    assert sorted(by_name(world, f"s{k}")["spec"]["nodeName"] for k in range(4)) == ["n1", "n1", "n2", "n2"]


def test_malformed_placement_rules_get_an_event_and_the_others_are_placed() -> None:
    world, scheduler, jobs, core, clock, feed = world_with(node_json("n1", gpus=4))
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    bad_selector = {"matchExpressions": [{"key": "a", "operator": "Foo"}]}
    rules = {
        "no-key": ({"podAffinity": {required: [{"labelSelector": {}}]}}, "topologyKey must be a label key"),
        "operator": (
            {"podAntiAffinity": {required: [{"labelSelector": bad_selector, "topologyKey": "h"}]}},
            "operator 'Foo'",
        ),
        "weight": (
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0}]}},
            "weight must be an integer",
        ),
        "junk": ("junk", "spec.affinity must be an object"),
    }
    for name, (affinity, _) in rules.items():
        pod = pod_json(name, 1)
        pod["spec"]["affinity"] = affinity
        world.put_pod(pod)
    world.put_pod(pod_json("good", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("good") == "n1"
    for name, (_, message) in rules.items():
        assert world.node_of(name) is None
        assert any(message in m for m in core.failed_events(name)), (name, core.failed_events(name))
