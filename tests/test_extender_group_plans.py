"""The extender's kept gang plans (scheduler/live/groupplans.py): a gang's members chosen one at a
time are answered from one plan while it holds, with the answers a fresh plan gives, and planned
again when anything but the plan's own members changed the cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

import scheduler.live.extender as extender_module
from scheduler.live.extender import Extender
from scheduler.live.groupplans import GroupPlans
from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL
from tests.support.schedworld import Feed, World, make_scheduler, node_json, plugins_group, pod_json

NODES = ["n1", "n2", "n3"]


def args(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def gang(members: int, gpus: int = 2) -> tuple[World, Feed, Extender]:
    """Three nodes of 8 GPUs (n1 with 2 used); a PodGroup ``g`` of ``members`` pods of ``gpus``
    GPUs each, minMember all of them, pending for default-scheduler."""
    world = World()
    for name in NODES:
        world.put_node(node_json(name, 8))
    world.put_pod(pod_json("busy", 2, node="n1"))
    world.put_group(PLUGINS_API, plugins_group("g", members))
    sched, _jobs, _core, _clock = make_scheduler(world, name="default-scheduler")
    feed = Feed(world, sched)
    feed.relist()
    for i in range(members):
        world.put_pod(pod_json(f"m{i}", gpus, scheduler="default-scheduler", labels={PLUGINS_LABEL: "g"}))
    feed.sync()
    return world, feed, Extender(sched)


def choose_then_bind(world: World, feed: Feed, extender: Extender, name: str) -> str:
    _, answer = extender.handle("choose", args(world.pods[f"uid-{name}"], NODES))
    (node,) = answer["NodeNames"]
    bind = {"PodName": name, "PodNamespace": "ns", "PodUID": f"uid-{name}", "Node": node}
    assert extender.handle("bind", json.dumps(bind).encode())[1] == {"Error": ""}
    feed.sync()
    return node


@pytest.fixture
def plans_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The groups ``schedule_group`` planned for the extender, in order."""
    made: list[str] = []
    real = extender_module.schedule_group

    def counting(group: Any, *a: Any, **kw: Any) -> Any:
        made.append(group.name)
        return real(group, *a, **kw)

    monkeypatch.setattr(extender_module, "schedule_group", counting)
    return made


def test_a_gangs_members_are_answered_from_one_plan_with_the_nodes_a_fresh_plan_gives(
    plans_made: list[str],
) -> None:
    kept = gang(4)
    fresh = gang(4)
    nodes_kept, nodes_fresh = [], []
    for i in range(4):
        nodes_kept.append(choose_then_bind(kept[0], kept[1], kept[2], f"m{i}"))
        fresh[2].plans = GroupPlans()  # no plan kept: planned anew for every member
        nodes_fresh.append(choose_then_bind(fresh[0], fresh[1], fresh[2], f"m{i}"))
    assert nodes_kept == nodes_fresh and len(set(nodes_kept)) == 1  # four 2-GPU pods, one 8-GPU node
    assert plans_made.count("ns/g") == 1 + 4  # one plan for the kept world, four for the fresh one
    assert not kept[0].double_booked()


def test_another_pod_on_a_planned_node_makes_the_next_member_planned_again(plans_made: list[str]) -> None:
    world, feed, extender = gang(4)
    first = choose_then_bind(world, feed, extender, "m0")
    # a pod of 2 GPUs on that node: m1 would still fit its planned node, but m1 to m3 (6 GPUs)
    # no longer do, so the plan does not hold and is made again
    world.put_pod(pod_json("intruder", 2, node=first))
    feed.sync()
    choose_then_bind(world, feed, extender, "m1")
    assert len(plans_made) == 2  # planned again
    for name in ("m2", "m3"):
        choose_then_bind(world, feed, extender, name)
    assert len(plans_made) == 2 and not world.double_booked()  # the new plan answered the rest


def test_a_kept_plan_is_dropped_for_other_members_another_cluster_or_a_lost_change_log() -> None:
    world, feed, extender = gang(2)
    sched = extender.scheduler
    cluster = sched._view()
    plans = GroupPlans()
    plans.remember("g", ("k",), cluster, {"uid-m0": 1})
    assert plans.recall("g", ("k",), cluster, "uid-m0") == 1
    assert plans.recall("g", ("k",), cluster, "uid-m9") is None  # not a member of that plan
    assert plans.recall("g", ("other",), cluster, "uid-m0") is None  # members changed: dropped
    assert plans.recall("g", ("k",), cluster, "uid-m0") is None  # ... for good
    plans.remember("g", ("k",), cluster, {"uid-m0": 1})
    world.put_node(node_json("n4", 8))  # a new node: a new view
    feed.sync()
    assert plans.recall("g", ("k",), sched._view(), "uid-m0") is None
