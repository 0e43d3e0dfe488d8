"""The NRI front end to end (issue #22): `kubegpu up --containerd 2 --front nri` runs a real
kubelet talking straight to containerd 2.2.9, with `kubegpu crishim --front nri` as containerd's
required NRI plugin (nothing on kubelet's call path).

Through it, with the proxy's verdicts: a pod the scheduler placed sees exactly its allocated GPUs
whatever it asked for itself; a pod bound past the scheduler with a forged allocation, one asking
for GPUs with no allocation, and one replaying another pod's allocation are refused, each with the
proxy's reason in the pod's events; a plain pod's device selectors are neutralised."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.config import new_client_from_config

from kubegpu.allocation import ANNOTATION, Allocation, ContainerAllocation, load_keys, sign, verify
from kubegpu.devenv.containerd import BUSYBOX_IMAGE, containerd2_bin_dir
from kubegpu.devenv.controlplane import BinariesMissing, ensure_namespace
from kubegpu.localcluster.cluster import find_cluster_binaries, verifying_keys
from tests.fixtures.common import missing_component
from tests.fixtures.localcluster import _require_node_tools

pytestmark = pytest.mark.node

NAMESPACE = "nri-e2e"
NODE = "kubegpu-node"
SHOW = "env; echo SEES $(ls /dev/kubegpu-sim 2>/dev/null); echo END"


def kubegpu(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, k8s.ApiClient]]:
    try:
        find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
        raise
    if containerd2_bin_dir() is None:
        missing_component("containerd 2.x is not built: run `bash tests/containerd/build.sh`")
    _require_node_tools()
    state = tmp_path_factory.mktemp("nri-e2e")
    up = kubegpu("up", "--state-dir", str(state), "--no-workload", "--containerd", "2", "--front", "nri")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        api = new_client_from_config(str(state / "control-plane" / "admin.kubeconfig"))
        try:
            ensure_namespace(k8s.CoreV1Api(api), NAMESPACE)
            yield state, api
        finally:
            api.close()
    finally:
        down = kubegpu("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr


def pod(
    name: str,
    gpus: int = 0,
    *,
    env: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "kubegpu",
        "hostNetwork": True,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "app",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", f"{SHOW}; sleep 1000000"],
                "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
            }
        ],
    }
    if node is not None:
        spec["nodeName"] = node  # bound past the scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations or {}},
        "spec": spec,
    }


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def output(core: k8s.CoreV1Api, name: str) -> str:
    def read() -> str:
        try:
            text = core.read_namespaced_pod_log(name, NAMESPACE)
        except k8s.ApiException:
            return ""
        return text if text and "END" in text else ""

    return wait_for(f"{name}'s output", read)


def refusal(core: k8s.CoreV1Api, name: str, text: str) -> str:
    """The message of the pod's event (kubelet's Failed, from containerd's create error) with text."""

    def find() -> str:
        for event in core.list_namespaced_event(NAMESPACE).items:
            if event.involved_object.name == name and text in (event.message or ""):
                return event.message
        return ""

    try:
        return wait_for(f"an event on {name} containing {text!r}", find)
    except AssertionError:
        seen = [
            e.message for e in core.list_namespaced_event(NAMESPACE).items if e.involved_object.name == name
        ]
        raise AssertionError(f"no event on {name} containing {text!r}; its events: {seen}") from None


def test_the_nri_front_honours_allocations_and_refuses_what_the_proxy_refuses(
    cluster: tuple[Path, k8s.ApiClient],
) -> None:
    state, api = cluster
    core = k8s.CoreV1Api(api)
    keys = verifying_keys(state / "keys" / "node")

    core.create_namespaced_pod(NAMESPACE, pod("two", 2, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    log = output(core, "two")
    placed = core.read_namespaced_pod("two", NAMESPACE)
    allocation = verify(placed.metadata.annotations[ANNOTATION], keys)
    devices = sorted(allocation.containers["app"].devices)
    assert len(devices) == 2
    visible = next(line for line in log.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES="))
    assert sorted(visible.split("=", 1)[1].split(",")) == devices, log
    seen = next(line for line in log.splitlines() if line.startswith("SEES"))
    assert len(seen.split()) == 1 + 2, log

    forged = {ANNOTATION: placed.metadata.annotations[ANNOTATION].replace('"node"', '"nod"')}
    core.create_namespaced_pod(NAMESPACE, pod("forged", 2, annotations=forged, node=NODE))
    assert "pod nri-e2e/forged" in refusal(core, "forged", "signature does not verify")
    core.create_namespaced_pod(NAMESPACE, pod("no-allocation", 2, node=NODE))
    assert "carries no kubegpu allocation" in refusal(core, "no-allocation", "allocation")
    replay = {ANNOTATION: placed.metadata.annotations[ANNOTATION]}
    core.create_namespaced_pod(NAMESPACE, pod("replay", 2, annotations=replay, node=NODE))
    assert "allocation is for pod UID" in refusal(core, "replay", "allocation is for pod UID")
    for name in ("forged", "no-allocation", "replay"):
        assert core.read_namespaced_pod(name, NAMESPACE).status.phase == "Pending"
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    wait_for(  # kubelet counts their GPUs until they are gone
        "the refused pods to go",
        lambda: (
            not {"forged", "no-allocation", "replay"}
            & {p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items}
        ),
    )

    # signed with the cluster's own key, so only the node's checks can refuse these
    signer = load_keys(state / "keys" / "scheduler", allow_private=True).private
    key_id, key = next(iter(signer.items()))

    def bound_with(name: str, node: str, gpus: list[str]) -> None:
        """A pod no scheduler serves, given an allocation signed for it, then bound to NODE."""
        body = pod(name, len(gpus))
        body["spec"]["schedulerName"] = "nobody"
        core.create_namespaced_pod(NAMESPACE, body)
        uid = core.read_namespaced_pod(name, NAMESPACE).metadata.uid
        allocation = Allocation(node, uid, {"app": ContainerAllocation(tuple(gpus))})
        annotations = {ANNOTATION: sign(allocation, key_id, key)}
        core.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": annotations}})
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        core.create_namespaced_pod_binding(name, NAMESPACE, binding, _preload_content=False).release_conn()

    bound_with("other-node", "kubegpu-node-9", devices[:1])
    assert "kubegpu-node-9" in refusal(core, "other-node", "kubegpu-node-9")
    bound_with("double", NODE, devices[:1])
    assert devices[0] in refusal(core, "double", devices[0])

    mount = pod("toolkit-mount")
    mount["spec"]["volumes"] = [{"name": "grab", "hostPath": {"path": "/tmp"}}]
    mount["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "grab", "mountPath": "/var/run/nvidia-container-devices/all"}
    ]
    mount["spec"]["containers"][0]["command"] = [
        "/bin/sh",
        "-c",
        "ls /var/run/nvidia-container-devices 2>&1; echo END; sleep 1000000",
    ]
    core.create_namespaced_pod(NAMESPACE, mount)
    assert "No such file or directory" in output(core, "toolkit-mount")

    core.create_namespaced_pod(NAMESPACE, pod("plain", env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    log = output(core, "plain")
    assert "NVIDIA_VISIBLE_DEVICES=void" in log, log
    assert next(line for line in log.splitlines() if line.startswith("SEES")).split() == ["SEES"], log
