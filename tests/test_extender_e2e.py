"""kube-scheduler v1.37.2 with kubegpu as its extender, on a real node (issue #23): the local
cluster (apiserver, controller manager, a kubelet -> kubegpu crishim -> containerd node with 8
simulated GPUs), a real kube-scheduler given the shipped stanza of
deploy/extender/kube-scheduler-config.yaml for a profile of its own, and ``kubegpu extender`` as a
process with the kubegpu-scheduler ServiceAccount and the cluster's signing key.

The local cluster's own kubegpu scheduler keeps running; it serves ``schedulerName: kubegpu`` only,
so the pods here (the profile's name) are kube-scheduler's. A 4-GPU pod and GPU shares go Running
on the kubelet node, bound through the extender (its bind verb counted, kube-scheduler's
``Scheduled`` Event), and each container sees exactly its allocated GPUs (its printed environment
and device nodes). A pod asking for a GPU model the node lacks waits with the extender's reason in
kube-scheduler's FailedScheduling Event."""

from __future__ import annotations

import itertools
import json
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devices.model import NodeInventory
from kubegpu.devenv.controlplane import Component, free_ports, http_ok
from kubegpu.localcluster.cluster import SCHEDULER_ACCOUNT, SYSTEM_NAMESPACE
from tests.fixtures.localcluster import KubeNode
from tests.support.nodepods import (
    allocation_of,
    check_view,
    container,
    gpu_index,
    pod,
    read_view,
    wait_running,
)
from tests.support.schedtrial import wait_for
from tests.test_scheduler_api import wait_failed_scheduling

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]

REPO = Path(__file__).resolve().parent.parent
PROFILE = "kube-ext-e2e"
MILLI = "kubegpu.io/gpu-milli"


@dataclass
class Extended:
    """kube-scheduler (profile ``PROFILE``) calling ``kubegpu extender`` on ``port``."""

    node: KubeNode
    extender: Component
    kube_scheduler: Component
    port: int

    def bind_calls(self) -> float:
        """Bind requests the extender answered with 200, from its /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
            text = response.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("kubegpu_extender_requests_total{") and 'verb="bind"' in line:
                if 'code="200"' in line:
                    total += float(line.rsplit(" ", 1)[1])
        return total


def shipped_config(port: int) -> dict[str, Any]:
    """deploy/extender/kube-scheduler-config.yaml for PROFILE, calling the extender on ``port``."""
    config = yaml.safe_load((REPO / "deploy" / "extender" / "kube-scheduler-config.yaml").read_text())
    config["profiles"] = [{"schedulerName": PROFILE}]
    (stanza,) = config["extenders"]
    assert stanza["ignorable"] is False and stanza["nodeCacheCapable"] is True
    stanza["urlPrefix"] = f"http://127.0.0.1:{port}"
    return config


@pytest.fixture(scope="module")
def extended(kube_node: KubeNode) -> Iterator[Extended]:
    cluster = kube_node.cluster
    assert cluster.plane is not None
    (port,) = free_ports(1)
    kubeconfig = cluster.plane.service_account_kubeconfig(SYSTEM_NAMESPACE, SCHEDULER_ACCOUNT, 3600)
    argv = [
        sys.executable, "-m", "kubegpu", "extender", "--kubeconfig", str(kubeconfig),
        "--scheduler-name", PROFILE, "--policy", "topology", "--address", f"127.0.0.1:{port}",
        "--keys-dir", str(cluster.scheduler_keys), "--signing-key-id", cluster.key_id,
    ]  # fmt: skip
    extender = Component("kubegpu-extender", argv, cluster.state_dir / "extender-e2e.log").start()
    try:
        extender.wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), "ready", 60)
        scheduler = cluster.plane.start_scheduler(shipped_config(port))
        try:
            yield Extended(kube_node, extender, scheduler, port)
        finally:
            scheduler.stop()
    finally:
        extender.stop()


def scheduled_by_kube_scheduler(core: k8s.CoreV1Api, namespace: str, found: k8s.V1Pod) -> None:
    """kube-scheduler's profile (not kubegpu's scheduler) posted the pod's one Scheduled Event."""
    selector = f"involvedObject.name={found.metadata.name},reason=Scheduled"

    def listed() -> list[k8s.CoreV1Event]:
        return core.list_namespaced_event(namespace, field_selector=selector).items

    [event] = wait_for(listed, f"a Scheduled Event of {found.metadata.name}", 30)
    assert event.reporting_component == PROFILE, event
    name, where = found.metadata.name, found.spec.node_name
    assert event.message == f"Successfully assigned {namespace}/{name} to {where}"


def test_multi_gpu_and_shares_run_on_the_node_with_exactly_their_gpus(
    extended: Extended, node_namespace: str
) -> None:
    node, core, ns = extended.node, extended.node.core, node_namespace
    binds = extended.bind_calls()
    bodies = {
        "four": pod("four", [container("app", 4)], node.selector, scheduler=PROFILE),
        "half-1": pod("half-1", [container("app")], node.selector, {MILLI: "500"}, scheduler=PROFILE),
        "half-2": pod("half-2", [container("app")], node.selector, {MILLI: "500"}, scheduler=PROFILE),
    }
    for body in bodies.values():
        core.create_namespaced_pod(ns, body)
    allocations = {}
    for name in bodies:
        found = wait_running(core, ns, name, timeout=120)
        assert found.spec.scheduler_name == PROFILE and found.spec.node_name == node.name
        allocation = allocation_of(found, node.cluster.node_keys)
        assert allocation.node == node.name and allocation.pod_uid == found.metadata.uid
        check_view(read_view(core, ns, name, "app"), node.name, allocation, "app")
        scheduled_by_kube_scheduler(core, ns, found)
        allocations[name] = allocation.containers["app"]
    # every pod went through the extender's bind (its signed allocation says so, above); a bind the
    # extender refused for kube-scheduler to retry (a pod its cache had not seen yet) is answered
    # 200 too, with the reason in the body, as the protocol has it: so at least one call a pod
    assert extended.bind_calls() - binds >= len(bodies)

    four = allocations["four"].devices
    assert len(four) == 4 and not allocations["four"].shares
    assert sorted(gpu_index(node.name, d) for d in four) in ([0, 1, 2, 3], [4, 5, 6, 7])
    inventory = NodeInventory.from_public(
        json.loads(core.read_node(node.name).metadata.annotations["kubegpu.io/inventory"])
    )
    assert all(inventory.topology.nvlink_count(a, b) > 0 for a, b in itertools.combinations(four, 2))
    used: dict[str, int] = {}
    for name in ("half-1", "half-2"):
        (device,) = allocations[name].devices
        assert allocations[name].shares[device].milli == 500 and device not in four
        used[device] = used.get(device, 0) + 500
    assert all(milli <= 1000 for milli in used.values()), used


def test_a_pod_that_fits_nowhere_waits_with_the_extenders_reason(
    extended: Extended, node_namespace: str
) -> None:
    node, core = extended.node, extended.node.core
    body = pod("wrong-model", [container("app", 1)], node.selector,
               {"kubegpu.io/gpu-model": "A100-SXM4-80GB"}, scheduler=PROFILE)  # fmt: skip
    core.create_namespaced_pod(node_namespace, body)
    event = wait_failed_scheduling(core, node_namespace, "wrong-model", timeout=60)
    assert "0/" in event.message and "A100-SXM4-80GB" in event.message, event.message
    assert not core.read_namespaced_pod("wrong-model", node_namespace).spec.node_name
