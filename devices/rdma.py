"""The RDMA plugin: InfiniBand/RoCE devices (and their SR-IOV VFs) from sysfs.

Everything is read below an injectable root (default ``/``; tests build a fake tree):

- ``sys/class/infiniband/<dev>``: one entry per RDMA device (``mlx5_0``); ``device`` links to the
  PCI function (its basename is the PCI address), ``device/numa_node``, ``device/physfn`` (present
  on a VF: links to its PF), ``device/sriov_numvfs`` (on a PF that can have VFs), ``hca_type``,
  ``ports/<n>/{rate,state,link_layer}`` (``100 Gb/sec (4X EDR)``, ``4: ACTIVE``, ``InfiniBand``);
- ``sys/class/infiniband_verbs/uverbs<N>/ibdev``: which ``/dev/infiniband/uverbs<N>`` belongs to
  which device;
- ``dev/infiniband/rdma_cm``: the connection manager node, shared by all devices.

The root is the machine's root for ``/dev`` too: the host paths of the device nodes are below it
(``<root>/dev/infiniband/uverbs<N>``; with the default ``/``, ``/dev/infiniband/uverbs<N>``), and
they appear in the container at ``/dev/infiniband/uverbs<N>``.

Device ids are the RDMA device names. Attributes: ``rateGbps`` and ``state`` (of the best port),
``linkLayer``, ``ports``, ``function`` (``pf`` or ``vf``), ``parentPf`` (a VF's PF PCI address)
and ``parentDevice`` (its RDMA name, when the PF has one), ``sriovNumVfs`` (PF), ``uverbs``.

Health: a device is healthy while it is in sysfs, has a uverbs node, and has an ACTIVE port.

Edits: device nodes ``/dev/infiniband/uverbs<N>`` per device plus ``/dev/infiniband/rdma_cm``
(when the host has it); env ``KUBEGPU_RDMA_DEVICES=<names>`` and ``NCCL_IB_HCA==<names>`` (exact
match, so NCCL uses only the devices the container can open). Edits are made from sysfs as it is
now: a device gone from sysfs since discovery (a VF removed with ``sriov_numvfs``), or whose verbs
node is missing, is a ``PluginError`` naming it, never an edit for a node that is not there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from devices.model import Device, DeviceKind, NodeInventory
from devices.plugin import ContainerEdits, DeviceNode, GpuShare, PluginError

IB_CLASS = "sys/class/infiniband"
VERBS_CLASS = "sys/class/infiniband_verbs"
DEV_DIR = "/dev/infiniband"
RDMA_CM = f"{DEV_DIR}/rdma_cm"
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


# --- pure helpers -----------------------------------------------------------------------------


def parse_rate(text: str) -> float:
    """``100 Gb/sec (4X EDR)`` -> 100.0; unparseable -> 0.0."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else 0.0


def parse_port_state(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    return text.split(":", 1)[-1].strip().upper()


def natural_key(name: str) -> tuple[Any, ...]:
    """``mlx5_2`` sorts before ``mlx5_10``."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


@dataclass(frozen=True)
class RdmaPort:
    number: int
    state: str  # ACTIVE, DOWN, INIT, ARMED, ...
    rate_gbps: float
    link_layer: str = ""  # InfiniBand or Ethernet (RoCE)


@dataclass(frozen=True)
class RdmaInfo:
    """What sysfs says about one RDMA device."""

    name: str
    pci: str
    numa: int = -1
    model: str = ""
    ports: tuple[RdmaPort, ...] = ()
    physfn: str | None = None  # PF PCI address, for a VF
    num_vfs: int | None = None  # sriov_numvfs, for an SR-IOV capable PF
    uverbs: str | None = None  # uverbsN


def best_port(ports: Sequence[RdmaPort]) -> RdmaPort | None:
    """The fastest ACTIVE port, else the lowest numbered one."""
    active = [p for p in ports if p.state == "ACTIVE"]
    if active:
        return max(active, key=lambda p: (p.rate_gbps, -p.number))
    return min(ports, key=lambda p: p.number) if ports else None


def is_healthy(info: RdmaInfo) -> bool:
    return info.uverbs is not None and any(p.state == "ACTIVE" for p in info.ports)


def host_dev_dir(root: str) -> str:
    """Where the device nodes are on the host for a machine rooted at ``root``."""
    return os.path.join(root, DEV_DIR.lstrip("/"))


def rdma_device(info: RdmaInfo, index: int, pf_names: Mapping[str, str], dev_dir: str = DEV_DIR) -> Device:
    """The model's Device for ``info``; ``pf_names`` maps PF PCI addresses to RDMA names;
    ``dev_dir``: the host directory of the device nodes."""
    port = best_port(info.ports)
    attributes = {
        "function": "vf" if info.physfn else "pf",
        "ports": str(len(info.ports)),
        "rateGbps": f"{port.rate_gbps:g}" if port else "0",
        "state": port.state if port else "UNKNOWN",
    }
    if port and port.link_layer:
        attributes["linkLayer"] = port.link_layer
    if info.physfn:
        attributes["parentPf"] = info.physfn
        if info.physfn in pf_names:
            attributes["parentDevice"] = pf_names[info.physfn]
    if info.num_vfs is not None:
        attributes["sriovNumVfs"] = str(info.num_vfs)
    if info.uverbs:
        attributes["uverbs"] = info.uverbs
    return Device(
        id=info.name,
        kind=DeviceKind.RDMA,
        index=index,
        model=info.model or "RDMA NIC",
        numa_node=info.numa,
        pci_bus_id=info.pci,
        healthy=is_healthy(info),
        device_nodes=(f"{dev_dir}/{info.uverbs}",) if info.uverbs else (),
        attributes=attributes,
    )


def inventory_from(infos: Sequence[RdmaInfo], dev_dir: str = DEV_DIR) -> NodeInventory:
    ordered = sorted(infos, key=lambda i: natural_key(i.name))
    pf_names = {i.pci: i.name for i in ordered if not i.physfn}
    return NodeInventory(tuple(rdma_device(info, k, pf_names, dev_dir) for k, info in enumerate(ordered)))


def rdma_edits(devices: Sequence[tuple[str, str]], rdma_cm: bool, dev_dir: str = DEV_DIR) -> ContainerEdits:
    """Edits for (name, uverbsN) pairs; ``rdma_cm``: whether the host has rdma_cm; ``dev_dir``:
    the host directory of the nodes (they appear at ``/dev/infiniband`` in the container)."""
    if not devices:
        return ContainerEdits()
    names_in = [uverbs for _, uverbs in devices] + (["rdma_cm"] if rdma_cm else [])
    names = ",".join(name for name, _ in devices)
    return ContainerEdits(
        device_nodes=tuple(DeviceNode(f"{dev_dir}/{n}", f"{DEV_DIR}/{n}") for n in names_in),
        env={"KUBEGPU_RDMA_DEVICES": names, "NCCL_IB_HCA": f"={names}"},
    )


# --- sysfs reading ----------------------------------------------------------------------------


def _read(path: str, default: str = "") -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def _int(text: str, default: int) -> int:
    try:
        return int(text)
    except ValueError:
        return default


def read_uverbs_map(root: str) -> dict[str, str]:
    """RDMA device name -> uverbsN, from ``sys/class/infiniband_verbs/*/ibdev``."""
    base = os.path.join(root, VERBS_CLASS)
    if not os.path.isdir(base):
        return {}
    mapping: dict[str, str] = {}
    for entry in sorted(os.listdir(base), key=natural_key):
        ibdev = _read(os.path.join(base, entry, "ibdev"))
        if entry.startswith("uverbs") and ibdev:
            mapping[ibdev] = entry
    return mapping


def read_ports(dev_path: str) -> tuple[RdmaPort, ...]:
    base = os.path.join(dev_path, "ports")
    if not os.path.isdir(base):
        return ()
    ports = []
    for entry in sorted(os.listdir(base), key=natural_key):
        port = os.path.join(base, entry)
        ports.append(
            RdmaPort(
                number=_int(entry, 0),
                state=parse_port_state(_read(os.path.join(port, "state"), "UNKNOWN")),
                rate_gbps=parse_rate(_read(os.path.join(port, "rate"))),
                link_layer=_read(os.path.join(port, "link_layer")),
            )
        )
    return tuple(ports)


def read_rdma_device(root: str, name: str, uverbs: Mapping[str, str]) -> RdmaInfo:
    dev_path = os.path.join(root, IB_CLASS, name)
    pci_dir = os.path.join(dev_path, "device")
    physfn = os.path.join(pci_dir, "physfn")
    num_vfs = os.path.join(pci_dir, "sriov_numvfs")
    return RdmaInfo(
        name=name,
        pci=os.path.basename(os.path.realpath(pci_dir)) if os.path.exists(pci_dir) else "",
        numa=_int(_read(os.path.join(pci_dir, "numa_node"), "-1"), -1),
        model=_read(os.path.join(dev_path, "hca_type")),
        ports=read_ports(dev_path),
        physfn=os.path.basename(os.path.realpath(physfn)) if os.path.exists(physfn) else None,
        num_vfs=_int(_read(num_vfs), 0) if os.path.exists(num_vfs) else None,
        uverbs=uverbs.get(name),
    )


def read_rdma_devices(root: str) -> list[RdmaInfo]:
    base = os.path.join(root, IB_CLASS)
    if not os.path.isdir(base):
        return []
    uverbs = read_uverbs_map(root)
    return [read_rdma_device(root, name, uverbs) for name in sorted(os.listdir(base), key=natural_key)]


# --- the plugin -------------------------------------------------------------------------------


class RdmaPlugin:
    """RDMA NICs from sysfs below ``sysfs_root``."""

    name = "rdma"
    kinds = frozenset({DeviceKind.RDMA})
    device_char_majors = frozenset({231})  # the InfiniBand char major (uverbs, umad, issm)

    def __init__(self, sysfs_root: str = "/", exists: Callable[[str], bool] | None = None) -> None:
        self.root = sysfs_root
        self.dev_dir = host_dev_dir(sysfs_root)
        # Directories wholly of RDMA device nodes (uverbsN, rdma_cm, umadN, issmN): the host's, and
        # the root's when it is another. A mount of or into one is a request for RDMA devices.
        self.device_dirs = tuple(dict.fromkeys((DEV_DIR, self.dev_dir)))
        self.device_patterns = tuple(f"{d}/*" for d in self.device_dirs)
        # host paths are checked below the root, so a fake tree answers for /dev too
        self.exists = exists or (lambda path: os.path.exists(os.path.join(self.root, path.lstrip("/"))))

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RdmaPlugin:
        return cls(sysfs_root=str(options.get("sysfs_root") or "/"))

    def discover(self) -> NodeInventory:
        return inventory_from(read_rdma_devices(self.root), self.dev_dir)

    def health(self) -> dict[str, bool]:
        return {info.name: is_healthy(info) for info in read_rdma_devices(self.root)}

    def container_edits(
        self, devices: Sequence[Device], shares: Mapping[str, GpuShare] | None = None
    ) -> ContainerEdits:
        if shares:
            raise PluginError("rdma: RDMA devices cannot be shared fractionally")
        nics = [d for d in devices if d.kind is DeviceKind.RDMA]
        if not nics:
            return ContainerEdits()
        fresh = read_uverbs_map(self.root)  # as sysfs is now, not as it was at discovery
        pairs: list[tuple[str, str]] = []
        for device in nics:
            if not os.path.exists(os.path.join(self.root, IB_CLASS, device.id)):
                raise PluginError(
                    f"rdma: device {device.id} is not on this host now (not in sysfs: a VF gone since "
                    "discovery, or never here)"
                )
            uverbs = fresh.get(device.id)
            if not uverbs:
                raise PluginError(f"rdma: device {device.id} has no uverbs node on this host")
            if not self.exists(f"{DEV_DIR}/{uverbs}"):
                raise PluginError(f"rdma: device {device.id}: its verbs node {DEV_DIR}/{uverbs} is missing")
            pairs.append((device.id, uverbs))
        return rdma_edits(pairs, self.exists(RDMA_CM), self.dev_dir)
