"""Side by side with kube-scheduler: two identical small worlds of fake Nodes per case, the same
pods submitted to each, one world's pods scheduled by kube-scheduler, the other's by kubegpu.

A case (``Case``) names its nodes (``N``) and pods (``P``). ``Worlds.create`` makes, for each case
and each world (``ks`` for kube-scheduler, ``kg`` for kubegpu), the case's nodes labelled with the
case and the world (kubegpu's inventory and heartbeat annotations on every node, so both schedulers
see the same cluster) and a namespace of their own (pod rules look at one namespace). Every pod
selects its world's nodes of its case by ``nodeSelector``; the kubegpu world's node names end in
``-kg``, the other's in ``-ks``.

Pods are submitted in steps (``P.step``); a step is submitted once every pod of the steps before
it is decided (bound, or its ``PodScheduled`` condition says why not). A pod ``by="self"`` asks
for its world's scheduler, ``by="other"`` for the other world's (a pod bound by the other
scheduler, which this world's scheduler must charge), ``by="none"`` is created bound to
``P.node`` (a pod nobody scheduled).

``reasons`` reads the ``0/N nodes are available: ...`` message both schedulers write into the
condition (kube-scheduler then adds ``preemption: ...``) as reason -> node count.
"""

from __future__ import annotations

import copy
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION, publication
from kubegpu.allocation import KeyRing
from kubegpu.devenv.controlplane import MERGE_PATCH, ControlPlane, create_fake_node, ensure_namespace
from scheduler.live.config import SchedulerConfig
from scheduler.live.scheduler import Scheduler
from tests.fixtures.keys import SIGNING
from tests.support.rdmainv import Pf, rdma_inventory
from tests.support.schedworld import gpu_id, inventory_json, now_stamp

WORLDS = ("ks", "kg")  # kube-scheduler's world, kubegpu's world
CASE_LABEL = "rules.kubegpu.io/case"
WORLD_LABEL = "rules.kubegpu.io/world"
NODE_LABEL = "rules.kubegpu.io/node"  # the node's short name within its case
RUN_LABEL = "rules.kubegpu.io/run"
HOSTNAME = "kubernetes.io/hostname"
SELECTOR_REASON = "node(s) didn't match Pod's node affinity/selector"
# Reasons that also count nodes outside the pod's world, which each scheduler sees differently:
# kube-scheduler counts a foreign node under a taint or a cordon before the selector, kubegpu
# under the selector first (its filter order) or as a node it does not use at all.
NOT_COUNTED = (
    SELECTOR_REASON,
    "untolerated taint",
    "node(s) were unschedulable",
    "node has no kubegpu device inventory",
    "heartbeat",
    "unreadable",
)
UNSCHEDULABLE = None  # P.expect: no node takes the pod
ANYWHERE = "*"  # P.expect: bound, to whichever node


@dataclass(frozen=True)
class N:
    """A node of a case: its short name, allocatable figures (a figure None: the node does not
    list it), GPUs, NICs, labels, taints, cordon."""

    name: str
    capacity: Mapping[str, str | None] = field(default_factory=dict)
    gpus: int = 0
    nics: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    cordoned: bool = False


@dataclass(frozen=True)
class P:
    """A pod of a case: ``spec`` is merged over a one-container pod asking 100m CPU and 64Mi;
    ``expect`` is the node's short name, ``UNSCHEDULABLE`` or ``ANYWHERE``; ``reason`` a text
    the FailedScheduling message of an unschedulable pod holds, in both schedulers' messages;
    ``status`` is written over a pod ``by="none"`` once created (its phase, container statuses)."""

    name: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    step: int = 1
    by: str = "self"  # "self", "other" (the other world's scheduler) or "none" (bound to ``node``)
    node: str = ""
    expect: str | None = ANYWHERE
    reason: str = ""
    status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Case:
    """One rule's check: its nodes and pods (the test pods are those ``by="self"``)."""

    name: str
    rule: str  # kube-scheduler's plugin whose rule this case checks
    nodes: tuple[N, ...]
    pods: tuple[P, ...]

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9-]{1,24}", self.name):
            raise ValueError(f"case name {self.name!r}: lowercase letters, digits, dashes, at most 24")


def container(
    name: str = "app",
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A container asking ``requests`` (default 100m CPU, 64Mi) and ``limits``."""
    resources: dict[str, Any] = {
        "requests": dict({"cpu": "100m", "memory": "64Mi"} if requests is None else requests)
    }
    if limits:
        resources["limits"] = dict(limits)
    return {"name": name, "image": "busybox", "resources": resources, **extra}


def taint(key: str, value: str = "", effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def reasons(message: str) -> dict[str, int]:
    """``0/5 nodes are available: 1 Insufficient cpu, 4 node(s) ... . preemption: ...`` as
    {"Insufficient cpu": 1, ...}; {} when the message is no such sentence."""
    match = re.match(r"0/\d+ nodes are available: (.*?)\.(?: |$)", message)
    if not match:
        return {}
    out: dict[str, int] = {}
    for part in match.group(1).split(", "):
        count, _, text = part.partition(" ")
        if count.isdigit():
            out[text] = out.get(text, 0) + int(count)
    return out


def comparable(found: Mapping[str, int]) -> dict[str, int]:
    """The reasons only the pod's own world's nodes can give (see NOT_COUNTED)."""
    return {k: v for k, v in found.items() if not any(skip in k for skip in NOT_COUNTED)}


@dataclass
class Decision:
    """What a scheduler did with a pod: the node's short name, or why no node took it."""

    node: str | None
    message: str = ""

    def describe(self) -> str:
        return f"bound to {self.node}" if self.node else f"unschedulable: {self.message!r}"


class Worlds:
    """The cases' nodes, namespaces and pods in one apiserver, for two schedulers."""

    def __init__(self, core: k8s.CoreV1Api, cases: Iterable[Case], schedulers: Mapping[str, str]) -> None:
        self.core = core
        self.cases = {case.name: case for case in cases}
        self.schedulers = dict(schedulers)  # world -> schedulerName
        self.run = uuid.uuid4().hex[:5]

    def node_name(self, case: str, node: str, world: str) -> str:
        return f"kr{self.run}-{case}-{node}-{world}"

    def namespace(self, case: str, world: str) -> str:
        return f"kr{self.run}-{case}-{world}"

    def create(self) -> None:
        """Every case's nodes and namespaces, in both worlds."""
        for case in self.cases.values():
            for world in WORLDS:
                ensure_namespace(self.core, self.namespace(case.name, world))
                for node in case.nodes:
                    self._create_node(case.name, node, world)

    def _create_node(self, case: str, node: N, world: str) -> None:
        name = self.node_name(case, node.name, world)
        capacity = dict(node.capacity)
        gpus = [(gpu_id(name, i), True) for i in range(node.gpus)]
        inventory = inventory_json(gpus)
        if node.nics:  # ``nics`` RDMA interfaces: VFs of one PF, what kubegpu.io/rdma counts and a pod gets
            pf = Pf("mlx5_0", 100, vfs=node.nics)
            inventory = publication(rdma_inventory(name, [i // 4 for i in range(node.gpus)], [pf])).inventory
        if node.gpus:
            capacity.setdefault("nvidia.com/gpu", str(node.gpus))
        if node.nics:
            capacity.setdefault("kubegpu.io/rdma", str(node.nics))
        labels = {CASE_LABEL: case, WORLD_LABEL: world, NODE_LABEL: node.name, HOSTNAME: name, **node.labels}
        create_fake_node(self.core, name, labels=labels, capacity=capacity)  # type: ignore[arg-type]
        patch: dict[str, Any] = {
            "metadata": {
                "annotations": {
                    INVENTORY_ANNOTATION: inventory,
                    HEARTBEAT_ANNOTATION: now_stamp(),
                }
            },
            "spec": {
                "taints": [dict(t) for t in node.taints] or None,
                "unschedulable": node.cordoned or None,
            },
        }
        self.core.patch_node(name, patch, _content_type=MERGE_PATCH)

    def delete_nodes(self) -> None:
        """Remove every case's nodes (a cordoned or tainted one would stay in other tests' counts)."""
        for case in self.cases.values():
            for world in WORLDS:
                for node in case.nodes:
                    self.core.delete_node(self.node_name(case.name, node.name, world))

    def manifest(self, case: str, pod: P, world: str) -> dict[str, Any]:
        """The pod as submitted to ``world``."""
        spec: dict[str, Any] = {"containers": [container()], "terminationGracePeriodSeconds": 0}
        spec.update(copy.deepcopy(dict(pod.spec)))
        selector = dict(spec.get("nodeSelector") or {})
        selector.update({CASE_LABEL: case, WORLD_LABEL: world})
        spec["nodeSelector"] = selector
        other = WORLDS[1 - WORLDS.index(world)]
        if pod.by == "none":
            spec["nodeName"] = self.node_name(case, pod.node, world)
        else:
            spec["schedulerName"] = self.schedulers[world if pod.by == "self" else other]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod.name, "labels": {RUN_LABEL: self.run, **pod.labels}},
            "spec": spec,
        }

    def submit(self, step: int) -> list[tuple[str, str, str]]:
        """Create every pod of ``step`` in both worlds; returns their (case, world, pod)."""
        made = []
        for case in self.cases.values():
            for pod in case.pods:
                if pod.step != step:
                    continue
                for world in WORLDS:
                    namespace = self.namespace(case.name, world)
                    self.core.create_namespaced_pod(namespace, self.manifest(case.name, pod, world))
                    if pod.status:
                        self.core.patch_namespaced_pod_status(
                            pod.name, namespace, {"status": copy.deepcopy(dict(pod.status))}
                        )
                    made.append((case.name, world, pod.name))
        return made

    def decisions(self) -> dict[tuple[str, str, str], Decision | None]:
        """(case, world, pod) -> its decision so far (None: not decided yet), for every pod."""
        out: dict[tuple[str, str, str], Decision | None] = {}
        pods = self.core.list_pod_for_all_namespaces(label_selector=f"{RUN_LABEL}={self.run}").items
        for pod in pods:
            namespace = pod.metadata.namespace
            case, world = namespace.removeprefix(f"kr{self.run}-").rsplit("-", 1)
            key = (case, world, pod.metadata.name)
            if pod.spec.node_name:
                prefix = f"kr{self.run}-{case}-"
                out[key] = Decision(pod.spec.node_name.removeprefix(prefix).removesuffix(f"-{world}"))
                continue
            conditions = [c for c in (pod.status.conditions or []) if c.type == "PodScheduled"]
            if conditions and conditions[0].status == "False" and conditions[0].message:
                out[key] = Decision(None, conditions[0].message)
            else:
                out[key] = None
        return out

    def settle(self, keys: Iterable[tuple[str, str, str]], timeout: float) -> None:
        """Wait until every pod of ``keys`` is decided (or ``timeout`` seconds passed)."""
        wanted = set(keys)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.decisions()
            if all(found.get(key) is not None for key in wanted):
                return
            time.sleep(0.5)

    def run_steps(self, timeout: float = 60) -> dict[tuple[str, str, str], Decision | None]:
        """Submit every step in order, each once the previous one is decided; the decisions."""
        steps = sorted({pod.step for case in self.cases.values() for pod in case.pods})
        for step in steps:
            made = self.submit(step)
            self.settle([key for key in made if self._pod(key).by != "none"], timeout)
        return self.decisions()

    def _pod(self, key: tuple[str, str, str]) -> P:
        case, _world, name = key
        return next(pod for pod in self.cases[case].pods if pod.name == name)


def compare(case: Case, pod: P, ks: Decision | None, kg: Decision | None) -> list[str]:
    """What differs between the two schedulers' decisions on ``pod`` (and between kube-scheduler
    and the case's expectation, which would make the case itself wrong); [] when they agree."""
    where = f"{case.name}/{pod.name} ({case.rule})"
    if ks is None or kg is None:
        return [f"{where}: undecided: kube-scheduler {ks and ks.describe()}, kubegpu {kg and kg.describe()}"]
    problems = []
    if pod.expect is UNSCHEDULABLE:
        wanted_ok = ks.node is None
    elif pod.expect == ANYWHERE:
        wanted_ok = ks.node is not None
    else:
        wanted_ok = ks.node == pod.expect
    if not wanted_ok:
        problems.append(f"{where}: the case expects {pod.expect!r} but kube-scheduler: {ks.describe()}")
    same_node = pod.expect not in (UNSCHEDULABLE, ANYWHERE)
    if (ks.node is None) != (kg.node is None) or (same_node and ks.node != kg.node):
        problems.append(f"{where}: kube-scheduler {ks.describe()}; kubegpu {kg.describe()}")
    elif ks.node is None:
        ks_reasons, kg_reasons = reasons(ks.message), reasons(kg.message)
        if pod.reason and not any(pod.reason in k for k in kg_reasons):
            problems.append(
                f"{where}: kubegpu's reasons lack {pod.reason!r}: {kg.message!r}"
                f" (kube-scheduler: {ks.message!r})"
            )
        if pod.reason and not any(pod.reason in k for k in ks_reasons):
            problems.append(f"{where}: kube-scheduler's reasons lack {pod.reason!r}: {ks.message!r}")
        if comparable(ks_reasons) != comparable(kg_reasons):
            problems.append(
                f"{where}: reasons differ: kube-scheduler {comparable(ks_reasons)},"
                f" kubegpu {comparable(kg_reasons)}"
            )
    return problems


@contextmanager
def both_schedulers(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, kube_name: str, kubegpu_name: str
) -> Iterator[None]:
    """The real kube-scheduler (profile ``kube_name``) and the live kubegpu scheduler
    (``kubegpu_name``, synced and leading) running for the block; both stopped after it."""
    kube = control_plane.start_scheduler({"profiles": [{"schedulerName": kube_name}]})
    config = SchedulerConfig(scheduler_name=kubegpu_name, heartbeat_stale_seconds=3600.0)
    kubegpu = Scheduler(config, admin_api, KeyRing(None, SIGNING), seed=7)
    thread = threading.Thread(target=kubegpu.run, daemon=True)
    try:
        kubegpu.start_watching()
        assert kubegpu.wait_synced(30)
        kubegpu.leading.set()
        thread.start()
        yield
    finally:
        kubegpu.stop()
        if thread.is_alive():
            thread.join(timeout=10)
        kube.stop()


@contextmanager
def side_by_side(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, worlds: Worlds, kube_name: str, kubegpu_name: str
) -> Iterator[dict[tuple[str, str, str], Decision | None]]:
    """The real kube-scheduler (``kube_name``) and the live kubegpu scheduler (``kubegpu_name``)
    started on the created ``worlds``; yields every step's decisions; stops both and deletes the
    worlds' nodes at the end (a cordoned node left behind would count in other modules' messages)."""
    try:
        with both_schedulers(control_plane, admin_api, kube_name, kubegpu_name):
            yield worlds.run_steps()
    finally:
        worlds.delete_nodes()
