"""A hostile review of the live scheduler's gang path (docs/gang.md) against the in-memory
apiserver (tests/support/schedworld.py): odd PodGroups, restarts, the starvation guard, gang
preemption, status, Bindings refused mid-group and large groups. Each test failed before the
fix it came with."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes.client.rest import ApiException

from scheduler.core.gang import GPUS, capacity_gap
from scheduler.core.state import MIB, Allocation, ClusterState, GpuGrant, GpuState, NodeState
from scheduler.live.podgroups import KUBE_API, PLUGINS_API
from tests.support.schedworld import Feed, make_scheduler, node_json, pod_json
from tests.test_sched_gang_live import (
    drive,
    kube_group,
    member,
    messages,
    plugins_group,
    preempt_world,
    world_of,
    write_status,
)
from tests.test_sched_preempt_live import add, settle


def test_a_recorded_start_time_without_an_offset_does_not_break_the_group() -> None:
    """scheduleStartTime written by someone else as a local time (no offset), a bare date, or
    lower case: read as UTC or ignored, never an error that keeps the group from scheduling."""
    for recorded in ("2026-01-01T00:00:00", "2026-01-01", "2026-01-01t00:00:00z", "yesterday", 12):
        world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
        group: dict[str, Any] = plugins_group("g", 1)
        group["status"] = {"scheduleStartTime": recorded}
        world.put_group(PLUGINS_API, group)
        world.put_pod(member("a", 1))
        feed.sync()
        drive(scheduler, jobs, feed, clock)  # asserts no decision raised
        assert world.node_of("a") == "n1", (recorded, messages(core, "a"))


def test_a_huge_min_resources_quantity_is_refused_as_invalid_not_an_error() -> None:
    """"1e5000" matches the Quantity pattern the CRD validates; as an int it has more digits than
    Python prints (and "1e999999999" would take the scheduling thread's lock for hours)."""
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 1, minResources={"nvidia.com/gpu": "1e5000"}))
    world.put_pod(member("a", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)  # asserts no decision raised
    assert world.node_of("a") is None
    assert any("spec.minResources.nvidia.com/gpu is too large" in m for m in messages(core, "a"))


def set_phase(world: Any, name: str, phase: str) -> None:
    pod = world.find("ns", name)
    assert pod is not None, name
    world.put_pod(dict(pod, status={"phase": phase}))


def test_a_finished_or_failed_group_shows_it_in_its_phase() -> None:
    """Succeeded and Failed pods leave the scheduling cache; the status must still count them
    (it went back to Pending when its pods finished)."""
    for last, phase, counted in (("Succeeded", "Finished", "succeeded"), ("Failed", "Failed", "failed")):
        world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 8))
        world.put_group(PLUGINS_API, plugins_group("g", 2))
        for name in ("a", "b"):
            world.put_pod(member(name, 2))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        for name in ("a", "b"):
            set_phase(world, name, "Running")
        feed.sync()
        write_status(scheduler, jobs, feed)
        assert world.group(PLUGINS_API, "g")["status"]["phase"] == "Running"
        set_phase(world, "a", "Succeeded" if last == "Succeeded" else "Running")
        set_phase(world, "b", last)
        feed.sync()
        write_status(scheduler, jobs, feed)
        status = world.group(PLUGINS_API, "g")["status"]
        assert status["phase"] == phase and status.get(counted), status
        feed.relist()  # a relist sees them the same way
        write_status(scheduler, jobs, feed)
        assert world.group(PLUGINS_API, "g")["status"]["phase"] == phase


def test_a_kubernetes_group_bound_by_a_former_leader_gets_its_scheduled_condition() -> None:
    """The leader bound the group's minimum and died before writing the condition (statuses are
    written every 5 s): the next one, which never tries the group, must still turn it True."""
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_pod(pod_json("blocker", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_group(KUBE_API, kube_group("k", 2))
    world.put_pod(pod_json("a", 4, group="k"))
    world.put_pod(pod_json("b", 4, group="k"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)  # False: only 1 of its 2 fit
    world.delete_pod("uid-blocker")
    feed.sync()
    drive(scheduler, jobs, feed, clock)  # placed and bound; the replica dies before writing
    assert None not in [world.node_of("a"), world.node_of("b")]
    successor, jobs2, _core2, clock2 = make_scheduler(world)
    feed2 = Feed(world, successor)
    feed2.relist()
    drive(successor, jobs2, feed2, clock2)
    write_status(successor, jobs2, feed2)
    (condition,) = world.group(KUBE_API, "k")["status"]["conditions"]
    assert condition["status"] == "True" and condition["reason"] == "Scheduled", condition


def test_a_kubernetes_group_with_malformed_conditions_does_not_kill_the_status_writer() -> None:
    """write_group_statuses runs on the staleness thread, which nothing restarts."""
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    group = kube_group("k", 1)
    group["status"] = {"conditions": 5}
    world.put_group(KUBE_API, group)
    world.put_pod(pod_json("a", 1, group="k"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)
    (condition,) = world.group(KUBE_API, "k")["status"]["conditions"]
    assert condition["status"] == "True"


def test_another_schedulers_pod_groups_keep_their_status_untouched() -> None:
    """scheduler-plugins' controller (or kube-scheduler) keeps the status of the groups it
    schedules; kubegpu writing it too flaps it between two writers (Pending against Scheduling,
    Scheduled against Scheduling), each echo waking the other."""
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(PLUGINS_API, plugins_group("theirs", 2))
    world.put_group(KUBE_API, kube_group("kube", 2))
    for name in ("a", "b"):
        world.put_pod(member(name, 0, group="theirs", scheduler="scheduler-plugins"))
        world.put_pod(pod_json(f"k{name}", 0, group="kube", scheduler="default-scheduler", node="n1"))
    world.put_group(PLUGINS_API, plugins_group("ours", 1))
    world.put_pod(member("c", 1, group="ours"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)
    assert [name for _, name, _ in scheduler.custom_api.patches] == ["ours"]


def test_a_new_leader_writes_the_status_that_changed_while_it_followed() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 8))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        world.put_pod(member(name, 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    write_status(scheduler, jobs, feed)
    scheduler.leading.clear()  # a follower: it watches, but writes nothing
    for name in ("a", "b"):
        set_phase(world, name, "Succeeded")
    feed.sync()
    write_status(scheduler, jobs, feed)
    assert world.group(PLUGINS_API, "g")["status"]["phase"] == "Scheduled"
    scheduler.became_leader()
    write_status(scheduler, jobs, feed)
    assert world.group(PLUGINS_API, "g")["status"]["phase"] == "Finished"


def starving_group(**overrides: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    """n1, n2 (4 GPUs each) each hold a small pod; group g (2 x 4 GPUs) has waited past
    gangStarvationSeconds (100 s) and holds back the GPU pods behind it."""
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4), node_json("n2", 4), gang_starvation_seconds=100.0, **overrides
    )
    world.put_pod(pod_json("s1", 1))
    world.put_pod(pod_json("s2", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    world.put_pod(member("a", 4))
    world.put_pod(member("b", 4))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    clock.advance(100)
    with scheduler.cond:
        scheduler._changed()
    drive(scheduler, jobs, feed, clock)
    assert scheduler._blocking is not None and [world.node_of("a"), world.node_of("b")] == [None, None]
    return world, scheduler, jobs, core, clock, feed


def test_a_starving_group_that_can_no_longer_ever_fit_stops_holding_pods_back() -> None:
    world, scheduler, jobs, core, clock, feed = starving_group()
    world.delete_node("n2")  # replaced by a smaller node: 2 x 4 GPUs can never fit 4 + 2
    world.put_node(node_json("n3", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert any("can never fit this cluster" in m for m in messages(core, "a"))
    world.put_pod(pod_json("s3", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s3") is not None, messages(core, "s3")


def test_min_resources_beyond_the_nodes_can_never_fit_and_hold_nothing_back() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4), node_json("n2", 4), gang_starvation_seconds=100.0
    )
    world.put_group(PLUGINS_API, plugins_group("g", 1, minResources={"nvidia.com/gpu": "64"}))
    world.put_pod(member("a", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    clock.advance(200)
    with scheduler.cond:
        scheduler._changed()
    drive(scheduler, jobs, feed, clock)
    assert any(
        "can never fit this cluster: the cluster lacks its minResources (short by gpus 56) even" in m
        for m in messages(core, "a")
    )
    world.put_pod(pod_json("s", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s") is not None, messages(core, "s")


def test_capacity_gap_counts_the_nodes_whatever_runs_on_them() -> None:
    state = ClusterState(
        [
            NodeState(f"n{i}", 4000, 1024, [GpuState(j, f"n{i}-g{j}", "A100") for j in range(4)], max_pods=10)
            for i in range(2)
        ]
    )
    grant = (GpuGrant(0, "n0-g0", 1000), GpuGrant(1, "n0-g1", 1000))
    state.assume(Allocation("n0", "m1", "ns/m1", cpu_milli=4000, memory_mib=512, gpus=grant))
    assert capacity_gap(state, {"cpu": 8000, GPUS: 8, "pods": 20, "memory": 2048 * MIB}) == {}
    assert capacity_gap(state, {"cpu": 8001, GPUS: 9, "pods": 21, "x.io/y": 1}) == {
        "cpu": 1,
        GPUS: 1,
        "pods": 1,
        "x.io/y": 1,
    }


def test_a_starving_group_holds_back_other_groups_gpu_pods_too() -> None:
    """A stream of small gangs (minMember 1, as an operator creates one PodGroup per job) took
    the GPUs the starving group waited for, as single pods may not."""
    world, scheduler, jobs, core, clock, feed = starving_group()
    world.put_group(PLUGINS_API, plugins_group("h", 1))
    world.delete_pod("uid-s1")
    world.put_pod(member("h1", 1, group="h"))
    world.put_pod(member("h2", 0, group="h"))  # decided with h1: held back with it
    world.put_group(PLUGINS_API, plugins_group("c", 1))
    world.put_pod(member("c1", 0, group="c"))  # a CPU-only gang: never held back
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert [world.node_of("h1"), world.node_of("h2")] == [None, None] and world.node_of("c1")
    assert any("waiting behind pod group ns/g" in m for m in messages(core, "h1"))
    world.delete_pod("uid-s2")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert None not in [world.node_of("a"), world.node_of("b")]
    world.delete_pod("uid-a")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("h1") is not None and world.node_of("h2") is not None


def test_a_members_room_is_kept_while_its_refused_binding_is_retried() -> None:
    """a and b placed whole; a is bound, b's Binding refused (not stored): its room was released
    and a small pod parked meanwhile took it before b's backoff ended, leaving the group half
    placed for as long as the small pod ran."""
    for outcome in ("400", "timeout"):  # refused; or unknown, then read back unbound
        world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
        world.put_pod(pod_json("x1", 4))
        world.put_pod(pod_json("x2", 4))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        world.put_group(PLUGINS_API, plugins_group("g", 2))
        world.put_pod(member("a", 4))
        world.put_pod(member("b", 4))
        world.put_pod(pod_json("s", 1))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        refused = {"ns/b"}
        core.bind_outcome = lambda ns, name, body, o=outcome, r=refused: (
            o if f"{ns}/{name}" in r and not r.clear() else "ok"
        )
        world.delete_pod("uid-x1")
        world.delete_pod("uid-x2")
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        assert None not in [world.node_of("a"), world.node_of("b")], outcome
        assert world.node_of("s") is None and "uid-b" not in scheduler.nominated
        assert not world.double_booked()


def test_a_group_preempts_again_once_its_victims_are_gone_and_it_still_does_not_fit() -> None:
    """low2's eviction was refused (its budget, for now): the members stayed nominated, and a
    nominated group never preempted again, waiting for good."""
    scheduler, jobs, core, clock, world, feed = preempt_world()
    core.refuse = {"low2"}
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        add(world, feed, member(name, 4, priority=500))
    settle(scheduler, jobs, feed)
    assert sorted(core.evictions) == ["low", "low2"] and len(scheduler.nominated) == 2
    core.refuse = set()  # the budget allows it now
    world.delete_pod("uid-low")  # the evicted victim is gone
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert sorted(core.evictions) == ["low", "low2", "low2"]  # once more, only once
    world.delete_pod("uid-low2")
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert sorted([world.node_of("a"), world.node_of("b")]) == ["n1", "n2"]
    assert not scheduler.nominated


def test_a_groups_nominations_are_cleared_when_no_preemption_can_place_it_any_more() -> None:
    scheduler, jobs, core, clock, world, feed = preempt_world()
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        add(world, feed, member(name, 4, priority=500))
    settle(scheduler, jobs, feed)
    assert sorted(core.evictions) == ["low", "low2"]
    nominated = dict(scheduler.nominated)
    # the victims go, and a pod of higher priority than the group takes one of the freed nodes
    world.delete_pod("uid-low")
    world.delete_pod("uid-low2")
    world.put_pod(pod_json("big", 4, priority=1000))
    feed.sync()
    big = scheduler.queue.pop()
    assert big == "uid-big"
    scheduler._decide(big, scheduler.cache.pods[big], scheduler._view())
    jobs.run_all()
    feed.sync()
    assert world.node_of("big") in nominated.values()
    drive(scheduler, jobs, feed, clock)
    assert [world.node_of("a"), world.node_of("b")] == [None, None]
    assert sorted(core.evictions) == ["low", "low2"] and not scheduler.nominated
    assert not any(world.find("ns", n)["status"].get("nominatedNodeName") for n in ("a", "b"))
    # the room is no longer kept from pods of lower priority
    add(world, feed, pod_json("small", 4, priority=10))
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("small") is not None


def test_a_group_that_ran_before_a_restart_starts_a_new_clock_when_it_tries_again() -> None:
    """scheduleStartTime is kept in the status for good; a restarted scheduler took it as the
    start of the current attempt, so a group that ran a year ago and lost a member timed out at
    its first try and at once held back every GPU pod as the starving group."""
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4), node_json("n2", 4), gang_starvation_seconds=300.0
    )
    group = plugins_group("g", 2)
    group["status"] = {"phase": "Running", "running": 2, "scheduleStartTime": "2025-01-01T00:00:00Z"}
    world.put_group(PLUGINS_API, group)
    world.put_pod(member("a", 4, node="n1"))
    world.put_pod(pod_json("other", 1))  # holds a GPU on n2 for now
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_pod(member("b", 4))  # the replacement of a worker that failed
    feed.sync()
    while scheduler.schedule_next(0):
        pass
    jobs.run_all()
    reasons = [e["reason"] for e in core.events if e["involvedObject"]["kind"] == "PodGroup"]
    assert reasons == ["Unschedulable"] and scheduler._blocking is None


def test_a_group_that_can_never_fit_still_reports_its_timeout_once() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 2, scheduleTimeoutSeconds=30))
    world.put_pod(member("a", 8))
    world.put_pod(member("b", 8))
    feed.sync()
    drive(scheduler, jobs, feed, clock)  # runs the clock past 30 s
    world.put_pod(pod_json("other", 1))  # pods come and go: not tried again for them
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    group_events = [e for e in core.events if e["involvedObject"]["kind"] == "PodGroup"]
    timeouts = [e for e in group_events if e["reason"] == "Timeout"]
    assert len(timeouts) == 1 and "can never fit this cluster" in timeouts[0]["message"]
    assert any("timed out after" in m for m in messages(core, "a"))


class CountingQueue:
    """The scheduler's queue, counting the calls made on it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return attr(*args, **kwargs)

        return counted

    def __contains__(self, uid: str) -> bool:
        self.calls += 1
        return uid in self.inner

    def __len__(self) -> int:
        return len(self.inner)


def test_a_large_group_arriving_member_by_member_costs_linear_work_and_events() -> None:
    """Each new member woke every other (O(members) per member), each decision of the growing
    group told every waiting member a new count (N^2/2 Events and status patches) and parked
    them all again (their backoff doubling at every arrival)."""
    size = 60
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 0, cpu="100"))
    world.put_group(PLUGINS_API, plugins_group("g", size))
    feed.sync()
    counting = CountingQueue(scheduler.queue)
    scheduler.queue = counting
    for index in range(size - 1):
        world.put_pod(member(f"m{index}", 0))
        feed.sync()
        clock.advance(0.5)
        while scheduler.schedule_next(0):
            pass
        jobs.run_all()
    failed = [e for e in core.events if e["reason"] == "FailedScheduling"]
    assert len(failed) <= 3 * size, len(failed)
    group_events = [e for e in core.events if e["involvedObject"]["kind"] == "PodGroup"]
    assert len(group_events) <= 4, [e["message"] for e in group_events]
    assert counting.inner.attempts("uid-m0") <= 4
    assert counting.calls <= 30 * size, counting.calls
    world.put_pod(member(f"m{size - 1}", 0))  # the last one: the group goes whole at once
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert all(world.node_of(f"m{i}") == "n1" for i in range(size))


def test_podgroups_the_scheduler_may_not_list_neither_stall_its_start_nor_read_as_missing() -> None:
    """RBAC without the podgroups rule (an older ClusterRole): the optional reflector never
    synced, so the scheduler waited its 120 s sync timeout at every start, and the members said
    'waiting for pod group to exist' about a group that exists."""
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 1))

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    scheduler.custom_api.list_cluster_custom_object = forbidden
    reflector = scheduler.group_reflectors[0]
    assert reflector.name == f"podgroups.{PLUGINS_API}"
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert reflector.synced.wait(5), "a forbidden optional resource never synced"
    finally:
        stop.set()
        thread.join(5)
    assert reflector.forbidden
    feed.skip(PLUGINS_API)  # what the forbidden watch never delivers
    world.put_pod(member("a", 1))
    feed.sync("pods")
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") is None
    assert any(
        f"cannot see pod group ns/g: the scheduler is forbidden to list podgroups.{PLUGINS_API}" in m
        for m in messages(core, "a")
    )


def test_a_starving_group_that_lost_a_member_stops_holding_pods_back() -> None:
    world, scheduler, jobs, core, clock, feed = starving_group()
    world.delete_pod("uid-b")  # not recreated (a hand-made group, a job being torn down)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert any("has 1 of its 2 minimum members" in m for m in messages(core, "a"))
    world.put_pod(pod_json("s3", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s3") is not None, messages(core, "s3")


def test_a_group_that_could_not_fit_even_alone_never_holds_pods_back() -> None:
    """Its GPU counts fit the nodes, but its node selector matches none (a typo): it became the
    starving group after gangStarvationSeconds and held back every GPU pod for good."""
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4), node_json("n2", 4), gang_starvation_seconds=100.0
    )
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        pod = member(name, 4)
        pod["spec"]["nodeSelector"] = {"gpu.example.com/model": "h100"}
        world.put_pod(pod)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    clock.advance(200)
    with scheduler.cond:
        scheduler._changed()
    drive(scheduler, jobs, feed, clock)
    assert scheduler._blocking is None
    world.put_pod(pod_json("s", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s") is not None, messages(core, "s")


def test_a_starving_group_whose_nodes_lost_their_label_stops_holding_pods_back() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(
        node_json("n1", 4, labels={"pool": "train"}),
        node_json("n2", 4, labels={"pool": "train"}),
        gang_starvation_seconds=100.0,
    )
    world.put_pod(pod_json("s1", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    for name in ("a", "b"):
        pod = member(name, 4)
        pod["spec"]["nodeSelector"] = {"pool": "train"}
        world.put_pod(pod)
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    clock.advance(200)
    with scheduler.cond:
        scheduler._changed()
    drive(scheduler, jobs, feed, clock)
    assert scheduler._blocking is not None  # it could fit if s1 went: it holds pods back
    world.put_node(node_json("n2", 4, labels={"pool": "serve"}))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    world.put_pod(pod_json("s2", 1))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("s2") is not None, messages(core, "s2")


def test_fits_alone_is_worked_out_once_per_nodes_and_members(monkeypatch: Any) -> None:
    """It plans the group on the cluster emptied of every pod: not at every retry."""
    import scheduler.live.scheduler as live

    calls: list[str] = []
    real = live.fits_alone

    def counted(group: Any, *args: Any, **kwargs: Any) -> bool:
        calls.append(group.name)
        return real(group, *args, **kwargs)

    monkeypatch.setattr(live, "fits_alone", counted)
    world, scheduler, jobs, core, clock, feed = starving_group()
    for index in range(5):  # pods come and go: the group is retried each time
        world.put_pod(pod_json(f"cpu{index}", 0))
        feed.sync()
        drive(scheduler, jobs, feed, clock)
        world.delete_pod(f"uid-cpu{index}")
        feed.sync()
        drive(scheduler, jobs, feed, clock)
    assert calls == ["ns/g"] and scheduler.metrics.attempts.labels("unschedulable")._value.get() >= 8
    world.put_node(node_json("n3", 2))
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert calls == ["ns/g", "ns/g"]


def test_a_member_bound_by_another_scheduler_completes_the_waiting_group() -> None:
    world, scheduler, jobs, core, clock, feed = world_of(node_json("n1", 4), node_json("n2", 4))
    world.put_group(PLUGINS_API, plugins_group("g", 2))
    world.put_pod(member("a", 4))
    world.put_pod(member("b", 0, scheduler="default-scheduler"))
    feed.sync()
    drive(scheduler, jobs, feed, clock)  # past its timeout: nothing wakes it on a timer any more
    assert world.node_of("a") is None
    assert any("has 1 of its 2 minimum members" in m for m in messages(core, "a"))
    pod = world.find("ns", "b")
    assert pod is not None
    world.put_pod(dict(pod, spec=dict(pod["spec"], nodeName="n2")))  # default-scheduler binds it
    feed.sync()
    drive(scheduler, jobs, feed, clock)
    assert world.node_of("a") == "n2"  # beside the member already placed
