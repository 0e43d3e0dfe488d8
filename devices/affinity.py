"""PCIe placement from sysfs: how close two PCI devices are, and which GPUs sit beside each NIC.

On Linux ``/sys/bus/pci/devices/<address>`` is a symlink into the device tree, e.g.
``/sys/devices/pci0000:00/0000:00:01.0/0000:02:00.0/0000:03:08.0/0000:07:00.0``: the host bridge
(``pci0000:00``), then every bridge on the way down (root port, switch upstream and downstream
ports), then the device. Two such paths give the ``nvidia-smi topo -m`` relation:

- different host bridges: ``NODE`` when both are on one NUMA node, else ``SYS``;
- one host bridge, different root ports: ``PHB``;
- below a shared bridge, each at most one bridge further down (one switch): ``PIX``;
- below a shared bridge through more bridges (several switches): ``PXB``.

A NIC's GPUs (``Topology.nic_gpus``) are the GPUs closest to it over PCIe, if that is at most
``PXB`` (the default limit of NCCL's GPUDirect RDMA, ``NCCL_NET_GDR_LEVEL``): a NIC on the same
switch as one GPU gets that GPU; a NIC only near the host bridge gets none.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import replace

from devices.model import DeviceKind, NodeInventory, PCIeRelation

PCI_ADDRESS = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
PCI_ROOT = re.compile(r"^pci[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}$")


def normalize_pci_address(bus_id: str) -> str:
    """``00000000:07:00.0`` (NVML) or ``0000:07:00.0`` (sysfs) -> ``0000:07:00.0``; '' stays ''."""
    text = bus_id.strip().lower()
    if not text:
        return ""
    if not PCI_ADDRESS.match(text):
        raise ValueError(f"not a PCI address: {bus_id!r}")
    domain, rest = text.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def pci_chain(device_path: str) -> tuple[str, tuple[str, ...]]:
    """Split a resolved sysfs device path into (host bridge, PCI addresses from root port down).

    Anything before the host bridge (``/sys/devices``, a test root) and after the last PCI
    address (``infiniband/mlx5_0``) is ignored.
    """
    parts = [p for p in device_path.split("/") if p]
    roots = [i for i, p in enumerate(parts) if PCI_ROOT.match(p)]
    if not roots:
        raise ValueError(f"not a PCI device path (no pciDDDD:BB component): {device_path}")
    root = roots[-1]
    chain: list[str] = []
    for part in parts[root + 1 :]:
        if not PCI_ADDRESS.match(part):
            break
        chain.append(normalize_pci_address(part))
    if not chain:
        raise ValueError(f"no PCI device below {parts[root]} in {device_path}")
    return parts[root].lower(), tuple(chain)


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def pcie_relation_from_paths(path_a: str, path_b: str, numa_a: int = -1, numa_b: int = -1) -> PCIeRelation:
    """The PCIe relation of two devices from their resolved sysfs paths (see module doc)."""
    root_a, chain_a = pci_chain(path_a)
    root_b, chain_b = pci_chain(path_b)
    if root_a != root_b:
        return PCIeRelation.NODE if numa_a == numa_b else PCIeRelation.SYS
    bridges_a, bridges_b = chain_a[:-1], chain_b[:-1]
    common = _common_prefix(bridges_a, bridges_b)
    if common == 0:
        return PCIeRelation.PHB
    below = max(len(bridges_a) - common, len(bridges_b) - common)
    return PCIeRelation.PIX if below <= 1 else PCIeRelation.PXB


def nic_gpu_affinity(
    nic_paths: Mapping[str, str],
    gpu_paths: Mapping[str, str],
    numa: Mapping[str, int] | None = None,
    limit: PCIeRelation = PCIeRelation.PXB,
) -> dict[str, tuple[str, ...]]:
    """NIC id -> the GPU ids closest to it over PCIe, when that is at most ``limit``.

    ``nic_paths`` and ``gpu_paths`` map device ids to resolved sysfs paths; ``numa`` maps ids to
    NUMA nodes (only used to tell NODE from SYS). GPUs keep the order of ``gpu_paths``.
    """
    numa = numa or {}
    result: dict[str, tuple[str, ...]] = {}
    for nic, nic_path in nic_paths.items():
        relations = {
            gpu: pcie_relation_from_paths(nic_path, gpu_path, numa.get(nic, -1), numa.get(gpu, -1))
            for gpu, gpu_path in gpu_paths.items()
        }
        if not relations:
            continue
        best = min(relations.values())
        if best <= limit:
            result[nic] = tuple(gpu for gpu, rel in relations.items() if rel == best)
    return result


def sysfs_pci_path(sysfs_root: str, address: str) -> str | None:
    """The resolved ``<root>/sys/bus/pci/devices/<address>``, or None when it is not there."""
    if not address:
        return None
    link = os.path.join(sysfs_root, "sys/bus/pci/devices", normalize_pci_address(address))
    if not os.path.exists(link):
        return None
    return os.path.realpath(link)


def add_nic_affinity(inventory: NodeInventory, sysfs_root: str = "/") -> NodeInventory:
    """Fill ``nic_gpus`` for NICs that have none yet, from the PCI paths of NICs and GPUs in sysfs.

    Devices without a PCI address, or whose address is not in sysfs (simulated devices), are
    left out; existing ``nic_gpus`` entries (the sim's) are kept as they are.
    """

    def paths(kind: DeviceKind, skip: Mapping[str, object]) -> dict[str, str]:
        found: dict[str, str] = {}
        for device in inventory.by_kind(kind):
            if device.id in skip:
                continue
            path = sysfs_pci_path(sysfs_root, device.pci_bus_id)
            if path is not None:
                found[device.id] = path
        return found

    nics = paths(DeviceKind.RDMA, inventory.topology.nic_gpus)
    gpus = paths(DeviceKind.GPU, {})
    if not nics or not gpus:
        return inventory
    numa = {d.id: d.numa_node for d in inventory.devices}
    found = nic_gpu_affinity(nics, gpus, numa)
    if not found:
        return inventory
    topology = replace(inventory.topology, nic_gpus={**inventory.topology.nic_gpus, **found})
    return replace(inventory, topology=topology)
