"""Placement rules inside the core's decision: schedule_one with node affinity, pod (anti-)affinity
and spread constraints, as the live scheduler, the extender and the simulator get them."""

from __future__ import annotations

import random
from typing import Any

from scheduler.core import (
    ClusterState,
    GpuState,
    NodeState,
    Placement,
    PodRequest,
    Unschedulable,
    schedule_one,
)
from scheduler.core.affinity import PodFacts
from scheduler.core.filters import failed_nodes, run_filters
from scheduler.core.placement import placement_of
from scheduler.core.policies import make_policy
from scheduler.core.state import Allocation, GpuGrant

ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"


def node(name: str, zone: str | None, gpus: int = 4) -> NodeState:
    labels = {HOST: name}
    if zone:
        labels[ZONE] = zone
    return NodeState(name, 64_000, 256_000, [GpuState(i, f"{name}-g{i}") for i in range(gpus)], labels=labels)


def cluster() -> ClusterState:
    c = ClusterState([node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b")])
    c.enable_placement()
    return c


def pod_json(name: str, spec: dict[str, Any] | None = None, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": labels or {"app": name},
        },
        "spec": {"containers": [{"name": "c"}], **(spec or {})},
    }


def request(doc: dict[str, Any], gpus: int = 1) -> PodRequest:
    meta = doc["metadata"]
    return PodRequest(
        f"{meta['namespace']}/{meta['name']}",
        uid=meta["uid"],
        gpu_count=gpus,
        node_selector=dict(doc["spec"].get("nodeSelector") or {}),
        placement=placement_of(doc),
    )


def place(c: ClusterState, doc: dict[str, Any], policy_name: str = "binpack") -> Placement | Unschedulable:
    pod = request(doc)
    result = schedule_one(pod, c, make_policy(policy_name), random.Random(1))
    if isinstance(result, Placement):
        c.assume(result.allocation, pod.placement.facts if pod.placement else None)
    return result


def required_node_affinity(op: str, *values: str) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": ZONE, "operator": op, "values": list(values)}]}
                    ]
                }
            }
        }
    }


def test_required_node_affinity_in_a_missing_zone_fits_nowhere() -> None:
    c = cluster()
    result = place(c, pod_json("p", required_node_affinity("In", "does-not-exist")))
    assert isinstance(result, Unschedulable)
    assert result.message() == "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."


def test_not_in_zone_a_never_lands_in_zone_a() -> None:
    c = cluster()
    for k in range(8):
        result = place(c, pod_json(f"p{k}", required_node_affinity("NotIn", "a")))
        assert isinstance(result, Placement) and result.node in ("b1", "b2")
    assert isinstance(place(c, pod_json("p9", required_node_affinity("NotIn", "a"))), Unschedulable)


def test_anti_affinity_spreads_replicas_across_hosts() -> None:
    anti = {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOST}
                ]
            }
        }
    }
    c = cluster()
    hosts = []
    for k in range(4):
        result = place(c, pod_json(f"web-{k}", anti, app="web"))  # binpack would stack them
        assert isinstance(result, Placement)
        hosts.append(result.node)
    assert sorted(hosts) == ["a1", "a2", "b1", "b2"]
    result = place(c, pod_json("web-4", anti, app="web"))
    assert isinstance(result, Unschedulable)
    assert result.message() == "0/4 nodes are available: 4 node(s) didn't match pod anti-affinity rules."
    # a pod without rules of its own is not kept out: the replicas' terms select only web pods
    assert isinstance(place(c, pod_json("other", app="other")), Placement)
    # forgetting a replica frees its host for the next one
    c.forget("uid-web-2")
    assert isinstance(place(c, pod_json("web-5", anti, app="web")), Placement)


def test_placed_pods_anti_affinity_keeps_matching_pods_out() -> None:
    loner = {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": ZONE}
                ]
            }
        }
    }
    c = cluster()
    result = place(c, pod_json("loner", loner, app="quiet"))
    assert isinstance(result, Placement)
    zone = result.node[0]
    for k in range(4):
        noisy = place(c, pod_json(f"noisy{k}", app="noisy"))
        assert isinstance(noisy, Placement) and noisy.node[0] != zone
    pod = request(pod_json("noisy9", app="noisy"))
    why = failed_nodes(pod, c)
    assert why[f"{zone}1"] == "node(s) didn't satisfy existing pods anti-affinity rules"


def test_required_affinity_follows_the_pods_it_names() -> None:
    near_db = {
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}
                ]
            }
        }
    }
    c = cluster()
    lonely = place(c, pod_json("client", near_db, app="client"))
    assert isinstance(lonely, Unschedulable)
    assert "4 node(s) didn't match pod affinity rules" in lonely.message()
    db = place(c, pod_json("db", app="db"))
    assert isinstance(db, Placement)
    for k in range(6):
        result = place(c, pod_json(f"client{k}", near_db, app="client"))
        assert isinstance(result, Placement) and result.node[0] == db.node[0]


def test_spread_constraint_balances_zones() -> None:
    spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    }
    c = cluster()
    zones = []
    for k in range(6):
        result = place(c, pod_json(f"w{k}", spread, app="web"))
        assert isinstance(result, Placement)
        zones.append(result.node[0])
        assert abs(zones.count("a") - zones.count("b")) <= 1
    assert sorted(zones) == ["a", "a", "a", "b", "b", "b"]


def test_preferences_move_the_choice() -> None:
    prefer_b = {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 50,
                        "preference": {
                            "matchExpressions": [{"key": ZONE, "operator": "In", "values": ["b"]}]
                        },
                    }
                ]
            }
        }
    }
    c = cluster()
    for k in range(3):
        result = place(c, pod_json(f"p{k}", prefer_b))
        assert isinstance(result, Placement) and result.node.startswith("b")
    soft_spread = {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": HOST,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app": "s"}},
            }
        ]
    }
    c = cluster()
    hosts = {place(c, pod_json(f"s{k}", soft_spread, app="s")).node for k in range(4)}  # type: ignore[union-attr]
    assert hosts == {"a1", "a2", "b1", "b2"}  # binpack alone would stack all four on one node


def test_without_placement_nothing_changes() -> None:
    """The simulator's path: no view, no rules; the placement filter does not even run."""
    c = ClusterState([node("a1", "a"), node("b1", "b")])
    pod = PodRequest("p", gpu_count=1)
    idx, _ = run_filters(pod, c)
    assert idx.tolist() == [0, 1]
    from scheduler.core.filters import PlacementFilter

    assert not PlacementFilter().applies(pod, c)
    c.enable_placement()
    assert not PlacementFilter().applies(pod, c)  # nothing in the cluster has required anti-affinity
    assert isinstance(schedule_one(pod, c, make_policy("binpack"), random.Random(0)), Placement)


def test_enable_placement_indexes_what_is_booked_and_other_nodes() -> None:
    c = ClusterState([node("a1", "a"), node("b1", "b")])
    c.assume(Allocation("a1", "early", "ml/early", gpus=(GpuGrant(0, "a1-g0"),)))
    view = c.enable_placement(
        others=[("x1", {ZONE: "b", HOST: "x1"}, ())], namespace_labels={"ml": {"t": "1"}}
    )
    assert view.index.node_of == {"early": 0} and view.index.facts["early"].namespace == "ml"
    assert view.namespace_labels == {"ml": {"t": "1"}}
    assert view.place(PodFacts("elsewhere", "ml", {"app": "web"}), "x1")
    anti = {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": ZONE}
                ]
            }
        }
    }
    pod = request(pod_json("w", anti, app="web"))
    idx, why = run_filters(pod, c)
    # zone b holds a web pod on x1, a node kubegpu does not schedule on: b1 is excluded
    assert idx.tolist() == [0] and not why
    c.forget("early")
    assert "early" not in view.index.node_of
