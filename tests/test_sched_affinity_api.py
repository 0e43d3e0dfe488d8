"""Node affinity, pod (anti-)affinity and spread constraints through the live scheduler and a real
kube-apiserver (issue #9, item 10)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.support.schedtrial import HOST, ZONE, create, make_trial, zoned_node
from tests.test_scheduler_api import Trial, scheduler_starter, wait_failed_scheduling

pytestmark = pytest.mark.apiserver


@pytest.fixture
def trial(admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path) -> Iterator[Trial]:
    with scheduler_starter(admin_api) as start:
        yield make_trial(admin_api, kube_namespace, tmp_path, start)


def zone_rule(op: str, *values: str) -> dict[str, Any]:
    expression = {"key": ZONE, "operator": op, "values": list(values)}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }


def test_required_node_affinity_to_a_missing_zone_stays_pending(trial: Trial) -> None:
    zoned_node(trial, "na", "a")
    trial.scheduler()
    create(trial, "lost", affinity=zone_rule("In", "does-not-exist"))
    event = wait_failed_scheduling(trial.core, trial.namespace, "lost", containing="affinity")
    assert "node(s) didn't match Pod's node affinity/selector" in event.message, event.message
    time.sleep(1)
    assert not trial.core.read_namespaced_pod("lost", trial.namespace).spec.node_name


def test_not_in_zone_a_never_lands_in_zone_a(trial: Trial) -> None:
    zoned_node(trial, "za", "a")
    b = zoned_node(trial, "zb", "b")
    trial.scheduler(policy="bestfit")
    names = [create(trial, f"not-a-{k}", affinity=zone_rule("NotIn", "a")) for k in range(4)]
    pods = trial.bound(names)
    assert {p.spec.node_name for p in pods.values()} == {b}
    create(trial, "one-too-many", affinity=zone_rule("NotIn", "a"))
    event = wait_failed_scheduling(trial.core, trial.namespace, "one-too-many")
    # zone b is full, zone a is refused (other tests' nodes fail the run selector, counted alike)
    assert "1 Insufficient nvidia.com/gpu" in event.message, event.message
    assert "node(s) didn't match Pod's node affinity/selector" in event.message, event.message


def test_anti_affinity_spreads_replicas_across_hosts(trial: Trial) -> None:
    nodes = {zoned_node(trial, f"h{k}", "a") for k in range(3)}
    trial.scheduler(policy="bestfit")  # packing would put all three on one node
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": HOST}
            ]
        }
    }
    names = [create(trial, f"web-{k}", labels={"app": "web"}, affinity=anti) for k in range(3)]
    pods = trial.bound(names)
    assert {p.spec.node_name for p in pods.values()} == nodes
    create(trial, "web-3", labels={"app": "web"}, affinity=anti)
    event = wait_failed_scheduling(trial.core, trial.namespace, "web-3")
    assert "3 node(s) didn't match pod anti-affinity rules" in event.message, event.message
    # once a replica goes, its host takes the waiting one
    freed = pods["web-0"].spec.node_name
    trial.core.delete_namespaced_pod("web-0", trial.namespace, grace_period_seconds=0)
    assert trial.bound(["web-3"])["web-3"].spec.node_name == freed


def test_required_pod_affinity_follows_the_target(trial: Trial) -> None:
    zoned_node(trial, "pa", "a")
    zoned_node(trial, "pb", "b")
    trial.scheduler(policy="spread")
    near_db = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}
            ]
        }
    }
    create(trial, "client-0", labels={"app": "client"}, affinity=near_db)
    wait_failed_scheduling(trial.core, trial.namespace, "client-0", containing="pod affinity rules")
    db_node = trial.bound([create(trial, "db", labels={"app": "db"})])["db"].spec.node_name
    names = ["client-0"] + [
        create(trial, f"client-{k}", labels={"app": "client"}, affinity=near_db) for k in (1, 2)
    ]
    pods = trial.bound(names)
    assert {p.spec.node_name for p in pods.values()} == {db_node}


def test_spread_constraint_keeps_zones_within_max_skew(trial: Trial) -> None:
    zoned_node(trial, "sa", "a", "dgx1-v100")
    zoned_node(trial, "sb", "b", "pcie-4gpu")
    trial.scheduler(policy="bestfit")  # packing alone would fill the DGX first
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "s"}},
        }
    ]
    names = []
    for k in range(8):
        names.append(create(trial, f"s-{k}", labels={"app": "s"}, topologySpreadConstraints=spread))
        trial.bound(names)  # one at a time: each decision sees the previous ones
    pods = trial.bound(names)
    zones = [p.spec.node_name.split("-")[0] for p in pods.values()]
    assert zones.count("sa") == 4 and zones.count("sb") == 4
    # zone b is full (4 GPUs): a ninth goes to zone a (skew 1), a tenth would make it 2
    assert trial.bound([create(trial, "s-8", labels={"app": "s"}, topologySpreadConstraints=spread)])
    create(trial, "s-9", labels={"app": "s"}, topologySpreadConstraints=spread)
    event = wait_failed_scheduling(trial.core, trial.namespace, "s-9")
    assert "1 node(s) didn't match pod topology spread constraints" in event.message, event.message
    assert "1 Insufficient nvidia.com/gpu" in event.message, event.message
