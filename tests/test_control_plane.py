"""The real control plane (etcd, kube-apiserver, kube-scheduler) does what kubegpu relies on.

Node annotations and extended-resource capacity, Binding annotations copied onto the pod,
watches from a resourceVersion, optimistic concurrency (409), ServiceAccount RBAC and a real
kube-scheduler binding a pod to a fake Ready node (there is no kubelet).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from kubegpu.devenv.controlplane import MERGE_PATCH, create_fake_node

pytestmark = pytest.mark.apiserver

# No scheduler serves this name, so pods using it stay unbound until a test binds them.
NO_SCHEDULER = "kubegpu-test-unscheduled"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pod_manifest(name: str, scheduler_name: str = NO_SCHEDULER, **spec: Any) -> k8s.V1Pod:
    container = k8s.V1Container(
        name="main",
        image="registry.kubegpu.test/busybox:1.0",
        resources=k8s.V1ResourceRequirements(requests={"cpu": "100m", "memory": "16Mi"}),
    )
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(containers=[container], scheduler_name=scheduler_name, **spec),
    )


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def test_node_annotations_and_extended_resource_capacity(admin_api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = unique("gpu-node")
    core.create_node(k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name)))

    patch = {"metadata": {"annotations": {"kubegpu.io/topology": "nvlink:0-1"}}}
    core.patch_node(name, patch, _content_type=MERGE_PATCH)
    gpus = {"nvidia.com/gpu": "4"}
    status = {"status": {"capacity": gpus, "allocatable": gpus}}
    core.patch_node_status(name, status, _content_type=MERGE_PATCH)

    node = core.read_node(name)
    assert node.metadata.annotations["kubegpu.io/topology"] == "nvlink:0-1"
    assert node.status.capacity["nvidia.com/gpu"] == "4"
    assert node.status.allocatable["nvidia.com/gpu"] == "4"


def test_binding_annotations_are_copied_to_the_pod(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(admin_api)
    name, node = unique("pod"), unique("node")
    core.create_namespaced_pod(kube_namespace, pod_manifest(name))

    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name=name, annotations={"kubegpu.io/devices": "gpu0,gpu1"}),
        target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    # The apiserver answers a Binding with a Status, which the client cannot decode as a
    # V1Binding: read the raw response instead.
    response = core.create_namespaced_pod_binding(
        name, kube_namespace, binding, _preload_content=False
    )
    assert response.status == 201

    pod = core.read_namespaced_pod(name, kube_namespace)
    assert pod.spec.node_name == node
    assert pod.metadata.annotations["kubegpu.io/devices"] == "gpu0,gpu1"


def test_watch_from_resource_version_sees_add_modify_delete(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(admin_api)
    start = core.list_namespaced_pod(kube_namespace).metadata.resource_version
    name = unique("watched")
    core.create_namespaced_pod(kube_namespace, pod_manifest(name))
    core.patch_namespaced_pod(
        name, kube_namespace, {"metadata": {"labels": {"step": "2"}}}, _content_type=MERGE_PATCH
    )
    core.delete_namespaced_pod(name, kube_namespace, grace_period_seconds=0)

    events: list[tuple[str, dict[str, str]]] = []
    watcher = watch.Watch()
    for event in watcher.stream(
        core.list_namespaced_pod, kube_namespace, resource_version=start, timeout_seconds=20
    ):
        obj = event["object"]
        events.append((event["type"], dict(obj.metadata.labels or {})))
        if event["type"] == "DELETED":
            watcher.stop()

    kinds = [kind for kind, _ in events]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED", kinds
    assert ("MODIFIED", {"step": "2"}) in events, events


def test_update_with_stale_resource_version_is_a_conflict(
    admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = unique("cm")
    body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"v": "1"})
    stale = core.create_namespaced_config_map(kube_namespace, body)

    fresh = core.read_namespaced_config_map(name, kube_namespace)
    fresh.data = {"v": "2"}
    core.replace_namespaced_config_map(name, kube_namespace, fresh)

    stale.data = {"v": "3"}
    with pytest.raises(k8s.ApiException) as caught:
        core.replace_namespaced_config_map(name, kube_namespace, stale)
    assert caught.value.status == 409
    assert core.read_namespaced_config_map(name, kube_namespace).data == {"v": "2"}


def test_service_account_needs_rbac(
    admin_api: k8s.ApiClient,
    kube_namespace: str,
    service_account_client: Callable[[str, str], k8s.ApiClient],
) -> None:
    reader = k8s.CoreV1Api(service_account_client(kube_namespace, "reader"))
    with pytest.raises(k8s.ApiException) as caught:
        reader.list_namespaced_pod(kube_namespace)
    assert caught.value.status == 403

    grant_pod_reader(k8s.RbacAuthorizationV1Api(admin_api), kube_namespace, "reader")

    def can_list() -> bool:
        try:
            reader.list_namespaced_pod(kube_namespace)
        except k8s.ApiException as exc:
            if exc.status != 403:
                raise
            return False
        return True

    wait_for(can_list, 30, "the RoleBinding to take effect")
    with pytest.raises(k8s.ApiException) as elsewhere:
        reader.list_namespaced_pod("default")
    assert elsewhere.value.status == 403


def grant_pod_reader(rbac: k8s.RbacAuthorizationV1Api, namespace: str, account: str) -> None:
    """Role allowing get/list/watch on pods, bound to ServiceAccount ``account``."""
    rule = k8s.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list", "watch"])
    rbac.create_namespaced_role(
        namespace, k8s.V1Role(metadata=k8s.V1ObjectMeta(name="pod-reader"), rules=[rule])
    )
    binding = k8s.V1RoleBinding(
        metadata=k8s.V1ObjectMeta(name="pod-reader"),
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                               name="pod-reader"),
        subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=account, namespace=namespace)],
    )
    rbac.create_namespaced_role_binding(namespace, binding)


def test_kube_scheduler_binds_a_pod_to_a_ready_node(
    admin_api: k8s.ApiClient, kube_namespace: str, kube_scheduler: Callable[..., Any]
) -> None:
    core = k8s.CoreV1Api(admin_api)
    node, marker = unique("ready-node"), {"kubegpu.io/test-node": kube_namespace}
    create_fake_node(core, node, labels=marker)
    kube_scheduler({"profiles": [{"schedulerName": "default-scheduler"}]})

    name = unique("plain")
    pod = pod_manifest(name, scheduler_name="default-scheduler", node_selector=marker)
    core.create_namespaced_pod(kube_namespace, pod)

    def bound_node() -> str | None:
        return core.read_namespaced_pod(name, kube_namespace).spec.node_name

    assert wait_for(bound_node, 60, f"pod {name} to be scheduled") == node
