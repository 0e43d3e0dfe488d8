"""A hostile node against the real scheduler and a real kube-apiserver.

A node writes a few hundred adversarial and random annotations (inventory, heartbeat) and
allocatable counts on its own Node, through the identities a node agent has: its kubelet's node
certificate (``system:node:<name>``) and the node agent's ServiceAccount with the RBAC of
deploy/11-node-rbac.yaml. Meanwhile ``kubegpu scheduler`` (the real command, a subprocess) keeps
placing GPU pods on three healthy nodes. It must not crash or log a traceback, place nothing on
the broken node, bind every pod within a generous deadline, say why it left the node out (a log
line and a rate-limited Event on the Node), and use the node again once it publishes something
valid. No timing is asserted.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.config import new_client_from_config

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION, Advertiser, publication
from crishim.rewrite import NodeDevices
from devices.registry import load_plugins
from devices.sim import SimPlugin
from kubegpu.allocation import ANNOTATION, verify
from kubegpu.devenv.controlplane import MERGE_PATCH, ControlPlane, create_fake_node
from kubegpu.devenv.manifests import apply_manifests
from kubegpu.devenv.shimproc import free_port
from scheduler.live.nodeevents import WARNING_REASON
from tests.fixtures.keys import public, write_scheduler_keys
from tests.support.hostile import FUTURE, Case, adversarial, random_inventory

pytestmark = pytest.mark.apiserver
REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
WRITES = 300  # hostile writes in all (adversarial cases first, then random ones)
PODS = 20  # GPU pods for the healthy nodes (3 x 8 GPUs)
DEADLINE = 180.0  # generous: a bound on "the scheduler still works", not a performance figure
NORMAL = {"cpu": "64", "memory": "256Gi", "pods": "110"}
PACE = 0.02  # seconds between hostile writes


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def advertise(core: k8s.CoreV1Api, name: str, topology: str, state: Path, labels: dict[str, str]) -> None:
    create_fake_node(core, name, labels=labels, capacity=NORMAL)
    plugins = load_plugins(["sim"], {"node_name": name, "topology": topology, "state_dir": str(state / name)})
    devices = NodeDevices(plugins, sysfs_root=None)
    devices.discover()
    Advertiser(core, name, devices.current_inventory).sync_once()


def gpu_pod(namespace: str, name: str, scheduler: str, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "containers": [
                {
                    "name": "app",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi"},
                        "limits": {"nvidia.com/gpu": "1"},
                    },
                }
            ],
        },
    }


class HostileNode:
    """Writes on one Node as its node agent could: annotations through ``patch_node``, counts
    through ``patch_node_status``, alternating between the identities it is given."""

    def __init__(self, name: str, identities: list[k8s.CoreV1Api]) -> None:
        self.name = name
        self.identities = identities
        self.writes = 0
        self.refused: dict[int, int] = {}  # HTTP status -> writes the API server refused
        self._abnormal = False

    def write(self, case: Case) -> None:
        core = self.identities[self.writes % len(self.identities)]
        self.writes += 1
        annotations = {INVENTORY_ANNOTATION: case.inventory, HEARTBEAT_ANNOTATION: case.heartbeat or now()}
        self._call(core.patch_node, self.name, {"metadata": {"annotations": annotations}})
        if case.allocatable or self._abnormal:
            counts = {**NORMAL, "nvidia.com/gpu": "8", **case.allocatable}
            body = {"status": {"allocatable": counts, "capacity": counts}}
            self._call(core.patch_node_status, self.name, body, _content_type=MERGE_PATCH)
            self._abnormal = bool(case.allocatable)

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> None:
        try:
            method(*args, **kwargs)
        except k8s.ApiException as error:  # the API server validates some of it itself
            assert error.status in (400, 413, 422), (error.status, error.reason)
            self.refused[error.status] = self.refused.get(error.status, 0) + 1


@pytest.fixture
def node_identity(control_plane: ControlPlane) -> Iterator[Any]:
    """Factory: node name -> CoreV1Api clients as that node's kubelet and as the node agent's
    ServiceAccount (deploy/00-namespace.yaml and 11-node-rbac.yaml applied)."""
    clients: list[k8s.ApiClient] = []
    with control_plane.admin_client() as admin:
        apply_manifests(admin, [DEPLOY / "00-namespace.yaml", DEPLOY / "11-node-rbac.yaml"])

    def make(name: str) -> list[k8s.CoreV1Api]:
        kubeconfig = control_plane.client_cert_kubeconfig(
            f"node-{name}", f"system:node:{name}", ("system:nodes",)
        )
        kubelet = new_client_from_config(config_file=str(kubeconfig))
        agent = control_plane.service_account_client("kubegpu-system", "kubegpu-node")
        clients.extend([kubelet, agent])
        return [k8s.CoreV1Api(kubelet), k8s.CoreV1Api(agent)]

    yield make
    for api in clients:
        api.close()


def wait_ready(port: int, scheduler: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until the scheduler's /readyz says its caches are synced."""
    deadline = time.monotonic() + DEADLINE
    while True:
        assert scheduler.poll() is None, log_path.read_text()[-4000:]
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5).status == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, log_path.read_text()[-4000:]
        time.sleep(0.2)


def scheduler_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text().splitlines():
        assert "Traceback" not in text, path.read_text()[-4000:]
        try:
            lines.append(json.loads(text))
        except ValueError:
            pytest.fail(f"the scheduler wrote a line that is not a log event: {text[:300]}")
    return lines


def wait_bound(core: k8s.CoreV1Api, namespace: str, names: list[str], deadline: float) -> dict[str, Any]:
    while True:
        pods = {
            p.metadata.name: p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names
        }
        if all(n in pods and pods[n].spec.node_name for n in names):
            return pods
        assert time.monotonic() < deadline, (
            f"unbound: {[n for n in names if not pods.get(n) or not pods[n].spec.node_name]}"
        )
        time.sleep(0.2)


def test_a_hostile_node_does_not_stop_the_scheduler(
    control_plane: ControlPlane,
    admin_api: k8s.ApiClient,
    kube_namespace: str,
    node_identity: Any,
    tmp_path: Path,
) -> None:
    core = k8s.CoreV1Api(admin_api)
    run = uuid.uuid4().hex[:6]
    labels = {"hostile-run": run}
    healthy = [f"healthy-{i}-{run}" for i in range(3)]
    for name in healthy:
        advertise(core, name, "dgx1-v100", tmp_path, labels)
    hostile = f"hostile-{run}"
    create_fake_node(
        core, hostile, labels={**labels, "hostile-target": run}, capacity={**NORMAL, "nvidia.com/gpu": "8"}
    )
    valid = publication(SimPlugin("hgx-h100", hostile, tmp_path / hostile).discover()).inventory
    node = HostileNode(hostile, node_identity(hostile))
    node.write(Case("first", "{"))

    keys = write_scheduler_keys(tmp_path / "keys")
    name = f"kubegpu-{run}"
    config = tmp_path / "scheduler.yaml"
    config.write_text(
        f"schedulerName: {name}\npolicy: spread\nkeysDir: {keys}\nsigningKeyId: k1\n"
        "heartbeatStaleSeconds: 3600\n"
    )
    log_path = tmp_path / "scheduler.log"
    port = free_port()
    with log_path.open("w") as log_file:
        scheduler = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubegpu",
                "scheduler",
                "--config",
                str(config),
                "--kubeconfig",
                str(control_plane.admin_kubeconfig),
                "--metrics-address",
                f"127.0.0.1:{port}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    try:
        wait_ready(port, scheduler, log_path)
        started = time.monotonic()
        cases = list(adversarial(valid))
        rng = random.Random(14)
        while len(cases) < WRITES:
            cases.append(Case(f"random-{len(cases)}", random_inventory(valid, rng), heartbeat=FUTURE))
        pods: list[str] = []
        every = len(cases) // PODS
        for k, case in enumerate(cases):
            node.write(case)
            time.sleep(PACE)  # let the scheduler see most states (it need not see each one)
            if k % every == 0 and len(pods) < PODS:
                pods.append(f"p{len(pods)}")
                core.create_namespaced_pod(kube_namespace, gpu_pod(kube_namespace, pods[-1], name, labels))
            assert scheduler.poll() is None, log_path.read_text()[-4000:]
        bound = wait_bound(core, kube_namespace, pods, time.monotonic() + DEADLINE)
        assert scheduler.poll() is None, log_path.read_text()[-4000:]

        # nothing on the broken node; every device given once
        keyring = public()
        held: set[tuple[str, str]] = set()
        for pod in bound.values():
            assert pod.spec.node_name in healthy, (pod.metadata.name, pod.spec.node_name)
            allocation = verify(pod.metadata.annotations[ANNOTATION], keyring)
            for entry in allocation.containers.values():
                for device in entry.devices:
                    assert (pod.spec.node_name, device) not in held
                    held.add((pod.spec.node_name, device))
        assert node.writes >= WRITES

        # said why: log lines and a rate-limited Warning Event on the Node
        lines = scheduler_lines(log_path)
        excluded = [
            line for line in lines if line.get("event") == "node.excluded" and line.get("node") == hostile
        ]
        assert len({line["reason"] for line in excluded}) > 1, excluded  # it followed the node's changes
        assert not any("exception" in line for line in lines)
        events = [
            e
            for e in core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={hostile}"
            ).items
            if e.reason == WARNING_REASON
        ]
        assert events, "no Event on the hostile node"
        minutes = (time.monotonic() - started) / 60
        assert len(events) <= 2 + minutes, [e.message for e in events]  # at most one a minute

        # recovery: a valid publication makes the node usable again
        node.write(Case("valid", valid))
        core.create_namespaced_pod(
            kube_namespace, gpu_pod(kube_namespace, "back", name, {"hostile-target": run})
        )
        back = wait_bound(core, kube_namespace, ["back"], time.monotonic() + DEADLINE)["back"]
        assert back.spec.node_name == hostile
        assert scheduler.poll() is None
        usable = [line for line in scheduler_lines(log_path) if line.get("event") == "node.usable"]
        assert any(line.get("node") == hostile for line in usable)
    finally:
        scheduler.terminate()
        try:
            scheduler.wait(timeout=30)
        except subprocess.TimeoutExpired:
            scheduler.kill()
            scheduler.wait()
    assert scheduler.returncode == 0, log_path.read_text()[-4000:]
