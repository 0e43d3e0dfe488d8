"""End to end through the real kubelet: kubegpu scheduler -> kubelet -> kubegpu crishim -> containerd.

Every test runs on both containerd lines (``gpu_node``: Debian's 1.6 and the Go-built 2.x), with
the node's kubelet using a node certificate against an apiserver with Node,RBAC and
NodeRestriction. Containers print their environment and the sim device nodes they see
(tests/support/nodepods.py); ``kubectl logs`` (apiserver -> kubelet -> shim -> containerd) brings
that back, and it must match the pod's signed allocation exactly.
"""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import time
import urllib.request

import pytest
from kubernetes import client as k8s

from devices.model import NodeInventory
from kubegpu.allocation import Allocation
from tests.fixtures.localcluster import KubeNode
from tests.support.nodepods import (
    ContainerView,
    allocation_of,
    check_view,
    container,
    gpu_index,
    pod,
    report_script,
    running,
    wait_pod,
    wait_running,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.containerd, pytest.mark.node]
MILLI = "kubegpu.io/gpu-milli"
GPU_CONTAINERS = "kubegpu.io/gpu-containers"


def view_of(node: KubeNode, namespace: str, name: str, container_name: str, previous: bool = False
            ) -> ContainerView:
    args = ["logs", "-n", namespace, name, "-c", container_name] + (["--previous"] if previous else [])
    deadline = time.monotonic() + 30
    while True:  # the log may lag the Running state by a moment
        log = node.kubectl(*args).stdout
        if "--- end ---" in log or time.monotonic() > deadline:
            return ContainerView.parse(log)
        time.sleep(0.3)


def inventory(node: KubeNode) -> NodeInventory:
    annotations = node.core.read_node(node.name).metadata.annotations
    return NodeInventory.from_public(json.loads(annotations["kubegpu.io/inventory"]))


def check_pods(node: KubeNode, namespace: str, pods: dict[str, dict]) -> dict[str, Allocation]:
    """Create the pods, wait until all run, check every container's view; return the allocations."""
    for body in pods.values():
        node.core.create_namespaced_pod(namespace, body)
    allocations = {}
    used: dict[str, int] = {}
    for name, body in pods.items():
        found = wait_running(node.core, namespace, name)
        assert found.spec.node_name == node.name
        allocation = allocation_of(found, node.cluster.node_keys)
        assert allocation.node == node.name and allocation.pod_uid == found.metadata.uid
        for spec in body["spec"]["containers"]:
            check_view(view_of(node, namespace, name, spec["name"]), node.name, allocation, spec["name"])
        for entry in allocation.containers.values():
            for device in entry.devices:
                share = entry.shares.get(device)
                used[device] = used.get(device, 0) + (share.milli if share else 1000)
        allocations[name] = allocation
    assert all(milli <= 1000 for milli in used.values()), used
    return allocations


def devices_of(allocation: Allocation) -> list[str]:
    return [d for entry in allocation.containers.values() for d in entry.devices]


def test_whole_gpus_topology_aware_and_a_share(gpu_node: KubeNode, node_namespace: str) -> None:
    """Pods of 1, 2 and 4 whole GPUs get NVLink-connected sets; a 250-milli share fits beside them."""
    pods = {
        "four": pod("four", [container("app", 4)], gpu_node.selector),
        "two": pod("two", [container("app", 2)], gpu_node.selector),
        "one": pod("one", [container("app", 1)], gpu_node.selector),
        "share": pod("share", [container("app")], gpu_node.selector, annotations={MILLI: "250"}),
    }
    allocations = check_pods(gpu_node, node_namespace, pods)
    topology = inventory(gpu_node).topology
    for name in ("two", "four"):
        devices = devices_of(allocations[name])
        assert all(topology.nvlink_count(a, b) > 0 for a, b in itertools.combinations(devices, 2)), devices
    four = sorted(gpu_index(gpu_node.name, d) for d in devices_of(allocations["four"]))
    assert four in ([0, 1, 2, 3], [4, 5, 6, 7])
    whole = [d for name in ("four", "two", "one") for d in devices_of(allocations[name])]
    assert len(set(whole)) == 7
    (shared,) = devices_of(allocations["share"])
    assert allocations["share"].containers["app"].shares[shared].milli == 250
    assert shared not in whole


def test_several_containers_each_see_only_their_own(gpu_node: KubeNode, node_namespace: str) -> None:
    """Whole GPUs dealt out per container, a container without GPUs, a share split over two."""
    pods = {
        "multi": pod("multi", [container("a", 2), container("b"), container("c", 1)], gpu_node.selector),
        "split": pod("split", [container("x"), container("y"), container("z")], gpu_node.selector,
                     annotations={MILLI: "500", GPU_CONTAINERS: "x,z"}),
    }
    allocations = check_pods(gpu_node, node_namespace, pods)
    multi = allocations["multi"].containers
    assert set(multi) == {"a", "c"} and len(multi["a"].devices) == 2 and len(multi["c"].devices) == 1
    assert not set(multi["a"].devices) & set(multi["c"].devices)
    split = allocations["split"].containers
    assert set(split) == {"x", "z"} and split["x"].devices == split["z"].devices


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_logs_exec_attach_and_port_forward_through_the_shim(gpu_node: KubeNode, node_namespace: str) -> None:
    """The streaming calls (Exec, Attach, PortForward) and logs pass through the shim."""
    ns, port = node_namespace, free_port()
    serve = (f"echo kubegpu-{port} > /tmp/index.html; busybox httpd -p {port} -h /tmp; "
             "while read line; do echo \"got $line\"; done; sleep 3600")
    body = pod("stream", [container("app", 1, then=serve, stdin=True)], gpu_node.selector)
    gpu_node.core.create_namespaced_pod(ns, body)
    found = wait_running(gpu_node.core, ns, "stream")
    allocation = allocation_of(found, gpu_node.cluster.node_keys)
    check_view(view_of(gpu_node, ns, "stream", "app"), gpu_node.name, allocation, "app")

    # exec: a process started in the container sees the container's devices and env
    exec_view = ContainerView.parse(gpu_node.kubectl("exec", "-n", ns, "stream", "--", "/bin/sh", "-c",
                                                     report_script("true")).stdout)
    check_view(exec_view, gpu_node.name, allocation, "app")

    # attach: what we write reaches the container's stdin, its answer comes back
    attach = subprocess.Popen(
        [str(gpu_node.kubectl_path), "--kubeconfig", str(gpu_node.kubeconfig), "attach", "-i", "-n", ns,
         "stream", "-c", "app"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert attach.stdin is not None and attach.stdout is not None
        attach.stdin.write("hello-attach\n")
        attach.stdin.flush()
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline:
            line = attach.stdout.readline()
            seen.append(line)
            if "got hello-attach" in line:
                break
        assert any("got hello-attach" in line for line in seen), seen
    finally:
        attach.kill()
        attach.wait()

    # port-forward: kubectl -> apiserver -> kubelet -> shim (PortForward URL) -> containerd
    local = free_port()
    forward = subprocess.Popen(
        [str(gpu_node.kubectl_path), "--kubeconfig", str(gpu_node.kubeconfig), "port-forward", "-n", ns,
         "pod/stream", f"{local}:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert forward.stdout is not None
        assert "Forwarding from" in forward.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=20) as response:
            assert response.read().decode().strip() == f"kubegpu-{port}"
    finally:
        forward.kill()
        forward.wait()
    assert "got hello-attach" in gpu_node.kubectl("logs", "-n", ns, "stream").stdout


def restart_count(found: k8s.V1Pod, name: str) -> int:
    return next(s.restart_count for s in found.status.container_statuses if s.name == name)


def test_liveness_probe_and_crash_restarts_keep_the_devices(gpu_node: KubeNode, node_namespace: str) -> None:
    """An exec liveness probe runs through the shim; kubelet restarts a failing or crashing container
    with the same devices."""
    core, ns = gpu_node.core, node_namespace
    probe = {"exec": {"command": ["/bin/sh", "-c", "test ! -e /tmp/unhealthy"]},
             "periodSeconds": 1, "failureThreshold": 1, "initialDelaySeconds": 1}
    probed_app = container("app", 2, livenessProbe=probe)
    core.create_namespaced_pod(ns, pod("probed", [probed_app], gpu_node.selector))
    crashing_app = container("app", 1, then="sleep 1; exit 3")
    core.create_namespaced_pod(ns, pod("crash", [crashing_app], gpu_node.selector))
    probed = wait_running(core, ns, "probed")
    time.sleep(4)  # a few probe periods: a passing probe restarts nothing
    assert restart_count(core.read_namespaced_pod("probed", ns), "app") == 0
    gpu_node.kubectl("exec", "-n", ns, "probed", "--", "busybox", "touch", "/tmp/unhealthy")
    probed = wait_pod(core, ns, "probed", lambda p: restart_count(p, "app") >= 1 and running(p), "restarted")
    crash = wait_pod(core, ns, "crash", lambda p: restart_count(p, "app") >= 2, "restarted twice", 120)
    for name, found in (("probed", probed), ("crash", crash)):
        allocation = allocation_of(found, gpu_node.cluster.node_keys)
        check_view(view_of(gpu_node, ns, name, "app", previous=True), gpu_node.name, allocation, "app")
        found = wait_pod(core, ns, name, lambda p: any(s.state.running for s in p.status.container_statuses),
                         "running again", timeout=60)
        check_view(view_of(gpu_node, ns, name, "app"), gpu_node.name, allocation, "app")
    events = core.list_namespaced_event(ns, field_selector="involvedObject.name=probed").items
    assert any(e.reason == "Unhealthy" and "Liveness probe failed" in (e.message or "") for e in events)


def test_deleting_a_pod_frees_its_devices(gpu_node: KubeNode, node_namespace: str) -> None:
    core, ns = gpu_node.core, node_namespace
    core.create_namespaced_pod(ns, pod("first", [container("app", 8)], gpu_node.selector))
    first = allocation_of(wait_running(core, ns, "first"), gpu_node.cluster.node_keys)
    core.create_namespaced_pod(ns, pod("second", [container("app", 8)], gpu_node.selector))
    time.sleep(2)
    assert core.read_namespaced_pod("second", ns).spec.node_name is None  # waits: no GPU is free
    core.delete_namespaced_pod("first", ns, grace_period_seconds=1)
    second = allocation_of(wait_running(core, ns, "second", timeout=120), gpu_node.cluster.node_keys)
    assert sorted(second.containers["app"].devices) == sorted(first.containers["app"].devices)
    check_view(view_of(gpu_node, ns, "second", "app"), gpu_node.name, second, "app")


def test_a_pod_bypassing_the_scheduler_never_gets_a_device(gpu_node: KubeNode, node_namespace: str) -> None:
    """spec.nodeName set by hand: kubelet starts it, the shim refuses its GPU container, and
    `kubectl describe pod` says why."""
    core, ns = gpu_node.core, node_namespace
    body = pod("sneaky", [container("app", 1)], gpu_node.selector, node_name=gpu_node.name)
    core.create_namespaced_pod(ns, body)

    def refused(found: k8s.V1Pod) -> bool:
        statuses = found.status.container_statuses or []
        return any(s.state.waiting and s.state.waiting.reason == "CreateContainerError" for s in statuses)

    found = wait_pod(core, ns, "sneaky", refused, "refused by the shim")
    (status,) = found.status.container_statuses
    message = status.state.waiting.message
    assert "sneaky" in message and "allocation" in message, message  # the shim's reason
    assert not status.container_id and status.restart_count == 0  # nothing was ever created
    described = gpu_node.kubectl("describe", "pod", "-n", ns, "sneaky").stdout
    assert "CreateContainerError" in described
    assert message in described, described
    time.sleep(3)  # kubelet retries; the shim keeps refusing
    (status,) = core.read_namespaced_pod("sneaky", ns).status.container_statuses
    assert status.state.waiting and not status.state.running


def test_init_container_and_restartable_sidecar_with_gpus(gpu_node: KubeNode, node_namespace: str) -> None:
    core, ns = gpu_node.core, node_namespace
    init = container("init", 1, then="true")
    sidecar = container("sidecar", 1, restartPolicy="Always")
    body = pod("sidecars", [container("app", 1)], gpu_node.selector, init_containers=[init, sidecar])
    core.create_namespaced_pod(ns, body)
    bound = wait_pod(core, ns, "sidecars", lambda p: p.spec.node_name, "bound")
    allocation = allocation_of(bound, gpu_node.cluster.node_keys)
    assert set(allocation.containers) == {"init", "sidecar", "app"}, allocation
    wait_running(core, ns, "sidecars")
    for name in ("init", "sidecar", "app"):
        check_view(view_of(gpu_node, ns, "sidecars", name), gpu_node.name, allocation, name)


def test_controller_manager_runs_deployments_on_the_node(kube_node: KubeNode, node_namespace: str) -> None:
    """kube-controller-manager: Deployment -> ReplicaSet -> GPU pods (with ServiceAccount tokens and
    kube-root-ca.crt), scaling down frees the GPUs, deleting the Deployment garbage-collects the rest."""
    apps, core, ns = k8s.AppsV1Api(kube_node.admin_api), kube_node.core, node_namespace
    template = {"metadata": {"labels": {"app": "trainer"}},
                "spec": pod("unused", [container("app", 2)], kube_node.selector)["spec"]}
    apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainer"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "trainer"}}, "template": template},
    })

    def pods() -> list[k8s.V1Pod]:
        return core.list_namespaced_pod(ns, label_selector="app=trainer").items

    deadline = time.monotonic() + 120
    while not (len(found := pods()) == 2 and all(running(p) for p in found)):
        assert time.monotonic() < deadline, [p.status.phase for p in found]
        time.sleep(0.5)
    granted = set()
    for replica in found:
        allocation = allocation_of(replica, kube_node.cluster.node_keys)
        granted |= set(allocation.containers["app"].devices)
        ca = kube_node.kubectl("exec", "-n", ns, replica.metadata.name, "--", "cat",
                               "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt").stdout
        assert "BEGIN CERTIFICATE" in ca  # kube-root-ca.crt, projected with the token
    assert len(granted) == 4
    apps.patch_namespaced_deployment_scale("trainer", ns, {"spec": {"replicas": 0}})
    deadline = time.monotonic() + 120
    while pods():
        assert time.monotonic() < deadline
        time.sleep(0.5)
    core.create_namespaced_pod(ns, pod("all", [container("app", 8)], kube_node.selector))
    wait_running(core, ns, "all")  # every GPU is free again
    apps.delete_namespaced_deployment("trainer", ns)
    deadline = time.monotonic() + 60
    while apps.list_namespaced_replica_set(ns).items:  # the garbage collector removes the ReplicaSet
        assert time.monotonic() < deadline
        time.sleep(0.5)
    # kubelet's heartbeat Lease, which the node lifecycle controller watches (kubelet creates it
    # on its second 10 s renewal round, once its Node exists to own it)
    leases = k8s.CoordinationV1Api(kube_node.admin_api)
    deadline = time.monotonic() + 30
    while True:
        try:
            lease = leases.read_namespaced_lease(kube_node.name, "kube-node-lease")
            break
        except k8s.ApiException as exc:
            assert exc.status == 404 and time.monotonic() < deadline
            time.sleep(1)
    assert lease.spec.holder_identity == kube_node.name


def test_kubelet_has_only_a_nodes_rights(kube_node: KubeNode) -> None:
    """Node authorizer and NodeRestriction: kubelet's certificate may write its own Node, not another
    one, and may not read Secrets its pods do not use."""
    from kubernetes.config import new_client_from_config

    assert kube_node.node.kubelet is not None
    other = f"other-{kube_node.name}"
    kube_node.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": other}})
    try:
        with new_client_from_config(config_file=str(kube_node.node.kubelet.kubeconfig)) as api:
            core = k8s.CoreV1Api(api)
            label = {"metadata": {"labels": {"kubegpu.io/e2e-touched": "yes"}}}
            core.patch_node(kube_node.name, label)  # its own Node: allowed
            third = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"third-{kube_node.name}"}}
            for attempt in (lambda: core.patch_node(other, label),
                            lambda: core.delete_node(other),
                            lambda: core.create_node(third),
                            lambda: core.list_namespaced_secret("kubegpu-system")):
                with pytest.raises(k8s.ApiException) as denied:
                    attempt()
                assert denied.value.status == 403, denied.value.body
    finally:
        kube_node.core.delete_node(other)
