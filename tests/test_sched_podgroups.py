"""Pod groups as parsed from the API (scheduler/live/podgroups.py), the group book
(scheduler/live/gangs.py) and the core's minResources check (scheduler/core/gang.resource_gap)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest

from scheduler.core.gang import GPUS, resource_gap
from scheduler.core.state import MIB, Allocation, ClusterState, GpuGrant, GpuState, NodeState
from scheduler.live.gangs import GroupBook
from scheduler.live.podgroups import (
    INITIALLY_SCHEDULED,
    KUBE_API,
    PLUGINS_API,
    PLUGINS_LABEL,
    GroupError,
    GroupRef,
    MemberCounts,
    group_ref,
    initially_scheduled_condition,
    member_counts,
    min_resources_wanted,
    occupied_by,
    parse_group,
    plugins_phase,
    plugins_status,
    status_patch,
)


def pod(labels: dict[str, Any] | None = None, group: Any = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "labels": labels or {}},
        "spec": spec,
    }
    if group is not None:
        body["spec"]["schedulingGroup"] = group
    return body


def test_group_ref_reads_both_apis_and_refuses_ambiguity() -> None:
    assert group_ref(pod()) is None
    assert group_ref(pod({PLUGINS_LABEL: ""})) is None  # as scheduler-plugins: no group
    assert group_ref(pod({PLUGINS_LABEL: "g"})) == GroupRef(PLUGINS_API, "ns", "g")
    assert group_ref(pod(group={"podGroupName": "k"})) == GroupRef(KUBE_API, "ns", "k")
    assert group_ref(pod(group={})) is None
    for bad in ({"podGroupName": ""}, {"podGroupName": 3}, "k"):
        with pytest.raises(GroupError):
            group_ref(pod(group=bad))
    with pytest.raises(GroupError, match="joins two pod groups"):
        group_ref(pod({PLUGINS_LABEL: "g"}, group={"podGroupName": "k"}))
    with pytest.raises(GroupError):
        group_ref(pod({PLUGINS_LABEL: 5}))


def plugins(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": spec}


def test_parse_plugins_podgroup() -> None:
    spec = parse_group(
        PLUGINS_API, plugins(minMember=3, scheduleTimeoutSeconds=20, minResources={"cpu": "1500m"})
    )
    assert (spec.min_member, spec.timeout_seconds, spec.gang) == (3, 20.0, True)
    assert spec.min_resources == {"cpu": Decimal("1.5")}
    assert parse_group(PLUGINS_API, plugins()).min_member == 1
    assert parse_group(PLUGINS_API, plugins(minMember=0)).min_member == 1
    assert parse_group(PLUGINS_API, {"metadata": {"name": "g"}}).min_member == 1  # no spec at all
    for bad in (
        {"minMember": -1},
        {"minMember": True},
        {"minMember": 1.5},
        {"minMember": 100_001},
        {"scheduleTimeoutSeconds": 0},
        {"scheduleTimeoutSeconds": "10"},
        {"minResources": {"cpu": "-1"}},
        {"minResources": {"cpu": "x"}},
        {"minResources": ["cpu"]},
    ):
        with pytest.raises(GroupError):
            parse_group(PLUGINS_API, plugins(**bad))
    with pytest.raises(GroupError):
        parse_group(PLUGINS_API, {"metadata": {"name": "g"}, "spec": []})


def test_parse_kubernetes_podgroup() -> None:
    def kube(policy: Any, constraints: Any = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"schedulingPolicy": policy}
        if constraints is not None:
            spec["schedulingConstraints"] = constraints
        return {"metadata": {"name": "k", "namespace": "ns"}, "spec": spec}

    gang = parse_group(KUBE_API, kube({"gang": {"minCount": 4}}, {"topology": [{"key": "rack"}]}))
    assert (gang.min_member, gang.gang, gang.domain_key) == (4, True, "rack")
    basic = parse_group(KUBE_API, kube({"basic": {}}))
    assert (basic.gang, basic.min_member, basic.domain_key) == (False, 1, None)
    assert parse_group(KUBE_API, kube({"gang": {"minCount": 2}}, {"topology": []})).domain_key is None
    for bad in (
        kube({}),
        kube([]),
        kube({"gang": {"minCount": 0}}),
        kube({"gang": {}}),
        kube({"gang": []}),
        kube({"gang": {"minCount": 2}}, {"topology": [{"key": ""}]}),
        kube({"gang": {"minCount": 2}}, {"topology": "rack"}),
        kube({"gang": {"minCount": 2}}, []),
    ):
        with pytest.raises(GroupError):
            parse_group(KUBE_API, bad)
    with pytest.raises(GroupError, match="unknown pod group API"):
        parse_group("example.com", kube({"basic": {}}))


def test_min_resources_in_the_cores_units() -> None:
    spec = parse_group(
        PLUGINS_API,
        plugins(
            minResources={"cpu": "1.0001", "memory": "1Gi", "nvidia.com/gpu": 2, "pods": "0", "x.io/y": "1"}
        ),
    )
    assert min_resources_wanted(spec, "nvidia.com/gpu") == {
        "cpu": 1001,
        "memory": 1 << 30,
        GPUS: 2,
        "x.io/y": 1,
    }


def counts(**kw: int) -> MemberCounts:
    return MemberCounts(**kw)


def test_plugins_phase_follows_the_controllers_rules() -> None:
    assert plugins_phase("", 2, counts(pods=2)) == "Scheduling"
    assert plugins_phase("", 2, counts(pods=1)) == "Pending"
    assert plugins_phase("Pending", 2, counts(pods=1)) == "Pending"
    assert plugins_phase("Pending", 2, counts(pods=2)) == "Scheduling"
    assert plugins_phase("Scheduling", 2, counts(pods=2, scheduled=2)) == "Scheduled"
    assert plugins_phase("Scheduled", 2, counts(pods=2, scheduled=2, running=2)) == "Running"
    assert plugins_phase("Running", 2, counts(pods=2, running=1, failed=1)) == "Failed"
    assert plugins_phase("Running", 2, counts(pods=2, succeeded=2)) == "Finished"
    assert plugins_phase("Running", 2, counts(pods=1, running=1)) == "Pending"
    assert plugins_phase("Finished", 2, counts(pods=0)) == "Finished"
    assert plugins_phase("Failed", 2, counts(pods=2, running=2)) == "Failed"
    assert plugins_phase("Running", 2, counts(pods=3, running=1, succeeded=1)) == "Running"


def test_member_counts_and_owner() -> None:
    pods = [
        {"spec": {"nodeName": "n"}, "status": {"phase": "Running"}},
        {"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}},
        {"spec": {"nodeName": "n"}, "status": {"phase": "Succeeded"}},
        {"spec": {}, "status": {"phase": "Failed"}},
        {"spec": {}, "status": {}},
    ]
    assert member_counts(pods) == MemberCounts(5, 2, 1, 1, 1)
    owned = {"metadata": {"namespace": "ns", "ownerReferences": [{"name": "b"}, {"name": "a"}]}}
    assert occupied_by([owned]) == "ns/a,ns/b"
    assert occupied_by([{"metadata": {}}, owned]) == ""
    assert occupied_by([]) == ""


def test_plugins_status_and_patch() -> None:
    spec = parse_group(PLUGINS_API, {**plugins(minMember=1), "status": {"phase": "Pending", "running": 3}})
    wanted = plugins_status(spec, [{"spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}], "T")
    assert wanted == {"phase": "Scheduled", "scheduled": 1, "scheduleStartTime": "T"}
    assert status_patch(spec.status, wanted) == {
        "status": {"phase": "Scheduled", "scheduled": 1, "running": None, "scheduleStartTime": "T"}
    }
    assert status_patch(wanted, wanted) is None
    kept = parse_group(PLUGINS_API, {**plugins(), "status": {"scheduleStartTime": "S", "occupiedBy": "o"}})
    assert plugins_status(kept, [], "T")["scheduleStartTime"] == "S"
    assert plugins_status(kept, [], "T")["occupiedBy"] == "o"


def test_initially_scheduled_condition() -> None:
    first = initially_scheduled_condition(None, False, "Unschedulable", "why", "T1", 3)
    assert first == {
        "type": INITIALLY_SCHEDULED,
        "status": "False",
        "reason": "Unschedulable",
        "message": "why",
        "lastTransitionTime": "T1",
        "observedGeneration": 3,
    }
    assert initially_scheduled_condition([first], False, "Unschedulable", "why", "T2", 3) is None
    changed = initially_scheduled_condition([first], False, "Unschedulable", "other", "T2", None)
    assert changed is not None and changed["lastTransitionTime"] == "T1" and changed["message"] == "other"
    done = initially_scheduled_condition([first], True, "Scheduled", "ok", "T3", None)
    assert done is not None and done["status"] == "True" and done["lastTransitionTime"] == "T3"
    assert initially_scheduled_condition([done], False, "Unschedulable", "x", "T4", None) is None  # final


def test_group_book_membership_and_recorded_start() -> None:
    book = GroupBook()
    book.put_group(
        PLUGINS_API, {**plugins(minMember=2), "status": {"scheduleStartTime": "2026-01-01T00:00:00Z"}}
    )
    ref = GroupRef(PLUGINS_API, "ns", "g")
    assert book.set_pod("u1", pod({PLUGINS_LABEL: "g"})) == ref
    book.set_pod("u2", pod({PLUGINS_LABEL: "g"}))
    assert book.members[ref] == {"u1", "u2"}
    book.set_pod("u2", pod({PLUGINS_LABEL: "other"}))
    assert book.members[ref] == {"u1"}
    assert isinstance(book.set_pod("u3", pod(group={"podGroupName": ""})), GroupError)
    book.replace_pods({"u2": pod({PLUGINS_LABEL: "other"})})
    assert ref not in book.members and "u1" not in book.of
    wall = dt.datetime(2026, 1, 1, 0, 1, 0, tzinfo=dt.UTC)
    progress = book.trying(ref, 500.0, wall)
    assert progress.first_try == 440.0 and progress.start_time == "2026-01-01T00:00:00Z"
    book.replace_groups(PLUGINS_API, [])
    assert ref not in book.specs and ref not in book.progress


def cluster() -> ClusterState:
    nodes = [
        NodeState(f"n{i}", 4000, 1024, [GpuState(j, f"n{i}-g{j}", "A100") for j in range(4)], max_pods=10)
        for i in range(2)
    ]
    return ClusterState(nodes)


def test_resource_gap_sums_the_free_cluster_and_counts_the_groups_own_as_free() -> None:
    state = cluster()
    assert resource_gap(state, {"cpu": 8000, GPUS: 8, "pods": 20, "memory": 2048 * MIB}) == {}
    assert resource_gap(state, {"cpu": 8001, GPUS: 9, "x.io/y": 1}) == {"cpu": 1, GPUS: 1, "x.io/y": 1}
    grant = (GpuGrant(0, "n0-g0", 1000), GpuGrant(1, "n0-g1", 1000))
    state.assume(Allocation("n0", "m1", "ns/m1", cpu_milli=1000, memory_mib=512, gpus=grant))
    state.assume(Allocation("n1", "other", "ns/other", cpu_milli=1000, gpus=(GpuGrant(0, "n1-g0", 1000),)))
    assert resource_gap(state, {GPUS: 8, "cpu": 8000}) == {GPUS: 3, "cpu": 2000}
    assert resource_gap(state, {GPUS: 8, "cpu": 8000, "memory": 2048 * MIB}, ["m1"]) == {GPUS: 1, "cpu": 1000}
    assert resource_gap(state, {"pods": 20}, ["m1"]) == {"pods": 1}
