"""Translate between the API's JSON and the scheduling core: nodes, bound pods, allocations.

- A node's static score (``kubegpu.io/static-score`` label, 0..100, for the ``utilization``
  policy) is read with the node; a value that is not a number in range is ignored (the default,
  100) with ``NodeFacts.static_problem`` saying why, never a reason to leave the node out.
- A Node becomes a ``NodeState`` when its advertiser published a readable inventory
  (``kubegpu.io/inventory``) and its heartbeat is fresh; a cordoned one is marked ``unschedulable``
  (the core's NodeUnschedulable filter lets only pods tolerating the cordon there). CPU, memory, the
  number of pods, the GPU count (the GPU resource) and every other resource NodeResourcesFit checks
  (memory in bytes, ephemeral storage, hugepages, extended resources) come from
  ``status.allocatable``. Parsing a Node never raises: whatever is wrong with it becomes
  ``NodeFacts.problem``, which keeps only that node out. What a node agent publishes is held to the
  limits of ``nodecheck`` (sizes, ranges, links naming listed devices, allocatable counts a real
  machine could have, a heartbeat not from the future); a node beyond them is left out with the
  reason (docs/errors.md).
- A pod bound to a node is a fact (``BoundPod``): its CPU, memory, other resources, host ports, pod
  slot and GPU count, and, if it carries a valid signed allocation, the device ids it holds and its
  RDMA VFs with their bandwidth. That annotation is the source of truth for device usage.
- A core ``Allocation`` becomes the allocation contract's form (``allocation_contract``), which the
  scheduler signs into the ``kubegpu.io/allocation`` annotation.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from devices.model import DeviceKind, NodeInventory
from kubegpu import allocation as contract
from kubegpu.nodeannotations import HEARTBEAT_ANNOTATION, INVENTORY_ANNOTATION
from scheduler.core.rdma import VfGrant
from scheduler.core.request import MILLI, HostPort, Taint, TaintEffect, container_gpus
from scheduler.core.state import (
    DEFAULT_STATIC_SCORE,
    STATIC_SCORE_LABEL,
    Allocation,
    GpuGrant,
    NodeState,
)
from scheduler.live import nodecheck
from scheduler.live.podspec import (
    MEBI,
    PodSpecError,
    _ceil,
    _milli_cpu,
    _quantity,
    checked_resource,
    pod_resources,
)

NO_INVENTORY = "node has no kubegpu device inventory"


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
    max_pods: int | None = None  # status.allocatable.pods (0 when not published)
    gpu_resource: int | None = None  # status.allocatable of the GPU resource (0 when not published)
    # the other resources' allocatable, exact (memory in bytes; PodRequest.resources' names)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    static_score: float = DEFAULT_STATIC_SCORE  # the STATIC_SCORE_LABEL (docs/utilisation.md)
    static_problem: str = ""  # why the label was ignored, if it was

    def schedulable(self, now: dt.datetime, stale_after: float) -> str:
        """'' if kubegpu may place pods here now, else the reason (for FailedScheduling)."""
        if self.problem:
            return self.problem
        future = nodecheck.heartbeat_problem(self.heartbeat, now)
        if future:
            return future
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
            self.max_pods,
            self.gpu_resource,
            tuple(sorted(self.allocatable.items())),
        )


def _read_allocatable(
    allocatable: Mapping[str, Any], gpu_resource: str
) -> tuple[int, int, int | None, int | None, dict[str, int], str]:
    """(CPU milli, memory MiB, pods, GPU count, other resources, problem) of a Node's allocatable.

    Memory in MiB is rounded down (it feeds scores; the fit is checked in bytes, among the other
    resources, as kube-scheduler's ``Value()``). Any figure absent is 0, as kube-scheduler reads
    it: a node listing no ``pods`` admits no pod, one listing no GPU count no whole GPU. A figure
    that is not a quantity (or one beyond what Kubernetes keeps) is a problem naming it, never a
    zero or a missing limit.
    """
    figures: dict[str, Any] = {}
    for what, key, read in (
        ("cpu", "cpu", _milli_cpu),
        ("memory", "memory", _bytes),
        ("pods", "pods", _count),
        ("GPU count", gpu_resource, _count),
    ):
        value = allocatable.get(key)
        try:
            figures[what] = 0 if value is None else read(value)
        except (PodSpecError, TypeError, ValueError, ArithmeticError):
            return 0, 0, None, None, {}, f"node's allocatable {what} is unreadable ({str(value)[:40]!r})"
    others = {"memory": figures["memory"]}
    for key, value in allocatable.items():
        if key != "memory" and checked_resource(str(key), gpu_resource):
            try:
                others[str(key)] = _bytes(value)
            except (PodSpecError, TypeError, ValueError, ArithmeticError):
                return 0, 0, None, None, {}, f"node's allocatable {key} is unreadable ({str(value)[:40]!r})"
    memory_mib = figures["memory"] // int(MEBI)
    return figures["cpu"], memory_mib, figures["pods"], figures["GPU count"], others, ""


def _bytes(value: Any) -> int:
    """A quantity's ``Value()`` (bytes, or a count), at least 0; raises PodSpecError if unreadable."""
    return max(0, _ceil(_quantity(value, "allocatable")))


def _count(value: Any) -> int:
    """A countable allocatable (pods, GPUs) as an int (negative: 0); raises PodSpecError if unreadable."""
    return max(0, int(_quantity(value, "count")))


def static_score(labels: Mapping[str, str]) -> tuple[float, str]:
    """(score, problem) of the node's ``kubegpu.io/static-score`` label: a number 0..100; absent or
    unreadable, the default (100), with the problem naming the value when it is unreadable."""
    raw = labels.get(STATIC_SCORE_LABEL)
    if raw is None:
        return DEFAULT_STATIC_SCORE, ""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 100.0:  # NaN included
        return DEFAULT_STATIC_SCORE, f"label {STATIC_SCORE_LABEL}={str(raw)[:63]!r} is not a number 0..100"
    return value, ""


def parse_time(value: str | None) -> dt.datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def parse_inventory(raw: Any) -> NodeInventory:
    """The node's published inventory; raises ValueError naming what is wrong with it."""
    if not isinstance(raw, str):
        raise ValueError(f"annotation is not a string: {type(raw).__name__}")
    if len(raw) > nodecheck.MAX_INVENTORY_BYTES:
        raise ValueError(f"{len(raw)} characters (at most {nodecheck.MAX_INVENTORY_BYTES})")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {type(doc).__name__}")
    if doc.get("version") != 1:
        raise ValueError(f"unsupported inventory version {doc.get('version')!r}")
    if not isinstance(doc.get("devices", []), list) or not isinstance(doc.get("topology", {}), dict):
        raise ValueError("devices must be a list and topology an object")
    problem = nodecheck.document_problem(doc)
    if problem:
        raise ValueError(problem)
    try:
        inventory = NodeInventory.from_public(doc)
    except Exception as error:  # any shape error in a device or link entry
        raise ValueError(f"{type(error).__name__}: {error}") from None
    ids = [d.id for d in inventory.devices]
    if len(set(ids)) != len(ids):
        raise ValueError("two devices share an id")
    gpu_indices = sorted(d.index for d in inventory.by_kind(DeviceKind.GPU))
    if len(set(gpu_indices)) != len(gpu_indices):
        raise ValueError("two GPUs share an index")
    return inventory


def node_facts(node: Mapping[str, Any], gpu_resource: str = "nvidia.com/gpu") -> NodeFacts:
    """What the scheduler needs of a Node; never raises (a bad node gets ``problem``).

    ``gpu_resource`` names the extended resource whose allocatable count the kubelet enforces.
    """
    meta = node.get("metadata") if isinstance(node, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name = str(meta.get("name", ""))
    try:
        return _node_facts(node, meta, name, gpu_resource)
    except Exception as error:  # the apiserver validates most of a Node; be total anyway
        return NodeFacts(
            name=name,
            cpu_milli=0,
            memory_mib=0,
            labels={},
            taints=(),
            inventory=None,
            heartbeat=None,
            cordoned=False,
            problem=f"node object unreadable: {type(error).__name__}: {str(error)[:120]}",
        )


def _node_facts(node: Mapping[str, Any], meta: Mapping[str, Any], name: str, gpu_resource: str) -> NodeFacts:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    annotations = meta.get("annotations") or {}
    allocatable = status.get("allocatable") or {}
    cpu, memory, max_pods, gpus, others, unreadable = _read_allocatable(allocatable, gpu_resource)
    taints = tuple(
        Taint(t.get("key", ""), t.get("value") or "", TaintEffect(t.get("effect", "NoSchedule")))
        for t in spec.get("taints") or []
        if t.get("effect") in {e.value for e in TaintEffect}
    )
    inventory, problem = None, ""
    raw = annotations.get(INVENTORY_ANNOTATION)
    if raw is None:
        problem = NO_INVENTORY
    else:
        try:
            inventory = parse_inventory(raw)
        except ValueError as error:
            problem = f"node's device inventory is unreadable: {str(error)[:120]}"
    problem = problem or unreadable or nodecheck.allocatable_problem(cpu, memory, max_pods, gpus)
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    score, score_problem = static_score(labels)
    return NodeFacts(
        name=name,
        cpu_milli=cpu,
        memory_mib=memory,
        labels=labels,
        taints=taints,
        inventory=inventory,
        heartbeat=parse_time(annotations.get(HEARTBEAT_ANNOTATION)),
        cordoned=bool(spec.get("unschedulable")),
        problem=problem,
        max_pods=max_pods,
        gpu_resource=gpus,
        allocatable=others,
        static_score=score,
        static_problem=score_problem,
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
        max_pods=facts.max_pods,
        gpu_resource=facts.gpu_resource,
        unschedulable=facts.cordoned,
        allocatable=facts.allocatable,
        static_score=facts.static_score,
    )


@dataclass(frozen=True)
class PodUsage:
    """What a bound pod takes from its node whoever placed it, by Kubernetes' rule."""

    cpu_milli: int
    memory_mib: int
    gpus: int  # its request of the GPU resource (what the kubelet counts)
    problem: str = ""
    resources: tuple[tuple[str, int], ...] = ()  # memory in bytes and the other checked resources
    host_ports: tuple[HostPort, ...] = ()


def pod_usage(pod: Mapping[str, Any], gpu_resource: str = "nvidia.com/gpu") -> PodUsage:
    """What a pod occupies on its node (Kubernetes' rule, ``podspec.pod_resources``): CPU milli,
    memory (MiB and bytes), the other resources, its host ports and GPU count."""
    try:
        asked = pod_resources(pod, gpu_resource)
    except (PodSpecError, AttributeError, TypeError, ValueError) as error:
        return PodUsage(0, 0, 0, f"resources unreadable: {str(error)[:120]}")
    return PodUsage(
        asked.cpu_milli,
        asked.memory_mib,
        container_gpus(asked.containers),
        resources=asked.resources,
        host_ports=asked.host_ports,
    )


def verified_allocation(
    raw: str | None, keys: Mapping[str, contract.VerifyingKey], node: str, uid: str
) -> tuple[contract.Allocation | None, str]:
    """The pod's verified allocation for ``node`` (or None), and why it is ignored if it is."""
    if raw is None:
        return None, ""
    try:
        signed = contract.verify(raw, keys)
    except contract.AllocationError as error:
        return None, f"allocation ignored: {error}"
    if signed.node != node or signed.pod_uid != uid:
        return None, "allocation ignored: it is for another node or pod"
    return signed, ""


def fact_allocation(
    node: str, uid: str, name: str, usage: PodUsage, signed: contract.Allocation | None
) -> Allocation:
    """The core allocation of a pod bound to ``node``: what it takes and the devices it holds.

    Devices are named by id only (the node state books them by id); a device the node does not
    list as a GPU (a NIC, or a GPU gone from the inventory) is skipped by the node state. Whole
    GPUs are charged at the GPU's whole memory by the node state.
    """
    grants: dict[str, GpuGrant] = {}
    containers: dict[str, tuple[str, ...]] = {}
    init: set[str] = set()
    if signed is not None:
        for container, entry in signed.containers.items():
            containers[container] = tuple(entry.devices)
            if entry.init:
                init.add(container)
            for device in entry.devices:
                share = entry.shares.get(device)
                milli = MILLI if share is None else share.milli
                memory = 0 if share is None else share.memory_mib
                previous = grants.get(device)
                if previous is not None:
                    if previous.milli >= MILLI or share is None:
                        milli, memory = MILLI, 0  # a whole GPU given to two containers is one GPU
                    else:
                        milli, memory = min(MILLI, previous.milli + milli), previous.memory_mib + memory
                grants[device] = GpuGrant(-1, device, milli, memory)
    shared = any(g.milli < MILLI for g in grants.values())
    tag = "no-gpu" if not grants else ("share-gpu" if shared else f"{len(grants)}-gpu")
    return Allocation(
        node=node,
        pod_uid=uid,
        pod_name=name,
        cpu_milli=usage.cpu_milli,
        memory_mib=usage.memory_mib,
        gpus=tuple(sorted(grants.values(), key=lambda g: g.id)),
        containers=containers,
        gpu_tag=tag,
        gpu_resource=usage.gpus,
        init_containers=frozenset(init),
        resources=usage.resources,
        host_ports=usage.host_ports,
        rdma=tuple(VfGrant(r.device, r.pf, r.min_mbps, r.max_mbps) for r in signed.rdma) if signed else (),
    )


def allocation_contract(alloc: Allocation) -> contract.Allocation:
    """The allocation contract's form of a core allocation (a pod's share split evenly; its RDMA
    VFs pod-wide, version 2)."""
    shares = {g.id: g for g in alloc.gpus if g.is_share}
    containers = dict(alloc.containers)
    if not containers and not alloc.rdma:
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
        entries[name] = contract.ContainerAllocation(
            tuple(devices), entry_shares, init=name in alloc.init_containers
        )
    rdma = tuple(contract.RdmaInterface(v.id, v.pf, v.min_mbps, v.max_mbps) for v in alloc.rdma)
    return contract.Allocation(alloc.node, alloc.pod_uid, entries, rdma)
