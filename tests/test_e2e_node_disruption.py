"""A node keeps its GPU pods through restarts of kubelet, the shim (SIGKILL) and containerd.

While whole-GPU and fractional pods run, one component is restarted. Afterwards the same
containers still run (nothing was restarted or lost), the node is Ready again, the API and
containerd agree on who holds which device with no device held twice (tests/support/invariants.py),
and a new pod gets a free GPU and sees exactly it.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.fixtures.localcluster import KubeNode
from tests.support.invariants import look, problems
from tests.support.nodepods import (
    ContainerView,
    allocation_of,
    check_view,
    container,
    pod,
    wait_running,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]


def container_ids(found: k8s.V1Pod) -> dict[str, tuple[str, int]]:
    return {s.name: (s.container_id, s.restart_count) for s in found.status.container_statuses}


def node_problems(node: KubeNode, settled: bool = True) -> list[str]:
    assert node.node.containerd is not None
    view = look(node.core, node.name, node.cluster.node_keys, node.node.containerd.endpoint)
    return problems(view, settled=settled)


@pytest.mark.parametrize("component", ["kubelet", "shim-sigkill", "containerd"])
def test_gpu_pods_survive_a_restart(gpu_node: KubeNode, node_namespace: str, component: str) -> None:
    core, ns, node = gpu_node.core, node_namespace, gpu_node.node
    bodies = [
        pod("four", [container("app", 4)], gpu_node.selector),
        pod("two", [container("app", 2)], gpu_node.selector),
        pod("half", [container("app")], gpu_node.selector, annotations={"kubegpu.io/gpu-milli": "500"}),
    ]
    for body in bodies:
        core.create_namespaced_pod(ns, body)
    before = {b["metadata"]["name"]: container_ids(wait_running(core, ns, b["metadata"]["name"]))
              for b in bodies}
    assert node_problems(gpu_node) == []

    if component == "kubelet":
        node.restart_kubelet()
    elif component == "shim-sigkill":
        node.restart_shim(kill=True)
    else:
        node.restart_containerd()
    gpu_node.cluster.wait_node_usable(node)

    after = {name: container_ids(wait_running(core, ns, name)) for name in before}
    assert after == before  # the same containers, never restarted
    assert node_problems(gpu_node) == []

    # the shim, kubelet and scheduler still agree: a new pod gets a free GPU and sees just it
    core.create_namespaced_pod(ns, pod("later", [container("app", 1)], gpu_node.selector))
    later = wait_running(core, ns, "later", timeout=120)
    allocation = allocation_of(later, gpu_node.cluster.node_keys)
    taken = {d for name in before
             for entry in allocation_of(core.read_namespaced_pod(name, ns), gpu_node.cluster.node_keys)
             .containers.values() for d in entry.devices if not entry.shares}
    assert not set(allocation.containers["app"].devices) & taken
    log = gpu_node.kubectl("logs", "-n", ns, "later").stdout
    check_view(ContainerView.parse(log), gpu_node.name, allocation, "app")
    assert node_problems(gpu_node) == []
