"""deploy/ against the real apiserver: the manifests are accepted, and the RBAC is just enough.

The manifests are applied with the admin client (server-side apply). The Deployment never runs
(there is no kubelet), but the apiserver validates it, and a dry-run Pod from its template
passes the namespace's ``restricted`` Pod Security level. Then the tests act as each
ServiceAccount:

- ``kubegpu-system/kubegpu-scheduler`` can do all the scheduler does (list and watch pods and
  nodes, bind with annotations, events through both APIs, the PodScheduled condition, its Lease
  through :class:`LeaderElector`) and nothing else: secrets, pod create/delete, node writes and
  other Leases are forbidden, and its effective rules are exactly the expected ones;
- ``kubegpu-system/kubegpu-node`` can read and patch nodes and their status and read pods, and
  nothing else.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes import client as k8s

from crishim.gpumetrics import GpuRow
from crishim.metricspublisher import MetricsPublisher
from crishim.nrtpublisher import NrtUnavailable, TopologyPublisher
from crishim.podlookup import NodePodCache
from devices.model import Device, DeviceKind, NodeInventory
from devices.telemetry import GpuTelemetry
from kubegpu.allocation import parse_key, private_key_pem, public_key_pem
from kubegpu.devenv.controlplane import MERGE_PATCH, create_fake_node
from kubegpu.devenv.manifests import (
    apply_manifests,
    apply_object,
    iter_objects,
    load_documents,
    manifest_files,
)
from kubegpu.nrt import NumaNode
from scheduler.live.leader import LeaderElector

pytestmark = pytest.mark.apiserver

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SECRET_TEMPLATE = DEPLOY / "allocation-keys.secret.yaml.template"
PUBLIC_KEYS_TEMPLATE = DEPLOY / "allocation-public-keys.configmap.yaml.template"
NAMESPACE = "kubegpu-system"
SCHEDULER, NODE_AGENT = "kubegpu-scheduler", "kubegpu-node"
LEASE = "kubegpu-scheduler"
NO_SCHEDULER = "kubegpu-test-unscheduled"

ClientFactory = Callable[[str, str], k8s.ApiClient]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def status_of(call: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """HTTP status of an API call: 200 when it succeeds, else the ApiException's status."""
    try:
        call(*args, **kwargs)
    except k8s.ApiException as exc:
        return int(exc.status)
    return 200


def rendered(template: Path, placeholder: str, content: bytes) -> str:
    """A key template with its placeholder replaced by ``content`` (base64, as the apiserver wants)."""
    text = template.read_text()
    assert f'"{placeholder}"' in text
    return text.replace(f'"{placeholder}"', base64.b64encode(content).decode())


SIGNING_KEY = Ed25519PrivateKey.generate()


@pytest.fixture(scope="module")
def deployed(admin_api: k8s.ApiClient, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """deploy/ applied (twice: it must be idempotent), plus the Secret from its template."""
    apply_manifests(admin_api, [DEPLOY])
    applied = apply_manifests(admin_api, [DEPLOY])
    out = tmp_path_factory.mktemp("deploy")
    secret, public = out / "allocation-keys.secret.yaml", out / "allocation-public-keys.yaml"
    private_placeholder = "<BASE64 OF THE PEM PKCS8 ED25519 PRIVATE KEY>"
    secret.write_text(rendered(SECRET_TEMPLATE, private_placeholder, private_key_pem(SIGNING_KEY)))
    public.write_text(
        rendered(PUBLIC_KEYS_TEMPLATE, "<BASE64 OF THE PEM ED25519 PUBLIC KEY>", public_key_pem(SIGNING_KEY))
    )
    applied += apply_manifests(admin_api, [secret, public])
    return applied


def wait_allowed(api: k8s.ApiClient, attrs: dict[str, str], timeout: float = 30) -> None:
    """Wait until RBAC (an informer cache in the apiserver) has caught up with the bindings."""
    deadline = time.monotonic() + timeout
    while not allowed(api, **attrs):
        assert time.monotonic() < deadline, f"never allowed: {attrs}"
        time.sleep(0.2)


def allowed(api: k8s.ApiClient, **attrs: str) -> bool:
    """SelfSubjectAccessReview: may this client do ``attrs`` (verb, resource, namespace, ...)?"""
    review = k8s.V1SelfSubjectAccessReview(
        spec=k8s.V1SelfSubjectAccessReviewSpec(resource_attributes=k8s.V1ResourceAttributes(**attrs))
    )
    return bool(k8s.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed)


Rules = set[tuple[str, str, str, str]]


def effective_rules(api: k8s.ApiClient, namespace: str) -> Rules:
    """(group, resource, verb, resourceName or '*') this client may use in ``namespace``."""
    review = k8s.V1SelfSubjectRulesReview(spec=k8s.V1SelfSubjectRulesReviewSpec(namespace=namespace))
    status = k8s.AuthorizationV1Api(api).create_self_subject_rules_review(review).status
    assert not status.incomplete, status.evaluation_error
    rules = set()
    for rule in status.resource_rules:
        for group in rule.api_groups or [""]:
            for resource in rule.resources or []:
                for verb in rule.verbs:
                    for name in rule.resource_names or ["*"]:
                        rules.add((group, resource, verb, name))
    return rules


def expand(group: str, resources: list[str], verbs: list[str], name: str = "*") -> Rules:
    return {(group, resource, verb, name) for resource in resources for verb in verbs}


SCHEDULER_CLUSTER_RULES = (
    expand("", ["pods"], ["get", "list", "watch"])
    | expand("", ["pods/binding"], ["create"])
    | expand("", ["pods/status"], ["patch", "update"])
    | expand("", ["pods/eviction"], ["create"])
    | expand("policy", ["poddisruptionbudgets"], ["list", "watch"])
    | expand("", ["namespaces"], ["list", "watch"])
    | expand("", ["nodes"], ["get", "list", "watch"])
    | expand("", ["events"], ["create", "patch"])
    | expand("events.k8s.io", ["events"], ["create", "patch"])
    | expand("scheduling.x-k8s.io", ["podgroups"], ["get", "list", "watch"])
    | expand("scheduling.k8s.io", ["podgroups"], ["get", "list", "watch"])
    | expand("scheduling.x-k8s.io", ["podgroups/status"], ["patch", "update"])
    | expand("scheduling.k8s.io", ["podgroups/status"], ["patch", "update"])
    | expand("kubegpu.io", ["nodegpumetrics"], ["list", "watch"])
)
SCHEDULER_LEASE_RULES = expand("coordination.k8s.io", ["leases"], ["create"]) | expand(
    "coordination.k8s.io", ["leases"], ["get", "update"], LEASE
)
NODE_RULES = (
    expand("", ["nodes"], ["get", "patch"])
    | expand("", ["nodes/status"], ["patch"])
    | expand("", ["pods"], ["get", "list", "watch"])
    | expand("kubegpu.io", ["nodegpumetrics"], ["create", "patch"])
    | expand("topology.node.k8s.io", ["noderesourcetopologies"], ["get", "create", "patch"])
)


@pytest.fixture
def granted(
    service_account_client: ClientFactory, kube_namespace: str
) -> Callable[[k8s.ApiClient, str], Rules]:
    """``(client, namespace) -> rules`` beyond what every ServiceAccount may do.

    Every authenticated user gets some rules from the bootstrap policy (self-subject reviews,
    reading ClusterTrustBundles, ...): they are measured on a ServiceAccount with no binding
    and taken away, so what remains is what kubegpu's roles grant.
    """
    nobody = service_account_client(kube_namespace, "nobody")

    def rules(api: k8s.ApiClient, namespace: str) -> Rules:
        return effective_rules(api, namespace) - effective_rules(nobody, namespace)

    return rules


@pytest.fixture
def scheduler_api(deployed: list[Any], service_account_client: ClientFactory) -> k8s.ApiClient:
    api = service_account_client(NAMESPACE, SCHEDULER)
    wait_allowed(
        api,
        {
            "verb": "get",
            "resource": "leases",
            "group": "coordination.k8s.io",
            "namespace": NAMESPACE,
            "name": LEASE,
        },
    )
    wait_allowed(
        api, {"verb": "create", "resource": "pods", "subresource": "binding", "namespace": "default"}
    )
    return api


@pytest.fixture
def node_api(deployed: list[Any], service_account_client: ClientFactory) -> k8s.ApiClient:
    api = service_account_client(NAMESPACE, NODE_AGENT)
    wait_allowed(api, {"verb": "patch", "resource": "nodes", "subresource": "status"})
    return api


@pytest.fixture
def pending_pod(admin_api: k8s.ApiClient, kube_namespace: str) -> Iterator[str]:
    """A pod in the test namespace that no scheduler serves (stays pending)."""
    name = unique("pending")
    container = k8s.V1Container(name="main", image="registry.kubegpu.test/busybox:1.0")
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name),
        spec=k8s.V1PodSpec(containers=[container], scheduler_name=NO_SCHEDULER),
    )
    k8s.CoreV1Api(admin_api).create_namespaced_pod(kube_namespace, pod)
    yield name


# --------------------------------------------------------------------------- the manifests


def test_the_manifests_are_accepted(deployed: list[Any], admin_api: k8s.ApiClient) -> None:
    kinds = sorted((a.kind, a.namespace or "", a.name) for a in deployed)
    assert kinds == sorted(
        [
            ("Namespace", "", NAMESPACE),
            ("ServiceAccount", NAMESPACE, SCHEDULER),
            ("ClusterRole", "", SCHEDULER),
            ("ClusterRoleBinding", "", SCHEDULER),
            ("Role", NAMESPACE, "kubegpu-scheduler-leader"),
            ("RoleBinding", NAMESPACE, "kubegpu-scheduler-leader"),
            ("ServiceAccount", NAMESPACE, NODE_AGENT),
            ("ClusterRole", "", NODE_AGENT),
            ("ClusterRoleBinding", "", NODE_AGENT),
            ("ConfigMap", NAMESPACE, "kubegpu-scheduler-config"),
            ("Lease", NAMESPACE, "kubegpu-scheduler"),
            ("Deployment", NAMESPACE, SCHEDULER),
            ("PodDisruptionBudget", NAMESPACE, SCHEDULER),
            ("Secret", NAMESPACE, "kubegpu-allocation-keys"),
            ("ConfigMap", NAMESPACE, "kubegpu-allocation-public-keys"),
        ]
    )
    deployment = k8s.AppsV1Api(admin_api).read_namespaced_deployment(SCHEDULER, NAMESPACE)
    assert deployment.spec.replicas == 2
    container = deployment.spec.template.spec.containers[0]
    assert container.command == [
        "kubegpu", "scheduler", "--config", "/etc/kubegpu/scheduler.yaml", "--identity", "$(POD_NAME)"
    ]
    assert container.security_context.read_only_root_filesystem is True
    mounts = {m.mount_path: m for m in container.volume_mounts}
    assert mounts["/etc/kubegpu/keys"].read_only is True
    core = k8s.CoreV1Api(admin_api)
    secret = core.read_namespaced_secret("kubegpu-allocation-keys", NAMESPACE)
    assert secret.type == "Opaque"
    signer = parse_key(base64.b64decode(secret.data["k1"]))  # what the scheduler reads from its mount
    public = core.read_namespaced_config_map("kubegpu-allocation-public-keys", NAMESPACE)
    verifier = parse_key(base64.b64decode(public.binary_data["k1"]))  # what a node copies
    assert isinstance(signer, Ed25519PrivateKey) and verifier == signer.public_key()


def test_the_scheduler_pod_template_passes_restricted_pod_security(
    deployed: list[Any], admin_api: k8s.ApiClient
) -> None:
    deployment = next(a.body for a in deployed if a.kind == "Deployment")
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": unique("template-check"),
            "namespace": NAMESPACE,
            "labels": template["metadata"]["labels"],
        },
        "spec": template["spec"],
    }
    # dryRun=All runs validation and admission (Pod Security "restricted" on the namespace),
    # and stores nothing.
    checked = apply_object(admin_api, pod, dry_run=True).body
    assert checked["spec"]["serviceAccountName"] == SCHEDULER
    assert k8s.CoreV1Api(admin_api).list_namespaced_pod(NAMESPACE).items == []


@pytest.mark.parametrize("template", [SECRET_TEMPLATE, PUBLIC_KEYS_TEMPLATE], ids=["private", "public"])
def test_the_key_templates_are_not_applied_with_their_placeholders(
    admin_api: k8s.ApiClient, tmp_path: Path, template: Path
) -> None:
    assert template not in manifest_files([DEPLOY])  # `kubectl apply -f deploy/` skips it
    raw = tmp_path / "as-shipped.yaml"
    raw.write_text(template.read_text())
    with pytest.raises(k8s.ApiException) as caught:
        apply_manifests(admin_api, [raw], dry_run=True)
    # kubectl apply (client side) gets 400; server-side apply reports the decode failure as 500.
    assert caught.value.status in (400, 422, 500) and "illegal base64" in caught.value.body


def test_the_config_file_matches_the_rest_of_deploy(tmp_path: Path) -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in iter_objects([DEPLOY])}
    text = objects[("ConfigMap", "kubegpu-scheduler-config")]["data"]["scheduler.yaml"]
    config = yaml.safe_load(text)
    assert config == {
        "schedulerName": "kubegpu",
        "gpuResource": "nvidia.com/gpu",
        "signingKeyId": "k1",
        "keysDir": "/etc/kubegpu/keys",
        "leaderElection": {"enabled": True, "namespace": NAMESPACE, "leaseName": LEASE},
        "heartbeatStaleSeconds": 120,
        "metricsAddress": "0.0.0.0:9465",
        "policy": "topology",
    }
    role = objects[("Role", "kubegpu-scheduler-leader")]
    assert [r.get("resourceNames") for r in role["rules"]] == [None, [LEASE]]
    container = objects[("Deployment", SCHEDULER)]["spec"]["template"]["spec"]["containers"][0]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {
        config["keysDir"],
        "/etc/kubegpu/scheduler.yaml",
    }
    assert container["ports"][0]["containerPort"] == int(config["metricsAddress"].rsplit(":", 1)[1])
    loader = pytest.importorskip("scheduler.live.config")  # the scheduler reads it as it is shipped
    path = tmp_path / "scheduler.yaml"
    path.write_text(text)
    loaded = loader.load_config(path)
    assert loaded.leader_election.enabled and loaded.leader_election.lease_name == LEASE


def test_load_documents_expands_lists_and_skips_empty_ones() -> None:
    text = (
        "---\n# comment only\n---\nkind: ConfigMapList\napiVersion: v1\nitems:\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n"
    )
    assert [o["metadata"]["name"] for o in load_documents(text)] == ["a"]


# --------------------------------------------------------------------------- the scheduler's identity


def test_scheduler_may_do_what_it_needs(
    scheduler_api: k8s.ApiClient, admin_api: k8s.ApiClient, kube_namespace: str, pending_pod: str
) -> None:
    core = k8s.CoreV1Api(scheduler_api)
    node = unique("gpu-node")
    create_fake_node(k8s.CoreV1Api(admin_api), node, capacity={"nvidia.com/gpu": "8"})

    assert any(n.metadata.name == node for n in core.list_node().items)
    assert core.read_node(node).status.capacity["nvidia.com/gpu"] == "8"
    assert pending_pod in {p.metadata.name for p in core.list_pod_for_all_namespaces().items}
    policy = k8s.PolicyV1Api(scheduler_api)
    for watch_call in (
        core.list_pod_for_all_namespaces,
        core.list_node,
        core.list_namespace,
        policy.list_pod_disruption_budget_for_all_namespaces,
    ):
        response = watch_call(watch=True, timeout_seconds=1, _preload_content=False)
        assert response.status == 200
        response.release_conn()
    assert kube_namespace in {n.metadata.name for n in core.list_namespace().items}
    assert policy.list_pod_disruption_budget_for_all_namespaces().items is not None

    # PodScheduled=False for a pod it cannot place (status subresource, strategic merge on type).
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/1 nodes have a free GPU",
    }
    core.patch_namespaced_pod_status(pending_pod, kube_namespace, {"status": {"conditions": [condition]}})
    conditions = core.read_namespaced_pod(pending_pod, kube_namespace).status.conditions
    assert [(c.type, c.reason) for c in conditions] == [("PodScheduled", "Unschedulable")]

    # Preemption: nominate the node its victims free (only a pod not bound yet may be nominated).
    core.patch_namespaced_pod_status(pending_pod, kube_namespace, {"status": {"nominatedNodeName": node}})
    assert core.read_namespaced_pod(pending_pod, kube_namespace).status.nominated_node_name == node

    # Bind, with the allocation annotation riding on the Binding.
    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name=pending_pod, annotations={"kubegpu.io/allocation": "{}"}),
        target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    response = core.create_namespaced_pod_binding(
        pending_pod, kube_namespace, binding, _preload_content=False
    )
    assert response.status == 201
    pod = core.read_namespaced_pod(pending_pod, kube_namespace)
    assert pod.spec.node_name == node and pod.metadata.annotations["kubegpu.io/allocation"] == "{}"

    # Preemption: evict a pod through the Eviction API.
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pending_pod}}
    response = core.create_namespaced_pod_eviction(
        pending_pod, kube_namespace, eviction, _preload_content=False
    )
    assert response.status == 201
    assert core.read_namespaced_pod(pending_pod, kube_namespace).metadata.deletion_timestamp is not None


def test_scheduler_may_read_pod_groups_and_keep_their_status(
    scheduler_api: k8s.ApiClient, admin_api: k8s.ApiClient, kube_namespace: str
) -> None:
    """scheduler-plugins' PodGroup (the CRD of deploy/crds/): the scheduler lists and watches the
    groups and patches their status, and may not change a group's spec or delete it."""
    apply_manifests(admin_api, [DEPLOY / "crds"])
    group, version, plural = "scheduling.x-k8s.io", "v1alpha1", "podgroups"
    body = {"apiVersion": f"{group}/{version}", "kind": "PodGroup", "metadata": {"name": "pg"},
            "spec": {"minMember": 2}}
    admin = k8s.CustomObjectsApi(admin_api)
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.create_namespaced_custom_object(group, version, kube_namespace, plural, body)
            break
        except k8s.ApiException as error:  # the CRD is not served yet
            assert error.status == 404 and time.monotonic() < deadline, error
            time.sleep(0.2)
    custom = k8s.CustomObjectsApi(scheduler_api)
    listed = custom.list_cluster_custom_object(group, version, plural)
    assert "pg" in {item["metadata"]["name"] for item in listed["items"]}
    response = custom.list_cluster_custom_object(
        group, version, plural, watch=True, timeout_seconds=1, _preload_content=False
    )
    assert response.status == 200
    _ = response.data  # read to the end (the server ends it after 1 s): a pooled connection with a
    response.release_conn()  # response still unread fails the next call (ResponseNotReady)
    patched = custom.patch_namespaced_custom_object_status(
        group, version, kube_namespace, plural, "pg", {"status": {"phase": "Scheduling", "scheduled": 1}}
    )
    # the answer to the patch (a kubegpu scheduler still running from another test may write after)
    wrote = {k: patched["status"].get(k) for k in ("phase", "scheduled")}
    assert wrote == {"phase": "Scheduling", "scheduled": 1}
    for forbidden in (
        lambda: custom.patch_namespaced_custom_object(
            group, version, kube_namespace, plural, "pg", {"spec": {"minMember": 1}}
        ),
        lambda: custom.delete_namespaced_custom_object(group, version, kube_namespace, plural, "pg"),
    ):
        with pytest.raises(k8s.ApiException) as refused:
            forbidden()
        assert refused.value.status == 403


def test_node_agent_publishes_its_gpu_readings_and_the_scheduler_reads_them(
    node_api: k8s.ApiClient, scheduler_api: k8s.ApiClient, admin_api: k8s.ApiClient
) -> None:
    """NodeGpuMetric (the CRD of deploy/crds/, docs/utilisation.md): the node agent's real publisher
    creates its node's object (owned by the Node) and patches it; the scheduler lists and watches
    them and may not write one; the node agent may not read or delete them."""
    apply_manifests(admin_api, [DEPLOY / "crds"])
    node = unique("gpu-node")
    create_fake_node(k8s.CoreV1Api(admin_api), node)
    device = Device("GPU-x", DeviceKind.GPU, 0, "V100", 16_384)
    reading = [GpuTelemetry(40.0, 1000.0, 16_384, xid=0)]
    sampled = [datetime(2026, 3, 1, tzinfo=UTC)]
    publisher = MetricsPublisher(
        k8s.CustomObjectsApi(node_api),
        k8s.CoreV1Api(node_api),
        node,
        lambda: [GpuRow(device, reading[0], reading[0], ())],
        lambda: sampled[0],
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            assert publisher.sync_once() == "first"
            break
        except k8s.ApiException as error:  # the CRD is not served yet
            assert error.status == 404 and time.monotonic() < deadline, error
            time.sleep(0.2)
    group, version, plural = "kubegpu.io", "v1alpha1", "nodegpumetrics"
    reading[0] = GpuTelemetry(40.0, 1000.0, 16_384, xid=79)
    sampled[0] = datetime(2026, 3, 1, 0, 1, tzinfo=UTC)
    assert publisher.sync_once() == "health" and publisher.writes == 2
    stored = k8s.CustomObjectsApi(admin_api).get_cluster_custom_object(group, version, plural, node)
    gpu = {"id": "GPU-x", "index": 0, "utilization": 40.0, "memoryUsedMiB": 1000, "memoryTotalMiB": 16_384}
    assert stored["status"]["gpus"] == [{**gpu, "xid": 79}]
    assert stored["status"]["updateTime"] == "2026-03-01T00:01:00Z"
    owner = stored["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Node", node)
    custom = k8s.CustomObjectsApi(scheduler_api)
    listed = custom.list_cluster_custom_object(group, version, plural)
    assert node in {item["metadata"]["name"] for item in listed["items"]}
    response = custom.list_cluster_custom_object(
        group, version, plural, watch=True, timeout_seconds=1, _preload_content=False
    )
    assert response.status == 200
    _ = response.data  # read to the end (the server ends it after 1 s): a pooled connection with a
    response.release_conn()  # response still unread fails the next call (ResponseNotReady)
    mine = k8s.CustomObjectsApi(node_api)
    for forbidden in (
        lambda: custom.patch_cluster_custom_object(group, version, plural, node, {"spec": {}}),
        lambda: mine.get_cluster_custom_object(group, version, plural, node),
        lambda: mine.delete_cluster_custom_object(group, version, plural, node),
    ):
        with pytest.raises(k8s.ApiException) as refused:
            forbidden()
        assert refused.value.status == 403


def test_node_agent_publishes_its_node_resource_topology(
    node_api: k8s.ApiClient, admin_api: k8s.ApiClient, tmp_path: Path
) -> None:
    """NodeResourceTopology (upstream's CRD of deploy/crds/, docs/nrt.md): the node agent's real
    publisher reads, creates and patches its node's object; it may not list or delete them."""
    apply_manifests(admin_api, [DEPLOY / "crds"])
    node = unique("gpu-node")
    create_fake_node(k8s.CoreV1Api(admin_api), node)
    gpus = (
        Device("GPU-a", DeviceKind.GPU, 0, "V100", numa_node=0),
        Device("GPU-b", DeviceKind.GPU, 1, "V100"),
    )
    held: set[str] = set()
    publisher = TopologyPublisher(
        k8s.CustomObjectsApi(node_api),
        k8s.CoreV1Api(node_api),
        node,
        lambda: NodeInventory(gpus),
        lambda: held,
        lambda: {0: NumaNode(0, 8, None, {0: 10})},
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            assert publisher.sync_once() == "created"
            break
        except NrtUnavailable:  # the CRD is not served yet
            assert time.monotonic() < deadline
            time.sleep(0.2)
    held.add("GPU-b")
    assert publisher.sync_once() == "changed" and publisher.writes == 2
    group, version, plural = "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies"
    stored = k8s.CustomObjectsApi(admin_api).get_cluster_custom_object(group, version, plural, node)
    assert stored["zones"][0]["resources"] == [
        {"name": "nvidia.com/gpu", "capacity": 2, "allocatable": 2, "available": 1}
    ]
    mine = k8s.CustomObjectsApi(node_api)
    for forbidden in (
        lambda: mine.list_cluster_custom_object(group, version, plural),
        lambda: mine.delete_cluster_custom_object(group, version, plural, node),
    ):
        with pytest.raises(k8s.ApiException) as refused:
            forbidden()
        assert refused.value.status == 403


def test_scheduler_may_record_events_through_both_apis(
    scheduler_api: k8s.ApiClient, kube_namespace: str, pending_pod: str
) -> None:
    regarding = k8s.V1ObjectReference(
        api_version="v1", kind="Pod", name=pending_pod, namespace=kube_namespace
    )
    core = k8s.CoreV1Api(scheduler_api)
    name = unique(f"{pending_pod}.sched")
    core.create_namespaced_event(
        kube_namespace,
        k8s.CoreV1Event(
            metadata=k8s.V1ObjectMeta(name=name),
            involved_object=regarding,
            reason="FailedScheduling",
            message="no GPU",
            type="Warning",
            count=1,
            source=k8s.V1EventSource(component="kubegpu"),
        ),
    )
    core.patch_namespaced_event(name, kube_namespace, {"count": 2}, _content_type=MERGE_PATCH)

    events = k8s.EventsV1Api(scheduler_api)
    new_name = unique(f"{pending_pod}.new")
    events.create_namespaced_event(
        kube_namespace,
        k8s.EventsV1Event(
            metadata=k8s.V1ObjectMeta(name=new_name),
            event_time=datetime.now(UTC).replace(microsecond=123456),  # MicroTime: see leader.wire_time
            reporting_controller="kubegpu.io/scheduler",
            reporting_instance="replica-a",
            action="Scheduling",
            reason="FailedScheduling",
            regarding=regarding,
            type="Warning",
            note="no GPU",
        ),
    )
    series = {"series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:00.000001Z"}}
    events.patch_namespaced_event(new_name, kube_namespace, series, _content_type=MERGE_PATCH)


def test_scheduler_holds_its_lease_with_the_leader_elector(
    scheduler_api: k8s.ApiClient, admin_api: k8s.ApiClient
) -> None:
    status_of(k8s.CoordinationV1Api(admin_api).delete_namespaced_lease, LEASE, NAMESPACE)
    timings: dict[str, Any] = {"lease_seconds": 2, "renew_deadline": 1.5, "retry_period": 0.2}
    coordination = k8s.CoordinationV1Api(scheduler_api)
    first = LeaderElector(coordination, NAMESPACE, LEASE, "replica-a", **timings)
    second = LeaderElector(coordination, NAMESPACE, LEASE, "replica-b", **timings)
    assert first.try_acquire_or_renew()  # create
    assert first.try_acquire_or_renew()  # get + update
    assert not second.try_acquire_or_renew() and second.holder == "replica-a"
    assert first.release()
    assert second.try_acquire_or_renew()


def test_scheduler_may_do_nothing_else(
    scheduler_api: k8s.ApiClient, admin_api: k8s.ApiClient, kube_namespace: str, pending_pod: str
) -> None:
    core = k8s.CoreV1Api(scheduler_api)
    coordination = k8s.CoordinationV1Api(scheduler_api)
    node = unique("node")
    create_fake_node(k8s.CoreV1Api(admin_api), node)
    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=unique("p")),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c", image="x")]),
    )
    other_lease = unique("other")
    k8s.CoordinationV1Api(admin_api).create_namespaced_lease(
        kube_namespace, {"metadata": {"name": "foreign"}, "spec": {}}
    )

    forbidden = {
        "list secrets": status_of(core.list_secret_for_all_namespaces),
        "list secrets in its namespace": status_of(core.list_namespaced_secret, NAMESPACE),
        "get the signing key": status_of(core.read_namespaced_secret, "kubegpu-allocation-keys", NAMESPACE),
        "delete a pod": status_of(core.delete_namespaced_pod, pending_pod, kube_namespace),
        "create a pod": status_of(core.create_namespaced_pod, kube_namespace, pod),
        "patch a pod": status_of(
            core.patch_namespaced_pod, pending_pod, kube_namespace, {"metadata": {"labels": {"x": "y"}}}
        ),
        "patch a node": status_of(core.patch_node, node, {"metadata": {"labels": {"x": "y"}}}),
        "patch a node's status": status_of(
            core.patch_node_status, node, {"status": {"capacity": {"x": "1"}}}
        ),
        "delete a node": status_of(core.delete_node, node),
        "get a lease elsewhere": status_of(coordination.read_namespaced_lease, "foreign", kube_namespace),
        "create a lease elsewhere": status_of(
            coordination.create_namespaced_lease,
            kube_namespace,
            {"metadata": {"name": other_lease}, "spec": {}},
        ),
        "get another lease in its namespace": status_of(
            coordination.read_namespaced_lease, other_lease, NAMESPACE
        ),
        "list leases": status_of(coordination.list_namespaced_lease, NAMESPACE),
        "list configmaps": status_of(core.list_namespaced_config_map, NAMESPACE),
        "get a namespace": status_of(core.read_namespace, kube_namespace),
        "patch a namespace": status_of(
            core.patch_namespace, kube_namespace, {"metadata": {"labels": {"x": "y"}}}
        ),
        "create a budget": status_of(
            k8s.PolicyV1Api(scheduler_api).create_namespaced_pod_disruption_budget,
            kube_namespace,
            {"metadata": {"name": "b"}, "spec": {"maxUnavailable": 1, "selector": {}}},
        ),
        "delete budgets": status_of(
            k8s.PolicyV1Api(scheduler_api).delete_collection_namespaced_pod_disruption_budget, kube_namespace
        ),
    }
    assert {what: code for what, code in forbidden.items() if code != 403} == {}
    assert core.read_namespaced_pod(pending_pod, kube_namespace).metadata.labels is None


def test_scheduler_rules_are_exactly_the_expected_ones(
    scheduler_api: k8s.ApiClient, kube_namespace: str, granted: Callable[[k8s.ApiClient, str], Rules]
) -> None:
    assert granted(scheduler_api, NAMESPACE) == SCHEDULER_CLUSTER_RULES | SCHEDULER_LEASE_RULES
    assert granted(scheduler_api, kube_namespace) == SCHEDULER_CLUSTER_RULES
    checks = [
        (
            {
                "verb": "delete",
                "resource": "leases",
                "group": "coordination.k8s.io",
                "namespace": NAMESPACE,
                "name": LEASE,
            },
            False,
        ),
        (
            {
                "verb": "update",
                "resource": "leases",
                "group": "coordination.k8s.io",
                "namespace": NAMESPACE,
                "name": LEASE,
            },
            True,
        ),
        (
            {
                "verb": "update",
                "resource": "leases",
                "group": "coordination.k8s.io",
                "namespace": "kube-system",
                "name": LEASE,
            },
            False,
        ),
        ({"verb": "get", "resource": "secrets", "namespace": NAMESPACE}, False),
        ({"verb": "create", "resource": "pods", "subresource": "binding", "namespace": kube_namespace}, True),
        ({"verb": "update", "resource": "pods", "namespace": kube_namespace}, False),
    ]
    assert [allowed(scheduler_api, **attrs) for attrs, _ in checks] == [want for _, want in checks]


# --------------------------------------------------------------------------- the node agent's identity


def test_node_agent_may_do_what_it_needs(
    node_api: k8s.ApiClient, admin_api: k8s.ApiClient, kube_namespace: str, pending_pod: str
) -> None:
    core = k8s.CoreV1Api(node_api)
    node = unique("gpu-node")
    create_fake_node(k8s.CoreV1Api(admin_api), node)
    assert core.read_node(node).metadata.name == node
    inventory = json.dumps({"version": 1, "devices": [], "topology": {}})
    core.patch_node(node, {"metadata": {"annotations": {"kubegpu.io/inventory": inventory}}})  # strategic
    core.patch_node(
        node,
        {"metadata": {"annotations": {"kubegpu.io/heartbeat": "2026-11-26T12:00:00Z"}}},
        _content_type=MERGE_PATCH,
    )
    gpus = {"nvidia.com/gpu": "8"}
    core.patch_node_status(
        node, {"status": {"capacity": gpus, "allocatable": gpus}}, _content_type=MERGE_PATCH
    )
    stored = k8s.CoreV1Api(admin_api).read_node(node)
    assert stored.metadata.annotations["kubegpu.io/inventory"] == inventory
    assert stored.status.allocatable["nvidia.com/gpu"] == "8"
    assert core.read_namespaced_pod(pending_pod, kube_namespace).metadata.name == pending_pod
    # The shim's pod cache: list and watch the pods bound to its node.
    cache = NodePodCache(core, node).start()
    try:
        assert cache.synced.wait(30), "the node agent could not list its node's pods"
        on_node = k8s.CoreV1Api(admin_api).create_namespaced_pod(
            kube_namespace,
            {"metadata": {"name": unique("on-node")},
             "spec": {"nodeName": node, "containers": [{"name": "app", "image": "busybox"}]}},
        )
        deadline = time.monotonic() + 30
        while cache.get(kube_namespace, on_node.metadata.name, on_node.metadata.uid) is None:
            assert time.monotonic() < deadline, "the node agent could not watch its node's pods"
            time.sleep(0.05)
    finally:
        cache.stop()


def test_node_agent_may_do_nothing_else(
    node_api: k8s.ApiClient,
    admin_api: k8s.ApiClient,
    kube_namespace: str,
    pending_pod: str,
    granted: Callable[[k8s.ApiClient, str], Rules],
) -> None:
    core = k8s.CoreV1Api(node_api)
    node = unique("node")
    create_fake_node(k8s.CoreV1Api(admin_api), node)
    binding = k8s.V1Binding(
        metadata=k8s.V1ObjectMeta(name=pending_pod),
        target=k8s.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    forbidden = {
        "list secrets": status_of(core.list_secret_for_all_namespaces),
        "get the signing key": status_of(core.read_namespaced_secret, "kubegpu-allocation-keys", NAMESPACE),
        "bind a pod": status_of(
            core.create_namespaced_pod_binding, pending_pod, kube_namespace, binding, _preload_content=False
        ),
        "delete a node": status_of(core.delete_node, node),
        "update a node": status_of(core.replace_node, node, k8s.CoreV1Api(admin_api).read_node(node)),
        "list nodes": status_of(core.list_node),
        "delete a pod": status_of(core.delete_namespaced_pod, pending_pod, kube_namespace),
        "patch a pod": status_of(
            core.patch_namespaced_pod, pending_pod, kube_namespace, {"metadata": {"labels": {"x": "y"}}}
        ),
        "get a lease": status_of(k8s.CoordinationV1Api(node_api).read_namespaced_lease, LEASE, NAMESPACE),
    }
    assert {what: code for what, code in forbidden.items() if code != 403} == {}
    assert granted(node_api, kube_namespace) == NODE_RULES
    assert granted(node_api, NAMESPACE) == NODE_RULES


def test_the_scheduler_runs_with_its_service_account(
    scheduler_api: k8s.ApiClient, admin_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path
) -> None:
    """The real scheduler loop, as kubegpu-system/kubegpu-scheduler: watch, elect, bind, report."""
    import threading
    import time

    from kubegpu.allocation import KeyRing
    from scheduler.live.config import LeaderElection, SchedulerConfig
    from scheduler.live.scheduler import Scheduler
    from tests.fixtures.keys import SIGNING
    from tests.test_scheduler_api import advertise, gpu_pod, wait_bound

    core = k8s.CoreV1Api(admin_api)
    run = unique("rbac")
    advertise(core, run, "pcie-4gpu", tmp_path, labels={"run": run})
    config = SchedulerConfig(
        scheduler_name=run, policy="bestfit", identity=f"{run}-replica",
        leader_election=LeaderElection(enabled=True, namespace=NAMESPACE, lease_name=LEASE, lease_seconds=4.0,
                                       renew_deadline_seconds=3.0, retry_period_seconds=0.5),
    )
    scheduler = Scheduler(config, scheduler_api, KeyRing(None, SIGNING))
    scheduler.start_watching()
    assert scheduler.wait_synced(30)
    scheduler.start_leading(scheduler_api)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        core.create_namespaced_pod(kube_namespace, gpu_pod(kube_namespace, "ok", 1, scheduler=run,
                                                           selector={"run": run}))
        core.create_namespaced_pod(kube_namespace, gpu_pod(kube_namespace, "too-big", 8, scheduler=run,
                                                           selector={"run": run}))
        assert wait_bound(core, kube_namespace, ["ok"])["ok"].metadata.annotations["kubegpu.io/allocation"]
        deadline = time.monotonic() + 30
        wanted = {("too-big", "FailedScheduling"), ("ok", "Scheduled")}  # both events.k8s.io/v1
        while not wanted <= {(e.involved_object.name, e.reason)
                             for e in core.list_namespaced_event(kube_namespace).items}:
            assert time.monotonic() < deadline, "the scheduler's identity could not post its events"
            time.sleep(0.2)
    finally:
        scheduler.stop()
        thread.join(timeout=10)
