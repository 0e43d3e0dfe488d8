"""A broken or hostile node agent cannot crash the scheduler or poison other nodes' decisions.

Pure tests of what the scheduler makes of a Node (scheduler/live/nodecheck.py, translate.py):
every adversarial case (tests/support/hostile.py) leaves the node out with a reason; thousands of
random mutations of a valid inventory never raise, and whatever is accepted schedules without
error on real policies beside a healthy node. The same cases go through a real API server in
tests/test_hostile_node.py.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pytest

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION, publication
from devices.sim import TOPOLOGY_DIR, SimPlugin
from scheduler.core.policies import make_policy
from scheduler.core.request import PodRequest, TopologyWish
from scheduler.core.schedule import Placement, schedule_one
from scheduler.core.state import ClusterState
from scheduler.live import nodecheck, nodeevents
from scheduler.live.translate import node_facts, node_state
from tests.support.hostile import FUTURE, adversarial, random_inventory

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
FRESH = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
STALE_AFTER = 3600.0


def inventory(topology: str, node: str, tmp: Path) -> str:
    return publication(SimPlugin(topology, node, tmp / node).discover()).inventory


def node(
    name: str, raw: str | None, heartbeat: str | None = FRESH, allocatable: dict[str, str] | None = None
) -> dict[str, Any]:
    annotations = {}
    if raw is not None:
        annotations[INVENTORY_ANNOTATION] = raw
    if heartbeat is not None:
        annotations[HEARTBEAT_ANNOTATION] = heartbeat
    return {
        "metadata": {"name": name, "annotations": annotations, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110", **(allocatable or {})}},
    }


def reason(obj: dict[str, Any]) -> str:
    return node_facts(obj).schedulable(NOW, STALE_AFTER)


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> str:
    return inventory("hgx-h100", "hostile", tmp_path_factory.mktemp("valid"))


@pytest.mark.parametrize("topology", sorted(p.stem for p in TOPOLOGY_DIR.glob("*.json")))
def test_every_shipped_topology_is_accepted(topology: str, tmp_path: Path) -> None:
    raw = inventory(topology, "n1", tmp_path)
    assert nodecheck.document_problem(json.loads(raw)) == ""
    assert reason(node("n1", raw)) == ""


@pytest.mark.parametrize("fixture", ["dgx1-v100", "dgx-a100", "hgx-h100", "pcie-4gpu", "rtx8000-4gpu"])
def test_what_the_nvidia_plugin_publishes_is_accepted(fixture: str) -> None:
    from devices.model import Sharing, with_sharing
    from tests.test_devices_nvidia import make

    _, plugin = make(fixture)
    for inventory in (plugin.discover(), with_sharing(plugin.discover(), lambda gpu: Sharing.MPS)):
        raw = publication(inventory).inventory
        assert nodecheck.document_problem(json.loads(raw)) == ""
        assert reason(node("n1", raw)) == ""


def test_the_valid_baseline_is_accepted(valid: str) -> None:
    assert reason(node("hostile", valid)) == ""


def test_every_adversarial_case_leaves_the_node_out(valid: str) -> None:
    cases = list(adversarial(valid))
    assert len(cases) > 50
    for case in cases:
        heartbeat = case.heartbeat or FRESH
        why = reason(node("hostile", case.inventory, heartbeat, case.allocatable))
        assert why, f"{case.name}: accepted"
        assert len(why) < 400 and "\n" not in why, (case.name, why)


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("duplicate-id", "share the id"),
        ("nvlink-unknown-device", "not listed"),
        ("nvlink-self", "with itself"),
        ("nvlink-negative", "link count"),
        ("nvlink-twice", "listed twice"),
        ("index-negative", "index"),
        ("memory-negative", "memoryMiB"),
        ("healthy-string", "healthy"),
        ("too-many-devices", "devices"),
        ("heartbeat-future", "future"),
        ("allocatable-cpu", "allocatable cpu"),
        ("allocatable-gpus", "allocatable GPU count"),
        ("allocatable-cpu-infinite", "allocatable cpu is unreadable"),
        ("allocatable-memory-nan", "allocatable memory is unreadable"),
        ("allocatable-memory-beyond-int64", "allocatable memory"),
        ("allocatable-pods-unreadable", "allocatable pods is unreadable"),
        ("allocatable-gpus-infinite", "allocatable GPU count is unreadable"),
        ("device-long-id", "id"),
        ("deep-nesting", "inventory"),
    ],
)
def test_reasons_name_the_field(valid: str, case: str, words: str) -> None:
    found = next(c for c in adversarial(valid) if c.name == case)
    why = reason(node("hostile", found.inventory, found.heartbeat or FRESH, found.allocatable))
    assert words in why, why


def test_heartbeat_skew_is_tolerated_up_to_the_limit(valid: str) -> None:
    ahead = NOW + dt.timedelta(seconds=nodecheck.CLOCK_SKEW_SECONDS - 1)
    assert reason(node("n", valid, ahead.strftime("%Y-%m-%dT%H:%M:%SZ"))) == ""
    far = NOW + dt.timedelta(seconds=nodecheck.CLOCK_SKEW_SECONDS + 60)
    assert "future" in reason(node("n", valid, far.strftime("%Y-%m-%dT%H:%M:%SZ")))
    assert "future" in reason(node("n", valid, FUTURE))


def test_a_node_recovers_when_it_publishes_something_valid(valid: str) -> None:
    assert reason(node("n", "{")) != ""
    assert reason(node("n", valid)) == ""


PODS = [
    PodRequest("one", cpu_milli=1000, memory_mib=1024, gpu_count=1),
    PodRequest("two", cpu_milli=1000, memory_mib=1024, gpu_count=2, topology=TopologyWish()),
    PodRequest("four", cpu_milli=1000, memory_mib=1024, gpu_count=4),
    PodRequest("share", cpu_milli=500, memory_mib=512, gpu_count=1, gpu_milli=300),
    PodRequest("cpu", cpu_milli=500, memory_mib=512),
]


def _schedule_beside_a_healthy_node(hostile: dict[str, Any], healthy: dict[str, Any], policy: str) -> None:
    facts = [node_facts(hostile), node_facts(healthy)]
    usable = [f for f in facts if not f.schedulable(NOW, STALE_AFTER)]
    cluster = ClusterState([node_state(f) for f in usable])
    chosen = make_policy(policy)
    chosen.bind(cluster, PODS, random.Random(0))
    for pod in PODS:
        result = schedule_one(pod, cluster, chosen, random.Random(1))
        if isinstance(result, Placement):
            listed = {g.id for g in cluster.node(result.allocation.node).gpus}
            assert {g.id for g in result.allocation.gpus} <= listed


@pytest.mark.parametrize("seed", range(4))
def test_random_inventories_never_raise_and_what_is_accepted_schedules(
    valid: str, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    healthy = node("healthy", inventory("dgx1-v100", "healthy", tmp_path))
    accepted = 0
    for k in range(600):
        raw = random_inventory(valid, rng)
        hostile = node("hostile", raw)
        why = reason(hostile)  # must not raise
        assert "\n" not in why
        if not why:
            accepted += 1
            _schedule_beside_a_healthy_node(hostile, healthy, ("topology", "fgd-align", "spread")[k % 3])
    assert accepted < 600  # most mutations break the document; the rest are valid variations


def test_a_hostile_node_does_not_change_the_healthy_nodes_scores(valid: str, tmp_path: Path) -> None:
    """Normalised policies compare nodes with each other: an excluded node must not take part."""
    healthy = [
        node(f"h{i}", inventory(t, f"h{i}", tmp_path)) for i, t in enumerate(["dgx1-v100", "pcie-4gpu"])
    ]
    for case in adversarial(valid):
        hostile = node("hostile", case.inventory, case.heartbeat or FRESH, case.allocatable)
        facts = [node_facts(n) for n in (hostile, *healthy)]
        usable = [f for f in facts if not f.schedulable(NOW, STALE_AFTER)]
        assert [f.name for f in usable] == ["h0", "h1"], case.name


# ---------------------------------------------------------------------------------------- Node Events


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _events() -> tuple[nodeevents.NodeEvents, list[tuple[str, str, str, str]], Clock]:
    posted: list[tuple[str, str, str, str]] = []
    clock = Clock()
    return nodeevents.NodeEvents(lambda *a: posted.append(a), clock), posted, clock


def test_node_events_are_posted_for_bad_publications_only(valid: str) -> None:
    events, posted, clock = _events()
    cordoned = node("c", valid)
    cordoned["spec"]["unschedulable"] = True
    facts = {
        "ok": node_facts(node("ok", valid)),
        "cpu-only": node_facts(node("cpu-only", None)),
        "stale": node_facts(node("stale", valid, heartbeat="2001-01-01T00:00:00Z")),
        "c": node_facts(cordoned),
        "bad": node_facts(node("bad", "{")),
        "future": node_facts(node("future", valid, heartbeat=FUTURE)),
    }
    events.update(facts, NOW, changed=True)
    assert sorted((p[0], p[1], p[3]) for p in posted) == [
        ("bad", nodeevents.WARNING_REASON, "Warning"),
        ("future", nodeevents.WARNING_REASON, "Warning"),
    ]
    assert "not JSON" in next(p[2] for p in posted if p[0] == "bad")
    events.update(facts, NOW, changed=True)
    assert len(posted) == 2  # the same problem is said once


def test_node_events_are_rate_limited_and_recovery_is_said(valid: str) -> None:
    events, posted, clock = _events()
    events.update({"n": node_facts(node("n", "{"))}, NOW, changed=True)
    assert len(posted) == 1
    for k in range(50):  # a node that changes its nonsense all the time
        clock.t += 1
        events.update({"n": node_facts(node("n", "[" * (k + 1)))}, NOW, changed=True)
    assert len(posted) == 1 and events.pending
    clock.t += nodeevents.MIN_INTERVAL_SECONDS
    events.update({"n": node_facts(node("n", "[[["))}, NOW, changed=False)  # the held-back change
    assert len(posted) == 2 and not events.pending
    clock.t += 1
    events.update({"n": node_facts(node("n", valid))}, NOW, changed=True)
    assert len(posted) == 2 and events.pending
    clock.t += nodeevents.MIN_INTERVAL_SECONDS
    events.update({"n": node_facts(node("n", valid))}, NOW, changed=False)
    assert posted[-1][:2] == ("n", nodeevents.RECOVERED_REASON) and posted[-1][3] == "Normal"
    clock.t += nodeevents.MIN_INTERVAL_SECONDS
    events.update({}, NOW, changed=True)  # the Node is gone: forgotten, nothing said
    events.update({"n": node_facts(node("n", valid))}, NOW, changed=True)
    assert len(posted) == 3


def test_a_long_node_event_note_is_cut_once_and_marked() -> None:
    # The node Event's message was cut to 1024 characters before the Event builder's own cut, so a
    # long ASCII message arrived at exactly 1024 bytes and the builder never added its " ..." marker.
    body = nodeevents.node_event("n1", nodeevents.WARNING_REASON, "x" * 3000, "Warning", "kubegpu", "r1")
    assert len(body["note"].encode()) == 1024 and body["note"].endswith(" ...")
    wide = nodeevents.node_event("n1", nodeevents.WARNING_REASON, "é" * 1500, "Warning", "kubegpu", "r1")
    assert len(wide["note"].encode()) <= 1024 and wide["note"].endswith(" ...")


def test_the_poster_creates_a_node_event_and_survives_a_failure() -> None:
    created: list[tuple[str, dict[str, Any]]] = []

    class Response:
        data = b"{}"

        def release_conn(self) -> None:
            created.append(("released", {}))

    class Core:
        fail = False

        def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> Response:
            if self.fail:
                raise OSError("connection refused")
            created.append((namespace, body))
            return Response()

    core = Core()
    post = nodeevents.poster(core, lambda f, *a: f(*a), "kubegpu", "replica-1")
    post("n1", nodeevents.WARNING_REASON, "node's device inventory is unreadable: x", "Warning")
    namespace, body = created[0]
    assert namespace == "default" and created[1][0] == "released"
    assert body["apiVersion"] == "events.k8s.io/v1"
    assert body["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "n1"}
    assert (body["reason"], body["type"], body["reportingController"], body["reportingInstance"]) == (
        nodeevents.WARNING_REASON,
        "Warning",
        "kubegpu",
        "replica-1",
    )
    core.fail = True
    post("n1", nodeevents.WARNING_REASON, "again", "Warning")  # logged, never raised


# ------------------------------------------------------------- the live scheduler (in-memory apiserver)


def _hostile_node_json(case: Any) -> dict[str, Any]:
    from tests.support.schedworld import node_json

    obj = node_json("bad", 8, labels={"role": "bad"})
    annotations = obj["metadata"]["annotations"]
    if case.inventory is None:
        annotations.pop(INVENTORY_ANNOTATION)
    else:
        annotations[INVENTORY_ANNOTATION] = case.inventory
    if case.heartbeat:
        annotations[HEARTBEAT_ANNOTATION] = case.heartbeat
    obj["status"]["allocatable"].update(case.allocatable)
    return obj


def test_the_live_scheduler_leaves_a_hostile_node_out_says_why_and_takes_it_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every adversarial case on one node while GPU pods keep arriving: all of them bound on the
    healthy node, a rate-limited Warning Event on the hostile one, a Normal one and placements on
    it once it publishes something valid."""
    import logging

    from tests.support.schedworld import Feed, World, drive, make_scheduler, node_json, pod_json

    valid = inventory("hgx-h100", "bad", tmp_path)
    cases = list(adversarial(valid))
    world = World()
    world.put_node(node_json("good", len(cases) + 4, cpu=str(len(cases) + 4)))  # room for one pod per case
    world.put_node(_hostile_node_json(cases[0]))
    scheduler, jobs, core, clock = make_scheduler(world)
    feed = Feed(world, scheduler)
    feed.relist()
    started = clock()
    with caplog.at_level(logging.INFO, logger="kubegpu.scheduler"):
        for k, case in enumerate(cases):
            world.put_node(_hostile_node_json(case))
            world.put_pod(pod_json(f"p{k}", 1))
            feed.sync()
            drive(scheduler, jobs, feed, clock)
            scheduler.post_node_events()
            jobs.run_all()
            assert scheduler.cache.excluded.get("bad"), case.name
            assert world.node_of(f"p{k}") == "good", case.name
    assert not jobs.errors
    warnings = [
        e for e in core.events if e["involvedObject"]["kind"] == "Node" and e["type"] == "Warning"
    ]
    assert all(e["involvedObject"]["name"] == "bad" for e in warnings)
    assert 1 <= len(warnings) <= 1 + (clock() - started) / nodeevents.MIN_INTERVAL_SECONDS
    reasons = {r.fields["reason"] for r in caplog.records if r.getMessage() == "node.excluded"}  # type: ignore[attr-defined]
    assert len(reasons) > len(cases) // 2  # the log line follows each change

    world.put_node(node_json("bad", 8, labels={"role": "bad"}))
    pod = pod_json("back", 1)
    pod["spec"]["nodeSelector"] = {"role": "bad"}
    world.put_pod(pod)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("back") == "bad"
    clock.advance(nodeevents.MIN_INTERVAL_SECONDS)
    scheduler.post_node_events()
    jobs.run_all()
    last = [e for e in core.events if e["involvedObject"]["kind"] == "Node"][-1]
    assert (last["reason"], last["type"]) == (nodeevents.RECOVERED_REASON, "Normal")


def test_only_the_leader_posts_node_events(tmp_path: Path) -> None:
    from tests.support.schedworld import Feed, World, make_scheduler, node_json

    world = World()
    world.put_node(node_json("bad", 8, inventory="{"))
    scheduler, jobs, core, _clock = make_scheduler(world)
    scheduler.leading.clear()
    Feed(world, scheduler).relist()
    scheduler.post_node_events()
    jobs.run_all()
    assert core.events == []
    scheduler.leading.set()  # became the leader: what it saw while following is said now
    scheduler.post_node_events()
    jobs.run_all()
    assert [e["reason"] for e in core.events] == [nodeevents.WARNING_REASON]
