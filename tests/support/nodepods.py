"""Pods for the end-to-end tests on a real node, and what their containers report about themselves.

Every test container runs ``report_script``: it prints its environment, a marker, the device
nodes it can see under /dev/kubegpu-sim and ``END``, then does what the test wants (sleep, exit,
serve). ``ContainerView.parse`` reads that back from the container's log (``kubectl logs``), and
``expected_view`` is what the signed allocation says the container must see.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from devices.sim import CONTAINER_DEV_DIR, sim_gpu_id
from kubegpu.allocation import ANNOTATION, Allocation, verify
from kubegpu.devenv.containerd import BUSYBOX_IMAGE
from kubegpu.localcluster.cluster import verifying_keys

DEVICES_MARKER = "--- devices ---"
END_MARKER = "--- end ---"
GPU_RESOURCE = "nvidia.com/gpu"
DEVICE_ENV_PREFIXES = ("NVIDIA_", "KUBEGPU_")


def report_script(then: str = "sleep 3600") -> str:
    """Shell: print env and visible sim devices between markers, then run ``then``."""
    return (f"env; echo '{DEVICES_MARKER}'; ls {CONTAINER_DEV_DIR} 2>/dev/null; "
            f"echo '{END_MARKER}'; {then}")


def container(name: str, gpus: int = 0, then: str = "sleep 3600", **extra: Any) -> dict[str, Any]:
    """A busybox container running ``report_script(then)``, asking for ``gpus`` whole GPUs."""
    spec: dict[str, Any] = {
        "name": name,
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", report_script(then)],
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}} if gpus else {},
    }
    spec.update(extra)
    return spec


def pod(
    name: str,
    containers: list[dict[str, Any]],
    selector: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    scheduler: str | None = "kubegpu",
    node_name: str | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    restart_policy: str = "Always",
) -> dict[str, Any]:
    """A host-network pod; scheduled by ``scheduler``, or bound by hand when ``node_name`` is set."""
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": restart_policy,
        "containers": containers,
        "enableServiceLinks": False,
    }
    if init_containers:
        spec["initContainers"] = init_containers
    if node_name:
        spec["nodeName"] = node_name
    else:
        spec["nodeSelector"] = dict(selector)
        if scheduler:
            spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": dict(annotations or {})}, "spec": spec}


def wait_pod(core: k8s.CoreV1Api, namespace: str, name: str, predicate: Any, what: str,
             timeout: float = 90) -> k8s.V1Pod:
    """Poll the pod until ``predicate(pod)`` holds; fail naming ``what`` and the pod's status."""
    deadline = time.monotonic() + timeout
    while True:
        found = core.read_namespaced_pod(name, namespace)
        if predicate(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {namespace}/{name} not {what} after {timeout}s: {found.status}")
        time.sleep(0.3)


def running(found: k8s.V1Pod) -> bool:
    statuses = found.status.container_statuses or []
    return found.status.phase == "Running" and bool(statuses) and all(s.state.running for s in statuses)


def wait_running(core: k8s.CoreV1Api, namespace: str, name: str, timeout: float = 90) -> k8s.V1Pod:
    return wait_pod(core, namespace, name, running, "running", timeout)


def allocation_of(found: k8s.V1Pod, keys_dir: Path) -> Allocation:
    """The pod's verified allocation (checked with the node's keys, as the shim checks it)."""
    value = (found.metadata.annotations or {}).get(ANNOTATION)
    assert value, f"pod {found.metadata.name} has no {ANNOTATION} annotation"
    return verify(value, verifying_keys(keys_dir))


def gpu_index(node: str, device: str) -> int:
    for index in range(64):
        if sim_gpu_id(node, index) == device:
            return index
    raise AssertionError(f"{device} is not a sim GPU of {node}")


@dataclass
class ContainerView:
    """What a container printed: its kubegpu/NVIDIA environment and the sim device nodes it saw."""

    env: dict[str, str] = field(default_factory=dict)
    devices: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, log: str) -> ContainerView:
        lines = log.splitlines()
        assert DEVICES_MARKER in lines and END_MARKER in lines, f"incomplete report:\n{log}"
        first = lines.index(DEVICES_MARKER)
        env = dict(line.split("=", 1) for line in lines[:first] if "=" in line)
        devices = lines[first + 1: lines.index(END_MARKER, first)]
        return cls(env=env, devices=sorted(devices))

    def device_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k.startswith(DEVICE_ENV_PREFIXES)}

    def gpu_ids_in_env(self) -> set[str]:
        """Every GPU id that appears anywhere in the device variables."""
        return {part.split(":")[0] for value in self.device_env().values()
                for part in value.split(",") if part.startswith("GPU-")}


def check_view(view: ContainerView, node: str, allocation: Allocation | None, container_name: str) -> None:
    """The container saw exactly its allocated devices, nothing more (or nothing at all)."""
    granted = allocation.containers.get(container_name) if allocation else None
    if granted is None:
        assert view.gpu_ids_in_env() == set(), f"{container_name} sees GPUs: {view.device_env()}"
        assert view.env.get("NVIDIA_VISIBLE_DEVICES", "void") == "void", view.device_env()
        assert view.devices == [], f"{container_name} sees device nodes {view.devices}"
        return
    devices = list(granted.devices)
    assert view.env.get("NVIDIA_VISIBLE_DEVICES", "").split(",") == devices, view.device_env()
    assert view.gpu_ids_in_env() == set(devices), view.device_env()
    assert view.devices == sorted(f"gpu{gpu_index(node, d)}" for d in devices)
    for device, share in granted.shares.items():
        shares = view.env.get("KUBEGPU_GPU_SHARES", "")
        assert f"{device}:{share.milli}" in shares, f"{container_name}: share {share} not in {shares!r}"


def read_view(core: k8s.CoreV1Api, namespace: str, name: str, container_name: str,
              timeout: float = 30) -> ContainerView:
    """The container's report, read through the API.

    The log can lag the Running state, and a kubelet that just restarted answers 404 until it
    knows the pod again: both are retried until ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            log = core.read_namespaced_pod_log(name, namespace, container=container_name)
        except k8s.ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            log = ""
        if END_MARKER in log.splitlines() or time.monotonic() > deadline:
            return ContainerView.parse(log)
        time.sleep(0.2)
