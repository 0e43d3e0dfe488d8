"""A Trial (tests/test_scheduler_api.py) for the affinity and preemption tests against the real
apiserver: scheduler replicas started and stopped for the test, zoned nodes, labelled pods with
any spec fields, priority classes, and a stand-in for the kubelet finishing evicted pods."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from scheduler.live.scheduler import Scheduler
from tests.test_scheduler_api import Trial, advertise, gpu_pod

ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"


def make_trial(
    admin_api: k8s.ApiClient, namespace: str, state: Path, start: Callable[..., Scheduler]
) -> Trial:
    return Trial(k8s.CoreV1Api(admin_api), namespace, state, start)


def zoned_node(trial: Trial, prefix: str, zone: str, topology: str = "pcie-4gpu") -> str:
    """A node of this trial in ``zone``, labelled with its hostname."""
    name = f"{prefix}-{trial.run}"
    advertise(trial.core, name, topology, trial.state, labels={"run": trial.run, ZONE: zone, HOST: name})
    return name


def create(
    trial: Trial,
    name: str,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> str:
    """A pod of this trial's scheduler on its nodes, with ``labels`` and extra ``spec`` fields."""
    body = gpu_pod(
        trial.namespace,
        name,
        gpus,
        scheduler=trial.name,
        selector={"run": trial.run},
        annotations=annotations,
    )
    body["metadata"]["labels"] = labels or {}
    body["spec"].update(spec)
    trial.core.create_namespaced_pod(trial.namespace, body)
    return name


@contextlib.contextmanager
def priority_classes(api: k8s.ApiClient, run: str, **values: int) -> Iterator[dict[str, str]]:
    """Cluster-wide PriorityClasses ``<name>-<run>`` with these values; deleted on exit."""
    scheduling = k8s.SchedulingV1Api(api)
    names = {}
    for name, value in values.items():
        full = f"{name}-{run}"
        scheduling.create_priority_class(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": full},
                "value": value,
            }
        )
        names[name] = full
    try:
        yield names
    finally:
        for full in names.values():
            with contextlib.suppress(Exception):
                scheduling.delete_priority_class(full)


@contextlib.contextmanager
def kubelet_stand_in(core: k8s.CoreV1Api, namespace: str) -> Iterator[list[str]]:
    """What kubelets do for terminating pods, done for ``namespace`` (there is no kubelet here):
    a pod given a deletionTimestamp is removed at once. Yields the names it removed."""
    stop = threading.Event()
    removed: list[str] = []

    def loop() -> None:
        while not stop.wait(0.2):
            try:
                for pod in core.list_namespaced_pod(namespace).items:
                    if pod.metadata.deletion_timestamp is not None:
                        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
                        removed.append(pod.metadata.name)
            except Exception:  # the pod went meanwhile, or the namespace is going: try again
                continue

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield removed
    finally:
        stop.set()
        thread.join(timeout=5)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
