"""How a node's RDMA devices read as NIC ports: which are PFs, which VFs belong to each, each PF's
line rate and the VFs a pod can be given.

One reading for the two that must agree on it: the advertiser's ``kubegpu.io/rdma`` allocatable
(crishim/advertiser.py: what kube-scheduler counts) and the scheduling core's NIC state
(scheduler/core/rdma.py: which VFs the scheduler gives). A VF is an RDMA device with attribute
``function: vf``; its PF is named by ``parentDevice`` (the PF's RDMA name) or ``parentPf`` (its PCI
address). Every other RDMA device is a PF. A VF is usable while it and its PF are healthy; a PF
without VFs, or whose rate (``rateGbps``) is unknown, offers no interface. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from devices.model import Device, DeviceKind, NodeInventory
from kubegpu.bandwidth import MAX_MBPS, MBPS_PER_GBPS


@dataclass(frozen=True)
class NicPort:
    """One PF with a line rate and VFs: its VFs (by index, then id) and the ids of the usable ones."""

    pf: Device
    rate_mbps: int
    vfs: tuple[Device, ...]
    usable: tuple[str, ...]


def rate_mbps(device: Device) -> int:
    """A NIC's line rate from its ``rateGbps`` attribute (0 when absent or unreadable)."""
    try:
        rate = float(device.attributes.get("rateGbps", "0"))
    except ValueError:
        return 0
    if not 0 <= rate <= MAX_MBPS / MBPS_PER_GBPS:  # NaN too
        return 0
    return int(rate * MBPS_PER_GBPS)


def is_vf(device: Device) -> bool:
    return device.kind is DeviceKind.RDMA and device.attributes.get("function") == "vf"


class PfIndex:
    """A node's PFs by RDMA name and by PCI address, to find a VF's PF."""

    def __init__(self, devices: Iterable[Device]) -> None:
        self.pfs = [d for d in devices if d.kind is DeviceKind.RDMA and not is_vf(d)]
        self._by_name = {d.id: d for d in self.pfs}
        self._by_pci = {d.pci_bus_id: d for d in self.pfs if d.pci_bus_id}

    def parent(self, vf: Device) -> Device | None:
        """The PF ``parentDevice`` names, else the one at PCI address ``parentPf``; None for neither."""
        return self._by_name.get(vf.attributes.get("parentDevice", "")) or self._by_pci.get(
            vf.attributes.get("parentPf", "")
        )


def nic_ports(inventory: NodeInventory) -> list[NicPort]:
    """The node's PFs that have VFs and a known rate, in inventory order (module docstring)."""
    rdma = inventory.by_kind(DeviceKind.RDMA)
    index = PfIndex(rdma)
    pfs = index.pfs
    vfs: dict[str, list[Device]] = {}
    for vf in rdma:
        if not is_vf(vf):
            continue
        parent = index.parent(vf)
        if parent is not None:
            vfs.setdefault(parent.id, []).append(vf)
    ports = []
    for pf in pfs:
        mine = tuple(sorted(vfs.get(pf.id, []), key=lambda d: (d.index, d.id)))
        rate = rate_mbps(pf)
        if not mine or not rate:
            continue
        usable = tuple(v.id for v in mine if v.healthy) if pf.healthy else ()
        ports.append(NicPort(pf, rate, mine, usable))
    return ports


def assignable_vfs(inventory: NodeInventory) -> int:
    """How many VFs a pod can be given on this node: the usable VFs of ``nic_ports``."""
    return sum(len(port.usable) for port in nic_ports(inventory))
