"""Issue 20, items 1-4, against a real kube-apiserver through the live kubegpu scheduler: a pod that
kube-scheduler would refuse (and kubelet admission would reject) is not bound; it gets
kube-scheduler's FailedScheduling message instead.

Each node is a fake Node (no kubelet) with the allocatable the case needs, plus the kubegpu
advertiser's inventory; pods "of another scheduler" are created already bound (``spec.nodeName``),
as kube-scheduler or a DaemonSet would leave them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from crishim.advertiser import Advertiser
from crishim.rewrite import NodeDevices
from devices.registry import load_plugins
from kubegpu.devenv.controlplane import create_fake_node
from tests.support.schedtrial import make_trial
from tests.test_scheduler_api import Trial, scheduler_starter, wait_failed_scheduling

pytestmark = pytest.mark.apiserver
MiB = 1 << 20


@pytest.fixture
def trial(admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path) -> Iterator[Trial]:
    with scheduler_starter(admin_api) as start:
        yield make_trial(admin_api, kube_namespace, tmp_path, start)


def node(trial: Trial, prefix: str, topology: str = "pcie-4gpu", **allocatable: str) -> str:
    """A node only this trial's pods select, with this allocatable (beyond cpu 8, memory 32Gi, pods
    110) and the kubegpu inventory of ``topology`` (the advertiser publishes its GPU and RDMA
    counts); returns its name."""
    name = f"{prefix}-{trial.run}"
    create_fake_node(trial.core, name, labels={"run": trial.run}, capacity=allocatable)
    plugins = load_plugins(
        ["sim"], {"node_name": name, "topology": topology, "state_dir": str(trial.state / name)}
    )
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    Advertiser(trial.core, name, devices.current_inventory).sync_once()
    return name


def pod(
    trial: Trial,
    name: str,
    *,
    requests: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
    bound_to: str | None = None,
    **spec: Any,
) -> str:
    """Create a pod for this trial's scheduler (or, ``bound_to``, one already bound by another)."""
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": trial.namespace},
        "spec": {
            "schedulerName": "default-scheduler" if bound_to else trial.name,
            "nodeSelector": {"run": trial.run},
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "100m", **(requests or {})}, "limits": limits or {}},
                    "ports": ports or [],
                }
            ],
            **spec,
        },
    }
    if bound_to:
        body["spec"]["nodeName"] = bound_to
    trial.core.create_namespaced_pod(trial.namespace, body)
    return name


def only_reason(message: str) -> str:
    """The reason of kube-scheduler's message for this trial's node, the others (other tests' nodes
    on the shared apiserver) being left out by the node selector, by their cordon, which
    NodeUnschedulable checks first, or as nodes kubegpu does not use at all ("node has no kubegpu
    device inventory", "node's device heartbeat is stale", ...: counted before any filter)."""
    assert message.startswith("0/") and " nodes are available: " in message, message
    reasons = message.split(" nodes are available: ", 1)[1].rstrip(".").split(", ")
    others = ("didn't match Pod's node affinity/selector", "node(s) were unschedulable")
    excluded = re.compile(r"^\d+ node(?!\(s\))")  # a node left out whole says "node", not "node(s)"
    return ", ".join(r for r in reasons if not any(o in r for o in others) and not excluded.match(r))


def node_of(trial: Trial, name: str) -> str | None:
    return trial.core.read_namespaced_pod(name, trial.namespace).spec.node_name


# --- item 1 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resource", "node_has", "each"),
    [
        ("example.com/foo", "2", "1"),
        # the advertiser publishes the 64 VFs of an HGX H100 with SR-IOV (8 on each of its 8 NICs);
        # a pod asking for the resource gets that many VFs too (at most 32 a pod)
        ("kubegpu.io/rdma", "", "32"),
        ("ephemeral-storage", "10Gi", "5Gi"),
        ("hugepages-2Mi", "8Mi", "4Mi"),
    ],
)
def test_other_resources_are_checked_and_other_schedulers_pods_hold_them(
    trial: Trial, resource: str, node_has: str, each: str
) -> None:
    topology = "hgx-h100-sriov" if resource == "kubegpu.io/rdma" else "hgx-h100"
    target = node(trial, "res", topology, **({resource: node_has} if node_has else {}))
    limits = {resource: each}
    # hugepages need a memory or cpu request beside them, and requests equal to limits
    extra = {"memory": "64Mi"} if resource.startswith("hugepages-") else {}
    pod(trial, "theirs", requests={**limits, **extra}, limits=limits, bound_to=target)
    trial.scheduler()
    pod(trial, "fits", requests={**limits, **extra}, limits=limits)
    assert trial.bound(["fits"])["fits"].spec.node_name == target
    pod(trial, "more", requests={**limits, **extra}, limits=limits)
    event = wait_failed_scheduling(trial.core, trial.namespace, "more", containing="Insufficient")
    assert only_reason(event.message) == f"1 Insufficient {resource}", event.message
    assert node_of(trial, "more") is None


def test_an_extended_resource_no_node_has_is_never_bound(trial: Trial) -> None:
    node(trial, "plain")
    trial.scheduler()
    pod(trial, "foo", limits={"example.com/foo": "1"})
    event = wait_failed_scheduling(trial.core, trial.namespace, "foo", containing="Insufficient")
    assert only_reason(event.message) == "1 Insufficient example.com/foo", event.message
    assert node_of(trial, "foo") is None


# --- item 2 --------------------------------------------------------------------------------------------


def test_pod_level_requests_count(trial: Trial) -> None:
    target = node(trial, "cpu4", cpu="4")
    trial.scheduler()
    for name in ("first", "second"):
        pod(trial, name, resources={"requests": {"cpu": "3"}})
    first = trial.bound(["first"])["first"]
    assert first.spec.node_name == target
    event = wait_failed_scheduling(trial.core, trial.namespace, "second", containing="Insufficient")
    assert only_reason(event.message) == "1 Insufficient cpu", event.message
    assert node_of(trial, "second") is None


# --- item 3 --------------------------------------------------------------------------------------------


def test_a_host_port_in_use_keeps_a_second_pod_off_the_node(trial: Trial) -> None:
    target = node(trial, "ports")
    trial.scheduler()
    web = [{"containerPort": 80, "hostPort": 8080}]
    pod(trial, "web1", ports=web)
    assert trial.bound(["web1"])["web1"].spec.node_name == target
    pod(trial, "web2", ports=web)
    pod(trial, "udp", ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}])
    assert trial.bound(["udp"])["udp"].spec.node_name == target  # another protocol: no conflict
    event = wait_failed_scheduling(trial.core, trial.namespace, "web2", containing="ports")
    expected = "1 node(s) didn't have free ports for the requested pod ports"
    assert only_reason(event.message) == expected, event.message
    assert node_of(trial, "web2") is None


# --- item 4 --------------------------------------------------------------------------------------------


def test_node_memory_is_compared_in_bytes(trial: Trial) -> None:
    node(trial, "mem", memory=str(1000 * MiB + 1))  # was rounded up to 1001 MiB
    trial.scheduler()
    pod(trial, "too-big", requests={"memory": "1001Mi"})
    event = wait_failed_scheduling(trial.core, trial.namespace, "too-big", containing="Insufficient")
    assert only_reason(event.message) == "1 Insufficient memory", event.message
    assert node_of(trial, "too-big") is None
