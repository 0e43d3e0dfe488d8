"""A node's GPUs and NUMA zones as a ``NodeResourceTopology`` (``topology.node.k8s.io/v1alpha2``).

The object is the one scheduler-plugins' NodeResourceTopologyMatch and NFD's topology updater use
(the CRD of the k8stopologyawareschedwg/noderesourcetopology-api project, shipped unchanged in
``deploy/crds/``; docs/nrt.md is the contract): cluster-scoped, named after the node, with no spec
or status: ``zones`` (required), ``attributes`` and the deprecated ``topologyPolicies`` at the top.

What kubegpu fills (pure functions here; ``crishim.nrtpublisher`` writes it):

- one zone per NUMA node, named ``node-<id>`` and typed ``Node`` (upstream's canonical NUMA zone
  name, ``numanode.IDToName``), with ``costs``: the kernel's distance to every NUMA node, itself
  included (``/sys/devices/system/node/node<id>/distance``), where the kernel gives them;
- per zone, its devices as resources: ``nvidia.com/gpu`` (and ``kubegpu.io/rdma``): ``capacity``
  every device of the zone, ``allocatable`` the healthy ones, ``available`` the healthy ones no
  container holds (a share holds its GPU), as the node ledger says; ``kubegpu.io/rdma`` counts VFs
  only, as the node's allocatable does (``devices.nics``: the VFs of PFs with a rate, allocatable
  the usable ones), never the PFs;
- optionally ``cpu`` and ``memory`` per zone as the kernel counts them (capacity = allocatable =
  available: kubegpu does not know the kubelet's exclusive CPU and memory bookings);
- the kubelet's Topology Manager policy and scope as the top-level ``attributes``
  ``topologyManagerPolicy`` / ``topologyManagerScope`` and the deprecated ``topologyPolicies``
  value, only when the operator says what they are (the agent cannot read the kubelet's config).

A device whose NUMA node is unknown (-1) goes to the only NUMA node when the node has one, and is
left out of every zone otherwise (``zones`` returns how many were left out).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from devices.model import DeviceKind, NodeInventory
from devices.nics import nic_ports
from kubegpu.allocation import GPU_RESOURCE, RDMA_RESOURCE

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
PLURAL = "noderesourcetopologies"
KIND = "NodeResourceTopology"
API_VERSION = f"{GROUP}/{VERSION}"
CRD_NAME = f"{PLURAL}.{GROUP}"
ZONE_TYPE = "Node"
ZONE_PREFIX = "node-"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kubegpu"
POLICY_ATTRIBUTE = "topologyManagerPolicy"
SCOPE_ATTRIBUTE = "topologyManagerScope"
POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")
RESOURCES: Mapping[DeviceKind, str] = {DeviceKind.GPU: GPU_RESOURCE, DeviceKind.RDMA: RDMA_RESOURCE}
NODE_DIR = re.compile(r"node(\d+)")
MAX_NUMA_NODES = 1024


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node as the kernel describes it (None: not readable)."""

    id: int
    cpus: int | None = None
    memory_bytes: int | None = None
    distances: Mapping[int, int] = field(default_factory=dict)  # NUMA node id -> distance


def zone_name(numa: int) -> str:
    """The canonical zone name of a NUMA node (``node-0``)."""
    return f"{ZONE_PREFIX}{numa}"


def count_cpus(cpulist: str) -> int:
    """How many CPUs a kernel cpulist names (``0-3,8,10-11`` -> 7); ValueError when malformed."""
    total = 0
    for part in cpulist.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if last < first:
            raise ValueError(f"bad CPU range {part!r}")
        total += last - first + 1
    return total


def memory_total(meminfo: str) -> int | None:
    """Bytes of ``MemTotal`` in a per-node meminfo (``Node 0 MemTotal:  123 kB``); None if absent."""
    match = re.search(r"MemTotal:\s+(\d+)\s*kB", meminfo)
    return int(match.group(1)) * 1024 if match else None


def read_numa_nodes(sysfs_root: str) -> dict[int, NumaNode]:
    """The NUMA nodes under ``<sysfs_root>/sys/devices/system/node`` ({} when there is none).

    A file that cannot be read or parsed leaves its figure None (distances: none); the kernel
    lists a node's distances in the order of its node ids.
    """
    base = os.path.join(sysfs_root, "sys/devices/system/node")
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    ids = sorted(int(m.group(1)) for n in names if (m := NODE_DIR.fullmatch(n)))[:MAX_NUMA_NODES]

    def read(numa: int, name: str) -> str | None:
        try:
            with open(os.path.join(base, f"node{numa}", name), encoding="ascii") as handle:
                return handle.read(1 << 16)
        except (OSError, UnicodeDecodeError):
            return None

    nodes: dict[int, NumaNode] = {}
    for numa in ids:
        cpus = memory = None
        distances: dict[int, int] = {}
        cpulist, meminfo, distance = read(numa, "cpulist"), read(numa, "meminfo"), read(numa, "distance")
        try:
            cpus = count_cpus(cpulist) if cpulist is not None else None
        except ValueError:
            cpus = None
        memory = memory_total(meminfo) if meminfo is not None else None
        try:
            values = [int(v) for v in distance.split()] if distance is not None else []
        except ValueError:
            values = []
        if len(values) == len(ids):
            distances = dict(zip(ids, values, strict=True))
        nodes[numa] = NumaNode(numa, cpus, memory, distances)
    return nodes


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, Any]:
    return {"name": name, "capacity": capacity, "allocatable": allocatable, "available": available}


def zones(
    inventory: NodeInventory,
    held: Iterable[str],
    numa_nodes: Mapping[int, NumaNode],
    host_resources: bool = False,
) -> tuple[list[dict[str, Any]], int]:
    """The object's ``zones`` and how many devices were left out (NUMA node unknown).

    ``held``: the ids of the devices some container holds (whole or a share). Zones come from the
    NUMA nodes the kernel lists and those the devices name, in id order; resources in name order.
    """
    taken = set(held)
    ports = nic_ports(inventory)  # kubegpu.io/rdma counts VFs, as the node's allocatable does
    vfs = {vf.id for port in ports for vf in port.vfs}
    usable = {vf for port in ports for vf in port.usable}
    only = next(iter(numa_nodes)) if len(numa_nodes) == 1 else None
    counts: dict[int, dict[str, list[int]]] = {numa: {} for numa in numa_nodes}
    left_out = 0
    for device in inventory.devices:
        resource = RESOURCES.get(device.kind)
        if resource is None or (device.kind is DeviceKind.RDMA and device.id not in vfs):
            continue
        numa = device.numa_node if device.numa_node >= 0 else only
        if numa is None:
            left_out += 1
            continue
        tally = counts.setdefault(numa, {}).setdefault(resource, [0, 0, 0])
        tally[0] += 1
        if device.id in usable if device.kind is DeviceKind.RDMA else device.healthy:
            tally[1] += 1
            tally[2] += device.id not in taken
    result: list[dict[str, Any]] = []
    for numa in sorted(counts):
        known = numa_nodes.get(numa)
        resources = [_resource(name, *tally) for name, tally in counts[numa].items()]
        if host_resources and known is not None:
            if known.cpus is not None:
                resources.append(_resource("cpu", known.cpus, known.cpus, known.cpus))
            if known.memory_bytes is not None:
                resources.append(_resource("memory", *(known.memory_bytes,) * 3))
        zone: dict[str, Any] = {"name": zone_name(numa), "type": ZONE_TYPE}
        if known is not None and known.distances:
            zone["costs"] = [
                {"name": zone_name(other), "value": value} for other, value in sorted(known.distances.items())
            ]
        zone["resources"] = sorted(resources, key=lambda r: r["name"])
        result.append(zone)
    return result, left_out


def topology_policy(policy: str, scope: str) -> str:
    """The deprecated ``topologyPolicies`` value for a kubelet Topology Manager policy and scope
    (upstream's ``TopologyManagerPolicy`` names, as NFD's topology updater maps them)."""
    if policy not in POLICIES or scope not in SCOPES:
        raise ValueError(f"unknown Topology Manager policy {policy!r} or scope {scope!r}")
    if policy == "none":
        return "None"
    level = "PodLevel" if scope == "pod" else "ContainerLevel"
    stem = {"best-effort": "BestEffort", "restricted": "Restricted", "single-numa-node": "SingleNUMANode"}
    return stem[policy] + level


def document(
    node: str,
    zone_list: Sequence[Mapping[str, Any]],
    policy: str = "",
    scope: str = "container",
    owner_uid: str | None = None,
) -> dict[str, Any]:
    """The NodeResourceTopology for ``node``: labelled as kubegpu's, owned by the Node when its uid
    is known; the Topology Manager attributes only when ``policy`` is given."""
    metadata: dict[str, Any] = {"name": node, "labels": {MANAGED_BY: MANAGER}}
    if owner_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid}]
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "zones": [dict(z) for z in zone_list],
    }
    if policy:
        body["topologyPolicies"] = [topology_policy(policy, scope)]
        body["attributes"] = [
            {"name": POLICY_ATTRIBUTE, "value": policy},
            {"name": SCOPE_ATTRIBUTE, "value": scope},
        ]
    return body


def ours(obj: Mapping[str, Any]) -> bool:
    """The object is kubegpu's (its ``app.kubernetes.io/managed-by`` label), not another writer's."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return isinstance(labels, Mapping) and labels.get(MANAGED_BY) == MANAGER
