"""The network side of an RDMA VF in sysfs: its netdev, its PF's netdev, its VF index.

Read below an injectable root like ``devices.rdma`` (tests build a fake tree):

- ``sys/class/infiniband/<dev>/device``: the PCI function of RDMA device ``<dev>``;
- ``<pci>/net/<ifname>``: the netdev(s) of that function, as this network namespace sees them (a
  netdev moved into a pod's namespace disappears from the host's view);
- ``<vf pci>/physfn``: a VF's PF; ``<pf pci>/virtfn<N>``: the PF's VF number ``N``, which is how
  the PF's netlink VF settings (``IFLA_VF_RATE``: min/max tx rate) name the VF.

``kubegpu.cni`` uses this to find the netdev to move into a pod and the PF through which to set
its rate.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from devices.rdma import IB_CLASS

_VIRTFN = re.compile(r"^virtfn([0-9]+)$")


class VfLookupError(LookupError):
    """The VF (or its PF) is not where the allocation says; the message names what is missing."""


@dataclass(frozen=True)
class VfNetdev:
    """One VF as the node sees it now: RDMA name, PCI address, netdev, and its PF."""

    device: str  # RDMA device name (the allocation's id), e.g. mlx5_4
    pci: str  # the VF's PCI address
    ifname: str  # the VF's netdev in this namespace
    pf_device: str  # the PF's RDMA device name
    pf_pci: str
    pf_ifname: str  # the PF's netdev (VF rates are set through it); "" when it has none
    vf_index: int  # N of the PF's virtfnN


def _pci_dir(root: str, device: str) -> str:
    path = os.path.join(root, IB_CLASS, device, "device")
    if not os.path.isdir(path):
        raise VfLookupError(f"RDMA device {device} is not in sysfs ({os.path.join('/', IB_CLASS, device)})")
    return os.path.realpath(path)


def netdevs(pci_dir: str) -> list[str]:
    """The netdev names of a PCI function (``<pci>/net/*``), sorted; [] if none."""
    try:
        return sorted(os.listdir(os.path.join(pci_dir, "net")))
    except OSError:
        return []


def current_ifname(root: str, device: str) -> str | None:
    """The netdev RDMA device ``device`` has in this namespace now, or None (gone, or elsewhere)."""
    try:
        names = netdevs(_pci_dir(root, device))
    except VfLookupError:
        return None
    return names[0] if len(names) == 1 else None


def _vf_index(pf_dir: str, vf_dir: str) -> int:
    try:
        entries = os.listdir(pf_dir)
    except OSError:
        entries = []
    for entry in entries:
        match = _VIRTFN.match(entry)
        if match and os.path.realpath(os.path.join(pf_dir, entry)) == vf_dir:
            return int(match.group(1))
    raise VfLookupError(f"PF {os.path.basename(pf_dir)} lists no virtfn for VF {os.path.basename(vf_dir)}")


def read_vf_netdev(root: str, device: str, pf_device: str) -> VfNetdev:
    """VF ``device`` of PF ``pf_device`` as sysfs below ``root`` shows it; VfLookupError if the VF is
    gone, is no VF, belongs to another PF, or has no single netdev here."""
    vf_dir = _pci_dir(root, device)
    physfn = os.path.join(vf_dir, "physfn")
    if not os.path.exists(physfn):
        raise VfLookupError(f"RDMA device {device} is not an SR-IOV VF (no physfn)")
    pf_dir = os.path.realpath(physfn)
    expected_pf = _pci_dir(root, pf_device)
    if expected_pf != pf_dir:
        raise VfLookupError(
            f"VF {device} belongs to PF {os.path.basename(pf_dir)}, not to {pf_device}"
            f" ({os.path.basename(expected_pf)})"
        )
    names = netdevs(vf_dir)
    if len(names) != 1:
        found = ", ".join(names) if names else "none"
        raise VfLookupError(f"VF {device} has no single netdev in this namespace (found {found})")
    pf_names = netdevs(pf_dir)
    return VfNetdev(
        device=device,
        pci=os.path.basename(vf_dir),
        ifname=names[0],
        pf_device=pf_device,
        pf_pci=os.path.basename(pf_dir),
        pf_ifname=pf_names[0] if pf_names else "",
        vf_index=_vf_index(pf_dir, vf_dir),
    )
