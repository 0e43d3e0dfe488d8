"""The live scheduler's ``Cache`` driven directly: what each event reports to the scheduler (whether
to wake the queue), what a read-back proved, and that the view kept up to date event by event
books exactly what a rebuild from the same objects books.

Added for the survivors of ``make mutate-live`` (docs/testing.md): the world-driven tests of
``test_sched_cache.py`` mostly see the cache through a rebuilt view, so the incremental paths
(``observe_bound``, ``apply_pod``, ``drop_pod`` on a clean view) and the return values the
scheduler acts on were not checked one by one.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
from typing import Any

import pytest

from kubegpu import allocation as contract
from scheduler.core.constraints import pod_facts
from scheduler.core.state import Allocation, GpuGrant
from scheduler.live.cache import Assumed, Binding, Cache, PodChange, is_bound, is_pending_for
from tests.support.schedworld import KEYS, gpu_id, inventory_json, node_json, pod_json
from tests.test_sched_cache import signed


def cache_with(*nodes: dict, pods: list[dict] = ()) -> Cache:
    cache = Cache("kubegpu", lambda: KEYS)
    cache.replace_nodes(nodes)
    cache.replace_pods([copy.deepcopy(p) for p in pods])
    cache.view()
    return cache


def snapshot(cache: Cache) -> dict[str, Any]:
    """What the view books: per node its free CPU, memory, pod slots and devices, and where each pod is."""
    cluster = cache.view()
    nodes = {
        node.name: (
            int(cluster.cpu_free[i]),
            int(cluster.mem_free[i]),
            int(cluster.pods_free[i]),
            cluster.gpu_free[i].tolist(),
            sorted(node.allocations),
        )
        for i, node in enumerate(cluster.nodes)
    }
    where = {uid: cluster.nodes[i].name for uid, i in cluster.where.items()}
    placed = dict(cluster.placement.index.node_of) if cluster.placement is not None else {}
    return {"nodes": nodes, "where": where, "placed": placed}


def same_as_rebuilt(cache: Cache) -> None:
    """The view kept up to date by events equals one rebuilt from the cache's objects."""
    assert not cache.dirty
    kept = snapshot(cache)
    cache.dirty = True
    assert snapshot(cache) == kept
    assert cache.check_consistency() == []


def bound(name: str, node: str, devices: list[str], **kw: Any) -> dict:
    return signed(pod_json(name, len(devices), **kw), node, devices)


def uid_of(pod: dict) -> str:
    return pod["metadata"]["uid"]


def alloc_of(pod: dict, node: str, devices: list[str]) -> Allocation:
    gpus = tuple(GpuGrant(int(d.rsplit("-", 1)[1]), d) for d in devices)
    return Allocation(node, uid_of(pod), f"ns/{pod['metadata']['name']}", 1000, 1024, gpus)


# --- nodes ---------------------------------------------------------------------------------------


def test_node_events_report_whether_the_usable_nodes_changed() -> None:
    cache = cache_with(node_json("n1", 2))
    assert cache.apply_node("DELETED", node_json("ghost")) is False  # never known
    assert cache.apply_node("MODIFIED", node_json("n1", 2)) is False  # the same node again
    assert not cache.dirty
    assert cache.apply_node("ADDED", node_json("n2", 2)) is True and cache.dirty
    assert sorted(snapshot(cache)["nodes"]) == ["n1", "n2"]
    assert cache.apply_node("MODIFIED", node_json("n2", 4)) is True
    assert len(snapshot(cache)["nodes"]["n2"][3]) == 4
    assert cache.apply_node("DELETED", node_json("n2")) is True and cache.dirty
    assert sorted(snapshot(cache)["nodes"]) == ["n1"]
    assert "n2" not in cache.facts


def test_a_heartbeat_matters_only_when_it_makes_a_node_usable_or_not() -> None:
    fresh = node_json("n1", 2)
    cache = cache_with(fresh)
    later = copy.deepcopy(fresh)
    stamp = dt.datetime.now(dt.UTC).replace(microsecond=0)
    later["metadata"]["annotations"] = {
        **later["metadata"]["annotations"],
        "kubegpu.io/heartbeat": (stamp + dt.timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    assert cache.apply_node("MODIFIED", later) is False and not cache.dirty  # fresh before and after
    stale = copy.deepcopy(fresh)
    stale["metadata"]["annotations"]["kubegpu.io/heartbeat"] = "2020-01-01T00:00:00Z"
    assert cache.apply_node("MODIFIED", stale) is True
    cache.view()
    assert cache.excluded == {"n1": "node's device heartbeat is stale"}
    assert cache.apply_node("MODIFIED", later) is True
    cache.view()
    assert cache.excluded == {}


# --- namespaces ----------------------------------------------------------------------------------


def test_namespace_events_report_label_changes() -> None:
    cache = Cache("kubegpu", lambda: KEYS)
    cache.replace_namespaces([{"metadata": {"name": "ns", "labels": {"team": "a"}}}, {"metadata": {}}])
    assert cache.namespaces == {"ns": {"team": "a"}}
    assert cache.apply_namespace("MODIFIED", {"metadata": {"name": "ns", "labels": {"team": "a"}}}) is False
    assert cache.apply_namespace("MODIFIED", {"metadata": {"name": "ns", "labels": {"team": "b"}}}) is True
    assert cache.apply_namespace("ADDED", {"metadata": {"name": "other", "labels": ["x"]}}) is True
    assert cache.namespaces["other"] == {}
    assert cache.apply_namespace("ADDED", {"metadata": {"labels": {}}}) is False  # no name
    assert cache.apply_namespace("DELETED", {"metadata": {"name": "gone"}}) is False
    assert cache.apply_namespace("DELETED", {"metadata": {"name": "other"}}) is True
    assert cache.namespaces == {"ns": {"team": "b"}}


# --- pods ----------------------------------------------------------------------------------------


def test_pod_events_report_what_they_did() -> None:
    cache = cache_with(node_json("n1", 4))
    assert cache.apply_pod("ADDED", {"metadata": {"name": "no-uid"}, "spec": {}}) is PodChange.NONE
    waiting = pod_json("waiting", 1)
    assert cache.apply_pod("ADDED", waiting) is PodChange.PENDING
    other = pod_json("other", 1, scheduler="default-scheduler")
    assert cache.apply_pod("ADDED", other) is PodChange.NONE  # another scheduler's pending pod
    assert cache.apply_pod("DELETED", pod_json("never-seen")) is PodChange.NONE
    done = copy.deepcopy(waiting)
    done["status"] = {"phase": "Succeeded"}
    assert cache.apply_pod("MODIFIED", done) is PodChange.GONE
    assert uid_of(waiting) not in cache.pods
    holder = bound("holder", "n1", [gpu_id("n1", 0)])
    assert cache.apply_pod("ADDED", holder) is PodChange.BOUND
    assert cache.apply_pod("MODIFIED", copy.deepcopy(holder)) is PodChange.NONE  # a status update
    unbound = pod_json("holder", 1, uid=uid_of(holder))
    assert cache.apply_pod("MODIFIED", unbound) is PodChange.NONE  # older than what was seen
    assert snapshot(cache)["where"] == {uid_of(holder): "n1"}
    failed = copy.deepcopy(holder)
    failed["status"] = {"phase": "Failed"}
    assert cache.apply_pod("MODIFIED", failed) is PodChange.GONE
    assert snapshot(cache)["where"] == {}
    same_as_rebuilt(cache)


def test_a_pod_that_leaves_this_scheduler_is_gone() -> None:
    cache = cache_with(node_json("n1", 4))
    mine = pod_json("p", 1)
    assert cache.apply_pod("ADDED", mine) is PodChange.PENDING
    gated = copy.deepcopy(mine)
    gated["spec"]["schedulingGates"] = [{"name": "wait"}]
    assert cache.apply_pod("MODIFIED", gated) is PodChange.GONE and uid_of(mine) not in cache.pods


def test_bound_pods_seen_one_by_one_book_what_a_rebuild_books() -> None:
    a = bound("a", "n1", [gpu_id("n1", 0)])
    cache = cache_with(node_json("n1", 4), node_json("n2", 4), pods=[a])
    b = bound("b", "n1", [gpu_id("n1", 1), gpu_id("n1", 2)])
    assert cache.apply_pod("ADDED", b) is PodChange.BOUND
    same_as_rebuilt(cache)
    # a pod of another scheduler, bound without an allocation: CPU and memory, no devices
    c = pod_json("c", cpu="2", scheduler="default-scheduler", node="n2")
    assert cache.apply_pod("ADDED", c) is PodChange.BOUND
    same_as_rebuilt(cache)
    # its labels change: the placement rules of later pods see the new ones
    relabelled = copy.deepcopy(c)
    relabelled["metadata"]["labels"] = {"app": "web"}
    assert cache.apply_pod("MODIFIED", relabelled) is PodChange.BOUND
    assert cache.view().placement.index.facts[uid_of(c)].labels == {"app": "web"}
    same_as_rebuilt(cache)
    # the allocation annotation of b is replaced by a valid one for other devices: the new booking
    moved = bound("b", "n1", [gpu_id("n1", 3)], uid=uid_of(b))
    assert cache.apply_pod("MODIFIED", moved) is PodChange.BOUND
    assert snapshot(cache)["nodes"]["n1"][3][:4] == [0, 1000, 1000, 0]
    same_as_rebuilt(cache)
    assert cache.apply_pod("DELETED", moved) is PodChange.GONE
    assert cache.apply_pod("DELETED", a) is PodChange.GONE
    assert snapshot(cache)["nodes"]["n1"][3][:4] == [1000] * 4
    same_as_rebuilt(cache)


def test_a_bound_pod_on_a_node_kubegpu_does_not_use_counts_for_rules_only() -> None:
    cordoned = node_json("n2", 2)
    cordoned["metadata"]["annotations"]["kubegpu.io/heartbeat"] = "2020-01-01T00:00:00Z"
    cache = cache_with(node_json("n1", 2), cordoned)
    there = pod_json("there", cpu="1", scheduler="default-scheduler", node="n2")
    assert cache.apply_pod("ADDED", there) is PodChange.BOUND
    view = cache.view()
    assert uid_of(there) not in view.where and uid_of(there) in view.placement.index.node_of
    same_as_rebuilt(cache)
    assert cache.apply_pod("DELETED", there) is PodChange.GONE
    assert uid_of(there) not in cache.view().placement.index.node_of
    same_as_rebuilt(cache)


# --- assumptions ---------------------------------------------------------------------------------


def test_our_own_binding_seen_bound_keeps_the_assumed_booking() -> None:
    cache = cache_with(node_json("n1", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    alloc = alloc_of(p, "n1", [gpu_id("n1", 2)])
    cache.assume(uid_of(p), alloc, 0.0)
    seen = bound("p", "n1", [gpu_id("n1", 2)], uid=uid_of(p))
    annotation = seen["metadata"]["annotations"]["kubegpu.io/allocation"]
    cache.sending(uid_of(p), annotation, None)
    cache.bind_succeeded(uid_of(p), 1.0, 5.0)
    assert cache.next_read_at() == 6.0
    assert cache.apply_pod("MODIFIED", seen) is PodChange.BOUND
    assert uid_of(p) not in cache.assumed and cache.view().allocation(uid_of(p)) == alloc
    assert cache.next_read_at() is None  # nothing left to read back
    same_as_rebuilt(cache)


def test_a_pod_bound_elsewhere_than_assumed_books_where_it_is() -> None:
    cache = cache_with(node_json("n1", 4), node_json("n2", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    cache.sending(uid_of(p), "our annotation", None)
    elsewhere = bound("p", "n2", [gpu_id("n2", 1)], uid=uid_of(p))
    assert cache.apply_pod("MODIFIED", elsewhere) is PodChange.BOUND
    nodes = snapshot(cache)["nodes"]
    assert nodes["n1"][3][:4] == [1000] * 4 and nodes["n2"][3][:4] == [1000, 0, 1000, 1000]
    same_as_rebuilt(cache)


def test_read_back_says_what_it_proved() -> None:
    cache = cache_with(node_json("n1", 4))
    pods = {name: pod_json(name, 1) for name in ("gone", "other", "done", "bound", "unbound")}
    for i, p in enumerate(pods.values()):
        cache.apply_pod("ADDED", p)
        cache.assume(
            uid_of(p), alloc_of(p, "n1", [gpu_id("n1", i % 4)]) if i < 4 else alloc_of(p, "n1", []), 0.0
        )
        cache.bind_uncertain(uid_of(p), 0.0, 1.0)
    assert sorted(cache.due_reads(1.0)) == sorted(uid_of(p) for p in pods.values())
    assert cache.read_back(uid_of(pods["gone"]), None) == "gone"
    assert (
        cache.read_back(uid_of(pods["other"]), pod_json("other", 1, uid="new")) == "gone"
    )  # same name, new pod
    finished = copy.deepcopy(pods["done"])
    finished["status"] = {"phase": "Succeeded"}
    assert cache.read_back(uid_of(pods["done"]), finished) == "gone"
    seen = bound("bound", "n1", [gpu_id("n1", 3)], uid=uid_of(pods["bound"]))
    assert cache.read_back(uid_of(pods["bound"]), seen) == "bound"
    assert cache.read_back(uid_of(pods["unbound"]), pods["unbound"]) == "unbound"
    assert cache.read_back(uid_of(pods["unbound"]), pods["unbound"]) == "resolved"
    assert cache.assumed == {}
    assert snapshot(cache)["where"] == {uid_of(pods["bound"]): "n1"}
    for name in ("gone", "other", "done"):
        assert uid_of(pods[name]) not in cache.pods
    same_as_rebuilt(cache)


def test_a_failed_read_is_tried_again_later() -> None:
    cache = cache_with(node_json("n1", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    cache.bind_uncertain(uid_of(p), 0.0, 2.0)
    assert cache.due_reads(1.9) == [] and cache.due_reads(2.0) == [uid_of(p)]
    assert cache.next_read_at() is None  # being read
    cache.read_failed(uid_of(p), 2.5, 3.0)
    assert cache.assumed[uid_of(p)].reads == 1 and cache.next_read_at() == 5.5
    assert cache.due_reads(5.5) == [uid_of(p)]


def test_an_assumed_pod_relabelled_while_binding_shows_its_new_labels() -> None:
    cache = cache_with(node_json("n1", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    relabelled = copy.deepcopy(p)
    relabelled["metadata"]["labels"] = {"role": "db"}
    assert cache.apply_pod("MODIFIED", relabelled) is PodChange.PENDING
    assert cache.view().placement.index.facts[uid_of(p)].labels == {"role": "db"}
    same_as_rebuilt(cache)


def test_a_relist_drops_assumptions_of_gone_pods_and_books_bound_ones() -> None:
    cache = cache_with(node_json("n1", 4))
    stays, goes = pod_json("stays", 1), pod_json("goes", 1)
    for i, p in enumerate((stays, goes)):
        cache.apply_pod("ADDED", p)
        cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", i)]), 0.0)
    listed = bound("stays", "n1", [gpu_id("n1", 0)], uid=uid_of(stays))
    assert cache.replace_pods([listed]) == [uid_of(goes)]
    assert cache.assumed == {}
    assert snapshot(cache)["where"] == {uid_of(stays): "n1"}
    # a list older than that: the pod shows unbound, but a pod never unbinds
    assert cache.replace_pods([stays]) == []
    assert snapshot(cache)["where"] == {uid_of(stays): "n1"}


# --- which pods are whose -------------------------------------------------------------------------


def test_which_pods_wait_for_this_scheduler_and_which_are_bound() -> None:
    p = pod_json("p", 1)
    assert is_pending_for(p, "kubegpu") and not is_pending_for(p, "default-scheduler")
    for change in (
        {"spec": {**p["spec"], "schedulingGates": [{"name": "quota"}]}},
        {"status": {"phase": "Failed"}},
        {"status": {"phase": "Succeeded"}},
        {"metadata": {**p["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}},
        {"spec": {**p["spec"], "nodeName": "n1"}},
    ):
        assert not is_pending_for({**p, **change}, "kubegpu"), change
    assert is_pending_for({**p, "status": {"phase": "Pending"}}, "kubegpu")
    on_node = pod_json("q", 1, node="n1")
    assert is_bound(on_node) and is_bound({**on_node, "status": {"phase": "Running"}})
    assert not is_bound({**on_node, "status": {"phase": "Succeeded"}}) and not is_bound(p)


# --- logs: one line per event, naming the objects --------------------------------------------------


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[tuple[int, dict[str, Any]]]:
    return [(r.levelno, r.fields) for r in caplog.records if r.getMessage() == name]


def test_excluded_and_usable_nodes_are_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    stale = node_json("n1", 2)
    stale["metadata"]["annotations"]["kubegpu.io/heartbeat"] = "2020-01-01T00:00:00Z"
    cache = cache_with(stale, node_json("n2", 2))
    assert events(caplog, "node.excluded") == [
        (logging.WARNING, {"node": "n1", "reason": "node's device heartbeat is stale"})
    ]
    cache.dirty = True
    cache.view()
    assert len(events(caplog, "node.excluded")) == 1 and events(caplog, "node.usable") == []
    cache.apply_node("MODIFIED", node_json("n1", 2))
    cache.view()
    assert events(caplog, "node.usable") == [(logging.INFO, {"node": "n1"})]
    assert cache.rebuilds == 3


def test_each_rebuild_logs_what_the_view_holds(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    stale = node_json("n3", 2)
    stale["metadata"]["annotations"]["kubegpu.io/heartbeat"] = "2020-01-01T00:00:00Z"
    holder, waiting = bound("holder", "n1", [gpu_id("n1", 0)]), pod_json("waiting", 1)
    cache = cache_with(node_json("n1", 2), node_json("n2", 2), stale, pods=[holder, waiting])
    cache.assume(uid_of(waiting), alloc_of(waiting, "n2", [gpu_id("n2", 0)]), 0.0)
    cache.dirty = True
    cache.view()
    assert [fields for _, fields in events(caplog, "cache.rebuilt")][-1] == {
        "nodes": 2,
        "excluded": 1,
        "bound_pods": 1,
        "assumed": 1,
    }


def test_a_relist_logs_each_assumption_it_drops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    cache = cache_with(node_json("n1", 2))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 1)]), 0.0)
    cache.replace_pods([])
    assert events(caplog, "pod.assumption_dropped") == [
        (logging.INFO, {"pod": "ns/p", "node": "n1", "reason": "pod is gone"})
    ]


def test_two_pods_holding_one_gpu_are_an_error_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    first = bound("first", "n1", [gpu_id("n1", 0)])
    second = bound("second", "n1", [gpu_id("n1", 0)])
    cache = cache_with(node_json("n1", 2), pods=[first, second])
    conflicts = events(caplog, "pod.allocation_conflict")
    assert conflicts == [
        (
            logging.ERROR,
            {
                "pod": "ns/second",
                "node": "n1",
                "devices": [gpu_id("n1", 0)],
                "reason": f"GPU {gpu_id('n1', 0)} is booked beyond its capacity",
            },
        )
    ]
    cache.dirty = True
    cache.view()
    assert len(events(caplog, "pod.allocation_conflict")) == 1  # the same report is not repeated
    assert events(caplog, "pod.allocation_problem") == []


def test_an_allocation_that_is_not_a_string_is_a_problem_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    odd = pod_json("odd", 1, node="n1")
    odd["metadata"]["annotations"]["kubegpu.io/allocation"] = {"devices": [gpu_id("n1", 0)]}
    cache = cache_with(node_json("n1", 2), pods=[odd])
    assert events(caplog, "pod.allocation_problem") == [
        (
            logging.WARNING,
            {"pod": "ns/odd", "node": "n1", "devices": [], "reason": "allocation ignored: not a string"},
        )
    ]
    assert snapshot(cache)["nodes"]["n1"][3][:2] == [1000, 1000]


def test_an_annotation_changed_after_binding_keeps_its_devices(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    p = bound("p", "n1", [gpu_id("n1", 1)])
    cache = cache_with(node_json("n1", 2), pods=[p])
    removed = copy.deepcopy(p)
    del removed["metadata"]["annotations"]["kubegpu.io/allocation"]
    cache.apply_pod("MODIFIED", removed)
    assert snapshot(cache)["nodes"]["n1"][3][:2] == [1000, 0]
    same_as_rebuilt(cache)
    assert [f["reason"] for _, f in events(caplog, "pod.allocation_problem")] == [
        "annotation changed after binding (removed); keeping its devices"
    ]
    garbled = copy.deepcopy(p)
    garbled["metadata"]["annotations"]["kubegpu.io/allocation"] = "garbled"
    cache.apply_pod("MODIFIED", garbled)
    cache.dirty = True
    assert snapshot(cache)["nodes"]["n1"][3][:2] == [1000, 0]
    reason = events(caplog, "pod.allocation_problem")[-1][1]["reason"]
    assert reason.startswith("annotation changed after binding (allocation ignored: ")
    assert reason.endswith("); keeping its devices")


def test_an_assumption_that_no_longer_fits_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    cache = cache_with(node_json("n1", 2))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    cache.replace_pods([p, bound("other", "n1", [gpu_id("n1", 0)])])  # another binder's pod on it
    cache.view()
    assert events(caplog, "pod.assumption_conflict") == [
        (
            logging.WARNING,
            {
                "pod": "ns/p",
                "node": "n1",
                "devices": [gpu_id("n1", 0)],
                "reason": f"GPU {gpu_id('n1', 0)} is booked beyond its capacity",
            },
        )
    ]


# --- our own bindings, NICs, memos ----------------------------------------------------------------


def test_our_own_binding_is_not_verified_again() -> None:
    """The annotation this replica sent is booked as assumed even when the verifying keys changed
    meanwhile (rotated out): it is this replica's decision, not a claim to check."""
    keys: dict[str, Any] = dict(KEYS)
    cache = Cache("kubegpu", lambda: keys)
    cache.replace_nodes([node_json("n1", 4)])
    p = pod_json("p", 1)
    cache.replace_pods([p])
    cache.view()
    alloc = alloc_of(p, "n1", [gpu_id("n1", 3)])
    cache.assume(uid_of(p), alloc, 0.0)
    seen = bound("p", "n1", [gpu_id("n1", 3)], uid=uid_of(p))
    cache.sending(uid_of(p), seen["metadata"]["annotations"]["kubegpu.io/allocation"], None)
    keys.clear()
    assert cache.apply_pod("MODIFIED", seen) is PodChange.BOUND
    assert cache.view().allocation(uid_of(p)) == alloc
    status = copy.deepcopy(seen)
    status["status"] = {"phase": "Running"}
    assert cache.apply_pod("MODIFIED", status) is PodChange.NONE
    cache.dirty = True
    assert cache.view().allocation(uid_of(p)) == alloc  # a rebuild keeps it too


def test_a_binding_not_yet_sent_is_verified_like_any_other() -> None:
    cache = cache_with(node_json("n1", 4), node_json("n2", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    seen = bound("p", "n1", [gpu_id("n1", 2)], uid=uid_of(p))  # another replica's binding, other GPU
    assert cache.apply_pod("MODIFIED", seen) is PodChange.BOUND
    assert snapshot(cache)["nodes"]["n1"][3][:4] == [1000, 1000, 0, 1000]
    same_as_rebuilt(cache)


def test_nics_in_an_allocation_are_not_booked_as_gpus() -> None:
    inventory = inventory_json([(gpu_id("n1", i), True) for i in range(2)], nics=["nic-0"])
    node = node_json("n1", 2, inventory=inventory)
    a = bound("a", "n1", [gpu_id("n1", 0), "nic-0"])
    cache = cache_with(node, pods=[a])
    assert [g.id for g in cache.view().allocation(uid_of(a)).gpus] == [gpu_id("n1", 0)]
    b = bound("b", "n1", [gpu_id("n1", 1), "nic-0"])
    assert cache.apply_pod("ADDED", b) is PodChange.BOUND
    assert [g.id for g in cache.view().allocation(uid_of(b)).gpus] == [gpu_id("n1", 1)]
    assert cache.apply_pod("MODIFIED", copy.deepcopy(b)) is PodChange.NONE
    same_as_rebuilt(cache)


def test_a_cache_takes_node_events_before_any_list() -> None:
    cache = Cache("kubegpu", lambda: KEYS)
    assert cache.apply_node("ADDED", node_json("n1", 2)) is True
    assert cache.view().node("n1").gpu_resource == 2  # nvidia.com/gpu, the default resource name


def test_a_heartbeat_older_than_two_minutes_is_stale_by_default() -> None:
    now = dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
    node = node_json("n1", 2)
    cache = Cache("kubegpu", lambda: KEYS, now=lambda: now)
    for age, stale in ((120, False), (121, True)):
        node["metadata"]["annotations"]["kubegpu.io/heartbeat"] = (now - dt.timedelta(seconds=age)).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        cache.replace_nodes([node])
        cache.view()
        assert ("n1" in cache.excluded) is stale, age


# --- relists, resizes, configured resource names ---------------------------------------------------


def test_a_bound_pod_resized_in_place_books_its_new_cpu() -> None:
    p = bound("p", "n1", [gpu_id("n1", 0)], cpu="1")
    cache = cache_with(node_json("n1", 2, cpu="64"), pods=[p])
    resized = copy.deepcopy(p)
    resized["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    assert cache.apply_pod("MODIFIED", resized) is PodChange.BOUND
    assert snapshot(cache)["nodes"]["n1"][0] == 60000
    same_as_rebuilt(cache)


def test_a_configured_gpu_resource_is_read_from_nodes_and_pods() -> None:
    def node(name: str) -> dict:
        n = node_json(name, 4)
        allocatable = n["status"]["allocatable"]
        allocatable["example.com/gpu"] = allocatable.pop("nvidia.com/gpu", "4")
        return n

    cache = Cache("kubegpu", lambda: KEYS, gpu_resource="example.com/gpu")
    cache.replace_nodes([node("n1")])
    assert cache.apply_node("ADDED", node("n2")) is True
    p = pod_json("p", node="n1")
    p["spec"]["containers"][0]["resources"]["limits"] = {"example.com/gpu": "3"}
    cache.replace_pods([p])
    view = cache.view()
    assert [view.node(n).gpu_resource for n in ("n1", "n2")] == [4, 4]
    assert view.gpu_resource_free.tolist() == [1, 4]


def test_a_relist_takes_the_listed_version_of_known_pods() -> None:
    holder = bound("holder", "n1", [gpu_id("n1", 0)])
    waiting = pod_json("waiting", 1)
    cache = cache_with(node_json("n1", 2), pods=[holder, waiting])
    newer_holder, newer_waiting = copy.deepcopy(holder), copy.deepcopy(waiting)
    newer_holder["metadata"]["labels"] = {"v": "2"}
    newer_waiting["metadata"]["labels"] = {"v": "2"}
    cache.replace_pods([newer_holder, newer_waiting])
    assert cache.pods[uid_of(holder)]["metadata"]["labels"] == {"v": "2"}
    assert cache.pods[uid_of(waiting)]["metadata"]["labels"] == {"v": "2"}
    assert cache.view().placement.index.facts[uid_of(holder)].labels == {"v": "2"}


def test_a_relist_showing_a_bound_pod_finished_releases_it() -> None:
    holder = bound("holder", "n1", [gpu_id("n1", 0)])
    cache = cache_with(node_json("n1", 2), pods=[holder])
    finished = copy.deepcopy(holder)
    finished["status"] = {"phase": "Succeeded"}
    cache.replace_pods([finished])
    assert snapshot(cache)["where"] == {} and uid_of(holder) not in cache.pods


def test_a_stale_entry_in_a_relist_does_not_hide_the_pods_after_it() -> None:
    holder = bound("holder", "n1", [gpu_id("n1", 0)])
    cache = cache_with(node_json("n1", 2), pods=[holder])
    stale = pod_json("holder", 1, uid=uid_of(holder))  # listed unbound: older than what was seen
    other, waiting = bound("other", "n1", [gpu_id("n1", 1)]), pod_json("waiting", 1)
    cache.replace_pods([stale, other, waiting])
    assert set(cache.pods) == {uid_of(holder), uid_of(other), uid_of(waiting)}
    assert snapshot(cache)["where"] == {uid_of(holder): "n1", uid_of(other): "n1"}


def test_while_the_view_is_stale_only_a_first_sighting_is_news() -> None:
    cache = cache_with(node_json("n1", 2))
    cache.apply_node("ADDED", node_json("n2", 2))  # the view is stale until the next decision
    p = bound("p", "n1", [gpu_id("n1", 0)])
    assert cache.apply_pod("ADDED", p) is PodChange.BOUND
    assert cache.apply_pod("MODIFIED", copy.deepcopy(p)) is PodChange.NONE
    assert snapshot(cache)["where"] == {uid_of(p): "n1"}


def test_a_relist_keeps_the_devices_of_an_annotation_changed_after_binding() -> None:
    p = bound("p", "n1", [gpu_id("n1", 1)])
    cache = cache_with(node_json("n1", 2), pods=[p])
    removed = copy.deepcopy(p)
    del removed["metadata"]["annotations"]["kubegpu.io/allocation"]
    cache.apply_pod("MODIFIED", removed)
    cache.replace_pods([removed])
    assert snapshot(cache)["nodes"]["n1"][3][:2] == [1000, 0]


# --- assumptions and placement rules --------------------------------------------------------------


def test_an_assumed_pod_counts_for_rules_with_its_labels() -> None:
    cache = cache_with(node_json("n1", 2))
    p, q = pod_json("p", 1), pod_json("q", 1)
    for pod, labels in ((p, {"app": "a"}), (q, {"app": "b"})):
        pod["metadata"]["labels"] = labels
        cache.apply_pod("ADDED", pod)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    given = pod_facts({**q, "metadata": {**q["metadata"], "labels": {"app": "given"}}})
    cache.assume(uid_of(q), alloc_of(q, "n1", [gpu_id("n1", 1)]), 0.0, given)
    facts = cache.view().placement.index.facts
    assert facts[uid_of(p)].labels == {"app": "a"} and facts[uid_of(q)].labels == {"app": "given"}


def test_our_own_binding_seen_with_new_labels_shows_them() -> None:
    cache = cache_with(node_json("n1", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    seen = bound("p", "n1", [gpu_id("n1", 0)], uid=uid_of(p))
    seen["metadata"]["labels"] = {"role": "db"}
    cache.sending(uid_of(p), seen["metadata"]["annotations"]["kubegpu.io/allocation"], None)
    assert cache.apply_pod("MODIFIED", seen) is PodChange.BOUND
    assert cache.view().placement.index.facts[uid_of(p)].labels == {"role": "db"}


def test_releasing_an_assumption_on_a_node_gone_stale_forgets_it_for_rules() -> None:
    fresh = node_json("n1", 2)
    cache = cache_with(fresh)
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    stale = copy.deepcopy(fresh)
    stale["metadata"]["annotations"]["kubegpu.io/heartbeat"] = "2020-01-01T00:00:00Z"
    cache.apply_node("MODIFIED", stale)
    assert uid_of(p) in cache.view().placement.index.node_of  # on its way there: counts for rules
    assert cache.release(uid_of(p)) is not None
    assert uid_of(p) not in cache.view().placement.index.node_of


def test_each_failed_read_counts() -> None:
    cache = cache_with(node_json("n1", 2))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 0)]), 0.0)
    cache.bind_uncertain(uid_of(p), 0.0, 1.0)
    for attempt in (1, 2, 3):
        assert cache.due_reads(100.0 * attempt) == [uid_of(p)]
        cache.read_failed(uid_of(p), 100.0 * attempt, 1.0)
        assert cache.assumed[uid_of(p)].reads == attempt


# --- reports with several problems, NICs, key rotation ---------------------------------------------


def test_every_problem_of_a_booking_is_in_its_report(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    both = [gpu_id("n1", 0), gpu_id("n1", 1)]
    first, second = bound("first", "n1", both), bound("second", "n1", both)
    cache = cache_with(node_json("n1", 2), pods=[first])
    assert cache.apply_pod("ADDED", second) is PodChange.BOUND  # seen by a watch event
    beyond = "; ".join(f"GPU {d} is booked beyond its capacity" for d in both)
    assert [f["reason"] for _, f in events(caplog, "pod.allocation_conflict")] == [beyond]
    cache.dirty = True
    cache.view()
    assert len(events(caplog, "pod.allocation_conflict")) == 1  # reported once per pod
    p = pod_json("p", 2)
    cache.apply_pod("ADDED", p)
    cache.replace_pods([p])
    cache.view()
    cache.assume(uid_of(p), alloc_of(p, "n1", both), 0.0)
    cache.replace_pods([p, first])
    cache.view()
    assert events(caplog, "pod.assumption_conflict")[-1][1]["reason"] == beyond
    odd = pod_json("odd", node="n1", cpu="lots")
    odd["metadata"]["annotations"]["kubegpu.io/allocation"] = 7
    cache.apply_pod("ADDED", odd)
    reason = events(caplog, "pod.allocation_problem")[-1][1]["reason"]
    assert reason.startswith("resources unreadable: ") and reason.endswith(
        "; allocation ignored: not a string"
    )


def test_an_allocation_of_nics_only_is_no_problem(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    inventory = inventory_json([(gpu_id("n1", 0), True)], nics=["nic-0"])
    nic_only = signed(pod_json("rdma"), "n1", ["nic-0"])
    cache = cache_with(node_json("n1", 1, inventory=inventory), pods=[nic_only])
    assert events(caplog, "pod.allocation_problem") == [] and snapshot(cache)["nodes"]["n1"][3][:1] == [1000]


def test_a_pod_verified_once_is_not_doubted_when_keys_rotate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    keys: dict[str, Any] = dict(KEYS)
    cache = Cache("kubegpu", lambda: keys)
    cache.replace_nodes([node_json("n1", 2)])
    p = bound("p", "n1", [gpu_id("n1", 1)])
    cache.replace_pods([p])
    cache.view()
    keys.clear()
    relabelled = copy.deepcopy(p)
    relabelled["metadata"]["labels"] = {"v": "2"}
    cache.apply_pod("MODIFIED", relabelled)
    cache.dirty = True
    assert snapshot(cache)["nodes"]["n1"][3][:2] == [1000, 0]
    assert events(caplog, "pod.allocation_problem") == []


def test_an_annotation_that_never_verified_is_not_kept(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    p = pod_json("p", 1, node="n1")
    p["metadata"]["annotations"]["kubegpu.io/allocation"] = "garbage-1"
    cache = cache_with(node_json("n1", 2), pods=[p])
    changed = copy.deepcopy(p)
    changed["metadata"]["annotations"]["kubegpu.io/allocation"] = "garbage-2"
    cache.apply_pod("MODIFIED", changed)
    cache.dirty = True
    cache.view()
    reasons = [f["reason"] for _, f in events(caplog, "pod.allocation_problem")]
    assert reasons and all(r.startswith("allocation ignored: ") for r in reasons), reasons


def test_our_own_binding_is_reported_as_no_problem(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kubegpu.scheduler.cache")
    cache = cache_with(node_json("n1", 4))
    p = pod_json("p", 1)
    cache.apply_pod("ADDED", p)
    cache.assume(uid_of(p), alloc_of(p, "n1", [gpu_id("n1", 1)]), 0.0)
    seen = bound("p", "n1", [gpu_id("n1", 1)], uid=uid_of(p))
    annotation = seen["metadata"]["annotations"]["kubegpu.io/allocation"]
    cache.sending(uid_of(p), annotation, contract.verify(annotation, KEYS))
    cache.apply_pod("MODIFIED", seen)
    cache.dirty = True
    cache.view()
    relabelled = copy.deepcopy(seen)
    relabelled["metadata"]["labels"] = {"v": "2"}
    cache.apply_pod("MODIFIED", relabelled)
    cache.dirty = True
    cache.view()
    assert events(caplog, "pod.allocation_problem") == []


# --- the soak's consistency check and heartbeats going stale ---------------------------------------


def test_the_consistency_check_names_each_violation() -> None:
    holder, waiting = bound("holder", "n1", [gpu_id("n1", 0)]), pod_json("waiting", 1)
    cache = cache_with(node_json("n1", 2), pods=[holder, waiting])
    assert cache.check_consistency() == []
    cache.assumed["ghost"] = Assumed(alloc_of(waiting, "n1", []), Binding.IN_FLIGHT, 0.0)
    cache.assumed[uid_of(holder)] = Assumed(alloc_of(holder, "n1", []), Binding.IN_FLIGHT, 0.0)
    cache.view().book(Allocation("n1", "orphan"))
    assert cache.check_consistency() == [
        "assumption without a pod: ghost",
        f"bound and assumed: {uid_of(holder)}",
        "booking without a pod: orphan",
    ]


def test_time_passing_makes_a_silent_node_stale_and_a_heartbeat_brings_it_back() -> None:
    clock = [dt.datetime.now(dt.UTC)]
    cache = Cache("kubegpu", lambda: KEYS, now=lambda: clock[0])
    cache.replace_nodes([node_json("n1", 2), node_json("n2", 2)])
    cache.view()
    assert cache.exclusions_flipped() is False and not cache.dirty
    clock[0] += dt.timedelta(seconds=300)
    assert cache.exclusions_flipped() is True and cache.dirty
    cache.view()
    assert sorted(cache.excluded) == ["n1", "n2"]
    assert cache.exclusions_flipped() is False and not cache.dirty
