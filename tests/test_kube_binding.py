"""``kubegpu.kube.BindingCoreV1Api``'s lean ``create_namespaced_pod_binding`` (the scheduler's
Binding) against the real kube-apiserver: it binds as the generated method does, and fails as it
does (the same ApiException status, reason and body for a missing pod, 404, and a bound one, 409;
the same exception for a server that does not answer in time), which the scheduler's Binding
outcome handling relies on."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from kubegpu.kube import BindingCoreV1Api
from scheduler.live.scheduler import drain
from tests.test_control_plane import pod_manifest

pytestmark = pytest.mark.apiserver


def binding(name: str, namespace: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace, "annotations": {"kubegpu.io/x": "1"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def refusal(call: Callable[[], object]) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


def generated(core: k8s.CoreV1Api, name: str, namespace: str, body: dict[str, Any]) -> Callable[[], object]:
    return lambda: core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)


def post(api: k8s.ApiClient, name: str, namespace: str, body: Any, timeout: float = 5.0) -> None:
    """Bind as the scheduler does: the response unparsed, then read and released."""
    create = BindingCoreV1Api(api).create_namespaced_pod_binding
    drain(create(name, namespace, body, _preload_content=False, _request_timeout=timeout))


def lean(api: k8s.ApiClient, name: str, namespace: str, body: dict[str, Any]) -> Callable[[], object]:
    return lambda: post(api, name, namespace, body)


def same_refusal(ours: ApiException, theirs: ApiException) -> None:
    assert (ours.status, ours.reason, type(ours)) == (theirs.status, theirs.reason, type(theirs))
    assert json.loads(ours.body) == json.loads(theirs.body)


def test_binds_the_pod_with_the_annotations(admin_api: k8s.ApiClient, kube_namespace: str) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = f"lean-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(kube_namespace, pod_manifest(name))
    post(admin_api, name, kube_namespace, binding(name, kube_namespace, "node-a"))
    pod = core.read_namespaced_pod(name, kube_namespace)
    assert pod.spec.node_name == "node-a"
    assert pod.metadata.annotations["kubegpu.io/x"] == "1"


def test_a_model_binding_takes_the_generated_path(admin_api: k8s.ApiClient, kube_namespace: str) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = f"lean-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(kube_namespace, pod_manifest(name))
    body = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name=name), target=k8s.V1ObjectReference(kind="Node", name="node-c")
    )
    post(admin_api, name, kube_namespace, body)
    assert core.read_namespaced_pod(name, kube_namespace).spec.node_name == "node-c"


def test_missing_pod_is_404_as_the_generated_call(admin_api: k8s.ApiClient, kube_namespace: str) -> None:
    core = k8s.CoreV1Api(admin_api)
    body = binding("absent", kube_namespace, "node-a")
    ours = refusal(lean(admin_api, "absent", kube_namespace, body))
    assert ours.status == 404
    same_refusal(ours, refusal(generated(core, "absent", kube_namespace, body)))


def test_bound_pod_is_409_as_the_generated_call(admin_api: k8s.ApiClient, kube_namespace: str) -> None:
    core = k8s.CoreV1Api(admin_api)
    name = f"lean-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_pod(kube_namespace, pod_manifest(name))
    post(admin_api, name, kube_namespace, binding(name, kube_namespace, "node-a"))
    body = binding(name, kube_namespace, "node-b")
    ours = refusal(lean(admin_api, name, kube_namespace, body))
    assert ours.status == 409
    same_refusal(ours, refusal(generated(core, name, kube_namespace, body)))
    # the connection went back to the pool after each refusal: the next call still works
    assert core.read_namespaced_pod(name, kube_namespace).spec.node_name == "node-a"


@pytest.fixture
def silent_server() -> Iterator[str]:
    """An HTTP endpoint that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(2)
    for conn in held:
        conn.close()
    listener.close()


def test_timeout_raises_as_the_generated_call(silent_server: str) -> None:
    configuration = k8s.Configuration()
    configuration.host = silent_server
    configuration.retries = False
    api = k8s.ApiClient(configuration)
    body = binding("p", "ns", "node-a")
    errors = []
    for call in (
        lambda: post(api, "p", "ns", body, 0.3),
        lambda: k8s.CoreV1Api(api).create_namespaced_pod_binding(
            "p", "ns", body, _preload_content=False, _request_timeout=0.3
        ),
    ):
        with pytest.raises(Exception) as caught:  # noqa: PT011 - the type is what is compared
            call()
        errors.append(caught.value)
    assert not isinstance(errors[0], ApiException)
    assert type(errors[0]) is type(errors[1])
