"""The Helm chart on the real node: ``helm install`` runs the scheduler from the image, a GPU pod
is scheduled with the chart's generated key and started through the shim, ``helm upgrade``
rolls the scheduler and keeps the key, ``helm uninstall`` leaves nothing of the release.

The cluster's namespace, RBAC and node agents come from deploy/ (the local-cluster fixture), so
the chart is installed with ``namespace.create=false rbac.create=false nodeAgent.rbac=false``;
tests/test_helm.py installs those parts on a control plane. One replica: on the host network
(tests/fixtures/schedulerpods.py) two replicas on one node would want the same metrics port.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
from kubernetes import client as k8s

from kubegpu.allocation import ANNOTATION, SigningKey, parse_key, public_key_pem
from kubegpu.devenv.controlplane import free_ports, http_ok
from kubegpu.localcluster.cluster import SYSTEM_NAMESPACE
from tests.fixtures.helm import CHART, Helm
from tests.fixtures.schedulerpods import SchedulerPodEnv, key_file
from tests.support.leftovers import labelled
from tests.support.nodepods import allocation_of, container, pod, wait_pod, wait_running
from tests.support.waiting import wait_for

RELEASE = "kubegpu"
INSTANCE = f"app.kubernetes.io/instance={RELEASE}"
SCHEDULER_PODS = "app.kubernetes.io/name=kubegpu-scheduler"


def scheduler_pods(core: k8s.CoreV1Api) -> list[k8s.V1Pod]:
    return core.list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=SCHEDULER_PODS).items


def ready(found: k8s.V1Pod) -> bool:
    conditions = {c.type: c.status for c in found.status.conditions or []}
    return found.status.phase == "Running" and conditions.get("Ready") == "True"


def wait_scheduler_ready(env: SchedulerPodEnv, other_than: str = "", timeout: float = 120) -> k8s.V1Pod:
    """The one scheduler pod, once it is Ready (and not named ``other_than``)."""
    found: list[k8s.V1Pod] = []

    def one_ready() -> bool:
        found[:] = scheduler_pods(env.core)
        return len(found) == 1 and found[0].metadata.name != other_than and ready(found[0])

    try:
        wait_for(one_ready, timeout=timeout)
    except AssertionError:
        raise AssertionError(
            f"no Ready scheduler pod: {[(p.metadata.name, p.status) for p in found]}"
        ) from None
    return found[0]


def gpu_pod(env: SchedulerPodEnv, namespace: str, name: str) -> k8s.V1Pod:
    env.core.create_namespaced_pod(namespace, pod(name, [container("main", gpus=1)], env.node.selector))
    return wait_running(env.core, namespace, name, timeout=120)


@pytest.mark.apiserver
@pytest.mark.containerd
def test_install_upgrade_uninstall_on_the_real_node(
    helm: Helm, scheduler_pod_env: SchedulerPodEnv, node_namespace: str, tmp_path: Path
) -> None:
    env = scheduler_pod_env
    kubeconfig = env.node.kubeconfig
    key_id = f"khelm{uuid.uuid4().hex[:6]}"
    (port,) = free_ports(1)
    repository, tag = env.image.rsplit(":", 1)
    values = {
        "namespace.create": "false",
        "rbac.create": "false",
        "nodeAgent.rbac": "false",
        "image.repository": repository,
        "image.tag": tag,
        "image.pullPolicy": "Never",
        "scheduler.replicas": "1",
        "scheduler.hostNetwork": "true",
        "scheduler.metricsPort": str(port),
        "scheduler.config.signingKeyId": key_id,
    }
    sets = [arg for key, value in values.items() for arg in ("--set", f"{key}={value}")]
    for index, item in enumerate(env.apiserver_env()):
        sets += [
            "--set",
            f"scheduler.extraEnv[{index}].name={item['name']}",
            "--set-string",
            f"scheduler.extraEnv[{index}].value={item['value']}",
        ]
    node_key: Path | None = None
    try:
        helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            "default",
            *sets,
            "--wait",
            "--timeout",
            "180s",
            kubeconfig=kubeconfig,
        )
        # --wait is satisfied at once (maxUnavailable 1 of 1 replica): wait for the pod itself
        first = wait_scheduler_ready(env)
        assert first.spec.containers[0].image == env.image
        assert first.spec.service_account_name == "kubegpu-scheduler"
        try:
            wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), timeout=60)
        except AssertionError:
            logs = env.node.kubectl("-n", SYSTEM_NAMESPACE, "logs", first.metadata.name, check=False)
            raise AssertionError(f"scheduler never ready:\n{logs.stdout}{logs.stderr}") from None
        wait_for(lambda: lease_holder(env) == first.metadata.name, timeout=30)

        # the generated key, placed on the node as NOTES.txt says (the shim re-reads its keys)
        secret = env.core.read_namespaced_secret("kubegpu-allocation-keys", SYSTEM_NAMESPACE)
        key = base64.b64decode(secret.data[key_id])
        assert isinstance(parse_key(key), SigningKey)  # the chart's generated Ed25519 private key
        node_key = key_file(env.cluster.node_keys, key_id, public_key_pem(parse_key(key)))
        started = gpu_pod(env, node_namespace, "gpu-a")
        assert json.loads(started.metadata.annotations[ANNOTATION])["keyId"] == key_id
        assert len(allocation_of(started, env.cluster.node_keys).all_devices()) == 1

        # upgrade: a config change rolls the pod; the key stays
        helm(
            "upgrade",
            RELEASE,
            str(CHART),
            "--namespace",
            "default",
            "--reuse-values",
            "--set",
            "scheduler.config.policy=binpack",
            "--wait",
            "--timeout",
            "180s",
            kubeconfig=kubeconfig,
        )
        wait_scheduler_ready(env, other_than=first.metadata.name)
        secret = env.core.read_namespaced_secret("kubegpu-allocation-keys", SYSTEM_NAMESPACE)
        assert base64.b64decode(secret.data[key_id]) == key
        assert gpu_pod(env, node_namespace, "gpu-b").metadata.annotations[ANNOTATION]
    finally:
        result = helm(
            "uninstall",
            RELEASE,
            "--namespace",
            "default",
            kubeconfig=kubeconfig,
            check=False,
        )
        if node_key is not None:
            node_key.unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr
    # uninstall returns once the objects are deleted; their pods go through the garbage collector
    # and the kubelet (helm's --wait timed out at 180 s once on a loaded machine)
    wait_for(
        lambda: not scheduler_pods(env.core),
        timeout=300,
        describe=lambda: [(p.metadata.name, p.status.phase) for p in scheduler_pods(env.core)],
    )
    wait_for(
        lambda: labelled(env.node.admin_api, INSTANCE) == [],
        timeout=300,
        describe=lambda: labelled(env.node.admin_api, INSTANCE),
    )
    assert helm("list", "--all-namespaces", "--short", kubeconfig=kubeconfig).stdout.strip() == ""
    # the GPU pods outlive the scheduler that placed them
    assert wait_pod(env.core, node_namespace, "gpu-a", lambda p: p.status.phase == "Running", "running")


def lease_holder(env: SchedulerPodEnv) -> str:
    try:
        lease = k8s.CoordinationV1Api(env.node.admin_api).read_namespaced_lease(
            "kubegpu-scheduler", SYSTEM_NAMESPACE
        )
    except k8s.ApiException:
        return ""
    return lease.spec.holder_identity or ""
