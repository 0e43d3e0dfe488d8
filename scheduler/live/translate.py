"""Translate between the API's JSON and the scheduling core: nodes, bound pods, allocations.

- A Node becomes a ``NodeState`` when its advertiser published an inventory (``kubegpu.io/
  inventory``), its heartbeat is fresh, it is not cordoned, and it is Ready-or-unknown (no kubelet
  in tests). CPU and memory come from ``status.allocatable``.
- A pod bound to a node uses CPU and memory there; if it carries a valid signed allocation it also
  holds those devices. That annotation is the source of truth for device usage.
- A core ``Allocation`` becomes the signed ``kubegpu.io/allocation`` annotation value.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crishim.advertiser import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION
from devices.model import NodeInventory
from kubegpu import allocation as contract
from scheduler.core.request import MILLI, Taint, TaintEffect
from scheduler.core.state import Allocation, GpuGrant, NodeState
from scheduler.live.podspec import PodSpecError, _cpu_memory


@dataclass(frozen=True)
class NodeFacts:
    """What the scheduler needs of a Node object, parsed once per change."""

    name: str
    cpu_milli: int
    memory_mib: int
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    inventory: NodeInventory | None
    heartbeat: dt.datetime | None
    cordoned: bool
    problem: str = ""  # why the node cannot take kubegpu pods, if it cannot

    def schedulable(self, now: dt.datetime, stale_after: float) -> str:
        """'' if kubegpu may place pods here now, else the reason (for FailedScheduling)."""
        if self.problem:
            return self.problem
        if self.cordoned:
            return "node is cordoned"
        if self.heartbeat is None or (now - self.heartbeat).total_seconds() > stale_after:
            return "node's device heartbeat is stale"
        return ""

    def signature(self) -> tuple:
        """Everything but the heartbeat: a change here means the node's state must be rebuilt."""
        return (
            self.cpu_milli,
            self.memory_mib,
            tuple(sorted(self.labels.items())),
            self.taints,
            self.inventory,
            self.cordoned,
            self.problem,
        )


def _quantity_or_zero(container_like: Mapping[str, Any]) -> tuple[int, int]:
    try:
        return _cpu_memory({"resources": {"requests": container_like}})
    except PodSpecError:
        return 0, 0


def parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    try:
        return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    annotations = meta.get("annotations") or {}
    cpu, memory = _quantity_or_zero(status.get("allocatable") or {})
    taints = tuple(
        Taint(t.get("key", ""), t.get("value") or "", TaintEffect(t.get("effect", "NoSchedule")))
        for t in spec.get("taints") or []
        if t.get("effect") in {e.value for e in TaintEffect}
    )
    inventory, problem = None, ""
    raw = annotations.get(INVENTORY_ANNOTATION)
    if raw is None:
        problem = "node has no kubegpu device inventory"
    else:
        try:
            doc = json.loads(raw)
            if doc.get("version") != 1:
                raise ValueError(f"unsupported inventory version {doc.get('version')!r}")
            inventory = NodeInventory.from_public(doc)
        except (ValueError, KeyError, TypeError) as error:
            problem = f"node's device inventory is unreadable: {str(error)[:120]}"
    return NodeFacts(
        name=meta.get("name", ""),
        cpu_milli=cpu,
        memory_mib=memory,
        labels=dict(meta.get("labels") or {}),
        taints=taints,
        inventory=inventory,
        heartbeat=parse_time(annotations.get(HEARTBEAT_ANNOTATION)),
        cordoned=bool(spec.get("unschedulable")),
        problem=problem,
    )


def node_state(facts: NodeFacts) -> NodeState:
    assert facts.inventory is not None
    return NodeState.from_inventory(
        facts.name,
        facts.cpu_milli,
        facts.memory_mib,
        facts.inventory,
        labels=facts.labels,
        taints=facts.taints,
    )


def pod_usage(pod: Mapping[str, Any]) -> tuple[int, int]:
    """CPU milli and memory MiB a pod occupies on its node (Kubernetes' init-container rule)."""
    spec = pod.get("spec") or {}
    try:
        regular = [_cpu_memory(c) for c in spec.get("containers") or []]
        init = [_cpu_memory(c) for c in spec.get("initContainers") or []]
    except PodSpecError:
        return 0, 0
    cpu = max([sum(c for c, _ in regular)] + [c for c, _ in init])
    memory = max([sum(m for _, m in regular)] + [m for _, m in init])
    return cpu, memory


def bound_allocation(
    pod: Mapping[str, Any], node: NodeState, keys: Mapping[str, contract.VerifyingKey]
) -> tuple[Allocation, str]:
    """The core allocation of a pod bound to ``node``: its CPU/memory and its signed devices.

    Returns (allocation, problem): devices are left out, with the problem stated, when the
    annotation is absent, invalid, or names devices the node does not have.
    """
    meta = pod.get("metadata") or {}
    uid, name = meta.get("uid", ""), f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    cpu, memory = pod_usage(pod)
    base = Allocation(node=node.name, pod_uid=uid, pod_name=name, cpu_milli=cpu, memory_mib=memory)
    raw = (meta.get("annotations") or {}).get(contract.ANNOTATION)
    if raw is None:
        return base, ""
    try:
        signed = contract.verify(raw, keys)
    except contract.AllocationError as error:
        return base, f"allocation of pod {name} ignored: {error}"
    if signed.node != node.name or signed.pod_uid != uid:
        return base, f"allocation of pod {name} is for another node or pod"
    index = {gpu.id: gpu for gpu in node.gpus}
    grants: dict[str, GpuGrant] = {}
    for entry in signed.containers.values():
        for device in entry.devices:
            gpu = index.get(device)
            if gpu is None:
                continue  # NICs and other non-GPU devices are not in the GPU model
            share = entry.shares.get(device)
            milli = MILLI if share is None else share.milli
            memory_share = gpu.memory_mib if share is None else share.memory_mib
            previous = grants.get(device)
            if previous is not None:
                milli, memory_share = min(MILLI, previous.milli + milli), previous.memory_mib + memory_share
            grants[device] = GpuGrant(gpu.index, gpu.id, milli, memory_share)
    shared = any(g.milli < MILLI for g in grants.values())
    tag = "no-gpu" if not grants else ("share-gpu" if shared else f"{len(grants)}-gpu")
    containers = {c: tuple(e.devices) for c, e in signed.containers.items()}
    return Allocation(
        node=node.name,
        pod_uid=uid,
        pod_name=name,
        cpu_milli=cpu,
        memory_mib=memory,
        gpus=tuple(sorted(grants.values(), key=lambda g: g.index)),
        containers=containers,
        gpu_tag=tag,
    ), ""


def signed_annotation(alloc: Allocation, key_id: str, key: contract.SigningKey) -> str:
    """The ``kubegpu.io/allocation`` value for a core allocation (a pod's share split evenly)."""
    shares = {g.id: g for g in alloc.gpus if g.is_share}
    containers = dict(alloc.containers)
    if not containers:
        raise ValueError(f"allocation of pod {alloc.pod_name} names no containers")
    holders: dict[str, list[str]] = {}
    for name, devices in containers.items():
        for device in devices:
            holders.setdefault(device, []).append(name)
    entries = {}
    for name, devices in containers.items():
        entry_shares = {}
        for device in devices:
            grant = shares.get(device)
            if grant is not None:
                count, position = len(holders[device]), holders[device].index(name)
                milli = grant.milli // count + (grant.milli % count if position == 0 else 0)
                memory = grant.memory_mib // count + (grant.memory_mib % count if position == 0 else 0)
                entry_shares[device] = contract.Share(max(1, milli), memory)
        entries[name] = contract.ContainerAllocation(tuple(devices), entry_shares)
    return contract.sign(contract.Allocation(alloc.node, alloc.pod_uid, entries), key_id, key)
