"""A node with SR-IOV RDMA VFs for the shim's tests: a fake sysfs tree the RDMA plugin reads, with
real character device nodes where the kernel would have them, and signed version-2 allocations.

``build_sriov_machine(root)`` lays out one PF ``mlx5_0`` (uverbs0) with three VFs ``mlx5_1``,
``mlx5_2``, ``mlx5_3`` (uverbs1..3, ``physfn`` linking to the PF) and ``rdma_cm``, as the kernel
does below ``<root>/sys`` and ``<root>/dev/infiniband``. The device nodes carry the InfiniBand
numbers (char 231:192+N for uverbsN; rdma_cm the misc 10:58), so a container created from them
really holds a char device and the scrub can judge them by number; nothing opens them (no driver).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from kubegpu.allocation import Allocation, ContainerAllocation, RdmaInterface, SigningKey, sign
from tests.fixtures.keys import KEY, KEY_ID
from tests.test_devices_rdma import ACTIVE, EDR, FakeSysfs

PF = "mlx5_0"
VFS = ("mlx5_1", "mlx5_2", "mlx5_3")
UVERBS = {PF: 0, "mlx5_1": 1, "mlx5_2": 2, "mlx5_3": 3}
RDMA_CM_NUMBERS = (10, 58)
_PF_PCI = ("pci0000:00", "0000:00:01.0", "0000:04:00.0")


def verbs_nodes(fs: FakeSysfs, uverbs: Iterable[int]) -> Path:
    """``rdma_cm`` in ``fs`` and, as real character devices under its ``dev/infiniband`` (which it
    returns), ``uverbs<N>`` (char 231:192+N) for each N of ``uverbs`` and ``rdma_cm``."""
    fs.rdma_cm()
    dev = fs.root / "dev/infiniband"
    for n in uverbs:
        char_node(dev / f"uverbs{n}", (231, 192 + n))
    char_node(dev / "rdma_cm", RDMA_CM_NUMBERS)
    return dev


def char_node(path: Path, numbers: tuple[int, int]) -> None:
    """A character device node at ``path`` (mode 0666) with the device ``numbers``."""
    if path.exists():
        path.unlink()
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(*numbers))
    os.chmod(path, 0o666)  # mknod's mode passes through the umask


def build_sriov_machine(root: Path) -> Path:
    """The machine above below ``root``; returns its ``dev/infiniband`` directory."""
    fs = FakeSysfs(root)
    pf = fs.pci(*_PF_PCI, numa=0)
    fs.ib(PF, pf, [(EDR, ACTIVE, "InfiniBand")], uverbs=0, num_vfs=len(VFS))
    for k, vf in enumerate(VFS, start=1):
        fs.ib(
            vf,
            fs.pci(*_PF_PCI[:-1], f"0000:04:00.{k}", numa=0),
            [(EDR, ACTIVE, "InfiniBand")],
            uverbs=k,
            physfn=pf,
            hca_type="MT4124",
        )
    return verbs_nodes(fs, UVERBS.values())


def rdma_shim_args(sysfs_root: Path, node: str, keys: Path) -> list[str]:
    """``kubegpu crishim`` arguments for a shim whose RDMA plugin reads the machine at ``sysfs_root``
    as node ``node``, with the allocation keys in ``keys`` (no telemetry; health every 0.2 s)."""
    return [
        "--device-plugin",
        "rdma",
        "--sysfs-root",
        str(sysfs_root),
        "--node-name",
        node,
        "--allocation-keys-dir",
        str(keys),
        "--health-interval",
        "0.2",
        "--telemetry-interval",
        "0",
    ]


def rdma_allocation(
    node: str,
    pod_uid: str,
    vfs: tuple[str, ...] | list[str],
    containers: dict[str, list[str]] | None = None,
    key: SigningKey = KEY,
    pf: str = PF,
) -> str:
    """A signed version-2 allocation giving the pod ``vfs`` (25 Gbit/s reserved each) and, per
    container, ``containers``' devices."""
    allocation = Allocation(
        node,
        pod_uid,
        {name: ContainerAllocation(tuple(devices)) for name, devices in (containers or {}).items()},
        rdma=tuple(RdmaInterface(vf, pf, 25_000) for vf in vfs),
    )
    return sign(allocation, KEY_ID, key)
