"""``kubegpu.kube.BindingCoreV1Api``'s lean ``create_namespaced_pod_binding`` (the scheduler's
Binding) against the real kube-apiserver: it binds as the generated method does, and fails as it
does (the same ApiException status, reason and body for a missing pod, 404, and a bound one, 409;
the same exception for a server that does not answer in time), which the scheduler's Binding
outcome handling relies on."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from kubegpu.kube import BindingCoreV1Api
from scheduler.live.scheduler import drain
from tests.support.rawhttp import ScriptedHTTPServer
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
    """A server that never answers: like the generated call's, the error is no ApiException (the
    scheduler's "maybe stored" branch: it reads the pod back), raised after the read timeout, and
    the connection is not kept: the next Binding opens a new one."""
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
        started = time.monotonic()
        with pytest.raises(Exception) as caught:  # noqa: PT011 - the type is what is compared
            call()
        assert time.monotonic() - started < 5
        errors.append(caught.value)
    assert not isinstance(errors[0], ApiException) and not isinstance(errors[1], ApiException)
    assert isinstance(errors[0], TimeoutError)  # the socket's; urllib3 wraps it in ReadTimeoutError
    pool = api.rest_client.pool_manager.connection_from_url(silent_server)
    assert all(conn is None or conn.sock is None for conn in list(pool.pool.queue))


def test_binds_reuse_one_pooled_connection(admin_api: k8s.ApiClient, kube_namespace: str) -> None:
    """The Binding goes through the URL's own pool of the client's PoolManager: one connection,
    kept alive, carries binds, refusals and the client's other calls."""
    core = k8s.CoreV1Api(admin_api)
    names = [f"lean-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    for name in names:
        core.create_namespaced_pod(kube_namespace, pod_manifest(name))
    pool = admin_api.rest_client.pool_manager.connection_from_url(admin_api.configuration.host)
    opened = pool.num_connections
    for name in names:
        post(admin_api, name, kube_namespace, binding(name, kube_namespace, "node-a"))
        refusal(lean(admin_api, name, kube_namespace, binding(name, kube_namespace, "node-b")))  # 409
    assert pool.num_connections - opened <= 1
    assert {core.read_namespaced_pod(n, kube_namespace).spec.node_name for n in names} == {"node-a"}


@pytest.fixture
def recorder() -> Iterator[ScriptedHTTPServer]:
    server = ScriptedHTTPServer()
    yield server
    server.close()


def _client(host: str, proxy: str | None = None) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = host
    configuration.api_key = {"BearerToken": "Bearer t0ken"}
    if proxy is not None:
        configuration.proxy = proxy
    return k8s.ApiClient(configuration)


@pytest.mark.parametrize("prefix", ["", "/k8s/clusters/c-1"])
def test_the_request_on_the_wire_is_the_generated_calls(recorder: ScriptedHTTPServer, prefix: str) -> None:
    """Request line (a server URL with a path keeps it), body and headers (auth, Accept, the
    client's defaults) as the generated method sends them."""
    api = _client(recorder.url + prefix)
    body = binding("p", "ns", "node-a")
    post(api, "p", "ns", body)
    k8s.CoreV1Api(api).create_namespaced_pod_binding("p", "ns", body, _preload_content=False).release_conn()
    (line, headers, sent), (their_line, their_headers, their_sent) = recorder.requests
    assert line == their_line == f"POST {prefix}/api/v1/namespaces/ns/pods/p/binding HTTP/1.1"
    assert json.loads(sent) == json.loads(their_sent) == body
    assert headers["authorization"] == "Bearer t0ken"
    ignore = {"content-type"}  # the generated method names it; the client's REST layer does not
    assert {k: v for k, v in headers.items() if k not in ignore} == {
        k: v for k, v in their_headers.items() if k not in ignore
    }


def test_an_ipv6_server_shares_the_rest_layers_pool() -> None:
    """An API server at an IPv6 address: the Binding went to a pool of its own (the pool
    manager keys the REST layer's pool by ``[::1]``, urlsplit's hostname is ``::1``), a second
    set of connections (and TLS handshakes) beside the client's. One pool, one connection."""
    try:
        server = ScriptedHTTPServer(host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    try:
        api = _client(server.url)
        body = binding("p", "ns", "node-a")
        post(api, "p", "ns", body)
        post(api, "p", "ns", body)
        theirs = api.rest_client.pool_manager.connection_from_url(server.url)  # the REST layer's
        assert len(api.rest_client.pool_manager.pools) == 1 and theirs.num_connections == 1
        ((line, headers, _), _) = server.requests
        assert line == "POST /api/v1/namespaces/ns/pods/p/binding HTTP/1.1"
        assert headers["host"] == server.url.removeprefix("http://")
    finally:
        server.close()


def test_a_client_behind_a_proxy_takes_the_rest_layers_path(recorder: ScriptedHTTPServer) -> None:
    """With a proxy the pool manager is a ProxyManager: the Binding goes through it (absolute
    URL to the proxy), not to a pool of its own."""
    api = _client("http://apiserver.invalid:6443", proxy=recorder.url)
    post(api, "p", "ns", binding("p", "ns", "node-a"))
    ((line, _, _),) = recorder.requests
    assert line == "POST http://apiserver.invalid:6443/api/v1/namespaces/ns/pods/p/binding HTTP/1.1"


def test_an_untrusted_server_fails_as_the_generated_call(admin_api: k8s.ApiClient) -> None:
    """TLS verification failing (no CA for the apiserver's certificate): the same exception."""
    configuration = k8s.Configuration()
    configuration.host = admin_api.configuration.host
    configuration.retries = False
    api = k8s.ApiClient(configuration)
    body = binding("p", "ns", "node-a")
    errors = []
    for call in (lambda: post(api, "p", "ns", body), generated(k8s.CoreV1Api(api), "p", "ns", body)):
        with pytest.raises(Exception) as caught:  # noqa: PT011 - the type is what is compared
            call()
        errors.append(caught.value)
    assert type(errors[0]) is type(errors[1])
    assert "CERTIFICATE_VERIFY_FAILED" in str(errors[0]) and "CERTIFICATE_VERIFY_FAILED" in str(errors[1])
