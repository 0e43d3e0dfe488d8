"""The device model shared by the plugins, the advertiser, the scheduler and the shim.

A ``Device`` is one schedulable unit of hardware (a GPU, an RDMA NIC or VF). A ``Topology`` says
how the GPUs of one node connect: NVLink count per pair, the PCIe relation per pair in
``nvidia-smi topo -m`` terms, and which NICs sit beside which GPUs. ``NodeInventory`` is what a
node publishes. Host paths (``device_nodes``) are node-local facts: they are never serialised into
anything the scheduler writes, only used by the node's own plugins.

A GPU's ``sharing`` attribute says whether fractional shares of it are enforced: ``mps`` (each
share runs as an MPS client with its memory and compute limits, docs/gpu-sharing.md) or
``advisory`` (a share is only told its size). ``with_sharing`` sets it; ``Device.share_enforced``
reads it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any


class DeviceKind(enum.StrEnum):
    GPU = "gpu"
    RDMA = "rdma"


class Sharing(enum.StrEnum):
    """How the node enforces fractional shares of a GPU (the GPU's ``sharing`` attribute)."""

    MPS = "mps"  # memory and compute limits enforced by an NVIDIA MPS control daemon
    ADVISORY = "advisory"  # a share is told its size; nothing stops it using the whole GPU


SHARING_ATTRIBUTE = "sharing"


class PCIeRelation(enum.IntEnum):
    """How two devices connect over PCIe, best (lowest) to worst, as ``nvidia-smi topo -m``."""

    PIX = 1  # same PCIe switch
    PXB = 2  # several PCIe switches, no host bridge
    PHB = 3  # through one PCIe host bridge (same CPU)
    NODE = 4  # through host bridges within one NUMA node
    SYS = 5  # across the inter-socket link (SMP/UPI/QPI)

    @classmethod
    def parse(cls, text: str) -> PCIeRelation:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown PCIe relation {text!r} (want PIX, PXB, PHB, NODE or SYS)") from None


@dataclass(frozen=True)
class Device:
    """One device on one node."""

    id: str  # GPU UUID (GPU-xxxxxxxx-...), or RDMA device name (mlx5_0)
    kind: DeviceKind
    index: int
    model: str
    memory_mib: int = 0
    numa_node: int = -1  # -1: unknown
    pci_bus_id: str = ""
    healthy: bool = True
    device_nodes: tuple[str, ...] = ()  # host paths; node-local, never published
    attributes: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def share_enforced(self) -> bool:
        """The node enforces fractional shares of this GPU (attribute ``sharing`` is ``mps``)."""
        return self.attributes.get(SHARING_ATTRIBUTE) == Sharing.MPS

    def public(self) -> dict[str, Any]:
        """What the node publishes about this device (no host paths)."""
        doc: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind.value,
            "index": self.index,
            "model": self.model,
            "memoryMiB": self.memory_mib,
            "numa": self.numa_node,
            "pci": self.pci_bus_id,
            "healthy": self.healthy,
        }
        if self.attributes:
            doc["attributes"] = dict(sorted(self.attributes.items()))
        return doc

    @classmethod
    def from_public(cls, doc: Mapping[str, Any]) -> Device:
        return cls(
            id=str(doc["id"]),
            kind=DeviceKind(doc["kind"]),
            index=int(doc["index"]),
            model=str(doc.get("model", "")),
            memory_mib=int(doc.get("memoryMiB", 0)),
            numa_node=int(doc.get("numa", -1)),
            pci_bus_id=str(doc.get("pci", "")),
            healthy=bool(doc.get("healthy", True)),
            attributes={str(k): str(v) for k, v in dict(doc.get("attributes", {})).items()},
        )


def pair(a: str, b: str) -> tuple[str, str]:
    """The canonical (sorted) key of an unordered device pair."""
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class Topology:
    """Links between the devices of one node. Pairs are keyed by ``pair(a, b)``."""

    nvlinks: Mapping[tuple[str, str], int] = field(default_factory=dict)
    pcie: Mapping[tuple[str, str], PCIeRelation] = field(default_factory=dict)
    # NIC id -> GPU ids on the same PCIe switch as the NIC
    nic_gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def nvlink_count(self, a: str, b: str) -> int:
        return self.nvlinks.get(pair(a, b), 0)

    def pcie_relation(self, a: str, b: str) -> PCIeRelation:
        return self.pcie.get(pair(a, b), PCIeRelation.SYS)

    def public(self) -> dict[str, Any]:
        return {
            "nvlink": [[a, b, n] for (a, b), n in sorted(self.nvlinks.items()) if n],
            "pcie": [[a, b, rel.name] for (a, b), rel in sorted(self.pcie.items())],
            "nicGpus": {nic: list(gpus) for nic, gpus in sorted(self.nic_gpus.items())},
        }

    @classmethod
    def from_public(cls, doc: Mapping[str, Any]) -> Topology:
        return cls(
            nvlinks={pair(str(a), str(b)): int(n) for a, b, n in doc.get("nvlink", [])},
            pcie={pair(str(a), str(b)): PCIeRelation.parse(str(r)) for a, b, r in doc.get("pcie", [])},
            nic_gpus={str(k): tuple(str(g) for g in v) for k, v in dict(doc.get("nicGpus", {})).items()},
        )


@dataclass(frozen=True)
class NodeInventory:
    """Everything a node publishes about its devices."""

    devices: tuple[Device, ...]
    topology: Topology = field(default_factory=Topology)

    def by_kind(self, kind: DeviceKind) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind is kind)

    def by_id(self) -> dict[str, Device]:
        return {d.id: d for d in self.devices}

    def public(self) -> dict[str, Any]:
        return {"devices": [d.public() for d in self.devices], "topology": self.topology.public()}

    @classmethod
    def from_public(cls, doc: Mapping[str, Any]) -> NodeInventory:
        return cls(
            devices=tuple(Device.from_public(d) for d in doc.get("devices", [])),
            topology=Topology.from_public(doc.get("topology", {})),
        )


def merge(inventories: Iterable[NodeInventory]) -> NodeInventory:
    """Combine the inventories of several plugins (GPUs from one, NICs from another)."""
    devices: list[Device] = []
    nvlinks: dict[tuple[str, str], int] = {}
    pcie: dict[tuple[str, str], PCIeRelation] = {}
    nic_gpus: dict[str, tuple[str, ...]] = {}
    for inventory in inventories:
        devices.extend(inventory.devices)
        nvlinks.update(inventory.topology.nvlinks)
        pcie.update(inventory.topology.pcie)
        nic_gpus.update(inventory.topology.nic_gpus)
    return NodeInventory(tuple(devices), Topology(nvlinks, pcie, nic_gpus))


def with_sharing(inventory: NodeInventory, sharing: Callable[[Device], Sharing]) -> NodeInventory:
    """``inventory`` with every GPU's ``sharing`` attribute set to ``sharing(gpu)``."""
    devices = tuple(
        replace(d, attributes={**d.attributes, SHARING_ATTRIBUTE: sharing(d).value})
        if d.kind is DeviceKind.GPU
        else d
        for d in inventory.devices
    )
    return NodeInventory(devices, inventory.topology)
