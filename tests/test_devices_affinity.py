"""PCIe relations from sysfs paths, and NIC-GPU affinity (pure, then on a fake sysfs tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.affinity import (
    add_nic_affinity,
    nic_gpu_affinity,
    normalize_pci_address,
    pci_chain,
    pcie_relation_from_paths,
    sysfs_pci_path,
)
from devices.model import PCIeRelation
from devices.nvidia import NvidiaPlugin
from devices.plugin import discover_all
from devices.rdma import RdmaPlugin
from tests.test_devices_nvidia import FakeNvml
from tests.test_devices_rdma import GPU0, GPU1, GPU2, NIC0, NIC4, build_machine

R = PCIeRelation
D = "/sys/devices/"


def path(*parts: str) -> str:
    return D + "/".join(parts)


@pytest.mark.parametrize(
    ("a", "b", "numa", "want"),
    [
        # one switch: up 01:00.0, downstream ports 02:00.0 and 02:01.0
        (path(*GPU0), path(*NIC0), (0, 0), R.PIX),
        # two functions of one device
        (path(*NIC0), path(*NIC0[:-1], "0000:04:00.1"), (0, 0), R.PIX),
        # two root ports of one host bridge
        (path(*GPU0), path(*GPU1), (0, 0), R.PHB),
        # two switch levels between them
        (path(*NIC4), path(*GPU2), (1, 1), R.PXB),
        # both under the second-level switch
        (path(*GPU2), path(*GPU2[:-2], "0000:84:01.0", "0000:87:00.0"), (1, 1), R.PIX),
        # different host bridges: NODE on one NUMA node, SYS across
        (path(*GPU0), path("pci0000:40", "0000:40:01.0", "0000:41:00.0"), (0, 0), R.NODE),
        (path(*GPU0), path(*GPU2), (0, 1), R.SYS),
        # a root-complex integrated endpoint
        (path("pci0000:00", "0000:00:1f.0"), path(*GPU1), (0, 0), R.PHB),
    ],
)
def test_pcie_relation_from_paths(a: str, b: str, numa: tuple[int, int], want: PCIeRelation) -> None:
    assert pcie_relation_from_paths(a, b, *numa) is want
    assert pcie_relation_from_paths(b, a, *reversed(numa)) is want


def test_pci_chain_ignores_prefix_and_suffix() -> None:
    root, chain = pci_chain("/tmp/x/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/infiniband/mlx5_0")
    assert root == "pci0000:00"
    assert chain == ("0000:00:01.0", "0000:01:00.0")
    with pytest.raises(ValueError, match="not a PCI device path"):
        pci_chain("/sys/devices/virtual/net/lo")


def test_normalize_pci_address() -> None:
    assert normalize_pci_address("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_address("0000:3b:00.0") == "0000:3b:00.0"
    assert normalize_pci_address("00010000:01:00.0") == "10000:01:00.0"  # VMD domains
    assert normalize_pci_address("") == ""
    with pytest.raises(ValueError):
        normalize_pci_address("3b:00.0/../../etc")


def test_nic_gpu_affinity_pure() -> None:
    gpus = {"g0": path(*GPU0), "g1": path(*GPU1), "g2": path(*GPU2)}
    nics = {"n0": path(*NIC0), "n4": path(*NIC4), "far": path("pci0000:40", "0000:40:01.0", "0000:41:00.0")}
    numa = {"g0": 0, "g1": 0, "g2": 1, "n0": 0, "n4": 1, "far": 0}
    assert nic_gpu_affinity(nics, gpus, numa) == {"n0": ("g0",), "n4": ("g2",)}
    # with a stricter limit, the PXB neighbour does not count
    assert nic_gpu_affinity(nics, gpus, numa, limit=R.PIX) == {"n0": ("g0",)}
    assert nic_gpu_affinity(nics, {}, numa) == {}


def test_nic_near_two_gpus_on_one_switch() -> None:
    gpus = {"a": path(*GPU0), "b": path(*GPU0[:-2], "0000:02:02.0", "0000:05:00.0")}
    assert nic_gpu_affinity({"n": path(*NIC0)}, gpus) == {"n": ("a", "b")}


def _machine_nvml() -> FakeNvml:
    doc = {
        "gpus": [{"index": i, "model": "L4", "memoryMiB": 1, "numa": n} for i, n in enumerate([0, 0, 1])],
        "nvlink": [[0] * 3 for _ in range(3)],
        "pcie": [["X", "PHB", "SYS"], ["PHB", "X", "SYS"], ["SYS", "SYS", "X"]],
    }
    fake = FakeNvml(doc)
    fake.bus_ids = ["00000000:03:00.0", "00000000:06:00.0", "00000000:85:00.0"]
    return fake


def test_sysfs_pci_path(tmp_path: Path) -> None:
    build_machine(tmp_path)
    resolved = sysfs_pci_path(str(tmp_path), "00000000:03:00.0")
    assert resolved == str(tmp_path / "sys/devices" / Path(*GPU0))
    assert sysfs_pci_path(str(tmp_path), "0000:99:00.0") is None
    assert sysfs_pci_path(str(tmp_path), "") is None


def test_nvidia_and_rdma_inventories_get_affinity(tmp_path: Path) -> None:
    """GPUs from NVML, NICs from sysfs: the merged inventory says which NIC is near which GPU."""
    build_machine(tmp_path)
    fake = _machine_nvml()
    plugins = [NvidiaPlugin(nvml=fake, sysfs_root=str(tmp_path)), RdmaPlugin(str(tmp_path))]
    inventory = discover_all(plugins, sysfs_root=str(tmp_path))
    g0, _, g2 = fake.uuids
    assert dict(inventory.topology.nic_gpus) == {
        "mlx5_0": (g0,), "mlx5_1": (g0,), "mlx5_2": (g0,), "mlx5_10": (g2,)
    }
    # without sysfs: no affinity, nothing else changes
    plain = discover_all(plugins, sysfs_root=None)
    assert plain.topology.nic_gpus == {}
    assert plain.devices == inventory.devices


def test_add_nic_affinity_keeps_existing_entries(tmp_path: Path) -> None:
    from dataclasses import replace

    build_machine(tmp_path)
    inventory = discover_all(
        [NvidiaPlugin(nvml=_machine_nvml()), RdmaPlugin(str(tmp_path))], sysfs_root=None
    )
    preset = replace(inventory, topology=replace(inventory.topology, nic_gpus={"mlx5_0": ("chosen",)}))
    result = add_nic_affinity(preset, str(tmp_path))
    assert result.topology.nic_gpus["mlx5_0"] == ("chosen",)
    assert "mlx5_10" in result.topology.nic_gpus
