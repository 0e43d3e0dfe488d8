"""The live scheduler's gang path (docs/gang.md) against the in-memory apiserver
(tests/support/schedworld.py): whole or nothing, members and groups that arrive late or are
malformed, competing groups, elastic extras, minResources, timeouts, PodGroup status in both
APIs, a Binding that is not stored, a restart mid-gang, and the starvation guard."""

from __future__ import annotations

from typing import Any

from scheduler.live.podgroups import KUBE_API, PLUGINS_API, PLUGINS_LABEL
from tests.support.schedworld import Feed, World, drive, make_scheduler, node_json, plugins_group, pod_json
from tests.test_sched_preempt_live import add, settle, setup


def kube_group(name: str, min_count: int | None) -> dict[str, Any]:
    policy: dict[str, Any] = {"basic": {}} if min_count is None else {"gang": {"minCount": min_count}}
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"schedulingPolicy": policy},
    }


def member(name: str, gpus: int, group: str = "g", **kw: Any) -> dict[str, Any]:
    return pod_json(name, gpus, labels={PLUGINS_LABEL: group}, **kw)


def world_of(*nodes: dict[str, Any], **overrides: Any) -> tuple[World, Any, Any, Any, Any, Feed]:
    world = World()
    for node in nodes:
        world.put_node(node)
    scheduler, jobs, core, clock = make_scheduler(world, **overrides)
    feed = Feed(world, scheduler)
    feed.relist()
    return world, scheduler, jobs, core, clock, feed


def bound(world: World, *names: str) -> list[str | None]:
    return [world.node_of(n) for n in names]


def write_status(scheduler: Any, jobs: Any, feed: Feed) -> None:
    scheduler.write_group_statuses()
    jobs.run_all()
    feed.sync()


def messages(core: Any, name: str) -> list[str]:
    return [e["message"] for e in core.events if e["involvedObject"]["name"] == name]


def test_a_group_is_bound_whole_or_not_at_all() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 3))
    for name in ("a", "b", "c"):
        world.put_pod(member(name, 3))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert bound(world, "a", "b", "c") == [None, None, None]
    assert not core.binds and not scheduler.cache.assumed
    assert any("its 3 smallest members ask for 9 GPUs, the nodes have 8" in m for m in messages(core, "a"))
    world.put_node(node_json("n3", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert sorted(bound(world, "a", "b", "c")) == ["n1", "n2", "n3"]
    assert not world.double_booked()


def test_a_group_waits_for_its_minimum_of_members_then_goes_whole() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 8))
    world.put_group(PLUGINS_API, plugins_group("g", 3))
    world.put_pod(member("a", 2))
    world.put_pod(member("b", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert bound(world, "a", "b") == [None, None]
    assert any("has 2 of its 3 minimum members; waiting for the others" in m for m in messages(core, "a"))
    world.put_pod(member("c", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert bound(world, "a", "b", "c") == ["n1", "n1", "n1"]


def test_a_pod_naming_a_missing_group_waits_with_an_event_until_it_exists() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_pod(member("a", 1, group="later"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") is None
    assert any("waiting for pod group ns/later" in m and "to exist" in m for m in messages(core, "a"))
    world.put_group(PLUGINS_API, plugins_group("later", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") == "n1"


def test_malformed_groups_and_references_get_events_and_never_crash() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(PLUGINS_API, plugins_group("bad", "three"))
    world.put_group(PLUGINS_API, plugins_group("huge", 10**9))
    world.put_group(PLUGINS_API, plugins_group("res", 1, minResources={"cpu": "lots"}))
    world.put_group(PLUGINS_API, plugins_group("t", 1, scheduleTimeoutSeconds=-5))
    world.put_group(
        KUBE_API, {"metadata": {"name": "k", "namespace": "ns"}, "spec": {"schedulingPolicy": []}}
    )
    world.put_pod(member("a", 1, group="bad"))
    world.put_pod(member("b", 1, group="huge"))
    world.put_pod(member("c", 1, group="res"))
    world.put_pod(member("d", 1, group="t"))
    world.put_pod(pod_json("e", 1, group="k"))
    two = pod_json("f", 1, group="k", labels={PLUGINS_LABEL: "bad"})
    world.put_pod(two)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert bound(world, "a", "b", "c", "d", "e", "f") == [None] * 6
    assert any("spec.minMember must be an integer" in m for m in messages(core, "a"))
    assert any("spec.minMember must be between 1 and" in m for m in messages(core, "b"))
    assert any("spec.minResources.cpu: invalid quantity" in m for m in messages(core, "c"))
    assert any("spec.scheduleTimeoutSeconds must be between" in m for m in messages(core, "d"))
    assert any("spec.schedulingPolicy must be an object" in m for m in messages(core, "e"))
    assert any("joins two pod groups" in m for m in messages(core, "f"))
    world.put_group(PLUGINS_API, plugins_group("bad", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") == "n1"


def test_two_groups_that_fit_alone_but_not_together_never_end_half_placed() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    for group in ("x", "y"):
        world.put_group(PLUGINS_API, plugins_group(group, 2))
    # interleaved arrivals: x1, y1, x2, y2
    for name, group in (("x1", "x"), ("y1", "y"), ("x2", "x"), ("y2", "y")):
        world.put_pod(member(name, 4, group=group))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    x, y = bound(world, "x1", "x2"), bound(world, "y1", "y2")
    assert (None not in x and y == [None, None]) or (None not in y and x == [None, None]), (x, y)
    winner = ["x1", "x2"] if None not in x else ["y1", "y2"]
    for name in winner:
        world.delete_pod(f"uid-{name}")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    loser = ["y1", "y2"] if winner[0] == "x1" else ["x1", "x2"]
    assert None not in bound(world, *loser)


def test_elastic_extras_are_placed_when_they_fit_without_holding_back_the_minimum() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4), node_json("n2", 4), node_json("n3", 4)
    )
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b", "c", "d"):
        world.put_pod(member(name, 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    placed = [n for n in bound(world, "a", "b", "c", "d") if n]
    assert len(placed) == 3 and len(set(placed)) == 3
    world.put_node(node_json("n4", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert None not in bound(world, "a", "b", "c", "d")


def test_min_resources_beyond_the_free_cluster_hold_the_group_with_the_gap() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 1, minResources={"nvidia.com/gpu": "12", "cpu": "8"}))
    world.put_pod(member("a", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") is None
    assert any("lacks its minResources (short by gpus 4)" in m for m in messages(core, "a"))
    world.put_node(node_json("n3", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") is not None


def test_a_timed_out_group_is_reported_once_on_the_podgroup_and_retried() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(pod_json("blocker", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_group(PLUGINS_API, plugins_group("g", 2, scheduleTimeoutSeconds=30))
    world.put_pod(member("a", 4))
    world.put_pod(member("b", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)  # advances the clock past 30 s while it retries
    group_events = [e for e in core.events if e["involvedObject"]["kind"] == "PodGroup"]
    timeouts = [e for e in group_events if e["reason"] == "Timeout"]
    assert len(timeouts) == 1 and "timed out after" in timeouts[0]["message"]
    assert timeouts[0]["involvedObject"]["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert timeouts[0]["involvedObject"]["uid"] == "uid-pg-g"
    world.delete_pod("uid-blocker")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert None not in bound(world, "a", "b")


def test_plugins_podgroup_status_follows_its_members() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 8))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    feed.sync()
    write_status(scheduler, jobs, feed)
    assert world.group(PLUGINS_API, "g")["status"]["phase"] == "Pending"
    owner = [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j"}]
    for name in ("a", "b"):
        pod = member(name, 2)
        pod["metadata"]["ownerReferences"] = owner
        world.put_pod(pod)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)
    status = world.group(PLUGINS_API, "g")["status"]
    assert status["phase"] == "Scheduled" and status["scheduled"] == 2
    assert status["occupiedBy"] == "ns/train" and status["scheduleStartTime"].endswith("Z")
    for name in ("a", "b"):
        pod = world.find("ns", name)
        assert pod is not None
        pod = dict(pod, status={"phase": "Running"})
        world.put_pod(pod)
    feed.sync()
    write_status(scheduler, jobs, feed)
    status = world.group(PLUGINS_API, "g")["status"]
    assert status["phase"] == "Running" and status["running"] == 2
    patches = len(scheduler.custom_api.patches)
    write_status(scheduler, jobs, feed)
    assert len(scheduler.custom_api.patches) == patches  # nothing changed: nothing written


def test_kubernetes_podgroup_gang_and_its_condition() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(pod_json("blocker", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_group(KUBE_API, kube_group("k", 2))
    world.put_pod(pod_json("a", 4, group="k"))
    world.put_pod(pod_json("b", 4, group="k"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)
    assert bound(world, "a", "b") == [None, None]
    (condition,) = world.group(KUBE_API, "k")["status"]["conditions"]
    assert condition["type"] == "PodGroupInitiallyScheduled" and condition["status"] == "False"
    assert (
        condition["reason"] == "Unschedulable" and "only 1 of its 2 minimum members" in condition["message"]
    )
    world.delete_pod("uid-blocker")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)
    assert None not in bound(world, "a", "b")
    (condition,) = world.group(KUBE_API, "k")["status"]["conditions"]
    assert condition["status"] == "True" and condition["reason"] == "Scheduled"


def test_kubernetes_basic_policy_schedules_pods_one_by_one() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(KUBE_API, kube_group("k", None))
    world.put_pod(pod_json("a", 4, group="k"))
    world.put_pod(pod_json("b", 4, group="k"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert sorted(bound(world, "a", "b"), key=str) == [None, "n1"]


def test_a_binding_not_stored_is_completed_counting_the_members_already_bound() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    world.put_pod(member("a", 4))
    world.put_pod(member("b", 4))
    refused = {"ns/b"}
    core.bind_outcome = lambda ns, name, body: (
        "400" if f"{ns}/{name}" in refused and not refused.clear() else "ok"
    )
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert None not in bound(world, "a", "b")
    assert [outcome for _, _, outcome in core.binds].count("400") == 1
    assert not world.double_booked() and not scheduler.cache.assumed


def test_a_scheduler_restarted_mid_gang_completes_the_group() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    world.put_pod(member("a", 4))
    world.put_pod(member("b", 4))
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    assert len(jobs.binds()) == 2
    jobs.run(jobs.binds()[0])  # one Binding lands, then the replica dies
    restarted, jobs2, _core2, clock2 = make_scheduler(world)
    feed2 = Feed(world, restarted)
    feed2.relist()
    drive(restarted, jobs2, feed2, clock2)
    assert None not in bound(world, "a", "b") and not world.double_booked()


def test_a_starving_group_holds_back_gpu_pods_queued_behind_it() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4), node_json("n2", 4), gang_starvation_seconds=100.0
    )
    # small pods hold a GPU on each node; the group needs both nodes whole
    world.put_pod(pod_json("s1", 1))
    world.put_pod(pod_json("s2", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    world.put_pod(member("a", 4))
    world.put_pod(member("b", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)  # waits past 100 s while it retries
    assert bound(world, "a", "b") == [None, None]
    # a stream of small pods: one finishes, another arrives and would take its GPU
    world.delete_pod("uid-s1")
    world.put_pod(pod_json("s3", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s3") is None
    assert any("waiting behind pod group ns/g" in m for m in messages(core, "s3"))
    world.delete_pod("uid-s2")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert None not in bound(world, "a", "b")
    world.delete_pod("uid-a")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s3") is not None  # no longer held back once the group is placed


def preempt_world() -> tuple[Any, Any, Any, Any, World, Feed]:
    """n1: low (4 GPUs); n2: low2 (2 GPUs); n3: low3 (1 GPU) beside keep (3 GPUs, high priority)."""
    scheduler, jobs, core, clock, world, feed = setup(
        [node_json("n1", 4), node_json("n2", 4), node_json("n3", 4)]
    )
    for name, gpus, priority in (("low", 4, 1), ("low2", 2, 1), ("keep", 3, 1000), ("low3", 1, 1)):
        add(world, feed, pod_json(name, gpus, priority=priority))
        settle(scheduler, jobs, feed)
    assert world.node_of("keep") == "n3" and world.node_of("low3") == "n3"
    return scheduler, jobs, core, clock, world, feed


def test_a_high_priority_group_preempts_just_the_pods_its_whole_minimum_needs() -> None:
    scheduler, jobs, core, clock, world, feed = preempt_world()
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        add(world, feed, member(name, 4, priority=500))
    settle(scheduler, jobs, feed)
    assert sorted(core.evictions) == ["low", "low2"]  # low3 shares n3 with keep: not needed
    assert bound(world, "a", "b") == [None, None]
    assert {scheduler.nominated["uid-a"], scheduler.nominated["uid-b"]} == {"n1", "n2"}
    # a lower-priority pod must not take the room being freed
    for uid in ("uid-low", "uid-low2"):
        world.delete_pod(uid)
    add(world, feed, pod_json("sneak", 4, priority=10))
    drive(scheduler, jobs, feed, clock)
    assert sorted(bound(world, "a", "b")) == ["n1", "n2"]
    assert world.node_of("sneak") is None and sorted(core.evictions) == ["low", "low2"]


def test_a_group_that_would_still_not_fit_evicts_nobody() -> None:
    scheduler, jobs, core, clock, world, feed = preempt_world()
    world.put_group(PLUGINS_API, plugins_group("g", 3))
    for name in ("a", "b", "c"):
        add(world, feed, member(name, 4, priority=500))
    drive(scheduler, jobs, feed, clock)
    assert core.evictions == [] and bound(world, "a", "b", "c") == [None, None, None]
    assert not scheduler.nominated


def test_a_group_that_may_not_preempt_evicts_nobody() -> None:
    scheduler, jobs, core, clock, world, feed = preempt_world()
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        pod = member(name, 4, priority=500)
        pod["spec"]["preemptionPolicy"] = "Never"
        add(world, feed, pod)
    drive(scheduler, jobs, feed, clock)
    assert core.evictions == [] and bound(world, "a", "b") == [None, None]


def test_a_group_that_can_never_fit_waits_for_the_nodes_not_for_every_pod() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    world.put_pod(member("a", 8))
    world.put_pod(member("b", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert any(
        "can never fit this cluster: 1 of its members ask for more GPUs than any node has (4)" in m
        for m in messages(core, "a")
    )
    attempts = scheduler.metrics.attempts.labels("unschedulable")._value.get()
    for index in range(5):  # other pods come and go: the group is not tried again for them
        world.put_pod(pod_json(f"other{index}", 1))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
    assert scheduler.metrics.attempts.labels("unschedulable")._value.get() == attempts
    world.put_node(node_json("n3", 8))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert bound(world, "a", "b")[0] == "n3" and None not in bound(world, "a", "b")


def test_the_smallest_members_decide_whether_an_elastic_group_could_ever_fit() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(PLUGINS_API, plugins_group("h", 2))
    world.put_pod(member("x", 4, group="h"))
    world.put_pod(member("y", 2, group="h"))
    world.put_group(PLUGINS_API, plugins_group("k", 2))
    for name, gpus in (("p", 4), ("q", 2), ("r", 2)):
        world.put_pod(member(name, gpus, group="k"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert any("its 2 smallest members ask for 6 GPUs, the nodes have 4" in m for m in messages(core, "x"))
    assert not any("can never fit" in m for m in messages(core, "p"))  # q and r could


def test_members_arriving_within_the_grace_get_no_events_then_a_short_group_is_told() -> None:
    """kube-scheduler's GangScheduling gates a member at PreEnqueue, silently, until minCount pods
    exist. kubegpu tells a group short of members nothing for gangMemberGraceSeconds (each
    arriving member cost a FailedScheduling Event and a status patch through the pool that sends
    the Bindings: bench/gang_throughput.py's gang/plain 0.67), then every waiting member and the
    PodGroup, once, as before."""
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 8), gang_member_grace_seconds=10.0)
    world.put_group(PLUGINS_API, plugins_group("g", 3))
    world.put_pod(member("a", 2))
    world.put_pod(member("b", 2))
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    jobs.run_all()
    assert not core.events  # members arriving: nobody is told yet
    assert scheduler.groups.progress[next(iter(scheduler.groups.progress))].message.endswith(
        "has 2 of its 3 minimum members; waiting for the others"
    )  # the PodGroup's status says why
    clock.advance(9.0)
    assert not scheduler.schedule_next(0) and not core.events
    clock.advance(1.5)  # the grace is over: the group is tried again and its members told
    while scheduler.schedule_next(0):
        pass
    jobs.run_all()
    told = {e["involvedObject"]["name"] for e in core.events if e["reason"] == "FailedScheduling"}
    assert told == {"a", "b"}
    on_group = [e["reason"] for e in core.events if e["involvedObject"]["kind"] == "PodGroup"]
    assert on_group == ["Unschedulable"]
    world.put_pod(member("c", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert bound(world, "a", "b", "c") == ["n1", "n1", "n1"]


def test_a_group_that_completes_within_the_grace_is_bound_without_a_single_event() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 8), node_json("n2", 8))
    world.put_group(PLUGINS_API, plugins_group("g", 4))
    for name in ("a", "b", "c", "d"):
        world.put_pod(member(name, 4))
        feed.sync()
        while scheduler.schedule_next(0):
            pass
        jobs.run_all()
        clock.advance(1.0)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert sorted(bound(world, "a", "b", "c", "d")) == ["n1", "n1", "n2", "n2"]
    assert [e for e in core.events if e["reason"] in ("FailedScheduling", "Unschedulable")] == []


def test_the_grace_is_over_at_the_deadline_it_set() -> None:
    """The deadline is short_since + grace; the check was now - short_since < grace, which float
    rounding can keep true at that very deadline (0.7 + 0.1 - 0.7 < 0.1), re-arming it for the
    same instant: a busy loop until the clock moved."""
    from scheduler.live.gangs import GroupProgress

    _, scheduler, *_ = world_of(node_json("n1", 8), gang_member_grace_seconds=0.1)
    progress = GroupProgress(0.0, "", short_since=0.7)
    assert scheduler._members_arriving(progress, 0.75)
    assert not scheduler._members_arriving(progress, 0.7 + 0.1)
