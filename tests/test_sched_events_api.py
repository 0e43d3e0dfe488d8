"""Side by side with kube-scheduler v1.37 on one real apiserver: a pod placed by kubegpu looks, to
``kubectl describe pod`` and ``kubectl get events``, as one placed by kube-scheduler (issue 23).

Each scheduler gets its own world: a namespace and a node of 2 CPUs. In each, the same pods: ``low``
(1.5 CPU, low priority) is placed; ``nowhere`` (64 CPUs) fits nowhere; ``high`` (1.5 CPU, high
priority) preempts ``low``. Then, for both: the ``Scheduled`` Event of ``low``, the
``FailedScheduling`` Event and ``PodScheduled`` condition of ``nowhere``, the ``Preempted`` Event of
``low`` and the ``nominatedNodeName`` of ``high`` have the same shape (reason, type, action, reporting
controller and instance, regarding / related, message with the names put in, events.k8s.io/v1
fields), and the field selectors of ``kubectl get events`` and of the events.k8s.io API find them.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from kubernetes import client as k8s

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION
from kubegpu.devenv.controlplane import MERGE_PATCH, ControlPlane, create_fake_node, ensure_namespace
from tests.fixtures.common import missing_component
from tests.support.kuberules import both_schedulers
from tests.support.schedtrial import wait_for
from tests.support.schedworld import gpu_id, inventory_json, now_stamp

pytestmark = pytest.mark.apiserver
WORLDS = ("ks", "kg")  # kube-scheduler's, kubegpu's
TIMEOUT = 60.0
HOLD = "kubegpu.io/test-hold"


@dataclass(frozen=True)
class World:
    """One scheduler's namespace and node."""

    scheduler: str
    namespace: str
    node: str


@dataclass(frozen=True)
class Run:
    """Both worlds after every step, and the APIs to read them."""

    worlds: dict[str, World]
    core: k8s.CoreV1Api
    events: k8s.EventsV1Api
    kubectl: Callable[..., Any]


def pod(name: str, cpu: str, world: World, priority_class: str) -> dict[str, Any]:
    """A pod of ``world``; ``low`` carries a finalizer: preempted, it stays terminating (no kubelet
    finishes it), so ``high`` stays nominated and is not bound."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "finalizers": [HOLD] if name == "low" else []},
        "spec": {
            "schedulerName": world.scheduler,
            "priorityClassName": priority_class,
            "nodeSelector": {"kubernetes.io/hostname": world.node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "busybox", "resources": {"requests": {"cpu": cpu}}}],
        },
    }


def node(core: k8s.CoreV1Api, name: str) -> None:
    """A node both schedulers use: 2 CPUs, one GPU in kubegpu's inventory, a fresh heartbeat."""
    capacity = {"cpu": "2", "memory": "8Gi", "pods": "110", "nvidia.com/gpu": "1"}
    create_fake_node(core, name, labels={"kubernetes.io/hostname": name}, capacity=capacity)
    annotations = {
        INVENTORY_ANNOTATION: inventory_json([(gpu_id(name, 0), True)]),
        HEARTBEAT_ANNOTATION: now_stamp(),
    }
    core.patch_node(name, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH)


def bound(core: k8s.CoreV1Api, world: World, name: str) -> str | None:
    return core.read_namespaced_pod(name, world.namespace).spec.node_name


def nominated(core: k8s.CoreV1Api, world: World, name: str) -> str | None:
    return core.read_namespaced_pod(name, world.namespace).status.nominated_node_name


def refused(core: k8s.CoreV1Api, world: World, name: str) -> bool:
    """The pod's PodScheduled condition says False."""
    conditions = core.read_namespaced_pod(name, world.namespace).status.conditions or []
    return any(c.type == "PodScheduled" and c.status == "False" for c in conditions)


def core_events(run: Run, world: str, pod_name: str, reason: str) -> list[k8s.CoreV1Event]:
    selector = f"involvedObject.name={pod_name},reason={reason}"
    return run.core.list_namespaced_event(run.worlds[world].namespace, field_selector=selector).items


@pytest.fixture(scope="module")
def run(control_plane: ControlPlane, admin_api: k8s.ApiClient) -> Iterator[Run]:
    """Both schedulers on their worlds, every pod submitted and decided."""
    core, scheduling = k8s.CoreV1Api(admin_api), k8s.SchedulingV1Api(admin_api)
    tag = uuid.uuid4().hex[:6]
    worlds = {w: World(f"{w}-{tag}", f"ev-{tag}-{w}", f"ev-{tag}-{w}-node") for w in WORLDS}
    classes = {"low": f"ev-{tag}-low", "high": f"ev-{tag}-high"}
    for level, value in (("low", 1000), ("high", 2000)):
        scheduling.create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
             "metadata": {"name": classes[level]}, "value": value}
        )
    for world in worlds.values():
        ensure_namespace(core, world.namespace)
        node(core, world.node)
    kubectl_path = control_plane.binaries.scheduler.parent / "kubectl"
    if not kubectl_path.exists():
        missing_component(f"kubectl not found beside kube-scheduler ({kubectl_path})")

    def kubectl(*args: str) -> Any:
        done = subprocess.run(
            [str(kubectl_path), "--kubeconfig", str(control_plane.admin_kubeconfig), *args, "-o", "json"],
            capture_output=True, text=True, timeout=30, check=True,
        )
        return json.loads(done.stdout)

    try:
        with both_schedulers(control_plane, admin_api, worlds["ks"].scheduler, worlds["kg"].scheduler):
            for world in worlds.values():
                core.create_namespaced_pod(world.namespace, pod("low", "1500m", world, classes["low"]))
            for world in worlds.values():
                wait_for(partial(bound, core, world, "low"), f"low bound in {world.namespace}", TIMEOUT)
                core.create_namespaced_pod(world.namespace, pod("nowhere", "64", world, classes["low"]))
            for world in worlds.values():
                nowhere = partial(refused, core, world, "nowhere")
                wait_for(nowhere, f"nowhere refused in {world.namespace}", TIMEOUT)
                core.create_namespaced_pod(world.namespace, pod("high", "1500m", world, classes["high"]))
            result = Run(worlds, core, k8s.EventsV1Api(admin_api), kubectl)
            for world in WORLDS:
                for name, reason in (
                    ("low", "Scheduled"), ("nowhere", "FailedScheduling"), ("low", "Preempted")
                ):
                    found = partial(core_events, result, world, name, reason)
                    wait_for(found, f"{reason} Event of {name} in {world}", TIMEOUT)
                high = partial(nominated, core, worlds[world], "high")
                wait_for(high, f"high nominated in {world}", TIMEOUT)
            yield result
    finally:
        for world in worlds.values():
            for held in core.list_namespaced_pod(world.namespace).items:
                if held.metadata.finalizers:
                    patch = {"metadata": {"finalizers": None}}
                    core.patch_namespaced_pod(held.metadata.name, world.namespace, patch)
            core.delete_namespace(world.namespace)
            core.delete_node(world.node)
        for name in classes.values():
            scheduling.delete_priority_class(name)


def shape(event: k8s.CoreV1Event, world: World, **names: str) -> dict[str, Any]:
    """What must be alike: every field, the schedulers' names and the objects' names and uids in the
    message (in the order given), the reporting instance and the Event's name replaced by
    placeholders."""
    message = event.message or ""
    for placeholder, value in names.items():
        message = message.replace(value, f"<{placeholder}>")
    regarding = event.involved_object
    return {
        "type": event.type,
        "reason": event.reason,
        "action": event.action,
        "message": message,
        "reportingComponent": event.reporting_component.replace(world.scheduler, "<scheduler>"),
        "reportingInstance": event.reporting_instance.replace(world.scheduler, "<scheduler>"),
        "source": (event.source.component, event.source.host) if event.source else None,
        "name": re.sub(r"^(\w+)\.[0-9a-f]{12,}$", r"\1.<nanos>", event.metadata.name),
        "regarding": (
            regarding.api_version,
            regarding.kind,
            regarding.name,
            regarding.namespace == world.namespace,
            bool(regarding.uid),
            bool(regarding.resource_version),
        ),
        "related": (event.related.kind, event.related.name) if event.related else None,
        "eventTime": event.event_time is not None,
        "legacy": (event.count, event.first_timestamp, event.last_timestamp, event.series),
    }


def both(run: Run, pod_name: str, reason: str) -> dict[str, dict[str, Any]]:
    shapes = {}
    for name, world in run.worlds.items():
        events = core_events(run, name, pod_name, reason)
        assert len(events) == 1, f"{name}: {len(events)} {reason} Events of {pod_name}: {events}"
        high = run.core.read_namespaced_pod("high", world.namespace)
        shapes[name] = shape(events[0], world, node=world.node, namespace=world.namespace,
                             preemptor=high.metadata.uid)
    return shapes


def test_the_scheduled_event_is_kube_schedulers(run: Run) -> None:
    shapes = both(run, "low", "Scheduled")
    assert shapes["kg"] == shapes["ks"]
    assert shapes["kg"]["message"] == "Successfully assigned <namespace>/low to <node>"
    assert shapes["kg"]["reportingInstance"] == f"<scheduler>-{socket.gethostname()}"
    assert (shapes["kg"]["action"], shapes["kg"]["eventTime"]) == ("Binding", True)


def test_the_failed_scheduling_event_is_kube_schedulers(run: Run) -> None:
    shapes = both(run, "nowhere", "FailedScheduling")
    messages = {world: s.pop("message") for world, s in shapes.items()}
    assert shapes["kg"] == shapes["ks"]
    for message in messages.values():  # the node counts differ: other modules' nodes, kubegpu's exclusions
        assert re.match(r"0/\d+ nodes are available: .*1 Insufficient cpu", message), message


def test_the_pod_scheduled_condition_is_kube_schedulers(run: Run) -> None:
    conditions = {}
    for name, world in run.worlds.items():
        for pod_name in ("low", "nowhere"):
            found = run.core.read_namespaced_pod(pod_name, world.namespace)
            [condition] = [c for c in found.status.conditions or [] if c.type == "PodScheduled"]
            conditions[name, pod_name] = (
                condition.status,
                condition.reason,
                condition.observed_generation == found.metadata.generation,
                condition.last_transition_time is not None,
                condition.last_probe_time is not None,
                (condition.message or "")[:2],
            )
    for pod_name in ("low", "nowhere"):
        assert conditions["kg", pod_name] == conditions["ks", pod_name], pod_name
    assert conditions["kg", "nowhere"][:2] == ("False", "Unschedulable")


def test_preemption_looks_like_kube_schedulers(run: Run) -> None:
    shapes = both(run, "low", "Preempted")
    assert shapes["kg"] == shapes["ks"]
    assert shapes["kg"]["message"] == "Preempted by pod <preemptor> on node <node>"
    assert shapes["kg"]["related"] is None  # kube-scheduler v1.37.2's names no related object
    for world in run.worlds.values():
        assert run.core.read_namespaced_pod("high", world.namespace).status.nominated_node_name == world.node


@pytest.mark.parametrize(
    "selector",
    [
        "involvedObject.name=low,reason=Scheduled",
        "source={scheduler},type=Normal,involvedObject.kind=Pod,reason=Scheduled",
        "reportingComponent={scheduler},reason=Scheduled",
        "involvedObject.name=nowhere,type=Warning,reason=FailedScheduling",
    ],
)
def test_kubectl_get_events_field_selectors_find_both(run: Run, selector: str) -> None:
    for world in run.worlds.values():
        found = run.kubectl("get", "events", "-n", world.namespace,
                            "--field-selector", selector.format(scheduler=world.scheduler))
        assert len(found["items"]) == 1, (world.scheduler, selector, found["items"])


def test_the_events_api_field_selectors_find_both(run: Run) -> None:
    for world in run.worlds.values():
        selector = f"regarding.name=low,reportingController={world.scheduler},reason=Scheduled"
        [event] = run.events.list_namespaced_event(world.namespace, field_selector=selector).items
        assert (event.note, event.action) == (f"Successfully assigned {world.namespace}/low to {world.node}",
                                              "Binding")

