"""The live scheduler's preemption and placement-rule plumbing against the in-memory apiserver
(tests/support/schedworld.py): every step in the order a test chooses, binds and evictions run
when it says."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from crishim.advertiser import publication
from kubegpu.allocation import ANNOTATION, verify
from scheduler.live.preemption import budget
from tests.support.rdmainv import Pf, rdma_inventory
from tests.support.schedworld import (
    KEYS,
    Clock,
    FakeCore,
    Feed,
    Jobs,
    World,
    make_scheduler,
    node_json,
    pod_json,
)


@dataclass
class EvictingCore(FakeCore):
    """FakeCore plus the Eviction API and nominatedNodeName patches, as the apiserver does them."""

    refuse: set[str] = field(default_factory=set)  # pod names whose eviction answers 429
    evictions: list[str] = field(default_factory=list)

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Any, **_: Any) -> Any:
        self.evictions.append(name)
        if name in self.refuse:
            raise ApiException(
                status=429, reason="Cannot evict pod as it would violate the pod's disruption budget."
            )
        pod = self.world.find(namespace, name)
        if pod is None:
            raise ApiException(status=404, reason="Not Found")
        pod = copy.deepcopy(pod)
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self.world.put_pod(pod)
        return _Response({})

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        status = body.get("status") or {}
        if "nominatedNodeName" in status:
            pod = self.world.find(namespace, name)
            if pod is not None and not pod["spec"].get("nodeName"):
                pod = copy.deepcopy(pod)
                pod["status"]["nominatedNodeName"] = status["nominatedNodeName"]
                self.world.put_pod(pod)
        return super().patch_namespaced_pod_status(name, namespace, body, **kw)


class _Response:
    def __init__(self, body: Any) -> None:
        self.data = b"{}"

    def release_conn(self) -> None:
        pass


HOSTNAME = "kubernetes.io/hostname"


def setup(nodes: list[dict[str, Any]]) -> tuple[Any, Jobs, EvictingCore, Clock, World, Feed]:
    world = World()
    for node in nodes:
        world.put_node(node)
    scheduler, jobs, _core, clock = make_scheduler(world)
    core = EvictingCore(world)
    scheduler.core = scheduler.events_api = core
    feed = Feed(world, scheduler)
    feed.relist()
    return scheduler, jobs, core, clock, world, feed


def settle(scheduler: Any, jobs: Jobs, feed: Feed) -> None:
    """Decide what is ready, run the binder jobs, deliver the events, until nothing moves."""
    for _ in range(20):
        moved = False
        while scheduler.schedule_next(0):
            moved = True
        if jobs.pending:
            jobs.run_all()
            moved = True
        if feed.sync():
            moved = True
        if not moved:
            return


def add(world: World, feed: Feed, pod: dict[str, Any]) -> None:
    world.put_pod(pod)
    feed.sync()


def by_name(world: World, name: str) -> dict[str, Any]:
    pod = world.find("ns", name)
    assert pod is not None, name
    return pod


def test_preemption_evicts_nominates_and_reserves_the_room() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=4)])
    add(world, feed, pod_json("low", 4, priority=1))
    settle(scheduler, jobs, feed)
    assert by_name(world, "low")["spec"]["nodeName"] == "n1"
    add(world, feed, pod_json("high", 4, priority=10))
    settle(scheduler, jobs, feed)
    assert core.evictions == ["low"]
    assert by_name(world, "high")["status"]["nominatedNodeName"] == "n1"
    assert scheduler.nominated == {"uid-high": "n1"}
    assert any("Preempting 1 pod(s) on node n1" in m for m in core.failed_events("high"))
    assert any(e["reason"] == "Preempted" for e in core.events if e["involvedObject"]["name"] == "low")
    # the victim terminates; trying again meanwhile evicts nothing more (it waits for it)
    clock.advance(30)
    with scheduler.cond:
        scheduler._changed()
    settle(scheduler, jobs, feed)
    assert core.evictions == ["low"] and not by_name(world, "high")["spec"].get("nodeName")
    # a lower-priority pod arriving once the room is free must leave it to the preemptor: hold
    # the preemptor in backoff so the newcomer is tried first
    world.delete_pod("uid-low")
    add(world, feed, pod_json("mid", 4, priority=5))
    mid = scheduler.queue.pop()
    assert mid == "uid-mid"
    scheduler._decide(mid, scheduler.cache.pods[mid], scheduler._view())
    assert not jobs.pending or all(getattr(fn, "__name__", "") != "_bind" for fn, _ in jobs.pending)
    clock.advance(60)
    settle(scheduler, jobs, feed)
    assert by_name(world, "high")["spec"]["nodeName"] == "n1"
    assert not by_name(world, "mid")["spec"].get("nodeName")
    assert "uid-high" not in scheduler.nominated


def test_preemption_policy_never_and_equal_priority_evict_nothing() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=2)])
    add(world, feed, pod_json("occupant", 2, priority=5))
    settle(scheduler, jobs, feed)
    polite = pod_json("polite", 1, priority=50)
    polite["spec"]["preemptionPolicy"] = "Never"
    add(world, feed, polite)
    add(world, feed, pod_json("peer", 1, priority=5))
    settle(scheduler, jobs, feed)
    assert core.evictions == [] and scheduler.nominated == {}
    assert not by_name(world, "polite")["spec"].get("nodeName")


def test_a_refused_eviction_leaves_the_victim_and_is_counted() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=2)])
    add(world, feed, pod_json("guarded", 2, priority=1))
    settle(scheduler, jobs, feed)
    core.refuse.add("guarded")  # the budget changed after we read it: the API refuses
    add(world, feed, pod_json("urgent", 2, priority=9))
    settle(scheduler, jobs, feed)
    assert core.evictions == ["guarded"]
    assert not by_name(world, "guarded")["metadata"].get("deletionTimestamp")
    assert scheduler.metrics.evictions.labels("429")._value.get() == 1
    assert scheduler.metrics.preemptions._value.get() == 1
    read = scheduler.metrics.registry.get_sample_value  # kube-scheduler's name: victims per preemption
    assert (read("scheduler_preemption_victims_count"), read("scheduler_preemption_victims_sum")) == (1, 1)


def test_budgets_from_the_watch_steer_the_choice() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=2)])
    db = pod_json("db", 1, priority=1)
    db["metadata"]["labels"] = {"app": "db"}
    add(world, feed, db)
    add(world, feed, pod_json("batch", 1, priority=2))
    settle(scheduler, jobs, feed)
    pdb = {
        "metadata": {"name": "keep-db", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0},
    }
    scheduler.replace_budgets([pdb])
    assert set(scheduler.budgets) == {"ns/keep-db"}
    add(world, feed, pod_json("urgent", 1, priority=9))
    settle(scheduler, jobs, feed)
    assert core.evictions == ["batch"]
    scheduler.apply_budget("DELETED", pdb)
    assert scheduler.budgets == {}


def test_budget_parsing() -> None:
    parsed = budget(
        {
            "metadata": {"name": "b", "namespace": "x"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}},
            "status": {"disruptionsAllowed": 2, "disruptedPods": {"db-0": "2026-01-01T00:00:00Z"}},
        }
    )
    assert parsed is not None and parsed.namespace == "x" and parsed.disruptions_allowed == 2
    assert parsed.disrupted_pods == {"db-0"} and parsed.selector.matches({"app": "db"})
    empty = budget({"metadata": {"name": "e", "namespace": "x"}, "spec": {"selector": {}}})
    assert empty is not None and empty.selector.empty and empty.disruptions_allowed == 0
    assert budget({"metadata": {"name": "bad"}, "spec": {"selector": {"matchLabels": {"a": "b c"}}}}) is None
    assert budget({"metadata": {}, "spec": "x", "status": {"disruptionsAllowed": True}}) is not None


def test_label_changes_of_placed_pods_reach_the_rules() -> None:
    """A placed pod's labels feed other pods' rules: when they change, the view follows."""
    scheduler, jobs, core, clock, world, feed = setup(
        [node_json("n1", gpus=4, labels={"kubernetes.io/hostname": "n1"})]
    )
    add(world, feed, pod_json("first", 1))
    settle(scheduler, jobs, feed)
    anti = pod_json("second", 1)
    anti["metadata"]["labels"] = {"app": "web"}
    anti["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    first = copy.deepcopy(by_name(world, "first"))
    first["metadata"]["labels"] = {"app": "web"}
    world.put_pod(first)
    feed.sync()
    assert scheduler.cluster is not None and scheduler.cluster.placement is not None
    assert scheduler.cluster.placement.index.facts["uid-first"].labels == {"app": "web"}
    add(world, feed, anti)
    settle(scheduler, jobs, feed)
    assert not by_name(world, "second")["spec"].get("nodeName")
    assert any("anti-affinity" in m for m in core.failed_events("second"))
    # the first pod drops the label: the waiting pod is retried and placed
    first = copy.deepcopy(by_name(world, "first"))
    first["metadata"]["labels"] = {}
    world.put_pod(first)
    feed.sync()
    clock.advance(60)
    settle(scheduler, jobs, feed)
    assert by_name(world, "second")["spec"]["nodeName"] == "n1"


def test_namespace_labels_feed_namespace_selectors() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=4, labels={"zone": "a"})])
    target = pod_json("db", 1, namespace="data")
    target["metadata"]["labels"] = {"app": "db"}
    add(world, feed, target)
    settle(scheduler, jobs, feed)
    follower = pod_json("client", 1)
    follower["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "db"}},
                    "namespaceSelector": {"matchLabels": {"team": "ml"}},
                    "topologyKey": "zone",
                }
            ]
        }
    }
    scheduler.replace_namespaces([{"metadata": {"name": "data", "labels": {"team": "web"}}}])
    add(world, feed, follower)
    settle(scheduler, jobs, feed)
    assert not by_name(world, "client")["spec"].get("nodeName")
    scheduler.apply_namespace("MODIFIED", {"metadata": {"name": "data", "labels": {"team": "ml"}}})
    clock.advance(60)
    settle(scheduler, jobs, feed)
    assert by_name(world, "client")["spec"]["nodeName"] == "n1"
    scheduler.apply_namespace("DELETED", {"metadata": {"name": "data"}})
    assert "data" not in scheduler.cache.namespaces


def test_a_share_preempts_a_share_on_the_gpu_it_needs() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=1)])
    add(world, feed, pod_json("small", 0, priority=1, annotations={"kubegpu.io/gpu-milli": "300"}))
    add(world, feed, pod_json("big", 0, priority=2, annotations={"kubegpu.io/gpu-milli": "600"}))
    settle(scheduler, jobs, feed)
    assert by_name(world, "small")["spec"]["nodeName"] == "n1" and by_name(world, "big")["spec"]["nodeName"]
    add(world, feed, pod_json("urgent", 0, priority=9, annotations={"kubegpu.io/gpu-milli": "400"}))
    settle(scheduler, jobs, feed)
    assert core.evictions == ["small"]  # 300 freed + 100 free = 400: the cheaper victim suffices
    world.delete_pod("uid-small")
    feed.sync()
    clock.advance(60)
    settle(scheduler, jobs, feed)
    assert by_name(world, "urgent")["spec"]["nodeName"] == "n1"


def rdma(count: int, bandwidth: str) -> dict[str, str]:
    return {"kubegpu.io/rdma-interfaces": str(count), "kubegpu.io/rdma-bandwidth": bandwidth}


def test_a_pod_asking_rdma_interfaces_evicts_the_pod_whose_vf_and_bandwidth_it_needs() -> None:
    """n1's one 100G PF has two VFs, both held (60 + 10 Gbit/s reserved); n2 has GPUs but no NIC.
    A pod asking a GPU and one 50G interface fits only once the 60G pod is gone: the cheaper 10G
    pod would free a VF without the bandwidth, and evicting n2's pod would be in vain."""
    inventory = rdma_inventory("n1", [0, 0], [Pf("mlx5_0", 100, 0, (0, 1), vfs=2)])
    n1 = node_json("n1", 2, inventory=publication(inventory).inventory)
    scheduler, jobs, core, clock, world, feed = setup([n1, node_json("n2", gpus=2)])
    add(world, feed, pod_json("bulk", 1, priority=2, annotations=rdma(1, "60Gbps")))
    add(world, feed, pod_json("light", 0, priority=1, annotations=rdma(1, "10Gbps")))
    settle(scheduler, jobs, feed)
    add(world, feed, pod_json("filler", 2, priority=0))
    settle(scheduler, jobs, feed)
    placed = {name: by_name(world, name)["spec"].get("nodeName") for name in ("bulk", "light", "filler")}
    assert placed == {"bulk": "n1", "light": "n1", "filler": "n2"}
    add(world, feed, pod_json("urgent", 1, priority=9, annotations=rdma(1, "50Gbps")))
    settle(scheduler, jobs, feed)
    assert core.evictions == ["bulk"]
    assert scheduler.nominated == {"uid-urgent": "n1"}
    world.delete_pod("uid-bulk")
    feed.sync()
    clock.advance(60)
    settle(scheduler, jobs, feed)
    urgent = by_name(world, "urgent")
    assert urgent["spec"]["nodeName"] == "n1"
    granted = verify(urgent["metadata"]["annotations"][ANNOTATION], KEYS)
    assert [(r.pf, r.min_mbps) for r in granted.rdma] == [("mlx5_0", 50_000)]
    assert core.evictions == ["bulk"]


def test_a_replica_that_lost_the_lease_evicts_nothing() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=1)])
    add(world, feed, pod_json("low", 1, priority=1))
    settle(scheduler, jobs, feed)

    class Lost:
        is_leader = False

    add(world, feed, pod_json("high", 1, priority=9))
    while scheduler.schedule_next(0):
        pass
    scheduler.elector = Lost()  # the lease went between the decision and the eviction
    jobs.run_all()
    assert core.evictions == []


def test_the_nomination_survives_an_update_that_comes_before_its_patch() -> None:
    """The preemptor's FailedScheduling condition (or any update, or a list) may reach the watch
    before the nominatedNodeName patch: the room it freed must still go to it, not to a
    lower-priority pod tried meanwhile (kube-scheduler keeps its nomination in that case)."""
    for relist in (False, True):
        scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=4)])
        add(world, feed, pod_json("low", 4, priority=1))
        settle(scheduler, jobs, feed)
        add(world, feed, pod_json("high", 4, priority=10))
        while scheduler.schedule_next(0):
            pass
        assert scheduler.nominated == {"uid-high": "n1"}
        evict = [i for i, (fn, _) in enumerate(jobs.pending) if fn.__name__ == "_evict"]
        jobs.run(evict[0])  # the victim is evicted; the nomination patch has not run yet
        high = copy.deepcopy(by_name(world, "high"))
        high["status"]["conditions"] = [{"type": "PodScheduled", "status": "False"}]
        world.put_pod(high)
        if relist:
            feed.relist("pods")
        else:
            feed.sync()
        assert scheduler.nominated == {"uid-high": "n1"}
        world.delete_pod("uid-low")
        add(world, feed, pod_json("mid", 4, priority=5))
        mid = scheduler.queue.pop()
        assert mid == "uid-mid"  # the preemptor backs off
        scheduler._decide(mid, scheduler.cache.pods[mid], scheduler._view())
        assert all(fn.__name__ != "_bind" for fn, _ in jobs.pending)
        jobs.run_all()
        clock.advance(60)
        settle(scheduler, jobs, feed)
        assert by_name(world, "high")["spec"]["nodeName"] == "n1"
        assert not by_name(world, "mid")["spec"].get("nodeName")
        # a nomination cleared in the API is cleared here too
        assert "uid-high" not in scheduler.nominated


def test_a_nomination_cleared_in_the_api_is_dropped() -> None:
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=4)])
    pod = pod_json("waiting", 8, priority=3)
    pod["status"]["nominatedNodeName"] = "n1"
    add(world, feed, pod)
    assert scheduler.nominated == {"uid-waiting": "n1"}
    pod = copy.deepcopy(by_name(world, "waiting"))
    pod["status"]["nominatedNodeName"] = None
    world.put_pod(pod)
    feed.sync()
    assert scheduler.nominated == {}


def test_labels_set_while_the_pods_binding_is_in_flight_reach_the_rules() -> None:
    """A pod relabelled between the decision and its Binding's watch event (seen as our own
    Binding, booked as assumed): the view must carry the new labels, not those of the decision."""
    for when in ("assumed", "bound"):
        scheduler, jobs, core, clock, world, feed = setup(
            [node_json(n, gpus=4, labels={HOSTNAME: n}) for n in ("n1", "n2")]
        )
        add(world, feed, pod_json("first", 1))
        while scheduler.schedule_next(0):
            pass
        node = scheduler.assumed["uid-first"].node
        if when == "bound":
            jobs.run_all()
        first = copy.deepcopy(by_name(world, "first"))
        first["metadata"]["labels"] = {"app": "web"}
        world.put_pod(first)
        if when == "assumed":
            feed.sync()
            jobs.run_all()
        feed.sync()
        assert by_name(world, "first")["spec"]["nodeName"] == node
        assert scheduler.cluster is not None and scheduler.cluster.placement is not None
        assert scheduler.cluster.placement.index.facts["uid-first"].labels == {"app": "web"}
        anti = pod_json("second", 1)
        anti["spec"]["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOSTNAME}
                ]
            }
        }
        add(world, feed, anti)
        settle(scheduler, jobs, feed)
        assert by_name(world, "second")["spec"]["nodeName"] not in (None, node), when


def test_a_pod_being_bound_to_a_node_left_out_meanwhile_still_counts_for_the_rules() -> None:
    """The view is rebuilt while a Binding is in flight and its node now takes no pods (its
    inventory became unreadable): the pod holds nothing there for this scheduler, but its labels
    still count in its zone."""
    zone = "topology.kubernetes.io/zone"
    scheduler, jobs, core, clock, world, feed = setup(
        [node_json(n, gpus=4, labels={zone: "a", HOSTNAME: n}) for n in ("n1", "n2")]
    )
    web = pod_json("web", 1)
    web["metadata"]["labels"] = {"app": "web"}
    add(world, feed, web)
    while scheduler.schedule_next(0):
        pass
    node = scheduler.assumed["uid-web"].node
    world.put_node(node_json(node, gpus=4, labels={zone: "a", HOSTNAME: node}, inventory="null"))
    feed.sync()
    away = pod_json("away", 1)
    away["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": zone}
            ]
        }
    }
    add(world, feed, away)
    while scheduler.schedule_next(0):
        pass
    assert "uid-away" not in scheduler.assumed
    for index in reversed([i for i, (fn, _) in enumerate(jobs.pending) if fn.__name__ == "_post_failed"]):
        jobs.run(index)
    assert any("anti-affinity" in m for m in core.failed_events("away")), core.failed_events("away")


def test_a_nominated_pod_being_bound_elsewhere_reserves_nothing_on_its_nominated_node() -> None:
    """A pod nominated to n0 that found room on n1 instead is being bound there; n1 is left out
    meanwhile (its inventory became unreadable, so the pod is not booked in the view): n0's room
    is not held for it, and the view still knows where the pod is going."""
    scheduler, jobs, core, clock, world, feed = setup([node_json("n0", gpus=4), node_json("n1", gpus=4)])
    add(world, feed, pod_json("filler", 4, priority=10))
    settle(scheduler, jobs, feed)
    full = by_name(world, "filler")["spec"]["nodeName"]
    free = "n1" if full == "n0" else "n0"
    wanderer = pod_json("wanderer", 4)
    wanderer["status"]["nominatedNodeName"] = full
    add(world, feed, wanderer)
    while scheduler.schedule_next(0):
        pass
    assert scheduler.assumed["uid-wanderer"].node == free
    world.put_node(node_json(free, gpus=4, inventory="null"))
    world.delete_pod("uid-filler")
    add(world, feed, pod_json("next", 4))
    while scheduler.schedule_next(0):
        pass
    assert scheduler.assumed["uid-next"].node == full
    assert scheduler.cluster is not None and scheduler.cluster.placement is not None
    assert "uid-wanderer" in scheduler.cluster.placement.index.facts


def test_a_waiting_pod_with_pod_rules_gone_while_the_watch_was_down_is_forgotten() -> None:
    """A pod waiting on other pods' labels makes every placed pod retry the parked ones; once it
    is gone (seen only by a relist) it must not keep doing so."""
    scheduler, jobs, core, clock, world, feed = setup([node_json("n1", gpus=4, labels={HOSTNAME: "n1"})])
    near = pod_json("near", 1)
    near["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "nobody"}}, "topologyKey": HOSTNAME}
            ]
        }
    }
    add(world, feed, near)
    settle(scheduler, jobs, feed)
    assert scheduler._pod_rules_waiting == {"uid-near"}
    world.delete_pod("uid-near")
    feed.skip("pods")
    feed.relist("pods")
    assert scheduler._pod_rules_waiting == set()
