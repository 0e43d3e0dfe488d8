"""What the live scheduler hands the core's preemption (scheduler/live/preemption.py), field by field.

The end-to-end preemption tests (tests/test_sched_preempt_live.py) show that pods get evicted;
these show that each victim candidate, node offer, budget and rule test carries what the pod,
its booking and the node say, on a cluster view built by the live cache from API objects.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
from typing import Any

from crishim.advertiser import publication
from devices.model import SHARING_ATTRIBUTE, Device, DeviceKind, NodeInventory, Sharing
from kubegpu import allocation as contract
from scheduler.core.preempt import GpuSlot, RunningPod
from scheduler.core.state import Allocation, ClusterState, GpuGrant
from scheduler.live.podspec import pod_request
from scheduler.live.preemption import (
    NEVER_A_VICTIM,
    budget,
    candidate_nodes,
    node_offer,
    other_rules,
    running_pod,
)
from tests.fixtures.keys import SIGNING
from tests.support.schedworld import Feed, World, make_scheduler, node_json, pod_json

HOSTNAME = "kubernetes.io/hostname"
STARTED = "2026-03-01T10:00:00Z"


def alloc(name: str = "ns/p", uid: str = "u-p", **fields: Any) -> Allocation:
    base: dict[str, Any] = {
        "node": "n1",
        "pod_uid": uid,
        "pod_name": name,
        "cpu_milli": 1500,
        "memory_mib": 512,
    }
    return Allocation(**{**base, **fields})


def placed(priority: int = 7, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "team", "labels": {"app": "db", "tier": 1}, **meta},
        "spec": {"priority": priority, "nodeName": "n1"},
        "status": {"startTime": STARTED},
    }


# --------------------------------------------------------------------------- running_pod


def test_a_placed_pod_is_its_booking_plus_what_its_object_says() -> None:
    gpus = (GpuGrant(-1, "GPU-a", 1000, 0), GpuGrant(-1, "GPU-b", 250, 4096))
    booked = alloc(gpus=gpus, gpu_resource=1)
    pod = running_pod(booked, placed(deletionTimestamp="2026-03-01T11:00:00Z"))
    assert pod == RunningPod(
        uid="u-p",
        name="ns/p",
        namespace="team",  # the object's namespace
        priority=7,
        start_time=dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC).timestamp(),
        cpu_milli=1500,
        memory_mib=512,
        charged_gpus=booked.charged_gpus,
        terminating=True,
    )
    assert pod.labels == {"app": "db", "tier": "1"}  # as strings, as label selectors read them
    assert pod.gpus == {"GPU-a": (1000, 0), "GPU-b": (250, 4096)}
    assert pod.charge == booked.charged_gpus
    assert not running_pod(booked, placed()).terminating


def test_a_placed_pod_whose_object_is_missing_or_protected_is_never_a_victim() -> None:
    pod = running_pod(alloc(), placed())
    assert pod.priority == 7  # not protected unless told
    assert running_pod(alloc(), placed(), protected=True).priority == NEVER_A_VICTIM
    unknown = running_pod(alloc(name="other/q"), None)
    assert (unknown.priority, unknown.namespace, unknown.labels) == (NEVER_A_VICTIM, "other", {})
    assert unknown.start_time == math.inf and not unknown.terminating
    assert running_pod(alloc(name=""), None).namespace == "default"


def test_a_placed_pod_with_odd_metadata_or_status_still_becomes_a_candidate() -> None:
    odd = {"metadata": "junk", "spec": {"priority": 3}, "status": "junk"}
    pod = running_pod(alloc(name="ns/p"), odd)
    assert (pod.priority, pod.namespace, pod.labels, pod.start_time) == (3, "ns", {}, math.inf)
    no_start = placed()
    del no_start["status"]["startTime"]
    assert running_pod(alloc(), no_start).start_time == math.inf
    no_namespace = placed()
    del no_namespace["metadata"]["namespace"]
    assert running_pod(alloc(name="ns/p"), no_namespace).namespace == "ns"
    bad_labels = placed(labels=["x"])
    assert running_pod(alloc(), bad_labels).labels == {}


# --------------------------------------------------------------------------- budget


def test_a_budget_keeps_its_name_and_defaults_its_namespace() -> None:
    parsed = budget({"metadata": {"name": "db-pdb"}, "spec": {"selector": {"matchLabels": {"app": "db"}}}})
    assert parsed is not None
    assert (parsed.name, parsed.namespace, parsed.disruptions_allowed) == ("db-pdb", "default", 0)
    assert parsed.disrupted_pods == frozenset()
    nameless = budget({"metadata": {"namespace": "x"}, "spec": {}})
    assert nameless is not None and nameless.name == "" and nameless.namespace == "x"
    odd = budget({"metadata": {}, "spec": {}, "status": {"disruptionsAllowed": "2", "disruptedPods": ["a"]}})
    assert odd is not None and odd.disruptions_allowed == 0 and odd.disrupted_pods == frozenset()


# --------------------------------------------------------------------------- on a live cache's view


def mps_inventory(node: str) -> str:
    devices = (
        Device(f"GPU-{node}-0", DeviceKind.GPU, 0, "H100", 81920, numa_node=0),
        Device(
            f"GPU-{node}-1",
            DeviceKind.GPU,
            1,
            "A100",
            40960,
            numa_node=1,
            healthy=False,
            attributes={SHARING_ATTRIBUTE: Sharing.MPS},
        ),
    )
    return publication(NodeInventory(devices)).inventory


def labelled(pod: dict[str, Any], **labels: str) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"]["labels"] = dict(labels)
    return pod


def view(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> tuple[ClusterState, dict[str, Any]]:
    """The live cache's cluster view of these API objects, and its pods by uid."""
    world = World()
    for node in nodes:
        world.put_node(node)
    for pod in pods:
        world.put_pod(pod)
    scheduler, _jobs, _core, _clock = make_scheduler(world)
    Feed(world, scheduler).relist()
    return scheduler.cache.view(), scheduler.cache.pods


def host(name: str, **kwargs: Any) -> dict[str, Any]:
    labels = {HOSTNAME: name, **kwargs.pop("labels", {})}
    return node_json(name, labels=labels, **kwargs)


def test_a_node_offer_has_the_nodes_capacity_gpus_limits_and_every_pod_on_it() -> None:
    node = host(
        "n1", gpus=0, cpu="16", memory="64Gi", pods="30", gpu_count="2", inventory=mps_inventory("n1")
    )
    theirs = pod_json("theirs", 1, scheduler="default-scheduler", node="n1", priority=5)
    ours = pod_json("ours", 1, node="n1", priority=100)
    allocation = contract.Allocation("n1", "uid-ours", {"app": contract.ContainerAllocation(("GPU-n1-0",))})
    ours["metadata"]["annotations"][contract.ANNOTATION] = contract.sign(allocation, "k1", SIGNING["k1"])
    cluster, pods = view([node], [theirs, ours])
    state = cluster.nodes[cluster.index["n1"]]
    offer = node_offer(state, pods, protected={"uid-theirs"})
    assert (offer.name, offer.cpu_milli, offer.memory_mib) == ("n1", 16000, 65536)
    assert (offer.max_pods, offer.gpu_resource) == (30, 2)
    assert offer.gpus == (
        GpuSlot("GPU-n1-0", "H100", 81920, True, False),
        GpuSlot("GPU-n1-1", "A100", 40960, False, True),
    )
    assert offer.links is state.links() and offer.links is not None
    assert [(p.uid, p.priority, p.charge) for p in offer.pods] == [
        ("uid-ours", 100, 1),
        ("uid-theirs", NEVER_A_VICTIM, 1),  # protected: never a victim
    ]
    assert offer.pods[0].gpus == {"GPU-n1-0": (1000, 0)}
    unprotected = node_offer(state, pods, protected=())
    assert [p.priority for p in unprotected.pods] == [100, 5]


def test_candidate_nodes_are_those_where_evicting_lower_priority_pods_could_help() -> None:
    nodes = [
        host("selected-out", labels={"pool": "other"}),
        host("tainted", labels={"pool": "gpu"}),
        host("equal-only", labels={"pool": "gpu"}),
        host("lower", labels={"pool": "gpu"}),
        host("protected-only", labels={"pool": "gpu"}),
        host("empty", labels={"pool": "gpu"}),
    ]
    nodes[1]["spec"]["taints"] = [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]

    def running(name: str, node: str, priority: int) -> dict[str, Any]:
        return pod_json(name, scheduler="default-scheduler", node=node, priority=priority)

    pods = [
        running("a", "selected-out", 0),
        running("b", "tainted", 0),
        running("c", "equal-only", 10),
        running("d", "lower", 9),
        running("e", "lower", 50),
        running("f", "protected-only", 0),
    ]
    cluster, known = view(nodes, pods)
    preemptor = pod_json("preemptor", priority=10)
    preemptor["spec"]["nodeSelector"] = {"pool": "gpu"}
    request = pod_request(preemptor)
    chosen = candidate_nodes(request, cluster, 10, known, protected={"uid-f"})
    assert [cluster.nodes[i].name for i in chosen] == ["lower"]
    # Without the protection, and for a higher priority, more nodes qualify; a pod the cache
    # does not know (no object) is never a victim.
    chosen = candidate_nodes(request, cluster, 11, known)
    assert sorted(cluster.nodes[i].name for i in chosen) == ["equal-only", "lower", "protected-only"]
    unknown = {uid: pod for uid, pod in known.items() if uid != "uid-d"}
    assert candidate_nodes(request, cluster, 10, unknown, protected={"uid-f"}) == []


def test_a_node_missing_a_required_spread_label_is_no_candidate() -> None:
    nodes = [host("zoned", labels={"zone": "a"}), host("unzoned")]
    pods = [
        pod_json("x", scheduler="default-scheduler", node="zoned", priority=0),
        pod_json("y", scheduler="default-scheduler", node="unzoned", priority=0),
    ]
    cluster, known = view(nodes, pods)
    preemptor = labelled(pod_json("preemptor", priority=10), app="web")
    preemptor["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    chosen = candidate_nodes(pod_request(preemptor), cluster, 10, known)
    assert [cluster.nodes[i].name for i in chosen] == ["zoned"]


def test_other_rules_test_the_pods_rules_with_the_victims_gone() -> None:
    nodes = [host("n1", labels={"pool": "gpu"}), host("n2", labels={"pool": "gpu"})]
    blocker = labelled(pod_json("blocker", scheduler="default-scheduler", node="n1", priority=0), app="db")
    cluster, _known = view(nodes, [blocker])
    preemptor = pod_json("preemptor", priority=10)
    preemptor["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOSTNAME}
            ]
        },
        # node affinity is candidate_nodes' business: the rule test leaves it out
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}
                ]
            }
        },
    }
    rules = other_rules(pod_request(preemptor).placement, cluster)
    fits_n1, fits_n2 = rules("n1"), rules("n2")
    assert fits_n1 is not None and fits_n2 is not None
    assert not fits_n1(frozenset())  # the blocker's node
    assert fits_n1(frozenset({"uid-blocker"}))  # with the blocker evicted
    assert fits_n2(frozenset())


def test_other_rules_are_none_when_no_pod_rule_can_refuse() -> None:
    nodes = [host("n1", labels={"pool": "gpu"})]
    cluster, _known = view(nodes, [pod_json("x", scheduler="default-scheduler", node="n1")])
    plain = pod_json("plain", priority=10)
    assert other_rules(pod_request(plain).placement, cluster)("n1") is None
    assert other_rules(None, cluster)("n1") is None
    only_node_affinity = copy.deepcopy(plain)
    only_node_affinity["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["x"]}]}
                ]
            }
        }
    }
    assert other_rules(pod_request(only_node_affinity).placement, cluster)("n1") is None
