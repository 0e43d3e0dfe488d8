"""Gang scheduling end to end on `kubegpu up --nodes 2` (issue #21): two real nodes (kubelet ->
shim -> containerd each, 8 simulated GPUs each), the kubegpu scheduler as its ServiceAccount.

A group of two 8-GPU workers fits only across both nodes: both run, each container sees exactly
its node's 8 allocated devices. A competing group of the same shape then finds no room: neither of
its workers starts, its PodGroup gets a Timeout Event after its scheduleTimeoutSeconds, and once the
first group is deleted it runs whole."""

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

from kubegpu.allocation import ANNOTATION, verify
from kubegpu.devenv.containerd import BUSYBOX_IMAGE
from kubegpu.devenv.controlplane import BinariesMissing, ensure_namespace
from kubegpu.localcluster.cluster import find_cluster_binaries, verifying_keys
from scheduler.live.podgroups import PLUGINS_API, PLUGINS_LABEL, PLUGINS_VERSION, PLURAL
from tests.fixtures.common import missing_component
from tests.fixtures.localcluster import _require_node_tools

pytestmark = pytest.mark.node

NAMESPACE = "gang-e2e"
NODES = ["kubegpu-node", "kubegpu-node-2"]
SHOW = "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; echo SEES $(ls /dev/kubegpu-sim 2>/dev/null)"


def kubegpu(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubegpu", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, k8s.ApiClient]]:
    """`kubegpu up --nodes 2` in a state directory of its own; `kubegpu down` after the module."""
    try:
        find_cluster_binaries()
    except BinariesMissing as exc:
        missing_component(str(exc))
        raise
    _require_node_tools()
    state = tmp_path_factory.mktemp("gang-e2e")
    up = kubegpu("up", "--state-dir", str(state), "--no-workload", "--nodes", "2")
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


def worker(name: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {PLUGINS_LABEL: group}},
        "spec": {
            "schedulerName": "kubegpu",
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", f"{SHOW}; sleep 1000000"],
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }


def pod_group(name: str, timeout_seconds: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{PLUGINS_API}/{PLUGINS_VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minMember": 2, "scheduleTimeoutSeconds": timeout_seconds},
    }


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def running(core: k8s.CoreV1Api, names: list[str]) -> dict[str, k8s.V1Pod] | None:
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    if all(n in pods and pods[n].status.phase == "Running" for n in names):
        return {n: pods[n] for n in names}
    return None


def test_a_group_across_two_real_nodes_a_competitor_and_its_timeout(
    cluster: tuple[Path, k8s.ApiClient],
) -> None:
    state, api = cluster
    core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
    keys = verifying_keys(state / "keys" / "node")
    custom.create_namespaced_custom_object(
        PLUGINS_API, PLUGINS_VERSION, NAMESPACE, PLURAL, pod_group("train", 60)
    )
    for name in ("train-0", "train-1"):
        core.create_namespaced_pod(NAMESPACE, worker(name, "train"))
    pods = wait_for("both workers running", lambda: running(core, ["train-0", "train-1"]))
    assert sorted(p.spec.node_name for p in pods.values()) == NODES
    for name, pod in pods.items():
        allocation = verify(pod.metadata.annotations[ANNOTATION], keys)
        devices = allocation.containers["app"].devices
        assert allocation.node == pod.spec.node_name and len(devices) == 8
        log = wait_for(
            f"{name}'s device listing",
            lambda name=name: "SEES" in (text := core.read_namespaced_pod_log(name, NAMESPACE)) and text,
        )
        visible = next(line for line in log.splitlines() if line.startswith("NVIDIA_VISIBLE_DEVICES="))
        assert sorted(visible.split("=", 1)[1].split(",")) == sorted(devices), log
        seen = next(line for line in log.splitlines() if line.startswith("SEES"))
        assert len(seen.split()) == 1 + 8, log

    custom.create_namespaced_custom_object(
        PLUGINS_API, PLUGINS_VERSION, NAMESPACE, PLURAL, pod_group("next", 5)
    )
    for name in ("next-0", "next-1"):
        core.create_namespaced_pod(NAMESPACE, worker(name, "next"))

    def timeout_event() -> k8s.CoreV1Event | None:
        for event in core.list_namespaced_event(NAMESPACE).items:
            if event.involved_object.kind == "PodGroup" and event.involved_object.name == "next":
                if event.reason == "Timeout":
                    return event
        return None

    event = wait_for("the competing group's Timeout Event", timeout_event, timeout=120)
    assert "timed out after" in event.message and "only 0 of its 2 minimum members fit" in event.message
    waiting = {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(NAMESPACE).items}
    assert waiting["next-0"] is None and waiting["next-1"] is None
    train = wait_for(
        "train's status Running",
        lambda: (
            (
                s := custom.get_namespaced_custom_object(
                    PLUGINS_API, PLUGINS_VERSION, NAMESPACE, PLURAL, "train"
                ).get("status", {})
            ).get("phase")
            == "Running"
            and s
        ),
    )
    assert train["running"] == 2 and train["scheduled"] == 2

    for name in ("train-0", "train-1"):
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
    pods = wait_for("the competing group running whole", lambda: running(core, ["next-0", "next-1"]))
    assert sorted(p.spec.node_name for p in pods.values()) == NODES
