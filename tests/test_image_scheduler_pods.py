"""The scheduler as pods on the real node: ``kubectl apply -f deploy/`` runs the two replicas
from the image ``make image`` builds, under their ServiceAccount with in-cluster config and the
key Secret mounted; one holds the Lease; GPU pods are scheduled and started through the shim;
deleting the leader pod hands the Lease to the other replica within the lease duration, and
scheduling goes on with no pod bound twice and none lost; ``kubectl logs`` shows the JSON lines.

deploy/ is applied as shipped (RBAC unchanged), with the Secret made as docs/deploy.md says.
Then three changes adapt it to this test cluster, which has no pod network
(tests/fixtures/schedulerpods.py): the pods use the host network (the namespace is labelled
``privileged`` for it), talk to the apiserver at its loopback address, and, two replicas sharing
one host network, serve metrics on ephemeral ports, so the fixed port (a host port on the host
network) and the liveness probe on it go.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from kubegpu.devenv.manifests import manifest_files
from kubegpu.localcluster.cluster import SYSTEM_NAMESPACE
from scheduler.live.config import LeaderElection
from tests.fixtures.schedulerpods import SchedulerPodEnv
from tests.support.invariants import look, problems
from tests.support.nodepods import allocation_of, container, pod, wait_running
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
DEPLOYED_IMAGE = yaml.safe_load((DEPLOY / "30-scheduler-deployment.yaml").read_text())["spec"]["template"][
    "spec"
]["containers"][0]["image"]
SCHEDULER_PODS = "app.kubernetes.io/name=kubegpu-scheduler"
LEASE = "kubegpu-scheduler"


def scheduler_pods(core: k8s.CoreV1Api) -> list[k8s.V1Pod]:
    pods = core.list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=SCHEDULER_PODS).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def ready(found: k8s.V1Pod) -> bool:
    conditions = {c.type: c.status for c in found.status.conditions or []}
    return found.status.phase == "Running" and conditions.get("Ready") == "True"


def lease(env: SchedulerPodEnv) -> k8s.V1Lease:
    return k8s.CoordinationV1Api(env.node.admin_api).read_namespaced_lease(LEASE, SYSTEM_NAMESPACE)


def holder(env: SchedulerPodEnv) -> str:
    return lease(env).spec.holder_identity or ""


def adapt_to_the_test_cluster(env: SchedulerPodEnv) -> None:
    env.label_namespace("privileged")
    config = env.core.read_namespaced_config_map("kubegpu-scheduler-config", SYSTEM_NAMESPACE)
    text = config.data["scheduler.yaml"].replace("metricsAddress: 0.0.0.0:9465", "metricsAddress: 0.0.0.0:0")
    assert "0.0.0.0:0" in text
    env.core.patch_namespaced_config_map(
        "kubegpu-scheduler-config", SYSTEM_NAMESPACE, {"data": {"scheduler.yaml": text}}
    )
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "hostNetwork": True,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    # on the host network a containerPort is a hostPort: two replicas would not fit one node
                    "containers": [
                        {
                            "name": "scheduler",
                            "livenessProbe": None,
                            "ports": None,
                            "env": env.apiserver_env(),
                        }
                    ],
                }
            }
        }
    }
    k8s.AppsV1Api(env.node.admin_api).patch_namespaced_deployment(
        "kubegpu-scheduler", SYSTEM_NAMESPACE, patch
    )


def two_ready_replicas(env: SchedulerPodEnv, timeout: float = 180) -> list[k8s.V1Pod]:
    found: list[k8s.V1Pod] = []

    def both() -> bool:
        found[:] = [p for p in scheduler_pods(env.core) if ready(p)]
        return len(found) == 2 and all(p.spec.host_network for p in found)

    try:
        wait_for(both, timeout=timeout)
    except AssertionError:
        pods = [
            (p.metadata.name, p.status.phase, p.status.container_statuses) for p in scheduler_pods(env.core)
        ]
        raise AssertionError(f"not two Ready replicas: {pods}") from None
    return found


def gpu_pod(env: SchedulerPodEnv, namespace: str, name: str) -> None:
    env.core.create_namespaced_pod(namespace, pod(name, [container("main", gpus=1)], env.node.selector))


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.apiserver
@pytest.mark.containerd
def test_deploy_runs_two_replicas_that_hand_over_the_lease(
    scheduler_pod_env: SchedulerPodEnv, node_namespace: str, tmp_path: Path
) -> None:
    env = scheduler_pod_env
    # the image under the name deploy/ uses (kubegpu:0.1.0 is docker.io/library/kubegpu:0.1.0)
    env.tag_image("docker.io/library/" + DEPLOYED_IMAGE)
    key = env.cluster.scheduler_keys / env.cluster.key_id
    # what the test removes after: deploy/ less the namespace and RBAC (the cluster's own)
    ours = [str(p) for p in manifest_files([DEPLOY]) if not p.name.startswith(("00-", "10-", "11-"))]
    try:
        env.node.kubectl(
            "-n",
            SYSTEM_NAMESPACE,
            "create",
            "secret",
            "generic",
            "kubegpu-allocation-keys",
            f"--from-file={env.cluster.key_id}={key}",
        )
        out = env.node.kubectl("apply", "-f", str(DEPLOY)).stdout
        assert "deployment.apps/kubegpu-scheduler created" in out
        adapt_to_the_test_cluster(env)
        replicas = two_ready_replicas(env)
        names = sorted(p.metadata.name for p in replicas)
        for found in replicas:
            assert found.spec.service_account_name == "kubegpu-scheduler"
            assert found.spec.containers[0].image == DEPLOYED_IMAGE
            mounts = {m.mount_path: m for m in found.spec.containers[0].volume_mounts}
            assert mounts["/etc/kubegpu/keys"].read_only
        wait_for(lambda: holder(env) in names, timeout=30)
        leader = holder(env)
        (survivor,) = [n for n in names if n != leader]

        for name in ("gpu-1", "gpu-2"):
            gpu_pod(env, node_namespace, name)
        for name in ("gpu-1", "gpu-2"):
            found = wait_running(env.core, node_namespace, name, timeout=120)
            assert allocation_of(found, env.cluster.node_keys).all_devices()

        # the leader goes; a pod arrives while it goes
        transitions = lease(env).spec.lease_transitions or 0
        deleted_at = time.monotonic()
        env.core.delete_namespaced_pod(leader, SYSTEM_NAMESPACE)
        gpu_pod(env, node_namespace, "gpu-3")
        lease_seconds = LeaderElection().lease_seconds
        wait_for(lambda: holder(env) == survivor, timeout=lease_seconds)
        handover = time.monotonic() - deleted_at
        assert (lease(env).spec.lease_transitions or 0) > transitions
        gpu_pod(env, node_namespace, "gpu-4")
        for name in ("gpu-3", "gpu-4"):
            wait_running(env.core, node_namespace, name, timeout=120)

        pods = env.core.list_namespaced_pod(node_namespace).items
        assert sorted(p.metadata.name for p in pods) == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
        devices = [d for p in pods for d in allocation_of(p, env.cluster.node_keys).all_devices()]
        assert len(devices) == len(set(devices)) == 4  # no GPU given twice
        view = look(env.core, env.node.name, env.cluster.node_keys, env.node.node.containerd.endpoint)
        assert problems(view, settled=True) == []

        logs = env.node.kubectl("-n", SYSTEM_NAMESPACE, "logs", survivor).stdout
        events = json_lines(logs)
        assert any(e["event"] == "leader.acquired" and e.get("identity") == survivor for e in events), logs
        # the survivor bound the pod that came after the handover: a plain success, or (under
        # load) a Binding whose answer was lost and that the read-back then found stored. gpu-3
        # arrived while the old leader was still stopping and still held the lease: either
        # replica may have bound it (once: the devices above are all distinct)
        sent = {
            e["pod"]: e
            for e in events
            if e["event"] == "pod.bound"
            or (e["event"] == "pod.bind_failed" and e.get("outcome", "").startswith("unknown"))
        }
        for name in ("gpu-4",):
            line = sent.get(f"{node_namespace}/{name}")
            assert line is not None, f"{name}: no Binding from the survivor in its log:\n{logs}"
            assert line["node"] == env.node.name and len(line["devices"]) == 1, line
        print(f"lease handover {handover:.1f}s after the leader's deletion (lease {lease_seconds:.0f}s)")
    finally:
        env.node.kubectl(
            "delete", "--ignore-not-found", "--wait=false", *[a for f in ours for a in ("-f", f)], check=False
        )
        env.node.kubectl(
            "-n",
            SYSTEM_NAMESPACE,
            "delete",
            "secret",
            "kubegpu-allocation-keys",
            "--ignore-not-found",
            check=False,
        )
        wait_for(
            lambda: not env.core.list_namespaced_pod(SYSTEM_NAMESPACE, label_selector=SCHEDULER_PODS).items,
            timeout=120,
        )
